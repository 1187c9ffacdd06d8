"""The node pipeline (fetch -> lock -> send -> commit) with real concurrency and the real clock.

Stores come from the ``make_store`` fixture with ``clock=None`` (time.time for the
memory store, SQLite's own clock for the SQLite store): leases and locks expire in
real time here, because what is tested is how a running node reacts to that.
"""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from support import wait_until

from asynccoord import (
    CoordError,
    InvalidArgumentError,
    MemoryStore,
    NewTask,
    NoDeliveryError,
    RetryPolicy,
    Semaphore,
    SQLiteStore,
    StoreClosedError,
    Task,
    TaskStatus,
    owner_of,
    partition_of,
)
from asynccoord.membership import Membership
from asynccoord.node import Node, NodeConfig, NodeStatus, Runtime, current_delivery
from asynccoord.node.ablation import FULL, Ablation
from asynccoord.validation import MIN_LEASE_S

QUEUE = "q"
FAST_IDLE = {"idle_min_s": 0.01, "idle_max_s": 0.05}


NODE_DURATIONS = (
    "lease_s",
    "send_timeout_s",
    "idle_min_s",
    "idle_max_s",
    "lock_ttl_s",
    "lock_wait_s",
    "busy_requeue_s",
    "steal_after_s",
)


@pytest.mark.parametrize("field", NODE_DURATIONS)
@pytest.mark.parametrize(
    ("value", "message"),
    [
        (1e308, r"must be <= 31536000 seconds \(one year, MAX_DURATION_S\), got 1e\+308"),
        (float("inf"), "must be finite, got inf"),
        (float("nan"), "must be finite, got nan"),
        (0, "must be > 0, got 0"),
    ],
)
def test_node_config_durations_are_bounded(field: str, value: float, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=f"{field} {message}"):
        NodeConfig(**{field: value})


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_in_flight", 0, "max_in_flight must be >= 1, got 0"),
        ("max_in_flight", 10**12, "max_in_flight must be <= 1000000, got 1000000000000"),
        ("claim_batch", 10_001, "claim_batch must be <= 10000, got 10001"),
    ],
)
def test_node_config_counts_are_bounded(field: str, value: int, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        NodeConfig(**{field: value})
    assert getattr(NodeConfig(**{field: 1}), field) == 1


@pytest.mark.parametrize("field", ["lease_s", "lock_ttl_s"])
def test_node_config_leases_are_at_least_min_lease_s(field: str) -> None:
    # A lease in the wrong unit (1e-6 "seconds") would lapse before the send, spend every
    # attempt and dead-letter the task without a send: refused at construction.
    for value in (1e-6, 0.001, MIN_LEASE_S / 2):
        with pytest.raises(InvalidArgumentError, match=rf"^{field} must be >= 0\.01 seconds \(MIN_LEASE_S"):
            NodeConfig(**{field: value})
    assert getattr(NodeConfig(**{field: MIN_LEASE_S}), field) == MIN_LEASE_S


def test_node_config_lock_permits_has_the_semaphore_bound() -> None:
    # The node builds a Semaphore from lock_permits: a count it would refuse is refused here,
    # before any task is claimed.
    with pytest.raises(InvalidArgumentError, match=r"^lock_permits must be <= 2147483647, got 2147483648$"):
        NodeConfig(lock_permits=2**31)
    assert NodeConfig(lock_permits=2**31 - 1).lock_permits == 2**31 - 1
    assert Semaphore(MemoryStore(), "acct", permits=2**31 - 1).permits == 2**31 - 1
    with pytest.raises(InvalidArgumentError, match=r"^permits must be <= 2147483647, got 2147483648$"):
        Semaphore(MemoryStore(), "acct", permits=2**31)


def start(node: Node) -> asyncio.Task[None]:
    return asyncio.create_task(node.run(), name=f"test-run-{node.node_id}")


async def stop(node: Node, run: asyncio.Task[None], timeout_s: float = 5.0) -> None:
    node.stop_claiming()
    await asyncio.wait_for(run, timeout_s)


def alive_since(before: set[asyncio.Task[Any]]) -> list[str]:
    """Names of the asyncio tasks created since ``before`` was taken that are still alive."""
    current = asyncio.current_task()
    return sorted(t.get_name() for t in asyncio.all_tasks() - before if not t.done() and t is not current)


# --- public case: a lease lost to expiry ----------------------------------------------------


async def test_late_commit_after_lease_expiry_is_rejected_and_writes_nothing(
    make_store: Any, pipeline: dict[str, Any]
) -> None:
    """Lease 0.3 s, A without renewal sends for 1.0 s; B takes over after expiry and completes."""
    store = await make_store(clock=None)
    [enqueued] = await store.enqueue_many([NewTask(queue=QUEUE, payload="m1", partition_key="conv-1")])
    task_id = enqueued.task.id
    a_started = asyncio.Event()
    a_times: dict[str, float] = {}
    b_seen: list[tuple[float, int, str | None]] = []

    async def send_a(task: Task) -> str:
        a_times["start"] = time.monotonic()
        a_started.set()
        await asyncio.sleep(1.0)
        a_times["end"] = time.monotonic()
        return "A"

    async def send_b(task: Task) -> str:
        b_seen.append((time.monotonic(), task.attempts, task.lease_owner))
        return "B"

    a = Node(
        store,
        send_a,
        node_id="A",
        config=NodeConfig(queue=QUEUE, lease_s=0.3, renew_leases=False, max_in_flight=1, **FAST_IDLE, **pipeline),
    )
    b = Node(store, send_b, node_id="B", config=NodeConfig(queue=QUEUE, lease_s=5.0, **FAST_IDLE, **pipeline))
    a_launched = time.monotonic()
    run_a = start(a)
    await asyncio.wait_for(a_started.wait(), 5.0)
    run_b = start(b)

    async def done() -> bool:
        return (await store.get(task_id)).status is TaskStatus.DONE

    await wait_until(done, 3.0, "B to complete the task")
    await stop(b, run_b)
    await stop(a, run_a)  # A's send finishes at 1.0 s and its commit is refused

    [(b_at, b_attempts, b_owner)] = b_seen
    # B got it once A's lease (granted after a_launched) expired, not before (store clocks tick in 1 ms)
    assert b_at - a_launched >= 0.3 - 0.001
    assert b_at - a_times["start"] <= 0.6
    assert (b_attempts, b_owner) == (2, "B")
    assert a_times["end"] - a_times["start"] >= 1.0  # A's send ran to its end (no watchdog)...
    task = await store.get(task_id)
    assert (task.status, task.result, task.attempts, task.last_error) == (TaskStatus.DONE, "B", 2, None)
    assert task.version == 3  # claimed by A, claimed by B, completed by B: ...A's commit wrote nothing
    assert (a.state().sent, a.state().committed, a.state().conflicts) == (1, 0, 1)
    assert (b.state().committed, b.state().conflicts) == (1, 0)
    events = store.events.snapshot()
    assert events.get("lease_expired") == 1  # the lost lease is counted once
    assert events.get("stale_commit_rejected") == 1  # A's late commit
    assert events.get("commits") == 1
    assert "lease_lost" not in events  # A had no watchdog to notice


async def test_watchdog_cancels_a_send_whose_task_was_taken_over(db_path: Path) -> None:
    """Lease 0.3 s renewed every 0.1 s; the task is taken from A at 0.2 s: A's send is cancelled by ~0.35 s."""
    # The thief is a second connection whose clock runs 1 s ahead: to it, A's lease (renewed to
    # 0.3 s ahead) has expired, so its claim takes the task over in one transaction.
    async with SQLiteStore(db_path) as store, SQLiteStore(db_path, clock=lambda: time.time() + 1.0) as thief:
        [enqueued] = await store.enqueue_many([NewTask(queue=QUEUE, payload={"account": 7}, partition_key="c")])
        task_id = enqueued.task.id
        times: dict[str, float] = {}
        started = asyncio.Event()

        async def send(task: Task) -> str:
            times["start"] = time.monotonic()
            started.set()
            try:
                await asyncio.sleep(5.0)
            except asyncio.CancelledError:
                times["cancelled"] = time.monotonic()
                raise
            return "A"

        a = Node(
            store,
            send,
            node_id="A",
            config=NodeConfig(queue=QUEUE, lease_s=0.3, lock_ttl_s=10.0, max_in_flight=1, **FAST_IDLE),
            lock_key=lambda t: f"account:{t.payload['account']}",
        )
        run_a = start(a)
        await asyncio.wait_for(started.wait(), 5.0)
        assert [info.holder for info in await store.list_locks()] == ["A"]
        await asyncio.sleep(0.2 - (time.monotonic() - times["start"]))
        times["taking"] = time.monotonic()
        [stolen] = await thief.claim(QUEUE, node_id="thief", lease_s=30.0)
        times["taken"] = time.monotonic()
        assert (stolen.id, stolen.attempts) == (task_id, 2)

        async def cancelled() -> bool:
            return "cancelled" in times

        await wait_until(cancelled, 2.0, "A's send to be cancelled")

        async def lock_free() -> bool:
            return await store.list_locks() == []

        await wait_until(lock_free, 1.0, "A to let its lock go")  # well before its 10 s TTL
        await stop(a, run_a)

    assert times["taken"] - times["start"] < 0.3
    assert times["taking"] <= times["cancelled"]
    # the next renewal (every 0.1 s) finds the lease gone and cancels the send at once
    assert times["cancelled"] - times["start"] <= 0.35 + 0.1, times["cancelled"] - times["start"]
    state = a.state()
    assert (state.sent, state.committed, state.failed, state.conflicts) == (0, 0, 0, 1)
    assert store.events.get("lease_lost") == 1
    assert store.events.get("commits") == 0
    assert thief.events.get("lease_expired") == 1
    async with SQLiteStore(db_path) as check:
        task = await check.get(task_id)
    assert (task.status, task.lease_owner, task.lease_token, task.result) == (
        TaskStatus.RUNNING,
        "thief",
        stolen.lease_token,
        None,
    )
    assert task.version == stolen.version  # A wrote nothing after the takeover


# --- public case: hard cancellation ---------------------------------------------------------


async def test_hard_cancelled_node_hands_back_its_task_and_lock_and_reraises(make_store: Any) -> None:
    store = await make_store(clock=None)
    [enqueued] = await store.enqueue_many([NewTask(queue=QUEUE, payload={"account": 1}, partition_key="conv-1")])
    task_id = enqueued.task.id
    started = asyncio.Event()

    async def send_forever(task: Task) -> str:
        started.set()
        await asyncio.Event().wait()
        return "never"

    lock_key = lambda t: f"account:{t.payload['account']}"  # noqa: E731
    a = Node(store, send_forever, node_id="A", config=NodeConfig(queue=QUEUE, lock_ttl_s=10.0), lock_key=lock_key)
    before = asyncio.all_tasks()
    began = time.monotonic()
    run_a = start(a)
    await asyncio.wait_for(started.wait(), 5.0)
    running = await store.get(task_id)
    assert (running.status, running.lease_owner, running.attempts) == (TaskStatus.RUNNING, "A", 1)
    [lock] = await store.list_locks()
    assert (lock.name, lock.holder) == ("account:1", "A")
    helpers = alive_since(before)
    assert len(helpers) >= 3, helpers  # the node, its task handler and the renewal (watchdog) of lease and lock

    await asyncio.sleep(0.2 - (time.monotonic() - began))
    run_a.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run_a  # the cancellation reaches whoever awaits the node
    assert time.monotonic() - began <= 0.7
    assert a.state().status is NodeStatus.STOPPED
    # By 0.7 s: the task is pending with no failure recorded, the lock free, no helper task left.
    await asyncio.sleep(0.7 - (time.monotonic() - began))
    task = await store.get(task_id)
    # Its one send was cut short and may have gone out: the attempt stays counted.
    assert (task.status, task.attempts, task.last_error, task.lease_owner) == (TaskStatus.PENDING, 1, None, None)
    assert await store.list_locks() == []
    assert alive_since(before) == []  # no keeper or watchdog, no handler left behind
    assert a.state().handed_back == 1
    assert a.state().failed == 0
    assert store.events.get("retries") == 0

    async def send_b(task: Task) -> str:
        return "B"

    b = Node(store, send_b, node_id="B", config=NodeConfig(queue=QUEUE, **FAST_IDLE), lock_key=lock_key)
    run_b = start(b)

    async def done() -> bool:
        return (await store.get(task_id)).status is TaskStatus.DONE

    await wait_until(done, 2.0, "B to complete the handed-back task")
    await stop(b, run_b)
    task = await store.get(task_id)
    assert (task.result, task.attempts, task.last_error) == ("B", 2, None)  # B's send could tell it may repeat
    lease_b = await store.try_acquire_lock("account:1", ttl_s=1.0)
    assert lease_b.fencing_token == 3  # A's acquisition was 1, B's was 2: B got the lock at once


async def test_a_store_closed_under_a_running_send_fails_the_node_with_a_typed_error(make_store: Any) -> None:
    store = await make_store(clock=None)
    await store.enqueue_many([NewTask(queue=QUEUE, payload=1, partition_key="conv-1")])
    started, release = asyncio.Event(), asyncio.Event()

    async def send(task: Task) -> str:
        started.set()
        await release.wait()
        return "sent"

    node = Node(store, send, node_id="A", config=NodeConfig(queue=QUEUE, **FAST_IDLE), lock_key=lambda t: "acct")
    before = asyncio.all_tasks()
    run = start(node)
    await asyncio.wait_for(started.wait(), 5.0)
    await store.close()
    release.set()  # the commit finds the store closed
    with pytest.raises(StoreClosedError):  # the error itself, not an ExceptionGroup
        await asyncio.wait_for(run, 5.0)
    assert node.state().status is NodeStatus.FAILED
    node.stop_claiming()
    assert node.state().status is NodeStatus.FAILED  # stays failed

    async def nothing_alive() -> bool:
        return alive_since(before) == []

    # The store's lock watchdog ends 0.2 s after its last guard (later on a loaded machine).
    await wait_until(nothing_alive, timeout_s=10.0, what="the node's asyncio tasks to end")


# --- failures -----------------------------------------------------------------------------


@pytest.mark.quiet  # the retries' gaps are judged to 250 ms
async def test_send_exception_retries_with_backoff_then_dead_letters(make_store: Any, pipeline: dict[str, Any]) -> None:
    store = await make_store(clock=None)
    [enqueued] = await store.enqueue_many([NewTask(queue=QUEUE, payload=1, max_attempts=3)])
    calls: list[float] = []

    async def send(task: Task) -> None:
        calls.append(time.monotonic())
        raise ValueError("boom")

    policy = RetryPolicy(base_s=0.1, factor=2.0, jitter=0.0)  # the attempts: NewTask(max_attempts=3)
    node = Node(store, send, node_id="n1", config=NodeConfig(queue=QUEUE, retry=policy, **FAST_IDLE, **pipeline))
    run = start(node)

    async def dead() -> bool:
        return (await store.get(enqueued.task.id)).status is TaskStatus.DEAD

    await wait_until(dead, 5.0, "the task to be dead-lettered")
    await asyncio.sleep(0.1)  # a node that kept sending would show up here
    await stop(node, run)
    assert len(calls) == 3
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert 0.1 <= gaps[0] <= 0.1 + 0.25  # first failure: base_s
    assert 0.2 <= gaps[1] <= 0.2 + 0.25  # second: base_s * factor
    task = await store.get(enqueued.task.id)
    assert (task.attempts, task.last_error, task.result) == (3, "ValueError: boom", None)
    assert (node.state().failed, node.state().committed, node.state().sent) == (3, 0, 3)
    events = store.events.snapshot()
    assert (events.get("retries"), events.get("dead_lettered"), events.get("commits", 0)) == (2, 1, 0)


async def test_semaphore_permits_finishing_out_of_order_all_commit(make_store: Any) -> None:
    """Holders of a semaphore finish in any order: an older permit's commit is not a stale write."""
    store = await make_store(clock=None)
    await store.enqueue_many([NewTask(queue=QUEUE, payload=i, partition_key=f"k{i}") for i in range(20)])
    inside = 0
    most_inside = 0
    sent: list[int] = []

    async def send(task: Task) -> None:
        nonlocal inside, most_inside
        inside += 1
        most_inside = max(most_inside, inside)
        await asyncio.sleep(0.05 if task.payload % 2 == 0 else 0.005)  # the first permit often finishes last
        sent.append(task.payload)
        inside -= 1

    config = NodeConfig(queue=QUEUE, lock_permits=2, **FAST_IDLE)
    nodes = [Node(store, send, node_id=f"n{i}", config=config, lock_key=lambda _t: "account:a") for i in range(2)]
    runs = [start(node) for node in nodes]

    async def drained() -> bool:
        return (await store.stats(QUEUE)).counts.get("done", 0) == 20

    await wait_until(drained, 10.0, "every task done")
    for node, run in zip(nodes, runs, strict=True):
        await stop(node, run)
    assert sorted(sent) == list(range(20))  # each sent once: no commit was refused and re-sent
    assert most_inside == 2  # the two permits were used at once
    assert sum(node.state().conflicts for node in nodes) == 0
    assert sum(node.state().committed for node in nodes) == 20


async def test_send_timeout_counts_as_a_failure(make_store: Any, pipeline: dict[str, Any]) -> None:
    store = await make_store(clock=None)
    results = await store.enqueue_many(
        [
            NewTask(queue=QUEUE, payload="slow-then-fast", partition_key="a", max_attempts=3),
            NewTask(queue=QUEUE, payload="always-slow", partition_key="b", max_attempts=1),
        ]
    )
    flaky_id, slow_id = (r.task.id for r in results)
    attempts: dict[int, list[tuple[float, float | None]]] = defaultdict(list)

    async def send(task: Task) -> str:
        began = time.monotonic()
        if task.payload == "always-slow" or len(attempts[task.id]) == 0:
            try:
                await asyncio.sleep(2.0)
            except asyncio.CancelledError:
                attempts[task.id].append((began, time.monotonic()))
                raise
        attempts[task.id].append((began, None))
        return "ok"

    policy = RetryPolicy(base_s=0.05, jitter=0.0)
    config = NodeConfig(queue=QUEUE, send_timeout_s=0.2, retry=policy, **FAST_IDLE, **pipeline)
    node = Node(store, send, node_id="n1", config=config)
    run = start(node)

    async def settled() -> bool:
        statuses = {(await store.get(i)).status for i in (flaky_id, slow_id)}
        return statuses == {TaskStatus.DONE, TaskStatus.DEAD}

    await wait_until(settled, 5.0, "both tasks to settle")
    await stop(node, run)
    flaky, slow = await store.get(flaky_id), await store.get(slow_id)
    assert (flaky.status, flaky.attempts, flaky.result) == (TaskStatus.DONE, 2, "ok")
    assert (slow.status, slow.attempts, slow.last_error) == (TaskStatus.DEAD, 1, "TimeoutError")
    for task_id in (flaky_id, slow_id):
        began, cancelled_at = attempts[task_id][0]
        assert cancelled_at is not None
        # Cut at send_timeout_s: the timeout's clock starts just before the send records
        # `began`, so the measured time may fall short of 0.2 s by that instant (< 10 ms).
        assert 0.19 <= cancelled_at - began <= 0.45
    assert attempts[flaky_id][1][1] is None  # the retry ran to its end
    assert (node.state().failed, node.state().committed, node.state().conflicts) == (2, 1, 0)
    events = store.events.snapshot()
    assert (events.get("retries"), events.get("dead_lettered"), events.get("commits")) == (1, 1, 1)


@pytest.mark.parametrize("source", ["send", "lock_key"])
async def test_a_cancelled_error_raised_by_the_send_itself_is_a_failed_send(make_store: Any, source: str) -> None:
    """A ``CancelledError`` nothing of the node's asked for (a library the send awaits was cancelled
    by something else) is a failed send: retried, then dead-lettered; the node goes on serving its
    partitions. (It used to stop the node silently: its partitions were never handed over.)"""
    store = await make_store(clock=None)
    node_ids = ["node-a", "node-b"]
    keys = [
        k
        for k in (f"conv-{i}" for i in range(1000))
        if owner_of(partition_of(k, store.partitions), node_ids) == "node-a"
    ]
    dead, flaky = (
        r.task.id
        for r in await store.enqueue_many(
            [
                NewTask(queue=QUEUE, payload="always", partition_key=keys[0], max_attempts=1),
                NewTask(queue=QUEUE, payload="once", partition_key=keys[1], max_attempts=3),
            ]
        )
    )
    raised: Counter[str] = Counter()

    def cancelled_by_itself(task: Task) -> None:
        if task.payload == "always" or (task.payload == "once" and not raised["once"]):
            raised[task.payload] += 1
            raise asyncio.CancelledError("upstream gone") if task.payload == "always" else asyncio.CancelledError()

    async def send(task: Task) -> str:
        await asyncio.sleep(0)
        if source == "send":
            cancelled_by_itself(task)
        return "sent"

    def lock_key(task: Task) -> str:
        if source == "lock_key":
            cancelled_by_itself(task)
        return f"account:{task.payload}"

    config = NodeConfig(queue=QUEUE, retry=RetryPolicy(base_s=0.01, factor=1.0, jitter=0.0), **FAST_IDLE)
    async with Runtime(store, send=send, node_ids=node_ids, config=config, lock_key=lock_key) as runtime:
        assert await runtime.wait_until_drained(timeout_s=3.0, poll_s=0.01)
        # node-a still serves its partitions: later tasks in them are sent too
        await store.enqueue_many([NewTask(queue=QUEUE, payload=i, partition_key=k) for i, k in enumerate(keys[2:12])])
        assert await runtime.wait_until_drained(timeout_s=3.0, poll_s=0.01)
        assert [s.status for s in runtime.states()] == [NodeStatus.RUNNING] * 2
    a, b = runtime.states()
    assert (a.status, b.status) == (NodeStatus.STOPPED, NodeStatus.STOPPED)
    assert (a.failed, a.handed_back, b.claimed) == (2, 0, 0)  # every task was node-a's
    assert a.committed == 11
    assert raised == Counter({"always": 1, "once": 1})  # never sent again after the dead letter
    task = await store.get(dead)
    assert (task.status, task.attempts) == (TaskStatus.DEAD, 1)
    assert task.last_error == f"{source} raised CancelledError without being cancelled: upstream gone"
    task = await store.get(flaky)
    assert (task.status, task.attempts, task.result) == (TaskStatus.DONE, 2, "sent")
    events = store.events.snapshot()
    assert (events.get("retries"), events.get("dead_lettered"), events.get("send_interrupted", 0)) == (1, 1, 0)


async def test_a_task_handling_cancelled_without_the_node_being_cancelled_fails_the_node(make_store: Any) -> None:
    """Should anything but the node's cancellation cancel a task's handling (a bug), the node fails
    loudly instead of stopping as if it had been cancelled."""
    store = await make_store(clock=None)
    await store.enqueue(QUEUE, 1)
    node = Node(store, lambda t: asyncio.sleep(0), node_id="n1", config=NodeConfig(queue=QUEUE, **FAST_IDLE))

    async def handle_task(flight: Any) -> None:
        raise asyncio.CancelledError

    node._handle_task = handle_task  # type: ignore[method-assign]
    with pytest.raises(ExceptionGroup) as raised:  # a RuntimeError (a bug), in the task group's group
        await asyncio.wait_for(node.run(), 5.0)
    assert raised.group_contains(
        RuntimeError, match=r"^node 'n1': the handling of tasks \[1\] ended cancelled although"
    )
    assert node.state().status is NodeStatus.FAILED


class _StrRaises(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


class _Unprintable(_StrRaises):
    def __repr__(self) -> str:
        raise RuntimeError("no repr either")


@pytest.mark.parametrize("source", ["send", "lock_key"])
async def test_an_exception_whose_str_raises_goes_to_the_retry_policy(make_store: Any, source: str) -> None:
    """The error text falls back to repr(), then to the type name; the node goes on."""
    store = await make_store(clock=None)
    results = await store.enqueue_many(
        [
            NewTask(queue=QUEUE, payload="str", partition_key="a", max_attempts=2),
            NewTask(queue=QUEUE, payload="unprintable", partition_key="b", max_attempts=1),
            NewTask(queue=QUEUE, payload="ok", partition_key="c"),
        ]
    )
    bad_str, unprintable, ok = (r.task.id for r in results)

    def raise_for(task: Task) -> None:
        if task.payload == "str":
            raise _StrRaises("x")
        if task.payload == "unprintable":
            raise _Unprintable()

    async def send(task: Task) -> str:
        if source == "send":
            raise_for(task)
        return "sent"

    def lock_key(task: Task) -> str:
        if source == "lock_key":
            raise_for(task)
        return "account:1"

    config = NodeConfig(queue=QUEUE, retry=RetryPolicy(base_s=0.01, factor=1.0, jitter=0.0), **FAST_IDLE)
    node = Node(store, send, node_id="n1", config=config, lock_key=lock_key)
    run = start(node)

    async def settled() -> bool:
        counts = (await store.stats(QUEUE)).counts
        return counts[TaskStatus.PENDING] + counts[TaskStatus.RUNNING] == 0

    await wait_until(settled, 3.0, "every task to settle")
    assert node.state().status is NodeStatus.RUNNING
    await stop(node, run)
    assert [(t.status, t.attempts, t.last_error) for t in [await store.get(i) for i in (bad_str, unprintable)]] == [
        (TaskStatus.DEAD, 2, "_StrRaises('x')"),
        (TaskStatus.DEAD, 1, "_Unprintable"),
    ]
    assert (await store.get(ok)).status is TaskStatus.DONE
    assert (node.state().failed, node.state().committed) == (3, 1)
    events = store.events.snapshot()
    assert (events.get("retries"), events.get("dead_lettered")) == (1, 2)


# --- what a send can see ----------------------------------------------------------------------


async def test_current_delivery_gives_the_lock_lease_and_a_per_conversation_context(make_store: Any) -> None:
    store = await make_store(clock=None)
    plan = [("c1", 1), ("c2", 2), ("c1", 1), ("c3", 1), ("c1", 1), ("c2", 2)]
    ids = [
        r.task.id
        for r in await store.enqueue_many(
            [NewTask(queue=QUEUE, payload={"account": acct}, partition_key=conv) for conv, acct in plan]
        )
    ]
    seen: list[dict[str, Any]] = []
    contexts: dict[str, dict[str, Any]] = {}

    async def send(task: Task) -> str:
        delivery = current_delivery()
        delivery.context["sends"] = delivery.context.get("sends", 0) + 1
        contexts.setdefault(task.partition_key, delivery.context)
        assert delivery.lock is not None
        live = [(info.name, info.fencing_token) for info in await store.list_locks(delivery.lock.name)]
        seen.append(
            {
                "id": task.id,
                "node": delivery.node_id,
                "same_task": delivery.task == task,
                "lock": delivery.lock.name,
                "token": delivery.lock.fencing_token,
                "held": live == [(delivery.lock.name, delivery.lock.fencing_token)],
                "context_is_kept": contexts[task.partition_key] is delivery.context,
                "sends": delivery.context["sends"],
            }
        )
        await asyncio.sleep(0.01)
        return "ok"

    node = Node(
        store,
        send,
        node_id="n1",
        config=NodeConfig(queue=QUEUE, **FAST_IDLE),
        lock_key=lambda t: f"account:{t.payload['account']}",
    )
    with pytest.raises(
        NoDeliveryError, match=r"^current_delivery\(\) is only available inside a send called by a node$"
    ):
        current_delivery()  # outside a send
    assert issubclass(NoDeliveryError, LookupError)  # as documented before it had a class of its own
    assert issubclass(NoDeliveryError, CoordError)
    run = start(node)

    async def drained() -> bool:
        return (await store.stats(QUEUE)).counts[TaskStatus.DONE] == len(ids)

    await wait_until(drained, 5.0, "every task to be done")
    await stop(node, run)
    assert sorted(s["id"] for s in seen) == ids
    assert all(s["node"] == "n1" and s["same_task"] and s["context_is_kept"] for s in seen)
    assert all(s["held"] for s in seen)  # the lease in the delivery is the one the store holds during the send
    by_conv: dict[str, list[int]] = defaultdict(list)
    for s in sorted(seen, key=lambda s: s["id"]):
        by_conv[plan[ids.index(s["id"])][0]].append(s["sends"])
    assert by_conv == {"c1": [1, 2, 3], "c2": [1, 2], "c3": [1]}  # the context lives on between sends
    assert len({id(c) for c in contexts.values()}) == 3  # one context per conversation
    by_lock: dict[str, list[int]] = defaultdict(list)
    for s in seen:  # in send order
        by_lock[s["lock"]].append(s["token"])
    assert {name: len(tokens) for name, tokens in by_lock.items()} == {"account:1": 4, "account:2": 2}
    for tokens in by_lock.values():
        assert tokens == sorted(tokens)  # fencing tokens never go back in send order
        assert tokens[0] >= 1
    # the commit carried the fencing token to the lock's resource
    for name, tokens in by_lock.items():
        fence = await store.read_fence(name)
        assert fence is not None
        assert fence.fencing_token == max(tokens)


async def test_affinity_context_is_a_bounded_lru(make_store: Any) -> None:
    store = await make_store(clock=None)
    convs = ["c1", "c2", "c1", "c3", "c2", "c1"]
    await store.enqueue_many([NewTask(queue=QUEUE, payload=i, partition_key=c) for i, c in enumerate(convs)])
    order: list[tuple[str, int]] = []

    async def send(task: Task) -> None:
        context = current_delivery().context
        context["n"] = context.get("n", 0) + 1
        order.append((task.partition_key, context["n"]))

    # claim_next off: one task per claim, in enqueue order across conversations
    config = NodeConfig(
        queue=QUEUE, max_in_flight=1, claim_batch=1, affinity_cache_size=2, claim_next=False, **FAST_IDLE
    )
    node = Node(store, send, node_id="n1", config=config)
    run = start(node)

    async def drained() -> bool:
        return (await store.stats(QUEUE)).counts[TaskStatus.DONE] == len(convs)

    await wait_until(drained, 5.0, "every task to be done")
    await stop(node, run)
    # one at a time, in enqueue order; c1 is evicted by c3 (the cache keeps 2), then c2 by c1
    assert order == [("c1", 1), ("c2", 1), ("c1", 2), ("c3", 1), ("c2", 1), ("c1", 1)]


# --- strategy switches -------------------------------------------------------------------------

COMMIT_LOG_SQL = """
CREATE TABLE commit_log (task_id INTEGER NOT NULL);
CREATE TRIGGER commit_logger AFTER UPDATE OF status ON coord_tasks WHEN NEW.status = 'done'
BEGIN INSERT INTO commit_log (task_id) VALUES (NEW.id); END;
"""


async def drain_with(
    db_path: Path, config: NodeConfig, *, nodes: int, tasks: int, ablation: Ablation = FULL, send_s: float = 0.3
) -> tuple[Counter[int], Counter[int]]:
    """Run ``nodes`` nodes (no membership, layers as ``ablation`` says) over ``tasks`` sends of ``send_s``;
    return sends and commits per task id."""
    async with SQLiteStore(db_path) as store:
        with sqlite3.connect(db_path, isolation_level=None) as db:
            db.executescript(COMMIT_LOG_SQL)
        sends: Counter[int] = Counter()

        async def send(task: Task) -> None:
            sends[task.id] += 1
            await asyncio.sleep(send_s)

        workers = [
            Node(
                store,
                send,
                node_id=f"n{i}",
                config=config,
                lock_key=lambda t: f"conv:{t.partition_key}",
                _ablation=ablation,
            )
            for i in range(nodes)
        ]
        runs = [start(w) for w in workers]
        await asyncio.sleep(0.1)  # every node idle, waiting for work
        results = await store.enqueue_many(
            [NewTask(queue=QUEUE, payload=i, partition_key=f"conv-{i}") for i in range(tasks)]
        )

        async def drained() -> bool:
            counts = (await store.stats(QUEUE)).counts
            return counts[TaskStatus.PENDING] == counts[TaskStatus.RUNNING] == 0

        await wait_until(drained, 20.0, "the queue to drain")
        for w, r in zip(workers, runs, strict=True):
            await stop(w, r)
        assert {r.task.id for r in results} == set(sends)
    with sqlite3.connect(db_path) as db:
        commits = Counter(task_id for (task_id,) in db.execute("SELECT task_id FROM commit_log"))
    return sends, commits


@pytest.mark.exclusive
async def test_with_every_layer_off_duplicates_happen_and_with_all_on_they_do_not(tmp_path: Path) -> None:
    # Leases shorter than a send, and never renewed. Not much shorter than a claim under load,
    # though: a claim answered past its tasks' local deadline hands them all back unsent, and
    # with 0.2 s leases the hand-backs slowed the claims enough to repeat that for 20 s.
    off = NodeConfig(queue=QUEUE, lease_s=0.5, renew_leases=False, **FAST_IDLE)
    every_layer_off = Ablation(locks=False, version_checks=False, partitioning=False)
    sends, commits = await drain_with(
        tmp_path / "off.db", off, nodes=8, tasks=100, ablation=every_layer_off, send_s=0.8
    )
    assert max(sends.values()) > 1, "no duplicate send with every layer off: the switches do nothing"
    assert max(commits.values()) > 1  # and the same task was committed more than once
    on = NodeConfig(queue=QUEUE, lease_s=0.5, **FAST_IDLE)  # every layer on, leases renewed
    sends, commits = await drain_with(tmp_path / "on.db", on, nodes=8, tasks=100)
    assert set(sends.values()) == {1}
    assert set(commits.values()) == {1}
    assert len(commits) == 100


# --- ordering, restarts, partition moves ---------------------------------------------------------


async def test_conversation_order_holds_across_a_retry(make_store: Any) -> None:
    store = await make_store(clock=None)
    plan = ["c", "c", "c", "d", "d"]
    ids = [
        r.task.id
        for r in await store.enqueue_many(
            [NewTask(queue=QUEUE, payload=i, partition_key=k) for i, k in enumerate(plan)]
        )
    ]
    sends: list[tuple[int, int, str]] = []

    async def send(task: Task) -> None:
        if task.id == ids[0] and task.attempts == 1:
            sends.append((task.id, task.attempts, "failed"))
            raise RuntimeError("first try fails")
        sends.append((task.id, task.attempts, "ok"))
        await asyncio.sleep(0.01)

    policy = RetryPolicy(base_s=0.2, jitter=0.0)
    node = Node(store, send, node_id="n1", config=NodeConfig(queue=QUEUE, retry=policy, **FAST_IDLE))
    run = start(node)

    async def drained() -> bool:
        return (await store.stats(QUEUE)).counts[TaskStatus.DONE] == len(ids)

    await wait_until(drained, 5.0, "every task to be done")
    await stop(node, run)
    c1, c2, c3, d1, d2 = ids
    conv_c = [s for s in sends if s[0] in (c1, c2, c3)]
    assert conv_c == [(c1, 1, "failed"), (c1, 2, "ok"), (c2, 1, "ok"), (c3, 1, "ok")]
    # the other conversation did not wait for c's backoff
    assert sends.index((d2, 1, "ok")) < sends.index((c1, 2, "ok"))
    assert [s for s in sends if s[0] in (d1, d2)] == [(d1, 1, "ok"), (d2, 1, "ok")]


async def test_tasks_waiting_for_a_lock_take_their_turns_oldest_first(make_store: Any) -> None:
    """Of the tasks a node has queued for one lock, the oldest (lowest id) takes the next turn.

    The oldest task here becomes due after the younger ones are already queued for the lock
    (held elsewhere); it still goes ahead of them, not last as in arrival order.
    """
    store = await make_store(clock=None)
    specs = [NewTask(queue=QUEUE, payload={"account": "x"}, partition_key="k0", delay_s=0.3)]
    specs += [NewTask(queue=QUEUE, payload={"account": "x"}, partition_key=f"k{i}") for i in range(1, 5)]
    ids = [r.task.id for r in await store.enqueue_many(specs)]
    elsewhere = await store.try_acquire_lock("account:x", ttl_s=10.0, permits=1, holder="another-process")
    assert elsewhere.__class__.__name__ == "Lease"
    sent: list[int] = []

    async def send(task: Task) -> None:
        sent.append(task.id)

    config = NodeConfig(queue=QUEUE, lock_wait_s=10.0, **FAST_IDLE)
    node = Node(store, send, node_id="n1", config=config, lock_key=lambda task: f"account:{task.payload['account']}")
    run = start(node)

    async def all_claimed() -> bool:
        return (await store.stats(QUEUE)).counts[TaskStatus.RUNNING] == len(ids)

    await wait_until(all_claimed, 5.0, "every task to be claimed (the delayed one last)")
    await asyncio.sleep(0.05)  # the last one joins the lock's queue
    assert sent == []
    await store.release_lock(elsewhere)

    async def drained() -> bool:
        return (await store.stats(QUEUE)).counts[TaskStatus.DONE] == len(ids)

    await wait_until(drained, 5.0, "every task to be done")
    await stop(node, run)
    # The first task to want the lock holds the turn that acquires it (it polls the store);
    # the others queue in the process, where the oldest, due last, goes first, and the fresh
    # lease's first turn is the oldest's too. In arrival order it would have been last:
    # ids[1:] + ids[:1]; before the fresh lease went to it, second: [ids[1], ids[0], *ids[2:]].
    assert sent == ids


async def test_a_task_handed_back_for_its_busy_lock_is_no_lost_lease(make_store: Any, monkeypatch: Any) -> None:
    """A task whose lock stayed busy past ``lock_wait_s`` goes back by the node's choice.

    A lease renewal that runs while that hand-back is under way finds the task pending: that is
    no lost lease (``lease_lost`` feeds the default ``lost_leases`` alert). Before, the flight
    stayed renewable until the hand-back returned, and such renewals were counted: 130 in a
    fault-free demo, whose leases (2 s) are shorter than its lock wait (5 s).
    """
    store = await make_store(clock=None)
    [enqueued] = await store.enqueue_many([NewTask(queue=QUEUE, payload={"account": "x"}, partition_key="k")])
    elsewhere = await store.try_acquire_lock("account:x", ttl_s=30.0, permits=1, holder="another-process")
    assert elsewhere.__class__.__name__ == "Lease"
    handed_back = asyncio.Event()
    release = store.release

    async def slow_release(task: Task, *, delay_s: float = 0.0, count_attempt: bool = False) -> Task:
        out: Task = await release(task, delay_s=delay_s, count_attempt=count_attempt)
        handed_back.set()
        await asyncio.sleep(0.6)  # the hand-back is still under way at the keeper's next renewals (every 0.2 s)
        return out

    monkeypatch.setattr(store, "release", slow_release)
    sent: list[int] = []

    async def send(task: Task) -> None:
        sent.append(task.id)

    config = NodeConfig(queue=QUEUE, lease_s=0.6, lock_wait_s=0.2, busy_requeue_s=30.0, **FAST_IDLE)
    node = Node(store, send, node_id="n1", config=config, lock_key=lambda task: f"account:{task.payload['account']}")
    run = start(node)
    await asyncio.wait_for(handed_back.wait(), 5.0)
    await asyncio.sleep(0.8)  # the slow hand-back, and a renewal after it
    await stop(node, run)
    assert sent == []
    stats = await store.stats(QUEUE)
    assert stats.counts[TaskStatus.PENDING] == 1  # back, due after busy_requeue_s
    assert store.events.get("lease_lost") == 0
    assert enqueued.task.id not in node._in_flight


async def test_a_restarted_node_id_does_not_keep_its_previous_lifes_leases(make_store: Any) -> None:
    store = await make_store(clock=None)
    [enqueued] = await store.enqueue_many([NewTask(queue=QUEUE, payload=1, partition_key="c")])
    claimed_at = time.monotonic()
    [old] = await store.claim(QUEUE, node_id="n1", lease_s=0.5)  # the previous life of n1, which then died
    seen: list[tuple[float, str | None, int]] = []

    async def send(task: Task) -> None:
        seen.append((time.monotonic(), task.lease_token, task.attempts))

    async with Runtime(store, send=send, node_ids=["n1"], config=NodeConfig(queue=QUEUE, **FAST_IDLE)) as runtime:
        assert await runtime.wait_until_drained(timeout_s=5.0, poll_s=0.01)
    [(sent_at, token, attempts)] = seen
    assert sent_at - claimed_at >= 0.5  # the new n1 waited for the old lease to expire, never renewed it
    assert token != old.lease_token
    assert attempts == 2
    assert store.events.get("lease_expired") == 1
    assert (await store.get(enqueued.task.id)).status is TaskStatus.DONE


async def enqueue_and_wait_done(store: Any, key: str, *, payload: Any) -> None:
    """Enqueue one task of conversation ``key`` and wait (up to 3 s) until it is done."""
    [r] = await store.enqueue_many([NewTask(queue=QUEUE, payload=payload, partition_key=key)])

    async def done() -> bool:
        return (await store.get(r.task.id)).status is TaskStatus.DONE

    await wait_until(done, 3.0, "the conversation's task to be done")


async def join_and_wait(membership: Membership, node_id: str) -> None:
    """Join ``node_id`` and wait (up to 2 s per change of the view) until the view holds it."""
    membership.join(node_id)
    while node_id not in membership.view.node_ids:
        await membership.wait_changed(membership.view.version, timeout_s=2.0)


class ClaimViews:
    """A store whose claims record the membership view version each one started under."""

    def __init__(self, store: Any, membership: Membership) -> None:
        self._store = store
        self._membership = membership
        self.finished: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def claim(self, *args: Any, **kwargs: Any) -> Any:
        version = self._membership.view.version  # the node took its partitions from this view
        try:
            return await self._store.claim(*args, **kwargs)
        finally:
            self.finished.append(version)


async def test_affinity_context_is_dropped_when_the_conversation_moves(make_store: Any) -> None:
    store = await make_store(clock=None)
    node_ids = ["node-a", "node-b"]
    key = next(
        k
        for k in (f"conv-{i}" for i in range(10_000))
        if owner_of(partition_of(k, store.partitions), node_ids) == "node-b"
    )
    sends: list[tuple[str, int]] = []

    async def send(task: Task) -> None:
        delivery = current_delivery()
        delivery.context["n"] = delivery.context.get("n", 0) + 1
        sends.append((delivery.node_id, delivery.context["n"]))

    async def send_one() -> None:
        await enqueue_and_wait_done(store, key, payload=len(sends))

    config = NodeConfig(queue=QUEUE, **FAST_IDLE)
    async with Membership(store, ttl_s=0.6, interval_s=0.1) as membership:
        await join_and_wait(membership, "node-a")
        a_store = ClaimViews(store, membership)
        a = Node(a_store, send, node_id="node-a", config=config, membership=membership)
        run_a = start(a)
        await send_one()
        await send_one()
        assert sends == [("node-a", 1), ("node-a", 2)]  # alone, node-a owns the conversation and keeps its context

        await join_and_wait(membership, "node-b")
        b = Node(store, send, node_id="node-b", config=config, membership=membership)
        run_b = start(b)
        # A claim node-a sent under the old view may still be at the store and would take
        # the next task: enqueue once one of its claims under the new view has finished.
        moved_at = membership.view.version

        async def claimed_under_new_view() -> bool:
            return max(a_store.finished) >= moved_at

        await wait_until(claimed_under_new_view, 3.0, "node-a to claim under the new view")
        await send_one()
        assert sends[-1] == ("node-b", 1)  # the conversation moved to node-b: a fresh context there

        await stop(b, run_b)
        await membership.leave("node-b")
        assert membership.view.node_ids == ("node-a",)
        await send_one()
        assert sends[-1] == ("node-a", 1)  # back on node-a, which dropped the context when it moved away
        await stop(a, run_a)
    assert a.state().owned_partitions == store.partitions
    assert store.events.get("partition_handoff") > 0


async def test_affinity_context_is_dropped_when_the_conversation_moves_away_and_back_between_claims(
    make_store: Any,
) -> None:
    """The owner claims nothing while its partition is elsewhere: the context goes all the same."""
    store = await make_store(clock=None)
    node_ids = ["node-a", "node-b"]
    [key] = keys_of("node-b", node_ids, store.partitions, 1, "conv-")
    sends: list[int] = []

    async def send(task: Task) -> None:
        context = current_delivery().context
        context["n"] = context.get("n", 0) + 1
        sends.append(context["n"])

    async def send_one() -> None:
        await enqueue_and_wait_done(store, key, payload=0)

    # Idle polls far apart: node-a claims only when an enqueue wakes it, never in between.
    config = NodeConfig(queue=QUEUE, idle_min_s=30.0, idle_max_s=60.0)
    async with Membership(store, ttl_s=0.6, interval_s=0.1) as membership:
        await join_and_wait(membership, "node-a")
        a = Node(store, send, node_id="node-a", config=config, membership=membership)
        run_a = start(a)
        await send_one()
        await send_one()
        assert sends == [1, 2]
        await join_and_wait(membership, "node-b")  # no node runs as node-b: the partition is away, nothing is claimed
        await membership.leave("node-b")
        assert membership.view.node_ids == ("node-a",)
        await send_one()
        assert sends == [1, 2, 1]  # back on node-a: a fresh context
        await stop(a, run_a)


# --- work stealing (issue #4) -------------------------------------------------------------


def keys_of(owner: str, node_ids: list[str], partitions: int, n: int, prefix: str) -> list[str]:
    """The first ``n`` keys ``<prefix><i>`` whose partition ``owner`` owns among ``node_ids``."""
    keys = (f"{prefix}{i}" for i in range(10_000))
    return [k for k in keys if owner_of(partition_of(k, partitions), node_ids) == owner][:n]


async def run_stalled_owner(store: Any, *, work_stealing: bool, steal_after_s: float) -> dict[str, Any]:
    """node-a owns 6 tasks but its only slot is stuck in a send; node-b (idle, 2 tasks of its own) may steal.

    Returns what was sent by whom (and the claimed tasks), observed just before the
    stall ends (``early``, after half the threshold; ``stalled``, after three times it),
    and at the end, once node-a is unblocked and everything is done.
    """
    node_ids = ["node-a", "node-b"]
    a_keys = keys_of("node-a", node_ids, store.partitions, 6, "a-conv-")
    b_keys = keys_of("node-b", node_ids, store.partitions, 2, "b-conv-")
    unblock = asyncio.Event()
    sends: list[tuple[str, Task]] = []

    async def send(task: Task) -> str:
        node_id = current_delivery().node_id
        sends.append((node_id, task))
        if node_id == "node-a":
            await unblock.wait()  # stalled: e.g. a provider that stopped answering
        return node_id

    async with Membership(store, ttl_s=5.0) as membership:
        for node_id in node_ids:
            membership.join(node_id)
        await membership.wait_changed(membership.view.version, timeout_s=2.0)
        assert membership.view.node_ids == tuple(node_ids)
        config_a = NodeConfig(queue=QUEUE, max_in_flight=1, claim_batch=1, **FAST_IDLE)
        config_b = NodeConfig(queue=QUEUE, work_stealing=work_stealing, steal_after_s=steal_after_s, **FAST_IDLE)
        a = Node(store, send, node_id="node-a", config=config_a, membership=membership)
        b = Node(store, send, node_id="node-b", config=config_b, membership=membership)
        runs = [start(a), start(b)]
        # node-a takes its first task and stalls in it; the other 5 wait, due, in its partitions
        [head] = await store.enqueue_many([NewTask(queue=QUEUE, payload="a0", partition_key=a_keys[0])])
        while not sends:
            await asyncio.sleep(0.005)
        assert sends[0][0] == "node-a"
        results = await store.enqueue_many(
            [NewTask(queue=QUEUE, payload=f"a{i}", partition_key=k) for i, k in enumerate(a_keys[1:], 1)]
            + [NewTask(queue=QUEUE, payload=f"b{i}", partition_key=k) for i, k in enumerate(b_keys)]
        )
        await asyncio.sleep(steal_after_s / 2)
        early = list(sends)
        await asyncio.sleep(steal_after_s * 2.5)
        stalled = list(sends)
        unblock.set()

        async def drained() -> bool:
            stats = await store.stats(QUEUE)
            return stats.counts[TaskStatus.PENDING] == stats.counts[TaskStatus.RUNNING] == 0

        await wait_until(drained, 10.0, "every task to be done")
        await stop(a, run := runs[0])
        await stop(b, runs[1])
        assert run.done()
    ids = [head.task.id, *(r.task.id for r in results)]
    return {
        "a_ids": ids[:6],
        "b_ids": ids[6:],
        "early": early,
        "stalled": stalled,
        "sends": sends,
        "final": [await store.get(i) for i in ids],
        "states": (a.state(), b.state()),
    }


async def test_work_stealing_takes_a_stalled_owners_waiting_tasks_after_the_threshold(make_store: Any) -> None:
    store = await make_store(clock=None)
    steal_after_s = 0.6
    out = await run_stalled_owner(store, work_stealing=True, steal_after_s=steal_after_s)
    a_ids, b_ids = out["a_ids"], out["b_ids"]
    # before the threshold: node-b did its own work only
    assert sorted(t.id for n, t in out["early"] if n == "node-b") == b_ids
    # past it: node-b stole node-a's five waiting tasks (not the one node-a is stuck in)
    stolen = [t for n, t in out["stalled"] if n == "node-b" and t.id in a_ids]
    assert sorted(t.id for t in stolen) == a_ids[1:]
    for t in stolen:  # each had waited at least steal_after_s when it was claimed (store clock)
        assert t.updated_at - t.run_at >= steal_after_s - 0.01, (t, t.updated_at - t.run_at)
        assert t.lease_owner == "node-b"
    # every task was sent once and committed once, by the node that claimed it
    assert Counter(t.id for _, t in out["sends"]) == Counter(a_ids + b_ids)
    for task in out["final"]:
        assert task.status is TaskStatus.DONE, task
        assert task.attempts == 1
    results = {t.id: t.result for t in out["final"]}
    assert results == {i: "node-a" for i in a_ids[:1]} | {i: "node-b" for i in a_ids[1:] + b_ids}
    state_a, state_b = out["states"]
    assert (state_a.committed, state_b.committed) == (1, 7)
    assert state_a.conflicts == state_b.conflicts == 0


async def test_without_work_stealing_an_idle_node_never_touches_anothers_partitions(make_store: Any) -> None:
    store = await make_store(clock=None)
    out = await run_stalled_owner(store, work_stealing=False, steal_after_s=0.2)
    a_ids, b_ids = out["a_ids"], out["b_ids"]
    assert [t.id for n, t in out["stalled"] if n == "node-a"] == a_ids[:1]  # node-a is stuck in its first task
    assert sorted(t.id for n, t in out["sends"] if n == "node-b") == b_ids  # node-b never took one of a's
    assert sorted(t.id for n, t in out["sends"] if n == "node-a") == a_ids  # node-a did them all once unblocked
    assert Counter(t.id for _, t in out["sends"]) == Counter(a_ids + b_ids)
    for task in out["final"]:
        assert (task.status, task.attempts) == (TaskStatus.DONE, 1), task
    state_a, state_b = out["states"]
    assert (state_a.committed, state_b.committed) == (6, 2)


# --- lease renewal ------------------------------------------------------------------------


@pytest.mark.quiet
async def test_the_nodes_of_a_process_renew_their_leases_at_the_same_moments(make_store: Any) -> None:
    """Two nodes started half a renewal interval apart renew together, every lease_s / 3 at most.

    Each node's keeper renews on a grid of the monotonic clock, so a process's nodes hand
    their extend_many calls to the store at the same moment (one statement or one group
    commit) instead of one after the other.
    """
    store = await make_store(clock=None)
    lease_s = 0.3
    interval_s = lease_s / 3
    await store.enqueue_many([NewTask(queue=QUEUE, payload=name, partition_key=name) for name in ("a", "b")])
    renewals: dict[str, list[float]] = defaultdict(list)
    extend_many = store.extend_many

    async def recording(tasks: list[Task], lease_s: float) -> list[bool]:
        for owner in {t.lease_owner for t in tasks}:
            renewals[str(owner)].append(time.monotonic())
        return await extend_many(tasks, lease_s)

    store.extend_many = recording
    sending: dict[str, tuple[float, float]] = {}

    async def send(task: Task) -> None:
        started = time.monotonic()
        await asyncio.sleep(0.55)
        sending[current_delivery().node_id] = (started, time.monotonic())

    config = NodeConfig(queue=QUEUE, lease_s=lease_s, max_in_flight=1, claim_batch=1, **FAST_IDLE)
    a = Node(store, send, node_id="A", config=config)
    b = Node(store, send, node_id="B", config=config)
    run_a = start(a)
    await asyncio.sleep(interval_s / 2)
    run_b = start(b)

    async def both_sent() -> bool:
        return len(sending) == 2

    await wait_until(both_sent, 5.0, "both sends to end")
    await stop(a, run_a)
    await stop(b, run_b)

    assert sorted(renewals) == ["A", "B"]
    for node_id, moments in renewals.items():
        send_started, send_ended = sending[node_id]
        # while its send ran, the node renewed at least every interval (with slack for a busy loop)
        points = [send_started, *moments, send_ended]
        gaps = [later - earlier for earlier, later in itertools.pairwise(points)]
        assert max(gaps) <= interval_s + 0.05, (node_id, gaps)
        assert len(moments) >= 3, (node_id, moments)
    # while both sends ran, each renewal of one node came with one of the other's, from the first
    # moment both renewed on (a lease claimed just before a renewal moment is not renewed at it: on a
    # loaded machine A's claim may come after B's first renewal)
    joined = max(renewals["A"][0], renewals["B"][0])
    overlap = (max(joined - 0.02, *(s for s, _ in sending.values())), min(e for _, e in sending.values()))
    both = {n: [m for m in renewals[n] if overlap[0] + 0.01 < m < overlap[1] - 0.01] for n in ("A", "B")}
    assert len(both["B"]) >= 2, (overlap, dict(renewals))
    for moment in both["B"]:
        assert min(abs(moment - other) for other in both["A"]) < 0.01, (moment, both)


@pytest.mark.quiet
async def test_a_timer_that_fires_early_does_not_make_the_keeper_renew_twice(
    make_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """uvloop's timers are whole milliseconds and may fire up to 1 ms early: one renewal per point."""
    import anyio

    store = await make_store(clock=None)
    lease_s, send_s = 0.3, 0.65
    await store.enqueue_many([NewTask(queue=QUEUE, payload="m", partition_key="k")])
    renewals: list[float] = []
    extend_many = store.extend_many

    async def recording(tasks: list[Task], lease_s: float) -> list[bool]:
        renewals.append(time.monotonic())
        return await extend_many(tasks, lease_s)

    store.extend_many = recording
    real_sleep = anyio.sleep

    async def early(delay: float) -> None:
        await real_sleep(max(0.0, delay - 0.001))

    monkeypatch.setattr(anyio, "sleep", early)
    sent = asyncio.Event()

    async def send(task: Task) -> None:
        await asyncio.sleep(send_s)
        sent.set()

    node = Node(store, send, node_id="A", config=NodeConfig(queue=QUEUE, lease_s=lease_s, **FAST_IDLE))
    run = start(node)
    await asyncio.wait_for(sent.wait(), 5.0)
    await stop(node, run)

    points = send_s / (lease_s / 3)  # 6.5 points of the grid while the send ran
    assert int(points) - 1 <= len(renewals) <= int(points) + 1, renewals
    gaps = [later - earlier for earlier, later in itertools.pairwise(renewals)]
    interval = lease_s / 3
    for i, gap in enumerate(gaps):  # none right after another...
        if gap <= interval / 2:  # ...unless the one before came late and this one is back on the grid
            assert i > 0, gaps
            assert gaps[i - 1] + gap >= 2 * interval - 0.005, gaps
