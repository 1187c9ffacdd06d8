"""The public cases of the queue issue, adapted to the API.

Cases about time run on real time where the point is real time (delays, a held
write lock, retries observed by polling nodes) and on the fake clock where exact
numbers are asserted (backoff gaps, retention).
"""

from __future__ import annotations

import asyncio
import gc
import json
import math
import random
import sqlite3
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support import FakeClock

from asynccoord import (
    NewTask,
    ProcessedRetention,
    RetryPolicy,
    SQLiteStore,
    StoreBusyError,
    StoreClosedError,
    StoreConfig,
    Task,
    TaskStatus,
)
from asynccoord import events as ev

Q = "q"
RETRY = RetryPolicy(base_s=0.2, factor=2.0, jitter=0.1, max_attempts=4)
GAP_BOUNDS = [(0.18, 0.22), (0.36, 0.44), (0.72, 0.88)]


# --- a delayed task -------------------------------------------------------------------


async def test_delayed_task_is_claimed_once_after_run_at(db_path: Path) -> None:
    """run_at 1.5 s ahead, lease 0.5 s, three nodes polling every 50 ms."""
    claims: list[tuple[str, Task, float]] = []
    async with SQLiteStore(db_path) as store:
        started = time.monotonic()
        task = (await store.enqueue(Q, "hello", delay_s=1.5)).task
        assert task.run_at == pytest.approx(task.created_at + 1.5, abs=1e-6)
        stop_at = started + 2.5  # a full second (two leases) past run_at

        async def node(name: str) -> None:
            while time.monotonic() < stop_at:
                for claimed in await store.claim(Q, node_id=name, limit=10, lease_s=0.5):
                    claims.append((name, claimed, time.monotonic() - started))
                    await store.complete(claimed, {"by": name})
                await asyncio.sleep(0.05)

        await asyncio.gather(*(node(f"node-{i}") for i in range(3)))
        final = await store.get(task.id)

    assert len(claims) == 1, claims
    name, claimed, elapsed = claims[0]
    assert claimed.id == task.id
    assert claimed.updated_at >= task.run_at  # store clock: never before run_at
    assert elapsed >= 1.5 - 0.005  # wall clock agrees (julianday has ms resolution)
    assert elapsed < 1.5 + 0.5, "three nodes polling every 50 ms should claim it promptly"
    assert final.status is TaskStatus.DONE
    assert final.attempts == 1
    assert final.result == {"by": name}


# --- a held write lock ----------------------------------------------------------------


def hold_write_lock(path: Path) -> sqlite3.Connection:
    raw = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    raw.execute("BEGIN IMMEDIATE")
    raw.execute("CREATE TABLE IF NOT EXISTS other_app (x)")  # someone else's write, in flight
    return raw


@pytest.mark.parametrize("operation", ["claim", "enqueue", "complete"])
async def test_write_waits_for_a_held_lock_instead_of_failing(db_path: Path, operation: str) -> None:
    async with SQLiteStore(db_path) as store:
        await store.enqueue(Q, 1)
        running = (await store.claim(Q, node_id="n", limit=1, lease_s=60))[0]
        await store.enqueue(Q, 2)
        raw = hold_write_lock(db_path)
        released_at: list[float] = []

        def release() -> None:
            raw.execute("COMMIT")
            released_at.append(time.monotonic())

        try:
            loop = asyncio.get_running_loop()
            started = time.monotonic()
            loop.call_later(1.0, release)
            # Readers are not blocked by a writer (WAL).
            stats = await store.stats(Q)
            assert stats.total == 2
            assert time.monotonic() - started < 0.5
            if operation == "claim":
                got = await store.claim(Q, node_id="n", limit=10, lease_s=60)
                assert [t.payload for t in got] == [2]
            elif operation == "enqueue":
                assert (await store.enqueue(Q, 3)).created
            else:
                assert (await store.complete(running)).status is TaskStatus.DONE
            elapsed = time.monotonic() - started
        finally:
            if raw.in_transaction:
                raw.execute("ROLLBACK")
            raw.close()
        assert released_at, "the write finished while the other connection still held the lock"
        assert 0.9 <= elapsed <= 3.0, elapsed


