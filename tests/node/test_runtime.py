"""The Runtime: many nodes in one process, graceful shutdown, idle cost, wake-ups, partitioning.

Stores come from the ``make_store`` fixture with ``clock=None`` (real time), so
heartbeats, leases and backoff run as they do in production.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support import count_calls

from asynccoord import (
    InvalidArgumentError,
    InvalidTypeError,
    MemoryStore,
    NewTask,
    RuntimeStateError,
    SQLiteStore,
    StoreClosedError,
    StoreError,
    Task,
    TaskStatus,
    owner_of,
    partition_of,
)
from asynccoord.membership import Membership
from asynccoord.node import Node, NodeConfig, NodeStatus, Runtime, current_delivery
from asynccoord.node.ablation import Ablation
from asynccoord.node.send import SEND_CLEANUP_S
from asynccoord.node.settle import CUT_ON_LAST_ATTEMPT, SETTLE_WAIT_S

QUEUE = "q"


def keys_owned_by(node_id: str, node_ids: list[str], partitions: int, n: int, prefix: str) -> list[str]:
    """The first ``n`` partition keys ``<prefix><i>`` whose partition ``node_id`` owns among ``node_ids``."""
    keys = (f"{prefix}{i}" for i in range(10_000))
    return [k for k in keys if owner_of(partition_of(k, partitions), node_ids) == node_id][:n]


async def test_leaving_async_with_lets_short_sends_finish_and_hands_back_the_rest(make_store: Any) -> None:
    store = await make_store(clock=None)
    node_ids = ["node-a", "node-b"]
    # Each node owns 3 tasks to run at once (ids first, so claimed first) and 3 that must wait.
    first: list[NewTask] = []
    later: list[NewTask] = []
    for node_id, durations in zip(node_ids, ([0.1, 0.1, 5.0], [0.1, 5.0, 5.0]), strict=True):
        keys = keys_owned_by(node_id, node_ids, store.partitions, 6, prefix=f"{node_id}-conv-")
        for i, key in enumerate(keys):
            spec = NewTask(
                queue=QUEUE, payload={"send_s": durations[i] if i < 3 else 0.0, "key": key}, partition_key=key
            )
            (first if i < 3 else later).append(spec)
    results = await store.enqueue_many(first)
    waiting = await store.enqueue_many(later)
    started: list[int] = []
    cancelled: list[int] = []

    async def send(task: Task) -> str:
        started.append(task.id)
        try:
            await asyncio.sleep(task.payload["send_s"])
        except asyncio.CancelledError:
            cancelled.append(task.id)
            raise
        return "sent"

    config = NodeConfig(queue=QUEUE, max_in_flight=3, claim_batch=3)
    claims = count_calls(store, "claim")
    async with Runtime(
        store,
        send=send,
        node_ids=node_ids,
        config=config,
        lock_key=lambda t: f"lock:{t.payload['key']}",
        shutdown_timeout_s=0.5,
    ) as runtime:
        # 2 nodes x 3 slots: each node's first three tasks are in flight, the others wait.
        while len(started) < 6:
            await asyncio.sleep(0.005)
        assert sorted(started) == [r.task.id for r in results]
        assert len(await store.list_locks()) == 6
        leaving = time.monotonic()
    left = time.monotonic()

    assert 0.5 <= left - leaving <= 0.9  # waited the shutdown timeout for the long sends, no more
    assert [c for c in claims if c > leaving] == []  # nothing claimed once the shutdown began
    assert sorted(started) == [r.task.id for r in results]
    short = [r.task.id for r in results if r.task.payload["send_s"] < 1]
    long = [r.task.id for r in results if r.task.payload["send_s"] > 1]
    assert sorted(cancelled) == long
    for task_id in short:
        task = await store.get(task_id)
        assert (task.status, task.result) == (TaskStatus.DONE, "sent")
    for task_id in long:
        task = await store.get(task_id)
        assert (task.status, task.attempts, task.last_error, task.lease_owner) == (TaskStatus.PENDING, 1, None, None)
    for r in waiting:
        task = await store.get(r.task.id)
        assert (task.status, task.version) == (TaskStatus.PENDING, 0)  # never claimed
    assert await store.list_locks() == []
    assert await store.members() == []  # the nodes left the membership
    states = runtime.states()
    assert {s.status for s in states} == {NodeStatus.STOPPED}
    assert sum(s.committed for s in states) == 3
    assert sum(s.handed_back for s in states) == 3
    assert sum(s.failed for s in states) == 0
    assert store.events.get("retries") == 0


async def test_a_cancelled_send_may_await_in_its_cleanup(make_store: Any, pipeline: dict[str, Any]) -> None:
    # Shutdown cancels a long send once, as asyncio.Task.cancel does: its finally block
    # can still await (close a connection, say) before the task is handed back.
    store = await make_store(clock=None)
    task_id = (await store.enqueue(QUEUE, "slow")).task.id
    log: list[str] = []

    async def send(task: Task) -> str:
        log.append("start")
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            log.append("cancelled")
            raise
        finally:
            try:
                await asyncio.sleep(0.02)
                log.append("cleanup done")
            except asyncio.CancelledError:
                log.append("cleanup interrupted")
                raise
        return "sent"

    config = NodeConfig(queue=QUEUE, **pipeline)
    async with Runtime(store, send=send, nodes=1, config=config, shutdown_timeout_s=0.2):
        while "start" not in log:
            await asyncio.sleep(0.005)
        leaving = time.monotonic()
    assert time.monotonic() - leaving < 0.2 + 0.25 + 0.3  # shutdown timeout + cleanup grace + slack
    assert log == ["start", "cancelled", "cleanup done"]
    task = await store.get(task_id)
    assert (task.status, task.attempts, task.last_error) == (
        TaskStatus.PENDING,
        1,
        None,
    )  # cut short: its attempt counted


@pytest.mark.parametrize(
    ("shutdown_timeout_s", "send_timeout_s"),
    [(0.3, 0.38), (0.38, 0.3)],
    ids=["shutdown-then-timeout", "timeout-then-shutdown"],
)
async def test_a_cancelled_sends_cleanup_time_is_not_cut_short_by_another_cancellation(
    make_store: Any, shutdown_timeout_s: float, send_timeout_s: float, pipeline: dict[str, Any]
) -> None:
    # The send is cancelled by whichever comes first, shutdown or its timeout; the other comes
    # 0.08 s into its cleanup time and must not cancel it again (it cut the cleanup at 0.08 s).
    store = await make_store(clock=None)
    task_id = (await store.enqueue(QUEUE, "slow")).task.id
    started = asyncio.Event()
    log: list[str] = []

    async def send(task: Task) -> str:
        started.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            log.append("cancelled")
            try:
                await asyncio.sleep(0.15)  # close a connection: well within SEND_CLEANUP_S
                log.append("cleanup done")
            except asyncio.CancelledError:
                log.append("cleanup cut")
            raise
        return "sent"

    config = NodeConfig(queue=QUEUE, send_timeout_s=send_timeout_s, **pipeline)
    async with Runtime(store, send=send, nodes=1, config=config, shutdown_timeout_s=shutdown_timeout_s) as runtime:
        await started.wait()
    assert log == ["cancelled", "cleanup done"]
    # Either way the node was cancelled while the send still ran: handed back, not a failure.
    task = await store.get(task_id)
    assert (task.status, task.attempts, task.last_error) == (
        TaskStatus.PENDING,
        1,
        None,
    )  # cut short: its attempt counted
    assert (runtime.states()[0].failed, runtime.states()[0].handed_back) == (0, 1)
    assert store.events.get("send_interrupted") == 1


@pytest.mark.quiet  # every send must resume from its sleep before the 0.3 s drain deadline
@pytest.mark.parametrize("way", ["slots", "batch", "lock"])
@pytest.mark.parametrize("hurry", ["cancel-the-shutdown", "drain-timeout"])
async def test_sends_that_returned_are_committed_even_when_the_drain_is_cut_at_that_instant(
    make_store: Any, way: str, hurry: str
) -> None:
    # Every send returns at one instant T; the drain is cut right then (the task running the
    # shutdown cancelled, or the shutdown's own timeout running out). The commits used to be
    # cancelled with the node: the tasks went back to pending and were sent again, and no
    # counter said so.
    store = await make_store(clock=None)
    n = 20
    for i in range(n):
        await store.enqueue(QUEUE, i, partition_key=f"k{i}")
    loop = asyncio.get_running_loop()
    at: list[float] = []
    sends: Counter[int] = Counter()

    async def send(task: Task) -> None:
        sends[task.id] += 1
        while not at:
            await asyncio.sleep(0.005)
        await asyncio.sleep(max(0.0, at[0] - loop.time()))

    config = NodeConfig(queue=QUEUE, max_in_flight=64, idle_min_s=0.01, idle_max_s=0.05, claim_next=way != "batch")
    lock_key = (lambda task: f"account:{task.payload}") if way == "lock" else None
    drain_s = 0.3 if hurry == "drain-timeout" else 30.0
    runtime = Runtime(store, send=send, nodes=2, config=config, lock_key=lock_key, shutdown_timeout_s=drain_s)
    await runtime.start()
    while len(sends) < n:  # every send has begun (a task still waiting for its lock would be handed back)
        await asyncio.sleep(0.01)
    at.append(loop.time() + 0.3)
    stopping = asyncio.create_task(runtime.shutdown())
    if hurry == "cancel-the-shutdown":
        await asyncio.sleep(0.3)
        stopping.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await stopping
    counts = (await store.stats(QUEUE)).counts
    assert counts[TaskStatus.DONE] == n, counts
    assert sum(state.committed for state in runtime.states()) == n
    assert len(sends) == n
    assert set(sends.values()) == {1}  # each sent once
    assert store.events.get("send_interrupted") == 0
    assert store.events.get("stale_commit_rejected") == 0


async def test_tasks_still_waiting_for_their_lock_at_shutdown_go_back_unsent(make_store: Any) -> None:
    """Shutdown lets the sends under way finish, and starts none: a task that waited for its
    account's lock when the shutdown came is handed back unsent, its attempt not used (it used
    to be sent as the lock came free, then cut at the drain's deadline: a message that may have
    gone out, sent again by the next node)."""
    store = await make_store(clock=None)
    ids = [(await store.enqueue(QUEUE, i, partition_key=f"chat-{i}")).task.id for i in range(5)]
    first_started = asyncio.Event()
    sent: list[int] = []

    async def send(task: Task) -> None:
        sent.append(task.id)
        first_started.set()
        await asyncio.sleep(0.3)

    config = NodeConfig(queue=QUEUE, idle_min_s=0.01, idle_max_s=0.05)
    runtime = Runtime(store, send=send, nodes=1, config=config, lock_key=lambda task: "account:one")
    await runtime.start()
    await asyncio.wait_for(first_started.wait(), 10.0)
    await runtime.shutdown()  # the drain (10 s) outlasts every send the lock would let through
    assert len(sent) == 1
    tasks = {t: await store.get(t) for t in ids}
    assert tasks[sent[0]].status is TaskStatus.DONE
    rest = [tasks[t] for t in ids if t != sent[0]]
    assert [(t.status, t.attempts) for t in rest] == [(TaskStatus.PENDING, 0)] * 4
    assert store.events.get("send_interrupted") == 0
    assert runtime.states()[0].handed_back == 4
    assert runtime.states()[0].conflicts == 0


async def test_a_send_that_swallows_cancellation_is_cancelled_once_more_after_its_cleanup_time(
    make_store: Any, pipeline: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    # Shutdown cancels it, its timeout comes 0.08 s later: neither that nor anything else cancels
    # it again before SEND_CLEANUP_S is up; then it is cancelled once more and left behind. It still
    # runs: its task is not handed back, its lease is left to lapse (send_outlived_shutdown).
    store = await make_store(clock=None)
    task_id = (await store.enqueue(QUEUE, "stubborn")).task.id
    started, ended = asyncio.Event(), asyncio.Event()
    cancelled_at: list[float] = []

    async def send(task: Task) -> str:
        loop = asyncio.get_running_loop()
        until = loop.time() + 1.0
        started.set()
        while loop.time() < until:
            try:
                await asyncio.sleep(until - loop.time())
            except asyncio.CancelledError:
                cancelled_at.append(time.monotonic())
        ended.set()
        return "sent"

    config = NodeConfig(queue=QUEUE, send_timeout_s=0.38, **pipeline)
    async with Runtime(store, send=send, nodes=1, config=config, shutdown_timeout_s=0.3) as runtime:
        await started.wait()
        leaving = time.monotonic()
    left = time.monotonic()
    assert left - leaving < 0.3 + SEND_CLEANUP_S + 0.3  # shutdown timeout + cleanup time + slack
    await asyncio.wait_for(ended.wait(), 2.0)  # the send, left behind, runs to its end
    assert len(cancelled_at) == 2, cancelled_at  # it was cancelled 4 times (0.3, 0.38, 0.55, 0.63 s)
    assert SEND_CLEANUP_S - 0.01 <= cancelled_at[1] - cancelled_at[0] <= SEND_CLEANUP_S + 0.15
    task = await store.get(task_id)
    assert (task.status, task.attempts, task.last_error) == (TaskStatus.RUNNING, 1, None)  # its lease lapses
    assert runtime.states()[0].handed_back == 0
    abandoned = [r.getMessage() for r in caplog.records if "send_abandoned" in r.getMessage()]
    assert abandoned == [
        f"asynccoord.node.send_abandoned task={task_id}: the send outlived its cleanup time "
        f"({SEND_CLEANUP_S:.2f} s) after being cancelled; it is cancelled once more and left behind"
    ]
    [outlived] = [r.getMessage() for r in caplog.records if "send_outlived_shutdown" in r.getMessage()]
    assert f" task={task_id} lock=-: the send still runs after the node's stop cut it" in outlived


async def test_cancelling_the_task_that_hosts_a_runtime_hands_back_and_reraises(make_store: Any) -> None:
    store = await make_store(clock=None)
    [enqueued] = await store.enqueue_many([NewTask(queue=QUEUE, payload={"account": 1}, partition_key="c")])
    started = asyncio.Event()

    async def send(task: Task) -> None:
        started.set()
        await asyncio.Event().wait()

    async def host() -> None:
        async with Runtime(
            store, send=send, nodes=2, config=NodeConfig(queue=QUEUE), lock_key=lambda t: "account:1"
        ) as runtime:
            await runtime.wait_for_signal()

    before = asyncio.all_tasks()
    hosting = asyncio.create_task(host())
    await asyncio.wait_for(started.wait(), 5.0)
    assert len(await store.members()) == 2
    await asyncio.sleep(0.2)
    cancelled_at = time.monotonic()
    hosting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await hosting
    assert time.monotonic() - cancelled_at <= 0.5
    await asyncio.sleep(0.5 - (time.monotonic() - cancelled_at))  # by 0.5 s after the cancellation:
    task = await store.get(enqueued.task.id)
    assert (task.status, task.attempts, task.last_error) == (
        TaskStatus.PENDING,
        1,
        None,
    )  # cut short: its attempt counted
    assert await store.list_locks() == []
    assert await store.members() == []
    # no node, keeper or watchdog, per-task handler or heartbeat task left behind
    current = asyncio.current_task()
    assert [t.get_name() for t in asyncio.all_tasks() - before if not t.done() and t is not current] == []


async def test_an_idle_runtime_polls_a_few_times_per_second_per_node(db_path: Path) -> None:
    async with SQLiteStore(db_path) as store:
        claims = count_calls(store, "claim")
        heartbeats = count_calls(store, "heartbeat")

        async def send(task: Task) -> None:
            raise AssertionError("there is no work")

        nodes = 8
        async with Runtime(store, send=send, nodes=nodes, config=NodeConfig(queue=QUEUE), heartbeat_ttl_s=3.0):
            began = time.monotonic()
            await asyncio.sleep(2.0)
            first = [c for c in claims if c >= began]
            await asyncio.sleep(2.0)  # past the backoff ramp (0.05 s doubling up to 1 s): at rest
            rest = [c for c in claims if c >= began + 2.0]
    # idle_min_s 0.05, idle_max_s 1.0: the delays ramp up, then average (0.05 + 1.0) / 2 s
    assert len(first) <= nodes * 2.0 * 5, len(first)
    assert len(rest) <= nodes * 2.0 * 3, len(rest)
    assert len(heartbeats) <= 1 + 4.0 / 1.0 + 1  # one heartbeat per interval (1 s) for all 8 nodes together


async def wake_latencies(store: Any, keys: list[str], sent: dict[int, float]) -> list[float]:
    """Enqueue one task per key (at random moments) and return enqueue -> send start, seconds."""
    rng = random.Random(5)
    out = []
    for key in keys:
        await asyncio.sleep(rng.uniform(0.05, 0.3))
        [result] = await store.enqueue_many([NewTask(queue=QUEUE, payload=key, partition_key=key)])
        enqueued = time.monotonic()
        deadline = enqueued + 3.0
        while result.task.id not in sent:
            assert time.monotonic() < deadline, f"task {result.task.id} was never sent"
            await asyncio.sleep(0.001)
        out.append(sent[result.task.id] - enqueued)
    return out


@pytest.mark.parametrize(("nodes", "partitioning"), [(1, True), (4, False)], ids=["1-node", "4-nodes-unpartitioned"])
async def test_in_process_enqueue_wakes_an_idle_node_at_once(make_store: Any, nodes: int, partitioning: bool) -> None:
    store = await make_store(clock=None)
    sent: dict[int, float] = {}

    async def send(task: Task) -> None:
        sent[task.id] = time.monotonic()

    # polls only once a second: a send within 0.1 s of the enqueue comes from the wake-up
    config = NodeConfig(queue=QUEUE, idle_min_s=1.0, idle_max_s=1.0)
    async with Runtime(store, send=send, nodes=nodes, config=config, _ablation=Ablation(partitioning=partitioning)):
        await asyncio.sleep(0.1)
        latencies = await wake_latencies(store, [f"c{i}" for i in range(6)], sent)
    assert max(latencies) <= 0.1, latencies


async def test_in_process_enqueue_wakes_the_idle_node_that_owns_the_partition(make_store: Any) -> None:
    store = await make_store(clock=None)
    sent: dict[int, float] = {}

    async def send(task: Task) -> None:
        sent[task.id] = time.monotonic()

    node_ids = ["node-a", "node-b"]
    config = NodeConfig(queue=QUEUE, idle_min_s=1.0, idle_max_s=1.0)  # polls only once a second
    async with Membership(store, ttl_s=5.0) as membership:
        for node_id in node_ids:
            membership.join(node_id)
        await membership.wait_changed(membership.view.version, timeout_s=2.0)
        assert membership.view.node_ids == tuple(node_ids)
        a, b = (Node(store, send, node_id=n, config=config, membership=membership) for n in node_ids)
        runs = [asyncio.create_task(a.run())]
        while store.notifier.waiting(QUEUE) < 1:  # node-a idles first...
            await asyncio.sleep(0.001)
        runs.append(asyncio.create_task(b.run()))
        while store.notifier.waiting(QUEUE) < 2:  # ...then node-b
            await asyncio.sleep(0.001)
        # A task only node-b may claim: node-b must be woken, whoever has waited longest.
        key = keys_owned_by("node-b", node_ids, store.partitions, 1, prefix="conv-")[0]
        [result] = await store.enqueue_many([NewTask(queue=QUEUE, payload=1, partition_key=key)])
        enqueued = time.monotonic()
        deadline = enqueued + 3.0
        while result.task.id not in sent:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.001)
        for node in (a, b):
            node.stop_claiming()
        await asyncio.gather(*runs)
    assert sent[result.task.id] - enqueued <= 0.1, sent[result.task.id] - enqueued


async def test_with_partitioning_each_task_is_claimed_by_the_owner_of_its_partition(make_store: Any) -> None:
    store = await make_store(clock=None)
    seen: list[tuple[int, int, str | None, str]] = []

    async def send(task: Task) -> None:
        seen.append((task.id, task.partition, task.lease_owner, current_delivery().node_id))
        await asyncio.sleep(0.002)

    node_ids = [f"node-{c}" for c in "abcd"]
    async with Runtime(store, send=send, node_ids=node_ids, config=NodeConfig(queue=QUEUE)) as runtime:
        assert runtime.membership.view.node_ids == tuple(node_ids)
        results = await store.enqueue_many(
            [NewTask(queue=QUEUE, payload=i, partition_key=f"conv-{i % 60}") for i in range(300)]
        )
        assert await runtime.wait_until_drained(timeout_s=20.0, poll_s=0.02)
        assert runtime.membership.view.node_ids == tuple(node_ids)  # healthy throughout
        owned = {n.node_id: n.state().owned_partitions for n in runtime.nodes}
    assert sorted(t for t, _, _, _ in seen) == [r.task.id for r in results]
    for task_id, partition, lease_owner, node_id in seen:
        assert lease_owner == node_id == owner_of(partition, node_ids), task_id
    assert set(Counter(node for _, _, _, node in seen)) == set(node_ids)  # every node had work
    assert sum(owned.values()) == store.partitions


async def test_two_runtimes_in_one_process_get_distinct_default_node_ids(make_store: Any) -> None:
    store = await make_store(clock=None)
    sent: Counter[int] = Counter()

    async def send(task: Task) -> None:
        sent[task.id] += 1

    config = NodeConfig(queue=QUEUE, idle_min_s=0.01, idle_max_s=0.05)
    first = Runtime(store, send=send, nodes=3, config=config)
    second = Runtime(store, send=send, nodes=3, config=config)
    ids = [n.node_id for n in (*first.nodes, *second.nodes)]
    assert len(set(ids)) == 6, ids
    prefix = f"{socket.gethostname()[:200]}-{os.getpid()}-"
    assert all(i.startswith(prefix) for i in ids), ids
    async with first, second:
        assert sorted(m.node_id for m in await store.members()) == sorted(ids)
        results = await store.enqueue_many([NewTask(queue=QUEUE, payload=i, partition_key=f"c{i}") for i in range(60)])
        assert await first.wait_until_drained(timeout_s=20.0, poll_s=0.02)
    assert sent == Counter({r.task.id: 1 for r in results})
    assert await store.members() == []
    # explicit ids are kept as given, even when another runtime uses the same ones
    explicit = [Runtime(store, send=send, node_ids=["bot-a", "bot-b"]) for _ in range(2)]
    assert [[n.node_id for n in r.nodes] for r in explicit] == [["bot-a", "bot-b"]] * 2


async def test_bad_heartbeat_arguments_are_named_as_the_runtime_was_given_them() -> None:
    """The runtime passes its heartbeat settings on to a Membership, whose own words are
    ``ttl_s`` and ``interval_s``: an error names the runtime's arguments instead."""

    async def send(task: Task) -> None:
        pass

    async with MemoryStore() as store:
        for kwargs, message in (
            (
                {"heartbeat_ttl_s": 3.0, "heartbeat_interval_s": 3.0},
                r"^heartbeat_interval_s must be < heartbeat_ttl_s \(3\.0\) so nodes beat before they expire, got 3\.0$",
            ),
            ({"heartbeat_interval_s": 7}, r"^heartbeat_interval_s must be < heartbeat_ttl_s \(5\.0\) .* got 7$"),
            ({"heartbeat_ttl_s": 0.001}, r"^heartbeat_ttl_s must be >= 0\.01 seconds \(MIN_LEASE_S.*got 0\.001$"),
            ({"heartbeat_interval_s": -1.0}, r"^heartbeat_interval_s must be > 0, got -1\.0$"),
        ):
            with pytest.raises(InvalidArgumentError, match=message):
                Runtime(store, send=send, nodes=1, **kwargs)
        assert await store.members() == []  # nothing was joined or written
        runtime = Runtime(store, send=send, nodes=1, heartbeat_ttl_s=0.3, heartbeat_interval_s=0.1)
        assert (runtime.membership.ttl_s, runtime.membership.interval_s) == (0.3, 0.1)


