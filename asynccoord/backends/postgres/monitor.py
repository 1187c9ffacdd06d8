"""The conflict monitor's counters on PostgreSQL: the monitor primitives of :class:`PostgresStore`.

:class:`PostgresMonitorOps` is a mixin of :class:`~asynccoord.backends.postgres.store.PostgresStore`.
A flush is one transaction: the first statement stamps the process with the server
clock, and every other statement of the flush uses that same instant (bucket, totals,
alerts, purges), so a flush lands in exactly one 1-second bucket. Deltas add with
``ON CONFLICT DO UPDATE``, so any number of processes flush concurrently. A read runs in
one ``REPEATABLE READ READ ONLY`` transaction, so every number of a
:class:`~asynccoord.contract.monitor.MetricsView` comes from one snapshot. Semantics are
those of :class:`~asynccoord.contract.monitor.MonitorStore`; the schema is
``migration_0001.sql`` and the queries are in ``sql/postgres/monitor.sql``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ...config import StoreConfig
from ...contract.monitor import (
    PROCESS_RETENTION_S,
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
from ...monitor.histogram import Histogram
from ..metricrows import backlog_of, decode_alerts, encode_flush, latency_from_rows, process_report, sum_counts

if TYPE_CHECKING:
    import asyncpg

__all__ = ("PostgresMonitorOps",)

T = TypeVar("T")

_STATUSES = ("pending", "running", "done", "dead")


class PostgresMonitorOps:
    """The :class:`~asynccoord.contract.monitor.MonitorStore` primitives of the PostgreSQL store.

    A mixin: it relies on the store's ``_run``, statement helpers, ``_now`` and ``_writable``.
    """

    config: StoreConfig
    events: EventCounter

    if TYPE_CHECKING:

        async def _run(self, fn: Callable[[asyncpg.Connection, int], Awaitable[T]], *, what: str, **kw: Any) -> T: ...

        async def _fetch(self, conn: asyncpg.Connection, query_name: str, /, **params: Any) -> list[Any]: ...

        async def _val(self, conn: asyncpg.Connection, query_name: str, /, **params: Any) -> Any: ...

        async def _x(self, conn: asyncpg.Connection, query_name: str, /, **params: Any) -> None: ...

        def _now(self) -> float | None: ...

        def _writable(self) -> None: ...

    async def flush_metrics(self, flush: MetricsFlush) -> float:
        """Add one process' counter and histogram deltas to the current time bucket, in one transaction.

        The same transaction adds the counter deltas to the process' lifetime totals,
        replaces the monitor's stored firing alerts (when ``flush.alerts`` is not None),
        purges time buckets older than ``flush.retention_s`` and expired alerts, and
        folds the totals of processes silent for a day into ``"*retired*"``.

        Args:
            flush: The deltas (see :class:`~asynccoord.contract.monitor.MetricsFlush`).

        Returns:
            The store clock of the write, seconds.

        Raises:
            InvalidTypeError, InvalidArgumentError: a bad ``flush``; nothing written.
            ReadOnlyStoreError: the store was opened read-only.
            StoreConnectionError: the server stayed unreachable (a flush is not retried
                after an unknown outcome: its deltas would count twice).
        """
        enc = encode_flush(flush)
        self._writable()
        key = {"process_id": enc.process_id}
        counts = {
            "scopes": [c[0] for c in enc.counts],
            "names": [c[1] for c in enc.counts],
            "deltas": [int(c[2]) for c in enc.counts],
        }
        latency = {
            "names": [row[0] for row in enc.latency],
            "slots": [int(row[1]) for row in enc.latency],
            "counts": [int(row[2]) for row in enc.latency],
            "sums": [float(row[3]) for row in enc.latency],
        }

        async def op(conn: asyncpg.Connection, _attempt: int) -> float:
            at = float(await self._val(conn, "metric_process_upsert", info=enc.info_json, now=self._now(), **key))
            bucket = bucket_of(at)
            if enc.counts:
                await self._x(conn, "metric_counts_add", bucket=bucket, **key, **counts)
                await self._x(conn, "metric_totals_add", flushed_at=at, **key, **counts)
            if enc.latency:
                await self._x(conn, "metric_latency_add", bucket=bucket, **key, **latency)
            if enc.alerts is not None:
                await self._x(conn, "metric_alerts_clear", **key)
                if enc.alerts:
                    await self._x(
                        conn,
                        "metric_alerts_insert",
                        rules=[a[0] for a in enc.alerts],
                        scope_keys=[a[1] for a in enc.alerts],
                        alerts=[a[2] for a in enc.alerts],
                        flushed_at=at,
                        alert_ttl_s=enc.alert_ttl_s,
                        **key,
                    )
            cutoff = bucket_of(at - enc.retention_s)
            await self._x(conn, "metric_purge_counts", cutoff=cutoff)
            await self._x(conn, "metric_purge_latency", cutoff=cutoff)
            await self._x(conn, "metric_purge_alerts", flushed_at=at)
            retired = at - PROCESS_RETENTION_S
            await self._x(conn, "metric_retire_totals", cutoff=retired, flushed_at=at)
            await self._x(conn, "metric_retire_delete", cutoff=retired)
            await self._x(conn, "metric_retire_processes", cutoff=retired)
            return at

        return await self._run(op, what="flush_metrics")

    async def _snapshot(self, fn: Callable[[asyncpg.Connection], Awaitable[T]], what: str) -> T:
        """Run ``fn`` in one REPEATABLE READ, READ ONLY transaction (one snapshot)."""

        async def op(conn: asyncpg.Connection, _attempt: int) -> T:
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                return await fn(conn)

        return await self._run(op, what=what, tx=False, ambiguous_ok=True)

    async def read_metrics(self, windows_s: Sequence[float] = (10.0, 60.0)) -> MetricsView:
        """Read every process' counters, windowed sums, latencies and alerts, in one snapshot.

        Args:
            windows_s: Sliding windows to sum over, seconds (> 0; at most 16).

        Returns:
            A :class:`~asynccoord.contract.monitor.MetricsView` at the store clock now.

        Raises:
            InvalidTypeError, InvalidArgumentError: bad ``windows_s``.
            StoreConnectionError: the server stayed unreachable.
        """
        windows = check_windows(windows_s)

        async def read(conn: asyncpg.Connection) -> MetricsView:
            now = float(await self._val(conn, "now", now=self._now()))
            totals = sum_counts(await self._fetch(conn, "metric_read_totals"))
            counted: dict[float, dict[CounterKey, int]] = {}
            latencies: dict[float, dict[str, Histogram]] = {}
            for window in windows:
                since = now - window
                counted[window] = sum_counts(await self._fetch(conn, "metric_read_window_counts", since=since))
                latencies[window] = latency_from_rows(
                    [tuple(r) for r in await self._fetch(conn, "metric_read_window_latency", since=since)]
                )
            processes = {
                row[0]: process_report(row[0], row[1], row[2], row[3], now)
                for row in await self._fetch(conn, "metric_read_processes")
            }
            alerts = decode_alerts(row[0] for row in await self._fetch(conn, "metric_read_alerts", now_s=now))
            return MetricsView(
                now_s=now, totals=totals, windows=counted, latencies=latencies, processes=processes, alerts=alerts
            )

        return await self._snapshot(read, "read_metrics")

    async def queue_depths(self) -> list[QueueDepth]:
        """Tasks by queue and status, each queue's oldest due pending age and expired leases, in one snapshot.

        Counts each status in its partial index (``queue_depths``), never the task rows, yet
        every task's entry (the done tasks' too): meant for the status command and the
        dashboard, not a hot path.

        Returns:
            One :class:`~asynccoord.contract.monitor.QueueDepth` per queue, by queue name.
        """

        async def read(conn: asyncpg.Connection) -> tuple[float, list[Any], list[Any], list[Any], list[Any]]:
            now = float(await self._val(conn, "now", now=self._now()))
            counts = await self._fetch(conn, "queue_depths")
            oldest = await self._fetch(conn, "queue_oldest_pending", now_s=now)
            expired = await self._fetch(conn, "queue_expired_leases", now_s=now)
            removed = await self._fetch(conn, "queue_removed")
            return now, counts, oldest, expired, removed

        now, counts, oldest, expired, removed = await self._snapshot(read, "queue_depths")
        by_queue: dict[str, dict[str, int]] = {}
        for queue, status, n in counts:
            by_queue.setdefault(queue, dict.fromkeys(_STATUSES, 0))[status] = int(n)
        gone = {queue: int(done) + int(dead) for queue, done, dead in removed}
        for queue in gone:  # every task purged: still a queue, with its finished work
            by_queue.setdefault(queue, dict.fromkeys(_STATUSES, 0))
        ages = {queue: max(0.0, now - float(at)) for queue, at in oldest if at is not None}
        lapsed = {queue: int(n) for queue, n in expired}
        return [
            QueueDepth(
                queue=queue,
                counts=by_queue[queue],
                oldest_pending_age_s=ages.get(queue),
                expired_leases=lapsed.get(queue, 0),
                removed=gone.get(queue, 0),
            )
            for queue in sorted(by_queue)
        ]

    async def queue_backlogs(self, queues: Sequence[str]) -> list[QueueBacklog]:
        """Pending, running and dead tasks and the oldest due pending age of each queue, in one snapshot.

        Three partial-index counts and one seek per queue (``queue_backlog``), never a scan of
        the done tasks, in one ``REPEATABLE READ READ ONLY`` transaction.

        Raises:
            InvalidTypeError, InvalidArgumentError: bad ``queues`` (nothing read).
            StoreConnectionError: the server stayed unreachable.
        """
        wanted = check_backlog_queues(queues)

        async def read(conn: asyncpg.Connection) -> tuple[float, list[Any]]:
            now = float(await self._val(conn, "now", now=self._now()))
            rows = [(await self._fetch(conn, "queue_backlog", queue=q, now_s=now))[0] for q in wanted]
            return now, rows

        now, rows = await self._snapshot(read, "queue_backlogs")
        return [backlog_of(queue, now, row) for queue, row in zip(wanted, rows, strict=True)]
