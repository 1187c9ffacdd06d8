"""Rate limits of the in-memory store: declared limits and bucket TATs in dicts, the reference semantics.

:class:`MemoryRateLimitOps` is a mixin of :class:`~asynccoord.backends.memory.store.MemoryStore`.
The GCRA arithmetic and the claim's pass over its candidates are
:mod:`asynccoord.contract.ratelimits`'; this keeps the state and the verbs
(``set_rate_limits``, ``rate_limits``, ``report_rate_limited``). Each method hands control
to the loop once at its entry (the store's ``_enter``), then runs to completion without
awaiting, so each is atomic.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ... import events as ev
from ...contract.queue import check_task
from ...contract.ratelimits import (
    Admission,
    HeldBucket,
    RateLimit,
    check_held_buckets_args,
    check_pause_target,
    check_rate_limits,
    check_retry_after_s,
    conforms,
    held_wait_s,
    pause_targets,
    paused_tat,
    refused_task_delay_s,
    sort_held,
)
from ...events import EventCounter
from ...models import Task, TaskStatus
from ...notify import WorkNotifier
from ...validation import check_name
from ..refill import RefillWaker

__all__ = ("MemoryRateLimitOps",)


@dataclass(slots=True)
class _RateTables:
    limits: dict[str, dict[str, RateLimit]] = field(default_factory=dict)  # queue -> dimension -> limit
    buckets: dict[tuple[str, str, str], float] = field(default_factory=dict)  # (queue, dimension, key) -> TAT
    keys: dict[int, dict[str, str]] = field(default_factory=dict)  # task id -> its limit keys


class MemoryRateLimitOps:
    """Rate limits in plain Python objects (semantics as in :mod:`asynccoord.contract.ratelimits`).

    A mixin: it relies on the store's ``_clock``, ``_enter``, ``_tasks``, ``_held``,
    ``_put``, ``events`` and ``notifier``.
    """

    events: EventCounter
    notifier: WorkNotifier
    _clock: Callable[[], float]
    _tasks: dict[int, Task]

    if TYPE_CHECKING:

        async def _enter(self) -> None: ...

        def _held(self, task: Task, now: float, *, count: bool = True) -> Task: ...

        def _put(self, task: Task, now: float, **changes: Any) -> Task: ...

    @functools.cached_property
    def _rate(self) -> _RateTables:
        return _RateTables()

    @functools.cached_property
    def _refill(self) -> RefillWaker:
        return RefillWaker(self.notifier)

    async def set_rate_limits(self, queue: str, limits: Sequence[RateLimit]) -> None:
        """Declare ``queue``'s limits, replacing any it had (an empty list removes them); buckets keep their state."""
        check_name("queue", queue)
        checked = check_rate_limits(limits)
        await self._enter()
        if checked:
            self._rate.limits[queue] = {limit.dimension: limit for limit in checked}
        else:
            self._rate.limits.pop(queue, None)

    async def rate_limits(self, queue: str) -> list[RateLimit]:
        """``queue``'s declared limits, by dimension name."""
        check_name("queue", queue)
        await self._enter()
        return [self._rate.limits[queue][d] for d in sorted(self._rate.limits.get(queue, {}))]

    async def limited_queues(self) -> list[str]:
        """The queues that declare limits, by name."""
        await self._enter()
        return sorted(self._rate.limits)

    async def held_buckets(self, queue: str | None = None, limit: int = 50) -> list[HeldBucket]:
        """The buckets with no token now, longest wait first (see ``RateLimitStore.held_buckets``)."""
        name, most = check_held_buckets_args(queue, limit)
        await self._enter()
        now = self._clock()
        held = []
        for (q, dimension, key), tat in self._rate.buckets.items():
            declared = self._rate.limits.get(q, {}).get(dimension)
            if declared is None or (name is not None and q != name) or conforms(tat, now, declared):
                continue
            held.append(HeldBucket(queue=q, dimension=dimension, key=key, wait_s=held_wait_s(tat, now, declared)))
        return sort_held(held, most)

    def _declared(self, queue: str) -> dict[str, RateLimit]:
        return self._rate.limits.get(queue, {})

    def _admission(self, queue: str, now: float) -> Admission | None:
        """A claim's pass over ``queue``'s buckets, or None when the queue has no limits."""
        limits = self._rate.limits.get(queue)
        if not limits:
            return None
        buckets = self._rate.buckets
        return Admission(limits, now, lambda d, k: buckets.get((queue, d, k)))

    def _limit_keys_of(self, task_id: int) -> Mapping[str, str]:
        return self._rate.keys.get(task_id, {})

    def _settle_admission(self, queue: str, admission: Admission) -> None:
        """Store the tokens a claim took; count and schedule the wake-ups of what it held back."""
        for (dimension, key), tat in admission.changed.items():
            self._rate.buckets[(queue, dimension, key)] = tat
        if admission.held:
            self.events.add(ev.RATE_LIMIT_HELD)
        self._refill.schedule(queue, admission.wake_at, admission.now)

    async def report_rate_limited(
        self, task: Task, retry_after_s: float, *, dimension: str | None = None, key: str | None = None
    ) -> Task:
        """Pause the task's bucket(s) for ``retry_after_s`` and hand it back (semantics as in the SQLite store)."""
        check_task(task)
        retry = check_retry_after_s(retry_after_s)
        dim, chosen = check_pause_target(dimension, key)
        await self._enter()
        now = self._clock()
        stored = self._tasks.get(task.id)
        queue = task.queue if stored is None else stored.queue
        limits = self._declared(queue)
        keys = self._limit_keys_of(task.id)
        targets = pause_targets(limits, keys, dim, chosen)
        for d, k in targets:
            bucket = (queue, d, k)
            self._rate.buckets[bucket] = paused_tat(self._rate.buckets.get(bucket), now + retry, limits[d])
        self.events.add(ev.PROVIDER_RATE_LIMITED)
        current = self._held(task, now, count=False)  # a refused hand-back is no stale commit
        delay = refused_task_delay_s(targets, keys, retry)
        out = self._put(
            current,
            now,
            status=TaskStatus.PENDING,
            run_at=now + delay,
            attempts=max(current.attempts - 1, 0),
            last_error=f"RateLimited: the provider asked to retry after {retry:g} s",
        )
        self._refill.schedule(queue, {out.partition: now + retry}, now)
        return out
