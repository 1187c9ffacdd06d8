"""The status report and ``python -m asynccoord status``: read-only, consistent, schema-valid."""

from __future__ import annotations

import asyncio
import io
import json
import secrets
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from conftest import WORKERS_DIR, PythonRunner
from services import REDIS_URL, redis_problem, unavailable
from support import ROOT, FakeClock, bound_by_permissions

from asynccoord import (
    AlertRule,
    InvalidArgumentError,
    Lease,
    MemoryStore,
    Monitor,
    NewTask,
    NotADatabaseError,
    RateLimit,
    ReadOnlyStoreError,
    SQLiteStore,
)
from asynccoord import events as ev
from asynccoord.backends.sqlite.readonly import opens_immutable
from asynccoord.cli.main import build_parser
from asynccoord.cli.status import collect_status, render_status, status_report, status_schema
from asynccoord.contract.membership import MemberBeat
from asynccoord.contract.monitor import MetricsFlush
from asynccoord.locks.pool import next_in_line

Store = MemoryStore | SQLiteStore
WORKER = str(WORKERS_DIR / "monitor_worker.py")


def validate(report: dict[str, Any]) -> None:
    schema = status_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(report)
    json.dumps(report, allow_nan=False)  # plain JSON: no NaN or infinity


def check_consistent(report: dict[str, Any]) -> None:
    statuses = ("pending", "running", "done", "dead")
    for counts in [report["tasks"], *report["queues"]]:
        assert sum(counts[s] for s in statuses) == counts["total"]
    for s in (*statuses, "total", "expired_leases"):
        assert report["tasks"][s] == sum(q[s] for q in report["queues"])
    for counts in [report["tasks"], *report["queues"]]:
        assert 0 <= counts["expired_leases"] <= counts["running"]


async def populate(store: Store, clock: FakeClock) -> None:
    await store.enqueue_many([NewTask(queue="outbox", payload=i, partition_key=f"c{i % 5}") for i in range(30)])
    await store.enqueue("other", 1)
    claimed = await store.claim("outbox", node_id="n1", limit=10)
    for task in claimed[:6]:
        await store.complete(task)
    await store.fail(claimed[6], "boom")
    await store.heartbeat(
        [MemberBeat(node_id="n1", incarnation="a", info={"pid": 1}), MemberBeat(node_id="n2", incarnation="b")],
        ttl_s=30.0,
    )
    await store.try_acquire_lock("account:1", ttl_s=20.0, holder="n1")
    store.latencies.observe("claim_ms", 3.0)
    clock.advance(2.0)


async def test_status_shares_partitions_among_the_nodes_of_each_queue(store: Store) -> None:
    """As the nodes compute it (Membership(queue=...)): before, over every member whatever its queue."""
    from asynccoord.partition import assign

    beats = [MemberBeat(node_id=f"{q}{i}", incarnation="x", info={"queue": q}) for q in ("a", "b") for i in range(2)]
    await store.heartbeat([*beats, MemberBeat(node_id="plain", incarnation="x")], ttl_s=30.0)
    report = await status_report(store)
    validate(report)
    owned = {n["node_id"]: n["partitions"] for n in report["nodes"]}
    for q in ("a", "b"):
        expected = assign(store.partitions, [f"{q}0", f"{q}1"])
        assert {n: owned[n] for n in expected} == {n: len(p) for n, p in expected.items()}
    assert owned["plain"] == store.partitions  # the only member naming no queue
    assert report["monitor_leader"] is None  # no monitor runs


