"""Locks, semaphores and fencing in plain Python objects: the reference semantics.

:class:`MemoryLockOps` is a mixin of :class:`~asynccoord.backends.memory.store.MemoryStore`.
Each method hands control to the loop once at its entry (the store's ``_enter``), then
runs to completion without awaiting, so each is atomic; expiry is judged by the store's
injectable clock (``self._clock``), which makes lease expiry deterministic in tests.
Semantics are those of :class:`~asynccoord.contract.locks.LockStore`; the SQLite
implementation (:mod:`.sqlite_locks`) must behave the same.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ... import events as ev
from ...config import StoreConfig
from ...contract.locks import (
    FenceRecord,
    Lease,
    LockBusy,
    LockInfo,
    check_fence_args,
    check_lease,
    check_leases,
    check_lock_request,
    encode_fence_data,
    fence_rejected_error,
)
from ...events import EventCounter
from ...releases import ReleaseSignal
from ...validation import check_lease_s, check_name
from ..rows import new_token

__all__ = ("MemoryLockOps",)


@dataclass(slots=True)
class _LockTables:
    fencing_counters: dict[str, int] = field(default_factory=dict)
    holders: dict[str, dict[str, Lease]] = field(default_factory=dict)  # name -> owner token -> lease
    fences: dict[str, FenceRecord] = field(default_factory=dict)


class MemoryLockOps:
    """The :class:`~asynccoord.contract.locks.LockStore` primitives of the in-memory store.

    A mixin: it relies on the store's ``_clock``, ``_enter``, ``config`` and ``events``.
    """

    config: StoreConfig
    events: EventCounter
    _clock: Callable[[], float]

    if TYPE_CHECKING:

        async def _enter(self) -> None: ...

        async def _enter_giving_back(self) -> None: ...

    @functools.cached_property
    def releases(self) -> ReleaseSignal:
        """Wakes this store's lock waiters when a lease is released (see :mod:`asynccoord.releases`)."""
        return ReleaseSignal()

    @functools.cached_property
    def _lock_tables(self) -> _LockTables:
        return _LockTables()

    def _live(self, name: str, now: float) -> dict[str, Lease]:
        """The live leases of ``name`` (lapsed ones are dropped here)."""
        leases = self._lock_tables.holders.get(name, {})
        for token in [t for t, lease in leases.items() if lease.expires_at <= now]:
            del leases[token]
        return leases

    async def try_acquire_lock(
        self, name: str, *, ttl_s: float, permits: int = 1, holder: str = ""
    ) -> Lease | LockBusy:
        """One non-blocking attempt to take ``name`` (see the SQLite store for the details).

        Raises:
            InvalidArgumentError, InvalidTypeError: a bad argument; nothing written.
        """
        name, ttl, count, who = check_lock_request(name, ttl_s, permits, holder)
        await self._enter()
        now = self._clock()
        tables = self._lock_tables
        live = self._live(name, now)
        if len(live) >= count:
            earliest = min(lease.expires_at for lease in live.values())
            return LockBusy(name=name, holders=len(live), permits=count, retry_after_s=max(0.0, earliest - now))
        fencing_token = tables.fencing_counters.get(name, 0) + 1
        tables.fencing_counters[name] = fencing_token
        lease = Lease(
            name=name,
            owner_token=new_token(),
            fencing_token=fencing_token,
            holder=who,
            permits=count,
            ttl_s=ttl,
            acquired_at=now,
            expires_at=now + ttl,
        )
        tables.holders.setdefault(name, live)[lease.owner_token] = lease
        return lease

    async def release_lock(self, lease: Lease) -> bool:
        """Delete ``lease`` if it is still live; False if it lapsed or was taken over (a hand-back: see close())."""
        check_lease(lease)
        await self._enter_giving_back()
        now = self._clock()
        leases = self._lock_tables.holders.get(lease.name, {})
        stored = leases.pop(lease.owner_token, None)
        if not leases:
            self._lock_tables.holders.pop(lease.name, None)
        released = stored is not None and stored.expires_at > now
        if released:
            self.releases.released(lease.name)
        return released

    async def renew_lock(self, lease: Lease, ttl_s: float | None = None) -> Lease | None:
        """Extend a live lease to ``ttl_s`` (default ``lease.ttl_s``) from now; None if it lapsed."""
        check_lease(lease)
        ttl = lease.ttl_s if ttl_s is None else check_lease_s("ttl_s", ttl_s)
        await self._enter()
        return self._renew(lease, ttl, self._clock())

    def _renew(self, lease: Lease, ttl_s: float, now: float) -> Lease | None:
        leases = self._lock_tables.holders.get(lease.name, {})
        stored = leases.get(lease.owner_token)
        if stored is None or stored.expires_at <= now:
            return None
        renewed = replace(stored, ttl_s=ttl_s, expires_at=now + ttl_s)
        leases[lease.owner_token] = renewed
        return renewed

    async def renew_locks(self, leases: Sequence[Lease]) -> list[Lease | None]:
        """Renew many leases atomically, each by its own ``ttl_s``; None where lapsed."""
        checked = check_leases(leases)
        await self._enter()
        now = self._clock()
        return [self._renew(lease, lease.ttl_s, now) for lease in checked]

    async def list_locks(self, name: str | None = None) -> list[LockInfo]:
        """Live leases of ``name`` (or of every name), by name then fencing token."""
        if name is not None:
            check_name("name", name)
        await self._enter()
        now = self._clock()
        names = [name] if name is not None else list(self._lock_tables.holders)
        found = [lease for n in names for lease in self._live(n, now).values()]
        found.sort(key=lambda lease: (lease.name, lease.fencing_token))
        return [
            LockInfo(
                name=lease.name,
                owner_token=lease.owner_token,
                holder=lease.holder,
                fencing_token=lease.fencing_token,
                permits=lease.permits,
                acquired_at=lease.acquired_at,
                expires_at=lease.expires_at,
                remaining_ttl_s=lease.expires_at - now,
            )
            for lease in found
        ]

    def _check_token(self, resource: str, token: int) -> None:
        current = self._lock_tables.fences.get(resource)
        if current is not None and token < current.fencing_token:
            self.events.add(ev.FENCING_REJECTED)
            raise fence_rejected_error(resource, token, current.fencing_token)

    async def fence(self, resource: str, fencing_token: int) -> None:
        """Record ``fencing_token`` for ``resource``, refusing a lower one (equal accepted).

        Raises:
            FencingTokenRejectedError: the resource accepted a higher token; nothing written.
        """
        resource, token = check_fence_args(resource, fencing_token)
        await self._enter()
        self._record_fence(resource, token)

    def _record_fence(self, resource: str, token: int) -> None:
        """:meth:`fence`'s work on checked arguments, without awaiting (a commit's fence records its token so)."""
        self._check_token(resource, token)
        current = self._lock_tables.fences.get(resource)
        data = None if current is None else current.data
        self._lock_tables.fences[resource] = FenceRecord(
            resource=resource, fencing_token=token, data=data, updated_at=self._clock()
        )

    async def fenced_write(self, resource: str, fencing_token: int, data: Any) -> FenceRecord:
        """Check the token as :meth:`fence` does and store ``data`` (JSON) with it, atomically.

        Raises:
            FencingTokenRejectedError: the resource accepted a higher token; nothing written.
        """
        resource, token = check_fence_args(resource, fencing_token)
        text = encode_fence_data(data, self.config.max_payload_bytes)
        await self._enter()
        self._check_token(resource, token)
        record = FenceRecord(resource=resource, fencing_token=token, data=json.loads(text), updated_at=self._clock())
        self._lock_tables.fences[resource] = record
        return record

    async def read_fence(self, resource: str) -> FenceRecord | None:
        """The resource's highest accepted token and last fenced data; None if never fenced."""
        check_name("resource", resource)
        await self._enter()
        return self._lock_tables.fences.get(resource)
