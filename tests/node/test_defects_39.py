"""Defects of issue #39, each reproduced with the public API on real stores."""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from support import wait_until

from asynccoord import (
    InvalidArgumentError,
    Lease,
    Lock,
    LockPool,
    NewTask,
    Node,
    NodeConfig,
    ReadOnlyStoreError,
    RetryPolicy,
    SQLiteStore,
    Task,
    TaskStatus,
)
from asynccoord import events as ev
from asynccoord.backends.sqlite.writer import map_sqlite_error

RENEWAL_DELAY_S = 3.0
"""How long the slow store's lease renewals take to reach the store (three leases)."""


def slow_renewals(store: Any, delay_s: float) -> None:
    """Make ``store``'s lease renewals (``extend`` / ``extend_many``) reach the store only after ``delay_s``."""
    for name in ("extend", "extend_many"):
        original = getattr(store, name)

        async def late(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            await asyncio.sleep(delay_s)
            return await _original(*args, **kwargs)

        setattr(store, name, late)


# --- 1. no send past the task's local lease deadline ------------------------------------------


async def test_a_task_whose_lease_lapsed_while_it_waited_for_its_lock_is_never_sent(
    make_store: Any, backend: str
) -> None:
    """One node, one slot, 1 s leases and renewals that answer after 3 s. Task B's account lock is
    held by another store handle; B's lease lapses while B waits for the lock; the other handle
    claims B (attempt 2), sends and completes it, and releases the lock. The node must not then
    take the lock's turn and send B under attempt 1 (a duplicate it could have prevented)."""
    store = await make_store(clock=None)
    other = store if backend == "memory" else await make_store(clock=None)  # a second handle on the database
    slow_renewals(store, RENEWAL_DELAY_S)
    held = await other.try_acquire_lock("account:b", ttl_s=30.0, permits=1, holder="other-process")
    assert isinstance(held, Lease)
    b = (await store.enqueue("q", {"n": "B"}, partition_key="chat-b")).task
    sends: list[tuple[int, int]] = []

    async def send(task: Task) -> None:
        sends.append((task.id, task.attempts))

    config = NodeConfig(queue="q", lease_s=1.0, max_in_flight=1, lock_wait_s=10.0, idle_min_s=0.01, idle_max_s=0.05)
    node = Node(store, send, node_id="n1", config=config, lock_key=lambda task: "account:b")
    run = asyncio.create_task(node.run())
    try:

        async def claimed() -> bool:
            return node.state().claimed >= 1

        await wait_until(claimed, 5.0, "the node to claim B")
        node.stop_claiming()  # B is its only task: it waits for the lock, then drains
        claim: list[Task] = []

        async def reclaimed() -> bool:
            claim.extend(await other.claim("q", node_id="other-process", limit=1, lease_s=30.0))
            return bool(claim)

        await wait_until(reclaimed, 5.0, "B's lease to lapse so the other process claims it")
        (again,) = claim
        assert again.id == b.id  # handed back by the fixed node, or lapsed (attempt 2) before the fix
        await other.complete(again, "sent by the other process")
        await other.release_lock(held)
        await asyncio.wait_for(run, RENEWAL_DELAY_S + 5.0)
    finally:
        if not run.done():
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
    assert sends == []  # before the fix: [(B, 1)], after the other process had sent it
    assert (await store.get(b.id)).status is TaskStatus.DONE
    assert store.events.get(ev.LEASE_LOST) >= 1


async def test_a_send_never_starts_past_its_lease_deadline_after_a_blocked_loop(make_store: Any) -> None:
    """The event loop blocked past the task lease's local deadline (a slow ``lock_key`` here): the
    send must not start, since the store may have handed the task on; the task goes back unsent."""
    store = await make_store(clock=None)
    task = (await store.enqueue("q", {"n": 1}, partition_key="chat-1")).task
    sends: list[int] = []
    blocked: list[int] = []

    async def send(task: Task) -> None:
        sends.append(task.attempts)

    def lock_key(task: Task) -> None:
        if not blocked:
            blocked.append(task.id)
            time.sleep(0.9)  # blocks the loop past the 0.8 s local deadline of a 1 s lease
        return None

    config = NodeConfig(queue="q", lease_s=1.0, max_in_flight=1, idle_min_s=0.01, idle_max_s=0.05)
    node = Node(store, send, node_id="n1", config=config, lock_key=lock_key)
    run = asyncio.create_task(node.run())
    try:

        async def done() -> bool:
            return (await store.get(task.id)).status is TaskStatus.DONE

        await wait_until(done, 10.0, "the task to be sent on its next claim")
    finally:
        node.stop_claiming()
        await asyncio.wait_for(run, 5.0)
    assert blocked == [task.id]
    # One send, on the next claim (attempt 1 again if the hand-back beat the store's expiry, else 2);
    # before the fix the first claim's send started too, past the deadline.
    assert len(sends) == 1
    assert store.events.get(ev.LEASE_LOST) == 1


async def test_a_pooled_lock_past_its_local_deadline_is_not_handed_to_the_next_turn(make_store: Any) -> None:
    """A turn ends after the event loop was blocked past the lock lease's local deadline: the next
    local turn must not get that lease (the store may have let it lapse); it acquires a new one."""
    store = await make_store(clock=None)
    pool = LockPool(store, ttl_s=0.3, holder="pool-1")
    second: list[int] = []
    first_in = asyncio.Event()

    async def later_turn() -> None:
        await first_in.wait()
        async with pool.turn("account:x", timeout_s=5.0, on_lost=lambda error: None) as turn:
            second.append(turn.lease.fencing_token)

    waiter = asyncio.create_task(later_turn())
    try:
        async with pool.turn("account:x", timeout_s=5.0, on_lost=lambda error: None) as turn:
            first = turn.lease.fencing_token
            first_in.set()
            await asyncio.sleep(0.01)  # the later turn queues behind this one
            time.sleep(0.4)  # the loop is blocked past the lease's local deadline (0.27 s) and its TTL
        await asyncio.wait_for(waiter, 5.0)
    finally:
        await pool.aclose()
    assert len(second) == 1
    assert second[0] > first  # a new acquisition, not the lapsed lease


# --- 2. Lock.held and the renewal of a lock acquired outside ``async with`` ----------------------


async def test_a_lock_acquired_in_a_helper_task_is_renewed_until_released(make_store: Any) -> None:
    """``acquire()`` in a task that ends: the renewal belongs to the Lock, so the lease stays live
    (and ``held`` says so truthfully) until ``release()``."""
    store = await make_store(clock=None)
    lock = Lock(store, "acct:1", ttl_s=0.3, auto_renew=True)
    lease = await asyncio.ensure_future(lock.acquire())  # acquired in a helper task, which ends
    await asyncio.sleep(0.6)  # two TTLs
    assert [info.owner_token for info in await store.list_locks("acct:1")] == [lease.owner_token]
    assert lock.held
    await lock.release()
    assert not lock.held
    assert await store.list_locks("acct:1") == []


async def test_held_is_false_past_the_local_deadline_of_an_unrenewed_lease(make_store: Any) -> None:
    """A lease that nothing renews: ``held`` turns False at its local deadline, not never."""
    store = await make_store(clock=None)
    lock = Lock(store, "acct:2", ttl_s=0.3, auto_renew=False)
    await lock.acquire()
    assert lock.held
    await asyncio.sleep(0.35)
    assert await store.list_locks("acct:2") == []
    assert not lock.held  # before the fix: True, fencing token 1, with no lease in the store


async def test_held_is_false_past_the_local_deadline_while_a_renewal_is_late(make_store: Any) -> None:
    """A renewed lease whose renewals do not come back in time (a blocked event loop here):
    ``held`` is False past its local deadline even before the watchdog has run."""
    store = await make_store(clock=None)
    lock = Lock(store, "acct:3", ttl_s=0.3, auto_renew=True)
    await lock.acquire()
    time.sleep(0.35)  # the loop is blocked: no renewal went out
    assert not lock.held


# --- 3. NodeConfig.retry's max_attempts ----------------------------------------------------------


def test_a_node_retry_policy_with_its_own_max_attempts_is_refused_with_where_to_set_it() -> None:
    """It was accepted and ignored (tasks still dead-lettered after the enqueue default of 5)."""
    with pytest.raises(InvalidArgumentError, match=r"max_attempts=1000.*NewTask\(max_attempts=\.\.\.\)") as caught:
        NodeConfig(retry=RetryPolicy(base_s=0.01, max_attempts=1000))
    assert "StoreConfig(retry=RetryPolicy(max_attempts=...))" in str(caught.value)
    NodeConfig(retry=RetryPolicy(base_s=0.01))  # delays only: fine


async def test_the_attempts_set_at_enqueue_are_what_a_node_honours(make_store: Any) -> None:
    """Where the error points to: ``NewTask(max_attempts=...)``; the node's policy gives the delays."""
    store = await make_store(clock=None)
    [enqueued] = await store.enqueue_many([NewTask(queue="q", payload=1, max_attempts=7)])
    sends: list[int] = []

    async def send(task: Task) -> None:
        sends.append(task.attempts)
        raise RuntimeError("always fails")

    config = NodeConfig(
        queue="q", idle_min_s=0.01, idle_max_s=0.05, retry=RetryPolicy(base_s=0.001, factor=1.0, cap_s=0.001)
    )
    node = Node(store, send, node_id="n1", config=config)
    run = asyncio.create_task(node.run())
    try:

        async def dead() -> bool:
            return (await store.get(enqueued.task.id)).status is TaskStatus.DEAD

        await wait_until(dead, 10.0, "the task to be dead-lettered")
    finally:
        node.stop_claiming()
        await asyncio.wait_for(run, 5.0)
    assert sends == [1, 2, 3, 4, 5, 6, 7]


# --- 4. a read-only SQLite database, and a path in a missing folder --------------------------------

_READ_ONLY_CHILD = r"""
import asyncio, concurrent.futures.thread, json, os, sys, traceback
from asynccoord import SQLiteStore, TaskStatus

db, missing = sys.argv[1], sys.argv[2]

async def attempt(path, **options):
    store = SQLiteStore(path, **options)
    try:
        await store.open()
        if options.get("read_only"):
            return ["ok", (await store.stats("q")).counts[TaskStatus.PENDING]]
        await store.enqueue("q", "x")
        return ["opened and wrote", ""]
    except Exception as exc:
        return [type(exc).__name__, str(exc)]
    finally:
        await store.close()

async def main():
    await attempt(":memory:")  # warm-up: every module and thread the store needs, loaded as root
    if os.geteuid() == 0:
        os.setuid(65534)  # nobody: file permissions do not stop root
    out = {"write": await attempt(db)}
    out["left"] = sorted(n for n in os.listdir(os.path.dirname(db)) if n != os.path.basename(db))
    out["read"] = await attempt(db, read_only=True)
    out["missing"] = await attempt(missing)
    print(json.dumps(out))

asyncio.run(main())
"""


def _make_folders(db: Path) -> None:
    db.parent.parent.chmod(0o755)
    db.parent.mkdir()


def _lock_file(db: Path) -> None:
    db.chmod(0o444)
    db.parent.chmod(0o777)  # the folder is writable: only the file is not


async def test_a_read_only_database_is_refused_at_open_naming_the_file_and_the_fix(python: Any) -> None:
    """Before: it opened, and the first write failed with a plain StoreError ("attempt to write a
    readonly database"), leaving -wal/-shm files behind; a missing folder was "unable to open"."""
    base = Path(tempfile.mkdtemp(prefix="asynccoord-ro-", dir="/tmp"))  # reachable by nobody
    db = base / "data" / "coord.db"
    try:
        await asyncio.to_thread(_make_folders, db)
        async with SQLiteStore(db) as store:
            await store.enqueue("q", "kept")
        await asyncio.to_thread(_lock_file, db)
        proc = await asyncio.to_thread(python.run_code, _READ_ONLY_CHILD, str(db), str(base / "nope" / "coord.db"))
        out = json.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(base, ignore_errors=True)
    kind, message = out["write"]
    assert kind == "ReadOnlyStoreError", out
    assert str(db) in message
    assert "read_only=True" in message  # the fix: open it read-only, or grant write access
    assert out["left"] == []  # no -wal/-shm files left behind
    assert out["read"] == ["ok", 1]  # the read-only mode still works on it
    kind, message = out["missing"]
    assert kind == "NotADatabaseError", out
    assert repr(str(base / "nope")) in message
    assert "does not exist" in message


def test_a_readonly_driver_error_is_mapped_to_read_only_store_error(tmp_path: Path) -> None:
    """The boundary: SQLite's "attempt to write a readonly database" is a ReadOnlyStoreError, cause kept."""
    path = tmp_path / "x.db"
    sqlite3.connect(path).execute("CREATE TABLE t (x)").connection.commit()
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        with pytest.raises(sqlite3.OperationalError) as caught:
            conn.execute("INSERT INTO t VALUES (1)")
    finally:
        conn.close()
    error = map_sqlite_error(caught.value, "write operation")
    assert isinstance(error, ReadOnlyStoreError)
    assert "attempt to write a readonly database" in str(error)


# --- 5. the demo's latency, explained: tests/cli/test_demo.py checks it on its run with faults ---------
