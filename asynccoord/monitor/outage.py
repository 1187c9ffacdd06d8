"""The ``store_unreachable`` notice: a monitor that cannot reach its store says so itself.

Every other alert is judged on counts the monitor reads from the store, and its state is
written there before it is published, so an outage of the store silences all of them. A
monitor therefore also watches its own calls to the store (its flushes and reads): once
every write, or every read, of at least ``outage_s`` has failed, or one call has gone
unanswered for ``outage_s`` with no call of its kind succeeding meanwhile, it publishes a
process-scoped firing notice of the rule :data:`STORE_UNREACHABLE` to its log,
subscribers and sinks (never to the store, which it cannot reach), and the resolved
notice once the kind of call that failed or hung succeeds again (and the last call of the
other kind did not fail). It is the dead man's switch of monitoring systems turned
inwards: silence from the store is itself the incident. Each process raises its own,
since each loses the store on its own (its network path, its connection pool).

A call that hangs rather than fails is caught by a timer: a store call waits for the
store up to its own timeout (``busy_timeout_s``, 30 s, for SQLite's write lock), longer
than ``outage_s``, and a monitor's calls run one after another, so counting failures
alone would raise the notice late, or never when the store answers before the timeout.
Each watched call arms a timer on the event loop for ``outage_s``; it is disarmed when the
call returns, and the call itself is left to run. The timer counts only time the loop was
free to see the store's answer: one that goes off late by more than a quarter of
``outage_s`` (1 s at most), because the loop was blocked (a CPU-bound step of another
task), is armed again for ``outage_s``; one on time still gives the loop
:data:`CONFIRM_TURNS` turns before it judges the call hung, since an answer that came while
the loop was blocked needs a few turns to reach the call. Nor does a call count as hung
while the store is at work on this process's own calls (``at_work``: a SQLite store's
write transaction holds the write lock, a large ``enqueue_many`` say, and every call of
the process waits behind it on the store's one connection): the store is reachable.

Times on these notices are the store clock of the last call that succeeded plus the
monotonic time elapsed since, the nearest this process can tell the store's clock
without it (the process' wall clock until a first call succeeds).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator

from ..contract.monitor import Alert, AlertScope, AlertState

__all__ = ("CONFIRM_TURNS", "STORE_UNREACHABLE", "OutageWatch")

CONFIRM_TURNS = 16
"""Loop turns a watched call's timer gives it, once gone off, to return before it counts as hung.

A store's answer that came while the loop was blocked is handed on one step per turn (the
driver's future, the store call's task, the monitor's), while the timer, due by then, runs
in the first turn.
"""

STORE_UNREACHABLE = "store_unreachable"
"""The rule (and event) name of the notice: ``value`` is the seconds since the store was last
reached, ``count`` the calls that failed since (on the firing notice, with the calls then
unanswered for ``outage_s``), ``threshold`` and ``window_s`` the watch's ``outage_s``."""


