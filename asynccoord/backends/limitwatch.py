"""A store's notice that the rate limits its claims enforce changed under it.

A queue's limits live in the database for every process (``set_rate_limits``), and any
process may replace them: ``python -m asynccoord run --rate-limit ...`` started beside a
running one, say. The claims of every process enforce the new limits from their next
transaction on, so a process started with ``account=2/1s`` may find itself sending at
another process's ``account=50/1s``. :class:`LimitWatch` keeps, per queue, the limits the
store last saw its claims enforce, and when they differ from the limits seen before it logs
``asynccoord.rate_limits.changed`` at WARNING, once per change, naming the old and the new
limits. A store's own ``set_rate_limits`` is no surprise: it logs nothing, and an
observation that may predate it is set aside.

On SQLite each claim reads the limits in its transaction and reports them here; on
PostgreSQL the store's read of whether a queue declares limits (at most once a second per
queue, in the background) reads the limits themselves and reports them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from ..contract.ratelimits import RateLimit, describe_limits

__all__ = ("CHANGED", "LimitWatch")

log = logging.getLogger(__name__)

CHANGED = "asynccoord.rate_limits.changed"
"""The event name of the warning :class:`LimitWatch` logs."""

_MAX_QUEUES = 4096  # queues named on the fly: forget the old ones rather than grow without end


class LimitWatch:
    """The limits each queue's claims last enforced in one store; a warning when they change.

    Attributes:
        generation: How many declarations this store made (``set_rate_limits``). An
            observation read before one of them is set aside (see :meth:`enforced`).
    """

    __slots__ = ("_seen", "generation")

    def __init__(self) -> None:
        self._seen: dict[str, dict[str, RateLimit]] = {}
        self.generation = 0

    def __repr__(self) -> str:
        return f"<LimitWatch queues={len(self._seen)} generation={self.generation}>"

    def declared(self, queue: str, limits: Sequence[RateLimit]) -> None:
        """This store declared ``limits`` for ``queue`` (``set_rate_limits``): known, so no warning."""
        self.generation += 1
        self._remember(queue, {limit.dimension: limit for limit in limits})

    def enforced(self, queue: str, limits: Mapping[str, RateLimit], since: int) -> None:
        """A read of ``queue``'s declared limits (by dimension; empty: none) that began at generation ``since``.

        The first read of a queue is taken as it is; a later one that differs from the
        limits seen before logs :data:`CHANGED` at WARNING. A read that began before a
        declaration of this store (``since`` is not :attr:`generation`) may predate it and
        is set aside.
        """
        if since != self.generation:
            return
        before = self._seen.get(queue)
        if before is None:
            self._remember(queue, dict(limits))
            return
        if before == limits:
            return
        self._seen[queue] = dict(limits)
        log.warning(
            "%s queue=%r enforced=[%s] now=[%s]: another process declared new rate limits for the queue, "
            "and every process of the database enforces them from now on",
            CHANGED,
            queue,
            describe_limits(before.values()),
            describe_limits(limits.values()),
        )

    def _remember(self, queue: str, limits: dict[str, RateLimit]) -> None:
        if queue not in self._seen and len(self._seen) >= _MAX_QUEUES:
            self._seen.clear()
        self._seen[queue] = limits
