"""The evaluations of a :class:`~asynccoord.monitor.monitor.Monitor`: its rules judged over the store's windows.

:class:`MonitorJudging` is a mixin of the monitor. An evaluation first renews (or tries to
take) the leadership of the cluster-scoped rules (:mod:`asynccoord.monitor.leadership`), then
reads in one call the sliding windows its rules need, and judges each rule per scope with
hysteresis and inhibition (:func:`asynccoord.monitor.rules.decide`); the leader also groups
the processes' lock store outages into the cluster's one notice
(:func:`asynccoord.monitor.lockoutage.judge_cluster_outage`). When the alert state changed it
is written to the store before the notices are published, so a monitor that takes over after
a crash finds what was raised and does not raise it again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..contract.monitor import Alert, AlertScope, MetricsView, open_alerts
from ..errors import CoordError
from .inhibition import Inhibitions
from .lockoutage import LockStoreWatch, judge_cluster_outage
from .outage import OutageWatch
from .rules import AlertRule, Incident, decide

__all__ = ("MonitorJudging",)

log = logging.getLogger("asynccoord.monitor.monitor")  # the log lines keep the monitor module's logger name


class MonitorJudging:
    """The rule evaluations of a :class:`~asynccoord.monitor.monitor.Monitor`.

    A mixin: it relies on the monitor's settings and counters, its incidents, its leadership
    (``_lead``, ``_unless_stalled``), its flush, and its delivery (``_publish``, ``_store_failed``,
    ``_store_reached``, ``_lock_watch_notice``).
    """

    store: Any
    rules: tuple[AlertRule, ...]
    process_id: str
    background: bool
    _lock_watch: LockStoreWatch | None
    _outage: OutageWatch
    _fresh_s: float
    _inhibitions: Inhibitions
    _incidents: dict[tuple[str, str], Incident]
    _closed_incidents: dict[tuple[str, str], Alert]
    _leader: bool
    _alerts_dirty: bool
    _open: bool
    _evaluations: int
    _evaluate_failures: int
    _fired: int
    _resolved: int

    if TYPE_CHECKING:

        async def flush(self, *, force: bool = False) -> float | None: ...

        async def _lead(self) -> bool: ...

        def _unless_stalled(self, notices: list[Alert]) -> list[Alert]: ...

        def _adopt(self, stored: Sequence[Alert]) -> None: ...

        def _forget_closed(self, now_s: float) -> None: ...

        def _publish(self, alert: Alert) -> None: ...

        def _store_failed(self, kind: str, exc: BaseException) -> None: ...

        def _store_reached(self, kind: str, store_now_s: float) -> None: ...

        def _lock_watch_notice(self, notice: Alert | None) -> None: ...

    async def evaluate(self) -> list[Alert]:
        """Read the rules' windows from the store and decide firing and resolved notices.

        First renews (or tries to take) the lease on :data:`~asynccoord.monitor.monitor.LEADER_LOCK`:
        the cluster-scoped rules are judged only while this monitor holds it. When the set of
        firing alerts changed, the new state is flushed to the store right away, then the
        notices are published (log line, buffers, callbacks, sinks), even if that write failed.

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
