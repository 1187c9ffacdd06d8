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

from ..errors import CoordError, InvalidArgumentError, InvalidTypeError, StoreError
from ..models import Task

__all__ = ("Commits",)

_Entry = tuple[list[Task], list[Any], "list[tuple[str, int] | None]", "asyncio.Future[list[Task | CoordError]]"]
"""One caller's commits: its tasks, their results and fences, and the future of their outcomes."""


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
        (outcome,) = await self._gathered([task], [result], [fence])
        if isinstance(outcome, Task):
            return outcome
        raise outcome

    async def complete_many(self, tasks: list[Task], results: list[Any]) -> list[Task | CoordError]:
        """Commit ``tasks`` (unfenced) with ``results`` (valid for the store: checked by the caller).

        Returns:
            Per task, in order: the committed task, or the error ``store.complete`` would
            have raised for it (``LeaseLostError``, ``TaskNotFoundError``...).

        Raises:
            StoreError: the store failed (the whole call: each of its commits gets it).
        """
        if self._many is None:
            outcomes: list[Task | CoordError] = []
            for task, result in zip(tasks, results, strict=True):
                try:
                    outcomes.append(await self._store.complete(task, result, fence=None))
                except CoordError as exc:
                    if isinstance(exc, StoreError):
                        raise
                    outcomes.append(exc)
            return outcomes
        return await self._gathered(tasks, results, [None] * len(tasks))

    async def _gathered(
        self, tasks: list[Task], results: list[Any], fences: list[tuple[str, int] | None]
    ) -> list[Task | CoordError]:
        """Join the commits of this loop turn's call; the outcomes of these ones."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Task | CoordError]] = loop.create_future()
        if not self._pending:
            loop.call_soon(self._flush, loop)
        self._pending.append((tasks, results, fences, future))
        return await future  # cancelled before the call: _flush leaves it out

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        """Send the commits gathered since the last flush (those whose caller still waits) as one call."""
        entries = [e for e in self._pending if not e[3].done()]
        self._pending = []
        if entries:
            call = loop.create_task(self._call(entries))
            self._calls.add(call)
            call.add_done_callback(self._calls.discard)

    async def _call(self, entries: list[_Entry]) -> None:
        if len(entries) == 1:
            tasks, results, fence_list, _ = entries[0]
        else:
            tasks, results, fence_list = [], [], []
            for entry in entries:
                tasks += entry[0]
                results += entry[1]
                fence_list += entry[2]
        fences = None if all(f is None for f in fence_list) else fence_list
        try:
            assert self._many is not None
            outcomes = await self._many(tasks, results, fences=fences)
        except (InvalidArgumentError, InvalidTypeError) as exc:
            if len(tasks) == 1:
                _settle(entries[0][3], exc)
                return
            # One commit's bad argument refuses the whole call: each on its own, so only its own fails.
            for entry in entries:
                await self._call_each(entry)
            return
        except BaseException as exc:
            for entry in entries:
                _settle(entry[3], exc)
            if not isinstance(exc, Exception):
                raise
            return
        at = 0
        for entry in entries:
            count = len(entry[0])
            _settle(entry[3], outcomes[at : at + count])
            at += count

    async def _call_each(self, entry: _Entry) -> None:
        """Commit the tasks of ``entry`` one call each (after a bad argument refused them together)."""
        tasks, results, fences, future = entry
        outcomes: list[Task | CoordError] = []
        for task, result, fence in zip(tasks, results, fences, strict=True):
            single: asyncio.Future[list[Task | CoordError]] = asyncio.get_running_loop().create_future()
            await self._call([([task], [result], [fence], single)])
            if single.cancelled():
                future.cancel()
                return
            error = single.exception()
            if error is not None and not isinstance(error, InvalidArgumentError | InvalidTypeError):
                _settle(future, error)  # the store failed: the whole entry gets it
                return
            outcomes.append(single.result()[0] if error is None else error)
        _settle(future, outcomes)


def _settle(future: asyncio.Future[list[Task | CoordError]], outcome: list[Task | CoordError] | BaseException) -> None:
    """Give a caller its outcomes (per task: a done task or a per-task error), or a failed call's exception."""
    if future.done():
        return
    if isinstance(outcome, list):
        future.set_result(outcome)
    elif isinstance(outcome, asyncio.CancelledError):
        future.cancel()
    elif isinstance(outcome, InvalidArgumentError | InvalidTypeError):
        future.set_result([outcome])  # a commit of one refused for its argument: its own outcome
    else:
        future.set_exception(outcome)
