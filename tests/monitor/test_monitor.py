"""The conflict monitor: flushed counters, sliding windows, rules, incidents and delivery.

Most tests drive the monitor by hand (``background=False``: ``flush()`` then
``evaluate()``) on a fake store clock, so windows and incidents are exact; they run on
every backend (the ``store`` fixture). A few run the background loops in real time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import logging
import math
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import MakeStore
from support import FakeClock

from asynccoord import (
    Alert,
    AlertRule,
    AlertScope,
    AlertState,
    InvalidArgumentError,
    InvalidTypeError,
    LeaseLostError,
    MemoryStore,
    Monitor,
    NewTask,
    PayloadTooLargeError,
    SQLiteStore,
    StoreBusyError,
    StoreConfig,
    Task,
)
from asynccoord import events as ev
from asynccoord.cli.status import rate_header, render_status, status_report
from asynccoord.contract.monitor import RETIRED_PROCESS_ID, MetricsFlush, MonitorStore, open_alerts
from asynccoord.monitor.monitor import LEADER_LOCK
from asynccoord.monitor.rules import DEFAULT_RULES
from asynccoord.monitor.snapshot import cluster_snapshot
from asynccoord.validation import MAX_DURATION_S

Store = MemoryStore | SQLiteStore

STALE_RULE = AlertRule(
    name="stale_commits",
    event=ev.STALE_COMMIT_REJECTED,
    relative_to=ev.COMMITS,
    threshold=0.05,
    window_s=10.0,
    min_events=20,
    clear_ratio=0.5,
)


def manual(store: Store, rules: Sequence[AlertRule], **kwargs: Any) -> Monitor:
    return Monitor(store, rules=rules, background=False, process_id=kwargs.pop("process_id", "proc-a"), **kwargs)


# --- rules -------------------------------------------------------------------------------


def test_rule_validation_names_the_field() -> None:
    with pytest.raises(InvalidArgumentError, match="clear_ratio"):
        AlertRule(name="r", event=ev.CLAIMS, window_s=1, threshold=1, clear_ratio=1.5)
    with pytest.raises(InvalidArgumentError, match="window_s"):
        AlertRule(name="r", event=ev.CLAIMS, window_s=0, threshold=1)
    with pytest.raises(InvalidArgumentError, match="threshold"):
        AlertRule(name="r", event=ev.CLAIMS, window_s=1, threshold=-1)
    with pytest.raises(InvalidArgumentError, match="scope"):
        AlertRule(name="r", event=ev.CLAIMS, window_s=1, threshold=1, scope="galaxy")  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match="relative_to"):
        AlertRule(name="r", event=ev.CLAIMS, window_s=1, threshold=1, relative_to=())
    rule = AlertRule(name="r", event=ev.CLAIMS, window_s=1, threshold=1, relative_to="commits", scope="process")  # type: ignore[arg-type]
    assert rule.denominators == ("commits",)
    assert rule.scope is AlertScope.PROCESS
    assert len({r.name for r in DEFAULT_RULES}) == len(DEFAULT_RULES)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"event": "stale_commits"}, "event must be one of the event names"),
        ({"event": "Claims"}, "got 'Claims'"),
        ({"relative_to": "commit"}, "relative_to must be one of the event names"),
        ({"relative_to": ("claims", "comits")}, "relative_to[1] must be one of the event names"),
    ],
)
def test_rule_with_an_unknown_event_name_is_refused(kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"name": "r", "event": ev.CLAIMS, "window_s": 1, "threshold": 1} | kwargs
    with pytest.raises(InvalidArgumentError, match=re.escape(message)) as info:
        AlertRule(**args)
    for name in ev.EVENT_NAMES:  # the message lists every valid name
        assert repr(name) in str(info.value)


def test_every_event_name_makes_a_rule() -> None:
    for name in ev.EVENT_NAMES:
        rule = AlertRule(name=f"r_{name}", event=name, relative_to=tuple(ev.EVENT_NAMES), window_s=1, threshold=0)
        assert rule.event == name


@pytest.mark.parametrize("rules", [5, True, 1.5, "stale", b"x"])
def test_monitor_refuses_rules_that_are_no_sequence(rules: Any) -> None:
    with pytest.raises(InvalidTypeError, match="rules must be a sequence of AlertRule"):
        Monitor(MemoryStore(), rules=rules)


async def test_a_monitor_with_intervals_near_a_year_still_flushes() -> None:
    """Its alerts' TTL (three intervals) is capped at the longest duration a store takes, so a
    long evaluate interval that the constructor accepts does not make every flush fail."""
    async with MemoryStore() as store:
        monitor = Monitor(store, rules=[], evaluate_interval_s=2e7, retention_s=3e7, background=False)
        assert monitor.alert_ttl_s == MAX_DURATION_S
        assert await monitor.flush(force=True) is not None


def test_monitor_validation() -> None:
    store = MemoryStore()
    with pytest.raises(InvalidArgumentError, match="unique"):
        Monitor(store, rules=[STALE_RULE, STALE_RULE])
    with pytest.raises(InvalidArgumentError, match="retention_s"):
        Monitor(store, rules=[dataclasses.replace(STALE_RULE, window_s=1000.0)], retention_s=900.0)
    with pytest.raises(InvalidTypeError, match="MonitorStore"):
        Monitor(object())
    with pytest.raises(InvalidTypeError, match="AlertRule"):
        Monitor(store, rules=["stale"])  # type: ignore[list-item]
    with pytest.raises(InvalidArgumentError, match=r"flush_interval_s must be <= 31536000 seconds"):
        Monitor(store, rules=[], flush_interval_s=1e308)
    with pytest.raises(InvalidArgumentError, match=r"flush_interval_s=31536000.0 > retention_s=900.0"):
        Monitor(store, rules=[], flush_interval_s=31536000.0)
    with pytest.raises(InvalidArgumentError, match=r"retention_s must be finite"):
        Monitor(store, rules=[], retention_s=math.inf)
    with pytest.raises(InvalidArgumentError, match=r"store_outage_s must be finite"):
        Monitor(store, rules=[], store_outage_s=math.nan)
    with pytest.raises(InvalidArgumentError, match=r"store_outage_s must be > 0"):
        Monitor(store, rules=[], store_outage_s=0)
    with pytest.raises(InvalidArgumentError, match=r"window_s must be <= 31536000 seconds"):
        AlertRule(name="r", event=ev.CLAIMS, window_s=1e10, threshold=1)
    assert AlertRule(name="r", event=ev.CLAIMS, window_s=1, threshold=1e12).threshold == 1e12  # not a duration


async def test_monitor_refuses_an_info_no_flush_could_write(tmp_path: Path) -> None:
    """Checked at construction: before, each flush failed (logged, never raised) and the
    process never showed in the cluster's totals."""
    async with SQLiteStore(str(tmp_path / "m.db"), config=StoreConfig(max_payload_bytes=1000)) as store:
        for info, error, message in (
            ({"x": object()}, InvalidTypeError, "info is not JSON-serializable"),
            ({"x": math.nan}, InvalidArgumentError, "info is not valid JSON"),
            ({"x": "y" * 1000}, PayloadTooLargeError, "info encodes to .* over the limit of 1000 bytes"),
        ):
            with pytest.raises(error, match=message):
                Monitor(store, info=info)
        async with manual(store, [], info={"team": "bots"}) as monitor:
            await monitor.flush()
        (report,) = (await cluster_snapshot(store)).processes
        assert (report.process_id, report.info["team"]) == ("proc-a", "bots")


