"""The runtime: many nodes in one process, their membership, and graceful shutdown.

A :class:`Runtime` hosts a process's nodes over one store: it keeps them in the
membership that shares the partitions, wakes its idle nodes with one process-wide poll
(:class:`~asynccoord.node.idlepoll.IdlePoller`), and on shutdown drains the sends in
flight and hands the rest back to the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Self

import anyio
import anyio.abc

from .._errtext import error_text
from .._exits import ProcessExiting, carried_exit
from .._printable import printable
from .._signals import check_signals, give_back_signal, signal_name, take_signal
from ..errors import InvalidArgumentError, InvalidTypeError, RuntimeStateError
from ..locks.pool import LockPool
from ..membership import Membership
from ..models import TaskStatus
from ..validation import (
    check_callback,
    check_int,
    check_interval_s,
    check_lease_s,
    check_lock_store,
    check_name,
    check_positive,
    check_send,
)
from . import running
from .ablation import FULL, Ablation
from .config import NodeConfig
from .drainhint import held_behind_dead
from .idlepoll import IdlePoller
from .node import LockKeyFn, Node, failure_of
from .retention import DEFAULT_DONE_RETENTION_S, DEFAULT_PURGE_INTERVAL_S, Retention
from .send import SendFn
from .status import NodeState

__all__ = ("Runtime",)

log = logging.getLogger(__name__)

DEFAULT_NODES = 8
"""Nodes a :class:`Runtime` hosts when given neither ``nodes`` nor ``node_ids``."""

_SETTLE_BACKGROUND_S = 5.0
"""Longest wait at shutdown for the store's background hand-backs (see ``settle_background``)."""


