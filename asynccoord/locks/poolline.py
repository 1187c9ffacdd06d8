"""How a :class:`~asynccoord.locks.pool.LockPool` takes a lock other processes' pools want: through a line of one place.

A pool that finds the lock taken takes a lease on the lock's *place in line*
(:func:`~asynccoord.locks.line.next_in_line`) and polls the lock from there; the pools
behind it poll for the place. While its own tasks wait, the pool holding the lock reads the
place every few turns and gives the lease back for a pool waiting there, unless its next
waiter ranks ahead. A store with release signals (:class:`~asynccoord.releases.ReleaseSignal`)
ends each poll's wait the moment the lock or the place is given back. This is the idea of a
fair lock's queue of waiters (Redisson's ``RFairLock`` on Redis), reduced to one place and
built on the lock contract alone, so it works on any lock store. :class:`PoolLine` is a
mixin of the pool.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from .. import events as ev
from ..config import RetryPolicy
from ..contract.locks import Lease, LockBusy
from ..errors import UNRECOVERABLE_STORE_ERRORS, LockLostError, LockTimeoutError
from ..releases import ReleaseSignal
from .line import Rank, ahead, next_in_line, own_place, place_holder, shown_rank
from .poolturns import Session
from .watchdog import Watchdog

__all__ = ("PoolLine", "lately", "remember")

log = logging.getLogger("asynccoord.locks.pool")  # the log lines keep the pool module's logger name

_NEXT_POLL = RetryPolicy(base_s=0.001, factor=1.15, cap_s=0.01, jitter=0.3)
"""Polls of a lock by the pool that holds its place in line (from 1 ms, 15 % longer each time,
up to 10 ms): the lock sits free until it looks, and turns last a few milliseconds."""
_LINE_POLL = RetryPolicy(base_s=0.002, factor=1.5, cap_s=0.02, jitter=0.5)
"""Polls for the place in line by the pools behind it: one must take it before the pool
that goes first gives the lock back after its ``max_turns``, or that pool takes the place
(and the lock) again."""
_PLACE_TTL_S = 1.0
"""Longest lease on a place in line (renewed while the pool waits): a crashed pool's place lapses in it."""
_CONTENDED_WINDOW_S = 1.0
"""How long after finding a lock (or its place in line) taken a pool queues for it instead of trying it first."""
_CONTENDED_NAMES = 1024
"""Names remembered as contended before the ones older than the window are forgotten."""
_FAIR_TURNS = 4
"""While local tasks wait, a pool holding a lease reads its place in line every this many
turns (one ``list_locks``); once another pool is seen in line, the lease goes back at the
end of the turn, so a waiting process waits a few turns, not ``max_turns``."""


def lately(seen: dict[str, float], name: str) -> bool:
    """Whether :func:`remember` recorded ``name`` within the last ``_CONTENDED_WINDOW_S``."""
    at = seen.get(name)
    return at is not None and time.monotonic() - at <= _CONTENDED_WINDOW_S


def remember(seen: dict[str, float], name: str) -> None:
    """Record ``name`` at the current monotonic time; forget stale names past ``_CONTENDED_NAMES``."""
    now = time.monotonic()
    seen[name] = now
    if len(seen) > _CONTENDED_NAMES:
        for stale in [n for n, at in seen.items() if now - at > _CONTENDED_WINDOW_S]:
            del seen[stale]


