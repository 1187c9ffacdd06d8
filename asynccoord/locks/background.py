"""Work a lock handle leaves running in the background when its caller cannot wait for it.

A release shielded from its caller's cancellation, a lease granted as its caller was
cancelled, a lease that arrived too late to use: each is released in a task of its own.
Such tasks are kept referenced here until they end (the event loop holds only weak
references to its tasks), and what they raise is logged, never lost.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ("keep", "shielded", "watched")

log = logging.getLogger("asynccoord.locks.lock")  # the log lines keep the lock module's logger name

T = TypeVar("T")

_BACKGROUND: set[asyncio.Future[Any]] = set()


def keep(task: asyncio.Future[Any]) -> None:
    """Keep a background task referenced until it ends."""
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)


def _log_outcome(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("asynccoord.lock.lock_release_failed error=%s", task.exception())


def watched(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """``coro`` in a task of its own, kept until it ends, whose failure is logged in one line.

    For a call its caller may stop waiting for (``wait_for(shield(task), timeout)`` timing
    out, or the caller cancelled): the task goes on, and its error, logged here, is never
    left for asyncio to report as "Task exception was never retrieved".
    """
    task = asyncio.ensure_future(coro)
    keep(task)
    task.add_done_callback(_log_outcome)
    return task


async def shielded(coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
    """Await ``coro`` in its own task, shielded from the caller's cancellation.

    If the caller is cancelled, keep waiting (cancellations included) up to
    ``timeout_s`` for the task to finish, then re-raise the cancellation; a task
    still running then finishes in the background.
    """
    task = asyncio.ensure_future(coro)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        deadline = time.monotonic() + timeout_s
        while not task.done() and (remaining := deadline - time.monotonic()) > 0:
            try:
                await asyncio.wait({task}, timeout=remaining)
            except asyncio.CancelledError:
                continue  # cancelled again: the wait stays bounded, the cancellation is re-raised below
        if task.done():
            _log_outcome(task)
        else:
            keep(task)
            task.add_done_callback(_log_outcome)
        raise
