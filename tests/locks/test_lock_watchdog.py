"""The lock watchdog (asynccoord.locks.watchdog): renewal, loss, max hold, and its end, on every backend."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import pytest
from services import LOCK_BACKENDS

from asynccoord import (
    InvalidArgumentError,
    InvalidTypeError,
    Lease,
    Lock,
    LockLostError,
    LockNotHeldError,
    MaxHoldExceededError,
    MemoryStore,
    Semaphore,
    SQLiteStore,
    StoreError,
    Watchdog,
)
from asynccoord import events as ev
from asynccoord.locks import watchdogtask
from asynccoord.locks.watchdog import IDLE_EXIT_S, Guard

# Renewal moments and prompt cancellations are judged to a tenth of a second; the tests mostly wait,
# so they run beside each other (quiet), apart from the ordinary tests.
pytestmark = pytest.mark.quiet

Store = MemoryStore | SQLiteStore


@pytest.fixture(params=LOCK_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The lock contract also runs on the Redis lock store."""
    return str(request.param)


@pytest.fixture
async def rstore(make_store: Any) -> Store:
    """A store on the real clock (watchdog deadlines run on real time)."""
    store: Store = await make_store(clock=None)
    return store


class RenewalLog:
    """Wraps ``store.renew_locks`` to record when each owner token was sent for renewal."""

    def __init__(self, store: Store) -> None:
        self.sent: list[tuple[float, str]] = []
        self._inner = store.renew_locks

        async def renew_locks(leases: Sequence[Lease]) -> list[Lease | None]:
            now = time.monotonic()
            self.sent.extend((now, lease.owner_token) for lease in leases)
            return await self._inner(leases)

        store.renew_locks = renew_locks  # type: ignore[method-assign]

    def after(self, instant: float, owner_token: str) -> list[float]:
        return [t for t, token in self.sent if token == owner_token and t > instant]


def watchdog_tasks() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name() == "asynccoord-lock-watchdog" and not t.done()]


async def test_job_of_three_ttls_keeps_its_lock(rstore: Store) -> None:
    # A TTL of 0.6 s: the watchdog stops the job if no renewal is confirmed for 0.54 s, so
    # a stall of the machine's disk of a few hundred milliseconds (seen once on a freshly
    # booted machine with a TTL of 0.3 s) does not read as a lost lock.
    lock = Lock(rstore, "job", ttl_s=0.6, renew_interval_s=0.2)
    intruder = Lock(rstore, "job", ttl_s=0.6)
    stolen = 0
    async with lock as lease:
        started = time.monotonic()
        while time.monotonic() - started < 1.8:
            if await intruder.try_acquire() is not None:
                stolen += 1
                await intruder.release()
            await asyncio.sleep(0.02)
        assert lock.held
        [info] = await rstore.list_locks("job")
        assert info.owner_token == lease.owner_token
    assert stolen == 0
    assert lock.watchdog.statistics().renewed >= 7
    assert rstore.events.get(ev.LOCK_LOST) == 0
    assert await intruder.try_acquire() is not None
    await intruder.release()


async def test_job_past_max_hold_is_cancelled_and_the_lock_freed(rstore: Store) -> None:
    lock = Lock(rstore, "job", ttl_s=0.3, renew_interval_s=0.1, max_hold_s=0.5)
    started = time.monotonic()
    with pytest.raises(MaxHoldExceededError, match="max_hold_s"):
        async with lock:
            await asyncio.sleep(5)
    assert 0.5 <= time.monotonic() - started < 0.8
    other = await Lock(rstore, "job", ttl_s=1.0).acquire(timeout_s=0.3)  # within one TTL (here: at once)
    assert other.fencing_token == 2
    assert rstore.events.get(ev.LOCK_LOST) == 1
    assert lock.watchdog.statistics().max_hold_exceeded == 1


