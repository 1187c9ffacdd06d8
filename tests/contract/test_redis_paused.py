"""A Redis that accepts connections but never answers (SIGSTOP): the lock store's calls give up.

redis-py waits for a reply for ever unless given a socket timeout (redis-py 8 has a default
of 5 s; 5 to 7 have none), so without one an open, an acquisition or a renewal against a
paused server never ends, and a node waiting for its lock hangs with it. Each attempt now
waits ``reconnect_timeout_s`` at most, and the call then raises
:class:`~asynccoord.errors.StoreConnectionError`, as for a server that refuses connections.
Every await here is also bounded by :data:`GUARD_S`, so that a call that hangs fails the
test instead of stalling it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from redisserver import OwnRedis, running_redis
from services import need_redis_py

from asynccoord import Lease, StoreConnectionError
from asynccoord.locks.pool import LockPool

pytestmark = pytest.mark.multiprocess

WAIT_S = 0.5
"""The store's ``reconnect_timeout_s`` in these tests."""

GUARD_S = 4.0
"""How long a test waits for a call that must give up by itself: well above ``WAIT_S``, and below
redis-py 8's default socket timeout (5 s; older versions have none), so that the store's own bound
is what ends the call."""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[OwnRedis]:
    need_redis_py()
    yield from running_redis(tmp_path)


async def test_open_gives_up_on_a_paused_server(server: OwnRedis) -> None:
    from asynccoord.backends.redis import RedisLockStore

    server.pause()
    try:
        store = RedisLockStore(server.url, prefix="h_redis2:", reconnect_timeout_s=WAIT_S)
        with pytest.raises(StoreConnectionError) as caught:
            await asyncio.wait_for(store.open(), GUARD_S)
    finally:
        server.resume()
    assert "cannot connect" in str(caught.value)
    assert "TimeoutError" in str(caught.value)
    async with store:  # the failed open left nothing behind: it opens once the server answers
        assert await store.list_locks() == []


async def test_calls_give_up_while_the_server_is_paused_and_work_again_after(server: OwnRedis) -> None:
    from asynccoord.backends.redis import RedisLockStore

    async with RedisLockStore(server.url, prefix="h_redis2:", reconnect_timeout_s=WAIT_S) as store:
        lease = await store.try_acquire_lock("account:1", ttl_s=30.0, holder="node-a")
        assert isinstance(lease, Lease)
        server.pause()
        try:
            with pytest.raises(StoreConnectionError, match="try_acquire_lock"):
                await asyncio.wait_for(store.try_acquire_lock("account:2", ttl_s=30.0, holder="node-a"), GUARD_S)
            with pytest.raises(StoreConnectionError, match="renew_locks"):
                await asyncio.wait_for(store.renew_locks([lease]), GUARD_S)
            with pytest.raises(StoreConnectionError, match="list_locks"):
                await asyncio.wait_for(store.list_locks(), GUARD_S)
            assert store.reach.failures >= 3
            assert store.reach.waiting == 0
        finally:
            server.resume()
        (renewed,) = await store.renew_locks([lease])
        assert renewed is not None
        assert renewed.fencing_token == lease.fencing_token
        # The acquisition of account:2 that gave up may have been run by the server once it woke.
        assert "account:1" in [info.name for info in await store.list_locks()]
        assert store.reach.failures == 0
        await store.release_lock(renewed)


async def test_a_node_waiting_for_its_lock_turn_gives_up_while_the_server_is_paused(server: OwnRedis) -> None:
    """As a node's flight waits for its lock (``LockPool.turn``): the store error ends the wait, no hang."""
    from asynccoord.backends.redis import RedisLockStore

    async with RedisLockStore(server.url, prefix="h_redis2:", reconnect_timeout_s=WAIT_S) as store:
        pool = LockPool(store, ttl_s=10.0, holder="node-a")
        server.pause()
        try:

            async def take_turn() -> None:
                async with pool.turn("account:1", timeout_s=60.0, on_lost=lambda _exc: None):
                    pytest.fail("a turn granted by a paused server")

            with pytest.raises(StoreConnectionError, match="try_acquire_lock"):
                await asyncio.wait_for(take_turn(), GUARD_S)
        finally:
            server.resume()
        async with pool.turn("account:1", timeout_s=10.0, on_lost=lambda _exc: None) as turn:
            assert turn.lease.name == "account:1"
        await pool.aclose()