async def test_lock_held_past_busy_timeout_raises_store_busy(db_path: Path) -> None:
    async with SQLiteStore(db_path, config=StoreConfig(busy_timeout_s=0.3)) as store:
        await store.enqueue(Q, 1)
        raw = hold_write_lock(db_path)
        try:
            started = time.monotonic()
            with pytest.raises(StoreBusyError, match="locked") as info:
                await store.claim(Q, node_id="n", limit=1)
            elapsed = time.monotonic() - started
            assert isinstance(info.value.__cause__, sqlite3.OperationalError)
            assert 0.25 <= elapsed < 1.0, elapsed
        finally:
            raw.execute("ROLLBACK")
            raw.close()
        task = (await store.claim(Q, node_id="n", limit=1))[0]  # nothing was claimed by the failed call
        assert task.attempts == 1
        assert task.version == 1


def worker_report(proc: subprocess.Popen[str], timeout_s: float) -> dict[str, Any]:
    out, err = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, f"worker {proc.pid} failed (exit {proc.returncode}):\n{err}"
    assert "database is locked" not in err
    return json.loads(out.splitlines()[-1])


@pytest.mark.multiprocess
async def test_two_processes_drain_under_a_periodic_write_lock(db_path: Path, python) -> None:
    """2 processes x 8 nodes on 500 tasks; a third process holds a write transaction
    0.5 s of every second. No error reaches the nodes; every task is done once."""
    async with SQLiteStore(db_path) as store:
        ids = [r.task.id for r in await store.enqueue_many([NewTask(queue=Q, payload=i) for i in range(500)])]
    locker = python.spawn_worker("locker", str(db_path), "--hold-s", "0.5", "--period-s", "1.0")
    assert locker.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(locker.stdout.readline), 30)
    assert json.loads(line) == {"event": "locked"}
    workers = [
        python.spawn_worker(
            "drain", str(db_path), "--nodes", "8", "--batch", "1", "--lease-s", "30", "--work-s", "0.04", "--barrier"
        )
        for _ in range(2)
    ]
    for proc in workers:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)
        assert json.loads(line) == {"event": "ready"}
    started = time.monotonic()
    for proc in workers:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    reports = [await asyncio.to_thread(worker_report, proc, 90) for proc in workers]
    elapsed = time.monotonic() - started
    assert locker.poll() is None, "the lock holder died early"
    locker.kill()
    locker.wait()

    completed = [i for report in reports for i in report["completed"]]
    assert sorted(completed) == sorted(ids)  # all done, none twice
    assert all(report["lost"] == 0 for report in reports)
    assert all(report["completed"] for report in reports)
    # The lock really got in the way: some write waited most of a 0.5 s hold.
    slowest = max(max(r["max_claim_s"], r["max_complete_s"]) for r in reports)
    assert slowest >= 0.25, (slowest, reports)
    assert elapsed >= 1.0
    with sqlite3.connect(db_path) as raw:
        holds = raw.execute("SELECT count(*) FROM locker_log").fetchone()[0]
        statuses = dict(raw.execute("SELECT status, count(*) FROM coord_tasks GROUP BY status").fetchall())
    raw.close()
    assert holds >= 2
    assert statuses == {"done": 500}


# --- retries --------------------------------------------------------------------------


