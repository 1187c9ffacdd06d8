"""A step of a command (a lifespan's entry, a store's opening) run until a stop signal comes.

``run`` and ``dashboard`` hold their stop signals while they start: each sets an
:class:`asyncio.Event` instead of ending the process. A step that may wait long (a
PostgreSQL or Redis server that accepts the connection and never answers, for its connect
timeout) is run with :func:`until_signalled`, so that a signal ends it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

__all__ = ("enter_until_signalled", "until_signalled")


async def until_signalled(
    step: Any, signalled: asyncio.Event, *, timeout_s: float | None = None
) -> tuple[asyncio.Future[Any], bool]:
    """Run the awaitable ``step`` until it ends, ``signalled`` is set, or ``timeout_s`` passes.

    Returns its future and whether it ended first. When it did not, it is cancelled and
    given a second to end: the future says how (cancelled, an exception, or a result if it
    ignored the cancellation).
    """
    doing: asyncio.Future[Any] = asyncio.ensure_future(step)
    signal_wait = asyncio.ensure_future(signalled.wait())
    try:
        await asyncio.wait({doing, signal_wait}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this command is cancelled: so is the step
        doing.cancel()
        raise
    finally:
        signal_wait.cancel()
    if doing.done():
        return doing, True
    doing.cancel()
    await asyncio.wait({doing}, timeout=1.0)
    if doing.done() and not doing.cancelled():
        doing.exception()  # retrieved: whatever it raised on its way out is not what ended it
    return doing, False


async def enter_until_signalled(
    stack: contextlib.AsyncExitStack, manager: Any, signalled: asyncio.Event
) -> tuple[bool, Any]:
    """Enter the async context manager ``manager`` on ``stack`` unless ``signalled`` is set first.

    Returns:
        ``(True, value)`` when it was entered (``value``: what its ``__aenter__`` returned; it
        is left with ``stack``, as :meth:`~contextlib.AsyncExitStack.enter_async_context`
        leaves it), ``(False, None)`` when a signal came first, or had come already: its entry
        is cancelled, and left with ``stack`` if it ended all the same.

    Raises:
        Exception: what its entry raised (a store that cannot connect, say), when no signal came first.
    """
    if signalled.is_set():
        return False, None
    entering, in_time = await until_signalled(stack.enter_async_context(manager), signalled)
    if in_time:
        return True, entering.result()  # its error, if it failed
    return False, None
