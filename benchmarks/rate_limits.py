"""Rate limits across processes: the window bound, utilisation, the cost on the claim, and what users bolt on.

A backlog of tasks over many keys (chats) is drained by 2 processes x 8 nodes on one
SQLite file (``--processes``, ``--nodes``). Every send records its key and
``CLOCK_MONOTONIC`` time (one clock for every process of the machine) in a log file of
its process; the parent reads the logs and judges, per key:

* ``max_window_ratio``: the most sends in any window of ``per_s`` seconds over the bound
  the store promises (``count + burst``, :func:`asynccoord.contract.ratelimits.max_in_window`);
  at most 1.0 when no key went over;
* ``utilisation``: the sends over what the limit allowed from the start of the drain to
  the key's last send (``burst + rate x time``); the backlog is there from the start;
* ``claim_cost``: the drain rate of a no-op send with no limits over the same drain with
  limits declared so high they never bind (every claim still reads and writes buckets).

Side by side, in the same run, what a user would otherwise bolt on: no limits in the
store and a limiter called inside ``send``: pyrate-limiter with its SQLite bucket on a
shared file (its async wrapper, so the wait sleeps rather than blocks the loop), and DBOS
queues on SQLite with their per-partition limiter, each when it is installed (the
``bench`` extra). Modes that cannot run say why. With ``--dsn`` the asynccoord drains
(limited backlog and claim cost) run again on PostgreSQL, each in a fresh schema dropped
afterwards: the same processes and nodes, the buckets taken in PostgreSQL's claim.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from asynccoord import NewTask, PostgresStore, RateLimit, SQLiteStore, Task
from asynccoord.contract.ratelimits import max_in_window
from asynccoord.node import NodeConfig, Runtime

QUEUE = "outbox"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quick", action="store_true", help="a tiny run (for the test suite)")
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--nodes", type=int, default=8, help="nodes per process")
    p.add_argument("--keys", type=int, default=100, help="keys (chats) of the limited backlog")
    p.add_argument("--per-key", type=int, default=40, help="tasks per key of the limited backlog")
    p.add_argument("--rate", type=float, default=5.0, help="allowed sends per second per key")
    p.add_argument("--burst", type=int, default=2)
    p.add_argument("--drain-tasks", type=int, default=20_000, help="tasks of the no-op drains (claim cost)")
    p.add_argument("--dsn", default=None, help="also run the asynccoord drains on this PostgreSQL database")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # internal: run one worker process
    a = p.parse_args(argv)
    if a.quick:
        a.keys, a.per_key, a.rate, a.drain_tasks, a.nodes = 10, 8, 10.0, 600, 4
    return a


# --- the worker process -------------------------------------------------------------


async def worker(spec: dict[str, Any]) -> None:
    """One process: a Runtime of ``spec["nodes"]`` nodes; each send logs ``[key, monotonic time]``."""
    fd = os.open(spec["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    limiter = _pyrate(spec) if spec["mode"] == "pyrate_sqlite" else None

    async def send(task: Task) -> None:
        key = task.partition_key
        if limiter is not None:
            await limiter.try_acquire_async(key)  # the wait holds the lease and the node's slot
        os.write(fd, (json.dumps([key, time.clock_gettime(time.CLOCK_MONOTONIC)]) + "\n").encode())

    config = NodeConfig(queue=QUEUE, ordered=False, lease_s=30.0, idle_max_s=0.2, claim_batch=32, max_in_flight=32)
    store = _open(spec)
    async with store, Runtime(store, send=send, nodes=spec["nodes"], config=config, heartbeat_ttl_s=5.0):
        print("ready", flush=True)
        while not await store.is_drained(QUEUE):  # noqa: ASYNC110 - other processes drain it too: a poll
            await asyncio.sleep(0.02)
    os.close(fd)


def _open(spec: dict[str, Any]) -> Any:
    """The store of ``spec``: PostgreSQL in ``spec["schema"]`` when it names one, else SQLite file ``spec["db"]``."""
    if spec.get("schema"):
        return PostgresStore(spec["db"], schema=spec["schema"])
    return SQLiteStore(spec["db"])


def _pyrate(spec: dict[str, Any]) -> Any:
    """pyrate-limiter as its documentation builds it for many keys: a factory with one SQLite bucket per key.

    Every bucket lives in one SQLite file shared by the processes (``use_file_lock``), a
    table per key; the async wrapper makes a wait an ``asyncio.sleep``.
    """
    from pyrate_limiter import BucketAsyncWrapper, BucketFactory, Duration, Limiter, Rate, RateItem, SQLiteBucket

    rates = [Rate(int(spec["rate"]), Duration.SECOND)]

    class PerKey(BucketFactory):
        def __init__(self) -> None:
            self.buckets: dict[str, Any] = {}

        def wrap_item(self, name: str, weight: int = 1) -> Any:
            async def wrapped() -> RateItem:
                now = self.get_bucket(name).now()
                return RateItem(name, await now if inspect.isawaitable(now) else now, weight=weight)

            return wrapped()

        def get_bucket(self, name: str) -> Any:
            if name not in self.buckets:
                table = "k_" + "".join(c if c.isalnum() else "_" for c in name)
                bucket = SQLiteBucket.init_from_file(rates, table=table, db_path=spec["pyrate_db"], use_file_lock=True)
                self.buckets[name] = BucketAsyncWrapper(bucket)
                self.schedule_leak(self.buckets[name])
            return self.buckets[name]

        def get(self, item: RateItem) -> Any:
            return self.get_bucket(item.name)

    return Limiter(PerKey())


# --- the parent ---------------------------------------------------------------------


def run_workers(spec: dict[str, Any], processes: int) -> float:
    """Start the worker processes on ``spec``; return when all exit (the drain's wall time, seconds)."""
    started = time.monotonic()
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", json.dumps(spec)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        for _ in range(processes)
    ]
    for p in procs:
        _, err = p.communicate(timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"worker exited {p.returncode}: {err.decode()[-2000:]}")
    return time.monotonic() - started


