"""One demo worker process: a Runtime of N nodes sending through the simulated gateway.

Started by :mod:`asynccoord.demo.app` (``python -m asynccoord.demo.worker ...``) on the
demo's store (an SQLite file or a PostgreSQL DSN and schema). It writes its nodes'
counters to a JSON status file a few times a second for the live view (not with ``--json``),
flushes its coordination counters to the store through a :class:`~asynccoord.Monitor`,
stalls its whole event loop once on SIGUSR1 (a simulated stop-the-world GC pause, taken
inside a send after the lock was acquired and before the gateway is called), and shuts
down gracefully on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from .._loop import run as run_loop
from ..backends.open import open_store
from ..config import RetryPolicy
from ..contract.ratelimits import RateLimit
from ..errors import RateLimited
from ..models import Task
from ..monitor.monitor import Monitor
from ..node import NodeConfig, Runtime, current_delivery
from .gateway import ProviderRateLimitError, SimulatedGateway

__all__ = ("DEMO_QUEUE", "EarlyStop", "main", "lock_key")

DEMO_QUEUE = "outbox"


log = logging.getLogger(__name__)


def lock_key(task: Task) -> str:
    """The lock a message needs: its sending account."""
    return f"account:{task.payload['account']}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="asynccoord demo worker (started by asynccoord.demo)")
    parser.add_argument("--store", required=True, help="SQLite file or postgresql:// DSN")
    parser.add_argument("--schema", default=None, help="PostgreSQL schema of the demo's tables")
    parser.add_argument("--lock-store", default=None, help="redis:// URL: the account locks in Redis")
    parser.add_argument("--lock-prefix", default="asynccoord-demo:", help="key prefix of the locks in Redis")
    parser.add_argument("--gateway", required=True)
    parser.add_argument("--status-file", required=True)
    parser.add_argument("--status-interval-s", type=float, default=0.25, help="0: write no status file")
    parser.add_argument(
        "--ready-file", default=None, help="created once SIGTERM and SIGUSR1 are handled (before that they kill)"
    )
    parser.add_argument("--prefix", required=True, help="node id prefix (reused by a replacement process)")
    parser.add_argument(
        "--parent-pid", type=int, default=None, help="the demo's pid: exit once it is gone (default: parent at start)"
    )
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lease-s", type=float, default=2.0)
    parser.add_argument("--lock-ttl-s", type=float, default=2.0)
    parser.add_argument("--lock-wait-s", type=float, default=5.0)
    parser.add_argument("--max-in-flight", type=int, default=16)
    parser.add_argument("--claim-batch", type=int, default=16)
    parser.add_argument("--idle-max-s", type=float, default=1.0)
    parser.add_argument("--monitor-flush-s", type=float, default=1.0)
    parser.add_argument("--heartbeat-ttl-s", type=float, default=3.0)
    parser.add_argument("--stall-s", type=float, default=5.0)
    parser.add_argument("--latency-median-ms", type=float, default=1.0)
    parser.add_argument("--latency-sigma", type=float, default=0.6)
    parser.add_argument("--error-rate", type=float, default=0.01)
    parser.add_argument(
        "--provider-limits",
        default="[]",
        help="the simulated provider's rate limits: JSON list of [dimension, count, per_s, burst]",
    )
    return parser.parse_args(argv)


class EarlyStop:
    """Keeps a SIGTERM that arrives while the worker is still starting, and stops the worker once it is up.

    Until :meth:`~asynccoord.Runtime.wait_for_signal` takes SIGTERM over, the signal's
    default action would kill the process (exit status -15) with its store and gateway
    half open; the demo stops its workers with SIGTERM as soon as the last message is
    done, which can be before a late worker (a replacement, or one slow to open the
    store) got that far. :meth:`install` (first thing in :func:`main`) puts a handler in
    place that only records the signal; :meth:`watch` (once the runtime runs) shuts the
    runtime down if the signal came already, or when it comes before the wait takes it
    (``wait_for_signal`` then returns as soon as the shutdown starts). ``wait_for_signal``
    puts this handler back when its wait ends, so a late signal is still harmless.
    """

    def __init__(self) -> None:
        self.received = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runtime: Runtime | None = None
        self._shutdown: asyncio.Task[None] | None = None

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        self.received = True
        if self._loop is not None:
            # After the run the loop is closed: the worker is exiting, there is nothing to stop.
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop)

    def watch(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._loop = asyncio.get_running_loop()
        if self.received:
            self._loop.call_soon(self._stop)

    def _stop(self) -> None:
        if self._shutdown is None and self._runtime is not None and self._loop is not None:
            log.warning("asynccoord.demo.worker.early_sigterm: SIGTERM came while starting: shutting down")
            self._shutdown = self._loop.create_task(self._runtime.shutdown())


async def run(args: argparse.Namespace, early_stop: EarlyStop | None = None) -> int:
    stall_requested = False
    stalled = False

    def request_stall() -> None:
        nonlocal stall_requested
        stall_requested = True

    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, request_stall)
    if args.ready_file is not None:
        await asyncio.to_thread(Path(args.ready_file).touch)  # SIGTERM (see EarlyStop) and SIGUSR1 handled
    config = NodeConfig(
        queue=DEMO_QUEUE,
        lease_s=args.lease_s,
        lock_ttl_s=args.lock_ttl_s,
        lock_wait_s=args.lock_wait_s,
        claim_batch=args.claim_batch,
        max_in_flight=args.max_in_flight,
        send_timeout_s=5.0,
        idle_max_s=args.idle_max_s,
        retry=RetryPolicy(base_s=0.05, factor=2.0, cap_s=1.0, jitter=0.2),
        lock_pace_dimension="account",  # the account lock serialises the account's sends: space them to its limit
    )
    options = {} if args.schema is None else {"schema": args.schema}
    async with (
        open_store(args.store, **options) as store,
        _lock_store(args) as locks,
        SimulatedGateway(
            args.gateway,
            latency_median_ms=args.latency_median_ms,
            latency_sigma=args.latency_sigma,
            transient_error_rate=args.error_rate,
            seed=args.seed,
            limits=[
                RateLimit(dimension=d, count=c, per_s=p, burst=b) for d, c, p, b in json.loads(args.provider_limits)
            ],
        ) as gateway,
    ):

        async def send(task: Task) -> Any:
            nonlocal stalled
            late = False
            if stall_requested and not stalled:
                stalled = late = True
                time.sleep(args.stall_s)  # noqa: ASYNC251 - on purpose: a stop-the-world pause of the whole process
            delivery = current_delivery()
            p = task.payload
            try:
                return await gateway.deliver(
                    msg_id=p["msg"],
                    account=p["account"],
                    conversation=task.partition_key,
                    seq=p["seq"],
                    fencing_token=delivery.lock.fencing_token if delivery.lock is not None else 0,
                    idempotency_key=task.idempotency_key,
                    node=delivery.node_id,
                    late=late,
                )
            except ProviderRateLimitError as exc:  # HTTP 429: the store pauses the bucket for every process
                raise RateLimited(exc.retry_after_s, dimension=exc.dimension, key=exc.key) from exc

        runtime = Runtime(
            store,
            send=send,
            config=config,
            lock_key=lock_key,
            node_ids=[f"{args.prefix}-n{i}" for i in range(args.nodes)],
            lock_store=locks,
            heartbeat_ttl_s=args.heartbeat_ttl_s,
            shutdown_timeout_s=3.0,
        )
        monitor = Monitor(store, flush_interval_s=args.monitor_flush_s, info={"prefix": args.prefix}, lock_store=locks)
        async with monitor, runtime:
            if early_stop is not None:
                early_stop.watch(runtime)
            writer = asyncio.create_task(
                _write_status(runtime, Path(args.status_file), args.status_interval_s, lambda: stalled)
            )
            orphan = asyncio.create_task(_exit_when_orphaned(runtime, args.parent_pid))
            try:
                await runtime.wait_for_signal()
            finally:
                writer.cancel()
                orphan.cancel()
        if args.status_interval_s > 0:  # the counters as the nodes stopped: the demo's final table adds up
            _status_once(runtime, Path(args.status_file), stalled)
    return 0


@contextlib.asynccontextmanager
async def _lock_store(args: argparse.Namespace) -> AsyncIterator[Any]:
    """The Redis lock store of ``--lock-store`` (None without: the queue store holds the locks)."""
    if args.lock_store is None:
        yield None
        return
    from ..backends.redis import RedisLockStore

    async with RedisLockStore(args.lock_store, prefix=args.lock_prefix) as locks:
        yield locks


async def _exit_when_orphaned(runtime: Runtime, parent: int | None, poll_s: float = 0.5) -> None:
    """Shut down (as on SIGTERM) once the demo process that started this worker is gone.

    A demo killed before it could stop its workers (SIGKILL, a timeout) leaves them
    re-parented: they notice within ``poll_s`` and hand their work back instead of
    running on forever. ``parent`` is the demo's pid as the demo gave it, so a demo
    killed while this worker was still starting is noticed too (the parent pid read at
    start would already be the new parent's).
    """
    if parent is None:
        parent = os.getppid()
    while True:  # no event to wait on: a parent's death is only seen by polling getppid()
        if os.getppid() != parent:
            break
        await asyncio.sleep(poll_s)
    log.warning("asynccoord.demo.worker.orphaned parent=%d: shutting down", parent)
    await runtime.shutdown()


async def _write_status(runtime: Runtime, path: Path, interval_s: float, stalled: Any) -> None:
    if interval_s <= 0:
        return
    while True:
        _status_once(runtime, path, stalled())
        await asyncio.sleep(interval_s)


def _status_once(runtime: Runtime, path: Path, stalled: bool) -> None:
    """Replace the status file ``path`` with the nodes' counters now (read by :func:`~.processes.read_states`)."""
    states = [
        {
            "node_id": s.node_id,
            "status": s.status.value,
            "claimed": s.claimed,
            "sent": s.sent,
            "committed": s.committed,
            "failed": s.failed,
            "in_flight": s.in_flight,
            "conflicts": s.conflicts,
            "owned_partitions": s.owned_partitions,
        }
        for s in runtime.states()
    ]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "at": time.time(), "stalled": stalled, "nodes": states}))
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    early_stop = EarlyStop()
    early_stop.install()
    args = parse_args(argv)
    try:
        return int(run_loop(run(args, early_stop)))
    finally:
        # The work is over. Python puts SIG_DFL back for its handlers while the interpreter
        # shuts down, so a SIGTERM then (a demo stopping its workers twice) would end the
        # process with -15 after a clean stop; an ignored signal stays ignored.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


if __name__ == "__main__":
    raise SystemExit(main())