async def test_a_node_count_that_contradicts_node_ids_is_refused_not_ignored() -> None:
    async def send(task: Task) -> None:
        pass

    async with MemoryStore() as store:
        disagree = r"^nodes=2 disagrees with len\(node_ids\)=3: give node_ids alone"
        with pytest.raises(InvalidArgumentError, match=disagree):
            Runtime(store, send=send, nodes=2, node_ids=["a", "b", "c"])  # it used to build 3 nodes
        with pytest.raises(InvalidTypeError, match=r"^nodes must be an int, got str"):
            Runtime(store, send=send, nodes="3", node_ids=["a", "b", "c"])  # type: ignore[arg-type]
        assert await store.members() == []  # nothing was joined or written
        counts = {
            "ids alone": Runtime(store, send=send, node_ids=["a", "b", "c"]),
            "both agree": Runtime(store, send=send, nodes=3, node_ids=["a", "b", "c"]),
            "count alone": Runtime(store, send=send, nodes=2),
            "neither": Runtime(store, send=send),
            "count None": Runtime(store, send=send, nodes=None, node_ids=["a"]),
        }
        assert {name: len(runtime.nodes) for name, runtime in counts.items()} == {
            "ids alone": 3,
            "both agree": 3,
            "count alone": 2,
            "neither": 8,
            "count None": 1,
        }
        assert [n.node_id for n in counts["both agree"].nodes] == ["a", "b", "c"]


