"""Rate limits seen from the pipeline: a provider's 429 honoured, throttled nodes that wait, not spin.

Real stores (memory, an SQLite file and, but for the pace test, PostgreSQL) on the real clock, a real Runtime of nodes.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time

import pytest

from asynccoord import NodeConfig, RateLimit, RateLimited, Runtime, Task, TaskStatus
from asynccoord import events as ev

Q = "outbox"
ALL = pytest.mark.parametrize("backend", ["memory", "sqlite", "postgres"], indirect=True)
# The refill test asserts a pace within 10 ms of the limit per send: on PostgreSQL a send lands
# after its claim by round trips that vary by more under load (tests/multiprocess/test_ratelimits_multiprocess.py
# checks PostgreSQL's pace over many sends instead).
EMBEDDED = pytest.mark.parametrize("backend", ["memory", "sqlite"], indirect=True)


async def drained(store, n: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stats = await store.stats(Q)
        if stats.counts[TaskStatus.DONE] + stats.counts[TaskStatus.DEAD] >= n:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"not drained: {await store.stats(Q)}")


@ALL
async def test_a_429_pauses_the_key_without_using_an_attempt(make_store) -> None:
    store = await make_store(clock=None)
    await store.set_rate_limits(Q, [RateLimit(dimension="chat", count=100, per_s=1.0, burst=100)])
    for i in range(3):
        await store.enqueue(Q, {"chat": "a", "n": i}, partition_key="a", limit_keys={"chat": "a"}, max_attempts=1)
    await store.enqueue(Q, {"chat": "b", "n": 0}, partition_key="b", limit_keys={"chat": "b"}, max_attempts=1)
    sends: list[tuple[float, str, int]] = []
    refused = False

    async def send(task: Task) -> None:
        nonlocal refused
        sends.append((time.monotonic(), task.payload["chat"], task.payload["n"]))
        if task.payload == {"chat": "a", "n": 0} and not refused:
            refused = True
            raise RateLimited(0.5, dimension="chat")

    config = NodeConfig(queue=Q, ordered=True, idle_max_s=0.2)
    async with Runtime(store, send=send, nodes=2, config=config, shutdown_timeout_s=1.0):
        await drained(store, 4)
    a = [(at, n) for at, c, n in sends if c == "a"]
    assert [n for _, n in a] == [0, 0, 1, 2]  # the refused message again first: its place kept
    assert a[1][0] - a[0][0] >= 0.45  # nobody sent to chat a during the pause
    b = [at for at, c, _ in sends if c == "b"]
    assert b[0] - a[0][0] < 0.45  # chat b was not held back
    for task_id in range(1, 5):
        done = await store.get(task_id)
        assert done.status is TaskStatus.DONE, done  # max_attempts=1: the 429 used no attempt
    assert store.events.get(ev.PROVIDER_RATE_LIMITED) == 1


@EMBEDDED
@pytest.mark.exclusive  # its sends' spacing is judged within 10 ms of the limit's 250 ms
async def test_a_throttled_node_waits_for_the_refill(make_store) -> None:
    store = await make_store(clock=None)
    await store.set_rate_limits(Q, [RateLimit(dimension="chat", count=4, per_s=1.0)])
    n = 8
    for i in range(n):
        await store.enqueue(Q, i, partition_key="a", limit_keys={"chat": "a"})
    sends: list[float] = []
    claims = 0
    claim = store.claim

    async def counting_claim(*args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal claims
        claims += 1
        return await claim(*args, **kwargs)

    store.claim = counting_claim

    async def send(task: Task) -> None:
        sends.append(time.monotonic())

    config = NodeConfig(queue=Q, ordered=True, idle_min_s=0.01, idle_max_s=2.0)
    async with Runtime(store, send=send, nodes=1, config=config, shutdown_timeout_s=1.0):
        await drained(store, n)
    gaps = [b - a for a, b in itertools.pairwise(sends)]
    assert min(gaps) >= 0.24  # never faster than 4/s
    span = sends[-1] - sends[0]
    assert span <= (n - 1) * 0.25 / 0.9  # at least 90 % of the allowed rate: woken at each refill
    assert claims <= 3 * n  # about one claim per refill, not a spin


@ALL
async def test_reported_429s_reach_the_monitor_and_prometheus(make_store) -> None:
    from asynccoord import Monitor
    from asynccoord.monitor.metrics import render_prometheus

    store = await make_store(clock=None)
    await store.set_rate_limits(Q, [RateLimit(dimension="chat", count=10, per_s=1.0)])
    await store.enqueue(Q, 1, limit_keys={"chat": "a"})
    task = (await store.claim(Q, node_id="n"))[0]
    await store.report_rate_limited(task, 0.1)
    text = render_prometheus(store).decode()
    assert 'asynccoord_events_total{event="provider_rate_limited"} 1.0' in text
    monitor = Monitor(store, background=False, process_id="p")  # the default rules
    await monitor.flush(force=True)
    alerts = await monitor.evaluate()
    assert [a.rule for a in alerts if a.rule == "provider_rate_limited"] == ["provider_rate_limited"]


@ALL
async def test_a_429_without_a_wait_does_not_hammer_the_provider(make_store) -> None:
    """A 429 uses no attempt, so ``Retry-After: 0`` would otherwise mean a send loop for ever:
    each pause lasts at least MIN_RATE_LIMIT_PAUSE_S."""
    from asynccoord.node.settle import MIN_RATE_LIMIT_PAUSE_S

    store = await make_store(clock=None)
    await store.enqueue(Q, {"chat": "a"}, partition_key="a", max_attempts=3)
    calls: list[float] = []

    async def send(task: Task) -> None:
        calls.append(time.monotonic())
        raise RateLimited(0)

    config = NodeConfig(queue=Q, idle_max_s=0.05)
    async with Runtime(store, send=send, nodes=2, config=config, shutdown_timeout_s=1.0):
        await asyncio.sleep(2.0)
    assert 2 <= len(calls) <= 2.0 / MIN_RATE_LIMIT_PAUSE_S + 1, len(calls)
    assert min(b - a for a, b in itertools.pairwise(calls)) >= MIN_RATE_LIMIT_PAUSE_S - 0.05
    task = await store.get(1)
    assert task.attempts <= 1  # still no attempt used
    assert task.status is not TaskStatus.DEAD


def _provider_refusals(times: list[float], limit: RateLimit) -> int:
    """Sends a provider would refuse: a GCRA on send times with one emission interval of slack
    (the demo gateway's rule, asynccoord/demo/gateway.py provider_bucket)."""
    from asynccoord.contract.ratelimits import conforms, take

    bucket = RateLimit(dimension=limit.dimension, count=limit.count, per_s=limit.per_s, burst=limit.burst + 1)
    tat: float | None = None
    refused = 0
    for at in sorted(times):
        if conforms(tat, at, bucket):
            tat = take(tat, at, bucket)
        else:
            refused += 1
    return refused


@EMBEDDED
@pytest.mark.parametrize("paced", [True, False], ids=["paced", "unpaced"])
async def test_sends_that_waited_for_a_lock_leave_at_the_limits_pace(make_store, paced: bool) -> None:
    """Tokens are taken at the claim; the sends wait for the account's lock, held elsewhere for
    0.4 s. Paced (NodeConfig.lock_pace_dimension), the sends keep to the limit when the lock comes
    free; unpaced, the ones that waited go out together (the control: the check can fail)."""
    store = await make_store(clock=None)
    limit = RateLimit(dimension="account", count=50, per_s=1.0, burst=5)  # one every 20 ms
    await store.set_rate_limits(Q, [limit])
    n = 40
    for i in range(n):
        await store.enqueue(Q, i, partition_key=f"c{i}", limit_keys={"account": "a"})
    other = await store.try_acquire_lock("acct:a", ttl_s=30.0, holder="another process")
    sends: list[float] = []

    async def send(task: Task) -> None:
        sends.append(time.monotonic())

    config = NodeConfig(queue=Q, idle_max_s=0.05, lock_pace_dimension="account" if paced else None)
    async with Runtime(store, send=send, nodes=2, config=config, lock_key=lambda t: "acct:a", shutdown_timeout_s=1.0):
        await asyncio.sleep(0.4)  # the claims take tokens meanwhile: 5 at once, then one every 20 ms
        released = time.monotonic()
        assert await store.release_lock(other)
        await drained(store, n)
    assert len(sends) == n
    assert min(sends) >= released
    if paced:
        assert _provider_refusals(sends, limit) == 0
        assert min(sends) - released >= limit.interval_s - 0.002  # a new holder: one interval first
    else:
        assert _provider_refusals(sends, limit) >= 5


@EMBEDDED
async def test_a_limit_slower_than_the_lock_wait_is_not_paced(make_store) -> None:
    """An interval of 3 s against a lock wait of 1 s: the claim's tokens keep the sends within one
    interval already, and a pace of a new lease's full interval would hold the lock past the point."""
    store = await make_store(clock=None)
    await store.set_rate_limits(Q, [RateLimit(dimension="account", count=1, per_s=3.0, burst=3)])
    for i in range(3):
        await store.enqueue(Q, i, partition_key=f"c{i}", limit_keys={"account": "a"})
    sends: list[float] = []

    async def send(task: Task) -> None:
        sends.append(time.monotonic())

    config = NodeConfig(queue=Q, idle_max_s=0.05, lock_wait_s=1.0, lock_pace_dimension="account")
    started = time.monotonic()
    async with Runtime(store, send=send, nodes=2, config=config, lock_key=lambda t: "acct:a", shutdown_timeout_s=1.0):
        await drained(store, 3)
    assert len(sends) == 3
    assert max(sends) - started < 3.0  # the burst went at once: no send waited an interval


@ALL
@pytest.mark.parametrize(
    ("named", "grouped"),
    [(None, False), ("account", False), ("account", True)],
    ids=["no-dimension", "the-locks-dimension", "in-an-exception-group"],
)
async def test_a_429_under_an_account_lock_stops_that_accounts_claimed_sends_until_its_retry_after(
    make_store, named: str | None, grouped: bool
) -> None:
    """Tasks claimed before the 429 and waiting for the account's lock do not reach the provider during the pause."""
    store = await make_store(clock=None)
    await store.set_rate_limits(Q, [RateLimit(dimension="account", count=50, per_s=1.0, burst=20)])
    n = 30
    for i in range(n):
        await store.enqueue(
            Q, {"n": i}, partition_key=f"chat-{i % 10}", limit_keys={"account": "bot-1"}, max_attempts=1
        )
    sends: list[tuple[float, int]] = []
    refused_at: list[float] = []

    async def send(task: Task) -> None:
        if task.payload["n"] == 3 and not refused_at:
            refused_at.append(time.monotonic())
            if grouped:  # as a client built on a task group raises it
                raise ExceptionGroup(
                    "send failed", [RateLimited(1.0, dimension=named), RateLimited(0.5, dimension=named)]
                )
            raise RateLimited(1.0, dimension=named)
        sends.append((time.monotonic(), task.payload["n"]))
        await asyncio.sleep(0.002)

    config = NodeConfig(queue=Q, lock_pace_dimension="account", idle_max_s=0.2)
    runtime = Runtime(store, send=send, nodes=2, config=config, lock_key=lambda t: "account:bot-1")
    async with runtime:
        await drained(store, n)
    [at] = refused_at
    during = [(round(t - at, 3), i) for t, i in sends if at < t < at + 1.0 - 0.02]
    assert during == []  # nothing of the account went out during the Retry-After
    assert sorted(i for _, i in sends) == list(range(n))  # every message once, the refused one included
    assert any(t >= at + 0.98 for t, _ in sends)
    for task_id in range(1, n + 1):
        done = await store.get(task_id)
        assert done.status is TaskStatus.DONE, done  # max_attempts=1: neither the 429 nor a pause used one
    assert store.events.get(ev.PROVIDER_RATE_LIMITED) == 1
    assert store.events.get(ev.SEND_PAUSED) >= 1  # claimed before the pause, handed back unsent


@EMBEDDED
async def test_a_429_naming_another_dimension_does_not_pause_the_account_lock(make_store) -> None:
    store = await make_store(clock=None)
    await store.set_rate_limits(
        Q,
        [
            RateLimit(dimension="account", count=50, per_s=1.0, burst=20),
            RateLimit(dimension="chat", count=50, per_s=1.0, burst=20),
        ],
    )
    n = 12
    for i in range(n):
        keys = {"account": "bot-1", "chat": f"c{i % 4}"}
        await store.enqueue(Q, {"n": i}, partition_key=f"c{i % 4}", limit_keys=keys)
    sends: list[tuple[float, int]] = []
    refused_at: list[float] = []

    async def send(task: Task) -> None:
        if task.payload["n"] == 0 and not refused_at:
            refused_at.append(time.monotonic())
            raise RateLimited(1.0, dimension="chat")  # one chat's limit: the account may go on
        sends.append((time.monotonic(), task.payload["n"]))

    config = NodeConfig(queue=Q, lock_pace_dimension="account", idle_max_s=0.2)
    async with Runtime(store, send=send, nodes=2, config=config, lock_key=lambda t: "account:bot-1"):
        await drained(store, n)
    [at] = refused_at
    assert [i for t, i in sends if at < t < at + 0.9 and i % 4 != 0]  # other chats of the account went on
    assert store.events.get(ev.SEND_PAUSED) == 0


@pytest.mark.parametrize("backend", ["memory"], indirect=True)
async def test_a_misspelt_pace_dimension_is_warned_of_once_and_the_queue_drains(
    make_store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="asynccoord.locks.pacing")
    store = await make_store(clock=None)
    await store.set_rate_limits(Q, [RateLimit(dimension="account", count=1000, per_s=1.0, burst=1000)])
    n = 20
    for i in range(n):
        await store.enqueue(Q, i, partition_key=f"c{i}", limit_keys={"account": "a"})
    sent: list[int] = []

    async def send(task: Task) -> None:
        sent.append(task.payload)

    config = NodeConfig(queue=Q, idle_max_s=0.05, lock_pace_dimension="acount")
    async with Runtime(store, send=send, nodes=2, config=config, lock_key=lambda t: "acct:a", shutdown_timeout_s=1.0):
        await drained(store, n)
    assert sorted(sent) == list(range(n))
    warned = [r for r in caplog.records if "asynccoord.node.lock_pace_unknown_dimension" in r.getMessage()]
    assert len(warned) == 1  # one per runtime, not one per send
    assert warned[0].levelno == logging.WARNING
    assert "queue='outbox' dimension='acount' declared=['account']" in warned[0].getMessage()


@ALL
async def test_a_shutdown_ends_the_lock_pacers_wait_and_sends_nothing_more(make_store) -> None:
    """Tasks whose turn waits for the lock's pace (a send per 30 s, the first after one
    interval) when the shutdown comes go back at once, unsent, their attempts unused: the wait
    held the shutdown until the drain's deadline before."""
    store = await make_store(clock=None)
    await store.set_rate_limits(Q, [RateLimit(dimension="account", count=1, per_s=30.0, burst=10)])
    ids = [(await store.enqueue(Q, i, partition_key=f"c{i}", limit_keys={"account": "a"})).task.id for i in range(6)]
    sends: list[int] = []

    async def send(task: Task) -> None:
        sends.append(task.id)

    config = NodeConfig(queue=Q, idle_max_s=0.05, lock_wait_s=60.0, lock_pace_dimension="account")
    runtime = Runtime(store, send=send, nodes=2, config=config, lock_key=lambda t: "acct:a", shutdown_timeout_s=20.0)
    async with runtime:
        deadline = time.monotonic() + 10.0
        while sum(s.in_flight for s in runtime.states()) < 6:  # all claimed: one paced, the others in line
            assert time.monotonic() < deadline, runtime.states()
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # well inside the pace's 30 s wait
        stopping = time.monotonic()
        await runtime.shutdown()
        assert time.monotonic() - stopping < 10.0  # not the drain's 20 s
    assert sends == []
    counts = (await store.stats(Q)).counts
    assert (counts[TaskStatus.PENDING], counts[TaskStatus.RUNNING]) == (6, 0)
    assert [(await store.get(i)).attempts for i in ids] == [0] * 6


@EMBEDDED
async def test_a_429_reported_after_the_lease_was_lost_counts_a_lost_lease_not_a_stale_commit(
    make_store, clock
) -> None:
    """The lease lapsed during the send (the store's clock moved past it) and another node took
    the task: the 429's hand-back is refused. No message went out, so it is no stale commit;
    another node may have the task, so it is a lost lease."""
    store = await make_store()
    await store.enqueue(Q, {"n": 0}, partition_key="a")
    refused: list[int] = []

    async def send(task: Task) -> None:
        if not refused:
            refused.append(task.id)
            clock.advance(60.0)  # past the lease, renewed only every lease_s / 3 of real time
            (taken,) = await store.claim(Q, node_id="other", limit=1, lease_s=600.0)
            assert taken.id == task.id
            raise RateLimited(1.0)

    config = NodeConfig(queue=Q, ordered=False, idle_max_s=0.05, lease_s=30.0)
    async with Runtime(store, send=send, nodes=1, config=config, shutdown_timeout_s=1.0) as runtime:
        deadline = time.monotonic() + 10.0
        while runtime.states()[0].conflicts == 0:
            assert time.monotonic() < deadline, runtime.states()
            await asyncio.sleep(0.01)
    assert store.events.get(ev.PROVIDER_RATE_LIMITED) == 1
    assert store.events.get(ev.STALE_COMMIT_REJECTED) == 0
    assert store.events.get(ev.LEASE_LOST) == 1
