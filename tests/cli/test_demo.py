"""The demo: a small run with faults proves its invariants (on SQLite and on PostgreSQL);
bad traces and options fail clearly; the demo never drops a PostgreSQL schema it did not create."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import io
import itertools
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from services import PG_DSN, REDIS_URL, new_schema, pg_rows, postgres_problem, redis_problem, unavailable
from support import ROOT

from asynccoord import InvalidArgumentError
from asynccoord.demo.app import account_of, build_tasks, schedule
from asynccoord.demo.gateway import _use_wal, audit
from asynccoord.demo.live import node_table, table_note
from asynccoord.demo.options import DEMO_SCHEMA_COMMENT
from asynccoord.demo.processes import Worker, read_states, stop_workers
from asynccoord.demo.report import render
from asynccoord.demo.trace import TraceFormatError, bundled_sample, read_trace
from asynccoord.monitor.monitor import LEADER_LOCK


def run_demo(*args: str, timeout_s: float = 150.0) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "asynccoord.demo", "--json", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    report = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}
    return proc.returncode, report, proc.stderr


def readme_report_keys() -> set[str]:
    """The top-level keys README.md says ``--json`` prints (what it says in parentheses left out)."""
    text = (ROOT / "README.md").read_text()
    start = text.index("`--json` prints one object with")
    paragraph = " ".join(text[start : text.index("\n\n", start)].split())
    return set(re.findall(r"`([a-z_0-9]+)`", re.sub(r"\([^()]*(\([^()]*\)[^()]*)*\)", "", paragraph)))


def check_invariants(code: int, report: dict[str, Any], stderr: str, messages: int) -> None:
    """What every demo run with faults must show: the invariants as the gateway (not the
    runtime) saw them, the faults, and the recovery visible in the counters."""
    assert report, f"no JSON report; stderr: {stderr[-2000:]}"
    assert report["problems"] == [], report["problems"]
    assert report["finished"] is True
    assert report["messages"] == messages
    assert report["duplicates"] == 0
    assert report["lost"] == 0
    assert report["account_overlaps"] == 0
    assert report["order_violations"] == 0
    assert report["sent"] + report["dead"] == messages
    assert report["send_calls"] >= report["sent"]
    # Every second send of a message followed a lost lease, and was counted.
    conflicts = report["conflicts"]
    assert report["duplicate_sends"] <= conflicts["lease_expired"] + conflicts["lease_lost"]
    kinds = [f["kind"] for f in report["faults"]]
    assert kinds.count("sigkill") == 1
    assert kinds.count("stall") == 1
    assert conflicts["lease_expired"] + conflicts["lease_lost"] >= 1
    assert conflicts["duplicate_enqueue_suppressed"] >= 1
    assert conflicts["membership_change"] >= 2  # the stall outlives the heartbeat TTL: leave, rejoin
    assert conflicts["node_lost"] >= 1  # the killed process's nodes expired (and the stalled one's)
    # The hottest account sends one message at a time: its requests' summed duration (the
    # drain's lower bound) fits in the run.
    tasks = build_tasks(list(read_trace(bundled_sample(), limit=messages)), accounts=24)
    per_account = Counter(t.payload["account"] for t in tasks)
    hottest = report["hottest_account"]
    assert hottest["messages"] == max(per_account.values())
    assert per_account[hottest["account"]] == hottest["messages"]
    assert 0 < hottest["busy_s"] <= report["elapsed_s"]
    # The provider's rate limits held: the claim kept every chat and account under them.
    rates = report["rate_limits"]
    if rates["declared"]:
        assert rates["provider_429s"] == 0
        assert {x["dimension"] for x in rates["declared"]} == {"account", "chat"}
    assert rates["max_window_ratio"] <= 1.0
    assert report["ok"] is True
    assert code == 0


QUIET = ("--messages", "300", "--no-faults", "--seed", "5")
"""A fault-free run whose busiest chat (84 of the 300 messages, in 8 s) asks for more than its limit allows."""


Run = tuple[int, dict[str, Any], str, Path]
"""A demo run: exit status, JSON report, stderr, and the SQLite file it kept (``--db``)."""


@pytest.fixture(scope="module")
def faults_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """One small run with faults on SQLite (a kill -9 and a stall), whose report several tests read."""
    db = tmp_path_factory.mktemp("faults") / "demo.db"
    return (*run_demo("--messages", "3000", "--db", str(db), "--seed", "3"), db)


@pytest.fixture(scope="module")
def quiet_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """One run without faults, with the provider's limits declared (the default), whose database is kept."""
    db = tmp_path_factory.mktemp("quiet") / "kept.db"
    return (*run_demo(*QUIET, "--db", str(db)), db)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_small_demo_with_faults_keeps_every_invariant(faults_run: Run) -> None:
    code, report, stderr, db = faults_run
    check_invariants(code, report, stderr, 3000)
    assert report["config"]["store"] == "sqlite"
    # The database the demo used is a real asynccoord store with every task settled.
    con = sqlite3.connect(db)
    try:
        counts = dict(con.execute("SELECT status, count(*) FROM coord_tasks GROUP BY status").fetchall())
    finally:
        con.close()
    assert counts.get("done", 0) + counts.get("dead", 0) == 3000
    assert counts.get("pending", 0) == counts.get("running", 0) == 0
    # The faults (a kill -9, a stall past the heartbeat and lock TTLs) lose nodes: one alert,
    # lost_nodes; the lost leases and locks they cause are muted by it (inhibited_by).
    fired = {a["rule"] for a in report["alerts"] if a["state"] == "firing"}
    assert fired == {"lost_nodes"}, report["alerts"]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_the_demo_table_tells_absorbed_repeats_from_duplicates(faults_run: Run) -> None:
    _, report, _, _ = faults_run
    rows = table_rows(report)
    assert rows["duplicates"] == "0"
    assert rows["duplicate_sends (absorbed by key)"] == f"{report['duplicate_sends']}: each after a counted fault"
    assert "duplicate_sends" not in rows  # only under its explained label
    unexplained = table_rows({**report, "duplicate_sends": 7, "duplicate_sends_explained": False})
    assert unexplained["duplicate_sends (absorbed by key)"] == "7: MORE than counted faults"


