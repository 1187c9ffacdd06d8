"""The contention benchmark: what each layer buys, for nodes x processes x strategies.

Every cell drains the same workload (``--tasks`` tasks over Zipf-skewed conversations and
sending accounts, a ``--send-ms`` send) from a clean slate (a fresh SQLite file, or a fresh
PostgreSQL schema with ``--store postgresql://...``) and reports committed tasks/s, p50/p99
enqueue-to-commit latency (store clock), duplicate sends, conflict counts, and the nodes'
``store.claim`` calls (``claim_calls``) and those that came back empty (``empty_claims``,
every claim being a write), and the runtime's idle-poll reads (``idle_polls``,
``store.claimable_partitions`` calls), each from the clock's start to the drain's end. Strategies:

* ``all``: partitioning + per-account locks + version checks (the default runtime; work
  stealing off);
* ``partitioning``, ``locks``, ``versions``: one layer alone;
* ``unordered``: what procrastinate does, the like-for-like cell beside it: leases and
  compare-and-set commits (``versions``), but no per-conversation order, no account lock and
  no partitioning (any node takes any task);
* ``none``: no layer: claims read and then write without a compare-and-set, as a naive
  queue does, so concurrent nodes send the same task twice;
* ``lock-table``: the naive lock-table design: read pending tasks, claim one by inserting
  a lock row, then re-read it in a write transaction; one transaction per step (on
  PostgreSQL the nodes of a process share a pool of at most 16 connections);
* ``all+slow``: ``all`` with one slow node per process (node 0, as on a constrained host:
  one send at a time, each taking ``--slow-send-ms``): its partitions wait for it;
* ``all+stealing``: ``all+slow`` with work stealing on (``NodeConfig.work_stealing``): a
  node whose own partitions have nothing claimable takes tasks of any partition that have
  been due for ``--steal-after-s``; the ``stolen`` column counts sends of tasks whose
  partition the sending node did not own.

Repeat r runs every node count on one layout of the conversations (their names, and so
how the hash splits the load between the processes), drawn from ``--seed`` and r so that it
splits the load alike at every node count (see :func:`choose_layout`; ``--unmatched-layouts``,
``--same-layout``). Each row carries the in-run baseline: the raw single-row commit rate on the same database
(plain ``sqlite3``, or one asyncpg connection in autocommit). With ``--store
postgresql://...`` the same run also drains the same tasks (same count, same send time) with
procrastinate on the same server, per layout (processes x workers, ``concurrency`` = nodes
per process), through ``postgres_drain.procrastinate_run``, and prints each row's ratio to
it. ``--report DIR`` writes ``contention.json``, ``contention.md`` and, when matplotlib is
installed (``pip install 'asynccoord[bench]'``), ``contention.png`` (throughput against
node count per strategy).

Usage::

    python benchmarks/contention.py                       # the full matrix on SQLite, a table
    python benchmarks/contention.py --json                # one JSON object
    python benchmarks/contention.py --report benchmarks/results
    python benchmarks/contention.py --nodes 16 64 --processes 1 --strategies all none
    python benchmarks/contention.py --store postgresql://postgres@127.0.0.1:5432/test
    python benchmarks/contention.py --nodes 16 --processes 1 --strategies all+slow all+stealing
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import itertools
import json
import math
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiosqlite
import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import run
from postgres_drain import bench_schema
from queue_throughput import raw_commits_per_s

from asynccoord import NewTask, SQLiteStore
from asynccoord.backends.open import is_postgres_target, redact_target
from asynccoord.config import DEFAULT_PARTITIONS
from asynccoord.node import Node, NodeConfig, NodeStatus, Runtime, current_delivery
from asynccoord.node.ablation import Ablation
from asynccoord.partition import assign, partition_of

QUEUE = "bench"
STRATEGIES = (
    "all",
    "partitioning",
    "locks",
    "versions",
    "unordered",
    "none",
    "lock-table",
    "all+slow",
    "all+stealing",
)
SLOW_NODE = ("all+slow", "all+stealing")
PG_SCHEMA = "bench_contention"  # the default of --pg-schema
PG_LOCK_TABLE_CONNECTIONS = 16
READY = "asynccoord-contention-ready"
SPLIT_TOLERANCE = 0.01
"""Matched layouts (see :func:`choose_layout`): most difference between two node counts' shares of one process."""
LAYOUT_DRAWS = 5000
"""Matched layouts: most layouts drawn for one repeat before the closest is taken."""
HEARTBEAT_TTL_S = 3.0  # the runtimes' heartbeat TTL (a heartbeat every second)
FAILED_CHECK_POLLS = 10  # the PostgreSQL drain probe looks for failed nodes every 10th poll (0.2 s)


Barrier = Callable[[], Awaitable[float | None]]
"""Awaited by a drain once set up: returns when the tasks are enqueued, with the time (``time.time()``)
the enqueue committed when another process did it (None: now)."""


async def no_barrier() -> float | None:
    """The start of a one-process cell: nothing to wait for."""
    return None


async def stdin_barrier() -> float | None:
    """A worker process's start line: say it is ready, then wait for the parent's ``go <time>``.

    Every process of a cell is set up (store open, runtime started, every node of the cell
    in its membership view) before the parent enqueues the tasks, as ``postgres_drain.py``
    starts procrastinate's and asynccoord's workers: without it the first process to finish
    importing drains alone for a while. The clock starts at the parent's enqueue commit.
    """
    print(READY, flush=True)
    line = await asyncio.to_thread(sys.stdin.readline)
    word, _, when = line.strip().partition(" ")
    if word != "go":
        raise SystemExit(f"worker: expected 'go <time>' on stdin, got {line!r}")
    return float(when)


def zipf_choices(rng: random.Random, n: int, k: int, s: float = 1.1) -> list[int]:
    """``k`` draws from ranks 0..n-1 with Zipf(s) weights."""
    weights = [1.0 / (rank + 1) ** s for rank in range(n)]
    return rng.choices(range(n), weights=weights, k=k)


def node_ids(process: int, nodes: int) -> list[str]:
    """The fixed node ids of process ``process``'s runtime in a cell of ``nodes`` nodes per process."""
    return [f"p{process}-n{i}" for i in range(nodes)]


