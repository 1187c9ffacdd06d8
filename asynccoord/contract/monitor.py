"""The monitor contract: the :class:`MonitorStore` Protocol, its records, and the checks of a read.

Records are frozen, keyword-only, slotted dataclasses. Times (``at``, ``fired_at``,
``now_s``, ``last_flush_at``) are seconds since the Unix epoch *on the store clock*;
durations are seconds; latencies are milliseconds.

Counter keys are ``(process_id, scope, name)``: ``scope`` is ``""`` for a process'
own total (its ``store.events``) and a node id for a per-node breakdown of it, so a
cluster total is the sum over the rows of scope ``""`` only.

Time buckets are 1 second of the store clock: a flush at store time ``now`` adds its
deltas to bucket ``floor(now)``, and a window of ``W`` seconds at ``now`` sums the
buckets that start after ``now - W`` (so it covers between ``W - 1`` and ``W``
seconds of flushes; a flush lands up to one flush interval after its events).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..config import StoreConfig
from ..errors import InvalidArgumentError, InvalidTypeError
from ..events import EventCounter
from ..monitor.histogram import Histogram, LatencyRecorder
from ..validation import check_lease_s, check_name, check_positive

__all__ = (
    "MAX_BACKLOG_QUEUES",
    "MAX_WINDOWS",
    "PROCESS_RETENTION_S",
    "PROCESS_SCOPE",
    "RETIRED_PROCESS_ID",
    "Alert",
    "AlertScope",
    "AlertState",
    "CounterKey",
    "MetricsFlush",
    "MetricsView",
    "MonitorStore",
    "ProcessReport",
    "QueueBacklog",
    "QueueDepth",
    "bucket_of",
    "check_backlog_queues",
    "check_windows",
    "open_alerts",
)

PROCESS_SCOPE = ""
"""The ``scope`` of a process' own counters (its ``store.events``)."""

CounterKey = tuple[str, str, str]
"""``(process_id, scope, event name)``."""


class AlertScope(enum.StrEnum):
    """What an alert rule is evaluated over."""

    CLUSTER = "cluster"
    """All processes' counters summed."""
    PROCESS = "process"
    """Each process on its own (``Alert.scope_key`` is the process id)."""
    NODE = "node"
    """Each node on its own (``Alert.scope_key`` is the node id); needs per-node counters."""


class AlertState(enum.StrEnum):
    """Where an incident is."""

    FIRING = "firing"
    RESOLVED = "resolved"


