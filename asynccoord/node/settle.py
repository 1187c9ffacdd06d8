"""Settling a task after its send: commit it, record a failed attempt, or hand it back.

A :class:`Settler` commits a sent task with a compare-and-set fenced by the lock's token,
records a failed send for the retry policy, or hands a task the node will not send back to
``pending``, retrying a busy or unreachable store while the task's lease lasts.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from .. import events as ev
from .._errtext import error_text
from .._leaves import uniform_leaves
from .._printable import printable, shown
from ..config import RetryPolicy
from ..contract.queue import encode_result
from ..errors import (
    UNRECOVERABLE_STORE_ERRORS,
    CoordError,
    FencingTokenRejectedError,
    InvalidArgumentError,
    InvalidTypeError,
    LeaseLostError,
    LockError,
    RateLimited,
    StoreBusyError,
    StoreConnectionError,
    StoreError,
    Undeliverable,
)
from ..locks.lock import Semaphore
from ..locks.pool import LockPool
from ..models import Task, TaskStatus
from ..monitor.histogram import COMMIT_MS, ENQUEUE_TO_COMMIT_MS
from ..pauses import MIN_RATE_LIMIT_PAUSE_S, PauseBook, rate_limited_of
from .commits import Commits
from .config import NodeConfig
from .flight import Flight, FlightState
from .send import Outcome, observe, observe_many
from .status import NodeState

__all__ = ("HAND_BACK_WAIT_S", "MIN_RATE_LIMIT_PAUSE_S", "SETTLE_RETRY", "SETTLE_WAIT_S", "Settler")

log = logging.getLogger(__name__)

SETTLE_WAIT_S = 5.0
"""Seconds a cancelled node still waits for the commit (or failure) of a send that had
returned: the message went out, and a task handed back instead would be sent again."""

HAND_BACK_WAIT_S = 5.0
"""Seconds a node waits for the hand-back of a task it will not send (also when cancelled
meanwhile), so that whoever claims next finds it pending instead of leased to a stopped node."""

SETTLE_RETRY = RetryPolicy(base_s=0.01, factor=2.0, cap_s=0.5, jitter=0.5)
"""Backoff (from 10 ms, doubling, at most 0.5 s, +-50 % jitter) between tries of a commit
(or a failure record) that the store could not take (busy, connection lost): it is tried
again while the task's lease lasts, since a task whose commit is dropped would be sent
again once its lease lapsed."""

_TRANSIENT_STORE_ERRORS = (StoreBusyError, StoreConnectionError)
"""Store errors after which nothing was written and a later try may succeed."""
_HANDED_BACK_UNSENT = (FlightState.UNSENT, FlightState.LOCK_BUSY, FlightState.PAUSED, FlightState.STOPPED)
"""States of a flight whose task its slot hands back (or has handed back) without a send."""
CUT_ON_LAST_ATTEMPT = "the send was cut short on its last attempt (shutdown, say); it may have gone out"
"""The ``last_error`` of a task whose last attempt's send was cut short: dead, as after a crash then."""


