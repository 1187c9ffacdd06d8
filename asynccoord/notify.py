"""In-process wake-ups: an enqueue (or a commit that unblocks a key) wakes idle nodes at once.

Nodes of other processes still find new work by polling (with backoff and jitter);
a store that can push notifications across processes (PostgreSQL LISTEN/NOTIFY) feeds
the same notifier. ``notify(queue, n, partitions)`` wakes at most ``n`` waiters, oldest
first, and only those that own one of the given partitions (a waiter that claims from
every partition matches all), so a single new task does not stampede every idle node
(no thundering herd) and does not wake a node that could not claim it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Collection

from .validation import check_name, check_non_negative

__all__ = ("WorkNotifier",)


class WorkNotifier:
    """Per-queue FIFO of idle waiters; bound to the event loop that first uses it."""

    __slots__ = ("_waiters",)

    def __init__(self) -> None:
        self._waiters: dict[str, deque[tuple[asyncio.Future[None], frozenset[int] | None]]] = {}

    def notify(self, queue: str, n: int = 1, partitions: Collection[int] | None = None) -> int:
        """Wake up to ``n`` (>= 0) nodes waiting on ``queue``; return how many were woken.

        Args:
            queue: Queue name.
            n: Most waiters to wake.
            partitions: Partitions with new claimable work; only waiters owning one of
                them (or waiting on all partitions) are woken. None wakes any waiter.
        """
        waiters = self._waiters.get(queue)
        if not waiters:
            return 0
        woken = 0
        kept: deque[tuple[asyncio.Future[None], frozenset[int] | None]] = deque()
        while waiters and woken < n:
            future, owned = waiters.popleft()
            if future.done():
                continue
            if partitions is None or owned is None or not owned.isdisjoint(partitions):
                future.set_result(None)
                woken += 1
            else:
                kept.append((future, owned))
        waiters.extendleft(reversed(kept))
        return woken

    async def wait(self, queue: str, timeout_s: float, *, partitions: Collection[int] | None = None) -> bool:
        """Wait until notified for ``queue`` or ``timeout_s`` seconds pass.

        Args:
            queue: Queue name.
            timeout_s: Longest wait, seconds (>= 0).
            partitions: The partitions the waiter claims from (a set); None for all.

        Returns:
            True when woken by :meth:`notify`, False on timeout.
        """
        check_name("queue", queue)
        check_non_negative("timeout_s", timeout_s)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        owned = None if partitions is None else frozenset(partitions)
        waiters = self._waiters.setdefault(queue, deque())
        entry = (future, owned)
        waiters.append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            if not future.done():
                future.cancel()
            with contextlib.suppress(ValueError):
                waiters.remove(entry)

    def waiting(self, queue: str) -> int:
        """How many nodes wait on ``queue`` now."""
        check_name("queue", queue)
        return sum(1 for f, _ in self._waiters.get(queue, ()) if not f.done())

    def wake_all(self) -> None:
        """Wake every waiter of every queue (used at shutdown)."""
        for queue in list(self._waiters):
            self.notify(queue, 1 << 30)
