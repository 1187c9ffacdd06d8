"""The connection of :class:`~asynccoord.backends.redis.RedisLockStore`: open, close, and each call's retries.

:class:`RedisConnection` is a mixin of the store. It connects a redis-py client with a
blocking pool, registers the scripts (:mod:`asynccoord.backends.redisscripts`) and reads
whether the server persists its writes; it closes after the calls in flight. Each call runs
through :meth:`RedisConnection._retrying`, which retries a lost connection (and a ``BUSY``
server) with exponential backoff and jitter (M. Brooker, "Exponential backoff and jitter",
AWS Architecture Blog, 2015) up to ``reconnect_timeout_s``, and maps redis-py's errors to the
package's at this one boundary, the original kept as ``__cause__``. A store serves the event
loop that opened it only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Self, TypeVar

import redis.asyncio as aioredis
import redis.exceptions as rerr

from .. import events as ev
from ..errors import (
    StoreAlreadyOpenError,
    StoreBusyError,
    StoreClosedError,
    StoreConnectionError,
    StoreError,
    StoreLoopError,
)
from ..events import EventCounter
from ..reach import Reach
from .batch import Batcher
from .calls import CLOSE_WAIT_S, CallGate
from .opening import single_open
from .redisdurability import NO_PERSISTENCE, losses, persistence
from .redisscripts import SCRIPTS
from .targets import redact_location

__all__ = ("RedisConnection",)

log = logging.getLogger("asynccoord.backends.redis")  # the log lines keep the store module's logger name

T = TypeVar("T")


_CONNECTION_ERRORS = (rerr.ConnectionError, rerr.TimeoutError, OSError, asyncio.TimeoutError)


def _busy_with_script(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis's ``BUSY`` reply: a script (or function) has run past
    ``busy-reply-threshold`` (``lua-time-limit``, 5 s by default) and the server runs no
    other command until it ends or is killed. redis-py has no class of its own for it."""
    return isinstance(exc, rerr.ResponseError) and str(exc).startswith("BUSY ")


def _raise_if_cancelled(task: asyncio.Task[Any] | None, cancels: int, what: str, cause: BaseException | None) -> None:
    """Raise ``CancelledError`` if ``task`` was asked to cancel since it had ``cancels`` requests pending."""
    if task is not None and task.cancelling() > cancels:
        raise asyncio.CancelledError(f"{what} was cancelled") from cause


def _map_error(exc: BaseException, what: str) -> StoreError:
    """The package's error for a redis-py error (raise it ``from exc``)."""
    text = f"{what}: {type(exc).__name__}: {exc}"
    if isinstance(exc, rerr.AuthenticationError):  # a ConnectionError to redis-py: the server did answer
        return StoreConnectionError(f"{text} (Redis refused the URL's credentials: check its user name and password)")
    if isinstance(exc, _CONNECTION_ERRORS):
        return StoreConnectionError(f"{text} (the connection to Redis was lost or refused, or it did not answer)")
    if isinstance(exc, rerr.BusyLoadingError) or _busy_with_script(exc):
        return StoreBusyError(text)
    return StoreError(text)


