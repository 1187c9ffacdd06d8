"""A process whose application has signal handlers of its own around ``Runtime.wait_for_signal``.

For tests/node/test_runtime_lifecycle.py. Usage::

    signal_worker.py PATH LOOP

LOOP is ``asyncio`` (``asyncio.run``) or ``uvloop`` (``uvloop.run``). Before the runtime
starts, the application handles SIGTERM with a handler of the event loop
(``loop.add_signal_handler``) and SIGUSR1 with a ``signal.signal`` handler;
``asyncio.run`` (and ``uvloop.run``) handle SIGINT with theirs. The runtime (one node,
an SQLiteStore at PATH) drains one task, then waits for SIGTERM, SIGUSR1 or SIGINT while
the process sends itself SIGTERM (50 ms in) and SIGUSR1 (200 ms in). Once the runtime is
shut down the process sends itself SIGTERM and SIGUSR1 again: if a handler were lost, the
SIGTERM would kill it. Prints one JSON line::

    {"loop": event loop class, "returned": what wait_for_signal returned,
     "during": {"SIGTERM": app handler calls, "SIGUSR1": ...} when the wait returned,
     "after": {...} at the end, "restored": {"SIGUSR1": bool, "SIGINT": bool}}
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections import Counter
from types import FrameType
from typing import Any

from asynccoord import NodeConfig, Runtime, SQLiteStore, Task


async def main(path: str) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    calls: Counter[str] = Counter()

    def on_usr1(signum: int, frame: FrameType | None) -> None:
        calls["SIGUSR1"] += 1

    loop.add_signal_handler(signal.SIGTERM, calls.update, ["SIGTERM"])
    signal.signal(signal.SIGUSR1, on_usr1)
    sigint_before = signal.getsignal(signal.SIGINT)

    async def send(task: Task) -> None:
        pass

    async with SQLiteStore(path) as store:
        await store.enqueue("q", 1)
        config = NodeConfig(queue="q", idle_min_s=0.01, idle_max_s=0.05)
        async with Runtime(store, send=send, nodes=1, config=config, heartbeat_ttl_s=1.0) as runtime:
            assert await runtime.wait_until_drained(timeout_s=10.0, poll_s=0.01)
            loop.call_later(0.05, os.kill, os.getpid(), signal.SIGTERM)
            loop.call_later(0.2, os.kill, os.getpid(), signal.SIGUSR1)
            returned = await runtime.wait_for_signal((signal.SIGTERM, signal.SIGUSR1, signal.SIGINT))
            during = dict(calls)
    restored = {
        "SIGUSR1": signal.getsignal(signal.SIGUSR1) is on_usr1,
        "SIGINT": signal.getsignal(signal.SIGINT) is sigint_before,
    }
    for signum in (signal.SIGTERM, signal.SIGUSR1):
        os.kill(os.getpid(), signum)
        await asyncio.sleep(0.05)
    return {
        "loop": type(loop).__name__,
        "returned": returned,
        "during": during,
        "after": dict(calls),
        "restored": restored,
    }


if __name__ == "__main__":
    db_path, loop_kind = sys.argv[1], sys.argv[2]
    if loop_kind == "uvloop":
        import uvloop

        result = uvloop.run(main(db_path))
    else:
        result = asyncio.run(main(db_path))
    print(json.dumps(result), flush=True)
