"""A ``KeyboardInterrupt`` or ``SystemExit`` raised by a send or by ``lock_key``: the process is ending.

asyncio lets either out of the event loop the moment a task raises it, and ``asyncio.run``
then cancels whatever is left in no order, the store's own tasks among them. Before, the
nodes' hand-backs were cut off that way: the tasks stayed claimed until their leases
lapsed, the locks and the membership stayed held, and the process took 6 s to end. Now the
node stops as if cancelled, every task handed back and every lock released, and only then
is the original exception raised, to whoever awaits the node or the runtime.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from support import TESTS

from asynccoord import Node, NodeConfig, NodeStatus, Runtime, SQLiteStore, Task, TaskStatus

WORKERS = TESTS / "workers"
CONFIG = NodeConfig(queue="q", lease_s=30.0, lock_ttl_s=10.0, idle_min_s=0.01, idle_max_s=0.05)
EXITS: dict[str, Callable[[], BaseException]] = {
    "keyboard_interrupt": KeyboardInterrupt,
    "system_exit": lambda: SystemExit(3),
}
EXIT_TYPES = {"keyboard_interrupt": KeyboardInterrupt, "system_exit": SystemExit}


def user_code(kind: str, source: str) -> tuple[Any, Any, asyncio.Event]:
    """A send and a lock_key: task 0's send runs for 30 s; task 1's send (or lock_key) raises ``kind``."""
    in_flight = asyncio.Event()

    async def send(task: Task) -> None:
        if source == "send" and task.payload == 1:
            raise EXITS[kind]()
        in_flight.set()
        await asyncio.sleep(30.0)

    def lock_key(task: Task) -> str:
        if source == "lock_key" and task.payload == 1:
            raise EXITS[kind]()
        return f"account:{task.payload}"

    return send, lock_key, in_flight


async def enqueue_after(store: Any, in_flight: asyncio.Event) -> None:
    await in_flight.wait()
    await store.enqueue("q", 1, partition_key="c1")


async def assert_all_handed_back(store: Any, attempts: list[int]) -> None:
    """Every task pending with ``attempts[i]`` attempts (1 for a task whose send started: it may
    have gone out; 0 for one handed back unsent), no failure, no lock held (a claim cut at the
    store is handed back in the background by the PostgreSQL store: allowed 5 s)."""
    handed_back = [(TaskStatus.PENDING, n, None) for n in attempts]
    with anyio.move_on_after(5.0):
        while True:
            tasks = [await store.get(task_id) for task_id in range(1, len(attempts) + 1)]
            if [(t.status, t.attempts, t.last_error) for t in tasks] == handed_back:
                break
            await asyncio.sleep(0.02)
    assert [(t.status, t.attempts, t.last_error) for t in tasks] == handed_back
    assert await store.list_locks() == []


@pytest.mark.parametrize("source", ["send", "lock_key"])
@pytest.mark.parametrize("kind", ["keyboard_interrupt", "system_exit"])
async def test_a_node_hands_every_task_back_then_raises_the_exit(store: Any, kind: str, source: str) -> None:
    send, lock_key, in_flight = user_code(kind, source)
    await store.enqueue("q", 0, partition_key="c0")
    node = Node(store, send, node_id="n1", config=CONFIG, lock_key=lock_key)
    enqueuer = asyncio.create_task(enqueue_after(store, in_flight))
    # Awaited in this task: the exit must come out of run() itself, not out of the event loop.
    with anyio.fail_after(10.0), pytest.raises(EXIT_TYPES[kind]):
        await node.run()
    await enqueuer
    assert node.state().status is NodeStatus.STOPPED  # not failed: nothing was wrong with the node
    # Both sends started (the 30 s one, and the one that raised), so both attempts count;
    # a lock_key that raised stopped its task before its send.
    await assert_all_handed_back(store, [1, 1] if source == "send" else [1, 0])


@pytest.mark.parametrize("claim_next", [True, False], ids=["slots", "batch"])
async def test_an_exit_from_the_cleanup_of_a_timed_out_send_stops_the_node_too(store: Any, claim_next: bool) -> None:
    """The node no longer reads a cut send's outcome: the exit used to be dropped (or, before, to end the loop).

    ``batch``: the task goes to a LocklessBatch (no lock, no commit-and-continue)."""
    await store.enqueue("q", 0, partition_key="c0")

    async def send(task: Task) -> None:
        try:
            await asyncio.sleep(30.0)
        finally:
            raise SystemExit(4)  # cut at send_timeout_s; its cleanup ends the process

    config = dataclasses.replace(CONFIG, send_timeout_s=0.2, claim_next=claim_next)
    node = Node(store, send, node_id="n1", config=config)
    with anyio.fail_after(10.0), pytest.raises(SystemExit) as info:
        await node.run()
    assert info.value.code == 4
    assert node.state().status is NodeStatus.STOPPED
    task = await store.get(1)  # the timeout is a failed attempt (recorded before the cleanup ended)
    assert (task.status, task.attempts, task.last_error) == (TaskStatus.PENDING, 1, "TimeoutError")
    assert await store.list_locks() == []


@pytest.mark.parametrize("claim_next", [True, False], ids=["slots", "batch"])
async def test_an_exit_from_the_cleanup_of_a_send_cut_by_the_nodes_cancellation_is_raised(
    store: Any, claim_next: bool
) -> None:
    """The node is cancelled while its send runs; the cut send's cleanup raises SystemExit: the
    task is handed back, and the exit, not the cancellation, comes out of run()."""
    await store.enqueue("q", 0, partition_key="c0")
    started = asyncio.Event()

    async def send(task: Task) -> None:
        started.set()
        try:
            await asyncio.sleep(30.0)
        finally:
            raise SystemExit(5)

    node = Node(store, send, node_id="n1", config=dataclasses.replace(CONFIG, claim_next=claim_next))
    scope = anyio.CancelScope()

    async def run_until_cancelled() -> None:
        with scope:
            await node.run()

    async def cancel_once_sent() -> None:
        await started.wait()
        scope.cancel()

    canceller = asyncio.create_task(cancel_once_sent())
    with anyio.fail_after(10.0), pytest.raises(SystemExit) as info:
        await run_until_cancelled()  # in this task: asyncio lets an exit out of a task of its own
    await canceller
    assert info.value.code == 5
    assert node.state().status is NodeStatus.STOPPED
    await assert_all_handed_back(store, [1])


@pytest.mark.parametrize("kind", ["keyboard_interrupt", "system_exit"])
async def test_a_runtime_stops_every_node_and_its_waiters_raise_the_exit(db_path: Path, kind: str) -> None:
    send, lock_key, in_flight = user_code(kind, "send")
    async with SQLiteStore(db_path) as store:
        await store.enqueue("q", 0, partition_key="c0")
        runtime = Runtime(store, send=send, nodes=3, config=CONFIG, lock_key=lock_key, shutdown_timeout_s=30.0)
        before = {t.get_name() for t in asyncio.all_tasks()}  # the store's own (writer, checkpoints)
        await runtime.start()
        enqueuer = asyncio.create_task(enqueue_after(store, in_flight))
        started = time.monotonic()
        with pytest.raises(EXIT_TYPES[kind]) as first:
            await runtime.wait_until_drained(timeout_s=30.0, poll_s=0.02)
        # at its next poll, not after timeout_s: every node stopped, no drain of the 30 s send
        assert time.monotonic() - started < 10.0
        await enqueuer
        with pytest.raises(EXIT_TYPES[kind]) as again:
            await runtime.wait_until_drained(timeout_s=30.0, poll_s=0.02)
        assert again.value is first.value
        assert len(again.traceback) == len(first.traceback)  # raised again, not one frame longer each time
        with pytest.raises(EXIT_TYPES[kind]):
            await runtime.shutdown()
        assert {state.status for state in runtime.states()} == {NodeStatus.STOPPED}
        await assert_all_handed_back(store, [1, 1])  # both sends started
        assert await store.members() == []
        # nothing of the nodes' left running: the store's own tasks, its idle lock watchdogs (they end by themselves)
        left = {t.get_name() for t in asyncio.all_tasks() if not t.done()}
        assert left <= before | {"asynccoord-lock-watchdog"}


async def test_an_exit_in_one_runtime_stops_every_runtime_of_the_process_before_it_is_raised(db_path: Path) -> None:
    """Two runtimes waited on together (``asyncio.gather`` of their waits): the first waiter to raise the
    exit ends the event loop, so the other runtime must have handed back by then (a breaker's find)."""
    in_flight = 0
    all_in_flight = asyncio.Event()

    async def send(task: Task) -> None:
        nonlocal in_flight
        if task.payload == "exit":
            raise SystemExit(3)
        in_flight += 1
        if in_flight == 4:
            all_in_flight.set()
        await asyncio.sleep(30.0)

    async with SQLiteStore(db_path) as store:
        for queue in ("a", "b"):
            for n in range(2):
                await store.enqueue(queue, n, partition_key=f"{queue}{n}")
        runtimes = [
            Runtime(
                store,
                send=send,
                nodes=2,
                config=dataclasses.replace(CONFIG, queue=queue),
                lock_key=lambda task, queue=queue: f"account:{queue}{task.payload}",
                shutdown_timeout_s=30.0,
            )
            for queue in ("a", "b")
        ]
        for runtime in runtimes:
            await runtime.start()
        with anyio.fail_after(10.0):
            await all_in_flight.wait()
            await store.enqueue("a", "exit", partition_key="x")
            with pytest.raises(SystemExit) as raised:
                await runtimes[0].wait_until_drained(timeout_s=30.0, poll_s=0.02)
        assert raised.value.code == 3
        # the other runtime stopped (and handed back) before the exit was raised to anyone
        assert {state.status for state in runtimes[1].states()} == {NodeStatus.STOPPED}
        for runtime in runtimes:  # its waiters raise the exit too
            with pytest.raises(SystemExit):
                await runtime.shutdown()
        tasks = [await store.get(task_id) for task_id in range(1, 6)]
        assert [(t.status, t.attempts) for t in tasks] == [(TaskStatus.PENDING, 1)] * 5  # every send started
        assert await store.list_locks() == []
        assert await store.members() == []


async def test_a_standalone_nodes_exit_stops_the_runtimes_beside_it_before_it_is_raised(db_path: Path) -> None:
    send, lock_key, in_flight = user_code("keyboard_interrupt", "send")
    async with SQLiteStore(db_path) as store:
        await store.enqueue("a", 0, partition_key="c0")
        runtime = Runtime(store, send=send, nodes=2, config=dataclasses.replace(CONFIG, queue="a"), lock_key=lock_key)
        node = Node(store, send, node_id="solo", config=dataclasses.replace(CONFIG, queue="b"))
        await runtime.start()
        with anyio.fail_after(10.0):
            await in_flight.wait()
            await store.enqueue("b", 1, partition_key="x")  # the standalone node's send raises
            with pytest.raises(KeyboardInterrupt):
                await node.run()
        # the runtime stopped, and handed back, before node.run() raised
        assert {state.status for state in runtime.states()} == {NodeStatus.STOPPED}
        with pytest.raises(KeyboardInterrupt):  # its waiters raise the exit too
            await runtime.shutdown()
        await assert_all_handed_back(store, [1, 1])  # both sends started
        assert await store.members() == []


@pytest.mark.parametrize("how", ["runtime_shutdown", "node_stop_claiming"])
async def test_an_exit_raised_once_a_drain_has_begun_is_still_raised(store: Any, how: str) -> None:
    """The node's last hand-back set it drained, and its pipeline ended before the exit came up
    through the claim's task: the exit was dropped and everything returned normally (a breaker's find)."""
    started = asyncio.Event()

    async def send(task: Task) -> None:
        started.set()
        await asyncio.sleep(0.3)  # the drain begins meanwhile
        raise SystemExit(5)

    async def drain_a_runtime() -> None:
        async with Runtime(store, send=send, nodes=1, config=CONFIG, shutdown_timeout_s=5.0) as runtime:
            await started.wait()
            await runtime.shutdown()  # a graceful drain: the send goes on, then raises

    async def drain_a_node() -> None:
        node = Node(store, send, node_id="n1", config=CONFIG)
        asyncio.get_running_loop().call_later(0.1, node.stop_claiming)
        await node.run()

    await store.enqueue("q", 0, partition_key="c0")
    with anyio.fail_after(10.0), pytest.raises(SystemExit) as raised:
        await (drain_a_runtime() if how == "runtime_shutdown" else drain_a_node())
    assert raised.value.code == 5
    await assert_all_handed_back(store, [1])


@pytest.mark.multiprocess
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("source", ["send", "lock_key"])
@pytest.mark.parametrize("kind", ["keyboard_interrupt", "system_exit"])
def test_a_bot_process_ends_with_the_exit_and_leaves_nothing_claimed_or_held(
    python: Any, db_path: Path, kind: str, source: str, loop: str
) -> None:
    """tests/workers/exit_worker.py: 2 nodes under ``wait_for_signal`` in ``asyncio.run``, as a bot runs."""
    started = time.monotonic()
    proc = python.run([str(WORKERS / "exit_worker.py"), str(db_path), loop, kind, source], timeout_s=60.0, check=False)
    elapsed_s = time.monotonic() - started
    if kind == "system_exit":
        assert proc.returncode == 3, proc.stderr
    else:  # Python ends an uncaught KeyboardInterrupt by SIGINT
        assert proc.returncode == -2, proc.stderr
        assert proc.stderr.rstrip().endswith("KeyboardInterrupt"), proc.stderr
    assert "Task was destroyed" not in proc.stderr
    assert "never retrieved" not in proc.stderr
    assert elapsed_s < 20.0  # the 30 s sends were cut, not waited for (it took 6 s of timeouts before)
    with sqlite3.connect(db_path) as conn:
        statuses = conn.execute("SELECT status, count(*), sum(attempts) FROM coord_tasks GROUP BY status").fetchall()
        holders = conn.execute("SELECT count(*) FROM coord_lock_holders").fetchone()[0]
        members = conn.execute("SELECT count(*) FROM coord_members").fetchone()[0]
    # All handed back (before: ('running', 5, 5) until the leases lapsed), each send that started
    # counted: the 4 long ones, and the 5th's unless its lock_key raised before it.
    assert statuses == [("pending", 5, 5 if source == "send" else 4)]
    assert (holders, members) == (0, 0)
