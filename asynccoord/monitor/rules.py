"""Alert rules: a threshold on one event kind over a sliding window, and their evaluation.

An :class:`AlertRule` is judged per scope (the cluster, each process or each node) on
the counts of one window as the store returns them (a
:class:`~asynccoord.contract.monitor.MetricsView`). :func:`decide` turns those counts
into incidents, not samples: a value that rises above ``threshold`` opens one incident
(one firing notice), which stays open without repeats until the value falls to
``threshold * clear_ratio`` or below (one resolved notice). Two thresholds, one to fire
and a lower one to resolve, are the hysteresis of a Schmitt trigger: a value hovering
around the threshold cannot make an alert storm. Without enough throughput to judge a
relative rule (``min_events``), an open incident resolves once its window holds no more
events of its kind. A relative rule opens an incident only while its events still come
(some in the last few seconds, the ``fresh_s`` window of :func:`decide`): as a window
slides past a burst, the events it is relative to may leave it before the burst's own do,
and the ratio of that tail would otherwise open an incident after the burst is over.
A rule may name the rules whose incidents cause its own (``inhibited_by``): its incidents
that follow one of theirs open muted, and fire later only if their events go on after the
cause ended (:mod:`asynccoord.monitor.inhibition`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .. import events as ev
from ..contract.monitor import PROCESS_SCOPE, Alert, AlertScope, AlertState, CounterKey, MetricsView
from ..errors import InvalidArgumentError, InvalidTypeError
from ..validation import check_int, check_name, check_non_negative, check_positive
from .inhibition import Inhibitions

__all__ = ("DEFAULT_RULES", "AlertRule", "Incident", "decide")


def _check_event_name(arg: str, value: object) -> str:
    """Check that ``value`` is one of :data:`asynccoord.events.EVENT_NAMES` (a rule on any
    other name would never fire)."""
    name = check_name(arg, value)
    if name not in ev.EVENT_NAMES:
        raise InvalidArgumentError(f"{arg} must be one of the event names {list(ev.EVENT_NAMES)!r}, got {name!r}")
    return name


def _check_inhibitors(rule: str, value: object) -> tuple[str, ...]:
    """``inhibited_by`` as a tuple of distinct rule names, none of them ``rule``."""
    items: object = (value,) if isinstance(value, str) else value
    if not isinstance(items, tuple | list):
        raise InvalidTypeError(f"inhibited_by must be a rule name or a tuple of rule names, got {value!r}")
    names = tuple(check_name(f"inhibited_by[{i}]", item) for i, item in enumerate(items))
    if rule in names:
        raise InvalidArgumentError(f"rule {rule!r} is inhibited_by itself: it could never fire")
    if len(set(names)) != len(names):
        raise InvalidArgumentError(f"inhibited_by names a rule twice: {list(names)!r}")
    return names


@dataclass(frozen=True, slots=True, kw_only=True)
class AlertRule:
    """A threshold on one event kind over a sliding window.

    Absolute rule (``relative_to`` None): the value is the number of ``event`` events
    in the last ``window_s`` seconds. Relative rule: the value is that number divided by
    the number of ``relative_to`` events in the same window (a ratio, 0.05 = 5 %),
    judged only when the denominator holds at least ``min_events`` events.

    Args:
        name: Unique rule name (1..255 characters), e.g. ``"stale_commits"``.
        event: The event counted: one of :data:`asynccoord.events.EVENT_NAMES`.
        window_s: Sliding window, seconds (> 0; at most the monitor's ``retention_s``).
        threshold: Fires when the value is *above* it (count, or ratio), >= 0.
        relative_to: Denominator event name, or a tuple of names summed (each one of
            :data:`~asynccoord.events.EVENT_NAMES`); None for an absolute rule. Default None.
        min_events: Relative rules: least denominator events in the window for the
            rule to be judged (>= 0). Default 20. Ignored by absolute rules.
        scope: ``"cluster"`` (all processes summed), ``"process"`` (each process) or
            ``"node"`` (each node; needs per-node counters, see :meth:`Monitor.track`).
            Default ``"cluster"``.
        clear_ratio: Hysteresis: a firing incident resolves when the value is at most
            ``threshold * clear_ratio``, in ``[0, 1]``. Default 0.5.
        inhibited_by: Names of the rules whose incidents cause this rule's (a tuple of names, or
            one name): an incident of this rule that would open while one of theirs is open in
            the same scope key, or resolved a few seconds ago, opens muted and is not published;
            it fires later only if its events go on after theirs resolved
            (:mod:`asynccoord.monitor.inhibition`). They must be rules of the same
            monitor, of the same scope, other than this one, without a cycle (checked by
            :class:`~asynccoord.monitor.monitor.Monitor`). Default none.

    Raises:
        InvalidArgumentError, InvalidTypeError: a bad field, naming it and the value.
    """

    name: str
    event: str
    window_s: float
    threshold: float
    relative_to: str | tuple[str, ...] | None = None
    min_events: int = 20
    scope: AlertScope = AlertScope.CLUSTER
    clear_ratio: float = 0.5
    inhibited_by: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_name("name", self.name)
        object.__setattr__(self, "inhibited_by", _check_inhibitors(self.name, self.inhibited_by))
        _check_event_name("event", self.event)
        object.__setattr__(self, "window_s", check_positive("window_s", self.window_s))
        object.__setattr__(self, "threshold", check_non_negative("threshold", self.threshold, maximum=None))
        check_int("min_events", self.min_events, minimum=0)
        ratio = check_non_negative("clear_ratio", self.clear_ratio, maximum=None)
        if ratio > 1:
            raise InvalidArgumentError(f"clear_ratio must be in [0, 1], got {self.clear_ratio!r}")
        object.__setattr__(self, "clear_ratio", ratio)
        relative: object = self.relative_to
        if isinstance(relative, str):
            object.__setattr__(self, "relative_to", (_check_event_name("relative_to", relative),))
        elif relative is not None:
            if not isinstance(relative, tuple) or not relative:
                raise InvalidTypeError(
                    f"relative_to must be an event name, a non-empty tuple of names, or None, got {relative!r}"
                )
            for index, item in enumerate(relative):
                _check_event_name(f"relative_to[{index}]", item)
        scope: object = self.scope
        try:
            object.__setattr__(self, "scope", AlertScope(str(scope)))
        except ValueError:
            raise InvalidArgumentError(f"scope must be one of {[s.value for s in AlertScope]}, got {scope!r}") from None

    @property
    def denominators(self) -> tuple[str, ...] | None:
        """The denominator event names of a relative rule, or None."""
        relative = self.relative_to
        if relative is None:
            return None
        return (relative,) if isinstance(relative, str) else relative


_CAUSED_BY_A_LOST_NODE = ("lost_nodes",)

DEFAULT_RULES: tuple[AlertRule, ...] = (
    AlertRule(
        name="stale_commits",
        event=ev.STALE_COMMIT_REJECTED,
        relative_to=ev.COMMITS,
        threshold=0.05,
        window_s=30.0,
        inhibited_by=_CAUSED_BY_A_LOST_NODE,
    ),
    AlertRule(
        name="fencing_rejections",
        event=ev.FENCING_REJECTED,
        threshold=0,
        window_s=60.0,
        inhibited_by=_CAUSED_BY_A_LOST_NODE,
    ),
    AlertRule(
        name="lease_expiries",
        event=ev.LEASE_EXPIRED,
        relative_to=ev.CLAIMS,
        threshold=0.05,
        window_s=60.0,
        inhibited_by=_CAUSED_BY_A_LOST_NODE,
    ),
    AlertRule(name="lost_leases", event=ev.LEASE_LOST, threshold=0, window_s=60.0, inhibited_by=_CAUSED_BY_A_LOST_NODE),
    AlertRule(name="lost_locks", event=ev.LOCK_LOST, threshold=0, window_s=60.0, inhibited_by=_CAUSED_BY_A_LOST_NODE),
    AlertRule(
        name="lock_contention",
        event=ev.LOCK_CONTENDED,
        relative_to=ev.CLAIMS,
        threshold=0.5,
        window_s=30.0,
        min_events=50,
    ),
    AlertRule(name="retries", event=ev.RETRIES, relative_to=ev.CLAIMS, threshold=0.2, window_s=60.0),
    AlertRule(name="dead_letters", event=ev.DEAD_LETTERED, threshold=0, window_s=60.0),
    AlertRule(name="membership_churn", event=ev.MEMBERSHIP_FLAP, threshold=3, window_s=300.0),
    AlertRule(name="lost_nodes", event=ev.NODE_LOST, threshold=0, window_s=60.0),
    AlertRule(name="provider_rate_limited", event=ev.PROVIDER_RATE_LIMITED, threshold=0, window_s=60.0),
    AlertRule(name="abandoned_sends", event=ev.SEND_ABANDONED, threshold=0, window_s=60.0),
)
"""Rules a :class:`Monitor` uses unless given others: more than 5 % of commits rejected as
stale over 30 s; any fencing rejection, lost lease, lost lock or dead letter in 60 s;
more than 5 % of claims taking an expired lease over 60 s; lock contention on more than
half the claims over 30 s; retries on more than 20 % of the claims over 60 s; more than
3 membership flaps in 5 minutes (``membership_churn``: process lives shorter than 6 heartbeat
TTLs, 30 s by default, as of a process restarting again and again; a rolling restart of any size
counts none, unless it restarts a process twice within that time, or within that time of its
start); any node lost (its heartbeats stopped: a crash, a kill, a
freeze past the TTL) in 60 s; any rate limit a send reported (HTTP 429) in 60 s: a provider
pushing back means the declared rate limits are above its own; any send let go while it
still ran (``abandoned_sends``: it ignored its cancellation past ``send_overrun_s``, past its
cleanup time after a lost lease or lock, or past its node's stop, and its message may go out
again) in 60 s. All cluster-wide. The
ratios are judged only once their window holds 20 commits or claims (50 for lock contention).