class OutageWatch:
    """Whether a monitor's reads or its writes of the store have all failed, or hung, for ``outage_s`` seconds.

    Reads and writes are watched apart: on SQLite a process holding the write lock stops
    every write (and so every claim and commit) while reads still succeed.

    Args:
        process_id: The monitor's process id (the notices' scope key and ``monitor_id``).
        outage_s: Seconds of failed calls of one kind, with none of that kind succeeding,
            that make an outage; also the longest a call watched by :meth:`call` may go
            unanswered.
        on_notice: Called with the firing notice that a timer of :meth:`call` raises (the
            notices of :meth:`reached` and :meth:`failed` are returned to their caller).
        at_work: Whether the store is at work on this process's own calls now (a SQLite
            store's write transaction holding the write lock): a call unanswered meanwhile
            waits for that work, not for the store, and its timer is armed again.
    """

    def __init__(
        self,
        process_id: str,
        outage_s: float,
        on_notice: Callable[[Alert], None] | None = None,
        at_work: Callable[[], bool] | None = None,
    ) -> None:
        self.process_id = process_id
        self.outage_s = outage_s
        self._on_notice = on_notice
        self._at_work = at_work
        self._in_flight: dict[object, tuple[str, float]] = {}  # watched calls: kind, monotonic start
        self._late: set[object] = set()  # the watched calls whose timer went off
        self._timers: dict[object, asyncio.TimerHandle] = {}  # each watched call's timer
        started = time.monotonic()  # the watch starts as if the store had just answered
        self._reached_mono = {"read": started, "write": started}
        self._last_mono = started  # the last call of either kind that succeeded
        self._failing: set[str] = set()  # the kinds whose last call failed
        self._store_now_s: float | None = None  # store clock of the last call that succeeded
        self._failures = 0
        self._firing: Alert | None = None

    @property
    def firing(self) -> Alert | None:
        """The firing notice of the outage under way, or None."""
        return self._firing

    def reached(self, kind: str, store_now_s: float | None) -> Alert | None:
        """A call of ``kind`` (``"read"`` or ``"write"``) succeeded, at ``store_now_s`` (store clock) if it told.

        Returns the resolved notice when an outage was open and the last calls of both
        kinds have now succeeded.
        """
        self._reached_mono[kind] = self._last_mono = time.monotonic()
        if store_now_s is not None:
            self._store_now_s = store_now_s
        self._failing.discard(kind)
        if self._firing is None or self._failing:
            return None
        resolved = self._notice(AlertState.RESOLVED, fired_at=self._firing.fired_at, value=0.0)
        self._firing = None
        self._failures = 0
        return resolved

    def failed(self, kind: str) -> Alert | None:
        """A call of ``kind`` failed: the firing notice when none of its kind succeeded for ``outage_s`` (once)."""
        self._failures += 1
        self._failing.add(kind)
        return self._fire(kind)

    @contextlib.contextmanager
    def call(self, kind: str) -> Iterator[None]:
        """Watch one call of ``kind`` to the store, made in the ``with`` block, while it is in flight.

        Still unanswered after ``outage_s`` (monotonic clock), with no call of ``kind``
        succeeding since it began, it makes an outage: a timer on the running event loop
        marks ``kind`` as failing and hands the firing notice (once per outage) to
        ``on_notice``. The call is not cancelled; the caller still reports its outcome with
        :meth:`reached` or :meth:`failed`.
        """
        key = object()
        started = time.monotonic()
        self._in_flight[key] = (kind, started)
        self._arm(key)
        try:
            yield
        finally:
            self._timers.pop(key).cancel()
            del self._in_flight[key]
            self._late.discard(key)

    def _arm(self, key: object) -> None:
        """(Re)arm the timer of watched call ``key`` for ``outage_s`` from now."""
        loop = asyncio.get_running_loop()
        due = loop.time() + self.outage_s
        self._timers[key] = loop.call_at(due, self._overdue, key, due)

    def _overdue(self, key: object, due: float, turns: int = CONFIRM_TURNS) -> None:
        if key not in self._in_flight:  # the call returned in the turns given
            return
        if turns == CONFIRM_TURNS and asyncio.get_running_loop().time() - due > min(1.0, self.outage_s / 4):
            self._arm(key)  # the loop was blocked: the store's answer could not be seen meanwhile
            return
        if turns > 0:
            asyncio.get_running_loop().call_soon(self._overdue, key, due, turns - 1)
            return
        if self._at_work is not None and self._at_work():
            self._arm(key)  # the call waits behind this process's own transaction: the store answers
            return
        kind, started = self._in_flight[key]
        if self._reached_mono[kind] > started:  # a call of its kind succeeded meanwhile
            return
        self._late.add(key)
        self._failing.add(kind)
        notice = self._fire(kind, hung=True)
        if notice is not None and self._on_notice is not None:
            self._on_notice(notice)

    def _fire(self, kind: str, *, hung: bool = False) -> Alert | None:
        """The firing notice if none is open and no call of ``kind`` succeeded for ``outage_s`` (or one ``hung``)."""
        unreachable_s = time.monotonic() - self._reached_mono[kind]
        if self._firing is not None or (unreachable_s < self.outage_s and not hung):
            return None
        now = self.now_s()
        self._firing = self._notice(AlertState.FIRING, fired_at=now, value=unreachable_s)
        return self._firing

    def _hung(self) -> int:
        """The watched calls unanswered for ``outage_s`` with none of their kind succeeding since they began.

        Told by their timers, not by the clock: an event loop's timer may go off a little early
        (uvloop's clock ticks in milliseconds)."""
        hung = (self._in_flight[key] for key in self._late)
        return sum(1 for kind, started in hung if self._reached_mono[kind] <= started)

    def now_s(self) -> float:
        """The store clock now, as near as this process can tell it without a call (see the module's doc)."""
        if self._store_now_s is None:
            return time.time()
        return self._store_now_s + (time.monotonic() - self._last_mono)

    def _notice(self, state: AlertState, *, fired_at: float, value: float) -> Alert:
        return Alert(
            rule=STORE_UNREACHABLE,
            event=STORE_UNREACHABLE,
            value=value,
            threshold=self.outage_s,
            window_s=self.outage_s,
            at=self.now_s(),
            scope=AlertScope.PROCESS,
            scope_key=self.process_id,
            state=state,
            count=self._failures + (self._hung() if state is AlertState.FIRING else 0),
            fired_at=fired_at,
            monitor_id=self.process_id,
        )
