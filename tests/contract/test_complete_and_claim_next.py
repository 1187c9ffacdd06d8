"""Commit-and-continue (``complete_and_claim_next``), the contract run on every backend.

Completing a task and leasing its key's next task in one operation: the commit is exactly
``complete``; when it goes through, the key's head (its earliest unfinished task) is leased
to the same owner if it is pending and due, as an ordered claim would lease it. Every test
uses the fake clock (``clock`` fixture), so leases, delays and expiry are exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support import FakeClock

from asynccoord import (
    Continuation,
    FencingTokenRejectedError,
    InvalidArgumentError,
    InvalidTypeError,
    LeaseLostError,
    NewTask,
    SQLiteStore,
    Task,
    TaskStatus,
)
from asynccoord import events as ev

Q = "chat"


async def fill(store, key: str, n: int, *, first: int = 0) -> list[Task]:
    """Enqueue ``n`` tasks of ``key`` (payloads ``first..first+n-1``), in order."""
    results = await store.enqueue_many([NewTask(queue=Q, payload=first + i, partition_key=key) for i in range(n)])
    return [r.task for r in results]


async def claim_head(store, node_id: str = "n1", **kwargs) -> Task:
    tasks = await store.claim(Q, node_id=node_id, limit=1, ordered=True, **kwargs)
    assert len(tasks) == 1, tasks
    return tasks[0]


async def states(store, tasks: list[Task]) -> list[tuple[TaskStatus, int, str | None]]:
    """Status, version and lease owner of each task, as stored."""
    out = []
    for t in tasks:
        got = await store.get(t.id)
        out.append((got.status, got.version, got.lease_owner))
    return out


# --- the next head is leased ------------------------------------------------------------


async def test_the_next_head_is_leased_to_the_same_owner(store, clock: FakeClock) -> None:
    a, b, c = await fill(store, "k", 3)
    first = await claim_head(store, "node-a", lease_s=30)
    assert first.id == a.id
    clock.advance(2)
    out = await store.complete_and_claim_next(first, {"ok": 1}, lease_s=12.5)
    assert isinstance(out, Continuation)
    assert out.done.id == a.id
    assert out.done.status is TaskStatus.DONE
    assert out.done.result == {"ok": 1}
    assert out.done.version == first.version + 1
    assert out.done == await store.get(a.id)
    nxt = out.next_task
    assert nxt is not None
    assert nxt.id == b.id
    assert nxt.payload == 1
    assert nxt.status is TaskStatus.RUNNING
    assert nxt.lease_owner == "node-a"
    assert nxt.lease_token is not None
    assert nxt.lease_token != first.lease_token
    assert nxt.attempts == 1
    assert nxt.version == b.version + 1
    assert nxt.lease_expires_at == pytest.approx(clock.now + 12.5)
    assert nxt.updated_at == pytest.approx(clock.now)
    assert nxt == await store.get(b.id)
    assert (await store.get(c.id)).status is TaskStatus.PENDING
    # The leased task is an ordinary lease: it can be extended, failed or completed.
    assert await store.extend(nxt, 60) == pytest.approx(clock.now + 60)
    assert (await store.get(b.id)).lease_token == nxt.lease_token


async def test_a_chain_of_five_in_order_with_events(store) -> None:
    tasks = await fill(store, "k", 5)
    others = await fill(store, "other", 2, first=100)
    task: Task | None = await claim_head(store)
    seen = []
    done = []
    while task is not None:
        seen.append(task.payload)
        out = await store.complete_and_claim_next(task, {"step": task.payload})
        done.append(out.done)
        task = out.next_task
    assert seen == [0, 1, 2, 3, 4]
    assert [d.id for d in done] == [t.id for t in tasks]
    assert [(await store.get(t.id)).status for t in tasks] == [TaskStatus.DONE] * 5
    assert await states(store, others) == [(TaskStatus.PENDING, 0, None)] * 2  # another key: untouched
    assert store.events.get(ev.CLAIMS) == 5  # one claim, four continuations
    assert store.events.get(ev.COMMITS) == 5
    assert store.events.get(ev.DUPLICATE_DELIVERY_SUPPRESSED) == 0
    rest = await store.claim(Q, node_id="n2", limit=10, ordered=True)
    assert [t.payload for t in rest] == [100]  # the other key's head, still claimable


async def test_a_continued_task_can_fail_and_be_retried(store, clock: FakeClock) -> None:
    _a, b = await fill(store, "k", 2)
    out = await store.complete_and_claim_next(await claim_head(store))
    assert out.next_task is not None
    failed = await store.fail(out.next_task, "boom")
    assert failed.status is TaskStatus.PENDING
    clock.advance(3600)
    again = await claim_head(store)
    assert again.id == b.id
    assert again.attempts == 2


# --- nothing to lease ---------------------------------------------------------------------


async def test_nothing_leased_when_the_key_has_no_next_task(store) -> None:
    await fill(store, "k", 1)
    other = await fill(store, "other", 1)
    out = await store.complete_and_claim_next(await claim_head(store))
    assert out.done.status is TaskStatus.DONE
    assert out.next_task is None
    assert await states(store, other) == [(TaskStatus.PENDING, 0, None)]
    assert store.events.get(ev.CLAIMS) == 1
    assert store.events.get(ev.COMMITS) == 1


async def test_nothing_leased_when_the_next_task_is_not_due(store, clock: FakeClock) -> None:
    await store.enqueue(Q, 0, partition_key="k")
    later = (await store.enqueue(Q, 1, partition_key="k", delay_s=10)).task
    out = await store.complete_and_claim_next(await claim_head(store))
    assert out.next_task is None
    assert await states(store, [later]) == [(TaskStatus.PENDING, 0, None)]
    assert await store.claim(Q, node_id="n2", ordered=True) == []
    clock.advance(10)
    assert (await claim_head(store, "n2")).id == later.id  # due now: an ordinary claim takes it


async def test_nothing_leased_when_the_next_task_is_running(store) -> None:
    """An unordered claim took the key's first two tasks: the head is still running elsewhere."""
    a, b, c = await fill(store, "k", 3)
    [ta] = await store.claim(Q, node_id="other", limit=1)
    [tb] = await store.claim(Q, node_id="n1", limit=1)
    assert (ta.id, tb.id) == (a.id, b.id)
    out = await store.complete_and_claim_next(tb)
    assert out.done.id == b.id
    assert out.next_task is None  # the key's head is a, running: c is not the head
    assert await states(store, [a, c]) == [(TaskStatus.RUNNING, 1, "other"), (TaskStatus.PENDING, 0, None)]
    # Once a is done, c is the head, and a continuation of a leases it.
    out = await store.complete_and_claim_next(ta)
    assert out.next_task is not None
    assert out.next_task.id == c.id
    assert out.next_task.lease_owner == "other"


