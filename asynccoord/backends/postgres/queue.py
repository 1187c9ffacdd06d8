"""The queue on PostgreSQL: enqueue, settle, renew and inspect; claims and commits come from their mixins.

:class:`PgQueueOps` gathers the queue primitives of
:class:`~asynccoord.backends.postgres.store.PostgresStore`: claims (:mod:`.claim`) and
commits (:mod:`.commit`), and here the enqueue (``coord_enqueue``, run again after an
unknown outcome under the same ids),
``fail``/``release`` (compare-and-set, a retry recognizing its own earlier write), lease
renewals (batched across the process like commits) and the reads and purges.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg

from ... import events as ev
from ...contract.queue import PreparedTask
from ...errors import LeaseLostError, TaskNotFoundError
from ...models import EnqueueResult, PurgeResult, QueueStats, Task, TaskStatus
from ..batch import Batcher
from ..rows import listed_task_from_row, task_from_row
from .claim import PgClaimOps
from .commit import PgCommitOps
from .heads import key_arrays
from .statements import Q, Row, lost_reason, settled_by_us

__all__ = ("PgQueueOps", "Renewal")

_Row = Row


class Renewal:
    """One :meth:`PostgresStore.extend_many` call of a renewal batch: lease ids, tokens and the TTL (s)."""

    __slots__ = ("ids", "lease_s", "tokens")

    def __init__(self, ids: list[int], tokens: list[str | None], lease_s: float) -> None:
        self.ids = ids
        self.tokens = tokens
        self.lease_s = lease_s


class PgQueueOps(PgClaimOps, PgCommitOps):
    """The queue primitives of the PostgreSQL store."""

    _extender: Batcher[Renewal, set[tuple[int, str]]]

    async def _enqueue_checked(self, prepared: list[PreparedTask]) -> list[EnqueueResult]:
        """Add tasks in one statement; a repeated idempotency key returns the existing task.

        Two round trips: the ids (``next_task_ids``), then ``coord_enqueue``
        (``migration_0004.sql``), which takes the queues' and keys' locks, inserts, promotes
        heads and notifies other processes, committed when the statement ends. After a
        connection lost with the outcome unknown, the statement runs again with the same
        ids, by which it finds the tasks its lost run created (reported as created, once).

        Raises:
            StoreConnectionError: the server stayed unreachable.
        """
        if not prepared:
            return []
        self._writable()
        await self._check_dimensions(prepared)  # a read, only when a task names limit keys
        params = {
            "queues": [p.queue for p in prepared],
            "partition_keys": [p.partition_key for p in prepared],
            "partitions": [p.partition for p in prepared],
            "idempotency_keys": [p.idempotency_key for p in prepared],
            "payloads": [p.payload_json for p in prepared],
            "priorities": [p.priority for p in prepared],
            "max_attempts": [p.max_attempts for p in prepared],
            "delays": [p.delay_s for p in prepared],
            "limit_keys": [p.limit_keys_json for p in prepared],
            "channel": self.channel,
            "sender": self._sender,
        }
        ids: list[int] = []  # drawn once: every attempt inserts under the same ids

        async def op(conn: asyncpg.Connection, _attempt: int) -> list[_Row]:
            if not ids:
                ids.extend(int(r[0]) for r in await self._fetch(conn, "next_task_ids", count=len(prepared)))
            return await self._fetch(conn, "enqueue", ids=ids, now=self._now(), **params)

        rows = await self._run(op, what="enqueue", tx=False, ambiguous_ok=True, counted=True)
        return [EnqueueResult(task=listed_task_from_row(row), created=bool(row[20])) for row in rows]

    async def _settle(
        self,
        task: Task,
        name: str,
        params: dict[str, Any],
        *,
        expect: TaskStatus,
        head_change: bool,
        count: bool = True,
    ) -> Task:
        key = {"id": task.id, "lease_token": task.lease_token, "version": task.version, **params}

        async def op(conn: asyncpg.Connection, attempt: int) -> tuple[_Row | None, str | None]:
            kept = await self._lockkey_arrays(conn, [(task.queue, task.partition_key)]) if head_change else set()
            row = await self._row(conn, name, now=self._now(), **key)
            if row is None:
                current = await self._row(conn, "select_task", id=task.id)
                if attempt > 0 and settled_by_us(current, task, expect):
                    return current, None
                return None, lost_reason(current, task)
            await self._promote(conn, kept)
            return row, None

        row, reason = await self._run(op, what=name, tx=head_change, ambiguous_ok=True)
        if row is None:
            if reason is None:
                raise TaskNotFoundError(task.id)
            if count:  # a refused hand-back of an unsent task is no stale commit (its lease_lost is counted)
                self.events.add(ev.STALE_COMMIT_REJECTED)
            raise LeaseLostError(task.id, reason)
        return listed_task_from_row(row)  # written: a value that cannot be decoded is listed as such

    async def _dead_letter_checked(self, task: Task, error: str, *, count: bool = True) -> Task:
        """Dead-letter ``task`` under its key's row lock, and promote the key's next head."""
        return await self._settle(
            task, "dead_letter", {"error": error}, expect=TaskStatus.DEAD, head_change=True, count=count
        )

    async def _retry_checked(self, task: Task, error: str, delay_s: float) -> Task:
        """Put ``task`` back to pending, due in ``delay_s`` seconds."""
        return await self._settle(
            task, "retry", {"error": error, "delay_s": delay_s}, expect=TaskStatus.PENDING, head_change=False
        )

    async def _release_checked(self, task: Task, delay: float, count_attempt: bool) -> Task:
        """Hand the task back to pending, the attempt counted or not (let through while the store closes)."""
        self._writable()
        with self._runner.giving_back():
            return await self._settle(
                task,
                "release",
                {"delay_s": delay, "refund": 0 if count_attempt else 1},
                expect=TaskStatus.PENDING,
                head_change=False,
                count=False,
            )

    async def _extend_checked(self, task: Task, lease: float) -> float:
        """Renew the lease to ``lease`` seconds from now; return the new expiry (store clock)."""
        self._writable()
        key = {"id": task.id, "lease_token": task.lease_token, "version": task.version, "lease_s": lease}

        async def op(conn: asyncpg.Connection, _attempt: int) -> tuple[float | None, str | None]:
            expiry = await self._val(conn, "extend", now=self._now(), **key)
            if expiry is None:
                return None, lost_reason(await self._row(conn, "select_task", id=task.id), task)
            return float(expiry), None

        expiry, reason = await self._run(op, what="extend", tx=False, ambiguous_ok=True)
        if expiry is None:
            if reason is None:
                raise TaskNotFoundError(task.id)
            raise LeaseLostError(task.id, reason)
        return expiry

    async def _extend_many_checked(self, checked: list[Task], lease: float) -> list[bool]:
        """Renew many leases with one statement; True for each lease still held.

        Concurrent calls in one process share that statement (group commit, see
        :mod:`asynccoord.backends.batch`): a process's nodes renew their leases at the
        same moments, and one write per node each time made the server's work grow with
        the node count. A cancelled caller's renewal still runs (it only extends leases
        the caller held).

        Raises:
            StoreConnectionError: the server stayed unreachable.
        """
        if not checked:
            return []
        self._writable()
        renewal = Renewal([t.id for t in checked], [t.lease_token for t in checked], lease)
        with self._runner.call():  # a call in flight while its batch waits (see PostgresStore.close)
            renewed = await self._extender.submit(renewal)
        return [(t.id, t.lease_token) in renewed for t in checked]

    async def _extend_batch(self, renewals: Sequence[Renewal]) -> list[set[tuple[int, str]]]:
        """Renew the leases of ``renewals`` in one statement; each gets the renewed (id, token) pairs of its own.

        The rows are locked in ascending id order, as a commit batch locks them: in any
        other order a renewal and a commit of two of the same tasks could each hold one row
        the other waits for, a deadlock PostgreSQL breaks only after ``deadlock_timeout``
        (1 s by default), stalling every commit waiting on those rows meanwhile.
        """
        leases = [(i, t, r.lease_s) for r in renewals for i, t in zip(r.ids, r.tokens, strict=True)]
        leases.sort(key=lambda lease: lease[0])
        ids = [i for i, _, _ in leases]
        tokens = [t for _, t, _ in leases]
        ttls = [ttl for _, _, ttl in leases]

        async def op(conn: asyncpg.Connection, _attempt: int) -> set[tuple[int, str]]:
            rows = await self._fetch(conn, "extend_many", ids=ids, tokens=tokens, lease_s=ttls, now=self._now())
            return {(int(r[0]), str(r[1])) for r in rows}

        renewed = await self._run(op, what="extend_many", tx=False, ambiguous_ok=True)
        return [renewed.intersection(zip(r.ids, r.tokens, strict=True)) for r in renewals]

    async def _get_checked(self, task_id: int, listed: bool = False) -> Task:
        """The task with that id (one statement); TaskNotFoundError if none. ``listed``: as ``listed_task_from_row``."""

        async def op(conn: asyncpg.Connection, _attempt: int) -> _Row | None:
            return await self._row(conn, "select_task", id=task_id)

        row = await self._run(op, what="get", tx=False, ambiguous_ok=True)
        if row is None:
            raise TaskNotFoundError(task_id)
        return listed_task_from_row(row) if listed else task_from_row(row)

    async def _stored_checked(self, task_id: int) -> Task:
        """The stored task, a value it cannot decode listed as such (see ``StoreBase._stored_checked``)."""
        return await self._get_checked(task_id, listed=True)

    async def _stats_checked(self, queue: str | None) -> QueueStats:
        """Counts by status and the oldest due pending age (store clock), in one statement (one snapshot).

        ``stats_queue`` (or ``stats_all``) counts each status in its partial index and seeks the
        oldest due pending task; no task row is read where the index pages are all-visible.
        """

        async def op(conn: asyncpg.Connection, _attempt: int) -> _Row | None:
            if queue is None:
                return await self._row(conn, "stats_all", now=self._now())
            return await self._row(conn, "stats_queue", queue=queue, now=self._now())

        row = await self._run(op, what="stats", tx=False, ambiguous_ok=True)
        assert row is not None  # an aggregate's one row
        pending, oldest, running, done, dead, now = row
        by_status = {
            TaskStatus.PENDING: int(pending),
            TaskStatus.RUNNING: int(running),
            TaskStatus.DONE: int(done),
            TaskStatus.DEAD: int(dead),
        }
        age = None if oldest is None else max(0.0, float(now) - float(oldest))
        return QueueStats(counts=by_status, oldest_pending_age_s=age)

    async def _is_drained_checked(self, queue: str) -> bool:
        """True when ``queue`` has no pending and no running task: two partial-index probes."""

        async def op(conn: asyncpg.Connection, _attempt: int) -> bool:
            return not await self._val(conn, "queue_unfinished", queue=queue)

        return await self._run(op, what="is_drained", tx=False, ambiguous_ok=True)  # a read: no transaction

    async def _dead_letters_checked(self, queue: str, limit: int, after_id: int | None) -> list[Task]:
        """A page of ``queue``'s dead tasks: one statement, no transaction (also on a read-only store)."""

        async def op(conn: asyncpg.Connection, _attempt: int) -> list[_Row]:
            after = -1 if after_id is None else after_id
            return await self._fetch(conn, "dead_letters", queue=queue, after_id=after, limit=limit)

        rows = await self._run(op, what="dead_letters", tx=False, ambiguous_ok=True)
        return [listed_task_from_row(r) for r in rows]  # a poison task is listed, its raw text marked

    async def _requeue_dead_checked(self, queue: str, ids: list[int] | None) -> int:
        """Move dead tasks of ``queue`` (all, or those ids) back to pending; return how many."""
        self._writable()

        async def op(conn: asyncpg.Connection, _attempt: int) -> list[_Row]:
            now = self._now()
            pairs = [(r[0], r[1]) for r in await self._fetch(conn, "dead_keys", queue=queue, ids=ids)]
            if not pairs:
                return []
            kept = await self._lockkey_arrays(conn, pairs)
            keys = sorted({k for _, k in pairs})
            rows = await self._fetch(
                conn, "requeue_dead", queue=queue, ids=ids, keys=keys, keeps_heads=bool(kept), now=now
            )
            touched = [(r[1], r[2]) for r in rows if (r[1], r[2]) in kept]
            if touched:
                await self._x(conn, "recompute_heads", **key_arrays(touched))
                await self._promote(conn, touched)
            elif rows:  # a queue without heads: every requeued task is claimable now
                parts = {int(r[3]) for r in rows}
                await self._notify(conn, queue, len(rows), parts)
            return rows

        rows = await self._run(op, what="requeue_dead")
        if rows:
            self.notifier.notify(queue, len(rows), {int(r[3]) for r in rows})
        return len(rows)

    async def _discard_dead_checked(self, queue: str, ids: list[int] | None) -> int:
        """Delete dead tasks of ``queue`` (all, or those ids); return how many.

        Dead tasks hold no head (``is_head`` is kept for pending and running tasks), so in a
        queue whose policy is ``skip`` nothing else moves: one delete. The policy is read
        under the queue's shared advisory lock (a change of it takes that lock exclusively);
        in a queue that holds, the keys of the dead tasks are locked first and their next
        heads promoted after (a task that died meanwhile under another key stays, as in a
        requeue: its key's heads need the key's lock).
        """
        self._writable()

        async def op(conn: asyncpg.Connection, _attempt: int) -> tuple[list[_Row], bool]:
            await self._x(conn, "share_queues", queues=[queue])
            if not await self._val(conn, "queue_holds", queue=queue):
                rows = await self._fetch(conn, "discard_dead", queue=queue, ids=ids, keys=None)
                await self._count_discarded(conn, queue, rows)
                return rows, False
            pairs = [(r[0], r[1]) for r in await self._fetch(conn, "dead_keys", queue=queue, ids=ids)]
            if not pairs:
                return [], True
            kept = await self._lockkey_arrays(conn, pairs)
            keys = sorted({k for _, k in pairs})
            rows = await self._fetch(conn, "discard_dead", queue=queue, ids=ids, keys=keys)
            await self._promote(conn, [(r[1], r[2]) for r in rows if (r[1], r[2]) in kept])
            await self._count_discarded(conn, queue, rows)
            return rows, True

        rows, held = await self._run(op, what="discard_dead")
        if rows and held:  # the keys it held may go on: let this process's idle nodes look
            self.notifier.notify(queue, len(rows), {int(r[3]) for r in rows})
        return len(rows)

    async def _count_discarded(self, conn: asyncpg.Connection, queue: str, rows: list[_Row]) -> None:
        """Add ``rows`` (deleted dead tasks) to the queue's removed count, in the caller's transaction."""
        if rows:
            await self._x(conn, "count_removed", queue=queue, done=0, dead=len(rows))

    async def _is_processed_checked(self, consumer: str, message_id: str) -> bool:
        """Whether ``(consumer, message_id)`` has a processed-id record (one statement)."""

        async def op(conn: asyncpg.Connection, _attempt: int) -> bool:
            return await self._row(conn, "is_processed", consumer=consumer, message_id=message_id) is not None

        return await self._run(op, what="is_processed", tx=False, ambiguous_ok=True)

    async def _purge_processed_checked(self, age: float, size: int) -> PurgeResult:
        """Delete processed-id records older than ``age`` seconds; each batch its own short statement."""
        self._writable()
        return await self._purge("purge_processed_batch", {"batch": size, "age_s": age}, size)

    async def _purge_finished_checked(self, queue: str, age: float, size: int) -> PurgeResult:
        """Delete done tasks of ``queue`` older than ``age`` seconds; each batch its own short statement."""
        self._writable()
        return await self._purge("purge_finished_batch", {"batch": size, "queue": queue, "age_s": age}, size)

    async def _purge(self, name: str, params: dict[str, Any], size: int) -> PurgeResult:
        deleted = batches = 0
        while True:

            async def op(conn: asyncpg.Connection, _attempt: int) -> int:  # the statement returns its count
                return int(await conn.fetchval(Q[name].text, *Q[name].args({**params, "now": self._now()})))

            n = await self._run(op, what=name, tx=False, ambiguous_ok=True)
            if n > 0:
                deleted += n
                batches += 1
            if n < size:
                return PurgeResult(deleted=deleted, batches=batches)
