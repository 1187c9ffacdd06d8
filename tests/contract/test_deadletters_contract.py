"""Dead letters and per-key order, run unchanged on every backend on the fake clock.

A queue's dead-letter policy says what an ordered claim does with a conversation
(partition key) whose task went dead: ``skip`` (the default) goes on without it, ``hold``
claims nothing more of the key until the dead task is requeued or discarded. Every case
runs on every store; the last ones show every process of a database following the policy.
"""

from __future__ import annotations

import asyncio

import pytest
from support import FakeClock

from asynccoord import DeadLetterPolicy, InvalidArgumentError, InvalidTypeError, SQLiteStore, TaskStatus

SHARED = pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)  # stores of one database

Q = "outbox"


async def conversation(store, key: str, n: int, **kwargs) -> list[int]:
    """Enqueue ``n`` messages of one conversation, in order; return their ids."""
    return [(await store.enqueue(Q, f"{key}-{i}", partition_key=key, **kwargs)).task.id for i in range(n)]


async def kill_head(store, key: str) -> int:
    """Claim in order until ``key``'s head is leased, fail it for good; return its id."""
    dead_id = None
    for task in await store.claim(Q, node_id="n", limit=100, ordered=True):
        if task.partition_key == key:
            dead = await store.fail(task, "provider said no")
            assert dead.status is TaskStatus.DEAD
            dead_id = task.id
        else:
            await store.release(task)
    assert dead_id is not None, f"no head of {key!r} was claimable"
    return dead_id


async def ordered_ids(store, **kwargs) -> list[int]:
    return [t.id for t in await store.claim(Q, node_id="n", limit=100, ordered=True, **kwargs)]


async def test_the_default_is_skip_and_a_conversation_goes_on_everywhere(store) -> None:
    assert await store.dead_letter_policy(Q) is DeadLetterPolicy.SKIP
    first, second = await conversation(store, "chat-1", 2, max_attempts=1)
    assert await kill_head(store, "chat-1") == first
    assert await ordered_ids(store) == [second]


async def test_hold_keeps_the_conversation_and_not_the_others(store) -> None:
    await store.set_dead_letter_policy(Q, "hold")
    assert await store.dead_letter_policy(Q) is DeadLetterPolicy.HOLD
    a1, a2, a3 = await conversation(store, "chat-a", 3, max_attempts=1)
    (b1,) = await conversation(store, "chat-b", 1)
    assert await kill_head(store, "chat-a") == a1
    assert await ordered_ids(store) == [b1]  # chat-a waits; chat-b flows
    assert await ordered_ids(store) == []
    assert await store.claimable_partitions(Q, ordered=True) == set()  # chat-b is leased, chat-a held
    assert [t.id for t in await store.claim(Q, node_id="n", limit=100)] == [a2, a3]  # unordered claims ignore it


@pytest.mark.parametrize("policy", ["skip", "hold"])
async def test_a_release_that_counts_the_last_attempt_follows_the_policy(store, policy: str) -> None:
    """A send cut short on its last attempt leaves the head dead, as a failure would: its
    conversation goes on (skip) or waits (hold)."""
    await store.set_dead_letter_policy(Q, policy)
    a1, a2 = await conversation(store, "chat-a", 2, max_attempts=1)
    (head,) = await store.claim(Q, node_id="n", limit=100, ordered=True)
    assert head.id == a1
    assert (await store.release(head, count_attempt=True)).status is TaskStatus.DEAD
    assert await ordered_ids(store) == ([a2] if policy == "skip" else [])
    assert await store.discard_dead(Q) == 1
    assert await ordered_ids(store) == ([] if policy == "skip" else [a2])


async def test_requeue_lifts_the_hold_and_the_dead_task_runs_first(store) -> None:
    await store.set_dead_letter_policy(Q, DeadLetterPolicy.HOLD)
    a1, a2 = await conversation(store, "chat-a", 2, max_attempts=1)
    await kill_head(store, "chat-a")
    assert await ordered_ids(store) == []
    assert await store.requeue_dead(Q, [a1]) == 1
    (again,) = await store.claim(Q, node_id="n", limit=100, ordered=True)
    assert (again.id, again.attempts) == (a1, 1)
    next_ = await store.complete_and_claim_next(again)
    assert next_.next_task is not None
    assert next_.next_task.id == a2


