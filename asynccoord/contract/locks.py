"""The lock contract: the :class:`LockStore` Protocol, its records, and the checks of its arguments.

Records are frozen, keyword-only, slotted dataclasses, like those of
:mod:`asynccoord.models`. Times (``acquired_at``, ``expires_at``, ``updated_at``) are
seconds since the Unix epoch *on the store's clock*; durations are seconds. Never
compare them with ``time.time()`` of another process or machine: how long a lease
has left is ``LockInfo.remaining_ttl_s``, computed by the store. The checks are shared
by every lock engine (SQLite, PostgreSQL, memory, Redis), so all of them validate alike.
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast, runtime_checkable

from ..config import StoreConfig
from ..errors import FencingTokenRejectedError, InvalidArgumentError, InvalidTypeError
from ..events import EventCounter
from ..validation import check_int, check_key, check_lease_s, check_name, encode_payload

__all__ = (
    "MAX_FENCING_TOKEN",
    "MAX_PERMITS",
    "PLACE_PREFIX",
    "FenceRecord",
    "Lease",
    "LockBusy",
    "LockInfo",
    "LockStore",
    "check_fence_args",
    "check_lease",
    "check_leases",
    "check_lock_request",
    "check_user_lock_name",
    "default_holder",
    "encode_fence_data",
    "fence_rejected_error",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Lease:
    """One successful acquisition of a lock, or of one permit of a semaphore.

    Attributes:
        name: The lock (or semaphore) name.
        owner_token: Random per acquisition (128 bits, hex). ``release`` and
            ``renew`` are compare-and-set on it, so a lease that expired and was
            taken by someone else can never be released or renewed by its old
            holder. It identifies, it does not authorize: do not treat it as a secret.
        fencing_token: The acquisition's number for ``name``: it rises strictly with
            every successful acquisition of the name (or of any permit of it), across
            releases, expiries, processes and restarts. Present it to the resource
            you write (:meth:`~asynccoord.contract.locks.LockStore.fence`) so a holder
            that was paused past its expiry is refused (M. Kleppmann, "How to do
            distributed locking", 2016).
        holder: Who acquired, free text (default ``"<host>:<pid>"``), for inspection.
        permits: The permit count the acquisition asked for: 1 for a lock.
        ttl_s: Lease length of the last acquisition or renewal, seconds.
        acquired_at: When the store granted it (store clock).
        expires_at: When it lapses unless renewed (store clock).
    """

    name: str
    owner_token: str
    fencing_token: int
    holder: str
    permits: int
    ttl_s: float
    acquired_at: float
    expires_at: float

    def __repr__(self) -> str:
        kind = "" if self.permits == 1 else f" permits={self.permits}"
        return (
            f"<Lease {self.name!r}{kind} fencing_token={self.fencing_token} owner={self.owner_token[:8]}"
            f" holder={self.holder!r} ttl_s={self.ttl_s:g} expires_at={self.expires_at:.3f}>"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class LockBusy:
    """The outcome of an acquisition attempt that found every permit taken.

    Attributes:
        name: The lock (or semaphore) name.
        holders: How many live leases the name has.
        permits: The permit count the attempt asked for.
        retry_after_s: Seconds until the earliest of those leases expires unless it
            is renewed or released first (store clock difference, >= 0).
    """

    name: str
    holders: int
    permits: int
    retry_after_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class LockInfo:
    """One live lease, as listed by ``list_locks``.

    Attributes:
        name: The lock (or semaphore) name.
        owner_token: The lease's owner token.
        holder: Who acquired it.
        fencing_token: The lease's fencing token.
        permits: The permit count its acquisition asked for (1 for a lock).
        acquired_at: When it was granted (store clock).
        expires_at: When it lapses unless renewed (store clock).
        remaining_ttl_s: ``expires_at`` minus the store clock at listing time (> 0).
    """

    name: str
    owner_token: str
    holder: str
    fencing_token: int
    permits: int
    acquired_at: float
    expires_at: float
    remaining_ttl_s: float

    def __repr__(self) -> str:
        return (
            f"<LockInfo {self.name!r} holder={self.holder!r} fencing_token={self.fencing_token}"
            f" remaining_ttl_s={self.remaining_ttl_s:.3f}>"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class FenceRecord:
    """The highest fencing token a resource has accepted, and the data written with it.

    Attributes:
        resource: The guarded resource's name.
        fencing_token: The highest token presented so far; lower ones are refused.
        data: The JSON value of the last :meth:`fenced_write` (None if there was none).
        updated_at: When the token was last accepted (store clock).
    """

    resource: str
    fencing_token: int
    data: Any
    updated_at: float


@runtime_checkable
class LockStore(Protocol):
    """Named locks and semaphores with fencing tokens, over one database.

    These are the storage primitives; waiting with backoff, the watchdog and
    ``async with`` live in :mod:`asynccoord.locks.lock` and :mod:`asynccoord.locks.watchdog`, the
    same for every backend. A lock is a semaphore of one permit. Semantics:

    * An acquisition succeeds when the name has fewer live leases than the
      ``permits`` it asks for (so the limit is judged per acquisition: use one
      permit count per name everywhere). It gets a new random owner token and the
      name's next fencing token: the per-name counter is kept while the lock is free,
      so tokens rise strictly across releases, expiries and processes.
    * Expiry is judged by the store clock inside the write, never by a caller's clock.
    * ``release_lock`` and ``renew_lock(s)`` are compare-and-set on the owner token
      plus "not expired": a lease that lapsed is never revived, even when nobody
      took the lock in between, and a stale holder changes nothing.
    * A cancelled ``try_acquire_lock`` never leaves a lease held with nobody to
      release it (the backend compensates a grant whose caller is gone).
    * ``fence`` / ``fenced_write`` keep, per resource, the highest fencing token seen
      and refuse lower ones: the check that stops a holder paused past its expiry
      (M. Kleppmann, "How to do distributed locking", 2016). Equal tokens are
      accepted: a token belongs to one acquisition, which may write many times. A
      resource must be fenced with the tokens of one lock name only.
    * Optionally, a ``releases`` attribute (an :class:`~asynccoord.releases.ReleaseSignal`)
      announces each successful ``release_lock``, in this process and to the other
      processes the store can reach (SQLite: its wake-up sockets; PostgreSQL: a NOTIFY
      sent by the release itself). A waiter then tries a lock the moment it is given
      back instead of at its next poll; polling stays the fallback for leases that
      lapse and for stores without it (Redis).
    * Optionally, an ``advance_fencing_token(name, at_least)`` method moves the name's
      counter up to ``at_least`` (never down), so its next token is above a token that a
      resource accepted. A :class:`~asynccoord.locks.pool.LockPool` calls it when a write
      fenced by one of its leases is refused. Only a store whose counters can fall behind
      fences kept elsewhere needs it: Redis, restarted from a snapshot that lacks the last
      increments. The SQL stores commit each counter in a durable transaction, which
      cannot be lost apart from the fences it produced, so they have none.

    Every method validates its arguments before touching the database and raises
    :class:`~asynccoord.errors.InvalidArgumentError` or
    :class:`~asynccoord.errors.InvalidTypeError` naming the value, with nothing written.
    """

    config: StoreConfig
    events: EventCounter

    async def now(self) -> float:
        """The store clock: seconds since the Unix epoch."""
        ...

    async def try_acquire_lock(
        self, name: str, *, ttl_s: float, permits: int = 1, holder: str = ""
    ) -> Lease | LockBusy:
        """One non-blocking attempt to take ``name`` (a permit of it when ``permits`` > 1).

        Args:
            name: Lock name, 1..255 characters, not only whitespace.
            ttl_s: Lease length, seconds (0.01, ``validation.MIN_LEASE_S``, to one year), from the
                store clock at the grant.
            permits: Leases the name may have at once (>= 1). Default 1: a lock.
            holder: Who acquires, for inspection (0..255 characters).

        Returns:
            The new :class:`~asynccoord.contract.locks.Lease`, or a
            :class:`~asynccoord.contract.locks.LockBusy` when all permits are taken.
        """
        ...

    async def release_lock(self, lease: Lease) -> bool:
        """Delete the lease if it is still live; False (nothing changed) if it is not."""
        ...

    async def renew_lock(self, lease: Lease, ttl_s: float | None = None) -> Lease | None:
        """Extend a live lease to ``ttl_s`` (default ``lease.ttl_s``) from now; None if it lapsed."""
        ...

    async def renew_locks(self, leases: Sequence[Lease]) -> list[Lease | None]:
        """Renew many leases in one statement, each by its own ``ttl_s``; None where lapsed."""
        ...

    async def list_locks(self, name: str | None = None) -> list[LockInfo]:
        """Live leases (of ``name``, or all), by name then fencing token."""
        ...

    async def fence(self, resource: str, fencing_token: int) -> None:
        """Record ``fencing_token`` as seen by ``resource``; refuse a lower one.

        Raises:
            FencingTokenRejectedError: ``resource`` has seen a higher token; nothing written.
        """
        ...

    async def fenced_write(self, resource: str, fencing_token: int, data: Any) -> FenceRecord:
        """Like :meth:`fence`, and store ``data`` (JSON) in the same atomic step."""
        ...

    async def read_fence(self, resource: str) -> FenceRecord | None:
        """The resource's highest token and last fenced data; None if never fenced."""
        ...


MAX_FENCING_TOKEN = 2**63 - 1
"""Largest fencing token (SQLite and PostgreSQL ``bigint``)."""

MAX_PERMITS = 2**31 - 1
"""Largest permit count of a semaphore."""


@functools.cache
def _hostname() -> str:
    return socket.gethostname()[:200]


def default_holder() -> str:
    """``"<host>:<pid>"``: the holder recorded when none is given (for inspection only)."""
    return f"{_hostname()}:{os.getpid()}"


PLACE_PREFIX = "asynccoord.next:"
"""The prefix of the lock names :class:`~asynccoord.locks.pool.LockPool` keeps its places in line under."""


def check_user_lock_name(arg: str, name: object) -> str:
    """Check a lock name given to :class:`~asynccoord.locks.lock.Lock`, ``Semaphore`` or ``LockPool``.

    Raises:
        InvalidTypeError, InvalidArgumentError: not a valid name, or one in the reserved
            prefix :data:`PLACE_PREFIX` (a user lock there would stand in a pool's line).
    """
    check_name(arg, name)
    text = cast(str, name)
    if text.startswith(PLACE_PREFIX):
        raise InvalidArgumentError(
            f"{arg} {text!r} is in the prefix {PLACE_PREFIX!r}, reserved for LockPool's places in line"
        )
    return text


def check_lock_request(name: object, ttl_s: object, permits: object, holder: object) -> tuple[str, float, int, str]:
    """Validate the arguments of an acquisition; return them normalized.

    Raises:
        InvalidTypeError, InvalidArgumentError: naming the bad argument and value.
    """
    check_name("name", name)
    ttl = check_lease_s("ttl_s", ttl_s)
    count = check_int("permits", permits, minimum=1, maximum=MAX_PERMITS)
    check_key("holder", holder, allow_empty=True)  # a label, shown escaped: not an identifier
    return cast(str, name), ttl, count, cast(str, holder)


def check_lease(lease: object, arg: str = "lease") -> Lease:
    """Check that ``lease`` is a :class:`Lease` as returned by an acquisition.

    The fields a store reads from the caller's copy (``name``, ``owner_token``,
    ``fencing_token``, ``holder``, ``permits`` and ``ttl_s``, the default length of a
    renewal) are checked too, so a tampered or hand-made Lease is refused with a typed
    error before it reaches the database or Redis.

    Raises:
        InvalidTypeError: not a Lease, or a field of the wrong type.
        InvalidArgumentError: a field out of range (``ttl_s`` not in (0, one year], a
            fencing token outside ``1..2**63-1``, an empty owner token...).
    """
    if not isinstance(lease, Lease):
        raise InvalidTypeError(f"{arg} must be a Lease returned by an acquisition, got {type(lease).__name__}")
    check_name(f"{arg}.name", lease.name)
    check_name(f"{arg}.owner_token", lease.owner_token)
    check_int(f"{arg}.fencing_token", lease.fencing_token, minimum=1, maximum=MAX_FENCING_TOKEN)
    check_key(f"{arg}.holder", lease.holder, allow_empty=True)
    check_int(f"{arg}.permits", lease.permits, minimum=1, maximum=MAX_PERMITS)
    check_lease_s(f"{arg}.ttl_s", lease.ttl_s)
    return lease


def check_leases(leases: object) -> list[Lease]:
    """Check a list or tuple of leases (for a renewal: one lease may appear more than once).

    Raises:
        InvalidTypeError: not a list/tuple, or an item that is not a Lease.
        InvalidArgumentError: an item as :func:`check_lease` refuses it, or one lease (one
            owner token) given twice with different ``ttl_s``: a renewal cannot extend it
            by both, and each answer would say it had.
    """
    if not isinstance(leases, list | tuple):
        raise InvalidTypeError(f"leases must be a list or tuple of Lease, got {type(leases).__name__}")
    checked = [check_lease(item, f"leases[{index}]") for index, item in enumerate(cast(Sequence[object], leases))]
    first: dict[str, int] = {}
    for index, lease in enumerate(checked):
        seen = first.setdefault(lease.owner_token, index)
        if checked[seen].ttl_s != lease.ttl_s:
            raise InvalidArgumentError(
                f"leases[{index}] is the lease of leases[{seen}] (lock {lease.name!r}) with another ttl_s"
                f" ({lease.ttl_s!r} against {checked[seen].ttl_s!r}): give each lease once per renewal"
            )
    return checked


def check_fence_args(resource: object, fencing_token: object) -> tuple[str, int]:
    """Validate a fencing call's resource name and token (an int in 1..2**63-1).

    Raises:
        InvalidTypeError, InvalidArgumentError: naming the bad argument and value.
    """
    check_name("resource", resource)
    token = check_int("fencing_token", fencing_token, minimum=1, maximum=MAX_FENCING_TOKEN)
    return cast(str, resource), token


def encode_fence_data(data: Any, max_bytes: int) -> str:
    """JSON text of the data of a fenced write (see :func:`asynccoord.validation.encode_payload`)."""
    return encode_payload(data, max_bytes=max_bytes, arg="data")


def fence_rejected_error(resource: str, fencing_token: int, highest: int) -> FencingTokenRejectedError:
    """The error for a refused fencing token, naming the resource and both tokens (also as attributes)."""
    return FencingTokenRejectedError(
        f"fencing token {fencing_token} for resource {resource!r} is lower than {highest}, which the "
        "resource has already accepted: the lock behind the token was lost and a later holder has written",
        resource=resource,
        fencing_token=fencing_token,
        highest=highest,
    )
