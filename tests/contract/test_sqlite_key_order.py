"""SQLite's per-key order index holds the tasks of ordered queues only (schema revision 6).

Head upkeep reads ``coord_tasks_key_order``, which holds the active tasks flagged ``by_key``
(``asynccoord/backends/sqlite/sql/migration_0006.sql``): those of the queues in
``coord_ordered_queues``. An unordered queue's enqueues and completions never write it. A queue
turns ordered at its first ordered claim, with a backlog claimed, running and dead; a database of
revision 5 is upgraded with ordered queues in it; a process still running the statements of
revision 5 inserts tasks and marks queues ordered. Each must keep every key in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sqlite3
from collections import defaultdict
from pathlib import Path

from asynccoord import NewTask, NodeConfig, Runtime, SQLiteStore, Task, TaskStatus
from asynccoord.backends.sqlfiles import load_migrations, load_queries
from asynccoord.backends.sqlite.store import _split_script

Q = "outbox"
FAST_IDLE = {"idle_min_s": 0.01, "idle_max_s": 0.05}

# Statements of revision 5 (queries.sql before by_key), as a process that opened the database
# before the upgrade still runs them.
REVISION_5_INSERT = """
INSERT INTO coord_tasks (queue, partition_key, partition, idempotency_key, payload, priority,
                         status, is_head, attempts, max_attempts, run_at, version, created_at, updated_at, limit_keys,
                         by_partition)
VALUES (:queue, :partition_key, :partition, NULL, :payload, 0, 'pending',
        EXISTS (SELECT 1 FROM coord_ordered_queues WHERE queue = :queue)
        AND NOT EXISTS (SELECT 1 FROM coord_tasks AS e
                         WHERE e.queue = :queue AND e.partition_key = :partition_key AND e.active = 1)
        AND NOT (EXISTS (SELECT 1 FROM coord_queue_settings WHERE queue = :queue AND dead_letters = 'hold')
                 AND EXISTS (SELECT 1 FROM coord_tasks AS d
                              WHERE d.queue = :queue AND d.partition_key = :partition_key AND d.status = 'dead')),
        0, :max_attempts, 0, 0, 0, 0, NULL,
        EXISTS (SELECT 1 FROM coord_partitioned_queues WHERE queue = :queue))
RETURNING id
"""
REVISION_5_MARK_ORDERED = "INSERT INTO coord_ordered_queues (queue) VALUES (:queue) ON CONFLICT (queue) DO NOTHING"
REVISION_5_RECOMPUTE_QUEUE_HEADS = """
UPDATE coord_tasks SET is_head = 1
 WHERE id IN (SELECT min(id) FROM coord_tasks WHERE queue = :queue AND active = 1 GROUP BY partition_key)
   AND NOT (EXISTS (SELECT 1 FROM coord_queue_settings AS s
                     WHERE s.queue = coord_tasks.queue AND s.dead_letters = 'hold')
       AND EXISTS (SELECT 1 FROM coord_tasks AS d
                    WHERE d.queue = coord_tasks.queue AND d.partition_key = coord_tasks.partition_key
                      AND d.status = 'dead' AND d.id < coord_tasks.id))
