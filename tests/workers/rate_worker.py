"""A real OS process hosting a Runtime on a shared store, for tests/multiprocess/test_ratelimits_multiprocess.py.

Usage::

    rate_worker.py TARGET --log LOG --queue Q [--schema S] [--nodes N] [--lease-s L] [--send-s S]

TARGET is an SQLite file or a ``postgresql://`` DSN (with ``--schema``, the store's
schema). Opens one store there (real database clock) and runs a Runtime of N nodes
draining Q in order. Every send appends one JSON line to LOG with one ``os.write`` (O_APPEND: never
torn, nothing lost when the process is killed) *before* it sleeps S seconds:
{"id", "chat", "pid", "t": time.clock_gettime(CLOCK_MONOTONIC)}, the moment the message
would reach the provider. Prints {"event": "ready"} once the runtime runs and
{"event": "done"} after the queue has nothing pending or running.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

from asynccoord import SQLiteStore, Task, TaskStatus
from asynccoord.backends.postgres.store import PostgresStore
from asynccoord.node.node import NodeConfig
from asynccoord.node.runtime import Runtime


def emit(obj: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("target")
    parser.add_argument("--schema", default=None)
    parser.add_argument("--log", required=True)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--lease-s", type=float, default=5.0)
    parser.add_argument("--send-s", type=float, default=0.005)
    args = parser.parse_args()
    fd = os.open(args.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    async def send(task: Task) -> None:
        line = {"id": task.id, "chat": task.payload["chat"], "pid": os.getpid()}
        line["t"] = time.clock_gettime(time.CLOCK_MONOTONIC)
        os.write(fd, (json.dumps(line) + "\n").encode())
        await asyncio.sleep(args.send_s)

    config = NodeConfig(queue=args.queue, ordered=True, lease_s=args.lease_s, idle_max_s=0.5)
    store: SQLiteStore | PostgresStore
    if args.target.startswith("postgresql://"):
        store = PostgresStore(args.target, schema=args.schema)
    else:
        store = SQLiteStore(args.target)
    async with store, Runtime(store, send=send, nodes=args.nodes, config=config, heartbeat_ttl_s=2.0):
        emit({"event": "ready"})
        while True:
            stats = await store.stats(args.queue)
            if stats.counts[TaskStatus.PENDING] + stats.counts[TaskStatus.RUNNING] == 0:
                break
            await asyncio.sleep(0.1)
    emit({"event": "done"})


if __name__ == "__main__":
    asyncio.run(main())
