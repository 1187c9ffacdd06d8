"""The queue contract, run unchanged on every backend (memory and SQLite).

Every test uses the injectable fake clock (``clock`` fixture), so lease expiry and
backoff are exact: nothing here sleeps.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from support import FakeClock

from asynccoord import (
    FencingTokenRejectedError,
    InvalidArgumentError,
    InvalidTypeError,
    LeaseLostError,
    NewTask,
    ProcessedRetention,
    RetryPolicy,
    StoreClosedError,
    StoreConfig,
    Task,
    TaskNotFoundError,
    TaskStatus,
    partition_of,
)
from asynccoord import events as ev

Q = "jobs"
OTHER = "other-jobs"


async def claim_one(store, node_id: str = "node-a", **kwargs) -> Task:
    tasks = await store.claim(Q, node_id=node_id, limit=1, **kwargs)
    assert len(tasks) == 1, tasks
    return tasks[0]


async def snapshot(store, *ids: int) -> list[Task]:
    return [await store.get(i) for i in ids]


def counts(stats) -> dict[str, int]:
    return {status.value: n for status, n in stats.counts.items()}


# --- enqueue -------------------------------------------------------------------------


async def test_enqueue_returns_pending_task_with_all_fields(store, clock: FakeClock) -> None:
    result = await store.enqueue(
        Q, {"text": "hi", "n": [1, 2.5, None, True]}, partition_key="conv-1", priority=3, max_attempts=7
    )
    assert result.created is True
    task = result.task
    assert task.id > 0
    assert task.queue == Q
    assert task.partition_key == "conv-1"
    assert task.partition == partition_of("conv-1", store.partitions)
    assert task.idempotency_key is None
    assert task.payload == {"text": "hi", "n": [1, 2.5, None, True]}
    assert task.priority == 3
    assert task.status is TaskStatus.PENDING
    assert task.attempts == 0
    assert task.max_attempts == 7
    assert task.run_at == clock.now
    assert task.created_at == task.updated_at == clock.now
    assert (task.lease_owner, task.lease_token, task.lease_expires_at) == (None, None, None)
    assert task.version == 0
    assert task.last_error is None
    assert task.result is None
    assert await store.get(task.id) == task


async def test_enqueue_default_max_attempts_comes_from_retry_policy(make_store) -> None:
    store = await make_store(config=StoreConfig(retry=RetryPolicy(max_attempts=9)))
    task = (await store.enqueue(Q, None)).task
    assert task.max_attempts == 9


async def test_retry_policy_at_the_max_attempts_bound_is_settled(make_store) -> None:
    # The largest policy RetryPolicy accepts is one every store can enqueue, fail and complete.
    store = await make_store(config=StoreConfig(retry=RetryPolicy(max_attempts=2**31 - 1)))
    task = (await store.enqueue(Q, None)).task
    assert task.max_attempts == 2**31 - 1
    failed = await store.fail(await claim_one(store), "boom", retry=RetryPolicy(base_s=0.001, jitter=0.0))
    assert (failed.status, failed.attempts, failed.max_attempts) == (TaskStatus.PENDING, 1, 2**31 - 1)


async def test_enqueue_many_in_input_order_with_distinct_ids(store) -> None:
    specs = [NewTask(queue=Q, payload=i, partition_key=f"k{i % 3}") for i in range(50)]
    results = await store.enqueue_many(specs)
    assert [r.task.payload for r in results] == list(range(50))
    assert all(r.created for r in results)
    ids = [r.task.id for r in results]
    assert len(set(ids)) == 50
    assert ids == sorted(ids)
    assert counts(await store.stats(Q))["pending"] == 50
    assert await store.enqueue_many([]) == []


async def test_idempotency_key_returns_existing_task(store) -> None:
    first = await store.enqueue(Q, {"v": 1}, idempotency_key="msg-1")
    second = await store.enqueue(Q, {"v": 2}, idempotency_key="msg-1", priority=9)
    assert first.created is True
    assert second.created is False
    assert second.task.id == first.task.id
    assert second.task.payload == {"v": 1}  # the first one wins, nothing overwritten
    assert second.task.priority == 0
    assert store.events.get(ev.DUPLICATE_ENQUEUE_SUPPRESSED) == 1
    assert (await store.stats(Q)).total == 1


async def test_idempotency_key_dedup_inside_one_batch_and_per_queue(store) -> None:
    results = await store.enqueue_many(
        [
            NewTask(queue=Q, payload=1, idempotency_key="a"),
            NewTask(queue=Q, payload=2, idempotency_key="b"),
            NewTask(queue=Q, payload=3, idempotency_key="a"),
            NewTask(queue="other", payload=4, idempotency_key="a"),
            NewTask(queue=Q, payload=5),
            NewTask(queue=Q, payload=6),
        ]
    )
    assert [r.created for r in results] == [True, True, False, True, True, True]
    assert results[2].task.id == results[0].task.id
    assert results[2].task.payload == 1
    assert results[3].task.id != results[0].task.id  # keys are unique per queue only
    assert store.events.get(ev.DUPLICATE_ENQUEUE_SUPPRESSED) == 1
    assert (await store.stats(Q)).total == 4
    assert (await store.stats("other")).total == 1
    assert (await store.stats()).total == 5


async def test_idempotency_key_dedup_holds_while_task_is_done(store) -> None:
    first = (await store.enqueue(Q, 1, idempotency_key="k")).task
    await store.complete(await claim_one(store))
    again = await store.enqueue(Q, 2, idempotency_key="k")
    assert again.created is False
    assert again.task.id == first.id
    assert again.task.status is TaskStatus.DONE


# --- claim ---------------------------------------------------------------------------


async def test_claim_order_priority_then_fifo(store) -> None:
    priorities = [0, 5, 0, 5, -1, 2, 5]
    ids = [(await store.enqueue(Q, i, priority=p)).task.id for i, p in enumerate(priorities)]
    expected = [i for _, i in sorted(zip(priorities, ids, strict=True), key=lambda pi: (-pi[0], pi[1]))]
    first = await store.claim(Q, node_id="n", limit=3)
    rest = await store.claim(Q, node_id="n", limit=10)
    assert [t.id for t in first] == expected[:3]
    assert [t.id for t in rest] == expected[3:]
    assert await store.claim(Q, node_id="n", limit=10) == []


async def test_claim_sets_lease_and_bumps_attempts_and_version(store, clock: FakeClock) -> None:
    enq = (await store.enqueue(Q, "x")).task
    clock.advance(1.0)
    tasks = await store.claim(Q, node_id="node-a", limit=5, lease_s=12.5)
    assert len(tasks) == 1
    task = tasks[0]
    assert task.id == enq.id
    assert task.status is TaskStatus.RUNNING
    assert task.attempts == 1
    assert task.version == 1
    assert task.lease_owner == "node-a"
    assert task.lease_token
    assert task.lease_expires_at == clock.now + 12.5
    assert task.updated_at == clock.now
    assert await store.get(task.id) == task
    assert store.events.get(ev.CLAIMS) == 1


async def test_claim_only_touches_its_queue(store) -> None:
    await store.enqueue("other", 1)
    assert await store.claim(Q, node_id="n", limit=10) == []
    assert counts(await store.stats("other"))["pending"] == 1


async def test_claim_tokens_are_unique_per_task_and_per_claim(store, clock: FakeClock) -> None:
    await store.enqueue_many([NewTask(queue=Q, payload=i) for i in range(5)])
    first = await store.claim(Q, node_id="same", limit=5, lease_s=1)
    clock.advance(1)
    second = await store.claim(Q, node_id="same", limit=5, lease_s=1)
    tokens = [t.lease_token for t in first + second]
    assert len(set(tokens)) == 10


async def test_delay_s_defers_claim_until_run_at(store, clock: FakeClock) -> None:
    task = (await store.enqueue(Q, "later", delay_s=5)).task
    assert task.run_at == clock.now + 5
    now_task = (await store.enqueue(Q, "now")).task
    assert [t.id for t in await store.claim(Q, node_id="n", limit=10)] == [now_task.id]
    clock.advance(4.999)
    assert await store.claim(Q, node_id="n", limit=10) == []
    clock.advance(0.001)
    claimed = await store.claim(Q, node_id="n", limit=10)
    assert [t.id for t in claimed] == [task.id]


async def test_expired_lease_is_reclaimed_with_new_token(store, clock: FakeClock) -> None:
    await store.enqueue(Q, "x")
    first = await claim_one(store, "node-a", lease_s=10)
    clock.advance(9.999)
    assert await store.claim(Q, node_id="node-b", limit=1) == []
    clock.advance(0.001)  # exactly at expiry: the lease is over
    second = await claim_one(store, "node-b", lease_s=10)
    assert second.id == first.id
    assert second.lease_owner == "node-b"
    assert second.lease_token != first.lease_token
    assert second.attempts == 2
    assert second.version == first.version + 1
    assert second.lease_expires_at == clock.now + 10
    assert store.events.get(ev.LEASE_EXPIRED) == 1
    with pytest.raises(LeaseLostError, match="reclaimed"):
        await store.complete(first)
    assert await store.get(first.id) == second
    done = await store.complete(second)
    assert done.status is TaskStatus.DONE


async def test_claim_merges_expired_leases_and_pending_in_priority_fifo_order(store, clock: FakeClock) -> None:
    # Expired leases and due pending tasks compete for the same claim slots, in one
    # priority-then-FIFO order; a live lease and a task not yet due take no slot.
    priorities = [0, 3, 0, 3, 1, 0, 3, 1]
    ids = [(await store.enqueue(Q, i, priority=p, partition_key=f"k{i}")).task.id for i, p in enumerate(priorities)]
    leased = await store.claim(Q, node_id="a", limit=4, lease_s=5)  # ids[1], ids[3], ids[6], ids[4]
    assert [t.id for t in leased] == [ids[1], ids[3], ids[6], ids[4]]
    await store.extend(leased[1], 50)  # ids[3] stays leased
    late = (await store.enqueue(Q, "late", priority=3, delay_s=100)).task
    clock.advance(5)
    expected = [ids[1], ids[6], ids[4], ids[7], ids[0], ids[2], ids[5]]
    first = await store.claim(Q, node_id="b", limit=3, lease_s=60)
    assert [t.id for t in first] == expected[:3]
    assert all(t.attempts == 2 for t in first)
    rest = await store.claim(Q, node_id="b", limit=10, lease_s=60)
    assert [t.id for t in rest] == expected[3:]
    assert all(t.attempts == 1 for t in rest)
    assert store.events.get(ev.LEASE_EXPIRED) == 3
    assert (await store.get(late.id)).status is TaskStatus.PENDING


async def test_claim_with_partitions_takes_expired_leases_of_those_partitions_only(store, clock: FakeClock) -> None:
    tasks = [(await store.enqueue(Q, i, partition_key=f"conv-{i}")).task for i in range(30)]
    leased = await store.claim(Q, node_id="a", limit=30, lease_s=5)
    assert len(leased) == 30
    clock.advance(5)
    mine = sorted({tasks[3].partition, tasks[11].partition})
    got = await store.claim(Q, node_id="b", limit=30, lease_s=60, partitions=mine)
    assert [t.id for t in got] == [t.id for t in tasks if t.partition in mine]
    again = await store.claim(Q, node_id="b", limit=30, lease_s=60, ordered=True)
    assert sorted(t.id for t in again) == sorted(t.id for t in tasks if t.partition not in mine)


async def test_reclaim_by_same_node_still_rejects_old_lease(store, clock: FakeClock) -> None:
    await store.enqueue(Q, "x")
    first = await claim_one(store, "node-a", lease_s=1)
    clock.advance(1)
    second = await claim_one(store, "node-a", lease_s=1)
    with pytest.raises(LeaseLostError):
        await store.complete(first)
    assert (await store.get(first.id)).status is TaskStatus.RUNNING
    await store.complete(second)


async def test_lease_expired_on_last_attempt_dead_letters(store, clock: FakeClock) -> None:
    task = (await store.enqueue(Q, "x", max_attempts=1)).task
    await claim_one(store, lease_s=5)
    clock.advance(5)
    assert await store.claim(Q, node_id="node-b", limit=1) == []
    dead = await store.get(task.id)
    assert dead.status is TaskStatus.DEAD
    assert dead.attempts == 1
    assert dead.lease_token is None
    assert "lease expired" in (dead.last_error or "")
    assert store.events.get(ev.DEAD_LETTERED) == 1


# --- complete (compare-and-set) ------------------------------------------------------


async def test_complete_marks_done_with_result(store, clock: FakeClock) -> None:
    await store.enqueue(Q, "x")
    task = await claim_one(store)
    clock.advance(0.5)
    done = await store.complete(task, {"answer": 42})
    assert done.status is TaskStatus.DONE
    assert done.result == {"answer": 42}
    assert done.version == task.version + 1
    assert done.attempts == 1
    assert (done.lease_owner, done.lease_token, done.lease_expires_at) == (None, None, None)
    assert done.updated_at == clock.now
    assert await store.get(task.id) == done
    assert store.events.get(ev.COMMITS) == 1
    with pytest.raises(LeaseLostError, match="done"):
        await store.complete(task)  # twice: the second is stale
    assert await store.get(task.id) == done


async def test_a_refused_hand_back_is_no_stale_commit_but_a_refused_commit_or_failure_is(
    store, clock: FakeClock
) -> None:
    """``stale_commit_rejected`` counts the writes of a send's outcome refused for a lost lease
    (a commit, a failure), not a refused hand-back of a task (``release``, or a 429's
    ``report_rate_limited``): after a stall, a node hands back the tasks it never sent."""
    await store.enqueue_many([NewTask(queue=Q, payload=i) for i in range(4)])
    tasks = await store.claim(Q, node_id="n", limit=4, lease_s=1.0)
    assert len(tasks) == 4
    clock.advance(5.0)
    await store.claim(Q, node_id="other", limit=4, lease_s=10.0)  # another node has them now
    before = store.events.get(ev.STALE_COMMIT_REJECTED)
    with pytest.raises(LeaseLostError):
        await store.release(tasks[0])
    with pytest.raises(LeaseLostError):
        await store.report_rate_limited(tasks[1], 1.0)
    assert store.events.get(ev.STALE_COMMIT_REJECTED) == before
    with pytest.raises(LeaseLostError):
        await store.complete(tasks[2])
    with pytest.raises(LeaseLostError):
        await store.fail(tasks[3], "boom")
    assert store.events.get(ev.STALE_COMMIT_REJECTED) == before + 2


@pytest.mark.parametrize("staleness", ["token", "version", "expired", "settled"])
async def test_stale_complete_writes_nothing(store, clock: FakeClock, staleness: str) -> None:
    await store.enqueue(Q, "x", idempotency_key="m-1")
    task = await claim_one(store, lease_s=10)
    if staleness == "token":
        stale = dataclasses.replace(task, lease_token=task.lease_token + "0")
    elif staleness == "version":
        stale = dataclasses.replace(task, version=task.version - 1)
    elif staleness == "expired":
        clock.advance(10)
        stale = task
    else:
        await store.release(task)
        stale = task
    before = await store.get(task.id)
    stats_before = await store.stats()
    rejected_before = store.events.get(ev.STALE_COMMIT_REJECTED)
    with pytest.raises(LeaseLostError) as info:
        await store.complete(stale, {"should": "not be written"})
    assert info.value.task_id == task.id
    assert await store.get(task.id) == before
    assert await store.stats() == stats_before
    assert not await store.is_processed(Q, "m-1")
    assert store.events.get(ev.STALE_COMMIT_REJECTED) == rejected_before + 1
    assert store.events.get(ev.COMMITS) == 0


async def test_complete_of_deleted_task_raises_task_not_found(store, clock: FakeClock) -> None:
    await store.enqueue(Q, "x")
    task = await claim_one(store)
    ghost = dataclasses.replace(task, id=task.id + 1000)
    with pytest.raises(TaskNotFoundError) as info:
        await store.complete(ghost)
    assert info.value.task_id == task.id + 1000
    assert isinstance(info.value, KeyError)
    assert (await store.get(task.id)).status is TaskStatus.RUNNING


@pytest.mark.parametrize("ordered", [False, True])
@pytest.mark.parametrize("with_expired", [False, True])
async def test_claimed_task_is_what_the_store_holds(store, clock: FakeClock, ordered: bool, with_expired: bool) -> None:
    """Every field of a claimed task equals the stored row, with or without expired leases about."""
    await store.enqueue_many(
        [NewTask(queue=Q, payload={"n": i}, partition_key=f"k{i}", priority=i % 2) for i in range(6)]
    )
    if with_expired:
        taken = await store.claim(Q, node_id="node-old", limit=2, lease_s=1, ordered=ordered)
        assert len(taken) == 2
        clock.advance(2)
    claimed = await store.claim(Q, node_id="node-b", limit=10, lease_s=7.5, ordered=ordered)
    assert len(claimed) == 6
    assert [t.priority for t in claimed] == sorted((t.priority for t in claimed), reverse=True)
    for task in claimed:
        assert await store.get(task.id) == task
        assert (task.queue, task.status, task.lease_owner) == (Q, TaskStatus.RUNNING, "node-b")
        assert task.lease_expires_at == clock.now + 7.5
        assert task.updated_at == clock.now
    assert sum(t.attempts == 2 for t in claimed) == (2 if with_expired else 0)
    assert store.events.get(ev.LEASE_EXPIRED) == (2 if with_expired else 0)


async def test_complete_many_with_a_stale_copy_beside_the_live_one(store, clock: FakeClock) -> None:
    """Two copies of one task in one batch: the live copy commits, the stale copy is rejected."""
    await store.enqueue(Q, "x")
    task = await claim_one(store)
    stale = dataclasses.replace(task, version=task.version - 1)
    outcomes = await store.complete_many([stale, task])
    assert isinstance(outcomes[0], LeaseLostError)
    assert isinstance(outcomes[1], Task)
    assert outcomes[1].status is TaskStatus.DONE
    assert outcomes[1].version == task.version + 1
    assert await store.get(task.id) == outcomes[1]
    assert store.events.get(ev.COMMITS) == 1


async def test_complete_many_with_a_copy_of_another_lease_ahead_of_the_live_one(store, clock: FakeClock) -> None:
    """A copy with the task's id and version but another lease token, ahead of the live copy in
    one batch: the live copy commits, its result stored and reported; the other is rejected."""
    await store.enqueue(Q, "x")
    task = await claim_one(store)
    forged = dataclasses.replace(task, lease_token="not-the-lease.1")
    outcomes = await store.complete_many([forged, task], ["forged", "live"])
    assert isinstance(outcomes[0], LeaseLostError)
    assert isinstance(outcomes[1], Task)
    assert outcomes[1].result == "live"
    assert await store.get(task.id) == outcomes[1]
    assert store.events.get(ev.COMMITS) == 1


async def test_complete_many_with_a_stale_fenced_copy_ahead_of_the_live_one(store, clock: FakeClock) -> None:
    """A copy with another lease and an outdated fencing token, ahead of the live copy (no fence),
    beside another task: the copy is refused for its token, the live copy and the other task
    commit, and the call reports each (SQLite refused the live copy for the other's token, or
    raised after its commit when the live copy had no fence)."""
    await store.fence("res", 5)
    await store.enqueue(Q, "other", partition_key="o")
    await store.enqueue(Q, "dup", partition_key="d")
    tasks = {t.payload: t for t in await store.claim(Q, node_id="n", limit=2, lease_s=60)}
    forged = dataclasses.replace(tasks["dup"], lease_token="not-the-lease.1")
    outcomes = await store.complete_many(
        [tasks["other"], forged, tasks["dup"]], ["o", "forged", "live"], fences=[None, ("res", 4), None]
    )
    assert isinstance(outcomes[0], Task)
    assert isinstance(outcomes[1], FencingTokenRejectedError)
    assert (outcomes[1].resource, outcomes[1].fencing_token, outcomes[1].highest) == ("res", 4, 5)
    assert isinstance(outcomes[2], Task)
    assert outcomes[2].result == "live"
    assert await store.get(tasks["dup"].id) == outcomes[2]
    assert store.events.get(ev.COMMITS) == 2
    assert (store.events.get(ev.FENCING_REJECTED), store.events.get(ev.STALE_COMMIT_REJECTED)) == (1, 0)


@pytest.mark.parametrize("order", ["copy first", "live first"])
@pytest.mark.parametrize("lease", ["another lease", "the live lease"])
async def test_a_copy_with_an_outdated_token_is_refused_for_its_token_whatever_its_lease(
    store, clock: FakeClock, order: str, lease: str
) -> None:
    """A token older than one its resource has seen is refused as such (FencingTokenRejectedError,
    counted as ``fencing_rejected``) before the lease is looked at, on every store: a forged copy of
    a task (another lease) and a copy holding the live lease alike, ahead of or behind a live copy
    without a fence in one call. The live copy commits; nothing records the old token."""
    await store.fence("res", 5)
    await store.enqueue(Q, "x")
    task = await claim_one(store, lease_s=60)
    copy = task if lease == "the live lease" else dataclasses.replace(task, lease_token="not-the-lease.1")
    tasks, fences = [copy, task], [("res", 4), None]
    if order == "live first":
        tasks, fences = tasks[::-1], fences[::-1]
    outcomes = await store.complete_many(tasks, ["copy" if f else "live" for f in fences], fences=fences)
    refused, done = (outcomes[0], outcomes[1]) if order == "copy first" else (outcomes[1], outcomes[0])
    assert isinstance(refused, FencingTokenRejectedError), refused
    assert (refused.fencing_token, refused.highest) == (4, 5)
    assert isinstance(done, Task)
    assert (done.status, done.result) == (TaskStatus.DONE, "live")
    assert await store.get(task.id) == done
    assert (await store.read_fence("res")).fencing_token == 5
    counted = (ev.COMMITS, ev.FENCING_REJECTED, ev.STALE_COMMIT_REJECTED)
    assert [store.events.get(name) for name in counted] == [1, 1, 0]


async def test_complete_many_with_the_same_copy_twice_commits_it_once(store, clock: FakeClock) -> None:
    await store.enqueue(Q, "x")
    task = await claim_one(store)
    outcomes = await store.complete_many([task, task], ["first", "second"])
    assert isinstance(outcomes[0], Task)
    assert isinstance(outcomes[1], LeaseLostError)
    assert outcomes[0].result == "first"
    assert await store.get(task.id) == outcomes[0]
    assert store.events.get(ev.COMMITS) == 1


async def test_a_commit_promotes_the_stored_key_not_the_callers_copy(store, clock: FakeClock) -> None:
    """A copy whose partition key was altered still commits (the compare-and-set is on id, lease and
    version), and the key's next task becomes claimable: heads follow the stored key."""
    await store.enqueue_many([NewTask(queue=Q, payload=i, partition_key="k") for i in range(2)])
    first = await claim_one(store, ordered=True)
    altered = dataclasses.replace(first, partition_key="zz")
    [done] = await store.complete_many([altered])
    assert isinstance(done, Task)
    [second] = await store.claim(Q, node_id="node-b", limit=5, ordered=True)
    assert (second.partition_key, second.payload) == ("k", 1)