@functools.cache
def partition_processes(processes: int, nodes: int, partitions: int = DEFAULT_PARTITIONS) -> tuple[int, ...]:
    """For each partition, the process whose node owns it once every node of the cell is live
    (:func:`~asynccoord.partition.assign`, rendezvous hashing over :func:`node_ids`)."""
    ids = [n for p in range(processes) for n in node_ids(p, nodes)]
    process_of = [0] * partitions
    for node, owned in assign(partitions, ids).items():
        for partition in owned:
            process_of[partition] = ids.index(node) // nodes
    return tuple(process_of)


def process_split(
    tasks_per_key: Counter[str], processes: int, nodes: int, partitions: int = DEFAULT_PARTITIONS
) -> list[float]:
    """Each process's share of the tasks (``tasks_per_key``: partition key -> tasks), once every
    node of the cell is live and nothing is stolen: known before the drain. One share per
    process, rounded to 4 places (they sum to 1 up to the rounding)."""
    process_of = partition_processes(processes, nodes, partitions)
    counts = [0] * processes
    for key, count in tasks_per_key.items():
        counts[process_of[partition_of(key, partitions)]] += count
    total = sum(counts)
    return [round(c / total, 4) for c in counts]


def layout_splits(args: argparse.Namespace, layout: int, processes: int) -> dict[int, list[float]]:
    """:func:`process_split` of layout ``layout`` (see :func:`workload`) at each node count of ``args.nodes``."""
    keys = Counter(t.partition_key for t in workload(args.tasks, args.conversations, args.accounts, args.seed, layout))
    return {n: process_split(keys, processes, n) for n in args.nodes}


def choose_layout(args: argparse.Namespace, run_index: int, *, matched: bool) -> tuple[int, float]:
    """The layout of repeat ``run_index`` (conversation names, see :func:`workload`), and the
    largest difference between two node counts' shares of one process (0 with one node count).

    Layouts are drawn from ``args.seed`` and the repeat, so each seed brings its own, and one
    repeat's cells share its layout, for every node count and process count. A layout hashes
    the hot conversations to some processes, and the more of the load one process owns, the
    less often the hot account's lock moves between them: fewer hand-overs, a faster drain (a
    10-point larger share drained about 3 % faster in our runs). One layout splits the load
    differently at each node count (other node ids), so a ratio between node counts on one
    layout also compares two splits. Over many layouts the splits are alike at every node
    count (each partition's process is a fair draw), so this is noise, not bias, as long as the
    layouts change from run to run; ``matched`` removes it from each pair instead (blocking on
    a covariate known before the drain): draw until a layout splits the load alike at every
    node count with ``max(args.processes)`` processes (each process's share within
    ``SPLIT_TOLERANCE``); the closest of ``LAYOUT_DRAWS`` draws otherwise (likelier with three
    node counts or more). Unmatched, the first draw is it.
    """
    rng = random.Random(f"layout:{args.seed}:{run_index}")
    processes = max(args.processes)
    per_rank = Counter(workload_draws(args.tasks, args.conversations, args.accounts, args.seed)[0])
    best: tuple[float, int] | None = None
    for _ in range(LAYOUT_DRAWS if matched else 1):
        layout = rng.randrange(1, 2**31)
        renamed = Counter({conversation_key(rank, layout): n for rank, n in per_rank.items()})
        low, high = [1.0] * processes, [0.0] * processes
        for nodes in args.nodes:  # stop at the first node count off by more than the best so far
            shares = process_split(renamed, processes, nodes)
            low = [min(a, b) for a, b in zip(low, shares, strict=True)]
            high = [max(a, b) for a, b in zip(high, shares, strict=True)]
            spread = max(h - lo for lo, h in zip(low, high, strict=True))
            if best is not None and spread >= best[0]:
                break
        spread = round(spread, 4)  # shares are rounded to 4 places: 0.465 - 0.455 is 0.01, not 0.010000000000000009
        if best is None or spread < best[0]:
            best = (spread, layout)
        if best[0] <= SPLIT_TOLERANCE:
            break
    assert best is not None  # the loop draws at least once
    return best[1], best[0]


def workload_draws(tasks: int, conversations: int, accounts: int, seed: int) -> tuple[list[int], list[int]]:
    """Each task's conversation rank and account rank (Zipf), drawn from ``seed`` (see :func:`workload`)."""
    rng = random.Random(seed)
    return zipf_choices(rng, conversations, tasks), zipf_choices(rng, accounts, tasks)


def conversation_key(rank: int, layout: int) -> str:
    """The partition key of the conversation of Zipf rank ``rank`` in layout ``layout`` (see :func:`workload`)."""
    return f"c{rank}" if layout == 0 else f"l{layout}-c{rank}"


def workload(tasks: int, conversations: int, accounts: int, seed: int, layout: int = 0) -> list[NewTask]:
    """The cell's tasks: Zipf-skewed conversations (partition keys) and accounts, drawn from ``seed``.

    ``layout`` renames the conversations (``c<i>`` for 0, ``l<layout>-c<i>`` otherwise): the
    same load, its conversations hashed to other partitions, so another split of the hot
    ones between the processes (see ``--same-layout``).
    """
    convs, accts = workload_draws(tasks, conversations, accounts, seed)
    return [
        NewTask(
            queue=QUEUE,
            payload={"n": i, "account": accts[i]},
            partition_key=conversation_key(convs[i], layout),
            idempotency_key=f"m{i}",
        )
        for i in range(tasks)
    ]


LAYERS = {  # the runtime strategies: partitioning, locks, version checks, per-conversation order
    "all": (True, True, True, True),
    "partitioning": (True, False, True, True),
    "locks": (False, True, True, True),
    "versions": (False, False, True, True),
    "unordered": (False, False, True, False),
    "none": (False, False, False, False),
    "all+slow": (True, True, True, True),
    "all+stealing": (True, True, True, True),
}
LOCKED = frozenset(s for s, (_, locks, _, _) in LAYERS.items() if locks)  # whose sends take an account lock


def config_for(strategy: str, steal_after_s: float) -> NodeConfig:
    ordered = LAYERS[strategy][3]
    return NodeConfig(
        queue=QUEUE,
        lease_s=5.0,
        lock_ttl_s=5.0,
        claim_batch=16,
        max_in_flight=16,
        ordered=ordered,
        idle_min_s=0.01,
        idle_max_s=0.5,
        work_stealing=strategy == "all+stealing",
        steal_after_s=steal_after_s,
    )


