"""``status`` over real ``python -m asynccoord run`` processes, on SQLite and on PostgreSQL with Redis locks.

Three ``run`` processes of 2 nodes each drain one queue; ``status --json`` (and its tables) must
show each process under the id its nodes and locks carry, with its nodes under it. One is then
killed with SIGKILL: once its nodes' heartbeats expire it must no longer show as live, and once
its monitor has been silent past its keepalive it must show as gone, while the others stay live.
And with tasks leased beyond the sends their locks allow, the tables call them claimed, not running.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from conftest import WORKERS_DIR, PythonRunner
from services import PG_DSN, REDIS_URL, new_schema, pg_rows, postgres_problem, redis_problem, unavailable

from asynccoord import NewTask
from asynccoord.backends.open import open_store
from asynccoord.cli.processes import WRITING_AFTER_KEEPALIVES
from asynccoord.cli.status import status_schema

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]

NODES = 2
HEARTBEAT_TTL_S = 1.0


@pytest.fixture(params=["sqlite", "postgres"])
def cluster(request: pytest.FixtureRequest, tmp_path: Path, python: PythonRunner) -> Iterator[list[str]]:
    """The ``--db`` options of a database holding 200 tasks of queue ``outbox``: an SQLite file, or a
    PostgreSQL schema of its own with the locks in Redis under a prefix of their own (both removed after,
    once the processes the test left are killed)."""
    if request.param == "sqlite":
        target, options = str(tmp_path / "bot.db"), ["--db", str(tmp_path / "bot.db")]
        schema = None
    else:
        for what, problem in (("PostgreSQL", postgres_problem()), ("Redis", redis_problem())):
            if problem is not None:
                unavailable(what, problem)
        schema = new_schema("statusproc")
        prefix = f"test-status-processes:{secrets.token_hex(4)}:"
        target = PG_DSN
        options = ["--db", PG_DSN, "--schema", schema, "--lock-store", REDIS_URL, "--lock-prefix", prefix]

    async def prepare() -> None:
        async with open_store(target, **({} if schema is None else {"schema": schema})) as store:
            await store.enqueue_many(
                [NewTask(queue="outbox", payload={"account": i % 3}, partition_key=f"c{i % 40}") for i in range(200)]
            )

    asyncio.run(prepare())
    try:
        yield options
    finally:
        python.cleanup()  # no process of the test writes any more
        if schema is not None:
            pg_rows(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            asyncio.run(_delete_keys(prefix))


async def _delete_keys(prefix: str) -> None:
    import redis.asyncio as redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = [key async for key in client.scan_iter(match=f"{prefix}*")]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


def start_run(python: PythonRunner, options: list[str], log: Path) -> subprocess.Popen[str]:
    """``python -m asynccoord run`` with 2 nodes and a 1 s heartbeat TTL; returns once it drains."""
    argv = ["-m", "asynccoord", "run", *options, "--queue", "outbox", "--send", "serve_send:send"]
    argv += ["--lock-key", "serve_send:account_lock", "--nodes", str(NODES), "--heartbeat-ttl-s", str(HEARTBEAT_TTL_S)]
    path = os.pathsep.join([str(WORKERS_DIR), os.environ.get("PYTHONPATH", "")])
    env = {"PYTHONPATH": path, "SERVE_SEND_LOG": str(log), "SERVE_SEND_SLEEP_S": "0.2"}
    proc = python.spawn(argv, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "draining 'outbox'" in line, (line, proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
    return proc


def status(python: PythonRunner, options: list[str], *extra: str) -> subprocess.CompletedProcess[str]:
    return python.run_module("asynccoord", "status", *options, *extra, timeout_s=60.0)


def status_json(python: PythonRunner, options: list[str]) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(status(python, options, "--json").stdout)
    jsonschema.Draft202012Validator(status_schema()).validate(report)
    return report


def wait_for(
    python: PythonRunner, options: list[str], done: Callable[[dict[str, Any]], bool], what: str, timeout_s: float
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        report = status_json(python, options)
        if done(report):
            return report
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout_s:g} s; last report's processes: {report['processes']}")
        time.sleep(0.5)


def of_pid(report: dict[str, Any], pid: int) -> dict[str, Any]:
    (process,) = [p for p in report["processes"] if p["info"].get("pid") == pid]
    return process


def test_status_shows_each_process_with_its_nodes_and_tells_a_killed_one_gone(
    python: PythonRunner, cluster: list[str], tmp_path: Path
) -> None:
    runs = [start_run(python, cluster, tmp_path / "send.log") for _ in range(3)]
    pids = [proc.pid for proc in runs]

    def all_live(report: dict[str, Any]) -> bool:
        return len(report["nodes"]) == 3 * NODES and all(
            any(p["info"].get("pid") == pid for p in report["processes"]) for pid in pids
        )

    report = wait_for(python, cluster, all_live, "three processes of 2 live nodes each", 60.0)
    node_ids = {n["node_id"] for n in report["nodes"]}
    holders = {lock["holder"] for lock in report["locks"]}
    for pid in pids:
        process = of_pid(report, pid)
        pid_id = process["process_id"]
        # The nodes of a process carry its id: "<process id>-<n>", the form of the process id itself.
        mine = sorted(n["node_id"] for n in report["nodes"] if n["info"]["pid"] == pid)
        assert mine == [f"{pid_id}-{n}" for n in range(NODES)], (pid_id, sorted(node_ids))
        assert sorted(n["node_id"] for n in report["nodes"] if n["process_id"] == pid_id) == mine
        assert (process["state"], process["nodes"]) == ("live", NODES)
    # The locks' holders are processes' ids too (places in line add a rank after a space).
    assert {h.split(" ")[0] for h in holders} <= {p["process_id"] for p in report["processes"]}

    table = status(python, cluster, "--color", "never").stdout
    assert "Processes (3 live)" in table
    assert f"Live nodes ({3 * NODES} in 3 processes)" in table
    for pid in pids:
        pid_id = of_pid(report, pid)["process_id"]
        (row,) = [line for line in table.splitlines() if line.strip().startswith(f"{pid_id} ") and " live " in line]
        assert f" {NODES}/{NODES} " in row
        assert f" {pid} " in row
        (first,) = [line for line in table.splitlines() if f"{pid_id}-0" in line]
        assert first.split()[:2] == [pid_id, f"{pid_id}-0"]  # the node's row begins its process's group

    killed = runs[0]
    killed.send_signal(signal.SIGKILL)
    assert killed.wait(timeout=10) == -signal.SIGKILL
    killed_id = of_pid(report, pids[0])["process_id"]

    def nodes_expired(report: dict[str, Any]) -> bool:
        return len(report["nodes"]) == 2 * NODES and of_pid(report, pids[0])["state"] != "live"

    # Its nodes' heartbeats lapse within the 1 s TTL: it is no longer live from then on.
    report = wait_for(python, cluster, nodes_expired, "the killed process no longer live", 30.0)
    assert of_pid(report, pids[0])["nodes"] == 0
    assert all(n["process_id"] != killed_id for n in report["nodes"])
    assert [of_pid(report, pid)["state"] for pid in pids[1:]] == ["live", "live"]

    # Its monitor stays silent: a little past its keepalive (about 4.3 s by default), with no
    # live node, it no longer writes, and it is gone.
    keepalive_s = of_pid(report, pids[0])["info"]["keepalive_s"]
    report = wait_for(
        python,
        cluster,
        lambda r: of_pid(r, pids[0])["state"] == "gone",
        "the killed process gone",
        2 * keepalive_s + 30.0,
    )
    assert of_pid(report, pids[0])["last_flush_age_s"] > WRITING_AFTER_KEEPALIVES * keepalive_s
    assert [(of_pid(report, pid)["state"], of_pid(report, pid)["nodes"]) for pid in pids[1:]] == [("live", NODES)] * 2
    table = status(python, cluster, "--color", "never").stdout
    assert "Processes (2 live, 1 gone)" in table
    (row,) = [line for line in table.splitlines() if line.strip().startswith(f"{killed_id} ")]
    assert row.split()[1:3] == ["gone", f"0/{NODES}"]

    for proc in runs[1:]:
        proc.send_signal(signal.SIGTERM)
    assert [proc.wait(timeout=60) for proc in runs[1:]] == [0, 0]


def test_a_process_killed_right_after_its_start_still_shows_and_goes_gone(
    python: PythonRunner, cluster: list[str], tmp_path: Path
) -> None:
    """Killed as soon as it says it drains, well inside its monitor's first interval (1 s): its
    monitor has flushed once already, so `status` lists the process, and then tells it gone."""
    proc = start_run(python, cluster, tmp_path / "send.log")
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=10) == -signal.SIGKILL
    report = status_json(python, cluster)
    assert [p["info"]["pid"] for p in report["processes"]] == [proc.pid]
    keepalive_s = of_pid(report, proc.pid)["info"]["keepalive_s"]
    report = wait_for(
        python,
        cluster,
        lambda r: of_pid(r, proc.pid)["state"] == "gone",
        "the killed process gone",
        2 * keepalive_s + 30,
    )
    assert report["nodes"] == []


def concurrent_sends(log: Path) -> int:
    """The most sends that ran at once, from the send log's ``start``/``end`` lines."""
    steps = []
    for line in log.read_text().splitlines():
        word, _task, at = line.split()
        if word in ("start", "end", "cancelled"):
            steps.append((float(at), 1 if word == "start" else -1))
    running = most = 0
    for _at, step in sorted(steps, key=lambda s: (s[0], s[1])):  # an end before a start at one instant
        running += step
        most = max(most, running)
    return most


