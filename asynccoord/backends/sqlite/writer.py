"""Group commit for SQLite: one writer per connection batches every caller's writes.

SQLite admits one writer at a time and a commit costs far more than the statements in
it, so each process keeps one connection and one :class:`GroupCommitter` that runs every
queued caller's operation in one ``BEGIN IMMEDIATE ... COMMIT``: the group commit of
DeWitt et al., "Implementation techniques for main memory database systems", SIGMOD 1984,
as used by every write-ahead-logging database since.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

import aiosqlite

from ...errors import ReadOnlyStoreError, StoreBusyError, StoreClosedError, StoreError
from ...sqlitebusy import is_busy, retry_busy
from .diskfull import disk_full_problem

__all__ = (
    "GroupCommitter",
    "Operation",
    "connection_thread_ended",
    "daemon_connection",
    "map_sqlite_error",
    "raw_connection",
    "retry_busy",
    "run_on_thread",
)

log = logging.getLogger(__name__)

T = TypeVar("T")
Operation = Callable[[sqlite3.Connection, float], T]
"""A write run inside the batch transaction: ``fn(db, now_s) -> result``."""

_HOP_BATCHES = 8
"""Most transactions one trip to the connection thread commits before reads get a turn."""
OUTSIDE_IDLE_S = 2.0
"""After a cancellation not asked for by ``stop()``, the writer ends once idle this long, seconds."""
OUTSIDE_MAX_S = 10.0
"""After a cancellation not asked for by ``stop()``, the writer ends this long after it at the latest, seconds."""


async def run_on_thread(conn: aiosqlite.Connection, fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(*args)`` on ``conn``'s worker thread, in one hop.

    aiosqlite exposes only statement-at-a-time coroutines publicly; a whole
    transaction as one call goes through its internal ``_execute`` (present in
    every aiosqlite release we support, pinned in pyproject and checked by a test).
    """
    execute = cast(Callable[..., Awaitable[T]], conn._execute)
    return await execute(fn, *args)


def daemon_connection(target: str, *, uri: bool = False) -> aiosqlite.Connection:
    """An unopened aiosqlite connection (autocommit) whose worker thread is a daemon.

    A store the program forgot to close must not keep the interpreter from exiting:
    committed work is durable in the WAL either way.
    """
    conn = aiosqlite.connect(target, isolation_level=None, check_same_thread=False, uri=uri)
    worker = getattr(conn, "_thread", None)
    if worker is not None and not worker.is_alive():
        worker.daemon = True
    return conn


async def connection_thread_ended(conn: aiosqlite.Connection, *, timeout_s: float = 2.0) -> None:
    """Wait (up to ``timeout_s``) until the worker thread of a connection that failed to open has ended.

    aiosqlite stops the thread of a failed connect by queueing a stop whose result the
    thread hands to the running loop: a caller that let its loop close at once (a CLI
    exiting on the error) would make the thread die with ``RuntimeError: Event loop is
    closed``, printed as a thread traceback over the one-line error.
    """
    worker = getattr(conn, "_thread", None)
    if worker is not None and worker.is_alive():
        await asyncio.to_thread(worker.join, timeout_s)


async def close_abandoned(conn: aiosqlite.Connection, *, timeout_s: float = 5.0) -> None:
    """Close ``conn`` from another event loop than the one that used it, never hanging.

    aiosqlite's thread hands each result to the loop that asked for it; when that loop
    is closed first, the thread dies with ``RuntimeError: Event loop is closed`` and a
    close queued to it would wait forever. A live thread closes the connection as usual
    (up to ``timeout_s``); otherwise the SQLite connection is closed here (opened with
    ``check_same_thread=False``), which rolls back a transaction the dead thread left open.
    """
    worker = getattr(conn, "_thread", None)
    if worker is not None and worker.is_alive():
        # The thread may be alive only until it hands its last result to the closed loop (it
        # dies then, and the close queued behind it is never run): watch it while waiting.
        # Once it is dead (or the time is up) the close is cancelled, again each round: aiosqlite's
        # close() awaits the thread's stop in a ``finally``, so one cancellation only moves it there.
        loop = asyncio.get_running_loop()
        closing = asyncio.ensure_future(conn.close())
        deadline = loop.time() + timeout_s
        while not closing.done():
            if not worker.is_alive() or loop.time() >= deadline:
                closing.cancel()
            await asyncio.wait({closing}, timeout=0.05)
        if not closing.cancelled():
            with contextlib.suppress(sqlite3.Error, ValueError):
                closing.result()
    raw: sqlite3.Connection | None = getattr(conn, "_connection", None)
    if raw is not None:  # its thread is gone (or stuck): close the connection from here
        conn._connection = None
        with contextlib.suppress(sqlite3.Error):
            raw.close()


