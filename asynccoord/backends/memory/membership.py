"""Node membership in plain Python objects: the reference semantics.

:class:`MemoryMembershipOps` is a mixin of :class:`~asynccoord.backends.memory.store.MemoryStore`.
Each method hands control to the loop once at its entry (the store's ``_enter``), then
runs to completion without awaiting, so each is atomic; liveness is judged by the store's
injectable clock (``self._clock``), which makes expiry
deterministic in tests. Semantics are those of
:class:`~asynccoord.contract.membership.MembershipStore`; the SQLite implementation
(:mod:`.sqlite_membership`) must behave the same.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...config import StoreConfig
from ...contract.membership import DEAD_MEMBER_RETENTION_S, Member, MemberBeat, check_leave_args, prepare_beats
from ...events import EventCounter

__all__ = ("MemoryMembershipOps",)


@dataclass(slots=True)
class _MemberRow:
    incarnation: str
    info_json: str
    started_at: float
    heartbeat_at: float
    expires_at: float


class MemoryMembershipOps:
    """The :class:`~asynccoord.contract.membership.MembershipStore` primitives of the in-memory store.

    A mixin: it relies on the store's ``_clock``, ``_enter`` and ``config``.
    """

    config: StoreConfig
    events: EventCounter
    _clock: Callable[[], float]

    if TYPE_CHECKING:

        async def _enter(self) -> None: ...

    @functools.cached_property
    def _member_rows(self) -> dict[str, _MemberRow]:
        return {}

    def _live_members(self, now: float) -> list[Member]:
        rows = self._member_rows
        return [
            Member(
                node_id=node_id,
                incarnation=row.incarnation,
                started_at=row.started_at,
                heartbeat_at=row.heartbeat_at,
                expires_at=row.expires_at,
                heartbeat_age_s=max(0.0, now - row.heartbeat_at),
                info=json.loads(row.info_json),
            )
            for node_id, row in sorted(rows.items())
            if row.expires_at > now
        ]

    async def heartbeat(self, beats: Sequence[MemberBeat], *, ttl_s: float) -> list[Member]:
        """Record every beat atomically, then list the live members (see the SQLite store).

        Raises:
            InvalidArgumentError, InvalidTypeError, PayloadTooLargeError: a bad argument;
                nothing written.
        """
        prepared, ttl = prepare_beats(beats, ttl_s, self.config.max_payload_bytes)
        await self._enter()
        now = self._clock()
        rows = self._member_rows
        cutoff = now - DEAD_MEMBER_RETENTION_S
        for node_id in [n for n, row in rows.items() if row.expires_at <= cutoff]:
            del rows[node_id]
        for node_id, incarnation, info_json in prepared:
            old = rows.get(node_id)
            started_at = old.started_at if old is not None and old.incarnation == incarnation else now
            rows[node_id] = _MemberRow(
                incarnation=incarnation,
                info_json=info_json,
                started_at=started_at,
                heartbeat_at=now,
                expires_at=now + ttl,
            )
        return self._live_members(now)

    async def leave(self, node_id: str, incarnation: str) -> bool:
        """Delete the member row of ``node_id`` if it belongs to ``incarnation``.

        Returns:
            True if that incarnation was live and is now gone; False otherwise.

        Raises:
            InvalidArgumentError, InvalidTypeError: a bad argument.
        """
        node_id, incarnation = check_leave_args(node_id, incarnation)
        await self._enter()
        now = self._clock()
        row = self._member_rows.get(node_id)
        if row is None or row.incarnation != incarnation:
            return False
        del self._member_rows[node_id]
        return row.expires_at > now

    async def members(self) -> list[Member]:
        """The live members (expiry after the store clock now), by node id."""
        await self._enter()
        return self._live_members(self._clock())
