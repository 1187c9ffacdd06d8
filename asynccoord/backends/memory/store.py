"""In-memory store: the reference semantics of the storage contract.

Everything lives in dicts of one process and one event loop. Each call hands control
to the loop once at its entry, as a call to a real store does (see
:meth:`MemoryStore._enter`), then runs to completion without awaiting, so each is
atomic. It is the model the contract tests compare other backends against, and a fast
store for unit tests of code built on asynccoord. It is not durable and cannot be shared
between processes.

The clock is injectable (``clock=``), which makes lease expiry and backoff
deterministic in tests; the default is ``time.time``.

Beside the table of tasks by id, the store keeps each queue's ids of the tasks that are not
done (pending, running and dead) and its count of done tasks, updated by every write of a
task (:meth:`MemoryStore._store`), as the SQL stores keep partial indexes: a claim, a
backlog or a count reads the queue's unfinished and dead tasks, never the done ones kept.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ... import events as ev
from ...config import RetryPolicy, StoreConfig
from ...contract.locks import fence_rejected_error
from ...contract.queue import PreparedTask
from ...contract.ratelimits import warn_undeclared_dimensions
from ...errors import (
    CoordError,
    InvalidTypeError,
    LeaseLostError,
    StoreAlreadyOpenError,
    StoreClosedError,
    StoreLoopError,
    TaskNotFoundError,
)
from ...events import EventCounter
from ...models import Continuation, EnqueueResult, PurgeResult, QueueStats, Task, TaskStatus
from ...monitor.histogram import LatencyRecorder
from ...notify import WorkNotifier
from ...pauses import PauseBook
from ...validation import check_clock
from ..base import StoreBase
from ..calls import CLOSE_WAIT_S, CallGate
from ..rows import decode_json, lease_lost_reason, new_token
from ..wakeups import notify_partitions, notify_settled
from .deadletters import MemoryDeadLetterOps
from .locks import MemoryLockOps
from .membership import MemoryMembershipOps
from .monitor import MemoryMonitorOps
from .ratelimits import MemoryRateLimitOps

__all__ = ("MemoryStore",)

_ACTIVE = (TaskStatus.PENDING, TaskStatus.RUNNING)


class MemoryStore(
    StoreBase, MemoryLockOps, MemoryMembershipOps, MemoryMonitorOps, MemoryRateLimitOps, MemoryDeadLetterOps
):
    """The storage contract in plain Python objects (see :class:`~asynccoord.contract.store.Store`).

    Args:
        config: Store settings; default :class:`~asynccoord.config.StoreConfig`.
        clock: Store clock, seconds since the epoch; default ``time.time``.

    Raises:
        InvalidTypeError: ``config`` is not a StoreConfig, or ``clock`` is neither
            callable nor None.
    """

    def __init__(self, *, config: StoreConfig | None = None, clock: Callable[[], float] | None = None) -> None:
        if config is not None and not isinstance(config, StoreConfig):
            raise InvalidTypeError(f"config must be a StoreConfig, got {type(config).__name__}")
        self._clock = check_clock(clock) or time.time
        self.config = config or StoreConfig()
        self.events = EventCounter()
        self.latencies = LatencyRecorder()
        self.pauses = PauseBook()  # the provider's 429 pauses this process heard of (asynccoord.pauses)
        self.notifier = WorkNotifier()
        self._open = False
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop of the open: the one it serves
        self._gate = CallGate("the memory store")  # refuses new calls while close() lets hand-backs in
        self._ids = itertools.count(1)
        self._tasks: dict[int, Task] = {}  # written only by _store and _forget, which keep the two below
        self._undone: dict[str, dict[int, None]] = {}  # queue -> ids of its pending, running, dead tasks, in order
        self._done: dict[str, int] = {}  # queue -> its done tasks
        self._removed: dict[str, int] = {}  # queue -> done and dead tasks deleted (purges, discards)
        self._by_key: dict[tuple[str, str], int] = {}
        self._processed: dict[tuple[str, str], float] = {}

    def __repr__(self) -> str:
        return f"<MemoryStore tasks={len(self._tasks)} {'open' if self._open else 'closed'}>"

    async def open(self) -> None:
        """Mark the store open for the running event loop (data survives close/open of the same object).

        As the SQLite and PostgreSQL stores, an open store serves the loop that opened it: a
        call from another loop raises :class:`~asynccoord.errors.StoreLoopError` and changes
        nothing, so a test on the memory store fails where those would. ``close()`` works
        from any loop; a closed store opens again in any loop.

        Raises:
            StoreAlreadyOpenError: the store is open already; it stays open.
        """
        if self._open:
            raise StoreAlreadyOpenError.of(self)
        self._gate.forget_calls()  # those of a loop closed mid-call never end
        self._loop = asyncio.get_running_loop()
        self._open = True

    async def close(self) -> None:
        """Let the hand-backs of callers cancelled just before the close in, then mark the store closed.

        From the moment ``close()`` is called, a new call raises
        :class:`~asynccoord.errors.StoreClosedError`, but a hand-back (a lock's or a task's
        ``release``) is let through for a few loop turns (see
        :meth:`~asynccoord.backends.calls.CallGate.settle`): the release of a lease granted to
        a ``Lock`` caller cancelled just before the close, say, which would otherwise leave
        the lease held until its TTL. Idempotent; the store is closed even if the caller is
        cancelled meanwhile.
        """
        try:
            if self._open:
                self._gate.closing = True
                await self._gate.settle(CLOSE_WAIT_S)  # hand-backs in their entry's yield are calls in flight
        finally:
            self._gate.closing = False
            self._open = False
            self._refill.cancel_all()

    def _check_open(self) -> None:
        """Raise :class:`StoreClosedError` unless the store is open (and, while it closes, this is a hand-back).

        Raises:
            StoreClosedError: the store is not open, or it is closing.
            StoreLoopError: the store was opened in another event loop.
        """
        if not self._open:
            raise StoreClosedError(f"{self!r} is not open: use 'async with' or await open()")
        if self._loop is not asyncio.get_running_loop():
            raise StoreLoopError(
                f"{self!r} was opened in another event loop (another asyncio.run, thread or test loop) and"
                " serves that loop only: open a store in the loop that uses it"
            )
        self._gate.admit()

    async def _enter(self) -> None:
        """Begin a call: hand control to the loop once, then :meth:`_check_open`.

        A real store's call awaits its database, so other tasks run meanwhile; without this
        yield a loop of calls would starve every other task of the loop. The yield comes
        before the call reads or changes anything: a call cancelled in it changed nothing,
        and one that finds the store closing after it is refused as a new call. A call made
        inside a hand-back (the read of the stored task by a ``release`` that counts its
        attempt) enters as the hand-back does (:meth:`_enter_giving_back`).

        Raises:
            StoreClosedError: the store is not open, or it is closing.
        """
        if CallGate.in_hand_back():
            await self._enter_giving_back()
            return
        await asyncio.sleep(0)
        self._check_open()

    async def _enter_giving_back(self) -> None:
        """Begin a hand-back (see :meth:`_enter`): let through while the store closes, and waited for.

        The hand-back is a call in flight during its yield, so a ``close()`` that begins
        meanwhile waits for it (:meth:`CallGate.settle`) instead of closing under it.
        """
        with CallGate.giving_back(), self._gate.call():
            await asyncio.sleep(0)
            self._check_open()

    @property
    def partitions(self) -> int:
        """Number of fixed partitions."""
        return self.config.partitions

    async def now(self) -> float:
        """The store clock."""
        await self._enter()
        return self._clock()

    # --- enqueue ----------------------------------------------------------------------

    async def _enqueue_checked(self, prepared: list[PreparedTask]) -> list[EnqueueResult]:
        """Add tasks atomically; a repeated idempotency key returns the existing task."""
        await self._enter()
        for p in prepared:
            if p.limit_keys:
                warn_undeclared_dimensions(p.queue, p.limit_keys, list(self._declared(p.queue)))
        now = self._clock()
        results: list[EnqueueResult] = []
        for p in prepared:
            if p.idempotency_key is not None:
                existing = self._by_key.get((p.queue, p.idempotency_key))
                if existing is not None and existing in self._tasks:
                    results.append(EnqueueResult(task=self._tasks[existing], created=False))
                    continue
            task = Task(
                id=next(self._ids),
                queue=p.queue,
                partition_key=p.partition_key,
                partition=p.partition,
                idempotency_key=p.idempotency_key,
                payload=json.loads(p.payload_json),
                priority=p.priority,
                status=TaskStatus.PENDING,
                attempts=0,
                max_attempts=p.max_attempts,
                run_at=now + p.delay_s,
                lease_owner=None,
                lease_token=None,
                lease_expires_at=None,
                version=0,
                last_error=None,
                result=None,
                created_at=now,
                updated_at=now,
            )
            self._store(task)
            if p.limit_keys:
                self._rate.keys[task.id] = dict(p.limit_keys)
            if p.idempotency_key is not None:
                self._by_key[(p.queue, p.idempotency_key)] = task.id
            results.append(EnqueueResult(task=task, created=True))
        return results

    # --- claim and settle -----------------------------------------------------------

    @staticmethod
    def _due_at(task: Task) -> float:
        if task.status is TaskStatus.PENDING:
            return task.run_at
        assert task.lease_expires_at is not None
        return task.lease_expires_at

    async def _claim_checked(
        self, queue: str, node_id: str, limit: int, lease: float, parts: list[int] | None, ordered: bool, due_age: float
    ) -> list[Task]:
        """Lease up to ``limit`` due tasks (semantics as in the SQLite store)."""
        await self._enter()
        now = self._clock()
        dead = 0
        for task in self._unfinished(queue):
            if task.status is TaskStatus.RUNNING and self._due_at(task) <= now and task.attempts >= task.max_attempts:
                self._put(
                    task,
                    now,
                    status=TaskStatus.DEAD,
                    last_error=f"lease expired on the last attempt (owner {task.lease_owner})",
                )
                dead += 1
        candidates = self._claimable(queue, parts, ordered, now - due_age)
        candidates.sort(key=lambda t: (-t.priority, t.id))
        admission = self._admission(queue, now)
        if admission is None:
            candidates = candidates[:limit]
        else:  # rate limits: skip past the tasks whose buckets are empty, take tokens for the others
            admitted: list[Task] = []
            for t in candidates:
                if len(admitted) == limit:
                    break
                if admission.admit(self._limit_keys_of(t.id), t.partition):
                    admitted.append(t)
            candidates = admitted
            self._settle_admission(queue, admission)
        token = new_token()
        claimed: list[Task] = []
        freed: list[tuple[str, int]] = []
        duplicates = reclaimed = 0
        for task in candidates:
            if task.status is TaskStatus.RUNNING:
                reclaimed += 1
            updated = self._lease(task, now, node_id, token, lease)
            if task.idempotency_key is not None and (queue, task.idempotency_key) in self._processed:
                self._put(updated, now, status=TaskStatus.DONE, result={"duplicate": True}, last_error=None)
                duplicates += 1
                freed.append((queue, task.partition))  # the key's next task is its head now
                continue
            claimed.append(updated)
        self.events.add(ev.CLAIMS, len(claimed))
        self.events.add(ev.LEASE_EXPIRED, reclaimed + dead)
        self.events.add(ev.DEAD_LETTERED, dead)
        self.events.add(ev.DUPLICATE_DELIVERY_SUPPRESSED, duplicates)
        notify_partitions(self.notifier, freed)
        return claimed

    async def _claimable_checked(self, queue: str, parts: list[int] | None, ordered: bool, due_age: float) -> set[int]:
        """The partitions where a claim with these arguments would find work now (semantics as in the SQLite store)."""
        await self._enter()
        now = self._clock()
        found = self._claimable(queue, parts, ordered, now - due_age)
        admission = self._admission(queue, now)
        if admission is None:
            return {t.partition for t in found}
        out: set[int] = set()
        wake_at: dict[int, float] = {}
        for t in found:  # a read: no token taken
            at = admission.earliest(self._limit_keys_of(t.id))
            if at is None:
                out.add(t.partition)
            elif t.partition not in wake_at or at < wake_at[t.partition]:
                wake_at[t.partition] = at
        self._refill.schedule(queue, {p: at for p, at in wake_at.items() if p not in out}, now)
        return out

    def _claimable(self, queue: str, parts: list[int] | None, ordered: bool, due_by: float) -> list[Task]:
        """Tasks of ``queue`` a claim may take: due by ``due_by``, in ``parts`` (None: all), heads if ``ordered``."""
        allowed = None if parts is None else set(parts)
        heads: dict[str, int] = {}
        tasks = self._unfinished(queue)
        if ordered:
            blocking = self._blocking(queue)
            for task in tasks:
                if task.status in blocking:
                    heads.setdefault(task.partition_key, task.id)  # a dead head (policy hold): no task of the key
        return [
            t
            for t in tasks
            if t.status in _ACTIVE
            and self._due_at(t) <= due_by
            and (allowed is None or t.partition in allowed)
            and (not ordered or heads.get(t.partition_key) == t.id)
        ]

    def _lease(self, task: Task, now: float, node_id: str, token: str, lease_s: float) -> Task:
        """Store ``task`` leased to ``node_id`` (as a claim leases it): a new attempt, lease token ``<token>.<id>``."""
        return self._put(
            task,
            now,
            status=TaskStatus.RUNNING,
            attempts=task.attempts + 1,
            lease_owner=node_id,
            lease_token=f"{token}.{task.id}",
            lease_expires_at=now + lease_s,
        )

    def _put(self, task: Task, now: float, **changes: Any) -> Task:
        """Store a new state of ``task``: version + 1, lease cleared unless running."""
        status = changes.get("status", task.status)
        if status is not TaskStatus.RUNNING:
            changes.setdefault("lease_owner", None)
            changes.setdefault("lease_token", None)
            changes.setdefault("lease_expires_at", None)
        updated = replace(task, version=task.version + 1, updated_at=now, **changes)
        self._store(updated)
        return updated

    def _store(self, task: Task) -> None:
        """Write ``task`` (new, or a new state of a stored one) and keep its queue's ids and done count."""
        old = self._tasks.get(task.id)
        self._tasks[task.id] = task
        was_done = old is not None and old.status is TaskStatus.DONE
        if task.status is TaskStatus.DONE:
            if not was_done:
                self._undone.get(task.queue, {}).pop(task.id, None)
                self._done[task.queue] = self._done.get(task.queue, 0) + 1
            return
        ids = self._undone.setdefault(task.queue, {})
        ids[task.id] = None  # a new task has the highest id yet: the ids stay in id order
        if was_done:  # back from done (only a naive claim does it): put its id back in order
            self._done[task.queue] -= 1
            self._undone[task.queue] = dict.fromkeys(sorted(ids))

    def _unfinished(self, queue: str) -> list[Task]:
        """The pending, running and dead tasks of ``queue``, by id (never a walk of the done ones).

        The queue's ids are kept in id order (:meth:`_store`), so this is one pass, no sort.
        """
        tasks = self._tasks
        return [tasks[i] for i in self._undone.get(queue, ())]

    def _held(self, task: Task, now: float, *, count: bool = True) -> Task:
        """The stored task if the caller's lease on it still holds; else raise."""
        current = self._tasks.get(task.id)
        if current is None:
            raise TaskNotFoundError(task.id)
        expires = current.lease_expires_at
        reason = None
        if (
            current.status is not TaskStatus.RUNNING
            or current.lease_token != task.lease_token
            or current.version != task.version
            or expires is None
            or expires <= now
        ):
            reason = lease_lost_reason(
                task, current.status, current.lease_owner, current.lease_token, expires, current.version, now
            )
        if reason is not None:
            if count:
                self.events.add(ev.STALE_COMMIT_REJECTED)
            raise LeaseLostError(task.id, reason)
        return current

    async def _complete_many_checked(
        self, tasks: list[Task], results: list[str | None], fences: list[tuple[str, int] | None] | None
    ) -> list[Task | CoordError]:
        """Complete many tasks atomically, each with its own compare-and-set (and fence)."""
        await self._enter()
        return self._complete(tasks, results, fences, announce=True)

    async def _complete_and_claim_next_checked(
        self, task: Task, result_json: str | None, fence: tuple[str, int] | None, lease: float, owner: str
    ) -> Continuation:
        """Complete ``task`` and lease its key's next task atomically (semantics as in the SQLite store)."""
        await self._enter()
        fenced: list[tuple[str, int] | None] | None = None if fence is None else [fence]
        outcome = self._complete([task], [result_json], fenced, announce=False)[0]
        if not isinstance(outcome, Task):
            raise outcome
        next_task = self._lease_key_head(outcome, owner, lease)
        if next_task is None:  # nothing leased: whoever claims the key's next task may be woken
            notify_settled(self.notifier, [outcome])
        return Continuation(done=outcome, next_task=next_task)

    def _lease_key_head(self, done: Task, node_id: str, lease: float) -> Task | None:
        """Lease the head (earliest unfinished task) of ``done``'s key to ``node_id`` if it is pending and due."""
        now = done.updated_at
        blocking = self._blocking(done.queue)
        head = next(
            (t for t in self._unfinished(done.queue) if t.partition_key == done.partition_key and t.status in blocking),
            None,
        )
        if head is None or head.status is not TaskStatus.PENDING or head.run_at > now:
            return None
        if self._limit_keys_of(head.id) and self._declared(head.queue):
            return None  # held by rate limits: a claim takes it when its buckets have tokens
        leased = self._lease(head, now, node_id, new_token(), lease)
        if head.idempotency_key is None or (head.queue, head.idempotency_key) not in self._processed:
            self.events.add(ev.CLAIMS)
            return leased
        # Already processed: settled as a duplicate, as a claim would; the key's next
        # task is then announced, not leased.
        self._put(leased, now, status=TaskStatus.DONE, result={"duplicate": True}, last_error=None)
        self.events.add(ev.DUPLICATE_DELIVERY_SUPPRESSED)
        return None

    def _complete(
        self,
        checked: list[Task],
        encoded: list[str | None],
        fenced: list[tuple[str, int] | None] | None,
        *,
        announce: bool,
    ) -> list[Task | CoordError]:
        now = self._clock()
        out: list[Task | CoordError] = []
        # Each fence is checked against the tokens recorded before the call, as the SQL stores
        # check a batch: the commits of one call are fenced as if they landed at once.
        if fenced is not None:
            self._check_open()
        before = {f[0]: self._lock_tables.fences.get(f[0]) for f in fenced or () if f is not None}
        for i, (task, result_json) in enumerate(zip(checked, encoded, strict=True)):
            fence = None if fenced is None else fenced[i]
            if fence is not None:
                record = before[fence[0]]
                if record is not None and fence[1] < record.fencing_token:
                    self.events.add(ev.FENCING_REJECTED)
                    out.append(fence_rejected_error(fence[0], fence[1], record.fencing_token))
                    continue
            try:
                current = self._held(task, now)
            except (LeaseLostError, TaskNotFoundError) as exc:
                out.append(exc)
                continue
            if fence is not None:  # the commit goes through: record its token, unless one of this call was higher
                latest = self._lock_tables.fences.get(fence[0])
                if latest is None or fence[1] >= latest.fencing_token:
                    self._record_fence(*fence)
            done = self._put(current, now, status=TaskStatus.DONE, result=decode_json(result_json), last_error=None)
            if current.idempotency_key is not None:
                self._processed.setdefault((current.queue, current.idempotency_key), now)
            out.append(done)
        committed = sum(1 for d in out if isinstance(d, Task))
        self.events.add(ev.COMMITS, committed)
        if committed and announce:  # an ordered queue's next task per key may be claimable now
            notify_settled(self.notifier, [t for t, d in zip(checked, out, strict=True) if isinstance(d, Task)])
        return out

    async def _fail_checked(self, task: Task, text: str, policy: RetryPolicy, dead: bool = False) -> Task:
        """Record a failed attempt in one atomic step (semantics as in the SQLite store)."""
        await self._enter()
        now = self._clock()
        current = self._held(task, now)
        if dead or current.attempts >= current.max_attempts:
            self.events.add(ev.DEAD_LETTERED)
            return self._put(current, now, status=TaskStatus.DEAD, last_error=text)
        delay = policy.delay_s(max(current.attempts, 1))
        self.events.add(ev.RETRIES)
        return self._put(current, now, status=TaskStatus.PENDING, run_at=now + delay, last_error=text)

    async def _dead_letter_checked(self, task: Task, error: str, *, count: bool = True) -> Task:
        """Dead-letter ``task`` with ``error`` in one atomic step (for a release on its last attempt)."""
        await self._enter()
        now = self._clock()
        current = self._held(task, now, count=count)
        return self._put(current, now, status=TaskStatus.DEAD, last_error=error)

    async def _release_checked(self, task: Task, delay: float, count_attempt: bool) -> Task:
        """Hand back to pending (due after ``delay``), the attempt counted or not (a hand-back: see close())."""
        await self._enter_giving_back()
        now = self._clock()
        current = self._held(task, now, count=False)  # a refused hand-back is no stale commit
        attempts = current.attempts if count_attempt else max(current.attempts - 1, 0)
        return self._put(current, now, status=TaskStatus.PENDING, run_at=now + delay, attempts=attempts)

    async def _unchecked_claim_checked(
        self, queue: str, node_id: str, limit: int, lease: float, parts: list[int] | None
    ) -> list[Task]:
        """Naive claim: read due pending tasks, yield, then mark them running unconditionally.

        Two nodes can claim the same task. For benchmarks only.
        """
        await self._enter()
        now = self._clock()
        allowed = None if parts is None else set(parts)
        ids = [
            t.id
            for t in sorted(self._unfinished(queue), key=lambda t: (-t.priority, t.id))
            if t.status is TaskStatus.PENDING and t.run_at <= now and (allowed is None or t.partition in allowed)
        ][:limit]
        await asyncio.sleep(0)  # the gap between the read and the write that a naive queue has
        token = new_token()
        now = self._clock()
        out = []
        for task_id in ids:
            out.append(self._lease(self._tasks[task_id], now, node_id, token, lease))
        self.events.add(ev.CLAIMS, len(out))
        return out

    async def _unchecked_complete_checked(self, checked: list[Task], encoded: list[str | None]) -> int:
        """Mark tasks done without any compare-and-set (benchmarks only); return how many."""
        await self._enter()
        now = self._clock()
        for t, r in zip(checked, encoded, strict=True):
            current = self._tasks.get(t.id)
            if current is not None:
                self._put(current, now, status=TaskStatus.DONE, result=decode_json(r), last_error=None)
        self.events.add(ev.COMMITS, len(checked))
        return len(checked)

    async def _extend_checked(self, task: Task, lease: float) -> float:
        """Renew the lease; an expired lease is never revived."""
        await self._enter()
        now = self._clock()
        current = self._held(task, now, count=False)  # a failed heartbeat is not a stale commit
        self._store(replace(current, lease_expires_at=now + lease))
        return now + lease

    async def _extend_many_checked(self, checked: list[Task], lease: float) -> list[bool]:
        """Renew many leases; True where the lease was still held."""
        await self._enter()
        now = self._clock()
        out: list[bool] = []
        for t in checked:
            current = self._tasks.get(t.id)
            ok = (
                current is not None
                and current.status is TaskStatus.RUNNING
                and current.lease_token == t.lease_token
                and current.lease_expires_at is not None
                and current.lease_expires_at > now
            )
            if ok:
                assert current is not None
                self._store(replace(current, lease_expires_at=now + lease))
            out.append(ok)
        return out

    # --- inspection and maintenance ---------------------------------------------------

    async def _get_checked(self, task_id: int) -> Task:
        """The task with that id. Raises TaskNotFoundError."""
        await self._enter()
        task = self._tasks.get(task_id)
        if task is None:
            raise TaskNotFoundError(task_id)
        return task

    async def _stats_checked(self, queue: str | None) -> QueueStats:
        """Counts by status and the oldest due pending age."""
        await self._enter()
        now = self._clock()
        counts = {s: 0 for s in TaskStatus}
        oldest: float | None = None
        queues = list(self._undone.keys() | self._done.keys()) if queue is None else [queue]
        for q in queues:
            counts[TaskStatus.DONE] += self._done.get(q, 0)
            for t in self._unfinished(q):
                counts[t.status] += 1
                if t.status is TaskStatus.PENDING and t.run_at <= now:
                    oldest = t.run_at if oldest is None else min(oldest, t.run_at)
        return QueueStats(counts=counts, oldest_pending_age_s=None if oldest is None else max(0.0, now - oldest))

    async def _is_drained_checked(self, queue: str) -> bool:
        """True when ``queue`` has no pending and no running task."""
        await self._enter()
        tasks = self._tasks
        return not any(tasks[i].status in _ACTIVE for i in self._undone.get(queue, ()))  # stops at the first

    async def _dead_letters_checked(self, queue: str, limit: int, after_id: int | None) -> list[Task]:
        """The dead tasks of ``queue`` above ``after_id``, ascending id, at most ``limit``."""
        await self._enter()
        after = -1 if after_id is None else after_id
        return [t for t in self._unfinished(queue) if t.status is TaskStatus.DEAD and t.id > after][:limit]

    async def _requeue_dead_checked(self, queue: str, ids: list[int] | None) -> int:
        """Move dead tasks back to pending with attempts reset."""
        wanted = None if ids is None else set(ids)
        await self._enter()
        now = self._clock()
        n = 0
        for t in self._unfinished(queue):
            if t.status is TaskStatus.DEAD and (wanted is None or t.id in wanted):
                self._put(t, now, status=TaskStatus.PENDING, attempts=0, run_at=now)
                n += 1
        return n

    async def _is_processed_checked(self, consumer: str, message_id: str) -> bool:
        """Whether a processed-id record exists."""
        await self._enter()
        return (consumer, message_id) in self._processed

    async def _purge_processed_checked(self, age: float, size: int) -> PurgeResult:
        """Delete processed-id records older than ``age`` seconds, in batches of ``size``."""
        await self._enter()
        cutoff = self._clock() - age
        old = [k for k, at in self._processed.items() if at < cutoff]
        for k in old:
            del self._processed[k]
        return PurgeResult(deleted=len(old), batches=-(-len(old) // size))

    async def _purge_finished_checked(self, queue: str, age: float, size: int) -> PurgeResult:
        """Delete done tasks of ``queue`` older than ``age`` seconds."""
        await self._enter()
        cutoff = self._clock() - age
        old = [
            t
            for t in self._tasks.values()
            if t.queue == queue and t.status is TaskStatus.DONE and t.updated_at < cutoff
        ]
        for t in old:
            self._forget(t)
        self._count_removed(queue, len(old))
        return PurgeResult(deleted=len(old), batches=-(-len(old) // size))

    async def _discard_dead_checked(self, queue: str, ids: list[int] | None) -> int:
        """Delete dead tasks of ``queue`` (all, or those ids); a key they held goes on."""
        wanted = None if ids is None else set(ids)
        await self._enter()
        gone = [
            t for t in self._unfinished(queue) if t.status is TaskStatus.DEAD and (wanted is None or t.id in wanted)
        ]
        for t in gone:
            self._forget(t)
        self._count_removed(queue, len(gone))
        notify_partitions(self.notifier, [(queue, t.partition) for t in gone])
        return len(gone)

    def _count_removed(self, queue: str, n: int) -> None:
        """Add ``n`` deleted tasks to ``queue``'s removed count; none deleted records nothing (as the SQL stores)."""
        if n:
            self._removed[queue] = self._removed.get(queue, 0) + n

    def _forget(self, task: Task) -> None:
        """Delete ``task`` and what refers to it (its stored state: the queue's ids and done count follow it)."""
        stored = self._tasks.pop(task.id)
        if stored.status is TaskStatus.DONE:
            self._done[stored.queue] -= 1
        else:
            self._undone[stored.queue].pop(stored.id, None)
        self._rate.keys.pop(task.id, None)
        if task.idempotency_key is not None and self._by_key.get((task.queue, task.idempotency_key)) == task.id:
            del self._by_key[(task.queue, task.idempotency_key)]