async def test_retry_gaps_follow_the_policy_on_the_store_clock(make_store, clock: FakeClock) -> None:
    store = await make_store(config=StoreConfig(retry=RETRY))
    # One queue per task, so "nothing claimable yet" is about this task alone.
    tasks = [r.task for r in await store.enqueue_many([NewTask(queue=f"q{i}", payload=i) for i in range(20)])]
    gaps: list[list[float]] = [[] for _ in GAP_BOUNDS]
    for task in tasks:
        for attempt, (low, high) in enumerate(GAP_BOUNDS, start=1):
            claimed = (await store.claim(task.queue, node_id="n", limit=1))[0]
            assert (claimed.id, claimed.attempts) == (task.id, attempt)
            clock.advance(0.01)
            failed = await store.fail(claimed, f"attempt {attempt} failed")
            gap = failed.run_at - failed.updated_at
            assert failed.updated_at == clock.now
            ulp = math.ulp(failed.updated_at)  # run_at is rounded to the store clock's float steps
            assert low - ulp <= gap <= high + ulp, (attempt, gap)
            gaps[attempt - 1].append(gap)
            clock.now = failed.run_at - 1e-6
            assert await store.claim(task.queue, node_id="n", limit=1) == []  # not a microsecond early
            clock.now = failed.run_at
        last = (await store.claim(task.queue, node_id="n", limit=1))[0]
        assert last.attempts == 4
        dead = await store.fail(last, "attempt 4 failed")
        assert dead.status is TaskStatus.DEAD
        assert dead.last_error == "attempt 4 failed"
    for attempt_gaps in gaps:
        assert len(set(attempt_gaps)) >= 15  # jitter is in play (store-clock floats are quantized)
    assert store.events.get(ev.RETRIES) == 60
    assert store.events.get(ev.DEAD_LETTERED) == 20


async def test_retry_on_real_time_never_early_and_short_tasks_go_first(db_path: Path) -> None:
    """An always-failing task on real time, with nodes polling every 10 ms; 20 short tasks
    enqueued after its first failure all finish before its second attempt."""
    events: list[tuple[str, Task]] = []  # ("claim" | "fail" | "short-done", task)
    first_failure = asyncio.Event()
    async with SQLiteStore(db_path, config=StoreConfig(retry=RETRY)) as store:
        failing = (await store.enqueue(Q, "always fails")).task
        dead = asyncio.Event()

        async def node(name: str) -> None:
            while not dead.is_set():
                for task in await store.claim(Q, node_id=name, limit=1, lease_s=5):
                    if task.id == failing.id:
                        events.append(("claim", task))
                        failed = await store.fail(task, f"failure {task.attempts}")
                        events.append(("fail", failed))
                        first_failure.set()
                        if failed.status is TaskStatus.DEAD:
                            dead.set()
                    else:
                        events.append(("short-done", await store.complete(task)))
                await asyncio.sleep(0.01)

        async def producer() -> None:
            await first_failure.wait()
            await store.enqueue_many([NewTask(queue=Q, payload=f"short-{i}") for i in range(20)])

        await asyncio.wait_for(asyncio.gather(producer(), *(node(f"node-{i}") for i in range(3))), 20)

    claims = [t for kind, t in events if kind == "claim"]
    fails = [t for kind, t in events if kind == "fail"]
    shorts = [t for kind, t in events if kind == "short-done"]
    assert [t.attempts for t in claims] == [1, 2, 3, 4]
    assert [t.status for t in fails] == [TaskStatus.PENDING] * 3 + [TaskStatus.DEAD]
    for failed, next_claim, (low, high) in zip(fails[:3], claims[1:], GAP_BOUNDS, strict=True):
        scheduled = failed.run_at - failed.updated_at
        ulp = math.ulp(failed.updated_at)  # run_at is rounded to the store clock's float steps
        assert low - ulp <= scheduled <= high + ulp, scheduled
        assert next_claim.updated_at >= failed.run_at  # never claimed before its run_at
        observed = next_claim.updated_at - failed.updated_at
        assert low <= observed <= high + 0.15, observed  # plus polling and scheduling slack
    assert len(shorts) == 20
    assert max(t.updated_at for t in shorts) < claims[1].updated_at


