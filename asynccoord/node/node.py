"""A node: the fetch -> lock -> send -> commit pipeline over one shared queue.

A node repeatedly

1. **fetches**: claims a batch of due tasks from the partitions it owns (all of them
   when partitioning is off), up to its free ``max_in_flight`` slots; after a full batch
   it claims again as soon as a slot is free, after a short or empty one it waits for a
   wake-up (an in-process enqueue, a commit that unblocks one of its keys, a task it
   put back becoming due, the runtime's idle poll finding work in its partitions) or,
   when it polls by itself (a standalone node), its idle backoff, so idle polling does
   not grow with the work in flight (every claim, even an empty one, is a write); in a
   :class:`~asynccoord.node.runtime.Runtime` one read per process finds work for all its
   idle nodes (:mod:`asynccoord.node.idlepoll`), so it does not grow with the node count
   either;
2. **locks**: takes the lock (or a semaphore permit) that ``lock_key(task)`` names,
   e.g. ``"account:42"``, waiting up to ``lock_wait_s`` (a task whose lock stays busy
   goes back to the queue after a short delay, not counted as a failure);
3. **sends**: calls the user's ``send(task)`` under ``send_timeout_s``; the task's
   lease and the lock are renewed by the node's keeper every ``lease_s / 3`` while it
   runs (one batched statement for all of the node's leases, one for its locks), and
   if either is lost the send is cancelled at once (one ``CancelledError``, as
   ``asyncio.Task.cancel`` delivers it: the send's ``except``/``finally`` blocks may
   still await, e.g. to close a connection, for up to ``SEND_CLEANUP_S``; nothing
   cancels it again before that time is up, whatever else happens meanwhile: a
   timeout, a lost lease or lock, the node's cancellation);
4. **commits**: a compare-and-set on ``(id, lease_token, version)`` that also checks
   the lock's fencing token against the highest one the resource has seen, in the
   same transaction (a lock only: a semaphore's permits, ``lock_permits`` > 1, finish
   in any order, so their tokens do not fence the commit). A store that is busy or
   unreachable at that moment is tried again, with backoff, while the lease lasts
   (:data:`SETTLE_RETRY`): a message that went out is never sent again for want of a
   commit that could still land.

An exception from ``send`` (or its timeout) goes to the retry policy: backoff with
jitter, then the dead-letter state; a ``BaseException`` that is no ``Exception`` (some
libraries' timeouts) too, except ``KeyboardInterrupt`` and ``SystemExit``: the process is
ending, so the node stops as if cancelled and raises it once everything is handed back (see
:mod:`asynccoord._exits`); and a send cut because its lock (or permit) was lost, while the
task's own lease still holds. So does a ``CancelledError`` that the send raises
although the node did not cancel it (a library it awaits was cancelled by something
else, say): the task's ``last_error`` says "send raised CancelledError without being
cancelled", and the node goes on. Cancellation of the node hands its in-flight
tasks back to ``pending`` (not counted as failures), releases its locks and
re-raises. Each layer (partitioning, locks, version checks) can be switched off to
measure what it buys.

During ``send``, :func:`current_delivery` gives the node id, the lock lease (with its
fencing token) and the conversation's affinity context (a dict kept in a bounded LRU
while this node owns the conversation's partition).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import enum
import functools
import heapq
import inspect
import logging
import math
import random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import anyio

from .. import events as ev
from .._errtext import error_text
from .._exits import PROCESS_EXITS, ProcessExiting, carried_exit, carry, is_process_exit
from ..config import RetryPolicy
from ..contract.lockchecks import MAX_PERMITS, check_user_lock_name
from ..contract.locks import Lease
from ..contract.queue import encode_result
from ..errors import (
    UNRECOVERABLE_STORE_ERRORS,
    CoordError,
    InvalidArgumentError,
    InvalidTypeError,
    LeaseLostError,
    LockError,
    LockLostError,
    LockTimeoutError,
    StoreBusyError,
    StoreConnectionError,
    StoreError,
)
from ..locks.lock import Semaphore
from ..locks.pool import LockPool
from ..membership import Membership
from ..models import Task, TaskStatus
from ..monitor.histogram import CLAIM_MS, COMMIT_MS, ENQUEUE_TO_COMMIT_MS, SEND_MS
from ..notify import WakeUp, WorkNotifier
from ..validation import (
    check_bool,
    check_int,
    check_interval_s,
    check_lease_s,
    check_lock_store,
    check_name,
    check_positive,
    check_queue_store,
    check_send,
    is_async_callable,
)

__all__ = ("Delivery", "Node", "NodeConfig", "NodeState", "NodeStatus", "SendFn", "current_delivery")

log = logging.getLogger(__name__)

SEND_CLEANUP_S = 0.25
"""Seconds a cancelled send's own cleanup (its ``except``/``finally`` awaits) may take
before it is cancelled again; shutdown and lease-loss bounds include it.

