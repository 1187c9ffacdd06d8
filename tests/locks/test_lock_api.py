"""Lock and Semaphore handles (asynccoord.locks.lock) on every backend, on the real clock."""

from __future__ import annotations

import asyncio
import contextlib
import random
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from services import LOCK_BACKENDS
from support import wait_until

from asynccoord import (
    InvalidArgumentError,
    InvalidTypeError,
    Lease,
    Lock,
    LockError,
    LockNotHeldError,
    LockTimeoutError,
    MemoryStore,
    RetryPolicy,
    Semaphore,
    SQLiteStore,
)
from asynccoord import events as ev

Store = MemoryStore | SQLiteStore


@pytest.fixture(params=LOCK_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The lock contract also runs on the Redis lock store."""
    return str(request.param)


@pytest.fixture
async def rstore(make_store: Any) -> Store:
    """A store on the real clock (lock waits and watchdog deadlines run on real time)."""
    store: Store = await make_store(clock=None)
    return store


class Counter:
    """A counter row in the store's database, read and written in separate steps (not atomic)."""

    def __init__(self, store: Store, db_path: Path) -> None:
        self._db: sqlite3.Connection | None = None
        self._value = 0
        if isinstance(store, SQLiteStore):
            self._db = sqlite3.connect(db_path, timeout=30.0, isolation_level=None, check_same_thread=False)
            self._db.execute("CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY, value INTEGER NOT NULL)")
            self._db.execute("INSERT OR REPLACE INTO counter VALUES (1, 0)")

    async def read(self) -> int:
        if self._db is None:
            return self._value
        db = self._db
        row = await asyncio.to_thread(lambda: db.execute("SELECT value FROM counter WHERE id = 1").fetchone())
        return int(row[0])

    async def write(self, value: int) -> None:
        if self._db is None:
            self._value = value
            return
        db = self._db
        await asyncio.to_thread(db.execute, "UPDATE counter SET value = ? WHERE id = 1", (value,))

    def close(self) -> None:
        if self._db is not None:
            self._db.close()


async def test_50_tasks_increment_a_counter_exactly(rstore: Store, db_path: Path) -> None:
    counter = Counter(rstore, db_path)
    tokens: list[int] = []

    async def worker() -> None:
        for _ in range(2):
            async with Lock(rstore, "counter", ttl_s=10.0) as lease:
                tokens.append(lease.fencing_token)
                value = await counter.read()
                await asyncio.sleep(0.001)
                await counter.write(value + 1)

    try:
        await asyncio.gather(*(worker() for _ in range(50)))
        assert await counter.read() == 100
    finally:
        counter.close()
    assert tokens == list(range(1, 101))  # in the order the holders came, one token each
    assert rstore.events.get(ev.LOCK_LOST) == 0


async def test_extend_after_expiry_fails_and_no_lock_exists(rstore: Store) -> None:
    """TTL 0.2 s, no watchdog; wait 0.4 s; extend: refused, and nothing is held afterwards."""
    lock = Lock(rstore, "x", ttl_s=0.2)
    lease = await lock.acquire()
    assert not lock.auto_renew
    await asyncio.sleep(0.4)
    with pytest.raises(LockNotHeldError, match="never revived"):
        await lock.renew()
    assert await rstore.list_locks() == []
    assert await rstore.renew_lock(lease) is None
    assert lock.lease is None
    assert rstore.events.get(ev.LOCK_LOST) == 1
    with pytest.raises(LockNotHeldError, match="holds no lease"):
        await lock.release()


async def test_stalled_release_fails_and_changes_nothing(rstore: Store) -> None:
    """A: TTL 0.2 s, stalls; B acquires at 0.25 s; A releases at 0.4 s: refused, B keeps it.

    B's own TTL is long, so that B still holds the lock when C tries, however slow the store's
    calls after A's release are (with 0.2 s, a loaded machine let B's lease lapse before C's try).
    """
    a, c = (Lock(rstore, "x", ttl_s=0.2, holder=h) for h in "ac")
    b = Lock(rstore, "x", ttl_s=10.0, holder="b")
    await a.acquire()
    await asyncio.sleep(0.25)
    b_lease = await b.try_acquire()
    assert b_lease is not None
    assert b_lease.fencing_token == 2
    await asyncio.sleep(0.15)
    with pytest.raises(LockNotHeldError, match="nothing was released"):
        await a.release()
    [info] = await rstore.list_locks("x")
    assert (info.owner_token, info.fencing_token, info.holder) == (b_lease.owner_token, 2, "b")
    assert await c.try_acquire() is None
    await b.release()


async def test_failed_try_acquire_then_release_in_finally_leaves_holder_intact(rstore: Store) -> None:
    a = Lock(rstore, "x", ttl_s=5.0)
    a_lease = await a.acquire()
    b = Lock(rstore, "x", ttl_s=5.0)

    async def b_side() -> None:
        try:
            assert await b.try_acquire() is None
        finally:
            await b.release()

    with pytest.raises(LockNotHeldError, match="holds no lease"):
        await b_side()
    [info] = await rstore.list_locks("x")
    assert (info.owner_token, info.fencing_token, info.expires_at) == (
        a_lease.owner_token,
        a_lease.fencing_token,
        a_lease.expires_at,
    )
    assert rstore.events.get(ev.LOCK_CONTENDED) == 1
    await a.release()


async def test_acquire_times_out(rstore: Store) -> None:
    holder = Lock(rstore, "x", ttl_s=5.0)
    await holder.acquire()
    waiter = Lock(rstore, "x", ttl_s=5.0)
    started = time.monotonic()
    with pytest.raises(LockTimeoutError, match=r"could not acquire 'x' within timeout_s=0.15: 1 live lease"):
        await waiter.acquire(timeout_s=0.15)
    assert 0.15 <= time.monotonic() - started < 0.4
    with pytest.raises(LockTimeoutError):
        await waiter.acquire(timeout_s=0)  # one attempt
    assert waiter.lease is None
    assert rstore.events.get(ev.LOCK_CONTENDED) == 2
    assert isinstance(LockTimeoutError("x"), TimeoutError)
    await holder.release()
    assert (await waiter.acquire(timeout_s=0)).fencing_token == 2
    await waiter.release()


async def test_same_process_waiter_wakes_on_release(rstore: Store) -> None:
    holder = Lock(rstore, "x", ttl_s=5.0)
    await holder.acquire()
    waiter = Lock(rstore, "x", ttl_s=5.0, backoff=RetryPolicy(base_s=1.0, cap_s=1.0, jitter=0.0))
    task = asyncio.ensure_future(waiter.acquire(timeout_s=5.0))
    await asyncio.sleep(0.1)  # the waiter now sleeps a backoff of 1 s
    released_at = time.monotonic()
    await holder.release()
    lease = await task
    assert time.monotonic() - released_at < 0.1
    assert lease.fencing_token == 2
    await waiter.release()


async def test_waiter_takes_over_when_the_holders_lease_expires(rstore: Store) -> None:
    holder = Lock(rstore, "x", ttl_s=0.3)  # never released
    held = await holder.acquire()
    waiter = Lock(rstore, "x", ttl_s=5.0, backoff=RetryPolicy(base_s=1.0, cap_s=1.0, jitter=0.0))
    lease = await waiter.acquire(timeout_s=2.0)
    assert held.expires_at <= lease.acquired_at < held.expires_at + 0.1  # no sleeping past the expiry
    await waiter.release()


async def test_semaphore_admits_at_most_n_holders(rstore: Store) -> None:
    inside = peak = 0
    tokens: list[int] = []

    async def worker() -> None:
        nonlocal inside, peak
        async with Semaphore(rstore, "acct", 3, ttl_s=5.0) as lease:
            tokens.append(lease.fencing_token)
            inside += 1
            peak = max(peak, inside)
            await asyncio.sleep(0.02)
            inside -= 1

    await asyncio.gather(*(worker() for _ in range(12)))
    assert peak == 3
    assert sorted(tokens) == list(range(1, 13))
    assert await rstore.list_locks() == []


async def test_handle_misuse(rstore: Store) -> None:
    lock = Lock(rstore, "x", ttl_s=5.0)
    with pytest.raises(LockNotHeldError, match="holds no lease: nothing to renew"):
        await lock.renew()
    await lock.acquire()
    with pytest.raises(LockError, match="already holds a lease"):
        await lock.acquire()
    with pytest.raises(LockError, match="already holds a lease"):
        async with lock:
            pass
    assert len(await rstore.list_locks()) == 1
    await lock.release()
    other = Lock(rstore, "y", ttl_s=5.0)
    blocker = Lock(rstore, "y", ttl_s=5.0)
    await blocker.acquire()
    waiting = asyncio.ensure_future(other.acquire())
    await asyncio.sleep(0.01)
    with pytest.raises(LockError, match="already acquiring in another task"):
        await other.try_acquire()
    await blocker.release()
    await waiting
    await other.release()


async def test_renew_and_release(rstore: Store) -> None:
    lock = Lock(rstore, "x", ttl_s=0.5)
    lease = await lock.acquire()
    renewed = await lock.renew(2.0)
    assert renewed.owner_token == lease.owner_token
    assert renewed.expires_at > lease.expires_at
    assert lock.lease == renewed
    await asyncio.sleep(0.6)  # past the original TTL, within the renewed one
    [info] = await rstore.list_locks()
    assert info.expires_at == renewed.expires_at
    await lock.release()
    assert lock.lease is None
    assert not lock.held
    assert await rstore.list_locks() == []


async def test_repr_shows_state(rstore: Store) -> None:
    lock = Lock(rstore, "acct:1", ttl_s=2.0)
    assert repr(lock) == "<Lock 'acct:1' free ttl_s=2>"
    lease = await lock.acquire()
    assert repr(lock).startswith(f"<Lock 'acct:1' held fencing_token=1 expires_at={lease.expires_at:.3f}")
    assert repr(lease).startswith(f"<Lease 'acct:1' fencing_token=1 owner={lease.owner_token[:8]} holder=")
    [info] = await rstore.list_locks()
    assert repr(info).startswith("<LockInfo 'acct:1' holder=")
    await lock.release()
    sem = Semaphore(rstore, "s", 4)
    assert repr(sem) == "<Semaphore 's' permits=4 free ttl_s=30 renew_interval_s=10>"
    async with sem:
        assert " held fencing_token=1 remaining_s=" in repr(sem)


BAD_HANDLES: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"name": ""}, InvalidArgumentError, "name must not be empty"),
    ({"name": "x" * 256}, InvalidArgumentError, "name must be at most 255 characters, got 256"),
    ({"name": None}, InvalidTypeError, "name must be a str, got NoneType"),
    ({"ttl_s": 0}, InvalidArgumentError, "ttl_s must be > 0, got 0"),
    ({"ttl_s": 0.005}, InvalidArgumentError, r"ttl_s must be >= 0\.01 seconds \(MIN_LEASE_S.*got 0\.005"),
    ({"name": "  "}, InvalidArgumentError, "name must not be only whitespace, got '  '"),
    ({"ttl_s": -2}, InvalidArgumentError, "ttl_s must be > 0, got -2"),
    ({"ttl_s": "3"}, InvalidTypeError, "ttl_s must be a number"),
    ({"timeout_s": -1}, InvalidArgumentError, "timeout_s must be >= 0, got -1"),
    ({"renew_interval_s": 0}, InvalidArgumentError, "renew_interval_s must be > 0"),
    ({"ttl_s": 1.0, "renew_interval_s": 0.95}, InvalidArgumentError, "renew_interval_s must be shorter than"),
    ({"max_hold_s": 0}, InvalidArgumentError, "max_hold_s must be > 0, got 0"),
    ({"max_hold_s": 1e-9}, InvalidArgumentError, "max_hold_s must be >= 0.01 seconds"),
    ({"release_timeout_s": 1e-9}, InvalidArgumentError, "release_timeout_s must be >= 0.001 seconds"),
    (
        {"ttl_s": 1.0, "auto_renew": False, "max_hold_s": 5.0},
        InvalidArgumentError,
        r"max_hold_s=5.0 bounds a renewed lease, but auto_renew is False",
    ),
    ({"auto_renew": 1}, InvalidTypeError, "auto_renew must be a bool"),
    ({"holder": 5}, InvalidTypeError, "holder must be a str"),
    ({"holder": ""}, InvalidArgumentError, "holder must name who holds the lock, got ''"),
    ({"holder": "  "}, InvalidArgumentError, "holder must name who holds the lock, got '  '"),
    ({"backoff": 0.1}, InvalidTypeError, "backoff must be a RetryPolicy"),
    ({"watchdog": object()}, InvalidTypeError, "watchdog must be a Watchdog"),
    ({"release_timeout_s": 0}, InvalidArgumentError, "release_timeout_s must be > 0"),
    ({"ttl_s": 1e308}, InvalidArgumentError, r"ttl_s must be <= 31536000 seconds \(one year"),
    ({"timeout_s": 1e12}, InvalidArgumentError, r"timeout_s must be <= 31536000 seconds \(one year"),
    ({"timeout_s": float("nan")}, InvalidArgumentError, "timeout_s must be finite, got nan"),
    ({"max_hold_s": float("inf")}, InvalidArgumentError, "max_hold_s must be finite, got inf"),
    ({"max_hold_s": 4e7}, InvalidArgumentError, r"max_hold_s must be <= 31536000 seconds"),
    ({"renew_interval_s": 1e308}, InvalidArgumentError, r"renew_interval_s must be <= 31536000 seconds"),
    ({"release_timeout_s": 10**400}, InvalidArgumentError, "release_timeout_s must be finite"),
    (
        {"name": "asynccoord.next:abc"},
        InvalidArgumentError,
        "'asynccoord.next:abc' is in the prefix 'asynccoord.next:'",
    ),
]


