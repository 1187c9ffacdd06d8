"""The demo's final report: what the gateway saw against what the queue says, as JSON or tables.

The verdict (``ok``) holds only when no message was delivered twice, none was lost, no
account sent two messages at once, no conversation was sent out of order, and every
second send of a message follows a counted lease loss or interrupted send.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from .. import events as ev
from ..backends.open import redact_target
from ..models import NewTask, TaskStatus
from .gateway import GatewayAudit, audit, rate_record
from .options import DemoOptions
from .ratelimits import busiest_utilisation, limit_keys, limits_json, provider_limits, window_ratio
from .record import RunRecord
from .stores import sqlite_file
from .worker import DEMO_QUEUE

__all__ = (
    "LATENCY_MEASURES",
    "REPORT_WINDOW_S",
    "build_report",
    "busiest_account",
    "enqueue_times",
    "kept_database",
    "rate_note",
    "render",
    "task_statuses",
)

REPORT_WINDOW_S = 3600.0

LATENCY_MEASURES = (
    "enqueue to commit of each message (store clock): its wait in line, behind its conversation's "
    "earlier messages and its account's other messages (one account sends one at a time), plus its "
    "send and commit; the injected faults add the wait for a killed or stalled process's leases to lapse"
)
"""What the report's ``latency_ms`` measures (said in the report and the live view)."""


async def task_statuses(target: str, opts: DemoOptions) -> dict[str, str]:
    """Idempotency key -> status of every demo task, read straight from the database."""
    return {k: str(v) for k, v in (await _task_column(target, opts, "status")).items()}


async def enqueue_times(target: str, opts: DemoOptions) -> dict[str, float]:
    """Idempotency key -> enqueue time (store clock, seconds) of every demo task, read straight from the database."""
    return {k: float(v) for k, v in (await _task_column(target, opts, "created_at")).items()}


async def _task_column(target: str, opts: DemoOptions, column: str) -> dict[str, Any]:
    """Idempotency key -> ``column`` (``status`` or ``created_at``) of every demo task."""
    assert column in ("status", "created_at")
    if opts.postgres:
        import asyncpg

        from ..backends.open import split_connect_timeout

        dsn, timeout_s = split_connect_timeout(target)
        conn = await asyncpg.connect(dsn, timeout=timeout_s, server_settings={"search_path": f'"{opts.schema}"'})
        try:
            rows = await conn.fetch(f"SELECT idempotency_key, {column} FROM coord_tasks WHERE queue = $1", DEMO_QUEUE)
        finally:
            await conn.close()
        return {r[0]: r[1] for r in rows}

    def read() -> dict[str, Any]:
        con = sqlite3.connect(f"file:{sqlite_file(target)}?mode=ro", uri=True)
        try:
            sql = f"SELECT idempotency_key, {column} FROM coord_tasks WHERE queue = ?"
            return dict(con.execute(sql, (DEMO_QUEUE,)).fetchall())
        finally:
            con.close()

    return await asyncio.to_thread(read)


def kept_database(opts: DemoOptions) -> str | None:
    """Where the run's database stays after the demo, for ``python -m asynccoord status --db``.

    The absolute path of the SQLite file given with ``--db`` or ``--store``, the
    PostgreSQL DSN without its password (the tables are in ``opts.schema``), or None: the
    demo ran on a temporary file, deleted at the end.
    """
    target = opts.target
    if target is None:
        return None
    if opts.postgres:
        return redact_target(target)
    return str(Path(sqlite_file(target)).resolve())


