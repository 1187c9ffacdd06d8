"""OpenTelemetry traces of a node's work: one trace per delivery attempt, with spans for its steps.

With the ``otel`` extra (``opentelemetry-api``) installed, a node traces through the global
tracer provider (``trace.get_tracer``), as instrumentation libraries do: its spans are no-ops
until the application configures an SDK, and ``NodeConfig(tracing=False)`` turns them off.
Without the extra (or with ``tracing=False``) the node holds no tracer and its per-task path
makes no call here. The shape follows OpenTelemetry's messaging semantic conventions
(``messaging.*`` attributes, ``messaging.system = "asynccoord"``): a claim is a batch
*receive* (one span per claim, kind CLIENT); each delivery attempt is a *process* span,
``asynccoord.deliver`` (kind CONSUMER), the root of its own trace and linked to the claim
span that leased its task, as the conventions link the processing of each message to a
batch receive, since one claim serves many deliveries; under it ``asynccoord.lock_wait``,
``asynccoord.send`` (current while ``send`` runs, so an instrumented client's spans nest
under it) and ``asynccoord.commit`` (a *settle*, kind CLIENT, one per try). A task leased by
a commit (``claim_next``) links to that commit span. Errors are recorded on the span they
happen in (an exception event, status ERROR), and a failed step sets the delivery's status
to ERROR too. A send that raised :class:`~asynccoord.errors.RateLimited` (a 429, which uses
no attempt) is no error: its send span and delivery carry ``asynccoord.rate_limited`` and
the provider's Retry-After (:data:`RATE_LIMITED`) instead.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from contextlib import AbstractAsyncContextManager
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from .._errtext import error_text
from ..errors import RateLimited
from ..models import Task
from ..pauses import rate_limited_of

if TYPE_CHECKING:
    from ..contract.locks import Lease
    from ..locks.pool import Turn

__all__ = ("RATE_LIMITED", "RETURNED_LATE", "DeliveryTrace", "NodeTracer", "TracedFlight", "node_tracer")

SYSTEM = "asynccoord"
"""``messaging.system`` of every span, and the tracer's instrumentation scope name."""

TIMED_OUT = "timed_out"
"""The ``FlightState`` value of a flight whose send was cut at ``send_timeout_s``."""

CUT = frozenset({"lease_lost", "lock_lost", "dropped", "lock_dropped"})
"""The ``FlightState`` values of a flight whose send the node cut for a lost lease or lock."""

RATE_LIMITED = "asynccoord.rate_limited"
"""The attribute (True) of a send span, and of its delivery, whose send raised
:class:`~asynccoord.errors.RateLimited`; with ``.retry_after_s``, and ``.dimension`` and
``.key`` when the provider named them. Not an error: the spans' status stays unset."""

RETURNED_LATE = "asynccoord.send.returned_late"
"""The attribute (True) of a send span whose send, cut at ``send_timeout_s``, returned while the
node still waited for it (``send_overrun_s``): it was committed, so its status stays unset."""

_UNLOADED: Any = object()
_otel: Any = _UNLOADED  # (opentelemetry.trace, opentelemetry.context) once imported, None when not installed


def _load() -> tuple[ModuleType, ModuleType] | None:
    """``opentelemetry.trace`` and ``opentelemetry.context``, imported on first use; None without the extra."""
    global _otel
    if _otel is _UNLOADED:
        try:
            from opentelemetry import context, trace
        except ImportError:
            _otel = None
        else:
            _otel = (trace, context)
    loaded: tuple[ModuleType, ModuleType] | None = _otel
    return loaded


class TracedFlight(Protocol):
    """What a delivery's trace reads of its :class:`~asynccoord.node.flight.Flight` (no import: flight names us)."""

    @property
    def task(self) -> Task: ...
    @property
    def state(self) -> enum.Enum: ...
    @property
    def chain(self) -> int: ...
    @property
    def lost(self) -> str | None: ...
    @property
    def lock(self) -> Lease | None: ...
    @property
    def next(self) -> TracedFlight | None: ...
    @property
    def overrun_until(self) -> float | None: ...
    @property
    def over(self) -> asyncio.Future[None] | None: ...

    trace: DeliveryTrace | None


