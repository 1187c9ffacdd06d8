"""Nodes in real OS processes on one real SQLite file (tests/workers/node_worker.py).

Each process hosts a Runtime whose nodes take a per-account lock (a semaphore of one
permit) before every send; the sends log what they did to a shared file, and a
trigger installed by the test on the database records every commit (every update
that sets a task ``done``), so "committed exactly once" is read from the database
itself, not from what the processes say.

The partition mapping across processes with different ``PYTHONHASHSEED`` values is
checked by ``tests/contract/test_partition.py::test_golden_file_matches_processes_with_other_hash_seeds``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import signal
import sqlite3
import subprocess
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from support import TESTS

from asynccoord import NewTask, SQLiteStore, owner_of

pytestmark = pytest.mark.multiprocess

WORKER = str(TESTS / "workers" / "node_worker.py")
QUEUE = "outbox"

COMMIT_LOG_SQL = """
CREATE TABLE commit_log (task_id INTEGER NOT NULL, result TEXT, at REAL NOT NULL);
CREATE TRIGGER commit_logger AFTER UPDATE OF status ON coord_tasks WHEN NEW.status = 'done'
BEGIN
    INSERT INTO commit_log (task_id, result, at) VALUES (NEW.id, NEW.result, (julianday('now') - 2440587.5) * 86400.0);