"""


def _index_entries(path: Path) -> int:
    """Entries of coord_tasks_key_order, counted in its pages (dbstat): what the index holds, not what a query says."""
    with contextlib.closing(sqlite3.connect(path)) as raw:
        row = raw.execute("SELECT sum(ncell) FROM dbstat WHERE name = 'coord_tasks_key_order'").fetchone()
    return int(row[0])


def _insert_as_revision_5(db: sqlite3.Connection, queue: str, key: str, payload: str, *, max_attempts: int = 5) -> int:
    row = db.execute(
        REVISION_5_INSERT,
        {"queue": queue, "partition_key": key, "partition": 7, "payload": f'"{payload}"', "max_attempts": max_attempts},
    ).fetchone()
    return int(row[0])


async def _drain_in_order(store: SQLiteStore, queue: str) -> list[list[str]]:
    """Claim in order and complete every claim's tasks until none is left: each claim's payloads, sorted."""
    rounds: list[list[str]] = []
    while claimed := await store.claim(queue, node_id="n", limit=100, ordered=True):
        rounds.append(sorted(str(t.payload) for t in claimed))
        await store.complete_many(claimed)
    return rounds


async def test_an_unordered_queue_writes_nothing_to_the_order_index(db_path: Path) -> None:
    async with SQLiteStore(db_path) as store:
        await store.enqueue_many([NewTask(queue=Q, payload=i, partition_key=f"k{i % 7}") for i in range(200)])
        claimed = await store.claim(Q, node_id="n", limit=150)
        await store.complete_many(claimed[:100])  # 100 done, 50 running, 50 pending
        assert _index_entries(db_path) == 0
        await store.enqueue_many([NewTask(queue="ordered", payload=i, partition_key=f"k{i % 3}") for i in range(9)])
        [head] = await store.claim("ordered", node_id="n", limit=1, ordered=True)
        assert _index_entries(db_path) == 9  # the ordered queue's active tasks alone
        await store.complete(head)
        assert _index_entries(db_path) == 8
        assert not await store.is_drained(Q)
        await store.complete_many(await store.claim(Q, node_id="n", limit=100))
        assert not await store.is_drained(Q)  # the 50 left running
        await store.complete_many(claimed[100:])
        assert await store.is_drained(Q)
        assert _index_entries(db_path) == 8
    with contextlib.closing(sqlite3.connect(db_path)) as raw:
        flagged = raw.execute("SELECT queue, count(*) FROM coord_tasks WHERE by_key = 1 GROUP BY queue").fetchall()
    assert flagged == [("ordered", 9)]


async def test_head_upkeep_seeks_the_order_index_and_no_statement_walks_the_table(db_path: Path) -> None:
    async with SQLiteStore(db_path) as store:
        await store.enqueue_many([NewTask(queue=Q, payload=i, partition_key=f"k{i % 5}") for i in range(50)])
        await store.claim(Q, node_id="n", ordered=True)
    queries = load_queries("sqlite")
    values = {"queue": Q, "partition_key": "k1", "keys": f'[["{Q}", "k1"]]', "queues": f'["{Q}"]', "now": 0.0}
    plans: dict[str, list[str]] = {}
    with contextlib.closing(sqlite3.connect(db_path)) as raw:
        for name in (
            "insert_task",
            "promote_heads",
            "recompute_heads",
            "recompute_queue_heads",
            "claim_key_head",
            "queue_unfinished",
        ):
            sql = queries[name]
            params = {p: values.get(p, 1) for p in re.findall(r":(\w+)", sql)}
            plans[name] = [str(r[-1]) for r in raw.execute("EXPLAIN QUERY PLAN " + sql, params)]
    seek = "USING INDEX coord_tasks_key_order (queue=? AND partition_key=?)"
    for name in ("insert_task", "promote_heads", "recompute_heads", "claim_key_head"):
        assert any(line.endswith(seek) for line in plans[name]), (name, plans[name])
    assert "SEARCH coord_tasks USING INDEX coord_tasks_key_order (queue=?)" in plans["recompute_queue_heads"]
    assert [line for line in plans["queue_unfinished"] if line.startswith("SEARCH")] == [
        "SEARCH coord_tasks USING COVERING INDEX coord_tasks_pending (queue=?)",
        "SEARCH coord_tasks USING INDEX coord_tasks_lease_expiry (queue=?)",
    ]
    walks = [
        (name, line) for name, lines in plans.items() for line in lines if re.match(r"SCAN (coord_tasks|t|e|d)\b", line)
    ]
    assert walks == []


async def test_a_queue_turning_ordered_with_a_backlog_keeps_every_key_in_order_across_nodes(db_path: Path) -> None:
    """Tasks enqueued, claimed and left running while the queue was unordered enter the order at its
    first ordered claim: four nodes drain it, with more tasks enqueued meanwhile, and no key ever has
    two tasks in flight or a task sent before an earlier one of its key is done."""
    keys = [f"chat-{i}" for i in range(16)]
    log: list[tuple[str, str, int]] = []  # ("send" or "old-done", key, n), in the order they happened
    in_flight: set[str] = set()
    overlaps: list[str] = []

    async def send(task: Task) -> None:
        key, n = task.payload
        if key in in_flight:
            overlaps.append(key)
        in_flight.add(key)
        log.append(("send", key, n))
        await asyncio.sleep(0)  # let the other nodes' sends interleave
        in_flight.discard(key)

    async with SQLiteStore(db_path) as store:
        await store.enqueue_many([NewTask(queue=Q, payload=[k, n], partition_key=k) for n in range(15) for k in keys])
        firsts = await store.claim(Q, node_id="old", limit=16, lease_s=60.0)  # unordered: each key's task 0
        assert sorted(t.payload[1] for t in firsts) == [0] * 16
        await store.complete_many(firsts[:8])
        running = firsts[8:]  # keys 8-15: their task 0 stays leased to "old" while the nodes start
        held = {t.payload[0] for t in running}
        done_early = {k for k in keys if k not in held}
        sent_of_free_keys = asyncio.Event()
        expected_free = 14 * len(done_early)

        async def watch() -> None:
            while sum(1 for e in log if e[1] in done_early) < expected_free:
                await asyncio.sleep(0.005)
            sent_of_free_keys.set()

        config = NodeConfig(queue=Q, ordered=True, **FAST_IDLE)
        async with Runtime(store, send=send, nodes=4, config=config) as runtime:
            watcher = asyncio.create_task(watch())
            await asyncio.wait_for(sent_of_free_keys.wait(), timeout=20.0)
            await watcher
            # every task of the free keys is sent; none of a key whose task 0 is still running
            assert {e[1] for e in log} == done_early
            more = [NewTask(queue=Q, payload=[k, n], partition_key=k) for n in range(15, 20) for k in keys]
            late = asyncio.create_task(store.enqueue_many(more))  # enqueued while the keys go on
            for task in running:
                log.append(("old-done", task.payload[0], 0))
                await store.complete(task)
            await late
            assert await runtime.wait_until_drained(timeout_s=20.0, poll_s=0.01)
    assert overlaps == []
    by_key: dict[str, list[int]] = defaultdict(list)
    for kind, key, n in log:
        if kind == "send":
            by_key[key].append(n)
    assert {k: by_key[k] for k in keys} == {k: list(range(1, 20)) for k in keys}
    for task in running:  # each held key's task 1 went out only after its task 0 was done
        key = task.payload[0]
        kinds = [kind for kind, k, _ in log if k == key]
        assert kinds[0] == "old-done", (key, kinds[:3])


async def test_dead_tasks_of_a_queue_turning_ordered_rejoin_its_order_when_requeued(db_path: Path) -> None:
    async with SQLiteStore(db_path) as store:
        for n in range(3):
            await store.enqueue(Q, f"a{n}", partition_key="a", max_attempts=1)
        await store.enqueue(Q, "b0", partition_key="b")
        [a0] = await store.claim(Q, node_id="n", limit=1)  # unordered
        assert (await store.fail(a0, "boom")).status is TaskStatus.DEAD
        [a1, b0] = sorted(await store.claim(Q, node_id="n", limit=10, ordered=True), key=lambda t: t.id)
        assert (a1.payload, b0.payload) == ("a1", "b0")
        assert await store.requeue_dead(Q) == 1  # a0 is its key's earliest active task again
        await store.complete_many([a1, b0])
        assert await _drain_in_order(store, Q) == [["a0"], ["a2"]]


async def test_a_hold_queue_turning_ordered_keeps_a_key_with_a_dead_task_held(db_path: Path) -> None:
    async with SQLiteStore(db_path) as store:
        await store.set_dead_letter_policy(Q, "hold")
        for n in range(3):
            await store.enqueue(Q, f"a{n}", partition_key="a", max_attempts=1)
            await store.enqueue(Q, f"b{n}", partition_key="b")
        [a0] = await store.claim(Q, node_id="n", limit=1)  # unordered
        await store.fail(a0, "boom")
        assert await _drain_in_order(store, Q) == [["b0"], ["b1"], ["b2"]]  # key a is held by its dead a0
        assert await store.claimable_partitions(Q, ordered=True) == set()
        await store.enqueue(Q, "a3", partition_key="a")
        assert await _drain_in_order(store, Q) == []
        assert await store.requeue_dead(Q) == 1
        assert await _drain_in_order(store, Q) == [["a0"], ["a1"], ["a2"], ["a3"]]


def _build_revision_5(path: Path) -> None:
    record = "INSERT OR REPLACE INTO coord_meta (key, value) VALUES (?, ?)"
    with contextlib.closing(sqlite3.connect(path)) as raw, raw:
        for number, script in load_migrations("sqlite")[:5]:  # as revision 5's store made it
            for statement in _split_script(script):
                raw.execute(statement)
            raw.execute(record, ("schema_revision", str(number)))
        raw.execute(record, ("partitions", "1024"))


async def test_a_revision_5_database_with_an_ordered_queue_is_upgraded_and_keeps_its_order(db_path: Path) -> None:
    _build_revision_5(db_path)
    with contextlib.closing(sqlite3.connect(db_path)) as raw, raw:
        raw.execute(REVISION_5_MARK_ORDERED, {"queue": Q})
        ids = {p: _insert_as_revision_5(raw, Q, p[0], p) for p in ("a1", "a2", "a3", "b1", "b2", "c1", "c2")}
        for n in range(40):
            _insert_as_revision_5(raw, "plain", f"k{n % 4}", f"p{n}")
        # a1 leased (running, its lease far off), c1 dead: c2 is c's head (the default policy is skip)
        raw.execute(
            "UPDATE coord_tasks SET status = 'running', attempts = 1, lease_owner = 'old', lease_token = 'old.1',"
            " lease_expires_at = 1e12, version = 1 WHERE id = ?",
            (ids["a1"],),
        )
        raw.execute(
            "UPDATE coord_tasks SET status = 'dead', active = 0, is_head = 0, version = 2 WHERE id = ?", (ids["c1"],)
        )
        raw.execute("UPDATE coord_tasks SET is_head = 1 WHERE id = ?", (ids["c2"],))
        heads = raw.execute("SELECT id FROM coord_tasks WHERE is_head = 1 ORDER BY id").fetchall()
        assert heads == [(ids["a1"],), (ids["b1"],), (ids["c2"],)]
    async with SQLiteStore(db_path) as store:
        with contextlib.closing(sqlite3.connect(db_path)) as raw:
            assert raw.execute("SELECT value FROM coord_meta WHERE key = 'schema_revision'").fetchone() == ("6",)
            flagged = raw.execute("SELECT id FROM coord_tasks WHERE by_key = 1 ORDER BY id").fetchall()
        assert [r[0] for r in flagged] == sorted(ids.values())  # the ordered queue's tasks, the dead one too
        assert _index_entries(db_path) == 6  # its active ones
        assert await store.requeue_dead(Q) == 1  # c1 leads its key again
        first = await store.claim(Q, node_id="n", limit=10, ordered=True)
        assert sorted(t.payload for t in first) == ["b1", "c1"]  # a waits for its running a1
        await store.complete(await store.get(ids["a1"]))
        await store.complete_many(first)
        assert await _drain_in_order(store, Q) == [["a2", "b2", "c2"], ["a3"]]
        assert await store.is_drained(Q)
        plain = await store.claim("plain", node_id="n", limit=100)
        assert len(plain) == 40
        await store.complete_many(plain)
        assert await store.is_drained("plain")


async def test_tasks_and_orders_of_a_process_running_revision_5_statements_keep_every_key_in_order(
    db_path: Path,
) -> None:
    async with SQLiteStore(db_path) as store:
        await store.enqueue_many([NewTask(queue=Q, payload=f"{k}{n}", partition_key=k) for n in range(3) for k in "ab"])
        # the older process marks the queue ordered, with its statements: its backlog enters the index
        with contextlib.closing(sqlite3.connect(db_path)) as raw, raw:
            raw.execute(REVISION_5_MARK_ORDERED, {"queue": Q})
            raw.execute(REVISION_5_RECOMPUTE_QUEUE_HEADS, {"queue": Q})
        assert _index_entries(db_path) == 6
        [a0, b0] = sorted(await store.claim(Q, node_id="n", limit=10, ordered=True), key=lambda t: t.id)
        assert (a0.payload, b0.payload) == ("a0", "b0")
        with contextlib.closing(sqlite3.connect(db_path)) as raw, raw:  # and inserts into it
            _insert_as_revision_5(raw, Q, "a", "a3")
            _insert_as_revision_5(raw, Q, "c", "c0")
        assert _index_entries(db_path) == 8
        await store.complete_many([a0, b0])
        assert await _drain_in_order(store, Q) == [["a1", "b1", "c0"], ["a2", "b2"], ["a3"]]
