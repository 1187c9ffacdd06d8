"""What only the PostgreSQL store has: dialect parity, migrations, connection loss, LISTEN/NOTIFY,
concurrency between stores, and opening stores from a target string.

The behavioural contract itself runs on PostgreSQL through the ``backend`` fixture of
``conftest.py`` (every contract test has a ``[postgres]`` variant).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import logging
import os
import socket
import time
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from services import PG_DSN, new_schema, postgres_problem, unavailable

from asynccoord import NewTask, SQLiteStore, StoreConfig, Task, TaskStatus
from asynccoord.backends.open import open_store, redact_location, redact_target, store_kind
from asynccoord.backends.postgres.store import PostgresStore, application_name, split_connect_timeout
from asynccoord.backends.redis import RedisLockStore
from asynccoord.backends.sqlfiles import load_queries
from asynccoord.cli.main import main
from asynccoord.errors import (
    InvalidArgumentError,
    LeaseLostError,
    SchemaVersionError,
    StoreConnectionError,
    StoreError,
    TaskNotFoundError,
)

# Query names that exist in one dialect only, and why (everything else must match).
SQLITE_ONLY = {
    "recompute_heads_of_tasks": "recompute_heads for keys stored as no text (a BLOB), which only SQLite can hold",
    "lock_insert": "PostgreSQL grants inside lock_live (coord_lock_acquire_many), one round trip per batch",
    "mark_ordered": "SQLite records a queue claimed in order by itself (PostgreSQL in keep_heads, coord_keep_heads)",
    "recompute_queue_heads": "heads of a queue computed when its first ordered claim arrives (PostgreSQL: keep_heads)",
    "record_processed_batch": "PostgreSQL records processed ids inside complete_batch (coord_complete_batch)",
    "claim_probe": "SQLite picks a pending-only claim when no lease of the queue has expired, a limited one if limited",
    "claim_pending": "the pending-only form of claim (no merge with expired leases)",
    "claim_pending_ordered": "the pending-only form of claim_ordered",
    "claim_pending_partitions": "claim_pending as a merge of per-partition seeks, for a node owning few partitions",
    "mark_partitioned": "a queue's tasks enter SQLite's per-partition index once claim_pending_partitions is used",
    "is_partitioned": "whether a queue's tasks are in SQLite's per-partition index",
    "flag_stretch_end": "the next stretch of the table whose tasks enter that index (seek.py)",
    "flag_partitioned_stretch": "the tasks of a queue in that stretch enter the index",
    "ordered_queues": "SQLite reads which queues keep heads with no lock (one writer; PostgreSQL: kept_queues)",
    "limited_pending": "SQLite streams a limited claim's pending tasks in index order (PostgreSQL's walk reads chunks)",
    "limited_pending_ordered": "the keys' heads form of limited_pending",
    "bucket_tat": "SQLite reads one bucket at a time (PostgreSQL: bucket_tats, a chunk's buckets at once)",
    "dead_letter_keys": "keys whose heads a policy change moves (PostgreSQL: inside coord_set_dead_letters)",
    "claim_key_head": "PostgreSQL leases a continuation's next head inside complete_batch (coord_complete_batch, v8)",
    "insert_task": "PostgreSQL inserts inside enqueue (coord_enqueue, schema revision 4), one round trip per call",
    "select_by_idempotency_key": "PostgreSQL reads the task holding a repeated key inside enqueue (coord_enqueue)",
}
POSTGRES_ONLY = {
    "lock_keys": "row locks of (queue, partition_key) that serialize head upkeep (SQLite has one writer)",
    "next_task_ids": "ids drawn before an enqueue that may run again, so it recognizes what its lost run created",
    "enqueue": "enqueue_many in one statement: locks, insert, promotion and notification (coord_enqueue)",
    "select_tasks": "many tasks by id in one statement",
    "exhausted_keys": "keys locked before dead_letter_exhausted runs",
    "dead_keys": "keys locked before requeue_dead runs",
    "release_many": "hands back the tasks of a claim whose caller was cancelled",
    "notify": "pg_notify: wakes idle nodes of other processes",
    "lock_find_owned": "after a lost connection, the grants an earlier attempt committed",
    "select_key_head": "after a lost connection, the next head a continuing commit's earlier attempt leased",
    "claimed_by_token": "after a lost connection, the tasks a claim's earlier attempt leased",
    "claim_batch": "the concurrent claims of a process's nodes in one statement (SQLite has one writer)",
    "claim_ordered_batch": "claim_batch for queues claimed in order",
    "lock_release_recheck": "after a lost connection, whether a release's earlier attempt deleted the lease",
    "share_queues": "shared advisory locks of queues, so a queue cannot start keeping heads mid-transition",
    "kept_queues": "which queues keep per-key heads, read after share_queues (SQLite: ordered_queues)",
    "keep_heads": "a queue starts keeping heads: recorded and computed under its exclusive lock (SQLite: two)",
    "lock_rate_limits": "a queue's exclusive advisory lock over its buckets (SQLite has one writer)",
    "bucket_tats": "the TATs of a chunk of candidates' buckets in one statement (SQLite: bucket_tat)",
    "claimable_partitions_limited": "claimable_partitions of a queue with limits, with each held partition's refill",
    "claimable_partitions_limited_ordered": "claimable_partitions_limited for an ordered claim",
    "queue_holds": "whether a queue holds keys behind dead tasks, read by discard_dead under share_queues",
}


def test_dialects_define_the_same_query_names() -> None:
    sqlite, postgres = set(load_queries("sqlite")), set(load_queries("postgres"))
    assert sqlite - postgres == set(SQLITE_ONLY)
    assert postgres - sqlite == set(POSTGRES_ONLY)


def test_open_store_picks_the_backend(tmp_path: Path) -> None:
    assert isinstance(open_store(tmp_path / "a.db"), SQLiteStore)
    assert isinstance(open_store(f"sqlite:///{tmp_path}/b.db"), SQLiteStore)
    assert store_kind("postgresql://u@h/db") == "postgres"
    assert store_kind("bot.db") == "sqlite"
    assert redact_target("postgresql://bot:secret@db:5432/coord") == "postgresql://bot:***@db:5432/coord"
    assert redact_target("postgresql://bot@db/coord?password=secret&sslmode=require") == (
        "postgresql://bot@db/coord?password=***&sslmode=require"
    )
    assert redact_target("redis://bot:s3cret@cache:6379/0") == "redis://bot:***@cache:6379/0"
    assert redact_target("redis://:s3cret@cache:6379/0") == "redis://:***@cache:6379/0"
    assert redact_target("redis://cache:6379/0") == "redis://cache:6379/0"
    assert redact_target("redis://cache/0;password=s3cret;x=1") == "redis://cache/0;password=***;x=1"
    assert redact_target("sqlite:///bot.db") == "sqlite:///bot.db"
    assert redact_target("bot.db") == "bot.db"
    with pytest.raises(ValueError, match="unknown store target"):
        open_store("mysql://h/db")
    with pytest.raises(InvalidArgumentError, match="schema= applies to a postgresql:// target only"):
        open_store(tmp_path / "c.db", schema="bot")  # a switch from PostgreSQL to SQLite: not a TypeError
    assert not (tmp_path / "c.db").exists()
    assert redact_target("postgresql:///coord?host=db&password=secret") == "postgresql:///coord?host=db&password=***"
    assert redact_target("postgresql://bot:secret@[::1/coord?password=secret") == (
        "postgresql://***@[::1/coord?password=***"
    )
    assert redact_location("postgresql://bot:secret@db:5432/coord?password=secret&x=1") == (
        "db:5432/coord?password=***&x=1"
    )
    assert redact_location("bot.db") == "bot.db"
    # Any case, any name holding "password", ";" as a separator; the rest unchanged.
    assert redact_target("postgresql://db/c?PASSWORD=s1&sslpassword=s2&sslmode=require") == (
        "postgresql://db/c?PASSWORD=***&sslpassword=***&sslmode=require"
    )
    assert redact_target("postgresql://db/c?sslmode=require;password=s3#x") == (
        "postgresql://db/c?sslmode=require;password=***#x"
    )
    assert redact_target("postgresql://db/c?pass%77ord=s4&a=%2F") == "postgresql://db/c?pass%77ord=***&a=%2F"
    assert redact_target("postgresql://u:s5@[::1/c?Password=s6;x=1") == "postgresql://***@[::1/c?Password=***;x=1"
    with pytest.raises(InvalidArgumentError) as info:
        open_store("mysql://bot:secret@h/db")
    assert "secret" not in str(info.value)
    assert "'mysql://bot:***@h/db'" in str(info.value)


def test_repr_and_connection_error_hide_the_password() -> None:
    store = PostgresStore("postgresql://postgres@127.0.0.1/test?password=s3cret&search_path=nosuch")
    assert repr(store) == "<PostgresStore '127.0.0.1/test?password=***&search_path=nosuch' closed>"
    store = PostgresStore("postgresql://postgres:s3cret@127.0.0.1/test", schema="s")
    assert repr(store) == "<PostgresStore '127.0.0.1/test' schema='s' closed>"
    assert "s3cret" not in repr(RedisLockStore("redis://:s3cret@127.0.0.1:6379/0?password=s3cret"))

    async def unreachable(dsn: str) -> str:
        store = PostgresStore(dsn, reconnect_timeout_s=0.5)
        with pytest.raises(StoreConnectionError) as info:
            await store.open()
        return str(info.value)

    for dsn in ("postgresql://u@127.0.0.1:1/test?password=hunter2", "postgresql://u:hunter2@127.0.0.1:1/test"):
        text = asyncio.run(unreachable(dsn))
        assert text.startswith("cannot connect to <PostgresStore '127.0.0.1:1/test"), text
        assert "hunter2" not in text


@pytest.mark.parametrize(
    ("dsn", "named"),
    [
        ("postgresql://postgres:s3cret@[::1/test", "'postgresql://***@[::1/test': Invalid IPv6 URL"),
        ("postgresql://postgres:s3cret@127.0.0.1:x/test", "got '127.0.0.1:x'"),
        ("postgresql://postgres:s3cret@h1:5432,h2:port/test", "got 'h2:port'"),
        ("postgresq://postgres:s3cret@127.0.0.1/test", "'postgresq://postgres:***@127.0.0.1/test'"),
        ("postgresql://postgres:s3cret@127.0.0.1:99999/test", "got '127.0.0.1:99999'"),
        ("postgresql://postgres:s3cret@127.0.0.1:0/test", "got '127.0.0.1:0'"),
        ("postgresql://app:Ab/cds3cret==@db:5432/test", "'postgresql://***@db:5432/test': a '/' before the '@'"),
        ("postgresql://app:A#bs3cret@db/test", "'postgresql://***@db/test'"),
        ("postgresql://app:A?bs3cret@db/test", "a host part that may hold a password (not shown)"),
        ("postgresql://postgres:s3cret@127.0.0.1/test\x00", "'postgresql://postgres:***@127.0.0.1/test%00': a NUL"),
        ("postgresql://postgres:s3cret@127.0.0.1/te%00st", "a NUL character"),
        ("postgresql://postgres:s3cret@127.0.0.1/test?port=abc", "port='abc' (each port 1..65535)"),
        ("postgresql://postgres:s3cret@h1,h2/test?port=5432,0", "port='5432,0'"),
        ("postgresql://postgres:s3cret@127.0.0.1/test?connect_timeout=2.5", "connect_timeout='2.5' must be whole"),
        ("postgresql://postgres:s3cret@127.0.0.1/test?connect_timeout=", "connect_timeout='' must be whole"),
        ("postgresql://postgres:s3cret@127.0.0.1/test?connect_timeout=5&connect_timeout=6", "given 2 times"),
        # a value that swallowed other parameters is not echoed (asyncpg separates them by "&" only)
        ("postgresql://postgres@127.0.0.1/test?connect_timeout=x;password=s3cret", "connect_timeout=(not shown)"),
        ("postgresql://postgres@127.0.0.1/test?connect_timeout=x%26password%3Ds3cret", "connect_timeout=(not shown)"),
        ("postgresql://postgres@127.0.0.1/test?connect_timeout=3%C2%A0", "connect_timeout=(not shown)"),
        ("postgresql://postgres@127.0.0.1/test?connect_timeout=s3cret", "connect_timeout=(not shown)"),
        ("postgresql://postgres@127.0.0.1/test?connect_timeout=2147483648", "at most 2147483647"),
    ],
)
def test_a_malformed_dsn_is_refused_at_construction_without_its_password(dsn: str, named: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        PostgresStore(dsn)
    assert named in str(info.value)
    assert "s3cret" not in str(info.value)
    for start in ("app:A", "Ab/"):  # no piece of a password either
        assert start not in str(info.value)
    fine_dsns = (
        "postgresql://u@[::1]:5432,127.0.0.1/db",
        "postgresql:///db?host=/tmp",
        "postgres://h:5432",
        "postgresql://h:/db",
        "postgresql://h1,h2/db?port=5432,5433",
    )
    for fine in fine_dsns:
        assert isinstance(PostgresStore(fine), PostgresStore)


@pytest.mark.parametrize(
    ("query", "timeout_s", "passed_on"),
    [
        ("", 10.0, ""),
        ("?sslmode=disable", 10.0, "?sslmode=disable"),
        ("?connect_timeout=5", 5.0, ""),
        ("?sslmode=disable&connect_timeout=7&application_name=x", 7.0, "?sslmode=disable&application_name=x"),
        ("?connect%5Ftimeout=3", 3.0, ""),
        ("?connect_timeout=1", 2.0, ""),  # libpq's least is 2 s
        ("?connect_timeout=0", None, ""),  # zero or less: no limit, as in libpq
        ("?connect_timeout=-4", None, ""),
        ("?connect_timeout=+12", 12.0, ""),
        ("?connect_timeout=00000000005", 5.0, ""),  # libpq's strtol() reads leading zeros
        ("?connect_timeout=2147483647", 2147483647.0, ""),
    ],
)
def test_libpqs_connect_timeout_is_the_connect_timeout_and_not_a_server_setting(
    query: str, timeout_s: float | None, passed_on: str
) -> None:
    store = PostgresStore("postgresql://u@127.0.0.1:5432/test" + query)
    assert store.connect_timeout_s == timeout_s
    assert store._connect_dsn == "postgresql://u@127.0.0.1:5432/test" + passed_on
    assert store.dsn == "postgresql://u@127.0.0.1:5432/test" + query


async def test_connect_timeout_bounds_a_connection_to_a_server_that_never_answers() -> None:
    """A listener that accepts and stays silent: the DSN's 2 s, not the default 10 s, ends the wait."""
    accepted: list[asyncio.StreamWriter] = []

    async def silent(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    store = PostgresStore(f"postgresql://u@127.0.0.1:{port}/test?connect_timeout=2", reconnect_timeout_s=0.1)
    started = time.monotonic()
    try:
        with pytest.raises(StoreConnectionError, match="timed out: the server did not answer within the connect"):
            await store.open()
    finally:
        server.close()
        for writer in accepted:
            writer.close()
    waited_s = time.monotonic() - started
    assert accepted, "the store never reached the listener"
    assert 1.5 <= waited_s < 8.0, waited_s


def test_split_connect_timeout_checks_the_dsn_before_showing_any_of_it() -> None:
    """The demo and the benchmarks call it on a DSN no store has checked: a password holding an
    unencoded "?" must not show in its message (the part before the "?" ends inside it)."""
    with pytest.raises(InvalidArgumentError) as info:
        split_connect_timeout("postgresql://u:pa?ss3cret@h/db?sslmode=disable&connect_timeout=abc")
    assert "u:pa" not in str(info.value)
    assert "s3cret" not in str(info.value)


def test_a_dsn_asyncpg_refuses_on_open_is_an_invalid_argument() -> None:
    store = PostgresStore("postgresql://u:s3cret@127.0.0.1:1/test?sslmode=bogus&password=s3cret")
    with pytest.raises(InvalidArgumentError) as info:
        asyncio.run(store.open())
    assert "sslmode" in str(info.value)
    assert "s3cret" not in str(info.value)
    assert repr(store).endswith(" closed>")


@pytest.mark.parametrize("command", [["status"], ["dead", "--queue", "outbox"]])
def test_a_malformed_dsn_is_a_usage_error_of_one_line_without_the_password(
    capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    # A usage error (exit 2), as run says of it: the target is checked before anything opens.
    with pytest.raises(SystemExit) as exited:
        main([*command, "--db", "postgresql://postgres:s3cret@[::1/test"])
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"usage: python -m asynccoord {command[0]}")
    error_lines = [line for line in err.splitlines() if "error:" in line]
    said = "malformed PostgreSQL DSN 'postgresql://***@[::1/test': Invalid IPv6 URL"
    assert error_lines == [f"python -m asynccoord {command[0]}: error: {said}"]
    assert "s3cret" not in err


# --- with a server ----------------------------------------------------------------------


@pytest.fixture
def pg() -> str:
    problem = postgres_problem()
    if problem is not None:
        unavailable("PostgreSQL", problem)
    return PG_DSN


@pytest.fixture
async def schema(pg: str) -> AsyncIterator[str]:
    import asyncpg

    name = new_schema("pgt")
    yield name
    conn = await asyncpg.connect(pg)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    finally:
        await conn.close()


async def admin(pg: str, sql: str, *args: Any) -> Any:
    import asyncpg

    conn = await asyncpg.connect(pg)
    try:
        return await conn.fetch(sql, *args)
    finally:
        await conn.close()


async def test_close_drops_a_connection_whose_release_was_cancelled_before_it_began(pg: str, schema: str) -> None:
    """asyncpg releases a pool connection in a task of its own (``asyncio.shield``). ``asyncio.run``,
    ending a program on an exit raised in another task, cancels every task left, such a release
    among them, before its first step: it never runs, and the connection stays in use with nobody
    to release it. ``close()`` waited 10 s for it (in about 1 exit in 10 of a runtime busy on the store)."""
    store = PostgresStore(pg, schema=schema, listen=False)
    await store.open()
    pool = store._runner.pool
    assert pool is not None
    proxy = await pool.acquire()
    await proxy.execute("SELECT 1")
    releasing = asyncio.ensure_future(pool.release(proxy))
    await asyncio.sleep(0)  # its first step shields the holder's release in a new task, not begun yet
    inner = [t for t in asyncio.all_tasks() if t.get_coro().__qualname__ == "PoolConnectionHolder.release"]
    assert len(inner) == 1
    for task in (*inner, releasing):  # as asyncio.run does: every task, in no order
        task.cancel()
    await asyncio.wait({*inner, releasing})
    started = time.monotonic()
    await store.close()
    assert time.monotonic() - started < 3.0
    assert store._runner.pool is None


async def test_open_store_opens_postgres(pg: str, schema: str) -> None:
    async with open_store(pg, schema=schema) as store:
        assert type(store).__name__ == "PostgresStore"
        assert (await store.enqueue("q", 1)).created


async def test_a_dsn_with_connect_timeout_opens(pg: str, schema: str) -> None:
    """asyncpg would send ``connect_timeout`` to the server as a setting, which refuses it."""
    sep = "&" if "?" in pg else "?"
    async with open_store(f"{pg}{sep}connect_timeout=5", schema=schema) as store:
        assert (await store.enqueue("q", 1)).created
        assert [t.payload for t in await store.claim("q", node_id="n", lease_s=5)] == [1]


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("", None),  # this process: "asynccoord <pid>@<host>"
        ("application_name=mybot", "mybot"),
        ("application%5Fname=encoded", "encoded"),
    ],
)
async def test_sessions_carry_the_dsns_application_name_else_asynccoord_and_the_process(
    pg: str, schema: str, query: str, named: str | None
) -> None:
    """The store sets ``application_name`` to "asynccoord <pid>@<host>" unless the DSN names one."""
    named = named or f"asynccoord {os.getpid()}@{socket.gethostname()}"[:63]
    dsn = pg + (("&" if "?" in pg else "?") + query if query else "")
    async with PostgresStore(dsn, schema=schema, listen=False, pool_min_size=1, pool_max_size=1) as store:
        pid = await store._runner.run(lambda conn, _a: conn.fetchval("SELECT pg_backend_pid()"), what="pid", tx=False)
        assert [
            tuple(r) for r in await admin(pg, "SELECT application_name FROM pg_stat_activity WHERE pid = $1", pid)
        ] == [(named,)]