@pytest.mark.parametrize(
    ("nodes", "error", "message"),
    [
        ("8", InvalidTypeError, r"info\['nodes'\] must be an int, got str '8'"),
        (-1, InvalidArgumentError, r"info\['nodes'\] must be >= 0, got -1"),
        (True, InvalidTypeError, r"info\['nodes'\] must be an int, got bool True"),
        (2.0, InvalidTypeError, r"info\['nodes'\] must be an int, got float 2.0"),
        (None, InvalidTypeError, r"info\['nodes'\] must be an int, got NoneType None"),
    ],
)
async def test_monitor_refuses_an_info_nodes_that_is_no_count(
    store: Store, clock: FakeClock, nodes: object, error: type[Exception], message: str
) -> None:
    """``info["nodes"]`` drives how ``status`` judges the process live: an int >= 0, or absent."""
    with pytest.raises(error, match=message):
        Monitor(store, info={"nodes": nodes})
    assert (await cluster_snapshot(store)).processes == ()  # nothing written
    async with manual(store, [], info={"nodes": 0}) as monitor:
        await monitor.flush()
    (report,) = (await cluster_snapshot(store)).processes
    assert report.info["nodes"] == 0


async def test_one_monitor_per_store(store: Store) -> None:
    async with manual(store, []):
        with pytest.raises(InvalidArgumentError, match="already has an open Monitor"):
            await manual(store, [], process_id="proc-b").start()
    async with manual(store, [], process_id="proc-c"):
        pass  # free again after close


# --- the store primitives --------------------------------------------------------------


async def test_flush_adds_deltas_into_windows_and_totals(store: Store, clock: FakeClock) -> None:
    assert isinstance(store, MonitorStore)
    await store.flush_metrics(MetricsFlush(process_id="p1", counters={("", ev.COMMITS): 5, ("", ev.CLAIMS): 0}))
    clock.advance(5.0)
    await store.flush_metrics(MetricsFlush(process_id="p2", counters={("", ev.COMMITS): 3, ("node-1", ev.COMMITS): 3}))
    clock.advance(1.0)
    view = await store.read_metrics([2.0, 10.0])
    assert view.totals == {("p1", "", ev.COMMITS): 5, ("p2", "", ev.COMMITS): 3, ("p2", "node-1", ev.COMMITS): 3}
    assert view.windows[2.0] == {("p2", "", ev.COMMITS): 3, ("p2", "node-1", ev.COMMITS): 3}
    assert view.windows[10.0][("p1", "", ev.COMMITS)] == 5
    assert sorted(view.processes) == ["p1", "p2"]
    assert view.processes["p1"].last_flush_age_s == pytest.approx(6.0)
    snapshot = await cluster_snapshot(store, [2.0, 10.0])
    assert snapshot.totals == {ev.COMMITS: 8}  # node rows are a breakdown, not added again
    assert snapshot.node_totals == {"node-1": {ev.COMMITS: 3}}
    # The counts begin at p1's first flush, 6 s ago: the 10 s window has 6 s of data.
    assert snapshot.window(10.0).span_s == pytest.approx(6.0)
    assert snapshot.window(10.0).rates_per_s[ev.COMMITS] == pytest.approx(8 / 6)


async def test_old_buckets_are_purged_and_silent_processes_retired(store: Store, clock: FakeClock) -> None:
    await store.flush_metrics(MetricsFlush(process_id="old", counters={("", ev.COMMITS): 7, ("n", ev.COMMITS): 7}))
    clock.advance(120.0)
    await store.flush_metrics(MetricsFlush(process_id="new", counters={("", ev.COMMITS): 1}, retention_s=60.0))
    view = await store.read_metrics([1000.0])
    assert view.windows[1000.0] == {("new", "", ev.COMMITS): 1}  # the old bucket is gone
    assert view.totals[("old", "", ev.COMMITS)] == 7  # totals outlive the buckets
    clock.advance(24 * 3600.0 + 1)
    await store.flush_metrics(MetricsFlush(process_id="new", counters={("", ev.COMMITS): 1}))
    view = await store.read_metrics([10.0])
    assert view.totals == {(RETIRED_PROCESS_ID, "", ev.COMMITS): 7, ("new", "", ev.COMMITS): 2}
    assert sorted(view.processes) == ["new"]


async def test_stored_alerts_are_replaced_and_expire(store: Store, clock: FakeClock) -> None:
    alert = Alert(rule="r", event="e", value=3.0, threshold=1.0, window_s=10.0, at=clock.now, scope=AlertScope.CLUSTER)
    await store.flush_metrics(MetricsFlush(process_id="m1", alerts=[alert], alert_ttl_s=10.0))
    await store.flush_metrics(MetricsFlush(process_id="m2", alerts=[alert], alert_ttl_s=10.0))
    assert len((await store.read_metrics([1.0])).alerts) == 2
    await store.flush_metrics(MetricsFlush(process_id="m2", alerts=[]))
    assert [a.rule for a in (await store.read_metrics([1.0])).alerts] == ["r"]
    clock.advance(10.0)
    assert (await store.read_metrics([1.0])).alerts == ()


async def test_flush_validation(store: Store) -> None:
    with pytest.raises(InvalidArgumentError, match="delta"):
        MetricsFlush(process_id="p", counters={("", "x"): -1})
    with pytest.raises(InvalidTypeError, match="flush"):
        await store.flush_metrics({"process_id": "p"})  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="windows_s"):
        await store.read_metrics([0.0])


async def test_latency_histograms_merge_across_processes(store: Store) -> None:
    store.latencies.observe("claim_ms", 2.0)
    async with manual(store, [], process_id="p1") as monitor:
        await monitor.flush()
        store.latencies.observe("claim_ms", 8.0)
        await monitor.flush()
    other = store.latencies.snapshot()["claim_ms"]
    await store.flush_metrics(MetricsFlush(process_id="p2", latencies={"claim_ms": other}))
    view = await store.read_metrics([60.0])
    merged = view.latencies[60.0]["claim_ms"]
    assert merged.count == 4
    assert merged.sum_ms == pytest.approx(20.0)


# --- the scripted conflict storm --------------------------------------------------------


