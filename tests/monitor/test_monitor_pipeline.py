"""Bad alert subscribers never slow the node pipeline (a real Runtime on a real SQLite file)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from asynccoord import Alert, AlertRule, Monitor, NewTask, SQLiteStore, Task
from asynccoord import events as ev
from asynccoord.node import NodeConfig, Runtime

TASKS = 300

# Many rules that fire as soon as work flows, and resolve when it stops: a steady stream of notices.
NOISY_RULES = [
    AlertRule(name=f"noise_{event}_{i}", event=event, threshold=0, window_s=1.0, clear_ratio=0.0)
    for i in range(10)
    for event in (ev.CLAIMS, ev.COMMITS)
]


async def drain(path: Path, *, bad_subscribers: bool) -> tuple[float, dict[str, int]]:
    async def send(task: Task) -> None:
        await asyncio.sleep(0.002)

    stuck_calls = 0

    async def stuck(alert: Alert) -> None:
        nonlocal stuck_calls
        stuck_calls += 1
        await asyncio.Event().wait()  # never returns

    async def raises(alert: Alert) -> None:
        raise RuntimeError("subscriber bug")

    async with SQLiteStore(path) as store:
        await store.enqueue_many(
            [NewTask(queue="outbox", payload={"account": i % 8}, partition_key=f"c{i % 50}") for i in range(TASKS)]
        )
        config = NodeConfig(queue="outbox", idle_max_s=0.05)
        async with Monitor(store, rules=NOISY_RULES, flush_interval_s=0.02, buffer_size=2) as monitor:
            if bad_subscribers:
                monitor.subscribe(stuck, timeout_s=3600.0)
                monitor.subscribe(raises)
                monitor.alerts(buffer=1)  # never read
            started = time.perf_counter()
            async with Runtime(
                store, send=send, nodes=4, config=config, lock_key=lambda t: f"account:{t.payload['account']}"
            ) as runtime:
                drained = await runtime.wait_until_drained(timeout_s=60.0, poll_s=0.02)
            elapsed = time.perf_counter() - started
            assert drained
            stats = monitor.statistics()
        done = (await store.stats("outbox")).counts["done"]
    return elapsed, {
        "done": done,
        "fired": stats.alerts_fired,
        "dropped": stats.alerts_dropped,
        "failures": stats.callback_failures,
        "stuck_calls": stuck_calls,
    }


async def test_stuck_and_failing_subscribers_do_not_slow_the_nodes(tmp_path: Path) -> None:
    baseline_s, baseline = await drain(tmp_path / "baseline.db", bad_subscribers=False)
    bad_s, bad = await drain(tmp_path / "bad.db", bad_subscribers=True)
    assert baseline["done"] == bad["done"] == TASKS
    assert bad["fired"] >= len(NOISY_RULES)  # every rule fired while the nodes ran
    assert bad["stuck_calls"] == 1  # the stuck callback never returned...
    assert bad["dropped"] > 0  # ...so its notices (and the unread stream's) were dropped and counted
    assert bad["failures"] >= 1  # the raising callback failed on the notices it got (buffer 2: the rest dropped)
    # Same work, same machine: a subscriber that blocked publishing would stall the monitor's
    # loop only, and one that blocked the nodes would stall the drain for an hour.
    assert bad_s < 3 * baseline_s + 2.0, f"drain took {bad_s:.2f} s with bad subscribers, {baseline_s:.2f} s without"