def ablation_for(strategy: str) -> Ablation:
    """The layers ``strategy`` runs (the others switched off, see ``asynccoord.node.ablation``)."""
    partitioning, locks, versions, _ = LAYERS[strategy]
    return Ablation(partitioning=partitioning, locks=locks, version_checks=versions)


# --- the two databases ----------------------------------------------------------------


class SQLiteDb:
    """Cells on fresh SQLite files in one temporary folder."""

    kind = "sqlite"

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def target(self, cell: str) -> str:
        return os.path.join(self.folder, f"{cell}.db")

    def open(self, target: str) -> Any:
        return SQLiteStore(target)

    async def reset(self, target: str) -> None:
        self.remove(target)

    def remove(self, target: str) -> None:
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(target + suffix)

    async def prepare_lock_table(self, target: str) -> None:
        db = sqlite3.connect(target, isolation_level=None)
        try:
            db.execute("CREATE TABLE IF NOT EXISTS naive_locks (task_id INTEGER PRIMARY KEY, owner TEXT NOT NULL)")
        finally:
            db.close()

    async def raw_commits_per_s(self, target: str, seconds: float) -> float:
        return raw_commits_per_s(target, seconds)

    async def created_updated(self, target: str) -> list[tuple[float, float]]:
        db = sqlite3.connect(f"file:{target}?mode=ro", uri=True)
        try:
            return list(db.execute("SELECT created_at, updated_at FROM coord_tasks WHERE status = 'done'"))
        finally:
            db.close()

    async def lock_table(
        self, target: str, nodes: int, send_ms: float, max_s: float, barrier: Barrier
    ) -> dict[str, Any]:
        return await drain_lock_table_sqlite(target, nodes, send_ms, max_s, barrier)

    @contextlib.asynccontextmanager
    async def drain_probe(self, runtime: Runtime, target: str) -> AsyncIterator[Callable[[float], Awaitable[bool]]]:
        """``wait(max_s)``: poll the runtime's store (``is_drained``) every 20 ms until the queue is drained."""

        async def wait(max_s: float) -> bool:
            return await runtime.wait_until_drained(timeout_s=max_s, poll_s=0.02)

        yield wait

    def describe(self) -> dict[str, Any]:
        return {"store": "sqlite", "sqlite": sqlite3.sqlite_version}


class PostgresDb:
    """Cells on one PostgreSQL database, each in the schema ``bench_contention`` dropped and made anew."""

    kind = "postgres"

    def __init__(self, dsn: str, schema: str = PG_SCHEMA) -> None:
        self.dsn = dsn
        self.schema = schema

    def target(self, cell: str) -> str:
        return self.dsn

    def open(self, target: str) -> Any:
        from asynccoord.backends.postgres.store import PostgresStore

        return PostgresStore(target, schema=self.schema)

    async def _connect(self) -> Any:
        from postgres_drain import connect

        return await connect(self.dsn)

    async def reset(self, target: str) -> None:
        conn = await self._connect()
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
        finally:
            await conn.close()

    def remove(self, target: str) -> None:
        run(lambda: self.reset(target))

    async def prepare_lock_table(self, target: str) -> None:
        conn = await self._connect()
        try:
            await conn.execute(
                f'CREATE TABLE "{self.schema}".naive_locks (task_id bigint PRIMARY KEY, owner text NOT NULL)'
            )
        finally:
            await conn.close()

    async def raw_commits_per_s(self, target: str, seconds: float) -> float:
        """Single-row UPDATE commits per second, one asyncpg connection in autocommit."""
        from postgres_drain import pg_raw_commits_per_s

        return await pg_raw_commits_per_s(self.dsn, self.schema, seconds)

    async def created_updated(self, target: str) -> list[tuple[float, float]]:
        conn = await self._connect()
        try:
            rows = await conn.fetch(
                f"SELECT created_at, updated_at FROM \"{self.schema}\".coord_tasks WHERE status = 'done'"
            )
            return [(float(r[0]), float(r[1])) for r in rows]
        finally:
            await conn.close()

    async def lock_table(
        self, target: str, nodes: int, send_ms: float, max_s: float, barrier: Barrier
    ) -> dict[str, Any]:
        return await drain_lock_table_pg(target, self.schema, nodes, send_ms, max_s, barrier)

    @contextlib.asynccontextmanager
    async def drain_probe(self, runtime: Runtime, target: str) -> AsyncIterator[Callable[[float], Awaitable[bool]]]:
        """``wait(max_s)``: poll ``is_drained`` every 20 ms on a one-connection store of its own.

        Not the nodes' pool, and opened before the drain starts. Two partial-index probes a
        poll, not ``stats()``'s counts over the whole table (procrastinate's drain pays no
        such cost). A node that failed ends the wait within 0.2 s with the runtime's
        failure (``shutdown()`` raises it), as ``wait_until_drained`` does, instead of after
        ``max_s``: the nodes are looked at every ``FAILED_CHECK_POLLS``-th poll, since
        ``runtime.states()`` builds a record per node (at every poll, 0.7 % of a 64-node
        drain's CPU in a py-spy profile, a cost the 16-node cells paid a quarter of).
        """
        from asynccoord.backends.postgres.store import PostgresStore

        async with PostgresStore(target, schema=self.schema, listen=False, pool_min_size=1, pool_max_size=1) as probe:

            async def wait(max_s: float) -> bool:
                with anyio.move_on_after(max_s):
                    for polls in itertools.count(1):
                        if await probe.is_drained(QUEUE):
                            return True
                        if polls % FAILED_CHECK_POLLS == 0 and any(
                            state.status is NodeStatus.FAILED for state in runtime.states()
                        ):
                            await runtime.shutdown()  # raises the failure: nothing drains the queue any more
                            return False
                        await asyncio.sleep(0.02)
                return False

            yield wait

    def describe(self) -> dict[str, Any]:
        async def version() -> str:
            conn = await self._connect()
            try:
                return str(await conn.fetchval("SHOW server_version"))
            finally:
                await conn.close()

        return {"store": "postgres", "dsn": redact_target(self.dsn), "postgres": run(version)}


def database_for(store: str | None, folder: str, pg_schema: str = PG_SCHEMA) -> SQLiteDb | PostgresDb:
    if store is None:
        return SQLiteDb(folder)
    if not is_postgres_target(store):
        raise SystemExit(
            f"--store takes a PostgreSQL DSN (postgresql://...), got {redact_target(store)!r}; omit it for SQLite"
        )
    return PostgresDb(store, pg_schema)


