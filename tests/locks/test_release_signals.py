"""Release signals (asynccoord/releases.py): a lock given back wakes its waiters at once, here and in other processes.

The pools in these tests poll a taken lock only every 30 s (their poll schedules are
patched), so a turn that begins within a few seconds of the release was started by the
release signal: nothing else can explain it. The bounds are sanity checks, not speed claims
(the figures are in benchmarks/hot_account.py).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from services import PG_DSN, drop_schemas, new_schema, postgres_problem, unavailable

from asynccoord import InvalidArgumentError, InvalidTypeError, MemoryStore, SQLiteStore
from asynccoord.backends.sqlite.wakeup import decode_datagram, encode_wakeup
from asynccoord.config import RetryPolicy
from asynccoord.locks import poolline
from asynccoord.locks.pool import LockPool, next_in_line
from asynccoord.releases import ReleaseSignal

SLOW_POLL = RetryPolicy(base_s=30.0, factor=1.0, cap_s=30.0, jitter=0.0)
SIGNAL_BOUND_S = 10.0  # a third of the patched poll: only a release signal explains a turn this soon


async def test_a_watch_fires_on_a_release_and_keeps_one_that_came_between_waits() -> None:
    signal = ReleaseSignal()
    watch = signal.watch("account:a")
    other = signal.watch("account:b")
    assert signal.watching("account:a") == 1
    assert await watch.wait(0.0) is False
    signal.released("account:a")  # before the wait: kept as a flag
    assert await watch.wait(30.0) is True
    waiting = asyncio.ensure_future(watch.wait(30.0))
    await asyncio.sleep(0)
    signal.deliver("account:a")
    assert await asyncio.wait_for(waiting, 5.0) is True
    assert await other.wait(0.0) is False  # another name's release wakes nobody here
    watch.close()
    watch.close()
    assert signal.watching("account:a") == 0
    other.close()


async def test_closing_a_watch_ends_a_wait_under_way_with_false_not_a_cancellation() -> None:
    signal = ReleaseSignal()
    watch = signal.watch("x")
    waiting = asyncio.ensure_future(watch.wait(30.0))
    await asyncio.sleep(0)
    watch.close()
    assert await asyncio.wait_for(waiting, 5.0) is False
    assert not waiting.cancelled()
    assert signal.watching("x") == 0


async def test_released_announces_to_the_peers_and_deliver_does_not() -> None:
    signal = ReleaseSignal()
    sent: list[str] = []
    signal.announce = sent.append
    signal.released("x")
    signal.deliver("y")
    assert sent == ["x"]


async def test_a_failing_announcement_still_wakes_the_local_watches() -> None:
    signal = ReleaseSignal()

    def broken(name: str) -> None:
        raise OSError("socket gone")

    signal.announce = broken
    watch = signal.watch("x")
    signal.released("x")
    assert await watch.wait(0.0) is True
    watch.close()


@pytest.mark.parametrize(("name", "error"), [("", InvalidArgumentError), (None, InvalidTypeError)])
async def test_a_bad_name_is_refused(name: Any, error: type[Exception]) -> None:
    signal = ReleaseSignal()
    with pytest.raises(error):
        signal.watch(name)
    assert signal.watching("") == 0


async def test_a_bad_timeout_is_refused_and_the_watch_keeps_its_flag() -> None:
    signal = ReleaseSignal()
    watch = signal.watch("x")
    signal.released("x")
    with pytest.raises(InvalidArgumentError):
        await watch.wait(-1.0)
    assert await watch.wait(0.0) is True
    watch.close()


def test_datagrams_carry_lock_releases_beside_the_work() -> None:
    data = encode_wakeup({"q": (2, {3, 1})}, ["account:a", "account:b"])
    assert decode_datagram(data) == ([("q", 2, [1, 3])], ["account:a", "account:b"])
    assert decode_datagram(encode_wakeup({}, ["x"])) == ([], ["x"])
    for bad in (b'[[""]]', b"[[1]]", b'[["x", 1]]'):
        assert decode_datagram(bad) == ([], [])


async def _hand_over(first_store: Any, second_store: Any, monkeypatch: pytest.MonkeyPatch) -> float:
    """The seconds from the first pool's release to the start of the second pool's turn."""
    monkeypatch.setattr(poolline, "_NEXT_POLL", SLOW_POLL)
    monkeypatch.setattr(poolline, "_LINE_POLL", SLOW_POLL)
    first = LockPool(first_store, ttl_s=60.0, holder="first")
    second = LockPool(second_store, ttl_s=60.0, holder="second")
    entered = asyncio.Event()
    release = asyncio.Event()
    started_at: list[float] = []

    async def hold() -> None:
        async with first.turn("account:hot", timeout_s=60.0, on_lost=lambda e: None):
            entered.set()
            await release.wait()

    async def wait_for_it() -> None:
        async with second.turn("account:hot", timeout_s=60.0, on_lost=lambda e: None):
            started_at.append(time.monotonic())

    holder = asyncio.ensure_future(hold())
    await entered.wait()
    waiter = asyncio.ensure_future(wait_for_it())
    for _ in range(500):  # until the second pool holds its place in line and watches the lock
        places = await second_store.list_locks(next_in_line("account:hot"))
        if places and second_store.releases.watching("account:hot"):
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError("the second pool never took its place in line")
    await asyncio.sleep(0.1)  # its first poll is over: the next is 30 s away
    release.set()
    await holder
    await first.aclose()  # the lease goes back now (nobody waits in the first pool)
    released_at = time.monotonic()
    await asyncio.wait_for(waiter, SIGNAL_BOUND_S * 2)
    await second.aclose()
    return started_at[0] - released_at


async def test_a_pool_in_line_takes_a_lock_given_back_in_the_same_store_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with MemoryStore() as store:
        assert await _hand_over(store, store, monkeypatch) < SIGNAL_BOUND_S


async def test_a_pool_in_line_takes_a_lock_another_sqlite_store_gave_back_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "locks.db")
    async with SQLiteStore(path) as first, SQLiteStore(path) as second:
        assert await _hand_over(first, second, monkeypatch) < SIGNAL_BOUND_S
        assert second._wakeup is not None
        assert second._wakeup.received >= 1


async def test_a_pool_in_line_takes_a_lock_another_postgresql_store_gave_back_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from asynccoord.backends.postgres.store import PostgresStore

    problem = postgres_problem()
    if problem is not None:
        unavailable("PostgreSQL", problem)
    schema = new_schema("rel")
    try:
        async with PostgresStore(PG_DSN, schema=schema) as first, PostgresStore(PG_DSN, schema=schema) as second:
            assert await _hand_over(first, second, monkeypatch) < SIGNAL_BOUND_S
            assert second._listener is not None
            assert second._listener.received >= 1
    finally:
        drop_schemas(schema)


async def test_without_the_channel_the_same_hand_over_waits_for_the_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "locks.db")
    monkeypatch.setattr(poolline, "_NEXT_POLL", RetryPolicy(base_s=1.5, factor=1.0, cap_s=1.5, jitter=0.0))
    monkeypatch.setattr(poolline, "_LINE_POLL", RetryPolicy(base_s=1.5, factor=1.0, cap_s=1.5, jitter=0.0))
    async with SQLiteStore(path, wakeup=False) as first, SQLiteStore(path, wakeup=False) as second:
        first_pool = LockPool(first, ttl_s=60.0, holder="first")
        second_pool = LockPool(second, ttl_s=60.0, holder="second")
        entered = asyncio.Event()
        release = asyncio.Event()

        async def hold() -> None:
            async with first_pool.turn("account:hot", timeout_s=60.0, on_lost=lambda e: None):
                entered.set()
                await release.wait()

        async def wait_for_it() -> None:
            async with second_pool.turn("account:hot", timeout_s=60.0, on_lost=lambda e: None):
                pass

        holder = asyncio.ensure_future(hold())
        await entered.wait()
        waiter = asyncio.ensure_future(wait_for_it())
        await asyncio.sleep(0.5)
        release.set()
        await holder
        await first_pool.aclose()
        # Only the second store's own signal exists, and nobody released in it: the wait runs to its poll.
        done, _ = await asyncio.wait({waiter}, timeout=0.3)
        assert not done
        await asyncio.wait_for(waiter, 10.0)
        await second_pool.aclose()
