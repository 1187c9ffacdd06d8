"""The queue on SQLite: the statements behind :class:`~asynccoord.backends.base.StoreBase`'s verbs.

:class:`SQLiteQueueOps` is a mixin of :class:`~asynccoord.backends.sqlite.store.SQLiteStore`:
every write is an operation ``fn(db, now_s)`` handed to the store's group committer
(:mod:`asynccoord.backends.sqlite.writer`), so it runs inside one ``BEGIN IMMEDIATE``
transaction with ``now_s`` read from the store clock at its start, and many callers'
claims and commits share one commit. Reads run on the connection's thread between the
writer's batches. Per-key order is kept by head flags in the queues claimed in order
(``coord_ordered_queues``), whose tasks alone enter the order index that head upkeep reads
(``coord_tasks_key_order``). The queries are in ``sql/queries.sql``.
"""

from __future__ import annotations

import asyncio
import json
import operator
import sqlite3
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ... import events as ev
from ...contract.locks import fence_rejected_error
from ...contract.queue import PreparedTask
from ...contract.ratelimits import Admission
from ...errors import CoordError, LeaseLostError, TaskNotFoundError, UnreadableRowError
from ...models import Continuation, EnqueueResult, PurgeResult, QueueStats, Task, TaskSlots, TaskStatus
from ..base import StoreBase
from ..calls import CallGate
from ..rows import (
    UnreadableClaim,
    copies_to_write,
    decode_json,
    lease_lost_reason,
    listed_task_from_row,
    new_token,
    repeated_ids,
    settled_done,
    split_unreadable,
    task_from_row,
)
from ..sqlfiles import load_queries
from ..wakeups import notify_partitions
from .deadletters import recompute_heads, text_keys
from .locks import check_fence
from .ratelimits import claim_limited
from .seek import Flagging, seek_params, seek_sql, seeks
from .texts import leniently
from .turnbatch import TurnBatch

if TYPE_CHECKING:
    from ..limitwatch import LimitWatch
    from .writer import GroupCommitter, Operation

__all__ = ("SQLiteQueueOps",)

Q = load_queries("sqlite")

_Row = tuple[Any, ...]
_Claimed = tuple[list[_Row], int, int, float, list[tuple[str, int]]]  # rows, duplicates, dead, now, promoted
# now, per-task outcome, refused fences, promoted heads, per task the next task's row and queue, duplicates settled
_Completed = tuple[
    float, list[int | str | None], dict[int, int], list[tuple[str, int]], "list[tuple[_Row, str] | None]", int
]


_Next = Task | UnreadableClaim | None  # the task a commit-and-continue leased next


class _CommitItem:
    """One task of a commit: its result (JSON), its fence, and ``(owner, lease_s)`` for commit-and-continue."""

    __slots__ = ("continuation", "fence", "result_json", "task")

    def __init__(
        self, task: Task, result_json: str | None, fence: tuple[str, int] | None, continuation: tuple[str, float] | None
    ) -> None:
        self.task = task
        self.result_json = result_json
        self.fence = fence
        self.continuation = continuation


_ID, _PRIORITY, _RECLAIMED = operator.itemgetter(0), operator.itemgetter(5), operator.itemgetter(14)  # of a claim's row
_NEW = object.__new__
_RUNNING = TaskStatus.RUNNING