def build_report(
    gateway: Path,
    tasks: list[NewTask],
    status_of: dict[str, str],
    snapshot: Any,
    run: RunRecord,
    elapsed_s: float,
    finished: bool,
    problems: list[str],
    opts: DemoOptions,
    enqueued_at: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The report of a run (the ``--json`` object): counts from the gateway's record and the queue.

    Args:
        gateway: The gateway's record file.
        tasks: The tasks the producer enqueued.
        status_of: Idempotency key -> task status, read from the database at the end.
        snapshot: The cluster snapshot read at the end (window :data:`REPORT_WINDOW_S`).
        run: What the orchestrator recorded.
        elapsed_s: From the producer's start to the last task done or dead, seconds.
        finished: Whether every task was done or dead.
        problems: What went wrong outside the checks (a worker crashed, a sweep failed).
        opts: The options of the run.
        enqueued_at: Idempotency key -> enqueue time of each task (store clock), for the
            busiest bucket's utilisation; None leaves it out.

    Returns:
        A JSON object. ``duplicates`` counts messages the contact received twice (must be
        0); ``duplicate_sends`` counts second provider calls for one message answered by
        its idempotency key, and ``duplicate_sends_explained`` says whether each follows a
        counted lease loss or interrupted send. ``delivered_not_committed`` is sent but not
        recorded done (0 in a finished run); ``gateway`` holds the provider's own counts;
        ``latency_ms`` has ``p50`` and ``p99`` of enqueue-to-commit. ``rate_limits`` has
        ``provider_429s`` (0 for ``ok`` when limits are declared), ``late_send_429s`` (a
        stalled process's late sends, counted apart), ``declared``,
        ``busiest_key_utilisation`` (the busiest bucket's sending rate over its allowed rate
        while it had a backlog), ``max_window_ratio`` (over windows of 1, 8 and 64 periods,
        the most sends of one key in a window over the ``count * k + burst`` a
        burst-then-sustained sender may make in it; at most 1.0 for ``ok``) and
        ``requested_window_ratio`` (the same over every request, refused ones included: over
        1.0 when the bot tried to send too fast). ``hottest_account``
        has its messages and ``busy_s``, the summed duration of its sends; ``config``
        holds the run's settings, with ``lock_store_keys``, the run's Redis keys found at
        the end under ``--lock-store``. ``ok`` is the verdict. The demo adds ``timing_s``
        (``load_trace``, ``prepare``, ``drain``, ``stop``, ``verify``, ``total``).
    """
    seen = audit(gateway)
    keys = [str(t.idempotency_key) for t in tasks]  # every demo task has one: its message id
    done_keys = {k for k in keys if status_of.get(k) == TaskStatus.DONE.value}
    dead = sum(1 for k in keys if status_of.get(k) == TaskStatus.DEAD.value)
    lost = len(keys) - len(done_keys) - dead
    totals = dict(snapshot.totals)
    conflicts = {name: int(totals.get(name, 0)) for name in ev.EVENT_NAMES if name not in (ev.CLAIMS, ev.COMMITS)}
    latency = snapshot.latencies.get(REPORT_WINDOW_S, {}).get("enqueue_to_commit_ms")
    lease_losses = conflicts[ev.LEASE_EXPIRED] + conflicts[ev.LEASE_LOST] + conflicts[ev.SEND_INTERRUPTED]
    hottest = _hottest(tasks, seen, elapsed_s)
    report: dict[str, Any] = {
        "messages": len(keys),
        "sent": len(done_keys & seen.delivered_ids),
        "send_calls": seen.send_calls,
        "duplicates": seen.duplicates,
        "duplicate_sends": seen.replays,
        "lost": lost,
        "dead": dead,
        "delivered_not_committed": len(seen.delivered_ids - done_keys),
        "account_overlaps": seen.account_overlaps,
        "order_violations": seen.order_violations,
        "gateway": {
            "stale_token_rejections": seen.stale_token_rejections,
            "transient_errors": seen.transient_errors,
            "cut_off": seen.cut_off,
            "replays": seen.replays,
        },
        "hottest_account": hottest,
        "conflicts": conflicts,
        "alerts": run.alerts,
        "throughput_per_s": round(len(done_keys) / elapsed_s, 1) if elapsed_s > 0 else 0.0,
        "latency_ms": {
            "p50": None if latency is None or latency.p50_ms is None else round(latency.p50_ms, 1),
            "p99": None if latency is None or latency.p99_ms is None else round(latency.p99_ms, 1),
            "measures": LATENCY_MEASURES,
            "hottest_account_busy_share": hottest["busy_share"],
        },
        "stage_latency_ms": {
            name: {"p50": _round(summary.p50_ms), "p99": _round(summary.p99_ms), "count": summary.count}
            for name, summary in snapshot.latencies.get(REPORT_WINDOW_S, {}).items()
        },
        "elapsed_s": round(elapsed_s, 2),
        "progress_polls": {"count": run.polls, "busy_s": round(run.poll_s, 2)},
        "faults": run.faults,
        "config": {
            "db": kept_database(opts),
            "messages_requested": opts.messages,
            "nodes": opts.nodes,
            "processes": opts.processes,
            "accounts": opts.accounts,
            "lease_s": opts.lease_s,
            "lock_ttl_s": opts.lock_ttl_s,
            "lock_wait_s": opts.lock_wait_s,
            "max_in_flight": opts.max_in_flight,
            "gateway_latency_ms": {"median": opts.latency_median_ms, "sigma": opts.latency_sigma},
            "store": "sqlite" if not opts.postgres else "postgres",
            "schema": opts.schema if opts.postgres else None,
            "lock_store": None if opts.lock_store is None else redact_target(opts.lock_store),
            "lock_store_keys": run.lock_store_keys,
            "lock_prefix": opts.lock_prefix,
            "trace": str(opts.trace or "bundled sample"),
            "seed": opts.seed,
        },
        "rate_limits": _rate_limits(gateway, seen, tasks, enqueued_at or {}, opts),
        "finished": finished,
        "problems": problems,
    }
    # A second send of one message can only follow a lost lease or an interrupted send
    # (and each of those is counted).
    report["duplicate_sends_explained"] = seen.replays <= lease_losses
    report["ok"] = bool(
        finished
        and not problems
        and report["duplicates"] == 0
        and report["lost"] == 0
        and report["account_overlaps"] == 0
        and report["order_violations"] == 0
        and report["duplicate_sends_explained"]
        and report["rate_limits"]["max_window_ratio"] <= 1.0
        and (report["rate_limits"]["provider_429s"] == 0 or not report["rate_limits"]["declared"])
    )
    return report


def rate_note(opts: DemoOptions) -> str:
    """One line on the run's rate limits: the provider's, their scale, and whether the store keeps them."""
    limits = ", ".join(str(x) for x in provider_limits(opts.rate_scale))
    kept = "declared to the store" if opts.declares_limits else "not declared to the store (--no-rate-limits)"
    return (
        f"rate limits: the provider allows {limits} (real-time limits x{opts.rate_scale:g}: time runs "
        f"{opts.rate_scale:g} times faster than Telegram's 30/s per bot and 1/s per chat), {kept}"
    )


def _rate_limits(
    gateway: Path, seen: GatewayAudit, tasks: list[NewTask], enqueued_at: Mapping[str, float], opts: DemoOptions
) -> dict[str, Any]:
    """The report's ``rate_limits``: what the provider enforced and refused, and how close to it the run sent."""
    limits = provider_limits(opts.rate_scale)
    record = rate_record(gateway)
    enqueued: dict[tuple[str, str], list[float]] = {}
    for t in tasks:
        at = enqueued_at.get(str(t.idempotency_key))
        if at is not None:
            for dimension, key in limit_keys(t.payload["account"], t.partition_key).items():
                enqueued.setdefault((dimension, key), []).append(at)
    busiest = busiest_utilisation(enqueued, record.delivered, record.accepted, limits)
    out: dict[str, Any] = {
        "provider_429s": seen.rate_limited,
        "late_send_429s": seen.late_rate_limited,
        "declared": limits_json(limits) if opts.declares_limits else [],
        "provider": limits_json(limits),
        "scale": opts.rate_scale,
        "busiest_key_utilisation": None if busiest is None else round(busiest.ratio, 3),
        "busiest_key": None
        if busiest is None
        else {
            "dimension": busiest.dimension,
            "key": busiest.key,
            "messages": busiest.messages,
            "backlog_s": round(busiest.backlog_s, 2),
            "sends": busiest.sends,
            "allowed_per_s": busiest.allowed_per_s,
        },
        "max_window_ratio": round(window_ratio(record.accepted, limits), 3),
        "requested_window_ratio": round(window_ratio(record.requested, limits), 3),
        "note": rate_note(opts),
    }
    return out


def busiest_account(tasks: Sequence[NewTask]) -> tuple[str, int]:
    """The account with the most messages, and their number (ties: the greatest account name).

    Raises:
        ValueError: ``tasks`` is empty.
    """
    per_account: dict[str, int] = {}
    for t in tasks:
        account = t.payload["account"]
        per_account[account] = per_account.get(account, 0) + 1
    return max(per_account.items(), key=lambda kv: (kv[1], kv[0]))


def _hottest(tasks: list[NewTask], seen: GatewayAudit, drain_s: float) -> dict[str, Any]:
    """The account with the most messages: one account sends one message at a time, so the
    sum of its requests' durations (``busy_s``) is a lower bound of the drain time, and
    ``busy_share`` (``busy_s`` over the drain's ``drain_s``) how close the run came to it: near
    1, that account's messages queue behind each other for most of the drain."""
    account, messages = busiest_account(tasks)
    busy = seen.account_busy_s.get(account, 0.0)
    calls = seen.account_calls.get(account, 0)
    return {
        "account": account,
        "messages": messages,
        "share": round(messages / max(1, len(tasks)), 3),
        "calls": calls,
        "busy_s": round(busy, 2),
        "busy_share": round(busy / drain_s, 3) if drain_s > 0 else None,
        "mean_call_ms": round(1000 * busy / calls, 2) if calls else None,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def render(report: dict[str, Any], console: Console) -> None:
    """Print the final report as tables."""
    verdict = "[bold green]OK" if report["ok"] else "[bold red]FAILED"
    table = Table(title=f"asynccoord demo: {verdict}", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    for key in (
        "messages",
        "sent",
        "send_calls",
        "duplicates",
        "lost",
        "dead",
        "account_overlaps",
        "order_violations",
        "throughput_per_s",
        "elapsed_s",
    ):
        table.add_row(key, str(report[key]))
        if key == "duplicates":  # second provider calls the idempotency key absorbed: not duplicates
            explained = (
                "each after a counted fault" if report["duplicate_sends_explained"] else "MORE than counted faults"
            )
            table.add_row("duplicate_sends (absorbed by key)", f"{report['duplicate_sends']}: {explained}")
    table.add_row("latency p50 / p99 (ms)", f"{report['latency_ms']['p50']} / {report['latency_ms']['p99']}")
    hot = report["hottest_account"]
    share = "-" if hot["busy_share"] is None else f"{hot['busy_share']:.0%}"
    table.add_row(
        "hottest account",
        f"{hot['account']}: {hot['messages']} messages, sending {hot['busy_s']} s ({share} of the drain)",
    )
    for key, value in report["gateway"].items():
        table.add_row(f"gateway {key}", str(value))
    rates = report["rate_limits"]
    table.add_row("provider 429s (late sends apart)", f"{rates['provider_429s']} ({rates['late_send_429s']} late)")
    table.add_row("max window / limit (sent; tried)", f"{rates['max_window_ratio']}; {rates['requested_window_ratio']}")
    busiest = rates["busiest_key"]
    if busiest is not None:
        table.add_row(
            "busiest bucket utilisation",
            f"{rates['busiest_key_utilisation']:.0%} ({busiest['dimension']} {busiest['key']}: "
            f"{busiest['sends']} sends in {busiest['backlog_s']} s of backlog, {busiest['allowed_per_s']:g}/s allowed)",
        )
    console.line()  # off a terminal the live view's last frame ends without a line break
    console.print(table)
    conflicts = Table(title="coordination events (all processes)")
    conflicts.add_column("event")
    conflicts.add_column("count", justify="right")
    for name, n in report["conflicts"].items():
        conflicts.add_row(name, str(n))
    console.print(conflicts)
    requested = report["config"]["messages_requested"]
    if requested > report["messages"]:
        console.print(
            f"note: --messages {requested} asked for more than the trace holds: replayed all {report['messages']}"
        )
    console.print(
        f"latency: {report['latency_ms']['measures']}. The hottest account, {hot['account']}, sent its "
        f"{hot['messages']} messages one at a time, busy {share} of the drain."
    )
    console.print(rates["note"])
    for fault in report["faults"]:
        console.print(f"fault: {fault}")
    for alert in report["alerts"]:
        console.print(f"alert: {alert['state']} {alert['rule']} value={alert['value']:.3g} > {alert['threshold']}")
    if not report["finished"]:
        console.print("[red]the run stopped before every message was done or dead")
    for problem in report["problems"]:
        console.print(f"[red]problem: {problem}")
    kept = report["config"]["db"]
    if kept is not None:
        schema = report["config"]["schema"]
        look = f"python -m asynccoord status --db {kept}" + (f" --schema {schema}" if schema else "")
        console.print(f"database kept: {kept} (look at it with: {look})", markup=False)
    console.print(
        "Trace: BYU PCC Chit-Chat dataset (MIT, (c) 2019 Perception, Control and Cognition Lab), "
        "via chitchat-dataset 0.9.0."
    )
