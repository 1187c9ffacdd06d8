"""A send that returned is settled once: commits retried past a busy store, permits that cannot
cancel a commit, and what a send may raise or return without stopping the runtime."""

from __future__ import annotations

import asyncio
import logging
import secrets
import sqlite3
import threading
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest
from services import REDIS_URL, redis_problem, unavailable

from asynccoord import (
    InvalidTypeError,
    LockLostError,
    MemoryStore,
    Node,
    NodeConfig,
    RetryPolicy,
    Runtime,
    Semaphore,
    SQLiteStore,
    StoreConfig,
    Task,
    TaskStatus,
    Undeliverable,
    current_delivery,
)
from asynccoord import events as ev

FAST = NodeConfig(
    queue="q",
    lease_s=5.0,
    idle_min_s=0.01,
    idle_max_s=0.05,
    retry=RetryPolicy(base_s=0.01, factor=1.0, cap_s=0.01, jitter=0.0),
)


def _hold_write_lock(path: Path, seconds: float, held: threading.Event) -> None:
    """Another connection (another process, as far as SQLite can tell) keeps the write lock."""
    conn = sqlite3.connect(path, timeout=30)
    try:
        conn.execute("BEGIN IMMEDIATE")
        held.set()
        time.sleep(seconds)
        conn.execute("ROLLBACK")
    finally:
        conn.close()


async def _write_lock_taken(path: Path, seconds: float) -> None:
    """Return once another connection holds the write lock, which it keeps for ``seconds``."""
    held = threading.Event()
    threading.Thread(target=_hold_write_lock, args=(path, seconds, held), daemon=True).start()
    await asyncio.to_thread(held.wait, 5.0)


async def _run_until_settled(store: SQLiteStore, node: Node, task_id: int, timeout_s: float = 15.0) -> Task:
    runner = asyncio.create_task(node.run())
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            task = await store.get(task_id)
            if task.status in (TaskStatus.DONE, TaskStatus.DEAD) or (
                task.status is TaskStatus.PENDING and task.last_error is not None
            ):
                break
            await asyncio.sleep(0.05)
    finally:
        node.stop_claiming()
        await asyncio.wait_for(runner, 15.0)
    return await store.get(task_id)


@pytest.mark.parametrize(
    ("permits", "fails", "batch"),
    [(0, False, False), (0, False, True), (0, True, True), (1, False, False), (2, False, False), (1, True, False)],
)
async def test_a_store_busy_past_its_timeout_delays_the_commit_but_never_drops_it(
    tmp_path: Path, permits: int, fails: bool, batch: bool
) -> None:
    """The write lock is held (1.5 s) past ``busy_timeout_s`` (0.3 s) just as the send returns.

    The commit (or the failure record of a send that raised) is tried again while the
    lease (5 s) lasts: sent once, settled once, no conflict, nothing handed back. ``batch``:
    the task is handled by a :class:`~asynccoord.node.batch.LocklessBatch` (no lock, no
    commit-and-continue), whose commit of a whole claim is tried again task by task.
    """
    path = tmp_path / "q.db"
    async with SQLiteStore(path, config=StoreConfig(busy_timeout_s=0.3)) as store:
        task = (await store.enqueue("q", {"n": 1}, partition_key="c", idempotency_key="m1", max_attempts=1)).task
        sends: list[int] = []

        async def send(task: Task) -> str:
            sends.append(task.attempts)
            await _write_lock_taken(path, 1.5)
            if fails:
                raise ConnectionError("the chat API said no")
            return "sent"

        config = NodeConfig(
            queue="q",
            lease_s=5.0,
            lock_ttl_s=10.0,
            lock_permits=max(permits, 1),
            idle_min_s=0.05,
            idle_max_s=0.1,
            claim_next=not batch,
        )
        lock_key = None if permits == 0 else (lambda task: "account:1")
        node = Node(store, send, node_id="n1", config=config, lock_key=lock_key)
        started = time.monotonic()
        out = await _run_until_settled(store, node, task.id)
        assert sends == [1]
        assert time.monotonic() - started >= 1.0  # it did wait behind the other connection
        state = node.state()
        assert (state.conflicts, state.handed_back) == (0, 0)
        if fails:
            assert out.status is TaskStatus.DEAD  # max_attempts 1: the failure was recorded, not dropped
            assert out.last_error == "ConnectionError: the chat API said no"
            assert (state.failed, state.committed) == (1, 0)
        else:
            assert out.status is TaskStatus.DONE
            assert out.result == "sent"
            assert out.attempts == 1
            assert state.committed == 1
        assert await store.list_locks() == []


