"""The conflict monitor's counters on SQLite: the monitor primitives of :class:`SQLiteStore`.

:class:`SQLiteMonitorOps` is a mixin of :class:`~asynccoord.backends.sqlite.store.SQLiteStore`.
A flush is one operation ``fn(db, now_s)`` handed to the store's group committer, so a
process' counter deltas, histogram deltas, alert refresh and the purge of old buckets
are one ``BEGIN IMMEDIATE`` transaction (usually sharing its commit with the nodes'
claims and commits), stamped with the store clock. A read is one deferred read
transaction on the store's connection, so every number of a :class:`MetricsView` comes
from one snapshot of the database; under WAL it never waits for, nor blocks, a writer.
Semantics are those of :class:`~asynccoord.contract.monitor.MonitorStore`; the schema is
``migration_0001.sql`` and the queries are in ``sql/sqlite/monitor.sql``.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

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
from ..rows import shown_text
from ..sqlfiles import load_queries

if TYPE_CHECKING:
    from .writer import GroupCommitter, Operation

__all__ = ("SQLiteMonitorOps",)

Q = load_queries("sqlite")

_STATUSES = ("pending", "running", "done", "dead")


def _in_read_transaction(db: sqlite3.Connection, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` inside one deferred read transaction, so its statements see one snapshot."""
    db.execute("BEGIN")
    try:
        return fn()
    finally:
        if db.in_transaction:
            db.execute("COMMIT")


