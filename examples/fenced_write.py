"""Fencing tokens: a holder that stalled past its lease cannot overwrite the next holder's write.

Holder A takes ``Lock(store, "ledger:acct-42", ttl_s=0.5)`` (an explicit TTL and no renewal),
writes the resource with ``store.fenced_write``, then stalls (a GC pause, a swapped-out process,
a blocked event loop). Its lease lapses; holder B acquires the lock with a higher fencing token
and writes. When A wakes up it still believes it holds the lock, but its late
write is refused with ``FencingTokenRejectedError`` and the resource keeps B's data.

Exits 0 only if that is what happened. Run:  python examples/fenced_write.py
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time

from asynccoord import FencingTokenRejectedError, Lock, LockNotHeldError, SQLiteStore

RESOURCE = "ledger:acct-42"


async def holder_a(store: SQLiteStore, a_wrote: asyncio.Event, b_wrote: asyncio.Event) -> bool:
    """Returns whether A's late write was refused."""
    lock = Lock(store, RESOURCE, ttl_s=0.5, holder="A")  # explicit TTL: no watchdog renewal
    lease = await lock.acquire()
    await store.fenced_write(RESOURCE, lease.fencing_token, {"balance": 100, "by": "A"})
    print(f"A: acquired fencing token {lease.fencing_token}, wrote balance=100, then stalls")
    a_wrote.set()
    stalled = time.monotonic()
    await b_wrote.wait()  # the stall: it outlasts A's 0.5 s lease, and B acquires and writes meanwhile
    print(f"A: wakes up after {time.monotonic() - stalled:.2f} s; its handle still says held={lock.held}")
    refused = False
    try:
        await store.fenced_write(RESOURCE, lease.fencing_token, {"balance": 0, "by": "A (late)"})
        print("A: late write accepted (this must not happen)")
    except FencingTokenRejectedError as exc:
        refused = True
        print(f"A: late write refused: {exc}")
    try:
        await lock.release()
    except LockNotHeldError as exc:
        print(f"A: release refused too: {exc}")
    return refused


async def holder_b(store: SQLiteStore, a_wrote: asyncio.Event, b_wrote: asyncio.Event) -> int:
    """Returns B's fencing token."""
    await a_wrote.wait()  # A goes first
    lock = Lock(store, RESOURCE, ttl_s=5.0, holder="B")
    lease = await lock.acquire(timeout_s=3.0)  # waits until A's lease lapses (store clock)
    record = await store.fenced_write(RESOURCE, lease.fencing_token, {"balance": 250, "by": "B"})
    print(f"B: acquired fencing token {lease.fencing_token} after A's lease lapsed, wrote {record.data}")
    b_wrote.set()
    await lock.release()
    return lease.fencing_token


async def main() -> int:
    with tempfile.TemporaryDirectory() as folder:
        async with SQLiteStore(os.path.join(folder, "ledger.db")) as store:
            a_wrote, b_wrote = asyncio.Event(), asyncio.Event()
            a_refused, b_token = await asyncio.gather(
                holder_a(store, a_wrote, b_wrote), holder_b(store, a_wrote, b_wrote)
            )
            final = await store.read_fence(RESOURCE)
            rejected = store.events.get("fencing_rejected")
    print(f"resource: {final}")
    print(f"fencing_rejected events: {rejected}")
    ok = (
        final is not None
        and final.data == {"balance": 250, "by": "B"}
        and final.fencing_token == b_token
        and a_refused
        and rejected == 1
    )
    print(f"the stale holder's write was refused, the resource keeps B's data: {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
