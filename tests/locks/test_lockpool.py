"""LockPool turns: one at a time per lock in a process, FIFO, with waiters' priorities."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any, NamedTuple

import pytest
from services import LOCK_BACKENDS

from asynccoord import (
    InvalidArgumentError,
    InvalidTypeError,
    Lease,
    LockInfo,
    LockLostError,
    LockTimeoutError,
    MemoryStore,
)
from asynccoord.locks.pool import LockPool, next_in_line


@pytest.fixture(params=LOCK_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Pools work on every lock store, the Redis one included."""
    return str(request.param)


def _ignore(error: LockLostError) -> None:
    raise AssertionError(f"no lease should be lost here: {error}")


async def _hold(pool: LockPool, name: str) -> tuple[asyncio.Task[None], asyncio.Event]:
    """Hold lock ``name`` in ``pool`` until the returned event is set; return once it is held."""
    holding, let_go = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        async with pool.turn(name, timeout_s=5.0, on_lost=_ignore):
            holding.set()
            await let_go.wait()

    task = asyncio.create_task(hold())
    await holding.wait()
    return task, let_go


async def _turns_of(pool: LockPool, arrivals: list[tuple[str, int, int | None]]) -> list[str]:
    """Queue ``(label, priority, order)`` waiters in this order behind a held lock; the labels in turn order."""
    order: list[str] = []
    holder, let_go = await _hold(pool, "account:1")

    async def waiter(label: str, priority: int, position: int | None) -> None:
        async with pool.turn("account:1", timeout_s=5.0, on_lost=_ignore, priority=priority, order=position):
            order.append(label)

    tasks = []
    for label, priority, position in arrivals:
        tasks.append(asyncio.create_task(waiter(label, priority, position)))
        await asyncio.sleep(0)
    let_go.set()
    await asyncio.wait_for(asyncio.gather(holder, *tasks), 5.0)
    return order


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


async def test_waiters_of_one_priority_go_by_order_without_counting_as_overtakes(make_store: Any) -> None:
    """Lower ``order`` first among equal priorities (a node passes task ids: oldest first).

    Passing by order is not overtaking: with ``max_overtakes=1`` the oldest of many later
    arrivals still goes ahead of every younger waiter of its priority. Waiters without an
    order keep arrival order among themselves.
    """
    store = await make_store(clock=None)
    pool = LockPool(store, ttl_s=5.0, holder="p1", max_overtakes=1)
    arrivals = [("t50", 0, 50), ("t40", 0, 40), ("t30", 0, 30), ("t45", 0, 45), ("p1", 1, 90), ("t10", 0, 10)]
    order = await _turns_of(pool, arrivals)
    assert order == ["p1", "t10", "t30", "t40", "t45", "t50"]
    await pool.aclose()
    assert await store.list_locks() == []


@pytest.mark.parametrize("max_overtakes", [0, 2])
async def test_ordered_waiters_never_pass_one_without_an_order_and_max_overtakes_0_is_fifo(
    make_store: Any, max_overtakes: int
) -> None:
    """A waiter without an order is not passed by order (it would be, for ever, by a stream of
    ordered ones); with ``max_overtakes=0`` turns go strictly by arrival, orders and priorities aside."""
    store = await make_store(clock=None)
    pool = LockPool(store, ttl_s=5.0, holder="p1", max_overtakes=max_overtakes)
    order = await _turns_of(pool, [("o30", 0, 30), ("none", 0, None), ("o20", 0, 20), ("o10", 0, 10), ("p1", 1, 5)])
    if max_overtakes == 0:
        assert order == ["o30", "none", "o20", "o10", "p1"]
    else:
        assert order == ["p1", "o30", "none", "o10", "o20"]
    await pool.aclose()


async def test_a_name_in_the_places_prefix_is_refused(make_store: Any) -> None:
    """A user lock there could hold a pool's place in line and keep the pool waiting for it."""
    store = await make_store(clock=None)
    pool = LockPool(store, ttl_s=5.0, holder="p1")
    with pytest.raises(InvalidArgumentError, match="reserved for LockPool's places in line"):
        async with pool.turn(next_in_line("account:a"), timeout_s=1.0, on_lost=_ignore):
            pass
    assert await store.list_locks() == []
    await pool.aclose()


@pytest.mark.parametrize(
    ("arg", "value", "error"),
    [
        ("priority", "1", InvalidTypeError),
        ("priority", 1.5, InvalidTypeError),
        ("priority", True, InvalidTypeError),
        ("priority", 2**31, InvalidArgumentError),
        ("priority", -(2**31) - 1, InvalidArgumentError),
        ("order", "7", InvalidTypeError),
        ("order", 7.0, InvalidTypeError),
        ("order", False, InvalidTypeError),
        ("order", 2**63, InvalidArgumentError),
    ],
)
async def test_a_bad_priority_or_order_is_refused_before_anything_is_acquired(
    make_store: Any, arg: str, value: Any, error: type[Exception]
) -> None:
    store = await make_store(clock=None)
    pool = LockPool(store, ttl_s=5.0, holder="p1")
    with pytest.raises(error, match=arg):
        async with pool.turn("account:1", timeout_s=1.0, on_lost=_ignore, **{arg: value}):
            pass
    assert await store.list_locks() == []
    await pool.aclose()


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


async def _turns_before_a_late_pool(store: Any, *, max_turns: int, turn_s: float) -> int:
    """Two pools (two processes) on one lock: process-a with a backlog of 60 turns of ``turn_s``
    each, process-b asking for one turn once a holds the lock. Returns how many of a's turns
    came first (both pools closed after, nothing left held)."""
    busy = LockPool(store, ttl_s=5.0, holder="process-a", max_turns=max_turns)
    other = LockPool(store, ttl_s=5.0, holder="process-b", max_turns=max_turns)
    order: list[str] = []
    a_started = asyncio.Event()

    async def turn(pool: LockPool, label: str) -> None:
        async with pool.turn("account:hot", timeout_s=20.0, on_lost=_ignore):
            order.append(label)
            a_started.set()
            await asyncio.sleep(turn_s)

    backlog = [asyncio.create_task(turn(busy, f"a{i}")) for i in range(60)]
    await a_started.wait()
    waited_from = len(order)
    late = asyncio.create_task(turn(other, "b"))
    await asyncio.wait_for(asyncio.gather(late, *backlog), 30.0)
    assert sorted(order) == sorted([*(f"a{i}" for i in range(60)), "b"])
    await busy.aclose()
    await other.aclose()
    assert await store.list_locks() == []  # the lock and the places in line are all released
    return order.index("b") - waited_from


