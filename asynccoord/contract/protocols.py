"""The storage contract every backend implements.

A store is an async context manager that owns its connections. All time arithmetic
(run_at, lease expiry) is done against the store's own clock, so nodes on different
machines never compare their local clocks. Every method validates its arguments
before touching the database and raises the errors documented here; drivers' own
exceptions never leak (they become :class:`~asynccoord.errors.StoreError`).

The in-memory backend (:mod:`asynccoord.backends.memory.store`) is the reference
semantics; the contract test suite runs unchanged against every backend.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol, Self, runtime_checkable

from ..config import RetryPolicy, StoreConfig
from ..errors import LeaseLostError, TaskNotFoundError
from ..events import EventCounter
from ..models import Continuation, DeadLetterPolicy, EnqueueResult, NewTask, PurgeResult, QueueStats, Task
from ..monitor.histogram import LatencyRecorder
from .locks import FenceRecord, Lease, LockBusy, LockInfo
from .membership import Member, MemberBeat
from .monitor import MetricsFlush, MetricsView, QueueDepth
from .ratelimits import RateLimit

__all__ = (
    "DeadLetterStore",
    "LockStore",
    "MembershipStore",
    "MonitorStore",
    "QueueStore",
    "RateLimitStore",
    "Store",
)


@runtime_checkable
class QueueStore(Protocol):
    """The task queue over one database.

    Queue semantics (at-least-once delivery, exactly-once commit):

    * ``claim`` hands each due task to at most one live lease; a lease whose expiry
      passed (by the store clock) makes the task claimable again, with a new lease
      token and one more attempt. A task reclaimed after ``max_attempts`` is dead.
    * ``complete``, ``fail``, ``release`` and ``extend`` are compare-and-set on
      ``(id, lease_token, version)`` plus "lease not expired": a caller whose lease
      is gone gets :class:`~asynccoord.errors.LeaseLostError` and nothing is written.
    """

    config: StoreConfig
    events: EventCounter

    async def open(self) -> None:
        """Connect, apply schema migrations, and get ready. Idempotent."""
        ...

    async def close(self) -> None:
        """Finish queued writes and close. Idempotent."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc_info: object) -> None: ...

    async def now(self) -> float:
        """The store clock: seconds since the Unix epoch."""
        ...

    @property
    def partitions(self) -> int:
        """Number of fixed partitions keys are hashed into (fixed at creation)."""
        ...

    async def enqueue(
        self,
        queue: str,
        payload: Any = None,
        *,
        partition_key: str = "",
        idempotency_key: str | None = None,
        priority: int = 0,
        max_attempts: int | None = None,
        delay_s: float = 0.0,
        limit_keys: Mapping[str, str] | None = None,
    ) -> EnqueueResult:
        """Add one task (fields as in :class:`~asynccoord.models.NewTask`)."""
        ...

    async def enqueue_many(self, tasks: Sequence[NewTask]) -> list[EnqueueResult]:
        """Add tasks in one transaction; results in input order.

        A repeated idempotency key (already stored, or earlier in ``tasks``) yields
        the existing task with ``created=False`` and counts one
        ``duplicate_enqueue_suppressed`` event.
        """
        ...

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
        """Lease up to ``limit`` due tasks to ``node_id`` in one atomic statement.

        Args:
            queue: Queue name (1..255 characters, not only whitespace).
            node_id: Who claims (recorded as ``lease_owner``; ownership is by token), a name
                as ``queue``.
            limit: Most tasks to claim, 1..10000.
            lease_s: Lease length, seconds (0.01, ``validation.MIN_LEASE_S``, to one year).
            partitions: Only tasks in these partitions: a list, tuple, range or set of
                partition numbers (``0..partitions - 1``); None for all.
            ordered: Per-key ordering: a task is claimable only when no earlier task
                with the same partition key is pending or running.
            min_due_age_s: Only tasks that have been due for at least this many seconds
                (store clock; a pending task is due from its ``run_at``, an expired lease
                from its expiry), 0..one year. Work stealing uses it to take over tasks
                their partition's owner has left waiting. Default 0 (every due task).

        Returns:
            The claimed tasks, status ``running``, highest priority first then FIFO.
            Tasks whose idempotency key already has a processed-id record are
            marked done instead and counted as ``duplicate_delivery_suppressed``.

        Raises:
            InvalidTypeError, InvalidArgumentError: a bad argument, naming it (nothing is
                claimed): an empty or blank ``queue`` or ``node_id``, ``lease_s`` below 0.01,
                ``partitions`` that is no collection of ints (a dict, str or bytes) or names a
                partition out of range...
        """
        ...

    async def claimable_partitions(
        self,
        queue: str,
        partitions: Collection[int] | None = None,
        *,
        ordered: bool = False,
        min_due_age_s: float = 0.0,
    ) -> set[int]:
        """Which of ``partitions`` have work a :meth:`claim` with the same arguments would take now.

        A read: nothing is leased, written or locked (on SQLite it does not go through the
        single writer). The runtime's idle poll asks it once for all of a process's idle
        nodes and wakes only the owners of the partitions it names (see
        :mod:`asynccoord.node.idlepoll`), so idle nodes do not claim to find out.

        Args:
            queue: Queue name.
            partitions: The partitions to look at: a list, tuple, range or set of partition
                numbers; None for all.
            ordered: Count only keys' heads, as an ordered claim does.
            min_due_age_s: Only work due for at least this many seconds (store clock), as
                in :meth:`claim`. Default 0.

        Returns:
            The partition numbers (a subset of ``partitions``) holding a due pending task
            (a key's head when ``ordered``) or an expired lease (also one on its last
            attempt: the claim dead-letters it and frees its key). It may name a partition
            whose work another node claims meanwhile.

        Raises:
            InvalidTypeError, InvalidArgumentError: a bad argument, naming it, as in
                :meth:`claim` (``partitions`` a dict, say).
        """
        ...

    async def complete(self, task: Task, result: Any = None) -> Task:
        """Mark ``task`` done and write its processed-id record, in one transaction.

        Returns:
            The done task: ``task`` with what the commit wrote (status, version, result,
            lease fields cleared, ``updated_at``). The compare-and-set on id, lease token
            and version means its other fields are the stored row's as claimed. The SQLite
            and PostgreSQL stores do not read them back (one commit is a hot path): a
            field the caller changed in its own copy shows in the returned task, never in
            the store, which writes and records from its own row. ``get(task.id)`` reads
            the stored row. The same holds for :meth:`complete_many` and
            :meth:`complete_and_claim_next`.

        Raises:
            LeaseLostError: the lease is no longer the caller's; nothing written.
            TaskNotFoundError: no such task.
        """
        ...

    async def complete_and_claim_next(
        self,
        task: Task,
        result: Any = None,
        *,
        fence: tuple[str, int] | None = None,
        lease_s: float = 30.0,
    ) -> Continuation:
        """Commit-and-continue: complete ``task`` and lease its key's next task, in one transaction.

        The commit is exactly :meth:`complete` (compare-and-set, processed-id record,
        fence). When it goes through, the same transaction makes the queue keep per-key
        order (as an ordered :meth:`claim` does) and leases the next task of ``task``'s
        queue and partition key to ``task.lease_owner`` if that task is now the key's
        head (its earliest unfinished task), pending and due, as an ordered claim of
        that one key would: fresh lease token, attempts + 1, version + 1. A node working
        through one conversation in order thus needs no wake-up and no claim between
        two of its tasks. A next task whose idempotency key is already processed is
        settled as a duplicate instead (``duplicate_delivery_suppressed``) and none is
        returned. Partitions and ``min_due_age_s`` play no part: the key is the task's.

        Args:
            task: The task as returned by ``claim`` (or a previous continuation).
            result: Optional JSON result kept on the task.
            fence: ``(resource, fencing_token)`` checked and recorded as in :meth:`complete`.
            lease_s: Lease length of the next task, seconds (0.01, ``validation.MIN_LEASE_S``, to
                one year). Default 30.

        Returns:
            A :class:`~asynccoord.models.Continuation`: the done task and the next task
            (None when the key had no pending task due).

        Raises:
            LeaseLostError: the lease is no longer the caller's; nothing written or leased.
            TaskNotFoundError: no such task.
            FencingTokenRejectedError: ``fence`` carries an outdated token.
            InvalidTypeError, InvalidArgumentError: bad arguments (nothing written).
        """
        ...

    async def complete_many(
        self, tasks: Sequence[Task], results: Sequence[Any] | None = None
    ) -> list[Task | LeaseLostError | TaskNotFoundError]:
        """Complete many tasks in one transaction, each with its own compare-and-set.

        Returns:
            Per task, in order: the done task, or the error saying why nothing was
            written for it. One lost lease does not stop the others.
        """
        ...

    async def fail(self, task: Task, error: str, *, retry: RetryPolicy | None = None) -> Task:
        """Record a failed attempt: back to pending after the backoff, or dead.

        Raises:
            LeaseLostError: the lease is no longer the caller's; nothing written.
        """
        ...

    async def release(self, task: Task) -> Task:
        """Hand an unfinished task back to pending, due now, not counting the attempt.

        Raises:
            LeaseLostError: the lease is no longer the caller's; nothing written.
        """
        ...

    async def extend(self, task: Task, lease_s: float) -> float:
        """Renew the lease to ``lease_s`` seconds from now; return the new expiry.

        Raises:
            LeaseLostError: the lease expired or was taken; it is not revived.
            InvalidTypeError, InvalidArgumentError: a bad task, or ``lease_s`` not a number
                in 0.01 (``validation.MIN_LEASE_S``) .. one year (nothing written).
        """
        ...

    async def extend_many(self, tasks: Sequence[Task], lease_s: float) -> list[bool]:
        """Renew many leases in one statement; True where the lease was still held.

        Raises:
            InvalidTypeError, InvalidArgumentError: a bad task, or ``lease_s`` not a number
                in 0.01 (``validation.MIN_LEASE_S``) .. one year (nothing written).
        """
        ...

    async def get(self, task_id: int) -> Task:
        """The task with that id. Raises TaskNotFoundError."""
        ...

    async def stats(self, queue: str | None = None) -> QueueStats:
        """Counts by status and the oldest due pending age, for a queue or all."""
        ...

    async def is_drained(self, queue: str) -> bool:
        """True when ``queue`` has no pending and no running task (done and dead ones are finished).

        A probe of the unfinished tasks' indexes, not a count over the table as
        :meth:`stats` makes: cheap to poll. Raises InvalidArgumentError/InvalidTypeError
        for a bad ``queue``.
        """
        ...

    async def requeue_dead(self, queue: str, task_ids: Sequence[int] | None = None) -> int:
        """Move dead tasks back to pending with attempts reset; return how many.

        Args:
            queue: Queue name.
            task_ids: Only these dead tasks (ids of tasks that are not dead are skipped);
                None for every dead task of the queue.

        A requeued task keeps its place (its id) in its key's order: in an ordered queue
        it is the key's head again at once, ahead of the tasks that went on while it was
        dead, so if a later task of the key is running at that moment, both may run at
        the same time. Requeue while the key is idle when that matters.
        """
        ...

    async def discard_dead(self, queue: str, task_ids: Sequence[int] | None = None) -> int:
        """Delete dead tasks for good; return how many.

        Args:
            queue: Queue name.
            task_ids: Only these dead tasks (ids of tasks that are not dead are skipped);
                None for every dead task of the queue.

        A conversation held by its dead task (:class:`DeadLetterStore`, policy ``hold``)
        goes on from its next task. The idempotency key of a discarded task is free again.
        """
        ...

    async def is_processed(self, consumer: str, message_id: str) -> bool:
        """Whether a processed-id record exists for ``(consumer, message_id)``."""
        ...

    async def purge_processed(self, *, older_than_s: float | None = None, batch: int | None = None) -> PurgeResult:
        """Delete processed-id records older than the retention, in bounded batches."""
        ...