async def test_runtimes_draining_two_queues_of_one_store_share_partitions_only_with_their_own_queue(
    make_store: Any,
) -> None:
    """Each queue's partitions go to the nodes draining it: a node of the other queue owned some and
    never claimed their tasks, which stayed pending for ever (a breaker's find)."""
    store = await make_store(clock=None)
    sent: Counter[int] = Counter()

    async def send(task: Task) -> None:
        sent[task.id] += 1

    runtimes = [
        Runtime(store, send=send, nodes=2, config=NodeConfig(queue=queue, idle_min_s=0.01, idle_max_s=0.05))
        for queue in ("q-a", "q-b")
    ]
    async with runtimes[0], runtimes[1]:
        for runtime, other in ((runtimes[0], runtimes[1]), (runtimes[1], runtimes[0])):
            view = runtime.membership.view
            assert set(view.node_ids) == {n.node_id for n in runtime.nodes}, view  # never the other queue's
            owned = [runtime.membership.owned_partitions(n.node_id) for n in runtime.nodes]
            assert frozenset().union(*owned) == frozenset(range(store.partitions))
            assert {m.node_id for m in await store.members()} >= {n.node_id for n in other.nodes}
        results = await store.enqueue_many(
            [NewTask(queue=queue, payload=i, partition_key=f"c{i}") for queue in ("q-a", "q-b") for i in range(40)]
        )
        for runtime in runtimes:
            assert await runtime.wait_until_drained(timeout_s=10.0, poll_s=0.02)
    assert sent == Counter({r.task.id: 1 for r in results})


