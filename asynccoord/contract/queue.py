"""The queue's contract: the :class:`QueueStore` Protocol and the checks of its arguments.

A store is an async context manager that owns its connections. All time arithmetic
(run_at, lease expiry) is done against the store's own clock, so nodes on different
machines never compare their local clocks. Every method validates its arguments
before touching the database (with the checks below, shared by every engine through
:class:`~asynccoord.backends.base.StoreBase`, so all of them validate alike) and raises
the errors documented here; drivers' own exceptions never leak (they become
:class:`~asynccoord.errors.StoreError`). The in-memory store
(:mod:`asynccoord.backends.memory.store`) is the reference semantics; the contract test
suite runs unchanged against every engine.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Protocol, Self, cast, runtime_checkable

from ..config import RetryPolicy, StoreConfig
from ..errors import CoordError, InvalidArgumentError, InvalidTypeError
from ..events import EventCounter
from ..models import Continuation, EnqueueResult, NewTask, PurgeResult, QueueStats, Task, TaskStatus
from ..partition import partition_of
from ..validation import (
    MAX_ATTEMPTS,
    MAX_NAME_LENGTH,
    MAX_PURGE_BATCH,
    check_bool,
    check_int,
    check_key,
    check_lease_s,
    check_name,
    check_non_negative,
    check_optional_key,
    encode_payload,
    is_partition_collection,
    partitions_type_error,
)
from .ratelimits import encode_limit_keys

__all__ = (
    "MAX_ATTEMPTS",
    "MAX_CLAIM_LIMIT",
    "MAX_DEAD_LETTERS_LIMIT",
    "MAX_ERROR_CHARS",
    "MAX_ID",
    "MAX_PARTITION",
    "PreparedTask",
    "QueueStore",
    "check_claim_args",
    "check_claimable_args",
    "check_continuation",
    "check_dead_letters_args",
    "check_fences",
    "check_partition_list",
    "check_purge_batch",
    "check_retry",
    "check_task",
    "check_task_ids",
    "check_tasks",
    "clean_error",
    "encode_result",
    "encode_results",
    "prepare_tasks",
)

MAX_CLAIM_LIMIT = 10_000
MAX_DEAD_LETTERS_LIMIT = 10_000
"""Most dead tasks one :meth:`QueueStore.dead_letters` call returns (its ``limit``)."""
MAX_ID = 2**63 - 1
"""Largest task id (and row count) an SQL INTEGER holds."""
MAX_ERROR_CHARS = 8192
MAX_PARTITION = (1 << 16) - 1
"""Largest partition index (``StoreConfig.partitions`` is at most 65536)."""


@runtime_checkable
class QueueStore(Protocol):
    """The task queue over one database.

    Queue semantics (at-least-once delivery, exactly-once commit):

    * ``claim`` hands each due task to at most one live lease; a lease whose expiry
      passed (by the store clock) makes the task claimable again, with a new lease
      token and one more attempt. A task reclaimed after ``max_attempts`` is dead.
    * ``complete``, ``fail``, ``release`` and ``extend`` are compare-and-set on
      ``(id, lease_token, version)`` plus "lease not expired": a caller whose lease
      is gone gets :class:`~asynccoord.errors.LeaseLostError` and nothing is written.

    A call cancelled while its transaction was already on its way (an
    ``asyncio.wait_for`` that ran out, a cancelled task) may still have committed: a
    cancelled ``complete`` can leave the task ``done``. The outcome is unknown, not
    undone; :meth:`get` tells which. Cancelled claims are compensated: their tasks are
    handed back.
    """

    config: StoreConfig
    events: EventCounter

    async def open(self) -> None:
        """Connect, apply schema migrations, and get ready.

        A store is opened once (and may be opened again after :meth:`close`).

        Raises:
            StoreAlreadyOpenError: the store is open already; it stays open.
        """
        ...

    async def close(self) -> None:
        """Finish the calls in flight and queued writes, then close. Idempotent.

        New calls are refused from the start with
        :class:`~asynccoord.errors.StoreClosedError`; hand-backs (a lock's or a task's
        ``release``) are let through and waited for, bounded, so a lease granted to a caller
        cancelled just before the close is released, not left held until its TTL.
        """
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc_info: object) -> None: ...

    async def now(self) -> float:
        """The store clock: seconds since the Unix epoch."""
        ...

    @property
    def partitions(self) -> int:
        """Number of fixed partitions keys are hashed into (fixed at creation)."""
        ...

    async def enqueue(
        self,
        queue: str,
        payload: Any = None,
        *,
        partition_key: str = "",
        idempotency_key: str | None = None,
        priority: int = 0,
        max_attempts: int | None = None,
        delay_s: float = 0.0,
        limit_keys: Mapping[str, str] | None = None,
    ) -> EnqueueResult:
        """Add one task (fields as in :class:`~asynccoord.models.NewTask`).

        A cancelled call may still have added the task: SQLite commits the enqueues of its
        writer in groups, and PostgreSQL may have committed before the cancellation reached
        it, so a ``CancelledError`` does not mean nothing was written. To add a task once,
        give it an ``idempotency_key`` and retry a cancelled enqueue with the same key: a
        task already written comes back with ``created=False``.
        """
        ...

    async def enqueue_many(self, tasks: Sequence[NewTask]) -> list[EnqueueResult]:
        """Add tasks in one transaction; results in input order.

        A repeated idempotency key (already stored, or earlier in ``tasks``) yields
        the existing task with ``created=False`` and counts one
        ``duplicate_enqueue_suppressed`` event.

        A cancelled call may still have added every task (as for :meth:`enqueue`: 3,000
        tasks cancelled after 50 ms on SQLite were all in the queue). Retry it with the
        same idempotency keys: the tasks already written come back with ``created=False``.
        """
        ...

    async def claim(
        self,
        queue: str,
        *,
        node_id: str,
        limit: int = 1,
        lease_s: float = 30.0,
        partitions: Collection[int] | None = None,
        ordered: bool = False,
        min_due_age_s: float = 0.0,
    ) -> list[Task]:
        """Lease up to ``limit`` due tasks to ``node_id`` in one atomic statement.

        Only due tasks are claimed (``run_at`` reached, by the store clock), highest
        priority first, then FIFO. A task whose lease expired is claimable again with a
        new lease token; one whose lease expired on its last attempt is dead-lettered by
        the same transaction, so no reaper is needed.

        Args:
            queue: Queue name (1..255 characters, not only whitespace).
            node_id: Who claims (recorded as ``lease_owner``; ownership is by token), a name
                as ``queue``.
            limit: Most tasks to claim, 1..10000.
            lease_s: Lease length, seconds (0.01, ``validation.MIN_LEASE_S``, to one year).
            partitions: Only tasks in these partitions: a list, tuple, range or set of
                partition numbers (``0..partitions - 1``); None for all.
            ordered: Per-key ordering: a task is claimable only when no earlier task
                with the same partition key is pending or running.
            min_due_age_s: Only tasks that have been due for at least this many seconds
                (store clock; a pending task is due from its ``run_at``, an expired lease
                from its expiry), 0..one year. Work stealing uses it to take over tasks
                their partition's owner has left waiting. Default 0 (every due task).

        Returns:
            The claimed tasks, status ``running``, highest priority first then FIFO.
            Tasks whose idempotency key already has a processed-id record are
            marked done instead and counted as ``duplicate_delivery_suppressed``.

        Raises:
            InvalidTypeError, InvalidArgumentError: a bad argument, naming it (nothing is
                claimed): an empty or blank ``queue`` or ``node_id``, ``lease_s`` below 0.01,
                ``partitions`` that is no collection of ints (a dict, str or bytes) or names a
                partition out of range...
        """
        ...

    async def claimable_partitions(
        self,
        queue: str,
        partitions: Collection[int] | None = None,
        *,
        ordered: bool = False,
        min_due_age_s: float = 0.0,
    ) -> set[int]:
        """Which of ``partitions`` have work a :meth:`claim` with the same arguments would take now.

        A read: nothing is leased, written or locked (on SQLite it does not go through the
        single writer). The runtime's idle poll asks it once for all of a process's idle
        nodes and wakes only the owners of the partitions it names (see
        :mod:`asynccoord.node.idlepoll`), so idle nodes do not claim to find out.

        Args:
            queue: Queue name.
            partitions: The partitions to look at: a list, tuple, range or set of partition
                numbers; None for all.
            ordered: Count only keys' heads, as an ordered claim does.
            min_due_age_s: Only work due for at least this many seconds (store clock), as
                in :meth:`claim`. Default 0.

        Returns:
            The partition numbers (a subset of ``partitions``) holding a due pending task
            (a key's head when ``ordered``) or an expired lease (also one on its last
            attempt: the claim dead-letters it and frees its key). It may name a partition
            whose work another node claims meanwhile.

        Raises:
            InvalidTypeError, InvalidArgumentError: a bad argument, naming it, as in
                :meth:`claim` (``partitions`` a dict, say).
        """
        ...

    async def complete(self, task: Task, result: Any = None, *, fence: tuple[str, int] | None = None) -> Task:
        """Mark ``task`` done and write its processed-id record, in one transaction.

        ``fence`` is ``(resource, fencing_token)`` of the lock guarding the work: the
        commit is refused (nothing written) when the resource has already accepted a
        higher token, and the token is recorded otherwise.

        Returns:
            The done task: ``task`` with what the commit wrote (status, version, result,
            lease fields cleared, ``updated_at``). The compare-and-set on id, lease token
            and version means its other fields are the stored row's as claimed. The SQLite
            and PostgreSQL stores do not read them back (one commit is a hot path): a
            field the caller changed in its own copy shows in the returned task, never in
            the store, which writes and records from its own row. ``get(task.id)`` reads
            the stored row. The same holds for :meth:`complete_many` and
            :meth:`complete_and_claim_next`.

        Raises:
            LeaseLostError: the lease is no longer the caller's; nothing written.
            TaskNotFoundError: no such task.
            FencingTokenRejectedError: ``fence`` carries an outdated token.
        """
        ...

    async def complete_and_claim_next(
        self,
        task: Task,
        result: Any = None,
        *,
        fence: tuple[str, int] | None = None,
        lease_s: float = 30.0,
    ) -> Continuation:
        """Commit-and-continue: complete ``task`` and lease its key's next task, in one transaction.

        The commit is exactly :meth:`complete` (compare-and-set, processed-id record,
        fence). When it goes through, the same transaction makes the queue keep per-key
        order (as an ordered :meth:`claim` does) and leases the next task of ``task``'s
        queue and partition key to ``task.lease_owner`` if that task is now the key's
        head (its earliest unfinished task), pending and due, as an ordered claim of
        that one key would: fresh lease token, attempts + 1, version + 1. A node working
        through one conversation in order thus needs no wake-up and no claim between
        two of its tasks. A next task whose idempotency key is already processed is
        settled as a duplicate instead (``duplicate_delivery_suppressed``) and none is
        returned. Partitions and ``min_due_age_s`` play no part: the key is the task's.
        A node bounds how many tasks in a row it takes this way
        (``NodeConfig.claim_next_max``).

        Args:
            task: The task as returned by ``claim`` (or a previous continuation).
            result: Optional JSON result kept on the task.
            fence: ``(resource, fencing_token)`` checked and recorded as in :meth:`complete`.
            lease_s: Lease length of the next task, seconds (0.01, ``validation.MIN_LEASE_S``, to
                one year). Default 30.

        Returns:
            A :class:`~asynccoord.models.Continuation`: the done task and the next task
            (None when the key had no pending task due).

        Raises:
            LeaseLostError: the lease is no longer the caller's; nothing written or leased.
            TaskNotFoundError: no such task.
            FencingTokenRejectedError: ``fence`` carries an outdated token.
            InvalidTypeError, InvalidArgumentError: bad arguments (nothing written).
        """
        ...

    async def complete_many(
        self,
        tasks: Sequence[Task],
        results: Sequence[Any] | None = None,
        *,
        fences: Sequence[tuple[str, int] | None] | None = None,
    ) -> list[Task | CoordError]:
        """Complete many tasks in one transaction, each with its own compare-and-set.

        ``fences`` holds, per task, None or ``(resource, fencing_token)`` checked and
        recorded as in :meth:`complete`.

        Returns:
            Per task, in order: the done task, or the error saying why nothing was
            written for it (LeaseLostError, TaskNotFoundError or
            FencingTokenRejectedError). One lost lease does not stop the others.
        """
        ...

    async def fail(self, task: Task, error: str, *, retry: RetryPolicy | None = None, dead: bool = False) -> Task:
        """Record a failed attempt: back to pending after the backoff, or dead (after the last
        attempt, or at once with ``dead``).

        Raises:
            LeaseLostError: the lease is no longer the caller's; nothing written.
            TaskNotFoundError: the task no longer exists (a dead task discarded, say).
        """
        ...

    async def release(self, task: Task, *, delay_s: float = 0.0, count_attempt: bool = False) -> Task:
        """Hand an unfinished task back to pending, due after ``delay_s`` (>= 0, default 0: now),
        not counting the attempt unless ``count_attempt`` (its send may have reached the receiver).

        A counted release on the task's last attempt leaves it dead instead, as a lease that
        expired then does (``last_error`` says it was released on its last attempt; its key
        follows the dead-letter policy): a task gets at most ``max_attempts`` deliveries.

        Raises:
            LeaseLostError: the lease is no longer the caller's; nothing written.
            TaskNotFoundError: the task no longer exists (a dead task discarded, say).
        """
        ...

    async def extend(self, task: Task, lease_s: float) -> float:
        """Renew the lease to ``lease_s`` seconds from now; return the new expiry.

        Raises:
            LeaseLostError: the lease expired or was taken; it is not revived.
            InvalidTypeError, InvalidArgumentError: a bad task, or ``lease_s`` not a number
                in 0.01 (``validation.MIN_LEASE_S``) .. one year (nothing written).
        """
        ...

    async def extend_many(self, tasks: Sequence[Task], lease_s: float) -> list[bool]:
        """Renew many leases in one statement; True where the lease was still held.

        Raises:
            InvalidTypeError, InvalidArgumentError: a bad task, or ``lease_s`` not a number
                in 0.01 (``validation.MIN_LEASE_S``) .. one year (nothing written).
        """
        ...

    async def get(self, task_id: int) -> Task:
        """The task with that id. Raises TaskNotFoundError."""
        ...

    async def stats(self, queue: str | None = None) -> QueueStats:
        """Counts by status and the oldest due pending age, for a queue or all."""
        ...

    async def is_drained(self, queue: str) -> bool:
        """True when ``queue`` has no pending and no running task (done and dead ones are finished).

        A probe of the unfinished tasks' indexes, not a count over the table as
        :meth:`stats` makes: cheap to poll. Raises InvalidArgumentError/InvalidTypeError
        for a bad ``queue``.
        """
        ...

    async def dead_letters(self, queue: str, *, limit: int = 100, after_id: int | None = None) -> list[Task]:
        """The dead tasks of ``queue``, in id order, a page at a time: what :meth:`requeue_dead`
        and :meth:`discard_dead` would act on.

        A read: nothing is written or locked, and it works on a store opened read-only.
        Pages are keyset-paginated: pass the last id of a page as ``after_id`` to get the
        next one; a page shorter than ``limit`` is the last. Each page is read as the
        database stands then: a task that dies after its id was paged past is not seen,
        and one requeued or discarded before its page is read is not in it.

        Args:
            queue: Queue name.
            limit: Most tasks to return, 1..10000 (:data:`MAX_DEAD_LETTERS_LIMIT`). Default 100.
            after_id: Only tasks with a greater id; None (the default) from the first.
                An int in ``0..2**63-1``.

        Returns:
            Up to ``limit`` tasks with status ``dead``, ascending id; each has its payload,
            ``attempts``/``max_attempts``, ``last_error`` and ``updated_at`` (when it died, by
            the store clock).

        Raises:
            InvalidTypeError, InvalidArgumentError: a bad ``queue``, ``limit`` or ``after_id``,
                naming it (nothing is read).
        """
        ...

    async def requeue_dead(self, queue: str, task_ids: Sequence[int] | None = None) -> int:
        """Move dead tasks back to pending with attempts reset; return how many.

        Args:
            queue: Queue name.
            task_ids: Only these dead tasks (ids of tasks that are not dead are skipped);
                None for every dead task of the queue.

        A requeued task keeps its place (its id) in its key's order: in an ordered queue
        it is the key's head again at once, ahead of the tasks that went on while it was
        dead, so if a later task of the key is running at that moment, both may run at
        the same time. Requeue while the key is idle when that matters.
        """
        ...

    async def discard_dead(self, queue: str, task_ids: Sequence[int] | None = None) -> int:
        """Delete dead tasks for good; return how many.

        Args:
            queue: Queue name.
            task_ids: Only these dead tasks (ids of tasks that are not dead are skipped);
                None for every dead task of the queue.

        A conversation held by its dead task (policy ``hold``, see
        :class:`~asynccoord.contract.deadletters.DeadLetterStore`) goes on from its next
        task. The idempotency key of a discarded task is free again.
        """
        ...

    async def is_processed(self, consumer: str, message_id: str) -> bool:
        """Whether a processed-id record exists for ``(consumer, message_id)``."""
        ...

    async def purge_processed(self, *, older_than_s: float | None = None, batch: int | None = None) -> PurgeResult:
        """Delete processed-id records older than the retention, in bounded batches."""
        ...

    async def purge_finished(self, queue: str, *, older_than_s: float, batch: int = 1000) -> PurgeResult:
        """Delete ``done`` tasks of ``queue`` last updated more than ``older_than_s`` ago (dead ones are kept)."""
        ...

    async def unchecked_claim(
        self,
        queue: str,
        *,
        node_id: str,
        limit: int = 1,
        lease_s: float = 30.0,
        partitions: Collection[int] | None = None,
    ) -> list[Task]:
        """Claim as a naive queue does: read due pending tasks, then lease them without a compare-and-set.

        What it skips: the read and the write are separate steps (separate transactions on
        SQLite and PostgreSQL), so two nodes can lease the same task; no per-key order, no
        dead-lettering of exhausted leases, no duplicate-delivery check. Its arguments are
        checked as :meth:`claim` checks them. Who may call it: only
        :class:`~asynccoord.node.node.Node` when a benchmark turns its version checks off,
        to measure what the compare-and-set layer buys. Never use it for real work.
        """
        ...

    async def unchecked_complete(self, tasks: Sequence[Task], results: Sequence[Any] | None = None) -> int:
        """Mark tasks done without a compare-and-set; return how many rows were written.

        What it skips: the lease, token and version checks (a task another node holds is
        marked done all the same), fences and processed-id records. Its arguments are
        checked as :meth:`complete_many` checks them. Who may call it: only the node of a
        benchmark without version checks, beside :meth:`unchecked_claim`.
        """
        ...


@dataclass(frozen=True, slots=True)
class PreparedTask:
    """A validated :class:`NewTask` with its payload encoded and partition computed."""

    queue: str
    partition_key: str
    partition: int
    idempotency_key: str | None
    payload_json: str
    priority: int
    max_attempts: int
    delay_s: float
    limit_keys: dict[str, str]
    limit_keys_json: str | None


def prepare_tasks(
    tasks: Sequence[NewTask], config: StoreConfig, partitions: int, *, single: bool = False
) -> list[PreparedTask]:
    """Validate and encode every task before any of them is written.

    ``single``: ``tasks`` is the one task of an ``enqueue`` call, whose errors name its
    argument ``payload`` (``tasks[i].payload`` otherwise).

    Raises:
        InvalidTypeError: ``tasks`` is not a sequence of NewTask.
        InvalidArgumentError, PayloadTooLargeError: a payload the store cannot keep.
    """
    if not isinstance(tasks, list | tuple):
        raise InvalidTypeError(f"tasks must be a list or tuple of NewTask, got {type(tasks).__name__}")
    prepared: list[PreparedTask] = []
    for index, task in enumerate(tasks):
        if not isinstance(task, NewTask):
            raise InvalidTypeError(f"tasks[{index}] must be a NewTask, got {type(task).__name__}")
        prepared.append(
            PreparedTask(
                queue=task.queue,
                partition_key=task.partition_key,
                partition=partition_of(task.partition_key, partitions),
                idempotency_key=task.idempotency_key,
                payload_json=encode_payload(
                    task.payload,
                    max_bytes=config.max_payload_bytes,
                    arg="payload" if single else f"tasks[{index}].payload",
                ),
                priority=task.priority,
                max_attempts=task.max_attempts if task.max_attempts is not None else config.retry.max_attempts,
                delay_s=float(task.delay_s),
                limit_keys=dict(task.limit_keys),
                limit_keys_json=encode_limit_keys(task.limit_keys),
            )
        )
    return prepared


def check_purge_batch(batch: object) -> int:
    """Check a purge's ``batch`` (rows per delete statement): an int in 1..``MAX_PURGE_BATCH``.

    One bound for every backend (PostgreSQL takes the ``LIMIT`` as an ``integer``).
    """
    return check_int("batch", batch, minimum=1, maximum=MAX_PURGE_BATCH)


def check_claim_args(
    queue: object,
    node_id: object,
    limit: object,
    lease_s: object,
    partitions: object,
    ordered: object,
    partition_count: int,
) -> tuple[str, str, int, float, list[int] | None, bool]:
    """Validate ``claim`` arguments; return them normalized.

    Raises:
        InvalidTypeError, InvalidArgumentError: naming the bad argument.
    """
    check_name("queue", queue)
    check_name("node_id", node_id)
    check_int("limit", limit, minimum=1, maximum=MAX_CLAIM_LIMIT)
    lease = check_lease_s("lease_s", lease_s)
    check_bool("ordered", ordered)
    parts = check_partition_list(partitions, partition_count)
    return cast(str, queue), cast(str, node_id), cast(int, limit), lease, parts, cast(bool, ordered)


def check_claimable_args(
    queue: object, partitions: object, ordered: object, min_due_age_s: object, partition_count: int
) -> tuple[list[int] | None, float]:
    """Check ``claimable_partitions``' arguments; return (partitions or None, min_due_age_s).

    Raises:
        InvalidTypeError, InvalidArgumentError: naming the bad argument.
    """
    check_name("queue", queue)
    parts = check_partition_list(partitions, partition_count)
    check_bool("ordered", ordered)
    return parts, check_non_negative("min_due_age_s", min_due_age_s)


def check_partition_list(partitions: object, partition_count: int) -> list[int] | None:
    """Check an optional collection of partition numbers (each in ``0..partition_count - 1``).

    A list, tuple or range is taken in its order; a set (``set``, ``frozenset``, a dict's
    keys: what :meth:`~asynccoord.membership.Membership.owned_partitions` returns) is taken
    sorted, so the same set gives the same list in every process.

    Raises:
        InvalidTypeError: ``partitions`` is neither None, a sequence nor a set (a dict, a
            str or bytes are refused), or an item is not an int.
        InvalidArgumentError: an item outside ``0..partition_count - 1``.
    """
    if partitions is None:
        return None
    if type(partitions) is not list:
        if isinstance(partitions, AbstractSet):
            ints = all(type(p) is int for p in partitions)
            partitions = sorted(partitions) if ints else sorted(partitions, key=_sort_key)
        elif not is_partition_collection(partitions):
            raise partitions_type_error("partitions", partitions)
    checked = list(partitions)
    # Every claim of a node names its partitions (hundreds): one pass in C for the common case.
    if all(type(p) is int for p in checked) and (not checked or 0 <= min(checked) <= max(checked) < partition_count):
        return checked
    return [check_int(f"partitions[{i}]", p, minimum=0, maximum=partition_count - 1) for i, p in enumerate(checked)]


def _sort_key(item: object) -> tuple[int, str]:
    """Order a set's items for :func:`check_partition_list`: ints by value, anything else after
    them by repr, so a set holding a wrong type sorts, and the wrong item is then named."""
    return (item, "") if type(item) is int else (2**63, repr(item))


def _looks_leased(task: Task) -> bool:
    """True if :func:`check_task` surely accepts ``task`` (one expression, no error text built).

    The name checks are :func:`check_key`'s ASCII fast path written out: this runs once
    per task of every commit, and a call per name costs more than the checks themselves.
    """
    i, v, p, a, m = task.id, task.version, task.partition, task.attempts, task.max_attempts
    token, queue, key, idem = task.lease_token, task.queue, task.partition_key, task.idempotency_key
    return (
        type(i) is int
        and 0 <= i <= MAX_ID
        and type(v) is int
        and 0 <= v <= MAX_ID
        and type(p) is int
        and 0 <= p <= MAX_PARTITION
        and type(a) is int
        and 0 <= a <= MAX_ATTEMPTS
        and type(m) is int
        and 1 <= m <= MAX_ATTEMPTS
        and type(task.status) is TaskStatus
        and type(token) is str
        and token.isascii()
        and 0 < len(token) <= MAX_NAME_LENGTH
        and "\x00" not in token
        and not token.isspace()
        and type(queue) is str
        and queue.isascii()
        and 0 < len(queue) <= MAX_NAME_LENGTH
        and "\x00" not in queue
        and not queue.isspace()
        and type(key) is str
        and key.isascii()
        and len(key) <= MAX_NAME_LENGTH
        and "\x00" not in key
        and (
            idem is None
            or (type(idem) is str and idem.isascii() and 0 < len(idem) <= MAX_NAME_LENGTH and "\x00" not in idem)
        )
    )


def check_task(task: object) -> Task:
    """Check that ``task`` is a leased :class:`Task` as returned by ``claim``.

    Every field a store reads from the caller's copy (the compare-and-set key
    ``id``/``lease_token``/``version``, and ``queue``, ``partition_key``,
    ``partition``, ``idempotency_key``, ``status``, ``attempts``, ``max_attempts``)
    is checked for type and range, so a tampered or hand-made Task is refused with
    a typed error instead of reaching the database driver. A store then acts on its
    own row's queue, key and attempt counts, never on those of the caller's copy.

    Raises:
        InvalidTypeError: not a Task, or a field of the wrong type (``bool`` is not an int).
        InvalidArgumentError: the task carries no lease token (it was never claimed),
            or a field out of range (an id or version outside ``0..2**63-1``...).
    """
    if type(task) is Task and _looks_leased(task):
        return task  # the common case, on every task of a hot path; the checks below name the fault
    if not isinstance(task, Task):
        raise InvalidTypeError(f"task must be a Task returned by claim, got {type(task).__name__}")
    check_int("task.id", task.id, minimum=0, maximum=MAX_ID)
    if task.lease_token is None:
        raise InvalidArgumentError(f"task {task.id} carries no lease (status {task.status}): claim it first")
    check_key("task.lease_token", task.lease_token)
    check_int("task.version", task.version, minimum=0, maximum=MAX_ID)
    check_key("task.queue", task.queue)
    check_key("task.partition_key", task.partition_key, allow_empty=True)
    check_int("task.partition", task.partition, minimum=0, maximum=MAX_PARTITION)
    check_optional_key("task.idempotency_key", task.idempotency_key, allow_blank=True)
    if not isinstance(task.status, TaskStatus):
        raise InvalidTypeError(f"task.status must be a TaskStatus, got {type(task.status).__name__} {task.status!r}")
    check_int("task.attempts", task.attempts, minimum=0, maximum=MAX_ATTEMPTS)
    check_int("task.max_attempts", task.max_attempts, minimum=1, maximum=MAX_ATTEMPTS)
    return task


def check_tasks(tasks: object) -> list[Task]:
    """Check a list or tuple of leased tasks (see :func:`check_task`)."""
    if not isinstance(tasks, list | tuple):
        raise InvalidTypeError(f"tasks must be a list or tuple of Task, got {type(tasks).__name__}")
    for t in tasks:
        if type(t) is not Task or not _looks_leased(t):
            check_task(t)  # raises naming the fault (or accepts a task the fast path cannot judge)
    return list(tasks)


def encode_results(results: object, count: int, config: StoreConfig) -> list[str | None]:
    """JSON texts of per-task results (``None`` means no result for any task)."""
    if results is None:
        return [None] * count
    if not isinstance(results, list | tuple):
        raise InvalidTypeError(f"results must be a list or tuple, got {type(results).__name__}")
    if len(results) != count:
        raise InvalidArgumentError(f"results has {len(results)} items for {count} tasks")
    return [encode_result(r, config) for r in results]


def check_fences(fences: object, count: int) -> list[tuple[str, int] | None] | None:
    """Check per-task ``(resource, fencing_token)`` pairs (or None entries)."""
    if fences is None:
        return None
    if not isinstance(fences, list | tuple):
        raise InvalidTypeError(f"fences must be a list or tuple, got {type(fences).__name__}")
    if len(fences) != count:
        raise InvalidArgumentError(f"fences has {len(fences)} items for {count} tasks")
    out: list[tuple[str, int] | None] = []
    for i, fence in enumerate(fences):
        if fence is None:
            out.append(None)
            continue
        if not isinstance(fence, tuple) or len(fence) != 2:
            raise InvalidTypeError(f"fences[{i}] must be a (resource, fencing_token) tuple or None, got {fence!r}")
        resource = check_name(f"fences[{i}] resource", fence[0])
        token = check_int(f"fences[{i}] fencing_token", fence[1], minimum=1, maximum=MAX_ID)
        out.append((resource, token))
    return out


def check_continuation(
    task: object, result: Any, fence: object, lease_s: object, config: StoreConfig
) -> tuple[list[Task], list[str | None], list[tuple[str, int] | None] | None, float, str]:
    """Check ``complete_and_claim_next``'s arguments; return them as ``complete_many`` takes them.

    Returns:
        ``(tasks, encoded results, fences, lease_s, owner)``: ``owner`` is the task's
        ``lease_owner``, who the next task is leased to (a lease belongs to its token; the
        owner is its label, checked as a name here like a claim's ``node_id``).

    Raises:
        InvalidTypeError, InvalidArgumentError: naming the bad argument.
    """
    checked = [check_task(task)]
    owner = check_name("task.lease_owner", checked[0].lease_owner)
    encoded = [encode_result(result, config)]
    fenced = check_fences(None if fence is None else [fence], 1)
    return checked, encoded, fenced, check_lease_s("lease_s", lease_s), owner


def check_dead_letters_args(queue: object, limit: object, after_id: object) -> tuple[str, int, int | None]:
    """Check ``dead_letters``' arguments; return ``(queue, limit, after_id)``.

    Raises:
        InvalidTypeError: ``queue`` is no str, ``limit`` or ``after_id`` no int (a bool is none).
        InvalidArgumentError: an empty or blank ``queue``, ``limit`` outside
            1..:data:`MAX_DEAD_LETTERS_LIMIT`, ``after_id`` outside ``0..2**63-1``.
    """
    checked = check_name("queue", queue)
    size = check_int("limit", limit, minimum=1, maximum=MAX_DEAD_LETTERS_LIMIT)
    after = None if after_id is None else check_int("after_id", after_id, minimum=0, maximum=MAX_ID)
    return checked, size, after


def check_task_ids(task_ids: object) -> list[int] | None:
    """Check an optional list or tuple of task ids."""
    if task_ids is None:
        return None
    if not isinstance(task_ids, list | tuple):
        raise InvalidTypeError(f"task_ids must be a list or tuple of int, or None; got {type(task_ids).__name__}")
    return [check_int(f"task_ids[{i}]", task_id, minimum=0, maximum=MAX_ID) for i, task_id in enumerate(task_ids)]


def check_retry(retry: object, config: StoreConfig) -> RetryPolicy:
    """The policy to use for ``fail``: ``retry`` if given, else the store's."""
    if retry is None:
        return config.retry
    if not isinstance(retry, RetryPolicy):
        raise InvalidTypeError(f"retry must be a RetryPolicy or None, got {type(retry).__name__}")
    return retry


def clean_error(error: object) -> str:
    """An error text the store can keep: str, no NUL, no lone surrogate, bounded length.

    Raises:
        InvalidTypeError: ``error`` is not a str.
    """
    if not isinstance(error, str):
        raise InvalidTypeError(f"error must be a str, got {type(error).__name__}")
    text = error.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def encode_result(result: Any, config: StoreConfig) -> str | None:
    """JSON text of a task result (None stays None)."""
    if result is None:
        return None
    return encode_payload(result, max_bytes=config.max_payload_bytes, arg="result")
