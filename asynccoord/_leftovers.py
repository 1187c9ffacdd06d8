"""Ending ``python -m asynccoord run`` without waiting for sends that outlived its shutdown.

When a runtime shuts down it cancels the sends still running and hands their tasks back.
A send may outlive that: a coroutine that swallows its cancellation (the runtime leaves it
behind, its task still claimed until its lease lapses), or a blocking call it made in the
loop's default executor (``asyncio.to_thread``), which no cancellation stops. ``asyncio.run``
would then cancel and await such a task again, wait for the executor's threads, and the
interpreter would join those threads at its exit: the process stayed up until the send
ended by itself, deaf to further stop signals (they are ignored from the end of the
teardown).

:func:`run_leaving` runs the command's coroutine on a loop that counts the calls running
in its default executor; once the coroutine is over (the runtime and the store closed),
work still running is reported as :class:`Leftovers` and not waited for.
:func:`exit_now` then ends the process at once with the command's exit status, after
flushing the logs and standard streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NoReturn, ParamSpec, TypeVar

__all__ = ("CountingExecutor", "Leftovers", "exit_now", "run_leaving")

T = TypeVar("T")
P = ParamSpec("P")


@dataclass(frozen=True, slots=True, kw_only=True)
class Leftovers:
    """Work still running when the command's coroutine returned.

    Attributes:
        tasks: asyncio tasks not done (sends that ignored their cancellation).
        threads: Calls still running in the loop's default executor (``asyncio.to_thread``).
    """

    tasks: int
    threads: int

    def __bool__(self) -> bool:
        return self.tasks > 0 or self.threads > 0


class CountingExecutor(ThreadPoolExecutor):
    """A ``ThreadPoolExecutor`` that counts the calls running in it (:attr:`running`)."""

    def __init__(self) -> None:
        super().__init__(thread_name_prefix="asyncio")
        self._running = 0
        self._count_lock = threading.Lock()

    @property
    def running(self) -> int:
        """Calls started and not yet returned."""
        with self._count_lock:
            return self._running

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        def counted() -> T:
            with self._count_lock:
                self._running += 1
            try:
                return fn(*args, **kwargs)
            finally:
                with self._count_lock:
                    self._running -= 1

        return super().submit(counted)


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop when it is installed (the ``fast`` extra), else asyncio's default."""
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


CANCEL_GRACE_S = 0.5
"""How long tasks still running when the command's coroutine returns may take to end once cancelled."""


def run_leaving(main: Coroutine[Any, Any, T], left: Callable[[Leftovers], None]) -> T:
    """Run ``main`` to completion on a new event loop; do not wait for what outlives it.

    As ``asyncio.run`` (uvloop's loop when importable), except at the end: the tasks still
    running are cancelled and get :data:`CANCEL_GRACE_S` to end, not more. When some are
    still running then, or calls in the default executor are, ``left`` is called with
    their counts (before ``main``'s result is returned or its exception raised), the
    executor is shut down without waiting, and the loop is closed without them. With
    nothing left, the loop closes as ``asyncio.run`` closes it.
    """
    runner = asyncio.Runner(loop_factory=_loop_factory())
    loop = runner.get_loop()
    executor = CountingExecutor()
    loop.set_default_executor(executor)
    try:
        return runner.run(main)
    finally:
        tasks = _cancel_within(loop, CANCEL_GRACE_S)
        leftovers = Leftovers(tasks=len(tasks), threads=executor.running)
        if not leftovers:
            runner.close()
        else:
            try:
                left(leftovers)
            finally:
                executor.shutdown(wait=False, cancel_futures=True)
                with contextlib.suppress(RuntimeError):
                    asyncio.set_event_loop(None)
                loop.close()


def _cancel_within(loop: asyncio.AbstractEventLoop, timeout_s: float) -> list[asyncio.Task[Any]]:
    """Cancel ``loop``'s tasks and wait up to ``timeout_s`` for them; return those still running.

    A task that ended with an exception goes to the loop's exception handler, as ``asyncio.run`` does.
    """
    tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
    if not tasks:
        return []
    for task in tasks:
        task.cancel()
    with contextlib.suppress(Exception):
        loop.run_until_complete(asyncio.wait(tasks, timeout=timeout_s))
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            loop.call_exception_handler(
                {
                    "message": "unhandled exception during asynccoord run shutdown",
                    "exception": task.exception(),
                    "task": task,
                }
            )
    return [task for task in tasks if not task.done()]


def exit_now(status: int) -> NoReturn:
    """End the process with ``status`` at once: logs and standard streams flushed, no thread joined.

    Skips the interpreter's own exit (``atexit`` callbacks, joining threads), which would
    wait for the threads of sends that outlived the shutdown.
    """
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    handlers = [h for lg in loggers if isinstance(lg, logging.Logger) for h in lg.handlers]
    for handler in [*handlers, logging.lastResort]:
        if handler is not None:
            with contextlib.suppress(Exception):
                handler.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)