async def runtime_with_a_broken(method: str, error: Exception, *, tasks: int) -> tuple[MemoryStore, Runtime]:
    """A runtime of 2 nodes on a memory store holding ``tasks`` tasks, whose ``method`` raises ``error``."""
    store = MemoryStore()
    await store.open()
    await store.enqueue_many([NewTask(queue=QUEUE, payload=i, partition_key=f"k{i}") for i in range(tasks)])

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise error

    setattr(store, method, broken)

    async def send(task: Task) -> None:
        raise AssertionError("nothing is sent")

    return store, Runtime(store, send=send, nodes=2, config=NodeConfig(queue=QUEUE))


async def test_wait_until_drained_raises_a_node_failure_instead_of_waiting_out_its_timeout() -> None:
    """A node that fails stops the runtime; nothing will drain the queue, so the wait says so."""
    store, runtime = await runtime_with_a_broken("claim", RuntimeError("a bug in claim"), tasks=3)
    began = time.monotonic()
    with pytest.raises(ExceptionGroup) as caught:  # not an asynccoord error: the nodes' group as it is
        async with runtime:
            await runtime.wait_until_drained(timeout_s=30.0, poll_s=0.01)
    assert caught.group_contains(RuntimeError, match="a bug in claim")
    depth = len(traceback.extract_tb(caught.value.__traceback__))
    for _ in range(20):  # asked again (a health check polling it): the same error, its traceback not growing
        with pytest.raises(ExceptionGroup) as again:
            await runtime.wait_until_drained(timeout_s=1.0, poll_s=0.01)
        assert again.value is caught.value
        assert len(traceback.extract_tb(again.value.__traceback__)) <= depth
    assert time.monotonic() - began < 5.0  # it used to wait out the 30 s and return False
    assert repr(runtime).startswith("<Runtime stopped ")
    assert (await store.stats(QUEUE)).counts[TaskStatus.PENDING] == 3
    await store.close()


