"""A task in flight on a node: an explicit state machine from its claim to its settle.

A :class:`Flight` holds a task from the claim (or the commit before it, ``claim_next``)
that leases it until it is committed, failed or handed back, in exactly one
:class:`FlightState`, moved only along the table :data:`TRANSITIONS`; it also keeps the
lease's local deadline on the monotonic clock (:func:`lease_deadline`).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..contract.locks import Lease
from ..models import Task

if TYPE_CHECKING:
    from .tracing import DeliveryTrace

__all__ = ("RENEWABLE", "TRANSITIONS", "Flight", "FlightState", "InFlight", "lease_deadline")


class FlightState(enum.Enum):
    """Where a task in flight is (see :data:`TRANSITIONS` for the moves allowed)."""

    CLAIMED = "claimed"
    """Leased to the node; its send has not begun (it may wait for its lock)."""
    SENDING = "sending"
    """The user's send runs (``Flight.cut_until`` is set once the node has cancelled it)."""
    TIMED_OUT = "timed_out"
    """The send was cut at ``send_timeout_s``; its cleanup time runs. It fails the attempt. A send
    that outlives its cleanup time is still waited for, its lease and lock kept, up to
    ``send_overrun_s`` after the cut (``Flight.overrun_until``); one that returns then is committed."""
    LEASE_LOST = "lease_lost"
    """The task lease was lost (not renewed, or the store says so) before the send was over: cut."""
    LOCK_LOST = "lock_lost"
    """The lock (or permit) was lost before the send was over, the task lease still held: cut."""
    RETURNED = "returned"
    """The send is over by itself (a result, an error, or its timeout): the commit or failure
    record owns the lease now."""
    DROPPED = "dropped"
    """The send is over after a lost lease: nothing is committed, nothing handed back."""
    UNSENT = "unsent"
    """The lease reached its local deadline before the send began (the store may hand the task
    on from then on): never sent, never committed; the task is handed back at once."""
    LOCK_BUSY = "lock_busy"
    """The task's lock stayed busy past the wait (``lock_wait_s``), or was lost (``LOCK_LOST``),
    before the send began: never sent, never committed, not a failure; the task is handed back,
    due after ``busy_requeue_s``, its attempt not used. Its lease is given up by choice, so a
    renewal that finds it gone meanwhile loses nothing."""
    PAUSED = "paused"
    """The provider's 429 to another send under the task's lock (in this process or another,
    :mod:`asynccoord.pauses`) paused the lock before this send began: never sent, never
    committed; the task is handed back, due when the pause ends, its attempt not used."""
    STOPPED = "stopped"
    """The node stopped claiming (a shutdown) before the send began, while the task waited
    for its lock, say, or hands the task back before its send for another reason (the store or
    the lock store failed, the node was cancelled): never sent, never committed, its attempt not
    used; the task is handed back at once, for another node (or this one's next run) to send.
    Its lease is given up, so a renewal that finds it gone meanwhile loses nothing."""
    LOCK_DROPPED = "lock_dropped"
    """The send is over after a lost lock: the attempt is recorded as failed."""
    INTERRUPTED = "interrupted"
    """The send began but has no outcome: the node was cancelled (or the process is exiting)
    while it ran. The task goes back; its send may have reached the receiver."""
    SETTLED = "settled"
    """Committed or failed: the lease is gone, there is nothing to hand back."""

    allowed: tuple[FlightState, ...]
    """The states this one may move to (set from :data:`TRANSITIONS`)."""


