"""The queues' state for the Prometheus export: read from the store at scrape time, cached.

A :class:`QueueGauges` holds the last reading of one store: per queue its pending, running
and dead tasks and the age of its oldest due pending task
(:meth:`~asynccoord.contract.monitor.MonitorStore.queue_backlogs`), and the live nodes by
the queue their heartbeat names (:meth:`~asynccoord.contract.membership.MembershipStore.members`).
Both are cluster-wide values on the store's clock: every process exporting them reports
the same numbers.

How a scrape gets them, and why. ``prometheus_client`` calls the collector on a thread of
its HTTP server, while the store lives on the event loop. :meth:`QueueGauges.current`,
called there, hands a read to the loop (``asyncio.run_coroutine_threadsafe``) when the last
one is older than ``refresh_s`` and none is in flight, waits for it at most ``wait_s``,
then returns whatever reading it holds. A scrape on the loop's own thread (an ASGI app such
as ``prometheus_client.make_asgi_app`` in the application that hosts the nodes) starts the
read the same way but cannot wait for it: it serves the last reading. So:

* the loop is never blocked: the read is an ordinary coroutine among the nodes' own;
* a scrape waits at most ``wait_s`` (on its own thread), however slow the store;
* at most one read is in flight and at most one starts per ``refresh_s``, however many
  scrapers there are, and none runs while no one scrapes (no background task to start
  or stop, unlike a refresh on the monitor's interval, which would read every second);
* each read costs a few index seeks: the pending, running and dead tasks are counted in
  their partial indexes, never by a scan of the done tasks a queue keeps
  (:meth:`~asynccoord.contract.queue.QueueStore.stats` counts them too, in their index,
  which holds SQLite's one connection, and so the nodes, for as long as the walk takes).

A failed or timed-out read leaves the last values in place, marked: ``ok`` is False until a
read succeeds again, and a reading older than ``stale_after_s`` is no longer served (and
``ok`` is False with it while a read that started before they went stale still hangs).
Values that aged only because no scrape came, as between scrapes on the loop's thread spaced
more than ``stale_after_s`` apart, are still served, with their age: the store answered.

Which queues: those named, plus those this process's runtimes drain, found in the live
nodes' heartbeats (a :class:`~asynccoord.node.runtime.Runtime`'s nodes announce their
``queue``, ``host`` and ``pid``). A queue once found stays read, so its backlog is still
exported after its nodes die; name the queues you alert on, so they are exported from the
first scrape on, and from a process that only enqueues.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._errtext import error_text
from ..contract.monitor import QueueBacklog, check_backlog_queues
from ..errors import InvalidArgumentError, InvalidTypeError
from ..validation import check_positive

__all__ = ("REFRESH_S", "STALE_AFTER_S", "WAIT_S", "GaugeReading", "QueueGauges")

log = logging.getLogger(__name__)

REFRESH_S = 10.0
"""Default seconds a reading is served before a scrape asks for a new one."""
WAIT_S = 1.0
"""Default longest wait of a scrape for the read it started, seconds."""
STALE_AFTER_S = 60.0
"""Default age past which a reading is no longer served, seconds; also the longest a read may run."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GaugeReading:
    """One read of a store's queues and members.

    Attributes:
        backlogs: One :class:`~asynccoord.contract.monitor.QueueBacklog` per queue read, in order.
        live_nodes: Queue -> live nodes whose heartbeat names it; every queue read is
            present (0 when none), and ``""`` counts the live nodes that name no queue.
        read_at: ``time.monotonic()`` when the read completed.
    """

    backlogs: tuple[QueueBacklog, ...]
    live_nodes: Mapping[str, int]
    read_at: float

    def age_s(self) -> float:
        """Seconds since the read completed."""
        return max(0.0, time.monotonic() - self.read_at)


