"""A claim's tasks that need no lock, handled together by one coroutine instead of one slot each.

The per-task path (``Node._handle``) gives every claimed task an asyncio task of its own, its
slot, that starts the send, waits for it and commits it. Tasks that need no lock (the node has
no ``lock_key``) and no commit-and-continue need nothing of that slot but its bookkeeping: a
:class:`LocklessBatch` starts every send of the claim at once (each still in an asyncio task of
its own, cut as :mod:`asynccoord.node.send` describes), arms one send timeout for all of them,
and as sends return commits those that returned since it last looked in one ``complete_many``
(joined with the node's other commits of the loop turn, :mod:`asynccoord.node.commits`): a
group commit (DeWitt et al., SIGMOD 1984) across the claim's tasks. A send that blocks holds
back no other task: what returned is committed while it runs. A send that failed, and a task
handed back, is settled by an asyncio task of its own, as its slot would settle it.

What the per-task path guarantees holds task by task: a send is cut once (timeout, lost
lease, the node's cancellation) and gets its cleanup time; a send that returned is settled
even when the node is cancelled meanwhile (for up to
:data:`~asynccoord.node.settle.SETTLE_WAIT_S`); a send cut by the node's cancellation is
handed back, counted as interrupted (one still running past its cleanup time is not: its task
lease lapses, see :meth:`~asynccoord.node.settle.Settler.hand_back_all_shielded`); an error that
fails the node (a closed store, a process exit) stops the batch the same way, and is raised once the batch is over.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

import anyio

from .._printable import shown
from ..errors import UNRECOVERABLE_STORE_ERRORS, StoreError
from ..monitor.histogram import SEND_MS
from .flight import Flight, FlightState
from .send import Outcome, Sender, SendFn, cut, observe_many, retrieve, second_cut_landed, time_out
from .settle import SETTLE_WAIT_S, Settler

__all__ = ("LocklessBatch",)

log = logging.getLogger(__name__)


class LocklessBatch:
    """Handles one claim's tasks that need no lock (see the module docstring); :meth:`run` once.

    Args:
        flights: The claim's tasks in flight (``CLAIMED``), none needing a lock, none traced.
        send: The user's send.
        sender: The node's :class:`~asynccoord.node.send.Sender`.
        settler: The node's :class:`~asynccoord.node.settle.Settler` (no commit-and-continue).
        send_timeout_s: ``NodeConfig.send_timeout_s``.
        release: Lets the node go of settled (or handed back) flights: out of its flights in
            flight, their slots free.
    """

    __slots__ = (
        "_cancelled",
        "_errors",
        "_flights",
        "_over",
        "_release",
        "_send",
        "_sender",
        "_sending",
        "_settler",
        "_settling",
        "_started",
        "_timeout_s",
        "_timer",
        "_wake",
    )

    def __init__(
        self,
        flights: list[Flight],
        *,
        send: SendFn,
        sender: Sender,
        settler: Settler,
        send_timeout_s: float,
        release: Callable[[list[Flight]], None],
    ) -> None:
        self._flights = flights
        self._send = send
        self._sender = sender
        self._settler = settler
        self._timeout_s = send_timeout_s
        self._release = release
        self._sending: dict[asyncio.Future[None], Flight] = {}  # by flight.over: sends not over yet
        self._over: list[Flight] = []  # sends over (returned, or cut and past their cleanup time), not looked at
        self._settling: set[asyncio.Task[None]] = set()  # settles running (commits, failures, hand-backs)
        self._errors: list[BaseException] = []  # what failed the batch (raised once it is over)
        self._cancelled = False  # a send raised CancelledError by itself while the batch was cancelled
        self._wake: asyncio.Future[None] | None = None  # while run() waits
        self._timer: asyncio.TimerHandle | None = None
        self._started = 0.0

    async def run(self) -> None:
        """Send, settle and let go of every flight of the batch; return once all are over.

        Raises:
            CancelledError: the node was cancelled (sends that returned were settled, the
                others cut and handed back).
            Exception: what failed the batch (e.g. :class:`~asynccoord.errors.StoreClosedError`),
                once the rest is over as on cancellation (several: an ``ExceptionGroup``).
            ProcessExiting: a send raised ``KeyboardInterrupt`` or ``SystemExit``.
            RuntimeError: a settle ended cancelled although the node was not cancelled (a
                bug: re-raising that ``CancelledError`` would end the node silently).
        """
        loop = asyncio.get_running_loop()
        try:
            self._start(loop)
            while self._sending or self._over or self._settling:
                if self._errors or self._cancelled:
                    break
                if not self._over:
                    wake = self._wake = loop.create_future()
                    try:
                        await wake
                    finally:
                        self._wake = None
                if self._over:
                    self._look_at_over(loop)
        except BaseException:
            await self._stop(loop)
            raise
        if self._errors or self._cancelled:
            await self._stop(loop)
            self._raise()

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start every send (one timeout for all); settle at once those that may not start."""
        sender, send, sending, send_over = self._sender, self._send, self._sending, self._send_over
        self._started = time.perf_counter()
        flights = self._flights
        for i, flight in enumerate(flights):
            try:
                unsent = sender.start(flight, send)
            except BaseException as exc:  # a bug: fail the batch, hand back what was not started
                self._errors.append(exc)
                self._spawn(loop, self._hand_back(flights[i:]))
                break
            if unsent is not None:  # its lease ran out, or was lost: never sent
                self._spawn(loop, self._settle_one(flight, unsent))
                continue
            over = flight.over
            assert over is not None
            sending[over] = flight
            over.add_done_callback(send_over)
        if sending:
            self._timer = loop.call_at(loop.time() + self._timeout_s, self._time_out)

    def _time_out(self) -> None:
        """The send timeout of the batch: cut every send still running (see :func:`~asynccoord.node.send.time_out`)."""
        self._timer = None
        for flight in list(self._sending.values()):
            time_out(flight, self._sender.overrun_s)

    def _send_over(self, over: asyncio.Future[None]) -> None:
        """``flight.over`` is done: the send ended, or was cut and its cleanup time is up."""
        flight = self._sending.pop(over, None)
        if flight is None:
            return  # looked at already (the batch stopped)
        self._over.append(flight)
        if not self._sending and self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._wake_up()

    def _wake_up(self) -> None:
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    def _look_at_over(self, loop: asyncio.AbstractEventLoop) -> None:
        """Take the outcomes of the sends over since the last look: commit the returned ones, settle the rest."""
        over, self._over = self._over, []
        sender, settler = self._sender, self._settler
        commits: list[Flight] = []
        results: list[Any] = []
        sent = 0
        for flight in over:
            child = flight.send
            assert child is not None
            flight.send = flight.over = None
            if flight.cut_until is not None:
                child.add_done_callback(functools.partial(sender.cut_send_ended, flight))
            try:
                outcome = sender.outcome(flight, child, False)
            except asyncio.CancelledError:  # the send cancelled itself while the node is cancelled
                self._cancelled = True
                self._spawn(loop, self._hand_back([flight]))
                continue
            except BaseException as exc:  # ProcessExiting (the flight is interrupted)
                self._errors.append(exc)
                self._spawn(loop, self._hand_back([flight]))
                continue
            completed, result, failure, _ = outcome
            if completed:
                sent += 1
                if failure is None:
                    commits.append(flight)
                    results.append(result)
                    continue
            self._spawn(loop, self._settle_one(flight, outcome))
        if sent:
            observe_many(settler.store, SEND_MS, [(time.perf_counter() - self._started) * 1000.0] * sent)
        if commits:
            self._spawn(loop, self._commit(commits, results))

    def _spawn(self, loop: asyncio.AbstractEventLoop, settle: Coroutine[Any, Any, None]) -> None:
        task = loop.create_task(settle)
        self._settling.add(task)
        task.add_done_callback(self._settled)

    def _settled(self, task: asyncio.Task[None]) -> None:
        self._settling.discard(task)
        if task.cancelled():
            if not self._errors:
                self._cancelled = True  # cancelled by someone else than the batch: it is being torn down
        elif (error := task.exception()) is not None:
            self._errors.append(error)
        self._wake_up()

    async def _commit(self, flights: list[Flight], results: list[Any]) -> None:
        """Commit the sends that returned (see :meth:`Settler.commit_many`); hand back what cannot be settled."""
        try:
            await self._settler.commit_many(flights, results)
        except UNRECOVERABLE_STORE_ERRORS:
            await self._hand_back(flights, release=False)  # the store is closed: as the store allows
            raise
        except StoreError as exc:
            log.warning(
                "asynccoord.node.store_error node=%s tasks=%s error=%s",
                self._settler.node_id,
                [f.task.id for f in flights],
                shown(exc),
            )
            await self._hand_back(flights, release=False)
        except BaseException:
            await self._hand_back(flights, release=False)
            raise
        finally:
            self._release(flights)

    async def _settle_one(self, flight: Flight, outcome: Outcome) -> None:
        """Settle one send that did not return a result (a failure), or a task never sent, as its slot would."""
        settler = self._settler
        try:
            await settler.finish(flight, outcome)
        except UNRECOVERABLE_STORE_ERRORS:
            await settler.hand_back_shielded(flight)
            raise
        except StoreError as exc:
            log.warning(
                "asynccoord.node.store_error node=%s task=%s error=%s", settler.node_id, flight.task.id, shown(exc)
            )
            await settler.hand_back_shielded(flight)
        except BaseException:
            await settler.hand_back_shielded(flight)
            raise
        finally:
            self._release([flight])

    async def _hand_back(self, flights: list[Flight], *, release: bool = True) -> None:
        """Hand back (shielded, all at once) the tasks of ``flights`` not settled; with ``release`` let go of them."""
        try:
            await self._settler.hand_back_all_shielded(flights)
        finally:
            if release:
                self._release(flights)

    async def _stop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Stop the batch (the node is cancelled, or something failed it): shielded, as ``Node._handle_batch`` does.

        Sends that returned are settled; the others are cut once (each gets its cleanup
        time, see :func:`~asynccoord.node.send.cut_short`) and handed back as interrupted;
        settles running may finish for up to :data:`SETTLE_WAIT_S`, then they are cancelled
        (and hand their tasks back).
        """
        with anyio.CancelScope(shield=True):
            if self._timer is not None:
                self._timer.cancel()  # no timeout may cut the cleanup time short
                self._timer = None
            returned: list[Flight] = []
            cutting: list[Flight] = []
            for over, flight in list(self._sending.items()):
                child = flight.send
                assert child is not None
                if over.done() or (child.done() and not child.cancelled() and flight.cut_until is None):
                    returned.append(flight)  # over by itself: settled first (handing it back would send it again)
                else:
                    cutting.append(flight)
            self._sending.clear()
            self._over += returned
            if self._over:
                self._look_at_over(loop)
            for flight in cutting:
                cut(flight)
                if flight.over is not None:  # the batch stops: a send cut at its timeout is not
                    flight.over.cancel()  # waited for past its cleanup time (see cut)
            children = {f.send for f in cutting if f.send is not None and not f.send.done()}
            until = max((f.cut_until for f in cutting if f.cut_until is not None), default=None)
            if children and until is not None:
                with anyio.move_on_after(until - loop.time()):
                    await asyncio.wait(children)
                await second_cut_landed(children)
            for flight in cutting:
                child = flight.send
                if child is not None:  # a cleanup that raised KeyboardInterrupt or SystemExit stops the node
                    child.add_done_callback(functools.partial(self._sender.cut_send_ended, flight))
                    child.add_done_callback(retrieve)
                    if child.done():
                        flight.send = None  # else kept: it outlives the stop (see Flight.outlives)
                flight.over = None
                flight.move(FlightState.INTERRUPTED)
            if cutting:
                await self._hand_back(cutting)
            if self._settling:
                _, late = await asyncio.wait(set(self._settling), timeout=SETTLE_WAIT_S)
                for task in late:
                    task.cancel()
                if late:
                    await asyncio.wait(late)

    def _raise(self) -> None:
        errors = self._errors
        if len(errors) == 1:
            raise errors[0]
        if errors:
            raise BaseExceptionGroup("errors handling a claim's tasks", errors)
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise asyncio.CancelledError  # the node is being cancelled: never swallowed
        raise RuntimeError(  # a bug: re-raising the CancelledError would end the node silently
            f"node {self._settler.node_id!r}: a settle of the tasks {[f.task.id for f in self._flights]} "
            "ended cancelled although the node was not cancelled"
        )
