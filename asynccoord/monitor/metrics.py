"""Prometheus text exposition of a process' counters and latency histograms.

A :class:`CoordCollector` (:func:`register_collector`, :func:`render_prometheus`) exposes
the process's coordination events, latency histograms and monitor counters to Prometheus
(extra ``metrics``), named after the Prometheus naming conventions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import REGISTRY, Collector

from ..errors import InvalidTypeError
from ..events import EVENT_NAMES
from .histogram import BUCKET_BOUNDS_MS, Histogram

__all__ = ("CoordCollector", "latency_metric_name", "register_collector", "render_prometheus")

PREFIX = "asynccoord"
_EXPORT_EVERY = 4  # one exported bucket per doubling of the fine bounds
_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def latency_metric_name(name: str) -> str:
    """The Prometheus name of a latency histogram: ``claim_ms`` -> ``asynccoord_claim_duration_seconds``."""
    base = name[:-3] if name.endswith("_ms") else name
    return f"{PREFIX}_{_INVALID.sub('_', base)}_duration_seconds"


def _buckets_seconds(hist: Histogram) -> list[tuple[str, float]]:
    buckets: list[tuple[str, float]] = []
    cumulative = 0
    for slot, bound_ms in enumerate(BUCKET_BOUNDS_MS):
        cumulative += hist.counts[slot]
        if slot % _EXPORT_EVERY == 0:
            buckets.append((repr(bound_ms / 1000.0), float(cumulative)))
    buckets.append(("+Inf", float(hist.count)))
    return buckets


class CoordCollector(Collector):
    """A ``prometheus_client`` collector reading ``store.events``, ``store.latencies`` (and a monitor).

    Needs the optional extra ``metrics`` (``pip install asynccoord[metrics]``, which installs
    ``prometheus-client``)::

        from prometheus_client import start_http_server
        from asynccoord.monitor.metrics import register_collector

        register_collector(store, monitor)      # on prometheus_client's default registry
        start_http_server(9108)

    Naming follows the Prometheus conventions (https://prometheus.io/docs/practices/naming/):
    one ``asynccoord_`` prefix, base units in names, ``_total`` on counters:

    * ``asynccoord_events_total{event="stale_commit_rejected"}``: every coordination event of
      :mod:`asynccoord.events` counted by this process (all names present, 0 until seen);
    * ``asynccoord_<name>_duration_seconds``: each latency histogram of ``store.latencies``
      (``claim_ms`` becomes ``asynccoord_claim_duration_seconds``), with ``le`` buckets at
      every doubling of :data:`~asynccoord.monitor.histogram.BUCKET_BOUNDS_MS` (exact cumulative
      counts: those bounds are bounds of the fine histogram), converted to seconds;
    * with a :class:`~asynccoord.monitor.monitor.Monitor`: ``asynccoord_monitor_*_total`` counters
      (flushes, notices, drops, callback failures) and the gauge
      ``asynccoord_alerts_firing{rule,event,scope,scope_key}`` (1 per open incident).

    Each process exposes its own numbers; let Prometheus sum them across processes
    (``sum by (event) (rate(asynccoord_events_total[1m]))``). The cluster-wide view read
    from the store is what ``python -m asynccoord status`` shows.

    Args:
        store: A store (any backend) with ``events`` and ``latencies``.
        monitor: Optionally the :class:`~asynccoord.monitor.monitor.Monitor` of the store.

    Raises:
        InvalidTypeError: ``store`` has no ``events``.
    """

    def __init__(self, store: Any, monitor: Any = None) -> None:
        if getattr(store, "events", None) is None:
            raise InvalidTypeError(f"store must have an 'events' EventCounter, got {type(store).__name__}")
        self.store = store
        self.monitor = monitor

    def describe(self) -> Iterable[Metric]:
        """Nothing: the metrics are read at scrape time (keeps registration free of I/O)."""
        return []

    def collect(self) -> Iterable[Metric]:
        """The current counters and histograms of this process."""
        counts = dict(self.store.events.snapshot())
        events = CounterMetricFamily(
            f"{PREFIX}_events", "Coordination events counted by this process, by event name.", labels=["event"]
        )
        for name in sorted(set(EVENT_NAMES) | set(counts)):
            events.add_metric([name], float(counts.get(name, 0)))
        yield events
        recorder = getattr(self.store, "latencies", None)
        histograms: dict[str, Histogram] = recorder.snapshot() if recorder is not None else {}
        for name, hist in sorted(histograms.items()):
            family = HistogramMetricFamily(
                latency_metric_name(name),
                f"Latency {name} observed by this process, seconds.",
                unit="seconds",
            )
            family.add_metric([], _buckets_seconds(hist), hist.sum_ms / 1000.0)
            yield family
        if self.monitor is not None:
            yield from self._monitor_metrics()

    def _monitor_metrics(self) -> Iterable[Metric]:
        stats = self.monitor.statistics()
        for field, text in (
            ("flushes", "Counter flushes written to the store."),
            ("flush_failures", "Counter flushes that failed (retried at the next flush)."),
            ("alerts_fired", "Firing alert notices published."),
            ("alerts_resolved", "Resolved alert notices published."),
            ("alerts_dropped", "Alert notices dropped because a subscriber's buffer was full."),
            ("callback_failures", "Alert callbacks that raised or timed out."),
            ("sink_failures", "Alert notices a sink (e.g. a webhook) gave up on after every attempt."),
            ("sink_dropped", "Alert notices a sink dropped unsent (its queue was full, or it closed first)."),
        ):
            family = CounterMetricFamily(f"{PREFIX}_monitor_{field}", text)
            family.add_metric([], float(getattr(stats, field)))
            yield family
        firing = GaugeMetricFamily(
            f"{PREFIX}_alerts_firing",
            "Open alert incidents of this process' monitor (1 each).",
            labels=["rule", "event", "scope", "scope_key"],
        )
        for alert in self.monitor.active_alerts():
            firing.add_metric([alert.rule, alert.event, alert.scope.value, alert.scope_key], 1.0)
        yield firing


def render_prometheus(store: Any, monitor: Any = None) -> bytes:
    """The Prometheus text exposition (format 0.0.4) of ``store``'s metrics (and ``monitor``'s).

    Returns:
        UTF-8 bytes, as served on ``/metrics``.
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CoordCollector(store, monitor))
    return generate_latest(registry)


def register_collector(store: Any, monitor: Any = None, registry: CollectorRegistry = REGISTRY) -> CoordCollector:
    """Register a :class:`CoordCollector` for ``store`` on ``registry`` (default: the global one).

    Returns:
        The collector (``registry.unregister(collector)`` to remove it).
    """
    collector = CoordCollector(store, monitor)
    registry.register(collector)
    return collector
