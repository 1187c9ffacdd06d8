"""The webhook sink: real HTTP to a local aiohttp server that fails on purpose.

The server (127.0.0.1, a free port) answers the first ``failures`` requests with a
chosen status (or hangs), then 200, and keeps every body it received. The monitor is
driven by hand (``background=False``) on a memory store; the sink's task runs for real.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from asynccoord import AlertRule, InvalidArgumentError, InvalidTypeError, MemoryStore, Monitor, RetryPolicy
from asynccoord import events as ev
from asynccoord.monitor.webhook import WebhookSink, retry_after_s

FAST_RETRY = RetryPolicy(base_s=0.01, factor=2.0, cap_s=0.05, jitter=0.5, max_attempts=4)
FENCING_RULE = AlertRule(name="fencing_rejections", event=ev.FENCING_REJECTED, threshold=0, window_s=60.0)


@dataclass
class Endpoint:
    """A local webhook endpoint: fails the first ``failures`` requests with ``status``."""

    failures: int = 0
    status: int = 503
    hang_s: float = 0.0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    requests: int = 0
    authorization: list[str | None] = field(default_factory=list)
    content_types: list[str | None] = field(default_factory=list)
    retry_after: str | None = None  # the failures' Retry-After header
    times: list[float] = field(default_factory=list)  # time.monotonic() of each request
    url: str = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.requests += 1
        self.times.append(time.monotonic())
        self.authorization.append(request.headers.get("Authorization"))
        self.content_types.append(request.headers.get("Content-Type"))
        body = await request.json()
        if self.hang_s:
            await asyncio.sleep(self.hang_s)
        if self.requests <= self.failures:
            headers = {} if self.retry_after is None else {"Retry-After": self.retry_after}
            return web.Response(status=self.status, text="no", headers=headers)
        self.bodies.append(body)
        return web.Response(status=200, text="ok")


@pytest.fixture
async def endpoint() -> AsyncIterator[Endpoint]:
    ep = Endpoint()
    app = web.Application()
    app.router.add_post("/hook/secret-token", ep.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    ep.url = f"http://127.0.0.1:{port}/hook/secret-token"
    yield ep
    await runner.cleanup()


async def fire(monitor: Monitor, store: MemoryStore) -> None:
    """Make ``FENCING_RULE`` fire once."""
    store.events.add(ev.FENCING_REJECTED)
    await monitor.flush()
    (alert,) = await monitor.evaluate()
    assert alert.firing


async def until(predicate: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def post_one_notice(endpoint: Endpoint) -> tuple[WebhookSink, int]:
    """Fire ``FENCING_RULE`` once with a sink to ``endpoint`` (``FAST_RETRY``) and wait until the
    notice is delivered; the sink, and the monitor's ``sink_failures`` then."""
    sink = WebhookSink(endpoint.url, retry=FAST_RETRY)
    async with (
        MemoryStore() as store,
        Monitor(store, rules=[FENCING_RULE], background=False, process_id="p1", sinks=[sink]) as monitor,
    ):
        await fire(monitor, store)
        await until(lambda: sink.statistics().delivered == 1)
        return sink, monitor.statistics().sink_failures


async def test_a_notice_is_posted_as_json_after_the_first_failures_are_retried(
    endpoint: Endpoint, caplog: pytest.LogCaptureFixture
) -> None:
    endpoint.failures = 2
    sink, sink_failures = await post_one_notice(endpoint)
    assert endpoint.requests == 3
    (body,) = endpoint.bodies
    assert body["rule"] == "fencing_rejections"
    assert body["state"] == "firing"
    assert body["count"] == 1
    assert "fencing_rejected" in body["text"]
    stats = sink.statistics()
    assert (stats.failed_attempts, stats.given_up, stats.dropped, stats.queued) == (2, 0, 0, 0)
    assert sink_failures == 0
    failed = [r.getMessage() for r in caplog.records if "asynccoord.monitor.webhook_failed" in r.getMessage()]
    assert len(failed) == 2
    assert all("HTTP 503" in m for m in failed)
    assert all("secret-token" not in m for m in failed)  # the URL's path is not logged