async def test_wait_until_drained_after_a_failed_start_says_so_instead_of_waiting() -> None:
    store, runtime = await runtime_with_a_broken("heartbeat", StoreError("the first heartbeat is refused"), tasks=1)
    with pytest.raises(StoreError, match="first heartbeat"):
        await runtime.start()
    began = time.monotonic()
    with pytest.raises(RuntimeStateError, match="its start failed") as caught:
        await runtime.wait_until_drained(timeout_s=30.0, poll_s=0.01)
    assert isinstance(caught.value.__cause__, StoreError)
    assert time.monotonic() - began < 5.0  # it used to wait out the 30 s and return False
    await store.close()


@pytest.mark.parametrize(
    ("idle_min_s", "idle_max_s", "heartbeat_ttl_s"),
    [(0.05, 1.0, 5.0), (2.0, 2.0, 0.3)],
    ids=["claim-finds-it-closed", "heartbeat-finds-it-closed-first"],
)
async def test_a_store_closed_under_a_running_runtime_fails_it_loudly(
    db_path: Path, idle_min_s: float, idle_max_s: float, heartbeat_ttl_s: float
) -> None:
    sent: list[int] = []

    async def send(task: Task) -> None:
        sent.append(task.id)

    store = SQLiteStore(db_path)
    await store.open()
    # In the second case the heartbeat fails (and the membership turns unhealthy) before
    # any node polls again: a node must not just skip its claims then, forever.
    config = NodeConfig(queue=QUEUE, idle_min_s=idle_min_s, idle_max_s=idle_max_s)
    runtime = Runtime(store, send=send, nodes=2, config=config, heartbeat_ttl_s=heartbeat_ttl_s)
    closed = 0.0
    enqueued: list[int] = []

    async def host() -> None:
        nonlocal closed
        async with runtime:
            [result] = await store.enqueue_many([NewTask(queue=QUEUE, payload=1)])
            enqueued.append(result.task.id)
            assert await runtime.wait_until_drained(timeout_s=10.0, poll_s=0.01)
            await asyncio.sleep(0.2)  # the nodes idle now
            closed = time.monotonic()
            await store.close()
            # the runtime stops by itself: no signal, no shutdown call
            await asyncio.wait_for(runtime.wait_for_signal(), 5.0)

    with pytest.raises(StoreClosedError):
        await host()
    assert time.monotonic() - closed <= idle_max_s + 1.5
    assert sent == enqueued
    statuses = [s.status for s in runtime.states()]
    assert NodeStatus.FAILED in statuses, statuses
    assert set(statuses) <= {NodeStatus.FAILED, NodeStatus.STOPPED}, statuses
    with pytest.raises(StoreClosedError):  # and says so again to whoever asks
        await runtime.shutdown()