# --- fail, retry, dead letters -------------------------------------------------------


async def test_fail_retries_with_backoff_then_dead(make_store, clock: FakeClock) -> None:
    policy = RetryPolicy(base_s=1.0, factor=3.0, cap_s=5.0, jitter=0.0, max_attempts=4)
    store = await make_store(config=StoreConfig(retry=policy))
    task = (await store.enqueue(Q, "x")).task
    expected_delays = [1.0, 3.0, 5.0]  # 1, 3, 9 capped at 5
    version = task.version
    for attempt, delay in enumerate(expected_delays, start=1):
        claimed = await claim_one(store)
        assert claimed.attempts == attempt
        clock.advance(0.25)
        failed = await store.fail(claimed, f"boom {attempt}")
        assert failed.status is TaskStatus.PENDING
        assert failed.run_at == pytest.approx(clock.now + delay, abs=1e-9)
        assert failed.last_error == f"boom {attempt}"
        assert failed.attempts == attempt
        assert failed.version == claimed.version + 1
        assert failed.lease_token is None
        assert await store.get(task.id) == failed
        version = failed.version
        clock.now = failed.run_at - 0.001
        assert await store.claim(Q, node_id="n", limit=1) == []
        clock.now = failed.run_at
    last = await claim_one(store)
    assert last.attempts == 4
    dead = await store.fail(last, "final boom")
    assert dead.status is TaskStatus.DEAD
    assert dead.last_error == "final boom"
    assert dead.version == version + 2
    assert dead.attempts == 4
    assert store.events.get(ev.RETRIES) == 3
    assert store.events.get(ev.DEAD_LETTERED) == 1
    clock.advance(1000)
    assert await store.claim(Q, node_id="n", limit=1) == []
    assert counts(await store.stats(Q))["dead"] == 1