async def test_a_commit_still_failing_at_the_lease_deadline_gives_up_and_the_task_is_claimed_again(
    tmp_path: Path, pipeline: dict[str, Any]
) -> None:
    """Past the lease there is nothing left to commit under: the try stops; the task's next claim settles it."""
    path = tmp_path / "q.db"
    async with SQLiteStore(path, config=StoreConfig(busy_timeout_s=0.2)) as store:
        task = (await store.enqueue("q", {"n": 1}, partition_key="c", idempotency_key="m1")).task
        sends: list[int] = []

        async def send(task: Task) -> None:
            sends.append(task.attempts)
            if len(sends) == 1:
                await _write_lock_taken(path, 2.5)

        config = NodeConfig(queue="q", lease_s=1.5, idle_min_s=0.05, idle_max_s=0.1, **pipeline)
        node = Node(store, send, node_id="n1", config=config)
        started = time.monotonic()
        out = await _run_until_settled(store, node, task.id, timeout_s=20.0)
        assert out.status is TaskStatus.DONE
        assert sends == [1, 2]  # the second claim, after the lease lapsed, sent it again
        assert time.monotonic() - started >= 1.5
        assert node.state().conflicts == 1  # the dropped commit is counted


async def test_a_permit_lost_after_the_send_returned_cannot_cancel_the_commit(tmp_path: Path) -> None:
    """``lock_permits`` > 1: the permit is given back before the commit, so its loss (the store
    too busy to renew it) can no longer cancel a commit whose message went out."""
    path = tmp_path / "q.db"
    async with SQLiteStore(path) as store:
        task = (await store.enqueue("q", {"n": 1}, partition_key="c", idempotency_key="m1")).task
        sends: list[int] = []

        async def send(task: Task) -> str:
            sends.append(task.attempts)
            await _write_lock_taken(path, 1.2)
            return "sent"

        config = NodeConfig(queue="q", lease_s=5.0, lock_ttl_s=0.3, lock_permits=2, idle_min_s=0.05, idle_max_s=0.1)
        node = Node(store, send, node_id="n1", config=config, lock_key=lambda task: "account:1")
        out = await _run_until_settled(store, node, task.id)
        assert out.status is TaskStatus.DONE
        assert sends == [1]
        assert node.state().committed == 1
        assert node.state().conflicts == 0


async def _lose_own_lock(store: MemoryStore) -> None:
    """Release the lock of the delivery under way, as if it had lapsed: its next renewal fails."""
    lease = current_delivery().lock
    assert lease is not None
    await store.release_lock(lease)


async def test_a_permit_lost_during_the_send_cuts_it_and_nothing_is_committed() -> None:
    """The semaphore path's loss still cancels the send (as a lock's does) and never commits."""
    async with MemoryStore() as store:
        task = (await store.enqueue("q", {"n": 1}, partition_key="c", max_attempts=5)).task
        cut = asyncio.Event()
        sends = 0

        async def send(task: Task) -> None:
            nonlocal sends
            sends += 1
            if sends == 1:
                await _lose_own_lock(store)
                try:
                    await asyncio.sleep(10.0)
                except asyncio.CancelledError:
                    cut.set()
                    raise

        config = NodeConfig(queue="q", lease_s=5.0, lock_ttl_s=0.3, lock_permits=3, idle_min_s=0.01, idle_max_s=0.05)
        runtime = Runtime(store, send=send, nodes=1, config=config, lock_key=lambda task: "account:1")
        async with runtime:
            await asyncio.wait_for(cut.wait(), 5.0)
            assert await runtime.wait_until_drained(timeout_s=15.0, poll_s=0.02)
        out = await store.get(task.id)
        assert out.status is TaskStatus.DONE
        assert sends == 2  # cut once, then claimed again (a failed attempt, retried)
        assert store.events.snapshot()[ev.LOCK_LOST] >= 1


