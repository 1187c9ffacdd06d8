"""Per-account send limits: a ``Semaphore`` of N permits shared by many senders on several nodes.

A provider lets each bot account have at most 3 sends in flight. Two "nodes" (two store
objects on one SQLite file, each with its own connection, as two processes would have)
run 72 concurrent senders over 3 accounts; every send holds a permit of
``Semaphore(store, "account:<id>", 3)`` while it runs. The script measures the peak number
of sends in flight per account (in the senders, and in the store's own lease table) and
exits non-zero if it ever exceeds 3.

Run:  python examples/account_semaphore.py
"""

from __future__ import annotations

import asyncio
import os
import random
import tempfile
from collections import Counter

from asynccoord import Semaphore, SQLiteStore

PERMITS = 3
ACCOUNTS = ("bot-a", "bot-b", "bot-c")
SENDS_PER_ACCOUNT = 24


class Gauge:
    """Sends in flight per account, and the peak of each."""

    def __init__(self) -> None:
        self.now: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self.done: Counter[str] = Counter()


async def sender(store: SQLiteStore, node: str, account: str, gauge: Gauge) -> None:
    async with Semaphore(store, f"account:{account}", PERMITS, ttl_s=10.0, timeout_s=30.0, holder=node):
        gauge.now[account] += 1
        gauge.peak[account] = max(gauge.peak[account], gauge.now[account])
        try:
            await asyncio.sleep(random.uniform(0.01, 0.04))  # the provider call
        finally:
            gauge.now[account] -= 1
            gauge.done[account] += 1


async def watch_leases(store: SQLiteStore, seen: Counter[str], stop: asyncio.Event) -> None:
    """Sample the store's live leases: the limit as every process sees it."""
    while not stop.is_set():
        live = Counter(info.name for info in await store.list_locks())
        for name, count in live.items():
            seen[name] = max(seen[name], count)
        await asyncio.sleep(0.005)


async def main() -> int:
    gauge, seen, stop = Gauge(), Counter[str](), asyncio.Event()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "accounts.db")
        async with SQLiteStore(path) as node_1, SQLiteStore(path) as node_2:
            watcher = asyncio.create_task(watch_leases(node_1, seen, stop))
            senders = [
                sender(store, name, account, gauge)
                for account in ACCOUNTS
                for _ in range(SENDS_PER_ACCOUNT // 2)
                for store, name in ((node_1, "node-1"), (node_2, "node-2"))
            ]
            random.shuffle(senders)
            await asyncio.gather(*senders)
            stop.set()
            await watcher
            contended = node_1.events.get("lock_contended") + node_2.events.get("lock_contended")

    for account in ACCOUNTS:
        print(
            f"{account}: {gauge.done[account]} sends, peak in flight {gauge.peak[account]} (limit {PERMITS}), "
            f"peak live leases in the store {seen[f'account:{account}']}"
        )
    print(f"waits for a permit (lock_contended): {contended}")
    ok = all(
        gauge.done[a] == SENDS_PER_ACCOUNT and 1 <= gauge.peak[a] <= PERMITS and seen[f"account:{a}"] <= PERMITS
        for a in ACCOUNTS
    )
    print(f"no account ever had more than {PERMITS} sends in flight: {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
