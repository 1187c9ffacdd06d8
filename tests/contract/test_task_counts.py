"""Counts of a queue's tasks (``stats``, ``queue_backlogs``, ``queue_depths``) and the reads behind them.

Every store answers the three reads alike, for every status (the contract). How they read is
checked per engine: SQLite and PostgreSQL count each status in its partial index and find the
oldest due pending task in run_at order, never scanning the task rows (the memory store's
counterpart is in ``test_memory_task_index.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
from typing import Any

import pytest
from services import PG_DSN
from support import FakeClock

from asynccoord import NewTask, TaskStatus
from asynccoord.backends.sqlfiles import load_migrations, load_queries

Q = "jobs"
OTHER = "other"
SQLITE_ONLY = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
POSTGRES_ONLY = pytest.mark.parametrize("backend", ["postgres"], indirect=True)


async def seed(store: Any, clock: FakeClock) -> None:
    """Tasks of ``Q`` and ``OTHER`` in every status, through every transition that moves a count.

    At the end (t = 40 s): ``Q`` has 5 pending (``late``, due at 10 s, is its lowest id; n3..n5,
    due at 5 s, are the oldest due: 35 s; ``far`` is not due), 3 running (n0 and n1 with leases
    expired at 35 s, n2 leased to 105 s), 2 done (``early``, d3), 1 dead (d2), and 3 removed (d0
    and d1 purged, d4 discarded). ``OTHER`` has 2 pending due at 0 s and 1 done.
    """
    await store.enqueue(Q, "late", delay_s=10.0)
    await store.enqueue(Q, "early")
    await store.enqueue(Q, "far", delay_s=1000.0)
    await store.enqueue_many([NewTask(queue=Q, payload=f"d{i}", max_attempts=1) for i in range(5)])
    await store.enqueue_many([NewTask(queue=OTHER, payload=f"o{i}") for i in range(3)])
    first = await store.claim(Q, node_id="n", limit=6)
    assert [t.payload for t in first] == ["early", "d0", "d1", "d2", "d3", "d4"]
    await store.release(first[0])  # "early" pending again, due now
    await store.complete_many(first[1:3])  # d0, d1 done
    for task in first[3:]:
        await store.fail(task, "refused")  # d2, d3, d4 dead: one attempt each
    (other,) = await store.claim(OTHER, node_id="n", limit=1)
    await store.complete(other)
    clock.advance(5)
    assert (await store.purge_finished(Q, older_than_s=1.0)).deleted == 2  # d0, d1
    d2, d3, d4 = await store.dead_letters(Q)
    assert await store.discard_dead(Q, [d4.id]) == 1
    assert await store.requeue_dead(Q, [d3.id]) == 1  # pending, due at 5 s
    await store.enqueue_many([NewTask(queue=Q, payload=f"n{i}") for i in range(6)])
    second = await store.claim(Q, node_id="n", limit=4)
    assert [t.payload for t in second] == ["early", "d3", "n0", "n1"]
    await store.complete_many(second[:2])
    (n2,) = await store.claim(Q, node_id="n", limit=1, lease_s=100.0)
    assert n2.payload == "n2"
    clock.advance(35)
    del d2


def by_value(counts: Any) -> dict[str, int]:
    return {str(status): n for status, n in counts.items()}


async def test_stats_backlogs_and_depths_agree_on_every_status(store: Any, clock: FakeClock) -> None:
    await seed(store, clock)
    stats = await store.stats(Q)
    assert list(stats.counts) == list(TaskStatus)  # every status, in the enum's order
    assert by_value(stats.counts) == {"pending": 5, "running": 3, "done": 2, "dead": 1}
    assert stats.oldest_pending_age_s == pytest.approx(35.0, abs=1e-6)  # n3..n5, not "late" (lowest id)
    other = await store.stats(OTHER)
    assert by_value(other.counts) == {"pending": 2, "running": 0, "done": 1, "dead": 0}
    assert other.oldest_pending_age_s == pytest.approx(40.0, abs=1e-6)
    everything = await store.stats()
    assert list(everything.counts) == list(TaskStatus)
    assert by_value(everything.counts) == {"pending": 7, "running": 3, "done": 3, "dead": 1}
    assert everything.oldest_pending_age_s == pytest.approx(40.0, abs=1e-6)
    nothing = await store.stats("nothing")
    assert by_value(nothing.counts) == {"pending": 0, "running": 0, "done": 0, "dead": 0}
    assert nothing.oldest_pending_age_s is None

    backlogs = await store.queue_backlogs([Q, OTHER, "nothing"])
    assert [(b.queue, b.pending, b.running, b.dead) for b in backlogs] == [
        (Q, 5, 3, 1),
        (OTHER, 2, 0, 0),
        ("nothing", 0, 0, 0),
    ]
    assert [b.oldest_pending_age_s for b in backlogs] == [pytest.approx(35.0, abs=1e-6), pytest.approx(40.0), None]

    depths = await store.queue_depths()
    assert [(d.queue, dict(d.counts), d.expired_leases, d.removed) for d in depths] == [
        (Q, {"pending": 5, "running": 3, "done": 2, "dead": 1}, 2, 3),
        (OTHER, {"pending": 2, "running": 0, "done": 1, "dead": 0}, 0, 0),
    ]
    assert [d.oldest_pending_age_s for d in depths] == [pytest.approx(35.0, abs=1e-6), pytest.approx(40.0)]


async def test_a_queue_whose_tasks_were_all_purged_counts_nothing_but_its_removed(store: Any, clock: FakeClock) -> None:
    await store.enqueue_many([NewTask(queue=Q, payload=i) for i in range(3)])
    await store.complete_many(await store.claim(Q, node_id="n", limit=3))
    clock.advance(10)
    assert (await store.purge_finished(Q, older_than_s=1.0)).deleted == 3
    assert by_value((await store.stats(Q)).counts) == {"pending": 0, "running": 0, "done": 0, "dead": 0}
    assert by_value((await store.stats()).counts) == {"pending": 0, "running": 0, "done": 0, "dead": 0}
    [depth] = await store.queue_depths()
    assert (depth.queue, dict(depth.counts), depth.removed) == (
        Q,
        {"pending": 0, "running": 0, "done": 0, "dead": 0},
        3,
    )


async def test_a_purge_or_a_discard_that_deletes_nothing_makes_no_queue(store: Any, clock: FakeClock) -> None:
    """queue_depths lists a queue with tasks or with tasks removed; a purge or discard of a queue that
    had nothing to delete removed nothing (the memory store listed such a queue, with zeros)."""
    await store.enqueue(OTHER, "kept")
    assert (await store.purge_finished(Q, older_than_s=0.0)).deleted == 0
    assert await store.discard_dead(Q) == 0
    assert await store.discard_dead(OTHER) == 0
    [depth] = await store.queue_depths()
    assert (depth.queue, dict(depth.counts), depth.removed) == (
        OTHER,
        {"pending": 1, "running": 0, "done": 0, "dead": 0},
        0,
    )


# --- SQLite: index entries only ------------------------------------------------------------------


def _sqlite_plan(path: Any, name: str, values: dict[str, Any]) -> list[str]:
    with contextlib.closing(sqlite3.connect(path)) as raw:
        sql = load_queries("sqlite")[name]
        return [row[3] for row in raw.execute("EXPLAIN QUERY PLAN " + sql, values) if "coord_tasks" in row[3]]


@SQLITE_ONLY
async def test_sqlite_counts_read_each_status_in_its_index(make_store: Any, backend: str) -> None:
    """stats() counted by scanning every row of the table (350 ms among 1,000,000 done tasks, on the
    store's connection); queue_depths (status, the dashboard) too."""
    store = await make_store()
    await store.enqueue(Q, "migrated")
    values = {"queue": Q, "now": time.time()}
    assert _sqlite_plan(store.path, "stats_queue", values) == [
        "SEARCH coord_tasks USING COVERING INDEX coord_tasks_pending (queue=?)",
        "SEARCH coord_tasks USING INDEX coord_tasks_lease_expiry (queue=?)",
        "SEARCH coord_tasks USING INDEX coord_tasks_done_age (queue=?)",
        "SEARCH coord_tasks USING INDEX coord_tasks_dead_order (queue=?)",
    ]
    every = [
        "SCAN coord_tasks USING COVERING INDEX coord_tasks_pending",
        "SCAN coord_tasks USING INDEX coord_tasks_lease_expiry",
        "SCAN coord_tasks USING INDEX coord_tasks_done_age",
        "SCAN coord_tasks USING INDEX coord_tasks_dead_order",
    ]
    assert _sqlite_plan(store.path, "stats_all", values) == every
    assert _sqlite_plan(store.path, "queue_depths", {}) == every


# --- PostgreSQL: index entries only, and the oldest due task by a seek ----------------------------


def _scans(node: dict[str, Any]) -> list[dict[str, Any]]:
    own = [node] if node.get("Relation Name") == "coord_tasks" else []
    return own + [s for child in node.get("Plans", []) for s in _scans(child)]


@POSTGRES_ONLY
async def test_postgres_stats_reads_indexes_and_seeks_the_oldest_due_task(make_store: Any, backend: str) -> None:
    """stats() scanned the table to count and read every pending row for min(run_at); now each count
    reads its status's partial index and the oldest due task is one entry of coord_tasks_pending_due."""
    import asyncpg

    from asynccoord.backends.postgres.store import Q as PG_QUERIES

    store = await make_store(clock=None)
    conn = await asyncpg.connect(PG_DSN, server_settings={"search_path": store.schema})
    try:
        await conn.execute(
            """INSERT INTO coord_tasks (queue, partition_key, partition, payload, status, active, is_head,
                                        max_attempts, run_at, created_at, updated_at)
               SELECT $1, 'k' || (i % 97), i % 1024, '"' || repeat('x', 400) || '"',  -- rows as wide as messages
                      CASE WHEN i <= 3000 THEN 'done' ELSE 'pending' END, i > 3000, NULL, 1,
                      1000.0 - i / 10.0, 0, 0
                 FROM generate_series(1, 3400) AS i""",
            Q,
        )
        # Index-only counts need the pages marked all-visible, as they are once autovacuum has
        # passed over old done tasks (the planner weighs the share that is). A snapshot another
        # session holds keeps VACUUM from marking rows newer than it: wait for it to end. (A page
        # the insert added but left empty is never marked: 226 of 227 here.)
        for _ in range(100):
            await conn.execute("VACUUM ANALYZE coord_tasks")
            pages, visible = await conn.fetchrow(
                "SELECT relpages, relallvisible FROM pg_class WHERE oid = 'coord_tasks'::regclass"
            )
            if visible >= 0.95 * pages:
                break
            await asyncio.sleep(0.1)
        assert visible >= 0.95 * pages, f"VACUUM marked {visible} of {pages} pages all-visible: a long transaction?"
        plans = {}
        for name, values in (("stats_queue", {"queue": Q, "now": None}), ("stats_all", {"now": None})):
            query = PG_QUERIES[name]
            text = await conn.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + query.text, *query.args(values))
            plans[name] = _scans(json.loads(text)[0]["Plan"])
    finally:
        await conn.close()
    for name, read in plans.items():
        assert {s["Node Type"] for s in read} <= {"Index Only Scan", "Index Scan"}, (name, read)
        assert {s["Index Name"] for s in read} - {"coord_tasks_pending"} == {
            "coord_tasks_pending_due",
            "coord_tasks_lease_expiry",
            "coord_tasks_done",
            "coord_tasks_dead_order",
        }, name
    seeks = [s for s in plans["stats_queue"] if s["Index Name"] == "coord_tasks_pending_due" and s["Actual Rows"] == 1]
    assert seeks, plans["stats_queue"]  # the oldest due of 400 pending tasks: one entry read
    stats = await store.stats(Q)
    assert by_value(stats.counts) == {"pending": 400, "running": 0, "done": 3000, "dead": 0}
    assert stats.oldest_pending_age_s == pytest.approx(await store.now() - 660.0, abs=1.0)  # i = 3400


