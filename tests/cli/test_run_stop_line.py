"""``run``'s stop line counts the tasks handed back at the stop, not those put back while the nodes ran.

A task put back because its lock stayed busy (``busy_requeue_s``) was claimed again and sent;
counting it as handed back read as a task left unfinished after a full drain. The run is real
(an SQLite file, two nodes, a real SIGTERM to this process), the lock held by another holder
so that a task is put back at least once before the stop.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from support import TESTS

from asynccoord import NewTask, SQLiteStore, TaskStatus
from asynccoord.cli import run as run_module
from asynccoord.cli.main import main
from asynccoord.node import Runtime


async def _prepare(db: Path, *, hold_lock_s: float) -> None:
    async with SQLiteStore(db) as store:
        tasks = [NewTask(queue="outbox", payload={"account": i}, partition_key=f"chat{i}") for i in range(3)]
        await store.enqueue_many(tasks)  # three conversations: their sends run side by side
        if hold_lock_s:  # another process's lease on account:0, lapsing on its own
            assert await store.try_acquire_lock("account:0", ttl_s=hold_lock_s, holder="another process") is not None


async def _counts(db: Path) -> dict[TaskStatus, int]:
    async with SQLiteStore(db) as store:
        return {status: n for status, n in (await store.stats("outbox")).counts.items() if n}


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, sleep_s: str, stop_when: str) -> Path:
    """``run`` with the lock key ``account:N``, stopped by a real SIGTERM; the database's path."""
    monkeypatch.syspath_prepend(str(TESTS / "workers"))
    monkeypatch.setenv("SERVE_SEND_LOG", str(tmp_path / "send.log"))
    monkeypatch.setenv("SERVE_SEND_SLEEP_S", sleep_s)
    checked = run_module.check_run

    def quick_lock_wait(args: Any) -> tuple[Any, Any, Any]:  # a busy lock is given up after 50 ms, not 5 s
        send, lock_key, config = checked(args)
        return send, lock_key, replace(config, lock_wait_s=0.05)

    monkeypatch.setattr(run_module, "check_run", quick_lock_wait)
    waited = Runtime.wait_for_signal

    async def signal_then_wait(self: Runtime, signals: Any = (signal.SIGTERM, signal.SIGINT)) -> int:
        if stop_when == "drained":
            assert await self.wait_until_drained(timeout_s=20.0)
        else:  # every send under way
            log, deadline = tmp_path / "send.log", time.monotonic() + 20.0
            while not log.exists() or log.read_text().count("start ") < 3:
                assert time.monotonic() < deadline, "the three sends never started"
                await asyncio.sleep(0.01)
        asyncio.get_running_loop().call_soon(os.kill, os.getpid(), signal.SIGTERM)
        return await waited(self, signals)

    monkeypatch.setattr(Runtime, "wait_for_signal", signal_then_wait)
    db = tmp_path / "bot.db"
    argv = ["run", "--db", str(db), "--queue", "outbox", "--send", "serve_send:send"]
    argv += ["--lock-key", "serve_send:account_lock", "--nodes", "2", "--idle-max-s", "0.1"]
    assert main([*argv, "--shutdown-timeout-s", "0.2"]) == 0
    return db


def test_after_a_full_drain_nothing_is_handed_back_at_the_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(_prepare(tmp_path / "bot.db", hold_lock_s=0.5))
    db = _run(tmp_path, monkeypatch, sleep_s="0", stop_when="drained")
    assert asyncio.run(_counts(db)) == {TaskStatus.DONE: 3}
    last = capsys.readouterr().out.splitlines()[-1]
    found = re.fullmatch(
        r"asynccoord: 2 nodes stopped on SIGTERM: 3 tasks committed, 0 handed back at the stop"
        r" \((\d+) put back earlier, while running\)",
        last,
    )
    assert found is not None, last
    assert int(found.group(1)) >= 1  # account:0's task, while the other holder had its lock


def test_the_sends_cut_at_the_stop_are_counted_as_handed_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(_prepare(tmp_path / "bot.db", hold_lock_s=0))
    db = _run(tmp_path, monkeypatch, sleep_s="30", stop_when="sending")
    assert asyncio.run(_counts(db)) == {TaskStatus.PENDING: 3}
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == "asynccoord: 2 nodes stopped on SIGTERM: 0 tasks committed, 3 handed back at the stop"