class QueueGauges:
    """The cached queue gauges of one store (see the module docstring for how a scrape reads them).

    Build it on the event loop the store runs on: it keeps that loop, to hand reads to it.

    Args:
        store: An open store with ``queue_backlogs`` and ``members`` (any backend, read-only
            SQLite included).
        queues: Queue names always read (a list or tuple; may be empty). The queues of this
            process's runtimes are added as their nodes' heartbeats show them.
        refresh_s: Seconds a reading is served before a scrape asks for a new one. Default 10.
        wait_s: Longest a scrape waits for the read it started, seconds. Default 1.
        stale_after_s: Past this age (seconds) a reading is not served, and a read still
            running is abandoned. Default 60; at least ``refresh_s``.

    Raises:
        InvalidTypeError: ``store`` lacks ``queue_backlogs`` or ``members``, or bad ``queues``.
        InvalidArgumentError: a bad queue name or duration, or no running event loop.
    """

    def __init__(
        self,
        store: Any,
        queues: Sequence[str] = (),
        *,
        refresh_s: float = REFRESH_S,
        wait_s: float = WAIT_S,
        stale_after_s: float = STALE_AFTER_S,
    ) -> None:
        for method in ("queue_backlogs", "members"):
            if not callable(getattr(store, method, None)):
                raise InvalidTypeError(
                    f"queue gauges need a store with '{method}' (MonitorStore and MembershipStore),"
                    f" got {type(store).__name__}"
                )
        self.named = check_backlog_queues(queues)
        self.refresh_s = check_positive("refresh_s", refresh_s)
        self.wait_s = check_positive("wait_s", wait_s)
        self.stale_after_s = check_positive("stale_after_s", stale_after_s)
        if self.stale_after_s < self.refresh_s:
            raise InvalidArgumentError(
                f"stale_after_s={stale_after_s!r} < refresh_s={refresh_s!r}: every reading would go stale"
                " before the next read; raise stale_after_s"
            )
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            raise InvalidArgumentError(
                "queue gauges read the store on its event loop: create them (register_collector(...,"
                " queues=...)) from a coroutine running on the loop the store was opened on"
            ) from None
        self.store = store
        self._host = socket.gethostname()
        self._pid = os.getpid()
        self._found: dict[str, None] = {}  # this process's runtimes' queues, in order of discovery
        self._lock = threading.RLock()  # reentrant: a read done already runs its callback in _start
        self._reading: GaugeReading | None = None
        self._ok = False
        self._inflight: concurrent.futures.Future[None] | None = None
        self._started_at = -float("inf")  # monotonic start of the last read handed to the loop
        self.reads = 0
        """Reads started."""
        self.failures = 0
        """Reads that failed or timed out."""

    def __repr__(self) -> str:
        return f"<QueueGauges queues={list(self.queues())!r} ok={self._ok} reads={self.reads}>"

    def queues(self) -> tuple[str, ...]:
        """The queues read: those named, then those found in this process's nodes' heartbeats."""
        with self._lock:
            found = tuple(self._found)
        return (*self.named, *(q for q in found if q not in self.named))

    async def read(self) -> GaugeReading:
        """Read the live members (finding this process's runtimes' queues), then the backlogs of :meth:`queues`.

        The reading is cached for the scrapes, and returned.

        Raises:
            StoreError: a read failed (the cached reading is kept, ``ok`` becomes False).
        """
        try:
            members = await self.store.members()
            live: dict[str, int] = {}
            for member in members:
                info = member.info if isinstance(member.info, Mapping) else {}
                queue = info.get("queue")
                name = queue if isinstance(queue, str) else ""
                live[name] = live.get(name, 0) + 1
                if name and info.get("pid") == self._pid and info.get("host") == self._host:
                    with self._lock:
                        self._found.setdefault(name, None)
            queues = self.queues()
            backlogs = tuple(await self.store.queue_backlogs(list(queues)))
        except BaseException:
            with self._lock:
                self._ok = False
            raise
        reading = GaugeReading(
            backlogs=backlogs,
            live_nodes={**dict.fromkeys(queues, 0), **live},
            read_at=time.monotonic(),
        )
        with self._lock:
            self._reading, self._ok = reading, True
        return reading

    async def _refresh(self) -> None:
        """:meth:`read` within ``stale_after_s``; a failure is logged (once per run of failures), not raised."""
        was_ok = self._ok
        try:
            async with asyncio.timeout(self.stale_after_s):
                await self.read()
        except Exception as exc:  # a store error, the timeout, or a bug: none may reach the scrape
            self.failures += 1
            if was_ok or self.failures == 1:
                what = "timed out" if isinstance(exc, TimeoutError) else error_text(exc)
                log.warning("asynccoord.monitor.queue_gauges_failed store=%r error=%s", self.store, what)

    def _finished(self, _future: concurrent.futures.Future[None]) -> None:
        with self._lock:
            self._inflight = None

    def _on_loop_thread(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    def current(self) -> tuple[GaugeReading | None, bool]:
        """The reading to serve and whether the latest read succeeded, for a scrape (any thread).

        Hands a read to the loop when the last one started ``refresh_s`` ago or more and none
        is in flight, then waits for it up to ``wait_s``: not at all on the loop's own thread
        (``prometheus_client.make_asgi_app``, or a ``generate_latest`` called from a
        coroutine), where the read can only run once the scrape returns: that scrape serves
        the last reading, and a later one the new.

        Returns:
            ``(reading, ok)``: the last reading, or None when none was made, or when it is
            older than ``stale_after_s`` and reads failed since or one that started before
            it went stale still runs (hangs); ``ok`` is False then, and while the latest
            completed read failed or none completed yet. A reading that aged only because
            no one scraped for ``stale_after_s`` (scrapes on the loop's thread serve the
            previous scrape's read) is served, ``ok`` True.
        """
        on_loop = self._on_loop_thread()
        with self._lock:
            future = self._inflight
            if future is not None and not future.done() and self._loop.is_closed():
                future = self._inflight = None  # its loop is gone: it will never complete
                self._ok = False
            # The start of a read an earlier scrape began that has not ended, if any.
            earlier = None if future is None else self._started_at
            due = time.monotonic() - self._started_at >= self.refresh_s
            if future is None and due:
                future = self._start()
        if future is not None and not on_loop:
            concurrent.futures.wait([future], timeout=self.wait_s)
        with self._lock:
            reading, ok = self._reading, self._ok
        if reading is not None and reading.age_s() > self.stale_after_s:
            # Dropped, and not up, behind a read that started before the values went stale and
            # hangs since (though none failed yet) or after failed reads. Values that aged only
            # because no one scraped (scrapes on the loop's thread serve the previous scrape's
            # read) are the freshest the store was asked for: served, with their age.
            hung = earlier is not None and earlier <= reading.read_at + self.stale_after_s
            if hung or not ok:
                reading, ok = None, False
        return reading, ok

    def _start(self) -> concurrent.futures.Future[None] | None:
        """Hand a read to the loop (called under ``_lock``); None when the loop no longer runs."""
        loop = self._loop
        if loop.is_closed() or not loop.is_running():
            self._ok = False
            return None
        refresh = self._refresh()
        try:
            future = asyncio.run_coroutine_threadsafe(refresh, loop)
        except RuntimeError:  # the loop closed meanwhile
            refresh.close()
            self._ok = False
            return None
        self.reads += 1
        self._started_at = time.monotonic()
        self._inflight = future
        future.add_done_callback(self._finished)
        return future