async def test_an_expired_head_is_left_to_claims(store, clock: FakeClock) -> None:
    """The head's lease expired (it may be reclaimed): a continuation only leases pending heads."""
    a, b, _c = await fill(store, "k", 3)
    [ta] = await store.claim(Q, node_id="other", limit=1, lease_s=5)
    [tb] = await store.claim(Q, node_id="n1", limit=1, lease_s=60)
    assert (ta.id, tb.id) == (a.id, b.id)
    clock.advance(6)
    out = await store.complete_and_claim_next(tb)
    assert out.next_task is None
    assert await states(store, [a]) == [(TaskStatus.RUNNING, 1, "other")]
    reclaimed = await claim_head(store, "n2")
    assert reclaimed.id == a.id


# --- failed commits lease nothing ---------------------------------------------------------


async def test_an_expired_lease_raises_and_leases_nothing(store, clock: FakeClock) -> None:
    a, b = await fill(store, "k", 2)
    first = await claim_head(store, lease_s=5)
    clock.advance(6)
    with pytest.raises(LeaseLostError):
        await store.complete_and_claim_next(first)
    assert await states(store, [a, b]) == [(TaskStatus.RUNNING, 1, "n1"), (TaskStatus.PENDING, 0, None)]
    assert store.events.get(ev.COMMITS) == 0
    assert store.events.get(ev.CLAIMS) == 1
    assert store.events.get(ev.STALE_COMMIT_REJECTED) == 1


async def test_a_reclaimed_task_raises_and_leases_nothing(store, clock: FakeClock) -> None:
    a, b = await fill(store, "k", 2)
    first = await claim_head(store, lease_s=5)
    clock.advance(6)
    second = await claim_head(store, "n2")
    assert second.id == a.id
    with pytest.raises(LeaseLostError):
        await store.complete_and_claim_next(first)
    assert await states(store, [a, b]) == [(TaskStatus.RUNNING, 2, "n2"), (TaskStatus.PENDING, 0, None)]
    out = await store.complete_and_claim_next(second)  # the current holder continues
    assert out.next_task is not None
    assert out.next_task.lease_owner == "n2"


