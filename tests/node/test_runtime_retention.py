"""The runtime's retention: aged done tasks and processed records are purged, dead tasks kept.

Stores come from the ``make_store`` fixture with ``clock=None`` (real time), so the ages
the purges judge are the store clock's, as in production.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any

import pytest

from asynccoord import InvalidArgumentError, InvalidTypeError, StoreBusyError, StoreConfig, Task, TaskStatus
from asynccoord.config import ProcessedRetention
from asynccoord.node import NodeConfig, Runtime
from asynccoord.node.retention import Retention

QUEUE = "q"


async def _until(check: Any, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


class _Sends:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    async def __call__(self, task: Task) -> None:
        self.counts[task.payload["m"]] += 1
        if task.payload["m"] == "bad":
            raise RuntimeError("refused by the provider")


async def test_aged_done_tasks_are_purged_dead_kept_and_a_redelivery_still_recognised(make_store: Any) -> None:
    store = await make_store(clock=None)
    for m in ("m0", "m1", "m2", "m3", "m4"):
        await store.enqueue(QUEUE, {"m": m}, partition_key=f"chat-{m}", idempotency_key=m)
    await store.enqueue(QUEUE, {"m": "bad"}, partition_key="chat-bad", max_attempts=1)
    sends = _Sends()
    runtime = Runtime(
        store, send=sends, nodes=2, config=NodeConfig(queue=QUEUE), done_retention_s=0.3, purge_interval_s=0.05
    )
    async with runtime:
        assert await runtime.wait_until_drained(timeout_s=15)

        async def done_purged() -> bool:
            return (await store.stats(QUEUE)).counts.get(TaskStatus.DONE, 0) == 0

        await _until(done_purged)
        counts = (await store.stats(QUEUE)).counts
        assert counts.get(TaskStatus.DEAD, 0) == 1  # waits for a person: never purged
        assert runtime.retention is not None
        assert runtime.retention.tasks_deleted == 5
        assert runtime.retention.records_deleted == 0  # the processed records keep their 7 days

        again = await store.enqueue(QUEUE, {"m": "m0"}, partition_key="chat-m0", idempotency_key="m0")
        assert again.created  # its task is gone, so the enqueue creates one...
        assert await runtime.wait_until_drained(timeout_s=15)
    assert sends.counts == {"m0": 1, "m1": 1, "m2": 1, "m3": 1, "m4": 1, "bad": 1}  # ...which is never sent
    assert (await store.get(again.task.id)).status is TaskStatus.DONE  # settled as a duplicate


async def test_without_done_retention_done_tasks_stay_and_processed_records_still_go(make_store: Any) -> None:
    config = StoreConfig(processed=ProcessedRetention(retention_s=0.3, redelivery_window_s=0.0))
    store = await make_store(clock=None, config=config)
    for m in ("m0", "m1", "m2"):
        await store.enqueue(QUEUE, {"m": m}, partition_key=f"chat-{m}", idempotency_key=m)
    sends = _Sends()
    runtime = Runtime(
        store, send=sends, nodes=1, config=NodeConfig(queue=QUEUE), done_retention_s=None, purge_interval_s=0.05
    )
    async with runtime:
        assert await runtime.wait_until_drained(timeout_s=15)
        retention = runtime.retention
        assert retention is not None

        async def records_purged() -> bool:
            return retention.records_deleted == 3

        await _until(records_purged)
        rounds = retention.purges
        await _until(lambda: _at_least(retention, rounds + 3))
        assert (await store.stats(QUEUE)).counts.get(TaskStatus.DONE, 0) == 3
        assert retention.tasks_deleted == 0
        assert retention.records_deleted == 3
    assert sends.counts == {"m0": 1, "m1": 1, "m2": 1}


async def _at_least(retention: Retention, purges: int) -> bool:
    return retention.purges >= purges


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"done_retention_s": -1.0}, InvalidArgumentError),
        ({"done_retention_s": 0}, InvalidArgumentError),
        ({"done_retention_s": float("nan")}, InvalidArgumentError),
        ({"done_retention_s": "1d"}, InvalidTypeError),
        ({"purge_interval_s": 0.0}, InvalidArgumentError),
        ({"purge_interval_s": float("inf")}, InvalidArgumentError),
        ({"purge_interval_s": None}, InvalidTypeError),
    ],
)
async def test_bad_retention_arguments_are_refused(make_store: Any, kwargs: dict[str, Any], error: type) -> None:
    store = await make_store(clock=None)
    with pytest.raises(error):
        Runtime(store, send=_Sends(), config=NodeConfig(queue=QUEUE), **kwargs)


class _BusyOnce:
    """A store whose first processed-record purge finds the database busy."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.failed = False

    async def purge_finished(self, queue: str, *, older_than_s: float) -> Any:
        return await self.store.purge_finished(queue, older_than_s=older_than_s)

    async def purge_processed(self) -> Any:
        if not self.failed:
            self.failed = True
            raise StoreBusyError("database is locked")
        return await self.store.purge_processed()


async def test_a_failed_purge_is_logged_and_tried_again(make_store: Any, caplog: pytest.LogCaptureFixture) -> None:
    store = await make_store(clock=None)
    flaky = _BusyOnce(store)
    retention = Retention(flaky, QUEUE, done_retention_s=60.0, interval_s=0.02)
    with caplog.at_level(logging.WARNING, logger="asynccoord.node.retention"):
        runner = asyncio.create_task(retention.run())
        try:
            await _until(lambda: _at_least(retention, 2))
        finally:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)
    assert flaky.failed
    assert any("purge_failed" in r.getMessage() and "database is locked" in r.getMessage() for r in caplog.records)
