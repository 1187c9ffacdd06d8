"""The store base: the queue's public verbs written once, over the few statements each engine supplies.

Every verb of :class:`~asynccoord.contract.queue.QueueStore` is defined here: it checks
its arguments once (with the checks of :mod:`asynccoord.contract.queue`, so nothing is
written when one is bad, and every engine refuses the same values with the same
message), implements what is the same for every engine (the single-task forms of the
batch operations, the events and wake-ups that follow a write), and hands the checked,
normalized arguments to one engine primitive, a method whose name ends in ``_checked``.
An engine (:mod:`asynccoord.backends.memory.store`, ``sqlite``, ``postgres``) writes only
those primitives: its own statements, transactions and retries. The shape is that of
saq's ``queue/base.py`` (an abstract queue whose public methods call the abstract
primitives of each backend).
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Self

from .. import events as ev
from ..config import RetryPolicy, StoreConfig
from ..contract.queue import (
    MAX_ID,
    PreparedTask,
    check_claim_args,
    check_claimable_args,
    check_continuation,
    check_dead_letters_args,
    check_fences,
    check_purge_batch,
    check_retry,
    check_task,
    check_task_ids,
    check_tasks,
    clean_error,
    encode_results,
    prepare_tasks,
)
from ..errors import CoordError, InvalidTypeError, LeaseLostError, TaskNotFoundError, UnreadableRowError
from ..events import EventCounter
from ..models import Continuation, EnqueueResult, NewTask, PurgeResult, QueueStats, Task, UnreadableValue
from ..notify import WorkNotifier
from ..validation import check_bool, check_int, check_key, check_lease_s, check_name, check_non_negative
from .calls import CallGate
from .rows import UnreadableClaim, with_stored_fields
from .wakeups import notify_created

__all__ = ("RELEASED_ON_LAST_ATTEMPT", "StoreBase")

log = logging.getLogger(__name__)

RELEASED_ON_LAST_ATTEMPT = "released on its last attempt with the attempt counted (its send may have gone out)"
"""The ``last_error`` of a task that ``release(count_attempt=True)`` left dead (see :meth:`StoreBase.release`)."""


class StoreBase(abc.ABC):
    """The public queue verbs of every store; an engine subclasses it and writes the ``*_checked`` primitives.

    Each primitive receives arguments the public verb has checked and normalized (for
    example ``partitions`` as a list of ints or None, results as JSON text) and does the
    engine's part: open-state checks, statements, transactions, the engine's events.
    The public verbs' docstrings are the contract's (:class:`~asynccoord.contract.queue.QueueStore`).
    """

    config: StoreConfig
    events: EventCounter
    notifier: WorkNotifier

    # --- life cycle -------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @abc.abstractmethod
    async def open(self) -> None:
        """Connect, apply the schema, and get ready; refused with StoreAlreadyOpenError while open."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Finish queued writes and close. Idempotent."""

    @property
    @abc.abstractmethod
    def partitions(self) -> int:
        """Number of fixed partitions keys are hashed into."""

    def _check_writable(self) -> None:
        """Raise before a write that reads first (``fail``) when the store refuses writes; by default nothing."""
        return

    # --- enqueue ----------------------------------------------------------------------

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
        """Add one task (fields as in :class:`~asynccoord.models.NewTask`); see :meth:`enqueue_many`.

        A cancelled call may still have added it: retry with the same ``idempotency_key``
        (see :meth:`~asynccoord.contract.queue.QueueStore.enqueue`).

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
        return (await self._enqueue_prepared(prepare_tasks([spec], self.config, self.partitions, single=True)))[0]

    async def enqueue_many(self, tasks: Sequence[NewTask]) -> list[EnqueueResult]:
        """Add tasks in one transaction; results in input order.

        A repeated idempotency key (already stored, or earlier in ``tasks``) yields the
        existing task with ``created=False`` and counts one ``duplicate_enqueue_suppressed``
        event. Idle in-process nodes owning the partitions of new tasks due now are woken.
        A cancelled call may still have added them: retry with the same idempotency keys.

        Raises:
            InvalidTypeError, InvalidArgumentError, PayloadTooLargeError: before anything is written.
        """
        return await self._enqueue_prepared(prepare_tasks(tasks, self.config, self.partitions))

    async def _enqueue_prepared(self, prepared: list[PreparedTask]) -> list[EnqueueResult]:
        """Write checked tasks (see :meth:`enqueue_many`), count the duplicates, wake the idle nodes."""
        results = await self._enqueue_checked(prepared)
        self.events.add(ev.DUPLICATE_ENQUEUE_SUPPRESSED, sum(1 for r in results if not r.created))
        notify_created(self.notifier, results, prepared)
        return results

    @abc.abstractmethod
    async def _enqueue_checked(self, prepared: list[PreparedTask]) -> list[EnqueueResult]:
        """Write the prepared tasks in one transaction; the results in input order."""

    # --- claim ------------------------------------------------------------------------

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
        """Lease up to ``limit`` due tasks to ``node_id`` (see :meth:`~asynccoord.contract.queue.QueueStore.claim`).

        ``min_due_age_s`` > 0 takes only tasks that have been due at least that long
        (work stealing from overloaded or dead partition owners).

        Raises:
            InvalidTypeError, InvalidArgumentError: a bad argument (nothing claimed).
            StoreBusyError, StoreConnectionError: the engine's database stayed locked or unreachable.
        """
        queue, node_id, limit, lease, parts, ordered = check_claim_args(
            queue, node_id, limit, lease_s, partitions, ordered, self.partitions
        )
        due_age = check_non_negative("min_due_age_s", min_due_age_s)
        return await self._claim_checked(queue, node_id, limit, lease, parts, ordered, due_age)

    @abc.abstractmethod
    async def _claim_checked(
        self,
        queue: str,
        node_id: str,
        limit: int,
        lease_s: float,
        parts: list[int] | None,
        ordered: bool,
        due_age_s: float,
    ) -> list[Task]:
        """Lease up to ``limit`` due tasks; count claims, expiries, dead letters and duplicates."""

    async def _dead_letter_unreadable(self, unreadable: Sequence[UnreadableClaim]) -> None:
        """Dead-letter the tasks a claim leased whose rows cannot be decoded (a poison message).

        Each one: its attempt stays counted, ``last_error`` names the column and why, its
        key's next task follows the queue's dead-letter policy as after any dead letter, one
        warning (``asynccoord.store.unreadable_task``) and the ``unreadable_task`` and
        ``dead_lettered`` events. A task whose lease moved on meanwhile is left to its new
        holder; a store error is logged and the lease left to expire (the next claim of the
        task tries again), so the claim still hands out its other tasks.
        """
        for claim in unreadable:
            try:
                await self._dead_letter_unreadable_one(claim.task, claim.error)
            except (LeaseLostError, TaskNotFoundError):
                continue
            except CoordError as exc:
                log.warning("asynccoord.store.unreadable_task_left task=%d error=%s", claim.task.id, exc)
                continue

    async def _dead_letter_unreadable_one(self, task: Task, error: UnreadableRowError, *, count: bool = False) -> Task:
        """Dead-letter ``task``, held by the caller, whose row cannot be decoded (``error`` says why).

        One warning (``asynccoord.store.unreadable_task``), ``last_error`` naming the column
        and why, the ``unreadable_task`` and ``dead_lettered`` events. ``count``: a refusal
        counts as a stale commit (as ``fail`` counts one).

        Raises:
            LeaseLostError, TaskNotFoundError: the lease is no longer the caller's (nothing written).
        """
        why = clean_error(f"stored {error.column} is unreadable: {error.reason}")
        dead = await self._dead_letter_checked(task, why, count=count)
        log.warning(
            "asynccoord.store.unreadable_task task=%d queue=%s column=%s reason=%s",
            error.task_id,
            task.queue,
            error.column,
            error.reason,
        )
        self.events.add(ev.UNREADABLE_TASK)
        self.events.add(ev.DEAD_LETTERED)
        return dead

    async def _stored_of(self, task: Task) -> tuple[Task, UnreadableRowError | None]:
        """``task`` with its stored row's counts (:func:`with_stored_fields`), and why that row cannot be
        decoded, if it cannot (its ``payload`` or ``result`` written by another tool while the task was held).

        Raises:
            TaskNotFoundError: the task no longer exists.
            UnreadableRowError: the row's ``status`` is none of the four.
        """
        stored = await self._stored_checked(task.id)
        error = None
        for value in (stored.payload, stored.result):
            if isinstance(value, UnreadableValue):
                error = UnreadableRowError(task.id, value.column, value.reason)
                break
        return with_stored_fields(task, stored), error

    async def _stored_checked(self, task_id: int) -> Task:
        """As :meth:`_get_checked`, but a ``payload`` or ``result`` that cannot be decoded is listed as an
        :class:`~asynccoord.models.UnreadableValue` (stores whose rows another tool may write override it)."""
        return await self._get_checked(task_id)

    async def claimable_partitions(
        self,
        queue: str,
        partitions: Collection[int] | None = None,
        *,
        ordered: bool = False,
        min_due_age_s: float = 0.0,
    ) -> set[int]:
        """The partitions where a claim with these arguments would find work now (a read).

        See :meth:`~asynccoord.contract.queue.QueueStore.claimable_partitions`.

        Raises:
            InvalidTypeError, InvalidArgumentError: a bad argument.
            StoreClosedError: the store is not open.
        """
        parts, due_age = check_claimable_args(queue, partitions, ordered, min_due_age_s, self.partitions)
        return await self._claimable_checked(queue, parts, ordered, due_age)

    @abc.abstractmethod
    async def _claimable_checked(
        self, queue: str, parts: list[int] | None, ordered: bool, due_age_s: float
    ) -> set[int]:
        """The partitions of ``parts`` (None: all) holding work a claim would take now."""

    async def unchecked_claim(
        self,
        queue: str,
        *,
        node_id: str,
        limit: int = 1,
        lease_s: float = 30.0,
        partitions: Collection[int] | None = None,
    ) -> list[Task]:
        """Claim as a naive queue does: read due tasks, then mark them running, unconditionally.

        See :meth:`~asynccoord.contract.queue.QueueStore.unchecked_claim`: two nodes can
        claim the same task. Exists only so benchmarks can show what the version layer
        buys; never use it to process real work.
        """
        queue, node_id, limit, lease, parts, _ = check_claim_args(
            queue, node_id, limit, lease_s, partitions, False, self.partitions
        )
        return await self._unchecked_claim_checked(queue, node_id, limit, lease, parts)

    @abc.abstractmethod
    async def _unchecked_claim_checked(
        self, queue: str, node_id: str, limit: int, lease_s: float, parts: list[int] | None
    ) -> list[Task]:
        """The naive claim: a read, then a write that leases what the read found."""

    # --- complete ---------------------------------------------------------------------

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
        checked = check_task(task)
        encoded = encode_results([result], 1, self.config)
        fenced = check_fences(None if fence is None else [fence], 1)
        outcome = await self._complete_one_checked(checked, encoded[0], None if fenced is None else fenced[0])
        if isinstance(outcome, Task):
            return outcome
        raise outcome

    async def _complete_one_checked(
        self, task: Task, result_json: str | None, fence: tuple[str, int] | None
    ) -> Task | CoordError:
        """One commit: by default the batch primitive with one task."""
        return (await self._complete_many_checked([task], [result_json], None if fence is None else [fence]))[0]

    async def complete_many(
        self,
        tasks: Sequence[Task],
        results: Sequence[Any] | None = None,
        *,
        fences: Sequence[tuple[str, int] | None] | None = None,
    ) -> list[Task | CoordError]:
        """Complete many tasks in one transaction, each with its own compare-and-set.

        Args:
            tasks: Tasks as returned by ``claim`` (any mix of queues and leases).
            results: One JSON result per task, or None for no results.
            fences: Per task, None or ``(resource, fencing_token)`` checked and recorded
                in the same transaction (see :meth:`complete`); None for no fences. Each is
                checked against the tokens recorded before the call: the commits of one call
                are fenced as if they landed at once, so two tokens of one resource in one
                call are both accepted if neither is below the recorded one.

        Returns:
            Per task, in order: the done task, or the error saying why nothing was
            written for it (:class:`LeaseLostError`, :class:`TaskNotFoundError`, or
            :class:`FencingTokenRejectedError`). One task's failure does not stop the others.

        Raises:
            InvalidTypeError, InvalidArgumentError: a bad task or result (nothing written).
        """
        checked = check_tasks(tasks)
        encoded = encode_results(results, len(checked), self.config)
        fenced = check_fences(fences, len(checked))
        return await self._complete_many_checked(checked, encoded, fenced)

    @abc.abstractmethod
    async def _complete_many_checked(
        self, tasks: list[Task], results: list[str | None], fences: list[tuple[str, int] | None] | None
    ) -> list[Task | CoordError]:
        """Commit each task with its own compare-and-set (and fence), in one transaction; count the outcomes."""

    async def complete_and_claim_next(
        self,
        task: Task,
        result: Any = None,
        *,
        fence: tuple[str, int] | None = None,
        lease_s: float = 30.0,
    ) -> Continuation:
        """Complete ``task`` and lease its key's next task, in one transaction.

        See :meth:`~asynccoord.contract.queue.QueueStore.complete_and_claim_next`.

        Raises:
            LeaseLostError, TaskNotFoundError, FencingTokenRejectedError: as :meth:`complete`;
                nothing written or leased.
            InvalidTypeError, InvalidArgumentError: bad arguments (nothing written).
        """
        checked, encoded, fenced, lease, owner = check_continuation(task, result, fence, lease_s, self.config)
        return await self._complete_and_claim_next_checked(
            checked[0], encoded[0], None if fenced is None else fenced[0], lease, owner
        )

    @abc.abstractmethod
    async def _complete_and_claim_next_checked(
        self, task: Task, result_json: str | None, fence: tuple[str, int] | None, lease_s: float, owner: str
    ) -> Continuation:
        """Commit ``task`` and lease its key's head to ``owner`` for ``lease_s`` seconds; raise the commit's error."""

    async def unchecked_complete(self, tasks: Sequence[Task], results: Sequence[Any] | None = None) -> int:
        """Mark tasks done without any compare-and-set (benchmarks only); return rows written.

        See :meth:`~asynccoord.contract.queue.QueueStore.unchecked_complete`.
        """
        checked = check_tasks(tasks)
        encoded = encode_results(results, len(checked), self.config)
        return await self._unchecked_complete_checked(checked, encoded)

    @abc.abstractmethod
    async def _unchecked_complete_checked(self, tasks: list[Task], results: list[str | None]) -> int:
        """Mark the tasks done, no compare-and-set; count the commits; return rows written."""

    # --- fail, release, extend --------------------------------------------------------

    async def fail(self, task: Task, error: str, *, retry: RetryPolicy | None = None, dead: bool = False) -> Task:
        """Record a failed attempt: pending again after the backoff, or dead after the last (or at once, with ``dead``).

        A task whose stored row can no longer be decoded (its ``payload`` or ``result``
        rewritten by another tool while it was held) goes dead at once, ``last_error`` naming
        the column and why (the ``unreadable_task`` event).

        Args:
            task: The task as returned by ``claim``.
            error: What went wrong (kept as ``last_error``; truncated to 8192 characters).
            retry: A :class:`~asynccoord.config.RetryPolicy` for the delay; default the store's.
                Its ``max_attempts`` is not used: the task's own, fixed at enqueue, is.
            dead: Dead-letter the task now, whatever attempts it has left (the provider refused
                its message for good: :class:`~asynccoord.errors.Undeliverable`). Default False.

        Raises:
            LeaseLostError: the lease is no longer the caller's; nothing written.
            TaskNotFoundError: the task no longer exists (a dead task discarded, say).
            InvalidTypeError: bad ``task``, ``error``, ``retry`` or ``dead``.
        """
        check_task(task)
        text = clean_error(error)
        policy = check_retry(retry, self.config)
        final = check_bool("dead", dead)
        return await self._fail_checked(task, text, policy, final)

    async def _fail_checked(self, task: Task, error: str, retry: RetryPolicy, dead: bool = False) -> Task:
        """Dead-letter or retry ``task`` by the stored row's counts (never the caller's copy).

        Raises:
            LeaseLostError: the lease is no longer the caller's.
            TaskNotFoundError: the task no longer exists.
        """
        self._check_writable()
        task, unreadable = await self._stored_of(task)
        if unreadable is not None:  # its row was rewritten while held: a retry would only meet it again
            return await self._dead_letter_unreadable_one(task, unreadable, count=True)
        if dead or task.attempts >= task.max_attempts:
            out = await self._dead_letter_checked(task, error)
            self.events.add(ev.DEAD_LETTERED)
        else:
            out = await self._retry_checked(task, error, retry.delay_s(max(task.attempts, 1)))
            self.events.add(ev.RETRIES)
        return out

    async def _dead_letter_checked(self, task: Task, error: str, *, count: bool = True) -> Task:
        """Compare-and-set ``task`` to dead with ``error``; promote its key's next head.

        ``count``: a refusal counts as a stale commit (``stale_commit_rejected``); False for
        a hand-back (a refused ``release`` counts none).
        """
        raise NotImplementedError(f"{type(self).__name__} has no _dead_letter_checked")

    async def _retry_checked(self, task: Task, error: str, delay_s: float) -> Task:
        """Compare-and-set ``task`` back to pending, due in ``delay_s`` seconds, with ``error``."""
        raise NotImplementedError(f"{type(self).__name__} settles fail() in _fail_checked")

    async def release(self, task: Task, *, delay_s: float = 0.0, count_attempt: bool = False) -> Task:
        """Hand the task back to pending, by default without counting the attempt.

        With ``count_attempt`` on the task's last attempt (``attempts >= max_attempts``, as
        stored) the task goes dead instead, as it does when its lease expires on the last
        attempt: ``last_error`` says it was released on its last attempt
        (:data:`RELEASED_ON_LAST_ATTEMPT`), its key's next task follows the queue's
        dead-letter policy as after any dead-lettering, and ``dead_lettered`` is counted. A
        task never gets more deliveries than its ``max_attempts``. With ``count_attempt``, a
        task whose stored row can no longer be decoded goes dead too, as in :meth:`fail`.

        Args:
            task: The task as returned by ``claim``.
            delay_s: Seconds before it is due again (>= 0). Default 0: due now (idle
                in-process nodes owning its partition are woken). Unused when the task goes dead.
            count_attempt: Keep the attempt counted: the task's send was cut short and may
                have reached its receiver, so the next delivery's ``attempts`` (above 1)
                says it may repeat a message. Default False (the attempt is given back).

        Returns:
            The task as now stored: pending, or dead (see above).

        Raises:
            LeaseLostError: the lease is no longer the caller's; nothing written.
            TaskNotFoundError: the task no longer exists (a dead task discarded, say).
            InvalidTypeError: ``count_attempt`` is not a bool (nothing written).
        """
        check_task(task)
        delay = check_non_negative("delay_s", delay_s)
        if not isinstance(count_attempt, bool):
            raise InvalidTypeError(f"count_attempt must be a bool, got {type(count_attempt).__name__}")
        # A hand-back, its attempt counted or not: let through while the store closes (see CallGate).
        with CallGate.giving_back():
            if count_attempt:
                self._check_writable()
                stored, unreadable = await self._stored_of(task)  # the stored counts, never the caller's
                if unreadable is not None:  # its row was rewritten while held: the next claim would meet it
                    return await self._dead_letter_unreadable_one(stored, unreadable)
                if stored.attempts >= stored.max_attempts:
                    dead = await self._dead_letter_checked(stored, RELEASED_ON_LAST_ATTEMPT, count=False)
                    self.events.add(ev.DEAD_LETTERED)
                    return dead
            out = await self._release_checked(task, delay, count_attempt)
        if delay == 0:
            self.notifier.notify(out.queue, 1, (out.partition,))
        return out

    @abc.abstractmethod
    async def _release_checked(self, task: Task, delay_s: float, count_attempt: bool) -> Task:
        """Compare-and-set ``task`` back to pending, due in ``delay_s`` seconds, the attempt counted or not."""

    async def extend(self, task: Task, lease_s: float) -> float:
        """Renew the lease to ``lease_s`` seconds from now; return the new expiry (store clock).

        An expired lease is never revived, even when nobody reclaimed the task.

        Raises:
            LeaseLostError: the lease expired or was taken.
            InvalidTypeError, InvalidArgumentError: a bad task or ``lease_s`` (nothing written).
        """
        check_task(task)
        lease = check_lease_s("lease_s", lease_s)
        return await self._extend_checked(task, lease)

    @abc.abstractmethod
    async def _extend_checked(self, task: Task, lease_s: float) -> float:
        """Renew one live lease; raise LeaseLostError (not counted as a stale commit) or TaskNotFoundError."""

    async def extend_many(self, tasks: Sequence[Task], lease_s: float) -> list[bool]:
        """Renew many leases with one statement; True for each lease still held.

        Raises:
            InvalidTypeError, InvalidArgumentError: a bad task or ``lease_s``.
        """
        checked = check_tasks(tasks)
        lease = check_lease_s("lease_s", lease_s)
        return await self._extend_many_checked(checked, lease)

    @abc.abstractmethod
    async def _extend_many_checked(self, tasks: list[Task], lease_s: float) -> list[bool]:
        """Renew the leases still held, by ``(id, lease_token)``; True for each."""

    # --- inspection and maintenance ---------------------------------------------------

    async def get(self, task_id: int) -> Task:
        """The task with that id.

        Raises:
            TaskNotFoundError: no such task.
            InvalidTypeError: ``task_id`` is not an int.
        """
        check_int("task_id", task_id, minimum=0, maximum=MAX_ID)
        return await self._get_checked(task_id)

    @abc.abstractmethod
    async def _get_checked(self, task_id: int) -> Task:
        """The stored task; TaskNotFoundError if there is none."""

    async def stats(self, queue: str | None = None) -> QueueStats:
        """Counts by status and the oldest due pending age (store clock), for ``queue`` or all."""
        if queue is not None:
            check_name("queue", queue)
        return await self._stats_checked(queue)

    @abc.abstractmethod
    async def _stats_checked(self, queue: str | None) -> QueueStats:
        """Counts by status and the oldest due pending age, in one snapshot."""

    async def is_drained(self, queue: str) -> bool:
        """True when ``queue`` has no pending and no running task (done and dead ones are finished).

        Raises:
            InvalidArgumentError, InvalidTypeError: a bad ``queue``.
        """
        check_name("queue", queue)
        return await self._is_drained_checked(queue)

    @abc.abstractmethod
    async def _is_drained_checked(self, queue: str) -> bool:
        """Whether ``queue`` has no unfinished task (a probe, not a count)."""

    async def dead_letters(self, queue: str, *, limit: int = 100, after_id: int | None = None) -> list[Task]:
        """The dead tasks of ``queue`` in id order, at most ``limit``, ids above ``after_id`` (a read).

        See :meth:`~asynccoord.contract.queue.QueueStore.dead_letters`.

        Raises:
            InvalidTypeError, InvalidArgumentError: a bad ``queue``, ``limit`` or ``after_id`` (nothing read).
        """
        queue, limit, after = check_dead_letters_args(queue, limit, after_id)
        return await self._dead_letters_checked(queue, limit, after)

    @abc.abstractmethod
    async def _dead_letters_checked(self, queue: str, limit: int, after_id: int | None) -> list[Task]:
        """Up to ``limit`` dead tasks of ``queue`` with ids above ``after_id`` (None: all), ascending id."""

    async def requeue_dead(self, queue: str, task_ids: Sequence[int] | None = None) -> int:
        """Move dead tasks of ``queue`` (all, or those ids) back to pending with attempts reset; return how many.

        See :meth:`~asynccoord.contract.queue.QueueStore.requeue_dead`.
        """
        check_name("queue", queue)
        ids = check_task_ids(task_ids)
        return await self._requeue_dead_checked(queue, ids)

    @abc.abstractmethod
    async def _requeue_dead_checked(self, queue: str, task_ids: list[int] | None) -> int:
        """Requeue the dead tasks (all of ``queue``, or those ids); recompute their keys' heads."""

    async def discard_dead(self, queue: str, task_ids: Sequence[int] | None = None) -> int:
        """Delete dead tasks of ``queue`` (all, or those ids); return how many.

        Raises:
            InvalidTypeError, InvalidArgumentError: a bad queue or ids (nothing written).
        """
        check_name("queue", queue)
        return await self._discard_dead_checked(queue, check_task_ids(task_ids))

    @abc.abstractmethod
    async def _discard_dead_checked(self, queue: str, task_ids: list[int] | None) -> int:
        """Delete the dead tasks (and let the keys they held go on); return how many."""

    async def is_processed(self, consumer: str, message_id: str) -> bool:
        """Whether ``(consumer, message_id)`` has a processed-id record (consumer = queue name)."""
        check_name("consumer", consumer)
        check_key("message_id", message_id, allow_blank=True)
        return await self._is_processed_checked(consumer, message_id)

    @abc.abstractmethod
    async def _is_processed_checked(self, consumer: str, message_id: str) -> bool:
        """Whether the processed-id record exists."""

    async def purge_processed(self, *, older_than_s: float | None = None, batch: int | None = None) -> PurgeResult:
        """Delete processed-id records older than ``older_than_s`` (default: the retention).

        Each batch is its own short transaction, so a large purge never holds the
        write lock for long.

        Args:
            older_than_s: Age cutoff, seconds (>= 0); default ``config.processed.retention_s``.
            batch: Rows per delete statement, 1..2**31 - 1 (``validation.MAX_PURGE_BATCH``);
                default ``config.processed.purge_batch``.
        """
        age = (
            self.config.processed.retention_s
            if older_than_s is None
            else check_non_negative("older_than_s", older_than_s)
        )
        size = self.config.processed.purge_batch if batch is None else check_purge_batch(batch)
        return await self._purge_processed_checked(age, size)

    @abc.abstractmethod
    async def _purge_processed_checked(self, older_than_s: float, batch: int) -> PurgeResult:
        """Delete processed-id records older than ``older_than_s``, ``batch`` rows per statement."""

    async def purge_finished(self, queue: str, *, older_than_s: float, batch: int = 1000) -> PurgeResult:
        """Delete ``done`` tasks of ``queue`` last updated more than ``older_than_s`` ago.

        Dead tasks are kept (they wait for a person). Processed-id records are kept
        by their own retention, so a redelivery after this purge is still recognized.
        """
        check_name("queue", queue)
        age = check_non_negative("older_than_s", older_than_s)
        size = check_purge_batch(batch)
        return await self._purge_finished_checked(queue, age, size)

    @abc.abstractmethod
    async def _purge_finished_checked(self, queue: str, older_than_s: float, batch: int) -> PurgeResult:
        """Delete done tasks of ``queue`` older than ``older_than_s``, ``batch`` rows per statement."""
