"""Rate limits across processes: declared limits keep a chat to its rate, and a 429 is honoured.

The queue declares a per-account and a per-chat limit (GCRA, taken in the claim, on the store's
clock). Five messages of one chat go out at most one a second after a burst of three; the
provider answers one of them with HTTP 429, so ``send`` raises ``RateLimited``: the chat's
bucket pauses on every node for the Retry-After and the message goes back to pending, in its
place, using no attempt.

Exits 0 only if every message was sent once, in order, the refused one included. Run:
python examples/rate_limits.py
"""

from __future__ import annotations

import asyncio
import os
import tempfile

from asynccoord import NodeConfig, RateLimit, RateLimited, Runtime, SQLiteStore, Task

sent: list[int] = []
refused: set[int] = set()


async def send(task: Task) -> None:
    if task.payload["n"] == 3 and 3 not in refused:  # the provider said 429 once
        refused.add(3)
        raise RateLimited(retry_after_s=0.5, dimension="chat")
    sent.append(task.payload["n"])


async def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        async with SQLiteStore(os.path.join(folder, "limits.db")) as store:
            await store.set_rate_limits(
                "outbox",
                [
                    RateLimit(dimension="account", count=30, per_s=1.0, burst=30),
                    RateLimit(dimension="chat", count=1, per_s=1.0, burst=3),
                ],
            )
            for n in range(5):
                await store.enqueue(
                    "outbox",
                    {"n": n},
                    partition_key="chat-7",
                    idempotency_key=f"m{n}",
                    limit_keys={"account": "bot-1", "chat": "7"},
                )
            runtime = Runtime(store, send=send, nodes=2, config=NodeConfig(queue="outbox"))
            async with runtime:
                await runtime.wait_until_drained(timeout_s=30)
    assert sent == [0, 1, 2, 3, 4], sent  # in order, the refused one included
    print("every message sent once, in order, the 429 honoured: OK")


if __name__ == "__main__":
    asyncio.run(main())
