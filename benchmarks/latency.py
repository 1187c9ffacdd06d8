"""Cross-process pickup latency: how long a task enqueued in one process waits for a node of another.

The usual deployment puts the inbound handler in one process and the sending nodes in
others, so every reply crosses processes through the store. Here the parent process
enqueues single tasks at random gaps of ``--gap-ms`` (default 20-100 ms), each under a
conversation key of its own; a child process hosts a ``Runtime`` of ``--nodes`` idle
nodes (default 4). A task's latency is the start of its send minus the start of its
enqueue, both read from CLOCK_MONOTONIC (``time.monotonic()``, one clock for every
process of the machine). Before the first enqueue both processes sit idle for
``--quiet-s`` seconds with their stores open, and each reports the CPU it used meanwhile
(``os.times()``, user + system, as a percentage of one core) and the write transactions
its store committed (the consumer's are its membership heartbeats). Each task's latency is
also split at the end of its enqueue call: ``enqueue_*`` (the producer's call) and
``pickup_*`` (the consumer's send start minus the call's return: the wake-up, the claim and
the start of the send).

On PostgreSQL the run also measures what bounds the latency (``postgres.floor``): the round
trip of a bare ``SELECT 1`` on asyncpg, and of a one-row autocommit write (its commit waits
for the server's WAL flush, as an enqueue's and a claim's do); 300 of each back to back
(``select_*``, ``commit_*``), and 100 of each after an idle gap drawn as the enqueues' gaps
are (``*_after_gap_*``: the processes and the server have gone idle, as they have before
each task of the run).

Each store is measured twice in the same run, in alternation: with the cross-process
wake-up on (SQLite: :mod:`asynccoord.backends.sqlite.wakeup`; PostgreSQL: LISTEN/NOTIFY)
and with it off (``wakeup=False`` / ``listen=False``: only the runtime's idle poll finds
work from elsewhere), the baseline.

Usage::

    python benchmarks/latency.py [--tasks 150] [--dsn postgresql://postgres@127.0.0.1:5432/test]
        [--quick] [--json]

``--quick`` is a smoke run (20 tasks, 1 s quiet) for the test suite. Without ``--dsn``
only SQLite is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from _common import loadavg

QUEUE = "latency"


def _percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q * len(ordered) + 0.5)))
    return ordered[rank - 1]


def _cpu_s() -> float:
    times = os.times()
    return times.user + times.system


def _open(target: str, schema: str | None, wakeup: bool) -> Any:
    if target.startswith("postgresql://"):
        from asynccoord.backends.postgres.store import PostgresStore

        return PostgresStore(target, schema=schema, listen=wakeup)
    from asynccoord.backends.sqlite.store import SQLiteStore

    return SQLiteStore(target, wakeup=wakeup)


async def _consumer(args: argparse.Namespace) -> None:
    """Host a Runtime; say "ready" after the quiet interval; print the latencies as JSON when all came."""
    from asynccoord import NodeConfig, Runtime, Task

    sent: dict[int, float] = {}  # task number -> CLOCK_MONOTONIC at its send's start
    done = asyncio.Event()

    async def send(task: Task) -> None:
        sent[int(task.payload["n"])] = time.monotonic()
        if len(sent) >= args.tasks:
            done.set()

    async with _open(args.target, args.schema, args.wakeup) as store:
        runtime = Runtime(store, send=send, nodes=args.nodes, config=NodeConfig(queue=QUEUE))
        async with runtime:
            await asyncio.sleep(1.0)  # start-up: membership settles, nodes go idle
            cpu0, wall0, tx0 = _cpu_s(), time.monotonic(), store.transactions
            await asyncio.sleep(args.quiet_s)
            idle = {
                "cpu_pct": 100.0 * (_cpu_s() - cpu0) / (time.monotonic() - wall0),
                "writes": store.transactions - tx0,
            }
            print(json.dumps({"ready": idle}), flush=True)
            await asyncio.wait_for(done.wait(), args.tasks * 2.0 + 30.0)
    print(json.dumps({"sent": sent}), flush=True)


async def _measure(target: str, schema: str | None, wakeup: bool, args: argparse.Namespace) -> dict[str, Any]:
    """One measurement: a consumer child, this process the producer."""
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--role",
        "consumer",
        "--target",
        target,
        *(["--schema", schema] if schema else []),
        "--wakeup" if wakeup else "--no-wakeup",
        "--tasks",
        str(args.tasks),
        "--nodes",
        str(args.nodes),
        "--quiet-s",
        str(args.quiet_s),
        stdout=subprocess.PIPE,
    )
    assert child.stdout is not None
    rng = random.Random(args.seed)
    try:
        async with _open(target, schema, wakeup) as store:
            cpu0, wall0, tx0 = _cpu_s(), time.monotonic(), store.transactions
            line = await asyncio.wait_for(child.stdout.readline(), args.quiet_s + 60.0)
            producer_idle = {
                "cpu_pct": 100.0 * (_cpu_s() - cpu0) / (time.monotonic() - wall0),
                "writes": store.transactions - tx0,
            }
            consumer_idle = json.loads(line)["ready"]
            low_ms, high_ms = args.gap_ms
            enqueues: list[tuple[float, float]] = []  # (call, return) per task, CLOCK_MONOTONIC
            for n in range(args.tasks):
                await asyncio.sleep(rng.uniform(low_ms, high_ms) / 1000.0)
                start = time.monotonic()
                await store.enqueue(QUEUE, {"n": n}, partition_key=f"conversation-{n}")
                enqueues.append((start, time.monotonic()))
            out, _ = await asyncio.wait_for(child.communicate(), args.tasks * 2.0 + 60.0)
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    if child.returncode != 0:
        raise RuntimeError(f"the consumer exited with {child.returncode}")
    sent = {int(n): t for n, t in json.loads(out.decode().strip().splitlines()[-1])["sent"].items()}
    latencies = [(sent[n] - call) * 1000.0 for n, (call, _) in enumerate(enqueues)]
    calls = [(back - call) * 1000.0 for call, back in enqueues]
    pickups = [(sent[n] - back) * 1000.0 for n, (_, back) in enumerate(enqueues)]
    return {
        "tasks": len(sent),
        "p50_ms": round(_percentile(latencies, 0.50), 3),
        "p90_ms": round(_percentile(latencies, 0.90), 3),
        "p99_ms": round(_percentile(latencies, 0.99), 3),
        "max_ms": round(max(latencies), 3),
        "mean_ms": round(statistics.fmean(latencies), 3),
        "enqueue_p50_ms": round(_percentile(calls, 0.50), 3),
        "enqueue_p99_ms": round(_percentile(calls, 0.99), 3),
        "pickup_p50_ms": round(_percentile(pickups, 0.50), 3),
        "pickup_p99_ms": round(_percentile(pickups, 0.99), 3),
        "idle_consumer_cpu_pct": round(consumer_idle["cpu_pct"], 3),
        "idle_consumer_writes": consumer_idle["writes"],
        "idle_producer_cpu_pct": round(producer_idle["cpu_pct"], 3),
        "idle_producer_writes": producer_idle["writes"],
    }


async def _pg_schema(dsn: str, action: str, schema: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        if action == "create":
            await conn.execute(f'CREATE SCHEMA "{schema}"')
        else:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


async def _pg_floor(dsn: str, schema: str, args: argparse.Namespace) -> dict[str, float]:
    """The round trip of ``SELECT 1`` and of a one-row autocommit write on one asyncpg connection
    (p50, p99 ms), back to back and after idle gaps of ``args.gap_ms``."""
    import asyncpg

    rng = random.Random(args.seed)
    write = "INSERT INTO latency_floor VALUES (1, 0) ON CONFLICT (k) DO UPDATE SET v = latency_floor.v + 1"
    conn = await asyncpg.connect(dsn, server_settings={"search_path": f'"{schema}"'})
    try:
        await conn.execute("CREATE TABLE latency_floor (k int PRIMARY KEY, v bigint NOT NULL)")
        figures: dict[str, float] = {}
        for gapped, count in ((False, 300), (True, 100)):
            for name, sql in (("select", "SELECT 1"), ("commit", write)):
                times_ms = []
                for _ in range(count):
                    if gapped:
                        await asyncio.sleep(rng.uniform(*args.gap_ms) / 1000.0)
                    start = time.perf_counter()
                    await conn.execute(sql)
                    times_ms.append((time.perf_counter() - start) * 1000.0)
                label = f"{name}_after_gap" if gapped else name
                figures[f"{label}_p50_ms"] = round(_percentile(times_ms, 0.50), 3)
                figures[f"{label}_p99_ms"] = round(_percentile(times_ms, 0.99), 3)
        return figures
    finally:
        await conn.close()


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"tasks": args.tasks, "nodes": args.nodes, "gap_ms": list(args.gap_ms)}
    results["loadavg_before"] = loadavg()
    stores = [kind for kind in ("sqlite", "postgres") if kind in args.stores and (kind == "sqlite" or args.dsn)]
    for kind in stores:
        for mode, wakeup in (("wakeup", True), ("poll_only", False)):
            if kind == "sqlite":
                with tempfile.TemporaryDirectory() as tmp:
                    figures = await _measure(os.path.join(tmp, "latency.db"), None, wakeup, args)
            else:
                schema = f"latency_{os.getpid()}_{mode}"
                await _pg_schema(args.dsn, "create", schema)
                try:
                    figures = await _measure(args.dsn, schema, wakeup, args)
                    if wakeup:
                        results.setdefault(kind, {})["floor"] = await _pg_floor(args.dsn, schema, args)
                finally:
                    await _pg_schema(args.dsn, "drop", schema)
            results.setdefault(kind, {})[mode] = figures
            if not args.json:
                print(f"{kind:8} {mode:9} " + " ".join(f"{k}={v}" for k, v in figures.items()), flush=True)
                if "floor" in results[kind] and wakeup:
                    floor = results[kind]["floor"]
                    print(f"{kind:8} {'floor':9} " + " ".join(f"{k}={v}" for k, v in floor.items()), flush=True)
    results["loadavg_after"] = loadavg()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=150)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--gap-ms", type=float, nargs=2, default=(20.0, 100.0))
    parser.add_argument("--quiet-s", type=float, default=5.0)
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--stores", nargs="+", default=("sqlite", "postgres"), choices=("sqlite", "postgres"))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--role", default="producer", choices=("producer", "consumer"), help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    parser.add_argument("--schema", help=argparse.SUPPRESS)
    parser.add_argument("--wakeup", action=argparse.BooleanOptionalAction, default=True, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.tasks, args.quiet_s = 20, 1.0
    if args.role == "consumer":
        asyncio.run(_consumer(args))
        return
    results = asyncio.run(_run(args))
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
