"""In-process wake-ups: an enqueue (or a commit that unblocks a key) wakes idle nodes at once.

A :class:`WorkNotifier` per store wakes at most as many idle nodes as there is new work,
and only nodes that own one of its partitions, so one new task neither stampedes every
idle node (no thundering herd) nor wakes a node that could not claim it; each node waits
on a standing :class:`WakeUp` that keeps a notification arriving during its claim.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Collection

from .validation import check_int, check_name, check_non_negative, check_partitions

__all__ = ("WakeUp", "WorkNotifier")


class WakeUp:
    """A node's standing registration with a :class:`WorkNotifier` for one queue.

    Made by :meth:`WorkNotifier.subscribe`; not thread-safe (one event loop).

    Attributes:
        queue: The queue it listens to.
        partitions: The partitions the node claims from (a frozenset), None for all.
    """

    __slots__ = ("_armed", "_closed", "_flag", "_future", "_notifier", "partitions", "queue")

    def __init__(self, notifier: WorkNotifier, queue: str, partitions: frozenset[int] | None) -> None:
        self._notifier = notifier
        self.queue = queue
        self.partitions = partitions
        self._flag = False
        self._armed = False
        self._closed = False
        self._future: asyncio.Future[None] | None = None

    def __repr__(self) -> str:
        state = "waiting" if self.waiting else "armed" if self._armed else "busy"
        owned = "all" if self.partitions is None else len(self.partitions)
        return f"<WakeUp {self.queue!r} {state} flag={self._flag} partitions={owned}>"

    @property
    def is_set(self) -> bool:
        """A notification came since the last :meth:`arm` (a claim that started before it may have missed the work)."""
        return self._flag

    @property
    def waiting(self) -> bool:
        """In :meth:`wait` now."""
        return self._future is not None and not self._future.done()

    def arm(self, partitions: Collection[int] | None = None) -> None:
        """Call just before a claim: forget older notifications, keep any from now on.

        Args:
            partitions: The partitions the claim looks at (a collection of ints >= 0;
                None: all); later notifications for other partitions are not kept.

        Raises:
            InvalidTypeError, InvalidArgumentError: bad ``partitions`` (nothing changes).
        """
        owned: frozenset[int] | None
        if partitions is None:
            owned = None
        elif partitions is self.partitions:  # a node re-arms with the set it owns: checked already
            owned = self.partitions
        else:
            check_partitions("partitions", partitions)
            owned = frozenset(partitions)
        if self._closed:
            return
        self.partitions = owned
        self._flag = False
        self._armed = True
        self._notifier._armed.setdefault(self.queue, {})[self] = None

    def disarm(self) -> None:
        """Stop keeping notifications (e.g. every slot is busy: the node claims when one frees anyway)."""
        self._disarm()

    def _disarm(self) -> None:
        if self._armed:
            self._armed = False
            armed = self._notifier._armed.get(self.queue)
            if armed is not None:
                armed.pop(self, None)

    async def wait(self, timeout_s: float) -> bool:
        """Wait until notified or ``timeout_s`` (>= 0) seconds pass; at once if notified since :meth:`arm`.

        Returns:
            True when woken by a notification (now or kept since :meth:`arm`), False on timeout.
        """
        check_non_negative("timeout_s", timeout_s)
        self._disarm()
        if self._flag:
            self._flag = False
            return True
        if self._closed:
            return False
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._future = future
        waiters = self._notifier._waiters.setdefault(self.queue, deque())
        waiters.append(self)
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            self._future = None
            if not future.done():
                future.cancel()
                with contextlib.suppress(ValueError):
                    waiters.remove(self)
            self._flag = False

    def set(self) -> bool:
        """Wake the node as a notification for its partitions would (kept if it is claiming now).

        Returns:
            True if it was waiting (now woken) or armed (now flagged); False otherwise.
        """
        return self._wake()

    def _wake(self) -> bool:
        """Wake this waiter (True), or flag it when armed (True); False if neither applies."""
        future = self._future
        if future is not None and not future.done():
            future.set_result(None)
            return True
        if self._armed and not self._flag:
            self._flag = True
            return True
        return False

    def matches(self, partitions: Collection[int] | None) -> bool:
        """Whether new work in ``partitions`` (None: anywhere) is claimable by this node."""
        return partitions is None or self.partitions is None or not self.partitions.isdisjoint(partitions)

    def close(self) -> None:
        """Unsubscribe (idempotent); a running :meth:`wait` is woken."""
        self._closed = True
        self._disarm()
        future = self._future
        if future is not None and not future.done():
            future.set_result(None)
            with contextlib.suppress(ValueError):
                self._notifier._waiters[self.queue].remove(self)


class WorkNotifier:
    """Per-queue FIFO of idle waiters and set of armed nodes; bound to the event loop that first uses it.

    Work nobody in the process announces (tasks of other processes, expired leases, tasks
    falling due) is found by the runtime's one idle poll (:mod:`asynccoord.node.idlepoll`),
    which wakes the owners through their :class:`WakeUp`, or by a standalone node's own
    polling (with backoff and jitter); a store that can push notifications across processes
    (PostgreSQL LISTEN/NOTIFY) feeds the same notifier. ``notify(queue, n, partitions)``
    wakes at most ``n`` nodes, and only those that own one of the given partitions (a node
    that claims from every partition matches all), so a single new task does not stampede
    every idle node (no thundering herd) and does not wake a node that could not claim it.

    A node keeps one standing :class:`WakeUp` (see :meth:`WorkNotifier.subscribe`) for its
    life. It arms it just before each claim; a notification that arrives while the claim
    runs is not lost but kept as a flag, and the node's next :meth:`WakeUp.wait` returns
    at once. So a node may wait after a claim that came back short instead of claiming
    again to be safe. ``notify`` wakes waiting nodes first (the longest waiting first), then
    flags armed nodes (each counts as one of the ``n``: it will claim again at once); a node
    busy with a full batch is neither (it claims as soon as a slot frees anyway).
    """

    __slots__ = ("_armed", "_waiters")

    def __init__(self) -> None:
        self._waiters: dict[str, deque[WakeUp]] = {}
        self._armed: dict[str, dict[WakeUp, None]] = {}  # insertion-ordered: the longest armed first

    def subscribe(self, queue: str, partitions: Collection[int] | None = None) -> WakeUp:
        """A standing wake-up for a node draining ``queue`` (see :class:`WakeUp`; close it when done).

        Args:
            queue: Queue name.
            partitions: The partitions the node claims from (a collection of ints >= 0);
                None for all. Updated by each :meth:`WakeUp.arm`.

        Raises:
            InvalidTypeError, InvalidArgumentError: a bad ``queue`` or ``partitions``.
        """
        check_name("queue", queue)
        owned = check_partitions("partitions", partitions)
        return WakeUp(self, queue, None if owned is None else frozenset(owned))

    def notify(self, queue: str, n: int = 1, partitions: Collection[int] | None = None) -> int:
        """Wake up to ``n`` (>= 0) nodes of ``queue``; return how many were woken (or flagged).

        Waiting nodes are woken first, the longest waiting first; if fewer than ``n``
        match, armed nodes (claiming now) are flagged, so they claim again at once.

        Args:
            queue: Queue name.
            n: Most nodes to wake, an int >= 0.
            partitions: Partitions with new claimable work (a set, tuple or list... of
                ints >= 0); only nodes owning one of them (or claiming from all
                partitions) are woken. None wakes any node.

        Raises:
            InvalidTypeError, InvalidArgumentError: a bad ``queue``, ``n`` or ``partitions``
                (nobody is woken).
        """
        check_name("queue", queue)
        if type(n) is not int or n < 0:
            check_int("n", n, minimum=0)
        if partitions is not None:
            check_partitions("partitions", partitions)
        woken = 0
        waiters = self._waiters.get(queue)
        if waiters:
            kept: deque[WakeUp] = deque()
            while waiters and woken < n:
                waiter = waiters.popleft()
                if not waiter.waiting:
                    continue
                if waiter.matches(partitions):
                    waiter._wake()
                    woken += 1
                else:
                    kept.append(waiter)
            waiters.extendleft(reversed(kept))
        if woken < n:
            armed = self._armed.get(queue)
            if armed:
                for sub in armed:  # _wake() never changes the dict
                    if not sub._flag and sub.matches(partitions) and sub._wake():
                        woken += 1
                        if woken >= n:
                            break
        return woken

    async def wait(self, queue: str, timeout_s: float, *, partitions: Collection[int] | None = None) -> bool:
        """Wait once until notified for ``queue`` or ``timeout_s`` seconds pass (no standing wake-up).

        Args:
            queue: Queue name.
            timeout_s: Longest wait, seconds (>= 0).
            partitions: The partitions the waiter claims from (a collection of ints
                >= 0, a set, say); None for all.

        Returns:
            True when woken by :meth:`notify`, False on timeout.

        Raises:
            InvalidTypeError, InvalidArgumentError: a bad ``queue``, ``timeout_s`` or
                ``partitions`` (checked before any wait).
        """
        check_non_negative("timeout_s", timeout_s)
        wake = self.subscribe(queue, partitions)
        try:
            return await wake.wait(timeout_s)
        finally:
            wake.close()

    def waiting(self, queue: str) -> int:
        """How many nodes wait on ``queue`` now."""
        check_name("queue", queue)
        return sum(1 for w in self._waiters.get(queue, ()) if w.waiting)

    def wake_all(self) -> None:
        """Wake every waiter and flag every armed node of every queue (used at shutdown)."""
        for queue in list(self._waiters.keys() | self._armed.keys()):
            self.notify(queue, 1 << 30)