async def test_max_hold_s_with_a_ttl_turns_renewal_on(rstore: Any) -> None:
    # A ceiling on a lease that is never renewed would mean nothing: asking for one asks for renewal.
    assert Lock(rstore, "job", ttl_s=0.3, max_hold_s=1.0).auto_renew is True
    assert Lock(rstore, "job", ttl_s=0.3).auto_renew is False
    assert Semaphore(rstore, "pool", 2, ttl_s=0.3, max_hold_s=1.0).auto_renew is True


@pytest.mark.parametrize(("change", "error", "message"), BAD_HANDLES)
async def test_bad_handle_arguments(
    rstore: Store, change: dict[str, Any], error: type[Exception], message: str
) -> None:
    args: dict[str, Any] = {"name": "x"} | change
    with pytest.raises(error, match=message):
        Lock(rstore, args.pop("name"), **args)
    assert await rstore.list_locks() == []


async def test_bad_semaphore_permits_and_call_arguments(rstore: Store) -> None:
    with pytest.raises(InvalidArgumentError, match="permits must be >= 1, got 0"):
        Semaphore(rstore, "s", 0)
    with pytest.raises(InvalidTypeError, match=r"permits must be an int, got float 2\.0"):
        Semaphore(rstore, "s", 2.0)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="reserved for LockPool's places in line"):
        Semaphore(rstore, "asynccoord.next:" + "0" * 32, 2)
    with pytest.raises(InvalidTypeError, match="store must implement LockStore"):
        Lock("bot.db", "x")  # type: ignore[arg-type]
    lock = Lock(rstore, "x", ttl_s=1.0)
    with pytest.raises(InvalidArgumentError, match=r"timeout_s must be >= 0, got -0\.5"):
        await lock.acquire(timeout_s=-0.5)
    with pytest.raises(InvalidArgumentError, match=r"timeout_s must be <= 31536000 seconds"):
        await lock.acquire(timeout_s=1e308)
    await lock.acquire()
    with pytest.raises(InvalidArgumentError, match="ttl_s must be > 0, got 0"):
        await lock.renew(0)
    with pytest.raises(InvalidArgumentError, match=r"ttl_s must be <= 31536000 seconds"):
        await lock.renew(1e308)
    [info] = await rstore.list_locks()
    assert info.fencing_token == 1
    await lock.release()