class RedisConnection:
    """The life cycle and the calls of a :class:`~asynccoord.backends.redis.RedisLockStore` (see the module).

    A mixin: the store's ``__init__`` sets what is declared here.
    """

    url: str
    events: EventCounter
    reach: Reach
    reconnect_timeout_s: float
    max_connections: int
    persistent: bool | None
    _client: aioredis.Redis | None
    _loop: asyncio.AbstractEventLoop | None
    _scripts: dict[str, Any]
    _background: set[asyncio.Task[Any]]
    _gate: CallGate
    _acquirer: Batcher[Any, Any]  # the acquisitions waiting for a batch: flushed by close()

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @single_open
    async def open(self) -> None:
        """Connect, load the scripts and read whether the server persists its data.

        A server without an append-only file (``appendonly no``) is logged at WARNING as
        ``asynccoord.redis.no_persistence``, whether it keeps RDB snapshots or nothing: its
        restart would set the fencing counters back (see :class:`RedisLockStore`).
        :attr:`persistent` holds the answer. A store closed again may be opened again.

        Raises:
            StoreConnectionError: the server cannot be reached.
            StoreAlreadyOpenError: the store is open already; it stays open.
        """
        if self._client is not None:
            self._check_loop()  # open, but for another loop: StoreLoopError
            raise StoreAlreadyOpenError.of(self)
        wait_s = self.reconnect_timeout_s  # also each reply's: a server that never answers fails the attempt
        timeouts = {"timeout": wait_s, "socket_connect_timeout": 5.0, "socket_timeout": wait_s}
        pool = aioredis.BlockingConnectionPool.from_url(self.url, max_connections=self.max_connections, **timeouts)
        client = aioredis.Redis.from_pool(pool)  # the client owns the pool: aclose() closes both
        try:
            await client.ping()
        except BaseException as exc:
            await client.aclose()
            if not isinstance(exc, rerr.RedisError | OSError):
                raise
            raise _map_error(exc, f"cannot connect to {self!r}") from exc
        self._scripts = {name: client.register_script(source) for name, source in SCRIPTS.items()}
        self._client = client
        self._loop = asyncio.get_running_loop()
        self._gate.forget_calls()  # those of a loop closed mid-call never end
        self.persistent, kept, save = await persistence(client)
        if self.persistent is False:
            log.warning(NO_PERSISTENCE, redact_location(self.url), save, losses(kept))

    async def close(self) -> None:
        """Let the calls in flight finish, wait for background releases (bounded), then close. Idempotent.

        From the moment ``close()`` is called, a new call raises
        :class:`~asynccoord.errors.StoreClosedError`, but a hand-back (``release_lock``) is
        let through. The calls in flight, queued acquisitions included, and the hand-backs
        their ends start (the release of a lease granted to a ``Lock`` caller cancelled
        just before the close, say) are waited for, up to 10 s, and the background releases
        up to 5 s: no lease is left held until its TTL with nobody to release it.

        Called from another event loop than ``open()``'s, it closes the client in that
        loop if it still runs (up to 5 s), and otherwise only drops it: its connections
        belong to that loop, and their sockets go when its transports are collected.
        """
        if self._client is not None and self._loop is not asyncio.get_running_loop():
            abandoned, owner = self._client, self._loop
            self._client = None
            self._scripts = {}
            self._gate.forget_calls()
            if owner is not None and owner.is_running() and not owner.is_closed():
                with contextlib.suppress(Exception):
                    done = asyncio.run_coroutine_threadsafe(abandoned.aclose(), owner)
                    await asyncio.wait_for(asyncio.wrap_future(done), 5.0)
            return
        self._gate.closing = True
        try:
            if not await self._gate.settle(CLOSE_WAIT_S):
                log.warning("asynccoord.redis.close_cut_calls calls=%d", self._gate.calls)
            await self._acquirer.flush()
            if self._background:
                with contextlib.suppress(Exception):
                    await asyncio.wait(set(self._background), timeout=5.0)
            await self._gate.settle(CLOSE_WAIT_S)  # hand-backs started meanwhile
            client, self._client = self._client, None
            if client is not None:
                await client.aclose()
        finally:
            self._gate.closing = False

    def _check_loop(self) -> None:
        if self._loop is not asyncio.get_running_loop():
            raise StoreLoopError(
                f"{self!r} was opened in another event loop (another asyncio.run, thread or test loop) and"
                " serves that loop only: open a lock store in the loop that uses it"
            )

    async def _call(self, fn: Callable[[aioredis.Redis], Awaitable[T]], what: str) -> T:
        """Run ``fn(client)`` as a store call in flight (waited for by :meth:`close`); see :meth:`_retrying`."""
        with self._gate.call(), self.reach.call():
            return await self._retrying(fn, what)

    async def _retrying(self, fn: Callable[[aioredis.Redis], Awaitable[T]], what: str) -> T:
        """Run ``fn(client)``, retrying a lost connection with backoff; map errors at this one boundary.

        A ``BUSY`` reply (a script running past ``busy-reply-threshold``: the command was not
        run) is retried the same way, and recorded in :attr:`reach` as a failed attempt, not
        an answer: the server does no work for anyone until the script ends.

        A cancellation of the calling task that redis-py turned into an error (it drops the
        connection of an interrupted command) or swallowed is raised again here as
        ``CancelledError``: without that, a caller that is being stopped would retry, or go
        on with the result, and never end.
        """
        deadline = time.monotonic() + self.reconnect_timeout_s
        delay_s = 0.02
        task = asyncio.current_task()
        cancels = 0 if task is None else task.cancelling()
        while True:
            client = self._client
            if client is None:
                raise StoreClosedError(f"{self!r} is not open: use 'async with' or await open()")
            self._check_loop()
            try:
                result = await fn(client)
            except (*_CONNECTION_ERRORS, rerr.RedisError) as exc:
                _raise_if_cancelled(task, cancels, what, exc)
                if not (isinstance(exc, _CONNECTION_ERRORS) or _busy_with_script(exc)):
                    self.reach.answered()  # the server replied, with an error
                    raise _map_error(exc, what) from exc
                self.reach.failed(exc)
                if time.monotonic() + delay_s > self._gate.retry_deadline(deadline):
                    raise _map_error(exc, what) from exc
                self.events.add(ev.STORE_RETRIES)
                log.info("asynccoord.redis.retry what=%s error=%s", what, exc)
            else:
                self.reach.answered()
                _raise_if_cancelled(task, cancels, what, None)
                return result
            await asyncio.sleep(delay_s * random.uniform(0.5, 1.5))
            delay_s = min(delay_s * 2, 1.0)

    async def _script(self, name: str, keys: Sequence[str], args: Sequence[str | int | float], what: str) -> Any:
        script = self._scripts[name]

        async def run(client: aioredis.Redis) -> Any:
            return await script(keys=list(keys), args=list(args), client=client)

        return await self._call(run, what)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
