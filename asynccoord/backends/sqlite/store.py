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
import json
import logging
import operator
import os
import sqlite3
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any, Self, cast

import aiosqlite

from ... import events as ev
from ...config import StoreConfig
from ...contract.lockchecks import fence_rejected_error
from ...contract.queue import (
    MAX_ID,
    QueueConveniences,
    check_claim_args,
    check_claimable_args,
    check_continuation,
    check_fences,
    check_purge_batch,
    check_retry,
    check_task,
    check_task_ids,
    check_tasks,
    clean_error,
    decode_json,
    encode_results,
    new_token,
    notify_created,
    notify_partitions,
    prepare_tasks,
    settled_done,
    task_from_row,
    with_stored_fields,
)
from ...contract.ratelimits import Admission
from ...errors import (
    CoordError,
    InvalidArgumentError,
    InvalidTypeError,
    LeaseLostError,
    NotADatabaseError,
    ReadOnlyStoreError,
    SchemaVersionError,
    StoreClosedError,
    StoreError,
    StoreLoopError,
    TaskNotFoundError,
)
from ...events import EventCounter
from ...models import Continuation, EnqueueResult, NewTask, PurgeResult, QueueStats, Task, TaskSlots, TaskStatus
from ...monitor.histogram import LatencyRecorder
from ...notify import WorkNotifier
from ...validation import check_bool, check_clock, check_int, check_lease_s, check_name, check_non_negative
from ..sqlfiles import load_migrations, load_queries
from .checkpoint import WalCheckpointer
from .deadletters import SQLiteDeadLetterOps
from .locks import SQLiteLockOps, check_fence
from .membership import SQLiteMembershipOps
from .monitor import SQLiteMonitorOps
from .ratelimits import SQLiteRateLimitOps, claim_limited
from .readonly import read_only_error, read_only_uri, setup_read_only
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

_Row = tuple[Any, ...]
_Claimed = tuple[list[_Row], int, int, float, list[tuple[str, int]]]  # rows, duplicates, dead, now, promoted
# now, per-task outcome, refused fences, promoted heads, the next task's row, duplicates settled, its queue
_Completed = tuple[float, list[int | str | None], dict[int, int], list[tuple[str, int]], "_Row | None", int, str]
_ID, _PRIORITY, _RECLAIMED = operator.itemgetter(0), operator.itemgetter(5), operator.itemgetter(14)  # of a claim's row
_NEW = object.__new__
_RUNNING = TaskStatus.RUNNING


def _check_writable(path: str) -> None:
    """Refuse a database this process cannot write, before SQLite opens it (and leaves files behind).

    SQLite opens a file it may not write read-only without a word, and fails at the first
    write; under WAL it also needs ``<file>-wal`` and ``<file>-shm`` beside it, which it
    creates in the folder (with this process's ownership). ``os.access`` answers for the
    real user id (root passes, except on a read-only mount): the probe write in
    :meth:`SQLiteStore._setup` covers what it cannot see.

    Raises:
        NotADatabaseError: the folder does not exist.
        ReadOnlyStoreError: the file, a companion file, or the folder is not writable.
    """
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
        "<file>-wal and <file>-shm beside it)"
    )


def _claimed_task(row: _Row, queue: str, node_id: str, expires: float, now: float) -> Task:
    """A Task from a claim's row (see the claim queries for its columns) and what the claim set.

    Filled slot by slot as :func:`~asynccoord.models.make_task` does (this runs once per
    claimed task; inlined, it saves the 19-argument call), with no validation: the store
    wrote these values.
    """
    task: Any = _NEW(TaskSlots)
    task.id = row[0]
    task.queue = queue
    task.partition_key = row[1]
    task.partition = row[2]
    task.idempotency_key = row[3]
    task.payload = decode_json(row[4])
    task.priority = row[5]
    task.status = _RUNNING
    task.attempts = row[6]
    task.max_attempts = row[7]
    task.run_at = row[8]
    task.lease_owner = node_id
    task.lease_token = row[9]
    task.lease_expires_at = expires
    task.version = row[10]
    task.last_error = row[11]
    task.result = None if row[12] is None else decode_json(row[12])
    task.created_at = row[13]
    task.updated_at = now
    task.__class__ = Task
    return task  # type: ignore[no-any-return]


def _lost_reason(db: sqlite3.Connection, task: Task, now: float) -> str | None:
    """Why a compare-and-set on ``task`` matched nothing; None if the task is gone."""
    row = db.execute(Q["select_task"], {"id": task.id}).fetchone()
    if row is None:
        return None
    status, token, expires, version = row[7], row[12], row[13], row[14]
    if status != TaskStatus.RUNNING:
        return f"task is {status} (version {version}, caller had version {task.version})"
    if token != task.lease_token:
        return f"task was reclaimed by {row[11]!r} under another lease (version {version})"
    if version != task.version:
        return f"version is {version}, caller had {task.version}"
    return f"lease expired at {expires:.3f} (store clock now {now:.3f})"


