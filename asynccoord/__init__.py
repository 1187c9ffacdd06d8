"""asynccoord: asyncio-native coordination for many nodes on one shared queue.

Three layers, each usable alone: partitioning (stable hashing of keys over live
nodes), distributed locks with fencing tokens, and version-checked compare-and-set
on every state change. See README.md for the tour.
"""

from __future__ import annotations

from .backends.memory import MemoryStore
from .backends.sqlite import SQLiteStore
from .config import ProcessedRetention, RetryPolicy, StoreConfig
from .errors import (
    CoordError,
    FencingTokenRejectedError,
    InvalidArgumentError,
    InvalidTypeError,
    LeaseLostError,
    LockError,
    LockLostError,
    LockNotHeldError,
    LockTimeoutError,
    MaxHoldExceededError,
    NotADatabaseError,
    PayloadTooLargeError,
    SchemaVersionError,
    StaleVersionError,
    StoreBusyError,
    StoreClosedError,
    StoreError,
    TaskNotFoundError,
)
from .events import EventCounter
from .models import EnqueueResult, NewTask, PurgeResult, QueueStats, Task, TaskStatus
from .partition import assign, owner_of, partition_of

__version__ = "0.1.0"

__all__ = (
    "CoordError",
    "EnqueueResult",
    "EventCounter",
    "FencingTokenRejectedError",
    "InvalidArgumentError",
    "InvalidTypeError",
    "LeaseLostError",
    "LockError",
    "LockLostError",
    "LockNotHeldError",
    "LockTimeoutError",
    "MaxHoldExceededError",
    "MemoryStore",
    "NewTask",
    "NotADatabaseError",
    "PayloadTooLargeError",
    "ProcessedRetention",
    "PurgeResult",
    "QueueStats",
    "RetryPolicy",
    "SQLiteStore",
    "SchemaVersionError",
    "StaleVersionError",
    "StoreBusyError",
    "StoreClosedError",
    "StoreConfig",
    "StoreError",
    "Task",
    "TaskNotFoundError",
    "TaskStatus",
    "__version__",
    "assign",
    "owner_of",
    "partition_of",
)