# --- drains ---------------------------------------------------------------------------


async def create(db: SQLiteDb | PostgresDb, target: str) -> None:
    """Make the store's tables (an empty queue)."""
    async with db.open(target):
        pass


async def lock_leases(db: SQLiteDb | PostgresDb, target: str, accounts: int) -> list[int]:
    """Per account (``account:<i>``, i from 0), the highest fencing token its lock's commits presented.

    A lock's fencing token grows by one per lease, so this counts the leases its commits
    ran under: hand-overs between processes, and leases taken anew after one went back
    idle. 0 for an account whose lock no commit presented.
    """
    async with db.open(target) as store:
        records = [await store.read_fence(f"account:{i}") for i in range(accounts)]
    return [0 if r is None else r.fencing_token for r in records]


async def fill(db: SQLiteDb | PostgresDb, target: str, specs: list[NewTask]) -> float:
    """Enqueue every task in one transaction; return when it committed (``time.time()``).

    The tasks become claimable at one instant: the drain's start.
    """
    async with db.open(target) as store:
        await store.enqueue_many(specs)
        return time.time()


async def drain_runtime(
    db: SQLiteDb | PostgresDb,
    target: str,
    strategy: str,
    nodes: int,
    args: argparse.Namespace,
    process: int,
    barrier: Barrier,
) -> dict[str, Any]:
    """Drain with a Runtime of ``nodes`` nodes; return the sends made, steals and the timing.

    Node ids are fixed (``p<process>-n<i>``), so the partition assignment, and which
    conversations the slow node owns, is the same in every run.
    """
    sent: list[int] = []
    stolen = 0
    ids = node_ids(process, nodes)
    slow_id = ids[0] if strategy in SLOW_NODE else None
    send_s, slow_s = args.send_ms / 1000.0, args.slow_send_ms / 1000.0
    runtime: Runtime | None = None
    partitioned = strategy not in ("locks", "versions", "unordered", "none")

    async def send(task: Any) -> None:
        nonlocal stolen
        sent.append(task.payload["n"])
        node_id = current_delivery().node_id
        if partitioned and runtime is not None and task.partition not in runtime.membership.owned_partitions(node_id):
            stolen += 1
        await asyncio.sleep(slow_s if node_id == slow_id else send_s)

    def lock_key(task: Any) -> str:
        return f"account:{task.payload['account']}"

    async with db.open(target) as store:
        if store.partitions != DEFAULT_PARTITIONS:  # process_split (the rows' split) assumes it
            raise RuntimeError(f"the store has {store.partitions} partitions, not {DEFAULT_PARTITIONS}")
        claims = count_claims(store)
        runtime = Runtime(
            store,
            send=send,
            node_ids=ids,
            config=config_for(strategy, args.steal_after_s),
            lock_key=lock_key,
            _ablation=ablation_for(strategy),
            heartbeat_ttl_s=HEARTBEAT_TTL_S,
            shutdown_timeout_s=5.0,
        )
        if slow_id is not None:  # a node on a constrained host: one send at a time, each slow
            runtime.nodes[0] = Node(
                store,
                send,
                node_id=slow_id,
                config=dataclasses.replace(runtime.config, max_in_flight=1, claim_batch=1),
                lock_key=lock_key,
                membership=runtime.membership,
                lock_pool=runtime.lock_pool,
                idle_poll=runtime.idle_poller is None,  # woken by the runtime's idle poll like the others
                _ablation=ablation_for(strategy),
            )
        async with db.drain_probe(runtime, target) as wait_drained, runtime:
            # The cell measures a formed cluster: the drain starts once this process's view
            # holds every node of the cell (the other process's show up at a heartbeat).
            cluster = nodes * args.process_count
            view = runtime.membership.view
            with anyio.fail_after(3 * HEARTBEAT_TTL_S):
                while len(view.node_ids) < cluster:
                    view = await runtime.membership.wait_changed(view.version)
            # Count the claims of the drain only: each node claimed once as the runtime
            # started on the empty queue (one empty claim per node; those still at the store
            # are not counted when they return). Reset before the barrier: the enqueue's
            # NOTIFY may wake the nodes before the go does.
            claims.reset()
            enqueued_at = await barrier()  # the tasks are enqueued (by the parent, or here with one process)
            start = time.time() if enqueued_at is None else enqueued_at
            cpu_start = time.process_time()
            # They came from another store object: on SQLite, wake the owners of their keys'
            # partitions, as an in-process enqueue does (a wake-up of every node would make the
            # nodes owning none of them claim for nothing). A PostgreSQL store's listener was
            # woken by the enqueue's NOTIFY already: a second wake-up would make every node
            # that claimed its heads then claim again for nothing (one empty claim per node).
            if not getattr(store, "listen", False):
                keys = {
                    s.partition_key
                    for s in workload(args.tasks, args.conversations, args.accounts, args.seed, args.layout)
                }
                store.notifier.notify(QUEUE, len(runtime.nodes), {partition_of(k, store.partitions) for k in keys})
            drained = await wait_drained(args.max_cell_s)
            end = time.time()
            cpu_s = time.process_time() - cpu_start
        events = dict(store.events.snapshot())
    return {
        "sent": sent,
        "stolen": stolen if partitioned else None,
        "start": start,
        "end": end,
        "drained": drained,
        "events": events,
        "claims": dict(claims),
        "cpu_s": cpu_s,
    }


class ClaimCounts(Counter[str]):
    """``calls``, ``empty`` and ``polls`` of one drain; :meth:`reset` starts them anew.

    A claim is counted when it returns, and only if it started after the last reset: a
    node's claim on the empty queue as its runtime started may still be at the store when
    the counts are reset for the drain.
    """

    generation = 0

    def reset(self) -> None:
        self.clear()
        self.generation += 1


def count_claims(store: Any) -> ClaimCounts:
    """Count the store's claims (``calls``), empty claims (``empty``) and idle-poll reads (``polls``)."""
    counts = ClaimCounts()
    claim = store.claim
    claimable = store.claimable_partitions

    async def counting(*args: Any, **kwargs: Any) -> Any:
        generation = counts.generation
        tasks = await claim(*args, **kwargs)
        if generation == counts.generation:
            counts["calls"] += 1
            counts["empty"] += not tasks
        return tasks

    async def counting_polls(*args: Any, **kwargs: Any) -> Any:
        counts["polls"] += 1
        return await claimable(*args, **kwargs)

    store.claim = counting
    store.claimable_partitions = counting_polls
    return counts


