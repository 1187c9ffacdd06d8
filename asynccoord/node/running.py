"""The runtimes of this process that run now, so that a process exit stops all of them.

When a send raises ``KeyboardInterrupt`` or ``SystemExit`` the process is ending (see
:mod:`asynccoord._exits`): before the exit is raised, every runtime of the event loop stops
without a drain and hands back what it holds, so the exit finds nothing of theirs claimed
or held. A :class:`~asynccoord.node.runtime.Runtime` enlists here while its nodes run, with
the function that stops it; a runtime whose send raised the exit, and a standalone
:meth:`Node.run() <asynccoord.node.node.Node.run>`, call :func:`stop_all`. The registry sits
below both, so neither the node nor the runtime imports the other to reach it.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Any

import anyio

from .._exits import ProcessExiting

__all__ = ("STOP_OTHERS_S", "StopFn", "enlist", "leave", "stop_all")

STOP_OTHERS_S = 15.0
"""Seconds a runtime whose send raised ``KeyboardInterrupt`` or ``SystemExit`` (or a standalone
node) waits for the other runtimes of its event loop to hand back what they hold before it
raises the exit."""

StopFn = Callable[[ProcessExiting, asyncio.AbstractEventLoop], "asyncio.Task[None] | None"]
"""Stops one runtime for a process exit, if it runs on the given event loop and is not
stopping for one already; returns its task to wait for (None: nothing to wait for)."""

_RUNNING: weakref.WeakKeyDictionary[Any, weakref.WeakMethod[StopFn]] = weakref.WeakKeyDictionary()
"""The runtimes whose nodes run now, each with (a weak reference to) its stop method."""


def enlist(owner: Any, stop: StopFn) -> None:
    """Count ``owner`` among the running runtimes until :func:`leave`; ``stop`` (a bound method of it) stops it."""
    _RUNNING[owner] = weakref.WeakMethod(stop)


def leave(owner: Any) -> None:
    """``owner`` runs no more (nothing happens if it was not enlisted)."""
    _RUNNING.pop(owner, None)


async def stop_all(carried: ProcessExiting, *, besides: Any = None) -> None:
    """The process is ending: stop every runtime of this event loop (but ``besides``), without a drain.

    Waits (up to :data:`STOP_OTHERS_S`) for their hand-backs, so that the exit, once raised,
    finds nothing of theirs claimed or held; their waiters raise the same exit.
    """
    loop = asyncio.get_running_loop()
    stops = [ref() for owner, ref in list(_RUNNING.items()) if owner is not besides]
    runners = [runner for stop in stops if stop is not None and (runner := stop(carried, loop)) is not None]
    if runners:
        with anyio.CancelScope(shield=True):
            await asyncio.wait(runners, timeout=STOP_OTHERS_S)
