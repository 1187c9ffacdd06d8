"""The SQLite writer task cancelled by someone other than ``close()`` (``asyncio.run`` at a program's exit).

It keeps committing until ``close()`` stops it, or until idle for ``OUTSIDE_IDLE_S``, or
``OUTSIDE_MAX_S`` after the cancellation; once it has ended, every write fails at once with
:class:`~asynccoord.errors.StoreClosedError` instead of waiting for a writer that is gone.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import anyio
import pytest

from asynccoord import SQLiteStore, StoreClosedError, TaskStatus
from asynccoord.backends.sqlite import writer


def writer_task(store: SQLiteStore) -> asyncio.Task[None]:
    assert store._writer is not None
    assert store._writer.task is not None
    return store._writer.task


async def test_a_writer_cancelled_from_outside_commits_on_until_close(db_path: Path) -> None:
    store = SQLiteStore(db_path)
    await store.open()
    task = writer_task(store)
    task.cancel()
    await asyncio.sleep(0.05)
    assert not task.done()
    with anyio.fail_after(5.0):
        enqueued = [await store.enqueue("q", n) for n in range(20)]
        claimed = await store.claim("q", node_id="n", limit=20)
        await store.release(claimed[0], delay_s=0.0)  # a hand-back, as a node's cancellation starts
        await store.close()
    assert task.cancelled()  # the cancellation was delivered, once close() stopped it
    async with SQLiteStore(db_path) as again:
        tasks = [await again.get(e.task.id) for e in enqueued]
    assert {t.id: t.status for t in tasks} == {
        e.task.id: TaskStatus.PENDING if e.task.id == claimed[0].id else TaskStatus.RUNNING for e in enqueued
    }


async def test_a_cancellation_during_a_batch_loses_none_of_its_writes(db_path: Path) -> None:
    async with SQLiteStore(db_path) as store:
        task = writer_task(store)
        writes = [asyncio.ensure_future(store.enqueue("q", n)) for n in range(200)]
        for _ in range(3):  # the writer takes a batch to its thread, where the cancellation cannot stop it
            await asyncio.sleep(0)
        task.cancel()
        with anyio.fail_after(5.0):
            done = await asyncio.gather(*writes)
        assert sorted(e.task.payload for e in done) == list(range(200))
        assert not task.done()
    assert task.cancelled()


async def test_a_writer_cancelled_and_never_stopped_ends_once_idle_and_refuses_writes_at_once(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer, "OUTSIDE_IDLE_S", 0.2)
    async with SQLiteStore(db_path) as store:
        task = writer_task(store)
        await store.enqueue("q", 0)
        task.cancel()
        await asyncio.sleep(0.1)
        await store.enqueue("q", 1)  # within the grace: committed, and the idle wait starts over
        with anyio.fail_after(2.0):
            await asyncio.wait({task})
        assert task.cancelled()
        with anyio.fail_after(1.0), pytest.raises(StoreClosedError, match="writer task has ended"):
            await store.enqueue("q", 2)
    async with SQLiteStore(db_path) as again:
        assert [t.payload for t in await again.claim("q", node_id="n", limit=10)] == [0, 1]


async def test_a_writer_cancelled_and_never_stopped_ends_by_its_cap_even_while_busy(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer, "OUTSIDE_MAX_S", 0.3)
    async with SQLiteStore(db_path) as store:
        task = writer_task(store)
        task.cancel()
        refused = None
        with anyio.fail_after(5.0):
            for n in range(1_000):  # a write every 20 ms: never idle for OUTSIDE_IDLE_S
                try:
                    await store.enqueue("q", n)
                except StoreClosedError as exc:
                    refused = exc
                    break
                await asyncio.sleep(0.02)
        assert refused is not None
        assert task.cancelled()
