"""Named distributed locks and semaphores with fencing tokens, on any lock store.

A :class:`Lock` or :class:`Semaphore` is a cheap handle for one holder that takes a lease
from a :class:`~asynccoord.contract.locks.LockStore`, which arbitrates between handles,
tasks, processes and machines. Each acquisition carries the name's next fencing token, so
that a holder paused past its expiry is refused by the resource it writes (M. Kleppmann,
"How to do distributed locking", 2016), and waits with exponential backoff and jitter
(M. Brooker, "Exponential backoff and jitter", AWS Architecture Blog, 2015).

This module holds the two public handles and their arguments; what they share (acquire,
renew, release, ``async with``) is :class:`~asynccoord.locks.handle.LeaseHandle`, and the
queue of a process's handles waiting for one name is :mod:`asynccoord.locks.localqueue`.
"""

from __future__ import annotations

from collections.abc import Callable

from ..config import RetryPolicy
from ..contract.locks import MAX_PERMITS, LockStore
from ..errors import LockLostError
from ..validation import check_int
from .handle import DEFAULT_BACKOFF, DEFAULT_RELEASE_TIMEOUT_S, DEFAULT_TTL_S, LeaseHandle, default_max_hold_s
from .watchdog import Watchdog

__all__ = (
    "DEFAULT_BACKOFF",
    "DEFAULT_RELEASE_TIMEOUT_S",
    "DEFAULT_TTL_S",
    "Lock",
    "Semaphore",
    "default_max_hold_s",
)


class Lock(LeaseHandle):
    """A named distributed lock: one holder at a time across tasks, processes and machines.

    A handle for one holder (create one per holder task; they are cheap). Use it as
    ``async with Lock(store, name) as lease:``, or call :meth:`acquire` /
    :meth:`try_acquire`, then :meth:`release`::

        async with Lock(store, "account:42") as lease:     # waits; renewed by the watchdog
            await send(message)
            await store.fenced_write("account:42", lease.fencing_token, {"sent": message.id})

        report = Lock(store, "report", ttl_s=60.0)          # explicit TTL: no renewal
        lease = await report.acquire(timeout_s=5.0)         # LockTimeoutError after 5 s
        try:
            ...
        finally:
            await report.release()                          # LockNotHeldError if it lapsed

    Every acquisition gets a random owner token and the name's next fencing token,
    strictly increasing across releases, expiries and processes. Fence the resource you
    write with it (``store.fence`` / ``store.fenced_write``), so that a holder paused past
    its expiry (GC, swapping, a blocked event loop) is refused when it wakes. ``release``
    and ``renew`` are compare-and-set on the owner token; expiry is judged by the store
    clock, and an expired lease is never revived.

    Inside ``async with`` the block is guarded by the watchdog
    (:mod:`asynccoord.locks.watchdog`): when the lease is lost (taken over, expired, store
    unreachable past the local deadline, or ``max_hold_s`` reached) the block is cancelled
    and ``async with`` raises :class:`~asynccoord.errors.LockLostError`
    (:class:`~asynccoord.errors.MaxHoldExceededError` at the ceiling). A cancellation from
    outside is never turned into that error, nor swallowed.

    Outside ``async with``, with ``auto_renew``, a lease taken by :meth:`acquire` is
    renewed until :meth:`release` (or ``max_hold_s``), whatever task called it: the
    renewal belongs to this handle, not to the acquiring task, so a task that acquires
    and ends leaves the lock held (and renewed) until you release it. :attr:`held` is
    False once the lease is lost or past its local deadline (acquisition or last
    confirmed renewal sent, plus ``ttl_s``, less the watchdog's margin), renewed or not.

    A busy lock raises :class:`~asynccoord.errors.LockTimeoutError`, a ``TimeoutError`` as an
    ``asyncio.timeout()``'s or ``wait_for()``'s deadline is: catch it first (example there).

    Args:
        store: A lock store (:class:`~asynccoord.SQLiteStore`, :class:`~asynccoord.MemoryStore`...).
        name: Lock name, 1..255 characters, not only whitespace. Names in the prefix
            ``asynccoord.next:`` (a :class:`~asynccoord.locks.pool.LockPool`'s places in
            line) are refused; the stores' own lock methods accept them.
        ttl_s: Lease length, seconds (0.01, ``validation.MIN_LEASE_S``, to one year). If
            omitted, the lease is :data:`DEFAULT_TTL_S` (30 s) and the watchdog renews it
            (``auto_renew``).
        timeout_s: Longest wait of ``async with``, seconds (>= 0). Default None: no limit.
        auto_renew: Have the watchdog renew the lease every ``renew_interval_s``.
            Default: True if ``ttl_s`` is omitted or ``renew_interval_s`` or
            ``max_hold_s`` is given (``max_hold_s`` with ``auto_renew=False`` is refused),
            else False (the lease simply lapses after ``ttl_s``; inside ``async with``
            the block is still cancelled at the local deadline).
        renew_interval_s: Seconds between renewals; default ``ttl_s / 3``. Must end
            before the local deadline, ``ttl_s * (1 - safety_margin_ratio)``.
        max_hold_s: Hold-time ceiling of a renewed lease, seconds; past it the watchdog stops
            renewing and the guarded block is cancelled with
            :class:`~asynccoord.errors.MaxHoldExceededError`. Default ``max(300, 10 * ttl_s)``.
        holder: Who holds, shown by ``list_locks`` (not blank); default ``"<host>:<pid>"``.
        watchdog: The watchdog to use, one of ``store`` itself (``watchdog.store is store``;
            one of another store object is refused); default the store's
            (``Watchdog.for_store``).
        backoff: Delay schedule between attempts; default :data:`DEFAULT_BACKOFF`.
        release_timeout_s: How long a cancelled release keeps waiting for the store,
            seconds (>= 0.001). Default 5.
        on_lost: Called with the :class:`~asynccoord.errors.LockLostError` (in the event
            loop, once per lease) when the watchdog gives a lease up: it lapsed, was taken
            over, or reached ``max_hold_s``. A plain function (an ``async def`` one is
            refused); what it raises is logged. Inside ``async with`` the block is
            cancelled as well; after :meth:`acquire` nothing else is, so this is how work
            guarded without a block learns of the loss (e.g. to cancel it); a lease that
            :meth:`acquire` took without ``auto_renew`` is not watched, and never reported.
            Default None.

    Raises:
        InvalidArgumentError, InvalidTypeError: a bad argument (nothing is written).
    """

    def __init__(
        self,
        store: LockStore,
        name: str,
        *,
        ttl_s: float | None = None,
        timeout_s: float | None = None,
        auto_renew: bool | None = None,
        renew_interval_s: float | None = None,
        max_hold_s: float | None = None,
        holder: str | None = None,
        watchdog: Watchdog | None = None,
        backoff: RetryPolicy | None = None,
        release_timeout_s: float = DEFAULT_RELEASE_TIMEOUT_S,
        on_lost: Callable[[LockLostError], None] | None = None,
    ) -> None:
        super().__init__(
            store,
            name,
            permits=1,
            ttl_s=ttl_s,
            timeout_s=timeout_s,
            auto_renew=auto_renew,
            renew_interval_s=renew_interval_s,
            max_hold_s=max_hold_s,
            holder=holder,
            watchdog=watchdog,
            backoff=backoff,
            release_timeout_s=release_timeout_s,
            on_lost=on_lost,
        )