async def test_explicit_hold_past_max_hold_lapses_within_one_ttl(rstore: Store) -> None:
    lock = Lock(rstore, "job", ttl_s=0.3, renew_interval_s=0.1, max_hold_s=0.4)
    lease = await lock.acquire()
    await asyncio.sleep(0.45)
    assert isinstance(lock.lost, MaxHoldExceededError)
    assert not lock.held
    other = await Lock(rstore, "job", ttl_s=1.0).acquire(timeout_s=0.5)  # renewals stopped: it lapses
    assert other.acquired_at - lease.acquired_at < 0.4 + 0.3 + 0.1
    with pytest.raises(LockNotHeldError, match="nothing was released") as info:
        await lock.release()
    assert isinstance(info.value.__cause__, MaxHoldExceededError)


async def test_taken_over_lock_cancels_the_block_promptly(rstore: Store) -> None:
    lock = Lock(rstore, "x", ttl_s=0.6, renew_interval_s=0.1)
    cancelled_at = 0.0
    thieves: list[Lease] = []

    async def guarded() -> None:
        nonlocal cancelled_at
        async with lock as lease:
            await rstore.release_lock(lease)  # someone deletes it...
            thieves.append(await Lock(rstore, "x", ttl_s=5.0).acquire(timeout_s=0))  # ...and takes it
            started = time.monotonic()
            try:
                await asyncio.sleep(5)
            finally:
                cancelled_at = time.monotonic() - started

    with pytest.raises(LockLostError, match="had expired or been taken over") as info:
        await guarded()
    [thief] = thieves
    assert type(info.value) is LockLostError
    assert cancelled_at < 0.1 + 0.1  # the next renewal round noticed
    assert rstore.events.get(ev.LOCK_LOST) == 1
    [held] = await rstore.list_locks("x")
    assert held.owner_token == thief.owner_token  # the loser's exit did not touch the new holder


@pytest.mark.parametrize("failure", ["hang", "error"])
async def test_unreachable_store_stops_the_block_before_the_lease_expires(rstore: Store, failure: str) -> None:
    real_renew = rstore.renew_locks
    calls = 0

    async def broken_renew(leases: Sequence[Lease]) -> list[Lease | None]:
        nonlocal calls
        calls += 1
        if failure == "hang":
            await asyncio.sleep(30)
        raise StoreError("disk unplugged")

    rstore.renew_locks = broken_renew  # type: ignore[method-assign]
    # The local deadline comes 10 % of the TTL before the store's expiry: 0.1 s here, so an
    # event loop held up by the machine for less than that still stops the block in time.
    lock = Lock(rstore, "x", ttl_s=1.0, renew_interval_s=0.2)
    stopped_at = 0.0
    leases: list[Lease] = []

    async def guarded() -> None:
        nonlocal stopped_at
        async with lock as lease:
            leases.append(lease)
            try:
                await asyncio.sleep(5)
            finally:
                stopped_at = time.monotonic()  # (an await here would be cancelled too)

    with pytest.raises(LockLostError, match="was not renewed in time") as info:
        await guarded()
    [lease] = leases
    store_time_at_stop = await rstore.now() - (time.monotonic() - stopped_at)
    assert store_time_at_stop < lease.expires_at  # stopped while the store still counted it ours
    assert lease.expires_at - store_time_at_stop < 0.25  # the margin, 0.1 s, and the acquisition's own time
    assert type(info.value) is LockLostError
    if failure == "error":
        assert calls >= 2  # retried before giving up
        assert lock.watchdog.statistics().renew_errors == calls
    rstore.renew_locks = real_renew  # type: ignore[method-assign]


async def test_blocked_event_loop_past_the_ttl_is_reported_at_exit(rstore: Store) -> None:
    with pytest.raises(LockLostError, match="not renewed in time"):
        async with Lock(rstore, "x", ttl_s=0.2, renew_interval_s=0.05):
            time.sleep(0.3)  # no await: the watchdog cannot run before the block ends
    assert rstore.events.get(ev.LOCK_LOST) == 1
    assert await rstore.list_locks() == []