async def test_a_fence_rejection_leases_nothing(store) -> None:
    a, b = await fill(store, "k", 2)
    first = await claim_head(store)
    await store.fence("acct", 7)
    with pytest.raises(FencingTokenRejectedError) as refused:
        await store.complete_and_claim_next(first, fence=("acct", 6))
    assert (refused.value.resource, refused.value.fencing_token, refused.value.highest) == ("acct", 6, 7)
    assert await states(store, [a, b]) == [(TaskStatus.RUNNING, 1, "n1"), (TaskStatus.PENDING, 0, None)]
    assert store.events.get(ev.FENCING_REJECTED) == 1
    assert store.events.get(ev.COMMITS) == 0
    out = await store.complete_and_claim_next(first, fence=("acct", 8))
    assert out.next_task is not None
    assert out.next_task.id == b.id
    assert (await store.read_fence("acct")).fencing_token == 8


async def test_a_completed_task_cannot_be_continued_twice(store) -> None:
    await fill(store, "k", 3)
    first = await claim_head(store)
    out = await store.complete_and_claim_next(first)
    assert out.next_task is not None
    with pytest.raises(LeaseLostError):
        await store.complete_and_claim_next(first)
    assert (await store.get(out.next_task.id)) == out.next_task  # the continuation is untouched
    assert store.events.get(ev.CLAIMS) == 2


# --- duplicates -----------------------------------------------------------------------------


async def test_a_processed_next_head_is_settled_as_a_duplicate(store, clock: FakeClock) -> None:
    first = (await store.enqueue(Q, "m", partition_key="k", idempotency_key="msg-1")).task
    await store.complete(await claim_head(store))
    clock.advance(10)
    assert (await store.purge_finished(Q, older_than_s=5)).deleted == 1
    x = (await store.enqueue(Q, "x", partition_key="k")).task
    again = (await store.enqueue(Q, "m again", partition_key="k", idempotency_key="msg-1")).task
    after = (await store.enqueue(Q, "after", partition_key="k")).task
    assert again.id != first.id
    tx = await claim_head(store)
    assert tx.id == x.id
    out = await store.complete_and_claim_next(tx)
    assert out.next_task is None  # the redelivery is settled, and the task after it is not leased
    suppressed = await store.get(again.id)
    assert suppressed.status is TaskStatus.DONE
    assert suppressed.result == {"duplicate": True}
    assert suppressed.lease_token is None
    assert (suppressed.attempts, suppressed.version) == (1, again.version + 2)  # as a claim and its settling
    assert store.events.get(ev.DUPLICATE_DELIVERY_SUPPRESSED) == 1
    assert await states(store, [after]) == [(TaskStatus.PENDING, 0, None)]
    assert (await claim_head(store, "n2")).id == after.id  # ...but it is the key's head now


# --- other keys, unordered queues -----------------------------------------------------------


async def test_other_keys_are_untouched(store) -> None:
    ks = await fill(store, "k", 2)
    others = await fill(store, "o", 3, first=10)
    first = await claim_head(store, "n1")  # k's head (the lowest id)
    head_o = await claim_head(store, "n2")
    assert first.id == ks[0].id
    out = await store.complete_and_claim_next(first)
    assert out.next_task is not None
    assert out.next_task.id == ks[1].id
    assert await states(store, others) == [
        (TaskStatus.RUNNING, 1, "n2"),
        (TaskStatus.PENDING, 0, None),
        (TaskStatus.PENDING, 0, None),
    ]
    assert head_o.id == others[0].id


async def test_the_stored_key_is_continued_not_the_callers_copy(store) -> None:
    ks = await fill(store, "k", 2)
    others = await fill(store, "o", 1, first=10)
    first = await claim_head(store, "n1")
    assert first.id == ks[0].id
    # A copy of the task with another key still matches the compare-and-set (id, token,
    # version): the continuation must follow the key stored with the task.
    edited = dataclasses.replace(first, partition_key="o")
    out = await store.complete_and_claim_next(edited)
    assert out.next_task is not None
    assert (out.next_task.id, out.next_task.partition_key, out.next_task.queue) == (ks[1].id, "k", Q)
    assert await states(store, others) == [(TaskStatus.PENDING, 0, None)]


