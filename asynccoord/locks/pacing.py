"""Send-time pacing of a lock's sends: a GCRA on the times the lock's holder sends.

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
Only limits faster than a task's lock wait are paced (:meth:`LockPacer.pace_turn`): a
slower one is kept by the claim's tokens alone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..contract.locks import Lease
from ..contract.ratelimits import RateLimit, conforms, eligible_at, take

__all__ = ("LIMITS_REFRESH_S", "LockPacer", "PaceSettings", "PacedFlight", "PacedTurn")

log = logging.getLogger(__name__)

LIMITS_REFRESH_S = 1.0
"""How long a queue's declared limits, read from the store, are used before they are read again."""

_NAMES = 4096
"""Lock names whose bucket a pacer remembers; the least recently paced is forgotten first
(forgetting is safe: that name's next lease starts from an empty bucket)."""


class PaceSettings(Protocol):
    """What :meth:`LockPacer.pace_turn` reads of a node's settings (:class:`~asynccoord.node.config.NodeConfig`)."""

    @property
    def queue(self) -> str: ...

    @property
    def lock_pace_dimension(self) -> str | None: ...

    @property
    def lock_wait_s(self) -> float: ...


class PacedFlight(Protocol):
    """What :meth:`LockPacer.pace_turn` reads of a task's flight (:class:`~asynccoord.node.flight.Flight`)."""

    @property
    def lease_deadline(self) -> float: ...


class PacedTurn(Protocol):
    """What :meth:`LockPacer.pace_turn` needs of a lock turn (:class:`~asynccoord.locks.pool.Turn`)."""

    @property
    def lease(self) -> Lease: ...

    def check(self) -> object: ...


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
        self._unknown: set[tuple[str, str]] = set()  # (queue, dimension) pairs already warned of

    def __repr__(self) -> str:
        return f"<LockPacer names={len(self._buckets)}>"

    async def pace(
        self, name: str, fencing_token: int, limit: RateLimit, *, deadline: Callable[[], float] | None = None
    ) -> float | None:
        """Wait until a send under lock ``name``, held with ``fencing_token``, conforms to ``limit``; count it.

        Call it while holding the lock, right before the send. The wait is at most one
        emission interval (``limit.interval_s``).

        Args:
            name: The lock's name.
            fencing_token: The fencing token of the lease held.
            limit: The limit to keep.
            deadline: When the caller must stop waiting, on the pacer's clock, read again
                after each wait (a task lease's local deadline, which renewals move on).

        Returns:
            Seconds waited (0.0 when the send conforms at once), or None once ``deadline``
            has passed first: the wait ends there and no token is taken.
        """
        start = now = self._clock()
        bucket = self._buckets.get(name)
        if bucket is None or fencing_token not in (bucket.fencing_token, bucket.fencing_token + 1):
            # Another holder (or a forgotten one) had the lock since: an empty bucket from now.
            bucket = _Bucket(fencing_token, now + limit.tolerance_s + limit.interval_s)
        self._buckets[name] = bucket
        self._buckets.move_to_end(name)
        if len(self._buckets) > _NAMES:
            self._buckets.popitem(last=False)
        while not conforms(bucket.tat, now, limit):
            at = eligible_at(bucket.tat, limit)
            assert at is not None
            until = at if deadline is None else min(at, deadline())
            if until <= now:
                return None
            await self._sleep(until - now)
            now = max(self._clock(), until)
        bucket.fencing_token = fencing_token
        bucket.tat = take(bucket.tat, now, limit)
        return now - start

    async def pace_turn(self, store: Any, settings: PaceSettings, turn: PacedTurn, flight: PacedFlight) -> float | None:
        """:meth:`pace` a lock turn's send to its queue's declared limit on ``settings.lock_pace_dimension``.

        A limit whose emission interval is ``settings.lock_wait_s`` or longer is not paced:
        a claimed task waits for its lock at most that long, so the claim's tokens already
        keep such a limit's sends within one interval of their spacing, the slack the window
        bound allows (:func:`~asynccoord.contract.ratelimits.max_in_window`). The wait ends
        at the task lease's local deadline (``flight.lease_deadline``, read again as
        renewals move it): the send then finds its lease lapsed and does not start. After a
        wait the turn is checked again (:meth:`~asynccoord.locks.pool.Turn.check`), so a lock
        lost meanwhile stops the send before it starts.

        A queue that declares limits, but none on the dimension (a misspelt one, say), is
        logged once per queue and dimension at WARNING as
        ``asynccoord.node.lock_pace_unknown_dimension``, and its sends go unpaced: the limit
        may yet be declared, and is paced from the next read on.

        Args:
            store: The queue's store (a :class:`~asynccoord.contract.ratelimits.RateLimitStore`).
            settings: The node's :class:`~asynccoord.node.config.NodeConfig`: its ``queue``,
                ``lock_pace_dimension`` (None: no pacing) and ``lock_wait_s``.
            turn: The lock turn the send is made in.
            flight: The task's flight (:class:`~asynccoord.node.flight.Flight`): its lease's
                local deadline, on the pacer's clock.

        Returns:
            Seconds waited, or None when the task's lease ran out first (no token taken).
        """
        dimension = settings.lock_pace_dimension
        if dimension is None:
            return 0.0
        limit = await self.limit(store, settings.queue, dimension)
        if limit is None:
            if (settings.queue, dimension) not in self._unknown:
                self._warn_unknown(store, settings.queue, dimension)
            return 0.0
        if limit.interval_s >= settings.lock_wait_s:
            return 0.0
        lease = turn.lease
        waited = await self.pace(lease.name, lease.fencing_token, limit, deadline=lambda: flight.lease_deadline)
        if waited != 0.0:
            turn.check()
        return waited

    def _warn_unknown(self, store: Any, queue: str, dimension: str) -> None:
        """Log that ``queue`` declares limits but none on ``dimension``; silent while it declares none."""
        declared = sorted(self._limits[(id(store), queue)][2])
        if not declared:
            return  # no limits yet: another process may declare them later
        self._unknown.add((queue, dimension))
        log.warning(
            "asynccoord.node.lock_pace_unknown_dimension queue=%r dimension=%r declared=%s: the queue declares "
            "no rate limit on this dimension, so the sends its lock serialises are not paced; set "
            "NodeConfig(lock_pace_dimension=...) (--lock-pace) to a declared dimension, or declare the limit "
            "(store.set_rate_limits)",
            queue,
            dimension,
            declared,
        )

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
