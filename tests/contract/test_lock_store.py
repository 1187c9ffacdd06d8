"""The lock primitives of the storage contract (LockStore), on every backend, on a fake clock."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
import random
import re
from typing import Any

import pytest
from services import LOCK_BACKENDS
from support import FakeClock

from asynccoord import (
    FencingTokenRejectedError,
    InvalidArgumentError,
    InvalidTypeError,
    Lease,
    LockBusy,
    MemoryStore,
    SQLiteStore,
    StoreAlreadyOpenError,
    StoreClosedError,
)
from asynccoord import events as ev
from asynccoord.contract.locks import LockStore

Store = MemoryStore | SQLiteStore


@pytest.fixture(params=LOCK_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The lock contract also runs on the Redis lock store."""
    return str(request.param)


async def acquire(store: Store, name: str = "x", *, ttl_s: float = 1.0, permits: int = 1, holder: str = "") -> Lease:
    outcome = await store.try_acquire_lock(name, ttl_s=ttl_s, permits=permits, holder=holder)
    assert isinstance(outcome, Lease), outcome
    return outcome


async def test_both_stores_implement_the_lock_contract(store: Store) -> None:
    assert isinstance(store, LockStore)


async def test_acquire_busy_release(store: Store, clock: FakeClock) -> None:
    lease = await acquire(store, "x", ttl_s=10.0, holder="node-a")
    assert (lease.name, lease.fencing_token, lease.holder, lease.permits) == ("x", 1, "node-a", 1)
    assert lease.acquired_at == clock.now
    assert lease.expires_at == clock.now + 10.0
    assert len(lease.owner_token) == 32
    clock.advance(4.0)
    busy = await store.try_acquire_lock("x", ttl_s=1.0)
    assert busy == LockBusy(name="x", holders=1, permits=1, retry_after_s=pytest.approx(6.0))
    assert await store.try_acquire_lock("y", ttl_s=1.0)  # another name is independent
    assert await store.release_lock(lease) is True
    assert await store.release_lock(lease) is False  # already released: nothing to do
    again = await acquire(store, "x")
    assert again.fencing_token == 2
    assert again.owner_token != lease.owner_token


async def test_fencing_tokens_rise_across_release_expiry_and_reopen(make_store: Any, backend: str) -> None:
    clock = FakeClock()
    store = await make_store(clock=clock)
    tokens = [(await acquire(store, "x", ttl_s=1.0)).fencing_token]
    clock.advance(1.0)  # expired, never released
    lease = await acquire(store, "x", ttl_s=1.0)
    tokens.append(lease.fencing_token)
    await store.release_lock(lease)
    tokens.append((await acquire(store, "x", ttl_s=1.0)).fencing_token)
    await store.close()
    await store.open()
    clock.advance(5.0)
    tokens.append((await acquire(store, "x", ttl_s=1.0)).fencing_token)
    if backend == "sqlite":  # another store object on the same file, as another process would have
        other = await make_store(clock=clock)
        clock.advance(5.0)
        tokens.append((await acquire(other, "x", ttl_s=1.0)).fencing_token)
    assert tokens == list(range(1, len(tokens) + 1))


async def test_opening_an_open_store_is_refused_and_changes_nothing(store: Store) -> None:
    """A second ``open()`` or a nested ``async with store`` raises at once; the store stays
    open for the outer block (the inner block's exit closed it under the outer one)."""
    with pytest.raises(StoreAlreadyOpenError, match=re.escape(f"{store!r} is already open")):
        await store.open()
    with pytest.raises(StoreAlreadyOpenError):
        async with store:
            pass
    lease = await acquire(store, "x")
    assert await store.release_lock(lease) is True


async def test_overlapping_opens_of_one_store_open_it_once(store: Store) -> None:
    """Two ``open()`` calls at once: one opens the store, the other is refused while it does.

    Each used to pass the open check before the other finished and make its own
    connection, one of which no ``close()`` closed.
    """
    await store.close()
    results = await asyncio.gather(store.open(), store.open(), return_exceptions=True)
    assert results.count(None) == 1
    (refused,) = [r for r in results if r is not None]
    assert isinstance(refused, StoreAlreadyOpenError)
    lease = await acquire(store, "x")
    assert await store.release_lock(lease) is True
    await store.close()
    await store.open()  # closed once, it opens again


