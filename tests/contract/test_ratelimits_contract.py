"""Rate limits, run unchanged on every backend (memory, SQLite, PostgreSQL) on the fake clock.

The claim takes a token from each bucket a task names (GCRA per (queue, dimension, key));
these tests drive the store clock by hand, so refills, bursts and pauses are exact.
"""

from __future__ import annotations

import logging
import math
import random
import re
import sqlite3
from collections.abc import Callable

import pytest
from support import ROOT, FakeClock, wait_until

from asynccoord import (
    InvalidArgumentError,
    InvalidTypeError,
    LeaseLostError,
    NewTask,
    RateLimit,
    RateLimited,
    TaskStatus,
)
from asynccoord import events as ev
from asynccoord.backends.limitwatch import CHANGED
from asynccoord.contract.ratelimits import (
    MIN_EMISSION_INTERVAL_S,
    check_rate_limits,
    conforms,
    max_in_window,
    parse_rate_limit,
    paused_tat,
    take,
)

SHARED = pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)  # stores of one database

Q = "outbox"


def chat(key: str, **extra: str) -> dict[str, str]:
    return {"chat": key, **extra}


async def claim_ids(store, n: int = 100, **kwargs) -> list[int]:
    return [t.id for t in await store.claim(Q, node_id="n", limit=n, **kwargs)]


async def enqueue(store, keys: dict[str, str], payload: object = None, **kwargs) -> int:
    result = await store.enqueue(Q, payload, limit_keys=keys, **kwargs)
    return result.task.id


# --- the arithmetic ---------------------------------------------------------------


def test_gcra_spacing_and_burst() -> None:
    limit = RateLimit(dimension="chat", count=2, per_s=1.0, burst=3)
    tat = None
    taken = 0
    for _ in range(10):  # at one instant: exactly the burst
        if conforms(tat, 100.0, limit):
            tat = take(tat, 100.0, limit)
            taken += 1
    assert taken == 3
    assert not conforms(tat, 100.49, limit)
    assert conforms(tat, 100.5, limit)  # one interval (1/2 s) later: one more
    assert max_in_window(limit) == 5


def most_in_window(times: list[float], window_s: float, *, closed: bool) -> int:
    """The most of ``times`` in any window ``[t, t + window_s]`` (or ``[t, t + window_s)``)."""
    return max(sum(1 for u in times if t <= u and (u - t <= window_s if closed else u - t < window_s)) for t in times)


def greedy_claims(limit: RateLimit, n: int, delays: list[float] | None = None) -> list[float]:
    """The times of ``n`` claims of one key, each as soon as GCRA allows (plus ``delays``)."""
    tat, now, times = None, 0.0, []
    for i in range(n):
        if tat is not None:
            now = max(now, tat - limit.tolerance_s)
        now += delays[i] if delays else 0.0
        assert conforms(tat, now, limit)
        tat = take(tat, now, limit)
        times.append(now)
    return times


@pytest.mark.parametrize(("count", "per_s", "burst"), [(5, 1.0, 2), (4, 1.0, 1), (2, 1.0, 3), (8, 2.0, 8)])
def test_a_window_of_per_s_holds_count_plus_burst_claims_at_most_and_at_best(
    count: int, per_s: float, burst: int
) -> None:
    limit = RateLimit(dimension="chat", count=count, per_s=per_s, burst=burst)
    times = greedy_claims(limit, 4 * (count + burst))
    # burst at the window's start, then one every per_s / count, the last at its end
    assert most_in_window(times, per_s, closed=True) == max_in_window(limit) == count + burst
    assert most_in_window(times, per_s, closed=False) == count + burst - 1
    rng = random.Random(count * 100 + burst)
    for _ in range(20):  # claims that come later than they may never fill a window more
        delays = [rng.choice([0.0, 0.0, rng.uniform(0, 2 * limit.interval_s)]) for _ in range(60)]
        assert most_in_window(greedy_claims(limit, 60, delays), per_s, closed=True) <= max_in_window(limit)


