"""Ending ``python -m asynccoord run`` without waiting for sends that outlived its shutdown.

When a runtime shuts down it cancels the sends still running and hands their tasks back.
A send may outlive that: a coroutine that swallows its cancellation (the runtime leaves it
behind, its task still claimed until its lease lapses), or a blocking call it made in a
thread, which no cancellation stops: in the loop's default executor (``asyncio.to_thread``),
in a ``ThreadPoolExecutor`` of its own, or in a ``threading.Thread`` it started. ``asyncio.run``
would then cancel and await such a task again, wait for the executor's threads, and the
interpreter would join every non-daemon thread at its exit: the process stayed up until the
send ended by itself, deaf to further stop signals (they are ignored from the end of the
teardown).

:func:`run_leaving` runs the command's coroutine on a loop that counts the calls running
in its default executor; once the coroutine is over (the runtime and the store closed),
work still running is reported as :class:`Leftovers` and not waited for.
:func:`exit_now` then ends the process at once with the command's exit status, after
flushing the logs and standard streams.

With nothing left on the loop, the interpreter exits as usual, under :func:`guard_exit`:
it tells the idle workers of every ``ThreadPoolExecutor`` to end and joins the non-daemon
threads. Threads still alive :data:`CANCEL_GRACE_S` into that exit are busy (an idle pool
worker ends at once when told): they are reported and the process ends with
:func:`exit_now`. Only threads that hold the exit are reported, never idle ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Collection, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NoReturn, ParamSpec, TypeVar

from ._loop import loop_factory

__all__ = ("CountingExecutor", "Leftovers", "exit_now", "guard_exit", "other_threads", "run_leaving")

T = TypeVar("T")
P = ParamSpec("P")


@dataclass(frozen=True, slots=True, kw_only=True)
class Leftovers:
    """Work still running when the command's coroutine returned.

    Attributes:
        tasks: asyncio tasks not done (sends that ignored their cancellation).
        threads: Calls still running in the loop's default executor (``asyncio.to_thread``).
        other_threads: Names of the other non-daemon threads alive, started during the run
            (a send's own ``ThreadPoolExecutor`` or ``threading.Thread``), which the
            interpreter would join at its exit. Default none.
    """

    tasks: int
    threads: int
    other_threads: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return self.tasks > 0 or self.threads > 0 or bool(self.other_threads)


class CountingExecutor(ThreadPoolExecutor):
    """A ``ThreadPoolExecutor`` that counts the calls running in it (:attr:`running`)."""

    def __init__(self) -> None:
        super().__init__(thread_name_prefix="asyncio")
        self._running = 0
        self._count_lock = threading.Lock()
        self._workers: set[threading.Thread] = set()

    @property
    def running(self) -> int:
        """Calls started and not yet returned."""
        with self._count_lock:
            return self._running

    @property
    def workers(self) -> frozenset[threading.Thread]:
        """The threads that have run a call of this executor."""
        with self._count_lock:
            return frozenset(self._workers)

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        def counted() -> T:
            with self._count_lock:
                self._running += 1
                self._workers.add(threading.current_thread())
            try:
                return fn(*args, **kwargs)
            finally:
                with self._count_lock:
                    self._running -= 1

        return super().submit(counted)


CANCEL_GRACE_S = 0.5
"""How long tasks still running when the command's coroutine returns may take to end once cancelled."""


def run_leaving(main: Coroutine[Any, Any, T], left: Callable[[Leftovers], None]) -> T:
    """Run ``main`` to completion on a new event loop; do not wait for what outlives it.

    As ``asyncio.run`` (uvloop's loop when importable), except at the end: the tasks still
    running are cancelled and get :data:`CANCEL_GRACE_S` to end, not more. When some are
    still running then, or calls in the default executor are, ``left`` is called with
    their counts and the names of the other non-daemon threads started during the run and
    still alive (before ``main``'s result is returned or its exception raised), the
    executor is shut down without waiting, and the loop is closed without them. With
    nothing left, the loop closes as ``asyncio.run`` closes it; other threads still alive
    are then for :func:`guard_exit` to judge.
    """
    before = frozenset(threading.enumerate())
    runner = asyncio.Runner(loop_factory=loop_factory())
    loop = runner.get_loop()
    executor = CountingExecutor()
    loop.set_default_executor(executor)
    try:
        return runner.run(main)
    finally:
        tasks = _cancel_within(loop, CANCEL_GRACE_S)
        leftovers = Leftovers(tasks=len(tasks), threads=executor.running)
        if leftovers:
            leftovers = dataclasses.replace(leftovers, other_threads=other_threads(excluding=before | executor.workers))
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


def other_threads(*, excluding: Collection[threading.Thread] = ()) -> tuple[str, ...]:
    """Names of the non-daemon threads alive, sorted: not the main thread, the calling one or ``excluding``."""
    skip = {threading.main_thread(), threading.current_thread(), *excluding}
    return tuple(sorted(t.name for t in threading.enumerate() if not t.daemon and t.is_alive() and t not in skip))


def guard_exit(status: int, stuck: Callable[[tuple[str, ...]], None], grace_s: float = CANCEL_GRACE_S) -> None:
    """Bound the interpreter's coming exit: threads still alive ``grace_s`` into it are not joined.

    Call it just before the process exits as usual. A daemon thread waits ``grace_s``; if
    non-daemon threads are still alive then, the interpreter is waiting for them (it has
    told the idle workers of every ``ThreadPoolExecutor`` to end, and they have): ``stuck``
    is called with their names and the process ends with :func:`exit_now` and ``status``.
    An exit that is over by then is not touched.
    """

    def watch() -> None:
        time.sleep(grace_s)
        names = other_threads()
        if names:
            try:
                stuck(names)
            finally:
                exit_now(status)

    threading.Thread(target=watch, name="asynccoord-exit-guard", daemon=True).start()


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