async def test_semaphore_permits_each_with_own_tokens(store: Store, clock: FakeClock) -> None:
    leases = [await acquire(store, "acct", permits=3, ttl_s=10.0 + i) for i in range(3)]
    assert [lease.fencing_token for lease in leases] == [1, 2, 3]
    assert len({lease.owner_token for lease in leases}) == 3
    busy = await store.try_acquire_lock("acct", ttl_s=1.0, permits=3)
    assert isinstance(busy, LockBusy)
    assert (busy.holders, busy.permits, busy.retry_after_s) == (3, 3, pytest.approx(10.0))
    assert await store.release_lock(leases[1]) is True
    fourth = await acquire(store, "acct", permits=3)
    assert fourth.fencing_token == 4
    clock.advance(10.5)  # leases[0] (ttl 10) and fourth (ttl 1) lapse; leases[2] (ttl 12) lives
    live = await store.list_locks("acct")
    assert [info.fencing_token for info in live] == [3]
    # The limit is judged per acquisition: an attempt asking for 1 permit sees 1 live lease.
    assert isinstance(await store.try_acquire_lock("acct", ttl_s=1.0, permits=1), LockBusy)
    assert isinstance(await store.try_acquire_lock("acct", ttl_s=1.0, permits=2), Lease)


async def test_renew_extends_a_live_lease_only(store: Store, clock: FakeClock) -> None:
    lease = await acquire(store, "x", ttl_s=1.0)
    clock.advance(0.5)
    renewed = await store.renew_lock(lease)
    assert renewed is not None
    assert renewed.expires_at == clock.now + 1.0
    assert (renewed.owner_token, renewed.fencing_token) == (lease.owner_token, lease.fencing_token)
    longer = await store.renew_lock(renewed, 5.0)
    assert longer is not None
    assert (longer.ttl_s, longer.expires_at) == (5.0, clock.now + 5.0)
    clock.advance(5.0)  # exactly at expiry: lapsed
    assert await store.renew_lock(longer) is None
    assert await store.list_locks() == []  # not revived although nobody took it
    assert await store.release_lock(longer) is False


async def test_stale_holder_cannot_release_or_renew_the_new_holders_lease(store: Store, clock: FakeClock) -> None:
    a = await acquire(store, "x", ttl_s=0.2)
    clock.advance(0.25)
    b = await acquire(store, "x", ttl_s=0.2)
    clock.advance(0.15)
    assert await store.release_lock(a) is False
    assert await store.renew_lock(a) is None
    [info] = await store.list_locks("x")
    assert (info.owner_token, info.fencing_token, info.expires_at) == (b.owner_token, 2, b.expires_at)


async def test_renew_locks_in_one_call(store: Store, clock: FakeClock) -> None:
    short = await acquire(store, "a", ttl_s=1.0)
    long = await acquire(store, "b", ttl_s=3.0)
    taken = await acquire(store, "c", ttl_s=1.0)
    await store.release_lock(taken)
    assert await store.renew_locks([]) == []
    clock.advance(1.5)  # short lapsed, long alive
    results = await store.renew_locks([short, long, taken, long])
    assert results[0] is None
    assert results[2] is None
    assert results[1] is not None
    assert results[1].expires_at == clock.now + 3.0  # each lease by its own ttl_s
    assert results[3] == results[1]
    assert [info.name for info in await store.list_locks()] == ["b"]


async def test_renew_locks_refuses_one_lease_twice_with_two_ttls_and_renews_nothing(
    store: Store, clock: FakeClock
) -> None:
    """Both answers said "renewed", each by its own ttl_s, while only one ttl_s could stick."""
    lease = await acquire(store, "a", ttl_s=1.0)
    other = await acquire(store, "b", ttl_s=1.0)
    clock.advance(0.5)
    with pytest.raises(InvalidArgumentError, match=r"leases\[2\] is the lease of leases\[0\] \(lock 'a'\)"):
        await store.renew_locks([lease, other, dataclasses.replace(lease, ttl_s=9.0)])
    assert [info.expires_at for info in await store.list_locks()] == [lease.expires_at, other.expires_at]


async def test_list_locks(store: Store, clock: FakeClock) -> None:
    b = await acquire(store, "b", ttl_s=2.0, holder="h2")
    a = await acquire(store, "a", ttl_s=5.0, holder="h1")
    await acquire(store, "gone", ttl_s=0.5)
    clock.advance(1.0)
    infos = await store.list_locks()
    assert [(i.name, i.holder, i.fencing_token, i.owner_token) for i in infos] == [
        ("a", "h1", 1, a.owner_token),
        ("b", "h2", 1, b.owner_token),
    ]
    assert infos[0].remaining_ttl_s == pytest.approx(4.0)
    assert infos[1].remaining_ttl_s == pytest.approx(1.0)
    assert [i.name for i in await store.list_locks("b")] == ["b"]
    assert await store.list_locks("nothing") == []


