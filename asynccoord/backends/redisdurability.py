"""Whether a Redis server keeps the fencing counters across a restart: the check of ``RedisLockStore.open``.

Only an append-only file (``appendonly yes``) logs each ``INCR`` of a fencing counter. RDB
snapshots alone do not: a restart loads the last snapshot and loses the increments made
since, so the counters fall back below tokens that fenced resources have accepted.
"""

from __future__ import annotations

import contextlib
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions as rerr

__all__ = ("NO_PERSISTENCE", "durability", "losses", "persistence")

NO_PERSISTENCE = (
    "asynccoord.redis.no_persistence url=%s appendonly=no save=%s: %s, and the first fenced commit of each "
    "lock after a restart is refused (the counter is then moved past the resource's token); enable AOF "
    "(appendonly yes)"
)
"""The WARNING logged at open for a server without an append-only file: url, save points, :func:`losses`."""

_LOSSES = {
    "rdb": "RDB snapshots alone lose the fencing counter increments made since the last snapshot",
    "none": "the server keeps no copy of its data on disk, so a restart empties the fencing counters",
}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def durability(aof_enabled: Any, save: Any) -> tuple[bool, str]:
    """Whether a server with these settings keeps every fencing counter increment across a
    restart, and what it keeps on disk: ``"aof"``, ``"rdb"`` (snapshots only), ``"none"``, or
    ``"no-aof"`` (no append-only file, snapshot points unknown).

    Args:
        aof_enabled: ``aof_enabled`` of ``INFO persistence`` (1: an append-only file is on).
        save: The snapshot points of ``CONFIG GET save`` (``""``: none); None when unknown.
    """
    if _text(aof_enabled).strip() == "1":
        return True, "aof"
    if save is None:
        return False, "no-aof"
    return False, ("rdb" if _text(save).strip() else "none")


def losses(kept: str) -> str:
    """What a restart of a server that keeps ``kept`` (see :func:`durability`) loses, for the warning."""
    return _LOSSES.get(kept, "a restart loses the fencing counter increments not in the last RDB snapshot, if any")


async def persistence(client: aioredis.Redis) -> tuple[bool | None, str, str]:
    """The server's :func:`durability`, with its ``save`` setting as text (``"?"`` when unknown).

    None (and ``"unknown"``) when the server does not say: a managed Redis may refuse
    ``INFO``. ``CONFIG`` (refused by some) only names the snapshot points in the warning.
    The check never fails the caller.
    """
    try:
        info = await client.info("persistence")
    except (rerr.RedisError, OSError, ValueError, TypeError):
        return None, "unknown", "?"
    if "aof_enabled" not in info:
        return None, "unknown", "?"
    save: Any = None
    with contextlib.suppress(rerr.RedisError, OSError, ValueError, TypeError, AttributeError):
        save = (await client.config_get("save")).get("save")
    persistent, kept = durability(info["aof_enabled"], save)
    return persistent, kept, ("?" if save is None else _text(save).strip() or '""')