async def until(work: asyncio.Future[Any], max_s: float) -> bool:
    """Await ``work`` for up to ``max_s`` seconds; cancel it then. True when it finished."""
    try:
        await asyncio.wait_for(work, max_s)
    except TimeoutError:
        return False
    return True


async def drain_lock_table_sqlite(
    path: str, nodes: int, send_ms: float, max_s: float, barrier: Barrier
) -> dict[str, Any]:
    """The naive lock-table design, one aiosqlite connection per node (``naive_locks`` made by ``prepare``)."""
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

    enqueued_at = await barrier()
    start = time.time() if enqueued_at is None else enqueued_at
    drained = await until(asyncio.gather(*(node(i) for i in range(nodes))), max_s)
    return {"sent": sent, "stolen": None, "start": start, "end": time.time(), "drained": drained, "events": {}}


class _Taken(Exception):
    """Rolls back a lock-table claim that found the task no longer pending."""


async def drain_lock_table_pg(
    dsn: str, schema: str, nodes: int, send_ms: float, max_s: float, barrier: Barrier
) -> dict[str, Any]:
    """The naive lock-table design on PostgreSQL: the nodes share a pool of up to 16 connections.

    ``naive_locks`` is made by ``prepare`` (a ``CREATE TABLE IF NOT EXISTS`` run by two
    processes at once can fail on PostgreSQL).
    """
    import asyncpg

    from asynccoord.backends.open import split_connect_timeout

    settings = {"search_path": f'"{schema}"'}
    plain, timeout_s = split_connect_timeout(dsn)
    pool = await asyncpg.create_pool(
        plain,
        min_size=1,
        max_size=min(nodes, PG_LOCK_TABLE_CONNECTIONS),
        server_settings=settings,
        timeout=timeout_s,
    )
    assert pool is not None
    sent: list[int] = []

    async def node(index: int) -> None:
        owner = f"n{os.getpid()}-{index}"
        while True:
            async with pool.acquire() as conn:
                rows = await conn.fetch(
                    "SELECT id, payload FROM coord_tasks WHERE queue = $1 AND status = 'pending' ORDER BY id LIMIT 16",
                    QUEUE,
                )
            if not rows:
                return
            for task_id, payload in rows:
                try:
                    async with pool.acquire() as conn, conn.transaction():
                        await conn.execute("INSERT INTO naive_locks (task_id, owner) VALUES ($1, $2)", task_id, owner)
                        status = await conn.fetchval("SELECT status FROM coord_tasks WHERE id = $1", task_id)
                        if status != "pending":
                            raise _Taken
                        await conn.execute(
                            "UPDATE coord_tasks SET status = 'running', active = true WHERE id = $1", task_id
                        )
                except (asyncpg.UniqueViolationError, _Taken):
                    continue
                sent.append(json.loads(payload)["n"])
                await asyncio.sleep(send_ms / 1000.0)
                async with pool.acquire() as conn, conn.transaction():
                    await conn.execute(
                        "UPDATE coord_tasks SET status = 'done', active = false, is_head = false, "
                        "updated_at = extract(epoch FROM clock_timestamp()) WHERE id = $1",
                        task_id,
                    )
                    await conn.execute("DELETE FROM naive_locks WHERE task_id = $1", task_id)

    try:
        enqueued_at = await barrier()
        start = time.time() if enqueued_at is None else enqueued_at
        drained = await until(asyncio.gather(*(node(i) for i in range(nodes))), max_s)
        end = time.time()
    finally:
        pool.terminate()
    return {"sent": sent, "stolen": None, "start": start, "end": end, "drained": drained, "events": {}}


def worker_argv(args: argparse.Namespace, target: str, strategy: str, nodes: int, processes: int) -> list[str]:
    argv = [sys.executable, __file__, "--worker", target, "--strategies", strategy, "--nodes", str(nodes)]
    argv += ["--process-count", str(processes)]
    names = (
        "send_ms",
        "slow_send_ms",
        "steal_after_s",
        "tasks",
        "max_cell_s",
        "conversations",
        "accounts",
        "seed",
        "layout",
    )
    for name in names:
        argv += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    if args.store is not None:
        argv += ["--store", args.store, "--pg-schema", args.pg_schema]
    return argv


