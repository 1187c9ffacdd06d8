"""The conflict monitor: cluster-wide counters, sliding-window rules, alerts and their delivery.

::

    async with Monitor(store, rules=DEFAULT_RULES, flush_interval_s=1.0) as monitor:
        monitor.subscribe(page_someone)            # async callback, run in its own task
        async for alert in monitor.alerts():        # or iterate (bounded buffer)
            print(alert.describe())

What it does, every ``flush_interval_s``: it takes the deltas of the process' counters
(``store.events``, plus per-node counters registered with :meth:`Monitor.track`) and
latency histograms (``store.latencies``) and adds them to the store in one batched
write (:meth:`~asynccoord.contract.monitor.MonitorStore.flush_metrics`), so every process
and the status command see totals and rates over all processes. Every
``evaluate_interval_s`` it reads the windows its rules need (one read) and evaluates
each :class:`AlertRule` per scope (the cluster, each process, or each node).

Incidents, not samples: a rule whose value rises above ``threshold`` gives exactly one
firing :class:`~asynccoord.contract.monitor.Alert`; it stays active, without repeats,
until the value falls to ``threshold * clear_ratio`` or below, which gives exactly one
resolved notice. Two thresholds, one to fire and a lower one to resolve, are the
hysteresis of a Schmitt trigger: a value hovering around the threshold cannot make
an alert storm. Without enough throughput to judge a relative rule
(``min_events``), a firing incident resolves once its window holds no more events of
its kind.

Delivery never blocks the nodes: publishing only appends to one bounded buffer per
subscriber (the oldest notice is dropped and counted when a buffer is full); each
callback runs in its own task under ``callback_timeout_s``, so a slow, stuck or
failing subscriber loses only its own notices. Each notice is also logged at WARNING
with the stable event names ``asynccoord.monitor.alert_firing`` and
``asynccoord.monitor.alert_resolved``.

Firing alerts are stored with each flush, so another process (and
``python -m asynccoord status``) sees them; a monitor's stored alerts expire when it
stops refreshing them (its process died).

Use one monitor per store object: the deltas it flushes are those of the store's
counters, and a second monitor on the same store would count them twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
import math
import os
import secrets
import socket
import weakref
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

import anyio

from .. import events as ev
from .._errtext import error_text
from ..config import StoreConfig
from ..contract.monitor import (
    PROCESS_SCOPE,
    Alert,
    AlertScope,
    AlertState,
    CounterKey,
    MetricsFlush,
    MetricsView,
    ProcessReport,
    check_windows,
)
from ..errors import CoordError, InvalidArgumentError, InvalidTypeError
from ..events import EventCounter
from ..validation import (
    MAX_DURATION_S,
    check_bool,
    check_int,
    check_interval_s,
    check_name,
    check_non_negative,
    check_positive,
    encode_payload,
)
from .histogram import Histogram

__all__ = (
    "DEFAULT_RULES",
    "Alert",
    "AlertCallback",
    "AlertRule",
    "AlertScope",
    "AlertState",
    "AlertStream",
    "ClusterSnapshot",
    "EventWindow",
    "LatencySummary",
    "Monitor",
    "MonitorStats",
    "Subscription",
    "cluster_snapshot",
)

log = logging.getLogger(__name__)

AlertCallback = Callable[[Alert], Awaitable[Any] | None]
"""A subscriber: ``async def on_alert(alert: Alert) -> None`` (a plain function is accepted too)."""

_KEEPALIVE_S = 10.0
_CANCELLED_WRITE_WAIT_S = 5.0
"""How long a cancelled flush waits for its write's outcome, seconds."""
"""A monitor writes at least this often (seconds) even when nothing changed, so the
status command sees the process as live."""


def _check_event_name(arg: str, value: object) -> str:
    """Check that ``value`` is one of :data:`asynccoord.events.EVENT_NAMES` (a rule on any
    other name would never fire)."""
    name = check_name(arg, value)
    if name not in ev.EVENT_NAMES:
        raise InvalidArgumentError(f"{arg} must be one of the event names {list(ev.EVENT_NAMES)!r}, got {name!r}")
    return name