async def test_status_report_is_consistent_and_valid(store: Store, clock: FakeClock) -> None:
    await populate(store, clock)
    rule = AlertRule(name="commits_seen", event=ev.COMMITS, threshold=1, window_s=30.0)
    async with Monitor(store, rules=[rule], background=False, process_id="p-1") as monitor:
        await monitor.flush()
        await monitor.evaluate()
        # A second process' monitor reports the same incident: status shows it once.
        (alert,) = monitor.active_alerts()
        await store.flush_metrics(MetricsFlush(process_id="p-2", alerts=[alert]))
        report = await status_report(store, windows_s=[10.0, 60.0], db="x.db")
    validate(report)
    check_consistent(report)
    assert report["db"] == "x.db"
    assert report["tasks"] == {
        "pending": 22,  # 20 never claimed + 1 retried (backoff, not yet due) + "other"
        "running": 3,
        "done": 6,
        "dead": 0,
        "total": 31,
        "expired_leases": 0,
        "oldest_pending_age_s": pytest.approx(2.0),
    }
    assert [q["queue"] for q in report["queues"]] == ["other", "outbox"]
    assert [n["node_id"] for n in report["nodes"]] == ["n1", "n2"]
    assert sum(n["partitions"] for n in report["nodes"]) == report["partitions"] == store.partitions
    assert report["nodes"][0]["heartbeat_age_s"] == pytest.approx(2.0)
    (lock,) = report["locks"]
    assert (lock["name"], lock["holder"], lock["fencing_token"]) == ("account:1", "n1", 1)
    assert lock["ttl_left_s"] == pytest.approx(18.0)
    assert report["events"]["totals"][ev.COMMITS] == 6
    assert report["events"]["totals"][ev.RETRIES] == 1
    assert report["events"]["process_totals"]["p-1"][ev.CLAIMS] == 10
    (alert_row,) = report["alerts"]
    assert alert_row["rule"] == "commits_seen"
    assert sorted(alert_row["reported_by"]) == ["p-1", "p-2"]
    # The monitor that judged (and took the leader's lease) is named, apart from the nodes' locks.
    assert report["monitor_leader"]["process_id"] == "p-1"
    assert report["monitor_leader"]["ttl_left_s"] > 0
    out = io.StringIO()
    render_status(report, out, color=False)
    assert "Cluster alert rules judged by p-1" in out.getvalue()
    assert {lat["name"] for lat in report["latencies"]} == {"claim_ms"}

    out = io.StringIO()
    render_status(report, out, color=False)
    text = out.getvalue()
    for expected in ("outbox", "n1", "account:1", "commits_seen", "Locks held (1)"):
        assert expected in text
    assert "places in line" not in text
    assert [(p["process_id"], p["state"], p["nodes"]) for p in report["processes"]] == [
        ("p-1", "live", 0),
        ("p-2", "live", 0),
    ]
    assert "Processes (2 live)" in " ".join(text.split())  # (a title may wrap)
    # A process that stopped flushing long ago is kept (its totals count) but shown gone.
    stopped = json.loads(json.dumps(report))
    stopped["processes"][0].update(last_flush_age_s=600.0, state="gone")
    out = io.StringIO()
    render_status(stopped, out, color=False)
    assert "Processes (1 live, 1 gone)" in " ".join(out.getvalue().split())
    stopped["processes"] = []  # no process runs a Monitor: say where the counts come from
    out = io.StringIO()
    render_status(stopped, out, color=False)
    assert "No process reports its counters" in " ".join(out.getvalue().split())
    # expired_leases belongs to the task counts only: anywhere else it is an unknown key.
    for section in ("latencies", "alerts"):
        stray = json.loads(json.dumps(report))
        stray[section][0]["expired_leases"] = 0
        with pytest.raises(jsonschema.ValidationError, match="expired_leases"):
            validate(stray)


