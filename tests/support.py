"""Helpers shared by the tests (import as ``from support import ...``)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

__all__ = ("FAKE_EPOCH", "FakeClock", "bound_by_permissions", "count_calls", "wait_until")

TESTS = Path(__file__).resolve().parent
"""The tests folder (its ``workers/`` and ``data/``)."""

ROOT = TESTS.parent
"""The repository's root."""

FAKE_EPOCH = 1_700_000_000.0
"""Where every fake clock starts (2023-11-14, a plausible store clock value)."""


class FakeClock:
    """A store clock that moves only when a test says so.

    Pass it as ``clock=`` to :class:`~asynccoord.MemoryStore` or
    :class:`~asynccoord.SQLiteStore`; every store sharing one file must share it.
    """

    __slots__ = ("now",)

    def __init__(self, start: float = FAKE_EPOCH) -> None:
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        """Move forward by ``seconds`` (>= 0); return the new time."""
        if seconds < 0:
            raise ValueError(f"a clock never goes back, got advance({seconds!r})")
        self.now += seconds
        return self.now

    def __repr__(self) -> str:
        return f"<FakeClock now={self.now:.6f} (+{self.now - FAKE_EPOCH:.6f})>"


def count_calls(store: Any, name: str) -> list[float]:
    """Record the ``time.monotonic()`` of every call of ``store.<name>`` (callers go through the instance)."""
    calls: list[float] = []
    original = getattr(store, name)

    async def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(time.monotonic())
        return await original(*args, **kwargs)

    setattr(store, name, counted)
    return calls


async def wait_until(predicate: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    """Poll ``predicate`` every 5 ms until it is true; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


def bound_by_permissions() -> list[str]:
    """A command prefix under which a process is bound by file permission bits.

    Empty for a user. Root ignores the bits through two capabilities: the prefix runs the
    command without them (``setpriv``), or the test is skipped where root cannot drop them.
    """
    if os.geteuid() != 0:
        return []
    prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]
    if shutil.which("setpriv") is None or subprocess.run([*prefix, "true"], check=False).returncode != 0:
        pytest.skip("run as root, which cannot drop the capabilities that ignore permission bits here")
    return prefix
