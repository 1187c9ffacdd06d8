"""Node membership on SQLite: the membership primitives of :class:`SQLiteStore`.

:class:`SQLiteMembershipOps` is a mixin of :class:`~asynccoord.backends.sqlite.store.SQLiteStore`:
a heartbeat is one operation ``fn(db, now_s)`` handed to the store's group committer,
so every beat of a process is upserted by one statement inside one ``BEGIN IMMEDIATE``
transaction with ``now_s`` read from the store clock at its start, and the live
members are listed in the same transaction. Liveness is therefore judged by the
database clock, never by a caller's. Semantics are those of
:class:`~asynccoord.contract.membership.MembershipStore`; the schema is
``migration_0001.sql`` and the queries are in ``sql/sqlite/membership.sql``.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ...config import StoreConfig
from ...contract.membership import DEAD_MEMBER_RETENTION_S, Member, MemberBeat, check_leave_args, prepare_beats
from ...events import EventCounter
from ..sqlfiles import load_queries

if TYPE_CHECKING:
    from .writer import GroupCommitter, Operation

__all__ = ("SQLiteMembershipOps",)

Q = load_queries("sqlite")

_Row = tuple[Any, ...]


def _members(rows: Sequence[_Row], now: float) -> list[Member]:
    return [
        Member(
            node_id=row[0],
            incarnation=row[1],
            info=json.loads(row[2]),
            started_at=row[3],
            heartbeat_at=row[4],
            expires_at=row[5],
            heartbeat_age_s=max(0.0, now - row[4]),
        )
        for row in rows
    ]


class SQLiteMembershipOps:
    """The :class:`~asynccoord.contract.membership.MembershipStore` primitives of the SQLite store.

    A mixin: it relies on the store's ``_write`` (group-committed operation), ``_read``,
    ``_w`` (the group committer) and ``config``.
    """

    config: StoreConfig
    events: EventCounter

    if TYPE_CHECKING:

        async def _write(
            self, fn: Operation[Any], undo: Callable[[Any], Operation[Any] | None] | None = None
        ) -> Any: ...

        async def _read(self, fn: Callable[[sqlite3.Connection], Any]) -> Any: ...

        def _w(self) -> GroupCommitter: ...

    async def heartbeat(self, beats: Sequence[MemberBeat], *, ttl_s: float) -> list[Member]:
        """Record every beat and list the live members, in one transaction.

        Each beat upserts its node's row with ``heartbeat_at`` = the store clock now and
        ``expires_at`` = now + ``ttl_s``; ``started_at`` is kept while the incarnation is
        unchanged and reset by a new one (a restarted process reusing the node id).
        Rows dead for longer than ``DEAD_MEMBER_RETENTION_S`` are deleted on the way.
        With no beats this is a read (no write transaction).

        Args:
            beats: One :class:`MemberBeat` per local node (node ids distinct).
            ttl_s: Seconds (0.01, ``validation.MIN_LEASE_S``, to one year) the beaten members stay
                live without another beat.

        Returns:
            Every live member (``expires_at`` after the store clock now), by node id.

        Raises:
            InvalidArgumentError, InvalidTypeError, PayloadTooLargeError: a bad argument;
                nothing written.
            StoreBusyError: the database stayed locked past ``busy_timeout_s``.
            StoreError: the write failed otherwise.
        """
        prepared, ttl = prepare_beats(beats, ttl_s, self.config.max_payload_bytes)
        if not prepared:
            return await self.members()
        params = {"beats": json.dumps(prepared, separators=(",", ":")), "ttl_s": ttl}

        def op(db: sqlite3.Connection, now: float) -> tuple[float, list[_Row]]:
            db.execute(Q["member_purge_dead"], {"now": now, "retention_s": DEAD_MEMBER_RETENTION_S})
            db.execute(Q["member_beat"], {**params, "now": now})
            return now, db.execute(Q["member_live"], {"now": now}).fetchall()

        now, rows = await self._write(op)
        return _members(rows, now)

    async def leave(self, node_id: str, incarnation: str) -> bool:
        """Delete the member row of ``node_id`` if it belongs to ``incarnation``.

        A newer incarnation of the node id (a restarted process) is never removed by
        the leave of an older one.

        Args:
            node_id: The node's id.
            incarnation: The incarnation token it joined with.

        Returns:
            True if that incarnation was live and is now gone; False if the row holds
            another incarnation or none, or had expired (a lapsed row is deleted too).

        Raises:
            InvalidArgumentError, InvalidTypeError: a bad argument.
            StoreError: the write failed.
        """
        node_id, incarnation = check_leave_args(node_id, incarnation)
        key = {"node_id": node_id, "incarnation": incarnation}

        def op(db: sqlite3.Connection, now: float) -> bool:
            row = db.execute(Q["member_leave"], {**key, "now": now}).fetchone()
            return bool(row is not None and row[0])

        return bool(await self._write(op))

    async def members(self) -> list[Member]:
        """The live members (``expires_at`` after the store clock now), by node id.

        Raises:
            StoreError: the read failed.
        """
        writer = self._w()

        def read(db: sqlite3.Connection) -> tuple[float, list[_Row]]:
            now = writer.now(db)
            return now, db.execute(Q["member_live"], {"now": now}).fetchall()

        now, rows = await self._read(read)
        return _members(rows, now)
