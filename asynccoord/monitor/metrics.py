"""Prometheus text exposition of a process' counters and latency histograms, and of its queues' state.

A :class:`CoordCollector` (:func:`register_collector`, :func:`render_prometheus`) exposes
the process's coordination events, latency histograms and monitor counters to Prometheus
(extra ``metrics``), named after the Prometheus naming conventions, and gauges of the
queues' backlogs and live nodes read from the store (:mod:`asynccoord.monitor.gauges`).

Alerting on them: the monitor's own rules count events, so none of them sees a backlog. Rules
for Prometheus, on the oldest pending task's age and on the gauges' health::

    groups:
      - name: asynccoord
        rules:
          - alert: AsynccoordBacklog  # work waits: nodes gone, stalled or too few
            expr: max by (queue) (asynccoord_queue_oldest_pending_age_seconds) > 30
            for: 1m
          - alert: AsynccoordQueueStatsDown  # the store does not answer the gauges' reads
            expr: max(asynccoord_queue_stats_up) == 0
            for: 1m
          - alert: AsynccoordQueueStatsStale  # this process serves old figures
            expr: asynccoord_queue_stats_age_seconds > 45
            for: 5m

Pick the backlog's threshold from the delay your users accept. After a ``kill -9``, the dead
process's conversations wait up to ``lease_s`` (30 s) for its claims to lapse: the example
fires only when the oldest task has waited over 30 s for a whole minute, so not for that alone.
A scrape served on the event loop's own thread (as by an ASGI app) serves the previous scrape's
reading, so its first shows ``asynccoord_queue_stats_up`` 0 (hence the ``for:``), and the
figures' age is about one scrape interval. The age normally stays below the scrape interval
plus 10 s; 45 s suits a 15 s scrape.
"""

from __future__ import annotations

import asyncio
import re
import threading
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import REGISTRY, Collector

from ..errors import InvalidArgumentError, InvalidTypeError
from ..events import EVENT_NAMES, EventCounter
from ..validation import check_name
from .gauges import GaugeReading, QueueGauges
from .histogram import BUCKET_BOUNDS_MS, CLAIM_MS, COMMIT_MS, ENQUEUE_TO_COMMIT_MS, SEND_MS, Histogram

__all__ = ("CoordCollector", "latency_help", "latency_metric_name", "register_collector", "render_prometheus")

PREFIX = "asynccoord"
STORE_LABEL = "store"
"""The label that tells the stores of one collector apart (``name=``)."""
_EXPORT_EVERY = 4  # one exported bucket per doubling of the fine bounds
_INVALID = re.compile(r"[^a-zA-Z0-9_]")
_EVENTS = f"{PREFIX}_events"
_MONITOR_COUNTERS = (
    ("flushes", "Counter flushes written to the store."),
    ("flush_failures", "Counter flushes that failed (retried at the next flush)."),
    ("alerts_fired", "Firing alert notices published."),
    ("alerts_resolved", "Resolved alert notices published."),
    ("alerts_dropped", "Alert notices dropped because a subscriber's buffer was full."),
    ("callback_failures", "Alert callbacks that raised or timed out."),
    ("sink_failures", "Alert notices a sink (e.g. a webhook) gave up on after every attempt."),
    ("sink_dropped", "Alert notices a sink dropped unsent (its queue was full, or it closed first)."),
)
_ALERTS_FIRING = f"{PREFIX}_alerts_firing"
_ALERTS_MUTED = f"{PREFIX}_alerts_muted"
_QUEUE_TASKS = f"{PREFIX}_queue_tasks"
_OLDEST_PENDING = f"{PREFIX}_queue_oldest_pending_age_seconds"
_LIVE_NODES = f"{PREFIX}_live_nodes"
_STATS_UP = f"{PREFIX}_queue_stats_up"
_STATS_AGE = f"{PREFIX}_queue_stats_age_seconds"
_GAUGES = (_QUEUE_TASKS, _OLDEST_PENDING, _LIVE_NODES, _STATS_UP, _STATS_AGE)