class PoolLine:
    """The line between the pools of several processes that want one lock (see the module's docstring).

    A mixin: it relies on the pool's settings and bookkeeping (set by
    :class:`~asynccoord.locks.pool.LockPool`), the ranks of its local waiters
    (:class:`~asynccoord.locks.poolturns.PoolTurns`) and its releases.
    """

    store: Any
    ttl_s: float
    holder: str
    max_hold_s: float
    max_overtakes: int
    min_hold_s: float
    _checks: set[asyncio.Task[None]]
    _contended: dict[str, float]
    _released: dict[str, float]
    _gave_way: dict[str, float]
    _passes: dict[str, tuple[int, int]]
    _place_id: str

    if TYPE_CHECKING:

        def _first_rank(self, session: Session) -> Rank | None: ...

        def _best_rank(self, session: Session, rank: Rank | None) -> Rank | None: ...

        async def _leave_line(self, place: Lease, *, wait: bool) -> None: ...

        async def _release_quietly(self, lease: Lease) -> None: ...

    async def _acquire(self, session: Session, deadline: float, rank: Rank | None) -> None:
        """Acquire ``session``'s lock for this pool, waiting in line behind other pools.

        A pool that finds the lock taken takes its place in line: a lease on
        :func:`~asynccoord.locks.line.next_in_line` of the name (TTL at most 1 s, renewed by this loop while it
        waits, not by the watchdog: losing a place is not losing a lock). The pool
        holding the place polls the lock often (every 1 to 10 ms); the others poll for
        the place (every 2 to 20 ms). A store with release signals (``store.releases``, a
        :class:`~asynccoord.releases.ReleaseSignal`: the memory, SQLite and PostgreSQL stores) ends
        the wait the moment the lock or the place is given back, in any process. A pool
        that found the lock or its place taken in the last second, or that gave a lease
        of it back in the last second (for a pool in line, say), first reads the place
        (one ``list_locks``): if another pool holds it, this one does not take the lock
        at once but waits in line too, so the waiting pool (another process) goes first;
        if nobody does, it tries the lock (without taking and leaving a free place: two
        writes). The line has one place, not a queue: with three or more pools the order
        among those behind the first is whoever takes the
        place first, as with a plain lock.
        """
        name = session.name
        if lately(self._contended, name) or lately(self._released, name):
            # Another pool wanted it a moment ago, or this one gave it back (after max_turns,
            # say): is a pool in line now? If so, wait behind it; if not, try the lock (a
            # read instead of taking and leaving a free place, two writes).
            seen, theirs, place_token = await self._someone_in_line(name)
            # A waiter ranked ahead of the one the other pool queues for (an older task) tries
            # the lock at once, unless the lease just went back for fairness (max_turns
            # reached, or given way to that pool), or this pool passed that place
            # max_overtakes times already: then it waits behind it whatever its rank.
            in_line = seen and (
                lately(self._gave_way, name)
                or not ahead(self._best_rank(session, rank), theirs)
                or not self._may_pass(name, place_token)
            )
        else:
            in_line = False
        place: Lease | None = None
        place_rank: Rank | None = None  # the rank the place shows (see line.place_holder)
        renewed_at = 0.0
        lock_busy: LockBusy | None = None
        failures = polls = 0
        # Armed before the first attempt, so a release right after a failed one is not missed.
        signal = getattr(self.store, "releases", None)
        watches = (signal.watch(name), signal.watch(next_in_line(name))) if isinstance(signal, ReleaseSignal) else None

        def contended() -> None:
            nonlocal failures
            remember(self._contended, name)
            failures += 1
            if failures == 1:
                self.store.events.add(ev.LOCK_CONTENDED)

        try:
            while True:
                if place is not None and ahead(self._best_rank(session, rank), place_rank):
                    # A local task ranked ahead of the one the place shows came meanwhile (on
                    # an ordered queue, the lagging conversation's head behind a younger task):
                    # show it, or the pool holding the lease keeps it for its own older ones.
                    await self._release_quietly(place)
                    place = None
                    in_line = True
                    continue
                if place is not None and time.monotonic() - renewed_at > place.ttl_s / 3:
                    renewed_at = time.monotonic()
                    place = await self._renew_place(place)  # None: it lapsed, queue again
                if place is not None or not in_line:
                    sent_at = time.monotonic()
                    outcome = await self.store.try_acquire_lock(name, ttl_s=self.ttl_s, permits=1, holder=self.holder)
                    if isinstance(outcome, Lease):
                        deadline_at = Watchdog.for_store(self.store).local_deadline(outcome.ttl_s, sent_at)
                        late_s = time.monotonic() - deadline_at
                        if late_s < 0:
                            break
                        # The grant arrived past its local deadline (this process stalled): another
                        # pool may hold the lock by now. Released, never used; then as a busy answer.
                        log.warning(
                            "asynccoord.lock.grant_too_late name=%r fencing_token=%d late_s=%.3f: released, not used",
                            name,
                            outcome.fencing_token,
                            late_s,
                        )
                        await self._release_quietly(outcome)
                        contended()
                        if time.monotonic() >= deadline:
                            raise LockTimeoutError(f"could not acquire {name!r}: its grant arrived past its deadline")
                        polls += 1
                        await asyncio.sleep(min(deadline - time.monotonic(), _NEXT_POLL.delay_s(polls)))
                        continue
                    assert isinstance(outcome, LockBusy)
                    busy = lock_busy = outcome
                    if not in_line:  # take a place in line at once
                        in_line = True
                        contended()
                        continue
                else:
                    renewed_at = time.monotonic()
                    shown = self._best_rank(session, rank)
                    taken = await self.store.try_acquire_lock(
                        next_in_line(name),
                        ttl_s=min(self.ttl_s, _PLACE_TTL_S),
                        permits=1,
                        holder=place_holder(self._place_id, shown),
                    )
                    if isinstance(taken, Lease):
                        place, place_rank = taken, shown
                        polls = 0  # first in line: try the lock at once, then poll it from 1 ms
                        continue
                    busy = taken
                contended()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise LockTimeoutError(self._timeout_message(name, lock_busy))
                polls += 1
                delay = min(remaining, (_NEXT_POLL if place is not None else _LINE_POLL).delay_s(polls))
                delay = min(delay, busy.retry_after_s + 0.002)
                if watches is None:
                    await asyncio.sleep(delay)
                else:  # the lock (or the place) given back wakes this wait at once
                    await watches[0 if place is not None or not in_line else 1].wait(delay)
        except BaseException:
            if place is not None:  # leaving without the lock (timeout, cancellation): give the place up now
                await self._leave_line(place, wait=True)
            raise
        finally:
            if watches is not None:
                for watch in watches:
                    watch.close()
        if place is not None:
            await self._leave_line(place, wait=False)  # the turn need not wait for it
        session.lease = outcome
        session.held_at = time.monotonic()
        session.turns = 0
        session.line_seen = False
        session.line_rank = None
        self._gave_way.pop(name, None)

        def lost(error: LockLostError) -> None:
            callback = session.on_lost
            if callback is not None:
                callback(error)

        # Tied to no task: the pool closes the guard when the lease goes back (_drop), and only then
        # (a task of its own, cancelled at a program's exit, would stop the guard and skip the release).
        session.guard = Watchdog.for_store(self.store).guard(
            outcome, sent_at=sent_at, renew=True, max_hold_s=self.max_hold_s, on_lost=lost, tied_to_task=False
        )

    def _may_pass(self, name: str, place_token: int) -> bool:
        """Whether a waiter ranked ahead may pass the place in line for ``name`` (fencing token
        ``place_token``) once more: at most ``max_overtakes`` times, as within a pool."""
        token, passes = self._passes.get(name, (place_token, 0))
        if token != place_token:
            passes = 0  # another place (the pool in line got the lock meanwhile, or queued anew)
        if passes >= self.max_overtakes:
            return False
        if len(self._passes) >= _CONTENDED_NAMES and name not in self._passes:
            self._passes.clear()
        self._passes[name] = (place_token, passes + 1)
        return True

    async def _someone_in_line(self, name: str) -> tuple[bool, Rank | None, int]:
        """Whether another pool holds the place in line for ``name`` (one read), the rank it
        shows (None: unranked, or written by a version without ranks) and its fencing token.

        Asked when this pool gave a lease of ``name`` back a moment ago (a hot lock): then
        the waiting pool goes first, unless this pool's waiter ranks ahead of the one it
        queues for. A failed read answers no (the lock is tried at once).
        """
        try:
            places = await self.store.list_locks(next_in_line(name))
        except UNRECOVERABLE_STORE_ERRORS:
            raise
        except Exception:
            return False, None, 0
        for info in places:
            if own_place(self._place_id, info.holder):
                continue
            return True, shown_rank(info.holder), info.fencing_token
        return False, None, 0

    async def _renew_place(self, place: Lease) -> Lease | None:
        """Renew a place in line; None when it lapsed or the renewal failed (the pool queues again)."""
        try:
            renewed: Lease | None = await self.store.renew_lock(place)
        except UNRECOVERABLE_STORE_ERRORS:
            raise
        except Exception:
            return None
        return renewed

    @staticmethod
    def _timeout_message(name: str, busy: LockBusy | None) -> str:
        if busy is None:
            return f"could not acquire {name!r}: still waiting in line behind another holder"
        return (
            f"could not acquire {name!r}: {busy.holders} live lease(s); "
            f"the earliest lapses in {busy.retry_after_s:.3f} s unless renewed"
        )

    def _gives_way(self, session: Session, *, wanted: bool = False, rank: Rank | None = None) -> bool:
        """Whether the lease should go back now for another pool in line (checked every ``_FAIR_TURNS`` turns).

        ``wanted``: a local task ranked ``rank`` wants a turn now (one that takes the lease
        from its release under way, see ``LockPool._may_keep``), as a waiter would. The lease
        stays while the next local turn ranks ahead of the other pool's waiter.
        """
        if session.turns < _FAIR_TURNS:
            return False
        if not wanted and session.waiters:
            rank = self._first_rank(session)
        if session.line_seen and not ahead(rank, session.line_rank):
            return time.monotonic() - session.held_at >= self.min_hold_s
        if (wanted or session.waiters) and session.line_check is None and session.turns % _FAIR_TURNS == 0:
            check = session.line_check = asyncio.get_running_loop().create_task(
                self._check_line(session, session.lease), name=f"asynccoord-lockpool-line-{session.name}"
            )
            self._checks.add(check)  # aclose() ends it, even once its session is gone
            check.add_done_callback(self._checks.discard)
        return False

    async def _check_line(self, session: Session, lease: Lease | None) -> None:
        """Record in ``session`` whether another pool is in line for its lock (while it still holds ``lease``)."""
        try:
            seen, theirs, _ = await self._someone_in_line(session.name)
        except Exception:  # a closed store, say: the next acquisition will tell
            seen, theirs = False, None
        finally:
            session.line_check = None
        if session.lease is lease:
            session.line_seen, session.line_rank = seen, theirs
