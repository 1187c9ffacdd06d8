"""A claim's lockless tasks handled by one coroutine (``LocklessBatch``), and the pieces it stands on.

The node takes this way when no task needs a lock and no commit leases a next task (here:
``claim_next=False``). What the node guarantees task by task is tested for both ways through
the ``pipeline`` fixture in the other node tests; these tests pin what is particular to the
batch: one commit for the claim, no hold-up behind a slow send, one timeout for the claim,
and the commit coalescer, slots and histograms it uses.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import anyio
import pytest
from support import count_calls

from asynccoord import (
    InvalidArgumentError,
    LeaseLostError,
    MemoryStore,
    RetryPolicy,
    StoreBusyError,
    StoreClosedError,
    Task,
    TaskStatus,
)
from asynccoord import events as ev
from asynccoord.monitor.histogram import COMMIT_MS, ENQUEUE_TO_COMMIT_MS, SEND_MS, LatencyRecorder
from asynccoord.node import Node, NodeConfig, NodeStatus
from asynccoord.node.ablation import FULL, Ablation
from asynccoord.node.commits import Commits
from asynccoord.node.flight import Flight
from asynccoord.node.slots import Slots

QUEUE = "q"
BATCH = {"claim_next": False, "idle_min_s": 0.01, "idle_max_s": 0.05}


async def wait_for_status(store: Any, task_id: int, status: TaskStatus, timeout_s: float = 5.0) -> Task:
    deadline = time.monotonic() + timeout_s
    while (task := await store.get(task_id)).status is not status:
        assert time.monotonic() < deadline, f"task {task_id} is {task.status}, not {status}"
        await asyncio.sleep(0.005)
    return task


async def stopped(node: Node, run: asyncio.Task[None]) -> None:
    node.stop_claiming()
    await asyncio.wait_for(run, 10.0)


async def test_a_claims_returned_sends_are_committed_in_one_store_call(make_store: Any) -> None:
    store = await make_store(clock=None)
    ids = [(await store.enqueue(QUEUE, i, partition_key=f"k{i}")).task.id for i in range(8)]
    batches = count_calls(store, "complete_many")
    singles = count_calls(store, "complete")

    async def send(task: Task) -> str:
        await asyncio.sleep(0)
        return f"sent {task.payload}"

    node = Node(store, send, node_id="n1", config=NodeConfig(queue=QUEUE, claim_batch=8, max_in_flight=8, **BATCH))
    run = asyncio.create_task(node.run())
    for task_id in ids:
        await wait_for_status(store, task_id, TaskStatus.DONE)
    await stopped(node, run)
    assert (len(batches), len(singles)) == (1, 0)
    assert [(await store.get(i)).result for i in ids] == [f"sent {i}" for i in range(8)]
    state = node.state()
    assert (state.claimed, state.sent, state.committed, state.conflicts, state.in_flight) == (8, 8, 8, 0, 0)
    latencies = store.latencies.snapshot()
    assert [latencies[name].count for name in (SEND_MS, COMMIT_MS, ENQUEUE_TO_COMMIT_MS)] == [8, 8, 8]


async def test_a_send_that_blocks_holds_back_no_other_task_of_its_claim(make_store: Any) -> None:
    store = await make_store(clock=None)
    slow, *fast = [(await store.enqueue(QUEUE, p, partition_key=f"k{p}")).task.id for p in ("slow", "a", "b")]
    release = asyncio.Event()
    claim = store.claim
    limits: list[int] = []

    async def claiming(*args: Any, limit: int, **kwargs: Any) -> list[Task]:
        limits.append(limit)
        tasks: list[Task] = await claim(*args, limit=limit, **kwargs)
        return tasks

    store.claim = claiming

    async def send(task: Task) -> str:
        if task.payload == "slow":
            await release.wait()
        return task.payload

    node = Node(store, send, node_id="n1", config=NodeConfig(queue=QUEUE, claim_batch=3, max_in_flight=3, **BATCH))
    run = asyncio.create_task(node.run())
    for task_id in fast:
        await wait_for_status(store, task_id, TaskStatus.DONE)
    while 2 not in limits:  # the settled tasks' slots are free again: the node claims for them
        await asyncio.sleep(0.005)
    assert ((await store.get(slow)).status, node.in_flight, limits[0]) == (TaskStatus.RUNNING, 1, 3)
    release.set()
    assert (await wait_for_status(store, slow, TaskStatus.DONE)).result == "slow"
    await stopped(node, run)
    assert node.state().committed == 3


async def test_one_timeout_cuts_the_claims_sends_still_running_and_only_those(make_store: Any) -> None:
    store = await make_store(clock=None)
    ids = [(await store.enqueue(QUEUE, p, partition_key=f"k{p}", max_attempts=1)).task.id for p in ("slow", "fast")]
    cut: list[str] = []

    async def send(task: Task) -> str:
        if task.payload == "slow":
            try:
                await asyncio.sleep(5)
            except asyncio.CancelledError:
                cut.append(task.payload)
                raise
        return task.payload

    config = NodeConfig(queue=QUEUE, send_timeout_s=0.2, claim_batch=2, max_in_flight=2, **BATCH)
    node = Node(store, send, node_id="n1", config=config)
    started = time.monotonic()
    run = asyncio.create_task(node.run())
    slow = await wait_for_status(store, ids[0], TaskStatus.DEAD)
    assert 0.2 <= time.monotonic() - started <= 1.0
    await stopped(node, run)
    assert (slow.last_error, cut) == ("TimeoutError", ["slow"])
    assert (await store.get(ids[1])).result == "fast"
    assert (node.state().failed, node.state().committed) == (1, 1)


async def test_a_lease_lost_while_its_send_runs_cuts_that_send_only(make_store: Any) -> None:
    store = await make_store(clock=None)
    slow, fast = [(await store.enqueue(QUEUE, p, partition_key=f"k{p}")).task.id for p in ("slow", "fast")]
    extend_many = store.extend_many

    async def renew(tasks: list[Task], lease_s: float) -> list[bool]:
        renewed: list[bool] = await extend_many(tasks, lease_s)
        return [ok and t.id != slow for t, ok in zip(tasks, renewed, strict=True)]  # the store took it back

    store.extend_many = renew
    cut = asyncio.Event()

    async def send(task: Task) -> str:
        if task.payload == "slow":
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                cut.set()
                raise
        return task.payload

    config = NodeConfig(queue=QUEUE, lease_s=0.6, claim_batch=2, max_in_flight=2, **BATCH)
    node = Node(store, send, node_id="n1", config=config)
    run = asyncio.create_task(node.run())
    await asyncio.wait_for(cut.wait(), 5.0)  # at the first renewal (every lease_s / 3)
    while node.in_flight:
        await asyncio.sleep(0.005)
    await stopped(node, run)
    assert (await store.get(fast)).result == "fast"
    state = node.state()
    assert (state.sent, state.committed, state.conflicts, state.handed_back) == (1, 1, 1, 0)
    assert store.events.get(ev.LEASE_LOST) == 1


async def test_a_lease_past_its_local_deadline_when_the_claim_arrives_goes_back_unsent(make_store: Any) -> None:
    store = await make_store(clock=None)
    task_id = (await store.enqueue(QUEUE, "m", partition_key="k")).task.id
    claim = store.claim
    late: list[int] = []

    async def slow_claim(*args: Any, **kwargs: Any) -> list[Task]:
        tasks: list[Task] = await claim(*args, **kwargs)
        if tasks and not late:
            late.append(tasks[0].id)
            time.sleep(0.9)  # the loop is blocked past the 0.8 s local deadline of a 1 s lease
        return tasks

    store.claim = slow_claim
    sends: list[int] = []

    async def send(task: Task) -> None:
        sends.append(task.id)

    node = Node(store, send, node_id="n1", config=NodeConfig(queue=QUEUE, lease_s=1.0, **BATCH))
    run = asyncio.create_task(node.run())
    await wait_for_status(store, task_id, TaskStatus.DONE, timeout_s=10.0)
    await stopped(node, run)
    assert (late, sends) == ([task_id], [task_id])  # sent once, on the next claim
    assert store.events.get(ev.LEASE_LOST) == 1


async def test_a_send_that_cancels_itself_in_a_batch_is_a_failed_send(make_store: Any) -> None:
    store = await make_store(clock=None)
    ids = [(await store.enqueue(QUEUE, p, partition_key=f"k{p}", max_attempts=2)).task.id for p in ("odd", "ok")]
    raised: Counter[str] = Counter()

    async def send(task: Task) -> str:
        await asyncio.sleep(0)
        if task.payload == "odd" and not raised["odd"]:
            raised["odd"] += 1
            raise asyncio.CancelledError("upstream gone")
        return task.payload

    config = NodeConfig(queue=QUEUE, retry=RetryPolicy(base_s=0.01, factor=1.0, jitter=0.0), **BATCH)
    node = Node(store, send, node_id="n1", config=config)
    run = asyncio.create_task(node.run())
    odd = await wait_for_status(store, ids[0], TaskStatus.DONE)
    await stopped(node, run)
    assert (odd.attempts, odd.result, (await store.get(ids[1])).result) == (2, "odd", "ok")
    assert (node.state().failed, node.state().committed, node.state().status) == (1, 2, NodeStatus.STOPPED)


@pytest.mark.parametrize("outcome", ["returns", "raises"])
async def test_a_store_closed_under_a_batch_fails_the_node_with_a_typed_error(make_store: Any, outcome: str) -> None:
    """The blocked send ends once the store is closed: its commit (or its failure record) fails the node."""
    store = await make_store(clock=None)
    for p in ("blocked", "other"):
        await store.enqueue(QUEUE, p, partition_key=f"k{p}")
    started, release = asyncio.Event(), asyncio.Event()

    async def send(task: Task) -> str:
        if task.payload == "blocked":
            started.set()
            await release.wait()
            if outcome == "raises":
                raise ConnectionError("the chat API said no")
        return "sent"

    # Its claim came back short: the node waits 5 s before it claims again, so the commit is
    # what finds the store closed.
    config = NodeConfig(queue=QUEUE, claim_next=False, idle_min_s=5.0, idle_max_s=5.0)
    node = Node(store, send, node_id="n1", config=config)
    run = asyncio.create_task(node.run())
    await asyncio.wait_for(started.wait(), 5.0)
    while node.in_flight > 1:
        await asyncio.sleep(0.005)
    await store.close()
    release.set()  # the commit (or failure record) finds the store closed
    with pytest.raises(StoreClosedError):  # the error itself, not an ExceptionGroup
        await asyncio.wait_for(run, 5.0)
    state = node.state()
    assert (state.status, state.sent, state.committed, state.in_flight) == (NodeStatus.FAILED, 2, 1, 0)


async def test_a_process_exit_in_one_send_hands_back_the_claims_other_sends_and_stops_the_node(
    make_store: Any,
) -> None:
    store = await make_store(clock=None)
    ids = [(await store.enqueue(QUEUE, p, partition_key=f"k{p}")).task.id for p in ("waits", "exits")]
    waiting, cut = asyncio.Event(), asyncio.Event()
    starts: Counter[int] = Counter()

    async def send(task: Task) -> None:
        starts[task.id] += 1
        if task.payload == "exits":
            await waiting.wait()
            raise KeyboardInterrupt
        waiting.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cut.set()
            raise

    node = Node(store, send, node_id="n1", config=NodeConfig(queue=QUEUE, **BATCH))
    with anyio.fail_after(10.0), pytest.raises(KeyboardInterrupt):
        await node.run()  # in this task: asyncio lets a KeyboardInterrupt out of a task of its own
    assert cut.is_set()
    for task_id in ids:  # handed back (a claim cut by the stop is handed back in the background)
        task = await wait_for_status(store, task_id, TaskStatus.PENDING)
        assert (task.attempts, task.last_error) == (starts[task_id], None)  # a send started counts
        assert starts[task_id] >= 1
    assert node.state().status is NodeStatus.STOPPED


async def test_a_settle_cancelled_without_the_node_being_cancelled_fails_the_node(make_store: Any) -> None:
    """Should anything but the node's cancellation cancel a batch's settle (a bug), the node fails
    loudly instead of stopping as if it had been cancelled; the task is handed back."""
    store = await make_store(clock=None)
    task_id = (await store.enqueue(QUEUE, 1)).task.id
    sends = 0

    async def send(task: Task) -> None:
        nonlocal sends
        sends += 1

    node = Node(store, send, node_id="n1", config=NodeConfig(queue=QUEUE, **BATCH))

    async def commit_many(flights: Any, results: Any) -> None:
        raise asyncio.CancelledError

    node._settler.commit_many = commit_many  # type: ignore[method-assign]
    with pytest.raises(ExceptionGroup) as raised:  # a RuntimeError (a bug), in the task group's group
        await asyncio.wait_for(node.run(), 5.0)
    assert raised.group_contains(
        RuntimeError, match=rf"^node 'n1': a settle of the tasks \[{task_id}\] ended cancelled although"
    )
    assert node.state().status is NodeStatus.FAILED
    # Its send returned but the commit was cut: handed back, the attempt counted.
    assert (await wait_for_status(store, task_id, TaskStatus.PENDING)).attempts == sends


async def test_a_batch_is_the_way_only_without_locks_traces_or_commit_and_continue() -> None:
    async with MemoryStore() as store:
        flight = Flight(task=_task(1), lease_deadline=0.0)

        def way(config: NodeConfig, lock_key: Any = None, ablation: Ablation = FULL) -> bool:
            node = Node(store, _noop, node_id="n1", config=config, lock_key=lock_key, _ablation=ablation)
            return node._lockless([flight])

        assert way(NodeConfig(claim_next=False))
        assert way(NodeConfig(ordered=False))
        assert not way(NodeConfig())  # an ordered queue with claim_next: one slot per task
        assert not way(NodeConfig(ordered=False), lock_key=lambda t: "account")
        assert way(NodeConfig(ordered=False), lock_key=lambda t: "account", ablation=Ablation(locks=False))
        assert not way(NodeConfig(ordered=False), ablation=Ablation(version_checks=False))
        flight.trace = object()  # type: ignore[assignment]
        assert not way(NodeConfig(ordered=False))


async def _noop(task: Task) -> None:
    return None


# --- the commit coalescer ---------------------------------------------------------------------


def _task(task_id: int) -> Task:
    return Task(
        id=task_id,
        queue=QUEUE,
        partition_key=f"k{task_id}",
        partition=0,
        payload=None,
        status=TaskStatus.RUNNING,
        attempts=1,
        lease_owner="n1",
        lease_token=f"t.{task_id}",
        lease_expires_at=2.0,
        version=1,
        idempotency_key=None,
        priority=0,
        max_attempts=3,
        run_at=1.0,
        last_error=None,
        result=None,
        created_at=1.0,
        updated_at=1.0,
    )


class _ManyStore:
    """A store with ``complete_many`` only: each call's tasks, and an outcome per task (or a raise)."""

    def __init__(self, outcome: Any = None) -> None:
        self.calls: list[list[int]] = []
        self.outcome = outcome  # None: done; an exception: raised for the whole call; a callable: per task

    async def complete_many(self, tasks: list[Task], results: list[Any], *, fences: Any = None) -> list[Any]:
        self.calls.append([t.id for t in tasks])
        await asyncio.sleep(0)
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        if callable(self.outcome):
            return [self.outcome(t, tasks) for t in tasks]
        return list(tasks)


