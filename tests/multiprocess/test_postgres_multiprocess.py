"""Real OS processes draining one PostgreSQL queue (tests/workers/pg_worker.py).

* 4 processes x 8 nodes drain 10,000 tasks: each committed exactly once, each sent once.
* ``kill -9`` of a process mid-run loses nothing: the survivor finishes every task
  (sends the victim had in flight are repeated: at-least-once delivery), and each
  task is committed exactly once.
* Connections killed from the server side (``pg_terminate_backend``) again and again
  mid-run lose nothing and duplicate nothing: every task is sent once and committed
  once, the stores retry on fresh connections.
* The queue in PostgreSQL with the account locks in Redis (``lock_store=``).
"""

from __future__ import annotations

import asyncio
import collections
import json
import secrets
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from services import PG_DSN, REDIS_URL, new_schema, postgres_problem, redis_problem, unavailable
from support import TESTS

from asynccoord import NewTask

pytestmark = pytest.mark.multiprocess

WORKER = str(TESTS / "workers" / "pg_worker.py")
QUEUE = "outbox"


@pytest.fixture
async def schema() -> Any:
    problem = postgres_problem()
    if problem is not None:
        unavailable("PostgreSQL", problem)
    import asyncpg

    name = new_schema("mp")
    yield name
    conn = await asyncpg.connect(PG_DSN)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    finally:
        await conn.close()


async def fill(schema: str, tasks: int, *, conversations: int, accounts: int) -> set[int]:
    from asynccoord.backends.postgres.store import PostgresStore

    async with PostgresStore(PG_DSN, schema=schema, listen=False) as store:
        ids: set[int] = set()
        for first in range(0, tasks, 2000):
            batch = [
                NewTask(queue=QUEUE, payload={"n": i, "account": i % accounts}, partition_key=f"c{i % conversations}")
                for i in range(first, min(tasks, first + 2000))
            ]
            ids |= {r.task.id for r in await store.enqueue_many(batch)}
        return ids


def spawn(python: Any, schema: str, log: Path, *args: str) -> subprocess.Popen[str]:
    proc = python.spawn([WORKER, PG_DSN, schema, "--log", str(log), "--queue", QUEUE, "--barrier", *args])
    line = proc.stdout.readline()
    assert line, f"worker died at start:\n{proc.stderr.read()}"
    assert json.loads(line)["event"] == "ready"
    return proc


def finish(proc: subprocess.Popen[str], timeout_s: float = 240.0) -> dict[str, Any]:
    out, err = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, f"worker exited with {proc.returncode}:\n{err[-4000:]}"
    events = [json.loads(line) for line in out.splitlines() if line.strip()]
    return next(e for e in events if e["event"] == "done")


def sends(log: Path) -> list[dict[str, Any]]:
    """The sends the workers logged so far: complete lines only (a worker may be mid-line)."""
    if not log.exists():
        return []
    complete, _, _ = log.read_text().rpartition("\n")
    return [json.loads(line) for line in complete.splitlines() if line.strip()]


async def rows(schema: str, sql: str) -> list[Any]:
    import asyncpg

    conn = await asyncpg.connect(PG_DSN, server_settings={"search_path": f'"{schema}"'})
    try:
        return list(await conn.fetch(sql))
    finally:
        await conn.close()


async def assert_done_once(schema: str, ids: set[int], log: Path, *, resent_ok: bool) -> None:
    statuses = await rows(schema, "SELECT status, count(*) FROM coord_tasks GROUP BY status")
    assert [tuple(r) for r in statuses] == [("done", len(ids))]
    # One commit per task (a compare-and-set on the lease), its result naming a send that happened.
    sent = collections.Counter(s["id"] for s in sends(log))
    assert set(sent) == ids  # every task was sent
    if not resent_ok:
        assert max(sent.values()) == 1, [i for i, n in sent.items() if n > 1][:10]
    by_sender = {(s["id"], s["pid"], s["node"]) for s in sends(log)}
    for r in await rows(schema, "SELECT id, result FROM coord_tasks"):
        result = json.loads(r["result"])
        assert (r["id"], result["pid"], result["node"]) in by_sender


@pytest.mark.slow
async def test_four_processes_of_eight_nodes_drain_10000_tasks_exactly_once(
    python: Any, schema: str, tmp_path: Path
) -> None:
    ids = await fill(schema, 10_000, conversations=1_000, accounts=50)
    log = tmp_path / "sends.jsonl"
    workers = [spawn(python, schema, log, "--nodes", "8", "--pool", "6") for _ in range(4)]
    started = time.monotonic()
    for w in workers:
        w.stdin.write("go\n")
        w.stdin.flush()
    done = [finish(w) for w in workers]
    elapsed = time.monotonic() - started
    assert sum(d["committed"] for d in done) == 10_000
    assert all(d["committed"] > 0 for d in done)  # every process took part
    await assert_done_once(schema, ids, log, resent_ok=False)
    print(f"4 x 8 nodes drained 10,000 tasks in {elapsed:.1f} s ({10_000 / elapsed:.0f} tasks/s)")


