"""The lock watchdog: renews every lease it guards in one statement per interval, and
stops the work of a lease it cannot keep.

A :class:`Watchdog` serves a store (or a node) and judges each lease by a local deadline
on the monotonic clock with a safety margin, after M. Kleppmann's "How to do distributed
locking" (2016) and Redlock's validity time.

The watchdog's parts: this module holds the watchdog, its settings and its guards (taking a
lease into care, explicit renewals, giving leases up); one lease in its care is a
:class:`~asynccoord.locks.guard.Guard` (:mod:`asynccoord.locks.guard`), its renewal rounds
are :mod:`asynccoord.locks.watchdogrenew`, its task and the deferral of an outside
cancellation :mod:`asynccoord.locks.watchdogtask`, and its counters' snapshot
:mod:`asynccoord.locks.watchdogstats`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import weakref

from .. import events as ev
from ..contract.locks import Lease, LockStore, check_lease
from ..errors import (
    InvalidArgumentError,
    InvalidTypeError,
    LockLostError,
    MaxHoldExceededError,
)
from ..validation import (
    check_bool,
    check_finite,
    check_interval_s,
    check_lease_s,
    check_non_negative,
    is_async_callable,
)
from .guard import Guard, OnLost
from .watchdogrenew import MIN_RETRY_S, WatchdogRenewal
from .watchdogstats import WatchdogStats
from .watchdogtask import IDLE_EXIT_S, OUTSIDE_GRACE_S, OUTSIDE_IDLE_S, WatchdogTask

__all__ = (
    "DEFAULT_SAFETY_MARGIN_RATIO",
    "IDLE_EXIT_S",
    "MIN_RETRY_S",
    "OUTSIDE_GRACE_S",
    "OUTSIDE_IDLE_S",
    "Guard",
    "Watchdog",
    "WatchdogStats",
)

log = logging.getLogger(__name__)

DEFAULT_SAFETY_MARGIN_RATIO = 0.1
"""Fraction of a lease's TTL by which the local deadline precedes the store's expiry."""

_REGISTRY: weakref.WeakKeyDictionary[object, Watchdog] = weakref.WeakKeyDictionary()
_GUARDED_IN: weakref.WeakValueDictionary[str, Watchdog] = weakref.WeakValueDictionary()
"""Owner token -> the watchdog guarding that lease (one per lease: see Watchdog.guard)."""


class Watchdog(WatchdogTask, WatchdogRenewal):
    """Renews the leases it guards in batches, and gives up those it cannot keep.

    One :class:`Watchdog` serves a store (or a node): however many leases it guards,
    each renewal round is a single ``renew_locks`` call (one ``UPDATE`` on SQLite), so
    10,000 held locks cost a handful of writes per interval, not 10,000 round trips.

    Each guarded lease carries a *local deadline* on ``time.monotonic()``: the instant
    the renewal (or acquisition) request was sent, plus the lease's ``ttl_s``, minus a
    safety margin (default 10 % of the TTL). The store set the expiry from its own clock
    *after* the request was sent, so the store cannot hand the lock to anyone else before
    the local deadline passes, whatever the two clocks read (as long as they run at the
    same rate, within the margin). When the deadline passes without a confirmed renewal
    (the store is unreachable or slow, or the event loop was blocked), when a renewal
    finds the lease taken over or expired, or when the hold-time ceiling ``max_hold_s``
    is reached, the watchdog drops the lease, counts ``lock_lost`` and calls the guard's
    ``on_lost`` callback, which cancels the guarded work (see :mod:`asynccoord.locks.lock`).

    A guard ends when it is closed (the lock is released), when the watchdog loses it,
    or when the task that holds it ends (unless it was made with ``tied_to_task=False``, as
    for a lock taken with ``Lock.acquire``); from then on its lease is never renewed again.
    The watchdog's own task runs only while it guards something (and lingers
    ``IDLE_EXIT_S`` after the last guard closes).

    A cancellation of that task by anyone but :meth:`aclose` ends it at once only when it
    guards nothing, or when its store is closed (a program that ended with a lock it never
    released). Otherwise the cancellation is deferred: when a task of the program raises
    ``SystemExit`` or ``KeyboardInterrupt``, ``asyncio.run`` cancels every task left, in no
    order, the watchdog among them, while the holders it also cancelled are about to release
    their leases. Giving the leases up then would tell those holders their locks were lost
    (a node would then neither release the lock nor hand its task back, both left held until
    their TTLs). So the watchdog keeps guarding (and renewing) until its last guard closes,
    while releases keep coming (:data:`OUTSIDE_IDLE_S`, 1 s, without one ends it), for
    :data:`OUTSIDE_GRACE_S` (5 s) at most, and until a renewal finds the store closed; it
    then gives up what is left, as before, and ends cancelled.

    Args:
        store: The lock store whose leases it renews (``renew_locks``).
        safety_margin_ratio: Fraction of each lease's TTL by which the local
            deadline precedes the store's expiry, in [0, 0.5]. Default 0.1.

    Raises:
        InvalidTypeError, InvalidArgumentError: a bad argument.
    """

    def __init__(self, store: LockStore, *, safety_margin_ratio: float = DEFAULT_SAFETY_MARGIN_RATIO) -> None:
        if not isinstance(store, LockStore):
            raise InvalidTypeError(f"store must implement LockStore, got {type(store).__name__}")
        ratio = check_non_negative("safety_margin_ratio", safety_margin_ratio, maximum=None)
        if ratio > 0.5:
            raise InvalidArgumentError(f"safety_margin_ratio must be <= 0.5, got {safety_margin_ratio!r}")
        self._store = store
        self._margin_ratio = ratio
        self._guards: set[Guard] = set()
        self._by_token: dict[str, set[Guard]] = {}  # the same guards, by their lease's owner token
        self._writes = itertools.count()  # renewal write ids
        self._task: asyncio.Task[None] | None = None
        self._renewal: asyncio.Task[None] | None = None
        self._wake: asyncio.Future[None] | None = None
        self._wake_at = float("inf")
        self._idle_since = 0.0
        self._cut_at: float | None = None  # cancelled from outside: what is still guarded is given up by then
        self._quiet_since = 0.0  # cancelled from outside: since then, or the last guard closed since
        self._renew_rounds = 0
        self._renewed = 0
        self._lost = 0
        self._max_hold_exceeded = 0
        self._renew_errors = 0

    @classmethod
    def for_store(cls, store: LockStore) -> Watchdog:
        """The default watchdog of ``store`` (one per store object, created on first use)."""
        watchdog = _REGISTRY.get(store)
        if watchdog is None:
            watchdog = _REGISTRY[store] = cls(store)
        return watchdog

    def __repr__(self) -> str:
        return f"<Watchdog guarded={len(self._guards)} rounds={self._renew_rounds} lost={self._lost}>"

    @property
    def store(self) -> LockStore:
        """The lock store whose leases it renews (a :class:`~asynccoord.Lock` takes it only for that store)."""
        return self._store

    @property
    def safety_margin_ratio(self) -> float:
        """Fraction of a lease's TTL kept as a safety margin before its local deadline."""
        return self._margin_ratio

    def local_deadline(self, ttl_s: float, sent_at: float) -> float:
        """Before this monotonic time the store cannot have let a lease of ``ttl_s`` asked for at ``sent_at`` lapse."""
        return sent_at + ttl_s * (1.0 - self._margin_ratio)

    def check_interval(self, ttl_s: float, renew_interval_s: float) -> float:
        """Validate a renewal interval against a TTL; return it.

        Args:
            ttl_s: The lease's TTL, seconds (0.01, ``validation.MIN_LEASE_S``, to one year).
            renew_interval_s: Seconds between renewals (>= 0.001, ``validation.MIN_INTERVAL_S``).

        Raises:
            InvalidTypeError: ``ttl_s`` or ``renew_interval_s`` is not a number (bool is refused).
            InvalidArgumentError: ``ttl_s`` is not a finite number in 0.01..one year, or
                ``renew_interval_s`` not one in 0.001..one year, or the interval is not
                before the local deadline (``ttl_s * (1 - safety_margin_ratio)``).
        """
        ttl = check_lease_s("ttl_s", ttl_s)
        interval = check_interval_s("renew_interval_s", renew_interval_s)
        limit = ttl * (1.0 - self._margin_ratio)
        if interval >= limit:
            raise InvalidArgumentError(
                f"renew_interval_s must be shorter than ttl_s * (1 - safety_margin_ratio) = {limit:g} s "
                f"(the local deadline), got {renew_interval_s!r}; the default is ttl_s / 3"
            )
        return interval

    def statistics(self) -> WatchdogStats:
        """A snapshot of the counters."""
        return WatchdogStats(
            guarded=len(self._guards),
            renew_rounds=self._renew_rounds,
            renewed=self._renewed,
            lost=self._lost,
            max_hold_exceeded=self._max_hold_exceeded,
            renew_errors=self._renew_errors,
        )

    def guard(
        self,
        lease: Lease,
        *,
        sent_at: float,
        renew: bool = True,
        renew_interval_s: float | None = None,
        max_hold_s: float | None = None,
        on_lost: OnLost | None = None,
        task: asyncio.Task[object] | None = None,
        tied_to_task: bool = True,
    ) -> Guard:
        """Start guarding ``lease``: track its local deadline and, if ``renew``, renew it.

        Must be called from the event loop that will run the watchdog. A lease is guarded in
        one watchdog only (the one :meth:`for_store` gives for the store that acquired it, as
        :class:`~asynccoord.Lock` does): guards of one lease in two watchdogs would not see each
        other's renewals, so a second watchdog is refused while the first guards the lease.
        Renew a guarded lease only through :class:`~asynccoord.Lock` or
        :meth:`Guard.renewing`: a renewal behind the guard's back is unknown to it.

        Args:
            lease: A lease just acquired from this watchdog's store.
            sent_at: ``time.monotonic()`` taken just before the acquisition request
                was sent; the local deadline counts from it.
            renew: Renew the lease every ``renew_interval_s``; False only tracks the deadline.
            renew_interval_s: Seconds between renewals; default ``lease.ttl_s / 3``.
            max_hold_s: Ceiling on the hold time from ``sent_at``, seconds; past it the
                lease is given up with :class:`MaxHoldExceededError`. None: no ceiling.
            on_lost: Called once with the error when the lease is given up.
            task: The holder task: the guard closes when it ends. Default: the current task.
            tied_to_task: False: no task ends the guard (``task`` must be None); it lasts
                until it is closed or the lease is lost (a lock acquired with
                :meth:`asynccoord.Lock.acquire` is renewed until its release). Default True.

        Returns:
            The :class:`Guard`; close it when the lock is released.

        Raises:
            InvalidArgumentError, InvalidTypeError: a bad argument (a lease that is not a
                :class:`Lease` with valid fields, a ``sent_at`` that is not a finite number or
                lies in the future, an ``on_lost`` that is not a plain function, a ``task``
                that is not an :class:`asyncio.Task`, a lease another watchdog guards...);
                nothing is guarded then.
        """
        check_lease(lease)
        sent_at = check_finite("sent_at", sent_at)
        if sent_at > time.monotonic():
            raise InvalidArgumentError(
                f"sent_at must be a time.monotonic() reading taken before the acquisition was sent, got {sent_at!r},"
                f" which is in the future (time.monotonic() is now {time.monotonic()!r})"
            )
        check_bool("renew", renew)
        other = _GUARDED_IN.get(lease.owner_token)
        if other is not None and other is not self and other._of(lease.owner_token):
            raise InvalidArgumentError(
                f"lease of {lease.name!r} (fencing token {lease.fencing_token}) is guarded by another watchdog"
                f" ({other!r}): guard a lease in one watchdog (they do not see each other's renewals)"
            )
        if on_lost is not None and (not callable(on_lost) or is_async_callable(on_lost)):
            raise InvalidTypeError(f"on_lost must be a plain function or None, got {on_lost!r}")
        if task is not None and not isinstance(task, asyncio.Task):
            raise InvalidTypeError(f"task must be an asyncio.Task or None, got {type(task).__name__} {task!r}")
        interval = self.check_interval(lease.ttl_s, lease.ttl_s / 3 if renew_interval_s is None else renew_interval_s)
        hold = float("inf") if max_hold_s is None else check_lease_s("max_hold_s", max_hold_s)
        check_bool("tied_to_task", tied_to_task)
        if not tied_to_task and task is not None:
            raise InvalidArgumentError(f"task must be None when tied_to_task is False, got {task!r}")
        holder_task = None if not tied_to_task else task if task is not None else asyncio.current_task()
        g = Guard(
            self,
            lease,
            sent_at=sent_at,
            renew=renew,
            interval_s=interval,
            margin_ratio=self._margin_ratio,
            hold_deadline=sent_at + hold,
            on_lost=on_lost,
            task=holder_task,
        )
        if holder_task is not None:
            if holder_task.done():
                g._active = False
                return g
            holder_task.add_done_callback(g._on_task_done)
        loop = asyncio.get_running_loop()
        if self._task is not None and (self._task.done() or self._task.get_loop() is not loop):
            # The loop that ran the watchdog is gone (a store reused across event loops):
            # its guards died with it.
            self._guards.clear()
            self._by_token.clear()
            self._task = self._renewal = self._wake = None
            self._wake_at = float("inf")
        self._guards.add(g)
        self._by_token.setdefault(lease.owner_token, set()).add(g)
        _GUARDED_IN[lease.owner_token] = self
        if self._task is None:
            self._task = loop.create_task(self._run(), name="asynccoord-lock-watchdog")
        elif self._next_event(g) < self._wake_at:
            self._poke()
        return g

    async def aclose(self) -> None:
        """Stop guarding everything (no renewal is sent afterwards) and stop the task."""
        for g in list(self._guards):
            g.close()
        for task in (self._renewal, self._task):
            if task is not None and not task.done():
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    current = asyncio.current_task()
                    if current is not None and current.cancelling():
                        raise
        self._task = None
        self._renewal = None

    # --- internals ------------------------------------------------------------------------

    def _of(self, owner_token: str) -> list[Guard]:
        """The active guards of one lease (more than one: the lease guarded twice)."""
        return [g for g in self._by_token.get(owner_token, ()) if g._active]

    def _renewal_sent(self, owner_token: str, ttl_s: float, sent_at: float) -> int:
        """An explicit renewal of a lease is on its way: bring its guards' deadlines in."""
        write = next(self._writes)
        guards = self._of(owner_token)
        for g in guards:
            g._sent(write, ttl_s, sent_at)
        self._wake_for(guards)
        return write

    def _renewal_done(self, owner_token: str, write: int, renewed: Lease | None, sent_at: float) -> None:
        """An explicit renewal came back: ``renewed``, or None (nothing landed: it had lapsed)."""
        guards = self._of(owner_token)
        for g in guards:
            if renewed is None:
                g._pending.pop(write, None)
            else:
                g._lease = renewed
                g._landed(write, renewed.ttl_s, sent_at)
        self._wake_for(guards)

    def _renewal_unknown(self, owner_token: str, write: int) -> None:
        for g in self._of(owner_token):
            g._unknown(write)

    def _wake_for(self, guards: list[Guard]) -> None:
        if guards and min(self._next_event(g) for g in guards) < self._wake_at:
            self._poke()  # a deadline came in: wake up for it

    def _forget(self, g: Guard) -> None:
        self._guards.discard(g)
        if self._cut_at is not None:
            self._quiet_since = time.monotonic()  # a release: the deferred cancellation waits on
        same = self._by_token.get(g._lease.owner_token)
        if same is not None:
            same.discard(g)
            if not same:
                del self._by_token[g._lease.owner_token]
        if _GUARDED_IN.get(g._lease.owner_token) is self:
            del _GUARDED_IN[g._lease.owner_token]
        if g._task is not None:
            g._task.remove_done_callback(g._on_task_done)
        if not self._guards:
            now = time.monotonic()
            self._idle_since = now
            if self._wake_at > now + IDLE_EXIT_S:
                self._poke()  # so the task ends IDLE_EXIT_S from now (at most one wake-up per IDLE_EXIT_S)

    def _lose(self, g: Guard, error: LockLostError) -> None:
        self._lose_all([(g, error)])

    def _lose_all(self, losses: list[tuple[Guard, LockLostError]]) -> None:
        """Give leases up: count, log once (not once per lease), and call each ``on_lost``."""
        lost = [(g, error) for g, error in losses if g._active]
        if not lost:
            return
        for g, error in lost:
            g._lost = error
            g.close()
            if isinstance(error, MaxHoldExceededError):
                self._max_hold_exceeded += 1
        self._lost += len(lost)
        self._store.events.add(ev.LOCK_LOST, len(lost))
        first, error = lost[0]
        log.warning(
            "asynccoord.watchdog.lock_lost count=%d name=%r fencing_token=%d reason=%s%s",
            len(lost),
            first._lease.name,
            first._lease.fencing_token,
            type(error).__name__,
            "" if len(lost) == 1 else f" (and {len(lost) - 1} more)",
        )
        exiting: BaseException | None = None
        for g, error in lost:
            if g.on_lost is not None:
                try:
                    g.on_lost(error)
                except (KeyboardInterrupt, SystemExit) as exc:  # the process is ending: after the others
                    exiting = exiting or exc
                except BaseException:  # never the watchdog's end: every other lease depends on it
                    log.exception("asynccoord.watchdog.lock_lost callback failed for %r", g._lease.name)
        if exiting is not None:
            raise exiting

    def _deadline_error(self, g: Guard) -> LockLostError:
        lease = g._lease
        if not g._renew:  # a guard that never renews: the block simply outlived the lease's TTL
            return LockLostError(
                f"lock {lease.name!r} (fencing token {lease.fencing_token}) is not renewed (auto_renew off) and "
                f"the block outlived its TTL (counted from the last acquisition or renewal sent, less a safety "
                f"margin of {self._margin_ratio:.0%}), so the work it guarded was stopped"
            )
        return LockLostError(
            f"lock {lease.name!r} (fencing token {lease.fencing_token}) was not renewed in time: its lease may "
            f"lapse within {self._margin_ratio:.0%} of its TTL (store unreachable or slow, or the event loop was "
            "blocked), so the work it guarded was stopped"
        )

    @staticmethod
    def _next_event(g: Guard) -> float:
        when = min(g._deadline, g._hold_deadline)
        return min(when, g._next_renew_at) if g._renew else when