_EXPORTS: weakref.WeakKeyDictionary[CollectorRegistry, weakref.ref[CoordCollector]] = weakref.WeakKeyDictionary()
"""The collector :func:`register_collector` put on each registry, which later stores join
(weak both ways: an unregistered collector, and the stores it read, are not kept alive)."""
_EXPORTS_LOCK = threading.Lock()


_LATENCY_HELP = {
    CLAIM_MS: "Claim latency (one store.claim call)",
    SEND_MS: "Send latency (the application's send(task))",
    COMMIT_MS: "Commit latency (one store.complete call)",
    ENQUEUE_TO_COMMIT_MS: "Enqueue-to-commit latency (a task's creation to its commit, store clock)",
}
"""The description of each known latency histogram, without the recorder's ``_ms`` name."""


def _base_name(name: str) -> str:
    """A latency histogram's name without its ``_ms`` suffix (the export is in seconds)."""
    return name[:-3] if name.endswith("_ms") else name


def latency_metric_name(name: str) -> str:
    """The Prometheus name of a latency histogram: ``claim_ms`` -> ``asynccoord_claim_duration_seconds``."""
    return f"{PREFIX}_{_INVALID.sub('_', _base_name(name))}_duration_seconds"


def latency_help(name: str) -> str:
    """The HELP text of a latency histogram, in seconds: ``claim_ms`` -> ``"Claim latency (...) ... seconds."``.

    A name the recorder does not define reads as its words: ``"batch_wait_ms"`` -> ``"Batch wait latency ..."``.
    """
    what = _LATENCY_HELP.get(name) or f"{_base_name(name).replace('_', ' ').capitalize()} latency"
    return f"{what} observed by this process, seconds."


def _buckets_seconds(hist: Histogram) -> list[tuple[str, float]]:
    buckets: list[tuple[str, float]] = []
    cumulative = 0
    for slot, bound_ms in enumerate(BUCKET_BOUNDS_MS):
        cumulative += hist.counts[slot]
        if slot % _EXPORT_EVERY == 0:
            buckets.append((repr(bound_ms / 1000.0), float(cumulative)))
    buckets.append(("+Inf", float(hist.count)))
    return buckets


@dataclass(frozen=True, slots=True, kw_only=True)
class _Source:
    """One store exported by a collector: its monitor, its lock store, its ``store`` label and its queue gauges."""

    store: Any
    monitor: Any
    lock_store: Any
    name: str | None
    gauges: QueueGauges | None = None

    def event_counts(self) -> dict[str, int]:
        """The process totals: ``store.events`` plus the lock store's events, as the Monitor counts them."""
        counts = dict(self.store.events.snapshot())
        if self.lock_store is not None:
            for event, value in self.lock_store.events.snapshot().items():
                counts[event] = counts.get(event, 0) + value
        return counts

    def histograms(self) -> dict[str, Histogram]:
        recorder = getattr(self.store, "latencies", None)
        return recorder.snapshot() if recorder is not None else {}


def _source(store: Any, monitor: Any, lock_store: Any, name: str | None, queues: Sequence[str] | None) -> _Source:
    if getattr(store, "events", None) is None:
        raise InvalidTypeError(f"store must have an 'events' EventCounter, got {type(store).__name__}")
    if name is not None:
        check_name("name", name)
    given = None if lock_store is store else lock_store
    if given is not None and not isinstance(getattr(given, "events", None), EventCounter):
        raise InvalidTypeError(
            f"lock_store must be a lock store with an EventCounter 'events', got {type(given).__name__}"
        )
    held = getattr(monitor, "lock_store", None) if monitor is not None else None
    held = None if held is store else held
    if given is not None and held is not None and given is not held:
        raise InvalidArgumentError(
            f"lock_store={given!r} is not the monitor's lock_store {held!r}: pass the monitor's"
            " (or leave lock_store out, the monitor's is used)"
        )
    gauges = None if queues is None else QueueGauges(store, queues)
    return _Source(
        store=store, monitor=monitor, lock_store=given if given is not None else held, name=name, gauges=gauges
    )