async def test_the_commits_of_one_loop_turn_go_to_the_store_in_one_call() -> None:
    store = _ManyStore(lambda t, tasks: t if t.id != 2 else LeaseLostError(2, "expired"))
    commits = Commits(store)
    one, many = await asyncio.gather(
        commits.complete(_task(1), None, None), commits.complete_many([_task(2), _task(3)], [None, None])
    )
    assert store.calls == [[1, 2, 3]]
    assert one.id == 1
    assert isinstance(many[0], LeaseLostError)
    assert [type(o) for o in many] == [LeaseLostError, Task]


async def test_a_bad_argument_refuses_only_its_own_commit() -> None:
    class Picky(_ManyStore):
        async def complete_many(self, tasks: list[Task], results: list[Any], *, fences: Any = None) -> list[Any]:
            self.calls.append([t.id for t in tasks])
            if any(r == "bad" for r in results):
                raise InvalidArgumentError("result is bad")
            return list(tasks)

    store = Picky()
    commits = Commits(store)
    outcomes = await commits.complete_many([_task(1), _task(2), _task(3)], [None, "bad", None])
    assert store.calls == [[1, 2, 3], [1], [2], [3]]
    assert [o.id if isinstance(o, Task) else str(o) for o in outcomes] == [1, "result is bad", 3]
    with pytest.raises(InvalidArgumentError, match="result is bad"):
        await commits.complete(_task(4), "bad", None)


