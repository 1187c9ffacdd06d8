"""``Runtime.wait_until_drained`` timing out because a 'hold' policy keeps conversations behind dead tasks.

Stores come from the ``make_store`` fixture with ``clock=None`` (real time).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from asynccoord import DeadLetterPolicy, StoreConnectionError, Task, TaskStatus
from asynccoord.node import NodeConfig, Runtime, drainhint
from asynccoord.node.drainhint import held_behind_dead

QUEUE = "q"
CONFIG = NodeConfig(queue=QUEUE, idle_min_s=0.01, idle_max_s=0.05)


async def refuse_bad(task: Task) -> None:
    if task.payload == "bad":
        raise RuntimeError("the provider refused it")


def hints(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "drain_held" in r.getMessage()]


@pytest.mark.parametrize("policy", ["hold", "skip"])
async def test_a_drain_that_times_out_behind_a_held_conversation_says_so_once(
    make_store: Any, caplog: pytest.LogCaptureFixture, policy: str
) -> None:
    store = await make_store(clock=None)
    await store.set_dead_letter_policy(QUEUE, policy)
    bad = (await store.enqueue(QUEUE, "bad", partition_key="c", max_attempts=1)).task.id
    after = (await store.enqueue(QUEUE, "next", partition_key="c")).task.id
    await store.enqueue(QUEUE, "later", partition_key="d", delay_s=3600.0)  # keeps even a skip queue undrained
    caplog.set_level(logging.WARNING, logger="asynccoord.node.runtime")
    async with Runtime(store, send=refuse_bad, nodes=1, config=CONFIG) as runtime:
        assert await runtime.wait_until_drained(
            timeout_s=10.0, poll_s=0.01, predicate=lambda c: c[TaskStatus.DEAD] == 1
        )
        assert not await runtime.wait_until_drained(timeout_s=0.3, poll_s=0.01)
        assert not await runtime.wait_until_drained(timeout_s=0.1, poll_s=0.01)  # said once per runtime
        assert (await store.get(bad)).status is TaskStatus.DEAD
        if policy == "skip":
            assert hints(caplog) == []  # the conversation went on: only the delayed task is left
            assert (await store.get(after)).status is TaskStatus.DONE
            return
        assert hints(caplog) == [
            "asynccoord.runtime.drain_held queue='q' dead=1 pending=2: the queue's 'hold' dead-letter policy keeps"
            " conversations waiting behind their dead tasks until these are requeued or discarded"
            " (store.dead_letters lists them)"
        ]
        assert (await store.get(after)).status is TaskStatus.PENDING
        assert await store.discard_dead(QUEUE, [bad]) == 1
        assert await runtime.wait_until_drained(
            timeout_s=10.0, poll_s=0.01, predicate=lambda c: c[TaskStatus.DONE] == 1
        )
        assert (await store.get(after)).status is TaskStatus.DONE


async def test_an_unordered_runtime_gives_no_hold_hint(make_store: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Unordered claims ignore the policy: nothing is held, so nothing is said."""
    store = await make_store(clock=None)
    await store.set_dead_letter_policy(QUEUE, "hold")
    await store.enqueue(QUEUE, "bad", partition_key="c", max_attempts=1)
    await store.enqueue(QUEUE, "later", partition_key="c", delay_s=3600.0)
    caplog.set_level(logging.WARNING, logger="asynccoord.node.runtime")
    config = NodeConfig(queue=QUEUE, ordered=False, idle_min_s=0.01, idle_max_s=0.05)
    async with Runtime(store, send=refuse_bad, nodes=1, config=config) as runtime:
        assert await runtime.wait_until_drained(
            timeout_s=10.0, poll_s=0.01, predicate=lambda c: c[TaskStatus.DEAD] == 1
        )
        assert not await runtime.wait_until_drained(timeout_s=0.2, poll_s=0.01)
    assert hints(caplog) == []


class PolicyOnly:
    """A store that answers the policy and fails (or hangs in) the count that follows."""

    def __init__(self, stats: Any) -> None:
        self.stats = stats

    async def dead_letter_policy(self, queue: str) -> DeadLetterPolicy:
        return DeadLetterPolicy.HOLD


async def test_the_hint_is_best_effort_it_never_fails_nor_outwaits_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    async def fail(queue: str) -> None:
        raise StoreConnectionError("connection lost")

    async def hang(queue: str) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(drainhint, "HINT_WAIT_S", 0.05)
    assert await held_behind_dead(object(), QUEUE) is None  # no dead-letter policy at all
    assert await held_behind_dead(PolicyOnly(fail), QUEUE) is None
    async with asyncio.timeout(2.0):
        assert await held_behind_dead(PolicyOnly(hang), QUEUE) is None