async def test_status_json_and_the_dashboard_feed_say_muted_for_an_incident_muted_by_another(
    store: Store, clock: FakeClock
) -> None:
    """``state`` reads "firing" for every open incident (kept for compatibility); ``muted`` tells them apart."""
    from asynccoord.monitor.dashboard.feed import Feed

    nodes = AlertRule(name="lost_nodes", event=ev.NODE_LOST, threshold=0, window_s=60.0)
    locks = AlertRule(name="lost_locks", event=ev.LOCK_LOST, threshold=0, window_s=60.0, inhibited_by="lost_nodes")
    async with Monitor(store, rules=[nodes, locks], background=False, process_id="p-1") as monitor:
        store.events.add(ev.NODE_LOST)
        store.events.add(ev.LOCK_LOST)
        await monitor.flush()
        await monitor.evaluate()
        report = await status_report(store)
        feed = Feed(lambda: status_report(store))
        await feed.poll()
        await feed.stop()
    validate(report)
    rows = [(a["rule"], a["state"], a["inhibited_by"], a["muted"]) for a in report["alerts"]]
    assert sorted(rows) == [("lost_locks", "firing", "lost_nodes", True), ("lost_nodes", "firing", None, False)]
    shown = feed.state()["sections"]["status"]["alerts"]
    assert sorted((a["rule"], a["muted"]) for a in shown) == [("lost_locks", True), ("lost_nodes", False)]
    unmarked = json.loads(json.dumps(report))
    del unmarked["alerts"][0]["muted"]
    with pytest.raises(jsonschema.ValidationError, match="muted"):
        validate(unmarked)


async def test_status_tells_running_tasks_whose_lease_expired(store: Store, clock: FakeClock) -> None:
    await store.enqueue_many([NewTask(queue="outbox", payload=i) for i in range(5)])
    await store.enqueue("other", 1)
    short = await store.claim("outbox", node_id="n1", limit=2, lease_s=5.0)
    await store.claim("outbox", node_id="n2", limit=1, lease_s=60.0)
    await store.claim("other", node_id="n2", limit=1, lease_s=5.0)
    report = await status_report(store, windows_s=[10.0], db=None)
    assert [q["expired_leases"] for q in report["queues"]] == [0, 0]
    clock.advance(5.0)  # the 5 s leases end now, the 60 s one runs on
    report = await status_report(store, windows_s=[10.0], db=None)
    validate(report)
    check_consistent(report)
    by_queue = {q["queue"]: (q["running"], q["expired_leases"]) for q in report["queues"]}
    assert by_queue == {"outbox": (3, 2), "other": (1, 1)}
    assert (report["tasks"]["running"], report["tasks"]["expired_leases"]) == (4, 3)
    out = io.StringIO()
    render_status(report, out, color=False)
    assert "claimed 4 of which 3 lease expired" in out.getvalue()
    # A claim takes the expired leases back: running again, under live leases.
    retaken = await store.claim("outbox", node_id="n3", limit=5, lease_s=30.0)
    assert {t.id for t in short} <= {t.id for t in retaken}
    report = await status_report(store, windows_s=[10.0], db=None)
    by_queue = {q["queue"]: (q["running"], q["expired_leases"]) for q in report["queues"]}
    assert by_queue == {"outbox": (5, 0), "other": (1, 1)}


async def test_status_shows_each_queues_dead_letter_policy_and_the_queues_holding_conversations(
    store: Store, clock: FakeClock
) -> None:
    await store.set_dead_letter_policy("outbox", "hold")
    await store.set_dead_letter_policy("quiet", "hold")  # holds, but has no dead task
    for queue in ("outbox", "quiet", "other"):
        await store.enqueue(queue, 1, partition_key="chat-1", max_attempts=1)
    for queue in ("outbox", "other"):
        (task,) = await store.claim(queue, node_id="n", limit=1)
        await store.fail(task, "no")
    report = await status_report(store, windows_s=[10.0], db=None)
    validate(report)
    check_consistent(report)
    policies = {q["queue"]: (q["dead"], q["dead_letter_policy"]) for q in report["queues"]}
    assert policies == {"other": (1, "skip"), "outbox": (1, "hold"), "quiet": (0, "hold")}
    out = io.StringIO()
    render_status(report, out, color=False)
    text = out.getvalue()
    assert "on dead" in text
    notes = [line for line in text.splitlines() if "holds conversations behind" in line]
    assert notes == [  # "quiet" holds no conversation: it has no dead task
        "'outbox' holds conversations behind 1 dead task(s) until requeued or discarded: "
        "python -m asynccoord dead --db ... --queue outbox"
    ]
    for bad in ("drop", 1):  # the schema names the two policies (and null for a store without the setting)
        stray = json.loads(json.dumps(report))
        stray["queues"][0]["dead_letter_policy"] = bad
        with pytest.raises(jsonschema.ValidationError):
            validate(stray)
    missing = json.loads(json.dumps(report))
    del missing["queues"][0]["dead_letter_policy"]
    with pytest.raises(jsonschema.ValidationError, match="dead_letter_policy"):
        validate(missing)