async def test_a_send_cut_short_at_shutdown_is_delivered_again_with_its_attempt_counted(make_store: Any) -> None:
    """The repeat check the README gives (``attempts > 1``) sees a send a shutdown cut short."""
    store = await make_store(clock=None)
    await store.enqueue(QUEUE, {"m": "hello"}, partition_key="chat-1", idempotency_key="in-1")
    started = asyncio.Event()
    seen: list[int] = []

    async def slow(task: Task) -> None:
        seen.append(current_delivery().task.attempts)
        started.set()
        await asyncio.sleep(30)

    first = Runtime(store, send=slow, nodes=1, config=NodeConfig(queue=QUEUE), shutdown_timeout_s=0.05)
    async with first:
        await asyncio.wait_for(started.wait(), 10)
    handed_back = (await store.stats(QUEUE)).counts
    assert handed_back.get(TaskStatus.PENDING, 0) == 1

    async def quick(task: Task) -> None:
        seen.append(current_delivery().task.attempts)

    async with Runtime(store, send=quick, nodes=1, config=NodeConfig(queue=QUEUE)) as second:
        assert await second.wait_until_drained(timeout_s=15)
    assert seen == [1, 2]


async def test_once_shutdown_returns_no_task_is_left_leased_to_the_runtime(make_store: Any) -> None:
    """Claims that the shutdown cut are handed back before ``shutdown()`` returns (PostgreSQL hands
    them back in the background: the runtime waits for that), so a reader right after sees none."""
    store = await make_store(clock=None)
    await store.enqueue_many([NewTask(queue=QUEUE, payload=i, partition_key=f"c{i % 20}") for i in range(3000)])
    rng = random.Random(7)

    async def send(task: Task) -> None:
        await asyncio.sleep(rng.uniform(0, 0.05))

    config = NodeConfig(queue=QUEUE, lease_s=30.0, idle_max_s=0.1)
    left_running = []
    for _ in range(20):
        runtime = Runtime(store, send=send, nodes=4, config=config, shutdown_timeout_s=0.01)
        await runtime.start()
        await asyncio.sleep(rng.uniform(0, 0.01))
        await runtime.shutdown()
        left_running.append((await store.stats(QUEUE)).counts.get(TaskStatus.RUNNING, 0))
    assert left_running == [0] * 20