def node_tracer(node_id: str, queue: str) -> NodeTracer | None:
    """The tracer of node ``node_id`` draining ``queue``; None when ``opentelemetry-api`` is not installed."""
    otel = _load()
    if otel is None:
        return None
    from .. import __version__

    trace, context = otel
    return NodeTracer(trace, context, trace.get_tracer(SYSTEM, __version__), node_id=node_id, queue=queue)


class NodeTracer:
    """The spans of one node (see the module docstring); made by :func:`node_tracer`.

    Args:
        trace: The ``opentelemetry.trace`` module.
        context: The ``opentelemetry.context`` module.
        tracer: The OpenTelemetry tracer the spans come from.
        node_id: The node's id (``messaging.client.id``).
        queue: The queue it drains (``messaging.destination.name``).
    """

    __slots__ = ("_claim_link", "context", "node_id", "queue", "trace", "tracer")

    def __init__(self, trace: ModuleType, context: ModuleType, tracer: Any, *, node_id: str, queue: str) -> None:
        self.trace = trace
        self.context = context
        self.tracer = tracer
        self.node_id = node_id
        self.queue = queue
        self._claim_link: Any = None  # the span context of the node's last claim, if it is a real span

    def attributes(self, operation: str, kind: str) -> dict[str, Any]:
        """The attributes every span of this node carries, for a ``messaging.operation.name`` and ``.type``."""
        return {
            "messaging.system": SYSTEM,
            "messaging.destination.name": self.queue,
            "messaging.client.id": self.node_id,
            "messaging.operation.name": operation,
            "messaging.operation.type": kind,
        }

    async def claim(self, claiming: Awaitable[list[Task]], limit: int) -> list[Task]:
        """Await ``claiming`` (the node's claim of up to ``limit`` tasks) in an ``asynccoord.claim`` span.

        The span is the root of a trace of its own; :meth:`claimed` links the deliveries of the
        tasks it returns to it (the node claims one batch at a time).
        """
        attributes = self.attributes("claim", "receive")
        attributes["asynccoord.claim.limit"] = limit
        span = self.tracer.start_span(
            "asynccoord.claim", context=self.context.Context(), kind=self.trace.SpanKind.CLIENT, attributes=attributes
        )
        self._claim_link = None
        try:
            tasks = await claiming
            span.set_attribute("messaging.batch.message_count", len(tasks))
        except BaseException as exc:
            failed(self.trace, span, exc)
            raise
        finally:
            span.end()
        link = span.get_span_context()
        if link.is_valid:  # a no-op span (no SDK configured): no delivery is traced either
            self._claim_link = link
        return tasks

    def claimed(self, flights: Iterable[TracedFlight]) -> None:
        """Give each of ``flights`` (leased by the last :meth:`claim`) its delivery's trace, linked to the claim."""
        link = self._claim_link
        if link is not None:
            for flight in flights:
                flight.trace = DeliveryTrace(self, flight, link)


