"""Queue throughput: enqueue/s and claim -> no-op -> complete tasks/s, beside in-run baselines.

Every figure is measured in the same run on the same database file, so the ratios
hold even on a noisy machine:

* ``raw_commits_per_s``: plain ``sqlite3``, one single-row UPDATE per committed
  transaction (``BEGIN IMMEDIATE; UPDATE; COMMIT``): the commit limit of the file.
* ``raw_batch_claim_tasks_per_s``: plain ``sqlite3`` committing a batch claim of 100
  tasks per transaction (``UPDATE ... RETURNING`` over a subquery).
* ``naive``: one aiosqlite connection per node; each task is claimed in its own
  transaction and completed in another.
* ``asynccoord``: ``SQLiteStore`` with leases, versions and processed-id records; each
  node claims ``--batch`` tasks and completes them with ``complete_many``; all nodes of
  a process share one store (one group-committing writer).

Usage::

    python benchmarks/queue_throughput.py                # full matrix, a table
    python benchmarks/queue_throughput.py --json         # one JSON object
    python benchmarks/queue_throughput.py --tasks 5000 --nodes 1 16

Keys of the JSON object are documented in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite
from _common import has_uvloop, run

from asynccoord import NewTask, SQLiteStore

T = TypeVar("T")
QUEUE = "bench"


# --- baselines ---------------------------------------------------------------------


def raw_commits_per_s(path: str, seconds: float) -> float:
    """Single-row UPDATE commits per second with plain sqlite3 on ``path``."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = NORMAL")
    db.execute("CREATE TABLE IF NOT EXISTS bench_raw (id INTEGER PRIMARY KEY, v INTEGER NOT NULL)")
    db.execute("INSERT OR IGNORE INTO bench_raw (id, v) VALUES (1, 0)")
    n = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        for _ in range(100):
            db.execute("BEGIN IMMEDIATE")
            db.execute("UPDATE bench_raw SET v = v + 1 WHERE id = 1")
            db.execute("COMMIT")
        n += 100
    elapsed = time.perf_counter() - start
    db.close()
    return n / elapsed


