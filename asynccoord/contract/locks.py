"""Records of the lock contract: leases, failed attempts, inspection rows, fences.

All are frozen, keyword-only, slotted dataclasses, like those of
:mod:`asynccoord.models`. Times (``acquired_at``, ``expires_at``, ``updated_at``) are
seconds since the Unix epoch *on the store's clock*; durations are seconds. Never
compare them with ``time.time()`` of another process or machine: how long a lease
has left is ``LockInfo.remaining_ttl_s``, computed by the store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ("FenceRecord", "Lease", "LockBusy", "LockInfo")


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
            you write (:meth:`~asynccoord.contract.protocols.LockStore.fence`) so a holder
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