async def test_a_send_cut_short_on_its_last_attempt_leaves_the_task_dead_as_a_crash_would(make_store: Any) -> None:
    """``max_attempts`` bounds the deliveries: a cut send on the last attempt is not sent once more."""
    store = await make_store(clock=None)
    task_id = (await store.enqueue(QUEUE, {"m": "once"}, partition_key="chat-1", max_attempts=1)).task.id
    started = asyncio.Event()
    sends = 0

    async def slow(task: Task) -> None:
        nonlocal sends
        sends += 1
        started.set()
        await asyncio.sleep(30)

    async with Runtime(store, send=slow, nodes=1, config=NodeConfig(queue=QUEUE), shutdown_timeout_s=0.05):
        await asyncio.wait_for(started.wait(), 10)
    task = await store.get(task_id)
    assert (task.status, task.attempts, task.last_error) == (TaskStatus.DEAD, 1, CUT_ON_LAST_ATTEMPT)
    async with Runtime(store, send=slow, nodes=1, config=NodeConfig(queue=QUEUE), shutdown_timeout_s=0.05) as again:
        assert await again.wait_until_drained(timeout_s=5)
    assert sends == 1


async def test_a_send_cut_by_a_lost_lock_keeps_its_attempt_when_shutdown_cuts_its_failure_record(
    db_path: Path,
) -> None:
    """The lock is lost mid-send (its failure is being recorded, slowly: a busy store) when the
    runtime shuts down: the task is handed back, and its started send still counts."""
    starts = 0

    class SlowFailure(SQLiteStore):
        async def fail(self, task: Task, error: str, *, retry: Any = None) -> Task:
            if error.startswith("LockLostError"):
                await asyncio.sleep(SETTLE_WAIT_S + 1.0)  # past the wait of the shutdown for settles
            out: Task = await super().fail(task, error, retry=retry)
            return out

    async with SlowFailure(db_path) as store:
        task_id = (await store.enqueue(QUEUE, {"a": 1}, partition_key="k", max_attempts=3)).task.id

        async def send(task: Task) -> None:
            nonlocal starts
            starts += 1
            lock = current_delivery().lock
            assert lock is not None
            await store.release_lock(lock)  # lost, as on a lapsed TTL: the watchdog cuts the send
            await asyncio.sleep(5.0)

        config = NodeConfig(queue=QUEUE, lock_ttl_s=0.3)
        runtime = Runtime(store, send=send, nodes=1, config=config, shutdown_timeout_s=0.1, lock_key=lambda t: "acct")
        await runtime.start()
        await asyncio.sleep(0.6)
        await runtime.shutdown()
        task = await store.get(task_id)
    assert (starts, task.status, task.attempts) == (1, TaskStatus.PENDING, 1)
