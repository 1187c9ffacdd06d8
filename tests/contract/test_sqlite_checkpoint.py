"""SQLite WAL checkpoints run in the background, on their own connection, ahead of the writer's."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from asynccoord import NewTask, SQLiteStore, StoreClosedError, StoreConfig, TaskStatus

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


async def pending(store: SQLiteStore) -> int:
    return (await store.stats(Q)).counts[TaskStatus.PENDING]


def other_connection_checkpoint(path: Path) -> tuple[int, int, int]:
    """(busy, log frames, frames checkpointed) of a passive checkpoint from another connection."""
    with contextlib.closing(sqlite3.connect(path)) as other:
        busy, log_frames, done = other.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    return int(busy), int(log_frames), int(done)


async def test_the_background_checkpoint_copies_the_log_without_the_writer(db_path: Path) -> None:
    # An interval far beyond the test: only the checkpoint called here runs.
    async with SQLiteStore(db_path, config=StoreConfig(checkpoint_interval_s=3600)) as store:
        checkpointer = store._checkpointer
        assert checkpointer is not None
        await fill(store, batches=8)  # ~400 pages: below SQLite's automatic threshold
        assert wal_pages(db_path) > 350
        assert checkpointer.checkpoints == 0
        await checkpointer.checkpoint()
        assert checkpointer.checkpoints == 1
        assert checkpointer.pages_checkpointed > 350
        busy, log_frames, done = other_connection_checkpoint(db_path)
        assert busy == 0
        assert log_frames == done  # every frame was copied back already
        assert await pending(store) == 400


@pytest.mark.exclusive  # the checkpointer's thread must keep up with the writer: other tests' load starves it
@pytest.mark.parametrize(
    ("interval_s", "bound"),
    [
        (None, 1300),
        # A background checkpoint still running (its sync slowed by the disk) when a commit
        # passes the threshold makes SQLite skip that commit's checkpoint: the log then grows
        # a few commits further before it starts over, but never with what is written.
        (0.05, 2000),
    ],
)
async def test_the_log_stays_bounded_under_sustained_writes(
    db_path: Path, interval_s: float | None, bound: int
) -> None:
    async with SQLiteStore(db_path, config=StoreConfig(checkpoint_interval_s=interval_s)) as store:
        assert (store._checkpointer is None) == (interval_s is None)
        autocheckpoint = await store._read(lambda db: db.execute("PRAGMA wal_autocheckpoint").fetchone()[0])
        assert autocheckpoint == 1000  # SQLite's own, kept: only between transactions can the log restart
        high = 0
        for _ in range(24):
            await fill(store, batches=5)  # ~6,000 pages in all: three times the bound
            high = max(high, wal_pages(db_path))
        assert autocheckpoint < high < bound
        assert await pending(store) == 6000


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
        busy, log_frames, done = other_connection_checkpoint(db_path)
        assert (busy, log_frames) == (0, done)
        # The first checkpoint may have come between the two batches: let the checkpointer
        # catch up with the second (its count still for 4 intervals), then it must stay idle.
        quiet, still_since = checkpointer.checkpoints, time.monotonic()
        while time.monotonic() - still_since < 0.2:
            await asyncio.sleep(0.01)
            if checkpointer.checkpoints != quiet:
                quiet, still_since = checkpointer.checkpoints, time.monotonic()
        assert quiet <= 2  # one per batch at most
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
        assert await pending(again) == 150


async def threads_left(before: set[threading.Thread]) -> list[str]:
    """Names of the threads started since ``before`` that are still alive after up to 2 s.

    Compares thread identities, not counts: a thread left over from an earlier test that ends during
    this one must neither hide a thread this test leaked nor make the count drop below a baseline.
    """
    for _ in range(200):
        new = [t.name for t in threading.enumerate() if t not in before and t.is_alive()]
        if not new:
            break
        await asyncio.sleep(0.01)
    return new


@pytest.mark.parametrize("steps", [0, 1, 2, 3, 5, 8])
async def test_a_cancelled_close_still_shuts_everything_down(db_path: Path, steps: int) -> None:
    before = set(threading.enumerate())
    store = SQLiteStore(db_path, config=StoreConfig(checkpoint_interval_s=0.01))
    await store.open()
    await fill(store, batches=1)
    late = asyncio.ensure_future(store.enqueue(Q, {"late": True}))
    await asyncio.sleep(0)
    closing = asyncio.ensure_future(store.close())
    while store._conn is not None:  # close has begun (a task cancelled before its first step never runs)
        await asyncio.sleep(0)
    for _ in range(steps):
        await asyncio.sleep(0)
    closing.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await closing
    assert await threads_left(before) == []  # the connections' threads ended
    assert not any(t.get_name() == "asynccoord-sqlite-writer" and not t.done() for t in asyncio.all_tasks())
    with pytest.raises(StoreClosedError):
        await store.enqueue(Q, {"after": True})
    await store.close()  # idempotent
    results = await asyncio.gather(late, return_exceptions=True)
    async with SQLiteStore(db_path) as again:
        stored = await pending(again)
    # The enqueue queued before close either committed (close commits what is queued) or was refused.
    assert stored == (51 if not isinstance(results[0], BaseException) else 50)


@pytest.mark.parametrize("steps", [0, 1, 2, 3, 5, 8, 13])
async def test_a_cancelled_open_leaves_the_store_open_with_its_checkpointer_or_closed(
    db_path: Path, steps: int
) -> None:
    before = set(threading.enumerate())
    store = SQLiteStore(db_path, config=StoreConfig(checkpoint_interval_s=0.01))
    opening = asyncio.ensure_future(store.open())
    for _ in range(steps):
        await asyncio.sleep(0)
    opening.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await opening
    if store._conn is not None:  # open finished before the cancellation
        assert store._checkpointer is not None
    else:
        assert store._writer is None
        assert store._checkpointer is None
    await store.close()
    assert await threads_left(before) == []
    async with SQLiteStore(db_path, config=StoreConfig(checkpoint_interval_s=0.01)) as again:
        assert again._checkpointer is not None
        await fill(again, batches=1)
        assert await pending(again) == 50


async def test_read_only_memory_and_uri_stores_run_no_checkpointer(db_path: Path) -> None:
    async with SQLiteStore(db_path) as store:
        await fill(store, batches=1)
    async with SQLiteStore(db_path, read_only=True) as reader:
        assert reader._checkpointer is None
        assert await pending(reader) == 50
    async with SQLiteStore(":memory:") as memory:
        assert memory._checkpointer is None
    async with SQLiteStore("file:asynccoord-test?mode=memory&cache=shared") as uri:
        assert uri._checkpointer is None
