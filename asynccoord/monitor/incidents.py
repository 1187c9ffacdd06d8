"""The incidents a :class:`~asynccoord.monitor.monitor.Monitor` holds, and what of them it stores.

:class:`MonitorIncidents` is a mixin of the monitor. It keeps the open incidents by rule and
scope key, and the resolved notices of the cluster incidents it closed lately. Each flush
stores their alerts, one per rule and scope key (see
:func:`~asynccoord.contract.monitor.open_alerts`), so other processes and the ``status``
command see them, and a monitor that takes the cluster-scoped rules over (a new leader,
:mod:`asynccoord.monitor.leadership`) adopts the incidents its predecessor left firing
instead of raising them again, and still sends their resolved notice. A resolved notice is
kept until every firing alert it closes has expired from the store, or as long as it mutes
another rule (:mod:`asynccoord.monitor.inhibition`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..contract.monitor import Alert, AlertScope
from .inhibition import Inhibitions
from .lockoutage import LOCK_STORE_UNREACHABLE, LockStoreWatch
from .outage import OutageWatch
from .rules import AlertRule, Incident

__all__ = ("MonitorIncidents",)


class MonitorIncidents:
    """The open incidents of a :class:`~asynccoord.monitor.monitor.Monitor`, the resolved notices it keeps
    stored, and the alerts it shows.

    A mixin: it relies on the monitor's rules, ``alert_ttl_s``, inhibitions and outage watches.
    """

    rules: tuple[AlertRule, ...]
    alert_ttl_s: float
    _open: bool
    _incidents: dict[tuple[str, str], Incident]
    _closed_incidents: dict[tuple[str, str], Alert]
    _inhibitions: Inhibitions
    _alerts_dirty: bool
    _lock_watch: LockStoreWatch | None
    _outage: OutageWatch

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
