"""What the benchmarks share: the event loop they run on and the machine's load beside their figures."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ("has_uvloop", "loadavg", "run")

T = TypeVar("T")


def run(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run the coroutine ``main()`` makes on uvloop when it is installed, else on asyncio."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main())
    result: T = uvloop.run(main())
    return result


def has_uvloop() -> bool:
    """Whether uvloop is installed (the benchmarks then run on it)."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def loadavg() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (``/proc/loadavg``), None where there is none."""
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return None
