"""``dead_letters``: a queue's dead tasks in id order, a keyset page at a time, on every backend.

Every case runs on every store (memory, SQLite, PostgreSQL) on the fake clock. The last
ones read through a store opened read-only, as ``python -m asynccoord status`` and
``dead`` open it, and check that SQLite and PostgreSQL find a page through
``coord_tasks_dead_order`` instead of walking the queue's other tasks.
"""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Any

import pytest
from services import PG_DSN
from support import FakeClock

from asynccoord import InvalidArgumentError, InvalidTypeError, ReadOnlyStoreError, Task, TaskStatus
from asynccoord.cli.status import open_status_store
from asynccoord.contract.queue import MAX_DEAD_LETTERS_LIMIT

POSTGRES_ONLY = pytest.mark.parametrize("backend", ["postgres"], indirect=True)
SHARED = pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)  # stores of one database
SQLITE_ONLY = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)

Q = "outbox"


async def make_dead(store: Any, clock: FakeClock, specs: list[tuple[str, str]], *, queue: str = Q) -> list[int]:
    """Enqueue one task per ``(partition_key, payload)``, each with one attempt, and fail each: their ids.

    The clock moves one second before each failure, so the tasks die at distinct times.
    """
    ids = [(await store.enqueue(queue, payload, partition_key=key, max_attempts=1)).task.id for key, payload in specs]
    claimed = {t.id: t for t in await store.claim(queue, node_id="n", limit=len(ids))}
    assert sorted(claimed) == sorted(ids)
    for task_id in ids:
        clock.advance(1.0)
        dead = await store.fail(claimed[task_id], f"provider said no to {task_id}")
        assert dead.status is TaskStatus.DEAD
    return ids


async def listed(store: Any, queue: str = Q, **kwargs: Any) -> list[int]:
    return [t.id for t in await store.dead_letters(queue, **kwargs)]


async def test_dead_tasks_of_the_queue_only_in_id_order_with_what_killed_them(store, clock: FakeClock) -> None:
    # Keys interleaved so that key order and id order differ: the listing is by id.
    dead = await make_dead(store, clock, [("chat-b", "b1"), ("chat-a", "a1"), ("chat-b", "b2"), ("chat-a", "a2")])
    died_at = [clock.now - 3.0, clock.now - 2.0, clock.now - 1.0, clock.now]
    await make_dead(store, clock, [("chat-a", "other queue")], queue="other")
    await store.enqueue(Q, "done", partition_key="chat-c")
    (claimed,) = await store.claim(Q, node_id="n", limit=10)
    await store.complete(claimed)
    await store.enqueue(Q, "running", partition_key="chat-d")
    await store.claim(Q, node_id="n", limit=10)
    await store.enqueue(Q, "pending", partition_key="chat-a")
    assert (await store.stats(Q)).counts == {
        TaskStatus.PENDING: 1,
        TaskStatus.RUNNING: 1,
        TaskStatus.DONE: 1,
        TaskStatus.DEAD: 4,
    }

    tasks = await store.dead_letters(Q)
    assert [t.id for t in tasks] == dead
    assert all(isinstance(t, Task) and t.status is TaskStatus.DEAD and t.queue == Q for t in tasks)
    assert [t.partition_key for t in tasks] == ["chat-b", "chat-a", "chat-b", "chat-a"]
    assert [t.payload for t in tasks] == ["b1", "a1", "b2", "a2"]
    assert [(t.attempts, t.max_attempts) for t in tasks] == [(1, 1)] * 4
    assert [t.last_error for t in tasks] == [f"provider said no to {i}" for i in dead]
    assert [t.updated_at for t in tasks] == pytest.approx(died_at)
    assert [t.lease_token for t in tasks] == [None] * 4
    assert await listed(store, "other") != []
    assert await listed(store, "nothing-here") == []


async def test_pages_follow_each_other_by_after_id(store, clock: FakeClock) -> None:
    dead = await make_dead(store, clock, [(f"chat-{i % 3}", f"m{i}") for i in range(7)])
    pages: list[list[int]] = []
    after = None
    while True:
        page = await listed(store, limit=3, after_id=after)
        pages.append(page)
        if len(page) < 3:
            break
        after = page[-1]
    assert pages == [dead[0:3], dead[3:6], dead[6:7]]
    assert await listed(store, limit=3, after_id=0) == dead[:3]  # ids start above 0: the same as None
    assert await listed(store, after_id=dead[2]) == dead[3:]
    assert await listed(store, after_id=dead[2] + 1) == [i for i in dead if i > dead[2] + 1]
    assert await listed(store, after_id=dead[-1]) == []
    assert await listed(store, after_id=2**63 - 1) == []
    assert await listed(store, limit=1) == dead[:1]
    assert await listed(store, limit=MAX_DEAD_LETTERS_LIMIT) == dead


