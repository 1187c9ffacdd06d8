"""Opening an SQLite store read-only (``SQLiteStore(path, read_only=True)``).

A read-only store opens the file through the URI ``file:PATH?mode=ro``, so SQLite
itself refuses any write, sets ``query_only`` as a second guard, applies no
migration and changes no pragma that persists. Under WAL its reads take no lock that
a writer waits for, so inspecting a live database (``python -m asynccoord status``)
never blocks the running nodes. Writes through the store raise
:class:`~asynccoord.errors.ReadOnlyStoreError` before reaching SQLite.
"""

from __future__ import annotations

import os
import sqlite3
import time
import urllib.parse

from ...errors import NotADatabaseError, ReadOnlyStoreError, SchemaVersionError
from ..schema import PRE_RELEASE_KEY, REVISION_KEY, check_revision
from .revision import delete_fix, read_meta
from .writer import retry_busy

__all__ = ("read_only_error", "read_only_uri", "setup_read_only")


def read_only_uri(path: str) -> str:
    """The ``file:`` URI opening ``path`` read-only.

    Raises:
        NotADatabaseError: ``path`` does not exist, is a directory, or is ``":memory:"``.
    """
    if path == ":memory:":
        raise NotADatabaseError("a read-only store needs a database file, not ':memory:'")
    if not os.path.exists(path):
        raise NotADatabaseError(f"no database at {path!r} (a read-only store never creates one)")
    if os.path.isdir(path):
        raise NotADatabaseError(f"{path!r} is a directory, not an SQLite database")
    return f"file:{urllib.parse.quote(os.path.abspath(path))}?mode=ro"


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
            "with this asynccoord (any node start does) to migrate it, then inspect it read-only"
        )
    return int(meta["partitions"])


def read_only_error(store: object) -> ReadOnlyStoreError:
    """The error for a write attempted on a read-only store."""
    return ReadOnlyStoreError(
        f"{store!r} was opened with read_only=True: writes are refused (open it without read_only to write)"
    )
