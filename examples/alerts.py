"""Reading alerts: a Monitor with a custom rule, one alert per incident and one resolved notice.

A custom ``AlertRule`` fires when more than 3 stale commits (``stale_commit_rejected``) are
seen within 2 s. The script provokes a burst of them: node-a claims 8 tasks with a 0.2 s
lease and stalls past it, node-b reclaims them, and node-a's late ``complete_many`` is
refused for every task (nothing is written; node-b commits them). The monitor then
delivers one firing alert and, once the window holds no more stale commits, one resolved
notice, to both an ``async for alert in monitor.alerts()`` reader and a subscribed callback.

Exits 0 only if each reader got exactly [firing, resolved]. Run:  python examples/alerts.py
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile

from asynccoord import Alert, AlertRule, AlertStream, LeaseLostError, Monitor, NewTask, SQLiteStore, Task


async def read_stream(stream: AlertStream, got: list[Alert]) -> None:
    async for alert in stream:
        print(f"  async for: {alert.describe()}")
        got.append(alert)
        if not alert.firing:
            stream.close()


async def main() -> int:
    logging.basicConfig(format="log: %(message)s")  # the monitor also logs each notice at WARNING
    rule = AlertRule(name="stale_commit_burst", event="stale_commit_rejected", threshold=3, window_s=2.0)
    streamed: list[Alert] = []
    called: list[Alert] = []
    callback_resolved = asyncio.Event()

    async def on_alert(alert: Alert) -> None:  # e.g. page someone, post to a channel
        print(f"  callback:  {alert.describe()} (value {alert.value:g})")
        called.append(alert)
        if not alert.firing:
            callback_resolved.set()

    with tempfile.TemporaryDirectory() as folder:
        async with (
            SQLiteStore(os.path.join(folder, "alerts.db")) as store,
            Monitor(store, rules=[rule], flush_interval_s=0.2) as monitor,
        ):
            monitor.subscribe(on_alert)
            reader = asyncio.create_task(read_stream(monitor.alerts(), streamed))  # notices from now on
            await store.enqueue_many([NewTask(queue="q", payload=i, partition_key=f"k{i}") for i in range(8)])
            stale = await store.claim("q", node_id="node-a", limit=8, lease_s=0.2)
            await asyncio.sleep(0.3)  # node-a stalls past its leases
            fresh = await store.claim("q", node_id="node-b", limit=8, lease_s=30)
            outcomes = await store.complete_many(stale)  # the late commits: each refused
            refused = [o for o in outcomes if isinstance(o, LeaseLostError)]
            print(f"burst: {len(refused)} stale commits refused, e.g. {refused[0]}")
            done = await store.complete_many(fresh)
            print(f"node-b committed {sum(isinstance(d, Task) for d in done)} tasks")
            await asyncio.wait_for(reader, timeout=10.0)  # firing, then resolved ~2 s later
            await asyncio.wait_for(callback_resolved.wait(), timeout=5.0)  # callbacks run in their own task
            stats = monitor.statistics()
    print(f"monitor: {stats.alerts_fired} fired, {stats.alerts_resolved} resolved, {stats.flushes} flushes")

    def states(alerts: list[Alert]) -> list[str]:
        return [a.state.value for a in alerts]

    ok = states(streamed) == states(called) == ["firing", "resolved"] and len(refused) == 8
    print(f"one alert for the burst and one resolved notice, on both channels: {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
