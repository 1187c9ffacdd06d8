"""Cross-process wake-ups on SQLite (asynccoord/backends/sqlite/wakeup.py), with real OS processes.

The nodes of tests/workers/wakeup_worker.py poll for work from elsewhere only every
20-30 s (``idle_min_s``/``idle_max_s``) and claim by themselves every 30-60 s, so a
task another process enqueued that they send within a few seconds was brought by a
wake-up: nothing else can explain it. The bounds are generous sanity checks (the
figures are in benchmarks/latency.py), never speed claims.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support import TESTS

from asynccoord import SQLiteStore
from asynccoord.backends.sqlite.wakeup import decode_wakeup, encode_wakeup, wakeup_dir
from asynccoord.partition import owner_of, partition_of

pytestmark = pytest.mark.multiprocess

WORKER = str(TESTS / "workers" / "wakeup_worker.py")
QUEUE = "q"
WAKE_BOUND_S = 5.0  # far below the workers' 20 s idle poll: only a wake-up explains a pickup this fast


class Worker:
    """One wakeup_worker.py process; a thread reads its JSON lines into ``events``."""

    def __init__(self, path: Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, WORKER, str(path), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.events: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.events.append(json.loads(line))
                self._cond.notify_all()

    def wait_for(self, predicate: Any, timeout_s: float) -> dict[str, Any]:
        """The first event matching ``predicate``, waiting up to ``timeout_s``; AssertionError otherwise."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                for event in self.events:
                    if predicate(event):
                        return event
                left = deadline - time.monotonic()
                assert left > 0, f"no matching event within {timeout_s} s; got {self.events}"
                self._cond.wait(left)

    def sent(self, task_id: int, timeout_s: float) -> dict[str, Any]:
        return self.wait_for(lambda e: e["event"] == "sent" and e["id"] == task_id, timeout_s)

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write("stop\n")
                self.proc.stdin.flush()
            except BrokenPipeError:
                pass
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._thread.join(5)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def workers() -> Any:
    started: list[Worker] = []

    def start(path: Path, *args: str) -> Worker:
        worker = Worker(path, *args)
        started.append(worker)
        worker.wait_for(lambda e: e["event"] == "ready", 60)
        return worker

    yield start
    for worker in started:
        worker.stop()
    for worker in started:
        assert worker.proc.returncode in (0, -signal.SIGKILL), f"worker exited with {worker.proc.returncode}"


async def init_db(path: Path) -> None:
    async with SQLiteStore(path, wakeup=False):
        pass


async def test_a_task_enqueued_in_one_process_is_picked_up_by_a_node_in_another_at_once(
    tmp_path: Path, workers: Any
) -> None:
    path = tmp_path / "bot.db"
    await init_db(path)
    worker = workers(path)
    assert worker.events[0]["socket"] in os.listdir(wakeup_dir(str(path)))
    async with SQLiteStore(path) as store:
        for n in range(5):
            started = time.monotonic()
            result = await store.enqueue(QUEUE, {"n": n}, partition_key=f"conversation-{n}")
            sent = await asyncio.to_thread(worker.sent, result.task.id, 15.0)
            assert sent["t"] - started < WAKE_BOUND_S, f"picked up after {sent['t'] - started:.3f} s"
        assert store._wakeup is not None
        assert store._wakeup.sent >= 5


async def test_without_the_wake_up_the_same_pickup_waits_for_the_idle_poll(tmp_path: Path, workers: Any) -> None:
    """The control for the test above: what explains its fast pickups is the wake-up."""
    path = tmp_path / "bot.db"
    await init_db(path)
    worker = workers(path, "--no-wakeup", "--idle-min-s", "8", "--idle-max-s", "8")
    assert worker.events[0]["socket"] is None
    async with SQLiteStore(path) as store:
        started = time.monotonic()
        result = await store.enqueue(QUEUE, {"n": 0}, partition_key="conversation-0")
        sent = await asyncio.to_thread(worker.sent, result.task.id, 60.0)
    assert sent["t"] - started > WAKE_BOUND_S  # the idle poll found it, 8 s after the nodes went idle


