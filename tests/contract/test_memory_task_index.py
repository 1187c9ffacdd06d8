"""The memory store's per-queue task ids: a claim or a count never walks the done tasks.

Beside its table of tasks by id, :class:`~asynccoord.MemoryStore` keeps each queue's ids of
pending, running and dead tasks and its count of done ones. These tests make the table unwalkable
to show no read goes through the done tasks, and check the kept ids and counts against a recount
of the table after random work. That every store counts alike is ``test_task_counts.py``'s.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from support import FakeClock

from asynccoord import MemoryStore, NewTask, Task, TaskStatus

Q = "jobs"


def by_value(counts: Any) -> dict[str, int]:
    return {str(status): n for status, n in counts.items()}


class _NoWalk(dict[int, Task]):
    """A task table that refuses to be walked: a read of it must go by id."""

    def values(self) -> Any:
        raise AssertionError("the done tasks were walked (values())")

    def items(self) -> Any:
        raise AssertionError("the done tasks were walked (items())")

    def __iter__(self) -> Any:
        raise AssertionError("the done tasks were walked (iter())")


class _CountedReads(dict[int, Task]):
    """A task table that counts its reads by id."""

    reads = 0

    def __getitem__(self, key: int) -> Task:
        self.reads += 1
        return super().__getitem__(key)


async def test_memory_is_drained_stops_at_the_first_unfinished_task(clock: FakeClock) -> None:
    """is_drained read every pending, running and dead task of the queue, and sorted their ids, to
    find one pending: a poll of a deep backlog cost it all (2.5 ms at 50,000 pending, against
    0.01 ms when it walked the table and stopped at the first). It reads one task now."""
    async with MemoryStore(clock=clock) as store:
        await store.enqueue_many([NewTask(queue=Q, payload=i) for i in range(1000)])
        table = _CountedReads(store._tasks)
        store._tasks = table
        assert not await store.is_drained(Q)
        assert table.reads == 1


async def test_memory_a_done_task_a_naive_claim_takes_again_keeps_the_ids_in_order(clock: FakeClock) -> None:
    """The one way back from done: a naive claim (benchmarks) leases a task it read as pending that a
    naive complete marked done in its gap. Its id goes back in order, and an ordered claim still
    sees the key's earliest task as its head."""
    async with MemoryStore(clock=clock) as store:
        first, second = [r.task for r in await store.enqueue_many([NewTask(queue=Q, payload=i) for i in range(2)])]
        (leased,) = await store.claim(Q, node_id="n", limit=1)
        await store.release(leased)
        naive = asyncio.create_task(store.unchecked_claim(Q, node_id="x", limit=1))
        done = asyncio.create_task(store.unchecked_complete([leased]))
        (taken,) = await naive
        assert await done == 1
        assert taken.id == first.id
        assert taken.status is TaskStatus.RUNNING
        assert list(store._undone[Q]) == [first.id, second.id]
        assert by_value((await store.stats(Q)).counts) == {"pending": 1, "running": 1, "done": 0, "dead": 0}
        clock.advance(60.0)  # the naive lease lapses: the key's head is the earliest task again
        (head,) = await store.claim(Q, node_id="n", limit=1, ordered=True)
        assert head.id == first.id


async def test_memory_claims_and_counts_never_walk_the_done_tasks(clock: FakeClock) -> None:
    """A claim read every task of the table: a loop of enqueue, claim and complete slowed with the
    done tasks it left (20,000 rounds took 32 s, quadratic). With the table unwalkable, every
    queue read still answers, by the ids of the queue's unfinished and dead tasks only."""
    async with MemoryStore(clock=clock) as store:
        await store.enqueue_many([NewTask(queue=Q, payload=i, partition_key=f"k{i % 3}") for i in range(300)])
        await store.complete_many(await store.claim(Q, node_id="n", limit=297))
        await store.enqueue(Q, "dead", max_attempts=1)
        store._tasks = _NoWalk(store._tasks)
        (ordered,) = await store.claim(Q, node_id="n", limit=1, ordered=True)
        assert ordered.payload == 297
        nxt = await store.complete_and_claim_next(ordered)
        assert nxt.next_task is None  # key k0 has nothing more
        rest = await store.claim(Q, node_id="n", limit=10)
        assert [t.payload for t in rest] == [298, 299, "dead"]
        await store.fail(rest[2], "refused")
        await store.complete_many(rest[:2])
        assert await store.is_drained(Q)
        assert [t.payload for t in await store.dead_letters(Q)] == ["dead"]
        assert by_value((await store.stats(Q)).counts) == {"pending": 0, "running": 0, "done": 300, "dead": 1}
        assert by_value((await store.stats()).counts) == {"pending": 0, "running": 0, "done": 300, "dead": 1}
        [backlog] = await store.queue_backlogs([Q])
        assert (backlog.pending, backlog.running, backlog.dead) == (0, 0, 1)
        [depth] = await store.queue_depths()
        assert dict(depth.counts) == {"pending": 0, "running": 0, "done": 300, "dead": 1}
        assert await store.requeue_dead(Q) == 1
        (again,) = await store.claim(Q, node_id="n", limit=5)
        await store.fail(again, "refused again")
        assert await store.discard_dead(Q) == 1


async def test_memory_counts_match_a_recount_of_the_table_after_random_work(
    clock: FakeClock,
) -> None:
    """The per-queue ids and done counts the memory store keeps beside its table, checked against a
    recount of the table after each of 400 random steps (every transition, purges and discards)."""
    rng = random.Random(20261207)
    queues = ("a", "b")
    async with MemoryStore(clock=clock) as store:
        held: list[Task] = []
        for _step in range(400):
            queue = rng.choice(queues)
            action = rng.randrange(9)
            if action <= 1:
                await store.enqueue_many(
                    [NewTask(queue=queue, payload=0, max_attempts=rng.randint(1, 2)) for _ in range(rng.randint(1, 4))]
                )
            elif action == 2:
                held += await store.claim(queue, node_id="n", limit=rng.randint(1, 3), ordered=rng.random() < 0.3)
            elif action == 3 and held:
                await store.complete_many([held.pop(rng.randrange(len(held)))])
            elif action == 4 and held:
                await store.fail(held.pop(rng.randrange(len(held))), "x")
            elif action == 5 and held:
                await store.release(held.pop(rng.randrange(len(held))))
            elif action == 6:
                await (store.requeue_dead if rng.random() < 0.5 else store.discard_dead)(queue)
            elif action == 7:
                await store.purge_finished(queue, older_than_s=rng.choice((0.0, 5.0)))
            else:
                clock.advance(rng.choice((1.0, 10.0, 40.0)))  # leases lapse: claims reclaim or dead-letter
                live = {
                    i: t for i, t in dict.items(store._tasks) if t.lease_expires_at and t.lease_expires_at > clock()
                }
                held = [t for t in held if t.id in live and live[t.id].lease_token == t.lease_token]
            tasks = list(dict.items(store._tasks))
            for q in queues:
                recount = {s: sum(1 for _, t in tasks if t.queue == q and t.status is s) for s in TaskStatus}
                assert (await store.stats(q)).counts == recount
                assert list(store._undone.get(q, {})) == sorted(  # in id order: claims read them so
                    i for i, t in tasks if t.queue == q and t.status is not TaskStatus.DONE
                )