async def test_tasks_failing_at_the_same_instant_spread_out(make_store, clock: FakeClock) -> None:
    store = await make_store(config=StoreConfig(retry=RETRY))
    await store.enqueue_many([NewTask(queue=Q, payload=i) for i in range(50)])
    claimed = await store.claim(Q, node_id="n", limit=50)
    assert len(claimed) == 50
    failed = [await store.fail(t, "downstream outage") for t in claimed]  # the clock does not move
    run_ats = [t.run_at for t in failed]
    # Jitter is continuous, but run_at is a float near 1.7e9 (steps of ~2.4e-7 s), so a
    # rare pair may coincide (about 1 run in 130); a wall of equal retries cannot.
    assert len(set(run_ats)) >= 45
    ulp = math.ulp(clock.now)  # run_at = now + delay is rounded to this: a delay of 0.18 may read 0.18 - ulp/2
    assert all(0.18 - ulp <= r - clock.now <= 0.22 + ulp for r in run_ats)
    assert max(run_ats) - min(run_ats) > 0.01
    clock.advance(0.2)
    due_now = len(await store.claim(Q, node_id="n", limit=50))
    assert 0 < due_now < 50  # a wave, not a wall


# --- processed-id retention -------------------------------------------------------------


async def test_processed_ids_retention_and_batched_purge(
    make_store, backend: str, db_path: Path, clock: FakeClock
) -> None:
    config = StoreConfig(processed=ProcessedRetention(retention_s=2.0, redelivery_window_s=2.0, purge_batch=100))
    store = await make_store(config=config)
    start = clock.now
    await store.enqueue_many([NewTask(queue=Q, payload=i, idempotency_key=f"msg-{i}") for i in range(1000)])
    claimed = await store.claim(Q, node_id="n", limit=1000)
    assert len(claimed) == 1000
    await asyncio.gather(*(store.complete(t) for t in claimed))
    assert all([await store.is_processed(Q, f"msg-{i}") for i in range(0, 1000, 37)])

    clock.now = start + 1.0  # a redelivery of msg-500 at t = 1 s
    assert (await store.purge_finished(Q, older_than_s=0.5)).deleted == 1000  # even with the task rows gone
    again = await store.enqueue(Q, 500, idempotency_key="msg-500")
    assert await store.claim(Q, node_id="n", limit=10) == []
    skipped = await store.get(again.task.id)
    assert skipped.status is TaskStatus.DONE
    assert skipped.result == {"duplicate": True}
    assert store.events.get(ev.DUPLICATE_DELIVERY_SUPPRESSED) == 1

    clock.now = start + 1.5  # ten newer messages, processed at t = 1.5 s
    await store.enqueue_many([NewTask(queue=Q, payload=i, idempotency_key=f"new-{i}") for i in range(10)])
    for task in await store.claim(Q, node_id="n", limit=10):
        await store.complete(task)

    clock.now = start + 3.0
    result = await store.purge_processed()
    assert (result.deleted, result.batches) == (1000, 10)
    assert not any([await store.is_processed(Q, f"msg-{i}") for i in range(1000)])
    assert all([await store.is_processed(Q, f"new-{i}") for i in range(10)])  # 1.5 s old: kept
    if backend == "sqlite":
        raw = sqlite3.connect(db_path)
        try:
            count, oldest = raw.execute("SELECT count(*), min(processed_at) FROM coord_processed").fetchone()
        finally:
            raw.close()
        assert count == 10
        assert clock.now - oldest <= 2.0


# --- cancellation -----------------------------------------------------------------------


async def test_claim_cancelled_while_its_write_is_in_flight_hands_tasks_back(db_path: Path) -> None:
    async with SQLiteStore(db_path) as store:
        ids = [r.task.id for r in await store.enqueue_many([NewTask(queue=Q, payload=i) for i in range(5)])]
        raw = hold_write_lock(db_path)  # keeps the claim's transaction waiting, i.e. in flight
        try:
            claim = asyncio.create_task(store.claim(Q, node_id="n", limit=5, lease_s=60))
            await asyncio.sleep(0.1)  # the writer takes the claim into its batch within a loop turn
            claim.cancel()
            with pytest.raises(asyncio.CancelledError):
                await claim
        finally:
            raw.execute("COMMIT")
            raw.close()
    # close() ran every queued write, the compensation included.
    async with SQLiteStore(db_path) as store:
        tasks = [await store.get(i) for i in ids]
        stats = await store.stats(Q)
    assert stats.counts[TaskStatus.RUNNING] == 0
    assert stats.counts[TaskStatus.PENDING] == 5
    for task in tasks:
        assert task.version == 2, "the claim must have committed (v1) and been handed back (v2)"
        assert task.attempts == 0
        assert task.lease_token is None


