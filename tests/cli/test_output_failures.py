"""A command whose standard output refuses a write: one line on standard error, exit status 1.

``status > /dev/full`` (no space left on the device) as real processes, for every kind of
output a command prints: a table, JSON, an action's line. A closed pipe stays a quiet exit 0
(``tests/cli/test_cli.py``).
"""

from __future__ import annotations

import asyncio
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT

from asynccoord import SQLiteStore

pytestmark = pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")


@pytest.fixture(scope="module")
def dead_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("full") / "bot.db"

    async def prepare() -> None:
        async with SQLiteStore(path) as store:
            for i in range(3):
                await store.enqueue("outbox", {"n": i}, max_attempts=1)
            for task in await store.claim("outbox", node_id="n", limit=3):
                await store.fail(task, "boom")

    asyncio.run(prepare())
    return path


@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["status", "--json"],
        ["dead", "--queue", "outbox"],
        ["dead", "--queue", "outbox", "--json"],
        ["dead", "discard", "--queue", "outbox", "--id", "999"],
    ],
    ids=" ".join,
)
def test_a_full_device_is_one_line_on_stderr_and_exit_1(dead_db: Path, command: list[str]) -> None:
    argv = [sys.executable, "-m", "asynccoord", *command, "--db", str(dead_db)]
    with open("/dev/full", "w") as full:
        proc = subprocess.run(argv, cwd=ROOT, stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    name = command[0]
    lines = proc.stderr.splitlines()
    assert proc.returncode == 1
    assert lines[-1] == f"asynccoord {name}: error: cannot write the output: No space left on device"
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "command", [["--version"], ["--help"], ["status", "--help"], ["dead", "requeue", "--help"]], ids=" ".join
)
def test_help_and_version_on_a_full_device_are_one_line_and_exit_1(command: list[str]) -> None:
    """argparse prints them and exits 0; the write failed only at the interpreter's exit, unseen."""
    argv = [sys.executable, "-m", "asynccoord", *command]
    with open("/dev/full", "w") as full:
        proc = subprocess.run(argv, cwd=ROOT, stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == ["python -m asynccoord: error: cannot write the output: No space left on device"]


@pytest.mark.parametrize("command", [["--version"], ["status", "--help"]], ids=" ".join)
def test_help_and_version_to_a_reader_that_leaves_end_quietly_with_status_0(command: list[str]) -> None:
    argv = [sys.executable, "-m", "asynccoord", *command]
    pipeline = f"set -o pipefail; {shlex.join(argv)} | head -c 1"
    proc = subprocess.run(["bash", "-c", pipeline], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.stdout in ("a", "u")  # "asynccoord ..." or "usage: ..."
    assert proc.stderr == ""
    assert proc.returncode == 0  # pipefail: the command's own status
