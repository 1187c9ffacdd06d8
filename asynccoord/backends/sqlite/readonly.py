"""Opening an SQLite store read-only (``SQLiteStore(path, read_only=True)``).

A read-only store opens the file through the URI ``file:PATH?mode=ro``, so SQLite
itself refuses any write, sets ``query_only`` as a second guard, applies no
migration and changes no pragma that persists. Under WAL its reads take no lock that
a writer waits for, so inspecting a live database (``python -m asynccoord status``)
never blocks the running nodes. Writes through the store raise
:class:`~asynccoord.errors.ReadOnlyStoreError` before reaching SQLite.

A database in a folder this process cannot write (a mounted backup, another user's
folder) is opened with ``immutable=1`` when no ``-wal`` file lies beside it: see
:func:`opens_immutable`.
"""

from __future__ import annotations

import os
import sqlite3
import time
import urllib.parse

from ...errors import NotADatabaseError, ReadOnlyStoreError, SchemaVersionError, StoreError
from ..schema import PRE_RELEASE_KEY, REVISION_KEY, check_partitions, check_revision
from .access import access_problem
from .filekind import not_a_file
from .revision import delete_fix, read_meta
from .writer import retry_busy

__all__ = ("opens_immutable", "read_only_error", "read_only_uri", "setup_read_only")


def read_only_uri(path: str) -> str:
    """The ``file:`` URI opening ``path`` read-only (with ``immutable=1`` when :func:`opens_immutable`).

    Raises:
        NotADatabaseError: ``path`` does not exist, is no regular file (a directory, a FIFO), or is
            ``":memory:"``.
        StoreError: this process may not read the file, or not enter a folder on its way
            (see :func:`.access.access_problem`).
    """
    if path == ":memory:":
        raise NotADatabaseError("a read-only store needs a database file, not ':memory:'")
    problem = access_problem(path, write=False)
    if problem is not None:
        raise StoreError(problem)
    if not os.path.exists(path):
        raise NotADatabaseError(f"no database at {path!r} (a read-only store never creates one)")
    kind = not_a_file(path)
    if kind is not None:
        raise NotADatabaseError(f"{path!r} is {kind}, not an SQLite database")
    immutable = "&immutable=1" if opens_immutable(path) else ""
    return f"file:{urllib.parse.quote(os.path.abspath(path))}?mode=ro{immutable}"


def opens_immutable(path: str) -> bool:
    """Whether a read-only open of the database at ``path`` says ``immutable=1``.

    A reader of a WAL database needs its ``-shm`` and ``-wal`` files, and SQLite creates
    them beside the database when they are missing: in a folder this process cannot
    write, the read fails. Without a ``-wal`` file no connection writes the database
    (SQLite deletes the file when the last one closes), so it is read as it is, with no
    file created. SQLite then takes no lock and looks for no change: a store opened so
    does not follow writes made while it is open.

    Returns:
        True when the folder of ``path`` is not writable by this process and no
        ``PATH-wal`` file exists; False otherwise (SQLite's usual read-only open).
    """
    folder = os.path.dirname(os.path.abspath(path))
    return not os.access(folder, os.W_OK) and not os.path.exists(f"{path}-wal")


def setup_read_only(db: sqlite3.Connection, path: str, *, schema_version: int, busy_timeout_s: float) -> int:
    """Check the schema of a read-only connection (on its thread); return the partitions count.

    Args:
        db: The connection, opened with :func:`read_only_uri`.
        path: The file, for messages.
        schema_version: The schema version this asynccoord writes.
        busy_timeout_s: How long to retry while the database is busy (WAL recovery).

    Raises:
        NotADatabaseError: not a database of asynccoord.
        SchemaVersionError: the schema is newer or older than this asynccoord's, or of a
            development version before 0.1.0.
    """
    deadline = time.monotonic() + busy_timeout_s
    db.execute("PRAGMA busy_timeout = 0")
    db.execute("PRAGMA query_only = 1")
    meta = retry_busy(lambda: read_meta(db), deadline)
    if meta is None or "partitions" not in meta or not {REVISION_KEY, PRE_RELEASE_KEY} & meta.keys():
        raise NotADatabaseError(f"{path!r} is not an asynccoord database (no schema version)")
    version = check_revision(repr(path), meta, supported=schema_version, fix=delete_fix(path))
    if version < schema_version:
        raise SchemaVersionError(
            f"{path!r} has schema version {version}, older than {schema_version}: open it once read-write "
            "with this asynccoord (any node start does) to migrate it, then inspect it read-only",
            found=version,
            supported=schema_version,
        )
    return check_partitions(repr(path), meta["partitions"])


def read_only_error(store: object) -> ReadOnlyStoreError:
    """The error for a write attempted on a read-only store."""
    return ReadOnlyStoreError(
        f"{store!r} was opened with read_only=True: writes are refused (open it without read_only to write)"
    )
