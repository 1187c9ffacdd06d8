"""In-memory store: the reference semantics of the storage contract.

Everything lives in dicts of one process and one event loop; each method runs to
completion without awaiting in between, so each is atomic. It is the model the
contract tests compare other backends against, and a fast store for unit tests of
code built on asynccoord. It is not durable and cannot be shared between processes.

The clock is injectable (``clock=``), which makes lease expiry and backoff
deterministic in tests; the default is ``time.time``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from typing import Any, Self

from ... import events as ev
from ...config import StoreConfig
from ...contract.lockchecks import fence_rejected_error
from ...contract.queue import (
    MAX_ID,
    QueueConveniences,
    check_claim_args,
    check_claimable_args,
    check_continuation,
    check_fences,
    check_purge_batch,
    check_retry,
    check_task,
    check_task_ids,
    check_tasks,
    clean_error,
    decode_json,
    encode_results,
    new_token,
    notify_created,
    notify_partitions,
    notify_settled,
    prepare_tasks,
)
from ...contract.ratelimits import check_unknown_dimensions
from ...errors import (
    CoordError,
    InvalidTypeError,
    LeaseLostError,
    StoreClosedError,
    TaskNotFoundError,
)
from ...events import EventCounter
from ...models import Continuation, EnqueueResult, NewTask, PurgeResult, QueueStats, Task, TaskStatus
from ...monitor.histogram import LatencyRecorder
from ...notify import WorkNotifier
from ...validation import check_clock, check_int, check_lease_s, check_name, check_non_negative
from .deadletters import MemoryDeadLetterOps
from .locks import MemoryLockOps
from .membership import MemoryMembershipOps
from .monitor import MemoryMonitorOps
from .ratelimits import MemoryRateLimitOps

__all__ = ("MemoryStore",)

_ACTIVE = (TaskStatus.PENDING, TaskStatus.RUNNING)


class MemoryStore(
    QueueConveniences,
    MemoryLockOps,
    MemoryMembershipOps,
    MemoryMonitorOps,
    MemoryRateLimitOps,
    MemoryDeadLetterOps,
):
    """The storage contract in plain Python objects (see :class:`~asynccoord.contract.protocols.Store`).

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
        self.notifier = WorkNotifier()
        self._open = False
        self._ids = itertools.count(1)
        self._tasks: dict[int, Task] = {}
        self._by_key: dict[tuple[str, str], int] = {}
        self._processed: dict[tuple[str, str], float] = {}

    def __repr__(self) -> str:
        return f"<MemoryStore tasks={len(self._tasks)} {'open' if self._open else 'closed'}>"

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Mark the store open (data survives close/open of the same object)."""
        self._open = True

    async def close(self) -> None:
        """Mark the store closed."""
        self._open = False
        self._refill.cancel_all()

    def _check_open(self) -> None:
        if not self._open:
            raise StoreClosedError(f"{self!r} is not open: use 'async with' or await open()")

    @property
    def partitions(self) -> int:
        """Number of fixed partitions."""
        return self.config.partitions

    async def now(self) -> float:
        """The store clock."""
        self._check_open()
        return self._clock()

    # --- enqueue ----------------------------------------------------------------------

    async def enqueue_many(self, tasks: Sequence[NewTask]) -> list[EnqueueResult]:
        """Add tasks atomically; a repeated idempotency key returns the existing task."""
        prepared = prepare_tasks(tasks, self.config, self.partitions)
        self._check_open()
        for p in prepared:
            if p.limit_keys:
                check_unknown_dimensions(p.queue, p.limit_keys, list(self._declared(p.queue)))
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
            self._tasks[task.id] = task
            if p.limit_keys:
                self._rate.keys[task.id] = dict(p.limit_keys)
            if p.idempotency_key is not None:
                self._by_key[(p.queue, p.idempotency_key)] = task.id
            results.append(EnqueueResult(task=task, created=True))
        self.events.add(ev.DUPLICATE_ENQUEUE_SUPPRESSED, sum(1 for r in results if not r.created))
        notify_created(self.notifier, results, prepared)
        return results

    # --- claim and settle -----------------------------------------------------------

    @staticmethod
    def _due_at(task: Task) -> float:
        if task.status is TaskStatus.PENDING:
            return task.run_at
        assert task.lease_expires_at is not None
        return task.lease_expires_at

    async def claim(
        self,
        queue: str,
        *,
        node_id: str,
        limit: int = 1,
        lease_s: float = 30.0,
        partitions: Collection[int] | None = None,
        ordered: bool = False,
        min_due_age_s: float = 0.0,
    ) -> list[Task]:
        """Lease up to ``limit`` due tasks (semantics as in the SQLite store)."""
        queue, node_id, limit, lease, parts, ordered = check_claim_args(
            queue, node_id, limit, lease_s, partitions, ordered, self.partitions
        )
        due_age = check_non_negative("min_due_age_s", min_due_age_s)
        self._check_open()
        now = self._clock()
        dead = 0
        for task in list(self._tasks.values()):
            if (
                task.queue == queue
                and task.status is TaskStatus.RUNNING
                and self._due_at(task) <= now
                and task.attempts >= task.max_attempts
            ):
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

    async def claimable_partitions(
        self,
        queue: str,
        partitions: Collection[int] | None = None,
        *,
        ordered: bool = False,
        min_due_age_s: float = 0.0,
    ) -> set[int]:
        """The partitions where a claim with these arguments would find work now (semantics as in the SQLite store)."""
        parts, due_age = check_claimable_args(queue, partitions, ordered, min_due_age_s, self.partitions)
        self._check_open()
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
        if ordered:
            blocking = self._blocking(queue)
            for task in sorted(self._tasks.values(), key=lambda t: t.id):
                if task.queue == queue and task.status in blocking:
                    heads.setdefault(task.partition_key, task.id)  # a dead head (policy hold): no task of the key
        return [
            t
            for t in self._tasks.values()
            if t.queue == queue
            and t.status in _ACTIVE
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
        self._tasks[task.id] = updated
        return updated

    def _held(self, task: Task, now: float, *, count: bool = True) -> Task:
        """The stored task if the caller's lease on it still holds; else raise."""
        current = self._tasks.get(task.id)
        if current is None:
            raise TaskNotFoundError(task.id)
        reason = None
        if current.status is not TaskStatus.RUNNING:
            reason = f"task is {current.status.value} (version {current.version}, caller had version {task.version})"
        elif current.lease_token != task.lease_token:
            reason = f"task was reclaimed by {current.lease_owner!r} under another lease (version {current.version})"
        elif current.version != task.version:
            reason = f"version is {current.version}, caller had {task.version}"
        elif current.lease_expires_at is None or current.lease_expires_at <= now:
            reason = f"lease expired at {current.lease_expires_at} (store clock now {now:.3f})"
        if reason is not None:
            if count:
                self.events.add(ev.STALE_COMMIT_REJECTED)
            raise LeaseLostError(task.id, reason)
        return current

    async def complete_many(
        self,
        tasks: Sequence[Task],
        results: Sequence[Any] | None = None,
        *,
        fences: Sequence[tuple[str, int] | None] | None = None,
    ) -> list[Task | CoordError]:
        """Complete many tasks atomically, each with its own compare-and-set (and fence)."""
        checked = check_tasks(tasks)
        encoded = encode_results(results, len(checked), self.config)
        fenced = check_fences(fences, len(checked))
        self._check_open()
        return await self._complete(checked, encoded, fenced, announce=True)

    async def complete_and_claim_next(
        self,
        task: Task,
        result: Any = None,
        *,
        fence: tuple[str, int] | None = None,
        lease_s: float = 30.0,
    ) -> Continuation:
        """Complete ``task`` and lease its key's next task atomically (semantics as in the SQLite store)."""
        checked, encoded, fenced, lease, owner = check_continuation(task, result, fence, lease_s, self.config)
        self._check_open()
        outcome = (await self._complete(checked, encoded, fenced, announce=False))[0]
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
        head = min(
            (
                t
                for t in self._tasks.values()
                if t.queue == done.queue and t.partition_key == done.partition_key and t.status in blocking
            ),
            key=lambda t: t.id,
            default=None,
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

    async def _complete(
        self,
        checked: list[Task],
        encoded: list[str | None],
        fenced: list[tuple[str, int] | None] | None,
        *,
        announce: bool,
    ) -> list[Task | CoordError]:
        now = self._clock()
        out: list[Task | CoordError] = []
        for i, (task, result_json) in enumerate(zip(checked, encoded, strict=True)):
            fence = None if fenced is None else fenced[i]
            if fence is not None:
                record = await self.read_fence(fence[0])  # never suspends: atomic with this method
                if record is not None and fence[1] < record.fencing_token:
                    self.events.add(ev.FENCING_REJECTED)
                    out.append(fence_rejected_error(fence[0], fence[1], record.fencing_token))
                    continue
            try:
                current = self._held(task, now)
            except (LeaseLostError, TaskNotFoundError) as exc:
                out.append(exc)
                continue
            if fence is not None:
                await self.fence(*fence)  # the commit goes through: record its token
            done = self._put(current, now, status=TaskStatus.DONE, result=decode_json(result_json), last_error=None)
            if current.idempotency_key is not None:
                self._processed.setdefault((current.queue, current.idempotency_key), now)
            out.append(done)
        committed = sum(1 for d in out if isinstance(d, Task))
        self.events.add(ev.COMMITS, committed)
        if committed and announce:  # an ordered queue's next task per key may be claimable now
            notify_settled(self.notifier, [t for t, d in zip(checked, out, strict=True) if isinstance(d, Task)])
        return out

    async def fail(self, task: Task, error: str, *, retry: Any = None) -> Task:
        """Record a failed attempt (semantics as in the SQLite store)."""
        check_task(task)
        text = clean_error(error)
        policy = check_retry(retry, self.config)
        self._check_open()
        now = self._clock()
        current = self._held(task, now)
        if current.attempts >= current.max_attempts:
            self.events.add(ev.DEAD_LETTERED)
            return self._put(current, now, status=TaskStatus.DEAD, last_error=text)
        delay = policy.delay_s(max(current.attempts, 1))
        self.events.add(ev.RETRIES)
        return self._put(current, now, status=TaskStatus.PENDING, run_at=now + delay, last_error=text)

    async def release(self, task: Task, *, delay_s: float = 0.0) -> Task:
        """Hand back to pending (due after ``delay_s``), not counting the attempt."""
        check_task(task)
        delay = check_non_negative("delay_s", delay_s)
        self._check_open()
        now = self._clock()
        current = self._held(task, now)
        out = self._put(
            current, now, status=TaskStatus.PENDING, run_at=now + delay, attempts=max(current.attempts - 1, 0)
        )
        if delay == 0:
            self.notifier.notify(out.queue, 1, (out.partition,))
        return out

    async def unchecked_claim(
        self,
        queue: str,
        *,
        node_id: str,
        limit: int = 1,
        lease_s: float = 30.0,
        partitions: Collection[int] | None = None,
    ) -> list[Task]:
        """Naive claim: read due pending tasks, yield, then mark them running unconditionally.

        Two nodes can claim the same task. For benchmarks only.
        """
        queue, node_id, limit, lease, parts, _ = check_claim_args(
            queue, node_id, limit, lease_s, partitions, False, self.partitions
        )
        self._check_open()
        now = self._clock()
        allowed = None if parts is None else set(parts)
        ids = [
            t.id
            for t in sorted(self._tasks.values(), key=lambda t: (-t.priority, t.id))
            if t.queue == queue
            and t.status is TaskStatus.PENDING
            and t.run_at <= now
            and (allowed is None or t.partition in allowed)
        ][:limit]
        await asyncio.sleep(0)  # the gap between the read and the write that a naive queue has
        token = new_token()
        now = self._clock()
        out = []
        for task_id in ids:
            out.append(self._lease(self._tasks[task_id], now, node_id, token, lease))
        self.events.add(ev.CLAIMS, len(out))
        return out

    async def unchecked_complete(self, tasks: Sequence[Task], results: Sequence[Any] | None = None) -> int:
        """Mark tasks done without any compare-and-set (benchmarks only); return how many."""
        checked = check_tasks(tasks)
        encoded = encode_results(results, len(checked), self.config)
        self._check_open()
        now = self._clock()
        for t, r in zip(checked, encoded, strict=True):
            current = self._tasks.get(t.id)
            if current is not None:
                self._put(current, now, status=TaskStatus.DONE, result=decode_json(r), last_error=None)
        self.events.add(ev.COMMITS, len(checked))
        return len(checked)

    async def extend(self, task: Task, lease_s: float) -> float:
        """Renew the lease; an expired lease is never revived."""
        check_task(task)
        lease = check_lease_s("lease_s", lease_s)
        self._check_open()
        now = self._clock()
        current = self._held(task, now, count=False)  # a failed heartbeat is not a stale commit
        self._tasks[task.id] = replace(current, lease_expires_at=now + lease)
        return now + lease

    async def extend_many(self, tasks: Sequence[Task], lease_s: float) -> list[bool]:
        """Renew many leases; True where the lease was still held."""
        checked = check_tasks(tasks)
        lease = check_lease_s("lease_s", lease_s)
        self._check_open()
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
                self._tasks[t.id] = replace(current, lease_expires_at=now + lease)
            out.append(ok)
        return out

    # --- inspection and maintenance ---------------------------------------------------

    async def get(self, task_id: int) -> Task:
        """The task with that id. Raises TaskNotFoundError."""
        check_int("task_id", task_id, minimum=0, maximum=MAX_ID)
        self._check_open()
        task = self._tasks.get(task_id)
        if task is None:
            raise TaskNotFoundError(task_id)
        return task

    async def stats(self, queue: str | None = None) -> QueueStats:
        """Counts by status and the oldest due pending age."""
        if queue is not None:
            check_name("queue", queue)
        self._check_open()
        now = self._clock()
        counts = {s: 0 for s in TaskStatus}
        oldest: float | None = None
        for t in self._tasks.values():
            if queue is not None and t.queue != queue:
                continue
            counts[t.status] += 1
            if t.status is TaskStatus.PENDING and t.run_at <= now:
                oldest = t.run_at if oldest is None else min(oldest, t.run_at)
        return QueueStats(counts=counts, oldest_pending_age_s=None if oldest is None else max(0.0, now - oldest))

    async def is_drained(self, queue: str) -> bool:
        """True when ``queue`` has no pending and no running task."""
        check_name("queue", queue)
        self._check_open()
        unfinished = (TaskStatus.PENDING, TaskStatus.RUNNING)
        return not any(t.queue == queue and t.status in unfinished for t in self._tasks.values())

    async def requeue_dead(self, queue: str, task_ids: Sequence[int] | None = None) -> int:
        """Move dead tasks back to pending with attempts reset."""
        check_name("queue", queue)
        ids = check_task_ids(task_ids)
        wanted = None if ids is None else set(ids)
        self._check_open()
        now = self._clock()
        n = 0
        for t in list(self._tasks.values()):
            if t.queue == queue and t.status is TaskStatus.DEAD and (wanted is None or t.id in wanted):
                self._put(t, now, status=TaskStatus.PENDING, attempts=0, run_at=now)
                n += 1
        return n

    async def discard_dead(self, queue: str, task_ids: Sequence[int] | None = None) -> int:
        """Delete dead tasks of ``queue`` (all, or those ids); return how many."""
        check_name("queue", queue)
        ids = check_task_ids(task_ids)
        wanted = None if ids is None else set(ids)
        self._check_open()
        gone = [
            t
            for t in self._tasks.values()
            if t.queue == queue and t.status is TaskStatus.DEAD and (wanted is None or t.id in wanted)
        ]
        for t in gone:
            self._forget(t)
        notify_partitions(self.notifier, [(queue, t.partition) for t in gone])  # a held key may go on
        return len(gone)

    def _forget(self, task: Task) -> None:
        """Delete ``task`` and what refers to it."""
        del self._tasks[task.id]
        self._rate.keys.pop(task.id, None)
        if task.idempotency_key is not None and self._by_key.get((task.queue, task.idempotency_key)) == task.id:
            del self._by_key[(task.queue, task.idempotency_key)]

    async def is_processed(self, consumer: str, message_id: str) -> bool:
        """Whether a processed-id record exists."""
        check_name("consumer", consumer)
        check_name("message_id", message_id, allow_blank=True)
        self._check_open()
        return (consumer, message_id) in self._processed

    async def purge_processed(self, *, older_than_s: float | None = None, batch: int | None = None) -> PurgeResult:
        """Delete processed-id records older than the retention, in batches."""
        age = (
            self.config.processed.retention_s
            if older_than_s is None
            else check_non_negative("older_than_s", older_than_s)
        )
        size = self.config.processed.purge_batch if batch is None else check_purge_batch(batch)
        self._check_open()
        cutoff = self._clock() - age
        old = [k for k, at in self._processed.items() if at < cutoff]
        for k in old:
            del self._processed[k]
        return PurgeResult(deleted=len(old), batches=-(-len(old) // size))

    async def purge_finished(self, queue: str, *, older_than_s: float, batch: int = 1000) -> PurgeResult:
        """Delete done tasks of ``queue`` older than ``older_than_s``."""
        check_name("queue", queue)
        age = check_non_negative("older_than_s", older_than_s)
        size = check_purge_batch(batch)
        self._check_open()
        cutoff = self._clock() - age
        old = [
            t
            for t in self._tasks.values()
            if t.queue == queue and t.status is TaskStatus.DONE and t.updated_at < cutoff
        ]
        for t in old:
            self._forget(t)
        return PurgeResult(deleted=len(old), batches=-(-len(old) // size))
