"""Hot account: how much of a drain one sending account's lock spends sending.

Every message of one sending account takes the account's lock, so the account's drain
time is bounded below by the sum of its sends. ``--tasks`` tasks (default 2,000) over
``--conversations`` conversations (default 200), all with ``lock_key`` ``"account:hot"``,
are enqueued up front; then ``--processes`` OS processes (1 and 2 by default), each a
``Runtime`` of ``--nodes`` nodes (default 8, ordered queue, the default ``NodeConfig``),
drain them with a send that sleeps ``--send-ms`` (default 1 ms). Each send records its
start and end on CLOCK_MONOTONIC (``time.monotonic()``, one clock for every process of the
machine). **Efficiency** is the sum of the send times over the drain time, the first
send's start to the last one's end: 1.0 means the next send began the moment the last
one returned. Send times are measured, not assumed, so a loaded machine's late timers
count as sending, not as coordination.

The baseline, in the same run: one coroutine that makes the same sends one after the
other with nothing between them (the efficiency of a bare loop on this machine now).
Each configuration is run ``--repeat`` times, interleaved with the others, and the
medians are reported with the load average.

Usage::

    python benchmarks/hot_account.py [--processes 1 2] [--dsn postgresql://...] [--repeat 3] [--json] [--quick]

``--quick`` is a smoke run for the test suite (200 tasks, 1 repeat). Without ``--dsn``
only SQLite is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from _common import loadavg, run

QUEUE = "hot"
LOCK = "account:hot"


def _open(target: str, schema: str | None) -> Any:
    if target.startswith("postgresql://"):
        from asynccoord.backends.postgres.store import PostgresStore

        return PostgresStore(target, schema=schema)
    from asynccoord.backends.sqlite.store import SQLiteStore

    return SQLiteStore(target)


async def _worker(args: argparse.Namespace) -> None:
    """One process: a Runtime that drains the queue after "go" on stdin; print its send intervals as JSON."""
    from asynccoord import NodeConfig, Runtime, Task

    intervals: list[tuple[float, float]] = []
    send_s = args.send_ms / 1000.0

    async def send(task: Task) -> None:
        start = time.monotonic()
        await asyncio.sleep(send_s)
        intervals.append((start, time.monotonic()))

    loop = asyncio.get_running_loop()
    async with _open(args.target, args.schema) as store:
        print("ready", flush=True)
        await loop.run_in_executor(None, sys.stdin.readline)
        runtime = Runtime(
            store, send=send, nodes=args.nodes, config=NodeConfig(queue=QUEUE), lock_key=lambda task: LOCK
        )
        async with runtime:
            drained = await runtime.wait_until_drained(timeout_s=600.0, poll_s=0.01)
    print(json.dumps({"drained": drained, "intervals": intervals}), flush=True)


async def _fill(target: str, schema: str | None, tasks: int, conversations: int) -> None:
    from asynccoord import NewTask

    async with _open(target, schema) as store:
        for offset in range(0, tasks, 500):
            await store.enqueue_many(
                [
                    NewTask(queue=QUEUE, payload={"n": n}, partition_key=f"conversation-{n % conversations}")
                    for n in range(offset, min(tasks, offset + 500))
                ]
            )


def _efficiency(intervals: list[tuple[float, float]]) -> dict[str, float]:
    busy = sum(end - start for start, end in intervals)
    drain = max(end for _, end in intervals) - min(start for start, _ in intervals)
    return {
        "sends": len(intervals),
        "send_s": round(busy, 4),
        "drain_s": round(drain, 4),
        "efficiency": round(busy / drain, 4),
        "overhead_ms_per_send": round(1000.0 * (drain - busy) / len(intervals), 4),
    }


def _measure(target: str, schema: str | None, processes: int, args: argparse.Namespace) -> dict[str, float]:
    """One drain by ``processes`` worker processes of the queue filled with ``--tasks`` tasks."""
    run(lambda: _fill(target, schema, args.tasks, args.conversations))
    command = [sys.executable, __file__, "--role", "worker", "--target", target, "--nodes", str(args.nodes)]
    command += ["--send-ms", str(args.send_ms), *(["--schema", schema] if schema else [])]
    procs = [
        subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(processes)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        intervals: list[tuple[float, float]] = []
        for proc in procs:
            out, _ = proc.communicate(timeout=600)
            if proc.returncode != 0:
                raise RuntimeError(f"a worker exited with {proc.returncode}")
            report = json.loads(out.strip().splitlines()[-1])
            assert report["drained"], report
            intervals.extend(tuple(i) for i in report["intervals"])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert len(intervals) >= args.tasks, (len(intervals), args.tasks)
    return _efficiency(intervals)


async def _bare_loop(tasks: int, send_ms: float) -> dict[str, float]:
    """The baseline: the same sends, one after the other, nothing between them."""
    intervals = []
    for _ in range(tasks):
        start = time.monotonic()
        await asyncio.sleep(send_ms / 1000.0)
        intervals.append((start, time.monotonic()))
    return _efficiency(intervals)


def _pg_schema(dsn: str, action: str, schema: str) -> None:
    import asyncpg

    async def go() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            if action == "create":
                await conn.execute(f'CREATE SCHEMA "{schema}"')
            else:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()

    asyncio.run(go())


def bench(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {
        "tasks": args.tasks,
        "conversations": args.conversations,
        "nodes": args.nodes,
        "send_ms": args.send_ms,
        "repeat": args.repeat,
        "loadavg_before": loadavg(),
    }
    stores = ["sqlite"] + (["postgres"] if args.dsn else [])
    runs: dict[str, list[dict[str, float]]] = {"bare_loop": []}
    for kind in stores:
        for p in args.processes:
            runs[f"{kind}_{p}p"] = []
    for r in range(args.repeat):
        runs["bare_loop"].append(run(lambda: _bare_loop(args.tasks, args.send_ms)))
        for kind in stores:
            for p in args.processes:
                if kind == "sqlite":
                    with tempfile.TemporaryDirectory() as tmp:
                        runs[f"{kind}_{p}p"].append(_measure(os.path.join(tmp, "hot.db"), None, p, args))
                else:
                    schema = f"hot_{os.getpid()}_{r}_{p}"
                    _pg_schema(args.dsn, "create", schema)
                    try:
                        runs[f"{kind}_{p}p"].append(_measure(args.dsn, schema, p, args))
                    finally:
                        _pg_schema(args.dsn, "drop", schema)
    results["runs"] = runs
    results["efficiency"] = {name: statistics.median(x["efficiency"] for x in rs) for name, rs in runs.items()}
    results["overhead_ms_per_send"] = {
        name: statistics.median(x["overhead_ms_per_send"] for x in rs) for name, rs in runs.items()
    }
    results["loadavg_after"] = loadavg()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--nodes", type=int, default=8, help="nodes per process (default 8)")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--send-ms", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--role", default="parent", choices=("parent", "worker"), help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    parser.add_argument("--schema", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "worker":
        run(lambda: _worker(args))
        return
    if args.quick:
        args.tasks, args.conversations, args.repeat = 200, 20, 1
    results = bench(args)
    if args.json:
        print(json.dumps(results))
        return
    print(f"{results['tasks']} tasks, {results['conversations']} conversations, one lock, {args.send_ms} ms sends")
    print(f"load before {results['loadavg_before']}, after {results['loadavg_after']}")
    for name, eff in results["efficiency"].items():
        print(f"  {name:<12} efficiency {eff:.3f}  overhead {results['overhead_ms_per_send'][name]:.3f} ms/send")


if __name__ == "__main__":
    main()