# --- cancellation ------------------------------------------------------------------------


async def test_cancelled_waiting_acquire_holds_nothing(rstore: Store) -> None:
    holder = Lock(rstore, "x", ttl_s=5.0)
    held = await holder.acquire()
    waiter = Lock(rstore, "x", ttl_s=5.0)
    task = asyncio.ensure_future(waiter.acquire())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert waiter.lease is None
    assert repr(waiter) == "<Lock 'x' free ttl_s=5>"
    await holder.release()

    async def no_lease_left() -> bool:
        return await rstore.list_locks() == []

    # A late grant to the cancelled waiter (below) is released in the background.
    await wait_until(no_lease_left, timeout_s=10.0, what="no lease left")
    # An attempt already sent when the waiter was cancelled goes on; on a loaded machine it may
    # reach the server after the release (even after the list above) and be granted, then handed
    # back at once, its token spent: the next acquisition may wait for that hand-back, well under
    # the 5 s TTL a leaked lease would hold it for, and its token is higher, not necessarily the next.
    assert (await waiter.acquire(timeout_s=2.0)).fencing_token > held.fencing_token
    await waiter.release()


async def test_acquire_cancelled_at_any_instant_never_leaks_a_lease(rstore: Store) -> None:
    rng = random.Random(3)
    handles = [Lock(rstore, f"n{i}", ttl_s=30.0) for i in range(60)]
    tasks = [asyncio.ensure_future(h.acquire()) for h in handles]
    for task in tasks:
        await asyncio.sleep(rng.choice([0, 0, 0.0002, 0.0005, 0.001, 0.002]))
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    held = {h.lease.owner_token for h in handles if h.lease is not None}

    async def only_held_remain() -> bool:
        return {info.owner_token for info in await rstore.list_locks()} == held

    # Leases granted as their caller was cancelled are released in the background; on a loaded
    # machine that can take longer than any fixed pause, but never as long as their 30 s TTL.
    await wait_until(only_held_remain, timeout_s=10.0, what="the cancelled acquisitions' releases")
    for task, handle in zip(tasks, handles, strict=True):
        assert (handle.lease is not None) == (not task.cancelled())


