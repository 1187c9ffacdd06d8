"""Every Python example in README.md runs as written, as a real process.

Each ```python block is a whole program. It runs in a temporary folder (so its SQLite file is
a fresh one there) with a timeout, and must exit 0; a block on SQLite runs a second time in
that folder, as a reader may run it again. A block that runs a ``Runtime`` must leave
its queues drained (read with ``python -m asynccoord status --json``). A block that waits for
a signal (``wait_for_signal``) gets SIGTERM once it handles SIGTERM and its queues are
drained. A block that names the PostgreSQL and Redis hosts runs against the test services
instead (a fresh schema and key prefix), and is skipped without them (failed in CI, see
``services``).
The README's shell blocks are not run here (CI runs the Quickstart's test command).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from services import PG_DSN, REDIS_URL, drop_schemas, postgres_problem, redis_problem, unavailable
from support import ROOT

README = ROOT / "README.md"
TIMEOUT_S = 60.0

PG_EXAMPLE_DSN = "postgresql://bot@db.internal/bot"
REDIS_EXAMPLE_URL = "redis://cache.internal:6379/0"


def python_blocks(text: str) -> list[tuple[int, str]]:
    """The README's ```python blocks: (line number of the opening fence, code)."""
    blocks = []
    for match in re.finditer(r"^```python\n(.*?)^```$", text, flags=re.DOTALL | re.MULTILINE):
        blocks.append((text.count("\n", 0, match.start()) + 1, match.group(1)))
    return blocks


BLOCKS = python_blocks(README.read_text("utf-8"))


def test_readme_has_python_examples() -> None:
    assert len(BLOCKS) >= 2, "README.md should hold its examples as ```python blocks"


def sigterm_handled(pid: int) -> bool:
    """Whether process ``pid`` catches SIGTERM now (Linux: the SigCgt mask of /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = re.search(r"^SigCgt:\s*([0-9a-f]+)$", status, flags=re.MULTILINE)
    return caught is not None and bool(int(caught.group(1), 16) & (1 << (signal.SIGTERM - 1)))


def undrained(folder: Path) -> dict[str, dict[str, int]]:
    """Queues with pending or running tasks in the SQLite files under ``folder`` (``status --json``)."""
    left: dict[str, dict[str, int]] = {}
    for db in sorted(folder.glob("*.db")):
        proc = subprocess.run(
            [sys.executable, "-m", "asynccoord", "status", "--db", str(db), "--json"],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=True,
        )
        for queue in json.loads(proc.stdout)["queues"]:
            if queue.get("pending", 0) or queue.get("running", 0):
                left[f"{db.name}:{queue['queue']}"] = {k: queue.get(k, 0) for k in ("pending", "running")}
    return left


def with_services(code: str) -> tuple[str, str, str]:
    """``code`` aimed at the test services, with a fresh schema and key prefix; and those two."""
    for problem, what in ((postgres_problem(), "PostgreSQL"), (redis_problem(), "Redis")):
        if problem is not None:
            unavailable(what, problem)
    schema, prefix = f"readme_{secrets.token_hex(4)}", f"readme-{secrets.token_hex(4)}:"
    code = code.replace(PG_EXAMPLE_DSN, PG_DSN).replace(REDIS_EXAMPLE_URL, REDIS_URL)
    code = code.replace('schema="bot"', f'schema="{schema}"').replace('prefix="bot:"', f'prefix="{prefix}"')
    return code, schema, prefix


def delete_redis_keys(prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*"))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def run_block(code: str, folder: Path) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in ``folder``; SIGTERM it once it waits for the signal with its queues drained."""
    script = folder / "example.py"
    script.write_text(code)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(script)], cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        if "wait_for_signal(" in code:
            deadline = time.monotonic() + TIMEOUT_S
            while proc.poll() is None and not (sigterm_handled(proc.pid) and not undrained(folder)):
                assert time.monotonic() < deadline, "the example neither drained its queue nor handled SIGTERM"
                time.sleep(0.2)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


@pytest.mark.multiprocess
@pytest.mark.parametrize(("line", "code"), BLOCKS, ids=[f"line{line}" for line, _ in BLOCKS])
def test_readme_example_runs(line: int, code: str, tmp_path: Path) -> None:
    schema = prefix = None
    if PG_EXAMPLE_DSN in code or REDIS_EXAMPLE_URL in code:
        code, schema, prefix = with_services(code)
    try:
        started = time.monotonic()
        proc = run_block(code, tmp_path)
        elapsed_s = time.monotonic() - started
    finally:
        if schema is not None:
            drop_schemas(schema)
        if prefix is not None:
            delete_redis_keys(prefix)
    report = (
        f"README.md line {line}: exit {proc.returncode} after {elapsed_s:.1f} s\n"
        f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    )
    assert proc.returncode == 0, report
    assert "Traceback" not in proc.stderr, report
    if "Runtime(" in code:  # the nodes did their work
        assert undrained(tmp_path) == {}, report
    if schema is None:  # again, beside the files of the first run
        again = run_block(code, tmp_path)
        report = f"README.md line {line}, second run: exit {again.returncode}\n--- stderr\n{again.stderr}"
        assert again.returncode == 0, report
        assert "Traceback" not in again.stderr, report
