"""A Runtime stops by itself when its SQLite file is deleted or replaced (a real file).

It surfaces the store's :class:`~asynccoord.errors.StoreFileReplacedError` as it does a
store closed under it: the nodes fail, and ``wait_for_signal`` (and ``shutdown``) raise it.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from asynccoord import NodeConfig, NodeStatus, Runtime, SQLiteStore, StoreFileReplacedError, Task
from asynccoord.backends.sqlite.identity import CHECK_INTERVAL_S

QUEUE = "q"
CONFIG = NodeConfig(queue=QUEUE, idle_min_s=0.01, idle_max_s=0.2)


@pytest.mark.parametrize("how", ["deleted", "replaced"])
async def test_a_runtime_fails_with_the_file_error_when_its_file_is_deleted_or_replaced(
    tmp_path: Path, how: str
) -> None:
    db_path = tmp_path / "coord.db"
    sent: list[int] = []

    async def send(task: Task) -> None:
        sent.append(task.id)

    async with SQLiteStore(db_path) as store:
        runtime = Runtime(store, send=send, nodes=2, config=CONFIG)
        gone = 0.0
        enqueued: list[int] = []

        async def host() -> None:
            nonlocal gone
            async with runtime:
                enqueued.append((await store.enqueue(QUEUE, 1)).task.id)
                assert await runtime.wait_until_drained(timeout_s=10.0, poll_s=0.01)
                for name in (db_path, Path(f"{db_path}-wal"), Path(f"{db_path}-shm")):
                    name.unlink()
                if how == "replaced":
                    async with SQLiteStore(tmp_path / "new.db", wakeup=False):
                        pass
                    os.replace(tmp_path / "new.db", db_path)
                gone = time.monotonic()
                await asyncio.wait_for(runtime.wait_for_signal(), CHECK_INTERVAL_S + 5.0)  # stops by itself

        with pytest.raises(StoreFileReplacedError, match=f"'{db_path}' was {how}"):
            await host()
        assert time.monotonic() - gone <= CHECK_INTERVAL_S + 5.0
        assert sent == enqueued
        statuses = [s.status for s in runtime.states()]
        assert NodeStatus.FAILED in statuses, statuses
        with pytest.raises(StoreFileReplacedError):  # and says so again to whoever asks
            await runtime.shutdown()
