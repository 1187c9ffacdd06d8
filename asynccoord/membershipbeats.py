"""The heartbeats of a :class:`~asynccoord.membership.Membership`: one write for every node of the process.

:class:`MembershipHeartbeats` is a mixin of the membership. Its task sends, every
``interval_s`` and at once after a join, one ``heartbeat`` call that carries every node
joined in the process (:class:`LocalNode`: its incarnation and info), one transaction in the
store, and hands the live members the store returns to the view
(:mod:`asynccoord.membershipview`). Liveness is judged by the store's clock; the local
deadline behind :attr:`~asynccoord.membership.Membership.healthy` runs from the moment a
beat was sent, before the store stamped it, so the store never expires a member before its
process knows it may have (a lease's local deadline, as in M. Kleppmann's "How to do
distributed locking", 2016). A failed beat is logged and retried at the next interval; a
node id that another live incarnation heartbeats is warned about.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .contract.membership import Member, MemberBeat, MembershipStore
from .errors import StoreError

if TYPE_CHECKING:
    from .membershipstats import MembershipStats

__all__ = ("LocalNode", "MembershipHeartbeats")

log = logging.getLogger("asynccoord.membership")  # the log lines keep the membership module's logger name


@dataclass(frozen=True, slots=True)
class LocalNode:
    """A node joined in this process: the incarnation and the info its heartbeats carry."""

    incarnation: str
    info: dict[str, Any]


class MembershipHeartbeats:
    """The heartbeats of a :class:`~asynccoord.membership.Membership`.

    A mixin: it relies on the membership's settings, its local nodes and counters, its
    health (``healthy``, ``statistics``) and its view (``_apply``).
    """

    store: MembershipStore
    ttl_s: float
    interval_s: float
    _local: dict[str, LocalNode]
    _wake: asyncio.Event
    _io_lock: asyncio.Lock
    _last_ok: float | None
    _heartbeats: int
    _failures: int
    _consecutive_failures: int
    _last_error: Exception | None
    _reported_unhealthy: bool
    _started_at: dict[str, float]

    if TYPE_CHECKING:

        @property
        def healthy(self) -> bool: ...

        def statistics(self) -> MembershipStats: ...

        def _apply(self, members: list[Member]) -> None: ...

    async def _run(self) -> None:
        next_at = time.monotonic() + self.interval_s
        while True:
            delay = next_at - time.monotonic()
            if delay > 0:
                try:
                    async with asyncio.timeout(delay):
                        await self._wake.wait()
                except TimeoutError:
                    pass
            next_at = time.monotonic() + self.interval_s
            await self._beat()

    async def _beat(self, *, raise_errors: bool = False) -> bool:
        """One heartbeat of every local node; update the view. False if it failed."""
        async with self._io_lock:
            self._wake.clear()  # every node joined so far is in this beat
            beats = [
                MemberBeat(node_id=node_id, incarnation=local.incarnation, info=local.info)
                for node_id, local in self._local.items()
            ]
            sent = time.monotonic()
            try:
                members = await self.store.heartbeat(beats, ttl_s=self.ttl_s)
            except Exception as exc:
                self._failures += 1
                self._consecutive_failures += 1
                self._last_error = exc
                if raise_errors:
                    raise
                self._report_failure(exc, len(beats))
                return False
        previous_ok = self._last_ok
        self._last_ok = sent
        self._heartbeats += 1
        self._consecutive_failures = 0
        self._last_error = None
        if self._reported_unhealthy:
            self._reported_unhealthy = False
            log.info("asynccoord.membership.recovered", extra={"event": "asynccoord.membership.recovered"})
        fresh = previous_ok is not None and sent - previous_ok < self.ttl_s
        self._check_incarnations(beats, members, fresh)
        self._apply(members)
        return True

    def _report_failure(self, exc: Exception, nodes: int) -> None:
        event = "asynccoord.membership.heartbeat_failed"
        if isinstance(exc, StoreError):
            log.warning(
                "%s nodes=%d consecutive=%d error=%s: %s",
                event,
                nodes,
                self._consecutive_failures,
                type(exc).__name__,
                exc,
                extra={"event": event},
            )
        else:  # a bug, not an outage: keep beating (a dead heartbeat task is worse) but say so loudly
            log.error("%s nodes=%d", event, nodes, exc_info=exc, extra={"event": event})
        if not self.healthy and not self._reported_unhealthy:
            self._reported_unhealthy = True
            log.warning(
                "asynccoord.membership.unhealthy last_heartbeat_age_s=%s ttl_s=%g: nodes must stop claiming",
                self.statistics().last_heartbeat_age_s,
                self.ttl_s,
                extra={"event": "asynccoord.membership.unhealthy"},
            )

    def _check_incarnations(self, beats: list[MemberBeat], members: list[Member], fresh: bool) -> None:
        """Warn when another process heartbeats one of our node ids (started_at moved under us)."""
        by_id = {m.node_id: m for m in members}
        for beat in beats:
            member = by_id.get(beat.node_id)
            if member is None or member.incarnation != beat.incarnation:
                continue
            seen = self._started_at.get(beat.node_id)
            self._started_at[beat.node_id] = member.started_at
            if fresh and seen is not None and seen != member.started_at:
                log.warning(
                    "asynccoord.membership.node_id_conflict node=%s: another incarnation heartbeat this node id "
                    "since our last beat; two live processes must not share a node id",
                    beat.node_id,
                    extra={"event": "asynccoord.membership.node_id_conflict"},
                )
