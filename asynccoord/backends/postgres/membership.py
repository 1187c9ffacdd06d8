"""Node membership on PostgreSQL: the membership primitives of :class:`PostgresStore`.

:class:`PostgresMembershipOps` is a mixin of
:class:`~asynccoord.backends.postgres.store.PostgresStore`: a heartbeat is one transaction that
purges long-dead rows, upserts every beat of the process with one statement and lists
the live members. Liveness is judged by the server clock inside the statements, never by
a caller's. Semantics are those of :class:`~asynccoord.contract.membership.MembershipStore`;
the schema is ``migration_0001.sql`` and the queries are in ``sql/postgres/membership.sql``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ...config import StoreConfig
from ...contract.membership import DEAD_MEMBER_RETENTION_S, Member, MemberBeat, check_leave_args, prepare_beats
from ...events import EventCounter

if TYPE_CHECKING:
    import asyncpg

__all__ = ("PostgresMembershipOps",)

T = TypeVar("T")


def _members(rows: Sequence[Any]) -> list[Member]:
    """Members from ``member_live`` rows (the last column is the store clock of the read)."""
    return [
        Member(
            node_id=row[0],
            incarnation=row[1],
            info=json.loads(row[2]),
            started_at=float(row[3]),
            heartbeat_at=float(row[4]),
            expires_at=float(row[5]),
            heartbeat_age_s=max(0.0, float(row[6]) - float(row[4])),
        )
        for row in rows
    ]


class PostgresMembershipOps:
    """The :class:`~asynccoord.contract.membership.MembershipStore` primitives of the PostgreSQL store.

    A mixin: it relies on the store's ``_run``, statement helpers, ``_now``,
    ``_writable`` and ``config``.
    """

    config: StoreConfig
    events: EventCounter

    if TYPE_CHECKING:

        async def _run(self, fn: Callable[[asyncpg.Connection, int], Awaitable[T]], *, what: str, **kw: Any) -> T: ...

        async def _fetch(self, conn: asyncpg.Connection, query_name: str, /, **params: Any) -> list[Any]: ...

        async def _val(self, conn: asyncpg.Connection, query_name: str, /, **params: Any) -> Any: ...

        async def _x(self, conn: asyncpg.Connection, query_name: str, /, **params: Any) -> None: ...

        def _now(self) -> float | None: ...

        def _writable(self) -> None: ...

    async def heartbeat(self, beats: Sequence[MemberBeat], *, ttl_s: float) -> list[Member]:
        """Record every beat and list the live members, in one transaction.

        Each beat upserts its node's row with ``heartbeat_at`` = the server clock now and
        ``expires_at`` = now + ``ttl_s``; ``started_at`` is kept while the incarnation is
        unchanged and reset by a new one. Rows dead for longer than
        ``DEAD_MEMBER_RETENTION_S`` are deleted on the way. With no beats this is a read.

        Args:
            beats: One :class:`MemberBeat` per local node (node ids distinct).
            ttl_s: Seconds (0.01, ``validation.MIN_LEASE_S``, to one year) the beaten members stay
                live without another beat.

        Returns:
            Every live member (``expires_at`` after the store clock now), by node id.

        Raises:
            InvalidArgumentError, InvalidTypeError, PayloadTooLargeError: a bad argument;
                nothing written.
            StoreConnectionError: the server stayed unreachable.
        """
        prepared, ttl = prepare_beats(beats, ttl_s, self.config.max_payload_bytes)
        if not prepared:
            return await self.members()
        self._writable()
        columns = {
            "node_ids": [b[0] for b in prepared],
            "incarnations": [b[1] for b in prepared],
            "infos": [b[2] for b in prepared],
        }

        async def op(conn: asyncpg.Connection, _attempt: int) -> list[Any]:
            now = self._now()
            await self._x(conn, "member_purge_dead", retention_s=DEAD_MEMBER_RETENTION_S, now=now)
            await self._x(conn, "member_beat", ttl_s=ttl, now=now, **columns)
            return await self._fetch(conn, "member_live", now=now)

        return _members(await self._run(op, what="heartbeat", ambiguous_ok=True))

    async def leave(self, node_id: str, incarnation: str) -> bool:
        """Delete the member row of ``node_id`` if it belongs to ``incarnation``.

        Returns:
            True if that incarnation was live and is now gone; False if the row holds
            another incarnation or none, or had expired (a lapsed row is deleted too).

        Raises:
            InvalidArgumentError, InvalidTypeError: a bad argument.
        """
        node_id, incarnation = check_leave_args(node_id, incarnation)
        self._writable()

        async def op(conn: asyncpg.Connection, _attempt: int) -> bool:
            live = await self._val(conn, "member_leave", node_id=node_id, incarnation=incarnation, now=self._now())
            return bool(live)

        return await self._run(op, what="leave", tx=False, ambiguous_ok=True)

    async def members(self) -> list[Member]:
        """The live members (``expires_at`` after the store clock now), by node id."""

        async def op(conn: asyncpg.Connection, _attempt: int) -> list[Any]:
            return await self._fetch(conn, "member_live", now=self._now())

        return _members(await self._run(op, what="members", tx=False, ambiguous_ok=True))
