"""A node: the fetch -> lock -> send -> commit pipeline over one shared queue.

A :class:`Node` claims due tasks from the partitions it owns, takes the lock each task needs,
calls the user's send under leases its keeper renews, and commits with a compare-and-set fenced
by the lock's token (M. Kleppmann, "How to do distributed locking", 2016). This module is the
loop (fetch, claim, dispatch, lock); the steps live beside it: :mod:`~asynccoord.node.flight`,
:mod:`~asynccoord.node.send`, :mod:`~asynccoord.node.settle` (commit, retry, hand-back),
:mod:`~asynccoord.node.keeper`, :mod:`~asynccoord.node.delivery`, :mod:`~asynccoord.node.tracing`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import anyio
import anyio.abc

from .. import events as ev
from .._errtext import error_text
from .._exits import ProcessExiting, carried_exit, carry, is_process_exit
from .._printable import printable, shown
from ..contract.locks import check_user_lock_name
from ..errors import (
    UNRECOVERABLE_STORE_ERRORS,
    CoordError,
    InvalidArgumentError,
    InvalidTypeError,
    LockTimeoutError,
    StoreError,
)
from ..locks.lock import Semaphore
from ..locks.pool import LockPool, Turn
from ..membership import Membership
from ..models import Task
from ..monitor.histogram import CLAIM_MS
from ..notify import WakeUp, WorkNotifier
from ..validation import check_bool, check_lock_key, check_lock_store, check_name, check_queue_store, check_send
from .ablation import FULL, Ablation
from .batch import LocklessBatch
from .config import NodeConfig, check_lock_pacing
from .delivery import Affinity
from .due import DueTimes
from .flight import Flight, FlightState, InFlight, lease_deadline
from .keeper import Keeper, lose
from .running import stop_all
from .send import Sender, SendFn, lease_ran_out, lock_lost, observe
from .settle import SETTLE_WAIT_S, Settler
from .slots import Slots
from .status import NodeState, NodeStatus
from .stop import until_stopped
from .tracing import node_tracer

__all__ = ("LockKeyFn", "Node", "failure_of")

log = logging.getLogger(__name__)

LockKeyFn = Callable[[Task], "str | None"]
"""The user's ``lock_key``: maps a task to the name of the lock it needs, or None for no lock."""


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


