"""Commit coalescing: the plain commits a node's slots make in one turn of the event loop go to the store as one call.

A node's slots finish their sends together (a claim's batch of no-op or fast sends
returns within a loop turn or two), and each then commits its task. One store call per
commit costs a thread hop (SQLite) or a round trip (PostgreSQL) and the store's own
bookkeeping per task; the store's ``complete_many`` commits many tasks in one
transaction, each with its own compare-and-set and fence, with the same outcome per task
as ``complete``. So :class:`Commits` gathers the commits asked for during a loop turn and
sends them, at the end of it, as one ``complete_many``; each caller gets its own outcome
(the done task, or the error ``complete`` would have raised). This is group commit
(DeWitt et al., SIGMOD 1984) one level up, across the node's slots, before the store's
own group commit across callers.

A caller cancelled before its commit went out is left out of the call (nothing is written
for it); one cancelled while the call runs leaves it running, as a cancelled ``complete``
does. An error of the whole call (a busy or closed store) is each caller's error.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..errors import CoordError, InvalidArgumentError, InvalidTypeError
from ..models import Task

__all__ = ("Commits",)

_Entry = tuple[Task, Any, "tuple[str, int] | None", "asyncio.Future[Task | CoordError]"]


class Commits:
    """Coalesces one node's commits into one ``complete_many`` per event loop turn (see the module docstring).

    Args:
        store: The node's store: its ``complete_many`` is called (its ``complete`` per task
            if it has none).
    """

    __slots__ = ("_calls", "_many", "_pending", "_store")

    def __init__(self, store: Any) -> None:
        self._store = store
        self._many = getattr(store, "complete_many", None)
        self._pending: list[_Entry] = []
        self._calls: set[asyncio.Task[None]] = set()

    async def complete(self, task: Task, result: Any, fence: tuple[str, int] | None) -> Task:
        """Commit ``task`` with ``result`` (valid for the store: checked by the caller), fenced by ``fence``.

        Returns:
            The committed task, as ``store.complete`` returns it.

        Raises:
            LeaseLostError, TaskNotFoundError, FencingTokenRejectedError: as ``store.complete``.
            StoreError: the store failed (the whole call: each of its commits gets it).
        """
        if self._many is None:
            done: Task = await self._store.complete(task, result, fence=fence)
            return done
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Task | CoordError] = loop.create_future()
        if not self._pending:
            loop.call_soon(self._flush, loop)
        self._pending.append((task, result, fence, future))
        outcome = await future  # cancelled before the call: _flush leaves it out
        if isinstance(outcome, Task):
            return outcome
        raise outcome

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        """Send the commits gathered since the last flush (those whose caller still waits) as one call."""
        entries = [e for e in self._pending if not e[3].done()]
        self._pending = []
        if entries:
            call = loop.create_task(self._call(entries))
            self._calls.add(call)
            call.add_done_callback(self._calls.discard)

    async def _call(self, entries: list[_Entry]) -> None:
        tasks = [e[0] for e in entries]
        fences = None if all(e[2] is None for e in entries) else [e[2] for e in entries]
        try:
            assert self._many is not None
            outcomes = await self._many(tasks, [e[1] for e in entries], fences=fences)
        except (InvalidArgumentError, InvalidTypeError) as exc:
            if len(entries) == 1:
                _settle(entries[0][3], exc)
                return
            # One commit's bad argument refuses the whole call: each on its own, so only its own fails.
            for entry in entries:
                await self._call([entry])
            return
        except BaseException as exc:
            for entry in entries:
                _settle(entry[3], exc)
            if not isinstance(exc, Exception):
                raise
            return
        for entry, outcome in zip(entries, outcomes, strict=True):
            _settle(entry[3], outcome)


def _settle(future: asyncio.Future[Task | CoordError], outcome: Task | CoordError | BaseException) -> None:
    """Give a caller its outcome (a done task or a per-task error as a result, a failed call as its exception)."""
    if future.done():
        return
    if isinstance(outcome, Task | CoordError):
        future.set_result(outcome)
    elif isinstance(outcome, asyncio.CancelledError):
        future.cancel()
    else:
        future.set_exception(outcome)