def test_the_docs_state_the_window_bound_max_in_window_gives() -> None:
    readme = (ROOT / "README.md").read_text("utf-8")
    stated = {
        "RateLimit": re.search(
            r"any\s+window\s+of\s+``per_s``\s+seconds\s+(?:thus\s+)?holds\s+at\s+most\s+``([^`]+)``",
            RateLimit.__doc__ or "",
            re.I,
        ),
        "max_in_window": re.search(
            r"window of ``per_s`` seconds may hold per key: ``([^`]+)``", max_in_window.__doc__ or ""
        ),
        "README": re.search(r"In any window of `per_s` seconds a key gets at most `([^`]+)`", readme),
    }
    assert {doc: m.group(1) if m else None for doc, m in stated.items()} == dict.fromkeys(stated, "count + burst")


def test_pause_only_raises_the_tat() -> None:
    limit = RateLimit(dimension="chat", count=1, per_s=1.0, burst=3)
    assert paused_tat(None, 50.0, limit) == 52.0  # tolerance 2 s: the first token at 50
    assert not conforms(52.0, 49.9, limit)
    assert conforms(52.0, 50.0, limit)
    assert paused_tat(80.0, 50.0, limit) == 80.0


def test_parse_rate_limit() -> None:
    assert parse_rate_limit("account=30/1s,burst=30") == RateLimit(dimension="account", count=30, per_s=1.0, burst=30)
    assert parse_rate_limit("group=20/60s") == RateLimit(dimension="group", count=20, per_s=60.0)
    assert parse_rate_limit("group=20/1m") == RateLimit(dimension="group", count=20, per_s=60.0)
    assert parse_rate_limit("chat=1/500ms,burst=2").per_s == 0.5
    for bad in ("chat", "chat=1", "chat=x/1s", "chat=1/xs", "chat=1/1s,bursty=2", "chat=0/1s", "chat=1/0s"):
        with pytest.raises(InvalidArgumentError):
            parse_rate_limit(bad)
    with pytest.raises(InvalidArgumentError, match=r"only one burst=N may follow the rate"):
        parse_rate_limit("account=5/1s,burst=2,burst=3")  # said: burst '2,burst=3' is not a whole number


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"count": 0}, InvalidArgumentError),
        ({"count": -1}, InvalidArgumentError),
        ({"per_s": 0.0}, InvalidArgumentError),
        ({"per_s": -1.0}, InvalidArgumentError),
        ({"per_s": math.nan}, InvalidArgumentError),
        ({"per_s": math.inf}, InvalidArgumentError),
        ({"burst": 0}, InvalidArgumentError),
        ({"count": 1.5}, InvalidTypeError),
        ({"dimension": ""}, InvalidArgumentError),
        ({"per_s": "1"}, InvalidTypeError),
        ({"per_s": 10**400}, InvalidArgumentError),  # an int beyond the float range: no OverflowError
    ],
)
def test_bad_limit_is_refused(kwargs: dict[str, object], error: type[Exception]) -> None:
    fields: dict[str, object] = {"dimension": "chat", "count": 1, "per_s": 1.0, "burst": 1, **kwargs}
    with pytest.raises(error):
        RateLimit(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: RateLimit(dimension="chat", count=1, per_s=True), "per_s must be a number of seconds, got bool True"),
        (lambda: RateLimit(dimension="chat", count=1, per_s="1"), "per_s must be a number of seconds, got str '1'"),
        (lambda: RateLimited(True), "retry_after_s must be a number of seconds, got bool True"),
        (lambda: RateLimited("5"), "retry_after_s must be a number of seconds, got str '5'"),
        (lambda: check_rate_limits({"chat": 1}), "limits must be a list or tuple of RateLimit, got dict {'chat': 1}"),
        (lambda: check_rate_limits(["chat=1/1s"]), "limits[0] must be a RateLimit, got str 'chat=1/1s'"),
        (lambda: parse_rate_limit(30), "a rate limit must be a str, got int 30"),
    ],
)
def test_a_value_of_the_wrong_type_is_named_in_the_error(call: Callable[[], object], message: str) -> None:
    with pytest.raises(InvalidTypeError, match=f"^{re.escape(message)}$"):
        call()