async def test_a_429_is_tried_again_after_its_retry_after_when_that_is_longer_than_the_backoff(
    endpoint: Endpoint,
) -> None:
    endpoint.failures, endpoint.status, endpoint.retry_after = 1, 429, "1"
    await post_one_notice(endpoint)
    assert endpoint.requests == 2
    assert endpoint.times[1] - endpoint.times[0] >= 0.99  # the backoff alone waits about 0.01 s


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("1", 1.0),
        (" 2.5 ", 2.5),
        ("0", 0.0),
        ("86400", 300.0),
        (None, None),
        ("-1", None),
        ("nan", None),
        ("inf", None),
        ("soon", None),
        ("Wed, 21 Oct 2015 07:28:00 GMT", None),
    ],
)
def test_retry_after_reads_seconds_only_and_caps_them(value: str | None, seconds: float | None) -> None:
    assert retry_after_s(value) == seconds


@pytest.mark.parametrize(("status", "attempts"), [(500, 4), (429, 4), (404, 1)])
async def test_a_notice_refused_every_time_or_outright_is_given_up_and_counted(
    endpoint: Endpoint, status: int, attempts: int
) -> None:
    """5xx and 429 are tried ``max_attempts`` times; another 4xx is not tried again."""
    endpoint.failures, endpoint.status = 10**6, status
    sink = WebhookSink(endpoint.url, retry=FAST_RETRY)
    async with (
        MemoryStore() as store,
        Monitor(store, rules=[FENCING_RULE], background=False, process_id="p1", sinks=[sink]) as monitor,
    ):
        await fire(monitor, store)
        await until(lambda: sink.statistics().given_up == 1)
        assert endpoint.requests == attempts
        assert sink.statistics().failed_attempts == attempts
        assert monitor.statistics().sink_failures == 1
        assert sink.statistics().failures == 1


async def test_an_unreachable_endpoint_is_retried_with_growing_delays() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    retry = RetryPolicy(base_s=0.05, factor=2.0, cap_s=1.0, jitter=0.0, max_attempts=4)
    sink = WebhookSink(f"http://127.0.0.1:{port}/hook", retry=retry)
    async with (
        MemoryStore() as store,
        Monitor(store, rules=[FENCING_RULE], background=False, process_id="p1", sinks=[sink]) as monitor,
    ):
        started = time.monotonic()
        await fire(monitor, store)
        await until(lambda: sink.statistics().given_up == 1)
        assert time.monotonic() - started >= 0.05 + 0.1 + 0.2  # the three backoff delays
        assert sink.statistics().failed_attempts == 4
        assert monitor.statistics().sink_failures == 1


async def test_a_hanging_endpoint_never_blocks_the_monitor_and_a_full_queue_drops_the_oldest(
    endpoint: Endpoint,
) -> None:
    """Each POST hangs far past the sink's timeout: evaluations still return at once, the
    bounded queue drops its oldest notices (counted), and closing the monitor takes at most
    the sink's close allowance."""
    endpoint.failures, endpoint.hang_s = 10**6, 30.0
    sink = WebhookSink(endpoint.url, retry=FAST_RETRY, queue_size=2, timeout_s=10.0)
    store = MemoryStore()
    await store.open()
    monitor = Monitor(store, rules=[FENCING_RULE], background=False, process_id="p1", sinks=[sink])
    await monitor.start()
    try:
        started = time.monotonic()
        for _ in range(5):  # fire, resolve, fire, ...: ten notices
            store.events.add(ev.FENCING_REJECTED)
            await monitor.flush()
            assert [a.firing for a in await monitor.evaluate()] == [True]
            monitor._incidents.clear()  # force the next evaluation to fire again
        assert time.monotonic() - started < 2.0  # nothing waited for the endpoint
        await until(lambda: endpoint.requests >= 1)
        stats = sink.statistics()
        assert stats.queued == 3  # one being sent, two waiting
        assert stats.dropped == 2
        assert monitor.statistics().sink_dropped == 2
    finally:
        started = time.monotonic()
        await monitor.close()
        await store.close()
    assert time.monotonic() - started < 8.0
    stats = sink.statistics()
    assert stats.delivered == 0
    assert stats.dropped == 5  # the queued ones and the one in flight, when the sink closed
    assert stats.queued == 0


async def test_a_sink_that_raises_on_offer_is_logged_and_the_evaluation_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken:
        async def start(self) -> None:
            pass

        def offer(self, alert: Any) -> None:
            raise RuntimeError("broken sink")

        async def aclose(self, timeout_s: float = 5.0) -> None:
            pass

        def statistics(self) -> Any:
            return WebhookSink("http://127.0.0.1:1/").statistics()

    async with (
        MemoryStore() as store,
        Monitor(store, rules=[FENCING_RULE], background=False, sinks=[Broken()]) as monitor,
    ):
        await fire(monitor, store)
        assert monitor.statistics().alerts_fired == 1
    assert any("asynccoord.monitor.sink_failed" in r.getMessage() for r in caplog.records)


