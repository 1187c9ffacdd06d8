"""A real OS process holding one member on a shared SQLite file, for the membership tests.

Every message to the parent is one JSON object on one stdout line. Any exception
escapes (non-zero exit, traceback on stderr).

Usage::

    member_worker.py PATH NODE_ID [--ttl-s T] [--interval-s I]

Opens one SQLiteStore (real database clock), enters a Membership and joins NODE_ID.
Prints {"event": "ready", "node_id", "incarnation", "pid"}, then on every view change
(including the first view) {"event": "view", "version", "members": {node_id:
incarnation}, "lost": the store's node_lost count, "t": time.monotonic()}
(CLOCK_MONOTONIC is system-wide on Linux, so the parent can compare ``t`` with its own).
A line "exit" on stdin, or stdin closing, makes it leave and exit 0 after printing
{"event": "left"}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

from asynccoord import SQLiteStore
from asynccoord import events as ev
from asynccoord.membership import Membership, MembershipView


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def emit_view(view: MembershipView, store: SQLiteStore) -> None:
    emit(
        {
            "event": "view",
            "version": view.version,
            "members": {m.node_id: m.incarnation for m in view.members},
            "lost": store.events.get(ev.NODE_LOST),
            "t": time.monotonic(),
        }
    )


async def watch(membership: Membership, store: SQLiteStore) -> None:
    version = membership.view.version
    emit_view(membership.view, store)
    while True:
        view = await membership.wait_changed(version)
        if view.version > version:
            version = view.version
            emit_view(view, store)


async def main(args: argparse.Namespace) -> None:
    async with (
        SQLiteStore(args.path) as store,
        Membership(store, ttl_s=args.ttl_s, interval_s=args.interval_s) as membership,
    ):
        incarnation = membership.join(args.node_id, info={"pid": os.getpid()})
        await membership.wait_changed(membership.view.version, timeout_s=args.ttl_s)
        emit({"event": "ready", "node_id": args.node_id, "incarnation": incarnation, "pid": os.getpid()})
        watcher = asyncio.create_task(watch(membership, store))
        while (await asyncio.to_thread(sys.stdin.readline)).strip() not in ("exit", ""):
            pass
        watcher.cancel()
        try:
            await watcher
        except asyncio.CancelledError:
            pass
    emit({"event": "left"})


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("path")
    parser.add_argument("node_id")
    parser.add_argument("--ttl-s", type=float, default=1.0)
    parser.add_argument("--interval-s", type=float, default=0.2)
    asyncio.run(main(parser.parse_args()))