@pytest.mark.parametrize(
    ("count", "per_s"), [(2**31 - 1, 5e-324), (2**31 - 1, 1.0), (1_000_001, 1.0), (1, 9.9e-7), (3, 1e-300)]
)
def test_an_emission_interval_below_a_microsecond_is_refused(count: int, per_s: float) -> None:
    with pytest.raises(InvalidArgumentError, match=r"^per_s / count must be at least 1e-06 s") as caught:
        RateLimit(dimension="chat", count=count, per_s=per_s)
    assert f"per_s={per_s!r} / count={count}" in str(caught.value)
    with pytest.raises(InvalidArgumentError, match="per_s / count"):
        parse_rate_limit(f"chat={count}/{per_s!r}s")


def test_the_emission_interval_floor_is_where_a_bucket_time_still_moves() -> None:
    assert MIN_EMISSION_INTERVAL_S == 1e-6
    floor = RateLimit(dimension="chat", count=1_000_000, per_s=1.0)  # the floor itself is accepted
    assert floor.interval_s == 1e-6
    now = 1.8e9  # seconds since the epoch, as the stores keep a bucket's time
    tat = now
    for _ in range(1000):
        tat = take(tat, now, floor)
    assert tat - now == pytest.approx(1000 * 1e-6, rel=0.15)  # every claim moved it on
    assert now + 1e-7 == now  # a tenth of the floor is lost to rounding: such a limit would limit nothing


async def test_a_stored_limit_below_the_floor_from_an_earlier_version_still_loads(tmp_path) -> None:
    from asynccoord import SQLiteStore

    path = tmp_path / "old.db"
    async with SQLiteStore(path) as store:
        await store.set_rate_limits(Q, [RateLimit(dimension="chat", count=1, per_s=1.0)])
    with sqlite3.connect(path) as raw:  # as an earlier version, without the floor, stored it
        raw.execute("UPDATE coord_rate_limits SET count = ?, per_s = ?", (2**31 - 1, 1.0))
    async with SQLiteStore(path) as store:
        [old] = await store.rate_limits(Q)
        assert (old.dimension, old.count, old.per_s, old.burst) == ("chat", 2**31 - 1, 1.0, 1)
        ids = [await enqueue(store, chat("a")) for _ in range(3)]
        assert await claim_ids(store) == ids  # claims go on as they did: it holds nothing back
        with pytest.raises(InvalidArgumentError, match="per_s / count"):
            await store.set_rate_limits(Q, [RateLimit(dimension="chat", count=2**31 - 1, per_s=1.0)])


@pytest.mark.parametrize(
    "retry_after_s",
    [
        math.nan,
        -1.0,
        math.inf,
        -math.inf,
        pytest.param(10**400, id="huge-int"),
        pytest.param(-(10**400), id="-huge-int"),
    ],
)
def test_bad_retry_after_is_refused(retry_after_s: float) -> None:
    with pytest.raises(InvalidArgumentError, match="retry_after_s"):
        RateLimited(retry_after_s)
    with pytest.raises(InvalidTypeError):
        RateLimited("5")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        RateLimited(1.0, key="42")  # a key needs its dimension


def test_bad_limit_keys_are_refused() -> None:
    with pytest.raises(InvalidTypeError):
        NewTask(queue=Q, limit_keys=["chat"])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        NewTask(queue=Q, limit_keys={"chat": ""})
    with pytest.raises(InvalidTypeError):
        NewTask(queue=Q, limit_keys={"chat": 42})  # type: ignore[dict-item]


# --- the contract on every store ----------------------------------------------------


async def test_declared_limits_are_stored(store) -> None:
    limits = [
        RateLimit(dimension="chat", count=1, per_s=1.0, burst=3),
        RateLimit(dimension="account", count=30, per_s=1.0, burst=30),
    ]
    assert await store.rate_limits(Q) == []
    assert await store.limited_queues() == []
    await store.set_rate_limits(Q, limits)
    await store.set_rate_limits("b-other", limits[:1])
    assert await store.rate_limits(Q) == sorted(limits, key=lambda limit: limit.dimension)
    assert await store.limited_queues() == sorted([Q, "b-other"])  # neither holds a task
    await store.set_rate_limits(Q, [])
    assert await store.rate_limits(Q) == []
    assert await store.limited_queues() == ["b-other"]


