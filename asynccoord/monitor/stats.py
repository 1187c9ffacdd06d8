"""The counters of one :class:`~asynccoord.monitor.monitor.Monitor`, as :meth:`Monitor.statistics` returns them."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ("MonitorStats",)


@dataclass(frozen=True, slots=True, kw_only=True)
class MonitorStats:
    """Counters of one monitor (see :meth:`Monitor.statistics`)."""

    process_id: str
    flushes: int
    flush_failures: int
    evaluations: int
    evaluate_failures: int
    alerts_fired: int
    alerts_resolved: int
    alerts_dropped: int
    callback_failures: int
    subscribers: int
    active_alerts: int
    """Open incidents whose firing notice was published (muted ones left out)."""
    sink_failures: int = 0
    """Notices the sinks (``sinks=``) gave up on after every attempt, or that were refused."""
    sink_dropped: int = 0
    """Notices the sinks dropped unsent (their queue was full, or they closed first)."""
    leader: bool = False
    """Whether this monitor judged the cluster-scoped rules at its last evaluation."""
    leader_changes: int = 0
    """Times this monitor took over the cluster-scoped rules or handed them over."""
    muted_alerts: int = 0
    """Open incidents muted by another rule's (``AlertRule.inhibited_by``): stored, never published."""
