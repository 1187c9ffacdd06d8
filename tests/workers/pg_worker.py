"""A real OS process hosting a Runtime on PostgreSQL, for tests/multiprocess/test_postgres_multiprocess.py.

Every message to the parent is one JSON object on one stdout line. Any unexpected
exception escapes (non-zero exit, traceback on stderr), so it fails the test.

Usage::

    pg_worker.py DSN SCHEMA --log LOG [--queue Q] [--nodes N] [--max-in-flight M]
                 [--lease-s L] [--send-s S] [--redis URL --redis-prefix P] [--barrier]

Opens one PostgresStore (server clock) on SCHEMA, and, with ``--redis``, a
RedisLockStore for the locks; hosts a Runtime of N nodes whose lock key is
``"account:<payload account>"``. Prints {"event": "ready", "pid"}; with --barrier,
waits for one line on stdin first. Each send sleeps S seconds and appends one JSON
line {"id", "pid", "node", "token"} to LOG with one ``os.write`` (O_APPEND: never torn,
nothing lost when the process is killed) *before* returning; the result stored by the
commit is {"pid", "node"}. Once the queue has nothing pending or running it prints
{"event": "done", "committed", "conflicts", "retries": store retries}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

from asynccoord import Task
from asynccoord.backends.postgres.store import STORE_RETRIES, PostgresStore
from asynccoord.node import NodeConfig, Runtime, current_delivery


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def account_lock(task: Task) -> str:
    return f"account:{task.payload['account']}"


async def main(args: argparse.Namespace) -> None:
    pid = os.getpid()
    log_fd = os.open(args.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    async def send(task: Task) -> dict[str, Any]:
        delivery = current_delivery()
        await asyncio.sleep(args.send_s)
        token = None if delivery.lock is None else delivery.lock.fencing_token
        line = {"id": task.id, "pid": pid, "node": delivery.node_id, "token": token}
        os.write(log_fd, (json.dumps(line) + "\n").encode())
        return {"pid": pid, "node": delivery.node_id}

    config = NodeConfig(
        queue=args.queue,
        lease_s=args.lease_s,
        max_in_flight=args.max_in_flight,
        claim_batch=args.max_in_flight,
        lock_ttl_s=args.lease_s,
        idle_max_s=0.2,
    )
    async with PostgresStore(args.dsn, schema=args.schema, pool_max_size=args.pool) as store:
        lock_store: Any = None
        if args.redis:
            from asynccoord.backends.redis import RedisLockStore

            lock_store = RedisLockStore(args.redis, prefix=args.redis_prefix)
            await lock_store.open()
        try:
            runtime = Runtime(
                store,
                send=send,
                nodes=args.nodes,
                config=config,
                lock_key=account_lock,
                heartbeat_ttl_s=3.0,
                lock_store=lock_store,
            )
            emit({"event": "ready", "pid": pid})
            if args.barrier:
                await asyncio.to_thread(sys.stdin.readline)
            async with runtime:
                drained = await runtime.wait_until_drained(timeout_s=300.0, poll_s=0.1)
            assert drained, "the queue did not drain in 300 s"
            states = runtime.states()
        finally:
            if lock_store is not None:
                await lock_store.close()
    os.close(log_fd)
    emit(
        {
            "event": "done",
            "committed": sum(s.committed for s in states),
            "conflicts": sum(s.conflicts for s in states),
            "retries": store.events.get(STORE_RETRIES),
        }
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("schema")
    parser.add_argument("--log", required=True)
    parser.add_argument("--queue", default="outbox")
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--max-in-flight", type=int, default=8)
    parser.add_argument("--lease-s", type=float, default=10.0)
    parser.add_argument("--send-s", type=float, default=0.0)
    parser.add_argument("--pool", type=int, default=10)
    parser.add_argument("--redis", default="")
    parser.add_argument("--redis-prefix", default="asynccoord:")
    parser.add_argument("--barrier", action="store_true")
    asyncio.run(main(parser.parse_args()))