The node cancels a send once, for whichever reason comes first (its timeout, a lost
lease or lock, the node's cancellation); the others that come during this time do not
cancel it again. A send still running when the time is up (one that swallows the
``CancelledError``) is cancelled once more, and the node goes on without it."""

SETTLE_WAIT_S = 5.0
"""Seconds a cancelled node still waits for the commit (or failure) of a send that had
returned: the message went out, and a task handed back instead would be sent again."""

HAND_BACK_WAIT_S = 5.0
"""Seconds a node waits for the hand-back of a task it will not send (also when cancelled
meanwhile), so that whoever claims next finds it pending instead of leased to a stopped node."""

SETTLE_RETRY = RetryPolicy(base_s=0.01, factor=2.0, cap_s=0.5, jitter=0.5)
"""Backoff (from 10 ms, doubling, at most 0.5 s, +-50 % jitter) between tries of a commit
(or a failure record) that the store could not take (busy, connection lost): it is tried
again while the task's lease lasts, since a task whose commit is dropped would be sent
again once its lease lapsed."""

_TRANSIENT_STORE_ERRORS = (StoreBusyError, StoreConnectionError)
"""Store errors after which nothing was written and a later try may succeed."""

SendFn = Callable[[Task], Awaitable[Any]]
"""The user's send: ``async def send(task: Task) -> Any`` (the result is stored, JSON)."""
LockKeyFn = Callable[[Task], "str | None"]


def failure_of(exc: BaseException) -> BaseException | None:
    """The error a task group that ended with ``exc`` failed with, or None if it was only cancelled.

    An ``ExceptionGroup`` whose errors are all asynccoord errors stands for its first one
    (e.g. the :class:`~asynccoord.errors.StoreClosedError` every node hit at once), so
    callers see one typed error; any other group stands for itself. Cancellations,
    ``KeyboardInterrupt`` and ``SystemExit`` are not failures.
    """
    if isinstance(exc, BaseExceptionGroup):
        leaves = _leaves(exc)
        errors = [e for e in leaves if isinstance(e, Exception)]
        if not errors:
            return None
        cancelled = anyio.get_cancelled_exc_class()
        others = [e for e in leaves if not isinstance(e, Exception | cancelled)]
        if not others and all(isinstance(e, CoordError) for e in errors):
            return errors[0]
        return exc
    return exc if isinstance(exc, Exception) else None


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


def _observe(store: Any, name: str, started: float) -> None:
    """Record the latency since ``started`` (``time.perf_counter()``) in ``store.latencies``, if any."""
    recorder = getattr(store, "latencies", None)
    if recorder is not None:
        recorder.observe(name, (time.perf_counter() - started) * 1000.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeConfig:
    """How a node fetches, locks, sends and commits.

    Args:
        queue: Queue to drain. Default ``"default"``.
        lease_s: Task lease length, seconds, 0.01 (``validation.MIN_LEASE_S``) to one year
            (renewed every ``lease_s / 3`` while a send runs when ``renew_leases``). Default 30.
        claim_batch: Most tasks per claim. Default 32.
        max_in_flight: Most sends at once on this node. Default 32.
        send_timeout_s: Longest a send may take before it counts as failed. Default 30.
        ordered: Per-key (per-conversation) ordering. Default True.
        idle_min_s / idle_max_s: Backoff after a claim that came back short, seconds,
            growing from min to max with full jitter with every empty claim and reset
            by a full one; an in-process enqueue or a commit that unblocks one of the
            node's keys wakes it at once (also one that arrives while it claims).
            Each at least 0.001 (``validation.MIN_INTERVAL_S``), and max >= min.
            Defaults 0.05 and 1.0 (a standalone idle node costs about 2 claims/s at
            rest). In a Runtime the nodes do not back off by themselves: the runtime's
            one idle poll runs on this backoff for all of them (see
            :mod:`asynccoord.node.idlepoll`), about 2 reads/s per process at rest.
        idle_fallback_s: A node that does not poll by itself (``Node(idle_poll=False)``,
            as a Runtime makes them) still claims after waiting 0.5 to 1 times this long
            without a wake-up: a safety net, should the idle poll fail. At least 0.001.
            Default 30.
        lock_ttl_s: Lock lease length, seconds, 0.01 (``validation.MIN_LEASE_S``) to one
            year (renewed with the task lease). Default 10.
        lock_permits: Permits per lock name: 1 for a lock, N (at most 2**31 - 1, the
            semaphore's bound ``MAX_PERMITS``) for a semaphore. Default 1.
        lock_wait_s: Longest wait for a busy lock before the task is handed back. Default 5.
        busy_requeue_s: Delay of a task handed back because its lock stayed busy, at least
            0.001 (``validation.MIN_INTERVAL_S``: the task would come straight back). Default 0.05.
        partitioning / locks / version_checks: The three layers; switch one off only to
            measure it. With ``version_checks`` off the node claims and commits without
            compare-and-set (a read, then unconditional writes), as a naive queue does.
        renew_leases: Keep task leases (and locks) alive while sends run. Default True.
        work_stealing: An idle node also claims tasks of partitions it does not own that
            have waited ``steal_after_s`` (their owner is overloaded or dead). Default False.
        steal_after_s: See ``work_stealing``. Default 5.
        claim_next: Commit-and-continue, for ordered queues with version checks: each
            commit also leases the key's next task to this node in the same transaction
            (``store.complete_and_claim_next``), and the node sends it next in the same
            slot, with no wake-up and no claim between two tasks of a conversation. Only
            while the node is claiming and still owns the key's partition. Default True.
        claim_next_max: Most tasks one slot takes in a row by ``claim_next`` while every
            other slot of the node is busy: past it, a commit made with no slot free is a
            plain one and the slot goes back to claiming, so a busy conversation cannot
            keep a slot from the others' work for ever. While a slot is free, the others'
            work has one, and the conversation goes on. Default 64.
        affinity_cache_size: Conversations whose context dict a node keeps. Default 1024.
        retry: Backoff policy for failed sends; None uses the store's. Default None.
            Its delays only: a task's number of attempts is fixed at enqueue
            (``NewTask.max_attempts``, else the store's ``StoreConfig.retry``).
    """

    queue: str = "default"
    lease_s: float = 30.0
    claim_batch: int = 32
    max_in_flight: int = 32
    send_timeout_s: float = 30.0
    ordered: bool = True
    idle_min_s: float = 0.05
    idle_max_s: float = 1.0
    idle_fallback_s: float = 30.0
    lock_ttl_s: float = 10.0
    lock_permits: int = 1
    lock_wait_s: float = 5.0
    busy_requeue_s: float = 0.05
    partitioning: bool = True
    locks: bool = True
    version_checks: bool = True
    renew_leases: bool = True
    work_stealing: bool = False
    steal_after_s: float = 5.0
    claim_next: bool = True
    claim_next_max: int = 64
    affinity_cache_size: int = 1024
    retry: RetryPolicy | None = None

    def __post_init__(self) -> None:
        check_name("queue", self.queue)
        check_lease_s("lease_s", self.lease_s)
        check_int("claim_batch", self.claim_batch, minimum=1, maximum=10_000)
        check_int("max_in_flight", self.max_in_flight, minimum=1)
        check_positive("send_timeout_s", self.send_timeout_s)
        check_interval_s("idle_min_s", self.idle_min_s)
        check_interval_s("idle_max_s", self.idle_max_s)
        if self.idle_max_s < self.idle_min_s:
            raise InvalidArgumentError(f"idle_max_s ({self.idle_max_s!r}) must be >= idle_min_s ({self.idle_min_s!r})")
        check_interval_s("idle_fallback_s", self.idle_fallback_s)
        check_lease_s("lock_ttl_s", self.lock_ttl_s)
        check_int("lock_permits", self.lock_permits, minimum=1, maximum=MAX_PERMITS)
        check_positive("lock_wait_s", self.lock_wait_s)
        check_interval_s("busy_requeue_s", self.busy_requeue_s)
        for name in (
            "partitioning",
            "locks",
            "version_checks",
            "renew_leases",
            "work_stealing",
            "ordered",
            "claim_next",
        ):
            check_bool(name, getattr(self, name))
        check_positive("steal_after_s", self.steal_after_s)
        check_int("affinity_cache_size", self.affinity_cache_size, minimum=0)
        check_int("claim_next_max", self.claim_next_max, minimum=1)
        if self.retry is not None and not isinstance(self.retry, RetryPolicy):
            raise InvalidTypeError(f"retry must be a RetryPolicy or None, got {type(self.retry).__name__}")


class NodeStatus(enum.StrEnum):
    """Where a node is in its life."""

    STARTING = "starting"
    RUNNING = "running"
    DRAINING = "draining"
    STOPPED = "stopped"
    FAILED = "failed"
    """:meth:`Node.run` ended with an error (e.g. the store was closed under it)."""


@dataclass(slots=True)
class NodeState:
    """Live counters of one node (a snapshot is taken by :meth:`Node.state`)."""

    node_id: str
    status: NodeStatus = NodeStatus.STARTING
    claimed: int = 0
    """Tasks leased to the node: by its claims, and by its commits (see ``continued``)."""
    continued: int = 0
    """Of ``claimed``: tasks leased by the node's commits (``NodeConfig.claim_next``)."""
    sent: int = 0
    committed: int = 0
    failed: int = 0
    handed_back: int = 0
    in_flight: int = 0
    conflicts: int = 0
    owned_partitions: int = 0


@dataclass(frozen=True, slots=True)
class Delivery:
    """What a running send can know about its delivery (see :func:`current_delivery`).

    Attributes:
        node_id: The node sending.
        task: The task being sent.
        lock: The lock lease held for it (``lock.fencing_token`` for fenced writes), or None.
        context: The conversation's affinity context: a dict this node keeps for the
            task's partition key while it owns the key's partition.
    """

    node_id: str
    task: Task
    lock: Lease | None
    context: dict[str, Any]


_DELIVERY: contextvars.ContextVar[Delivery] = contextvars.ContextVar("asynccoord_delivery")


def current_delivery() -> Delivery:
    """The delivery of the send running in this task.

    Raises:
        LookupError: called outside a send run by a node.
    """
    return _DELIVERY.get()


@dataclass(slots=True, eq=False)
class _InFlight:
    task: Task
    lease_deadline: float  # local monotonic: stop before the store could hand the task on
    lock: Lease | None = None
    lost: str | None = None
    started: bool = False  # the user's send was called
    returned: bool = False  # ...and returned, raised, timed out or was cut by a lost lease
    settling: bool = False  # the send is over: commit/fail/hand-back owns the lease now
    timed_out: bool = False  # the send was cut at send_timeout_s
    cut_until: float | None = None  # loop time: the node cancelled the send (once, see _cut), its cleanup ends then
    cancel_pending: bool = False  # the node was cancelled after the send returned: settle it, then go on cancelling
    settled: bool = False  # committed or failed: nothing to hand back
    lock_lost: bool = False  # ``lost`` is the lock's (or permit's), the task's own lease still held
    send: asyncio.Task[Any] | None = None  # the user's send, in a task of its own, while it runs
    over: asyncio.Future[None] | None = None  # done when the send is, or when its cleanup time ran out
    next: _InFlight | None = None  # the key's next task, leased by this task's commit (claim_next)
    chain: int = 0  # tasks this slot took by claim_next before this one

    def lost_already(self) -> bool:
        """Whether the lease or lock is lost (a method: a check the type checker does not narrow across awaits)."""
        return self.lost is not None


class Node:
    """One worker draining a queue (see the module docstring for the pipeline).

    Args:
        store: A store implementing the queue and lock contracts (``SQLiteStore``...).
        send: ``async def send(task) -> result`` (or any callable returning an awaitable).
            A plain function is accepted and its return value used, but it runs on the
            event loop's thread: it stalls every node of the process while it runs, and
            neither ``send_timeout_s`` nor a lost lease or lock can cut it short. An
            exception it raises is a failed attempt (the retry policy decides), and so is a
            ``CancelledError`` it raises although the node did not cancel it. An async
            generator function (an ``async def`` with ``yield``: calling it sends nothing)
            is refused.
        node_id: Unique among live nodes, 1..255 characters.
        config: :class:`NodeConfig`. Default NodeConfig().
        lock_key: Maps a task to the name of the lock it needs, or None for no lock
            (a plain function: an ``async def`` one is refused). Default None (no locks).
        membership: Shared :class:`~asynccoord.membership.Membership` of the process;
            needed for partitioning (without it the node claims from every partition).
            Give it the node's queue (``Membership(store, queue=...)``) when other queues
            are drained from the same store: without one it counts their nodes too, and
            they own partitions of this queue that they never claim. One made for another
            queue is refused.
        lock_pool: Shared :class:`~asynccoord.locks.pool.LockPool` of the process, so
            local tasks needing one lock take turns on one lease. Default: the node's own.
        lock_store: Where the locks live, if not in ``store``: any lock store (e.g. a
            :class:`~asynccoord.backends.redis.RedisLockStore` beside a
            PostgreSQL queue). Commits are still fenced by ``store``. Default None
            (``store``).
        idle_poll: Whether the idle node polls by itself (claims on its backoff,
            ``idle_min_s`` .. ``idle_max_s``). A :class:`~asynccoord.node.runtime.Runtime`
            passes False and wakes its idle nodes with one process-wide poll
            (:class:`~asynccoord.node.idlepoll.IdlePoller`); such a node claims by itself
            only every ``idle_fallback_s``. Default True.

    Raises:
        InvalidTypeError, InvalidArgumentError: bad arguments.
    """

    def __init__(
        self,
        store: Any,
        send: SendFn,
        *,
        node_id: str,
        config: NodeConfig | None = None,
        lock_key: LockKeyFn | None = None,
        membership: Membership | None = None,
        lock_pool: LockPool | None = None,
        lock_store: Any = None,
        idle_poll: bool = True,
    ) -> None:
        check_queue_store("store", store)
        check_send(send)
        if lock_key is not None and not callable(lock_key):
            raise InvalidTypeError(f"lock_key must be callable or None, got {type(lock_key).__name__}")
        if lock_key is not None and is_async_callable(lock_key):
            raise InvalidTypeError(
                f"lock_key must be a plain function returning a lock name (str) or None, got the async {lock_key!r}"
            )
        if config is not None and not isinstance(config, NodeConfig):
            raise InvalidTypeError(f"config must be a NodeConfig, got {type(config).__name__}")
        if membership is not None and not isinstance(membership, Membership):
            raise InvalidTypeError(f"membership must be a Membership or None, got {membership!r}")
        if lock_pool is not None and not isinstance(lock_pool, LockPool):
            raise InvalidTypeError(f"lock_pool must be a LockPool or None, got {lock_pool!r}")
        if lock_store is not None:
            check_lock_store("lock_store", lock_store)
        queue = (config or NodeConfig()).queue
        if membership is not None and membership.queue is not None and membership.queue != queue:
            raise InvalidArgumentError(
                f"membership shares the partitions of queue {membership.queue!r}, but this node drains {queue!r}: "
                "its partitions would be counted among the other queue's nodes"
            )
        self.store = store
        self.lock_store = store if lock_store is None else lock_store
        self.send = send
        self.node_id = check_name("node_id", node_id)
        self.config = config or NodeConfig()
        self.lock_key = lock_key
        self.membership = membership
        self.lock_pool = lock_pool
        self._own_pool = False  # the pool was made by this node (no runtime's): the node closes it
        self.idle_poll = check_bool("idle_poll", idle_poll)
        self._state = NodeState(node_id=self.node_id)
        self._in_flight: dict[int, _InFlight] = {}
        # Slots (handle tasks) settling a send that returned: a cancellation of the node waits
        # for them instead of cancelling them (see _finish), then they stop (_stop_after).
        self._settling: set[asyncio.Task[Any]] = set()
        self._stop_after: set[asyncio.Task[Any]] = set()
        self._slots = asyncio.Semaphore(self.config.max_in_flight)
        self._claiming = True
        self._drained = asyncio.Event()
        self._drained.set()
        self._affinity: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._owned: frozenset[int] | None = None
        self._owned_sorted: list[int] = []
        self._view_version = -1
        self._wake: WakeUp | None = None
        self._due_timer: asyncio.TimerHandle | None = None  # wakes the node when a task it delayed is due
        self._due_when = math.inf  # the loop time it fires at
        self._due_times: list[float] = []  # heap: loop times at which tasks this node put back fall due
        self._rng = random.Random()
        self._releases: set[asyncio.Task[None]] = set()  # hand-backs running (see _hand_back_shielded)
        self._checked_send: Any = None  # the send _send_is_async describes (see _send_coroutine)
        self._send_is_async = False
        self._exit: ProcessExiting | None = None  # a cut send's cleanup raised KeyboardInterrupt or SystemExit
        self._scope: anyio.CancelScope | None = None  # the pipeline's, while it runs

    def __repr__(self) -> str:
        s = self._state
        return f"<Node {self.node_id!r} {s.status.value} in_flight={len(self._in_flight)} committed={s.committed}>"

    # --- public surface -----------------------------------------------------------------

    def state(self) -> NodeState:
        """A snapshot of the node's counters."""
        s = self._state
        return NodeState(
            node_id=s.node_id,
            status=s.status,
            claimed=s.claimed,
            continued=s.continued,
            sent=s.sent,
            committed=s.committed,
            failed=s.failed,
            handed_back=s.handed_back,
            in_flight=len(self._in_flight),
            conflicts=s.conflicts,
            owned_partitions=s.owned_partitions,
        )

    def stop_claiming(self) -> None:
        """Stop fetching new work at once; sends in flight go on (graceful drain)."""
        self._claiming = False
        if self._state.status in (NodeStatus.STARTING, NodeStatus.RUNNING):  # a stopped node stays so
            self._state.status = NodeStatus.DRAINING
        if self._wake is not None:
            self._wake.close()  # ends its idle wait

    def _stop_requested(self) -> bool:
        # A call, not the attribute: a type checker narrows an attribute across awaits.
        return not self._claiming

    @property
    def claiming(self) -> bool:
        """False once :meth:`stop_claiming` was called."""
        return self._claiming

    @property
    def in_flight(self) -> int:
        """Sends running now."""
        return len(self._in_flight)

    @property
    def idle(self) -> bool:
        """Waiting for a wake-up after a claim that came back short or empty (what the idle poll looks for)."""
        return self._wake is not None and self._wake.waiting

    def claim_partitions(self) -> list[int] | None:
        """The partitions the node's next claim looks at (sorted; None: all), by the membership view now."""
        partitions = self._partitions()
        wake = self._wake
        if wake is not None and wake.waiting and partitions is not None:
            wake.partitions = self._owned  # a view change while it waits: match notifications to the new set
        return partitions

    def wake(self) -> bool:
        """End the node's idle wait now, so it claims; True if it was waiting (else nothing happens)."""
        wake = self._wake
        return wake is not None and wake.waiting and wake.set()

    async def wait_drained(self) -> None:
        """Wait until no send is in flight (after :meth:`stop_claiming`)."""
        await self._drained.wait()

    async def run(self) -> None:
        """Run the pipeline until :meth:`stop_claiming` and drained, or until cancelled.

        On cancellation every in-flight task is handed back to pending (not counted
        as a failure), its lock released, and the cancellation re-raised. A node without
        a shared ``lock_pool`` releases the leases of its own pool before returning.

        Raises:
            StoreClosedError, StoreLoopError: the store (or the lock store) was closed under
                the node, or serves another event loop:
                its in-flight tasks are handed back if the store still allows it, the
                status becomes ``failed``, and the error is raised (never retried).
            Exception: any other error that ended the pipeline (status ``failed``).
            KeyboardInterrupt, SystemExit: ``send`` (or ``lock_key``) raised it: the process
                is ending. The node stops as if cancelled (every in-flight task handed back,
                that send's task too, not counted as a failure; status ``stopped``), as does
                every :class:`~asynccoord.node.runtime.Runtime` of the event loop, then it raises it.
                (A runtime's exit does not reach standalone nodes: cancel those yourself.)
        """
        try:
            await self._run_carrying_exits()
        except ProcessExiting as carried:
            from .runtime import stop_runtimes  # the runtime module imports this one

            await stop_runtimes(carried)  # the process is ending: the runtimes beside this node too
            carried.reraise()

    async def _run_carrying_exits(self) -> None:
        """:meth:`run`, for a caller that runs the node in an asyncio task of its own (a Runtime).

        Raises:
            ProcessExiting: where :meth:`run` raises a ``KeyboardInterrupt`` or
                ``SystemExit`` (see :mod:`asynccoord._exits`); anything else as :meth:`run`.
        """
        self._state.status = NodeStatus.RUNNING
        failure: BaseException | None = None
        # Every change of the view, as it happens: a conversation whose partition moves away and
        # back between two claims still loses its affinity context here (see _partitions).
        unlisten = None
        if self.config.partitioning and self.membership is not None:
            unlisten = self.membership.add_listener(self._view_changed)
        try:
            async with anyio.create_task_group() as tg:
                self._scope = tg.cancel_scope
                if self.config.renew_leases:
                    tg.start_soon(self._keeper, name=f"{self.node_id}-keeper")
                await self._fetch_loop(tg)
                await self.wait_drained()
                tg.cancel_scope.cancel()
            if self._exit is not None:  # a cut send's cleanup raised it: the pipeline was cancelled for it
                raise self._exit
        except BaseException as exc:
            carried = carried_exit(exc) or self._exit
            if carried is not None:  # the process is ending: handed back as on cancellation, no failure
                raise carried from None
            failure = failure_of(exc)
            if failure is not None:
                log.error("asynccoord.node.failed node=%s error=%s", self.node_id, error_text(failure))
            if failure is None or failure is exc:
                raise
        finally:
            if unlisten is not None:
                unlisten()
            if self._own_pool and self.lock_pool is not None:  # its leases go back before run() returns
                with anyio.CancelScope(shield=True), anyio.move_on_after(self.config.lock_ttl_s):
                    await self.lock_pool.aclose()
            self._state.status = NodeStatus.STOPPED if failure is None else NodeStatus.FAILED
        if failure is not None:
            raise failure  # the one error inside the task group's ExceptionGroup

    # --- fetch ------------------------------------------------------------------------

    def _partitions(self) -> list[int] | None:
        if not self.config.partitioning or self.membership is None:
            return None
        view = self.membership.view
        if view.version != self._view_version:
            owned = self.membership.owned_partitions(self.node_id)
            if self._owned is not None:
                moved = len(owned ^ self._owned)
                if moved:
                    self.store.events.add(ev.PARTITION_HANDOFF, moved)
                    self._drop_affinity(owned)
            self._owned = owned
            self._owned_sorted = sorted(owned)
            self._view_version = view.version
            self._state.owned_partitions = len(owned)
        return self._owned_sorted

    def _view_changed(self, view: object) -> None:
        """Membership listener: take the new view's ownership now, not at the next claim.

        A waiting node's wake-up is matched to the partitions it owns now (it kept those
        of its last claim, so work announced in a partition it had just taken over woke
        nobody and waited for the idle poll), and a node that gained partitions claims at
        once: work may wait there that was announced to their former owner.
        """
        before = self._owned
        self.claim_partitions()
        if before is not None and self._owned is not None and not self._owned <= before:
            self.wake()

    def _drop_affinity(self, owned: frozenset[int]) -> None:
        from ..partition import partition_of

        partitions = self.store.partitions
        for key in [k for k in self._affinity if partition_of(k, partitions) not in owned]:
            del self._affinity[key]

    async def _fetch_loop(self, tg: anyio.abc.TaskGroup) -> None:
        if not self._claiming:
            return
        # The store's notifier wakes the node on new work; a store without one gets a
        # private notifier that only the node's own timers (and stop_claiming) use.
        notifier = getattr(self.store, "notifier", None) or WorkNotifier()
        wake = self._wake = notifier.subscribe(self.config.queue)
        try:
            await self._fetch(tg, wake)
        finally:
            wake.close()
            if self._due_timer is not None:
                self._due_timer.cancel()

    async def _fetch(self, tg: anyio.abc.TaskGroup, wake: WakeUp) -> None:
        """Claim while slots are free: again at once after a full batch, else after a wake-up or the backoff.

        ``wake`` is armed just before each claim, so a notification that arrives while
        the claim runs is kept and the wait after a short claim returns at once: a
        claim that came back short never waits on work announced meanwhile.
        """
        cfg = self.config
        idle_s = cfg.idle_min_s
        while self._claiming:
            await self._slots.acquire()
            free = 1
            while free < cfg.claim_batch and not self._slots.locked():
                await self._slots.acquire()
                free += 1
            if not self.claiming:  # stop_claiming() came while every slot was busy: claim nothing more
                for _ in range(free):
                    self._slots.release()
                break
            try:
                partitions = self._partitions()
                wake.arm(self._owned if partitions is not None else None)
                claim_started = time.perf_counter()
                tasks = await self._claim(free, partitions)
                _observe(self.store, CLAIM_MS, claim_started)
            except UNRECOVERABLE_STORE_ERRORS:
                for _ in range(free):
                    self._slots.release()
                raise  # closed stores do not reopen by themselves (nor change loops): fail the node
            except StoreError as exc:
                log.warning("asynccoord.node.claim_failed node=%s error=%s", self.node_id, exc)
                tasks = []
            except BaseException:
                for _ in range(free):
                    self._slots.release()
                raise
            for _ in range(free - len(tasks)):
                self._slots.release()
            if tasks and self._stop_requested():  # stop_claiming() came while the claim was at the store
                self._state.claimed += len(tasks)
                with anyio.CancelScope(shield=True):  # hand them back unsent, not failed
                    for task in tasks:
                        await self._hand_back(task, delay_s=0.0)
                for _ in range(len(tasks)):
                    self._slots.release()
                break
            if tasks:
                self._state.claimed += len(tasks)
                deadline = self._deadline(time.monotonic())
                flights = [_InFlight(task=task, lease_deadline=deadline) for task in tasks]
                for flight in flights:
                    self._in_flight[flight.task.id] = flight
                self._drained.clear()
                tg.start_soon(self._handle_batch, flights, name=f"{self.node_id}-batch-{tasks[0].id}")
                if len(tasks) == free:  # a full batch: there may be more, claim again at once
                    idle_s = cfg.idle_min_s
                    wake.disarm()  # the next claim starts as soon as a slot frees anyway
                    continue
            # Short or empty: wait for a wake-up (or one that came during the claim) or
            # the backoff, with full jitter (AWS Architecture Blog, "Exponential Backoff
            # And Jitter", 2015); only empty claims lengthen it. Without a poll of its
            # own, the runtime's idle poll wakes the node, and the wait is a safety net.
            if self.idle_poll:
                delay = self._rng.uniform(cfg.idle_min_s, idle_s)
                if not tasks:
                    idle_s = min(cfg.idle_max_s, idle_s * 2)
            else:
                delay = self._rng.uniform(0.5, 1.0) * cfg.idle_fallback_s
            await wake.wait(delay)

    async def _claim(self, limit: int, partitions: list[int] | None) -> list[Task]:
        cfg = self.config
        membership = self.membership
        if membership is not None and not membership.healthy:
            error = membership.last_error
            if isinstance(error, UNRECOVERABLE_STORE_ERRORS):  # heartbeats will never resume
                raise type(error)(f"node {self.node_id!r} cannot claim: {error}") from error
            return []  # others may think we are dead: claim nothing until heartbeats resume
        if not cfg.version_checks:
            tasks: list[Task] = await self.store.unchecked_claim(
                cfg.queue, node_id=self.node_id, limit=limit, lease_s=cfg.lease_s, partitions=partitions
            )
            return tasks
        tasks = await self.store.claim(
            cfg.queue,
            node_id=self.node_id,
            limit=limit,
            lease_s=cfg.lease_s,
            partitions=partitions,
            ordered=cfg.ordered,
        )
        if not tasks and cfg.work_stealing and partitions is not None:
            tasks = await self.store.claim(
                cfg.queue,
                node_id=self.node_id,
                limit=limit,
                lease_s=cfg.lease_s,
                ordered=cfg.ordered,
                min_due_age_s=cfg.steal_after_s,
            )
        return tasks

    def _deadline(self, started: float) -> float:
        """Local monotonic deadline of a lease granted after ``started``, with a safety margin."""
        lease = self.config.lease_s
        return started + lease - min(lease * 0.2, 2.0)

    # --- handle one task ----------------------------------------------------------------

    async def _handle_batch(self, flights: list[_InFlight]) -> None:
        """Handle one claim's tasks, each in an asyncio task of its own, under the node's task group.

        One task-group child per claim, not per task: this supervises its tasks as the
        task group would. An error of one (e.g. :class:`StoreClosedError`) cancels the
        others and is raised once they are over (several: as an ``ExceptionGroup``),
        so the node fails; a cancellation of the node cancels each of them once (a send
        gets its cleanup time, see :func:`_cut_short`), waits for them to hand their
        tasks back (shielded) and re-raises. A send that raises ``CancelledError`` by
        itself is a failed send (see :meth:`_send`), never a cancellation of the node.

        Raises:
            Exception: what a task's handling raised.
            CancelledError: the node was cancelled.
            RuntimeError: a task's handling ended cancelled although the node was not
                cancelled (a bug: re-raising that ``CancelledError`` would end the node
                silently, with its partitions and tasks never handed over).
        """
        loop = asyncio.get_running_loop()
        node_id = self.node_id
        handles = [loop.create_task(self._handle(f), name=f"{node_id}-task-{f.task.id}") for f in flights]
        pending: set[asyncio.Task[None]] = set(handles)
        try:
            while pending:
                _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
                if any(not h.cancelled() and h.exception() is not None for h in handles if h.done()):
                    break
        finally:
            if pending:  # an error or the node's cancellation: end the others, and wait for their hand-backs
                # A slot settling a send that returned is not cancelled: its commit must land (or
                # the task would be sent again); it stops once settled, or is cancelled after
                # SETTLE_WAIT_S.
                settling = pending & self._settling
                for handle in pending - settling:
                    handle.cancel()
                self._stop_after.update(settling)
                with anyio.CancelScope(shield=True):
                    if settling:
                        _, late = await asyncio.wait(settling, timeout=SETTLE_WAIT_S)
                        for handle in late:
                            handle.cancel()
                    await asyncio.wait(pending)
                self._stop_after.difference_update(settling)
                if self._exit is not None:  # the process is ending: the exit is kept in self._exit
                    for handle in handles:  # (no "exception was never retrieved" for the slots that raised it)
                        if handle.done() and not handle.cancelled():
                            handle.exception()
        errors = [e for h in handles if not h.cancelled() and (e := h.exception()) is not None]
        if len(errors) == 1:
            raise errors[0]
        if errors:
            raise BaseExceptionGroup("errors handling a claim's tasks", errors)
        cancelled = [f.task.id for f, h in zip(flights, handles, strict=True) if h.cancelled()]
        if cancelled:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise asyncio.CancelledError  # the node is being cancelled: never swallowed
            raise RuntimeError(
                f"node {node_id!r}: the handling of tasks {cancelled} ended cancelled "
                "although the node was not cancelled"
            )

    async def _handle(self, flight: _InFlight) -> None:
        """Handle ``flight``, then the tasks its commits leased (commit-and-continue), in one slot."""
        current: _InFlight | None = flight
        try:
            while current is not None:
                try:
                    await self._handle_task(current)
                except BaseException:
                    await self._hand_back_unsent(current.next)
                    raise
                finally:
                    self._in_flight.pop(current.task.id, None)
                if not self._claiming or asyncio.current_task() in self._stop_after:
                    # stop_claiming() (or the node's cancellation) came while the commit that leased
                    # the next task was at the store: hand it back unsent, as the claims not yet
                    # made are never made.
                    await self._hand_back_unsent(current.next)
                    break
                current = current.next
        finally:
            if not self._in_flight:
                self._drained.set()
            self._slots.release()

    async def _hand_back_unsent(self, flight: _InFlight | None) -> None:
        """Hand back a task a commit leased (commit-and-continue) that this slot will not send."""
        if flight is not None:
            self._in_flight.pop(flight.task.id, None)
            await self._hand_back_shielded(flight)

    async def _handle_task(self, flight: _InFlight) -> None:
        task = flight.task
        cfg = self.config
        try:
            try:
                name = self._lock_name(task)
            except BaseException as exc:  # a bad lock_key (or task): fail the task, not the node
                # lock_key is a plain function: a CancelledError from it is its own, never a cancellation.
                if is_process_exit(exc):  # the process is ending: see asynccoord._exits
                    raise self._exiting(carry(exc)) from None
                log.warning(
                    "asynccoord.node.lock_key_failed node=%s task=%s error=%s", self.node_id, task.id, error_text(exc)
                )
                await self._fail(flight, exc, source="lock_key")
                return
            if name is None:
                await self._finish(flight, await self._send(flight))
            elif cfg.lock_permits == 1:
                # Local tasks needing the same lock take turns on one lease (see lockpool):
                # the send runs in the turn, the commit after it (fenced by the token).
                try:
                    async with self._pool().turn(
                        name,
                        timeout_s=cfg.lock_wait_s,
                        on_lost=functools.partial(_lock_lost, flight),
                        priority=task.priority,
                        order=task.id,  # the oldest waiting task first: the lagging conversation's head
                    ) as turn:
                        flight.lock = turn.lease
                        outcome = await self._send(flight)
                        committed = turn.defer()  # the lease stays in this process until the commit is over
                except LockTimeoutError:
                    await self._hand_back(task, delay_s=cfg.busy_requeue_s)
                    return
                try:
                    await self._finish(flight, outcome)
                finally:
                    committed()
            else:
                # A semaphore permit, renewed by the store's watchdog while the send runs; if it
                # is lost the send is cut (as for a lock). Once the send has returned, a loss
                # cuts nothing: a permit bounds concurrent sends and fences no commit, so the
                # commit of a message that went out goes on. The permit is given back after it.
                handle = Semaphore(
                    self.lock_store,
                    name,
                    cfg.lock_permits,
                    ttl_s=cfg.lock_ttl_s,
                    renew_interval_s=cfg.lock_ttl_s / 3,
                    holder=self.node_id,
                    on_lost=functools.partial(_lock_lost, flight),
                )
                try:
                    flight.lock = await handle.acquire(timeout_s=cfg.lock_wait_s)
                except LockTimeoutError:
                    await self._hand_back(task, delay_s=cfg.busy_requeue_s)
                    return
                try:
                    await self._finish(flight, await self._send(flight))
                finally:
                    await self._give_permit_back(handle, flight)
        except UNRECOVERABLE_STORE_ERRORS:
            # Closed under us: hand the task back if the store still allows it, then fail the node.
            await self._hand_back_shielded(flight)
            raise
        except StoreError as exc:
            # The store failed mid-task: hand the task back (if the store lets us) and go on.
            log.warning("asynccoord.node.store_error node=%s task=%s error=%s", self.node_id, task.id, exc)
            await self._hand_back_shielded(flight)
        except BaseException:
            # Cancelled (shutdown): hand the task back unfinished, not counted as a failure,
            # once its lock is released, so the next claimer finds the lock free.
            if flight.lock is not None and self.lock_pool is not None:
                with anyio.CancelScope(shield=True):
                    await self.lock_pool.released(flight.lock.name)
            await self._hand_back_shielded(flight)
            raise

    async def _give_permit_back(self, handle: Semaphore, flight: _InFlight) -> None:
        """Release a semaphore permit after the send (shielded, bounded by the handle); a failed release is logged."""
        try:
            await handle.release()
        except (LockError, StoreError) as exc:  # lapsed or lost (counted by the lock), or the store failed
            log.warning(
                "asynccoord.node.permit_release_failed node=%s task=%s error=%s", self.node_id, flight.task.id, exc
            )

    def _lock_name(self, task: Task) -> str | None:
        """The lock ``lock_key`` names for ``task`` (None: no lock), checked like any lock name."""
        if not self.config.locks or self.lock_key is None:
            return None
        name = self.lock_key(task)
        return None if name is None else check_user_lock_name("lock_key(task)", name)

    def _pool(self) -> LockPool:
        if self.lock_pool is None:
            self.lock_pool = LockPool(self.lock_store, ttl_s=self.config.lock_ttl_s, holder=self.node_id)
            self._own_pool = True
        return self.lock_pool

    async def _send(self, flight: _InFlight) -> tuple[bool, Any, BaseException | None]:
        """Run the user's send under the timeout and the lease guard.

        The send runs in an asyncio task of its own (so every cancellation reaches it as
        one ``CancelledError``, see :func:`_cut`); a lost lease or lock, or the send
        timeout, cancels that task directly, and a cancellation of the node reaches it
        through :func:`_cut_short`. Whichever comes first cancels it; the others find it
        cut already and leave its cleanup time alone.

        Returns:
            ``(completed, result, failure)``: ``completed`` is False when the send was
            cancelled because its task lease or lock was lost. ``failure`` is what the
            send raised (an ``Exception``, or a ``BaseException`` other than
            ``KeyboardInterrupt`` and ``SystemExit``), ``TimeoutError()`` when it was cut at
            ``send_timeout_s``, or the ``CancelledError`` it raised although nothing of
            the node's cancelled it (a failed send, see :meth:`_fail`).

        Raises:
            CancelledError: the node was cancelled (the send got its cleanup time first).
            ProcessExiting: the send raised ``KeyboardInterrupt`` or ``SystemExit``, or a
                group holding one (the process is ending: the task is handed back, not
                failed; see :mod:`asynccoord._exits`). Any other ``BaseException`` it raised
                is a failed send, as an ``Exception`` is.
        """
        flight.started = True
        if flight.lost_already():  # the lock was lost before the send could begin
            flight.returned = flight.settling = True
            return False, None, None
        task = flight.task
        loop = asyncio.get_running_loop()
        token = _DELIVERY.set(Delivery(node_id=self.node_id, task=task, lock=flight.lock, context=self._context(task)))
        try:
            child = flight.send = loop.create_task(self._send_coroutine(task))  # copies the context: the delivery
        finally:
            _DELIVERY.reset(token)
        send_started = time.perf_counter()
        over = flight.over = loop.create_future()
        child.add_done_callback(lambda _: _resolve(over))
        child.add_done_callback(functools.partial(self._cut_send_ended, flight))
        timer = loop.call_at(loop.time() + self.config.send_timeout_s, _time_out, flight)
        try:
            await over
        except asyncio.CancelledError:
            if child.done() and not child.cancelled() and flight.cut_until is None:
                # The send had returned (its message went out) when the node was cancelled:
                # settle it first (_finish), then go on cancelling; handing it back would send it again.
                flight.cancel_pending = True
            else:  # the node is cancelled: the send gets its cleanup time, then it goes on
                timer.cancel()  # no timeout may cut that time short
                await _cut_short(flight, child)
                raise
        finally:
            timer.cancel()
            flight.settling = True
            flight.send = flight.over = None
        if flight.lost is not None:
            flight.returned = True
            child.add_done_callback(_retrieve)  # the cut send's outcome, seen now or when it ends
            return False, None, None
        result: Any = None
        failure: BaseException | None = None
        if flight.timed_out:
            child.add_done_callback(_retrieve)  # the cut send's outcome, seen now or when it ends
            failure = TimeoutError()
        elif child.cancelled():
            # Nothing of the node's cancelled the send: a timeout or a lost lease or lock says
            # so above, and the node's own cancellation raises at `await over`. The send raised
            # CancelledError by itself (a library it awaits was cancelled by something else,
            # say): a failed send, for the retry policy. The node goes on.
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise asyncio.CancelledError  # the node is being cancelled meanwhile: never swallowed
            failure = _cancelled_error_of(child)
            log.warning(
                "asynccoord.node.send_cancelled_itself node=%s task=%s: the send raised CancelledError "
                "without being cancelled; counted as a failed send",
                self.node_id,
                task.id,
            )
        else:
            failure = child.exception()  # the user's send failed: the retry policy decides
            if failure is None:
                result = child.result()
                failure = _unsent(result)
                if failure is not None:
                    result = None
            elif is_process_exit(failure):  # the process is ending (see asynccoord._exits): no failed send
                raise self._exiting(carry(failure)) from None  # a group's first exit, as asyncio.TaskGroup raises it
        flight.returned = True
        _observe(self.store, SEND_MS, send_started)
        return True, result, failure

    def _cut_send_ended(self, flight: _InFlight, child: asyncio.Task[Any]) -> None:
        """A send task ended: if it had been cut (timeout, lost lease or lock, the node's
        cancellation) and its cleanup raised ``KeyboardInterrupt`` or ``SystemExit``, stop
        the node for it as if the send had raised it (:meth:`_send` no longer reads a cut
        send's outcome)."""
        if flight.cut_until is None or child.cancelled():
            return
        exc = child.exception()
        if exc is not None and is_process_exit(exc):
            self._exiting(carry(exc), stop=True)  # nothing raises it: stop the pipeline for it

    def _exiting(self, carried: ProcessExiting, *, stop: bool = False) -> ProcessExiting:
        """Record the process exit (the first one), and with ``stop`` stop the pipeline for it; return ``carried``.

        Recorded, not only raised: during a drain (a signal, ``shutdown()``, ``stop_claiming()``)
        the node's last hand-back sets it drained and the pipeline ends before the exception
        has come up through the claim's task; :meth:`_run_carrying_exits` raises it then.
        """
        if self._exit is None:
            self._exit = carried
            if stop and self._scope is not None:
                self._scope.cancel()
        return carried

    def _send_coroutine(self, task: Task) -> Coroutine[Any, Any, Any]:
        """The coroutine the send task runs: the user's own one for an ``async def`` send.

        An ``async def`` send is called here (it only makes its coroutine; its body runs in
        the send task, inside :func:`_carrying_exits`). A call that raises (a send whose
        signature does not take the task, say) is a failed send, raised in the send task as
        any error of the send is. Any other callable goes through :meth:`_call_send`. A
        ``KeyboardInterrupt`` or ``SystemExit`` leaves the send task as a
        :class:`~asynccoord._exits.ProcessExiting`, never as itself (which asyncio would let
        out of the event loop at once, before anything is handed back).
        """
        send = self.send
        if send is not self._checked_send:  # self.send is a public attribute: check it again if replaced
            self._checked_send = send
            self._send_is_async = inspect.iscoroutinefunction(send)
        if not self._send_is_async:
            return self._call_send(task)
        try:
            coro = send(task)
        except BaseException as exc:
            return _raising(exc)
        return _carrying_exits(coro) if asyncio.iscoroutine(coro) else self._awaiting(coro)

    @staticmethod
    async def _awaiting(outcome: Any) -> Any:
        try:
            return await outcome if inspect.isawaitable(outcome) else outcome
        except PROCESS_EXITS as exc:
            raise ProcessExiting(exc) from None

    async def _call_send(self, task: Task) -> Any:
        try:
            outcome = self.send(task)  # an async generator returned is no result: see _unsent
            # A plain (sync) function has already sent when it returns: use its value;
            # awaiting it would fail and send again on retry.
            return await outcome if inspect.isawaitable(outcome) else outcome
        except PROCESS_EXITS as exc:
            raise ProcessExiting(exc) from None

    async def _finish(self, flight: _InFlight, outcome: tuple[bool, Any, BaseException | None]) -> None:
        """Settle a send that returned, even if the node is cancelled meanwhile, then let the cancellation go on.

        The send's message went out: if its commit (or failure) were cancelled, the task
        would go back to pending and be sent again, and nothing would count it. So while
        this slot settles, a cancellation of the node does not cancel it but waits for it
        (up to :data:`SETTLE_WAIT_S`, see :meth:`_handle_batch`); and a cancellation that
        reached the slot just as its send returned (``cancel_pending``) is raised after the
        settle.

        Raises:
            CancelledError: the node was cancelled (after the settle).
            Exception: what the settle raised (e.g. :class:`~asynccoord.errors.StoreClosedError`).
        """
        slot = asyncio.current_task()
        if slot is not None:
            self._settling.add(slot)
        try:
            # The settle: commit (fenced by the lock's token) or fail the task after its send.
            completed, result, failure = outcome
            if not completed:
                self._state.conflicts += 1
                node_id, task_id = self.node_id, flight.task.id
                log.warning("asynccoord.node.send_cancelled node=%s task=%s reason=%s", node_id, task_id, flight.lost)
                if flight.lock_lost:  # never commit; the task's lease is still ours: no need to wait for it to lapse
                    await self._fail_lock_lost(flight)
                # else the task lease or lock is gone: never commit
            else:
                self._state.sent += 1
                if failure is not None:
                    await self._fail(flight, failure)
                else:
                    await self._commit(flight, result)
                flight.settled = True
        finally:
            if slot is not None:
                self._settling.discard(slot)
        if flight.cancel_pending:
            raise asyncio.CancelledError

    async def _fail_lock_lost(self, flight: _InFlight) -> None:
        """Record the attempt whose lock (or permit) was lost as failed, so the retry policy takes it now.

        The task's own lease still holds: left alone, the task would wait ``lease_s`` for it
        to lapse. As a failed attempt (``last_error`` "LockLostError: lock lost: ...") it is
        claimable again after the retry policy's backoff, and an attempt that keeps losing
        its lock reaches its dead letter like any failing one. A task lease lost meanwhile
        leaves nothing to do (the conflict is counted already).
        """
        with contextlib.suppress(LeaseLostError):
            await self._record_failure(flight, f"LockLostError: {flight.lost}")
        flight.settled = True

    async def _record_failure(self, flight: _InFlight, text: str) -> None:
        """Record a failed attempt (``last_error`` ``text``); wake the node when its retry falls due.

        Raises:
            LeaseLostError: the lease is no longer the node's (nothing written).
            StoreError: as :meth:`_retrying`.
        """

        async def record() -> None:
            out = await self.store.fail(flight.task, text, retry=self.config.retry)
            if out.status is TaskStatus.PENDING:  # retried later: claim again when it is due
                self._due_soon(out.run_at - out.updated_at)

        await self._retrying(flight, "fail", record)

    def _context(self, task: Task) -> dict[str, Any]:
        size = self.config.affinity_cache_size
        if size == 0:
            return {}
        key = task.partition_key
        context = self._affinity.get(key)
        if context is None:
            context = self._affinity[key] = {}
            while len(self._affinity) > size:
                self._affinity.popitem(last=False)
        else:
            self._affinity.move_to_end(key)
        return context

    async def _commit(self, flight: _InFlight, result: Any) -> None:
        task = flight.task
        try:
            encode_result(result, self.store.config)
        except (InvalidArgumentError, InvalidTypeError) as exc:
            # The message went out: commit it anyway (never re-send), without the result.
            log.warning("asynccoord.node.result_not_stored node=%s task=%s reason=%s", self.node_id, task.id, exc)
            result = None
        commit_started = time.perf_counter()
        try:
            try:
                await self._commit_once(flight, result)
            except _TRANSIENT_STORE_ERRORS as exc:  # tried again (the first try needs no retry loop)
                await self._retrying(flight, "commit", functools.partial(self._commit_once, flight, result), failed=exc)
        except LeaseLostError as exc:
            self._state.conflicts += 1
            log.warning("asynccoord.node.commit_rejected node=%s task=%s reason=%s", self.node_id, task.id, exc.reason)
            return
        except UNRECOVERABLE_STORE_ERRORS:
            raise  # the store is closed (or serves another loop): the node fails, as documented
        except CoordError as exc:  # a fencing rejection (a newer holder of the lock wrote first), or the store failed
            self._state.conflicts += 1
            log.warning("asynccoord.node.commit_rejected node=%s task=%s reason=%s", self.node_id, task.id, exc)
            return
        _observe(self.store, COMMIT_MS, commit_started)
        self._state.committed += 1

    async def _commit_once(self, flight: _InFlight, result: Any) -> None:
        """One try of the commit of ``flight``'s task (fenced by a lock's token; with commit-and-continue)."""
        task = flight.task
        if not self.config.version_checks:
            await self.store.unchecked_complete([task], [result])
            return
        # A lock's token fences the commit; a semaphore's does not: its holders finish in
        # any order, and an older permit's commit is no stale write.
        lock = flight.lock
        fence = None if lock is None or self.config.lock_permits > 1 else (lock.name, lock.fencing_token)
        if self._continues(flight):
            started = time.monotonic()
            step = await self.store.complete_and_claim_next(task, result, fence=fence, lease_s=self.config.lease_s)
            done: Task = step.done
            if step.next_task is not None:
                flight.next = self._adopt(step.next_task, started, chain=flight.chain + 1)
        else:
            done = await self.store.complete(task, result, fence=fence)
        recorder = getattr(self.store, "latencies", None)
        if recorder is not None:  # store clock, both ends: no clock skew between processes
            recorder.observe(ENQUEUE_TO_COMMIT_MS, (done.updated_at - task.created_at) * 1000.0)

    async def _retrying(
        self,
        flight: _InFlight,
        what: str,
        attempt: Callable[[], Awaitable[None]],
        *,
        failed: Exception | None = None,
    ) -> None:
        """Run ``attempt`` (a commit or a failure record), again after a transient store error while the lease lasts.

        A store that is busy (SQLite's write lock held past ``busy_timeout_s``: nothing was
        written) or unreachable (past the PostgreSQL store's ``reconnect_timeout_s``: a
        commit whose reply was lost may have landed) leaves the task leased to this node, and
        dropping the commit would leave the task to be sent again once the lease lapsed. So
        it is tried again with :data:`SETTLE_RETRY`'s backoff until the lease's local
        deadline. Each try is the same compare-and-set, so after a try that did land the
        next one fails as a lost lease (a conflict), never a second commit; a next task that
        such a landed try leased by commit-and-continue is not known to the node and waits
        for its lease to lapse (it is not sent twice). Other errors (a lost lease, a
        fencing rejection, a closed store, any other store error) are raised at once, and
        so is the last transient error at the deadline. ``failed``: the transient error of a
        first try the caller made itself (this then starts with its retry).
        """
        tries = 0
        while True:
            try:
                if failed is not None:
                    raise failed
                await attempt()
                return
            except _TRANSIENT_STORE_ERRORS as exc:
                failed = None
                tries += 1
                delay_s = SETTLE_RETRY.delay_s(tries)
                if time.monotonic() + delay_s >= flight.lease_deadline:
                    log.error(
                        "asynccoord.node.node.%s_failed node=%s task=%s tries=%d error=%s: the lease ends before "
                        "another try; the task will be claimed again when it lapses",
                        what,
                        self.node_id,
                        flight.task.id,
                        tries,
                        exc,
                    )
                    raise
                log.warning(
                    "asynccoord.node.node.%s_retry node=%s task=%s try=%d delay_s=%.3f error=%s",
                    what,
                    self.node_id,
                    flight.task.id,
                    tries,
                    delay_s,
                    exc,
                )
                await asyncio.sleep(delay_s)

    def _continues(self, flight: _InFlight) -> bool:
        """Whether this commit should also lease the key's next task (``NodeConfig.claim_next``)."""
        cfg = self.config
        if not (cfg.claim_next and cfg.ordered and self._claiming):
            return False
        if flight.chain >= cfg.claim_next_max and self._slots.locked():
            return False  # every slot is busy: this one goes back to claiming, for the others' work
        membership = self.membership
        if membership is not None and not membership.healthy:
            return False  # others may think we are dead: take nothing more
        owned = self._partitions()
        return owned is None or (self._owned is not None and flight.task.partition in self._owned)

    def _adopt(self, task: Task, started: float, *, chain: int) -> _InFlight:
        """Take ``task`` (leased by a commit at or after ``started``) in flight, in its predecessor's slot."""
        flight = _InFlight(task=task, lease_deadline=self._deadline(started), chain=chain)
        self._in_flight[task.id] = flight
        self._drained.clear()
        self._state.claimed += 1
        self._state.continued += 1
        return flight

    async def _fail(self, flight: _InFlight, failure: BaseException, *, source: str = "send") -> None:
        """Record a failed attempt of ``flight``'s task (the store's retry policy decides: again later, or dead).

        ``failure`` becomes the task's ``last_error`` (``"Type: message"``, safe for an
        exception whose ``__str__`` raises, see :func:`~asynccoord._errtext.error_text`); a
        ``CancelledError`` that ``source`` (``"send"`` or ``"lock_key"``) raised by itself
        reads ``"<source> raised CancelledError without being cancelled"``.

        A busy or unreachable store is tried again while the lease lasts (see :meth:`_retrying`).

        Raises:
            StoreError: the store failed (the caller hands the task back, or fails the node).
        """
        self._state.failed += 1
        if isinstance(failure, asyncio.CancelledError):
            detail = error_text(failure).partition(": ")[2]  # its message ("" without one), safely
            text = f"{source} raised CancelledError without being cancelled" + (f": {detail}" if detail else "")
        else:
            text = error_text(failure)
        try:
            await self._record_failure(flight, text)
        except LeaseLostError:
            self._state.conflicts += 1

    async def _hand_back_shielded(self, flight: _InFlight) -> None:
        if flight.settled:
            return  # committed or failed already: its lease is gone, there is nothing to hand back
        if flight.started and not flight.returned:
            # The send may have reached its receiver before it was cancelled: the next
            # holder's send of this task is a possible duplicate. Count it like a lost lease.
            self.store.events.add(ev.SEND_INTERRUPTED)
        elif flight.returned and flight.lost is None:
            # The send was over, but its commit (or failure record) was cut: shutdown past
            # SETTLE_WAIT_S, say. The task goes back and will be sent again: count it too.
            self.store.events.add(ev.SEND_INTERRUPTED)
            log.warning(
                "asynccoord.node.settle_cut node=%s task=%s: the send was over but its commit was cut; "
                "handed back, it will be sent again",
                self.node_id,
                flight.task.id,
            )
        # The release runs in a task of its own: the slot's own cancellation (``_handle_batch``
        # cancels its slots with Task.cancel(), which an anyio shield does not stop) must not
        # cut it, or the task would stay leased to a stopped node until its lease lapsed.
        release = asyncio.get_running_loop().create_task(self._hand_back_quietly(flight.task))
        self._releases.add(release)
        release.add_done_callback(self._releases.discard)
        with anyio.CancelScope(shield=True):
            await _wait_through_cancellation(release, HAND_BACK_WAIT_S)

    async def _hand_back_quietly(self, task: Task) -> None:
        with contextlib.suppress(CoordError):
            await self._hand_back(task, delay_s=0.0)

    async def _hand_back(self, task: Task, *, delay_s: float) -> None:
        try:
            await self.store.release(task, delay_s=delay_s)
            self._state.handed_back += 1
        except LeaseLostError:
            return  # expired meanwhile: it is claimable again anyway
        if delay_s > 0:  # nobody is notified when it becomes due
            self._due_soon(delay_s)

    def _due_soon(self, delay_s: float) -> None:
        """Wake the node in ``delay_s`` seconds (+1 ms): a task it put back is due then, and nobody notifies that.

        Every such time is kept (a heap), and one timer runs at a time, for the earliest.
        """
        if self._wake is None:
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + max(delay_s, 0.0) + 0.001
        heapq.heappush(self._due_times, when)
        self._arm_due(loop)

    def _arm_due(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run the timer for the earliest kept due time (if it is not running for it already)."""
        if not self._due_times or self._due_times[0] >= self._due_when:
            return
        if self._due_timer is not None:
            self._due_timer.cancel()
        self._due_when = self._due_times[0]
        self._due_timer = loop.call_at(self._due_when, self._due_now)

    def _due_now(self) -> None:
        self._due_timer = None
        self._due_when = math.inf
        loop = asyncio.get_running_loop()
        now = loop.time()
        while self._due_times and self._due_times[0] <= now + 0.001:  # due now (or within the timer's slack)
            heapq.heappop(self._due_times)
        if self._wake is not None:
            self._wake.set()
            self._arm_due(loop)

    # --- keeper: lease and lock renewal ---------------------------------------------------

    async def _keeper(self) -> None:
        """Renew the leases of every task in flight with one ``extend_many`` per interval.

        The renewals fall on a grid of the monotonic clock (every ``lease_s / 3``, shifted
        by this process's :data:`_RENEWAL_PHASE`), so the nodes of a process with the same
        ``lease_s`` renew at the same moments whenever each of them started, and the stores
        run their concurrent calls as one statement (PostgreSQL) or one transaction
        (SQLite's group commit): renewals cost about the same with 16 or 64 nodes. A
        renewal comes about ``lease_s / 3`` after the one before (later only if the loop
        or the store is late), never twice for one point of the grid.

        A lease that is not renewed before its local deadline (monotonic clock, with
        a safety margin) or that the store reports lost cancels its send. Locks are
        renewed by the store's lock watchdog (see :mod:`asynccoord.locks.watchdog`).
        """
        cfg = self.config
        interval_s = cfg.lease_s / 3
        offset_s = _RENEWAL_PHASE * interval_s
        point = (time.monotonic() - offset_s) // interval_s + 1  # the next point of the grid, in intervals
        while True:
            # Sleep to the point itself, not for what remains of an interval: timers that fire a
            # little early (uvloop rounds them to whole milliseconds) would then renew again at once.
            await anyio.sleep(max(0.0, offset_s + point * interval_s - time.monotonic()))
            point = max(point + 1, (time.monotonic() - offset_s) // interval_s + 1)  # skip points missed
            flights = [f for f in self._in_flight.values() if f.lost is None and not f.settling]
            if not flights:
                continue
            started = time.monotonic()
            try:
                renewed = await self.store.extend_many([f.task for f in flights], cfg.lease_s)
            except UNRECOVERABLE_STORE_ERRORS:
                raise  # fails the node (see run)
            except StoreError as exc:
                log.warning("asynccoord.node.renew_failed node=%s error=%s", self.node_id, exc)
                now = time.monotonic()
                for f in flights:
                    if now >= f.lease_deadline:
                        self._lose(f, "store unreachable past the lease deadline")
                continue
            for f, ok in zip(flights, renewed, strict=True):
                if ok:  # the store's compare-and-set is the authority: nobody took the task
                    f.lease_deadline = self._deadline(started)
                else:
                    self._lose(f, "task lease lost")

    def _lose(self, flight: _InFlight, reason: str) -> None:
        if flight.lost is not None or flight.settling:
            return  # settled meanwhile (committed, failed or handed back): nothing was lost
        flight.lost = reason
        self.store.events.add(ev.LEASE_LOST)
        _cut(flight)


_RENEWAL_PHASE = random.random()
"""Where this process's renewal grid starts, as a fraction of the interval (see ``Node._keeper``).

The nodes of one process share it and renew together; the processes of one host (one
monotonic clock) each draw their own, so they do not all renew, and contend for one SQLite
file's write lock, at the same moment.
"""


def _lock_lost(flight: _InFlight, error: LockLostError) -> None:
    """The lock (or permit) of ``flight`` was lost: cut its send, unless it has ended by itself.

    A send that has returned is settled as usual (a lock's fence decides its commit).
    """
    if not _send_over(flight):
        flight.lost = f"lock lost: {error}"
        flight.lock_lost = True
        _cut(flight)


def _send_over(flight: _InFlight) -> bool:
    """Whether ``flight``'s send has ended by itself (returned or raised), though the node may not have seen it yet.

    Its task finishes a loop turn or two before ``_send`` resumes and sets
    ``flight.returned``: a lost lock reported in that gap must not discard a message that
    went out (a send the node cut is not over by itself).
    """
    child = flight.send
    return flight.returned or (child is not None and child.done() and flight.cut_until is None)


def _time_out(flight: _InFlight) -> None:
    """The send timeout of ``flight`` (a loop timer): cut its send, unless something cut it already."""
    if flight.lost is None and flight.cut_until is None and flight.send is not None and not flight.send.done():
        flight.timed_out = True
        _cut(flight)


def _cut(flight: _InFlight) -> None:
    """Cancel the send of ``flight`` (if it runs) once, edge-triggered, as ``Task.cancel`` does.

    The send may still await in its ``except``/``finally`` blocks (closing a connection,
    say) for up to :data:`SEND_CLEANUP_S`; then it is cancelled again and the node goes
    on without waiting for it (``flight.over`` is resolved). Only the first call per send
    does this: a later one (the timeout, a lost lease or lock, the node's cancellation,
    whichever did not come first) finds ``flight.cut_until`` set and leaves the send's
    cleanup time alone, so a send is cancelled at most twice, :data:`SEND_CLEANUP_S` apart.
    """
    child, over = flight.send, flight.over
    if child is None or over is None or child.done() or flight.cut_until is not None:
        return
    loop = asyncio.get_running_loop()
    flight.cut_until = loop.time() + SEND_CLEANUP_S
    child.cancel()

    def cut_again() -> None:
        if not child.done():
            child.cancel()
            child.add_done_callback(_retrieve)
        _resolve(over)

    timer = loop.call_at(flight.cut_until, cut_again)
    child.add_done_callback(lambda _: timer.cancel())


async def _cut_short(flight: _InFlight, child: asyncio.Task[Any]) -> None:
    """Cut the send ``child`` of ``flight`` (see :func:`_cut`); wait (shielded) until it ends or its cleanup time is up.

    The node's cancel scopes (anyio) are level-triggered: every ``await`` inside a
    cancelled scope is cancelled again, so a send run in the node's own task could not
    await anything in its ``finally``. The send runs as a separate asyncio task that
    receives one ``CancelledError`` and gets its cleanup time before a second one; then
    the caller's cancellation proceeds. A send that its timeout or a lost lease or lock
    cut already is not cancelled again: it keeps the rest of the cleanup time it got
    then (its second cancellation, when that time is up, is :func:`_cut`'s). The caller
    cancels the send timeout first. ``flight.over`` is not waited for: the caller's
    cancellation may have cancelled it.
    """
    _cut(flight)
    until = flight.cut_until  # None: the send had ended already
    if until is not None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(until - asyncio.get_running_loop().time()):
            await asyncio.wait({child})
    child.add_done_callback(_retrieve)


def _cancelled_error_of(child: asyncio.Task[Any]) -> asyncio.CancelledError:
    """The ``CancelledError`` that the (cancelled) task ``child`` ended with."""
    try:
        child.result()
    except asyncio.CancelledError as exc:
        return exc
    return asyncio.CancelledError()  # not reached: child is cancelled


async def _raising(exc: BaseException) -> Any:
    """Raise ``exc`` in the send task (a send whose call raised: see ``Node._send_coroutine``)."""
    if isinstance(exc, PROCESS_EXITS):
        raise ProcessExiting(exc) from None
    raise exc


async def _carrying_exits(send: Coroutine[Any, Any, Any]) -> Any:
    """Run an ``async def`` send's coroutine; a ``KeyboardInterrupt`` or ``SystemExit`` from it leaves as a
    :class:`~asynccoord._exits.ProcessExiting` (see :mod:`asynccoord._exits`)."""
    try:
        return await send
    except PROCESS_EXITS as exc:
        raise ProcessExiting(exc) from None


def _unsent(result: Any) -> InvalidTypeError | None:
    """The error of a send that returned an unawaited coroutine or a generator, async or plain (nothing of it ran).

    ``async def send(task): return client.send(task)`` (a missing ``await``): committing it
    would mark a message sent that never was. It is a failed send instead; the coroutine is
    closed (Python would warn that it was never awaited).
    """
    if inspect.iscoroutine(result):
        result.close()
        return InvalidTypeError(f"send returned an unawaited coroutine (a missing await?): {result!r}")
    if inspect.isasyncgen(result):
        return InvalidTypeError(f"send returned an async generator, not a result: {result!r}")
    if inspect.isgenerator(result):
        result.close()
        return InvalidTypeError(f"send returned a generator, not a result: {result!r}")
    return None


async def _wait_through_cancellation(task: asyncio.Task[None], timeout_s: float) -> None:
    """Wait up to ``timeout_s`` seconds for ``task``, also when cancelled meanwhile; then re-raise.

    A cancellation that arrives while waiting does not stop the wait: it is raised once
    ``task`` is over (or the time is up, ``task`` going on in the background). An error
    of ``task`` is raised, unless the caller is being cancelled (then it is logged).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    cancelled = False
    while not task.done():
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        try:
            await asyncio.wait({task}, timeout=remaining)
        except asyncio.CancelledError:
            cancelled = True
    error = task.exception() if task.done() and not task.cancelled() else None
    current = asyncio.current_task()
    if error is not None and (cancelled or (current is not None and current.cancelling())):
        # The caller is being cancelled: the cancellation is what it raises (an error raised
        # instead would end the slot with it, where nobody reads it); the error is logged.
        log.error("asynccoord.node.hand_back_failed error=%s", error_text(error), exc_info=error)
    elif error is not None:
        raise error
    if cancelled:
        raise asyncio.CancelledError


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a cancelled send's outcome as seen (no 'exception was never retrieved' warning)."""
    if not task.cancelled():
        task.exception()