@dataclass(frozen=True, slots=True, kw_only=True)
class Alert:
    """One incident notice: a rule crossed its threshold (firing) or fell back (resolved).

    Attributes:
        rule: The rule's name.
        event: The event kind counted (e.g. ``"stale_commit_rejected"``).
        value: The measured value: a count in the window, or a ratio for a relative
            rule (0.08 = 8 %). For a resolved notice, the value that resolved it.
        threshold: The rule's threshold (same unit as ``value``).
        window_s: The sliding window, seconds.
        at: When this notice was decided, store clock.
        scope: ``cluster``, ``process`` or ``node``.
        scope_key: ``""`` for the cluster, else the process id or node id.
        state: ``firing`` or ``resolved``.
        relative_to: The events of the denominator for a relative rule, else None.
        count: Events of ``event`` in the window when decided.
        base: Events of the denominator in the window (None for an absolute rule).
        fired_at: When the incident began (equals ``at`` for the firing notice).
        monitor_id: The process id of the monitor that decided it.
        inhibited_by: The rule whose incident muted this one (see ``AlertRule.inhibited_by``), or
            None. A muted incident is stored, so ``status`` shows it and a new leader adopts it,
            but it is not published: no firing notice and no resolved notice, unless its events
            go on after its cause ended (it then fires, ``inhibited_by`` None).
    """

    rule: str
    event: str
    value: float
    threshold: float
    window_s: float
    at: float
    scope: AlertScope
    scope_key: str = ""
    state: AlertState = AlertState.FIRING
    relative_to: tuple[str, ...] | None = None
    count: int = 0
    base: int | None = None
    fired_at: float = 0.0
    monitor_id: str = ""
    inhibited_by: str | None = None

    def __post_init__(self) -> None:
        # Accept the enums' string values (records read back from JSON); mypy sees the declared types.
        scope: object = self.scope
        state: object = self.state
        relative: object = self.relative_to
        if not isinstance(scope, AlertScope):
            object.__setattr__(self, "scope", AlertScope(str(scope)))
        if not isinstance(state, AlertState):
            object.__setattr__(self, "state", AlertState(str(state)))
        if relative is not None and not isinstance(relative, tuple):
            items = (relative,) if isinstance(relative, str) else relative
            if not isinstance(items, Iterable):
                raise InvalidTypeError(f"relative_to must be a tuple of event names, got {type(items).__name__}")
            object.__setattr__(self, "relative_to", tuple(str(r) for r in items))

    @property
    def firing(self) -> bool:
        """Whether this is a firing notice."""
        return self.state is AlertState.FIRING

    @property
    def muted(self) -> bool:
        """Whether another rule's incident muted this one (``inhibited_by`` is set)."""
        return self.inhibited_by is not None

    def describe(self) -> str:
        """A one-line human description, e.g. ``stale_commit_rejected 8.0% of commits > 5.0% over 30s``."""
        where = self.scope.value if not self.scope_key else f"{self.scope.value} {self.scope_key}"
        if self.inhibited_by is not None:
            where += f", muted by {self.inhibited_by}"
        if self.relative_to is not None:
            measure = f"{self.value:.1%} of {'+'.join(self.relative_to)} ({self.count}/{self.base})"
            limit = f"{self.threshold:.1%}"
        else:
            measure, limit = f"{self.count}", f"{self.threshold:g}"
        if self.firing:
            return (
                f"[{self.state.value}] {self.rule}: {self.event} {measure} > {limit} over {self.window_s:g}s ({where})"
            )
        return (
            f"[{self.state.value}] {self.rule}: {self.event} {measure} over {self.window_s:g}s, back under the "
            f"rule's clear level (it fires above {limit}) ({where})"
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field (enums as their values)."""
        return {
            "rule": self.rule,
            "event": self.event,
            "value": self.value,
            "threshold": self.threshold,
            "window_s": self.window_s,
            "at": self.at,
            "scope": self.scope.value,
            "scope_key": self.scope_key,
            "state": self.state.value,
            "relative_to": None if self.relative_to is None else list(self.relative_to),
            "count": self.count,
            "base": self.base,
            "fired_at": self.fired_at,
            "monitor_id": self.monitor_id,
            "inhibited_by": self.inhibited_by,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Alert:
        """The alert that :meth:`to_dict` produced.

        Raises:
            InvalidArgumentError: a missing or malformed field.
        """
        try:
            relative = data.get("relative_to")
            return cls(
                rule=str(data["rule"]),
                event=str(data["event"]),
                value=float(data["value"]),
                threshold=float(data["threshold"]),
                window_s=float(data["window_s"]),
                at=float(data["at"]),
                scope=AlertScope(data["scope"]),
                scope_key=str(data.get("scope_key", "")),
                state=AlertState(data.get("state", "firing")),
                relative_to=None if relative is None else tuple(str(r) for r in relative),
                count=int(data.get("count", 0)),
                base=None if data.get("base") is None else int(data["base"]),
                fired_at=float(data.get("fired_at", data["at"])),
                monitor_id=str(data.get("monitor_id", "")),
                inhibited_by=None if data.get("inhibited_by") is None else str(data["inhibited_by"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"not an alert record: {exc}: {dict(data)!r:.200}") from exc


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricsFlush:
    """One process' batched write of counter and histogram deltas (and its firing alerts).

    Args:
        process_id: The flushing process (unique among live processes), 1..255 characters.
        counters: ``(scope, event name) -> delta`` (>= 0) since the last flush; scope
            ``""`` for the process total, a node id for a per-node breakdown.
        latencies: ``latency name -> histogram delta`` since the last flush.
        alerts: The monitor's firing alerts, and the resolved notices of cluster incidents
            it keeps for a while (see :func:`open_alerts`), replacing those it stored
            before; None leaves them as they are.
        alert_ttl_s: Stored alerts not refreshed for this long are dropped (the
            monitor died), seconds (>= 0.01, ``validation.MIN_LEASE_S``). Default 30.
        retention_s: Time buckets older than this are purged, seconds (> 0). Default 900.
        info: Free JSON object about the process (host, pid), for inspection.

    Raises:
        InvalidArgumentError, InvalidTypeError: a bad field.
    """

    process_id: str
    counters: Mapping[tuple[str, str], int] = field(default_factory=dict)
    latencies: Mapping[str, Histogram] = field(default_factory=dict)
    alerts: Sequence[Alert] | None = None
    alert_ttl_s: float = 30.0
    retention_s: float = 900.0
    info: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_name("process_id", self.process_id)
        if not isinstance(self.counters, Mapping):
            raise InvalidTypeError(f"counters must be a mapping, got {type(self.counters).__name__}")
        for key, delta in self.counters.items():
            if not (isinstance(key, tuple) and len(key) == 2):
                raise InvalidTypeError(f"counters keys must be (scope, name) pairs, got {key!r}")
            check_name("scope", key[0], allow_empty=True)
            check_name("name", key[1])
            if isinstance(delta, bool) or not isinstance(delta, int) or delta < 0:
                raise InvalidArgumentError(f"counter delta of {key!r} must be an int >= 0, got {delta!r}")
        if not isinstance(self.latencies, Mapping):
            raise InvalidTypeError(f"latencies must be a mapping, got {type(self.latencies).__name__}")
        for name, hist in self.latencies.items():
            check_name("latency name", name)
            if not isinstance(hist, Histogram):
                raise InvalidTypeError(f"latencies[{name!r}] must be a Histogram, got {type(hist).__name__}")
            if not math.isfinite(hist.sum_ms):
                raise InvalidArgumentError(f"latencies[{name!r}].sum_ms must be finite, got {hist.sum_ms!r}")
        alerts: object = self.alerts
        if alerts is not None:
            if isinstance(alerts, str | bytes) or not isinstance(alerts, Sequence):
                raise InvalidTypeError(f"alerts must be a sequence of Alert or None, got {type(alerts).__name__}")
            for alert in alerts:
                if not isinstance(alert, Alert):
                    raise InvalidTypeError(f"alerts must hold Alert records, got {type(alert).__name__}")
        check_lease_s("alert_ttl_s", self.alert_ttl_s)
        check_positive("retention_s", self.retention_s)
        if not isinstance(self.info, Mapping):
            raise InvalidTypeError(f"info must be a mapping, got {type(self.info).__name__}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessReport:
    """A process that has flushed metrics.

    Attributes:
        process_id: Its id.
        info: The JSON object of its last flush (host, pid...).
        first_flush_at: Its first flush (store clock).
        last_flush_at: Its last flush (store clock).
        last_flush_age_s: Store clock at the read minus ``last_flush_at``, seconds.
    """

    process_id: str
    info: dict[str, Any]
    first_flush_at: float
    last_flush_at: float
    last_flush_age_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricsView:
    """The cluster's counters as read back in one consistent read.

    Attributes:
        now_s: The store clock at the read.
        totals: ``(process_id, scope, name) -> count`` since each process started
            (processes silent for a day are folded into process id ``"*retired*"``).
        windows: ``window_s -> {(process_id, scope, name) -> count}``: events flushed
            in time buckets (1 s, store clock) starting after ``now_s - window_s``.
        latencies: ``window_s -> {latency name -> histogram}``, all processes merged.
        processes: Processes that flushed within the retention, by id.
        alerts: Alerts stored by every live monitor, oldest first: firing ones, and the
            resolved notices of cluster incidents kept after them (:func:`open_alerts`
            keeps what still fires).
    """

    now_s: float
    totals: Mapping[CounterKey, int]
    windows: Mapping[float, Mapping[CounterKey, int]]
    latencies: Mapping[float, Mapping[str, Histogram]]
    processes: Mapping[str, ProcessReport]
    alerts: tuple[Alert, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueDepth:
    """Tasks of one queue by status.

    Attributes:
        queue: The queue name.
        counts: ``status -> tasks`` for ``pending``, ``running``, ``done`` and ``dead``.
        oldest_pending_age_s: Age of the oldest due pending task (store clock), or None.
        expired_leases: Of the ``running`` tasks, those whose lease has expired by the store
            clock (their holder stopped renewing: the next claim takes them back). Default 0.
        removed: Finished tasks deleted from the queue so far: done tasks purged
            (``purge_finished``, the runtime's retention) and dead tasks discarded. So
            ``done + dead + removed`` never falls but for a requeue of dead tasks. Default 0.
    """

    queue: str
    counts: Mapping[str, int]
    oldest_pending_age_s: float | None
    expired_leases: int = 0
    removed: int = 0

    @property
    def total(self) -> int:
        """Tasks in the queue, any status."""
        return sum(self.counts.values())


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueBacklog:
    """The unfinished and dead tasks of one queue: what :meth:`MonitorStore.queue_backlogs` reads.

    Done tasks are not counted: each engine reads these from the indexes of pending, running
    and dead tasks, so a read costs in proportion to those, never to the done tasks kept.

    Attributes:
        queue: The queue name.
        pending: Tasks waiting to be claimed, due or not yet due.
        running: Tasks claimed under a lease (one whose lease expired included, until a claim
            takes it back).
        dead: Dead tasks, not yet requeued or discarded.
        oldest_pending_age_s: Seconds since the oldest due pending task became due, by the
            store clock; None when no pending task is due.
    """

    queue: str
    pending: int
    running: int
    dead: int
    oldest_pending_age_s: float | None


@runtime_checkable
class MonitorStore(Protocol):
    """Cluster-wide counters of the conflict monitor, over one database.

    These are the storage primitives; flushing on a timer, rules, alerts and their
    delivery live in :mod:`asynccoord.monitor.monitor`, the same for every backend. Semantics:

    * Each process flushes the *deltas* of its counters (``store.events``, optionally
      per node) and latency histograms (``store.latencies``) with ``flush_metrics``:
      one write that adds them to the current 1-second time bucket of the store clock
      and to the process' lifetime totals. Deltas add, so any number of processes
      flush concurrently and the cluster view is their sum.
    * ``read_metrics`` returns, in one snapshot at the store clock, lifetime totals
      per ``(process_id, scope, name)``, the same summed over sliding windows (time
      buckets that start after ``now - window_s``), merged latency histograms per
      window, the processes that flushed, and the firing alerts every live monitor
      stored (a monitor's alerts expire ``alert_ttl_s`` after its last flush).
    * The tables are bounded: each flush purges time buckets older than its
      ``retention_s`` and folds the totals of processes silent for a day into the
      process id ``"*retired*"``.
    * Time is the store clock inside the statement, never a caller's clock.

    Every method validates its arguments before touching the database and raises
    :class:`~asynccoord.errors.InvalidArgumentError` or
    :class:`~asynccoord.errors.InvalidTypeError` naming the value, with nothing written.
    """

    config: StoreConfig
    events: EventCounter
    latencies: LatencyRecorder

    async def now(self) -> float:
        """The store clock: seconds since the Unix epoch."""
        ...

    async def flush_metrics(self, flush: MetricsFlush) -> float:
        """Add one process' deltas (and replace its stored alerts) in one write; return the store clock."""
        ...

    async def read_metrics(self, windows_s: Sequence[float] = (10.0, 60.0)) -> MetricsView:
        """Every process' totals, windowed sums, latencies and alerts, in one snapshot."""
        ...

    async def queue_depths(self) -> list[QueueDepth]:
        """Tasks by queue and status, with each queue's oldest due pending age and expired leases (store clock)."""
        ...

    async def queue_backlogs(self, queues: Sequence[str]) -> list[QueueBacklog]:
        """One :class:`QueueBacklog` per distinct queue of ``queues``, in order, from one snapshot.

        A read (it works on a store opened read-only) of the pending, running and dead tasks'
        indexes only: cheap to repeat, unlike :meth:`queue_depths`, which counts every task, done ones too.
        A queue without tasks has zeros.

        Raises:
            InvalidTypeError, InvalidArgumentError: ``queues`` is no list or tuple of queue
                names, or holds more than :data:`MAX_BACKLOG_QUEUES` (nothing read).
        """
        ...


RETIRED_PROCESS_ID = "*retired*"
"""Process id under which the totals of processes silent for ``PROCESS_RETENTION_S`` are folded."""

PROCESS_RETENTION_S = 24 * 3600.0
"""A process that has not flushed for this long is retired (its totals folded), seconds."""

MAX_WINDOWS = 16
"""Most distinct windows one read may ask for."""

MAX_BACKLOG_QUEUES = 1000
"""Most distinct queues one :meth:`MonitorStore.queue_backlogs` read may ask for."""


def bucket_of(now_s: float) -> int:
    """The 1-second time bucket holding store time ``now_s``."""
    return math.floor(now_s)


def check_windows(windows_s: Sequence[float]) -> tuple[float, ...]:
    """Validate a read's windows: a sequence of distinct seconds > 0, at most 16.

    Raises:
        InvalidTypeError, InvalidArgumentError: naming the bad value.
    """
    if isinstance(windows_s, str | bytes) or not isinstance(windows_s, Sequence):
        raise InvalidTypeError(f"windows_s must be a sequence of seconds, got {type(windows_s).__name__}")
    out = tuple(dict.fromkeys(check_positive(f"windows_s[{i}]", w) for i, w in enumerate(windows_s)))
    if len(out) > MAX_WINDOWS:
        raise InvalidArgumentError(f"windows_s may hold at most {MAX_WINDOWS} windows, got {len(out)}")
    return out


def check_backlog_queues(queues: object) -> tuple[str, ...]:
    """Validate the queues of a :meth:`MonitorStore.queue_backlogs` read; return them, repeats dropped.

    Raises:
        InvalidTypeError: ``queues`` is not a list or tuple, or holds a non-str.
        InvalidArgumentError: a bad queue name, or more than :data:`MAX_BACKLOG_QUEUES` queues.
    """
    if not isinstance(queues, list | tuple):
        raise InvalidTypeError(f"queues must be a list or tuple of queue names, got {type(queues).__name__}")
    out = tuple(dict.fromkeys(check_name(f"queues[{i}]", q) for i, q in enumerate(queues)))
    if len(out) > MAX_BACKLOG_QUEUES:
        raise InvalidArgumentError(f"queues may hold at most {MAX_BACKLOG_QUEUES} queues, got {len(out)}")
    return out


def open_alerts(alerts: Sequence[Alert]) -> tuple[Alert, ...]:
    """The stored alerts of incidents still open: firing ones that no resolved notice closed.

    A monitor's stored alerts outlive it by ``alert_ttl_s``, so the firing alert of a
    monitor that died stays stored after another has resolved its incident. The monitor
    judging the cluster rules therefore keeps the resolved notice of each cluster incident
    stored as long: a firing alert of the same rule and scope key that began (``fired_at``)
    no later than the latest such notice was resolved (``at``) is closed. Resolved notices
    themselves are left out.
    """
    resolved_at: dict[tuple[str, str], float] = {}
    for alert in alerts:
        if not alert.firing:
            key = (alert.rule, alert.scope_key)
            resolved_at[key] = max(resolved_at.get(key, alert.at), alert.at)
    return tuple(a for a in alerts if a.firing and a.fired_at > resolved_at.get((a.rule, a.scope_key), float("-inf")))
