"""Store targets: what a target string names, and how to show it without its password.

A target is a file path, an ``sqlite:///`` URL or a PostgreSQL DSN
(``postgresql://user:password@host:port/db``). :func:`~asynccoord.backends.open.open_store`
picks the store by it; every message, ``repr`` and log line that shows a target passes
it through :func:`redact_target` first. The DSN checks here need no driver: they refuse
what asyncpg could not parse, naming it with its password hidden.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from typing import Any

from ..errors import InvalidArgumentError, InvalidTypeError

__all__ = (
    "check_dsn",
    "describe_target",
    "is_postgres_target",
    "redact_location",
    "redact_target",
    "relative_url_hint",
    "schema_options",
    "split_connect_timeout",
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
    (``scheme://user:password@host``) and the value of every query parameter (or path
    parameter, after a ``;``) whose name holds ``password`` in any case (libpq's ``password``,
    but also ``PASSWORD`` or ``sslpassword``), with ``&`` or ``;`` between parameters. A file path is returned
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
    if ";" in parts.path:  # path parameters ("redis://host/0;password=..."), redacted as a query is
        head, _, params = parts.path.partition(";")
        parts = parts._replace(path=f"{head};{_redact_query(params)}")
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


def check_dsn(dsn: str) -> None:
    """Refuse a DSN that asyncpg could not parse, naming it with its password hidden.

    Checks what can be checked without I/O: no NUL character (raw or ``%00``: libpq's
    strings cannot hold one), the URL syntax (a bracketed IPv6 host), and that each port of
    the host list (``host:port,host:port``) and of a ``port=`` query parameter is empty or
    1..65535.

    Raises:
        InvalidArgumentError: the DSN is malformed.
    """
    if "\x00" in dsn or "%00" in dsn:
        raise InvalidArgumentError(
            f"malformed PostgreSQL DSN {redact_target(dsn.replace(chr(0), '%00'))!r}: a NUL character"
        )
    try:
        parts = urllib.parse.urlsplit(dsn)
    except ValueError as exc:  # "Invalid IPv6 URL"
        raise InvalidArgumentError(f"malformed PostgreSQL DSN {redact_target(dsn)!r}: {exc}") from None
    netloc = parts.netloc
    if "@" not in netloc and "@" in parts.path:  # "user:Ab/cd@host": the "/" ended the host part
        raise InvalidArgumentError(
            f"malformed PostgreSQL DSN {redact_target(dsn)!r}: a '/' before the '@' "
            "(percent-encode it in the user name and password)"
        )
    hostlist = netloc.rpartition("@")[2]
    shown = "a host part that may hold a password (not shown)" if userinfo_spills(dsn) else ""
    for spec in hostlist.split(",") if hostlist else ():
        match = re.fullmatch(r"(\[[^\]]+\]|[^:\[\]]*)(?::(.*))?", spec)
        port = None if match is None else match.group(2)
        if match is None or not _valid_port(port):
            raise InvalidArgumentError(
                f"malformed PostgreSQL DSN {redact_target(dsn)!r}: "
                f"expected host, host:PORT or [IPv6]:PORT (PORT 1..65535), got {shown if shown else spec!r}"
            )
    for name, value in urllib.parse.parse_qsl(parts.query, keep_blank_values=True):
        if name == "port" and not all(_valid_port(p) for p in value.split(",")):
            raise InvalidArgumentError(
                f"malformed PostgreSQL DSN {redact_target(dsn)!r}: port={value!r} (each port 1..65535)"
            )


_CONNECT_TIMEOUT_S = 10.0
"""How long opening a connection may take, seconds, unless the DSN's ``connect_timeout`` says otherwise."""


