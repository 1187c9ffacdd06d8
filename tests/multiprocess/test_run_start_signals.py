"""A stop signal while ``python -m asynccoord run`` is still starting: the same clean exit as later.

The run is a real ``python -m asynccoord run`` process on a real SQLite file. It is started
through a launcher that puts SIGTERM, SIGINT and SIGHUP at their default action and then
``exec``s the interpreter, as a shell starts it (a test run under ``nohup`` or in the
background would otherwise pass some of them on ignored).

A signal is sent at set points of the start: while the package imports (seen in ``-X
importtime``'s lines on standard error), while ``run`` imports the ``--send`` module
(tests/workers/slow_import_send.py), and as soon as the process catches the signal. Each
time the run must exit with status 0, say nothing on standard error, and leave nothing
claimed: a signal before the store opens leaves every task untouched.
"""

from __future__ import annotations

import asyncio
import os
import re
import select
import signal
import socket
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from support import TESTS

from asynccoord import NewTask, SQLiteStore
from asynccoord._startsignals import is_run_start

pytestmark = pytest.mark.multiprocess

QUEUE = "outbox"

LAUNCHER = (
    "import os, signal, sys\n"
    "for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n"
    "    signal.signal(signum, signal.SIG_DFL)\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n"
)
"""``python -c LAUNCHER ARGS...`` runs ``python ARGS...`` with the stop signals at their default action."""

UNTOUCHED = ("pending", 0, 0)
"""(status, attempts, version) of a task no run has claimed."""


async def enqueue(db_path: Path, n: int) -> None:
    async with SQLiteStore(db_path) as store:
        await store.enqueue_many([NewTask(queue=QUEUE, payload={"i": i}, partition_key=f"k{i}") for i in range(n)])


def start_run(
    python: Any, db_path: Path, tmp_path: Path, *options: str, send: str = "serve_send:send", **env: str
) -> subprocess.Popen[str]:
    """``python [options] -m asynccoord run`` on ``db_path``, through :data:`LAUNCHER`."""
    argv = ["-c", LAUNCHER, *options, "-m", "asynccoord", "run", "--db", str(db_path), "--queue", QUEUE]
    argv += ["--send", send, "--nodes", "1", "--shutdown-timeout-s", "2"]
    env = {
        "PYTHONPATH": str(TESTS / "workers"),
        "SERVE_SEND_LOG": str(tmp_path / "sends.log"),
        "SERVE_SEND_SLEEP_S": "0.05",
        **env,
    }
    proc: subprocess.Popen[str] = python.spawn(argv, env=env)
    return proc


def catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` catches ``signum`` now (Linux: the SigCgt mask of /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next((line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), "0")
    return bool(int(caught, 16) & (1 << (signum - 1)))


def rows(db_path: Path) -> tuple[list[tuple[str, int, int]], int]:
    """Every task's (status, attempts, version), and how many members are registered."""
    with sqlite3.connect(db_path) as db:
        tasks = db.execute("SELECT status, attempts, version FROM coord_tasks ORDER BY id").fetchall()
        members = db.execute("SELECT count(*) FROM coord_members").fetchone()[0]
    return tasks, members


async def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    """Exit status, standard output and standard error of ``proc``, which must exit within 20 s."""
    try:
        out, err = await asyncio.to_thread(proc.communicate, None, 20)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"asynccoord run still running 20 s after the signal; stderr:\n{err}")
    return proc.returncode, out, err


def without_importtime(err: str) -> str:
    return "".join(line for line in err.splitlines(keepends=True) if not line.startswith("import time:"))


@pytest.mark.parametrize(
    ("signum", "imported"),
    [
        (signal.SIGTERM, "asynccoord.backends"),  # the package's first imports
        (signal.SIGHUP, "asynccoord.backends.memory"),  # halfway through them
        (signal.SIGTERM, "asynccoord.cli.main"),  # the command line, before `run` parses its options
        (signal.SIGINT, "asynccoord.backends.memory"),
    ],
)
async def test_a_stop_signal_while_the_package_imports_stops_the_run_cleanly(
    python: Any, db_path: Path, tmp_path: Path, signum: signal.Signals, imported: str
) -> None:
    await enqueue(db_path, 3)
    proc = start_run(python, db_path, tmp_path, "-X", "importtime")
    assert proc.stderr is not None
    while True:
        line = await asyncio.to_thread(proc.stderr.readline)
        assert line, f"{imported} was never imported"
        if line.rsplit("|", 1)[-1].strip() == imported:
            break
    os.kill(proc.pid, signum)
    code, out, err = await finish(proc)
    assert (code, out, without_importtime(err)) == (0, "", "")  # before any node started: nothing printed
    assert rows(db_path) == ([UNTOUCHED] * 3, 0)


async def test_a_stop_signal_while_run_imports_the_send_module_stops_the_run_cleanly(
    python: Any, db_path: Path, tmp_path: Path
) -> None:
    await enqueue(db_path, 3)
    mark = tmp_path / "importing"
    proc = start_run(
        python,
        db_path,
        tmp_path,
        send="slow_import_send:send",
        SLOW_IMPORT_MARK=str(mark),
        SLOW_IMPORT_S="1.0",
    )
    deadline = time.monotonic() + 20
    while not mark.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the send module was never imported"
        await asyncio.sleep(0.005)
    os.kill(proc.pid, signal.SIGTERM)
    code, out, err = await finish(proc)
    assert (code, out, err) == (0, "", "")
    assert rows(db_path) == ([UNTOUCHED] * 3, 0)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
async def test_a_stop_signal_as_soon_as_the_run_catches_it_stops_it_cleanly_every_time(
    python: Any, db_path: Path, tmp_path: Path, signum: signal.Signals
) -> None:
    # The earliest moment a signal can be handled at all (before it, the interpreter itself
    # is starting), then later and later: at each, the clean exit of a run.
    await enqueue(db_path, 3)
    for delay_s in (0.0, 0.0, 0.0, 0.01, 0.03, 0.1, 0.3):
        proc = start_run(python, db_path, tmp_path)
        deadline = time.monotonic() + 20
        while not catches(proc.pid, signum):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, f"the run never caught {signum.name}"
            await asyncio.sleep(0.001)
        await asyncio.sleep(delay_s)
        os.kill(proc.pid, signum)
        code, out, err = await finish(proc)
        assert (code, err) == (0, ""), (delay_s, out)
        # Nothing, or the start and the stop (with the tasks committed before it): never a start alone.
        started = f"asynccoord: 1 node draining {QUEUE!r} of {db_path}\n"
        stopped = rf"asynccoord: 1 node stopped on {signum.name}: \d+ tasks? committed, \d+ handed back at the stop\n"
        assert out == "" or re.fullmatch(re.escape(started) + stopped, out), (delay_s, out)
        tasks, members = rows(db_path)
        assert members == 0, delay_s
        assert {status for status, _, _ in tasks} <= {"pending", "done"}, (delay_s, tasks)  # none left claimed


@pytest.mark.parametrize(
    ("argv", "orig_argv", "expected"),
    [
        (["-m", "run", "--db", "x"], ["python", "-m", "asynccoord", "run", "--db", "x"], True),
        (["-m", "run"], ["python", "-X", "importtime", "-masynccoord", "run"], True),
        (["-m", "run"], ["python", "-m", "asynccoord.__main__", "run"], True),
        (["-m", "status", "--db", "x"], ["python", "-m", "asynccoord", "status", "--db", "x"], False),
        (["-m", "run"], ["python", "-m", "asynccoord.demo", "run"], False),  # another module of the package
        (["-m", "run"], ["python", "-m", "asynccoordx", "run"], False),
        (["-m"], ["python", "-m", "asynccoord"], False),
        (["-c", "run"], ["python", "-c", "import asynccoord", "run"], False),
        (["app.py", "run"], ["python", "app.py", "run"], False),
    ],
)
def test_only_python_m_asynccoord_run_holds_its_start_signals(
    argv: list[str], orig_argv: list[str], expected: bool
) -> None:
    assert is_run_start(argv, orig_argv) is expected


@pytest.mark.parametrize(
    ("command", "target"),
    [
        ("run", "postgresql"),
        ("run", "redis"),
        ("dashboard", "postgresql"),
        ("dashboard", "redis"),
    ],
)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_a_stop_signal_while_a_server_never_answers_the_connect_ends_the_command_at_once(
    python: Any, db_path: Path, tmp_path: Path, command: str, target: str, signum: signal.Signals
) -> None:
    # The server takes the connection (the kernel's backlog) and never answers: the open
    # would wait for its connect timeout (10 s for PostgreSQL, about 5 s for Redis) and fail.
    pytest.importorskip("asyncpg" if target == "postgresql" else "redis")
    if command == "dashboard":
        pytest.importorskip("aiohttp")
    await enqueue(db_path, 3)
    with socket.create_server(("127.0.0.1", 0)) as silent:
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        argv = ["-c", LAUNCHER, "-m", "asynccoord", command]
        if target == "postgresql":
            argv += ["--db", f"postgresql://{address}/test"]
        else:
            argv += ["--db", str(db_path), "--lock-store", f"redis://{address}"]
        argv += ["--queue", QUEUE, "--send", "serve_send:send"] if command == "run" else ["--port", "0"]
        proc: subprocess.Popen[str] = python.spawn(argv, env={"PYTHONPATH": str(TESTS / "workers")})
        deadline = time.monotonic() + 20
        while not select.select([silent], [], [], 0.01)[0]:  # the open's connection waits in the backlog
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the command never connected"
        await asyncio.sleep(0.2)  # well into the connect
        signalled = time.monotonic()
        os.kill(proc.pid, signum)
        code, out, err = await finish(proc)
    assert (code, out, err) == (0, "", "")
    assert time.monotonic() - signalled < 3  # not the connect timeout
    assert rows(db_path) == ([UNTOUCHED] * 3, 0)
