"""What only the Redis lock store has: server-side expiry, counters kept forever, typed errors.

The lock contract itself runs on Redis through the ``backend`` fixture of the lock test
modules (``test_lock_store.py``, ``test_lock_api.py``, ``test_lock_watchdog.py``).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest
from services import REDIS_URL, redis_problem, unavailable

from asynccoord import Lease, LockBusy, StoreConnectionError
from asynccoord.backends.base import LockStore


@pytest.fixture
async def locks() -> AsyncIterator[Any]:
    problem = redis_problem()
    if problem is not None:
        unavailable("Redis", problem)
    from asynccoord.backends.redis_locks import RedisLockStore

    prefix = f"test:{secrets.token_hex(6)}:"
    store = RedisLockStore(REDIS_URL, prefix=prefix, key_slack_ms=200)
    await store.open()
    yield store
    await store.close()
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        keys = [k async for k in client.scan_iter(match=f"{prefix}*")]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


async def redis_call(fn: Any) -> Any:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        return await fn(client)
    finally:
        await client.aclose()


async def test_it_is_a_lock_store(locks: Any) -> None:
    assert isinstance(locks, LockStore)


async def test_an_unreachable_server_raises_a_typed_error() -> None:
    problem = redis_problem()
    if problem is not None and "not installed" in problem:  # no server needed, only redis-py
        unavailable("Redis", problem)
    from asynccoord.backends.redis_locks import RedisLockStore

    store = RedisLockStore("redis://127.0.0.1:1/0", reconnect_timeout_s=0.3)
    with pytest.raises(StoreConnectionError) as info:
        await store.open()
    assert info.value.__cause__ is not None


async def test_the_server_expires_abandoned_locks_but_keeps_the_fencing_counter(locks: Any) -> None:
    lease = await locks.try_acquire_lock("acct:1", ttl_s=0.2)
    assert isinstance(lease, Lease)
    zset = f"{locks.prefix}lock:acct:1"
    ttl_ms = await redis_call(lambda c: c.pttl(zset))
    assert 0 < ttl_ms <= 400  # the longest lease (0.2 s) plus key_slack_ms (0.2 s)
    await asyncio.sleep(0.6)  # the holder "crashed": nobody releases
    assert await redis_call(lambda c: c.exists(zset)) == 0  # deleted by the server
    assert await redis_call(lambda c: c.pttl(f"{locks.prefix}fencing:acct:1")) == -1  # kept forever
    again = await locks.try_acquire_lock("acct:1", ttl_s=1.0)
    assert isinstance(again, Lease)
    assert again.fencing_token == lease.fencing_token + 1


async def test_renewal_of_many_names_is_one_script_call(locks: Any) -> None:
    leases = [await locks.try_acquire_lock(f"acct:{i}", ttl_s=5.0) for i in range(50)]
    assert all(isinstance(lease, Lease) for lease in leases)
    calls = 0
    script = locks._scripts["renew_many"]

    async def counting(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return await script(*args, **kwargs)

    locks._scripts["renew_many"] = counting
    renewed = await locks.renew_locks(leases)
    assert calls == 1
    assert all(r is not None and r.expires_at >= lease.expires_at for r, lease in zip(renewed, leases, strict=True))
    infos = await locks.list_locks()
    assert [i.name for i in infos] == sorted(f"acct:{i}" for i in range(50))


async def test_semaphore_permits_from_many_concurrent_callers(locks: Any) -> None:
    outcomes = await asyncio.gather(*(locks.try_acquire_lock("pool", ttl_s=5.0, permits=4) for _ in range(40)))
    granted = [o for o in outcomes if isinstance(o, Lease)]
    assert len(granted) == 4
    assert sorted(g.fencing_token for g in granted) == [1, 2, 3, 4]
    assert all(isinstance(o, LockBusy) for o in outcomes if not isinstance(o, Lease))
