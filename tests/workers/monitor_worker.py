"""A real OS process feeding the conflict monitor, driven by the multiprocess monitor tests.

Every message to the parent is one JSON object on one stdout line; any exception
escapes (non-zero exit, traceback on stderr).

Modes::

    monitor_worker.py count PATH --queue Q --tasks N --contended K [--barrier]
        Open one SQLiteStore with a Monitor (process id "count-<pid>"): enqueue N tasks
        to Q, claim and complete them, add K lock_contended events and one latency
        observation per task, flush. Prints {"event": "ready"} first (with --barrier,
        then waits for one stdin line), finally {"event": "done", "process_id": id,
        "events": {name: count}, "latency_counts": {name: count}} once the monitor
        has closed (its last flush written).

    monitor_worker.py drain PATH --queue Q --nodes N --send-s S [--flush-interval-s F]
        Run a Runtime of N nodes (lock per payload account) with a Monitor until the
        queue has nothing pending or running. Prints {"event": "ready"} first, then
        {"event": "done", "process_id": id, "events": {...}, "sent": n}.

    monitor_worker.py alerts TARGET [--schema S] [--interval-s I] [--leader-ttl-s T] [--window-s W]
        Open a SQLiteStore on the path TARGET, or a PostgresStore on the DSN TARGET in
        schema S, with a Monitor (process id "alerts-<pid>", flush and evaluation every I
        seconds, leader lease T) judging one cluster rule, "lost_leases": any lease_lost
        in W seconds. Prints {"event": "ready", "process_id": id}, then one line per
        notice its subscriber gets: {"event": "alert", "rule", "state", "fired_at",
        "monitor_id"}, and {"event": "leader", "leader": bool} whenever the monitor's
        leadership of the cluster rules changes. Reads commands, one per stdin line:
        "lease_lost" counts one lease_lost event; "stats" prints {"event": "stats",
        "evaluations": n, "leader": bool, "alerts_fired": n}; "stop" closes the monitor
        and prints {"event": "done", "alerts_fired": n, "alerts_resolved": n}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

from asynccoord import Alert, AlertRule, Monitor, NewTask, SQLiteStore, Task
from asynccoord import events as ev
from asynccoord.node import NodeConfig, Runtime


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def count(args: argparse.Namespace) -> None:
    process_id = f"count-{os.getpid()}"
    async with SQLiteStore(args.path) as store:
        emit({"event": "ready"})
        if args.barrier:
            await asyncio.to_thread(sys.stdin.readline)
        async with Monitor(store, rules=[], background=False, process_id=process_id) as monitor:
            await store.enqueue_many([NewTask(queue=args.queue, payload=i) for i in range(args.tasks)])
            left = args.tasks
            while left:
                tasks = await store.claim(args.queue, node_id=process_id, limit=50)
                for task in tasks:
                    await store.complete(task)
                    store.latencies.observe("commit_ms", 1.0 + task.id % 7)
                left -= len(tasks)
                await monitor.flush()
            store.events.add(ev.LOCK_CONTENDED, args.contended)
            await monitor.flush()
        emit(
            {
                "event": "done",
                "process_id": process_id,
                "events": dict(store.events.snapshot()),
                "latency_counts": {n: h.count for n, h in store.latencies.snapshot().items()},
            }
        )


async def drain(args: argparse.Namespace) -> None:
    sent = 0

    async def send(task: Task) -> None:
        nonlocal sent
        await asyncio.sleep(args.send_s)
        sent += 1

    async with SQLiteStore(args.path) as store:
        emit({"event": "ready"})
        config = NodeConfig(queue=args.queue, idle_max_s=0.1, claim_batch=8, max_in_flight=8)
        async with (
            Monitor(store, flush_interval_s=args.flush_interval_s) as monitor,
            Runtime(
                store,
                send=send,
                nodes=args.nodes,
                config=config,
                lock_key=lambda t: f"account:{t.payload['account']}",
                heartbeat_ttl_s=3.0,
            ) as runtime,
        ):
            await runtime.wait_until_drained(timeout_s=120.0, poll_s=0.1)
            process_id = monitor.process_id
        emit({"event": "done", "process_id": process_id, "events": dict(store.events.snapshot()), "sent": sent})


async def alerts(args: argparse.Namespace) -> None:
    if args.target.startswith("postgresql://"):
        from asynccoord.backends.postgres.store import PostgresStore

        store: Any = PostgresStore(args.target, schema=args.schema, listen=False)
    else:
        store = SQLiteStore(args.target)
    rule = AlertRule(name="lost_leases", event=ev.LEASE_LOST, threshold=0, window_s=args.window_s)

    def notice(alert: Alert) -> None:
        emit(
            {
                "event": "alert",
                "rule": alert.rule,
                "state": alert.state.value,
                "fired_at": alert.fired_at,
                "monitor_id": alert.monitor_id,
            }
        )

    async with store:
        monitor = Monitor(
            store,
            rules=[rule],
            flush_interval_s=args.interval_s,
            evaluate_interval_s=args.interval_s,
            leader_ttl_s=args.leader_ttl_s,
            process_id=f"alerts-{os.getpid()}",
            log_alerts=False,
        )
        monitor.subscribe(notice)

        async def watch() -> None:
            leader = False
            while True:
                now = monitor.statistics().leader
                if now != leader:
                    leader = now
                    emit({"event": "leader", "leader": leader})
                await asyncio.sleep(args.interval_s / 4)

        async with monitor:
            watcher = asyncio.get_running_loop().create_task(watch())
            emit({"event": "ready", "process_id": monitor.process_id})
            while (line := (await asyncio.to_thread(sys.stdin.readline)).strip()) not in ("stop", ""):
                if line == "lease_lost":
                    store.events.add(ev.LEASE_LOST)
                elif line == "stats":
                    stats = monitor.statistics()
                    emit(
                        {
                            "event": "stats",
                            "evaluations": stats.evaluations,
                            "leader": stats.leader,
                            "alerts_fired": stats.alerts_fired,
                        }
                    )
            watcher.cancel()
        stats = monitor.statistics()
        emit({"event": "done", "alerts_fired": stats.alerts_fired, "alerts_resolved": stats.alerts_resolved})


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("count")
    p.add_argument("path")
    p.add_argument("--queue", default="q")
    p.add_argument("--tasks", type=int, default=100)
    p.add_argument("--contended", type=int, default=0)
    p.add_argument("--barrier", action="store_true")
    p = sub.add_parser("drain")
    p.add_argument("path")
    p.add_argument("--queue", default="outbox")
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--send-s", type=float, default=0.02)
    p.add_argument("--flush-interval-s", type=float, default=0.2)
    p = sub.add_parser("alerts")
    p.add_argument("target")
    p.add_argument("--schema", default=None)
    p.add_argument("--interval-s", type=float, default=0.2)
    p.add_argument("--leader-ttl-s", type=float, default=1.5)
    p.add_argument("--window-s", type=float, default=60.0)
    args = parser.parse_args()
    modes = {"count": count, "drain": drain, "alerts": alerts}
    asyncio.run(modes[args.mode](args))


if __name__ == "__main__":
    main()
