"""A process that signals itself twice while its runtime drains, after an earlier event loop's stub.

For tests/node/test_runtime_lifecycle.py. Usage::

    signal_twice_worker.py PATH LOOP MODE

LOOP is ``asyncio`` or ``uvloop``. A first event loop of that kind handles SIGTERM and
SIGINT (``loop.add_signal_handler``) and ends: uvloop leaves its stubs behind as their
handlers, although nothing will ever run the callbacks behind them. A second loop then runs a
runtime (one node, an SQLiteStore at PATH, ``shutdown_timeout_s`` 30) whose sends take
30 s; with both tasks in flight the process sends itself SIGTERM (the graceful drain
begins), then (MODE ``later``) SIGTERM again 0.3 s later, or (MODE ``same-turn``) SIGINT
right after the first SIGTERM, in the same loop turn: the drain must end at once, the
tasks handed back, the process alive. Prints one JSON line::

    {"returned": what wait_for_signal returned, "after_second_s": seconds from the second
     signal to the return, "statuses": task status -> count, "members": live members,
     "locks": held locks, "sigterm_default": whether SIGTERM's handler is SIG_DFL again,
     "sigint_handled": whether SIGINT still has a Python handler (Ctrl-C raises, ``finally`` runs)}
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

from asynccoord import NodeConfig, Runtime, SQLiteStore, Task


async def earlier_loop() -> None:
    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, print, "never")


async def main(path: str, mode: str) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    second_at: list[float] = []

    async def send(task: Task) -> None:
        await asyncio.sleep(30.0)

    def second_signal() -> None:
        second_at.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGTERM)

    def both_signals() -> None:  # handled in one loop turn, before the wait resumes
        os.kill(os.getpid(), signal.SIGTERM)
        second_at.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    async with SQLiteStore(path) as store:
        for key in ("a", "b"):
            await store.enqueue("q", key, partition_key=key)
        config = NodeConfig(queue="q", idle_min_s=0.01, idle_max_s=0.05)
        runtime = Runtime(store, send=send, nodes=1, config=config, heartbeat_ttl_s=1.0, shutdown_timeout_s=30.0)
        async with runtime:
            while runtime.states()[0].in_flight < 2:
                await asyncio.sleep(0.01)
            if mode == "same-turn":
                loop.call_later(0.05, both_signals)
            else:
                loop.call_later(0.05, os.kill, os.getpid(), signal.SIGTERM)
                loop.call_later(0.35, second_signal)
            returned = await runtime.wait_for_signal()
            after_second_s = time.monotonic() - second_at[0] if second_at else None
        statuses = {status.value: n for status, n in (await store.stats("q")).counts.items() if n}
        members = len(await store.members())
        locks = len(await store.list_locks())
    return {
        "returned": returned,
        "after_second_s": after_second_s,
        "statuses": statuses,
        "members": members,
        "locks": locks,
        "sigterm_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
        "sigint_handled": callable(signal.getsignal(signal.SIGINT)),
    }


if __name__ == "__main__":
    db_path, loop_kind, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    run: Callable[[Coroutine[Any, Any, Any]], Any] = asyncio.run
    if loop_kind == "uvloop":
        import uvloop

        run = uvloop.run
    run(earlier_loop())
    print(json.dumps(run(main(db_path, mode))), flush=True)
