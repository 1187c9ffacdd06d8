"""Due times: wake a node when a task it put back falls due (a retry's backoff, a busy lock's requeue).

Nobody notifies when a task the node itself delayed becomes claimable again, so the node
keeps those moments, a heap of loop times, and runs one timer at a time, for the earliest:
it wakes the node's idle wait (its :class:`~asynccoord.notify.WakeUp`), then arms itself
for the next time kept.
"""

from __future__ import annotations

import asyncio
import heapq
import math

from ..notify import WakeUp

__all__ = ("DueTimes",)


class DueTimes:
    """The loop times at which tasks one node put back fall due, and the timer for the earliest.

    Attributes:
        wake: The node's wake-up, once its fetch loop runs (before: nothing is kept).
    """

    __slots__ = ("_heap", "_timer", "_when", "wake")

    def __init__(self) -> None:
        self.wake: WakeUp | None = None
        self._heap: list[float] = []
        self._timer: asyncio.TimerHandle | None = None
        self._when = math.inf  # the loop time the timer fires at

    def __repr__(self) -> str:
        return f"<DueTimes kept={len(self._heap)} next={self._when}>"

    def add(self, delay_s: float) -> None:
        """Wake the node in ``delay_s`` seconds (+1 ms): a task it put back is due then."""
        if self.wake is None:
            return
        loop = asyncio.get_running_loop()
        heapq.heappush(self._heap, loop.time() + max(delay_s, 0.0) + 0.001)
        self._arm(loop)

    def close(self) -> None:
        """Stop the timer (the node's fetch loop is over)."""
        if self._timer is not None:
            self._timer.cancel()

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run the timer for the earliest time kept (if it is not running for it already)."""
        if not self._heap or self._heap[0] >= self._when:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._when = self._heap[0]
        self._timer = loop.call_at(self._when, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._when = math.inf
        loop = asyncio.get_running_loop()
        now = loop.time()
        while self._heap and self._heap[0] <= now + 0.001:  # due now (or within the timer's slack)
            heapq.heappop(self._heap)
        if self.wake is not None:
            self.wake.set()
            self._arm(loop)