async def test_a_newer_schema_is_refused(pg: str, schema: str) -> None:
    from asynccoord.backends.postgres.store import SCHEMA_VERSION, PostgresStore

    async with PostgresStore(pg, schema=schema):
        pass
    newer = str(SCHEMA_VERSION + 1)
    await admin(pg, f"UPDATE \"{schema}\".coord_meta SET value = $1 WHERE key = 'schema_revision'", newer)
    with pytest.raises(SchemaVersionError, match="upgrade asynccoord"):
        async with PostgresStore(pg, schema=schema):
            pass


async def test_a_schema_revision_that_is_no_number_is_refused_untouched(pg: str, schema: str) -> None:
    from asynccoord.backends.postgres.store import PostgresStore

    async with PostgresStore(pg, schema=schema, listen=False):
        pass
    await admin(pg, f"UPDATE \"{schema}\".coord_meta SET value = '3x' WHERE key = 'schema_revision'")
    for read_only in (False, True):  # a ValueError of int() escaped both
        with pytest.raises(SchemaVersionError) as info:
            async with PostgresStore(pg, schema=schema, listen=False, read_only=read_only):
                pass
        assert "records schema revision '3x' in its coord_meta table, which is no revision number" in str(info.value)
        assert str(info.value).endswith("the database was altered or damaged; restore it from a backup")
    rows = await admin(pg, f'SELECT key, value FROM "{schema}".coord_meta ORDER BY key')
    assert [tuple(r) for r in rows] == [("partitions", "1024"), ("schema_revision", "3x")]


async def test_a_partition_count_that_is_no_number_is_refused_untouched(pg: str, schema: str) -> None:
    from asynccoord.backends.postgres.store import PostgresStore

    async with PostgresStore(pg, schema=schema, listen=False):
        pass
    await admin(pg, f"UPDATE \"{schema}\".coord_meta SET value = '3x' WHERE key = 'partitions'")
    for read_only in (False, True):
        with pytest.raises(SchemaVersionError) as info:
            async with PostgresStore(pg, schema=schema, listen=False, read_only=read_only):
                pass
        assert "records '3x' as its partition count in its coord_meta table, which is no partition count" in str(
            info.value
        )
    rows = await admin(pg, f'SELECT key, value FROM "{schema}".coord_meta WHERE key = $1', "partitions")
    assert [tuple(r) for r in rows] == [("partitions", "3x")]


async def test_a_pre_release_schema_is_refused_untouched_with_the_fix(pg: str, schema: str) -> None:
    """A schema made before the history was squashed records ``schema_version`` (no revision)."""
    from asynccoord.backends.postgres.store import PostgresStore

    await admin(pg, f'CREATE SCHEMA "{schema}"')
    await admin(pg, f'CREATE TABLE "{schema}".coord_meta (key text PRIMARY KEY, value text NOT NULL)')
    await admin(pg, f"INSERT INTO \"{schema}\".coord_meta VALUES ('schema_version', '9'), ('partitions', '64')")
    for read_only in (False, True):
        with pytest.raises(SchemaVersionError, match=r"before 0\.1\.0 \(schema version 9 ") as info:
            async with PostgresStore(pg, schema=schema, listen=False, read_only=read_only):
                pass
        assert f"drop its schema (DROP SCHEMA {schema} CASCADE)" in str(info.value)
    rows = await admin(pg, f'SELECT key, value FROM "{schema}".coord_meta ORDER BY key')
    assert [tuple(r) for r in rows] == [("partitions", "64"), ("schema_version", "9")]
    tables = await admin(pg, "SELECT tablename FROM pg_tables WHERE schemaname = $1", schema)
    assert [r["tablename"] for r in tables] == ["coord_meta"]  # nothing created


async def test_a_new_schema_records_its_revision_and_no_pre_release_version(pg: str, schema: str) -> None:
    from asynccoord.backends.postgres.store import SCHEMA_VERSION, PostgresStore

    async with PostgresStore(pg, schema=schema, listen=False):
        pass
    rows = await admin(pg, f'SELECT key, value FROM "{schema}".coord_meta ORDER BY key')
    assert [tuple(r) for r in rows] == [("partitions", "1024"), ("schema_revision", str(SCHEMA_VERSION))]


async def test_an_unreachable_server_raises_a_typed_error() -> None:
    from asynccoord.backends.postgres.store import PostgresStore

    store = PostgresStore("postgresql://postgres@127.0.0.1:1/test", reconnect_timeout_s=0.5)
    with pytest.raises(StoreConnectionError) as info:
        await store.open()
    assert info.value.__cause__ is not None


async def test_a_transaction_whose_session_the_server_ends_is_retried_for_the_error_that_ended_it(
    pg: str, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The rollback attempt after a lost session must not replace the error: asyncpg's pool
    detaches the connection's proxy when the server ends the session, and even ``is_closed()``
    on it raised ("connection has been released back to the pool"), which was retried and
    logged in place of the lost connection."""
    caplog.set_level(logging.INFO, logger="asynccoord.backends.postgres.conn")
    async with PostgresStore(pg, schema=schema, listen=False) as store:

        async def ends_its_own_session_once(conn: Any, attempt: int) -> int:
            if attempt == 0:
                await conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
            return int(await conn.fetchval("SELECT 7"))

        assert await store._runner.run(ends_its_own_session_once, what="probe") == 7
    retried = [r.getMessage() for r in caplog.records if "asynccoord.postgres.retry what=probe" in r.getMessage()]
    assert len(retried) == 1
    assert "terminating connection due to administrator command" in retried[0]
    assert "released back to the pool" not in retried[0]


async def test_a_call_whose_first_failure_comes_after_reconnect_timeout_s_is_still_retried(
    pg: str, schema: str
) -> None:
    """The retry budget runs from the first failure, not from the call's start: a process frozen
    mid-call (SIGSTOP, a long pause) past ``reconnect_timeout_s``, its session ended meanwhile,
    retried nothing and raised at once (every node's claim of that turn failed)."""
    async with PostgresStore(pg, schema=schema, listen=False, reconnect_timeout_s=0.3) as store:

        async def slow_then_session_ended(conn: Any, attempt: int) -> int:
            if attempt == 0:
                await asyncio.sleep(0.6)  # longer than the whole budget, before anything failed
                await conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
            return int(await conn.fetchval("SELECT 7"))

        assert await store._runner.run(slow_then_session_ended, what="probe") == 7


async def test_a_call_cancelled_while_its_begin_is_answered_closes_the_session_quietly(pg: str, schema: str) -> None:
    """asyncpg counts a transaction open once its BEGIN is sent, but the session reports one only
    when the answer arrives: a call cancelled in between must close the session too (a breaker's
    find: a proxy delaying the server's answers, and ``enqueue_many`` cancelled during its BEGIN;
    an enqueue is one statement now, so a transaction of the runner's inserting a row stands in)."""
    delay_s = 0.0
    target = urllib.parse.urlsplit(pg)

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delayed: bool) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                if delayed and delay_s:
                    await asyncio.sleep(delay_s)
                writer.write(data)
        writer.close()

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(target.hostname or "127.0.0.1", target.port or 5432)
        await asyncio.gather(pipe(client_r, server_w, False), pipe(server_r, client_w, True))

    proxy = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = proxy.sockets[0].getsockname()[1]
    loop = asyncio.get_running_loop()
    reported: list[str] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(str(context.get("message"))))
    try:
        user, at, _ = target.netloc.rpartition("@")
        dsn = urllib.parse.urlunsplit(target._replace(netloc=f"{user}{at}127.0.0.1:{port}"))
        async with PostgresStore(dsn, schema=schema, listen=False, pool_min_size=1, pool_max_size=1) as store:
            await admin(pg, f'CREATE TABLE "{schema}".probe (x int)')

            async def insert_row(conn: Any, _attempt: int) -> None:
                await conn.execute(f'INSERT INTO "{schema}".probe VALUES (1)')

            delay_s = 0.1  # every answer of the server now comes 0.1 s late
            for _ in range(3):
                call = asyncio.ensure_future(store._runner.run(insert_row, what="probe"))
                await asyncio.sleep(0.03)  # the BEGIN is at the server, its answer on the way
                call.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await call
            delay_s = 0.0
            await asyncio.sleep(0.3)  # the late answers are in
            assert (await store.enqueue("q", 2)).created
            assert (await store.stats("q")).counts[TaskStatus.PENDING] == 1
            # the cancelled transactions rolled back with their sessions
            assert (await admin(pg, f'SELECT count(*) FROM "{schema}".probe'))[0][0] == 0
    finally:
        loop.set_exception_handler(previous)
        proxy.close()
    assert not [m for m in reported if "active transaction" in m], reported


@pytest.mark.parametrize("where", ["commit", "managed"])
async def test_a_call_cancelled_inside_its_transaction_closes_the_session_quietly(
    pg: str, schema: str, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled while the session is still inside a transaction (its COMMIT at the server, say),
    a call must not hand the connection back to asyncpg's pool, which rolls it back and reports
    "Resetting connection with an active transaction" through the loop's exception handler."""
    import asyncpg.transaction

    loop = asyncio.get_running_loop()
    reported: list[str] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(str(context.get("message"))))
    try:
        async with PostgresStore(pg, schema=schema, listen=False, pool_min_size=1, pool_max_size=1) as store:
            if where == "commit":  # the runner's own transaction, cut short in its COMMIT
                commit = asyncpg.transaction.Transaction.commit

                async def slow_commit(self: Any) -> None:
                    await self._connection.execute("SELECT pg_sleep(2)")
                    await commit(self)

                monkeypatch.setattr(asyncpg.transaction.Transaction, "commit", slow_commit)

                async def op(conn: Any, _attempt: int) -> int:
                    return int(await conn.fetchval("SELECT 1"))

                call = asyncio.ensure_future(store._runner.run(op, what="probe"))
            else:  # a transaction of the operation's own (as stats() has), cut short in its exit

                async def op(conn: Any, _attempt: int) -> int:
                    transaction = conn.transaction()
                    await transaction.start()
                    await conn.execute("SELECT pg_sleep(2)")
                    return 1

                call = asyncio.ensure_future(store._runner.run(op, what="probe", tx=False))
            await asyncio.sleep(0.5)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            monkeypatch.undo()
            # The pool's one connection was replaced: the store goes on.
            assert (await store.enqueue("q", 1)).created
            assert (await store.stats("q")).counts[TaskStatus.PENDING] == 1
            await asyncio.sleep(0.1)
    finally:
        loop.set_exception_handler(previous)
    assert not [m for m in reported if "active transaction" in m], reported


@pytest.mark.parametrize("how", ["cancelled", "unencodable"])
async def test_an_autocommit_call_cut_short_after_its_parse_leaves_no_transaction_open(
    pg: str, schema: str, how: str
) -> None:
    """asyncpg prepares a statement with Parse and Describe but no Sync, which opens an implicit
    transaction on the server; a call cut short before its Bind ("cancelled" right after the
    prepare, or an argument asyncpg cannot encode) left the pooled session in it, holding a
    snapshot and table locks, and the next ``stats()`` on that connection failed with "SET
    TRANSACTION ISOLATION LEVEL must be called before any query" (a cancellation storm's find)."""
    import asyncpg

    async with PostgresStore(pg, schema=schema, listen=False, pool_min_size=1, pool_max_size=1) as store:
        await store.enqueue("q", 1)
        pids: list[int] = []

        async def op(conn: Any, _attempt: int) -> int:
            pids.append(conn.get_server_pid())
            if how == "cancelled":
                await conn.prepare(f'SELECT count(*) FROM "{schema}".coord_tasks')
                asyncio.current_task().cancel()  # type: ignore[union-attr]
                await asyncio.sleep(0)
                return 0
            return int(await conn.fetchval("SELECT $1::int + 1", "not a number"))

        if how == "cancelled":
            with pytest.raises(asyncio.CancelledError):
                await store._runner.run(op, what="probe", tx=False)
        else:
            with pytest.raises(StoreError) as info:
                await store._runner.run(op, what="probe", tx=False)
            assert isinstance(info.value.__cause__, asyncpg.DataError)
        state = await admin(pg, "SELECT state, backend_xmin FROM pg_stat_activity WHERE pid = $1", pids[0])
        assert [tuple(row) for row in state] == [("idle", None)]
        # The same (only) connection serves a call that opens its own snapshot.
        assert (await store.stats("q")).counts[TaskStatus.PENDING] == 1


async def test_a_cancelled_call_whose_session_dies_before_its_cleanup_stays_cancelled(pg: str, schema: str) -> None:
    """The release hook's statement failing (the session ended by the server meanwhile) raised out
    of the pool's release in place of the caller's cancellation: the runner took it for a lost
    connection and ran the cancelled operation again (a breaker's find)."""
    async with PostgresStore(pg, schema=schema, listen=False, pool_min_size=1, pool_max_size=1) as store:
        attempts: list[int] = []

        async def op(conn: Any, attempt: int) -> int:
            attempts.append(attempt)
            await conn.prepare(f'SELECT count(*) FROM "{schema}".coord_tasks')
            await admin(pg, "SELECT pg_terminate_backend($1)", conn.get_server_pid())
            asyncio.current_task().cancel()  # type: ignore[union-attr]
            await asyncio.sleep(0)
            return 0

        with pytest.raises(asyncio.CancelledError):
            await store._runner.run(op, what="probe", tx=False, ambiguous_ok=True)
        assert attempts == [0]
        assert (await store.stats("q")).counts[TaskStatus.PENDING] == 0  # a new session serves the next call


async def test_a_commit_refused_by_the_server_keeps_its_session(pg: str, schema: str) -> None:
    """A server error at COMMIT (a deferred unique constraint) ends the transaction cleanly: the
    session goes back to the pool instead of being closed and opened anew."""
    async with PostgresStore(pg, schema=schema, listen=False, pool_min_size=1, pool_max_size=1) as store:
        table = f'"{schema}".deferred_probe'
        await store._runner.run(
            lambda conn, _a: conn.execute(f"CREATE TABLE {table} (x int UNIQUE DEFERRABLE INITIALLY DEFERRED)"),
            what="probe",
        )
        pids: list[int] = []

        async def twice(conn: Any, _attempt: int) -> None:
            pids.append(conn.get_server_pid())
            await conn.execute(f"INSERT INTO {table} VALUES (1), (1)")  # refused only at COMMIT

        with pytest.raises(StoreError, match="UniqueViolation"):
            await store._runner.run(twice, what="probe")
        # An autocommit statement the server refuses: its session is not marked for cleanup either.
        with pytest.raises(StoreError, match="DivisionByZero"):
            await store._runner.run(lambda conn, _a: conn.fetchval("SELECT 1 / 0"), what="probe", tx=False)
        assert not store._runner._interrupted
        after = await store._runner.run(lambda conn, _a: conn.fetchval("SELECT pg_backend_pid()"), what="pid", tx=False)
        assert after == pids[0]


