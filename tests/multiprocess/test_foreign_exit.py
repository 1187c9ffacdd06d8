"""A ``SystemExit`` raised by another task of the program than the runtime's (a bot's shutdown command).

asyncio lets it out of the event loop, and ``asyncio.run`` then cancels every task left in no
order: the nodes, and the library's own tasks among them. Each was a way to lose the
hand-backs the nodes' cancellation starts (tasks, locks, membership):

- SQLite: the writer task, cancelled, left every later write queued with nobody to run it,
  so the process took 20 s to end (the membership's 5 s leave timeout, then ``close()``'s 10 s
  wait for the calls in flight), and every task stayed claimed until its lease lapsed.
- Every backend, with a ``lock_key``: the lock watchdog, cancelled, gave up every lease it
  guarded, and the lock pool's own task, cancelled, closed its guard: the locks were then never
  released, and a node told its lock was lost never handed its task back. A node's wait for
  its lock's release, cut by the second cancellation, skipped the task's hand-back as well.

Now the process ends within a second or so with every task handed back and every lock
released, on every backend.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from services import PG_DSN, drop_schemas, new_schema, postgres_problem, unavailable
from support import TESTS

from asynccoord import SQLiteStore, TaskStatus

pytestmark = pytest.mark.multiprocess

WORKER = str(TESTS / "workers" / "foreign_exit_worker.py")
TASKS = 6  # as in the worker: each one's send in flight (30 s) when the exit comes
LOCKS = ["nolocks", "locks"]


@pytest.fixture
def pg_schema() -> Iterator[str]:
    problem = postgres_problem()
    if problem is not None:
        unavailable("PostgreSQL", problem)
    name = new_schema("fx")
    yield name
    drop_schemas(name)


def run_worker(python: Any, *args: str) -> Any:
    """Run the worker to its end; check it ended with the exit, within 5 s of it (20 s before)."""
    proc = python.run([WORKER, *args], timeout_s=60.0, check=False)
    ended_at = time.monotonic()
    assert proc.returncode == 3, proc.stderr
    exit_lines = [line for line in proc.stdout.splitlines() if line.startswith("exit_at ")]
    assert len(exit_lines) == 1, proc.stdout + proc.stderr
    assert ended_at - float(exit_lines[0].split()[1]) < 5.0, proc.stderr
    for trouble in ("Task was destroyed", "leave_timeout", "close_cut_calls", "lock_lost"):
        assert trouble not in proc.stderr, proc.stderr
    return proc


async def assert_handed_back(store: Any) -> None:
    """From another store of the database: every task pending with its attempt counted, claimable at once."""
    tasks = [await store.get(task_id) for task_id in range(1, TASKS + 1)]
    assert [(t.status, t.attempts) for t in tasks] == [(TaskStatus.PENDING, 1)] * TASKS
    claimed = await store.claim("q", node_id="after", limit=100, lease_s=5.0)
    assert sorted(t.id for t in claimed) == list(range(1, TASKS + 1))
    assert await store.list_locks() == []
    assert await store.members() == []


@pytest.mark.parametrize("locks", LOCKS)
async def test_sqlite(python: Any, db_path: Path, locks: str) -> None:
    run_worker(python, "sqlite", locks, str(db_path))
    async with SQLiteStore(db_path) as store:
        await assert_handed_back(store)


@pytest.mark.parametrize("locks", LOCKS)
async def test_postgres(python: Any, pg_schema: str, locks: str) -> None:
    from asynccoord import PostgresStore

    run_worker(python, "postgres", locks, PG_DSN, pg_schema)
    async with PostgresStore(PG_DSN, schema=pg_schema, listen=False) as store:
        await assert_handed_back(store)


@pytest.mark.parametrize("locks", LOCKS)
def test_memory(python: Any, locks: str) -> None:
    proc = run_worker(python, "memory", locks, "-")
    assert f"after claimable={TASKS} locks=0 members=0" in proc.stdout.splitlines(), proc.stdout + proc.stderr