class Semaphore(LeaseHandle):
    """A named distributed semaphore: at most ``permits`` holders of ``name`` at once.

    Each acquisition takes one permit with its own owner token and fencing token
    (fencing tokens count acquisitions of the name, whichever permit). The limit is
    judged per acquisition (an attempt succeeds while fewer than its ``permits``
    leases are live), so give every holder of a name the same ``permits``. A semaphore
    given an explicit ``ttl_s`` is not renewed unless ``auto_renew=True``; without
    ``ttl_s`` it is. Everything else is as for :class:`Lock`::

        async with Semaphore(store, "account:42:sends", permits=3):   # 3 at once
            ...

    Under an ``asyncio.timeout()``, catch its ``LockTimeoutError`` first (see :class:`Lock`).

    Args:
        store: A lock store.
        name: Semaphore name, 1..255 characters.
        permits: How many holders may hold it at once, 1..2**31 - 1 (``MAX_PERMITS``).
        ttl_s, timeout_s, auto_renew, renew_interval_s, max_hold_s, holder,
        watchdog, backoff, release_timeout_s, on_lost: As for :class:`Lock`.

    Raises:
        InvalidArgumentError, InvalidTypeError: a bad argument (nothing is written).
    """

    _shows_permits = True

    def __init__(
        self,
        store: LockStore,
        name: str,
        permits: int,
        *,
        ttl_s: float | None = None,
        timeout_s: float | None = None,
        auto_renew: bool | None = None,
        renew_interval_s: float | None = None,
        max_hold_s: float | None = None,
        holder: str | None = None,
        watchdog: Watchdog | None = None,
        backoff: RetryPolicy | None = None,
        release_timeout_s: float = DEFAULT_RELEASE_TIMEOUT_S,
        on_lost: Callable[[LockLostError], None] | None = None,
    ) -> None:
        check_int("permits", permits, minimum=1, maximum=MAX_PERMITS)
        super().__init__(
            store,
            name,
            permits=permits,
            ttl_s=ttl_s,
            timeout_s=timeout_s,
            auto_renew=auto_renew,
            renew_interval_s=renew_interval_s,
            max_hold_s=max_hold_s,
            holder=holder,
            watchdog=watchdog,
            backoff=backoff,
            release_timeout_s=release_timeout_s,
            on_lost=on_lost,
        )

    @property
    def permits(self) -> int:
        """How many holders may hold the name at once."""
        return self._permits