async def test_claims_cancelled_at_random_moments_leave_nothing_leased(db_path: Path) -> None:
    rng = random.Random(2024)
    outcomes: Counter[str] = Counter()
    ours: Counter[int] = Counter()  # claims that reached us (we released those ourselves)
    async with SQLiteStore(db_path) as store:
        ids = [r.task.id for r in await store.enqueue_many([NewTask(queue=Q, payload=i) for i in range(200)])]
        for _ in range(300):
            claim = asyncio.create_task(store.claim(Q, node_id="n", limit=rng.randint(1, 5), lease_s=60))
            for _ in range(rng.randint(0, 12)):
                await asyncio.sleep(0)
            if rng.random() < 0.5:
                await asyncio.sleep(rng.uniform(0, 0.002))
            claim.cancel()
            try:
                got = await claim
            except asyncio.CancelledError:
                outcomes["cancelled"] += 1
            else:
                outcomes["finished first"] += 1
                for task in got:
                    await store.release(task)
                    ours[task.id] += 1
    async with SQLiteStore(db_path) as store:
        tasks = [await store.get(i) for i in ids]
        stats = await store.stats(Q)
    assert stats.counts[TaskStatus.RUNNING] == 0
    assert stats.counts[TaskStatus.PENDING] == 200
    assert all(t.lease_token is None and t.attempts == 0 for t in tasks)
    # Every claim of a task and its hand-back add 2 to its version: those we did not
    # release ourselves were handed back by the store for a cancelled caller.
    assert all(t.version % 2 == 0 for t in tasks)
    handed_back = sum(t.version // 2 - ours[t.id] for t in tasks)
    assert outcomes["cancelled"] > 0
    assert handed_back > 0, outcomes  # some cancellations did land while a claim was in flight


# --- close ------------------------------------------------------------------------------


async def test_close_lets_the_claims_in_flight_finish(make_store) -> None:
    """A claim in flight when close() begins returns what it leased, or raises StoreClosedError
    having leased nothing: every running task was handed to a caller. A call made once close()
    began is refused, and nothing is left for the loop to report."""
    store = await make_store()
    parts = list(range(store.partitions - 1))  # a subset: such claims share one statement on PostgreSQL
    await store.enqueue_many([NewTask(queue=Q, payload=i, partition_key=f"k{i}") for i in range(800)])
    loop = asyncio.get_running_loop()
    reported: list[str] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(str(context.get("message"))))
    handed = 0
    refused = 0
    try:
        for round_, pause_s in enumerate((0.0, 0.001, 0.003, 0.006, 0.01, 0.02)):
            calls = [
                asyncio.ensure_future(
                    store.claim(Q, node_id=f"n{round_}.{i}", limit=3, lease_s=600, partitions=parts if i % 2 else None)
                )
                for i in range(40)
            ]
            await asyncio.sleep(pause_s)
            closing = asyncio.ensure_future(store.close())
            await asyncio.sleep(0)
            with pytest.raises(StoreClosedError):
                await store.claim(Q, node_id="late", limit=3, lease_s=600)
            started = time.monotonic()
            await closing
            assert time.monotonic() - started < 15.0
            for outcome in await asyncio.gather(*calls, return_exceptions=True):
                if isinstance(outcome, BaseException):
                    assert isinstance(outcome, StoreClosedError), repr(outcome)
                    refused += 1
                else:
                    handed += len(outcome)
            await store.open()
            assert (await store.stats(Q)).counts[TaskStatus.RUNNING] == handed, (round_, handed, refused)
        gc.collect()  # an unretrieved exception is reported when its future is collected
        await asyncio.sleep(0.05)
    finally:
        loop.set_exception_handler(previous)
    assert handed > 0
    assert not reported, reported[:3]
