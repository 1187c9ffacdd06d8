"""Running a coroutine on uvloop when it is installed (the ``fast`` extra), else on asyncio."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ("run",)

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to completion on a new event loop (uvloop's when importable)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    runner: Callable[[Coroutine[Any, Any, T]], T] = uvloop.run  # typed even where uvloop's stubs are absent
    return runner(main)