async def test_a_pool_with_a_backlog_lets_a_waiting_pool_go_first_after_max_turns(make_store: Any) -> None:
    """The busy pool does not keep the lock for its whole backlog."""
    store = await make_store(clock=None)
    a_turns_before_b = await _turns_before_a_late_pool(store, max_turns=4, turn_s=0.002)
    # Without a line, process-a took the lock back at once after each max_turns and b waited
    # for all 60 turns. Now b takes its place in line when it finds the lock taken, and
    # process-a, giving the lease back after max_turns with waiters queued, waits behind it.
    assert a_turns_before_b <= 2 * 4


async def test_a_pool_seeing_another_in_line_gives_the_lease_back_within_a_few_turns(make_store: Any) -> None:
    """With the default max_turns (32), a waiting process waits a few turns, not a whole run.

    The pool holding the lease reads its place in line every few turns while local tasks
    wait; once the other pool is seen there, the lease goes back at the end of the turn.
    """
    store = await make_store(clock=None)
    a_turns_before_b = await _turns_before_a_late_pool(store, max_turns=32, turn_s=0.005)
    # Before, the busy pool kept the lease for max_turns (32) turns: b waited about 30 of them.
    assert a_turns_before_b <= 16


async def _late_turns(
    store: Any,
    *,
    busy_holder: str = "process-a",
    late_holder: str = "process-b",
    late_order: int | None = None,
    max_overtakes: int = 8,
) -> LateTurns:
    """A pool with a backlog of 60 ranked turns (orders 0..59, 5 ms each, max_turns 32) and a
    late pool's one turn: how many of the busy pool's turns came first once the late one
    started, and once it was in line (its place visible in the store).

    How fast the busy pool gives way is counted from the place: the place takes two writes,
    and a store that stalls on them (an fsync under load) lets the busy pool's in-process
    turns run on meanwhile, which says nothing of how it treats the place it reads. A busy
    pool that took the place for its own kept the lease to max_turns (31 turns or so)."""
    busy = LockPool(store, ttl_s=5.0, holder=busy_holder, max_turns=32, max_overtakes=max_overtakes)
    other = LockPool(store, ttl_s=5.0, holder=late_holder, max_turns=32)
    order: list[str] = []
    started = asyncio.Event()

    async def turn(pool: LockPool, label: str, position: int | None) -> None:
        async with pool.turn("account:hot", timeout_s=20.0, on_lost=_ignore, order=position):
            order.append(label)
            started.set()
            await asyncio.sleep(0.005)

    async def place_seen_after() -> int:
        """The busy pool's turns that had begun when the late pool's place was first seen."""
        while not await store.list_locks(next_in_line("account:hot")):
            await asyncio.sleep(0.001)
        return len(order)

    backlog = [asyncio.create_task(turn(busy, f"a{i}", i)) for i in range(60)]
    await started.wait()
    waited_from = len(order)
    late = asyncio.create_task(turn(other, "b", late_order))
    in_line_from = await asyncio.wait_for(place_seen_after(), 30.0)
    assert "b" not in order  # it took a place: the lock was busy
    await asyncio.wait_for(asyncio.gather(late, *backlog), 30.0)
    await busy.aclose()
    await other.aclose()
    assert await store.list_locks() == []
    return LateTurns(order.index("b") - waited_from, order.index("b") - in_line_from)


class LateTurns(NamedTuple):
    """What :func:`_late_turns` counts: the busy pool's turns before the late one's."""

    since_start: int
    since_in_line: int


@pytest.mark.parametrize("late_holder", ["process-a rank=1:2", "process-a rank=", "process-a rank=x"])
async def test_a_holder_that_looks_like_a_ranked_place_is_another_pool(make_store: Any, late_holder: str) -> None:
    """A place's holder is the pool's holder, the mark and the rank ('-' for none): a pool whose
    own holder holds the mark is not taken for the pool whose holder precedes it (which then
    kept the lease for its whole backlog), nor given a rank it did not ask for."""
    store = await make_store(clock=None)
    assert (await _late_turns(store, late_holder=late_holder)).since_in_line <= 16


@pytest.mark.parametrize(
    ("busy_holder", "late_holder", "late_order"),
    [
        ("q" * 210 + " rank=0:5", "q" * 210, 5),  # the long one's holder is the other's ranked place
        ("q" * 210, "q" * 210 + " rank=0:5", None),
        ("a", "x" * 215 + f" rank={-(2**31)}:{2**63 - 1}", None),  # a long holder that looks ranked last
    ],
)
async def test_a_holder_too_long_to_carry_a_rank_shows_a_digest_in_its_place(
    make_store: Any, busy_holder: str, late_holder: str, late_order: int | None
) -> None:
    """Its place is never taken for another pool's (nor another's for its own), nor read as ranked."""
    store = await make_store(clock=None)
    late = await _late_turns(store, busy_holder=busy_holder, late_holder=late_holder, late_order=late_order)
    assert late.since_in_line <= 16, late


async def test_a_pool_whose_holder_holds_the_mark_still_sees_the_other_pools_rank(make_store: Any) -> None:
    store = await make_store(clock=None)
    late = await _late_turns(store, busy_holder="process-a rank=0:5", late_holder="process-a", late_order=5)
    assert late.since_in_line <= 16, late


async def test_a_fifo_pool_ignores_ranks_across_pools_too(make_store: Any) -> None:
    """max_overtakes=0: the busy pool's orders do not keep the lease from a ranked waiter in line."""
    store = await make_store(clock=None)
    assert (await _late_turns(store, late_order=5000, max_overtakes=0)).since_in_line <= 16


