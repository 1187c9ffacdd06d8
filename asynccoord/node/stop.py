"""A wait before a send that a node's stop (a shutdown) cuts short.

Once a node stops claiming, a claimed task whose send has not begun is handed back unsent
(``FlightState.STOPPED``, see :meth:`~asynccoord.node.send.Sender.start`). A wait on the way
to the send, such as the lock pacer's (:mod:`asynccoord.locks.pacing`), must then end at
once rather than hold the shutdown until the drain's deadline. :func:`until_stopped` races
the wait against the node's stop event, as ``asyncio.wait(..., FIRST_COMPLETED)`` races two
futures, and cancels the loser.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

__all__ = ("until_stopped",)


async def until_stopped(wait: Coroutine[Any, Any, Any], stopped: asyncio.Event) -> bool:
    """Run ``wait`` until it is over or ``stopped`` is set, whichever comes first; True if it was over.

    A wait cut by the stop is cancelled and awaited (it must take nothing on cancellation,
    as the pacer takes no token before its wait ends). A cancellation of the caller cancels
    the wait too, and goes on.

    Raises:
        Exception: what ``wait`` raised.
    """
    if stopped.is_set():
        wait.close()
        return False
    waiting = asyncio.ensure_future(wait)
    stop = asyncio.ensure_future(stopped.wait())
    try:
        await asyncio.wait((waiting, stop), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        if not waiting.done():
            waiting.cancel()
            await asyncio.wait((waiting,))  # raises nothing of its own: a cancellation of ours goes on
    if waiting.cancelled():
        return False
    waiting.result()  # its error, if any
    return True
