"""``python -m asynccoord run --lifespan``: what a lifespan that hangs, raises or swallows does to the run.

The lifespans live in tests/workers/lifespans.py and log what they do to the file
``SERVE_SEND_LOG`` names; the processes are real, their signals real.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from support import ROOT, TESTS

from asynccoord import StoreError
from asynccoord.cli.main import main
from asynccoord.node import Runtime

WORKERS = TESTS / "workers"
LIFESPANS = WORKERS / "lifespans.py"


def at(raising: str) -> str:
    """``(at FILE:LINE)`` of the line of tests/workers/lifespans.py that reads ``raising``."""
    lines = LIFESPANS.read_text().splitlines()
    return f"(at {LIFESPANS}:{next(i for i, text in enumerate(lines, 1) if text.strip() == raising)})"


def spawn_run(python: Any, db: Path, log: Path, lifespan: str, *extra: str) -> subprocess.Popen[str]:
    argv = ["-m", "asynccoord", "run", "--db", str(db), "--queue", "outbox", "--send", "serve_send:send"]
    argv += ["--nodes", "1", "--lifespan", f"lifespans:{lifespan}", *extra]
    env = {"PYTHONPATH": str(WORKERS), "SERVE_SEND_LOG": str(log), "SERVE_SEND_SLEEP_S": "0"}
    proc: subprocess.Popen[str] = python.spawn(argv, env=env)
    return proc


async def wait_for_word(proc: subprocess.Popen[str], log: Path, word: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while word not in words(log):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"no {word!r} in the log"
        await asyncio.sleep(0.01)


def words(log: Path) -> list[str]:
    return [line.split()[0] for line in log.read_text().splitlines()] if log.exists() else []


async def test_a_signal_cuts_a_hanging_lifespan_entry_short_before_the_database_opens(
    python: Any, tmp_path: Path
) -> None:
    db, log = tmp_path / "bot.db", tmp_path / "lifespan.log"
    proc = spawn_run(python, db, log, "hang_enter")
    await wait_for_word(proc, log, "entering")
    os.kill(proc.pid, signal.SIGTERM)
    code = await asyncio.to_thread(proc.wait, 20)
    _, err = proc.communicate()
    assert code == 0, err
    assert "asynccoord.run.lifespan_interrupted lifespan='lifespans:hang_enter'" in err
    assert not db.exists()  # the database was never opened
    assert words(log) == ["entering"]


async def test_an_entry_that_ends_despite_the_signal_is_left_before_the_run_ends(python: Any, tmp_path: Path) -> None:
    db, log = tmp_path / "bot.db", tmp_path / "lifespan.log"
    proc = spawn_run(python, db, log, "stubborn_enter")
    await wait_for_word(proc, log, "entering")
    os.kill(proc.pid, signal.SIGTERM)
    code = await asyncio.to_thread(proc.wait, 20)
    _, err = proc.communicate()
    assert code == 0, err
    assert "asynccoord.run.lifespan_interrupted lifespan='lifespans:stubborn_enter'" in err
    assert not db.exists()
    assert words(log) == ["entering", "entered", "exited"]  # what it opened was closed


async def test_a_hanging_lifespan_exit_is_cut_short_at_the_shutdown_timeout(python: Any, tmp_path: Path) -> None:
    db, log = tmp_path / "bot.db", tmp_path / "lifespan.log"
    proc = spawn_run(python, db, log, "hang_exit", "--shutdown-timeout-s", "1")
    assert proc.stdout is not None
    started = await asyncio.to_thread(proc.stdout.readline)  # the nodes run
    assert started.startswith("asynccoord: 1 node draining 'outbox'"), started
    signalled = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    code = await asyncio.to_thread(proc.wait, 20)
    # an idle drain, then the exit's 1 s and the cancelled exit's 1 s to end: well under 10 s
    assert time.monotonic() - signalled < 8.0
    _, err = proc.communicate()
    assert code == 1, err
    assert err.endswith(
        "asynccoord run: error: --lifespan 'lifespans:hang_exit' was cut short while exiting: "
        "it took longer than --shutdown-timeout-s (1 s)\n"
    ), err
    assert words(log) == ["entered", "exiting"]


async def test_a_second_signal_cuts_a_hanging_lifespan_exit_short(python: Any, tmp_path: Path) -> None:
    db, log = tmp_path / "bot.db", tmp_path / "lifespan.log"
    proc = spawn_run(python, db, log, "hang_exit", "--shutdown-timeout-s", "60")
    await wait_for_word(proc, log, "entered")
    assert proc.stdout is not None
    await asyncio.to_thread(proc.stdout.readline)
    os.kill(proc.pid, signal.SIGTERM)
    await wait_for_word(proc, log, "exiting")
    os.kill(proc.pid, signal.SIGINT)
    code = await asyncio.to_thread(proc.wait, 20)  # not the 60 s of the shutdown timeout
    _, err = proc.communicate()
    assert code == 1, err
    assert err.endswith("--lifespan 'lifespans:hang_exit' was cut short while exiting: a signal came\n"), err


def test_a_lifespan_raising_on_entry_ends_the_run_with_one_line_before_the_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(WORKERS))
    db = tmp_path / "bot.db"
    argv = ["run", "--db", str(db), "--send", "asyncio:sleep", "--lifespan", "lifespans:failing_enter"]
    assert main(argv) == 1
    last = capsys.readouterr().err.splitlines()[-1]
    assert last == (
        "asynccoord run: error: --lifespan 'lifespans:failing_enter' raised entering it: "
        "RuntimeError: cannot reach the provider " + at('raise RuntimeError("cannot reach the provider")')
    )
    assert not db.exists()


@pytest.mark.parametrize(
    ("lifespan", "raising", "said"),
    [
        (
            "failing_enter",
            'raise RuntimeError("cannot reach the provider")',
            "raised entering it: RuntimeError: cannot reach the provider",
        ),
        ("factory_raises", 'raise KeyError("BOT_TOKEN")', "raised when called: KeyError: 'BOT_TOKEN'"),
    ],
)
def test_a_lifespan_raising_at_start_writes_one_line_and_no_traceback(
    python: Any, tmp_path: Path, lifespan: str, raising: str, said: str
) -> None:
    """A failed command writes one line on standard error (README), as other failures of run do: the
    lifespan's line that raised is named in it, in place of a traceback."""
    db = tmp_path / "bot.db"
    argv = [
        "-m",
        "asynccoord",
        "run",
        "--db",
        str(db),
        "--send",
        "asyncio:sleep",
        "--lifespan",
        f"lifespans:{lifespan}",
    ]
    env = {"PYTHONPATH": os.pathsep.join([str(WORKERS), str(ROOT)]), "SERVE_SEND_LOG": str(tmp_path / "log")}
    proc = python.run(argv, env=env, check=False)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr == f"asynccoord run: error: --lifespan 'lifespans:{lifespan}' {said} {at(raising)}\n"
    assert not db.exists()