@pytest.mark.parametrize(
    ("owner", "error"),
    [
        (12, InvalidTypeError),
        ("x" * 256, InvalidArgumentError),
        ("\ud800", InvalidArgumentError),
        (None, InvalidTypeError),
        ("", InvalidArgumentError),
        ("a\x00b", InvalidArgumentError),
    ],
)
async def test_a_bad_lease_owner_raises_and_writes_nothing(store, owner: object, error: type) -> None:
    ks = await fill(store, "k", 2)
    first = await claim_head(store, "n1")
    with pytest.raises(error, match="lease_owner"):
        await store.complete_and_claim_next(dataclasses.replace(first, lease_owner=owner))
    assert await states(store, ks) == [(TaskStatus.RUNNING, 1, "n1"), (TaskStatus.PENDING, 0, None)]


async def test_a_fencing_token_past_int64_raises_and_writes_nothing(store) -> None:
    ks = await fill(store, "k", 2)
    first = await claim_head(store, "n1")
    for call in (
        store.complete_and_claim_next(first, fence=("r", 2**63)),
        store.complete(first, fence=("r", 2**63)),
    ):
        with pytest.raises(InvalidArgumentError, match="fencing_token"):
            await call
    assert await states(store, ks) == [(TaskStatus.RUNNING, 1, "n1"), (TaskStatus.PENDING, 0, None)]


async def test_the_processed_record_is_the_stored_idempotency_key(store) -> None:
    results = await store.enqueue_many(
        [NewTask(queue=Q, payload=i, partition_key="k", idempotency_key=f"m{i}") for i in range(2)]
    )
    ks = [r.task for r in results]
    first = await claim_head(store, "n1")
    # a copy carrying the next task's key must not mark the next task processed
    out = await store.complete_and_claim_next(dataclasses.replace(first, idempotency_key="m1"))
    assert out.next_task is not None
    assert out.next_task.id == ks[1].id
    assert await store.is_processed(Q, "m0")
    assert not await store.is_processed(Q, "m1")


async def test_an_unordered_queue_continues_with_the_key_head(store) -> None:
    """A queue never claimed in order: the continuation still takes only the key's head."""
    a, b, c, d = await fill(store, "k", 4)
    [ta, tb] = await store.claim(Q, node_id="n1", limit=2)
    assert (ta.id, tb.id) == (a.id, b.id)
    out = await store.complete_and_claim_next(tb)
    assert out.next_task is None  # a, the head, still runs: c must wait for it
    assert await states(store, [c, d]) == [(TaskStatus.PENDING, 0, None)] * 2
    out = await store.complete_and_claim_next(ta)
    assert out.next_task is not None
    assert out.next_task.id == c.id
    # From now on the queue keeps per-key order: an ordered claim does not take d.
    assert await store.claim(Q, node_id="n2", limit=10, ordered=True) == []
    out = await store.complete_and_claim_next(out.next_task)
    assert out.next_task is not None
    assert out.next_task.id == d.id


# --- bad arguments ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lease_s", "error", "shown"),
    [
        (0, InvalidArgumentError, "0"),
        (-1, InvalidArgumentError, "-1"),
        (math.nan, InvalidArgumentError, "nan"),
        (math.inf, InvalidArgumentError, "inf"),
        ("x", InvalidTypeError, "str"),
        (True, InvalidTypeError, "bool"),
    ],
)
async def test_a_bad_lease_s_raises_and_writes_nothing(store, lease_s: object, error: type, shown: str) -> None:
    a, b = await fill(store, "k", 2)
    first = await claim_head(store)
    with pytest.raises(error, match="lease_s") as info:
        await store.complete_and_claim_next(first, lease_s=lease_s)
    assert shown in str(info.value)
    assert await states(store, [a, b]) == [(TaskStatus.RUNNING, 1, "n1"), (TaskStatus.PENDING, 0, None)]
    assert store.events.get(ev.COMMITS) == 0


@pytest.mark.parametrize("bad", [None, "task", 7, {"id": 1}])
async def test_a_bad_task_raises_and_writes_nothing(store, bad: object) -> None:
    a, b = await fill(store, "k", 2)
    await claim_head(store)
    with pytest.raises(InvalidTypeError, match="task must be a Task"):
        await store.complete_and_claim_next(bad)
    assert await states(store, [a, b]) == [(TaskStatus.RUNNING, 1, "n1"), (TaskStatus.PENDING, 0, None)]