async def fill(spec: dict[str, Any], limits: list[RateLimit], keys: int, per_key: int) -> None:
    async with _open(spec) as store:
        if limits:
            await store.set_rate_limits(QUEUE, limits)
        keyed = bool(limits)
        tasks = [
            NewTask(queue=QUEUE, partition_key=f"chat-{k}", limit_keys={"chat": f"chat-{k}"} if keyed else {})
            for i in range(per_key)
            for k in range(keys)
        ]
        for start in range(0, len(tasks), 5000):
            await store.enqueue_many(tasks[start : start + 5000])


def read_sends(log: Path) -> dict[str, list[float]]:
    sends: dict[str, list[float]] = defaultdict(list)
    for line in log.read_text().splitlines():
        key, t = json.loads(line)
        sends[key].append(t)
    for times in sends.values():
        times.sort()
    return sends


def judge(sends: dict[str, list[float]], limit: RateLimit) -> dict[str, Any]:
    """The window bound and the utilisation of ``limit`` over the logged sends."""
    every = [t for times in sends.values() for t in times]
    start = min(every)
    bound = max_in_window(limit)
    worst = 0
    shares = []
    for times in sends.values():
        lo = 0
        for hi, t in enumerate(times):
            while times[lo] <= t - limit.per_s:
                lo += 1
            worst = max(worst, hi - lo + 1)
        allowed = limit.burst + (times[-1] - start) * limit.count / limit.per_s
        shares.append(len(times) / allowed)
    return {
        "sends": len(every),
        "drain_s": round(max(every) - start, 3),
        "max_window": worst,
        "window_bound": bound,
        "max_window_ratio": round(worst / bound, 3),
        "utilisation": round(statistics.fmean(shares), 3),
        "utilisation_min": round(min(shares), 3),
    }


def _target(folder: Path, name: str, dsn: str | None) -> dict[str, Any]:
    """Where a mode's tasks live: an SQLite file of ``folder``, or a new schema of ``dsn``."""
    if dsn is None:
        return {"db": str(folder / f"{name}.db")}
    schema = f"ratebench_{os.getpid()}_{name}"
    asyncio.run(_pg_schema(dsn, f'CREATE SCHEMA "{schema}"'))
    return {"db": dsn, "schema": schema}


