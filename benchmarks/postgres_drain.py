"""Drain rate of asynccoord on PostgreSQL, beside procrastinate on the same server, in one run.

Both drain the same number of no-op jobs from one PostgreSQL database, each in a schema
of its own created fresh for every run, with the same process layouts:

* 1 process x 1 worker (asynccoord: 1 node; procrastinate: ``concurrency=1``);
* 2 processes x 8 workers (asynccoord: 8 nodes per process; procrastinate: 2 worker
  processes with ``concurrency=8``).

The clock starts when every worker process is up and told to go, and stops when the
database shows no job left to do (polled every 20 ms by the parent, through each
system's partial index of unfinished jobs; the tables are ANALYZEd after the fill), so
process start-up and shutdown are not counted. Workers poll nothing else:
procrastinate's stop by themselves on an empty queue (``wait=False``), asynccoord's when
the parent says so (polling ``stats()``, a count over the whole table, 20 times a second
each, would be a harness cost procrastinate does not pay; see benchmarks/README.md).
asynccoord runs its full pipeline (partitioned claims with per-key ordering, leases with
renewal, compare-and-set commits with processed-id records); procrastinate its default
worker (LISTEN/NOTIFY on, one job fetched per worker slot). Jobs are 1,000
conversations' worth of keys, no locks (``--locks`` adds an account lock per job to
asynccoord: procrastinate has no equivalent).

procrastinate's jobs (no queueing lock) keep no order between them; asynccoord's default
nodes keep each conversation in order. Each run therefore also drains the same tasks with
asynccoord nodes that claim without per-key ordering (``NodeConfig(ordered=False)``: the
same semantics as procrastinate's jobs, everything else unchanged), just before
procrastinate, on the same server and with the same clock; both figures are reported, each
with its ratio (``--no-unordered`` measures the ordered nodes only).

Usage::

    python benchmarks/postgres_drain.py --dsn postgresql://postgres@127.0.0.1:5432/test \\
        [--tasks 20000] [--repeat 1] [--no-procrastinate] [--no-unordered] [--locks]

procrastinate comes with the ``bench`` extra (``pip install -e '.[bench]'``); without it
only asynccoord is measured. Prints one line per run and a table with the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

QUEUE = "bench"
LAYOUTS = ((1, 1), (2, 8))  # (processes, workers per process)


@dataclass(frozen=True, slots=True)
class Result:
    system: str
    processes: int
    workers: int
    tasks: int
    seconds: float
    cpu_s: float = 0.0  # CPU time (user + system) of the worker processes, start-up and shutdown included

    @property
    def rate(self) -> float:
        return self.tasks / self.seconds


# --- helpers ---------------------------------------------------------------------------


def bench_schema(name: str) -> str:
    """An ``argparse`` type for a schema the benchmark drops and makes anew: a plain lower-case
    identifier (letters, digits, ``_``; 1..63 bytes), not PostgreSQL's own (``pg_*``), since it
    goes into ``DROP SCHEMA ... CASCADE`` as it is.

    Raises:
        argparse.ArgumentTypeError: any other name.
    """
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", name) or name.startswith("pg_") or name == "public":
        raise argparse.ArgumentTypeError(
            f"{name!r}: a lower-case identifier of letters, digits and _ (not pg_*, not public), "
            "which the benchmark drops"
        )
    return name


async def connect(dsn: str) -> Any:
    """One asyncpg connection to ``dsn`` (its libpq ``connect_timeout``, if any, as the store reads it)."""
    import asyncpg

    from asynccoord.backends.open import split_connect_timeout

    plain, timeout_s = split_connect_timeout(dsn)
    return await asyncpg.connect(plain, timeout=timeout_s)


async def admin(dsn: str, *statements: str) -> None:
    conn = await connect(dsn)
    try:
        for sql in statements:
            await conn.execute(sql)
    finally:
        await conn.close()


async def pg_raw_commits_per_s(dsn: str, schema: str, seconds: float) -> float:
    """Single-row UPDATE commits per second, one asyncpg connection in autocommit, in ``schema``
    (the commit limit of the server as one client sees it: the benchmarks' baseline)."""
    conn = await connect(dsn)
    try:
        await conn.execute(f'CREATE TABLE IF NOT EXISTS "{schema}".bench_raw (id int PRIMARY KEY, v int NOT NULL)')
        await conn.execute(f'INSERT INTO "{schema}".bench_raw VALUES (1, 0) ON CONFLICT DO NOTHING')
        statement = await conn.prepare(f'UPDATE "{schema}".bench_raw SET v = v + 1 WHERE id = 1')
        n = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            await statement.fetch()
            n += 1
        return n / (time.perf_counter() - start)
    finally:
        await conn.close()


async def count_left(dsn: str, sql: str) -> int:
    conn = await connect(dsn)
    try:
        return int(await conn.fetchval(sql))
    finally:
        await conn.close()


async def wait_drained(dsn: str, sql: str, timeout_s: float) -> float:
    """Poll until ``sql`` counts 0; return the monotonic time it did."""
    conn = await connect(dsn)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if int(await conn.fetchval(sql)) == 0:
                return time.monotonic()
            await asyncio.sleep(0.02)
    finally:
        await conn.close()
    raise TimeoutError(f"not drained after {timeout_s} s")


def spawn_workers(argv: list[str], processes: int) -> list[subprocess.Popen[str]]:
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        for _ in range(processes)
    ]
    for proc in procs:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if json.loads(line or "{}").get("event") != "ready":
            raise RuntimeError(f"a worker failed to start: {line!r}")
    return procs


