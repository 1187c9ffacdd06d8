"""Argument preparation shared by every backend, so all of them validate alike."""

from __future__ import annotations

import dataclasses
import json
import secrets
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ..config import RetryPolicy, StoreConfig
from ..errors import CoordError, InvalidArgumentError, InvalidTypeError
from ..models import DeadLetterPolicy, EnqueueResult, NewTask, Task, TaskSlots, TaskStatus, make_task
from ..notify import WorkNotifier
from ..partition import partition_of
from ..validation import (
    MAX_ATTEMPTS,
    MAX_NAME_LENGTH,
    MAX_PURGE_BATCH,
    check_bool,
    check_int,
    check_lease_s,
    check_name,
    check_non_negative,
    check_optional_name,
    encode_payload,
    is_partition_collection,
    partitions_type_error,
)
from .ratelimits import encode_limit_keys

__all__ = (
    "QueueConveniences",
    "MAX_ATTEMPTS",
    "MAX_CLAIM_LIMIT",
    "MAX_ERROR_CHARS",
    "MAX_ID",
    "MAX_PARTITION",
    "PreparedTask",
    "check_claim_args",
    "check_claimable_args",
    "check_fences",
    "check_partition_list",
    "check_purge_batch",
    "check_retry",
    "check_task",
    "check_dead_letter_policy",
    "check_task_ids",
    "check_tasks",
    "clean_error",
    "decode_json",
    "encode_result",
    "encode_results",
    "new_token",
    "notify_created",
    "notify_partitions",
    "notify_settled",
    "prepare_tasks",
    "settled_done",
    "task_from_row",
    "with_stored_fields",
)

MAX_CLAIM_LIMIT = 10_000
MAX_ID = 2**63 - 1
"""Largest task id (and row count) an SQL INTEGER holds."""
MAX_ERROR_CHARS = 8192
MAX_PARTITION = (1 << 16) - 1
"""Largest partition index (``StoreConfig.partitions`` is at most 65536)."""


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


def prepare_tasks(tasks: Sequence[NewTask], config: StoreConfig, partitions: int) -> list[PreparedTask]:
    """Validate and encode every task before any of them is written.

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
                    task.payload, max_bytes=config.max_payload_bytes, arg=f"tasks[{index}].payload"
                ),
                priority=task.priority,
                max_attempts=task.max_attempts if task.max_attempts is not None else config.retry.max_attempts,
                delay_s=float(task.delay_s),
                limit_keys=dict(task.limit_keys),
                limit_keys_json=encode_limit_keys(task.limit_keys),
            )
        )
    return prepared


class QueueConveniences:
    """The single-task forms of the batch operations, the same for every store."""

    if TYPE_CHECKING:

        async def enqueue_many(self, tasks: Sequence[NewTask]) -> list[EnqueueResult]: ...

        async def complete_many(
            self,
            tasks: Sequence[Task],
            results: Sequence[Any] | None = None,
            *,
            fences: Sequence[tuple[str, int] | None] | None = None,
        ) -> list[Task | CoordError]: ...

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
        """Add one task (fields as in :class:`~asynccoord.models.NewTask`); see ``enqueue_many``.

        Raises:
            InvalidTypeError, InvalidArgumentError, PayloadTooLargeError: before anything is written.
        """
        spec = NewTask(
            queue=queue,
            payload=payload,
            partition_key=partition_key,
            idempotency_key=idempotency_key,
            priority=priority,
            max_attempts=max_attempts,
            delay_s=delay_s,
            limit_keys={} if limit_keys is None else limit_keys,
        )
        return (await self.enqueue_many([spec]))[0]

    async def complete(self, task: Task, result: Any = None, *, fence: tuple[str, int] | None = None) -> Task:
        """Mark ``task`` done and record its message id as processed, in one transaction.

        Args:
            task: The task as returned by ``claim``.
            result: Optional JSON result kept on the task.
            fence: ``(resource, fencing_token)`` of the lock guarding the work: the commit
                is refused (nothing written) when the resource has already accepted a
                higher token, and the token is recorded otherwise.

        Returns:
            The committed task: its state as now stored (status ``done``, version + 1,
            ``result``, lease cleared, ``updated_at``); its other fields (queue, key,
            payload...), which a commit never changes, are those of ``task`` as passed,
            not read back (on SQLite and PostgreSQL: a payload the caller changed in place
            comes back changed; the stored row keeps the enqueued one).

        Raises:
            LeaseLostError: the lease is no longer the caller's; nothing written.
            TaskNotFoundError: the task no longer exists.
            FencingTokenRejectedError: ``fence`` carries an outdated token.
            InvalidTypeError, InvalidArgumentError: bad ``task``, ``result`` or ``fence``.
        """
        outcome = (await self.complete_many([task], [result], fences=None if fence is None else [fence]))[0]
        if isinstance(outcome, Task):
            return outcome
        raise outcome


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
            partitions = sorted(partitions, key=_sort_key)
        elif not is_partition_collection(partitions):
            raise partitions_type_error("partitions", partitions)
    return [check_int("partitions[i]", p, minimum=0, maximum=partition_count - 1) for p in partitions]


def _sort_key(item: object) -> tuple[int, str]:
    """Order a set's items for :func:`check_partition_list`: ints by value, anything else after
    them by repr, so a set holding a wrong type sorts, and the wrong item is then named."""
    return (item, "") if type(item) is int else (2**63, repr(item))


def _looks_leased(task: Task) -> bool:
    """True if :func:`check_task` surely accepts ``task`` (one expression, no error text built).

    The name checks are :func:`check_name`'s ASCII fast path written out: this runs once
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
    a typed error instead of reaching the database driver.

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
    check_name("task.lease_token", task.lease_token)
    check_int("task.version", task.version, minimum=0, maximum=MAX_ID)
    check_name("task.queue", task.queue)
    check_name("task.partition_key", task.partition_key, allow_empty=True)
    check_int("task.partition", task.partition, minimum=0, maximum=MAX_PARTITION)
    check_optional_name("task.idempotency_key", task.idempotency_key, allow_blank=True)
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