async def drive_second(store: Store, *, commits: int, stale: int) -> None:
    """One simulated second of work: ``commits`` tasks committed, ``stale`` of them first
    presented once with a stale lease token (rejected, counted as stale_commit_rejected)."""
    await store.enqueue_many([NewTask(queue="storm") for _ in range(commits)])
    tasks: list[Task] = await store.claim("storm", node_id="node-1", limit=commits)
    assert len(tasks) == commits
    if stale:
        rejected = await store.complete_many([dataclasses.replace(t, lease_token="stale-lease") for t in tasks[:stale]])
        assert all(isinstance(r, LeaseLostError) for r in rejected)
    done = await store.complete_many(tasks)
    assert all(isinstance(d, Task) for d in done)


async def test_conflict_storm_gives_one_alert_and_one_resolved_notice(
    store: Store, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """10 quiet seconds, 20 seconds with 10 % of commits rejected as stale, 20 quiet seconds.

    With 20 commits a second and a 10 s window, the window at second s holds k storm
    seconds and the ratio is k/100: it first exceeds 5 % at k = 6 (s = 15, value 0.06),
    and falls to 2.5 % or below at k = 2 (s = 37, value 0.02).
    """
    caplog.set_level(logging.WARNING, logger="asynccoord.monitor.monitor")
    start = clock.now
    notices: list[tuple[int, Alert]] = []
    async with manual(store, [STALE_RULE]) as monitor:
        stream = monitor.alerts()
        for second in range(50):
            await drive_second(store, commits=20, stale=2 if 10 <= second < 30 else 0)
            await monitor.flush()
            notices.extend((second, alert) for alert in await monitor.evaluate())
            if second == 20:
                assert [a.rule for a in monitor.active_alerts()] == ["stale_commits"]
            clock.advance(1.0)
        assert monitor.active_alerts() == []
        stats = monitor.statistics()
    assert [(s, a.state) for s, a in notices] == [(15, AlertState.FIRING), (37, AlertState.RESOLVED)]
    fired, resolved = notices[0][1], notices[1][1]
    assert fired.value == pytest.approx(0.06)
    assert (fired.count, fired.base) == (12, 200)
    assert fired.at == fired.fired_at == start + 15
    assert fired.scope is AlertScope.CLUSTER
    assert fired.relative_to == (ev.COMMITS,)
    assert resolved.value == pytest.approx(0.02)
    assert resolved.at == start + 37
    assert resolved.fired_at == fired.at
    assert (stats.alerts_fired, stats.alerts_resolved) == (1, 1)
    assert [a async for a in stream] == [fired, resolved]  # the stream ended when the monitor closed
    firing_logs = [r for r in caplog.records if "asynccoord.monitor.alert_firing" in r.getMessage()]
    resolved_logs = [r for r in caplog.records if "asynccoord.monitor.alert_resolved" in r.getMessage()]
    assert len(firing_logs) == len(resolved_logs) == 1
    assert firing_logs[0].levelno == logging.WARNING
    assert "value=0.06" in firing_logs[0].getMessage()


async def test_relative_rule_needs_min_events_and_resolves_when_quiet(store: Store, clock: FakeClock) -> None:
    rule = dataclasses.replace(STALE_RULE, min_events=50)
    async with manual(store, [rule]) as monitor:
        await drive_second(store, commits=10, stale=5)  # 50 % but only 10 commits: not judged
        await monitor.flush()
        assert await monitor.evaluate() == []
        await drive_second(store, commits=40, stale=10)
        await monitor.flush()
        (fired,) = await monitor.evaluate()
        assert fired.value == pytest.approx(15 / 50)
        clock.advance(60.0)  # traffic stops: the window empties
        await monitor.flush()
        (resolved,) = await monitor.evaluate()
        assert resolved.state is AlertState.RESOLVED
        assert resolved.count == 0


async def test_a_relative_rule_opens_no_incident_on_the_tail_of_a_window_after_its_events_stopped(
    store: Store, clock: FakeClock
) -> None:
    """Claims, then a few retries under the threshold, then nothing: the window slides past the claims first.

    The retries' ratio in the 30 s window rises as the claims leave it (15 of 90, then of
    30), but no retry came in the last seconds: no incident. Retries coming again above the
    threshold open one at once.
    """
    rule = AlertRule(name="retries", event=ev.RETRIES, relative_to=ev.CLAIMS, threshold=0.2, window_s=30.0)
    notices: list[Alert] = []
    async with manual(store, [rule]) as monitor:
        await store.flush_metrics(MetricsFlush(process_id="p1", counters={("", ev.CLAIMS): 60}))
        notices += await monitor.evaluate()
        clock.advance(10.0)
        await store.flush_metrics(MetricsFlush(process_id="p1", counters={("", ev.CLAIMS): 30, ("", ev.RETRIES): 15}))
        for _ in range(29):  # the first claims leave the window at 30 s, the retries at 40 s
            notices += await monitor.evaluate()
            clock.advance(1.0)
        view = await store.read_metrics((30.0,))
        counts = view.windows[30.0]
        assert counts[("p1", "", ev.CLAIMS)] == 30  # the tail: 15 retries of 30 claims, 0.5
        assert counts[("p1", "", ev.RETRIES)] == 15
        assert notices == []
        await store.flush_metrics(MetricsFlush(process_id="p1", counters={("", ev.CLAIMS): 30, ("", ev.RETRIES): 15}))
        (fired,) = await monitor.evaluate()  # retries coming again: 30 of 60 claims
        assert fired.state is AlertState.FIRING
        assert (fired.count, fired.base) == (30, 60)


async def test_a_relative_rule_fires_on_a_steady_rate_whose_base_falls_and_at_a_monitors_start(
    store: Store, clock: FakeClock
) -> None:
    """5 retries a second all along while claims fall from 100 to 10 a second; then a new monitor.

    The window's retry count stays flat (50), its claims fall: the ratio crosses 20 % and
    the rule fires, since retries still come. A monitor started while the ratio is
    already high fires at its first judgement.
    """
    rule = AlertRule(name="retries", event=ev.RETRIES, relative_to=ev.CLAIMS, threshold=0.2, window_s=10.0)
    fired_at: list[int] = []
    async with manual(store, [rule]) as monitor:
        for second in range(40):
            claims = 100 if second < 10 else 10
            await store.flush_metrics(
                MetricsFlush(process_id="p1", counters={("", ev.CLAIMS): claims, ("", ev.RETRIES): 5})
            )
            fired_at += [second for alert in await monitor.evaluate() if alert.firing]
            clock.advance(1.0)
    assert len(fired_at) == 1
    assert 10 < fired_at[0] < 20
    other = dataclasses.replace(rule, name="retries_b")  # a rule no monitor judged: no incident to take over
    async with manual(store, [other], process_id="proc-b") as late:
        await store.flush_metrics(MetricsFlush(process_id="p1", counters={("", ev.CLAIMS): 10, ("", ev.RETRIES): 5}))
        (alert,) = await late.evaluate()
        assert (alert.rule, alert.state) == ("retries_b", AlertState.FIRING)


async def test_absolute_rule_per_process_scope(store: Store, clock: FakeClock) -> None:
    rule = AlertRule(name="lost", event=ev.LEASE_LOST, threshold=2, window_s=30.0, scope=AlertScope.PROCESS)
    await store.flush_metrics(MetricsFlush(process_id="proc-b", counters={("", ev.LEASE_LOST): 2}))
    async with manual(store, [rule]) as monitor:
        store.events.add(ev.LEASE_LOST, 3)
        await monitor.flush()
        (alert,) = await monitor.evaluate()
        assert (alert.scope, alert.scope_key, alert.value, alert.count) == (AlertScope.PROCESS, "proc-a", 3.0, 3)
        assert alert.base is None
        assert "lost" in alert.describe()


async def test_node_scope_uses_tracked_counters(store: Store) -> None:
    rule = AlertRule(name="node_lost_locks", event=ev.LOCK_LOST, threshold=0, window_s=30.0, scope=AlertScope.NODE)
    node_a, node_b = ev.EventCounter(), ev.EventCounter()
    async with manual(store, [rule]) as monitor:
        monitor.track("node-a", node_a)
        monitor.track("node-b", node_b)
        node_b.add(ev.LOCK_LOST)
        store.events.add(ev.LOCK_LOST)
        await monitor.flush()
        (alert,) = await monitor.evaluate()
        assert (alert.scope, alert.scope_key) == (AlertScope.NODE, "node-b")
        snapshot = await monitor.snapshot()
        assert snapshot.totals[ev.LOCK_LOST] == 1
        assert snapshot.node_totals == {"node-b": {ev.LOCK_LOST: 1}}


async def test_a_separate_lock_store_counts_in_the_process_totals(store: Store) -> None:
    """Runtime(lock_store=...) puts lock events on the lock store's counter: the monitor adds them."""
    from asynccoord import LockPool, LockTimeoutError

    rule = AlertRule(name="contention", event=ev.LOCK_CONTENDED, threshold=0, window_s=30.0)
    async with MemoryStore() as locks:
        first = LockPool(locks, ttl_s=5.0, holder="a")
        second = LockPool(locks, ttl_s=5.0, holder="b")
        async with first.turn("account:1", timeout_s=1.0, on_lost=lambda _exc: None):
            with pytest.raises(LockTimeoutError):
                async with second.turn("account:1", timeout_s=0.2, on_lost=lambda _exc: None):
                    pass
        contended = locks.events.snapshot()[ev.LOCK_CONTENDED]
        assert contended >= 1
        assert ev.LOCK_CONTENDED not in store.events.snapshot()  # not the queue store's
        store.events.add(ev.COMMITS, 2)
        async with manual(store, [rule], lock_store=locks) as monitor:
            await monitor.flush()
            snapshot = await monitor.snapshot()
            assert snapshot.totals[ev.LOCK_CONTENDED] == contended
            assert snapshot.totals[ev.COMMITS] == 2
            (alert,) = await monitor.evaluate()
            assert alert.rule == "contention"
            locks.events.add(ev.LOCK_LOST)  # later events go out as deltas, summed again
            await monitor.flush(force=True)
            assert (await monitor.snapshot()).totals[ev.LOCK_LOST] == 1
            assert (await monitor.snapshot()).totals[ev.LOCK_CONTENDED] == contended
    with pytest.raises(InvalidTypeError, match="lock_store"):
        manual(store, [rule], lock_store=object())


async def test_a_lock_store_counted_by_one_monitor_cannot_be_counted_by_another(store: Store) -> None:
    async with MemoryStore() as locks, manual(store, [], lock_store=locks):
        with pytest.raises(InvalidArgumentError, match="already has an open Monitor"):
            async with manual(locks, []):
                pass
        async with MemoryStore() as other:
            with pytest.raises(InvalidArgumentError, match="already has an open Monitor"):
                async with manual(other, [], lock_store=locks, process_id="proc-b"):
                    pass
            async with manual(other, [], process_id="proc-b"):  # its own events only: fine
                pass
    async with MemoryStore() as locks:  # closed monitors give their stores back
        async with manual(store, [], lock_store=locks):
            pass
        async with manual(locks, []):
            pass


async def test_firing_alerts_are_stored_for_other_processes(store: Store, clock: FakeClock) -> None:
    rule = AlertRule(name="dead", event=ev.DEAD_LETTERED, threshold=0, window_s=30.0)
    async with manual(store, [rule]) as monitor:
        store.events.add(ev.DEAD_LETTERED, 4)
        await monitor.flush()
        await monitor.evaluate()
        (stored,) = (await cluster_snapshot(store)).alerts
        assert (stored.rule, stored.value, stored.monitor_id) == ("dead", 4.0, "proc-a")
        store.events.add(ev.DEAD_LETTERED, 2)
        clock.advance(1.0)
        await monitor.flush()
        assert await monitor.evaluate() == []  # still the same incident
        await monitor.flush(force=True)
        (stored,) = (await cluster_snapshot(store)).alerts
        assert stored.value == 6.0  # the stored copy follows the measured value
        assert stored.fired_at == clock.now - 1.0
    # The leader closed: its firing alert stays stored for the next leader (another process, or
    # this one restarted) to adopt, and expires alert_ttl_s after the last flush if none does.
    (kept,) = (await cluster_snapshot(store)).alerts
    assert (kept.rule, kept.fired_at, kept.monitor_id) == ("dead", clock.now - 1.0, "proc-a")
    clock.advance(monitor.alert_ttl_s + 0.01)
    assert (await cluster_snapshot(store)).alerts == ()


async def test_a_lone_process_restarted_within_alert_ttl_s_takes_its_incident_over(
    store: Store, clock: FakeClock
) -> None:
    """One process (the usual deployment) restarts while a cluster incident fires: the new
    monitor adopts the stored alert and sends no second firing notice; a restart after
    ``alert_ttl_s`` finds nothing stored, and the incident is raised anew."""
    rule = AlertRule(name="dead", event=ev.DEAD_LETTERED, threshold=0, window_s=60.0)
    async with manual(store, [rule], process_id="run-1") as first:
        store.events.add(ev.DEAD_LETTERED, 3)
        await first.flush()
        (fired,) = await first.evaluate()
    clock.advance(first.alert_ttl_s - 1.0)
    async with manual(store, [rule], process_id="run-2") as second:
        assert await second.evaluate() == []  # taken over, not raised again
        (adopted,) = second.active_alerts()
        assert (adopted.rule, adopted.fired_at) == ("dead", fired.fired_at)
        assert second.statistics().alerts_fired == 0
    clock.advance(second.alert_ttl_s + 1.0)
    store.events.add(ev.DEAD_LETTERED, 1)
    async with manual(store, [rule], process_id="run-3") as third:
        await third.flush()
        (again,) = await third.evaluate()
        assert again.firing
        assert again.fired_at > fired.fired_at


async def test_failed_flush_keeps_the_deltas(store: Store) -> None:
    async with manual(store, []) as monitor:
        store.events.add(ev.COMMITS, 5)
        real = store.flush_metrics

        async def broken(flush: MetricsFlush) -> float:
            raise StoreBusyError("the database stayed locked")

        store.flush_metrics = broken  # type: ignore[method-assign]
        with pytest.raises(StoreBusyError):
            await monitor.flush()
        store.flush_metrics = real  # type: ignore[method-assign]
        await monitor.flush()
        assert monitor.statistics().flush_failures == 1
    snapshot = await cluster_snapshot(store)
    assert snapshot.totals[ev.COMMITS] == 5


# --- delivery -----------------------------------------------------------------------------


async def test_bad_subscribers_never_block_publishing(store: Store, clock: FakeClock) -> None:
    """A raising callback, a callback stuck forever and an unread stream: publishing stays instant."""
    rule = AlertRule(name="any_stale", event=ev.STALE_COMMIT_REJECTED, threshold=0, window_s=1.0, clear_ratio=0.0)
    received: list[Alert] = []
    stuck_calls = 0

    async def healthy(alert: Alert) -> None:
        received.append(alert)

    async def raises(alert: Alert) -> None:
        raise RuntimeError("subscriber bug")

    async def stuck(alert: Alert) -> None:
        nonlocal stuck_calls
        stuck_calls += 1
        await asyncio.Event().wait()

    cycles = 20
    async with manual(store, [rule], buffer_size=4) as monitor:
        monitor.subscribe(healthy, buffer=100)
        bad = monitor.subscribe(raises)
        stuck_sub = monitor.subscribe(stuck, timeout_s=3600.0)
        unread = monitor.alerts(buffer=3)
        slowest = 0.0
        for _ in range(cycles):  # each cycle: one incident and its resolution
            for step in range(2):
                if step == 0:
                    store.events.add(ev.STALE_COMMIT_REJECTED)
                started = time.perf_counter()
                await monitor.flush()
                await monitor.evaluate()
                slowest = max(slowest, time.perf_counter() - started)
                clock.advance(2.0)
                await asyncio.sleep(0)  # let the subscriber tasks run
        for _ in range(100):
            if len(received) == 2 * cycles and bad.calls == bad.failures == 2 * cycles:
                break
            await asyncio.sleep(0.01)
        stats = monitor.statistics()
    # A stuck subscriber would have cost an hour per notice; a flush + evaluate takes milliseconds.
    assert slowest < 1.0, f"flush + evaluate took {slowest:.3f} s with bad subscribers"
    assert [a.state for a in received] == [AlertState.FIRING, AlertState.RESOLVED] * cycles
    assert bad.failures == 2 * cycles
    assert stuck_calls == 1  # still inside its first call; the rest piled up and were dropped
    assert stuck_sub.dropped == 2 * cycles - 1 - 4
    assert unread.dropped == 2 * cycles - 3
    assert stats.alerts_dropped == stuck_sub.dropped + unread.dropped
    assert stats.callback_failures == 2 * cycles
    assert (stats.alerts_fired, stats.alerts_resolved) == (cycles, cycles)


async def fire_and_resolve(store: Store, monitor: Monitor, clock: FakeClock) -> None:
    """One dead letter: the "dead" rule (threshold 0, window 30 s) fires, and resolves 31 s later."""
    store.events.add(ev.DEAD_LETTERED)
    await monitor.flush()
    await monitor.evaluate()
    clock.advance(31.0)
    await monitor.flush()
    await monitor.evaluate()


async def test_a_plain_function_subscriber_gets_every_notice(store: Store, clock: FakeClock) -> None:
    rule = AlertRule(name="dead", event=ev.DEAD_LETTERED, threshold=0, window_s=30.0)
    seen: list[str] = []

    def plain(alert: Alert) -> None:  # not async: called as it is, never awaited
        seen.append(alert.state.value)

    async with manual(store, [rule]) as monitor:
        sub = monitor.subscribe(plain)
        await fire_and_resolve(store, monitor, clock)
        for _ in range(100):
            if len(seen) == 2:
                break
            await asyncio.sleep(0.01)
        assert seen == ["firing", "resolved"]
        assert (sub.calls, sub.failures) == (2, 0)
        assert monitor.statistics().callback_failures == 0


async def test_a_callback_exception_whose_str_and_repr_raise_is_logged_and_counted(
    store: Store, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no text")

        def __repr__(self) -> str:
            raise RuntimeError("no repr either")

    rule = AlertRule(name="dead", event=ev.DEAD_LETTERED, threshold=0, window_s=30.0)

    async def raises(alert: Alert) -> None:
        raise Unprintable

    caplog.set_level(logging.WARNING, logger="asynccoord.monitor.monitor")
    async with manual(store, [rule]) as monitor:
        sub = monitor.subscribe(raises)
        await fire_and_resolve(store, monitor, clock)
        for _ in range(100):
            if sub.failures == 2:
                break
            await asyncio.sleep(0.01)
    assert (sub.calls, sub.failures) == (2, 2)  # the subscriber got both notices
    assert caplog.text.count("asynccoord.monitor.subscriber_failed") == 2
    assert caplog.text.count("error=Unprintable") == 2


async def test_a_callback_exception_text_is_escaped_in_its_log_line(
    store: Store, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The user's error text stays one line: a line break or an ESC in it is escaped."""
    rule = AlertRule(name="dead", event=ev.DEAD_LETTERED, threshold=0, window_s=30.0)

    async def raises(alert: Alert) -> None:
        raise RuntimeError("\u202eevil\nline2\x1b[31mred")

    caplog.set_level(logging.WARNING, logger="asynccoord.monitor.monitor")
    async with manual(store, [rule]) as monitor:
        sub = monitor.subscribe(raises)
        await fire_and_resolve(store, monitor, clock)
        for _ in range(100):
            if sub.failures == 2:
                break
            await asyncio.sleep(0.01)
    lines = [r.getMessage() for r in caplog.records if "asynccoord.monitor.subscriber_failed" in r.getMessage()]
    assert len(lines) == 2
    for line in lines:
        assert "error=RuntimeError: \\u202eevil\\x0aline2\\x1b[31mred" in line, line
        assert not any(c in line for c in "\n\x1b\u202e"), line


async def test_slow_callback_times_out_and_gets_the_next_notice(store: Store, clock: FakeClock) -> None:
    rule = AlertRule(name="dead", event=ev.DEAD_LETTERED, threshold=0, window_s=30.0)
    seen: list[str] = []
    done = asyncio.Event()

    async def slow_then_fast(alert: Alert) -> None:
        seen.append(alert.state.value)
        if len(seen) == 1:
            await asyncio.sleep(3600)
        done.set()

    async with manual(store, [rule]) as monitor:
        sub = monitor.subscribe(slow_then_fast, timeout_s=0.05)
        await fire_and_resolve(store, monitor, clock)
        await asyncio.wait_for(done.wait(), timeout=10.0)
        assert sub.failures == 1
        assert seen == ["firing", "resolved"]
        sub.cancel()
        assert monitor.statistics().subscribers == 0


async def test_background_loops_deliver_in_real_time(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rule = AlertRule(name="fencing", event=ev.FENCING_REJECTED, threshold=0, window_s=5.0)
    caplog.set_level(logging.WARNING, logger="asynccoord.monitor.monitor")
    async with (
        SQLiteStore(tmp_path / "bg.db") as store,
        Monitor(store, rules=[rule], flush_interval_s=0.05) as monitor,
    ):
        stream = monitor.alerts()
        store.events.add(ev.FENCING_REJECTED, 2)
        alert = await asyncio.wait_for(anext(stream), timeout=10.0)
        assert (alert.rule, alert.count, alert.state) == ("fencing", 2, AlertState.FIRING)
        assert alert.at == pytest.approx(time.time(), abs=5.0)  # the store clock: SQLite's
        stats = monitor.statistics()
        assert stats.flushes >= 1
        assert stats.evaluations >= 1
    assert any("asynccoord.monitor.alert_firing rule=fencing" in r.getMessage() for r in caplog.records)


async def test_alert_round_trips_through_json() -> None:
    alert = Alert(
        rule="r",
        event="e",
        value=0.5,
        threshold=0.1,
        window_s=30.0,
        at=1.0,
        scope=AlertScope.NODE,
        scope_key="n",
        relative_to=("commits",),
        count=5,
        base=10,
        fired_at=0.5,
        monitor_id="m",
    )
    assert Alert.from_dict(alert.to_dict()) == alert
    with pytest.raises(InvalidArgumentError, match="not an alert"):
        Alert.from_dict({"rule": "r"})


async def test_rates_of_a_young_cluster_divide_by_the_time_its_counts_cover(
    make_store: MakeStore, clock: FakeClock
) -> None:
    """30 s after a start, 193 claims a second read 193/s over the 60 s window, not 193 * 30 / 60."""
    store = await make_store()
    # A process of an earlier run, gone long before the window: its first flush is no start of this data.
    await store.flush_metrics(MetricsFlush(process_id="earlier", counters={("", ev.CLAIMS): 50}))
    clock.advance(300.0)
    async with manual(store, [], process_id="young") as monitor:
        for _ in range(30):
            await monitor.flush()
            clock.advance(1.0)
            store.events.add(ev.CLAIMS, 193)
        await monitor.flush()
        snapshot = await monitor.snapshot([10.0, 60.0])
        report = await status_report(store, windows_s=[10.0, 60.0])
    assert snapshot.window(60.0).counts == {ev.CLAIMS: 193 * 30}
    assert snapshot.window(60.0).span_s == pytest.approx(30.0)
    assert snapshot.window(60.0).rates_per_s[ev.CLAIMS] == pytest.approx(193.0)
    assert snapshot.window(10.0).span_s == 10.0  # this window lies wholly after the start
    # now - 10 s cuts the bucket 9 s in (buckets after it count): 10 flushes of 193, over 10 s.
    assert snapshot.window(10.0).rates_per_s[ev.CLAIMS] == pytest.approx(193.0)
    windows = {w["window_s"]: w for w in report["events"]["windows"]}
    assert windows[60.0]["span_s"] == pytest.approx(30.0)
    assert windows[60.0]["rates_per_s"][ev.CLAIMS] == pytest.approx(193.0)
    out = io.StringIO()
    render_status(report, out, color=False)
    assert "/s last 60s (30s of data)" in out.getvalue()
    assert "/s last 10s " in out.getvalue()


@pytest.mark.parametrize(
    ("window_s", "span_s", "header"),
    [
        (60.0, 60.0, "/s last 60s"),
        (60.0, 30.0, "/s last 60s (30s of data)"),
        (60.0, 59.4, "/s last 60s (59s of data)"),
        (60.0, 59.6, "/s last 60s"),  # not "(60s of data)" in a 60 s window
        (10.0, 1.0, "/s last 10s (1s of data)"),
        (0.5, 0.5, "/s last 0.5s"),
    ],
)
def test_the_rate_header_says_a_short_span_only_when_it_reads_shorter(
    window_s: float, span_s: float, header: str
) -> None:
    assert rate_header(window_s, span_s) == header


async def test_snapshot_reports_rates_and_latencies(make_store: MakeStore, clock: FakeClock) -> None:
    store = await make_store()
    async with manual(store, []) as monitor:
        for _ in range(10):
            store.events.add(ev.CLAIMS, 6)
            store.latencies.observe("claim_ms", 4.0)
            await monitor.flush()
            clock.advance(1.0)
        snapshot = await monitor.snapshot([5.0, 60.0])
    assert snapshot.totals == {ev.CLAIMS: 60}
    assert snapshot.window(5.0).counts == {ev.CLAIMS: 24}  # buckets after now - 5: 4 flushes of 6
    assert snapshot.window(60.0).rates_per_s[ev.CLAIMS] == pytest.approx(6.0)  # 60 claims in the 10 s of data
    assert snapshot.window(60.0).span_s == pytest.approx(10.0)
    latency = snapshot.latencies[60.0]["claim_ms"]
    assert latency.count == 10
    assert latency.p50_ms == pytest.approx(4.0, rel=0.19)
    data = snapshot.to_dict()
    assert data["totals"] == {ev.CLAIMS: 60}
    assert data["processes"][0]["process_id"] == "proc-a"


async def test_a_dead_lettered_task_fires_the_default_dead_letter_rule(store: Store, clock: FakeClock) -> None:
    """With the default rules, one task out of attempts (a real fail on the store) is an alert."""
    task_id = (await store.enqueue("outbox", {"to": "x"}, max_attempts=1)).task.id
    (task,) = await store.claim("outbox", node_id="n1", limit=1)
    assert task.id == task_id
    await store.fail(task, "provider refused it for good")
    assert store.events.get(ev.DEAD_LETTERED) == 1
    store.events.add(ev.CLAIMS, 100)  # enough claims that no relative rule goes unjudged
    async with Monitor(store, background=False, process_id="proc-a") as monitor:
        assert monitor.rules == DEFAULT_RULES
        await monitor.flush()
        (alert,) = await monitor.evaluate()
        assert (alert.rule, alert.event, alert.count, alert.firing) == ("dead_letters", ev.DEAD_LETTERED, 1, True)


# --- one leader for the cluster rules ----------------------------------------------------

LOST_RULE = AlertRule(name="lost_leases", event=ev.LEASE_LOST, threshold=0, window_s=30.0)
SHARED = pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
"""Two store objects on one database: what two processes see."""


@SHARED
async def test_two_monitors_on_one_database_raise_a_cluster_incident_once(
    make_store: MakeStore, clock: FakeClock
) -> None:
    store_a, store_b = await make_store(), await make_store()
    monitor_a = manual(store_a, [LOST_RULE], process_id="proc-a")
    monitor_b = manual(store_b, [LOST_RULE], process_id="proc-b")
    await monitor_a.start()
    try:
        async with monitor_b:
            assert await monitor_a.evaluate() == []
            assert await monitor_b.evaluate() == []
            assert (monitor_a.statistics().leader, monitor_b.statistics().leader) == (True, False)
            (held,) = await store_a.list_locks(LEADER_LOCK)
            assert held.holder == "proc-a"
            assert [lock["name"] for lock in (await status_report(store_a))["locks"]] == []  # no lock of the nodes

            store_b.events.add(ev.LEASE_LOST)  # counted where the leader is not
            await monitor_b.flush()
            (fired,) = await monitor_a.evaluate()
            assert (fired.rule, fired.monitor_id, fired.count) == ("lost_leases", "proc-a", 1)
            assert await monitor_b.evaluate() == []
            assert monitor_b.active_alerts() == []
            (shown,) = (await status_report(store_a))["alerts"]
            assert shown["reported_by"] == ["proc-a"]

            await monitor_a.close()  # proc-b is live: the firing alert stays stored for it to adopt
            assert await store_a.list_locks(LEADER_LOCK) == []
            assert await monitor_b.evaluate() == []  # takes over: no second firing notice
            (adopted,) = monitor_b.active_alerts()
            assert adopted.fired_at == fired.fired_at
            stats = monitor_b.statistics()
            assert (stats.leader, stats.leader_changes, stats.alerts_fired) == (True, 1, 0)

            clock.advance(31.0)  # the window empties
            await monitor_b.flush()
            (resolved,) = await monitor_b.evaluate()
            assert (resolved.state, resolved.fired_at, resolved.monitor_id) == (
                AlertState.RESOLVED,
                fired.fired_at,
                "proc-b",
            )
        assert (await cluster_snapshot(store_a)).alerts == ()  # the last monitor withdrew everything
    finally:
        await monitor_a.close()


@SHARED
async def test_a_leader_whose_lease_lapsed_steps_down_without_a_notice(make_store: MakeStore, clock: FakeClock) -> None:
    store_a, store_b = await make_store(), await make_store()
    async with (
        manual(store_a, [LOST_RULE], process_id="proc-a") as monitor_a,
        manual(store_b, [LOST_RULE], process_id="proc-b") as monitor_b,
    ):
        assert monitor_a.leader_ttl_s == 5.0
        assert monitor_a.alert_ttl_s == 10.0
        store_a.events.add(ev.LEASE_LOST)
        await monitor_a.flush()
        (fired,) = await monitor_a.evaluate()
        clock.advance(6.0)  # proc-a stalls past its lease, not past its stored alert
        assert await monitor_b.evaluate() == []  # takes over and adopts the incident
        assert [a.fired_at for a in monitor_b.active_alerts()] == [fired.fired_at]
        await monitor_b.flush()
        assert await monitor_a.evaluate() == []  # its lease is gone: it hands the incident over silently
        stats = monitor_a.statistics()
        assert (stats.leader, stats.leader_changes, stats.active_alerts, stats.alerts_resolved) == (False, 2, 0, 0)
        await monitor_a.flush()
        (stored,) = (await cluster_snapshot(store_a)).alerts
        assert (stored.monitor_id, stored.fired_at) == ("proc-b", fired.fired_at)


@SHARED
async def test_an_incident_resolved_under_one_leader_is_not_resolved_again_by_the_next(
    make_store: MakeStore, clock: FakeClock
) -> None:
    """A's firing alert stays stored after it hands over; B resolves the incident and hands over
    to C: C must not adopt A's stale alert (and resolve it a second time), nor status show it.

    B keeps its resolved notice stored as long as A's alert can live (:func:`open_alerts`).
    Before, every later leader adopted A's alert and sent one more resolved notice.
    """
    stores = [await make_store() for _ in range(3)]
    rule = dataclasses.replace(LOST_RULE, window_s=3.0)  # resolved while A's alert is still stored (10 s)
    a, b, c = (manual(store, [rule], process_id=f"proc-{n}") for store, n in zip(stores, "abc", strict=True))
    for monitor in (a, b, c):
        await monitor.start()
    try:
        for monitor in (a, b, c):
            await monitor.flush()  # all three live
        stores[0].events.add(ev.LEASE_LOST)
        await a.flush()
        (fired,) = await a.evaluate()
        await b.flush()
        await c.flush()
        await a.close()  # others live: its firing alert stays stored for the next leader
        assert await b.evaluate() == []  # takes over and adopts it
        assert [x.fired_at for x in b.active_alerts()] == [fired.fired_at]
        clock.advance(4.0)  # the window empties; A's stored alert (alert_ttl_s 10 s) lives on
        await c.flush()
        (resolved,) = await b.evaluate()
        assert (resolved.state, resolved.fired_at) == (AlertState.RESOLVED, fired.fired_at)
        await b.close()
        assert await c.evaluate() == []  # takes over: nothing open to adopt
        assert c.active_alerts() == []
        assert (await status_report(stores[2]))["alerts"] == []
        clock.advance(2.0)
        await c.flush()
        assert await c.evaluate() == []  # and no second resolved notice
        assert c.statistics().alerts_resolved == 0
    finally:
        for monitor in (a, b, c):
            await monitor.close()


def test_open_alerts_leaves_out_incidents_a_later_notice_resolved() -> None:
    def alert(rule: str, at: float, fired_at: float, state: AlertState, key: str = "") -> Alert:
        return Alert(
            rule=rule,
            event=ev.LEASE_LOST,
            value=1.0,
            threshold=0.0,
            window_s=30.0,
            at=at,
            scope=AlertScope.CLUSTER,
            scope_key=key,
            state=state,
            fired_at=fired_at,
        )

    stale = alert("lost", 10.0, 10.0, AlertState.FIRING)  # stored by a monitor that died
    closed = alert("lost", 40.0, 10.0, AlertState.RESOLVED)  # its incident, resolved by the next leader
    again = alert("lost", 45.0, 45.0, AlertState.FIRING)  # a new incident of the same rule
    other = alert("lost", 12.0, 12.0, AlertState.FIRING, key="proc-a")  # another scope key
    assert open_alerts([stale, closed]) == ()
    assert open_alerts([stale, closed, again, other]) == (again, other)
    assert open_alerts([stale, other]) == (stale, other)


async def test_a_leader_that_stalls_past_its_lease_publishes_no_cluster_notice() -> None:
    """Its read of the windows outlasts the lease (a pause, a slow store): another may lead by
    now and raise the same incident, so it steps down and leaves the notice to the next leader."""
    async with MemoryStore() as store:
        read = store.read_metrics

        async def slow_read(windows: Any) -> Any:
            view = await read(windows)
            await asyncio.sleep(0.6)
            return view

        async with manual(store, [LOST_RULE], evaluate_interval_s=0.2, leader_ttl_s=0.5) as monitor:
            store.events.add(ev.LEASE_LOST)
            await monitor.flush()
            store.read_metrics = slow_read  # type: ignore[method-assign]
            assert await monitor.evaluate() == []
            stats = monitor.statistics()
            assert (stats.leader, stats.alerts_fired, stats.active_alerts) == (False, 0, 0)
            store.read_metrics = read  # type: ignore[method-assign]
            (fired,) = await monitor.evaluate()  # leads again, on time: the incident fires once
            assert fired.rule == "lost_leases"


async def test_a_lapsed_lease_taken_back_with_the_next_token_keeps_the_incident(store: Store, clock: FakeClock) -> None:
    """Nobody held the lease in between (a fake clock jumps, a process stalls alone): no new notice."""
    async with manual(store, [LOST_RULE]) as monitor:
        store.events.add(ev.LEASE_LOST)
        await monitor.flush()
        (fired,) = await monitor.evaluate()
        clock.advance(20.0)  # past the lease and the stored alert, inside the rule's window
        await monitor.flush()
        assert await monitor.evaluate() == []
        assert [a.fired_at for a in monitor.active_alerts()] == [fired.fired_at]
        assert monitor.statistics().leader_changes == 1
        (lease,) = await store.list_locks(LEADER_LOCK)
        assert lease.fencing_token == 2


async def test_process_rules_are_judged_by_each_monitor_on_its_own_process(store: Store) -> None:
    rule = AlertRule(name="lost", event=ev.LEASE_LOST, threshold=0, window_s=30.0, scope=AlertScope.PROCESS)
    await store.flush_metrics(MetricsFlush(process_id="proc-b", counters={("", ev.LEASE_LOST): 5}))
    async with manual(store, [rule]) as monitor:
        assert await monitor.evaluate() == []  # proc-b's own monitor judges proc-b
        assert await store.list_locks(LEADER_LOCK) == []  # no cluster rule: no lease taken
        store.events.add(ev.LEASE_LOST)
        await monitor.flush()
        (alert,) = await monitor.evaluate()
        assert (alert.scope_key, alert.count) == ("proc-a", 1)


def test_the_leader_lease_is_checked() -> None:
    with pytest.raises(InvalidArgumentError, match=r"leader_ttl_s=1.5 < 2 \* evaluate_interval_s=1.0"):
        Monitor(MemoryStore(), evaluate_interval_s=1.0, leader_ttl_s=1.5)
    with pytest.raises(InvalidArgumentError, match="leader_ttl_s"):
        Monitor(MemoryStore(), leader_ttl_s=0.0)
    with pytest.raises(InvalidTypeError, match="leader_ttl_s"):
        Monitor(MemoryStore(), leader_ttl_s="5")  # type: ignore[arg-type]
    longer = Monitor(MemoryStore(), leader_ttl_s=20.0)
    assert (longer.leader_ttl_s, longer.alert_ttl_s) == (20.0, 40.0)  # stored alerts outlive the lease
    slow = Monitor(MemoryStore(), flush_interval_s=10.0, evaluate_interval_s=10.0)
    assert (slow.leader_ttl_s, slow.alert_ttl_s) == (20.0, 40.0)


async def test_a_store_without_locks_judges_the_cluster_rules_alone(store: Store) -> None:
    class Metrics:  # a MonitorStore and nothing more
        def __init__(self, inner: Store) -> None:
            self.events, self.config = inner.events, inner.config
            self.flush_metrics, self.read_metrics = inner.flush_metrics, inner.read_metrics

    async with manual(Metrics(store), [LOST_RULE]) as monitor:  # type: ignore[arg-type]
        store.events.add(ev.LEASE_LOST)
        await monitor.flush()
        (alert,) = await monitor.evaluate()
        assert alert.rule == "lost_leases"
        assert monitor.statistics().leader


async def test_a_store_whose_writes_fail_for_store_outage_s_raises_store_unreachable_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Another connection holds the SQLite file's write lock: every flush fails busy.

    Past ``store_outage_s`` of failed writes the monitor publishes one process-scoped
    ``store_unreachable`` notice (its rules' alerts, judged on what it reads and stored
    with what it writes, cannot reach anyone then), and the resolved one at the next write
    that succeeds. Nothing is written to the store for it.
    """
    import sqlite3

    caplog.set_level(logging.WARNING, logger="asynccoord.monitor.monitor")
    path = tmp_path / "m.db"
    async with SQLiteStore(path, config=StoreConfig(busy_timeout_s=0.05)) as store:
        monitor = Monitor(store, rules=[], background=False, process_id="proc-a", store_outage_s=0.3)
        async with monitor:
            stream = monitor.alerts()
            await monitor.flush(force=True)
            holder = sqlite3.connect(path, isolation_level=None)
            holder.execute("BEGIN IMMEDIATE")  # the write lock, as a process stalled mid-write holds it
            failed_at = time.monotonic()
            fired: list[Alert] = []
            while time.monotonic() - failed_at < 1.0:
                with pytest.raises(StoreBusyError):
                    await monitor.flush(force=True)
                fired = monitor.active_alerts()
                await asyncio.sleep(0.05)
            (alert,) = fired
            assert (alert.rule, alert.scope, alert.scope_key, alert.state) == (
                "store_unreachable",
                AlertScope.PROCESS,
                "proc-a",
                AlertState.FIRING,
            )
            assert alert.value >= 0.3
            assert alert.count >= 2  # the writes that failed, the one past 0.3 s included
            holder.execute("ROLLBACK")
            holder.close()
            await monitor.flush(force=True)
            assert monitor.active_alerts() == []
            stats = monitor.statistics()
        notices = [a async for a in stream]
    assert [(a.rule, a.state) for a in notices] == [
        ("store_unreachable", AlertState.FIRING),
        ("store_unreachable", AlertState.RESOLVED),
    ]
    assert notices[1].fired_at == notices[0].fired_at
    assert (stats.alerts_fired, stats.alerts_resolved) == (1, 1)
    assert sum("alert_firing rule=store_unreachable" in r.getMessage() for r in caplog.records) == 1
    async with SQLiteStore(path) as store:
        assert list((await store.read_metrics((60.0,))).alerts) == []  # published, never stored
