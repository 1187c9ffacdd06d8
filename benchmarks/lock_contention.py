"""Lock throughput under contention, beside the raw commit rate of the same store, and watchdog renewal cost.

Every figure is measured in the same run on the same database file (or server), so the
ratios hold even on a noisy machine:

* ``raw_commits_per_s``: the store's own limit, measured beside it (``baseline`` says
  which). SQLite: plain ``sqlite3``, one single-row UPDATE per committed transaction
  (``BEGIN IMMEDIATE; UPDATE; COMMIT``) on the benchmark's file. PostgreSQL (``--store
  postgresql://...``): one asyncpg connection's single-row UPDATE commits (autocommit).
  Redis (``--store redis://...``): one connection's ``INCR`` round trips.
* ``uncontended``: one asyncio task taking and releasing one lock
  (``async with Lock(store, name, ttl_s=30)``) as fast as it can.
* ``contended``: N nodes (asyncio tasks sharing one store) each taking a
  random one of M names, releasing at once, for N in {16, 64} and M in {1, 8, 64}.
* ``renewal``: 10,000 held locks guarded by one watchdog (TTL 3 s, renewed every
  1 s; ``--renew-interval-s`` sets the interval, the TTL is three of them): renewal
  rounds (one ``UPDATE`` statement, or one Redis round trip, each), write transactions
  and the duration of one round, per interval.

``pairs_per_s`` counts acquire+release pairs; ``vs_raw_commit`` is that rate over
``raw_commits_per_s``; ``tx_per_pair`` is write transactions per pair (the group
committer shares transactions between concurrent callers; SQLite only, None with
``--store``); ``acquire_p50_ms`` and
``acquire_p99_ms`` are the waits for the lock.

Usage::

    python benchmarks/lock_contention.py            # a table (about 30 s)
    python benchmarks/lock_contention.py --json     # one JSON object
    python benchmarks/lock_contention.py --seconds 1 --locks 2000
    python benchmarks/lock_contention.py --store postgresql://postgres@127.0.0.1:5432/test
    python benchmarks/lock_contention.py --store redis://127.0.0.1:6379/0

With ``--store`` the locks live in a schema of their own (``--pg-schema``, dropped before
and after) or under a key prefix of their own (new for each run, its keys deleted after).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import json
import os
import platform
import random
import secrets
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from _common import run
from postgres_drain import bench_schema

from asynccoord import Lease, Lock, SQLiteStore, Watchdog

PG_SCHEMA = "bench_locks"

T = TypeVar("T")


def uvloop_version() -> str | None:
    try:
        return importlib.metadata.version("uvloop")
    except importlib.metadata.PackageNotFoundError:
        return None


def raw_commits_per_s(path: str, seconds: float) -> float:
    """Single-row UPDATE commits per second with plain sqlite3 on ``path`` (WAL, synchronous=NORMAL)."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = NORMAL")
    db.execute("CREATE TABLE IF NOT EXISTS bench_raw (id INTEGER PRIMARY KEY, v INTEGER NOT NULL)")
    db.execute("INSERT OR IGNORE INTO bench_raw (id, v) VALUES (1, 0)")
    n = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(100):
            db.execute("BEGIN IMMEDIATE")
            db.execute("UPDATE bench_raw SET v = v + 1 WHERE id = 1")
            db.execute("COMMIT")
        n += 100
    elapsed = time.perf_counter() - start
    db.close()
    return n / elapsed


def percentile_ms(samples: Sequence[float], q: float) -> float:
    if not samples:
        return 0.0
    ordered = sorted(samples)
    return 1000.0 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def redis_raw_commits_per_s(client: Any, key: str, seconds: float) -> float:
    """``INCR`` round trips per second on one connection (each a write the server applies)."""
    n = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        await client.incr(key)
        n += 1
    return n / (time.perf_counter() - start)


