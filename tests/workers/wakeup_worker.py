"""A real OS process hosting idle nodes on a shared SQLite file, for tests/multiprocess/test_sqlite_wakeup.py.

Usage::

    wakeup_worker.py PATH [--nodes N] [--idle-min-s A] [--idle-max-s B] [--no-wakeup]

Opens one SQLiteStore and hosts a Runtime of N nodes (queue ``"q"``) whose idle poll
runs every A .. B seconds (and whose nodes claim by themselves only every 60 s). Prints
one JSON object per stdout line: {"event": "ready", "pid", "socket": its wake-up
socket's file name or null, "node_ids"} once the nodes are idle; then, for every task sent,
{"event": "sent", "id", "payload", "t": time.monotonic() at the send's start}
(CLOCK_MONOTONIC is system-wide on Linux: the parent compares it with its own). Runs
until killed or until a line arrives on stdin, then exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

from asynccoord import SQLiteStore, Task
from asynccoord.node.node import NodeConfig
from asynccoord.node.runtime import Runtime


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("path")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--idle-min-s", type=float, default=20.0)
    parser.add_argument("--idle-max-s", type=float, default=30.0)
    parser.add_argument("--no-wakeup", action="store_true")
    args = parser.parse_args()

    async def send(task: Task) -> None:
        emit({"event": "sent", "id": task.id, "payload": task.payload, "t": time.monotonic()})

    config = NodeConfig(queue="q", idle_min_s=args.idle_min_s, idle_max_s=args.idle_max_s, idle_fallback_s=60.0)
    async with (
        SQLiteStore(args.path, wakeup=not args.no_wakeup) as store,
        Runtime(store, send=send, nodes=args.nodes, config=config) as runtime,
    ):
        await asyncio.sleep(0.5)  # the nodes' first claims came back empty: they wait
        channel = store._wakeup
        emit(
            {
                "event": "ready",
                "pid": os.getpid(),
                "socket": None if channel is None else channel.name,
                "node_ids": [node.node_id for node in runtime.nodes],
            }
        )
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)


if __name__ == "__main__":
    asyncio.run(main())