def settled_done(task: Task, *, version: int, now: float, result: Any) -> Task:
    """The stored state of ``task`` after a successful complete."""
    # Filled slot by slot as make_task does (not dataclasses.replace or Task(...)): this runs
    # once per committed task, and inlined it also saves make_task's 19-argument call.
    done: Any = _NEW(TaskSlots)
    done.id = task.id
    done.queue = task.queue
    done.partition_key = task.partition_key
    done.partition = task.partition
    done.idempotency_key = task.idempotency_key
    done.payload = task.payload
    done.priority = task.priority
    done.status = _DONE
    done.attempts = task.attempts
    done.max_attempts = task.max_attempts
    done.run_at = task.run_at
    done.lease_owner = None
    done.lease_token = None
    done.lease_expires_at = None
    done.version = version
    done.last_error = None
    done.result = result
    done.created_at = task.created_at
    done.updated_at = now
    done.__class__ = Task
    return done  # type: ignore[no-any-return]


_NEW = object.__new__
_DONE = TaskStatus.DONE


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
    checked = check_tasks([task])
    owner = check_name("task.lease_owner", checked[0].lease_owner)
    encoded = encode_results([result], 1, config)
    fenced = check_fences(None if fence is None else [fence], 1)
    return checked, encoded, fenced, check_lease_s("lease_s", lease_s), owner


def notify_created(notifier: WorkNotifier, results: Sequence[EnqueueResult], prepared: Sequence[PreparedTask]) -> None:
    """Wake idle in-process nodes that own the partitions of newly created tasks due now."""
    due: dict[str, set[int]] = {}
    counts: dict[str, int] = {}
    for result, p in zip(results, prepared, strict=True):
        if result.created and p.delay_s == 0:
            due.setdefault(p.queue, set()).add(p.partition)
            counts[p.queue] = counts.get(p.queue, 0) + 1
    for queue, partitions in due.items():
        notifier.notify(queue, counts[queue], partitions)


def notify_settled(notifier: WorkNotifier, tasks: Sequence[Task]) -> None:
    """Wake idle in-process nodes owning the partitions of settled tasks (their keys' next task may be due)."""
    by_queue: dict[str, set[int]] = {}
    for t in tasks:
        by_queue.setdefault(t.queue, set()).add(t.partition)
    for queue, partitions in by_queue.items():
        notifier.notify(queue, len(partitions), partitions)


