"""LockPool turns: one at a time per lock in a process, FIFO, with waiters' priorities."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from asynccoord import InvalidArgumentError, InvalidTypeError, LockLostError
from asynccoord.lockpool import LockPool


def _ignore(error: LockLostError) -> None:
    raise AssertionError(f"no lease should be lost here: {error}")


async def test_waiters_take_turns_by_priority_then_arrival(make_store: Any) -> None:
    store = await make_store(clock=None)
    pool = LockPool(store, ttl_s=5.0, holder="p1")
    order: list[str] = []
    inside = 0
    most_inside = 0
    holding = asyncio.Event()
    let_go = asyncio.Event()

    async def first() -> None:
        async with pool.turn("account:1", timeout_s=5.0, on_lost=_ignore):
            holding.set()
            await let_go.wait()
            order.append("first")

    async def waiter(label: str, priority: int) -> None:
        nonlocal inside, most_inside
        async with pool.turn("account:1", timeout_s=5.0, on_lost=_ignore, priority=priority):
            inside += 1
            most_inside = max(most_inside, inside)
            await asyncio.sleep(0.001)
            order.append(label)
            inside -= 1

    holder = asyncio.create_task(first())
    await holding.wait()
    arrivals = [("a0", 0), ("b2", 2), ("c1", 1), ("d2", 2), ("e0", 0), ("f-1", -1), ("g0", 0)]
    tasks = []
    for label, priority in arrivals:  # queue them in this order behind the holder
        tasks.append(asyncio.create_task(waiter(label, priority)))
        await asyncio.sleep(0)
    await asyncio.sleep(0.01)
    let_go.set()
    await asyncio.wait_for(asyncio.gather(holder, *tasks), 5.0)
    assert order == ["first", "b2", "d2", "c1", "a0", "e0", "g0", "f-1"]
    assert most_inside == 1  # one turn at a time
    await pool.aclose()
    assert await store.list_locks() == []


@pytest.mark.parametrize(
    ("priority", "error"),
    [
        ("1", InvalidTypeError),
        (1.5, InvalidTypeError),
        (True, InvalidTypeError),
        (2**31, InvalidArgumentError),
        (-(2**31) - 1, InvalidArgumentError),
    ],
)
async def test_a_bad_priority_is_refused_before_anything_is_acquired(
    make_store: Any, priority: Any, error: type[Exception]
) -> None:
    store = await make_store(clock=None)
    pool = LockPool(store, ttl_s=5.0, holder="p1")
    with pytest.raises(error, match="priority"):
        async with pool.turn("account:1", timeout_s=1.0, on_lost=_ignore, priority=priority):
            pass
    assert await store.list_locks() == []


async def test_a_waiter_is_overtaken_at_most_max_overtakes_times(make_store: Any) -> None:
    store = await make_store(clock=None)
    pool = LockPool(store, ttl_s=5.0, holder="p1", max_overtakes=2)
    order: list[str] = []
    holding = asyncio.Event()
    let_go = asyncio.Event()

    async def first() -> None:
        async with pool.turn("account:1", timeout_s=5.0, on_lost=_ignore):
            holding.set()
            await let_go.wait()

    async def waiter(label: str, priority: int) -> None:
        async with pool.turn("account:1", timeout_s=5.0, on_lost=_ignore, priority=priority):
            order.append(label)

    holder = asyncio.create_task(first())
    await holding.wait()
    tasks = []
    for label, priority in [("low", 0), ("h1", 5), ("h2", 5), ("h3", 5), ("h4", 9)]:
        tasks.append(asyncio.create_task(waiter(label, priority)))
        await asyncio.sleep(0)
    let_go.set()
    await asyncio.wait_for(asyncio.gather(holder, *tasks), 5.0)
    # "low" lets h1 and h2 by, then nobody else; h4 still passes h3 (overtaken once)
    assert order == ["h1", "h2", "low", "h4", "h3"]
    await pool.aclose()


@pytest.mark.parametrize(("value", "error"), [(-1, InvalidArgumentError), (1.0, InvalidTypeError)])
async def test_a_bad_max_overtakes_is_refused(make_store: Any, value: Any, error: type[Exception]) -> None:
    store = await make_store(clock=None)
    with pytest.raises(error, match="max_overtakes"):
        LockPool(store, ttl_s=5.0, holder="p1", max_overtakes=value)
