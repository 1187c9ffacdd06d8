"""``run --lifespan MODULE:ATTR``: the send's client, opened before the nodes and closed after them.

The pattern is the lifespan of ASGI servers (a function returning an async context manager,
entered at startup, left at shutdown): the command enters it before the database opens and
leaves it after the nodes have stopped and the database has closed. The lifespan is the
application's code, so the command keeps control around it: a SIGTERM or SIGINT while it
is entered cancels the entry and ends the run, its exit is bounded by
``--shutdown-timeout-s`` (and ended by a further signal), it never sees the run's own
errors (so it cannot swallow them), and an exception it raises ends the run with exit
status 1 (after the run's own error, if one ended the run): one line on standard error
naming the exception and the line of the lifespan's module it came through
(``(at mybot/send.py:12)``), its traceback logged at DEBUG only
(``asynccoord.run.lifespan_failed``). A lifespan that ignores its
cancellation keeps the process until it returns, as a send that does.
A send that outlived the nodes' stop (it ignored its cancellation, see
:class:`~asynccoord.node.runtime.Runtime`) may still be running when the lifespan is left.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import sys
import traceback
from typing import Any

from .._errtext import error_text
from ..errors import CoordError, InvalidTypeError
from .loading import load_callable
from .untilsignal import until_signalled

__all__ = ("Lifespan", "check_lifespan", "open_lifespan", "raised_at")

log = logging.getLogger("asynccoord.cli.run")


def check_lifespan(spec: str, factory: Any) -> None:
    """Refuse what ``--lifespan`` names when it cannot give an async context manager when called with no arguments.

    Raises:
        InvalidTypeError: ``factory`` is an ``async def`` function or an async generator
            function (both need :func:`contextlib.asynccontextmanager`), or it needs arguments.
    """
    if inspect.isasyncgenfunction(factory):
        raise InvalidTypeError(
            f"--lifespan {spec!r} is an async generator function, not an async context manager function "
            "(decorate it with contextlib.asynccontextmanager)"
        )
    if inspect.iscoroutinefunction(factory):
        raise InvalidTypeError(
            f"--lifespan {spec!r} is an async function, not an async context manager function "
            "(make it an async generator that yields once, decorated with contextlib.asynccontextmanager)"
        )
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin without a signature: its call will tell
        return
    try:
        signature.bind()
    except TypeError:
        raise InvalidTypeError(f"--lifespan {spec!r} is called with no arguments, but takes {signature}") from None


def open_lifespan(spec: str) -> Lifespan:
    """The lifespan ``spec`` names, called (with no arguments) but not entered.

    Raises:
        InvalidArgumentError: the spec names nothing importable (see :func:`load_callable`).
        InvalidTypeError: see :func:`check_lifespan`; also when what it returns is no async
            context manager (a synchronous one, say).
    """
    factory = load_callable(spec)
    check_lifespan(spec, factory)
    try:
        manager = factory()
    except Exception as exc:  # the application's code (a token missing from the environment, say)
        log.debug("asynccoord.run.lifespan_failed lifespan=%r: calling it raised", spec, exc_info=exc)
        raise CoordError(f"--lifespan {spec!r} raised when called: {error_text(exc)}{raised_at(spec, exc)}") from exc
    if not (hasattr(manager, "__aenter__") and hasattr(manager, "__aexit__")):
        if inspect.iscoroutine(manager):
            manager.close()  # never awaited: no warning at its collection
        kind = "a synchronous context manager" if hasattr(manager, "__enter__") else type(manager).__name__
        raise InvalidTypeError(
            f"--lifespan {spec!r} returned {kind}, not an async context manager "
            "(decorate an async generator function with contextlib.asynccontextmanager)"
        )
    return Lifespan(spec, manager)


def raised_at(spec: str, exc: BaseException) -> str:
    """``" (at FILE:LINE)"``: the last line of the module ``spec`` names that ``exc`` came through; ``""`` if none.

    The one line a failed ``run`` writes stands in for the traceback, so it names the
    place in the application's code: the deepest frame of the lifespan's own module (the
    ``raise``, or the call into a library that raised).
    """
    module = sys.modules.get(spec.partition(":")[0])
    source = getattr(module, "__file__", None)
    if not isinstance(source, str):
        return ""
    source = os.path.realpath(source)
    try:
        frames = traceback.extract_tb(exc.__traceback__)
    except Exception:  # a traceback of frames that cannot be read: the line goes without a place
        return ""
    inside = [frame for frame in frames if os.path.realpath(frame.filename) == source]
    return f" (at {inside[-1].filename}:{inside[-1].lineno})" if inside else ""


class Lifespan:
    """One ``--lifespan`` context manager, entered and left under the command's control."""

    def __init__(self, spec: str, manager: Any) -> None:
        self.spec = spec
        self._manager = manager

    async def enter(self, signalled: asyncio.Event, *, exit_timeout_s: float) -> bool:
        """Enter it; False when ``signalled`` is set first, or was already.

        An entry that ignores the signal's cancellation and still ends within its second of
        grace is entered: it is left at once (see :meth:`exit`, given ``exit_timeout_s``), so
        that a client it opened is closed, and False is returned all the same.

        Raises:
            CoordError: the entry raised (its traceback logged at DEBUG), or leaving an
                entry that ended despite the signal failed.
        """
        if signalled.is_set():
            return False
        entering, in_time = await until_signalled(self._step("__aenter__"), signalled, timeout_s=None)
        if not in_time:
            log.warning(
                "asynccoord.run.lifespan_interrupted lifespan=%r: a signal came while it was being entered; "
                "the run ends before the database opens",
                self.spec,
            )
            if entering.done() and not entering.cancelled() and entering.exception() is None:
                await self.exit(signalled, exit_timeout_s, hurry=False)  # it ended its entry all the same
            return False
        self._raise_if_failed(entering, "entering it")
        return True

    async def exit(self, signalled: asyncio.Event, timeout_s: float, *, hurry: bool) -> None:
        """Leave it, as after a clean run: it never sees the run's own errors.

        ``hurry``: more than one signal came (the drain was cut short): ``signalled`` stays
        set, so the exit is cut short at once. Otherwise it is cleared first, and only a
        signal from now on counts.

        Raises:
            CoordError: the exit raised (its traceback logged at DEBUG), took longer
                than ``timeout_s``, or a signal set ``signalled`` meanwhile.
        """
        if not hurry:
            signalled.clear()
        exited, in_time = await until_signalled(
            self._step("__aexit__", None, None, None), signalled, timeout_s=timeout_s
        )
        if not in_time:
            why = (
                "a signal came" if signalled.is_set() else f"it took longer than --shutdown-timeout-s ({timeout_s:g} s)"
            )
            raise CoordError(f"--lifespan {self.spec!r} was cut short while exiting: {why}")
        self._raise_if_failed(exited, "exiting it")

    def _step(self, method: str, *args: Any) -> Any:
        """``self._manager.<method>(*args)``, which must give an awaitable.

        Raises:
            InvalidTypeError: it gave something else (a synchronous ``__aexit__``, say).
            CoordError: calling it raised.
        """
        try:
            step = getattr(self._manager, method)(*args)
        except Exception as exc:
            log.debug("asynccoord.run.lifespan_failed lifespan=%r: %s raised", self.spec, method, exc_info=exc)
            where = raised_at(self.spec, exc)
            raise CoordError(f"--lifespan {self.spec!r}: its {method} raised: {error_text(exc)}{where}") from exc
        if not inspect.isawaitable(step):
            raise InvalidTypeError(
                f"--lifespan {self.spec!r}: its {method} returned {type(step).__name__}, not an awaitable "
                "(define it with async def)"
            )
        return step

    def _raise_if_failed(self, done: asyncio.Future[Any], doing: str) -> None:
        if done.cancelled():
            raise CoordError(f"--lifespan {self.spec!r} was cancelled {doing}")
        exc = done.exception()
        if exc is None:
            return
        log.debug("asynccoord.run.lifespan_failed lifespan=%r: it raised %s", self.spec, doing, exc_info=exc)
        raise CoordError(
            f"--lifespan {self.spec!r} raised {doing}: {error_text(exc)}{raised_at(self.spec, exc)}"
        ) from exc
