"""Alert delivery: bounded per-subscriber buffers, async iteration and callbacks.

Publishing a notice only appends it to one bounded buffer per subscriber (a
:class:`Mailbox`; when full, the oldest notice is dropped and counted), so delivery
never blocks the monitor, let alone the nodes. An :class:`AlertStream` iterates its
buffer; a :class:`Subscription` has a task of its own (:func:`deliver`) that calls its
callback under a timeout, so a slow, stuck or failing subscriber loses only its own
notices.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .._errtext import error_text
from .._printable import printable
from ..contract.monitor import Alert

__all__ = ("AlertCallback", "AlertSink", "AlertStream", "Mailbox", "SinkStats", "Subscription", "deliver")

log = logging.getLogger(__name__)

AlertCallback = Callable[[Alert], Awaitable[Any] | None]
"""A subscriber: ``async def on_alert(alert: Alert) -> None`` (a plain function is accepted too)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SinkStats:
    """Counters of one alert sink (e.g. :class:`~asynccoord.monitor.webhook.WebhookSink`).

    Attributes:
        delivered: Notices the destination accepted.
        failed_attempts: Attempts to deliver that failed (each retry counts).
        given_up: Notices not delivered after every attempt, or refused outright.
        dropped: Notices dropped unsent: the sink's queue was full, or it closed first.
        queued: Notices waiting now (the one being sent included).
    """

    delivered: int
    failed_attempts: int
    given_up: int
    dropped: int
    queued: int

    @property
    def failures(self) -> int:
        """Notices that did not reach the destination: ``given_up + dropped``."""
        return self.given_up + self.dropped


class AlertSink(Protocol):
    """A destination a :class:`~asynccoord.monitor.monitor.Monitor` hands every notice to.

    :meth:`offer` must return at once (queue the notice, never wait for I/O): it runs on
    the monitor's evaluation path. The monitor calls :meth:`start` when it starts and
    :meth:`aclose` when it closes.
    """

    async def start(self) -> None:
        """Get ready to deliver (open connections, start a task)."""

    def offer(self, alert: Alert) -> None:
        """Queue ``alert`` for delivery; never blocks."""

    async def aclose(self, timeout_s: float = 5.0) -> None:
        """Deliver what is queued for at most ``timeout_s`` seconds, then stop."""

    def statistics(self) -> SinkStats:
        """The sink's counters."""


class Mailbox:
    """A bounded buffer of notices for one subscriber; full means drop the oldest."""

    __slots__ = ("_closed", "_items", "_wake", "dropped", "maxlen")

    def __init__(self, maxlen: int) -> None:
        self.maxlen = maxlen
        self._items: deque[Alert] = deque()
        self._wake = asyncio.Event()
        self._closed = False
        self.dropped = 0

    def put(self, alert: Alert) -> bool:
        """Append ``alert``; False when the oldest notice had to be dropped for it."""
        if self._closed:
            return True
        kept = True
        if len(self._items) >= self.maxlen:
            self._items.popleft()
            self.dropped += 1
            kept = False
        self._items.append(alert)
        self._wake.set()
        return kept

    def close(self) -> None:
        self._closed = True
        self._wake.set()

    async def get(self) -> Alert | None:
        """The next notice, or None once closed and empty."""
        while not self._items:
            if self._closed:
                return None
            self._wake.clear()
            await self._wake.wait()
        return self._items.popleft()


class AlertStream:
    """An async iterator over a monitor's notices (``async for alert in monitor.alerts()``).

    It buffers up to ``buffer`` notices; when full the oldest is dropped and counted
    (:attr:`dropped`). It ends when the monitor closes or :meth:`close` is called.
    """

    def __init__(self, mailbox: Mailbox, detach: Callable[[Mailbox], None]) -> None:
        self._mailbox = mailbox
        self._detach = detach

    @property
    def dropped(self) -> int:
        """Notices dropped because this stream's buffer was full."""
        return self._mailbox.dropped

    def close(self) -> None:
        """Stop receiving; iteration ends after the buffered notices."""
        self._detach(self._mailbox)
        self._mailbox.close()

    def __aiter__(self) -> AsyncIterator[Alert]:
        return self

    async def __anext__(self) -> Alert:
        alert = await self._mailbox.get()
        if alert is None:
            raise StopAsyncIteration
        return alert

    def __repr__(self) -> str:
        return f"<AlertStream buffered={len(self._mailbox._items)} dropped={self.dropped}>"


@dataclass(eq=False)
class Subscription:
    """A registered callback; :meth:`cancel` unsubscribes it.

    Attributes:
        callback: The async callback.
        timeout_s: Longest one call may take before it is cancelled and counted as failed.
        calls: Calls made. failures: Calls that raised or timed out.
    """

    callback: AlertCallback
    timeout_s: float
    _mailbox: Mailbox
    _detach: Callable[[Mailbox], None]
    calls: int = 0
    failures: int = 0
    _task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def dropped(self) -> int:
        """Notices dropped because the callback fell behind (its buffer was full)."""
        return self._mailbox.dropped

    def cancel(self) -> None:
        """Unsubscribe: no further notices are delivered; a running call is cancelled."""
        self._detach(self._mailbox)
        self._mailbox.close()
        if self._task is not None:
            self._task.cancel()


async def deliver(sub: Subscription, process_id: str) -> None:
    """Call ``sub.callback`` for each notice of its buffer until the buffer is closed.

    A call that raises or exceeds ``sub.timeout_s`` is logged
    (``asynccoord.monitor.subscriber_failed``) and counted in ``sub.failures``; the next
    notice is delivered all the same.

    Args:
        sub: The subscription.
        process_id: The monitor's process id, for the log line.
    """
    while True:
        alert = await sub._mailbox.get()
        if alert is None:
            return
        sub.calls += 1
        try:
            async with asyncio.timeout(sub.timeout_s):
                outcome = sub.callback(alert)
                if inspect.isawaitable(outcome):  # a plain function has already run
                    await outcome
        except TimeoutError:
            sub.failures += 1
            log.warning(
                "asynccoord.monitor.subscriber_failed process=%s callback=%r rule=%s error=timeout after %gs",
                process_id,
                sub.callback,
                alert.rule,
                sub.timeout_s,
            )
        except Exception as exc:
            sub.failures += 1
            log.warning(
                "asynccoord.monitor.subscriber_failed process=%s callback=%r rule=%s error=%s",
                process_id,
                sub.callback,
                alert.rule,
                printable(error_text(exc)),  # the user's exception: its __str__ may raise
            )