class Runtime:
    """Hosts ``nodes`` nodes of one process over one store.

    ::

        async with Runtime(store, send=send, nodes=8, config=NodeConfig(queue="outbox"),
                           lock_key=lambda t: f"account:{t.payload['account']}") as runtime:
            await runtime.wait_for_signal()        # or run until you call runtime.shutdown()

    On shutdown (leaving the ``async with`` normally, :meth:`shutdown`, or SIGTERM /
    SIGINT under :meth:`wait_for_signal`) every node stops claiming at once, sends in
    flight may finish for up to ``shutdown_timeout_s``, then whatever is left is cancelled
    and handed back to ``pending`` with its lease and lock released, so another process
    picks it up at once instead of waiting for a TTL. A send that still runs then (it
    ignored its cancellation past its cleanup time) keeps its task lease and lock, left
    to lapse at their TTLs, unrenewed (``asynccoord.node.send_outlived_shutdown``), so
    nothing else is sent under its lock, nor its task again, until then. Nodes leave the
    membership last.
    A Runtime runs once, as a thread does (see :meth:`start`), and a :meth:`shutdown`
    before its start ends it too: a stop requested early is never lost. Such a shutdown
    changes nothing else (no node has joined, the store stays open and the node ids free),
    so a ``finally: await runtime.shutdown()`` around code that failed before the start is
    harmless; a new attempt creates a new Runtime.

    A node that fails stops the runtime: the other nodes are cancelled (their tasks handed
    back), and ``shutdown``, ``wait_for_signal``, ``wait_until_drained`` and leaving the
    ``async with`` raise the failure. An asynccoord error comes out as itself, unwrapped
    (the first one when several nodes failed at once, e.g. the
    :class:`~asynccoord.errors.StoreFileReplacedError` they all met); only a failure that
    includes another exception (a defect) comes out as the task group's ``ExceptionGroup``,
    whole, so nothing of it is lost. A task row the store cannot decode is no failure: the
    claim dead-letters it (:class:`~asynccoord.errors.UnreadableRowError`, the
    ``unreadable_task`` event) and the nodes go on.

    Several queues may share one store, each drained by its own Runtime: a runtime makes
    its membership for its own queue (``Membership(store, queue=...)``), so it shares the
    partitions only among the nodes of that queue.

    Idle nodes do not poll one by one: the runtime's one
    :class:`~asynccoord.node.idlepoll.IdlePoller` reads which of its idle nodes'
    partitions hold claimable work and wakes only their owners, so a process's idle cost
    does not grow with its node count. A store without ``claimable_partitions`` leaves
    every node polling by itself.

    Args:
        store: The store (queue, lock and membership contracts), already open.
        send: ``async def send(task) -> result`` called once per delivery (a plain
            function is accepted, with the caveats given in :class:`~asynccoord.node.node.Node`;
            an async generator function is refused with ``InvalidTypeError``).
        nodes: Number of nodes (1 to 4096). Default ``len(node_ids)`` when ``node_ids`` is
            given, else 8 (:data:`DEFAULT_NODES`). Given with ``node_ids``, it must equal
            ``len(node_ids)``. More nodes do not drain faster: in an ordered queue a
            conversation's messages go one at a time, and so do an account's sends under a
            ``lock_key`` (``benchmarks/contention.py`` drains as fast with 16 nodes as with 64);
            the process's event loop and SQLite's thread share the GIL, so for more than
            about one core run more processes on the same file or database.
        config: :class:`~asynccoord.node.config.NodeConfig` shared by the nodes.
        lock_key: Maps a task to the lock it needs (None: no lock). Default None.
        node_ids: Explicit node ids (reuse them across restarts to keep affinity), used
            as given. Default ``"<host>-<pid>-<random>-<n>"`` (:attr:`instance_id` then
            ``0..nodes-1``): the 6 random hex digits are new for every Runtime, so two
            runtimes of one process never share a node id.
        heartbeat_ttl_s: A node whose heartbeat is older than this is dead, by the
            store clock, seconds (0.01, ``validation.MIN_LEASE_S``, to one year). Default 5.
        heartbeat_interval_s: Seconds between heartbeats (>= 0.001, ``validation.MIN_INTERVAL_S``,
            and < ``heartbeat_ttl_s``). Default ``heartbeat_ttl_s / 3``.
        shutdown_timeout_s: How long in-flight sends may finish at shutdown. Default 10.
        lock_store: Where the nodes' locks live, if not in ``store`` (e.g. a
            :class:`~asynccoord.backends.redis.RedisLockStore` beside a PostgreSQL
            queue); commits are still fenced by ``store``. Default None (``store``).
        done_retention_s: The runtime deletes its queue's done tasks older than this, by the
            store clock, seconds (see :mod:`asynccoord.node.retention`). Default one day;
            None keeps them. Dead tasks are never deleted, and the processed-message
            records that recognise redeliveries follow their own retention
            (``StoreConfig.processed``), purged by the same loop.
        purge_interval_s: Mean seconds between two purges. Default 60.
        _ablation: Layers switched off in every node, for benchmarks only (see
            :mod:`asynccoord.node.ablation`). Default: every layer on.

    Attributes:
        instance_id: ``"<host>-<pid>-<6 random hex digits>"``, new for every Runtime: the
            prefix of default node ids, the holder recorded on the runtime's locks, and the
            ``runtime`` of its nodes' heartbeat info (with ``queue``, ``host`` and ``pid``).
            Give it as a :class:`~asynccoord.monitor.monitor.Monitor`'s ``process_id`` and
            ``status`` shows the process under the id its nodes and locks carry.
        idle_poller: The :class:`~asynccoord.node.idlepoll.IdlePoller` that wakes the idle
            nodes (its ``polls`` and ``woken`` count its work), or None when the store has
            no ``claimable_partitions`` (each node then polls by itself).
        retention: The :class:`~asynccoord.node.retention.Retention` that purges aged done
            tasks and processed records (its ``purges``, ``tasks_deleted`` and
            ``records_deleted`` count its work), or None for a store that cannot purge.

    Raises:
        InvalidArgumentError, InvalidTypeError: bad arguments, ``nodes`` and ``node_ids``
            that disagree included; nothing is joined or written.
    """

    def __init__(
        self,
        store: Any,
        *,
        send: SendFn,
        nodes: int | None = None,
        config: NodeConfig | None = None,
        lock_key: LockKeyFn | None = None,
        node_ids: Sequence[str] | None = None,
        heartbeat_ttl_s: float = 5.0,
        heartbeat_interval_s: float | None = None,
        shutdown_timeout_s: float = 10.0,
        lock_store: Any = None,
        done_retention_s: float | None = DEFAULT_DONE_RETENTION_S,
        purge_interval_s: float = DEFAULT_PURGE_INTERVAL_S,
        _ablation: Ablation = FULL,
    ) -> None:
        check_send(send)
        if config is not None and not isinstance(config, NodeConfig):
            raise InvalidTypeError(f"config must be a NodeConfig, got {type(config).__name__}")
        # Unique per Runtime instance: two runtimes of one process never share node ids.
        self.instance_id = f"{socket.gethostname()[:200]}-{os.getpid()}-{secrets.token_hex(3)}"
        count = None if nodes is None else check_int("nodes", nodes, minimum=1, maximum=4096)
        if node_ids is None:
            ids = [f"{self.instance_id}-{n}" for n in range(DEFAULT_NODES if count is None else count)]
        else:
            if isinstance(node_ids, str) or not isinstance(node_ids, Sequence):
                raise InvalidTypeError(f"node_ids must be a sequence of str, got {type(node_ids).__name__}")
            ids = [check_name(f"node_ids[{index}]", n) for index, n in enumerate(node_ids)]
            if not ids or len(set(ids)) != len(ids):
                raise InvalidArgumentError(f"node_ids must be non-empty and distinct, got {list(node_ids)!r}")
            if count is not None and count != len(ids):
                raise InvalidArgumentError(
                    f"nodes={count} disagrees with len(node_ids)={len(ids)}: give node_ids alone (it sets the count)"
                )
        self.store = store
        self.config = config or NodeConfig()
        self.heartbeat_ttl_s = check_lease_s("heartbeat_ttl_s", heartbeat_ttl_s)
        self.heartbeat_interval_s = (
            None if heartbeat_interval_s is None else check_interval_s("heartbeat_interval_s", heartbeat_interval_s)
        )
        if self.heartbeat_interval_s is not None and self.heartbeat_interval_s >= self.heartbeat_ttl_s:
            # Checked here, not only by Membership, so the error names the arguments given here.
            raise InvalidArgumentError(
                f"heartbeat_interval_s must be < heartbeat_ttl_s ({heartbeat_ttl_s!r}) so nodes beat before "
                f"they expire, got {heartbeat_interval_s!r}"
            )
        self.shutdown_timeout_s = check_positive("shutdown_timeout_s", shutdown_timeout_s)
        self.membership = Membership(
            store, ttl_s=self.heartbeat_ttl_s, interval_s=self.heartbeat_interval_s, queue=self.config.queue
        )
        if lock_store is not None:
            check_lock_store("lock_store", lock_store)  # before the lock pool names it "store"
        self.lock_store = store if lock_store is None else lock_store
        self.lock_pool = LockPool(self.lock_store, ttl_s=self.config.lock_ttl_s, holder=self.instance_id)
        pollable = callable(getattr(store, "claimable_partitions", None))
        self.nodes = [
            Node(
                store,
                send,
                node_id=node_id,
                config=self.config,
                lock_key=lock_key,
                membership=self.membership,
                lock_pool=self.lock_pool,
                lock_store=self.lock_store,
                idle_poll=not pollable,
                _ablation=_ablation,
            )
            for node_id in ids
        ]
        self.idle_poller = (
            IdlePoller(store, self.nodes, self.config, membership=self.membership, _ablation=_ablation)
            if pollable
            else None
        )
        purgeable = all(callable(getattr(store, name, None)) for name in ("purge_finished", "purge_processed"))
        retention = Retention(
            store, self.config.queue, done_retention_s=done_retention_s, interval_s=purge_interval_s
        )  # checks the arguments even for a store that cannot purge
        self.retention = retention if purgeable else None
        self._runner: asyncio.Task[None] | None = None
        self._started: asyncio.Future[None] | None = None
        self._stopping: asyncio.Event | None = None
        self._stop_request: asyncio.Event | None = None
        self._graceful = True
        self._drain_s = self.shutdown_timeout_s
        self._drain_scope: anyio.CancelScope | None = None
        self._hurried = False
        self._closed = False
        self._exit: ProcessExiting | None = None  # a send's KeyboardInterrupt or SystemExit, in this runtime or another
        self._held_hinted = False  # wait_until_drained said once that a 'hold' policy may keep it waiting

    def __repr__(self) -> str:
        return f"<Runtime {self._stage()} nodes={len(self.nodes)} queue={self.config.queue!r}>"

    def _node_info(self) -> dict[str, Any]:
        """The heartbeat info of each node: its queue, and where it runs (``status`` groups nodes by it)."""
        host = socket.gethostname()
        return {"queue": self.config.queue, "host": host, "pid": os.getpid(), "runtime": self.instance_id}

    def _stage(self) -> str:
        """``new``, ``starting``, ``running``, ``stopping`` or ``stopped``."""
        runner, started = self._runner, self._started
        if runner is None:
            return "stopped" if self._closed else "new"
        if runner.done():
            return "stopped"
        if self._closed:
            return "stopping"
        return "running" if started is not None and started.done() else "starting"

    def _start_failed(self) -> bool:
        started = self._started
        return started is not None and started.done() and not started.cancelled() and started.exception() is not None

    def _spent(self) -> RuntimeStateError:
        """The error of a start after this runtime's one run (or after a shutdown before it)."""
        failed = self._started.exception() if self._started is not None and self._start_failed() else None
        if self._runner is None:
            why = "shutdown() was called before it ever started"
        elif failed is not None:
            why = f"its start failed ({type(failed).__name__}: {failed})"
        elif self._closed:
            why = "it already ran and was shut down"
        else:
            why = "it already ran and stopped by itself (a node failed: see states())"
        error = RuntimeStateError(
            f"{self!r} cannot start: {why}. A Runtime runs once: create a new Runtime"
            " (the same node_ids keep the nodes' partitions)"
        )
        error.__cause__ = failed
        return error

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            await self.shutdown()
        else:
            await self._close(graceful=False)

    async def start(self) -> None:
        """Join the membership and start every node's pipeline.

        The nodes run in a task of their own, so :meth:`shutdown` may be called from any
        task (a signal handler's, a ``wait_for`` wrapper's...).

        A Runtime runs once. A ``start()`` while it is starting or running (``await
        runtime.start()`` inside ``async with runtime``, two tasks starting it at once)
        starts nothing more: it returns once the first start has (raising what that start
        raised). Any later start raises :class:`~asynccoord.errors.RuntimeStateError`.

        A cancellation of the task in ``start()`` stops what started (the nodes hand back
        what they claimed, without a drain) and the runtime counts as shut down.

        Raises:
            RuntimeStateError: the runtime cannot run again, nothing was started: it was shut
                down (:meth:`shutdown` was called, even before any start), it ran and stopped
                by itself (a node failed), or its start failed (the error is the cause).
            StoreError: the first heartbeat failed (nothing is left running).
            CancelledError: the task was cancelled while starting (nothing is left running
                once the runtime's own task has handed back, which this waits for unless
                cancelled again).
        """
        if self._closed or (self._runner is not None and self._runner.done()):
            raise self._spent()
        if self._started is not None:
            await asyncio.shield(self._started)  # started or starting: one runner only
            if self._closed:  # the start it joined was cancelled (or a shutdown came meanwhile)
                raise self._spent()
            return
        loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._stop_request = asyncio.Event()
        started: asyncio.Future[None] = loop.create_future()
        self._started = started
        self._runner = loop.create_task(self._run(started), name="asynccoord-runtime")
        self._runner.add_done_callback(self._runner_done)
        try:
            await asyncio.shield(started)
        except asyncio.CancelledError:
            # The caller gave up on the start (a timeout around it, Ctrl-C): stop what started,
            # without a drain, so no runtime goes on without an owner, and wait for that (a
            # second cancellation ends the wait, not the stop); then the cancellation goes on.
            self._hurry()
            self._request_close(graceful=False)
            try:
                with contextlib.suppress(Exception):  # the start's own error, if any, is not the news here
                    await asyncio.shield(self._runner)
            except ProcessExiting as carried:
                carried.reraise()
            raise

    def _runner_done(self, runner: asyncio.Task[None]) -> None:
        if self._stopping is not None:
            self._stopping.set()
        if not runner.cancelled():
            # Seen here: _run has logged it (asynccoord.runtime.failed or process_exit), and the
            # waiters raise it. A runtime stopped by another's exit whose waiter was cancelled by the
            # event loop's end would log "Task exception was never retrieved" with our internal type.
            runner.exception()

    async def _run(self, started: asyncio.Future[None]) -> None:
        """The runtime's own task: membership, the nodes' task group, and the shutdown sequence.

        A node that fails (e.g. the store was closed under it) ends this task: the other
        nodes are cancelled (their tasks handed back if the store allows), the membership
        is left, and the node's error, unwrapped from the task group's ExceptionGroup when
        it is an asynccoord error, is raised to whoever awaits the runtime (``shutdown``,
        ``wait_for_signal``, leaving ``async with``).
        """
        failure: BaseException | None = None
        try:
            for node in self.nodes:
                self.membership.join(node.node_id, info=self._node_info())
            running.enlist(self, self._stop_for_exit)
            async with self.membership, anyio.create_task_group() as tg:
                for node in self.nodes:
                    # A send's KeyboardInterrupt or SystemExit comes out as ProcessExiting (see _exits):
                    # raised in this task it would end the event loop before the other nodes hand back.
                    tg.start_soon(node.run_hosted, name=f"asynccoord-node-{node.node_id}")
                if self.idle_poller is not None:
                    tg.start_soon(self.idle_poller.run, name="asynccoord-idle-poll")
                if self.retention is not None:
                    tg.start_soon(self.retention.run, name="asynccoord-retention")
                started.set_result(None)
                assert self._stop_request is not None
                await self._stop_request.wait()
                for node in self.nodes:
                    node.stop_claiming()
                if self._graceful:
                    with anyio.move_on_after(self._drain_s) as drain:
                        self._drain_scope = drain  # _hurry() ends the drain early
                        await asyncio.gather(*(node.wait_drained() for node in self.nodes))
                    self._drain_scope = None
                left = sum(node.in_flight for node in self.nodes)
                if left:
                    log.warning("asynccoord.runtime.shutdown_cancel in_flight=%d", left)
                tg.cancel_scope.cancel()  # nodes hand their in-flight tasks back, shielded
        except BaseException as exc:
            carried = carried_exit(exc)
            if carried is not None:  # the others were cancelled: all handed back; the waiters raise the original
                log.warning("asynccoord.runtime.process_exit error=%s", printable(error_text(carried.exit)))
                self._exit = carried
                await running.stop_all(carried, besides=self)
                raise carried from None
            failure = failure_of(exc)
            error = exc if failure is None else failure
            if not started.done():
                started.set_exception(error)
                if isinstance(error, Exception):
                    return  # reported to start()'s caller
            if failure is not None:
                log.error("asynccoord.runtime.failed error=%s", printable(error_text(failure)))
            if failure is None or failure is exc:
                raise
        finally:
            running.leave(self)
            with anyio.CancelScope(shield=True):
                await self.lock_pool.aclose()
                settle = getattr(self.store, "settle_background", None)
                if callable(settle):  # claims cut by the shutdown are handed back in the background
                    await settle(_SETTLE_BACKGROUND_S)
        if failure is not None:
            raise failure
        if self._exit is not None:  # another runtime's send raised it: stopped for it, raised to our waiters too
            raise self._exit

    def states(self) -> list[NodeState]:
        """A snapshot of every node's counters."""
        return [node.state() for node in self.nodes]

    async def shutdown(self, timeout_s: float | None = None) -> None:
        """Stop claiming, let sends finish for ``timeout_s`` (default ``shutdown_timeout_s``), hand back the rest.

        Idempotent and callable from any task; returns when every node has stopped and
        left the membership. Called before :meth:`start` (a signal handler that ran
        early, or a ``finally`` around code that failed before the start), it returns at
        once, touches neither the store nor the membership, and the runtime will not start:
        a later :meth:`start`, ``async with``, :meth:`wait_for_signal` or
        :meth:`wait_until_drained` raises :class:`~asynccoord.errors.RuntimeStateError`
        (saying so) instead of running, so the stop is not lost.

        Cancelled while the nodes drain (the task leaving ``async with`` is cancelled,
        say), it ends the drain at once: the nodes hand back what they hold, which it waits
        for (unless cancelled again) before the cancellation goes on, so a store closed
        next is closed after the hand-back.

        Raises:
            StoreClosedError: the store was closed while the nodes ran (each failed node
                says ``failed`` in :meth:`states`).
            Exception: whatever else made a node fail, if one did.
            KeyboardInterrupt, SystemExit: a send (or ``lock_key``) raised it, here or in
                another runtime of this process's event loop: every runtime of the loop
                stopped, every node as if cancelled (what they held handed back, nothing
                counted as a failure), and each raises it to whoever awaits it.
            CancelledError: the calling task was cancelled (see above).
        """
        if timeout_s is not None:
            check_positive("timeout_s", timeout_s)
        await self._close(graceful=True, timeout_s=timeout_s)

    def _request_close(self, *, graceful: bool, timeout_s: float | None = None) -> None:
        """Tell the runner to stop (once): stop claiming, then drain (``graceful``) or hand back at once."""
        if self._closed:
            return
        self._closed = True
        self._graceful = graceful and not self._hurried  # a second signal may have come first
        self._drain_s = self.shutdown_timeout_s if timeout_s is None else timeout_s
        if self._stopping is not None:
            self._stopping.set()
        for node in self.nodes:
            node.stop_claiming()
        if self._stop_request is not None:
            self._stop_request.set()

    async def _close(self, *, graceful: bool, timeout_s: float | None = None) -> None:
        runner = self._runner
        self._request_close(graceful=graceful, timeout_s=timeout_s)
        if runner is None:
            return
        try:
            await asyncio.shield(runner)
        except ProcessExiting as carried:
            carried.reraise()
        except asyncio.CancelledError:
            if runner.done():
                raise
            # Cancelled while the nodes drain (the task leaving `async with` was cancelled,
            # say): no more drain time. The nodes hand back what is in flight now, and this
            # waits for that, so that what the caller closes next (the store) is closed after
            # it; a second cancellation ends the wait, not the hand-back.
            self._hurry()
            try:
                with contextlib.suppress(Exception):  # a node's failure is not the news here
                    await asyncio.shield(runner)
            except ProcessExiting as carried:  # a send's KeyboardInterrupt or SystemExit is
                carried.reraise()
            raise

    def _hurry(self) -> None:
        """End the graceful drain now (or skip it): the nodes hand back what they hold."""
        self._hurried = True
        self._graceful = False
        drain = self._drain_scope
        if drain is not None:
            drain.cancel()

    def _stop_for_exit(self, carried: ProcessExiting, loop: asyncio.AbstractEventLoop) -> asyncio.Task[None] | None:
        """The process is ending (a send of another runtime or node raised ``carried``): stop without a drain.

        Only a runtime of ``loop`` not stopping for an exit already; its waiters then raise the
        same exit (see :func:`asynccoord.node.running.stop_all`, which calls this).

        Returns:
            The runtime's task, to wait for its hand-backs; None when there is nothing to wait for.
        """
        runner = self._runner
        if self._exit is not None or runner is None or runner.get_loop() is not loop:
            return None
        self._exit = carried
        self._hurry()
        self._request_close(graceful=False)
        return None if runner.done() else runner

    async def wait_for_signal(self, signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT)) -> int:
        """Run until one of ``signals`` arrives (or :meth:`shutdown` is called), then shut down.

        Also returns when the runtime stops by itself (a node failed), raising as
        :meth:`shutdown` does; called after the runtime stopped, it returns 0 at once.

        For the wait, each signal gets a handler of the running event loop
        (``loop.add_signal_handler``), and when the wait ends (a signal, a shutdown, or the
        waiting task cancelled) the handler the signal had before is put back:

        * a handler installed with ``signal.signal`` (a function, ``SIG_IGN``, ``SIG_DFL``,
          ``asyncio.run``'s SIGINT handler that cancels the main task) is reinstalled;
        * a signal the event loop already handles (the application called
          ``loop.add_signal_handler`` for it, e.g. for a graceful shutdown of its own) is
          not taken at all: asyncio has no way to read such a handler back (uvloop's is
          not even visible), so that handler keeps the signal during the wait and after,
          and the wait does not end on it (logged as
          ``asynccoord.runtime.signal_left``); let that handler call :meth:`shutdown`;
        * a handler installed by C code (``signal.getsignal`` gives None) cannot be
          reinstalled: the signal gets its default back.

        The handlers stay in place until the shutdown is over: a second signal during the
        drain ends the drain at once (the nodes hand back what they hold; logged as
        ``asynccoord.runtime.signal_again``) instead of killing the process. Several runtimes
        waiting in one process share one handler per signal: a signal stops them all.

        No handler is installed outside the main thread or where the loop cannot handle
        signals (Windows): the wait then ends only with :meth:`shutdown`.

        Args:
            signals: The signal numbers to wait for. Default ``(SIGTERM, SIGINT)``.

        Returns:
            The signal number received, or 0 when shut down otherwise.

        Raises:
            InvalidTypeError, InvalidArgumentError: ``signals`` is not a sequence of signal
                numbers of this platform that can be handled (not SIGKILL or SIGSTOP);
                nothing is installed.
            RuntimeStateError: the runtime was never started, or its start failed.
            StoreClosedError, Exception: as :meth:`shutdown`, when a node failed.
            KeyboardInterrupt, SystemExit: as :meth:`shutdown`, when a send raised it.
        """
        signums = check_signals(signals)
        loop = asyncio.get_running_loop()
        received: list[int] = []
        stopping = self._stopping
        if stopping is None:
            why = "shutdown() was called before it started" if self._closed else "it is not started"
            raise RuntimeStateError(f"{self!r} cannot wait for a signal: {why}; use 'async with Runtime(...)'")
        if self._start_failed():
            raise self._spent()  # its start failed: there is nothing to wait for

        def on_signal(signum: int) -> None:
            if received:  # a second signal during the drain: no more drain time
                log.warning("asynccoord.runtime.signal_again signal=%s: handing back now", signal_name(signum))
                self._hurry()
                return
            received.append(signum)
            stopping.set()

        taken: list[int] = []
        try:
            taken = [signum for signum in signums if take_signal(loop, signum, on_signal)]
            await stopping.wait()
            if self._start_failed():  # it failed while starting: nothing ran, nothing to shut down
                raise self._spent()
            await self.shutdown()  # the handlers stay: a second signal hurries the drain, never kills
        finally:
            for signum in reversed(taken):
                give_back_signal(loop, signum, on_signal)
        return received[0] if received else 0

    async def wait_until_drained(
        self,
        *,
        timeout_s: float,
        poll_s: float = 0.05,
        predicate: Callable[[dict[TaskStatus, int]], bool] | None = None,
    ) -> bool:
        """Wait until the queue has nothing pending or running (or ``predicate(counts)`` holds).

        Without ``predicate`` each poll is ``store.is_drained`` (an index probe); with one,
        ``store.stats`` of the queue: on SQLite and PostgreSQL each status is counted in its
        partial index, never the task rows, but the done tasks' index is walked, so a poll costs
        in proportion to the done tasks kept (about 60 ms a million on SQLite, on the store's
        connection): purge them (the runtime's ``done_retention_s``) or poll slowly on a large store.

        Args:
            timeout_s: Longest wait, seconds (> 0).
            poll_s: Seconds between polls (>= 0.001, ``validation.MIN_INTERVAL_S``).
                Default 0.05.
            predicate: A plain function called with the queue's counts per status; the
                wait ends when it returns True. Default None (nothing pending or running).

        Tasks no node will claim keep the queue from draining, and the wait then times out:
        delayed tasks (``delay_s``) until they are due, and, under the ``hold`` dead-letter
        policy (``store.set_dead_letter_policy``), the later tasks of each conversation whose
        earliest unfinished task is dead, until that task is requeued or discarded
        (``store.dead_letters`` lists them). The first wait of the runtime that times out
        with dead and pending tasks under ``hold`` says so in a warning,
        ``asynccoord.runtime.drain_held``, with the queue's dead and pending counts (read
        after the timeout, in at most ``drainhint.HINT_WAIT_S``, 1 s, more).

        Returns:
            True when drained, False when ``timeout_s`` passed first.

        Raises:
            InvalidArgumentError, InvalidTypeError: a bad ``timeout_s`` or ``poll_s``, or a
                ``predicate`` that is not a plain function (an ``async def`` included).
            StoreClosedError, Exception: the runtime stopped by itself (a node failed) during
                the wait: its failure, as :meth:`shutdown` raises it, at the next poll
                instead of after ``timeout_s`` (nothing drains the queue any more).
            RuntimeStateError: the runtime was never started (nothing would drain the queue),
                or its start failed (the error is the cause).
            KeyboardInterrupt, SystemExit: a send raised it (as :meth:`shutdown`), at the
                next poll.
        """
        check_positive("timeout_s", timeout_s)
        check_interval_s("poll_s", poll_s)
        if predicate is not None:
            check_callback("predicate", predicate)
        if self._stopping is None:
            why = "shutdown() was called before it started" if self._closed else "it is not started"
            raise RuntimeStateError(f"{self!r} cannot wait until drained: {why}; use 'async with Runtime(...)'")
        queue = self.config.queue
        with anyio.move_on_after(timeout_s):
            while True:
                if predicate is None:
                    if await self.store.is_drained(queue):
                        return True
                elif predicate((await self.store.stats(queue)).counts):
                    return True
                if self._start_failed():
                    raise self._spent()  # nothing ran, nothing will drain
                runner = self._runner
                if runner is not None and runner.done() and not runner.cancelled() and runner.exception() is not None:
                    try:
                        runner.result()  # the failure, with the runner's traceback (a `raise` would add ours each time)
                    except ProcessExiting as carried:
                        carried.reraise()
                await anyio.sleep(poll_s)
        if self.config.ordered and not self._held_hinted:
            held = await held_behind_dead(self.store, queue)
            if held is not None:
                self._held_hinted = True
                log.warning(
                    "asynccoord.runtime.drain_held queue=%r dead=%d pending=%d: the queue's 'hold' dead-letter policy"
                    " keeps conversations waiting behind their dead tasks until these are requeued or discarded"
                    " (store.dead_letters lists them)",
                    queue,
                    *held,
                )
        return False
