"""Defects of the node pipeline found in review, each reproduced on real stores with real tasks."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest
from support import FakeClock, wait_until

from asynccoord import (
    Node,
    NodeConfig,
    RateLimit,
    StoreBusyError,
    StoreConnectionError,
    Task,
    TaskStatus,
    current_delivery,
)
from asynccoord import events as ev
from asynccoord.node import keeper

EMBEDDED = pytest.mark.parametrize("backend", ["memory", "sqlite"], indirect=True)


@EMBEDDED
async def test_a_lock_lost_while_the_send_waits_for_its_pace_uses_no_attempt(make_store: Any) -> None:
    """The account lock is lost while the task's send waits for the lock's pace: the send never
    starts. The task must go back unsent, its attempt not used, and be sent once the lock store
    answers again; a never-sent task must not become a dead letter (max_attempts=1)."""
    store = await make_store(clock=None)
    await store.set_rate_limits("q", [RateLimit(dimension="account", count=1, per_s=1.0)])  # paced: 1 s first
    task = (await store.enqueue("q", {"n": 1}, partition_key="chat-1", max_attempts=1)).task
    renew = store.renew_locks
    failing = True

    async def renew_locks(leases: list[Any]) -> list[Any]:
        if failing:  # the lock store does not answer: the lease passes its local deadline
            raise StoreBusyError("lock store busy")
        result: list[Any] = await renew(leases)
        return result

    store.renew_locks = renew_locks
    sends: list[int] = []

    async def send(task: Task) -> None:
        sends.append(task.attempts)

    config = NodeConfig(
        queue="q", lock_ttl_s=0.3, lock_pace_dimension="account", busy_requeue_s=0.05, idle_min_s=0.01, idle_max_s=0.05
    )
    node = Node(store, send, node_id="n1", config=config, lock_key=lambda task: "account:x")
    run = asyncio.create_task(node.run())
    try:

        async def lost() -> bool:
            return node.state().conflicts >= 1

        await wait_until(lost, 5.0, "the lock to be lost during the pace")
        failing = False

        async def finished() -> bool:
            return (await store.get(task.id)).status in (TaskStatus.DONE, TaskStatus.DEAD)

        await wait_until(finished, 10.0, "the task to be settled")
    finally:
        node.stop_claiming()
        await asyncio.wait_for(run, 10.0)
    done = await store.get(task.id)
    assert done.status is TaskStatus.DONE, done.last_error  # before the fix: dead, "LockLostError: lock lost..."
    assert sends == [1]  # sent once, on an attempt never used by the lost lock
    assert store.events.get(ev.LOCK_LOST) >= 1


@EMBEDDED
async def test_a_busy_store_at_the_hand_back_of_a_claim_cut_by_a_stop_fails_neither_node_nor_the_rest(
    make_store: Any,
) -> None:
    """stop_claiming() comes while a claim is at the store: the node hands the claim's tasks back.
    One hand-back finds the store busy: that task is left to its lease, but the node must still
    hand back the others and stop as drained, not fail with the busy store's error."""
    store = await make_store(clock=None)
    for n in range(3):
        await store.enqueue("q", {"n": n}, partition_key=f"chat-{n}")
    sends: list[int] = []

    async def send(task: Task) -> None:
        sends.append(task.id)

    config = NodeConfig(queue="q", claim_batch=3, idle_min_s=0.01, idle_max_s=0.05)
    node = Node(store, send, node_id="n1", config=config)
    claim, release = store.claim, store.release
    busy: list[int] = []

    async def claim_then_stop(*args: Any, **kwargs: Any) -> list[Task]:
        tasks: list[Task] = await claim(*args, **kwargs)
        node.stop_claiming()  # the stop comes while the claim is at the store
        return tasks

    async def release_busy_once(task: Task, **kwargs: Any) -> Any:
        if not busy:
            busy.append(task.id)
            raise StoreBusyError("database is locked")
        return await release(task, **kwargs)

    store.claim, store.release = claim_then_stop, release_busy_once
    await asyncio.wait_for(node.run(), 10.0)  # before the fix: StoreBusyError
    assert sends == []
    statuses = {t.id: t.status for t in [await store.get(i) for i in (1, 2, 3)]}
    assert busy == [1]
    assert statuses == {1: TaskStatus.RUNNING, 2: TaskStatus.PENDING, 3: TaskStatus.PENDING}
    assert node.state().status.value == "stopped"
    assert node.state().handed_back == 2