async def test_block_without_watchdog_is_cancelled_at_its_deadline(rstore: Store) -> None:
    lock = Lock(rstore, "x", ttl_s=0.3)
    started = time.monotonic()
    with pytest.raises(LockLostError, match=r"is not renewed \(auto_renew off\) and the block outlived its TTL"):
        async with lock:
            await asyncio.sleep(5)
    assert 0.25 <= time.monotonic() - started < 0.3  # before the store's expiry (10 % margin)


async def test_outside_cancellation_wins_over_a_simultaneous_loss(rstore: Store) -> None:
    lock = Lock(rstore, "x", ttl_s=5.0)
    entered = asyncio.Event()

    async def holder() -> None:
        async with lock:
            entered.set()
            await asyncio.sleep(10)

    task = asyncio.ensure_future(holder())
    await entered.wait()
    lock._on_lost(LockLostError("lost in the same loop iteration"))  # the watchdog's callback...
    task.cancel()  # ...and a cancellation from outside, together
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await rstore.list_locks() == []


async def test_a_watchdog_cancelled_from_outside_keeps_renewing_until_the_lease_is_released(rstore: Store) -> None:
    """asyncio.run cancels every task at a program's exit, the watchdog among them, while the
    holders it also cancelled are about to release their leases: those are not given up meanwhile."""
    lock = Lock(rstore, "x", ttl_s=0.3, renew_interval_s=0.1)
    lease = await lock.acquire()
    await asyncio.sleep(0.01)  # the watchdog task has begun (one cancelled before its first step never runs)
    [task] = watchdog_tasks()
    task.cancel()
    await asyncio.sleep(0.6)  # two TTLs: only renewals kept it
    assert lock.lost is None
    assert lock.held
    assert [info.owner_token for info in await rstore.list_locks()] == [lease.owner_token]
    assert not task.done()
    await lock.release()
    assert await rstore.list_locks() == []
    await asyncio.wait({task}, timeout=1.0)
    assert task.cancelled()  # the cancellation, delivered once nothing was left to guard
    assert lock.watchdog.statistics().lost == 0


@pytest.mark.parametrize("rule", ["idle", "grace"])
async def test_a_watchdog_cancelled_from_outside_gives_up_a_lease_nobody_releases(
    rstore: Store, monkeypatch: pytest.MonkeyPatch, rule: str
) -> None:
    """Released by nobody (acquired with ``Lock.acquire`` and forgotten): given up once no lease was
    released for OUTSIDE_IDLE_S, or OUTSIDE_GRACE_S after the cancellation at the latest."""
    monkeypatch.setattr(watchdogtask, "OUTSIDE_IDLE_S" if rule == "idle" else "OUTSIDE_GRACE_S", 0.3)
    lost: list[LockLostError] = []
    lock = Lock(rstore, "x", ttl_s=5.0, renew_interval_s=1.0, on_lost=lost.append)
    await lock.acquire()  # never released
    await asyncio.sleep(0.01)
    [task] = watchdog_tasks()
    cancelled_at = time.monotonic()
    task.cancel()
    await asyncio.wait({task}, timeout=2.0)
    assert 0.3 <= time.monotonic() - cancelled_at < 0.8
    assert task.cancelled()
    assert [str(e) for e in lost] == ["the watchdog was cancelled: lock 'x' is no longer renewed"]
    assert lock.lost is lost[0]


async def test_a_watchdog_cancelled_from_outside_gives_up_at_once_what_a_closed_store_held(rstore: Store) -> None:
    """A program that ended with a lock it never released: ``asyncio.run`` cancels the watchdog
    after the store's ``async with`` closed it; nothing can be released any more, nothing waits."""
    lost: list[LockLostError] = []
    lock = Lock(rstore, "x", ttl_s=5.0, renew_interval_s=1.0, on_lost=lost.append)
    await lock.acquire()
    await asyncio.sleep(0.01)
    [task] = watchdog_tasks()
    await rstore.close()
    cancelled_at = time.monotonic()
    task.cancel()
    await asyncio.wait({task}, timeout=2.0)
    assert time.monotonic() - cancelled_at < 0.2
    assert task.cancelled()
    assert len(lost) == 1


