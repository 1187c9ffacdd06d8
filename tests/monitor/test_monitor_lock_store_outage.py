"""``lock_store_unreachable``: a monitor whose process's lock store (a real Redis) stops answering says so.

Each test runs a redis-server of its own, and stops (SIGKILL) or pauses (SIGSTOP) it while a
task takes and gives back a lock in a loop, as a node's turns do; the monitor's own store
(memory) answers all along.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redisserver import OwnRedis, running_redis
from services import need_redis_py

from asynccoord import Alert, AlertScope, AlertState, MemoryStore, Monitor, StoreError
from asynccoord.cli.status import status_report

OUTAGE_S = 1.5

pytestmark = pytest.mark.multiprocess


@pytest.fixture
def server(tmp_path: Path) -> Iterator[OwnRedis]:
    need_redis_py()
    yield from running_redis(tmp_path)


async def take_locks(locks: Any, stop: asyncio.Event, name: str = "account:1") -> None:
    """Take and give back a lock every 50 ms until ``stop``, as a node's turns do; failures are let go."""
    while not stop.is_set():
        with contextlib.suppress(StoreError):
            lease = await locks.try_acquire_lock(name, ttl_s=5.0, holder="node-a")
            await locks.release_lock(lease)
        await asyncio.sleep(0.05)


