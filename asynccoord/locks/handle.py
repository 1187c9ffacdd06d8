"""The lease handle that :class:`~asynccoord.locks.lock.Lock` and ``Semaphore`` share: acquire, renew, release.

A :class:`LeaseHandle` holds one lease at a time for one holder. Its acquisition waits with
exponential backoff and jitter (M. Brooker, "Exponential backoff and jitter", AWS
Architecture Blog, 2015), never past the current holder's expiry, behind the other handles of
its process (:mod:`asynccoord.locks.localqueue`). A grant that arrives past its local
deadline is released unused, and a held lease is guarded by the watchdog
(:mod:`asynccoord.locks.watchdog`), so a holder paused past its expiry stops its work and is
refused by the fenced resource (M. Kleppmann, "How to do distributed locking", 2016). Inside
``async with`` the block is cancelled when the lease is lost; releases are shielded and bounded.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from types import TracebackType

import anyio

from .. import events as ev
from ..config import RetryPolicy
from ..contract.locks import Lease, LockBusy, LockStore, check_lock_request, check_user_lock_name, default_holder
from ..errors import (
    InvalidArgumentError,
    InvalidTypeError,
    LockError,
    LockLostError,
    LockNotHeldError,
    LockTimeoutError,
)
from ..validation import check_bool, check_interval_s, check_lease_s, check_non_negative, is_async_callable
from .background import keep as _keep
from .background import shielded as _shielded
from .localqueue import queues_of as _queues
from .localqueue import release_and_signal as _release_and_signal
from .localqueue import release_orphan as _release_orphan
from .localqueue import release_quietly as _release_quietly
from .watchdog import Guard, Watchdog

__all__ = (
    "DEFAULT_BACKOFF",
    "DEFAULT_RELEASE_TIMEOUT_S",
    "DEFAULT_TTL_S",
    "EXPIRY_SLACK_S",
    "LeaseHandle",
    "default_max_hold_s",
)

log = logging.getLogger("asynccoord.locks.lock")  # the log lines keep the lock module's logger name

DEFAULT_TTL_S = 30.0
"""Lease length of a lock taken without ``ttl_s`` (then renewed by the watchdog), seconds."""

DEFAULT_RELEASE_TIMEOUT_S = 5.0
"""How long a cancelled release keeps waiting, shielded, for the store, seconds."""

DEFAULT_BACKOFF = RetryPolicy(base_s=0.004, factor=2.0, cap_s=0.1, jitter=0.5)
"""Waits between acquisition attempts: 4 ms doubling to 100 ms, +-50 % jitter.

Only the delay schedule is used (``max_attempts`` is not: ``timeout_s`` bounds the wait).
"""

EXPIRY_SLACK_S = 0.002
"""Added to a holder's remaining TTL before retrying, so the retry lands after the expiry, seconds."""


def default_max_hold_s(ttl_s: float) -> float:
    """The default hold-time ceiling of a watchdog-renewed lease: ``max(300, 10 * ttl_s)`` seconds."""
    return max(300.0, 10.0 * ttl_s)


_LOCK_STORE_TYPES: set[type] = set()