class DeliveryTrace:
    """The trace of one delivery attempt (one :class:`~asynccoord.node.flight.Flight`).

    Args:
        node: The node's tracer.
        flight: The flight it traces.
        link: The span context of the claim (or commit) that leased the task.
    """

    __slots__ = ("_context", "_error", "_flight", "_link", "_node", "_span")

    def __init__(self, node: NodeTracer, flight: TracedFlight, link: Any) -> None:
        self._node = node
        self._flight = flight
        self._link = link
        self._span: Any = None  # asynccoord.deliver, while the delivery runs
        self._context: Any = None  # the OpenTelemetry context whose current span is _span
        self._error: str | None = None  # the first failed step, for the delivery's status

    async def deliver(self, handling: Awaitable[None]) -> None:
        """Await ``handling`` (lock, send, settle of the flight's task) in an ``asynccoord.deliver`` span.

        Raises:
            BaseException: what ``handling`` raised (recorded on the span).
        """
        node, task = self._node, self._flight.task
        trace = node.trace
        attributes = node.attributes("deliver", "process")
        attributes["messaging.message.id"] = str(task.id)
        attributes["messaging.destination.partition.id"] = str(task.partition)
        attributes["asynccoord.partition_key"] = task.partition_key
        attributes["asynccoord.attempt"] = task.attempts
        attributes["asynccoord.chain"] = self._flight.chain
        span = self._span = node.tracer.start_span(
            "asynccoord.deliver",
            context=node.context.Context(),  # the root of its own trace, whatever runs the node
            kind=trace.SpanKind.CONSUMER,
            attributes=attributes,
            links=[trace.Link(self._link)],
        )
        self._context = trace.set_span_in_context(span)
        try:
            await handling
        except BaseException as exc:
            failed(trace, span, exc)
            raise
        else:
            if self._error is not None:  # a step failed (the send, say) and the node went on
                span.set_status(trace.Status(trace.StatusCode.ERROR, self._error))
        finally:
            span.set_attribute("asynccoord.flight.state", self._flight.state.value)
            span.end()

    def lock_turn(self, turn: AbstractAsyncContextManager[Turn], name: str) -> AbstractAsyncContextManager[Turn]:
        """``turn`` (a lock pool's turn on lock ``name``) with its wait in an ``asynccoord.lock_wait`` span."""
        return _TracedTurn(self, turn, name)

    async def lock_acquire(self, acquiring: Awaitable[Lease], name: str) -> Lease:
        """Await ``acquiring`` (a permit of semaphore ``name``) in an ``asynccoord.lock_wait`` span.

        Raises:
            BaseException: what ``acquiring`` raised (e.g. ``LockTimeoutError``; recorded on the span).
        """
        span = self.lock_wait_started(name)
        try:
            lease = await acquiring
        except BaseException as exc:
            self.lock_wait_over(span, None, exc)
            raise
        self.lock_wait_over(span, lease, None)
        return lease

    def lock_wait_started(self, name: str) -> Any:
        """Start the ``asynccoord.lock_wait`` span of a wait for lock ``name``; return it."""
        node = self._node
        return node.tracer.start_span(
            "asynccoord.lock_wait", context=self._context, attributes={"asynccoord.lock.name": name}
        )

    def lock_wait_over(self, span: Any, lease: Lease | None, error: BaseException | None) -> None:
        """End the lock wait ``span``: with the ``lease`` taken (its token also on the delivery), or ``error``."""
        if lease is not None:
            token = lease.fencing_token
            span.set_attribute("asynccoord.lock.fencing_token", token)
            self._span.set_attribute("asynccoord.lock.name", lease.name)
            self._span.set_attribute("asynccoord.lock.fencing_token", token)
        elif error is not None:
            self._step_failed(span, "lock_wait", error)
        span.end()

    async def send(self, sending: Coroutine[Any, Any, Any]) -> Any:
        """Run ``sending`` (the send's coroutine, in the send's own task) in an ``asynccoord.send`` span.

                The span is the current span while the send runs, so spans made inside it (an
                instrumented HTTP client's, say) are its children. A send that raised, timed out or
                was cut (a lost lease or lock, the node's cancellation) leaves it with status ERROR; one
        that raised :class:`~asynccoord.errors.RateLimited` leaves it marked :data:`RATE_LIMITED`,
        and one that returned past its timeout while the node waited for it :data:`RETURNED_LATE`.

                Raises:
                    BaseException: what ``sending`` raised (recorded on the span).
        """
        node = self._node
        span = node.tracer.start_span("asynccoord.send", context=self._context)
        token = node.context.attach(node.trace.set_span_in_context(span, self._context))
        error: BaseException | None = None
        try:
            return await sending
        except BaseException as exc:
            error = exc
            raise
        finally:
            node.context.detach(token)
            self._send_ended(span, error)

    def _send_ended(self, span: Any, error: BaseException | None) -> None:
        """End the send ``span``: cut (by its timeout, a lost lease or lock), raised ``error``, or returned."""
        flight = self._flight
        state = flight.state.value
        waited = flight.overrun_until is not None  # cut at its timeout, then waited for (send_overrun_s)
        if state == TIMED_OUT and error is None and waited and flight.over is not None and not flight.over.done():
            span.set_attribute(RETURNED_LATE, True)  # returned while waited for: committed, no failure
        elif state == TIMED_OUT or (waited and state not in CUT):  # cut, or let go at its bound and ended since
            self._step_failed(span, "send", TimeoutError("send_timeout_s reached: the send was cut"))
        elif state in CUT:
            self._step_failed(span, "send", None, f"cut: {flight.lost}")
        elif isinstance(error, asyncio.CancelledError):
            self._step_failed(span, "send", None, "cancelled")
        elif error is not None:
            limited = rate_limited_of(error)
            if limited is None:
                self._step_failed(span, "send", error)
            else:  # a 429: the task goes back without using an attempt, no failure
                self._rate_limited(span, limited)
        span.end()

    def _rate_limited(self, span: Any, limited: RateLimited) -> None:
        """Mark the send ``span`` and its delivery as rate limited by the provider (status left unset)."""
        attributes: dict[str, Any] = {
            RATE_LIMITED: True,
            f"{RATE_LIMITED}.retry_after_s": limited.retry_after_s,
        }
        if limited.dimension is not None:
            attributes[f"{RATE_LIMITED}.dimension"] = limited.dimension
        if limited.key is not None:
            attributes[f"{RATE_LIMITED}.key"] = limited.key
        span.set_attributes(attributes)
        self._span.set_attributes(attributes)

    async def commit(self, once: Callable[[], Awaitable[None]]) -> None:
        """Await one try of the commit (``once()``) in an ``asynccoord.commit`` span.

        A task the commit leased as well (``claim_next``) gets the trace of its delivery,
        linked to this span.

        Raises:
            BaseException: what the try raised (recorded on the span).
        """
        node, flight = self._node, self._flight
        attributes = node.attributes("commit", "settle")
        attributes["messaging.message.id"] = str(flight.task.id)
        lock = flight.lock
        if lock is not None:
            attributes["asynccoord.lock.fencing_token"] = lock.fencing_token
        span = node.tracer.start_span(
            "asynccoord.commit", context=self._context, kind=node.trace.SpanKind.CLIENT, attributes=attributes
        )
        try:
            await once()
        except BaseException as exc:
            self._step_failed(span, "commit", exc)
            raise
        finally:
            span.end()
        successor = flight.next
        if successor is not None and successor.trace is None:
            successor.trace = DeliveryTrace(node, successor, span.get_span_context())

    def _step_failed(self, span: Any, step: str, exc: BaseException | None, description: str = "") -> None:
        """Record a failed ``step`` on its ``span`` (``exc``, or a ``description``); the delivery fails with it."""
        trace = self._node.trace
        if exc is not None:
            failed(trace, span, exc)
            description = type(exc).__name__
        else:
            span.set_status(trace.Status(trace.StatusCode.ERROR, description))
        if self._error is None:
            self._error = f"{step} failed: {description}"


class _TracedTurn:
    """A lock pool's turn whose wait (its ``__aenter__``) is an ``asynccoord.lock_wait`` span."""

    __slots__ = ("_name", "_trace", "_turn")

    def __init__(self, trace: DeliveryTrace, turn: AbstractAsyncContextManager[Turn], name: str) -> None:
        self._trace = trace
        self._turn = turn
        self._name = name

    async def __aenter__(self) -> Turn:
        span = self._trace.lock_wait_started(self._name)
        try:
            turn = await self._turn.__aenter__()
        except BaseException as exc:
            self._trace.lock_wait_over(span, None, exc)
            raise
        self._trace.lock_wait_over(span, turn.lease, None)
        return turn

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        return await self._turn.__aexit__(exc_type, exc, tb)


def failed(trace: ModuleType, span: Any, exc: BaseException) -> None:
    """Record ``exc`` on ``span`` with status ERROR (a cancellation: the status only, described as such)."""
    if isinstance(exc, asyncio.CancelledError):
        span.set_status(trace.Status(trace.StatusCode.ERROR, "cancelled"))
        return
    span.record_exception(exc)
    span.set_status(trace.Status(trace.StatusCode.ERROR, error_text(exc)))