def _report_status(worker: Worker, committed: list[int]) -> None:
    """Write ``worker``'s status file as a worker does: one node per count, ``claimed`` one more."""
    nodes = [
        {"node_id": f"{worker.prefix}-n{i}", "claimed": c + 1, "sent": c, "committed": c, "failed": 0}
        | {"in_flight": 1, "conflicts": 0, "owned_partitions": 3}
        for i, c in enumerate(committed)
    ]
    worker.status_file.write_text(json.dumps({"pid": 1, "at": 0.0, "stalled": False, "nodes": nodes}))


def test_the_node_table_adds_the_killed_runs_counts_and_says_what_it_misses(tmp_path: Path) -> None:
    """The rows of a slot whose process was killed add that run's last report to its replacement's, and the
    note under the table names what the total still misses of the tasks done."""
    steady = Worker(index=0, prefix="p0", status_file=tmp_path / "w0.json", log_file=tmp_path / "w0.log")
    victim = Worker(index=1, prefix="p1", status_file=tmp_path / "w1.json", log_file=tmp_path / "w1.log")
    _report_status(steady, [40, 30])
    _report_status(victim, [20, 10])  # the run killed
    victim.keep_counts()
    assert not victim.status_file.exists()  # the replacement's first report must not count it again
    assert sorted((n["node_id"], n["committed"]) for n in read_states([steady, victim])) == [
        ("p0-n0", 40),
        ("p0-n1", 30),
        ("p1-n0", 20),  # the replacement has not reported yet: the killed run's counts alone
        ("p1-n1", 10),
    ]
    _report_status(victim, [5, 4])  # the replacement
    nodes = read_states([steady, victim])
    assert sorted((n["node_id"], n["claimed"], n["committed"], n["in_flight"]) for n in nodes) == [
        ("p0-n0", 41, 40, 1),
        ("p0-n1", 31, 30, 1),
        ("p1-n0", 27, 25, 1),  # 21 + 6 claimed, 20 + 5 committed; in flight: the live run's alone
        ("p1-n1", 16, 14, 1),
    ]
    out = io.StringIO()
    table = node_table(nodes, workers=[steady, victim], done=120, done_at_claim=2)
    Console(file=out, width=300, color_system=None).print(table)
    lines = [" ".join(line.split()) for line in out.getvalue().splitlines()]
    assert "total │ │ 115 │ 109 │ 109 │ 4 │ 0 │" in lines
    note = " ".join(lines[lines.index("total │ │ 115 │ 109 │ 109 │ 4 │ 0 │") + 1 :]).strip()  # wrapped to the table
    assert note == (
        "proc 1: its rows add the counts its killed run (SIGKILL) last reported, up to 0.25 s before it died "
        "committed adds to 109 of the 120 tasks done: 2 done at their claim as already processed (no send); "
        "9 committed by proc 1 after its last report, lost with the kill"
    )
    assert table_note(120, [steady], 120) == ""  # nothing killed, nothing missing: no note