def notify_partitions(notifier: WorkNotifier, promoted: Sequence[tuple[str, int]]) -> None:
    """Wake idle in-process nodes owning these ``(queue, partition)``: work became claimable there."""
    by_queue: dict[str, set[int]] = {}
    for queue, partition in promoted:
        by_queue.setdefault(queue, set()).add(partition)
    for queue, partitions in by_queue.items():
        notifier.notify(queue, len(partitions), partitions)


def check_dead_letter_policy(policy: object) -> DeadLetterPolicy:
    """Check a dead-letter policy: a :class:`DeadLetterPolicy` or its value, ``"skip"`` or ``"hold"``.

    Raises:
        InvalidTypeError: not a str.
        InvalidArgumentError: another string (the message names the allowed ones).
    """
    if not isinstance(policy, str):
        raise InvalidTypeError(f"policy must be a DeadLetterPolicy or 'skip' or 'hold', got {type(policy).__name__}")
    try:
        return DeadLetterPolicy(policy)
    except ValueError:
        raise InvalidArgumentError(f"policy must be 'skip' or 'hold', got {policy!r}") from None


def check_task_ids(task_ids: object) -> list[int] | None:
    """Check an optional list or tuple of task ids."""
    if task_ids is None:
        return None
    if not isinstance(task_ids, list | tuple):
        raise InvalidTypeError(f"task_ids must be a list or tuple of int, or None; got {type(task_ids).__name__}")
    return [check_int("task_ids[i]", i, minimum=0, maximum=MAX_ID) for i in task_ids]


def with_stored_fields(task: Task, stored: Task) -> Task:
    """``task`` with the queue, key, partition and attempt counts of ``stored``, its row now.

    ``fail`` decides between retry and dead letter from the attempt counts and promotes
    the next task of the queue and key: it must act on the store's values, never on a
    caller's copy that may have been modified. When ``stored`` no longer carries the
    caller's lease (token and version), ``task`` is returned as it is: the
    compare-and-set that follows refuses it.
    """
    if stored.lease_token != task.lease_token or stored.version != task.version:
        return task
    return dataclasses.replace(
        task,
        queue=stored.queue,
        partition_key=stored.partition_key,
        partition=stored.partition,
        attempts=stored.attempts,
        max_attempts=stored.max_attempts,
    )


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


# The standard library's own C scanner, which json.loads runs after two regex matches for
# surrounding whitespace: the texts a store reads back are the compact JSON it wrote, so
# the scanner alone decodes them in a fifth of the time (anything else goes to json.loads).
_SCAN_JSON: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def decode_json(text: str | None) -> Any:
    """Inverse of :func:`encode_result` / :func:`encode_payload`: None for None, else the JSON value.

    Raises:
        json.JSONDecodeError: ``text`` is not one JSON value.
    """
    if text is None:
        return None
    try:
        value, end = _SCAN_JSON(text, 0)
    except StopIteration:  # not a value at index 0 (leading whitespace, empty, garbage)
        return json.loads(text)
    if end != len(text):  # trailing whitespace or garbage: json.loads accepts or names it
        return json.loads(text)
    return value


_STATUS = {s.value: s for s in TaskStatus}


def task_from_row(row: Sequence[Any]) -> Task:
    """The task of a full row read back from a store's own ``coord_tasks`` table.

    ``row`` holds the 19 Task fields in declaration order, ``payload`` and ``result`` as
    JSON text and ``status`` as its name (the stores' ``RETURNING``/``SELECT`` column
    order). No validation: the store wrote these values (see ``make_task``).
    """
    return make_task(
        row[0],
        row[1],
        row[2],
        row[3],
        row[4],
        decode_json(row[5]),
        row[6],
        _STATUS[row[7]],
        row[8],
        row[9],
        row[10],
        row[11],
        row[12],
        row[13],
        row[14],
        row[15],
        decode_json(row[16]),
        row[17],
        row[18],
    )


def new_token() -> str:
    """A random token (128 bits, hex) for leases and lock ownership."""
    return secrets.token_hex(16)