async def test_a_lease_given_back_after_max_turns_with_nobody_left_is_still_queued_for_behind_the_line(
    make_store: Any,
) -> None:
    """Batches of exactly max_turns turns: each run ends with no local waiter (its session
    dropped); the next batch, ranked ahead of the other pool's waiter, still queues behind it
    (before, it took the lock back at once, batch after batch)."""
    store = await make_store(clock=None)
    busy = LockPool(store, ttl_s=5.0, holder="process-a", max_turns=4)
    other = LockPool(store, ttl_s=5.0, holder="process-b", max_turns=4)
    order: list[str] = []
    positions = itertools.count()

    async def turn(pool: LockPool, label: str, position: int) -> None:
        async with pool.turn("account:hot", timeout_s=20.0, on_lost=_ignore, order=position):
            order.append(label)
            await asyncio.sleep(0.003)

    late: asyncio.Task[None] | None = None
    for _ in range(40):
        batch = [asyncio.create_task(turn(busy, "a", next(positions))) for _ in range(4)]
        if late is None:
            await asyncio.sleep(0.001)
            late = asyncio.create_task(turn(other, "b", 10**6))  # ranked behind every task of process-a
        await asyncio.gather(*batch)
        if late.done():
            break
        await busy.released("account:hot")
    assert late is not None
    await asyncio.wait_for(late, 20.0)
    assert order.index("b") <= 12, order
    await busy.aclose()
    await other.aclose()
    assert await store.list_locks() == []


async def test_waiters_ranked_ahead_pass_another_pools_place_at_most_max_overtakes_times(make_store: Any) -> None:
    """A stream of higher-priority turns, one at a time (each lease going back idle, each new one
    ranked ahead and trying the lock at once), does not starve the other pool's waiter."""
    store = await make_store(clock=None)

    async def trial(label: str) -> int:
        busy = LockPool(store, ttl_s=5.0, holder=f"process-a-{label}", max_turns=4)
        other = LockPool(store, ttl_s=5.0, holder=f"process-b-{label}", max_turns=4)
        order: list[str] = []

        async def turn(pool: LockPool, who: str, priority: int, position: int) -> None:
            async with pool.turn(
                f"account:{label}", timeout_s=20.0, on_lost=_ignore, priority=priority, order=position
            ):
                order.append(who)
                await asyncio.sleep(0.002)

        async def stream() -> None:
            for i in range(2000):
                if "b" in order:
                    return
                await turn(busy, "a", 1, 10**6 + i)
                await asyncio.sleep(0)  # the idle release runs: the next turn acquires anew

        streaming = asyncio.create_task(stream())
        await asyncio.sleep(0.01)
        await asyncio.wait_for(asyncio.gather(turn(other, "b", 0, 0), streaming), 30.0)
        await busy.aclose()
        await other.aclose()
        return order.index("b")

    # Each acquisition of process-a passes the place once (up to max_overtakes, 8) and keeps the
    # lease for at most max_turns (4) turns. Before, process-b waited 21 to 318 turns (memory store).
    waited = [await trial(str(i)) for i in range(5)]
    assert max(waited) <= 40, waited
    assert await store.list_locks() == []


async def test_a_waiter_of_another_pool_ranked_ahead_gets_the_lease_within_a_few_turns(make_store: Any) -> None:
    """Its place in line carries its rank (priority, order): older than every local waiter, it goes first."""
    store = await make_store(clock=None)
    assert (await _late_turns(store, late_order=-1)).since_in_line <= 16


async def test_a_waiter_of_another_pool_ranked_behind_the_local_ones_waits_for_max_turns(make_store: Any) -> None:
    """The holding pool keeps the lease while its next waiter ranks ahead of the one in line
    (an older task: on an ordered queue, the lagging conversation's head), but no longer than
    max_turns: then it waits behind the other pool, whatever its rank."""
    store = await make_store(clock=None)
    a_turns_before_b = (await _late_turns(store, late_order=1000)).since_start
    # Without ranks in the line it went within a few turns (at most 16, the test above); the
    # lease it waited for was acquired before it came, so fewer than max_turns (32) remain.
    assert 20 <= a_turns_before_b <= 32, a_turns_before_b


async def test_a_place_in_line_shows_the_rank_of_the_waiter_it_is_taken_for(make_store: Any) -> None:
    store = await make_store(clock=None)
    holder = LockPool(store, ttl_s=5.0, holder="process-a")
    waiter = LockPool(store, ttl_s=5.0, holder="process-b")
    held, let_go = await _hold(holder, "account:1")
    entered = asyncio.Event()

    async def wait_for_it() -> None:
        async with waiter.turn("account:1", timeout_s=5.0, on_lost=_ignore, priority=3, order=7):
            entered.set()

    waiting = asyncio.create_task(wait_for_it())
    async with asyncio.timeout(5.0):
        while not (places := await store.list_locks(next_in_line("account:1"))):
            await asyncio.sleep(0.005)
    assert [place.holder for place in places] == ["process-b rank=3:7"]  # as `status` lists it
    assert not entered.is_set()

    # An older task of process-b comes while its pool waits in line for the younger one: the
    # place shows the older one's rank (or process-a would keep the lease for its own older ones).
    async def older() -> None:
        async with waiter.turn("account:1", timeout_s=5.0, on_lost=_ignore, priority=3, order=2):
            pass

    second = asyncio.create_task(older())
    async with asyncio.timeout(5.0):
        while [p.holder for p in await store.list_locks(next_in_line("account:1"))] != ["process-b rank=3:2"]:
            await asyncio.sleep(0.005)
    let_go.set()
    await asyncio.wait_for(asyncio.gather(held, waiting, second), 5.0)
    await holder.aclose()
    await waiter.aclose()
    assert await store.list_locks() == []


async def test_a_fresh_lease_goes_first_to_an_older_task_that_came_during_the_acquisition(make_store: Any) -> None:
    """The turn that acquires waits in line for another process; an older local task comes
    meanwhile (on an ordered queue, the lagging conversation's head): the lease, once
    acquired, is that task's first."""
    store = await make_store(clock=None)
    holder = LockPool(store, ttl_s=5.0, holder="process-a")
    waiter = LockPool(store, ttl_s=5.0, holder="process-b")
    held, let_go = await _hold(holder, "account:1")
    entered: list[int] = []

    async def turn(position: int) -> None:
        async with waiter.turn("account:1", timeout_s=5.0, on_lost=_ignore, order=position) as got:
            entered.append(position)
            tokens.add(got.lease.fencing_token)

    tokens: set[int] = set()
    younger = asyncio.create_task(turn(100))
    async with asyncio.timeout(5.0):
        while not await store.list_locks(next_in_line("account:1")):
            await asyncio.sleep(0.005)  # process-b is in line, for the younger task
    older = asyncio.create_task(turn(1))
    await asyncio.sleep(0.05)
    let_go.set()
    await asyncio.wait_for(asyncio.gather(held, younger, older), 5.0)
    assert entered == [1, 100]
    assert len(tokens) == 1  # both on the one lease acquired
    await holder.aclose()
    await waiter.aclose()
    assert await store.list_locks() == []


