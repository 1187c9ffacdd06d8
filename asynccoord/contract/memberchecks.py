"""Argument checks and constants shared by every membership backend, so all validate alike."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from ..errors import InvalidArgumentError, InvalidTypeError
from ..validation import check_lease_s, check_name, encode_payload
from .membership import MemberBeat

__all__ = ("DEAD_MEMBER_RETENTION_S", "PreparedBeat", "check_leave_args", "prepare_beats")

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
