"""Open a store from a target string: a file path, an ``sqlite:///`` URL or a PostgreSQL DSN.

The demo, the benchmarks and ``python -m asynccoord status --store`` take one string
and call :func:`open_store`; a program can do the same::

    async with open_store("postgresql://bot@db.internal/coord") as store: ...
    async with open_store("bot.db") as store: ...

PostgreSQL needs the ``postgres`` extra (``pip install 'asynccoord[postgres]'``).
"""

from __future__ import annotations

import os
import re
import urllib.parse
from typing import TYPE_CHECKING, Any

from ..config import StoreConfig
from ..errors import InvalidArgumentError, InvalidTypeError, StoreError
from .sqlite.store import SQLiteStore

if TYPE_CHECKING:
    from .postgres.store import PostgresStore

__all__ = (
    "describe_target",
    "is_postgres_target",
    "open_store",
    "redact_location",
    "redact_target",
    "schema_options",
    "store_kind",
    "userinfo_spills",
)

_PG_SCHEMES = ("postgresql://", "postgres://")


def is_postgres_target(target: str) -> bool:
    """Whether ``target`` is a PostgreSQL DSN (``postgresql://`` or ``postgres://``)."""
    return target.startswith(_PG_SCHEMES)


def store_kind(target: str | os.PathLike[str]) -> str:
    """``"postgres"`` or ``"sqlite"``: which store :func:`open_store` makes for ``target``."""
    text = os.fspath(target)
    return "postgres" if is_postgres_target(text) else "sqlite"


def redact_target(target: str) -> str:
    """``target`` fit to print: the password of a URL (``postgresql://``, ``redis://``, ...) replaced by ``***``.

    Both places a URL may carry one are redacted: the user-info part
    (``scheme://user:password@host``) and the value of every query parameter whose name
    holds ``password`` in any case (libpq's ``password``, but also ``PASSWORD`` or
    ``sslpassword``), with ``&`` or ``;`` between parameters. A file path is returned
    unchanged. A URL too malformed to parse (``[::1`` without its ``]``) loses its whole
    user-info part and those parameters' values.
    """
    if "://" not in target:
        return target
    try:
        original = parts = urllib.parse.urlsplit(target)
    except ValueError:  # e.g. "Invalid IPv6 URL": redact by hand, erring on the side of hiding
        return _redact_unparsed(target)
    if userinfo_spills(target):  # hide everything up to the last "@"
        return _redact_unparsed(target, userinfo_end=target.rfind("@"))
    if parts.password is not None:
        parts = parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1))
    if parts.query:
        parts = parts._replace(query=_redact_query(parts.query))
    if parts == original:
        return target
    # Not urlunsplit(): it drops the "//" of an empty host ("postgresql:///db?host=...").
    suffix = f"?{parts.query}" if parts.query else ""
    fragment = f"#{parts.fragment}" if parts.fragment else ""
    return f"{parts.scheme}://{parts.netloc}{parts.path}{suffix}{fragment}"


def schema_options(target: str | os.PathLike[str], schema: str | None) -> dict[str, Any]:
    """The :func:`open_store` keyword arguments for tables in PostgreSQL schema ``schema``.

    Returns ``{}`` for None and ``{"schema": schema}`` for a PostgreSQL ``target`` (the
    store checks the name).

    Raises:
        InvalidTypeError: ``schema`` is not a str.
        InvalidArgumentError: a ``schema`` for a target that is no PostgreSQL DSN (an SQLite
            file has no schemas).
    """
    if schema is None:
        return {}
    if not isinstance(schema, str):
        raise InvalidTypeError(f"schema must be a str, got {type(schema).__name__}")
    text = os.fspath(target)
    if not is_postgres_target(text):
        raise InvalidArgumentError(
            f"schema {schema!r} applies to a postgresql:// target only, got {redact_target(text)!r}"
        )
    return {"schema": schema}


def describe_target(target: str | os.PathLike[str], schema: str | None = None) -> str:
    """``target`` fit to print (:func:`redact_target`), with ``" (schema NAME)"`` when ``schema`` is given."""
    text = redact_target(os.fspath(target))
    return text if schema is None else f"{text} (schema {schema})"


