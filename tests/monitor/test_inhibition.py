"""Inhibition: the incidents a lost node causes open muted, so one incident raises one alert.

Rule-level tests judge :func:`~asynccoord.monitor.rules.decide` on hand-made window counts;
monitor-level tests drive monitors by hand on a fake store clock, on real SQLite and
PostgreSQL, across a change of leader.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
from collections.abc import Mapping, Sequence
from typing import Any

import jsonschema
import pytest
from conftest import MakeStore
from support import FakeClock

from asynccoord import Alert, AlertRule, AlertScope, AlertState, InvalidArgumentError, InvalidTypeError, Monitor
from asynccoord import events as ev
from asynccoord.cli.status import render_status, status_report, status_schema
from asynccoord.contract.monitor import PROCESS_SCOPE, MetricsView
from asynccoord.monitor.inhibition import Inhibitions
from asynccoord.monitor.rules import DEFAULT_RULES, Incident, decide

NODES = AlertRule(name="lost_nodes", event=ev.NODE_LOST, threshold=0, window_s=30.0)
LOCKS = AlertRule(name="lost_locks", event=ev.LOCK_LOST, threshold=0, window_s=20.0, inhibited_by=("lost_nodes",))
DEAD = AlertRule(name="dead_letters", event=ev.DEAD_LETTERED, threshold=0, window_s=20.0)
RULES = (LOCKS, NODES, DEAD)  # the muted rule listed first: inhibitors are judged first all the same


def view(now_s: float, counts: Mapping[float, Mapping[str, int]]) -> MetricsView:
    """Window counts of one process (``window_s -> event -> count``) read at store time ``now_s``."""
    windows = {w: {("proc-a", PROCESS_SCOPE, name): n for name, n in c.items()} for w, c in counts.items()}
    return MetricsView(now_s=now_s, totals={}, windows=windows, latencies={}, processes={}, alerts=())


def judge(
    incidents: dict[tuple[str, str], Incident],
    inhibitions: Inhibitions,
    now_s: float,
    nodes: int = 0,
    locks: int = 0,
    rules: Sequence[AlertRule] = RULES,
) -> list[tuple[str, str, str | None]]:
    """One judgement; its notices as ``(rule, state, inhibited_by)``."""
    counts = {30.0: {ev.NODE_LOST: nodes}, 20.0: {ev.LOCK_LOST: locks}}
    notices, _ = decide(rules, incidents, view(now_s, counts), "proc-a", inhibitions=inhibitions)
    return [(a.rule, a.state.value, a.inhibited_by) for a in notices]


# --- the rule --------------------------------------------------------------------------


def test_inhibited_by_is_checked_and_names_the_value() -> None:
    assert AlertRule(name="x", event=ev.LOCK_LOST, threshold=0, window_s=1.0, inhibited_by="y").inhibited_by == ("y",)
    assert AlertRule(name="x", event=ev.LOCK_LOST, threshold=0, window_s=1.0, inhibited_by=["y"]).inhibited_by == (  # type: ignore[arg-type]
        "y",
    )
    bad: list[tuple[Any, type[Exception], str]] = [
        (7, InvalidTypeError, "inhibited_by must be a rule name or a tuple of rule names, got 7"),
        (("y", 3), InvalidTypeError, r"inhibited_by\[1\]"),
        (("",), InvalidArgumentError, r"inhibited_by\[0\]"),
        (("x",), InvalidArgumentError, "rule 'x' is inhibited_by itself"),
        (("y", "y"), InvalidArgumentError, "names a rule twice"),
    ]
    for value, error, message in bad:
        with pytest.raises(error, match=message):
            AlertRule(name="x", event=ev.LOCK_LOST, threshold=0, window_s=1.0, inhibited_by=value)


def test_a_monitor_refuses_an_inhibitor_it_does_not_judge() -> None:
    with pytest.raises(InvalidArgumentError, match="inhibited_by 'lost_nodes', which is not a rule of this monitor"):
        Monitor(object.__new__(_Store), rules=[LOCKS])
    per_process = dataclasses.replace(NODES, scope=AlertScope.PROCESS)
    with pytest.raises(InvalidArgumentError, match=r"\(scope cluster\) is inhibited_by 'lost_nodes' \(scope process\)"):
        Monitor(object.__new__(_Store), rules=[LOCKS, per_process])
    a = dataclasses.replace(NODES, name="a", inhibited_by=("b",))
    b = dataclasses.replace(NODES, name="b", inhibited_by=("a",))
    with pytest.raises(InvalidArgumentError, match=r"the inhibited_by of rules \['a', 'b'\] make a cycle"):
        Monitor(object.__new__(_Store), rules=[a, b, NODES])
    itself = AlertRule(name="a", event=ev.LOCK_LOST, threshold=0, window_s=1.0)
    object.__setattr__(itself, "inhibited_by", ("a",))  # past the rule's own check
    with pytest.raises(InvalidArgumentError, match="rule 'a' is inhibited_by itself"):
        Monitor(object.__new__(_Store), rules=[itself])
    Monitor(object.__new__(_Store), rules=DEFAULT_RULES)  # the defaults hold together


class _Store:
    """Enough of a store for a Monitor's constructor."""

    async def flush_metrics(self, flush: object) -> float:
        raise NotImplementedError

    async def read_metrics(self, windows_s: object = ()) -> MetricsView:
        raise NotImplementedError