@contextlib.asynccontextmanager
async def open_target(args: argparse.Namespace, path: str) -> AsyncIterator[tuple[Any, dict[str, Any], Any]]:
    """The store to measure, what it is (for ``machine``), and its baseline's coroutine factory.

    Yields ``(store, about, baseline)``; ``baseline(seconds)`` returns the raw rate. The
    PostgreSQL schema is dropped before and after, the Redis key prefix deleted after.
    """
    target: str | None = args.store
    if target is None:
        async with SQLiteStore(path) as store:

            async def sqlite_baseline(seconds: float) -> float:
                return raw_commits_per_s(path, seconds)

            about = {"store": "sqlite", "sqlite": sqlite3.sqlite_version, "baseline": "sqlite3 commits"}
            yield store, about, sqlite_baseline
        return
    if target.startswith(("postgresql://", "postgres://")):
        from postgres_drain import admin, pg_raw_commits_per_s, server_version

        from asynccoord.backends.postgres.store import PostgresStore

        schema = args.pg_schema
        await admin(target, f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        version = await server_version(target)
        try:
            async with PostgresStore(target, schema=schema) as pg_store:

                def pg_baseline(seconds: float) -> Awaitable[float]:
                    return pg_raw_commits_per_s(target, schema, seconds)

                about = {"store": "postgres", "postgres": version, "baseline": "asyncpg single-row UPDATE commits"}
                yield pg_store, about, pg_baseline
        finally:
            await admin(target, f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        return
    if target.startswith(("redis://", "rediss://", "unix://")):
        import redis.asyncio as aioredis

        from asynccoord.backends.redis import RedisLockStore

        prefix = f"asynccoord-bench:{secrets.token_hex(6)}:"
        client = aioredis.Redis.from_url(target)
        try:
            version = str((await client.info("server"))["redis_version"])
            async with RedisLockStore(target, prefix=prefix) as redis_store:

                def redis_baseline(seconds: float) -> Awaitable[float]:
                    return redis_raw_commits_per_s(client, prefix + "raw", seconds)

                about = {"store": "redis", "redis": version, "baseline": "INCR round trips", "key_prefix": prefix}
                yield redis_store, about, redis_baseline
        finally:
            keys = [key async for key in client.scan_iter(match=prefix + "*", count=1000)]
            for first in range(0, len(keys), 1000):  # one UNLINK per 1,000 keys, not one per key
                await client.unlink(*keys[first : first + 1000])
            await client.aclose()
        return
    raise SystemExit(f"--store must be postgresql://... or redis://..., got {target.split('://')[0]!r}://...")


def transactions(store: Any) -> int | None:
    """The store's write transactions so far; None but on SQLite, whose writer counts every one
    (PostgreSQL's lock operations are single statements its count leaves out; Redis has none)."""
    return store.transactions if isinstance(store, SQLiteStore) else None


async def pairs(store: Any, *, nodes: int, names: int, seconds: float, prefix: str) -> dict[str, Any]:
    """``nodes`` tasks each taking a random one of ``names`` locks and releasing it, for ``seconds``."""
    lock_names = [f"{prefix}:{i}" for i in range(names)]
    waits: list[float] = []
    done = 0
    tx_before = transactions(store)
    stop_at = time.monotonic() + seconds

    async def node(index: int) -> None:
        nonlocal done
        rng = random.Random(index)
        while time.monotonic() < stop_at:
            asked = time.monotonic()
            async with Lock(store, rng.choice(lock_names), ttl_s=30.0):
                waits.append(time.monotonic() - asked)
                done += 1

    started = time.monotonic()
    await asyncio.gather(*(node(i) for i in range(nodes)))
    elapsed = time.monotonic() - started
    tx_after = transactions(store)
    return {
        "nodes": nodes,
        "names": names,
        "pairs": done,
        "pairs_per_s": done / elapsed,
        "tx_per_pair": None if tx_after is None or tx_before is None else (tx_after - tx_before) / max(done, 1),
        "acquire_p50_ms": percentile_ms(waits, 0.50),
        "acquire_p99_ms": percentile_ms(waits, 0.99),
    }


async def renewal(store: Any, *, locks: int, ttl_s: float, interval_s: float, rounds: int) -> dict[str, Any]:
    """Hold ``locks`` leases under one watchdog; measure ``rounds`` renewal rounds once they are steady."""
    log: list[tuple[float, int, int | None, float]] = []  # (start, leases, transactions after, duration) per round
    round_done = asyncio.Event()
    inner = store.renew_locks

    async def logged_renew(leases: Sequence[Lease]) -> list[Lease | None]:
        started = time.monotonic()
        try:
            return await inner(leases)
        finally:
            log.append((started, len(leases), transactions(store), time.monotonic() - started))
            round_done.set()

    store.renew_locks = logged_renew  # type: ignore[method-assign]
    watchdog = Watchdog(store)
    try:
        started = time.perf_counter()
        for first in range(0, locks, 1000):  # guarded chunk by chunk, each from the instant it was asked for
            sent_at = time.monotonic()
            names = [f"held:{i}" for i in range(first, min(locks, first + 1000))]
            for outcome in await asyncio.gather(*(store.try_acquire_lock(name, ttl_s=ttl_s) for name in names)):
                assert isinstance(outcome, Lease), outcome
                watchdog.guard(outcome, sent_at=sent_at, renew_interval_s=interval_s)
        acquire_s = time.perf_counter() - started
        first_steady = len(log) + 2  # chunks acquired at different times share their rounds after two more
        while len(log) < first_steady + rounds + 1:
            round_done.clear()
            await round_done.wait()
        steady = log[first_steady : first_steady + rounds + 1]
        stats = watchdog.statistics()
        live = len(await store.list_locks())
    finally:
        await watchdog.aclose()
        store.renew_locks = inner  # type: ignore[method-assign]
    seconds = steady[-1][0] - steady[0][0]
    tx_first, tx_last = steady[0][2], steady[-1][2]
    return {
        "locks": locks,
        "ttl_s": ttl_s,
        "interval_s": interval_s,
        "acquire_all_s": acquire_s,
        "leases_per_statement": statistics.mean(size for _, size, _, _ in steady[1:]),
        "statements_per_interval": rounds / (seconds / interval_s),
        "transactions_per_interval": None
        if tx_first is None or tx_last is None
        else (tx_last - tx_first) / (seconds / interval_s),
        "round_ms_median": 1000.0 * statistics.median(duration for _, _, _, duration in steady),
        "lost": stats.lost,
        "still_held": live,
    }


async def bench(args: argparse.Namespace, path: str) -> dict[str, Any]:
    results: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "uvloop": uvloop_version(),
            "platform": platform.platform(),
        },
        "seconds_per_case": args.seconds,
    }
    async with open_target(args, path) as (store, about, baseline):
        results["machine"].update(about)
        results["raw_commits_per_s"] = raw = await baseline(args.seconds)
        uncontended = await pairs(store, nodes=1, names=1, seconds=args.seconds, prefix="u")
        uncontended["vs_raw_commit"] = uncontended["pairs_per_s"] / raw
        results["uncontended"] = uncontended
        contended = []
        for nodes in args.nodes:
            for names in args.names:
                case = await pairs(store, nodes=nodes, names=names, seconds=args.seconds, prefix=f"c{nodes}-{names}")
                case["vs_raw_commit"] = case["pairs_per_s"] / raw
                contended.append(case)
        results["contended"] = contended
        every_s = args.renew_interval_s
        results["renewal"] = await renewal(store, locks=args.locks, ttl_s=3 * every_s, interval_s=every_s, rounds=3)
        results["lock_events"] = dict(store.events.snapshot())
    return results


