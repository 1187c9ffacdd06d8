"""The contention benchmark: what each layer buys, for nodes x processes x strategies.

Every cell drains the same workload (``--tasks`` tasks over Zipf-skewed conversations and
sending accounts, a ``--send-ms`` send) from a fresh SQLite file and reports committed
tasks/s, p50/p99 enqueue-to-commit latency (store clock), duplicate sends and conflict
counts. Strategies:

* ``all``: partitioning + per-account locks + version checks (the default runtime);
* ``partitioning``, ``locks``, ``versions``: one layer alone;
* ``none``: no layer: claims read and then write without a compare-and-set, as a naive
  queue does, so concurrent nodes send the same task twice;
* ``lock-table``: the naive lock-table design: read pending tasks, claim one by inserting
  a lock row, then re-read it under ``BEGIN IMMEDIATE``; one transaction per step.

Each row carries the in-run baseline: the raw sqlite3 single-row commit rate on the same
file. ``--report DIR`` writes ``contention.json``, ``contention.md`` and, when matplotlib
is installed (``pip install 'asynccoord[bench]'``), ``contention.png`` (throughput
against node count per strategy).

Usage::

    python benchmarks/contention.py                       # the full matrix, a table
    python benchmarks/contention.py --json                # one JSON object
    python benchmarks/contention.py --report benchmarks/results
    python benchmarks/contention.py --nodes 16 64 --processes 1 --strategies all none
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiosqlite

sys.path.insert(0, str(Path(__file__).resolve().parent))
from queue_throughput import raw_commits_per_s, run

from asynccoord import NewTask, SQLiteStore
from asynccoord.node import NodeConfig
from asynccoord.runtime import Runtime

QUEUE = "bench"
STRATEGIES = ("all", "partitioning", "locks", "versions", "none", "lock-table")


def zipf_choices(rng: random.Random, n: int, k: int, s: float = 1.1) -> list[int]:
    """``k`` draws from ranks 0..n-1 with Zipf(s) weights."""
    weights = [1.0 / (rank + 1) ** s for rank in range(n)]
    return rng.choices(range(n), weights=weights, k=k)


def workload(tasks: int, conversations: int, accounts: int, seed: int) -> list[NewTask]:
    rng = random.Random(seed)
    convs = zipf_choices(rng, conversations, tasks)
    accts = zipf_choices(rng, accounts, tasks)
    return [
        NewTask(
            queue=QUEUE, payload={"n": i, "account": accts[i]}, partition_key=f"c{convs[i]}", idempotency_key=f"m{i}"
        )
        for i in range(tasks)
    ]


def config_for(strategy: str) -> NodeConfig:
    layers = {
        "all": (True, True, True),
        "partitioning": (True, False, True),
        "locks": (False, True, True),
        "versions": (False, False, True),
        "none": (False, False, False),
    }[strategy]
    partitioning, locks, versions = layers
    return NodeConfig(
        queue=QUEUE,
        lease_s=5.0,
        lock_ttl_s=5.0,
        claim_batch=16,
        max_in_flight=16,
        ordered=versions,
        idle_min_s=0.01,
        idle_max_s=0.5,
        partitioning=partitioning,
        locks=locks,
        version_checks=versions,
    )


async def fill(path: str, specs: list[NewTask]) -> None:
    async with SQLiteStore(path) as store:
        for i in range(0, len(specs), 1000):
            await store.enqueue_many(specs[i : i + 1000])


async def drain_runtime(path: str, strategy: str, nodes: int, send_ms: float, total: int) -> dict[str, Any]:
    """Drain with a Runtime of ``nodes`` nodes; return the sends made and the timing."""
    sent: list[int] = []

    async def send(task: Any) -> None:
        sent.append(task.payload["n"])
        await asyncio.sleep(send_ms / 1000.0)

    async with SQLiteStore(path) as store:
        runtime = Runtime(
            store,
            send=send,
            nodes=nodes,
            config=config_for(strategy),
            lock_key=lambda t: f"account:{t.payload['account']}",
            heartbeat_ttl_s=3.0,
            shutdown_timeout_s=5.0,
        )
        start = time.time()
        async with runtime:
            drained = await runtime.wait_until_drained(timeout_s=600, poll_s=0.02)
        end = time.time()
        events = dict(store.events.snapshot())
    return {"sent": sent, "start": start, "end": end, "drained": drained, "events": events}


async def drain_lock_table(path: str, nodes: int, send_ms: float) -> dict[str, Any]:
    """The naive lock-table design, one aiosqlite connection per node."""
    setup = sqlite3.connect(path, isolation_level=None)
    setup.execute("CREATE TABLE IF NOT EXISTS naive_locks (task_id INTEGER PRIMARY KEY, owner TEXT NOT NULL)")
    setup.close()
    sent: list[int] = []

    async def node(index: int) -> None:
        owner = f"n{os.getpid()}-{index}"
        async with aiosqlite.connect(path, isolation_level=None) as db:
            await db.execute("PRAGMA busy_timeout = 30000")
            while True:
                cursor = await db.execute(
                    "SELECT id, payload FROM coord_tasks WHERE queue = ? AND status = 'pending' ORDER BY id LIMIT 16",
                    (QUEUE,),
                )
                rows = list(await cursor.fetchall())
                if not rows:
                    return
                for task_id, payload in rows:
                    await db.execute("BEGIN IMMEDIATE")
                    try:
                        await db.execute("INSERT INTO naive_locks (task_id, owner) VALUES (?, ?)", (task_id, owner))
                    except sqlite3.IntegrityError:
                        await db.execute("ROLLBACK")
                        continue
                    cursor = await db.execute("SELECT status FROM coord_tasks WHERE id = ?", (task_id,))
                    (status,) = await cursor.fetchone()  # type: ignore[misc]
                    if status != "pending":
                        await db.execute("ROLLBACK")
                        continue
                    await db.execute("UPDATE coord_tasks SET status = 'running', active = 1 WHERE id = ?", (task_id,))
                    await db.execute("COMMIT")
                    sent.append(json.loads(payload)["n"])
                    await asyncio.sleep(send_ms / 1000.0)
                    await db.execute("BEGIN IMMEDIATE")
                    await db.execute(
                        "UPDATE coord_tasks SET status = 'done', active = 0, is_head = 0, "
                        "updated_at = (julianday('now') - 2440587.5) * 86400.0 WHERE id = ?",
                        (task_id,),
                    )
                    await db.execute("DELETE FROM naive_locks WHERE task_id = ?", (task_id,))
                    await db.execute("COMMIT")

    start = time.time()
    await asyncio.gather(*(node(i) for i in range(nodes)))
    return {"sent": sent, "start": start, "end": time.time(), "drained": True, "events": {}}


def drain_processes(
    path: str, strategy: str, processes: int, nodes: int, send_ms: float, total: int
) -> list[dict[str, Any]]:
    command = [
        sys.executable,
        __file__,
        "--worker",
        path,
        "--strategies",
        strategy,
        "--nodes",
        str(nodes),
        "--send-ms",
        str(send_ms),
        "--tasks",
        str(total),
    ]
    outputs = [f"{path}.worker-{i}.json" for i in range(processes)]
    procs = [subprocess.Popen([*command, "--result", out]) for out in outputs]
    results = []
    for proc, out in zip(procs, outputs, strict=True):
        proc.wait(timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"worker exited {proc.returncode}")
        results.append(json.loads(Path(out).read_text()))
        os.remove(out)
    return results


def latencies_ms(path: str) -> tuple[float | None, float | None]:
    """p50/p99 enqueue-to-commit of the done tasks, from the store clock (ms)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        values = [
            (u - c) * 1000.0
            for c, u in db.execute("SELECT created_at, updated_at FROM coord_tasks WHERE status = 'done'")
        ]
    finally:
        db.close()
    if len(values) < 2:
        return None, None
    q = statistics.quantiles(values, n=100)
    return q[49], q[98]