async def test_a_failed_call_is_each_callers_error_and_a_caller_cancelled_before_it_is_left_out() -> None:
    store = _ManyStore(StoreBusyError("database is locked"))
    commits = Commits(store)
    left_out = asyncio.ensure_future(commits.complete(_task(1), None, None))
    await asyncio.sleep(0)  # its entry is queued; cancelled before the flush
    left_out.cancel()
    outcomes = await asyncio.gather(
        commits.complete_many([_task(2)], [None]), commits.complete(_task(3), None, None), return_exceptions=True
    )
    assert store.calls == [[2, 3]]
    assert all(isinstance(o, StoreBusyError) for o in outcomes)
    assert left_out.cancelled()


async def test_a_store_without_complete_many_commits_one_task_at_a_time() -> None:
    class Singles:
        def __init__(self) -> None:
            self.calls: list[int] = []

        async def complete(self, task: Task, result: Any, *, fence: Any = None) -> Task:
            self.calls.append(task.id)
            if task.id == 2:
                raise LeaseLostError(2, "expired")
            return task

    store = Singles()
    outcomes = await Commits(store).complete_many([_task(1), _task(2), _task(3)], [None] * 3)
    assert store.calls == [1, 2, 3]
    assert [type(o) for o in outcomes] == [Task, LeaseLostError, Task]