A lost node is one incident: ``stale_commits``, ``fencing_rejections``, ``lease_expiries``,
``lost_leases`` and ``lost_locks`` are ``inhibited_by`` ``lost_nodes``, since a process that
crashed or froze past its TTLs makes each of them (its leases and locks lapse, are taken over,
and its writes after it wakes are refused). Their incidents that open while ``lost_nodes``
fires (up to 60 s after the last lost node), or a few seconds after it resolved, are muted;
the other rules' are not (retries, dead letters, contention, churn, rate limits and abandoned
sends have causes of their own). The rules are cluster-wide, so an unrelated lost lock or
fencing rejection in that time is muted too; its incident fires if its events go on after
``lost_nodes`` resolved. A process frozen for longer than that window makes its lost locks and
leases fire when it wakes."""


@dataclass(slots=True)
class Incident:
    """An open incident of one rule in one scope.

    Attributes:
        alert: The firing notice as it was delivered.
        current: The same with the latest measured value (what is stored).
    """

    alert: Alert
    current: Alert


def decide(
    rules: Sequence[AlertRule],
    incidents: dict[tuple[str, str], Incident],
    view: MetricsView,
    monitor_id: str,
    *,
    own_process: str | None = None,
    fresh_s: float | None = None,
    inhibitions: Inhibitions | None = None,
) -> tuple[list[Alert], bool]:
    """Judge every rule on ``view``, opening and closing ``incidents`` in place.

    Args:
        rules: The rules to judge.
        incidents: The open incidents by ``(rule name, scope key)``; updated in place.
        view: The window counts read from the store (``view.windows`` holds each rule's
            ``window_s``; ``view.now_s`` is the store clock of the read).
        monitor_id: The judging monitor's process id (``Alert.monitor_id``).
        own_process: Judge the ``process`` and ``node`` rules on this process' counters
            only (each monitor judges its own process); None judges every process.
        fresh_s: A window of ``view.windows`` (seconds): a relative rule with a longer
            window opens an incident only when its event counts some there (its events
            still come), and a muted incident no longer muted fires only then. None: no such
            condition (a muted incident then fires when its count rose since the last call).
        inhibitions: The inhibit relations of the monitor's rules, with the resolutions of
            their inhibitors (updated in place). None: those of ``rules``, with no memory of
            incidents resolved before this call.

    Returns:
        ``(notices, changed)``: the firing and resolved notices this judgement produced, in
        the order of ``rules``, and whether an open incident's measured value changed (its
        stored state is then out of date). The notices of muted incidents are among them,
        ``inhibited_by`` set: their state is stored, but they are not to be published. A
        muted incident that fires later gives a firing notice without ``inhibited_by``.

    Raises:
        InvalidArgumentError: ``inhibitions`` is None and the ``inhibited_by`` of ``rules`` are
            inconsistent (see :class:`~asynccoord.monitor.inhibition.Inhibitions`).
    """
    changed = False
    notices: list[tuple[int, Alert]] = []
    muter = Inhibitions(rules) if inhibitions is None else inhibitions
    muter.forget(view.now_s)
    position = {rule.name: n for n, rule in enumerate(rules)}
    for rule in muter.judging_order(rules):  # inhibitors first: one opening now mutes at once
        index = position[rule.name]
        groups = _group_counts(rule.scope, view.windows.get(rule.window_s, {}), own_process)
        keys = set(groups) | {key for (name, key) in incidents if name == rule.name}
        fresh = None
        if fresh_s is not None and rule.denominators is not None and rule.window_s > fresh_s:
            fresh = _group_counts(rule.scope, view.windows.get(fresh_s, {}), own_process)
        for key in sorted(keys):
            counts = groups.get(key, {})
            count = counts.get(rule.event, 0)
            denominators = rule.denominators
            if denominators is None:
                base: int | None = None
                value = float(count)
                judged = True
            else:
                base = sum(counts.get(name, 0) for name in denominators)
                value = count / base if base else 0.0
                judged = base >= max(1, rule.min_events)
            incident = incidents.get((rule.name, key))
            measured = Alert(
                rule=rule.name,
                event=rule.event,
                value=value,
                threshold=rule.threshold,
                window_s=rule.window_s,
                at=view.now_s,
                scope=rule.scope,
                scope_key=key,
                state=AlertState.FIRING,
                relative_to=denominators,
                count=count,
                base=base,
                fired_at=view.now_s,
                monitor_id=monitor_id,
            )
            coming = fresh is None or fresh.get(key, {}).get(rule.event, 0) > 0
            if incident is None:
                if judged and value > rule.threshold and coming:
                    muted = muter.muting(rule, key, incidents, view.now_s)
                    opened = dataclasses.replace(measured, inhibited_by=muted)
                    incidents[(rule.name, key)] = Incident(alert=opened, current=opened)
                    notices.append((index, opened))
                continue
            began, muted = incident.alert.fired_at, incident.alert.inhibited_by
            cleared = value <= rule.threshold * rule.clear_ratio if judged else count == 0
            if muted is not None and not cleared and muter.wakes(rule, key, incidents, view.now_s):
                recent = _recent(rule, key, view, fresh_s, own_process, count - incident.current.count)
                if recent and judged and value > rule.threshold:  # its own events keep coming: it fires now
                    opened = dataclasses.replace(measured, inhibited_by=None)
                    incidents[(rule.name, key)] = Incident(alert=opened, current=opened)
                    notices.append((index, opened))
                    continue
            if cleared:
                del incidents[(rule.name, key)]
                closed = dataclasses.replace(measured, state=AlertState.RESOLVED, fired_at=began, inhibited_by=muted)
                muter.resolved(closed)
                notices.append((index, closed))
            else:
                incident.current = dataclasses.replace(measured, fired_at=began, inhibited_by=muted)
                changed = True
    notices.sort(key=lambda item: item[0])  # stable: a rule's notices keep their order
    return [alert for _, alert in notices], changed


def _recent(
    rule: AlertRule, key: str, view: MetricsView, fresh_s: float | None, own_process: str | None, rise: int
) -> bool:
    """Whether events of ``rule`` came in ``key`` lately: some in the ``fresh_s`` window, or (without
    one) its count in the rule's window rose by ``rise`` since the last judgement."""
    if fresh_s is None or fresh_s not in view.windows:
        return rise > 0
    counts = _group_counts(rule.scope, view.windows[fresh_s], own_process)
    return counts.get(key, {}).get(rule.event, 0) > 0


def _group_counts(
    scope: AlertScope, counts: Mapping[CounterKey, int], own_process: str | None
) -> dict[str, dict[str, int]]:
    """Window counts grouped by the rule's scope: scope key -> event name -> count."""
    out: dict[str, dict[str, int]] = {}
    for (pid, where, name), value in counts.items():
        if own_process is not None and scope is not AlertScope.CLUSTER and pid != own_process:
            continue
        if scope is AlertScope.NODE:
            if where == PROCESS_SCOPE:
                continue
            key = where
        else:
            if where != PROCESS_SCOPE:
                continue
            key = "" if scope is AlertScope.CLUSTER else pid
        group = out.setdefault(key, {})
        group[name] = group.get(name, 0) + value
    return out