def raw_batch_claim_tasks_per_s(path: str, tasks: int, batch: int = 100) -> float:
    """Tasks/s when plain sqlite3 commits one batch claim of ``batch`` tasks per transaction."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = NORMAL")
    db.execute("PRAGMA temp_store = MEMORY")
    db.execute("DROP TABLE IF EXISTS bench_raw_tasks")
    db.execute("CREATE TABLE bench_raw_tasks (id INTEGER PRIMARY KEY, status TEXT NOT NULL, owner TEXT, payload TEXT)")
    db.execute("CREATE INDEX bench_raw_tasks_status ON bench_raw_tasks (status, id)")
    db.execute("BEGIN")
    db.executemany("INSERT INTO bench_raw_tasks (status, payload) VALUES ('pending', 'null')", [()] * tasks)
    db.execute("COMMIT")
    claimed = 0
    start = time.perf_counter()
    while True:
        db.execute("BEGIN IMMEDIATE")
        rows = db.execute(
            "UPDATE bench_raw_tasks SET status = 'running', owner = ? WHERE id IN "
            "(SELECT id FROM bench_raw_tasks WHERE status = 'pending' ORDER BY id LIMIT ?) RETURNING id, payload",
            ("raw", batch),
        ).fetchall()
        db.execute("COMMIT")
        if not rows:
            break
        claimed += len(rows)
    elapsed = time.perf_counter() - start
    db.execute("DROP TABLE bench_raw_tasks")
    db.close()
    return claimed / elapsed


NAIVE_SCHEMA = """
CREATE TABLE IF NOT EXISTS naive_tasks (
    id INTEGER PRIMARY KEY, status TEXT NOT NULL, owner TEXT, lease_until REAL, payload TEXT
);
CREATE INDEX IF NOT EXISTS naive_tasks_status ON naive_tasks (status, id);
"""


async def naive_drain(path: str, tasks: int, nodes: int) -> float:
    """Tasks/s of the naive design: a connection per node, claim 1 and complete 1 per transaction."""
    setup = sqlite3.connect(path, isolation_level=None)
    setup.execute("PRAGMA journal_mode = WAL")
    setup.executescript("DROP TABLE IF EXISTS naive_tasks;" + NAIVE_SCHEMA)
    setup.execute("BEGIN")
    setup.executemany("INSERT INTO naive_tasks (status, payload) VALUES ('pending', 'null')", [()] * tasks)
    setup.execute("COMMIT")
    setup.close()

    async def node(index: int) -> int:
        done = 0
        async with aiosqlite.connect(path, isolation_level=None) as db:
            await db.execute("PRAGMA busy_timeout = 30000")
            await db.execute("PRAGMA synchronous = NORMAL")
            while True:
                await db.execute("BEGIN IMMEDIATE")
                cursor = await db.execute(
                    "UPDATE naive_tasks SET status = 'running', owner = ?, lease_until = ? WHERE id = "
                    "(SELECT id FROM naive_tasks WHERE status = 'pending' ORDER BY id LIMIT 1) RETURNING id",
                    (f"n{index}", time.time() + 30),
                )
                row = await cursor.fetchone()
                await db.execute("COMMIT")
                if row is None:
                    return done
                await db.execute("BEGIN IMMEDIATE")
                await db.execute(
                    "UPDATE naive_tasks SET status = 'done' WHERE id = ? AND owner = ?", (row[0], f"n{index}")
                )
                await db.execute("COMMIT")
                done += 1

    start = time.perf_counter()
    counts = await asyncio.gather(*(node(i) for i in range(nodes)))
    elapsed = time.perf_counter() - start
    assert sum(counts) == tasks, (sum(counts), tasks)
    return tasks / elapsed


# --- asynccoord --------------------------------------------------------------------


async def fill(path: str, tasks: int) -> float:
    """Enqueue ``tasks`` tasks (batches of 500 through enqueue_many); return enqueue/s."""
    async with SQLiteStore(path) as store:
        start = time.perf_counter()
        for offset in range(0, tasks, 500):
            count = min(500, tasks - offset)
            await store.enqueue_many(
                [
                    NewTask(queue=QUEUE, payload={"n": offset + i}, partition_key=f"c{(offset + i) % 997}")
                    for i in range(count)
                ]
            )
        return tasks / (time.perf_counter() - start)


async def drain(path: str, nodes: int, batch: int, ordered: bool = False) -> tuple[int, float, float]:
    """Drain the queue with ``nodes`` nodes sharing one store; return (tasks, start, end) in time.time().

    ``ordered`` claims in per-key order (one active task per conversation, head upkeep on).
    """
    async with SQLiteStore(path) as store:

        async def node(index: int) -> int:
            done = 0
            while True:
                tasks = await store.claim(
                    QUEUE, node_id=f"node-{os.getpid()}-{index}", limit=batch, lease_s=60, ordered=ordered
                )
                if not tasks:
                    return done
                outcomes = await store.complete_many(tasks)
                done += sum(1 for o in outcomes if not isinstance(o, Exception))

        start = time.time()
        counts = await asyncio.gather(*(node(i) for i in range(nodes)))
        return sum(counts), start, time.time()


def drain_in_processes(path: str, processes: int, nodes: int, batch: int) -> tuple[int, float]:
    """Drain with ``processes`` OS processes of ``nodes`` nodes each; return (tasks, tasks/s)."""
    command = [sys.executable, __file__, "--worker", path, "--nodes", str(nodes), "--batch", str(batch)]
    procs = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(processes)]
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"worker failed with exit code {proc.returncode}")
        results.append(json.loads(out))
    total = sum(r["tasks"] for r in results)
    start = min(r["start"] for r in results)
    end = max(r["end"] for r in results)
    return total, total / (end - start)


def fresh_db(folder: str) -> str:
    path = os.path.join(folder, f"bench-{secrets.token_hex(4)}.db")
    return path


def bench(args: argparse.Namespace) -> dict[str, Any]:
    """Every figure of one run, on fresh files in ``--db-dir`` (or a temporary folder, removed after)."""
    if args.db_dir:
        Path(args.db_dir).mkdir(parents=True, exist_ok=True)
        return _bench(args, args.db_dir)
    with tempfile.TemporaryDirectory(prefix="asynccoord-bench-") as folder:
        return _bench(args, folder)


def _bench(args: argparse.Namespace, folder: str) -> dict[str, Any]:
    base = fresh_db(folder)
    results: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "sqlite": sqlite3.sqlite_version,
            "uvloop": has_uvloop(),
        },
        "tasks": args.tasks,
        "batch": args.batch,
    }
    results["raw_commits_per_s"] = raw_commits_per_s(base, args.raw_seconds)
    results["raw_batch_claim_tasks_per_s"] = raw_batch_claim_tasks_per_s(base, args.tasks)
    results["repeat"] = args.repeat
    results["naive"] = {}
    runs: dict[str, Any] = {"naive": {}, "asynccoord": {}, "asynccoord_ordered": {}, "processes": []}
    results["runs"] = runs  # every run's figure, in run order; the figures above are their medians
    for nodes in args.naive_nodes:
        runs["naive"][str(nodes)] = [
            run(lambda n=nodes: naive_drain(base, args.naive_tasks, n))  # type: ignore[misc]
            for _ in range(args.repeat)
        ]
        results["naive"][str(nodes)] = statistics.median(runs["naive"][str(nodes)])
    enqueue_rates: list[float] = []

    def drain_rate(nodes: int, ordered: bool) -> float:
        path = fresh_db(folder)
        enqueue_rates.append(run(lambda: fill(path, args.tasks)))
        done, start, end = run(lambda: drain(path, nodes, args.batch, ordered))
        assert done == args.tasks, (done, args.tasks)
        _cleanup(path)
        return done / (end - start)

    for kind, counts, ordered in (("asynccoord", args.nodes, False), ("asynccoord_ordered", args.ordered_nodes, True)):
        for n in counts:
            runs[kind][str(n)] = [drain_rate(n, ordered) for _ in range(args.repeat)]
        results[kind] = {n: statistics.median(rates) for n, rates in runs[kind].items()}
    results["enqueue_per_s"] = statistics.median(enqueue_rates)
    results["processes"] = {}
    if args.processes > 1:
        for _ in range(args.repeat):
            path = fresh_db(folder)
            run(lambda p=path: fill(p, args.tasks))  # type: ignore[misc]
            done, rate = drain_in_processes(path, args.processes, args.process_nodes, args.batch)
            assert done == args.tasks, (done, args.tasks)
            runs["processes"].append(rate)
            _cleanup(path)
        results["processes"] = {
            "processes": args.processes,
            "nodes_per_process": args.process_nodes,
            "tasks_per_s": statistics.median(runs["processes"]),
        }
    naive_best = max(results["naive"].values()) if results["naive"] else None
    naive_one = results["naive"].get("1")
    results["ratios"] = {
        f"nodes_{n}": {
            "vs_raw_commits": rate / results["raw_commits_per_s"],
            "vs_raw_batch_claim": rate / results["raw_batch_claim_tasks_per_s"],
            "vs_naive_1": rate / naive_one if naive_one else None,
            "vs_naive_best": rate / naive_best if naive_best else None,
        }
        for n, rate in results["asynccoord"].items()
    }
    _cleanup(base)
    return results


def _cleanup(path: str) -> None:
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path + suffix)


def print_table(r: dict[str, Any]) -> None:
    m = r["machine"]
    print(f"machine: {m['cpus']} cpus, Python {m['python']}, SQLite {m['sqlite']}, uvloop={m['uvloop']}")
    print(f"tasks per run: {r['tasks']}, claim batch: {r['batch']}")
    print(f"raw sqlite3 single-row commits/s : {r['raw_commits_per_s']:>10,.0f}")
    print(f"raw sqlite3 batch-claim tasks/s  : {r['raw_batch_claim_tasks_per_s']:>10,.0f}")
    for n, rate in r["naive"].items():
        print(f"naive claim-1/complete-1, {n:>2} nodes: {rate:>10,.0f} tasks/s")
    print(f"asynccoord enqueue/s             : {r['enqueue_per_s']:>10,.0f}")
    print("asynccoord claim -> no-op -> complete:")
    print(f"  {'nodes':>5} {'tasks/s':>10} {'x raw commit':>13} {'x naive(1)':>11} {'x naive(best)':>14}")
    for n, rate in r["asynccoord"].items():
        ratio = r["ratios"][f"nodes_{n}"]
        print(
            f"  {n:>5} {rate:>10,.0f} {ratio['vs_raw_commits']:>13.2f} "
            f"{ratio['vs_naive_1'] or 0:>11.1f} {ratio['vs_naive_best'] or 0:>14.1f}"
        )
    for n, rate in r["asynccoord_ordered"].items():
        print(f"  {n:>5} {rate:>10,.0f}  (ordered claims: one active task per conversation)")
    if r["processes"]:
        p = r["processes"]
        print(f"  {p['processes']} processes x {p['nodes_per_process']} nodes: {p['tasks_per_s']:,.0f} tasks/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20_000, help="tasks per drain (default 20000)")
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 4, 16, 64], help="node counts (default 1 4 16 64)")
    parser.add_argument(
        "--ordered-nodes", type=int, nargs="*", default=[16], help="node counts of ordered drains (default 16)"
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs per figure; the median is reported (default 1)")
    parser.add_argument("--batch", type=int, default=32, help="claim batch per node (default 32)")
    parser.add_argument("--processes", type=int, default=2, help="processes for the multi-process run (default 2)")
    parser.add_argument("--process-nodes", type=int, default=8, help="nodes per process there (default 8)")
    parser.add_argument("--naive-nodes", type=int, nargs="*", default=[1, 16], help="naive baseline node counts")
    parser.add_argument("--naive-tasks", type=int, default=3000, help="tasks per naive drain (default 3000)")
    parser.add_argument("--raw-seconds", type=float, default=1.0, help="duration of the raw commit loop")
    parser.add_argument("--db-dir", help="folder for the database files (default: a temporary folder)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--worker", metavar="DB", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        done, start, end = run(lambda: drain(args.worker, args.nodes[0], args.batch))
        print(json.dumps({"tasks": done, "start": start, "end": end}))
        return
    results = bench(args)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print_table(results)


if __name__ == "__main__":
    main()