async def test_a_process_killed_with_sigkill_leaves_nothing_that_delays_the_others(
    tmp_path: Path, workers: Any
) -> None:
    path = tmp_path / "bot.db"
    await init_db(path)
    doomed = workers(path, "--nodes", "2")
    survivor = workers(path, "--nodes", "2")
    directory = wakeup_dir(str(path))
    stale = doomed.events[0]["socket"]
    os.kill(doomed.proc.pid, signal.SIGKILL)
    doomed.proc.wait(30)
    assert stale in os.listdir(directory)  # kill -9 ran no cleanup: its socket file is left behind
    # Until their heartbeats expire the dead nodes still own partitions in the survivor's view,
    # and wake-ups go to owners only: the tasks use keys the survivor owns in every view.
    everyone = doomed.events[0]["node_ids"] + survivor.events[0]["node_ids"]
    mine = set(survivor.events[0]["node_ids"])
    async with SQLiteStore(path) as store:
        keys = [
            k
            for k in (f"conversation-{n}" for n in range(100))
            if owner_of(partition_of(k, store.partitions), everyone) in mine
        ]
        for n, key in enumerate(keys[:5]):
            started = time.monotonic()
            result = await store.enqueue(QUEUE, {"n": n}, partition_key=key)
            sent = await asyncio.to_thread(survivor.sent, result.task.id, 15.0)
            assert sent["t"] - started < WAKE_BOUND_S, f"picked up after {sent['t'] - started:.3f} s"
            if n == 0:
                assert stale not in os.listdir(directory)  # the first send to it failed and unlinked it
                assert store._wakeup is not None
                assert store._wakeup.removed == 1
    assert os.listdir(directory) == [survivor.events[0]["socket"]]


async def test_with_the_wake_up_channel_broken_everything_still_drains_through_the_idle_poll(
    tmp_path: Path, workers: Any
) -> None:
    path = tmp_path / "bot.db"
    await init_db(path)
    worker = workers(path, "--idle-min-s", "0.05", "--idle-max-s", "0.5")
    directory = wakeup_dir(str(path))
    shutil.rmtree(directory)  # the worker's socket file with it: nobody can reach it
    os.mkdir(directory)
    with open(os.path.join(directory, "12345-notasocket"), "w"):  # noqa: ASYNC230 - a registration no send can reach
        pass
    async with SQLiteStore(path) as store:
        ids = [(await store.enqueue(QUEUE, {"n": n}, partition_key=f"conversation-{n}")).task.id for n in range(20)]
        for task_id in ids:
            await asyncio.to_thread(worker.sent, task_id, 30.0)
        assert store._wakeup is not None
        assert store._wakeup.sent == 0
        assert store._wakeup.removed == 1  # the unreachable registration was dropped


async def test_wake_ups_reach_only_the_owners_of_the_partitions(tmp_path: Path) -> None:
    """Two stores on one file (one process, two channels): a notification crosses, and wakes owners only."""
    path = tmp_path / "bot.db"
    async with SQLiteStore(path) as sender, SQLiteStore(path) as receiver:
        key = "conversation-1"
        part = partition_of(key, sender.partitions)
        owner = receiver.notifier.subscribe(QUEUE, [part])
        other = receiver.notifier.subscribe(QUEUE, [(part + 1) % sender.partitions])
        waits = [asyncio.ensure_future(w.wait(30.0)) for w in (owner, other)]
        await asyncio.sleep(0.01)
        await sender.enqueue(QUEUE, 1, partition_key=key)
        assert await asyncio.wait_for(waits[0], 10.0) is True
        await asyncio.sleep(0.05)
        assert not waits[1].done()
        other.close()
        await waits[1]  # closing ends its wait
        owner.close()
        assert receiver._wakeup is not None
        assert receiver._wakeup.received >= 1
    assert not os.path.exists(wakeup_dir(str(path)))  # noqa: ASYNC240 - the last store to close removed the directory


def test_datagrams_round_trip_and_bad_ones_are_dropped() -> None:
    data = encode_wakeup({"q": (2, {3, 1}), "r": (1, None)})
    assert decode_wakeup(data) == [("q", 2, [1, 3]), ("r", 1, None)]
    assert decode_wakeup(encode_wakeup({"q": (1, set(range(600)))})) == [("q", 1, None)]
    for bad in (b"", b"{}", b"[1]", b'[["q", -1, null]]', b'[["q", 1, [-2]]]', b'[["", 1, null]]', b"\xff"):
        assert decode_wakeup(bad) == []