async def test_a_lock_acquisition_cancelled_just_before_close_leaves_no_lease(make_store: Any, backend: str) -> None:
    """A ``Lock`` acquisition cancelled a few loop turns in, then ``close()`` at once.

    The grant its call may still bring is released by the lock in a task of its own (its
    caller is gone); the closing store lets that hand-back through and waits for it, so
    after the close no lease of the lock is live, as another store on the same database
    sees (the memory store: the same object, opened again). Refused as a new call, the
    release would leave the lease held for its 60 s TTL.
    """
    store = await make_store(clock=None)
    other = store if backend == "memory" else await make_store(clock=None)
    cancelled = 0
    for round_ in range(40):
        name = f"L{round_}"
        lock = Lock(store, name, ttl_s=60.0)
        acquiring = asyncio.ensure_future(lock.acquire())
        for _ in range(round_ % 8):
            await asyncio.sleep(0)
        acquiring.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await acquiring
        if not acquiring.cancelled():
            await lock.release()  # acquired before the cancellation: held by its caller
            continue
        cancelled += 1
        await store.close()
        if other is store:
            await store.open()
            assert await store.list_locks(name) == [], round_
        else:
            assert await other.list_locks(name) == [], round_
            await store.open()
    assert cancelled >= 16


async def test_cancelled_release_still_releases(rstore: Store) -> None:
    lock = Lock(rstore, "x", ttl_s=30.0)
    await lock.acquire()
    task = asyncio.ensure_future(lock.release())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert lock.lease is None
    assert await rstore.list_locks() == []  # released before the cancellation was re-raised
    assert (await Lock(rstore, "x", ttl_s=1.0).acquire(timeout_s=0)).fencing_token == 2