@pytest.mark.multiprocess
@pytest.mark.slow
def test_the_demos_node_table_adds_up_to_the_messages_or_says_what_it_misses() -> None:
    """The committed column, the killed process's counts included, totals the messages done; what a
    killed process committed after its last report is named under the table."""
    proc = subprocess.run(
        [sys.executable, "-m", "asynccoord.demo", "--messages", "1000", "--seed", "3"],
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [" ".join(line.split()) for line in proc.stdout.splitlines()]
    (total,) = [line for line in lines if line.startswith("total │")]
    committed = int(total.split(" │ ")[3])
    note = " ".join(lines[lines.index(total) + 1 : lines.index(total) + 5])
    assert "proc 1: its rows add the counts its killed run (SIGKILL) last reported" in note
    if committed != 1000:
        assert f"committed adds to {committed} of the 1000 tasks done: " in note, note
        said = re.findall(r"(\d+) (?:done at their claim|committed by proc 1 after its last report)", note)
        assert committed + sum(map(int, said)) == 1000, note


def table_rows(report: dict[str, Any]) -> dict[str, str]:
    """The rows of the demo's final table: what -> value."""
    out = io.StringIO()
    render(report, Console(file=out, width=200, color_system=None))
    cells = [line.split("│") for line in out.getvalue().splitlines() if line.count("│") == 3]
    return {cell[1].strip(): cell[2].strip() for cell in cells}


@pytest.mark.multiprocess
@pytest.mark.slow
def test_the_demo_report_says_what_latency_measures_and_the_hottest_accounts_share(faults_run: Run) -> None:
    """The --json report: what ``latency_ms`` measures, and the hottest account's busy share of the drain."""
    code, report, stderr, _ = faults_run
    assert code == 0, stderr[-2000:]
    hot, latency = report["hottest_account"], report["latency_ms"]
    assert hot["busy_share"] == pytest.approx(hot["busy_s"] / report["elapsed_s"], abs=0.002)
    assert 0 < hot["busy_share"] <= 1
    assert latency["hottest_account_busy_share"] == hot["busy_share"]
    assert "enqueue to commit" in latency["measures"]
    assert latency["p50"] is not None


@pytest.mark.multiprocess
@pytest.mark.slow
def test_without_declared_rate_limits_the_provider_answers_429s_and_with_them_none(
    tmp_path: Path, quiet_run: Run
) -> None:
    """The provider enforces its limits either way; only the store's limits keep its 429s at 0."""
    code, off, stderr = run_demo(*QUIET, "--no-rate-limits", "--db", str(tmp_path / "off.db"))
    assert code == 0, stderr[-2000:]
    assert off["rate_limits"]["declared"] == []
    assert off["rate_limits"]["provider_429s"] > 0  # what a bot without limits gets
    assert off["conflicts"]["provider_rate_limited"] > 0  # reported by send, handled without an attempt
    assert off["dead"] == 0
    assert off["rate_limits"]["max_window_ratio"] <= 1.0  # the provider refused what went over
    assert off["rate_limits"]["requested_window_ratio"] > 1.0  # what the bot tried: over the sustained rate
    code, on, stderr, _ = quiet_run
    assert code == 0, stderr[-2000:]
    assert on["rate_limits"]["provider_429s"] == 0
    assert on["conflicts"]["rate_limit_held"] > 0  # the claim held work back instead
    assert on["rate_limits"]["scale"] == 8.0
    assert on["rate_limits"]["max_window_ratio"] <= 1.0
    assert on["rate_limits"]["requested_window_ratio"] <= 1.0  # no request refused: the same sends


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_demo_without_faults_raises_no_alert_and_keeps_its_database_for_status(quiet_run: Run) -> None:
    """With the default rules a fault-free run is quiet; ``--db PATH`` keeps the database,
    the report says where, and ``python -m asynccoord status`` reads what the run did."""
    code, report, stderr, db = quiet_run
    assert code == 0, stderr[-2000:]
    assert report["ok"] is True
    assert report["faults"] == []
    assert report["alerts"] == []
    assert report["config"]["db"] == str(db.resolve())
    status = subprocess.run(
        [sys.executable, "-m", "asynccoord", "status", "--db", report["config"]["db"], "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert status.returncode == 0, status.stderr
    seen = json.loads(status.stdout)
    assert seen["tasks"]["done"] + seen["tasks"]["dead"] == 300
    assert seen["tasks"]["pending"] == seen["tasks"]["running"] == 0
    assert seen["events"]["totals"]["commits"] == seen["tasks"]["done"]
    assert seen["alerts"] == []


@pytest.mark.multiprocess
@pytest.mark.slow
def test_demo_with_account_locks_in_redis_keeps_every_invariant_and_deletes_its_keys(tmp_path: Path) -> None:
    problem = redis_problem()
    if problem is not None:
        unavailable("Redis", problem)
    db = tmp_path / "demo.db"
    code, report, stderr = run_demo("--messages", "1500", "--db", str(db), "--lock-store", REDIS_URL, "--seed", "3")
    check_invariants(code, report, stderr, 1500)
    config = report["config"]
    assert config["lock_store"] == REDIS_URL
    assert config["lock_prefix"].startswith("asynccoord-demo:")
    assert 1 <= config["lock_store_keys"] <= 3 * 24  # per account: the fencing counter (and a live lock's two keys)
    # The locks were Redis's: the SQLite store never held one (but the lease of the monitor
    # judging the cluster rules), yet the monitor counted them.
    con = sqlite3.connect(db)
    try:
        names = con.execute("SELECT name FROM coord_lock_names").fetchall()
        assert names == [(LEADER_LOCK,)]
    finally:
        con.close()
    assert report["conflicts"]["lock_contended"] > 0

    async def left() -> int:
        from redis import asyncio as aioredis

        client = aioredis.Redis.from_url(REDIS_URL)
        try:
            return len([k async for k in client.scan_iter(match=config["lock_prefix"] + "*")])
        finally:
            await client.aclose()

    assert asyncio.run(left()) == 0


@pytest.fixture
def pg_schema() -> Iterator[str]:
    """A schema name for one demo run on PostgreSQL (not created yet), dropped afterwards."""
    problem = postgres_problem()
    if problem is not None:
        unavailable("PostgreSQL", problem)
    schema = new_schema("demo")
    yield schema
    pg_rows(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(360)
def test_demo_on_postgres_keeps_every_invariant_and_clears_its_schema_on_the_next_run(pg_schema: str) -> None:
    code, report, stderr = run_demo(
        "--messages", "1500", "--store", PG_DSN, "--schema", pg_schema, "--seed", "3", timeout_s=300
    )
    check_invariants(code, report, stderr, 1500)
    assert report["config"]["store"] == "postgres"
    # The provider enforced its limits and the PostgreSQL store's claims kept every chat and account under them.
    rates = report["rate_limits"]
    assert {x["dimension"] for x in rates["declared"]} == {"account", "chat"}
    assert rates["provider"] == rates["declared"]
    assert rates["provider_429s"] == 0
    assert rates["max_window_ratio"] <= 1.0
    assert "PostgreSQL" not in rates["note"]
    assert report["config"]["schema"] == pg_schema
    # The queue, locks, membership and monitor lived in the demo's own, marked schema.
    ((mark,),) = pg_rows("SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = $1", pg_schema)
    assert mark == DEMO_SCHEMA_COMMENT
    counts = dict(pg_rows(f'SELECT status, count(*) FROM "{pg_schema}".coord_tasks GROUP BY status'))
    assert counts.get("done", 0) + counts.get("dead", 0) == 1500
    assert counts.get("pending", 0) == counts.get("running", 0) == 0
    assert pg_rows(f'SELECT count(*) FROM "{pg_schema}".coord_lock_names')[0][0] > 0  # the accounts' locks
    assert pg_rows(f'SELECT count(*) FROM "{pg_schema}".coord_metric_totals')[0][0] > 0  # the monitor's counters
    # A second run on the same schema starts from an empty one (the demo dropped its own schema);
    # its DSN carries libpq's connect_timeout, which the demo's own connections must accept too.
    timed_dsn = PG_DSN + ("&" if "?" in PG_DSN else "?") + "connect_timeout=5"
    again = ("--messages", "100", "--store", timed_dsn, "--schema", pg_schema, "--no-faults", "--processes", "1")
    again += ("--speed", "1000000")  # no pacing: this run checks the fresh schema, not the replay
    code, report, stderr = run_demo(*again, "--nodes", "2", timeout_s=120)
    assert report.get("ok") is True, stderr[-2000:]
    assert code == 0
    assert pg_rows(f'SELECT count(*) FROM "{pg_schema}".coord_tasks')[0][0] == 100


@pytest.mark.multiprocess
def test_demo_refuses_a_postgres_schema_it_did_not_create(pg_schema: str) -> None:
    pg_rows(f'CREATE SCHEMA "{pg_schema}"')
    pg_rows(f'CREATE TABLE "{pg_schema}".keep_me (id int)')
    code, report, stderr = run_demo("--messages", "10", "--store", PG_DSN, "--schema", pg_schema, timeout_s=60)
    assert code == 2
    assert report == {}
    assert f"schema {pg_schema!r} already exists and was not created by the demo" in stderr
    kept = pg_rows("SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = 'keep_me'", pg_schema)
    assert kept[0][0] == 1


@pytest.mark.multiprocess
def test_demo_refuses_an_empty_postgres_schema_it_did_not_create(pg_schema: str) -> None:
    # Empty, but someone's: its grants and comment would go with a DROP ... CASCADE, and so
    # would objects outside pg_class/pg_proc/pg_type (a collation here).
    pg_rows(f'CREATE SCHEMA "{pg_schema}"')
    pg_rows(f"COMMENT ON SCHEMA \"{pg_schema}\" IS 'my app'")
    pg_rows(f"CREATE COLLATION \"{pg_schema}\".keep_me (provider = icu, locale = 'und')")
    oid = pg_rows("SELECT oid FROM pg_namespace WHERE nspname = $1", pg_schema)[0][0]
    code, report, stderr = run_demo("--messages", "10", "--store", PG_DSN, "--schema", pg_schema, timeout_s=60)
    assert code == 2
    assert report == {}
    assert f"schema {pg_schema!r} already exists and was not created by the demo" in stderr
    described = pg_rows(
        "SELECT oid, obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = $1", pg_schema
    )
    assert described == [(oid, "my app")]
    assert pg_rows("SELECT count(*) FROM pg_collation WHERE collname = 'keep_me'")[0][0] == 1


@pytest.mark.parametrize("schema", ["public", "information_schema", "pg_catalog", "pg_temp_1"])
def test_demo_refuses_system_schemas_before_connecting(schema: str) -> None:
    # A DSN nothing listens on: the refusal comes before any connection.
    code, report, stderr = run_demo("--store", "postgresql://u@127.0.0.1:1/db", "--schema", schema, timeout_s=60)
    assert code == 2
    assert report == {}
    assert f"{schema!r} is not the demo's to drop" in stderr


@pytest.mark.parametrize(
    ("where", "said"),
    [
        (("--store", "postgresql://u@127.0.0.1:1/db"), "cannot connect to postgresql://u@127.0.0.1:1/db"),
        (("--lock-store", "redis://127.0.0.1:1/0"), "cannot connect to redis://127.0.0.1:1/0"),
        (("--db", "{tmp}/missing/demo.db"), "its folder '{tmp}/missing' does not exist"),
    ],
)
def test_demo_exits_1_when_its_store_fails_as_the_cli_does(tmp_path: Path, where: tuple[str, str], said: str) -> None:
    """A store or lock store that cannot be reached or opened is a failure (1), not bad usage (2)."""
    flag, value = where
    code, report, stderr = run_demo("--messages", "10", flag, value.format(tmp=tmp_path), timeout_s=60)
    assert (code, report) == (1, {}), stderr
    assert stderr.startswith("asynccoord.demo: "), stderr
    assert said.format(tmp=tmp_path) in stderr
    assert len(stderr.splitlines()) == 1, stderr


def test_demo_cli_rejects_a_schema_without_a_postgres_store() -> None:
    code, _, stderr = run_demo("--schema", "demo", timeout_s=60)
    assert code == 2
    assert "--schema applies to a PostgreSQL store only" in stderr


def test_bundled_sample_is_real_structure_only_trace() -> None:
    messages = list(read_trace(bundled_sample()))
    assert len(messages) == 30_000
    assert len({m.msg_id for m in messages}) == 30_000
    assert len({m.conversation_id for m in messages}) == 977
    assert all(messages[i].ts_unix <= messages[i + 1].ts_unix for i in range(len(messages) - 1))
    with gzip.open(bundled_sample(), "rt") as f:
        raw = f.readline()
    assert "text" not in json.loads(raw)  # structure only: no message text is shipped
    notice = (bundled_sample().parent / "NOTICE.md").read_text()
    assert "MIT License" in notice
    assert "Perception, Control and Cognition Lab" in notice


def test_tasks_are_keyed_by_conversation_with_stable_accounts() -> None:
    messages = list(read_trace(bundled_sample(), limit=500))
    tasks = build_tasks(messages, accounts=24)
    assert [t.partition_key for t in tasks] == [m.conversation_id for m in messages]
    assert [t.idempotency_key for t in tasks] == [m.msg_id for m in messages]
    # Accounts come from senders through a stable hash: same sender, same account, every run.
    by_sender = {m.sender_id: account_of(m.sender_id, 24) for m in messages}
    assert all(t.payload["account"] == by_sender[m.sender_id] for t, m in zip(tasks, messages, strict=True))
    assert account_of("u_0e3737d8", 24) == account_of("u_0e3737d8", 24)
    offsets = schedule(messages, speed=None, replay_s=8.0, max_gap_s=120.0)
    assert offsets[0] == 0.0
    assert abs(offsets[-1] - 8.0) < 1e-9
    assert all(a <= b for a, b in itertools.pairwise(offsets))


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "not valid JSON"),
        ('["a"]', "expected a JSON object"),
        (
            '{"msg_id": "m", "conversation_id": "c", "sender_id": "u", "ts_unix": 1, "seq": 0}',
            "missing field 'text_len'",
        ),
        (
            '{"msg_id": "m", "conversation_id": "c", "sender_id": "u", "ts_unix": "1", "seq": 0, "text_len": 1}',
            "field 'ts_unix' must be int",
        ),
        (
            '{"msg_id": "m", "conversation_id": "c", "sender_id": "u", "ts_unix": 1' + "0" * 400 + ', "seq": 0, '
            '"text_len": 1}',
            "'ts_unix' must be a time between 1970 and 9999",
        ),
        (
            '{"msg_id": "m\\u0000", "conversation_id": "c", "sender_id": "u", "ts_unix": 1, "seq": 0, "text_len": 1}',
            "msg_id must not contain NUL",
        ),
        (
            '{"msg_id": "m", "conversation_id": "c\\ud800", "sender_id": "u", "ts_unix": 1, "seq": 0, "text_len": 1}',
            r"conversation_id must be valid Unicode text \(no lone surrogates\)",
        ),
        (
            '{"msg_id": "m0", "conversation_id": "c", "sender_id": "u", "ts_unix": 2, "seq": 1, "text_len": 1}',
            "msg_id 'm0' repeats line 1",
        ),
    ],
)
def test_bad_trace_line_is_reported_with_its_line_number(tmp_path: Path, line: str, message: str) -> None:
    good = '{"msg_id": "m0", "conversation_id": "c", "sender_id": "u", "ts_unix": 1, "seq": 0, "text_len": 3}'
    path = tmp_path / "trace.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(good + "\n" + line + "\n")
    with pytest.raises(TraceFormatError, match=f"{path}:2: {message}"):
        list(read_trace(path))


def test_a_trace_path_that_is_missing_or_a_directory_is_named_as_such(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="is a directory"):
        list(read_trace(tmp_path))
    with pytest.raises(InvalidArgumentError, match="does not exist"):
        list(read_trace(tmp_path / "none.jsonl"))


def test_a_conversation_whose_seq_falls_is_a_bad_trace(tmp_path: Path) -> None:
    """The demo checks deliveries' order against seq: a trace whose seq falls would blame the library."""
    rows = [("m0", "c", 5, 1), ("m1", "d", 0, 2), ("m2", "c", 5, 3), ("m3", "c", 3, 4)]
    path = tmp_path / "trace.jsonl"
    path.write_text(
        "".join(
            json.dumps({"msg_id": m, "conversation_id": c, "sender_id": "u", "ts_unix": ts, "seq": seq, "text_len": 1})
            + "\n"
            for m, c, seq, ts in rows
        )
    )
    assert [m.msg_id for m in read_trace(path, limit=3)] == ["m0", "m1", "m2"]  # other keys and equal seqs are fine
    with pytest.raises(TraceFormatError, match=f"{path}:4: seq 3 of conversation 'c' comes after its seq 5"):
        list(read_trace(path))


def test_trace_line_that_is_not_utf8_is_reported_with_its_line_number(tmp_path: Path) -> None:
    good = b'{"msg_id": "m0", "conversation_id": "c", "sender_id": "u", "ts_unix": 1, "seq": 0, "text_len": 3}'
    path = tmp_path / "trace.jsonl"
    path.write_bytes(good + b"\n" + good.replace(b"m0", b"m\xff") + b"\n")
    with pytest.raises(TraceFormatError, match=f"{path}:2: not UTF-8"):
        list(read_trace(path))


def test_demo_cli_rejects_a_bad_trace_with_exit_status_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"msg_id": "m0"}\n')
    code, report, stderr = run_demo("--trace", str(path), timeout_s=60)
    assert code == 2
    assert report == {}
    assert f"{path}:1: missing field" in stderr