class Poison(BaseException):
    """What some libraries raise for their own timeouts: not an ``Exception``."""


async def test_a_send_raising_a_base_exception_fails_its_task_and_the_runtime_goes_on(pipeline: dict[str, Any]) -> None:
    async with MemoryStore() as store:
        for n in range(6):
            await store.enqueue("q", {"n": n}, partition_key=f"c{n}", max_attempts=3)
        attempts: Counter[int] = Counter()

        async def send(task: Task) -> None:
            attempts[task.payload["n"]] += 1
            if task.payload["n"] == 0:
                raise Poison("boom")

        runtime = Runtime(store, send=send, nodes=3, config=replace(FAST, **pipeline))
        async with runtime:
            assert await runtime.wait_until_drained(timeout_s=10.0, poll_s=0.01)
            assert all(s.status.value == "running" for s in runtime.states())
        counts = (await store.stats("q")).counts
        assert counts[TaskStatus.DONE] == 5
        assert counts[TaskStatus.DEAD] == 1
        assert attempts == Counter({0: 3, 1: 1, 2: 1, 3: 1, 4: 1, 5: 1})
        (dead,) = [t for t in store._tasks.values() if t.status is TaskStatus.DEAD]
        assert (dead.attempts, dead.last_error) == (3, "Poison: boom")


async def test_a_lock_key_raising_a_base_exception_fails_its_task_only() -> None:
    async with MemoryStore() as store:
        for n in range(4):
            await store.enqueue("q", {"n": n}, partition_key=f"c{n}", max_attempts=2)

        def lock_key(task: Task) -> str:
            if task.payload["n"] == 0:
                raise Poison("no key")
            return f"account:{task.payload['n']}"

        sent: list[int] = []

        async def send(task: Task) -> None:
            sent.append(task.payload["n"])

        runtime = Runtime(store, send=send, nodes=2, config=FAST, lock_key=lock_key)
        async with runtime:
            assert await runtime.wait_until_drained(timeout_s=10.0, poll_s=0.01)
        counts = (await store.stats("q")).counts
        assert (counts[TaskStatus.DONE], counts[TaskStatus.DEAD]) == (3, 1)
        assert sorted(sent) == [1, 2, 3]


async def test_a_result_whose_encoding_raises_is_committed_without_it(pipeline: dict[str, Any]) -> None:
    class Odd(dict[str, Any]):
        def items(self) -> Any:
            raise RuntimeError("items() failed")

    async with MemoryStore() as store:
        task = (await store.enqueue("q", {"n": 1}, partition_key="c")).task
        calls = 0

        async def send(task: Task) -> Any:
            nonlocal calls
            calls += 1
            return Odd(a=1)

        runtime = Runtime(store, send=send, nodes=1, config=replace(FAST, **pipeline))
        async with runtime:
            assert await runtime.wait_until_drained(timeout_s=10.0, poll_s=0.01)
        out = await store.get(task.id)
        assert (out.status, out.result, calls) == (TaskStatus.DONE, None, 1)


async def test_semaphore_on_lost_reports_a_lease_lost_outside_a_block() -> None:
    async with MemoryStore() as store:
        lost: list[LockLostError] = []
        handle = Semaphore(store, "account:1", 2, ttl_s=0.3, renew_interval_s=0.1, on_lost=lost.append)
        lease = await handle.acquire(timeout_s=1.0)
        await store.release_lock(lease)  # taken from it: the next renewal finds it gone
        for _ in range(100):
            if lost:
                break
            await asyncio.sleep(0.01)
        assert len(lost) == 1
        assert isinstance(lost[0], LockLostError)
        await asyncio.sleep(0.3)
        assert len(lost) == 1  # once per lease


@pytest.mark.parametrize("on_lost", [42, "print"])
def test_a_bad_on_lost_is_refused(on_lost: Any) -> None:
    from asynccoord import InvalidTypeError, Lock

    store = MemoryStore()
    with pytest.raises(InvalidTypeError, match="on_lost"):
        Lock(store, "a", on_lost=on_lost)