async def test_an_unclaimed_task_or_a_bad_fence_raises_and_writes_nothing(store) -> None:
    a, b = await fill(store, "k", 2)
    with pytest.raises(InvalidArgumentError, match="claim it first"):
        await store.complete_and_claim_next(a)
    first = await claim_head(store)
    with pytest.raises((InvalidTypeError, InvalidArgumentError), match="fenc"):
        await store.complete_and_claim_next(first, fence=("acct", "7"))
    with pytest.raises(InvalidTypeError):
        await store.complete_and_claim_next(first, {"bad": object()})
    assert await states(store, [a, b]) == [(TaskStatus.RUNNING, 1, "n1"), (TaskStatus.PENDING, 0, None)]
    assert store.events.get(ev.COMMITS) == 0


# --- concurrency ------------------------------------------------------------------------------


async def test_a_racing_ordered_claim_never_takes_the_continued_key(backend: str, make_store) -> None:
    """Another node claims in order while the owner continues a key: the key stays the owner's."""
    store = await make_store(clock=None)
    other = store if backend == "memory" else await make_store(clock=None)
    chain = await fill(store, "k", 30)
    await fill(store, "o", 30, first=1000)
    task: Task | None = await claim_head(store, "owner", partitions=[chain[0].partition])
    assert task is not None
    assert task.id == chain[0].id
    stolen: list[Task] = []
    finished = asyncio.Event()

    async def rival() -> None:
        while not finished.is_set():
            got = await other.claim(Q, node_id="rival", limit=5, ordered=True, lease_s=30)
            stolen.extend(t for t in got if t.partition_key == "k")
            for t in got:
                if t.partition_key != "k":
                    await other.complete(t)
            await asyncio.sleep(0)

    racer = asyncio.create_task(rival())
    seen = []
    try:
        while task is not None:
            seen.append(task.payload)
            await asyncio.sleep(0)
            out = await store.complete_and_claim_next(task, lease_s=30)
            task = out.next_task
    finally:
        finished.set()
        await racer
    assert stolen == []
    assert seen == list(range(30))
    assert [(await store.get(t.id)).status for t in chain] == [TaskStatus.DONE] * 30


@pytest.mark.parametrize("stores", ["one store", "two stores"])
async def test_two_owners_continuing_one_key_share_it_in_order(backend: str, make_store, stores: str) -> None:
    """Two owners hold tasks of one key (unordered claims) and continue concurrently: the
    key's next task is leased once, to whichever commit made it the head. Through one store
    both commits may share a batch (PostgreSQL's group commit)."""
    store = await make_store(clock=None)
    other = store if backend == "memory" or stores == "one store" else await make_store(clock=None)
    a, b, c = await fill(store, "k", 3)
    [ta] = await store.claim(Q, node_id="n1", limit=1)
    [tb] = await other.claim(Q, node_id="n2", limit=1)
    assert (ta.id, tb.id) == (a.id, b.id)
    out_a, out_b = await asyncio.gather(store.complete_and_claim_next(ta), other.complete_and_claim_next(tb))
    leased = [o.next_task for o in (out_a, out_b) if o.next_task is not None]
    assert [t.id for t in leased] == [c.id]  # c is leased exactly once, never twice
    stored = await store.get(c.id)
    assert stored.status is TaskStatus.RUNNING
    assert stored.lease_token == leased[0].lease_token