async def test_discard_lifts_the_hold_everywhere(store) -> None:
    await store.set_dead_letter_policy(Q, "hold")
    a1, a2 = await conversation(store, "chat-a", 2, max_attempts=1)
    first = (await store.enqueue(Q, "keyed", partition_key="chat-k", idempotency_key="m-1", max_attempts=1)).task
    await kill_head(store, "chat-a")
    await kill_head(store, "chat-k")
    assert await ordered_ids(store) == []
    assert await store.discard_dead(Q, [a1, a2, 999_999]) == 1  # a2 is not dead: skipped
    assert await store.discard_dead("other") == 0
    with pytest.raises(KeyError):
        await store.get(a1)
    assert await ordered_ids(store) == [a2]  # chat-a goes on
    assert await store.discard_dead(Q) == 1
    assert await store.discard_dead(Q) == 0
    again = await store.enqueue(Q, "keyed", partition_key="chat-k", idempotency_key="m-1")
    assert again.created  # the idempotency key is free again
    assert again.task.id != first.id


async def test_a_new_message_to_a_held_conversation_waits(store) -> None:
    await store.set_dead_letter_policy(Q, "hold")
    (a1,) = await conversation(store, "chat-a", 1, max_attempts=1)
    await kill_head(store, "chat-a")
    (a2,) = await conversation(store, "chat-a", 1)
    assert await ordered_ids(store) == []
    assert await store.discard_dead(Q, [a1]) == 1
    assert await ordered_ids(store) == [a2]


async def test_a_lease_lost_on_the_last_attempt_holds_too(store, clock: FakeClock) -> None:
    await store.set_dead_letter_policy(Q, "hold")
    a1, a2 = await conversation(store, "chat-a", 2, max_attempts=1)
    (head,) = await store.claim(Q, node_id="n", limit=100, ordered=True, lease_s=5)
    assert head.id == a1
    clock.advance(6)  # the lease lapses on the last attempt: the next claim dead-letters it
    assert await ordered_ids(store) == []
    assert (await store.get(a1)).status is TaskStatus.DEAD
    assert (await store.get(a2)).status is TaskStatus.PENDING


async def test_a_task_that_died_before_the_queue_was_ordered_holds_its_key(store) -> None:
    await store.set_dead_letter_policy(Q, "hold")
    a1, _ = await conversation(store, "chat-a", 2, max_attempts=1)
    (first,) = await store.claim(Q, node_id="n", limit=1)  # unordered: the queue keeps no heads yet
    assert first.id == a1
    await store.fail(first, "no")
    assert await ordered_ids(store) == []  # the first ordered claim computes heads: chat-a is held
    await store.requeue_dead(Q)
    assert await ordered_ids(store) == [a1]


async def test_a_change_of_policy_applies_to_the_dead_tasks_of_the_past(store) -> None:
    _, a2, a3 = await conversation(store, "chat-a", 3, max_attempts=1)
    await kill_head(store, "chat-a")  # skip: the conversation goes on
    (running,) = await store.claim(Q, node_id="n", limit=100, ordered=True)
    assert running.id == a2
    await store.set_dead_letter_policy(Q, "hold")  # a1 is dead and precedes a3
    cont = await store.complete_and_claim_next(running)
    assert cont.next_task is None  # a3 is held behind a1
    assert await ordered_ids(store) == []
    await store.set_dead_letter_policy(Q, "skip")  # and back: the key goes on
    assert await ordered_ids(store) == [a3]


@pytest.mark.parametrize(
    ("policy", "error"), [("drop", InvalidArgumentError), (3, InvalidTypeError), ("", InvalidArgumentError)]
)
async def test_a_bad_policy_is_refused_and_nothing_written_everywhere(store, policy, error) -> None:
    with pytest.raises(error, match="policy"):
        await store.set_dead_letter_policy(Q, policy)
    with pytest.raises((InvalidArgumentError, InvalidTypeError), match="queue"):
        await store.set_dead_letter_policy("", "skip")
    with pytest.raises(InvalidTypeError, match="task_ids"):
        await store.discard_dead(Q, 5)
    assert await store.dead_letter_policy(Q) is DeadLetterPolicy.SKIP