async def test_outside_cancellation_of_the_block_propagates_and_releases(rstore: Store) -> None:
    lock = Lock(rstore, "x", ttl_s=0.6, renew_interval_s=0.2)
    entered = asyncio.Event()

    async def holder() -> None:
        async with lock:
            entered.set()
            await asyncio.sleep(10)

    task = asyncio.ensure_future(holder())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await rstore.list_locks() == []
    assert rstore.events.get(ev.LOCK_LOST) == 0


async def test_exception_in_block_propagates_and_releases(rstore: Store) -> None:
    with pytest.raises(KeyError, match="boom"):
        async with Lock(rstore, "x", ttl_s=5.0):
            raise KeyError("boom")
    assert await rstore.list_locks() == []


async def test_lease_records_are_plain_values(rstore: Store) -> None:
    async with Lock(rstore, "x", ttl_s=5.0, holder="me") as lease:
        assert isinstance(lease, Lease)
        assert lease.holder == "me"
        with pytest.raises(AttributeError):
            lease.fencing_token = 9  # type: ignore[misc]


def stall_after_first_grant(store: Store, stall_s: float) -> list[Lease]:
    """Make the store's first lock grant reach its caller ``stall_s`` late, the event loop blocked
    meanwhile (a GC pause, a SIGSTOP, swap); return the leases granted, in order."""
    granted: list[Lease] = []
    acquire = store.try_acquire_lock

    async def try_acquire_lock(name: str, **kwargs: Any) -> Any:
        outcome = await acquire(name, **kwargs)
        if isinstance(outcome, Lease):
            granted.append(outcome)
            if len(granted) == 1:
                time.sleep(stall_s)
        return outcome

    store.try_acquire_lock = try_acquire_lock  # type: ignore[method-assign]
    return granted