async def test_bad_declarations_write_nothing(store) -> None:
    await store.set_rate_limits(Q, [RateLimit(dimension="chat", count=1, per_s=1.0)])
    twice = [RateLimit(dimension="chat", count=1, per_s=1.0), RateLimit(dimension="chat", count=2, per_s=1.0)]
    with pytest.raises(InvalidArgumentError, match="twice"):
        await store.set_rate_limits(Q, twice)
    with pytest.raises(InvalidTypeError):
        await store.set_rate_limits(Q, [("chat", 1, 1.0)])
    assert await store.rate_limits(Q) == [RateLimit(dimension="chat", count=1, per_s=1.0)]


async def test_a_bucket_refills_at_its_rate(store, clock: FakeClock) -> None:
    await store.set_rate_limits(Q, [RateLimit(dimension="chat", count=2, per_s=1.0)])
    ids = [await enqueue(store, chat("a")) for _ in range(5)]
    assert await claim_ids(store) == ids[:1]
    assert await claim_ids(store) == []  # no token left; the others stay pending, no attempt used
    held = await store.get(ids[1])
    assert held.status is TaskStatus.PENDING
    assert held.attempts == 0
    assert held.lease_token is None
    clock.advance(0.49)
    assert await claim_ids(store) == []
    clock.advance(0.01)
    assert await claim_ids(store) == ids[1:2]
    clock.advance(10.0)  # a long idle time gives back one token only: burst 1
    assert await claim_ids(store) == ids[2:3]
    assert store.events.get(ev.RATE_LIMIT_HELD) >= 3


async def test_burst_then_steady_rate(store, clock: FakeClock) -> None:
    await store.set_rate_limits(Q, [RateLimit(dimension="chat", count=1, per_s=1.0, burst=3)])
    ids = [await enqueue(store, chat("a")) for _ in range(6)]
    assert await claim_ids(store) == ids[:3]
    clock.advance(0.999)
    assert await claim_ids(store) == []
    clock.advance(0.001)
    assert await claim_ids(store) == ids[3:4]
    clock.advance(5.0)  # refilled to the burst, not beyond
    assert await claim_ids(store) == ids[4:6]


async def test_several_limits_on_one_task(store, clock: FakeClock) -> None:
    await store.set_rate_limits(
        Q,
        [
            RateLimit(dimension="chat", count=1, per_s=1.0, burst=2),
            RateLimit(dimension="account", count=3, per_s=1.0, burst=3),
        ],
    )
    a = [await enqueue(store, chat("a", account="x")) for _ in range(3)]
    b = [await enqueue(store, chat("b", account="x")) for _ in range(3)]
    c = [await enqueue(store, chat("c", account="y")) for _ in range(1)]
    # Account x has 3 tokens; chat a and chat b 2 each; account y is independent.
    assert await claim_ids(store) == [a[0], a[1], b[0], c[0]]
    clock.advance(1.0 / 3 + 1e-6)  # account x: one token; chat a: none, chat b: its second
    assert await claim_ids(store) == [b[1]]
    clock.advance(2.0 / 3)  # chats a, b: one each; account x: two
    assert await claim_ids(store) == [a[2], b[2]]


async def test_a_task_without_a_key_is_not_limited(store) -> None:
    await store.set_rate_limits(Q, [RateLimit(dimension="chat", count=1, per_s=60.0)])
    limited = [await enqueue(store, chat("a")) for _ in range(2)]
    free = [await enqueue(store, {}) for _ in range(3)]
    assert await claim_ids(store) == [limited[0], *free]


async def test_a_throttled_key_never_holds_back_others(store, clock: FakeClock) -> None:
    await store.set_rate_limits(Q, [RateLimit(dimension="chat", count=1, per_s=1.0)])
    busy = [await enqueue(store, chat("busy"), priority=5) for _ in range(50)]
    quiet = [await enqueue(store, chat(f"q{i}")) for i in range(3)]
    assert await claim_ids(store, n=2) == [busy[0], quiet[0]]
    assert await claim_ids(store, n=2) == quiet[1:3]  # the busy key's 49 are skipped past
    clock.advance(1.0)
    assert await claim_ids(store, n=2) == [busy[1]]


async def test_order_kept_in_an_ordered_queue(store, clock: FakeClock) -> None:
    await store.set_rate_limits(Q, [RateLimit(dimension="chat", count=1, per_s=1.0)])
    ids = [await enqueue(store, chat("a"), payload=i, partition_key="conv-a") for i in range(4)]
    other = await enqueue(store, chat("b"), partition_key="conv-b")
    sent: list[int] = []
    for _ in range(4):
        tasks = await store.claim(Q, node_id="n", limit=10, ordered=True)
        for task in tasks:
            sent.append(task.id)
            following = await store.complete_and_claim_next(task)
            assert following.next_task is None  # a limited head is left to the claim
        clock.advance(1.0)
    assert sent == [ids[0], other, ids[1], ids[2], ids[3]]


