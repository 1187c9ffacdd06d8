"""A process that another of its tasks ends with ``sys.exit(3)`` while a runtime sends.

For tests/multiprocess/test_foreign_exit.py. Usage::

    foreign_exit_worker.py BACKEND LOCKS TARGET [SCHEMA]

BACKEND is ``memory`` (TARGET ignored), ``sqlite`` (TARGET a database file) or ``postgres``
(TARGET a DSN, SCHEMA the store's schema); LOCKS ``locks`` (one account lock per task, held
for 60 s) or ``nolocks``. A runtime of 2 nodes sends 6 tasks whose sends take 30 s, leased
for 60 s, under ``wait_for_signal`` in ``asyncio.run``, as a bot runs. Once the 6 sends are
in flight, another task of the program (a bot's shutdown command, say) calls ``sys.exit(3)``:
asyncio lets the ``SystemExit`` out of the loop and ``asyncio.run`` cancels every task left,
in no order, the store's own among them. Just before the exit the process prints
``exit_at T`` (``time.monotonic()``, one clock for every process of the machine).

Nothing is caught: the process ends with the exit, and the test reads the database
afterwards. The memory store, which no other process sees, is read by this process: once
``asyncio.run`` has ended, it opens the store again in a new loop and prints
``after claimable=N locks=N members=N`` (the tasks it can claim, the locks and the members
left) before the exit goes on.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from asynccoord import MemoryStore, NodeConfig, PostgresStore, Runtime, SQLiteStore, Task

TASKS = 6


def make_store(backend: str, target: str, schema: str) -> Any:
    if backend == "memory":
        return MemoryStore()
    if backend == "sqlite":
        return SQLiteStore(target)
    return PostgresStore(target, schema=schema)


async def main(store: Any, locks: bool) -> None:
    in_flight = 0
    all_in_flight = asyncio.Event()

    async def send(task: Task) -> None:
        nonlocal in_flight
        in_flight += 1
        if in_flight == TASKS:
            all_in_flight.set()
        await asyncio.sleep(30.0)

    async def shutdown_command() -> None:
        await all_in_flight.wait()
        print(f"exit_at {time.monotonic()}", flush=True)
        sys.exit(3)

    async with store:
        for n in range(TASKS):
            await store.enqueue("q", n, partition_key=f"c{n}")
        config = NodeConfig(queue="q", lease_s=60.0, lock_ttl_s=60.0, idle_min_s=0.01, idle_max_s=0.05)
        lock_key = (lambda t: f"account:{t.payload}") if locks else None
        runtime = Runtime(store, send=send, nodes=2, config=config, lock_key=lock_key)
        async with runtime:
            exit_task = asyncio.get_running_loop().create_task(shutdown_command())
            await runtime.wait_for_signal()
            await exit_task


async def left_over(store: MemoryStore) -> str:
    async with store:
        claimed = await store.claim("q", node_id="checker", limit=100)
        return f"claimable={len(claimed)} locks={len(await store.list_locks())} members={len(await store.members())}"


if __name__ == "__main__":
    backend, locks, target = sys.argv[1:4]
    store = make_store(backend, target, sys.argv[4] if len(sys.argv) > 4 else "")
    try:
        asyncio.run(main(store, locks == "locks"))
    finally:
        if backend == "memory":
            print(f"after {asyncio.run(left_over(store))}", flush=True)
