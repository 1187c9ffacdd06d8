"""The demo's orchestrator: producer, worker processes, faults, live view, final report.

Run ``python -m asynccoord.demo --help`` for the options. With no arguments it replays
the bundled trace sample (20,000 messages) through 2 worker processes x 8 nodes, kills
one process with SIGKILL a third of the way through (a replacement starts a second
later with the same node ids), stalls the other's event loop past its lease and lock
TTL later on, and ends with a report of what the gateway saw. The exit status is 0 only
when no message was delivered twice, none was lost, no account sent two messages at
once and no conversation was sent out of order.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .. import events as ev
from .._loop import run as run_loop
from ..backends.sqlite import SQLiteStore
from ..errors import CoordError
from ..models import NewTask, TaskStatus
from ..monitor import Monitor, cluster_snapshot
from ..monitormodels import Alert
from .gateway import audit
from .trace import TraceMessage, bundled_sample, read_trace
from .worker import DEMO_QUEUE

__all__ = ("DemoOptions", "build_tasks", "main", "parse_args", "run_demo")

REPORT_WINDOW_S = 3600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoOptions:
    """What the demo runs (see ``--help`` for each option)."""

    nodes: int = 8
    processes: int = 2
    messages: int = 20_000
    speed: float | None = None
    replay_s: float = 8.0
    max_gap_s: float = 120.0
    accounts: int = 24
    db: Path | None = None
    trace: Path | None = None
    seed: int = 7
    faults: bool = True
    as_json: bool = False
    lease_s: float = 2.0
    lock_ttl_s: float = 2.0
    heartbeat_ttl_s: float = 3.0
    stall_s: float = 3.5
    redelivery_rate: float = 0.01
    timeout_s: float = 240.0


@dataclass(slots=True)
class _Worker:
    index: int
    prefix: str
    status_file: Path
    process: subprocess.Popen[bytes] | None = None
    incarnations: int = 0


@dataclass(slots=True)
class _Run:
    faults: list[dict[str, Any]] = field(default_factory=list)
    alerts: list[dict[str, Any]] = field(default_factory=list)
    enqueued: int = 0
    total: int = 0
    started: float = 0.0


def account_of(sender_id: str, accounts: int) -> str:
    """The bot account a trace sender's messages go out from (stable hash of the sender)."""
    digest = hashlib.blake2b(sender_id.encode(), digest_size=8).digest()
    return f"acct-{int.from_bytes(digest, 'big') % accounts:02d}"


def build_tasks(messages: Sequence[TraceMessage], accounts: int) -> list[NewTask]:
    """One task per message: keyed by conversation, idempotency key = message id."""
    return [
        NewTask(
            queue=DEMO_QUEUE,
            payload={
                "msg": m.msg_id,
                "account": account_of(m.sender_id, accounts),
                "seq": m.seq,
                "len": m.text_len,
            },
            partition_key=m.conversation_id,
            idempotency_key=m.msg_id,
        )
        for m in messages
    ]


def schedule(
    messages: Sequence[TraceMessage], *, speed: float | None, replay_s: float, max_gap_s: float
) -> list[float]:
    """Replay offsets (seconds from the start) following the trace's relative timing.

    Gaps longer than ``max_gap_s`` of trace time (nights, idle hours) are cut to
    ``max_gap_s``; the result is divided by ``speed``, or scaled to last ``replay_s``
    when ``speed`` is None.
    """
    offsets: list[float] = []
    t = 0.0
    for i, m in enumerate(messages):
        if i:
            t += min(max_gap_s, float(m.ts_unix - messages[i - 1].ts_unix))
        offsets.append(t)
    span = offsets[-1] if offsets else 0.0
    factor = (span / replay_s if span > 0 else 1.0) if speed is None else speed
    return [o / factor for o in offsets]