class Settler:
    """Commits, fails and hands back the tasks of one node.

    A send that returned is **committed**: a compare-and-set on ``(id, lease_token, version)``
    that also checks the lock's fencing token against the highest one the resource has seen,
    in the same transaction (a lock only: a semaphore's permits finish in any order, so their
    tokens do not fence the commit), and with ``claim_next`` leases the key's next task to the
    same slot. A send that raised (or timed out) is a **failed attempt** for the retry policy
    (backoff with jitter, then the dead letter), and so is one whose lock was lost while the
    task's own lease held. A store that is busy or unreachable at that moment is tried again,
    with backoff, while the lease lasts (:data:`SETTLE_RETRY`): a message that went out is
    never sent again for want of a commit that could still land. A task the node will not send
    (the node stops, its lock stayed busy, its lease ran out locally before its send, the store
    failed mid-task) is **handed back** to ``pending``, not counted as a failure, so whoever
    claims next finds it at once.

    Args:
        store: The node's store.
        node_id: The node's id (for the logs).
        config: The node's config (``lease_s``, ``lock_permits``, ``retry``).
        counters: The node's live counters (``sent``, ``committed``, ``failed``,
            ``handed_back``, ``conflicts``), counted here.
        version_checks: Commit with compare-and-set (see :mod:`asynccoord.node.ablation`).
        due_soon: Wakes the node in the given number of seconds (a task it put back falls due).
        continues: Whether a commit should also lease the key's next task (``claim_next``).
        adopt: Takes a task leased by a commit (at or after the given ``time.monotonic()``)
            in flight, with its chain count.
        lock_pool: Returns the node's lock pool (None before its first lock turn), told of a
            commit refused for its lock's fencing token (see :meth:`LockPool.fence_refused`).
            Default None.

    Attributes:
        settling: The slots (asyncio tasks) settling a send that returned now: a
            cancellation of the node waits for them instead of cancelling them.
    """

    def __init__(
        self,
        store: Any,
        *,
        node_id: str,
        config: NodeConfig,
        counters: NodeState,
        version_checks: bool,
        due_soon: Callable[[float], None],
        continues: Callable[[Flight], bool],
        adopt: Callable[[Task, float, int], Flight],
        lock_pool: Callable[[], LockPool | None] | None = None,
    ) -> None:
        self.store = store
        self.node_id = node_id
        self.config = config
        self.counters = counters
        self.version_checks = version_checks
        self.fenced = config.lock_permits == 1  # a lock's token fences the commit, a semaphore's does not
        self._due_soon = due_soon
        self._continues = continues
        self._adopt = adopt
        self._lock_pool = lock_pool
        self.settling: set[asyncio.Task[Any]] = set()
        self._commits = Commits(store)  # this node's plain commits, one store call per loop turn
        self._releases: set[asyncio.Task[None]] = set()  # hand-backs running (see hand_back_shielded)

    async def finish(self, flight: Flight, outcome: Outcome) -> None:
        """Settle a send that returned, even if the node is cancelled meanwhile, then let the cancellation go on.

        The send's message went out: if its commit (or failure) were cancelled, the task
        would go back to pending and be sent again, and nothing would count it. So while
        this slot settles, a cancellation of the node does not cancel it but waits for it
        (up to :data:`SETTLE_WAIT_S`, see ``Node._handle_batch``); and a cancellation that
        reached the slot just as its send returned (``cancel_pending``) is raised after the
        settle.

        Raises:
            CancelledError: the node was cancelled (after the settle).
            Exception: what the settle raised (e.g. :class:`~asynccoord.errors.StoreClosedError`).
        """
        slot = asyncio.current_task()
        if slot is not None:
            self.settling.add(slot)
        completed, result, failure, cancel_pending = outcome
        try:
            # The settle: commit (fenced by the lock's token) or fail the task after its send.
            if not completed:
                node_id, task_id = self.node_id, flight.task.id
                state = flight.state
                if state is not FlightState.PAUSED and state is not FlightState.STOPPED:
                    self.counters.conflicts += 1
                if state is FlightState.UNSENT or state is FlightState.STOPPED:
                    await self.hand_back(flight.task, delay_s=0.0)  # never sent: pending again now, if still ours
                elif state is FlightState.PAUSED:  # never sent: pending again when the provider's pause ends
                    await self._hand_back_paused(flight)
                elif state is FlightState.LOCK_BUSY:  # its lock was lost before its send began: never sent
                    log.warning(
                        "asynccoord.node.send_cancelled node=%s task=%s reason=%s", node_id, task_id, flight.lost
                    )
                    await self.hand_back(flight.task, delay_s=self.config.busy_requeue_s)
                else:
                    reason = flight.lost
                    log.warning(
                        "asynccoord.node.send_cancelled node=%s task=%s reason=%s", node_id, task_id, shown(reason)
                    )
                if state is FlightState.LOCK_DROPPED:  # never commit; the task's lease is still ours
                    await self._fail_lock_lost(flight)
                # else the task lease is gone (or ran out locally): never commit
            else:
                self.counters.sent += 1
                limited = rate_limited_of(failure)
                if limited is not None:  # the provider's 429 (or a group of them): no attempt used, buckets paused
                    await self.rate_limited(flight, limited)
                elif failure is not None:
                    await self.fail(flight, failure)
                else:
                    await self._commit(flight, result)
                flight.move(FlightState.SETTLED)
        finally:
            if slot is not None:
                self.settling.discard(slot)
        if cancel_pending:
            raise asyncio.CancelledError

    async def rate_limited(self, flight: Flight, limited: RateLimited) -> None:
        """Report the provider's 429 (``limited``) for ``flight``'s task: no attempt used.

        The store pauses the bucket(s) the provider named (or all of the task's) until the
        Retry-After (at least :data:`MIN_RATE_LIMIT_PAUSE_S`) has passed, for every process of
        the database, and hands the task back to pending in its place, its attempt not
        counted. A store without rate limits (a custom store), or a node without version
        checks, takes the plain failure path. A busy or unreachable store is tried again while
        the lease lasts, as a commit is; a lost lease is a conflict and leaves the task alone
        (the store paused the buckets anyway).

        Raises:
            StoreError: the store failed (the caller hands the task back, or fails the node).
        """
        report = getattr(self.store, "report_rate_limited", None)
        if report is None or not self.version_checks:
            await self.fail(flight, limited)
            return
        task = flight.task
        log.info(
            "asynccoord.node.rate_limited node=%s task=%s retry_after_s=%.3f dimension=%s key=%s",
            self.node_id,
            task.id,
            limited.retry_after_s,
            shown(limited.dimension),
            shown(limited.key),
        )

        pause_s = max(limited.retry_after_s, MIN_RATE_LIMIT_PAUSE_S)

        async def once() -> None:
            await report(task, pause_s, dimension=limited.dimension, key=limited.key)

        try:
            await self._retrying(flight, "rate_limited", once)
        except LeaseLostError as exc:
            # The lease was lost during the send (unnoticed until now): another node may have the
            # task. No stale commit (the provider refused the message), a lost lease all the same.
            self.counters.conflicts += 1
            self.store.events.add(ev.LEASE_LOST)
            log.warning(
                "asynccoord.node.rate_limited_rejected node=%s task=%s reason=%s",
                self.node_id,
                task.id,
                printable(exc.reason),
            )

    async def fail(self, flight: Flight, failure: BaseException, *, source: str = "send") -> None:
        """Record a failed attempt of ``flight``'s task (the store's retry policy decides: again later, or dead).

        ``failure`` becomes the task's ``last_error`` (``"Type: message"``, safe for an
        exception whose ``__str__`` raises, see :func:`~asynccoord._errtext.error_text`); a
        ``CancelledError`` that ``source`` (``"send"`` or ``"lock_key"``) raised by itself
        reads ``"<source> raised CancelledError without being cancelled"``. A send's
        :class:`~asynccoord.errors.Undeliverable` (alone, or every error of an exception group)
        makes the task a dead letter at once, its ``last_error`` the (first) refusal's text.

        A busy or unreachable store is tried again while the lease lasts (see :meth:`_retrying`).

        Raises:
            StoreError: the store failed (the caller hands the task back, or fails the node).
        """
        self.counters.failed += 1
        refused = _undeliverable_of(failure) if source == "send" else None
        undeliverable = refused is not None
        if isinstance(failure, asyncio.CancelledError):
            detail = error_text(failure).partition(": ")[2]  # its message ("" without one), safely
            text = f"{source} raised CancelledError without being cancelled" + (f": {detail}" if detail else "")
        else:
            text = error_text(failure if refused is None else refused)  # a group's: its first refusal's
        try:
            out = await self._record_failure(flight, text, dead=undeliverable)
        except LeaseLostError as exc:  # its lease ran out meanwhile: another node may have it (a stale commit)
            self.counters.conflicts += 1
            log.warning(
                "asynccoord.node.fail_rejected node=%s task=%s reason=%s error=%s: the failure was not recorded",
                self.node_id,
                flight.task.id,
                printable(exc.reason),
                printable(text),
                exc_info=_trace(failure) if source == "send" and not undeliverable else None,
            )
            return
        if undeliverable:
            log.warning(
                "asynccoord.node.send_undeliverable node=%s task=%s attempt=%d/%d error=%s: the provider refused "
                "the message for good; the task is a dead letter",
                self.node_id,
                out.id,
                out.attempts,
                out.max_attempts,
                printable(text),
            )
        elif source == "send":
            self._log_failed_send(out, failure, text)

    def _log_failed_send(self, out: Task, failure: BaseException, text: str) -> None:
        """Log a failed attempt of ``send``: a warning while it will be retried, an error once it is dead.

        The send's own traceback goes with the first attempt's line and the dead one's
        (``exc_info``), so a bug in it shows where it is, not only in the task's ``last_error``,
        without a traceback per retry of a provider that is down; a timeout or a result refused
        by the node has none. A send that raised ``CancelledError`` by itself was logged as
        ``send_cancelled_itself`` already: only its dead letter is.
        """
        trace = _trace(failure) if out.attempts <= 1 or out.status is TaskStatus.DEAD else None
        if out.status is TaskStatus.PENDING:
            if isinstance(failure, asyncio.CancelledError):
                return
            log.warning(
                "asynccoord.node.send_failed node=%s task=%s attempt=%d/%d retry_in_s=%.3f error=%s",
                self.node_id,
                out.id,
                out.attempts,
                out.max_attempts,
                max(0.0, out.run_at - out.updated_at),
                printable(text),
                exc_info=trace,
            )
        elif out.status is TaskStatus.DEAD:
            log.error(
                "asynccoord.node.send_failed_dead node=%s task=%s attempts=%d error=%s: no attempt left, "
                "the task is a dead letter",
                self.node_id,
                out.id,
                out.attempts,
                printable(text),
                exc_info=trace,
            )

    async def _fail_lock_lost(self, flight: Flight) -> None:
        """Record the attempt whose lock (or permit) was lost as failed, so the retry policy takes it now.

        The task's own lease still holds: left alone, the task would wait ``lease_s`` for it
        to lapse. As a failed attempt (``last_error`` "LockLostError: lock lost: ...") it is
        claimable again after the retry policy's backoff, and an attempt that keeps losing
        its lock reaches its dead letter like any failing one. A task lease lost meanwhile
        leaves nothing to do (the conflict is counted already).
        """
        with contextlib.suppress(LeaseLostError):
            await self._record_failure(flight, f"LockLostError: {flight.lost}")
        flight.move(FlightState.SETTLED)

    async def _record_failure(self, flight: Flight, text: str, *, dead: bool = False) -> Task:
        """Record a failed attempt (``last_error`` ``text``; with ``dead``, a dead letter at once);
        wake the node when its retry falls due.

        Returns:
            The task as the store recorded it (pending again, or dead).

        Raises:
            LeaseLostError: the lease is no longer the node's (nothing written).
            StoreError: as :meth:`_retrying`.
        """

        recorded: list[Task] = []

        async def record() -> None:
            if dead:
                out = await self.store.fail(flight.task, text, retry=self.config.retry, dead=True)
            else:  # a store of the contract before ``dead`` takes the call as it was
                out = await self.store.fail(flight.task, text, retry=self.config.retry)
            recorded.append(out)
            if out.status is TaskStatus.PENDING:  # retried later: claim again when it is due
                self._due_soon(out.run_at - out.updated_at)

        await self._retrying(flight, "fail", record)
        return recorded[-1]

    async def commit_many(self, flights: list[Flight], results: list[Any]) -> None:
        """Commit the sends of ``flights`` that returned ``results``, in one store call; each flight ends ``SETTLED``.

        What :meth:`finish` does for each one's successful send, for flights with no lock
        and no commit-and-continue: the commits go out as one ``complete_many`` (joined with
        the node's other commits of the loop turn, see :mod:`~asynccoord.node.commits`),
        each with its own compare-and-set; a lost lease or a store failure is a conflict,
        as for one commit. A busy or unreachable store: each commit is tried again on its
        own while its lease lasts (see :meth:`_retrying`).

        Raises:
            StoreClosedError, StoreLoopError: the store is closed (or serves another loop);
                the flights not settled stay as they are, for the caller to hand back.
        """
        counters = self.counters
        counters.sent += len(flights)
        config = self.store.config
        for i, result in enumerate(results):
            if result is not None:
                results[i] = self._storable(flights[i], result, config)
        commit_started = time.perf_counter()
        try:
            outcomes = await self._commits.complete_many([f.task for f in flights], results)
        except _TRANSIENT_STORE_ERRORS as exc:
            await self._commit_each(flights, results, exc)
            return
        except UNRECOVERABLE_STORE_ERRORS:
            raise
        except CoordError as exc:  # the store failed: each commit is rejected (see _commit)
            for flight in flights:
                counters.conflicts += 1
                log.warning(
                    "asynccoord.node.commit_rejected node=%s task=%s reason=%s",
                    self.node_id,
                    flight.task.id,
                    shown(exc),
                )
                flight.move(FlightState.SETTLED)
            return
        commit_ms = (time.perf_counter() - commit_started) * 1000.0
        waits_ms: list[float] = []
        for flight, outcome in zip(flights, outcomes, strict=True):
            if isinstance(outcome, Task):
                waits_ms.append((outcome.updated_at - flight.task.created_at) * 1000.0)
            else:
                counters.conflicts += 1
                reason = outcome.reason if isinstance(outcome, LeaseLostError) else outcome
                log.warning(
                    "asynccoord.node.commit_rejected node=%s task=%s reason=%s",
                    self.node_id,
                    flight.task.id,
                    shown(reason),
                )
            flight.move(FlightState.SETTLED)
        counters.committed += len(waits_ms)
        if waits_ms:  # store clock, both ends: no clock skew between processes
            observe_many(self.store, ENQUEUE_TO_COMMIT_MS, waits_ms)
            observe_many(self.store, COMMIT_MS, [commit_ms] * len(waits_ms))

    async def _commit_each(self, flights: list[Flight], results: list[Any], failed: Exception) -> None:
        """Commit each of ``flights`` on its own, tried again after ``failed`` (transient) while its lease lasts.

        Raises:
            StoreClosedError, StoreLoopError: as :meth:`commit_many` (the first one), once
                every commit is over; the flights committed meanwhile are ``SETTLED``.
        """
        loop = asyncio.get_running_loop()
        tries = [loop.create_task(self._commit(f, r, failed=failed)) for f, r in zip(flights, results, strict=True)]
        try:
            await asyncio.wait(tries)
        finally:
            for attempt in tries:
                if not attempt.done():
                    attempt.cancel()  # the caller is cancelled: it hands back what is not settled
                attempt.add_done_callback(_seen)
        errors = [e for t in tries if not t.cancelled() and (e := t.exception()) is not None]
        for flight, attempt in zip(flights, tries, strict=True):
            if not attempt.cancelled() and attempt.exception() is None:
                flight.move(FlightState.SETTLED)
        if errors:
            raise errors[0]

    def _storable(self, flight: Flight, result: Any, config: Any) -> Any:
        """``result`` if the store can hold it, else None (logged): the message went out, it is committed anyway."""
        try:
            encode_result(result, config)
        except (InvalidArgumentError, InvalidTypeError) as exc:
            # The message went out: commit it anyway (never re-send), without the result.
            log.warning(
                "asynccoord.node.result_not_stored node=%s task=%s reason=%s",
                self.node_id,
                flight.task.id,
                shown(exc),
            )
            return None
        return result

    async def _commit(self, flight: Flight, result: Any, *, failed: Exception | None = None) -> None:
        """Commit ``flight``'s task (a conflict is counted and logged); ``failed``: a first try's transient error.

        Raises:
            StoreClosedError, StoreLoopError: the store is closed (or serves another loop).
        """
        task = flight.task
        if failed is None and result is not None:  # (checked already after a first try)
            result = self._storable(flight, result, self.store.config)
        commit_started = time.perf_counter()
        trace = flight.trace
        try:
            try:
                if failed is None:
                    if trace is None:
                        await self._commit_once(flight, result)
                    else:  # each try in a span of its own
                        await trace.commit(functools.partial(self._commit_once, flight, result))
            except _TRANSIENT_STORE_ERRORS as exc:  # tried again (the first try needs no retry loop)
                failed = exc
            if failed is not None:
                once = functools.partial(self._commit_once, flight, result)
                if trace is not None:
                    once = functools.partial(trace.commit, once)
                await self._retrying(flight, "commit", once, failed=failed)
        except LeaseLostError as exc:
            self.counters.conflicts += 1
            log.warning(
                "asynccoord.node.commit_rejected node=%s task=%s reason=%s",
                self.node_id,
                task.id,
                printable(exc.reason),
            )
            return
        except UNRECOVERABLE_STORE_ERRORS:
            raise  # the store is closed (or serves another loop): the node fails, as documented
        except CoordError as exc:  # a fencing rejection (a newer holder of the lock wrote first), or the store failed
            self.counters.conflicts += 1
            log.warning("asynccoord.node.commit_rejected node=%s task=%s reason=%s", self.node_id, task.id, shown(exc))
            if isinstance(exc, FencingTokenRejectedError):
                await self._fence_refused(flight, exc)
            return
        observe(self.store, COMMIT_MS, commit_started)
        self.counters.committed += 1

    async def _fence_refused(self, flight: Flight, error: FencingTokenRejectedError) -> None:
        """Tell the lock pool that a commit fenced by ``flight``'s lock was refused (``error``).

        The pool takes no more turns on that lease and, on a lock store whose counter fell
        behind the resource's token (a Redis restart that lost writes), moves the counter
        past it, so the next acquisition's commit is accepted. A store failure meanwhile is
        logged: the next refused commit tries again.
        """
        lease = flight.lock
        pool = None if self._lock_pool is None else self._lock_pool()
        if lease is None or pool is None:
            return
        try:
            await pool.fence_refused(lease, error)
        except CoordError as exc:
            log.warning(
                "asynccoord.node.fencing_counter_not_advanced node=%s lock=%r error=%s",
                self.node_id,
                lease.name,
                shown(exc),
            )

    async def _commit_once(self, flight: Flight, result: Any) -> None:
        """One try of the commit of ``flight``'s task (fenced by a lock's token; with commit-and-continue)."""
        task = flight.task
        if not self.version_checks:
            await self.store.unchecked_complete([task], [result])
            return
        # A lock's token fences the commit; a semaphore's does not: its holders finish in
        # any order, and an older permit's commit is no stale write.
        lock = flight.lock
        fence = None if lock is None or not self.fenced else (lock.name, lock.fencing_token)
        if self._continues(flight):
            started = time.monotonic()
            step = await self.store.complete_and_claim_next(task, result, fence=fence, lease_s=self.config.lease_s)
            done: Task = step.done
            if step.next_task is not None:
                flight.next = self._adopt(step.next_task, started, flight.chain + 1)
        else:
            done = await self._commits.complete(task, result, fence)
        recorder = getattr(self.store, "latencies", None)
        if recorder is not None:  # store clock, both ends: no clock skew between processes
            recorder.observe(ENQUEUE_TO_COMMIT_MS, (done.updated_at - task.created_at) * 1000.0)

    async def _retrying(
        self,
        flight: Flight,
        what: str,
        attempt: Callable[[], Awaitable[None]],
        *,
        failed: Exception | None = None,
    ) -> None:
        """Run ``attempt`` (a commit or a failure record), again after a transient store error while the lease lasts.

        A store that is busy (SQLite's write lock held past ``busy_timeout_s``: nothing was
        written) or unreachable (past the PostgreSQL store's ``reconnect_timeout_s``: a
        commit whose reply was lost may have landed) leaves the task leased to this node, and
        dropping the commit would leave the task to be sent again once the lease lapsed. So
        it is tried again with :data:`SETTLE_RETRY`'s backoff until the lease's local
        deadline. Each try is the same compare-and-set, so after a try that did land the
        next one fails as a lost lease (a conflict), never a second commit; a next task that
        such a landed try leased by commit-and-continue is not known to the node and waits
        for its lease to lapse (it is not sent twice). Other errors (a lost lease, a
        fencing rejection, a closed store, any other store error) are raised at once, and
        so is the last transient error at the deadline. ``failed``: the transient error of a
        first try the caller made itself (this then starts with its retry).
        """
        tries = 0
        while True:
            try:
                if failed is not None:
                    raise failed
                await attempt()
                return
            except _TRANSIENT_STORE_ERRORS as exc:
                failed = None
                tries += 1
                delay_s = SETTLE_RETRY.delay_s(tries)
                if time.monotonic() + delay_s >= flight.lease_deadline:
                    log.error(
                        "asynccoord.node.%s_failed node=%s task=%s tries=%d error=%s: the lease ends before "
                        "another try; the task will be claimed again when it lapses",
                        what,
                        self.node_id,
                        flight.task.id,
                        tries,
                        shown(exc),
                    )
                    raise
                log.warning(
                    "asynccoord.node.%s_retry node=%s task=%s try=%d delay_s=%.3f error=%s",
                    what,
                    self.node_id,
                    flight.task.id,
                    tries,
                    delay_s,
                    shown(exc),
                )
                await asyncio.sleep(delay_s)

    async def hand_back_shielded(self, flight: Flight) -> None:
        """Hand ``flight``'s task back to pending (shielded, up to :data:`HAND_BACK_WAIT_S`), unless it is settled.

        A send that may have reached its receiver before it was cut, or whose commit was
        cut, is counted as ``send_interrupted``: the task will be sent again. A send that
        still runs (it outlived the node's stop, see :meth:`Flight.outlives`) is not handed back:
        see :meth:`hand_back_all_shielded`.
        """
        await self.hand_back_all_shielded([flight])

    async def hand_back_all_shielded(self, flights: list[Flight]) -> None:
        """:meth:`hand_back_shielded` for each of ``flights``, all at once (one wait for all of them).

        A flight whose send still runs (:meth:`Flight.outlives`: the node's stop cut it, and it
        ignored its cancellations past its cleanup time) is not handed back, nor counted as
        such: its task lease is left to lapse (within ``lease_s``; the node renews it no more),
        and the node leaves its lock or permit to lapse too (within ``lock_ttl_s``), so that no
        other node sends under that lock, nor sends the task again, until then. Logged (a
        warning) as ``asynccoord.node.send_outlived_shutdown``, once per flight. A flight whose
        send never began moves to ``STOPPED`` first: its lease is given up, not lost, and the
        keeper renews it no more.

        Raises:
            Exception: a hand-back's error that is no :class:`~asynccoord.errors.CoordError`
                (the first; logged instead while the caller is being cancelled).
            CancelledError: the caller was cancelled meanwhile (raised once the hand-backs are over).
        """
        releases: list[asyncio.Task[None]] = []
        loop = asyncio.get_running_loop()
        for flight in flights:
            state = flight.state
            if state is FlightState.SETTLED or state in _HANDED_BACK_UNSENT:
                continue  # committed, failed or handed back unsent already: there is nothing (more) to hand back
            # Past CLAIMED every state left here began its send (whatever cut it): the attempt stays
            # counted, so the next delivery's attempts say it may repeat a message.
            sent = state is not FlightState.CLAIMED
            if not sent:  # given up: a renewal that lands after the hand-back finds no lost lease
                flight.move(FlightState.STOPPED)
            if flight.outlives():  # its lease and lock stay taken while the send may still be sending
                self.store.events.add(ev.SEND_INTERRUPTED)
                self._outlived(flight)
                continue
            if state is FlightState.INTERRUPTED or state is FlightState.SENDING or state is FlightState.TIMED_OUT:
                # The send may have reached its receiver before it was cancelled: the next
                # holder's send of this task is a possible duplicate. Count it like a lost lease.
                self.store.events.add(ev.SEND_INTERRUPTED)
            elif state is FlightState.RETURNED:
                # The send was over, but its commit (or failure record) was cut: shutdown past
                # SETTLE_WAIT_S, say. The task goes back and will be sent again: count it too.
                self.store.events.add(ev.SEND_INTERRUPTED)
                log.warning(
                    "asynccoord.node.settle_cut node=%s task=%s: the send was over but its commit was cut; "
                    "handed back, it will be sent again",
                    self.node_id,
                    flight.task.id,
                )
            # The release runs in a task of its own: the slot's own cancellation (``_handle_batch``
            # cancels its slots with Task.cancel(), which an anyio shield does not stop) must not
            # cut it, or the task would stay leased to a stopped node until its lease lapsed.
            release = loop.create_task(self._hand_back_quietly(flight.task, count_attempt=sent))
            self._releases.add(release)
            release.add_done_callback(self._releases.discard)
            releases.append(release)
        if releases:
            with anyio.CancelScope(shield=True):
                await _wait_through_cancellation(releases, HAND_BACK_WAIT_S)

    async def give_permit_back(self, handle: Semaphore, flight: Flight) -> None:
        """Release ``flight``'s semaphore permit after its send (shielded, bounded by the handle).

        A failed release is logged. A send that still runs (:meth:`Flight.outlives`) keeps it:
        the permit is left to lapse at its TTL, not renewed (see :meth:`hand_back_all_shielded`).
        """
        if flight.outlives():
            handle.let_lapse()
            return
        try:
            await handle.release()
        except (LockError, StoreError) as exc:  # lapsed or lost (counted by the lock), or the store failed
            log.warning(
                "asynccoord.node.permit_release_failed node=%s task=%s error=%s",
                self.node_id,
                flight.task.id,
                shown(exc),
            )

    def _outlived(self, flight: Flight) -> None:
        """Log (and count, ``send_abandoned``) that ``flight``'s send outlived the node's stop: its task
        lease and lock are left to lapse."""
        self.store.events.add(ev.SEND_ABANDONED)
        cfg, lock = self.config, flight.lock
        if lock is None:
            left = f"its lease is left to lapse, within lease_s={cfg.lease_s:.2f} s; the task is not sent again"
        else:
            kind = "lock" if cfg.lock_permits == 1 else "permit"
            left = (
                f"its lease and its {kind} are left to lapse, within lease_s={cfg.lease_s:.2f} s and "
                f"lock_ttl_s={cfg.lock_ttl_s:.2f} s; nothing else is sent under the {kind} (nor the task again)"
            )
        log.warning(
            "asynccoord.node.send_outlived_shutdown node=%s task=%s lock=%s: the send still runs after the node's "
            "stop cut it (past its cleanup time); the task is not handed back: %s until then",
            self.node_id,
            flight.task.id,
            "-" if lock is None else repr(lock.name),
            left,
        )

    async def _hand_back_quietly(self, task: Task, *, count_attempt: bool) -> None:
        with contextlib.suppress(CoordError):
            await self.hand_back(task, delay_s=0.0, count_attempt=count_attempt)

    async def _hand_back_paused(self, flight: Flight) -> None:
        """Hand back, unsent, a task whose bucket the provider paused since its claim: due when the pause ends.

        Its attempt is not used (a release); counted as ``send_paused``.

        Raises:
            StoreError: the store failed.
        """
        task, lock = flight.task, flight.lock
        pauses: PauseBook | None = getattr(self.store, "pauses", None)
        delay_s = 0.0 if pauses is None or lock is None else pauses.remaining_s(lock.name)
        self.store.events.add(ev.SEND_PAUSED)
        log.info("asynccoord.node.send_paused node=%s task=%s pause_left_s=%.3f", self.node_id, task.id, delay_s)
        await self.hand_back(task, delay_s=delay_s)

    async def hand_back_claimed(self, tasks: list[Task]) -> None:
        """Hand back, unsent and due now, the tasks of a claim that the node's stop overtook.

        A store that fails one hand-back (busy, unreachable) leaves that task to its lease,
        logged as ``asynccoord.node.hand_back_failed``, and the others are still handed back:
        a stop is no failure of the node.

        Raises:
            StoreClosedError, StoreLoopError: the store is closed (or serves another loop).
        """
        for task in tasks:
            try:
                await self.hand_back(task, delay_s=0.0)
            except UNRECOVERABLE_STORE_ERRORS:
                raise
            except StoreError as exc:
                log.warning(
                    "asynccoord.node.hand_back_failed node=%s task=%s error=%s: left to its lease",
                    self.node_id,
                    task.id,
                    exc,
                )

    async def hand_back(self, task: Task, *, delay_s: float, count_attempt: bool = False) -> None:
        """Put ``task`` back to pending, due in ``delay_s`` seconds (a lease lost meanwhile: nothing to do).

        ``count_attempt``: its send may have gone out, so the attempt stays counted (see
        :meth:`~asynccoord.backends.base.StoreBase.release`). On the task's last attempt it
        goes dead instead, as it would had the process died then (its lease lapsing on the
        last attempt): a task never gets more deliveries than ``max_attempts``.

        Raises:
            StoreError: the store failed.
        """
        try:
            if count_attempt and task.attempts >= task.max_attempts:
                self.counters.failed += 1
                await self.store.fail(task, CUT_ON_LAST_ATTEMPT)
                return
            await self.store.release(task, delay_s=delay_s, count_attempt=count_attempt)
            self.counters.handed_back += 1
        except LeaseLostError:
            return  # expired meanwhile: it is claimable again anyway
        if delay_s > 0:  # nobody is notified when it becomes due
            self._due_soon(delay_s)


