"""Wake-ups at the refill of a rate limit's bucket: a throttled node waits exactly as long as it must.

A claim that left tasks behind because their buckets were empty knows when each of
them may go (:class:`~asynccoord.contract.ratelimits.Admission`'s ``wake_at``, store
clock). :class:`RefillWaker` turns that into one timer per ``(queue, partition)`` on
the store's event loop that announces the partition through the store's
:class:`~asynccoord.notify.WorkNotifier` when the time comes, so the idle node owning
it claims then: it neither spins on claims that find nothing nor sleeps past the
refill. A timer already set for an earlier (or the same) time is kept; a later claim
that learns of an earlier refill sets another.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from ..notify import WorkNotifier

__all__ = ("REFILL_SLACK_S", "RefillWaker")

REFILL_SLACK_S = 0.001
"""Seconds added to a refill's delay, so the claim it wakes finds the token there (never a hair early)."""


class RefillWaker:
    """Timers that announce partitions whose throttled work may be claimed again (see the module docstring).

    Args:
        notifier: The store's notifier, which wakes the idle nodes owning a partition.
    """

    __slots__ = ("_notifier", "_timers")

    def __init__(self, notifier: WorkNotifier) -> None:
        self._notifier = notifier
        self._timers: dict[tuple[str, int], tuple[float, asyncio.TimerHandle]] = {}

    def __repr__(self) -> str:
        return f"<RefillWaker timers={len(self._timers)}>"

    def schedule(self, queue: str, wake_at: Mapping[int, float], now: float) -> None:
        """Announce each partition of ``wake_at`` at its time (store clock; ``now`` is the store's now).

        Call on the store's event loop. Outside a running loop nothing is scheduled (the
        nodes' own polling finds the work).
        """
        if not wake_at:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        for partition, at in wake_at.items():
            key = (queue, partition)
            known = self._timers.get(key)
            if known is not None and known[0] <= at:
                continue
            if known is not None:
                known[1].cancel()
            delay = max(0.0, at - now) + REFILL_SLACK_S
            handle = loop.call_later(delay, self._fire, key, at)
            self._timers[key] = (at, handle)

    def _fire(self, key: tuple[str, int], at: float) -> None:
        known = self._timers.get(key)
        if known is not None and known[0] == at:
            del self._timers[key]
        self._notifier.notify(key[0], 1, (key[1],))

    def cancel_all(self) -> None:
        """Drop every timer (the store closes)."""
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
