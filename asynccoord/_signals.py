"""Signal handlers shared by everything in the process that waits for a signal on the running loop.

:meth:`asynccoord.node.runtime.Runtime.wait_for_signal` and ``python -m asynccoord run`` take
SIGTERM and SIGINT through :func:`take_signal`: one loop handler per signal calls every
waiter, and the last waiter to leave (:func:`give_back_signal`) puts back the handler the
signal had before, so handlers handed from one waiter to the next never leave a moment
with none.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Sequence
from typing import Any

from .errors import InvalidArgumentError, InvalidTypeError

__all__ = ("check_signals", "give_back_signal", "signal_name", "take_signal")

log = logging.getLogger("asynccoord.node.runtime")  # the log lines keep the runtime's logger name


_SignalEntry = tuple[asyncio.AbstractEventLoop, Any, list[Callable[[int], None]]]
_SIGNAL_WAITERS: dict[int, _SignalEntry] = {}
"""Signal -> (the loop handling it, its handler before, the waiting runtimes' callbacks): one
loop handler per signal for every :meth:`Runtime.wait_for_signal` waiting in the process."""


def check_signals(signals: Sequence[int]) -> list[int]:
    """``signals`` as distinct signal numbers, checked before any handler is touched."""
    if isinstance(signals, str | bytes) or not isinstance(signals, Sequence):
        raise InvalidTypeError(f"signals must be a sequence of signal numbers, got {type(signals).__name__}")
    checked: list[int] = []
    for signum in signals:
        if isinstance(signum, bool) or not isinstance(signum, int):
            raise InvalidTypeError(f"signals must hold signal numbers (int), got {signum!r}")
        if signum not in signal.valid_signals():
            raise InvalidArgumentError(f"signals holds {signum!r}, not a signal number of this platform")
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            raise InvalidArgumentError(f"signals holds {signal_name(signum)}, which cannot be handled")
        if signum not in checked:
            checked.append(signum)
    return checked


def take_signal(loop: asyncio.AbstractEventLoop, signum: int, callback: Callable[[int], None]) -> bool:
    """Have ``callback(signum)`` called on ``signum`` (sharing the handler of a runtime waiting already).

    False (and nothing changed) off the main thread, when the loop cannot handle signals, or when the signal
    already has a handler of the running loop that is not a waiting runtime's (the
    application's own ``loop.add_signal_handler``), which is left alone.
    """
    if threading.current_thread() is not threading.main_thread():
        return False  # only the main thread may handle signals
    entry = _SIGNAL_WAITERS.get(signum)
    if entry is not None and entry[0] is loop and not loop.is_closed():
        entry[2].append(callback)  # another runtime waits for it already: one handler calls both
        return True
    before = signal.getsignal(signum)
    owner = getattr(before, "__self__", None)
    if isinstance(owner, asyncio.AbstractEventLoop) and owner.is_closed():
        # A closed loop's stub (uvloop leaves it): nothing would run behind it. Python's default instead.
        before = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
    if handled_by(loop, signum, before):
        log.warning(
            "asynccoord.runtime.signal_left signal=%s: the event loop already has a handler for it, which keeps it"
            " (call runtime.shutdown() from that handler)",
            signal_name(signum),
        )
        return False
    callbacks = [callback]

    def dispatch() -> None:
        for waiting in list(callbacks):
            waiting(signum)

    try:
        loop.add_signal_handler(signum, dispatch)
    except (NotImplementedError, RuntimeError):  # Windows, or a loop without signal support
        return False
    _SIGNAL_WAITERS[signum] = (loop, before, callbacks)
    return True


def give_back_signal(loop: asyncio.AbstractEventLoop, signum: int, callback: Callable[[int], None]) -> None:
    """Undo :func:`take_signal`: the last runtime to stop waiting puts back the handler from before."""
    entry = _SIGNAL_WAITERS.get(signum)
    if entry is None or entry[0] is not loop:
        return
    _loop, before, callbacks = entry
    with contextlib.suppress(ValueError):
        callbacks.remove(callback)
    if callbacks:
        return
    del _SIGNAL_WAITERS[signum]
    with contextlib.suppress(RuntimeError):  # the loop is closing
        loop.remove_signal_handler(signum)  # leaves SIG_DFL (SIGINT: default_int_handler)
    if before is not None:
        signal.signal(signum, before)


def handled_by(loop: asyncio.AbstractEventLoop, signum: int, handler: Any) -> bool:
    """Whether ``handler`` (from ``signal.getsignal``) is the running ``loop``'s ``add_signal_handler`` stub.

    uvloop's stub is a method of the loop (a closed loop's stub, which uvloop leaves in
    place, does not count: nothing would ever run the callback behind it); asyncio's is
    the module function ``asyncio.unix_events._sighandler_noop``, which counts while the
    loop's own table holds the signal (asyncio removes its stubs when a loop closes). The
    application's callback sits in the loop's table, out of reach of any public API.
    """
    owner = getattr(handler, "__self__", None)
    if isinstance(owner, asyncio.AbstractEventLoop):
        return owner is loop and not loop.is_closed()
    if getattr(handler, "__module__", None) != "asyncio.unix_events":
        return False
    table = getattr(loop, "_signal_handlers", None)  # asyncio's own loops only; uvloop has none
    return table is not None and signum in table  # else a stub no running loop will ever act on


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)
