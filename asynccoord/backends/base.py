"""The storage contract every backend implements.

A store is an async context manager that owns its connections. All time arithmetic
(run_at, lease expiry) is done against the store's own clock, so nodes on different
machines never compare their local clocks. Every method validates its arguments
before touching the database and raises the errors documented here; drivers' own
exceptions never leak (they become :class:`~asynccoord.errors.StoreError`).

The in-memory backend (:mod:`asynccoord.backends.memory`) is the reference
semantics; the contract test suite runs unchanged against every backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, Self, runtime_checkable

from ..config import RetryPolicy, StoreConfig
from ..errors import LeaseLostError, TaskNotFoundError
from ..events import EventCounter
from ..models import EnqueueResult, NewTask, PurgeResult, QueueStats, Task

__all__ = ("QueueStore", "Store")


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
    """

    config: StoreConfig
    events: EventCounter

    async def open(self) -> None:
        """Connect, apply schema migrations, and get ready. Idempotent."""
        ...

    async def close(self) -> None:
        """Finish queued writes and close. Idempotent."""
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
    ) -> EnqueueResult:
        """Add one task (fields as in :class:`~asynccoord.models.NewTask`)."""
        ...

    async def enqueue_many(self, tasks: Sequence[NewTask]) -> list[EnqueueResult]:
        """Add tasks in one transaction; results in input order.

        A repeated idempotency key (already stored, or earlier in ``tasks``) yields
        the existing task with ``created=False`` and counts one
        ``duplicate_enqueue_suppressed`` event.
        """
        ...

    async def claim(
        self,
        queue: str,
        *,
        node_id: str,
        limit: int = 1,
        lease_s: float = 30.0,
        partitions: Sequence[int] | None = None,
        ordered: bool = False,
    ) -> list[Task]:
        """Lease up to ``limit`` due tasks to ``node_id`` in one atomic statement.

        Args:
            queue: Queue name.
            node_id: Who claims (recorded as ``lease_owner``; ownership is by token).
            limit: Most tasks to claim, 1..10000.
            lease_s: Lease length, seconds (> 0).
            partitions: Only tasks in these partitions; None for all.
            ordered: Per-key ordering: a task is claimable only when no earlier task
                with the same partition key is pending or running.

        Returns:
            The claimed tasks, status ``running``, highest priority first then FIFO.
            Tasks whose idempotency key already has a processed-id record are
            marked done instead and counted as ``duplicate_delivery_suppressed``.
        """
        ...

    async def complete(self, task: Task, result: Any = None) -> Task:
        """Mark ``task`` done and write its processed-id record, in one transaction.

        Raises:
            LeaseLostError: the lease is no longer the caller's; nothing written.
            TaskNotFoundError: no such task.
        """
        ...

    async def complete_many(
        self, tasks: Sequence[Task], results: Sequence[Any] | None = None
    ) -> list[Task | LeaseLostError | TaskNotFoundError]:
        """Complete many tasks in one transaction, each with its own compare-and-set.

        Returns:
            Per task, in order: the done task, or the error saying why nothing was
            written for it. One lost lease does not stop the others.
        """
        ...

    async def fail(self, task: Task, error: str, *, retry: RetryPolicy | None = None) -> Task:
        """Record a failed attempt: back to pending after the backoff, or dead.

        Raises:
            LeaseLostError: the lease is no longer the caller's; nothing written.
        """
        ...

    async def release(self, task: Task) -> Task:
        """Hand an unfinished task back to pending, due now, not counting the attempt.

        Raises:
            LeaseLostError: the lease is no longer the caller's; nothing written.
        """
        ...

    async def extend(self, task: Task, lease_s: float) -> float:
        """Renew the lease to ``lease_s`` seconds from now; return the new expiry.

        Raises:
            LeaseLostError: the lease expired or was taken; it is not revived.
        """
        ...

    async def extend_many(self, tasks: Sequence[Task], lease_s: float) -> list[bool]:
        """Renew many leases in one statement; True where the lease was still held."""
        ...

    async def get(self, task_id: int) -> Task:
        """The task with that id. Raises TaskNotFoundError."""
        ...

    async def stats(self, queue: str | None = None) -> QueueStats:
        """Counts by status and the oldest due pending age, for a queue or all."""
        ...

    async def requeue_dead(self, queue: str, task_ids: Sequence[int] | None = None) -> int:
        """Move dead tasks back to pending with attempts reset; return how many."""
        ...

    async def is_processed(self, consumer: str, message_id: str) -> bool:
        """Whether a processed-id record exists for ``(consumer, message_id)``."""
        ...

    async def purge_processed(self, *, older_than_s: float | None = None, batch: int | None = None) -> PurgeResult:
        """Delete processed-id records older than the retention, in bounded batches."""
        ...


Store = QueueStore
"""The full storage contract (grows with locks and membership in their modules)."""
