"""What the engines share to write and read the monitor's tables: flushes as rows, rows as records.

Only the stores under :mod:`asynccoord.backends` use these; the records and the checks
of their arguments are in :mod:`asynccoord.contract.monitor`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..contract.monitor import Alert, CounterKey, MetricsFlush, ProcessReport, QueueBacklog
from ..errors import InvalidArgumentError, InvalidTypeError
from ..monitor.histogram import Histogram

__all__ = (
    "EncodedFlush",
    "backlog_of",
    "decode_alerts",
    "encode_flush",
    "latency_from_rows",
    "merge_counts",
    "process_report",
    "sum_counts",
)


@dataclass(frozen=True, slots=True)
class EncodedFlush:
    """A validated flush as rows: counts ``[scope, name, delta]``, latency ``[name, slot, count, sum_ms]``."""

    process_id: str
    counts: list[list[Any]]
    latency: list[list[Any]]
    alerts: list[list[str]] | None
    info_json: str
    alert_ttl_s: float
    retention_s: float


def encode_flush(flush: MetricsFlush) -> EncodedFlush:
    """Turn a :class:`MetricsFlush` into rows (zero deltas dropped).

    Raises:
        InvalidTypeError: ``flush`` is not a MetricsFlush, or ``info`` is not JSON.
    """
    if not isinstance(flush, MetricsFlush):
        raise InvalidTypeError(f"flush must be a MetricsFlush, got {type(flush).__name__}")
    counts = [[scope, name, delta] for (scope, name), delta in sorted(flush.counters.items()) if delta]
    latency: list[list[Any]] = []
    for name, hist in sorted(flush.latencies.items()):
        if hist.count == 0:
            continue
        latency.append([name, -1, hist.count, hist.sum_ms])
        latency.extend([name, slot, n, 0.0] for slot, n in hist.nonzero())
    alerts = None
    if flush.alerts is not None:
        alerts = [
            [a.rule, a.scope_key, json.dumps({**a.to_dict(), "monitor_id": flush.process_id}, separators=(",", ":"))]
            for a in flush.alerts
        ]
    try:
        info_json = json.dumps(dict(flush.info), separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidTypeError(f"info must be a JSON object: {exc}") from exc
    return EncodedFlush(
        process_id=flush.process_id,
        counts=counts,
        latency=latency,
        alerts=alerts,
        info_json=info_json,
        alert_ttl_s=flush.alert_ttl_s,
        retention_s=flush.retention_s,
    )


def latency_from_rows(rows: Iterable[tuple[str, int, int, float]]) -> dict[str, Histogram]:
    """Histograms from ``(name, slot, count, sum_ms)`` rows (slot -1 carries the sum)."""
    slots: dict[str, dict[int, int]] = {}
    sums: dict[str, float] = {}
    for name, slot, count, sum_ms in rows:
        if slot < 0:
            sums[name] = sums.get(name, 0.0) + float(sum_ms)
        else:
            per = slots.setdefault(name, {})
            per[int(slot)] = per.get(int(slot), 0) + int(count)
    return {name: Histogram.from_slots(per, sums.get(name, 0.0)) for name, per in sorted(slots.items())}


def process_report(process_id: str, info_json: str, first: float, last: float, now: float) -> ProcessReport:
    """A :class:`ProcessReport` from a stored row."""
    info = json.loads(info_json)
    return ProcessReport(
        process_id=process_id,
        info=info if isinstance(info, dict) else {},
        first_flush_at=float(first),
        last_flush_at=float(last),
        last_flush_age_s=max(0.0, now - float(last)),
    )


def backlog_of(queue: str, now: float, row: Sequence[Any]) -> QueueBacklog:
    """A :class:`QueueBacklog` from a ``queue_backlog`` row ``(pending, oldest due run_at, running, dead)``."""
    pending, oldest, running, dead = row
    age = None if oldest is None else max(0.0, now - float(oldest))
    return QueueBacklog(
        queue=queue, pending=int(pending), running=int(running), dead=int(dead), oldest_pending_age_s=age
    )


def decode_alerts(texts: Iterable[str]) -> tuple[Alert, ...]:
    """Alerts from their stored JSON (unreadable rows are skipped)."""
    out: list[Alert] = []
    for text in texts:
        try:
            out.append(Alert.from_dict(json.loads(text)))
        except (ValueError, InvalidArgumentError):
            continue
    return tuple(out)


def sum_counts(rows: Iterable[tuple[str, str, str, int]]) -> dict[CounterKey, int]:
    """``(process_id, scope, name, value)`` rows as a mapping (values summed)."""
    out: dict[CounterKey, int] = {}
    for process_id, scope, name, value in rows:
        key = (process_id, scope, name)
        out[key] = out.get(key, 0) + int(value)
    return out


def merge_counts(into: dict[CounterKey, int], more: Mapping[CounterKey, int]) -> None:
    """Add ``more`` into ``into``."""
    for key, value in more.items():
        into[key] = into.get(key, 0) + value