async def test_status_lists_declared_limits_and_the_buckets_holding_keys_back(store: Store, clock: FakeClock) -> None:
    report = await status_report(store, windows_s=[10.0], db=None)
    assert report["rate_limits"] == {"held_shown_max": 50, "queues": []}
    out = io.StringIO()
    render_status(report, out, color=False)
    assert "Rate limits" not in out.getvalue()
    await store.set_rate_limits("outbox", [RateLimit(dimension="chat", count=1, per_s=10.0, burst=2)])
    await store.set_rate_limits("idle", [RateLimit(dimension="account", count=30, per_s=1.0)])  # no tasks
    for chat in ("hot", "hot", "hot", "cool"):
        await store.enqueue("outbox", limit_keys={"chat": chat})
    await store.enqueue("plain", 1)
    assert len(await store.claim("outbox", node_id="n1", limit=10)) == 3  # hot's burst of 2, cool's first
    clock.advance(4.0)
    report = await status_report(store, windows_s=[10.0], db=None)
    validate(report)
    outbox = {"dimension": "chat", "count": 1, "per_s": 10.0, "burst": 2}
    idle = {"dimension": "account", "count": 30, "per_s": 1.0, "burst": 1}
    assert report["rate_limits"] == {
        "held_shown_max": 50,
        "queues": [
            {"queue": "idle", "limits": [idle], "held": []},  # declared, though it has no task yet
            {"queue": "outbox", "limits": [outbox], "held": [{"dimension": "chat", "key": "hot", "wait_s": 6.0}]},
        ],  # "plain" declares nothing
    }
    assert [q["queue"] for q in report["queues"]] == ["outbox", "plain"]
    out = io.StringIO()
    render_status(report, out, color=False)
    text = out.getvalue()
    assert "Rate limits" in text
    assert "1/10s" in text
    assert "Buckets holding keys back (1)" in text
    assert "hot" in text
    assert "6.0 s" in text
    clock.advance(6.0)  # hot has a token again
    report = await status_report(store, windows_s=[10.0], db=None)
    validate(report)
    assert [q["held"] for q in report["rate_limits"]["queues"]] == [[], []]
    out = io.StringIO()
    render_status(report, out, color=False)
    assert "No rate-limit bucket is holding keys back." in out.getvalue()


async def test_status_tells_places_in_line_from_held_locks(store: Store, clock: FakeClock) -> None:
    await store.try_acquire_lock("account:1", ttl_s=20.0, holder="p1")
    await store.try_acquire_lock(next_in_line("account:1"), ttl_s=1.0, holder="p2")  # p2 waits for it
    report = await status_report(store, windows_s=[10.0], db="x.db")
    validate(report)
    assert sorted(lock["name"] for lock in report["locks"]) == sorted(["account:1", next_in_line("account:1")])
    out = io.StringIO()
    render_status(report, out, color=False)
    text = out.getvalue()
    assert "Locks held (1) and places in line (1)" in text
    assert f"(place in line) {next_in_line('account:1')}" in text


async def test_names_that_look_like_console_markup_print_as_they_are(store: Store, clock: FakeClock) -> None:
    """Queue, lock and holder names (and the db label) are data: "[/x]" is not a closing tag."""
    await store.enqueue("out[/x]box", 1)
    await store.try_acquire_lock("account:[bold]1", ttl_s=20.0, holder="p[/]1")
    report = await status_report(store, windows_s=[10.0], db="schema [/x]")
    out = io.StringIO()
    render_status(report, out, color=False)  # it raised rich's MarkupError for the db label
    text = out.getvalue()
    for name in ("db=schema [/x]", "out[/x]box", "account:[bold]1", "p[/]1", "No active alerts."):
        assert name in text, name