async def test_fence_accepts_equal_and_higher_refuses_lower(store: Store) -> None:
    assert await store.read_fence("acct") is None
    await store.fence("acct", 3)
    await store.fence("acct", 3)  # the same acquisition writes again
    record = await store.fenced_write("acct", 5, {"sent": 1})
    assert (record.resource, record.fencing_token, record.data) == ("acct", 5, {"sent": 1})
    with pytest.raises(FencingTokenRejectedError, match=r"fencing token 4 for resource 'acct' is lower than 5") as info:
        await store.fenced_write("acct", 4, {"sent": 2})
    assert (info.value.resource, info.value.fencing_token, info.value.highest) == ("acct", 4, 5)
    with pytest.raises(FencingTokenRejectedError) as info:
        await store.fence("acct", 1)
    assert (info.value.resource, info.value.fencing_token, info.value.highest) == ("acct", 1, 5)
    copy = pickle.loads(pickle.dumps(info.value))  # a refusal crosses processes whole
    assert (str(copy), copy.resource, copy.fencing_token, copy.highest) == (str(info.value), "acct", 1, 5)
    assert store.events.get(ev.FENCING_REJECTED) == 2
    await store.fence("acct", 6)  # a plain fence keeps the data
    current = await store.read_fence("acct")
    assert current is not None
    assert (current.fencing_token, current.data) == (6, {"sent": 1})


BAD_ACQUIRE: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"name": ""}, InvalidArgumentError, "name must not be empty"),
    ({"name": "n" * 256}, InvalidArgumentError, "name must be at most 255"),
    ({"name": 7}, InvalidTypeError, "name must be a str"),
    ({"name": "a\x00b"}, InvalidArgumentError, "NUL"),
    ({"name": " "}, InvalidArgumentError, "name must not be only whitespace, got ' '"),
    ({"name": "\t\r\n"}, InvalidArgumentError, "name must not be only whitespace"),
    ({"ttl_s": 0}, InvalidArgumentError, "ttl_s must be > 0, got 0"),
    ({"ttl_s": 1e-6}, InvalidArgumentError, re.escape("ttl_s must be >= 0.01 seconds (MIN_LEASE_S") + ".*got 1e-06"),
    ({"ttl_s": 0.009}, InvalidArgumentError, "ttl_s must be >= 0.01 seconds"),
    ({"ttl_s": -1.0}, InvalidArgumentError, "ttl_s must be > 0, got -1.0"),
    ({"ttl_s": float("nan")}, InvalidArgumentError, "ttl_s must be finite"),
    (
        {"ttl_s": 1e308},
        InvalidArgumentError,
        r"ttl_s must be <= 31536000 seconds \(one year, MAX_DURATION_S\), got 1e\+308",
    ),
    ({"ttl_s": float("inf")}, InvalidArgumentError, "ttl_s must be finite, got inf"),
    ({"ttl_s": "1"}, InvalidTypeError, "ttl_s must be a number"),
    ({"ttl_s": True}, InvalidTypeError, "ttl_s must be a number"),
    ({"permits": 0}, InvalidArgumentError, "permits must be >= 1, got 0"),
    ({"permits": 1.5}, InvalidTypeError, "permits must be an int"),
    ({"holder": 3}, InvalidTypeError, "holder must be a str"),
]


@pytest.mark.parametrize(("change", "error", "message"), BAD_ACQUIRE)
async def test_bad_acquire_arguments_write_nothing(
    store: Store, change: dict[str, Any], error: type[Exception], message: str
) -> None:
    args: dict[str, Any] = {"name": "x", "ttl_s": 1.0, "permits": 1, "holder": ""} | change
    before = store.transactions if isinstance(store, SQLiteStore) else 0
    with pytest.raises(error, match=message):
        await store.try_acquire_lock(args.pop("name"), **args)
    if isinstance(store, SQLiteStore):
        assert store.transactions == before
    assert await store.list_locks() == []
    assert (await acquire(store, "x")).fencing_token == 1  # no counter was bumped


async def test_bad_lease_fence_and_list_arguments(store: Store) -> None:
    lease = await acquire(store, "x")
    with pytest.raises(InvalidTypeError, match="lease must be a Lease"):
        await store.release_lock("x")  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match=r"leases\[1\] must be a Lease"):
        await store.renew_locks([lease, None])  # type: ignore[list-item]
    with pytest.raises(InvalidTypeError, match="leases must be a list or tuple"):
        await store.renew_locks(lease)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="ttl_s must be > 0"):
        await store.renew_lock(lease, 0.0)
    with pytest.raises(InvalidArgumentError, match=r"ttl_s must be >= 0\.01 seconds \(MIN_LEASE_S.*got 0\.001"):
        await store.renew_lock(lease, 0.001)  # a renewal to 1 ms: refused, the lease keeps its expiry
    with pytest.raises(InvalidArgumentError, match="resource must not be only whitespace"):
        await store.fence(" ", 1)
    with pytest.raises(InvalidArgumentError, match="fencing_token must be >= 1, got 0"):
        await store.fence("r", 0)
    with pytest.raises(InvalidTypeError, match="fencing_token must be an int"):
        await store.fence("r", "3")  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match="fencing_token must be an int"):
        await store.fenced_write("r", True, 1)
    with pytest.raises(InvalidArgumentError, match="resource must not be empty"):
        await store.fenced_write("", 1, 1)
    with pytest.raises(InvalidTypeError, match="data is not JSON-serializable"):
        await store.fenced_write("r", 1, {1, 2})
    with pytest.raises(InvalidArgumentError, match="name must be at most 255"):
        await store.list_locks("n" * 256)
    assert await store.read_fence("r") is None
    [info] = await store.list_locks()
    assert info.expires_at == lease.expires_at


