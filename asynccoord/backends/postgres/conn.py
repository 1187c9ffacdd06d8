"""The asyncpg boundary of the PostgreSQL store: error mapping, retries, notifications.

Every statement of :class:`~asynccoord.backends.postgres.store.PostgresStore` runs through
:class:`PgRunner`, the one place where driver exceptions become the package's
:class:`~asynccoord.errors.StoreError` subclasses (the driver's exception kept as
``__cause__``), after retries with exponential backoff and jitter; :class:`PgListener`
carries LISTEN/NOTIFY wake-ups between processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any, TypeVar

import asyncpg
import asyncpg.exceptions as pgerr

from ...errors import StoreBusyError, StoreClosedError, StoreConnectionError, StoreError, StoreLoopError
from ...notify import WorkNotifier
from ...pauses import PauseBook
from ...releases import ReleaseSignal
from ...validation import check_int, check_name, check_non_negative, check_partitions
from ..calls import CallGate

__all__ = (
    "MAX_NOTIFY_PARTITIONS",
    "Connector",
    "PgListener",
    "PgRunner",
    "encode_notification",
    "encode_release",
    "is_connection_error",
    "map_pg_error",
)

log = logging.getLogger(__name__)

T = TypeVar("T")

TxFn = Callable[[asyncpg.Connection, int], Awaitable[T]]
"""A unit of work: ``fn(connection, attempt)``; ``attempt`` is 0 the first time."""

MAX_NOTIFY_PARTITIONS = 512
"""Most partitions named in one notification (more: the notification names none, waking any)."""

_LISTEN_RETRY_MIN_S = 0.1
"""The listener's first delay before it connects again, seconds (jittered by 0.5..1.5)."""
_LISTEN_RETRY_MAX_S = 5.0
"""The listener's longest delay between two connections, seconds (before jitter)."""
_LISTEN_STABLE_S = 5.0
"""A LISTEN connection that stayed up this long (seconds) resets the listener's delay."""

_RETRYABLE_UNIQUE = frozenset({"coord_tasks_one_head", "coord_lock_holders_slot", "coord_task_keys_pkey"})
_CONNECTION_STATES = ("08", "57P01", "57P02", "57P03")


def is_connection_error(exc: BaseException) -> bool:
    """Whether ``exc`` means the connection is gone (or could not be made)."""
    if isinstance(exc, pgerr.PostgresConnectionError | pgerr.ConnectionDoesNotExistError):
        return True
    if isinstance(exc, pgerr.PostgresError):
        state = getattr(exc, "sqlstate", "") or ""
        return state.startswith(_CONNECTION_STATES)
    if isinstance(exc, pgerr.InternalClientError):  # the protocol state broke with the connection
        return True
    if isinstance(exc, pgerr.InterfaceError):
        return "closed" in str(exc) or "connection" in str(exc).lower()
    return isinstance(exc, OSError | ConnectionError | asyncio.TimeoutError)


def _is_conflict(exc: BaseException) -> bool:
    if isinstance(exc, pgerr.SerializationError | pgerr.DeadlockDetectedError):
        return True
    if isinstance(exc, pgerr.UniqueViolationError):
        return getattr(exc, "constraint_name", None) in _RETRYABLE_UNIQUE
    return False


def _from_server(exc: BaseException) -> bool:
    """Whether ``exc`` is an error the server reported (asyncpg raises some of its own client-side
    errors, such as an argument it cannot encode, as :class:`asyncpg.DataError` too; only the
    server's carry a ``severity``)."""
    return isinstance(exc, pgerr.PostgresError) and bool(getattr(exc, "severity", None))


def map_pg_error(exc: BaseException, what: str) -> StoreError:
    """The package's error for a driver error (raise it ``from exc`` to keep the cause)."""
    text = f"{what}: {type(exc).__name__}: {exc}"
    if isinstance(exc, TimeoutError) and not str(exc):  # asyncpg's connect timeout says nothing more
        return StoreConnectionError(
            f"{what}: timed out: the server did not answer within the connect timeout (connect_timeout in the "
            "DSN, 10 s by default)"
        )
    if is_connection_error(exc):
        return StoreConnectionError(f"{text} (the connection to PostgreSQL was lost or refused)")
    if _is_conflict(exc) or isinstance(exc, pgerr.LockNotAvailableError | pgerr.QueryCanceledError):
        return StoreBusyError(text)
    return StoreError(text)