class LeaseHandle:
    """What :class:`~asynccoord.locks.lock.Lock` and :class:`~asynccoord.locks.lock.Semaphore` share: one lease
    at a time, for one holder."""

    _shows_permits = False
    """Whether the repr shows ``permits`` (a semaphore's does)."""

    def __init__(
        self,
        store: LockStore,
        name: str,
        *,
        permits: int,
        ttl_s: float | None,
        timeout_s: float | None,
        auto_renew: bool | None,
        renew_interval_s: float | None,
        max_hold_s: float | None,
        holder: str | None,
        watchdog: Watchdog | None,
        backoff: RetryPolicy | None,
        release_timeout_s: float,
        on_lost: Callable[[LockLostError], None] | None = None,
    ) -> None:
        if type(store) not in _LOCK_STORE_TYPES:  # a Protocol isinstance check is slow: once per type
            if not isinstance(store, LockStore):
                raise InvalidTypeError(f"store must implement LockStore (e.g. SQLiteStore), got {type(store).__name__}")
            _LOCK_STORE_TYPES.add(type(store))
        ttl = DEFAULT_TTL_S if ttl_s is None else ttl_s
        if isinstance(holder, str) and not holder.strip():  # shown by list_locks and status: a blank one says nothing
            raise InvalidArgumentError(f"holder must name who holds the lock, got {holder!r}")
        who = default_holder() if holder is None else holder
        self._name, self._ttl_s, self._permits, self._holder = check_lock_request(name, ttl, permits, who)
        check_user_lock_name("name", name)
        if auto_renew is None:
            auto_renew = ttl_s is None or renew_interval_s is not None or max_hold_s is not None
        self._auto_renew = check_bool("auto_renew", auto_renew)
        self._max_hold_s = (  # its type and range first
            default_max_hold_s(self._ttl_s) if max_hold_s is None else check_lease_s("max_hold_s", max_hold_s)
        )
        if not self._auto_renew and max_hold_s is not None:
            raise InvalidArgumentError(
                f"max_hold_s={max_hold_s!r} bounds a renewed lease, but auto_renew is False: the lease "
                f"simply ends after ttl_s={self._ttl_s!r}; drop max_hold_s or let the watchdog renew"
            )
        if watchdog is None:
            watchdog = Watchdog.for_store(store)
        elif not isinstance(watchdog, Watchdog):
            raise InvalidTypeError(f"watchdog must be a Watchdog or None, got {type(watchdog).__name__}")
        elif watchdog.store is not store:  # it would renew (and report lost) leases the lock's store never saw
            raise InvalidArgumentError(
                f"watchdog {watchdog!r} renews the leases of another store ({watchdog.store!r}), not of "
                f"this lock's store ({store!r}): pass Watchdog(store) or None (the store's own)"
            )
        self._watchdog = watchdog
        interval = self._ttl_s / 3 if renew_interval_s is None else renew_interval_s
        self._renew_interval_s = watchdog.check_interval(self._ttl_s, interval)
        self._timeout_s = None if timeout_s is None else check_non_negative("timeout_s", timeout_s)
        if backoff is not None and not isinstance(backoff, RetryPolicy):
            raise InvalidTypeError(f"backoff must be a RetryPolicy or None, got {type(backoff).__name__}")
        self._backoff = backoff or DEFAULT_BACKOFF
        self._release_timeout_s = check_interval_s("release_timeout_s", release_timeout_s)
        if on_lost is not None and (not callable(on_lost) or is_async_callable(on_lost)):
            raise InvalidTypeError(f"on_lost must be a plain function or None, got {on_lost!r}")
        self._on_lost_callback = on_lost
        self._store = store
        self._lease: Lease | None = None
        self._guard: Guard | None = None
        self._lost: LockLostError | None = None
        self._deadline = 0.0  # local monotonic deadline of an unguarded lease (see held)
        self._scope: anyio.CancelScope | None = None
        self._busy = False

    def __repr__(self) -> str:
        permits = f" permits={self._permits}" if self._shows_permits else ""
        lease = self._current()
        if lease is None:
            state = "acquiring" if self._busy else "free"
        else:
            state = f"{'lost' if self._lost is not None else 'held'} fencing_token={lease.fencing_token}"
            if self._guard is not None:
                state += f" remaining_s={self._guard.remaining_s():.3f}"
            state += f" expires_at={lease.expires_at:.3f}"
        renew = f" renew_interval_s={self._renew_interval_s:g}" if self._auto_renew else ""
        return f"<{type(self).__name__} {self._name!r}{permits} {state} ttl_s={self._ttl_s:g}{renew}>"

    # --- state ------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The lock (or semaphore) name."""
        return self._name

    @property
    def ttl_s(self) -> float:
        """Lease length asked for at each acquisition, seconds."""
        return self._ttl_s

    @property
    def auto_renew(self) -> bool:
        """Whether the watchdog renews the lease every :attr:`renew_interval_s`."""
        return self._auto_renew

    @property
    def renew_interval_s(self) -> float:
        """Seconds between the watchdog's renewals (when :attr:`auto_renew`)."""
        return self._renew_interval_s

    @property
    def max_hold_s(self) -> float:
        """Hold-time ceiling of a watchdog-renewed lease, seconds."""
        return self._max_hold_s

    @property
    def watchdog(self) -> Watchdog:
        """The watchdog that renews and guards this handle's leases."""
        return self._watchdog

    @property
    def lease(self) -> Lease | None:
        """The lease this handle holds (as last renewed), or None. It may have been lost: see :attr:`lost`."""
        return self._current()

    def _current(self) -> Lease | None:
        if self._lease is not None and self._guard is not None:
            return self._guard.lease  # renewed by the watchdog
        return self._lease

    @property
    def lost(self) -> LockLostError | None:
        """Why the watchdog gave the current lease up, or None."""
        return self._lost

    @property
    def held(self) -> bool:
        """Whether this handle holds a lease the watchdog has not given up, within its local deadline.

        The local deadline is ``time.monotonic()`` at the sending of the acquisition (or of
        the last confirmed renewal) plus ``ttl_s``, less the watchdog's safety margin: past
        it the store may have let the lease lapse, so ``held`` is False (also for a lease
        that is not renewed, ``auto_renew=False``). Still the handle's belief, not a store
        query: fence your writes.
        """
        if self._lease is None or self._lost is not None:
            return False
        if self._guard is not None:
            return self._guard.remaining_s() > 0
        return time.monotonic() < self._deadline

    # --- acquire ----------------------------------------------------------------------------

    async def acquire(self, *, timeout_s: float | None = None) -> Lease:
        """Take the lock (a permit), waiting with backoff and jitter while it is held.

        The wait never sleeps past the current holder's expiry; its schedule is the
        handle's ``backoff`` (a :class:`~asynccoord.config.RetryPolicy`). Handles of one
        store waiting for one name in one process queue up first come, first served: only
        the first ``permits`` of them ask the store, and a release in the process wakes
        them at once (:meth:`try_acquire` does not queue). A cancelled ``acquire`` leaves
        nothing held: a lease granted as the caller was cancelled is released in the
        background. A lease whose grant arrived past its local deadline (this process
        stalled meanwhile, and another holder may have it) is released and the wait goes on.

        Args:
            timeout_s: Longest wait, seconds (>= 0; 0 makes one attempt). None (the
                default) waits as long as it takes.

        Returns:
            The new :class:`~asynccoord.contract.locks.Lease`. With :attr:`auto_renew`
            the watchdog renews it until :meth:`release` or until :attr:`max_hold_s`,
            whichever comes first, whatever task called ``acquire`` (the renewal
            belongs to the handle, not to that task: one that ends leaves the lock held
            and renewed; release it).

        Raises:
            LockTimeoutError: not acquired within ``timeout_s``; counted as ``lock_contended``.
            LockError: this handle already holds a lease or is acquiring in another task.
            InvalidArgumentError, InvalidTypeError: a bad ``timeout_s``.
            StoreError: the store failed.
        """
        timeout = None if timeout_s is None else check_non_negative("timeout_s", timeout_s)
        return await self._acquire(timeout, in_block=False)

    async def try_acquire(self) -> Lease | None:
        """One attempt, no waiting: the new lease, or None (held: counted as ``lock_contended``;
        or granted past its local deadline, see :meth:`acquire`).

        Raises:
            LockError: this handle already holds a lease or is acquiring in another task.
            StoreError: the store failed.
        """
        self._begin()
        try:
            sent_at = time.monotonic()
            outcome = await self._attempt()
            if isinstance(outcome, LockBusy):
                self._store.events.add(ev.LOCK_CONTENDED)
                return None
            if not await self._in_time(outcome, sent_at):
                return None
            self._take(outcome, sent_at, in_block=False)
            return outcome
        finally:
            self._busy = False

    def _begin(self) -> None:
        if self._busy:
            raise LockError(f"{self!r} is already acquiring in another task: use one handle per holder")
        if self._lease is not None:
            if self._lost is None:
                raise LockError(
                    f"{self!r} already holds a lease: release it first (handles are not reentrant; "
                    "use one handle per holder)"
                )
            # A lease the watchdog gave up: forget it (release it, in case it is still live).
            _keep(asyncio.ensure_future(_release_quietly(self._store, self._lease)))
            self._lease = None
            self._lost = None
        self._busy = True

    async def _acquire(self, timeout_s: float | None, *, in_block: bool) -> Lease:
        self._begin()
        queues = _queues(self._store)
        queue, ticket = queues.join(self._name, self._permits)
        try:
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            contended = False
            failures = 0
            while True:
                now = time.monotonic()
                if not queue.is_head(ticket) and (deadline is None or now < deadline):
                    if not contended:
                        self._store.events.add(ev.LOCK_CONTENDED)
                        contended = True
                    await ticket.wait(None if deadline is None else deadline - now)  # for our turn
                    continue
                generation = queue.generation
                sent_at = time.monotonic()
                outcome = await self._attempt()
                if isinstance(outcome, Lease):
                    if await self._in_time(outcome, sent_at):
                        self._take(outcome, sent_at, in_block=in_block)
                        return outcome
                    if not contended:  # a late grant counts as a busy answer
                        self._store.events.add(ev.LOCK_CONTENDED)
                    failures, contended, now = failures + 1, True, time.monotonic()
                    if deadline is not None and now >= deadline:
                        raise LockTimeoutError(
                            f"could not acquire {self._name!r} within timeout_s={timeout_s:g}: "
                            "its grant arrived past its local deadline"
                        )
                    delay = self._backoff.delay_s(failures)
                    await ticket.wait(delay if deadline is None else min(delay, deadline - now))
                    continue
                if not contended:
                    self._store.events.add(ev.LOCK_CONTENDED)
                    contended = True
                failures += 1
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    raise LockTimeoutError(
                        f"could not acquire {self._name!r} within timeout_s={timeout_s:g}: {outcome.holders} live "
                        f"lease(s) for {outcome.permits} permit(s); the earliest lapses in "
                        f"{outcome.retry_after_s:.3f} s unless renewed"
                    )
                if queue.generation != generation:
                    continue  # released in this process meanwhile: try again at once
                delay = min(self._backoff.delay_s(failures), outcome.retry_after_s + EXPIRY_SLACK_S)
                if deadline is not None:
                    delay = min(delay, deadline - now)
                await ticket.wait(delay)
        finally:
            self._busy = False
            queues.leave(self._name, queue, ticket)

    async def _attempt(self) -> Lease | LockBusy:
        """One store attempt that cannot leak a lease when the caller is cancelled."""
        call = asyncio.ensure_future(
            self._store.try_acquire_lock(self._name, ttl_s=self._ttl_s, permits=self._permits, holder=self._holder)
        )
        try:
            return await asyncio.shield(call)
        except asyncio.CancelledError:
            call.add_done_callback(lambda done: _release_orphan(self._store, done))
            raise

    async def _in_time(self, lease: Lease, sent_at: float) -> bool:
        """Whether ``lease``, asked for at ``sent_at``, arrived before its local deadline; if not, release it.

        A process that stalled between the store's grant and its reply (a GC pause, SIGSTOP) past that
        deadline holds a lease another may have taken over: never used (``asynccoord.lock.grant_too_late``).
        """
        late_s = time.monotonic() - self._watchdog.local_deadline(lease.ttl_s, sent_at)
        if late_s < 0:
            return True
        log.warning(
            "asynccoord.lock.grant_too_late name=%r fencing_token=%d late_s=%.3f: the grant arrived past its local "
            "deadline (this process or the store stalled); released, not used",
            lease.name,
            lease.fencing_token,
            late_s,
        )
        await _release_quietly(self._store, lease)
        return False

    def _take(self, lease: Lease, sent_at: float, *, in_block: bool) -> None:
        """Record a new lease; synchronous, so no cancellation can fall between grant and record."""
        self._lease = lease
        self._lost = None
        self._deadline = self._watchdog.local_deadline(lease.ttl_s, sent_at)
        if self._auto_renew or in_block:
            # A block's lease is guarded for the block's task; one taken by acquire() for the
            # handle: renewed until release(), whichever task acquired it (a helper task that
            # ends leaves it held, and renewed).
            self._guard = self._watchdog.guard(
                lease,
                sent_at=sent_at,
                renew=self._auto_renew,
                renew_interval_s=self._renew_interval_s,
                max_hold_s=self._max_hold_s if self._auto_renew else None,
                on_lost=self._on_lost,
                tied_to_task=in_block,
            )

    def _on_lost(self, error: LockLostError) -> None:
        self._lost = error
        if self._scope is not None:
            self._scope.cancel()
        if self._on_lost_callback is not None:  # what it raises, the watchdog logs (see Watchdog._lose_all)
            self._on_lost_callback(error)

    # --- renew and release ------------------------------------------------------------------

    async def renew(self, ttl_s: float | None = None) -> Lease:
        """Extend the lease to ``ttl_s`` from now (store clock); compare-and-set on the owner token.

        Args:
            ttl_s: New lease length, seconds (0.01, ``validation.MIN_LEASE_S``, to one
                year); default the handle's ``ttl_s``.

        Returns:
            The renewed lease.

        Raises:
            LockNotHeldError: the handle holds no lease, or it lapsed or was taken
                over: it is not revived, the handle forgets it, and ``lock_lost`` is
                counted. Also when the watchdog already gave it up (``__cause__``
                then says why).
            InvalidArgumentError, InvalidTypeError: a bad ``ttl_s``.
        """
        lease = self._current()
        if lease is None:
            raise LockNotHeldError(f"{self!r} holds no lease: nothing to renew")
        if self._lost is not None:
            raise LockNotHeldError(f"the lease of {lease.name!r} was given up by the watchdog") from self._lost
        ttl = self._ttl_s if ttl_s is None else check_lease_s("ttl_s", ttl_s)
        if self._auto_renew:
            self._watchdog.check_interval(ttl, self._renew_interval_s)
        sent_at = time.monotonic()
        guard = self._guard
        if guard is None:
            renewed = await self._store.renew_lock(lease, ttl)
        else:  # the guard's deadline covers the renewal while it flies, whatever becomes of it
            with guard.renewing(ttl, sent_at=sent_at) as landed:
                renewed = await self._store.renew_lock(lease, ttl)
                landed(renewed)
        if renewed is None:
            if self._holds(lease):
                self._forget()
            self._store.events.add(ev.LOCK_LOST)
            raise LockNotHeldError(
                f"the lease of {lease.name!r} (fencing token {lease.fencing_token}) had expired or been taken "
                "over: it was not renewed (an expired lease is never revived)"
            )
        if self._holds(lease):
            self._lease = renewed
            self._deadline = self._watchdog.local_deadline(renewed.ttl_s, sent_at)
        return renewed

    async def release(self) -> None:
        """Release the lease; compare-and-set on the owner token.

        Cancellation-safe: if the caller is cancelled, the release still runs,
        shielded, for up to ``release_timeout_s`` before the cancellation is re-raised,
        and the handle forgets the lease either way. A call cancelled before its first
        step (``asyncio.wait_for(lock.release(), 0)``) never ran: nothing is released.

        Raises:
            LockNotHeldError: the handle holds no lease (e.g. a failed non-blocking
                acquire), or it had lapsed or been taken over: nothing was released
                and nobody else's lease was touched; ``lock_lost`` is counted for a
                lapse the watchdog had not reported.
            LockLostError: the lease was released, but the watchdog had given it up
                before (:class:`~asynccoord.errors.MaxHoldExceededError` at the ceiling).
            StoreError: the store failed; the handle keeps the lease (retry, or let it lapse).
        """
        lease = self._current()
        if lease is None:
            raise LockNotHeldError(
                f"{self!r} holds no lease: nothing to release (a failed or cancelled acquire holds nothing)"
            )
        lost = self._lost
        held = await self._release_current(lease)
        if not held:
            if lost is None:
                self._store.events.add(ev.LOCK_LOST)
            raise LockNotHeldError(
                f"the lease of {lease.name!r} (fencing token {lease.fencing_token}) had expired or been taken "
                "over: nothing was released"
            ) from lost
        if lost is not None:
            raise lost

    def let_lapse(self) -> bool:
        """Forget the lease unreleased, unrenewed (its work outlives the holder): it lapses at its TTL; True if held."""
        if self._lease is None:
            return False
        self._forget()
        return True

    async def _release_current(self, lease: Lease) -> bool:
        """Stop guarding, release (shielded, bounded) and forget ``lease``; True if it was live."""
        if self._guard is not None:
            self._guard.close()
            self._guard = None
        try:
            held = await _shielded(_release_and_signal(self._store, lease), self._release_timeout_s)
        except asyncio.CancelledError:
            if self._holds(lease):
                self._forget()
            raise
        if self._holds(lease):
            self._forget()
        return held

    def _holds(self, lease: Lease) -> bool:
        return self._lease is not None and self._lease.owner_token == lease.owner_token

    def _forget(self) -> None:
        if self._guard is not None:
            self._guard.close()
            self._guard = None
        self._lease = None
        self._lost = None

    # --- async with -------------------------------------------------------------------------

    async def __aenter__(self) -> Lease:
        """Acquire (waiting up to the handle's ``timeout_s``) and start guarding the block."""
        lease = await self._acquire(self._timeout_s, in_block=True)
        scope = anyio.CancelScope()
        scope.__enter__()
        self._scope = scope
        return lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        """Stop guarding, release, and report a lost lease as :class:`~asynccoord.errors.LockLostError`."""
        scope, self._scope = self._scope, None
        if self._guard is not None:
            self._guard.check()  # the event loop may have been blocked past the deadline
        try:
            suppressed = bool(scope.__exit__(exc_type, exc, tb)) if scope is not None else False
        except BaseException:
            await self._release_on_exit()
            raise
        lost = self._lost
        held, release_error = await self._release_on_exit()
        if suppressed:  # the block was cancelled by the watchdog
            raise (lost or LockLostError(f"the lease of {self._name!r} was lost")) from exc
        if exc_type is not None:
            return False
        if release_error is not None:
            raise release_error
        if lost is not None:
            raise lost
        if not held:
            raise LockLostError(
                f"the lease of {self._name!r} had expired or been taken over before the end of the block: "
                "the work it guarded may have overlapped another holder's"
            )
        return False

    async def _release_on_exit(self) -> tuple[bool, Exception | None]:
        lease = self._current()
        if lease is None:  # released inside the block
            return True, None
        lost = self._lost
        try:
            held = await self._release_current(lease)
        except Exception as error:
            log.warning(
                "asynccoord.lock.lock_release_failed name=%r error=%s: the lease will lapse by its TTL",
                lease.name,
                error,
            )
            self._forget()
            return True, error
        if not held and lost is None:
            self._store.events.add(ev.LOCK_LOST)
        return held, None
