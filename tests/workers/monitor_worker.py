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
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

from asynccoord import Monitor, NewTask, SQLiteStore, Task
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
    args = parser.parse_args()
    asyncio.run(count(args) if args.mode == "count" else drain(args))


if __name__ == "__main__":
    main()
