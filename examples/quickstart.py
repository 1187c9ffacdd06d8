"""The smallest real end-to-end use of asynccoord: a bot's outbox drained by 8 nodes.

A producer enqueues 2,000 outgoing messages over 200 conversations, keyed by
conversation and deduplicated by message id (half of them are enqueued twice, as an
at-least-once upstream would). Eight nodes claim batches under leases, "send" each
message, and commit with a compare-and-set. At the end every message must have been
sent exactly once: the script checks it and exits non-zero if not.

Run:  python examples/quickstart.py
"""

from __future__ import annotations

import asyncio
import os
import random
import tempfile
from collections import Counter

from asynccoord import NewTask, SQLiteStore

MESSAGES = 2_000
CONVERSATIONS = 200
NODES = 8


async def main() -> int:
    sent: Counter[str] = Counter()
    with tempfile.TemporaryDirectory() as folder:
        async with SQLiteStore(os.path.join(folder, "outbox.db")) as store:
            batch = [
                NewTask(
                    queue="outbox",
                    payload={"to": f"conv-{i % CONVERSATIONS}", "text": f"message {i}"},
                    partition_key=f"conv-{i % CONVERSATIONS}",
                    idempotency_key=f"msg-{i}",
                )
                for i in range(MESSAGES)
            ]
            results = await store.enqueue_many(batch)
            redelivered = await store.enqueue_many(batch[::2])  # the upstream retries half of them
            print(
                f"enqueued {sum(r.created for r in results)} messages, "
                f"{sum(not r.created for r in redelivered)} redeliveries suppressed"
            )

            async def node(node_id: str) -> None:
                while True:
                    tasks = await store.claim("outbox", node_id=node_id, limit=16, lease_s=30, ordered=True)
                    if not tasks:
                        return
                    for task in tasks:
                        await asyncio.sleep(random.uniform(0, 0.001))  # the network call
                        sent[task.idempotency_key or ""] += 1
                    await store.complete_many(tasks)

            await asyncio.gather(*(node(f"node-{n}") for n in range(NODES)))
            stats = await store.stats("outbox")
            print(f"status counts: { {s.value: n for s, n in stats.counts.items()} }")
            print(f"events: {dict(store.events.snapshot())}")

    duplicates = sum(1 for n in sent.values() if n > 1)
    lost = MESSAGES - len(sent)
    print(f"sent {len(sent)} distinct messages, duplicates={duplicates}, lost={lost}")
    return 0 if duplicates == 0 and lost == 0 else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