async def test_concurrent_continuations_each_get_their_own_outcome(store) -> None:
    """Calls made together (a process's nodes finishing their sends at once; SQLite joins
    them into one operation) settle each on its own: a continuation, a key with nothing
    next, a fence refused, a stale copy, and two owners continuing on different keys."""
    a = await fill(store, "a", 2)
    b = await fill(store, "b", 1, first=10)
    c = await fill(store, "c", 2, first=20)
    d = await fill(store, "d", 2, first=30)
    e = await fill(store, "e", 2, first=40)
    heads = {t.partition_key: t for t in await store.claim(Q, node_id="n1", limit=5, ordered=True)}
    assert sorted(heads) == ["a", "b", "c", "d", "e"]
    await store.fence("acct", 7)
    stale = dataclasses.replace(heads["d"], version=heads["d"].version + 5)
    outcomes = await asyncio.gather(
        store.complete_and_claim_next(heads["a"]),
        store.complete_and_claim_next(heads["b"]),
        store.complete_and_claim_next(heads["c"], fence=("acct", 6)),
        store.complete_and_claim_next(stale),
        store.complete_and_claim_next(heads["e"], lease_s=12.0),
        return_exceptions=True,
    )
    out_a, out_b, out_c, out_d, out_e = outcomes
    assert isinstance(out_a, Continuation)
    assert out_a.next_task is not None
    assert (out_a.done.id, out_a.next_task.id, out_a.next_task.lease_owner) == (a[0].id, a[1].id, "n1")
    assert isinstance(out_b, Continuation)
    assert (out_b.done.id, out_b.next_task) == (b[0].id, None)
    assert isinstance(out_c, FencingTokenRejectedError)
    assert out_c.highest == 7
    assert isinstance(out_d, LeaseLostError)
    assert out_d.task_id == d[0].id
    assert isinstance(out_e, Continuation)
    assert out_e.next_task is not None
    assert out_e.next_task.id == e[1].id
    assert out_e.next_task.lease_expires_at == pytest.approx(out_e.done.updated_at + 12.0, abs=0.5)
    assert await states(store, [a[1], c[0], c[1], d[0], d[1], e[1]]) == [
        (TaskStatus.RUNNING, 1, "n1"),
        (TaskStatus.RUNNING, 1, "n1"),  # refused: still held, nothing after it leased
        (TaskStatus.PENDING, 0, None),
        (TaskStatus.RUNNING, 1, "n1"),  # the stale copy changed nothing
        (TaskStatus.PENDING, 0, None),
        (TaskStatus.RUNNING, 1, "n1"),
    ]
    assert (store.events.get(ev.COMMITS), store.events.get(ev.CLAIMS)) == (3, 5 + 2)
    assert store.events.get(ev.FENCING_REJECTED) == 1
    assert store.events.get(ev.STALE_COMMIT_REJECTED) == 1


async def test_sqlite_joins_the_continuations_of_one_loop_turn_into_one_operation(tmp_path: Path) -> None:
    """Eight continuations called together are one operation of the writer, not eight; a caller
    cancelled before its loop turn ends is left out of it (nothing is written for it)."""
    async with SQLiteStore(tmp_path / "turn.db") as store:
        for k in range(9):
            await fill(store, f"k{k}", 2, first=10 * k)
        heads = sorted(await store.claim(Q, node_id="n1", limit=9, ordered=True), key=lambda t: t.id)
        assert len(heads) == 9
        writer = store._writer
        operations = 0
        enqueue = writer.enqueue

        def counted(fn, undo=None):
            nonlocal operations
            operations += 1
            return enqueue(fn, undo)

        writer.enqueue = counted
        left_out = asyncio.create_task(store.complete_and_claim_next(heads[8]))
        calls = [asyncio.create_task(store.complete_and_claim_next(t)) for t in heads[:8]]
        await asyncio.sleep(0)  # every call has joined this turn's batch
        left_out.cancel()
        outcomes = await asyncio.gather(*calls)
        with pytest.raises(asyncio.CancelledError):
            await left_out
        assert operations == 1
        assert [o.done.id for o in outcomes] == [t.id for t in heads[:8]]
        assert all(o.next_task is not None and o.next_task.partition_key == o.done.partition_key for o in outcomes)
        kept = await store.get(heads[8].id)
        assert (kept.status, kept.version, kept.lease_token) == (TaskStatus.RUNNING, 1, heads[8].lease_token)


@contextlib.asynccontextmanager
async def writes_held(backend: str, store, db_path: Path) -> AsyncIterator[None]:
    """Keep the store's next write of key ``k`` waiting (in flight) until the block exits."""
    if backend == "sqlite":
        raw = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
        raw.execute("BEGIN IMMEDIATE")
        raw.execute("CREATE TABLE IF NOT EXISTS other_app (x)")  # someone else's write, in flight
        try:
            yield
        finally:
            raw.execute("COMMIT")
            raw.close()
        return
    import asyncpg
    from services import PG_DSN

    conn = await asyncpg.connect(PG_DSN, server_settings={"search_path": f'"{store.schema}"'})
    try:
        async with conn.transaction():  # the key's row lock: the commit batch waits for it
            await conn.execute("SELECT 1 FROM coord_task_keys WHERE queue = $1 AND partition_key = 'k' FOR UPDATE", Q)
            yield
    finally:
        await conn.close()


