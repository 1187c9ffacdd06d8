"""Send-time pacing of a lock's sends (asynccoord/locks/pacing.py), on a fake monotonic clock.

A pacer's bucket is a GCRA on the times its process sends under a lock: the tests drive it
with a clock that only the sleeps move, and check each send's time against the limit.
"""

from __future__ import annotations

import itertools
import logging

import pytest

from asynccoord import NodeConfig, RateLimit
from asynccoord.locks import pacing
from asynccoord.locks.pacing import LIMITS_REFRESH_S, LockPacer

LIMIT = RateLimit(dimension="account", count=10, per_s=1.0, burst=3)  # T = 0.1 s, tau = 0.2 s
T = 0.1


class Clock:
    def __init__(self) -> None:
        self.t = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds


def make() -> tuple[LockPacer, Clock]:
    clock = Clock()
    return LockPacer(clock=clock, sleep=clock.sleep), clock


async def sends(pacer: LockPacer, clock: Clock, n: int, token: int, name: str = "acct:a") -> list[float]:
    at = []
    for _ in range(n):
        await pacer.pace(name, token, LIMIT)
        at.append(round(clock.t - 100.0, 9))
    return at


async def test_a_new_holder_starts_from_an_empty_bucket_one_interval_after_taking_over() -> None:
    pacer, clock = make()
    # Another process may have spent every token up to its release: one send per interval from now.
    assert await sends(pacer, clock, 4, token=7) == pytest.approx([0.1, 0.2, 0.3, 0.4])


async def test_the_next_lease_of_the_same_process_carries_its_bucket_on() -> None:
    pacer, clock = make()
    await sends(pacer, clock, 1, token=1)  # at 0.1: the bucket owes 0.2 from here
    clock.t += 1.0  # idle: the bucket refills to its burst
    # Token 2 follows token 1: nobody held the lock in between, so the burst is there.
    assert await sends(pacer, clock, 4, token=2) == pytest.approx([1.1, 1.1, 1.1, 1.2])


async def test_a_lease_after_someone_elses_resets_the_bucket() -> None:
    pacer, clock = make()
    await sends(pacer, clock, 1, token=1)
    clock.t += 1.0
    # Token 5: leases 2 to 4 were other holders', whose sends this process never saw.
    assert await sends(pacer, clock, 3, token=5) == pytest.approx([1.2, 1.3, 1.4])


async def test_a_backlog_goes_at_exactly_the_sustained_rate_after_the_burst() -> None:
    pacer, clock = make()
    await sends(pacer, clock, 1, token=1)
    clock.t += 5.0
    at = await sends(pacer, clock, 10, token=1)
    assert at[:3] == pytest.approx([5.1, 5.1, 5.1])  # the burst
    gaps = [b - a for a, b in itertools.pairwise(at[2:])]
    assert gaps == pytest.approx([T] * 7)


async def test_names_are_paced_apart() -> None:
    pacer, clock = make()
    await sends(pacer, clock, 1, token=1, name="acct:a")
    clock.t += 1.0
    assert await sends(pacer, clock, 1, token=1, name="acct:b") == pytest.approx([1.2])  # b: new, one interval
    assert await sends(pacer, clock, 3, token=1, name="acct:a") == pytest.approx([1.2, 1.2, 1.2])


async def test_a_forgotten_name_starts_over_from_an_empty_bucket(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pacing, "_NAMES", 2)
    pacer, clock = make()
    await sends(pacer, clock, 1, token=1, name="a")
    await sends(pacer, clock, 1, token=1, name="b")
    await sends(pacer, clock, 1, token=1, name="c")  # "a" is forgotten
    clock.t += 1.0
    start = clock.t
    await pacer.pace("a", 2, LIMIT)  # token 2 would carry a's bucket on, had it been kept
    assert clock.t - start == pytest.approx(T)


class Store:
    def __init__(self, declared: list[RateLimit]) -> None:
        self.declared = declared
        self.reads: list[str] = []

    async def rate_limits(self, queue: str) -> list[RateLimit]:
        self.reads.append(queue)
        return self.declared


async def test_limits_are_read_once_per_refresh() -> None:
    pacer, clock = make()
    store = Store([LIMIT, RateLimit(dimension="chat", count=1, per_s=1.0)])
    assert await pacer.limit(store, "outbox", "account") == LIMIT
    assert await pacer.limit(store, "outbox", "group") is None
    assert store.reads == ["outbox"]
    clock.t += LIMITS_REFRESH_S
    store.declared = []
    assert await pacer.limit(store, "outbox", "account") is None  # the limit was removed
    assert store.reads == ["outbox", "outbox"]
    other = Store([])
    assert await pacer.limit(other, "outbox", "account") is None  # another store: its own read
    assert other.reads == ["outbox"]


class Turn:
    def __init__(self, fencing_token: int = 3) -> None:
        from asynccoord.contract.locks import Lease

        self.lease = Lease(
            name="acct:a",
            owner_token="o",
            fencing_token=fencing_token,
            holder="h",
            permits=1,
            ttl_s=5,
            acquired_at=0,
            expires_at=5,
        )
        self.checks = 0

    def check(self) -> None:
        self.checks += 1


