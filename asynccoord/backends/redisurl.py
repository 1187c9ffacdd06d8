"""Checks of a Redis URL before :class:`~asynccoord.backends.redis.RedisLockStore` connects with it.

redis-py parses a URL leniently and fails late: a database path that is no number connects
to database 0, and an unknown query parameter becomes a keyword argument that raises a bare
``TypeError`` at the first connection. These checks read the URL with redis-py's own parser
(``redis.asyncio.connection.parse_url``, the one the pool uses) and refuse such a URL at
construction with :class:`~asynccoord.errors.InvalidArgumentError`, its password hidden.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from redis.asyncio.connection import parse_url

from ..errors import InvalidArgumentError
from .targets import redact_target, userinfo_spills

__all__ = ("check_url", "db_problem", "query_problem")


def check_url(url: str) -> None:
    """Refuse a URL redis-py cannot connect with, naming it (its password hidden)."""
    try:
        options = parse_url(url)  # redis-py's own parser, the one open() uses: scheme, port, query values
        problem = db_problem(url) or query_problem(url, options)
        if problem is None:
            return
    except ValueError as exc:  # its messages quote a port, which may be a password's start ("user:Ab/cd@host")
        problem = str(exc).rstrip(".")
    if userinfo_spills(url):
        problem = "a '/', '?' or '#' before the '@' (percent-encode it in the password)"
    shown = repr(redact_target(url))  # redact_target never raises: an unparsable URL loses its user-info
    if len(shown) > 200:
        shown = shown[:197] + "..."
    raise InvalidArgumentError(f"url must be a Redis URL (redis://host:port/db): {problem}, got {shown}")


def db_problem(url: str) -> str | None:
    """What is wrong with the database number in a ``redis://``/``rediss://`` URL's path, if anything.

    redis-py ignores a path that is not a number (``redis://host/abc`` connects to
    database 0), so a typo would go to another database unnoticed.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        return None  # unix://: the path is the socket's
    db = parts.path.strip("/")
    if db and not (db.isascii() and db.isdigit()):
        shown = db.partition(";")[0][:40] + (";..." if ";" in db else "")  # path parameters may hold a password
        return f"the database number must be an integer (redis://host:port/0), not {shown!r}"
    return None


def query_problem(url: str, options: Mapping[str, Any]) -> str | None:
    """What is wrong with the query parameters of a URL that redis-py parsed into ``options``, if anything.

    redis-py hands every query parameter to the connection pool and its connections as a
    keyword argument, so a name neither takes (``?foo=bar``, or ``ssl_*`` on ``redis://``)
    would raise a bare ``TypeError`` at the first connection.
    """
    unknown = sorted(set(options) - url_keywords(options.get("connection_class", aioredis.Connection)))
    if not unknown:
        return None
    names = ", ".join(repr(name[:40]) for name in unknown[:5])
    what = "parameter" if len(unknown) == 1 else "parameters"
    hint = "the ssl_* options need rediss://" if any(n.startswith("ssl_") for n in unknown) else f"remove the {what}"
    return f"redis-py takes no query {what} {names} in a {urlsplit(url).scheme.lower()}:// URL ({hint})"


@functools.cache
def url_keywords(connection_class: type) -> frozenset[str]:
    """The keyword arguments that a URL's options may set: the pool's and ``connection_class``'s.

    A connection class passes its ``**kwargs`` on to its base class, so the bases' keywords
    count until one takes no ``**kwargs``.
    """
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    names: set[str] = set()
    for cls in (aioredis.BlockingConnectionPool, aioredis.ConnectionPool, *connection_class.__mro__):
        if "__init__" not in vars(cls):
            continue
        parameters = inspect.signature(vars(cls)["__init__"]).parameters
        names.update(name for name, p in parameters.items() if p.kind in named)
        if cls in connection_class.__mro__ and all(p.kind is not p.VAR_KEYWORD for p in parameters.values()):
            break
    return frozenset(names - {"self"})