def test_the_defaults_mute_what_a_lost_node_causes() -> None:
    muted = {rule.name for rule in DEFAULT_RULES if rule.inhibited_by == ("lost_nodes",)}
    assert muted == {"lost_leases", "lost_locks", "lease_expiries", "stale_commits", "fencing_rejections"}
    assert all(rule.inhibited_by == () for rule in DEFAULT_RULES if rule.name not in muted)


# --- decide ------------------------------------------------------------------------------


def test_an_incident_opening_with_its_inhibitor_opens_muted_and_never_fires() -> None:
    incidents: dict[tuple[str, str], Incident] = {}
    inhibitions = Inhibitions(RULES)
    # A frozen process: its node is lost and its lock too, in one evaluation.
    assert judge(incidents, inhibitions, 100.0, nodes=1, locks=1) == [
        ("lost_locks", "firing", "lost_nodes"),
        ("lost_nodes", "firing", None),
    ]
    assert incidents[("lost_locks", "")].alert.muted
    assert judge(incidents, inhibitions, 110.0, nodes=1, locks=2) == []
    # lost_nodes resolves; lost_locks still counts: it stays muted, it does not fire now.
    assert judge(incidents, inhibitions, 131.0, nodes=0, locks=2) == [("lost_nodes", "resolved", None)]
    assert judge(incidents, inhibitions, 135.0, nodes=0, locks=3) == []
    assert incidents[("lost_locks", "")].current.inhibited_by == "lost_nodes"
    assert judge(incidents, inhibitions, 140.0, nodes=0, locks=0) == [("lost_locks", "resolved", "lost_nodes")]
    assert incidents == {}


def test_an_incident_opening_just_after_the_inhibitor_resolved_is_muted() -> None:
    incidents: dict[tuple[str, str], Incident] = {}
    inhibitions = Inhibitions(RULES)  # settle_s 5
    assert judge(incidents, inhibitions, 100.0, nodes=1) == [("lost_nodes", "firing", None)]
    assert judge(incidents, inhibitions, 131.0) == [("lost_nodes", "resolved", None)]
    # The node's lock loss is judged 4.9 s later (flushed and read after lost_nodes resolved).
    assert judge(incidents, inhibitions, 135.9, locks=1) == [("lost_locks", "firing", "lost_nodes")]
    assert judge(incidents, inhibitions, 156.0) == [("lost_locks", "resolved", "lost_nodes")]


def test_an_unrelated_incident_after_the_inhibitor_resolved_fires() -> None:
    """A lost lock 45 s after a lost node (lost_nodes resolved 31 s after it) is an incident of its own,
    though within lost_locks' window (20 s) of the resolution."""
    incidents: dict[tuple[str, str], Incident] = {}
    inhibitions = Inhibitions(RULES)
    assert judge(incidents, inhibitions, 100.0, nodes=1) == [("lost_nodes", "firing", None)]
    assert judge(incidents, inhibitions, 131.0) == [("lost_nodes", "resolved", None)]
    assert judge(incidents, inhibitions, 145.0, locks=1) == [("lost_locks", "firing", None)]


