"""How a node fetches, locks, sends and commits: :class:`NodeConfig`, checked once when made.

Every field is checked in ``__post_init__`` (types, ranges, units in seconds), so the
pipeline reads them as they are, task after task, without checking them again. The
switches that only measure what a layer buys (partitioning, locks, version checks) are
not here: see :mod:`asynccoord.node.ablation`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import RetryPolicy
from ..contract.locks import MAX_PERMITS
from ..errors import InvalidArgumentError, InvalidTypeError
from ..validation import (
    check_bool,
    check_int,
    check_interval_s,
    check_lease_s,
    check_name,
    check_non_negative,
    check_positive,
)

_DEFAULT_MAX_ATTEMPTS = RetryPolicy().max_attempts
"""The only ``max_attempts`` a node's retry policy may carry (it sets delays only: see ``NodeConfig.retry``)."""

__all__ = ("MAX_IN_FLIGHT", "NodeConfig", "check_lock_pacing")

MAX_IN_FLIGHT = 1_000_000
"""The most sends one node may run at once (``NodeConfig.max_in_flight``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeConfig:
    """How a node fetches, locks, sends and commits.

    Args:
        queue: Queue to drain. Default ``"default"``.
        lease_s: Task lease length, seconds, 0.01 (``validation.MIN_LEASE_S``) to one year
            (renewed every ``lease_s / 3`` while a send runs when ``renew_leases``). Default 30.
            A commit the store cannot take at that moment (busy: SQLite's write lock held
            past ``busy_timeout_s``; unreachable: PostgreSQL past ``reconnect_timeout_s``,
            10 s by default) is tried again with backoff while the lease lasts. Keep
            ``lease_s`` well above ``reconnect_timeout_s``: one store call can spend that
            long reconnecting after its first failure (and a connect timeout more), and a
            commit whose lease ended meanwhile is not tried again (whoever reclaims the
            task sends it again, counted as ``lease_expired``).
        claim_batch: Most tasks per claim. Default 32.
        max_in_flight: Most sends at once on this node (1 to ``MAX_IN_FLIGHT``, 1,000,000). Default 32.
        send_timeout_s: Longest a send may take before it counts as failed. Default 30.
        send_overrun_s: Longest the node still waits, after cutting a send at
            ``send_timeout_s``, for a send that ignores its cancellation past its cleanup
            time (:data:`~asynccoord.node.send.SEND_CLEANUP_S`), seconds, >= 0. Meanwhile
            the task lease and the lock stay held and renewed, so no other send under the
            lock starts and the task is not sent again. A send that then returns is
            committed; one still running at the bound is let go (logged, the lock handed
            on, the attempt failed). A lost lease or lock, or the node's cancellation at
            the end of the drain, ends the wait at once. 0: let go at the end of the
            cleanup time. None: ``send_timeout_s``. Default None.
        ordered: Per-key (per-conversation) ordering. Default True.
        idle_min_s / idle_max_s: Backoff after a claim that came back short, seconds,
            growing from min to max with full jitter with every empty claim and reset
            by a full one; an in-process enqueue or a commit that unblocks one of the
            node's keys wakes it at once (also one that arrives while it claims).
            Each at least 0.001 (``validation.MIN_INTERVAL_S``), and max >= min.
            Defaults 0.05 and 1.0 (a standalone idle node costs about 2 claims/s at
            rest). In a Runtime the nodes do not back off by themselves: the runtime's
            one idle poll runs on this backoff for all of them (see
            :mod:`asynccoord.node.idlepoll`), about 2 reads/s per process at rest.
        idle_fallback_s: A node that does not poll by itself (``Node(idle_poll=False)``,
            as a Runtime makes them) still claims after waiting 0.5 to 1 times this long
            without a wake-up: a safety net, should the idle poll fail. At least 0.001.
            Default 30.
        lock_ttl_s: Lock lease length, seconds, 0.01 (``validation.MIN_LEASE_S``) to one
            year (renewed with the task lease). Default 10.
        lock_permits: Permits per lock name: 1 for a lock, N (at most 2**31 - 1, the
            semaphore's bound ``MAX_PERMITS``) for a semaphore. Default 1. Only a lock's
            fencing token fences the commit: the holders of a semaphore's permits finish
            in any order, so their tokens do not.
        lock_wait_s: Longest wait for a busy lock before the task is handed back. Default 5.
            The wait also ends at the task lease's local deadline (the task then goes back
            at once, counted as ``lease_lost``).
        lock_pace_dimension: A rate-limit dimension of the queue whose sends the lock
            serialises (a bot account's lock and the ``"account"`` limit), or None. The
            lock's holder then also spaces its sends to the queue's declared limit on that
            dimension (:mod:`asynccoord.locks.pacing`): tokens are taken at the claim, but a
            task may wait for its lock after it, and the sends that waited would otherwise
            reach the provider back to back when the lock comes free. Needs a lock
            (``lock_key`` and ``lock_permits`` 1); no limit declared on the dimension, or
            one whose interval (``per_s / count``) is ``lock_wait_s`` or longer, no pacing
            (see :meth:`~asynccoord.locks.pacing.LockPacer.pace_turn`); a queue that declares
            limits but none on the dimension is logged once at WARNING
            (``asynccoord.node.lock_pace_unknown_dimension``). It also names the 429s that
            pause the lock (:mod:`asynccoord.pauses`): one naming no dimension always does,
            one naming a dimension only if it is this one (without it, logged once as
            ``asynccoord.pauses.lock_not_paused``). Default None.
        busy_requeue_s: Delay of a task handed back because its lock stayed busy, at least
            0.001 (``validation.MIN_INTERVAL_S``: the task would come straight back). Default 0.05.
        renew_leases: Keep task leases (and locks) alive while sends run. Default True.
        work_stealing: An idle node also claims tasks of partitions it does not own that
            have waited ``steal_after_s`` (their owner is overloaded or dead). Default False.
        steal_after_s: See ``work_stealing``. Default 5.
        claim_next: Commit-and-continue, for ordered queues with version checks: each
            commit also leases the key's next task to this node in the same transaction
            (``store.complete_and_claim_next``), and the node sends it next in the same
            slot, with no wake-up and no claim between two tasks of a conversation. Only
            while the node is claiming and still owns the key's partition. Default True.
        claim_next_max: Most tasks one slot takes in a row by ``claim_next`` while every
            other slot of the node is busy: past it, a commit made with no slot free is a
            plain one and the slot goes back to claiming, so a busy conversation cannot
            keep a slot from the others' work for ever. While a slot is free, the others'
            work has one, and the conversation goes on. Default 64.
        affinity_cache_size: Conversations whose context dict a node keeps. Default 1024.
        retry: Backoff policy for failed sends; None uses the store's. Default None.
            Its delays only: a task's number of attempts is fixed at enqueue
            (``NewTask.max_attempts``, else the store's ``StoreConfig.retry``), and the
            store's ``fail`` dead-letters a task whose attempts reached it (as does a claim
            that finds such a task's lease lapsed). A ``max_attempts`` other than the
            default is refused (:class:`~asynccoord.errors.InvalidArgumentError`) rather
            than ignored.
        tracing: Trace each delivery with OpenTelemetry (:mod:`asynccoord.node.tracing`)
            when the ``otel`` extra is installed; the spans go to the tracer provider the
            application configures. False: no spans, and no tracing call per task. Default True.
    """

    queue: str = "default"
    lease_s: float = 30.0
    claim_batch: int = 32
    max_in_flight: int = 32
    send_timeout_s: float = 30.0
    send_overrun_s: float | None = None
    ordered: bool = True
    idle_min_s: float = 0.05
    idle_max_s: float = 1.0
    idle_fallback_s: float = 30.0
    lock_ttl_s: float = 10.0
    lock_permits: int = 1
    lock_wait_s: float = 5.0
    lock_pace_dimension: str | None = None
    busy_requeue_s: float = 0.05
    renew_leases: bool = True
    work_stealing: bool = False
    steal_after_s: float = 5.0
    claim_next: bool = True
    claim_next_max: int = 64
    affinity_cache_size: int = 1024
    retry: RetryPolicy | None = None
    tracing: bool = True

    def __post_init__(self) -> None:
        check_name("queue", self.queue)
        check_lease_s("lease_s", self.lease_s)
        check_int("claim_batch", self.claim_batch, minimum=1, maximum=10_000)
        check_int("max_in_flight", self.max_in_flight, minimum=1, maximum=MAX_IN_FLIGHT)
        check_positive("send_timeout_s", self.send_timeout_s)
        if self.send_overrun_s is not None:
            check_non_negative("send_overrun_s", self.send_overrun_s)
        check_interval_s("idle_min_s", self.idle_min_s)
        check_interval_s("idle_max_s", self.idle_max_s)
        if self.idle_max_s < self.idle_min_s:
            raise InvalidArgumentError(f"idle_max_s ({self.idle_max_s!r}) must be >= idle_min_s ({self.idle_min_s!r})")
        check_interval_s("idle_fallback_s", self.idle_fallback_s)
        check_lease_s("lock_ttl_s", self.lock_ttl_s)
        check_int("lock_permits", self.lock_permits, minimum=1, maximum=MAX_PERMITS)
        check_positive("lock_wait_s", self.lock_wait_s)
        check_interval_s("busy_requeue_s", self.busy_requeue_s)
        if self.lock_pace_dimension is not None:
            check_name("lock_pace_dimension", self.lock_pace_dimension)
            if self.lock_permits != 1:
                raise InvalidArgumentError(
                    f"lock_pace_dimension={self.lock_pace_dimension!r} needs a lock (lock_permits=1), got "
                    f"lock_permits={self.lock_permits!r}: a semaphore's holders send at once, so none paces the others"
                )
        for name in (
            "renew_leases",
            "work_stealing",
            "ordered",
            "claim_next",
            "tracing",
        ):
            check_bool(name, getattr(self, name))
        check_positive("steal_after_s", self.steal_after_s)
        check_int("affinity_cache_size", self.affinity_cache_size, minimum=0)
        check_int("claim_next_max", self.claim_next_max, minimum=1)
        if self.retry is not None and not isinstance(self.retry, RetryPolicy):
            raise InvalidTypeError(f"retry must be a RetryPolicy or None, got {type(self.retry).__name__}")
        if self.retry is not None and self.retry.max_attempts != _DEFAULT_MAX_ATTEMPTS:
            raise InvalidArgumentError(
                f"retry=RetryPolicy(max_attempts={self.retry.max_attempts!r}) would be ignored: NodeConfig.retry sets "
                "the delays between attempts only, and a task's number of attempts is fixed when it is enqueued. "
                "Set it there: store.enqueue(..., max_attempts=...) or NewTask(max_attempts=...), or "
                "StoreConfig(retry=RetryPolicy(max_attempts=...)) for every task enqueued without one; "
                "leave max_attempts out of NodeConfig.retry"
            )


def check_lock_pacing(config: NodeConfig, lock_key: object, store: object) -> None:
    """Refuse a node whose ``config.lock_pace_dimension`` it could not honour (no lock, no rate limits).

    Raises:
        InvalidArgumentError: pacing asked for without a ``lock_key``.
        InvalidTypeError: pacing asked for with a store that keeps no rate limits.
    """
    pace = config.lock_pace_dimension
    if pace is None:
        return
    if lock_key is None:
        raise InvalidArgumentError(
            f"config.lock_pace_dimension={pace!r} paces the sends a lock serialises, but this node has no "
            "lock_key: pass lock_key (the function naming each task's lock), or leave lock_pace_dimension None"
        )
    if not callable(getattr(store, "rate_limits", None)):
        raise InvalidTypeError(
            f"config.lock_pace_dimension={pace!r} needs a store with rate limits (rate_limits(queue)), "
            f"got {type(store).__name__}"
        )