@pytest.mark.exclusive  # it counts every asynccoord session of the server, other tests' too
async def test_calls_cancelled_while_the_pool_connects_leave_no_unretrieved_exception_and_no_session(
    pg: str, schema: str
) -> None:
    """asyncpg 0.32 leaves "Future exception was never retrieved ... unexpected connection_lost()
    call" behind when a connection attempt is cancelled during its SSL negotiation
    (MagicStack/asyncpg#1211): 34 times in 200 such cancellations before the store's
    connections were opened to completion. The abandoned attempts' connections are closed."""
    import gc
    import random

    sessions = "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'asynccoord %'"
    before = (await admin(pg, sessions))[0][0]
    loop = asyncio.get_running_loop()
    reported: list[str] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(str(context.get("message"))))
    rng = random.Random(7)
    try:
        async with PostgresStore(pg, schema=schema, listen=False, pool_min_size=1, pool_max_size=1) as store:
            for _ in range(200):
                await store._runner.pool.expire_connections()  # the next call opens a connection
                call = asyncio.ensure_future(store.stats("q"))
                await asyncio.sleep(rng.uniform(0.0, 0.004))  # cancelled while it connects, often
                call.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await call
            assert (await store.stats("q")).counts[TaskStatus.PENDING] == 0
        assert not store._connector._abandoned
        gc.collect()  # an unretrieved exception is reported when its future is collected
        await asyncio.sleep(0.1)
    finally:
        loop.set_exception_handler(previous)
    assert not [m for m in reported if "never retrieved" in m], reported[:3]
    for _ in range(40):  # a closed session's backend takes a moment to leave pg_stat_activity
        if (await admin(pg, sessions))[0][0] <= before:
            break
        await asyncio.sleep(0.05)
    assert (await admin(pg, sessions))[0][0] <= before


@pytest.mark.exclusive  # it kills every asynccoord connection to the database, other tests' too
async def test_connections_killed_by_the_server_are_retried(pg: str, schema: str) -> None:
    """pg_terminate_backend on every connection of the store, between and during operations."""
    from asynccoord.backends.postgres.store import PostgresStore

    async with PostgresStore(pg, schema=schema, pool_min_size=4, pool_max_size=4) as store:
        await store.enqueue_many([NewTask(queue="q", payload=i, partition_key=f"k{i % 7}") for i in range(200)])
        done = 0
        kills = 0
        for round_ in range(10):
            claimed = await store.claim("q", node_id="n", limit=20, lease_s=30)
            if round_ % 2 == 0:  # kill while idle in the pool...
                rows = await admin(
                    pg,
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE 'asynccoord %'"
                    " AND datname = current_database() AND pid <> pg_backend_pid()",
                )
                kills += len(rows)
            # ...and while the commit runs
            commit = asyncio.ensure_future(store.complete_many(claimed))
            await asyncio.sleep(0)
            outcomes = await commit
            done += sum(1 for o in outcomes if not isinstance(o, Exception))
            assert not [o for o in outcomes if isinstance(o, LeaseLostError)]
        assert done == 200
        stats = await store.stats("q")
        assert {s.value: n for s, n in stats.counts.items()} == {"pending": 0, "running": 0, "done": 200, "dead": 0}
        assert kills > 0
        # the listener reconnects too
        deadline = time.monotonic() + 5
        while not store.listening and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert store.listening


async def test_a_pause_announced_on_a_connection_the_server_ended_is_retried(pg: str, schema: str) -> None:
    """A provider's pause (a 429 under a lock) reaches the other processes though the pooled
    connection its NOTIFY takes was just ended by the server: the announcement retries on a
    new connection, as every call does, and announces what is left of the pause. It was
    dropped at once (``pause_not_announced``), and the other processes' sends claimed before
    the 429 went out during its Retry-After."""
    import asyncpg

    name = f"pause-retry-{schema}"  # this store's sessions alone (others of the process share its default name)
    dsn = f"{pg}{'&' if '?' in pg else '?'}application_name={name}"
    async with PostgresStore(dsn, schema=schema, listen=False, pool_min_size=1, pool_max_size=1) as store:
        await store.stats("q")  # the pool's one connection is open
        mine = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1"
        listener = await asyncpg.connect(pg)
        heard: list[dict[str, Any]] = []
        try:
            await listener.add_listener(store.channel, lambda *args: heard.append(json.loads(args[3])))
            for n in range(5):
                [[ended]] = await admin(pg, mine, name)
                assert ended is True
                store.pauses.announce(f"account:{n}", 2.0)
                deadline = time.monotonic() + 5
                while len(heard) <= n and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
            assert [h["z"] for h in heard] == [f"account:{n}" for n in range(5)]
            assert all(0 < h["t"] <= 2.0 for h in heard)
        finally:
            await listener.close()


