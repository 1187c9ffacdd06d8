"""The live view of a :class:`~asynccoord.membership.Membership` and the partitions it assigns.

:class:`MembershipView` is the snapshot of the live members that one heartbeat read.
:class:`MembershipLiveView`, a mixin of the membership, keeps it: each read replaces the view
(only the members draining the membership's queue, and the local nodes, if it names a queue),
its version bumped when the set of live node ids changes; a leave drops its node at once.
Partitions are assigned by rendezvous (highest random weight) hashing over the live node ids
and the nodes joined here (D. Thaler and C. Ravishankar, 1998; see :mod:`asynccoord.partition`);
the sorted live ids and the assignment are kept until the view or the local nodes change.
What a change counts and logs is :mod:`asynccoord.membershipchanges`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .contract.membership import Member, MembershipStore
from .partition import RendezvousTable
from .validation import check_name

if TYPE_CHECKING:
    from .membershipbeats import LocalNode

__all__ = ("MembershipLiveView", "MembershipView")


@dataclass(frozen=True, slots=True, kw_only=True)
class MembershipView:
    """The live members as of one heartbeat (a snapshot; never changes).

    Attributes:
        members: The live members, sorted by node id.
        node_ids: Their node ids, sorted.
        version: 0 before the first heartbeat, 1 after it, then + 1 every time the set
            of live node ids changes (a join, a leave, an expiry). Changes of
            incarnation or info alone keep the version.
        taken_at: ``time.monotonic()`` of this process when the members were read.
    """

    members: tuple[Member, ...]
    node_ids: tuple[str, ...]
    version: int
    taken_at: float

    def __contains__(self, node_id: object) -> bool:
        return node_id in self.node_ids

    def __repr__(self) -> str:
        return f"<MembershipView version={self.version} node_ids={list(self.node_ids)}>"


class MembershipLiveView:
    """The live view of a :class:`~asynccoord.membership.Membership` and its partition ownership.

    A mixin: it relies on the membership's settings and local nodes, and on what a change of
    the view counts (``_changed_to``, ``_reports``, ``_count_flaps``).
    """

    store: MembershipStore
    queue: str | None
    _local: dict[str, LocalNode]
    _local_changes: int
    _view: MembershipView
    _live_cache: tuple[MembershipView, int, tuple[str, ...], frozenset[str]] | None
    _assignment: tuple[tuple[str, ...], Mapping[str, frozenset[int]]] | None
    _table: RendezvousTable | None

    if TYPE_CHECKING:

        def _changed_to(self, old: MembershipView, first: bool, leaving: str | None = None) -> None: ...

        def _reports(self, old: MembershipView, new: MembershipView, leaving: str | None) -> bool: ...

        def _count_flaps(self, old: MembershipView, new: MembershipView) -> None: ...

    def owned_partitions(self, node_id: str) -> frozenset[int]:
        """The partitions ``node_id`` owns among the live nodes (it counts as live itself).

        Live nodes are those of the current view plus every node joined in this
        process. Rendezvous hashing, see :mod:`asynccoord.partition`.

        Raises:
            InvalidArgumentError, InvalidTypeError: a malformed ``node_id``.
        """
        check_name("node_id", node_id)
        live, members = self._live_with_set()
        if node_id not in members:
            return self._rendezvous().assign((*live, node_id))[node_id]
        return self._assigned(live)[node_id]

    def _live(self) -> tuple[str, ...]:
        return self._live_with_set()[0]

    def _live_with_set(self) -> tuple[tuple[str, ...], frozenset[str]]:
        """The live node ids, sorted, and as a set; kept until the view or the local nodes change.

        A node's claims and the senders that check ownership ask for it per task: built
        anew each time it cost O(n log n) in the cluster's node count (about 40 us with 128
        nodes), in the event loop every node of the process shares.
        """
        view, changes, cache = self._view, self._local_changes, self._live_cache
        if cache is not None and cache[0] is view and cache[1] == changes:
            return cache[2], cache[3]
        members = frozenset(view.node_ids).union(self._local)
        live = tuple(sorted(members))
        self._live_cache = (view, changes, live, members)
        return live, members

    def _rendezvous(self) -> RendezvousTable:
        table = self._table
        if table is None:
            table = self._table = RendezvousTable(self.store.partitions)
        return table

    def _assigned(self, live: tuple[str, ...]) -> Mapping[str, frozenset[int]]:
        """The assignment of the partitions to ``live`` (kept until the live nodes change)."""
        cached = self._assignment
        if cached is not None and (cached[0] is live or cached[0] == live):  # _live() keeps its tuple
            if cached[0] is not live:  # the same nodes in a new view: compared by identity from now on
                self._assignment = (live, cached[1])
            return cached[1]
        assignment = self._rendezvous().assign(live)
        self._assignment = (live, assignment)
        return assignment

    def _apply(self, members: list[Member]) -> None:
        if self.queue is not None:  # the members draining this queue, and ours
            queue, local = self.queue, self._local
            members = [m for m in members if m.node_id in local or m.info.get("queue") == queue]
        old = self._view
        node_ids = tuple(m.node_id for m in members)
        first = old.version == 0
        changed = first or node_ids != old.node_ids
        version = old.version + 1 if changed else old.version
        taken_at = time.monotonic()
        self._view = MembershipView(members=tuple(members), node_ids=node_ids, version=version, taken_at=taken_at)
        if changed:
            self._changed_to(old, first)
            return
        restarted = any(a.incarnation != b.incarnation for a, b in zip(old.members, members, strict=True))
        if restarted and self._reports(old, self._view, None):  # a node id reused by a restart between two reads
            self._count_flaps(old, self._view)

    def _drop_from_view(self, node_id: str, *, leaving: str | None = None) -> None:
        old = self._view
        if node_id not in old.node_ids:
            return
        members = tuple(m for m in old.members if m.node_id != node_id)
        self._view = MembershipView(
            members=members,
            node_ids=tuple(m.node_id for m in members),
            version=old.version + 1,
            taken_at=old.taken_at,
        )
        self._changed_to(old, False, leaving)