def fail_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Make the run of ``main(["run", ...])`` end with a store error once its nodes run; return the lifespans' log."""
    monkeypatch.syspath_prepend(str(WORKERS))
    log = tmp_path / "lifespan.log"
    monkeypatch.setenv("SERVE_SEND_LOG", str(log))

    async def fail(self: Runtime, signals: object = ()) -> int:
        raise StoreError("the database went away")

    monkeypatch.setattr(Runtime, "wait_for_signal", fail)
    return log


def test_a_lifespan_never_sees_nor_swallows_the_runs_own_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A store error ending the run reaches the command (exit 1) through a lifespan that would swallow
    it; the lifespan is left as after a clean run."""
    log = fail_the_run(tmp_path, monkeypatch)
    argv = ["run", "--db", str(tmp_path / "bot.db"), "--send", "asyncio:sleep", "--lifespan", "lifespans:swallowing"]
    assert main(argv) == 1
    assert capsys.readouterr().err.endswith("asynccoord run: error: the database went away\n")
    assert words(log) == ["entered", "exited"]


@pytest.mark.parametrize(
    ("lifespan", "named"),
    [
        ("lifespans:sync_manager", "returned a synchronous context manager, not an async context manager"),
        ("builtins:dict", "returned dict, not an async context manager"),
    ],
)
def test_a_lifespan_giving_no_async_context_manager_is_refused_before_the_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], lifespan: str, named: str
) -> None:
    monkeypatch.syspath_prepend(str(WORKERS))
    argv = ["run", "--db", str(tmp_path / "bot.db"), "--send", "asyncio:sleep", "--lifespan", lifespan]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"--lifespan {lifespan!r} {named}" in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("lifespan", "named"),
    [
        ("asyncio:sleep", "--lifespan 'asyncio:sleep' is an async function"),
        ("contextlib:aclosing", "--lifespan 'contextlib:aclosing' is called with no arguments, but takes"),
        ("lifespans:needs_args", "--lifespan 'lifespans:needs_args' is called with no arguments, but takes (token"),
        ("json:no_such", "'json' has no attribute 'no_such'"),
    ],
)
def test_a_lifespan_that_cannot_be_called_so_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], lifespan: str, named: str
) -> None:
    monkeypatch.syspath_prepend(str(WORKERS))
    with pytest.raises(SystemExit) as exited:
        main(["run", "--db", str(tmp_path / "bot.db"), "--send", "asyncio:sleep", "--lifespan", lifespan])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m asynccoord run"), err
    assert named in err, err
    assert list(tmp_path.iterdir()) == []


async def test_an_async_generator_function_is_named_as_one(tmp_path: Path) -> None:
    from asynccoord import InvalidTypeError
    from asynccoord.cli.lifespan import check_lifespan

    async def gen() -> Any:
        yield

    with pytest.raises(InvalidTypeError, match="is an async generator function, not an async context manager"):
        check_lifespan("bot:gen", gen)


def test_a_failing_lifespan_exit_leaves_the_runs_own_error_in_the_last_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    fail_the_run(tmp_path, monkeypatch)
    argv = ["run", "--db", str(tmp_path / "bot.db"), "--send", "asyncio:sleep", "--lifespan", "lifespans:failing_exit"]
    assert main(argv) == 1
    assert capsys.readouterr().err.endswith("asynccoord run: error: the database went away\n")
    failed = "raised exiting it: RuntimeError: close failed " + at('raise RuntimeError("close failed")')
    assert f"{failed} (after the run's own error)" in caplog.text


@pytest.mark.parametrize(
    ("lifespan", "named"),
    [
        (
            "lifespans:SyncExit",
            "--lifespan 'lifespans:SyncExit': its __aexit__ returned bool, not an awaitable (define it with async def)",
        ),
        (
            "lifespans:factory_raises",
            "--lifespan 'lifespans:factory_raises' raised when called: KeyError: 'BOT_TOKEN' "
            + at('raise KeyError("BOT_TOKEN")'),
        ),
    ],
)
def test_a_lifespan_broken_in_the_applications_code_ends_the_run_with_one_error_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], lifespan: str, named: str
) -> None:
    monkeypatch.syspath_prepend(str(WORKERS))
    monkeypatch.setenv("SERVE_SEND_LOG", str(tmp_path / "lifespan.log"))

    async def stop(self: Runtime, signals: object = ()) -> int:
        await self.shutdown()
        return 0

    monkeypatch.setattr(Runtime, "wait_for_signal", stop)
    assert main(["run", "--db", str(tmp_path / "bot.db"), "--send", "asyncio:sleep", "--lifespan", lifespan]) == 1
    assert capsys.readouterr().err.splitlines()[-1] == f"asynccoord run: error: {named}"