async def test_no_renewal_after_release_returns(rstore: Store) -> None:
    log = RenewalLog(rstore)
    lock = Lock(rstore, "x", ttl_s=0.3, renew_interval_s=0.05)
    lease = await lock.acquire()
    await asyncio.sleep(0.2)
    assert log.after(0.0, lease.owner_token)  # it was being renewed
    await lock.release()
    released_at = time.monotonic()
    await asyncio.sleep(0.3)
    assert log.after(released_at, lease.owner_token) == []
    assert lock.watchdog.statistics().guarded == 0
    assert watchdog_tasks() == []


async def test_no_renewal_after_a_cancelled_acquire(rstore: Store) -> None:
    log = RenewalLog(rstore)
    holder = Lock(rstore, "x", ttl_s=5.0)
    await holder.acquire()
    waiter = Lock(rstore, "x", ttl_s=0.3, renew_interval_s=0.05)
    task = asyncio.ensure_future(waiter.acquire())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await holder.release()
    await asyncio.sleep(0.3)
    assert log.sent == []
    assert waiter.watchdog.statistics().guarded == 0
    assert await rstore.list_locks() == []


async def test_no_renewal_after_the_holder_task_ends(rstore: Store) -> None:
    """A guard tied to its holder task (the default; a lock's ``async with`` block) ends with it."""
    log = RenewalLog(rstore)
    watchdog = Watchdog.for_store(rstore)

    async def forgetful_holder() -> Lease:
        sent_at = time.monotonic()
        lease = await rstore.try_acquire_lock("x", ttl_s=0.3)
        assert isinstance(lease, Lease)
        watchdog.guard(lease, sent_at=sent_at, renew_interval_s=0.05)
        return lease  # and never releases

    lease = await asyncio.ensure_future(forgetful_holder())
    ended_at = time.monotonic()
    await asyncio.sleep(0)  # the task's done-callbacks (ours first, then the guard's) have run
    assert watchdog.statistics().guarded == 0
    await asyncio.sleep(0.35)
    assert log.after(ended_at, lease.owner_token) == []
    assert await rstore.list_locks() == []  # it lapsed by its TTL


async def test_a_lock_acquired_in_a_task_that_ends_is_renewed_until_released(rstore: Store) -> None:
    """``Lock.acquire`` outside ``async with``: the renewal belongs to the handle (issue #39), so the
    lock stays held while the acquiring task is gone, and nothing is renewed after ``release``."""
    log = RenewalLog(rstore)
    lock = Lock(rstore, "x", ttl_s=0.3, renew_interval_s=0.05)

    async def helper() -> Lease:
        return await lock.acquire()

    lease = await asyncio.ensure_future(helper())
    ended_at = time.monotonic()
    await asyncio.sleep(0.35)
    assert log.after(ended_at, lease.owner_token) != []
    assert [info.owner_token for info in await rstore.list_locks()] == [lease.owner_token]
    assert lock.held
    await lock.release()
    released_at = time.monotonic()
    assert lock.watchdog.statistics().guarded == 0
    await asyncio.sleep(0.1)
    assert log.after(released_at, lease.owner_token) == []


async def test_one_watchdog_per_store_and_none_running_when_idle(rstore: Store) -> None:
    assert Watchdog.for_store(rstore) is Watchdog.for_store(rstore)
    assert Lock(rstore, "x").watchdog is Watchdog.for_store(rstore)
    async with Lock(rstore, "x", ttl_s=0.3, renew_interval_s=0.1), Lock(rstore, "y", ttl_s=0.3, renew_interval_s=0.1):
        assert len(watchdog_tasks()) == 1
        assert Watchdog.for_store(rstore).statistics().guarded == 2
    await asyncio.sleep(IDLE_EXIT_S + 0.05)  # it lingers a moment, then ends
    assert watchdog_tasks() == []
    with pytest.raises(InvalidTypeError, match="store must implement LockStore"):
        Watchdog(object())  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=r"safety_margin_ratio must be <= 0\.5"):
        Watchdog(rstore, safety_margin_ratio=0.6)