async def test_requeued_and_discarded_tasks_leave_the_list_and_a_task_dying_again_comes_back(
    store, clock: FakeClock
) -> None:
    a, b, c = await make_dead(store, clock, [("chat-a", "a"), ("chat-b", "b"), ("chat-c", "c")])
    assert await store.requeue_dead(Q, [a]) == 1
    assert await store.discard_dead(Q, [b]) == 1
    assert await listed(store) == [c]
    (again,) = await store.claim(Q, node_id="n", limit=10)
    assert again.id == a
    await store.fail(again, "still no")
    tasks = await store.dead_letters(Q)
    assert [(t.id, t.last_error) for t in tasks] == [(a, "still no"), (c, f"provider said no to {c}")]


@pytest.mark.parametrize(
    ("kwargs", "error", "named"),
    [
        ({"queue": ""}, InvalidArgumentError, "queue must not be empty"),
        ({"queue": "  "}, InvalidArgumentError, "queue must not be only whitespace"),
        ({"queue": "x" * 256}, InvalidArgumentError, "queue"),
        ({"queue": None}, InvalidTypeError, "queue must be a str"),
        ({"queue": 5}, InvalidTypeError, "queue must be a str"),
        ({"limit": 0}, InvalidArgumentError, "limit must be >= 1, got 0"),
        ({"limit": -3}, InvalidArgumentError, "limit must be >= 1, got -3"),
        ({"limit": MAX_DEAD_LETTERS_LIMIT + 1}, InvalidArgumentError, f"limit must be <= {MAX_DEAD_LETTERS_LIMIT}"),
        ({"limit": True}, InvalidTypeError, "limit must be an int, got bool"),
        ({"limit": 2.0}, InvalidTypeError, "limit must be an int, got float"),
        ({"limit": "10"}, InvalidTypeError, "limit must be an int, got str"),
        ({"limit": None}, InvalidTypeError, "limit must be an int, got NoneType"),
        ({"after_id": -1}, InvalidArgumentError, "after_id must be >= 0, got -1"),
        ({"after_id": 2**63}, InvalidArgumentError, "after_id must be <= 9223372036854775807"),
        ({"after_id": "3"}, InvalidTypeError, "after_id must be an int, got str"),
        ({"after_id": False}, InvalidTypeError, "after_id must be an int, got bool"),
        ({"after_id": 1.5}, InvalidTypeError, "after_id must be an int, got float"),
    ],
)
async def test_bad_arguments_raise_typed_errors_naming_them_and_change_nothing(
    store, clock: FakeClock, kwargs: dict[str, Any], error: type[Exception], named: str
) -> None:
    dead = await make_dead(store, clock, [("chat-a", "a"), ("chat-b", "b")])
    before = (await store.stats(Q)).counts
    kwargs = dict(kwargs)  # the parameters are shared by the backends
    queue = kwargs.pop("queue", Q)
    with pytest.raises(error) as raised:
        await store.dead_letters(queue, **kwargs)
    assert named in str(raised.value)
    assert (await store.stats(Q)).counts == before
    assert await listed(store) == dead
    assert [(await store.get(i)).status for i in dead] == [TaskStatus.DEAD] * 2


@SHARED
async def test_a_store_opened_read_only_lists_dead_tasks(make_store, backend: str, clock: FakeClock) -> None:
    """Through the read path of ``status`` (and of ``dead``): SQLite ``mode=ro``, PostgreSQL ``read_only=True``."""
    writer = await make_store()
    dead = await make_dead(writer, clock, [("chat-a", "a"), ("chat-b", "b"), ("chat-a", "c")])
    await writer.set_dead_letter_policy(Q, "hold")
    target = str(writer.path) if backend == "sqlite" else PG_DSN
    schema = None if backend == "sqlite" else writer.schema
    async with open_status_store(target, schema=schema) as (reader, _label):
        assert reader.read_only
        tasks = await reader.dead_letters(Q, limit=2)
        assert [t.id for t in tasks] == dead[:2]
        assert [t.payload for t in tasks] == ["a", "b"]
        assert await listed(reader, after_id=dead[1]) == dead[2:]
        assert await reader.dead_letter_policies() == {Q: "hold"}
        with pytest.raises(ReadOnlyStoreError):
            await reader.requeue_dead(Q, dead)
        with pytest.raises(ReadOnlyStoreError):
            await reader.discard_dead(Q)
        await writer.requeue_dead(Q, [dead[0]])  # the writer goes on while the reader is open
        assert await listed(reader) == dead[1:]
    assert await listed(writer) == dead[1:]


