"""The PostgreSQL and Redis services some tests need: where they are, and what to do without them.

A developer without the services (or without the ``postgres`` / ``redis`` extras) sees
those tests skipped with the reason; with ``CI=true`` in the environment a missing
service fails them instead, so CI can never pass by skipping.

Environment:
    ASYNCCOORD_TEST_PG_DSN: PostgreSQL DSN (default ``postgresql://postgres@127.0.0.1:5432/test``).
    ASYNCCOORD_TEST_REDIS_URL: Redis URL (default ``redis://127.0.0.1:6379/0``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import os
import re
import secrets
import sqlite3
import threading
from typing import Any, NoReturn

import pytest

__all__ = (
    "corrupt_task_row",
    "LOCK_BACKENDS",
    "drop_schemas",
    "PG_DSN",
    "REDIS_URL",
    "ServiceStores",
    "in_ci",
    "new_schema",
    "pg_rows",
    "postgres_problem",
    "redis_problem",
    "unavailable",
)

PG_DSN = os.environ.get("ASYNCCOORD_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("ASYNCCOORD_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

LOCK_BACKENDS = ("memory", "sqlite", "postgres", "redis")
"""Backends of the lock contract: the queue stores and the Redis lock store (a test module
of lock behaviour overrides the ``backend`` fixture with these)."""


def in_ci() -> bool:
    """Whether this run is CI (``CI=true``): missing services then fail tests instead of skipping them."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def unavailable(what: str, problem: str) -> NoReturn:
    """Skip the test (developer machine) or fail it (CI) because ``what`` is not available."""
    message = f"{what} not available: {problem}"
    if in_ci():
        pytest.fail(f"{message} (CI=true: services are required, see .ci/run)", pytrace=False)
    pytest.skip(message)


def need_redis_py() -> None:
    """Skip (or, in CI, fail) a test that needs redis-py but no Redis server, when redis-py is missing."""
    problem = redis_problem()
    if problem is not None and "not installed" in problem:
        unavailable("Redis", problem)


@functools.cache
def postgres_problem() -> str | None:
    """Why the PostgreSQL tests cannot run here, or None when they can (checked once)."""
    try:
        import asyncpg
    except ImportError:
        return "asyncpg is not installed (pip install -e '.[postgres]')"

    async def probe() -> None:
        conn = await asyncpg.connect(PG_DSN, timeout=3.0)
        try:
            await conn.fetchval("SELECT 1")
        finally:
            await conn.close()

    try:  # on a thread of its own: the caller may be inside a running event loop
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(lambda: asyncio.run(probe())).result()
    except Exception as exc:
        return f"cannot connect to {PG_DSN} ({type(exc).__name__}: {exc})"
    return None


@functools.cache
def redis_problem() -> str | None:
    """Why the Redis tests cannot run here, or None when they can (checked once)."""
    try:
        import redis
    except ImportError:
        return "redis-py is not installed (pip install -e '.[redis]')"
    try:
        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3.0)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:
        return f"cannot connect to {REDIS_URL} ({type(exc).__name__}: {exc})"
    return None


def new_schema(prefix: str = "t") -> str:
    """A fresh schema name for one test (the store creates it; the fixture drops it)."""
    return f"{prefix}_{secrets.token_hex(6)}"


class ServiceStores:
    """Opens stores of the service backends for one test, each test on a clean slate.

    PostgreSQL: one schema per distinct ``path`` a test asks for (so two stores opened
    without ``path`` share one database, as two SQLite stores on one file do), emptied at
    teardown: every table's rows deleted, the task ids restarted, only the schema version
    kept (creating and dropping a migrated schema per test costs ~10x more), in one
    statement on a connection kept for the whole run (see :class:`_Janitor`). An emptied
    schema goes back to a free list for the next test; a schema that cannot be emptied is
    dropped; the free ones are dropped when the test session ends (``pytest_sessionfinish``).
    Redis: one fresh key prefix per ``path``, deleted at teardown.
    """

    def __init__(self) -> None:
        self._schemas: dict[str, str] = {}
        self._prefixes: dict[str, str] = {}

    async def open(self, backend: str, *, config: object, clock: object, path: object) -> object:
        """A new (not yet opened) store of ``backend`` on this test's slate for ``path``."""
        where = "" if path is None else os.fspath(path)  # type: ignore[call-overload]
        if backend == "postgres":
            problem = postgres_problem()
            if problem is not None:
                unavailable("PostgreSQL", problem)
            from asynccoord.backends.postgres.store import PostgresStore

            if where not in self._schemas:
                self._schemas[where] = _FREE_SCHEMAS.pop() if _FREE_SCHEMAS else _track(new_schema())
            schema = self._schemas[where]
            return PostgresStore(PG_DSN, schema=schema, config=config, clock=clock)  # type: ignore[arg-type]
        if backend == "redis":
            problem = redis_problem()
            if problem is not None:
                unavailable("Redis", problem)
            from asynccoord.backends.redis import RedisLockStore

            prefix = self._prefixes.setdefault(where, f"test:{secrets.token_hex(6)}:")
            return RedisLockStore(REDIS_URL, prefix=prefix, config=config, clock=clock)  # type: ignore[arg-type]
        raise ValueError(f"unknown backend {backend!r}")

    async def cleanup(self) -> None:
        """Empty (or, failing that, drop) every schema and delete every key prefix this test used."""
        for schema in self._schemas.values():
            try:
                await _JANITOR.execute(_empty_schema_sql(schema))
            except Exception:
                await _JANITOR.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
                _ALL_SCHEMAS.discard(schema)
            else:
                _FREE_SCHEMAS.append(schema)
        if self._prefixes:
            import redis.asyncio as aioredis

            client = aioredis.Redis.from_url(REDIS_URL)
            try:
                for prefix in self._prefixes.values():
                    keys = [key async for key in client.scan_iter(match=f"{prefix}*", count=1000)]
                    if keys:
                        await client.delete(*keys)
            finally:
                await client.aclose()


