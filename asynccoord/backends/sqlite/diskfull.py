"""Whether an SQLite error is a full disk, said in words with the free bytes.

SQLite reports a write that found no room as ``SQLITE_FULL`` ("database or disk is
full"), but a full disk met while it sizes the ``-shm`` file (at the first read of a WAL
database, a read-only open included) or a ``-wal`` file comes back as an I/O error
("disk I/O error", ``SQLITE_IOERR_SHMSIZE`` and the like), which names no cause.
:func:`disk_full_problem` looks at the free space of the file's folder for either, and
names the folder and its free bytes when it is full.
"""

from __future__ import annotations

import os
import shutil
import sqlite3

__all__ = ("LOW_FREE_BYTES", "disk_full_problem", "is_full_or_io_error")

LOW_FREE_BYTES = 1 << 20
"""Free bytes below which an I/O error of SQLite is put down to a full disk (1 MiB): SQLite
grows its ``-wal`` and ``-shm`` files by 32 KiB and more at a time."""


def is_full_or_io_error(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` is ``SQLITE_FULL`` or ``SQLITE_IOERR`` (any extended code)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in (sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR)
    return "disk I/O error" in str(exc) or "disk is full" in str(exc)


def _is_full(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF == sqlite3.SQLITE_FULL
    return "disk is full" in str(exc)


def disk_full_problem(path: str, exc: sqlite3.Error) -> str | None:
    """One clause saying the disk of ``path``'s folder is full, or None when that is not the cause.

    Args:
        path: The database file.
        exc: The driver's error.

    Returns:
        ``"the disk holding its folder '/x' is full (0 bytes free of 524,288): ..."`` when
        ``exc`` is ``SQLITE_FULL`` (whatever is free: the write needed more), or an I/O
        error while the folder has less than :data:`LOW_FREE_BYTES` free for this process;
        None otherwise (another error, an I/O error with room to spare, or a folder whose
        free space cannot be read).
    """
    if not is_full_or_io_error(exc):
        return None
    folder = os.path.dirname(os.path.abspath(path))
    try:
        usage = shutil.disk_usage(folder)
    except OSError:
        return None
    if usage.free >= LOW_FREE_BYTES and not _is_full(exc):
        return None
    return (
        f"the disk holding its folder {folder!r} is full ({usage.free:,} bytes free of {usage.total:,}): free some "
        "space there (SQLite also writes <file>-wal and <file>-shm beside the database)"
    )
