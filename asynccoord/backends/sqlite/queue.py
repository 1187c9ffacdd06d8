"""The queue on SQLite: the statements behind :class:`~asynccoord.backends.base.StoreBase`'s verbs.

:class:`SQLiteQueueOps` is a mixin of :class:`~asynccoord.backends.sqlite.store.SQLiteStore`:
every write is an operation ``fn(db, now_s)`` handed to the store's group committer
(:mod:`asynccoord.backends.sqlite.writer`), so it runs inside one ``BEGIN IMMEDIATE``
transaction with ``now_s`` read from the store clock at its start, and many callers'
claims and commits share one commit. Reads run on the connection's thread between the
writer's batches. Per-key order is kept by head flags in the queues claimed in order
(``coord_ordered_queues``), whose tasks alone enter the order index that head upkeep reads
(``coord_tasks_key_order``). The queries are in ``sql/queries.sql``.

The queue's parts: this module holds the enqueue, the settling of one task (fail,
dead-letter, release), the lease renewals, and the reads and purges; the claims are
:mod:`.claim`, the commits and commit-and-continue :mod:`.commit`, the per-key heads
:mod:`.heads`, and a claim's row read as a task :mod:`.taskrows`.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ... import events as ev
from ...contract.queue import PreparedTask
from ...errors import LeaseLostError, TaskNotFoundError
from ...models import EnqueueResult, PurgeResult, QueueStats, Task, TaskStatus
from ..base import StoreBase
from ..calls import CallGate
from ..rows import listed_task_from_row, task_from_row
from ..sqlfiles import load_queries
from ..wakeups import notify_partitions
from .claim import SQLiteClaimOps
from .commit import SQLiteCommitOps
from .deadletters import recompute_heads
from .heads import promote_heads as _promote_heads
from .taskrows import Row as _Row
from .taskrows import claimed_task as _claimed_task  # noqa: F401  (tests read a claim's row with it)
from .taskrows import lost_reason as _lost_reason

__all__ = ("SQLiteQueueOps",)

Q = load_queries("sqlite")


class SQLiteQueueOps(SQLiteClaimOps, SQLiteCommitOps, StoreBase):
    """The queue primitives of the SQLite store.

    A mixin: the claims are :class:`~asynccoord.backends.sqlite.claim.SQLiteClaimOps`, the
    commits :class:`~asynccoord.backends.sqlite.commit.SQLiteCommitOps`, and this class adds
    the rest. It relies on the store's ``_write`` (group-committed operation with an optional
    compensation), ``_read``, ``_w`` (the group committer), declared by the claims, and
    ``_check_dimensions``.
    """

    if TYPE_CHECKING:

        async def _check_dimensions(self, prepared: Sequence[PreparedTask]) -> None: ...

    # --- enqueue ----------------------------------------------------------------------

    async def _enqueue_checked(self, prepared: list[PreparedTask]) -> list[EnqueueResult]:
        """Add tasks in one transaction; a repeated idempotency key returns the existing task."""
        if not prepared:
            return []
        await self._check_dimensions(prepared)  # a read, only when a task names limit keys

        def op(db: sqlite3.Connection, now: float) -> list[tuple[bool, _Row]]:
            out: list[tuple[bool, _Row]] = []
            insert, select = Q["insert_task"], Q["select_by_idempotency_key"]
            for p in prepared:
                row = db.execute(
                    insert,
                    {
                        "queue": p.queue,
                        "partition_key": p.partition_key,
                        "partition": p.partition,
                        "idempotency_key": p.idempotency_key,
                        "payload": p.payload_json,
                        "priority": p.priority,
                        "max_attempts": p.max_attempts,
                        "run_at": now + p.delay_s,
                        "now": now,
                        "limit_keys": p.limit_keys_json,
                    },
                ).fetchone()
                if row is not None:
                    out.append((True, row))
                else:
                    existing = db.execute(select, {"queue": p.queue, "idempotency_key": p.idempotency_key}).fetchone()
                    out.append((False, existing))
            return out

        rows: list[tuple[bool, _Row]] = await self._write(op)
        return [EnqueueResult(task=listed_task_from_row(row), created=created) for created, row in rows]

    # --- settle and renew ------------------------------------------------------------

    async def _settle(
        self,
        task: Task,
        sql: str,
        params: dict[str, Any],
        extra: Callable[[sqlite3.Connection, float, Task], None] | None = None,
        *,
        count: bool = True,
    ) -> Task:
        key = {"id": task.id, "lease_token": task.lease_token, "version": task.version}

        def op(db: sqlite3.Connection, now: float) -> tuple[_Row | None, str | None]:
            row = db.execute(sql, {**key, **params, "now": now}).fetchone()
            if row is None:
                return None, _lost_reason(db, task, now)
            if extra is not None:
                extra(db, now, task)
            return row, None

        row, reason = await self._write(op)
        if row is None:
            if reason is None:
                raise TaskNotFoundError(task.id)
            if count:  # a refused hand-back of an unsent task is no stale commit (its lease_lost is counted)
                self.events.add(ev.STALE_COMMIT_REJECTED)
            raise LeaseLostError(task.id, reason)
        return listed_task_from_row(row)  # written: a value that cannot be decoded is listed as such

    async def _dead_letter_checked(self, task: Task, error: str, *, count: bool = True) -> Task:
        """Dead-letter ``task`` and promote its key's next head, in one transaction."""
        promoted: list[tuple[str, int]] = []
        out = await self._settle(
            task,
            Q["dead_letter"],
            {"error": error},
            lambda db, _now, t: promoted.extend(_promote_heads(db, [(t.queue, t.partition_key)])),
            count=count,
        )
        notify_partitions(self.notifier, promoted)
        return out

    async def _retry_checked(self, task: Task, error: str, delay_s: float) -> Task:
        """Put ``task`` back to pending, due in ``delay_s`` seconds."""
        return await self._settle(task, Q["retry"], {"error": error, "delay_s": delay_s})

    async def _release_checked(self, task: Task, delay: float, count_attempt: bool) -> Task:
        """Hand the task back to pending, the attempt counted or not (let through while the store closes)."""
        params = {"delay_s": delay, "refund": 0 if count_attempt else 1}
        with CallGate.giving_back():
            return await self._settle(task, Q["release"], params, count=False)

    async def _extend_checked(self, task: Task, lease: float) -> float:
        """Renew the lease to ``lease`` seconds from now; return the new expiry (store clock)."""
        key = {"id": task.id, "lease_token": task.lease_token, "version": task.version, "lease_s": lease}

        def op(db: sqlite3.Connection, now: float) -> tuple[float | None, str | None]:
            row = db.execute(Q["extend"], {**key, "now": now}).fetchone()
            if row is None:
                return None, _lost_reason(db, task, now)
            return float(row[0]), None

        expiry, reason = await self._write(op)
        if expiry is None:
            if reason is None:
                raise TaskNotFoundError(task.id)
            raise LeaseLostError(task.id, reason)
        return float(expiry)

    async def _extend_many_checked(self, checked: list[Task], lease: float) -> list[bool]:
        """Renew many leases with one statement; True for each lease still held."""
        if not checked:
            return []
        leases = json.dumps([[t.id, t.lease_token] for t in checked])

        def op(db: sqlite3.Connection, now: float) -> set[tuple[int, str]]:
            rows = db.execute(Q["extend_many"], {"leases": leases, "lease_s": lease, "now": now}).fetchall()
            return {(r[0], r[1]) for r in rows}

        renewed: set[tuple[int, str]] = await self._write(op)
        # By (id, token): a stale lease passed beside the live one on the same task stays False.
        return [(t.id, t.lease_token) in renewed for t in checked]

    # --- inspection and maintenance ---------------------------------------------------

    async def _get_checked(self, task_id: int, listed: bool = False) -> Task:
        """The task with that id (a read); TaskNotFoundError if none. ``listed``: as ``listed_task_from_row``."""
        row = await self._read(lambda db: db.execute(Q["select_task"], {"id": task_id}).fetchone())
        if row is None:
            raise TaskNotFoundError(task_id)
        return listed_task_from_row(row) if listed else task_from_row(row)

    async def _stored_checked(self, task_id: int) -> Task:
        """The stored task, a value it cannot decode listed as such (see ``StoreBase._stored_checked``)."""
        return await self._get_checked(task_id, listed=True)

    async def _stats_checked(self, queue: str | None) -> QueueStats:
        """Counts by status and the oldest due pending age (store clock), for ``queue`` or all.

        One statement (``stats_queue`` or ``stats_all``) that counts each status in its partial
        index, never reading a task's row.
        """
        writer = self._w()

        def read(db: sqlite3.Connection) -> tuple[_Row, float]:
            now = writer.now(db)
            if queue is None:
                return db.execute(Q["stats_all"], {"now": now}).fetchone(), now
            return db.execute(Q["stats_queue"], {"queue": queue, "now": now}).fetchone(), now

        (pending, oldest, running, done, dead), now = await self._read(read)
        by_status = {
            TaskStatus.PENDING: pending,
            TaskStatus.RUNNING: running,
            TaskStatus.DONE: done,
            TaskStatus.DEAD: dead,
        }
        age = None if oldest is None else max(0.0, now - float(oldest))
        return QueueStats(counts=by_status, oldest_pending_age_s=age)

    async def _is_drained_checked(self, queue: str) -> bool:
        """True when ``queue`` has no pending and no running task: a probe of each status's partial index."""

        def read(db: sqlite3.Connection) -> bool:
            return db.execute(Q["queue_unfinished"], {"queue": queue}).fetchone() is None

        return bool(await self._read(read))

    async def _dead_letters_checked(self, queue: str, limit: int, after_id: int | None) -> list[Task]:
        """A page of ``queue``'s dead tasks: one seek of ``coord_tasks_dead_order``, a read (also read-only)."""
        params = {"queue": queue, "after_id": -1 if after_id is None else after_id, "limit": limit}
        rows = await self._read(lambda db: db.execute(Q["dead_letters"], params).fetchall())
        return [listed_task_from_row(r) for r in rows]  # a poison task is listed, its raw text marked

    async def _requeue_dead_checked(self, queue: str, checked_ids: list[int] | None) -> int:
        """Move dead tasks of ``queue`` (all, or those ids) back to pending; return how many."""
        ids: str | None = None
        if checked_ids is not None:
            ids = json.dumps(checked_ids)

        def op(db: sqlite3.Connection, now: float) -> int:
            rows = db.execute(Q["requeue_dead"], {"queue": queue, "ids": ids, "now": now}).fetchall()
            recompute_heads(db, [(r[1], r[2]) for r in rows], [r[0] for r in rows])
            return len(rows)

        return int(await self._write(op))

    async def _discard_dead_checked(self, queue: str, checked_ids: list[int] | None) -> int:
        """Delete dead tasks of ``queue`` (all, or those ids) and recompute their keys' heads; return how many."""
        ids = None if checked_ids is None else json.dumps(checked_ids)

        def op(db: sqlite3.Connection, now: float) -> list[tuple[str, str, int]]:
            rows: list[tuple[str, str, int]] = db.execute(Q["discard_dead"], {"queue": queue, "ids": ids}).fetchall()
            recompute_heads(db, [(r[0], r[1]) for r in rows])
            if rows:
                db.execute(Q["count_removed"], {"queue": queue, "done": 0, "dead": len(rows)})
            return rows

        rows = await self._write(op)
        notify_partitions(self.notifier, [(r[0], int(r[2])) for r in rows])  # a key it held may go on
        return len(rows)

    async def _is_processed_checked(self, consumer: str, message_id: str) -> bool:
        """Whether ``(consumer, message_id)`` has a processed-id record (a read)."""
        row = await self._read(
            lambda db: db.execute(Q["is_processed"], {"consumer": consumer, "message_id": message_id}).fetchone()
        )
        return row is not None

    async def _purge_processed_checked(self, age: float, size: int) -> PurgeResult:
        """Delete processed-id records older than ``age`` seconds; each batch its own short transaction."""
        return await self._purge(Q["purge_processed_batch"], {"batch": size}, age, size)

    async def _purge_finished_checked(self, queue: str, age: float, size: int) -> PurgeResult:
        """Delete done tasks of ``queue`` older than ``age`` seconds; each batch its own short transaction."""
        return await self._purge(Q["purge_finished_batch"], {"batch": size, "queue": queue}, age, size, counted=queue)

    async def _purge(
        self, sql: str, params: dict[str, Any], age: float, size: int, *, counted: str | None = None
    ) -> PurgeResult:
        """Run ``sql`` in batches of ``size`` until one deletes fewer; ``counted``: the queue whose
        removed-done count (``coord_queue_removed``) each batch adds to, in its transaction."""
        deleted = batches = 0
        while True:

            def op(db: sqlite3.Connection, now: float) -> int:
                n: int = db.execute(sql, {**params, "cutoff": now - age}).rowcount
                if counted is not None and n > 0:
                    db.execute(Q["count_removed"], {"queue": counted, "done": n, "dead": 0})
                return n

            n = int(await self._write(op))
            if n > 0:
                deleted += n
                batches += 1
            if n < size:
                return PurgeResult(deleted=deleted, batches=batches)