async def test_fail_with_explicit_policy_overrides_store_policy(store, clock: FakeClock) -> None:
    await store.enqueue(Q, "x")
    task = await claim_one(store)
    failed = await store.fail(task, "e", retry=RetryPolicy(base_s=42.0, cap_s=100.0, jitter=0.0))
    assert failed.run_at == clock.now + 42.0
    # The policy gives the delay only: the task keeps the max_attempts it was enqueued with.
    assert failed.status is TaskStatus.PENDING
    assert failed.max_attempts == 5
    clock.advance(42.0)
    again = await store.fail(await claim_one(store), "e", retry=RetryPolicy(base_s=1.0, jitter=0.0, max_attempts=1))
    assert (again.status, again.attempts, again.max_attempts) == (TaskStatus.PENDING, 2, 5)


async def test_fail_dead_dead_letters_at_once_and_lets_the_key_go_on(store) -> None:
    """``fail(dead=True)``, a message the provider refused for good: dead on its first attempt of
    five, counted as a dead letter, its key's next task claimable (the default "skip" policy)."""
    first = (await store.enqueue(Q, {"n": 1}, partition_key="k", max_attempts=5)).task
    second = (await store.enqueue(Q, {"n": 2}, partition_key="k")).task
    [head] = await store.claim(Q, node_id="n", ordered=True)
    assert head.id == first.id
    with pytest.raises(InvalidTypeError, match="dead"):
        await store.fail(head, "refused", dead="yes")
    assert await store.get(head.id) == head  # nothing written
    dead = await store.fail(head, "Undeliverable: 400 Bad Request", dead=True)
    assert (dead.status, dead.attempts, dead.max_attempts) == (TaskStatus.DEAD, 1, 5)
    assert dead.last_error == "Undeliverable: 400 Bad Request"
    assert dead.lease_token is None
    assert await store.get(first.id) == dead
    assert store.events.get(ev.DEAD_LETTERED) == 1
    assert store.events.get(ev.RETRIES) == 0
    [after] = await store.claim(Q, node_id="n", ordered=True)
    assert after.id == second.id
    with pytest.raises(LeaseLostError):  # a dead task is no longer held: nothing written
        await store.fail(head, "again", dead=True)
    assert await store.get(first.id) == dead