@pytest.mark.parametrize("kind", ["lock", "semaphore"])
async def test_a_grant_arriving_past_its_local_deadline_is_released_and_not_used(
    rstore: Store, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A block never starts on a lease whose local deadline passed before the grant arrived:
    another holder may have the lock by then. The late lease is released and the acquisition
    goes on, so the block runs on a fresh lease it holds."""
    granted = stall_after_first_grant(rstore, 0.35)
    handle = (
        Lock(rstore, "acct", ttl_s=0.3, timeout_s=5.0)
        if kind == "lock"
        else Semaphore(rstore, "acct", permits=2, ttl_s=0.3, timeout_s=5.0)
    )
    async with handle as lease:
        assert handle.held
        assert [g.fencing_token for g in granted] == [1, 2]
        assert lease == granted[1]
        assert [info.fencing_token for info in await rstore.list_locks("acct")] == [2]  # the late one released
    assert "asynccoord.lock.grant_too_late name='acct' fencing_token=1" in caplog.text


async def test_try_acquire_refuses_a_grant_arriving_past_its_local_deadline(rstore: Store) -> None:
    granted = stall_after_first_grant(rstore, 0.35)
    lock = Lock(rstore, "acct", ttl_s=0.3)
    assert await lock.try_acquire() is None
    assert not lock.held

    async def released() -> bool:
        return await rstore.list_locks("acct") == []

    await wait_until(released, 5.0, "the late lease released in the background")
    assert await lock.try_acquire() == granted[1]
    assert granted[1].fencing_token == 2
    await lock.release()


async def test_grants_always_arriving_late_end_in_a_timeout_with_backoff_and_counted_contention(rstore: Store) -> None:
    """A store whose every grant arrives past the local deadline (a TTL below its round trip): the
    wait still ends at ``timeout_s``, backs off between attempts, and counts its contention once."""
    acquire = rstore.try_acquire_lock
    grants: list[Lease] = []

    async def slow_reply(name: str, **kwargs: Any) -> Any:
        outcome = await acquire(name, **kwargs)
        if isinstance(outcome, Lease):
            grants.append(outcome)
            await asyncio.sleep(0.03)  # past 0.9 of the 0.03 s TTL
        return outcome

    rstore.try_acquire_lock = slow_reply  # type: ignore[method-assign]
    contended = rstore.events.snapshot().get(ev.LOCK_CONTENDED, 0)
    started = time.monotonic()
    with pytest.raises(LockTimeoutError, match="its grant arrived past its local deadline"):
        await Lock(
            rstore, "acct", ttl_s=0.03, backoff=RetryPolicy(base_s=0.05, factor=1.0, cap_s=0.05, jitter=0.0)
        ).acquire(timeout_s=0.5)
    assert 0.5 <= time.monotonic() - started < 2.0
    assert 3 <= len(grants) <= 8  # about one attempt per 0.05 s backoff plus its 0.03 s reply, not a busy loop
    assert rstore.events.snapshot().get(ev.LOCK_CONTENDED, 0) - contended == 1
    assert await rstore.list_locks("acct") == []  # each late lease released before the next attempt
