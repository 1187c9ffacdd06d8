"""Every program in examples/ runs as a real process, exits 0 and prints its verdict line.

Each example checks its own outcome and exits non-zero when the check fails, so a
passing run here means the behaviour it demonstrates still holds. An example added
without an entry in ``KEY_LINES`` fails, so none goes untested.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import ROOT

EXAMPLES_DIR = ROOT / "examples"
TIMEOUT_S = 60.0

KEY_LINES = {
    "aiogram_bot.py": "every message answered once, in per-chat order, no 429: OK",
    "ptb_bot.py": "every message answered once, in per-chat order, no 429: OK",
    "telegram_standin.py": "a burst to one chat met Telegram's 429 after 3 messages: OK",
    "account_semaphore.py": "no account ever had more than 3 sends in flight: OK",
    "alerts.py": "one alert for the burst and one resolved notice, on both channels: OK",
    "bot_runtime.py": "every reply sent once and in per-conversation order: OK",
    "fenced_write.py": "the stale holder's write was refused, the resource keeps B's data: OK",
    "long_job_lock.py": "long job kept its lock, contender refused, hung job stopped at max_hold_s: OK",
    "quickstart.py": "duplicates=0, lost=0",
    "rate_limits.py": "every message sent once, in order, the 429 honoured: OK",
}
"""Example file name -> a line (or part of one) its successful run prints."""

EXAMPLES = sorted(EXAMPLES_DIR.glob("*.py"))


def test_examples_are_found() -> None:
    assert EXAMPLES, f"no examples in {EXAMPLES_DIR}"


AIOGRAM = pytest.mark.xdist_group("aiogram")
"""The tests whose processes import aiogram (6 s of CPU each on two cores) run on one worker, one at a time."""


@pytest.mark.parametrize(
    "path", [pytest.param(p, id=p.stem, marks=[AIOGRAM] if p.stem == "aiogram_bot" else []) for p in EXAMPLES]
)
def test_example_runs_and_passes_its_own_check(path: Path, tmp_path: Path) -> None:
    assert path.name in KEY_LINES, f"add the key output line of examples/{path.name} to KEY_LINES"
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(path)],
        cwd=tmp_path,  # examples must not depend on the working directory
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    elapsed_s = time.monotonic() - started
    report = f"exit {proc.returncode} after {elapsed_s:.1f} s\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    assert proc.returncode == 0, report
    assert KEY_LINES[path.name] in proc.stdout, report
    assert "Traceback" not in proc.stderr, report