def test_an_async_on_lost_is_refused() -> None:
    from asynccoord import InvalidTypeError, Lock

    async def on_lost(error: LockLostError) -> None:
        return None

    with pytest.raises(InvalidTypeError, match="on_lost"):
        Semaphore(MemoryStore(), "a", 2, on_lost=on_lost)  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match="on_lost"):
        Lock(MemoryStore(), "a", on_lost=on_lost)  # type: ignore[arg-type]


@pytest.mark.parametrize("permits", [1, 2])
async def test_a_lock_lost_just_after_the_send_returned_does_not_discard_it(permits: int) -> None:
    """The loop was blocked past the lock's deadline (a sync call, a loaded machine); the send
    then yields once and returns: the message went out. The loss the watchdog reports in the
    loop turns before the node sees the return cuts nothing: the task is committed (for a lock,
    its fence decides: nobody wrote with a newer token), never sent again."""
    async with MemoryStore() as store:
        task = (await store.enqueue("q", {"n": 1}, partition_key="c")).task
        sends = 0

        async def send(task: Task) -> str:
            nonlocal sends
            sends += 1
            if sends == 1:
                time.sleep(0.8)  # past the lease's local deadline (TTL 0.6 s)
                await asyncio.sleep(0)
            return "sent"

        config = NodeConfig(
            queue="q", lease_s=3.0, lock_ttl_s=0.6, lock_permits=permits, idle_min_s=0.01, idle_max_s=0.05
        )
        runtime = Runtime(store, send=send, nodes=1, config=config, lock_key=lambda task: "account:1")
        async with runtime:
            assert await runtime.wait_until_drained(timeout_s=20.0, poll_s=0.02)
            state = runtime.states()[0]
        out = await store.get(task.id)
        assert (out.status, out.result) == (TaskStatus.DONE, "sent")
        assert sends == 1
        assert (state.committed, state.conflicts) == (1, 0)
        assert store.events.snapshot()[ev.LOCK_LOST] == 1  # the loss itself is still counted


class _Exit(BaseException):
    pass


@pytest.mark.parametrize("kind", ["system_exit", "keyboard_interrupt"])
async def test_a_group_holding_a_process_exit_stops_the_node_instead_of_failing_the_task(
    kind: str, pipeline: dict[str, Any]
) -> None:
    async with MemoryStore() as store:
        task = (await store.enqueue("q", {"n": 1}, partition_key="c", max_attempts=2)).task
        leaf: BaseException = SystemExit(3) if kind == "system_exit" else KeyboardInterrupt()

        sends = 0

        async def send(task: Task) -> None:
            nonlocal sends
            sends += 1
            raise BaseExceptionGroup("send's task group", [ValueError("x"), leaf])

        node = Node(store, send, node_id="n1", config=replace(FAST, **pipeline))
        # the group's exit itself, as asyncio.TaskGroup raises it: the process ends with its status
        with anyio.fail_after(10.0), pytest.raises(type(leaf)) as info:
            await node.run()
        assert info.value is leaf
        out = await store.get(task.id)
        assert out.status is TaskStatus.PENDING  # handed back, not failed
        assert (out.attempts, out.last_error) == (1, None)  # its send started: the attempt stays counted
        assert sends == 1  # the exit stops the node at once: the task is not claimed and sent again


async def test_an_on_lost_raising_a_base_exception_does_not_stop_the_watchdog() -> None:
    """A's callback raises (A reached its max_hold_s); B, held meanwhile, is still renewed: nobody else gets it."""
    from asynccoord import Lock, LockTimeoutError

    async with MemoryStore() as store:

        def bad(error: LockLostError) -> None:
            raise _Exit("callback")

        a = Lock(store, "a", ttl_s=0.6, renew_interval_s=0.2, max_hold_s=0.5, on_lost=bad)
        await a.acquire(timeout_s=1.0)
        async with Lock(store, "b", ttl_s=0.6, renew_interval_s=0.2):
            await asyncio.sleep(1.5)  # A was given up at 0.5 s; B's lease (0.6 s) needs renewals since
            intruder = Lock(store, "b", ttl_s=5.0, holder="intruder")
            with pytest.raises(LockTimeoutError):
                await intruder.acquire(timeout_s=0.8)
        assert store.events.snapshot()[ev.LOCK_LOST] == 1  # A only


