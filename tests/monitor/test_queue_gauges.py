"""Queue gauges on the Prometheus endpoint: real stores, real HTTP scrapes, a store that fails or hangs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sqlite3
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.parser import text_string_to_metric_families
from services import PG_DSN
from support import FakeClock

from asynccoord import InvalidArgumentError, InvalidTypeError, MemoryStore, NewTask
from asynccoord.contract.membership import MemberBeat
from asynccoord.monitor.gauges import QueueGauges
from asynccoord.monitor.metrics import register_collector, render_prometheus
from asynccoord.node import NodeConfig, Runtime

SHARED = pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)  # stores of one database

Q = "outbox"
NAMED = "billing"
HERE = {"host": socket.gethostname(), "pid": os.getpid()}


@contextlib.contextmanager
def serving(registry: CollectorRegistry) -> Iterator[str]:
    """``registry`` on a real ``prometheus_client`` HTTP server; yields its /metrics URL."""
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        yield f"http://127.0.0.1:{server.server_port}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5.0)


async def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """One HTTP scrape (on a thread: the loop stays free), as ``(sample name, labels) -> value``."""

    def get() -> str:
        with urllib.request.urlopen(url, timeout=30) as response:
            assert response.status == 200
            return str(response.read().decode())

    text = await asyncio.to_thread(get)
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def series(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str) -> dict[tuple[str, ...], float]:
    """The samples of ``name``, keyed by their label values in label-name order."""
    return {tuple(v for _, v in sorted(labels)): value for (sample, labels), value in samples.items() if sample == name}


async def beat(store: Any, *members: tuple[str, dict[str, Any]]) -> None:
    await store.heartbeat([MemberBeat(node_id=n, incarnation="i", info=info) for n, info in members], ttl_s=600)


async def test_a_scrape_serves_each_queues_backlog_oldest_age_and_live_nodes(store: Any, clock: FakeClock) -> None:
    """The queue this process's nodes drain (found in their heartbeats) and the one named: tasks by
    status (done left out), the oldest due pending age on the store's clock, live nodes by queue."""
    await store.enqueue_many([NewTask(queue=Q, payload=i, max_attempts=1) for i in range(5)])
    clock.advance(42)
    await store.enqueue(Q, "later", delay_s=60)  # pending, not due
    await store.enqueue(NAMED, "n")
    await store.enqueue("unexported", "u")
    dead, done, _running = await store.claim(Q, node_id="n", limit=3)
    await store.fail(dead, "refused")
    await store.complete(done)
    await beat(
        store,
        ("here-0", {"queue": Q, **HERE}),
        ("here-1", {"queue": Q, **HERE}),
        ("elsewhere", {"queue": "other", "host": "another-host", "pid": 1}),  # another process's queue
        ("bare", {}),
    )
    registry = CollectorRegistry()
    collector = register_collector(store, registry=registry, queues=[NAMED])
    with serving(registry) as url:
        samples = await scrape(url)
        assert series(samples, "asynccoord_queue_tasks") == {
            (Q, "dead"): 1.0,
            (Q, "pending"): 3.0,
            (Q, "running"): 1.0,
            (NAMED, "dead"): 0.0,
            (NAMED, "pending"): 1.0,
            (NAMED, "running"): 0.0,
        }
        oldest = series(samples, "asynccoord_queue_oldest_pending_age_seconds")
        assert oldest == {(Q,): pytest.approx(42.0, abs=0.01), (NAMED,): pytest.approx(0.0, abs=0.01)}
        assert series(samples, "asynccoord_live_nodes") == {(Q,): 2.0, ("other",): 1.0, (NAMED,): 0.0, ("",): 1.0}
        assert series(samples, "asynccoord_queue_stats_up") == {(): 1.0}
        assert 0.0 <= series(samples, "asynccoord_queue_stats_age_seconds")[()] < 60.0
        # Six concurrent scrapes within refresh_s: one read served them all.
        (gauges,) = collector.queue_gauges()
        assert gauges.queues() == (NAMED, Q)
        await asyncio.gather(*(scrape(url) for _ in range(6)))
        assert gauges.reads == 1
        # A new read (due, or awaited) shows the change.
        await store.enqueue(Q, "more")
        await gauges.read()
        assert series(await scrape(url), "asynccoord_queue_tasks")[(Q, "pending")] == 4.0


