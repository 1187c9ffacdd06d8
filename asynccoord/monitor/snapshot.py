"""The cluster view: totals, windowed counts and rates, latency quantiles and stored alerts.

:func:`cluster_snapshot` reads what every process' monitor flushed (one
:meth:`~asynccoord.contract.monitor.MonitorStore.read_metrics` call) and folds it into
a :class:`ClusterSnapshot`: lifetime totals per process and summed, event counts and
rates per second over each sliding window asked for (over the part of it the flushed
counts cover, :func:`covered_span_s`), and quantile estimates of the
merged latency histograms. It needs no :class:`~asynccoord.monitor.monitor.Monitor`, so
the status command reads a read-only store with it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..contract.monitor import PROCESS_SCOPE, Alert, MetricsView, ProcessReport, check_windows, open_alerts
from ..errors import InvalidTypeError
from .histogram import Histogram

__all__ = (
    "MIN_SPAN_S",
    "ClusterSnapshot",
    "EventWindow",
    "LatencySummary",
    "build_snapshot",
    "cluster_snapshot",
    "covered_span_s",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class LatencySummary:
    """Quantile estimates of one latency histogram, milliseconds (None when empty)."""

    count: int
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    mean_ms: float | None

    @classmethod
    def of(cls, hist: Histogram) -> LatencySummary:
        """Summarize ``hist``."""
        return cls(count=hist.count, p50_ms=hist.p50, p90_ms=hist.p90, p99_ms=hist.p99, mean_ms=hist.mean_ms)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class EventWindow:
    """Cluster-wide event counts over one sliding window.

    Attributes:
        window_s: The window, seconds.
        counts: Event name -> events in the window (all processes).
        rates_per_s: Event name -> ``counts / span_s``, events per second.
        span_s: The seconds of the window the counts cover: ``window_s``, or less while the
            earliest first flush of the processes that flushed in it is more recent (a
            cluster started 30 s ago has 30 s of data in a 60 s window). At least
            :data:`MIN_SPAN_S` (or ``window_s`` when shorter).
    """

    window_s: float
    counts: Mapping[str, int]
    rates_per_s: Mapping[str, float]
    span_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSnapshot:
    """Totals and rates over every process, as read from the store at ``now_s``.

    Attributes:
        now_s: Store clock at the read.
        totals: Event name -> lifetime count over all processes.
        process_totals: Process id -> event name -> lifetime count.
        node_totals: Node id -> event name -> lifetime count (only for tracked nodes).
        windows: One :class:`EventWindow` per window asked for, in that order.
        latencies: Window seconds -> latency name -> :class:`LatencySummary`.
        processes: Processes that flushed within the retention, by id.
        alerts: Firing alerts stored by every live monitor.
    """

    now_s: float
    totals: Mapping[str, int]
    process_totals: Mapping[str, Mapping[str, int]]
    node_totals: Mapping[str, Mapping[str, int]]
    windows: tuple[EventWindow, ...]
    latencies: Mapping[float, Mapping[str, LatencySummary]]
    processes: tuple[ProcessReport, ...]
    alerts: tuple[Alert, ...]

    def window(self, window_s: float) -> EventWindow:
        """The :class:`EventWindow` of ``window_s``.

        Raises:
            KeyError: that window was not read.
        """
        for w in self.windows:
            if w.window_s == window_s:
                return w
        raise KeyError(f"window {window_s!r} s was not read; have {[w.window_s for w in self.windows]}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the ``events``/``latencies``/``processes``/``alerts`` parts of the status JSON)."""
        return {
            "now_s": self.now_s,
            "totals": dict(self.totals),
            "process_totals": {p: dict(c) for p, c in self.process_totals.items()},
            "node_totals": {n: dict(c) for n, c in self.node_totals.items()},
            "windows": [
                {
                    "window_s": w.window_s,
                    "span_s": w.span_s,
                    "counts": dict(w.counts),
                    "rates_per_s": dict(w.rates_per_s),
                }
                for w in self.windows
            ],
            "latencies": [
                {"window_s": window, "name": name, **summary.to_dict()}
                for window, by_name in self.latencies.items()
                for name, summary in by_name.items()
            ],
            "processes": [
                {
                    "process_id": p.process_id,
                    "info": p.info,
                    "first_flush_at": p.first_flush_at,
                    "last_flush_at": p.last_flush_at,
                    "last_flush_age_s": p.last_flush_age_s,
                }
                for p in self.processes
            ],
            "alerts": [a.to_dict() for a in self.alerts],
        }


