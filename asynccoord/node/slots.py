"""A node's slots: how many tasks it may hold in flight, taken a claim's worth at a time.

A counting semaphore (E. W. Dijkstra, 1965) with one waiter, the node's fetch loop: it
takes as many free slots as a claim may fill (at least one, waiting for it) in one call,
and each task in flight gives its slot back as it settles. ``asyncio.Semaphore`` would do,
one ``acquire`` per slot; this takes a batch's slots in one step and wakes the fetch loop
only when it waits.
"""

from __future__ import annotations

import asyncio

from ..errors import InvalidArgumentError

__all__ = ("Slots",)


class Slots:
    """``size`` slots, taken by one fetch loop (:meth:`take`) and given back one or more at a time.

    Args:
        size: The number of slots (``NodeConfig.max_in_flight``, checked there).
    """

    __slots__ = ("_free", "_size", "_waiter")

    def __init__(self, size: int) -> None:
        self._size = size
        self._free = size
        self._waiter: asyncio.Future[None] | None = None

    def __repr__(self) -> str:
        return f"<Slots free={self._free}/{self._size}>"

    @property
    def free(self) -> int:
        """Slots free now."""
        return self._free

    def locked(self) -> bool:
        """True when no slot is free (as ``asyncio.Semaphore.locked``)."""
        return self._free == 0

    async def take(self, most: int) -> int:
        """Take the free slots, at most ``most`` (>= 1), waiting until one is free; return how many.

        Raises:
            RuntimeError: another coroutine waits already (the slots have one taker).
            CancelledError: cancelled while waiting (nothing taken).
        """
        while self._free == 0:
            if self._waiter is not None:
                raise RuntimeError("Slots.take: another coroutine is waiting already")
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        taken = min(self._free, most)
        self._free -= taken
        return taken

    def release(self, count: int = 1) -> None:
        """Give ``count`` slots back, and wake the waiting taker.

        Raises:
            InvalidArgumentError: more slots given back than were taken (a bug in the node).
        """
        free = self._free + count
        if free > self._size:
            raise InvalidArgumentError(f"Slots.release({count}): only {self._size - self._free} slots are taken")
        self._free = free
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