def userinfo_spills(target: str) -> bool:
    """Whether ``target`` has an ``@`` past its parsed host part.

    A ``/``, ``?`` or ``#`` in the user-info (an unencoded password such as ``Ab/cd==``)
    ends the host part before the ``@``, so what the parser calls the host may hold the
    start of a password. False for a file path and for a URL the parser refuses.
    """
    _scheme, sep, rest = target.partition("://")
    if not sep or "@" not in rest:
        return False
    try:
        return "@" not in urllib.parse.urlsplit(target).netloc
    except ValueError:
        return False


def redact_location(target: str) -> str:
    """Where ``target`` points, for a ``repr``: :func:`redact_target` without the scheme and user.

    ``"postgresql://bot:pw@db:5432/coord?password=pw"`` gives ``"db:5432/coord?password=***"``;
    a file path is returned unchanged.
    """
    if "://" not in target:
        return target
    rest = redact_target(target).partition("://")[2]
    end = _netloc_end(rest)
    return rest[:end].rpartition("@")[2] + rest[end:]


def _redact_query(query: str) -> str:
    """``query`` with the value of every parameter whose (decoded) name holds ``password``,
    in any case, replaced by ``***``; ``&`` and ``;`` both separate parameters, and the rest
    is left byte for byte as it was."""
    pieces = re.split(r"([&;])", query)
    for i in range(0, len(pieces), 2):
        key, eq, _value = pieces[i].partition("=")
        if eq and "password" in urllib.parse.unquote_plus(key).lower():
            pieces[i] = f"{key}=***"
    return "".join(pieces)


def _netloc_end(rest: str) -> int:
    return min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))


def _redact_unparsed(target: str, userinfo_end: int | None = None) -> str:
    scheme, _, rest = target.partition("://")
    if userinfo_end is not None:  # the last "@" of the target: everything before it may be secret
        rest = "***@" + target[userinfo_end + 1 :]
    else:
        end = _netloc_end(rest)
        _userinfo, at, host = rest[:end].rpartition("@")
        rest = ("***@" if at else "") + host + rest[end:]
    path, question, query = rest.partition("?")
    query, hash_, fragment = query.partition("#")
    return f"{scheme}://{path}{question}{_redact_query(query)}{hash_}{fragment}"


def _sqlite_path(target: str) -> str:
    if target.startswith("sqlite:///"):
        return urllib.parse.unquote(target[len("sqlite:///") :]) or ":memory:"
    if target.startswith("sqlite://"):
        raise InvalidArgumentError(f"an SQLite URL is sqlite:///PATH (three slashes), got {target!r}")
    if "://" in target:
        raise InvalidArgumentError(
            f"unknown store target {redact_target(target)!r}: use a file path, sqlite:///PATH or postgresql://user@host/db"
        )
    return target


def open_store(
    target: str | os.PathLike[str],
    *,
    config: StoreConfig | None = None,
    read_only: bool = False,
    **options: Any,
) -> SQLiteStore | PostgresStore:
    """A store (not yet opened) for ``target``; use it as ``async with open_store(...) as store``.

    Args:
        target: A file path or ``sqlite:///PATH`` (:class:`~asynccoord.SQLiteStore`;
            ``sqlite:///`` with no path is an in-memory database, one process only, as
            SQLAlchemy reads it), or a PostgreSQL DSN ``postgresql://user:password@host:port/db``
            (:class:`~asynccoord.backends.postgres.store.PostgresStore`).
        config: Store settings; default :class:`~asynccoord.config.StoreConfig`.
        read_only: Open for inspection only (no migration; writes refused).
        **options: More keyword arguments of the store class (``schema=``,
            ``pool_max_size=``... for PostgreSQL; ``clock=`` for either).

    Raises:
        InvalidTypeError: ``target`` is not a str or PathLike.
        InvalidArgumentError: an unknown URL scheme.
        StoreError: a PostgreSQL DSN but asyncpg is not installed.
    """
    if not isinstance(target, str | os.PathLike):
        raise InvalidTypeError(f"target must be a str or PathLike, got {type(target).__name__}")
    text = os.fspath(target)
    if is_postgres_target(text):
        try:
            from .postgres.store import PostgresStore
        except ImportError as exc:
            raise StoreError("a PostgreSQL store needs asyncpg: pip install 'asynccoord[postgres]'") from exc
        return PostgresStore(text, config=config, read_only=read_only, **options)
    return SQLiteStore(_sqlite_path(text), config=config, read_only=read_only, **options)
