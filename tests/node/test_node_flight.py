"""A task in flight (asynccoord.node.flight): the states, the moves allowed, and the refusal of any other."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from asynccoord import MemoryStore, NewTask, Task
from asynccoord.node.flight import RENEWABLE, TRANSITIONS, Flight, FlightState, lease_deadline
from asynccoord.node.keeper import lose
from asynccoord.node.send import cut, lease_ran_out, lock_lost

S = FlightState


async def leased_task() -> Task:
    """A task as a store leases it (claimed from a memory store)."""
    async with MemoryStore() as store:
        await store.enqueue_many([NewTask(queue="q", payload=1)])
        (task,) = await store.claim("q", node_id="n", limit=1, lease_s=30.0)
    return task


def flight_in(task: Task, *path: FlightState) -> Flight:
    flight = Flight(task=task, lease_deadline=0.0)
    for state in path:
        flight.move(state)
    return flight


def test_every_state_has_its_moves_and_the_ends_have_none() -> None:
    assert set(TRANSITIONS) == set(FlightState)
    assert {s for s, moves in TRANSITIONS.items() if not moves} == {
        S.DROPPED,
        S.UNSENT,
        S.LOCK_BUSY,
        S.PAUSED,
        S.STOPPED,
        S.INTERRUPTED,
        S.SETTLED,
    }
    for state, moves in TRANSITIONS.items():
        assert state.allowed == moves
    assert set(RENEWABLE) == {S.CLAIMED, S.SENDING, S.TIMED_OUT}


async def test_each_move_the_table_allows_is_made_and_every_other_is_refused() -> None:
    task = await leased_task()
    paths = {  # a way to reach each state from CLAIMED
        S.CLAIMED: (),
        S.SENDING: (S.SENDING,),
        S.TIMED_OUT: (S.SENDING, S.TIMED_OUT),
        S.LEASE_LOST: (S.LEASE_LOST,),
        S.LOCK_LOST: (S.LOCK_LOST,),
        S.RETURNED: (S.SENDING, S.RETURNED),
        S.DROPPED: (S.LEASE_LOST, S.DROPPED),
        S.UNSENT: (S.LEASE_LOST, S.UNSENT),
        S.PAUSED: (S.PAUSED,),
        S.STOPPED: (S.STOPPED,),
        S.LOCK_BUSY: (S.LOCK_BUSY,),
        S.LOCK_DROPPED: (S.LOCK_LOST, S.LOCK_DROPPED),
        S.INTERRUPTED: (S.SENDING, S.INTERRUPTED),
        S.SETTLED: (S.SENDING, S.RETURNED, S.SETTLED),
    }
    for start, to in itertools.product(FlightState, FlightState):
        flight = flight_in(task, *paths[start])
        assert flight.state is start
        if to in TRANSITIONS[start]:
            flight.move(to)
            assert flight.state is to
        else:
            with pytest.raises(RuntimeError, match=rf"^internal error: task {task.id} in flight cannot move from"):
                flight.move(to)
            assert flight.state is start  # refused: nothing changed


async def test_a_lost_lease_is_counted_once_and_never_after_the_send_is_over() -> None:
    task = await leased_task()
    async with MemoryStore() as store:
        sending = flight_in(task, S.SENDING)
        lose(store, sending, "task lease lost")
        lose(store, sending, "task lease lost")  # the keeper may see it again: no second count
        assert (sending.state, sending.lost) == (S.LEASE_LOST, "task lease lost")
        settled = flight_in(task, S.SENDING, S.RETURNED)
        lose(store, settled, "task lease lost")
        assert (settled.state, settled.lost) == (S.RETURNED, None)  # settling owns the lease: nothing lost
        assert store.events.snapshot().get("lease_lost") == 1


async def test_a_lease_run_out_before_its_send_is_counted_once_and_a_lost_flight_is_left_alone() -> None:
    task = await leased_task()
    async with MemoryStore() as store:
        claimed = flight_in(task)
        lease_ran_out(store, "n", claimed, "before its send")
        lease_ran_out(store, "n", claimed, "before its send")  # found again: no second count
        assert claimed.state is S.LEASE_LOST
        assert claimed.lost == "task lease past its local deadline before its send (no renewal confirmed in time)"
        lost = flight_in(task, S.LOCK_LOST)
        lost.lost = "lock lost: taken over"
        lease_ran_out(store, "n", lost, "while it waited for its lock")
        assert (lost.state, lost.lost) == (S.LOCK_LOST, "lock lost: taken over")
        assert store.events.snapshot().get("lease_lost") == 1


async def test_a_lost_lock_cuts_a_running_send_once_but_not_one_that_ended_by_itself() -> None:
    from asynccoord import LockLostError

    task = await leased_task()
    loop = asyncio.get_running_loop()
    flight = flight_in(task, S.SENDING)
    flight.send = loop.create_task(asyncio.sleep(10))
    flight.over = loop.create_future()
    lock_lost(flight, LockLostError("taken over"))
    assert flight.state is S.LOCK_LOST
    assert flight.lost == "lock lost: taken over"
    assert flight.cut_until is not None
    until = flight.cut_until
    cut(flight)  # a second cut leaves the first one's cleanup time alone
    assert flight.cut_until == until
    await asyncio.sleep(0)
    assert flight.send.cancelled()

    ended = flight_in(task, S.SENDING)
    ended.send = loop.create_task(asyncio.sleep(0))
    await ended.send  # over by itself, the node has not seen it yet
    lock_lost(ended, LockLostError("taken over"))
    assert (ended.state, ended.lost) == (S.SENDING, None)


def test_a_lease_deadline_keeps_a_margin_of_a_fifth_at_most_two_seconds() -> None:
    assert lease_deadline(100.0, 5.0) == pytest.approx(104.0)
    assert lease_deadline(100.0, 30.0) == pytest.approx(128.0)
