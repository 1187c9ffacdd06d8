"""A Runtime meets a task row it cannot decode (a poison message) on a real SQLite file and PostgreSQL.

The nodes keep running: the poison task ends dead with the reason, every other task is
sent once, and the runtime drains and stops cleanly.
"""

from __future__ import annotations

from typing import Any

import pytest
from services import corrupt_task_row

from asynccoord import NodeConfig, RateLimit, Runtime, Task, TaskStatus

SHARED = pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
Q = "q"
CUT_SHORT = '{"n": 1'  # JSON cut short, as a hand edit may leave it


@SHARED
@pytest.mark.parametrize("ordered", [False, True])
async def test_a_runtime_drains_the_good_tasks_and_dead_letters_the_poison_one(make_store: Any, ordered: bool) -> None:
    store = await make_store(clock=None)
    ids = [(await store.enqueue(Q, {"n": n}, partition_key=f"chat-{n % 3}")).task.id for n in range(12)]
    poison = ids[4]
    await corrupt_task_row(store, poison, "payload", CUT_SHORT)
    sent: list[int] = []

    async def send(task: Task) -> None:
        sent.append(task.payload["n"])

    config = NodeConfig(queue=Q, ordered=ordered, idle_min_s=0.01, idle_max_s=0.1)
    async with Runtime(store, send=send, nodes=2, config=config) as runtime:
        assert await runtime.wait_until_drained(timeout_s=20.0)
    assert sorted(sent) == [n for n in range(12) if n != 4]  # each good task once, none twice
    (dead,) = await store.dead_letters(Q)
    assert (dead.id, dead.status) == (poison, TaskStatus.DEAD)
    assert dead.last_error is not None
    assert "stored payload is unreadable" in dead.last_error
    assert (await store.stats(Q)).counts[TaskStatus.DONE] == 11


@SHARED
async def test_a_row_corrupted_during_its_send_ends_dead_and_the_nodes_run_on(make_store: Any) -> None:
    store = await make_store(clock=None)
    ids = [(await store.enqueue(Q, {"n": n}, partition_key=f"chat-{n % 3}")).task.id for n in range(8)]
    poison = ids[3]
    sent: list[int] = []

    async def send(task: Task) -> None:
        if task.id == poison:  # another tool rewrites the row while this node holds it
            await corrupt_task_row(store, poison, "payload", CUT_SHORT)
            raise RuntimeError("the provider refused it")
        sent.append(task.payload["n"])

    config = NodeConfig(queue=Q, idle_min_s=0.01, idle_max_s=0.1)
    async with Runtime(store, send=send, nodes=2, config=config) as runtime:
        assert await runtime.wait_until_drained(timeout_s=20.0)
    assert sorted(sent) == [n for n in range(8) if n != 3]
    (dead,) = await store.dead_letters(Q)
    assert (dead.id, dead.status, dead.attempts) == (poison, TaskStatus.DEAD, 1)
    assert dead.last_error is not None
    assert dead.last_error.startswith("stored payload is unreadable: JSONDecodeError")
    assert (await store.stats(Q)).counts[TaskStatus.DONE] == 7


@SHARED
async def test_a_rate_limited_runtime_dead_letters_a_task_whose_limit_keys_are_unreadable(make_store: Any) -> None:
    store = await make_store(clock=None)
    await store.set_rate_limits(Q, [RateLimit(dimension="chat", count=1000, per_s=1.0, burst=1000)])
    ids = [
        (await store.enqueue(Q, {"n": n}, partition_key=f"k{n}", limit_keys={"chat": f"c{n % 2}"})).task.id
        for n in range(8)
    ]
    poison = ids[2]
    await corrupt_task_row(store, poison, "limit_keys", '{"chat": ')
    sent: list[int] = []

    async def send(task: Task) -> None:
        sent.append(task.payload["n"])

    config = NodeConfig(queue=Q, idle_min_s=0.01, idle_max_s=0.1)
    async with Runtime(store, send=send, nodes=2, config=config) as runtime:
        assert await runtime.wait_until_drained(timeout_s=20.0)
    assert sorted(sent) == [n for n in range(8) if n != 2]
    (dead,) = await store.dead_letters(Q)
    assert (dead.id, dead.status) == (poison, TaskStatus.DEAD)
    assert dead.last_error is not None
    assert dead.last_error.startswith("stored limit_keys is unreadable")