async def test_fail_keeps_error_text_safely(store) -> None:
    await store.enqueue(Q, "x")
    task = await claim_one(store)
    failed = await store.fail(task, "bad \x00 byte and lone \ud800 surrogate " + "x" * 10_000)
    assert "\x00" not in failed.last_error
    assert len(failed.last_error) <= 8192
    failed.last_error.encode("utf-8")  # storable text
    assert (await store.get(task.id)).last_error == failed.last_error


async def test_stale_fail_writes_nothing(store, clock: FakeClock) -> None:
    await store.enqueue(Q, "x")
    task = await claim_one(store, lease_s=1)
    clock.advance(1)
    before = await store.get(task.id)
    with pytest.raises(LeaseLostError):
        await store.fail(task, "late")
    assert await store.get(task.id) == before
    assert store.events.get(ev.RETRIES) == 0


async def test_fail_acts_on_the_stored_task_not_a_modified_copy(store) -> None:
    """A copy with another key, queue or attempt count neither strands the real key nor dead-letters early."""
    await store.enqueue(Q, {"n": 1}, partition_key="k", max_attempts=1)
    second = (await store.enqueue(Q, {"n": 2}, partition_key="k")).task
    [head] = await store.claim(Q, node_id="n", ordered=True)
    dead = await store.fail(dataclasses.replace(head, partition_key="other", queue="elsewhere"), "boom")
    assert (dead.status, dead.queue, dead.partition_key) == (TaskStatus.DEAD, Q, "k")
    [after] = await store.claim(Q, node_id="n", ordered=True)  # the key's next task is its head now
    assert after.id == second.id
    await store.complete(after)
    await store.enqueue(Q, "r", partition_key="z", max_attempts=5)
    [task] = await store.claim(Q, node_id="n")
    retried = await store.fail(dataclasses.replace(task, attempts=5), "boom")
    assert (retried.status, retried.attempts, retried.max_attempts) == (TaskStatus.PENDING, 1, 5)
    assert store.events.get(ev.DEAD_LETTERED) == 1
    assert store.events.get(ev.RETRIES) == 1


async def test_requeue_dead(store) -> None:
    a = (await store.enqueue(Q, "a", max_attempts=1)).task
    b = (await store.enqueue(Q, "b", max_attempts=1)).task
    c = (await store.enqueue(Q, "c", max_attempts=1)).task
    for task in await store.claim(Q, node_id="n", limit=3):
        await store.fail(task, f"dead {task.payload}")
    assert counts(await store.stats(Q))["dead"] == 3
    assert await store.requeue_dead(Q, [a.id]) == 1
    again = await store.get(a.id)
    assert again.status is TaskStatus.PENDING
    assert again.attempts == 0
    assert again.last_error == "dead a"  # kept for the record
    assert await store.requeue_dead("other") == 0
    assert await store.requeue_dead(Q) == 2
    assert {(await store.get(i)).status for i in (b.id, c.id)} == {TaskStatus.PENDING}
    assert await store.requeue_dead(Q) == 0
    claimed = await store.claim(Q, node_id="n", limit=3)
    assert sorted(t.id for t in claimed) == [a.id, b.id, c.id]
    assert all(t.attempts == 1 for t in claimed)


# --- release and extend --------------------------------------------------------------


async def test_release_does_not_count_the_attempt(store, clock: FakeClock) -> None:
    enq = (await store.enqueue(Q, "x", delay_s=1)).task
    clock.advance(2)
    task = await claim_one(store)
    assert task.attempts == 1
    clock.advance(0.5)
    released = await store.release(task)
    assert released.status is TaskStatus.PENDING
    assert released.attempts == 0
    assert released.run_at == clock.now  # due now
    assert released.version == task.version + 1
    assert released.lease_token is None
    assert released.run_at != enq.run_at
    again = await claim_one(store, "node-b")
    assert again.attempts == 1
    with pytest.raises(LeaseLostError):
        await store.release(task)


async def test_a_release_that_counts_the_attempt_keeps_it_for_the_next_delivery(store, clock: FakeClock) -> None:
    await store.enqueue(Q, "x")
    task = await claim_one(store)
    released = await store.release(task, count_attempt=True)  # its send was cut short: it may have gone out
    assert (released.status, released.attempts) == (TaskStatus.PENDING, 1)
    again = await claim_one(store, "node-b")
    assert again.attempts == 2  # the next delivery can tell it may repeat a message


async def test_a_release_that_counts_the_last_attempt_leaves_the_task_dead(store, clock: FakeClock) -> None:
    """As a lease that expired on the last attempt: a task never gets more deliveries than max_attempts."""
    task = (await store.enqueue(Q, "x", max_attempts=2)).task
    first = await claim_one(store)
    assert (await store.release(first, count_attempt=True)).status is TaskStatus.PENDING
    last = await claim_one(store, "node-b")
    assert (last.attempts, last.max_attempts) == (2, 2)
    dead = await store.release(last, count_attempt=True)
    assert (dead.status, dead.attempts, dead.version) == (TaskStatus.DEAD, 2, last.version + 1)
    assert dead.lease_token is None
    assert dead.last_error is not None
    assert "released on its last attempt" in dead.last_error
    assert await store.get(task.id) == dead
    assert await store.claim(Q, node_id="node-c", limit=5) == []
    assert [t.id for t in await store.dead_letters(Q)] == [task.id]
    assert store.events.get(ev.DEAD_LETTERED) == 1
    with pytest.raises(LeaseLostError):
        await store.release(last, count_attempt=True)
    # An uncounted release on the last attempt gives the attempt back, as ever.
    other = (await store.enqueue(Q, "y", max_attempts=1)).task
    (only,) = await store.claim(Q, node_id="n", limit=5)
    assert only.id == other.id
    assert (await store.release(only)).status is TaskStatus.PENDING


@pytest.mark.parametrize("flag", [1, "yes", None])
async def test_a_release_with_a_non_bool_count_attempt_is_refused_and_changes_nothing(
    store, clock: FakeClock, flag: object
) -> None:
    await store.enqueue(Q, "x")
    task = await claim_one(store)
    with pytest.raises(InvalidTypeError, match="count_attempt must be a bool"):
        await store.release(task, count_attempt=flag)
    current = await store.get(task.id)
    assert (current.status, current.attempts, current.version) == (TaskStatus.RUNNING, 1, task.version)


async def test_extend_keeps_version_and_pushes_expiry(store, clock: FakeClock) -> None:
    await store.enqueue(Q, "x")
    task = await claim_one(store, lease_s=5)
    clock.advance(4)
    expiry = await store.extend(task, 5)
    assert expiry == clock.now + 5
    stored = await store.get(task.id)
    assert stored.lease_expires_at == expiry
    assert stored.version == task.version  # a heartbeat is not a state change
    clock.advance(4)  # past the original expiry, inside the extended one
    assert await store.claim(Q, node_id="thief", limit=1) == []
    done = await store.complete(task)  # the same Task object still settles
    assert done.status is TaskStatus.DONE


async def test_extend_never_revives_an_expired_lease(store, clock: FakeClock) -> None:
    await store.enqueue(Q, "x")
    task = await claim_one(store, lease_s=5)
    clock.advance(5)
    before = await store.get(task.id)
    with pytest.raises(LeaseLostError, match="expired"):
        await store.extend(task, 60)
    assert await store.get(task.id) == before
    assert await store.extend_many([task], 60) == [False]
    assert await store.get(task.id) == before
    again = await claim_one(store, "node-b")  # still claimable by others
    assert again.attempts == 2


async def test_extend_many_reports_each_lease(store, clock: FakeClock) -> None:
    await store.enqueue_many([NewTask(queue=Q, payload=i) for i in range(4)])
    short = await store.claim(Q, node_id="n", limit=2, lease_s=1)
    long = await store.claim(Q, node_id="n", limit=2, lease_s=10)
    done = await store.complete(long[1])
    del done
    clock.advance(1)
    result = await store.extend_many([short[0], long[0], short[1], long[1]], 30)
    assert result == [False, True, False, False]
    assert (await store.get(long[0].id)).lease_expires_at == clock.now + 30
    assert (await store.get(short[0].id)).lease_expires_at == short[0].lease_expires_at
    assert await store.extend_many([], 30) == []


async def test_concurrent_extend_many_calls_each_get_their_own_leases_and_ttl(store, clock: FakeClock) -> None:
    """Several nodes' keepers renew at once (a store may run the calls as one statement):
    each call is answered for its own leases, each renewed by its own TTL."""
    await store.enqueue_many([NewTask(queue=Q, payload=i) for i in range(9)])
    held = [await store.claim(Q, node_id=f"node-{i}", limit=3, lease_s=10) for i in range(3)]
    await store.complete(held[2][1])
    out = await asyncio.gather(
        store.extend_many(held[0], 20), store.extend_many(held[1], 40), store.extend_many(held[2], 60)
    )
    assert out == [[True, True, True], [True, True, True], [True, False, True]]
    for tasks, ttl_s in zip(held, (20, 40, 60), strict=True):
        for task in tasks:
            stored = await store.get(task.id)
            if stored.status is TaskStatus.RUNNING:
                assert stored.lease_expires_at == clock.now + ttl_s
    assert (await store.get(held[2][1].id)).status is TaskStatus.DONE


