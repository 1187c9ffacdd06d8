"""Text that is not UTF-8 in a column: read it as its bytes instead of failing the statement.

SQLite keeps whatever bytes a writer stores as TEXT. Python's ``sqlite3`` fails the fetch of
a row holding such a text ("Could not decode to UTF-8 column ..."), and with it the whole
statement: a claim that met one row written so by another tool failed every time, for every
task its node owned. The store runs such an operation once more under :func:`leniently`,
which reads a text that is not UTF-8 as its bytes: the row decoders then see a value they
cannot decode (:data:`~asynccoord.backends.rows.DECODE_ERRORS`), and the task is
dead-lettered or listed as unreadable like any other poison row.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ("leniently", "undecodable")

T = TypeVar("T")

_NOT_UTF8 = "Could not decode to UTF-8"


def undecodable(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from) is ``sqlite3``'s failure to decode a text as UTF-8."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, sqlite3.OperationalError) and str(seen).startswith(_NOT_UTF8):
            return True
        seen = seen.__cause__
    return False


def _text_or_bytes(data: bytes) -> str | bytes:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data


def leniently(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` (called with the connection first) run with texts that are not UTF-8 read as bytes."""

    def run(db: sqlite3.Connection, *args: Any) -> T:
        factory = db.text_factory
        db.text_factory = _text_or_bytes
        try:
            return fn(db, *args)
        finally:
            db.text_factory = factory

    return run
