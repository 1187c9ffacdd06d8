"""Inhibition: an incident that follows from another rule's incident opens muted.

A rule names in ``AlertRule.inhibited_by`` the rules whose incidents cause its own, e.g. the
lost locks, lost leases and stale commits that follow a lost node. An incident of it that
would open while an incident of one of those rules is open in the same scope key (the
cluster, the process or the node), or resolved less than ``settle_s`` ago (the time an event
takes to be flushed and judged), opens muted: it is stored (``Alert.inhibited_by``;
``status`` shows it, a new leader adopts it) but not published. So one incident, such as a
frozen process, makes one firing notice and one resolved notice. An incident already open
when its inhibitor opens goes on as it was.

A muted incident stays muted while its events are the tail of its cause: it resolves
without a notice once its window empties. But once no inhibitor mutes it any more, events
of its own that keep coming (some in the last ``settle_s`` seconds, all of them after the
mute ended) are a problem of their own: the incident fires then, unmuted, and is published
like any other. So an unrelated problem that begins during another's incident is late by at
most that incident's life, never silenced for good.

The inhibiting incident may itself be muted: it still stands for the one cause. Inhibitors
are judged before the rules they mute, so an inhibitor opening in the same evaluation mutes
them. The idea is Prometheus Alertmanager's inhibit rules; unlike them, a muted incident
does not fire merely because its cause ended (its window would otherwise make it fire just
after its cause ends, on the cause's own events).

What it cannot tell: a scope key is all it matches on. With the cluster-scoped defaults, an
unrelated lost lock, lost lease or fencing rejection anywhere in the cluster while
``lost_nodes`` fires (up to its window, 60 s, after the last lost node) opens muted too; it
fires only if its events go on after ``lost_nodes`` resolved.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol, TypeVar

from ..contract.monitor import Alert, AlertScope
from ..errors import InvalidArgumentError
from ..validation import check_positive

__all__ = ("Inhibitions", "RuleLike")


class RuleLike(Protocol):
    """What inhibition reads of an :class:`~asynccoord.monitor.rules.AlertRule`."""

    @property
    def name(self) -> str: ...
    @property
    def window_s(self) -> float: ...
    @property
    def scope(self) -> AlertScope: ...
    @property
    def inhibited_by(self) -> tuple[str, ...]: ...


_Rule = TypeVar("_Rule", bound=RuleLike)


class Inhibitions:
    """The inhibit relations of one rule set, and when the incidents of its inhibitors resolved.

    Args:
        rules: The rule set (names unique).
        settle_s: How long after an inhibiting incident resolves it still mutes the incidents
            opening, and how long a muted incident's events must keep coming after that to
            make it fire, seconds (> 0): the time an event takes to be counted, flushed and
            judged. Default 5.

    Raises:
        InvalidArgumentError: a rule is inhibited by itself, by a rule not in ``rules``, by a
            rule of another scope (their scope keys never match), or through a cycle.
    """

    def __init__(self, rules: Sequence[RuleLike], *, settle_s: float = 5.0) -> None:
        self.settle_s = check_positive("settle_s", settle_s)
        by_name = {rule.name: rule for rule in rules}
        for rule in rules:
            for name in rule.inhibited_by:
                other = by_name.get(name)
                if name == rule.name:
                    raise InvalidArgumentError(f"rule {rule.name!r} is inhibited_by itself: it could never fire")
                if other is None:
                    raise InvalidArgumentError(
                        f"rule {rule.name!r} is inhibited_by {name!r}, which is not a rule of this monitor: "
                        f"add it or name one of {sorted(by_name)!r}"
                    )
                if other.scope is not rule.scope:
                    raise InvalidArgumentError(
                        f"rule {rule.name!r} (scope {rule.scope.value}) is inhibited_by {name!r} (scope "
                        f"{other.scope.value}): an inhibiting rule must judge the same scope"
                    )
        _inhibitors_first(rules, strict=True)
        self._horizon_s: dict[str, float] = {}
        for rule in rules:
            for name in rule.inhibited_by:
                self._horizon_s[name] = 2 * self.settle_s  # muting settle_s, then settle_s to judge a wake
        self._resolved_at: dict[tuple[str, str], float] = {}

    def judging_order(self, rules: Sequence[_Rule]) -> list[_Rule]:
        """``rules`` with every inhibitor before the rules it mutes (otherwise as given)."""
        return _inhibitors_first(rules, strict=False)

    def horizon_s(self, name: str) -> float:
        """How long after an incident of rule ``name`` resolves it still counts for inhibition, seconds:
        twice ``settle_s`` (0 for a rule that inhibits none)."""
        return self._horizon_s.get(name, 0.0)

    def muting(self, rule: RuleLike, key: str, incidents: Mapping[tuple[str, str], object], now_s: float) -> str | None:
        """The rule that mutes an incident of ``rule`` opening in scope ``key`` at store time ``now_s``, or None.

        That is the first of ``rule.inhibited_by`` with an open incident in ``incidents`` under
        ``key``, else one whose incident there resolved less than ``settle_s`` ago.
        """
        return self._muting(rule, key, incidents, now_s, self.settle_s)

    def wakes(self, rule: RuleLike, key: str, incidents: Mapping[tuple[str, str], object], now_s: float) -> bool:
        """Whether a muted incident of ``rule`` in ``key`` whose events still come is one of its own now.

        True when no inhibitor mutes it at store time ``now_s`` and none resolved less than
        twice ``settle_s`` ago: events of the last ``settle_s`` seconds all came after the mute
        ended, so they are not its cause's tail.
        """
        return self._muting(rule, key, incidents, now_s, 2 * self.settle_s) is None

    def _muting(
        self, rule: RuleLike, key: str, incidents: Mapping[tuple[str, str], object], now_s: float, after_s: float
    ) -> str | None:
        for name in rule.inhibited_by:
            if (name, key) in incidents:
                return name
        for name in rule.inhibited_by:
            at = self._resolved_at.get((name, key))
            if at is not None and now_s - at < after_s:
                return name
        return None

    def resolved(self, alert: Alert) -> None:
        """Note the resolved notice ``alert`` (published or muted) of an inhibiting rule's incident."""
        if alert.rule in self._horizon_s and not alert.firing:
            key = (alert.rule, alert.scope_key)
            self._resolved_at[key] = max(self._resolved_at.get(key, alert.at), alert.at)

    def learn(self, stored: Iterable[Alert]) -> None:
        """Note the resolved notices among ``stored`` (another leader's, read from the store)."""
        for alert in stored:
            self.resolved(alert)

    def forget(self, now_s: float) -> None:
        """Drop the resolutions that mute nothing any more at store time ``now_s``."""
        for key, at in list(self._resolved_at.items()):
            if now_s - at >= self._horizon_s.get(key[0], 0.0):
                del self._resolved_at[key]


def _inhibitors_first(rules: Sequence[_Rule], *, strict: bool) -> list[_Rule]:
    """A stable topological order of ``rules`` by ``inhibited_by`` (names not in ``rules`` ignored).

    Raises:
        InvalidArgumentError: ``strict`` and the relation has a cycle (then, unless
            ``strict``, the rules of the cycle keep their given order at the end).
    """
    names = {rule.name for rule in rules}
    placed: set[str] = set()
    out: list[_Rule] = []
    waiting = list(rules)
    while waiting:
        ready = [r for r in waiting if all(n in placed or n not in names for n in r.inhibited_by)]
        if not ready:
            if strict:
                stuck = sorted(r.name for r in waiting)
                raise InvalidArgumentError(
                    f"the inhibited_by of rules {stuck!r} make a cycle: break it, an incident of one could "
                    "otherwise mute the incident that mutes it"
                )
            out.extend(waiting)
            break
        first = ready[0]
        out.append(first)
        placed.add(first.name)
        waiting.remove(first)
    return out