@pytest.mark.parametrize("ordered", [False, True])
async def test_concurrent_claims_each_get_their_own_partitions_limit_and_ttl(
    store, clock: FakeClock, ordered: bool
) -> None:
    """A process's nodes claim at the same moment (a store may run the claims as one
    statement): each claim leases only tasks of its own partitions, at most its limit, the
    best first (priority, then FIFO), to its own node id with its own TTL; in order, only
    heads of keys."""
    created = await store.enqueue_many(
        [NewTask(queue=Q, payload=i, partition_key=f"k{i % 30}", priority=i % 3) for i in range(60)]
    )
    tasks = [r.task for r in created]
    parts = sorted({t.partition for t in tasks})
    groups = [parts[0::3], parts[1::3], parts[2::3]]
    limits, ttls = (2, 100, 100), (10.0, 20.0, 30.0)

    def eligible(group: list[int]) -> list[Task]:
        mine = [t for t in tasks if t.partition in group]
        if ordered:  # a key's first task is its head; the others wait behind it
            firsts: dict[str, Task] = {}
            for t in mine:
                firsts.setdefault(t.partition_key, t)
            mine = list(firsts.values())
        return sorted(mine, key=lambda t: (-t.priority, t.id))

    empty = next(p for p in range(store.partitions) if p not in parts)
    # A first ordered claim sets the queue up; the three below then reach the store together.
    assert await store.claim(Q, node_id="w", partitions=[empty], ordered=ordered) == []
    out = await asyncio.gather(
        *(
            store.claim(Q, node_id=f"node-{i}", limit=limits[i], lease_s=ttls[i], partitions=groups[i], ordered=ordered)
            for i in range(3)
        )
    )
    for i, claimed in enumerate(out):
        assert [t.id for t in claimed] == [t.id for t in eligible(groups[i])[: limits[i]]]
        for task in claimed:
            stored = await store.get(task.id)
            assert stored == task
            assert stored.status is TaskStatus.RUNNING
            assert stored.lease_owner == f"node-{i}"
            assert stored.lease_expires_at == clock.now + ttls[i]
    assert sum(len(c) for c in out) == 2 + len(eligible(groups[1])) + len(eligible(groups[2]))


@pytest.mark.parametrize("ordered", [False, True])
async def test_a_partition_named_twice_in_concurrent_claims_still_fills_the_limit(store, ordered: bool) -> None:
    """A claim naming a partition more than once gets what a claim naming it once gets."""
    created = await store.enqueue_many([NewTask(queue=Q, payload=i, partition_key=f"k{i}") for i in range(64)])
    by_partition: dict[int, list[Task]] = {}
    for r in created:
        by_partition.setdefault(r.task.partition, []).append(r.task)
    part, tasks = max(by_partition.items(), key=lambda kv: len(kv[1]))
    assert len(tasks) >= 2
    other = next(p for p in by_partition if p != part)
    empty = next(p for p in range(store.partitions) if p not in by_partition)
    # A first ordered claim sets the queue up; the two below then reach the store together.
    assert await store.claim(Q, node_id="w", partitions=[empty], ordered=ordered) == []
    out = await asyncio.gather(
        store.claim(Q, node_id="a", limit=2, partitions=[part, part, part], ordered=ordered),
        store.claim(Q, node_id="b", limit=2, partitions=[other], ordered=ordered),
    )
    assert [t.id for t in out[0]] == [t.id for t in tasks[:2]]
    assert [t.id for t in out[1]] == [t.id for t in by_partition[other][:2]]


async def test_concurrent_claims_of_the_same_partitions_never_lease_a_task_twice(store) -> None:
    """Two nodes claim the same partitions at once (a membership change overlaps their
    views): every task is leased once, to the node whose claim returned it."""
    created = await store.enqueue_many([NewTask(queue=Q, payload=i, partition_key=f"k{i}") for i in range(40)])
    parts = sorted({r.task.partition for r in created})
    out = await asyncio.gather(
        *(store.claim(Q, node_id=f"node-{i}", limit=100, lease_s=30, partitions=parts) for i in range(4))
    )
    ids = [t.id for claimed in out for t in claimed]
    assert sorted(ids) == sorted(r.task.id for r in created)  # all of them, none twice
    for i, claimed in enumerate(out):
        for task in claimed:
            assert (await store.get(task.id)).lease_owner == f"node-{i}"


# --- per-key ordering ------------------------------------------------------------------


async def test_ordered_claim_one_active_task_per_key(store) -> None:
    a1 = (await store.enqueue(Q, "a1", partition_key="A")).task
    a2 = (await store.enqueue(Q, "a2", partition_key="A")).task
    b1 = (await store.enqueue(Q, "b1", partition_key="B")).task
    b2 = (await store.enqueue(Q, "b2", partition_key="B")).task
    c1 = (await store.enqueue(Q, "c1", partition_key="C")).task
    first = await store.claim(Q, node_id="n", limit=10, ordered=True)
    assert [t.id for t in first] == [a1.id, b1.id, c1.id]
    assert await store.claim(Q, node_id="n", limit=10, ordered=True) == []  # heads are running
    by_id = {t.id: t for t in first}
    await store.complete(by_id[b1.id])
    assert [t.id for t in await store.claim(Q, node_id="n", limit=10, ordered=True)] == [b2.id]
    await store.complete(by_id[a1.id])
    assert [t.id for t in await store.claim(Q, node_id="n", limit=10, ordered=True)] == [a2.id]


async def test_first_ordered_claim_after_unordered_use_sees_the_true_heads(store, clock: FakeClock) -> None:
    # A queue used without ordering, then claimed in order: the order holds from the first
    # ordered claim on, whatever happened to the queue before it (settled, leased, dead tasks).
    tasks = [
        (await store.enqueue(Q, i, partition_key=k, max_attempts=1 if i == 2 else 3)).task
        for i, k in enumerate("AABBBCCD")
    ]
    a1, a2, b1, b2, b3, c1, c2, d1 = tasks
    leased = {t.id: t for t in await store.claim(Q, node_id="n", limit=3, lease_s=5)}  # a1, a2, b1
    assert sorted(leased) == sorted([a1.id, a2.id, b1.id])
    await store.complete(leased[a1.id])
    await store.fail(leased[b1.id], "boom")  # its only attempt: dead, so b2 is B's head
    first = await store.claim(Q, node_id="o", limit=10, ordered=True)
    # a2 is leased (A's head, running); b2, c1 and d1 head their keys.
    assert [t.id for t in first] == [b2.id, c1.id, d1.id]
    assert await store.claim(Q, node_id="o", limit=10, ordered=True) == []
    clock.advance(5)  # a2's lease expires: A's head is claimable again, still before nothing else of A
    by_id = {t.id: t for t in first}
    await store.complete(by_id[c1.id])
    again = await store.claim(Q, node_id="o", limit=10, ordered=True)
    assert sorted(t.id for t in again) == sorted([a2.id, c2.id])
    assert (await store.get(a2.id)).attempts == 2
    assert (await store.get(b3.id)).status is TaskStatus.PENDING


async def test_ordered_failing_head_blocks_only_its_key(make_store, clock: FakeClock) -> None:
    store = await make_store(config=StoreConfig(retry=RetryPolicy(base_s=10, cap_s=10, jitter=0, max_attempts=3)))
    a1 = (await store.enqueue(Q, "a1", partition_key="A")).task
    a2 = (await store.enqueue(Q, "a2", partition_key="A")).task
    b1 = (await store.enqueue(Q, "b1", partition_key="B")).task
    b2 = (await store.enqueue(Q, "b2", partition_key="B")).task
    head = await claim_one(store, ordered=True)
    assert head.id == a1.id
    failed = await store.fail(head, "boom")
    assert failed.run_at == clock.now + 10
    # A is blocked by its failing head (pending in backoff); B flows.
    got = await store.claim(Q, node_id="n", limit=10, ordered=True)
    assert [t.id for t in got] == [b1.id]
    await store.complete(got[0])
    got = await store.claim(Q, node_id="n", limit=10, ordered=True)
    assert [t.id for t in got] == [b2.id]
    await store.complete(got[0])
    assert await store.claim(Q, node_id="n", limit=10, ordered=True) == []
    # The unordered view would hand out a2 at once; the ordered one never before a1.
    clock.advance(10)
    got = await store.claim(Q, node_id="n", limit=10, ordered=True)
    assert [t.id for t in got] == [a1.id]
    await store.complete(got[0])
    got = await store.claim(Q, node_id="n", limit=10, ordered=True)
    assert [t.id for t in got] == [a2.id]


async def test_ordered_dead_head_unblocks_its_key(store) -> None:
    a1 = (await store.enqueue(Q, "a1", partition_key="A", max_attempts=1)).task
    a2 = (await store.enqueue(Q, "a2", partition_key="A")).task
    head = await claim_one(store, ordered=True)
    assert head.id == a1.id
    await store.fail(head, "poison")
    assert [t.id for t in await store.claim(Q, node_id="n", limit=10, ordered=True)] == [a2.id]


