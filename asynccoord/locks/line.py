"""The place in line of a pooled lock: its name, and what its holder tells the pool holding the lock.

Pools of several processes that want one hot lock queue through a single extra lease, the
*place in line* (:func:`next_in_line` of the lock's name): the idea of a fair lock's queue of
waiters (Redisson's ``RFairLock`` on Redis), reduced to one place and built on the lock
contract alone. Its holder names the pool waiting there and the rank of the waiter it queues
for (``"<holder> rank=<priority>:<order>"``, as ``status`` shows it), so the pool holding the
lock can keep it for a waiter of its own that ranks ahead (:class:`~asynccoord.locks.pool.LockPool`).
"""

from __future__ import annotations

import hashlib
import re

from ..contract.locks import PLACE_PREFIX as _PLACE_PREFIX
from ..validation import MAX_NAME_LENGTH

__all__ = ("PLACE_PREFIX", "Rank", "ahead", "next_in_line", "own_place", "place_holder", "place_id", "shown_rank")

PLACE_PREFIX = _PLACE_PREFIX
"""The prefix of the names of places in line (see :func:`next_in_line`); refused in user lock names."""

Rank = tuple[int, int]
"""A waiter's place among all pools' waiters: (-priority, order); the lower goes first."""

_RANK_MARK = " rank="
"""Separates a pool's holder from the rank of the waiter it queues for, in its place's holder."""
_UNRANKED = "-"
"""What a place shows after the mark for a waiter without a rank."""
_LONG_HOLDER = "asynccoord.holder:"
"""Places of a pool whose holder is too long to carry a rank show this and a digest of it."""
_LONGEST_RANK = len(f"{-(2**31)}:{-(2**63)}")
_RANK_TEXT = re.compile(r"(-?[0-9]{1,11}):(-?[0-9]{1,20})")


def next_in_line(name: str) -> str:
    """The name of the lock that marks who is next in line for lock ``name``.

    A fixed-length name (BLAKE2b of ``name``), so any lock name has one, in a prefix of
    its own, :data:`PLACE_PREFIX`.
    """
    return PLACE_PREFIX + hashlib.blake2b(name.encode(), digest_size=16).hexdigest()


def place_id(holder: str) -> str:
    """Who a pool of ``holder`` is in its places' holders: ``holder``, or a digest of one too
    long to carry the mark and the longest rank within a name's 255 characters."""
    if len(holder) + len(_RANK_MARK) + _LONGEST_RANK <= MAX_NAME_LENGTH:
        return holder
    return _LONG_HOLDER + hashlib.blake2b(holder.encode()).hexdigest()[:32]


def place_holder(pool: str, rank: Rank | None) -> str:
    """The holder a pool (its :func:`place_id` ``pool``) records on its place: it, and its waiter's rank."""
    return f"{pool}{_RANK_MARK}{_UNRANKED if rank is None else f'{-rank[0]}:{rank[1]}'}"


def own_place(pool: str, holder: str) -> bool:
    """Whether a place's ``holder`` is one the pool ``pool`` writes (see :func:`place_holder`)."""
    prefix = pool + _RANK_MARK
    return holder.startswith(prefix) and _RANK_MARK not in holder[len(prefix) :]


def shown_rank(holder: str) -> Rank | None:
    """The rank a place's ``holder`` shows; None for an unranked or malformed one, or one
    written by a version without ranks."""
    _, mark, text = holder.rpartition(_RANK_MARK)
    match = _RANK_TEXT.fullmatch(text) if mark else None
    return None if match is None else (-int(match[1]), int(match[2]))


def ahead(mine: Rank | None, theirs: Rank | None) -> bool:
    """Whether a waiter ranked ``mine`` goes before one ranked ``theirs`` (both must carry a rank)."""
    return mine is not None and theirs is not None and mine < theirs
