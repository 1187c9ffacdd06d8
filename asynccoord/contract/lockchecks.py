"""Argument checks and helpers shared by every lock backend, so all of them validate alike."""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Sequence
from typing import Any, cast

from ..errors import FencingTokenRejectedError, InvalidArgumentError, InvalidTypeError
from ..validation import check_int, check_lease_s, check_name, encode_payload
from .locks import Lease

__all__ = (
    "MAX_FENCING_TOKEN",
    "MAX_PERMITS",
    "PLACE_PREFIX",
    "check_fence_args",
    "check_lease",
    "check_leases",
    "check_lock_request",
    "check_user_lock_name",
    "default_holder",
    "encode_fence_data",
    "fence_rejected_error",
)

MAX_FENCING_TOKEN = 2**63 - 1
"""Largest fencing token (SQLite and PostgreSQL ``bigint``)."""

MAX_PERMITS = 2**31 - 1
"""Largest permit count of a semaphore."""


@functools.cache
def _hostname() -> str:
    return socket.gethostname()[:200]


def default_holder() -> str:
    """``"<host>:<pid>"``: the holder recorded when none is given (for inspection only)."""
    return f"{_hostname()}:{os.getpid()}"


PLACE_PREFIX = "asynccoord.next:"
"""The prefix of the lock names :class:`~asynccoord.locks.pool.LockPool` keeps its places in line under."""


def check_user_lock_name(arg: str, name: object) -> str:
    """Check a lock name given to :class:`~asynccoord.locks.lock.Lock`, ``Semaphore`` or ``LockPool``.

    Raises:
        InvalidTypeError, InvalidArgumentError: not a valid name, or one in the reserved
            prefix :data:`PLACE_PREFIX` (a user lock there would stand in a pool's line).
    """
    check_name(arg, name)
    text = cast(str, name)
    if text.startswith(PLACE_PREFIX):
        raise InvalidArgumentError(
            f"{arg} {text!r} is in the prefix {PLACE_PREFIX!r}, reserved for LockPool's places in line"
        )
    return text


def check_lock_request(name: object, ttl_s: object, permits: object, holder: object) -> tuple[str, float, int, str]:
    """Validate the arguments of an acquisition; return them normalized.

    Raises:
        InvalidTypeError, InvalidArgumentError: naming the bad argument and value.
    """
    check_name("name", name)
    ttl = check_lease_s("ttl_s", ttl_s)
    count = check_int("permits", permits, minimum=1, maximum=MAX_PERMITS)
    check_name("holder", holder, allow_empty=True)
    return cast(str, name), ttl, count, cast(str, holder)


def check_lease(lease: object, arg: str = "lease") -> Lease:
    """Check that ``lease`` is a :class:`Lease` as returned by an acquisition.

    The fields a store reads from the caller's copy (``name``, ``owner_token``,
    ``fencing_token``, ``holder``, ``permits`` and ``ttl_s``, the default length of a
    renewal) are checked too, so a tampered or hand-made Lease is refused with a typed
    error before it reaches the database or Redis.

    Raises:
        InvalidTypeError: not a Lease, or a field of the wrong type.
        InvalidArgumentError: a field out of range (``ttl_s`` not in (0, one year], a
            fencing token outside ``1..2**63-1``, an empty owner token...).
    """
    if not isinstance(lease, Lease):
        raise InvalidTypeError(f"{arg} must be a Lease returned by an acquisition, got {type(lease).__name__}")
    check_name(f"{arg}.name", lease.name)
    check_name(f"{arg}.owner_token", lease.owner_token)
    check_int(f"{arg}.fencing_token", lease.fencing_token, minimum=1, maximum=MAX_FENCING_TOKEN)
    check_name(f"{arg}.holder", lease.holder, allow_empty=True)
    check_int(f"{arg}.permits", lease.permits, minimum=1, maximum=MAX_PERMITS)
    check_lease_s(f"{arg}.ttl_s", lease.ttl_s)
    return lease


def check_leases(leases: object) -> list[Lease]:
    """Check a list or tuple of leases (for a renewal: one lease may appear more than once).

    Raises:
        InvalidTypeError: not a list/tuple, or an item that is not a Lease.
        InvalidArgumentError: an item as :func:`check_lease` refuses it, or one lease (one
            owner token) given twice with different ``ttl_s``: a renewal cannot extend it
            by both, and each answer would say it had.
    """
    if not isinstance(leases, list | tuple):
        raise InvalidTypeError(f"leases must be a list or tuple of Lease, got {type(leases).__name__}")
    checked = [check_lease(item, f"leases[{index}]") for index, item in enumerate(cast(Sequence[object], leases))]
    first: dict[str, int] = {}
    for index, lease in enumerate(checked):
        seen = first.setdefault(lease.owner_token, index)
        if checked[seen].ttl_s != lease.ttl_s:
            raise InvalidArgumentError(
                f"leases[{index}] is the lease of leases[{seen}] (lock {lease.name!r}) with another ttl_s"
                f" ({lease.ttl_s!r} against {checked[seen].ttl_s!r}): give each lease once per renewal"
            )
    return checked


def check_fence_args(resource: object, fencing_token: object) -> tuple[str, int]:
    """Validate a fencing call's resource name and token (an int in 1..2**63-1).

    Raises:
        InvalidTypeError, InvalidArgumentError: naming the bad argument and value.
    """
    check_name("resource", resource)
    token = check_int("fencing_token", fencing_token, minimum=1, maximum=MAX_FENCING_TOKEN)
    return cast(str, resource), token


def encode_fence_data(data: Any, max_bytes: int) -> str:
    """JSON text of the data of a fenced write (see :func:`asynccoord.validation.encode_payload`)."""
    return encode_payload(data, max_bytes=max_bytes, arg="data")


def fence_rejected_error(resource: str, fencing_token: int, highest: int) -> FencingTokenRejectedError:
    """The error for a refused fencing token, naming the resource and both tokens."""
    return FencingTokenRejectedError(
        f"fencing token {fencing_token} for resource {resource!r} is lower than {highest}, which the "
        "resource has already accepted: the lock behind the token was lost and a later holder has written"
    )