async def wait_until(predicate: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def stored_alerts(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(a["rule"], a["scope"], a["scope_key"]) for a in report["alerts"]]


async def test_a_lock_store_down_for_store_outage_s_raises_lock_store_unreachable_once(server: OwnRedis) -> None:
    """Redis killed for longer than ``store_outage_s``: one firing notice, stored (``status`` lists it), then
    one resolved notice once Redis is back, though nothing calls the lock store any more by then. With the
    default rules the monitor judges the cluster's (it leads): the notice is the cluster's, the process's own
    is stored muted.

    A first outage shorter than ``store_outage_s`` raises nothing.
    """
    from asynccoord.backends.redis import RedisLockStore

    received: list[tuple[float, Alert]] = []
    stop = asyncio.Event()
    async with MemoryStore() as store, RedisLockStore(server.url, prefix="h_redis:", reconnect_timeout_s=0.5) as locks:
        monitor = Monitor(
            store,
            lock_store=locks,
            process_id="proc-l",
            flush_interval_s=0.05,
            evaluate_interval_s=0.05,
            store_outage_s=OUTAGE_S,
        )
        monitor.subscribe(lambda alert: received.append((time.monotonic(), alert)))
        async with monitor:
            node = asyncio.create_task(take_locks(locks, stop))
            await asyncio.sleep(0.3)
            server.stop()  # a blip, shorter than store_outage_s
            await asyncio.sleep(OUTAGE_S / 3)
            server.start()
            await asyncio.sleep(OUTAGE_S + 0.5)
            assert received == []
            assert locks.reach.answered_at is not None
            assert locks.reach.failures == 0

            server.stop()
            down_at = time.monotonic()
            await wait_until(lambda: len(received) == 1)
            fired_mono, fired = received[0]
            (active,) = monitor.active_alerts()
            assert active == fired
            (muted,) = monitor.muted_alerts()
            assert (muted.scope, muted.scope_key, muted.inhibited_by) == (
                AlertScope.PROCESS,
                "proc-l",
                "lock_store_unreachable",
            )
            await asyncio.sleep(0.2)  # a flush or more
            during = await status_report(store)
            stop.set()
            await node  # from here on only the monitor's probe calls Redis
            server.start()
            up_at = time.monotonic()
            await wait_until(lambda: len(received) == 2)
            assert monitor.active_alerts() == []
            await asyncio.sleep(0.2)
            after = await status_report(store)
            stats = monitor.statistics()
    assert (fired.rule, fired.event, fired.state, fired.scope, fired.scope_key) == (
        "lock_store_unreachable",
        "lock_store_unreachable",
        AlertState.FIRING,
        AlertScope.CLUSTER,
        "",
    )
    assert OUTAGE_S - 0.2 <= fired_mono - down_at <= OUTAGE_S + 2.0, fired_mono - down_at
    assert (fired.value, fired.count) == (1.0, 1)  # one process cut off
    assert fired.threshold == OUTAGE_S
    assert fired.inhibited_by is None
    assert sorted(stored_alerts(during)) == [
        ("lock_store_unreachable", "cluster", ""),
        ("lock_store_unreachable", "process", "proc-l"),
    ]
    resolved_mono, resolved = received[1]
    assert resolved.state is AlertState.RESOLVED
    assert resolved.fired_at == fired.fired_at
    assert resolved_mono >= up_at
    assert stored_alerts(after) == []
    assert (stats.alerts_fired, stats.alerts_resolved) == (1, 1)
    assert during["events"]["totals"].get("store_retries", 0) > 0  # the lock store's retries count too


async def test_a_lock_store_that_hangs_raises_lock_store_unreachable_while_the_call_waits(server: OwnRedis) -> None:
    """Redis paused (SIGSTOP): the calls wait, none fails; the notice fires ``store_outage_s`` after the
    oldest began, and resolves once Redis answers them (SIGCONT)."""
    from asynccoord.backends.redis import RedisLockStore

    received: list[tuple[float, Alert]] = []
    stop = asyncio.Event()
    async with MemoryStore() as store, RedisLockStore(server.url, prefix="h_redis:") as locks:
        monitor = Monitor(
            store,
            lock_store=locks,
            process_id="proc-h",
            rules=(),  # no cluster rules, so no leader: the process publishes its own notice
            flush_interval_s=0.05,
            evaluate_interval_s=0.05,
            store_outage_s=OUTAGE_S,
        )
        monitor.subscribe(lambda alert: received.append((time.monotonic(), alert)))
        async with monitor:
            node = asyncio.create_task(take_locks(locks, stop))
            await asyncio.sleep(0.3)
            server.pause()
            paused_at = time.monotonic()
            try:
                await wait_until(lambda: len(received) == 1)
                assert locks.reach.waiting >= 1
                assert locks.reach.failures == 0
            finally:
                server.resume()
            resumed_at = time.monotonic()
            await wait_until(lambda: len(received) == 2)
            stop.set()
            await node
    (fired_mono, fired), (resolved_mono, resolved) = received
    assert (fired.rule, fired.state, fired.scope_key, fired.count) == (
        "lock_store_unreachable",
        AlertState.FIRING,
        "proc-h",
        1,
    )
    assert OUTAGE_S - 0.2 <= fired_mono - paused_at <= OUTAGE_S + 2.0, fired_mono - paused_at
    assert (resolved.rule, resolved.state) == ("lock_store_unreachable", AlertState.RESOLVED)
    assert resolved_mono >= resumed_at


_SPIN = "local t = tonumber(redis.call('TIME')[1]) while tonumber(redis.call('TIME')[1]) < t + ARGV[1] do end return 1"


async def test_a_lock_store_busy_with_a_long_script_is_unreachable_until_the_script_ends(server: OwnRedis) -> None:
    """Another client's script runs past ``busy-reply-threshold``: Redis answers every command with
    ``BUSY`` and runs none. That is no answer: the calls are retried (one made meanwhile returns once
    the script is over), the notice fires ``store_outage_s`` in, and resolves only after the script."""
    import redis.asyncio as aioredis

    from asynccoord.backends.redis import RedisLockStore

    received: list[tuple[float, Alert]] = []
    stop = asyncio.Event()
    other = aioredis.Redis.from_url(server.url)
    await other.config_set("busy-reply-threshold", 100)  # ms: BUSY replies from 0.1 s into the script
    try:
        async with MemoryStore() as store, RedisLockStore(server.url, prefix="h_redis:") as locks:
            monitor = Monitor(
                store,
                lock_store=locks,
                process_id="proc-b",
                rules=(),  # no cluster rules, so no leader: the process publishes its own notice
                flush_interval_s=0.05,
                evaluate_interval_s=0.05,
                store_outage_s=OUTAGE_S,
            )
            monitor.subscribe(lambda alert: received.append((time.monotonic(), alert)))
            async with monitor:
                node = asyncio.create_task(take_locks(locks, stop))
                await asyncio.sleep(0.3)
                script = asyncio.create_task(other.eval(_SPIN, 0, 4))  # type: ignore[arg-type]
                await asyncio.sleep(0.5)  # BUSY replies by now
                call = asyncio.create_task(locks.now())
                await script
                over_at = time.monotonic()
                assert isinstance(await call, float)  # retried, not failed
                await wait_until(lambda: len(received) == 2)
                stop.set()
                await node
    finally:
        await other.aclose()
    (_, fired), (resolved_mono, resolved) = received
    assert (fired.rule, fired.state, fired.scope_key) == ("lock_store_unreachable", AlertState.FIRING, "proc-b")
    assert (resolved.rule, resolved.state) == ("lock_store_unreachable", AlertState.RESOLVED)
    assert resolved_mono >= over_at - 0.1


async def test_a_healthy_idle_lock_store_gets_no_call_from_the_watch(server: OwnRedis) -> None:
    """Nothing calls the lock store: the monitor watching it sends it no command either."""
    import redis.asyncio as aioredis

    from asynccoord.backends.redis import RedisLockStore

    client = aioredis.Redis.from_url(server.url)
    try:
        async with (
            MemoryStore() as store,
            RedisLockStore(server.url, prefix="h_redis:") as locks,
            Monitor(store, lock_store=locks, flush_interval_s=0.05, store_outage_s=0.2),
        ):
            before = (await client.info("stats"))["total_commands_processed"]
            await asyncio.sleep(1.0)
            after = (await client.info("stats"))["total_commands_processed"]
    finally:
        await client.aclose()
    assert after - before == 1  # the first INFO itself


async def test_a_watch_stopped_while_a_look_waits_its_turns_publishes_nothing() -> None:
    """A look that finds the store down waits a few loop turns before it decides; a monitor
    closing meanwhile stops the watch, and no firing notice may come out of the closed watch."""
    from asynccoord.monitor.lockoutage import LockStoreWatch
    from asynccoord.reach import Reach

    reach = Reach()
    notices: list[Alert] = []
    watch = LockStoreWatch("p1", reach, 0.05, interval_s=60.0, now_s=time.time, on_notice=notices.append, probe=None)
    watch.start()
    reach.failed(ConnectionError("refused"))
    await asyncio.sleep(0.1)  # failing for longer than outage_s
    loop = asyncio.get_running_loop()
    watch._tick(loop.time())  # the look: down, so it queues its confirming turns
    await watch.stop()
    for _ in range(50):
        await asyncio.sleep(0)
    assert notices == []
    assert watch.firing is None
    watch.start()  # started again (as if the store had just answered), an outage is judged and published once
    reach.failed(ConnectionError("refused"))
    await asyncio.sleep(0.1)
    watch._tick(loop.time())
    for _ in range(50):
        await asyncio.sleep(0)
    assert [(n.rule, n.state) for n in notices] == [("lock_store_unreachable", AlertState.FIRING)]
    await watch.stop()


async def test_one_lock_store_outage_of_three_processes_makes_one_notice(server: OwnRedis, tmp_path: Path) -> None:
    """Three processes' monitors on one SQLite file, each with its own client of one Redis: Redis down
    is one incident, so one firing and one resolved notice in the whole cluster (the leader's), whose
    value counts the processes cut off; each process's own notice is stored muted (``status`` lists all)."""
    from asynccoord import SQLiteStore
    from asynccoord.backends.redis import RedisLockStore

    received: list[tuple[str, Alert]] = []
    stop = asyncio.Event()
    async with contextlib.AsyncExitStack() as stack:
        monitors = []
        nodes = []
        for n in range(3):
            store = await stack.enter_async_context(SQLiteStore(tmp_path / "q.db"))
            locks = await stack.enter_async_context(
                RedisLockStore(server.url, prefix="h_redis:", reconnect_timeout_s=0.5)
            )
            monitor = Monitor(
                store,
                lock_store=locks,
                process_id=f"proc-{n}",
                flush_interval_s=0.05,
                evaluate_interval_s=0.05,
                store_outage_s=OUTAGE_S,
            )
            monitor.subscribe(lambda alert, n=n: received.append((f"proc-{n}", alert)))
            await stack.enter_async_context(monitor)
            monitors.append(monitor)
            nodes.append(asyncio.create_task(take_locks(locks, stop, f"account:{n}")))
        await asyncio.sleep(0.5)
        assert sum(m.statistics().leader for m in monitors) == 1
        server.stop()
        await wait_until(lambda: len(received) == 1)
        await wait_until(lambda: all(m.muted_alerts() for m in monitors))
        await asyncio.sleep(0.5)  # a late process's notice would raise no second one
        during = await status_report(monitors[0].store)
        firing = list(received)
        stop.set()
        await asyncio.gather(*nodes)
        server.start()
        await wait_until(lambda: len(received) == 2)
        await wait_until(lambda: not any(m.muted_alerts() for m in monitors))
        await asyncio.sleep(0.3)
        after = await status_report(monitors[0].store)
    ((leader, fired),) = firing
    assert (fired.rule, fired.scope, fired.scope_key, fired.state) == (
        "lock_store_unreachable",
        AlertScope.CLUSTER,
        "",
        AlertState.FIRING,
    )
    assert fired.value >= 1.0  # the processes cut off when the leader first saw one
    (who, resolved) = received[1]
    assert who == leader
    assert (resolved.scope, resolved.state, resolved.fired_at) == (
        AlertScope.CLUSTER,
        AlertState.RESOLVED,
        fired.fired_at,
    )
    assert sorted(stored_alerts(during)) == [
        ("lock_store_unreachable", "cluster", ""),
        ("lock_store_unreachable", "process", "proc-0"),
        ("lock_store_unreachable", "process", "proc-1"),
        ("lock_store_unreachable", "process", "proc-2"),
    ]
    assert next(a for a in during["alerts"] if a["scope"] == "cluster")["value"] == 3.0  # all three, once flushed
    assert all(a["muted"] for a in during["alerts"] if a["scope"] == "process")
    assert stored_alerts(after) == []
