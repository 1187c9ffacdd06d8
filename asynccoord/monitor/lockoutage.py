"""The ``lock_store_unreachable`` notice: a process whose lock store stops answering says so.

A lock store of its own (``Monitor(lock_store=...)``, a Redis beside a PostgreSQL queue)
can fail while the queue store answers. The nodes' acquisitions and renewals then fail or
hang: sends wait for their locks, and the leases held lapse after their TTL. No count the
monitor reads from its store tells of that, and no rule fires. The lock store records the
attempts of its calls (:class:`~asynccoord.reach.Reach`); a :class:`LockStoreWatch` reads
that record on a timer of the event loop. Once every attempt has failed for ``outage_s``
(with none answered), or one call has gone unanswered for ``outage_s``, it publishes a
process-scoped firing notice of the rule :data:`LOCK_STORE_UNREACHABLE`. Once an attempt is
answered again, with none failing since, it publishes the resolved notice.

A healthy store costs nothing: the watch reads what the nodes' own calls recorded. Only
while the last attempt failed, or the notice fires, and no call is in flight, the watch
makes one call of its own per tick (the store clock, ``now()``). So an idle process still
learns that the store is back, or that a lone failure was a blip.

As for ``store_unreachable`` (:mod:`asynccoord.monitor.outage`), only time the loop was
free counts. A tick that comes late by more than a quarter of ``outage_s`` (1 s at most)
judges nothing: the loop was blocked, and answers that came meanwhile are not read yet. A
tick that finds the store down gives the loop
:data:`~asynccoord.monitor.outage.CONFIRM_TURNS` turns before it decides.

Unlike ``store_unreachable``, this notice is also stored with the monitor's flushes in its
own store, which still answers: ``status`` and the dashboard list it with the active alerts.
That lets one lock store outage make one notice, not one per process: where a monitor judges
the cluster-scoped rules (one at a time, the leader), each process's notice is stored muted
(``inhibited_by`` the same rule) and the leader publishes one cluster-scoped
``lock_store_unreachable`` while any process's stored notice fires
(:func:`judge_cluster_outage`; ``value`` the processes cut off), resolved once none does.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Awaitable, Callable, Sequence

from ..contract.monitor import Alert, AlertScope, AlertState, open_alerts
from ..reach import Reach
from .outage import CONFIRM_TURNS
from .rules import Incident

__all__ = ("LOCK_STORE_UNREACHABLE", "LockStoreWatch", "judge_cluster_outage")

LOCK_STORE_UNREACHABLE = "lock_store_unreachable"
"""The rule (and event) name of the notice: ``value`` is the seconds since the lock store last
answered, ``count`` the attempts that failed since plus the calls unanswered since they began,
``threshold`` and ``window_s`` the watch's ``outage_s``."""


