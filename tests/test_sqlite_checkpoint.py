"""SQLite WAL checkpoints run in the background, on their own connection, not inside commits."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from pathlib import Path

from asynccoord import NewTask, SQLiteStore, StoreConfig, TaskStatus
from asynccoord.backends._checkpoint import SAFETY_NET_PAGES

Q = "outbox"
PAGE = 4096
BIG = "x" * 3000  # about one page per task


def wal_pages(path: Path) -> int:
    wal = Path(f"{path}-wal")
    return os.path.getsize(wal) // PAGE if wal.exists() else 0


async def fill(store: SQLiteStore, batches: int, per_batch: int = 50) -> None:
    for b in range(batches):
        await store.enqueue_many(
            [NewTask(queue=Q, payload={"big": BIG, "n": b * per_batch + i}) for i in range(per_batch)]
        )


async def writer_autocheckpoint(store: SQLiteStore) -> int:
    return int(await store._read(lambda db: db.execute("PRAGMA wal_autocheckpoint").fetchone()[0]))


async def test_commits_do_not_checkpoint_and_the_background_one_does(db_path: Path) -> None:
    # An interval far beyond the test: only checkpoints called here run.
    config = StoreConfig(checkpoint_interval_s=3600)
    async with SQLiteStore(db_path, config=config) as store:
        checkpointer = store._checkpointer
        assert checkpointer is not None
        assert await writer_autocheckpoint(store) == SAFETY_NET_PAGES
        await fill(store, batches=60)  # ~3,000 pages: three times SQLite's automatic threshold
        assert wal_pages(db_path) > 2000  # no commit checkpointed (the log would have restarted)
        assert checkpointer.checkpoints == 0
        await checkpointer.checkpoint()
        assert checkpointer.checkpoints == 1
        assert checkpointer.pages_checkpointed > 2000
        # The log starts over from its beginning at the next write: it does not grow further.
        size = wal_pages(db_path)
        await fill(store, batches=10)
        assert wal_pages(db_path) == size
        assert (await store.stats(Q)).counts[TaskStatus.PENDING] == 3500


async def test_without_background_checkpoints_sqlite_checkpoints_in_the_commit(db_path: Path) -> None:
    async with SQLiteStore(db_path, config=StoreConfig(checkpoint_interval_s=None)) as store:
        assert store._checkpointer is None
        assert await writer_autocheckpoint(store) == 1000
        await fill(store, batches=60)
        assert wal_pages(db_path) < 1300  # restarted after each automatic checkpoint


async def test_checkpoints_follow_commits_on_the_interval(db_path: Path) -> None:
    async with SQLiteStore(db_path, config=StoreConfig(checkpoint_interval_s=0.05)) as store:
        checkpointer = store._checkpointer
        assert checkpointer is not None
        await asyncio.sleep(0.3)
        assert checkpointer.checkpoints == 0  # nothing committed since open: nothing to do
        await fill(store, batches=2)
        for _ in range(100):
            if checkpointer.checkpoints:
                break
            await asyncio.sleep(0.02)
        assert checkpointer.checkpoints >= 1
        assert checkpointer.pages_checkpointed > 0
        # Every committed frame was copied back: another connection finds nothing left to do.
        with sqlite3.connect(db_path) as other:
            busy, log_frames, done = other.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        assert (busy, log_frames) == (0, done)
        quiet = checkpointer.checkpoints
        await asyncio.sleep(0.3)
        assert checkpointer.checkpoints == quiet  # idle store: no more checkpoints


async def test_close_stops_the_checkpointer_and_keeps_the_data(db_path: Path) -> None:
    store = SQLiteStore(db_path, config=StoreConfig(checkpoint_interval_s=0.01))
    await store.open()
    checkpointer = store._checkpointer
    assert checkpointer is not None
    task = checkpointer._task
    assert task is not None
    assert not task.done()
    await fill(store, batches=3)
    await store.close()
    assert task.done()
    assert store._checkpointer is None
    await store.close()  # idempotent
    async with SQLiteStore(db_path) as again:
        assert (await again.stats(Q)).counts[TaskStatus.PENDING] == 150


async def test_read_only_and_memory_stores_run_no_checkpointer(db_path: Path) -> None:
    async with SQLiteStore(db_path) as store:
        await fill(store, batches=1)
    async with SQLiteStore(db_path, read_only=True) as reader:
        assert reader._checkpointer is None
        assert (await reader.stats(Q)).counts[TaskStatus.PENDING] == 50
    async with SQLiteStore(":memory:") as memory:
        assert memory._checkpointer is None
