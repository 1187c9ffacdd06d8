"""asynccoord: asyncio-native coordination for many nodes on one shared queue.

Three layers, each usable alone: partitioning (stable hashing of keys over live
nodes), distributed locks with fencing tokens, and version-checked compare-and-set
on every state change. See README.md for the tour.
"""

from __future__ import annotations

from .backends.memory.store import MemoryStore
from .backends.sqlite.store import SQLiteStore
from .config import ProcessedRetention, RetryPolicy, StoreConfig
from .contract.locks import FenceRecord, Lease, LockBusy, LockInfo
from .contract.membership import Member, MemberBeat
from .contract.monitor import Alert, AlertScope, AlertState
from .contract.ratelimits import RateLimit
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
    RateLimited,
    ReadOnlyStoreError,
    RuntimeStateError,
    SchemaVersionError,
    StaleVersionError,
    StoreBusyError,
    StoreClosedError,
    StoreConnectionError,
    StoreError,
    StoreLoopError,
    TaskNotFoundError,
)
from .events import EventCounter
from .locks.lock import Lock, Semaphore
from .locks.pool import LockPool
from .locks.watchdog import Watchdog, WatchdogStats
from .membership import Membership, MembershipStats, MembershipView
from .models import Continuation, DeadLetterPolicy, EnqueueResult, NewTask, PurgeResult, QueueStats, Task, TaskStatus
from .monitor.alerts import AlertStream
from .monitor.histogram import Histogram, LatencyRecorder
from .monitor.monitor import Monitor, MonitorStats
from .monitor.rules import DEFAULT_RULES, AlertRule
from .monitor.snapshot import ClusterSnapshot
from .monitor.webhook import WebhookSink
from .node import Delivery, Node, NodeConfig, NodeState, NodeStatus, Runtime, current_delivery
from .notify import WorkNotifier
from .partition import assign, owner_of, partition_of

__version__ = "0.1.0"

__all__ = (
    "Alert",
    "AlertRule",
    "AlertScope",
    "AlertState",
    "AlertStream",
    "ClusterSnapshot",
    "Continuation",
    "CoordError",
    "DEFAULT_RULES",
    "DeadLetterPolicy",
    "Delivery",
    "EnqueueResult",
    "EventCounter",
    "FenceRecord",
    "FencingTokenRejectedError",
    "Histogram",
    "InvalidArgumentError",
    "InvalidTypeError",
    "LatencyRecorder",
    "Lease",
    "LeaseLostError",
    "Lock",
    "LockBusy",
    "LockError",
    "LockInfo",
    "LockLostError",
    "LockNotHeldError",
    "LockPool",
    "LockTimeoutError",
    "MaxHoldExceededError",
    "Member",
    "MemberBeat",
    "Membership",
    "MembershipStats",
    "MembershipView",
    "MemoryStore",
    "Monitor",
    "MonitorStats",
    "NewTask",
    "Node",
    "NodeConfig",
    "NodeState",
    "NodeStatus",
    "NotADatabaseError",
    "PayloadTooLargeError",
    "ProcessedRetention",
    "PurgeResult",
    "QueueStats",
    "RateLimit",
    "RateLimited",
    "ReadOnlyStoreError",
    "RetryPolicy",
    "Runtime",
    "RuntimeStateError",
    "SQLiteStore",
    "SchemaVersionError",
    "Semaphore",
    "StaleVersionError",
    "StoreBusyError",
    "StoreClosedError",
    "StoreLoopError",
    "StoreConfig",
    "StoreConnectionError",
    "StoreError",
    "Task",
    "TaskNotFoundError",
    "TaskStatus",
    "Watchdog",
    "WatchdogStats",
    "WebhookSink",
    "WorkNotifier",
    "__version__",
    "assign",
    "current_delivery",
    "owner_of",
    "partition_of",
)
