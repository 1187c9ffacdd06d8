"""The multi-machine store: PostgreSQL through asyncpg (extra ``postgres``).

One :class:`PostgresStore` per process and database; any number of nodes in the
process share it (and its connection pool), and any number of processes on any number
of machines open the same database. Semantics are those of the storage contract
(:mod:`asynccoord.contract.protocols`), the same as the SQLite and in-memory stores; the
contract test suite runs unchanged on all of them.

How the contract is kept under concurrent transactions (READ COMMITTED):

* **Claims** are one statement, ``UPDATE ... WHERE id = ANY(ARRAY(SELECT ... FOR UPDATE
  SKIP LOCKED LIMIT n)) RETURNING ...``: claimers never wait for each other and never take
  the same task. They scan partial indexes of pending tasks (of pending heads, per
  partition, for ordered claims) and of running tasks for expired leases, so a claim
  visits about what it returns however many tasks are in flight (schema version 5).
* **Per-key ordering** is kept by the ``is_head`` column (the earliest active task of a
  ``(queue, partition_key)``; ordered claims scan only heads), in the queues that keep
  heads: since schema version 9 only queues claimed in order (``coord_ordered_queues``; the
  first ordered claim or continuation of a queue computes its heads, ``coord_keep_heads``),
  so a queue that nodes claim without order pays no key lock and no promotion (its active
  tasks' ``is_head`` is NULL, outside the index that only head upkeep reads). The database
  enforces at most one head per key (unique partial index ``coord_tasks_one_head``), and
  every transition that changes a key's active set (enqueue, complete, dead-letter,
  requeue) first takes a shared advisory lock on its queue (which that first ordered claim
  takes exclusively) and, if the queue keeps heads, the key's row lock in
  ``coord_task_keys`` (sorted), so head upkeep always sees the committed state of the key,
  never a racy snapshot. Promotion finds a key's earliest active task as the lower of its
  head and its earliest active task that is not one (``coord_tasks_key_order`` holds only
  those since schema version 7, so a promotion or a head's claim writes no entry there).
* **Commits** are compare-and-set on ``(id, lease_token, version)`` plus a live lease,
  fenced (``fences=``) in the same transaction: the queues' shared locks are taken first,
  then the row locks of the keys of queues that keep heads, then the fence rows.
  Concurrent ``complete`` calls of a process are group-committed: one transaction per
  batch of whatever is waiting, and one statement, the server-side function
  ``coord_complete_batch`` (schema version 6), so a batch costs one round trip.
* **Commit-and-continue** (``complete_and_claim_next``) rides the same batch: since schema
  version 8 the function also leases, for each continuing task, its key's next head to the
  task's owner, in the commit's statement and transaction, and notifies nobody of it.
* **Time** is the server's clock (``coord_now()``, i.e. ``statement_timestamp()``), for
  every lease, run_at and heartbeat; machines never compare their own clocks.
* **Connection loss** is retried with backoff at one boundary (:mod:`._pgconn`); a
  commit whose outcome is unknown is repeated safely (compare-and-set, and a retried
  commit recognizes its own earlier success), so nothing is lost or committed twice.
  When retries give up, :class:`~asynccoord.errors.StoreConnectionError` is raised.
* **Wake-ups** cross processes with LISTEN/NOTIFY: an enqueue of due tasks, or a commit
  that unblocks a key, notifies the store's channel with the queue, the count and the
  partitions; each process' listener wakes at most that many of its idle nodes that own
  one of the partitions (polling with backoff stays as the fallback). A commit's
  notification names exactly the keys' heads it promoted and did not lease to a
  continuation, and wakes the committing process's own nodes too (a conversation that
  ended, or one continued by its node, wakes nobody); an enqueue wakes its own process's
  nodes at once and the listener ignores its echo.

Payloads and results are JSON kept as ``text`` (``jsonb`` cannot hold ``\\u0000`` and
reorders keys). Migrations (``sql/postgres/migration_NNNN.sql``) are applied at open
under an advisory lock; a database of a newer schema is refused with
:class:`~asynccoord.errors.SchemaVersionError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import re
import urllib.parse
from collections.abc import Awaitable, Callable, Collection, Coroutine, Sequence
from typing import Any, Self, TypeAlias, TypeVar

import asyncpg

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
    notify_settled,
    prepare_tasks,
    settled_done,
    task_from_row,
    with_stored_fields,
)
from ...errors import (
    CoordError,
    FencingTokenRejectedError,
    InvalidArgumentError,
    InvalidTypeError,
    LeaseLostError,
    ReadOnlyStoreError,
    SchemaVersionError,
    TaskNotFoundError,
)
from ...events import EventCounter
from ...models import Continuation, EnqueueResult, NewTask, PurgeResult, QueueStats, Task, TaskStatus
from ...monitor.histogram import LatencyRecorder
from ...notify import WorkNotifier
from ...validation import (
    check_bool,
    check_clock,
    check_int,
    check_lease_s,
    check_name,
    check_non_negative,
    check_positive,
)
from ..batch import Batcher
from ..open import redact_location, redact_target, userinfo_spills
from ..sqlfiles import load_migrations
from .conn import (
    Connector,
    PgListener,
    PgRunner,
    RetryTransaction,
    encode_notification,
    map_pg_error,
)
from .deadletters import PostgresDeadLetterOps
from .locks import PostgresLockOps
from .membership import PostgresMembershipOps
from .monitor import PostgresMonitorOps
from .query import load_pg_queries

__all__ = ("MAX_POOL_SIZE", "SCHEMA_VERSION", "PostgresStore", "split_connect_timeout")

log = logging.getLogger(__name__)

T = TypeVar("T")
Q = load_pg_queries()
SCHEMA_VERSION = len(load_migrations("postgres"))
MIGRATION_LOCK_KEY = 0x6173_796E_6363_6F6F
"""Advisory lock id held while migrating (``b"asynccoo"``): one migrator at a time."""
MAX_POOL_SIZE = 262_143
"""Largest ``pool_min_size``/``pool_max_size``: PostgreSQL's own ceiling on ``max_connections``
(a larger pool could never fill, and asyncpg sets aside memory for every place in it)."""

STORE_RETRIES = ev.STORE_RETRIES
"""Event: a statement was retried after a lost connection or a conflict."""

_Row: TypeAlias = Any  # an asyncpg.Record: indexable by column position


def _lost_reason(row: _Row | None, task: Task) -> str | None:
    """Why a compare-and-set on ``task`` matched nothing (``row`` is the stored task); None if gone."""
    if row is None:
        return None
    status, token, expires, version = row[7], row[12], row[13], row[14]
    if status != TaskStatus.RUNNING:
        return f"task is {status} (version {version}, caller had version {task.version})"
    if token != task.lease_token:
        return f"task was reclaimed by {row[11]!r} under another lease (version {version})"
    if version != task.version:
        return f"version is {version}, caller had {task.version}"
    return f"lease expired at {expires:.3f} (store clock)"


def _settled_by_us(row: _Row | None, task: Task, status: TaskStatus) -> bool:
    """After a retry: whether ``row`` is the state our earlier, unacknowledged write left.

    Only the lease holder moves a task from ``(running, version v)`` to ``status`` at
    version ``v + 1``: any other transition first bumps the version.
    """
    return row is not None and row[7] == status and row[14] == task.version + 1


def _keys(pairs: Collection[tuple[str, str]]) -> dict[str, list[str]]:
    """Sorted distinct ``(queue, partition_key)`` pairs as the two arrays lock_keys takes."""
    ordered = sorted(set(pairs))
    return {"queues": [q for q, _ in ordered], "keys": [k for _, k in ordered]}


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _channel(schema: str | None) -> str:
    base = "asynccoord" if schema is None else f"asynccoord.{schema}"
    if len(base.encode()) <= 63:
        return base
    return "asynccoord." + hashlib.sha1(base.encode()).hexdigest()[:40]


def _check_dsn(dsn: str) -> None:
    """Refuse a DSN that asyncpg could not parse, naming it with its password hidden.

    Checks what can be checked without I/O: no NUL character (raw or ``%00``: libpq's
    strings cannot hold one), the URL syntax (a bracketed IPv6 host), and that each port of
    the host list (``host:port,host:port``) and of a ``port=`` query parameter is empty or
    1..65535.

    Raises:
        InvalidArgumentError: the DSN is malformed.
    """
    if "\x00" in dsn or "%00" in dsn:
        raise InvalidArgumentError(
            f"malformed PostgreSQL DSN {redact_target(dsn.replace(chr(0), '%00'))!r}: a NUL character"
        )
    try:
        parts = urllib.parse.urlsplit(dsn)
    except ValueError as exc:  # "Invalid IPv6 URL"
        raise InvalidArgumentError(f"malformed PostgreSQL DSN {redact_target(dsn)!r}: {exc}") from None
    netloc = parts.netloc
    if "@" not in netloc and "@" in parts.path:  # "user:Ab/cd@host": the "/" ended the host part
        raise InvalidArgumentError(
            f"malformed PostgreSQL DSN {redact_target(dsn)!r}: a '/' before the '@' "
            "(percent-encode it in the user name and password)"
        )
    hostlist = netloc.rpartition("@")[2]
    shown = "a host part that may hold a password (not shown)" if userinfo_spills(dsn) else ""
    for spec in hostlist.split(",") if hostlist else ():
        match = re.fullmatch(r"(\[[^\]]+\]|[^:\[\]]*)(?::(.*))?", spec)
        port = None if match is None else match.group(2)
        if match is None or not _valid_port(port):
            raise InvalidArgumentError(
                f"malformed PostgreSQL DSN {redact_target(dsn)!r}: "
                f"expected host, host:PORT or [IPv6]:PORT (PORT 1..65535), got {shown if shown else spec!r}"
            )
    for name, value in urllib.parse.parse_qsl(parts.query, keep_blank_values=True):
        if name == "port" and not all(_valid_port(p) for p in value.split(",")):
            raise InvalidArgumentError(
                f"malformed PostgreSQL DSN {redact_target(dsn)!r}: port={value!r} (each port 1..65535)"
            )


_CONNECT_TIMEOUT_S = 10.0
"""How long opening a connection may take, seconds, unless the DSN's ``connect_timeout`` says otherwise."""