async def test_a_waiter_ranked_ahead_of_the_line_tries_a_lock_given_back_idle_at_once(make_store: Any) -> None:
    """The pool gave its lease back with nobody waiting; a new local turn, older than the other
    pool's waiter in line, tries the lock at once instead of taking a place behind it. One
    that comes after a release for fairness (max_turns reached) waits in line whatever its rank."""
    store = await make_store(clock=None)
    pool = LockPool(store, ttl_s=5.0, holder="process-a", max_turns=2)
    tried: list[str] = []
    try_acquire = store.try_acquire_lock

    async def recording(name: str, **kwargs: Any) -> Any:
        tried.append("lock" if name == "account:1" else "place")
        return await try_acquire(name, **kwargs)

    store.try_acquire_lock = recording
    async with pool.turn("account:1", timeout_s=5.0, on_lost=_ignore, order=5):
        pass
    await pool.released("account:1")
    # Process-b is in line for the lock, for a waiter of order 100.
    place = await try_acquire(next_in_line("account:1"), ttl_s=5.0, holder="process-b rank=0:100")
    tried.clear()
    async with pool.turn("account:1", timeout_s=5.0, on_lost=_ignore, order=6):
        pass
    assert tried == ["lock"]  # read the line, ranked ahead: straight to the lock
    await pool.released("account:1")
    # Two turns (max_turns) with a third waiting: the lease goes back for fairness, and the
    # third, though ranked ahead of process-b's waiter, queues for the place.
    tried.clear()
    entered: list[int] = []

    async def turn(position: int) -> None:
        async with pool.turn("account:1", timeout_s=0.3, on_lost=_ignore, order=position):
            entered.append(position)
            await asyncio.sleep(0.01)

    results = await asyncio.gather(turn(7), turn(8), turn(9), return_exceptions=True)
    assert entered == [7, 8]
    assert isinstance(results[2], LockTimeoutError)  # behind process-b's place, never released here
    assert tried[:2] == ["lock", "place"], tried
    await store.release_lock(place)
    await pool.aclose()
    assert await store.list_locks() == []


async def test_a_pool_nobody_waits_behind_keeps_the_lease_for_max_turns(make_store: Any) -> None:
    """The reads of the place in line find nobody: the lease is kept for max_turns turns each time."""
    store = await make_store(clock=None)
    pool = LockPool(store, ttl_s=5.0, holder="process-a", max_turns=32)
    tokens: list[int] = []

    async def turn() -> None:
        async with pool.turn("account:hot", timeout_s=20.0, on_lost=_ignore) as held:
            tokens.append(held.lease.fencing_token)
            await asyncio.sleep(0.001)

    await asyncio.wait_for(asyncio.gather(*(turn() for _ in range(64))), 30.0)
    runs = [len(list(group)) for _, group in itertools.groupby(tokens)]
    assert runs == [32, 32], runs
    await pool.aclose()
    assert await store.list_locks() == []


async def test_two_pools_with_backlogs_alternate_in_runs_of_at_most_max_turns(make_store: Any) -> None:
    store = await make_store(clock=None)
    pools = {label: LockPool(store, ttl_s=5.0, holder=f"process-{label}", max_turns=4) for label in "ab"}
    order: list[str] = []
    inside = 0

    async def turn(label: str) -> None:
        nonlocal inside
        async with pools[label].turn("account:hot", timeout_s=20.0, on_lost=_ignore):
            inside += 1
            assert inside == 1  # mutual exclusion across the pools
            order.append(label)
            await asyncio.sleep(0.008)  # a run of max_turns turns outlasts the pools' polls for the line
            inside -= 1

    tasks = [asyncio.create_task(turn(label)) for _ in range(24) for label in "ab"]
    await asyncio.wait_for(asyncio.gather(*tasks), 30.0)
    runs = [len(list(group)) for _, group in itertools.groupby(order)]
    assert sum(runs) == 48
    # Without a line the pool holding the lock took it back at once after each max_turns, so
    # it kept it for most of its backlog. Now the pools alternate: a run of a pool is at
    # most max_turns, or twice that where the other pool was slow to take its place in line.
    assert max(runs) <= 2 * 4, (runs, order)
    assert len(runs) >= 48 // 8, (runs, order)
    for pool in pools.values():
        await pool.aclose()
    assert await store.list_locks() == []


async def test_a_waiter_cancelled_as_its_turn_is_handed_to_it_raises_and_passes_the_turn_on(
    make_store: Any,
) -> None:
    """The cancellation comes in the same step of the loop as the hand-over (Python 3.11's
    wait_for returned the turn and dropped the cancellation: the block ran anyway)."""
    store = await make_store(clock=None)
    pool = LockPool(store, ttl_s=5.0, holder="process-a")
    ran: list[str] = []

    async def waiter(label: str) -> None:
        async with pool.turn("account:1", timeout_s=5.0, on_lost=_ignore):
            ran.append(label)

    async with pool.turn("account:1", timeout_s=5.0, on_lost=_ignore):
        cancelled = asyncio.create_task(waiter("cancelled"))
        await asyncio.sleep(0.01)  # it waits for the turn
        after = asyncio.create_task(waiter("after"))
        await asyncio.sleep(0.01)
    cancelled.cancel()  # the turn was handed to it as the block ended; it has not run since
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    await asyncio.wait_for(after, 5.0)  # the turn went on to the next waiter
    assert ran == ["after"]
    await pool.aclose()
    assert await store.list_locks() == []


async def test_a_waiter_that_times_out_in_line_gives_up_its_place(make_store: Any) -> None:
    store = await make_store(clock=None)
    holder = LockPool(store, ttl_s=5.0, holder="process-a")
    waiter = LockPool(store, ttl_s=5.0, holder="process-b")

    held, let_go = await _hold(holder, "account:1")
    with pytest.raises(LockTimeoutError, match="account:1"):
        async with waiter.turn("account:1", timeout_s=0.2, on_lost=_ignore):
            raise AssertionError("the lock is held by the other pool")
    await waiter.aclose()  # waits for the place in line to be released
    names = [info.name for info in await store.list_locks()]
    assert names == ["account:1"]  # the holder's lease only: no place in line left behind
    let_go.set()
    await held
    await holder.aclose()
    assert await store.list_locks() == []


