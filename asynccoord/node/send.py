"""Send supervision: run the user's send under its timeout and the lease guard, and cut it once when it must stop.

The send runs in an asyncio task of its own, so that whatever stops it (its timeout, a lost
lease or lock, the node's cancellation) reaches it as one ``CancelledError``, as
``asyncio.Task.cancel`` delivers it: the send's ``except``/``finally`` blocks may still await
(to close a connection, say) for up to :data:`SEND_CLEANUP_S`, and nothing cancels it again
before that time is up, whatever else happens meanwhile (:func:`cut`). A send cut at its
timeout that runs on past that time is still waited for, its task lease and lock kept, for up
to ``NodeConfig.send_overrun_s`` after the cut, so that nothing else is sent under its lock
(nor the task again) while it runs. The node's own cancel scopes (anyio) are level-triggered:
a send run in the node's task could not await anything in its ``finally``. A
``KeyboardInterrupt`` or ``SystemExit`` from a send leaves its task as a
:class:`~asynccoord._exits.ProcessExiting` (see :mod:`asynccoord._exits`). The outcome of a
send moves its :class:`~asynccoord.node.flight.Flight` on, and is what
:mod:`asynccoord.node.settle` commits or fails.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

import anyio

from .. import events as ev
from .._exits import PROCESS_EXITS, ProcessExiting, carry, is_process_exit
from .._printable import shown
from ..errors import InvalidTypeError, LockLostError, RateLimited
from ..models import Task
from ..monitor.histogram import SEND_MS
from ..pauses import PauseBook, rate_limited_of
from .config import NodeConfig
from .delivery import _DELIVERY, Affinity, Delivery
from .flight import Flight, FlightState

__all__ = (
    "SEND_CLEANUP_S",
    "ExitRecorder",
    "Outcome",
    "SendFn",
    "Sender",
    "cut",
    "lease_ran_out",
    "lock_lost",
    "observe",
    "observe_many",
    "retrieve",
    "second_cut_landed",
)

log = logging.getLogger(__name__)

SEND_CLEANUP_S = 0.25
"""Seconds a cancelled send's own cleanup (its ``except``/``finally`` awaits) may take
before it is cancelled again; shutdown and lease-loss bounds include it.

