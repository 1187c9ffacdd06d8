"""Configuration records: frozen, keyword-only, validated at construction.

Every duration is in seconds and named ``*_s``; every size is in bytes and named
``*_bytes``. A bad value raises :class:`~asynccoord.errors.InvalidArgumentError`
(or :class:`~asynccoord.errors.InvalidTypeError`) naming the field and the value.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from .errors import InvalidArgumentError, InvalidTypeError
from .partition import MAX_PARTITIONS
from .validation import (
    MAX_ATTEMPTS,
    MAX_PURGE_BATCH,
    _short,
    check_bool,
    check_int,
    check_interval_s,
    check_non_negative,
    check_positive,
)

__all__ = (
    "DEFAULT_PARTITIONS",
    "MAX_BATCH_OPS",
    "MAX_PAYLOAD_BYTES",
    "MIN_CHECKPOINT_INTERVAL_S",
    "ProcessedRetention",
    "RetryPolicy",
    "StoreConfig",
)

MIN_CHECKPOINT_INTERVAL_S = 0.01
"""Shortest ``StoreConfig.checkpoint_interval_s`` accepted, seconds."""

DEFAULT_PARTITIONS = 1024
"""Number of fixed partitions a partition key is hashed into (kept in the database)."""

MAX_PAYLOAD_BYTES = 1 << 28
"""Largest ``StoreConfig.max_payload_bytes``, bytes (256 MiB): a task's payload and its result
share one SQLite row, whose default size limit (``SQLITE_MAX_LENGTH``) is 10**9 bytes."""

MAX_BATCH_OPS = 1_000_000
"""Largest ``StoreConfig.max_batch_ops``: one batch is one transaction on SQLite and one
statement's arrays on PostgreSQL."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """Exponential backoff with symmetric jitter for failed tasks.

    The n-th failure (n = 1, 2, ...) schedules the next attempt after
    ``min(cap_s, base_s * factor ** (n - 1)) * (1 + u)``, ``u`` drawn uniformly from
    ``[-jitter, +jitter]``: "exponential backoff and jitter" as described by
    M. Brooker, AWS Architecture Blog, 2015, with the jitter kept proportional so
    the schedule stays predictable. After ``max_attempts`` attempts in all, the task
    is dead-lettered. ``max_attempts`` is read once, at enqueue, from the store's
    policy (``StoreConfig.retry``) for a task enqueued without its own: a policy given
    to ``fail(retry=...)`` or ``NodeConfig.retry`` sets the delays only, and the task
    keeps the ``max_attempts`` it was enqueued with (``NodeConfig`` refuses a policy whose
    ``max_attempts`` is not the default, which it would otherwise ignore).

    Args:
        base_s: Delay after the first failure, seconds (>= 0.001,
            ``validation.MIN_INTERVAL_S``: a lock's retries would otherwise spin). Default 1.0.
        factor: Growth per further failure (>= 1). Default 2.0.
        cap_s: Largest delay before jitter, seconds (>= base_s). Default 300.
        jitter: Fraction of the delay drawn at random either way, in [0, 1).
            Default 0.1 (so 1.0 s becomes 0.9..1.1 s).
        max_attempts: Attempts before the task goes to the dead-letter state,
            1..2**31 - 1 (``validation.MAX_ATTEMPTS``, the bound a task's own
            ``max_attempts`` has). Default 5. Used for tasks enqueued without their own ``max_attempts``.

    Raises:
        InvalidArgumentError, InvalidTypeError: a field out of range.
    """

    base_s: float = 1.0
    factor: float = 2.0
    cap_s: float = 300.0
    jitter: float = 0.1
    max_attempts: int = 5

    def __post_init__(self) -> None:
        check_interval_s("base_s", self.base_s)
        factor = check_positive("factor", self.factor, maximum=None)
        if factor < 1:
            raise InvalidArgumentError(f"factor must be >= 1, got {self.factor!r}")
        cap = check_interval_s("cap_s", self.cap_s)
        if cap < self.base_s:
            raise InvalidArgumentError(f"cap_s must be >= base_s ({self.base_s!r}), got {self.cap_s!r}")
        jitter = check_non_negative("jitter", self.jitter, maximum=None)
        if jitter >= 1:
            raise InvalidArgumentError(f"jitter must be in [0, 1), got {self.jitter!r}")
        check_int("max_attempts", self.max_attempts, minimum=1, maximum=MAX_ATTEMPTS)

    def delay_s(self, failures: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after the ``failures``-th failure (1-based), jitter included.

        Args:
            failures: How many attempts have failed so far, >= 1.
            rng: Source of randomness for the jitter (a ``random.Random``, or any object
                with its ``uniform(a, b)`` method); the module's default if None.

        Raises:
            InvalidTypeError: ``failures`` is not an int (bool is refused), or ``rng``
                is neither None nor has a ``uniform`` method.
            InvalidArgumentError: ``failures`` < 1.
        """
        check_int("failures", failures, minimum=1)
        given: object = rng
        if given is not None and not isinstance(given, random.Random) and not callable(getattr(given, "uniform", None)):
            raise InvalidTypeError(
                "rng must be a random.Random (or have a uniform method) or None, "
                f"got {type(given).__name__} {_short(given)}"
            )
        exponent = min(failures - 1, 1024)  # factor ** 1024 would overflow; cap_s bounds it anyway
        try:
            raw = self.base_s * self.factor**exponent
        except OverflowError:
            raw = self.cap_s
        delay = min(self.cap_s, raw)
        spread = (rng or random).uniform(-self.jitter, self.jitter)
        return delay * (1.0 + spread)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessedRetention:
    """How long processed-message records are kept to recognize redeliveries.

    Args:
        retention_s: Age after which a processed-id record may be purged, seconds.
            Default 7 days.
        redelivery_window_s: The longest time after processing at which your
            upstream may deliver the same message again, seconds. Default 1 day.
            A retention shorter than this is refused: a redelivery arriving after
            its record was purged would be processed twice.
        purge_batch: Rows deleted per purge statement, 1..2**31 - 1
            (``validation.MAX_PURGE_BATCH``), so a purge never holds the write lock for
            long. Default 1000.

    Raises:
        InvalidArgumentError: ``retention_s < redelivery_window_s``, or a field out of range.
    """

    retention_s: float = 7 * 24 * 3600.0
    redelivery_window_s: float = 24 * 3600.0
    purge_batch: int = 1000

    def __post_init__(self) -> None:
        check_positive("retention_s", self.retention_s)
        check_non_negative("redelivery_window_s", self.redelivery_window_s)
        check_int("purge_batch", self.purge_batch, minimum=1, maximum=MAX_PURGE_BATCH)
        if self.retention_s < self.redelivery_window_s:
            raise InvalidArgumentError(
                f"retention_s ({self.retention_s!r}) is shorter than redelivery_window_s "
                f"({self.redelivery_window_s!r}): a late redelivery would be processed twice"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreConfig:
    """Settings of a store (those that do not apply to a backend are ignored by it).

    Args:
        max_payload_bytes: Largest encoded JSON payload accepted, bytes, 2 to
            ``MAX_PAYLOAD_BYTES`` (256 MiB). Default 1 MiB.
        retry: Backoff policy used by ``fail`` unless one is passed. Default RetryPolicy().
        processed: Retention of processed-message records. Default ProcessedRetention().
        busy_timeout_s: SQLite: how long a write waits for another connection's write
            lock before :class:`~asynccoord.errors.StoreBusyError`, seconds. Default 30,
            longer than ``NodeConfig.lock_ttl_s``'s default: a process frozen mid-write holds
            the lock until it resumes.
        synchronous_full: SQLite: ``synchronous=FULL`` (durable across power loss)
            instead of ``NORMAL`` (durable across process crashes). Default False.
        max_batch_ops: Most operations sent together: one transaction of the group
            commit (SQLite), one statement (PostgreSQL), one pipeline (Redis lock
            acquisitions); 1 to ``MAX_BATCH_OPS`` (1,000,000). Default 512.
        partitions: Number of fixed partitions keys are hashed into when the database
            is created (kept in the database afterwards), 1 to
            ``asynccoord.partition.MAX_PARTITIONS`` (65,536). Default 1024.
        checkpoint_interval_s: SQLite: seconds between WAL checkpoints run in the
            background on a connection of their own (only after new commits, at least
            0.01), ahead of SQLite's own in the commit that takes the log past 1,000
            pages, which then finds little left to copy; None leaves them all to
            SQLite. Default 0.1. See ``asynccoord.backends.sqlite.checkpoint``.
    """

    max_payload_bytes: int = 1 << 20
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    processed: ProcessedRetention = field(default_factory=ProcessedRetention)
    busy_timeout_s: float = 30.0
    synchronous_full: bool = False
    max_batch_ops: int = 512
    partitions: int = DEFAULT_PARTITIONS
    checkpoint_interval_s: float | None = 0.1

    def __post_init__(self) -> None:
        check_int("max_payload_bytes", self.max_payload_bytes, minimum=2, maximum=MAX_PAYLOAD_BYTES)
        check_positive("busy_timeout_s", self.busy_timeout_s)
        check_bool("synchronous_full", self.synchronous_full)
        check_int("max_batch_ops", self.max_batch_ops, minimum=1, maximum=MAX_BATCH_OPS)
        check_int("partitions", self.partitions, minimum=1, maximum=MAX_PARTITIONS)
        if self.checkpoint_interval_s is not None:
            interval_s = check_positive("checkpoint_interval_s", self.checkpoint_interval_s)
            if interval_s < MIN_CHECKPOINT_INTERVAL_S:
                raise InvalidArgumentError(
                    f"checkpoint_interval_s must be >= {MIN_CHECKPOINT_INTERVAL_S} (or None), got {interval_s!r}"
                )
        if not isinstance(self.retry, RetryPolicy):
            raise InvalidTypeError(f"retry must be a RetryPolicy, got {type(self.retry).__name__}")
        if not isinstance(self.processed, ProcessedRetention):
            raise InvalidTypeError(f"processed must be a ProcessedRetention, got {type(self.processed).__name__}")
