"""Calls of one event loop turn joined into one operation of SQLite's group commit.

The writer (:mod:`~asynccoord.backends.sqlite.writer`) already commits every queued
operation in one transaction, but each operation still runs its own statements and costs
its own bookkeeping on both threads. Calls of one kind made in the same loop turn (the
commit-and-continue steps of a process's nodes, which finish their sends together) can
share one operation instead: their compare-and-sets in one statement, their promotions in
one pass. A :class:`TurnBatch` gathers such calls and, at the end of the turn, starts one
operation for all of them, then hands each caller its own outcome. This is the group
commit of DeWitt et al. (SIGMOD 1984) one level up, across callers, before the writer's own.

A caller cancelled before the turn ends is left out (nothing is written for it). One
cancelled while the operation runs cannot take it back: its outcome goes to the
``orphaned`` hook, which compensates it (hands back a task leased for it, say).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from ...errors import StoreClosedError

__all__ = ("TurnBatch",)

I = TypeVar("I")  # noqa: E741 - item
R = TypeVar("R")  # the operation's raw result
O = TypeVar("O")  # noqa: E741 - one item's outcome


class TurnBatch(Generic[I, R, O]):
    """Join the calls of one loop turn into one operation (see the module docstring).

    Args:
        start: Starts the operation for the turn's items; returns the future of its raw
            result (the writer's :meth:`~asynccoord.backends.sqlite.writer.GroupCommitter.enqueue`).
            An exception it raises (the store closed) is each caller's.
        finish: On the loop, turns the raw result into one outcome per item, in order.
        orphaned: Called with ``(item, outcome)`` for an item whose caller was cancelled
            while its operation ran, to compensate the outcome.
    """

    __slots__ = ("_finish", "_orphaned", "_pending", "_start")

    def __init__(
        self,
        start: Callable[[list[I]], asyncio.Future[R]],
        finish: Callable[[R, list[I]], Sequence[O]],
        orphaned: Callable[[I, O], None],
    ) -> None:
        self._start = start
        self._finish = finish
        self._orphaned = orphaned
        self._pending: list[tuple[I, asyncio.Future[O]]] = []

    async def call(self, item: I) -> O:
        """Run ``item`` with the other calls of this loop turn; its outcome.

        Raises:
            Exception: what ``start`` raised, or the operation's error (each caller's).
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[O] = loop.create_future()
        if not self._pending:
            loop.call_soon(self._flush)
        self._pending.append((item, future))
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.exception() is None:
                self._orphaned(item, future.result())  # the outcome came just as the caller was cancelled
            raise

    def _flush(self) -> None:
        entries = [e for e in self._pending if not e[1].done()]  # a caller cancelled meanwhile: left out
        self._pending = []
        if not entries:
            return
        try:
            running = self._start([item for item, _ in entries])
        except Exception as exc:
            for _, future in entries:
                future.set_exception(exc)
            return
        running.add_done_callback(lambda done: self._deliver(entries, done))

    def _deliver(self, entries: list[tuple[I, asyncio.Future[O]]], running: asyncio.Future[R]) -> None:
        error: BaseException | None
        if running.cancelled():  # (the writer never cancels it: it fails it when closing)
            error = StoreClosedError("the store closed while the call was queued")
        else:
            error = running.exception()
        outcomes: Sequence[O] = ()
        if error is None:
            try:
                outcomes = self._finish(running.result(), [item for item, _ in entries])
            except Exception as exc:
                error = exc
        if error is not None:
            for _, future in entries:
                if not future.done():
                    future.set_exception(error)
            return
        for (item, future), outcome in zip(entries, outcomes, strict=True):
            if future.done():  # its caller was cancelled while the operation ran
                self._orphaned(item, outcome)
            else:
                future.set_result(outcome)