# --- slots and histograms -----------------------------------------------------------------------


async def test_slots_are_taken_a_claims_worth_at_a_time_and_wake_their_taker() -> None:
    slots = Slots(4)
    assert await slots.take(3) == 3
    assert (slots.free, slots.locked()) == (1, False)
    assert await slots.take(3) == 1
    assert slots.locked()
    waiting = asyncio.ensure_future(slots.take(8))
    await asyncio.sleep(0)
    assert not waiting.done()
    with pytest.raises(RuntimeError, match="another coroutine is waiting"):
        await slots.take(1)
    slots.release(2)
    assert await waiting == 2
    slots.release(3)
    with pytest.raises(InvalidArgumentError, match=r"Slots.release\(2\): only 1 slots are taken"):
        slots.release(2)
    slots.release(1)
    assert (slots.free, repr(slots)) == (4, "<Slots free=4/4>")


def test_observe_many_counts_as_many_observe_calls() -> None:
    values = [0.0, -1.0, 0.004, 1.5, 1.5, 250.0, 1e9]
    one, many = LatencyRecorder(), LatencyRecorder()
    for value in values:
        one.observe(SEND_MS, value)
    many.observe_many(SEND_MS, values)
    assert many.snapshot()[SEND_MS].nonzero() == one.snapshot()[SEND_MS].nonzero()
    assert many.snapshot()[SEND_MS].sum_ms == pytest.approx(one.snapshot()[SEND_MS].sum_ms)
    with pytest.raises(InvalidArgumentError, match="value_ms must be finite"):
        many.observe_many(SEND_MS, [1.0, float("nan")])
    assert many.snapshot()[SEND_MS].count == len(values)  # nothing counted from the refused list
