"""A real OS process holding a lock in a send, to be frozen, for tests/multiprocess/test_inhibition_multiprocess.py.

Every message to the parent is one JSON object on one stdout line. Any unexpected
exception escapes (non-zero exit, traceback on stderr), so it fails the test.

Mode::

    freeze_worker.py PATH --queue Q --ttl-s T
        Open one SQLiteStore (real database clock) with a Monitor that judges no rule (it
        only flushes this process's counters, every 0.2 s), and host a Runtime of one node on
        Q whose heartbeat TTL, lock TTL and task lease are T seconds (the lease 2 T), each task
        under the lock ``"account:<payload account>"``. Prints {"event": "ready", "pid"}.
        The first attempt of a send prints {"event": "sending", "id", "fencing_token"} and
        waits until cancelled (the parent freezes the process meanwhile: its lock and lease
        lapse); later attempts return at once. Every notice the monitor publishes is printed as
        {"event": "alert", "rule", "state"}. On a line "stop" on stdin it shuts down and
        prints {"event": "done", "events": the store's counters}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

from asynccoord import Alert, Monitor, SQLiteStore, Task
from asynccoord.node import NodeConfig, Runtime, current_delivery


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def main(args: argparse.Namespace) -> None:
    async def send(task: Task) -> None:
        if task.attempts > 1:
            return
        lock = current_delivery().lock
        emit({"event": "sending", "id": task.id, "fencing_token": None if lock is None else lock.fencing_token})
        await asyncio.Event().wait()

    def notice(alert: Alert) -> None:
        emit({"event": "alert", "rule": alert.rule, "state": alert.state.value})

    config = NodeConfig(queue=args.queue, lease_s=2 * args.ttl_s, lock_ttl_s=args.ttl_s, idle_max_s=0.2)
    async with (
        SQLiteStore(args.path) as store,
        Monitor(store, rules=(), flush_interval_s=0.2, process_id="frozen", log_alerts=False) as monitor,
    ):
        monitor.subscribe(notice)
        runtime = Runtime(
            store,
            send=send,
            nodes=1,
            config=config,
            lock_key=lambda task: f"account:{task.payload['account']}",
            heartbeat_ttl_s=args.ttl_s,
        )
        async with runtime:
            emit({"event": "ready", "pid": os.getpid()})
            while (await asyncio.to_thread(sys.stdin.readline)).strip() != "stop":
                pass
        await monitor.flush()
        emit({"event": "done", "events": dict(store.events.snapshot())})


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("path")
    parser.add_argument("--queue", required=True)
    parser.add_argument("--ttl-s", type=float, required=True)
    asyncio.run(main(parser.parse_args()))
