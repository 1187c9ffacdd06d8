"""OpenTelemetry traces of a node's deliveries (asynccoord.node.tracing), read back from the SDK's in-memory exporter.

Each test configures the global tracer provider, as an application does, runs a real node on
a real store, and reads the finished spans. The provider is reset after each test (as
OpenTelemetry's own test utilities do), so nodes of other tests run untraced. Without the
``otel`` extra the node must run untraced: checked in a subprocess whose import of
``opentelemetry`` fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.util._once import Once
from support import wait_until

from asynccoord import Lock, NewTask, RateLimited, RetryPolicy, Task, TaskStatus
from asynccoord.node import Node, NodeConfig, current_delivery, tracing
from asynccoord.node.flight import FlightState

QUEUE = "traced"
FAST_IDLE = {"idle_min_s": 0.01, "idle_max_s": 0.05}


def _reset_global_provider() -> None:
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """The global tracer provider, configured with an in-memory exporter for the test's duration."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _reset_global_provider()
    trace.set_tracer_provider(provider)
    yield exporter
    provider.shutdown()
    _reset_global_provider()


async def run_until_done(node: Node, store: Any, ids: list[int], status: TaskStatus = TaskStatus.DONE) -> None:
    run = asyncio.create_task(node.run())

    async def settled() -> bool:
        return all([(await store.get(i)).status is status for i in ids])

    try:
        await wait_until(settled, 10.0, f"tasks {ids} to be {status.value}")
    finally:
        node.stop_claiming()
        await asyncio.wait_for(run, 5.0)
    await asyncio.sleep(0.01)  # a send task's done callback (which ends its span) runs a loop turn later