def print_table(r: dict[str, Any]) -> None:
    m = r["machine"]
    engine = {"sqlite": "SQLite", "postgres": "PostgreSQL", "redis": "Redis"}[m["store"]]
    print(f"machine: {m['cpus']} cpus, Python {m['python']}, {engine} {m[m['store']]}, uvloop {m['uvloop']}")
    print(f"raw {m['baseline']}/s: {r['raw_commits_per_s']:,.0f}")
    print()
    print(f"{'nodes':>5} {'names':>5} {'pairs/s':>9} {'vs raw':>7} {'tx/pair':>8} {'p50 ms':>8} {'p99 ms':>8}")
    for case in [r["uncontended"], *r["contended"]]:
        print(
            f"{case['nodes']:>5} {case['names']:>5} {case['pairs_per_s']:>9,.0f} {case['vs_raw_commit']:>7.2f}"
            f" {'-' if case['tx_per_pair'] is None else format(case['tx_per_pair'], '.2f'):>8}"
            f" {case['acquire_p50_ms']:>8.2f} {case['acquire_p99_ms']:>8.2f}"
        )
    w = r["renewal"]
    print()
    print(
        f"renewal of {w['locks']:,} held locks (ttl {w['ttl_s']:g} s, every {w['interval_s']:g} s): "
        f"{w['statements_per_interval']:.2f} {'round trips' if m['store'] == 'redis' else 'statements'}"
        f" ({w['leases_per_statement']:,.0f} leases each) and "
        f"{'-' if w['transactions_per_interval'] is None else format(w['transactions_per_interval'], '.2f')}"
        f" transactions per interval, {w['round_ms_median']:.1f} ms per round; "
        f"acquiring all took {w['acquire_all_s']:.2f} s; "
        f"lost {w['lost']}, still held {w['still_held']:,}"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="duration of each case, seconds (default 2)")
    parser.add_argument("--nodes", type=int, nargs="+", default=[16, 64], help="contending tasks (default 16 64)")
    parser.add_argument("--names", type=int, nargs="+", default=[1, 8, 64], help="lock names (default 1 8 64)")
    parser.add_argument("--locks", type=int, default=10_000, help="held locks in the renewal case (default 10000)")
    parser.add_argument("--dir", help="folder for the database file (default: a temporary folder, removed)")
    parser.add_argument(
        "--store",
        metavar="TARGET",
        help="postgresql://... or redis://... to measure that store's locks (default: an SQLite file)",
    )
    parser.add_argument(
        "--pg-schema",
        default=PG_SCHEMA,
        type=bench_schema,
        help=f"with a postgresql:// --store: the schema, dropped (default {PG_SCHEMA})",
    )
    parser.add_argument(
        "--renew-interval-s",
        type=float,
        default=1.0,
        help="renewal case: the watchdog's interval, seconds; the TTL is 3 of them (default 1)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args(argv)
    if not args.renew_interval_s > 0:
        parser.error(f"--renew-interval-s must be > 0, got {args.renew_interval_s}")
    folder = Path(args.dir or tempfile.mkdtemp(prefix="asynccoord-locks-"))
    try:
        results = run(lambda: bench(args, str(folder / "locks.db")))
    finally:
        if not args.dir:
            shutil.rmtree(folder, ignore_errors=True)
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        print()
    else:
        print_table(results)


if __name__ == "__main__":
    main()