def _drop(target: dict[str, Any]) -> None:
    if target.get("schema"):
        asyncio.run(_pg_schema(target["db"], f'DROP SCHEMA IF EXISTS "{target["schema"]}" CASCADE'))


async def _pg_schema(dsn: str, statement: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


def mode_limited(folder: Path, a: argparse.Namespace, mode: str, dsn: str | None = None) -> dict[str, Any]:
    """Drain the limited backlog with the store's limits (``asynccoord``) or pyrate-limiter in ``send``."""
    limit = RateLimit(dimension="chat", count=int(a.rate), per_s=1.0, burst=a.burst)
    log = folder / f"{mode}{'_pg' if dsn else ''}.log"
    target = _target(folder, mode, dsn)
    try:
        asyncio.run(fill(target, [limit] if mode == "asynccoord" else [], a.keys, a.per_key))
        spec = {
            **target,
            "log": str(log),
            "nodes": a.nodes,
            "mode": mode,
            "rate": a.rate,
            "pyrate_db": str(folder / "pyrate.sqlite"),
        }
        wall = run_workers(spec, a.processes)
    finally:
        _drop(target)
    # pyrate-limiter's window is count per second (no burst): judged against the same bound.
    out = judge(read_sends(log), limit)
    out["wall_s"] = round(wall, 2)
    return out


def mode_drain(folder: Path, a: argparse.Namespace, limited: bool, dsn: str | None = None) -> dict[str, Any]:
    """A no-op drain of ``--drain-tasks`` over ``--keys`` keys: without limits, or with limits that never bind."""
    name = "drain_limits" if limited else "drain_plain"
    log = folder / f"{name}{'_pg' if dsn else ''}.log"
    never = RateLimit(dimension="chat", count=1_000_000, per_s=1.0, burst=1_000_000)
    per_key = max(1, a.drain_tasks // a.keys)
    target = _target(folder, name, dsn)
    try:
        asyncio.run(fill(target, [never] if limited else [], a.keys, per_key))
        run_workers({**target, "log": str(log), "nodes": a.nodes, "mode": name, "rate": 0}, a.processes)
    finally:
        _drop(target)
    sends = read_sends(log)
    every = sorted(t for times in sends.values() for t in times)
    span = every[-1] - every[0]
    return {"tasks": len(every), "tasks_per_s": round(len(every) / span, 1) if span > 0 else None}


def mode_dbos(folder: Path, a: argparse.Namespace) -> dict[str, Any]:
    """DBOS queues on SQLite: one queue, a per-partition limiter, one partition per key; one process."""
    try:
        import dbos  # noqa: F401
    except ImportError as exc:
        return {"skipped": f"dbos is not installed ({exc}); pip install -e '.[bench]'"}
    code = _DBOS_SCRIPT
    env = {
        **os.environ,
        "RATE_SPEC": json.dumps(
            {
                "db": str(folder / "dbos.sqlite"),
                "keys": a.keys,
                "per_key": a.per_key,
                "rate": a.rate,
                "log": str(folder / "dbos.log"),
                "concurrency": a.nodes * a.processes,
            }
        ),
    }
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900, check=False
    )
    if proc.returncode != 0:
        return {"skipped": f"DBOS did not run here: {proc.stderr.strip().splitlines()[-1:]}"}
    limit = RateLimit(dimension="chat", count=int(a.rate), per_s=1.0, burst=a.burst)
    out = judge(read_sends(folder / "dbos.log"), limit)
    out["processes"] = 1
    return out


_DBOS_SCRIPT = r"""
import json, os, time
from dbos import DBOS, DBOSConfig, SetEnqueueOptions
spec = json.loads(os.environ["RATE_SPEC"])
config: DBOSConfig = {"name": "ratebench", "system_database_url": "sqlite:///" + spec["db"]}
DBOS(config=config)
fd = os.open(spec["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

@DBOS.workflow()
def send(key: str) -> None:
    os.write(fd, (json.dumps([key, time.clock_gettime(time.CLOCK_MONOTONIC)]) + "\n").encode())

DBOS.launch()
queue = DBOS.register_queue("outbox", partition_limiter={"limit": int(spec["rate"]), "period": 1.0},
                            worker_concurrency=spec["concurrency"], polling_interval_sec=0.05)
handles = []
for i in range(spec["per_key"]):
    for k in range(spec["keys"]):
        with SetEnqueueOptions(queue_partition_key=f"chat-{k}"):
            handles.append(queue.enqueue(send, f"chat-{k}"))
for h in handles:
    h.get_result()
DBOS.destroy()
"""


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.worker is not None:
        asyncio.run(worker(json.loads(a.worker)))
        return 0
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="asynccoord-rates-") as tmp:
        folder = Path(tmp)
        plain = mode_drain(folder, a, limited=False)
        costly = mode_drain(folder, a, limited=True)
        limited = mode_limited(folder, a, "asynccoord")
        try:
            import pyrate_limiter  # noqa: F401
        except ImportError as exc:
            pyrate: dict[str, Any] = {"skipped": f"pyrate-limiter is not installed ({exc}); pip install -e '.[bench]'"}
        else:
            pyrate = mode_limited(folder, a, "pyrate_sqlite")
        dbos = mode_dbos(folder, a)
        postgres: dict[str, Any] = {"skipped": "no --dsn given"}
        if a.dsn:
            pg_plain = mode_drain(folder, a, limited=False, dsn=a.dsn)
            pg_costly = mode_drain(folder, a, limited=True, dsn=a.dsn)
            postgres = {**mode_limited(folder, a, "asynccoord", dsn=a.dsn), "claim_cost": _cost(pg_plain, pg_costly)}
    result = {
        "config": {
            "processes": a.processes,
            "nodes": a.nodes,
            "keys": a.keys,
            "per_key": a.per_key,
            "limit": str(RateLimit(dimension="chat", count=int(a.rate), per_s=1.0, burst=a.burst)),
            "drain_tasks": plain["tasks"],
            "load_average": [round(x, 2) for x in load],
        },
        "asynccoord": limited,
        "claim_cost": _cost(plain, costly),
        "pyrate_sqlite": pyrate,
        "dbos_sqlite": dbos,
        "postgres": postgres,
    }
    if a.json:
        print(json.dumps(result, indent=2))
    else:
        _table(result)
    return 0


