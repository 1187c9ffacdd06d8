"""Open a store from a target string: a file path, an ``sqlite:///`` URL or a PostgreSQL DSN.

The demo, the benchmarks and ``python -m asynccoord status --store`` take one string
and call :func:`open_store`; a program can do the same::

    async with open_store("postgresql://bot@db.internal/coord") as store: ...
    async with open_store("bot.db") as store: ...

PostgreSQL needs the ``postgres`` extra (``pip install 'asynccoord[postgres]'``).
"""

from __future__ import annotations

import os
import urllib.parse
from typing import TYPE_CHECKING, Any

from ..config import StoreConfig
from ..errors import InvalidArgumentError, InvalidTypeError, StoreError
from .sqlite.store import SQLiteStore
from .targets import (
    describe_target,
    is_postgres_target,
    redact_location,
    redact_target,
    relative_url_hint,
    schema_options,
    split_connect_timeout,
    store_kind,
    userinfo_spills,
)

if TYPE_CHECKING:
    from .postgres.store import PostgresStore

__all__ = (
    "describe_target",
    "is_postgres_target",
    "open_store",
    "redact_location",
    "redact_target",
    "relative_url_hint",
    "schema_options",
    "split_connect_timeout",
    "sqlite_path",
    "store_kind",
    "userinfo_spills",
)


def sqlite_path(target: str) -> str:
    """The file path of an SQLite target: ``target`` itself, or the percent-decoded path of an ``sqlite:///`` URL."""
    if target.startswith("sqlite:///"):
        path = target[len("sqlite:///") :]
        if "?" in path or "#" in path:  # a '?' or '#' of the file name itself is %3F or %23
            raise InvalidArgumentError(
                f"an SQLite URL is sqlite:///PATH with no query string or fragment, got {redact_target(target)!r}: "
                "give options as keyword arguments of open_store()/SQLiteStore(...) (read_only=True, ...) "
                "or in StoreConfig"
            )
        path = urllib.parse.unquote(path) or ":memory:"
    elif target.startswith("sqlite://"):
        raise InvalidArgumentError(f"an SQLite URL is sqlite:///PATH (three slashes), got {target!r}")
    elif target[: len("sqlite:")].lower() == "sqlite:":  # not a file named so: a URL missing its slashes
        raise InvalidArgumentError(
            f"an SQLite URL is sqlite:///PATH (three slashes, lowercase), got {redact_target(target)!r}: "
            "sqlite:///bot.db for bot.db in the current folder, sqlite:////srv/bot.db for /srv/bot.db "
            "(for a file whose name begins with 'sqlite:', write ./sqlite:NAME)"
        )
    elif "://" in target and not target.startswith("file:"):
        raise InvalidArgumentError(
            f"unknown store target {redact_target(target)!r}: use a file path, sqlite:///PATH or postgresql://user@host/db"
        )
    else:
        path = target
    if path.startswith("file:"):  # SQLite would read it as a URI, and the wake-ups of other processes miss it
        raise InvalidArgumentError(
            f"unknown store target {redact_target(target)!r}: use a file path, sqlite:///PATH or "
            "postgresql://user@host/db (SQLite's file: URIs are not taken; for a file whose name begins "
            "with 'file:', write ./file:NAME)"
        )
    return path


def open_store(
    target: str | os.PathLike[str],
    *,
    config: StoreConfig | None = None,
    read_only: bool = False,
    **options: Any,
) -> SQLiteStore | PostgresStore:
    """A store (not yet opened) for ``target``; use it as ``async with open_store(...) as store``.

    Args:
        target: A file path or ``sqlite:///PATH`` (:class:`~asynccoord.SQLiteStore`), or a
            PostgreSQL DSN ``postgresql://user:password@host:port/db``
            (:class:`~asynccoord.backends.postgres.store.PostgresStore`). The URL follows
            SQLAlchemy: ``sqlite:///bot.db`` is ``bot.db`` relative to the current folder,
            ``sqlite:////srv/bot.db`` (four slashes) the absolute ``/srv/bot.db``, and
            ``sqlite:///`` with no path an in-memory database, one process only. When a
            relative URL path's folder (or, read-only, its file) is missing where the absolute
            one exists, the store's ``open()`` error says so, with the four-slash URL.
        config: Store settings; default :class:`~asynccoord.config.StoreConfig`.
        read_only: Open for inspection only (no migration; writes refused).
        **options: More keyword arguments of the store class (``schema=``,
            ``pool_max_size=``... for PostgreSQL; ``clock=`` for either).

    Raises:
        InvalidTypeError: ``target`` is not a str or PathLike.
        InvalidArgumentError: an unknown URL scheme, an SQLite URI filename (``file:...``),
            an ``sqlite:`` URL that is not ``sqlite:///PATH`` (``sqlite:``, ``sqlite:bot.db``,
            ``sqlite://bot.db``, ``SQLITE:///bot.db``), an ``sqlite:///`` URL with a query
            string or fragment (a plain path may hold ``?`` and ``#``), or ``schema=`` for an
            SQLite target.
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
    if "schema" in options:  # a PostgreSQL option: refused by name, not by a TypeError of the class
        raise InvalidArgumentError(
            f"schema= applies to a postgresql:// target only, not to the SQLite target {redact_target(text)!r}"
        )
    store = SQLiteStore(sqlite_path(text), config=config, read_only=read_only, **options)
    if text.startswith("sqlite:///"):
        store._url = text  # its open() then says when the URL's relative path misses an absolute one
    return store
