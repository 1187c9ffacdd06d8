"""One lease in a watchdog's care: its local deadline, its renewals in flight, its end.

A :class:`Guard` is what :meth:`~asynccoord.locks.watchdog.Watchdog.guard` returns. It keeps
the lease's *local deadline* on the monotonic clock: the instant the acquisition or renewal
request was sent, plus the lease's TTL, less a safety margin, so the store cannot have let
the lease lapse before it (M. Kleppmann, "How to do distributed locking", 2016, and
Redlock's validity time). A renewal in flight may land at any moment, so it brings the
deadline in at once; one that landed sets the deadline from when it was sent, bounded by
every write of the lease that may still land after it. The watchdog that keeps the guard
(:mod:`asynccoord.locks.watchdog`) renews it and gives it up; the guard asks it for that
through :class:`Keeper`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Iterator
from typing import Protocol

from ..contract.locks import Lease
from ..errors import LockLostError

__all__ = ("Guard", "Keeper", "OnLost")

OnLost = Callable[[LockLostError], None]


class Keeper(Protocol):
    """What a :class:`Guard` asks of the watchdog that keeps it (:class:`~asynccoord.locks.watchdog.Watchdog`)."""

    def _lose(self, g: Guard, error: LockLostError) -> None: ...

    def _deadline_error(self, g: Guard) -> LockLostError: ...

    def _renewal_sent(self, owner_token: str, ttl_s: float, sent_at: float) -> int: ...

    def _renewal_done(self, owner_token: str, write: int, renewed: Lease | None, sent_at: float) -> None: ...

    def _renewal_unknown(self, owner_token: str, write: int) -> None: ...

    def _forget(self, g: Guard) -> None: ...


class Guard:
    """One lease in a watchdog's care, as returned by :meth:`~asynccoord.locks.watchdog.Watchdog.guard`.

    Closing the guard (:meth:`close`) stops its renewals for good. Attributes that
    change are read through properties: :attr:`lease` is the latest renewed lease,
    :attr:`lost` the error the watchdog gave it up with.
    """

    __slots__ = (
        "_active",
        "_deadline",
        "_hold_deadline",
        "_interval_s",
        "_lease",
        "_lost",
        "_margin_ratio",
        "_next_renew_at",
        "_pending",
        "_recent",
        "_renew",
        "_task",
        "_unresolved_ttl_s",
        "_watchdog",
        "on_lost",
    )

    def __init__(
        self,
        watchdog: Keeper,
        lease: Lease,
        *,
        sent_at: float,
        renew: bool,
        interval_s: float,
        margin_ratio: float,
        hold_deadline: float,
        on_lost: OnLost | None,
        task: asyncio.Task[object] | None,
    ) -> None:
        self._watchdog = watchdog
        self._lease = lease
        self._renew = renew
        self._interval_s = interval_s
        self._margin_ratio = margin_ratio
        self._deadline = sent_at + lease.ttl_s * (1.0 - margin_ratio)
        self._next_renew_at = sent_at + interval_s
        self._hold_deadline = hold_deadline
        # Renewals of this lease in flight (write id -> (sent_at, ttl_s)); those that landed
        # while one of them flew ((reply time, ttl_s)); and the shortest ttl_s of those whose
        # fate is unknown (failed or cancelled: they may still land, at any time).
        self._pending: dict[int, tuple[float, float]] = {}
        self._recent: list[tuple[float, float]] = []
        self._unresolved_ttl_s = math.inf
        self._task = task
        self._active = True
        self._lost: LockLostError | None = None
        self.on_lost = on_lost
        """Called once, with the error, when the watchdog gives the lease up."""

    def __repr__(self) -> str:
        state = "active" if self._active else ("lost" if self._lost is not None else "closed")
        return (
            f"<Guard {self._lease.name!r} fencing_token={self._lease.fencing_token} {state}"
            f" remaining_s={self.remaining_s():.3f} renew={self._renew}>"
        )

    @property
    def lease(self) -> Lease:
        """The lease as last renewed."""
        return self._lease

    @property
    def lost(self) -> LockLostError | None:
        """Why the watchdog gave the lease up; None while it is kept (or after a plain close)."""
        return self._lost

    @property
    def active(self) -> bool:
        """Whether the watchdog still guards (and, if asked to, renews) the lease."""
        return self._active

    def remaining_s(self) -> float:
        """Seconds left before the local deadline (negative once it passed)."""
        return self._deadline - time.monotonic()

    def check(self) -> LockLostError | None:
        """Give the lease up now if its local deadline has passed; return :attr:`lost`.

        The watchdog does this on its own when its task runs; call it where the
        event loop may have been blocked past the deadline (before trusting the lease).
        """
        if self._active and time.monotonic() >= self._deadline:
            self._watchdog._lose(self, self._watchdog._deadline_error(self))
        return self._lost

    def update(self, lease: Lease, *, sent_at: float) -> None:
        """Take a lease renewed outside the watchdog (an explicit renew sent at ``sent_at``).

        Prefer :meth:`renewing`, which also covers the renewal while it is in flight. A
        lease renewed behind the guard's back (``store.renew_lock`` called directly, not
        through :meth:`asynccoord.Lock.renew`) is not known to the guard: its local deadline
        may then outlast the store's expiry.
        """
        if self._active and lease.owner_token == self._lease.owner_token:
            write = self._watchdog._renewal_sent(self._lease.owner_token, lease.ttl_s, sent_at)
            self._watchdog._renewal_done(self._lease.owner_token, write, lease, sent_at)

    @contextlib.contextmanager
    def renewing(self, ttl_s: float, *, sent_at: float) -> Iterator[Callable[[Lease | None], None]]:
        """Cover an explicit renewal of the lease to ``ttl_s`` sent at ``sent_at``, while it flies.

        Use as ``with guard.renewing(ttl, sent_at=t0) as landed: landed(await
        store.renew_lock(lease, ttl))``. On entry the local deadline of every guard of the
        lease comes down to ``sent_at + ttl_s * (1 - margin)`` if that is earlier (the write
        may land at any time from now on); ``landed(renewed)`` with the renewed lease takes
        it (``None``: it had lapsed, nothing landed). Leaving without ``landed`` (an error,
        a cancellation, a timeout) leaves the renewal's fate unknown: from then on no
        deadline of the lease counts on more than ``ttl_s``.
        """
        token = self._lease.owner_token
        write = self._watchdog._renewal_sent(token, ttl_s, sent_at)
        outcome: list[Lease | None] = []
        try:
            yield outcome.append
        finally:
            if outcome:
                self._watchdog._renewal_done(token, write, outcome[0], sent_at)
            else:
                self._watchdog._renewal_unknown(token, write)

    def close(self) -> None:
        """Stop guarding and renewing the lease. Idempotent; never awaits."""
        if self._active:
            self._active = False
            self._watchdog._forget(self)

    def _sent(self, write: int, ttl_s: float, sent_at: float) -> None:
        """A renewal to ``ttl_s`` was sent: it may land at any moment from ``sent_at`` on."""
        self._pending[write] = (sent_at, ttl_s)
        self._deadline = min(self._deadline, sent_at + ttl_s * (1.0 - self._margin_ratio))

    def _landed(self, write: int, ttl_s: float, sent_at: float) -> None:
        """A renewal to ``ttl_s`` sent at ``sent_at`` landed: the store's expiry is what it set
        or what a write landing after it sets. Such a write lands after ``sent_at``: it is one
        still in flight, one of unknown fate, or one whose answer came after ``sent_at``. So
        the expiry is at least ``sent_at`` plus the shortest ``ttl_s`` among this renewal and
        those. The deadline is replaced by that bound (not extended: a renewal to a shorter
        ``ttl_s`` brings the store's expiry closer).

        Source: the local deadline counts from the time the request was sent, as in
        Kleppmann's "How to do distributed locking" (2016) and Redlock's validity time.
        """
        now = time.monotonic()
        self._pending.pop(write, None)
        shortest = min(
            ttl_s,
            self._unresolved_ttl_s,
            *(ttl for _sent, ttl in self._pending.values()),
            *(ttl for answered, ttl in self._recent if answered > sent_at),
        )
        self._deadline = sent_at + shortest * (1.0 - self._margin_ratio)
        self._next_renew_at = sent_at + self._interval_s
        # Kept only while a renewal sent before its answer still flies.
        oldest = min((sent for sent, _ttl in self._pending.values()), default=now)
        self._recent = [(answered, ttl) for answered, ttl in self._recent if answered > oldest]
        if self._pending:
            self._recent.append((now, ttl_s))

    def _unknown(self, write: int) -> None:
        """A renewal failed or was cancelled: it may still land, at any time."""
        flight = self._pending.pop(write, None)
        if flight is not None:
            self._unresolved_ttl_s = min(self._unresolved_ttl_s, flight[1])

    def _on_task_done(self, _task: object) -> None:
        self.close()
