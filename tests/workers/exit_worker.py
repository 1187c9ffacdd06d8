"""A process whose send (or lock_key) raises ``KeyboardInterrupt`` or ``SystemExit`` mid-run.

For tests/node/test_node_settle.py. Usage::

    exit_worker.py PATH LOOP KIND SOURCE

LOOP is ``asyncio`` or ``uvloop``; KIND ``keyboard_interrupt`` or ``system_exit`` (code 3);
SOURCE ``send`` or ``lock_key``. A runtime of 2 nodes over an SQLiteStore at PATH, with an
account lock per task, runs 4 tasks whose sends take 30 s, under ``wait_for_signal`` in
``asyncio.run`` (or ``uvloop.run``), as a bot runs. Once the 4 sends are in flight a 5th
task is enqueued, whose send (or ``lock_key``) raises KIND. Nothing is caught here: the
process ends with what was raised, and the test reads the database afterwards.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from asynccoord import NodeConfig, Runtime, SQLiteStore, Task

EXITS: dict[str, Callable[[], BaseException]] = {
    "keyboard_interrupt": KeyboardInterrupt,
    "system_exit": lambda: SystemExit(3),
}


async def main(path: str, kind: str, source: str) -> None:
    in_flight = 0
    four_in_flight = asyncio.Event()
    raiser = 4

    def lock_key(task: Task) -> str:
        if source == "lock_key" and task.payload == raiser:
            raise EXITS[kind]()
        return f"account:{task.payload}"

    async def send(task: Task) -> None:
        nonlocal in_flight
        if source == "send" and task.payload == raiser:
            raise EXITS[kind]()
        in_flight += 1
        if in_flight == 4:
            four_in_flight.set()
        await asyncio.sleep(30.0)

    async def enqueue_the_raiser(store: SQLiteStore) -> None:
        await four_in_flight.wait()
        await store.enqueue("q", raiser, partition_key=f"c{raiser}")

    async with SQLiteStore(path) as store:
        for n in range(4):
            await store.enqueue("q", n, partition_key=f"c{n}")
        config = NodeConfig(queue="q", idle_min_s=0.01, idle_max_s=0.05, lock_ttl_s=10.0)
        runtime = Runtime(
            store, send=send, nodes=2, config=config, lock_key=lock_key, shutdown_timeout_s=30.0, heartbeat_ttl_s=1.0
        )
        async with runtime:
            enqueuer = asyncio.create_task(enqueue_the_raiser(store))
            await runtime.wait_for_signal()
            await enqueuer


if __name__ == "__main__":
    db_path, loop_kind, kind, source = sys.argv[1:5]
    run: Callable[[Coroutine[Any, Any, Any]], Any] = asyncio.run
    if loop_kind == "uvloop":
        import uvloop

        run = uvloop.run
    run(main(db_path, kind, source))
