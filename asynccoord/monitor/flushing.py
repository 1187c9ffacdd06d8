"""The flushes of a :class:`~asynccoord.monitor.monitor.Monitor`: this process's counters, added to the store's.

:class:`MonitorFlush` is a mixin of the monitor. A flush takes the deltas of the process's
event counters (its store's, its lock store's, and the nodes' tracked with
:meth:`MonitorFlush.track`) and of its latency histograms since the last write, and adds them
to the store in one batched write with the stored alert state, so every process sees totals
and rates over all processes. The counters only ever count up: a delta is a counter's value
less the value the last successful write covered, so a failed write's deltas go with the
next. A flush with nothing new is skipped unless a keepalive write is due. The write runs as
a task of its own, so a flush cancelled mid-write still learns whether it committed, and no
delta is sent twice or lost.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import anyio

from ..contract.monitor import PROCESS_SCOPE, Alert, MetricsFlush
from ..errors import InvalidTypeError
from ..events import EventCounter
from ..validation import check_bool, check_name
from .histogram import Histogram
from .outage import OutageWatch

__all__ = ("MonitorFlush",)

_CANCELLED_WRITE_WAIT_S = 5.0
"""How long a cancelled flush waits for its write's outcome, seconds."""


def _retrieve(call: asyncio.Future[Any]) -> None:
    """Done-callback of a call nobody awaits any more: read its outcome, so asyncio reports no lost error."""
    if not call.cancelled():
        call.exception()


class MonitorFlush:
    """The flushes of a :class:`~asynccoord.monitor.monitor.Monitor`: its counters' deltas, written to the store.

    A mixin: it relies on the monitor's settings, its outage watch (``_outage``) and
    ``_stored_alerts``, ``_store_failed`` and ``_store_reached``.
    """

    store: Any
    lock_store: Any
    process_id: str
    info: dict[str, Any]
    alert_ttl_s: float
    retention_s: float
    _outage: OutageWatch
    _flush_lock: asyncio.Lock
    _tracked: dict[str, EventCounter]
    _sent_events: dict[tuple[str, str], int]
    _sent_latency: dict[str, Histogram]
    _alerts_dirty: bool
    _last_write_monotonic: float
    _refresh_s: float
    _stopping: bool
    _flushes: int
    _flush_failures: int

    if TYPE_CHECKING:

        def _stored_alerts(self) -> list[Alert]: ...

        def _store_failed(self, kind: str, exc: BaseException) -> None: ...

        def _store_reached(self, kind: str, store_now_s: float) -> None: ...

    def track(self, scope: str, counter: EventCounter) -> None:
        """Also flush ``counter`` as the per-node breakdown ``scope`` (a node id).

        Node-scope counters are a breakdown: they are never added to the process
        totals, and rules with ``scope="node"`` evaluate them per node.

        Raises:
            InvalidArgumentError, InvalidTypeError: a bad ``scope`` or ``counter``.
        """
        check_name("scope", scope)
        if not isinstance(counter, EventCounter):
            raise InvalidTypeError(f"counter must be an EventCounter, got {type(counter).__name__}")
        self._tracked[scope] = counter

    async def flush(self, *, force: bool = False) -> float | None:
        """Write the counter and histogram deltas since the last flush (and the alert state).

        Skips the write when nothing changed and the last write is recent (under 10 s),
        unless ``force``. Deltas that fail to write are kept for the next flush.

        Args:
            force: Write even when nothing changed (a bool). Default False.

        Returns:
            The store clock of the write, or None when skipped.

        Raises:
            InvalidTypeError: ``force`` is not a bool.
            StoreError: the write failed (the monitor's loop logs it and goes on).
        """
        check_bool("force", force)
        async with self._flush_lock:
            counters: dict[tuple[str, str], int] = {}
            seen: dict[tuple[str, str], int] = {}
            totals = dict(self.store.events.snapshot())
            if self.lock_store is not None:  # one process total: both only ever count up
                for name, value in self.lock_store.events.snapshot().items():
                    totals[name] = totals.get(name, 0) + value
            sources = [(PROCESS_SCOPE, totals), *((k, c.snapshot()) for k, c in self._tracked.items())]
            for scope, snapshot in sources:
                for name, value in snapshot.items():
                    key = (scope, name)
                    seen[key] = value
                    delta = value - self._sent_events.get(key, 0)
                    if delta > 0:
                        counters[key] = delta
            recorder = getattr(self.store, "latencies", None)
            histograms: dict[str, Histogram] = recorder.snapshot() if recorder is not None else {}
            latencies = {}
            for name, hist in histograms.items():
                previous = self._sent_latency.get(name)
                delta_hist = hist if previous is None else hist - previous
                if delta_hist.count:
                    latencies[name] = delta_hist
            loop = asyncio.get_running_loop()
            refresh_due = loop.time() - self._last_write_monotonic >= self._refresh_s
            if not (force or counters or latencies or self._alerts_dirty or refresh_due):
                return None
            dirty = self._alerts_dirty
            batch = MetricsFlush(
                process_id=self.process_id,
                counters=counters,
                latencies=latencies,
                alerts=self._stored_alerts(),
                alert_ttl_s=self.alert_ttl_s,
                retention_s=self.retention_s,
                info={**self.info, "stopped": True} if self._stopping else self.info,
            )
            self._alerts_dirty = False
            # The write runs as a task of its own: a flush cancelled mid-write (e.g. by
            # close()) must still learn whether the write committed, or its deltas would
            # be sent twice (committed, yet kept for the next flush) or lost.
            write = asyncio.ensure_future(self.store.flush_metrics(batch))
            try:
                with self._outage.call("write"):
                    at = float(await asyncio.shield(write))
            except asyncio.CancelledError:
                with anyio.CancelScope(shield=True), anyio.move_on_after(_CANCELLED_WRITE_WAIT_S):
                    await asyncio.wait({write})
                if write.done() and not write.cancelled() and write.exception() is None:
                    self._mark_sent(seen, histograms, loop.time())
                else:
                    write.add_done_callback(_retrieve)  # it goes on unawaited: its error is counted already
                    self._alerts_dirty = self._alerts_dirty or dirty
                    self._flush_failures += 1
                raise
            except BaseException as exc:
                self._alerts_dirty = self._alerts_dirty or dirty
                self._flush_failures += 1
                self._store_failed("write", exc)
                raise
            self._mark_sent(seen, histograms, loop.time())
            self._store_reached("write", at)
            return at

    def _mark_sent(self, seen: dict[tuple[str, str], int], histograms: dict[str, Histogram], now: float) -> None:
        self._sent_events.update(seen)
        self._sent_latency.update(histograms)
        self._last_write_monotonic = now
        self._flushes += 1