def test_demo_cli_rejects_bad_options() -> None:
    code, _, stderr = run_demo("--nodes", "0", timeout_s=60)
    assert code == 2
    assert "--nodes" in stderr
    code, _, stderr = run_demo("--nodes", "5000", timeout_s=60)
    assert code == 2
    assert "expected a number <= 256, got '5000'" in stderr
    code, _, stderr = run_demo("--lock-store", "http://cache:6379", timeout_s=60)
    assert code == 2
    assert "--lock-store takes a Redis URL" in stderr
    assert "'http://cache:6379'" in stderr
    # redis-py alone takes a database that is no number (database 0); the workers' lock store refuses it
    code, _, stderr = run_demo("--messages", "10", "--lock-store", "redis://:pw@127.0.0.1:1/x", timeout_s=60)
    assert code == 2, stderr
    assert "--lock-store: url must be a Redis URL" in stderr
    assert "the database number must be an integer" in stderr
    assert "redis://:***@127.0.0.1:1/x" in stderr


def _workers_on(db: Path) -> list[int]:
    """Pids of live demo worker processes whose command line names ``db``."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().split(") ")[-1][:1]
        except OSError:
            continue
        if b"asynccoord.demo.worker" in cmdline and str(db).encode() in cmdline and state != "Z":
            pids.append(int(proc.name))
    return pids


@pytest.mark.parametrize(
    ("signum", "twice"), [(signal.SIGTERM, False), (signal.SIGTERM, True), (signal.SIGKILL, False)]
)
def test_a_stopped_demo_leaves_no_worker_running(tmp_path: Path, signum: int, twice: bool) -> None:
    db = tmp_path / "demo.db"
    demo = subprocess.Popen(
        [sys.executable, "-m", "asynccoord.demo", "--json", "--messages", "20000", "--db", str(db)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "TMPDIR": str(tmp_path)},  # a killed demo cannot remove its temporary folder
    )
    deadline = time.monotonic() + 60
    while len(_workers_on(db)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        assert len(_workers_on(db)) == 2, "the demo did not start its workers"
        time.sleep(1.0)
        demo.send_signal(signum)
        if twice:  # a second SIGTERM must not cut the stop the first began (it exited 1, with a traceback)
            time.sleep(0.05)
            demo.send_signal(signum)
        _, stderr = demo.communicate(timeout=30)
        # SIGTERM: the demo stops its workers itself; SIGKILL: the orphaned workers notice.
        assert demo.returncode == (130 if signum == signal.SIGTERM else -signal.SIGKILL), stderr.decode()[-2000:]
        deadline = time.monotonic() + 15
        while _workers_on(db) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _workers_on(db) == []
    finally:  # a failed check must not leave workers running on the machine
        demo.kill()
        for pid in _workers_on(db):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_worker_whose_demo_died_while_it_started_exits(tmp_path: Path) -> None:
    """The demo's pid comes on the command line: a worker whose demo is already gone exits at once."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    worker = subprocess.run(
        [
            sys.executable,
            "-m",
            "asynccoord.demo.worker",
            "--store",
            str(tmp_path / "demo.db"),
            "--gateway",
            str(tmp_path / "gateway.db"),
            "--status-file",
            str(tmp_path / "status.json"),
            "--prefix",
            "w0",
            "--parent-pid",
            gone.stdout.strip(),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert worker.returncode == 0, worker.stderr[-2000:]
    assert f"orphaned parent={gone.stdout.strip()}" in worker.stderr


def test_the_gateway_record_switches_to_wal_again_while_another_process_holds_the_fresh_file() -> None:
    """When the demo's workers open a fresh record together, SQLite answers all but one
    switch to WAL with SQLITE_BUSY at once, without its busy handler: a worker died at start
    with "database is locked" (1 run in about 60 with 4 processes). The switch is tried again
    until the timeout; other errors, and a busy file past the timeout, still raise."""

    class Busy:
        def __init__(self, failures: int, code: int = sqlite3.SQLITE_BUSY) -> None:
            self.failures, self.code, self.calls = failures, code, 0

        def execute(self, sql: str) -> None:
            assert sql == "PRAGMA journal_mode = WAL"
            self.calls += 1
            if self.calls <= self.failures:
                message = "database is locked" if self.code == sqlite3.SQLITE_BUSY else "disk I/O error"
                exc = sqlite3.OperationalError(message)
                exc.sqlite_errorcode = self.code
                raise exc

    db = Busy(failures=3)
    _use_wal(db, timeout_s=5.0)  # type: ignore[arg-type]
    assert db.calls == 4
    with pytest.raises(sqlite3.OperationalError):
        _use_wal(Busy(failures=10**6), timeout_s=0.1)  # type: ignore[arg-type]
    other = Busy(failures=1, code=sqlite3.SQLITE_IOERR)
    with pytest.raises(sqlite3.OperationalError):
        _use_wal(other, timeout_s=5.0)  # type: ignore[arg-type]
    assert other.calls == 1


def _start_ready_worker(tmp_path: Path, store: Path) -> subprocess.Popen[bytes]:
    """A demo worker of 2 nodes on ``store`` (stderr in ``tmp_path/w0.log``), once its ready file exists."""
    ready = tmp_path / "w0.ready"
    command = [sys.executable, "-m", "asynccoord.demo.worker", "--store", str(store)]
    command += ["--gateway", str(tmp_path / "gateway.db"), "--status-file", str(tmp_path / "w0.json")]
    command += ["--ready-file", str(ready), "--prefix", "w0", "--nodes", "2"]
    with open(tmp_path / "w0.log", "wb") as log_file:
        worker = subprocess.Popen(command, stderr=log_file)
    deadline = time.monotonic() + 60
    while not ready.exists() and worker.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    if not ready.exists():
        worker.kill()
        raise AssertionError(f"the worker did not get ready: {(tmp_path / 'w0.log').read_text()[-2000:]}")
    return worker


@pytest.mark.multiprocess
def test_a_worker_sent_sigterm_while_it_starts_stops_cleanly_once_up(tmp_path: Path) -> None:
    """The demo stops its workers with SIGTERM as soon as the last message is done, which
    can be before a late worker is up: its store is opened, its runtime not yet waiting for
    the signal. The worker keeps the signal and shuts down once its runtime runs (exit 0),
    instead of dying of SIGTERM's default action (exit -15, a failed demo)."""
    db = tmp_path / "demo.db"
    sqlite3.connect(db).close()
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("PRAGMA journal_mode = WAL")
    blocker.execute("BEGIN EXCLUSIVE")  # the worker's store waits for the file's write lock
    worker = _start_ready_worker(tmp_path, db)
    try:
        worker.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert worker.poll() is None  # still starting: the signal was kept, not acted on
        blocker.execute("ROLLBACK")
        assert worker.wait(timeout=30) == 0, (tmp_path / "w0.log").read_text()[-2000:]
    finally:
        blocker.close()
        if worker.poll() is None:
            worker.kill()
    log = (tmp_path / "w0.log").read_text()
    assert "asynccoord.demo.worker.early_sigterm" in log
    nodes = sqlite3.connect(db).execute("SELECT count(*) FROM coord_members").fetchone()[0]
    assert nodes == 0  # the runtime started, then shut down: its nodes left the membership


@pytest.mark.multiprocess
def test_a_worker_sent_sigterm_again_and_again_from_its_start_still_exits_0(tmp_path: Path) -> None:
    """SIGTERM every 20 ms from the moment the worker is ready until it exits (a demo stopping
    its workers twice, say): the first stops it, the others must not kill it, also while the
    interpreter shuts down, where Python puts SIG_DFL back for its handlers (8 of 8 runs exited
    -15 before)."""
    worker = _start_ready_worker(tmp_path, tmp_path / "demo.db")
    deadline = time.monotonic() + 60
    try:
        signals = 0
        while worker.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(ProcessLookupError):
                worker.send_signal(signal.SIGTERM)
                signals += 1
            time.sleep(0.02)
        assert worker.wait(timeout=30) == 0, (tmp_path / "w0.log").read_text()[-2000:]
        assert signals >= 2  # it was still up for a second signal
    finally:
        if worker.poll() is None:
            worker.kill()


def test_stopping_workers_waits_for_one_still_starting(tmp_path: Path) -> None:
    """``stop_workers`` signals a worker only once it is ready (its ready file exists): a worker
    still starting would be killed by SIGTERM. Here a stand-in worker takes 0.5 s to put
    its handler in place; signalled at once, it would exit -15."""
    ready = tmp_path / "w0.ready"
    script = (
        "import signal, sys, time, pathlib; time.sleep(0.5); "
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); "
        f"pathlib.Path({str(ready)!r}).touch(); time.sleep(30)"
    )
    w = Worker(index=0, prefix="p0", status_file=tmp_path / "w0.json", log_file=tmp_path / "w0.log")
    assert w.ready_file == ready
    w.process = subprocess.Popen([sys.executable, "-c", script])
    try:
        assert stop_workers([w], 20.0) == []
        assert w.process.returncode == 0
    finally:
        if w.process.poll() is None:
            w.process.kill()


