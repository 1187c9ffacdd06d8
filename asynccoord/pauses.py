"""Provider pauses a process has heard of: no send under a paused lock starts before the Retry-After ends.

A queue's rate limits are taken when tasks are claimed (:mod:`asynccoord.contract.ratelimits`).
When the provider still answers 429, the node reports it (``store.report_rate_limited``) and
the store pauses the bucket(s) for every later claim; but tasks claimed before the pause
hold their tokens already. Those of a bot account wait in line for the account's lock, and
each would reach the provider during its Retry-After as its turn comes, which a provider
such as Telegram answers by lengthening the wait. A :class:`PauseBook` is the queue store
object's record of such pauses, by lock name: when ``send`` raises
:class:`~asynccoord.errors.RateLimited` for a task sent under a lock, and the provider named
no dimension or the one the lock serialises (``NodeConfig.lock_pace_dimension``), the node
pauses the lock's name here; a send under that name then does not start
(:meth:`~asynccoord.node.send.Sender.start`) before the pause ends: its task is handed back
unsent, due when the pause ends, its attempt not used, and counted as ``send_paused``.
Times are on the process's monotonic clock. A store with a cross-process channel (the
SQLite wake-up sockets, PostgreSQL's NOTIFY) sets :attr:`PauseBook.announce` and carries
each pause, as seconds still to wait, to the other processes, whose books take it from its
arrival (:meth:`PauseBook.deliver`): a lost announcement costs only sends that the store's
paused bucket does not hold back, those claimed before the pause. A ``RateLimited`` inside an
exception group (a client built on a task group) counts as one (:func:`rate_limited_of`).

What a pause does not stop: a send claimed before it under no lock, or under a lock whose
dimension the 429 does not name; and in a process started during the pause, which learns of
it only through the store's paused bucket, a send whose task carries no key of a paused
bucket (declare the account's limit, and give ``lock_pace_dimension``, for it to wait too).
With ``lock_permits`` above 1, another process's send may start within the announcement's
delivery (well under a millisecond on SQLite, a few on PostgreSQL).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ._leaves import uniform_leaves
from ._once import Once
from .errors import RateLimited

__all__ = ("MIN_RATE_LIMIT_PAUSE_S", "PauseBook", "rate_limited_of")

log = logging.getLogger(__name__)

_not_paused: Once[str] = Once(limit=64)  # dimensions _warn_not_paused logged


def _warn_not_paused(name: str, dimension: str) -> None:
    """Log, once per process and dimension, a 429 naming a dimension under a lock whose dimension nobody gave."""
    if not _not_paused.first([dimension]):
        return
    log.warning(
        "asynccoord.pauses.lock_not_paused lock=%r dimension=%r: a 429 naming a dimension pauses the lock only "
        "when NodeConfig.lock_pace_dimension names it; the tasks claimed under this lock before the 429 still "
        "go out during its Retry-After (give lock_pace_dimension the dimension the lock serialises)",
        name,
        dimension,
        extra={"event": "asynccoord.pauses.lock_not_paused"},
    )


MIN_RATE_LIMIT_PAUSE_S = 0.5
"""The shortest pause a send's ``RateLimited`` causes, seconds: a 429 uses no attempt, so a
provider answering ``Retry-After: 0`` (or a client mapping that loses the value) would be
called again at once, for ever; below this the pause is taken as this."""

_KEEP = 4096
"""Names remembered at most; those whose pause is over are forgotten first when there are more."""


def rate_limited_of(failure: BaseException | None) -> RateLimited | None:
    """The provider's 429 that a send's ``failure`` is: a :class:`~asynccoord.errors.RateLimited`, or a group of them.

    A send built on task groups (anyio, ``asyncio.TaskGroup``) raises its ``RateLimited``
    inside an exception group. A group whose every leaf is one stands for the longest of
    them, on its dimension and key when all name the same ones, else on every bucket of the
    task; a group holding any other error is an ordinary failure (None).
    """
    leaves = uniform_leaves(failure, RateLimited)
    if leaves is None:
        return None
    longest = max(leaves, key=lambda r: r.retry_after_s)
    if all((r.dimension, r.key) == (longest.dimension, longest.key) for r in leaves):
        return longest
    return RateLimited(longest.retry_after_s)


class PauseBook:
    """The provider's pauses this process heard of, by lock name (see the module docstring).

    Args:
        clock: Monotonic clock, seconds. Default :func:`time.monotonic`.
    """

    __slots__ = ("_clock", "_until", "announce")

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._until: dict[str, float] = {}
        self.announce: Callable[[str, float], None] | None = None
        """Set by a store with a cross-process channel: called with each pause recorded by
        :meth:`paused_by` (lock name, seconds), to carry it to the other processes."""

    def __repr__(self) -> str:
        now = self._clock()
        return f"<PauseBook paused={sum(1 for until in self._until.values() if until > now)}>"

    def paused_by(self, name: str, limited: RateLimited, lock_pace_dimension: str | None) -> bool:
        """Record the pause a send under lock ``name`` was answered with, if it is the lock's; True if so.

        The pause is the lock's when the provider named no dimension (every bucket of the
        task) or the one the lock serialises (``lock_pace_dimension``); it lasts the
        Retry-After, at least :data:`MIN_RATE_LIMIT_PAUSE_S`.
        """
        if limited.dimension is not None and limited.dimension != lock_pace_dimension:
            if lock_pace_dimension is None:
                _warn_not_paused(name, limited.dimension)
            return False
        pause_s = max(limited.retry_after_s, MIN_RATE_LIMIT_PAUSE_S)
        self.pause(name, pause_s)
        announce = self.announce
        if announce is not None:
            try:
                announce(name, pause_s)
            except Exception:  # a lost announcement costs only sends the store's paused bucket does not stop
                log.warning("asynccoord.pauses.announce_failed name=%r", name, exc_info=True)
        return True

    def deliver(self, name: str, pause_s: float) -> None:
        """Another process's pause of lock ``name`` for ``pause_s`` more seconds: record it here only."""
        self.pause(name, pause_s)

    def pause(self, name: str, pause_s: float) -> None:
        """Pause sends under lock ``name`` for ``pause_s`` seconds from now (a pause already longer stays)."""
        now = self._clock()
        until = now + pause_s
        if self._until.get(name, 0.0) < until:
            self._until[name] = until
        if len(self._until) > _KEEP:
            self._until = {n: end for n, end in self._until.items() if end > now}

    def remaining_s(self, name: str) -> float:
        """Seconds until sends under lock ``name`` may start again (0.0: not paused)."""
        until = self._until.get(name)
        if until is None:
            return 0.0
        return max(0.0, until - self._clock())