class SQLiteMonitorOps:
    """The :class:`~asynccoord.contract.monitor.MonitorStore` primitives of the SQLite store.

    A mixin: it relies on the store's ``_write`` (group-committed operation), ``_read``
    and ``_w`` (the group committer, for the clock).
    """

    config: StoreConfig
    events: EventCounter

    if TYPE_CHECKING:

        async def _write(
            self, fn: Operation[Any], undo: Callable[[Any], Operation[Any] | None] | None = None
        ) -> Any: ...

        async def _read(self, fn: Callable[[sqlite3.Connection], Any]) -> Any: ...

        def _w(self) -> GroupCommitter: ...

    async def flush_metrics(self, flush: MetricsFlush) -> float:
        """Add one process' counter and histogram deltas to the current time bucket, in one write.

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
            StoreBusyError: the database stayed locked past ``busy_timeout_s``.
        """
        enc = encode_flush(flush)
        counts = json.dumps(enc.counts, separators=(",", ":"))
        latency = json.dumps(enc.latency, separators=(",", ":"))
        alerts = None if enc.alerts is None else json.dumps(enc.alerts, separators=(",", ":"))
        key = {"process_id": enc.process_id}

        def op(db: sqlite3.Connection, now: float) -> float:
            bucket = bucket_of(now)
            db.execute(Q["metric_process_upsert"], {**key, "info": enc.info_json, "now": now})
            if enc.counts:
                db.execute(Q["metric_counts_add"], {**key, "bucket": bucket, "counts": counts})
                db.execute(Q["metric_totals_add"], {**key, "counts": counts, "now": now})
            if enc.latency:
                db.execute(Q["metric_latency_add"], {**key, "bucket": bucket, "latency": latency})
            if alerts is not None:
                db.execute(Q["metric_alerts_clear"], key)
                if enc.alerts:
                    db.execute(
                        Q["metric_alerts_insert"], {**key, "alerts": alerts, "now": now, "alert_ttl_s": enc.alert_ttl_s}
                    )
            cutoff = bucket_of(now - enc.retention_s)
            db.execute(Q["metric_purge_counts"], {"cutoff": cutoff})
            db.execute(Q["metric_purge_latency"], {"cutoff": cutoff})
            db.execute(Q["metric_purge_alerts"], {"now": now})
            retired = now - PROCESS_RETENTION_S
            db.execute(Q["metric_retire_totals"], {"cutoff": retired, "now": now})
            db.execute(Q["metric_retire_delete"], {"cutoff": retired})
            db.execute(Q["metric_retire_processes"], {"cutoff": retired})
            return now

        return float(await self._write(op))

    async def read_metrics(self, windows_s: Sequence[float] = (10.0, 60.0)) -> MetricsView:
        """Read every process' counters, windowed sums, latencies and alerts, in one snapshot.

        Args:
            windows_s: Sliding windows to sum over, seconds (> 0; at most 16).

        Returns:
            A :class:`~asynccoord.contract.monitor.MetricsView` at the store clock now.

        Raises:
            InvalidTypeError, InvalidArgumentError: bad ``windows_s``.
            StoreError: the read failed.
        """
        windows = check_windows(windows_s)
        writer = self._w()

        def read(db: sqlite3.Connection) -> MetricsView:
            def run() -> MetricsView:
                now = writer.now(db)
                totals = sum_counts(db.execute(Q["metric_read_totals"]).fetchall())
                counted: dict[float, dict[CounterKey, int]] = {}
                latencies: dict[float, dict[str, Histogram]] = {}
                for window in windows:
                    since = now - window
                    counted[window] = sum_counts(db.execute(Q["metric_read_window_counts"], {"since": since}))
                    latencies[window] = latency_from_rows(
                        db.execute(Q["metric_read_window_latency"], {"since": since}).fetchall()
                    )
                processes = {
                    row[0]: process_report(row[0], row[1], row[2], row[3], now)
                    for row in db.execute(Q["metric_read_processes"]).fetchall()
                }
                alerts = decode_alerts(row[0] for row in db.execute(Q["metric_read_alerts"], {"now": now}))
                return MetricsView(
                    now_s=now,
                    totals=totals,
                    windows=counted,
                    latencies=latencies,
                    processes=processes,
                    alerts=alerts,
                )

            result: MetricsView = _in_read_transaction(db, run)
            return result

        view: MetricsView = await self._read(read)
        return view

    async def queue_depths(self) -> list[QueueDepth]:
        """Tasks by queue and status, each queue's oldest due pending age and expired leases, in one snapshot.

        Counts each status in its partial index (``queue_depths``): index entries, never the task
        rows, yet every task's entry (the done tasks' too): meant for the status command and the
        dashboard, not a hot path.

        Returns:
            One :class:`~asynccoord.contract.monitor.QueueDepth` per queue, by queue name.

        Raises:
            StoreError: the read failed.
        """
        writer = self._w()

        Rows = list[tuple[Any, ...]]

        def read(db: sqlite3.Connection) -> tuple[float, Rows, Rows, Rows, Rows]:
            def run() -> tuple[float, Rows, Rows, Rows, Rows]:
                now = writer.now(db)
                counts = db.execute(Q["queue_depths"]).fetchall()
                oldest = db.execute(Q["queue_oldest_pending"], {"now": now}).fetchall()
                expired = db.execute(Q["queue_expired_leases"], {"now": now}).fetchall()
                removed = db.execute(Q["queue_removed"]).fetchall()
                return now, counts, oldest, expired, removed

            result: tuple[float, Rows, Rows, Rows, Rows] = _in_read_transaction(db, run)
            return result

        now, counts, oldest, expired, removed = await self._read(read)
        # A queue name another tool stored as no text (a BLOB, bytes that are no UTF-8) is shown as its repr.
        counts, oldest, expired, removed = (
            [(shown_text(r[0]), *r[1:]) for r in rows] for rows in (counts, oldest, expired, removed)
        )
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

        Three partial-index counts per queue (``queue_backlog``), never a scan of the done tasks,
        in one read transaction on the store's connection (also read-only).

        Raises:
            InvalidTypeError, InvalidArgumentError: bad ``queues`` (nothing read).
            StoreError: the read failed.
        """
        wanted = check_backlog_queues(queues)
        writer = self._w()

        def read(db: sqlite3.Connection) -> tuple[float, list[tuple[Any, ...]]]:
            def run() -> tuple[float, list[tuple[Any, ...]]]:
                now = writer.now(db)
                rows = [db.execute(Q["queue_backlog"], {"queue": q, "now": now}).fetchone() for q in wanted]
                return now, rows

            result: tuple[float, list[tuple[Any, ...]]] = _in_read_transaction(db, run)
            return result

        now, rows = await self._read(read)
        return [backlog_of(queue, now, row) for queue, row in zip(wanted, rows, strict=True)]