def _claimed_task(row: _Row, queue: str, node_id: str, expires: float, now: float) -> Task:
    """A Task from a claim's row (see the claim queries for its columns) and what the claim set.

    Filled slot by slot as :func:`~asynccoord.models.make_task` does (this runs once per
    claimed task; inlined, it saves the 19-argument call), with no validation: the store
    wrote these values, but a text column that holds no text (a BLOB, or bytes that are no
    UTF-8 read as such, see :mod:`.texts`) raises ``TypeError``: the claim dead-letters the
    task (``_CLAIM_TEXTS``).
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


_CLAIM_TEXTS = (("partition_key", 1, False), ("idempotency_key", 3, True), ("last_error", 11, True))
"""The text columns of a claim's row ``_claimed_task`` refuses holding no text (split_unreadable's texts)."""


def _next_claimed(row: _Row, queue: str, node_id: str, expires: float, now: float) -> Task | UnreadableClaim:
    """The task a commit-and-continue leased (see _claimed_task); an UnreadableClaim if its row cannot be decoded."""
    leased, unreadable = split_unreadable(
        [row],
        lambda r: _claimed_task(r, queue, node_id, expires, now),
        payload_at=4,
        result_at=12,
        texts=_CLAIM_TEXTS,
    )
    return leased[0] if leased else unreadable[0]


def _lost_reason(db: sqlite3.Connection, task: Task, now: float) -> str | None:
    """Why a compare-and-set on ``task`` matched nothing; None if the task is gone."""
    row = db.execute(Q["select_task"], {"id": task.id}).fetchone()
    return None if row is None else lease_lost_reason(task, row[7], row[11], row[12], row[13], row[14], now)


class SQLiteQueueOps(StoreBase):
    """The queue primitives of the SQLite store.

    A mixin: it relies on the store's ``_write`` (group-committed operation with an
    optional compensation), ``_read``, ``_w`` (the group committer) and ``_partitions``.
    """

    _partitions: int
    _flagging: Flagging
    _continuations: TurnBatch[_CommitItem, _Completed, tuple[Task | CoordError, _Next]] | None = None
    _writer: GroupCommitter | None
    _gate: CallGate

    if TYPE_CHECKING:

        async def _write(
            self, fn: Operation[Any], undo: Callable[[Any], Operation[Any] | None] | None = None
        ) -> Any: ...

        async def _read(self, fn: Callable[[sqlite3.Connection], Any]) -> Any: ...

        def _w(self) -> GroupCommitter: ...

        def _writable(self) -> GroupCommitter: ...

        async def _check_dimensions(self, prepared: Sequence[PreparedTask]) -> None: ...

        def _after_claim(self, queue: str, admission: Admission | None, since: int) -> None: ...

        @property
        def _limit_watch(self) -> LimitWatch: ...

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

    # --- claim and settle -----------------------------------------------------------

    async def _claim_checked(
        self, queue: str, node_id: str, limit: int, lease: float, parts: list[int] | None, ordered: bool, due_age: float
    ) -> list[Task]:
        """Lease up to ``limit`` due tasks to ``node_id`` in one write transaction of the group commit.

        Raises:
            StoreBusyError: the database stayed locked past ``busy_timeout_s``.
        """
        if parts is not None and not parts:
            return []
        parts = _partition_filter(parts, self._partitions)
        params = {
            "min_due_age_s": due_age,
            "queue": queue,
            "node_id": node_id,
            "lease_s": lease,
            "limit": limit,
            "token": new_token(),
            "partitions": None if parts is None else json.dumps(parts),
        }
        merged, pending_only = (
            (Q["claim_ordered"], Q["claim_pending_ordered"]) if ordered else (Q["claim"], Q["claim_pending"])
        )
        seek = None  # the claim by per-partition seeks, once the queue's tasks are in their index
        if parts is not None and seeks(parts, self._partitions, ordered):
            arms = seek_params(parts)
            seek = seek_sql(len(arms))
            params.update(arms)

        admissions: dict[str, Admission] = {}  # the limited claim's pass over its buckets, if limited
        unreadable_keys: dict[int, UnreadableRowError] = {}  # chosen by it, their limit keys unreadable

        def op(db: sqlite3.Connection, now: float) -> _Claimed:
            if ordered:
                _keep_heads(db, queue)
            dead = 0
            promoted: list[tuple[str, int]] = []  # heads that dead letters and duplicates made claimable
            expired, limited = db.execute(Q["claim_probe"], {"queue": queue, "now": now}).fetchone()
            if not expired:
                sql = seek if seek is not None and self._flagging.indexed(db, queue) else pending_only
            else:
                sql = merged
                exhausted = db.execute(Q["dead_letter_exhausted"], {"queue": queue, "now": now}).fetchall()
                dead = len(exhausted)
                promoted += _promote_heads(db, [(r[1], r[2]) for r in exhausted])
            if limited:  # rate limits: see ratelimits.claim_limited
                rows, admissions[queue], found = claim_limited(db, now, params, ordered, bool(expired))
                unreadable_keys.update(found)
            else:
                rows = db.execute(sql, {**params, "now": now}).fetchall()
            rows.sort(key=_ID)  # priority DESC, id (two stable sorts on C keys: no tuple per row)
            rows.sort(key=_PRIORITY, reverse=True)
            keyed = [r[0] for r in rows if r[3] is not None]
            if not keyed:
                return rows, 0, dead, now, promoted
            settled = db.execute(Q["settle_duplicate"], {"ids": json.dumps(keyed), "now": now}).fetchall()
            if not settled:
                return rows, 0, dead, now, promoted
            promoted += _promote_heads(db, [(r[1], r[2]) for r in settled])
            duplicates = {r[0] for r in settled}
            return [r for r in rows if r[0] not in duplicates], len(duplicates), dead, now, promoted

        def undo(result: _Claimed) -> Operation[Any] | None:
            rows = result[0]
            if not rows:
                return None
            return self._release_rows_op(rows)

        since = self._limit_watch.generation  # the store's own declarations so far (see LimitWatch)
        rows, duplicates, dead, now, promoted = await self._write(op, undo)
        self._after_claim(queue, admissions.get(queue), since)
        notify_partitions(self.notifier, promoted)  # e.g. the next task of a key whose head was a duplicate
        expires = now + lease
        tasks, unreadable = split_unreadable(
            rows,
            lambda r: _claimed_task(r, queue, node_id, expires, now),
            payload_at=4,
            result_at=12,
            known=unreadable_keys,
            texts=_CLAIM_TEXTS,
        )
        if unreadable:
            try:
                await self._dead_letter_unreadable(unreadable)
            except asyncio.CancelledError:  # the claim's caller is gone: hand its tasks back
                if self._writer is not None:
                    self._writer.compensate(self._release_tasks_op(tasks))
                raise
        self.events.add(ev.CLAIMS, len(tasks))
        self.events.add(ev.LEASE_EXPIRED, sum(map(_RECLAIMED, rows)) + dead)  # reclaimed: 0 or 1; dead expired too
        self.events.add(ev.DEAD_LETTERED, dead)
        self.events.add(ev.DUPLICATE_DELIVERY_SUPPRESSED, duplicates)
        return tasks

    async def _claimable_checked(self, queue: str, parts: list[int] | None, ordered: bool, due_age: float) -> set[int]:
        """The partitions where a claim with these arguments would find work now (a read).

        One statement on the connection's thread between the writer's batches, outside any
        write transaction: it takes no write lock and no place in a group commit.
        """
        if parts is not None and not parts:
            return set()
        parts = _partition_filter(parts, self._partitions)
        writer = self._w()
        params = {"queue": queue, "min_due_age_s": due_age, "partitions": None if parts is None else json.dumps(parts)}

        def read(db: sqlite3.Connection) -> list[_Row]:
            sql = Q["claimable_partitions"]
            # Heads are kept only for queues claimed in order at least once; before the
            # first ordered claim every due task counts (the claim computes the heads).
            if ordered and db.execute(Q["ordered_queues"], {"queues": json.dumps([queue])}).fetchone() is not None:
                sql = Q["claimable_partitions_ordered"]
            return db.execute(sql, {**params, "now": writer.now(db)}).fetchall()

        return {int(r[0]) for r in await self._read(read)}

    def _release_rows_op(self, rows: Sequence[_Row]) -> Operation[None]:
        keys = [{"id": r[0], "lease_token": r[9], "version": r[10], "delay_s": 0.0, "refund": 1} for r in rows]
        return self._release_op(keys)

    def _release_tasks_op(self, tasks: Sequence[Task]) -> Operation[None]:
        keys = [
            {"id": t.id, "lease_token": t.lease_token, "version": t.version, "delay_s": 0.0, "refund": 1} for t in tasks
        ]
        return self._release_op(keys)

    @staticmethod
    def _release_op(keys: list[dict[str, Any]]) -> Operation[None]:
        """Hand tasks back to pending, due now, the attempt refunded (a claim whose caller is gone)."""

        def op(db: sqlite3.Connection, now: float) -> None:
            sql = Q["release"]
            for k in keys:
                db.execute(sql, {**k, "now": now}).fetchall()

        return op

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

    async def _complete_many_checked(
        self, checked: list[Task], encoded: list[str | None], fenced: list[tuple[str, int] | None] | None
    ) -> list[Task | CoordError]:
        """Complete many tasks in one transaction of the group commit, each with its own compare-and-set."""
        if not checked:
            return []
        items = [
            _CommitItem(t, r, None if fenced is None else fenced[i], None)
            for i, (t, r) in enumerate(zip(checked, encoded, strict=True))
        ]
        result = await self._write(self._complete_op(items))
        return [outcome for outcome, _ in self._completed(result, items)]  # no continuations here

    async def _complete_and_claim_next_checked(
        self, task: Task, result_json: str | None, fence: tuple[str, int] | None, lease: float, owner: str
    ) -> Continuation:
        """Complete ``task`` and lease its key's next task.

        The calls of one loop turn (a process's nodes finish their sends together) share one
        operation of the group commit (:class:`~asynccoord.backends.sqlite.turnbatch.TurnBatch`):
        one compare-and-set statement for all, then each key's head leased in turn.
        """
        self._writable()  # writable, open and in this loop: raised here, not in the turn's operation
        batch = self._continuations
        if batch is None:
            batch = self._continuations = TurnBatch(self._start_continuations, self._completed, self._orphaned)
        with self._gate.call():  # in flight, with the turn's operation it starts (see SQLiteStore.close)
            outcome, next_task = await batch.call(_CommitItem(task, result_json, fence, (owner, lease)))
        if isinstance(next_task, UnreadableClaim):
            await self._dead_letter_unreadable([next_task])
            next_task = None
        if not isinstance(outcome, Task):
            raise outcome
        return Continuation(done=outcome, next_task=next_task)

    def _start_continuations(self, items: list[_CommitItem]) -> asyncio.Future[_Completed]:
        running = self._writable().enqueue(self._complete_op(items))
        # In flight until its outcomes are delivered, even once its callers are cancelled: the
        # next task leased for a cancelled caller is handed back (_orphaned) before close() stops
        # the writer, not left leased until its lease lapses.
        self._gate.hold(running)
        return running

    def _orphaned(self, _item: _CommitItem, outcome: tuple[Task | CoordError, _Next]) -> None:
        """Hand back the task a commit leased for a caller cancelled meanwhile (pending again, attempt refunded)."""
        next_task = outcome[1]
        if isinstance(next_task, UnreadableClaim):  # the next claim of it dead-letters it
            next_task = next_task.task
        if next_task is not None and self._writer is not None:
            self._writer.compensate(self._release_tasks_op([next_task]))

    def _complete_op(self, items: list[_CommitItem]) -> Operation[_Completed]:
        """complete_many's transaction; each item with a continuation ``(owner, lease_s)`` also
        leases its key's next head to ``owner`` (after every compare-and-set of the operation)."""
        rows = [[i.task.id, i.task.lease_token, i.task.version, i.result_json] for i in items]
        repeats = repeated_ids([i.task for i in items])
        fenced = any(i.fence is not None for i in items)
        continuing = any(i.continuation is not None for i in items)

        def op(db: sqlite3.Connection, now: float) -> _Completed:
            refused: dict[int, int] = {}  # item index -> the fencing token that refused its own
            if fenced:  # refuse outdated tokens first (read only)...
                for n, i in enumerate(items):
                    f = i.fence
                    if f is not None:
                        row = db.execute(Q["fence_get"], {"resource": f[0]}).fetchone()
                        if row is not None and f[1] < row[1]:
                            refused[n] = int(row[1])
            sent = [n not in refused for n in range(len(items))]
            if repeats:  # copies of one task: only the first unrefused one holding its lease is sent (copies_to_write)
                leases: dict[int, tuple[str | None, int] | None] = {}
                for task_id in repeats:
                    row = db.execute(Q["select_task"], {"id": task_id}).fetchone()
                    leases[task_id] = None if row is None else (row[12], row[14])
                candidates = [n for n in range(len(items)) if n not in refused]
                chosen = copies_to_write([items[n].task for n in candidates], leases)
                sent = [False] * len(items)
                for n, s in zip(candidates, chosen, strict=True):
                    sent[n] = s
            batch = json.dumps([r for r, s in zip(rows, sent, strict=True) if s], separators=(",", ":"))
            done = db.execute(Q["complete_batch"], {"batch": batch, "now": now}).fetchall()
            matched = {(r[0], r[1]) for r in done}
            # per copy: its compare-and-set matched (at most one copy of a task is sent)
            won = [s and (i.task.id, i.task.version + 1) in matched for i, s in zip(items, sent, strict=True)]
            keys = [(r[2], r[3]) for r in done]  # the stored keys, not the caller's
            if fenced:  # ...and record the tokens of the commits that went through
                for i, w in zip(items, won, strict=True):
                    if i.fence is not None and w:
                        check_fence(db, now, i.fence[0], i.fence[1])
            records = [[r[2], r[4]] for r in done if r[4] is not None]  # the stored keys, not the caller's
            if records:
                db.execute(Q["record_processed_batch"], {"records": json.dumps(records), "now": now})
            out: list[int | str | None] = [
                i.task.version + 1 if w else (None if n in refused else _lost_reason(db, i.task, now))
                for n, (i, w) in enumerate(zip(items, won, strict=True))
            ]
            following: list[tuple[_Row, str] | None] = [None] * len(items)
            duplicates = 0
            promoted: list[tuple[str, int]] = []
            if continuing:
                stored = {r[0]: (r[2], r[3]) for r in done}  # the stored key (as the promotion uses)
                continued: set[tuple[str, str]] = set()
                for n, (i, w) in enumerate(zip(items, won, strict=True)):
                    if i.continuation is None or not w:
                        continue
                    queue, key = stored[i.task.id]
                    params = {
                        "queue": queue,
                        "partition_key": key,
                        "node_id": i.continuation[0],
                        "lease_s": i.continuation[1],
                        "token": new_token(),
                    }
                    # Read leniently: a next row holding a text that is not UTF-8 must not fail the
                    # commit (it is dead-lettered by the caller, see .texts)
                    row, settled, heads = _lenient_head(db, now, params)
                    duplicates += settled
                    promoted += heads
                    if row is not None:
                        following[n] = (row, queue)
                    if row is not None or settled:  # the key's new head is leased (or settled and
                        continued.add((queue, key))  # its successor promoted): nothing left to promote
                if continued:
                    keys = [k for k in keys if k not in continued]
            promoted = _promote_heads(db, keys) + promoted
            return now, out, refused, promoted, following, duplicates

        return op

    def _completed(self, result: _Completed, items: list[_CommitItem]) -> list[tuple[Task | CoordError, _Next]]:
        """Per item, on the loop: its outcome (the done task or the error) and the next task leased for it
        (an :class:`~asynccoord.backends.rows.UnreadableClaim` if its row cannot be decoded)."""
        now, outcomes, refused, promoted, following, duplicates = result
        out: list[tuple[Task | CoordError, _Next]] = []
        committed = lost = leased = 0
        for n, (item, outcome, step) in enumerate(zip(items, outcomes, following, strict=True)):
            task = item.task
            done: Task | CoordError
            if n in refused and item.fence is not None:
                done = fence_rejected_error(item.fence[0], item.fence[1], refused[n])
            elif isinstance(outcome, int):
                committed += 1
                done = settled_done(task, version=outcome, now=now, result=decode_json(item.result_json))
            elif outcome is None:
                done = TaskNotFoundError(task.id)
            else:
                lost += 1
                done = LeaseLostError(task.id, outcome)
            next_task: _Next = None
            if step is not None:
                assert item.continuation is not None
                owner, lease_s = item.continuation
                next_task = _next_claimed(step[0], step[1], owner, now + lease_s, now)
                leased += 1
            out.append((done, next_task))
        self.events.add(ev.COMMITS, committed)
        notify_partitions(self.notifier, promoted)  # the keys' next tasks, claimable now
        self.events.add(ev.STALE_COMMIT_REJECTED, lost)
        self.events.add(ev.FENCING_REJECTED, len(refused))
        self.events.add(ev.CLAIMS, leased)
        self.events.add(ev.DUPLICATE_DELIVERY_SUPPRESSED, duplicates)
        return out

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

    # --- unchecked operations (benchmarks only) ------------------------------------------

    async def _unchecked_claim_checked(
        self, queue: str, node_id: str, limit: int, lease: float, parts: list[int] | None
    ) -> list[Task]:
        """Claim as a naive queue does: a read, then a write transaction that leases what it found.

        The read and the write are separate transactions, so two nodes can claim the
        same task (benchmarks only).
        """
        writer = self._w()
        parts_json = None if parts is None else json.dumps(parts)

        def read(db: sqlite3.Connection) -> list[int]:
            now = writer.now(db)
            params = {"queue": queue, "limit": limit, "partitions": parts_json, "now": now}
            return [r[0] for r in db.execute(Q["unchecked_peek"], params).fetchall()]

        ids = await self._read(read)
        if not ids:
            return []
        params = {"ids": json.dumps(ids), "node_id": node_id, "lease_s": lease, "token": new_token()}

        def op(db: sqlite3.Connection, now: float) -> list[_Row]:
            return db.execute(Q["unchecked_claim"], {**params, "now": now}).fetchall()

        rows: list[_Row] = await self._write(op)
        self.events.add(ev.CLAIMS, len(rows))
        return [task_from_row(r) for r in rows]

    async def _unchecked_complete_checked(self, checked: list[Task], encoded: list[str | None]) -> int:
        """Mark tasks done without any compare-and-set (benchmarks only); return rows written."""
        items = [{"id": t.id, "result": r} for t, r in zip(checked, encoded, strict=True)]

        def op(db: sqlite3.Connection, now: float) -> int:
            done = [db.execute(Q["unchecked_complete"], {**item, "now": now}).fetchone() for item in items]
            _promote_heads(db, [(r[0], r[1]) for r in done if r is not None])
            return sum(1 for r in done if r is not None)

        written = int(await self._write(op))
        self.events.add(ev.COMMITS, written)
        return written

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


def _partition_filter(parts: list[int] | None, partitions: int) -> list[int] | None:
    """A claim's (or claimable read's) partition filter: None (no filter) when ``parts`` names every partition.

    A sole node owns all of them; matching every row the statement visits against a JSON
    list of 1,024 partitions made its claims about half again as costly as no filter
    (7.6 against 5.0 us per task, claims of 32 on 50,000 pending tasks), as on PostgreSQL
    (:meth:`~asynccoord.backends.postgres.claim.PgClaimOps._partition_filter`).
    """
    if parts is not None and len(parts) >= partitions and len(set(parts)) == partitions:
        return None
    return parts


def _promote_heads(db: sqlite3.Connection, keys: Sequence[tuple[str, str]]) -> list[tuple[str, int]]:
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


def _keep_heads(db: sqlite3.Connection, queue: str) -> None:
    """Make ``queue`` keep per-key heads from now on (first ordered use: computed from scratch).

    The insert into ``coord_ordered_queues`` fires a trigger that puts the queue's tasks into
    the order index first (``by_key``, ``migration_0006.sql``), in the same transaction: only
    the tasks of ordered queues are in it, so an unordered queue's enqueues and completions
    never write it.
    """
    if db.execute(Q["mark_ordered"], {"queue": queue}).rowcount:
        db.execute(Q["recompute_queue_heads"], {"queue": queue})  # heads were not kept until now


def _claim_key_head(
    db: sqlite3.Connection, now: float, params: dict[str, Any]
) -> tuple[_Row | None, int, list[tuple[str, int]]]:
    """Lease the head of one key (commit-and-continue); return its row, duplicates settled, promotions.

    The leased task is marked the key's head in the same statement, so the commit that
    continues needs no promotion of that key. The queue keeps heads from now on (as after an
    ordered claim). A head whose message id is already processed is settled as a duplicate,
    and the key's following head is not leased (it is promoted and announced instead, as a
    claim does).
    """
    _keep_heads(db, params["queue"])
    row: _Row | None = db.execute(Q["claim_key_head"], {**params, "now": now}).fetchone()
    if row is None or row[3] is None:
        return row, 0, []
    settled = db.execute(Q["settle_duplicate"], {"ids": json.dumps([row[0]]), "now": now}).fetchall()
    if not settled:
        return row, 0, []
    return None, 1, _promote_heads(db, [(r[1], r[2]) for r in settled])


_lenient_head = leniently(_claim_key_head)
"""_claim_key_head with a text that is not UTF-8 read as bytes (see .texts)."""