The node cancels a send once, for whichever reason comes first (its timeout, a lost
lease or lock, the node's cancellation); the others that come during this time do not
cancel it again. A send still running when the time is up (one that swallows the
``CancelledError``) is cancelled once more. If its timeout cut it, the node then still
waits for it, holding its task lease and lock, until it ends or ``send_overrun_s`` after
the cut (see :func:`cut`); otherwise it goes on without it."""

SendFn = Callable[[Task], Awaitable[Any]]
"""The user's send: ``async def send(task: Task) -> Any`` (the result is stored, JSON)."""

Outcome = tuple[bool, Any, BaseException | None, bool]
"""What :meth:`Sender.run` returns: ``(completed, result, failure, cancel_pending)``.

``completed`` is False when the send was cut because its task lease or lock was lost, or
never started (its lease or lock lost first, or the lease past its local deadline).
``failure`` is what the send raised (an ``Exception``, or a ``BaseException`` other than
``KeyboardInterrupt`` and ``SystemExit``), ``TimeoutError()`` when it was cut at
``send_timeout_s``, or the ``CancelledError`` it raised although nothing of the node's
cancelled it. ``cancel_pending``: the node was cancelled just as the send returned; the
settle goes first, then the cancellation (see :meth:`asynccoord.node.settle.Settler.finish`)."""


class ExitRecorder(Protocol):
    """The node's record of a process exit (``Node._exiting``): keeps the first, with ``stop`` stops the pipeline."""

    def __call__(self, carried: ProcessExiting, *, stop: bool = False) -> ProcessExiting: ...


def observe(store: Any, name: str, started: float) -> None:
    """Record the latency since ``started`` (``time.perf_counter()``) in ``store.latencies``, if any."""
    recorder = getattr(store, "latencies", None)
    if recorder is not None:
        recorder.observe(name, (time.perf_counter() - started) * 1000.0)


def observe_many(store: Any, name: str, values_ms: list[float]) -> None:
    """Record latencies ``values_ms`` (milliseconds) in ``store.latencies``, if any, under one lock."""
    recorder = getattr(store, "latencies", None)
    if recorder is None:
        return
    many = getattr(recorder, "observe_many", None)
    if many is not None:
        many(name, values_ms)
    else:
        for value_ms in values_ms:
            recorder.observe(name, value_ms)


class Sender:
    """Runs one node's sends, each in a task of its own, under ``send_timeout_s`` (see the module docstring).

    Args:
        store: The node's store (its ``latencies``, if any, get the send times).
        node_id: The node's id (for :class:`~asynccoord.node.delivery.Delivery` and the logs).
        config: The node's config: ``send_timeout_s``, ``send_overrun_s`` and ``lock_pace_dimension``.
        affinity: The node's conversation contexts.
        on_exit: The node's record of a process exit.
        stopping: Whether the node has stopped claiming: a send not begun by then never begins.

    Attributes:
        overrun_s: How long after its timeout's cut a send that outlives its cleanup time is
            still waited for (``send_overrun_s``, or ``send_timeout_s`` when that is None).
    """

    __slots__ = (
        "_affinity",
        "_checked_send",
        "_node_id",
        "_on_exit",
        "_pace_dimension",
        "_pauses",
        "_send_is_async",
        "_stopping",
        "_store",
        "_timeout_s",
        "overrun_s",
    )

    def __init__(
        self,
        store: Any,
        *,
        node_id: str,
        config: NodeConfig,
        affinity: Affinity,
        on_exit: ExitRecorder,
        stopping: Callable[[], bool] | None = None,
    ) -> None:
        self._store = store
        self._stopping = stopping
        self._node_id = node_id
        self._timeout_s = config.send_timeout_s
        self.overrun_s = config.send_timeout_s if config.send_overrun_s is None else config.send_overrun_s
        self._affinity = affinity
        self._on_exit = on_exit
        self._checked_send: Any = None  # the send _send_is_async describes (see _coroutine)
        self._pauses: PauseBook | None = getattr(store, "pauses", None)
        self._pace_dimension = config.lock_pace_dimension
        self._send_is_async = False

    async def run(self, flight: Flight, send: SendFn) -> Outcome:
        """Run ``send(flight.task)`` under the timeout and the lease guard; return its :data:`Outcome`.

        A lost lease or lock, or the send timeout, cancels the send's task directly; a
        cancellation of the node reaches it through :func:`cut_short`. Whichever comes
        first cancels it; the others find it cut already and leave its cleanup time alone.
        No send starts past the local deadline of the task's lease (``time.monotonic()``,
        see :func:`~asynccoord.node.flight.lease_deadline`): one started later could follow
        the store's hand-over of the task to another node, so the flight is lost
        (:func:`lease_ran_out`) and ends ``UNSENT``, for the settle to hand the task back.

        Raises:
            CancelledError: the node was cancelled (the send got its cleanup time first;
                the flight is ``INTERRUPTED``).
            ProcessExiting: the send raised ``KeyboardInterrupt`` or ``SystemExit``, or a
                group holding one (the process is ending: the task is handed back, not
                failed; see :mod:`asynccoord._exits`). Any other ``BaseException`` it raised
                is a failed send, as an ``Exception`` is.
        """
        unsent = self.start(flight, send)
        if unsent is not None:
            return unsent
        child, over = flight.send, flight.over
        assert child is not None
        assert over is not None
        send_started = time.perf_counter()
        child.add_done_callback(functools.partial(self._send_ended, flight, over))
        loop = asyncio.get_running_loop()
        timer = loop.call_at(loop.time() + self._timeout_s, time_out, flight, self.overrun_s)
        cancel_pending = False
        try:
            await over
        except asyncio.CancelledError:
            if child.done() and not child.cancelled() and (flight.cut_until is None or _returned_late(flight, child)):
                # The send had returned (its message went out) when the node was cancelled:
                # settle it first, then go on cancelling; handing it back would send it again.
                cancel_pending = True
            else:  # the node is cancelled: the send gets its cleanup time, then it goes on
                timer.cancel()  # no timeout may cut that time short
                try:
                    await cut_short(flight, child)
                finally:
                    flight.move(FlightState.INTERRUPTED)
                raise
        finally:
            timer.cancel()
            flight.over = None
            if child.done() or flight.state is not FlightState.INTERRUPTED:
                flight.send = None  # (kept for a send that outlives the node's cut: see Flight.outlives)
        outcome = self.outcome(flight, child, cancel_pending)
        if outcome[0]:
            observe(self._store, SEND_MS, send_started)
        return outcome

    def start(self, flight: Flight, send: SendFn) -> Outcome | None:
        """Start ``send(flight.task)`` in a task of its own (``flight.send``, ending ``flight.over``); None if started.

        The send's task copies the context with the :class:`~asynccoord.node.delivery.Delivery`
        set. The caller arms the timeout (:func:`time_out`) and waits for ``flight.over``.

        Returns:
            None when the send started; else the :data:`Outcome` of a send that never
            started: its lease past its local deadline (the flight ``UNSENT``), its lease
            or lock lost meanwhile (``DROPPED``, ``LOCK_BUSY``), its lock paused
            since the claim by the provider's 429 to another send (``PAUSED``, see
            :mod:`asynccoord.pauses`), or the node stopped claiming meanwhile (``STOPPED``).
        """
        state = flight.state
        if state is FlightState.CLAIMED and time.monotonic() >= flight.lease_deadline:
            lease_ran_out(self._store, self._node_id, flight, "before its send")  # the store may hand it on already
            flight.move(FlightState.UNSENT)
            return False, None, None, False
        if state is not FlightState.CLAIMED:  # its lease or lock was lost before the send could begin
            # Never sent: a lost lease leaves nothing to hand back; a task whose lock was lost (while
            # its send waited for the lock's pace, say) goes back unsent, its attempt not used.
            flight.move(FlightState.DROPPED if state is FlightState.LEASE_LOST else FlightState.LOCK_BUSY)
            return False, None, None, False
        pauses, lock = self._pauses, flight.lock
        if pauses is not None and lock is not None and pauses.remaining_s(lock.name) > 0.0:
            flight.move(FlightState.PAUSED)  # the provider said 429 to a send under its lock since the claim
            return False, None, None, False
        if self._stopping is not None and self._stopping():
            # A shutdown came while the task waited (for its lock, say): a send begun now would be
            # cut at the drain's deadline, so the task goes back unsent, for another node.
            flight.move(FlightState.STOPPED)
            return False, None, None, False
        flight.move(FlightState.SENDING)
        task = flight.task
        loop = asyncio.get_running_loop()
        delivery = Delivery(node_id=self._node_id, task=task, lock=flight.lock, context=self._affinity.context(task))
        over = flight.over = loop.create_future()
        token = _DELIVERY.set(delivery)
        try:
            # The task copies the context: the delivery. Its last step hands on the send's lock
            # turn, or resolves `over` (see _ending); the done callback resolves it otherwise.
            trace = flight.trace
            # Untraced, _ending itself carries a KeyboardInterrupt or SystemExit out of the send.
            sending = self._coroutine(task, send, carried=trace is not None)
            if trace is not None:  # in the send span, current while the send runs
                sending = trace.send(sending)
            flight.send = loop.create_task(_ending(sending, over, flight, self._paused))
        finally:
            _DELIVERY.reset(token)
        return None

    def _paused(self, flight: Flight, limited: RateLimited) -> None:
        """``flight``'s send raised ``limited`` (a 429): pause its lock's other sends (:mod:`asynccoord.pauses`)."""
        pauses, lock = self._pauses, flight.lock
        if pauses is not None and lock is not None:
            pauses.paused_by(lock.name, limited, self._pace_dimension)

    def outcome(self, flight: Flight, child: asyncio.Task[Any], cancel_pending: bool) -> Outcome:
        """The :data:`Outcome` of the send ``child`` of ``flight``, once ``flight.over`` is done; moves the flight on.

        ``cancel_pending``: the node was cancelled as the send returned (carried in the outcome).

        Raises:
            CancelledError: the send raised ``CancelledError`` by itself while the caller is
                being cancelled (the flight is ``INTERRUPTED``).
            ProcessExiting: as :meth:`run`.
        """
        state = flight.state
        task = flight.task
        if state is FlightState.LEASE_LOST or state is FlightState.LOCK_LOST:
            flight.move(FlightState.DROPPED if state is FlightState.LEASE_LOST else FlightState.LOCK_DROPPED)
            if not child.done():  # past its cleanup time: it runs on unwatched, under the lock's token
                flight.abandoned = True  # the lock passes on under a new lease (see Node._handle_task)
                self._store.events.add(ev.SEND_ABANDONED)
            child.add_done_callback(retrieve)  # the cut send's outcome, seen now or when it ends
            return False, None, None, cancel_pending
        result: Any = None
        failure: BaseException | None = None
        if state is FlightState.TIMED_OUT and not _returned_late(flight, child):
            if not child.done():  # let go at its bound (or past its cleanup time): it runs on unwatched
                flight.abandoned = True
                self._store.events.add(ev.SEND_ABANDONED)
            child.add_done_callback(retrieve)  # the cut send's outcome, seen now or when it ends
            failure = TimeoutError()
        elif child.cancelled():
            # Nothing of the node's cancelled the send: a timeout or a lost lease or lock says
            # so above, and the node's own cancellation raises at `await over`. The send raised
            # CancelledError by itself (a library it awaits was cancelled by something else,
            # say): a failed send, for the retry policy. The node goes on.
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                flight.move(FlightState.INTERRUPTED)
                raise asyncio.CancelledError  # the node is being cancelled meanwhile: never swallowed
            failure = _cancelled_error_of(child)
            log.warning(
                "asynccoord.node.send_cancelled_itself node=%s task=%s: the send raised CancelledError "
                "without being cancelled; counted as a failed send",
                self._node_id,
                task.id,
            )
        else:
            failure = child.exception()  # the user's send failed: the retry policy decides
            if failure is None:
                result = child.result()
                failure = None if result is None else _unsent(result)
                if failure is not None:
                    result = None
                if state is FlightState.TIMED_OUT:  # returned while the node waited for it past its cleanup time
                    log.info(
                        "asynccoord.node.send_returned_late node=%s task=%s: the send cut at its timeout returned "
                        "after its cleanup time, its task lease and lock still held; settled as it returned",
                        self._node_id,
                        task.id,
                    )
            elif is_process_exit(failure):  # the process is ending (see asynccoord._exits): no failed send
                flight.move(FlightState.INTERRUPTED)
                raise self._on_exit(carry(failure)) from None  # a group's first exit, as asyncio.TaskGroup raises it
        flight.move(FlightState.RETURNED)
        return True, result, failure, cancel_pending

    def _send_ended(self, flight: Flight, over: asyncio.Future[None], child: asyncio.Task[Any]) -> None:
        """The send task ``child`` of :meth:`run` ended: resolve ``over`` if the send did not
        (a turn handed on, a task cancelled before its first step), then :meth:`cut_send_ended`
        (one done callback, not two: this runs once per task)."""
        _resolve(over)
        self.cut_send_ended(flight, child)

    def cut_send_ended(self, flight: Flight, child: asyncio.Task[Any]) -> None:
        """A send task ended: if it had been cut (timeout, lost lease or lock, the node's
        cancellation) and its cleanup raised ``KeyboardInterrupt`` or ``SystemExit``, stop
        the node for it as if the send had raised it (:meth:`run` no longer reads a cut
        send's outcome)."""
        if flight.cut_until is None or child.cancelled():
            return
        exc = child.exception()
        if exc is not None and is_process_exit(exc):
            self._on_exit(carry(exc), stop=True)  # nothing raises it: stop the pipeline for it

    def _coroutine(self, task: Task, send: SendFn, *, carried: bool = True) -> Coroutine[Any, Any, Any]:
        """The coroutine the send task runs: the user's own one for an ``async def`` send.

        An ``async def`` send is called here (it only makes its coroutine; its body runs in
        the send task, inside :func:`_carrying_exits`, or as it is with ``carried=False``
        for a caller that runs it in :func:`_ending` directly). A call that raises (a send whose
        signature does not take the task, say) is a failed send, raised in the send task as
        any error of the send is. Any other callable goes through :func:`_call_send`. A
        ``KeyboardInterrupt`` or ``SystemExit`` leaves the send task as a
        :class:`~asynccoord._exits.ProcessExiting`, never as itself (which asyncio would let
        out of the event loop at once, before anything is handed back).
        """
        if send is not self._checked_send:  # Node.send is a public attribute: check it again if replaced
            self._checked_send = send
            self._send_is_async = inspect.iscoroutinefunction(send)
        if not self._send_is_async:
            return _call_send(send, task)
        try:
            coro = send(task)
        except BaseException as exc:
            return _raising(exc)
        if asyncio.iscoroutine(coro):
            return _carrying_exits(coro) if carried else coro
        return _awaiting(coro)


def time_out(flight: Flight, overrun_s: float) -> None:
    """The send timeout of ``flight`` (a loop timer): cut its send, unless something cut it already.

    A send that outlives its cleanup time is then still waited for up to ``overrun_s``
    seconds after now (see :func:`cut`).
    """
    child = flight.send
    if flight.state is FlightState.SENDING and flight.cut_until is None and child is not None and not child.done():
        flight.move(FlightState.TIMED_OUT)
        cut(flight, overrun_s=overrun_s)


def lease_ran_out(store: Any, node_id: str, flight: Flight, when: str) -> None:
    """The task lease of ``flight`` reached its local deadline unrenewed ``when`` (before its send began).

    The lease is lost (counted as ``lease_lost``, logged as ``asynccoord.node.lease_ran_out``)
    and the task is never sent on it: the store may hand it to another node from now on.
    A flight lost already (by the keeper, or its lock) is left as it is.

    Args:
        store: The node's store (its ``events`` count the loss).
        node_id: The node's id (for the log).
        flight: The flight, ``CLAIMED`` if not lost already; it moves to ``LEASE_LOST``.
        when: Where the deadline was found passed, for the log (``"before its send"``...).
    """
    if flight.state is not FlightState.CLAIMED:
        return
    flight.lost = f"task lease past its local deadline {when} (no renewal confirmed in time)"
    flight.move(FlightState.LEASE_LOST)
    store.events.add(ev.LEASE_LOST)
    log.warning(
        "asynccoord.node.lease_ran_out node=%s task=%s: not sent (%s)", node_id, flight.task.id, shown(flight.lost)
    )


def lock_lost(flight: Flight, error: LockLostError) -> None:
    """The lock (or permit) of ``flight`` was lost (the watchdog's ``on_lost``): cut its send, unless it is over.

    A send that has ended by itself is settled as usual (a lock's fence decides its commit),
    also when the node has not seen it end yet: its task finishes a loop turn or two before
    :meth:`Sender.run` resumes, and a lost lock reported in that gap must not discard a
    message that went out (a send the node cut is not over by itself).
    """
    if not flight.is_in(
        FlightState.CLAIMED, FlightState.SENDING, FlightState.TIMED_OUT, FlightState.LEASE_LOST, FlightState.LOCK_LOST
    ):
        return  # over: settled by its outcome (or handed back unsent)
    child = flight.send
    if child is not None and child.done() and flight.cut_until is None:
        return  # ended by itself, not seen yet
    flight.lost = f"lock lost: {error}"
    flight.move(FlightState.LOCK_LOST)
    cut(flight)


def cut(flight: Flight, *, overrun_s: float = 0.0) -> None:
    """Cancel the send of ``flight`` (if it runs) once, edge-triggered, as ``Task.cancel`` does.

    The send may still await in its ``except``/``finally`` blocks (closing a connection,
    say) for up to :data:`SEND_CLEANUP_S`; then it is cancelled again (logged as
    ``asynccoord.node.send_abandoned``, or ``send_overran`` when waited for, below) and the
    node goes on without waiting for it (``flight.over`` is resolved). Only the first call
    per send does this: a later one (the timeout, a lost lease or lock, the node's
    cancellation, whichever did not come first) finds ``flight.cut_until`` set and leaves
    the send's cleanup time alone, so a send is cancelled at most twice,
    :data:`SEND_CLEANUP_S` apart.

    A send cut by its timeout (``overrun_s``, from :func:`time_out`) and still ``TIMED_OUT``
    when its cleanup time is up (neither its lease nor its lock lost, the node not
    cancelled) is still waited for: ``flight.over`` is resolved when it ends, or
    ``overrun_s`` after this cut at the latest (``flight.overrun_until``; logged as
    ``asynccoord.node.send_let_go``). Its task lease and lock stay held meanwhile (the
    keeper and the lock's watchdog renew them), so nothing else is sent under the lock,
    and the task is not sent again, while it runs. A later call during that wait (a lost
    lease or lock, the node's cancellation) ends the wait at once.
    """
    child, over = flight.send, flight.over
    if child is None or over is None or child.done():
        return
    if flight.cut_until is not None:
        if flight.overrun_until is not None:  # the node waits for a send that overran its timeout: no more
            _resolve(over)
        return
    loop = asyncio.get_running_loop()
    now = loop.time()
    flight.cut_until = now + SEND_CLEANUP_S
    overrun_until = now + overrun_s
    child.cancel()

    def cut_again() -> None:
        if not child.done():
            child.cancel()
            child.add_done_callback(retrieve)
            if flight.state is FlightState.TIMED_OUT and not over.done() and overrun_until > loop.time():
                # Its lease and lock are still ours, and the node is not cancelled (that cancels
                # `over`): wait for it, so that the next send under its lock (or the task's retry)
                # does not run beside it, up to the bound.
                flight.overrun_until = overrun_until
                log.warning(
                    "asynccoord.node.send_overran task=%s: the send outlived its cleanup time (%.2f s) after "
                    "its timeout cut it; it is cancelled once more, and its task lease and lock are kept "
                    "until it ends, for up to %.2f s more",
                    flight.task.id,
                    SEND_CLEANUP_S,
                    overrun_until - loop.time(),
                )
                bound = loop.call_at(overrun_until, let_go)
                child.add_done_callback(lambda _: bound.cancel())
                return
            # Past its cleanup time: if it swallows this cancellation too, it runs on unwatched,
            # and its task may be sent meanwhile by the next holder of its lease and lock.
            log.warning(
                "asynccoord.node.send_abandoned task=%s: the send outlived its cleanup time (%.2f s) after "
                "being cancelled; it is cancelled once more and left behind",
                flight.task.id,
                SEND_CLEANUP_S,
            )
        _resolve(over)

    def let_go() -> None:
        if flight.state is FlightState.TIMED_OUT and not child.done() and not over.done():
            log.warning(
                "asynccoord.node.send_let_go task=%s: the send still runs %.2f s after its timeout cut it; "
                "the node stops waiting for it: the attempt fails, its task lease and lock are let go, "
                "and it runs on unwatched",
                flight.task.id,
                overrun_s,
            )
        _resolve(over)

    timer = loop.call_at(flight.cut_until, cut_again)
    child.add_done_callback(lambda _: timer.cancel())


async def cut_short(flight: Flight, child: asyncio.Task[Any]) -> None:
    """Cut the send ``child`` of ``flight`` (see :func:`cut`); wait (shielded) until it ends or its cleanup time is up.

    The node's cancel scopes (anyio) are level-triggered: every ``await`` inside a
    cancelled scope is cancelled again, so a send run in the node's own task could not
    await anything in its ``finally``. The send runs as a separate asyncio task that
    receives one ``CancelledError`` and gets its cleanup time before a second one; then
    the caller's cancellation proceeds. A send that its timeout or a lost lease or lock
    cut already is not cancelled again: it keeps the rest of the cleanup time it got
    then (its second cancellation, when that time is up, is :func:`cut`'s). The caller
    cancels the send timeout first. ``flight.over`` is not waited for: the caller's
    cancellation may have cancelled it.
    """
    cut(flight)
    until = flight.cut_until  # None: the send had ended already
    if until is not None:
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(until - asyncio.get_running_loop().time()):
                await asyncio.wait({child})
            await second_cut_landed({child})
    child.add_done_callback(retrieve)


async def second_cut_landed(children: set[asyncio.Task[Any]]) -> None:
    """Give ``children``, sends whose cleanup time is up, two loop turns to end on their second cancellation.

    That cancellation (:func:`cut`'s timer) falls due when the cleanup time does: a send that
    gives in to it ends within a loop turn, and is then seen as over (its task handed back),
    not as one that outlives the node's stop (see :meth:`~asynccoord.node.flight.Flight.outlives`).
    """
    for _ in range(2):
        if all(child.done() for child in children):
            return
        await asyncio.sleep(0)


def _returned_late(flight: Flight, child: asyncio.Task[Any]) -> bool:
    """Whether the send ``child`` of ``flight``, cut at its timeout, returned (no exception) while the
    node still waited for it past its cleanup time (see :func:`cut`): its message went out, and
    the task lease and lock were held throughout, so it is settled as a send that returned."""
    return flight.overrun_until is not None and child.done() and not child.cancelled() and child.exception() is None


def _cancelled_error_of(child: asyncio.Task[Any]) -> asyncio.CancelledError:
    """The ``CancelledError`` that the (cancelled) task ``child`` ended with."""
    try:
        child.result()
    except asyncio.CancelledError as exc:
        return exc
    return asyncio.CancelledError()  # not reached: child is cancelled


async def _ending(
    send: Coroutine[Any, Any, Any],
    over: asyncio.Future[None],
    flight: Flight,
    paused: Callable[[Flight, RateLimited], None],
) -> Any:
    """Run the send's coroutine; as it ends (its result or error is the task's), hand on its lock.

    A send holding a turn on a pooled lock (``flight.turn_end``) ends the turn here: the
    lock's next local turn begins in the next loop turn, its send in the one after, ahead of
    this slot, which resumes then (``over`` resolved by the task's done callback) to commit,
    fenced by the same token (the lease stays in the process until the commit is over: see
    ``Turn.defer``). Without a turn, ``over`` is resolved here, the slot resuming a loop turn
    sooner. A ``KeyboardInterrupt`` or ``SystemExit`` leaves as a
    :class:`~asynccoord._exits.ProcessExiting` (as from :func:`_carrying_exits`). A
    :class:`~asynccoord.errors.RateLimited` is given to ``paused`` before the turn is handed
    on, so the next turn's send finds its lock paused (:mod:`asynccoord.pauses`).
    """
    try:
        return await send
    except PROCESS_EXITS as exc:
        raise ProcessExiting(exc) from None
    except (RateLimited, BaseExceptionGroup) as exc:
        limited = rate_limited_of(exc)
        if limited is not None:
            paused(flight, limited)
        raise
    finally:
        end, flight.turn_end = flight.turn_end, None
        if end is not None:
            end()
        else:
            _resolve(over)


async def _raising(exc: BaseException) -> Any:
    """Raise ``exc`` in the send task (a send whose call raised: see ``Sender._coroutine``)."""
    if isinstance(exc, PROCESS_EXITS):
        raise ProcessExiting(exc) from None
    raise exc


async def _carrying_exits(send: Coroutine[Any, Any, Any]) -> Any:
    """Run an ``async def`` send's coroutine; a ``KeyboardInterrupt`` or ``SystemExit`` from it leaves as a
    :class:`~asynccoord._exits.ProcessExiting` (see :mod:`asynccoord._exits`)."""
    try:
        return await send
    except PROCESS_EXITS as exc:
        raise ProcessExiting(exc) from None


async def _awaiting(outcome: Any) -> Any:
    try:
        return await outcome if inspect.isawaitable(outcome) else outcome
    except PROCESS_EXITS as exc:
        raise ProcessExiting(exc) from None


async def _call_send(send: SendFn, task: Task) -> Any:
    try:
        outcome = send(task)  # an async generator returned is no result: see _unsent
        # A plain (sync) function has already sent when it returns: use its value;
        # awaiting it would fail and send again on retry.
        return await outcome if inspect.isawaitable(outcome) else outcome
    except PROCESS_EXITS as exc:
        raise ProcessExiting(exc) from None


def _unsent(result: Any) -> InvalidTypeError | None:
    """The error of a send that returned an unawaited coroutine or a generator, async or plain (nothing of it ran).

    ``async def send(task): return client.send(task)`` (a missing ``await``): committing it
    would mark a message sent that never was. It is a failed send instead; the coroutine is
    closed (Python would warn that it was never awaited).
    """
    if inspect.iscoroutine(result):
        result.close()
        return InvalidTypeError(f"send returned an unawaited coroutine (a missing await?): {result!r}")
    if inspect.isasyncgen(result):
        return InvalidTypeError(f"send returned an async generator, not a result: {result!r}")
    if inspect.isgenerator(result):
        result.close()
        return InvalidTypeError(f"send returned a generator, not a result: {result!r}")
    return None


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a cancelled send's outcome as seen (no 'exception was never retrieved' warning)."""
    if not task.cancelled():
        task.exception()