class SQLiteStore(
    QueueConveniences,
    SQLiteLockOps,
    SQLiteMembershipOps,
    SQLiteMonitorOps,
    SQLiteRateLimitOps,
    SQLiteDeadLetterOps,
):
    """Task queue (and, in later modules, locks and membership) on one SQLite file.

    Use as ``async with SQLiteStore("bot.db") as store: ...`` or call
    :meth:`open` / :meth:`close`. Methods are those of
    :class:`asynccoord.contract.protocols.Store`.

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
            database (it never blocks the writers). Default False.

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
        self.read_only = check_bool("read_only", read_only)
        self.notifier = WorkNotifier()
        self._clock = clock
        self._conn: aiosqlite.Connection | None = None
        self._writer: GroupCommitter | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop of open(): see _w
        self._checkpointer: WalCheckpointer | None = None
        self._partitions = self.config.partitions

    def __repr__(self) -> str:
        state = "open" if self._conn is not None else "closed"
        return f"<SQLiteStore {self.path!r} {state}>"

    # --- life cycle -----------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Open the file, set WAL and pragmas, and apply pending migrations.

        Raises:
            NotADatabaseError: the file exists but is not an SQLite database, or its
                folder does not exist (the message names it).
            ReadOnlyStoreError: the file (or its folder, where SQLite writes the
                ``-wal`` and ``-shm`` files) is not writable by this process; nothing is
                created. Open it with ``read_only=True`` to read it.
            SchemaVersionError: the database was written by a newer asynccoord.
            StoreBusyError: another connection held the write lock past the timeout.
        """
        if self._conn is not None:
            self._check_loop()  # open, but for another loop: StoreLoopError
            return
        if sqlite3.sqlite_version_info < MIN_SQLITE:
            raise StoreError(
                f"SQLite {sqlite3.sqlite_version} is too old: asynccoord needs {'.'.join(map(str, MIN_SQLITE))} "
                "or newer (RETURNING, UPDATE FROM)"
            )
        if self.path != ":memory:" and os.path.isdir(self.path):  # noqa: ASYNC240 - one stat at open
            raise NotADatabaseError(f"{self.path!r} is a directory, not an SQLite database")
        if not self.read_only and self.path != ":memory:" and not self.path.startswith("file:"):
            _check_writable(self.path)  # before SQLite leaves -wal/-shm files behind
        target = read_only_uri(self.path) if self.read_only else self.path
        conn = daemon_connection(target, uri=self.read_only)
        try:
            await conn
        except sqlite3.Error as exc:
            await connection_thread_ended(conn)
            raise map_sqlite_error(exc, f"cannot open {self.path!r}") from exc
        try:
            await run_on_thread(conn, self._setup_read_only if self.read_only else self._setup, conn)
        except sqlite3.DatabaseError as exc:
            await conn.close()
            if "not a database" in str(exc) or "malformed" in str(exc):
                raise NotADatabaseError(f"{self.path!r} is not an SQLite database ({exc})") from exc
            if is_read_only(exc):
                raise _read_only_file(self.path, str(exc)) from exc
            raise map_sqlite_error(exc, f"cannot open {self.path!r}") from exc
        except BaseException:
            await conn.close()
            raise
        self._conn = conn
        self._loop = asyncio.get_running_loop()
        self._writer = GroupCommitter(
            conn,
            now_sql=Q["now"],
            busy_timeout_s=self.config.busy_timeout_s,
            max_batch_ops=self.config.max_batch_ops,
            clock=self._clock,
        )
        if not self.read_only:  # a read-only store keeps the committer only for its clock
            self._writer.start()
        if self._background_checkpoints():
            writer = self._writer
            interval_s = cast(float, self.config.checkpoint_interval_s)
            checkpointer = WalCheckpointer(self.path, interval_s=interval_s, committed=lambda: writer.transactions)
            try:
                await checkpointer.start()
            except BaseException as exc:  # cancelled or failed: closed again, never half open
                await self.close()
                if isinstance(exc, sqlite3.Error):
                    raise map_sqlite_error(exc, f"cannot open {self.path!r} for checkpoints") from exc
                raise
            self._checkpointer = checkpointer

    def _background_checkpoints(self) -> bool:
        # A "file:" name may be a URI (this SQLite may interpret them), possibly of an
        # in-memory database a second connection would not share: left to SQLite.
        return (
            not self.read_only
            and self.path != ":memory:"
            and not self.path.startswith("file:")
            and self.config.checkpoint_interval_s is not None
        )

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
            has_meta = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'coord_meta'").fetchone()
            version = 0
            if has_meta:
                row = db.execute(Q["meta_get"], {"key": "schema_version"}).fetchone()
                version = int(row[0]) if row else 0
            if version > SCHEMA_VERSION:
                raise SchemaVersionError(
                    f"{self.path!r} has schema version {version}, newer than {SCHEMA_VERSION} "
                    "which this asynccoord understands: upgrade asynccoord"
                )
            for number, script in load_migrations("sqlite"):
                if number > version:
                    for statement in _split_script(script):
                        db.execute(statement)
                    db.execute(Q["meta_set"], {"key": "schema_version", "value": str(number)})
            row = db.execute(Q["meta_get"], {"key": "partitions"}).fetchone()
            if row is None:
                db.execute(Q["meta_set"], {"key": "partitions", "value": str(self.config.partitions)})
            else:
                self._partitions = int(row[0])
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
        """Commit what is queued, then close the connection. Idempotent.

        The store is closed for callers at once; the shutdown itself (checkpointer,
        writer, connection and its thread) runs to its end even if the caller is
        cancelled meanwhile, so a cancelled close leaks nothing. Called from another
        event loop than ``open()``'s (whose writer task ended with that loop), it only
        closes the connections: nothing queued in the old loop can still be waited for.
        """
        conn, writer, checkpointer = self._conn, self._writer, self._checkpointer
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

    def _w(self) -> GroupCommitter:
        if self._writer is None:
            raise StoreClosedError(f"{self!r} is not open: use 'async with' or await open()")
        self._check_loop()
        return self._writer

    def _check_loop(self) -> None:
        if self._loop is not asyncio.get_running_loop():
            raise StoreLoopError(
                f"{self!r} was opened in another event loop (another asyncio.run, thread or test loop) and"
                " serves that loop only: open a store in the loop that uses it"
            )

    async def _write(self, fn: Operation[Any], undo: Callable[[Any], Operation[Any] | None] | None = None) -> Any:
        if self.read_only:
            raise read_only_error(self)
        return await self._w().submit(fn, undo)

    async def _read(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        conn = self._conn
        if conn is None:
            raise StoreClosedError(f"{self!r} is not open: use 'async with' or await open()")
        self._check_loop()
        deadline = time.monotonic() + self.config.busy_timeout_s

        def run() -> Any:
            return retry_busy(lambda: fn(raw_connection(conn)), deadline)

        try:
            return await run_on_thread(conn, run)
        except sqlite3.Error as exc:
            raise map_sqlite_error(exc, "read") from exc

    async def now(self) -> float:
        """The store clock: seconds since the Unix epoch (SQLite's ``julianday('now')``)."""
        writer = self._w()
        return float(await self._read(writer.now))

    # --- enqueue ----------------------------------------------------------------------

    async def enqueue_many(self, tasks: Sequence[NewTask]) -> list[EnqueueResult]:
        """Add tasks in one transaction; a repeated idempotency key returns the existing task.

        Raises:
            InvalidTypeError, InvalidArgumentError, PayloadTooLargeError: before anything is written.
        """
        prepared = prepare_tasks(tasks, self.config, self._partitions)
        if not prepared:
            return []
        await self._check_dimensions(prepared)  # a read, only when a task names limit keys

        def op(db: sqlite3.Connection, now: float) -> list[tuple[bool, _Row]]:
            out: list[tuple[bool, _Row]] = []
            insert, select = Q["insert_task"], Q["select_by_idempotency_key"]
            for p in prepared:
                row = db.execute(
                    insert,
                    {
                        "queue": p.queue,
                        "partition_key": p.partition_key,
                        "partition": p.partition,
                        "idempotency_key": p.idempotency_key,
                        "payload": p.payload_json,
                        "priority": p.priority,
                        "max_attempts": p.max_attempts,
                        "run_at": now + p.delay_s,
                        "now": now,
                        "limit_keys": p.limit_keys_json,
                    },
                ).fetchone()
                if row is not None:
                    out.append((True, row))
                else:
                    existing = db.execute(select, {"queue": p.queue, "idempotency_key": p.idempotency_key}).fetchone()
                    out.append((False, existing))
            return out

        rows: list[tuple[bool, _Row]] = await self._write(op)
        results = [EnqueueResult(task=task_from_row(row), created=created) for created, row in rows]
        self.events.add(ev.DUPLICATE_ENQUEUE_SUPPRESSED, sum(1 for r in results if not r.created))
        notify_created(self.notifier, results, prepared)
        return results

    # --- claim and settle -----------------------------------------------------------

    async def claim(
        self,
        queue: str,
        *,
        node_id: str,
        limit: int = 1,
        lease_s: float = 30.0,
        partitions: Collection[int] | None = None,
        ordered: bool = False,
        min_due_age_s: float = 0.0,
    ) -> list[Task]:
        """Lease up to ``limit`` due tasks to ``node_id`` (see :class:`~asynccoord.contract.protocols.Store`).

        ``min_due_age_s`` > 0 takes only tasks that have been due at least that long
        (work stealing from overloaded or dead partition owners).

        Raises:
            InvalidTypeError, InvalidArgumentError: a bad argument (nothing claimed).
            StoreBusyError: the database stayed locked past ``busy_timeout_s``.
        """
        queue, node_id, limit, lease, parts, ordered = check_claim_args(
            queue, node_id, limit, lease_s, partitions, ordered, self._partitions
        )
        due_age = check_non_negative("min_due_age_s", min_due_age_s)
        if parts is not None and not parts:
            return []
        params = {
            "min_due_age_s": due_age,
            "queue": queue,
            "node_id": node_id,
            "lease_s": lease,
            "limit": limit,
            "token": new_token(),
            "partitions": None if parts is None else json.dumps(parts),
        }
        merged, pending_only = (
            (Q["claim_ordered"], Q["claim_pending_ordered"]) if ordered else (Q["claim"], Q["claim_pending"])
        )

        admissions: dict[str, Admission] = {}  # the limited claim's pass over its buckets, if limited

        def op(db: sqlite3.Connection, now: float) -> _Claimed:
            if ordered:
                _keep_heads(db, queue)
            dead = 0
            promoted: list[tuple[str, int]] = []  # heads that dead letters and duplicates made claimable
            expired, limited = db.execute(Q["claim_probe"], {"queue": queue, "now": now}).fetchone()
            if not expired:
                sql = pending_only
            else:
                sql = merged
                exhausted = db.execute(Q["dead_letter_exhausted"], {"queue": queue, "now": now}).fetchall()
                dead = len(exhausted)
                promoted += _promote_heads(db, [(r[1], r[2]) for r in exhausted])
            if limited:  # rate limits: see ratelimits.claim_limited
                rows, admissions[queue] = claim_limited(db, now, params, ordered)
            else:
                rows = db.execute(sql, {**params, "now": now}).fetchall()
            rows.sort(key=_ID)  # priority DESC, id (two stable sorts on C keys: no tuple per row)
            rows.sort(key=_PRIORITY, reverse=True)
            keyed = [r[0] for r in rows if r[3] is not None]
            if not keyed:
                return rows, 0, dead, now, promoted
            settled = db.execute(Q["settle_duplicate"], {"ids": json.dumps(keyed), "now": now}).fetchall()
            if not settled:
                return rows, 0, dead, now, promoted
            promoted += _promote_heads(db, [(r[1], r[2]) for r in settled])
            duplicates = {r[0] for r in settled}
            return [r for r in rows if r[0] not in duplicates], len(duplicates), dead, now, promoted

        def undo(result: _Claimed) -> Operation[Any] | None:
            rows = result[0]
            if not rows:
                return None
            return self._release_rows_op(rows)

        rows, duplicates, dead, now, promoted = await self._write(op, undo)
        self._after_claim(queue, admissions.get(queue))
        notify_partitions(self.notifier, promoted)  # e.g. the next task of a key whose head was a duplicate
        expires = now + lease
        tasks = [_claimed_task(r, queue, node_id, expires, now) for r in rows]
        self.events.add(ev.CLAIMS, len(tasks))
        self.events.add(ev.LEASE_EXPIRED, sum(map(_RECLAIMED, rows)) + dead)  # reclaimed: 0 or 1; dead expired too
        self.events.add(ev.DEAD_LETTERED, dead)
        self.events.add(ev.DUPLICATE_DELIVERY_SUPPRESSED, duplicates)
        return tasks

    async def claimable_partitions(
        self,
        queue: str,
        partitions: Collection[int] | None = None,
        *,
        ordered: bool = False,
        min_due_age_s: float = 0.0,
    ) -> set[int]:
        """The partitions where a claim with these arguments would find work now (a read).

        See :meth:`~asynccoord.contract.protocols.QueueStore.claimable_partitions`. One
        statement on the connection's thread between the writer's batches, outside any
        write transaction: it takes no write lock and no place in a group commit.

        Raises:
            InvalidTypeError, InvalidArgumentError: a bad argument.
            StoreClosedError: the store is not open.
        """
        parts, due_age = check_claimable_args(queue, partitions, ordered, min_due_age_s, self._partitions)
        if parts is not None and not parts:
            return set()
        writer = self._w()
        params = {"queue": queue, "min_due_age_s": due_age, "partitions": None if parts is None else json.dumps(parts)}

        def read(db: sqlite3.Connection) -> list[_Row]:
            sql = Q["claimable_partitions"]
            # Heads are kept only for queues claimed in order at least once; before the
            # first ordered claim every due task counts (the claim computes the heads).
            if ordered and db.execute(Q["ordered_queues"], {"queues": json.dumps([queue])}).fetchone() is not None:
                sql = Q["claimable_partitions_ordered"]
            return db.execute(sql, {**params, "now": writer.now(db)}).fetchall()

        return {int(r[0]) for r in await self._read(read)}

    def _release_rows_op(self, rows: Sequence[_Row]) -> Operation[None]:
        keys = [{"id": r[0], "lease_token": r[9], "version": r[10], "delay_s": 0.0} for r in rows]

        def op(db: sqlite3.Connection, now: float) -> None:
            sql = Q["release"]
            for k in keys:
                db.execute(sql, {**k, "now": now}).fetchall()

        return op

    async def _settle(
        self,
        task: Task,
        sql: str,
        params: dict[str, Any],
        extra: Callable[[sqlite3.Connection, float, Task], None] | None = None,
    ) -> Task:
        key = {"id": task.id, "lease_token": task.lease_token, "version": task.version}

        def op(db: sqlite3.Connection, now: float) -> tuple[_Row | None, str | None]:
            row = db.execute(sql, {**key, **params, "now": now}).fetchone()
            if row is None:
                return None, _lost_reason(db, task, now)
            if extra is not None:
                extra(db, now, task)
            return row, None

        row, reason = await self._write(op)
        if row is None:
            if reason is None:
                raise TaskNotFoundError(task.id)
            self.events.add(ev.STALE_COMMIT_REJECTED)
            raise LeaseLostError(task.id, reason)
        return task_from_row(row)

    async def complete_many(
        self,
        tasks: Sequence[Task],
        results: Sequence[Any] | None = None,
        *,
        fences: Sequence[tuple[str, int] | None] | None = None,
    ) -> list[Task | CoordError]:
        """Complete many tasks in one transaction, each with its own compare-and-set.

        Args:
            tasks: Tasks as returned by ``claim`` (any mix of queues and leases).
            results: One JSON result per task, or None for no results.
            fences: Per task, None or ``(resource, fencing_token)`` checked and recorded
                in the same transaction (see :meth:`complete`); None for no fences.

        Returns:
            Per task, in order: the done task, or the error saying why nothing was
            written for it (:class:`LeaseLostError`, :class:`TaskNotFoundError`, or
            :class:`FencingTokenRejectedError`). One task's failure does not stop the others.

        Raises:
            InvalidTypeError, InvalidArgumentError: a bad task or result (nothing written).
        """
        checked = check_tasks(tasks)
        encoded = encode_results(results, len(checked), self.config)
        fenced = check_fences(fences, len(checked))
        if not checked:
            return []
        done, _ = await self._complete(checked, encoded, fenced)
        return done

    async def complete_and_claim_next(
        self,
        task: Task,
        result: Any = None,
        *,
        fence: tuple[str, int] | None = None,
        lease_s: float = 30.0,
    ) -> Continuation:
        """Complete ``task`` and lease its key's next task in the same transaction.

        See :meth:`~asynccoord.contract.protocols.QueueStore.complete_and_claim_next`. The
        commit and the lease of the next task are one operation of the group commit.

        Raises:
            LeaseLostError, TaskNotFoundError, FencingTokenRejectedError: as :meth:`complete`;
                nothing written or leased.
            InvalidTypeError, InvalidArgumentError: bad arguments (nothing written).
        """
        checked, encoded, fenced, lease, owner = check_continuation(task, result, fence, lease_s, self.config)
        done, next_task = await self._complete(checked, encoded, fenced, (owner, lease))
        outcome = done[0]
        if not isinstance(outcome, Task):
            raise outcome
        return Continuation(done=outcome, next_task=next_task)

    async def _complete(
        self,
        checked: list[Task],
        encoded: list[str | None],
        fenced: list[tuple[str, int] | None] | None,
        continuation: tuple[str, float] | None = None,
    ) -> tuple[list[Task | CoordError], Task | None]:
        """complete_many's transaction; with ``continuation`` ``(owner, lease_s)``, also lease
        the first task's key's next head to ``owner``."""
        rows = [[t.id, t.lease_token, t.version, r] for t, r in zip(checked, encoded, strict=True)]
        head = checked[0]

        def op(db: sqlite3.Connection, now: float) -> _Completed:
            refused: dict[int, int] = {}
            if fenced is not None:  # refuse outdated tokens first (read only)...
                for t, f in zip(checked, fenced, strict=True):
                    if f is not None:
                        row = db.execute(Q["fence_get"], {"resource": f[0]}).fetchone()
                        if row is not None and f[1] < row[1]:
                            refused[t.id] = int(row[1])
            batch = json.dumps([r for r in rows if r[0] not in refused], separators=(",", ":"))
            done = db.execute(Q["complete_batch"], {"batch": batch, "now": now}).fetchall()
            matched = {(r[0], r[1]) for r in done}
            won = []  # per copy: its compare-and-set matched (one copy per match: a repeated copy lost)
            for t in checked:
                hit = (t.id, t.version + 1) in matched
                matched.discard((t.id, t.version + 1))
                won.append(hit)
            promoted = _promote_heads(db, [(r[2], r[3]) for r in done])  # the stored key, not the caller's
            if fenced is not None:  # ...and record the tokens of the commits that went through
                for f, w in zip(fenced, won, strict=True):
                    if f is not None and w:
                        check_fence(db, now, f[0], f[1])
            records = [[r[2], r[4]] for r in done if r[4] is not None]  # the stored keys, not the caller's
            if records:
                db.execute(Q["record_processed_batch"], {"records": json.dumps(records), "now": now})
            out: list[int | str | None] = [
                t.version + 1 if w else (None if t.id in refused else _lost_reason(db, t, now))
                for t, w in zip(checked, won, strict=True)
            ]
            following: _Row | None = None
            duplicates = 0
            queue = head.queue
            if continuation is not None and won[0]:
                # the stored key (as the promotion uses), never the caller's copy of the task
                queue, key = next((r[2], r[3]) for r in done if r[0] == head.id)
                params = {
                    "queue": queue,
                    "partition_key": key,
                    "node_id": continuation[0],
                    "lease_s": continuation[1],
                    "token": new_token(),
                }
                following, duplicates, promoted = _claim_key_head(db, now, params, promoted)
            return now, out, refused, promoted, following, duplicates, queue

        def undo(result: _Completed) -> Operation[Any] | None:
            following = result[4]
            return None if following is None else self._release_rows_op([following])

        now, outcomes, refused, promoted, following, duplicates, next_queue = await self._write(op, undo)
        done: list[Task | CoordError] = []
        for i, (task, result_json, outcome) in enumerate(zip(checked, encoded, outcomes, strict=True)):
            if task.id in refused:
                fence = None if fenced is None else fenced[i]
                assert fence is not None
                done.append(fence_rejected_error(fence[0], fence[1], refused[task.id]))
            elif isinstance(outcome, int):
                done.append(settled_done(task, version=outcome, now=now, result=decode_json(result_json)))
            elif outcome is None:
                done.append(TaskNotFoundError(task.id))
            else:
                done.append(LeaseLostError(task.id, outcome))
        committed = sum(1 for d in done if isinstance(d, Task))
        self.events.add(ev.COMMITS, committed)
        notify_partitions(self.notifier, promoted)  # the keys' next tasks, claimable now
        self.events.add(ev.STALE_COMMIT_REJECTED, sum(1 for d in done if isinstance(d, LeaseLostError)))
        self.events.add(ev.FENCING_REJECTED, len(refused))
        next_task = None
        if following is not None:
            assert continuation is not None
            owner, lease_s = continuation
            next_task = _claimed_task(following, next_queue, owner, now + lease_s, now)
            self.events.add(ev.CLAIMS)
        self.events.add(ev.DUPLICATE_DELIVERY_SUPPRESSED, duplicates)
        return done, next_task

    async def fail(self, task: Task, error: str, *, retry: Any = None) -> Task:
        """Record a failed attempt: pending again after the backoff, or dead after the last.

        Args:
            task: The task as returned by ``claim``.
            error: What went wrong (kept as ``last_error``; truncated to 8192 characters).
            retry: A :class:`~asynccoord.config.RetryPolicy` for the delay; default the store's.
                Its ``max_attempts`` is not used: the task's own, fixed at enqueue, is.

        Raises:
            LeaseLostError: the lease is no longer the caller's; nothing written.
            InvalidTypeError: bad ``task``, ``error`` or ``retry``.
        """
        check_task(task)
        text = clean_error(error)
        policy = check_retry(retry, self.config)
        task = with_stored_fields(task, await self.get(task.id))  # never the caller's counts or key
        if task.attempts >= task.max_attempts:
            promoted: list[tuple[str, int]] = []
            out = await self._settle(
                task,
                Q["dead_letter"],
                {"error": text},
                lambda db, _now, t: promoted.extend(_promote_heads(db, [(t.queue, t.partition_key)])),
            )
            notify_partitions(self.notifier, promoted)
            self.events.add(ev.DEAD_LETTERED)
        else:
            delay = policy.delay_s(max(task.attempts, 1))
            out = await self._settle(task, Q["retry"], {"error": text, "delay_s": delay})
            self.events.add(ev.RETRIES)
        return out

    async def release(self, task: Task, *, delay_s: float = 0.0) -> Task:
        """Hand the task back to pending without counting the attempt.

        Args:
            task: The task as returned by ``claim``.
            delay_s: Seconds before it is due again (>= 0). Default 0: due now.

        Raises:
            LeaseLostError: the lease is no longer the caller's; nothing written.
        """
        check_task(task)
        delay = check_non_negative("delay_s", delay_s)
        out = await self._settle(task, Q["release"], {"delay_s": delay})
        if delay == 0:
            self.notifier.notify(out.queue, 1, (out.partition,))
        return out

    async def extend(self, task: Task, lease_s: float) -> float:
        """Renew the lease to ``lease_s`` seconds from now; return the new expiry (store clock).

        An expired lease is never revived, even when nobody reclaimed the task.

        Raises:
            LeaseLostError: the lease expired or was taken.
        """
        check_task(task)
        lease = check_lease_s("lease_s", lease_s)
        key = {"id": task.id, "lease_token": task.lease_token, "version": task.version, "lease_s": lease}

        def op(db: sqlite3.Connection, now: float) -> tuple[float | None, str | None]:
            row = db.execute(Q["extend"], {**key, "now": now}).fetchone()
            if row is None:
                return None, _lost_reason(db, task, now)
            return float(row[0]), None

        expiry, reason = await self._write(op)
        if expiry is None:
            if reason is None:
                raise TaskNotFoundError(task.id)
            raise LeaseLostError(task.id, reason)
        return float(expiry)

    async def extend_many(self, tasks: Sequence[Task], lease_s: float) -> list[bool]:
        """Renew many leases with one statement; True for each lease still held.

        Raises:
            InvalidTypeError, InvalidArgumentError: a bad task or ``lease_s``.
        """
        checked = check_tasks(tasks)
        lease = check_lease_s("lease_s", lease_s)
        if not checked:
            return []
        leases = json.dumps([[t.id, t.lease_token] for t in checked])

        def op(db: sqlite3.Connection, now: float) -> set[tuple[int, str]]:
            rows = db.execute(Q["extend_many"], {"leases": leases, "lease_s": lease, "now": now}).fetchall()
            return {(r[0], r[1]) for r in rows}

        renewed: set[tuple[int, str]] = await self._write(op)
        # By (id, token): a stale lease passed beside the live one on the same task stays False.
        return [(t.id, t.lease_token) in renewed for t in checked]

    # --- unchecked operations (benchmarks only) ------------------------------------------

    async def unchecked_claim(
        self,
        queue: str,
        *,
        node_id: str,
        limit: int = 1,
        lease_s: float = 30.0,
        partitions: Collection[int] | None = None,
    ) -> list[Task]:
        """Claim as a naive queue does: read due tasks, then mark them running, unconditionally.

        The read and the write are separate transactions, so two nodes can claim the
        same task. Exists only so benchmarks can show what the version layer buys;
        never use it to process real work.
        """
        queue, node_id, limit, lease, parts, _ = check_claim_args(
            queue, node_id, limit, lease_s, partitions, False, self._partitions
        )
        writer = self._w()
        parts_json = None if parts is None else json.dumps(parts)

        def read(db: sqlite3.Connection) -> list[int]:
            now = writer.now(db)
            params = {"queue": queue, "limit": limit, "partitions": parts_json, "now": now}
            return [r[0] for r in db.execute(Q["unchecked_peek"], params).fetchall()]

        ids = await self._read(read)
        if not ids:
            return []
        params = {"ids": json.dumps(ids), "node_id": node_id, "lease_s": lease, "token": new_token()}

        def op(db: sqlite3.Connection, now: float) -> list[_Row]:
            return db.execute(Q["unchecked_claim"], {**params, "now": now}).fetchall()

        rows: list[_Row] = await self._write(op)
        self.events.add(ev.CLAIMS, len(rows))
        return [task_from_row(r) for r in rows]

    async def unchecked_complete(self, tasks: Sequence[Task], results: Sequence[Any] | None = None) -> int:
        """Mark tasks done without any compare-and-set (benchmarks only); return rows written."""
        checked = check_tasks(tasks)
        encoded = encode_results(results, len(checked), self.config)
        items = [{"id": t.id, "result": r} for t, r in zip(checked, encoded, strict=True)]

        def op(db: sqlite3.Connection, now: float) -> int:
            done = [db.execute(Q["unchecked_complete"], {**item, "now": now}).fetchone() for item in items]
            _promote_heads(db, [(r[0], r[1]) for r in done if r is not None])
            return sum(1 for r in done if r is not None)

        written = int(await self._write(op))
        self.events.add(ev.COMMITS, written)
        return written

    # --- inspection and maintenance ---------------------------------------------------

    async def get(self, task_id: int) -> Task:
        """The task with that id.

        Raises:
            TaskNotFoundError: no such task.
            InvalidTypeError: ``task_id`` is not an int.
        """
        check_int("task_id", task_id, minimum=0, maximum=MAX_ID)
        row = await self._read(lambda db: db.execute(Q["select_task"], {"id": task_id}).fetchone())
        if row is None:
            raise TaskNotFoundError(task_id)
        return task_from_row(row)

    async def stats(self, queue: str | None = None) -> QueueStats:
        """Counts by status and the oldest due pending age (store clock), for ``queue`` or all."""
        if queue is not None:
            check_name("queue", queue)
        writer = self._w()

        def read(db: sqlite3.Connection) -> tuple[list[_Row], Any, float]:
            now = writer.now(db)
            counts = db.execute(Q["stats_counts"], {"queue": queue}).fetchall()
            oldest_sql = Q["stats_oldest_pending"] if queue is not None else Q["stats_oldest_pending_all"]
            oldest = db.execute(oldest_sql, {"queue": queue, "now": now}).fetchone()[0]
            return counts, oldest, now

        counts, oldest, now = await self._read(read)
        by_status = {s: 0 for s in TaskStatus}
        for status, n in counts:
            by_status[TaskStatus(status)] = n
        age = None if oldest is None else max(0.0, now - float(oldest))
        return QueueStats(counts=by_status, oldest_pending_age_s=age)

    async def is_drained(self, queue: str) -> bool:
        """True when ``queue`` has no pending and no running task: one probe of ``coord_tasks_key_order``."""
        check_name("queue", queue)

        def read(db: sqlite3.Connection) -> bool:
            return db.execute(Q["queue_unfinished"], {"queue": queue}).fetchone() is None

        return bool(await self._read(read))

    async def requeue_dead(self, queue: str, task_ids: Sequence[int] | None = None) -> int:
        """Move dead tasks of ``queue`` (all, or those ids) back to pending; return how many."""
        check_name("queue", queue)
        ids: str | None = None
        checked_ids = check_task_ids(task_ids)
        if checked_ids is not None:
            ids = json.dumps(checked_ids)

        def op(db: sqlite3.Connection, now: float) -> int:
            rows = db.execute(Q["requeue_dead"], {"queue": queue, "ids": ids, "now": now}).fetchall()
            if rows:
                keys = sorted({(r[1], r[2]) for r in rows})
                db.execute(Q["recompute_heads"], {"keys": json.dumps(keys)})
            return len(rows)

        return int(await self._write(op))

    async def is_processed(self, consumer: str, message_id: str) -> bool:
        """Whether ``(consumer, message_id)`` has a processed-id record (consumer = queue name)."""
        check_name("consumer", consumer)
        check_name("message_id", message_id, allow_blank=True)
        row = await self._read(
            lambda db: db.execute(Q["is_processed"], {"consumer": consumer, "message_id": message_id}).fetchone()
        )
        return row is not None

    async def purge_processed(self, *, older_than_s: float | None = None, batch: int | None = None) -> PurgeResult:
        """Delete processed-id records older than ``older_than_s`` (default: the retention).

        Each batch is its own short transaction, so a large purge never holds the
        write lock for long.

        Args:
            older_than_s: Age cutoff, seconds (>= 0); default ``config.processed.retention_s``.
            batch: Rows per delete statement, 1..2**31 - 1 (``validation.MAX_PURGE_BATCH``);
                default ``config.processed.purge_batch``.
        """
        age = (
            self.config.processed.retention_s
            if older_than_s is None
            else check_non_negative("older_than_s", older_than_s)
        )
        size = self.config.processed.purge_batch if batch is None else check_purge_batch(batch)
        return await self._purge(Q["purge_processed_batch"], {"batch": size}, age, size)

    async def purge_finished(self, queue: str, *, older_than_s: float, batch: int = 1000) -> PurgeResult:
        """Delete ``done`` tasks of ``queue`` last updated more than ``older_than_s`` ago.

        Dead tasks are kept (they wait for a person). Processed-id records are kept
        by their own retention, so a redelivery after this purge is still recognized.
        """
        check_name("queue", queue)
        age = check_non_negative("older_than_s", older_than_s)
        size = check_purge_batch(batch)
        return await self._purge(Q["purge_finished_batch"], {"batch": size, "queue": queue}, age, size)

    async def _purge(self, sql: str, params: dict[str, Any], age: float, size: int) -> PurgeResult:
        deleted = batches = 0
        while True:

            def op(db: sqlite3.Connection, now: float) -> int:
                return db.execute(sql, {**params, "cutoff": now - age}).rowcount

            n = int(await self._write(op))
            if n > 0:
                deleted += n
                batches += 1
            if n < size:
                return PurgeResult(deleted=deleted, batches=batches)


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

    The writer and checkpointer tasks ran on that loop: they are cancelled there if it
    still runs (they ended with it otherwise) and never awaited from here. The
    connections are closed by :func:`close_abandoned` (their threads may have died with
    that loop).
    """
    for task in (writer.task if writer is not None else None, checkpointer.task if checkpointer is not None else None):
        if task is not None and not task.done() and not task.get_loop().is_closed():
            task.get_loop().call_soon_threadsafe(task.cancel)
    for c in (checkpointer.connection if checkpointer is not None else None, conn):
        if c is not None:
            await close_abandoned(c)


def _promote_heads(db: sqlite3.Connection, keys: Sequence[tuple[str, str]]) -> list[tuple[str, int]]:
    """After tasks of these ``(queue, partition_key)`` left the active set: mark each key's new head.

    Only queues claimed in order keep heads (``coord_ordered_queues``, read in the same
    write transaction, so a queue another process has just marked is seen). Returns the
    ``(queue, partition)`` of every new head: the work this change made claimable.
    """
    if not keys:
        return []
    queues = sorted({k[0] for k in keys})
    ordered = {r[0] for r in db.execute(Q["ordered_queues"], {"queues": json.dumps(queues)})}
    if not ordered:
        return []
    keys = [k for k in keys if k[0] in ordered]
    return db.execute(Q["promote_heads"], {"keys": json.dumps(sorted(set(keys)))}).fetchall()


def _keep_heads(db: sqlite3.Connection, queue: str) -> None:
    """Make ``queue`` keep per-key heads from now on (first ordered use: computed from scratch)."""
    if db.execute(Q["mark_ordered"], {"queue": queue}).rowcount:
        db.execute(Q["recompute_queue_heads"], {"queue": queue})  # heads were not kept until now


def _claim_key_head(
    db: sqlite3.Connection, now: float, params: dict[str, Any], promoted: list[tuple[str, int]]
) -> tuple[_Row | None, int, list[tuple[str, int]]]:
    """Lease the head of one key (commit-and-continue); return its row, duplicates settled, promotions.

    The queue keeps heads from now on (as after an ordered claim). A head whose message id
    is already processed is settled as a duplicate, and the key's following head is not
    leased (it is announced instead, as a claim does).
    """
    queue = params["queue"]
    _keep_heads(db, queue)
    row: _Row | None = db.execute(Q["claim_key_head"], {**params, "now": now}).fetchone()
    if row is None:
        return None, 0, promoted
    # The leased head is this caller's now: nobody else need wake for it.
    promoted = [p for p in promoted if p != (queue, row[2])]
    if row[3] is None:
        return row, 0, promoted
    settled = db.execute(Q["settle_duplicate"], {"ids": json.dumps([row[0]]), "now": now}).fetchall()
    if not settled:
        return row, 0, promoted
    return None, 1, promoted + _promote_heads(db, [(r[1], r[2]) for r in settled])


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
