"""The embedded default store: SQLite through aiosqlite.

One :class:`SQLiteStore` per process and database file; any number of nodes in the
process share it, and any number of processes may open the same file. Writes are
group-committed by one writer per store (see :mod:`._groupcommit`); each write
transaction starts with ``BEGIN IMMEDIATE`` so a transaction never upgrades from
read to write halfway (which fails at once with "database is locked"). The journal
is WAL, so readers never wait for the writer.

The store clock is SQLite's ``julianday('now')``, read once at the start of each
write transaction: every lease and run_at of one transaction uses the same instant,
and all processes on the machine share the clock. SQLite on a network filesystem is
not supported (its locking is unreliable there): use the PostgreSQL store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from typing import Any, cast

import aiosqlite

from ...config import StoreConfig
from ...errors import (
    InvalidArgumentError,
    InvalidTypeError,
    NotADatabaseError,
    ReadOnlyStoreError,
    StoreAlreadyOpenError,
    StoreClosedError,
    StoreError,
    StoreLoopError,
)
from ...events import EventCounter
from ...monitor.histogram import LatencyRecorder
from ...pauses import PauseBook
from ...releases import ReleaseSignal
from ...validation import check_bool, check_clock
from ..calls import CLOSE_WAIT_S, CallGate
from ..opening import single_open
from ..schema import REVISION_KEY, check_partitions, check_revision
from ..sqlfiles import load_migrations, load_queries
from ..targets import relative_url_hint
from .access import access_problem
from .checkpoint import WalCheckpointer
from .deadletters import SQLiteDeadLetterOps
from .diskfull import disk_full_problem
from .filekind import not_a_file
from .identity import FileIdentity
from .locks import SQLiteLockOps
from .membership import SQLiteMembershipOps
from .monitor import SQLiteMonitorOps
from .queue import SQLiteQueueOps
from .ratelimits import SQLiteRateLimitOps
from .readonly import read_only_error, read_only_uri, setup_read_only
from .revision import delete_fix, read_meta
from .seek import Flagging
from .texts import leniently, undecodable
from .wakeup import SharedNotifier, WakeupChannel, wakeup_dir
from .writer import (
    GroupCommitter,
    Operation,
    close_abandoned,
    connection_thread_ended,
    daemon_connection,
    is_read_only,
    map_sqlite_error,
    raw_connection,
    retry_busy,
    run_on_thread,
)

__all__ = ("SQLiteStore",)

log = logging.getLogger(__name__)

Q = load_queries("sqlite")
SCHEMA_VERSION = len(load_migrations("sqlite"))
MIN_SQLITE = (3, 35, 0)


def _check_writable(path: str) -> None:
    """Refuse a database this process cannot write, before SQLite opens it (and leaves files behind).

    SQLite opens a file it may not write read-only without a word, and fails at the first
    write; under WAL it also needs ``<file>-wal`` and ``<file>-shm`` beside it, which it
    creates in the folder (with this process's ownership). ``os.access`` answers for the
    real user id (root passes, except on a read-only mount): the probe write in
    :meth:`SQLiteStore._setup` covers what it cannot see.

    Raises:
        NotADatabaseError: the folder does not exist.
        ReadOnlyStoreError: the file, a companion file, or the folder is not writable; the
            message says when the file may not even be read, sits behind a folder this
            process may not enter, or cannot be created (see :func:`.access.access_problem`).
    """
    problem = access_problem(path, write=True)
    if problem is not None:
        raise ReadOnlyStoreError(problem)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise NotADatabaseError(
            f"cannot open {path!r}: its folder {folder!r} does not exist (create it first; a store creates "
            "the database file, never its folder)"
        )
    companions = [path + "-wal", path + "-shm"]
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise _read_only_file(path, "the file is not writable by this process")
    for companion in companions:
        if os.path.exists(companion) and not os.access(companion, os.W_OK):
            raise _read_only_file(path, f"{companion!r} is not writable by this process")
    creates = not os.path.exists(path) or not all(os.path.exists(c) for c in companions)
    if creates and not os.access(folder, os.W_OK | os.X_OK):
        raise _read_only_file(path, f"its folder {folder!r} is not writable, and SQLite creates files there")


def _read_only_file(path: str, reason: str) -> ReadOnlyStoreError:
    return ReadOnlyStoreError(
        f"{path!r} is read-only for this process ({reason}): open it with SQLiteStore(path, read_only=True) "
        "to read it, or give this user write access to the file and its folder (SQLite writes "
        "<file>-wal and <file>-shm beside it)",
        path=path,
        reason=reason,
    )


class SQLiteStore(
    SQLiteQueueOps, SQLiteLockOps, SQLiteMembershipOps, SQLiteMonitorOps, SQLiteRateLimitOps, SQLiteDeadLetterOps
):
    """The whole storage contract (queue, locks, membership, monitor) on one SQLite file.

    Use as ``async with SQLiteStore("bot.db") as store: ...`` or call
    :meth:`open` / :meth:`close`. Methods are those of
    :class:`asynccoord.contract.store.Store`.

    The store belongs to the event loop that opened it (its writer task and connection
    do): open one per ``asyncio.run``. A call or ``open()`` from another loop raises
    :class:`~asynccoord.errors.StoreLoopError` at once and writes nothing, and a node on
    such a store fails as on a closed one; ``close()`` from another loop only releases
    the connections.

    Args:
        path: Database file (created if missing). ``":memory:"`` works for a single
            store object but cannot be shared between stores or processes.
        config: Store settings; default :class:`~asynccoord.config.StoreConfig`.
        clock: Test hook: a function returning the store clock (seconds) used instead
            of SQLite's ``julianday('now')``. Every store on a file must then use the
            same clock. Default None (the database clock).
        read_only: Open the existing file read-only (``file:...?mode=ro``): no
            migration, and every write raises
            :class:`~asynccoord.errors.ReadOnlyStoreError`. For inspection of a live
            database (it never blocks the writers), or of one in a folder this process
            cannot write and with no ``-wal`` file beside it, which no writer has open
            (read as it is, with ``immutable=1``). Default False.
        wakeup: Wake idle nodes of other processes on the same file at once when work
            for them is committed, and be woken by theirs (a Unix datagram socket in
            ``<path>-wakeup/``, see :mod:`asynccoord.backends.sqlite.wakeup`). Off, work
            from other processes is found by the idle poll only. Default True.

    Raises:
        InvalidTypeError: ``path`` is not a str or PathLike, ``config`` is not a StoreConfig,
            or ``clock`` is neither callable nor None.
        InvalidArgumentError: ``path`` is blank, holds a NUL character, or is not UTF-8 text
            (a lone surrogate).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        config: StoreConfig | None = None,
        clock: Callable[[], float] | None = None,
        read_only: bool = False,
        wakeup: bool = True,
    ) -> None:
        if not isinstance(path, str | os.PathLike):
            raise InvalidTypeError(f"path must be a str or PathLike, got {type(path).__name__}")
        if config is not None and not isinstance(config, StoreConfig):
            raise InvalidTypeError(f"config must be a StoreConfig, got {type(config).__name__}")
        check_clock(clock)
        fspath = os.fspath(path)
        if not isinstance(fspath, str):
            raise InvalidTypeError(f"path must be a str path, got {type(fspath).__name__} {fspath!r}")
        self.path = fspath
        if not self.path.strip():
            raise InvalidArgumentError(f"path must name a file, got {self.path!r}: give a file name, or ':memory:'")
        try:
            self.path.encode("utf-8")
        except UnicodeEncodeError:  # SQLite takes file names as UTF-8 text
            raise InvalidArgumentError(f"path must be UTF-8 text (no lone surrogates), got {self.path!r}") from None
        if "\x00" in self.path:
            raise InvalidArgumentError(f"path must not contain NUL characters, got {self.path!r}")
        self.config = config or StoreConfig()
        self.events = EventCounter()
        self.latencies = LatencyRecorder()
        self.pauses = PauseBook()  # the provider's 429 pauses this process heard of (asynccoord.pauses)
        self.read_only = check_bool("read_only", read_only)
        self.wakeup = check_bool("wakeup", wakeup)
        self.notifier = SharedNotifier()
        self.releases = ReleaseSignal()
        self._wakeup: WakeupChannel | None = None
        self._clock = clock
        self._conn: aiosqlite.Connection | None = None
        self._writer: GroupCommitter | None = None
        self._gate = CallGate("the SQLite store")  # calls in flight, waited for by close()
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop of open(): see _w
        self._checkpointer: WalCheckpointer | None = None
        self._partitions = self.config.partitions
        self._flagging = Flagging()  # queues' tasks entering the per-partition index (seek.py)
        self._identity: FileIdentity | None = None  # the file opened, checked against the path (identity.py)
        self._url: str | None = None  # the sqlite:/// URL open_store() read the path from, for open()'s errors

    def __repr__(self) -> str:
        state = "open" if self._conn is not None else "closed"
        return f"<SQLiteStore {self.path!r} {state}>"

    # --- life cycle -----------------------------------------------------------------

    @single_open
    async def open(self) -> None:
        """Open the file, set WAL and pragmas, and apply pending migrations.

        Raises:
            NotADatabaseError: the file exists but is not an SQLite database (or no regular
                file: a directory, a FIFO, a device), or its folder does not exist (the message
                names it).
            ReadOnlyStoreError: the file (or its folder, where SQLite writes the
                ``-wal`` and ``-shm`` files) is not writable by this process; nothing is
                created. Open it with ``read_only=True`` to read it.
            SchemaVersionError: the database was written by a newer asynccoord, or by a
                development version before 0.1.0 (delete the file to start again).
            StoreBusyError: another connection held the write lock past the timeout.
            StoreAlreadyOpenError: the store is open already; it stays open.
        """
        if self._conn is not None:
            self._check_loop()  # open, but for another loop: StoreLoopError
            raise StoreAlreadyOpenError.of(self)
        if sqlite3.sqlite_version_info < MIN_SQLITE:
            raise StoreError(
                f"SQLite {sqlite3.sqlite_version} is too old: asynccoord needs {'.'.join(map(str, MIN_SQLITE))} "
                "or newer (RETURNING, UPDATE FROM)"
            )
        kind = None if self.path == ":memory:" else not_a_file(self.path)  # one stat at open
        if kind is not None:
            raise NotADatabaseError(f"{self.path!r} is {kind}, not an SQLite database")
        try:
            if self._on_file():
                _check_writable(self.path)  # before SQLite leaves -wal/-shm files behind
            target = read_only_uri(self.path) if self.read_only else self.path
        except NotADatabaseError as exc:  # no folder, or (read-only) no file: an sqlite:/// URL read as relative?
            hint = relative_url_hint(self._url, file_needed=self.read_only) if self._url is not None else ""
            if not hint:
                raise
            raise NotADatabaseError(f"{exc}; {hint}") from exc
        new_file = self._file_path() is not None and not os.path.exists(self.path)  # noqa: ASYNC240 - one stat
        conn = daemon_connection(target, uri=self.read_only)
        try:
            await conn
        except sqlite3.Error as exc:
            await connection_thread_ended(conn)
            self._forget_empty_file(new_file, exc)
            raise map_sqlite_error(exc, f"cannot open {self.path!r}", path=self._file_path()) from exc
        try:
            await run_on_thread(conn, self._setup_read_only if self.read_only else self._setup, conn)
        except sqlite3.DatabaseError as exc:
            await conn.close()
            if "not a database" in str(exc) or "malformed" in str(exc):
                raise NotADatabaseError(f"{self.path!r} is not an SQLite database ({exc})") from exc
            if is_read_only(exc):
                raise _read_only_file(self.path, str(exc)) from exc
            self._forget_empty_file(new_file, exc)
            raise map_sqlite_error(exc, f"cannot open {self.path!r}", path=self._file_path()) from exc
        except BaseException:
            await conn.close()
            raise
        self._conn = conn
        self._loop = asyncio.get_running_loop()
        self._identity = self._file_identity()
        self._gate.forget_calls()  # those of a loop closed mid-call never end
        self._writer = GroupCommitter(
            conn,
            now_sql=Q["now"],
            busy_timeout_s=self.config.busy_timeout_s,
            max_batch_ops=self.config.max_batch_ops,
            clock=self._clock,
            path=self._file_path(),
        )
        if not self.read_only:  # a read-only store keeps the committer only for its clock
            self._writer.start()
        if self.wakeup and self._on_file() and isinstance(self.notifier, SharedNotifier):
            self._wakeup = WakeupChannel.open(wakeup_dir(self.path), self.notifier, self.releases, self.pauses)
        if self._background_checkpoints():
            writer = self._writer
            interval_s = cast(float, self.config.checkpoint_interval_s)
            checkpointer = WalCheckpointer(self.path, interval_s=interval_s, committed=lambda: writer.transactions)
            try:
                await checkpointer.start()
            except BaseException as exc:  # cancelled or failed: closed again, never half open
                await self.close()
                if isinstance(exc, sqlite3.Error):
                    what = f"cannot open {self.path!r} for checkpoints"
                    raise map_sqlite_error(exc, what, path=self._file_path()) from exc
                raise
            self._checkpointer = checkpointer

    def _forget_empty_file(self, new_file: bool, exc: sqlite3.Error) -> None:
        """Remove the empty file (and companions) a first open made before a full disk stopped it.

        Only when this open created the path, the disk is full (:func:`.diskfull.disk_full_problem`)
        and neither the file nor its ``-wal`` holds a byte: nothing is lost, and a failed open
        leaves the folder as it found it. Another process that opened the same new path meanwhile
        holds nothing in it either.
        """
        if not new_file or disk_full_problem(self.path, exc) is None:
            return
        wal = self.path + "-wal"
        try:
            if os.path.getsize(self.path) or (os.path.exists(wal) and os.path.getsize(wal)):
                return
        except OSError:
            return
        for leftover in (self.path, wal, self.path + "-shm", self.path + "-journal"):
            with contextlib.suppress(OSError):
                os.remove(leftover)

    def _file_path(self) -> str | None:
        """The database file's path; None for ``:memory:`` and a ``file:`` URI (left to SQLite)."""
        if self.path == ":memory:" or self.path.startswith("file:"):
            return None
        return self.path

    def _file_identity(self) -> FileIdentity | None:
        """The identity of the file just opened, to notice its deletion or replacement; None for no file."""
        if self._file_path() is None:
            return None
        try:
            return FileIdentity(self.path)
        except OSError:  # gone already, between the open and now: the first check cannot tell, so none
            return None

    def _on_file(self) -> bool:
        # A "file:" name may be a URI (this SQLite may interpret them), possibly of an
        # in-memory database a second connection would not share: left to SQLite.
        return not self.read_only and self._file_path() is not None

    def _background_checkpoints(self) -> bool:
        return self._on_file() and self.config.checkpoint_interval_s is not None

    def _setup_read_only(self, conn: aiosqlite.Connection) -> None:
        self._partitions = setup_read_only(
            raw_connection(conn), self.path, schema_version=SCHEMA_VERSION, busy_timeout_s=self.config.busy_timeout_s
        )

    def _setup(self, conn: aiosqlite.Connection) -> None:
        db = raw_connection(conn)
        deadline = time.monotonic() + self.config.busy_timeout_s
        db.execute("PRAGMA busy_timeout = 0")
        mode = retry_busy(lambda: db.execute("PRAGMA journal_mode = WAL").fetchone(), deadline)
        if mode is None or str(mode[0]).lower() not in ("wal", "memory"):
            raise StoreError(f"{self.path!r}: cannot switch to WAL journal mode (got {mode!r})")
        db.execute(f"PRAGMA synchronous = {'FULL' if self.config.synchronous_full else 'NORMAL'}")
        db.execute("PRAGMA temp_store = MEMORY")
        db.execute("PRAGMA cache_size = -16000")
        retry_busy(lambda: db.execute("BEGIN IMMEDIATE"), deadline)
        try:
            meta = read_meta(db) or {}
            revision = check_revision(repr(self.path), meta, supported=SCHEMA_VERSION, fix=delete_fix(self.path))
            for number, script in load_migrations("sqlite"):
                if number > revision:
                    for statement in _split_script(script):
                        db.execute(statement)
                    db.execute(Q["meta_set"], {"key": REVISION_KEY, "value": str(number)})
            row = db.execute(Q["meta_get"], {"key": "partitions"}).fetchone()
            if row is None:
                db.execute(Q["meta_set"], {"key": "partitions", "value": str(self.config.partitions)})
            else:
                self._partitions = check_partitions(repr(self.path), row[0])
                # Nothing written so far: a probe write, undone, so a database SQLite opened
                # read-only (a read-only mount, say) fails here, not at the first real write.
                db.execute("SAVEPOINT asynccoord_probe")
                db.execute(Q["meta_set"], {"key": "partitions", "value": str(row[0])})
                db.execute("ROLLBACK TO asynccoord_probe")
                db.execute("RELEASE asynccoord_probe")
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    async def close(self) -> None:
        """Let the calls in flight finish, commit what is queued, then close the connection. Idempotent.

        From the moment ``close()`` is called, a new call raises
        :class:`~asynccoord.errors.StoreClosedError` (nothing written), but a hand-back (a
        lock's or a task's ``release``) is let through. The calls in flight, and the
        hand-backs their ends start (the release of a lease granted to a ``Lock`` caller
        cancelled just before the close, say), are waited for, up to 10 s: each returns
        its result, or raises as it would have with the store open, and no lease or task
        is left held until its TTL with nobody to release it. The shutdown itself
        (checkpointer, writer, connection and its thread) then runs to its end even if
        the caller is cancelled meanwhile, so a cancelled close leaks nothing. Called from
        another event loop than ``open()``'s (whose writer task ended with that loop), it
        only closes the connections: nothing queued in the old loop can still be waited for.
        """
        if self._conn is not None and self._loop is asyncio.get_running_loop():
            self._gate.closing = True
            try:
                if not await self._gate.settle(CLOSE_WAIT_S):
                    log.warning("asynccoord.sqlite.close_cut_calls calls=%d", self._gate.calls)
            finally:
                self._gate.closing = False
                await self._shut_down()
        else:
            self._gate.forget_calls()
            await self._shut_down()

    async def _shut_down(self) -> None:
        """Close for callers at once, then stop the checkpointer and the writer and close the connection."""
        conn, writer, checkpointer = self._conn, self._writer, self._checkpointer
        channel, self._wakeup = self._wakeup, None
        self._identity = None
        if channel is not None:
            channel.close()
        self._conn = None
        self._writer = None
        self._checkpointer = None
        self._refill.cancel_all()
        if conn is None and writer is None and checkpointer is None:
            return
        if self._loop is not asyncio.get_running_loop():  # the loop of open() is gone, or not ours
            await asyncio.shield(asyncio.ensure_future(_release_abandoned(conn, writer, checkpointer)))
            return
        await asyncio.shield(asyncio.ensure_future(_shut_down(conn, writer, checkpointer)))

    @property
    def partitions(self) -> int:
        """Number of fixed partitions (as stored in the database when it was created)."""
        return self._partitions

    @property
    def transactions(self) -> int:
        """Write transactions committed by this store object so far."""
        return self._writer.transactions if self._writer is not None else 0

    @property
    def writing(self) -> bool:
        """Whether a write transaction of this store holds the database's write lock now.

        Its calls then wait for that transaction (a large ``enqueue_many``, say), not for the
        database: the monitor's outage watch does not count them as hung meanwhile
        (:mod:`asynccoord.monitor.outage`).
        """
        return self._writer is not None and self._writer.writing

    def _w(self) -> GroupCommitter:
        """The writer, for a call of an open store in its loop (or a step of a call, or a hand-back, while it closes).

        Raises:
            StoreClosedError: the store is closed, or closing and this is a new call.
            StoreLoopError: the store belongs to another event loop.
            StoreFileReplacedError: the file was deleted or replaced since the open.
        """
        if self._writer is None:
            raise StoreClosedError(f"{self!r} is not open: use 'async with' or await open()")
        self._check_loop()
        self._check_file()
        self._gate.admit()
        return self._writer

    def _check_loop(self) -> None:
        if self._loop is not asyncio.get_running_loop():
            raise StoreLoopError(
                f"{self!r} was opened in another event loop (another asyncio.run, thread or test loop) and"
                " serves that loop only: open a store in the loop that uses it"
            )

    def _check_file(self) -> None:
        """Raise StoreFileReplacedError once the file opened is no longer at the path (one stat every 2 s at most)."""
        identity = self._identity
        if identity is not None:
            identity.check()

    def _writable(self) -> GroupCommitter:
        """The writer, for a write: raises ReadOnlyStoreError, StoreClosedError or StoreLoopError otherwise."""
        if self.read_only:
            raise read_only_error(self)
        return self._w()

    async def _write(self, fn: Operation[Any], undo: Callable[[Any], Operation[Any] | None] | None = None) -> Any:
        writer = self._writable()
        with self._gate.call():  # in flight: waited for by close()
            try:
                return await writer.submit(fn, undo)
            except StoreError as exc:
                if not undecodable(exc):
                    raise
            # A text that is not UTF-8 (a row written by another tool): again, read as bytes (see .texts).
            return await writer.submit(leniently(fn), undo)

    async def _read(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        conn = self._conn
        if conn is None:
            raise StoreClosedError(f"{self!r} is not open: use 'async with' or await open()")
        self._check_loop()
        self._check_file()
        deadline = time.monotonic() + self.config.busy_timeout_s

        def run(read: Callable[[sqlite3.Connection], Any]) -> Any:
            return retry_busy(lambda: read(raw_connection(conn)), deadline)

        with self._gate.call():  # in flight: waited for by close() (refused if new while it closes)
            try:
                try:
                    return await run_on_thread(conn, lambda: run(fn))
                except sqlite3.OperationalError as exc:
                    if not undecodable(exc):
                        raise
                # A text that is not UTF-8 (a row written by another tool): again, read as bytes (see .texts).
                return await run_on_thread(conn, lambda: run(leniently(fn)))
            except sqlite3.Error as exc:
                raise map_sqlite_error(exc, "read", path=self._file_path()) from exc

    async def now(self) -> float:
        """The store clock: seconds since the Unix epoch (SQLite's ``julianday('now')``)."""
        writer = self._w()
        return float(await self._read(writer.now))


async def _shut_down(
    conn: aiosqlite.Connection | None, writer: GroupCommitter | None, checkpointer: WalCheckpointer | None
) -> None:
    """Stop the checkpointer, let the writer commit what is queued, close the connection."""
    try:
        if checkpointer is not None:
            await checkpointer.stop()
    finally:
        try:
            if writer is not None:
                await writer.stop()
        finally:
            if conn is not None:
                await conn.close()


async def _release_abandoned(
    conn: aiosqlite.Connection | None, writer: GroupCommitter | None, checkpointer: WalCheckpointer | None
) -> None:
    """Close the connections of a store whose event loop (that of ``open()``) is not the running one.

    The writer and checkpointer tasks ran on that loop: they are stopped there if it
    still runs (they ended with it otherwise) and never awaited from here. The
    connections are closed by :func:`close_abandoned` (their threads may have died with
    that loop).
    """
    if writer is not None and writer.task is not None:
        _on_its_loop(writer.task, writer.abandon)  # ends it at once (a cancellation alone is deferred)
    if checkpointer is not None and checkpointer.task is not None:
        _on_its_loop(checkpointer.task, checkpointer.task.cancel)
    for c in (checkpointer.connection if checkpointer is not None else None, conn):
        if c is not None:
            await close_abandoned(c)


def _on_its_loop(task: asyncio.Task[None], stop: Callable[[], object]) -> None:
    """Call ``stop`` on the loop of ``task`` (from any thread), unless the task or its loop has ended."""
    if not task.done() and not task.get_loop().is_closed():
        task.get_loop().call_soon_threadsafe(stop)


def _split_script(script: str) -> list[str]:
    """Split a migration script into statements (our scripts have no ';' in literals)."""
    statements: list[str] = []
    buffer: list[str] = []
    for line in script.splitlines():
        if line.strip().startswith("--"):
            continue
        buffer.append(line)
        if line.rstrip().endswith(";"):
            text = "\n".join(buffer).strip()
            if sqlite3.complete_statement(text):
                statements.append(text)
                buffer = []
    tail = "\n".join(buffer).strip()
    if tail:
        statements.append(tail)
    return statements