def test_a_muted_incident_whose_events_go_on_after_its_cause_fires() -> None:
    """A lost lock during a lost node opens muted; lost locks still coming after it resolved fire."""
    incidents: dict[tuple[str, str], Incident] = {}
    inhibitions = Inhibitions(RULES)
    assert judge(incidents, inhibitions, 100.0, nodes=1, locks=1) == [
        ("lost_locks", "firing", "lost_nodes"),
        ("lost_nodes", "firing", None),
    ]
    assert judge(incidents, inhibitions, 131.0, locks=1) == [("lost_nodes", "resolved", None)]
    # The tail of the window right after lost_nodes resolved: still muted, even with a new event.
    assert judge(incidents, inhibitions, 135.0, locks=2) == []
    assert judge(incidents, inhibitions, 140.0, locks=2) == []  # no new event: stays muted
    assert judge(incidents, inhibitions, 145.0, locks=3) == [("lost_locks", "firing", None)]  # it goes on
    assert not incidents[("lost_locks", "")].alert.muted
    assert judge(incidents, inhibitions, 170.0) == [("lost_locks", "resolved", None)]


def test_an_incident_firing_before_its_inhibitor_is_not_withdrawn() -> None:
    incidents: dict[tuple[str, str], Incident] = {}
    inhibitions = Inhibitions(RULES)
    assert judge(incidents, inhibitions, 100.0, locks=1) == [("lost_locks", "firing", None)]
    assert judge(incidents, inhibitions, 101.0, nodes=1, locks=1) == [("lost_nodes", "firing", None)]
    assert judge(incidents, inhibitions, 121.0, nodes=1) == [("lost_locks", "resolved", None)]


def test_inhibition_matches_the_scope_key() -> None:
    nodes = dataclasses.replace(NODES, scope=AlertScope.PROCESS)
    locks = dataclasses.replace(LOCKS, scope=AlertScope.PROCESS)
    rules = (locks, nodes)
    counts = {
        30.0: {("proc-a", PROCESS_SCOPE, ev.NODE_LOST): 1},
        20.0: {("proc-a", PROCESS_SCOPE, ev.LOCK_LOST): 1, ("proc-b", PROCESS_SCOPE, ev.LOCK_LOST): 1},
    }
    read = MetricsView(now_s=10.0, totals={}, windows=counts, latencies={}, processes={}, alerts=())
    notices, _ = decide(rules, {}, read, "watcher")
    assert [(a.rule, a.scope_key, a.inhibited_by) for a in notices] == [
        ("lost_locks", "proc-a", "lost_nodes"),
        ("lost_locks", "proc-b", None),  # no node lost there
        ("lost_nodes", "proc-a", None),
    ]


def test_a_muted_alert_reads_back_from_json_and_an_old_record_is_not_muted() -> None:
    alert = Alert(
        rule="lost_locks",
        event=ev.LOCK_LOST,
        value=1.0,
        threshold=0.0,
        window_s=60.0,
        at=5.0,
        scope=AlertScope.CLUSTER,
        fired_at=5.0,
        inhibited_by="lost_nodes",
    )
    text = json.dumps(alert.to_dict())
    assert Alert.from_dict(json.loads(text)) == alert
    assert "muted by lost_nodes" in alert.describe()
    old = {k: v for k, v in alert.to_dict().items() if k != "inhibited_by"}  # stored before the field existed
    assert not Alert.from_dict(old).muted


# --- monitors, across a change of leader ------------------------------------------------

SHARED = pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)


def manual(store: Any, process_id: str) -> Monitor:
    return Monitor(store, rules=RULES, background=False, process_id=process_id, log_alerts=False)