@pytest.mark.multiprocess
def test_more_messages_than_the_trace_holds_replays_all_of_them_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    lines = [
        {"msg_id": f"m{i}", "conversation_id": f"c{i % 5}", "sender_id": f"u{i % 3}", "ts_unix": i, "seq": i // 5}
        for i in range(40)
    ]
    path.write_text("".join(json.dumps({**line, "text_len": 10}) + "\n" for line in lines))
    # --speed 1000000: no pacing (the trace's 40 s would otherwise be stretched to about 8 s).
    fast = ("--speed", "1000000")
    code, report, stderr = run_demo("--trace", str(path), "--messages", "100", "--no-faults", *fast, timeout_s=120)
    assert code == 0, f"problems: {report.get('problems')}\nstderr: {stderr[-2000:]}"
    assert report["messages"] == 40
    assert report["config"]["messages_requested"] == 100
    assert set(report) == readme_report_keys()  # the README lists every key of the report, and no other
    assert report["ok"] is True
    proc = subprocess.run(
        [sys.executable, "-m", "asynccoord.demo", "--trace", str(path), "--messages", "100", "--no-faults", *fast],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"stdout: {proc.stdout[-3000:]}\nstderr: {proc.stderr[-2000:]}"
    assert "note: --messages 100 asked for more than the trace holds: replayed all 40" in proc.stdout


def test_the_audit_of_a_run_whose_gateway_never_started_is_empty(tmp_path: Path) -> None:
    """Workers that all died at start leave no gateway record: the report reads nothing sent (and
    says why the run failed) instead of failing on the missing file with a traceback."""
    missing = tmp_path / "gateway.db"
    seen = audit(missing)
    assert (seen.send_calls, seen.delivered, seen.duplicates, seen.order_violations) == (0, 0, 0, 0)
    assert seen.delivered_ids == frozenset()
    assert not missing.exists()  # read-only: nothing created
