"""The default ``membership_churn`` rule: quiet through rolling restarts of any size, firing on a process that flaps.

Real runtimes join and leave one store; the membership counts the changes and the flaps as it
does in production, and a monitor with :data:`~asynccoord.monitor.rules.DEFAULT_RULES` judges them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from asynccoord import MemoryStore, Monitor, NodeConfig, Runtime, StoreConfig, Task
from asynccoord import events as ev
from asynccoord.membership import FLAP_TTLS
from asynccoord.monitor.rules import DEFAULT_RULES

(CHURN,) = [rule for rule in DEFAULT_RULES if rule.name == "membership_churn"]

TTL_S = 1.0
"""The nodes' heartbeat TTL: every runtime shares this test's event loop, so a shorter one lets
nodes expire under load (``node_lost``) when the loop falls behind."""
FLAP_S = FLAP_TTLS * TTL_S
"""A life shorter than this is a flap (6 s at this heartbeat TTL)."""


async def noop(task: Task) -> None:
    return None


def process(store: MemoryStore, nodes: int = 1) -> Runtime:
    """A process's runtime (a new instance id each time, as a restarted process has)."""
    return Runtime(store, send=noop, nodes=nodes, config=NodeConfig(queue="outbox"), heartbeat_ttl_s=TTL_S)


def cluster_store() -> MemoryStore:
    return MemoryStore(config=StoreConfig(partitions=64))  # less work per view change in the shared loop


async def restarts(
    store: MemoryStore, processes: int, restarts: int, pause_s: float, *, flapping: int = 0, nodes: int = 1
) -> tuple[int, int, list[str]]:
    """Start ``processes`` runtimes of ``nodes`` nodes, let them run past a flap's length, then restart
    them one at a time ``restarts`` times (only the first ``flapping`` of them if given). Returns the membership
    changes and flaps counted since the first restart, and the alerts the default rules then
    raise, judged before the runtimes stop (their leaving is more changes)."""
    live = [process(store, nodes) for _ in range(processes)]
    started = time.monotonic()
    for runtime in live:
        await runtime.start()
    await asyncio.sleep(max(1.0, FLAP_S + 0.5 - (time.monotonic() - started)))  # a cluster that has been running
    changes_before = store.events.get(ev.MEMBERSHIP_CHANGE)
    assert store.events.get(ev.MEMBERSHIP_FLAP) == 0
    for n in range(restarts):
        k = n % (flapping or processes)
        await live[k].shutdown()
        await asyncio.sleep(pause_s)  # down a moment, as a restarted process is
        live[k] = process(store, nodes)
        await live[k].start()
        await asyncio.sleep(pause_s)
    await asyncio.sleep(1.0)  # the last join seen
    changes = store.events.get(ev.MEMBERSHIP_CHANGE) - changes_before
    flaps = store.events.get(ev.MEMBERSHIP_FLAP)
    alerts = await churn_alerts(store)
    for runtime in live:
        await runtime.shutdown()
    assert store.events.get(ev.NODE_LOST) == 0  # clean shutdowns only
    return changes, flaps, alerts


async def churn_alerts(store: MemoryStore) -> list[str]:
    async with Monitor(store, background=False, process_id="watcher") as monitor:
        assert monitor.rules == DEFAULT_RULES
        await monitor.flush()
        return [alert.rule for alert in await monitor.evaluate() if alert.firing]


@pytest.mark.slow
async def test_a_rolling_restart_of_24_processes_raises_no_churn_alert() -> None:
    async with cluster_store() as store:
        changes, flaps, alerts = await restarts(store, processes=24, restarts=24, pause_s=0.3)
        assert changes >= 24  # every restart was seen (a leave and a join each, or one change) ...
        assert changes > 30  # ... more than the 30 changes the rule once counted
        assert flaps == 0  # each process had run longer than a flap
        assert alerts == []


@pytest.mark.slow
async def test_a_rolling_restart_of_twelve_processes_twice_raises_no_churn_alert() -> None:
    """Each process restarted twice: its middle life lasts one pass over the others (12 restarts,
    about 10 s), longer than a flap."""
    async with cluster_store() as store:
        changes, flaps, alerts = await restarts(store, processes=12, restarts=24, pause_s=0.4)
        assert changes > 30
        assert flaps == 0
        assert alerts == []


@pytest.mark.slow
async def test_a_process_restarting_again_and_again_raises_the_churn_alert() -> None:
    """One process of three (of 2 nodes each: one flap per process life) restarted 8 times: the lives
    it ended after the first were short (7 flaps), the first was long; about 16 changes, fewer than
    the 30 the rule once counted."""
    async with cluster_store() as store:
        changes, flaps, alerts = await restarts(store, processes=3, restarts=8, pause_s=0.3, flapping=1, nodes=2)
        assert changes >= 8
        assert CHURN.threshold < flaps <= 14  # 7 short lives, each counted once (twice when the counter moves)
        assert alerts == ["membership_churn"]


async def test_a_send_let_go_while_it_still_runs_raises_the_abandoned_sends_alert() -> None:
    # A stuck client ignores its cancellation: the node lets it go send_overrun_s after its
    # timeout, and the task is retried while that send may still deliver.
    released = asyncio.Event()

    async def stuck(task: Task) -> None:
        if task.attempts == 1:
            while not released.is_set():
                with contextlib.suppress(asyncio.CancelledError):
                    await released.wait()

    config = NodeConfig(queue="outbox", send_timeout_s=0.1, send_overrun_s=0.1)
    async with (
        cluster_store() as store,
        Runtime(store, send=stuck, nodes=1, config=config, heartbeat_ttl_s=TTL_S) as runtime,
    ):
        await store.enqueue("outbox", {"n": 1})
        deadline = time.monotonic() + 10
        while store.events.get(ev.SEND_ABANDONED) == 0:
            assert time.monotonic() < deadline, runtime.states()
            await asyncio.sleep(0.01)
        async with Monitor(store, background=False, process_id="watcher") as monitor:
            await monitor.flush()
            fired = [alert.rule for alert in await monitor.evaluate() if alert.firing]
        released.set()
    assert fired == ["abandoned_sends"]
