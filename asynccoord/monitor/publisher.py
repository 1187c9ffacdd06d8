"""Publishing a monitor's notices: the log line, the subscribers' buffers and the sinks.

A :class:`Publisher` is the delivery half of a :class:`~asynccoord.monitor.monitor.Monitor`:
the monitor decides which notices there are, the publisher hands each one to everyone who
listens, without ever waiting. It logs the notice (``asynccoord.monitor.alert_firing`` or
``alert_resolved`` at WARNING; a muted one as ``alert_muted`` at INFO and nothing else),
appends it to each subscriber's bounded buffer (:mod:`asynccoord.monitor.alerts`) and offers
it to each sink, whose own task delivers it. It owns the life of the callbacks' tasks and of
the sinks: started and closed with the monitor, a close giving each sink a bounded time to
deliver what it holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

import anyio

from .._errtext import error_text
from .._printable import printable
from ..contract.monitor import Alert
from ..errors import InvalidTypeError
from ..validation import check_int, check_positive
from .alerts import AlertCallback, AlertSink, AlertStream, Mailbox, Subscription, deliver

__all__ = ("Publisher", "check_sinks")

log = logging.getLogger("asynccoord.monitor.monitor")  # the notices' log lines keep the monitor's logger

_SINK_CLOSE_S = 5.0
"""How long a closing publisher lets each sink deliver what it holds, seconds."""


def check_sinks(sinks: object) -> tuple[AlertSink, ...]:
    """``sinks`` as a tuple of alert sinks.

    Raises:
        InvalidTypeError: ``sinks`` is not a sequence of objects with ``start``, ``offer`` and ``aclose``.
    """
    chosen = tuple(sinks) if isinstance(sinks, Sequence) and not isinstance(sinks, str) else None
    if chosen is None or not all(
        callable(getattr(sink, name, None)) for sink in chosen for name in ("start", "offer", "aclose")
    ):
        raise InvalidTypeError(f"sinks must be a sequence of alert sinks (start, offer, aclose), got {sinks!r}")
    return chosen


class Publisher:
    """Hands every notice to the log, the subscribers and the sinks of one monitor.

    Args:
        process_id: The monitor's process id, named in log lines.
        sinks: Checked alert sinks (:func:`check_sinks`).
        buffer_size: Notices buffered per subscriber by default (>= 1).
        callback_timeout_s: Longest one callback call may take by default (> 0).
        log_alerts: Log each notice.
    """

    def __init__(
        self,
        process_id: str,
        sinks: tuple[AlertSink, ...],
        *,
        buffer_size: int,
        callback_timeout_s: float,
        log_alerts: bool,
    ) -> None:
        self.process_id = process_id
        self.sinks = sinks
        self.buffer_size = buffer_size
        self.callback_timeout_s = callback_timeout_s
        self.log_alerts = log_alerts
        self._mailboxes: list[Mailbox] = []
        self._subscriptions: list[Subscription] = []
        self._dropped_retired = 0  # dropped by mailboxes no longer registered
        self._running = False
        self._closed_once = False

    # --- life cycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Start the sinks and the callbacks' tasks."""
        self._running = True
        for sink in self.sinks:
            await sink.start()
        for sub in self._subscriptions:
            self._start_worker(sub)

    async def aclose(self) -> None:
        """End every stream, stop the callbacks' tasks, and close the sinks (each up to 5 s, shielded).

        A sink's exception is logged, never raised; a cancellation of the close is raised
        once the sinks closed.
        """
        self._running = False
        self._closed_once = True
        for mailbox in list(self._mailboxes):
            self._unregister(mailbox)
            mailbox.close()
        for sub in self._subscriptions:
            if sub._task is not None:
                sub._task.cancel()
        for sub in self._subscriptions:
            if sub._task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await sub._task
                sub._task = None
        if not self.sinks:
            return
        with anyio.CancelScope(shield=True):
            outcomes = await asyncio.gather(
                *(sink.aclose(timeout_s=_SINK_CLOSE_S) for sink in self.sinks), return_exceptions=True
            )
        for sink, outcome in zip(self.sinks, outcomes, strict=True):
            if isinstance(outcome, Exception):  # a sink's bug must not escape the close
                log.warning(
                    "asynccoord.monitor.sink_failed process=%s sink=%r error=%s",
                    self.process_id,
                    sink,
                    printable(error_text(outcome)),
                )
            elif isinstance(outcome, BaseException):
                raise outcome

    # --- publishing -----------------------------------------------------------------------

    def publish(self, alert: Alert) -> None:
        """Log ``alert`` and hand it to every subscriber and sink, without waiting.

        A muted notice (``alert.inhibited_by`` set) is only logged, at INFO.
        """
        if alert.muted:  # a consequence of another incident: noted at INFO, never delivered
            if self.log_alerts:
                log.info(
                    "asynccoord.monitor.alert_muted rule=%s state=%s scope=%s key=%s inhibited_by=%s",
                    alert.rule,
                    alert.state.value,
                    alert.scope.value,
                    alert.scope_key or "-",
                    alert.inhibited_by,
                )
            return
        if self.log_alerts:
            name = "alert_firing" if alert.firing else "alert_resolved"
            log.warning(
                "asynccoord.monitor.%s rule=%s event=%s scope=%s key=%s value=%.6g threshold=%.6g window_s=%g "
                "count=%d base=%s",
                name,
                alert.rule,
                alert.event,
                alert.scope.value,
                alert.scope_key or "-",
                alert.value,
                alert.threshold,
                alert.window_s,
                alert.count,
                "-" if alert.base is None else alert.base,
            )
        for mailbox in list(self._mailboxes):
            mailbox.put(alert)
        for sink in self.sinks:
            try:
                sink.offer(alert)
            except Exception as exc:  # a sink's bug must not stop the evaluation
                log.warning(
                    "asynccoord.monitor.sink_failed process=%s sink=%r error=%s",
                    self.process_id,
                    sink,
                    printable(error_text(exc)),
                )

    def alerts(self, *, buffer: int | None = None) -> AlertStream:
        """A new stream of the notices published from now on; see :meth:`Monitor.alerts`.

        Raises:
            InvalidArgumentError: ``buffer`` < 1.
        """
        size = self.buffer_size if buffer is None else check_int("buffer", buffer, minimum=1)
        mailbox = Mailbox(size)
        if self._closed_once and not self._running:
            mailbox.close()  # closed: the stream ends at once
        else:
            self._mailboxes.append(mailbox)
        return AlertStream(mailbox, self._unregister)

    def subscribe(
        self, callback: AlertCallback, *, buffer: int | None = None, timeout_s: float | None = None
    ) -> Subscription:
        """Call ``callback`` for every notice in a task of its own; see :meth:`Monitor.subscribe`.

        Raises:
            InvalidTypeError: ``callback`` is not callable.
            InvalidArgumentError: ``buffer`` < 1 or ``timeout_s`` not > 0.
        """
        if not callable(callback):
            raise InvalidTypeError(f"callback must be callable, got {type(callback).__name__}")
        size = self.buffer_size if buffer is None else check_int("buffer", buffer, minimum=1)
        timeout = self.callback_timeout_s if timeout_s is None else check_positive("timeout_s", timeout_s)
        mailbox = Mailbox(size)
        sub = Subscription(callback=callback, timeout_s=timeout, _mailbox=mailbox, _detach=self._unregister)
        self._mailboxes.append(mailbox)
        self._subscriptions.append(sub)
        if self._running:
            self._start_worker(sub)
        return sub

    def _start_worker(self, sub: Subscription) -> None:
        if sub._task is None:
            sub._task = asyncio.get_running_loop().create_task(
                deliver(sub, self.process_id), name="asynccoord-monitor-subscriber"
            )

    def _unregister(self, mailbox: Mailbox) -> None:
        if mailbox in self._mailboxes:
            self._mailboxes.remove(mailbox)
            self._dropped_retired += mailbox.dropped

    # --- counters -------------------------------------------------------------------------

    @property
    def dropped(self) -> int:
        """Notices dropped by full buffers, of streams and subscriptions present and past."""
        return self._dropped_retired + sum(m.dropped for m in self._mailboxes)

    @property
    def subscribers(self) -> int:
        """Streams and subscriptions registered now."""
        return len(self._mailboxes)

    @property
    def callback_failures(self) -> int:
        """Callback calls that raised or timed out."""
        return sum(s.failures for s in self._subscriptions)

    @property
    def sink_failures(self) -> int:
        """Notices the sinks gave up on."""
        return sum(sink.statistics().given_up for sink in self.sinks)

    @property
    def sink_dropped(self) -> int:
        """Notices the sinks dropped unsent."""
        return sum(sink.statistics().dropped for sink in self.sinks)