@dataclass(frozen=True, slots=True, kw_only=True)
class AlertRule:
    """A threshold on one event kind over a sliding window.

    Absolute rule (``relative_to`` None): the value is the number of ``event`` events
    in the last ``window_s`` seconds. Relative rule: the value is that number divided by
    the number of ``relative_to`` events in the same window (a ratio, 0.05 = 5 %),
    judged only when the denominator holds at least ``min_events`` events.

    Args:
        name: Unique rule name (1..255 characters), e.g. ``"stale_commits"``.
        event: The event counted: one of :data:`asynccoord.events.EVENT_NAMES`.
        window_s: Sliding window, seconds (> 0; at most the monitor's ``retention_s``).
        threshold: Fires when the value is *above* it (count, or ratio), >= 0.
        relative_to: Denominator event name, or a tuple of names summed (each one of
            :data:`~asynccoord.events.EVENT_NAMES`); None for an absolute rule. Default None.
        min_events: Relative rules: least denominator events in the window for the
            rule to be judged (>= 0). Default 20. Ignored by absolute rules.
        scope: ``"cluster"`` (all processes summed), ``"process"`` (each process) or
            ``"node"`` (each node; needs per-node counters, see :meth:`Monitor.track`).
            Default ``"cluster"``.
        clear_ratio: Hysteresis: a firing incident resolves when the value is at most
            ``threshold * clear_ratio``, in ``[0, 1]``. Default 0.5.

    Raises:
        InvalidArgumentError, InvalidTypeError: a bad field, naming it and the value.
    """

    name: str
    event: str
    window_s: float
    threshold: float
    relative_to: str | tuple[str, ...] | None = None
    min_events: int = 20
    scope: AlertScope = AlertScope.CLUSTER
    clear_ratio: float = 0.5

    def __post_init__(self) -> None:
        check_name("name", self.name)
        _check_event_name("event", self.event)
        object.__setattr__(self, "window_s", check_positive("window_s", self.window_s))
        object.__setattr__(self, "threshold", check_non_negative("threshold", self.threshold, maximum=None))
        check_int("min_events", self.min_events, minimum=0)
        ratio = check_non_negative("clear_ratio", self.clear_ratio, maximum=None)
        if ratio > 1:
            raise InvalidArgumentError(f"clear_ratio must be in [0, 1], got {self.clear_ratio!r}")
        object.__setattr__(self, "clear_ratio", ratio)
        relative: object = self.relative_to
        if isinstance(relative, str):
            object.__setattr__(self, "relative_to", (_check_event_name("relative_to", relative),))
        elif relative is not None:
            if not isinstance(relative, tuple) or not relative:
                raise InvalidTypeError(
                    f"relative_to must be an event name, a non-empty tuple of names, or None, got {relative!r}"
                )
            for item in relative:
                _check_event_name("relative_to[i]", item)
        scope: object = self.scope
        try:
            object.__setattr__(self, "scope", AlertScope(str(scope)))
        except ValueError:
            raise InvalidArgumentError(f"scope must be one of {[s.value for s in AlertScope]}, got {scope!r}") from None

    @property
    def denominators(self) -> tuple[str, ...] | None:
        """The denominator event names of a relative rule, or None."""
        relative = self.relative_to
        if relative is None:
            return None
        return (relative,) if isinstance(relative, str) else relative


DEFAULT_RULES: tuple[AlertRule, ...] = (
    AlertRule(
        name="stale_commits", event=ev.STALE_COMMIT_REJECTED, relative_to=ev.COMMITS, threshold=0.05, window_s=30.0
    ),
    AlertRule(name="fencing_rejections", event=ev.FENCING_REJECTED, threshold=0, window_s=60.0),
    AlertRule(name="lease_expiries", event=ev.LEASE_EXPIRED, relative_to=ev.CLAIMS, threshold=0.05, window_s=60.0),
    AlertRule(name="lost_leases", event=ev.LEASE_LOST, threshold=0, window_s=60.0),
    AlertRule(name="lost_locks", event=ev.LOCK_LOST, threshold=0, window_s=60.0),
    AlertRule(
        name="lock_contention",
        event=ev.LOCK_CONTENDED,
        relative_to=ev.CLAIMS,
        threshold=0.5,
        window_s=30.0,
        min_events=50,
    ),
    AlertRule(name="retries", event=ev.RETRIES, relative_to=ev.CLAIMS, threshold=0.2, window_s=60.0),
    AlertRule(name="dead_letters", event=ev.DEAD_LETTERED, threshold=0, window_s=60.0),
    AlertRule(name="membership_churn", event=ev.MEMBERSHIP_CHANGE, threshold=10, window_s=60.0),
)
"""Rules a :class:`Monitor` uses unless given others: more than 5 % of commits rejected as
stale over 30 s; any fencing rejection, lost lease, lost lock or dead letter in 60 s;
more than 5 % of claims taking an expired lease over 60 s; lock contention on more than
half the claims over 30 s; retries on more than 20 % of the claims over 60 s; more than
10 membership changes in 60 s. All cluster-wide."""