async def test_unordered_claim_ignores_keys(store) -> None:
    ids = [(await store.enqueue(Q, i, partition_key="same")).task.id for i in range(3)]
    assert [t.id for t in await store.claim(Q, node_id="n", limit=10)] == ids


# --- partitions ------------------------------------------------------------------------


async def test_claim_partition_filter(store) -> None:
    keys = [f"conv-{i}" for i in range(40)]
    tasks = [(await store.enqueue(Q, k, partition_key=k)).task for k in keys]
    mine = sorted({tasks[0].partition, tasks[7].partition})
    got = await store.claim(Q, node_id="n", limit=100, partitions=mine)
    expected = [t.id for t in tasks if t.partition in mine]
    assert [t.id for t in got] == expected
    assert all(t.partition == partition_of(t.partition_key, store.partitions) for t in tasks)
    assert await store.claim(Q, node_id="n", limit=100, partitions=[]) == []
    rest = await store.claim(Q, node_id="n", limit=100)
    assert len(rest) == 40 - len(expected)


@pytest.mark.parametrize("share", ["few", "many"])
async def test_claim_with_partitions_takes_the_best_due_tasks_in_order(store, clock: FakeClock, share: str) -> None:
    """Claims restricted to a few partitions (SQLite seeks each) or to many (SQLite walks them
    all in order) take the same tasks: the due ones of those partitions only, priority first,
    then FIFO, at most ``limit`` a claim; a task back from a lease, even one taken before the
    first such claim, in its old place."""
    created = await store.enqueue_many(
        [NewTask(queue=Q, payload=i, partition_key=f"k{i % 40}", priority=i % 3) for i in range(200)]
    )
    tasks = {r.task.id: r.task for r in created}
    (early,) = await store.claim(Q, node_id="x", limit=1, lease_s=600)  # the best task of all
    parts = sorted({t.partition for t in tasks.values()} - {early.partition})
    if share == "few":
        mine = sorted({early.partition, *parts[:2]})
    else:
        mine = [p for p in range(store.partitions) if p not in parts[2:]]
    assert (len(mine) == 3) == (share == "few")
    later = (await store.enqueue(Q, "later", partition_key="k0", priority=9, delay_s=50)).task
    released = await store.claim(Q, node_id="x", limit=4, lease_s=600, partitions=mine)  # the best four of mine...
    assert early.id not in {t.id for t in released}
    for task in (released[2], early):  # ...one of them back, due now, in its old place, and the first task too
        assert (await store.release(task)).status is TaskStatus.PENDING
    clock.advance(10)
    fresh = (await store.enqueue(Q, "fresh", partition_key="k0", priority=2)).task  # due 0 s ago
    taken = {t.id for t in released} - {released[2].id}
    order = sorted(
        (t for t in tasks.values() if t.partition in mine and t.id not in taken), key=lambda t: (-t.priority, t.id)
    )
    assert order[0].id == early.id
    assert len(order) >= 12
    # Due at least 5 s ago: neither the fresh task nor the delayed one.
    first = await store.claim(Q, node_id="n", lease_s=600, limit=5, partitions=mine, min_due_age_s=5)
    assert [t.id for t in first] == [t.id for t in order[:5]]
    assert first[0].priority == 2
    clock.advance(5)
    second = await store.claim(Q, node_id="n", lease_s=600, limit=7, partitions=mine)
    expected = sorted([*order[5:], fresh], key=lambda t: (-t.priority, t.id))
    assert [t.id for t in second] == [t.id for t in expected[:7]]
    rest = await store.claim(Q, node_id="n", lease_s=600, limit=1000, partitions=mine)
    assert [t.id for t in rest] == [t.id for t in expected[7:]]
    assert all(t.partition in mine for t in [*first, *second, *rest])
    clock.advance(40)
    assert [t.id for t in await store.claim(Q, node_id="n", lease_s=600, limit=1000, partitions=mine)] == [later.id]
    others = await store.claim(Q, node_id="n", lease_s=600, limit=1000)
    assert sorted(t.id for t in others) == sorted(t.id for t in tasks.values() if t.partition not in mine)


async def test_partitions_count_is_configurable(make_store) -> None:
    store = await make_store(config=StoreConfig(partitions=8))
    assert store.partitions == 8
    task = (await store.enqueue(Q, 1, partition_key="abc")).task
    assert task.partition == partition_of("abc", 8)


# --- processed ids and duplicate delivery --------------------------------------------


async def test_complete_writes_processed_record(store) -> None:
    await store.enqueue(Q, 1, idempotency_key="msg-7")
    await store.enqueue(Q, 2)
    assert not await store.is_processed(Q, "msg-7")
    for task in await store.claim(Q, node_id="n", limit=2):
        await store.complete(task)
    assert await store.is_processed(Q, "msg-7")
    assert not await store.is_processed("other", "msg-7")


async def test_redelivery_after_purge_is_suppressed_at_claim(store, clock: FakeClock) -> None:
    first = (await store.enqueue(Q, {"m": 1}, idempotency_key="msg-1")).task
    await store.complete(await claim_one(store))
    clock.advance(10)
    purged = await store.purge_finished(Q, older_than_s=5)
    assert purged.deleted == 1
    with pytest.raises(TaskNotFoundError):
        await store.get(first.id)
    # The upstream redelivers the same message: the task row is gone, so enqueue creates one...
    again = await store.enqueue(Q, {"m": 1}, idempotency_key="msg-1")
    assert again.created is True
    assert again.task.id != first.id
    other = (await store.enqueue(Q, {"m": 2}, idempotency_key="msg-2")).task
    # ...but the processed-id record stops it at claim.
    claimed = await store.claim(Q, node_id="n", limit=10)
    assert [t.id for t in claimed] == [other.id]
    suppressed = await store.get(again.task.id)
    assert suppressed.status is TaskStatus.DONE
    assert suppressed.lease_token is None
    assert store.events.get(ev.DUPLICATE_DELIVERY_SUPPRESSED) == 1
    assert await store.claim(Q, node_id="n", limit=10) == []


async def test_purge_finished_keeps_recent_running_and_dead(store, clock: FakeClock) -> None:
    await store.enqueue_many([NewTask(queue=Q, payload=i, max_attempts=1) for i in range(4)])
    t0, t1, t2, _t3 = await store.claim(Q, node_id="n", limit=4)
    await store.complete(t0)
    await store.fail(t1, "dead")
    clock.advance(10)
    await store.complete(t2)
    result = await store.purge_finished(Q, older_than_s=5, batch=1)
    assert (result.deleted, result.batches) == (1, 1)
    assert counts(await store.stats(Q)) == {"pending": 0, "running": 1, "done": 1, "dead": 1}


async def test_queue_depths_count_what_purges_and_discards_removed(store, clock: FakeClock) -> None:
    await store.enqueue_many([NewTask(queue=Q, payload=i, max_attempts=1) for i in range(5)])
    await store.enqueue(OTHER, "x")
    tasks = await store.claim(Q, node_id="n", limit=5)
    for task in tasks[:3]:
        await store.complete(task)
    for task in tasks[3:]:
        await store.fail(task, "refused")

    def finished(depths: list[Any]) -> dict[str, tuple[int, int, int]]:
        return {d.queue: (d.counts["done"], d.counts["dead"], d.removed) for d in depths}

    assert finished(await store.queue_depths()) == {Q: (3, 2, 0), OTHER: (0, 0, 0)}
    clock.advance(10)
    assert (await store.purge_finished(Q, older_than_s=5, batch=2)).deleted == 3
    assert finished(await store.queue_depths()) == {Q: (0, 2, 3), OTHER: (0, 0, 0)}
    assert await store.discard_dead(Q, [tasks[3].id]) == 1
    assert finished(await store.queue_depths()) == {Q: (0, 1, 4), OTHER: (0, 0, 0)}
    assert await store.discard_dead(Q) == 1
    # Every task of Q is gone; the queue stays listed, with its finished work.
    assert finished(await store.queue_depths()) == {Q: (0, 0, 5), OTHER: (0, 0, 0)}
    assert (await store.purge_finished(Q, older_than_s=0)).deleted == 0
    assert finished(await store.queue_depths()) == {Q: (0, 0, 5), OTHER: (0, 0, 0)}


