"""The counters of one :class:`~asynccoord.membership.Membership`, as :meth:`Membership.statistics` returns them."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ("MembershipStats",)


@dataclass(frozen=True, slots=True, kw_only=True)
class MembershipStats:
    """A snapshot of a membership's counters (see :meth:`~asynccoord.membership.Membership.statistics`).

    Attributes:
        local_nodes: Nodes joined in this process.
        live_nodes: Live node ids in the current view (all processes).
        version: The view's version.
        heartbeats: Heartbeat calls that succeeded.
        failures: Heartbeat calls that failed.
        consecutive_failures: Failures since the last success.
        last_heartbeat_age_s: Seconds (local monotonic clock) since the last successful
            heartbeat was sent; None before the first.
        healthy: See :attr:`~asynccoord.membership.Membership.healthy`.
    """

    local_nodes: int
    live_nodes: int
    version: int
    heartbeats: int
    failures: int
    consecutive_failures: int
    last_heartbeat_age_s: float | None
    healthy: bool
