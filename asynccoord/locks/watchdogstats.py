"""The counters of one :class:`~asynccoord.locks.watchdog.Watchdog`, as :meth:`Watchdog.statistics` returns them."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ("WatchdogStats",)


@dataclass(frozen=True, slots=True, kw_only=True)
class WatchdogStats:
    """A snapshot of a watchdog's counters (see :meth:`~asynccoord.locks.watchdog.Watchdog.statistics`).

    Attributes:
        guarded: Leases under guard now.
        renew_rounds: Renewal rounds that reached the store (one ``renew_locks`` call each).
        renewed: Leases renewed, summed over the rounds.
        lost: Leases given up (lost, expired, taken over, or past ``max_hold_s``).
        max_hold_exceeded: Of those, leases given up at the hold-time ceiling.
        renew_errors: Renewal rounds that failed with a store error (retried).
    """

    guarded: int
    renew_rounds: int
    renewed: int
    lost: int
    max_hold_exceeded: int
    renew_errors: int
