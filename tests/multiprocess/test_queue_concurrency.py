"""Real concurrency on a real SQLite file: many nodes, many OS processes, kill -9.

Exactly-once is checked from both sides: the ids each node says it completed (a
completion counts only when ``complete`` returned without error), and the database,
whose ``result`` records which node's commit won.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from asynccoord import LeaseLostError, NewTask, SQLiteStore, Task, TaskStatus
from asynccoord import events as ev

Q = "q"


async def fill(path: Path, n: int, *, chunk: int = 1000) -> list[int]:
    """Enqueue ``n`` tasks with payload ``i``; return their ids in order."""
    ids: list[int] = []
    async with SQLiteStore(path) as store:
        for start in range(0, n, chunk):
            results = await store.enqueue_many(
                [
                    NewTask(queue=Q, payload=i, partition_key=f"conv-{i % 97}")
                    for i in range(start, min(n, start + chunk))
                ]
            )
            ids.extend(r.task.id for r in results)
    assert len(set(ids)) == n
    return ids


async def all_tasks(store: SQLiteStore, ids: list[int]) -> dict[int, Task]:
    return {i: await store.get(i) for i in ids}


async def read_event(proc: subprocess.Popen[str], timeout_s: float = 60.0) -> dict[str, Any]:
    """The next JSON line a worker printed (fails the test on EOF or timeout)."""
    assert proc.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout_s)
    if not line:
        _, err = await asyncio.to_thread(proc.communicate)
        pytest.fail(f"worker {proc.pid} exited with {proc.returncode} before reporting\n{err}")
    return json.loads(line)


async def finish(proc: subprocess.Popen[str], timeout_s: float = 90.0) -> dict[str, Any]:
    """Wait for a worker to exit cleanly; return its last event."""
    out, err = await asyncio.wait_for(asyncio.to_thread(proc.communicate), timeout_s)
    assert proc.returncode == 0, f"worker {proc.pid} exited with {proc.returncode}\n{err}"
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert lines, f"worker {proc.pid} printed nothing\n{err}"
    return lines[-1]


def release_barrier(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()


def task_from_json(data: dict[str, Any]) -> Task:
    return Task(**{**data, "status": TaskStatus(data["status"])})


# --- one process, many nodes ----------------------------------------------------------


async def test_16_nodes_drain_5000_tasks_exactly_once(db_path: Path) -> None:
    ids = await fill(db_path, 5000)
    claims: Counter[int] = Counter()
    completions: Counter[int] = Counter()
    winner: dict[int, str] = {}
    per_node: Counter[str] = Counter()
    async with SQLiteStore(db_path) as store:

        async def node(name: str) -> None:
            while True:
                tasks = await store.claim(Q, node_id=name, limit=16, lease_s=60)
                if not tasks:
                    stats = await store.stats(Q)
                    if stats.counts[TaskStatus.PENDING] == 0 and stats.counts[TaskStatus.RUNNING] == 0:
                        return
                    await asyncio.sleep(0.001)
                    continue
                claims.update(t.id for t in tasks)
                for task in tasks:
                    assert task.lease_owner == name
                    done = await store.complete(task, {"by": name})
                    assert done.status is TaskStatus.DONE
                    completions[task.id] += 1
                    winner[task.id] = name
                    per_node[name] += 1

        started = time.monotonic()
        await asyncio.gather(*(node(f"node-{i}") for i in range(16)))
        elapsed = time.monotonic() - started

        assert set(completions) == set(ids)  # zero lost
        assert max(completions.values()) == 1  # zero duplicates
        assert sum(completions.values()) == 5000
        assert claims == completions  # nothing handed out twice either
        assert len(per_node) == 16, f"some nodes never got work: {per_node}"
        stats = await store.stats(Q)
        assert stats.counts[TaskStatus.DONE] == 5000
        assert stats.total == 5000
        stored = await all_tasks(store, ids)
        for task_id, task in stored.items():
            assert task.status is TaskStatus.DONE
            assert task.attempts == 1
            assert task.version == 2
            assert task.result == {"by": winner[task_id]}
        assert store.events.get(ev.CLAIMS) == 5000
        assert store.events.get(ev.COMMITS) == 5000
        assert store.events.get(ev.STALE_COMMIT_REJECTED) == 0
        assert store.events.get(ev.LEASE_EXPIRED) == 0
        # Group commit: far fewer transactions than the 10,000 claims + completes.
        assert store.transactions < 5000
    print(f"16 nodes drained 5000 tasks in {elapsed:.2f} s ({5000 / elapsed:,.0f} tasks/s)")


async def test_expired_leases_mid_work_are_completed_once(db_path: Path) -> None:
    """Some tasks outlive their lease on the first attempt: the late commit is refused,
    another node re-runs the task, and each task still has exactly one winning commit."""
    ids = await fill(db_path, 1000)
    slow = {i for i in ids if i % 50 == 0}
    lease_s = 0.3
    completions: Counter[int] = Counter()
    lost: Counter[int] = Counter()
    winner: dict[int, str] = {}
    async with SQLiteStore(db_path) as store:

        async def node(name: str) -> None:
            while True:
                tasks = await store.claim(Q, node_id=name, limit=1, lease_s=lease_s)
                if not tasks:
                    stats = await store.stats(Q)
                    if stats.counts[TaskStatus.PENDING] == 0 and stats.counts[TaskStatus.RUNNING] == 0:
                        return
                    await asyncio.sleep(0.005)
                    continue
                for task in tasks:
                    if task.id in slow and task.attempts == 1:
                        await asyncio.sleep(lease_s * 2)  # work that outlives the lease
                    try:
                        await store.complete(task, {"by": name})
                    except LeaseLostError:
                        lost[task.id] += 1
                        continue
                    completions[task.id] += 1
                    winner[task.id] = name

        await asyncio.gather(*(node(f"node-{i}") for i in range(16)))
        assert set(completions) == set(ids)
        assert max(completions.values()) == 1
        assert set(lost) == slow
        assert max(lost.values()) == 1
        stored = await all_tasks(store, ids)
        for task_id, task in stored.items():
            assert task.status is TaskStatus.DONE
            assert task.result == {"by": winner[task_id]}
            assert task.attempts == (2 if task_id in slow else 1)  # a slow task ran twice
        assert store.events.get(ev.STALE_COMMIT_REJECTED) == sum(lost.values())


# --- several OS processes on one file ----------------------------------------------------


@pytest.mark.multiprocess
async def test_4_processes_drain_5000_tasks_exactly_once(db_path: Path, python) -> None:
    ids = await fill(db_path, 5000)
    procs = [python.spawn_worker("drain", str(db_path), "--nodes", "4", "--batch", "32", "--barrier") for _ in range(4)]
    for proc in procs:
        assert (await read_event(proc))["event"] == "ready"
    release_barrier(procs)  # all four start claiming at the same moment
    reports = [await finish(proc) for proc in procs]

    completed_by: dict[int, list[int]] = {
        proc.pid: report["completed"] for proc, report in zip(procs, reports, strict=True)
    }
    everything = [i for done in completed_by.values() for i in done]
    assert sorted(everything) == sorted(ids)  # union is everything, and no id appears twice
    assert all(len(done) > 0 for done in completed_by.values()), {p: len(d) for p, d in completed_by.items()}
    assert all(report["lost"] == 0 for report in reports)
    async with SQLiteStore(db_path) as store:
        stats = await store.stats(Q)
        assert stats.counts[TaskStatus.DONE] == 5000
        assert stats.total == 5000
        stored = await all_tasks(store, ids)
    for pid, done in completed_by.items():
        for task_id in done:
            task = stored[task_id]
            assert task.status is TaskStatus.DONE
            assert task.attempts == 1
            assert task.result["by"].startswith(f"p{pid}-")


@pytest.mark.multiprocess
async def test_kill_9_holder_leases_are_reclaimed_and_its_late_commit_rejected(db_path: Path, python) -> None:
    ids = await fill(db_path, 50)
    lease_s = 2.0
    proc = python.spawn_worker("hold", str(db_path), "--limit", "20", "--lease-s", str(lease_s))
    event = await read_event(proc)
    assert event["event"] == "claimed"
    held = [task_from_json(t) for t in event["tasks"]]
    assert [t.id for t in held] == ids[:20]
    os.kill(proc.pid, signal.SIGKILL)
    await asyncio.to_thread(proc.wait)
    assert proc.returncode == -signal.SIGKILL

    async with SQLiteStore(db_path) as store:
        # Until the dead holder's leases expire, nobody else gets those tasks.
        others = await store.claim(Q, node_id="survivor", limit=100, lease_s=30)
        assert [t.id for t in others] == ids[20:]
        for task in others:
            await store.complete(task, {"by": "survivor"})
        assert [(await store.get(t.id)).status for t in held] == [TaskStatus.RUNNING] * 20

        # After expiry the same claim takes them back: new tokens, one more attempt.
        reclaimed: list[Task] = []
        deadline = time.monotonic() + lease_s + 10
        while len(reclaimed) < 20 and time.monotonic() < deadline:
            reclaimed += await store.claim(Q, node_id="survivor", limit=100, lease_s=30)
            await asyncio.sleep(0.05)  # a node's polling interval
        assert sorted(t.id for t in reclaimed) == ids[:20]
        old = {t.id: t for t in held}
        for task in reclaimed:
            assert task.attempts == 2
            assert task.lease_owner == "survivor"
            assert task.lease_token != old[task.id].lease_token
            assert task.updated_at >= old[task.id].lease_expires_at  # never before the old lease ran out
        assert store.events.get(ev.LEASE_EXPIRED) == 20

        # The killed process's late commit, replayed with its old lease: refused, nothing written.
        before = await all_tasks(store, ids)
        for task in held:
            with pytest.raises(LeaseLostError, match="reclaimed by 'survivor'"):
                await store.complete(task, {"by": "zombie"})
            with pytest.raises(LeaseLostError):
                await store.fail(task, "zombie failure")
            with pytest.raises(LeaseLostError):
                await store.extend(task, 60)
        assert await store.extend_many(held, 60) == [False] * 20
        assert await all_tasks(store, ids) == before

        for task in reclaimed:
            await store.complete(task, {"by": "survivor"})
        for task in held:  # and still refused once the task is done
            with pytest.raises(LeaseLostError, match="done"):
                await store.complete(task, {"by": "zombie"})
        stored = await all_tasks(store, ids)
        assert all(t.status is TaskStatus.DONE and t.result == {"by": "survivor"} for t in stored.values())
        assert (await store.stats(Q)).counts[TaskStatus.DONE] == 50


@pytest.mark.multiprocess
async def test_kill_9_mid_drain_other_process_finishes_exactly_once(db_path: Path, python) -> None:
    ids = await fill(db_path, 1000)
    common = ("--nodes", "4", "--batch", "8", "--lease-s", "1.0", "--work-s", "0.004", "--barrier")
    victim = python.spawn_worker("drain", str(db_path), *common)
    survivor = python.spawn_worker("drain", str(db_path), *common)
    for proc in (victim, survivor):
        assert (await read_event(proc))["event"] == "ready"
    async with SQLiteStore(db_path) as store:
        release_barrier([victim, survivor])
        while (await store.stats(Q)).counts[TaskStatus.DONE] < 150:
            await asyncio.sleep(0.01)
        os.kill(victim.pid, signal.SIGKILL)
        await asyncio.to_thread(victim.wait)
        killed_at = await store.now()
        assert (await store.stats(Q)).counts[TaskStatus.DONE] < 1000, "drained before the kill; make work slower"
        report = await finish(survivor)
        stored = await all_tasks(store, ids)

    assert victim.returncode == -signal.SIGKILL
    assert all(t.status is TaskStatus.DONE for t in stored.values())
    survivor_ids = set(report["completed"])
    assert len(survivor_ids) == len(report["completed"])
    victim_prefix, survivor_prefix = f"p{victim.pid}-", f"p{survivor.pid}-"
    by_victim = {i for i, t in stored.items() if t.result["by"].startswith(victim_prefix)}
    by_survivor = {i for i, t in stored.items() if t.result["by"].startswith(survivor_prefix)}
    assert by_survivor == survivor_ids  # the survivor's successful commits are exactly what it reported
    assert by_victim | by_survivor == set(ids)
    assert not by_victim & by_survivor
    assert by_victim
    # The victim died holding leases; those tasks were re-run by the survivor after expiry.
    rerun = {i for i, t in stored.items() if t.attempts == 2}
    assert rerun, "the victim held no leases when it was killed"
    assert rerun <= by_survivor
    assert all(stored[i].updated_at >= killed_at for i in rerun)