def parse_args(argv: Sequence[str] | None = None) -> DemoOptions:
    """Parse the command line into :class:`DemoOptions` (argparse exits 2 on bad usage)."""
    p = argparse.ArgumentParser(
        prog="python -m asynccoord.demo",
        description="Replay real chat traffic through several nodes in several processes, with faults.",
    )
    p.add_argument("--nodes", type=_positive_int, default=8, help="nodes per process (default 8)")
    p.add_argument("--processes", type=_positive_int, default=2, help="worker processes (default 2)")
    p.add_argument("--messages", type=_positive_int, default=20_000, help="messages to replay (default 20000)")
    p.add_argument(
        "--speed",
        type=_positive_float,
        default=None,
        help="time compression of the trace, e.g. 1000 (default: fit the replay into about 8 s)",
    )
    p.add_argument(
        "--accounts", type=_positive_int, default=24, help="bot accounts senders are hashed onto (default 24)"
    )
    p.add_argument("--db", type=Path, help="SQLite database file (default: a fresh one in a temporary folder)")
    p.add_argument("--trace", type=Path, help="trace file, JSON Lines, optionally gzipped (default: bundled sample)")
    p.add_argument("--seed", type=int, default=7, help="random seed (default 7)")
    p.add_argument("--no-faults", action="store_true", help="do not kill or stall a process")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the live view")
    a = p.parse_args(argv)
    return DemoOptions(
        nodes=a.nodes,
        processes=a.processes,
        messages=a.messages,
        speed=a.speed,
        accounts=a.accounts,
        db=a.db,
        trace=a.trace,
        seed=a.seed,
        faults=not a.no_faults,
        as_json=a.json,
    )


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


# --- processes -------------------------------------------------------------------------


def _spawn(worker: _Worker, opts: DemoOptions, db: Path, gateway: Path) -> None:
    worker.incarnations += 1
    command = [
        sys.executable,
        "-m",
        "asynccoord.demo.worker",
        "--db",
        str(db),
        "--gateway",
        str(gateway),
        "--status-file",
        str(worker.status_file),
        "--prefix",
        worker.prefix,
        "--nodes",
        str(opts.nodes),
        "--seed",
        str(opts.seed * 1000 + worker.index * 10 + worker.incarnations),
        "--lease-s",
        str(opts.lease_s),
        "--lock-ttl-s",
        str(opts.lock_ttl_s),
        "--heartbeat-ttl-s",
        str(opts.heartbeat_ttl_s),
        "--stall-s",
        str(opts.stall_s),
    ]
    worker.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _stop(workers: Sequence[_Worker], timeout_s: float) -> list[str]:
    """SIGTERM every worker, wait, SIGKILL stragglers; return their stderr tails on failure."""
    problems: list[str] = []
    for w in workers:
        if w.process is not None and w.process.poll() is None:
            w.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for w in workers:
        if w.process is None:
            continue
        try:
            w.process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            w.process.kill()
            w.process.wait()
            problems.append(f"worker {w.index} did not stop in time")
        if w.process.returncode not in (0, -signal.SIGKILL) and w.process.stderr is not None:
            tail = w.process.stderr.read().decode(errors="replace")[-2000:]
            problems.append(f"worker {w.index} exited {w.process.returncode}: {tail}")
    return problems


def _read_states(workers: Sequence[_Worker]) -> list[dict[str, Any]]:
    nodes: list[dict[str, Any]] = []
    for w in workers:
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(w.status_file.read_text())
            for n in data.get("nodes", []):
                n["process"] = w.index
                n["stalled"] = data.get("stalled", False)
                nodes.append(n)
    return nodes


# --- the run -----------------------------------------------------------------------------