async def test_a_watchdog_of_another_store_is_refused(rstore: Store) -> None:
    other = Watchdog(MemoryStore())
    assert other.store is not rstore
    for make in (
        lambda: Lock(rstore, "x", ttl_s=0.6, auto_renew=True, watchdog=other),
        lambda: Semaphore(rstore, "x", 2, ttl_s=0.6, auto_renew=True, watchdog=other),
    ):
        with pytest.raises(InvalidArgumentError, match=r"^watchdog <Watchdog .*> renews the leases of another store"):
            make()
    assert await rstore.list_locks() == []  # nothing was written
    assert other.statistics().guarded == 0
    # A watchdog of the lock's own store (not the default one) renews it past its TTL.
    own = Watchdog(rstore)
    assert own.store is rstore
    lock = Lock(rstore, "x", ttl_s=0.3, auto_renew=True, watchdog=own)
    async with lock as lease:
        await asyncio.sleep(0.5)
        assert lock.held
        assert own.statistics().renewed >= 1
        assert [i.name for i in await rstore.list_locks()] == ["x"]
    assert lease.name == "x"
    assert await rstore.list_locks() == []
    await own.aclose()


async def test_leases_of_many_ttls_are_renewed_together(rstore: Store) -> None:
    watchdog = Watchdog(rstore)
    guards = []
    # TTLs long enough that a machine stall of a few hundred ms loses no lease (0.3 s did
    # on a loaded CI machine), short enough that 2 s hold many renewals of each.
    for i, ttl in enumerate([0.6, 0.6, 1.2, 1.8]):
        sent_at = time.monotonic()
        lease = await rstore.try_acquire_lock(f"n{i}", ttl_s=ttl)
        assert isinstance(lease, Lease)
        guards.append(watchdog.guard(lease, sent_at=sent_at))
    await asyncio.sleep(2.0)
    stats = watchdog.statistics()
    assert stats.lost == 0
    assert all(g.active and g.remaining_s() > 0 for g in guards)
    assert stats.renewed >= 14  # each lease about every ttl / 3 seconds: 28, at least half of them
    # Leases due together share a round: 2.0 s / (0.6 / 3) = 10 rounds, plus slack; renewed
    # one by one (their own rounds) they would take 10 + 10 + 5 + 3 = 28.
    assert stats.renew_rounds <= 14
    await watchdog.aclose()
    assert not any(g.active for g in guards)
    assert watchdog_tasks() == []


