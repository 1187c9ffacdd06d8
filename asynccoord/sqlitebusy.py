"""Waiting out SQLite's "database is locked": a short polling retry instead of SQLite's busy handler.

Used by the SQLite store on its connection thread, and by any code of the package that
opens an SQLite file of its own (the demo's gateway record). SQLite's own handler sleeps
up to 100 ms per try, which leaves the database idle while waiters doze; here a waiter
polls every 0.2..4 ms until its deadline.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ("is_busy", "retry_busy")

T = TypeVar("T")

_BUSY_MESSAGES = ("database is locked", "database table is locked", "database is busy")


def is_busy(exc: sqlite3.OperationalError) -> bool:
    """Whether ``exc`` says the database (or a table) is locked by another connection."""
    text = str(exc).lower()
    return any(m in text for m in _BUSY_MESSAGES)


def retry_busy(fn: Callable[[], T], deadline: float) -> T:
    """Run ``fn`` (on the connection's thread), retrying while SQLite reports busy.

    The connection's own busy handler is off (``busy_timeout=0``). A waiter polls every
    0.2..4 ms until ``deadline`` (``time.monotonic()`` seconds), then lets the busy error
    through.

    Raises:
        sqlite3.OperationalError: ``fn``'s error when it is not "busy", or "busy" past ``deadline``.
    """
    delay = 0.0002
    while True:
        try:
            return fn()
        except sqlite3.OperationalError as exc:
            if not is_busy(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 1.5, 0.004)