def settings(lock_wait_s: float = 5.0, dimension: str | None = "account") -> NodeConfig:
    return NodeConfig(queue="outbox", lock_wait_s=lock_wait_s, lock_pace_dimension=dimension)


class Flight:
    def __init__(self, lease_deadline: float) -> None:
        self.lease_deadline = lease_deadline


async def test_pace_turn_paces_to_the_declared_limit_and_checks_the_turn_after_a_wait() -> None:
    pacer, clock = make()
    turn, flight = Turn(), Flight(clock.t + 30)
    assert await pacer.pace_turn(Store([LIMIT]), settings(), turn, flight) == pytest.approx(T)
    assert turn.checks == 1  # a lock lost during the wait stops the send
    clock.t += 5.0
    assert await pacer.pace_turn(Store([LIMIT]), settings(), turn, flight) == 0.0  # the burst
    assert turn.checks == 1
    assert clock.slept == pytest.approx([T])


async def test_pace_turn_leaves_alone_what_needs_no_pacing() -> None:
    pacer, clock = make()
    turn, flight = Turn(), Flight(clock.t + 30)
    assert await pacer.pace_turn(Store([]), settings(), turn, flight) == 0.0  # no limit declared
    assert await pacer.pace_turn(Store([LIMIT]), settings(dimension=None), turn, flight) == 0.0
    # An interval as long as the lock wait: the claim's tokens keep it within one interval already.
    slow = RateLimit(dimension="account", count=1, per_s=5.0)
    assert await pacer.pace_turn(Store([slow]), settings(lock_wait_s=5.0), turn, flight) == 0.0
    assert clock.slept == []
    assert await pacer.pace_turn(Store([slow]), settings(lock_wait_s=5.001), turn, flight) == pytest.approx(5.0)


UNKNOWN = "asynccoord.node.lock_pace_unknown_dimension"


def unknown_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "asynccoord.locks.pacing" and UNKNOWN in r.message]


async def test_a_dimension_the_queue_does_not_declare_is_warned_of_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="asynccoord.locks.pacing")
    pacer, clock = make()
    turn, flight = Turn(), Flight(clock.t + 30)
    chat = RateLimit(dimension="chat", count=1, per_s=1.0)
    store = Store([])
    assert await pacer.pace_turn(store, settings(dimension="acount"), turn, flight) == 0.0
    assert unknown_warnings(caplog) == []  # no limits declared yet: they may come later
    clock.t += LIMITS_REFRESH_S
    store.declared = [LIMIT, chat]
    for _ in range(5):
        assert await pacer.pace_turn(store, settings(dimension="acount"), turn, flight) == 0.0
    assert unknown_warnings(caplog) == [
        f"{UNKNOWN} queue='outbox' dimension='acount' declared=['account', 'chat']: the queue declares no rate "
        "limit on this dimension, so the sends its lock serialises are not paced; set "
        "NodeConfig(lock_pace_dimension=...) (--lock-pace) to a declared dimension, or declare the limit "
        "(store.set_rate_limits)"
    ]
    assert [r.levelno for r in caplog.records if UNKNOWN in r.message] == [logging.WARNING]
    assert await pacer.pace_turn(store, settings(dimension="account"), turn, flight) == pytest.approx(T)
    assert await pacer.pace_turn(store, settings(dimension="group"), turn, flight) == 0.0
    assert len(unknown_warnings(caplog)) == 2  # another dimension: its own warning
    assert "dimension='group'" in unknown_warnings(caplog)[1]


async def test_a_pace_ends_at_the_tasks_lease_deadline_and_takes_no_token() -> None:
    pacer, clock = make()
    turn, flight = Turn(), Flight(clock.t + T / 2)
    assert await pacer.pace_turn(Store([LIMIT]), settings(), turn, flight) is None
    assert clock.slept == pytest.approx([T / 2])  # up to the deadline, where the send finds its lease lapsed
    assert await pacer.pace_turn(Store([LIMIT]), settings(), turn, flight) is None  # past it: no wait at all
    assert clock.slept == pytest.approx([T / 2])
    # No token was taken: with a lease renewed, the send goes one interval after the lease was first seen.
    flight.lease_deadline = clock.t + 30
    assert await pacer.pace_turn(Store([LIMIT]), settings(), turn, flight) == pytest.approx(T / 2)
    assert await pacer.pace_turn(Store([LIMIT]), settings(), turn, flight) == pytest.approx(T)


async def test_a_pace_follows_a_deadline_that_renewals_move_on() -> None:
    pacer, clock = make()
    deadlines = iter([clock.t + T / 4, clock.t + T / 2, clock.t + 30])

    def renewed() -> float:
        return next(deadlines)

    assert await pacer.pace("acct:a", 1, LIMIT, deadline=renewed) == pytest.approx(T)
    assert clock.slept == pytest.approx([T / 4, T / 4, T / 2])