def cell(args: argparse.Namespace, folder: str, strategy: str, nodes: int, processes: int) -> dict[str, Any]:
    path = os.path.join(folder, f"{strategy}-{nodes}-{processes}.db")
    specs = workload(args.tasks, args.conversations, args.accounts, args.seed)
    run(lambda: fill(path, specs))
    raw = raw_commits_per_s(path, args.raw_seconds)
    if processes == 1:
        if strategy == "lock-table":
            parts = [run(lambda: drain_lock_table(path, nodes, args.send_ms))]
        else:
            parts = [run(lambda: drain_runtime(path, strategy, nodes, args.send_ms, args.tasks))]
    else:
        parts = drain_processes(path, strategy, processes, nodes, args.send_ms, args.tasks)
    sends: Counter[int] = Counter()
    events: Counter[str] = Counter()
    for p in parts:
        sends.update(p["sent"])
        events.update(p["events"])
    start = min(p["start"] for p in parts)
    end = max(p["end"] for p in parts)
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    done = db.execute("SELECT count(*) FROM coord_tasks WHERE status = 'done'").fetchone()[0]
    db.close()
    p50, p99 = latencies_ms(path)
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path + suffix)
    rate = done / (end - start) if end > start else 0.0
    return {
        "strategy": strategy,
        "nodes": nodes,
        "processes": processes,
        "committed": done,
        "tasks_per_s": round(rate, 1),
        "latency_p50_ms": None if p50 is None else round(p50, 1),
        "latency_p99_ms": None if p99 is None else round(p99, 1),
        "send_calls": sum(sends.values()),
        "duplicate_sends": sum(n - 1 for n in sends.values() if n > 1),
        "conflicts": {k: v for k, v in sorted(events.items()) if k not in ("claims", "commits")},
        "raw_commits_per_s": round(raw, 1),
        "vs_raw_commits": round(rate / raw, 3) if raw else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=3000, help="tasks per cell (default 3000)")
    parser.add_argument("--conversations", type=int, default=500, help="Zipf-skewed conversations (default 500)")
    parser.add_argument("--accounts", type=int, default=32, help="Zipf-skewed sending accounts (default 32)")
    parser.add_argument("--send-ms", type=float, default=1.0, help="simulated send time, ms (default 1)")
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--raw-seconds", type=float, default=0.3, help="duration of the raw commit baseline per cell")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--report", metavar="DIR", help="write contention.json, contention.md and contention.png")
    parser.add_argument("--worker", metavar="DB", help=argparse.SUPPRESS)
    parser.add_argument("--result", metavar="FILE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        strategy = args.strategies[0]
        if strategy == "lock-table":
            result = run(lambda: drain_lock_table(args.worker, args.nodes[0], args.send_ms))
        else:
            result = run(lambda: drain_runtime(args.worker, strategy, args.nodes[0], args.send_ms, args.tasks))
        Path(args.result).write_text(json.dumps(result))
        return
    folder = tempfile.mkdtemp(prefix="asynccoord-contention-")
    rows = [
        cell(args, folder, strategy, nodes, processes)
        for processes in args.processes
        for strategy in args.strategies
        for nodes in args.nodes
    ]
    results = {
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "sqlite": sqlite3.sqlite_version},
        "workload": {
            "tasks": args.tasks,
            "conversations": args.conversations,
            "accounts": args.accounts,
            "send_ms": args.send_ms,
            "zipf_s": 1.1,
        },
        "rows": rows,
    }
    if args.report:
        write_report(results, Path(args.report))
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(markdown(results))


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "| processes | strategy | nodes | tasks/s | x raw commit | p50 ms | p99 ms | duplicate sends | conflicts |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results["rows"]:
        conflicts = ", ".join(f"{k}={v}" for k, v in r["conflicts"].items() if v) or "-"
        lines.append(
            f"| {r['processes']} | {r['strategy']} | {r['nodes']} | {r['tasks_per_s']:,.0f} | {r['vs_raw_commits']} "
            f"| {r['latency_p50_ms']} | {r['latency_p99_ms']} | {r['duplicate_sends']} | {conflicts} |"
        )
    raw = [r["raw_commits_per_s"] for r in results["rows"]]
    lines.append("")
    lines.append(f"Raw sqlite3 single-row commits/s on the same files: median {statistics.median(raw):,.0f}.")
    return "\n".join(lines)


def write_report(results: dict[str, Any], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "contention.json").write_text(json.dumps(results, indent=2))
    (folder / "contention.md").write_text(markdown(results) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no chart (pip install 'asynccoord[bench]')", file=sys.stderr)
        return
    processes = sorted({r["processes"] for r in results["rows"]})
    fig, axes = plt.subplots(1, len(processes), figsize=(6 * len(processes), 4), squeeze=False)
    for ax, p in zip(axes[0], processes, strict=True):
        for strategy in STRATEGIES:
            rows = [r for r in results["rows"] if r["processes"] == p and r["strategy"] == strategy]
            if rows:
                ax.plot([r["nodes"] for r in rows], [r["tasks_per_s"] for r in rows], marker="o", label=strategy)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("nodes per process")
        ax.set_ylabel("committed tasks/s")
        ax.set_title(f"{p} process(es)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(folder / "contention.png", dpi=100)


if __name__ == "__main__":
    main()