def named(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def children(spans: list[ReadableSpan], parent: ReadableSpan) -> dict[str, ReadableSpan]:
    """The spans whose parent is ``parent``, by name (one each)."""
    ctx = parent.get_span_context()
    kids = [s for s in spans if s.parent is not None and s.parent.span_id == ctx.span_id]
    out = {s.name: s for s in kids}
    assert len(out) == len(kids), f"two children of one name under {parent.name}: {[s.name for s in kids]}"
    return out


def deliveries_of(spans: list[ReadableSpan], task_id: int) -> list[ReadableSpan]:
    found = [s for s in named(spans, "asynccoord.deliver") if s.attributes["messaging.message.id"] == str(task_id)]
    return sorted(found, key=lambda s: (s.attributes["asynccoord.attempt"], s.start_time))


def test_the_states_the_send_span_reads_are_flight_states() -> None:
    # tracing names FlightState's values (flight.py imports tracing, so tracing cannot import it).
    values = {s.value for s in FlightState}
    assert tracing.TIMED_OUT in values
    assert values >= tracing.CUT
    assert {FlightState(v) for v in tracing.CUT} == {
        FlightState.LEASE_LOST,
        FlightState.LOCK_LOST,
        FlightState.DROPPED,
        FlightState.LOCK_DROPPED,
    }


@pytest.mark.parametrize("permits", [1, 2], ids=["lock", "semaphore"])
async def test_one_trace_per_delivery_with_claim_lock_wait_send_and_commit(
    make_store: Any, exporter: InMemorySpanExporter, permits: int
) -> None:
    store = await make_store(clock=None)
    keys = ["conv-a", "conv-a", "conv-b"]  # conv-a's second task is leased by its first's commit (claim_next)
    enqueued = await store.enqueue_many([NewTask(queue=QUEUE, payload=i, partition_key=k) for i, k in enumerate(keys)])
    ids = [e.task.id for e in enqueued]
    app = trace.get_tracer("the-app")
    seen: dict[int, dict[str, Any]] = {}

    async def send(task: Task) -> None:
        # What an instrumented HTTP client does: a span of its own, under whatever span is current.
        with app.start_as_current_span("POST /messages") as http:
            delivery = current_delivery()
            assert delivery.lock is not None
            seen[task.id] = {"token": delivery.lock.fencing_token, "http": http.get_span_context()}
        await asyncio.sleep(0.01)

    node = Node(
        store,
        send,
        node_id="n1",
        config=NodeConfig(queue=QUEUE, lock_permits=permits, **FAST_IDLE),
        lock_key=lambda t: f"acct:{t.partition_key}",
    )
    await run_until_done(node, store, ids)
    spans = list(exporter.get_finished_spans())

    claims = {s.get_span_context().span_id: s for s in named(spans, "asynccoord.claim")}
    commits = {s.get_span_context().span_id: s for s in named(spans, "asynccoord.commit")}
    delivers = [deliveries_of(spans, i) for i in ids]
    assert [len(d) for d in delivers] == [1, 1, 1]  # one delivery attempt each
    traces = {d[0].context.trace_id for d in delivers}
    assert len(traces) == 3  # one trace per delivery
    for chain, task_id, key, [deliver] in zip((0, 1, 0), ids, keys, delivers, strict=True):
        assert deliver.parent is None  # the root of its trace
        assert deliver.kind is SpanKind.CONSUMER
        token = seen[task_id]["token"]
        assert dict(deliver.attributes) == {
            "messaging.system": "asynccoord",
            "messaging.destination.name": QUEUE,
            "messaging.client.id": "n1",
            "messaging.operation.name": "deliver",
            "messaging.operation.type": "process",
            "messaging.message.id": str(task_id),
            "messaging.destination.partition.id": str((await store.get(task_id)).partition),
            "asynccoord.partition_key": key,
            "asynccoord.attempt": 1,
            "asynccoord.chain": chain,  # conv-a's second task: the first's slot took it by claim_next
            "asynccoord.lock.name": f"acct:{key}",
            "asynccoord.lock.fencing_token": token,
            "asynccoord.flight.state": "settled",
        }
        steps = children(spans, deliver)
        assert set(steps) == {"asynccoord.lock_wait", "asynccoord.send", "asynccoord.commit"}
        in_trace = [s for s in spans if s.context.trace_id == deliver.context.trace_id]
        assert len(in_trace) == 5  # deliver, its three steps, and the span made inside send
        assert steps["asynccoord.lock_wait"].attributes["asynccoord.lock.fencing_token"] == token
        assert steps["asynccoord.commit"].attributes["asynccoord.lock.fencing_token"] == token
        assert steps["asynccoord.commit"].attributes["messaging.operation.type"] == "settle"
        assert steps["asynccoord.commit"].kind is SpanKind.CLIENT
        # The span made inside send nests under the send span.
        [http] = [s for s in in_trace if s.name == "POST /messages"]
        assert http.get_span_context() == seen[task_id]["http"]
        assert http.parent is not None
        assert http.parent.span_id == steps["asynccoord.send"].context.span_id
        # In order: the lock is taken, then the send runs, then the commit.
        lock_wait, sent, commit = (steps[f"asynccoord.{n}"] for n in ("lock_wait", "send", "commit"))
        assert deliver.start_time <= lock_wait.start_time <= lock_wait.end_time <= sent.start_time
        assert sent.end_time <= commit.start_time <= commit.end_time <= deliver.end_time
        for span in (deliver, *steps.values()):
            assert span.status.status_code is StatusCode.UNSET
        # Linked to the claim that leased the task, or to the commit that did (claim_next).
        [link] = deliver.links
        leased_by = claims.get(link.context.span_id) or commits[link.context.span_id]
        assert leased_by.context.trace_id != deliver.context.trace_id
    # conv-a's second task was leased by the commit of its first (in the first's trace).
    [link] = delivers[1][0].links
    assert commits[link.context.span_id].context.trace_id == delivers[0][0].context.trace_id
    [link] = delivers[0][0].links
    claim = claims[link.context.span_id]
    assert claim.kind is SpanKind.CLIENT
    assert claim.parent is None
    assert claim.attributes["messaging.operation.type"] == "receive"
    assert claim.attributes["messaging.destination.name"] == QUEUE
    assert claim.attributes["messaging.client.id"] == "n1"
    assert claim.attributes["messaging.batch.message_count"] >= 1


async def test_a_failed_send_is_recorded_and_its_retry_is_a_new_attempt(
    make_store: Any, exporter: InMemorySpanExporter
) -> None:
    store = await make_store(clock=None)
    [enqueued] = await store.enqueue_many([NewTask(queue=QUEUE, payload="m", partition_key="k", max_attempts=3)])
    calls = 0

    async def send(task: Task) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ValueError("provider said no")

    config = NodeConfig(queue=QUEUE, retry=RetryPolicy(base_s=0.05, jitter=0.0), **FAST_IDLE)
    node = Node(store, send, node_id="n1", config=config)
    await run_until_done(node, store, [enqueued.task.id])
    spans = list(exporter.get_finished_spans())

    first, second = deliveries_of(spans, enqueued.task.id)
    assert (first.attributes["asynccoord.attempt"], second.attributes["asynccoord.attempt"]) == (1, 2)
    assert first.context.trace_id != second.context.trace_id
    failed = children(spans, first)
    assert set(failed) == {"asynccoord.send"}  # no lock asked for; a failed attempt has no commit
    send_span = failed["asynccoord.send"]
    assert send_span.status.status_code is StatusCode.ERROR
    assert send_span.status.description == "ValueError: provider said no"
    [event] = send_span.events
    assert event.name == "exception"
    assert event.attributes["exception.type"] == "ValueError"
    assert event.attributes["exception.message"] == "provider said no"
    assert first.status.status_code is StatusCode.ERROR
    assert first.status.description == "send failed: ValueError"
    retried = children(spans, second)
    assert set(retried) == {"asynccoord.send", "asynccoord.commit"}
    assert all(s.status.status_code is StatusCode.UNSET for s in (second, *retried.values()))


async def test_a_rate_limited_send_is_no_error_and_says_so(make_store: Any, exporter: InMemorySpanExporter) -> None:
    store = await make_store(clock=None)
    [enqueued] = await store.enqueue_many([NewTask(queue=QUEUE, payload="m", partition_key="k", max_attempts=3)])
    calls = 0

    async def send(task: Task) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RateLimited(0.2, dimension="chat", key="c1")

    node = Node(store, send, node_id="n1", config=NodeConfig(queue=QUEUE, **FAST_IDLE))
    await run_until_done(node, store, [enqueued.task.id])
    spans = list(exporter.get_finished_spans())

    limited, sent = deliveries_of(spans, enqueued.task.id)
    # A 429 uses no attempt: both deliveries are attempt 1, and neither is an error.
    assert (limited.attributes["asynccoord.attempt"], sent.attributes["asynccoord.attempt"]) == (1, 1)
    send_span = children(spans, limited)["asynccoord.send"]
    for span in (limited, send_span):
        assert span.status.status_code is StatusCode.UNSET, span.name
        assert span.attributes[tracing.RATE_LIMITED] is True
        assert span.attributes["asynccoord.rate_limited.retry_after_s"] == 0.2
        assert span.attributes["asynccoord.rate_limited.dimension"] == "chat"
        assert span.attributes["asynccoord.rate_limited.key"] == "c1"
    assert send_span.events == ()  # no exception recorded
    assert sent.status.status_code is StatusCode.UNSET
    assert tracing.RATE_LIMITED not in sent.attributes


async def test_a_send_cut_at_its_timeout_is_an_error_on_the_send_span(
    make_store: Any, exporter: InMemorySpanExporter
) -> None:
    store = await make_store(clock=None)
    [enqueued] = await store.enqueue_many([NewTask(queue=QUEUE, payload="m", max_attempts=1)])

    async def send(task: Task) -> None:
        await asyncio.sleep(30)

    node = Node(store, send, node_id="n1", config=NodeConfig(queue=QUEUE, send_timeout_s=0.1, **FAST_IDLE))
    await run_until_done(node, store, [enqueued.task.id], status=TaskStatus.DEAD)
    spans = list(exporter.get_finished_spans())
    [deliver] = deliveries_of(spans, enqueued.task.id)
    send_span = children(spans, deliver)["asynccoord.send"]
    assert send_span.status.status_code is StatusCode.ERROR
    assert [e.attributes["exception.type"] for e in send_span.events] == ["TimeoutError"]
    assert deliver.status.description == "send failed: TimeoutError"


def _ignoring_cancellation(run_s: float) -> Any:
    """A send that swallows every cancellation and returns ``run_s`` after it started."""

    async def send(task: Task) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + run_s
        while (left := end - loop.time()) > 0:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(left)

    return send


async def _drain_one_overrunning_send(store: Any, overrun_s: float, run_s: float, status: TaskStatus) -> int:
    """Run a node until one task, whose send ignores its 0.1 s timeout and returns ``run_s`` after
    it began, is ``status`` (``send_overrun_s=overrun_s``); its id."""
    [enqueued] = await store.enqueue_many([NewTask(queue=QUEUE, payload="m", max_attempts=1)])
    config = NodeConfig(queue=QUEUE, send_timeout_s=0.1, send_overrun_s=overrun_s, **FAST_IDLE)
    node = Node(store, _ignoring_cancellation(run_s), node_id="n1", config=config)
    await run_until_done(node, store, [enqueued.task.id], status=status)
    return enqueued.task.id


async def test_a_send_returning_past_its_timeout_while_waited_for_is_committed_without_an_error(
    make_store: Any, exporter: InMemorySpanExporter
) -> None:
    task_id = await _drain_one_overrunning_send(await make_store(clock=None), 5.0, 0.6, TaskStatus.DONE)
    spans = list(exporter.get_finished_spans())
    [deliver] = deliveries_of(spans, task_id)
    send_span = children(spans, deliver)["asynccoord.send"]
    assert send_span.status.status_code is StatusCode.UNSET
    assert send_span.attributes[tracing.RETURNED_LATE] is True
    assert deliver.status.status_code is StatusCode.UNSET
    assert "asynccoord.commit" in children(spans, deliver)


async def test_a_send_let_go_at_its_overrun_bound_is_an_error_when_it_ends(
    make_store: Any, exporter: InMemorySpanExporter
) -> None:
    await _drain_one_overrunning_send(await make_store(clock=None), 0.3, 1.0, TaskStatus.DEAD)

    def send_spans() -> list[ReadableSpan]:
        return named(list(exporter.get_finished_spans()), "asynccoord.send")

    async def ended() -> bool:
        return bool(send_spans())

    await wait_until(ended, 5.0, "the let-go send to end")
    [send_span] = send_spans()
    assert send_span.status.status_code is StatusCode.ERROR
    assert tracing.RETURNED_LATE not in send_span.attributes


async def test_a_lock_wait_that_times_out_is_an_error_on_the_lock_wait_span(
    make_store: Any, exporter: InMemorySpanExporter
) -> None:
    store = await make_store(clock=None)
    [enqueued] = await store.enqueue_many([NewTask(queue=QUEUE, payload="m", partition_key="k")])
    holder = Lock(store, "acct:k", ttl_s=5.0, holder="someone-else")
    await holder.acquire()
    node = Node(
        store,
        lambda task: asyncio.sleep(0),
        node_id="n1",
        config=NodeConfig(queue=QUEUE, lock_wait_s=0.1, busy_requeue_s=0.05, **FAST_IDLE),
        lock_key=lambda t: "acct:k",
    )
    run = asyncio.create_task(node.run())
    try:
        await wait_until(
            lambda: asyncio.sleep(0, result=bool(named(list(exporter.get_finished_spans()), "asynccoord.deliver"))),
            5.0,
            "a delivery span",
        )
        await holder.release()
        await wait_until(
            lambda: _status_is(store, enqueued.task.id, TaskStatus.DONE),
            10.0,
            "the task to be done once the lock is free",
        )
    finally:
        node.stop_claiming()
        await asyncio.wait_for(run, 5.0)
    spans = list(exporter.get_finished_spans())
    busy, *_, done = deliveries_of(spans, enqueued.task.id)
    wait = children(spans, busy)["asynccoord.lock_wait"]
    assert set(children(spans, busy)) == {"asynccoord.lock_wait"}  # handed back: never sent
    assert wait.status.status_code is StatusCode.ERROR
    assert [e.attributes["exception.type"] for e in wait.events] == ["asynccoord.errors.LockTimeoutError"]
    assert busy.attributes["asynccoord.flight.state"] == "lock_busy"  # handed back before its send
    assert set(children(spans, done)) == {"asynccoord.lock_wait", "asynccoord.send", "asynccoord.commit"}


async def _status_is(store: Any, task_id: int, status: TaskStatus) -> bool:
    return (await store.get(task_id)).status is status


async def test_tracing_false_makes_no_spans(make_store: Any, exporter: InMemorySpanExporter) -> None:
    store = await make_store(clock=None)
    enqueued = await store.enqueue_many([NewTask(queue=QUEUE, payload=i) for i in range(3)])
    node = Node(
        store, lambda task: asyncio.sleep(0), node_id="n1", config=NodeConfig(queue=QUEUE, tracing=False, **FAST_IDLE)
    )
    await run_until_done(node, store, [e.task.id for e in enqueued])
    assert node.state().committed == 3
    assert exporter.get_finished_spans() == ()
    assert node._tracer is None


_UNTRACED_RUN = textwrap.dedent(
    """
    import asyncio, json, sys

    if sys.argv[1] == "no-otel":
        sys.modules["opentelemetry"] = None  # as if the otel extra were not installed: its import fails

    from asynccoord import MemoryStore, NewTask
    from asynccoord.node import Node, NodeConfig, tracing

    async def drain(store):
        await store.enqueue_many([NewTask(queue="q", payload=i, partition_key=f"k{i % 2}") for i in range(5)])
        node = Node(store, lambda task: asyncio.sleep(0), node_id="n1",
                    config=NodeConfig(queue="q", idle_min_s=0.01, idle_max_s=0.02),
                    lock_key=lambda t: "acct:" + t.partition_key)
        run = asyncio.create_task(node.run())
        while node.state().committed < 5:
            await asyncio.sleep(0.01)
        node.stop_claiming()
        await run
        return node

    async def main():
        async with MemoryStore() as store:
            node = await drain(store)
        tracer = node._tracer
        print(json.dumps({
            "committed": node.state().committed,
            "tracer": tracer is not None,
            "claim_link": tracer is not None and tracer._claim_link is not None,
            "otel_loaded": tracing._otel is not None,
            "otel_modules": sorted(m for m in sys.modules if m.startswith("opentelemetry") and sys.modules[m]),
        }))

    asyncio.run(main())
    """
)


@pytest.mark.multiprocess
def test_without_the_otel_extra_the_node_runs_untraced(python: Any) -> None:
    proc = python.run(["-c", _UNTRACED_RUN, "no-otel"], timeout_s=60.0)
    out = json.loads(proc.stdout)
    assert out == {"committed": 5, "tracer": False, "claim_link": False, "otel_loaded": False, "otel_modules": []}


@pytest.mark.multiprocess
def test_with_the_api_but_no_sdk_configured_no_delivery_is_traced(python: Any) -> None:
    # The API's no-op tracer (no provider configured): one no-op span per claim, none per task.
    proc = python.run(["-c", _UNTRACED_RUN, "api-only"], timeout_s=60.0)
    out = json.loads(proc.stdout)
    assert out["committed"] == 5
    assert (out["tracer"], out["claim_link"], out["otel_loaded"]) == (True, False, True)
    assert "opentelemetry.sdk" not in out["otel_modules"]