async def test_the_queue_a_runtime_of_this_process_drains_is_found_without_naming_it(make_store: Any) -> None:
    """No queue named: the runtime's nodes announce theirs in their heartbeats, and it is exported."""
    store = await make_store(clock=None)
    await store.enqueue_many([NewTask(queue="drained", payload=i) for i in range(5)])
    await store.enqueue("idle", "not drained here")
    sending, release = asyncio.Event(), asyncio.Event()

    async def send(task: Any) -> None:
        sending.set()
        await release.wait()

    registry = CollectorRegistry()
    register_collector(store, registry=registry)
    with serving(registry) as url:
        async with Runtime(store, send=send, nodes=2, config=NodeConfig(queue="drained")) as runtime:
            await asyncio.wait_for(sending.wait(), timeout=30)
            samples = await scrape(url)
            release.set()
            assert await runtime.wait_until_drained(timeout_s=30)
    tasks = series(samples, "asynccoord_queue_tasks")
    assert {queue for queue, _status in tasks} == {"drained"}
    assert tasks[("drained", "pending")] + tasks[("drained", "running")] == 5
    assert tasks[("drained", "running")] >= 1
    assert tasks[("drained", "dead")] == 0
    assert series(samples, "asynccoord_live_nodes") == {("drained",): 2.0}


