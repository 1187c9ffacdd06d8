"""In-process wake-ups: an enqueue wakes idle nodes of the same process at once.

Nodes of other processes still find new work by polling (with backoff and jitter);
a store that can push notifications across processes (PostgreSQL LISTEN/NOTIFY) feeds
the same notifier. ``notify(queue, n)`` wakes at most ``n`` waiters, oldest first, so
a single new task does not stampede every idle node (no thundering herd).
"""

from __future__ import annotations

import asyncio
from collections import deque

from .validation import check_int, check_name, check_non_negative

__all__ = ("WorkNotifier",)


class WorkNotifier:
    """Per-queue FIFO of idle waiters; bound to the event loop that first uses it."""

    __slots__ = ("_waiters",)

    def __init__(self) -> None:
        self._waiters: dict[str, deque[asyncio.Future[None]]] = {}

    def notify(self, queue: str, n: int = 1) -> int:
        """Wake up to ``n`` (>= 0) nodes waiting on ``queue``; return how many were woken."""
        waiters = self._waiters.get(queue)
        woken = 0
        while waiters and woken < n:
            future = waiters.popleft()
            if not future.done():
                future.set_result(None)
                woken += 1
        return woken

    async def wait(self, queue: str, timeout_s: float) -> bool:
        """Wait until notified for ``queue`` or ``timeout_s`` seconds pass.

        Args:
            queue: Queue name.
            timeout_s: Longest wait, seconds (>= 0).

        Returns:
            True when woken by :meth:`notify`, False on timeout.
        """
        check_name("queue", queue)
        check_non_negative("timeout_s", timeout_s)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters = self._waiters.setdefault(queue, deque())
        waiters.append(future)
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            if not future.done():
                future.cancel()
            try:
                waiters.remove(future)
            except ValueError:
                pass

    def waiting(self, queue: str) -> int:
        """How many nodes wait on ``queue`` now."""
        check_name("queue", queue)
        return sum(1 for f in self._waiters.get(queue, ()) if not f.done())

    def wake_all(self) -> None:
        """Wake every waiter of every queue (used at shutdown)."""
        for queue in list(self._waiters):
            self.notify(queue, check_int("n", 1 << 30, minimum=0))
