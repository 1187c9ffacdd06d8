"""Release signals: wake the waiters of a lock the moment its holder gives it back.

A waiter for a taken lock polls it with backoff, and between two polls the lock can sit
free. A store that knows when a lease is released (its own ``release_lock``, or a peer's
announcement over a cross-process channel) calls :meth:`ReleaseSignal.released`, and each
:class:`ReleaseWatch` armed on that name wakes at once; the poll stays as the fallback for
releases nobody announces (a lapsed lease, a store without a channel). This is the
wait-queue half of a fair lock (Redisson's ``RLock`` subscribes to an unlock channel for the
same reason) with the store as the broker.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from .validation import check_name, check_non_negative

__all__ = ("ReleaseSignal", "ReleaseWatch")


class ReleaseWatch:
    """One waiter's watch on one lock name (from :meth:`ReleaseSignal.watch`; close it when done).

    A release that comes between two waits is kept as a flag, so the waiter arms the watch,
    tries the lock, and waits: a release right after a failed attempt is not missed.
    """

    __slots__ = ("_future", "_signal", "fired", "name")

    def __init__(self, signal: ReleaseSignal, name: str) -> None:
        self._signal = signal
        self.name = name
        self.fired = False
        self._future: asyncio.Future[None] | None = None

    def __repr__(self) -> str:
        return f"<ReleaseWatch name={self.name!r} fired={self.fired}>"

    def _fire(self) -> None:
        self.fired = True
        future = self._future
        if future is not None and not future.done():
            future.set_result(None)

    async def wait(self, timeout_s: float) -> bool:
        """Wait until the lock is released or ``timeout_s`` seconds pass; True when released.

        A release seen since the last wait returns True at once. The flag is cleared either way.
        """
        check_non_negative("timeout_s", timeout_s)
        if not self.fired and timeout_s > 0:
            future = self._future = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(timeout_s):
                    await future
            except TimeoutError:
                pass
            finally:
                self._future = None
        fired, self.fired = self.fired, False
        return fired

    def close(self) -> None:
        """Stop watching (idempotent); a wait under way returns False."""
        watches = self._signal._watches.get(self.name)
        if watches is not None:
            watches.pop(self, None)
            if not watches:
                del self._signal._watches[self.name]
        future = self._future
        if future is not None and not future.done():
            future.set_result(None)  # ends the wait, not its task: a cancellation is the caller's own


class ReleaseSignal:
    """The release announcements of one store: local watches, and a hook that carries them to other processes.

    ``announce`` (set by a store with a cross-process channel) is called with each name
    :meth:`released` here; :meth:`deliver` takes a peer's announcement and wakes local
    watches only, so nothing is sent back.
    """

    __slots__ = ("_watches", "announce")

    def __init__(self) -> None:
        self._watches: dict[str, dict[ReleaseWatch, None]] = {}
        self.announce: Callable[[str], None] | None = None

    def watch(self, name: str) -> ReleaseWatch:
        """A watch on lock ``name`` (checked as a name), armed from now on."""
        check_name("name", name)
        watch = ReleaseWatch(self, name)
        self._watches.setdefault(name, {})[watch] = None
        return watch

    def released(self, name: str) -> None:
        """A lease of ``name`` was given back by this process: wake its watches here and tell the peers."""
        self.deliver(name)
        announce = self.announce
        if announce is not None:
            with contextlib.suppress(Exception):  # a failed announcement costs only a poll's wait
                announce(name)

    def deliver(self, name: str) -> None:
        """A lease of ``name`` was given back (here or by a peer): wake every watch on it."""
        for watch in list(self._watches.get(name, ())):
            watch._fire()

    def watching(self, name: str) -> int:
        """How many watches are on ``name`` now."""
        return len(self._watches.get(name, ()))