TAMPERED_LEASES: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"ttl_s": float("nan")}, InvalidArgumentError, "ttl_s must be finite, got nan"),
    ({"ttl_s": 1e308}, InvalidArgumentError, "ttl_s must be <= 31536000 seconds"),
    ({"ttl_s": 0.0}, InvalidArgumentError, "ttl_s must be > 0"),
    ({"ttl_s": 0.001}, InvalidArgumentError, "ttl_s must be >= 0.01 seconds (MIN_LEASE_S"),
    ({"name": " "}, InvalidArgumentError, "name must not be only whitespace"),
    ({"owner_token": 5}, InvalidTypeError, "owner_token must be a str, got int 5"),
    ({"owner_token": ""}, InvalidArgumentError, "owner_token must not be empty"),
    ({"name": None}, InvalidTypeError, "name must be a str, got NoneType"),
    ({"fencing_token": 2**70}, InvalidArgumentError, "fencing_token must be <= 9223372036854775807"),
    ({"fencing_token": True}, InvalidTypeError, "fencing_token must be an int, got bool"),
    ({"permits": 0}, InvalidArgumentError, "permits must be >= 1, got 0"),
    ({"holder": b"h"}, InvalidTypeError, "holder must be a str, got bytes"),
]


@pytest.mark.parametrize(("change", "error", "message"), TAMPERED_LEASES)
async def test_tampered_lease_is_refused_with_a_typed_error(
    store: Store, clock: FakeClock, change: dict[str, Any], error: type[Exception], message: str
) -> None:
    lease = await acquire(store, "x", ttl_s=10.0)
    bad = dataclasses.replace(lease, **change)
    for call in (
        lambda: store.release_lock(bad),
        lambda: store.renew_lock(bad),
        lambda: store.renew_locks([lease, bad]),
    ):
        with pytest.raises(error, match=r"^leases?(\[1\])?\." + re.escape(message)):  # lease.x or leases[1].x
            await call()
    [info] = await store.list_locks()  # nothing was written
    assert (info.fencing_token, info.expires_at) == (1, lease.expires_at)
    assert await store.release_lock(lease) is True


async def test_closed_store_refuses_lock_calls(make_store: Any) -> None:
    store = await make_store()
    lease = await acquire(store, "x")
    await store.close()
    with pytest.raises(StoreClosedError):
        await store.try_acquire_lock("x", ttl_s=1.0)
    with pytest.raises(StoreClosedError):
        await store.release_lock(lease)
    with pytest.raises(StoreClosedError):
        await store.list_locks()


async def test_a_closing_store_refuses_new_calls_but_takes_a_release(make_store: Any) -> None:
    """From the moment ``close()`` is called a new call is refused, while a release (a hand-back)
    is let through and waited for: the lease is gone once the close returns."""
    store = await make_store()
    lease = await acquire(store, "x", ttl_s=60.0)
    closing = asyncio.ensure_future(store.close())
    await asyncio.sleep(0)  # close() has begun
    assert not closing.done()
    with pytest.raises(StoreClosedError):
        await store.try_acquire_lock("y", ttl_s=60.0)
    assert await store.release_lock(lease) is True
    await closing
    with pytest.raises(StoreClosedError):
        await store.release_lock(lease)
    await store.open()
    assert await store.list_locks() == []


async def test_cancelled_try_acquire_never_leaves_a_lease(store: Store) -> None:
    """Cancel attempts at random instants (for SQLite: before, during and after the commit)."""
    rng = random.Random(7)
    kept: list[Lease] = []

    async def attempt(name: str) -> None:
        outcome = await store.try_acquire_lock(name, ttl_s=60.0)
        assert isinstance(outcome, Lease)
        kept.append(outcome)

    tasks = []
    for i in range(200):
        task = asyncio.ensure_future(attempt(f"n{i}"))
        tasks.append(task)
        await asyncio.sleep(0) if rng.random() < 0.5 else None
        if rng.random() < 0.7:
            task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for _ in range(5):  # compensations run in the next transaction
        await store.now()
        await asyncio.sleep(0.01)
    live = {info.owner_token for info in await store.list_locks()}
    assert live == {lease.owner_token for lease in kept}
