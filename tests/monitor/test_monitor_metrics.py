"""Prometheus text exposition: renders, parses, and follows the naming conventions."""

from __future__ import annotations

import math
import re

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support import FakeClock

from asynccoord import AlertRule, MemoryStore, Monitor
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