async def assert_committed_and_handed_back(store, done: Task, leased: Task) -> None:
    """``done`` is committed, and ``leased`` (leased by that commit) is pending again, its attempt not counted."""
    for _ in range(500):  # the hand-back runs in the background
        if (await store.get(leased.id)).version == 2:
            break
        await asyncio.sleep(0.01)
    assert (await store.get(done.id)).status is TaskStatus.DONE
    nxt = await store.get(leased.id)
    assert (nxt.status, nxt.version, nxt.attempts, nxt.lease_token) == (TaskStatus.PENDING, 2, 0, None)


# Not on the memory store: it commits and leases without yielding, nothing is ever in flight.
@pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
async def test_a_cancelled_caller_hands_the_next_task_back(backend: str, store, db_path: Path) -> None:
    """The caller is cancelled while its commit is in flight: the commit goes on, the next
    task it leased is handed back (pending, the attempt not counted), not left leased."""
    a, b = await fill(store, "k", 2)
    first = await claim_head(store)
    async with writes_held(backend, store, db_path):
        call = asyncio.create_task(store.complete_and_claim_next(first))
        await asyncio.sleep(0.2)  # the write is at the database, waiting
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    await assert_committed_and_handed_back(store, a, b)
    again = await claim_head(store, "n2")
    assert again.id == b.id


@pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
async def test_a_caller_cancelled_as_its_outcome_arrives_hands_the_next_task_back(backend: str, store) -> None:
    """The batch's outcome reaches the caller's future just as the caller is cancelled (the
    cancellation is already queued when the result is set): the commit stands and the next
    task it leased is handed back, as when the caller is cancelled while waiting."""
    a, b = await fill(store, "k", 2)
    first = await claim_head(store)
    loop = asyncio.get_running_loop()
    call: asyncio.Task[Continuation] | None = None
    if backend == "sqlite":
        start = store._start_continuations

        def start_then_cancel(items):  # the cancel is queued before the outcomes are delivered
            running = start(items)
            running.add_done_callback(lambda _: loop.call_soon(call.cancel))
            return running

        store._start_continuations = start_then_cancel
    else:
        run = store._committer._run

        async def run_then_cancel(items):  # the cancel is queued before the results are set
            outcomes = await run(items)
            assert call is not None
            loop.call_soon(call.cancel)
            return outcomes

        store._committer._run = run_then_cancel
    call = asyncio.create_task(store.complete_and_claim_next(first))
    with pytest.raises(asyncio.CancelledError):
        await call
    await assert_committed_and_handed_back(store, a, b)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
async def test_a_caller_cancelled_while_its_commit_runs_then_close_hands_the_next_task_back(
    backend: str, store
) -> None:
    """The caller is cancelled while its commit and continuation run, and ``close()`` comes at
    once: the close waits for the commit's outcome and for the hand-back of the next task it
    leased, so after the close that task is pending, not leased until its lease lapses."""
    a, b = await fill(store, "k", 2)
    first = await claim_head(store)
    loop = asyncio.get_running_loop()
    call: asyncio.Task[Continuation] | None = None
    if backend == "sqlite":
        start = store._start_continuations

        def start_then_cancel(items):  # the operation is queued: its caller is cancelled
            running = start(items)
            assert call is not None
            loop.call_soon(call.cancel)
            return running

        store._start_continuations = start_then_cancel
    else:
        run = store._committer._run

        async def run_then_cancel(items):  # the batch is at the server: its caller is cancelled
            assert call is not None
            loop.call_soon(call.cancel)
            return await run(items)

        store._committer._run = run_then_cancel
    call = asyncio.create_task(store.complete_and_claim_next(first, lease_s=600))
    with pytest.raises(asyncio.CancelledError):
        await call
    await store.close()
    await store.open()
    assert (await store.get(a.id)).status is TaskStatus.DONE
    nxt = await store.get(b.id)
    assert (nxt.status, nxt.version, nxt.attempts, nxt.lease_token) == (TaskStatus.PENDING, 2, 0, None)