async def test_no_attempt_used_while_held(store, clock: FakeClock) -> None:
    await store.set_rate_limits(Q, [RateLimit(dimension="chat", count=1, per_s=10.0)])
    first = await enqueue(store, chat("a"), max_attempts=1)
    second = await enqueue(store, chat("a"), max_attempts=1)
    assert await claim_ids(store) == [first]
    for _ in range(20):
        assert await claim_ids(store) == []
        clock.advance(0.45)
    clock.advance(1.0)
    task = (await store.claim(Q, node_id="n"))[0]
    assert task.id == second
    assert task.attempts == 1


async def test_a_crashed_claims_token_is_not_handed_back(store, clock: FakeClock) -> None:
    await store.set_rate_limits(Q, [RateLimit(dimension="chat", count=1, per_s=10.0)])
    first = await enqueue(store, chat("a"))
    second = await enqueue(store, chat("a"))
    assert await claim_ids(store, lease_s=1.0) == [first]
    clock.advance(2.0)  # the lease lapsed: the task is due again, but the bucket is empty
    assert await claim_ids(store) == []
    clock.advance(8.0)
    assert await claim_ids(store) == [first]  # re-sent with the next token; the second waits another 10 s
    assert second not in await claim_ids(store)


async def test_reported_rate_limit_pauses_the_bucket(store, clock: FakeClock) -> None:
    await store.set_rate_limits(
        Q,
        [
            RateLimit(dimension="chat", count=10, per_s=1.0, burst=10),
            RateLimit(dimension="account", count=100, per_s=1.0),
        ],
    )
    a = [await enqueue(store, chat("a", account="x"), partition_key="conv-a") for _ in range(3)]
    b = await enqueue(store, chat("b", account="x"), partition_key="conv-b")
    task = (await store.claim(Q, node_id="n", ordered=True))[0]
    assert task.id == a[0]
    assert task.attempts == 1
    back = await store.report_rate_limited(task, 5.0, dimension="chat")
    assert back.status is TaskStatus.PENDING
    assert back.attempts == 0
    assert back.lease_token is None
    assert store.events.get(ev.PROVIDER_RATE_LIMITED) == 1
    clock.advance(0.01)
    assert await claim_ids(store, ordered=True) == [b]  # chat a is paused, chat b flows
    clock.advance(4.98)
    assert await claim_ids(store, ordered=True) == []
    clock.advance(0.02)
    assert await claim_ids(store, ordered=True) == [a[0]]  # its place kept: the conversation's head
    clock.advance(0.01)
    assert await claim_ids(store, ordered=True) == []  # back at the sustained rate, not a burst


async def test_unnamed_rate_limit_pauses_every_bucket_of_the_task(store, clock: FakeClock) -> None:
    await store.set_rate_limits(
        Q, [RateLimit(dimension="chat", count=10, per_s=1.0), RateLimit(dimension="account", count=10, per_s=1.0)]
    )
    first = await enqueue(store, chat("a", account="x"))
    same_account = await enqueue(store, chat("b", account="x"))
    elsewhere = await enqueue(store, chat("c", account="y"))
    task = (await store.claim(Q, node_id="n"))[0]
    await store.report_rate_limited(task, 3.0)
    clock.advance(1.0)
    assert await claim_ids(store) == [elsewhere]
    clock.advance(2.0)
    assert await claim_ids(store) == [first]
    clock.advance(0.1)
    assert await claim_ids(store) == [same_account]


async def test_named_account_key_pauses_that_account(store, clock: FakeClock) -> None:
    await store.set_rate_limits(Q, [RateLimit(dimension="account", count=10, per_s=1.0)])
    first = await enqueue(store, {"account": "x"})
    second = await enqueue(store, {"account": "x"})
    task = (await store.claim(Q, node_id="n"))[0]
    await store.report_rate_limited(task, 2.0, dimension="account", key="x")
    clock.advance(1.9)
    assert await claim_ids(store) == []
    clock.advance(0.1)
    assert await claim_ids(store) == [first]
    assert second not in await claim_ids(store)