def split_connect_timeout(dsn: str) -> tuple[str, float | None]:
    """Take libpq's ``connect_timeout`` query parameter out of ``dsn``, which asyncpg does not know.

    asyncpg would send it to the server as a setting, and the connection would fail. It is
    read as libpq reads it (PostgreSQL's documentation, "Parameter Key Words"): whole seconds,
    zero or less waits for ever, and 1 means 2 (libpq's least). For code that opens asyncpg
    connections of its own from a DSN the store accepts (the demo, the benchmarks):
    ``asyncpg.connect(dsn, timeout=timeout_s)`` with what this returns.

    Args:
        dsn: A ``postgresql://`` DSN (query parameters separated by ``&``, as asyncpg reads them).

    Returns:
        ``(dsn, timeout_s)``: the DSN without the parameter (unchanged if it had none), and the
        connect timeout in seconds: the parameter's (None: no limit), or 10.0 without one.

    Raises:
        InvalidArgumentError: the DSN is malformed (as :class:`PostgresStore` checks it), or the
            parameter is not a whole number of at most 2**31 - 1, or is given twice. The message
            shows the value only when it is a short run of digits, signs, dots and spaces: a
            value that swallowed other parameters (``connect_timeout=x;password=...``) is not
            echoed.
    """
    _check_dsn(dsn)  # a password holding a "?" is refused here, before anything below shows a piece of it
    base, sep, query = dsn.partition("?")
    if not sep:
        return dsn, _CONNECT_TIMEOUT_S
    kept: list[str] = []
    values: list[str] = []
    for field in query.split("&"):
        name, _, value = field.partition("=")
        if urllib.parse.unquote_plus(name) == "connect_timeout":
            values.append(urllib.parse.unquote_plus(value))
        else:
            kept.append(field)
    if not values:
        return dsn, _CONNECT_TIMEOUT_S
    shown = redact_target(base) + "?..."  # the query holds the bad value: not shown (see below)
    if len(values) > 1:
        raise InvalidArgumentError(f"malformed PostgreSQL DSN {shown!r}: connect_timeout given {len(values)} times")
    text = values[0].strip(" \t\n\r\f\v")  # C's isspace(), as libpq's strtol() skips
    if not re.fullmatch(r"[+-]?[0-9]{1,20}", text) or abs(int(text)) > 2**31 - 1:  # libpq's int
        value = repr(values[0]) if re.fullmatch(r"[0-9.+\- ]{0,16}", values[0]) else "(not shown)"
        raise InvalidArgumentError(
            f"malformed PostgreSQL DSN {shown!r}: connect_timeout={value} must be whole seconds "
            "(at most 2147483647), as libpq reads it"
        )
    seconds = int(text)
    stripped = base + ("?" + "&".join(kept) if kept else "")
    return stripped, None if seconds <= 0 else float(max(2, seconds))


_SETTLE_S = 2.0
"""Longest ``close()`` waits for connection attempts that cancelled calls left running, seconds."""


def _valid_port(port: str | None) -> bool:
    """Whether a DSN's port is absent, empty or 1..65535 (ASCII digits)."""
    return not port or (port.isascii() and port.isdigit() and 0 < int(port) <= 65535)


