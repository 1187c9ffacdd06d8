"""Node membership of a process: heartbeats, the view of live nodes, partition ownership.

One :class:`Membership` per process and store heartbeats for all the process's nodes in
one write, keeps the view of live nodes as the store's clock judges them, and assigns
partitions by rendezvous hashing over the live node ids
(:func:`asynccoord.partition.owned_partitions`).

The membership's parts: this module holds :class:`Membership`, its settings, its nodes'
join and leave, the subscriptions to its view and its life cycle; the heartbeats are
:mod:`asynccoord.membershipbeats`, the live view and the partitions it assigns
:mod:`asynccoord.membershipview`, what a change of the view counts and logs (changes, lost
nodes, flaps) :mod:`asynccoord.membershipchanges`, and the counters
:mod:`asynccoord.membershipstats`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Self

import anyio

from .contract.membership import MembershipStore
from .errors import (
    UNRECOVERABLE_STORE_ERRORS,
    CoordError,
    InvalidArgumentError,
    InvalidTypeError,
    ReadOnlyStoreError,
)
from .membershipbeats import LocalNode as _Local
from .membershipbeats import MembershipHeartbeats
from .membershipchanges import FLAP_TTLS, MembershipChanges
from .membershipstats import MembershipStats
from .membershipview import MembershipLiveView, MembershipView
from .partition import RendezvousTable
from .validation import (
    check_callback,
    check_int,
    check_interval_s,
    check_lease_s,
    check_name,
    check_non_negative,
    encode_payload,
)

__all__ = ("FLAP_TTLS", "LEAVE_TIMEOUT_S", "Membership", "MembershipStats", "MembershipView")

log = logging.getLogger(__name__)

LEAVE_TIMEOUT_S = 5.0
"""Most seconds the exit of a :class:`Membership` waits for its nodes' leave (shielded);
a member that could not leave is dead anyway once its ``ttl_s`` passes."""

_NOTHING_WRITTEN = (*UNRECOVERABLE_STORE_ERRORS, ReadOnlyStoreError)
"""Errors of a first heartbeat that wrote nothing: no node joined, so none is told to leave."""

_NEW, _RUNNING, _CLOSING, _CLOSED = "new", "running", "closing", "closed"


class Membership(MembershipHeartbeats, MembershipLiveView, MembershipChanges):
    """Heartbeats and the live-node view of every node of one process.

    One :class:`Membership` per process and store serves every node of the process::

        async with Membership(store, ttl_s=5.0) as membership:
            incarnation = membership.join("bot-1", info={"host": "a"})
            membership.owned_partitions("bot-1")   # what bot-1 should claim from
            ...

    A background task writes one heartbeat per ``interval_s`` for *all* joined nodes
    (one ``store.heartbeat`` call, one transaction) and keeps :attr:`Membership.view`, the
    live members as the store saw them. Liveness is judged by the store's clock: a node
    whose last heartbeat is older than its ``ttl_s`` by the store clock is dead for
    everyone, whatever the local clocks read. Local timers use ``time.monotonic()`` only.

    Each :meth:`Membership.join` gets a new random *incarnation*: a restarted process that
    reuses a node id is a new life of it, and the leave of the old life never removes the
    new one (the store's ``leave`` is a compare-and-set on the incarnation). Leases of
    tasks and locks belong to their own tokens, never to node ids, so a restart never
    makes the dead process's leases look alive.

    When heartbeats fail (:class:`~asynccoord.errors.StoreError`), the task keeps retrying
    each interval and logs ``asynccoord.membership.heartbeat_failed``; once the last
    successful heartbeat was *sent* more than ``ttl_s`` ago (local monotonic clock),
    :attr:`Membership.healthy` turns False: the others may consider this process dead and
    give its partitions away, so its nodes must stop claiming until a heartbeat succeeds.
    The request was sent before the store stamped it, so the store cannot expire the
    member before the local deadline passes (both clocks running at the same rate).

    Partition ownership is rendezvous hashing over the live node ids
    (:func:`asynccoord.partition.owned_partitions`); local joined nodes always count as live.

    Use as ``async with Membership(store) as membership:``. The first heartbeat runs
    inside ``__aenter__``, so :attr:`view` is ready when the block starts. On exit the
    heartbeat task is stopped and every joined node leaves (shielded from
    cancellation, bounded by :data:`LEAVE_TIMEOUT_S`). A Membership is entered once.

    Args:
        store: A store with the membership primitives (``SQLiteStore``, ``MemoryStore``).
        ttl_s: Seconds (0.01, ``validation.MIN_LEASE_S``, to one year) a node stays live after a
            heartbeat (store clock). Default 5.
        interval_s: Seconds (>= 0.001, ``validation.MIN_INTERVAL_S``, and < ``ttl_s``) between
            heartbeats. Default ``ttl_s / 3``, so two heartbeats may fail before the others see the nodes die.
        queue: Only members whose heartbeat ``info`` names this ``"queue"`` (as a
            :class:`~asynccoord.node.runtime.Runtime`'s nodes do), and the nodes joined here, are
            in :attr:`view` and share the partitions: nodes draining another queue of the
            same store are not counted, or they would own partitions of this queue that
            they never claim. Default None: every live member.

    Raises:
        InvalidTypeError: ``store`` lacks the membership primitives, or a duration is
            not a number.
        InvalidArgumentError: a duration <= 0 or not finite, ``ttl_s`` below 0.01
            (``validation.MIN_LEASE_S``), ``interval_s`` below 0.001 (``validation.MIN_INTERVAL_S``)
            or >= ``ttl_s``.
    """

    def __init__(
        self, store: MembershipStore, *, ttl_s: float = 5.0, interval_s: float | None = None, queue: str | None = None
    ) -> None:
        if not isinstance(store, MembershipStore):
            raise InvalidTypeError(
                f"store must provide the membership primitives (heartbeat, leave, members), got {type(store).__name__}"
            )
        ttl = check_lease_s("ttl_s", ttl_s)
        interval = ttl / 3 if interval_s is None else check_interval_s("interval_s", interval_s)
        if interval >= ttl:
            raise InvalidArgumentError(
                f"interval_s must be < ttl_s ({ttl_s!r}) so members beat before they expire, got {interval_s!r}"
            )
        self.store = store
        self.ttl_s = ttl
        self.interval_s = interval
        self.queue = None if queue is None else check_name("queue", queue)
        self._state = _NEW
        self._local: dict[str, _Local] = {}
        self._local_changes = 0  # bumped with every change of _local: the key of _live()'s cache
        self._view = MembershipView(members=(), node_ids=(), version=0, taken_at=time.monotonic())
        self._live_cache: tuple[MembershipView, int, tuple[str, ...], frozenset[str]] | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()
        self._listeners: list[Callable[[MembershipView], None]] = []  # see add_listener
        self._io_lock = asyncio.Lock()  # a heartbeat and a leave never overlap
        self._last_ok: float | None = None
        self._heartbeats = 0
        self._failures = 0
        self._consecutive_failures = 0
        self._last_error: Exception | None = None
        self._reported_unhealthy = False
        self._started_at: dict[str, float] = {}  # node id -> started_at of our incarnation, as last seen
        self._flapped: dict[tuple[str, str], float] = {}  # lives counted as flaps -> monotonic time counted
        self._assignment: tuple[tuple[str, ...], Mapping[str, frozenset[int]]] | None = None
        self._table: RendezvousTable | None = None  # the nodes' rendezvous scores, kept between changes

    def __repr__(self) -> str:
        return (
            f"<Membership {self._state} nodes={sorted(self._local)} live={len(self._view.node_ids)}"
            f" version={self._view.version} healthy={self.healthy} ttl_s={self.ttl_s:g}>"
        )

    # --- state ------------------------------------------------------------------------

    @property
    def view(self) -> MembershipView:
        """The live members as of the last heartbeat (version 0 before the first)."""
        return self._view

    @property
    def healthy(self) -> bool:
        """True while the last successful heartbeat was sent less than ``ttl_s`` ago.

        Local monotonic clock. False before ``__aenter__`` and after exit. When False,
        other processes may consider this process's nodes dead: they must not claim.
        """
        if self._state != _RUNNING or self._last_ok is None:
            return False
        return time.monotonic() - self._last_ok < self.ttl_s

    @property
    def last_error(self) -> Exception | None:
        """The error of the last heartbeat if it failed; None once one succeeds.

        Nodes read it while the membership is unhealthy: a
        :class:`~asynccoord.errors.StoreClosedError` or
        :class:`~asynccoord.errors.StoreLoopError` there means the store will not
        come back by itself, so they fail instead of waiting for heartbeats to resume.
        """
        return self._last_error

    @property
    def local_nodes(self) -> Mapping[str, str]:
        """Node id -> incarnation of every node joined in this process (a copy)."""
        return {node_id: local.incarnation for node_id, local in self._local.items()}

    def statistics(self) -> MembershipStats:
        """A snapshot of the counters."""
        age = None if self._last_ok is None else time.monotonic() - self._last_ok
        return MembershipStats(
            local_nodes=len(self._local),
            live_nodes=len(self._view.node_ids),
            version=self._view.version,
            heartbeats=self._heartbeats,
            failures=self._failures,
            consecutive_failures=self._consecutive_failures,
            last_heartbeat_age_s=age,
            healthy=self.healthy,
        )

    # --- nodes ------------------------------------------------------------------------

    def join(self, node_id: str, info: Mapping[str, Any] | None = None) -> str:
        """Add a local node; it is heartbeaten from now on (the next beat is sent at once).

        Args:
            node_id: The node's id, 1..255 characters, unique among this process's nodes.
            info: A JSON object about the node, for inspection (copied). Default ``{}``.

        Returns:
            The incarnation token of this join: random (128 bits, hex).

        Raises:
            InvalidArgumentError: ``node_id`` is malformed or already joined here, or
                ``info`` does not round-trip through JSON.
            InvalidTypeError: ``node_id`` is not a str, ``info`` not a mapping or not JSON.
            PayloadTooLargeError: ``info`` encodes to more than ``config.max_payload_bytes``.
            CoordError: the Membership has been closed.
        """
        check_name("node_id", node_id)
        if info is not None and not isinstance(info, Mapping):
            raise InvalidTypeError(f"info must be a mapping (a JSON object), got {type(info).__name__}")
        if self._state in (_CLOSING, _CLOSED):
            raise CoordError(f"cannot join {node_id!r}: {self!r} is closed")
        if node_id in self._local:
            raise InvalidArgumentError(f"node_id {node_id!r} has already joined this Membership: leave it first")
        text = encode_payload(dict(info or {}), max_bytes=self.store.config.max_payload_bytes, arg="info")
        incarnation = secrets.token_hex(16)
        self._local[node_id] = _Local(incarnation=incarnation, info=json.loads(text))
        self._local_changes += 1
        self._wake.set()
        return incarnation

    async def leave(self, node_id: str) -> bool:
        """Stop heartbeating a local node and remove it from the store and the view.

        The node stops being heartbeaten at once; if the store call fails or is
        cancelled, its member row simply expires after ``ttl_s``.

        Args:
            node_id: A node joined in this process.

        Returns:
            True if the store had the node live and removed it; False if the node was
            not joined here (nothing done), or its row had already expired.

        Raises:
            InvalidArgumentError, InvalidTypeError: a malformed ``node_id``.
            StoreError: the store call failed (the node has left locally anyway).
        """
        check_name("node_id", node_id)
        local = self._local.pop(node_id, None)
        if local is None:
            return False
        self._local_changes += 1
        self._started_at.pop(node_id, None)
        try:
            if self._state == _NEW:
                return False
            async with self._io_lock:
                return await self.store.leave(node_id, local.incarnation)
        finally:
            self._drop_from_view(node_id, leaving=node_id)

    # --- the view's changes -----------------------------------------------------------

    def add_listener(self, listener: Callable[[MembershipView], None]) -> Callable[[], None]:
        """Call ``listener(view)`` at every change of the view, as it happens (synchronously, in the
        event loop, before :meth:`wait_changed` returns), so a change undone a moment later is
        still seen, as :meth:`wait_changed` (which returns the latest view) may not.

        A node uses it to drop the affinity context of conversations whose partition it stops
        owning, even for a moment. An exception from ``listener`` is logged, never raised.

        Args:
            listener: A plain function of the new :class:`MembershipView`.

        Returns:
            A function that removes the listener (calling it again does nothing).

        Raises:
            InvalidTypeError: ``listener`` is not a plain callable.
        """
        check_callback("listener", listener)
        self._listeners.append(listener)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._listeners.remove(listener)

        return remove

    async def wait_changed(self, since_version: int, timeout_s: float | None = None) -> MembershipView:
        """Wait until the view's version is above ``since_version``, or the timeout.

        Args:
            since_version: The version the caller has seen (e.g. ``membership.view.version``).
            timeout_s: Most seconds to wait (>= 0); None waits without limit.

        Returns:
            The current view: its ``version`` is still ``since_version`` (or lower) if
            the timeout passed or the Membership closed first.

        Raises:
            InvalidArgumentError, InvalidTypeError: a bad argument.
        """
        check_int("since_version", since_version, minimum=0)
        if timeout_s is not None:
            check_non_negative("timeout_s", timeout_s)
        if self._view.version > since_version or self._state == _CLOSED:
            return self._view
        changed = self._changed
        try:
            async with asyncio.timeout(timeout_s):
                await changed.wait()
        except TimeoutError:
            pass
        return self._view

    def _signal(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        view = self._view
        for listener in list(self._listeners):
            try:
                listener(view)
            except Exception:
                log.exception(
                    "asynccoord.membership.listener_failed", extra={"event": "asynccoord.membership.listener_failed"}
                )

    # --- life cycle -------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Send the first heartbeat (the view is ready after it), then start the task.

        Raises:
            StoreError: the first heartbeat failed; the Membership is closed (joined
                nodes are told to leave, unless the store wrote nothing: it is closed,
                read-only or of another event loop).
            CoordError: already started or closed.
        """
        if self._state != _NEW:
            raise CoordError(f"{self!r} can be started once")
        self._state = _RUNNING
        try:
            await self._beat(raise_errors=True)
        except BaseException as exc:
            if isinstance(exc, _NOTHING_WRITTEN):  # no node joined: a leave would only fail (and be logged) too
                self._local.clear()
                self._local_changes += 1
            await self._shutdown(None)
            raise
        self._task = asyncio.get_running_loop().create_task(self._run(), name="asynccoord-membership")

    async def close(self) -> None:
        """Stop the heartbeat task and let every local node leave. Idempotent.

        The leave runs shielded from cancellation, bounded by :data:`LEAVE_TIMEOUT_S`;
        a cancellation that arrives meanwhile is re-raised after it.
        """
        if self._state in (_CLOSING, _CLOSED):
            return
        if self._state == _NEW:  # never heartbeaten: nothing to remove from the store
            self._local.clear()
            self._local_changes += 1
            self._state = _CLOSED
            self._signal()
            return
        task, self._task = self._task, None
        await self._shutdown(task)

    async def _shutdown(self, task: asyncio.Task[None] | None) -> None:
        self._state = _CLOSING
        try:
            if task is not None:
                task.cancel()
                await asyncio.wait([task])
                if not task.cancelled() and task.exception() is not None:
                    log.error("asynccoord.membership.task_failed", exc_info=task.exception())
        finally:
            try:
                await _shielded(self._leave_all(), min(self.ttl_s, LEAVE_TIMEOUT_S))
            finally:
                self._state = _CLOSED
                self._signal()

    async def _leave_all(self) -> None:
        nodes = list(self._local.items())
        self._local.clear()
        self._local_changes += 1
        if not nodes:
            return
        async with self._io_lock:
            outcomes = await asyncio.gather(
                *(self.store.leave(node_id, local.incarnation) for node_id, local in nodes), return_exceptions=True
            )
        for (node_id, _), outcome in zip(nodes, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                log.warning(
                    "asynccoord.membership.leave_failed node=%s error=%s: %s",
                    node_id,
                    type(outcome).__name__,
                    outcome,
                    extra={"event": "asynccoord.membership.leave_failed"},
                )


async def _shielded(work: Awaitable[None], timeout_s: float) -> None:
    """Run ``work`` to completion (or ``timeout_s``) whatever cancels the caller meanwhile.

    ``work`` runs in a task of its own, so native asyncio cancellation of the caller
    cannot interrupt it; anyio's shield keeps cancel scopes from re-delivering their
    cancellation on every wait. A cancellation received meanwhile is re-raised after.
    """

    async def bounded() -> None:
        try:
            async with asyncio.timeout(timeout_s):
                await work
        except TimeoutError:
            log.warning(
                "asynccoord.membership.leave_timeout timeout_s=%g: members expire after their ttl_s",
                timeout_s,
                extra={"event": "asynccoord.membership.leave_timeout"},
            )

    task = asyncio.get_running_loop().create_task(bounded(), name="asynccoord-membership-leave")
    cancelled: asyncio.CancelledError | None = None
    with anyio.CancelScope(shield=True):
        while not task.done():
            try:
                await asyncio.wait([task])
            except asyncio.CancelledError as exc:
                cancelled = exc
    if not task.cancelled() and task.exception() is not None:
        log.error("asynccoord.membership.leave_failed", exc_info=task.exception())
    if cancelled is not None:
        raise cancelled