async def test_a_429_naming_another_key_delays_the_refused_task_itself(store, clock: FakeClock) -> None:
    """The provider named another key's bucket (say the whole account's, under another id): that
    bucket pauses, and the task it refused waits the Retry-After by itself, as nothing of its own
    holds it back (it was claimed again at once)."""
    await store.set_rate_limits(Q, [RateLimit(dimension="account", count=10, per_s=1.0)])
    first = await enqueue(store, {"account": "x"})
    other = await enqueue(store, {"account": "other"})
    task = (await store.claim(Q, node_id="n"))[0]
    assert task.id == first
    back = await store.report_rate_limited(task, 1.5, dimension="account", key="other")
    assert back.run_at == pytest.approx(back.updated_at + 1.5)
    clock.advance(0.5)  # x's bucket has a token again (one per 0.1 s)
    assert await claim_ids(store) == []  # neither: "other" is paused, the refused task waits
    clock.advance(1.0)
    assert await claim_ids(store) == [first, other]


async def test_buckets_are_per_queue_and_a_429_pauses_only_the_reporting_queues(store, clock: FakeClock) -> None:
    """Two queues limiting one account each give it the full limit, and a 429 reported by a task of one
    pauses that queue's bucket only (the README's advice: send one account's messages from one queue)."""
    one_a_second = [RateLimit(dimension="account", count=1, per_s=1.0)]
    await store.set_rate_limits(Q, one_a_second)
    await store.set_rate_limits("other", one_a_second)
    mine = [await enqueue(store, {"account": "x"}) for _ in range(2)]
    theirs = [(await store.enqueue("other", n, limit_keys={"account": "x"})).task.id for n in range(2)]

    async def claim_other() -> list[int]:
        return [t.id for t in await store.claim("other", node_id="n", limit=10)]

    task = (await store.claim(Q, node_id="n"))[0]
    assert task.id == mine[0]
    assert await claim_other() == theirs[:1]  # account x's second claim in the same instant
    await store.report_rate_limited(task, 5.0)
    clock.advance(1.0)
    assert await claim_other() == theirs[1:]  # the other queue's bucket is not paused
    assert await claim_ids(store) == []
    clock.advance(4.1)
    assert await claim_ids(store) == [mine[0]]


async def test_rate_limited_task_without_buckets_is_delayed(store, clock: FakeClock) -> None:
    first = await enqueue(store, {})
    task = (await store.claim(Q, node_id="n"))[0]
    back = await store.report_rate_limited(task, 2.0)
    assert back.attempts == 0
    assert back.run_at == pytest.approx(back.updated_at + 2.0)
    clock.advance(1.9)
    assert await claim_ids(store) == []
    clock.advance(0.1)
    assert await claim_ids(store) == [first]


async def test_report_rate_limited_refuses_bad_input_and_lost_leases(store, clock: FakeClock) -> None:
    await store.set_rate_limits(Q, [RateLimit(dimension="chat", count=100, per_s=1.0)])
    await enqueue(store, chat("a"))
    task = (await store.claim(Q, node_id="n", lease_s=1.0))[0]
    for bad in (math.nan, -1.0, math.inf, 10**400):
        with pytest.raises(InvalidArgumentError, match="retry_after_s"):
            await store.report_rate_limited(task, bad)
    with pytest.raises(InvalidArgumentError):
        await store.report_rate_limited(task, 1.0, key="a")
    assert (await store.get(task.id)).status is TaskStatus.RUNNING  # nothing written
    clock.advance(0.5)
    assert await claim_ids(store) == []
    clock.advance(1.0)
    with pytest.raises(LeaseLostError):
        await store.report_rate_limited(task, 1.0)


async def test_claimable_partitions_skip_throttled_work(store, clock: FakeClock) -> None:
    await store.set_rate_limits(Q, [RateLimit(dimension="chat", count=1, per_s=1.0)])
    await enqueue(store, chat("a"), partition_key="a")
    await enqueue(store, chat("a"), partition_key="a")
    assert len(await store.claimable_partitions(Q)) == 1
    await claim_ids(store)
    assert await store.claimable_partitions(Q) == set()
    clock.advance(1.0)
    assert len(await store.claimable_partitions(Q)) == 1


