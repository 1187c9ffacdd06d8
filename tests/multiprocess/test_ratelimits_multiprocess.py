"""Rate limits across real OS processes on one SQLite file and on PostgreSQL: never over the limit, close to it.

Two processes of four nodes each drain a backlog over several chats limited per chat,
on one SQLite file or one PostgreSQL schema (tests/workers/rate_worker.py).
Every send is logged with its CLOCK_MONOTONIC time (system-wide on Linux, so the
processes' times compare) at the moment it would reach the provider; the test then
checks, per chat, every sliding window of ``per_s`` seconds against the limit
(``max_in_window``: count + burst) and the rate achieved over the backlog. A third test
kills one process with SIGKILL mid-run: tokens it took are never handed out again, so the
bound holds across the crash.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from conftest import WORKERS_DIR
from services import PG_DSN, new_schema, postgres_problem, unavailable

from asynccoord import RateLimit, SQLiteStore, TaskStatus
from asynccoord.contract.ratelimits import max_in_window

Q = "outbox"
WORKER = str(WORKERS_DIR / "rate_worker.py")
LIMIT = RateLimit(dimension="chat", count=5, per_s=1.0, burst=2)
CHATS = 6
PER_CHAT = 16


pytestmark = pytest.mark.multiprocess


class Target:
    """Where the workers meet: an SQLite file, or a PostgreSQL schema (the worker's arguments and a store)."""

    def __init__(self, db_path: Path, schema: str | None) -> None:
        self.db_path = db_path
        self.schema = schema

    def args(self) -> list[str]:
        if self.schema is None:
            return [str(self.db_path)]
        return [PG_DSN, "--schema", self.schema]

    def store(self) -> Any:
        if self.schema is None:
            return SQLiteStore(self.db_path)
        from asynccoord.backends.postgres.store import PostgresStore

        return PostgresStore(PG_DSN, schema=self.schema, listen=False)


@pytest.fixture(params=["sqlite", "postgres"])
async def target(request: pytest.FixtureRequest, db_path: Path) -> Any:
    if request.param == "sqlite":
        yield Target(db_path, None)
        return
    problem = postgres_problem()
    if problem is not None:
        unavailable("PostgreSQL", problem)
    import asyncpg

    name = new_schema("rate")
    yield Target(db_path, name)
    conn = await asyncpg.connect(PG_DSN)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    finally:
        await conn.close()


async def fill(target: Target) -> None:
    async with target.store() as store:
        await store.set_rate_limits(Q, [LIMIT])
        for i in range(PER_CHAT):
            for c in range(CHATS):
                chat = f"chat-{c}"
                await store.enqueue(Q, {"chat": chat, "n": i}, partition_key=chat, limit_keys={"chat": chat})


def spawn(python: Any, target: Target, log: Path, *extra: str) -> subprocess.Popen[str]:
    return python.spawn([WORKER, *target.args(), "--log", str(log), "--queue", Q, *extra])  # type: ignore[no-any-return]


def wait_line(proc: subprocess.Popen[str], event: str, timeout_s: float = 60.0) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if json.loads(line)["event"] == event:
            return
    raise AssertionError(f"no {event!r} from pid {proc.pid}: {proc.stderr.read() if proc.stderr else ''}")


def sends_by_chat(log: Path) -> dict[str, list[float]]:
    out: dict[str, list[float]] = defaultdict(list)
    for line in log.read_text().splitlines():
        record = json.loads(line)
        out[record["chat"]].append(record["t"])
    return {chat: sorted(times) for chat, times in out.items()}


def max_window_count(times: list[float], window_s: float) -> int:
    """The most sends in any half-open window [t, t + window_s) (a window starting at each send is enough)."""
    best, j = 0, 0
    for i, start in enumerate(times):
        j = max(j, i)
        while j < len(times) and times[j] < start + window_s:
            j += 1
        best = max(best, j - i)
    return best


def check_window_bound(log: Path) -> dict[str, int]:
    worst = {chat: max_window_count(times, LIMIT.per_s) for chat, times in sends_by_chat(log).items()}
    assert max(worst.values()) <= max_in_window(LIMIT), worst
    return worst


async def test_two_processes_never_exceed_the_limit_and_come_close_to_it(
    python: Any, target: Target, tmp_path: Path
) -> None:
    await fill(target)
    log = tmp_path / "sends.log"
    workers = [spawn(python, target, log) for _ in range(2)]
    for w in workers:
        await asyncio.to_thread(wait_line, w, "done", 90.0)
    by_chat = sends_by_chat(log)
    assert sorted(by_chat) == [f"chat-{c}" for c in range(CHATS)]
    assert all(len(times) == PER_CHAT for times in by_chat.values())  # each sent once
    check_window_bound(log)
    # Close to the limit: after the burst, the backlog goes at >= 90 % of count / per_s.
    # Measured from the burst's last send on SQLite; on PostgreSQL from the first send the
    # limit paced: each chat's sends within the burst trail the first by a commit and a
    # claim's round trips (30-75 ms on this shared machine), which the burst lets the next
    # send make up, so a rate from the burst's last send measures that latency, not the pace.
    # The pace's upper bound allows one send more, as max_in_window does: a claim's send lands
    # after it by its round trips, which vary by tens of ms under load, and the first and last
    # sends measured may differ so by up to one emission interval (on SQLite under load too:
    # one chat's steady sends once measured 5.105/s against the 5.1 allowed without it).
    start, slack = (LIMIT.burst - 1, 1) if target.schema is None else (LIMIT.burst, 1)
    for chat, times in by_chat.items():
        steady = times[start:]
        rate = (len(steady) - 1) / (steady[-1] - steady[0])
        assert rate >= 0.9 * LIMIT.count / LIMIT.per_s, (chat, rate)
        assert (len(steady) - 1 - slack) / (steady[-1] - steady[0]) <= 1.02 * LIMIT.count / LIMIT.per_s, (chat, rate)


async def test_kill_9_mid_run_hands_no_token_out_twice(python: Any, target: Target, tmp_path: Path) -> None:
    await fill(target)
    log = tmp_path / "sends.log"
    # Sends of 0.15 s: a kill catches most nodes mid-send, and a chat (one send at a time) would
    # go at up to ~6 per second, over its limit of 5, so the tokens, not the sends, set its pace.
    doomed = spawn(python, target, log, "--lease-s", "1.0", "--send-s", "0.15")
    survivor = spawn(python, target, log, "--lease-s", "1.0", "--send-s", "0.15")
    await asyncio.to_thread(wait_line, doomed, "ready")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # both have sent
        pids = {json.loads(line)["pid"] for line in log.read_text().splitlines()} if log.exists() else set()
        if {doomed.pid, survivor.pid} <= pids:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.wait(timeout=10)
    await asyncio.to_thread(wait_line, survivor, "done", 120.0)
    async with target.store() as store:
        stats = await store.stats(Q)
    assert stats.counts[TaskStatus.DONE] == CHATS * PER_CHAT
    # Tasks the killed process had leased are sent again after their lease lapses, each
    # with a fresh token: even counting the killed process's sends, no window is over.
    check_window_bound(log)