_S = FlightState
TRANSITIONS: dict[FlightState, tuple[FlightState, ...]] = {
    _S.CLAIMED: (_S.SENDING, _S.PAUSED, _S.STOPPED, _S.LOCK_BUSY, _S.LEASE_LOST, _S.LOCK_LOST),
    _S.SENDING: (_S.RETURNED, _S.TIMED_OUT, _S.LEASE_LOST, _S.LOCK_LOST, _S.INTERRUPTED),
    _S.TIMED_OUT: (_S.RETURNED, _S.LEASE_LOST, _S.LOCK_LOST, _S.INTERRUPTED),
    # A lost lock after a lost lease (the send still in its cleanup) is the one recorded:
    # the attempt is then failed, which the store refuses harmlessly if the lease is gone.
    _S.LEASE_LOST: (_S.DROPPED, _S.UNSENT, _S.LOCK_LOST, _S.INTERRUPTED),
    # A lock lost before the send began (during its pace, say): handed back unsent, as a busy lock.
    _S.LOCK_LOST: (_S.LOCK_DROPPED, _S.LOCK_BUSY, _S.LOCK_LOST, _S.INTERRUPTED),
    _S.RETURNED: (_S.SETTLED,),
    _S.LOCK_DROPPED: (_S.SETTLED,),
    _S.DROPPED: (),
    _S.UNSENT: (),
    _S.LOCK_BUSY: (),
    _S.PAUSED: (),
    _S.STOPPED: (),
    _S.INTERRUPTED: (),
    _S.SETTLED: (),
}
"""The moves allowed: from each state, the states it may go to."""

for _state, _next in TRANSITIONS.items():
    _state.allowed = _next  # a tuple on the member: `in` compares by identity, no hashing per move
del _state, _next

RENEWABLE = (_S.CLAIMED, _S.SENDING, _S.TIMED_OUT)
"""States whose lease the keeper renews: claimed and not lost, the send not over."""


def lease_deadline(started: float, lease_s: float) -> float:
    """Local monotonic deadline of a lease of ``lease_s`` seconds granted after ``started`` (``time.monotonic()``).

    A safety margin (a fifth of the lease, at most 2 s) before the store could hand the
    task to another node.
    """
    return started + lease_s - min(lease_s * 0.2, 2.0)