@SQLITE_ONLY
async def test_sqlite_finds_a_page_by_a_seek_of_the_dead_tasks_index(make_store, backend: str) -> None:
    store = await make_store()
    await store.enqueue(Q, "x")
    with contextlib.closing(sqlite3.connect(store.path)) as raw:
        from asynccoord.backends.sqlfiles import load_queries

        sql = load_queries("sqlite")["dead_letters"]
        plan = [row[3] for row in raw.execute("EXPLAIN QUERY PLAN " + sql, {"queue": Q, "after_id": 5, "limit": 10})]
    assert plan == ["SEARCH coord_tasks USING INDEX coord_tasks_dead_order (queue=? AND id>?)"]


@POSTGRES_ONLY
async def test_postgres_reads_about_one_page_of_rows_among_many_live_and_dead_tasks(
    make_store, backend: str, clock: FakeClock
) -> None:
    """20,000 tasks of the queue, one in 200 dead, and 2,000 of another queue, one in 10 dead: a page
    of 10 from the middle reads 10 index entries and 10 rows (a walk of the primary key would
    read 2,000, a sort every dead task of the queue)."""
    import json

    import asyncpg

    from asynccoord.backends.postgres.store import Q as PG_QUERIES

    store = await make_store()
    await store.enqueue(Q, "migrated")  # the schema exists
    conn = await asyncpg.connect(PG_DSN, server_settings={"search_path": store.schema})
    try:
        await conn.execute(
            """INSERT INTO coord_tasks (queue, partition_key, partition, payload, status, active, is_head,
                                        max_attempts, run_at, created_at, updated_at, last_error)
               SELECT CASE WHEN i <= 20000 THEN $1 ELSE 'other' END, 'k' || (i % 97), i % 1024, 'null',
                      CASE WHEN i % 200 = 0 OR (i > 20000 AND i % 10 = 0) THEN 'dead' ELSE 'done' END,
                      false, false, 1, 0, 0, 0, 'no'
                 FROM generate_series(1, 22000) AS i""",
            Q,
        )
        await conn.execute("ANALYZE coord_tasks")
        ids = [r[0] for r in await conn.fetch("SELECT id FROM coord_tasks WHERE queue = $1 AND status = 'dead'", Q)]
        ids.sort()
        assert len(ids) == 100
        query = PG_QUERIES["dead_letters"]
        values = {"queue": Q, "after_id": ids[50], "limit": 10}
        text = await conn.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + query.text, *query.args(values))
        plan = json.loads(text)[0]["Plan"]
        rows = await conn.fetch(query.text, *query.args(values))
    finally:
        await conn.close()
    assert [r[0] for r in rows] == ids[51:61]

    def scans(node: dict[str, Any]) -> list[dict[str, Any]]:
        own = [node] if node.get("Relation Name") == "coord_tasks" else []
        return own + [s for child in node.get("Plans", []) for s in scans(child)]

    (scan,) = scans(plan)
    assert scan["Node Type"] == "Index Scan"
    assert scan["Index Name"] == "coord_tasks_dead_order"
    assert scan["Actual Rows"] * scan["Actual Loops"] == 10
    assert scan.get("Rows Removed by Filter", 0) == 0


async def test_dead_tasks_of_a_revision_3_sqlite_database_are_listed_after_the_upgrade(db_path) -> None:
    from asynccoord import SQLiteStore
    from asynccoord.backends.sqlfiles import load_migrations
    from asynccoord.backends.sqlite.store import _split_script

    record = "INSERT OR REPLACE INTO coord_meta (key, value) VALUES (?, ?)"
    with contextlib.closing(sqlite3.connect(db_path)) as raw, raw:
        for number, script in load_migrations("sqlite")[:3]:  # as revision 3's store made it
            for statement in _split_script(script):
                raw.execute(statement)
            raw.execute(record, ("schema_revision", str(number)))
        raw.execute(record, ("partitions", "1024"))
        old = [
            raw.execute(
                "INSERT INTO coord_tasks (queue, partition_key, partition, payload, status, active, attempts,"
                " max_attempts, run_at, created_at, updated_at, last_error)"
                " VALUES (?, ?, 0, '\"m\"', ?, 0, 1, 1, 0, 0, 0, 'no') RETURNING id",
                (Q, f"chat-{i % 2}", "dead" if i % 3 else "done"),
            ).fetchone()[0]
            for i in range(9)
        ]
    async with SQLiteStore(db_path) as store:  # migrates
        assert await listed(store) == [i for n, i in enumerate(old) if n % 3]
    with contextlib.closing(sqlite3.connect(db_path)) as raw:
        names = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert "coord_tasks_dead_order" in names