def drain_processes(
    args: argparse.Namespace, target: str, strategy: str, processes: int, nodes: int, enqueue: Callable[[], float]
) -> list[dict[str, Any]]:
    """Drain with ``processes`` worker processes: once all are set up, ``enqueue()`` the tasks and start them."""
    outputs = [os.path.join(args.folder, f"worker-{i}.json") for i in range(processes)]
    command = worker_argv(args, target, strategy, nodes, processes)
    procs = [
        subprocess.Popen(
            [*command, "--process-index", str(i), "--result", out],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        for i, out in enumerate(outputs)
    ]
    for proc in procs:  # each worker's store is open and its runtime built: start them all at once
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip() == READY:
                break
            sys.stdout.write(line)
        else:
            raise RuntimeError(f"a worker exited before it was ready (exit code {proc.wait()})")
    enqueued_at = enqueue()  # the tasks became claimable at once (one transaction)
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(f"go {enqueued_at!r}\n")
        proc.stdin.flush()
    results = []
    for proc, out in zip(procs, outputs, strict=True):
        assert proc.stdout is not None
        sys.stdout.write(proc.stdout.read())
        proc.wait(timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"worker exited {proc.returncode}")
        results.append(json.loads(Path(out).read_text()))
        os.remove(out)
    return results


def drain_one(
    db: SQLiteDb | PostgresDb,
    target: str,
    strategy: str,
    nodes: int,
    args: argparse.Namespace,
    process: int,
    barrier: Barrier = no_barrier,
) -> dict[str, Any]:
    if strategy == "lock-table":
        return run(lambda: db.lock_table(target, nodes, args.send_ms, args.max_cell_s, barrier))
    return run(lambda: drain_runtime(db, target, strategy, nodes, args, process, barrier))


def percentiles_ms(pairs: list[tuple[float, float]]) -> tuple[float | None, float | None]:
    """p50/p99 enqueue-to-commit of the done tasks, from the store clock (ms)."""
    values = [(u - c) * 1000.0 for c, u in pairs]
    if len(values) < 2:
        return None, None
    q = statistics.quantiles(values, n=100)
    return q[49], q[98]


def cell(
    args: argparse.Namespace, db: SQLiteDb | PostgresDb, strategy: str, nodes: int, processes: int
) -> dict[str, Any]:
    target = db.target(f"{strategy}-{nodes}-{processes}")
    specs = workload(args.tasks, args.conversations, args.accounts, args.seed, args.layout)
    run(lambda: db.reset(target))
    run(lambda: create(db, target))
    raw = run(lambda: db.raw_commits_per_s(target, args.raw_seconds))
    if strategy == "lock-table":
        run(lambda: db.prepare_lock_table(target))
    # The tasks are enqueued once the nodes are set up, just before they start: the
    # enqueue-to-commit latencies count the drain, not the baseline or the start-up.
    if processes == 1:

        async def fill_then_go() -> float | None:
            return await fill(db, target, specs)  # the clock starts as the enqueue commits

        parts = [drain_one(db, target, strategy, nodes, args, 0, fill_then_go)]
    else:
        parts = drain_processes(args, target, strategy, processes, nodes, lambda: run(lambda: fill(db, target, specs)))
    sends: Counter[int] = Counter()
    events: Counter[str] = Counter()
    claims: Counter[str] = Counter()
    for p in parts:
        sends.update(p["sent"])
        events.update(p["events"])
        claims.update(p.get("claims", {}))
    start = min(p["start"] for p in parts)
    end = max(p["end"] for p in parts)
    pairs = run(lambda: db.created_updated(target))
    done = len(pairs)
    p50, p99 = percentiles_ms(pairs)
    leases = run(lambda: lock_leases(db, target, args.accounts)) if strategy in LOCKED else None
    db.remove(target)
    rate = done / (end - start) if end > start else 0.0
    stolen = [p["stolen"] for p in parts if p.get("stolen") is not None]
    row = {
        "strategy": strategy,
        "nodes": nodes,
        "processes": processes,
        "committed": done,
        "complete": all(p["drained"] for p in parts),
        "tasks_per_s": round(rate, 1),
        "latency_p50_ms": None if p50 is None else round(p50, 1),
        "latency_p99_ms": None if p99 is None else round(p99, 1),
        "send_calls": sum(sends.values()),
        "duplicate_sends": sum(n - 1 for n in sends.values() if n > 1),
        "stolen": sum(stolen) if stolen else None,
        "claim_calls": claims["calls"],
        "empty_claims": claims["empty"],
        "idle_polls": claims["polls"],
        "cpu_s": round(sum(p["cpu_s"] for p in parts), 3) if all("cpu_s" in p for p in parts) else None,
        "conflicts": {k: v for k, v in sorted(events.items()) if k not in ("claims", "commits")},
        "raw_commits_per_s": round(raw, 1),
        "vs_raw_commits": round(rate / raw, 3) if raw else None,
        # each process's share of the sends: how the layout split the load between them
        "process_shares": [round(len(p["sent"]) / max(1, sum(sends.values())), 3) for p in parts],
        # leases of the account locks (None: the strategy takes none); account 0 is the hottest
        "lock_leases": None if leases is None else sum(leases),
        "hot_lock_leases": None if leases is None else leases[0],
    }
    leased = "" if leases is None else f", account:0's lock leased {leases[0]:,} times"
    counted = (  # lock-table and none claim without store.claim: nothing to count
        f", {claims['calls']:,} claims ({claims['empty']:,} empty), {claims['polls']:,} idle polls, "
        f"{row['cpu_s']} s CPU{leased}"
        if strategy not in ("lock-table", "none")
        else ""
    )
    print(
        f"  {strategy} x {nodes} nodes x {processes} process(es): {rate:,.0f} tasks/s{counted}",
        file=sys.stderr,
        flush=True,
    )
    return row


def procrastinate_cell(args: argparse.Namespace, processes: int, concurrency: int) -> dict[str, Any]:
    """The same drain (tasks, send time) with procrastinate: ``processes`` workers of ``concurrency``."""
    from postgres_drain import procrastinate_run

    result = run(lambda: procrastinate_run(args.store, args.tasks, processes, concurrency, args.send_ms))
    print(f"  procrastinate x {concurrency} x {processes} process(es): {result.rate:,.0f} jobs/s", file=sys.stderr)
    return {
        "processes": processes,
        "concurrency": concurrency,
        "jobs": result.tasks,
        "jobs_per_s": round(result.rate, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", metavar="DSN", help="postgresql://... to run on PostgreSQL (default: SQLite files)")
    parser.add_argument(
        "--pg-schema",
        default=PG_SCHEMA,
        type=bench_schema,
        help=f"with --store: the schema each cell drops and makes anew (default {PG_SCHEMA})",
    )
    parser.add_argument("--tasks", type=int, default=3000, help="tasks per cell (default 3000)")
    parser.add_argument("--conversations", type=int, default=500, help="Zipf-skewed conversations (default 500)")
    parser.add_argument("--accounts", type=int, default=32, help="Zipf-skewed sending accounts (default 32)")
    parser.add_argument("--send-ms", type=float, default=1.0, help="simulated send time, ms (default 1)")
    parser.add_argument("--slow-send-ms", type=float, default=20.0, help="send time of the slow node, ms (default 20)")
    parser.add_argument("--steal-after-s", type=float, default=0.25, help="all+stealing's steal_after_s (default 0.25)")
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    parser.add_argument(
        "--max-cell-s", type=float, default=120.0, help="stop a drain after this long; its rate is over what it drained"
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs of each cell (rows are listed per run)")
    parser.add_argument("--no-procrastinate", action="store_true", help="with --store: skip the procrastinate drains")
    parser.add_argument("--seed", type=int, default=1)
    layouts = parser.add_mutually_exclusive_group()
    layouts.add_argument(
        "--same-layout",
        action="store_true",
        help="every repeat on the same conversation names (default: repeat r renames them, another hash layout)",
    )
    layouts.add_argument(
        "--unmatched-layouts",
        action="store_true",
        help="each repeat on the first layout drawn (default: one that splits the load between the "
        "processes alike at every node count)",
    )
    parser.add_argument("--layout", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--raw-seconds", type=float, default=0.3, help="duration of the raw commit baseline per cell")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--report", metavar="DIR", help="write contention.json, contention.md and contention.png")
    parser.add_argument("--worker", metavar="TARGET", help=argparse.SUPPRESS)
    parser.add_argument("--process-index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--process-count", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--result", metavar="FILE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        db = database_for(args.store, os.path.dirname(args.worker), args.pg_schema)
        result = drain_one(db, args.worker, args.strategies[0], args.nodes[0], args, args.process_index, stdin_barrier)
        Path(args.result).write_text(json.dumps(result))
        return
    args.folder = tempfile.mkdtemp(prefix="asynccoord-contention-")
    try:
        bench(args, database_for(args.store, args.folder, args.pg_schema))
    finally:
        shutil.rmtree(args.folder, ignore_errors=True)


def bench(args: argparse.Namespace, db: SQLiteDb | PostgresDb) -> None:
    load_before = os.getloadavg()
    with_procrastinate = db.kind == "postgres" and not args.no_procrastinate
    if with_procrastinate:
        from postgres_drain import have_procrastinate

        with_procrastinate = have_procrastinate()
        if not with_procrastinate:
            print("procrastinate is not installed (pip install -e '.[bench]'): no ratios", file=sys.stderr)
    rows: list[dict[str, Any]] = []
    baseline: list[dict[str, Any]] = []
    # Each layout's procrastinate drain runs just before asynccoord's cells of that layout, and
    # repeats interleave the node counts, so a drift in the machine's load hits them alike.
    # Odd repeats take the node counts in reverse order, so a drift within a repeat does not
    # always favour the same size.
    layouts: dict[int, tuple[int, float]] = {}  # repeat -> (layout, spread): every process count's cells share it
    for processes in args.processes:
        for run_index in range(args.repeat):
            # Repeat r hashes the conversations to other partitions (unless --same-layout): which
            # process owns the hot ones then changes from repeat to repeat, and with it how much
            # the processes contend for the hot accounts. The node counts of one repeat share it,
            # drawn so that it splits the load alike at each of them (unless --unmatched-layouts).
            if args.same_layout:
                args.layout = 0
            else:
                if run_index not in layouts:  # drawn once, for every process count
                    layouts[run_index] = choose_layout(args, run_index, matched=not args.unmatched_layouts)
                    spread = layouts[run_index][1]
                    if spread > SPLIT_TOLERANCE and not args.unmatched_layouts:
                        print(
                            f"repeat {run_index}: no layout of {LAYOUT_DRAWS} drawn splits the load alike at every "
                            f"node count; the closest differs by {spread:.3f}",
                            file=sys.stderr,
                        )
                args.layout = layouts[run_index][0]
            splits = layout_splits(args, args.layout, processes)
            for nodes in args.nodes if run_index % 2 == 0 else list(reversed(args.nodes)):
                theirs = procrastinate_cell(args, processes, nodes) if with_procrastinate else None
                if theirs is not None:
                    baseline.append(theirs)
                for strategy in args.strategies:
                    row = cell(args, db, strategy, nodes, processes)
                    row["run"] = run_index
                    row["layout"] = args.layout
                    row["split"] = splits[nodes] if LAYERS.get(strategy, (False,))[0] else None
                    if theirs is not None:
                        row["vs_procrastinate"] = round(row["tasks_per_s"] / theirs["jobs_per_s"], 2)
                    rows.append(row)
                    if args.report:  # a long run keeps what it measured so far
                        folder = Path(args.report)
                        folder.mkdir(parents=True, exist_ok=True)
                        (folder / "contention.partial.json").write_text(
                            json.dumps({"rows": rows, "procrastinate": baseline})
                        )
    rows.sort(key=lambda r: (r["processes"], STRATEGIES.index(r["strategy"]), r["nodes"]))
    results = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "load_average_start": [round(x, 2) for x in load_before],
            "load_average_end": [round(x, 2) for x in os.getloadavg()],
            **db.describe(),
        },
        "workload": {
            "tasks": args.tasks,
            "conversations": args.conversations,
            "accounts": args.accounts,
            "send_ms": args.send_ms,
            "slow_send_ms": args.slow_send_ms,
            "steal_after_s": args.steal_after_s,
            "max_cell_s": args.max_cell_s,
            "zipf_s": 1.1,
            "seed": args.seed,
        },
        "rows": rows,
        "scaling": scaling(rows),
        "procrastinate": baseline,
    }
    if args.report:
        write_report(results, Path(args.report))
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(markdown(results))


def scaling(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What adding nodes did: per layout and strategy, for each node count and the next larger
    one, the ratio of their rates in each run (repeat) that measured both, and its median.

    The issue's bar for the node counts reads straight off it (64 nodes against 16: ``ratios``
    of ``nodes`` 16 -> 64). Runs, not cells, are paired: the two sizes of one run were measured
    minutes apart at most, under the same load. Beside the median: the geometric mean of the
    ratios and the standard error of its logarithm (``log_se``; with many runs the mean is
    within a factor ``exp(2 * log_se)`` of the true ratio at about 95 %, with a handful the
    band of a t distribution is wider), and, for the strategies with account locks,
    ``at_equal_hot_leases``: the ratio at an equal number of leases of ``account:0``'s lock
    (see :func:`at_equal_hot_leases`). A run in which either size committed nothing (0
    tasks/s) has no ratio (``None`` in ``ratios``) and is left out of every figure;
    ``runs`` counts the runs that have one.
    """
    # (processes, strategy) -> nodes -> run -> row
    by_layout: dict[tuple[int, str], dict[int, dict[int, dict[str, Any]]]] = {}
    for r in rows:
        by_nodes = by_layout.setdefault((r["processes"], r["strategy"]), {})
        by_nodes.setdefault(r["nodes"], {})[r["run"]] = r
    out: list[dict[str, Any]] = []
    layouts = sorted(by_layout.items(), key=lambda kv: (kv[0][0], STRATEGIES.index(kv[0][1])))
    for (processes, strategy), by_nodes in layouts:
        for smaller, larger in itertools.pairwise(sorted(by_nodes)):
            low, high = by_nodes[smaller], by_nodes[larger]
            runs = [(low[i], high[i]) for i in sorted(low.keys() & high.keys())]
            if not runs:
                continue
            pairs = [(a, b) for a, b in runs if a["tasks_per_s"] > 0 and b["tasks_per_s"] > 0]
            logs = [math.log(b["tasks_per_s"] / a["tasks_per_s"]) for a, b in pairs]
            ratios = [
                round(b["tasks_per_s"] / a["tasks_per_s"], 3) if a["tasks_per_s"] > 0 and b["tasks_per_s"] > 0 else None
                for a, b in runs
            ]
            valid = [x for x in ratios if x is not None]
            group: dict[str, Any] = {
                "processes": processes,
                "strategy": strategy,
                "nodes": [smaller, larger],
                "ratios": ratios,
                "runs": len(valid),
                "median": round(statistics.median(valid), 3) if valid else None,
                "larger_faster": sum(1 for x in valid if x > 1.0),
                "geometric_mean": round(math.exp(statistics.fmean(logs)), 4) if logs else None,
                "log_se": round(statistics.stdev(logs) / math.sqrt(len(logs)), 4) if len(logs) > 1 else None,
            }
            if strategy in LOCKED:
                group["at_equal_hot_leases"] = at_equal_hot_leases(
                    logs, [b["hot_lock_leases"] - a["hot_lock_leases"] for a, b in pairs]
                )
            out.append(group)
    return out


def at_equal_hot_leases(logs: list[float], extra_leases: list[int]) -> dict[str, float] | None:
    """The larger node count's rate ratio at an equal number of leases of ``account:0``'s lock.

    A layout's hash decides how the hottest account's tasks split between the processes, and
    so how often its lock moves between them; with two processes it splits differently at 16
    and at 64 nodes, and each extra lease costs the drain a hand-over. The least-squares line
    of each pair's log rate ratio (``logs``) on the larger count's extra leases
    (``extra_leases``, may be negative) has, at 0 extra leases, the ratio with that bias taken
    out. Returns ``ratio`` (exp of the intercept), ``log_se`` (the intercept's standard error)
    and ``slope_per_lease`` (the log ratio per extra lease), or None with fewer than 3 pairs or
    leases that never differ.
    """
    n = len(logs)
    if n < 3 or len(set(extra_leases)) < 2:
        return None
    fit = statistics.linear_regression(extra_leases, logs)
    mean_x = statistics.fmean(extra_leases)
    sxx = sum((x - mean_x) ** 2 for x in extra_leases)
    residual = sum((y - fit.intercept - fit.slope * x) ** 2 for x, y in zip(extra_leases, logs, strict=True))
    se = math.sqrt(residual / (n - 2) * (1 / n + mean_x**2 / sxx))
    return {"ratio": round(math.exp(fit.intercept), 4), "log_se": round(se, 4), "slope_per_lease": round(fit.slope, 5)}


def markdown(results: dict[str, Any]) -> str:
    with_ratio = bool(results.get("procrastinate"))
    head = "| processes | strategy | nodes | tasks/s | x raw commit |"
    rule = "|---:|---|---:|---:|---:|"
    if with_ratio:
        head += " x procrastinate |"
        rule += "---:|"
    lines = [
        head + " p50 ms | p99 ms | duplicate sends | stolen | conflicts |",
        rule + "---:|---:|---:|---:|---|",
    ]
    for r in results["rows"]:
        conflicts = ", ".join(f"{k}={v}" for k, v in r["conflicts"].items() if v) or "-"
        ratio = f" {r.get('vs_procrastinate')}x |" if with_ratio else ""
        stolen = "-" if r["stolen"] is None else r["stolen"]
        rate = f"{r['tasks_per_s']:,.0f}" + ("" if r["complete"] else " *")
        lines.append(
            f"| {r['processes']} | {r['strategy']} | {r['nodes']} | {rate} | {r['vs_raw_commits']} |"
            f"{ratio} {r['latency_p50_ms']} | {r['latency_p99_ms']} | {r['duplicate_sends']} | {stolen} | {conflicts} |"
        )
    if results.get("scaling"):
        lines.append("")
        lines.append(
            "| processes | strategy | nodes | rate ratio per run | median | larger faster"
            " | geometric mean (se) | at equal account:0 leases (se) |"
        )
        lines.append("|---:|---|---|---|---:|---:|---:|---:|")
        for g in results["scaling"]:
            runs = " ".join("-" if x is None else f"{x:.2f}" for x in g["ratios"])
            smaller, larger = g["nodes"]
            median = "-" if g["median"] is None else f"{g['median']:.2f}"
            mean = "-" if g["geometric_mean"] is None else f"{g['geometric_mean']:.3f}"
            if g["log_se"] is not None:
                mean += f" ({g['log_se']:.3f})"
            equal = g.get("at_equal_hot_leases")
            corrected = "-" if equal is None else f"{equal['ratio']:.3f} ({equal['log_se']:.3f})"
            lines.append(
                f"| {g['processes']} | {g['strategy']} | {smaller} -> {larger} | {runs} | {median} |"
                f" {g['larger_faster']} of {g['runs']} | {mean} | {corrected} |"
            )
    machine = results["machine"]
    raw = [r["raw_commits_per_s"] for r in results["rows"]]
    stopped = [r for r in results["rows"] if not r["complete"]]
    if stopped:
        lines.append("")
        limit = results["workload"]["max_cell_s"]
        lines.append(f"\\* stopped after {limit:g} s, not drained: the rate is over the tasks committed by then.")
    store = f"PostgreSQL {machine['postgres']}" if machine["store"] == "postgres" else f"sqlite3 {machine['sqlite']}"
    lines.append("")
    lines.append(f"Raw single-row commits/s on the same databases ({store}): median {statistics.median(raw):,.0f}.")
    if with_ratio:
        lines.append("")
        lines.append("| procrastinate: processes x concurrency | jobs/s |")
        lines.append("|---|---:|")
        for b in results["procrastinate"]:
            lines.append(f"| {b['processes']} x {b['concurrency']} | {b['jobs_per_s']:,.0f} |")
    start, end = machine["load_average_start"], machine["load_average_end"]
    lines.append("")
    lines.append(f"Load average (1, 5, 15 min) at the start {start}, at the end {end}; {machine['cpus']} CPUs.")
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
        theirs = [b for b in results.get("procrastinate", []) if b["processes"] == p]
        if theirs:
            ax.plot(
                [b["concurrency"] for b in theirs],
                [b["jobs_per_s"] for b in theirs],
                marker="x",
                linestyle="--",
                label="procrastinate",
            )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("nodes per process")
        ax.set_ylabel("committed tasks/s")
        ax.set_title(f"{p} process(es)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(folder / "contention.png", dpi=100)


if __name__ == "__main__":
    main()
