"""Graceful shutdown of ``python -m asynccoord run`` on SIGTERM (a real process, a real SQLite file).

The send function lives in tests/workers/serve_send.py: it logs ``start``/``end``/
``cancelled`` lines with ``time.time()`` to a file and sleeps a configured time.

A process that does not exit in time is failed with every thread's stack (it runs with
``PYTHONFAULTHANDLER``, and SIGABRT makes it print them) and the time its threads spent waiting
for a CPU, which tells a hang from a machine too loaded to run it (see :func:`exit_status`).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from support import TESTS

from asynccoord import NewTask, SQLiteStore

pytestmark = pytest.mark.multiprocess

WORKERS = TESTS / "workers"
QUEUE = "outbox"


TERMINAL = (
    "-c",
    "import runpy, signal, sys; signal.signal(signal.SIGHUP, signal.SIG_DFL); sys.argv[0] = 'asynccoord';"
    " runpy.run_module('asynccoord', run_name='__main__', alter_sys=True)",
)
"""A launcher starting ``python -m asynccoord`` as a shell does: SIGHUP at its default action. A child
inherits an ignored signal, so a test run started with ``nohup ... &`` passed on SIGHUP (and SIGQUIT)
ignored, and under ``nohup`` ``run`` keeps running on SIGHUP by design."""


async def enqueue(db_path: Path, n: int) -> list[int]:
    async with SQLiteStore(db_path) as store:
        results = await store.enqueue_many(
            [NewTask(queue=QUEUE, payload={"account": i}, partition_key=f"conv-{i}") for i in range(n)]
        )
    return [r.task.id for r in results]


def read_lines(log: Path) -> list[tuple[str, int, float]]:
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        word, task_id, at = line.split()
        out.append((word, int(task_id), float(at)))
    return out


def serve(
    python: Any, db_path: Path, log: Path, sleep_s: float, *extra: str, launcher: tuple[str, ...] = ("-m", "asynccoord")
) -> subprocess.Popen[str]:
    argv = [
        *launcher,
        "run",
        "--db",
        str(db_path),
        "--queue",
        QUEUE,
        "--send",
        "serve_send:send",
        "--nodes",
        "1",
        "--max-in-flight",
        "3",
        "--shutdown-timeout-s",
        "2",
        *extra,
    ]
    env = {
        "PYTHONPATH": str(WORKERS),
        "SERVE_SEND_LOG": str(log),
        "SERVE_SEND_SLEEP_S": str(sleep_s),
        "PYTHONFAULTHANDLER": "1",  # SIGABRT prints every thread's stack: see exit_status
    }
    proc: subprocess.Popen[str] = python.spawn(argv, env=env)
    return proc


async def wait_for_starts(proc: subprocess.Popen[str], log: Path, n: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while sum(1 for word, _, _ in read_lines(log) if word == "start") < n:
        if proc.poll() is not None:
            pytest.fail(f"asynccoord run exited with {proc.returncode}:\n{proc.stderr.read() if proc.stderr else ''}")
        assert time.monotonic() < deadline, read_lines(log)
        await asyncio.sleep(0.005)


def cpu_wait_s(pid: int) -> float | None:
    """Seconds the threads of ``pid`` have spent runnable but waiting for a CPU (Linux schedstat; None elsewhere)."""
    try:
        return (
            sum(int((task / "schedstat").read_text().split()[1]) for task in Path(f"/proc/{pid}/task").iterdir()) / 1e9
        )
    except (OSError, ValueError, IndexError):
        return None


async def exit_status(proc: subprocess.Popen[str], timeout_s: float) -> int:
    """The exit status of ``proc``, which must exit within ``timeout_s``; else fail saying where it was.

    On the timeout the test fails with the process's stacks (SIGABRT, under ``PYTHONFAULTHANDLER``),
    its standard error, and how long its threads waited for a CPU meanwhile: a wait close to
    ``timeout_s`` is a loaded machine, not a hang.
    """
    waited_before = cpu_wait_s(proc.pid)
    try:
        return await asyncio.to_thread(proc.wait, timeout_s)
    except subprocess.TimeoutExpired:
        waited_after = cpu_wait_s(proc.pid)
        masks = signal_masks(proc.pid)
        proc.send_signal(signal.SIGABRT)
        try:
            _, err = await asyncio.to_thread(proc.communicate, None, 10)
        except subprocess.TimeoutExpired:
            proc.kill()
            err = "(no stacks: still alive 10 s after SIGABRT)"
        starved = "unknown"
        if waited_before is not None and waited_after is not None:
            starved = f"{waited_after - waited_before:.3f} s"
        pytest.fail(
            f"asynccoord run still running {timeout_s} s on (waiting for a CPU: {starved}; signals: {masks});"
            f" stderr:\n{err}"
        )


def signal_masks(pid: int) -> str:
    """Signal masks of process ``pid`` per thread (pending, blocked, ignored, caught), as Linux tells."""
    fields = ("SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")
    out = []
    for status in sorted(Path(f"/proc/{pid}/task").glob("*/status")):
        try:
            lines = status.read_text().splitlines()
        except OSError:
            continue
        values = dict(line.split(":\t", 1) for line in lines if line.split(":", 1)[0] in fields)
        out.append(f"{status.parent.name}: " + " ".join(f"{k}={values.get(k, '?')}" for k in fields))
    return "; ".join(out) or "unknown"


def tasks(db_path: Path) -> dict[int, tuple[str, int, str | None, Any, int]]:
    """id -> (status, attempts, last_error, result, version) as stored."""
    with sqlite3.connect(db_path) as db:
        rows = db.execute("SELECT id, status, attempts, last_error, result, version FROM coord_tasks").fetchall()
    return {r[0]: (r[1], r[2], r[3], None if r[4] is None else json.loads(r[4]), r[5]) for r in rows}


@pytest.mark.exclusive  # the exit is judged to within 0.3 s of the sends' end
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
async def test_a_stop_signal_lets_sends_in_flight_finish_and_claims_nothing_new(
    python: Any, db_path: Path, tmp_path: Path, signum: signal.Signals
) -> None:
    ids = await enqueue(db_path, 10)
    log = tmp_path / "sends.log"
    proc = serve(python, db_path, log, 0.5, launcher=TERMINAL)
    await wait_for_starts(proc, log, 3)
    running = [i for i, t in tasks(db_path).items() if t[0] == "running"]
    assert len(running) == 3
    signalled = time.monotonic()
    os.kill(proc.pid, signum)  # SIGHUP: the terminal it was started from went away
    code = await exit_status(proc, 10)
    exited = time.monotonic()
    err = proc.stderr.read() if proc.stderr else ""
    assert code == 0, err
    assert exited - signalled <= 0.8, f"exited {exited - signalled:.3f} s after {signum.name}"
    assert "asynccoord.run.left_behind" not in err  # nothing outlived the shutdown

    lines = read_lines(log)
    assert sorted(i for w, i, _ in lines if w == "start") == sorted(running)  # nothing new was claimed
    assert sorted(i for w, i, _ in lines if w == "end") == sorted(running)  # the 3 finished
    assert [w for w, _, _ in lines if w == "cancelled"] == []
    after = tasks(db_path)
    for i in running:
        assert after[i] == ("done", 1, None, f"sent {i}", 2)  # claimed, then completed
    for i in set(ids) - set(running):
        assert after[i] == ("pending", 0, None, None, 0)  # never claimed (not even claimed and handed back)


async def test_a_run_started_with_sighup_ignored_keeps_running_on_sighup(
    python: Any, db_path: Path, tmp_path: Path
) -> None:
    await enqueue(db_path, 3)
    log = tmp_path / "sends.log"
    # As `nohup python -m asynccoord run ...` starts it: SIGHUP ignored from the start.
    nohup = (
        "import runpy, signal, sys; signal.signal(signal.SIGHUP, signal.SIG_IGN); sys.argv[0] = 'asynccoord';"
        " runpy.run_module('asynccoord', run_name='__main__', alter_sys=True)"
    )
    proc = serve(python, db_path, log, 8.0, "--shutdown-timeout-s", "1", launcher=("-c", nohup))
    await wait_for_starts(proc, log, 3)
    os.kill(proc.pid, signal.SIGHUP)
    await asyncio.sleep(3.0)  # a drain would have ended after 1 s
    assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
    assert sorted(t[0] for t in tasks(db_path).values()) == ["running"] * 3  # still sending
    os.kill(proc.pid, signal.SIGTERM)
    assert await exit_status(proc, 10) == 0


@pytest.mark.parametrize(
    ("late", "send"),
    [
        (signal.SIGTERM, "serve_send:thread_send"),
        (signal.SIGHUP, "serve_send:thread_send"),
        # SIGINT: no KeyboardInterrupt in the loop's close or the interpreter's exit
        (signal.SIGINT, "serve_send:send"),
        (signal.SIGINT, "serve_send:raw_thread_send"),  # its thread holds the exit for the grace
    ],
    ids=["SIGTERM", "SIGHUP", "SIGINT", "SIGINT-raw-thread"],
)
async def test_a_stop_signal_after_the_teardown_never_kills_the_process(
    python: Any, db_path: Path, tmp_path: Path, late: signal.Signals, send: str
) -> None:
    await enqueue(db_path, 1)
    log = tmp_path / "sends.log"
    # The send sleeps 60 s (in a thread, or cancelled at the drain's end): after the teardown
    # (1 s drain, then the hand-back) the process leaves without waiting for a thread; signals
    # keep coming until it is gone.
    proc = serve(python, db_path, log, 60.0, "--send", send, "--shutdown-timeout-s", "1", launcher=TERMINAL)
    await wait_for_starts(proc, log, 1)
    os.kill(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while [t[0] for t in tasks(db_path).values()] != ["pending"]:  # handed back: the teardown is ending
        assert time.monotonic() < deadline, tasks(db_path)
        await asyncio.sleep(0.01)
    while proc.poll() is None and time.monotonic() < deadline:
        os.kill(proc.pid, late)
        await asyncio.sleep(0.002)
    code = await exit_status(proc, 10)
    err = proc.stderr.read() if proc.stderr else ""
    assert code == 0, f"{late.name} after the teardown: exit status {code}\n{err}"
    assert "Traceback" not in err, err
    assert "KeyboardInterrupt" not in err, err


LEFT_BEHIND = "asynccoord.run.left_behind"


def left_behind(err: str) -> list[str]:
    return [line for line in err.splitlines() if LEFT_BEHIND in line]


async def sigterm_and_exit(proc: subprocess.Popen[str], *, within_s: float) -> str:
    """Send ``proc`` SIGTERM; it must exit with status 0 within ``within_s``. Its standard error."""
    signalled = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    code = await exit_status(proc, 15)
    exited = time.monotonic()
    err = proc.stderr.read() if proc.stderr else ""
    assert code == 0, err
    assert exited - signalled < within_s, f"exited {exited - signalled:.3f} s after SIGTERM"
    return err


@pytest.mark.parametrize(
    ("send", "counts", "status"),
    [
        # handed back; its thread runs on
        ("serve_send:thread_send", "asyncio_tasks=0 threads=2 other_threads=0", "pending"),
        # claimed until its lease lapses
        ("serve_send:stubborn_send", "asyncio_tasks=2 threads=0 other_threads=0", "running"),
        # threads the send started itself: its module's ThreadPoolExecutor, a plain non-daemon Thread
        ("serve_send:pool_send", "asyncio_tasks=0 threads=0 other_threads=2 (serve-pool_0, serve-pool_1)", "pending"),
        (
            "serve_send:raw_thread_send",
            "asyncio_tasks=0 threads=0 other_threads=2 (serve-thread-1, serve-thread-2)",
            "pending",
        ),
    ],
    ids=["thread", "ignores-cancellation", "own-pool", "raw-thread"],
)
async def test_run_exits_after_its_shutdown_without_waiting_for_sends_that_outlive_it(
    python: Any, db_path: Path, tmp_path: Path, send: str, counts: str, status: str
) -> None:
    # The sends last 60 s; the drain 1 s. Python's own exit would wait for them (the loop's
    # leftover tasks, the executor's threads, the send's own threads), deaf to further signals.
    ids = await enqueue(db_path, 2)
    assert ids == [1, 2]  # the raw threads' names
    log = tmp_path / "sends.log"
    proc = serve(python, db_path, log, 60.0, "--send", send, "--shutdown-timeout-s", "1", launcher=TERMINAL)
    await wait_for_starts(proc, log, 2)
    err = await sigterm_and_exit(proc, within_s=10)
    lines = left_behind(err)
    assert len(lines) == 1, err
    assert f"{LEFT_BEHIND} {counts}:" in lines[0]
    assert "the process exits now" in lines[0]
    if "other_threads=2" in counts:  # threads, not sends, are named
        assert "ignored their cancellation" not in lines[0]
        assert "(not daemon threads) are not waited for" in lines[0]
    else:
        assert "calls in threads) is not waited for" in lines[0]
    assert [w for w, _, _ in read_lines(log) if w == "end"] == []  # the sends never ended: not waited for
    assert {i: t[0] for i, t in tasks(db_path).items()} == dict.fromkeys(ids, status)
    with sqlite3.connect(db_path) as db:  # the nodes left the membership, the monitor's lease let go
        assert db.execute("SELECT count(*) FROM coord_members").fetchone() == (0,)
        assert db.execute("SELECT count(*) FROM coord_lock_holders").fetchone() == (0,)


@pytest.mark.parametrize(
    ("send", "again"),
    [("serve_send:thread_send", signal.SIGINT), ("serve_send:stubborn_send", signal.SIGTERM)],
    ids=["thread-SIGINT", "ignores-cancellation-SIGTERM"],
)
async def test_a_second_stop_signal_ends_the_drain_and_the_run_at_once_whatever_the_sends_do(
    python: Any, db_path: Path, tmp_path: Path, send: str, again: signal.Signals
) -> None:
    await enqueue(db_path, 2)
    log = tmp_path / "sends.log"
    proc = serve(python, db_path, log, 60.0, "--send", send, "--shutdown-timeout-s", "30", launcher=TERMINAL)
    await wait_for_starts(proc, log, 2)
    os.kill(proc.pid, signal.SIGTERM)  # the drain would last 30 s
    await asyncio.sleep(0.5)
    assert proc.poll() is None
    signalled = time.monotonic()
    os.kill(proc.pid, again)
    code = await exit_status(proc, 15)
    exited = time.monotonic()
    err = proc.stderr.read() if proc.stderr else ""
    assert code == 0, err
    assert exited - signalled < 10, f"exited {exited - signalled:.3f} s after the second signal"
    assert f"asynccoord.runtime.signal_again signal={again.name}: handing back now" in err
    assert len(left_behind(err)) == 1, err
    assert [w for w, _, _ in read_lines(log) if w == "end"] == []


async def test_an_idle_pool_of_the_sends_module_neither_holds_the_exit_nor_is_reported(
    python: Any, db_path: Path, tmp_path: Path
) -> None:
    # Each send makes a short call in its module's own pool: its 2 workers stay alive, idle,
    # until the interpreter's exit tells them to end.
    await enqueue(db_path, 2)
    log = tmp_path / "sends.log"
    proc = serve(python, db_path, log, 0.3, "--send", "serve_send:quick_pool_send", launcher=TERMINAL)
    await wait_for_starts(proc, log, 2)
    err = await sigterm_and_exit(proc, within_s=5)
    assert left_behind(err) == [], err
    assert sorted(w for w, _, _ in read_lines(log)) == ["end", "end", "start", "start"]  # drained, not cut


@pytest.mark.exclusive  # the hand-back is judged to within 0.2 s of the exit
async def test_sigterm_hands_back_long_sends_and_their_locks_without_a_ttl_wait(
    python: Any, db_path: Path, tmp_path: Path
) -> None:
    ids = await enqueue(db_path, 3)
    log = tmp_path / "sends.log"
    proc = serve(python, db_path, log, 5.0, "--lock-key", "serve_send:account_lock")
    await wait_for_starts(proc, log, 3)
    # The second process, started once the 3 sends hold all the work: it polls for claimable
    # tasks every 10 ms and takes each task's lock as soon as it has claimed the task.
    grabber = python.spawn([str(WORKERS / "node_worker.py"), "grab", str(db_path), "--queue", QUEUE, "--count", "3"])
    assert grabber.stdout is not None
    assert json.loads(await asyncio.to_thread(grabber.stdout.readline))["event"] == "ready"
    async with SQLiteStore(db_path) as store:  # the account locks (the run's monitor may hold its leader lease too)
        locks = [info for info in await store.list_locks() if not info.name.startswith("asynccoord.monitor.")]
    assert sorted(info.name for info in locks) == ["account:0", "account:1", "account:2"]
    assert all(info.expires_at - info.acquired_at == pytest.approx(10.0) for info in locks)

    signalled_wall, signalled = time.time(), time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    code = await exit_status(proc, 10)
    exited = time.monotonic()
    assert code == 0, proc.stderr.read() if proc.stderr else ""
    assert exited - signalled <= 2.5, f"exited {exited - signalled:.3f} s after SIGTERM"

    lines = read_lines(log)
    cancelled = [(i, at - signalled_wall) for w, i, at in lines if w == "cancelled"]
    assert sorted(i for i, _ in cancelled) == sorted(ids)
    assert [w for w, _, _ in lines if w == "end"] == []
    for task_id, after_s in cancelled:  # the shutdown timeout (2 s) ran out, then they were cancelled
        assert 1.95 <= after_s <= 2.3, (task_id, after_s)

    line = await asyncio.to_thread(grabber.stdout.readline)
    claimed = json.loads(line)
    assert claimed["event"] == "claimed", line
    assert claimed["ids"] == sorted(ids)
    assert claimed["t"] - signalled >= 1.95  # handed back at the shutdown timeout, not before
    assert claimed["t"] - exited <= 0.2, f"claimed {claimed['t'] - exited:.3f} s after the exit"
    assert claimed["locks"] == [2, 2, 2]  # each account lock: the second acquisition ever
    # Not failed; their cut sends' attempts counted, so this, their second delivery, says so.
    assert [(t["attempts"], t["last_error"]) for t in claimed["tasks"]] == [(2, None)] * 3
    assert await asyncio.to_thread(grabber.wait, 10) == 0


async def test_a_burst_of_sigterms_never_kills_the_process_midway(python: Any, db_path: Path, tmp_path: Path) -> None:
    # A supervisor that sends SIGTERM again and again: the first starts the shutdown, the
    # rest must neither kill the drain nor the teardown after it (once the runtime's wait had
    # given the signal back, the next SIGTERM killed the process: exit -15, members left
    # registered, the monitor's last flush lost).
    await enqueue(db_path, 2)
    log = tmp_path / "sends.log"
    proc = serve(python, db_path, log, 0.3)
    await wait_for_starts(proc, log, 2)
    deadline = time.monotonic() + 10.0
    while proc.poll() is None and time.monotonic() < deadline:
        os.kill(proc.pid, signal.SIGTERM)
        await asyncio.sleep(0.002)
    code = await exit_status(proc, 10)
    assert code == 0, proc.stderr.read() if proc.stderr else ""
    with sqlite3.connect(db_path) as db:
        assert db.execute("SELECT count(*) FROM coord_members").fetchone() == (0,)
        assert db.execute("SELECT count(*) FROM coord_lock_holders").fetchone() == (0,)
    assert {t[0] for t in tasks(db_path).values()} <= {"done", "pending"}