# Not on the memory store: it wakes on every commit (it keeps no record of the queues claimed in order).
@pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
async def test_a_commit_wakes_idle_nodes_only_when_it_unblocks_a_key(backend: str, store) -> None:
    """A commit in a queue claimed in order makes the key's next task claimable: armed nodes
    are flagged. In a queue claimed only without order a commit makes nothing claimable:
    nobody is woken (a woken node would claim for nothing)."""
    wake = store.notifier.subscribe(Q)
    await fill(store, "k", 2)
    first = await claim_head(store)
    wake.arm()
    await store.complete(first)
    # The key's next task is its head now. PostgreSQL's listener delivers the commit's own
    # notification, a moment after the commit: waited for.
    assert await wake.wait(5.0)

    other = "plain"
    wake_other = store.notifier.subscribe(other)
    await store.enqueue_many([NewTask(queue=other, payload=i, partition_key="k") for i in range(2)])
    (task,) = await store.claim(other, node_id="n1", limit=1, ordered=False)
    wake_other.arm()
    await store.complete(task)
    assert not await wake_other.wait(0.3)  # neither kept since arm() nor delivered after
    wake.close()
    wake_other.close()


async def test_the_fences_of_one_call_are_checked_against_the_tokens_recorded_before_it(store) -> None:
    """Every store checks a ``complete_many``'s fences as if its commits landed at once: against
    the tokens recorded before the call, recording the highest of those that went through."""
    await store.fence("acct", 5)
    for i in range(4):
        await store.enqueue("q", i)
    tasks = await store.claim("q", node_id="n1", limit=4, lease_s=30.0)
    out = await store.complete_many(tasks, fences=[("acct", 7), ("acct", 6), ("acct", 1), ("other", 2)])
    assert [type(o) for o in out] == [Task, Task, FencingTokenRejectedError, Task]
    assert "token 1 for resource 'acct' is lower than 5" in str(out[2])  # the token recorded before the call
    refused = out[2]
    assert isinstance(refused, FencingTokenRejectedError)
    assert (refused.resource, refused.fencing_token, refused.highest) == ("acct", 1, 5)
    assert (await store.read_fence("acct")).fencing_token == 7
    assert (await store.read_fence("other")).fencing_token == 2
    assert store.events.get(ev.FENCING_REJECTED) == 1


async def test_sqlite_heads_stay_the_earliest_active_task_of_each_key_through_continuations(tmp_path: Path) -> None:
    """The commit that continues marks the task it leases as its key's head in the leasing
    statement (no separate promotion): the stored head flags are still exactly each key's
    earliest active task, whether the next task was leased, not yet due, or a duplicate."""
    async with SQLiteStore(tmp_path / "heads.db") as store:
        leased = await fill(store, "leased", 3)
        later = (await store.enqueue(Q, "now", partition_key="later")).task
        await store.enqueue(Q, "in an hour", partition_key="later", delay_s=3600.0)
        dup = (await store.enqueue(Q, "d0", partition_key="dup", idempotency_key="m0")).task
        await store.enqueue(Q, "d1", partition_key="dup", idempotency_key="m1")
        await store.enqueue(Q, "d2", partition_key="dup")
        heads = {t.partition_key: t for t in await store.claim(Q, node_id="n1", limit=10, ordered=True)}
        assert {k: t.id for k, t in heads.items()} == {"leased": leased[0].id, "later": later.id, "dup": dup.id}
        out = await store.complete_and_claim_next(heads["leased"])
        assert out.next_task is not None
        assert out.next_task.id == leased[1].id
        assert (await store.complete_and_claim_next(heads["later"])).next_task is None  # not due for an hour
        # m1 was processed already (another process): the continuation settles it as a duplicate,
        # leases nothing, and the key's next task becomes its head.
        with contextlib.closing(sqlite3.connect(tmp_path / "heads.db", timeout=10.0)) as other:
            other.execute("INSERT INTO coord_processed (consumer, message_id, processed_at) VALUES (?, 'm1', 0)", (Q,))
            other.commit()
        assert (await store.complete_and_claim_next(heads["dup"])).next_task is None
    with contextlib.closing(sqlite3.connect(tmp_path / "heads.db")) as db:
        flagged = sorted(r[0] for r in db.execute("SELECT id FROM coord_tasks WHERE is_head = 1"))
        earliest = sorted(
            r[0] for r in db.execute("SELECT min(id) FROM coord_tasks WHERE active = 1 GROUP BY queue, partition_key")
        )
    assert flagged == earliest
    assert len(flagged) == 3  # leased[1] (running), the delayed task of "later", and d2 of "dup"
