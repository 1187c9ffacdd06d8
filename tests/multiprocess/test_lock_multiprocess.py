"""Locks across real OS processes on one SQLite file (tests/workers/lock_worker.py)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support import TESTS

from asynccoord import Lock, SQLiteStore

pytestmark = pytest.mark.multiprocess

WORKER = str(TESTS / "workers" / "lock_worker.py")


async def read_event(proc: subprocess.Popen[str], timeout_s: float = 20.0) -> dict[str, Any]:
    """The next JSON line of ``proc`` (fails the test on EOF or timeout)."""
    assert proc.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout_s)
    if not line:
        stderr = proc.stderr.read() if proc.stderr is not None else ""
        pytest.fail(f"worker ended without an event (exit {proc.wait()}):\n{stderr}")
    event: dict[str, Any] = json.loads(line)
    return event


async def test_four_processes_increment_a_counter_exactly(python: Any, db_path: Path) -> None:
    async with SQLiteStore(db_path):  # creates the schema once
        pass
    with sqlite3.connect(db_path, isolation_level=None) as db:
        db.execute("CREATE TABLE counter (id INTEGER PRIMARY KEY, value INTEGER NOT NULL)")
        db.execute("INSERT INTO counter VALUES (1, 0)")
    processes, increments = 4, 15
    procs = [
        python.spawn([WORKER, "count", str(db_path), "--name", "counter", "--increments", str(increments)])
        for _ in range(processes)
    ]
    for proc in procs:
        assert (await read_event(proc))["event"] == "ready"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    tokens: list[int] = []
    for proc in procs:
        done = await read_event(proc, timeout_s=60.0)
        assert done["event"] == "done"
        tokens.extend(done["tokens"])
        assert await asyncio.to_thread(proc.wait) == 0
    with sqlite3.connect(db_path) as db:
        (value,) = db.execute("SELECT value FROM counter WHERE id = 1").fetchone()
    assert value == processes * increments
    # every acquisition, in whichever process, got its own fencing token: 1..N, each once
    assert sorted(tokens) == list(range(1, processes * increments + 1))


@pytest.mark.parametrize("block", [False, True], ids=["explicit", "async-with"])
async def test_paused_holder_is_fenced_off_and_cannot_renew(python: Any, db_path: Path, block: bool) -> None:
    """TTL 0.3 s, watchdog every 0.1 s; A blocks its event loop for 1 s; B takes over."""
    async with SQLiteStore(db_path) as store:
        argv = [WORKER, "pause", str(db_path), "--name", "res", "--resource", "res"]
        proc = python.spawn([*argv, "--block"] if block else argv)
        a = await read_event(proc)
        assert a["event"] == "acquired"
        assert a["fencing_token"] == 1
        b_lock = Lock(store, "res", ttl_s=5.0)  # no watchdog: its expiry must not move
        b = await b_lock.acquire(timeout_s=3.0)
        assert b.fencing_token == 2
        assert 0.30 <= b.acquired_at - a["acquired_at"] <= 0.45
        await store.fenced_write("res", b.fencing_token, "B")

        done = await read_event(proc)
        assert await asyncio.to_thread(proc.wait) == 0
        if block:
            # the block's write was either refused or never sent: the watchdog stopped it
            assert done["block"] in ("LockLostError", "FencingTokenRejectedError")
        else:
            assert done["write"] == "rejected"
            assert done["handle_lost"] is True
            assert done["release"] == "LockNotHeldError"
            assert done["events"].get("fencing_rejected") == 1
        assert done["store_renew"] is None  # A's renewal neither extended nor recreated anything
        assert done["events"].get("lock_lost") == 1
        assert done["watchdog"]["renew_rounds"] == 0  # it never renewed after the pause: deadline passed

        record = await store.read_fence("res")
        assert record is not None
        assert (record.fencing_token, record.data) == (2, "B")  # B stayed the last writer
        [info] = await store.list_locks("res")
        assert (info.owner_token, info.fencing_token, info.expires_at) == (b.owner_token, 2, b.expires_at)
        await b_lock.release()


async def test_killed_holder_frees_the_lock_within_ttl(python: Any, db_path: Path) -> None:
    ttl_s = 0.5
    async with SQLiteStore(db_path) as store:
        proc = python.spawn([WORKER, "hold", str(db_path), "--name", "job", "--ttl-s", str(ttl_s)])
        a = await read_event(proc)
        assert a["event"] == "acquired"
        waiter = Lock(store, "job", ttl_s=5.0)
        assert await waiter.try_acquire() is None
        await asyncio.sleep(0.4)  # the holder's watchdog renews meanwhile (every ttl_s / 3)
        assert await waiter.try_acquire() is None
        os.kill(proc.pid, signal.SIGKILL)
        await asyncio.to_thread(proc.wait)
        killed_at = await store.now()
        lease = await waiter.acquire(timeout_s=3.0)
        assert lease.fencing_token == a["fencing_token"] + 1
        assert lease.acquired_at - killed_at <= ttl_s + 0.2
        await waiter.release()