def test_bad_webhook_arguments_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="http:// or https://"):
        WebhookSink("ftp://example.com/hook")
    with pytest.raises(InvalidArgumentError, match="http:// or https://"):
        WebhookSink("http:///no-host")
    with pytest.raises(InvalidArgumentError, match=r"with a host, got ''$"):  # what was given, not '://None'
        WebhookSink("")
    with pytest.raises(InvalidArgumentError) as caught:
        WebhookSink("ftp://bot:s3cret@example.com/T0/secret-token")
    assert str(caught.value).endswith("got 'ftp://example.com'")  # credentials and path hidden
    with pytest.raises(InvalidTypeError, match="url must be a str"):
        WebhookSink(b"http://example.com")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="queue_size"):
        WebhookSink("http://example.com/hook", queue_size=0)
    with pytest.raises(InvalidArgumentError, match="timeout_s"):
        WebhookSink("http://example.com/hook", timeout_s=0)
    with pytest.raises(InvalidTypeError, match="retry must be a RetryPolicy"):
        WebhookSink("http://example.com/hook", retry=3)  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match="headers"):
        WebhookSink("http://example.com/hook", headers={"X": 1})  # type: ignore[dict-item]
    with pytest.raises(InvalidTypeError, match="sinks must be a sequence of alert sinks"):
        Monitor(MemoryStore(), sinks=[object()])  # type: ignore[list-item]


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://[::1/hook", "'http://[::1'"),  # an unclosed IPv6 bracket
        ("http://[zz]/hook", "'http://[zz]'"),
        ("https://bot:s3cret@127.0.0.1:99999/T0/secret-token", "'https://127.0.0.1:99999'"),  # credentials, path hidden
        ("http://127.0.0.1:abc/hook?token=secret", "'http://127.0.0.1:abc'"),
        ("http://127.0.0.1:0/hook", "'http://127.0.0.1'"),
    ],
)
def test_a_malformed_host_or_port_is_refused_at_construction(url: str, shown: str) -> None:
    # Accepted, such a URL failed only when the first alert fired: urllib's ValueError from the
    # sink's task (and from its log line, and from repr()), the notice lost.
    with pytest.raises(InvalidArgumentError) as caught:
        WebhookSink(url)
    assert str(caught.value).endswith(f"{shown}")
    assert "secret" not in str(caught.value)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://exa mple.com/x", "url's host must not hold whitespace (no DNS name does), got 'http://exa mple.com'"),
        (
            "http://exa\u00a0mple.com/x",
            "url's host must not hold whitespace (no DNS name does), got 'http://exa\\xa0mple.com'",
        ),
        ("http://exa\x1bmple.com/x", "url must not hold the control character '\\x1b'"),
        ("http://exa\nmple.com/x", "url must not hold the control character '\\n'"),  # urllib reads example.com
        ("https://hooks.example.com/T0/secret-token\n", "url must not hold the control character '\\n'"),
    ],
)
def test_whitespace_in_the_host_or_a_control_character_is_refused_at_construction(url: str, message: str) -> None:
    # Accepted, "exa mple.com" was tried as a failed DNS lookup five times per notice, then dropped.
    with pytest.raises(InvalidArgumentError) as caught:
        WebhookSink(url)
    assert message in str(caught.value)
    assert "secret" not in str(caught.value)
    assert WebhookSink("http://example.com/a b").url == "http://example.com/a b"  # the path is not the host


async def test_the_body_is_the_alerts_json_with_a_text_line(endpoint: Endpoint) -> None:
    sink = WebhookSink(endpoint.url, headers={"Authorization": "Bearer t"})
    async with (
        MemoryStore() as store,
        Monitor(store, rules=[FENCING_RULE], background=False, process_id="p1", sinks=[sink]) as monitor,
    ):
        await fire(monitor, store)
        await until(lambda: sink.statistics().delivered == 1)
        (alert,) = monitor.active_alerts()
    (body,) = endpoint.bodies
    assert body == json.loads(json.dumps({**alert.to_dict(), "labels": {}, "text": alert.describe()}))
    assert endpoint.authorization == ["Bearer t"]