class LockStoreWatch:
    """Whether a lock store's attempts have all failed, or a call hung, for ``outage_s`` seconds.

    Args:
        process_id: The monitor's process id (the notices' scope key and ``monitor_id``).
        reach: The lock store's record of its calls.
        outage_s: Seconds of failed attempts, or of one call unanswered, that make an outage.
        interval_s: Seconds between two looks at ``reach`` while running (:meth:`start`).
        now_s: The store clock of the notices (the monitor's own store's).
        on_notice: Called with each notice a look decides while running.
        probe: One cheap call of the lock store (its ``now``), made while it seems down
            and idle; its outcome lands in ``reach``. None: no probe.
        grouped: The notices are muted (``inhibited_by`` :data:`LOCK_STORE_UNREACHABLE`): a
            leader publishes the cluster's one notice instead (:func:`judge_cluster_outage`).
    """

    def __init__(
        self,
        process_id: str,
        reach: Reach,
        outage_s: float,
        *,
        interval_s: float,
        now_s: Callable[[], float],
        on_notice: Callable[[Alert], None],
        probe: Callable[[], Awaitable[object]] | None = None,
        grouped: bool = False,
    ) -> None:
        self.process_id = process_id
        self.grouped = grouped
        self.reach = reach
        self.outage_s = outage_s
        self.interval_s = interval_s
        self._now_s = now_s
        self._on_notice = on_notice
        self._probe = probe
        self._started = time.monotonic()  # the watch starts as if the store had just answered
        self._firing: Alert | None = None
        self._fired_mono = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._probing: asyncio.Task[None] | None = None
        self._running = False

    def __repr__(self) -> str:
        return f"<LockStoreWatch {self.process_id!r} outage_s={self.outage_s:g} firing={self._firing is not None}>"

    @property
    def firing(self) -> Alert | None:
        """The firing notice of the outage under way, or None."""
        return self._firing

    def start(self) -> None:
        """Look at the record every ``interval_s`` on the running loop, until :meth:`stop`."""
        self._started = time.monotonic()
        self._running = True
        self._schedule()

    async def stop(self) -> None:
        """Stop looking (a judgement queued by the last look is dropped); cancel a probe under way and
        wait for it. An outage open stays open (:attr:`firing`)."""
        self._running = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        probing, self._probing = self._probing, None
        if probing is not None:
            probing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probing

    def check(self) -> Alert | None:
        """Judge the record now: the firing notice when an outage begins, the resolved one when it ends, else None."""
        now = time.monotonic()
        reach = self.reach
        since = max(self._started, reach.answered_at or self._started)
        failing = reach.failed_at is not None and reach.failed_at > since
        if self._firing is not None:
            if failing or reach.answered_at is None or reach.answered_at <= self._fired_mono:
                return None
            resolved = self._notice(AlertState.RESOLVED, fired_at=self._firing.fired_at, value=0.0, count=0)
            self._firing = None
            return resolved
        if not self._down(now, since, failing):
            return None
        unanswered = len(reach.waiting_since(since))
        self._fired_mono = now
        self._firing = self._notice(None, fired_at=None, value=now - since, count=reach.failures + unanswered)
        return self._firing

    def _down(self, now: float, since: float, failing: bool) -> bool:
        if failing and now - since >= self.outage_s:
            return True
        waiting = self.reach.waiting_since(since)
        return bool(waiting) and now - waiting[0] >= self.outage_s

    def _schedule(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() + self.interval_s
        self._timer = loop.call_at(due, self._tick, due)

    def _tick(self, due: float) -> None:
        self._timer = None
        if asyncio.get_running_loop().time() - due <= min(1.0, self.outage_s / 4):  # else the loop was blocked
            reach = self.reach
            since = max(self._started, reach.answered_at or self._started)
            failing = reach.failed_at is not None and reach.failed_at > since
            if self._firing is None and self._down(time.monotonic(), since, failing):
                asyncio.get_running_loop().call_soon(self._confirm, CONFIRM_TURNS)
            else:
                self._decide()
            if (failing or self._firing is not None) and reach.waiting == 0:
                self._start_probe()
        self._schedule()

    def _confirm(self, turns: int) -> None:
        """Give an answer that came while the loop was blocked ``turns`` more turns to be read, then judge."""
        if turns > 0:
            asyncio.get_running_loop().call_soon(self._confirm, turns - 1)
        else:
            self._decide()

    def _decide(self) -> None:
        if not self._running:  # stopped while a look waited its turns: no notice from a closing monitor
            return
        if (notice := self.check()) is not None:
            self._on_notice(notice)

    def _start_probe(self) -> None:
        if self._probe is None or self._probing is not None:
            return
        self._probing = asyncio.get_running_loop().create_task(self._probe_once(), name="asynccoord-lock-store-probe")

    async def _probe_once(self) -> None:
        try:
            assert self._probe is not None
            await self._probe()
        except Exception:  # the store recorded the attempt's outcome; nothing more to learn
            pass
        finally:
            if self._probing is asyncio.current_task():
                self._probing = None

    def _notice(self, state: AlertState | None, *, fired_at: float | None, value: float, count: int) -> Alert:
        now = self._now_s()
        return Alert(
            rule=LOCK_STORE_UNREACHABLE,
            event=LOCK_STORE_UNREACHABLE,
            value=value,
            threshold=self.outage_s,
            window_s=self.outage_s,
            at=now,
            scope=AlertScope.PROCESS,
            scope_key=self.process_id,
            state=AlertState.FIRING if state is None else state,
            count=count,
            fired_at=now if fired_at is None else fired_at,
            monitor_id=self.process_id,
            inhibited_by=LOCK_STORE_UNREACHABLE if self.grouped else None,
        )


def judge_cluster_outage(
    incidents: dict[tuple[str, str], Incident], stored: Sequence[Alert], now_s: float, monitor_id: str, window_s: float
) -> tuple[list[Alert], bool]:
    """The cluster's one ``lock_store_unreachable`` incident, judged on the processes' stored notices.

    Opens the incident (a firing notice) when some process's stored notice fires, closes it (a
    resolved notice) when none does, and keeps its stored value, the processes cut off, up
    to date meanwhile. Updates ``incidents`` in place, under the key
    ``(LOCK_STORE_UNREACHABLE, "")``, as :func:`~asynccoord.monitor.rules.decide` does.

    Args:
        incidents: The leader's open incidents.
        stored: The alerts the store holds (every process's flushed notices).
        now_s: The store clock of that read.
        monitor_id: The leader's process id.
        window_s: The notices' ``window_s`` and ``threshold`` (the outage time, seconds).

    Returns:
        The notices (none, the firing one, or the resolved one), and whether the open
        incident's stored value changed.
    """
    cut_off = sorted(
        {a.scope_key for a in open_alerts(stored) if a.rule == LOCK_STORE_UNREACHABLE and a.scope is AlertScope.PROCESS}
    )
    key = (LOCK_STORE_UNREACHABLE, "")
    held = incidents.get(key)
    if held is None:
        if not cut_off:
            return [], False
        alert = Alert(
            rule=LOCK_STORE_UNREACHABLE,
            event=LOCK_STORE_UNREACHABLE,
            value=float(len(cut_off)),
            threshold=window_s,
            window_s=window_s,
            at=now_s,
            scope=AlertScope.CLUSTER,
            scope_key="",
            state=AlertState.FIRING,
            count=len(cut_off),
            fired_at=now_s,
            monitor_id=monitor_id,
        )
        incidents[key] = Incident(alert=alert, current=alert)
        return [alert], False
    if not cut_off:
        del incidents[key]
        return [dataclasses.replace(held.alert, state=AlertState.RESOLVED, at=now_s, value=0.0, count=0)], False
    if held.current.count == len(cut_off):
        return [], False
    held.current = dataclasses.replace(held.alert, at=now_s, value=float(len(cut_off)), count=len(cut_off))
    return [], True
