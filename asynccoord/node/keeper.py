"""The keeper: renews the leases of a node's tasks in flight, all of them in one call per interval.

The renewals fall on a grid of the monotonic clock (every ``lease_s / 3``, shifted by this
process's :data:`RENEWAL_PHASE`), so the nodes of a process with the same ``lease_s`` renew at
the same moments whenever each of them started, and the stores run their concurrent calls
as one statement (PostgreSQL) or one transaction (SQLite's group commit): renewals cost
about the same with 16 or 64 nodes. A lease that is not renewed before its local deadline
(monotonic clock, with a safety margin, :func:`~asynccoord.node.flight.lease_deadline`) or
that the store reports lost cuts its send (:func:`lose`), at that deadline. Locks are renewed by the lock
store's watchdog (see :mod:`asynccoord.locks.watchdog`), not here.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Mapping
from typing import Any

import anyio

from .. import events as ev
from .._printable import shown
from ..errors import UNRECOVERABLE_STORE_ERRORS, StoreError
from .flight import RENEWABLE, Flight, FlightState, lease_deadline
from .send import cut

__all__ = ("RENEWAL_PHASE", "Keeper", "lose")

log = logging.getLogger(__name__)

_SENDS_RUN = (FlightState.SENDING, FlightState.TIMED_OUT)
"""States of a flight whose send runs, cut by :meth:`Keeper._watch` at its lease's local deadline."""

RENEWAL_PHASE = random.random()
"""Where this process's renewal grid starts, as a fraction of the interval (see :class:`Keeper`).

The nodes of one process share it and renew together; the processes of one host (one
monotonic clock) each draw their own, so they do not all renew, and contend for one SQLite
file's write lock, at the same moment.
"""


class Keeper:
    """Renews the leases of one node's tasks in flight (see the module docstring).

    Args:
        store: The node's store (``extend_many``, ``events``).
        node_id: The node's id (for the logs).
        lease_s: Lease length, seconds (checked by ``NodeConfig``); renewed every third of it.
        flights: The node's tasks in flight, read at every renewal.
    """

    __slots__ = ("_flights", "_lease_s", "_node_id", "_store")

    def __init__(self, store: Any, *, node_id: str, lease_s: float, flights: Mapping[int, Flight]) -> None:
        self._store = store
        self._node_id = node_id
        self._lease_s = lease_s
        self._flights = flights

    async def run(self) -> None:
        """Renew until cancelled: one ``extend_many`` per point of the grid, for every renewable flight.

        A renewal comes about ``lease_s / 3`` after the one before (later only if the loop
        or the store is late), never twice for one point of the grid. A store error leaves
        the leases as they are. Beside the renewals, a watch loses each flight whose send runs
        at its local deadline, unless a renewal confirmed in time has moved it on, and so cuts
        the send there: the deadline falls between two points of the grid, and the next point
        may come after the store's own expiry (when another node may claim the task and send
        it), or never while a renewal hangs. A flight whose send has not begun is checked
        against its deadline before the send (and its wait for a lock ends there).

        Raises:
            StoreClosedError, StoreLoopError: the store was closed (or serves another loop):
                the node fails.
        """
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._watch, name=f"{self._node_id}-lease-watch")
            await self._renew()
            tg.cancel_scope.cancel()  # not reached: _renew ends only by raising

    async def _renew(self) -> None:
        """The renewals (see :meth:`run`)."""
        lease_s = self._lease_s
        interval_s = lease_s / 3
        offset_s = RENEWAL_PHASE * interval_s
        point = (time.monotonic() - offset_s) // interval_s + 1  # the next point of the grid, in intervals
        while True:
            # Sleep to the point itself, not for what remains of an interval: timers that fire a
            # little early (uvloop rounds them to whole milliseconds) would then renew again at once.
            await anyio.sleep(max(0.0, offset_s + point * interval_s - time.monotonic()))
            point = max(point + 1, (time.monotonic() - offset_s) // interval_s + 1)  # skip points missed
            flights = [f for f in self._flights.values() if f.state in RENEWABLE]
            if not flights:
                continue
            started = time.monotonic()
            try:
                renewed = await self._store.extend_many([f.task for f in flights], lease_s)
            except UNRECOVERABLE_STORE_ERRORS:
                raise  # fails the node (see Node.run)
            except StoreError as exc:
                log.warning("asynccoord.node.renew_failed node=%s error=%s", self._node_id, shown(exc))
                now = time.monotonic()
                for f in flights:
                    if now >= f.lease_deadline:
                        lose(self._store, f, "store unreachable past the lease deadline")
                continue
            for f, ok in zip(flights, renewed, strict=True):
                if ok:  # the store's compare-and-set is the authority: nobody took the task
                    f.lease_deadline = lease_deadline(started, lease_s)
                else:
                    lose(self._store, f, "task lease lost")

    async def _watch(self) -> None:
        """Lose each flight whose send runs at its local deadline (see :meth:`run`), until cancelled.

        Sleeps to the earliest deadline, and at most a renewal interval: a flight taken in
        flight meanwhile has a deadline at least that far away (``lease_s`` less its margin,
        at most a fifth of it).
        """
        interval_s = self._lease_s / 3
        while True:
            now = time.monotonic()
            wake_at = now + interval_s
            for f in list(self._flights.values()):
                if f.state not in _SENDS_RUN:
                    continue
                if now >= f.lease_deadline:
                    lose(self._store, f, "no renewal confirmed by the lease's local deadline")
                elif f.lease_deadline < wake_at:
                    wake_at = f.lease_deadline
            await anyio.sleep(wake_at - now)


def lose(store: Any, flight: Flight, reason: str) -> None:
    """The lease of ``flight`` is lost (``reason``): count it and cut its send, unless it has settled meanwhile.

    A flight that was committed, failed or handed back meanwhile (or whose lease or lock is
    lost already) lost nothing.
    """
    if flight.state not in RENEWABLE:
        return
    flight.lost = reason
    flight.move(FlightState.LEASE_LOST)
    store.events.add(ev.LEASE_LOST)
    cut(flight)
