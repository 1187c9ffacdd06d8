"""asynccoord: asyncio-native coordination for many nodes on one shared queue.

Three layers, each usable alone: partitioning (stable hashing of keys over live
nodes), distributed locks with fencing tokens, and version-checked compare-and-set
on every state change. README.md walks through them with examples.

The stores of extras (:class:`PostgresStore`: ``asynccoord[postgres]``,
:class:`RedisLockStore`: ``asynccoord[redis]``) are exported too and imported on first
access, so ``import asynccoord`` needs neither driver. Without its extra, ``asynccoord.PostgresStore``
raises an ``AttributeError`` naming the extra to install; ``from asynccoord import PostgresStore``
then raises Python's plain ``ImportError`` (``open_store`` names the extra too).

Where things are (the tests mirror the package; ``tests/contract/`` runs one suite on
every store):

* ``contract/``: one module per primitive (queue, locks, membership, monitor, rate limits,
  dead letters): its Protocol, records and argument checks.
* ``backends/base.py``: the store base; each public verb checks its arguments, then calls
  the engine. ``backends/memory/``, ``sqlite/``, ``postgres/``: each engine's statements,
  its SQL in ``sql/`` beside them. In ``sqlite/`` and ``postgres/``, ``queue.py`` is the queue,
  its claims, commits and per-key heads in ``claim.py``, ``commit.py`` and ``heads.py``;
  ``sqlite/writer.py`` is the group commit, ``sqlite/wakeup.py`` the cross-process wake-ups,
  ``postgres/conn.py`` the connection handling. ``backends/redis*.py``: locks on Redis (the
  store, its scripts, its connection, URLs, prefixes, durability); ``backends/open.py``:
  ``open_store``.
* ``locks/``: lock and semaphore (their handle, the local queue of a name), watchdog (its
  guards, renewal rounds, task, counters), lock pool (its turns, its line between
  processes), pacing. ``node/``: node loop, flight state machine, lockless batch, send
  supervision, settle, keeper, config, runtime, idle poll, retention (purges of aged done
  tasks), tracing.
* ``membership.py``: a process's nodes in the cluster; its heartbeats, live view (with the
  partitions it assigns), view changes and counters are ``membershipbeats.py``,
  ``membershipview.py``, ``membershipchanges.py``, ``membershipstats.py``. ``partition.py``:
  keys to partitions, partitions to nodes.
* ``notify.py``, ``releases.py``, ``pauses.py``: wake-ups of idle nodes on new work, of
  lock waiters on a release; a 429's pause of a lock's sends.
* ``monitor/``: monitor (its flushes, evaluations, leadership, incidents), rules and alerts,
  snapshot, webhook sink, histogram, metrics, dashboard. ``cli/``: the command line (``run``,
  ``status``, ``dead``, ``dashboard``). ``demo/``: the demo.
"""

from __future__ import annotations

from . import _startsignals

# First, before the imports below take their few tenths of a second: in the process of
# `python -m asynccoord run`, a stop signal from here on is noted for the command, not fatal.
_startsignals.hold_start_signals()

import typing as _typing

from .backends.memory import MemoryStore
from .backends.open import open_store
from .backends.sqlite import SQLiteStore
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
    NoDeliveryError,
    NotADatabaseError,
    PayloadTooLargeError,
    RateLimited,
    ReadOnlyStoreError,
    RuntimeStateError,
    SchemaVersionError,
    StoreAlreadyOpenError,
    StoreBusyError,
    StoreClosedError,
    StoreConnectionError,
    StoreError,
    StoreFileReplacedError,
    StoreLoopError,
    TaskNotFoundError,
    Undeliverable,
    UnreadableRowError,
)
from .events import EventCounter
from .locks.lock import Lock, Semaphore
from .locks.pool import LockPool
from .locks.watchdog import Watchdog, WatchdogStats
from .membership import Membership, MembershipStats, MembershipView
from .models import (
    Continuation,
    DeadLetterPolicy,
    EnqueueResult,
    NewTask,
    PurgeResult,
    QueueStats,
    Task,
    TaskStatus,
    UnreadableValue,
)
from .monitor.alerts import AlertStream
from .monitor.histogram import Histogram, LatencyRecorder
from .monitor.monitor import Monitor, MonitorStats
from .monitor.rules import DEFAULT_RULES, AlertRule
from .monitor.snapshot import ClusterSnapshot
from .monitor.webhook import WebhookSink
from .node import Delivery, Node, NodeConfig, NodeState, NodeStatus, Runtime, current_delivery
from .notify import WorkNotifier
from .partition import assign, owner_of, partition_of

if _typing.TYPE_CHECKING:
    from .backends.postgres import PostgresStore
    from .backends.redis import RedisLockStore

__version__ = "0.1.0"

__all__: tuple[str, ...] = (
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
    "NoDeliveryError",
    "Node",
    "NodeConfig",
    "NodeState",
    "NodeStatus",
    "NotADatabaseError",
    "PayloadTooLargeError",
    "PostgresStore",
    "ProcessedRetention",
    "PurgeResult",
    "QueueStats",
    "RateLimit",
    "RateLimited",
    "ReadOnlyStoreError",
    "RedisLockStore",
    "RetryPolicy",
    "Runtime",
    "RuntimeStateError",
    "SQLiteStore",
    "SchemaVersionError",
    "Semaphore",
    "StoreAlreadyOpenError",
    "StoreBusyError",
    "StoreClosedError",
    "StoreLoopError",
    "StoreConfig",
    "StoreConnectionError",
    "StoreError",
    "StoreFileReplacedError",
    "Task",
    "TaskNotFoundError",
    "TaskStatus",
    "Undeliverable",
    "UnreadableRowError",
    "UnreadableValue",
    "Watchdog",
    "WatchdogStats",
    "WebhookSink",
    "WorkNotifier",
    "__version__",
    "assign",
    "current_delivery",
    "open_store",
    "owner_of",
    "partition_of",
)

_LAZY = {
    "PostgresStore": ("asynccoord.backends.postgres", "asyncpg", "postgres"),
    "RedisLockStore": ("asynccoord.backends.redis", "redis", "redis"),
}
"""Exports that need an extra: name -> (module, driver, extra). Imported on first use, so
``import asynccoord`` imports neither driver; listed in ``__all__`` only when the driver is
installed, so ``from asynccoord import *`` works on the base install."""


def _installed(driver: str) -> bool:
    """Whether ``driver`` can be imported, without importing it."""
    import importlib.util
    import sys

    if driver in sys.modules:
        return sys.modules[driver] is not None
    try:
        return importlib.util.find_spec(driver) is not None
    except (ImportError, ValueError):
        return False


__all__ = tuple(name for name in __all__ if name not in _LAZY or _installed(_LAZY[name][1]))


def __getattr__(name: str) -> _typing.Any:
    """Import a store of an extra on first access (PEP 562).

    Raises:
        AttributeError: ``name`` is not an attribute of asynccoord, or names a store whose
            extra is not installed (the message says ``pip install 'asynccoord[postgres]'``;
            ``from asynccoord import ...`` turns it into a plain ``ImportError``, and
            ``hasattr`` into False).
    """
    lazy = _LAZY.get(name)
    if lazy is None:
        raise AttributeError(f"module 'asynccoord' has no attribute {name!r}")
    module_name, driver, extra = lazy
    import importlib

    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.partition(".")[0] != driver:
            raise
        raise AttributeError(
            f"asynccoord.{name} needs the extra {extra!r}, which is not installed: pip install 'asynccoord[{extra}]'"
        ) from exc
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | {name for name, (_, driver, _) in _LAZY.items() if _installed(driver)})
