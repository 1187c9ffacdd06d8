"""Records exchanged with a store: tasks, enqueue requests and results, statistics.

All are frozen, keyword-only, slotted dataclasses. Times are seconds since the Unix
epoch *as read from the store's clock* (never compare them with ``time.time()`` of
another machine); ages and durations are seconds.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .validation import (
    MAX_ATTEMPTS,
    check_int,
    check_key,
    check_limit_keys,
    check_name,
    check_non_negative,
    check_optional_key,
)

__all__ = (
    "Continuation",
    "DeadLetterPolicy",
    "EnqueueResult",
    "NewTask",
    "PurgeResult",
    "QueueStats",
    "Task",
    "TaskStatus",
    "UnreadableValue",
)


class TaskStatus(enum.StrEnum):
    """Life cycle of a task: ``pending -> running -> done``, or ``-> dead`` after the last failure."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    DEAD = "dead"


class DeadLetterPolicy(enum.StrEnum):
    """What an ordered claim does with a conversation (partition key) whose task went dead.

    ``SKIP`` (the default): the key's next task becomes its head and the conversation goes
    on without the dead one (the ``dead_lettered`` event and the monitor's ``dead_letters``
    rule report it). ``HOLD``: no later task of the key is claimed in order until the dead
    task is requeued (``requeue_dead``) or discarded (``discard_dead``). Set per queue with
    ``set_dead_letter_policy``; unordered claims are not affected.
    """

    SKIP = "skip"
    HOLD = "hold"


@dataclass(frozen=True, slots=True, kw_only=True)
class NewTask:
    """One task to enqueue.

    Args:
        queue: Queue name, 1..255 characters, not only whitespace.
        payload: JSON value (see :func:`asynccoord.validation.encode_payload`). Default None.
        partition_key: What work is partitioned and ordered by, e.g. a conversation id;
            0..255 characters. Default ``""``.
        idempotency_key: Dedup key unique within the queue; a second enqueue with the
            same key returns the first task. Also the message id of the processed-id
            record written at completion. Default None (no dedup).
        priority: Higher runs first. Default 0. In an ordered queue it orders conversations,
            not the tasks of one ``partition_key``: those go in enqueue order.
        max_attempts: Attempts before dead-lettering, 1..2**31 - 1; None takes the
            store's retry policy. Default None.
        delay_s: Not claimable before this many seconds from now (store clock). Default 0.
            In an ordered queue the conversation's later tasks wait for it too.
        limit_keys: The task's key for each rate-limited dimension of its queue, e.g.
            ``{"account": "bot-1", "chat": "42"}`` (see
            :class:`~asynccoord.contract.ratelimits.RateLimit`): the claim takes a token
            from each of these buckets. A dimension without a key does not limit the task;
            one the queue does not declare limits nothing until it is declared (logged once,
            ``asynccoord.rate_limits.undeclared_dimension``). Default none.

    Raises:
        InvalidArgumentError, InvalidTypeError: on any bad field (the payload is
        checked by the store, against its size limit).
    """

    queue: str
    payload: Any = None
    partition_key: str = ""
    idempotency_key: str | None = None
    priority: int = 0
    max_attempts: int | None = None
    delay_s: float = 0.0
    limit_keys: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_name("queue", self.queue)
        check_key("partition_key", self.partition_key, allow_empty=True)
        check_optional_key("idempotency_key", self.idempotency_key, allow_blank=True)
        check_int("priority", self.priority, minimum=-(2**31), maximum=2**31 - 1)
        if self.max_attempts is not None:
            check_int("max_attempts", self.max_attempts, minimum=1, maximum=MAX_ATTEMPTS)
        check_non_negative("delay_s", self.delay_s)
        object.__setattr__(self, "limit_keys", check_limit_keys(self.limit_keys))


UNREADABLE_TEXT_SHOWN = 4096
"""Most characters of an unreadable stored value an :class:`UnreadableValue` keeps."""


@dataclass(frozen=True, slots=True, kw_only=True)
class UnreadableValue:
    """In a listed :class:`Task`, a stored value the store could not decode, kept as its raw text.

    ``dead_letters`` (and the settling verbs, whose write has gone through) return a task
    whose ``payload`` or ``result`` column cannot be decoded with this in its place, so the
    task can still be seen, requeued after a fix, or discarded; ``get`` raises
    :class:`~asynccoord.errors.UnreadableRowError` instead.

    Attributes:
        column: The column, ``"payload"`` or ``"result"``.
        text: The stored text as read (``repr`` of a value that is not text), its first
            :data:`UNREADABLE_TEXT_SHOWN` characters at most: another tool's text is held to no
            size limit, and a listing keeps every task it lists.
        reason: Why it cannot be decoded, as the decoder said it.
        length: The whole stored text's length in characters (more than ``len(text)`` when cut).
    """

    column: str
    text: str
    reason: str
    length: int

    def __repr__(self) -> str:
        shown = self.text if len(self.text) <= 60 else self.text[:57] + "..."
        return f"<UnreadableValue {self.column} {shown!r}: {self.reason}>"