_DRIVER_ERRORS = (
    pgerr.PostgresError,
    pgerr.InterfaceError,
    pgerr.InternalClientError,
    OSError,
    ConnectionError,
    asyncio.TimeoutError,
)


class Connector:
    """Opens the store's connections; an attempt runs to its end even when its caller is cancelled.

    asyncpg (0.32) leaves an exception nobody retrieves, logged through the loop as "Future
    exception was never retrieved ... ConnectionError('unexpected connection_lost() call')",
    when a connection attempt is cancelled while it negotiates SSL (``sslmode=prefer``, its
    default): MagicStack/asyncpg#1211 and #1310. A store call cancelled while the pool opens
    it a connection, or a listener stopped while it reconnects, did that. Here the attempt runs
    in a task of its own, bounded by the connect timeout: the cancelled caller gets its
    ``CancelledError`` at once, and the connection, if the attempt makes one, is closed.
    :meth:`settle` (at the store's close) waits for such attempts.
    """

    def __init__(self) -> None:
        self._abandoned: set[asyncio.Task[asyncpg.Connection]] = set()

    async def connect(self, *args: Any, **kwargs: Any) -> asyncpg.Connection:
        """``asyncpg.connect(*args, **kwargs)``, not cut short by the caller's cancellation."""
        attempt = asyncio.ensure_future(asyncpg.connect(*args, **kwargs))
        try:
            return await asyncio.shield(attempt)
        except asyncio.CancelledError:
            self._abandoned.add(attempt)
            attempt.add_done_callback(self._close_abandoned)
            raise

    def _close_abandoned(self, attempt: asyncio.Task[asyncpg.Connection]) -> None:
        self._abandoned.discard(attempt)
        if not attempt.cancelled() and attempt.exception() is None:
            attempt.result().terminate()

    async def settle(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` seconds for abandoned attempts to end, then cancel the rest."""
        if not self._abandoned:
            return
        _done, pending = await asyncio.wait(set(self._abandoned), timeout=timeout_s)
        for attempt in pending:
            attempt.cancel()


class PgRunner(CallGate):
    """Runs units of work on a pool, retrying, and maps the driver's errors.

    Errors map to connection loss (server restart, ``pg_terminate_backend``, network) ->
    :class:`~asynccoord.errors.StoreConnectionError`; serialization failures, deadlocks,
    lock and statement timeouts -> :class:`~asynccoord.errors.StoreBusyError`; anything
    else -> :class:`~asynccoord.errors.StoreError`.

    Before mapping, the runner retries with exponential backoff and jitter for up to
    ``reconnect_timeout_s`` after the call's first failure (not its start: a call whose
    process was frozen past that time, its connection ended meanwhile, still retries). A
    conflict (serialization failure, deadlock, a race on a unique index) and a connection
    lost before the transaction's COMMIT was sent are always retried, since nothing was
    written. A connection lost during the COMMIT (or a
    single autocommit statement) leaves the outcome unknown: the operation is retried only
    when it says it is safe (``ambiguous_ok``), and it is told the attempt number so it
    can recognize its own earlier success (a compare-and-set that already went through).

    Every :meth:`run` is a store call, or a step of one (:meth:`call`, the runner being the
    store's :class:`~asynccoord.backends.calls.CallGate`): the store's ``close()`` sets
    :attr:`closing`, which refuses new calls but hand-backs, and waits for those in flight
    (:meth:`wait_calls`, :meth:`settle`) before it closes the pool, so that no call loses
    its connection, or its answer, to the close.

    Args:
        reconnect_timeout_s: How long retries go on after a call's first failure before
            the error is raised, seconds.
        on_retry: Called with the exception before each retry (for counters and logs).
    """

    def __init__(self, *, reconnect_timeout_s: float, on_retry: Callable[[BaseException], None]) -> None:
        super().__init__("the PostgreSQL store")
        self.pool: asyncpg.Pool | None = None
        self.loop: asyncio.AbstractEventLoop | None = None  # the loop the pool was made in
        self.reconnect_timeout_s = reconnect_timeout_s
        self._on_retry = on_retry
        self.transactions = 0
        self._interrupted: set[int] = set()  # server pids of pooled sessions whose operation was cut short

    def _pool(self) -> asyncpg.Pool:
        if self.pool is None:
            raise StoreClosedError("the PostgreSQL store is not open: use 'async with' or await open()")
        self.check_loop()
        return self.pool

    def check_loop(self) -> None:
        """Raise :class:`StoreLoopError` if the pool was made in another event loop than the running one.

        Calls that queue work for a batch (commits, lock acquisitions) check before
        queueing: a batch running in the owning loop must never take another loop's item.
        """
        if self.pool is not None and self.loop is not asyncio.get_running_loop():
            raise StoreLoopError(
                "the PostgreSQL store was opened in another event loop (another asyncio.run, thread or test"
                " loop) and serves that loop only: open a store in the loop that uses it"
            )

    def check_usable(self) -> None:
        """Raise if the pool is not open, or belongs to another event loop (see :meth:`call`).

        Raises:
            StoreClosedError: the store is closed.
            StoreLoopError: the store belongs to another event loop.
        """
        self._pool()

    async def reset_session(self, conn: asyncpg.Connection) -> None:
        """The pool's release hook: end what an interrupted operation left open, else nothing.

        By default asyncpg resets every connection handed back to the pool with four
        statements (``pg_advisory_unlock_all()``, ``CLOSE ALL``, ``UNLISTEN *``,
        ``RESET ALL``), one more round trip per operation. The store's pool connections hold
        no session state (no ``SET``, ``LISTEN``, cursors or session advisory locks: the
        listener has a connection of its own, the migration lock is transaction-scoped), and
        asyncpg rolls back a transaction it knows to be open before calling this hook.

        One state asyncpg does not know of: asyncpg prepares a statement with Parse and
        Describe but no Sync, so an operation cancelled after its statement was prepared and
        before it was executed leaves the server session inside the implicit transaction
        that Parse opened (PostgreSQL protocol, "Extended Query"), holding a snapshot and
        the statement's table locks. The next ``BEGIN ISOLATION LEVEL ...`` on that session
        fails, and the snapshot holds back vacuum while the connection idles in the pool.
        For a session whose operation :meth:`run` saw interrupted (by a cancellation, or a
        client-side driver error; sessions are known by their server process id), this hook
        sends one simple-protocol statement, which ends that implicit transaction. Should that
        statement fail, the session is closed instead: the hook never raises into the caller,
        whose own error or cancellation it would replace.
        """
        pid = conn.get_server_pid()
        if pid in self._interrupted:
            self._interrupted.discard(pid)
            try:
                await conn.execute("SELECT 1")
            except _DRIVER_ERRORS:
                # Never raised into the caller: it would replace the error (or the
                # cancellation) that ended its operation. The session is of no further use.
                conn.terminate()

    def _interrupted_in(self, conn: asyncpg.Connection, *, tx: bool, open_tx: bool) -> None:
        """Leave no session state behind an operation that ended in an exception.

        Cancelled with the session still inside a transaction (its BEGIN or COMMIT cut
        short, say), the call cannot know the outcome, and the pool would roll it back with
        an error logged through the loop: the session is closed instead, and the server
        rolls back whatever did not commit. An autocommit operation (``tx=False``) may have
        been cut between its statement's Parse and its Sync: the session is marked for
        :meth:`reset_session`. (A ``tx=True`` one already ended with a simple-protocol
        COMMIT or ROLLBACK, which ends that implicit transaction too.)
        """
        with contextlib.suppress(*_DRIVER_ERRORS):
            if conn.is_closed():
                return
            if open_tx or conn.is_in_transaction():
                conn.terminate()
            elif not tx:
                self._interrupted.add(conn.get_server_pid())

    async def run(
        self, fn: TxFn[T], *, what: str, tx: bool = True, ambiguous_ok: bool = False, counted: bool = False
    ) -> T:
        """Run ``fn`` in a transaction (or, with ``tx=False``, as autocommit statements).

        Args:
            fn: The unit of work.
            what: What it does, for error messages.
            tx: Wrap it in BEGIN ... COMMIT. Without, it must be one statement.
            ambiguous_ok: Retry even when the connection was lost while committing.
            counted: With ``tx=False``: ``fn`` is a write transaction of its own (one
                statement calling a function that writes), counted in ``transactions``.

        Raises:
            StoreConnectionError, StoreBusyError, StoreError: retries gave up (or the
                error is not one to retry); the driver's exception is ``__cause__``.
            StoreClosedError: the store is not open, or it is closing and this is a new call
                (see :meth:`call`).
        """
        with self.call():
            return await self._run(fn, what=what, tx=tx, ambiguous_ok=ambiguous_ok, counted=counted)

    async def _run(self, fn: TxFn[T], *, what: str, tx: bool, ambiguous_ok: bool, counted: bool) -> T:
        deadline: float | None = None  # from the first failure: a process frozen mid-call still retries
        delay_s = 0.02
        attempt = 0
        while True:
            committing = False
            open_tx = False  # this call's BEGIN was sent and neither COMMIT nor ROLLBACK has finished
            try:
                async with self._pool().acquire() as conn:
                    try:
                        if not tx:
                            committing = True
                            outcome = await fn(conn, attempt)
                            if counted:
                                self.transactions += 1
                            return outcome
                        transaction = conn.transaction()
                        open_tx = True  # asyncpg counts the transaction open before BEGIN is answered
                        await transaction.start()
                        try:
                            result = await fn(conn, attempt)
                        except BaseException:
                            # The error to report is fn's: once the server ended the session,
                            # the pool may have detached this proxy, and even is_closed() raises.
                            with contextlib.suppress(*_DRIVER_ERRORS):
                                if not conn.is_closed():
                                    await transaction.rollback()
                                    open_tx = False
                            raise
                        committing = True
                        await transaction.commit()
                        open_tx = False
                        self.transactions += 1
                        return result
                    except _DRIVER_ERRORS as exc:
                        if is_connection_error(exc):
                            # Never hand a broken connection back to the pool. The driver may have
                            # let go of it already (the server ended the session): the error to
                            # report is still the one that broke it, not this call's.
                            with contextlib.suppress(*_DRIVER_ERRORS):
                                conn.terminate()
                        elif not _from_server(exc):
                            # A server error came with the server's ReadyForQuery: the session's
                            # state is known. A client-side one (an argument asyncpg cannot
                            # encode, after the statement's Parse) may have left it mid-protocol.
                            self._interrupted_in(conn, tx=tx, open_tx=open_tx)
                        raise
                    except BaseException:
                        self._interrupted_in(conn, tx=tx, open_tx=open_tx)
                        raise
            except _DRIVER_ERRORS as exc:
                error: BaseException = exc
                retry = _is_conflict(exc) or (is_connection_error(exc) and (not committing or ambiguous_ok))
                if deadline is None:
                    deadline = time.monotonic() + self.reconnect_timeout_s
                if not retry or time.monotonic() + delay_s > self.retry_deadline(deadline):
                    raise map_pg_error(exc, what) from exc
            self._on_retry(error)
            log.info("asynccoord.postgres.retry what=%s attempt=%d error=%s", what, attempt + 1, error)
            await asyncio.sleep(delay_s * random.uniform(0.5, 1.5))
            delay_s = min(delay_s * 2, 1.0)
            attempt += 1


def encode_release(sender: str, name: str) -> str:
    """The payload announcing that lock ``name`` was given back (see :class:`PgListener`)."""
    return json.dumps({"s": sender, "l": name}, separators=(",", ":"))


def encode_pause(sender: str, name: str, pause_s: float) -> str:
    """The payload announcing the provider's pause of lock ``name``, ``pause_s`` seconds (:mod:`asynccoord.pauses`)."""
    return json.dumps({"s": sender, "z": name, "t": round(pause_s, 3)}, separators=(",", ":"))


def encode_notification(sender: str, queue: str, count: int, partitions: Collection[int] | None) -> str:
    """The payload of a work notification (JSON, well under PostgreSQL's 8000-byte limit)."""
    parts = None if partitions is None or len(partitions) > MAX_NOTIFY_PARTITIONS else sorted(partitions)
    return json.dumps({"s": sender, "q": queue, "n": count, "p": parts}, separators=(",", ":"))


class PgListener:
    """One LISTEN connection feeding a :class:`WorkNotifier`, reconnecting when it drops.

    An enqueue of due tasks, or a commit that unblocks a key, notifies the store's
    channel with the queue, the count and the partitions. Each process's listener wakes
    at most that many of its idle nodes that own one of the partitions; polling with
    backoff stays as the fallback, and nodes keep polling while the connection is down.
    A commit's notification names exactly the heads it promoted and did not lease to a
    continuation, and wakes the committing process's own nodes too. An enqueue wakes its
    own process's nodes at once, and the listener ignores its echo.

    A connection lost or refused is made again after a delay with jitter that doubles from
    0.1 s up to 5 s, and goes back to 0.1 s only once a connection stayed up for 5 s: a
    session ended again and again (``pg_terminate_backend``, a proxy that drops it) costs
    a few connections and log lines a minute, not a tight loop of both. Each loss or
    refusal logs one warning (``asynccoord.postgres.listen_lost`` or ``listen_failed``)
    with the losses in a row and the delay before the next attempt.

    Args:
        connect: Opens a new connection (same settings as the pool's).
        channel: The channel to LISTEN on.
        sender: This store's id: its own notifications are ignored (it woke its own
            nodes in process already).
        notifier: Where wake-ups go.
        releases: Where announcements of locks given back go (``{"s": sender, "l": name}``,
            see :func:`encode_release`); None ignores them.
        pauses: Where the provider's pauses of locks go (``{"s": sender, "z": name, "t":
            seconds}``, see :func:`encode_pause`); None ignores them.
    """

    def __init__(
        self,
        connect: Callable[[], Awaitable[asyncpg.Connection]],
        *,
        channel: str,
        sender: str,
        notifier: WorkNotifier,
        releases: ReleaseSignal | None = None,
        pauses: PauseBook | None = None,
    ) -> None:
        self._connect = connect
        self.channel = channel
        self.sender = sender
        self.notifier = notifier
        self.releases = releases
        self.pauses = pauses
        self.connected = asyncio.Event()
        self.received = 0
        self.reconnects = 0
        self._task: asyncio.Task[None] | None = None
        self._conn: asyncpg.Connection | None = None
        self._stopping = asyncio.Event()  # set by stop(); the loop reads it (its cancellation may be lost)

    async def start(self, *, timeout_s: float = 5.0) -> None:
        """Start listening in the background; wait up to ``timeout_s`` for the first connection."""
        self._task = asyncio.create_task(self._run(), name=f"asynccoord-listen-{self.channel}")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.connected.wait(), timeout_s)

    async def stop(self) -> None:
        """Stop listening and close the connection.

        The listening task is told by a flag as well as cancelled, and cancelled again
        every second until it ends: on Python 3.11 ``asyncio.wait_for`` returns the result
        of a wait that ended just as it was cancelled, which swallows the cancellation (a
        listener whose connection the server ended at that moment reconnected and went on
        listening, and ``stop`` waited for it for ever).
        """
        self._stopping.set()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            while not (await asyncio.wait({task}, timeout=1.0))[0]:
                task.cancel()
            if not task.cancelled():
                with contextlib.suppress(Exception):
                    task.result()  # seen: it logs its own errors
        await self._close()

    def abandon(self) -> None:
        """Drop the connection at once (the loop that ran the listener is gone, or not ours)."""
        task, self._task = self._task, None
        if task is not None and not task.done() and not task.get_loop().is_closed():
            task.get_loop().call_soon_threadsafe(task.cancel)
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            with contextlib.suppress(RuntimeError):  # its loop is closed: the socket goes with it
                conn.terminate()

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        self.connected.clear()
        if conn is not None and not conn.is_closed():
            with contextlib.suppress(*_DRIVER_ERRORS):
                await asyncio.wait_for(conn.close(), 2.0)

    async def _run(self) -> None:
        delay_s = _LISTEN_RETRY_MIN_S
        losses = 0  # connections lost or refused since the last one that stayed up
        first = True
        while not self._stopping.is_set():
            lost = asyncio.Event()
            try:
                conn = await self._connect()
                self._conn = conn
                if self._stopping.is_set():  # stop() came while connecting (its cancellation may have been lost)
                    break
                conn.add_termination_listener(lambda _conn, lost=lost: lost.set())
                await conn.add_listener(self.channel, self._on_notify)
            except _DRIVER_ERRORS as exc:
                losses += 1
                pause_s = delay_s * random.uniform(0.5, 1.5)
                log.warning(
                    "asynccoord.postgres.listen_failed channel=%s losses=%d retry_in_s=%.2f error=%s",
                    self.channel,
                    losses,
                    pause_s,
                    exc,
                )
                await self._close()
                await self._pause(pause_s)
                delay_s = min(delay_s * 2, _LISTEN_RETRY_MAX_S)
                continue
            up_since = time.monotonic()
            self.connected.set()
            if not first:
                self.reconnects += 1
                self.notifier.wake_all()  # notifications may have been missed meanwhile
            first = False
            while not lost.is_set() and not conn.is_closed() and not self._stopping.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(lost.wait(), 1.0)
            if self._stopping.is_set():
                break
            if time.monotonic() - up_since >= _LISTEN_STABLE_S:
                delay_s, losses = _LISTEN_RETRY_MIN_S, 0
            losses += 1
            pause_s = delay_s * random.uniform(0.5, 1.5)
            log.warning(
                "asynccoord.postgres.listen_lost channel=%s losses=%d retry_in_s=%.2f", self.channel, losses, pause_s
            )
            await self._close()
            await self._pause(pause_s)
            delay_s = min(delay_s * 2, _LISTEN_RETRY_MAX_S)

    async def _pause(self, pause_s: float) -> None:
        """Wait ``pause_s`` seconds before connecting again, or until :meth:`stop`."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), pause_s)

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        try:
            message: object = json.loads(payload)
            if not isinstance(message, dict):
                raise TypeError("not a JSON object")
            if message.get("s") == self.sender:
                return
            if "l" in message:  # a lock given back (encode_release)
                name = check_name("lock name", message["l"])
                self.received += 1
                if self.releases is not None:
                    self.releases.deliver(name)
                return
            if "z" in message:  # the provider's pause of a lock (encode_pause)
                name = check_name("lock name", message["z"])
                pause_s = check_non_negative("pause_s", message["t"])
                self.received += 1
                if self.pauses is not None:
                    self.pauses.deliver(name, pause_s)
                return
            # The values are checked as they came, not converted: a str, an int and a list of
            # ints (or null), as encode_notification writes them.
            parts = message.get("p")
            if parts is not None and type(parts) is not list:
                raise TypeError(f"partitions must be a JSON array, got {parts!r}")
            queue = check_name("queue", message["q"])
            count = check_int("n", message["n"], minimum=0)
            partitions = check_partitions("partitions", parts)
        except (ValueError, KeyError, TypeError, RecursionError):  # InvalidArgumentError and InvalidTypeError too
            log.warning("asynccoord.postgres.bad_notification payload=%r", payload[:200])
            return
        self.received += 1
        self.notifier.notify(queue, count, partitions)