class CoordCollector(Collector):
    """A ``prometheus_client`` collector reading ``store.events``, ``store.latencies`` (and a monitor).

    Needs the optional extra ``metrics`` (``pip install asynccoord[metrics]``, which installs
    ``prometheus-client``)::

        from prometheus_client import start_http_server
        from asynccoord.monitor.metrics import register_collector

        async with SQLiteStore("bot.db") as store, Monitor(store) as monitor:
            register_collector(store, monitor, queues=["outbox"])  # prometheus_client's default registry
            start_http_server(9108)
            ...

    Naming follows the Prometheus conventions (https://prometheus.io/docs/practices/naming/):
    one ``asynccoord_`` prefix, base units in names, ``_total`` on counters:

    * ``asynccoord_events_total{event="stale_commit_rejected"}``: every coordination event of
      :mod:`asynccoord.events` counted by this process (all names present, 0 until seen), the
      lock store's events (``lock_contended``, ``lock_lost``, ``fencing_rejected``) included
      when the locks live elsewhere (``lock_store=``, or the monitor's), as the
      :class:`~asynccoord.monitor.monitor.Monitor` counts them;
    * ``asynccoord_<name>_duration_seconds``: each latency histogram of ``store.latencies``
      (``claim_ms`` becomes ``asynccoord_claim_duration_seconds``), with ``le`` buckets at
      every doubling of :data:`~asynccoord.monitor.histogram.BUCKET_BOUNDS_MS` (exact cumulative
      counts: those bounds are bounds of the fine histogram), converted to seconds;
    * with a :class:`~asynccoord.monitor.monitor.Monitor`: ``asynccoord_monitor_*_total`` counters
      (flushes, notices, drops, callback failures) and the gauge
      ``asynccoord_alerts_firing{rule,event,scope,scope_key}`` (1 per open incident, muted ones
      left out) and ``asynccoord_alerts_muted{rule,event,scope,scope_key,inhibited_by}`` (1 per
      open incident muted by another rule's, never sent: :mod:`asynccoord.monitor.inhibition`);
    * with ``queues`` (not None), gauges of the queues' state, read from the store
      (:mod:`asynccoord.monitor.gauges`: at most every 10 s, a scrape waits for it at most
      1 s, the loop never): ``asynccoord_queue_tasks{queue,status}`` for ``pending``,
      ``running`` and ``dead`` (done tasks are not counted: that would cost a scan of every
      done task kept; their rate is ``asynccoord_events_total{event="commits"}``);
      ``asynccoord_queue_oldest_pending_age_seconds{queue}``, the age of the oldest due
      pending task on the store's clock (0 when none is due); ``asynccoord_live_nodes{queue}``,
      the nodes whose membership heartbeat is live, by the queue they drain (``queue=""``
      for nodes that name none); ``asynccoord_queue_stats_up`` (0 while the latest read
      failed or timed out: the values served are stale) and
      ``asynccoord_queue_stats_age_seconds`` (the values' age). A reading older than 60 s is
      not served: the value gauges are then absent, and a scrape still succeeds. The queues
      are those named, plus those this process's runtimes drain, found in their nodes'
      heartbeats (and kept once found).

    With ``name``, every series also carries ``store="<name>"``. One collector exports
    several stores of a process (:meth:`add`, or :func:`register_collector` again on the
    same registry), each under its own name, in one family per metric.

    Each process exposes its own counters; let Prometheus sum them across processes
    (``sum by (event) (rate(asynccoord_events_total[1m]))``). The queue gauges are read
    from the store, so every process exporting them reports the same cluster-wide values:
    aggregate them with ``max by (queue, status)``, not ``sum``. The full cluster view
    read from the store is what ``python -m asynccoord status`` shows.

    Args:
        store: A store (any backend) with ``events`` and ``latencies``.
        monitor: Optionally the :class:`~asynccoord.monitor.monitor.Monitor` of the store.
        lock_store: The lock store of the store's nodes when it is not ``store``
            (``Runtime(lock_store=...)``, e.g. a
            :class:`~asynccoord.backends.redis.RedisLockStore`). Default: the monitor's
            ``lock_store``, if any.
        name: The value of the ``store`` label (1..255 characters), or None (default) for
            no label.
        queues: Queue names whose state to export (a list or tuple, may be empty: the
            queues of this process's runtimes are found without it), or None (default) for
            no queue gauges. Needs the event loop the store runs on: construct the
            collector from a coroutine on it.

    Raises:
        InvalidTypeError: ``store`` has no ``events``, or ``lock_store`` has no ``EventCounter``;
            with ``queues``, a bad list or a store without ``queue_backlogs`` and ``members``.
        InvalidArgumentError: a bad ``name``, or a ``lock_store`` other than the monitor's;
            ``queues`` given with no running event loop, or a bad queue name.
    """

    def __init__(
        self,
        store: Any,
        monitor: Any = None,
        *,
        lock_store: Any = None,
        name: str | None = None,
        queues: Sequence[str] | None = None,
    ) -> None:
        first = _source(store, monitor, lock_store, name, queues)
        self.store = store
        self.monitor = monitor
        self.lock_store: Any = first.lock_store
        self.name = name
        self._sources: tuple[_Source, ...] = (first,)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        names = [s.name if s.name is not None else type(s.store).__name__ for s in self._sources]
        return f"<CoordCollector stores={names!r}>"

    def queue_gauges(self) -> list[QueueGauges]:
        """The :class:`~asynccoord.monitor.gauges.QueueGauges` of each store exported with queue gauges, in order."""
        return [source.gauges for source in self._sources if source.gauges is not None]

    def add(
        self,
        store: Any,
        monitor: Any = None,
        *,
        lock_store: Any = None,
        name: str,
        queues: Sequence[str] | None = None,
    ) -> None:
        """Also export ``store`` (with its monitor, lock store and queue gauges), under ``store="<name>"``.

        Every store of a collector exporting several needs a distinct name, the first one included.

        Raises:
            InvalidArgumentError: ``name`` is taken, the collector's stores have no name, or
                ``store`` (or its lock store) is exported already, as a store or as another
                store's lock store (its counts would double).
            InvalidTypeError: as the constructor.
        """
        added = _source(store, monitor, lock_store, check_name("name", name), queues)
        with self._lock:
            for source in self._sources:
                if source.name is None:
                    raise InvalidArgumentError(
                        f"{self!r} exports {type(source.store).__name__} without a name: give every store of"
                        f" one registry a distinct name (register_collector(store, monitor, name=...)),"
                        " the first one included"
                    )
                if source.name == name:
                    raise InvalidArgumentError(f"name={name!r} is taken in {self!r}: give each store its own name")
                if source.store is store:
                    raise InvalidArgumentError(
                        f"{store!r} is exported already as {source.name!r}: its counts would double"
                    )
                if source.lock_store is not None and source.lock_store is store:
                    raise InvalidArgumentError(
                        f"{store!r} is exported already as the lock store of {source.name!r}: its counts"
                        " would double; export it with one of them only"
                    )
                if added.lock_store is not None and (
                    added.lock_store is source.store or added.lock_store is source.lock_store
                ):
                    raise InvalidArgumentError(
                        f"lock store {added.lock_store!r} is exported already with {source.name!r}:"
                        " its counts would double; pass it with one store only"
                    )
            self._sources = (*self._sources, added)

    def describe(self) -> Iterable[Metric]:
        """The families every scrape has (no I/O): a registry refuses a second collector of them."""
        yield CounterMetricFamily(_EVENTS, "")
        if any(source.monitor is not None for source in self._sources):
            for field, _text in _MONITOR_COUNTERS:
                yield CounterMetricFamily(f"{PREFIX}_monitor_{field}", "")
            yield GaugeMetricFamily(_ALERTS_FIRING, "")
            yield GaugeMetricFamily(_ALERTS_MUTED, "")
        if any(source.gauges is not None for source in self._sources):
            for family in _GAUGES:
                yield GaugeMetricFamily(family, "")

    def collect(self) -> Iterable[Metric]:
        """The current counters and histograms of this process."""
        sources = self._sources
        named = any(source.name is not None for source in sources)
        extra = [STORE_LABEL] if named else []

        def key(source: _Source) -> list[str]:
            return [source.name or ""] if named else []

        events = CounterMetricFamily(
            _EVENTS, "Coordination events counted by this process, by event name.", labels=[*extra, "event"]
        )
        for source in sources:
            counts = source.event_counts()
            for event in sorted(set(EVENT_NAMES) | set(counts)):
                events.add_metric([*key(source), event], float(counts.get(event, 0)))
        yield events
        latencies: dict[str, list[tuple[_Source, Histogram]]] = {}
        for source in sources:
            for name, hist in source.histograms().items():
                latencies.setdefault(name, []).append((source, hist))
        for name, found in sorted(latencies.items()):
            family = HistogramMetricFamily(
                latency_metric_name(name),
                latency_help(name),
                labels=extra,
                unit="seconds",
            )
            for source, hist in found:
                family.add_metric(key(source), _buckets_seconds(hist), hist.sum_ms / 1000.0)
            yield family
        monitored = [(source, source.monitor) for source in sources if source.monitor is not None]
        if monitored:
            yield from self._monitor_metrics(monitored, extra, key)
        gauged = [(source, source.gauges) for source in sources if source.gauges is not None]
        if gauged:
            yield from _gauge_metrics([(source, gauges.current()) for source, gauges in gauged], extra, key)

    def _monitor_metrics(self, monitored: list[tuple[_Source, Any]], extra: list[str], key: Any) -> Iterable[Metric]:
        stats = [(source, monitor.statistics()) for source, monitor in monitored]
        for field, text in _MONITOR_COUNTERS:
            family = CounterMetricFamily(f"{PREFIX}_monitor_{field}", text, labels=extra)
            for source, stat in stats:
                family.add_metric(key(source), float(getattr(stat, field)))
            yield family
        firing = GaugeMetricFamily(
            _ALERTS_FIRING,
            "Open alert incidents of this process' monitor (1 each).",
            labels=[*extra, "rule", "event", "scope", "scope_key"],
        )
        for source, monitor in monitored:
            for alert in monitor.active_alerts():
                firing.add_metric([*key(source), alert.rule, alert.event, alert.scope.value, alert.scope_key], 1.0)
        yield firing
        muted = GaugeMetricFamily(
            _ALERTS_MUTED,
            "Open alert incidents of this process' monitor muted by another rule's (1 each; never sent).",
            labels=[*extra, "rule", "event", "scope", "scope_key", "inhibited_by"],
        )
        for source, monitor in monitored:
            for alert in monitor.muted_alerts():
                labels = [alert.rule, alert.event, alert.scope.value, alert.scope_key, alert.inhibited_by or ""]
                muted.add_metric([*key(source), *labels], 1.0)
        yield muted