MIN_SPAN_S = 1.0
"""The shortest span a rate is taken over, seconds: one time bucket of the flushed counts."""


def covered_span_s(processes: Iterable[ProcessReport], now_s: float, window_s: float) -> float:
    """The seconds of the window ending at ``now_s`` that the flushed counts cover.

    The counts start at the earliest first flush of the processes that flushed within the
    window (a monitor flushes at its start, so its counts begin there); a window reaching
    back before it holds no data for that time, and dividing by the whole window would
    understate every rate. Processes whose last flush is older than the window hold no
    count in it and are left out.

    Returns:
        ``window_s`` when the data reaches back to the window's start, or no process
        flushed in it; else the seconds since that first flush, at least :data:`MIN_SPAN_S`.
    """
    since = now_s - window_s
    starts = [p.first_flush_at for p in processes if p.last_flush_at > since]
    if not starts or min(starts) <= since:
        return window_s
    return min(window_s, max(MIN_SPAN_S, now_s - min(starts)))


def build_snapshot(view: MetricsView, windows_s: Sequence[float]) -> ClusterSnapshot:
    """A :class:`ClusterSnapshot` from a :class:`~asynccoord.contract.monitor.MetricsView`.

    Args:
        view: What the store returned.
        windows_s: The windows to report, in order (each must be in ``view.windows``).
    """
    totals: dict[str, int] = {}
    per_process: dict[str, dict[str, int]] = {}
    per_node: dict[str, dict[str, int]] = {}
    for (pid, scope, name), value in sorted(view.totals.items()):
        if scope == PROCESS_SCOPE:
            totals[name] = totals.get(name, 0) + value
            per_process.setdefault(pid, {})[name] = value
        else:
            node = per_node.setdefault(scope, {})
            node[name] = node.get(name, 0) + value
    windows = []
    for window in windows_s:
        counts: dict[str, int] = {}
        for (_pid, scope, name), value in view.windows.get(window, {}).items():
            if scope == PROCESS_SCOPE:
                counts[name] = counts.get(name, 0) + value
        counts = dict(sorted(counts.items()))
        span = covered_span_s(view.processes.values(), view.now_s, window)
        windows.append(
            EventWindow(
                window_s=window, counts=counts, rates_per_s={n: c / span for n, c in counts.items()}, span_s=span
            )
        )
    latencies = {
        window: {name: LatencySummary.of(h) for name, h in sorted(view.latencies.get(window, {}).items())}
        for window in windows_s
    }
    return ClusterSnapshot(
        now_s=view.now_s,
        totals=dict(sorted(totals.items())),
        process_totals=per_process,
        node_totals=per_node,
        windows=tuple(windows),
        latencies=latencies,
        processes=tuple(view.processes.values()),
        alerts=open_alerts(view.alerts),
    )


async def cluster_snapshot(store: Any, windows_s: Sequence[float] = (10.0, 60.0)) -> ClusterSnapshot:
    """Read the cluster-wide totals, rates, latencies and stored alerts of ``store``.

    Works on any open :class:`~asynccoord.contract.monitor.MonitorStore`, including a
    read-only ``SQLiteStore``; no :class:`~asynccoord.monitor.monitor.Monitor` is needed.

    Args:
        store: An open store.
        windows_s: Sliding windows for rates and latencies, seconds. Default (10, 60).

    Raises:
        InvalidTypeError: ``store`` has no monitor primitives.
        StoreError: the read failed.
    """
    if not callable(getattr(store, "read_metrics", None)):
        raise InvalidTypeError(f"store must implement MonitorStore (read_metrics), got {type(store).__name__}")
    windows = check_windows(windows_s)
    view: MetricsView = await store.read_metrics(windows)
    return build_snapshot(view, windows)