class PostgresStore(
    QueueConveniences, PostgresLockOps, PostgresMembershipOps, PostgresMonitorOps, PostgresDeadLetterOps
):
    """The whole storage contract on one PostgreSQL database (queue, locks, membership, monitor).

    Use as ``async with PostgresStore("postgresql://user@host/db") as store: ...`` or
    call :meth:`open` / :meth:`close`. Methods are those of
    :class:`asynccoord.contract.protocols.Store` (plus ``LockStore``, ``MembershipStore`` and
    ``MonitorStore``), with the same semantics as :class:`~asynccoord.SQLiteStore`.

    Args:
        dsn: A libpq connection URI, ``postgresql://user:password@host:port/database``.
            Its query parameters are asyncpg's (``sslmode``, ...; others are sent to the
            server as settings), and libpq's ``connect_timeout`` (whole seconds, <= 0 for
            no limit; default 10 s): how long opening one connection may take.
        config: Store settings; default :class:`~asynccoord.config.StoreConfig`
            (``max_batch_ops`` bounds a group-committed batch; the SQLite-only fields
            are ignored).
        clock: Test hook: a function returning the store clock (seconds) used instead
            of the server's clock. Every store on the database must then use the same
            clock. Default None (the server clock).
        schema: Keep the tables in this schema (created if missing) instead of the
            connection's default ``search_path``: several independent stores in one
            database (the tests use one schema per test). ``pg_*`` and
            ``information_schema`` are refused. Default None. Wake-ups go on a channel of
            the schema the tables are in (``asynccoord.<schema>``), however it was chosen:
            stores reaching the same tables through ``schema=`` and through a DSN's
            ``search_path`` wake each other.
        pool_min_size: Connections kept open by the pool (0..:data:`MAX_POOL_SIZE`). Default 1.
        pool_max_size: Most connections of the pool (1..:data:`MAX_POOL_SIZE`, >= pool_min_size).
            Default 10.
        listen: Keep one more connection LISTENing for work notifications of other
            processes (wakes idle nodes at once). Default True.
        reconnect_timeout_s: How long an operation retries a lost connection (or a
            conflict) with backoff before raising, seconds (> 0). Default 10.
        read_only: Apply no migration and refuse every write with
            :class:`~asynccoord.errors.ReadOnlyStoreError` (for inspection). Default False.
        idle_in_transaction_timeout_s: The server ends a session of this store left idle
            inside a transaction this long (PostgreSQL's
            ``idle_in_transaction_session_timeout``), seconds (> 0, at most 2,147,483:
            24.8 days). Default 30. The
            store's transactions never wait between statements for anything but the
            client; a client frozen (SIGSTOP, a stalled host) or cut off mid-transaction
            would otherwise hold its row locks, and the shared lock of its queue, until TCP
            gives up (hours): a queue's first ordered claim waits for those shared locks,
            and every transition of the queue behind it. If the client comes back, it meets
            a lost connection: retried where no doubt about the outcome can arise; at the
            commit of a call that is not safe to repeat (an enqueue of tasks without
            idempotency keys), :class:`~asynccoord.errors.StoreConnectionError` naming the
            lost connection (nothing was written, the session having been ended first).

    Raises:
        InvalidTypeError, InvalidArgumentError: a bad argument (a DSN that is no
            ``postgresql://`` URL, or one with a bracket left open or a port that is no number).
    """

    def __init__(
        self,
        dsn: str,
        *,
        config: StoreConfig | None = None,
        clock: Callable[[], float] | None = None,
        schema: str | None = None,
        pool_min_size: int = 1,
        pool_max_size: int = 10,
        listen: bool = True,
        reconnect_timeout_s: float = 10.0,
        read_only: bool = False,
        idle_in_transaction_timeout_s: float = 30.0,
    ) -> None:
        if not isinstance(dsn, str):
            raise InvalidTypeError(f"dsn must be a str (postgresql://...), got {type(dsn).__name__}")
        if not dsn.startswith(("postgresql://", "postgres://")):
            raise InvalidArgumentError(
                f"dsn must start with postgresql:// or postgres://, got {redact_target(dsn)[:40]!r}"
            )
        connect_dsn, connect_timeout_s = split_connect_timeout(dsn)  # checks the whole DSN first
        if config is not None and not isinstance(config, StoreConfig):
            raise InvalidTypeError(f"config must be a StoreConfig, got {type(config).__name__}")
        check_clock(clock)
        if schema is not None:
            check_name("schema", schema)
            if len(schema.encode()) > 63:
                raise InvalidArgumentError(f"schema must be at most 63 bytes (a PostgreSQL identifier), got {schema!r}")
            if schema.startswith("pg_") or schema == "information_schema":
                raise InvalidArgumentError(
                    f"schema {schema!r} is PostgreSQL's own (pg_* and information_schema are the system's)"
                )
        self.dsn = dsn
        self._connect_dsn, self.connect_timeout_s = connect_dsn, connect_timeout_s
        self.config = config or StoreConfig()
        self.events = EventCounter()
        self.latencies = LatencyRecorder()
        self.notifier = WorkNotifier()
        self.schema = schema
        self.read_only = check_bool("read_only", read_only)
        self.listen = check_bool("listen", listen)
        self.pool_min_size = check_int("pool_min_size", pool_min_size, minimum=0, maximum=MAX_POOL_SIZE)
        self.pool_max_size = check_int(
            "pool_max_size", pool_max_size, minimum=max(1, self.pool_min_size), maximum=MAX_POOL_SIZE
        )
        self.idle_in_transaction_timeout_s = check_positive(  # at most 2**31 - 1 ms, the setting's limit
            "idle_in_transaction_timeout_s", idle_in_transaction_timeout_s, maximum=2_147_483.0
        )
        self.channel = _channel(schema)
        self._clock = clock
        self._sender = new_token()[:16]
        self._partitions = self.config.partitions
        # Queues seen keeping per-key heads (coord_ordered_queues, schema version 9); a queue
        # never stops keeping them, so once seen it needs no shared queue lock again.
        self._kept_queues: set[str] = set()
        self._keeping: dict[str, asyncio.Future[None]] = {}  # coord_keep_heads in flight, per queue
        self._runner = PgRunner(
            reconnect_timeout_s=check_positive("reconnect_timeout_s", reconnect_timeout_s),
            on_retry=lambda _exc: self.events.add(STORE_RETRIES),
        )
        self._listener: PgListener | None = None
        self._connector = Connector()
        self._background: set[asyncio.Task[Any]] = set()
        self._committer: Batcher[_Item, Task | CoordError] = Batcher(
            self._complete_batch,
            self.config.max_batch_ops,
            key=lambda i: i.task.id,
            name="asynccoord-pg-commit",
            orphaned=self._orphaned_commit,
        )
        self._acquirer = self._new_acquirer()
        self._extender: Batcher[_Renewal, set[tuple[int, str]]] = Batcher(
            self._extend_batch, self.config.max_batch_ops, name="asynccoord-pg-extend"
        )
        # One claim batcher per (queue, ordered, min_due_age_s): the claims one statement
        # serves. Idle ones are dropped when there are many (queues named on the fly).
        self._claimers: dict[tuple[str, bool, float], Batcher[_ClaimRequest, _Claimed]] = {}

    def __repr__(self) -> str:
        state = "open" if self._runner.pool is not None else "closed"
        where = redact_location(self.dsn)
        schema = "" if self.schema is None else f" schema={self.schema!r}"
        return f"<PostgresStore {where!r}{schema} {state}>"

    # --- life cycle -----------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _server_settings(self) -> dict[str, str]:
        # READ COMMITTED whatever the DSN, role or database default: each statement must see
        # what committed before it began (a flag read after a lock, a key's state after its
        # row lock); under REPEATABLE READ it would see the transaction's first snapshot.
        settings = {
            "default_transaction_isolation": "read committed",
            # milliseconds, at least 1 (0 would turn the timeout off)
            "idle_in_transaction_session_timeout": str(max(1, round(self.idle_in_transaction_timeout_s * 1000))),
        }
        if self.schema is not None:
            settings["search_path"] = _quote_ident(self.schema)
        query = self._connect_dsn.partition("?")[2]
        names = {urllib.parse.unquote_plus(field.partition("=")[0]).lower() for field in query.split("&")}
        if "application_name" not in names:
            settings["application_name"] = "asynccoord"  # unless the DSN names the application
        return settings

    async def _connect(self) -> asyncpg.Connection:
        return await self._connector.connect(
            self._connect_dsn, server_settings=self._server_settings(), timeout=self.connect_timeout_s
        )

    async def open(self) -> None:
        """Create the pool, apply pending migrations, and start the listener. Idempotent.

        Raises:
            InvalidArgumentError: asyncpg cannot parse the DSN (a bad parameter value).
            StoreConnectionError: the server cannot be reached.
            SchemaVersionError: the database was written by a newer asynccoord.
            StoreError: another failure of the server (the driver's error as ``__cause__``).
        """
        if self._runner.pool is not None:
            self._runner.check_loop()  # open, but for another loop: StoreLoopError
            return
        self._kept_queues.clear()  # seen in a database that may since have been replaced
        # A call left in flight by a loop that was closed without cancelling its tasks can
        # never finish: forget it (and any other work of that loop), or every later ordered
        # claim would wait on a future of a dead loop, and close() on it for 5 s.
        loop = asyncio.get_running_loop()
        self._keeping.clear()
        self._background = {t for t in self._background if t.get_loop() is loop}
        try:
            pool = await asyncpg.create_pool(
                self._connect_dsn,
                min_size=self.pool_min_size,
                max_size=self.pool_max_size,
                server_settings=self._server_settings(),
                timeout=self.connect_timeout_s,
                reset=self._runner.reset_session,
                connect=self._connector.connect,
            )
        except (asyncpg.ClientConfigurationError, ValueError) as exc:  # a DSN _check_dsn() let through
            if isinstance(exc, asyncpg.PostgresError | OSError):
                raise map_pg_error(exc, f"cannot connect to {self!r}") from exc
            raise InvalidArgumentError(
                f"malformed PostgreSQL DSN {redact_target(self.dsn)!r}: {type(exc).__name__}: {exc}"
            ) from exc
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError) as exc:
            raise map_pg_error(exc, f"cannot connect to {self!r}") from exc
        self._runner.pool = pool
        self._runner.loop = asyncio.get_running_loop()
        try:
            await self._runner.run(self._migrate, what="open", ambiguous_ok=True)
            if self.listen and not self.read_only:
                self._listener = PgListener(
                    self._connect, channel=self.channel, sender=self._sender, notifier=self.notifier
                )
                await self._listener.start()
        except BaseException:
            await self.close()
            raise

    async def _migrate(self, conn: asyncpg.Connection, _attempt: int) -> None:
        if not self.read_only:
            await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK_KEY)
            if self.schema is not None:
                await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {_quote_ident(self.schema)}")
        has_meta = await conn.fetchval("SELECT to_regclass('coord_meta') IS NOT NULL")
        version = 0
        if has_meta:
            value = await self._val(conn, "meta_get", key="schema_version")
            version = int(value) if value is not None else 0
        if version > SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{self!r} has schema version {version}, newer than {SCHEMA_VERSION} "
                "which this asynccoord understands: upgrade asynccoord"
            )
        if self.read_only:
            if not has_meta:
                where = "the search path" if self.schema is None else f"schema {self.schema!r}"
                raise SchemaVersionError(
                    f"{self!r}: no asynccoord tables in {where}: nothing to read (is it the database the nodes use?)"
                )
            if version < SCHEMA_VERSION:
                raise SchemaVersionError(
                    f"{self!r} has schema version {version}, older than {SCHEMA_VERSION}: "
                    "open it once read-write to migrate"
                )
        else:
            for number, script in load_migrations("postgres"):
                if number > version:
                    await conn.execute(script)
                    await self._x(conn, "meta_set", key="schema_version", value=str(number))
        if self.schema is None:  # the tables' schema, however the search path chose it: one channel per schema
            self.channel = _channel(await conn.fetchval("SELECT current_schema()"))
        value = await self._val(conn, "meta_get", key="partitions")
        if value is None:
            if not self.read_only:
                await self._x(conn, "meta_set", key="partitions", value=str(self.config.partitions))
        else:
            self._partitions = int(value)

    async def close(self) -> None:
        """Finish queued commits, stop the listener and close the pool. Idempotent.

        Called from another event loop than ``open()``'s, it only drops the connections
        (the pool and the listener belong to that loop; nothing queued there can still be
        waited for).
        """
        if self._runner.pool is not None and self._runner.loop is not asyncio.get_running_loop():
            listener, self._listener = self._listener, None
            if listener is not None:
                listener.abandon()
            pool, self._runner.pool = self._runner.pool, None
            with contextlib.suppress(RuntimeError):  # its loop is closed: the sockets go with it
                pool.terminate()
            return
        await self._committer.flush()
        await self._acquirer.flush()
        await self._extender.flush()
        for claimer in list(self._claimers.values()):
            await claimer.flush()
        self._claimers.clear()
        if self._background:
            with contextlib.suppress(Exception):
                await asyncio.wait(set(self._background), timeout=5.0)
        listener, self._listener = self._listener, None
        if listener is not None:
            await listener.stop()
        pool, self._runner.pool = self._runner.pool, None
        if pool is not None:
            try:
                await asyncio.wait_for(pool.close(), 10.0)
            except (TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
                pool.terminate()
        await self._connector.settle(min(self.connect_timeout_s or _SETTLE_S, _SETTLE_S))

    @property
    def partitions(self) -> int:
        """Number of fixed partitions (as stored in the database when it was created)."""
        return self._partitions

    @property
    def transactions(self) -> int:
        """Transactions this store object has committed so far: those run as ``BEGIN ... COMMIT``
        and its commit batches (one statement each). Single-statement operations (claims, lock
        and fence operations, reads) are not counted."""
        return self._runner.transactions

    @property
    def listening(self) -> bool:
        """Whether the LISTEN connection is up now (notifications from other processes arrive)."""
        return self._listener is not None and self._listener.connected.is_set()

    # --- statement helpers ------------------------------------------------------------

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

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` in the background (compensations of cancelled callers); close() waits for it."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _shielded(self, aw: Awaitable[T], undo: Callable[[T], Coroutine[Any, Any, Any] | None]) -> T:
        """Await ``aw`` shielded; if the caller is cancelled meanwhile, compensate its result.

        The compensation is a background task from the moment of the cancellation (not from
        when ``aw`` ends), so a :meth:`close` right after it waits for both: before, a
        claim cancelled just before the store was closed was compensated on a closed pool,
        and its tasks stayed leased until the lease lapsed.
        """
        inner = asyncio.ensure_future(aw)
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

    async def _lock_keys(self, conn: asyncpg.Connection, pairs: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        """Take the row locks of the keys whose queues keep per-key heads; return those keys.

        Call it in a transaction, before the transition writes anything. Only queues that
        nodes have claimed in order keep heads (``coord_ordered_queues``, schema version 9).
        A queue not yet seen keeping them is share-locked first (``coord_share_queues``,
        held to the commit) and its flag read in the next statement, so a queue starting to
        keep heads meanwhile (:meth:`_keep_heads`) waits for this transaction. The keys of
        the other queues need neither a lock nor a promotion.
        """
        unknown = sorted({q for q, _ in pairs} - self._kept_queues)
        if unknown:
            await self._x(conn, "share_queues", queues=unknown)
            self._kept_queues.update(r[0] for r in await self._fetch(conn, "kept_queues", queues=unknown))
        kept = {p for p in pairs if p[0] in self._kept_queues}
        if kept:
            await self._x(conn, "lock_keys", **_keys(kept))
        return kept

    async def _keep_heads(self, queue: str) -> None:
        """Make ``queue`` keep per-key heads from now on (before its first ordered claim or continuation).

        ``coord_keep_heads`` (schema version 9): under the queue's exclusive advisory lock
        (it waits for the transitions in flight that decided not to keep heads), records
        the queue and marks each key's earliest active task as its head. Nobody is woken:
        the tasks were announced at enqueue, and every ordered claim comes after this. Once
        per queue and store: concurrent first claims (every node of a process waking to the
        queue's first tasks) share one call, rather than each holding a connection of the
        pool while it waits for the first one's advisory lock. A caller cancelled meanwhile
        leaves the call running for the others (:meth:`close` waits for it); an error
        reaches every caller, and the next call tries again.
        """
        if queue in self._kept_queues:
            return
        running = self._keeping.get(queue)
        if running is None:
            running = asyncio.ensure_future(self._keep_heads_once(queue))
            self._keeping[queue] = running
            self._background.add(running)
            running.add_done_callback(functools.partial(self._kept_heads, queue))
        await asyncio.shield(running)

    async def _keep_heads_once(self, queue: str) -> None:
        async def op(conn: asyncpg.Connection, _attempt: int) -> int:
            return int(await self._val(conn, "keep_heads", queue=queue))

        heads = await self._run(op, what="keep per-key heads", ambiguous_ok=True)
        self._kept_queues.add(queue)
        if heads:
            log.debug("asynccoord.postgres.keep_heads queue=%s heads=%d", queue, heads)

    def _kept_heads(self, queue: str, done: asyncio.Future[None]) -> None:
        """Forget a finished :meth:`_keep_heads_once` (its error, if any, reached its callers)."""
        self._background.discard(done)
        if self._keeping.get(queue) is done:
            del self._keeping[queue]
        if not done.cancelled():
            done.exception()  # retrieved: every caller cancelled meanwhile leaves no warning

    async def _promote(self, conn: asyncpg.Connection, pairs: Collection[tuple[str, str]]) -> None:
        """Mark the new heads of these keys (under their row locks) and notify other processes of them."""
        if not pairs:
            return
        promoted = await self._fetch(conn, "promote_heads", **_keys(pairs))
        by_queue: dict[str, set[int]] = {}
        for queue, partition, _run_at in promoted:
            by_queue.setdefault(queue, set()).add(partition)
        for queue, partitions in by_queue.items():
            await self._notify(conn, queue, len(partitions), partitions)

    async def now(self) -> float:
        """The store clock: seconds since the Unix epoch (the server's ``statement_timestamp()``)."""
        now = self._now()

        async def op(conn: asyncpg.Connection, _attempt: int) -> float:
            return float(await self._val(conn, "now", now=now))

        return await self._run(op, what="now", tx=False, ambiguous_ok=True)

    # --- enqueue ----------------------------------------------------------------------

    async def enqueue_many(self, tasks: Sequence[NewTask]) -> list[EnqueueResult]:
        """Add tasks in one transaction; a repeated idempotency key returns the existing task.

        Raises:
            InvalidTypeError, InvalidArgumentError, PayloadTooLargeError: before anything is written.
            StoreConnectionError: the server stayed unreachable (when every task has an
                idempotency key the enqueue is retried even after an unknown outcome).
        """
        prepared = prepare_tasks(tasks, self.config, self._partitions)
        if not prepared:
            return []
        if any(p.limit_keys for p in prepared):  # never enqueue a task whose limits nothing would enforce
            raise InvalidArgumentError(
                "limit_keys: rate limits are not enforced by the PostgreSQL store yet (SQLite and memory enforce them)"
            )
        self._writable()
        columns = {
            "queues": [p.queue for p in prepared],
            "partition_keys": [p.partition_key for p in prepared],
            "partitions": [p.partition for p in prepared],
            "idempotency_keys": [p.idempotency_key for p in prepared],
            "payloads": [p.payload_json for p in prepared],
            "priorities": [p.priority for p in prepared],
            "max_attempts": [p.max_attempts for p in prepared],
            "delays": [p.delay_s for p in prepared],
        }
        pairs = sorted({(p.queue, p.partition_key) for p in prepared})
        due: dict[str, set[int]] = {}
        for p in prepared:
            if p.delay_s == 0:
                due.setdefault(p.queue, set()).add(p.partition)

        earlier_ids: set[int] = set()  # ids drawn by this call's earlier attempts (a sequence's: never reused)

        async def op(conn: asyncpg.Connection, _attempt: int) -> list[tuple[bool, _Row]]:
            now = self._now()
            ids = [int(r[0]) for r in await self._fetch(conn, "next_task_ids", count=len(prepared))]
            earlier = set(earlier_ids)
            earlier_ids.update(ids)
            kept = await self._lock_keys(conn, pairs)
            kept_queues = sorted({q for q, _ in kept})
            created = {
                int(r[0]): r
                for r in await self._fetch(conn, "insert_task", ids=ids, now=now, kept_queues=kept_queues, **columns)
            }
            out: list[tuple[bool, _Row]] = []
            recovered: set[int] = set()  # tasks an earlier attempt created, reported once each
            for task_id, p in zip(ids, prepared, strict=True):
                row = created.get(task_id)
                if row is None:
                    existing = await self._row(
                        conn, "select_by_idempotency_key", queue=p.queue, idempotency_key=p.idempotency_key
                    )
                    if existing is None:  # the task that held the key was purged since the insert skipped it
                        raise RetryTransaction(f"the task of idempotency key {p.idempotency_key!r} went away")
                    # An id an earlier attempt drew: that attempt's COMMIT went through although
                    # its answer was lost, so this call created the task (not a duplicate), for
                    # the key's first item in the call (a repeat of the key is a duplicate).
                    mine = int(existing[0]) in earlier and int(existing[0]) not in recovered
                    if mine:
                        recovered.add(int(existing[0]))
                    out.append((mine, existing))
                else:
                    out.append((True, row))
            await self._promote_quietly(conn, kept)
            fresh = len(created)
            if fresh:
                for queue, partitions in due.items():
                    await self._notify(conn, queue, fresh, partitions)
            return out

        all_keyed = all(p.idempotency_key is not None for p in prepared)
        rows = await self._run(op, what="enqueue", ambiguous_ok=all_keyed)
        results = [EnqueueResult(task=task_from_row(row), created=created) for created, row in rows]
        self.events.add(ev.DUPLICATE_ENQUEUE_SUPPRESSED, sum(1 for r in results if not r.created))
        notify_created(self.notifier, results, prepared)
        return results

    async def _promote_quietly(self, conn: asyncpg.Connection, pairs: Collection[tuple[str, str]]) -> None:
        """Mark new heads without notifying (the caller notifies for the tasks it created)."""
        if pairs:
            await self._x(conn, "promote_heads", **_keys(pairs))

    # --- claim ------------------------------------------------------------------------

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

        One statement (``UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED LIMIT
        n) RETURNING``). Concurrent claims of the process's nodes that name their
        partitions and share ``queue``, ``ordered`` and ``min_due_age_s`` share one
        statement (group commit, as commits and renewals do: ``UPDATE ... FROM`` the rows
        each claim picked, each claim with its own partitions, limit, lease owner and
        TTL): when every node of a process wakes to new work at once, they make one or
        two round trips, not one each. Like any group commit, a batch that fails (the
        server stayed unreachable) fails each of its claims. Leases that expired on their
        last attempt are dead-lettered and the claim is topped up; the claim's rows say
        whether any exist (a statement that leased nothing asks with one more), so a claim
        costs one round trip when there are none. A cancelled caller's tasks are handed
        back in the background.

        ``min_due_age_s`` > 0 takes only tasks that have been due at least that long
        (work stealing from overloaded or dead partition owners).

        Raises:
            InvalidTypeError, InvalidArgumentError: a bad argument (nothing claimed).
            StoreConnectionError: the server stayed unreachable.
        """
        queue, node_id, limit, lease, parts, ordered = check_claim_args(
            queue, node_id, limit, lease_s, partitions, ordered, self._partitions
        )
        due_age = check_non_negative("min_due_age_s", min_due_age_s)
        if parts is not None and not parts:
            return []
        self._writable()
        if ordered and queue not in self._kept_queues:
            await self._keep_heads(queue)
        return await self._shielded(
            self._claim(queue, node_id, limit, lease, self._partition_filter(parts), ordered, due_age), self._undo_claim
        )

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
        statement in autocommit, no row locked; allowed on a read-only store.

        Raises:
            InvalidTypeError, InvalidArgumentError: a bad argument.
            StoreConnectionError: the server stayed unreachable.
        """
        parts, due_age = check_claimable_args(queue, partitions, ordered, min_due_age_s, self._partitions)
        if parts is not None and not parts:
            return set()
        filtered = self._partition_filter(parts)

        async def op(conn: asyncpg.Connection, _attempt: int) -> list[_Row]:
            name = "claimable_partitions"
            if ordered:
                if queue not in self._kept_queues and await self._fetch(conn, "kept_queues", queues=[queue]):
                    self._kept_queues.add(queue)
                # Heads are kept only for queues claimed in order at least once (schema version
                # 9); before the first ordered claim every due task counts (as on SQLite: the
                # claim it wakes computes the heads).
                if queue in self._kept_queues:
                    name = "claimable_partitions_ordered"
            return await self._fetch(
                conn, name, queue=queue, partitions=filtered, min_due_age_s=due_age, now=self._now()
            )

        rows = await self._run(op, what="look for claimable partitions", tx=False, ambiguous_ok=True)
        return {int(r[0]) for r in rows}

    def _partition_filter(self, parts: list[int] | None) -> list[int] | None:
        """The claim's partition filter: None (no filter) when ``parts`` names every partition.

        A sole node owns all of them; matching every scanned row against a 1,024-item array
        made its claims about 4 times as costly for the server as no filter.
        """
        if parts is not None and len(parts) >= self._partitions and len(set(parts)) == self._partitions:
            return None
        return parts

    def _orphaned_commit(self, item: _Item, _outcome: Task | CoordError) -> None:
        """Hand back the task a commit leased for a caller cancelled meanwhile (commit-and-continue)."""
        if item.next_task is not None:
            coro = self._undo_claim([item.next_task])
            if coro is not None:
                self._spawn(coro)

    def _undo_claim(self, tasks: list[Task]) -> Coroutine[Any, Any, Any] | None:
        if not tasks:
            return None
        ordered = sorted(tasks, key=lambda t: t.id)  # rows locked in id order, as commits lock them
        ids = [t.id for t in ordered]
        tokens = [t.lease_token for t in ordered]

        async def op(conn: asyncpg.Connection, _attempt: int) -> None:
            await self._x(conn, "release_many", ids=ids, tokens=tokens, now=self._now())

        async def run() -> None:
            try:
                await self._run(op, what="hand back a cancelled claim", tx=False, ambiguous_ok=True)
            except CoordError as exc:  # the leases will expire instead
                log.warning("asynccoord.postgres.undo_claim_failed error=%s", exc)
            else:
                notify_settled(self.notifier, tasks)

        return run()

    async def _claim(
        self,
        queue: str,
        node_id: str,
        limit: int,
        lease: float,
        parts: list[int] | None,
        ordered: bool,
        due_age: float,
    ) -> list[Task]:
        params = {
            "queue": queue,
            "node_id": node_id,
            "node_ids": [node_id],
            "lease_s": lease,
            "partitions": parts,
            "min_due_age_s": due_age,
        }
        name = "claim_ordered" if ordered else "claim"

        def op_for(n: int) -> Coroutine[Any, Any, list[_Row]]:
            return self._claim_statement(name, {**params, "limit": n})

        if parts is None:
            rows = await op_for(limit)
            # Column 21 says whether leases that expired on their last attempt exist (the
            # claim's own snapshot); only an empty claim does not know, and asks.
            exhausted = bool(rows[0][21]) if rows else await self._any_exhausted(queue)
        else:
            rows, exhausted = await self._claimer(queue, ordered, due_age).submit(
                _ClaimRequest(node_id, limit, lease, parts)
            )
        dead = 0
        if exhausted:
            dead = await self._dead_letter_exhausted(queue)
            if dead and len(rows) < limit:
                rows += await op_for(limit - len(rows))
        duplicates = [r for r in rows if r[20]]
        settled: set[int] = set()
        if duplicates:
            settled = await self._settle_duplicates(duplicates)
            # Their keys' next tasks became heads: wake this process's owners too (other
            # processes hear of them through NOTIFY).
            notify_partitions(self.notifier, [(queue, int(r[3])) for r in duplicates if r[0] in settled])
        kept = sorted((r for r in rows if not r[20]), key=lambda r: (-r[6], r[0]))
        tasks = [task_from_row(r) for r in kept]
        self.events.add(ev.CLAIMS, len(tasks))
        self.events.add(ev.LEASE_EXPIRED, sum(1 for r in rows if r[19]) + dead)
        self.events.add(ev.DEAD_LETTERED, dead)
        self.events.add(ev.DUPLICATE_DELIVERY_SUPPRESSED, len(settled))
        return tasks

    def _claimer(self, queue: str, ordered: bool, due_age: float) -> Batcher[_ClaimRequest, _Claimed]:
        """The batcher of claims on ``queue`` with this order and minimum due age."""
        shape = (queue, ordered, due_age)
        claimer = self._claimers.get(shape)
        if claimer is None:
            if len(self._claimers) >= _MAX_IDLE_CLAIMERS:
                for old in [k for k, b in self._claimers.items() if b.idle]:
                    del self._claimers[old]
            claimer = self._claimers[shape] = Batcher(
                lambda requests: self._claim_batch(queue, ordered, due_age, requests),
                self.config.max_batch_ops,
                key=lambda r: r.node_id,  # a batch's rows are told apart by their lease owner
                name="asynccoord-pg-claim",
                orphaned=self._orphaned_claim,
            )
        return claimer

    async def _claim_statement(self, name: str, params: dict[str, Any]) -> list[_Row]:
        """Run claim statement ``name``; a retry after a lost connection returns what it leased.

        ``params`` are the statement's, but for ``token`` (one per statement, which every
        lease it grants carries) and ``now``; they include ``node_ids``, the lease owners
        ``claimed_by_token`` looks for.
        """
        token = new_token()

        async def op(conn: asyncpg.Connection, attempt: int) -> list[_Row]:
            if attempt > 0:  # the connection was lost while the server may have run the claim
                leased = await self._fetch(conn, "claimed_by_token", token=token, now=self._now(), **params)
                if leased:
                    return leased
            return await self._fetch(conn, name, token=token, now=self._now(), **params)

        return await self._run(op, what="claim", tx=False, ambiguous_ok=True)

    async def _claim_batch(
        self, queue: str, ordered: bool, due_age: float, requests: Sequence[_ClaimRequest]
    ) -> list[_Claimed]:
        """Run ``requests`` (distinct node ids) in one claim statement; each gets its own rows.

        A lone request runs the one-claim statement. Each result carries whether leases
        that expired on their last attempt exist in the queue: from the statement's rows,
        or, when it leased nothing, from one more statement for the whole batch.
        """
        params: dict[str, Any] = {"queue": queue, "min_due_age_s": due_age, "node_ids": [r.node_id for r in requests]}
        if len(requests) == 1:
            only = requests[0]
            name = "claim_ordered" if ordered else "claim"
            params |= {
                "node_id": only.node_id,
                "limit": only.limit,
                "lease_s": only.lease_s,
                "partitions": only.partitions,
            }
        else:
            name = "claim_ordered_batch" if ordered else "claim_batch"
            # A partition named twice in one claim would be read twice by the ordered form,
            # its heads filling the claim's limit twice over.
            unique = [list(dict.fromkeys(r.partitions)) for r in requests]
            params |= {
                "limits": [r.limit for r in requests],
                "lease_s": [r.lease_s for r in requests],
                "partitions": [p for parts in unique for p in parts],
                "partition_slots": [slot for slot, parts in enumerate(unique, 1) for _ in parts],
            }
        rows = await self._claim_statement(name, params)
        exhausted = bool(rows[0][21]) if rows else await self._any_exhausted(queue)
        mine: dict[str, list[_Row]] = {r.node_id: [] for r in requests}
        for row in rows:
            mine[row[11]].append(row)
        return [(mine[r.node_id], exhausted) for r in requests]

    def _orphaned_claim(self, _request: _ClaimRequest, outcome: _Claimed) -> None:
        """Hand back the tasks a batch leased for a claim whose caller is gone."""
        coro = self._undo_claim([task_from_row(r) for r in outcome[0]])
        if coro is not None:
            self._spawn(coro)

    async def _any_exhausted(self, queue: str) -> bool:
        """Whether ``queue`` has leases that expired on their last attempt (one statement, no transaction)."""

        async def op(conn: asyncpg.Connection, _attempt: int) -> bool:
            return await self._row(conn, "exhausted_keys", queue=queue, now=self._now()) is not None

        return await self._run(op, what="look for exhausted leases", tx=False, ambiguous_ok=True)

    async def _dead_letter_exhausted(self, queue: str) -> int:
        """Dead-letter leases of ``queue`` that expired on their last attempt; return how many."""

        async def op(conn: asyncpg.Connection, _attempt: int) -> int:
            now = self._now()
            pairs = [(r[0], r[1]) for r in await self._fetch(conn, "exhausted_keys", queue=queue, now=now)]
            if not pairs:
                return 0
            kept = await self._lock_keys(conn, pairs)
            keys = sorted({k for _, k in pairs})
            dead = await self._fetch(conn, "dead_letter_exhausted", queue=queue, keys=keys, now=now)
            await self._promote(conn, [(r[1], r[2]) for r in dead if (r[1], r[2]) in kept])
            return len(dead)

        return await self._run(op, what="dead-letter exhausted leases", ambiguous_ok=True)

    async def _settle_duplicates(self, rows: Sequence[_Row]) -> set[int]:
        """Mark claimed tasks whose message id was already processed as done (a second transaction).

        If this fails, the tasks stay leased to nobody and are settled when reclaimed.
        """
        ids = [r[0] for r in rows]
        tokens = [r[12] for r in rows]
        pairs = [(r[1], r[2]) for r in rows]

        async def op(conn: asyncpg.Connection, _attempt: int) -> set[int]:
            kept = await self._lock_keys(conn, pairs)
            done = {
                int(r[0]) for r in await self._fetch(conn, "settle_duplicate", ids=ids, tokens=tokens, now=self._now())
            }
            await self._promote(conn, [p for r, p in zip(rows, pairs, strict=True) if r[0] in done and p in kept])
            return done

        try:
            return await self._run(op, what="settle duplicate deliveries", ambiguous_ok=True)
        except CoordError as exc:
            log.warning("asynccoord.postgres.settle_duplicates_failed error=%s", exc)
            return set()

    # --- complete ---------------------------------------------------------------------

    async def complete(self, task: Task, result: Any = None, *, fence: tuple[str, int] | None = None) -> Task:
        """Mark ``task`` done and record its message id as processed, in one transaction.

        Same contract as the shared convenience (see ``QueueConveniences.complete``), but
        concurrent calls of the process are group-committed: one transaction per batch
        of whatever is waiting, not one (of five round trips and a WAL flush) per task.

        Raises:
            LeaseLostError: the lease is no longer the caller's; nothing written.
            TaskNotFoundError: the task no longer exists.
            FencingTokenRejectedError: ``fence`` carries an outdated token.
            InvalidTypeError, InvalidArgumentError: bad ``task``, ``result`` or ``fence``.
            StoreConnectionError: the server stayed unreachable.
        """
        checked = check_task(task)
        encoded = encode_results([result], 1, self.config)
        fenced = check_fences(None if fence is None else [fence], 1)
        self._writable()
        # A cancellation of the caller cancels the future, not the commit (see Batcher).
        outcome = await self._committer.submit(_Item(checked, encoded[0], None if fenced is None else fenced[0]))
        self._count_settled([checked], [outcome])
        if isinstance(outcome, Task):
            return outcome
        raise outcome

    async def complete_and_claim_next(
        self,
        task: Task,
        result: Any = None,
        *,
        fence: tuple[str, int] | None = None,
        lease_s: float = 30.0,
    ) -> Continuation:
        """Complete ``task`` and lease its key's next task, in the same statement and transaction.

        See :meth:`~asynccoord.contract.protocols.QueueStore.complete_and_claim_next`. The call
        joins the group commit of :meth:`complete`: the batch's one statement,
        ``coord_complete_batch`` (schema version 8), commits the task exactly as
        :meth:`complete` does and then leases the key's head (the earliest unfinished task
        of ``task``'s queue and partition key) to ``task.lease_owner`` if it is pending and
        due by the server clock, as ``claim(ordered=True)`` would lease it. No round trip
        of its own, and no NOTIFY nor wake-up for that key when its head is leased or when
        the key has no next task (there is one, as after :meth:`complete`, when a next head
        was promoted and not leased). A head whose row another
        transaction holds at that moment is not waited for: the commit goes through without
        a continuation. Should the caller be cancelled once the batch is at the server, the
        leased task is handed back in the background (pending again, the attempt not
        counted), as a cancelled claim's tasks are.

        Raises:
            LeaseLostError, TaskNotFoundError, FencingTokenRejectedError: as :meth:`complete`;
                nothing written or leased.
            InvalidTypeError, InvalidArgumentError: bad arguments (nothing written).
            StoreConnectionError: the server stayed unreachable.
        """
        [checked], encoded, fenced, lease, _ = check_continuation(task, result, fence, lease_s, self.config)
        self._writable()
        if checked.queue not in self._kept_queues:  # once per queue (no coroutine per call after that)
            # The stored task's queue, and only once the task is known to exist: a call with a
            # task id the store never had raises TaskNotFoundError before anything is written.
            await self._keep_heads((await self.get(checked.id)).queue)
        item = _Item(checked, encoded[0], None if fenced is None else fenced[0], lease)
        # Not asyncio.shield (a future, two closures and three cells per call): a cancellation
        # cancels the future, and the batcher hands the item's outcome to _orphaned_commit.
        future = self._committer.submit(item)
        try:
            outcome = await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.exception() is None:
                self._orphaned_commit(item, future.result())  # the outcome came just as the caller was cancelled
            raise
        if not isinstance(outcome, Task):
            self._count_settled([checked], [outcome])
            raise outcome
        self.events.add(ev.COMMITS)
        if item.next_task is None and self._listener is None:  # whoever claims the key's next task may be woken
            notify_settled(self.notifier, [outcome])
        return Continuation(done=outcome, next_task=item.next_task)

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
            :class:`FencingTokenRejectedError`).

        Raises:
            InvalidTypeError, InvalidArgumentError: a bad task or result (nothing written).
            StoreConnectionError: the server stayed unreachable.
        """
        checked = check_tasks(tasks)
        encoded = encode_results(results, len(checked), self.config)
        fenced = check_fences(fences, len(checked))
        if not checked:
            return []
        self._writable()
        items = [
            _Item(t, r, None if fenced is None else fenced[i])
            for i, (t, r) in enumerate(zip(checked, encoded, strict=True))
        ]
        outcomes = await self._complete_batch(items)
        self._count_settled(checked, outcomes)
        return outcomes

    def _count_settled(self, tasks: Sequence[Task], outcomes: Sequence[Task | CoordError]) -> None:
        done = [t for t, o in zip(tasks, outcomes, strict=True) if isinstance(o, Task)]
        self.events.add(ev.COMMITS, len(done))
        self.events.add(ev.STALE_COMMIT_REJECTED, sum(1 for o in outcomes if isinstance(o, LeaseLostError)))
        self.events.add(ev.FENCING_REJECTED, sum(1 for o in outcomes if _is_fence_error(o)))
        # A queue that keeps heads (claimed in order here) may have its keys' next tasks claimable
        # now; in any other queue a commit makes nothing claimable: no wake-up (an idle node
        # woken for it would claim for nothing). With a listener, the batch's own notification
        # wakes this process's nodes too, for exactly the heads it promoted and did not lease
        # (see _complete_batch): nothing to guess here.
        if self._listener is not None:
            return
        kept = self._kept_queues
        heads = [t for t in done if t.queue in kept]
        if heads:
            notify_settled(self.notifier, heads)

    async def _complete_batch(self, items: Sequence[_Item]) -> list[Task | CoordError]:
        """Complete ``items`` in one statement, ``coord_complete_batch`` (its own transaction).

        The function share-locks the batch's queues and takes the row locks of the keys of
        those that keep heads (sorted, schema version 9), then the fence rows (sorted),
        refuses outdated fencing tokens, compare-and-sets each remaining task (a task whose
        stored queue or key differs from the item's, an altered copy, has its own key's row
        locked then), records the
        fencing tokens and processed ids, promotes the keys' next heads and notifies other
        processes (see ``sql/postgres/migration_0006.sql``; its promotion as of
        ``migration_0007.sql``, its queue locks as of ``migration_0009.sql``): one round
        trip per batch. Items with ``next_lease_s``
        (``complete_and_claim_next``) also get their key's next task leased by the same
        statement (``migration_0008.sql``; the first such item of a key in the batch only),
        set as their ``next_task``.
        """
        continuing = any(i.next_lease_s is not None for i in items)
        # The statement locks the tasks' rows in the order of its arrays: ascending ids, as
        # extend_many takes them, so the two never deadlock (see _extend_batch).
        ordered = sorted(items, key=lambda i: i.task.id)
        params: dict[str, Any] = {
            "ids": [i.task.id for i in ordered],
            "tokens": [i.task.lease_token for i in ordered],
            "versions": [i.task.version for i in ordered],
            "results": [i.result_json for i in ordered],
            "queues": [i.task.queue for i in ordered],
            "keys": [i.task.partition_key for i in ordered],
            "fence_resources": None,
            "fence_tokens": None,
            "next_owners": [i.task.lease_owner or "" for i in ordered] if continuing else None,
            "next_lease_s": [i.next_lease_s for i in ordered] if continuing else None,
            "next_token": new_token() if continuing else None,
            "channel": self.channel,
            # No sender when listening: the notification (the keys' promoted heads that no
            # continuation leased) is then also this process's wake-up, which the listener
            # delivers; a sender's own notifications are ignored as woken already.
            "sender": None if self._listener is not None else self._sender,
        }
        if any(i.fence is not None for i in items):
            params["fence_resources"] = [None if i.fence is None else i.fence[0] for i in ordered]
            params["fence_tokens"] = [None if i.fence is None else i.fence[1] for i in ordered]

        async def op(conn: asyncpg.Connection, attempt: int) -> tuple[list[Task | CoordError], dict[int, _Row], int]:
            done: dict[int, tuple[int, float]] = {}
            refused: dict[int, int] = {}
            following: dict[int, _Row] = {}  # completed task id -> the row of its key's next task, leased
            duplicates = 0
            for r in await self._fetch(conn, "complete_batch", now=self._now(), **params):
                kind = r[1]
                if kind == "d":
                    done[r[0]] = (r[2], r[3])
                elif kind == "f":
                    refused[r[0]] = r[4]
                elif kind == "n":
                    following[r[0]] = r[5:]
                else:  # "x": the next task was settled as a duplicate
                    duplicates += 1
            # A copy committed if the version written is its own + 1 (a stale copy beside the
            # live one in the same batch matched nothing), and only the first such copy.
            claimed: set[int] = set()
            won = []  # one copy per committed row: a repeated copy of a committed task lost
            for i in items:
                hit = i.task.id in done and done[i.task.id][0] == i.task.version + 1 and i.task.id not in claimed
                if hit:
                    claimed.add(i.task.id)
                won.append(hit)
            missing = sorted({i.task.id for i, w in zip(items, won, strict=True) if not w and i.task.id not in refused})
            current: dict[int, _Row] = {}
            if missing:
                current = {int(r[0]): r for r in await self._fetch(conn, "select_tasks", ids=missing)}
            out: list[Task | CoordError] = []
            for i, w in zip(items, won, strict=True):
                t = i.task
                if t.id in refused:
                    assert i.fence is not None
                    out.append(fence_rejected_error(i.fence[0], i.fence[1], refused[t.id]))
                elif w:
                    version, at = done[t.id]
                    out.append(settled_done(t, version=version, now=at, result=decode_json(i.result_json)))
                else:
                    row = current.get(t.id)
                    if attempt > 0 and row is not None and _settled_by_us(row, t, TaskStatus.DONE):
                        out.append(task_from_row(row))  # our earlier attempt committed it
                        if i.next_lease_s is not None:
                            head = await self._earlier_continuation(conn, t, params["next_token"])
                            if head is not None:
                                following[t.id] = head
                        continue
                    reason = _lost_reason(row, t)
                    out.append(TaskNotFoundError(t.id) if reason is None else LeaseLostError(t.id, reason))
            return out, following, duplicates

        out, following, duplicates = await self._run(op, what="complete", tx=False, ambiguous_ok=True, counted=True)
        if continuing:
            for i, o in zip(items, out, strict=True):
                row = following.get(i.task.id) if isinstance(o, Task) else None
                i.next_task = None if row is None else task_from_row(row)
            self.events.add(ev.CLAIMS, len(following))
            self.events.add(ev.DUPLICATE_DELIVERY_SUPPRESSED, duplicates)
        return out

    async def _earlier_continuation(self, conn: asyncpg.Connection, task: Task, token: str) -> _Row | None:
        """After a lost connection: the head of ``task``'s key if our earlier attempt leased it (by its token)."""
        row = await self._row(conn, "select_key_head", queue=task.queue, partition_key=task.partition_key)
        if row is None or row[7] != TaskStatus.RUNNING or row[12] != f"{token}.{row[0]}":
            return None
        return row

    # --- fail, release, extend ------------------------------------------------------------

    async def _settle(
        self, task: Task, name: str, params: dict[str, Any], *, expect: TaskStatus, head_change: bool
    ) -> Task:
        key = {"id": task.id, "lease_token": task.lease_token, "version": task.version, **params}

        async def op(conn: asyncpg.Connection, attempt: int) -> tuple[_Row | None, str | None]:
            kept = await self._lock_keys(conn, [(task.queue, task.partition_key)]) if head_change else set()
            row = await self._row(conn, name, now=self._now(), **key)
            if row is None:
                current = await self._row(conn, "select_task", id=task.id)
                if attempt > 0 and _settled_by_us(current, task, expect):
                    return current, None
                return None, _lost_reason(current, task)
            await self._promote(conn, kept)
            return row, None

        row, reason = await self._run(op, what=name, tx=head_change, ambiguous_ok=True)
        if row is None:
            if reason is None:
                raise TaskNotFoundError(task.id)
            self.events.add(ev.STALE_COMMIT_REJECTED)
            raise LeaseLostError(task.id, reason)
        return task_from_row(row)

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
        self._writable()
        task = with_stored_fields(task, await self.get(task.id))  # never the caller's counts or key
        if task.attempts >= task.max_attempts:
            out = await self._settle(task, "dead_letter", {"error": text}, expect=TaskStatus.DEAD, head_change=True)
            self.events.add(ev.DEAD_LETTERED)
        else:
            delay = policy.delay_s(max(task.attempts, 1))
            out = await self._settle(
                task, "retry", {"error": text, "delay_s": delay}, expect=TaskStatus.PENDING, head_change=False
            )
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
        self._writable()
        out = await self._settle(task, "release", {"delay_s": delay}, expect=TaskStatus.PENDING, head_change=False)
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
        self._writable()
        key = {"id": task.id, "lease_token": task.lease_token, "version": task.version, "lease_s": lease}

        async def op(conn: asyncpg.Connection, _attempt: int) -> tuple[float | None, str | None]:
            expiry = await self._val(conn, "extend", now=self._now(), **key)
            if expiry is None:
                return None, _lost_reason(await self._row(conn, "select_task", id=task.id), task)
            return float(expiry), None

        expiry, reason = await self._run(op, what="extend", tx=False, ambiguous_ok=True)
        if expiry is None:
            if reason is None:
                raise TaskNotFoundError(task.id)
            raise LeaseLostError(task.id, reason)
        return expiry

    async def extend_many(self, tasks: Sequence[Task], lease_s: float) -> list[bool]:
        """Renew many leases with one statement; True for each lease still held.

        Concurrent calls in one process share that statement (group commit, see
        :mod:`asynccoord.backends.batch`): a process's nodes renew their leases at the
        same moments, and one write per node each time made the server's work grow with
        the node count. A cancelled caller's renewal still runs (it only extends leases
        the caller held).

        Raises:
            InvalidTypeError, InvalidArgumentError: a bad task or ``lease_s``.
            StoreConnectionError: the server stayed unreachable.
        """
        checked = check_tasks(tasks)
        lease = check_lease_s("lease_s", lease_s)
        if not checked:
            return []
        self._writable()
        renewal = _Renewal([t.id for t in checked], [t.lease_token for t in checked], lease)
        renewed = await self._extender.submit(renewal)
        return [(t.id, t.lease_token) in renewed for t in checked]

    async def _extend_batch(self, renewals: Sequence[_Renewal]) -> list[set[tuple[int, str]]]:
        """Renew the leases of ``renewals`` in one statement; each gets the renewed (id, token) pairs of its own.

        The rows are locked in ascending id order, as a commit batch locks them: in any
        other order a renewal and a commit of two of the same tasks could each hold one row
        the other waits for, a deadlock PostgreSQL breaks only after ``deadlock_timeout``
        (1 s by default), stalling every commit waiting on those rows meanwhile.
        """
        leases = [(i, t, r.lease_s) for r in renewals for i, t in zip(r.ids, r.tokens, strict=True)]
        leases.sort(key=lambda lease: lease[0])
        ids = [i for i, _, _ in leases]
        tokens = [t for _, t, _ in leases]
        ttls = [ttl for _, _, ttl in leases]

        async def op(conn: asyncpg.Connection, _attempt: int) -> set[tuple[int, str]]:
            rows = await self._fetch(conn, "extend_many", ids=ids, tokens=tokens, lease_s=ttls, now=self._now())
            return {(int(r[0]), str(r[1])) for r in rows}

        renewed = await self._run(op, what="extend_many", tx=False, ambiguous_ok=True)
        return [renewed.intersection(zip(r.ids, r.tokens, strict=True)) for r in renewals]

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

        The read and the write are separate statements, so two nodes can claim the
        same task. Exists only so benchmarks can show what the version layer buys;
        never use it to process real work.
        """
        queue, node_id, limit, lease, parts, _ = check_claim_args(
            queue, node_id, limit, lease_s, partitions, False, self._partitions
        )
        self._writable()

        async def peek(conn: asyncpg.Connection, _attempt: int) -> list[int]:
            rows = await self._fetch(
                conn,
                "unchecked_peek",
                queue=queue,
                limit=limit,
                partitions=self._partition_filter(parts),
                now=self._now(),
            )
            return [int(r[0]) for r in rows]

        ids = await self._run(peek, what="unchecked_peek", tx=False, ambiguous_ok=True)
        if not ids:
            return []
        token = new_token()

        async def op(conn: asyncpg.Connection, _attempt: int) -> list[_Row]:
            return await self._fetch(
                conn, "unchecked_claim", ids=ids, node_id=node_id, lease_s=lease, token=token, now=self._now()
            )

        rows = await self._run(op, what="unchecked_claim", tx=False)
        self.events.add(ev.CLAIMS, len(rows))
        return [task_from_row(r) for r in rows]

    async def unchecked_complete(self, tasks: Sequence[Task], results: Sequence[Any] | None = None) -> int:
        """Mark tasks done without any compare-and-set (benchmarks only); return rows written."""
        checked = check_tasks(tasks)
        encoded = encode_results(results, len(checked), self.config)
        if not checked:
            return 0
        self._writable()

        async def op(conn: asyncpg.Connection, _attempt: int) -> int:
            kept = await self._lock_keys(conn, [(t.queue, t.partition_key) for t in checked])
            rows = await self._fetch(
                conn, "unchecked_complete", ids=[t.id for t in checked], results=encoded, now=self._now()
            )
            await self._promote(conn, [(r[0], r[1]) for r in rows if (r[0], r[1]) in kept])
            return len(rows)

        written = await self._run(op, what="unchecked_complete")
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

        async def op(conn: asyncpg.Connection, _attempt: int) -> _Row | None:
            return await self._row(conn, "select_task", id=task_id)

        row = await self._run(op, what="get", tx=False, ambiguous_ok=True)
        if row is None:
            raise TaskNotFoundError(task_id)
        return task_from_row(row)

    async def stats(self, queue: str | None = None) -> QueueStats:
        """Counts by status and the oldest due pending age (store clock), for ``queue`` or all."""
        if queue is not None:
            check_name("queue", queue)

        async def op(conn: asyncpg.Connection, _attempt: int) -> tuple[list[_Row], _Row | None]:
            async with conn.transaction(isolation="repeatable_read", readonly=True):  # one snapshot
                counts = await self._fetch(conn, "stats_counts", queue=queue)
                oldest = await self._row(conn, "stats_oldest_pending", queue=queue, now=self._now())
            return counts, oldest

        counts, oldest = await self._run(op, what="stats", tx=False, ambiguous_ok=True)
        by_status = {s: 0 for s in TaskStatus}
        for status, n in counts:
            by_status[TaskStatus(status)] = int(n)
        age = None
        if oldest is not None and oldest[0] is not None:
            age = max(0.0, float(oldest[1]) - float(oldest[0]))
        return QueueStats(counts=by_status, oldest_pending_age_s=age)

    async def is_drained(self, queue: str) -> bool:
        """True when ``queue`` has no pending and no running task: two partial-index probes."""
        check_name("queue", queue)

        async def op(conn: asyncpg.Connection, _attempt: int) -> bool:
            return not await self._val(conn, "queue_unfinished", queue=queue)

        return await self._run(op, what="is_drained", tx=False, ambiguous_ok=True)  # a read: no transaction

    async def requeue_dead(self, queue: str, task_ids: Sequence[int] | None = None) -> int:
        """Move dead tasks of ``queue`` (all, or those ids) back to pending; return how many."""
        check_name("queue", queue)
        ids = check_task_ids(task_ids)
        self._writable()

        async def op(conn: asyncpg.Connection, _attempt: int) -> list[_Row]:
            now = self._now()
            pairs = [(r[0], r[1]) for r in await self._fetch(conn, "dead_keys", queue=queue, ids=ids)]
            if not pairs:
                return []
            kept = await self._lock_keys(conn, pairs)
            keys = sorted({k for _, k in pairs})
            rows = await self._fetch(
                conn, "requeue_dead", queue=queue, ids=ids, keys=keys, keeps_heads=bool(kept), now=now
            )
            touched = [(r[1], r[2]) for r in rows if (r[1], r[2]) in kept]
            if touched:
                await self._x(conn, "recompute_heads", **_keys(touched))
                await self._promote(conn, touched)
            elif rows:  # a queue without heads: every requeued task is claimable now
                parts = {int(r[3]) for r in rows}
                await self._notify(conn, queue, len(rows), parts)
            return rows

        rows = await self._run(op, what="requeue_dead")
        if rows:
            self.notifier.notify(queue, len(rows), {int(r[3]) for r in rows})
        return len(rows)

    async def is_processed(self, consumer: str, message_id: str) -> bool:
        """Whether ``(consumer, message_id)`` has a processed-id record (consumer = queue name)."""
        check_name("consumer", consumer)
        check_name("message_id", message_id, allow_blank=True)

        async def op(conn: asyncpg.Connection, _attempt: int) -> bool:
            return await self._row(conn, "is_processed", consumer=consumer, message_id=message_id) is not None

        return await self._run(op, what="is_processed", tx=False, ambiguous_ok=True)

    async def purge_processed(self, *, older_than_s: float | None = None, batch: int | None = None) -> PurgeResult:
        """Delete processed-id records older than ``older_than_s`` (default: the retention).

        Each batch is its own short statement, so a large purge never holds locks for long.

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
        self._writable()
        return await self._purge("purge_processed_batch", {"batch": size, "age_s": age}, size)

    async def purge_finished(self, queue: str, *, older_than_s: float, batch: int = 1000) -> PurgeResult:
        """Delete ``done`` tasks of ``queue`` last updated more than ``older_than_s`` ago.

        Dead tasks are kept (they wait for a person). Processed-id records are kept
        by their own retention, so a redelivery after this purge is still recognized.
        """
        check_name("queue", queue)
        age = check_non_negative("older_than_s", older_than_s)
        size = check_purge_batch(batch)
        self._writable()
        return await self._purge("purge_finished_batch", {"batch": size, "queue": queue, "age_s": age}, size)

    async def _purge(self, name: str, params: dict[str, Any], size: int) -> PurgeResult:
        deleted = batches = 0
        while True:

            async def op(conn: asyncpg.Connection, _attempt: int) -> int:
                status = await conn.execute(Q[name].text, *Q[name].args({**params, "now": self._now()}))
                return int(str(status).rsplit(" ", 1)[-1])

            n = await self._run(op, what=name, tx=False, ambiguous_ok=True)
            if n > 0:
                deleted += n
                batches += 1
            if n < size:
                return PurgeResult(deleted=deleted, batches=batches)


def _is_fence_error(outcome: object) -> bool:
    return isinstance(outcome, FencingTokenRejectedError)


_MAX_IDLE_CLAIMERS = 64
"""Claim batchers (one per queue, order and minimum due age) kept before idle ones are dropped."""

_Claimed = tuple[list[_Row], bool]
"""One claim's answer in a claim batch: its leased rows, and whether the queue has exhausted leases."""


class _ClaimRequest:
    """One :meth:`PostgresStore.claim` call of a claim batch (its partitions are named)."""

    __slots__ = ("lease_s", "limit", "node_id", "partitions")

    def __init__(self, node_id: str, limit: int, lease_s: float, partitions: list[int]) -> None:
        self.node_id = node_id
        self.limit = limit
        self.lease_s = lease_s
        self.partitions = partitions


class _Renewal:
    """One :meth:`PostgresStore.extend_many` call of a renewal batch: lease ids, tokens and the TTL (s)."""

    __slots__ = ("ids", "lease_s", "tokens")

    def __init__(self, ids: list[int], tokens: list[str | None], lease_s: float) -> None:
        self.ids = ids
        self.tokens = tokens
        self.lease_s = lease_s


class _Item:
    """One task of a commit batch.

    ``next_lease_s`` (seconds) asks for a continuation (``complete_and_claim_next``): the
    batch then sets ``next_task`` to the key's next task it leased, if any.
    """

    __slots__ = ("fence", "next_lease_s", "next_task", "result_json", "task")

    def __init__(
        self,
        task: Task,
        result_json: str | None,
        fence: tuple[str, int] | None,
        next_lease_s: float | None = None,
    ) -> None:
        self.task = task
        self.result_json = result_json
        self.fence = fence
        self.next_lease_s = next_lease_s
        self.next_task: Task | None = None
