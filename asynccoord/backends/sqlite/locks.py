"""Locks, semaphores and fencing on SQLite: the lock primitives of :class:`SQLiteStore`.

:class:`SQLiteLockOps` is a mixin of :class:`~asynccoord.backends.sqlite.store.SQLiteStore`:
every write is an operation ``fn(db, now_s)`` handed to the store's group committer,
so it runs inside one ``BEGIN IMMEDIATE`` transaction with ``now_s`` read from the
store clock at its start, and many callers' acquisitions share one commit. Expiry is
therefore judged by the database clock, never by a caller's. Semantics are those of
:class:`~asynccoord.contract.locks.LockStore`; the schema is ``migration_0001.sql`` and
the queries are in ``sql/sqlite/locks.sql``.

The functions :func:`acquire_in_tx` and :func:`check_fence` work on the connection
thread inside a transaction, so other operations of the store (a task commit that
must carry a fencing token, say) can check a token in the same transaction as the
write it guards.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import replace
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
from ..calls import CallGate
from ..rows import decode_json, new_token
from ..sqlfiles import load_queries

if TYPE_CHECKING:
    from .writer import GroupCommitter, Operation

__all__ = ("SQLiteLockOps", "acquire_in_tx", "check_fence")

Q = load_queries("sqlite")


def acquire_in_tx(
    db: sqlite3.Connection, now: float, *, name: str, owner_token: str, ttl_s: float, permits: int, holder: str
) -> Lease | LockBusy:
    """Take a permit of ``name`` inside the caller's write transaction (connection thread).

    Lapsed leases of the name are deleted first; the grant bumps the name's fencing
    counter, which survives the lease.

    Returns:
        The new lease, or :class:`LockBusy` when ``permits`` live leases exist.
    """
    db.execute(Q["lock_purge_expired"], {"name": name, "now": now})
    live, earliest = db.execute(Q["lock_live"], {"name": name, "now": now}).fetchone()
    if live >= permits:
        return LockBusy(name=name, holders=live, permits=permits, retry_after_s=max(0.0, float(earliest) - now))
    (fencing_token,) = db.execute(Q["lock_next_fencing_token"], {"name": name}).fetchone()
    params = {
        "owner_token": owner_token,
        "name": name,
        "holder": holder,
        "fencing_token": fencing_token,
        "permits": permits,
        "ttl_s": ttl_s,
        "now": now,
    }
    db.execute(Q["lock_insert"], params)
    return Lease(
        name=name,
        owner_token=owner_token,
        fencing_token=fencing_token,
        holder=holder,
        permits=permits,
        ttl_s=ttl_s,
        acquired_at=now,
        expires_at=now + ttl_s,
    )


def check_fence(db: sqlite3.Connection, now: float, resource: str, fencing_token: int) -> int | None:
    """Record ``fencing_token`` for ``resource`` unless it has seen a higher one (connection thread).

    Returns:
        None when the token was accepted (recorded as the highest); otherwise the
        higher token the resource has already accepted, with nothing written.
    """
    row = db.execute(Q["fence"], {"resource": resource, "fencing_token": fencing_token, "now": now}).fetchone()
    if row is not None:
        return None
    return int(db.execute(Q["fence_get"], {"resource": resource}).fetchone()[1])


def _release_op(lease: Lease) -> Operation[bool]:
    key = {"owner_token": lease.owner_token, "name": lease.name}

    def op(db: sqlite3.Connection, now: float) -> bool:
        row = db.execute(Q["lock_release"], {**key, "now": now}).fetchone()
        return bool(row is not None and row[0])

    return op


class SQLiteLockOps:
    """The :class:`~asynccoord.contract.locks.LockStore` primitives of the SQLite store.

    A mixin: it relies on the store's ``_write`` (group-committed operation with an
    optional compensation), ``_read``, ``_w`` (the group committer), ``config`` and
    ``events``.
    """

    config: StoreConfig
    events: EventCounter
    releases: ReleaseSignal

    if TYPE_CHECKING:

        async def _write(
            self, fn: Operation[Any], undo: Callable[[Any], Operation[Any] | None] | None = None
        ) -> Any: ...

        async def _read(self, fn: Callable[[sqlite3.Connection], Any]) -> Any: ...

        def _w(self) -> GroupCommitter: ...

    async def try_acquire_lock(
        self, name: str, *, ttl_s: float, permits: int = 1, holder: str = ""
    ) -> Lease | LockBusy:
        """One non-blocking attempt to take ``name`` (or one of its ``permits``).

        If the caller is cancelled while the grant commits, a compensating release
        is queued, so no lease is left without a holder.

        Args:
            name: Lock name, 1..255 characters, not only whitespace.
            ttl_s: Lease length, seconds (0.01, ``validation.MIN_LEASE_S``, to one year), counted
                from the store clock at the grant.
            permits: Leases the name may have at once (>= 1). Default 1: a lock.
            holder: Who acquires, for inspection (0..255 characters). Default ``""``.

        Returns:
            The new :class:`Lease`, or :class:`LockBusy` when every permit is taken.

        Raises:
            InvalidArgumentError, InvalidTypeError: a bad argument; nothing written.
            StoreBusyError: the database stayed locked past ``busy_timeout_s``.
        """
        name, ttl, count, who = check_lock_request(name, ttl_s, permits, holder)
        owner_token = new_token()

        def op(db: sqlite3.Connection, now: float) -> Lease | LockBusy:
            return acquire_in_tx(db, now, name=name, owner_token=owner_token, ttl_s=ttl, permits=count, holder=who)

        def undo(result: Lease | LockBusy) -> Operation[bool] | None:
            return _release_op(result) if isinstance(result, Lease) else None

        result: Lease | LockBusy = await self._write(op, undo)
        return result

    async def release_lock(self, lease: Lease) -> bool:
        """Delete ``lease`` if it is still live.

        Returns:
            True if it was live and is released; False if it had lapsed, was taken
            over or released already (nothing else changed).

        Raises:
            InvalidTypeError: ``lease`` is not a Lease.
        """
        check_lease(lease)
        with CallGate.giving_back():  # let through while the store closes (see SQLiteStore.close)
            released = bool(await self._write(_release_op(lease)))
        if released:
            self.releases.released(lease.name)
        return released

    async def renew_lock(self, lease: Lease, ttl_s: float | None = None) -> Lease | None:
        """Extend a live lease to ``ttl_s`` from now (store clock); never revive a lapsed one.

        Args:
            lease: The lease to renew.
            ttl_s: New lease length, seconds (0.01, ``validation.MIN_LEASE_S``, to one year);
                default ``lease.ttl_s``.

        Returns:
            The lease with its new ``expires_at`` (and ``ttl_s``), or None if it had
            lapsed or been taken over (nothing changed).

        Raises:
            InvalidArgumentError, InvalidTypeError: a bad argument.
        """
        check_lease(lease)
        ttl = lease.ttl_s if ttl_s is None else check_lease_s("ttl_s", ttl_s)
        key = {"owner_token": lease.owner_token, "name": lease.name, "ttl_s": ttl}

        def op(db: sqlite3.Connection, now: float) -> float | None:
            row = db.execute(Q["lock_renew"], {**key, "now": now}).fetchone()
            return None if row is None else float(row[0])

        expires_at: float | None = await self._write(op)
        return None if expires_at is None else replace(lease, ttl_s=ttl, expires_at=expires_at)

    async def renew_locks(self, leases: Sequence[Lease]) -> list[Lease | None]:
        """Renew many leases with one statement in one transaction, each by its own ``ttl_s``.

        Returns:
            Per input lease, in order: the renewed lease, or None if it had lapsed.

        Raises:
            InvalidTypeError: not a list or tuple of Lease.
        """
        checked = check_leases(leases)
        if not checked:
            return []
        renewals = json.dumps([[lease.owner_token, lease.ttl_s] for lease in checked])

        def op(db: sqlite3.Connection, now: float) -> dict[str, float]:
            rows = db.execute(Q["lock_renew_many"], {"renewals": renewals, "now": now}).fetchall()
            return {token: float(expires_at) for token, expires_at in rows}

        renewed: dict[str, float] = await self._write(op)
        out: list[Lease | None] = []
        for lease in checked:
            expires_at = renewed.get(lease.owner_token)
            out.append(None if expires_at is None else replace(lease, expires_at=expires_at))
        return out

    async def list_locks(self, name: str | None = None) -> list[LockInfo]:
        """Live leases of ``name`` (or of every name), by name then fencing token.

        Raises:
            InvalidArgumentError, InvalidTypeError: a bad ``name``.
        """
        if name is not None:
            check_name("name", name)
        writer = self._w()

        def read(db: sqlite3.Connection) -> tuple[float, list[tuple[Any, ...]]]:
            now = writer.now(db)
            return now, db.execute(Q["lock_list"], {"name": name, "now": now}).fetchall()

        now, rows = await self._read(read)
        return [
            LockInfo(
                name=row[0],
                owner_token=row[1],
                holder=row[2],
                fencing_token=row[3],
                permits=row[4],
                acquired_at=row[5],
                expires_at=row[6],
                remaining_ttl_s=row[6] - now,
            )
            for row in rows
        ]

    async def fence(self, resource: str, fencing_token: int) -> None:
        """Record ``fencing_token`` as seen by ``resource``, refusing a lower one, atomically.

        Equal tokens are accepted (one acquisition may write many times).

        Raises:
            FencingTokenRejectedError: the resource accepted a higher token; nothing
                written; counted as ``fencing_rejected``.
            InvalidArgumentError, InvalidTypeError: a bad argument.
        """
        resource, token = check_fence_args(resource, fencing_token)

        def op(db: sqlite3.Connection, now: float) -> int | None:
            return check_fence(db, now, resource, token)

        highest: int | None = await self._write(op)
        if highest is not None:
            self.events.add(ev.FENCING_REJECTED)
            raise fence_rejected_error(resource, token, highest)

    async def fenced_write(self, resource: str, fencing_token: int, data: Any) -> FenceRecord:
        """Check the token as :meth:`fence` does and store ``data`` with it, in one step.

        Args:
            resource: The guarded resource's name.
            fencing_token: The writer's lease fencing token.
            data: Any JSON value (size limit ``config.max_payload_bytes``).

        Returns:
            The resource's new record.

        Raises:
            FencingTokenRejectedError: the resource accepted a higher token; nothing written.
            InvalidArgumentError, InvalidTypeError, PayloadTooLargeError: a bad argument.
        """
        resource, token = check_fence_args(resource, fencing_token)
        text = encode_fence_data(data, self.config.max_payload_bytes)
        params = {"resource": resource, "fencing_token": token, "data": text}

        def op(db: sqlite3.Connection, now: float) -> tuple[Any, ...] | int:
            row = db.execute(Q["fenced_write"], {**params, "now": now}).fetchone()
            if row is not None:
                return tuple(row)
            return int(db.execute(Q["fence_get"], {"resource": resource}).fetchone()[1])

        outcome: tuple[Any, ...] | int = await self._write(op)
        if isinstance(outcome, int):
            self.events.add(ev.FENCING_REJECTED)
            raise fence_rejected_error(resource, token, outcome)
        return _fence_record(outcome)

    async def read_fence(self, resource: str) -> FenceRecord | None:
        """The resource's highest accepted token and last fenced data; None if never fenced.

        Raises:
            InvalidArgumentError, InvalidTypeError: a bad ``resource``.
        """
        check_name("resource", resource)
        row = await self._read(lambda db: db.execute(Q["fence_get"], {"resource": resource}).fetchone())
        return None if row is None else _fence_record(tuple(row))


def _fence_record(row: tuple[Any, ...]) -> FenceRecord:
    return FenceRecord(resource=row[0], fencing_token=row[1], data=decode_json(row[2]), updated_at=row[3])
