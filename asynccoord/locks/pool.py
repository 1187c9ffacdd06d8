"""Per-process lock sharing: local tasks that need the same lock take turns on one lease.

A :class:`LockPool` keeps a hot lock's lease in the process while its tasks wait for it,
so a hot account does not pay two database writes per message, and lets processes that
contend for the lock take turns through a line of one place. The line is the idea of a
fair lock's queue of waiters (Redisson's ``RFairLock`` on Redis), reduced to one place and
built only on the lock contract, so it works on any lock store.

The pool's parts: this module holds the pool, its turns' begin and end, and its releases;
the local waiting line and the :class:`Turn` a task holds are
:mod:`asynccoord.locks.poolturns`, and the line between processes is
:mod:`asynccoord.locks.poolline`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..contract.locks import Lease, check_user_lock_name
from ..errors import FencingTokenRejectedError, InvalidArgumentError, LockLostError
from ..validation import (
    check_callback,
    check_int,
    check_key,
    check_lease_s,
    check_lock_store,
    check_non_negative,
)
from .background import watched
from .line import PLACE_PREFIX, Rank, next_in_line, place_id
from .pacing import LockPacer
from .poolline import PoolLine
from .poolline import remember as _remember
from .poolturns import PoolTurns, Session, Turn
from .watchdog import Guard

__all__ = ("PLACE_PREFIX", "LockPool", "Turn", "next_in_line")

_RELEASE_TIMEOUT_S = 5.0
"""How long the pool waits for each release of a lease, or of a place in line, seconds."""


class LockPool(PoolTurns, PoolLine):
    """Shares lock leases among the tasks of one process.

    A bot's hot account (one sender in hundreds of conversations) needs its lock for every
    message. Releasing it after each send and acquiring it again costs two write
    transactions per message. The pool instead keeps the lease while local tasks wait for
    it and hands it from one to the next ("turns"); the store's watchdog renews it
    meanwhile. All turns of one lease present the same fencing token, which fenced
    resources accept, since a token belongs to one acquisition and it may write many times.

    A turn covers the guarded work (the send). Work that must still be fenced after the
    turn (the commit) is registered with :meth:`Turn.defer`. The lease goes back to the
    store only when no local task waits, or after ``max_turns`` turns in a row, and every
    deferred commit has finished. So a later holder's token reaches the resource only after
    all of this lease's writes. A task that asks for a turn while the lease only waits for
    those commits takes its turn at once, on the same lease, unless the lease is going back
    for fairness.

    Between processes, a taken lock has a line of one place. A pool that finds the lock
    taken takes a lease on :func:`next_in_line` of its name (``asynccoord.next:<hash>``,
    visible in ``list_locks`` while it waits). Its holder shows the rank of that pool's
    first waiter: ``"<holder> rank=<priority>:<order>"``, ``rank=-`` without one, or
    ``asynccoord.holder:<digest>`` for a holder too long to carry it. The pool holding the
    lease reads the place every 4 turns while more of its tasks wait. Once another pool is
    in line with an older task than its own next one, it gives the lease back at the end
    of the turn, and at the latest after ``max_turns`` turns. A pool that just gave the
    lease back, or found the lock taken in the last second, waits behind the place instead
    of taking the lock at once, unless its own waiter ranks ahead (at most
    ``max_overtakes`` times per place). So task order holds across processes, and each
    process gets runs of turns instead of one keeping the lock. A place without a rank
    (no ``order``, or ``max_overtakes`` 0) is always given way to.

    The pool's :attr:`pacer` (:class:`~asynccoord.locks.pacing.LockPacer`) keeps the
    send-time buckets of the names whose turns pace their sends to a rate limit.

    Contention (the ``lock_contended`` event) is a wait between holders: it is counted once
    per acquisition that finds the lock, or its place in line, held by another holder. A
    local task waiting for its turn is not counted.

    Mutual exclusion is unchanged: one turn at a time in the process, and one process at a
    time per lock name. If the watchdog loses the lease, the current turn's work is
    cancelled (its ``on_lost``) and the next turn acquires a new lease. Only locks (one
    permit) are pooled; semaphores are acquired per task. Lock names in the prefix
    :data:`PLACE_PREFIX` are refused.

    Args:
        store: A store implementing the lock contract.
        ttl_s: Lease length, seconds, 0.01 (``validation.MIN_LEASE_S``) to one year (renewed
            every ``ttl_s / 3`` by the store's watchdog).
        holder: Who holds the leases (e.g. the process or node id): shown by
            ``list_locks``, and how the line tells pools apart, so pools sharing locks
            (other processes) must use different ones; a place held under this pool's own
            holder counts as its own, and the pool never waits behind it. A
            :class:`~asynccoord.node.runtime.Runtime` uses its ``instance_id``, new for each one.
        max_turns: Most consecutive turns before the lease goes back to the database so
            that another process waiting for the lock gets it. Default 32. A pool that
            finds the lock taken takes the *place in line* (a lease on
            :func:`next_in_line` of the name, on the same store). While local tasks wait,
            the pool holding the lease reads that place every 4 turns, and once another
            pool is seen in it, gives the lease back at the end of the turn (after 4
            turns and ``min_hold_s`` at least) instead of after ``max_turns``, unless its
            next waiter ranks ahead of the one that pool queues for (see :meth:`turn`).
        min_hold_s: Least time a lease is kept, seconds, before it goes back for another
            pool in line (``max_turns`` still ends it sooner). Default 0.05: a hand-over (the
            last turn's commit, a release, an acquisition) costs about 3.5 ms on PostgreSQL,
            under a tenth of the hold however short the sends; 0 gives way after 4 turns.
            A process waits up to that long for each other process served before it.
        max_hold_s: Hold-time ceiling of one lease, seconds. Default ``max(300, 10 * ttl_s)``.
        max_overtakes: Most times a waiter is overtaken by waiters of a higher priority
            (see :meth:`turn`), and most times this pool's waiters pass another pool's place
            in line by rank. Default 8; 0 makes turns strictly FIFO (``priority`` and
            ``order`` are then ignored, across pools too).

    Raises:
        InvalidArgumentError, InvalidTypeError: bad arguments.
    """

    def __init__(
        self,
        store: Any,
        *,
        ttl_s: float,
        holder: str,
        max_turns: int = 32,
        max_hold_s: float | None = None,
        max_overtakes: int = 8,
        min_hold_s: float = 0.05,
    ) -> None:
        check_lock_store("store", store)
        self.store = store
        self.ttl_s = check_lease_s("ttl_s", ttl_s)
        self.holder = check_key("holder", holder)
        self.max_turns = check_int("max_turns", max_turns, minimum=1)
        self.max_overtakes = check_int("max_overtakes", max_overtakes, minimum=0)
        self.min_hold_s = check_non_negative("min_hold_s", min_hold_s)
        default_hold_s = max(300.0, 10 * self.ttl_s)
        self.max_hold_s = default_hold_s if max_hold_s is None else check_lease_s("max_hold_s", max_hold_s)
        if self.min_hold_s > self.max_hold_s:
            raise InvalidArgumentError(
                f"min_hold_s={min_hold_s!r} is above max_hold_s={self.max_hold_s:g}: no lease is held that long"
            )
        self.pacer = LockPacer()
        self._sessions: dict[str, Session] = {}
        self._leaving: set[asyncio.Task[None]] = set()
        self._checks: set[asyncio.Task[None]] = set()  # reads of places in line (_check_line) under way
        self._contended: dict[str, float] = {}  # lock name -> when it (or its place) was last found taken
        self._released: dict[str, float] = {}  # lock name -> when this pool last gave a lease of it back
        self._gave_way: dict[str, float] = {}  # lock name -> when a lease of it last went back for fairness
        self._passes: dict[str, tuple[int, int]] = {}  # lock name -> (place's fencing token, times passed)
        self._place_id = place_id(self.holder)

    def __repr__(self) -> str:
        held = sum(1 for s in self._sessions.values() if s.lease is not None)
        return f"<LockPool sessions={len(self._sessions)} held={held}>"

    @property
    def held(self) -> int:
        """Leases this pool holds now."""
        return sum(1 for s in self._sessions.values() if s.lease is not None)

    @contextlib.asynccontextmanager
    async def turn(
        self,
        name: str,
        *,
        timeout_s: float,
        on_lost: Callable[[LockLostError], None],
        priority: int = 0,
        order: int | None = None,
    ) -> AsyncIterator[Turn]:
        """Wait for this process's turn on lock ``name`` and hold it for the block.

        Args:
            name: Lock name.
            timeout_s: Longest wait for the turn (local queue and database), seconds.
            on_lost: Called if the lease is lost during this turn: it must stop the
                block's work (e.g. cancel its scope). Nothing else cancels the block. A
                lease whose local deadline passed while the event loop was blocked is
                found lost at the block's end at the latest (not after :meth:`Turn.end`).
                Required: a plain function (called synchronously, not an ``async def``).
            priority: Place among this process's waiters: ahead of every waiter with a
                lower priority, behind those with the same or a higher one (FIFO among
                equals), -2**31..2**31-1. Default 0. A waiter is overtaken at most
                ``max_overtakes`` times, so none starves. A node passes the task's priority.
            order: Place among this process's waiters of the same priority: ahead of those
                with a higher ``order`` (not counted as overtaking them), behind those with
                the same or a lower one and those without one (a waiter without an order is
                never passed by order), -2**63..2**63-1. Default None: behind every waiter
                of the same priority (arrival order). A node passes the task id, so of the
                tasks waiting for a lock the oldest goes first: on an ordered queue, the head
                of the conversation that lags most, whose chain of tasks bounds a drain (a
                hot account's lock otherwise makes it wait behind every one-off task that
                reached the lock first). Pass values of one kind for a lock, from a source
                that only grows (ids), so no waiter is passed for ever. ``priority`` and
                ``order`` also rank this waiter against another process's, through the
                place in line (see :class:`LockPool`): a lease is not given back to a
                pool in line for a waiter ranked behind this one before ``max_turns``.

        Yields:
            The :class:`Turn` (``turn.lease.fencing_token`` for fenced writes).

        Raises:
            LockTimeoutError: no turn within ``timeout_s``.
            InvalidTypeError, InvalidArgumentError: a bad argument (raised on entering the
                block, before any wait).
        """
        check_user_lock_name("name", name)
        deadline = time.monotonic() + check_non_negative("timeout_s", timeout_s)
        check_callback("on_lost", on_lost)
        check_int("priority", priority, minimum=-(2**31), maximum=2**31 - 1)
        if order is not None:
            check_int("order", order, minimum=-(2**63), maximum=2**63 - 1)
        session = self._sessions.get(name)
        if session is None:
            session = self._sessions[name] = Session(name)
            session.idle.set()
        rank = self._rank_of(priority, order)
        if session.releasing is not None and self._may_keep(session, rank):
            # The last turn ended with nobody waiting, and its release only waits for that
            # turn's commit: keep the lease for this turn instead of waiting for the commit,
            # the release and an acquisition anew (three round trips on the critical path).
            releasing, session.releasing = session.releasing, None
            self._gave_way.pop(name, None)
            releasing.cancel()
        if session.busy or session.waiters or session.releasing is not None:
            # A local turn, not contention: only a wait for another holder counts (see _acquire).
            await self._wait_turn(session, deadline, priority, order)
        session.busy = True
        holding = True  # this task holds the process's turn (not while it hands a fresh lease on)

        def end() -> None:  # the turn's end (at most once: Turn.end, or the block's)
            nonlocal holding
            if not holding:
                return
            holding = False
            session.on_lost = None
            session.turns += 1
            self._pass_turn(session)

        try:
            if session.guard is not None:
                session.guard.check()  # a lease past its local deadline is given up, not handed on
            while not session.alive():
                await self._retire(session)
                await self._acquire(session, deadline, rank)
                if not self._outranked(session, rank):
                    break
                # A local task ranked ahead of this one came while it acquired (the lagging
                # conversation's head behind a younger task): the fresh lease's first turn is
                # that task's; this one queues again.
                holding = False
                if not self._wake_next(session):
                    holding = True
                    break
                await self._wait_turn(session, deadline, priority, order)
                holding = True
            assert session.guard is not None
            session.on_lost = on_lost
            yield Turn(session, session.guard.lease, end)
        finally:
            if holding:
                try:
                    if session.guard is not None:
                        session.guard.check()  # the loop blocked past the lease's deadline in the block: on_lost
                finally:
                    end()

    async def _leave_line(self, place: Lease, *, wait: bool) -> None:
        """Give up a place in line: release it in a task the pool tracks (``aclose`` waits for it).

        ``wait``: also wait for it (bounded); a cancellation of the caller stops the wait,
        not the release.
        """
        task = asyncio.get_running_loop().create_task(
            self._release_quietly(place), name=f"asynccoord-lockpool-leave-{place.name}"
        )
        self._leaving.add(task)
        task.add_done_callback(self._leaving.discard)
        if wait:
            await asyncio.wait({task}, timeout=_RELEASE_TIMEOUT_S)

    async def _release_quietly(self, lease: Lease) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.store.release_lock(lease), _RELEASE_TIMEOUT_S)

    def _pass_turn(self, session: Session, *, counted: bool = True) -> None:
        """End a turn: hand the lease to the next local waiter, or start releasing it."""
        session.busy = False
        session.turn_ended.set()
        alive = session.alive()
        if alive and session.turns < self.max_turns and not self._gives_way(session):
            if self._wake_next(session):
                return
            self._gave_way.pop(session.name, None)  # nobody waits: an idle release
        elif alive:  # max_turns reached, or another pool in line: going back for fairness
            _remember(self._gave_way, session.name)
        if session.releasing is None:
            session.releasing = asyncio.get_running_loop().create_task(
                self._release_when_idle(session), name=f"asynccoord-lockpool-release-{session.name}"
            )

    def _may_keep(self, session: Session, rank: Rank | None) -> bool:
        """Whether a release under way may be called off for a new local turn.

        Only while the lease is still held (the release waits for deferred commits: it has
        given nothing back yet), nobody waits or holds a turn, and the release is not one
        that fairness asked for (``max_turns`` reached, another pool seen in line).
        """
        return (
            session.alive()
            and not session.busy
            and not session.waiters
            and session.turns < self.max_turns
            and not self._gives_way(session, wanted=True, rank=rank)
        )

    async def _release_when_idle(self, session: Session) -> None:
        """Release the lease once every deferred commit is over, then wake a waiter (it acquires anew).

        The wait lasts while the lease does (the watchdog renews it, up to ``max_hold_s``):
        releasing it under a deferred commit would let the next holder's token reach the
        resource first, and the commit be refused as stale although its lease never lapsed.
        """
        me = asyncio.current_task()
        try:
            while not session.idle.is_set() and session.alive():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(session.idle.wait(), self.ttl_s / 3)
            # Called off by a new turn (see turn()) while this waited: the cancellation may not
            # have reached it (wait_for can return its result instead when both come at once),
            # so ownership decides. From here to the lease's release nothing yields.
            if session.releasing is not me:
                return
            await self._retire(session)
        finally:
            if session.releasing is me:  # not called off by a new turn (see turn())
                session.releasing = None
                if not self._wake_next(session) and session.lease is None and not session.busy:
                    self._sessions.pop(session.name, None)

    async def _retire(self, session: Session) -> None:
        guard = self._drop(session)
        if guard is not None:
            lease, still_held = guard.lease, guard.active
            guard.close()
            if still_held:
                _remember(self._released, lease.name)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(watched(self.store.release_lock(lease))), _RELEASE_TIMEOUT_S)

    def _holding(self, lease: Lease) -> Session | None:
        """The session whose current lease is ``lease`` (same owner token), or None."""
        session = self._sessions.get(lease.name)
        held = session is not None and session.lease is not None and session.lease.owner_token == lease.owner_token
        return session if held else None

    @staticmethod
    def _drop(session: Session) -> Guard | None:
        """Forget ``session``'s lease (no turn is taken on it any more); return its guard, still open."""
        guard = session.guard
        session.guard = None
        session.lease = None
        session.turns = 0
        session.line_seen = False
        session.line_rank = None
        return guard

    def let_lapse(self, lease: Lease) -> bool:
        """Stop renewing ``lease`` and take no more turns on it, unreleased: it lapses at its TTL.

        For a send that outlives its node's shutdown (released, the lock would let another holder's
        send run beside it). A later local turn acquires anew. Never awaits. True if the pool held it.
        """
        session = self._holding(lease)
        if session is None:
            return False
        guard = self._drop(session)
        if guard is not None:
            guard.close()
        return True

    def give_back(self, lease: Lease) -> bool:
        """Take no more turns on ``lease``: it goes back to the store once the turn under way
        and its deferred commits are over, and the next local turn acquires anew, with a higher
        fencing token.

        For work that goes on under the lease's token after its turn (a send the node let go
        at ``send_overrun_s``): the sends after it carry a token a resource checking it prefers
        to the stale one. Never awaits. True if the pool held it.
        """
        session = self._holding(lease)
        if session is None:
            return False
        session.turns = max(session.turns, self.max_turns)  # _pass_turn and _may_keep: back to the store
        return True

    async def fence_refused(self, lease: Lease, error: FencingTokenRejectedError) -> bool:
        """A write fenced by ``lease``'s token was refused (``error``): take no more turns on it.

        No write fenced by that token can land any more: the lease goes back once the turn under way
        and its deferred commits are over. When the resource is the lock's own name and the store has
        ``advance_fencing_token`` (Redis), the counter first moves up to the token the resource
        accepted (a Redis restart that lost writes would otherwise hand out refused tokens).

        Args:
            lease: The lease whose token was refused (a turn's ``lease``).
            error: The refusal; its ``resource`` and ``highest`` say what the resource accepted.

        Returns:
            True if the store's counter was behind and was moved, else False.

        Raises:
            StoreError: the store failed while moving the counter (the lease goes back anyway).
        """
        self.give_back(lease)
        highest = error.highest
        advance = getattr(self.store, "advance_fencing_token", None)
        if advance is None or error.resource != lease.name or highest is None or highest <= lease.fencing_token:
            return False
        return bool(await advance(lease.name, highest))

    async def released(self, name: str, *, timeout_s: float = _RELEASE_TIMEOUT_S) -> None:
        """Wait (up to ``timeout_s``) until a release of ``name``'s lease already under way is done.

        Used before handing a task back, so whoever claims it next finds its lock free.

        Args:
            name: Lock name (as given to :meth:`turn`).
            timeout_s: Longest wait, seconds (>= 0). Default 5.

        Raises:
            InvalidTypeError, InvalidArgumentError: a bad ``name`` or ``timeout_s``.
        """
        check_user_lock_name("name", name)
        check_non_negative("timeout_s", timeout_s)
        session = self._sessions.get(name)
        task = None if session is None else session.releasing
        if task is not None and not task.done():
            await asyncio.wait({task}, timeout=timeout_s)

    async def aclose(self) -> None:
        """Release every lease the pool holds, waiting for a turn in progress and then for the
        deferred commits, up to one TTL per lock each (past that the lease goes back anyway)."""
        for session in list(self._sessions.values()):
            turn_deadline = time.monotonic() + self.ttl_s
            while session.busy and time.monotonic() < turn_deadline:
                session.turn_ended.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(session.turn_ended.wait(), turn_deadline - time.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(session.idle.wait(), self.ttl_s)
            releasing = session.releasing
            if releasing is not None:  # it waits for the same commits while the lease lives: no longer
                if not session.idle.is_set():
                    releasing.cancel()
                await asyncio.wait({releasing})
                if not releasing.cancelled():
                    releasing.exception()  # seen (it logs nothing of its own)
            await self._retire(session)
        self._sessions.clear()
        checks = set(self._checks)
        for check in checks:
            check.cancel()
        if checks:
            await asyncio.wait(checks)
        if self._leaving:
            await asyncio.wait(set(self._leaving), timeout=_RELEASE_TIMEOUT_S)