def go(procs: list[subprocess.Popen[str]]) -> float:
    started = time.monotonic()
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    return started


def stop(procs: list[subprocess.Popen[str]]) -> None:
    """Tell the workers the queue is drained (asynccoord's wait for it), and wait for them to exit."""
    for proc in procs:
        try:
            assert proc.stdin is not None
            proc.stdin.write("stop\n")
            proc.stdin.flush()
        except (BrokenPipeError, OSError):  # a procrastinate worker that stopped by itself
            pass
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- asynccoord ---------------------------------------------------------------------


async def asynccoord_fill(dsn: str, schema: str, tasks: int) -> None:
    from asynccoord import NewTask
    from asynccoord.backends.postgres.store import PostgresStore

    await admin(dsn, f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    async with PostgresStore(dsn, schema=schema, listen=False) as store:
        for first in range(0, tasks, 5000):
            await store.enqueue_many(
                [
                    NewTask(queue=QUEUE, payload={"n": i, "account": i % 200}, partition_key=f"conv-{i % 1000}")
                    for i in range(first, min(tasks, first + 5000))
                ]
            )
    await admin(dsn, f'ANALYZE "{schema}".coord_tasks')


async def asynccoord_worker(dsn: str, schema: str, nodes: int, locks: bool, ordered: bool = True) -> None:
    from asynccoord import NodeConfig, Runtime, Task
    from asynccoord.backends.postgres.store import PostgresStore

    async def send(task: Task) -> None:
        return None

    def lock_key(task: Task) -> str | None:
        return f"account:{task.payload['account']}" if locks else None

    config = NodeConfig(queue=QUEUE, claim_batch=64, max_in_flight=64, idle_max_s=0.2, ordered=ordered)
    async with PostgresStore(dsn, schema=schema, pool_max_size=4) as store:
        runtime = Runtime(store, send=send, nodes=nodes, config=config, lock_key=lock_key)
        print(json.dumps({"event": "ready"}), flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        async with runtime:
            await asyncio.to_thread(sys.stdin.readline)  # "stop": the parent saw the queue drained


async def asynccoord_run(dsn: str, tasks: int, processes: int, nodes: int, locks: bool, ordered: bool = True) -> Result:
    """Drain ``tasks`` tasks with ``processes`` processes of ``nodes`` nodes each, on a fresh schema.

    ``ordered`` False: the nodes claim without per-key ordering (procrastinate's semantics).
    """
    schema = "bench_asynccoord"
    try:
        return await _asynccoord_drain(dsn, schema, tasks, processes, nodes, locks, ordered)
    finally:
        await admin(dsn, f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def _asynccoord_drain(
    dsn: str, schema: str, tasks: int, processes: int, nodes: int, locks: bool, ordered: bool
) -> Result:
    await asynccoord_fill(dsn, schema, tasks)
    argv = ["--role", "asynccoord-worker", "--dsn", dsn, "--schema", schema, "--workers", str(nodes)]
    if locks:
        argv.append("--locks")
    if not ordered:
        argv.append("--unordered")
    cpu_before = _children_cpu_s()
    procs = spawn_workers(argv, processes)
    started = go(procs)
    table = f'"{schema}".coord_tasks'
    left = (  # the first entry of coord_tasks_pending and of coord_tasks_lease_expiry (partial indexes)
        f"SELECT count(*) FROM ((SELECT 1 FROM {table} WHERE queue = '{QUEUE}' AND status = 'pending'"
        " ORDER BY priority DESC, id LIMIT 1) UNION ALL"
        f" (SELECT 1 FROM {table} WHERE queue = '{QUEUE}' AND status = 'running'"
        " ORDER BY lease_expires_at LIMIT 1)) AS unfinished"
    )
    ended = await wait_drained(dsn, left, 600.0)
    stop(procs)
    cpu_s = _children_cpu_s() - cpu_before
    done = await count_left(dsn, f"SELECT count(*) FROM \"{schema}\".coord_tasks WHERE status = 'done'")
    assert done == tasks, f"asynccoord: {done} of {tasks} done"
    system = "asynccoord" if ordered else "asynccoord-unordered"
    return Result(system, processes, nodes, tasks, ended - started, cpu_s)


def _children_cpu_s() -> float:
    """CPU seconds (user + system) of the waited-for child processes so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# --- procrastinate ------------------------------------------------------------------


def procrastinate_app(dsn: str, schema: str, send_ms: float = 0.0) -> Any:
    """A procrastinate app on ``schema`` with one task, ``noop``, that sleeps ``send_ms`` (0: returns at once)."""
    import procrastinate

    connector = procrastinate.PsycopgConnector(conninfo=dsn, kwargs={"options": f"-c search_path={schema}"})
    app = procrastinate.App(connector=connector)
    send_s = send_ms / 1000.0

    @app.task(name="noop", queue=QUEUE)
    async def noop(n: int, account: int) -> None:
        if send_s > 0:
            await asyncio.sleep(send_s)

    return app


async def procrastinate_fill(dsn: str, schema: str, tasks: int) -> None:
    await admin(dsn, f'DROP SCHEMA IF EXISTS "{schema}" CASCADE', f'CREATE SCHEMA "{schema}"')
    app = procrastinate_app(dsn, schema)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        task = app.tasks["noop"]
        for first in range(0, tasks, 5000):
            await task.batch_defer_async(
                *({"n": i, "account": i % 200} for i in range(first, min(tasks, first + 5000)))
            )
    await admin(dsn, f'ANALYZE "{schema}".procrastinate_jobs')


async def procrastinate_worker(dsn: str, schema: str, concurrency: int, send_ms: float = 0.0) -> None:
    app = procrastinate_app(dsn, schema, send_ms)
    async with app.open_async():
        print(json.dumps({"event": "ready"}), flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        await app.run_worker_async(concurrency=concurrency, wait=False, install_signal_handlers=False)


async def procrastinate_run(dsn: str, tasks: int, processes: int, concurrency: int, send_ms: float = 0.0) -> Result:
    """Drain ``tasks`` jobs with ``processes`` procrastinate workers of ``concurrency`` each, on a fresh schema.

    Each job sleeps ``send_ms`` (0: a no-op). Also used by ``contention.py --store postgresql://...``.
    """
    schema = "bench_procrastinate"
    try:
        return await _procrastinate_drain(dsn, schema, tasks, processes, concurrency, send_ms)
    finally:
        await admin(dsn, f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def _procrastinate_drain(
    dsn: str, schema: str, tasks: int, processes: int, concurrency: int, send_ms: float
) -> Result:
    await procrastinate_fill(dsn, schema, tasks)
    argv = ["--role", "procrastinate-worker", "--dsn", dsn, "--schema", schema, "--workers", str(concurrency)]
    argv += ["--send-ms", str(send_ms)]
    procs = spawn_workers(argv, processes)
    started = go(procs)
    table = f'"{schema}".procrastinate_jobs'
    left = (  # the first entry of procrastinate_jobs_priority_idx_v1 and _lock_idx_v1 (partial indexes)
        f"SELECT count(*) FROM ((SELECT 1 FROM {table} WHERE status = 'todo' ORDER BY priority DESC, id LIMIT 1)"
        f" UNION ALL (SELECT 1 FROM {table} WHERE status = 'doing' ORDER BY lock LIMIT 1)) AS unfinished"
    )
    ended = await wait_drained(dsn, left, 900.0)
    stop(procs)
    done = await count_left(dsn, f"SELECT count(*) FROM \"{schema}\".procrastinate_jobs WHERE status = 'succeeded'")
    assert done == tasks, f"procrastinate: {done} of {tasks} succeeded"
    return Result("procrastinate", processes, concurrency, tasks, ended - started)


# --- main ---------------------------------------------------------------------------


def have_procrastinate() -> bool:
    try:
        import procrastinate  # noqa: F401
    except ImportError:
        return False
    return True


async def bench(args: argparse.Namespace) -> None:
    results: list[Result] = []
    with_procrastinate = not args.no_procrastinate and have_procrastinate()
    log = sys.stderr if args.json else sys.stdout  # --json: stdout carries the JSON object only
    load_start = os.getloadavg()
    if not args.no_procrastinate and not with_procrastinate:
        print("procrastinate is not installed (pip install -e '.[bench]'): measuring asynccoord only", file=log)
    for processes, workers in LAYOUTS:
        for _ in range(args.repeat):
            runs = [await asynccoord_run(args.dsn, args.tasks, processes, workers, args.locks)]
            if not args.no_unordered:
                runs.append(await asynccoord_run(args.dsn, args.tasks, processes, workers, args.locks, ordered=False))
            if with_procrastinate:
                jobs = args.procrastinate_tasks or args.tasks
                runs.append(await procrastinate_run(args.dsn, jobs, processes, workers))
            for r in runs:
                line = f"{r.system:20} {processes} x {workers:2d}: {r.tasks} in {r.seconds:6.2f} s = {r.rate:8.0f}/s"
                if r.cpu_s:
                    line += f", workers' CPU {r.cpu_s / r.tasks * 1e6:.0f} us/task"
                print(line, file=log, flush=True)
            results.extend(runs)
    version = await server_version(args.dsn)
    layouts: list[dict[str, Any]] = []
    for layout in LAYOUTS:
        processes, workers = layout
        ours = [r.rate for r in results if r.system == "asynccoord" and (r.processes, r.workers) == layout]
        unordered = [
            r.rate for r in results if r.system == "asynccoord-unordered" and (r.processes, r.workers) == layout
        ]
        theirs = [r.rate for r in results if r.system == "procrastinate" and (r.processes, r.workers) == layout]
        a = statistics.median(ours)
        u = statistics.median(unordered) if unordered else None
        p = statistics.median(theirs) if theirs else None
        layouts.append(
            {
                "processes": processes,
                "workers": workers,
                "asynccoord_tasks_per_s": a,
                "procrastinate_jobs_per_s": p,
                "ratio": a / p if p else None,
                "asynccoord_runs": ours,
                "asynccoord_cpu_us_per_task_runs": [
                    r.cpu_s / r.tasks * 1e6
                    for r in results
                    if r.system == "asynccoord" and (r.processes, r.workers) == layout
                ],
                "procrastinate_runs": theirs,
                "ratio_per_run": [x / y for x, y in zip(ours, theirs, strict=False)],
                "asynccoord_unordered_tasks_per_s": u,
                "ratio_unordered": u / p if u and p else None,
                "asynccoord_unordered_runs": unordered,
                "ratio_unordered_per_run": [x / y for x, y in zip(unordered, theirs, strict=False)],
            }
        )
    if args.json:
        report = {
            "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "postgres": version},
            "load_average_start": load_start,
            "load_average_end": os.getloadavg(),
            "tasks": args.tasks,
            "repeat": args.repeat,
            "locks": args.locks,
            "layouts": layouts,
        }
        print(json.dumps(report))
        return
    print()
    print(f"| layout | asynccoord tasks/s | procrastinate jobs/s | ratio |  (PostgreSQL {version})")
    print("|---|---:|---:|---:|")
    for row in layouts:
        theirs = row["procrastinate_jobs_per_s"]
        shown = "-" if theirs is None else f"{theirs:,.0f}"
        name = f"{row['processes']} process x {row['workers']}"
        for label, rate, ratio in (
            ("ordered", row["asynccoord_tasks_per_s"], row["ratio"]),
            ("unordered", row["asynccoord_unordered_tasks_per_s"], row["ratio_unordered"]),
        ):
            if rate is None:
                continue
            times = "-" if ratio is None else f"{ratio:.1f}x"
            print(f"| {name}, {label} | {rate:,.0f} | {shown} | {times} |")


async def server_version(dsn: str) -> str:
    conn = await connect(dsn)
    try:
        return str(await conn.fetchval("SHOW server_version"))
    finally:
        await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_dsn = os.environ.get("ASYNCCOORD_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1/test")
    parser.add_argument("--dsn", default=default_dsn)
    parser.add_argument("--tasks", type=int, default=20_000, help="tasks per run (default 20000)")
    parser.add_argument("--procrastinate-tasks", type=int, default=0, help="jobs per procrastinate run")
    parser.add_argument("--repeat", type=int, default=1, help="runs per layout; the median is reported")
    parser.add_argument("--no-procrastinate", action="store_true", help="measure asynccoord only")
    parser.add_argument("--locks", action="store_true", help="asynccoord takes an account lock per task")
    parser.add_argument(
        "--no-unordered", action="store_true", help="skip the asynccoord nodes that claim without per-key ordering"
    )
    parser.add_argument("--unordered", action="store_true", help=argparse.SUPPRESS)  # worker role: ordered=False
    parser.add_argument("--json", action="store_true", help="print one JSON object of the figures (progress to stderr)")
    parser.add_argument("--role", default="bench", help=argparse.SUPPRESS)
    parser.add_argument("--schema", default="", help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--send-ms", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "asynccoord-worker":
        asyncio.run(asynccoord_worker(args.dsn, args.schema, args.workers, args.locks, ordered=not args.unordered))
    elif args.role == "procrastinate-worker":
        asyncio.run(procrastinate_worker(args.dsn, args.schema, args.workers, args.send_ms))
    else:
        asyncio.run(bench(args))


if __name__ == "__main__":
    main()
