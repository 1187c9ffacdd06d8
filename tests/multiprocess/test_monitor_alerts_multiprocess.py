"""One cluster incident, one alert: real OS processes each running a Monitor on one store.

Each worker (``tests/workers/monitor_worker.py alerts``) runs a Monitor judging the
cluster rule ``lost_leases`` on a shared SQLite file or PostgreSQL schema. Only the
holder of the monitor's leader lease judges cluster rules, so:

* three monitors and one ``lease_lost`` event give exactly one firing notice, from the
  leader, and the store (what ``status`` shows) holds that one alert, reported by the
  leader alone;
* after the leader is killed with ``kill -9``, another monitor takes the lease over: it
  adopts the incident already firing (no second firing notice), resolves it, and raises
  the next incident once.

Waits are for events (a notice, a number of evaluations), never fixed sleeps, with
generous deadlines for a loaded machine.
"""

from __future__ import annotations

import asyncio
import json
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import WORKERS_DIR, PythonRunner
from services import PG_DSN, drop_schemas, new_schema, postgres_problem, unavailable

from asynccoord import SQLiteStore
from asynccoord.cli.status import status_report

pytestmark = pytest.mark.multiprocess

WORKER = str(WORKERS_DIR / "monitor_worker.py")
INTERVAL_S = 0.2
LEADER_TTL_S = 1.5
DEADLINE_S = 60.0


class Worker:
    """One worker process; its stdout lines are read by a thread into a queue."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        self.stderr: list[str] = []
        self.process_id = ""
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._drain_stderr, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))
        self.lines.put(None)

    def _drain_stderr(self) -> None:  # a full stderr pipe would block the worker
        assert self.proc.stderr is not None
        self.stderr.extend(self.proc.stderr)

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def poll(self) -> None:
        """Move the lines read so far to ``seen``."""
        while True:
            try:
                item = self.lines.get_nowait()
            except queue.Empty:
                return
            if item is None:
                if not any(m["event"] == "done" for m in self.seen) and self.proc.poll() not in (None, -9):
                    pytest.fail(f"worker exited with {self.proc.returncode}:\n{''.join(self.stderr)}")
                return
            self.seen.append(item)

    def alerts(self, state: str | None = None) -> list[dict[str, Any]]:
        self.poll()
        return [m for m in self.seen if m["event"] == "alert" and state in (None, m["state"])]

    def last(self, event: str) -> dict[str, Any] | None:
        self.poll()
        found = [m for m in self.seen if m["event"] == event]
        return found[-1] if found else None

    def leader(self) -> bool:
        last = self.last("leader")
        return last is not None and bool(last["leader"])


def until(predicate: Callable[[], bool], what: str, timeout_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def answers(w: Worker, event: str) -> list[dict[str, Any]]:
    w.poll()
    return [m for m in w.seen if m["event"] == event]


def stats(workers: list[Worker]) -> list[dict[str, Any]]:
    """Each worker's statistics, asked for now."""
    counts = [len(answers(w, "stats")) for w in workers]
    for w in workers:
        w.send("stats")
    until(lambda: all(len(answers(w, "stats")) > n for w, n in zip(workers, counts, strict=True)), "statistics")
    return [answers(w, "stats")[-1] for w in workers]


def evaluate_more(workers: list[Worker], n: int) -> None:
    """Wait until every worker has evaluated its rules ``n`` more times."""
    base = [s["evaluations"] for s in stats(workers)]
    until(
        lambda: all(s["evaluations"] >= b + n for s, b in zip(stats(workers), base, strict=True)),
        f"{n} more evaluations in every worker",
    )


def only_leader(workers: list[Worker]) -> Worker:
    """The one worker leading the cluster rules, once exactly one says so."""
    until(lambda: sum(w.leader() for w in workers) == 1, "exactly one leader")
    (leader,) = [w for w in workers if w.leader()]
    return leader


@pytest.fixture(params=["sqlite", "postgres"])
def target(request: pytest.FixtureRequest, db_path: Path) -> Iterator[tuple[str, list[str]]]:
    """``(target, extra worker arguments)`` of a fresh store."""
    if request.param == "sqlite":

        async def create() -> None:
            async with SQLiteStore(db_path):
                pass

        asyncio.run(create())
        yield str(db_path), []
        return
    problem = postgres_problem()
    if problem is not None:
        unavailable("PostgreSQL", problem)
    schema = new_schema("alerts")
    yield PG_DSN, ["--schema", schema]
    drop_schemas(schema)


