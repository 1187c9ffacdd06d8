"""Per-key heads on SQLite: the earliest active task of each key, kept in the queues claimed in order.

Per-key order is kept by head flags (``is_head``) in the queues claimed in order
(``coord_ordered_queues``), whose tasks alone enter the order index that head upkeep reads
(``coord_tasks_key_order``), so an unordered queue's enqueues and completions never write it.
The first ordered claim or commit-and-continue of a queue marks it and computes its heads
(:func:`keep_heads`); when tasks leave a key's active set (a commit, a dead letter, a settled
duplicate), :func:`promote_heads` marks each key's next head in the same write transaction and
returns the partitions where work became claimable. A requeue, a discard or a change of
dead-letter policy recomputes heads instead (:func:`~asynccoord.backends.sqlite.deadletters.recompute_heads`).
The same protocol on PostgreSQL: :mod:`asynccoord.backends.postgres.heads`.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from ..sqlfiles import load_queries
from .deadletters import text_keys

__all__ = ("keep_heads", "promote_heads")

Q = load_queries("sqlite")


def promote_heads(db: sqlite3.Connection, keys: Sequence[tuple[str, str]]) -> list[tuple[str, int]]:
    """After tasks of these ``(queue, partition_key)`` left the active set: mark each key's new head.

    Only queues claimed in order keep heads (``coord_ordered_queues``, read in the same
    write transaction, so a queue another process has just marked is seen). Returns the
    ``(queue, partition)`` of every new head: the work this change made claimable.
    """
    keys = text_keys(keys)
    if not keys:
        return []
    queues = sorted({k[0] for k in keys})
    ordered = {r[0] for r in db.execute(Q["ordered_queues"], {"queues": json.dumps(queues)})}
    if not ordered:
        return []
    keys = [k for k in keys if k[0] in ordered]
    return db.execute(Q["promote_heads"], {"keys": json.dumps(sorted(set(keys)))}).fetchall()


def keep_heads(db: sqlite3.Connection, queue: str) -> None:
    """Make ``queue`` keep per-key heads from now on (first ordered use: computed from scratch).

    The insert into ``coord_ordered_queues`` fires a trigger that puts the queue's tasks into
    the order index first (``by_key``, ``migration_0006.sql``), in the same transaction: only
    the tasks of ordered queues are in it, so an unordered queue's enqueues and completions
    never write it.
    """
    if db.execute(Q["mark_ordered"], {"queue": queue}).rowcount:
        db.execute(Q["recompute_queue_heads"], {"queue": queue})  # heads were not kept until now
