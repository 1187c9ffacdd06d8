"""Records of the membership contract: a heartbeat to write, and a live member as stored.

Both are frozen, keyword-only, slotted dataclasses, like those of
:mod:`asynccoord.models`. Times (``started_at``, ``heartbeat_at``, ``expires_at``) are
seconds since the Unix epoch *on the store's clock*; durations are seconds. Never
compare them with ``time.time()`` of another process or machine: how old a heartbeat
is comes computed by the store as ``Member.heartbeat_age_s``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidTypeError
from ..validation import check_name

__all__ = ("Member", "MemberBeat")


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberBeat:
    """One node's heartbeat, as handed to :meth:`~asynccoord.contract.protocols.MembershipStore.heartbeat`.

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