async def test_a_place_in_line_left_by_a_crashed_process_lapses(make_store: Any) -> None:
    """A process that died while first in line blocks the pools that queue behind it for its place's TTL only."""
    store = await make_store(clock=None)
    dead = await store.try_acquire_lock(next_in_line("account:1"), ttl_s=0.3, holder="crashed")  # never renewed
    assert not isinstance(dead, type(None))
    pool = LockPool(store, ttl_s=5.0, holder="process-a", max_turns=1)
    entered: list[float] = []

    async def turn() -> None:
        async with pool.turn("account:1", timeout_s=5.0, on_lost=_ignore):
            entered.append(asyncio.get_running_loop().time())
            await asyncio.sleep(0.01)  # the other turn queues meanwhile

    start = asyncio.get_running_loop().time()
    # The first turn barges (nobody holds the lock); the second comes after max_turns with a
    # local waiter queued, so it waits in line behind the crashed process's place.
    await asyncio.wait_for(asyncio.gather(turn(), turn()), 5.0)
    assert len(entered) == 2
    assert entered[0] - start < 0.25  # the lock was free: no line to wait in
    assert 0.25 < entered[1] - start < 2.0  # behind the dead place until it lapsed (0.3 s)
    await pool.aclose()
    assert await store.list_locks() == []


def test_next_in_line_is_a_valid_lock_name_for_any_lock_name() -> None:
    names = {next_in_line("a"), next_in_line("b"), next_in_line("x" * 255)}
    assert len(names) == 3
    assert all(name.startswith("asynccoord.next:") and len(name) == 48 for name in names)
    assert next_in_line("a") == next_in_line("a")


async def test_pools_of_one_worker_each_with_deferred_commits_take_turns(make_store: Any) -> None:
    """A node's pattern: one task at a time per account, its commit deferred past the turn.

    No local waiter is queued when a turn ends, so the lease goes back each time; a pool
    that found the lock taken lately still waits in line instead of taking it back at once.
    """
    store = await make_store(clock=None)
    pools = {label: LockPool(store, ttl_s=5.0, holder=f"process-{label}", max_turns=4) for label in "ab"}
    order: list[str] = []
    stop = asyncio.Event()

    async def worker(label: str) -> None:
        while not stop.is_set():
            async with pools[label].turn("account:hot", timeout_s=20.0, on_lost=_ignore) as turn:
                order.append(label)
                committed = turn.defer()
                await asyncio.sleep(0.002)  # the send
            await asyncio.sleep(0.002)  # the commit, fenced by the turn's token
            committed()

    workers = [asyncio.create_task(worker(label)) for label in "ab"]
    await asyncio.sleep(1.5)
    stop.set()
    await asyncio.wait_for(asyncio.gather(*workers), 30.0)
    runs = [len(list(group)) for _, group in itertools.groupby(order)]
    assert min(order.count("a"), order.count("b")) >= len(order) // 4, (runs, order)
    assert max(runs[1:], default=0) <= 2 * 4, (runs, order)
    for pool in pools.values():
        await pool.aclose()
    assert await store.list_locks() == []


async def test_losing_a_place_in_line_is_not_losing_a_lock(make_store: Any) -> None:
    """A stall past the place's TTL (1 s) costs the place, not a lock_lost event or alert."""
    store = await make_store(clock=None)
    holder = LockPool(store, ttl_s=5.0, holder="process-a")
    waiter = LockPool(store, ttl_s=5.0, holder="process-b")

    async def wait_turn() -> None:
        async with waiter.turn("account:1", timeout_s=10.0, on_lost=_ignore):
            pass

    held, let_go = await _hold(holder, "account:1")
    waiting = asyncio.create_task(wait_turn())
    deadline = asyncio.get_running_loop().time() + 5.0
    while not any(i.name == next_in_line("account:1") for i in await store.list_locks()):
        assert asyncio.get_running_loop().time() < deadline, "the waiter never took its place in line"
        await asyncio.sleep(0.01)
    time.sleep(1.2)  # a stall of the whole process (GC, a blocking call): the place lapses
    await asyncio.sleep(0.1)
    let_go.set()
    await asyncio.wait_for(asyncio.gather(held, waiting), 10.0)
    assert store.events.snapshot().get("lock_lost", 0) == 0
    for pool in (holder, waiter):
        await pool.aclose()
    assert await store.list_locks() == []


async def test_a_deferred_commit_slower_than_the_ttl_keeps_the_lease_until_it_lands(make_store: Any) -> None:
    """A commit deferred past the turn that outlasts ``ttl_s`` (a slow store) is not fenced out.

    The lease stays in the pool (renewed by the watchdog) until the commit is over: the
    other pool's turn, and its higher token, only come after it.
    """
    store = await make_store(clock=None)
    a = LockPool(store, ttl_s=0.5, holder="process-a")
    b = LockPool(store, ttl_s=0.5, holder="process-b")
    log: list[str] = []

    async def commit_slowly() -> None:
        async with a.turn("account:slow", timeout_s=5.0, on_lost=_ignore) as turn:
            token = turn.lease.fencing_token
            committed = turn.defer()
        try:
            await asyncio.sleep(1.2)  # over two TTLs
            await store.fence("account:slow", token)  # raises if a newer token was seen
            log.append(f"a committed with {token}")
        finally:
            committed()

    async def take_it_next() -> None:
        await asyncio.sleep(0.05)
        async with b.turn("account:slow", timeout_s=5.0, on_lost=_ignore) as turn:
            log.append(f"b holds {turn.lease.fencing_token}")
            await store.fence("account:slow", turn.lease.fencing_token)

    await asyncio.wait_for(asyncio.gather(commit_slowly(), take_it_next()), 20.0)
    assert log[0].startswith("a committed with ")
    assert log[1].startswith("b holds ")
    assert int(log[1].split()[-1]) > int(log[0].split()[-1])
    for pool in (a, b):
        await pool.aclose()
    assert await store.list_locks() == []