async def test_queue_backlogs_count_unfinished_and_dead_tasks_as_stats_does(store, clock: FakeClock) -> None:
    """``queue_backlogs``: pending, running and dead tasks and the oldest due age per queue, as ``stats`` has them."""
    await store.enqueue_many([NewTask(queue=Q, payload=i, max_attempts=1) for i in range(6)])
    clock.advance(4)
    await store.enqueue(Q, "later", delay_s=30)  # pending, not yet due: counted, but ages nothing
    await store.enqueue(OTHER, "x")
    t0, t1, t2, t3 = await store.claim(Q, node_id="n", limit=4)
    await store.complete(t0)  # done: not in a backlog
    await store.fail(t1, "refused")  # dead after its only attempt
    clock.advance(1.5)
    got = await store.queue_backlogs([Q, OTHER, "empty", Q])
    assert [b.queue for b in got] == [Q, OTHER, "empty"]  # in order, repeats dropped
    backlog, other, empty = got
    assert (backlog.pending, backlog.running, backlog.dead) == (3, 2, 1)
    assert backlog.oldest_pending_age_s == pytest.approx(5.5, abs=0.01)  # the first enqueue's tasks
    stats = await store.stats(Q)
    assert counts(stats) == {"pending": 3, "running": 2, "done": 1, "dead": 1}
    assert backlog.oldest_pending_age_s == pytest.approx(stats.oldest_pending_age_s, abs=0.01)
    assert (other.pending, other.running, other.dead) == (1, 0, 0)
    assert other.oldest_pending_age_s == pytest.approx(1.5, abs=0.01)
    assert (empty.pending, empty.running, empty.dead, empty.oldest_pending_age_s) == (0, 0, 0, None)
    await store.complete(t2)
    await store.complete(t3)
    for task in await store.claim(Q, node_id="n", limit=10):
        await store.complete(task)
    [drained] = await store.queue_backlogs((Q,))
    assert (drained.pending, drained.running, drained.dead, drained.oldest_pending_age_s) == (1, 0, 1, None)
    assert await store.queue_backlogs([]) == []
    with pytest.raises(InvalidTypeError, match="queues must be a list or tuple"):
        await store.queue_backlogs(Q)
    with pytest.raises(InvalidArgumentError, match=r"queues\[1\]"):
        await store.queue_backlogs([Q, ""])


async def test_purge_processed_by_age(make_store, clock: FakeClock) -> None:
    store = await make_store(
        config=StoreConfig(processed=ProcessedRetention(retention_s=60, redelivery_window_s=30, purge_batch=3))
    )
    await store.enqueue_many([NewTask(queue=Q, payload=i, idempotency_key=f"old-{i}") for i in range(7)])
    for task in await store.claim(Q, node_id="n", limit=10):
        await store.complete(task)
    clock.advance(30)
    await store.enqueue(Q, "new", idempotency_key="new")
    await store.complete(await claim_one(store))
    clock.advance(31)
    result = await store.purge_processed()
    assert (result.deleted, result.batches) == (7, 3)
    assert not any([await store.is_processed(Q, f"old-{i}") for i in range(7)])
    assert await store.is_processed(Q, "new")
    assert await store.purge_processed() == type(result)(deleted=0, batches=0)
    result = await store.purge_processed(older_than_s=0, batch=10)
    assert (result.deleted, result.batches) == (1, 1)


@pytest.mark.parametrize("batch", [0, 2**31, 2**63, 2**70])
async def test_purge_batch_out_of_range_is_refused_and_deletes_nothing(store, clock: FakeClock, batch: int) -> None:
    # One bound on every backend: PostgreSQL takes the LIMIT as an int32, SQLite as an int64.
    done = (await store.enqueue(Q, 1, idempotency_key="msg-1")).task
    await store.complete(await claim_one(store))
    clock.advance(10)
    message = rf"^batch must be (>= 1|<= 2147483647), got {batch}$"
    with pytest.raises(InvalidArgumentError, match=message):
        await store.purge_processed(older_than_s=0, batch=batch)
    with pytest.raises(InvalidArgumentError, match=message):
        await store.purge_finished(Q, older_than_s=0, batch=batch)
    assert await store.is_processed(Q, "msg-1")
    assert (await store.get(done.id)).status is TaskStatus.DONE
    # The bound itself is accepted, and purges.
    assert (await store.purge_finished(Q, older_than_s=0, batch=2**31 - 1)).deleted == 1
    assert (await store.purge_processed(older_than_s=0, batch=2**31 - 1)).deleted == 1
    assert not await store.is_processed(Q, "msg-1")


# --- stats and get ---------------------------------------------------------------------


async def test_stats_counts_and_oldest_pending_age(store, clock: FakeClock) -> None:
    empty = await store.stats()
    assert counts(empty) == {"pending": 0, "running": 0, "done": 0, "dead": 0}
    assert empty.oldest_pending_age_s is None
    assert empty.total == 0
    await store.enqueue_many([NewTask(queue=Q, payload=i, max_attempts=1) for i in range(5)])
    await store.enqueue(Q, "future", delay_s=100)
    await store.enqueue("other", "x")
    clock.advance(3)
    await store.enqueue(Q, "young")
    a, b, c = await store.claim(Q, node_id="n", limit=3)
    await store.complete(a)
    await store.fail(b, "x")
    stats = await store.stats(Q)
    assert counts(stats) == {"pending": 4, "running": 1, "done": 1, "dead": 1}
    assert stats.total == 7
    assert stats.oldest_pending_age_s == pytest.approx(3.0, abs=1e-6)
    clock.advance(2)
    assert (await store.stats(Q)).oldest_pending_age_s == pytest.approx(5.0, abs=1e-6)
    everything = await store.stats()
    assert everything.total == 8
    assert counts(everything)["pending"] == 5
    assert (await store.stats("nothing-here")).total == 0
    del c


async def test_stats_ignores_pending_not_yet_due(store, clock: FakeClock) -> None:
    await store.enqueue(Q, "x", delay_s=10)
    assert (await store.stats(Q)).oldest_pending_age_s is None
    clock.advance(12)
    assert (await store.stats(Q)).oldest_pending_age_s == pytest.approx(2.0, abs=1e-6)


async def test_is_drained_until_nothing_is_pending_or_running(store, clock: FakeClock) -> None:
    assert await store.is_drained(Q) is True  # nothing ever enqueued
    await store.enqueue("other", "x")  # another queue's work does not count
    assert await store.is_drained(Q) is True
    await store.enqueue(Q, "later", delay_s=100)  # pending, not yet due: still unfinished
    assert await store.is_drained(Q) is False
    await store.enqueue_many([NewTask(queue=Q, payload=i, max_attempts=1) for i in range(2)])
    a, b = await store.claim(Q, node_id="n", limit=5)
    await store.complete(a)
    await store.fail(b, "x")  # dead: finished
    assert await store.is_drained(Q) is False  # "later" is pending
    clock.advance(101)
    (later,) = await store.claim(Q, node_id="n", limit=5)
    assert await store.is_drained(Q) is False  # running
    clock.advance(40)  # its lease (30 s) expired: still running until reclaimed or settled
    assert await store.is_drained(Q) is False
    (reclaimed,) = await store.claim(Q, node_id="m", limit=5)
    assert reclaimed.id == later.id
    await store.complete(reclaimed)
    assert await store.is_drained(Q) is True
    await store.requeue_dead(Q)  # the dead task is pending again
    assert await store.is_drained(Q) is False
    (again,) = await store.claim(Q, node_id="n", limit=5)
    await store.complete_many([again])
    assert await store.is_drained(Q) is True
    assert (await store.stats(Q)).counts[TaskStatus.PENDING] == 0
    assert await store.is_drained("other") is False


@pytest.mark.parametrize("queue", ["", 7, None, "x" * 256])
async def test_is_drained_refuses_a_bad_queue(store, queue) -> None:
    with pytest.raises((InvalidArgumentError, InvalidTypeError), match="queue"):
        await store.is_drained(queue)


async def test_get_unknown_id(store) -> None:
    with pytest.raises(TaskNotFoundError, match="12345") as info:
        await store.get(12345)
    assert info.value.task_id == 12345
    assert str(info.value) == "no task with id 12345"


async def test_now_is_the_store_clock(store, clock: FakeClock) -> None:
    assert await store.now() == clock.now
    clock.advance(7.5)
    assert await store.now() == clock.now


async def test_data_survives_reopen(make_store, backend: str, db_path) -> None:
    store = await make_store()
    task = (await store.enqueue(Q, {"keep": True}, idempotency_key="k")).task
    await store.close()
    await store.open()
    assert await store.get(task.id) == task
    if backend == "sqlite":
        other = await make_store(path=db_path)
        assert await other.get(task.id) == task
    added = (await store.enqueue(Q, {"after": True})).task  # a reopened store writes and claims
    claimed = await store.claim(Q, node_id="n", limit=2, lease_s=5)
    assert [t.id for t in claimed] == [task.id, added.id]
    assert all(isinstance(t, Task) for t in await store.complete_many(claimed))


# --- regressions found by the stateful test ---------------------------------------------


async def test_extend_many_reports_a_stale_lease_beside_the_live_one(store, clock: FakeClock) -> None:
    """Node A's lease expired and node B reclaimed the task; one batched heartbeat for both
    must renew B's lease only and tell A it lost its own."""
    await store.enqueue(Q, "x")
    stale = await claim_one(store, "node-a", lease_s=1)
    clock.advance(1)
    live = await claim_one(store, "node-b", lease_s=1)
    assert live.id == stale.id
    assert await store.extend_many([live, stale], 5) == [True, False]
    assert await store.extend_many([stale, live], 5) == [False, True]
    assert (await store.get(live.id)).lease_expires_at == clock.now + 5