async def test_a_listener_killed_again_and_again_backs_off_while_the_idle_poll_drains_the_queue(
    pg: str, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The store's LISTEN session is ended (pg_terminate_backend) as soon as it shows, for 3 s.

    The listener waits a growing, jittered delay before each new connection, reset only by
    a connection that stayed up: a bounded number of connections and warnings, not one of
    each per kill in a tight loop. Meanwhile the idle nodes find the work another store
    enqueues with their poll, and once the kills stop the listener is back. Only this
    process's listening sessions on this test's channel are ended.
    """
    import asyncpg

    from asynccoord import NodeConfig, Runtime

    caplog.set_level(logging.INFO, logger="asynccoord.backends.postgres.conn")
    listening = (
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1"
        " AND query LIKE 'LISTEN %' AND query LIKE $2 AND pid <> pg_backend_pid()"
    )
    sent: list[int] = []

    async def send(task: Task) -> None:
        sent.append(task.payload)

    config = NodeConfig(queue="q", idle_min_s=0.01, idle_max_s=0.2, idle_fallback_s=60.0)
    async with (
        PostgresStore(pg, schema=schema) as store,
        PostgresStore(pg, schema=schema, listen=False) as producer,
        Runtime(store, send=send, nodes=2, config=config) as runtime,
    ):
        listener = store._listener
        assert listener is not None
        assert store.listening
        connects = 0
        real_connect = listener._connect

        async def counted_connect() -> Any:
            nonlocal connects
            connects += 1
            return await real_connect()

        listener._connect = counted_connect  # type: ignore[method-assign]
        assert runtime.idle_poller is not None
        killer = await asyncpg.connect(pg)
        kills = 0
        batch = [NewTask(queue="q", payload=i, partition_key=f"k{i}") for i in range(20)]
        try:
            started = time.monotonic()
            polls_before = runtime.idle_poller.polls
            while (elapsed := time.monotonic() - started) < 3.0:
                kills += len(await killer.fetch(listening, application_name(), f"%{store.channel}%"))
                if elapsed >= 1.0 and batch:  # once, another store's enqueue: only a notification or the poll tells
                    await producer.enqueue_many(batch)
                    batch = []
                await asyncio.sleep(0.01)
            drained = sorted(sent)
            polls = runtime.idle_poller.polls - polls_before
        finally:
            await killer.close()
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        deadline = time.monotonic() + 15.0
        while not store.listening and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert store.listening  # back once the kills stopped
    assert kills >= 2  # the session was ended again and again
    assert connects < 30, connects
    assert len(warnings) < 30, warnings
    assert all("listen_lost" in w or "listen_failed" in w for w in warnings), warnings
    assert drained == list(range(20))  # found by the idle poll while the listener was down
    assert polls > 0


async def test_a_statement_cut_off_mid_flight_is_retried_or_raises_a_typed_error(pg: str, schema: str) -> None:
    """Before COMMIT nothing was written: retried. An autocommit write cut off is ambiguous: raised."""
    from asynccoord.backends.postgres.store import STORE_RETRIES, PostgresStore

    async def kill_sleeper(marker: str) -> None:
        for _ in range(100):
            found = await admin(
                pg,
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE query LIKE $1 AND pid <> pg_backend_pid()",
                f"%{marker}%",
            )
            if found:
                return
            await asyncio.sleep(0.02)
        raise AssertionError("the sleeping statement never showed up")

    async with PostgresStore(pg, schema=schema) as store:

        async def in_transaction(conn: Any, attempt: int) -> int:
            if attempt == 0:
                await conn.execute("SELECT pg_sleep(5) -- marker-tx")
            return attempt

        running = asyncio.ensure_future(store._run(in_transaction, what="test", tx=True))
        await kill_sleeper("marker-tx")
        assert await running == 1  # the second attempt, on a fresh connection
        assert store.events.get(STORE_RETRIES) == 1

        async def autocommit(conn: Any, attempt: int) -> int:
            await conn.execute("SELECT pg_sleep(5) -- marker-ac")
            return attempt

        running = asyncio.ensure_future(store._run(autocommit, what="test write", tx=False))
        await kill_sleeper("marker-ac")
        with pytest.raises(StoreConnectionError, match="test write") as info:
            await running
        assert info.value.__cause__ is not None
        assert (await store.enqueue("q", 1)).created  # the store goes on


async def test_notify_wakes_at_most_the_needed_idle_nodes_of_another_process(pg: str, schema: str) -> None:
    from asynccoord.backends.postgres.store import PostgresStore

    async with PostgresStore(pg, schema=schema) as producer, PostgresStore(pg, schema=schema) as consumer:
        assert consumer.listening
        waiters = [asyncio.ensure_future(consumer.notifier.wait("q", 5.0)) for _ in range(4)]
        await asyncio.sleep(0.05)
        started = time.monotonic()
        await producer.enqueue_many([NewTask(queue="q", payload=i, partition_key=f"k{i}") for i in range(2)])
        while sum(w.done() for w in waiters) < 2 and time.monotonic() - started < 2.0:
            await asyncio.sleep(0.01)
        assert time.monotonic() - started < 1.0  # woken at once, not by the 5 s timeout
        await asyncio.sleep(0.2)
        assert sum(w.done() for w in waiters) == 2  # two tasks: two nodes woken, not four
        for waiter in waiters:
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter


async def test_concurrent_completes_of_a_process_are_group_committed(pg: str, schema: str) -> None:
    from asynccoord.backends.postgres.store import PostgresStore

    async with PostgresStore(pg, schema=schema, listen=False) as store:
        await store.enqueue_many([NewTask(queue="q", payload=i, partition_key=f"k{i % 8}") for i in range(64)])
        tasks = await store.claim("q", node_id="n", limit=64, lease_s=30)
        assert len(tasks) == 64
        before = store.transactions
        done = await asyncio.gather(*(store.complete(t, {"i": t.payload}) for t in tasks))
        assert [d.result for d in done] == [{"i": t.payload} for t in tasks]
        assert store.transactions - before <= 4  # one transaction per batch, not one per task
        stale = await asyncio.gather(*(store.complete(t) for t in tasks[:2]), return_exceptions=True)
        assert all(isinstance(e, LeaseLostError) for e in stale)
        assert (await store.stats("q")).counts[TaskStatus.DONE] == 64


async def test_concurrent_lease_renewals_of_a_process_share_one_statement(pg: str, schema: str) -> None:
    """A process's nodes renew their leases at the same moments: their extend_many calls go to
    the server as one statement, each answered for its own leases, each with its own TTL."""
    from asynccoord.backends.postgres.store import PostgresStore

    async with PostgresStore(pg, schema=schema, listen=False, pool_max_size=1) as store:
        await store.enqueue_many([NewTask(queue="q", payload=i) for i in range(12)])
        held = [await store.claim("q", node_id=f"n{i}", limit=3, lease_s=30) for i in range(4)]
        await store.complete(held[3][1])  # no longer leased: its renewal reports False
        statements: list[str] = []
        pool = store._runner.pool
        assert pool is not None
        async with pool.acquire() as conn:
            conn.add_query_logger(lambda record: statements.append(record.query))
        before = await store.now()
        ttls = (60.0, 120.0, 90.0, 45.0)
        out = await asyncio.gather(*(store.extend_many(tasks, ttl) for tasks, ttl in zip(held, ttls, strict=True)))
        after = await store.now()
        assert out == [[True] * 3, [True] * 3, [True] * 3, [True, False, True]]
        assert len([s for s in statements if "lease_expires_at" in s and "unnest" in s]) == 1
        for tasks, ttl in zip(held, ttls, strict=True):
            for task in tasks:
                stored = await store.get(task.id)
                if stored.status is TaskStatus.RUNNING:
                    assert stored.lease_expires_at is not None
                    assert before + ttl <= stored.lease_expires_at <= after + ttl
        assert (await store.get(held[3][1].id)).status is TaskStatus.DONE

        # A caller cancelled while its renewal is queued: the renewal still runs with the batch.
        before = await store.now()
        first = asyncio.ensure_future(store.extend_many(held[0], 300))
        second = asyncio.ensure_future(store.extend_many(held[1], 600))
        await asyncio.sleep(0)  # both are queued for one statement
        second.cancel()
        assert await first == [True] * 3
        with pytest.raises(asyncio.CancelledError):
            await second
        for task in held[1]:
            renewed = await store.get(task.id)
            assert renewed.lease_expires_at is not None
            assert renewed.lease_expires_at >= before + 600


@pytest.mark.parametrize("ordered", [False, True])
async def test_concurrent_claims_of_a_process_share_one_statement(pg: str, schema: str, ordered: bool) -> None:
    """When a process's nodes wake to new work at once, their claims (each naming its own
    partitions) go to the server as one statement, each answered with its own tasks; a
    caller cancelled meanwhile gets nothing and its tasks are handed back."""
    from asynccoord.backends.postgres.store import PostgresStore

    async with PostgresStore(pg, schema=schema, listen=False, pool_max_size=1) as store:
        created = await store.enqueue_many([NewTask(queue="q", payload=i, partition_key=f"k{i}") for i in range(24)])
        parts = sorted({r.task.partition for r in created})
        groups = [parts[i::4] for i in range(4)]
        statements: list[str] = []
        pool = store._runner.pool
        assert pool is not None
        async with pool.acquire() as conn:
            conn.add_query_logger(lambda record: statements.append(record.query))
        if ordered:  # the queue's heads are kept from its first ordered claim on (one-time set-up)
            assert await store.claim("q", node_id="warm-up", partitions=[0], ordered=True) == []
            statements.clear()
        out = await asyncio.gather(
            *(
                store.claim("q", node_id=f"n{i}", limit=100, lease_s=30, partitions=groups[i], ordered=ordered)
                for i in range(4)
            )
        )
        assert len([q for q in statements if "WITH ORDINALITY" in q]) == 1
        assert len([q for q in statements if "UPDATE coord_tasks" in q]) == 1
        for i, claimed in enumerate(out):
            assert sorted(t.id for t in claimed) == sorted(r.task.id for r in created if r.task.partition in groups[i])
            assert {t.lease_owner for t in claimed} == {f"n{i}"}
        assert store.events.get("claims") == 24

        # A caller cancelled while its claim is in a batch: it gets nothing, and what the
        # batch leased for it goes back to pending.
        await store.complete_many([t for claimed in out for t in claimed])
        more = await store.enqueue_many([NewTask(queue="q", payload=i, partition_key=f"m{i}") for i in range(8)])
        more_parts = sorted({r.task.partition for r in more})
        first = asyncio.ensure_future(
            store.claim("q", node_id="a", limit=100, partitions=more_parts[:1], ordered=ordered)
        )
        second = asyncio.ensure_future(
            store.claim("q", node_id="b", limit=100, partitions=more_parts[1:], ordered=ordered)
        )
        await asyncio.sleep(0)
        second.cancel()
        kept = await first
        with pytest.raises(asyncio.CancelledError):
            await second
        for _ in range(100):
            waiting = [await store.get(r.task.id) for r in more if r.task.partition in more_parts[1:]]
            if all(t.status is TaskStatus.PENDING for t in waiting):
                break
            await asyncio.sleep(0.02)
        assert [t.status for t in waiting] == [TaskStatus.PENDING] * len(waiting)
        assert {t.partition for t in kept} == set(more_parts[:1])


async def test_concurrent_first_ordered_claims_make_the_queue_keep_heads_once(pg: str, schema: str) -> None:
    """Every node of a process wakes to a queue's first tasks at once: their first ordered
    claims share one ``coord_keep_heads`` call (each used to hold a connection while it
    waited for the first one's advisory lock), and a caller cancelled meanwhile does not
    stop it for the others."""
    from asynccoord.backends.postgres.store import PostgresStore

    async with PostgresStore(pg, schema=schema, listen=False, pool_max_size=4) as store:
        created = await store.enqueue_many([NewTask(queue="q", payload=i, partition_key=f"k{i}") for i in range(40)])
        parts = sorted({r.task.partition for r in created})
        statements: list[str] = []
        pool = store._runner.pool
        assert pool is not None
        conns = [await pool.acquire() for _ in range(4)]  # a logger on every connection of the pool
        for conn in conns:
            conn.add_query_logger(lambda record: statements.append(record.query))
        for conn in conns:
            await pool.release(conn)
        first = asyncio.ensure_future(store.claim("q", node_id="n0", limit=100, partitions=parts[:1], ordered=True))
        await asyncio.sleep(0)
        first.cancel()  # the call it started goes on for the others
        out = await asyncio.gather(
            *(
                store.claim("q", node_id=f"n{i}", limit=100, lease_s=30, partitions=parts[i::16], ordered=True)
                for i in range(16)
            )
        )
        with pytest.raises(asyncio.CancelledError):
            await first
        assert len([q for q in statements if "coord_keep_heads" in q]) == 1
        assert sorted(t.id for claimed in out for t in claimed) == sorted(r.task.id for r in created)
        assert store._keeping == {}
        # once kept, no call at all
        statements.clear()
        assert await store.claim("q", node_id="n1", partitions=parts, ordered=True) == []
        assert not [q for q in statements if "coord_keep_heads" in q]


@pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning")
async def test_a_keep_heads_call_left_by_a_closed_loop_does_not_outlive_a_reopen(pg: str, schema: str) -> None:
    """A loop closed without cancelling its tasks while the queue's first ordered claim was at
    the server: after close() and open() from another loop, ordered claims work (they waited on
    the dead loop's shared call, for good) and close() does not wait for it."""
    from asynccoord.backends.postgres.store import PostgresStore

    store = PostgresStore(pg, schema=schema, listen=False)

    pending: list[asyncio.Future[Any]] = []

    def first_loop() -> None:
        loop = asyncio.new_event_loop()

        async def claim_stuck_at_the_server() -> None:
            await store.open()
            await store.enqueue_many([NewTask(queue="q", payload=i, partition_key=f"k{i}") for i in range(5)])
            run = store._run

            async def slow(fn: Any, *, what: str, **kw: Any) -> Any:
                if what == "keep per-key heads":
                    await asyncio.sleep(30)
                return await run(fn, what=what, **kw)

            store._run = slow  # type: ignore[method-assign]
            pending.append(asyncio.ensure_future(store.claim("q", node_id="n", ordered=True)))
            await asyncio.sleep(0.1)
            store._run = run  # type: ignore[method-assign]

        loop.run_until_complete(claim_stuck_at_the_server())
        loop.close()  # the claim and its keep-heads call are left pending, never cancelled

    await asyncio.to_thread(first_loop)
    assert "q" in store._keeping
    await store.close()  # from another loop: drops the connections
    await store.open()
    try:
        claimed = await asyncio.wait_for(store.claim("q", node_id="n2", limit=10, ordered=True), 10.0)
        assert sorted(t.payload for t in claimed) == [0, 1, 2, 3, 4]
        assert store._keeping == {}
    finally:
        started = time.monotonic()
        await store.close()
    assert time.monotonic() - started < 2.0
    # The dead loop's socket and tasks go now, under this test's filters, not in the next test.
    pending.clear()
    gc.collect()


async def test_a_claim_batch_whose_answer_was_lost_returns_what_it_leased(
    pg: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim batch ran at the server but its answer was lost: the retry returns each claim
    the tasks the first attempt leased to it, and leases nothing more."""
    import asyncpg

    from asynccoord.backends.postgres.store import STORE_RETRIES, PostgresStore

    async with PostgresStore(pg, schema=schema, listen=False) as store:
        created = await store.enqueue_many([NewTask(queue="q", payload=i, partition_key=f"k{i}") for i in range(12)])
        parts = sorted({r.task.partition for r in created})
        fetch = store._fetch
        cut: list[list[Any]] = []

        async def lossy_fetch(conn: Any, query_name: str, /, **params: Any) -> Any:
            rows = await fetch(conn, query_name, **params)
            if query_name == "claim_batch" and not cut:
                cut.append(rows)
                raise asyncpg.ConnectionDoesNotExistError("connection lost after the claim (test)")
            return rows

        monkeypatch.setattr(store, "_fetch", lossy_fetch)
        out = await asyncio.gather(
            store.claim("q", node_id="n1", limit=2, lease_s=30, partitions=parts[0::2]),
            store.claim("q", node_id="n2", limit=2, lease_s=30, partitions=parts[1::2]),
        )
        assert store.events.get(STORE_RETRIES) == 1
        leased = {(r[0], r[11]) for r in cut[0]}
        assert {(t.id, t.lease_owner) for claimed in out for t in claimed} == leased
        assert [len(c) for c in out] == [2, 2]
        for claimed in out:
            assert claimed == [await store.get(t.id) for t in claimed]
            assert [t.attempts for t in claimed] == [1] * len(claimed)
        assert (await store.stats("q")).counts[TaskStatus.RUNNING] == 4


async def test_renewals_and_commit_batches_lock_task_rows_in_id_order(pg: str, schema: str) -> None:
    """extend_many locks its tasks' rows in ascending id order, whatever the caller's order or
    the rows' places in the table, and a commit batch passes its tasks in that order: in
    different orders a renewal and a commit could each hold a row the other waits for, a
    deadlock the server breaks only after deadlock_timeout (1 s), while every commit waiting on
    those rows stalls."""
    import asyncpg

    from asynccoord.backends.postgres.store import PostgresStore

    async with PostgresStore(pg, schema=schema, listen=False) as store:
        await store.enqueue_many([NewTask(queue="q", payload=i) for i in range(2)])
        low, high = sorted(await store.claim("q", node_id="n", limit=2, lease_s=30), key=lambda t: t.id)
        assert await store.extend_many([low], 30) == [True]  # low's row version now lies after high's
        holder = await asyncpg.connect(pg, server_settings={"search_path": schema})
        probe = await asyncpg.connect(pg, server_settings={"search_path": schema})
        try:
            # The higher row is held elsewhere: the renewal waits for it holding the lower one
            # already (it went first), so the lower one cannot be locked at once.
            tx = holder.transaction()
            await tx.start()
            await holder.execute("SELECT 1 FROM coord_tasks WHERE id = $1 FOR UPDATE", high.id)
            pending = asyncio.ensure_future(store.extend_many([high, low], 60))
            with anyio.fail_after(10):
                while not await probe.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
                    holder.get_server_pid(),
                ):
                    await asyncio.sleep(0.01)
            with pytest.raises(asyncpg.LockNotAvailableError):
                await probe.execute("SELECT 1 FROM coord_tasks WHERE id = $1 FOR UPDATE NOWAIT", low.id)
            await tx.rollback()
            assert await pending == [True, True]
        finally:
            await holder.close()
            await probe.close()

        statements: list[tuple[str, Any]] = []
        pool = store._runner.pool
        assert pool is not None
        async with pool.acquire() as conn:
            conn.add_query_logger(lambda record: statements.append((record.query, record.args)))
        done = await store.complete_many([high, low])
        assert [t.id for t in done if isinstance(t, Task)] == [high.id, low.id]  # in the caller's order
        batches = [args for query, args in statements if "coord_complete_batch" in query]
        assert len(batches) == 1
        assert list(batches[0][0]) == [low.id, high.id]  # the statement's ids: ascending


async def test_a_short_claim_with_nothing_to_dead_letter_opens_no_transaction(pg: str, schema: str) -> None:
    from asynccoord.backends.postgres.store import PostgresStore

    async with PostgresStore(pg, schema=schema, listen=False) as store:
        await store.enqueue_many([NewTask(queue="q", payload=i, max_attempts=1) for i in range(3)])
        before = store.transactions
        first = await store.claim("q", node_id="n", limit=2, lease_s=0.2)
        assert len(first) == 2
        assert await store.claim("q", node_id="n", limit=10, lease_s=30) != []  # short, but nothing exhausted
        assert await store.claim("q", node_id="n", limit=10, lease_s=30) == []
        assert store.transactions == before  # the claims' own rows said so: no dead-letter transaction
        await asyncio.sleep(0.3)  # the first two leases expire on their last attempt
        await store.enqueue("q", "late")
        late = await store.claim("q", node_id="n", limit=10, lease_s=30)  # finds them, dead-letters them
        assert [t.payload for t in late] == ["late"]
        assert (await store.stats("q")).counts[TaskStatus.DEAD] == 2


async def test_a_claim_naming_every_partition_runs_without_a_partition_filter(pg: str, schema: str) -> None:
    from asynccoord.backends.postgres.store import PostgresStore

    async with PostgresStore(pg, schema=schema, listen=False) as store:
        await store.enqueue_many([NewTask(queue="q", payload=i, partition_key=f"k{i}") for i in range(20)])
        every = list(range(store.partitions))
        assert store._partition_filter(every) is None  # a sole node's claims scan without the array match
        assert store._partition_filter(every[:-1]) == every[:-1]
        assert store._partition_filter([*every[:-1], 0]) is not None  # a repeat is not every partition
        got = await store.claim("q", node_id="n", limit=50, partitions=every, ordered=True)
        assert sorted(t.payload for t in got) == list(range(20))


async def _explain_analyze(conn: Any, query: Any, values: dict[str, Any]) -> dict[str, Any]:
    """The executed plan (EXPLAIN ANALYZE, JSON) of a named query, run in a transaction rolled back."""
    tx = conn.transaction()
    await tx.start()
    try:
        text = await conn.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + query.text, *query.args(values))
    finally:
        await tx.rollback()
    plan: dict[str, Any] = json.loads(text)[0]["Plan"]
    return plan


def _claim_values(**changes: Any) -> dict[str, Any]:
    """Parameters of the claim queries: queue "q", node "n", no partition filter, limit 16."""
    values = {
        "queue": "q",
        "node_id": "n",
        "lease_s": 30.0,
        "token": "t",
        "partitions": None,
        "min_due_age_s": 0.0,
        "limit": 16,
        "now": None,
    }
    return {**values, **changes}


def _claim_batch_values(groups: list[list[int]], limit: int) -> dict[str, Any]:
    """Parameters of the claim batch queries: one claim of ``limit`` per partition group."""
    return _claim_values(
        node_ids=[f"n{i}" for i in range(len(groups))],
        limits=[limit] * len(groups),
        lease_s=[30.0] * len(groups),
        partitions=[p for group in groups for p in group],
        partition_slots=[slot for slot, group in enumerate(groups, 1) for _ in group],
    )


def _visited(plan: dict[str, Any]) -> int:
    """Rows a plan read from coord_tasks: returned by its scans plus dropped by their filters."""
    own = 0
    if plan.get("Relation Name") == "coord_tasks" and "Scan" in plan["Node Type"]:
        own = (plan["Actual Rows"] + plan.get("Rows Removed by Filter", 0)) * plan["Actual Loops"]
    return own + sum(_visited(child) for child in plan.get("Plans", []))


async def test_claims_visit_about_what_they_return_with_many_heads_in_flight(pg: str, schema: str) -> None:
    import asyncpg

    from asynccoord.backends.postgres.store import PostgresStore, Q

    async with PostgresStore(pg, schema=schema, listen=False) as store:
        await store.enqueue_many([NewTask(queue="q", payload=i, partition_key=f"k{i % 400}") for i in range(4000)])
        in_flight = await store.claim("q", node_id="busy", limit=350, ordered=True, lease_s=600)
        assert len(in_flight) == 350  # 350 heads running, 50 pending, 3,600 tasks behind them
        owned = list(range(0, store.partitions, 2))
        conn = await asyncpg.connect(pg, server_settings={"search_path": schema})
        try:
            await conn.execute("ANALYZE coord_tasks")

            async def visited(
                name: str, partitions: list[int] | None, limit: int, values: dict[str, Any] | None = None
            ) -> tuple[int, int]:
                values = values or _claim_values(partitions=partitions, limit=limit)
                await _explain_analyze(conn, Q[name], values)  # also marks the index entries of claimed rows dead
                plan = await _explain_analyze(conn, Q[name], values)
                return plan["Actual Rows"], _visited(plan)

            # Pending heads (50 at most), then the rows it updates; never the 350 running heads
            # (the claims of schema 4 visited more than 400 rows each here).
            returned, seen = await visited("claim_ordered", owned, 64)
            assert 10 <= returned <= 40  # about half of the 50 pending heads
            assert seen <= 50 + returned + 4
            returned, seen = await visited("claim_ordered", None, 64)
            assert returned == 50
            assert seen <= 50 + returned + 4
            returned, seen = await visited("claim", owned, 10)
            assert returned == 10
            assert seen < 100  # pending tasks only (about 20 here), never the running ones
            # A batch of claims: each reads its own partitions' pending heads, never the 350
            # running heads nor the other claims' heads (all 50 pending heads read 8 times
            # would be 400).
            groups = [owned[i::8] for i in range(8)]
            returned, seen = await visited("claim_ordered_batch", None, 0, _claim_batch_values(groups, 64))
            assert 10 <= returned <= 40
            assert seen <= 50 + returned + 4
            returned, seen = await visited("claim_batch", None, 0, _claim_batch_values(groups, 2))
            assert returned == 16
            assert seen < 8 * 100
        finally:
            await conn.close()


async def test_an_ordered_claim_batch_reads_its_partitions_not_the_queue_with_stale_statistics(
    pg: str, schema: str
) -> None:
    """The statistics of a young table (ANALYZEd empty, then filled with 6,000 heads, as when a
    burst of enqueues wakes every node): each partition of an ordered claim batch is still read
    through its own index range, never by filtering all of the queue's pending heads (the
    queue's index costs the same under these statistics; the batch took it, 24 times slower
    than the lone claims)."""
    import asyncpg

    from asynccoord.backends.postgres.store import PostgresStore, Q

    async with PostgresStore(pg, schema=schema, listen=False) as store:
        conn = await asyncpg.connect(pg, server_settings={"search_path": schema})
        try:
            await conn.execute("ANALYZE coord_tasks")  # empty
            await store.enqueue_many([NewTask(queue="q", payload=i, partition_key=f"k{i}") for i in range(6000)])
            await store._keep_heads("q")
            groups = [list(range(i, store.partitions, 32)) for i in range(4)]  # 4 claims of 32 partitions
            values = _claim_batch_values(groups, 4)
            await _explain_analyze(conn, Q["claim_ordered_batch"], values)
            plan = await _explain_analyze(conn, Q["claim_ordered_batch"], values)
        finally:
            await conn.close()
    assert plan["Actual Rows"] == 16
    # At most a claim's limit from each of its partitions, then the rows it updates.
    assert _visited(plan) <= 4 * 32 * 4 + 16 + 4, _visited(plan)


async def test_claim_batchers_of_idle_queues_are_dropped(pg: str, schema: str) -> None:
    """A store claiming from queues named on the fly keeps a bounded number of claim
    batchers (one per queue, order and minimum due age), not one per queue ever seen."""
    from asynccoord.backends.postgres.store import PostgresStore

    async with PostgresStore(pg, schema=schema, listen=False) as store:
        for i in range(150):
            await store.enqueue(f"q{i}", i, partition_key="k")
            claimed = await store.claim(f"q{i}", node_id="n", partitions=list(range(store.partitions // 2 + 1)))
            assert len(claimed) <= 1
        assert len(store._claimers) <= 65
    assert store._claimers == {}


def _read_from(plan: dict[str, Any], relation: str) -> list[tuple[str, int]]:
    """(node type, rows read: returned plus filtered, times loops) of each scan of ``relation``."""
    own = []
    if plan.get("Relation Name") == relation and "Scan" in plan["Node Type"]:
        rows = (plan["Actual Rows"] + plan.get("Rows Removed by Filter", 0)) * plan["Actual Loops"]
        own.append((plan["Node Type"], rows))
    return own + [scan for child in plan.get("Plans", []) for scan in _read_from(child, relation)]


@pytest.mark.parametrize("name", ["claim", "claim_ordered", "claim_batch", "claim_ordered_batch"])
async def test_claims_probe_processed_ids_by_key_whatever_the_statistics_say(pg: str, schema: str, name: str) -> None:
    """A claim looks up each claimed task's message id, never reading all of coord_processed.

    The statistics here are those of an empty table (ANALYZEd before 5,000 ids were recorded),
    as on a young queue: an EXISTS in the claim's target list was planned as a hashed subplan
    over the whole table then, read again at every claim.
    """
    import asyncpg

    from asynccoord.backends.postgres.store import PostgresStore, Q

    async with PostgresStore(pg, schema=schema, listen=False) as store:
        conn = await asyncpg.connect(pg, server_settings={"search_path": schema})
        try:
            await conn.execute("ANALYZE coord_processed")  # empty
            await conn.execute(
                "INSERT INTO coord_processed (consumer, message_id, processed_at)"
                " SELECT 'q', 'old-' || i, 0 FROM generate_series(1, 5000) AS i"
            )
            await store.enqueue_many(
                [NewTask(queue="q", payload=i, partition_key=f"k{i}", idempotency_key=f"m{i}") for i in range(100)]
            )
            if "ordered" in name:
                await store._keep_heads("q")  # what the first ordered claim of the queue does
            values = _claim_values()
            if "batch" in name:  # two claims of 8, over every partition between them
                partitions = list(range(store.partitions))
                values = _claim_batch_values([partitions[0::2], partitions[1::2]], 8)
            plan = await _explain_analyze(conn, Q[name], values)
        finally:
            await conn.close()
    assert plan["Actual Rows"] == 16
    scans = _read_from(plan, "coord_processed")
    assert scans, "the claim no longer looks up processed ids"
    assert all(kind != "Seq Scan" for kind, _ in scans), scans
    assert sum(rows for _, rows in scans) <= 16, scans  # at most one row per claimed task


async def test_is_drained_reads_a_few_index_entries_not_the_table(pg: str, schema: str) -> None:
    import asyncpg

    from asynccoord.backends.postgres.store import PostgresStore, Q

    async with PostgresStore(pg, schema=schema, listen=False) as store:
        await store.enqueue_many([NewTask(queue="q", payload=i) for i in range(3000)])
        while tasks := await store.claim("q", node_id="n", limit=500):
            await store.complete_many(tasks)
        await store.enqueue("q", "last")
        assert await store.is_drained("q") is False
        conn = await asyncpg.connect(pg, server_settings={"search_path": schema})
        try:
            await conn.execute("VACUUM ANALYZE coord_tasks")
            plan = await _explain_analyze(conn, Q["queue_unfinished"], {"queue": "q"})
        finally:
            await conn.close()
        assert "Seq Scan" not in json.dumps(plan)
        assert _visited(plan) <= 4  # the pending task, not the 3,000 done ones
        (last,) = await store.claim("q", node_id="n", limit=5)
        await store.complete(last)
        written = store.transactions
        assert await store.is_drained("q") is True
        assert store.transactions == written  # a read, not a write transaction


async def test_heads_leave_key_order_and_promotion_reads_each_key_through_indexes(pg: str, schema: str) -> None:
    """Schema 7: coord_tasks_key_order holds active tasks that are not heads; promotion is unchanged."""
    import asyncpg

    from asynccoord.backends.postgres.store import PostgresStore, Q

    async with PostgresStore(pg, schema=schema, listen=False) as store:
        await store.enqueue_many([NewTask(queue="q", payload=i, partition_key=f"k{i % 400}") for i in range(4000)])
        running = await store.claim("q", node_id="n", limit=300, ordered=True, lease_s=600)
        assert len(running) == 300
        done = await store.complete_many(running[:100])
        assert all(isinstance(d, Task) for d in done)
        conn = await asyncpg.connect(pg, server_settings={"search_path": schema})
        try:
            await conn.execute("ANALYZE coord_tasks")
            # What the index holds: active tasks but no head, running or pending.
            definition = await conn.fetchval(
                "SELECT indexdef FROM pg_indexes WHERE schemaname = $1 AND indexname = 'coord_tasks_key_order'", schema
            )
            assert definition.endswith("WHERE (active AND (NOT is_head))")
            in_index = await conn.fetchval("SELECT count(*) FROM coord_tasks WHERE active AND NOT is_head")
            assert in_index == 4000 - 100 - 400  # every active task but the one head of each of the 400 keys
            # Every key has its head (the earliest active task, 100 of them new), and no key two.
            heads = await conn.fetch(
                "SELECT partition_key, id, (SELECT min(t.id) FROM coord_tasks AS t"
                " WHERE t.queue = h.queue AND t.partition_key = h.partition_key AND t.active) AS earliest"
                " FROM coord_tasks AS h WHERE h.is_head"
            )
            assert len(heads) == len({r["partition_key"] for r in heads}) == 400
            assert all(r["id"] == r["earliest"] for r in heads)
            # Promotion over every key changes nothing (each key has its head) and reads three rows
            # per key: its head (coord_tasks_one_head), its earliest task behind it
            # (coord_tasks_key_order), and the lower of the two through the primary key.
            values = {"queues": ["q"] * 400, "keys": [f"k{i}" for i in range(400)]}
            plan = await _explain_analyze(conn, Q["promote_heads"], values)
            assert plan["Actual Rows"] == 0
            assert _visited(plan) <= 3 * 400 + 4
            assert "Seq Scan" not in json.dumps(plan)
        finally:
            await conn.close()
        # The chains still run in order to the end.
        seen: dict[str, list[int]] = {}
        for t in running[100:]:
            seen.setdefault(t.partition_key, []).append(t.payload)
        await store.complete_many(running[100:])
        while tasks := await store.claim("q", node_id="n", limit=500, ordered=True, lease_s=600):
            for t in tasks:
                seen.setdefault(t.partition_key, []).append(t.payload)
            await store.complete_many(tasks)
        assert all(v == sorted(v) for v in seen.values())
        assert sum(len(v) for v in seen.values()) == 4000 - 100


async def test_key_order_holds_no_heads_and_a_reopened_ordered_drain_keeps_order(pg: str, schema: str) -> None:
    from asynccoord.backends.postgres.store import PostgresStore

    async with PostgresStore(pg, schema=schema, listen=False) as store:
        await store.enqueue_many([NewTask(queue="q", payload=i, partition_key=f"k{i % 5}") for i in range(30)])
        first = await store.claim("q", node_id="n", limit=3, ordered=True, lease_s=60)
        assert [t.payload for t in first] == [0, 1, 2]
    async with PostgresStore(pg, schema=schema, listen=False) as store:
        rows = await admin(
            pg, "SELECT indexdef FROM pg_indexes WHERE schemaname = $1 AND indexname = 'coord_tasks_key_order'", schema
        )
        assert rows[0]["indexdef"].endswith("WHERE (active AND (NOT is_head))")
        seen: dict[str, list[int]] = {}
        for t in first:
            seen.setdefault(t.partition_key, []).append(t.payload)
        assert all(isinstance(d, Task) for d in await store.complete_many(first))  # leases of before the reopen
        while tasks := await store.claim("q", node_id="n", limit=10, ordered=True, lease_s=60):
            assert len({t.partition_key for t in tasks}) == len(tasks)  # one task per key at a time
            for t in tasks:
                seen.setdefault(t.partition_key, []).append(t.payload)
            await store.complete_many(tasks)
        assert seen == {f"k{k}": list(range(k, 30, 5)) for k in range(5)}


async def test_a_commit_batch_is_one_statement_and_keeps_every_check(pg: str, schema: str) -> None:
    import asyncpg

    from asynccoord.backends.postgres.store import PostgresStore
    from asynccoord.errors import FencingTokenRejectedError

    async with (
        PostgresStore(pg, schema=schema, listen=False, pool_max_size=1) as store,
        PostgresStore(pg, schema=schema) as other,
    ):
        await store.enqueue_many(
            [NewTask(queue="q", payload=i, partition_key=f"k{i % 4}", idempotency_key=f"m{i}") for i in range(8)]
        )
        first = await store.claim("q", node_id="n", limit=8, ordered=True, lease_s=30)
        assert [t.payload for t in first] == [0, 1, 2, 3]  # one head per key
        await store.fence("acct", 7)
        woken = asyncio.ensure_future(other.notifier.wait("q", 5.0))
        statements: list[str] = []
        pool = store._runner.pool
        assert pool is not None
        async with pool.acquire() as conn:
            conn.add_query_logger(lambda record: statements.append(record.query))
        stale = dataclasses.replace(first[3], version=first[3].version + 5)
        out = await store.complete_many(
            [*first[:3], stale], [{"r": 0}, {"r": 1}, {"r": 2}, None], fences=[("acct", 8), ("acct", 6), None, None]
        )
        assert isinstance(out[0], Task)
        assert out[0].result == {"r": 0}
        assert isinstance(out[1], FencingTokenRejectedError)  # 6 < 7: refused, nothing written for it
        assert isinstance(out[2], Task)
        assert out[2].status == TaskStatus.DONE
        assert isinstance(out[3], LeaseLostError)  # the compare-and-set on the version failed
        assert len([s for s in statements if "coord_complete_batch" in s]) == 1
        assert len(statements) <= 2  # the batch, and the read of the tasks nothing was written for
        assert (await store.read_fence("acct")).fencing_token == 8  # type: ignore[union-attr]
        assert await store.is_processed("q", "m0")
        assert await store.is_processed("q", "m2")
        assert not await store.is_processed("q", "m1")
        assert (await store.get(first[1].id)).status == TaskStatus.RUNNING
        await asyncio.wait_for(woken, 5.0)  # the other process was told of the new heads
        nxt = await store.claim("q", node_id="n", limit=8, ordered=True, lease_s=30)
        assert sorted(t.payload for t in nxt) == [4, 6]  # the next tasks of the keys that were completed

        # A fence row made concurrently with a higher token: the batch runs again and is refused.
        admin_conn = await asyncpg.connect(pg, server_settings={"search_path": schema})
        try:
            tx = admin_conn.transaction()
            await tx.start()
            await admin_conn.execute(
                "INSERT INTO coord_fences (resource, fencing_token, data, updated_at) VALUES ('late', 10, NULL, 0)"
            )
            pending = asyncio.ensure_future(store.complete(nxt[0], fence=("late", 9)))
            await asyncio.sleep(0.3)  # it waits on the uncommitted fence row
            assert not pending.done()
            await tx.commit()
            with pytest.raises(FencingTokenRejectedError):
                await pending
        finally:
            await admin_conn.close()
        assert (await store.get(nxt[0].id)).status == TaskStatus.RUNNING
        assert (await store.read_fence("late")).fencing_token == 10  # type: ignore[union-attr]


async def test_a_continuation_rides_the_commit_statement_and_wakes_nobody(pg: str, schema: str) -> None:
    """complete_and_claim_next: one statement (the batch's), no NOTIFY nor local wake-up for a leased head."""
    from asynccoord import events as ev
    from asynccoord.backends.postgres.store import PostgresStore

    async with (
        PostgresStore(pg, schema=schema, listen=False, pool_max_size=1) as store,
        PostgresStore(pg, schema=schema) as other,
    ):
        await store.enqueue_many([NewTask(queue="q", payload=i, partition_key="k") for i in range(2)])
        await store.enqueue("q", 2, partition_key="k", delay_s=3600)
        [first] = await store.claim("q", node_id="n", limit=1, ordered=True, lease_s=30)
        statements: list[str] = []
        pool = store._runner.pool
        assert pool is not None
        async with pool.acquire() as conn:
            conn.add_query_logger(lambda record: statements.append(record.query))
        here = asyncio.ensure_future(store.notifier.wait("q", 0.5))
        there = asyncio.ensure_future(other.notifier.wait("q", 0.5))
        await asyncio.sleep(0.05)
        out = await store.complete_and_claim_next(first, lease_s=30)
        assert out.next_task is not None
        assert out.next_task.payload == 1
        assert len(statements) == 1
        assert "coord_complete_batch" in statements[0]
        assert (await here, await there) == (False, False)  # the head went to its owner: nobody woken
        assert store.transactions >= 1
        assert store.events.get(ev.CLAIMS) == 2
        # The next head is not due: nothing leased, the key's promotion announced as after complete().
        here = asyncio.ensure_future(store.notifier.wait("q", 5.0))
        there = asyncio.ensure_future(other.notifier.wait("q", 5.0))
        await asyncio.sleep(0.05)
        out = await store.complete_and_claim_next(out.next_task, lease_s=30)
        assert out.next_task is None
        assert (await here, await there) == (True, True)


async def test_a_commit_wakes_the_owners_of_promoted_heads_only_in_its_own_process_too(pg: str, schema: str) -> None:
    """A listening store takes its own nodes' wake-ups from its commit's notification: a key's
    promoted head that no continuation leased wakes its owner here and elsewhere; a key that
    has no next task wakes nobody (before, every commit in a queue claimed in order woke
    the key's owner in process, which then claimed for nothing)."""
    from asynccoord import partition_of

    async with PostgresStore(pg, schema=schema) as store, PostgresStore(pg, schema=schema) as other:
        assert store.listening
        assert other.listening
        keys = ["a", "b"]
        parts = [partition_of(k, store.partitions) for k in keys]
        assert parts[0] != parts[1]
        await store.enqueue("q", "a0", partition_key="a")  # a conversation of one task
        await store.enqueue_many([NewTask(queue="q", payload=f"b{i}", partition_key="b") for i in range(2)])
        heads = {t.partition_key: t for t in await store.claim("q", node_id="n", limit=2, ordered=True)}
        assert sorted(heads) == keys
        here = [store.notifier.subscribe("q", [p]) for p in parts]
        there = [other.notifier.subscribe("q", [p]) for p in parts]
        for w in here + there:
            w.arm()

        out = await store.complete_and_claim_next(heads["a"], lease_s=30)  # "a" has ended
        assert out.next_task is None
        assert [await w.wait(0.3) for w in (here[0], there[0])] == [False, False]

        for w in here + there:
            w.arm()
        await store.complete(heads["b"])  # b1 is b's head now, and nobody leased it
        assert [await w.wait(5.0) for w in (here[1], there[1])] == [True, True]
        assert [await w.wait(0.0) for w in (here[0], there[0])] == [False, False]  # only b's owner
        [b1] = await store.claim("q", node_id="n", limit=2, ordered=True)
        assert b1.payload == "b1"


async def test_a_continuation_whose_acknowledgement_was_lost_is_recognized(
    pg: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch committed but its answer was lost: the retry finds the commit and the lease it made."""
    import asyncpg

    from asynccoord.backends.postgres.store import STORE_RETRIES, PostgresStore

    async with PostgresStore(pg, schema=schema, listen=False) as store:
        await store.enqueue_many([NewTask(queue="q", payload=i, partition_key="k") for i in range(3)])
        [first] = await store.claim("q", node_id="n", limit=1, ordered=True, lease_s=30)
        fetch = store._fetch
        cut = []

        async def lossy_fetch(conn: Any, query_name: str, /, **params: Any) -> Any:
            rows = await fetch(conn, query_name, **params)
            if query_name == "complete_batch" and not cut:
                cut.append(rows)
                raise asyncpg.ConnectionDoesNotExistError("connection lost after the commit (test)")
            return rows

        monkeypatch.setattr(store, "_fetch", lossy_fetch)
        out = await store.complete_and_claim_next(first, {"r": 1}, lease_s=30)
        assert cut
        assert store.events.get(STORE_RETRIES) == 1
        assert out.done == await store.get(first.id)
        assert out.done.result == {"r": 1}
        assert out.next_task is not None
        assert out.next_task == await store.get(out.next_task.id)
        assert out.next_task.payload == 1
        assert out.next_task.version == 1  # leased once, by the first attempt
        out = await store.complete_and_claim_next(out.next_task)  # and it is ours to go on with
        assert out.next_task is not None
        assert out.next_task.payload == 2


async def test_ordered_claims_from_many_stores_keep_one_task_per_key_running(pg: str, schema: str) -> None:
    from asynccoord.backends.postgres.store import PostgresStore

    keys, per_key = 20, 15
    stores = [PostgresStore(pg, schema=schema, listen=False) for _ in range(4)]
    for store in stores:
        await store.open()
    try:
        await stores[0].enqueue_many(
            [NewTask(queue="q", payload=[k, i], partition_key=f"k{k}") for i in range(per_key) for k in range(keys)]
        )
        running: dict[str, int] = {}
        seen: dict[str, list[int]] = {}
        violations: list[str] = []

        async def node(store: PostgresStore, name: str) -> None:
            idle = 0
            while idle < 20:
                tasks = await store.claim("q", node_id=name, limit=5, ordered=True, lease_s=30)
                if not tasks:
                    idle += 1
                    await asyncio.sleep(0.005)
                    continue
                idle = 0
                for t in tasks:
                    if running.get(t.partition_key):
                        violations.append(t.partition_key)
                    running[t.partition_key] = 1
                    seen.setdefault(t.partition_key, []).append(t.payload[1])
                await asyncio.sleep(0.001)
                for t in tasks:
                    running[t.partition_key] = 0
                    await store.complete(t)

        await asyncio.gather(*(node(stores[i % 4], f"n{i}") for i in range(8)))
        assert violations == []
        assert all(order == list(range(per_key)) for order in seen.values()), seen
        assert sum(len(v) for v in seen.values()) == keys * per_key
        heads = await admin(
            pg, f'SELECT queue, partition_key, count(*) FROM "{schema}".coord_tasks WHERE is_head GROUP BY 1, 2'
        )
        assert heads == []  # every key drained: no head left
    finally:
        for store in stores:
            await store.close()


def stall_enqueues(store: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[asyncio.Event, asyncio.Event]:
    """Stall ``store``'s enqueues between drawing their ids and their insert: ``(drawn, go_on)``.

    ``drawn`` is set when an enqueue has its ids; it inserts once ``go_on`` is set.
    """
    drawn, go_on = asyncio.Event(), asyncio.Event()
    fetch = store._fetch

    async def stalled_fetch(conn: Any, query_name: str, /, **params: Any) -> Any:
        if query_name == "enqueue":
            drawn.set()
            await go_on.wait()
        return await fetch(conn, query_name, **params)

    monkeypatch.setattr(store, "_fetch", stalled_fetch)
    return drawn, go_on


@pytest.mark.parametrize(
    ("claimed_first", "policy_change"),
    [(False, False), (True, False), (True, True)],
    ids=["pending", "running", "running-then-policy-change"],
)
async def test_an_enqueue_that_commits_after_a_later_drawn_id_of_its_key_follows_it(
    pg: str, schema: str, claimed_first: bool, policy_change: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ids are drawn before the key's lock: the task whose enqueue commits second follows, whatever its id.

    A stalls between drawing its id and its insert while B enqueues on the same key (and,
    in one case, claims it). A's task, with the lower id, must still be enqueued (it was
    refused by coord_tasks_one_head as a second head), and come after B's. A dead-letter
    policy change recomputes the queue's heads: B, running, keeps its head.
    """
    from asynccoord.backends.postgres.store import PostgresStore

    async with PostgresStore(pg, schema=schema) as a, PostgresStore(pg, schema=schema) as b:
        assert await b.claim("q", node_id="warm", ordered=True) == []  # the queue keeps heads
        drawn, go_on = stall_enqueues(a, monkeypatch)
        enqueue_a = asyncio.create_task(a.enqueue("q", "A", partition_key="chat"))
        await asyncio.wait_for(drawn.wait(), 10)
        task_b = (await b.enqueue("q", "B", partition_key="chat")).task
        held = await b.claim("q", node_id="b", ordered=True) if claimed_first else []
        go_on.set()
        task_a = (await asyncio.wait_for(enqueue_a, 10)).task
        assert task_a.id < task_b.id
        if policy_change:
            await b.set_dead_letter_policy("q", "hold")
            assert await b.claim("q", node_id="c", ordered=True, limit=10) == []  # B still runs
        order = [t.payload for t in held]
        await b.complete_many(held)
        while tasks := await b.claim("q", node_id="b", ordered=True, limit=10):
            assert len(tasks) == 1  # one task of the key at a time
            order.append(tasks[0].payload)
            await b.complete_many(tasks)
        assert order == ["B", "A"]  # the order the enqueues committed in
        heads = await admin(pg, f'SELECT count(*) AS n FROM "{schema}".coord_tasks WHERE is_head')
        assert heads[0]["n"] == 0


async def test_policy_changes_give_no_second_head_to_a_key_whose_task_runs(
    pg: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The enqueue race leaves P (id 1) pending behind R (id 3), running, with D (id 2) dead between.

    'hold' clears R's head (D precedes it); neither that change nor the change back to
    'skip' may give P a head while R runs. Once R is done, P goes out.
    """
    from asynccoord.backends.postgres.store import PostgresStore

    async with PostgresStore(pg, schema=schema) as a, PostgresStore(pg, schema=schema) as b:
        assert await b.claim("q", node_id="warm", ordered=True) == []  # the queue keeps heads
        drawn, go_on = stall_enqueues(a, monkeypatch)
        enqueue_p = asyncio.create_task(a.enqueue("q", "P", partition_key="chat"))
        await asyncio.wait_for(drawn.wait(), 10)
        await b.enqueue("q", "D", partition_key="chat", max_attempts=1)
        await b.enqueue("q", "R", partition_key="chat")
        (dead,) = await b.claim("q", node_id="b", ordered=True)
        await b.fail(dead, "refused")  # its last attempt: dead
        (running,) = await b.claim("q", node_id="b", ordered=True)
        assert (dead.payload, running.payload) == ("D", "R")
        go_on.set()
        pending = (await asyncio.wait_for(enqueue_p, 10)).task
        assert pending.id < dead.id < running.id
        for policy in ("hold", "skip"):
            await b.set_dead_letter_policy("q", policy)
            assert await b.claim("q", node_id="c", ordered=True, limit=10) == [], policy  # R still runs
        await b.complete(running)
        assert [t.payload for t in await b.claim("q", node_id="c", ordered=True, limit=10)] == ["P"]


async def test_semaphore_permits_hold_across_stores(pg: str, schema: str) -> None:
    from asynccoord.backends.postgres.store import PostgresStore

    stores = [PostgresStore(pg, schema=schema, listen=False) for _ in range(3)]
    for store in stores:
        await store.open()
    try:
        outcomes = await asyncio.gather(
            *(stores[i % 3].try_acquire_lock("acct", ttl_s=30, permits=3) for i in range(30))
        )
        leases = [o for o in outcomes if type(o).__name__ == "Lease"]
        assert len(leases) == 3
        assert sorted(lease.fencing_token for lease in leases) == [1, 2, 3]
        assert len(await stores[0].list_locks("acct")) == 3
    finally:
        for store in stores:
            await store.close()


async def test_store_clock_is_the_server_clock(pg: str, schema: str) -> None:
    from asynccoord.backends.postgres.store import PostgresStore

    async with PostgresStore(pg, schema=schema, config=StoreConfig()) as store:
        (row,) = await admin(pg, "SELECT extract(epoch FROM clock_timestamp())::float8")
        assert abs(await store.now() - row[0]) < 5.0
        task = (await store.enqueue("q", 1)).task
        assert abs(task.created_at - row[0]) < 5.0


async def test_status_reads_a_postgres_store_from_its_dsn(pg: str, schema: str) -> None:
    from asynccoord.backends.postgres.store import PostgresStore
    from asynccoord.cli.status import collect_status

    async with PostgresStore(pg, schema=schema) as store:
        await store.enqueue_many([NewTask(queue="outbox", payload=i) for i in range(3)])
    report = await collect_status(f"{pg}?search_path={schema}")  # asyncpg passes search_path to the server
    assert report["tasks"]["pending"] == 3
    assert [q["queue"] for q in report["queues"]] == ["outbox"]


async def test_status_reads_a_postgres_store_in_the_schema_it_is_given(pg: str, schema: str) -> None:
    from asynccoord.backends.postgres.store import PostgresStore
    from asynccoord.cli.status import collect_status

    async with PostgresStore(pg, schema=schema) as store:
        await store.enqueue_many([NewTask(queue="outbox", payload=i) for i in range(2)])
    report = await collect_status(pg, schema=schema)
    assert report["tasks"]["pending"] == 2
    assert report["db"].endswith(f" (schema {schema})")
    with pytest.raises(SchemaVersionError, match=f"no asynccoord tables in schema '{schema}_missing'"):
        await collect_status(pg, schema=f"{schema}_missing")  # read-only: nothing created
    (row,) = await admin(pg, "SELECT count(*) FROM pg_namespace WHERE nspname = $1", f"{schema}_missing")
    assert row[0] == 0


@pytest.mark.parametrize("name", ["pg_mine", "information_schema"])
def test_a_system_schema_is_refused_before_anything_opens(name: str) -> None:
    from asynccoord.backends.postgres.store import PostgresStore

    with pytest.raises(InvalidArgumentError, match=f"schema '{name}' is PostgreSQL's own"):
        PostgresStore("postgresql://postgres@127.0.0.1:5432/test", schema=name)


async def test_stores_reaching_one_schema_by_search_path_and_by_name_share_wake_ups(pg: str, schema: str) -> None:
    """The channel is the tables' schema's, however the store was pointed at it."""
    import asyncpg

    from asynccoord.backends.postgres.store import PostgresStore

    # The test database's ``public`` schema is this test's: empty it of what another
    # asynccoord version may have left there, which the store would rightly refuse.
    conn = await asyncpg.connect(pg)
    try:
        await conn.execute("DROP SCHEMA IF EXISTS public CASCADE; CREATE SCHEMA public")
    finally:
        await conn.close()
    async with (
        PostgresStore(pg, schema=schema) as named,
        PostgresStore(f"{pg}?search_path={schema}") as by_path,
        PostgresStore(pg) as default,
    ):
        assert by_path.channel == named.channel == f"asynccoord.{schema}"
        assert default.channel == "asynccoord.public"
        waiting = asyncio.create_task(named.notifier.wait("q", 5.0))
        while not named.notifier.waiting("q"):
            await asyncio.sleep(0.01)
        began = time.monotonic()
        await by_path.enqueue("q", 1)
        assert await waiting  # the named store's listener heard it: woken, not timed out
        assert time.monotonic() - began < 4.0
        waiting = asyncio.create_task(default.notifier.wait("q", 0.5))
        await named.enqueue("q", 2)
        assert not await waiting  # another schema's channel: not woken


def test_status_command_takes_a_schema(pg: str, schema: str, capsys: pytest.CaptureFixture[str]) -> None:
    from asynccoord.backends.postgres.store import PostgresStore

    async def fill() -> None:
        async with PostgresStore(pg, schema=schema) as store:
            await store.enqueue("outbox", 1)

    asyncio.run(fill())
    assert main(["status", "--db", pg, "--schema", schema, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tasks"]["pending"] == 1


async def test_status_of_a_schema_without_asynccoord_tables_says_so(pg: str, schema: str) -> None:
    """Read-only: an empty schema is "no tables here", not an old schema version to migrate."""
    from asynccoord.cli.status import collect_status

    with pytest.raises(SchemaVersionError, match="no asynccoord tables in the search path: nothing to read"):
        await collect_status(f"{pg}?search_path={schema}_missing")


# --- schema 9: per-key heads only for queues claimed in order ------------------------------


async def _head_problems(conn: Any, queue: str) -> list[str]:
    """Keys of ``queue`` whose heads are not exactly their earliest active task."""
    rows = await conn.fetch(
        "SELECT partition_key, min(id) FILTER (WHERE active) AS earliest,"
        " array_agg(id ORDER BY id) FILTER (WHERE is_head) AS heads"
        " FROM coord_tasks WHERE queue = $1 GROUP BY partition_key",
        queue,
    )
    problems = []
    for r in rows:
        expected = [] if r["earliest"] is None else [r["earliest"]]
        if (r["heads"] or []) != expected:
            problems.append(f"{r['partition_key']}: heads {r['heads']}, earliest active {r['earliest']}")
    return problems


async def test_a_queue_claimed_without_order_keeps_no_heads_until_its_first_ordered_claim(pg: str, schema: str) -> None:
    import asyncpg

    async with PostgresStore(pg, schema=schema, listen=False) as store:
        await store.enqueue_many([NewTask(queue="u", payload=i, partition_key=f"k{i % 10}") for i in range(100)])
        first = await store.claim("u", node_id="n", limit=30, lease_s=600)  # payloads 0..29, no order
        assert [t.payload for t in first] == list(range(30))
        assert all(isinstance(d, Task) for d in await store.complete_many(first[:25]))
        await store.fail(first[25], "boom")  # back to pending (retry), still its key's earliest
        conn = await asyncpg.connect(pg, server_settings={"search_path": schema})
        try:
            # No upkeep was paid: no head, no key row, the queue not recorded.
            assert await conn.fetchval("SELECT count(*) FROM coord_tasks WHERE is_head") == 0
            assert await conn.fetchval("SELECT count(*) FROM coord_task_keys") == 0
            assert await conn.fetchval("SELECT count(*) FROM coord_ordered_queues") == 0
            # Nor an entry in coord_tasks_key_order (active AND NOT is_head): is_head is NULL.
            assert await conn.fetchval("SELECT count(*) FROM coord_tasks WHERE active AND NOT is_head") == 0
            assert await conn.fetchval("SELECT count(*) FROM coord_tasks WHERE active AND is_head IS NULL") == 75
            # The first ordered claim computes the heads: per key the earliest active task,
            # running (payloads 26..29, keys k6..k9) or pending (k0..k5: 30..35, 26 retried).
            running = {t.payload for t in first[26:]}
            ordered = await store.claim("u", node_id="m", limit=100, ordered=True, lease_s=600)
            assert await conn.fetchval("SELECT array_agg(queue) FROM coord_ordered_queues") == ["u"]
            assert await _head_problems(conn, "u") == []
            assert await conn.fetchval("SELECT count(*) FROM coord_tasks WHERE is_head IS NULL") == 0
            # k5's earliest active task is the retried 25 (due after its backoff: not claimed now).
            assert sorted(t.payload for t in ordered) == [30, 31, 32, 33, 34]
            seen: dict[str, list[int]] = {}
            for t in ordered:
                seen.setdefault(t.partition_key, []).append(t.payload)
            for t in first[26:]:
                seen.setdefault(t.partition_key, []).append(t.payload)
            await store.complete_many([*ordered, *first[26:]])
            assert await _head_problems(conn, "u") == []
            left = await store.get(first[25].id)
            assert left.status == TaskStatus.PENDING
            await conn.execute("UPDATE coord_tasks SET run_at = 0 WHERE id = $1", left.id)  # its backoff over
            while tasks := await store.claim("u", node_id="m", limit=100, ordered=True, lease_s=600):
                assert len({t.partition_key for t in tasks}) == len(tasks)  # one task per key at a time
                for t in tasks:
                    seen.setdefault(t.partition_key, []).append(t.payload)
                await store.complete_many(tasks)
            assert all(v == sorted(v) for v in seen.values()), seen
            assert sorted(p for v in seen.values() for p in v) == sorted({*range(25, 100)})
            assert running == {26, 27, 28, 29}
        finally:
            await conn.close()


async def test_a_queue_starting_to_keep_heads_mid_traffic_leaves_no_key_without_its_head(pg: str, schema: str) -> None:
    """Enqueues (new keys) and commits run in other stores while one store's first ordered claim
    makes the queue keep heads: every key still has exactly its earliest active task as head.
    Without the queue lock, a transition that had decided not to keep heads commits after the
    heads were computed (an enqueue of a new key: its task never becomes a head)."""
    import asyncpg

    queues = [f"r{i}" for i in range(6)]
    async with PostgresStore(pg, schema=schema, listen=False) as setup:
        await setup.enqueue_many([NewTask(queue=q, payload=0, partition_key="seed") for q in queues])
    stores = [PostgresStore(pg, schema=schema, listen=False, pool_max_size=2) for _ in range(4)]
    for s in stores:
        await s.open()
    try:
        stop = asyncio.Event()

        async def enqueuer(store: PostgresStore, who: int) -> None:
            n = 0
            while not stop.is_set():
                n += 1
                await store.enqueue_many(
                    [NewTask(queue=q, payload=n, partition_key=f"e{who}-{n}-{j}") for q in queues for j in range(3)]
                )

        async def committer(store: PostgresStore) -> None:
            while not stop.is_set():
                for q in queues:
                    tasks = await store.claim(q, node_id="c", limit=5, lease_s=60)
                    if tasks:
                        await store.complete_many(tasks)

        async def flipper(store: PostgresStore) -> None:
            for q in queues:
                await asyncio.sleep(0.05)
                await store.claim(q, node_id="f", limit=1, ordered=True, lease_s=60, partitions=[0])

        workers = [
            asyncio.ensure_future(enqueuer(stores[0], 0)),
            asyncio.ensure_future(enqueuer(stores[1], 1)),
            asyncio.ensure_future(committer(stores[2])),
        ]
        await flipper(stores[3])
        await asyncio.sleep(0.05)
        stop.set()
        await asyncio.gather(*workers)
    finally:
        for s in stores:
            await s.close()
    conn = await asyncpg.connect(pg, server_settings={"search_path": schema})
    try:
        assert await conn.fetchval("SELECT count(*) FROM coord_ordered_queues") == len(queues)
        for q in queues:
            assert await conn.fetchval("SELECT count(*) FROM coord_tasks WHERE queue = $1 AND active", q) > 0
            assert await _head_problems(conn, q) == [], q
    finally:
        await conn.close()


async def test_a_requeue_in_a_queue_without_heads_wakes_other_processes(pg: str, schema: str) -> None:
    """... and leaves the revived task's is_head NULL, as an enqueue in such a queue does
    (it was false: an entry in coord_tasks_key_order that nothing reads)."""
    import asyncpg

    async with (
        PostgresStore(pg, schema=schema, listen=False) as store,
        PostgresStore(pg, schema=schema) as other,
    ):
        await store.enqueue("u", "x", partition_key="k", max_attempts=1)
        [task] = await store.claim("u", node_id="n", limit=1, lease_s=60)
        assert (await store.fail(task, "boom")).status == TaskStatus.DEAD
        woken = asyncio.ensure_future(other.notifier.wait("u", 5.0))
        await asyncio.sleep(0.05)
        assert await store.requeue_dead("u") == 1
        assert await asyncio.wait_for(woken, 5.0) is True
        conn = await asyncpg.connect(pg, server_settings={"search_path": schema})
        try:
            row = await conn.fetchrow("SELECT status, is_head FROM coord_tasks WHERE id = $1", task.id)
        finally:
            await conn.close()
        assert (row["status"], row["is_head"]) == ("pending", None)
        [again] = await other.claim("u", node_id="m", limit=1, lease_s=60)
        assert again.id == task.id


async def test_a_commit_named_with_another_queue_keeps_the_heads_of_its_own(pg: str, schema: str) -> None:
    """A caller's altered copy names a queue that keeps no heads: the task's own queue does,
    and its key's next task still becomes the head (coord_complete_batch, step 3b)."""
    import asyncpg

    async with PostgresStore(pg, schema=schema, listen=False) as store:
        await store.enqueue_many([NewTask(queue="a", payload=i, partition_key="k") for i in range(3)])
        [first] = await store.claim("a", node_id="n", limit=5, ordered=True, lease_s=60)
        [done] = await store.complete_many([dataclasses.replace(first, queue="zz")])
        assert isinstance(done, Task)
        conn = await asyncpg.connect(pg, server_settings={"search_path": schema})
        try:
            assert await _head_problems(conn, "a") == []
        finally:
            await conn.close()
        assert [t.payload for t in await store.claim("a", node_id="n", limit=5, ordered=True)] == [1]


@pytest.mark.parametrize("altered", ["queue", "partition_key"])
async def test_a_commit_of_an_altered_copy_promotes_its_own_key_under_that_keys_row_lock(
    pg: str, schema: str, altered: str
) -> None:
    """The commit batch promotes and continues the stored task's key, so it must hold that
    key's row lock, not only the one of the key the caller's copy names: while another
    transaction holds the row (an enqueue of the key, say), the commit waits. Without the
    lock, an enqueue running meanwhile saw the committed task as the head still and promoted
    nothing, while the commit missed the new task: the key was left without a head and never
    claimed in order again (20 of 20 runs of a loop like the one below, within 2 to 19 rounds)."""
    import asyncpg

    change = {"queue": "zz"} if altered == "queue" else {"partition_key": "other"}
    async with PostgresStore(pg, schema=schema, listen=False) as store:
        await store.enqueue_many([NewTask(queue="q", payload=i, partition_key="k") for i in range(2)])
        [first] = await store.claim("q", node_id="n", limit=5, ordered=True, lease_s=60)
        conn, tx = await _hold_key_row(pg, schema, "k")
        try:
            commit = asyncio.ensure_future(store.complete_many([dataclasses.replace(first, **change)]))
            await asyncio.sleep(0.5)
            assert not commit.done()  # waits for the key's row
        finally:
            await tx.commit()
            await conn.close()
        [done] = await asyncio.wait_for(commit, 10)
        assert isinstance(done, Task)
        assert [t.payload for t in await store.claim("q", node_id="n", limit=5, ordered=True, lease_s=60)] == [1]

        # The race itself: commits of altered copies beside enqueues of the same key.
        async with PostgresStore(pg, schema=schema, listen=False) as other:
            check = await asyncpg.connect(pg, server_settings={"search_path": schema})
            try:
                for i in range(40):
                    claimed = await store.claim("q", node_id="n", limit=1, ordered=True, lease_s=60)
                    if not claimed:
                        assert await _head_problems(check, "q") == [], f"round {i}"
                        await other.enqueue("q", i, partition_key="k")
                        continue
                    copy = dataclasses.replace(claimed[0], **change)
                    enqueued = other.enqueue("q", i, partition_key="k")
                    [done], _ = await asyncio.gather(store.complete_many([copy]), enqueued)
                    assert isinstance(done, Task)
                    assert await _head_problems(check, "q") == [], f"round {i}"
            finally:
                await check.close()


async def test_an_enqueue_whose_existing_task_is_purged_meanwhile_creates_it(pg: str, schema: str) -> None:
    """An enqueue whose idempotency key is held by a finished task skips the insert, then reads
    that task; a purge committing in between left nothing to read (an AssertionError, 4 of
    1,600 rounds of a race). The enqueue now inserts the task again and creates it.

    The statement runs inside ``coord_enqueue``: the purge is made to land between its insert
    and its read by a statement trigger that fires after the insert (it deletes the finished
    task of the key as ``purge_finished`` does, in the enqueue's own transaction)."""
    from asynccoord import events as ev

    async with PostgresStore(pg, schema=schema, listen=False) as store:
        first = await store.enqueue("q", 1, idempotency_key="m1")
        [claimed] = await store.claim("q", node_id="n", limit=1, lease_s=60)
        assert isinstance(await store.complete(claimed), Task)
        await admin(pg, f'CREATE TABLE "{schema}".purged (id bigint)')
        await admin(
            pg,
            f"""CREATE FUNCTION "{schema}".purge_m1() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    WITH gone AS (DELETE FROM "{schema}".coord_tasks
                                   WHERE queue = 'q' AND idempotency_key = 'm1' AND status = 'done' RETURNING id)
                    INSERT INTO "{schema}".purged SELECT id FROM gone;
                    RETURN NULL;
                END $$""",
        )
        await admin(
            pg,
            f'CREATE TRIGGER purge_m1 AFTER INSERT ON "{schema}".coord_tasks'
            f' FOR EACH STATEMENT EXECUTE FUNCTION "{schema}".purge_m1()',
        )
        again = await store.enqueue("q", 2, idempotency_key="m1")
        assert [r[0] for r in await admin(pg, f'SELECT id FROM "{schema}".purged')] == [first.task.id]
        assert again.created is True
        assert again.task.id != first.task.id
        assert again.task.payload == 2
        assert (await store.get(again.task.id)).status == TaskStatus.PENDING
        with pytest.raises(TaskNotFoundError):
            await store.get(first.task.id)
        assert store.events.get(ev.DUPLICATE_ENQUEUE_SUPPRESSED) == 0


async def test_a_transaction_of_a_frozen_client_holds_up_a_queues_switch_only_until_the_server_ends_it(
    pg: str, schema: str
) -> None:
    """A client frozen inside a transition (here: a session of the store's settings that took
    the queue's shared lock and then went silent) would hold up the queue's first ordered
    claim, and every transition of the queue queued behind it, until TCP gave up. The server
    ends a session idle in a transaction after ``idle_in_transaction_timeout_s``."""
    async with (
        PostgresStore(pg, schema=schema, listen=False, idle_in_transaction_timeout_s=1.0) as store,
        PostgresStore(pg, schema=schema, listen=False, idle_in_transaction_timeout_s=1.0) as frozen,
    ):
        await store.enqueue_many([NewTask(queue="q", payload=i, partition_key="k") for i in range(2)])
        conn = await frozen._connect()
        try:
            await conn.execute("BEGIN")
            await conn.execute("SELECT coord_share_queues('{q}')")  # ... and nothing more
            started = time.monotonic()
            claimed = await asyncio.wait_for(store.claim("q", node_id="n", limit=5, ordered=True, lease_s=60), 20)
            waited_s = time.monotonic() - started
            assert [t.payload for t in claimed] == [0]
            assert 0.5 < waited_s < 10  # it did wait, for the session to be ended
            assert conn.is_closed()  # the server ended the frozen session
        finally:
            conn.terminate()
    with pytest.raises(InvalidArgumentError, match="idle_in_transaction_timeout_s"):
        PostgresStore(pg, idle_in_transaction_timeout_s=0)
    with pytest.raises(InvalidArgumentError, match="idle_in_transaction_timeout_s"):
        PostgresStore(pg, idle_in_transaction_timeout_s=3e6)


async def test_a_client_frozen_holding_a_queues_rate_limit_lock_holds_up_its_claims_only_briefly(
    pg: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every claim of a queue that declares limits, in every process, takes the queue's
    rate-limit lock. A client frozen just after taking it (SIGSTOP, a stalled host) held up
    every claim of the queue for the session's whole idle timeout (30 s by default): the
    claim's transaction lowers it to ``LIMITS_LOCK_IDLE_S`` (2 s). The frozen claim, back,
    meets the lost connection, runs again and leases the other task; none is leased twice."""
    from asynccoord import RateLimit
    from asynccoord.backends.postgres.ratelimits import LIMITS_LOCK_IDLE_S

    async with (
        PostgresStore(pg, schema=schema, listen=False) as store,
        PostgresStore(pg, schema=schema, listen=False) as frozen,
    ):
        assert store.idle_in_transaction_timeout_s == 30.0  # the default, untouched
        await store.set_rate_limits("q", [RateLimit(dimension="chat", count=100, per_s=1.0)])
        await store.enqueue_many(
            [NewTask(queue="q", payload=i, partition_key=f"c{i}", limit_keys={"chat": f"c{i}"}) for i in range(2)]
        )
        took_lock = asyncio.Event()
        real_fetch = frozen._fetch

        async def fetch(conn: Any, query_name: str, /, **params: Any) -> list[Any]:
            rows = await real_fetch(conn, query_name, **params)
            if query_name == "lock_rate_limits" and not took_lock.is_set():
                took_lock.set()
                await asyncio.sleep(8)  # frozen, the lock held, the session idle in its transaction
            return rows

        monkeypatch.setattr(frozen, "_fetch", fetch)
        held = asyncio.ensure_future(frozen.claim("q", node_id="frozen", limit=1, lease_s=60))
        await asyncio.wait_for(took_lock.wait(), 20)
        started = time.monotonic()
        claimed = await asyncio.wait_for(store.claim("q", node_id="n", limit=1, lease_s=60), 20)
        waited_s = time.monotonic() - started
        assert len(claimed) == 1
        assert waited_s < LIMITS_LOCK_IDLE_S + 5, f"the claim waited {waited_s:.1f} s for the frozen client"
        again = await asyncio.wait_for(held, 30)  # back: the session was ended, the claim runs again
        assert len(again) == 1
        assert {t.id for t in claimed} | {t.id for t in again} == {1, 2}
        [[active]] = await admin(
            pg,
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction' AND application_name = $1",
            application_name(),
        )
        assert active == 0


@pytest.mark.parametrize("keyed", [False, True])
async def test_an_enqueue_whose_session_ends_mid_statement_is_retried_and_creates_its_task_once(
    pg: str, schema: str, keyed: bool
) -> None:
    """The server ends the session while the enqueue's statement waits for a key's row lock
    (nothing written, but the client cannot know it). The enqueue runs again under the ids it
    drew, with or without idempotency keys, and creates its task once."""
    async with PostgresStore(pg, schema=schema, listen=False) as store:
        assert await store.claim("q", node_id="n", limit=1, ordered=True) == []  # "q" keeps heads: keys are locked
        holder, tx = await _hold_key_row(pg, schema, "k")
        try:
            task = NewTask(queue="q", payload=1, partition_key="k", idempotency_key="m1" if keyed else None)
            call = asyncio.ensure_future(store.enqueue_many([task]))
            blocked = (  # this process's sessions only (application_name): other tests' enqueues wait too
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%coord_enqueue%'"
                " AND application_name = $1"
            )
            mine = application_name()
            deadline = time.monotonic() + 30
            while not (pids := [r[0] for r in await admin(pg, blocked, mine)]):
                assert time.monotonic() < deadline, "the enqueue never waited for the key's row"
                await asyncio.sleep(0.01)
            await admin(pg, "SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS u (pid)", pids)
            while not [r[0] for r in await admin(pg, blocked, mine)]:  # the retry waits for the row in turn
                assert time.monotonic() < deadline, "the enqueue was not retried"
                await asyncio.sleep(0.01)
            await tx.commit()
            [result] = await call
            assert result.created is True
            assert result.task.payload == 1
        finally:
            await holder.close()
        conn = await _connect(pg, schema)
        try:
            assert await conn.fetchval("SELECT count(*) FROM coord_tasks") == 1
        finally:
            await conn.close()


async def test_a_client_frozen_past_the_idle_timeout_before_its_commit_gets_the_lost_connection(
    pg: str, schema: str
) -> None:
    """The server ended the session while the client was frozen just before COMMIT (nothing
    written). A call that is not safe to repeat (``requeue_dead``) cannot know it was not
    committed: StoreConnectionError, naming the lost connection (it named a failed
    ``Connection.terminate()`` of a connection the driver had let go of already)."""
    async with PostgresStore(pg, schema=schema, listen=False, idle_in_transaction_timeout_s=0.3) as store:
        await store.enqueue("u", "x", partition_key="k", max_attempts=1)
        [task] = await store.claim("u", node_id="n", limit=1, lease_s=60)
        assert (await store.fail(task, "boom")).status == TaskStatus.DEAD
        notify = store._notify
        frozen = []

        async def freeze_once(conn: Any, *args: Any, **kwargs: Any) -> None:
            await notify(conn, *args, **kwargs)  # the transaction's last statement
            if not frozen:
                frozen.append(True)
                time.sleep(1.0)  # the whole process stalls, past the server's timeout

        store._notify = freeze_once  # type: ignore[method-assign]
        with pytest.raises(StoreConnectionError, match="ConnectionDoesNotExistError") as caught:
            await store.requeue_dead("u")
        assert "terminate" not in str(caught.value)
        assert frozen == [True]
        assert (await store.get(task.id)).status == TaskStatus.DEAD


async def _hold_key_row(pg: str, schema: str, key: str) -> Any:
    """Another transaction holding ``key``'s row in coord_task_keys (queue "q"); commit it to let go."""
    import asyncpg

    conn = await asyncpg.connect(pg, server_settings={"search_path": schema})
    tx = conn.transaction()
    await tx.start()
    await conn.execute(
        "INSERT INTO coord_task_keys (queue, partition_key) VALUES ('q', $1)"
        " ON CONFLICT (queue, partition_key) DO UPDATE SET touches = coord_task_keys.touches + 1",
        key,
    )
    return conn, tx


async def test_a_lease_exhausted_while_dead_lettering_waits_leaves_its_key_a_head(pg: str, schema: str) -> None:
    """dead_letter_exhausted kills only the leases of the keys it locked: B1's lease runs out
    while the call waits for A's key, and B2 still becomes B's head once B1 is dead."""
    async with PostgresStore(pg, schema=schema, listen=False) as store:
        await store.enqueue_many(
            [NewTask(queue="q", payload=p, partition_key=p[0], max_attempts=1) for p in ("A1", "B1", "B2")]
        )
        [a1] = await store.claim("q", node_id="n", limit=1, ordered=True, lease_s=0.2)
        [b1] = await store.claim("q", node_id="n", limit=1, ordered=True, lease_s=0.6)
        assert (a1.payload, b1.payload) == ("A1", "B1")
        await asyncio.sleep(0.3)  # A1's lease ran out on its last attempt; B1's not yet
        conn, tx = await _hold_key_row(pg, schema, "A")
        job = asyncio.ensure_future(store._dead_letter_exhausted("q"))  # finds A, waits for A's row
        await asyncio.sleep(0.8)  # B1's lease runs out meanwhile
        await tx.commit()
        await conn.close()
        assert await job == 1  # A1 only: B's key was not locked
        check = await _connect(pg, schema)
        try:
            assert await _head_problems(check, "q") == []
            # The next claim dead-letters B1 under B's lock and takes B2, B's new head.
            assert [t.payload for t in await store.claim("q", node_id="n", limit=5, ordered=True)] == ["B2"]
            assert (await store.get(b1.id)).status == TaskStatus.DEAD
            assert await _head_problems(check, "q") == []
        finally:
            await check.close()


async def test_a_task_dying_while_a_requeue_waits_keeps_its_key_in_order(pg: str, schema: str) -> None:
    """requeue_dead revives only tasks of the keys it locked: B1 dies (B2 becomes B's head)
    while the requeue waits for A's key, and stays dead; B2 is not overtaken."""
    async with PostgresStore(pg, schema=schema, listen=False) as store:
        await store.enqueue_many(
            [NewTask(queue="q", payload=p, partition_key=p[0], max_attempts=1) for p in ("A1", "B1", "B2")]
        )
        a1, b1 = await store.claim("q", node_id="n", limit=5, ordered=True, lease_s=60)
        await store.fail(a1, "x")
        conn, tx = await _hold_key_row(pg, schema, "A")
        job = asyncio.ensure_future(store.requeue_dead("q"))  # finds A's dead task, waits for A's row
        await asyncio.sleep(0.3)
        await store.fail(b1, "y")  # B1 dead: B2 is B's head
        await tx.commit()
        await conn.close()
        assert await job == 1
        check = await _connect(pg, schema)
        try:
            assert await _head_problems(check, "q") == []
        finally:
            await check.close()
        assert sorted(t.payload for t in await store.claim("q", node_id="n", limit=5, ordered=True)) == ["A1", "B2"]
        assert await store.requeue_dead("q") == 1  # B1, when asked again
        check = await _connect(pg, schema)
        try:
            assert await _head_problems(check, "q") == []  # B1 is B's head again, before B2
        finally:
            await check.close()


async def _connect(pg: str, schema: str) -> Any:
    import asyncpg

    return await asyncpg.connect(pg, server_settings={"search_path": schema})


async def test_a_queue_that_starts_keeping_heads_has_a_key_row_for_each_key(pg: str, schema: str) -> None:
    """Key rows are made for the active keys when a queue starts keeping heads, so a commit
    batch locks rows that exist (one sorted pass) and never deadlocks with an enqueue."""
    from asynccoord.backends.postgres.store import STORE_RETRIES

    async with (
        PostgresStore(pg, schema=schema, listen=False) as store,
        PostgresStore(pg, schema=schema, listen=False) as other,
    ):
        await store.enqueue_many([NewTask(queue="q", payload=p, partition_key=p[0]) for p in ("a1", "b1")])
        check = await _connect(pg, schema)
        try:
            assert await check.fetchval("SELECT count(*) FROM coord_task_keys") == 0
            a1, b1 = await store.claim("q", node_id="n", limit=5, ordered=True, lease_s=60)
            keys = await check.fetch("SELECT partition_key FROM coord_task_keys WHERE queue = 'q' ORDER BY 1")
            assert [r[0] for r in keys] == ["a", "b"]
            # The batch waits for b's row while an enqueue of (a, b) runs: no deadlock, no retry.
            conn, tx = await _hold_key_row(pg, schema, "b")
            batch = asyncio.ensure_future(store.complete_many([a1, b1]))
            await asyncio.sleep(0.2)
            enqueue = asyncio.ensure_future(
                other.enqueue_many([NewTask(queue="q", payload=p, partition_key=p[0]) for p in ("a3", "b3")])
            )
            await asyncio.sleep(0.2)
            await tx.commit()
            await conn.close()
            done, created = await asyncio.gather(batch, enqueue)
            assert all(isinstance(d, Task) for d in done)
            assert all(c.created for c in created)
            assert store.events.get(STORE_RETRIES) == other.events.get(STORE_RETRIES) == 0  # no deadlock retried
            assert await _head_problems(check, "q") == []
        finally:
            await check.close()


async def test_a_first_ordered_claim_of_a_kept_queue_waits_for_nothing(pg: str, schema: str) -> None:
    """A store's first ordered claim of a queue that keeps heads already takes no exclusive
    lock: it does not wait for the queue's transitions in flight, nor make new ones wait."""
    async with (
        PostgresStore(pg, schema=schema, listen=False) as store,
        PostgresStore(pg, schema=schema, listen=False) as other,
    ):
        await store.enqueue_many([NewTask(queue="q", payload=i, partition_key=f"k{i}") for i in range(3)])
        t1, _t2 = await store.claim("q", node_id="n", limit=2, ordered=True, lease_s=60)
        holder = await _connect(pg, schema)
        tx = holder.transaction()
        await tx.start()
        try:
            await holder.execute("SELECT coord_share_queues('{q}')")  # a transition of q in flight
            [t3] = await asyncio.wait_for(other.claim("q", node_id="m", limit=1, ordered=True), 5.0)
            assert t3.payload == 2
            assert (await asyncio.wait_for(store.complete(t1), 5.0)).status == TaskStatus.DONE
        finally:
            await tx.commit()
            await holder.close()


async def _advisory_waiters(conn: Any, modes: list[str], timeout_s: float = 30.0) -> None:
    """Wait until the advisory locks asked for and not granted yet are of ``modes`` (sorted).

    Sleeping a fixed time instead lets a loaded machine run the steps in another order."""
    deadline = time.monotonic() + timeout_s
    while True:
        waiting = await conn.fetch(
            "SELECT mode FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database()) ORDER BY mode"
        )
        if sorted(r["mode"] for r in waiting) == sorted(modes):
            return
        assert time.monotonic() < deadline, f"advisory lock waiters {waiting}, expected {modes}"
        await asyncio.sleep(0.01)


async def test_read_committed_whatever_the_dsn_asks(pg: str, schema: str) -> None:
    """An enqueue that waits behind a queue's first ordered claim still gets its head when the
    DSN (or the role, or the database) makes REPEATABLE READ the default: the store's sessions
    run READ COMMITTED, so the flag is read after the queue lock, not in an older snapshot."""
    dsn = pg + ("&" if "?" in pg else "?") + "default_transaction_isolation=repeatable%20read"
    async with PostgresStore(dsn, schema=schema, listen=False) as setup:
        await setup.enqueue("q", 0, partition_key="old")
    holder = await _connect(pg, schema)
    tx = holder.transaction()
    await tx.start()
    await holder.execute("SELECT coord_share_queues(ARRAY['q'])")  # a transition of q in flight
    async with (
        PostgresStore(dsn, schema=schema, listen=False) as keeper,
        PostgresStore(dsn, schema=schema, listen=False) as enqueuer,
    ):
        pool = keeper._runner.pool
        assert pool is not None
        async with pool.acquire() as conn:
            assert await conn.fetchval("SHOW default_transaction_isolation") == "read committed"
        first = asyncio.ensure_future(keeper.claim("q", node_id="o", limit=10, ordered=True, lease_s=60))
        await _advisory_waiters(holder, ["ExclusiveLock"])  # the first ordered claim waits for the queue's lock
        late = asyncio.ensure_future(enqueuer.enqueue("q", 1, partition_key="new"))
        await _advisory_waiters(holder, ["ExclusiveLock", "ShareLock"])  # the enqueue waits behind it
        await tx.commit()
        await holder.close()
        claimed = [t.payload for t in await first]
        await late
        # The claim's statement comes after coord_keep_heads' (which let the enqueue go on): it
        # may see the enqueued task's head already. Either way that task got its head; read in
        # an older snapshot, the enqueue would have seen no heads kept and marked none, and the
        # task would never be claimed in order.
        claimed += [t.payload for t in await keeper.claim("q", node_id="o", limit=10, ordered=True)]
        assert sorted(claimed) == [0, 1]
        assert claimed[0] == 0


async def test_a_commit_of_a_copy_naming_another_queue_never_deadlocks_with_a_queue_switch(
    pg: str, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The commit's task row is locked before its own queue's lock is asked for (step 3b), while
    that queue's first ordered claim holds the queue lock and is about to update the same row:
    the commit does not wait for the lock (a deadlock), it fails as a serialization failure
    and runs again once the queue keeps heads."""
    async with (
        PostgresStore(pg, schema=schema, listen=False) as store,
        PostgresStore(pg, schema=schema, listen=False) as other,
    ):
        await store.enqueue_many([NewTask(queue="a", payload=i, partition_key="k") for i in range(2)])
        [task] = await store.claim("a", node_id="n", limit=1, lease_s=60)  # unordered: "a" keeps no heads
        caplog.set_level(logging.INFO, logger="asynccoord.backends.postgres.conn")
        check = await _connect(pg, schema)
        holder = await _connect(pg, schema)
        try:
            tx = holder.transaction()
            await tx.start()
            await holder.execute("SELECT coord_share_queues('{a}')")  # a transition of "a" in flight
            keep = asyncio.ensure_future(other.claim("a", node_id="m", limit=1, ordered=True))  # waits for it
            await asyncio.sleep(0.2)
            commit = asyncio.ensure_future(store.complete_many([dataclasses.replace(task, queue="zz")]))
            await asyncio.sleep(0.2)
            await tx.commit()
            [done] = await commit
            assert isinstance(done, Task)
            # The ordered claim ran before the commit's retry (the pending task waits behind the
            # running one) or after it.
            claimed = [t.payload for t in await keep]
            assert claimed in ([], [1])
            retried = [r.getMessage() for r in caplog.records if "asynccoord.postgres.retry" in r.getMessage()]
            assert retried, "the commit did not meet the queue's switch"
            assert not [m for m in retried if "deadlock" in m], retried
            assert await _head_problems(check, "a") == []
            if not claimed:
                assert [t.payload for t in await other.claim("a", node_id="m", limit=1, ordered=True)] == [1]
        finally:
            await holder.close()
            await check.close()


async def test_a_claim_cancelled_just_before_close_is_handed_back_before_the_pool_closes(pg: str, schema: str) -> None:
    """The compensation used to start when the claim's statement returned, after close() had
    looked for background work: it ran on a closed pool and the task stayed leased (a breaker's find)."""
    async with PostgresStore(pg, schema=schema) as store:
        await store.enqueue("q", {"n": 1}, partition_key="k1")
    for _ in range(5):
        store = PostgresStore(pg, schema=schema)
        await store.open()
        claim = asyncio.create_task(store.claim("q", node_id="n1", limit=1, lease_s=600.0))
        await asyncio.sleep(0)  # the claim is on its way to the server
        await asyncio.sleep(0)
        claim.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await claim
        await store.close()
        async with PostgresStore(pg, schema=schema) as reader:
            task = await reader.get(1)
        assert (task.status, task.attempts) == (TaskStatus.PENDING, 0)


async def test_a_lock_grant_never_waits_for_the_lease_garbage_collection(pg: str, schema: str) -> None:
    """The collection of lapsed lease rows ran inside the acquisition, after the grant: a caller cancelled
    then (a timeout around it) left the granted lease without a holder until its TTL (a breaker's find)."""
    async with PostgresStore(pg, schema=schema) as store:
        real_run = store._run
        collected = asyncio.Event()

        async def slow_run(fn: Any, *, what: str, **kwargs: Any) -> Any:
            if what == "collect lapsed leases":
                await asyncio.sleep(0.5)  # a slow round trip
                collected.set()
            return await real_run(fn, what=what, **kwargs)

        store._run = slow_run  # type: ignore[method-assign]
        lease = await asyncio.wait_for(store.try_acquire_lock("account:1", ttl_s=60.0, holder="me"), 0.3)
        assert [(info.name, info.holder) for info in await store.list_locks()] == [("account:1", "me")]
        assert await store.release_lock(lease)  # type: ignore[arg-type]
        await asyncio.wait_for(collected.wait(), 5.0)  # it still runs, in the background
    async with PostgresStore(pg, schema=schema) as reader:
        assert await reader.list_locks() == []


async def test_a_continuation_of_an_unknown_task_writes_nothing(pg: str, schema: str) -> None:
    """complete_and_claim_next with a task the store never had raises TaskNotFoundError before
    the queue's first continuation makes it keep per-key heads (no row of coord_ordered_queues
    or coord_task_keys, no head marked); a real task then does, under the stored queue."""
    import asyncpg

    async with PostgresStore(pg, schema=schema, listen=False) as store:
        await store.enqueue("q", 1, partition_key="k")
        await store.enqueue("q", 2, partition_key="k")
        [task] = await store.claim("q", node_id="n", lease_s=60)
        conn = await asyncpg.connect(pg, server_settings={"search_path": schema})
        try:
            before = await conn.fetch("SELECT id, version, is_head FROM coord_tasks ORDER BY id")
            with pytest.raises(TaskNotFoundError):
                await store.complete_and_claim_next(dataclasses.replace(task, id=task.id + 1000))
            assert await conn.fetchval("SELECT count(*) FROM coord_ordered_queues") == 0
            assert await conn.fetchval("SELECT count(*) FROM coord_task_keys") == 0
            assert await conn.fetch("SELECT id, version, is_head FROM coord_tasks ORDER BY id") == before
            # A forged queue in the caller's copy: heads are kept for the stored queue.
            outcome = await store.complete_and_claim_next(dataclasses.replace(task, queue="forged"))
            assert outcome.next_task is not None
            assert outcome.next_task.payload == 2
            assert await conn.fetchval("SELECT array_agg(queue) FROM coord_ordered_queues") == ["q"]
        finally:
            await conn.close()


async def test_close_ends_a_listener_whose_cancellation_was_swallowed(pg: str, schema: str) -> None:
    """On Python 3.11 ``asyncio.wait_for`` may return the result of a wait that ended as it was
    cancelled, swallowing the cancellation. A listener reconnecting at that moment went on
    listening, and ``close()`` waited for it for ever. Here its reconnection swallows the
    cancellation outright: ``close()`` still ends, and leaves no listening session."""
    import asyncpg

    store = PostgresStore(pg, schema=schema)
    await store.open()
    listener = store._listener
    assert listener is not None
    real_connect = listener._connect
    reconnecting = asyncio.Event()
    swallowed: list[bool] = []

    async def connect_swallowing_a_cancellation() -> Any:
        reconnecting.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            swallowed.append(True)  # as wait_for may: the cancellation is lost
        return await real_connect()

    listener._connect = connect_swallowing_a_cancellation  # type: ignore[method-assign]
    assert listener._conn is not None
    listener._conn.terminate()  # the server ended the session: the listener reconnects
    await asyncio.wait_for(reconnecting.wait(), 5.0)
    started = time.monotonic()
    async with asyncio.timeout(10):
        await store.close()
    assert time.monotonic() - started < 3.0  # not ended by the timeout's cancellation
    assert swallowed == [True]
    conn = await asyncpg.connect(pg)
    try:
        listening = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN%' AND query LIKE $1", f"%{schema}%"
        )
    finally:
        await conn.close()
    assert listening == 0


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"pool_max_size": 262_144}, "pool_max_size"),
        ({"pool_max_size": 10**9}, "pool_max_size"),
        ({"pool_min_size": 262_144, "pool_max_size": 262_144}, "pool_min_size"),
        ({"pool_min_size": 5, "pool_max_size": 4}, "pool_max_size"),
    ],
)
def test_a_pool_larger_than_postgres_allows_is_refused_before_any_io(kwargs: dict[str, int], named: str) -> None:
    """A pool that could never fill (PostgreSQL's max_connections is at most 262,143): refused
    at construction, not an out-of-memory error at open."""
    with pytest.raises(InvalidArgumentError, match=named):
        PostgresStore(PG_DSN, **kwargs)
    assert PostgresStore(PG_DSN, pool_max_size=262_143).pool_max_size == 262_143  # not opened


@pytest.mark.parametrize("ordered", [False, True])
async def test_a_claim_whose_answer_was_lost_returns_what_it_leased(
    pg: str, schema: str, monkeypatch: pytest.MonkeyPatch, ordered: bool
) -> None:
    """The claim ran at the server but its answer was lost: the retry returns the tasks the
    first attempt leased (once each), instead of claiming others and leaving those leased
    to nobody until their lease expires (on a last attempt: dead-lettered, never sent)."""
    import asyncpg

    from asynccoord.backends.postgres.store import STORE_RETRIES, PostgresStore

    async with PostgresStore(pg, schema=schema, listen=False) as store:
        await store.enqueue_many(
            [NewTask(queue="q", payload=i, partition_key=f"k{i}", max_attempts=1) for i in range(4)]
        )
        fetch = store._fetch
        cut: list[list[Any]] = []

        async def lossy_fetch(conn: Any, query_name: str, /, **params: Any) -> Any:
            rows = await fetch(conn, query_name, **params)
            if query_name.startswith("claim") and query_name != "claimed_by_token" and not cut:
                cut.append(rows)
                raise asyncpg.ConnectionDoesNotExistError("connection lost after the claim (test)")
            return rows

        monkeypatch.setattr(store, "_fetch", lossy_fetch)
        claimed = await store.claim("q", node_id="n1", limit=2, lease_s=30, ordered=ordered)
        assert [r[0] for r in cut[0]] == [1, 2]  # what the lost attempt leased
        assert store.events.get(STORE_RETRIES) == 1
        assert [t.id for t in claimed] == [1, 2]
        assert claimed == [await store.get(t.id) for t in claimed]
        assert [t.attempts for t in claimed] == [1, 1]  # leased once, by the first attempt
        assert (await store.get(3)).status is TaskStatus.PENDING
        assert all(isinstance(d, Task) for d in await store.complete_many(claimed))
        rest = await store.claim("q", node_id="n1", limit=4, lease_s=30, ordered=ordered)
        assert [t.id for t in rest] == [3, 4]


async def test_a_lock_release_whose_answer_was_lost_reports_the_lease_released(
    pg: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The DELETE ran but its answer was lost: the retry finds no row, and since the lease was
    live by the server clock, it says released (True), not lapsed; ``async with Lock`` ends
    without a LockLostError. A second release of the same lease still says False."""
    import asyncpg

    from asynccoord import Lease, Lock

    async with PostgresStore(pg, schema=schema, listen=False) as store:
        val = store._val
        cut: list[Any] = []

        async def lossy_val(conn: Any, query_name: str, /, **params: Any) -> Any:
            value = await val(conn, query_name, **params)
            if query_name == "lock_release" and not cut:
                cut.append(value)
                raise asyncpg.ConnectionDoesNotExistError("connection lost after the release (test)")
            return value

        lease = await store.try_acquire_lock("job", ttl_s=30)
        assert isinstance(lease, Lease)
        monkeypatch.setattr(store, "_val", lossy_val)
        assert await store.release_lock(lease) is True
        assert cut == [True]  # the lost attempt deleted the live lease
        assert await store.list_locks("job") == []
        assert await store.release_lock(lease) is False
        cut.clear()
        async with Lock(store, "job", ttl_s=30):
            pass
        assert cut == [True]
        # A release retried after a connection lost before the server saw it, of a lease the
        # caller released already and another holder has taken since: False, not released.
        taken = await store.try_acquire_lock("job", ttl_s=30)
        assert isinstance(taken, Lease)
        dropped: list[str] = []

        async def dropping_val(conn: Any, query_name: str, /, **params: Any) -> Any:
            if query_name == "lock_release" and not dropped:
                dropped.append(query_name)
                raise asyncpg.ConnectionDoesNotExistError("connection lost before the release (test)")
            return await val(conn, query_name, **params)

        monkeypatch.setattr(store, "_val", dropping_val)
        assert await store.release_lock(lease) is False
        assert dropped == ["lock_release"]
        assert [i.owner_token for i in await store.list_locks("job")] == [taken.owner_token]


async def test_a_keyed_enqueue_whose_commit_answer_was_lost_says_created(pg: str, schema: str) -> None:
    """The statement committed but its answer was lost: the retry finds the task by its key
    under an id the first attempt used (an enqueue draws its ids once, before its first
    attempt), so it reports the task as created by this call (not a suppressed duplicate). A
    later enqueue of the same key is the duplicate. A task without a key is found by its id:
    created once, not twice."""
    import asyncpg

    from asynccoord import events as ev
    from asynccoord.backends.postgres.store import STORE_RETRIES

    async with PostgresStore(pg, schema=schema, listen=False) as store:
        fetch = store._fetch
        cut: list[bool] = []

        async def lossy_fetch(conn: Any, name: str, /, **params: Any) -> Any:
            rows = await fetch(conn, name, **params)
            if name == "enqueue" and not cut:
                cut.append(True)
                raise asyncpg.ConnectionDoesNotExistError("connection lost after the statement committed (test)")
            return rows

        store._fetch = lossy_fetch  # type: ignore[method-assign]
        results = await store.enqueue_many(
            [
                NewTask(queue="q", payload=1, idempotency_key="m1"),
                NewTask(queue="q", payload=2, idempotency_key="m1"),  # a repeat in the call: a duplicate
                NewTask(queue="q", payload=3, idempotency_key="m2"),
                NewTask(queue="q", payload=4),  # no key
            ]
        )
        assert cut == [True]
        assert store.events.get(STORE_RETRIES) == 1
        assert [(r.created, r.task.payload) for r in results] == [(True, 1), (False, 1), (True, 3), (True, 4)]
        assert store.events.get(ev.DUPLICATE_ENQUEUE_SUPPRESSED) == 1
        again = await store.enqueue("q", 5, idempotency_key="m1")
        assert (again.created, again.task.id, again.task.payload) == (False, results[0].task.id, 1)
        assert store.events.get(ev.DUPLICATE_ENQUEUE_SUPPRESSED) == 2
        assert (await store.stats("q")).counts[TaskStatus.PENDING] == 3


async def test_a_claim_waits_for_the_rate_limit_probe_only_once_its_answer_expired(pg: str, schema: str) -> None:
    """Which claim a queue needs (with rate limits or not) is read at most LIMITED_CACHE_S ago.
    An answer in the second half of its life is used, and read again in the background: the
    claim does not wait for it (it was one more round trip on a claim each second). An expired
    answer is read before the claim, as ever."""
    from asynccoord.backends.postgres.ratelimits import LIMITED_CACHE_S

    async with PostgresStore(pg, schema=schema, listen=False) as store:
        assert await store.claim("q", node_id="n") == []  # asks, and keeps the answer
        probe = store._probe_limited
        release = asyncio.Event()
        probes: list[str] = []

        async def gated(queue: str) -> bool:
            probes.append(queue)
            await release.wait()
            return await probe(queue)

        store._probe_limited = gated  # type: ignore[method-assign]
        limited, expires = store._limited_queues["q"]
        store._limited_queues["q"] = (limited, time.monotonic() + LIMITED_CACHE_S * 0.4)  # past half its life
        assert await asyncio.wait_for(store.claim("q", node_id="n"), 5.0) == []  # not waiting for the gate
        assert probes == ["q"]
        refresh = store._limited_probes["q"]
        assert await asyncio.wait_for(store.claim("q", node_id="n"), 5.0) == []  # one read in flight at a time
        assert probes == ["q"]
        release.set()
        assert await asyncio.wait_for(refresh, 5.0) is False
        assert store._limited_queues["q"][1] > expires

        release.clear()
        store._limited_queues["q"] = (limited, time.monotonic() - 0.001)  # expired
        claim = asyncio.ensure_future(store.claim("q", node_id="n"))
        while probes == ["q"]:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert not claim.done()  # it waits for the read
        release.set()
        assert await asyncio.wait_for(claim, 5.0) == []
        assert probes == ["q", "q"]


async def test_an_enqueue_reads_by_index_whatever_the_table_held_when_its_session_planned(pg: str, schema: str) -> None:
    """coord_enqueue's statements are planned once per session (generic plans). Planned while
    coord_tasks was nearly empty, its promotion read the whole table at every later call once
    the table had grown (a sequential scan, 1.7 ms at 10,000 tasks); it reads by index. The
    store's one session runs the last enqueue's two statements with auto_explain on."""
    async with PostgresStore(pg, schema=schema, listen=False, pool_min_size=1, pool_max_size=1) as store:
        assert await store.claim("q", node_id="n", limit=1, ordered=True) == []  # "q" keeps heads
        await store.enqueue("q", 0, partition_key="first")  # the session plans on a nearly empty table
        await store.enqueue_many([NewTask(queue="q", payload=i, partition_key=f"k{i % 500}") for i in range(5000)])
        plans: list[str] = []

        def listen(_conn: Any, message: Any) -> None:
            plans.append(message.message)

        async def explained_enqueue(conn: Any, _attempt: int) -> list[Any]:
            conn.add_log_listener(listen)
            try:
                await conn.execute(
                    "LOAD 'auto_explain'; SET auto_explain.log_min_duration = 0;"
                    " SET auto_explain.log_nested_statements = on; SET client_min_messages = log"
                )
                [task_id] = [r[0] for r in await store._fetch(conn, "next_task_ids", count=1)]
                rows = await store._fetch(
                    conn,
                    "enqueue",
                    ids=[task_id],
                    queues=["q"],
                    partition_keys=["k7"],
                    partitions=[store.partitions - 1],
                    idempotency_keys=[None],
                    payloads=['"late"'],
                    priorities=[0],
                    max_attempts=[3],
                    delays=[0.0],
                    limit_keys=[None],
                    channel=store.channel,
                    sender="test",
                    now=None,
                )
                await conn.execute("SET auto_explain.log_min_duration = -1; RESET client_min_messages")
                await asyncio.sleep(0.05)  # the log messages are dispatched through the loop
                return rows
            finally:
                conn.remove_log_listener(listen)

        [row] = await store._runner.run(explained_enqueue, what="probe", tx=False)
        assert row[20] is True  # created
        nested = [p for p in plans if "coord_enqueue(" not in p and "nextval" not in p]
        assert any("UPDATE coord_tasks SET is_head = true" in p for p in nested), plans  # promotion was explained
        assert len(nested) >= 6, plans
        assert not [p for p in nested if "Seq Scan" in p], [p for p in nested if "Seq Scan" in p]