async def test_a_store_that_cannot_be_read_marks_the_values_stale_then_drops_them(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A failed read keeps the scrape at 200: the last values are served with up 0 until they are
    older than ``stale_after_s``, then the value gauges are absent."""
    await store.enqueue(Q, "x")
    registry = CollectorRegistry()
    collector = register_collector(store, registry=registry, queues=[Q])
    (gauges,) = collector.queue_gauges()
    with serving(registry) as url:
        assert series(await scrape(url), "asynccoord_queue_tasks")[(Q, "pending")] == 1.0
        await store.close()
        gauges.refresh_s = 0.001  # every scrape reads
        with caplog.at_level(logging.WARNING, logger="asynccoord.monitor.gauges"):
            for _ in range(2):
                await asyncio.sleep(0.01)
                stale = await scrape(url)
                assert series(stale, "asynccoord_queue_stats_up") == {(): 0.0}
                assert series(stale, "asynccoord_queue_tasks")[(Q, "pending")] == 1.0
                assert series(stale, "asynccoord_queue_stats_age_seconds")[()] > 0.0
        failed = [r for r in caplog.records if "queue_gauges_failed" in r.getMessage()]
        assert len(failed) == 1, failed  # once per run of failures
        assert gauges.failures == 2
        gauges.stale_after_s = 0.001
        await asyncio.sleep(0.01)
        gone = await scrape(url)
        assert series(gone, "asynccoord_queue_stats_up") == {(): 0.0}
        for name in ("asynccoord_queue_tasks", "asynccoord_live_nodes", "asynccoord_queue_stats_age_seconds"):
            assert series(gone, name) == {}, name
        assert series(gone, "asynccoord_events_total")  # the rest of the page is served


async def test_values_gone_stale_behind_a_hung_read_are_not_up(store: Any) -> None:
    """A read that hangs after a good one: once the values pass ``stale_after_s`` they are dropped
    and ``up`` is 0 with them (it stayed 1 until the hung read timed out)."""
    await store.enqueue(Q, "x")
    release = asyncio.Event()
    real = store.queue_backlogs
    registry = CollectorRegistry()
    collector = register_collector(store, registry=registry, queues=[Q])
    (gauges,) = collector.queue_gauges()
    gauges.wait_s = 0.05
    with serving(registry) as url:
        assert series(await scrape(url), "asynccoord_queue_stats_up") == {(): 1.0}

        async def hanging(queues: Any) -> Any:
            await release.wait()
            return await real(queues)

        store.queue_backlogs = hanging
        gauges.refresh_s = 0.001  # the next scrape starts a read, which hangs
        await asyncio.sleep(0.01)
        fresh = await scrape(url)
        assert series(fresh, "asynccoord_queue_stats_up") == {(): 1.0}  # no read failed, the values are young
        assert series(fresh, "asynccoord_queue_tasks")[(Q, "pending")] == 1.0
        gauges.stale_after_s = 0.2
        await asyncio.sleep(0.3)
        gone = await scrape(url)
        assert series(gone, "asynccoord_queue_stats_up") == {(): 0.0}
        assert series(gone, "asynccoord_queue_tasks") == {}
        assert series(gone, "asynccoord_queue_stats_age_seconds") == {}
        release.set()


async def test_scrapes_on_the_loop_spaced_past_stale_after_s_never_say_a_healthy_store_is_down(
    store: Any,
) -> None:
    """On the loop's thread a scrape serves the previous scrape's read: spaced more than
    ``stale_after_s`` apart, every scrape found its values stale and said ``up`` 0 with nothing
    wrong (a 1 minute scrape interval against the default 60 s), and dropped the values: such a
    process never exported them. They are served with their age, ``up`` 1."""
    from prometheus_client import make_asgi_app

    await store.enqueue(Q, "x")
    registry = CollectorRegistry()
    collector = register_collector(store, registry=registry, queues=[Q])
    (gauges,) = collector.queue_gauges()
    gauges.refresh_s, gauges.stale_after_s = 0.01, 0.2
    app = make_asgi_app(registry)
    await asgi_scrape(app)  # starts the first read
    ups = []
    for _ in range(3):
        await asyncio.sleep(0.3)  # the read ended long ago; its values are past stale_after_s
        page = await asgi_scrape(app)
        ups.append(series(page, "asynccoord_queue_stats_up")[()])
        assert series(page, "asynccoord_queue_tasks")[(Q, "pending")] == 1.0
        assert series(page, "asynccoord_queue_stats_age_seconds")[()] > gauges.stale_after_s
    assert ups == [1.0, 1.0, 1.0]
    assert gauges.failures == 0


async def test_a_scrape_waits_at_most_wait_s_for_a_hung_store_and_the_loop_runs_on(store: Any) -> None:
    """A read that hangs: the scrape returns after ``wait_s`` without values (up 0), the event loop
    keeps running meanwhile, and the read's result is served once it comes."""
    await store.enqueue(Q, "x")
    release = asyncio.Event()
    real = store.queue_backlogs

    async def hanging(queues: Any) -> Any:
        await release.wait()
        return await real(queues)

    store.queue_backlogs = hanging
    registry = CollectorRegistry()
    collector = register_collector(store, registry=registry, queues=[Q])
    (gauges,) = collector.queue_gauges()
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    try:
        with serving(registry) as url:
            started = time.monotonic()
            first = await scrape(url)
            waited = time.monotonic() - started
            assert gauges.wait_s <= waited < 20.0
            assert ticks >= 10  # the loop ran all along (a tick every 10 ms over >= 1 s)
            assert series(first, "asynccoord_queue_stats_up") == {(): 0.0}
            assert series(first, "asynccoord_queue_tasks") == {}
            assert gauges.reads == 1
            release.set()
            for _ in range(500):  # the read in flight completes on the loop
                if gauges.current()[1]:
                    break
                await asyncio.sleep(0.01)
            served = await scrape(url)
            assert series(served, "asynccoord_queue_stats_up") == {(): 1.0}
            assert series(served, "asynccoord_queue_tasks")[(Q, "pending")] == 1.0
            assert gauges.reads == 1  # not due again: the one read served both
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker


async def asgi_scrape(app: Any) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """One scrape of ``prometheus_client``'s own ASGI app, awaited here: it collects on the event loop's thread."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app({"type": "http", "method": "GET", "path": "/metrics", "headers": [], "query_string": b""}, receive, send)
    assert sent[0]["status"] == 200
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(sent[1]["body"].decode())
        for s in family.samples
    }


async def test_scrapes_on_the_event_loop_thread_start_reads_without_waiting_for_them(store: Any) -> None:
    """An ASGI app (``prometheus_client.make_asgi_app``, served by the app that hosts the nodes)
    collects on the store's own loop: the scrape cannot wait for a read there, but it starts one
    when due, and a later scrape serves its values."""
    from prometheus_client import make_asgi_app

    await store.enqueue_many([NewTask(queue=Q, payload=i) for i in range(3)])
    registry = CollectorRegistry()
    collector = register_collector(store, registry=registry, queues=[Q])
    (gauges,) = collector.queue_gauges()
    app = make_asgi_app(registry)
    first = await asgi_scrape(app)
    assert series(first, "asynccoord_queue_stats_up") == {(): 0.0}  # no reading yet
    assert gauges.reads == 1  # but one is under way
    for _ in range(500):
        if gauges.current()[1]:
            break
        await asyncio.sleep(0.01)
    served = await asgi_scrape(app)
    assert series(served, "asynccoord_queue_stats_up") == {(): 1.0}
    assert series(served, "asynccoord_queue_tasks")[(Q, "pending")] == 3.0
    assert gauges.reads == 1  # not due again within refresh_s


async def test_several_stores_keep_their_store_label() -> None:
    orders, billing = MemoryStore(), MemoryStore()
    await orders.open()
    await billing.open()
    await orders.enqueue("a", 1)
    await billing.enqueue("b", 1)
    await billing.enqueue("b", 2)
    registry = CollectorRegistry()
    register_collector(orders, registry=registry, name="orders", queues=["a"])
    register_collector(billing, registry=registry, name="billing", queues=["b"])
    with serving(registry) as url:
        samples = await scrape(url)
    pending = {k: v for k, v in series(samples, "asynccoord_queue_tasks").items() if k[1] == "pending"}
    assert pending == {("a", "pending", "orders"): 1.0, ("b", "pending", "billing"): 2.0}
    assert series(samples, "asynccoord_queue_stats_up") == {("orders",): 1.0, ("billing",): 1.0}
    await orders.close()
    await billing.close()


def test_without_an_event_loop_no_gauges_unless_queues_are_named() -> None:
    store = MemoryStore()
    registry = CollectorRegistry()
    collector = register_collector(store, registry=registry)  # as before: counters and histograms only
    assert collector.queue_gauges() == []
    assert b"asynccoord_queue_tasks" not in generate_latest(registry)
    with pytest.raises(InvalidArgumentError, match="from a coroutine running on the loop"):
        register_collector(store, registry=CollectorRegistry(), queues=[Q])
    assert b"asynccoord_queue" not in render_prometheus(store)


async def test_queue_gauges_check_their_arguments(store: Any) -> None:
    with pytest.raises(InvalidTypeError, match="queues must be a list or tuple"):
        QueueGauges(store, Q)
    with pytest.raises(InvalidArgumentError, match=r"queues\[0\]"):
        QueueGauges(store, [""])
    with pytest.raises(InvalidArgumentError, match="stale_after_s=5 < refresh_s=10"):
        QueueGauges(store, [Q], refresh_s=10, stale_after_s=5)
    with pytest.raises(InvalidTypeError, match="'queue_backlogs'"):
        QueueGauges(object(), [Q])


@SHARED
async def test_the_backlog_read_touches_no_done_task(make_store: Any, backend: str) -> None:
    """Among 3,000 done tasks, the read walks the pending, running and dead tasks' indexes only."""
    store = await make_store(clock=None)
    await store.enqueue_many([NewTask(queue=Q, payload=i, max_attempts=1) for i in range(3010)])
    claimed = await store.claim(Q, node_id="n", limit=3003)
    assert all(not isinstance(r, Exception) for r in await store.complete_many(claimed[:3000]))
    await store.fail(claimed[3000], "refused")
    if backend == "sqlite":
        from asynccoord.backends.sqlfiles import load_queries

        with contextlib.closing(sqlite3.connect(store.path)) as raw:
            sql = load_queries("sqlite")["queue_backlog"]
            plan = [row[3] for row in raw.execute("EXPLAIN QUERY PLAN " + sql, {"queue": Q, "now": time.time()})]
        searched = [step for step in plan if "coord_tasks" in step]
        assert searched == [
            "SEARCH coord_tasks USING COVERING INDEX coord_tasks_pending (queue=?)",
            "SEARCH coord_tasks USING INDEX coord_tasks_lease_expiry (queue=?)",
            "SEARCH coord_tasks USING INDEX coord_tasks_dead_order (queue=?)",
        ]
    else:
        import json

        import asyncpg

        from asynccoord.backends.postgres.store import Q as PG_QUERIES

        conn = await asyncpg.connect(PG_DSN, server_settings={"search_path": store.schema})
        try:
            await conn.execute("ANALYZE coord_tasks")
            query = PG_QUERIES["queue_backlog"]
            text = await conn.fetchval(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + query.text, *query.args({"queue": Q, "now_s": time.time() + 1})
            )
        finally:
            await conn.close()

        def scans(node: dict[str, Any]) -> list[dict[str, Any]]:
            own = [node] if node.get("Relation Name") == "coord_tasks" else []
            return own + [s for child in node.get("Plans", []) for s in scans(child)]

        read = scans(json.loads(text)[0]["Plan"])
        assert {s["Index Name"] for s in read} - {"coord_tasks_pending"} == {  # the count's index: the planner's pick
            "coord_tasks_pending_due",
            "coord_tasks_lease_expiry",
            "coord_tasks_dead_order",
        }
        # 7 pending, 2 running, 1 dead counted, and the oldest due pending task is one entry read.
        assert sum(s["Actual Rows"] * s["Actual Loops"] for s in read) == 11
    [backlog] = await store.queue_backlogs([Q])
    assert (backlog.pending, backlog.running, backlog.dead) == (7, 2, 1)
