"""A real OS process working on a shared SQLite file, driven by the multiprocess tests.

Every message to the parent is one JSON object on one stdout line. Any exception
escapes (non-zero exit, traceback on stderr), so an error that reached "user code"
here fails the test that started the process.

Modes::

    queue_worker.py drain PATH [--queue Q] [--nodes N] [--batch B] [--lease-s L] [--work-s W] [--barrier]
        Open one SQLiteStore and run N nodes (asyncio tasks) that claim up to B tasks,
        "work" W seconds per task and complete each, until the queue has nothing
        pending or running. Prints {"event": "ready"} first; with --barrier, then waits
        for one line on stdin before starting. Finally prints {"event": "done",
        "completed": [ids], "lost": n, "max_claim_s": s, "max_complete_s": s}.

    queue_worker.py hold PATH [--queue Q] [--limit N] [--lease-s L]
        Claim up to N tasks, print {"event": "claimed", "tasks": [task as dict]}, then
        sleep until killed.

    queue_worker.py locker PATH [--hold-s H] [--period-s P]
        With a plain sqlite3 connection, hold a write transaction (BEGIN IMMEDIATE and
        one insert) for H seconds out of every P, forever. Prints {"event": "locked"}
        when the first hold starts.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sqlite3
import sys
import time
from typing import Any

from asynccoord import LeaseLostError, SQLiteStore, Task


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def drain(args: argparse.Namespace) -> None:
    completed: list[int] = []
    lost = 0
    max_claim_s = 0.0
    max_complete_s = 0.0
    async with SQLiteStore(args.path) as store:
        emit({"event": "ready"})
        if args.barrier:
            await asyncio.to_thread(sys.stdin.readline)

        async def node(index: int) -> None:
            nonlocal lost, max_claim_s, max_complete_s
            node_id = f"p{os.getpid()}-n{index}"
            while True:
                started = time.monotonic()
                tasks = await store.claim(args.queue, node_id=node_id, limit=args.batch, lease_s=args.lease_s)
                max_claim_s = max(max_claim_s, time.monotonic() - started)
                if not tasks:
                    stats = await store.stats(args.queue)
                    if stats.counts["pending"] == 0 and stats.counts["running"] == 0:
                        return
                    await asyncio.sleep(0.005)  # polling interval of an idle node
                    continue
                for task in tasks:
                    if args.work_s:
                        await asyncio.sleep(args.work_s)  # the "work"
                    started = time.monotonic()
                    try:
                        await store.complete(task, {"by": node_id})
                    except LeaseLostError:
                        lost += 1
                        continue
                    max_complete_s = max(max_complete_s, time.monotonic() - started)
                    completed.append(task.id)

        await asyncio.gather(*(node(i) for i in range(args.nodes)))
    emit(
        {
            "event": "done",
            "completed": completed,
            "lost": lost,
            "max_claim_s": max_claim_s,
            "max_complete_s": max_complete_s,
        }
    )


def task_to_json(task: Task) -> dict[str, Any]:
    data = dataclasses.asdict(task)
    data["status"] = task.status.value
    return data


async def hold(args: argparse.Namespace) -> None:
    async with SQLiteStore(args.path) as store:
        tasks = await store.claim(args.queue, node_id=f"doomed-{os.getpid()}", limit=args.limit, lease_s=args.lease_s)
        emit({"event": "claimed", "tasks": [task_to_json(t) for t in tasks]})
        await asyncio.Event().wait()  # until SIGKILL


def locker(args: argparse.Namespace) -> None:
    db = sqlite3.connect(args.path, timeout=30, isolation_level=None)
    db.execute("CREATE TABLE IF NOT EXISTS locker_log (at REAL NOT NULL)")
    first = True
    while True:
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO locker_log (at) VALUES (?)", (time.time(),))
        if first:
            emit({"event": "locked"})
            first = False
        time.sleep(args.hold_s)
        db.execute("COMMIT")
        time.sleep(args.period_s - args.hold_s)


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("drain")
    p.add_argument("path")
    p.add_argument("--queue", default="q")
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lease-s", type=float, default=30.0)
    p.add_argument("--work-s", type=float, default=0.0)
    p.add_argument("--barrier", action="store_true")
    p = sub.add_parser("hold")
    p.add_argument("path")
    p.add_argument("--queue", default="q")
    p.add_argument("--limit", type=int, default=10)
    p.add_argument("--lease-s", type=float, default=1.0)
    p = sub.add_parser("locker")
    p.add_argument("path")
    p.add_argument("--hold-s", type=float, default=0.5)
    p.add_argument("--period-s", type=float, default=1.0)
    args = parser.parse_args()
    if args.mode == "drain":
        asyncio.run(drain(args))
    elif args.mode == "hold":
        asyncio.run(hold(args))
    else:
        locker(args)


if __name__ == "__main__":
    main()