Store = QueueStore
"""The full storage contract (grows with locks and membership in their modules)."""


@runtime_checkable
class RateLimitStore(Protocol):
    """Rate limits per queue, enforced by the claim, across every process of the database.

    A queue declares limits, each on one dimension of its tasks (see
    :class:`~asynccoord.contract.ratelimits.RateLimit`); a task names its key for each
    dimension at enqueue (``NewTask.limit_keys``: a dimension the queue does not declare is
    refused with :class:`~asynccoord.errors.InvalidArgumentError`, nothing written). The
    claim, in its transaction and on the store clock, leases a task only when each bucket
    ``(queue, dimension, key)`` it names has a token (GCRA, see
    :mod:`asynccoord.contract.ratelimits`), and takes them; a task without one stays pending
    in its place, holds no lease and uses no attempt, and the claim goes on past it to
    other keys' tasks. A token is never handed back (a lease that expires, a task released or
    reported rate limited keeps its token spent): the bound holds across crashes. The
    store announces through its notifier, to its idle nodes, when held-back work may go
    (``claimable_partitions`` counts only work whose buckets have tokens).
    ``complete_and_claim_next`` never leases a task held by a declared limit (a claim does).
    A queue with no limits pays nothing: its claims run the statements they ran before.
    """

    async def set_rate_limits(self, queue: str, limits: Sequence[RateLimit]) -> None:
        """Declare ``queue``'s limits for every process of the database, replacing what it had.

        Buckets keep their state across a change (a new rate applies from the next claim);
        an empty list removes the queue's limits (its tasks' keys are then ignored).

        Raises:
            InvalidTypeError, InvalidArgumentError: a bad queue, or limits that are not a list
                of RateLimit with one per dimension (nothing written).
        """
        ...

    async def rate_limits(self, queue: str) -> list[RateLimit]:
        """``queue``'s declared limits, by dimension name (empty when none)."""
        ...

    async def report_rate_limited(
        self, task: Task, retry_after_s: float, *, dimension: str | None = None, key: str | None = None
    ) -> Task:
        """A provider refused ``task`` for rate: pause its bucket(s), hand it back without using an attempt.

        In one transaction: the bucket ``(task's queue, dimension, key)`` (``key`` None: the
        task's own key of ``dimension``), or with ``dimension`` None every bucket the task
        draws on, gets no token before ``retry_after_s`` from now (store clock), and then
        refills from empty; and the task goes back to pending, its attempt not counted, its
        place (its id) kept, due at once when a paused bucket holds it back and after
        ``retry_after_s`` otherwise (no declared bucket named). Counts ``provider_rate_limited``.

        Returns:
            The task as now stored (pending).

        Raises:
            LeaseLostError: the lease is no longer the caller's: the task is left alone
                (the pause still applies).
            InvalidTypeError, InvalidArgumentError: a bad task, a NaN, infinite or negative
                ``retry_after_s``, a ``key`` without ``dimension`` (nothing written).
        """
        ...