def raw_connection(conn: aiosqlite.Connection) -> sqlite3.Connection:
    """The ``sqlite3.Connection`` behind ``conn`` (use only on its worker thread)."""
    return conn._conn


def map_sqlite_error(exc: sqlite3.Error, what: str, *, path: str | None = None) -> StoreError:
    """The package's error for a driver error (keep the original as ``__cause__``).

    ``path``: the database file, when there is one: a full disk (``SQLITE_FULL``, or an I/O
    error while its folder is out of space) is then said so, with the free bytes (see
    :func:`.diskfull.disk_full_problem`). Default None.
    """
    if isinstance(exc, sqlite3.OperationalError) and is_busy(exc):
        return StoreBusyError(f"{what}: the database stayed locked past the busy timeout ({exc})")
    if is_read_only(exc):
        return ReadOnlyStoreError(
            f"{what}: the database is read-only for this process ({exc}): give it write access to the file and "
            "its folder (SQLite writes <file>-wal and <file>-shm beside it), or open it with read_only=True"
        )
    full = None if path is None else disk_full_problem(path, exc)
    if full is not None:
        return StoreError(f"{what}: {full} ({type(exc).__name__}: {exc})")
    return StoreError(f"{what}: {type(exc).__name__}: {exc}")


def is_read_only(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` is SQLite's ``SQLITE_READONLY`` (any extended code): a write on a read-only file."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF == sqlite3.SQLITE_READONLY
    return "readonly database" in str(exc)


@dataclass(slots=True)
class _Pending(Generic[T]):
    fn: Operation[T]
    future: asyncio.Future[T]
    undo: Callable[[T], Operation[Any] | None] | None


class GroupCommitter:
    """The single writer of one aiosqlite connection.

    SQLite admits one writer at a time and a commit costs far more than the statements in
    it, so each process keeps one connection and one writer task. Callers submit an
    *operation* (a plain function run inside the transaction on the connection's thread)
    and await its future; the writer takes everything queued, runs it as one
    ``BEGIN IMMEDIATE ... COMMIT`` on aiosqlite's thread, and resolves the futures. The
    thread takes the next batch itself as soon as one commits (several batches per thread
    hop, not one hop per statement), so the event loop handles one batch's results while
    the database commits the next. The idea is the group commit
    of DeWitt et al., "Implementation techniques for main memory database systems",
    SIGMOD 1984, as used by every write-ahead-logging database since.

    Operations report expected outcomes (a lost lease, a duplicate key) as return
    values, not exceptions. If one raises, the batch is rolled back and each of its
    operations is re-run in a transaction of its own, so a faulty operation fails only
    its own caller.

    Cancellation: an operation whose caller was cancelled before the batch started is
    skipped. If the caller is cancelled while its operation commits, the result has no
    receiver; an operation may carry an ``undo`` that turns such a result into a
    compensating operation (a claim hands its tasks back, a lock acquire releases it),
    so a cancelled caller never leaves work leased or a lock held with nobody to
    release it.

    Cancellation of the writer itself: only :meth:`stop` (the store's ``close()``) and
    :meth:`abandon` (a close from another event loop) end it at once. A cancellation from
    anyone else is deferred: when a task of the program raises ``SystemExit`` or
    ``KeyboardInterrupt``, ``asyncio.run`` cancels every task left, in no order, the writer
    among them, while the nodes it also cancelled still have tasks, locks and their
    membership to hand back, and the program's ``async with`` still has the store to
    close. So the writer keeps committing until ``stop()`` ends it, or until it has been
    idle :data:`OUTSIDE_IDLE_S` (2 s), or :data:`OUTSIDE_MAX_S` (10 s) after the
    cancellation at the latest: a program that never closes its store cannot hold up
    ``asyncio.run``'s shutdown for longer. It then ends cancelled, as asked. Once it has
    ended, for whatever reason, what is queued and every later call fails at once with
    :class:`~asynccoord.errors.StoreClosedError`: no caller waits for a writer that is gone.

    Args:
        conn: An open aiosqlite connection in autocommit mode (``isolation_level=None``).
        now_sql: SQL returning the store clock in seconds (used when ``clock`` is None).
        busy_timeout_s: How long ``BEGIN IMMEDIATE`` may wait for another writer.
        max_batch_ops: Most operations per transaction.
        clock: Test hook replacing the database clock.
        path: The database file, to say when a write failed on a full disk. Default None.
    """

    def __init__(
        self,
        conn: aiosqlite.Connection,
        *,
        now_sql: str,
        busy_timeout_s: float,
        max_batch_ops: int,
        clock: Callable[[], float] | None = None,
        path: str | None = None,
    ) -> None:
        self._conn = conn
        self._path = path
        self._now_sql = now_sql
        self._busy_timeout_s = busy_timeout_s
        self._max_batch_ops = max_batch_ops
        self._clock = clock
        self._queue: deque[_Pending[Any]] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False  # stop() or abandon() called: the writer ends once the queue is empty
        self._abandoned = False  # abandon() called: the writer ends at once, failing the queue
        self._ended = False  # the writer task ended (stopped, abandoned, cut or crashed)
        self.transactions = 0
        """Transactions committed so far (for benchmarks and tests)."""
        self.writing = False
        """Whether a transaction of this writer holds the database's write lock now (set on its thread)."""

    def start(self) -> None:
        """Start the writer task on the running loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="asynccoord-sqlite-writer")

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The writer task (None before ``start`` and after ``stop``)."""
        return self._task

    async def stop(self) -> None:
        """Run what is queued, then stop the writer."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def abandon(self) -> None:
        """Stop the writer at once, failing what is queued (its store was closed from another loop).

        Call on the writer's own loop (``loop.call_soon_threadsafe(writer.abandon)`` from another thread).
        """
        self._closing = True
        self._abandoned = True
        if self._task is not None:
            self._task.cancel()

    async def submit(self, fn: Operation[T], undo: Callable[[T], Operation[Any] | None] | None = None) -> T:
        """Queue ``fn`` for the next batch and wait for its result.

        Raises:
            StoreClosedError: the writer is stopping.
            StoreError: the transaction failed (busy past the timeout, I/O error...).
            Exception: whatever ``fn`` raised when re-run alone.
        """
        future = self.enqueue(fn, undo)
        try:
            return await future
        except asyncio.CancelledError:
            # The result was delivered but this caller was cancelled before it resumed:
            # nobody receives it, so compensate as _deliver does for a cancelled future.
            if undo is not None and future.done() and not future.cancelled() and future.exception() is None:
                compensation = undo(future.result())
                if compensation is not None:
                    self.compensate(compensation)
            raise

    def enqueue(self, fn: Operation[T], undo: Callable[[T], Operation[Any] | None] | None = None) -> asyncio.Future[T]:
        """Queue ``fn`` for the next batch; its future resolves to the result (see :meth:`submit`).

        Cancelling the future before the batch starts skips ``fn``; cancelling it later
        hands the result to ``undo``.

        Raises:
            StoreClosedError: the writer is stopping.
        """
        if self._closing or self._task is None or self._ended:
            raise StoreClosedError("the store is closed" if self._closing else "the store's writer task has ended")
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(fn, future, undo))
        self._wake.set()
        return future

    def compensate(self, fn: Operation[Any]) -> None:
        """Queue ``fn``, whose result nobody waits for: it undoes a result its caller never received.

        Queued even while closing: the writer drains the queue before it stops.
        """
        self._queue.append(_Pending(fn, asyncio.get_running_loop().create_future(), None))
        self._wake.set()

    def now(self, db: sqlite3.Connection) -> float:
        """The store clock, read on the connection thread."""
        if self._clock is not None:
            return self._clock()
        row = db.execute(self._now_sql).fetchone()
        return float(row[0])

    async def _run(self) -> None:
        try:
            await self._serve()
        finally:
            self._ended = True  # from here on enqueue() refuses: nothing is left waiting for a writer gone
            self._fail_queued(StoreClosedError("the store's writer stopped before this write ran"))

    async def _serve(self) -> None:
        """Commit what is queued until stopped; a cancellation from outside ends it later (see the class)."""
        loop = asyncio.get_running_loop()
        cut_at: float | None = None  # set by a cancellation from outside: the writer ends by then
        idle_since = 0.0
        while True:
            try:
                if not self._queue:
                    if self._closing:
                        break
                    self._wake.clear()
                    if cut_at is None:
                        await self._wake.wait()
                        continue
                    remaining_s = min(cut_at, idle_since + OUTSIDE_IDLE_S) - loop.time()
                    if remaining_s <= 0:
                        break
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(remaining_s):
                            await self._wake.wait()
                    continue
                try:
                    await run_on_thread(self._conn, self._drain, loop)
                finally:
                    idle_since = loop.time()
                if cut_at is not None and loop.time() >= cut_at:
                    break
            except asyncio.CancelledError:
                if self._abandoned or (cut_at is not None and loop.time() >= cut_at):
                    raise
                # Cancelled from outside (asyncio.run ending the program, say): keep serving the
                # hand-backs that cancellation starts. A drain cut on the thread goes on there.
                current = asyncio.current_task()
                if current is not None:
                    current.uncancel()
                if cut_at is None:
                    cut_at = loop.time() + OUTSIDE_MAX_S
                idle_since = loop.time()
            except Exception as exc:  # the thread call itself failed
                self._fail_queued(exc)
        if cut_at is not None:
            raise asyncio.CancelledError  # the deferred cancellation, delivered now

    def _deliver_batch(self, batch: list[_Pending[Any]], outcomes: list[tuple[bool, Any]] | BaseException) -> None:
        """On the loop: hand one transaction's outcomes (or its failure) to the callers."""
        if isinstance(outcomes, BaseException):
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(outcomes)
            return
        for item, (ok, value) in zip(batch, outcomes, strict=True):
            self._deliver(item, ok, value)

    def _deliver(self, item: _Pending[Any], ok: bool, value: Any) -> None:
        if item.future.cancelled():
            if ok and item.undo is not None:
                compensation = item.undo(value)
                if compensation is not None:
                    self.compensate(compensation)
            return
        if ok:
            item.future.set_result(value)
        else:
            item.future.set_exception(value)

    def _fail_queued(self, error: BaseException) -> None:
        while self._queue:
            item = self._queue.popleft()
            if not item.future.done():
                item.future.set_exception(error)

    # --- on the connection thread -------------------------------------------------

    def _drain(self, loop: asyncio.AbstractEventLoop) -> None:
        """Commit what is queued, batch after batch, handing each batch's outcomes to the loop.

        Runs on the connection's thread and takes the next batch itself as soon as the
        previous one committed, so the event loop works on the results of one batch (and
        its callers queue their next operations) while the thread commits the next: the
        loop and the database overlap instead of taking turns. Returns after
        ``_HOP_BATCHES`` batches at most, so reads queued on the same thread are not held
        up behind a long stream of writes.
        """
        for _ in range(_HOP_BATCHES):
            batch: list[_Pending[Any]] = []
            while self._queue and len(batch) < self._max_batch_ops:
                item = self._queue.popleft()
                if not item.future.cancelled():
                    batch.append(item)
            if not batch:
                return
            outcomes: list[tuple[bool, Any]] | BaseException
            try:
                outcomes = self._transaction(batch)
                self.transactions += 1
            except sqlite3.Error as exc:
                outcomes = map_sqlite_error(exc, "write transaction", path=self._path)
                outcomes.__cause__ = exc
            except Exception as exc:
                outcomes = exc
            try:
                loop.call_soon_threadsafe(self._deliver_batch, batch, outcomes)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                return

    def _transaction(self, batch: list[_Pending[Any]]) -> list[tuple[bool, Any]]:
        db = raw_connection(self._conn)
        try:
            return self._run_batch(db, batch)
        except sqlite3.OperationalError as exc:
            if is_busy(exc):
                raise
            # An operation failed: isolate it by running each alone.
        except Exception:
            pass
        outcomes: list[tuple[bool, Any]] = []
        for item in batch:
            try:
                outcomes.extend(self._run_batch(db, [item]))
            except sqlite3.Error as exc:
                mapped = map_sqlite_error(exc, "write operation", path=self._path)
                mapped.__cause__ = exc
                outcomes.append((False, mapped))
            except Exception as exc:
                outcomes.append((False, exc))
        return outcomes

    def _run_batch(self, db: sqlite3.Connection, batch: list[_Pending[Any]]) -> list[tuple[bool, Any]]:
        deadline = time.monotonic() + self._busy_timeout_s
        retry_busy(lambda: db.execute("BEGIN IMMEDIATE"), deadline)
        self.writing = True
        try:
            now = self.now(db)
            results = [(True, item.fn(db, now)) for item in batch]
            retry_busy(lambda: db.execute("COMMIT"), deadline)
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        finally:
            self.writing = False
        return results
