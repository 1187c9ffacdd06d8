"""The demo's faults: SIGKILL one worker process at 30 % of the messages sent, stall another at 55 %.

The killed process is replaced a second later by one with the same node ids (a new
incarnation); the stalled one freezes its event loop (SIGUSR1) past its lease, lock
and heartbeat TTL, so its leases and locks pass to other nodes while it sleeps.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

from .options import DemoOptions
from .processes import Worker, spawn
from .record import RunRecord

__all__ = ("inject_faults",)


async def inject_faults(workers: list[Worker], opts: DemoOptions, store: str, gateway: Path, run: RunRecord) -> None:
    """SIGKILL the last worker at 30 % done (and restart it a second later), stall the first at 55 %.

    Each fault is appended to ``run.faults`` with its time since the start, seconds.
    Returns at once with ``opts.faults`` False; otherwise once both faults happened.
    """
    if not opts.faults:
        return
    total = run.total
    victim = workers[-1]
    staller = workers[0]
    killed = stalled = False
    while not (killed and stalled):
        progress = run.done / max(1, total)
        if not killed and progress >= 0.3 and victim.process is not None:
            victim.process.kill()  # SIGKILL: no cleanup, leases and locks left behind
            await asyncio.to_thread(victim.process.wait)
            victim.keep_counts()  # its last report joins the node rows, before the replacement reports
            run.faults.append(
                {"kind": "sigkill", "process": victim.index, "at_s": round(time.monotonic() - run.started, 2)}
            )
            killed = True
            await asyncio.sleep(1.0)
            spawn(victim, opts, store, gateway)  # a replacement with the same node ids (new incarnation)
            run.faults.append(
                {"kind": "restart", "process": victim.index, "at_s": round(time.monotonic() - run.started, 2)}
            )
        if (
            not stalled
            and progress >= 0.55
            and staller.process is not None
            and staller.process.poll() is None
            and staller.ready()  # before, SIGUSR1 would kill it
        ):
            staller.process.send_signal(signal.SIGUSR1)
            run.faults.append(
                {
                    "kind": "stall",
                    "process": staller.index,
                    "stall_s": opts.stall_s,
                    "lease_s": opts.lease_s,
                    "lock_ttl_s": opts.lock_ttl_s,
                    "at_s": round(time.monotonic() - run.started, 2),
                }
            )
            stalled = True
        await asyncio.sleep(0.1)