async def test_a_turn_that_comes_while_the_last_commit_is_deferred_keeps_the_lease(make_store: Any) -> None:
    """Nobody waited when a turn ended, so its lease started going back once its commit is over;
    a turn that comes meanwhile takes the lease still held (same token, no acquisition) instead
    of waiting for the commit, the release and a new acquisition."""
    store = await make_store(clock=None)
    pool = LockPool(store, ttl_s=5.0, holder="process-a")
    acquired: list[str] = []
    try_acquire = store.try_acquire_lock

    async def counting(name: str, **kwargs: Any) -> Any:
        acquired.append(name)
        return await try_acquire(name, **kwargs)

    store.try_acquire_lock = counting
    async with pool.turn("account:1", timeout_s=5.0, on_lost=_ignore) as first:
        committed_first = first.defer()
    await asyncio.sleep(0.05)  # the first commit is still under way
    async with asyncio.timeout(1.0):  # before: it waited for that commit, for ever here
        async with pool.turn("account:1", timeout_s=5.0, on_lost=_ignore) as second:
            committed_second = second.defer()
    assert second.lease.fencing_token == first.lease.fencing_token
    assert acquired == ["account:1"]
    committed_first()
    [held] = await store.list_locks()
    assert held.fencing_token == first.lease.fencing_token  # the second commit is under way still
    committed_second()
    async with asyncio.timeout(5.0):
        await pool.released("account:1")
        while await store.list_locks():
            await asyncio.sleep(0.01)
    await pool.aclose()


async def test_a_release_called_off_as_the_last_commit_ends_leaves_the_lease_with_the_new_turn(
    make_store: Any,
) -> None:
    """The commit ends (the release may go on) and a new turn takes the lease in the same step
    of the event loop: the release, whose wait had its result already, must not give the lease
    back under the new turn (asyncio.wait_for of Python 3.11 then returns the result and drops
    the cancellation; a benchmark's commits were refused as fenced out)."""
    store = await make_store(clock=None)
    pool = LockPool(store, ttl_s=5.0, holder="process-a")
    async with pool.turn("account:1", timeout_s=5.0, on_lost=_ignore) as first:
        committed_first = first.defer()
    await asyncio.sleep(0.05)  # the release waits for the commit
    committed_first()
    # One step of the loop: the wait inside the release ends, and the release is due to
    # resume with that result, when the new turn calls it off.
    await asyncio.sleep(0)
    async with pool.turn("account:1", timeout_s=5.0, on_lost=_ignore) as second:
        await asyncio.sleep(0.1)  # the send; the called-off release runs meanwhile, nothing deferred
        [held] = await store.list_locks()
        assert held.fencing_token == second.lease.fencing_token == first.lease.fencing_token
        assert pool.held == 1
        committed_second = second.defer()
    committed_second()
    await pool.aclose()
    assert await store.list_locks() == []


async def test_turns_that_keep_the_lease_from_its_release_still_let_a_pool_in_line_go_first(make_store: Any) -> None:
    """One task at a time in process-a, each asking for its turn while the last one's commit
    is under way (nobody waits, so every turn ends by starting a release that the next turn
    calls off): the pool still reads the place in line every few turns and gives the lease
    back to process-b within a few turns, not after ``max_turns`` (``min_hold_s=0``: see
    the next test for the least hold)."""
    store = await make_store(clock=None)
    busy = LockPool(store, ttl_s=5.0, holder="process-a", max_turns=32, min_hold_s=0.0)
    other = LockPool(store, ttl_s=5.0, holder="process-b", max_turns=32)
    order: list[str] = []
    commits: list[asyncio.Task[None]] = []

    async def commit(done: Any) -> None:
        await asyncio.sleep(0.005)
        done()

    async def one_at_a_time() -> None:
        for i in range(60):
            async with busy.turn("account:hot", timeout_s=20.0, on_lost=_ignore) as turn:
                order.append(f"a{i}")
                await asyncio.sleep(0.002)
                commits.append(asyncio.create_task(commit(turn.defer())))

    async def late() -> None:
        while len(order) < 2:
            await asyncio.sleep(0.001)
        async with other.turn("account:hot", timeout_s=20.0, on_lost=_ignore):
            order.append("b")

    in_line_at: list[int] = []  # turns of process-a taken when process-b's place in line showed up

    async def watch_the_line() -> None:
        while "b" not in order:
            if not in_line_at and any(
                i.holder.startswith("process-b ") for i in await store.list_locks(next_in_line("account:hot"))
            ):
                in_line_at.append(len(order))
            await asyncio.sleep(0.002)

    await asyncio.wait_for(asyncio.gather(one_at_a_time(), late(), watch_the_line()), 30.0)
    await asyncio.gather(*commits)
    assert sorted(order) == sorted([*(f"a{i}" for i in range(60)), "b"])
    # Taking the place costs process-b a few round trips (turns of process-a go on meanwhile, more
    # on a loaded server), so the count starts once the place is taken: a read every 4 turns, its
    # round trip and the release, not the 32 turns of max_turns.
    assert in_line_at, order
    assert order.index("b") - in_line_at[0] <= 12, (in_line_at, order)
    await busy.aclose()
    await other.aclose()
    assert await store.list_locks() == []


async def test_a_pool_keeps_the_lease_for_min_hold_s_before_a_pool_in_line_goes_first(make_store: Any) -> None:
    """Short turns (2 ms) with local tasks always waiting: once another pool is in line, the
    lease still stays ``min_hold_s`` since it was taken (so that a hand-over is a small share
    of the hold), then goes back within a few turns, long before ``max_turns``."""
    store = await make_store(clock=None)
    busy = LockPool(store, ttl_s=5.0, holder="process-a", max_turns=1000, min_hold_s=0.15)
    other = LockPool(store, ttl_s=5.0, holder="process-b")
    turns: list[tuple[float, int]] = []  # process-a's turns: (monotonic start, fencing token)
    b_at: list[float] = []
    # When process-a's acquisitions returned, by fencing token: the pool's hold starts after that
    # (and before the lease's first turn, which a loaded event loop may start a little later).
    acquired: dict[int, float] = {}
    acquire = store.try_acquire_lock

    async def try_acquire_lock(name: str, **kwargs: Any) -> Any:
        outcome = await acquire(name, **kwargs)
        if name == "account:hot" and kwargs.get("holder") == "process-a" and isinstance(outcome, Lease):
            acquired[outcome.fencing_token] = time.monotonic()
        return outcome

    store.try_acquire_lock = try_acquire_lock  # type: ignore[method-assign]

    async def worker() -> None:
        while not b_at:
            async with busy.turn("account:hot", timeout_s=20.0, on_lost=_ignore) as turn:
                turns.append((time.monotonic(), turn.lease.fencing_token))
                await asyncio.sleep(0.002)

    async def late() -> None:
        while len(turns) < 2:
            await asyncio.sleep(0.001)
        async with other.turn("account:hot", timeout_s=20.0, on_lost=_ignore):
            b_at.append(time.monotonic())

    await asyncio.wait_for(asyncio.gather(worker(), worker(), worker(), late()), 30.0)
    before_b = [t for t in turns if t[0] < b_at[0]]
    token = before_b[-1][1]
    held = [t for t in before_b if t[1] == token]  # the lease process-b's turn came after
    taken_at = acquired[token]
    assert taken_at <= held[0][0]
    assert b_at[0] - taken_at >= 0.15, (b_at[0] - taken_at, len(held))
    past_hold = [t for t in held if t[0] >= taken_at + 0.15]
    assert len(past_hold) <= 12, (len(past_hold), len(held))
    assert len(held) < 1000
    await busy.aclose()
    await other.aclose()
    assert await store.list_locks() == []


