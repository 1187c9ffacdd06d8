"""The leadership of the cluster-scoped rules among the monitors of one store.

Of all the :class:`~asynccoord.monitor.monitor.Monitor` objects sharing a store, one at a time
judges the cluster-scoped rules: the holder of the store lock :data:`LEADER_LOCK`, a lease
renewed at each evaluation and taken over by another monitor once it lapses, so a cluster
incident is raised once, not once per process. A leader judges by its lease's local deadline
on the monotonic clock, counted from before the store's answer (M. Kleppmann, "How to do
distributed locking", 2016): a leader that stalled past it may have been replaced, so it
steps down and publishes no cluster notice. :class:`MonitorLeadership` is a mixin of the
monitor.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from ..contract.locks import Lease
from ..contract.monitor import Alert, AlertScope

__all__ = ("LEADER_LOCK", "MonitorLeadership")

log = logging.getLogger("asynccoord.monitor.monitor")  # the log lines keep the monitor module's logger name

LEADER_LOCK = "asynccoord.monitor.cluster-rules"
"""The store lock whose holder judges the cluster-scoped rules for every monitor of the store."""


class MonitorLeadership:
    """Whether a :class:`~asynccoord.monitor.monitor.Monitor` judges the cluster-scoped rules: taking,
    renewing and giving up the lease on :data:`LEADER_LOCK`.

    A mixin: it relies on the monitor's store and settings, and ``_drop_cluster_incidents``.
    """

    store: Any
    process_id: str
    leader_ttl_s: float
    _judges_cluster: bool
    _lockable: bool
    _lease: Lease | None
    _lease_deadline: float
    _leader: bool
    _leader_changes: int

    if TYPE_CHECKING:

        def _drop_cluster_incidents(self) -> None: ...

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