def _trace(failure: BaseException) -> BaseException | None:
    """``failure`` for a log line's ``exc_info`` when it has a traceback of its own (a send's error), else None."""
    if failure.__traceback__ is None or isinstance(failure, asyncio.CancelledError):
        return None
    return failure


def _undeliverable_of(failure: BaseException) -> Undeliverable | None:
    """The provider's refusal for good that a send's ``failure`` is: an :class:`~asynccoord.errors.Undeliverable`,
    or the first of an exception group whose every leaf is one (a send built on a task group).

    A group holding any other error is an ordinary failure (None), retried by the retry
    policy, as :func:`~asynccoord.pauses.rate_limited_of` treats a group of 429s.
    """
    leaves = uniform_leaves(failure, Undeliverable)
    return None if leaves is None else leaves[0]


def _seen(task: asyncio.Task[Any]) -> None:
    """Mark the outcome of a commit left behind as seen (no 'exception was never retrieved' warning)."""
    if not task.cancelled():
        task.exception()


async def _wait_through_cancellation(tasks: list[asyncio.Task[None]], timeout_s: float) -> None:
    """Wait up to ``timeout_s`` seconds for ``tasks``, also when cancelled meanwhile; then re-raise.

    A cancellation that arrives while waiting does not stop the wait: it is raised once
    ``tasks`` are over (or the time is up, those left going on in the background). An error
    of one of them is raised (the first; the others logged), unless the caller is being
    cancelled (then each is logged).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    cancelled = False
    waiting = {t for t in tasks if not t.done()}
    while waiting:
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        try:
            _, waiting = await asyncio.wait(waiting, timeout=remaining)
        except asyncio.CancelledError:
            cancelled = True
            waiting = {t for t in waiting if not t.done()}
    errors = [e for t in tasks if t.done() and not t.cancelled() and (e := t.exception()) is not None]
    current = asyncio.current_task()
    if errors and not (cancelled or (current is not None and current.cancelling())):
        for error in errors[1:]:
            log.error("asynccoord.node.hand_back_failed error=%s", printable(error_text(error)), exc_info=error)
        raise errors[0]
    for error in errors:
        # The caller is being cancelled: the cancellation is what it raises (an error raised
        # instead would end the slot with it, where nobody reads it); the error is logged.
        log.error("asynccoord.node.hand_back_failed error=%s", printable(error_text(error)), exc_info=error)
    if cancelled:
        raise asyncio.CancelledError