async def test_a_turn_whose_loop_blocked_past_the_ttl_calls_on_lost_at_its_end(make_store: Any) -> None:
    """The event loop blocked (a frozen process, a synchronous call) past the lease's local
    deadline during a turn, so no renewal could tell: the block's end finds the lease lost,
    calls the turn's ``on_lost`` once, and the next turn runs on a new lease."""
    store = await make_store(clock=None)
    pool = LockPool(store, ttl_s=0.3, holder="process-a")
    lost: list[LockLostError] = []
    async with pool.turn("account:1", timeout_s=5.0, on_lost=lost.append) as first:
        time.sleep(0.5)  # blocks the event loop on purpose
    assert len(lost) == 1
    assert isinstance(lost[0], LockLostError)
    later: list[LockLostError] = []
    async with pool.turn("account:1", timeout_s=5.0, on_lost=later.append) as second:
        assert second.lease.fencing_token > first.lease.fencing_token
    assert later == []
    async with pool.turn("account:1", timeout_s=5.0, on_lost=later.append) as third:
        third.end()  # ended early: its on_lost is not called any more
        time.sleep(0.5)
    assert later == []
    await pool.aclose()


async def test_a_turn_after_max_turns_waits_for_the_release_even_with_the_commit_deferred(make_store: Any) -> None:
    """Keeping the lease for a new turn is only for a release nobody asked for: after
    ``max_turns`` the lease goes back (for another process in line) and the turn acquires anew."""
    store = await make_store(clock=None)
    pool = LockPool(store, ttl_s=5.0, holder="process-a", max_turns=1)
    async with pool.turn("account:1", timeout_s=5.0, on_lost=_ignore) as first:
        committed_first = first.defer()
    second_token: list[int] = []

    async def second_turn() -> None:
        async with pool.turn("account:1", timeout_s=5.0, on_lost=_ignore) as second:
            second_token.append(second.lease.fencing_token)

    waiting = asyncio.create_task(second_turn())
    await asyncio.sleep(0.1)
    assert second_token == []  # it waits for the commit and the release
    committed_first()
    await asyncio.wait_for(waiting, 5.0)
    assert second_token[0] > first.lease.fencing_token
    await pool.aclose()
    assert await store.list_locks() == []


async def test_aclose_waits_for_a_turn_in_progress_before_giving_the_lease_back(make_store: Any) -> None:
    """Closing the pool during a turn gave the lease back under it: another pool took the lock
    while the turn ran, and the turn's commit was refused as fenced out (a breaker's find)."""
    store = await make_store(clock=None)
    pool = LockPool(store, ttl_s=5.0, holder="process-a")
    other = LockPool(store, ttl_s=5.0, holder="process-b")
    entered, go = asyncio.Event(), asyncio.Event()

    async def turn() -> None:
        async with pool.turn("account:1", timeout_s=5.0, on_lost=_ignore) as held:
            entered.set()
            await go.wait()
            committed = held.defer()
        await store.fence("account:1", held.lease.fencing_token)  # refused if a later holder wrote first
        committed()

    running = asyncio.create_task(turn())
    await entered.wait()
    closing = asyncio.create_task(pool.aclose())
    await asyncio.sleep(0.1)
    assert not closing.done()
    assert [info.holder for info in await store.list_locks()] == ["process-a"]
    go.set()
    await asyncio.wait_for(asyncio.gather(running, closing), 5.0)
    assert await store.list_locks() == []
    async with other.turn("account:1", timeout_s=5.0, on_lost=_ignore) as later:
        await store.fence("account:1", later.lease.fencing_token)
    await other.aclose()


async def test_aclose_waits_at_most_one_ttl_for_a_deferred_commit_that_never_ends(make_store: Any) -> None:
    store = await make_store(clock=None)
    pool = LockPool(store, ttl_s=1.0, holder="process-a", max_hold_s=60.0)
    async with pool.turn("account:stuck", timeout_s=5.0, on_lost=_ignore) as turn:
        turn.defer()  # its done() is never called (a bug of the caller's)
    await asyncio.sleep(0.1)
    started = time.monotonic()
    await asyncio.wait_for(pool.aclose(), 10.0)
    assert time.monotonic() - started < 2.5
    assert await store.list_locks() == []


async def test_aclose_ends_a_read_of_the_line_that_outlived_its_lease() -> None:
    """A read of the place in line slower than the rest of the run (a slow store) is over when
    aclose() returns, although its session (and lease) were gone before (a breaker's case)."""

    class SlowReads(MemoryStore):
        async def list_locks(self, name: str | None = None) -> list[LockInfo]:
            await asyncio.sleep(0.05)
            return await super().list_locks(name)

    async with SlowReads() as store:
        pool = LockPool(store, ttl_s=5.0, holder="p1")

        async def turn() -> None:
            async with pool.turn("account:hot", timeout_s=5.0, on_lost=_ignore):
                await asyncio.sleep(0)

        await asyncio.gather(*(turn() for _ in range(5)))  # the 4th turn starts a read of the line
        await asyncio.sleep(0.01)  # the lease is back in the store, the read still under way
        line_reads = [t for t in asyncio.all_tasks() if t.get_name().startswith("asynccoord-lockpool-line-")]
        assert line_reads, "the run should have started a read of the place in line"
        await pool.aclose()
        assert all(t.done() for t in line_reads)
        assert await store.list_locks() == []