async def test_names_that_hold_emoji_codes_print_as_they_are(store: Store, clock: FakeClock) -> None:
    """A lock named "account:lock:7" is data: its ":lock:" is no emoji code (it printed a padlock)."""
    await store.enqueue("chat:smile:out", 1)
    await store.try_acquire_lock("account:lock:7", ttl_s=20.0, holder="node:fire:1")
    report = await status_report(store, windows_s=[10.0], db="bot:x:.db")
    out = io.StringIO()
    render_status(report, out, color=False)
    text = out.getvalue()
    for name in ("chat:smile:out", "account:lock:7", "node:fire:1"):
        assert name in text, name


async def test_read_only_store_refuses_writes_and_never_creates(tmp_path: Path) -> None:
    missing = tmp_path / "missing.db"
    with pytest.raises(NotADatabaseError, match="no database"):
        await SQLiteStore(missing, read_only=True).open()
    assert not missing.exists()
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE t (x)")
    with pytest.raises(NotADatabaseError, match="not an asynccoord database"):
        await SQLiteStore(foreign, read_only=True).open()

    path = tmp_path / "coord.db"
    async with SQLiteStore(path) as writer:
        await writer.enqueue("q", 1)
        async with SQLiteStore(path, read_only=True) as reader:
            assert (await reader.stats("q")).counts["pending"] == 1
            with pytest.raises(ReadOnlyStoreError, match="read_only=True"):
                await reader.enqueue("q", 2)
            with pytest.raises(ReadOnlyStoreError):
                await reader.flush_metrics(MetricsFlush(process_id="p"))
            with pytest.raises(ReadOnlyStoreError):
                await reader.heartbeat([MemberBeat(node_id="n", incarnation="i")], ttl_s=1.0)
            with pytest.raises(InvalidArgumentError, match="read-only"):
                Monitor(reader)
            await writer.enqueue("q", 3)  # the writer goes on while the reader is open
            assert (await reader.stats("q")).counts["pending"] == 2


READ_BACKUP = """
import asyncio, json, os, sys
from asynccoord import SQLiteStore
from asynccoord.backends.sqlite.readonly import opens_immutable

db = sys.argv[1]
try:
    open(os.path.join(os.path.dirname(db), "probe"), "x").close()
    writable = True
except PermissionError:
    writable = False


async def pending():
    async with SQLiteStore(db, read_only=True) as store:
        return (await store.stats("q")).counts["pending"]


print(json.dumps({"writable": writable, "immutable": opens_immutable(db), "pending": asyncio.run(pending())}))
"""


