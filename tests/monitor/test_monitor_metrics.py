"""Prometheus text exposition: renders, parses, and follows the naming conventions."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric as Family
from prometheus_client.parser import text_string_to_metric_families
from services import ServiceStores
from support import ROOT, FakeClock

from asynccoord import (
    AlertRule,
    FencingTokenRejectedError,
    InvalidArgumentError,
    InvalidTypeError,
    MemoryStore,
    Monitor,
)
from asynccoord import events as ev
from asynccoord.monitor.metrics import latency_metric_name, register_collector, render_prometheus

NAME = re.compile(r"^asynccoord_[a-z0-9_]+$")


async def test_exposition_parses_with_units_and_total_suffixes(clock: FakeClock) -> None:
    store = MemoryStore(clock=clock)
    await store.open()
    store.events.add(ev.COMMITS, 41)
    store.events.add(ev.STALE_COMMIT_REJECTED, 3)
    for value_ms in (0.5, 2.0, 2.0, 40.0, 900.0):
        store.latencies.observe("claim_ms", value_ms)
    store.latencies.observe("enqueue_to_commit_ms", 1500.0)
    rule = AlertRule(name="stale", event=ev.STALE_COMMIT_REJECTED, threshold=0, window_s=30.0)
    async with Monitor(store, rules=[rule], background=False, process_id="p") as monitor:
        await monitor.flush()
        await monitor.evaluate()
        text = render_prometheus(store, monitor).decode("utf-8")
    await store.close()

    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name, family in families.items():
        assert NAME.match(name), name
        if family.type == "counter":
            assert all(s.name == f"{name}_total" for s in family.samples), family.samples

    events = {s.labels["event"]: s.value for s in families["asynccoord_events"].samples}
    assert events[ev.COMMITS] == 41
    assert events[ev.STALE_COMMIT_REJECTED] == 3
    assert set(ev.EVENT_NAMES) <= set(events)  # every event present, 0 until seen
    assert 'asynccoord_events_total{event="commits"} 41.0' in text

    claim = families["asynccoord_claim_duration_seconds"]
    assert claim.type == "histogram"
    buckets = [(float(s.labels["le"]), s.value) for s in claim.samples if s.name.endswith("_bucket")]
    assert [v for _, v in buckets] == sorted(v for _, v in buckets)  # cumulative
    assert buckets[-1] == (math.inf, 5.0)
    le_of = dict(buckets)
    assert le_of[0.00064] == 1  # 0.5 ms <= 0.64 ms
    assert le_of[0.00256] == 3  # and the two 2 ms
    assert le_of[0.04096] == 4  # and 40 ms
    total = {s.name: s.value for s in claim.samples if not s.name.endswith("_bucket")}
    assert total["asynccoord_claim_duration_seconds_count"] == 5
    assert total["asynccoord_claim_duration_seconds_sum"] == pytest.approx(0.9445)
    assert "asynccoord_enqueue_to_commit_duration_seconds" in families

    assert families["asynccoord_monitor_alerts_fired"].samples[0].value == 1
    (firing,) = families["asynccoord_alerts_firing"].samples
    assert firing.labels == {"rule": "stale", "event": ev.STALE_COMMIT_REJECTED, "scope": "cluster", "scope_key": ""}


async def test_a_muted_incident_is_exported_as_muted_never_as_firing(clock: FakeClock) -> None:
    store = MemoryStore(clock=clock)
    await store.open()
    store.events.add(ev.NODE_LOST)
    store.events.add(ev.LOCK_LOST)
    rules = [
        AlertRule(name="nodes", event=ev.NODE_LOST, threshold=0, window_s=30.0),
        AlertRule(name="locks", event=ev.LOCK_LOST, threshold=0, window_s=30.0, inhibited_by="nodes"),
    ]
    async with Monitor(store, rules=rules, background=False, process_id="p") as monitor:
        await monitor.flush()
        await monitor.evaluate()
        text = render_prometheus(store, monitor).decode("utf-8")
    await store.close()

    _assert_valid_exposition(text)
    families = _families(text)
    assert [s.labels["rule"] for s in families["asynccoord_alerts_firing"].samples] == ["nodes"]
    (muted,) = families["asynccoord_alerts_muted"].samples
    assert muted.labels == {
        "rule": "locks",
        "event": ev.LOCK_LOST,
        "scope": "cluster",
        "scope_key": "",
        "inhibited_by": "nodes",
    }
    assert muted.value == 1


def test_collector_on_a_registry_and_names() -> None:
    store = MemoryStore()
    store.events.add(ev.CLAIMS)
    registry = CollectorRegistry()
    collector = register_collector(store, registry=registry)
    assert b'asynccoord_events_total{event="claims"} 1.0' in generate_latest(registry)
    registry.unregister(collector)
    assert generate_latest(registry) == b""
    assert latency_metric_name("claim_ms") == "asynccoord_claim_duration_seconds"
    assert latency_metric_name("odd name") == "asynccoord_odd_name_duration_seconds"


async def test_latency_help_names_the_latency_in_words_and_seconds_not_the_ms_recorder_name(
    clock: FakeClock,
) -> None:
    """The values are seconds: the HELP text must not read as milliseconds (``claim_ms``)."""
    store = MemoryStore(clock=clock)
    await store.open()
    for name in ("claim_ms", "send_ms", "commit_ms", "enqueue_to_commit_ms", "batch_wait_ms"):
        store.latencies.observe(name, 3.0)
    text = render_prometheus(store).decode("utf-8")
    await store.close()
    helps = {f.name: f.documentation for f in _families(text).values() if f.type == "histogram"}
    assert helps == {
        "asynccoord_claim_duration_seconds": "Claim latency (one store.claim call) observed by this process, seconds.",
        "asynccoord_send_duration_seconds": "Send latency (the application's send(task)) observed by this process,"
        " seconds.",
        "asynccoord_commit_duration_seconds": "Commit latency (one store.complete call) observed by this process,"
        " seconds.",
        "asynccoord_enqueue_to_commit_duration_seconds": "Enqueue-to-commit latency (a task's creation to its"
        " commit, store clock) observed by this process, seconds.",
        "asynccoord_batch_wait_duration_seconds": "Batch wait latency observed by this process, seconds.",
    }
    assert "_ms" not in "".join(helps.values())


def _families(text: str) -> dict[str, Family]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _assert_valid_exposition(text: str) -> None:
    """Parses, and holds no HELP, TYPE or series line twice (a Prometheus server refuses those)."""
    _families(text)
    lines = [line for line in text.splitlines() if line and not line.startswith("# EOF")]
    series = [line.rsplit(" ", 1)[0] for line in lines if not line.startswith("#")]
    meta = [line.split(" ", 3)[:3] for line in lines if line.startswith("#")]
    assert len(series) == len(set(series)), sorted(s for s in series if series.count(s) > 1)
    assert len(meta) == len({tuple(m) for m in meta}), meta


def _events(text: str, **labels: str) -> dict[str, float]:
    family = _families(text)["asynccoord_events"]
    return {
        s.labels["event"]: s.value
        for s in family.samples
        if all(s.labels.get(k) == v for k, v in labels.items()) and s.name == "asynccoord_events_total"
    }


async def test_lock_store_events_come_from_the_monitor_or_the_argument(clock: FakeClock) -> None:
    store, locks = MemoryStore(clock=clock), MemoryStore(clock=clock)
    await store.open()
    store.events.add(ev.CLAIMS, 5)
    store.events.add(ev.LOCK_CONTENDED, 1)  # counted by the store's own locks, if any
    locks.events.add(ev.LOCK_CONTENDED, 46)
    locks.events.add(ev.LOCK_LOST, 2)
    locks.events.add(ev.FENCING_REJECTED, 3)
    wanted = {ev.CLAIMS: 5.0, ev.LOCK_CONTENDED: 47.0, ev.LOCK_LOST: 2.0, ev.FENCING_REJECTED: 3.0}
    async with Monitor(store, lock_store=locks, background=False, process_id="p") as monitor:
        await monitor.flush(force=True)
        cluster = (await monitor.snapshot()).totals
        via_monitor = render_prometheus(store, monitor).decode()
        registry = CollectorRegistry()
        register_collector(store, monitor, registry=registry)
        registered = generate_latest(registry).decode()
        same = render_prometheus(store, monitor, lock_store=locks).decode()
        with pytest.raises(InvalidArgumentError, match="not the monitor's lock_store"):
            render_prometheus(store, monitor, lock_store=MemoryStore())
    await store.close()
    via_argument = render_prometheus(store, lock_store=locks).decode()  # a Runtime without a Monitor
    assert {k: cluster[k] for k in wanted} == {k: int(v) for k, v in wanted.items()}  # the monitor's view
    for text in (via_monitor, registered, same, via_argument):
        assert {k: v for k, v in _events(text).items() if v} == wanted
    # The store as its own lock store is counted once, not twice.
    assert _events(render_prometheus(store, lock_store=store).decode())[ev.LOCK_CONTENDED] == 1
    with pytest.raises(InvalidTypeError, match="lock_store"):
        render_prometheus(store, lock_store=object())


async def test_redis_lock_store_fencing_rejections_are_exported(clock: FakeClock) -> None:
    services = ServiceStores()  # a fresh key prefix, deleted at the end
    store = MemoryStore(clock=clock)
    await store.open()
    try:
        locks: Any = await services.open("redis", config=None, clock=None, path=None)
        async with locks, Monitor(store, lock_store=locks, background=False, process_id="p") as monitor:
            await locks.fence("account:1", 5)
            with pytest.raises(FencingTokenRejectedError):
                await locks.fence("account:1", 4)
            assert locks.events.snapshot()[ev.FENCING_REJECTED] == 1
            text = render_prometheus(store, monitor).decode()
    finally:
        await store.close()
        await services.cleanup()
    assert _events(text)[ev.FENCING_REJECTED] == 1


async def test_two_stores_on_one_registry_need_names_and_give_one_family(clock: FakeClock) -> None:
    first, second = MemoryStore(clock=clock), MemoryStore(clock=clock)
    await second.open()
    first.events.add(ev.CLAIMS, 2)
    second.events.add(ev.CLAIMS, 7)
    first.latencies.observe("claim_ms", 3.0)
    second.latencies.observe("claim_ms", 30.0)
    second.latencies.observe("claim_ms", 300.0)

    unnamed = CollectorRegistry()
    register_collector(first, registry=unnamed)
    with pytest.raises(InvalidArgumentError, match="distinct name"):  # was two identical series
        register_collector(second, registry=unnamed)
    with pytest.raises(InvalidArgumentError, match="distinct name"):  # the first one needs a name too
        register_collector(second, registry=unnamed, name="b")
    assert _events(generate_latest(unnamed).decode())[ev.CLAIMS] == 2  # unchanged, still valid
    _assert_valid_exposition(generate_latest(unnamed).decode())

    registry = CollectorRegistry()
    async with Monitor(second, background=False, process_id="p2") as monitor:
        collector = register_collector(first, registry=registry, name="a")
        with pytest.raises(InvalidArgumentError, match="distinct name"):
            register_collector(second, registry=registry)
        assert register_collector(second, monitor, registry=registry, name="b") is collector
        with pytest.raises(InvalidArgumentError, match="taken"):
            register_collector(MemoryStore(), registry=registry, name="a")
        with pytest.raises(InvalidArgumentError, match="exported already"):
            register_collector(first, registry=registry, name="c")
        await monitor.flush(force=True)
        text = generate_latest(registry).decode()
    await second.close()
    _assert_valid_exposition(text)
    assert text.count("# HELP asynccoord_events_total ") == 1
    assert _events(text, store="a")[ev.CLAIMS] == 2
    assert _events(text, store="b")[ev.CLAIMS] == 7
    families = _families(text)
    counts = {
        s.labels["store"]: s.value
        for s in families["asynccoord_claim_duration_seconds"].samples
        if s.name.endswith("_count")
    }
    assert counts == {"a": 1.0, "b": 2.0}
    flushes = {s.labels["store"]: s.value for s in families["asynccoord_monitor_flushes"].samples}
    assert flushes == {"b": 1.0}

    registry.unregister(collector)  # removes both; the registry takes a new export afterwards
    assert generate_latest(registry) == b""
    register_collector(second, registry=registry)
    assert _events(generate_latest(registry).decode()) == _events(render_prometheus(second).decode())


@pytest.mark.parametrize("lock_store_first", [True, False], ids=["lock-store-first", "store-first"])
def test_a_store_is_exported_once_as_a_store_or_as_a_lock_store(lock_store_first: bool) -> None:
    one, locks = MemoryStore(), MemoryStore()
    locks.events.add(ev.LOCK_LOST, 5)
    registry = CollectorRegistry()
    if lock_store_first:
        register_collector(one, registry=registry, lock_store=locks, name="one")
        with pytest.raises(InvalidArgumentError, match=r"lock store of 'one'.*would double"):
            register_collector(locks, registry=registry, name="three")
    else:
        register_collector(locks, registry=registry, name="three")
        with pytest.raises(InvalidArgumentError, match=r"exported already with 'three'.*would double"):
            register_collector(one, registry=registry, lock_store=locks, name="one")
    text = generate_latest(registry).decode()
    _assert_valid_exposition(text)
    lost = {
        s.labels["store"]: s.value
        for s in _families(text)["asynccoord_events"].samples
        if s.labels["event"] == ev.LOCK_LOST
    }
    assert lost == ({"one": 5.0} if lock_store_first else {"three": 5.0})  # counted once, under one name
    # A second store sharing the lock store is refused too.
    with pytest.raises(InvalidArgumentError, match="would double"):
        register_collector(MemoryStore(), registry=registry, lock_store=locks, name="two")


README_METRIC = re.compile(r"\basynccoord_[a-z0-9_]+")


async def test_every_metric_the_readme_names_is_exported_and_its_backlog_alert_reads_the_oldest_pending_age(
    clock: FakeClock,
) -> None:
    """README.md names only metrics a scrape holds; it and the module's rules alert on the backlog's age."""
    import asynccoord.monitor.metrics as metrics_module

    readme = (ROOT / "README.md").read_text("utf-8")
    rules = metrics_module.__doc__ or ""
    store = MemoryStore(clock=clock)
    await store.open()
    await store.enqueue("outbox", {"n": 1})
    clock.advance(19.6)
    store.latencies.observe("claim_ms", 1.0)
    registry = CollectorRegistry()
    async with Monitor(store, background=False, process_id="p") as monitor:
        collector = register_collector(store, monitor, registry, queues=["outbox"])
        (gauges,) = collector.queue_gauges()
        await gauges.read()
        text = generate_latest(registry).decode("utf-8")
    await store.close()
    exported = set()
    for family in _families(text).values():
        exported.add(family.name)
        exported.update(sample.name for sample in family.samples)
    named = set(README_METRIC.findall(readme))
    assert named, "README.md names no metric"
    assert named <= exported, sorted(named - exported)
    (oldest,) = _families(text)["asynccoord_queue_oldest_pending_age_seconds"].samples
    assert (oldest.labels, oldest.value) == ({"queue": "outbox"}, pytest.approx(19.6, abs=0.01))
    assert set(README_METRIC.findall(rules)) <= exported, sorted(set(README_METRIC.findall(rules)) - exported)
    assert "asynccoord_queue_oldest_pending_age_seconds" in readme
    exprs = re.findall(r"^\s*expr: (.+)$", rules, flags=re.MULTILINE)
    assert any("asynccoord_queue_oldest_pending_age_seconds" in expr for expr in exprs), exprs
    assert any("asynccoord_queue_stats_age_seconds" in expr for expr in exprs), exprs
