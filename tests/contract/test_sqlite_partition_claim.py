"""SQLite's claim by per-partition seeks (schema revision 3) meets tasks it did not write itself.

A node owning a small share of the partitions claims by seeking each of them in
``coord_tasks_pending_partition``, which holds only tasks flagged ``by_partition``
(``asynccoord/backends/sqlite/sql/migration_0003.sql``). Tasks written before the database
had that revision, and tasks inserted afterwards by a process still running the statements
of the revision before (it upgrades at its next open), must be claimed all the same.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from asynccoord import NewTask, SQLiteStore
from asynccoord.backends.sqlfiles import load_migrations
from asynccoord.backends.sqlite import seek
from asynccoord.backends.sqlite.store import _split_script

Q = "outbox"


def _insert_as_revision_2(db: sqlite3.Connection, partition: int, key: str) -> int:
    """Insert a due pending task with the columns revision 2's insert_task names (no by_partition)."""
    row = db.execute(
        "INSERT INTO coord_tasks (queue, partition_key, partition, payload, status, max_attempts, run_at,"
        " created_at, updated_at) VALUES (?, ?, ?, 'null', 'pending', 5, 0, 0, 0) RETURNING id",
        (Q, key, partition),
    ).fetchone()
    return int(row[0])


async def test_a_task_an_older_process_inserts_into_a_seeking_queue_is_claimed(db_path: Path) -> None:
    async with SQLiteStore(db_path) as store:
        first = (await store.enqueue(Q, "first", partition_key="chat-1")).task
        mine = [first.partition]
        assert [t.id for t in await store.claim(Q, node_id="n", limit=10, partitions=mine)] == [first.id]
        with contextlib.closing(sqlite3.connect(db_path)) as raw:
            assert raw.execute("SELECT queue FROM coord_partitioned_queues").fetchall() == [(Q,)]  # it sought
            with raw:
                late = _insert_as_revision_2(raw, first.partition, "chat-1")
        claimed = await store.claim(Q, node_id="n", limit=10, partitions=mine)
        assert [t.id for t in claimed] == [late]


async def test_tasks_of_a_revision_2_database_are_claimed_by_seeking_after_the_upgrade(db_path: Path) -> None:
    record = "INSERT OR REPLACE INTO coord_meta (key, value) VALUES (?, ?)"
    with contextlib.closing(sqlite3.connect(db_path)) as raw, raw:
        for number, script in load_migrations("sqlite")[:2]:  # as revision 2's store made it
            for statement in _split_script(script):
                raw.execute(statement)
            raw.execute(record, ("schema_revision", str(number)))
        raw.execute(record, ("partitions", "1024"))
        old = [_insert_as_revision_2(raw, partition, f"chat-{partition}") for partition in (5, 6, 700)]
    async with SQLiteStore(db_path) as store:
        claimed = await store.claim(Q, node_id="n", limit=10, partitions=[5, 6])
        assert sorted(t.id for t in claimed) == old[:2]
        rest = await store.claim(Q, node_id="n", limit=10)
        assert [t.id for t in rest] == old[2:]
    with contextlib.closing(sqlite3.connect(db_path)) as raw:
        revision = raw.execute("SELECT value FROM coord_meta WHERE key = 'schema_revision'").fetchone()
    assert revision == (str(len(load_migrations("sqlite"))),)


async def test_a_backlog_enters_the_index_a_stretch_per_claim_and_claims_walk_meanwhile(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(seek, "FLAG_STRETCH_ROWS", 10)
    monkeypatch.setattr(seek, "FLAG_INTERVAL_S", 0.0)
    async with SQLiteStore(db_path) as store:
        await store.enqueue_many([NewTask(queue="other", payload=i, partition_key=f"o{i}") for i in range(5)])
        created = await store.enqueue_many([NewTask(queue=Q, payload=i, partition_key=f"chat-{i}") for i in range(40)])
        ids = [r.task.id for r in created]
        mine = sorted({r.task.partition for r in created[:4]})
        expected = [r.task.id for r in created if r.task.partition in mine]

        def flagged() -> tuple[int, list[tuple[str]]]:
            with contextlib.closing(sqlite3.connect(db_path)) as raw:
                count = raw.execute("SELECT count(*) FROM coord_tasks WHERE by_partition = 1").fetchone()[0]
                return int(count), raw.execute("SELECT queue FROM coord_partitioned_queues").fetchall()

        seen: list[int] = []
        counts: list[int] = []
        while True:  # 45 rows: four stretches of 10, the fifth reaches the end and registers the queue
            taken = await store.claim(Q, node_id="n", limit=1, partitions=mine)
            seen += [t.id for t in taken]
            count, registered = flagged()
            counts.append(count)
            if registered:
                break
        assert counts == [5, 15, 25, 35, 40]  # tasks of Q only, one stretch of rows per claim
        assert registered == [(Q,)]
        seen += [t.id for t in await store.claim(Q, node_id="n", limit=100, partitions=mine)]  # by seeks now
        assert seen == expected
        late = (await store.enqueue(Q, "late", partition_key="chat-0")).task  # flagged at insert from now on
        assert [t.id for t in await store.claim(Q, node_id="n", limit=100, partitions=mine)] == [late.id]
        assert flagged()[0] == 41
        rest = await store.claim(Q, node_id="n", limit=100)
        assert sorted(t.id for t in rest) == sorted(set(ids) - set(expected))


async def test_a_claim_of_every_partition_takes_all_and_one_missing_a_partition_does_not(db_path: Path) -> None:
    # A claim naming every partition runs with no filter (claim.py, _partition_filter); a list as
    # long as the partition count that repeats one and misses another must keep its filter.
    async with SQLiteStore(db_path) as store:
        parts = store.partitions
        keys = [f"k{i}" for i in range(200)]
        tasks = [(await store.enqueue(Q, i, partition_key=k)).task for i, k in enumerate(keys)]
        missing = tasks[0].partition
        others = [p for p in range(parts) if p != missing]
        nearly = [others[0], *others]  # ``parts`` entries, one repeated, ``missing`` left out
        got = await store.claim(Q, node_id="a", limit=500, partitions=nearly)
        assert [t.id for t in got] == [t.id for t in tasks if t.partition != missing]
        assert await store.claimable_partitions(Q, nearly) == set()
        assert await store.claimable_partitions(Q, range(parts)) == {missing}
        rest = await store.claim(Q, node_id="b", limit=500, partitions=range(parts))
        assert [t.id for t in rest] == [t.id for t in tasks if t.partition == missing]