@pytest.mark.slow
@pytest.mark.exclusive  # it computes: 10,000 leases renewed on time need the machine to itself
async def test_10000_held_locks_cost_one_statement_per_interval(make_store: Any, backend: str) -> None:
    store: Store = await make_store(clock=None)
    rounds: list[tuple[float, int, int]] = []  # (start, leases, write transactions so far) per renew_locks call
    round_done = asyncio.Event()
    inner = store.renew_locks

    async def renew_locks(leases: Sequence[Lease]) -> list[Lease | None]:
        started = time.monotonic()
        try:
            return await inner(leases)
        finally:
            rounds.append((started, len(leases), store.transactions if isinstance(store, SQLiteStore) else 0))
            round_done.set()

    store.renew_locks = renew_locks  # type: ignore[method-assign]
    watchdog = Watchdog(store)
    # One Redis script renews all 10,000 leases; on this 2-core machine that takes 0.4 to 0.6 s,
    # so its interval leaves it room (the claim is statements per interval, not their speed).
    # The other stores renew them in one statement of well under 0.2 s.
    interval_s = 1.0 if backend == "redis" else 0.5
    ttl_s, n, chunk = 4.0, 10_000, 1000
    guards = []
    for first in range(0, n, chunk):  # guarded chunk by chunk, each from the instant it was asked for
        sent_at = time.monotonic()
        names = [f"acct:{i}" for i in range(first, first + chunk)]
        for outcome in await asyncio.gather(*(store.try_acquire_lock(name, ttl_s=ttl_s) for name in names)):
            assert isinstance(outcome, Lease)
            guards.append(watchdog.guard(outcome, sent_at=sent_at, renew_interval_s=interval_s))

    # The chunks, acquired at different times, share rounds once their due times meet;
    # on a loaded machine a slow round may split them again. Either way every interval
    # renews all 10,000 leases with a handful of statements, never one round trip per lock.
    await asyncio.sleep(2 * interval_s)  # settle
    start = len(rounds)
    writes_before = store.transactions if isinstance(store, SQLiteStore) else 0
    await asyncio.sleep(4 * interval_s)
    window = rounds[start:]
    assert sum(size for _, size, _ in window) >= 3 * n  # each lease renewed about once per interval
    assert len(window) <= 2 * 5  # at most ~2 statements per interval for 10,000 leases
    assert max(size for _, size, _ in window) >= n // 2  # leases share statements
    if isinstance(store, SQLiteStore):
        assert store.transactions - writes_before <= 2 * 5 + 1  # write transactions over the window
    stats = watchdog.statistics()
    assert stats.lost == 0
    live = await store.list_locks()
    assert len(live) == n
    assert min(info.remaining_ttl_s for info in live) > 0
    await watchdog.aclose()
    assert watchdog.statistics().guarded == 0
    assert not any(g.active for g in guards)


async def guard_twice(
    store: Store, watchdog: Watchdog, *, ttls_s: tuple[float, float], intervals_s: tuple[float, float]
) -> tuple[Guard, Guard]:
    """Guard one lease twice through the public API: as acquired (``ttls_s[0]``), and as renewed
    to ``ttls_s[1]`` (same owner token), each renewed every ``intervals_s[i]``."""
    sent_at = time.monotonic()
    lease = await store.try_acquire_lock("job", ttl_s=ttls_s[0])
    assert isinstance(lease, Lease)
    first = watchdog.guard(lease, sent_at=sent_at, renew_interval_s=intervals_s[0])
    sent_at = time.monotonic()
    renewed = await store.renew_lock(lease, ttls_s[1])
    assert renewed is not None
    return first, watchdog.guard(renewed, sent_at=sent_at, renew_interval_s=intervals_s[1])


async def test_one_lease_guarded_twice_with_two_ttls_is_renewed_once_by_the_longer(rstore: Store) -> None:
    """Guarding a lease and its renewed copy (same owner token, another ttl_s) through the public
    API put both in every round; once ``renew_locks`` refused such a pair, each round failed as a
    whole and every other lock of the store lapsed (a breaker's find)."""
    sent_tokens = RenewalLog(rstore)
    bystander = Lock(rstore, "bystander", ttl_s=0.3, renew_interval_s=0.1)
    async with bystander:
        watchdog = Watchdog.for_store(rstore)
        first, second = await guard_twice(rstore, watchdog, ttls_s=(0.3, 0.9), intervals_s=(0.1, 0.1))
        await asyncio.sleep(0.7)
        assert bystander.held
        assert first.active
        assert second.active
        assert watchdog.statistics().renew_errors == 0
        rounds = [t for t, token in sent_tokens.sent if token == first.lease.owner_token]
        assert rounds
        assert len(rounds) == len(set(rounds))
        [info] = await rstore.list_locks("job")
        assert info.remaining_ttl_s > 0.6  # renewed by the longer ttl_s
        first.close()
        second.close()
        await rstore.release_lock(second.lease)
    assert rstore.events.get(ev.LOCK_LOST) == 0