async def test_local_turns_are_not_contention_but_a_wait_for_another_holder_is(make_store: Any) -> None:
    """``lock_contended`` counts waits between holders: 20 local tasks taking turns on one
    pool's lease count nothing; a second pool (another process) that finds the lock held
    counts once for its acquisition, however long it polls, and so does a plain
    :class:`~asynccoord.Lock` of another holder."""
    from asynccoord import Lock
    from asynccoord import events as ev

    store = await make_store(clock=None)
    pool = LockPool(store, ttl_s=5.0, holder="process-a")

    async def turn(on: LockPool, hold_s: float) -> None:
        async with on.turn("account:hot", timeout_s=10.0, on_lost=_ignore):
            await asyncio.sleep(hold_s)

    await asyncio.wait_for(asyncio.gather(*(turn(pool, 0.001) for _ in range(20))), 10.0)
    assert store.events.get(ev.LOCK_CONTENDED) == 0

    other = LockPool(store, ttl_s=5.0, holder="process-b")
    holder, let_go = await _hold(pool, "account:hot")
    late = asyncio.create_task(turn(other, 0.0))
    await asyncio.sleep(0.2)  # other polls the lock many times meanwhile
    assert not late.done()
    let_go.set()
    await asyncio.wait_for(asyncio.gather(holder, late), 10.0)
    assert store.events.get(ev.LOCK_CONTENDED) == 1

    holder, let_go = await _hold(pool, "account:hot")
    with pytest.raises(LockTimeoutError):
        await Lock(store, "account:hot", ttl_s=5.0, holder="process-c").acquire(timeout_s=0.05)
    let_go.set()
    await holder
    assert store.events.get(ev.LOCK_CONTENDED) >= 2
    await pool.aclose()
    await other.aclose()


async def test_a_lease_whose_fenced_write_was_refused_takes_no_more_turns(backend: str, make_store: Any) -> None:
    """After ``fence_refused`` the lease goes back once its turn and deferred commits are over,
    and the next turn acquires anew; a Redis counter behind the refused resource's token is
    moved past it first (the stores keeping their counters in a database have nothing to move)."""
    from asynccoord.contract.locks import fence_rejected_error

    store = await make_store(clock=None)
    pool = LockPool(store, ttl_s=5.0, holder="p1")
    tokens: list[int] = []
    async with pool.turn("account:1", timeout_s=5.0, on_lost=_ignore) as turn:
        lease = turn.lease
        committed = turn.defer()  # the commit outlives the turn, as a node's does
    async with pool.turn("account:1", timeout_s=5.0, on_lost=_ignore) as turn:  # the same lease, handed on
        tokens.append(turn.lease.fencing_token)
    accepted = lease.fencing_token + 10  # what the resource took before the counter was set back
    moved = await pool.fence_refused(lease, fence_rejected_error("account:1", lease.fencing_token, accepted))
    assert moved is (backend == "redis")
    assert await pool.fence_refused(lease, fence_rejected_error("account:1", lease.fencing_token, accepted)) is False
    committed()
    async with pool.turn("account:1", timeout_s=5.0, on_lost=_ignore) as turn:
        assert turn.lease.owner_token != lease.owner_token  # acquired anew, not handed on
        tokens.append(turn.lease.fencing_token)
    assert tokens[0] == lease.fencing_token
    assert tokens[1] == (accepted + 1 if backend == "redis" else lease.fencing_token + 1)
    # A refusal of another resource (fenced by this lock's tokens elsewhere) moves no counter.
    other = await pool.fence_refused(turn.lease, fence_rejected_error("ledger", turn.lease.fencing_token, 10**6))
    assert other is False
    await pool.aclose()


async def test_a_turn_never_starts_on_a_grant_arriving_past_its_local_deadline(
    make_store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The event loop blocked between the store's grant and its reply, past the lease's local
    deadline: the pool releases that lease and takes a fresh one for the turn."""
    store = await make_store(clock=None)
    granted: list[Lease] = []
    acquire = store.try_acquire_lock

    async def try_acquire_lock(name: str, **kwargs: Any) -> Any:
        outcome = await acquire(name, **kwargs)
        if isinstance(outcome, Lease) and name == "account:hot":
            granted.append(outcome)
            if len(granted) == 1:
                time.sleep(0.35)  # a GC pause, a SIGSTOP, swap
        return outcome

    store.try_acquire_lock = try_acquire_lock  # type: ignore[method-assign]
    pool = LockPool(store, ttl_s=0.3, holder="process-a")
    async with pool.turn("account:hot", timeout_s=5.0, on_lost=_ignore) as turn:
        turn.check()
        assert [g.fencing_token for g in granted] == [1, 2]
        assert turn.lease == granted[1]
    assert "asynccoord.lock.grant_too_late name='account:hot' fencing_token=1" in caplog.text
    await pool.aclose()


async def test_a_turn_with_timeout_s_0_makes_one_attempt(make_store: Any) -> None:
    """As ``Lock(timeout_s=0)``: a free lock is taken, a held one refused at once."""
    store = await make_store(clock=None)
    mine, theirs = LockPool(store, ttl_s=5.0, holder="process-a"), LockPool(store, ttl_s=5.0, holder="process-b")
    async with mine.turn("account:1", timeout_s=0, on_lost=_ignore) as turn:
        assert turn.lease.holder == "process-a"
        started = time.monotonic()
        with pytest.raises(LockTimeoutError):
            async with theirs.turn("account:1", timeout_s=0, on_lost=_ignore):
                pass
        assert time.monotonic() - started < 1.0
    await mine.aclose()
    await theirs.aclose()


async def test_a_turn_whose_grants_all_arrive_late_times_out(make_store: Any) -> None:
    """Every grant past its local deadline (a TTL below the store's round trip): the turn still ends
    at ``timeout_s``, polling between attempts, with nothing left held."""
    store = await make_store(clock=None)
    acquire = store.try_acquire_lock
    grants: list[Lease] = []

    async def slow_reply(name: str, **kwargs: Any) -> Any:
        outcome = await acquire(name, **kwargs)
        if isinstance(outcome, Lease) and name == "account:hot":
            grants.append(outcome)
            await asyncio.sleep(0.03)  # past 0.9 of the 0.03 s TTL
        return outcome

    store.try_acquire_lock = slow_reply  # type: ignore[method-assign]
    pool = LockPool(store, ttl_s=0.03, holder="process-a")
    started = time.monotonic()
    with pytest.raises(LockTimeoutError, match="its grant arrived past its deadline"):
        async with pool.turn("account:hot", timeout_s=0.5, on_lost=_ignore):
            pass
    assert 0.5 <= time.monotonic() - started < 2.0
    assert 2 <= len(grants) <= 20
    assert await store.list_locks("account:hot") == []
    await pool.aclose()
