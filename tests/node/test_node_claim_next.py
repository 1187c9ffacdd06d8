"""Commit-and-continue in the node (``NodeConfig.claim_next``): a commit leases the key's next task.

Real nodes on every backend of the ``make_store`` fixture, with the real clock.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest
from support import wait_until

from asynccoord import InvalidArgumentError, InvalidTypeError, NewTask, Task, TaskStatus
from asynccoord.node import Node, NodeConfig, NodeStatus

QUEUE = "q"
FAST_IDLE = {"idle_min_s": 0.01, "idle_max_s": 0.05}


def start(node: Node) -> asyncio.Task[None]:
    return asyncio.create_task(node.run(), name=f"test-run-{node.node_id}")


async def enqueue(store: Any, convs: list[str]) -> list[int]:
    results = await store.enqueue_many(
        [NewTask(queue=QUEUE, payload=i, partition_key=c, idempotency_key=f"m{i}") for i, c in enumerate(convs)]
    )
    return [r.task.id for r in results]


async def drain(store: Any, config: NodeConfig, convs: list[str]) -> tuple[list[str], Node]:
    """Run one node over ``convs`` (one task each, in this order) until all are done; return the send order."""
    await enqueue(store, convs)
    order: list[str] = []

    async def send(task: Task) -> None:
        order.append(task.partition_key)

    node = Node(store, send, node_id="n1", config=config)
    run = start(node)

    async def drained() -> bool:
        return (await store.stats(QUEUE)).counts[TaskStatus.DONE] == len(convs)

    await wait_until(drained, 10.0, "every task to be done")
    node.stop_claiming()
    await asyncio.wait_for(run, 5.0)
    return order, node


@pytest.mark.parametrize(
    ("claim_next", "claim_next_max", "expected"),
    [
        # one slot, one task per claim: claims take the queue's heads in FIFO order...
        (False, 64, ["c1", "c2", "c1", "c1", "c1"]),
        # ...a commit leases the key's next task, sent next in the same slot...
        (True, 64, ["c1", "c1", "c1", "c1", "c2"]),
        # ...at most claim_next_max in a row, then the slot claims again (FIFO: c2 first).
        (True, 1, ["c1", "c1", "c2", "c1", "c1"]),
    ],
)
async def test_a_commit_leases_the_keys_next_task_up_to_claim_next_max(
    make_store: Any, claim_next: bool, claim_next_max: int, expected: list[str]
) -> None:
    store = await make_store(clock=None)
    config = NodeConfig(
        queue=QUEUE,
        max_in_flight=1,
        claim_batch=1,
        claim_next=claim_next,
        claim_next_max=claim_next_max,
        **FAST_IDLE,
    )
    claims_before = store.events.get("claims")
    order, node = await drain(store, config, ["c1", "c2", "c1", "c1", "c1"])
    assert order == expected
    state = node.state()
    continued = {(False, 64): 0, (True, 64): 3, (True, 1): 2}[(claim_next, claim_next_max)]
    assert (state.claimed, state.continued, state.committed, state.sent) == (5, continued, 5, 5)
    assert store.events.get("claims") - claims_before == 5  # leases by claims and by commits alike


async def test_a_conversation_goes_on_past_claim_next_max_while_a_slot_is_free(make_store: Any) -> None:
    """claim_next_max frees a slot for the others' work: with one slot free, nobody waits for it.

    Two slots, one conversation: the chain keeps one slot, the other stays free, so every
    commit leases the next task (a break would cost a plain commit and a claim per task
    past the bound). The fetch loop idles 5 s between claims, so no claim of its own
    holds the free slot while a commit decides.
    """
    store = await make_store(clock=None)
    config = NodeConfig(
        queue=QUEUE,
        max_in_flight=2,
        claim_batch=2,
        claim_next_max=1,
        idle_min_s=5.0,
        idle_max_s=5.0,
    )
    order, node = await drain(store, config, ["c1"] * 6)
    assert order == ["c1"] * 6
    state = node.state()
    assert (state.claimed, state.continued, state.committed) == (6, 5, 6)


async def test_many_nodes_keep_per_key_order_and_commit_each_task_once(make_store: Any) -> None:
    store = await make_store(clock=None)
    convs = [f"c{i % 7 if i % 3 else 0}" for i in range(120)]  # c0 is hot
    ids = await enqueue(store, convs)
    sent: dict[str, list[int]] = defaultdict(list)
    sends: list[int] = []

    async def send(task: Task) -> None:
        sends.append(task.id)
        sent[task.partition_key].append(task.id)
        await asyncio.sleep(0.001)

    nodes = [
        Node(store, send, node_id=f"n{i}", config=NodeConfig(queue=QUEUE, claim_batch=4, max_in_flight=4, **FAST_IDLE))
        for i in range(4)
    ]
    runs = [start(n) for n in nodes]

    async def drained() -> bool:
        return (await store.stats(QUEUE)).counts[TaskStatus.DONE] == len(ids)

    await wait_until(drained, 20.0, "every task to be done")
    for n in nodes:
        n.stop_claiming()
    await asyncio.wait_for(asyncio.gather(*runs), 5.0)
    assert sorted(sends) == ids  # each task sent exactly once
    for key, got in sent.items():
        assert got == sorted(got), key  # per-key order
    assert sum(n.state().continued for n in nodes) > 0
    for task_id in ids:
        task = await store.get(task_id)
        assert (task.status, task.attempts, task.version) == (TaskStatus.DONE, 1, 2)


async def test_after_stop_claiming_a_commit_leases_nothing(make_store: Any) -> None:
    store = await make_store(clock=None)
    first, second = await enqueue(store, ["c1", "c1"])
    release = asyncio.Event()
    started = asyncio.Event()

    async def send(task: Task) -> None:
        started.set()
        await release.wait()

    node = Node(store, send, node_id="n1", config=NodeConfig(queue=QUEUE, **FAST_IDLE))
    run = start(node)
    await asyncio.wait_for(started.wait(), 5.0)
    node.stop_claiming()  # shutdown: the send in flight finishes, nothing new is taken
    release.set()
    await asyncio.wait_for(run, 5.0)
    assert (await store.get(first)).status is TaskStatus.DONE
    after = await store.get(second)
    assert (after.status, after.attempts, after.lease_owner) == (TaskStatus.PENDING, 0, None)
    assert node.state().continued == 0


async def test_a_cancelled_node_hands_back_a_continued_task_unfailed(make_store: Any) -> None:
    store = await make_store(clock=None)
    first, second = await enqueue(store, ["c1", "c1"])
    second_started = asyncio.Event()

    async def send(task: Task) -> None:
        if task.id == second:
            second_started.set()
            await asyncio.Event().wait()

    node = Node(store, send, node_id="n1", config=NodeConfig(queue=QUEUE, lock_ttl_s=10.0, **FAST_IDLE))
    run = start(node)
    await asyncio.wait_for(second_started.wait(), 5.0)
    assert node.state().continued == 1  # the second task came with the first one's commit
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert node.state().status is NodeStatus.STOPPED
    assert (await store.get(first)).status is TaskStatus.DONE
    after = await store.get(second)
    # handed back at once, not failed: its cut send's attempt counted (it may have gone out), no error, no lease
    assert (after.status, after.attempts, after.last_error, after.lease_owner) == (TaskStatus.PENDING, 1, None, None)
    assert store.events.get("retries") == 0


async def run_stopped_during(store: Any, method: str, stop_when: Callable[[list[int]], bool]) -> tuple[Node, list[int]]:
    """Run a node until it stops; ``stop_claiming()`` comes while ``store.<method>`` is at the store.

    The stop is requested from inside the call (before the real one runs) the first time
    ``stop_when(sent ids so far)`` holds. Returns the node and the ids it sent.
    """
    sent: list[int] = []
    node: Node | None = None
    real = getattr(store, method)

    async def stop_then_call(*args: Any, **kwargs: Any) -> Any:
        if node is not None and node.claiming and stop_when(sent):
            node.stop_claiming()
        return await real(*args, **kwargs)

    setattr(store, method, stop_then_call)

    async def send(task: Task) -> None:
        sent.append(task.id)

    node = Node(store, send, node_id="n1", config=NodeConfig(queue=QUEUE, **FAST_IDLE))
    await asyncio.wait_for(node.run(), 5.0)
    return node, sent


async def test_a_stop_during_the_commit_hands_the_leased_task_back_unsent(make_store: Any) -> None:
    store = await make_store(clock=None)
    ids = await enqueue(store, ["k"] * 5)
    # the stop arrives while the commit of task 2 (which leases task 3) is at the store
    node, sent = await run_stopped_during(store, "complete_and_claim_next", lambda sent: len(sent) == 2)
    assert sent == ids[:2]
    third = await store.get(ids[2])
    assert (third.status, third.attempts, third.lease_owner, third.last_error) == (TaskStatus.PENDING, 0, None, None)
    # Handed back once by the commit's continuation; once more if the claim loop's poll was at
    # the store when the stop came and took the task again (then handed back, not sent, too).
    assert node.state().continued == 2
    assert node.state().handed_back in (1, 2)


async def test_a_cancellation_during_the_hand_back_of_a_leased_task_does_not_cut_it(make_store: Any) -> None:
    """A stop comes while a commit leases the key's next task, so the slot hands it back
    unsent; the node is cancelled while that release is at the store (slowed to 0.3 s, a
    busy store). The release still lands: the task is pending at once, not leased to a
    stopped node until its lease (30 s) lapses."""
    store = await make_store(clock=None)
    first, second = await enqueue(store, ["k", "k"])
    node: Node | None = None
    real_continue, real_release = store.complete_and_claim_next, store.release
    releasing = asyncio.Event()

    async def continue_then_stop(*args: Any, **kwargs: Any) -> Any:
        step = await real_continue(*args, **kwargs)
        assert node is not None
        node.stop_claiming()  # shutdown begins while the commit is at the store
        return step

    async def slow_release(task: Task, **kwargs: Any) -> Task:
        releasing.set()
        await asyncio.sleep(0.3)
        released: Task = await real_release(task, **kwargs)
        return released

    store.complete_and_claim_next, store.release = continue_then_stop, slow_release

    async def send(task: Task) -> None:
        return None

    node = Node(store, send, node_id="n1", config=NodeConfig(queue=QUEUE, lease_s=30.0, **FAST_IDLE))
    run = start(node)
    await asyncio.wait_for(releasing.wait(), 5.0)
    run.cancel()  # the drain time is over
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(run, 5.0)
    assert (await store.get(first)).status is TaskStatus.DONE
    after = await store.get(second)
    assert (after.status, after.attempts, after.lease_owner) == (TaskStatus.PENDING, 0, None)
    assert node.state().handed_back == 1


async def test_tasks_of_a_claim_that_returns_after_stop_claiming_are_handed_back_unsent(make_store: Any) -> None:
    store = await make_store(clock=None)
    ids = await enqueue(store, ["a", "b", "c"])
    node, sent = await run_stopped_during(store, "claim", lambda sent: True)  # during the first claim
    assert sent == []
    for task_id in ids:
        task = await store.get(task_id)
        assert (task.status, task.attempts, task.lease_owner, task.last_error) == (TaskStatus.PENDING, 0, None, None)
    assert (node.state().claimed, node.state().handed_back) == (3, 3)


async def test_one_off_tasks_of_a_hot_lock_are_not_starved_by_conversations_with_a_backlog(make_store: Any) -> None:
    store = await make_store(clock=None)
    specs = [NewTask(queue=QUEUE, payload=f"C{c}", partition_key=f"C{c}") for _ in range(40) for c in range(4)]
    specs[8:8] = [NewTask(queue=QUEUE, payload=f"one{i}", partition_key=f"one{i}") for i in range(10)]
    await store.enqueue_many(specs)
    order: list[str] = []

    async def send(task: Task) -> None:
        order.append(task.payload)
        await asyncio.sleep(0.002)

    config = NodeConfig(queue=QUEUE, max_in_flight=8, claim_batch=8, lock_wait_s=1.0, **FAST_IDLE)
    node = Node(store, send, node_id="n1", config=config, lock_key=lambda t: "account:hot")
    run = start(node)

    async def drained() -> bool:
        return (await store.stats(QUEUE)).counts[TaskStatus.DONE] == len(specs)

    await wait_until(drained, 20.0, "every task to be done")
    node.stop_claiming()
    await asyncio.wait_for(run, 5.0)
    one_offs = [i for i, p in enumerate(order) if p.startswith("one")]
    assert len(one_offs) == 10
    # Each waits behind at most LockPool.max_overtakes (8) backlog turns: all of them are sent
    # in the first third of the drain, none timed out on the lock and was handed back.
    assert max(one_offs) < len(specs) // 3, one_offs
    assert node.state().handed_back == 0
    assert node.state().continued > 100


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("claim_next", "yes", InvalidTypeError),
        ("claim_next", 1, InvalidTypeError),
        ("claim_next_max", 0, InvalidArgumentError),
        ("claim_next_max", -3, InvalidArgumentError),
        ("claim_next_max", 2.5, InvalidTypeError),
    ],
)
def test_claim_next_settings_are_checked(field: str, value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match=field):
        NodeConfig(**{field: value})