def test_status_calls_leased_tasks_claimed_since_those_waiting_for_their_lock_send_nothing(
    python: PythonRunner, cluster: list[str], tmp_path: Path
) -> None:
    """Every task names one account (``serve_send:account_lock`` -> ``account:0``): one send at a time in the
    whole cluster, while the nodes lease many tasks that wait for that lock. The tables call them claimed."""
    log = tmp_path / "send.log"
    runs = [start_run(python, cluster, log) for _ in range(2)]
    # The fixture's tasks name accounts 0 to 2; `--lock-key` gives each its lock: at most 3 sends at once.
    report = wait_for(python, cluster, lambda r: r["tasks"]["running"] > 3, "more tasks leased than locks", 60.0)
    leased = report["tasks"]["running"]
    table = status(python, cluster, "--color", "never").stdout
    summary = " ".join(table.split("Queues")[0].split())
    assert re.search(r"\(pending \d+, claimed \d+", summary), summary
    assert "running" not in summary
    (header,) = [line for line in table.splitlines() if line.split()[:3] == ["queue", "pending", "claimed"]]
    assert "running" not in header
    for proc in runs:
        proc.send_signal(signal.SIGTERM)
    assert [proc.wait(timeout=60) for proc in runs] == [0, 0]
    # Sends at once never outnumbered the three locks, while more than three tasks were leased.
    assert concurrent_sends(log) <= 3 < leased
