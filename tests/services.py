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
import atexit
import concurrent.futures
import contextlib
import functools
import os
import secrets
from typing import Any, NoReturn

import pytest

__all__ = (
    "LOCK_BACKENDS",
    "drop_schemas",
    "PG_DSN",
    "REDIS_URL",
    "ServiceStores",
    "in_ci",
    "new_schema",
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
    kept (creating and dropping a migrated schema per test costs ~10x more). An emptied
    schema goes back to a free list for the next test; a schema that cannot be emptied is
    dropped; the free ones are dropped when the test process exits. Redis: one fresh key
    prefix per ``path``, deleted at teardown.
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
            from asynccoord.backends.postgres import PostgresStore

            if where not in self._schemas:
                self._schemas[where] = _FREE_SCHEMAS.pop() if _FREE_SCHEMAS else _track(new_schema())
            schema = self._schemas[where]
            return PostgresStore(PG_DSN, schema=schema, config=config, clock=clock)  # type: ignore[arg-type]
        if backend == "redis":
            problem = redis_problem()
            if problem is not None:
                unavailable("Redis", problem)
            from asynccoord.backends.redis_locks import RedisLockStore

            prefix = self._prefixes.setdefault(where, f"test:{secrets.token_hex(6)}:")
            return RedisLockStore(REDIS_URL, prefix=prefix, config=config, clock=clock)  # type: ignore[arg-type]
        raise ValueError(f"unknown backend {backend!r}")

    async def cleanup(self) -> None:
        """Drop every schema and key prefix this test used."""
        if self._schemas:
            import asyncpg

            conn = await asyncpg.connect(PG_DSN)
            try:
                for schema in self._schemas.values():
                    try:
                        await _empty_schema(conn, schema)
                    except Exception:
                        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
                        _ALL_SCHEMAS.discard(schema)
                    else:
                        _FREE_SCHEMAS.append(schema)
            finally:
                await conn.close()
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


_FREE_SCHEMAS: list[str] = []
_ALL_SCHEMAS: set[str] = set()


def _track(schema: str) -> str:
    if not _ALL_SCHEMAS:
        atexit.register(_drop_all_schemas)
    _ALL_SCHEMAS.add(schema)
    return schema


async def _empty_schema(conn: Any, schema: str) -> None:
    """Delete every row of the schema's tables (schema version kept) and restart the task ids."""
    tables = [r[0] for r in await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = $1", schema)]
    if not tables:
        return  # nothing was created (the test never opened its store)
    async with conn.transaction():
        for table in tables:
            if table == "coord_meta":
                await conn.execute(f'DELETE FROM "{schema}".coord_meta WHERE key <> $1', "schema_version")
            else:
                await conn.execute(f'DELETE FROM "{schema}"."{table}"')
        await conn.execute(f'ALTER TABLE "{schema}".coord_tasks ALTER COLUMN id RESTART')


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


def _drop_all_schemas() -> None:
    with contextlib.suppress(Exception):
        drop_schemas(*_ALL_SCHEMAS)