async def test_dead_letter_policies_names_every_queue_that_holds_in_one_read(store) -> None:
    assert await store.dead_letter_policies() == {}
    await store.set_dead_letter_policy("b-queue", "hold")
    await store.set_dead_letter_policy(Q, DeadLetterPolicy.HOLD)
    await store.set_dead_letter_policy("c-queue", "skip")  # the default, set explicitly: not named
    policies = await store.dead_letter_policies()
    assert policies == {"b-queue": DeadLetterPolicy.HOLD, Q: DeadLetterPolicy.HOLD}
    assert list(policies) == ["b-queue", Q]  # by name
    await store.set_dead_letter_policy("b-queue", "skip")
    assert await store.dead_letter_policies() == {Q: DeadLetterPolicy.HOLD}


@SHARED
async def test_every_store_of_one_database_follows_the_policy(make_store, backend: str) -> None:
    one, two = await make_store(), await make_store()  # one SQLite file, or one PostgreSQL schema
    await one.set_dead_letter_policy(Q, "hold")
    assert await two.dead_letter_policy(Q) is DeadLetterPolicy.HOLD
    _, a2 = await conversation(one, "chat-a", 2, max_attempts=1)
    await kill_head(two, "chat-a")
    assert await ordered_ids(one) == []
    assert await two.discard_dead(Q) == 1
    assert await ordered_ids(one) == [a2]


async def test_every_process_on_the_file_follows_the_policy(tmp_path) -> None:
    path = tmp_path / "shared.db"
    async with SQLiteStore(path) as one, SQLiteStore(path) as two:
        await one.set_dead_letter_policy(Q, "hold")
        assert await two.dead_letter_policy(Q) is DeadLetterPolicy.HOLD
        await conversation(one, "chat-a", 2, max_attempts=1)
        await kill_head(two, "chat-a")
        assert await ordered_ids(one) == []
        assert await two.discard_dead(Q) == 1
        assert len(await ordered_ids(one)) == 1


async def test_a_policy_changed_amid_commits_and_dead_letters_leaves_every_key_right(make_store, backend: str) -> None:
    one = await make_store()
    two = one if backend == "memory" else await make_store()  # two stores of one database
    ids = {f"chat-{k}": await conversation(one, f"chat-{k}", 6, max_attempts=1) for k in range(12)}

    async def drain(store, node: str) -> None:
        while tasks := await store.claim(Q, node_id=node, limit=4, ordered=True):
            for task in tasks:
                if task.id % 5 == 0:
                    await store.fail(task, "provider said no")  # last attempt: dead
                else:
                    await store.complete(task)
                await asyncio.sleep(0)

    async def toggle() -> None:
        for policy in ("hold", "skip", "hold", "skip", "hold"):
            await two.set_dead_letter_policy(Q, policy)
            await asyncio.sleep(0)

    await asyncio.gather(drain(one, "a"), drain(two, "b"), toggle())
    await drain(one, "a")  # whatever the last policy change let go on

    async def expected(hold: bool) -> list[int]:
        """Each key's earliest unfinished task, if pending and (under hold) not behind a dead one."""
        heads = []
        for key_ids in ids.values():
            statuses = [(i, (await one.get(i)).status) for i in key_ids]
            unfinished = [(i, s) for i, s in statuses if s is not TaskStatus.DONE]
            if hold:
                if unfinished and unfinished[0][1] is TaskStatus.PENDING:
                    heads.append(unfinished[0][0])
            else:
                pending = [i for i, s in unfinished if s is TaskStatus.PENDING]
                heads.extend(pending[:1])
        return sorted(heads)

    for key, key_ids in ids.items():  # one more message each: six ids in a row hold a multiple of 5, a dead task
        key_ids.append((await two.enqueue(Q, "late", partition_key=key)).task.id)
    held = await expected(hold=True)
    assert held == []  # every key has a dead task before its pending ones
    assert await ordered_ids(one) == held
    await one.set_dead_letter_policy(Q, "skip")
    heads = await expected(hold=False)
    assert len(heads) == len(ids)
    assert sorted(await ordered_ids(two)) == heads