def test_an_object_with_an_async_call_is_refused_as_on_lost() -> None:
    from asynccoord import InvalidTypeError, Lock

    class Notifier:
        async def __call__(self, error: LockLostError) -> None:
            return None

    with pytest.raises(InvalidTypeError, match="on_lost"):
        Lock(MemoryStore(), "a", on_lost=Notifier())  # type: ignore[arg-type]


@pytest.mark.parametrize("permits", [1, 2])
async def test_a_send_cut_by_a_lost_lock_is_a_failed_attempt_retried_without_waiting_for_its_lease(
    permits: int,
) -> None:
    """The task's lease (30 s) still holds when its lock is lost: the attempt is recorded as failed
    at once, and the retry policy (not the lease's lapse) brings the task back."""
    async with MemoryStore() as store:
        task = (await store.enqueue("q", {"n": 1}, partition_key="c", max_attempts=3)).task
        sends = 0

        async def send(task: Task) -> str:
            nonlocal sends
            sends += 1
            if sends == 1:
                await _lose_own_lock(store)
                await asyncio.sleep(10.0)
            return "sent"

        config = NodeConfig(
            queue="q",
            lease_s=30.0,
            lock_ttl_s=0.3,
            lock_permits=permits,
            idle_min_s=0.01,
            idle_max_s=0.05,
            retry=RetryPolicy(base_s=0.05, factor=1.0, cap_s=0.05, jitter=0.0),
        )
        runtime = Runtime(store, send=send, nodes=1, config=config, lock_key=lambda task: "account:1")
        started = time.monotonic()
        async with runtime:
            assert await runtime.wait_until_drained(timeout_s=10.0, poll_s=0.02)
            state = runtime.states()[0]
        assert time.monotonic() - started < 5.0  # far from the 30 s lease
        out = await store.get(task.id)
        assert (out.status, out.result, out.attempts) == (TaskStatus.DONE, "sent", 2)
        assert sends == 2
        assert (state.committed, state.conflicts) == (1, 1)
        assert store.events.snapshot()[ev.RETRIES] == 1


