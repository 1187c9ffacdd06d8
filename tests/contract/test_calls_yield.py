"""Every store call hands control to the event loop, as a call to a database does.

A test or a program that loops on awaits against a store must let the loop's other tasks
run: a task closing the store, a watchdog, a heartbeat. The memory store has no database
to await, so each of its calls yields once at its entry, before it reads or changes
anything: a call cancelled in that yield changed nothing, and one that finds the store
closing after it is refused as a new call (a hand-back is let through and waited for).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from asynccoord import (
    DeadLetterPolicy,
    Lease,
    MemberBeat,
    MemoryStore,
    NewTask,
    RateLimit,
    SQLiteStore,
    StoreClosedError,
    Task,
)
from asynccoord.backends.calls import HAND_BACK_TURNS
from asynccoord.contract.monitor import MetricsFlush

Store = MemoryStore | SQLiteStore
Call = Callable[[], Awaitable[object]]

_LIFE_CYCLE = {"open", "close", "__aenter__", "__aexit__"}


class Ticker:
    """A task that counts its own steps: it steps once each time the loop gets control."""

    def __init__(self) -> None:
        self.ticks = 0
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            self.ticks += 1
            await asyncio.sleep(0)

    async def stop(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def claim_one(store: Store, queue: str = "q", **kwargs: Any) -> Task:
    tasks = await store.claim(queue, node_id="n1", lease_s=60.0, **kwargs)
    assert len(tasks) == 1, tasks
    return tasks[0]


async def lease_of(store: Store, name: str) -> Lease:
    outcome = await store.try_acquire_lock(name, ttl_s=60.0)
    assert isinstance(outcome, Lease), outcome
    return outcome


async def public_calls(store: Store) -> dict[str, Call]:
    """One call of every public verb of the store, each on state prepared for it beforehand."""
    for i in range(12):
        await store.enqueue("q", i, partition_key=f"k{i}")
    await store.enqueue("lim", 0, partition_key="a", limit_keys={"chat": "a"})
    await store.set_rate_limits("lim", [RateLimit(dimension="chat", count=1, per_s=1.0, burst=1)])
    held = [await claim_one(store) for _ in range(9)]
    limited = await claim_one(store, "lim")
    dead = await store.enqueue("d", 0, max_attempts=1)
    await store.fail(await claim_one(store, "d"), "boom")
    leases = [await lease_of(store, f"lock{i}") for i in range(3)]
    beat = MemberBeat(node_id="m1", incarnation="i1", info={})
    await store.heartbeat([beat], ttl_s=60.0)
    return {
        "now": lambda: store.now(),
        "enqueue": lambda: store.enqueue("q", "x"),
        "enqueue_many": lambda: store.enqueue_many([NewTask(queue="q", payload="y")]),
        "claim": lambda: store.claim("q", node_id="n2"),
        "claimable_partitions": lambda: store.claimable_partitions("q"),
        "complete": lambda: store.complete(held[0], "ok"),
        "complete_many": lambda: store.complete_many([held[1]], ["ok"], fences=[("res", 1)]),
        "complete_and_claim_next": lambda: store.complete_and_claim_next(held[2], "ok", fence=("res", 1), lease_s=60.0),
        "fail": lambda: store.fail(held[3], "boom"),
        "release": lambda: store.release(held[4]),
        "extend": lambda: store.extend(held[5], 60.0),
        "extend_many": lambda: store.extend_many([held[6]], 60.0),
        "unchecked_claim": lambda: store.unchecked_claim("q", node_id="n3"),
        "unchecked_complete": lambda: store.unchecked_complete([held[7]]),
        "get": lambda: store.get(held[8].id),
        "stats": lambda: store.stats("q"),
        "is_drained": lambda: store.is_drained("q"),
        "dead_letters": lambda: store.dead_letters("d"),
        "requeue_dead": lambda: store.requeue_dead("d", [dead.task.id]),
        "discard_dead": lambda: store.discard_dead("d"),
        "is_processed": lambda: store.is_processed("q", "m"),
        "purge_processed": lambda: store.purge_processed(older_than_s=3600.0),
        "purge_finished": lambda: store.purge_finished("q", older_than_s=3600.0),
        "try_acquire_lock": lambda: store.try_acquire_lock("other", ttl_s=60.0),
        "release_lock": lambda: store.release_lock(leases[0]),
        "renew_lock": lambda: store.renew_lock(leases[1]),
        "renew_locks": lambda: store.renew_locks([leases[2]]),
        "list_locks": lambda: store.list_locks(),
        "fence": lambda: store.fence("res", 1),
        "fenced_write": lambda: store.fenced_write("res", 2, {"v": 1}),
        "read_fence": lambda: store.read_fence("res"),
        "heartbeat": lambda: store.heartbeat([beat], ttl_s=60.0),
        "members": lambda: store.members(),
        "leave": lambda: store.leave("m1", "i1"),
        "flush_metrics": lambda: store.flush_metrics(MetricsFlush(process_id="p1")),
        "read_metrics": lambda: store.read_metrics(),
        "queue_depths": lambda: store.queue_depths(),
        "queue_backlogs": lambda: store.queue_backlogs(["q"]),
        "set_rate_limits": lambda: store.set_rate_limits("q2", [RateLimit(dimension="chat", count=1, per_s=1.0)]),
        "rate_limits": lambda: store.rate_limits("lim"),
        "limited_queues": lambda: store.limited_queues(),
        "held_buckets": lambda: store.held_buckets(),
        "report_rate_limited": lambda: store.report_rate_limited(limited, 5.0),
        "set_dead_letter_policy": lambda: store.set_dead_letter_policy("q3", DeadLetterPolicy.HOLD),
        "dead_letter_policy": lambda: store.dead_letter_policy("q3"),
        "dead_letter_policies": lambda: store.dead_letter_policies(),
    }


async def test_every_call_lets_other_tasks_run(store: Store) -> None:
    """Each public verb, awaited once, lets a task beside it step at least once."""
    calls = await public_calls(store)
    ticker = Ticker()
    stalled = []
    try:
        for name, call in calls.items():
            before = ticker.ticks
            await call()
            if ticker.ticks == before:
                stalled.append(name)
    finally:
        await ticker.stop()
    assert stalled == []


async def test_each_memory_call_yields_once_before_its_work() -> None:
    """Once, at its entry: a second yield would split the call's reads and writes, and another
    task could change the store in between (a fenced commit records its token without one)."""
    async with MemoryStore() as store:
        calls = await public_calls(store)
        ticker = Ticker()
        steps = {}
        try:
            await asyncio.sleep(0)  # the ticker's first step
            for name, call in calls.items():
                before = ticker.ticks
                await call()
                steps[name] = ticker.ticks - before
        finally:
            await ticker.stop()
    naive = {"unchecked_claim": 2}  # a naive claim yields between its read and its write, by design
    assert steps == {name: naive.get(name, 1) for name in calls}


async def test_the_calls_cover_every_public_verb() -> None:
    """A verb added to the store is added to :func:`public_calls`, so its yield is checked too."""
    async with MemoryStore() as store:
        covered = set(await public_calls(store))
    verbs = {
        name
        for name, member in inspect.getmembers(MemoryStore)
        if inspect.iscoroutinefunction(member) and not name.startswith("_")
    }
    assert verbs - _LIFE_CYCLE == covered


async def test_a_loop_of_calls_lets_a_task_close_the_store(store: Store) -> None:
    """A loop of calls and a task that closes the store: the loop ends, refused, within a few calls."""
    done = 0

    async def loop() -> None:
        nonlocal done
        while done < 2_000:
            await store.enqueue("q", done)
            [task] = await store.claim("q", node_id="n1")
            await store.complete(task)
            done += 1

    looping = asyncio.ensure_future(loop())
    await asyncio.sleep(0)  # the loop has begun
    await store.close()
    with pytest.raises(StoreClosedError):
        await looping
    assert done < 10, done


async def test_a_loop_of_memory_calls_lets_another_task_run() -> None:
    """The reported case: 2,000 enqueues, then 2,000 claims and completes, with a counter beside them."""
    async with MemoryStore() as store:
        ticker = Ticker()
        try:
            start = ticker.ticks
            for i in range(2_000):
                await store.enqueue("q", i)
            after_enqueues = ticker.ticks
            for _ in range(2_000):
                [task] = await store.claim("q", node_id="n1")
                await store.complete(task)
            after_settles = ticker.ticks
        finally:
            await ticker.stop()
    assert after_enqueues - start >= 2_000
    assert after_settles - after_enqueues >= 4_000


async def test_a_memory_call_that_yielded_into_a_close_is_refused() -> None:
    """A call begun before ``close()`` but still in its entry's yield when the close begins is
    refused as a new call: nothing written."""
    store = MemoryStore()
    await store.open()
    await store.enqueue("q", 0)
    task = await claim_one(store)
    calls = [
        asyncio.ensure_future(store.enqueue("q", 1)),
        asyncio.ensure_future(store.complete(task, "ok")),
        asyncio.ensure_future(store.try_acquire_lock("x", ttl_s=60.0)),
    ]
    closing = asyncio.ensure_future(store.close())  # its first step runs while the calls are in their yield
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    await closing
    assert [type(o) for o in outcomes] == [StoreClosedError] * 3
    assert all("is closing" in str(o) for o in outcomes)
    await store.open()
    stats = await store.stats("q")
    assert {s.value: n for s, n in stats.counts.items() if n} == {"running": 1}
    assert await store.list_locks() == []
    await store.close()


async def test_a_memory_hand_back_that_yielded_into_a_close_is_let_through() -> None:
    """A lease release and a task's release in their entry's yield when ``close()`` begins: the
    close lets them through and waits for them, so both are done once it returns."""
    store = MemoryStore()
    await store.open()
    await store.enqueue("q", 0)
    task = await claim_one(store)
    lease = await lease_of(store, "x")
    releasing = asyncio.ensure_future(store.release_lock(lease))
    handing_back = asyncio.ensure_future(store.release(task))
    await asyncio.ensure_future(store.close())  # its first step runs after the releases' first
    assert releasing.done()
    assert handing_back.done()
    assert releasing.result() is True
    assert handing_back.result().status.value == "pending"
    await store.open()
    assert await store.list_locks() == []
    assert (await store.get(task.id)).status.value == "pending"
    await store.close()


async def test_a_memory_call_cancelled_in_its_yield_changed_nothing() -> None:
    async with MemoryStore() as store:
        await store.enqueue("q", 0)
        task = await claim_one(store)
        calls = [
            asyncio.ensure_future(store.enqueue("q", 1)),
            asyncio.ensure_future(store.complete(task, "ok")),
            asyncio.ensure_future(store.try_acquire_lock("x", ttl_s=60.0)),
            asyncio.ensure_future(store.release(task)),
        ]
        await asyncio.sleep(0)  # each call is in its entry's yield
        for call in calls:
            call.cancel()
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        assert [type(o) for o in outcomes] == [asyncio.CancelledError] * 4
        stored = await store.get(task.id)
        assert (stored.status.value, stored.version) == ("running", task.version)
        stats = await store.stats("q")
        assert sum(stats.counts.values()) == 1
        assert await store.list_locks() == []


@pytest.mark.parametrize("turns", range(HAND_BACK_TURNS))
async def test_a_memory_hand_back_begun_in_the_close_s_last_turns_is_let_through(turns: int) -> None:
    """A lease release that begins ``turns`` loop turns after ``close()`` does, up to the last
    turn the close gives hand-backs, is let through: its entry's yield does not make it late."""
    store = MemoryStore()
    await store.open()
    lease = await lease_of(store, "x")
    closing = asyncio.ensure_future(store.close())
    for _ in range(turns + 1):  # the close's first step, then its turns
        await asyncio.sleep(0)
    assert not closing.done()
    assert await store.release_lock(lease) is True
    await closing
    await store.open()
    assert await store.list_locks() == []
    await store.close()


@pytest.mark.parametrize("turns", range(HAND_BACK_TURNS))
async def test_a_memory_release_counting_its_attempt_begun_in_the_close_s_last_turns_is_let_through(turns: int) -> None:
    """A task's release with ``count_attempt=True`` (a send cut short) reads the stored task
    before it hands it back: that read is part of the hand-back, let through and waited for
    by a ``close()`` that began up to its last hand-back turn before, as on SQLite."""
    store = MemoryStore()
    await store.open()
    await store.enqueue("q", 0)
    task = await claim_one(store)
    closing = asyncio.ensure_future(store.close())
    for _ in range(turns + 1):  # the close's first step, then its turns
        await asyncio.sleep(0)
    assert not closing.done()
    released = await store.release(task, count_attempt=True)
    await closing
    assert (released.status.value, released.attempts) == ("pending", 1)
    await store.open()
    assert (await store.get(task.id)).status.value == "pending"
    await store.close()