@runtime_checkable
class DeadLetterStore(Protocol):
    """What an ordered claim does with a conversation whose task went dead: a setting per queue.

    The policy (:class:`~asynccoord.models.DeadLetterPolicy`) is stored in the database, so
    every process of it follows the same one. ``skip`` (the default) lets the key's next
    task become its head: the conversation goes on without the dead task. ``hold`` keeps
    a key whose earliest unfinished task is dead (a task that is dead and has a smaller id
    than every pending or running task of the key) without a head: no ordered claim, and
    no ``complete_and_claim_next``, leases a later task of it until the dead task is
    requeued (``requeue_dead``: it runs first) or discarded (``discard_dead``). Unordered
    claims ignore the policy. A change applies at once to every key, dead tasks of the
    past included.
    """

    async def set_dead_letter_policy(self, queue: str, policy: DeadLetterPolicy | str) -> None:
        """Set ``queue``'s dead-letter policy for every process of the database.

        Raises:
            InvalidTypeError, InvalidArgumentError: a bad queue or policy (nothing written).
        """
        ...

    async def dead_letter_policy(self, queue: str) -> DeadLetterPolicy:
        """``queue``'s dead-letter policy (``skip`` unless set)."""
        ...


@runtime_checkable
class LockStore(Protocol):
    """Named locks and semaphores with fencing tokens, over one database.

    These are the storage primitives; waiting with backoff, the watchdog and
    ``async with`` live in :mod:`asynccoord.locks.lock` and :mod:`asynccoord.locks.watchdog`, the
    same for every backend. A lock is a semaphore of one permit. Semantics:

    * An acquisition succeeds when the name has fewer live leases than the
      ``permits`` it asks for (so the limit is judged per acquisition: use one
      permit count per name everywhere). It gets a new random owner token and the
      name's next fencing token: the per-name counter is kept while the lock is free,
      so tokens rise strictly across releases, expiries and processes.
    * Expiry is judged by the store clock inside the write, never by a caller's clock.
    * ``release_lock`` and ``renew_lock(s)`` are compare-and-set on the owner token
      plus "not expired": a lease that lapsed is never revived, even when nobody
      took the lock in between, and a stale holder changes nothing.
    * A cancelled ``try_acquire_lock`` never leaves a lease held with nobody to
      release it (the backend compensates a grant whose caller is gone).
    * ``fence`` / ``fenced_write`` keep, per resource, the highest fencing token seen
      and refuse lower ones: the check that stops a holder paused past its expiry
      (M. Kleppmann, "How to do distributed locking", 2016). Equal tokens are
      accepted: a token belongs to one acquisition, which may write many times. A
      resource must be fenced with the tokens of one lock name only.

    Every method validates its arguments before touching the database and raises
    :class:`~asynccoord.errors.InvalidArgumentError` or
    :class:`~asynccoord.errors.InvalidTypeError` naming the value, with nothing written.
    """

    config: StoreConfig
    events: EventCounter

    async def now(self) -> float:
        """The store clock: seconds since the Unix epoch."""
        ...

    async def try_acquire_lock(
        self, name: str, *, ttl_s: float, permits: int = 1, holder: str = ""
    ) -> Lease | LockBusy:
        """One non-blocking attempt to take ``name`` (a permit of it when ``permits`` > 1).

        Args:
            name: Lock name, 1..255 characters, not only whitespace.
            ttl_s: Lease length, seconds (0.01, ``validation.MIN_LEASE_S``, to one year), from the
                store clock at the grant.
            permits: Leases the name may have at once (>= 1). Default 1: a lock.
            holder: Who acquires, for inspection (0..255 characters).

        Returns:
            The new :class:`~asynccoord.contract.locks.Lease`, or a
            :class:`~asynccoord.contract.locks.LockBusy` when all permits are taken.
        """
        ...

    async def release_lock(self, lease: Lease) -> bool:
        """Delete the lease if it is still live; False (nothing changed) if it is not."""
        ...

    async def renew_lock(self, lease: Lease, ttl_s: float | None = None) -> Lease | None:
        """Extend a live lease to ``ttl_s`` (default ``lease.ttl_s``) from now; None if it lapsed."""
        ...

    async def renew_locks(self, leases: Sequence[Lease]) -> list[Lease | None]:
        """Renew many leases in one statement, each by its own ``ttl_s``; None where lapsed."""
        ...

    async def list_locks(self, name: str | None = None) -> list[LockInfo]:
        """Live leases (of ``name``, or all), by name then fencing token."""
        ...

    async def fence(self, resource: str, fencing_token: int) -> None:
        """Record ``fencing_token`` as seen by ``resource``; refuse a lower one.

        Raises:
            FencingTokenRejectedError: ``resource`` has seen a higher token; nothing written.
        """
        ...

    async def fenced_write(self, resource: str, fencing_token: int, data: Any) -> FenceRecord:
        """Like :meth:`fence`, and store ``data`` (JSON) in the same atomic step."""
        ...

    async def read_fence(self, resource: str) -> FenceRecord | None:
        """The resource's highest token and last fenced data; None if never fenced."""
        ...