async def test_a_round_in_flight_does_not_undo_an_explicit_renew_to_a_longer_ttl(rstore: Store) -> None:
    """A round sent before ``lock.renew(ttl_s=30)`` and applied after it left the store at the
    round's 0.6 s; the round's result then replaced the guard's lease, so every later round
    renewed by 0.6 s too, while the guard's local deadline kept the 30 s (a breaker's find)."""
    inner = rstore.renew_locks
    in_flight, proceed = asyncio.Event(), asyncio.Event()

    async def held_back(leases: Sequence[Lease]) -> list[Lease | None]:
        if not in_flight.is_set():
            in_flight.set()
            await proceed.wait()
        return await inner(leases)

    rstore.renew_locks = held_back  # type: ignore[method-assign]
    lock = Lock(rstore, "job", ttl_s=0.6, renew_interval_s=0.2)
    async with lock:
        await asyncio.wait_for(in_flight.wait(), 2.0)  # the first round is on its way
        renewed = await lock.renew(ttl_s=30.0)
        proceed.set()  # ...and lands after the explicit renew
        await asyncio.sleep(0.5)
        [info] = await rstore.list_locks("job")
        assert info.remaining_ttl_s > 25.0
        assert lock.lease is not None
        assert lock.lease.ttl_s == renewed.ttl_s == 30.0
        guard = lock._guard
        assert guard is not None
        assert guard.remaining_s() > 25.0


@pytest.mark.parametrize(
    ("changes", "error", "named"),
    [
        ({"lease": None}, InvalidTypeError, "lease"),
        ({"sent_at": float("nan")}, InvalidArgumentError, "sent_at"),
        ({"sent_at": float("inf")}, InvalidArgumentError, "sent_at"),
        ({"sent_at": "now"}, InvalidTypeError, "sent_at"),
        ({"sent_at": None}, InvalidTypeError, "sent_at"),
        ({"sent_at": 1e12}, InvalidArgumentError, "in the future"),
        ({"renew": "yes"}, InvalidTypeError, "renew"),
        ({"on_lost": 5}, InvalidTypeError, "on_lost"),
        ({"task": 5}, InvalidTypeError, "task"),
    ],
)
async def test_guard_refuses_a_bad_argument_and_guards_nothing(
    rstore: Store, changes: dict[str, Any], error: type[Exception], named: str
) -> None:
    """``sent_at=nan`` was accepted, and the guard never renewed nor reported the lease's loss."""
    lease = await rstore.try_acquire_lock("job", ttl_s=1.0)
    watchdog = Watchdog.for_store(rstore)

    async def async_on_lost(_error: LockLostError) -> None:
        pass

    arguments: dict[str, Any] = {"lease": lease, "sent_at": time.monotonic(), **changes}
    with pytest.raises(error, match=named):
        watchdog.guard(**arguments)
    with pytest.raises(InvalidTypeError, match="on_lost"):
        watchdog.guard(lease, sent_at=time.monotonic(), on_lost=async_on_lost)  # type: ignore[arg-type]
    assert watchdog.statistics().guarded == 0


async def test_an_explicit_renew_to_a_shorter_ttl_brings_the_local_deadline_in(rstore: Store) -> None:
    """The guard kept the longer deadline (``max``) after ``lock.renew(ttl_s=1.0)`` on a 6 s lease:
    the store's lease lapsed at 1 s while the block ran on, and another holder could take the lock
    meanwhile (a breaker's find)."""
    lock = Lock(rstore, "job", ttl_s=6.0, auto_renew=False)
    stopped_after = 0.0

    async def guarded() -> None:
        nonlocal stopped_after
        async with lock:
            started = time.monotonic()
            await lock.renew(ttl_s=1.0)
            try:
                await asyncio.sleep(3.0)
            finally:
                stopped_after = time.monotonic() - started

    with pytest.raises(LockLostError):
        await guarded()
    assert 0.8 < stopped_after < 1.0  # at the local deadline (0.9 of the TTL), before the store's expiry