async def run_demo(opts: DemoOptions, console: Console | None = None) -> dict[str, Any]:
    """Run the demo and return its report (the ``--json`` object)."""
    trace_path = opts.trace or bundled_sample()
    messages = list(read_trace(trace_path, limit=opts.messages))
    if not messages:
        raise ValueError(f"the trace {str(trace_path)!r} has no messages")
    if len({m.msg_id for m in messages}) != len(messages):
        raise ValueError(f"the trace {str(trace_path)!r} repeats a msg_id: message ids must be unique")
    if opts.db is not None and opts.db.exists() and opts.db.stat().st_size > 0:
        raise ValueError(f"--db {str(opts.db)!r} already exists: the demo needs a fresh database file")
    tasks = build_tasks(messages, opts.accounts)
    offsets = schedule(messages, speed=opts.speed, replay_s=opts.replay_s, max_gap_s=opts.max_gap_s)
    rng = random.Random(opts.seed)
    with contextlib.ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="asynccoord-demo-")))
        db = opts.db or folder / "demo.db"
        gateway_path = folder / "gateway.db"
        workers = [
            _Worker(index=i, prefix=f"p{i}", status_file=folder / f"worker-{i}.json") for i in range(opts.processes)
        ]
        run = _Run(total=len(tasks))
        async with SQLiteStore(db) as store:
            for w in workers:
                _spawn(w, opts, db, gateway_path)
            try:
                async with Monitor(store, flush_interval_s=0.25, info={"role": "demo-producer"}) as monitor:

                    async def keep_alert(alert: Alert) -> None:
                        run.alerts.append(
                            {
                                "rule": alert.rule,
                                "event": alert.event,
                                "state": str(alert.state),
                                "value": alert.value,
                                "threshold": alert.threshold,
                                "window_s": alert.window_s,
                                "scope": str(alert.scope),
                            }
                        )

                    monitor.subscribe(keep_alert)
                    run.started = time.monotonic()
                    producer = asyncio.create_task(_produce(store, tasks, offsets, rng, opts, run))
                    faults = asyncio.create_task(_inject_faults(store, workers, opts, db, gateway_path, run))
                    finished = await _watch(store, workers, len(tasks), opts, run, console)
                    elapsed = time.monotonic() - run.started
                    for t in (producer, faults):
                        t.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await t
                    problems = await asyncio.to_thread(_stop, workers, 10.0)
                    await monitor.flush(force=True)
                    await monitor.evaluate()
                    snapshot = await cluster_snapshot(store, windows_s=(REPORT_WINDOW_S,))
            finally:
                await asyncio.to_thread(_stop, workers, 5.0)
        report = _report(db, gateway_path, tasks, snapshot, run, elapsed, finished, problems, opts)
    return report


async def _produce(
    store: SQLiteStore, tasks: list[NewTask], offsets: list[float], rng: random.Random, opts: DemoOptions, run: _Run
) -> None:
    start = time.monotonic()
    i = 0
    redeliver: list[NewTask] = []
    while i < len(tasks):
        now = time.monotonic() - start
        j = i
        while j < len(tasks) and offsets[j] <= now:
            j += 1
        batch = tasks[i:j][:2000]
        if batch:
            # The upstream delivers some messages twice: the idempotency key suppresses them.
            again = [t for t in redeliver if rng.random() < 0.5]
            redeliver = [t for t in redeliver if t not in again]
            await store.enqueue_many(batch + again)
            redeliver.extend(t for t in batch if rng.random() < opts.redelivery_rate)
            i += len(batch)
            run.enqueued = i
        else:
            await asyncio.sleep(min(0.02, max(0.0, offsets[i] - now)))
    if redeliver:
        await store.enqueue_many(redeliver)


async def _done_count(store: SQLiteStore) -> tuple[int, int]:
    stats = await store.stats(DEMO_QUEUE)
    return stats.counts[TaskStatus.DONE], stats.counts[TaskStatus.DEAD]


