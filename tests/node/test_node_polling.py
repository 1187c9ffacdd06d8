"""How often a node claims: a short claim waits for a wake-up, and a wake-up sent during a claim is not lost.

Every claim is a write (SQLite's single writer, PostgreSQL's row locks), so claims that
come back empty slow down the claims and commits that matter. Stores come from the
``make_store`` fixture with ``clock=None`` (real time).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

from asynccoord import NewTask, RetryPolicy, Task, TaskStatus, owner_of, partition_of
from asynccoord.node import Node, NodeConfig, Runtime

QUEUE = "q"


def count_claims(store: Any) -> list[tuple[float, int]]:
    """Record ``(time.monotonic(), tasks returned)`` of every ``store.claim`` (nodes call it through the instance)."""
    calls: list[tuple[float, int]] = []
    original = store.claim

    async def counted(*args: Any, **kwargs: Any) -> Any:
        tasks = await original(*args, **kwargs)
        calls.append((time.monotonic(), len(tasks)))
        return tasks

    store.claim = counted
    return calls


async def wait_for(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.002)


async def test_a_short_claim_waits_instead_of_claiming_again_at_once(make_store: Any) -> None:
    store = await make_store(clock=None)
    claims = count_claims(store)
    sent: list[int] = []

    async def send(task: Task) -> None:
        sent.append(task.id)
        await asyncio.sleep(0.5)

    await store.enqueue_many([NewTask(queue=QUEUE, payload=i, partition_key=f"k{i}") for i in range(2)])
    # batches of 4, a backoff of a whole second: a claim within it comes from a wake-up
    config = NodeConfig(queue=QUEUE, claim_batch=4, max_in_flight=4, idle_min_s=1.0, idle_max_s=1.0)
    node = Node(store, send, node_id="n", config=config)
    run = asyncio.create_task(node.run())
    await wait_for(lambda: len(sent) == 2, 2.0, "both sends")
    await asyncio.sleep(0.3)  # the sends still run: nothing was committed, nothing woke the node
    assert [n for _, n in claims] == [2]  # one short claim, no empty one right after it
    node.stop_claiming()
    await asyncio.wait_for(run, 5.0)


async def test_a_full_claim_claims_again_at_once(make_store: Any) -> None:
    store = await make_store(clock=None)
    claims = count_claims(store)

    async def send(task: Task) -> None:
        await asyncio.sleep(0.5)

    await store.enqueue_many([NewTask(queue=QUEUE, payload=i, partition_key=f"k{i}") for i in range(6)])
    config = NodeConfig(queue=QUEUE, claim_batch=2, max_in_flight=8, idle_min_s=1.0, idle_max_s=1.0)
    node = Node(store, send, node_id="n", config=config)
    run = asyncio.create_task(node.run())
    await wait_for(lambda: len(claims) >= 4, 0.5, "a claim after each full batch")
    assert [n for _, n in claims] == [2, 2, 2, 0]
    node.stop_claiming()
    await asyncio.wait_for(run, 5.0)


async def test_work_announced_while_a_claim_runs_is_claimed_without_waiting_for_the_backoff(make_store: Any) -> None:
    store = await make_store(clock=None)
    original = store.claim
    announced = asyncio.Event()
    sent: dict[int, float] = {}

    async def claim_then_enqueue(*args: Any, **kwargs: Any) -> Any:
        tasks = await original(*args, **kwargs)  # finds nothing...
        if not announced.is_set():  # ...and the work arrives (and is notified) before it returns
            announced.set()
            await store.enqueue(QUEUE, "late", partition_key="k")
        return tasks

    store.claim = claim_then_enqueue

    async def send(task: Task) -> None:
        sent[task.id] = time.monotonic()

    config = NodeConfig(queue=QUEUE, idle_min_s=1.0, idle_max_s=1.0)  # polls once a second
    node = Node(store, send, node_id="n", config=config)
    began = time.monotonic()
    run = asyncio.create_task(node.run())
    await wait_for(lambda: bool(sent), 3.0, "the late task's send")
    assert min(sent.values()) - began < 0.5  # the wake-up sent during the claim was kept
    node.stop_claiming()
    await asyncio.wait_for(run, 5.0)


async def test_a_task_handed_back_with_a_delay_is_claimed_when_due_not_after_the_backoff(make_store: Any) -> None:
    store = await make_store(clock=None)
    sends: list[float] = []
    failed = False

    async def send(task: Task) -> None:
        nonlocal failed
        sends.append(time.monotonic())
        if not failed:
            failed = True
            raise RuntimeError("try again in 0.2 s")

    retry = RetryPolicy(base_s=0.2, jitter=0.0)
    config = NodeConfig(queue=QUEUE, idle_min_s=2.0, idle_max_s=2.0, retry=retry)  # polls every 2 s
    node = Node(store, send, node_id="n", config=config)
    run = asyncio.create_task(node.run())
    await store.enqueue(QUEUE, "x", partition_key="k")
    await wait_for(lambda: len(sends) == 2, 3.0, "the retry")
    assert 0.15 <= sends[1] - sends[0] < 1.0, sends[1] - sends[0]
    node.stop_claiming()
    await asyncio.wait_for(run, 5.0)


async def test_the_owner_of_a_hot_conversation_claims_about_once_per_step(make_store: Any) -> None:
    """64 nodes drain a hot conversation (one task after another): its owner is woken by each commit."""
    store = await make_store(clock=None)
    original = store.claim
    claims: Counter[str] = Counter()
    empty: Counter[str] = Counter()

    async def counted(*args: Any, **kwargs: Any) -> Any:
        tasks = await original(*args, **kwargs)
        claims[kwargs["node_id"]] += 1
        empty[kwargs["node_id"]] += not tasks
        return tasks

    store.claim = counted

    async def send(task: Task) -> None:
        await asyncio.sleep(0.001)

    steps = 150
    specs = [NewTask(queue=QUEUE, payload=i, partition_key="hot" if i % 2 else f"c{i}") for i in range(2 * steps)]
    await store.enqueue_many(specs)
    config = NodeConfig(queue=QUEUE, claim_batch=16, max_in_flight=16, idle_min_s=0.01, idle_max_s=0.5)
    node_ids = [f"n{i}" for i in range(64)]
    async with Runtime(store, send=send, node_ids=node_ids, config=config, heartbeat_ttl_s=3.0) as runtime:
        began = time.monotonic()
        assert await runtime.wait_until_drained(timeout_s=30.0, poll_s=0.01)
        drain_s = time.monotonic() - began
    assert (await store.stats(QUEUE)).counts[TaskStatus.DONE] == 2 * steps
    owner = owner_of(partition_of("hot", store.partitions), node_ids)
    # One claim per step, plus its idle polls (backing off from 10 ms to 0.5 s); re-claiming
    # at once after each short claim would add an empty claim per step (~2 x steps).
    assert claims[owner] <= steps + 10 + drain_s / 0.25, (claims[owner], empty[owner], drain_s)
    # every other node: its idle polls only
    others = [n for n in node_ids if n != owner]
    assert max(empty[n] for n in others) <= 10 + drain_s / 0.25, (empty, drain_s)


async def test_every_task_put_back_with_a_delay_wakes_its_node_when_due(make_store: Any) -> None:
    """Two retries due at different times: each is re-sent when due, not only the earliest."""
    store = await make_store(clock=None)
    start = time.monotonic()
    sends: dict[str, list[float]] = {}

    async def send(task: Task) -> None:
        sends.setdefault(task.payload, []).append(time.monotonic() - start)
        if len(sends[task.payload]) == 1:
            if task.payload == "y":
                await asyncio.sleep(0.2)
            raise RuntimeError("fails once")

    await store.enqueue_many([NewTask(queue=QUEUE, payload=p, partition_key=p) for p in ("x", "y")])
    retry = RetryPolicy(base_s=0.3, jitter=0.0)  # x due at ~0.3 s, y (failing at ~0.2 s) at ~0.5 s
    config = NodeConfig(queue=QUEUE, idle_min_s=3.0, idle_max_s=3.0, retry=retry)
    node = Node(store, send, node_id="n", config=config)
    run = asyncio.create_task(node.run())
    await wait_for(lambda: all(len(sends.get(p, [])) == 2 for p in ("x", "y")), 2.5, "both second attempts")
    assert sends["x"][1] < 1.0
    assert sends["y"][1] < 1.2  # not the 3 s backoff
    node.stop_claiming()
    await asyncio.wait_for(run, 5)


async def test_the_next_task_behind_a_settled_duplicate_is_claimed_at_once(make_store: Any) -> None:
    """A claim that settles a redelivered (already processed) message wakes the owner of the key's next task."""
    store = await make_store(clock=None)
    await store.enqueue(QUEUE, "first", partition_key="k", idempotency_key="m1")
    [first] = await store.claim(QUEUE, node_id="x", ordered=True)
    await store.complete(first)
    await store.purge_finished(QUEUE, older_than_s=0.0)  # the task is gone, its processed id is kept
    await store.enqueue_many(
        [
            NewTask(queue=QUEUE, payload="redelivered", partition_key="k", idempotency_key="m1"),
            NewTask(queue=QUEUE, payload="next", partition_key="k"),
        ]
    )
    start = time.monotonic()
    sent: dict[str, float] = {}

    async def send(task: Task) -> None:
        sent[task.payload] = time.monotonic() - start

    config = NodeConfig(queue=QUEUE, idle_min_s=3.0, idle_max_s=3.0)
    node = Node(store, send, node_id="n", config=config)
    run = asyncio.create_task(node.run())
    await wait_for(lambda: "next" in sent, 2.5, "the task behind the duplicate")
    assert "redelivered" not in sent
    assert sent["next"] < 1.0  # not the 3 s backoff
    node.stop_claiming()
    await asyncio.wait_for(run, 5)