@POSTGRES_ONLY
async def test_a_revision_7_postgres_schema_gets_the_run_at_index_and_keeps_its_tasks(
    make_store: Any, backend: str, clock: FakeClock
) -> None:
    import asyncpg

    from asynccoord.backends.postgres.store import SCHEMA_VERSION, PostgresStore

    assert SCHEMA_VERSION == 8
    store = await make_store()  # a schema of its own, made by this version; rebuilt below as revision 7
    schema = store.schema
    await store.close()
    conn = await asyncpg.connect(PG_DSN)
    try:
        await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        await conn.execute(f'CREATE SCHEMA "{schema}"')
        await conn.execute(f'SET search_path = "{schema}"')
        async with conn.transaction():
            for number, script in load_migrations("postgres")[:7]:
                await conn.execute(script)
                await conn.execute(
                    "INSERT INTO coord_meta (key, value) VALUES ('schema_revision', $1)"
                    " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    str(number),
                )
            await conn.execute("INSERT INTO coord_meta (key, value) VALUES ('partitions', '1024')")
        await conn.execute(
            """INSERT INTO coord_tasks (queue, partition_key, partition, payload, status, active, is_head,
                                        max_attempts, run_at, created_at, updated_at)
               VALUES ($1, 'a', 0, '"old"', 'pending', true, NULL, 5, $2, $2, $2),
                      ($1, 'b', 1, '"older"', 'pending', true, NULL, 5, $3, $3, $3),
                      ($1, 'c', 2, '"done"', 'done', false, NULL, 5, $3, $3, $3)""",
            Q,
            clock() - 5.0,
            clock() - 20.0,
        )
        assert await conn.fetchval("SELECT to_regclass('coord_tasks_pending_due')") is None
    finally:
        await conn.close()
    async with PostgresStore(PG_DSN, schema=schema, clock=clock, listen=False) as migrated:
        stats = await migrated.stats(Q)
        assert by_value(stats.counts) == {"pending": 2, "running": 0, "done": 1, "dead": 0}
        assert stats.oldest_pending_age_s == pytest.approx(20.0, abs=1e-6)
        [backlog] = await migrated.queue_backlogs([Q])
        assert (backlog.pending, backlog.oldest_pending_age_s) == (2, pytest.approx(20.0, abs=1e-6))
        assert [t.payload for t in await migrated.claim(Q, node_id="n", limit=5)] == ["old", "older"]
    conn = await asyncpg.connect(PG_DSN, server_settings={"search_path": schema})
    try:
        assert await conn.fetchval("SELECT value FROM coord_meta WHERE key = 'schema_revision'") == "8"
        definition = await conn.fetchval("SELECT indexdef FROM pg_indexes WHERE indexname = 'coord_tasks_pending_due'")
    finally:
        await conn.close()
    assert definition.endswith("USING btree (queue, run_at) WHERE (status = 'pending'::text)")
