"""The conflict monitor: cluster-wide counters, sliding-window rules, alerts and their delivery.

A :class:`Monitor` flushes the process's coordination counters and latency histograms to
the store, so every process sees cluster-wide totals and rates, judges alert rules over
sliding windows of them (:mod:`asynccoord.monitor.rules`), and delivers one notice per
incident and one when it resolves, without ever blocking the nodes. It decides the notices;
:mod:`asynccoord.monitor.publisher` hands them to the log, the subscribers and the sinks.

Of all the monitors sharing a store, one at a time judges the cluster-scoped rules: the
holder of the store lock :data:`LEADER_LOCK` (a lease renewed at each evaluation, taken
over by another monitor once it lapses), so a cluster incident is raised once, not once
per process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import secrets
import socket
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self

import anyio

from ..config import StoreConfig
from ..contract.locks import Lease
from ..contract.monitor import PROCESS_SCOPE, Alert, AlertScope, MetricsFlush, MetricsView, open_alerts
from ..errors import CoordError, InvalidArgumentError, InvalidTypeError, StoreError
from ..events import EventCounter
from ..reach import Reach
from ..validation import (
    MAX_DURATION_S,
    check_bool,
    check_int,
    check_interval_s,
    check_lease_s,
    check_name,
    check_positive,
    encode_payload,
)
from .alerts import AlertCallback, AlertSink, AlertStream, Subscription
from .histogram import Histogram
from .inhibition import Inhibitions
from .lockoutage import LOCK_STORE_UNREACHABLE, LockStoreWatch, judge_cluster_outage
from .outage import OutageWatch
from .publisher import Publisher, check_sinks
from .rules import DEFAULT_RULES, AlertRule, Incident, decide
from .snapshot import ClusterSnapshot, cluster_snapshot
from .stats import MonitorStats

__all__ = ("LEADER_LOCK", "Monitor", "MonitorStats")

log = logging.getLogger(__name__)

_KEEPALIVE_S = 10.0
"""A monitor writes at least this often (seconds) even when nothing changed, so the
status command sees the process as live."""
_CANCELLED_WRITE_WAIT_S = 5.0
"""How long a cancelled flush waits for its write's outcome, seconds."""

LEADER_LOCK = "asynccoord.monitor.cluster-rules"
"""The store lock whose holder judges the cluster-scoped rules for every monitor of the store."""


_ACTIVE_STORES: weakref.WeakSet[Any] = weakref.WeakSet()


def _retrieve(call: asyncio.Future[Any]) -> None:
    """Done-callback of a call nobody awaits any more: read its outcome, so asyncio reports no lost error."""
    if not call.cancelled():
        call.exception()