# --- snapshots -------------------------------------------------------------------------


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
        rates_per_s: Event name -> ``counts / window_s``, events per second.
    """

    window_s: float
    counts: Mapping[str, int]
    rates_per_s: Mapping[str, float]


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
                {"window_s": w.window_s, "counts": dict(w.counts), "rates_per_s": dict(w.rates_per_s)}
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
        windows.append(
            EventWindow(window_s=window, counts=counts, rates_per_s={n: c / window for n, c in counts.items()})
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
        alerts=view.alerts,
    )


async def cluster_snapshot(store: Any, windows_s: Sequence[float] = (10.0, 60.0)) -> ClusterSnapshot:
    """Read the cluster-wide totals, rates, latencies and stored alerts of ``store``.

    Works on any open :class:`~asynccoord.contract.monitor.MonitorStore`, including a
    read-only ``SQLiteStore``; no :class:`Monitor` is needed.

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


# --- delivery --------------------------------------------------------------------------


class _Mailbox:
    """A bounded buffer of notices for one subscriber; full means drop the oldest."""

    __slots__ = ("_closed", "_items", "_wake", "dropped", "maxlen")

    def __init__(self, maxlen: int) -> None:
        self.maxlen = maxlen
        self._items: deque[Alert] = deque()
        self._wake = asyncio.Event()
        self._closed = False
        self.dropped = 0

    def put(self, alert: Alert) -> bool:
        """Append ``alert``; False when the oldest notice had to be dropped for it."""
        if self._closed:
            return True
        kept = True
        if len(self._items) >= self.maxlen:
            self._items.popleft()
            self.dropped += 1
            kept = False
        self._items.append(alert)
        self._wake.set()
        return kept

    def close(self) -> None:
        self._closed = True
        self._wake.set()

    async def get(self) -> Alert | None:
        """The next notice, or None once closed and empty."""
        while not self._items:
            if self._closed:
                return None
            self._wake.clear()
            await self._wake.wait()
        return self._items.popleft()


class AlertStream:
    """An async iterator over a monitor's notices (``async for alert in monitor.alerts()``).

    It buffers up to ``buffer`` notices; when full the oldest is dropped and counted
    (:attr:`dropped`). It ends when the monitor closes or :meth:`close` is called.
    """

    def __init__(self, monitor: Monitor, mailbox: _Mailbox) -> None:
        self._monitor = monitor
        self._mailbox = mailbox

    @property
    def dropped(self) -> int:
        """Notices dropped because this stream's buffer was full."""
        return self._mailbox.dropped

    def close(self) -> None:
        """Stop receiving; iteration ends after the buffered notices."""
        self._monitor._unregister(self._mailbox)
        self._mailbox.close()

    def __aiter__(self) -> AsyncIterator[Alert]:
        return self

    async def __anext__(self) -> Alert:
        alert = await self._mailbox.get()
        if alert is None:
            raise StopAsyncIteration
        return alert

    def __repr__(self) -> str:
        return f"<AlertStream buffered={len(self._mailbox._items)} dropped={self.dropped}>"


@dataclass(eq=False)
class Subscription:
    """A registered callback; :meth:`cancel` unsubscribes it.

    Attributes:
        callback: The async callback.
        timeout_s: Longest one call may take before it is cancelled and counted as failed.
        calls: Calls made. failures: Calls that raised or timed out.
    """

    callback: AlertCallback
    timeout_s: float
    _mailbox: _Mailbox
    _monitor: Monitor
    calls: int = 0
    failures: int = 0
    _task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def dropped(self) -> int:
        """Notices dropped because the callback fell behind (its buffer was full)."""
        return self._mailbox.dropped

    def cancel(self) -> None:
        """Unsubscribe: no further notices are delivered; a running call is cancelled."""
        self._monitor._unregister(self._mailbox)
        self._mailbox.close()
        if self._task is not None:
            self._task.cancel()


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


@dataclass(slots=True)
class _Incident:
    alert: Alert  # the firing notice as delivered
    current: Alert  # the same with the latest measured value (what is stored)


_ACTIVE_STORES: weakref.WeakSet[Any] = weakref.WeakSet()


