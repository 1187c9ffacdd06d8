"""``python -m asynccoord dashboard``: the page in a real browser, its live stream, and its safety.

A cluster with known contents is written to an SQLite file (tasks enqueued, claimed, done and
dead-lettered in two queues; a lock held; two members joined; a monitor with a firing alert);
the dashboard serves it read-only and headless Chromium (``tests/browser.py``) loads the page.
The numbers the page shows are compared with ``python -m asynccoord status --json`` of the
same file, run as a real process. The safety claims are tested over real HTTP: loopback by
default, a token required (and checked on every request) elsewhere, payloads hidden, no
method but GET and HEAD.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import secrets
import signal
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from browser import chromium_page
from conftest import PythonRunner
from services import REDIS_URL, redis_problem, unavailable

from asynccoord import NewTask, RateLimit, SQLiteStore
from asynccoord import events as ev
from asynccoord.cli.dashboard import TOKEN_ENV, open_dashboard
from asynccoord.cli.main import build_parser, main
from asynccoord.cli.printable import printable
from asynccoord.cli.status import open_status_store, status_report
from asynccoord.contract.locks import Lease
from asynccoord.contract.membership import MemberBeat
from asynccoord.errors import InvalidArgumentError
from asynccoord.locks.line import next_in_line
from asynccoord.monitor.dashboard.app import MIN_TOKEN_CHARS, serve
from asynccoord.monitor.dashboard.feed import HIDDEN, Feed, history_point
from asynccoord.monitor.histogram import ENQUEUE_TO_COMMIT_MS
from asynccoord.monitor.monitor import AlertRule, Monitor

SECRET = "payload-secret-7f3a"
TOKEN = "t0ken-for-the-dashboard-tests-only"


@dataclass
class Cluster:
    path: Path
    store: SQLiteStore
    monitor: Monitor


@contextlib.asynccontextmanager
async def known_cluster(path: Path) -> AsyncIterator[Cluster]:
    """A database with known contents, its writing store and monitor kept open (the alert stays firing)."""
    async with SQLiteStore(path) as store:
        for i in range(6):
            await store.enqueue("outbox", {"text": f"{SECRET} {i}"}, partition_key=f"chat-{i % 3}")
        for _ in range(3):
            await store.enqueue("mail", {"text": SECRET}, partition_key="m", max_attempts=1)
        claimed = await store.claim("outbox", node_id="node-a", limit=3, lease_s=600)
        for task in claimed[:2]:
            done = await store.complete(task)
            store.latencies.observe(ENQUEUE_TO_COMMIT_MS, (done.updated_at - task.created_at) * 1000.0)
        (doomed,) = await store.claim("mail", node_id="node-b", limit=1, lease_s=600)
        await store.fail(doomed, "provider said no")  # max_attempts=1: dead
        await store.set_dead_letter_policy("mail", "hold")
        lease = await store.try_acquire_lock("account:42", ttl_s=600, holder="node-a")
        assert isinstance(lease, Lease)
        await store.heartbeat(
            [
                MemberBeat(node_id="node-a", incarnation="i1", info={"queue": "outbox", "pid": 1}),
                MemberBeat(node_id="node-b", incarnation="i2", info={"queue": "outbox", "pid": 2}),
            ],
            ttl_s=600,
        )
        # Process-scoped: its monitor withdraws it at close (a leader leaves its cluster alerts stored).
        rule = AlertRule(name="dead_letters", event=ev.DEAD_LETTERED, window_s=60, threshold=0, scope="process")
        monitor = Monitor(store, rules=[rule], flush_interval_s=60, background=False, log_alerts=False)
        await monitor.start()
        try:
            await monitor.flush(force=True)
            fired = await monitor.evaluate()
            assert [a.rule for a in fired] == ["dead_letters"]
            yield Cluster(path=path, store=store, monitor=monitor)
        finally:
            await monitor.close()


async def status_json(python: PythonRunner, path: Path) -> dict[str, Any]:
    """``python -m asynccoord status --json --db path``, run as its own process."""
    proc = await asyncio.to_thread(python.run_module, "asynccoord", "status", "--db", str(path), "--json")
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


READ_PAGE = """(() => {
  const rows = (id) => [...document.querySelectorAll('#' + id + ' tbody tr')].filter((r) => !r.querySelector('.empty'));
  const cells = (tr) => Object.fromEntries(
    [...tr.querySelectorAll('td[data-k]')].map((td) => [td.dataset.k, td.textContent]));
  return {
    seq: Number(document.body.dataset.seq),
    queues: rows('queues').map(cells),
    dead: rows('dead').map(cells),
    nodes: rows('nodes').map(cells),
    processes: rows('processes').map(cells),
    locks: rows('locks').map(cells),
    alerts: rows('alerts').map(cells),
    resolved: rows('resolved').map(cells),
    events: rows('events').map(cells),
    held: rows('held').map((tr) => ({ ...cells(tr), wait_s: Number(tr.querySelector('td[data-k="wait"]').dataset.s) })),
    limits: rows('limits').map(cells),
    charts: document.querySelectorAll('#queue-charts canvas').length,
    latency_canvas: document.querySelectorAll('#latency-chart canvas').length,
    text: document.body.innerText,
  };
})()"""


def expected_on_page(report: dict[str, Any]) -> dict[str, Any]:
    """The numbers of a status report as the page writes them (exact text of each cell)."""
    rl = report["rate_limits"]["queues"]
    return {
        "queues": [
            {k: str(q[k]) for k in ("queue", "pending", "running", "expired_leases", "done", "dead", "total")}
            for q in report["queues"]
        ],
        "dead": [
            {"queue": q["queue"], "dead": str(q["dead"]), "dead_letter_policy": q["dead_letter_policy"] or "-"}
            for q in report["queues"]
        ],
        "nodes": [{"node_id": n["node_id"], "partitions": str(n["partitions"])} for n in report["nodes"]],
        "processes": [
            {"process_id": p["process_id"], "state": p["state"].replace("_", " "), "nodes": str(p["nodes"])}
            for p in report["processes"]
        ],
        "locks": [
            {"name": lock["name"], "holder": lock["holder"], "fencing_token": str(lock["fencing_token"])}
            for lock in report["locks"]
        ],
        "alerts": [{"rule": a["rule"], "event": a["event"]} for a in report["alerts"]],
        "events": [{"event": name, "total": str(n)} for name, n in sorted(report["events"]["totals"].items())],
        "held": sorted(
            ({"queue": q["queue"], "dimension": b["dimension"], "key": b["key"]} for q in rl for b in q["held"]),
            key=lambda b: (b["queue"], b["dimension"], b["key"]),
        ),
        "limits": [
            {
                "queue": q["queue"],
                "dimension": lim["dimension"],
                "rate": f"{lim['count']}/{lim['per_s']:g}s",
                "burst": str(lim["burst"]),
            }
            for q in rl
            for lim in q["limits"]
        ],
    }


def shown(page: dict[str, Any]) -> dict[str, Any]:
    """The fields of :func:`expected_on_page`, read from the page."""
    return {
        "queues": [
            {k: q[k] for k in ("queue", "pending", "running", "expired_leases", "done", "dead", "total")}
            for q in page["queues"]
        ],
        "dead": page["dead"],
        "nodes": [{"node_id": n["node_id"], "partitions": n["partitions"]} for n in page["nodes"]],
        "processes": [{k: p[k] for k in ("process_id", "state", "nodes")} for p in page["processes"]],
        "locks": [{k: lock[k] for k in ("name", "holder", "fencing_token")} for lock in page["locks"]],
        "alerts": [{"rule": a["rule"], "event": a["event"]} for a in page["alerts"]],
        "events": page["events"],
        "held": sorted(
            ({k: b[k] for k in ("queue", "dimension", "key")} for b in page["held"]),
            key=lambda b: (b["queue"], b["dimension"], b["key"]),
        ),
        "limits": page["limits"],
    }


async def test_the_page_shows_what_status_json_reports(tmp_path: Path, python: PythonRunner) -> None:
    async with (
        known_cluster(tmp_path / "cluster.db") as cluster,
        open_dashboard(cluster.path, port=0, interval_s=0.5) as dashboard,
        chromium_page(tmp_path / "profile") as page,
    ):
        report = await status_json(python, cluster.path)
        await page.goto(dashboard.url)
        await page.wait_for("document.body.dataset.ready === '1'")
        seen = await page.evaluate(READ_PAGE)
        assert shown(seen) == expected_on_page(report)
        # The known contents, spelled out: what both must show.
        assert [(q["queue"], q["pending"], q["running"], q["done"], q["dead"]) for q in seen["queues"]] == [
            ("mail", "2", "0", "0", "1"),
            ("outbox", "3", "1", "2", "0"),
        ]
        assert sorted(int(n["partitions"]) for n in seen["nodes"]) != [0, 0]
        assert sum(int(n["partitions"]) for n in seen["nodes"]) == report["partitions"]
        assert seen["locks"][0]["name"] == "account:42"
        # The test's own monitor reports, hosting no node; the two members name no process that reports.
        assert [(p["state"], p["nodes"]) for p in seen["processes"]] == [("live", "0")]
        assert [n["process"] for n in seen["nodes"]] == ["-", ""]
        assert seen["locks"][0]["fencing_token"] == "1"
        assert [a["rule"] for a in seen["alerts"]] == ["dead_letters"]
        assert [(d["queue"], d["dead_letter_policy"]) for d in seen["dead"]] == [("mail", "hold"), ("outbox", "skip")]
        assert seen["charts"] == 2
        assert seen["latency_canvas"] == 1
        assert "commits)" in seen["text"]  # the latency chart's caption names the measured commits
        assert "No rate limits reported." in seen["text"]
        assert SECRET not in seen["text"]
        shot = await page.screenshot(tmp_path / "dashboard.png")
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert shot.stat().st_size > 20_000


async def test_the_page_shows_a_muted_alert_as_muted_and_does_not_count_it(tmp_path: Path) -> None:
    path = tmp_path / "cluster.db"
    nodes = AlertRule(name="lost_nodes", event=ev.NODE_LOST, window_s=60, threshold=0, scope="process")
    locks = AlertRule(
        name="lost_locks", event=ev.LOCK_LOST, window_s=60, threshold=0, scope="process", inhibited_by="lost_nodes"
    )
    async with SQLiteStore(path) as store:
        monitor = Monitor(store, rules=[nodes, locks], flush_interval_s=60, background=False, log_alerts=False)
        await monitor.start()
        try:
            store.events.add(ev.NODE_LOST)
            store.events.add(ev.LOCK_LOST)
            await monitor.flush(force=True)
            assert [a.rule for a in await monitor.evaluate()] == ["lost_nodes"]
            async with (
                open_dashboard(path, port=0, interval_s=0.5) as dashboard,
                chromium_page(tmp_path / "profile") as page,
            ):
                await page.goto(dashboard.url)
                await page.wait_for("document.body.dataset.ready === '1'")
                seen = await page.evaluate(READ_PAGE)
                count = await page.evaluate("document.getElementById('alert-count').textContent")
        finally:
            await monitor.close()
    assert [a["rule"] for a in seen["alerts"]] == ["lost_nodes", "lost_locks (muted by lost_nodes)"]
    assert count == "(1) and muted (1)"


async def test_the_latency_caption_drops_commits_that_left_the_window(tmp_path: Path) -> None:
    """Once the only commit is older than the status window, the caption stops quoting it."""
    window_s = 5.0
    caption = "document.getElementById('latency-window').textContent"
    path = tmp_path / "cluster.db"
    async with SQLiteStore(path) as store:
        await store.enqueue("outbox", {"text": "hi"}, partition_key="chat-1")
        monitor = Monitor(store, rules=[], flush_interval_s=60, background=False, log_alerts=False)
        await monitor.start()
        try:
            async with (
                open_dashboard(path, port=0, interval_s=0.25, windows_s=(window_s,)) as dashboard,
                chromium_page(tmp_path / "profile") as page,
            ):
                await page.goto(dashboard.url)
                await page.wait_for(f"{caption} === '(no commits measured yet)'")
                (task,) = await store.claim("outbox", node_id="node-a", limit=1, lease_s=600)
                done = await store.complete(task)
                store.latencies.observe(ENQUEUE_TO_COMMIT_MS, (done.updated_at - task.created_at) * 1000.0)
                await monitor.flush(force=True)
                await page.wait_for(f"{caption}.endsWith(' 1 commits)')")
                # No commit since: once the window has passed over it, the newest snapshot has none.
                await page.wait_for(f"!{caption}.endsWith(' 1 commits)')", timeout_s=30.0)
                assert await page.evaluate(caption) == f"(no commits in the last {window_s:g} s)"
        finally:
            await monitor.close()


async def test_the_page_shows_the_rate_limits_status_json_reports(tmp_path: Path, python: PythonRunner) -> None:
    async with known_cluster(tmp_path / "cluster.db") as cluster:
        store = cluster.store
        await store.set_rate_limits(
            "limited",
            [
                RateLimit(dimension="chat", count=1, per_s=3600.0),
                RateLimit(dimension="account", count=5, per_s=60.0, burst=5),
            ],
        )
        for keys in ({"chat": "hot"}, {"chat": "hot"}, {"chat": "warm"}, {"account": "acme"}):
            await store.enqueue("limited", {"text": SECRET}, limit_keys=keys)
        assert len(await store.claim("limited", node_id="node-a", limit=10, lease_s=600)) == 3
        async with (
            open_dashboard(cluster.path, port=0, interval_s=0.5) as dashboard,
            chromium_page(tmp_path / "profile") as page,
        ):
            report = await status_json(python, cluster.path)
            await page.goto(dashboard.url)
            await page.wait_for("document.body.dataset.ready === '1'")
            seen = await page.evaluate(READ_PAGE)
            assert shown(seen) == expected_on_page(report)
            # Spelled out: hot and warm each spent their one token an hour long; acme has four left.
            assert [(b["queue"], b["dimension"], b["key"]) for b in seen["held"]] == [
                ("limited", "chat", "hot"),
                ("limited", "chat", "warm"),
            ]
            waits = {b["key"]: b["wait_s"] for q in report["rate_limits"]["queues"] for b in q["held"]}
            for b in seen["held"]:
                assert 3500 < b["wait_s"] <= 3600  # the hour less the seconds the test took
                assert b["wait_s"] == pytest.approx(waits[b["key"]], abs=30.0)  # read moments apart
            assert [(x["dimension"], x["rate"], x["burst"]) for x in seen["limits"]] == [
                ("account", "5/60s", "5"),
                ("chat", "1/3600s", "1"),
            ]
            assert "No rate limits reported." not in seen["text"]
            assert "(2)" in seen["text"]
            assert SECRET not in seen["text"]
            await page.screenshot(tmp_path / "dashboard-rate-limits.png")


async def test_the_page_follows_the_database_without_reloading(tmp_path: Path, python: PythonRunner) -> None:
    async with (
        known_cluster(tmp_path / "cluster.db") as cluster,
        open_dashboard(cluster.path, port=0, interval_s=0.3) as dashboard,
        chromium_page(tmp_path / "profile") as page,
    ):
        await page.goto(dashboard.url)
        await page.wait_for("document.body.dataset.ready === '1'")
        await page.evaluate("window.loadedOnce = 'yes'")  # gone if the page reloaded
        first = await page.evaluate(READ_PAGE)

        for i in range(4):
            await cluster.store.enqueue("outbox", {"text": SECRET}, partition_key=f"late-{i}")
        second_lease = await cluster.store.try_acquire_lock("account:7", ttl_s=600, holder="node-b")
        assert isinstance(second_lease, Lease)
        place = await cluster.store.try_acquire_lock(next_in_line("account:7"), ttl_s=600, holder="node-c")
        assert isinstance(place, Lease)  # a process waiting in line for account:7, as a LockPool marks it
        await cluster.monitor.close()  # withdraws its firing alert: the page must show it resolved
        report = await status_json(python, cluster.path)
        assert report["alerts"] == []

        await page.wait_for(
            '[...document.querySelectorAll(\'#queues tr[data-queue="outbox"] td[data-k="pending"]\')]'
            ".some((td) => td.textContent === '7')"
            " && document.querySelectorAll('#resolved tr[data-rule=\"dead_letters\"]').length === 1"
        )
        seen = await page.evaluate(READ_PAGE)
        assert seen["seq"] > first["seq"]
        assert await page.evaluate("window.loadedOnce") == "yes"
        assert shown(seen) == expected_on_page(report)
        assert [lock["name"] for lock in seen["locks"]] == ["account:42", "account:7", next_in_line("account:7")]
        assert await page.evaluate("document.getElementById('lock-count').textContent") == "(2) and places in line (1)"
        assert seen["alerts"] == []
        await page.screenshot(tmp_path / "dashboard-live.png")


async def test_the_page_of_many_queues_lists_and_charts_the_busiest(tmp_path: Path) -> None:
    path = tmp_path / "many.db"
    async with SQLiteStore(path) as store:
        # q00 has 30 dead letters; then q00..q11: q{i} has i + 1 tasks pending.
        await store.enqueue_many([NewTask(queue="q00", payload=SECRET, max_attempts=1) for _ in range(30)])
        doomed = await store.claim("q00", node_id="n", limit=100, lease_s=600)
        assert len(doomed) == 30
        for task in doomed:
            await store.fail(task, "no")
        await store.enqueue_many(
            [NewTask(queue=f"q{i:02d}", payload=SECRET, partition_key=f"k{j}") for i in range(12) for j in range(i + 1)]
        )
    async with open_status_store(path) as (reader, label):

        async def snapshot() -> dict[str, Any]:
            return await status_report(reader, db=label)

        feed = Feed(snapshot, interval_s=0.3, charted_queues=3, listed_queues=5)
        async with serve(feed, port=0) as dashboard, chromium_page(tmp_path / "profile") as page:
            await page.goto(dashboard.url)
            await page.wait_for(
                "document.body.dataset.ready === '1' && document.querySelectorAll('#queue-charts canvas').length === 3"
            )
            seen = await page.evaluate(READ_PAGE)
            # Listed: the five with the most tasks pending, running or dead, in name order.
            assert [(q["queue"], q["pending"], q["dead"]) for q in seen["queues"]] == [
                ("q00", "1", "30"),
                ("q08", "9", "0"),
                ("q09", "10", "0"),
                ("q10", "11", "0"),
                ("q11", "12", "0"),
            ]
            charted = await page.evaluate(
                "[...document.querySelectorAll('#queue-charts .chart')].map((c) => c.dataset.queue)"
            )
            assert charted == ["q09", "q10", "q11"]  # the most pending or running
            assert await page.evaluate("document.querySelectorAll('#total-chart canvas').length") == 1
            assert await page.evaluate("document.getElementById('summary').dataset.total") == str(78 + 30)
            assert "The 5 queues with the most tasks pending, claimed or dead, of 12" in seen["text"]
            assert SECRET not in seen["text"]
            await page.screenshot(tmp_path / "dashboard-many-queues.png")


async def test_with_a_lock_store_the_page_shows_the_locks_held_in_redis(tmp_path: Path) -> None:
    problem = redis_problem()
    if problem is not None:
        unavailable("Redis", problem)
    from asynccoord.backends.redis import RedisLockStore

    prefix = f"test-dash:{secrets.token_hex(6)}:"
    async with (
        known_cluster(tmp_path / "c.db") as cluster,
        RedisLockStore(REDIS_URL, prefix=prefix) as redis_locks,
    ):
        lease = await redis_locks.try_acquire_lock("account:99", ttl_s=600, holder="node-r")
        assert isinstance(lease, Lease)
        try:
            async with open_dashboard(cluster.path, port=0, lock_store=REDIS_URL, lock_prefix=prefix) as dashboard:
                status, body = await fetch(dashboard.url + "api/state")
                assert status == 200
                locks = json.loads(body)["sections"]["status"]["locks"]
                # As ``status --lock-store``: the database's locks, then the lock store's, each tagged.
                assert [(lock["name"], lock["store"]) for lock in locks] == [
                    ("account:42", "db"),
                    ("account:99", "lock_store"),
                ]
                assert locks[1]["holder"] == "node-r"
            async with open_dashboard(cluster.path, port=0) as dashboard:  # without: the database's locks
                _, body = await fetch(dashboard.url + "api/state")
                assert [lock["name"] for lock in json.loads(body)["sections"]["status"]["locks"]] == ["account:42"]
        finally:
            await redis_locks.release_lock(lease)
            import redis.asyncio as aioredis

            client = aioredis.Redis.from_url(REDIS_URL)
            try:
                keys = [k async for k in client.scan_iter(match=f"{prefix}*")]
                if keys:
                    await client.delete(*keys)
            finally:
                await client.aclose()


# --- safety -------------------------------------------------------------------------------


async def fetch(url: str, method: str = "GET", headers: dict[str, str] | None = None) -> tuple[int, str]:
    """One request; the status and (for a stream) the first event or (else) the body."""
    async with aiohttp.ClientSession() as session, session.request(method, url, headers=headers or {}) as reply:
        if reply.headers.get("Content-Type", "").startswith("text/event-stream") and method == "GET":
            text = ""
            while "\ndata: " not in text or not text.endswith("\n\n"):
                text += (await asyncio.wait_for(reply.content.readline(), 10)).decode()
            return reply.status, text
        return reply.status, await reply.text()


PATHS = ("", "static/app.js", "static/uPlot.iife.min.js", "api/state", "api/stream")


async def test_it_binds_loopback_unless_told_otherwise(tmp_path: Path) -> None:
    args = build_parser().parse_args(["dashboard", "--db", "x.db"])
    assert args.host == "127.0.0.1"
    assert args.port == 8765
    assert args.token is None
    assert not args.show_payloads
    async with known_cluster(tmp_path / "c.db") as cluster, open_dashboard(cluster.path, port=0) as dashboard:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", dashboard.url)
        status, _ = await fetch(dashboard.url)
        assert status == 200
        # A page of another site whose name was rebound to 127.0.0.1 is refused.
        status, _ = await fetch(dashboard.url, headers={"Host": "attacker.example"})
        assert status == 403


async def test_a_public_address_needs_a_token(tmp_path: Path, python: PythonRunner) -> None:
    async with known_cluster(tmp_path / "c.db") as cluster:
        with pytest.raises(InvalidArgumentError, match="ASYNCCOORD_DASHBOARD_TOKEN"):
            async with open_dashboard(cluster.path, host="0.0.0.0", port=0):
                pass
    for host in ("0.0.0.0", "::", "192.0.2.1"):
        proc = await asyncio.to_thread(
            python.run_module,
            "asynccoord",
            "dashboard",
            "--db",
            str(cluster.path),
            "--host",
            host,
            check=False,
            env={TOKEN_ENV: None},
        )
        assert proc.returncode == 2, proc.stderr
        assert "--token" in proc.stderr
        assert TOKEN_ENV in proc.stderr
    proc = await asyncio.to_thread(
        python.run_module,
        "asynccoord",
        "dashboard",
        "--db",
        str(cluster.path),
        "--host",
        "0.0.0.0",
        "--token",
        "short",
        check=False,
    )
    assert proc.returncode == 2
    assert "at least 16 characters" in proc.stderr


async def test_with_a_token_every_request_must_carry_it(tmp_path: Path) -> None:
    async with (
        known_cluster(tmp_path / "c.db") as cluster,
        open_dashboard(cluster.path, host="0.0.0.0", port=0, token=TOKEN) as dashboard,
    ):
        port = dashboard.url.rsplit(":", 1)[1].rstrip("/")
        base = f"http://127.0.0.1:{port}/"
        missing = (401, "an access token is needed: Authorization: Bearer TOKEN or ?token=TOKEN\n")
        wrong = (
            401,
            "wrong access token: give the one the dashboard was started with (--token or "
            "ASYNCCOORD_DASHBOARD_TOKEN), as Authorization: Bearer TOKEN or ?token=TOKEN\n",
        )
        for path in PATHS:
            assert await fetch(base + path) == missing, path
            assert await fetch(base + path + "?token=") == missing, path
            assert await fetch(base + path + "?token=" + TOKEN[:-1] + "x") == wrong, path
            assert await fetch(base + path, headers={"Authorization": "Bearer nope-nope-nope-nope"}) == wrong
            assert (await fetch(base + path, headers={"Authorization": f"Bearer {TOKEN}"}))[0] == 200, path
            assert (await fetch(base + path + "?token=" + TOKEN))[0] == 200, path
        # The page hands the token on to its files and its stream, and to the JSON it links without JavaScript.
        _, page = await fetch(base + "?token=" + TOKEN)
        assert f'src="static/app.js?token={TOKEN}"' in page
        [link] = re.findall(r'<noscript>.*?href="([^"]+)".*?</noscript>', page, re.S)
        assert link == f"api/state?token={TOKEN}"
        status, body = await fetch(base + link)
        assert status == 200
        assert [q["queue"] for q in json.loads(body)["sections"]["status"]["queues"]] == ["mail", "outbox"]


async def test_a_token_of_bytes_that_are_not_utf8_is_refused_as_any_other() -> None:
    async def report() -> dict[str, Any]:
        return _report(1.0, 0, [])

    async with serve(Feed(report), port=0, token=TOKEN) as dashboard:
        port = int(dashboard.url.rsplit(":", 1)[1].rstrip("/"))
        for target, auth in (
            (b"/api/state", b"Authorization: Bearer \xff\xfe\r\n"),
            (b"/api/state", b"Authorization: Bearer " + TOKEN.encode()[:-1] + b"\xff\r\n"),
            (b"/api/state?token=%ff%fe", b""),
            (b"/api/state", b"Authorization: Bearer " + TOKEN.encode() + b"\r\n"),
        ):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(
                    b"GET " + target + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth + b"Connection: close\r\n\r\n"
                )
                status_line = await asyncio.wait_for(reader.readline(), 10)
            finally:
                writer.close()
            expected = b"200 OK" if auth.endswith(TOKEN.encode() + b"\r\n") else b"401 Unauthorized"
            assert status_line == b"HTTP/1.1 " + expected + b"\r\n", (target, auth)


async def test_the_page_passes_its_token_on_in_a_browser(tmp_path: Path) -> None:
    async with (
        known_cluster(tmp_path / "c.db") as cluster,
        open_dashboard(cluster.path, host="0.0.0.0", port=0, token=TOKEN) as dashboard,
        chromium_page(tmp_path / "profile") as page,
    ):
        port = dashboard.url.rsplit(":", 1)[1].rstrip("/")
        await page.goto(f"http://127.0.0.1:{port}/?token={TOKEN}")
        await page.wait_for("document.body.dataset.ready === '1'")
        seen = await page.evaluate(READ_PAGE)
        assert [q["queue"] for q in seen["queues"]] == ["mail", "outbox"]


async def test_no_endpoint_writes(tmp_path: Path) -> None:
    async with known_cluster(tmp_path / "c.db") as cluster, open_dashboard(cluster.path, port=0) as dashboard:
        await cluster.store.close()  # nothing writes the file from now on, but the dashboard
        before = cluster.path.read_bytes()
        for path in (*PATHS, "api/tasks", "static/nothing"):
            for method in ("POST", "PUT", "PATCH", "DELETE", "OPTIONS"):
                status, _ = await fetch(dashboard.url + path, method)
                assert status == 405, (method, path)
            assert (await fetch(dashboard.url + path, "HEAD"))[0] == (
                404 if "nothing" in path or "tasks" in path else 200
            )
        await asyncio.sleep(0.5)  # a few polls
        assert cluster.path.read_bytes() == before


async def test_payloads_are_hidden_unless_asked(tmp_path: Path) -> None:
    async with known_cluster(tmp_path / "c.db") as cluster, open_dashboard(cluster.path, port=0) as dashboard:
        for path in PATHS:
            status, body = await fetch(dashboard.url + path)
            assert status == 200, path
            assert SECRET not in body, path

    # The feed's boundary: members named payload or result are hidden, wherever they are.
    async def report() -> dict[str, Any]:
        return {
            "now_s": 1.0,
            "queues": [],
            "latencies": [],
            "alerts": [],
            "dead_letters": [{"id": 1, "payload": {"text": SECRET}, "result": SECRET}],
        }

    hidden = Feed(report)
    await hidden.poll()
    assert SECRET not in json.dumps(hidden.state())
    assert hidden.state()["sections"]["status"]["dead_letters"][0]["payload"] == HIDDEN
    assert hidden.state()["sections"]["settings"]["show_payloads"] is False
    shown_ = Feed(report, show_payloads=True)
    await shown_.poll()
    assert shown_.state()["sections"]["status"]["dead_letters"][0]["payload"] == {"text": SECRET}


UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b\u200e\u200f\u2028-\u202e\u2066-\u2069\ufeff]")
"""The characters ``status`` and ``dead`` escape (asynccoord.cli.printable)."""


async def test_names_from_the_database_are_escaped_as_status_prints_them(tmp_path: Path) -> None:
    """Names may hold a right-to-left override; the caller's data (a holder, a key) an ANSI sequence too.

    A lock name with a control character, which no acquisition takes now, is written as an
    older version wrote it: shown escaped as well.
    """
    odd = "<img src=x>\u202e\x1b[31m"  # a right-to-left override, then an ANSI colour sequence
    name = "<img src=x>\u202e"  # what an identifier may hold of it
    path = tmp_path / "odd.db"
    async with SQLiteStore(path) as store:
        await store.set_rate_limits(name, [RateLimit(dimension=f"dim{name}", count=1, per_s=3600.0)])
        await store.enqueue(name, "a", limit_keys={f"dim{name}": f"key{odd}"})
        await store.enqueue(name, "b", limit_keys={f"dim{name}": f"key{odd}"})
        assert len(await store.claim(name, node_id="n", limit=2)) == 1  # the other waits for its bucket
        assert isinstance(await store.try_acquire_lock("lock", ttl_s=600, holder=f"holder{odd}"), Lease)
        await store.heartbeat([MemberBeat(node_id=f"node{name}", incarnation="i", info={"queue": odd})], ttl_s=600)
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        for table in ("coord_lock_names", "coord_lock_holders"):
            assert db.execute(f"UPDATE {table} SET name = ? WHERE name = 'lock'", (f"lock{odd}",)).rowcount == 1
    async with open_dashboard(path, port=0) as dashboard:
        bodies = [(await fetch(dashboard.url + p))[1] for p in ("api/state", "api/stream")]
    escaped, shown = printable(odd), printable(name)
    assert escaped == "<img src=x>\\u202e\\x1b[31m"
    for body in bodies:
        state = json.loads(body if body.startswith("{") else body.split("\ndata: ", 1)[1])
        status = state["sections"]["status"]
        assert [q["queue"] for q in status["queues"]] == [shown]
        assert [(lock["name"], lock["holder"]) for lock in status["locks"]] == [(f"lock{escaped}", f"holder{escaped}")]
        assert [(n["node_id"], n["info"]) for n in status["nodes"]] == [(f"node{shown}", {"queue": escaped})]
        [limited] = status["rate_limits"]["queues"]
        assert (limited["queue"], limited["limits"][0]["dimension"]) == (shown, f"dim{shown}")
        assert [(b["dimension"], b["key"]) for b in limited["held"]] == [(f"dim{shown}", f"key{escaped}")]
        assert list(state["sections"]["history"][-1]["queues"]) == [shown]  # the charts name it alike
        assert UNSAFE.search(json.dumps(state, ensure_ascii=False)) is None  # nothing raw anywhere


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: signal.Signals(s).name)
async def test_the_command_serves_until_a_stop_signal(tmp_path: Path, python: PythonRunner, signum: int) -> None:
    """SIGTERM, and SIGHUP (the terminal went away) as for ``run``: a clean stop, exit status 0."""
    async with known_cluster(tmp_path / "c.db") as cluster:
        command = python.spawn(["-m", "asynccoord", "dashboard", "--db", str(cluster.path), "--port", "0"])
        assert command.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(command.stdout.readline), 60)
        found = re.search(r"serving (http://127\.0\.0\.1:\d+/)", line)
        assert found, line
        status, body = await fetch(found.group(1) + "api/state")
        assert status == 200
        assert [q["queue"] for q in json.loads(body)["sections"]["status"]["queues"]] == ["mail", "outbox"]
        command.send_signal(signum)
        _, err = await asyncio.to_thread(command.communicate, timeout=30)
        assert command.returncode == 0, err


def test_without_the_extra_the_command_names_it(python: PythonRunner, tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['aiohttp'] = None\n"  # import aiohttp now raises ImportError
        "from asynccoord.cli.main import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    proc = python.run_code(code, "dashboard", "--db", str(tmp_path / "x.db"), check=False)
    assert proc.returncode == 2  # a usage error, as run's options of a missing extra
    assert "pip install 'asynccoord[dashboard]'" in proc.stderr
    assert not (tmp_path / "x.db").exists()


# --- the feed -----------------------------------------------------------------------------


def _report(now_s: float, done: int, alerts: list[str]) -> dict[str, Any]:
    return {
        "now_s": now_s,
        "queues": [{"queue": "q", "pending": 10 - done, "running": 0, "done": done, "dead": 0}],
        "latencies": [
            {"window_s": 60.0, "name": ENQUEUE_TO_COMMIT_MS, "count": 9, "p50_ms": 9.0, "p90_ms": 9.0, "p99_ms": 9.0},
            {"window_s": 10.0, "name": ENQUEUE_TO_COMMIT_MS, "count": 3, "p50_ms": 1.0, "p90_ms": 2.0, "p99_ms": 3.0},
        ],
        "alerts": [{"rule": r, "scope_key": "", "fired_at": 0.0} for r in alerts],
    }


def test_history_points_give_throughput_and_the_shortest_latency_window() -> None:
    first = history_point(_report(100.0, 2, []), None)
    assert first["queues"]["q"]["finished_per_s"] is None
    assert first["latency"] == {"p50_ms": 1.0, "p90_ms": 2.0, "p99_ms": 3.0, "count": 3, "window_s": 10.0}
    second = history_point(_report(102.0, 8, []), _report(100.0, 2, []))
    assert second["queues"]["q"] == {"pending": 2, "running": 0, "done": 8, "dead": 0, "finished_per_s": 3.0}
    assert second["total"] == second["queues"]["q"]
    assert history_point(_report(102.0, 8, []), _report(100.0, 2, []), charted=())["queues"] == {}


def test_a_purge_between_two_points_does_not_show_as_a_drop_in_throughput() -> None:
    before = _report(100.0, 6, [])
    after = _report(102.0, 8, [])  # 2 more done, then 7 done tasks purged: 1 left in the table
    after["queues"][0].update(done=1, removed=7)
    point = history_point(after, before)
    assert point["queues"]["q"]["finished_per_s"] == 1.0  # (1 + 7 - 6) / 2 s
    assert point["total"]["finished_per_s"] == 1.0


async def test_the_feed_sends_changes_and_resolves_alerts_that_stop_firing() -> None:
    reports = [_report(1.0, 0, ["hot"]), _report(2.0, 0, ["hot"]), _report(3.0, 1, [])]

    async def source() -> dict[str, Any]:
        return reports.pop(0)

    feed = Feed(source, sections={"rate_limits": _none})
    with feed.subscription() as messages:
        await feed.poll()
        assert messages.get_nowait()["type"] == "state"
        change = messages.get_nowait()
        assert change["type"] == "change"
        assert set(change["sections"]) == {"status", "history", "shown"}
        await feed.poll()
        assert set(messages.get_nowait()["sections"]) == {"status", "history"}  # the same queues shown
        await feed.poll()
        change = messages.get_nowait()
        assert [a["rule"] for a in change["sections"]["resolved"]] == ["hot"]
        assert change["sections"]["resolved"][0]["resolved_at"] == 3.0
        assert len(feed.state()["sections"]["history"]) == 3
        assert feed.state()["sections"]["rate_limits"] is None
        await feed.stop()
        assert messages.get_nowait() is None
    with pytest.raises(InvalidArgumentError, match="status"):
        Feed(source, sections={"status": _none})


async def test_the_feed_lists_no_muted_alert_as_resolved() -> None:
    """An incident muted by another (``inhibited_by``) was never sent: its end is no resolved alert."""
    firing = _report(1.0, 0, ["lost_nodes", "lost_locks"])
    firing["alerts"][1]["inhibited_by"] = "lost_nodes"
    reports = [firing, _report(2.0, 0, [])]

    async def source() -> dict[str, Any]:
        return reports.pop(0)

    feed = Feed(source, sections={"rate_limits": _none})
    await feed.poll()
    await feed.poll()
    assert [a["rule"] for a in feed.state()["sections"]["resolved"]] == ["lost_nodes"]
    await feed.stop()


async def _none() -> None:
    return None


def _tenant_row(i: int, polls: int) -> dict[str, Any]:
    """Queue ``tenant-{i}`` of the report at poll ``polls``: 2 pending, except the busy ones; i % 3 done a second."""
    pending = {7: 900, 2999: 700, 1500: 500}.get(i, 2)
    dead = 40 if i == 42 else 0
    done = polls * (i % 3)
    return {
        "queue": f"tenant-{i:04d}",
        "pending": pending,
        "running": 0,
        "done": done,
        "dead": dead,
        "total": pending + done + dead,
        "expired_leases": 0,
        "oldest_pending_age_s": 12.5,
    }


def _tenants(queues: int) -> Callable[[], Awaitable[dict[str, Any]]]:
    """A status source of ``queues`` tenant queues (:func:`_tenant_row`), one second apart per poll."""
    polls = 0

    async def source() -> dict[str, Any]:
        nonlocal polls
        polls += 1
        return {
            "now_s": float(polls),
            "queues": [_tenant_row(i, polls) for i in range(queues)],
            "latencies": [],
            "alerts": [],
        }

    return source


async def test_the_state_stays_small_however_many_queues_and_points() -> None:
    source = _tenants(3000)
    feed = Feed(source, history=60, charted_queues=3, listed_queues=50)
    for _ in range(60):
        await feed.poll()
    full = len(feed.encoded(feed.state()))
    for _ in range(30):
        await feed.poll()
    state = feed.state()["sections"]
    later = len(feed.encoded(feed.state()))
    # Every queue's counts at every point would be 60 x 3,000 x ~70 bytes, 12.6 MB; what is kept:
    # 50 rows of ~160 bytes and 60 points of 4 counts of ~95 bytes, about 35 KB.
    assert later < 40_000
    assert later < full * 1.01  # a full history: the state no longer grows (some numbers gain a digit)
    assert len(state["history"]) == 60
    busiest = {"tenant-0007", "tenant-2999", "tenant-1500"}
    assert all(set(p["queues"]) == busiest for p in state["history"])
    point = state["history"][-1]
    assert point["total"] == {
        "pending": 2 * 2997 + 900 + 700 + 500,
        "running": 0,
        "done": 90 * 3000,  # i % 3 a poll, 1 s apart: 0 + 1 + 2 for each 3 queues
        "dead": 40,
        "finished_per_s": 3000.0,
    }
    assert point["queues"]["tenant-2999"] == {
        "pending": 700,
        "running": 0,
        "done": 90 * 2,
        "dead": 0,
        "finished_per_s": 2.0,
    }
    listed = [q["queue"] for q in state["status"]["queues"]]
    assert len(listed) == 50
    assert listed == sorted(listed)
    assert {*busiest, "tenant-0042"} <= set(listed)  # the dead letters' queue too
    assert state["shown"] == {"queues": 50, "queues_total": 3000, "rate_limit_queues": 0, "rate_limit_queues_total": 0}


async def test_one_serialisation_serves_every_request_and_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    encoded: list[str] = []
    dumps = json.dumps

    def counting_dumps(value: Any, *args: Any, **kwargs: Any) -> str:
        if isinstance(value, dict) and value.get("type") in ("state", "change"):
            encoded.append(value["type"])
        return dumps(value, *args, **kwargs)

    monkeypatch.setattr(json, "dumps", counting_dumps)
    source = _tenants(300)

    async def next_event(reply: aiohttp.ClientResponse) -> bytes:
        lines: list[bytes] = []
        while not lines or lines[-1] != b"\n" or not any(line.startswith(b"data: ") for line in lines):
            lines.append(await asyncio.wait_for(reply.content.readline(), 10))
        return b"".join(lines[lines.index(next(x for x in lines if x.startswith(b"id: "))) :])

    feed = Feed(source, interval_s=3600)  # polled once at start, then by the test
    async with serve(feed, port=0) as dashboard, aiohttp.ClientSession() as session:

        async def get_state() -> bytes:
            async with session.get(dashboard.url + "api/state") as reply:
                assert reply.status == 200
                assert reply.content_type == "application/json"
                return await reply.read()

        bodies = await asyncio.gather(*(get_state() for _ in range(8)))
        assert encoded == ["state"]  # one serialisation for the eight requests
        assert len(set(bodies)) == 1
        assert json.loads(bodies[0])["seq"] == 1
        async with contextlib.AsyncExitStack() as stack:
            streams = [await stack.enter_async_context(session.get(dashboard.url + "api/stream")) for _ in range(3)]
            firsts = [await next_event(reply) for reply in streams]
            assert firsts == [b"id: 1\ndata: " + bodies[0] + b"\n\n"] * 3
            change = await feed.poll()
            assert change is not None
            seconds = [await next_event(reply) for reply in streams]
            assert len(set(seconds)) == 1
            assert json.loads(seconds[0].split(b"data: ", 1)[1]) == change
        assert encoded == ["state", "change"]


# --- the demo -----------------------------------------------------------------------------


async def test_the_demo_opens_the_dashboard_while_it_runs(tmp_path: Path, python: PythonRunner) -> None:
    demo = python.spawn(
        # --speed 100: the 600 messages' replay lasts about 14 s, time enough for a loaded machine's browser.
        ["-m", "asynccoord.demo", "--messages", "600", "--speed", "100", "--no-faults", "--json", "--dashboard", "0"],
        env={TOKEN_ENV: None},
    )
    assert demo.stderr is not None
    line = await asyncio.wait_for(asyncio.to_thread(demo.stderr.readline), 60)
    found = re.search(r"dashboard at (http://127\.0\.0\.1:\d+/)", line)
    assert found, line
    async with chromium_page(tmp_path / "profile") as page:
        await page.goto(found.group(1))
        # Live data of the running demo: its queue, its nodes (2 processes x 8) and commits.
        await page.wait_for(
            "document.querySelectorAll('#nodes tr[data-node]').length === 16"
            " && document.querySelectorAll('#queues tr[data-queue=\"outbox\"]').length === 1"
            ' && Number(document.querySelector(\'#queues tr[data-queue="outbox"] td[data-k="done"]\').textContent) > 0',
            timeout_s=60,
        )
        await page.screenshot(tmp_path / "dashboard-demo.png")
    demo.send_signal(signal.SIGTERM)  # the demo stops its workers and its dashboard, and says so
    _, err = await asyncio.to_thread(demo.communicate, timeout=60)
    assert demo.returncode == 130, err[-2000:]
    assert "interrupted; worker processes stopped" in err


def test_the_token_option_says_how_long_a_token_must_be(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["dashboard", "--help"])
    assert f"at least {MIN_TOKEN_CHARS} characters" in " ".join(capsys.readouterr().out.split())


async def test_the_page_says_when_its_database_file_was_deleted(tmp_path: Path) -> None:
    path = tmp_path / "gone.db"
    async with SQLiteStore(path, wakeup=False) as store:
        await store.enqueue("q", 1)
    async with open_dashboard(path, port=0, interval_s=0.25) as dashboard:
        status, body = await fetch(dashboard.url + "api/state")
        assert status == 200
        assert "was deleted" not in body
        for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            name.unlink(missing_ok=True)
        deadline = time.monotonic() + 10.0
        while "was deleted" not in body and time.monotonic() < deadline:
            await asyncio.sleep(0.25)
            status, body = await fetch(dashboard.url + "api/state")
        error = json.loads(body)["sections"]["error"]
        gone = "was deleted or moved while this process had it open"
        assert error.startswith(f"status: the database file {str(path)!r} {gone}")


@pytest.mark.parametrize("interval", ["0.001", "0.0999"])
def test_an_interval_below_the_floor_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], interval: str
) -> None:
    """Before: ``--interval-s 0.001`` was served, a snapshot of the whole status each millisecond."""
    with pytest.raises(SystemExit) as exited:
        main(["dashboard", "--db", str(tmp_path / "x.db"), "--interval-s", interval])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "python -m asynccoord dashboard: error: --interval-s must be >= 0.1 seconds (MIN_INTERVAL_S: each "
        f"snapshot reads the whole status, a shorter interval keeps a core busy), got {float(interval)!r}"
    )
    assert list(tmp_path.iterdir()) == []