@dataclass(slots=True, eq=False)
class Flight:
    """One task in flight on a node.

    A node takes a task in flight when its claim (or the commit before it, ``claim_next``)
    leases it, and lets go once the task is committed, failed or handed back. Between the two
    the task is in exactly one :class:`FlightState`; :meth:`Flight.move` is the one place that
    changes it, and refuses a transition the table :data:`TRANSITIONS` does not allow with a
    ``RuntimeError`` (a bug in the node, never a user's error). Who may move a flight:

    * the slot handling the task (:mod:`asynccoord.node.send`, :mod:`asynccoord.node.settle`):
      ``CLAIMED -> SENDING -> RETURNED -> SETTLED``, or ``INTERRUPTED`` when the node is
      cancelled (or the process exits) while the send runs;
    * the send's timeout timer: ``SENDING -> TIMED_OUT``;
    * the keeper (:mod:`asynccoord.node.keeper`), when a lease is not renewed: ``-> LEASE_LOST``;
    * the slot, when the lease's local deadline passes before the send begins (while the task
      waits for its lock, say): ``CLAIMED -> LEASE_LOST -> UNSENT``; when its lock stayed busy
      past the wait: ``CLAIMED -> LOCK_BUSY``; when a 429 paused the task's lock meanwhile:
      ``CLAIMED -> PAUSED``; or when the node stopped claiming meanwhile, or hands the task back
      unsent for another reason (:meth:`~asynccoord.node.settle.Settler.hand_back_all_shielded`):
      ``CLAIMED -> STOPPED``;
    * the lock's watchdog, when the lock or permit is lost: ``-> LOCK_LOST``.

    A lost lease or lock before the send is over cuts the send, and the send's end then moves
    the flight on to ``DROPPED`` (never committed) or ``LOCK_DROPPED`` (the attempt is recorded
    as failed); a lease that ran out locally before the send began ends in ``UNSENT`` (the task
    goes back at once, never sent), and a lock lost before the send began in ``LOCK_BUSY`` (the
    task goes back after ``busy_requeue_s``, never sent, its attempt not used). Each flight also
    keeps its lease's local deadline on the monotonic clock (:func:`lease_deadline`), which the
    keeper moves on at every renewal.

    Attributes:
        task: The task, as the store leased it.
        lease_deadline: Local monotonic deadline of its lease (see :func:`lease_deadline`).
        state: Where it is (:class:`FlightState`); changed by :meth:`move` only.
        lock: The lock lease (or permit) held for it, or None.
        lost: Why its lease or lock was lost (for the logs and ``last_error``), or None.
        cut_until: Loop time at which the cleanup time of a send the node cancelled ends
            (see :func:`asynccoord.node.send.cut`), or None while nothing cut it.
        overrun_until: Loop time up to which the node still waits for a send cut at its
            timeout that outlived its cleanup time, its lease and lock kept (see
            :func:`asynccoord.node.send.cut`); None unless such a send is (or was) waited for.
        send: The user's send, in an asyncio task of its own, while it runs; kept once the flight is
            ``INTERRUPTED`` while that task still runs (see :meth:`outlives`).
        over: Done when the send is, or when the node stops waiting for it (its cleanup time,
            or for a send cut at its timeout ``overrun_until``, ran out).
        next: The key's next task, leased by this task's commit (``claim_next``).
        chain: Tasks its slot took by ``claim_next`` before this one.
        turn_end: Ends the send's turn on its pooled lock (:meth:`~asynccoord.locks.pool.Turn.end`),
            called as the send ends so that the lock's next local turn begins at once; None
            without one, and once called.
        trace: The trace of its delivery (:mod:`asynccoord.node.tracing`), or None when not traced.
        abandoned: Its send was let go still running (``send_abandoned``): cut at its timeout and
            past ``send_overrun_s``, or cut by a lost lease or lock and past its cleanup time. It goes
            on unwatched under the task's lock and its fencing token, so the lock's next sends take a
            new lease, with a higher token.
    """

    task: Task
    lease_deadline: float
    state: FlightState = FlightState.CLAIMED
    lock: Lease | None = None
    lost: str | None = None
    cut_until: float | None = None
    overrun_until: float | None = None
    send: asyncio.Task[Any] | None = None
    over: asyncio.Future[None] | None = None
    next: Flight | None = None
    chain: int = 0
    turn_end: Callable[[], None] | None = None
    trace: DeliveryTrace | None = None
    abandoned: bool = False

    def move(self, to: FlightState) -> None:
        """Move to state ``to``.

        Raises:
            RuntimeError: :data:`TRANSITIONS` does not allow it (a bug in the node).
        """
        if to not in self.state.allowed:
            raise RuntimeError(
                f"internal error: task {self.task.id} in flight cannot move from {self.state.name} to {to.name}"
            )
        self.state = to

    def outlives(self) -> bool:
        """Whether its send still runs although the node let go of it: cut by the node's stop (a shutdown),
        it ignored its cancellations past its cleanup time (``INTERRUPTED``, ``send`` kept and not done).

        Such a task is not handed back, nor its lock released: both lapse at their TTLs (see
        :meth:`~asynccoord.node.settle.Settler.hand_back_all_shielded`).
        """
        child = self.send
        return self.state is FlightState.INTERRUPTED and child is not None and not child.done()

    def is_in(self, *states: FlightState) -> bool:
        """Whether the flight is in one of ``states`` (a call: a type checker does not narrow it across awaits)."""
        return self.state in states


class InFlight(dict[int, Flight]):
    """A node's tasks in flight, by task id, each with its one current :class:`Flight`.

    The store may hand a task out again while a flight of it still runs on the node (its lease
    lapsed by the store's clock, e.g. an NTP step forward of SQLite's wall clock, and the node
    claimed it anew). The new flight replaces the old one, which is lost at once
    (``on_displaced`` cuts its send: the keeper no longer sees it), and the old one's end takes
    nothing of the new one out.

    Args:
        on_displaced: Called with a flight that a later flight of its task replaced.
    """

    __slots__ = ("_on_displaced",)

    def __init__(self, on_displaced: Callable[[Flight], None]) -> None:
        super().__init__()
        self._on_displaced = on_displaced

    def hold(self, flight: Flight) -> None:
        """Take ``flight`` in flight; a flight of its task held still is displaced (see the class)."""
        held = self.get(flight.task.id)
        if held is not None and held is not flight:
            self._on_displaced(held)
        self[flight.task.id] = flight

    def forget(self, flight: Flight) -> None:
        """Take ``flight`` out of flight, unless a later flight of its task replaced it."""
        if self.get(flight.task.id) is flight:
            del self[flight.task.id]
