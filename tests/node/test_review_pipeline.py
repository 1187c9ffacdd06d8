"""Defects of the node pipeline found in review, each reproduced on real stores with real tasks."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from support import wait_until

from asynccoord import Node, NodeConfig, RateLimit, StoreBusyError, Task, TaskStatus
from asynccoord import events as ev

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