async def test_the_sinks_labels_name_the_cluster_in_the_body_and_its_text(endpoint: Endpoint) -> None:
    sink = WebhookSink(endpoint.url, labels={"cluster": "prod", "db": "orders (schema bot)"})
    async with (
        MemoryStore() as store,
        Monitor(store, rules=[FENCING_RULE], background=False, process_id="p1", sinks=[sink]) as monitor,
    ):
        await fire(monitor, store)
        await until(lambda: sink.statistics().delivered == 1)
        (alert,) = monitor.active_alerts()
    (body,) = endpoint.bodies
    assert body["labels"] == {"cluster": "prod", "db": "orders (schema bot)"}
    assert body["text"] == f"[cluster=prod db=orders (schema bot)] {alert.describe()}"
    assert {k: v for k, v in body.items() if k not in ("labels", "text")} == json.loads(json.dumps(alert.to_dict()))


def test_labels_keep_unicode_spaces_and_an_empty_value() -> None:
    labels = {"cluster": "prod eu", "région": "Île-de-France ✓", "empty": ""}
    assert WebhookSink("http://example.com/hook", labels=labels).labels == labels


@pytest.mark.parametrize(
    ("labels", "error", "message"),
    [
        ({"": "prod"}, InvalidArgumentError, "labels name"),
        ({" ": "prod"}, InvalidArgumentError, "labels name"),
        ({"cluster": 1}, InvalidTypeError, r"labels\['cluster'\] must be a str, got int"),
        ({1: "prod"}, InvalidTypeError, "labels names must be str, got int"),
        ({"cluster": "x" * 1025}, InvalidArgumentError, "is 1025 characters long: at most 1024"),
        ([("cluster", "prod")], InvalidTypeError, "labels must be a mapping"),
        # Shown on one line of the notice's text, and sent as JSON a strict receiver must decode:
        ({"cluster": "prod\n"}, InvalidArgumentError, r"labels\['cluster'\] holds the control character '\\n'"),
        ({"cluster": "a\rb"}, InvalidArgumentError, r"labels\['cluster'\] holds the control character '\\r'"),
        ({"cluster": "a\x00b"}, InvalidArgumentError, r"holds the control character '\\x00'"),
        ({"cluster": "a\x1b[31m"}, InvalidArgumentError, r"holds the control character '\\x1b'"),
        ({"cluster": "a\ud800"}, InvalidArgumentError, r"labels\['cluster'\] holds the lone surrogate '\\ud800'"),
        ({"clu\nster": "prod"}, InvalidArgumentError, r"labels name 'clu\\nster' holds the control character"),
        ({"clu\tster": "prod"}, InvalidArgumentError, r"labels name 'clu\\tster' holds the control character"),
    ],
)
def test_bad_labels_are_refused_naming_the_label(labels: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        WebhookSink("http://example.com/hook", labels=labels)


@pytest.mark.parametrize(
    ("headers", "error", "message"),
    [
        ({"X-Token": "Bearer abc\n"}, InvalidArgumentError, r"headers\['X-Token'\] holds the control character '\\n'"),
        ({"X-Token": "a\rb"}, InvalidArgumentError, "control character '\\\\r'"),
        ({"X-Token": "a\x00b"}, InvalidArgumentError, "control character"),
        ({"X-Token": "a\x7fb"}, InvalidArgumentError, "control character"),
        ({"X Token": "v"}, InvalidArgumentError, "'X Token' is not an HTTP header name"),
        ({"X-Token\n": "v"}, InvalidArgumentError, "is not an HTTP header name"),
        ({"": "v"}, InvalidArgumentError, "is not an HTTP header name"),
        ({"X-Token": b"abc"}, InvalidTypeError, r"headers\['X-Token'\] must be a str, got bytes"),
        ({"X-Token": None}, InvalidTypeError, "must be a str, got NoneType"),
        ({b"X-Token": "abc"}, InvalidTypeError, "headers names must be str, got bytes"),
        ([("X-Token", "abc")], InvalidTypeError, "headers must be a mapping"),
    ],
)
def test_a_header_no_request_could_carry_is_refused_by_the_constructor(
    headers: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message) as info:
        WebhookSink("http://example.com/hook", headers=headers)
    assert "abc" not in str(info.value)  # the value may be a secret: never in the message


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("Content-Length", "the sink frames the body itself"),  # was: the body cut to its value, counted delivered
        ("transfer-encoding", "the sink frames the body itself"),  # was: every attempt failed
        ("TE", "the sink frames the body itself"),
        ("Trailer", "the sink frames the body itself"),
        ("Expect", "the HTTP client manages the exchange"),
        ("CONNECTION", "the HTTP client manages the connection"),
        ("Keep-Alive", "the HTTP client manages the connection"),
        ("Proxy-Connection", "the HTTP client manages the connection"),
        ("Upgrade", "the HTTP client manages the connection"),
        ("host", "the url names the host"),
    ],
)
def test_a_header_the_sink_sets_itself_is_refused_by_the_constructor(name: str, reason: str) -> None:
    with pytest.raises(InvalidArgumentError, match=rf"headers\['{name}'\] is set by the sink \({reason}\)") as info:
        WebhookSink("http://example.com/hook", headers={"X-Token": "ok", name: "abc"})
    assert "abc" not in str(info.value)


