"""Inhibition: an incident that follows from another rule's incident opens muted.

A rule names in ``AlertRule.inhibited_by`` the rules whose incidents cause its own, e.g. the
lost locks, lost leases and stale commits that follow a lost node. An incident of it that
would open while an incident of one of those rules is open in the same scope key (the
cluster, the process or the node), or resolved less than the muted rule's ``window_s`` ago,
opens muted: it is stored (``Alert.inhibited_by``; ``status`` shows it, a new leader adopts
it) but never published, neither when it opens nor when it resolves, nor later in its life.
So one incident, such as a frozen process, makes one firing notice and one resolved notice.
An incident already open when its inhibitor opens goes on as it was.

The inhibiting incident may itself be muted: it still stands for the one cause. Inhibitors
are judged before the rules they mute, so an inhibitor opening in the same evaluation mutes
them. The idea is Prometheus Alertmanager's inhibit rules; unlike them, an incident muted
once never fires later (its window would otherwise make it fire just after its cause ends).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol, TypeVar

from ..contract.monitor import Alert, AlertScope
from ..errors import InvalidArgumentError

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

    Raises:
        InvalidArgumentError: a rule is inhibited by itself, by a rule not in ``rules``, by a
            rule of another scope (their scope keys never match), or through a cycle.
    """

    def __init__(self, rules: Sequence[RuleLike]) -> None:
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
                self._horizon_s[name] = max(self._horizon_s.get(name, 0.0), rule.window_s)
        self._resolved_at: dict[tuple[str, str], float] = {}

    def judging_order(self, rules: Sequence[_Rule]) -> list[_Rule]:
        """``rules`` with every inhibitor before the rules it mutes (otherwise as given)."""
        return _inhibitors_first(rules, strict=False)

    def horizon_s(self, name: str) -> float:
        """How long after an incident of rule ``name`` resolves it still mutes: the longest
        ``window_s`` of the rules it inhibits, seconds (0 for a rule that inhibits none)."""
        return self._horizon_s.get(name, 0.0)

    def muting(self, rule: RuleLike, key: str, incidents: Mapping[tuple[str, str], object], now_s: float) -> str | None:
        """The rule that mutes an incident of ``rule`` opening in scope ``key`` at store time ``now_s``, or None.

        That is the first of ``rule.inhibited_by`` with an open incident in ``incidents`` under
        ``key``, else one whose incident there resolved less than ``rule.window_s`` ago.
        """
        for name in rule.inhibited_by:
            if (name, key) in incidents:
                return name
        for name in rule.inhibited_by:
            at = self._resolved_at.get((name, key))
            if at is not None and now_s - at < rule.window_s:
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