async def test_exhausted_lease_does_not_take_a_claim_slot(store, clock: FakeClock) -> None:
    """A lease that expired on the last attempt is dead-lettered by the claim; it must not
    use up ``limit``, so a due task behind it is still handed out by the same claim."""
    exhausted = (await store.enqueue(Q, "poison", max_attempts=1)).task
    waiting = (await store.enqueue(Q, "fine")).task
    first = await claim_one(store, lease_s=1)
    assert first.id == exhausted.id
    clock.advance(1)
    got = await store.claim(Q, node_id="n", limit=1)
    assert [t.id for t in got] == [waiting.id]
    assert (await store.get(exhausted.id)).status is TaskStatus.DEAD


async def test_ordered_exhausted_head_unblocks_its_key_in_the_same_claim(store, clock: FakeClock) -> None:
    head = (await store.enqueue(Q, "poison", partition_key="A", max_attempts=1)).task
    nxt = (await store.enqueue(Q, "next", partition_key="A")).task
    assert (await claim_one(store, lease_s=1, ordered=True)).id == head.id
    clock.advance(1)
    got = await store.claim(Q, node_id="n", limit=5, ordered=True)
    assert [t.id for t in got] == [nxt.id]


@pytest.mark.parametrize("hold", [False, True], ids=["skip", "hold"])
async def test_concurrent_ordered_claims_each_take_the_heads_dead_letters_made_in_their_partitions(
    store, clock: FakeClock, hold: bool
) -> None:
    """Two nodes claim their own partitions at once, and the lease of key A's head ran out on
    its last attempt: whichever claim dead-letters it, A's next task is taken by the claim of
    A's partition (the claim of B's cannot), unless the queue holds a key behind its dead task."""
    if hold:
        await store.set_dead_letter_policy(Q, "hold")
    head = (await store.enqueue(Q, "A1", partition_key="A", max_attempts=1)).task
    nxt = (await store.enqueue(Q, "A2", partition_key="A")).task
    other = (await store.enqueue(Q, "B1", partition_key="B")).task
    assert head.partition != other.partition
    assert (await claim_one(store, lease_s=1, ordered=True, partitions=[head.partition])).id == head.id
    clock.advance(1)
    for_b, for_a = await asyncio.gather(  # B's claim first: it may be the one that dead-letters A1
        store.claim(Q, node_id="node-b", limit=5, ordered=True, partitions=[other.partition]),
        store.claim(Q, node_id="node-a", limit=5, ordered=True, partitions=[head.partition]),
    )
    assert [t.id for t in for_b] == [other.id]
    assert [t.id for t in for_a] == ([] if hold else [nxt.id])
    assert (await store.get(head.id)).status is TaskStatus.DEAD
    assert (await store.get(nxt.id)).status is (TaskStatus.PENDING if hold else TaskStatus.RUNNING)


# --- complete_many ----------------------------------------------------------------------


async def test_complete_many_settles_each_task_on_its_own(store, clock: FakeClock) -> None:
    await store.enqueue_many([NewTask(queue=Q, payload=i, idempotency_key=f"m-{i}", max_attempts=5) for i in range(4)])
    t0, t1, t2, t3 = await store.claim(Q, node_id="n", limit=4, lease_s=10)
    await store.release(t1)  # t1's lease is gone
    ghost = dataclasses.replace(t3, id=t3.id + 100)
    before_t1 = await store.get(t1.id)
    clock.advance(1)
    out = await store.complete_many([t0, t1, t2, ghost], [{"r": 0}, {"r": 1}, None, {"r": 3}])
    assert isinstance(out[0], Task)
    assert out[0].status is TaskStatus.DONE
    assert out[0].result == {"r": 0}
    assert out[0] == await store.get(t0.id)
    assert isinstance(out[1], LeaseLostError)
    assert out[1].task_id == t1.id
    assert isinstance(out[2], Task)
    assert out[2].result is None
    assert out[2] == await store.get(t2.id)
    assert isinstance(out[3], TaskNotFoundError)
    assert await store.get(t1.id) == before_t1
    assert [await store.is_processed(Q, f"m-{i}") for i in range(4)] == [True, False, True, False]
    assert store.events.get(ev.COMMITS) == 2
    assert (await store.get(t3.id)).status is TaskStatus.RUNNING
    assert await store.complete_many([]) == []


async def test_complete_many_bad_input_writes_nothing(store) -> None:
    await store.enqueue_many([NewTask(queue=Q, payload=i) for i in range(2)])
    a, b = await store.claim(Q, node_id="n", limit=2)
    with pytest.raises(TypeError, match="results must be a list or tuple"):
        await store.complete_many([a, b], results=iter([1, 2]))
    with pytest.raises(ValueError, match="results has 1 items for 2 tasks"):
        await store.complete_many([a, b], [1])
    with pytest.raises(TypeError, match="not JSON-serializable"):
        await store.complete_many([a, b], [1, {2}])
    assert {(await store.get(t.id)).status for t in (a, b)} == {TaskStatus.RUNNING}


# --- min_due_age_s (work stealing) ------------------------------------------------------------


@pytest.mark.parametrize("ordered", [False, True], ids=["unordered", "ordered"])
async def test_claim_min_due_age_takes_only_tasks_due_at_least_that_long(
    store, clock: FakeClock, ordered: bool
) -> None:
    early = (await store.enqueue(Q, "early", partition_key="a")).task  # due at +0
    clock.advance(3)
    late = (await store.enqueue(Q, "late", partition_key="b")).task  # due at +3
    delayed = (await store.enqueue(Q, "delayed", partition_key="c", delay_s=1)).task  # due at +4
    steal = {"node_id": "thief", "limit": 10, "lease_s": 30, "ordered": ordered, "min_due_age_s": 5}
    assert await store.claim(Q, **steal) == []  # now +3: early has waited 3 s
    clock.advance(1.9)  # +4.9
    assert await store.claim(Q, **steal) == []
    clock.advance(0.2)  # +5.1: early has waited 5.1 s, the others 2.1 and 1.1 s
    assert [t.id for t in await store.claim(Q, **steal)] == [early.id]
    clock.advance(3)  # +8.1: late 5.1 s, delayed 4.1 s
    [stolen] = await store.claim(Q, **steal)
    assert (stolen.id, stolen.lease_owner, stolen.attempts) == (late.id, "thief", 1)
    assert await store.claim(Q, **steal) == []
    # min_due_age_s=0 (the default) is a plain claim
    assert [t.id for t in await store.claim(Q, node_id="owner", limit=10, ordered=ordered)] == [delayed.id]


async def test_claim_min_due_age_counts_an_expired_lease_from_its_expiry(store, clock: FakeClock) -> None:
    await store.enqueue(Q, "x")
    first = await claim_one(store, "owner", lease_s=10)
    clock.advance(10.5)  # the lease expired 0.5 s ago: claimable, but not stealable after 2 s
    steal = {"node_id": "thief", "limit": 10, "lease_s": 30, "min_due_age_s": 2}
    assert await store.claim(Q, **steal) == []
    clock.advance(1.4)  # 1.9 s
    assert await store.claim(Q, **steal) == []
    clock.advance(0.2)  # 2.1 s
    [stolen] = await store.claim(Q, **steal)
    assert (stolen.id, stolen.attempts, stolen.lease_owner) == (first.id, 2, "thief")
    assert stolen.lease_token != first.lease_token
    with pytest.raises(LeaseLostError):
        await store.complete(first)
    assert (await store.complete(stolen)).status is TaskStatus.DONE


async def test_claim_min_due_age_respects_partitions_and_keys(store, clock: FakeClock) -> None:
    first = (await store.enqueue(Q, 1, partition_key="conv-1")).task
    second = (await store.enqueue(Q, 2, partition_key="conv-1")).task
    other = (await store.enqueue(Q, 3, partition_key="conv-2")).task
    clock.advance(10)
    steal = {"node_id": "thief", "limit": 10, "lease_s": 30, "min_due_age_s": 5}
    assert await store.claim(Q, partitions=[other.partition], **steal) == [await store.get(other.id)]
    [head] = await store.claim(Q, ordered=True, **steal)  # per-key order holds while stealing
    assert head.id == first.id
    await store.complete(head)
    clock.advance(0.5)
    [nxt] = await store.claim(Q, ordered=True, **steal)  # due 10.5 s ago: its wait counts from run_at
    assert nxt.id == second.id


@pytest.mark.parametrize("last", [False, True], ids=["attempts left", "last attempt"])
async def test_a_closing_store_takes_a_hand_back_that_keeps_its_attempt(store, last: bool) -> None:
    """``release(count_attempt=True)`` (a send cut short) is a hand-back like any release: let
    through while the store closes, and waited for. The task is pending again, its attempt
    counted, or dead when that was its last one; not left leased until its lease lapses."""
    await store.enqueue(Q, "x", max_attempts=1 if last else 3)
    task = await claim_one(store, lease_s=600)
    closing = asyncio.ensure_future(store.close())
    await asyncio.sleep(0)  # close() has begun
    assert not closing.done()
    with pytest.raises(StoreClosedError):
        await store.claim(Q, node_id="late", limit=1)
    out = await store.release(task, count_attempt=True)
    await closing
    await store.open()
    stored = await store.get(task.id)
    assert stored == out
    assert (stored.status, stored.attempts, stored.lease_token) == (
        TaskStatus.DEAD if last else TaskStatus.PENDING,
        1,
        None,
    )