class _Janitor:
    """One PostgreSQL connection on a thread (and event loop) of its own, kept for the test run.

    Every test's cleanup runs its statement here instead of connecting and disconnecting
    (about 15 ms a test); each test has an event loop of its own, which a connection
    cannot outlive. A connection that broke (a test terminated backends, say) is replaced
    once per statement.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conn: Any = None
        self._started = threading.Lock()

    def _thread_loop(self) -> asyncio.AbstractEventLoop:
        with self._started:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="pg-test-janitor", daemon=True).start()
                self._loop = loop
            return self._loop

    async def _execute(self, sql: str) -> None:  # on the janitor's loop
        import asyncpg

        for attempt in (1, 2):
            if self._conn is None or self._conn.is_closed():
                self._conn = await asyncpg.connect(PG_DSN)
            try:
                await self._conn.execute(sql)
                return
            except (asyncpg.PostgresConnectionError, asyncpg.InterfaceError, asyncpg.AdminShutdownError, OSError):
                with contextlib.suppress(Exception):
                    await self._conn.close(timeout=1.0)
                self._conn = None
                if attempt == 2:
                    raise

    async def execute(self, sql: str) -> None:
        """Run ``sql`` (no parameters) on the janitor's connection and wait for it, from any event loop."""
        future = asyncio.run_coroutine_threadsafe(self._execute(sql), self._thread_loop())
        await asyncio.wrap_future(future)


_JANITOR = _Janitor()


_FREE_SCHEMAS: list[str] = []
_ALL_SCHEMAS: set[str] = set()


def _track(schema: str) -> str:
    _ALL_SCHEMAS.add(schema)
    return schema


def _empty_schema_sql(schema: str) -> str:
    """One statement that deletes every row of ``schema``'s tables (schema revision kept) and restarts the task ids.

    A ``DO`` block, so the table list is read on the server (any tables, whatever schema
    version the test left) in the same round trip.
    """
    if not re.fullmatch(r"[a-z0-9_]+", schema):
        raise ValueError(f"unexpected schema name {schema!r}")
    return f"""DO $$
DECLARE t text;
BEGIN
  FOR t IN SELECT tablename FROM pg_tables WHERE schemaname = '{schema}' LOOP
    IF t = 'coord_meta' THEN
      EXECUTE format('DELETE FROM %I.coord_meta WHERE key <> %L', '{schema}', 'schema_revision');
    ELSE
      EXECUTE format('DELETE FROM %I.%I', '{schema}', t);
    END IF;
    IF t = 'coord_tasks' THEN
      EXECUTE format('ALTER TABLE %I.coord_tasks ALTER COLUMN id RESTART', '{schema}');
    END IF;
  END LOOP;
END $$"""


def drop_schemas(*schemas: str) -> None:
    """Drop these PostgreSQL schemas now (``CASCADE``), from any thread, inside a running loop or not."""

    async def drop() -> None:
        import asyncpg

        conn = await asyncpg.connect(PG_DSN)
        try:
            for schema in schemas:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a loop of its own, even inside a running one
        pool.submit(lambda: asyncio.run(drop())).result()


def pg_rows(sql: str, *args: object) -> list[Any]:
    """The rows of one statement on the test database (a connection and event loop of its own)."""

    async def fetch() -> list[Any]:
        import asyncpg

        conn = await asyncpg.connect(PG_DSN)
        try:
            return list(await conn.fetch(sql, *args))
        finally:
            await conn.close()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a loop of its own, even inside a running one
        return pool.submit(lambda: asyncio.run(fetch())).result()


def drop_tracked_schemas() -> None:
    """Drop the schemas this test process made for :class:`ServiceStores` (at the session's end).

    Not at the interpreter's exit: by then ``concurrent.futures`` takes no new work, and the
    drop failed silently there, leaving one schema per test process behind.
    """
    if _ALL_SCHEMAS:
        drop_schemas(*sorted(_ALL_SCHEMAS))
        _ALL_SCHEMAS.clear()
        _FREE_SCHEMAS.clear()


async def corrupt_task_row(store: Any, task_id: int, column: str, text: str) -> None:
    """Write ``text`` into ``column`` of a task's row behind the store's back, as another tool would.

    ``store``: an open SQLite or PostgreSQL store (its file, or its schema on ``PG_DSN``).
    """
    import asyncpg

    if not re.fullmatch(r"[a-z_]+", column):
        raise ValueError(f"not a column name: {column!r}")
    sql = f"UPDATE coord_tasks SET {column} = {{}} WHERE id = {{}}"
    if hasattr(store, "schema"):
        conn = await asyncpg.connect(PG_DSN, server_settings={"search_path": store.schema})
        try:
            await conn.execute(sql.format("$1", "$2"), text, task_id)
        finally:
            await conn.close()
        return
    raw = sqlite3.connect(store.path)
    try:
        with raw:
            raw.execute(sql.format("?", "?"), (text, task_id))
    finally:
        raw.close()