def _gauge_metrics(
    read: list[tuple[_Source, tuple[GaugeReading | None, bool]]], extra: list[str], key: Any
) -> Iterable[Metric]:
    tasks = GaugeMetricFamily(
        _QUEUE_TASKS,
        "Tasks of the queue by status (pending, running, dead), read from the store: cluster-wide.",
        labels=[*extra, "queue", "status"],
    )
    oldest = GaugeMetricFamily(
        _OLDEST_PENDING,
        "Seconds the oldest due pending task of the queue has waited, store clock (0 when none is due).",
        labels=[*extra, "queue"],
        unit="seconds",
    )
    live = GaugeMetricFamily(
        _LIVE_NODES, "Nodes with a live membership heartbeat, by the queue they drain.", labels=[*extra, "queue"]
    )
    up = GaugeMetricFamily(
        _STATS_UP, "1 when the latest read of the queue gauges succeeded, 0 when it failed or timed out.", labels=extra
    )
    age = GaugeMetricFamily(
        _STATS_AGE, "Seconds since the queue gauges served were read.", labels=extra, unit="seconds"
    )
    for source, (reading, ok) in read:
        up.add_metric(key(source), 1.0 if ok else 0.0)
        if reading is None:
            continue
        age.add_metric(key(source), reading.age_s())
        for backlog in reading.backlogs:
            labels = [*key(source), backlog.queue]
            for status, count in (("pending", backlog.pending), ("running", backlog.running), ("dead", backlog.dead)):
                tasks.add_metric([*labels, status], float(count))
            oldest.add_metric(labels, backlog.oldest_pending_age_s or 0.0)
        for queue, nodes in sorted(reading.live_nodes.items()):
            live.add_metric([*key(source), queue], float(nodes))
    yield from (tasks, oldest, live, up, age)