@pytest.mark.slow
async def test_kill_9_of_a_process_mid_run_loses_nothing(python: Any, schema: str, tmp_path: Path) -> None:
    ids = await fill(schema, 2_000, conversations=200, accounts=20)
    log = tmp_path / "sends.jsonl"
    args = ("--nodes", "4", "--send-s", "0.01", "--lease-s", "2")
    victim, survivor = spawn(python, schema, log, *args), spawn(python, schema, log, *args)
    for w in (victim, survivor):
        w.stdin.write("go\n")
        w.stdin.flush()
    deadline = time.monotonic() + 60
    while len(sends(log)) < 300 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    running = await rows(schema, "SELECT count(*) FROM coord_tasks WHERE status <> 'done'")
    assert running[0][0] > 0  # killed mid-run, with work left
    survived = finish(survivor)
    assert survived["committed"] > 0
    await assert_done_once(schema, ids, log, resent_ok=True)


async def kill_backends(schema: str) -> int:
    killed = await rows(
        schema,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE application_name LIKE 'asynccoord %' AND datname = current_database() AND pid <> pg_backend_pid()",
    )
    return len(killed)


@pytest.mark.slow
@pytest.mark.exclusive  # it kills every asynccoord connection to the database, other tests' too
async def test_connections_killed_by_the_server_mid_run_lose_and_duplicate_nothing(
    python: Any, schema: str, tmp_path: Path
) -> None:
    ids = await fill(schema, 3_000, conversations=300, accounts=20)
    log = tmp_path / "sends.jsonl"
    workers = [spawn(python, schema, log, "--nodes", "4", "--send-s", "0.002") for _ in range(2)]
    for w in workers:
        w.stdin.write("go\n")
        w.stdin.flush()
    kills = 0
    while kills < 60 and all(w.poll() is None for w in workers):
        await asyncio.sleep(0.15)
        kills += await kill_backends(schema)
        if len(sends(log)) >= len(ids):
            break
    done = [finish(w) for w in workers]
    assert kills > 0
    assert sum(d["retries"] for d in done) > 0  # the stores did see lost connections
    assert sum(d["committed"] for d in done) == len(ids)
    await assert_done_once(schema, ids, log, resent_ok=False)


async def test_queue_in_postgres_with_account_locks_in_redis(python: Any, schema: str, tmp_path: Path) -> None:
    problem = redis_problem()
    if problem is not None:
        unavailable("Redis", problem)
    ids = await fill(schema, 600, conversations=60, accounts=6)
    log = tmp_path / "sends.jsonl"
    prefix = f"test:{secrets.token_hex(6)}:"
    args = ("--nodes", "4", "--redis", REDIS_URL, "--redis-prefix", prefix)
    workers = [spawn(python, schema, log, *args) for _ in range(2)]
    for w in workers:
        w.stdin.write("go\n")
        w.stdin.flush()
    done = [finish(w) for w in workers]
    assert sum(d["committed"] for d in done) == len(ids)
    await assert_done_once(schema, ids, log, resent_ok=False)
    # The commits were fenced in PostgreSQL by the Redis locks' tokens.
    fences = await rows(schema, "SELECT resource, fencing_token FROM coord_fences ORDER BY resource")
    assert [r["resource"] for r in fences] == sorted(f"account:{a}" for a in range(6))
    tokens: dict[str, list[int]] = collections.defaultdict(list)
    for s in sends(log):
        tokens[f"account:{(s['id'] - min(ids)) % 6}"].append(s["token"])
    assert all(t is not None for ts in tokens.values() for t in ts)

    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        counters = {k.decode(): int(await client.get(k)) async for k in client.scan_iter(match=f"{prefix}fencing:*")}
        accounts = {k for k in counters if not k.startswith(f"{prefix}fencing:asynccoord.next:")}
        assert accounts == {f"{prefix}fencing:account:{a}" for a in range(6)}
        # The other counters are those of the places in line of contended accounts (LockPool).
        assert len(counters) - len(accounts) <= 6
        for r in fences:
            assert r["fencing_token"] <= counters[f"{prefix}fencing:{r['resource']}"]
        keys = [k async for k in client.scan_iter(match=f"{prefix}*")]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()
