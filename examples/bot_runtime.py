"""Embedding the runtime in an async chat bot: inbound handler -> outbox -> Runtime -> messenger.

The inbound handler enqueues one reply per chat message (6 conversations) keyed by conversation and
deduplicated by the inbound message id (messages the platform delivers twice are suppressed). A Runtime
of 4 nodes sends them through a fake messaging client that, like a real provider, honours idempotency
keys and refuses outdated fencing tokens; each bot account sends one message at a time (``lock_key``);
then a graceful shutdown. Exits 0 only if every reply was sent once, in per-conversation order, and no
account ever sent two at once.  Run:  python examples/bot_runtime.py
"""

from __future__ import annotations

import asyncio
import os
import random
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass

from asynccoord import NodeConfig, Runtime, SQLiteStore, Task, current_delivery

CHATS = 6
MESSAGES_PER_CHAT = 10


@dataclass(frozen=True, slots=True)
class Inbound:  # a chat message received from the platform (a webhook call)
    id: str
    chat: str
    text: str


class FakeMessenger:
    """A chat provider's client: dedups by idempotency key and fences each account's sends."""

    def __init__(self) -> None:
        self.shown: defaultdict[str, list[str]] = defaultdict(list)  # chat -> texts the user saw, in order
        self.message_ids: dict[str, str] = {}  # idempotency key -> provider message id
        self.fences: dict[str, int] = {}  # account -> highest fencing token seen
        self.sending: Counter[str] = Counter()  # account -> sends in progress
        self.overlaps = self.calls = 0

    async def send_message(
        self, account: str, chat: str, text: str, *, idempotency_key: str, fencing_token: int
    ) -> str:
        self.calls += 1
        if fencing_token < self.fences.get(account, 0):
            raise PermissionError(f"{account}: fencing token {fencing_token} < {self.fences[account]}")
        self.fences[account] = fencing_token
        if idempotency_key in self.message_ids:  # a repeat: answered, not shown again
            return self.message_ids[idempotency_key]
        message_id = self.message_ids[idempotency_key] = f"m{len(self.message_ids) + 1}"
        self.sending[account] += 1
        self.overlaps += self.sending[account] > 1
        try:
            await asyncio.sleep(random.uniform(0.002, 0.008))  # network latency
            self.shown[chat].append(text)
        finally:
            self.sending[account] -= 1
        return message_id


def account_lock(task: Task) -> str:
    return f"account:{task.payload['account']}"  # one send at a time per bot account, across all nodes


async def main() -> int:
    messenger = FakeMessenger()
    rng, enqueued, suppressed = random.Random(7), 0, 0

    async def send(task: Task) -> str:  # called by a node once per delivery attempt
        lease = current_delivery().lock  # the account lock's lease (lock_key names one for every task)
        token = lease.fencing_token if lease is not None else 0
        p, key = task.payload, task.idempotency_key or ""
        return await messenger.send_message(
            p["account"], p["chat"], p["text"], idempotency_key=key, fencing_token=token
        )

    async def on_message(store: SQLiteStore, message: Inbound) -> None:  # the bot's inbound handler
        nonlocal enqueued, suppressed
        account = f"bot-{int(message.chat.split('-')[1]) % 2}"  # 3 conversations per bot account
        reply = {"chat": message.chat, "text": f"re: {message.text}", "account": account}
        result = await store.enqueue("outbox", reply, partition_key=message.chat, idempotency_key=f"reply-{message.id}")
        enqueued += result.created
        suppressed += not result.created

    with tempfile.TemporaryDirectory() as folder:
        async with SQLiteStore(os.path.join(folder, "bot.db")) as store:
            config = NodeConfig(queue="outbox", lease_s=10, lock_ttl_s=5, send_timeout_s=5)
            async with Runtime(store, send=send, nodes=4, config=config, lock_key=account_lock) as runtime:
                history: list[Inbound] = []
                for seq in range(MESSAGES_PER_CHAT):
                    for c in range(CHATS):
                        history.append(Inbound(id=f"in-{c}-{seq}", chat=f"chat-{c}", text=f"hello {seq}"))
                        await on_message(store, history[-1])
                    if rng.random() < 0.6:  # the platform redelivers an earlier message
                        await on_message(store, rng.choice(history))
                    await asyncio.sleep(0.01)
                drained = await runtime.wait_until_drained(timeout_s=20)
                stopping = time.monotonic()
            # leaving `async with` stopped the nodes (sends finish, the rest is handed back), left the membership
            print(f"runtime shut down in {time.monotonic() - stopping:.3f} s")
            stats = await store.stats("outbox")

    print(f"inbound: {enqueued} replies enqueued, {suppressed} redelivered messages suppressed")
    for s in runtime.states():
        print(f"  node {s.node_id}: claimed {s.claimed}, committed {s.committed}, conflicts {s.conflicts}")
    print(f"outbox: { {k.value: v for k, v in stats.counts.items()} } (drained={drained})")
    m = messenger
    print(f"messenger: {m.calls} send calls, {len(m.message_ids)} distinct replies, account overlaps {m.overlaps}")
    print(f"messenger: highest fencing token seen per account {m.fences}")
    expected = [f"re: hello {n}" for n in range(MESSAGES_PER_CHAT)]
    in_order = all(messenger.shown[f"chat-{c}"] == expected for c in range(CHATS))
    ok = drained and enqueued == CHATS * MESSAGES_PER_CHAT == sum(map(len, messenger.shown.values()))
    ok = ok and in_order and messenger.overlaps == 0
    print(f"every reply sent once and in per-conversation order: {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