@dataclass(frozen=True, slots=True, kw_only=True)
class Task:
    """A task as the store last returned it.

    ``version`` rises by one on every state change (claim, complete, fail, release,
    requeue); lease extension is a heartbeat and keeps it. ``lease_token`` is new for
    every claim, so a task reclaimed after its lease expired cannot be settled with
    the old lease even when the same node id claims it again.

    ``attempts`` counts claims, sent or not: ``attempts > 1`` says an earlier delivery may
    have gone out. A send cut short (at a shutdown, say) keeps its attempt counted, and
    on the task's last attempt leaves it dead, as a crash would.
    """

    id: int
    queue: str
    partition_key: str
    partition: int
    idempotency_key: str | None
    payload: Any
    priority: int
    status: TaskStatus
    attempts: int
    max_attempts: int
    run_at: float
    lease_owner: str | None
    lease_token: str | None
    lease_expires_at: float | None
    version: int
    last_error: str | None
    result: Any
    created_at: float
    updated_at: float

    def __repr__(self) -> str:
        lease = (
            f" lease={self.lease_owner}:{self.lease_token} until={self.lease_expires_at}" if self.lease_token else ""
        )
        return (
            f"<Task id={self.id} queue={self.queue!r} key={self.partition_key!r} "
            f"status={self.status.value} v{self.version} attempts={self.attempts}/{self.max_attempts}{lease}>"
        )


# The stores build two Task records per task they drain (the claimed one and the done one).
# A frozen dataclass's __init__ sets each of its 19 fields through object.__setattr__, and
# even calling each slot's descriptor directly costs about 1 us per record: any attribute
# assignment on a class with its own __setattr__ takes the slow, unspecialized path. So the
# stores fill an instance of TaskSlots, a plain class with exactly Task's slots (the same
# names, hence the same memory layout), where each assignment is a single specialized
# store, and then make it a Task by assigning __class__ (CPython checks that the two layouts
# match and raises TypeError otherwise). The result is an ordinary Task: of type Task, equal
# to, hashing like and indistinguishable from one made by Task(...), and frozen like it.
class TaskSlots:
    """Task's slots on a plain class: for stores that build :class:`Task` records fast.

    ``t = object.__new__(TaskSlots)``, assign all 19 fields, then ``t.__class__ = Task``
    (see :func:`make_task`, which does exactly that). Not a public type: no instance of it
    ever leaves a store.
    """

    __slots__ = tuple(Task.__dataclass_fields__)


_NEW = object.__new__


def make_task(
    id: int,
    queue: str,
    partition_key: str,
    partition: int,
    idempotency_key: str | None,
    payload: Any,
    priority: int,
    status: TaskStatus,
    attempts: int,
    max_attempts: int,
    run_at: float,
    lease_owner: str | None,
    lease_token: str | None,
    lease_expires_at: float | None,
    version: int,
    last_error: str | None,
    result: Any,
    created_at: float,
    updated_at: float,
) -> Task:
    """A :class:`Task` from its 19 field values in declaration order (no validation).

    For stores only, on values they read back from their own database: it skips the
    dataclass ``__init__`` (about 6x faster than ``Task(...)``, 3x faster than setting each
    slot through its descriptor) and checks nothing.
    """
    task: Any = _NEW(TaskSlots)
    task.id = id
    task.queue = queue
    task.partition_key = partition_key
    task.partition = partition
    task.idempotency_key = idempotency_key
    task.payload = payload
    task.priority = priority
    task.status = status
    task.attempts = attempts
    task.max_attempts = max_attempts
    task.run_at = run_at
    task.lease_owner = lease_owner
    task.lease_token = lease_token
    task.lease_expires_at = lease_expires_at
    task.version = version
    task.last_error = last_error
    task.result = result
    task.created_at = created_at
    task.updated_at = updated_at
    task.__class__ = Task
    return task  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True, kw_only=True)
class EnqueueResult:
    """Outcome of one enqueue: the task, and whether this call created it.

    ``created`` is False when the idempotency key was already present; ``task`` is
    then the task that holds the key (a suppressed duplicate). Once that task was purged
    (a done task past the runtime's ``done_retention_s``), the key is free again and a new
    task is created; while the key's processed record is kept (``StoreConfig.processed``),
    that task is settled as a duplicate when claimed, and never sent.
    """

    task: Task
    created: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Continuation:
    """Outcome of ``complete_and_claim_next``: the committed task and its key's next task.

    Args:
        done: The committed task: its state as now stored (status ``done``, version + 1),
            its other fields those of the task passed in (see ``complete``).
        next_task: The next task of the same queue and partition key, leased to the same
            owner in the commit's transaction (status ``running``, a fresh lease token);
            None when nothing was leased: the key had no further unfinished task, its head
            was not pending and due (delayed, a retry not yet due, running under another
            lease), its head's message id was already processed (settled as a duplicate),
            or, on PostgreSQL, another transaction held the head's row at that moment.
    """

    done: Task
    next_task: Task | None


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueStats:
    """Counts by status and the age of the oldest due pending task, for one queue or all.

    Args:
        counts: Number of tasks per status (every status present, 0 when none).
        oldest_pending_age_s: Seconds since the oldest due pending task became due,
            by the store's clock; None when nothing is pending and due.
    """

    counts: dict[TaskStatus, int] = field(default_factory=dict)
    oldest_pending_age_s: float | None = None

    @property
    def total(self) -> int:
        """All tasks counted."""
        return sum(self.counts.values())


@dataclass(frozen=True, slots=True, kw_only=True)
class PurgeResult:
    """Outcome of a bounded-batch purge: rows deleted and delete statements that removed any."""

    deleted: int
    batches: int
