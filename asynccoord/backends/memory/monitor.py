"""The conflict monitor's counters in plain Python objects: the reference semantics.

:class:`MemoryMonitorOps` is a mixin of :class:`~asynccoord.backends.memory.store.MemoryStore`.
Each method hands control to the loop once at its entry (the store's ``_enter``), then
runs to completion without awaiting, so each is atomic; time buckets follow the store's
injectable clock (``self._clock``), which makes sliding windows
deterministic in tests. Semantics are those of
:class:`~asynccoord.contract.monitor.MonitorStore`; the SQLite implementation
(:mod:`.sqlite_monitor`) must behave the same.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...config import StoreConfig
from ...contract.monitor import (
    PROCESS_RETENTION_S,
    RETIRED_PROCESS_ID,
    CounterKey,
    MetricsFlush,
    MetricsView,
    QueueBacklog,
    QueueDepth,
    bucket_of,
    check_backlog_queues,
    check_windows,
)
from ...events import EventCounter
from ...models import TaskStatus
from ..metricrows import decode_alerts, encode_flush, latency_from_rows, process_report

if TYPE_CHECKING:
    from ...models import Task

__all__ = ("MemoryMonitorOps",)


@dataclass(slots=True)
class _MonitorTables:
    counts: dict[tuple[int, str, str, str], int] = field(default_factory=dict)  # (bucket, pid, scope, name)
    latency: dict[tuple[int, str, str, int], tuple[int, float]] = field(
        default_factory=dict
    )  # (bucket, pid, name, slot)
    totals: dict[CounterKey, tuple[int, float]] = field(default_factory=dict)  # -> (value, updated_at)
    processes: dict[str, tuple[str, float, float]] = field(default_factory=dict)  # -> (info, first, last)
    alerts: dict[tuple[str, str, str], tuple[str, float, float]] = field(default_factory=dict)  # -> (json, seen, exp)


class MemoryMonitorOps:
    """The :class:`~asynccoord.contract.monitor.MonitorStore` primitives of the in-memory store.

    A mixin: it relies on the store's ``_clock``, ``_enter``, ``_unfinished`` and ``_done``
    (each queue's pending, running and dead tasks, and its count of done ones).
    """

    config: StoreConfig
    events: EventCounter
    _clock: Callable[[], float]
    _undone: dict[str, dict[int, None]]
    _done: dict[str, int]
    _removed: dict[str, int]

    if TYPE_CHECKING:

        async def _enter(self) -> None: ...

        def _unfinished(self, queue: str) -> list[Task]: ...

    @functools.cached_property
    def _monitor_tables(self) -> _MonitorTables:
        return _MonitorTables()

    async def flush_metrics(self, flush: MetricsFlush) -> float:
        """Add one process' deltas to the current time bucket atomically (see the SQLite store).

        Returns:
            The store clock of the write, seconds.

        Raises:
            InvalidTypeError, InvalidArgumentError: a bad ``flush``; nothing written.
        """
        enc = encode_flush(flush)
        await self._enter()
        now = self._clock()
        bucket = bucket_of(now)
        t = self._monitor_tables
        pid = enc.process_id
        old = t.processes.get(pid)
        t.processes[pid] = (enc.info_json, now if old is None else old[1], now)
        for scope, name, delta in enc.counts:
            key = (bucket, pid, scope, name)
            t.counts[key] = t.counts.get(key, 0) + delta
            total = t.totals.get((pid, scope, name), (0, now))[0]
            t.totals[(pid, scope, name)] = (total + delta, now)
        for name, slot, count, sum_ms in enc.latency:
            lkey = (bucket, pid, name, slot)
            c, s = t.latency.get(lkey, (0, 0.0))
            t.latency[lkey] = (c + count, s + sum_ms)
        if enc.alerts is not None:
            for akey in [k for k in t.alerts if k[0] == pid]:
                del t.alerts[akey]
            for rule, scope_key, text in enc.alerts:
                t.alerts[(pid, rule, scope_key)] = (text, now, now + enc.alert_ttl_s)
        cutoff = bucket_of(now - enc.retention_s)
        for ckey in [k for k in t.counts if k[0] < cutoff]:
            del t.counts[ckey]
        for lkey in [k for k in t.latency if k[0] < cutoff]:
            del t.latency[lkey]
        for akey in [k for k, v in t.alerts.items() if v[2] <= now]:
            del t.alerts[akey]
        retired = now - PROCESS_RETENTION_S
        for tkey, (value, updated_at) in list(t.totals.items()):
            if updated_at < retired and tkey[0] != RETIRED_PROCESS_ID:
                del t.totals[tkey]
                if tkey[1] == "":
                    rkey = (RETIRED_PROCESS_ID, "", tkey[2])
                    t.totals[rkey] = (t.totals.get(rkey, (0, now))[0] + value, now)
        for ppid in [p for p, v in t.processes.items() if v[2] < retired]:
            del t.processes[ppid]
        return now

    async def read_metrics(self, windows_s: Sequence[float] = (10.0, 60.0)) -> MetricsView:
        """Every process' counters, windowed sums, latencies and alerts (see the SQLite store).

        Raises:
            InvalidTypeError, InvalidArgumentError: bad ``windows_s``.
        """
        windows = check_windows(windows_s)
        await self._enter()
        now = self._clock()
        t = self._monitor_tables
        counted: dict[float, dict[CounterKey, int]] = {}
        latencies = {}
        for window in windows:
            since = now - window
            sums: dict[CounterKey, int] = {}
            for (bucket, pid, scope, name), value in t.counts.items():
                if bucket > since:
                    sums[(pid, scope, name)] = sums.get((pid, scope, name), 0) + value
            counted[window] = sums
            latencies[window] = latency_from_rows(
                (name, slot, c, s) for (bucket, _pid, name, slot), (c, s) in t.latency.items() if bucket > since
            )
        live = sorted(((v[1], k), v[0]) for k, v in t.alerts.items() if v[2] > now)
        return MetricsView(
            now_s=now,
            totals={k: v[0] for k, v in t.totals.items()},
            windows=counted,
            latencies=latencies,
            processes={
                pid: process_report(pid, info, first, last, now)
                for pid, (info, first, last) in sorted(t.processes.items())
            },
            alerts=decode_alerts(text for _, text in live),
        )

    async def queue_depths(self) -> list[QueueDepth]:
        """Tasks by queue and status, with each queue's oldest due pending age."""
        await self._enter()
        now = self._clock()
        counts: dict[str, dict[str, int]] = {}
        oldest: dict[str, float] = {}
        lapsed: dict[str, int] = {}
        for queue, done in self._done.items():
            if done:
                counts.setdefault(queue, {s.value: 0 for s in TaskStatus})[TaskStatus.DONE.value] = done
        for task in (t for queue in list(self._undone) for t in self._unfinished(queue)):
            per = counts.setdefault(task.queue, {s.value: 0 for s in TaskStatus})
            per[task.status.value] += 1
            if task.status is TaskStatus.PENDING and task.run_at <= now:
                oldest[task.queue] = min(oldest.get(task.queue, task.run_at), task.run_at)
            expiry = task.lease_expires_at
            if task.status is TaskStatus.RUNNING and expiry is not None and expiry <= now:
                lapsed[task.queue] = lapsed.get(task.queue, 0) + 1
        for queue in self._removed:
            counts.setdefault(queue, {s.value: 0 for s in TaskStatus})
        return [
            QueueDepth(
                queue=queue,
                counts=counts[queue],
                oldest_pending_age_s=None if queue not in oldest else max(0.0, now - oldest[queue]),
                expired_leases=lapsed.get(queue, 0),
                removed=self._removed.get(queue, 0),
            )
            for queue in sorted(counts)
        ]

    async def queue_backlogs(self, queues: Sequence[str]) -> list[QueueBacklog]:
        """Pending, running and dead tasks and the oldest due pending age of each queue (see the SQLite store).

        Raises:
            InvalidTypeError, InvalidArgumentError: bad ``queues``.
        """
        wanted = check_backlog_queues(queues)
        await self._enter()
        now = self._clock()
        counts = {queue: dict.fromkeys(TaskStatus, 0) for queue in wanted}
        oldest: dict[str, float] = {}
        for task in (t for queue in wanted for t in self._unfinished(queue)):  # never the done tasks
            per = counts[task.queue]
            per[task.status] += 1
            if task.status is TaskStatus.PENDING and task.run_at <= now:
                oldest[task.queue] = min(oldest.get(task.queue, task.run_at), task.run_at)
        return [
            QueueBacklog(
                queue=queue,
                pending=counts[queue][TaskStatus.PENDING],
                running=counts[queue][TaskStatus.RUNNING],
                dead=counts[queue][TaskStatus.DEAD],
                oldest_pending_age_s=None if queue not in oldest else max(0.0, now - oldest[queue]),
            )
            for queue in wanted
        ]
