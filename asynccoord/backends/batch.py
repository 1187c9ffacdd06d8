"""Group commit for the client-server stores: concurrent calls of a process share one round trip.

A :class:`Batcher` queues the concurrent calls of a process's nodes and sends them to the
server together, one batch at a time, after the group commit of DeWitt et al.,
"Implementation techniques for main memory database systems", SIGMOD 1984.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

from ..errors import StoreClosedError

__all__ = ("Batcher",)

log = logging.getLogger(__name__)

I = TypeVar("I")  # noqa: E741 - item
O = TypeVar("O")  # noqa: E741 - outcome


class Batcher(Generic[I, O]):
    """Run queued items in batches with ``run(items) -> outcomes`` (same order, same length).

    Many nodes of a process complete tasks and take locks at the same time; one
    transaction (or one statement) per call would cost a round trip and a WAL flush each.
    A :class:`Batcher` queues the calls: the first one starts a drain task, and while its
    batch is at the server, later calls queue up and go together in the next batch (at
    most ``max_batch`` each). The idea is the group commit of DeWitt et al.,
    "Implementation techniques for main memory database systems", SIGMOD 1984.

    A caller gets a future and awaits it. If the caller is cancelled, its future is cancelled
    but its item stays queued and its batch goes on (a commit cannot be taken back); the
    outcome of an item whose future was cancelled goes to the batcher's ``orphaned`` hook,
    which may compensate it (hand back a task the call leased, say).

    Args:
        run: Runs one batch; an exception fails every caller of the batch.
        max_batch: Most items per batch (>= 1).
        key: Items with equal keys never share a batch (the later one waits for the next);
            None to allow anything together.
        name: Name of the drain task.
        orphaned: Called with ``(item, outcome)`` for each item run whose future was
            cancelled meanwhile (its caller is gone), to compensate the outcome; an
            exception it raises is logged. None: such outcomes are dropped.
    """

    def __init__(
        self,
        run: Callable[[Sequence[I]], Awaitable[Sequence[O]]],
        max_batch: int,
        *,
        key: Callable[[I], Hashable] | None = None,
        name: str = "asynccoord-batch",
        orphaned: Callable[[I, O], None] | None = None,
    ) -> None:
        self._run = run
        self._orphaned = orphaned
        self._max_batch = max(1, max_batch)
        self._key = key
        self._name = name
        self._waiting: list[tuple[I, asyncio.Future[O]]] = []
        self._drainer: asyncio.Task[None] | None = None
        self.batches = 0

    def submit(self, item: I) -> asyncio.Future[O]:
        """Queue ``item``; the future resolves to its outcome (or the batch's exception).

        Cancelling the future does not take the item back: it runs, and its outcome goes
        to the ``orphaned`` hook.
        """
        future: asyncio.Future[O] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain(), name=self._name)
        return future

    @property
    def idle(self) -> bool:
        """Whether nothing is queued or running (the batcher can be dropped)."""
        return not self._waiting and (self._drainer is None or self._drainer.done())

    async def flush(self) -> None:
        """Wait until everything submitted so far has run."""
        drainer = self._drainer
        if drainer is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(drainer)

    def _take(self) -> list[tuple[I, asyncio.Future[O]]]:
        if self._key is None:
            batch = self._waiting[: self._max_batch]
            del self._waiting[: self._max_batch]
            return batch
        batch, later, seen = [], [], set()
        for entry in self._waiting:
            k = self._key(entry[0])
            if len(batch) >= self._max_batch or k in seen:
                later.append(entry)
            else:
                seen.add(k)
                batch.append(entry)
        self._waiting = later
        return batch

    async def _drain(self) -> None:
        while self._waiting:
            batch = self._take()
            try:
                outcomes = await self._run([item for item, _ in batch])
            except asyncio.CancelledError:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(StoreClosedError("the store closed while the call was queued"))
                raise
            except Exception as exc:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            self.batches += 1
            for (item, future), outcome in zip(batch, outcomes, strict=True):
                if not future.done():
                    future.set_result(outcome)
                elif future.cancelled() and self._orphaned is not None:
                    try:
                        self._orphaned(item, outcome)
                    except Exception:
                        log.exception("asynccoord.batch.orphaned_failed batcher=%s", self._name)
