"""The schema revision an SQLite database records, read on a connection's own thread.

See :mod:`asynccoord.backends.schema` for what the revision and the pre-release marker
mean; the read-write open (:mod:`.store`) and the read-only one (:mod:`.readonly`) both
read them here.
"""

from __future__ import annotations

import sqlite3

from ..schema import PRE_RELEASE_KEY, REVISION_KEY

__all__ = ("delete_fix", "read_meta")


def read_meta(db: sqlite3.Connection) -> dict[str, str] | None:
    """The ``schema_revision``, ``schema_version`` and ``partitions`` rows of ``coord_meta``.

    Returns:
        Key -> value of those of the three the table holds; None when the database has
        no ``coord_meta`` table (a new database, or not one of asynccoord).
    """
    has_meta = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'coord_meta'").fetchone()
    if not has_meta:
        return None
    rows = db.execute(
        "SELECT key, value FROM coord_meta WHERE key IN (?, ?, 'partitions')", (REVISION_KEY, PRE_RELEASE_KEY)
    )
    return {str(key): str(value) for key, value in rows}


def delete_fix(path: str) -> str:
    """The fix for a pre-release database at ``path``, for :func:`~asynccoord.backends.schema.check_revision`."""
    return f"delete the file {path!r} (with its -wal and -shm files)"