async def _inject_faults(
    store: SQLiteStore, workers: list[_Worker], opts: DemoOptions, db: Path, gateway: Path, run: _Run
) -> None:
    if not opts.faults:
        return
    total = run.total
    victim = workers[-1]
    staller = workers[0]
    killed = stalled = False
    while not (killed and stalled):
        done, dead = await _done_count(store)
        progress = (done + dead) / max(1, total)
        if not killed and progress >= 0.3 and victim.process is not None:
            victim.process.kill()  # SIGKILL: no cleanup, leases and locks left behind
            await asyncio.to_thread(victim.process.wait)
            run.faults.append(
                {"kind": "sigkill", "process": victim.index, "at_s": round(time.monotonic() - run.started, 2)}
            )
            killed = True
            await asyncio.sleep(1.0)
            _spawn(victim, opts, db, gateway)  # a replacement with the same node ids (new incarnation)
            run.faults.append(
                {"kind": "restart", "process": victim.index, "at_s": round(time.monotonic() - run.started, 2)}
            )
        if not stalled and progress >= 0.55 and staller.process is not None and staller.process.poll() is None:
            staller.process.send_signal(signal.SIGUSR1)
            run.faults.append(
                {
                    "kind": "stall",
                    "process": staller.index,
                    "stall_s": opts.stall_s,
                    "lease_s": opts.lease_s,
                    "lock_ttl_s": opts.lock_ttl_s,
                    "at_s": round(time.monotonic() - run.started, 2),
                }
            )
            stalled = True
        await asyncio.sleep(0.1)


