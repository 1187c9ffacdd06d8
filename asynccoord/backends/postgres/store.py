"""The multi-machine store: PostgreSQL through asyncpg (extra ``postgres``).

One :class:`PostgresStore` per process and database, shared by the process's nodes, and
any number of processes on any number of machines open the same database. It keeps the
storage contract (:mod:`asynccoord.contract`) under READ COMMITTED with the job-queue
pattern of ``FOR UPDATE SKIP LOCKED`` claims and unique partial indexes for per-key
order. The claim, head, commit, rate-limit and connection rules are
on :class:`~.claim.PgClaimOps`, :class:`~.heads.PgHeads`, :class:`~.commit.PgCommitOps`,
:class:`~.ratelimits.PgRateLimitOps` and :class:`~.conn.PgRunner`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import socket
import time
import urllib.parse
from collections.abc import Callable
from typing import Any, TypeAlias, TypeVar

import asyncpg

from ... import events as ev
from ...config import StoreConfig
from ...errors import (
    CoordError,
    InvalidArgumentError,
    InvalidTypeError,
    SchemaVersionError,
    StoreAlreadyOpenError,
    StoreError,
)
from ...events import EventCounter
from ...models import Task
from ...monitor.histogram import LatencyRecorder
from ...notify import WorkNotifier
from ...pauses import PauseBook
from ...releases import ReleaseSignal
from ...validation import (
    check_bool,
    check_clock,
    check_int,
    check_name,
    check_positive,
)
from ..batch import Batcher
from ..calls import CLOSE_WAIT_S
from ..opening import single_open
from ..rows import new_token
from ..schema import PRE_RELEASE_KEY, REVISION_KEY, check_partitions, check_revision
from ..sqlfiles import load_migrations
from ..targets import redact_location, redact_target, split_connect_timeout
from .claim import Claimed, ClaimRequest
from .commit import CommitItem
from .conn import (
    Connector,
    PgListener,
    PgRunner,
    encode_pause,
    map_pg_error,
)
from .deadletters import PostgresDeadLetterOps
from .locks import PostgresLockOps
from .membership import PostgresMembershipOps
from .monitor import PostgresMonitorOps
from .query import load_pg_queries
from .queue import PgQueueOps, Renewal

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


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _channel(schema: str | None) -> str:
    base = "asynccoord" if schema is None else f"asynccoord.{schema}"
    if len(base.encode()) <= 63:
        return base
    return "asynccoord." + hashlib.sha1(base.encode()).hexdigest()[:40]


_SETTLE_S = 2.0
"""Longest ``close()`` waits for connection attempts that cancelled calls left running, seconds."""
_CUT_SETTLE_S = 0.25
"""Longest ``close()`` waits again for calls once its wait for them ran out, seconds: a server that
stopped answering answers no later call either, and the pool is then dropped."""
_IDLE_POOL_CLOSE_S = 0.25
"""Longest ``close()`` waits for the pool's connections in use once no call is in flight, seconds.

A connection still in use then has no user left but a release under way (a round trip at most), or
none at all: asyncpg releases a connection in a task of its own (``asyncio.shield``), which
``asyncio.run``, ending a program on an exit raised in another task, may cancel before its first
step. That release never runs, and the pool's ``close()`` would wait for it forever."""


def application_name() -> str:
    """``"asynccoord <pid>@<host>"``: the sessions' ``application_name``, so an operator can tell whose they are.

    Cut to 63 bytes, what PostgreSQL keeps (``NAMEDATALEN - 1``).
    """
    return f"asynccoord {os.getpid()}@{socket.gethostname()}".encode()[:63].decode(errors="ignore")