def _default_process_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class Monitor:
    """Flushes this process' counters, evaluates rules cluster-wide, and delivers alerts.

    Args:
        store: An open store implementing :class:`~asynccoord.contract.monitor.MonitorStore`.
        rules: The alert rules (names unique). Default :data:`DEFAULT_RULES`.
        flush_interval_s: Seconds between flushes of the counters (>= 0.001,
            ``validation.MIN_INTERVAL_S``). Default 1.
        evaluate_interval_s: Seconds between rule evaluations (>= 0.001). Default
            ``flush_interval_s``.
        retention_s: Time buckets kept in the store, seconds; must cover every rule's
            window and be at least ``flush_interval_s``. Default 900.
        process_id: This process' id in the cluster view. Default
            ``"<host>-<pid>-<random>"``.
        buffer_size: Notices buffered per subscriber before the oldest is dropped (>= 1).
            Default 100.
        callback_timeout_s: Longest a subscriber callback may run per notice. Default 10.
        log_alerts: Log each notice at WARNING. Default True.
        background: Run the flush and evaluation loops while open. False to drive
            them with :meth:`flush` and :meth:`evaluate` (tests, fake clocks). Default True.
        info: JSON object stored with the process' flushes (host and pid are added),
            checked here: a dict with str keys and JSON values, finite numbers, at most the
            store's ``config.max_payload_bytes`` encoded (1 MiB by default).
        lock_store: The lock store of this process' nodes when it is not ``store``
            (``Runtime(lock_store=...)``, e.g. a
            :class:`~asynccoord.backends.redis.RedisLockStore`): its events (lock
            contention, lost locks, refused fencing tokens) count in the process totals
            with ``store``'s. None (default) when ``store`` holds the locks as well.

    Raises:
        InvalidArgumentError, InvalidTypeError: a bad argument (or a read-only store).
        PayloadTooLargeError: ``info`` encodes to more than the size limit.
    """

    def __init__(
        self,
        store: Any,
        *,
        rules: Sequence[AlertRule] | None = None,
        flush_interval_s: float = 1.0,
        evaluate_interval_s: float | None = None,
        retention_s: float = 900.0,
        process_id: str | None = None,
        buffer_size: int = 100,
        callback_timeout_s: float = 10.0,
        log_alerts: bool = True,
        background: bool = True,
        info: Mapping[str, Any] | None = None,
        lock_store: Any = None,
    ) -> None:
        for method in ("flush_metrics", "read_metrics"):
            if not callable(getattr(store, method, None)):
                raise InvalidTypeError(f"store must implement MonitorStore ({method}), got {type(store).__name__}")
        if getattr(store, "read_only", False) is True:
            raise InvalidArgumentError(
                f"{store!r} is read-only: a Monitor flushes counters; read a read-only store with cluster_snapshot()"
            )
        given: object = rules
        if given is not None and (isinstance(given, str | bytes) or not isinstance(given, Iterable)):
            raise InvalidTypeError(f"rules must be a sequence of AlertRule records or None, got {rules!r}")
        chosen = DEFAULT_RULES if rules is None else tuple(rules)
        for rule in chosen:
            if not isinstance(rule, AlertRule):
                raise InvalidTypeError(f"rules must hold AlertRule records, got {type(rule).__name__}")
        names = [r.name for r in chosen]
        if len(set(names)) != len(names):
            raise InvalidArgumentError(f"rule names must be unique, got {names!r}")
        if lock_store is not None and not isinstance(getattr(lock_store, "events", None), EventCounter):
            raise InvalidTypeError(
                f"lock_store must be a lock store with an EventCounter 'events', got {type(lock_store).__name__}"
            )
        self.store = store
        self.lock_store = None if lock_store is store else lock_store
        self.rules = chosen
        self.flush_interval_s = check_interval_s("flush_interval_s", flush_interval_s)
        self.evaluate_interval_s = (
            self.flush_interval_s
            if evaluate_interval_s is None
            else check_interval_s("evaluate_interval_s", evaluate_interval_s)
        )
        self.retention_s = check_positive("retention_s", retention_s)
        if self.flush_interval_s > self.retention_s:
            raise InvalidArgumentError(
                f"flush_interval_s={self.flush_interval_s!r} > retention_s={self.retention_s!r}: the store "
                "would drop each flush's buckets before the next; lower flush_interval_s"
            )
        for rule in chosen:
            if rule.window_s > self.retention_s:
                raise InvalidArgumentError(
                    f"rule {rule.name!r} has window_s={rule.window_s!r} > retention_s={self.retention_s!r}: "
                    "raise retention_s"
                )
        self.process_id = _default_process_id() if process_id is None else check_name("process_id", process_id)
        self.buffer_size = check_int("buffer_size", buffer_size, minimum=1)
        self.callback_timeout_s = check_positive("callback_timeout_s", callback_timeout_s)
        self.log_alerts = check_bool("log_alerts", log_alerts)
        self.background = check_bool("background", background)
        if info is not None and not isinstance(info, Mapping):
            raise InvalidTypeError(f"info must be a mapping or None, got {type(info).__name__}")
        self.info: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid(), **(info or {})}
        # Checked now, as Membership.join checks its info: a value no flush could write would
        # otherwise fail every flush (logged, never raised) and keep this process out of the totals.
        limit = getattr(getattr(store, "config", None), "max_payload_bytes", None)
        max_bytes = limit if isinstance(limit, int) else StoreConfig().max_payload_bytes
        encode_payload(self.info, max_bytes=max_bytes, arg="info")
        # Three intervals, at most the longest duration a store takes (intervals near a year).
        self.alert_ttl_s = min(MAX_DURATION_S, max(10.0, 3 * max(self.flush_interval_s, self.evaluate_interval_s)))
        self._tracked: dict[str, EventCounter] = {}
        self._sent_events: dict[tuple[str, str], int] = {}
        self._sent_latency: dict[str, Histogram] = {}
        self._incidents: dict[tuple[str, str], _Incident] = {}
        self._alerts_dirty = False
        self._last_write_monotonic = -math.inf
        self._flush_lock = asyncio.Lock()
        self._mailboxes: list[_Mailbox] = []
        self._dropped_retired = 0
        self._closed_once = False
        self._subscriptions: list[Subscription] = []
        self._loop_task: asyncio.Task[None] | None = None
        self._open = False
        self._flushes = self._flush_failures = 0
        self._evaluations = self._evaluate_failures = 0
        self._fired = self._resolved = 0

    def __repr__(self) -> str:
        state = "open" if self._open else "closed"
        return f"<Monitor {self.process_id!r} {state} rules={len(self.rules)} active_alerts={len(self._incidents)}>"

    # --- life cycle -----------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def start(self) -> None:
        """Start delivering (and, with ``background``, flushing and evaluating).

        Raises:
            InvalidArgumentError: another open monitor flushes the same store object.
        """
        if self._open:
            return
        counted = [self.store] if self.lock_store is None else [self.store, self.lock_store]
        for source in counted:  # a store's events are flushed by one monitor only
            if source in _ACTIVE_STORES:
                raise InvalidArgumentError(
                    f"{source!r} already has an open Monitor counting its events: use one monitor per store"
                    " (counts would double)"
                )
        _ACTIVE_STORES.update(counted)
        self._open = True
        for sub in self._subscriptions:
            self._start_worker(sub)
        if self.background:
            self._loop_task = asyncio.get_running_loop().create_task(self._run(), name="asynccoord-monitor")

    async def close(self) -> None:
        """Stop the loops, flush what is left and withdraw this monitor's stored alerts, end the streams.

        The final flush runs shielded for at most 5 s; a store that is already closed
        is tolerated. Idempotent.
        """
        if not self._open:
            return
        self._open = False
        self._closed_once = True
        _ACTIVE_STORES.discard(self.store)
        if self.lock_store is not None:
            _ACTIVE_STORES.discard(self.lock_store)
        task, self._loop_task = self._loop_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        try:
            with anyio.CancelScope(shield=True) as scope:
                scope.deadline = anyio.current_time() + 5.0
                self._incidents.clear()
                self._alerts_dirty = True
                with contextlib.suppress(CoordError):
                    await self.flush(force=True)
        finally:
            for mailbox in list(self._mailboxes):
                self._unregister(mailbox)
                mailbox.close()
            for sub in self._subscriptions:
                if sub._task is not None:
                    sub._task.cancel()
            for sub in self._subscriptions:
                if sub._task is not None:
                    with contextlib.suppress(asyncio.CancelledError):
                        await sub._task
                    sub._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_flush = loop.time() + self.flush_interval_s
        next_eval = loop.time() + self.evaluate_interval_s
        while True:
            await asyncio.sleep(max(0.0, min(next_flush, next_eval) - loop.time()))
            now = loop.time()
            if now >= next_flush:
                next_flush = now + self.flush_interval_s
                await self._guarded(self.flush, "flush")
            if now >= next_eval:
                next_eval = now + self.evaluate_interval_s
                await self._guarded(self.evaluate, "evaluate")

    async def _guarded(self, fn: Callable[[], Awaitable[Any]], what: str) -> None:
        try:
            await fn()
        except CoordError as exc:
            log.warning("asynccoord.monitor.%s_failed process=%s error=%s", what, self.process_id, exc)
        except Exception:  # a bug must not stop the monitor, nor ever reach the nodes
            log.exception("asynccoord.monitor.%s_failed process=%s", what, self.process_id)

    # --- counters and flushing ----------------------------------------------------------

    def track(self, scope: str, counter: EventCounter) -> None:
        """Also flush ``counter`` as the per-node breakdown ``scope`` (a node id).

        Node-scope counters are a breakdown: they are never added to the process
        totals, and rules with ``scope="node"`` evaluate them per node.

        Raises:
            InvalidArgumentError, InvalidTypeError: a bad ``scope`` or ``counter``.
        """
        check_name("scope", scope)
        if not isinstance(counter, EventCounter):
            raise InvalidTypeError(f"counter must be an EventCounter, got {type(counter).__name__}")
        self._tracked[scope] = counter

    async def flush(self, *, force: bool = False) -> float | None:
        """Write the counter and histogram deltas since the last flush (and the alert state).

        Skips the write when nothing changed and the last write is recent (under 10 s),
        unless ``force``. Deltas that fail to write are kept for the next flush.

        Args:
            force: Write even when nothing changed (a bool). Default False.

        Returns:
            The store clock of the write, or None when skipped.

        Raises:
            InvalidTypeError: ``force`` is not a bool.
            StoreError: the write failed (the monitor's loop logs it and goes on).
        """
        check_bool("force", force)
        async with self._flush_lock:
            counters: dict[tuple[str, str], int] = {}
            seen: dict[tuple[str, str], int] = {}
            totals = dict(self.store.events.snapshot())
            if self.lock_store is not None:  # one process total: both only ever count up
                for name, value in self.lock_store.events.snapshot().items():
                    totals[name] = totals.get(name, 0) + value
            sources = [(PROCESS_SCOPE, totals), *((k, c.snapshot()) for k, c in self._tracked.items())]
            for scope, snapshot in sources:
                for name, value in snapshot.items():
                    key = (scope, name)
                    seen[key] = value
                    delta = value - self._sent_events.get(key, 0)
                    if delta > 0:
                        counters[key] = delta
            recorder = getattr(self.store, "latencies", None)
            histograms: dict[str, Histogram] = recorder.snapshot() if recorder is not None else {}
            latencies = {}
            for name, hist in histograms.items():
                previous = self._sent_latency.get(name)
                delta_hist = hist if previous is None else hist - previous
                if delta_hist.count:
                    latencies[name] = delta_hist
            loop = asyncio.get_running_loop()
            refresh_due = loop.time() - self._last_write_monotonic >= min(_KEEPALIVE_S, self.alert_ttl_s / 3)
            if not (force or counters or latencies or self._alerts_dirty or refresh_due):
                return None
            dirty = self._alerts_dirty
            batch = MetricsFlush(
                process_id=self.process_id,
                counters=counters,
                latencies=latencies,
                alerts=[inc.current for inc in self._incidents.values()],
                alert_ttl_s=self.alert_ttl_s,
                retention_s=self.retention_s,
                info=self.info,
            )
            self._alerts_dirty = False
            # The write runs as a task of its own: a flush cancelled mid-write (e.g. by
            # close()) must still learn whether the write committed, or its deltas would
            # be sent twice (committed, yet kept for the next flush) or lost.
            write = asyncio.ensure_future(self.store.flush_metrics(batch))
            try:
                at = float(await asyncio.shield(write))
            except asyncio.CancelledError:
                with anyio.CancelScope(shield=True), anyio.move_on_after(_CANCELLED_WRITE_WAIT_S):
                    await asyncio.wait({write})
                if write.done() and not write.cancelled() and write.exception() is None:
                    self._mark_sent(seen, histograms, loop.time())
                else:
                    self._alerts_dirty = self._alerts_dirty or dirty
                    self._flush_failures += 1
                raise
            except BaseException:
                self._alerts_dirty = self._alerts_dirty or dirty
                self._flush_failures += 1
                raise
            self._mark_sent(seen, histograms, loop.time())
            return at

    def _mark_sent(self, seen: dict[tuple[str, str], int], histograms: dict[str, Histogram], now: float) -> None:
        self._sent_events.update(seen)
        self._sent_latency.update(histograms)
        self._last_write_monotonic = now
        self._flushes += 1

    # --- rules --------------------------------------------------------------------------

    async def evaluate(self) -> list[Alert]:
        """Read the rules' windows from the store and decide firing and resolved notices.

        Notices are published at once (log line, buffers, callbacks); when the set of
        firing alerts changed, the new state is flushed to the store right away.

        Returns:
            The notices this evaluation produced (often empty).

        Raises:
            StoreError: the read failed (the monitor's loop logs it and goes on).
        """
        windows = tuple(sorted({rule.window_s for rule in self.rules}))
        if not windows:
            return []
        try:
            view: MetricsView = await self.store.read_metrics(windows)
        except BaseException:
            self._evaluate_failures += 1
            raise
        self._evaluations += 1
        notices = self._decide(view)
        for alert in notices:
            self._publish(alert)
        if notices:  # the stored alert state changed: write it now, not at the next flush
            self._alerts_dirty = True
            if self._open:
                try:
                    await self.flush()
                except CoordError as exc:
                    log.warning("asynccoord.monitor.flush_failed process=%s error=%s", self.process_id, exc)
        return notices

    def _decide(self, view: MetricsView) -> list[Alert]:
        notices: list[Alert] = []
        for rule in self.rules:
            groups = _group_counts(rule.scope, view.windows.get(rule.window_s, {}))
            keys = set(groups) | {key for (name, key) in self._incidents if name == rule.name}
            for key in sorted(keys):
                counts = groups.get(key, {})
                count = counts.get(rule.event, 0)
                denominators = rule.denominators
                if denominators is None:
                    base: int | None = None
                    value = float(count)
                    judged = True
                else:
                    base = sum(counts.get(name, 0) for name in denominators)
                    value = count / base if base else 0.0
                    judged = base >= max(1, rule.min_events)
                incident = self._incidents.get((rule.name, key))
                measured = Alert(
                    rule=rule.name,
                    event=rule.event,
                    value=value,
                    threshold=rule.threshold,
                    window_s=rule.window_s,
                    at=view.now_s,
                    scope=rule.scope,
                    scope_key=key,
                    state=AlertState.FIRING,
                    relative_to=denominators,
                    count=count,
                    base=base,
                    fired_at=view.now_s,
                    monitor_id=self.process_id,
                )
                if incident is None:
                    if judged and value > rule.threshold:
                        self._incidents[(rule.name, key)] = _Incident(alert=measured, current=measured)
                        self._fired += 1
                        notices.append(measured)
                    continue
                cleared = value <= rule.threshold * rule.clear_ratio if judged else count == 0
                if cleared:
                    del self._incidents[(rule.name, key)]
                    self._resolved += 1
                    notices.append(
                        dataclasses.replace(measured, state=AlertState.RESOLVED, fired_at=incident.alert.fired_at)
                    )
                else:
                    incident.current = dataclasses.replace(measured, fired_at=incident.alert.fired_at)
                    self._alerts_dirty = True
        return notices

    # --- delivery -----------------------------------------------------------------------

    def _publish(self, alert: Alert) -> None:
        if self.log_alerts:
            name = "alert_firing" if alert.firing else "alert_resolved"
            log.warning(
                "asynccoord.monitor.%s rule=%s event=%s scope=%s key=%s value=%.6g threshold=%.6g window_s=%g "
                "count=%d base=%s",
                name,
                alert.rule,
                alert.event,
                alert.scope.value,
                alert.scope_key or "-",
                alert.value,
                alert.threshold,
                alert.window_s,
                alert.count,
                "-" if alert.base is None else alert.base,
            )
        for mailbox in list(self._mailboxes):
            mailbox.put(alert)

    def _unregister(self, mailbox: _Mailbox) -> None:
        if mailbox in self._mailboxes:
            self._mailboxes.remove(mailbox)
            self._dropped_retired += mailbox.dropped

    def alerts(self, *, buffer: int | None = None) -> AlertStream:
        """A new async iterator over the notices published from now on.

        Args:
            buffer: Notices buffered before the oldest is dropped (>= 1). Default
                the monitor's ``buffer_size``.

        Raises:
            InvalidArgumentError: ``buffer`` < 1.
        """
        size = self.buffer_size if buffer is None else check_int("buffer", buffer, minimum=1)
        mailbox = _Mailbox(size)
        if self._closed_once and not self._open:
            mailbox.close()  # closed monitor: the stream ends at once
        else:
            self._mailboxes.append(mailbox)
        return AlertStream(self, mailbox)

    def subscribe(
        self, callback: AlertCallback, *, buffer: int | None = None, timeout_s: float | None = None
    ) -> Subscription:
        """Call ``await callback(alert)`` for every notice, in a task of its own.

        A plain (sync) function is called as it is: it runs on the event loop's thread, so
        ``timeout_s`` cannot cut it short; keep it quick.

        A callback that raises or exceeds ``timeout_s`` is logged
        (``asynccoord.monitor.subscriber_failed``) and counted, and gets the next notice;
        one that falls behind loses its oldest buffered notices (counted as dropped).

        Args:
            callback: ``async def callback(alert: Alert) -> None``, or any callable
                returning an awaitable, or a plain function.
            buffer: Notices buffered for it (>= 1). Default ``buffer_size``.
            timeout_s: Longest one call may take (> 0). Default ``callback_timeout_s``.

        Returns:
            A :class:`Subscription` (``.cancel()`` to unsubscribe).

        Raises:
            InvalidTypeError: ``callback`` is not callable.
        """
        if not callable(callback):
            raise InvalidTypeError(f"callback must be callable, got {type(callback).__name__}")
        size = self.buffer_size if buffer is None else check_int("buffer", buffer, minimum=1)
        timeout = self.callback_timeout_s if timeout_s is None else check_positive("timeout_s", timeout_s)
        mailbox = _Mailbox(size)
        sub = Subscription(callback=callback, timeout_s=timeout, _mailbox=mailbox, _monitor=self)
        self._mailboxes.append(mailbox)
        self._subscriptions.append(sub)
        if self._open:
            self._start_worker(sub)
        return sub

    def _start_worker(self, sub: Subscription) -> None:
        if sub._task is None:
            sub._task = asyncio.get_running_loop().create_task(self._deliver(sub), name="asynccoord-monitor-subscriber")

    async def _deliver(self, sub: Subscription) -> None:
        while True:
            alert = await sub._mailbox.get()
            if alert is None:
                return
            sub.calls += 1
            try:
                async with asyncio.timeout(sub.timeout_s):
                    outcome = sub.callback(alert)
                    if inspect.isawaitable(outcome):  # a plain function has already run
                        await outcome
            except TimeoutError:
                sub.failures += 1
                log.warning(
                    "asynccoord.monitor.subscriber_failed process=%s callback=%r rule=%s error=timeout after %gs",
                    self.process_id,
                    sub.callback,
                    alert.rule,
                    sub.timeout_s,
                )
            except Exception as exc:
                sub.failures += 1
                log.warning(
                    "asynccoord.monitor.subscriber_failed process=%s callback=%r rule=%s error=%s",
                    self.process_id,
                    sub.callback,
                    alert.rule,
                    error_text(exc),  # the user's exception: its __str__ may raise
                )

    # --- inspection ---------------------------------------------------------------------

    def active_alerts(self) -> list[Alert]:
        """The firing notices of this monitor's open incidents, oldest first."""
        return sorted((inc.alert for inc in self._incidents.values()), key=lambda a: (a.fired_at, a.rule, a.scope_key))

    async def snapshot(self, windows_s: Sequence[float] = (10.0, 60.0)) -> ClusterSnapshot:
        """Cluster-wide totals, rates, latencies and stored alerts, read from the store now.

        Args:
            windows_s: Sliding windows for rates and latency quantiles, seconds.

        Raises:
            StoreError: the read failed.
        """
        return await cluster_snapshot(self.store, windows_s)

    def statistics(self) -> MonitorStats:
        """A snapshot of this monitor's own counters (flushes, notices, drops, failures)."""
        dropped = self._dropped_retired + sum(m.dropped for m in self._mailboxes)
        return MonitorStats(
            process_id=self.process_id,
            flushes=self._flushes,
            flush_failures=self._flush_failures,
            evaluations=self._evaluations,
            evaluate_failures=self._evaluate_failures,
            alerts_fired=self._fired,
            alerts_resolved=self._resolved,
            alerts_dropped=dropped,
            callback_failures=sum(s.failures for s in self._subscriptions),
            subscribers=len(self._mailboxes),
            active_alerts=len(self._incidents),
        )


def _group_counts(scope: AlertScope, counts: Mapping[CounterKey, int]) -> dict[str, dict[str, int]]:
    """Window counts grouped by the rule's scope: scope key -> event name -> count."""
    out: dict[str, dict[str, int]] = {}
    for (pid, where, name), value in counts.items():
        if scope is AlertScope.NODE:
            if where == PROCESS_SCOPE:
                continue
            key = where
        else:
            if where != PROCESS_SCOPE:
                continue
            key = "" if scope is AlertScope.CLUSTER else pid
        group = out.setdefault(key, {})
        group[name] = group.get(name, 0) + value
    return out