async def test_removed_limits_free_the_tasks(store) -> None:
    await store.set_rate_limits(Q, [RateLimit(dimension="chat", count=1, per_s=60.0)])
    ids = [await enqueue(store, chat("a")) for _ in range(3)]
    assert await claim_ids(store) == ids[:1]
    await store.set_rate_limits(Q, [])
    assert await claim_ids(store) == ids[1:]


# --- held buckets: what the dashboard and status show -------------------------------


async def test_held_buckets_list_throttled_keys_with_their_wait(store, clock: FakeClock) -> None:
    await store.set_rate_limits(
        Q,
        [
            RateLimit(dimension="chat", count=1, per_s=2.0, burst=2),
            RateLimit(dimension="account", count=1, per_s=10.0),
        ],
    )
    await store.set_rate_limits("other", [RateLimit(dimension="chat", count=1, per_s=4.0)])
    assert await store.held_buckets() == []
    for _ in range(3):
        await enqueue(store, chat("hot"))
    await enqueue(store, chat("cool"))  # one of its two tokens taken: not held
    await enqueue(store, {"account": "acme"})
    await store.enqueue("other", limit_keys=chat("x"))
    assert len(await claim_ids(store)) == 4  # hot twice (its burst), cool once, acme once
    assert len(await store.claim("other", node_id="n", limit=10)) == 1
    clock.advance(0.5)
    held = await store.held_buckets()
    assert [(b.queue, b.dimension, b.key) for b in held] == [
        (Q, "account", "acme"),
        ("other", "chat", "x"),
        (Q, "chat", "hot"),
    ]  # longest wait first
    assert [b.wait_s for b in held] == pytest.approx([9.5, 3.5, 1.5])
    of_queue = await store.held_buckets(Q)
    assert [b.key for b in of_queue] == ["acme", "hot"]
    assert [b.wait_s for b in of_queue] == pytest.approx([9.5, 1.5])
    assert [b.key for b in await store.held_buckets(Q, limit=1)] == ["acme"]
    assert held[0].to_dict() == {"queue": Q, "dimension": "account", "key": "acme", "wait_s": pytest.approx(9.5)}
    clock.advance(1.5)  # hot has a token again
    assert [b.key for b in await store.held_buckets(Q)] == ["acme"]
    await store.set_rate_limits(Q, [RateLimit(dimension="chat", count=1, per_s=2.0)])  # burst 1; account undeclared
    (hot,) = await store.held_buckets(Q)  # no tolerance now: TAT (4 s after the takes) - now
    assert (hot.key, hot.wait_s) == ("hot", pytest.approx(2.0))
    clock.advance(10.0)
    assert await store.held_buckets() == []