@EMBEDDED
async def test_a_send_whose_renewals_fail_is_cut_before_the_store_can_hand_its_task_on(
    make_store: Any, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Renewals never reach the store (busy): the task lease's local deadline (the claim + 2.4 s of a
    3 s lease) passes between two points of the keeper's renewal grid (every second). The send must
    be cut there, before the store's expiry lets another node claim the task and send it again,
    not at the next point of the grid, after that expiry."""
    store = await make_store(clock=None)
    other = store if backend == "memory" else await make_store(clock=None)  # another process's handle

    async def extend_many(tasks: list[Task], lease_s: float) -> list[bool]:
        raise StoreBusyError("database is locked")

    store.extend_many = extend_many
    task = (await store.enqueue("q", {"n": 1}, partition_key="chat-1")).task
    cut_at: list[float] = []
    sending = asyncio.Event()

    async def send(task: Task) -> None:
        sending.set()
        try:
            await asyncio.sleep(30.0)
        except asyncio.CancelledError:
            cut_at.append(time.monotonic())
            raise

    # The grid's points fall 0.3 s after the claim (modulo a second): the last one before the local
    # deadline at the claim + 2.3 s, the next one at the claim + 3.3 s, past the store's expiry.
    monkeypatch.setattr(keeper, "RENEWAL_PHASE", (time.monotonic() + 0.3) % 1.0)
    config = NodeConfig(queue="q", lease_s=3.0, max_in_flight=1, idle_min_s=0.01, idle_max_s=0.05)
    node = Node(store, send, node_id="n1", config=config)
    run = asyncio.create_task(node.run())
    taken: list[Task] = []
    try:
        await asyncio.wait_for(sending.wait(), 5.0)
        node.stop_claiming()  # the send goes on (a drain); the node claims nothing more

        async def taken_over() -> bool:
            taken.extend(await other.claim("q", node_id="other-process", limit=1, lease_s=30.0))
            return bool(taken)

        await wait_until(taken_over, 10.0, "the store to hand the task to another node")
        cut_when_taken = list(cut_at)
    finally:
        node.stop_claiming()
        await asyncio.wait_for(run, 10.0)
    assert [t.id for t in taken] == [task.id]
    assert cut_when_taken, "the first send still ran when the store handed its task to another node"
    assert store.events.get(ev.LEASE_LOST) == 1


@EMBEDDED
async def test_a_send_left_running_after_its_lease_was_lost_does_not_share_its_lock_lease_with_the_next(
    make_store: Any,
) -> None:
    """Task A's lease is lost while its send runs (the store stays busy for renewals past the
    lease's local deadline); the send ignores its cancellation past its cleanup time and is left
    running. Task B needs the same account lock: its send must not run beside A's under the same
    lease and fencing token (as a send let go at send_overrun_s, the lock passes on under a new
    lease), and the abandoned send is counted as ``send_abandoned``."""
    store = await make_store(clock=None)
    extend = store.extend_many
    failing = False

    async def extend_many(tasks: list[Task], lease_s: float) -> list[bool]:
        if failing:
            raise StoreBusyError("database is locked")
        renewed: list[bool] = await extend(tasks, lease_s)
        return renewed

    store.extend_many = extend_many
    spans: dict[str, list[float]] = {}
    tokens: dict[str, int] = {}
    cut = asyncio.Event()

    async def send(task: Task) -> None:
        name = task.payload["n"]
        lock = current_delivery().lock
        assert lock is not None
        if name in spans:  # A again, once its lapsed lease let the store hand it out anew
            return
        tokens[name] = lock.fencing_token
        spans[name] = [time.monotonic(), 0.0]
        if name == "A":
            try:
                await asyncio.sleep(30.0)
            except asyncio.CancelledError:
                cut.set()
                end_at = time.monotonic() + 1.5  # ignores its cancellations for 1.5 s (a shielded call)
                while time.monotonic() < end_at:
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.sleep(end_at - time.monotonic())
        spans[name][1] = time.monotonic()

    config = NodeConfig(queue="q", lease_s=3.0, max_in_flight=2, idle_min_s=0.01, idle_max_s=0.05)
    node = Node(store, send, node_id="n1", config=config, lock_key=lambda task: "account:x")
    await store.enqueue("q", {"n": "A"}, partition_key="chat-a")
    run = asyncio.create_task(node.run())
    try:

        async def sending() -> bool:
            return "A" in spans

        await wait_until(sending, 5.0, "A's send to start")
        failing = True  # renewals fail: A's lease passes its local deadline, its send is cut
        await asyncio.wait_for(cut.wait(), 5.0)
        failing = False
        await store.enqueue("q", {"n": "B"}, partition_key="chat-b")

        async def both_over() -> bool:
            return "B" in spans and spans["B"][1] > 0 and spans["A"][1] > 0

        await wait_until(both_over, 10.0, "both sends to end")
    finally:
        node.stop_claiming()
        await asyncio.wait_for(run, 10.0)
    a_end, b_start = spans["A"][1], spans["B"][0]
    # Before the fix: B's send started while A's still ran (b_start < a_end), under the same lease (token 1).
    assert b_start >= a_end or tokens["B"] > tokens["A"], (round(a_end - b_start, 3), tokens)
    assert store.events.get(ev.SEND_ABANDONED) == 1


@EMBEDDED
async def test_a_task_handed_out_again_to_the_same_node_leaves_its_first_send_watched(
    store: Any, clock: FakeClock
) -> None:
    """The store's clock steps past a task's lease while its send runs (an NTP step forward of
    SQLite's wall clock): the store hands the task out again, and this very node claims it. The
    first send's lease is gone: it must be cut, not hidden from the keeper by the second flight
    of its task (the node's tasks in flight are kept by task id), and run on unwatched."""
    task = (await store.enqueue("q", {"n": 1}, partition_key="chat-1")).task
    deliveries: list[int] = []
    first_cut = asyncio.Event()

    async def send(task: Task) -> None:
        deliveries.append(task.attempts)
        if task.attempts == 1:
            try:
                await asyncio.sleep(30.0)
            except asyncio.CancelledError:
                first_cut.set()
                raise

    config = NodeConfig(queue="q", lease_s=3.0, max_in_flight=2, idle_min_s=0.01, idle_max_s=0.05)
    node = Node(store, send, node_id="n1", config=config)
    run = asyncio.create_task(node.run())
    try:

        async def delivered(count: int) -> bool:
            return len(deliveries) >= count

        await wait_until(lambda: delivered(1), 5.0, "the first send")
        clock.advance(4.0)  # the store's clock steps past the lease: the task is claimable again
        await wait_until(lambda: delivered(2), 5.0, "the node to claim the task again")

        async def done() -> bool:
            return (await store.get(task.id)).status is TaskStatus.DONE

        await wait_until(done, 5.0, "the second delivery to be committed")
        await asyncio.wait_for(first_cut.wait(), 5.0)  # before the fix: never cut, run on unwatched
    finally:
        node.stop_claiming()
        await asyncio.wait_for(run, 10.0)
    assert deliveries == [1, 2]
    assert store.events.get(ev.LEASE_LOST) == 1


@EMBEDDED
async def test_a_task_handed_back_unsent_is_not_counted_as_a_lost_lease(make_store: Any) -> None:
    """The lock store fails before the send: the node hands the task back, unsent. A lease renewal
    that reaches the store after that hand-back finds the lease gone, as given up: that is no lost
    lease (``lease_lost`` feeds the ``lost_leases`` alert)."""
    store = await make_store(clock=None)

    async def try_acquire_lock(*args: Any, **kwargs: Any) -> Any:
        raise StoreConnectionError("lock store unreachable")

    release = store.release

    async def release_answered_late(task: Task, **kwargs: Any) -> Any:
        released = await release(task, **kwargs)
        await asyncio.sleep(1.0)  # the hand-back has landed; its answer comes late
        return released

    store.try_acquire_lock, store.release = try_acquire_lock, release_answered_late
    await store.enqueue("q", {"n": 1}, partition_key="chat-1")

    async def send(task: Task) -> None:
        raise AssertionError("never sent: its lock cannot be taken")

    config = NodeConfig(queue="q", lease_s=0.9, max_in_flight=1, idle_min_s=0.01, idle_max_s=0.05)
    node = Node(store, send, node_id="n1", config=config, lock_key=lambda task: "account:x")
    run = asyncio.create_task(node.run())
    try:

        async def handed_back() -> bool:
            return node.state().handed_back >= 1

        await wait_until(handed_back, 5.0, "the task to be handed back")
    finally:
        node.stop_claiming()
        await asyncio.wait_for(run, 10.0)
    assert store.events.get(ev.LEASE_LOST) == 0  # before the fix: one per hand-back, a renewal's
