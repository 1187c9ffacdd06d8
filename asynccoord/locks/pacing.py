"""Send-time pacing of a lock's sends: a GCRA on the times the lock's holder sends, handed on with the lock.

A queue's rate limits are taken when tasks are claimed (:mod:`asynccoord.contract.ratelimits`),
which bounds how many sends of a key may start in a window, but not when they start: a
task claimed with a token may then wait for its key's lock (held by a stalled process until
its TTL, or by another process's turns), and the sends that waited go out back to back once
the lock is free. A provider judges the times the sends arrive, so when the lock serialises
every send of a limited key (a bot account's lock and the account's limit) the holder keeps
a second bucket, on the times it sends: :class:`LockPacer` delays a send until it conforms
to the same limit (GCRA, ITU-T Recommendation I.371, "virtual scheduling"), on the process's
monotonic clock.

The bucket is only as good as its holder's knowledge of the sends before its own. A lease
whose fencing token is the one after the last this process held (nobody acquired the lock
in between) carries the process's bucket on. Any other lease starts from an empty bucket at
the moment the holder first paces with it: the previous holder, in another process, may
have spent every token, but its last send returned before it gave the lock back, so one
send per emission interval from then on is always within the limit. Never comparing
another process's clock, the hand-over costs at most one interval and the key's burst.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..contract.locks import Lease
from ..contract.ratelimits import RateLimit, conforms, eligible_at, take

__all__ = ("LIMITS_REFRESH_S", "LockPacer")

LIMITS_REFRESH_S = 1.0
"""How long a queue's declared limits, read from the store, are used before they are read again."""

_NAMES = 4096
"""Lock names whose bucket a pacer remembers; the least recently paced is forgotten first
(forgetting is safe: that name's next lease starts from an empty bucket)."""


@dataclass(slots=True)
class _Bucket:
    fencing_token: int
    tat: float


class LockPacer:
    """The send-time buckets of the locks one process holds, by lock name (see the module docstring).

    One per :class:`~asynccoord.locks.pool.LockPool` (``pool.pacer``): the pool's turns
    serialise the process's sends under a name, so its bucket needs no lock of its own.

    Args:
        clock: Monotonic clock, seconds. Default :func:`time.monotonic`.
        sleep: Coroutine function that waits seconds. Default :func:`asyncio.sleep`.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        self._clock = clock
        self._sleep = sleep
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()
        self._limits: dict[tuple[int, str], tuple[float, object, dict[str, RateLimit]]] = {}

    def __repr__(self) -> str:
        return f"<LockPacer names={len(self._buckets)}>"

    async def pace(self, name: str, fencing_token: int, limit: RateLimit) -> float:
        """Wait until a send under lock ``name``, held with ``fencing_token``, conforms to ``limit``; count it.

        Call it while holding the lock, right before the send.

        Returns:
            Seconds waited (0.0 when the send conforms at once).
        """
        now = self._clock()
        bucket = self._buckets.get(name)
        if bucket is None or fencing_token not in (bucket.fencing_token, bucket.fencing_token + 1):
            # Another holder (or a forgotten one) had the lock since: an empty bucket from now.
            bucket = _Bucket(fencing_token, now + limit.tolerance_s + limit.interval_s)
        self._buckets[name] = bucket
        self._buckets.move_to_end(name)
        if len(self._buckets) > _NAMES:
            self._buckets.popitem(last=False)
        waited = 0.0
        if not conforms(bucket.tat, now, limit):
            at = eligible_at(bucket.tat, limit)
            assert at is not None
            await self._sleep(at - now)
            later = self._clock()
            waited = later - now
            now = max(later, at)
        bucket.fencing_token = fencing_token
        bucket.tat = take(bucket.tat, now, limit)
        return waited

    async def pace_declared(self, store: Any, queue: str, dimension: str, lease: Lease) -> float:
        """:meth:`pace` a send under ``lease`` to ``queue``'s declared limit on ``dimension``, if it has one.

        Args:
            store: The queue's store (a :class:`~asynccoord.contract.ratelimits.RateLimitStore`).
            queue: The queue whose limits apply.
            dimension: The limit's dimension, e.g. ``"account"``.
            lease: The lock's lease the send is made under.

        Returns:
            Seconds waited.
        """
        limit = await self.limit(store, queue, dimension)
        return 0.0 if limit is None else await self.pace(lease.name, lease.fencing_token, limit)

    async def limit(self, store: Any, queue: str, dimension: str) -> RateLimit | None:
        """``queue``'s declared limit on ``dimension`` (None: none), read with ``store.rate_limits(queue)``
        at most once a :data:`LIMITS_REFRESH_S` per store and queue."""
        now = self._clock()
        cached = self._limits.get((id(store), queue))
        if cached is None or cached[0] <= now or cached[1] is not store:
            declared = {x.dimension: x for x in await store.rate_limits(queue)}
            cached = (self._clock() + LIMITS_REFRESH_S, store, declared)
            self._limits[(id(store), queue)] = cached
        return cached[2].get(dimension)
