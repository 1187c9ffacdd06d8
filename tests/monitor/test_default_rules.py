"""The default ``membership_churn`` rule: quiet through a rolling restart, firing on a process that flaps.

Real runtimes join and leave one store; the membership counts the changes as it does in
production, and a monitor with :data:`~asynccoord.monitor.rules.DEFAULT_RULES` judges them.
"""

from __future__ import annotations

import asyncio

import pytest

from asynccoord import MemoryStore, Monitor, NodeConfig, Runtime, Task
from asynccoord import events as ev
from asynccoord.monitor.rules import DEFAULT_RULES

(CHURN,) = [rule for rule in DEFAULT_RULES if rule.name == "membership_churn"]


async def noop(task: Task) -> None:
    return None


def process(store: MemoryStore) -> Runtime:
    """A process's runtime of 2 nodes (a new instance id each time, as a restarted process has)."""
    return Runtime(store, send=noop, nodes=2, config=NodeConfig(queue="outbox"), heartbeat_ttl_s=0.6)


async def restarts(
    store: MemoryStore, processes: int, restarts: int, pause_s: float, *, flapping: int = 0
) -> tuple[int, list[str]]:
    """Start ``processes`` runtimes, restart them one at a time ``restarts`` times (only the first
    ``flapping`` of them if given); the membership changes counted and the alerts the default
    rules then raise, judged before the runtimes stop (their leaving is more changes)."""
    live = [process(store) for _ in range(processes)]
    for runtime in live:
        await runtime.start()
    await asyncio.sleep(1.0)  # every node in every view
    before = store.events.get(ev.MEMBERSHIP_CHANGE)
    for n in range(restarts):
        k = n % (flapping or processes)
        await live[k].shutdown()
        await asyncio.sleep(pause_s)  # down a moment, as a restarted process is
        live[k] = process(store)
        await live[k].start()
        await asyncio.sleep(pause_s)
    await asyncio.sleep(1.0)  # the last join seen
    changes = store.events.get(ev.MEMBERSHIP_CHANGE) - before
    alerts = await churn_alerts(store)
    for runtime in live:
        await runtime.shutdown()
    assert store.events.get(ev.NODE_LOST) == 0  # clean shutdowns only
    return changes, alerts


async def churn_alerts(store: MemoryStore) -> list[str]:
    async with Monitor(store, background=False, process_id="watcher") as monitor:
        assert monitor.rules == DEFAULT_RULES
        await monitor.flush()
        return [alert.rule for alert in await monitor.evaluate() if alert.firing]


@pytest.mark.slow
async def test_a_rolling_restart_of_twelve_processes_raises_no_churn_alert() -> None:
    async with MemoryStore() as store:
        changes, alerts = await restarts(store, processes=12, restarts=12, pause_s=0.3)
        assert 10 < changes <= CHURN.threshold  # a leave and a join each, or one change: above 10 (the old threshold)
        assert alerts == []


@pytest.mark.slow
async def test_a_process_restarting_again_and_again_raises_the_churn_alert() -> None:
    async with MemoryStore() as store:
        changes, alerts = await restarts(store, processes=3, restarts=25, pause_s=0.3, flapping=1)
        assert changes > CHURN.threshold
        assert alerts == ["membership_churn"]
