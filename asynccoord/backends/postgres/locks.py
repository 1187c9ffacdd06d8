"""Locks, semaphores and fencing on PostgreSQL: the lock primitives of :class:`PostgresStore`.

:class:`PostgresLockOps` is a mixin of :class:`~asynccoord.backends.postgres.store.PostgresStore`.
Concurrent acquisitions of a process are batched (:mod:`._batch`) into one round trip
(``lock_live``, calling the PL/pgSQL function ``coord_lock_acquire_many`` of
``migration_0001.sql``): for each request, under the name's row lock, it counts the
live leases with a fresh snapshot and, when fewer than ``permits`` are live, grants a
permit in the lowest slot no live lease holds, with the name's next fencing token.
The unique index on ``(name, slot)`` (slots ``0..permits-1``) makes the database itself
refuse more holders than permits. Renewals,
releases and fencing are single statements too; lapsed lease rows are taken over by
the next grant of their slot and garbage-collected now and then. Expiry is judged by
the server clock inside each statement.
Semantics are those of :class:`~asynccoord.contract.locks.LockStore`; the schema is
``migration_0001.sql`` and the queries are in ``sql/postgres/locks.sql``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

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
from ...errors import CoordError, StoreClosedError
from ...events import EventCounter
from ...releases import ReleaseSignal
from ...validation import check_lease_s, check_name
from ..batch import Batcher
from ..rows import decode_json, new_token
from .conn import PgRunner, encode_release

if TYPE_CHECKING:
    import asyncpg

__all__ = ("LEASE_GC_GRACE_S", "LEASE_GC_INTERVAL_S", "PostgresLockOps")

log = logging.getLogger(__name__)

T = TypeVar("T")

LEASE_GC_INTERVAL_S = 60.0
"""Least time between two deletions of lapsed lease rows by one store, seconds."""

LEASE_GC_GRACE_S = 60.0
"""A lapsed lease row is deleted once it has been lapsed this long, seconds (store clock)."""


class PostgresLockOps:
    """The :class:`~asynccoord.contract.locks.LockStore` primitives of the PostgreSQL store.

    A mixin: it relies on the store's ``_run`` (retrying runner), statement helpers
    (``_fetch``, ``_row``, ``_val``), ``_now`` (the ``:now`` parameter), ``_writable``,
    ``_spawn`` (background compensations), ``_acquirer`` (made by :meth:`_new_acquirer`),
    ``_runner`` (whose ``call()`` holds an acquisition in flight while the store closes),
    ``config`` and ``events``.
    """

    config: StoreConfig
    events: EventCounter
    releases: ReleaseSignal
    channel: str
    _sender: str
    _lease_gc_at: float = 0.0

    if TYPE_CHECKING:

        async def _run(self, fn: Callable[[asyncpg.Connection, int], Awaitable[T]], *, what: str, **kw: Any) -> T: ...

        async def _fetch(self, conn: asyncpg.Connection, query_name: str, /, **params: Any) -> list[Any]: ...

        async def _row(self, conn: asyncpg.Connection, query_name: str, /, **params: Any) -> Any: ...

        async def _val(self, conn: asyncpg.Connection, query_name: str, /, **params: Any) -> Any: ...

        async def _x(self, conn: asyncpg.Connection, query_name: str, /, **params: Any) -> None: ...

        def _now(self) -> float | None: ...

        def _writable(self) -> None: ...

        def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...

        _acquirer: Batcher[_Request, Lease | LockBusy]
        _runner: PgRunner

    async def try_acquire_lock(
        self, name: str, *, ttl_s: float, permits: int = 1, holder: str = ""
    ) -> Lease | LockBusy:
        """One non-blocking attempt to take ``name`` (or one of its ``permits``).

        If the caller is cancelled while the grant commits, the lease is released in
        the background, so no lease is left without a holder.

        Args:
            name: Lock name, 1..255 characters, not only whitespace.
            ttl_s: Lease length, seconds (0.01, ``validation.MIN_LEASE_S``, to one year), counted
                from the server clock at the grant.
            permits: Leases the name may have at once (>= 1). Default 1: a lock.
            holder: Who acquires, for inspection (0..255 characters). Default ``""``.

        Returns:
            The new :class:`Lease`, or :class:`LockBusy` when every permit is taken.

        Raises:
            InvalidArgumentError, InvalidTypeError: a bad argument; nothing written.
            StoreConnectionError: the server stayed unreachable.
        """
        name, ttl, count, who = check_lock_request(name, ttl_s, permits, holder)
        self._writable()
        request = _Request(name=name, ttl_s=ttl, permits=count, holder=who, owner_token=new_token())
        with self._runner.call():  # a call in flight while its batch waits (see PostgresStore.close)
            future = self._acquirer.submit(request)
            try:
                outcome = await asyncio.shield(future)
            except asyncio.CancelledError:

                def compensate(done: asyncio.Future[Lease | LockBusy]) -> None:
                    if not done.cancelled() and done.exception() is None:
                        result = done.result()
                        if isinstance(result, Lease):
                            self._spawn(self._release_quietly(result))

                future.add_done_callback(compensate)
                raise
        self._collect_lapsed_leases_soon()  # in the background: a cancellation past the grant would leak it
        return outcome

    def _new_acquirer(self) -> Batcher[_Request, Lease | LockBusy]:
        return Batcher(self._acquire_batch, self.config.max_batch_ops, name="asynccoord-pg-acquire")

    async def _acquire_batch(self, requests: Sequence[_Request]) -> list[Lease | LockBusy]:
        """Run a batch of acquisitions in one round trip (``lock_live``)."""

        async def op(conn: asyncpg.Connection, attempt: int) -> list[Lease | LockBusy]:
            now = self._now()
            out: dict[int, Lease | LockBusy] = {}
            todo = list(range(len(requests)))
            if attempt > 0:  # an earlier attempt may have committed: keep its grants
                tokens = [r.owner_token for r in requests]
                owned = {row[0]: row for row in await self._fetch(conn, "lock_find_owned", owner_tokens=tokens)}
                for i, r in enumerate(requests):
                    row = owned.get(r.owner_token)
                    if row is not None:
                        out[i] = r.lease(int(row[1]), float(row[2]), float(row[3]))
                todo = [i for i in todo if i not in out]
            if todo:
                batch = [requests[i] for i in todo]
                rows = await self._fetch(
                    conn,
                    "lock_live",
                    names=[r.name for r in batch],
                    permits=[r.permits for r in batch],
                    owner_tokens=[r.owner_token for r in batch],
                    holders=[r.holder for r in batch],
                    ttls=[r.ttl_s for r in batch],
                    now=now,
                )
                for ordinal, live, earliest, at, fencing_token, acquired_at, expires_at in rows:
                    i = todo[ordinal - 1]
                    r = requests[i]
                    if fencing_token is None:
                        wait = 0.0 if earliest is None else max(0.0, float(earliest) - float(at))
                        out[i] = LockBusy(name=r.name, holders=int(live), permits=r.permits, retry_after_s=wait)
                    else:
                        out[i] = r.lease(int(fencing_token), float(acquired_at), float(expires_at))
            return [out[i] for i in range(len(requests))]

        return await self._run(op, what="try_acquire_lock", tx=False, ambiguous_ok=True)

    def _collect_lapsed_leases_soon(self) -> None:
        """Delete long-lapsed lease rows now and then (at most once per ``LEASE_GC_INTERVAL_S``), in a
        background task: the acquisition that asks has its lease already, and a cancellation of
        its caller while this ran would leave that lease without a holder until its TTL."""
        now = time.monotonic()
        if now - self._lease_gc_at < LEASE_GC_INTERVAL_S:
            return
        self._lease_gc_at = now
        self._spawn(self._collect_lapsed_leases())

    async def _collect_lapsed_leases(self) -> None:
        async def op(conn: asyncpg.Connection, _attempt: int) -> None:
            await self._x(conn, "lock_purge_expired", grace_s=LEASE_GC_GRACE_S, now=self._now())

        try:
            await self._run(op, what="collect lapsed leases", tx=False, ambiguous_ok=True)
        except StoreClosedError:  # the store closes: the next one to open collects them
            pass
        except CoordError as exc:  # garbage collection: the next one will do
            log.warning("asynccoord.postgres.lease_gc_failed error=%s", exc)

    async def _release_quietly(self, lease: Lease) -> None:
        try:
            await self.release_lock(lease)
        except CoordError:  # it expires by itself
            pass

    async def release_lock(self, lease: Lease) -> bool:
        """Delete ``lease`` if it is still live.

        Returns:
            True if it was live and is released; False if it had lapsed, was taken
            over or released already (nothing else changed).

        Raises:
            InvalidTypeError: ``lease`` is not a Lease.
        """
        check_lease(lease)
        self._writable()

        async def op(conn: asyncpg.Connection, attempt: int) -> bool:
            live = await self._val(
                conn,
                "lock_release",
                owner_token=lease.owner_token,
                name=lease.name,
                now=self._now(),
                channel=self.channel,
                payload=encode_release(self._sender, lease.name),
            )
            if live is None and attempt > 0:
                # Not there. After a lost connection, an earlier attempt of this call deleted it
                # if it was live then and nobody has acquired the name since: it is still live by
                # the server clock, and the name's fencing counter is still the lease's token.
                # (Any doubt says False: the caller then reports the lock as lost.)
                return bool(
                    await self._val(
                        conn,
                        "lock_release_recheck",
                        name=lease.name,
                        expires_at=lease.expires_at,
                        fencing_token=lease.fencing_token,
                        now=self._now(),
                    )
                )
            return bool(live)

        with self._runner.giving_back():  # let through while the store closes (see PostgresStore.close)
            released: bool = await self._run(op, what="release_lock", tx=False, ambiguous_ok=True)
        if released:
            self.releases.released(lease.name)  # this process's waiters (the listener skips its own)
        return released

    async def renew_lock(self, lease: Lease, ttl_s: float | None = None) -> Lease | None:
        """Extend a live lease to ``ttl_s`` from now (server clock); never revive a lapsed one.

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
        self._writable()

        async def op(conn: asyncpg.Connection, _attempt: int) -> float | None:
            value = await self._val(
                conn, "lock_renew", owner_token=lease.owner_token, name=lease.name, ttl_s=ttl, now=self._now()
            )
            return None if value is None else float(value)

        expires_at = await self._run(op, what="renew_lock", tx=False, ambiguous_ok=True)
        return None if expires_at is None else replace(lease, ttl_s=ttl, expires_at=expires_at)

    async def renew_locks(self, leases: Sequence[Lease]) -> list[Lease | None]:
        """Renew many leases with one statement, each by its own ``ttl_s``.

        Returns:
            Per input lease, in order: the renewed lease, or None if it had lapsed.

        Raises:
            InvalidTypeError: not a list or tuple of Lease.
        """
        checked = check_leases(leases)
        if not checked:
            return []
        self._writable()
        tokens = [lease.owner_token for lease in checked]
        ttls = [lease.ttl_s for lease in checked]

        async def op(conn: asyncpg.Connection, _attempt: int) -> dict[str, float]:
            rows = await self._fetch(conn, "lock_renew_many", owner_tokens=tokens, ttls=ttls, now=self._now())
            return {str(r[0]): float(r[1]) for r in rows}

        renewed = await self._run(op, what="renew_locks", tx=False, ambiguous_ok=True)
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

        async def op(conn: asyncpg.Connection, _attempt: int) -> list[Any]:
            return await self._fetch(conn, "lock_list", name=name, now=self._now())

        rows = await self._run(op, what="list_locks", tx=False, ambiguous_ok=True)
        return [
            LockInfo(
                name=row[0],
                owner_token=row[1],
                holder=row[2],
                fencing_token=int(row[3]),
                permits=int(row[4]),
                acquired_at=float(row[5]),
                expires_at=float(row[6]),
                remaining_ttl_s=float(row[6]) - float(row[7]),
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
        self._writable()

        async def op(conn: asyncpg.Connection, _attempt: int) -> int | None:
            accepted = await self._val(conn, "fence", resource=resource, fencing_token=token, now=self._now())
            if accepted is not None:
                return None
            row = await self._row(conn, "fence_get", resource=resource)
            return int(row[1])

        highest = await self._run(op, what="fence", tx=False, ambiguous_ok=True)
        if highest is not None:
            self.events.add(ev.FENCING_REJECTED)
            raise fence_rejected_error(resource, token, highest)

    async def fenced_write(self, resource: str, fencing_token: int, data: Any) -> FenceRecord:
        """Check the token as :meth:`fence` does and store ``data`` with it, in one statement.

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
        self._writable()

        async def op(conn: asyncpg.Connection, _attempt: int) -> FenceRecord | int:
            row = await self._row(
                conn, "fenced_write", resource=resource, fencing_token=token, data=text, now=self._now()
            )
            if row is not None:
                return _fence_record(row)
            current = await self._row(conn, "fence_get", resource=resource)
            return int(current[1])

        outcome = await self._run(op, what="fenced_write", tx=False, ambiguous_ok=True)
        if isinstance(outcome, int):
            self.events.add(ev.FENCING_REJECTED)
            raise fence_rejected_error(resource, token, outcome)
        return outcome

    async def read_fence(self, resource: str) -> FenceRecord | None:
        """The resource's highest accepted token and last fenced data; None if never fenced.

        Raises:
            InvalidArgumentError, InvalidTypeError: a bad ``resource``.
        """
        check_name("resource", resource)

        async def op(conn: asyncpg.Connection, _attempt: int) -> Any:
            return await self._row(conn, "fence_get", resource=resource)

        row = await self._run(op, what="read_fence", tx=False, ambiguous_ok=True)
        return None if row is None else _fence_record(row)


@dataclass(frozen=True, slots=True)
class _Request:
    """One queued acquisition."""

    name: str
    ttl_s: float
    permits: int
    holder: str
    owner_token: str

    def lease(self, fencing_token: int, acquired_at: float, expires_at: float) -> Lease:
        return Lease(
            name=self.name,
            owner_token=self.owner_token,
            fencing_token=fencing_token,
            holder=self.holder,
            permits=self.permits,
            ttl_s=self.ttl_s,
            acquired_at=acquired_at,
            expires_at=expires_at,
        )


def _fence_record(row: Any) -> FenceRecord:
    return FenceRecord(resource=row[0], fencing_token=int(row[1]), data=decode_json(row[2]), updated_at=float(row[3]))
