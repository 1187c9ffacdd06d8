"""The membership contract: the :class:`MembershipStore` Protocol, its records, and the checks of a heartbeat.

Records are frozen, keyword-only, slotted dataclasses, like those of
:mod:`asynccoord.models`. Times (``started_at``, ``heartbeat_at``, ``expires_at``) are
seconds since the Unix epoch *on the store's clock*; durations are seconds. Never
compare them with ``time.time()`` of another process or machine: how old a heartbeat
is comes computed by the store as ``Member.heartbeat_age_s``. The checks are shared by
every engine, so all of them validate alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast, runtime_checkable

from ..config import StoreConfig
from ..errors import InvalidArgumentError, InvalidTypeError
from ..events import EventCounter
from ..validation import check_lease_s, check_name, encode_payload

__all__ = (
    "DEAD_MEMBER_RETENTION_S",
    "Member",
    "MemberBeat",
    "MembershipStore",
    "PreparedBeat",
    "check_leave_args",
    "prepare_beats",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberBeat:
    """One node's heartbeat, as handed to :meth:`~asynccoord.contract.membership.MembershipStore.heartbeat`.

    Args:
        node_id: The node's id, 1..255 characters; stable across restarts if you like
            (ownership of partitions follows it).
        incarnation: Random per start of the node (1..255 characters): a restarted
            process that reuses ``node_id`` must use a new one, so the store can tell
            the old life from the new (``started_at`` is reset, and a ``leave`` of the
            old incarnation does not remove the new one).
        info: Free JSON object about the node (host, pid, version...), for
            inspection. Default ``{}``. Its size is checked by the store against
            ``config.max_payload_bytes``.

    Raises:
        InvalidArgumentError, InvalidTypeError: a bad field, naming it and the value.
    """

    node_id: str
    incarnation: str
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_name("node_id", self.node_id)
        check_name("incarnation", self.incarnation)
        if not isinstance(self.info, dict):
            raise InvalidTypeError(f"info must be a dict (a JSON object), got {type(self.info).__name__}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Member:
    """A live member of the cluster, as the store saw it.

    Attributes:
        node_id: The node's id.
        incarnation: The token of the node's current life (see :class:`MemberBeat`).
        started_at: First heartbeat of this incarnation (store clock).
        heartbeat_at: Last heartbeat (store clock).
        expires_at: When the member is dead unless it heartbeats again:
            ``heartbeat_at + ttl_s`` of its last beat (store clock).
        heartbeat_age_s: Store clock at the read minus ``heartbeat_at``, seconds (>= 0).
        info: The JSON object of the last heartbeat.
    """

    node_id: str
    incarnation: str
    started_at: float
    heartbeat_at: float
    expires_at: float
    heartbeat_age_s: float
    info: dict[str, Any]

    def __repr__(self) -> str:
        return (
            f"<Member {self.node_id!r} incarnation={self.incarnation[:8]} heartbeat_age_s={self.heartbeat_age_s:.3f}"
            f" expires_at={self.expires_at:.3f}>"
        )


@runtime_checkable
class MembershipStore(Protocol):
    """Node membership with heartbeats, over one database.

    These are the storage primitives; the heartbeat task, the view of live nodes and
    partition ownership live in :mod:`asynccoord.membership`, the same for every
    backend. Semantics:

    * A member is one row per node id holding its current *incarnation* (random per
      start of the node). It is live while its ``expires_at`` is after the store
      clock; liveness is judged by the store clock inside the statement, never by a
      caller's clock, so processes on different machines agree.
    * ``heartbeat`` upserts every beat and lists the live members in one atomic step:
      one call per interval covers every node of a process. ``started_at`` is kept
      while the incarnation is unchanged and reset by a new one.
    * ``leave`` is a compare-and-set on ``(node_id, incarnation)``: a restarted process
      reusing a node id is never removed by the leave of its previous life.

    Every method validates its arguments before touching the database and raises
    :class:`~asynccoord.errors.InvalidArgumentError` or
    :class:`~asynccoord.errors.InvalidTypeError` naming the value, with nothing written.
    """

    config: StoreConfig
    events: EventCounter

    async def now(self) -> float:
        """The store clock: seconds since the Unix epoch."""
        ...

    @property
    def partitions(self) -> int:
        """Number of fixed partitions keys are hashed into (what membership divides up)."""
        ...

    async def heartbeat(self, beats: Sequence[MemberBeat], *, ttl_s: float) -> list[Member]:
        """Record every beat, then return all live members by node id, in one transaction.

        Args:
            beats: One :class:`~asynccoord.contract.membership.MemberBeat` per local node
                (node ids distinct; may be empty, which only lists).
            ttl_s: Seconds (0.01, ``validation.MIN_LEASE_S``, to one year) the beaten members stay
                live (store clock).

        Returns:
            The live members, sorted by node id.
        """
        ...

    async def leave(self, node_id: str, incarnation: str) -> bool:
        """Delete the member row only if it holds ``incarnation``; True if it was live."""
        ...

    async def members(self) -> list[Member]:
        """The live members, sorted by node id."""
        ...


DEAD_MEMBER_RETENTION_S = 3600.0
"""A member row that expired more than this long ago (store clock) is deleted by the
next heartbeat of anyone. Until then a late heartbeat of the same incarnation keeps
its ``started_at``; dead rows are never listed either way."""

PreparedBeat = tuple[str, str, str]
"""``(node_id, incarnation, info as JSON text)`` of one validated beat."""


def prepare_beats(beats: object, ttl_s: object, max_info_bytes: int) -> tuple[list[PreparedBeat], float]:
    """Validate the arguments of a heartbeat; return the beats with ``info`` encoded, and ``ttl_s``.

    Args:
        beats: A list or tuple of :class:`MemberBeat`, at most one per node id.
        ttl_s: Seconds (0.01, ``validation.MIN_LEASE_S``, to one year) each member stays live after
            this beat (store clock).
        max_info_bytes: Size limit of each encoded ``info``, bytes.

    Raises:
        InvalidTypeError: ``beats`` is not a list/tuple of MemberBeat, an ``info`` holds
            a value JSON cannot encode, or ``ttl_s`` is not a number.
        InvalidArgumentError: a node id appears twice, ``ttl_s`` <= 0 or not finite,
            or an ``info`` does not round-trip through JSON.
        PayloadTooLargeError: an ``info`` encodes to more than ``max_info_bytes``.
    """
    if not isinstance(beats, list | tuple):
        raise InvalidTypeError(f"beats must be a list or tuple of MemberBeat, got {type(beats).__name__}")
    ttl = check_lease_s("ttl_s", ttl_s)
    prepared: list[PreparedBeat] = []
    seen: set[str] = set()
    for index, beat in enumerate(cast(Sequence[object], beats)):
        if not isinstance(beat, MemberBeat):
            raise InvalidTypeError(f"beats[{index}] must be a MemberBeat, got {type(beat).__name__}")
        if beat.node_id in seen:
            raise InvalidArgumentError(
                f"beats[{index}].node_id {beat.node_id!r} appears twice: send one beat per node id"
            )
        seen.add(beat.node_id)
        if not isinstance(beat.info, dict):
            raise InvalidTypeError(f"beats[{index}].info must be a dict, got {type(beat.info).__name__}")
        info_json = encode_payload(beat.info, max_bytes=max_info_bytes, arg=f"beats[{index}].info")
        prepared.append((beat.node_id, beat.incarnation, info_json))
    return prepared, ttl


def check_leave_args(node_id: object, incarnation: object) -> tuple[str, str]:
    """Validate the arguments of ``leave``.

    Raises:
        InvalidTypeError, InvalidArgumentError: naming the bad argument and value.
    """
    check_name("node_id", node_id)
    check_name("incarnation", incarnation)
    return cast(str, node_id), cast(str, incarnation)
