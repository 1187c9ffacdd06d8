"""A real OS process hosting a Runtime on a shared SQLite file, for tests/multiprocess/test_node_multiprocess.py.

Every message to the parent is one JSON object on one stdout line. Any unexpected
exception escapes (non-zero exit, traceback on stderr), so it fails the test.

Modes::

    node_worker.py drain PATH --log LOG [--queue Q] [--nodes N] [--max-in-flight M]
                   [--claim-batch B] [--lease-s L] [--heartbeat-ttl-s T]
                   [--send-min-s A] [--send-max-s B] [--lock-permits P] [--lock-ttl-s K] [--barrier]
        Open one SQLiteStore (real database clock) and host a Runtime of N nodes whose
        lock key is ``"account:<payload account>"`` (P permits per account, lock TTL K). Prints
        {"event": "ready", "pid", "node_ids"}; with --barrier, then waits for one line
        on stdin before starting the Runtime. While it runs, prints on every change of
        the membership view (the first view included) {"event": "view", "version",
        "node_ids", "owned": partitions owned by this process's nodes, "t":
        time.monotonic()} (CLOCK_MONOTONIC is system-wide on Linux, so the parent can
        compare ``t`` with its own). Once the queue has nothing pending or running, it
        shuts the Runtime down and prints {"event": "done", "committed": commits of
        its nodes, "sent", "conflicts", "handed_back", "events": store counters}.

        The send sleeps uniform(A, B) seconds. Every send appends two JSON lines to LOG
        with one ``os.write`` each (O_APPEND: a line is never torn, and nothing is lost
        to buffering when the process is killed): {"kind": "begin", "id", "pid",
        "node", "t"} when it starts, and {"kind": "send", "id", "pid", "node",
        "account", "conv", "partition", "lease_owner", "fencing_token", "start",
        "end"} (times from ``time.time()``) when its sleep is over. The send returns
        {"node": node id, "pid": pid}, which the commit stores as the task's result.

    node_worker.py grab PATH --queue Q --count K [--poll-s P]
        Open one SQLiteStore and print {"event": "ready"}; then claim from Q every P
        seconds (no partitions, no ordering) until K tasks are held, taking the lock
        ``"account:<payload account>"`` of each as soon as it is claimed. Prints
        {"event": "claimed", "ids", "t": time.monotonic() of the claim that completed
        the set, "locks": [fencing tokens], "tasks": [{"id", "attempts", "last_error"}
        as claimed]}, releases everything and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from typing import Any

from asynccoord import Lease, SQLiteStore, Task
from asynccoord.node import NodeConfig, Runtime, current_delivery


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def account_lock(task: Task) -> str:
    return f"account:{task.payload['account']}"


async def drain(args: argparse.Namespace) -> None:
    pid = os.getpid()
    rng = random.Random(pid)
    log_fd = os.open(args.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def log(obj: dict[str, Any]) -> None:
        os.write(log_fd, (json.dumps(obj) + "\n").encode())

    async def send(task: Task) -> dict[str, Any]:
        delivery = current_delivery()
        start = time.time()
        log({"kind": "begin", "id": task.id, "pid": pid, "node": delivery.node_id, "t": start})
        await asyncio.sleep(rng.uniform(args.send_min_s, args.send_max_s))
        end = time.time()
        log(
            {
                "kind": "send",
                "id": task.id,
                "pid": pid,
                "node": delivery.node_id,
                "account": task.payload["account"],
                "conv": task.partition_key,
                "partition": task.partition,
                "lease_owner": task.lease_owner,
                "fencing_token": None if delivery.lock is None else delivery.lock.fencing_token,
                "start": start,
                "end": end,
            }
        )
        return {"node": delivery.node_id, "pid": pid}

    config = NodeConfig(
        queue=args.queue,
        lease_s=args.lease_s,
        claim_batch=args.claim_batch,
        max_in_flight=args.max_in_flight,
        lock_permits=args.lock_permits,
        lock_ttl_s=args.lock_ttl_s,
        idle_max_s=0.2,
    )
    async with SQLiteStore(args.path) as store:
        runtime = Runtime(
            store,
            send=send,
            nodes=args.nodes,
            config=config,
            lock_key=account_lock,
            heartbeat_ttl_s=args.heartbeat_ttl_s,
        )
        emit({"event": "ready", "pid": pid, "node_ids": [n.node_id for n in runtime.nodes]})
        if args.barrier:
            await asyncio.to_thread(sys.stdin.readline)

        async def watch() -> None:
            membership = runtime.membership
            version = -1
            while True:
                view = membership.view
                if view.version != version:
                    version = view.version
                    owned = sum(len(membership.owned_partitions(n.node_id)) for n in runtime.nodes)
                    emit(
                        {
                            "event": "view",
                            "version": version,
                            "node_ids": list(view.node_ids),
                            "owned": owned,
                            "t": time.monotonic(),
                        }
                    )
                await membership.wait_changed(version, timeout_s=1.0)

        async with runtime:
            watcher = asyncio.create_task(watch())
            drained = await runtime.wait_until_drained(timeout_s=300.0, poll_s=0.1)
            watcher.cancel()
            try:
                await watcher
            except asyncio.CancelledError:
                pass
        assert drained, "the queue did not drain in 300 s"
        states = runtime.states()
    os.close(log_fd)
    emit(
        {
            "event": "done",
            "committed": sum(s.committed for s in states),
            "sent": sum(s.sent for s in states),
            "conflicts": sum(s.conflicts for s in states),
            "handed_back": sum(s.handed_back for s in states),
            "events": dict(store.events.snapshot()),
        }
    )


async def grab(args: argparse.Namespace) -> None:
    async with SQLiteStore(args.path) as store:
        emit({"event": "ready"})
        held: list[Task] = []
        locks: list[Lease] = []
        while len(held) < args.count:
            tasks = await store.claim(args.queue, node_id=f"grab-{os.getpid()}", limit=args.count - len(held))
            for task in tasks:
                outcome = await store.try_acquire_lock(account_lock(task), ttl_s=10.0)
                assert isinstance(outcome, Lease), f"lock of task {task.id} still held: {outcome!r}"
                locks.append(outcome)
            held.extend(tasks)
            if len(held) < args.count:
                await asyncio.sleep(args.poll_s)
        claimed_at = time.monotonic()
        emit(
            {
                "event": "claimed",
                "ids": sorted(t.id for t in held),
                "t": claimed_at,
                "locks": [lease.fencing_token for lease in locks],
                "tasks": [
                    {"id": t.id, "attempts": t.attempts, "last_error": t.last_error}
                    for t in sorted(held, key=lambda t: t.id)
                ],
            }
        )
        for lease in locks:
            await store.release_lock(lease)
        for task in held:
            await store.release(task)


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("drain")
    p.add_argument("path")
    p.add_argument("--log", required=True)
    p.add_argument("--queue", default="outbox")
    p.add_argument("--nodes", type=int, default=16)
    p.add_argument("--max-in-flight", type=int, default=4)
    p.add_argument("--claim-batch", type=int, default=4)
    p.add_argument("--lease-s", type=float, default=30.0)
    p.add_argument("--heartbeat-ttl-s", type=float, default=5.0)
    p.add_argument("--send-min-s", type=float, default=0.0)
    p.add_argument("--send-max-s", type=float, default=0.002)
    p.add_argument("--lock-permits", type=int, default=1)
    p.add_argument("--lock-ttl-s", type=float, default=10.0)
    p.add_argument("--barrier", action="store_true")
    p = sub.add_parser("grab")
    p.add_argument("path")
    p.add_argument("--queue", default="outbox")
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--poll-s", type=float, default=0.01)
    args = parser.parse_args()
    asyncio.run(drain(args) if args.mode == "drain" else grab(args))


if __name__ == "__main__":
    main()
