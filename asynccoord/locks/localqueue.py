"""The queue of lock handles that wait for one name in one process, and the releases that wake it.

Handles of one store acquiring one name in this process line up first come, first served
(:class:`LocalQueues`, one per store): only the first ``permits`` of them (the heads) ask
the store, the others wait for their turn, so a busy name costs the store one polling
waiter per process, not one per task. A release made in this process
(:func:`release_and_signal`) wakes the heads at once; a lease held elsewhere is polled for
with backoff by the heads (:mod:`asynccoord.locks.handle`). The same idea as the queue of
waiters that a local ``asyncio.Lock`` keeps (FIFO wake-ups), here in front of a shared store.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import weakref
from collections import deque

from ..contract.locks import Lease, LockBusy, LockStore
from .background import keep

__all__ = ("LocalQueues", "queues_of", "release_and_signal", "release_orphan", "release_quietly")

log = logging.getLogger("asynccoord.locks.lock")  # the log lines keep the lock module's logger name


class _Ticket:
    """One acquiring handle's place in its name's local queue."""

    __slots__ = ("future", "permits")

    def __init__(self, permits: int) -> None:
        self.permits = permits
        self.future: asyncio.Future[bool] | None = None

    def wake(self) -> None:
        if self.future is not None and not self.future.done():
            self.future.set_result(True)

    async def wait(self, timeout_s: float | None) -> None:
        """Sleep until woken, or for ``timeout_s`` seconds (None: no limit)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        self.future = future
        handle = None if timeout_s is None else loop.call_later(timeout_s, _settle, future, False)
        try:
            await future
        finally:
            if handle is not None:
                handle.cancel()
            self.future = None


class _NameQueue:
    """The handles of one store acquiring one name in this process, first come first served.

    Only the first ``permits`` of them (the heads) ask the store; the others wait for
    their turn, so the holders of a name in one process take turns in arrival order
    and a busy name costs the database one polling waiter per process, not one per
    task. A release in this process wakes the heads at once; a lease held elsewhere
    is polled for with backoff.
    """

    __slots__ = ("generation", "tickets")

    def __init__(self) -> None:
        self.generation = 0  # bumped by every release of the name here, so a head sees one it missed
        self.tickets: deque[_Ticket] = deque()

    def is_head(self, ticket: _Ticket) -> bool:
        return any(t is ticket for t in itertools.islice(self.tickets, ticket.permits))

    def wake_heads(self) -> None:
        for index, ticket in enumerate(self.tickets):
            if index >= ticket.permits:
                break
            ticket.wake()


class LocalQueues:
    __slots__ = ("_names",)

    def __init__(self) -> None:
        self._names: dict[str, _NameQueue] = {}

    def join(self, name: str, permits: int) -> tuple[_NameQueue, _Ticket]:
        queue = self._names.get(name)
        if queue is None:
            queue = self._names[name] = _NameQueue()
        ticket = _Ticket(permits)
        queue.tickets.append(ticket)
        return queue, ticket

    def leave(self, name: str, queue: _NameQueue, ticket: _Ticket) -> None:
        queue.tickets.remove(ticket)
        if not queue.tickets:
            if self._names.get(name) is queue:
                del self._names[name]
        else:
            queue.wake_heads()

    def released(self, name: str) -> None:
        queue = self._names.get(name)
        if queue is not None:
            queue.generation += 1
            queue.wake_heads()


_QUEUES: weakref.WeakKeyDictionary[object, LocalQueues] = weakref.WeakKeyDictionary()


def queues_of(store: LockStore) -> LocalQueues:
    queues = _QUEUES.get(store)
    if queues is None:
        queues = _QUEUES[store] = LocalQueues()
    return queues


def _settle(future: asyncio.Future[bool], value: bool) -> None:
    if not future.done():
        future.set_result(value)


async def release_and_signal(store: LockStore, lease: Lease) -> bool:
    held = await store.release_lock(lease)
    if held:
        queues_of(store).released(lease.name)
    return held


async def release_quietly(store: LockStore, lease: Lease) -> None:
    try:
        await release_and_signal(store, lease)
    except Exception as exc:
        log.warning(
            "asynccoord.lock.lock_release_failed name=%r fencing_token=%d error=%s",
            lease.name,
            lease.fencing_token,
            exc,
        )


def release_orphan(store: LockStore, call: asyncio.Future[Lease | LockBusy]) -> None:
    """Done-callback of an attempt whose caller was cancelled: release a lease it got anyway."""
    if call.cancelled() or call.exception() is not None:
        return
    outcome = call.result()
    if isinstance(outcome, Lease):
        log.info(
            "asynccoord.lock.lock_acquire_cancelled name=%r fencing_token=%d: releasing",
            outcome.name,
            outcome.fencing_token,
        )
        keep(asyncio.ensure_future(release_quietly(store, outcome)))
