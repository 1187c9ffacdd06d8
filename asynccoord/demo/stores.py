"""The demo's stores: a fresh SQLite file or PostgreSQL schema of its own, and its Redis lock keys.

The demo never writes into a database it did not create: an SQLite file must be new
(:func:`refuse_used_file`), and a PostgreSQL schema must carry the demo's mark
(:func:`demo_schema`). With ``--lock-store`` the run's Redis keys live under a prefix of
their own and are swept at the end (:func:`demo_lock_keys`).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from ..backends.open import redact_target
from ..errors import StoreConnectionError
from .options import DEMO_SCHEMA_COMMENT, SYSTEM_SCHEMAS, DemoOptions
from .record import RunRecord

__all__ = (
    "demo_lock_keys",
    "demo_schema",
    "refuse_used_file",
    "sqlite_file",
)


def refuse_used_file(opts: DemoOptions) -> None:
    """Raise ValueError when the SQLite file given (``--db`` or ``--store``) exists and is not empty."""
    target = opts.target
    if target is None or opts.postgres:
        return
    path = Path(sqlite_file(target))
    if path.exists() and path.stat().st_size > 0:
        flag = "--db" if opts.db is not None else "--store"
        raise ValueError(f"{flag} {target!r} already exists: the demo needs a fresh database file")


def sqlite_file(target: str) -> str:
    """The file path of an SQLite target (a path, or a ``sqlite:///`` URL)."""
    return target[len("sqlite:///") :] if target.startswith("sqlite:///") else target


@contextlib.asynccontextmanager
async def demo_lock_keys(opts: DemoOptions, run: RunRecord) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """Check the Redis lock store is reachable; yield ``sweep``, which counts and deletes the run's keys.

    The workers take their account locks in Redis under ``opts.lock_prefix`` (one per
    run). ``sweep()``, called once the workers stopped, counts the keys left
    (fencing-token counters are never deleted by the lock store) into
    ``run.lock_store_keys`` and deletes them; it runs on exit as well if it was not called.
    Commands are retried on a lost connection (redis-py's ``Retry``, exponential backoff,
    3 times); a sweep that still fails is kept in ``run.lock_sweep_error``, never raised.
    """
    assert opts.lock_store is not None
    assert opts.lock_prefix is not None
    try:
        from redis import asyncio as aioredis
        from redis import exceptions as rerr
        from redis.asyncio.retry import Retry
        from redis.backoff import ExponentialBackoff
    except ImportError as exc:
        raise ValueError("--lock-store redis://... needs redis-py: pip install 'asynccoord[redis]'") from exc
    client = aioredis.Redis.from_url(
        opts.lock_store,
        socket_connect_timeout=5.0,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.1), 3),
        retry_on_error=[rerr.ConnectionError, rerr.TimeoutError],
    )
    try:
        try:
            await client.ping()
        except (OSError, rerr.RedisError) as exc:
            raise StoreConnectionError(f"cannot connect to {redact_target(opts.lock_store)}: {exc}") from exc
        swept = False

        async def sweep() -> None:
            nonlocal swept
            try:
                keys = [key async for key in client.scan_iter(match=f"{opts.lock_prefix}*", count=1000)]
                if not swept:
                    run.lock_store_keys = len(keys)
                for first in range(0, len(keys), 500):
                    await client.delete(*keys[first : first + 500])
            except (OSError, rerr.RedisError) as exc:
                run.lock_sweep_error = f"{type(exc).__name__}: {exc}"
            swept = True

        try:
            yield sweep
        finally:
            await sweep()  # keys made after the first sweep (a worker still stopping) go too
    finally:
        await client.aclose()


@contextlib.asynccontextmanager
async def demo_schema(dsn: str, schema: str) -> AsyncIterator[None]:
    """Give the demo a fresh PostgreSQL schema of its own for the run.

    The schema is created and marked with :data:`DEMO_SCHEMA_COMMENT`; a schema left by
    an earlier run (it has the mark) is dropped and created anew; a schema that exists
    without the mark is refused, even an empty one (its grants, comment and any object
    the demo does not know of are someone's), and so are ``public``, ``information_schema``
    and ``pg_*`` whether they exist or not, so the demo never drops anything it did not
    create. A session advisory lock on the schema's name, held for the whole
    run, refuses a second demo on the same schema at the same time. The schema is left
    in place after the run, for ``python -m asynccoord status``.
    """
    if SYSTEM_SCHEMAS.fullmatch(schema):
        raise ValueError(f"schema {schema!r} is not the demo's to drop: choose a schema of its own")
    try:
        import asyncpg
    except ImportError as exc:
        raise ValueError("--store postgresql://... needs asyncpg: pip install 'asynccoord[postgres]'") from exc
    from ..backends.open import split_connect_timeout

    connect_dsn, timeout_s = split_connect_timeout(dsn)  # InvalidArgumentError is a ValueError
    try:
        conn = await asyncpg.connect(connect_dsn, timeout=timeout_s)
    except (OSError, asyncpg.PostgresError) as exc:
        raise StoreConnectionError(f"cannot connect to {redact_target(dsn)}: {exc}") from exc
    try:
        key = int.from_bytes(hashlib.blake2b(f"asynccoord.demo:{schema}".encode(), digest_size=8).digest(), "big")
        key -= 1 << 63  # a signed 64-bit advisory lock id
        if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", key):
            raise ValueError(f"another demo is running on schema {schema!r}: wait for it or choose another --schema")
        row = await conn.fetchrow(
            "SELECT obj_description(oid, 'pg_namespace') AS mark FROM pg_namespace WHERE nspname = $1", schema
        )
        ours = row is not None and row["mark"] == DEMO_SCHEMA_COMMENT
        if row is not None and not ours:
            raise ValueError(
                f"schema {schema!r} already exists and was not created by the demo: "
                "the demo drops only its own schemas; choose another --schema"
            )
        quoted = f'"{schema}"'  # a checked identifier: [a-z_][a-z0-9_]*
        async with conn.transaction():  # marked in the transaction that creates it
            if ours:
                await conn.execute(f"DROP SCHEMA {quoted} CASCADE")
            await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quoted}")
            await conn.execute(f"COMMENT ON SCHEMA {quoted} IS '{DEMO_SCHEMA_COMMENT}'")
        yield
    finally:
        await conn.close()  # also ends the advisory lock
