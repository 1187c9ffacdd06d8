"""Counters flushed by real OS processes add up in the cluster view read from the store."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import WORKERS_DIR, PythonRunner

from asynccoord import SQLiteStore
from asynccoord import events as ev
from asynccoord.contract.monitor import MetricsView
from asynccoord.monitor.snapshot import ClusterSnapshot, cluster_snapshot

pytestmark = pytest.mark.multiprocess

WORKER = str(WORKERS_DIR / "monitor_worker.py")


def message(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        assert proc.stderr is not None
        pytest.fail(f"worker exited with {proc.wait()}:\n{proc.stderr.read()}")
    data: dict[str, Any] = json.loads(line)
    return data


async def read_cluster(path: Path, window_s: float) -> tuple[ClusterSnapshot, MetricsView]:
    async with SQLiteStore(path, read_only=True) as store:
        return await cluster_snapshot(store, [window_s]), await store.read_metrics([window_s])


async def create(path: Path) -> None:
    async with SQLiteStore(path):
        pass


def test_counters_of_two_processes_add_up(python: PythonRunner, db_path: Path) -> None:
    asyncio.run(create(db_path))
    plan = [("q0", 120, 7), ("q1", 80, 3)]
    procs = [
        python.spawn(
            [WORKER, "count", str(db_path), "--queue", q, "--tasks", str(n), "--contended", str(k), "--barrier"]
        )
        for q, n, k in plan
    ]
    for proc in procs:
        assert message(proc) == {"event": "ready"}
    for proc in procs:  # both start together: their flushes interleave
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    reports = [message(proc) for proc in procs]
    for proc in procs:
        assert proc.wait(timeout=60) == 0

    snapshot, view = asyncio.run(read_cluster(db_path, 600.0))
    expected: Counter[str] = Counter()
    for report in reports:
        expected.update(report["events"])
    assert expected[ev.COMMITS] == expected[ev.CLAIMS] == 200
    assert expected[ev.LOCK_CONTENDED] == 10
    assert snapshot.totals == dict(expected)
    assert snapshot.window(600.0).counts == dict(expected)
    for report in reports:
        assert snapshot.process_totals[report["process_id"]] == report["events"]
    assert sorted(p.process_id for p in snapshot.processes) == sorted(r["process_id"] for r in reports)
    assert view.latencies[600.0]["commit_ms"].count == sum(r["latency_counts"]["commit_ms"] for r in reports) == 200
