"""The task of a :class:`~asynccoord.locks.watchdog.Watchdog`: its steps, its sleeps, its end and its cancellation.

:class:`WatchdogTask` is a mixin of the watchdog. Its task runs only while the watchdog
guards something, and lingers :data:`IDLE_EXIT_S` after the last guard closes. Each step
gives up the leases past their local deadline or their hold-time ceiling, starts a renewal
round when one is due (:mod:`asynccoord.locks.watchdogrenew`), and sleeps until the next
deadline or renewal, woken early when a guard's next event comes in.

A cancellation of the task by anyone but :meth:`~asynccoord.locks.watchdog.Watchdog.aclose`
while holders still hold leases is deferred: ``asyncio.run`` ending a program cancels every
task left in no order, the holders releasing their locks among them. The leases are kept
while releases keep coming (:data:`OUTSIDE_IDLE_S`), for :data:`OUTSIDE_GRACE_S` at most, and
until the store is found closed; the leases left are then given up and the task ends cancelled.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from ..contract.locks import LockStore
from ..errors import UNRECOVERABLE_STORE_ERRORS, LockLostError, MaxHoldExceededError
from .guard import Guard

__all__ = ("IDLE_EXIT_S", "OUTSIDE_GRACE_S", "OUTSIDE_IDLE_S", "WatchdogTask")

IDLE_EXIT_S = 0.2
"""How long the watchdog's task lingers with nothing to guard before it ends, seconds
(so a lock taken and released many times a second does not start a task each time)."""

OUTSIDE_IDLE_S = 1.0
"""After a cancellation of its task by anyone but :meth:`~asynccoord.locks.watchdog.Watchdog.aclose`,
the watchdog gives up the leases it still guards once none was released for this long, seconds
(see :class:`~asynccoord.locks.watchdog.Watchdog`)."""

OUTSIDE_GRACE_S = 5.0
"""After a cancellation of its task by anyone but :meth:`~asynccoord.locks.watchdog.Watchdog.aclose`,
the watchdog gives up the leases it still guards this long after it at the latest, seconds
(see :class:`~asynccoord.locks.watchdog.Watchdog`)."""


class WatchdogTask:
    """The task of a :class:`~asynccoord.locks.watchdog.Watchdog`: what it does at each wake-up, and how it ends.

    A mixin: it relies on the watchdog's guards (``_guards``), its store, ``_lose_all``,
    ``_deadline_error`` and ``_start_renewal``.
    """

    _store: LockStore
    _guards: set[Guard]
    _task: asyncio.Task[None] | None
    _renewal: asyncio.Task[None] | None
    _wake: asyncio.Future[None] | None
    _wake_at: float
    _idle_since: float
    _cut_at: float | None
    _quiet_since: float

    if TYPE_CHECKING:

        def _lose_all(self, losses: list[tuple[Guard, LockLostError]]) -> None: ...

        def _deadline_error(self, g: Guard) -> LockLostError: ...

        def _start_renewal(self, now: float) -> None: ...

    def _poke(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    async def _sleep_until(self, when: float) -> None:
        loop = asyncio.get_running_loop()
        wake: asyncio.Future[None] = loop.create_future()
        self._wake, self._wake_at = wake, when
        handle = loop.call_later(max(0.0, when - time.monotonic()), _resolve, wake)
        try:
            await wake
        finally:
            handle.cancel()
            self._wake, self._wake_at = None, float("inf")

    async def _run(self) -> None:
        self._cut_at = None
        try:
            while True:
                try:
                    if await self._step():
                        break
                except asyncio.CancelledError:
                    now = time.monotonic()
                    give_up_at = self._give_up_at()
                    if not self._guards or (give_up_at is not None and now >= give_up_at):
                        raise
                    # Cancelled from outside (asyncio.run ending the program, say) while holders
                    # still hold leases: keep them until they are released (see the class).
                    current = asyncio.current_task()
                    if current is not None:
                        current.uncancel()
                    self._quiet_since = now
                    if self._cut_at is None:
                        self._cut_at = now + OUTSIDE_GRACE_S
                        if await self._store_closed():
                            raise  # nobody can release those leases any more: give them up now
        except asyncio.CancelledError:
            self._task = None
            self._lose_all(
                [
                    (g, LockLostError(f"the watchdog was cancelled: lock {g._lease.name!r} is no longer renewed"))
                    for g in self._guards
                ]
            )
            raise
        self._task = None
        if self._cut_at is not None:
            raise asyncio.CancelledError  # the deferred cancellation, delivered now

    def _give_up_at(self) -> float | None:
        """When a deferred cancellation gives up the leases still guarded (monotonic); None: none is deferred."""
        if self._cut_at is None:
            return None
        return min(self._cut_at, self._quiet_since + OUTSIDE_IDLE_S)

    async def _store_closed(self) -> bool:
        """Whether the store refuses calls for good (closed, or of another event loop): one clock read."""
        try:
            await self._store.now()
        except UNRECOVERABLE_STORE_ERRORS:
            return True
        except Exception:  # unreachable, busy...: the renewals will tell
            return False
        return False

    async def _step(self) -> bool:
        """Give up the leases past a deadline, renew those due, sleep until the next event; True: end now.

        Raises:
            CancelledError: a deferred cancellation's time (:meth:`_give_up_at`) has come with leases guarded.
        """
        cut_at = self._give_up_at()
        now = time.monotonic()
        if cut_at is not None and now >= cut_at and self._guards:
            raise asyncio.CancelledError
        losses: list[tuple[Guard, LockLostError]] = []
        for g in self._guards:
            if now >= g._deadline:
                losses.append((g, self._deadline_error(g)))
            elif now >= g._hold_deadline:
                lease = g._lease
                error = MaxHoldExceededError(
                    f"lock {lease.name!r} (fencing token {lease.fencing_token}) reached its max_hold_s "
                    "ceiling: the watchdog stopped renewing it and stopped the work it guarded"
                )
                losses.append((g, error))
        self._lose_all(losses)
        if not self._guards:
            if cut_at is not None or now - self._idle_since >= IDLE_EXIT_S:
                return True
            await self._sleep_until(self._idle_since + IDLE_EXIT_S)
            return False
        if self._renewal is None:
            self._start_renewal(now)
        wake_at = float("inf") if cut_at is None else cut_at
        for g in self._guards:
            when = min(g._deadline, g._hold_deadline)
            if g._renew and self._renewal is None:
                when = min(when, g._next_renew_at)
            wake_at = min(wake_at, when)
        await self._sleep_until(wake_at)
        return False


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