class PostgresStore(PgQueueOps, PostgresLockOps, PostgresMembershipOps, PostgresMonitorOps, PostgresDeadLetterOps):
    """The whole storage contract on one PostgreSQL database (queue, locks, membership, monitor).

    Use as ``async with PostgresStore("postgresql://user@host/db") as store: ...`` or
    call :meth:`open` / :meth:`close`. Methods are those of
    :class:`asynccoord.contract.store.Store` (plus ``LockStore``, ``MembershipStore`` and
    ``MonitorStore``), with the same semantics as :class:`~asynccoord.SQLiteStore`; the
    contract test suite runs unchanged on both.

    Claims are one ``UPDATE ... WHERE id = ANY(ARRAY(SELECT ... FOR UPDATE SKIP LOCKED
    LIMIT n)) RETURNING`` (see :class:`~.claim.PgClaimOps`); per-key order and
    lock permit limits are enforced by unique indexes. Every lease, run_at
    and heartbeat is judged by the server's clock (``coord_now()``, i.e.
    ``statement_timestamp()``); machines never compare their own clocks. Lost connections
    are retried for up to ``reconnect_timeout_s`` (see :class:`~.conn.PgRunner`), then
    raise :class:`~asynccoord.errors.StoreConnectionError`; nothing is lost or committed
    twice. A store call cancelled while the pool opens it a connection returns at once,
    but the attempt runs to its end in the background and its connection is closed (see
    :class:`~.conn.Connector` for the asyncpg log line this avoids). Idle nodes wake on
    LISTEN/NOTIFY (see :class:`~.conn.PgListener`).

    Payloads and results are JSON kept as ``text`` (``jsonb`` cannot hold ``\\u0000`` and
    reorders keys). The schema (``sql/migration_0001.sql`` and any later
    ``migration_NNNN.sql``) is applied at open under an advisory lock; a database of a
    newer schema, or of a development version before 0.1.0, is refused with
    :class:`~asynccoord.errors.SchemaVersionError` (see :mod:`..schema`).

    The store belongs to the event loop that opened it (its pool, listener and batches
    do): open one per ``asyncio.run``. A call or ``open()`` from another loop raises
    :class:`~asynccoord.errors.StoreLoopError` at once and writes nothing.

    Args:
        dsn: A libpq connection URI, ``postgresql://user:password@host:port/database``.
            Its query parameters are asyncpg's (``sslmode``, ...; others are sent to the
            server as settings), and libpq's ``connect_timeout`` (whole seconds, <= 0 for
            no limit; default 10 s): how long opening one connection may take. Sessions
            show as ``application_name`` ``"asynccoord <pid>@<host>"`` (this process', cut
            to PostgreSQL's 63 bytes) unless the DSN names another.
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
            conflict) with backoff after its first failure before raising, seconds (> 0).
            Default 10. One store call can spend that long reconnecting (and a connect
            timeout more, ``connect_timeout`` in the DSN), so keep ``NodeConfig.lease_s`` well
            above it: a commit whose lease ended meanwhile is not tried again.
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
            commit of a call that is not safe to repeat (a ``requeue_dead``, say),
            :class:`~asynccoord.errors.StoreConnectionError` naming the lost connection
            (nothing was written, the session having been ended first). An enqueue is one
            statement, never idle inside a transaction. A transaction holding the rate-limit
            lock of a queue, which every claim of that queue waits for, is ended after 2 s
            (``ratelimits.LIMITS_LOCK_IDLE_S``) or this, whichever is less.

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
        self.pauses = PauseBook()  # the provider's 429 pauses this process heard of (asynccoord.pauses)
        self.notifier = WorkNotifier()
        self.releases = ReleaseSignal()
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
        # Queues seen keeping per-key heads (coord_ordered_queues); a queue
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
        self._committer: Batcher[CommitItem, Task | CoordError] = Batcher(
            self._complete_batch,
            self.config.max_batch_ops,
            key=lambda i: i.task.id,
            name="asynccoord-pg-commit",
            orphaned=self._orphaned_commit,
        )
        self._acquirer = self._new_acquirer()
        self._extender: Batcher[Renewal, set[tuple[int, str]]] = Batcher(
            self._extend_batch, self.config.max_batch_ops, name="asynccoord-pg-extend"
        )
        # One claim batcher per (queue, ordered, min_due_age_s, limited): the claims one statement
        # (one transaction, for a queue with rate limits) serves. Idle ones are dropped when
        # there are many (queues named on the fly).
        self._claimers: dict[tuple[str, bool, float, bool], Batcher[ClaimRequest, Claimed]] = {}

    def __repr__(self) -> str:
        state = "open" if self._runner.pool is not None else "closed"
        where = redact_location(self.dsn)
        schema = "" if self.schema is None else f" schema={self.schema!r}"
        return f"<PostgresStore {where!r}{schema} {state}>"

    # --- life cycle -----------------------------------------------------------------

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
            settings["application_name"] = application_name()  # unless the DSN names the application
        return settings

    async def _connect(self) -> asyncpg.Connection:
        return await self._connector.connect(
            self._connect_dsn, server_settings=self._server_settings(), timeout=self.connect_timeout_s
        )

    @single_open
    async def open(self) -> None:
        """Create the pool, apply pending migrations, and start the listener.

        A store closed again may be opened again.

        Raises:
            InvalidArgumentError: asyncpg cannot parse the DSN (a bad parameter value).
            StoreConnectionError: the server cannot be reached.
            SchemaVersionError: the database was written by a newer asynccoord, or by a
                development version before 0.1.0 (drop its schema to start again).
            StoreError: another failure of the server (the driver's error as ``__cause__``).
            StoreAlreadyOpenError: the store is open already; it stays open.
        """
        if self._runner.pool is not None:
            self._runner.check_loop()  # open, but for another loop: StoreLoopError
            raise StoreAlreadyOpenError.of(self)
        self._kept_queues.clear()  # seen in a database that may since have been replaced
        # A call left in flight by a loop that was closed without cancelling its tasks can
        # never finish: forget it (and any other work of that loop), or every later ordered
        # claim would wait on a future of a dead loop, and close() on it for 5 s.
        loop = asyncio.get_running_loop()
        self._keeping.clear()
        self._runner.forget_calls()
        self._limited_probes.clear()  # likewise, and the answers about the queues of another database
        self._limited_queues.clear()
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
        except (asyncpg.ClientConfigurationError, ValueError) as exc:  # a DSN check_dsn() let through
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
                    self._connect,
                    channel=self.channel,
                    sender=self._sender,
                    notifier=self.notifier,
                    releases=self.releases,
                    pauses=self.pauses,
                )
                await self._listener.start()
            if not self.read_only:  # a NOTIFY needs no LISTEN: announced with listen=False too
                self.pauses.announce = self._announce_pause
        except BaseException:
            await self.close()
            raise

    async def _migrate(self, conn: asyncpg.Connection, _attempt: int) -> None:
        if not self.read_only:
            await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK_KEY)
            if self.schema is not None:
                await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {_quote_ident(self.schema)}")
        has_meta = await conn.fetchval("SELECT to_regclass('coord_meta') IS NOT NULL")
        meta: dict[str, str] = {}
        if has_meta:
            for key in (REVISION_KEY, PRE_RELEASE_KEY):
                value = await self._val(conn, "meta_get", key=key)
                if value is not None:
                    meta[key] = value
        fix = ""
        if PRE_RELEASE_KEY in meta:  # named as the catalog quotes it, wherever the search path found it
            tables = await conn.fetchval(
                "SELECT c.relnamespace::regnamespace::text FROM pg_class AS c WHERE c.oid = to_regclass('coord_meta')"
            )
            fix = f"drop its schema (DROP SCHEMA {tables} CASCADE)"
        version = check_revision(repr(self), meta, supported=SCHEMA_VERSION, fix=fix)
        if self.read_only:
            if not has_meta:
                where = "the search path" if self.schema is None else f"schema {self.schema!r}"
                raise SchemaVersionError(
                    f"{self!r}: no asynccoord tables in {where}: nothing to read (is it the database the nodes use?)"
                )
            if version < SCHEMA_VERSION:
                raise SchemaVersionError(
                    f"{self!r} has schema version {version}, older than {SCHEMA_VERSION}: "
                    "open it once read-write to migrate",
                    found=version,
                    supported=SCHEMA_VERSION,
                )
        else:
            for number, script in load_migrations("postgres"):
                if number > version:
                    await conn.execute(script)
                    await self._x(conn, "meta_set", key=REVISION_KEY, value=str(number))
        if self.schema is None:  # the tables' schema, however the search path chose it: one channel per schema
            self.channel = _channel(await conn.fetchval("SELECT current_schema()"))
        value = await self._val(conn, "meta_get", key="partitions")
        if value is None:
            if not self.read_only:
                await self._x(conn, "meta_set", key="partitions", value=str(self.config.partitions))
        else:
            self._partitions = check_partitions(repr(self), value)

    def _announce_pause(self, name: str, pause_s: float) -> None:
        """Carry the provider's pause of lock ``name`` to the other processes (a NOTIFY, in the background).

        A lost connection is retried as any call's (``reconnect_timeout_s``): a NOTIFY sent twice
        only repeats the pause, and each attempt announces the part of it still to wait.
        """
        until = time.monotonic() + pause_s

        async def op(conn: asyncpg.Connection, _attempt: int) -> None:
            left_s = until - time.monotonic()
            if left_s > 0:
                await self._x(conn, "notify", channel=self.channel, payload=encode_pause(self._sender, name, left_s))

        async def announce() -> None:
            try:
                await self._run(op, what="announce_pause", tx=False, ambiguous_ok=True)
            except StoreError as exc:  # the store's paused bucket still holds back later claims
                log.warning("asynccoord.postgres.pause_not_announced name=%r error=%s", name, exc)

        self._spawn(announce())

    async def close(self) -> None:
        """Let the calls in flight finish, stop the listener and close the pool. Idempotent.

        From the moment ``close()`` is called, a new call raises
        :class:`~asynccoord.errors.StoreClosedError` (nothing written), but a hand-back (a
        lock's or a task's ``release``) is let through until the pool closes. The calls in flight
        then are waited for, up to 10 s, with everything they queued and started (batched
        commits, claims, hand-backs of cancelled callers): each returns its result, or raises
        as it would have with the store open, and no claim leases a task its caller never
        gets. The pool then closes its connections, waiting up to 0.25 s for one still in use
        before it drops them all; calls still in flight after the 10 s (a server that stopped
        answering) get 0.25 s more, then their connections are dropped and they fail. Connection attempts
        that cancelled calls left running are waited for up to 2 s (the connect timeout if
        shorter), then cancelled. Called from another event loop than ``open()``'s, it only
        drops the connections (the pool and the listener belong to that loop; nothing queued
        there can still be waited for).
        """
        if self._runner.pool is not None and self._runner.loop is not asyncio.get_running_loop():
            listener, self._listener = self._listener, None
            if listener is not None:
                listener.abandon()
            pool, self._runner.pool = self._runner.pool, None
            with contextlib.suppress(RuntimeError):  # its loop is closed: the sockets go with it
                pool.terminate()
            return
        self._runner.closing = True
        try:
            cut = not await self._runner.wait_calls(CLOSE_WAIT_S)
            if cut:
                log.warning("asynccoord.postgres.close_cut_calls calls=%d", self._runner.calls)
            await self._committer.flush()
            await self._acquirer.flush()
            await self._extender.flush()
            for claimer in list(self._claimers.values()):
                await claimer.flush()
            self._claimers.clear()
            self._refill.cancel_all()
            if self.pauses.announce == self._announce_pause:
                self.pauses.announce = None
            if self._background:
                with contextlib.suppress(Exception):
                    await asyncio.wait(set(self._background), timeout=5.0)
            listener, self._listener = self._listener, None
            if listener is not None:
                await listener.stop()
            # Hand-backs let through meanwhile (a lease released by a caller cancelled just before
            # close(), see CallGate.giving_back) are calls too: they end before the pool closes.
            settled = await self._runner.settle(_CUT_SETTLE_S if cut else CLOSE_WAIT_S)
            pool, self._runner.pool = self._runner.pool, None
            if pool is not None:
                if not settled:  # calls still hang after the waits: their connections are dropped
                    pool.terminate()
                else:
                    try:
                        await asyncio.wait_for(pool.close(), _IDLE_POOL_CLOSE_S)
                    except (TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
                        pool.terminate()
            await self._connector.settle(min(self.connect_timeout_s or _SETTLE_S, _SETTLE_S))
        finally:
            self._runner.closing = False

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

    async def now(self) -> float:
        """The store clock: seconds since the Unix epoch (the server's ``statement_timestamp()``)."""
        now = self._now()

        async def op(conn: asyncpg.Connection, _attempt: int) -> float:
            return float(await self._val(conn, "now", now=now))

        return await self._run(op, what="now", tx=False, ambiguous_ok=True)

    # --- enqueue ----------------------------------------------------------------------

    # --- claim ------------------------------------------------------------------------

    # --- complete ---------------------------------------------------------------------

    # --- fail, release, extend ------------------------------------------------------------

    # --- unchecked operations (benchmarks only) ------------------------------------------

    # --- inspection and maintenance ---------------------------------------------------