async def test_a_content_type_header_replaces_the_default_and_the_body_stays_json(endpoint: Endpoint) -> None:
    sink = WebhookSink(endpoint.url, headers={"content-type": "application/json; charset=utf-8"})
    async with (
        MemoryStore() as store,
        Monitor(store, rules=[FENCING_RULE], background=False, process_id="p1", sinks=[sink]) as monitor,
    ):
        await fire(monitor, store)
        await until(lambda: sink.statistics().delivered == 1)
    assert endpoint.content_types == ["application/json; charset=utf-8"]
    assert [body["rule"] for body in endpoint.bodies] == ["fencing_rejections"]


def test_a_header_value_with_a_tab_or_beyond_ascii_is_accepted() -> None:
    sink = WebhookSink("http://example.com/hook", headers={"X-Token": "a\tb", "X-Name": "café"})
    assert sink.headers == {"X-Token": "a\tb", "X-Name": "café"}


LOST_RULE = AlertRule(name="lost_leases", event=ev.LEASE_LOST, threshold=0, window_s=60.0)


async def test_an_unexpected_error_in_a_delivery_is_a_failed_attempt_and_the_sink_goes_on(
    endpoint: Endpoint, caplog: pytest.LogCaptureFixture
) -> None:
    """A request the HTTP client refuses to send (here a header changed after the constructor
    checked it) costs that notice only: counted, logged, not retried, and the next is sent."""
    sink = WebhookSink(endpoint.url, retry=FAST_RETRY, headers={"X-Token": "ok"})
    async with (
        MemoryStore() as store,
        Monitor(store, rules=[FENCING_RULE, LOST_RULE], background=False, process_id="p1", sinks=[sink]) as monitor,
    ):
        sink.headers["X-Token"] = "Bearer abc\n"
        await fire(monitor, store)
        await until(lambda: sink.statistics().given_up == 1)
        stats = sink.statistics()
        assert (stats.delivered, stats.failed_attempts, stats.given_up, stats.dropped) == (0, 1, 1, 0)
        assert endpoint.requests == 0
        assert monitor.statistics().sink_failures == 1
        sink.headers["X-Token"] = "ok"
        store.events.add(ev.LEASE_LOST)
        await monitor.flush()
        (alert,) = await monitor.evaluate()
        assert alert.rule == "lost_leases"
        await until(lambda: sink.statistics().delivered == 1)
        assert [b["rule"] for b in endpoint.bodies] == ["lost_leases"]
    stats = sink.statistics()
    assert (stats.delivered, stats.failed_attempts, stats.given_up, stats.dropped, stats.queued) == (1, 1, 1, 0, 0)
    failed = [r.getMessage() for r in caplog.records if "asynccoord.monitor.webhook_failed" in r.getMessage()]
    assert len(failed) == 1
    assert "ValueError" in failed[0]
    assert "gave_up=1" in failed[0]


async def test_a_sink_that_raises_on_close_does_not_escape_the_monitors_close(
    caplog: pytest.LogCaptureFixture,
) -> None:
    closed: list[str] = []

    class Broken:
        def __init__(self, name: str, fail: bool) -> None:
            self.name, self.fail = name, fail

        async def start(self) -> None:
            pass

        def offer(self, alert: Any) -> None:
            pass

        async def aclose(self, timeout_s: float = 5.0) -> None:
            closed.append(self.name)
            if self.fail:
                raise ValueError("broken close")

        def statistics(self) -> Any:
            return WebhookSink("http://127.0.0.1:1/").statistics()

    async with (
        MemoryStore() as store,
        Monitor(store, rules=[FENCING_RULE], background=False, sinks=[Broken("a", True), Broken("b", False)]),
    ):
        pass
    assert sorted(closed) == ["a", "b"]
    failed = [r.getMessage() for r in caplog.records if "asynccoord.monitor.sink_failed" in r.getMessage()]
    assert len(failed) == 1
    assert "ValueError: broken close" in failed[0]