async def test_a_redis_fencing_counter_set_back_is_repaired_at_the_first_refused_commit(
    db_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A Redis restart from an RDB snapshot sets a lock's fencing counter back below the token
    the queue store accepted last: the first commit under the lock is refused, the counter is
    moved past that token, and from the next acquisition on commits go through (before, every
    commit was refused until the counter caught up, and the tasks went dead)."""
    problem = redis_problem()
    if problem is not None:
        unavailable("Redis", problem)
    import redis.asyncio as aioredis

    from asynccoord.backends.redis import RedisLockStore

    prefix = f"test:{secrets.token_hex(6)}:"
    caplog.set_level(logging.WARNING)
    sends: list[tuple[int, int]] = []

    async def send(task: Task) -> None:
        lock = current_delivery().lock
        assert lock is not None
        sends.append((task.id, lock.fencing_token))

    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        async with SQLiteStore(db_path) as queue, RedisLockStore(REDIS_URL, prefix=prefix) as locks:
            await queue.fence("acct:1", 15)  # commits under tokens up to 15 landed before the restart
            await client.set(f"{prefix}fencing:acct:1", 3)  # the snapshot the restart loaded had 3
            config = replace(FAST, lease_s=1.0)
            node = Node(queue, send, node_id="n1", config=config, lock_key=lambda t: "acct:1", lock_store=locks)
            first = (await queue.enqueue("q", "first")).task.id
            done = await _run_until_settled(queue, node, first)
            assert done.status is TaskStatus.DONE
            # Sent with token 4 (refused: lower than 15), then, once its lease lapsed, with 16.
            assert sends == [(first, 4), (first, 16)]
            assert done.attempts == 2
            assert await client.get(f"{prefix}fencing:acct:1") == b"16"
            fence = await queue.read_fence("acct:1")
            assert fence is not None
            assert fence.fencing_token == 16
            assert queue.events.get(ev.FENCING_REJECTED) == 1
            assert node.state().conflicts == 1

            # The counter stays repaired: the next tasks are committed at their first send.
            node = Node(queue, send, node_id="n2", config=config, lock_key=lambda t: "acct:1", lock_store=locks)
            later = [(await queue.enqueue("q", f"later-{i}", partition_key=f"c{i}")).task.id for i in range(3)]
            for task_id in later:
                assert (await _run_until_settled(queue, node, task_id)).status is TaskStatus.DONE
            assert [task_id for task_id, _ in sends[2:]] == later
            assert all(token > 16 for _, token in sends[2:])
            assert queue.events.get(ev.FENCING_REJECTED) == 1
    finally:
        keys = [key async for key in client.scan_iter(match=f"{prefix}*", count=1000)]
        if keys:
            await client.delete(*keys)
        await client.aclose()
    behind = [r for r in caplog.records if r.getMessage().startswith("asynccoord.redis.fencing_counter_behind")]
    assert len(behind) == 1  # once for the lock
    assert "name='acct:1' counter=4 accepted=15" in behind[0].getMessage()


async def test_a_failing_send_is_logged_with_its_traceback_each_attempt_and_once_dead(
    make_store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug in ``send`` shows in the log on its first attempt, where it is, not only in ``last_error``."""
    store = await make_store(clock=None)
    caplog.set_level(logging.WARNING, logger="asynccoord.node.settle")
    bad = (await store.enqueue("q", {"n": 1}, partition_key="c", max_attempts=2)).task
    good = (await store.enqueue("q", {"n": 2}, partition_key="d")).task

    async def send(task: Task) -> None:
        if task.payload["n"] == 1:
            task.payload.no_such_method()  # the bot author's typo

    async with Runtime(store, send=send, config=FAST, nodes=2) as runtime:
        await runtime.wait_until_drained(timeout_s=20)
    assert (await store.get(bad.id)).status is TaskStatus.DEAD
    assert (await store.get(good.id)).status is TaskStatus.DONE
    lines = [r for r in caplog.records if "asynccoord.node.send_failed" in r.getMessage()]
    assert [(r.levelno, r.getMessage().split(" error=")[0].split(" node=")[0]) for r in lines] == [
        (logging.WARNING, "asynccoord.node.send_failed"),
        (logging.ERROR, "asynccoord.node.send_failed_dead"),
    ]
    first, last = lines
    assert f"task={bad.id} attempt=1/2 retry_in_s=" in first.getMessage()
    assert f"task={bad.id} attempts=2 " in last.getMessage()
    for record in lines:
        assert "AttributeError: 'dict' object has no attribute 'no_such_method'" in record.getMessage()
        assert record.exc_info is not None
        assert isinstance(record.exc_info[1], AttributeError)
        assert "task.payload.no_such_method()" in caplog.text  # the send's own line, in the traceback


async def test_a_timed_out_send_is_logged_without_a_traceback(
    make_store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    store = await make_store(clock=None)
    caplog.set_level(logging.WARNING, logger="asynccoord.node.settle")
    task = (await store.enqueue("q", {"n": 1}, partition_key="c", max_attempts=1)).task

    async def send(task: Task) -> None:
        await asyncio.sleep(30)

    config = replace(FAST, send_timeout_s=0.05)
    async with Runtime(store, send=send, config=config, nodes=1) as runtime:
        await runtime.wait_until_drained(timeout_s=20)
    assert (await store.get(task.id)).status is TaskStatus.DEAD
    lines = [r for r in caplog.records if "asynccoord.node.send_failed" in r.getMessage()]
    assert len(lines) == 1
    assert lines[0].levelno == logging.ERROR
    assert "error=TimeoutError" in lines[0].getMessage()
    assert lines[0].exc_info is None


async def test_an_undeliverable_message_is_a_dead_letter_at_once_and_its_conversation_goes_on(
    make_store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """``raise Undeliverable(...)``: no retry of the five attempts, the conversation's next message is sent."""
    store = await make_store(clock=None)
    caplog.set_level(logging.INFO, logger="asynccoord.node.settle")
    refused = (await store.enqueue("q", {"n": 1}, partition_key="c", max_attempts=5)).task
    after = (await store.enqueue("q", {"n": 2}, partition_key="c")).task
    calls: Counter[int] = Counter()

    async def send(task: Task) -> None:
        calls[task.payload["n"]] += 1
        if task.payload["n"] == 1:
            raise Undeliverable("400 Bad Request: message is too long")

    async with Runtime(store, send=send, config=FAST, nodes=2) as runtime:
        await runtime.wait_until_drained(timeout_s=20)
    dead = await store.get(refused.id)
    assert (dead.status, dead.attempts) == (TaskStatus.DEAD, 1)
    assert dead.last_error == "Undeliverable: 400 Bad Request: message is too long"
    assert (await store.get(after.id)).status is TaskStatus.DONE
    assert calls == {1: 1, 2: 1}
    assert store.events.get(ev.DEAD_LETTERED) == 1
    lines = [r for r in caplog.records if r.getMessage().startswith("asynccoord.node.send_")]
    assert [(r.levelno, r.getMessage().split(" ")[0]) for r in lines] == [
        (logging.WARNING, "asynccoord.node.send_undeliverable")
    ]
    assert f"task={refused.id} attempt=1/5 " in lines[0].getMessage()


def test_undeliverable_takes_a_str_reason_and_pickles() -> None:
    import pickle

    error = pickle.loads(pickle.dumps(Undeliverable("403 Forbidden")))
    assert isinstance(error, Undeliverable)
    assert (error.reason, str(error)) == ("403 Forbidden", "403 Forbidden")
    with pytest.raises(InvalidTypeError, match="reason must be a str"):
        Undeliverable(403)  # type: ignore[arg-type]


async def test_an_undeliverable_raised_in_a_task_group_is_a_dead_letter_at_once(
    make_store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A send built on a task group raises its ``Undeliverable`` inside an exception group: still no
    retry; a group that also holds another error is an ordinary failure, retried."""
    store = await make_store(clock=None)
    caplog.set_level(logging.INFO, logger="asynccoord.node.settle")
    refused = (await store.enqueue("q", {"n": 1}, partition_key="c", max_attempts=5)).task
    mixed = (await store.enqueue("q", {"n": 2}, partition_key="d", max_attempts=3)).task
    calls: Counter[int] = Counter()

    async def part(error: Exception) -> None:
        raise error

    async def send(task: Task) -> None:
        n = task.payload["n"]
        calls[n] += 1
        async with asyncio.TaskGroup() as group:
            group.create_task(part(Undeliverable("400 Bad Request: chat not found")))
            if n == 2:
                group.create_task(part(ConnectionResetError("reset")))

    async with Runtime(store, send=send, config=FAST, nodes=2) as runtime:
        await runtime.wait_until_drained(timeout_s=20)
    dead = await store.get(refused.id)
    assert (dead.status, dead.attempts) == (TaskStatus.DEAD, 1)
    assert dead.last_error == "Undeliverable: 400 Bad Request: chat not found"
    retried = await store.get(mixed.id)
    assert (retried.status, retried.attempts) == (TaskStatus.DEAD, 3)
    assert calls == {1: 1, 2: 3}
    undeliverable = [r for r in caplog.records if r.getMessage().startswith("asynccoord.node.send_undeliverable")]
    assert len(undeliverable) == 1
    assert f"task={refused.id} attempt=1/5 " in undeliverable[0].getMessage()


async def test_a_failing_send_logs_its_traceback_on_the_first_and_last_attempts_only(
    make_store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A provider that is down fails every attempt: one traceback shows where, the retries between say only why."""
    store = await make_store(clock=None)
    caplog.set_level(logging.WARNING, logger="asynccoord.node.settle")
    task = (await store.enqueue("q", {"n": 1}, partition_key="c", max_attempts=4)).task

    async def send(task: Task) -> None:
        raise ConnectionError("provider down")

    async with Runtime(store, send=send, config=FAST, nodes=1) as runtime:
        await runtime.wait_until_drained(timeout_s=20)
    assert (await store.get(task.id)).status is TaskStatus.DEAD
    lines = [r for r in caplog.records if "asynccoord.node.send_failed" in r.getMessage()]
    assert [(r.getMessage().split(" ")[0], r.exc_info is not None) for r in lines] == [
        ("asynccoord.node.send_failed", True),
        ("asynccoord.node.send_failed", False),
        ("asynccoord.node.send_failed", False),
        ("asynccoord.node.send_failed_dead", True),
    ]
    assert [f"attempt={n}/4 " in r.getMessage() for n, r in zip((1, 2, 3), lines, strict=False)] == [True] * 3
