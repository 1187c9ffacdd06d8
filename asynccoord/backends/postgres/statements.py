"""The statement layer of the PostgreSQL store: named queries run through the retrying runner.

:class:`PgStatements` is the root of the store's queue mixins (:mod:`.heads`, :mod:`.claim`,
:mod:`.commit`, :mod:`.queue`): it runs the named queries of ``sql/*.sql`` on a
connection, hands whole operations to the :class:`~asynccoord.backends.postgres.conn.PgRunner`
(which retries a lost connection with backoff and maps driver errors at one boundary),
runs compensations of cancelled callers in the background, and queues work
notifications. The functions below tell why a compare-and-set matched nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeAlias, TypeVar

import asyncpg

from ...config import StoreConfig
from ...errors import ReadOnlyStoreError
from ...models import Task, TaskStatus
from ...notify import WorkNotifier
from ..base import StoreBase
from ..rows import lease_lost_reason
from .conn import PgListener, PgRunner, encode_notification
from .query import load_pg_queries

__all__ = ("Q", "PgStatements", "Row", "lost_reason", "settled_by_us")

T = TypeVar("T")
Q = load_pg_queries()

Row: TypeAlias = Any  # an asyncpg.Record: indexable by column position
_Row = Row


def lost_reason(row: _Row | None, task: Task) -> str | None:
    """Why a compare-and-set on ``task`` matched nothing (``row`` is the stored task); None if gone."""
    return None if row is None else lease_lost_reason(task, row[7], row[11], row[12], row[13], row[14])


def settled_by_us(row: _Row | None, task: Task, status: TaskStatus) -> bool:
    """After a retry: whether ``row`` is the state our earlier, unacknowledged write left.

    Only the lease holder moves a task from ``(running, version v)`` to ``status`` at
    version ``v + 1``: any other transition first bumps the version.
    """
    return row is not None and row[7] == status and row[14] == task.version + 1


class PgStatements(StoreBase):
    """Statement helpers of the PostgreSQL store; the root of its queue mixins.

    The store (:class:`~asynccoord.backends.postgres.store.PostgresStore`) sets the
    attributes declared here in its ``__init__``.
    """

    config: StoreConfig
    notifier: WorkNotifier
    read_only: bool
    channel: str
    _clock: Callable[[], float] | None
    _sender: str
    _runner: PgRunner
    _listener: PgListener | None
    _background: set[asyncio.Task[Any]]
    _partitions: int

    def _now(self) -> float | None:
        """The ``:now`` parameter: the test clock's time, or None for the server clock."""
        return None if self._clock is None else float(self._clock())

    async def _fetch(self, conn: asyncpg.Connection, query_name: str, /, **params: Any) -> list[_Row]:
        query = Q[query_name]
        return list(await conn.fetch(query.text, *query.args(params)))

    async def _row(self, conn: asyncpg.Connection, query_name: str, /, **params: Any) -> _Row | None:
        query = Q[query_name]
        row: _Row | None = await conn.fetchrow(query.text, *query.args(params))
        return row

    async def _val(self, conn: asyncpg.Connection, query_name: str, /, **params: Any) -> Any:
        query = Q[query_name]
        return await conn.fetchval(query.text, *query.args(params))

    async def _x(self, conn: asyncpg.Connection, query_name: str, /, **params: Any) -> None:
        query = Q[query_name]
        await conn.execute(query.text, *query.args(params))

    async def _run(self, fn: Callable[[asyncpg.Connection, int], Awaitable[T]], *, what: str, **kw: Any) -> T:
        return await self._runner.run(fn, what=what, **kw)

    def _writable(self) -> None:
        if self.read_only:
            raise ReadOnlyStoreError(f"{self!r} was opened read-only: writes are refused")
        self._runner.check_loop()  # before a write is queued for a batch of the owning loop

    def _check_writable(self) -> None:
        self._writable()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` in the background (compensations of cancelled callers); close() waits for it."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def settle_background(self, timeout_s: float = 5.0) -> bool:
        """Wait up to ``timeout_s`` for the store's background work: above all the hand-backs of
        claims whose callers were cancelled. True if none is left.

        A :class:`~asynccoord.node.runtime.Runtime` calls it as it stops, so that once its
        shutdown returns no task is still leased to its nodes; :meth:`close` waits as well.
        """
        pending = {t for t in self._background if not t.done()}
        if pending:  # asyncio.wait raises none of their errors: each task's own callback sees to those
            _, pending = await asyncio.wait(pending, timeout=timeout_s)
        return not pending

    async def _shielded(self, aw: Awaitable[T], undo: Callable[[T], Coroutine[Any, Any, Any] | None]) -> T:
        """Await ``aw`` shielded; if the caller is cancelled meanwhile, compensate its result.

        The compensation is a background task from the moment of the cancellation (not from
        when ``aw`` ends), so a :meth:`close` right after it waits for both: before, a
        claim cancelled just before the store was closed was compensated on a closed pool,
        and its tasks stayed leased until the lease lapsed.
        """

        async def held() -> T:  # a call in flight until its end, even once its caller is gone
            with self._runner.call():
                return await aw

        inner = asyncio.ensure_future(held())
        try:
            return await asyncio.shield(inner)
        except asyncio.CancelledError:

            async def compensate() -> None:
                try:
                    result = await inner
                except BaseException:  # nothing was done (or the error is the caller's, already raised)
                    return
                coro = undo(result)
                if coro is not None:
                    await coro

            self._spawn(compensate())
            raise

    async def _notify(self, conn: asyncpg.Connection, queue: str, count: int, partitions: set[int] | None) -> None:
        """Queue a work notification for other processes (delivered at commit)."""
        payload = encode_notification(self._sender, queue, count, partitions)
        await self._x(conn, "notify", channel=self.channel, payload=payload)