def _can_gauge(store: Any) -> bool:
    """Whether queue gauges of ``store`` can be made here: it has the reads, and an event loop runs."""
    if not all(callable(getattr(store, method, None)) for method in ("queue_backlogs", "members")):
        return False
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def render_prometheus(store: Any, monitor: Any = None, *, lock_store: Any = None, name: str | None = None) -> bytes:
    """The Prometheus text exposition (format 0.0.4) of ``store``'s metrics (and ``monitor``'s).

    ``lock_store`` and ``name`` as in :class:`CoordCollector`. No queue gauges: those are
    read at scrape time from a registered collector (:func:`register_collector`).

    Returns:
        UTF-8 bytes, as served on ``/metrics``.
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CoordCollector(store, monitor, lock_store=lock_store, name=name))
    return generate_latest(registry)


def register_collector(
    store: Any,
    monitor: Any = None,
    registry: CollectorRegistry = REGISTRY,
    *,
    lock_store: Any = None,
    name: str | None = None,
    queues: Sequence[str] | None = (),
) -> CoordCollector:
    """Export ``store`` (and ``monitor``, and its queues' state) on ``registry`` (default: prometheus_client's).

    The first call on a registry registers a new :class:`CoordCollector`. To export several
    stores of one process, give each a distinct ``name`` (the ``store`` label), the first one
    included: a later call with a name joins the registry's collector, so each metric
    stays one family with one series per store::

        register_collector(orders, orders_monitor, name="orders")
        register_collector(billing, billing_monitor, name="billing")

    Args:
        store: A store (any backend) with ``events`` and ``latencies``.
        monitor: Optionally the store's :class:`~asynccoord.monitor.monitor.Monitor`.
        registry: The ``prometheus_client`` registry. Default ``prometheus_client.REGISTRY``.
        lock_store: The lock store of the store's nodes when it is not ``store``. Default:
            the monitor's ``lock_store``, if any.
        name: The ``store`` label's value, or None (default) for no label.
        queues: The queues whose state to export as gauges, beside those this process's
            runtimes drain, which are found by themselves (see :class:`CoordCollector`).
            Default none named: the gauges are then exported when this is called from a
            coroutine on the store's event loop and the store can be read for them, and
            left out otherwise. None leaves them out.

    Returns:
        The registry's collector (``registry.unregister(collector)`` removes it, with every
        store it exports).

    Raises:
        InvalidArgumentError: the registry exports asynccoord metrics already and the stores
            are not all named distinctly, or its names are held by another collector.
        InvalidTypeError: as :class:`CoordCollector`.
    """
    if queues is not None and isinstance(queues, list | tuple) and not queues and not _can_gauge(store):
        queues = None  # none named: the gauges only where they can be read
    collector = CoordCollector(store, monitor, lock_store=lock_store, name=name, queues=queues)
    with _EXPORTS_LOCK:
        try:
            registry.register(collector)
        except ValueError as exc:  # prometheus_client's DuplicateTimeseries: the families are taken
            ref = _EXPORTS.get(registry)
            existing = ref() if ref is not None else None
            if existing is None:
                raise InvalidArgumentError(
                    f"the registry has another collector of asynccoord's metrics ({exc}): unregister it,"
                    " or use another registry"
                ) from exc
            if name is None:
                raise InvalidArgumentError(
                    f"the registry exports asynccoord metrics already ({existing!r}): a second store's series"
                    " would be indistinguishable; give every store a distinct name"
                    " (register_collector(store, monitor, name=...)), the first one included"
                ) from exc
            existing.add(store, monitor, lock_store=collector.lock_store, name=name, queues=queues)
            return existing
        _EXPORTS[registry] = weakref.ref(collector)
    return collector
