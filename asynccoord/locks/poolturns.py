"""The turns of a :class:`~asynccoord.locks.pool.LockPool` in one process: a pooled lease, its waiters, their turns.

A pool keeps one :class:`Session` per lock name: the lease, its guard, and the local tasks
that wait for a turn on it. A task holds a :class:`Turn` while its turn lasts. Waiters line
up by priority, then by ``order`` (a task id), then by arrival; a waiter is passed by a higher
priority at most ``max_overtakes`` times, so none starves (bounded overtaking, the aging that
priority schedulers give their waiting processes). The rank of the first waiter is also what
the pool shows other processes' pools in the line between them
(:mod:`asynccoord.locks.poolline`). :class:`PoolTurns` is a mixin of the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..contract.locks import Lease
from ..errors import LockLostError, LockTimeoutError
from .line import Rank, ahead
from .watchdog import Guard

__all__ = ("PoolTurns", "Session", "Turn")


@dataclass(slots=True, eq=False)
class Session:
    name: str
    lease: Lease | None = None
    guard: Guard | None = None
    busy: bool = False
    turns: int = 0
    deferred: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)  # set when deferred == 0
    turn_ended: asyncio.Event = field(default_factory=asyncio.Event)  # set as each turn ends (for aclose)
    waiters: deque[asyncio.Future[None]] = field(default_factory=deque)
    ranks: dict[asyncio.Future[None], list[Any]] = field(default_factory=dict)  # waiter -> [priority, overtaken, order]
    on_lost: Callable[[LockLostError], None] | None = None
    releasing: asyncio.Task[None] | None = None
    line_seen: bool = False  # another pool was in line at this lease's last check (see _FAIR_TURNS)
    line_rank: Rank | None = None  # that pool's first waiter's rank, if its place carries one
    line_check: asyncio.Task[None] | None = None
    held_at: float = 0.0  # time.monotonic() when the lease was taken

    def alive(self) -> bool:
        return self.lease is not None and self.guard is not None and self.guard.active


class Turn:
    """One task's turn on a pooled lease (yielded by :meth:`~asynccoord.locks.pool.LockPool.turn`)."""

    __slots__ = ("_end", "_session", "lease")

    def __init__(self, session: Session, lease: Lease, end: Callable[[], None]) -> None:
        self._session = session
        self._end = end
        self.lease = lease
        """The lease; ``lease.fencing_token`` identifies the acquisition."""

    def end(self) -> None:
        """End the turn now, before its block does: the next local waiter's turn begins at once.

        For work that is over before the block is (a send that returned, whose commit the
        block still awaits: register that with :meth:`defer` first). Idempotent; the
        block's end then ends nothing more, and the turn's ``on_lost`` is no longer called.
        """
        self._end()

    def defer(self) -> Callable[[], None]:
        """Keep the lease out of other processes' hands until the returned callable is called.

        Call it during the turn for work fenced by the token that ends after the turn
        (a commit); call the returned function exactly once when that work is over.
        """
        session = self._session
        session.deferred += 1
        session.idle.clear()
        called = False

        def done() -> None:
            nonlocal called
            if called:
                return
            called = True
            session.deferred -= 1
            if session.deferred == 0:
                session.idle.set()

        return done

    def check(self) -> LockLostError | None:
        """Give the lease up now if its local deadline has passed (see :meth:`Guard.check`); the error, or None.

        Call it before starting the turn's work: a turn handed over by the pool takes no
        store round trip, so a renewal that is late (a slow store) is seen only here. A
        lease given up calls the turn's ``on_lost``.
        """
        guard = self._session.guard
        if guard is None:
            return None
        return guard.check()


class PoolTurns:
    """The local waiting line of a :class:`~asynccoord.locks.pool.LockPool`: who takes the next turn, and its rank.

    A mixin: it relies on the pool's ``max_overtakes`` and ``_pass_turn``.
    """

    max_overtakes: int

    if TYPE_CHECKING:

        def _pass_turn(self, session: Session, *, counted: bool = True) -> None: ...

    async def _wait_turn(self, session: Session, deadline: float, priority: int, order: int | None) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters, ranks = session.waiters, session.ranks
        # Behind every waiter of a higher priority; of the same one, behind those without an
        # order or with one no higher than this waiter's (FIFO among equals without one); and
        # behind any that a higher priority has overtaken max_overtakes times already (no
        # waiter starves). max_overtakes=0: strictly FIFO, priority and order aside.
        at = len(waiters)
        while at > 0 and self.max_overtakes > 0:
            ahead = ranks[waiters[at - 1]]
            if ahead[0] > priority:
                break
            if ahead[0] == priority:
                if order is None or ahead[2] is None or ahead[2] <= order:
                    break
            elif ahead[1] >= self.max_overtakes:
                break
            at -= 1
        for passed in itertools.islice(waiters, at, None):
            if ranks[passed][0] < priority:
                ranks[passed][1] += 1
        waiters.insert(at, future)
        ranks[future] = [priority, 0, order]
        try:
            # Not wait_for: on Python 3.11 it returns the result and drops a cancellation that
            # comes in the step the turn is handed over; under timeout() it is raised, and the
            # turn passed on below. Awaited directly (no shield, one loop turn less per hand-over):
            # a cancellation that finds the future pending cancels it, so no turn is handed to it
            # (_wake_next skips it); one that finds it handed over leaves it so, and is seen below.
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                await future
        except TimeoutError:
            if future.done() and not future.cancelled():
                return  # our turn came just as the wait ran out: take it
            raise LockTimeoutError(f"no turn on {session.name!r} within the wait") from None
        except BaseException:
            if future.done() and not future.cancelled():
                session.busy = False  # handed the turn but leaving: pass it on
                self._pass_turn(session, counted=False)
            raise
        finally:
            if not future.done():
                future.cancel()
            with contextlib.suppress(ValueError):
                session.waiters.remove(future)
            session.ranks.pop(future, None)

    def _wake_next(self, session: Session) -> bool:
        while session.waiters:
            future = session.waiters.popleft()
            if not future.done():
                session.busy = True
                future.set_result(None)
                return True
        return False

    def _rank_of(self, priority: int, order: int | None) -> Rank | None:
        """A waiter's rank; None without an order, or in a pool whose ``max_overtakes`` is 0 (FIFO)."""
        return None if order is None or self.max_overtakes == 0 else (-priority, order)

    def _first_rank(self, session: Session) -> Rank | None:
        """The rank of ``session``'s first local waiter (None: nobody waits, or it has no rank)."""
        if not session.waiters:
            return None
        first = session.ranks.get(session.waiters[0])
        return None if first is None else self._rank_of(first[0], first[2])

    def _outranked(self, session: Session, rank: Rank | None) -> bool:
        """Whether ``session``'s first waiter ranks ahead of a turn ranked ``rank`` (both ranked)."""
        return ahead(self._first_rank(session), rank)

    def _best_rank(self, session: Session, rank: Rank | None) -> Rank | None:
        """The rank to show in line: the acquiring turn's, or its first local waiter's if ranked ahead.

        None (an unranked place) when the acquiring turn has no rank: a waiter without an
        order is never passed by order, so none behind it is first.
        """
        waiting = self._first_rank(session)
        return waiting if ahead(waiting, rank) else rank
