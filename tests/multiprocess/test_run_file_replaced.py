"""``python -m asynccoord run`` stops with one line when its SQLite file is deleted or replaced (real processes).

The send function is tests/workers/serve_send.py's (it logs each task it sends).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support import TESTS

from asynccoord import SQLiteStore

pytestmark = pytest.mark.multiprocess

WORKERS = TESTS / "workers"
QUEUE = "outbox"
EXIT_BOUND_S = 20.0
"""The store looks at its path every 2 s; the rest is the nodes' hand-back and the teardown."""


def start_run(python: Any, db_path: Path, log: Path) -> subprocess.Popen[str]:
    argv = ["-m", "asynccoord", "run", "--db", str(db_path), "--queue", QUEUE, "--send", "serve_send:send"]
    env = {"PYTHONPATH": str(WORKERS), "SERVE_SEND_LOG": str(log), "SERVE_SEND_SLEEP_S": "0"}
    proc: subprocess.Popen[str] = python.spawn(argv, env=env)
    return proc


async def new_database(path: Path, tasks: int) -> None:
    async with SQLiteStore(path, wakeup=False) as store:
        for i in range(tasks):
            await store.enqueue(QUEUE, {"n": i})


@pytest.mark.parametrize("how", ["deleted", "replaced"])
async def test_run_exits_1_with_one_line_when_its_file_is_deleted_or_replaced(
    python: Any, tmp_path: Path, how: str
) -> None:
    db_path = tmp_path / "rm.db"
    proc = start_run(python, db_path, tmp_path / "sent.log")
    assert proc.stdout is not None
    started = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30.0)
    assert "draining 'outbox'" in started
    for name in (db_path, Path(f"{db_path}-wal"), Path(f"{db_path}-shm")):
        name.unlink()
    if how == "replaced":  # a new database moved over the path
        await new_database(tmp_path / "new.db", 10)
        os.replace(tmp_path / "new.db", db_path)
    try:
        status = await asyncio.to_thread(proc.wait, EXIT_BOUND_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"run still running {EXIT_BOUND_S} s after its file was {how}: {proc.communicate()[1]}")
    err = proc.communicate()[1]
    assert status == 1, err
    last = err.strip().splitlines()[-1]
    what = "was deleted or moved" if how == "deleted" else "was replaced by another file"
    assert last.startswith(f"asynccoord run: error: the database file {str(db_path)!r} {what}"), err