@runtime_checkable
class MembershipStore(Protocol):
    """Node membership with heartbeats, over one database.

    These are the storage primitives; the heartbeat task, the view of live nodes and
    partition ownership live in :mod:`asynccoord.membership`, the same for every
    backend. Semantics:

    * A member is one row per node id holding its current *incarnation* (random per
      start of the node). It is live while its ``expires_at`` is after the store
      clock; liveness is judged by the store clock inside the statement, never by a
      caller's clock, so processes on different machines agree.
    * ``heartbeat`` upserts every beat and lists the live members in one atomic step:
      one call per interval covers every node of a process. ``started_at`` is kept
      while the incarnation is unchanged and reset by a new one.
    * ``leave`` is a compare-and-set on ``(node_id, incarnation)``: a restarted process
      reusing a node id is never removed by the leave of its previous life.

    Every method validates its arguments before touching the database and raises
    :class:`~asynccoord.errors.InvalidArgumentError` or
    :class:`~asynccoord.errors.InvalidTypeError` naming the value, with nothing written.
    """

    config: StoreConfig
    events: EventCounter

    async def now(self) -> float:
        """The store clock: seconds since the Unix epoch."""
        ...

    @property
    def partitions(self) -> int:
        """Number of fixed partitions keys are hashed into (what membership divides up)."""
        ...

    async def heartbeat(self, beats: Sequence[MemberBeat], *, ttl_s: float) -> list[Member]:
        """Record every beat, then return all live members by node id, in one transaction.

        Args:
            beats: One :class:`~asynccoord.contract.membership.MemberBeat` per local node
                (node ids distinct; may be empty, which only lists).
            ttl_s: Seconds (0.01, ``validation.MIN_LEASE_S``, to one year) the beaten members stay
                live (store clock).

        Returns:
            The live members, sorted by node id.
        """
        ...

    async def leave(self, node_id: str, incarnation: str) -> bool:
        """Delete the member row only if it holds ``incarnation``; True if it was live."""
        ...

    async def members(self) -> list[Member]:
        """The live members, sorted by node id."""
        ...