class Node:
    """One worker draining a queue: fetch -> lock -> send -> commit, repeatedly.

    1. Fetch: claim a batch of due tasks from the owned partitions (all of them without
       a membership), up to the free ``max_in_flight`` slots. After a full batch it
       claims again as soon as a slot is free. After a short or empty one it waits for a
       wake-up (an in-process enqueue, a commit that unblocks one of its keys, a task it
       put back falling due, the runtime's idle poll) or, standalone, its idle backoff.
    2. Lock: take the lock (or semaphore permit) that ``lock_key(task)`` names, waiting
       up to ``lock_wait_s`` and never past the task lease's local deadline. A task whose
       lock stays busy goes back to the queue after a short delay, not as a failure.
    3. Send: call ``send(task)`` under ``send_timeout_s``, never past the local deadline of
       the task's lease or lock (the last confirmed renewal plus ``lease_s``, less
       ``min(lease_s / 5, 2 s)``). A task past it goes back unsent (``lease_lost``, or
       ``lock_lost`` for a lapsed lock). The keeper renews leases and locks every
       ``lease_s / 3`` in one batched statement each.
    4. Commit: a compare-and-set on ``(id, lease_token, version)`` that also checks the
       lock's fencing token in the same transaction. A busy or unreachable store is
       tried again with backoff while the lease lasts
       (:data:`~asynccoord.node.settle.SETTLE_RETRY`).

    The node cancels a send at ``send_timeout_s`` (a failure), when its lease or lock is
    lost, or at shutdown: once, as ``asyncio.Task.cancel`` does, whichever comes first.
    The send's ``finally`` may then await its cleanup (close a connection) for up to
    :data:`~asynccoord.node.send.SEND_CLEANUP_S` (0.25 s), and nothing cancels it again
    within that time. A send still running then is cancelled once more and left behind, except
    one cut by its timeout: its lease and lock are kept until it ends, or ``send_overrun_s`` after the cut.

    What ``send`` raises goes to the retry policy (backoff with jitter, then the dead
    letter state). The task's ``last_error`` is ``"Type: message"``, or the exception's
    ``repr()`` if its ``str()`` raises. A ``BaseException`` that is no ``Exception`` goes
    there too, except ``KeyboardInterrupt`` and ``SystemExit``: the process is ending, so
    every node of every runtime in the process stops as if cancelled, hands back what it
    holds and releases its locks, and then the exception is raised to whoever awaits the
    runtime or :meth:`run` (see :mod:`asynccoord._exits`). Raised in a task that the send
    starts itself, asyncio lets it out of the event loop before asynccoord sees it, and
    the claimed tasks wait for their leases to lapse. A ``CancelledError`` that the send
    raises although nothing of the node cancelled it is a failed attempt; its
    ``last_error`` reads "send raised CancelledError without being cancelled". A send cut
    because its lock was lost is a failed attempt too: the task's own lease still holds,
    so the retry policy brings it back without waiting for that lease to lapse.
    Cancelling the node hands its tasks back to ``pending`` unfinished (not counted as
    failures), releases its locks and re-raises; a send still running then keeps its task
    lease and lock, left to lapse (see :meth:`Settler.hand_back_all_shielded`).

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
            A name in the prefix ``asynccoord.next:`` (a lock pool's places in line) is
            refused.
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
        _ablation: Layers switched off, for benchmarks only (see
            :mod:`asynccoord.node.ablation`). Default: every layer on.

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
        _ablation: Ablation = FULL,
    ) -> None:
        check_queue_store("store", store)
        check_send(send)
        check_lock_key(lock_key)
        if config is not None and not isinstance(config, NodeConfig):
            raise InvalidTypeError(f"config must be a NodeConfig, got {type(config).__name__}")
        if membership is not None and not isinstance(membership, Membership):
            raise InvalidTypeError(f"membership must be a Membership or None, got {membership!r}")
        if lock_pool is not None and not isinstance(lock_pool, LockPool):
            raise InvalidTypeError(f"lock_pool must be a LockPool or None, got {lock_pool!r}")
        if lock_store is not None:
            check_lock_store("lock_store", lock_store)
        if not isinstance(_ablation, Ablation):
            raise InvalidTypeError(f"_ablation must be an Ablation, got {type(_ablation).__name__}")
        queue = (config or NodeConfig()).queue
        check_lock_pacing(config or NodeConfig(), lock_key, store)
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
        self._ablation = _ablation
        self._state = NodeState(node_id=self.node_id)
        self._in_flight = InFlight(
            functools.partial(lose, store, reason="task lease lost: the task was handed out again")
        )
        # Slots (handle tasks) settling a send that returned are in self._settler.settling: a
        # cancellation of the node waits for them instead of cancelling them, then they stop (_stop_after).
        self._stop_after: set[asyncio.Task[Any]] = set()
        self._slots = Slots(self.config.max_in_flight)
        self._claiming = True
        self._stopped = asyncio.Event()  # set with _claiming = False: ends the waits before a send
        self._drained = asyncio.Event()
        self._drained.set()
        self._affinity = Affinity(self.config.affinity_cache_size)
        self._owned: frozenset[int] | None = None
        self._owned_sorted: list[int] = []
        self._view_version = -1
        self._wake: WakeUp | None = None
        self._due = DueTimes()  # wakes the node when a task it put back falls due
        self._rng = random.Random()
        # None without the otel extra or with tracing off: then nothing of tracing runs per task.
        self._tracer = node_tracer(self.node_id, self.config.queue) if self.config.tracing else None
        self._sender = Sender(
            store,
            node_id=self.node_id,
            config=self.config,
            affinity=self._affinity,
            on_exit=self._exiting,
            stopping=self._stop_requested,
        )
        self._settler = Settler(
            store,
            node_id=self.node_id,
            config=self.config,
            counters=self._state,
            version_checks=_ablation.version_checks,
            due_soon=self._due.add,
            continues=self._continues,
            adopt=self._adopt,
            lock_pool=lambda: self.lock_pool,
        )
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
        self._stopped.set()
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
            await self.run_hosted()
        except ProcessExiting as carried:
            await stop_all(carried)  # the process is ending: the runtimes beside this node too
            carried.reraise()

    async def run_hosted(self) -> None:
        """:meth:`run`, for a host that runs the node in an asyncio task of its own (a Runtime).

        A ``KeyboardInterrupt`` or ``SystemExit`` raised in that task would end the event
        loop before the host's other nodes had handed back what they hold; it comes out as a
        :class:`~asynccoord._exits.ProcessExiting` instead, for the host to stop the rest
        and raise the original (:meth:`~asynccoord._exits.ProcessExiting.reraise`).

        Raises:
            ProcessExiting: where :meth:`run` raises a ``KeyboardInterrupt`` or
                ``SystemExit`` (see :mod:`asynccoord._exits`); anything else as :meth:`run`.
        """
        self._state.status = NodeStatus.RUNNING
        failure: BaseException | None = None
        # Every change of the view, as it happens: a conversation whose partition moves away and
        # back between two claims still loses its affinity context here (see _partitions).
        unlisten = None
        if self._ablation.partitioning and self.membership is not None:
            unlisten = self.membership.add_listener(self._view_changed)
        try:
            async with anyio.create_task_group() as tg:
                self._scope = tg.cancel_scope
                if self.config.renew_leases:
                    keeper = Keeper(
                        self.store, node_id=self.node_id, lease_s=self.config.lease_s, flights=self._in_flight
                    )
                    tg.start_soon(keeper.run, name=f"{self.node_id}-keeper")
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
                log.error("asynccoord.node.failed node=%s error=%s", self.node_id, printable(error_text(failure)))
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
        if not self._ablation.partitioning or self.membership is None:
            return None
        view = self.membership.view
        if view.version != self._view_version:
            owned = self.membership.owned_partitions(self.node_id)
            if self._owned is not None:
                moved = len(owned ^ self._owned)
                if moved:
                    self.store.events.add(ev.PARTITION_HANDOFF, moved)
                    self._affinity.keep_only(owned, self.store.partitions)
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

    async def _fetch_loop(self, tg: anyio.abc.TaskGroup) -> None:
        if not self._claiming:
            return
        # The store's notifier wakes the node on new work; a store without one gets a
        # private notifier that only the node's own timers (and stop_claiming) use.
        notifier = getattr(self.store, "notifier", None) or WorkNotifier()
        wake = self._wake = self._due.wake = notifier.subscribe(self.config.queue)
        try:
            await self._fetch(tg, wake)
        finally:
            wake.close()
            self._due.close()

    async def _fetch(self, tg: anyio.abc.TaskGroup, wake: WakeUp) -> None:
        """Claim while slots are free: again at once after a full batch, else after a wake-up or the backoff.

        ``wake`` is armed just before each claim, so a notification that arrives while
        the claim runs is kept and the wait after a short claim returns at once: a
        claim that came back short never waits on work announced meanwhile.
        """
        cfg = self.config
        idle_s = cfg.idle_min_s
        while self._claiming:
            free = await self._slots.take(cfg.claim_batch)
            if not self.claiming:  # stop_claiming() came while every slot was busy: claim nothing more
                self._slots.release(free)
                break
            try:
                partitions = self._partitions()
                wake.arm(self._owned if partitions is not None else None)
                claim_started = time.perf_counter()
                claim_sent = time.monotonic()  # before the claim: the store starts the leases after it
                if self._tracer is None:
                    tasks = await self._claim(free, partitions)
                else:
                    tasks = await self._tracer.claim(self._claim(free, partitions), free)
                observe(self.store, CLAIM_MS, claim_started)
            except UNRECOVERABLE_STORE_ERRORS:
                self._slots.release(free)
                raise  # closed stores do not reopen by themselves (nor change loops): fail the node
            except StoreError as exc:
                log.warning("asynccoord.node.claim_failed node=%s error=%s", self.node_id, shown(exc))
                tasks = []
            except BaseException:
                self._slots.release(free)
                raise
            if len(tasks) < free:
                self._slots.release(free - len(tasks))
            if tasks and self._stop_requested():  # stop_claiming() came while the claim was at the store
                self._state.claimed += len(tasks)
                try:
                    with anyio.CancelScope(shield=True):  # hand them back unsent, not failed
                        await self._settler.hand_back_claimed(tasks)
                finally:
                    self._slots.release(len(tasks))
                break
            if tasks:
                self._state.claimed += len(tasks)
                deadline = lease_deadline(claim_sent, cfg.lease_s)
                flights = [Flight(task=task, lease_deadline=deadline) for task in tasks]
                for flight in flights:
                    self._in_flight.hold(flight)
                if self._tracer is not None:
                    self._tracer.claimed(flights)
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
        if not self._ablation.version_checks:
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

    # --- handle one task ----------------------------------------------------------------

    async def _handle_batch(self, flights: list[Flight]) -> None:
        """Handle one claim's tasks, each in an asyncio task of its own, under the node's task group.

        Tasks that need no lock go to a :class:`~asynccoord.node.batch.LocklessBatch` instead
        (see :meth:`_lockless`), which keeps the same guarantees without a task per task.
        One task-group child per claim, not per task: this supervises its tasks as the
        task group would. An error of one (e.g. :class:`StoreClosedError`) cancels the
        others and is raised once they are over (several: as an ``ExceptionGroup``),
        so the node fails; a cancellation of the node cancels each of them once (a send
        gets its cleanup time, see :func:`~asynccoord.node.send.cut_short`), waits for them to hand their
        tasks back (shielded) and re-raises. A send that raises ``CancelledError`` by
        itself is a failed send (see :meth:`~asynccoord.node.send.Sender.run`), never a cancellation of the node.

        Raises:
            Exception: what a task's handling raised.
            CancelledError: the node was cancelled.
            RuntimeError: a task's handling ended cancelled although the node was not
                cancelled (a bug: re-raising that ``CancelledError`` would end the node
                silently, with its partitions and tasks never handed over).
        """
        if self._lockless(flights):
            batch = LocklessBatch(
                flights,
                send=self.send,
                sender=self._sender,
                settler=self._settler,
                send_timeout_s=self.config.send_timeout_s,
                release=self._let_go,
            )
            await batch.run()
            return
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
                # A slot settling a send that returned is not cancelled: its commit must land (or the
                # task would be sent again); it stops once settled, or is cancelled after SETTLE_WAIT_S.
                settling = pending & self._settler.settling
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

    def _lockless(self, flights: list[Flight]) -> bool:
        """Whether a claim's ``flights`` go to a :class:`~asynccoord.node.batch.LocklessBatch` (else one slot each).

        They do when none needs a lock (the node has no ``lock_key``), none is traced, and
        no commit leases a next task (``claim_next`` on an ordered queue) or skips the
        version check (an ablation).
        """
        cfg = self.config
        return (
            (self.lock_key is None or not self._ablation.locks)
            and flights[0].trace is None
            and not (cfg.claim_next and cfg.ordered)
            and self._ablation.version_checks
        )

    def _let_go(self, flights: list[Flight]) -> None:
        """``flights`` are settled (or handed back): out of the tasks in flight, their slots free."""
        in_flight = self._in_flight
        for flight in flights:
            in_flight.forget(flight)
        if not in_flight:
            self._drained.set()
        self._slots.release(len(flights))

    async def _handle(self, flight: Flight) -> None:
        """Handle ``flight``, then the tasks its commits leased (commit-and-continue), in one slot."""
        current: Flight | None = flight
        try:
            while current is not None:
                try:
                    trace = current.trace
                    if trace is None:
                        await self._handle_task(current)
                    else:
                        await trace.deliver(self._handle_task(current))
                except BaseException:
                    await self._hand_back_unsent(current.next)
                    raise
                finally:
                    self._in_flight.forget(current)
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

    async def _hand_back_unsent(self, flight: Flight | None) -> None:
        """Hand back a task a commit leased (commit-and-continue) that this slot will not send."""
        if flight is not None:
            self._in_flight.forget(flight)
            await self._settler.hand_back_shielded(flight)

    async def _handle_task(self, flight: Flight) -> None:
        """Lock (if ``lock_key`` names a lock), send and settle one task; hand it back if that cannot be done."""
        task = flight.task
        cfg = self.config
        settler = self._settler
        try:
            try:
                name = self._lock_name(task)
            except BaseException as exc:  # a bad lock_key (or task): fail the task, not the node
                # lock_key is a plain function: a CancelledError from it is its own, never a cancellation.
                if is_process_exit(exc):  # the process is ending: see asynccoord._exits
                    raise self._exiting(carry(exc)) from None
                log.warning(
                    "asynccoord.node.lock_key_failed node=%s task=%s error=%s",
                    self.node_id,
                    task.id,
                    printable(error_text(exc)),
                )
                await settler.fail(flight, exc, source="lock_key")
                return
            if name is None:
                await settler.finish(flight, await self._sender.run(flight, self.send))
            elif cfg.lock_permits == 1:
                # Local tasks needing the same lock take turns on one lease (see lockpool):
                # the send runs in the turn, the commit after it (fenced by the token). The
                # wait ends at the task lease's local deadline too: a turn taken later (the
                # store may have handed the task on meanwhile) would send it twice.
                wait_s = self._lock_wait_s(flight)
                if wait_s is None:
                    await self._hand_back_lapsed(flight)
                    return
                turn_cm: AbstractAsyncContextManager[Turn] = self._pool().turn(
                    name,
                    timeout_s=wait_s,
                    on_lost=functools.partial(lock_lost, flight),
                    priority=task.priority,
                    order=task.id,  # the oldest waiting task first: the lagging conversation's head
                )
                if flight.trace is not None:
                    turn_cm = flight.trace.lock_turn(turn_cm, name)
                try:
                    async with turn_cm as turn:
                        flight.lock = turn.lease
                        turn.check()  # past the lock's own local deadline: lost (on_lost), never sent
                        committed = turn.defer()  # the lease stays in this process until the commit is over
                        try:
                            if cfg.lock_pace_dimension is not None:  # see NodeConfig and locks/pacing.py
                                pacing = self._pool().pacer.pace_turn(self.store, cfg, turn, flight)
                                await until_stopped(pacing, self._stopped)  # a stop: never sent (Sender.start)
                            flight.turn_end = turn.end  # the next turn begins as the send returns
                            outcome = await self._sender.run(flight, self.send)
                            if flight.abandoned:
                                # Let go (at send_overrun_s, or cut by a lost lease), it runs on under this
                                # lease's token: the lock's next sends take a new lease, with a higher token.
                                self._pool().give_back(turn.lease)
                        except BaseException:
                            committed()
                            if flight.outlives():  # its send still runs: the lease lapses, never given back
                                self._pool().let_lapse(turn.lease)
                            raise
                        finally:
                            flight.turn_end = None
                except LockTimeoutError:
                    await self._lock_wait_over(flight)
                    return
                try:
                    await settler.finish(flight, outcome)
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
                    on_lost=functools.partial(lock_lost, flight),
                )
                wait_s = self._lock_wait_s(flight)
                if wait_s is None:
                    await self._hand_back_lapsed(flight)
                    return
                try:
                    if flight.trace is None:
                        flight.lock = await handle.acquire(timeout_s=wait_s)
                    else:
                        flight.lock = await flight.trace.lock_acquire(handle.acquire(timeout_s=wait_s), name)
                except LockTimeoutError:
                    await self._lock_wait_over(flight)
                    return
                try:
                    await settler.finish(flight, await self._sender.run(flight, self.send))
                finally:
                    await settler.give_permit_back(handle, flight)
        except UNRECOVERABLE_STORE_ERRORS:
            # Closed under us: hand the task back if the store still allows it, then fail the node.
            await self._settler.hand_back_shielded(flight)
            raise
        except StoreError as exc:
            # The store failed mid-task: hand the task back (if the store lets us) and go on.
            log.warning("asynccoord.node.store_error node=%s task=%s error=%s", self.node_id, task.id, shown(exc))
            await self._settler.hand_back_shielded(flight)
        except BaseException:
            # Cancelled (shutdown): hand the task back unfinished, not counted as a failure, once its
            # lock is released, so the next claimer finds the lock free (unless its send outlives the stop).
            if flight.lock is not None and self.lock_pool is not None:
                # A second cancellation (asyncio.run cancels every task at a program's exit, the node
                # its slots; an anyio shield stops neither) may cut this wait, never the hand-back.
                with anyio.CancelScope(shield=True), contextlib.suppress(asyncio.CancelledError):
                    await self.lock_pool.released(flight.lock.name)
            await self._settler.hand_back_shielded(flight)
            raise

    def _lock_wait_s(self, flight: Flight) -> float | None:
        """How long ``flight``'s task may wait for its lock: ``lock_wait_s``, cut at its lease's local deadline.

        Returns:
            The wait, or None when that deadline has passed already (the lease is then lost,
            see :func:`~asynccoord.node.send.lease_ran_out`).
        """
        left_s = flight.lease_deadline - time.monotonic()
        if left_s <= 0:
            lease_ran_out(self.store, self.node_id, flight, "before its lock was taken")
            return None
        return min(self.config.lock_wait_s, left_s)

    async def _lock_wait_over(self, flight: Flight) -> None:
        """No lock (or permit) came within the wait: hand the task back.

        After ``busy_requeue_s`` (its lock stayed busy, not counted as a failure), or at once
        when the wait was cut by its lease's local deadline (the lease is then lost, see
        :func:`~asynccoord.node.send.lease_ran_out`).

        Raises:
            StoreError: the store failed.
        """
        if time.monotonic() >= flight.lease_deadline:
            lease_ran_out(self.store, self.node_id, flight, "while it waited for its lock")
            await self._hand_back_lapsed(flight)
        else:
            if flight.state is FlightState.CLAIMED:  # given up by choice: a renewal meanwhile loses nothing
                flight.move(FlightState.LOCK_BUSY)
            await self._settler.hand_back(flight.task, delay_s=self.config.busy_requeue_s)

    async def _hand_back_lapsed(self, flight: Flight) -> None:
        """Hand back, unsent, the task of ``flight`` whose lease ran out locally (``LEASE_LOST -> UNSENT``),
        claimable at once if the store still holds the lease for it (raises StoreError: the store failed)."""
        flight.move(FlightState.UNSENT)  # nothing was sent: nothing more to hand back on the way out
        await self._settler.hand_back(flight.task, delay_s=0.0)

    def _lock_name(self, task: Task) -> str | None:
        """The lock ``lock_key`` names for ``task`` (None: no lock), checked like any lock name."""
        if not self._ablation.locks or self.lock_key is None:
            return None
        name = self.lock_key(task)
        return None if name is None else check_user_lock_name("lock_key(task)", name)

    def _pool(self) -> LockPool:
        if self.lock_pool is None:
            self.lock_pool = LockPool(self.lock_store, ttl_s=self.config.lock_ttl_s, holder=self.node_id)
            self._own_pool = True
        return self.lock_pool

    def _exiting(self, carried: ProcessExiting, *, stop: bool = False) -> ProcessExiting:
        """Record the process exit (the first one), and with ``stop`` stop the pipeline for it; return ``carried``.

        Recorded, not only raised: during a drain (a signal, ``shutdown()``, ``stop_claiming()``)
        the node's last hand-back sets it drained and the pipeline ends before the exception
        has come up through the claim's task; :meth:`run_hosted` raises it then.
        """
        self._claiming = False  # the process is ending: claim nothing more (the exit is on its way up)
        self._stopped.set()
        if self._exit is None:
            self._exit = carried
            if stop and self._scope is not None:
                self._scope.cancel()
        return carried

    def _continues(self, flight: Flight) -> bool:
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

    def _adopt(self, task: Task, started: float, chain: int) -> Flight:
        """Take ``task`` (leased by a commit at or after ``started``) in flight, in its predecessor's slot."""
        flight = Flight(task=task, lease_deadline=lease_deadline(started, self.config.lease_s), chain=chain)
        self._in_flight.hold(flight)
        self._drained.clear()
        self._state.claimed += 1
        self._state.continued += 1
        return flight

    # --- keeper: lease and lock renewal ---------------------------------------------------