END;
"""


async def setup_db(path: Path, *, tasks: int, conversations: int, accounts: int, seed: int) -> dict[int, str]:
    """Create the schema, enqueue ``tasks`` over random conversations, install the commit log.

    A conversation belongs to one account (``conv % accounts``). Returns id -> conversation.
    """
    rng = random.Random(seed)
    convs = [rng.randrange(conversations) for _ in range(tasks)]
    async with SQLiteStore(path) as store:
        results = await store.enqueue_many(
            [
                NewTask(
                    queue=QUEUE, payload={"account": c % accounts}, partition_key=f"conv-{c}", idempotency_key=f"m{i}"
                )
                for i, c in enumerate(convs)
            ]
        )
    with sqlite3.connect(path, isolation_level=None) as db:
        db.executescript(COMMIT_LOG_SQL)
    return {r.task.id: r.task.partition_key for r in results}


class Worker:
    """One node_worker.py process; a thread reads its JSON lines into ``events``."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.events: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._eof = False
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.events.append(json.loads(line))
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def _wait_sync(self, kind: str, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                for event in self.events:
                    if event["event"] == kind:
                        return event
                left = deadline - time.monotonic()
                if self._eof or left <= 0:
                    break
                self._cond.wait(left)
        stderr = ""
        if self._eof and self.proc.stderr is not None:
            stderr = self.proc.stderr.read()
        pytest.fail(
            f"no {kind!r} event from pid {self.proc.pid} (eof={self._eof}); events {self.events[-5:]}\n{stderr}"
        )

    async def wait_for(self, kind: str, timeout_s: float = 30.0) -> dict[str, Any]:
        """The first event of that kind (waiting up to ``timeout_s``)."""
        return await asyncio.to_thread(self._wait_sync, kind, timeout_s)

    def views(self) -> list[dict[str, Any]]:
        with self._cond:
            return [e for e in self.events if e["event"] == "view"]

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()


def spawn(python: Any, db_path: Path, log: Path, *args: str) -> Worker:
    return Worker(
        python.spawn([WORKER, "drain", str(db_path), "--log", str(log), "--queue", QUEUE, "--barrier", *args])
    )


def read_log(log: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(begin lines, send lines) of the shared send log."""
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    return [x for x in lines if x["kind"] == "begin"], [x for x in lines if x["kind"] == "send"]


def db_rows(path: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as db:
        return db.execute(sql, params).fetchall()


def assert_accounts_never_overlap(sends: list[dict[str, Any]]) -> None:
    by_account: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for s in sends:
        by_account[s["account"]].append(s)
    for account, items in by_account.items():
        items.sort(key=lambda s: s["start"])
        for before, after in itertools.pairwise(items):
            assert after["start"] >= before["end"], (account, before, after)


def assert_conversations_in_order(sends: list[dict[str, Any]]) -> None:
    """Each conversation's sends run one after the other, in enqueue (id) order."""
    by_conv: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in sends:
        by_conv[s["conv"]].append(s)
    for conv, items in by_conv.items():
        items.sort(key=lambda s: s["start"])
        ids = [s["id"] for s in items]
        assert ids == sorted(ids), (conv, ids)
        for before, after in itertools.pairwise(items):
            assert after["start"] >= before["end"], (conv, before, after)


def assert_committed_once(db_path: Path, ids: set[int]) -> dict[int, dict[str, Any]]:
    """Every task done, each committed by exactly one update; return id -> committed result."""
    assert db_rows(db_path, "SELECT status, count(*) FROM coord_tasks GROUP BY status") == [("done", len(ids))]
    commits = db_rows(db_path, "SELECT task_id, result FROM commit_log")
    per_task = Counter(task_id for task_id, _ in commits)
    assert set(per_task) == ids
    assert [t for t, n in per_task.items() if n != 1] == []
    return {task_id: json.loads(result) for task_id, result in commits}


@pytest.mark.slow
async def test_two_processes_of_16_nodes_drain_10000_tasks_with_account_semaphores(
    python: Any, db_path: Path, tmp_path: Path
) -> None:
    conv_of = await setup_db(db_path, tasks=10_000, conversations=1_000, accounts=20, seed=4)
    log = tmp_path / "sends.jsonl"
    args = ("--nodes", "16", "--max-in-flight", "4", "--claim-batch", "4", "--send-min-s", "0", "--send-max-s", "0.002")
    workers = [spawn(python, db_path, log, *args) for _ in range(2)]
    for w in workers:
        await w.wait_for("ready")
    for w in workers:
        w.go()
    done = [await w.wait_for("done", timeout_s=100.0) for w in workers]
    for w in workers:
        assert await asyncio.to_thread(w.proc.wait, 10) == 0

    ids = set(conv_of)
    results = assert_committed_once(db_path, ids)
    begins, sends = read_log(log)
    assert len(begins) == len(sends) == len(ids)  # every task sent once, none twice
    assert {s["id"] for s in sends} == ids
    # each process's nodes committed what they sent: the sum is every task, once
    assert sum(d["committed"] for d in done) == len(ids)
    assert all(d["conflicts"] == 0 for d in done)
    pids = {s["pid"] for s in sends}
    assert pids == {w.proc.pid for w in workers}  # both processes did work
    sender = {s["id"]: (s["pid"], s["node"]) for s in sends}
    assert all((r["pid"], r["node"]) == sender[i] for i, r in results.items())  # the sender committed it
    assert all(s["conv"] == conv_of[s["id"]] for s in sends)
    assert_accounts_never_overlap(sends)
    assert_conversations_in_order(sends)
    # one permit per account: the fencing tokens of an account's sends never go back in time order
    by_account: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for s in sends:
        by_account[s["account"]].append(s)
    for items in by_account.values():
        items.sort(key=lambda s: s["start"])
        tokens = [s["fencing_token"] for s in items]
        assert tokens == sorted(tokens), tokens[:20]


async def test_killed_process_partitions_move_to_the_survivor_and_all_ends_done_once(
    python: Any, db_path: Path, tmp_path: Path
) -> None:
    ttl_s, lease_s = 1.0, 2.0
    conv_of = await setup_db(db_path, tasks=3_000, conversations=300, accounts=20, seed=7)
    ids = set(conv_of)
    log = tmp_path / "sends.jsonl"
    args = (
        "--nodes",
        "4",
        "--max-in-flight",
        "4",
        "--claim-batch",
        "4",
        "--send-min-s",
        "0.002",
        "--send-max-s",
        "0.006",
        "--lease-s",
        str(lease_s),
        "--lock-ttl-s",
        "2.0",
        "--heartbeat-ttl-s",
        str(ttl_s),
    )
    doomed, survivor = spawn(python, db_path, log, *args), spawn(python, db_path, log, *args)
    doomed_ids = set((await doomed.wait_for("ready"))["node_ids"])
    survivor_ids = set((await survivor.wait_for("ready"))["node_ids"])
    doomed.go()
    survivor.go()

    # Both processes must be live in the survivor's view, and real work done by both, before the kill.
    deadline = time.monotonic() + 30.0
    while True:
        views = survivor.views()
        both = bool(views) and set(views[-1]["node_ids"]) == doomed_ids | survivor_ids
        (committed,) = db_rows(db_path, "SELECT count(*) FROM commit_log")[0]
        if both and committed >= 600:
            break
        assert time.monotonic() < deadline, (views[-1:], committed)
        await asyncio.sleep(0.02)
    assert survivor.views()[-1]["owned"] < 1024  # it shares the partitions with the doomed process
    killed_at = time.monotonic()
    os.kill(doomed.proc.pid, signal.SIGKILL)
    assert await asyncio.to_thread(doomed.proc.wait, 10) == -signal.SIGKILL
    # The dead process's work in flight: still leased to its nodes (nobody else can touch it yet).
    rows = db_rows(db_path, "SELECT id, lease_owner FROM coord_tasks WHERE status = 'running'")
    in_flight = {task_id for task_id, owner in rows if owner in doomed_ids}
    undone_at_kill = {task_id for (task_id,) in db_rows(db_path, "SELECT id FROM coord_tasks WHERE status != 'done'")}
    assert len(undone_at_kill) > 500  # killed well before the end

    done = await survivor.wait_for("done", timeout_s=60.0)
    assert await asyncio.to_thread(survivor.proc.wait, 10) == 0

    # Its partitions moved to the survivor within the heartbeat TTL (plus one heartbeat interval).
    after = [v for v in survivor.views() if v["t"] > killed_at and not doomed_ids & set(v["node_ids"])]
    assert after, survivor.views()
    moved = after[0]
    assert moved["t"] - killed_at <= ttl_s + ttl_s / 3 + 0.3, moved["t"] - killed_at
    assert set(moved["node_ids"]) == survivor_ids
    assert moved["owned"] == 1024

    results = assert_committed_once(db_path, ids)
    begins, sends = read_log(log)
    by_pid: dict[int, list[int]] = defaultdict(list)
    for b in begins:
        by_pid[b["pid"]].append(b["id"])
    doomed_sent = Counter(by_pid[doomed.proc.pid])
    survivor_sent = Counter(by_pid[survivor.proc.pid])
    assert set(doomed_sent) | set(survivor_sent) == ids
    assert max(survivor_sent.values()) == 1
    assert max(doomed_sent.values()) == 1
    # Sends were duplicated only for tasks the killed process had in flight...
    twice = set(doomed_sent) & set(survivor_sent)
    assert twice <= in_flight
    # ...and those were reclaimed once their lease expired (counted once each) and committed once.
    assert in_flight <= undone_at_kill
    assert done["events"].get("lease_expired", 0) == len(in_flight)
    # Everything left at the kill was committed by the survivor, and it committed what it says it did.
    assert {i for i in undone_at_kill if results[i]["pid"] != survivor.proc.pid} == set()
    assert sum(1 for r in results.values() if r["pid"] == survivor.proc.pid) == done["committed"]
    assert_accounts_never_overlap(sends)
    assert_conversations_in_order(sends)
    # The survivor did work in partitions the doomed nodes owned while both were alive.
    all_nodes = sorted(doomed_ids | survivor_ids)
    partition_of = dict(db_rows(db_path, "SELECT id, partition FROM coord_tasks"))
    taken_over = [
        i
        for i, r in results.items()
        if r["pid"] == survivor.proc.pid and owner_of(partition_of[i], all_nodes) in doomed_ids
    ]
    assert len(taken_over) > 100
