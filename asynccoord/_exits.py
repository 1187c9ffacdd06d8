"""A ``KeyboardInterrupt`` or ``SystemExit`` raised by user code, carried across asynccoord's own tasks.

asyncio lets a ``KeyboardInterrupt`` or ``SystemExit`` raised inside a task out of the event
loop at once (``Task.__step`` re-raises them): ``asyncio.run`` then cancels every task in no
order, the store's own tasks among them, while the nodes still hold claimed tasks and locks
and are trying to hand them back. So when a send (or ``lock_key``) raises one, it travels
through the node's tasks as a :class:`ProcessExiting` (a ``BaseException`` asyncio lets a
task end with), every task is handed back and every lock released on the way, and only the
caller awaiting the node or the runtime gets the original exception back.
"""

from __future__ import annotations

from types import TracebackType
from typing import NoReturn

__all__ = ("PROCESS_EXITS", "ProcessExiting", "carried_exit", "carry", "is_process_exit")

PROCESS_EXITS = (KeyboardInterrupt, SystemExit)
"""What a send (or ``lock_key``) may raise that stops the node instead of failing the task:
the process is ending. Any other exception, ``BaseException`` subclasses included (some
libraries' timeouts), is a failed attempt: re-raising it would stop every node of the
runtime on one poison task, and hand that task back with its attempt uncounted, so it
could never reach its dead letter."""


class ProcessExiting(BaseException):
    """A ``KeyboardInterrupt`` or ``SystemExit`` from user code, on its way to the caller.

    Attributes:
        exit: The original exception.
    """

    def __init__(self, exit: BaseException) -> None:
        super().__init__(exit)
        self.exit = exit
        self._traceback: TracebackType | None = exit.__traceback__

    def reraise(self) -> NoReturn:
        """Raise the original exception with the traceback it had here (raising it twice adds no frames)."""
        raise self.exit.with_traceback(self._traceback) from None


def is_process_exit(exc: BaseException) -> bool:
    """Whether ``exc`` is (or a group holding it has) a process exit, carried or not."""
    if isinstance(exc, BaseExceptionGroup):
        return any(is_process_exit(inner) for inner in exc.exceptions)
    return isinstance(exc, (*PROCESS_EXITS, ProcessExiting))


def carried_exit(exc: BaseException) -> ProcessExiting | None:
    """The first :class:`ProcessExiting` in ``exc`` (itself, or inside nested groups), if any."""
    if isinstance(exc, ProcessExiting):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = carried_exit(inner)
            if found is not None:
                return found
    return None


def carry(exc: BaseException) -> ProcessExiting:
    """``exc`` (a process exit, carried or not, or a group holding one) as a :class:`ProcessExiting`.

    A group (a send's own task group, say) stands for its first exit, as ``asyncio.TaskGroup``
    raises a child's ``KeyboardInterrupt`` or ``SystemExit`` itself: the process ends with that
    exit's status, not with a group's traceback and status 1.

    Raises:
        ValueError: ``exc`` holds no process exit.
    """
    if isinstance(exc, ProcessExiting):
        return exc
    if isinstance(exc, PROCESS_EXITS):
        return ProcessExiting(exc)
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            if is_process_exit(inner):
                return carry(inner)
    raise ValueError(f"{exc!r} holds no KeyboardInterrupt or SystemExit")
