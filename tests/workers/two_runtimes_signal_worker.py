"""Two runtimes of one process waiting for SIGTERM at once: one signal stops both.

For tests/node/test_runtime_lifecycle.py. Usage: ``two_runtimes_signal_worker.py PATH``. Each
runtime (one node, queues ``a`` and ``b`` of an SQLiteStore at PATH) calls
``wait_for_signal()``; the process sends itself one SIGTERM. Prints one JSON line::

    {"returned": [what each wait returned], "stages": [each runtime's stage after],
     "sigterm_default": whether SIGTERM's handler is SIG_DFL again}
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Any

from asynccoord import NodeConfig, Runtime, SQLiteStore, Task


async def main(path: str) -> dict[str, Any]:
    async def send(task: Task) -> None:
        pass

    async with SQLiteStore(path) as store:
        runtimes = [
            Runtime(store, send=send, nodes=1, config=NodeConfig(queue=queue, idle_min_s=0.01, idle_max_s=0.05))
            for queue in ("a", "b")
        ]
        async with runtimes[0], runtimes[1]:
            asyncio.get_running_loop().call_later(0.2, os.kill, os.getpid(), signal.SIGTERM)
            returned = await asyncio.wait_for(asyncio.gather(*(r.wait_for_signal() for r in runtimes)), 10.0)
        stages = [repr(r).split()[1] for r in runtimes]
    return {
        "returned": returned,
        "stages": stages,
        "sigterm_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1]))), flush=True)