@SHARED
async def test_a_new_leader_adopts_a_muted_incident_without_raising_it(make_store: MakeStore, clock: FakeClock) -> None:
    store_a, store_b = await make_store(), await make_store()
    a, b = manual(store_a, "proc-a"), manual(store_b, "proc-b")
    seen: list[tuple[str, str, str]] = []
    for monitor in (a, b):
        monitor.subscribe(lambda alert, m=monitor: seen.append((m.process_id, alert.rule, alert.state.value)))
    async with a, b:
        assert await a.evaluate() == []  # a leads
        await b.flush()
        store_b.events.add(ev.NODE_LOST)  # b's membership saw a's node expire...
        await b.flush()
        assert [(x.rule, x.state) for x in await a.evaluate()] == [("lost_nodes", AlertState.FIRING)]
        clock.advance(1.0)
        store_a.events.add(ev.LOCK_LOST)  # ... and the frozen node's lock is lost when it wakes
        await a.flush()
        assert await a.evaluate() == []  # muted: stored, not published
        assert [x.rule for x in a.active_alerts()] == ["lost_nodes"]
        assert [(x.rule, x.inhibited_by) for x in a.muted_alerts()] == [("lost_locks", "lost_nodes")]
        assert (a.statistics().active_alerts, a.statistics().muted_alerts) == (1, 1)
        report = await status_report(store_b)
        assert [(x["rule"], x["inhibited_by"]) for x in report["alerts"]] == [
            ("lost_nodes", None),
            ("lost_locks", "lost_nodes"),
        ]
        jsonschema.Draft202012Validator(status_schema()).validate(report)
        out = io.StringIO()
        render_status(report, out, color=False)
        assert "Active alerts (1)" in out.getvalue()
        assert "Muted alerts (1, never sent)" in out.getvalue()
        assert "muted by lost_nodes" in out.getvalue()

        clock.advance(6.0)  # a stalls past its leader lease (5 s), not past its stored alerts (10 s)
        assert await b.evaluate() == []  # takes over: adopts both, raises neither
        assert [x.rule for x in b.active_alerts()] == ["lost_nodes"]
        assert [x.rule for x in b.muted_alerts()] == ["lost_locks"]
        clock.advance(16.0)  # lost_locks' window (20 s) empties, then lost_nodes' (30 s)
        await b.flush()
        assert await b.evaluate() == []  # lost_locks resolves muted: no notice
        assert b.muted_alerts() == []
        clock.advance(10.0)
        await b.flush()
        assert [(x.rule, x.state) for x in await b.evaluate()] == [("lost_nodes", AlertState.RESOLVED)]
        store_b.events.add(ev.DEAD_LETTERED)  # a later, unrelated incident fires
        await b.flush()
        assert [(x.rule, x.state) for x in await b.evaluate()] == [("dead_letters", AlertState.FIRING)]
        assert b.muted_alerts() == []
        assert await a.evaluate() == []  # the old leader steps down silently
    await _delivered(seen, 3)
    assert seen == [
        ("proc-a", "lost_nodes", "firing"),
        ("proc-b", "lost_nodes", "resolved"),
        ("proc-b", "dead_letters", "firing"),
    ]


@SHARED
async def test_a_new_leader_learns_that_the_inhibitor_resolved_lately(make_store: MakeStore, clock: FakeClock) -> None:
    """The node's lock is lost after lost_nodes resolved, and after a change of leader: still muted."""
    store_a, store_b = await make_store(), await make_store()
    a, b = manual(store_a, "proc-a"), manual(store_b, "proc-b")
    async with a, b:
        assert await a.evaluate() == []
        store_a.events.add(ev.NODE_LOST)
        await a.flush()
        assert [x.rule for x in await a.evaluate()] == ["lost_nodes"]
        await b.flush()
        clock.advance(31.0)
        await a.flush()
        assert [(x.rule, x.state) for x in await a.evaluate()] == [("lost_nodes", AlertState.RESOLVED)]
        clock.advance(1.0)
        assert await a.evaluate() == []
        await a.flush()
        await b.flush()
        await a.close()  # hands over; its stored alerts stay for the next leader
        store_b.events.add(ev.LOCK_LOST)
        await b.flush()
        assert await b.evaluate() == []  # 1 s after lost_nodes resolved: within settle_s (5 s)
        assert [(x.rule, x.inhibited_by) for x in b.muted_alerts()] == [("lost_locks", "lost_nodes")]
        assert b.statistics().alerts_fired == 0


async def _delivered(seen: list[Any], n: int) -> None:
    """Let the subscriber tasks run until ``n`` notices arrived (they run in tasks of their own)."""
    for _ in range(200):
        if len(seen) >= n:
            return
        await asyncio.sleep(0.01)