def _default_process_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class Monitor:
    """Flushes this process' counters, evaluates rules cluster-wide, and delivers alerts.

    ::

        async with Monitor(store, rules=DEFAULT_RULES, flush_interval_s=1.0) as monitor:
            monitor.subscribe(page_someone)            # async callback, run in its own task
            async for alert in monitor.alerts():        # or iterate (bounded buffer)
                print(alert.describe())

    At its start and every ``flush_interval_s`` after it takes the deltas of the process's counters
    (``store.events``, plus per-node counters registered with :meth:`track`) and latency
    histograms (``store.latencies``) and adds them to the store in one batched write
    (:meth:`~asynccoord.contract.monitor.MonitorStore.flush_metrics`), so every process
    and the status command see totals and rates over all processes. Every
    ``evaluate_interval_s`` it reads the windows its rules need (one read) and judges each
    :class:`~asynccoord.monitor.rules.AlertRule` per scope (the cluster, each process, or
    each node): incidents with hysteresis, one firing and one resolved notice each, or none for an
    incident muted by the one it follows from (``AlertRule.inhibited_by``, :mod:`~asynccoord.monitor.inhibition`).

    Publishing only appends to one bounded buffer per subscriber
    (:mod:`asynccoord.monitor.alerts`); each callback runs in its own task under
    ``callback_timeout_s``. Each notice is also logged at WARNING as
    ``asynccoord.monitor.alert_firing`` or ``asynccoord.monitor.alert_resolved``. Firing
    alerts are stored with each flush, so other processes (and ``python -m asynccoord
    status``) see them; they expire when the monitor stops refreshing them.

    Every process may run its monitor on a shared store; the cluster-scoped rules are
    judged by one of them at a time, the holder of the store lock :data:`LEADER_LOCK`
    (``try_acquire_lock`` with ``leader_ttl_s``, renewed at each evaluation), so one cluster
    incident makes one firing notice and one resolved notice in the whole cluster, on the
    leader's subscribers and sinks. The others take the lease over once it lapses (its
    holder died: cluster rules go unjudged for at most ``leader_ttl_s`` plus one
    evaluation) or is released (its holder closed). A new leader adopts the cluster alerts
    the store shows firing: it does not raise them again, and it sends their resolved
    notice. Process- and node-scoped rules are judged by each monitor on its own
    process' counters. A store without locks (no ``try_acquire_lock``) leaves each
    monitor judging the cluster rules alone.

    Use one monitor per store object: a second monitor on the same store would count
    its deltas twice.

    Args:
        store: An open store implementing :class:`~asynccoord.contract.monitor.MonitorStore`.
        rules: The alert rules (names unique; each ``inhibited_by`` names another of them, of the
            same scope, without a cycle). Default :data:`DEFAULT_RULES`.
        flush_interval_s: Seconds between flushes of the counters (>= 0.001,
            ``validation.MIN_INTERVAL_S``). Default 1.
        evaluate_interval_s: Seconds between rule evaluations (>= 0.001). Default
            ``flush_interval_s``.
        retention_s: Time buckets kept in the store, seconds; must cover every rule's
            window and be at least ``flush_interval_s``. Default 900.
        process_id: This process' id in the cluster view. Default
            ``"<host>-<pid>-<random>"``.
        buffer_size: Notices buffered per subscriber before the oldest is dropped (>= 1).
            Default 100.
        callback_timeout_s: Longest a subscriber callback may run per notice. Default 10.
        log_alerts: Log each notice at WARNING. Default True.
        background: Run the flush and evaluation loops while open. False to drive
            them with :meth:`flush` and :meth:`evaluate` (tests, fake clocks). Default True.
        info: JSON object stored with the process' flushes (``host``, ``pid`` and ``keepalive_s``
            are added: ``status`` judges from ``keepalive_s`` whether the process is gone),
            checked here: a dict with str keys and JSON values, finite numbers, at most the
            store's ``config.max_payload_bytes`` encoded (1 MiB by default).
        lock_store: The lock store of this process' nodes when it is not ``store``
            (``Runtime(lock_store=...)``, e.g. a
            :class:`~asynccoord.backends.redis.RedisLockStore`): its events (lock
            contention, lost locks, refused fencing tokens) count in the process totals
            with ``store``'s. One that records its calls' outcomes (a ``reach``, as
            ``RedisLockStore`` does) is watched too: when its calls all fail, or one hangs, for
            ``store_outage_s``, this monitor publishes the process-scoped notice
            ``lock_store_unreachable`` and stores it with its flushes (``status`` lists it),
            resolved once the lock store answers again (see :mod:`asynccoord.monitor.lockoutage`).
            None (default) when ``store`` holds the locks as well.
        sinks: Destinations every notice is also handed to, e.g. a
            :class:`~asynccoord.monitor.webhook.WebhookSink`; each queues it and delivers it
            in a task of its own, so none can block the monitor. Started and closed with the
            monitor (a close gives each up to 5 s to deliver what it holds). Default none.
        leader_ttl_s: Lease of the lock :data:`LEADER_LOCK` that makes this monitor the one
            judging the cluster-scoped rules, seconds: how long the cluster rules go
            unjudged when the leader dies without closing. At least twice
            ``evaluate_interval_s`` (each evaluation renews it). Default the largest of
            5 s, 1.5 times the longer interval and twice ``evaluate_interval_s``.
        store_outage_s: Seconds in which every flush (write), or every read, of the store
            failed or hung that make this monitor publish the process-scoped notice ``store_unreachable`` (log,
            subscribers, sinks; see :mod:`asynccoord.monitor.outage`), resolved once the calls
            that failed succeed again. A call still unanswered after ``store_outage_s`` (it may
            wait up to ``busy_timeout_s`` on SQLite, ``reconnect_timeout_s`` on PostgreSQL) counts
            at once, and is left to run. Default 10.

    Raises:
        InvalidArgumentError, InvalidTypeError: a bad argument (or a read-only store).
        PayloadTooLargeError: ``info`` encodes to more than the size limit.
    """

    def __init__(
        self,
        store: Any,
        *,
        rules: Sequence[AlertRule] | None = None,
        flush_interval_s: float = 1.0,
        evaluate_interval_s: float | None = None,
        retention_s: float = 900.0,
        process_id: str | None = None,
        buffer_size: int = 100,
        callback_timeout_s: float = 10.0,
        log_alerts: bool = True,
        background: bool = True,
        info: Mapping[str, Any] | None = None,
        lock_store: Any = None,
        sinks: Sequence[AlertSink] = (),
        leader_ttl_s: float | None = None,
        store_outage_s: float = 10.0,
    ) -> None:
        for method in ("flush_metrics", "read_metrics"):
            if not callable(getattr(store, method, None)):
                raise InvalidTypeError(f"store must implement MonitorStore ({method}), got {type(store).__name__}")
        if getattr(store, "read_only", False) is True:
            raise InvalidArgumentError(
                f"{store!r} is read-only: a Monitor flushes counters; read a read-only store with cluster_snapshot()"
            )
        given: object = rules
        if given is not None and (isinstance(given, str | bytes) or not isinstance(given, Iterable)):
            raise InvalidTypeError(f"rules must be a sequence of AlertRule records or None, got {rules!r}")
        chosen = DEFAULT_RULES if rules is None else tuple(rules)
        for rule in chosen:
            if not isinstance(rule, AlertRule):
                raise InvalidTypeError(f"rules must hold AlertRule records, got {type(rule).__name__}")
        names = [r.name for r in chosen]
        if len(set(names)) != len(names):
            raise InvalidArgumentError(f"rule names must be unique, got {names!r}")
        Inhibitions(chosen)  # each inhibited_by names another rule of the set, no cycle
        if lock_store is not None and not isinstance(getattr(lock_store, "events", None), EventCounter):
            raise InvalidTypeError(
                f"lock_store must be a lock store with an EventCounter 'events', got {type(lock_store).__name__}"
            )
        chosen_sinks = check_sinks(sinks)
        self.store = store
        self.lock_store = None if lock_store is store else lock_store
        self.rules = chosen
        self.flush_interval_s = check_interval_s("flush_interval_s", flush_interval_s)
        self.evaluate_interval_s = (
            self.flush_interval_s
            if evaluate_interval_s is None
            else check_interval_s("evaluate_interval_s", evaluate_interval_s)
        )
        self.retention_s = check_positive("retention_s", retention_s)
        if self.flush_interval_s > self.retention_s:
            raise InvalidArgumentError(
                f"flush_interval_s={self.flush_interval_s!r} > retention_s={self.retention_s!r}: the store "
                "would drop each flush's buckets before the next; lower flush_interval_s"
            )
        for rule in chosen:
            if rule.window_s > self.retention_s:
                raise InvalidArgumentError(
                    f"rule {rule.name!r} has window_s={rule.window_s!r} > retention_s={self.retention_s!r}: "
                    "raise retention_s"
                )
        self.process_id = _default_process_id() if process_id is None else check_name("process_id", process_id)
        self._outage = OutageWatch(
            self.process_id,
            check_positive("store_outage_s", store_outage_s),
            on_notice=self._outage_notice,
            at_work=self._store_at_work,
        )
        reach = getattr(self.lock_store, "reach", None)
        self._lock_watch = (
            None
            if not isinstance(reach, Reach)
            else LockStoreWatch(
                self.process_id,
                reach,
                self._outage.outage_s,
                interval_s=min(self.evaluate_interval_s, self._outage.outage_s / 4),
                now_s=self._outage.now_s,
                on_notice=self._lock_store_notice,
                probe=getattr(self.lock_store, "now", None),
                grouped=any(rule.scope is AlertScope.CLUSTER for rule in chosen),  # a leader sends the cluster's one
            )
        )
        # The last seconds in which a relative rule's events must have come for it to open an
        # incident (rules.decide): three intervals, for the events to be flushed and read.
        self._fresh_s = min(self.retention_s, max(5.0, 3 * max(self.flush_interval_s, self.evaluate_interval_s)))
        self._inhibitions = Inhibitions(chosen, settle_s=self._fresh_s)  # mutes what follows by this much
        self._publisher = Publisher(
            self.process_id,
            chosen_sinks,
            buffer_size=check_int("buffer_size", buffer_size, minimum=1),
            callback_timeout_s=check_positive("callback_timeout_s", callback_timeout_s),
            log_alerts=check_bool("log_alerts", log_alerts),
        )
        self.background = check_bool("background", background)
        if info is not None and not isinstance(info, Mapping):
            raise InvalidTypeError(f"info must be a mapping or None, got {type(info).__name__}")
        # Three intervals, at most the longest duration a store takes (intervals near a year).
        alert_ttl_s = max(10.0, 3 * max(self.flush_interval_s, self.evaluate_interval_s))
        if leader_ttl_s is None:
            self.leader_ttl_s = min(MAX_DURATION_S, max(alert_ttl_s / 2, 2 * self.evaluate_interval_s))
        else:
            self.leader_ttl_s = check_lease_s("leader_ttl_s", leader_ttl_s)
            if self.leader_ttl_s < 2 * self.evaluate_interval_s:
                raise InvalidArgumentError(
                    f"leader_ttl_s={self.leader_ttl_s!r} < 2 * evaluate_interval_s={self.evaluate_interval_s!r}: "
                    "each evaluation renews the lease, so it would lapse between two; raise leader_ttl_s"
                )
        # Stored alerts outlive the leader's lease by at least half of it: a monitor taking
        # over from a leader that died still finds its alerts, and does not raise them again.
        self.alert_ttl_s = min(MAX_DURATION_S, max(alert_ttl_s, 2 * self.leader_ttl_s))
        self._refresh_s = min(_KEEPALIVE_S, self.alert_ttl_s / 3)  # a write at least this often, idle or not
        self.keepalive_s = self._refresh_s + self.flush_interval_s
        """The longest a running monitor goes without a write, seconds: a refresh is due after
        ``min(10, alert_ttl_s / 3)`` and written by the next flush."""
        self.info: dict[str, Any] = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "keepalive_s": self.keepalive_s,
            **(info or {}),
        }
        # Checked now, as Membership.join checks its info: a value no flush could write would
        # otherwise fail every flush (logged, never raised) and keep this process out of the totals.
        limit = getattr(getattr(store, "config", None), "max_payload_bytes", None)
        max_bytes = limit if isinstance(limit, int) else StoreConfig().max_payload_bytes
        encode_payload(self.info, max_bytes=max_bytes, arg="info")
        self._lockable = all(
            callable(getattr(store, name, None)) for name in ("try_acquire_lock", "renew_lock", "release_lock")
        )
        self._judges_cluster = any(rule.scope is AlertScope.CLUSTER for rule in chosen)
        self._lease: Lease | None = None
        self._lease_deadline = -math.inf  # monotonic: past it, the lease may have lapsed (and another lead)
        self._closed_incidents: dict[tuple[str, str], Alert] = {}  # resolved cluster notices kept stored
        self._leader = False
        self._leader_changes = 0
        self._tracked: dict[str, EventCounter] = {}
        self._sent_events: dict[tuple[str, str], int] = {}
        self._sent_latency: dict[str, Histogram] = {}
        self._incidents: dict[tuple[str, str], Incident] = {}
        self._alerts_dirty = False
        self._last_write_monotonic = -math.inf
        self._flush_lock = asyncio.Lock()
        self._stopping = False  # the final flush of close(): its info says the process stopped
        self._loop_task: asyncio.Task[None] | None = None
        self._open = False
        self._flushes = self._flush_failures = 0
        self._evaluations = self._evaluate_failures = 0
        self._fired = self._resolved = 0

    def __repr__(self) -> str:
        state = "open" if self._open else "closed"
        leader = " leader" if self._leader else ""
        return (
            f"<Monitor {self.process_id!r} {state}{leader} rules={len(self.rules)}"
            f" active_alerts={self._firing_incidents()}>"
        )

    @property
    def sinks(self) -> tuple[AlertSink, ...]:
        """The alert sinks every notice is handed to."""
        return self._publisher.sinks

    @property
    def buffer_size(self) -> int:
        """Notices buffered per subscriber by default."""
        return self._publisher.buffer_size

    @property
    def callback_timeout_s(self) -> float:
        """Longest a subscriber callback may run per notice by default, seconds."""
        return self._publisher.callback_timeout_s

    @property
    def log_alerts(self) -> bool:
        """Whether each notice is logged."""
        return self._publisher.log_alerts

    # --- life cycle -----------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def start(self) -> None:
        """Start delivering (and, with ``background``, flushing and evaluating).

        With ``background``, the first flush is written before this returns, so the process
        shows in ``status`` from its start.

        Raises:
            InvalidArgumentError: another open monitor flushes the same store object.
        """
        if self._open:
            return
        counted = [self.store] if self.lock_store is None else [self.store, self.lock_store]
        for source in counted:  # a store's events are flushed by one monitor only
            if source in _ACTIVE_STORES:
                raise InvalidArgumentError(
                    f"{source!r} already has an open Monitor counting its events: use one monitor per store"
                    " (counts would double)"
                )
        _ACTIVE_STORES.update(counted)
        self._open = True
        self._stopping = False
        await self._publisher.start()
        if self.background:
            # A first flush before start() returns: the process shows in `status` from now on,
            # even if it is killed before its first interval ends.
            await self._guarded(self.flush, "flush")
            self._loop_task = asyncio.get_running_loop().create_task(self._run(), name="asynccoord-monitor")
            if self._lock_watch is not None:
                self._lock_watch.start()

    async def close(self) -> None:
        """Stop the loops, flush what is left and withdraw this monitor's stored alerts, end the streams.

        The leader of the cluster-scoped rules releases its lease, so another monitor takes
        them over at its next evaluation; it leaves its firing cluster alerts stored (they
        expire after ``alert_ttl_s``) for the next leader to adopt, another process's or its
        own process's after a restart, so a restart does not raise them again. The final flush and the release
        run shielded for at most 5 s; a store that is already closed is tolerated. Idempotent.
        """
        if not self._open:
            return
        self._open = False
        _ACTIVE_STORES.discard(self.store)
        if self.lock_store is not None:
            _ACTIVE_STORES.discard(self.lock_store)
        task, self._loop_task = self._loop_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._lock_watch is not None:
            await self._lock_watch.stop()
        try:
            with anyio.CancelScope(shield=True) as scope:
                scope.deadline = anyio.current_time() + 5.0
                # The leader leaves its firing cluster alerts (and resolved notices) stored for
                # the next leader: another process, or this one restarted within alert_ttl_s.
                hand_over = self._leader
                for key, incident in list(self._incidents.items()):
                    if not (hand_over and incident.alert.scope is AlertScope.CLUSTER):
                        del self._incidents[key]
                if not hand_over:
                    self._closed_incidents.clear()
                self._alerts_dirty = True
                self._stopping = True  # `status` shows the process gone at once
                with contextlib.suppress(CoordError):
                    await self.flush(force=True)
                self._incidents.clear()
                self._closed_incidents.clear()
                lease, self._lease = self._lease, None
                self._leader = False
                if lease is not None:
                    with contextlib.suppress(CoordError):
                        await self.store.release_lock(lease)
        finally:
            await self._publisher.aclose()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_flush = loop.time() + self.flush_interval_s
        next_eval = loop.time() + self.evaluate_interval_s
        while True:
            await asyncio.sleep(max(0.0, min(next_flush, next_eval) - loop.time()))
            now = loop.time()
            if now >= next_flush:
                next_flush = now + self.flush_interval_s
                await self._guarded(self.flush, "flush")
            if now >= next_eval:
                next_eval = now + self.evaluate_interval_s
                await self._guarded(self.evaluate, "evaluate")

    async def _guarded(self, fn: Callable[[], Awaitable[Any]], what: str) -> None:
        try:
            await fn()
        except CoordError as exc:
            log.warning("asynccoord.monitor.%s_failed process=%s error=%s", what, self.process_id, exc)
        except Exception:  # a bug must not stop the monitor, nor ever reach the nodes
            log.exception("asynccoord.monitor.%s_failed process=%s", what, self.process_id)

    # --- counters and flushing ----------------------------------------------------------

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

    # --- rules --------------------------------------------------------------------------

    async def evaluate(self) -> list[Alert]:
        """Read the rules' windows from the store and decide firing and resolved notices.

        First renews (or tries to take) the lease on :data:`LEADER_LOCK`: the cluster-scoped
        rules are judged only while this monitor holds it. When the set of firing alerts
        changed, the new state is flushed to the store right away, then the notices are
        published (log line, buffers, callbacks, sinks), even if that write failed.

        Returns:
            The notices this evaluation produced (often empty).

        Raises:
            StoreError: the read failed (the monitor's loop logs it and goes on).
        """
        if self._lock_watch is not None and not self.background:  # a running monitor's watch has a timer
            self._lock_watch_notice(self._lock_watch.check())
        if not self.rules:
            return []
        windows = tuple(sorted({rule.window_s for rule in self.rules} | {self._fresh_s}))
        try:
            with self._outage.call("read"):
                took_over = await self._lead()
            with self._outage.call("read"):
                view: MetricsView = await self.store.read_metrics(windows)
        except BaseException as exc:
            self._evaluate_failures += 1
            self._store_failed("read", exc)
            raise
        self._store_reached("read", view.now_s)
        self._evaluations += 1
        if took_over:
            self._adopt(open_alerts(view.alerts))  # muted ones too: they stay muted
            self._inhibitions.learn(view.alerts)  # what the last leader resolved lately still mutes
        self._forget_closed(view.now_s)
        rules = [rule for rule in self.rules if self._leader or rule.scope is not AlertScope.CLUSTER]
        changes, changed = decide(
            rules,
            self._incidents,
            view,
            self.process_id,
            own_process=self.process_id,
            fresh_s=self._fresh_s,
            inhibitions=self._inhibitions,
        )
        if self._leader:  # the cluster's one notice of the processes' lock store outages
            grouped, regrouped = judge_cluster_outage(
                self._incidents, view.alerts, view.now_s, self.process_id, self._outage.outage_s
            )
            changes, changed = changes + grouped, changed or regrouped
        self._alerts_dirty = self._alerts_dirty or changed
        changes = self._unless_stalled(changes)
        for alert in changes:
            if not alert.firing and alert.scope is AlertScope.CLUSTER:
                self._closed_incidents[(alert.rule, alert.scope_key)] = alert
        notices = [alert for alert in changes if not alert.muted]  # a muted incident is stored, never published
        self._fired += sum(1 for alert in notices if alert.firing)
        self._resolved += sum(1 for alert in notices if not alert.firing)
        if not changes:
            return notices
        # The stored alert state changed: write it now, and before publishing, so that a
        # monitor taking over from this one after a crash finds what it raised, and does
        # not raise it again. Published all the same when the write fails.
        self._alerts_dirty = True
        try:
            if self._open:
                try:
                    await self.flush()
                except CoordError as exc:
                    log.warning("asynccoord.monitor.flush_failed process=%s error=%s", self.process_id, exc)
        finally:
            for alert in self._unless_stalled(changes):
                self._publish(alert)
        return notices

    async def _lead(self) -> bool:
        """Renew or take the lease on :data:`LEADER_LOCK`; True when this monitor just took over.

        Sets ``_leader``. A lapsed lease taken again with the next fencing token was held by
        nobody in between: the leadership went on, and so do the open incidents. Otherwise
        the cluster incidents this monitor held are another's now: they are dropped
        without a notice (and withdrawn from the store at the next flush).
        """
        if not self._judges_cluster or not self._lockable:
            self._leader = self._judges_cluster
            return False
        lease = self._lease
        started = time.monotonic()  # the lease runs from before the store's answer, at the latest
        if lease is not None:
            renewed: Lease | None = await self.store.renew_lock(lease, self.leader_ttl_s)
            if renewed is not None:
                self._lease_deadline = started + self.leader_ttl_s
                self._lease = renewed
                self._leader = True
                return False
        got = await self.store.try_acquire_lock(LEADER_LOCK, ttl_s=self.leader_ttl_s, holder=self.process_id)
        if isinstance(got, Lease):
            self._lease_deadline = started + self.leader_ttl_s
            self._lease = got
            self._leader = True
            if lease is not None and got.fencing_token == lease.fencing_token + 1:
                return False  # nobody held it in between
            self._drop_cluster_incidents()
            self._leader_changes += 1
            log.info(
                "asynccoord.monitor.leader_acquired process=%s lock=%s fencing_token=%d",
                self.process_id,
                LEADER_LOCK,
                got.fencing_token,
            )
            return True
        if self._step_down():
            log.info("asynccoord.monitor.leader_lost process=%s lock=%s", self.process_id, LEADER_LOCK)
        return False

    def _unless_stalled(self, notices: list[Alert]) -> list[Alert]:
        """``notices`` without the cluster ones if this leader's lease may have lapsed meanwhile.

        A leader that stalled (a long pause, a slow read or write) past its lease's local
        deadline may have been replaced: another monitor may judge the same incidents now.
        It steps down and publishes no cluster notice; the leader of the next evaluation
        judges them.
        """
        if not self._leader or self._lease is None or time.monotonic() < self._lease_deadline:
            return notices
        self._step_down()
        log.warning(
            "asynccoord.monitor.leader_stalled process=%s lock=%s: the lease may have lapsed; cluster notices left "
            "to the next leader",
            self.process_id,
            LEADER_LOCK,
        )
        return [alert for alert in notices if alert.scope is not AlertScope.CLUSTER]

    def _step_down(self) -> bool:
        """Hold no lease and judge no cluster rule (their open incidents dropped without a notice);
        whether this monitor was the leader until now."""
        was_leader = self._leader
        self._lease = None
        self._leader = False
        self._drop_cluster_incidents()
        if was_leader:
            self._leader_changes += 1
        return was_leader

    def _forget_closed(self, now_s: float) -> None:
        """Drop the kept resolved notices older than ``alert_ttl_s`` (store clock ``now_s``): every
        firing alert they close has expired by then. An inhibiting rule's is kept as long as it
        mutes (a new leader learns of it from the store)."""
        for key, alert in list(self._closed_incidents.items()):
            if alert.at + max(self.alert_ttl_s, self._inhibitions.horizon_s(alert.rule)) <= now_s:
                del self._closed_incidents[key]
                self._alerts_dirty = True

    def _stored_alerts(self) -> list[Alert]:
        """What a flush stores: the open incidents' alerts, and the resolved notices of the cluster
        incidents this monitor closed lately (see :func:`~asynccoord.contract.monitor.open_alerts`), but
        for a key that fires again (one stored alert per rule and scope key)."""
        alerts = [inc.current for inc in self._incidents.values()]
        alerts += [a for key, a in self._closed_incidents.items() if key not in self._incidents]
        if self._open and self._lock_watch is not None and self._lock_watch.firing is not None:
            alerts.append(self._lock_watch.firing)  # its own store answers: status shows it
        return alerts

    def _drop_cluster_incidents(self) -> None:
        for key in [k for k, inc in self._incidents.items() if inc.alert.scope is AlertScope.CLUSTER]:
            del self._incidents[key]
            self._alerts_dirty = True

    def _adopt(self, stored: Sequence[Alert]) -> None:
        """Continue the cluster incidents the store shows firing (a former leader raised them)."""
        names = {rule.name for rule in self.rules if rule.scope is AlertScope.CLUSTER} | {LOCK_STORE_UNREACHABLE}
        for alert in stored:
            key = (alert.rule, alert.scope_key)
            if alert.firing and alert.scope is AlertScope.CLUSTER and alert.rule in names:
                held = self._incidents.get(key)
                if held is None or alert.fired_at < held.alert.fired_at:
                    self._incidents[key] = Incident(alert=alert, current=alert)
                    self._alerts_dirty = True

    # --- delivery -----------------------------------------------------------------------

    def _store_at_work(self) -> bool:
        """Whether the store is at work on this process's calls now (see :class:`OutageWatch`)."""
        return getattr(self.store, "writing", False) is True

    def _store_failed(self, kind: str, exc: BaseException) -> None:
        if isinstance(exc, StoreError) and (notice := self._outage.failed(kind)) is not None:
            self._outage_notice(notice)

    def _store_reached(self, kind: str, store_now_s: float) -> None:
        if (notice := self._outage.reached(kind, store_now_s)) is not None:
            self._outage_notice(notice)

    def _lock_watch_notice(self, notice: Alert | None) -> None:
        if notice is not None:
            self._lock_store_notice(notice)

    def _lock_store_notice(self, notice: Alert) -> None:
        self._alerts_dirty = True  # stored with the next flush (withdrawn once resolved)
        self._outage_notice(notice)

    def _outage_notice(self, notice: Alert) -> None:
        if notice.muted:  # a process's lock store outage, grouped into the leader's one notice
            pass
        elif notice.firing:
            self._fired += 1
        else:
            self._resolved += 1
        self._publish(notice)

    def _publish(self, alert: Alert) -> None:
        self._publisher.publish(alert)

    def alerts(self, *, buffer: int | None = None) -> AlertStream:
        """A new async iterator over the notices published from now on.

        Args:
            buffer: Notices buffered before the oldest is dropped (>= 1). Default
                the monitor's ``buffer_size``.

        Raises:
            InvalidArgumentError: ``buffer`` < 1.
        """
        return self._publisher.alerts(buffer=buffer)

    def subscribe(
        self, callback: AlertCallback, *, buffer: int | None = None, timeout_s: float | None = None
    ) -> Subscription:
        """Call ``await callback(alert)`` for every notice, in a task of its own.

        A plain (sync) function is called as it is: it runs on the event loop's thread, so
        ``timeout_s`` cannot cut it short; keep it quick.

        A callback that raises or exceeds ``timeout_s`` is logged
        (``asynccoord.monitor.subscriber_failed``) and counted, and gets the next notice;
        one that falls behind loses its oldest buffered notices (counted as dropped).

        Args:
            callback: ``async def callback(alert: Alert) -> None``, or any callable
                returning an awaitable, or a plain function.
            buffer: Notices buffered for it (>= 1). Default ``buffer_size``.
            timeout_s: Longest one call may take (> 0). Default ``callback_timeout_s``.

        Returns:
            A :class:`Subscription` (``.cancel()`` to unsubscribe).

        Raises:
            InvalidTypeError: ``callback`` is not callable.
        """
        return self._publisher.subscribe(callback, buffer=buffer, timeout_s=timeout_s)

    # --- inspection ---------------------------------------------------------------------

    def active_alerts(self) -> list[Alert]:
        """The firing notices of this monitor's open incidents (``store_unreachable`` and
        ``lock_store_unreachable`` included), oldest first; muted incidents are left out (:meth:`muted_alerts`)."""
        alerts = [inc.alert for inc in self._incidents.values() if not inc.alert.muted]
        alerts += [outage for outage in self._outages() if not outage.muted]
        return sorted(alerts, key=lambda a: (a.fired_at, a.rule, a.scope_key))

    def _outages(self) -> list[Alert]:
        """The firing notices of this process's store and lock store outages."""
        both = (self._outage.firing, None if self._lock_watch is None else self._lock_watch.firing)
        return [outage for outage in both if outage is not None]

    def _firing_incidents(self) -> int:
        return sum(1 for inc in self._incidents.values() if not inc.alert.muted)

    def muted_alerts(self) -> list[Alert]:
        """This monitor's open incidents that opened muted (``inhibited_by`` set, never published), oldest first:
        a process's ``lock_store_unreachable`` is, where a leader publishes the cluster's one."""
        alerts = [inc.alert for inc in self._incidents.values() if inc.alert.muted]
        alerts += [outage for outage in self._outages() if outage.muted]
        return sorted(alerts, key=lambda a: (a.fired_at, a.rule, a.scope_key))

    async def snapshot(self, windows_s: Sequence[float] = (10.0, 60.0)) -> ClusterSnapshot:
        """Cluster-wide totals, rates, latencies and stored alerts, read from the store now.

        Args:
            windows_s: Sliding windows for rates and latency quantiles, seconds.

        Raises:
            StoreError: the read failed.
        """
        return await cluster_snapshot(self.store, windows_s)

    def statistics(self) -> MonitorStats:
        """A snapshot of this monitor's own counters (flushes, notices, drops, failures)."""
        publisher = self._publisher
        return MonitorStats(
            process_id=self.process_id,
            flushes=self._flushes,
            flush_failures=self._flush_failures,
            evaluations=self._evaluations,
            evaluate_failures=self._evaluate_failures,
            alerts_fired=self._fired,
            alerts_resolved=self._resolved,
            alerts_dropped=publisher.dropped,
            callback_failures=publisher.callback_failures,
            subscribers=publisher.subscribers,
            active_alerts=self._firing_incidents(),
            muted_alerts=len(self._incidents) - self._firing_incidents(),
            sink_failures=publisher.sink_failures,
            sink_dropped=publisher.sink_dropped,
            leader=self._leader,
            leader_changes=self._leader_changes,
        )
