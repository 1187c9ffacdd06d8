"""The demo: a small run with faults proves its invariants; bad traces fail clearly."""

from __future__ import annotations

import gzip
import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from asynccoord.demo.app import account_of, build_tasks, schedule
from asynccoord.demo.trace import TraceFormatError, bundled_sample, read_trace


def run_demo(*args: str, timeout_s: float = 150.0) -> tuple[int, dict[str, object], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "asynccoord.demo", "--json", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    report = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}
    return proc.returncode, report, proc.stderr


@pytest.mark.multiprocess
@pytest.mark.slow
def test_small_demo_with_faults_keeps_every_invariant(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    code, report, stderr = run_demo("--messages", "3000", "--db", str(db), "--seed", "3")
    assert report, f"no JSON report; stderr: {stderr[-2000:]}"
    assert report["problems"] == [], report["problems"]
    assert report["finished"] is True
    assert report["messages"] == 3000
    # The invariants, as the gateway (not the runtime) saw them.
    assert report["duplicates"] == 0
    assert report["lost"] == 0
    assert report["account_overlaps"] == 0
    assert report["order_violations"] == 0
    assert report["sent"] + report["dead"] == 3000
    assert report["send_calls"] >= report["sent"]
    # Every second send of a message followed a lost lease, and was counted.
    conflicts = report["conflicts"]
    assert isinstance(conflicts, dict)
    assert report["duplicate_sends"] <= conflicts["lease_expired"] + conflicts["lease_lost"]
    # The faults really happened and recovery is visible in the counters.
    kinds = [f["kind"] for f in report["faults"]]  # type: ignore[union-attr]
    assert kinds.count("sigkill") == 1
    assert kinds.count("stall") == 1
    assert conflicts["membership_change"] >= 2
    assert conflicts["lease_expired"] + conflicts["lease_lost"] >= 1
    assert conflicts["duplicate_enqueue_suppressed"] >= 1
    assert report["ok"] is True
    assert code == 0
    # The database the demo used is a real asynccoord store with every task settled.
    import sqlite3

    con = sqlite3.connect(db)
    try:
        counts = dict(con.execute("SELECT status, count(*) FROM coord_tasks GROUP BY status").fetchall())
    finally:
        con.close()
    assert counts.get("done", 0) + counts.get("dead", 0) == 3000
    assert counts.get("pending", 0) == counts.get("running", 0) == 0


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
    ],
)
def test_bad_trace_line_is_reported_with_its_line_number(tmp_path: Path, line: str, message: str) -> None:
    good = '{"msg_id": "m0", "conversation_id": "c", "sender_id": "u", "ts_unix": 1, "seq": 0, "text_len": 3}'
    path = tmp_path / "trace.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(good + "\n" + line + "\n")
    with pytest.raises(TraceFormatError, match=f"{path}:2: {message}"):
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