def split_connect_timeout(dsn: str) -> tuple[str, float | None]:
    """Take libpq's ``connect_timeout`` query parameter out of ``dsn``, which asyncpg does not know.

    asyncpg would send it to the server as a setting, and the connection would fail. It is
    read as libpq reads it (PostgreSQL's documentation, "Parameter Key Words"): whole seconds,
    zero or less waits for ever, and 1 means 2 (libpq's least). For code that opens asyncpg
    connections of its own from a DSN the store accepts (the demo, the benchmarks):
    ``asyncpg.connect(dsn, timeout=timeout_s)`` with what this returns.

    Args:
        dsn: A ``postgresql://`` DSN (query parameters separated by ``&``, as asyncpg reads them).

    Returns:
        ``(dsn, timeout_s)``: the DSN without the parameter (unchanged if it had none), and the
        connect timeout in seconds: the parameter's (None: no limit), or 10.0 without one.

    Raises:
        InvalidArgumentError: the DSN is malformed (as :class:`PostgresStore` checks it), or the
            parameter is not a whole number of at most 2**31 - 1, or is given twice. The message
            shows the value only when it is a short run of digits, signs, dots and spaces: a
            value that swallowed other parameters (``connect_timeout=x;password=...``) is not
            echoed.
    """
    check_dsn(dsn)  # a password holding a "?" is refused here, before anything below shows a piece of it
    base, sep, query = dsn.partition("?")
    if not sep:
        return dsn, _CONNECT_TIMEOUT_S
    kept: list[str] = []
    values: list[str] = []
    for field in query.split("&"):
        name, _, value = field.partition("=")
        if urllib.parse.unquote_plus(name) == "connect_timeout":
            values.append(urllib.parse.unquote_plus(value))
        else:
            kept.append(field)
    if not values:
        return dsn, _CONNECT_TIMEOUT_S
    shown = redact_target(base) + "?..."  # the query holds the bad value: not shown (see below)
    if len(values) > 1:
        raise InvalidArgumentError(f"malformed PostgreSQL DSN {shown!r}: connect_timeout given {len(values)} times")
    text = values[0].strip(" \t\n\r\f\v")  # C's isspace(), as libpq's strtol() skips
    if not re.fullmatch(r"[+-]?[0-9]{1,20}", text) or abs(int(text)) > 2**31 - 1:  # libpq's int
        value = repr(values[0]) if re.fullmatch(r"[0-9.+\- ]{0,16}", values[0]) else "(not shown)"
        raise InvalidArgumentError(
            f"malformed PostgreSQL DSN {shown!r}: connect_timeout={value} must be whole seconds "
            "(at most 2147483647), as libpq reads it"
        )
    seconds = int(text)
    stripped = base + ("?" + "&".join(kept) if kept else "")
    return stripped, None if seconds <= 0 else float(max(2, seconds))


def _valid_port(port: str | None) -> bool:
    """Whether a DSN's port is absent, empty or 1..65535 (ASCII digits)."""
    return not port or (port.isascii() and port.isdigit() and 0 < int(port) <= 65535)


def relative_url_hint(target: str, *, file_needed: bool) -> str:
    """What to say when an ``sqlite:///PATH`` URL's relative PATH misses what the absolute ``/PATH`` finds.

    ``sqlite:///PATH`` reads PATH relative to the current folder and ``sqlite:////PATH``
    as absolute, SQLAlchemy's convention; a URL written with three slashes for an absolute
    path opens the wrong file, or none.

    Args:
        target: The target as given (a path, URL or DSN: only an ``sqlite:///`` URL can get a hint).
        file_needed: The open failed for want of the file (a read-only open); False: of its
            folder (an open that would create the file).

    Returns:
        ``"sqlite:///tmp/bot.db names a path relative to the current folder '/srv'; did you
        mean sqlite:////tmp/bot.db (four slashes: the absolute path '/tmp/bot.db')?"``, or
        ``""`` when the absolute path finds nothing either (or the target is no such URL).
    """
    if not target.startswith("sqlite:///"):
        return ""
    path = urllib.parse.unquote(target[len("sqlite:///") :])
    if not path or os.path.isabs(path):
        return ""
    absolute = os.sep + path
    if os.path.abspath(path) == os.path.normpath(absolute):  # the current folder is the root
        return ""
    found = os.path.isfile(absolute) if file_needed else os.path.isdir(os.path.dirname(absolute))
    if not found:
        return ""
    return (
        f"{redact_target(target)} names a path relative to the current folder {os.getcwd()!r}; did you mean "
        f"sqlite:///{urllib.parse.quote(absolute)} (four slashes: the absolute path {absolute!r})?"
    )