def _cost(plain: dict[str, Any], costly: dict[str, Any]) -> dict[str, Any]:
    """The claim cost of limits: the two no-op drains' rates and their ratio."""
    return {
        "no_limits_tasks_per_s": plain["tasks_per_s"],
        "limits_tasks_per_s": costly["tasks_per_s"],
        "ratio": round(plain["tasks_per_s"] / costly["tasks_per_s"], 2)
        if plain["tasks_per_s"] and costly["tasks_per_s"]
        else None,
    }


def _table(r: dict[str, Any]) -> None:
    c = r["config"]
    print(
        f"{c['processes']} processes x {c['nodes']} nodes, {c['keys']} keys x {c['per_key']} tasks, limit {c['limit']}"
    )
    print(f"load average at start: {c['load_average']}")
    print(f"{'':24} {'max window / bound':>18} {'utilisation':>12} {'min':>6} {'drain s':>8}")
    for name in ("asynccoord", "pyrate_sqlite", "dbos_sqlite", "postgres"):
        row = r[name]
        if "skipped" in row:
            print(f"{name:24} {row['skipped']}")
            continue
        print(
            f"{name:24} {row['max_window_ratio']:>18} {row['utilisation']:>12} {row['utilisation_min']:>6} "
            f"{row['drain_s']:>8}"
        )
    for name, cost in (("sqlite", r["claim_cost"]), ("postgres", r["postgres"].get("claim_cost"))):
        if cost is not None:
            print(
                f"claim throughput, {name}: {cost['no_limits_tasks_per_s']} tasks/s without limits, "
                f"{cost['limits_tasks_per_s']} with limits that never bind (ratio {cost['ratio']})"
            )


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