async def _watch(
    store: SQLiteStore, workers: list[_Worker], total: int, opts: DemoOptions, run: _Run, console: Console | None
) -> bool:
    """Wait until every message is done or dead (or the timeout), showing the live view."""
    deadline = time.monotonic() + opts.timeout_s
    progress = Progress(
        TextColumn("[bold]messages"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("enqueued {task.fields[enqueued]}"),
        TimeElapsedColumn(),
    )
    bar = progress.add_task("drain", total=total, enqueued=0)
    live = (
        Live(Group(progress, _node_table([])), console=console, refresh_per_second=4, transient=False)
        if console is not None
        else None
    )
    with live if live is not None else contextlib.nullcontext():
        while time.monotonic() < deadline:
            done, dead = await _done_count(store)
            progress.update(bar, completed=done + dead, enqueued=run.enqueued)
            if live is not None:
                live.update(Group(progress, _node_table(_read_states(workers))))
            if run.enqueued >= total and done + dead >= total:
                return True
            for w in workers:
                if w.process is not None and w.process.poll() not in (None, -signal.SIGKILL):
                    return False  # a worker crashed: stop and report
            await asyncio.sleep(0.25)
    return False


def _node_table(nodes: list[dict[str, Any]]) -> Table:
    table = Table(title="nodes", expand=False, show_edge=False)
    for column in ("node", "proc", "claimed", "sent", "committed", "in flight", "conflicts", "partitions"):
        table.add_column(column, justify="right" if column not in ("node",) else "left")
    for n in sorted(nodes, key=lambda n: n["node_id"]):
        style = "yellow" if n.get("stalled") else None
        table.add_row(
            n["node_id"],
            str(n["process"]),
            str(n["claimed"]),
            str(n["sent"]),
            str(n["committed"]),
            str(n["in_flight"]),
            str(n["conflicts"]),
            str(n["owned_partitions"]),
            style=style,
        )
    return table


def _report(
    db: Path,
    gateway: Path,
    tasks: list[NewTask],
    snapshot: Any,
    run: _Run,
    elapsed_s: float,
    finished: bool,
    problems: list[str],
    opts: DemoOptions,
) -> dict[str, Any]:
    seen = audit(gateway)
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        status_of = dict(
            con.execute("SELECT idempotency_key, status FROM coord_tasks WHERE queue = ?", (DEMO_QUEUE,)).fetchall()
        )
    finally:
        con.close()
    keys = [t.idempotency_key for t in tasks]
    done_keys = {k for k in keys if status_of.get(k) == TaskStatus.DONE.value}
    dead = sum(1 for k in keys if status_of.get(k) == TaskStatus.DEAD.value)
    lost = len(keys) - len(done_keys) - dead
    totals = dict(snapshot.totals)
    conflicts = {name: int(totals.get(name, 0)) for name in ev.EVENT_NAMES if name not in (ev.CLAIMS, ev.COMMITS)}
    latency = snapshot.latencies.get(REPORT_WINDOW_S, {}).get("enqueue_to_commit_ms")
    lease_losses = conflicts[ev.LEASE_EXPIRED] + conflicts[ev.LEASE_LOST] + conflicts[ev.SEND_INTERRUPTED]
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
        "conflicts": conflicts,
        "alerts": run.alerts,
        "throughput_per_s": round(len(done_keys) / elapsed_s, 1) if elapsed_s > 0 else 0.0,
        "latency_ms": {
            "p50": None if latency is None or latency.p50_ms is None else round(latency.p50_ms, 1),
            "p99": None if latency is None or latency.p99_ms is None else round(latency.p99_ms, 1),
        },
        "stage_latency_ms": {
            name: {"p50": _round(summary.p50_ms), "p99": _round(summary.p99_ms), "count": summary.count}
            for name, summary in snapshot.latencies.get(REPORT_WINDOW_S, {}).items()
        },
        "elapsed_s": round(elapsed_s, 2),
        "faults": run.faults,
        "config": {
            "nodes": opts.nodes,
            "processes": opts.processes,
            "accounts": opts.accounts,
            "lease_s": opts.lease_s,
            "lock_ttl_s": opts.lock_ttl_s,
            "trace": str(opts.trace or "bundled sample"),
            "seed": opts.seed,
        },
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
    )
    return report


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
        "duplicate_sends",
        "lost",
        "dead",
        "account_overlaps",
        "order_violations",
        "throughput_per_s",
        "elapsed_s",
    ):
        table.add_row(key, str(report[key]))
    table.add_row("latency p50 / p99 (ms)", f"{report['latency_ms']['p50']} / {report['latency_ms']['p99']}")
    for key, value in report["gateway"].items():
        table.add_row(f"gateway {key}", str(value))
    console.print(table)
    conflicts = Table(title="coordination events (all processes)")
    conflicts.add_column("event")
    conflicts.add_column("count", justify="right")
    for name, n in report["conflicts"].items():
        conflicts.add_row(name, str(n))
    console.print(conflicts)
    for fault in report["faults"]:
        console.print(f"fault: {fault}")
    for alert in report["alerts"]:
        console.print(f"alert: {alert['state']} {alert['rule']} value={alert['value']:.3g} > {alert['threshold']}")
    if not report["finished"]:
        console.print("[red]the run timed out before every message was done or dead")
    for problem in report["problems"]:
        console.print(f"[red]problem: {problem}")
    console.print(
        "Trace: BYU PCC Chit-Chat dataset (MIT, (c) 2019 Perception, Control and Cognition Lab), "
        "via chitchat-dataset 0.9.0."
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: run the demo; exit 0 only when the report is ok."""
    opts = parse_args(argv)
    console = None if opts.as_json else Console(stderr=False)
    try:
        report = _run_loop(run_demo(opts, console))
    except ValueError as exc:  # bad trace or options
        print(f"asynccoord.demo: {exc}", file=sys.stderr)
        return 2
    except CoordError as exc:  # e.g. --db is not a database
        print(f"asynccoord.demo: {exc}", file=sys.stderr)
        return 2
    if opts.as_json:
        print(json.dumps(report, indent=2, default=str))
    else:
        assert console is not None
        render(report, console)
    return 0 if report["ok"] else 1


def _run_loop(coro: Any) -> Any:
    return run_loop(coro)


if __name__ == "__main__":
    raise SystemExit(main())


_ = os  # os is used by type annotations of subprocess paths on some platforms