@runtime_checkable
class MonitorStore(Protocol):
    """Cluster-wide counters of the conflict monitor, over one database.

    These are the storage primitives; flushing on a timer, rules, alerts and their
    delivery live in :mod:`asynccoord.monitor.monitor`, the same for every backend. Semantics:

    * Each process flushes the *deltas* of its counters (``store.events``, optionally
      per node) and latency histograms (``store.latencies``) with ``flush_metrics``:
      one write that adds them to the current 1-second time bucket of the store clock
      and to the process' lifetime totals. Deltas add, so any number of processes
      flush concurrently and the cluster view is their sum.
    * ``read_metrics`` returns, in one snapshot at the store clock, lifetime totals
      per ``(process_id, scope, name)``, the same summed over sliding windows (time
      buckets that start after ``now - window_s``), merged latency histograms per
      window, the processes that flushed, and the firing alerts every live monitor
      stored (a monitor's alerts expire ``alert_ttl_s`` after its last flush).
    * The tables are bounded: each flush purges time buckets older than its
      ``retention_s`` and folds the totals of processes silent for a day into the
      process id ``"*retired*"``.
    * Time is the store clock inside the statement, never a caller's clock.

    Every method validates its arguments before touching the database and raises
    :class:`~asynccoord.errors.InvalidArgumentError` or
    :class:`~asynccoord.errors.InvalidTypeError` naming the value, with nothing written.
    """

    config: StoreConfig
    events: EventCounter
    latencies: LatencyRecorder

    async def now(self) -> float:
        """The store clock: seconds since the Unix epoch."""
        ...

    async def flush_metrics(self, flush: MetricsFlush) -> float:
        """Add one process' deltas (and replace its stored alerts) in one write; return the store clock."""
        ...

    async def read_metrics(self, windows_s: Sequence[float] = (10.0, 60.0)) -> MetricsView:
        """Every process' totals, windowed sums, latencies and alerts, in one snapshot."""
        ...

    async def queue_depths(self) -> list[QueueDepth]:
        """Tasks by queue and status, with each queue's oldest due pending age and expired leases (store clock)."""
        ...
