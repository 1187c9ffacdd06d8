"""Task rows of the SQLite queue: a claim's row as a Task, and why a compare-and-set matched nothing.

A claim and a commit-and-continue return the columns of the claim statements
(``sql/queries.sql``); :func:`claimed_task` fills a :class:`~asynccoord.models.Task` from one
slot by slot, and a row whose text column holds no text is told apart (:data:`CLAIM_TEXTS`,
see :mod:`.texts`) so the claim dead-letters its task. :func:`lost_reason` reads a task again
after a compare-and-set on it (a settle, a renewal, a commit) matched nothing: gone, or why its
lease was lost (:func:`~asynccoord.backends.rows.lease_lost_reason`).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from ...models import Task, TaskSlots, TaskStatus
from ..rows import decode_json, lease_lost_reason
from ..sqlfiles import load_queries

__all__ = ("CLAIM_TEXTS", "Row", "claimed_task", "lost_reason")

Q = load_queries("sqlite")

Row = tuple[Any, ...]
"""A row as sqlite3 returns it."""

_NEW = object.__new__
_RUNNING = TaskStatus.RUNNING


def claimed_task(row: Row, queue: str, node_id: str, expires: float, now: float) -> Task:
    """A Task from a claim's row (see the claim queries for its columns) and what the claim set.

    Filled slot by slot as :func:`~asynccoord.models.make_task` does (this runs once per
    claimed task; inlined, it saves the 19-argument call), with no validation: the store
    wrote these values, but a text column that holds no text (a BLOB, or bytes that are no
    UTF-8 read as such, see :mod:`.texts`) raises ``TypeError``: the claim dead-letters the
    task (``CLAIM_TEXTS``).
    """
    key, idempotency_key, last_error = row[1], row[3], row[11]
    if not (
        key.__class__ is str
        and (idempotency_key is None or idempotency_key.__class__ is str)
        and (last_error is None or last_error.__class__ is str)
    ):
        raise TypeError(f"task {row[0]}: a text column holds no text")  # see split_unreadable's texts
    task: Any = _NEW(TaskSlots)
    task.id = row[0]
    task.queue = queue
    task.partition_key = row[1]
    task.partition = row[2]
    task.idempotency_key = row[3]
    task.payload = decode_json(row[4])
    task.priority = row[5]
    task.status = _RUNNING
    task.attempts = row[6]
    task.max_attempts = row[7]
    task.run_at = row[8]
    task.lease_owner = node_id
    task.lease_token = row[9]
    task.lease_expires_at = expires
    task.version = row[10]
    task.last_error = row[11]
    task.result = None if row[12] is None else decode_json(row[12])
    task.created_at = row[13]
    task.updated_at = now
    task.__class__ = Task
    return task  # type: ignore[no-any-return]


CLAIM_TEXTS = (("partition_key", 1, False), ("idempotency_key", 3, True), ("last_error", 11, True))
"""The text columns of a claim's row ``claimed_task`` refuses holding no text (split_unreadable's texts)."""


def lost_reason(db: sqlite3.Connection, task: Task, now: float) -> str | None:
    """Why a compare-and-set on ``task`` matched nothing; None if the task is gone."""
    row = db.execute(Q["select_task"], {"id": task.id}).fetchone()
    return None if row is None else lease_lost_reason(task, row[7], row[11], row[12], row[13], row[14], now)