async def test_held_buckets_show_a_providers_pause(store, clock: FakeClock) -> None:
    await store.set_rate_limits(Q, [RateLimit(dimension="chat", count=10, per_s=1.0, burst=10)])
    await enqueue(store, chat("a"))
    (task,) = await store.claim(Q, node_id="n", limit=1)
    assert await store.held_buckets(Q) == []  # nine tokens left
    await store.report_rate_limited(task, 30.0)
    (held,) = await store.held_buckets(Q)
    assert (held.dimension, held.key) == ("chat", "a")
    assert held.wait_s == pytest.approx(30.0)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"queue": ""}, InvalidArgumentError),
        ({"queue": 5}, InvalidTypeError),
        ({"limit": 0}, InvalidArgumentError),
        ({"limit": 1001}, InvalidArgumentError),
        ({"limit": 1.5}, InvalidTypeError),
        ({"limit": True}, InvalidTypeError),
    ],
)
async def test_held_buckets_refuse_bad_arguments(store, kwargs: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        await store.held_buckets(**kwargs)


# --- limits changed under a running process -----------------------------------------


@SHARED
async def test_a_store_warns_once_when_another_declares_new_limits_under_it(
    make_store, backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Two stores on one database, as two processes: what one declares, the other's claims enforce and say so."""
    mine, other = await make_store(), await make_store()
    await mine.set_rate_limits(Q, [RateLimit(dimension="chat", count=2, per_s=1.0)])
    for i in range(50):
        await enqueue(mine, chat(f"c{i}"))
    caplog.set_level(logging.WARNING, logger="asynccoord.backends.limitwatch")

    def changes() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith(CHANGED)]

    async def claimed_until(count: int) -> None:
        async def seen() -> bool:
            await claim_ids(mine, n=1)
            return len(changes()) >= count

        # PostgreSQL reads a queue's limits at most once a second (LIMITED_CACHE_S); SQLite at each claim.
        await wait_until(seen, 10.0, f"{count} warning(s) of {CHANGED}")

    await claim_ids(mine, n=1)
    await mine.set_rate_limits(Q, [RateLimit(dimension="chat", count=3, per_s=1.0)])  # its own: no warning
    await claim_ids(mine, n=1)
    assert changes() == []

    await other.set_rate_limits(Q, [RateLimit(dimension="chat", count=50, per_s=1.0, burst=5)])
    await claimed_until(1)
    [warning] = [r for r in caplog.records if r.getMessage().startswith(CHANGED)]
    assert warning.levelno == logging.WARNING
    assert warning.getMessage().startswith(
        f"{CHANGED} queue='{Q}' enforced=[chat=3/1s,burst=1] now=[chat=50/1s,burst=5]: another process declared"
    )
    for _ in range(3):
        await claim_ids(mine, n=1)
    assert len(changes()) == 1  # once per change, not once per claim

    await other.set_rate_limits(Q, [])  # removed: the claims enforce none now
    await claimed_until(2)
    assert changes()[1].startswith(f"{CHANGED} queue='{Q}' enforced=[chat=50/1s,burst=5] now=[none]:")
    await other.set_rate_limits(Q, [RateLimit(dimension="chat", count=1, per_s=1.0)])  # and declared again
    await claimed_until(3)
    assert changes()[2].startswith(f"{CHANGED} queue='{Q}' enforced=[none] now=[chat=1/1s,burst=1]:")
    assert len(changes()) == 3


async def test_a_key_of_an_undeclared_dimension_is_enqueued_and_limits_once_declared(
    store, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A producer started before the limits are declared (or after another process replaced
    them) goes on enqueueing: the key limits nothing until its dimension is declared, and the
    dimension is logged once per process and queue."""
    caplog.set_level(logging.WARNING, logger="asynccoord.contract.ratelimits")
    queue = f"undeclared-{random.getrandbits(32)}"  # once per process: a queue of this test's own
    await store.set_rate_limits(queue, [RateLimit(dimension="chat", count=1, per_s=10.0)])
    for n in range(4):  # four chats, one group
        await store.enqueue(queue, None, limit_keys={"chat": f"c{n}", "group": "g"})
    warned = [r.getMessage() for r in caplog.records if "undeclared_dimension" in r.getMessage()]
    assert warned == [
        f"asynccoord.rate_limits.undeclared_dimension queue={queue!r} dimensions=[group] declared=[chat]: "
        "keys of these dimensions limit nothing until set_rate_limits() declares them"
    ]
    assert len(await store.claim(queue, node_id="n", limit=10)) == 4  # the group limits nothing yet
    await store.set_rate_limits(
        queue, [RateLimit(dimension="chat", count=1, per_s=10.0), RateLimit(dimension="group", count=1, per_s=10.0)]
    )
    for n in range(4, 8):  # four more chats, each with a token, in the same group
        await store.enqueue(queue, None, limit_keys={"chat": f"c{n}", "group": "g"})
    assert len(await store.claim(queue, node_id="n", limit=10)) == 1  # the group's one token now


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: RateLimited(10**400),
            "retry_after_s must be a finite number of seconds in 0..3.1536e+07, got <int of 1329 bits>",
        ),
        (
            lambda: RateLimit(dimension="chat", count=1, per_s=10**400),
            "per_s must be a finite number of seconds > 0 and <= 3.1536e+07, got <int of 1329 bits>",
        ),
    ],
)
def test_an_int_beyond_the_float_range_is_named_in_the_error(call: Callable[[], object], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=f"^{re.escape(message)}$"):
        call()


def test_a_retry_after_of_minus_zero_reads_as_zero() -> None:
    limited = RateLimited(-0.0)
    assert math.copysign(1.0, limited.retry_after_s) == 1.0
    assert str(limited) == "rate limited: retry after 0 s"
