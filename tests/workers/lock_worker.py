"""A real OS process taking locks on a shared SQLite file, driven by tests/multiprocess/test_lock_multiprocess.py.

Every message to the parent is one JSON object on one stdout line. Any unexpected
exception escapes (non-zero exit, traceback on stderr), so it fails the test.

Modes::

    lock_worker.py count PATH --name N --increments K [--sleep-s S]
        Prints {"event": "ready"}, waits for one line on stdin, then K times: under
        ``async with Lock(store, N, ttl_s=10)`` read the row of table ``counter`` with a
        plain sqlite3 connection, sleep S seconds, write the value + 1 (a deliberately
        non-atomic read-sleep-write). Finally prints {"event": "done", "tokens": [fencing
        tokens]}.

    lock_worker.py pause PATH --name N --resource R [--ttl-s T] [--interval-s I] [--sleep-s S] [--block]
        Take N with the watchdog (TTL T, renewal every I), print {"event": "acquired",
        ...lease}, block the event loop with time.sleep(S), then write R with the
        lease's fencing token (fenced_write), renew the lease directly in the store and
        release it. With --block the same happens inside ``async with``. Prints
        {"event": "done", ...outcomes and counters}.

    lock_worker.py hold PATH --name N [--ttl-s T] [--interval-s I]
        Take N with the watchdog, print {"event": "acquired", ...lease}, then sleep
        until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import sqlite3
import sys
import time
from typing import Any

from asynccoord import (
    FencingTokenRejectedError,
    Lease,
    Lock,
    LockError,
    SQLiteStore,
)


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def count(args: argparse.Namespace) -> None:
    tokens: list[int] = []
    db = sqlite3.connect(args.path, timeout=30.0, isolation_level=None)
    async with SQLiteStore(args.path) as store:
        emit({"event": "ready"})
        await asyncio.to_thread(sys.stdin.readline)
        for _ in range(args.increments):
            async with Lock(store, args.name, ttl_s=10.0) as lease:
                tokens.append(lease.fencing_token)
                (value,) = db.execute("SELECT value FROM counter WHERE id = 1").fetchone()
                await asyncio.sleep(args.sleep_s)
                db.execute("UPDATE counter SET value = ? WHERE id = 1", (value + 1,))
    db.close()
    emit({"event": "done", "tokens": tokens})


async def pause(args: argparse.Namespace) -> None:
    out: dict[str, Any] = {"event": "done"}
    async with SQLiteStore(args.path) as store:
        lock = Lock(store, args.name, ttl_s=args.ttl_s, renew_interval_s=args.interval_s)
        leases: list[Lease] = []

        async def write_after_pause() -> None:
            lease = lock.lease
            assert lease is not None
            leases.append(lease)
            emit({"event": "acquired", **dataclasses.asdict(lease)})
            time.sleep(args.sleep_s)  # the whole event loop stops: no watchdog, no renewal
            try:
                await store.fenced_write(args.resource, lease.fencing_token, "A")
                out["write"] = "accepted"
            except FencingTokenRejectedError:
                out["write"] = "rejected"
                raise

        if args.block:
            try:
                async with lock:
                    await write_after_pause()
                out["block"] = "completed"
            except LockError as exc:
                out["block"] = type(exc).__name__
        else:
            await lock.acquire()
            with contextlib.suppress(FencingTokenRejectedError):
                await write_after_pause()
            await asyncio.sleep(0.01)  # let the watchdog run (it would have by the next await anyway)
            out["handle_lost"] = lock.lost is not None
            try:
                await lock.release()
                out["release"] = "released"
            except LockError as exc:
                out["release"] = type(exc).__name__
        # A's renewal, sent straight to the store: it must neither extend nor recreate the lock.
        out["store_renew"] = None if await store.renew_lock(leases[0]) is None else "renewed"
        out["events"] = dict(store.events.snapshot())
        out["watchdog"] = dataclasses.asdict(lock.watchdog.statistics())
    emit(out)


async def hold(args: argparse.Namespace) -> None:
    async with SQLiteStore(args.path) as store:
        lock = Lock(store, args.name, ttl_s=args.ttl_s, renew_interval_s=args.interval_s)
        lease = await lock.acquire()
        emit({"event": "acquired", **dataclasses.asdict(lease)})
        await asyncio.sleep(3600)


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("count")
    p.add_argument("path")
    p.add_argument("--name", required=True)
    p.add_argument("--increments", type=int, required=True)
    p.add_argument("--sleep-s", type=float, default=0.002)
    p = sub.add_parser("pause")
    p.add_argument("path")
    p.add_argument("--name", required=True)
    p.add_argument("--resource", required=True)
    p.add_argument("--ttl-s", type=float, default=0.3)
    p.add_argument("--interval-s", type=float, default=0.1)
    p.add_argument("--sleep-s", type=float, default=1.0)
    p.add_argument("--block", action="store_true")
    p = sub.add_parser("hold")
    p.add_argument("path")
    p.add_argument("--name", required=True)
    p.add_argument("--ttl-s", type=float, default=0.5)
    p.add_argument("--interval-s", type=float, default=None)
    args = parser.parse_args()
    modes = {"count": count, "pause": pause, "hold": hold}
    asyncio.run(modes[args.mode](args))


if __name__ == "__main__":
    main()
