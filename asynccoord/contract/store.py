"""The whole storage contract: one type for a store that holds the queue, the locks, membership and the monitor.

The SQLite, PostgreSQL and in-memory stores implement all four primitives on one
database; the Redis store implements :class:`~asynccoord.contract.locks.LockStore`
only. Code that needs one primitive should ask for its Protocol, not for this one.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .locks import LockStore
from .membership import MembershipStore
from .monitor import MonitorStore
from .queue import QueueStore

__all__ = ("Store",)


@runtime_checkable
class Store(QueueStore, LockStore, MembershipStore, MonitorStore, Protocol):
    """A store of every primitive: the queue, locks, membership and the monitor, on one database."""