def test_a_database_in_a_folder_this_process_cannot_write_is_read_as_it_is(tmp_path: Path) -> None:
    """A mounted backup, say: SQLite cannot create the -shm file a WAL reader needs beside it.

    With no -wal file beside it, no writer has the database open: it is read with
    ``immutable=1``, and nothing is created.
    """
    folder = tmp_path / "backup"
    folder.mkdir()
    db = folder / "coord.db"

    async def prepare() -> None:
        async with SQLiteStore(db) as store:
            await store.enqueue("q", 1)

    asyncio.run(prepare())
    assert [p.name for p in folder.iterdir()] == ["coord.db"]  # closed: no -wal left
    assert not opens_immutable(str(db))  # a folder this process writes: SQLite's usual open
    prefix = bound_by_permissions()
    folder.chmod(0o555)
    try:
        run = [*prefix, sys.executable]
        read = subprocess.run([*run, "-c", READ_BACKUP, str(db)], cwd=ROOT, capture_output=True, text=True, check=False)
        assert read.returncode == 0, read.stderr  # before: "unable to open database file"
        assert json.loads(read.stdout) == {"writable": False, "immutable": True, "pending": 1}
        status = subprocess.run(
            [*run, "-m", "asynccoord", "status", "--db", str(db), "--json"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["tasks"]["pending"] == 1
        assert [p.name for p in folder.iterdir()] == ["coord.db"]
        folder.chmod(0o755)
        (folder / "coord.db-wal").touch()  # a writer may have the database open: no immutable read
        folder.chmod(0o555)
        decide = (
            "import sys; from asynccoord.backends.sqlite.readonly import opens_immutable as o; print(o(sys.argv[1]))"
        )
        decided = subprocess.run([*run, "-c", decide, str(db)], cwd=ROOT, capture_output=True, text=True, check=True)
        assert decided.stdout == "False\n"
    finally:
        folder.chmod(0o755)


def test_status_is_not_blocked_by_a_writer_holding_the_lock(python: PythonRunner, db_path: Path) -> None:
    async def prepare() -> None:
        async with SQLiteStore(db_path) as store:
            await store.enqueue("q", 1)

    asyncio.run(prepare())
    locker = python.spawn_worker("locker", str(db_path), "--hold-s", "4", "--period-s", "5")
    assert locker.stdout is not None
    assert json.loads(locker.stdout.readline()) == {"event": "locked"}
    started = time.monotonic()
    report = asyncio.run(collect_status(db_path, busy_timeout_s=30.0))
    elapsed = time.monotonic() - started
    # The write lock is held for 4 s: a reader that waited for it would take that long.
    assert elapsed < 3.0, f"status took {elapsed:.2f} s while another connection held the write lock"
    assert report["tasks"]["pending"] == 1


async def test_status_accepts_a_sqlite_url(db_path: Path) -> None:
    async with SQLiteStore(db_path) as store:
        await store.enqueue("q", 1)
    report = await collect_status(f"sqlite:///{db_path}")
    assert report["tasks"]["pending"] == 1


def test_a_schema_for_an_sqlite_target_is_refused_before_anything_opens(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="schema 'bots' applies to a postgresql:// target only"):
        asyncio.run(collect_status(tmp_path / "bot.db", schema="bots"))
    assert list(tmp_path.iterdir()) == []


def test_cli_errors_and_parser(python: PythonRunner, tmp_path: Path) -> None:
    proc = python.run_module("asynccoord", "status", "--db", str(tmp_path / "none.db"), check=False)
    assert proc.returncode == 1
    assert "no database" in proc.stderr
    assert proc.stdout == ""
    proc = python.run_module("asynccoord", "status", check=False)
    assert proc.returncode == 2
    assert "--db" in proc.stderr
    args = build_parser().parse_args(["status", "--db", "x.db", "--json", "--window", "5", "--window", "30"])
    assert (args.command, args.db, args.json, args.windows_s) == ("status", "x.db", True, [5.0, 30.0])
    for bad in ("0", "-1", "nan", "inf", "1e9", "soon"):  # each a usage error (exit 2) naming the value
        proc = python.run_module(
            "asynccoord", "status", "--db", str(tmp_path / "none.db"), "--window", bad, check=False
        )
        assert proc.returncode == 2, (bad, proc.stderr)
        assert "argument --window: expected a number of seconds" in proc.stderr
        assert repr(bad) in proc.stderr


def test_status_reports_a_damaged_schema_revision_in_one_line(python: PythonRunner, db_path: Path) -> None:
    async def prepare() -> None:
        async with SQLiteStore(db_path) as store:
            await store.enqueue("q", 1)

    asyncio.run(prepare())
    with sqlite3.connect(db_path) as raw:
        raw.execute("UPDATE coord_meta SET value = '3x' WHERE key = 'schema_revision'")
    raw.close()
    proc = python.run_module("asynccoord", "status", "--db", str(db_path), check=False)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr.startswith(f"asynccoord status: error: {str(db_path)!r} records schema revision '3x'")
    assert proc.stderr.count("\n") == 1, proc.stderr  # no traceback


@pytest.mark.multiprocess
def test_status_command_on_a_live_multiprocess_run(python: PythonRunner, db_path: Path) -> None:
    """Two processes of 4 nodes each drain 1,000 tasks while ``status --json`` is polled."""
    total = 1000

    async def prepare() -> None:
        async with SQLiteStore(db_path) as store:
            await store.enqueue_many(
                [
                    NewTask(queue="outbox", payload={"account": i % 16}, partition_key=f"conv-{i % 97}")
                    for i in range(total)
                ]
            )

    asyncio.run(prepare())
    workers = [python.spawn([WORKER, "drain", str(db_path), "--nodes", "4", "--send-s", "0.025"]) for _ in range(2)]
    for worker in workers:
        assert worker.stdout is not None
        assert json.loads(worker.stdout.readline()) == {"event": "ready"}

    reports: list[dict[str, Any]] = []
    live = 0
    while any(w.poll() is None for w in workers) and len(reports) < 20:
        proc = python.run_module("asynccoord", "status", "--db", str(db_path), "--json", timeout_s=60.0)
        report = json.loads(proc.stdout)
        validate(report)
        check_consistent(report)
        assert report["tasks"]["total"] == total
        if report["tasks"]["pending"] + report["tasks"]["running"] > 0:
            live += 1
        reports.append(report)
    done_messages = []
    for worker in workers:
        assert worker.stdout is not None
        done_messages.append(json.loads(worker.stdout.readline()))
        assert worker.wait(timeout=60) == 0
    assert live >= 1, "no status call landed while the queue was draining"
    done_counts = [r["tasks"]["done"] for r in reports]
    assert done_counts == sorted(done_counts)  # progress only moves forward

    proc = python.run_module("asynccoord", "status", "--db", str(db_path), "--json")
    final = json.loads(proc.stdout)
    validate(final)
    assert final["tasks"]["done"] + final["tasks"]["dead"] == total
    assert final["tasks"]["pending"] == final["tasks"]["running"] == 0
    commits = sum(m["events"].get(ev.COMMITS, 0) for m in done_messages)
    assert commits == final["tasks"]["done"]
    assert final["events"]["totals"][ev.COMMITS] == commits  # every process flushed its last counts
    assert sorted(final["events"]["process_totals"]) == sorted(m["process_id"] for m in done_messages)
    assert final["nodes"] == []  # the runtimes left the membership
    assert final["alerts"] == []  # the monitors withdrew their alerts when they closed
    assert {lat["name"] for lat in final["latencies"]} >= {"claim_ms", "send_ms", "commit_ms", "enqueue_to_commit_ms"}

    human = python.run_module("asynccoord", "status", "--db", str(db_path))
    assert "outbox" in human.stdout
    assert "No active alerts" in human.stdout


def test_status_lists_the_locks_held_in_a_redis_lock_store(python: PythonRunner, db_path: Path) -> None:
    """``status --lock-store redis://...`` shows the database's locks and the lock store's, tells
    them apart, and says whether the Redis keeps its data (warning at open when it does not)."""
    problem = redis_problem()
    if problem is not None:
        unavailable("Redis", problem)
    from asynccoord.backends.redis import RedisLockStore

    prefix = f"test-status:{secrets.token_hex(4)}:"

    async def run() -> tuple[Any, Any, bool | None]:
        async with SQLiteStore(db_path) as store, RedisLockStore(REDIS_URL, prefix=prefix) as locks:
            await store.try_acquire_lock("account:in-db", ttl_s=60.0, holder="node-db")
            lease = await locks.try_acquire_lock("account:in-redis", ttl_s=60.0, holder="node-redis")
            assert isinstance(lease, Lease)
            try:
                argv = ["status", "--db", str(db_path), "--lock-store", REDIS_URL, "--lock-prefix", prefix]
                as_json = await asyncio.to_thread(python.run_module, "asynccoord", *argv, "--json")
                as_table = await asyncio.to_thread(python.run_module, "asynccoord", *argv, "--color", "never")
            finally:
                await locks.release_lock(lease)
                client = locks._client  # the fencing counter stays forever: delete the test's keys
                assert client is not None
                keys = [key async for key in client.scan_iter(match=f"{prefix}*")]
                if keys:
                    await client.delete(*keys)
            return as_json, as_table, locks.persistent

    as_json, as_table, persistent = asyncio.run(run())
    report = json.loads(as_json.stdout)
    validate(report)
    assert [(lock["store"], lock["name"], lock["holder"]) for lock in report["locks"]] == [
        ("db", "account:in-db", "node-db"),
        ("lock_store", "account:in-redis", "node-redis"),
    ]
    assert report["lock_store"] == {
        "url": REDIS_URL,
        "prefix": prefix,
        "persistent": persistent,
        "prefix_hint": None,
        "error": None,
    }
    assert ("asynccoord.redis.no_persistence" in as_json.stderr) is (persistent is False)
    text = as_table.stdout
    assert f"lock store {REDIS_URL} prefix {prefix!r}" in text
    assert "node-redis" in text
    assert "node-db" in text
    assert ("has no append-only file" in text) is (persistent is False)
    # said once: the table says it, so the lock store's own warning is not logged on top of it
    assert "no_persistence" not in as_table.stderr, as_table.stderr
    assert "append-only" not in as_table.stderr


def test_status_refuses_a_lock_store_that_is_no_redis_url(python: PythonRunner, tmp_path: Path) -> None:
    db = str(tmp_path / "none.db")
    proc = python.run_module("asynccoord", "status", "--db", db, "--lock-store", "http://cache:6379", check=False)
    assert proc.returncode == 2
    assert "--lock-store takes a Redis URL" in proc.stderr
    problem = redis_problem()
    if problem is None or "not installed" not in problem:  # redis-py reads the URL: no server needed
        url = "redis://127.0.0.1:6379/0?foo=bar"
        proc = python.run_module("asynccoord", "status", "--db", db, "--lock-store", url, check=False)
        assert proc.returncode == 2
        assert proc.stderr.splitlines()[-1] == (
            "python -m asynccoord status: error: url must be a Redis URL (redis://host:port/db): redis-py takes no "
            f"query parameter 'foo' in a redis:// URL (remove the parameter), got {url!r}"
        )
        assert "Traceback" not in proc.stderr
    proc = python.run_module("asynccoord", "status", "--db", db, "--lock-prefix", "app:", check=False)
    assert proc.returncode == 2
    assert "--lock-prefix applies to a --lock-store only" in proc.stderr
    assert list(tmp_path.iterdir()) == []


async def test_a_process_whose_monitor_closed_shows_gone_at_once(db_path: Path) -> None:
    async with SQLiteStore(db_path) as store:
        monitor = Monitor(store, process_id="box-1-aaaaaa", info={"nodes": 2}, background=False)
        await monitor.start()
        await monitor.flush(force=True)
        report = await collect_status(db_path)
        (running,) = report["processes"]
        assert (running["process_id"], running["state"]) == ("box-1-aaaaaa", "no_live_node")  # writes, no node
        await monitor.close()  # a clean shutdown: its last flush says it stopped
        report = await collect_status(db_path)
        (stopped,) = report["processes"]
        assert (stopped["process_id"], stopped["state"]) == ("box-1-aaaaaa", "gone")
        assert stopped["info"]["stopped"] is True


async def test_a_monitor_started_again_after_its_close_shows_live_again(db_path: Path) -> None:
    async with SQLiteStore(db_path) as store:
        monitor = Monitor(store, process_id="box-2-bbbbbb", background=False)
        await monitor.start()
        await monitor.close()  # its last flush says it stopped
        (stopped,) = (await collect_status(db_path))["processes"]
        assert (stopped["state"], stopped["info"]["stopped"]) == ("gone", True)
        await monitor.start()
        await monitor.flush(force=True)
        (again,) = (await collect_status(db_path))["processes"]
        assert (again["process_id"], again["state"]) == ("box-2-bbbbbb", "live")
        assert "stopped" not in again["info"]
        assert "stopped" not in monitor.info
        await monitor.close()
