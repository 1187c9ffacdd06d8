"""Running a coroutine on uvloop when it is installed (the ``fast`` extra), else on asyncio."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ("loop_factory", "run")

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop factory when it is importable, else None (asyncio's default loop)."""
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop  # typed even without uvloop's stubs
    return factory


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to completion on a new event loop (uvloop's when importable), as ``asyncio.run`` does."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