def spawn(python: PythonRunner, target: tuple[str, list[str]], n: int, *args: str) -> list[Worker]:
    path, extra = target
    workers = [
        Worker(
            python.spawn(
                [
                    WORKER,
                    "alerts",
                    path,
                    *extra,
                    "--interval-s",
                    str(INTERVAL_S),
                    "--leader-ttl-s",
                    str(LEADER_TTL_S),
                    *args,
                ]
            )
        )
        for _ in range(n)
    ]
    until(lambda: all(answers(w, "ready") for w in workers), "every worker ready")
    for w in workers:
        w.process_id = answers(w, "ready")[0]["process_id"]
    return workers


def stop(workers: list[Worker]) -> list[dict[str, Any]]:
    for w in workers:
        w.send("stop")
    for w in workers:
        assert w.proc.wait(timeout=DEADLINE_S) == 0, "".join(w.stderr)
    until(lambda: all(w.last("done") is not None for w in workers), "done")
    return [w.last("done") or {} for w in workers]


async def stored_alerts(target: tuple[str, list[str]]) -> list[dict[str, Any]]:
    """The alerts ``python -m asynccoord status`` reports, read from the store now."""
    path, extra = target
    store: Any
    if extra:
        from asynccoord.backends.postgres.store import PostgresStore

        store = PostgresStore(path, schema=extra[1], listen=False)
    else:
        store = SQLiteStore(path, read_only=True)
    async with store:
        report = await status_report(store)
    alerts: list[dict[str, Any]] = report["alerts"]
    return alerts


@pytest.fixture
def workers_of(python: PythonRunner) -> Iterator[list[Worker]]:
    spawned: list[Worker] = []
    yield spawned
    for w in spawned:
        if w.proc.poll() is None:
            w.proc.kill()


def test_three_monitors_raise_one_cluster_incident_once(
    python: PythonRunner, target: tuple[str, list[str]], workers_of: list[Worker]
) -> None:
    workers = spawn(python, target, 3)
    workers_of.extend(workers)
    leader = only_leader(workers)
    follower = next(w for w in workers if w is not leader)
    follower.send("lease_lost")  # counted in a process that does not judge: cluster-wide all the same
    until(lambda: any(w.alerts("firing") for w in workers), "the firing notice")
    evaluate_more(workers, 5)  # every monitor has judged the window holding the event, again and again

    firing = [(w.process_id, a) for w in workers for a in w.alerts("firing")]
    assert len(firing) == 1
    ((raised_by, alert),) = firing
    assert raised_by == leader.process_id == alert["monitor_id"]
    assert alert["rule"] == "lost_leases"
    assert sum(s["alerts_fired"] for s in stats(workers)) == 1
    assert [w.leader() for w in workers].count(True) == 1

    (shown,) = asyncio.run(stored_alerts(target))  # status: one incident, one monitor storing it
    assert (shown["rule"], shown["scope"], shown["state"]) == ("lost_leases", "cluster", "firing")
    assert shown["reported_by"] == [leader.process_id]
    assert shown["fired_at"] == alert["fired_at"]

    done = stop(workers)
    assert sum(d["alerts_fired"] for d in done) == 1
    assert sum(len(w.alerts("firing")) for w in workers) == 1


def test_after_the_leader_is_killed_another_monitor_takes_over_and_raises_the_next_incident(
    python: PythonRunner, target: tuple[str, list[str]], workers_of: list[Worker]
) -> None:
    workers = spawn(python, target, 3, "--window-s", "3")
    workers_of.extend(workers)
    leader = only_leader(workers)
    leader.send("lease_lost")
    until(lambda: bool(leader.alerts("firing")), "the first incident's firing notice")
    (first,) = leader.alerts("firing")
    leader.proc.send_signal(signal.SIGKILL)
    assert leader.proc.wait(timeout=DEADLINE_S) == -signal.SIGKILL
    survivors = [w for w in workers if w is not leader]

    # The first incident was raised once: the monitor taking over adopts it from the store and
    # resolves it when the 3 s window empties, without a firing notice of its own.
    successor = only_leader(survivors)
    until(lambda: bool(successor.alerts("resolved")), "the first incident's resolved notice")
    (resolved,) = successor.alerts("resolved")
    assert resolved["fired_at"] == first["fired_at"]
    assert resolved["monitor_id"] == successor.process_id
    assert [a for w in survivors for a in w.alerts("firing")] == []

    other = next(w for w in survivors if w is not successor)
    other.send("lease_lost")  # the next incident
    until(lambda: any(w.alerts("firing") for w in survivors), "the next incident's firing notice")
    evaluate_more(survivors, 5)
    firing = [(w.process_id, a) for w in survivors for a in w.alerts("firing")]
    assert len(firing) == 1
    ((raised_by, alert),) = firing
    assert raised_by == successor.process_id == alert["monitor_id"]
    assert alert["fired_at"] > first["fired_at"]

    done = stop(survivors)
    assert sum(d["alerts_fired"] for d in done) == 1
    assert sum(d["alerts_resolved"] for d in done) >= 1
