"""What a change of a :class:`~asynccoord.membership.Membership`'s view counts and logs: changes, lost nodes, flaps.

:class:`MembershipChanges` is a mixin of the membership. Every process sees each change of the
live nodes; only the process holding the smallest node id that beat recently counts it
(``membership_change``), so the cluster's count does not grow with its number of processes.
That process also counts the nodes lost (``node_lost``: gone from the view once their expiry
had passed by the store clock, so their heartbeats stopped: they did not leave) and the short
lives (``membership_flap``: a process's nodes that left less than :data:`FLAP_TTLS` heartbeat
TTLs after joining). Every change logs the nodes that joined and left, recomputes the
partition assignment and wakes the view's listeners and waiters.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from . import events as ev
from .contract.membership import Member, MembershipStore
from .errors import CoordError

if TYPE_CHECKING:
    from .membershipbeats import LocalNode
    from .membershipview import MembershipView

__all__ = ("FLAP_TTLS", "MembershipChanges")

log = logging.getLogger("asynccoord.membership")  # the log lines keep the membership module's logger name

FLAP_TTLS = 6
"""A node life shorter than this many of its heartbeat TTLs is a flap (``membership_flap``): 30 s
at the default ``ttl_s`` of 5 s. A process restarting again and again lives less; a rolling restart
restarts processes that had run longer, unless one started, or was restarted, less than that before."""


class MembershipChanges:
    """What a change of a :class:`~asynccoord.membership.Membership`'s view counts and logs.

    A mixin: it relies on the membership's settings, its local nodes, its view and partition
    assignment (``_view``, ``_live``, ``_assigned``) and its subscriptions (``_signal``).
    """

    store: MembershipStore
    ttl_s: float
    _local: dict[str, LocalNode]
    _view: MembershipView
    _flapped: dict[tuple[str, str], float]

    if TYPE_CHECKING:

        def _live(self) -> tuple[str, ...]: ...

        def _assigned(self, live: tuple[str, ...]) -> Mapping[str, frozenset[int]]: ...

        def _signal(self) -> None: ...

    def _reports(self, old: MembershipView, new: MembershipView, leaving: str | None) -> bool:
        """Whether this process counts the change from ``old`` to ``new`` (``membership_change``).

        Every process sees a change of the live nodes, so each counting it would make the
        cluster's total grow with the number of processes (a rolling restart of a few
        processes looked like churn). The change is counted by the process holding the
        smallest node id that heartbeat within half the TTL, in the view before it or after
        it (``leaving``: a local node leaving now), so by one process, or two when that node
        itself comes or goes. A crashed node not yet expired is passed over once its last
        beat is that old; a change within that time of its crash (a restart's join, say) may
        go uncounted. (Late beats under load would make a shorter bound count changes twice.)
        """
        local = self._local.keys() | ({leaving} if leaving is not None else set())
        fresh_s = self.ttl_s / 2  # a crashed or frozen node reports nothing
        for view in (old, new):
            fresh = [m.node_id for m in view.members if m.heartbeat_age_s <= fresh_s]
            if fresh and min(fresh) in local:
                return True
        return False

    def _lost(self, old: MembershipView, new: MembershipView, leaving: str | None) -> list[tuple[str, float]]:
        """The nodes of ``old`` that left ``new`` by expiring (``node_lost``), with their last heartbeat's age (s).

        A node leaving with its process's shutdown is deleted from the store before it
        expires; one whose heartbeats stopped (a crash, a kill, a freeze) stays until its
        ``expires_at``. So a node that is gone and whose expiry, as ``old`` saw it, has
        passed by the store clock of the read behind ``new`` was lost. That holds only if this
        process read the members often enough to see the node's later heartbeats: when its two
        reads are half the TTL apart or more on the store clock (this process or the store
        stalled, or the store clock stepped), a node that left meanwhile may have beaten and
        left cleanly after the expiry ``old`` shows, and nothing is counted (a loss then may go
        uncounted). A node leaving here (``leaving``, local nodes) never is lost.
        """
        gone = set(old.node_ids) - set(new.node_ids) - self._local.keys() - {leaving}
        if not gone or not new.members or not old.members:
            return []
        read_at = max(m.heartbeat_at + m.heartbeat_age_s for m in new.members)  # the store clock at the read
        if read_at - max(m.heartbeat_at + m.heartbeat_age_s for m in old.members) >= self.ttl_s / 2:
            return []
        return [
            (m.node_id, read_at - m.heartbeat_at) for m in old.members if m.node_id in gone and read_at >= m.expires_at
        ]

    def _flaps(self, old: MembershipView, new: MembershipView) -> list[tuple[Member, float]]:
        """The lives that ended between ``old`` and ``new`` as flaps, one member each, with how long it lived (s).

        A life ends when its node leaves the view (a leave or an expiry) or comes back under
        a new incarnation (a restart reusing the node id). It lived from its ``started_at`` to
        the store clock of the read behind ``new`` (plus the local time since that read), or to
        the new incarnation's ``started_at``: a read late, so under load a life only looks
        longer (a flap may go uncounted, a long life is never counted). It is a flap when it
        lived less than :data:`FLAP_TTLS` of its own TTL. The nodes of one process (one
        ``"runtime"`` in their info; else each node alone) are one life, counted once even when
        they leave in several changes.
        """
        now = time.monotonic()
        self._flapped = {life: at for life, at in self._flapped.items() if now - at < FLAP_TTLS * self.ttl_s}
        reads = new.members or old.members
        if not reads:
            return []
        ended_at = max(m.heartbeat_at + m.heartbeat_age_s for m in reads) + max(0.0, now - new.taken_at)
        after = {m.node_id: m for m in new.members}
        flaps: list[tuple[Member, float]] = []
        for member in old.members:
            next_life = after.get(member.node_id)
            if next_life is not None and next_life.incarnation == member.incarnation:
                continue
            lived_s = (ended_at if next_life is None else min(ended_at, next_life.started_at)) - member.started_at
            if lived_s >= FLAP_TTLS * (member.expires_at - member.heartbeat_at):
                continue
            runtime = member.info.get("runtime")
            life = ("runtime", runtime) if isinstance(runtime, str) else ("incarnation", member.incarnation)
            if life not in self._flapped:
                self._flapped[life] = now
                flaps.append((member, lived_s))
        return flaps

    def _count_flaps(self, old: MembershipView, new: MembershipView) -> None:
        flaps = self._flaps(old, new)
        if flaps:
            self.store.events.add(ev.MEMBERSHIP_FLAP, len(flaps))
        for member, lived_s in flaps:
            log.info(
                "asynccoord.membership.flap node=%s runtime=%s lived_s=%.1f: its process left the live nodes %d "
                "heartbeat TTLs or less after joining (restarting again and again?)",
                member.node_id,
                member.info.get("runtime"),
                lived_s,
                FLAP_TTLS,
                extra={"event": "asynccoord.membership.flap"},
            )

    def _changed_to(self, old: MembershipView, first: bool, leaving: str | None = None) -> None:
        new = self._view
        if not first:
            if self._reports(old, new, leaving):
                self.store.events.add(ev.MEMBERSHIP_CHANGE)
                self._count_flaps(old, new)
                lost = self._lost(old, new, leaving)
                if lost:
                    self.store.events.add(ev.NODE_LOST, len(lost))
                for node_id, age_s in lost:
                    log.warning(
                        "asynccoord.membership.node_lost node=%s last_heartbeat_age_s=%.1f ttl_s=%g: its heartbeats "
                        "stopped (a crash, a kill or a freeze); its leases and locks lapse at their TTLs",
                        node_id,
                        age_s,
                        self.ttl_s,
                        extra={"event": "asynccoord.membership.node_lost"},
                    )
            joined = sorted(set(new.node_ids) - set(old.node_ids))
            left = sorted(set(old.node_ids) - set(new.node_ids))
            log.info(
                "asynccoord.membership.changed version=%d live=%d joined=%s left=%s",
                new.version,
                len(new.node_ids),
                joined,
                left,
                extra={"event": "asynccoord.membership.changed"},
            )
        if self._local:  # the new assignment now, not in the nodes' next claim (which would raise what this does)
            with contextlib.suppress(CoordError):
                self._assigned(self._live())
        self._signal()
