"""The runtime's one idle poll (issue #4): idle nodes cost one read per poll per process, not a claim per node.

``store.claimable_partitions`` on every backend (fake clock), then runtimes on the real
clock: the number of store calls of N idle nodes does not grow with N, and the work the
nodes are not told about (a task from another connection, an expired lease of a crashed
node, a delayed task falling due, a stalled owner's tasks with work stealing) is still
found.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pytest
from support import FakeClock, count_calls, wait_until

from asynccoord import NewTask, Task, TaskStatus, owner_of, partition_of
from asynccoord.errors import InvalidArgumentError, InvalidTypeError, StoreClosedError
from asynccoord.node import Node, NodeConfig, Runtime, current_delivery

QUEUE = "q"
IDLE = {"idle_min_s": 0.01, "idle_max_s": 0.1}


def key_in(partition: int, partitions: int, prefix: str = "k") -> str:
    """The first key ``<prefix><i>`` that hashes to ``partition``."""
    return next(f"{prefix}{i}" for i in range(100_000) if partition_of(f"{prefix}{i}", partitions) == partition)


def holds(condition: Any) -> Any:
    """An awaitable predicate for :func:`wait_until` from a plain one."""

    async def check() -> bool:
        return bool(condition())

    return check


def done(store: Any, task_id: int) -> Any:
    async def check() -> bool:
        return (await store.get(task_id)).status is TaskStatus.DONE

    return check


# --- the store read --------------------------------------------------------------------------


async def test_claimable_partitions_names_due_work_and_expired_leases_only(store: Any, clock: FakeClock) -> None:
    parts = store.partitions
    k1, k2, k3, k4 = (key_in(p, parts) for p in (1, 2, 3, 4))
    assert await store.claimable_partitions(QUEUE) == set()
    await store.enqueue_many(
        [
            NewTask(queue=QUEUE, payload="a", partition_key=k1),
            NewTask(queue=QUEUE, payload="b", partition_key=k1),
            NewTask(queue=QUEUE, payload="later", partition_key=k2, delay_s=10.0),
            NewTask(queue=QUEUE, payload="leased", partition_key=k3),
            NewTask(queue="other", payload="x", partition_key=k4),
        ]
    )
    [leased] = await store.claim(QUEUE, node_id="crashed", lease_s=5.0, partitions=[3], ordered=True)
    assert await store.claimable_partitions(QUEUE) == {1}
    assert await store.claimable_partitions(QUEUE, ordered=True) == {1}
    assert await store.claimable_partitions(QUEUE, [2, 3, 4]) == set()
    assert await store.claimable_partitions("other", [1, 4]) == {4}
    assert await store.claimable_partitions(QUEUE, []) == set()
    clock.advance(6.0)  # the lease expired; the delayed task is not due yet
    assert await store.claimable_partitions(QUEUE) == {1, 3}
    assert await store.claimable_partitions(QUEUE, [2, 3]) == {3}
    assert await store.claimable_partitions(QUEUE, min_due_age_s=2.0) == {1}  # the lease expired 1 s ago
    clock.advance(4.0)
    assert await store.claimable_partitions(QUEUE) == {1, 2, 3}
    assert await store.claimable_partitions(QUEUE, [1, 2, 3], ordered=True, min_due_age_s=4.5) == {1, 3}
    # ordered: k1's second task is not its head while the first is active
    [first] = await store.claim(QUEUE, node_id="n", limit=1, partitions=[1], ordered=True)
    assert first.payload == "a"
    assert 1 not in await store.claimable_partitions(QUEUE, ordered=True)
    assert 1 in await store.claimable_partitions(QUEUE, ordered=False)
    await store.complete(first)
    assert 1 in await store.claimable_partitions(QUEUE, ordered=True)
    # a read: nothing was claimed or changed by it
    assert (await store.get(leased.id)).version == leased.version


async def test_claimable_partitions_checks_its_arguments(store: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="partitions"):
        await store.claimable_partitions(QUEUE, [store.partitions])
    with pytest.raises(InvalidTypeError, match="partitions"):
        await store.claimable_partitions(QUEUE, "12")
    with pytest.raises(InvalidArgumentError, match="min_due_age_s"):
        await store.claimable_partitions(QUEUE, min_due_age_s=-1.0)
    with pytest.raises((InvalidArgumentError, InvalidTypeError), match="queue"):
        await store.claimable_partitions("")
    await store.close()
    with pytest.raises(StoreClosedError):
        await store.claimable_partitions(QUEUE)


# --- the runtime's poll ----------------------------------------------------------------------


async def idle_calls(store: Any, nodes: int, window_s: float) -> tuple[int, int, Runtime]:
    """``(claims, polls)`` a runtime of ``nodes`` idle nodes made in ``window_s`` after settling."""
    claims = count_calls(store, "claim")
    polls = count_calls(store, "claimable_partitions")

    async def send(task: Task) -> None:
        raise AssertionError("nothing to send")

    config = NodeConfig(queue=QUEUE, **IDLE)
    async with Runtime(store, send=send, nodes=nodes, config=config, heartbeat_ttl_s=5.0) as runtime:
        await asyncio.sleep(0.5)  # started, first claims made, backoff at its top
        # A view change wakes the nodes that take partitions over (they claim there once): on a
        # loaded machine the last joins can land after 0.5 s, so the window starts once every
        # node has held the same partitions for 0.3 s (at most 10 s).
        views: list[tuple[frozenset[int] | None, ...]] = []
        stable_since = time.monotonic()
        deadline = stable_since + 10.0
        while time.monotonic() < deadline:
            view = tuple(node._owned for node in runtime.nodes)
            if not views or view != views[-1]:
                views.append(view)
                stable_since = time.monotonic()
            elif None not in view and time.monotonic() - stable_since >= 0.3:
                break
            await asyncio.sleep(0.02)
        since = time.monotonic()
        await asyncio.sleep(window_s)
        in_window = (sum(1 for t in claims if t >= since), sum(1 for t in polls if t >= since))
    del store.claim, store.claimable_partitions  # back to the class's methods
    return in_window[0], in_window[1], runtime


async def test_idle_nodes_of_a_runtime_do_not_claim_and_polls_do_not_grow_with_their_number(make_store: Any) -> None:
    store = await make_store(clock=None)
    window_s = 1.0
    claims_2, polls_2, small = await idle_calls(store, 2, window_s)
    claims_32, polls_32, big = await idle_calls(store, 32, window_s)
    assert small.idle_poller is not None
    assert big.idle_poller is not None
    # idle nodes wait for the poll: no claims at all (before, ~1/idle_max_s per node)
    assert (claims_2, claims_32) == (0, 0)
    # one read per poll, every 0.01 .. 0.1 s (full jitter): about 18/s, whatever the node count
    most = window_s / ((IDLE["idle_min_s"] + IDLE["idle_max_s"]) / 2) * 1.5
    assert 1 <= polls_2 <= most, polls_2
    assert 1 <= polls_32 <= most, polls_32
    assert polls_32 <= polls_2 * 2 + 2, (polls_2, polls_32)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_task_enqueued_through_another_connection_is_claimed(make_store: Any, backend: str) -> None:
    store = await make_store(clock=None)
    # Same file / schema, another connection and notifier; on SQLite without the wake-up channel
    # (tests/multiprocess/test_sqlite_wakeup.py), so that only the poll can find the task.
    other = await make_store(clock=None, wakeup=False)
    sent: list[int] = []

    async def send(task: Task) -> None:
        sent.append(task.id)

    config = NodeConfig(queue=QUEUE, idle_fallback_s=60.0, **IDLE)
    async with Runtime(store, send=send, nodes=4, config=config) as runtime:
        await asyncio.sleep(0.4)  # every node idle, the poll backed off
        assert all(node.idle for node in runtime.nodes)
        started = time.monotonic()
        task = (await other.enqueue(QUEUE, {"n": 1}, partition_key="conv-1")).task
        await wait_until(done(store, task.id), 5.0, "the task to be done")
        took_s = time.monotonic() - started
    assert sent == [task.id]
    assert took_s < 1.0  # found by the poll within about idle_max_s, not the 30-60 s fallback
    assert runtime.idle_poller is not None
    if backend == "sqlite":  # no cross-process notification: the poll found it (PostgreSQL may NOTIFY first)
        assert runtime.idle_poller.woken >= 1


async def test_an_expired_lease_of_a_crashed_node_is_reclaimed_by_an_idle_runtime(make_store: Any) -> None:
    store = await make_store(clock=None)
    task = (await store.enqueue(QUEUE, {"n": 1}, partition_key="conv-1")).task
    [leased] = await store.claim(QUEUE, node_id="crashed", lease_s=0.3)  # and never heard of again
    sent: list[Task] = []

    async def send(task: Task) -> None:
        sent.append(task)

    config = NodeConfig(queue=QUEUE, idle_fallback_s=60.0, **IDLE)
    async with Runtime(store, send=send, nodes=4, config=config):
        await wait_until(done(store, task.id), 5.0, "the reclaimed task to be done")
    [redelivered] = sent
    assert redelivered.id == leased.id
    assert redelivered.attempts == 2
    assert redelivered.lease_owner != "crashed"


async def test_a_delayed_task_is_claimed_when_due_by_an_idle_runtime(make_store: Any) -> None:
    store = await make_store(clock=None)
    sent: list[float] = []

    async def send(task: Task) -> None:
        sent.append(time.monotonic())

    config = NodeConfig(queue=QUEUE, idle_fallback_s=60.0, **IDLE)
    async with Runtime(store, send=send, nodes=4, config=config):
        await asyncio.sleep(0.2)
        started = time.monotonic()
        task = (
            await store.enqueue(QUEUE, {"n": 1}, partition_key="conv-1", delay_s=0.3)
        ).task  # nobody is told when due
        await wait_until(done(store, task.id), 5.0, "the delayed task to be done")
    [at] = sent
    assert 0.3 <= at - started < 1.3


async def test_work_stealing_in_a_runtime_takes_a_stalled_owners_waiting_tasks(make_store: Any) -> None:
    store = await make_store(clock=None)
    node_ids = ["node-a", "node-b"]
    a_keys = [
        k for k in (f"a{i}" for i in range(10_000)) if owner_of(partition_of(k, store.partitions), node_ids) == "node-a"
    ][:4]
    unblock = asyncio.Event()
    sends: list[tuple[str, Task]] = []

    async def send(task: Task) -> None:
        node_id = current_delivery().node_id
        sends.append((node_id, task))
        if node_id == "node-a":
            await unblock.wait()  # node-a stalls in its first task; its slot is its only one

    steal_after_s = 0.3
    config = NodeConfig(
        queue=QUEUE,
        max_in_flight=1,
        claim_batch=1,
        work_stealing=True,
        steal_after_s=steal_after_s,
        idle_fallback_s=60.0,
        **IDLE,
    )
    async with Runtime(store, send=send, node_ids=node_ids, config=config) as runtime:
        while runtime.membership.view.node_ids != tuple(node_ids):
            await runtime.membership.wait_changed(runtime.membership.view.version, timeout_s=2.0)
        head = (await store.enqueue(QUEUE, {"n": 0}, partition_key=a_keys[0])).task
        await wait_until(lambda: asyncio.sleep(0, bool(sends)), 2.0, "node-a's first send")
        assert sends[0][0] == "node-a"
        rest = [(await store.enqueue(QUEUE, {"n": i}, partition_key=k)).task for i, k in enumerate(a_keys[1:], 1)]

        async def stolen() -> bool:
            return sum(1 for n, _ in sends if n == "node-b") == len(rest)

        await wait_until(stolen, 5.0, "node-b to steal node-a's waiting tasks")
        unblock.set()
        await wait_until(done(store, head.id), 5.0, "node-a's task to be done")
    by_b = [t for n, t in sends if n == "node-b"]
    assert sorted(t.id for t in by_b) == sorted(t.id for t in rest)
    for t in by_b:  # each had waited at least steal_after_s when it was claimed (store clock)
        assert t.updated_at - t.run_at >= steal_after_s - 0.01
    assert Counter(t.id for _, t in sends) == Counter([head.id, *(t.id for t in rest)])


async def test_a_poll_that_names_work_no_claim_takes_backs_off_instead_of_spinning(make_store: Any) -> None:
    store = await make_store(clock=None)
    claims = count_calls(store, "claim")
    polls: list[float] = []

    async def lying(queue: str, partitions: Any = None, **kwargs: Any) -> set[int]:
        polls.append(time.monotonic())
        return set(range(store.partitions)) if partitions is None else set(partitions)

    store.claimable_partitions = lying  # every idle node's partitions "have work"; its claims find none

    async def send(task: Task) -> None:
        raise AssertionError("nothing to send")

    config = NodeConfig(queue=QUEUE, **IDLE)
    async with Runtime(store, send=send, nodes=4, config=config) as runtime:
        await asyncio.sleep(0.5)
        since = time.monotonic()
        await asyncio.sleep(1.0)
    assert runtime.idle_poller is not None
    assert runtime.idle_poller.woken > 0
    in_window = sum(1 for t in polls if t >= since)
    # backed off to idle_max_s = 0.1 s (full jitter: ~18/s) instead of one poll and 4 claims every 0.01 s
    assert in_window <= 30, in_window
    assert sum(1 for t in claims if t >= since) <= 4 * 30


async def test_a_standalone_node_still_polls_by_itself(make_store: Any) -> None:
    store = await make_store(clock=None)
    claims = count_calls(store, "claim")
    sent: list[float] = []

    async def send(task: Task) -> None:
        sent.append(time.monotonic())

    node = Node(store, send, node_id="alone", config=NodeConfig(queue=QUEUE, **IDLE))  # no runtime, no poller
    assert node.idle_poll
    run = asyncio.create_task(node.run())
    await asyncio.sleep(0.3)
    assert len(claims) >= 3  # its own backoff: claims every 0.01 .. 0.1 s
    started = time.monotonic()
    task = (await store.enqueue(QUEUE, {"n": 1}, partition_key="conv-1", delay_s=0.2)).task  # nobody is told
    await wait_until(done(store, task.id), 5.0, "the delayed task to be done")
    node.stop_claiming()
    await asyncio.wait_for(run, 5.0)
    [at] = sent
    assert 0.2 <= at - started < 1.0


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_a_node_that_gains_partitions_while_it_waits_is_woken_for_them(make_store: Any) -> None:
    """A view change re-matches a waiting node's wake-up to the partitions it owns now.

    Before, the wake-up kept the partitions of the node's last claim: a task announced in
    a partition the node had just taken over woke nobody, and waited for the idle poll
    (here 20-30 s; by default up to ``idle_max_s``).
    """
    store = await make_store(clock=None)
    other = await make_store(clock=None)  # the leaving runtime's: its shutdown wakes none of ours
    sent: list[int] = []

    async def send(task: Task) -> None:
        sent.append(task.id)

    slow_poll = NodeConfig(queue=QUEUE, idle_min_s=20.0, idle_max_s=30.0, idle_fallback_s=60.0)
    stays = Runtime(store, send=send, nodes=1, config=slow_poll, heartbeat_interval_s=0.05, node_ids=["a"])
    leaves = Runtime(other, send=send, nodes=1, config=slow_poll, heartbeat_interval_s=0.05, node_ids=["b"])
    async with stays:
        async with leaves:
            await wait_until(holds(lambda: stays.membership.view.node_ids == ("a", "b")), 5.0, "both nodes in the view")
            assert stays.nodes[0].wake()  # it claims again, by the two-node view, and waits
            await wait_until(holds(lambda: stays.nodes[0].idle), 5.0, "a to claim by the two-node view and wait")
        version = stays.membership.view.version
        await wait_until(holds(lambda: stays.membership.view.version > version), 5.0, "the view without b")
        key = next(
            k
            for k in (f"conv-{n}" for n in range(1000))
            if owner_of(partition_of(k, store.partitions), ["a", "b"]) == "b"
        )
        started = time.monotonic()
        task = (await store.enqueue(QUEUE, {"n": 1}, partition_key=key)).task
        await wait_until(holds(lambda: sent == [task.id]), 10.0, "a to send the task of b's former partition")
        assert time.monotonic() - started < 5.0  # the notification woke it, not the 20 s poll