async def test_a_round_renews_a_lease_for_every_guard_of_it(rstore: Store) -> None:
    """A lease guarded twice (30 s renewed every 10 s, and a 3 s copy renewed every second): the
    short guard's rounds renewed the lease by 3 s alone, under the long guard's 27 s deadline."""
    watchdog = Watchdog.for_store(rstore)
    long, short = await guard_twice(rstore, watchdog, ttls_s=(30.0, 3.0), intervals_s=(10.0, 1.0))
    await asyncio.sleep(1.3)  # the short guard's first round
    assert watchdog.statistics().renew_rounds >= 1
    [info] = await rstore.list_locks("job")
    for guard in (long, short):
        assert guard.active
        assert guard.remaining_s() <= info.remaining_ttl_s  # no guard outlasts the store's lease
    long.close()
    short.close()
    await rstore.release_lock(short.lease)


async def _store_remaining_s(store: Store, lease: Lease) -> float:
    infos = [i for i in await store.list_locks(lease.name) if i.owner_token == lease.owner_token]
    return infos[0].remaining_ttl_s if infos else 0.0


async def test_a_renew_to_a_shorter_ttl_that_never_answers_still_brings_the_deadline_in(rstore: Store) -> None:
    """``lock.renew(ttl_s=1.0)`` timed out after its write landed: the guard kept the 10 s
    deadline while the store's lease lapsed at 1 s (a breaker's find). The deadline now comes
    in when the renewal is sent, whatever becomes of it."""
    inner = rstore.renew_lock

    async def slow_answer(lease: Lease, ttl_s: float | None = None) -> Lease | None:
        renewed = await inner(lease, ttl_s)  # the write lands...
        await asyncio.sleep(0.5)  # ...and its answer is late
        return renewed

    rstore.renew_lock = slow_answer  # type: ignore[method-assign]
    lock = Lock(rstore, "job", ttl_s=10.0, auto_renew=False)
    async with lock as lease:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(lock.renew(ttl_s=1.0), 0.1)
        guard = lock._guard
        assert guard is not None
        assert guard.remaining_s() <= await _store_remaining_s(rstore, lease)
        assert guard.remaining_s() < 1.0


async def test_a_rounds_late_answer_counts_a_shorter_renew_that_may_have_landed_after_it(rstore: Store) -> None:
    """A round (4 s) lands, its answer is held back; an explicit renew to 0.7 s lands after it
    and answers at once. When the round's answer comes, the store holds 0.7 s: the deadline must
    not go back to the round's 4 s (a breaker's stress run: guard 3.3 s against store 0.5 s)."""
    inner = rstore.renew_locks
    landed, answer = asyncio.Event(), asyncio.Event()

    async def late_answer(leases: Sequence[Lease]) -> list[Lease | None]:
        renewed = await inner(leases)
        if not landed.is_set():
            landed.set()
            await answer.wait()
        return renewed

    rstore.renew_locks = late_answer  # type: ignore[method-assign]
    lock = Lock(rstore, "job", ttl_s=4.0, renew_interval_s=0.5)
    async with lock as lease:
        await asyncio.wait_for(landed.wait(), 2.0)  # the round's 4 s write is in the store
        await lock.renew(ttl_s=0.7)  # lands after it
        answer.set()
        await asyncio.sleep(0.05)  # the round's answer is taken
        guard = lock._guard
        assert guard is not None
        assert guard.remaining_s() <= await _store_remaining_s(rstore, lease)


async def test_a_lease_guarded_in_one_watchdog_is_refused_by_another(rstore: Store) -> None:
    """Two watchdogs guarding one lease do not see each other's renewals (a breaker's run: 732 to
    1,089 samples of a guard past the store's expiry, and another holder took the lock)."""
    first, second = Watchdog(rstore), Watchdog(rstore)
    sent_at = time.monotonic()
    lease = await rstore.try_acquire_lock("job", ttl_s=2.0)
    assert isinstance(lease, Lease)
    guard = first.guard(lease, sent_at=sent_at)
    with pytest.raises(InvalidArgumentError, match="guarded by another watchdog"):
        second.guard(lease, sent_at=sent_at)
    assert second.statistics().guarded == 0
    guard.close()
    second.guard(lease, sent_at=sent_at).close()  # once the first let go, the other may
    await first.aclose()
    await second.aclose()
