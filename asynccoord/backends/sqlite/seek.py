"""SQLite's claim by per-partition seeks, and the flagging that lets a queue use it.

A node claims only the partitions it owns. Walking the queue's one pending index in claim
order (``coord_tasks_pending``) steps over every pending task of the partitions it does not
own that sorts ahead of its own; when some nodes lag, their backlogs pile up there and every
claim of the others grows with the run. A node that owns a small share of the partitions
instead reads each owned partition's best tasks from a seek in
``coord_tasks_pending_partition`` (``migration_0003.sql``), one ``UNION ALL`` arm per
partition, merged in claim order without a sort: the k-way merge of sorted runs (Knuth,
TAOCP vol. 3, 5.4.1), done by SQLite's compound-select merge.

That index holds only the tasks flagged ``by_partition``, which costs a page write per task
(its order is not the claims'), so only queues such a claim has used keep it. A queue enters
it in stretches: each claim that would seek flags the queue's unfinished tasks among the next
:data:`FLAG_STRETCH_ROWS` rows of the table (in id order, from where the store's last stretch
stopped) and walks meanwhile; the stretch that reaches the table's end registers the queue in
``coord_partitioned_queues`` in the same transaction, after which every insert is flagged. So
no transaction holds the write lock for long, however large the backlog (flagging a million
tasks at once held it for seconds, and other processes' short leases lapsed behind it).
"""

from __future__ import annotations

import functools
import sqlite3
import time
from collections.abc import Sequence

from ..sqlfiles import load_queries

__all__ = ("FLAG_STRETCH_ROWS", "SEEK_PARTITIONS_MAX", "Flagging", "seek_params", "seek_sql", "seeks")

Q = load_queries("sqlite")

SEEK_PARTITIONS_MAX = 96
"""A claim seeks when the node owns at most this many partitions and at most a quarter of them.

Measured per claim of 32 on 1,024 partitions, 200,000 pending: the merge costs about 2 us per
owned partition (120 us for 64, 285 us for 128); the walk about 0.15 us per pending task of the
partitions it does not own ahead of its own (about 90 us with even backlogs, tens of ms once
lagging nodes' backlogs pile up ahead)."""

FLAG_STRETCH_ROWS = 2000
"""Rows of the table one claim's transaction visits while its queue's tasks are being flagged."""

FLAG_INTERVAL_S = 0.02
"""Least time between two stretches of one store (the group commit joins several claims in one
transaction: without it each would add its stretch)."""

_ARM, _END_ARM = "/* arm */", "/* end arm */"
_INDEXED = -1


def seeks(parts: Sequence[int], partitions: int, ordered: bool) -> bool:
    """Whether an unordered claim of ``parts`` (of ``partitions`` in all) seeks once its queue is indexed."""
    return not ordered and len(parts) <= min(SEEK_PARTITIONS_MAX, partitions // 4)


@functools.cache
def seek_sql(arms: int) -> str:
    """claim_pending_partitions with one arm per partition, parameters ``:partition_0``.. (cached per count)."""
    text = Q["claim_pending_partitions"]
    head, rest = text.split(_ARM)
    arm, tail = rest.split(_END_ARM)
    body = "\n        UNION ALL\n".join(arm.strip().replace(":partition_N", f":partition_{i}") for i in range(arms))
    return f"{head}{body}\n{tail}"


def seek_params(parts: Sequence[int]) -> dict[str, int]:
    """The parameters of :func:`seek_sql`'s arms for ``parts``.

    Each partition once (named twice, it would yield its tasks twice), then -1 (no task's) up
    to a multiple of 8 arms, so that a few statements serve every count (a statement of 64
    arms takes about 2 ms to prepare; the connection's statement cache keeps it).
    """
    owned = sorted(set(parts))
    owned += [-1] * (-len(owned) % 8)
    return {f"partition_{i}": p for i, p in enumerate(owned)}


class Flagging:
    """One store's progress in flagging its queues' tasks for the per-partition index.

    Used on the writer's thread only (inside write transactions).
    """

    __slots__ = ("_after", "_last")

    def __init__(self) -> None:
        self._after: dict[str, int] = {}  # queue -> last id visited; _INDEXED once registered
        self._last = float("-inf")  # time.monotonic() of the last stretch

    def indexed(self, db: sqlite3.Connection, queue: str) -> bool:
        """Whether ``queue``'s tasks are all in the per-partition index, so a claim may seek.

        If not, flags one more stretch (at most one per :data:`FLAG_INTERVAL_S`); the stretch
        that reaches the end of the table registers the queue, and then this returns True.
        """
        after = self._after.get(queue, 0)
        if after == _INDEXED:
            return True
        if db.execute(Q["is_partitioned"], {"queue": queue}).fetchone():  # registered, maybe by another process
            self._after[queue] = _INDEXED
            return True
        now = time.monotonic()
        if now - self._last < FLAG_INTERVAL_S:
            return False
        self._last = now
        params = {"queue": queue, "after": after, "rows": FLAG_STRETCH_ROWS}
        last, visited = db.execute(Q["flag_stretch_end"], params).fetchone()
        if last is not None:
            db.execute(Q["flag_partitioned_stretch"], {**params, "last": last})
        if visited < FLAG_STRETCH_ROWS:  # the end of the table, in this transaction: nothing comes between
            db.execute(Q["mark_partitioned"], {"queue": queue})
            self._after[queue] = _INDEXED
            return True
        self._after[queue] = int(last)
        return False
