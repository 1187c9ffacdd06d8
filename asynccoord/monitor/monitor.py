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

The monitor's parts: this module holds the monitor, its settings, its life cycle, its
subscriptions and its statistics; its flushes are :mod:`asynccoord.monitor.flushing`, its
evaluations :mod:`asynccoord.monitor.judging`, its leadership of the cluster-scoped rules
:mod:`asynccoord.monitor.leadership`, and the incidents it holds and stores
:mod:`asynccoord.monitor.incidents`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import secrets
import socket
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self

import anyio

from ..config import StoreConfig
from ..contract.locks import Lease
from ..contract.monitor import Alert, AlertScope
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
from .flushing import MonitorFlush
from .histogram import Histogram
from .incidents import MonitorIncidents
from .inhibition import Inhibitions
from .judging import MonitorJudging
from .leadership import LEADER_LOCK, MonitorLeadership
from .lockoutage import LockStoreWatch
from .outage import OutageWatch
from .publisher import Publisher, check_sinks
from .rules import DEFAULT_RULES, AlertRule, Incident
from .snapshot import ClusterSnapshot, cluster_snapshot
from .stats import MonitorStats

__all__ = ("LEADER_LOCK", "Monitor", "MonitorStats")

log = logging.getLogger(__name__)

_KEEPALIVE_S = 10.0
"""A monitor writes at least this often (seconds) even when nothing changed, so the
status command sees the process as live."""


_ACTIVE_STORES: weakref.WeakSet[Any] = weakref.WeakSet()


def _default_process_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class Monitor(MonitorFlush, MonitorJudging, MonitorLeadership, MonitorIncidents):
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
            store's ``config.max_payload_bytes`` encoded (1 MiB by default). ``nodes``, when
            given, is how many nodes the process hosts (``status`` reads a process that hosts
            some but has no live one as not live): an int >= 0.
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
        InvalidArgumentError, InvalidTypeError: a bad argument (or a read-only store), e.g.
            an ``info["nodes"]`` that is not an int >= 0 (``"8"``, ``-1``, ``True``).
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
        if info is not None and "nodes" in info:  # status judges from it whether the process is live
            check_int("info['nodes']", info["nodes"], minimum=0)
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
