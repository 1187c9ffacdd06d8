"""``dashboard --lock-store`` with the lock store down or paused at launch: it starts, shows the banner, recovers.

The lock store is a redis-server of the test's own, stopped (connections refused) or paused
(SIGSTOP: connections accepted, never answered) before the dashboard opens. The page's state
(``api/state``) carries the report's ``lock_store.error``, which the page shows as its banner,
until the server answers again: then the locks held there are listed.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redisserver import OwnRedis, running_redis
from services import need_redis_py

from asynccoord import Lease, SQLiteStore
from asynccoord.cli.lockstore import LOCK_STORE_WAIT_S

pytestmark = pytest.mark.multiprocess

PREFIX = "h_redis2:"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[OwnRedis]:
    need_redis_py()
    pytest.importorskip("aiohttp")
    yield from running_redis(tmp_path)


async def seed(db_path: Path) -> None:
    async with SQLiteStore(db_path) as store:
        await store.enqueue("outbox", {"to": "a"}, partition_key="a")


async def page_state(url: str) -> dict[str, Any]:
    import aiohttp

    async with aiohttp.ClientSession() as session, session.get(url + "api/state") as reply:
        assert reply.status == 200
        state: dict[str, Any] = json.loads(await reply.text())["sections"]["status"]
        return state


async def wait_for_state(url: str, predicate: Any, timeout_s: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        state = await page_state(url)
        if predicate(state):
            return state
        assert time.monotonic() < deadline, f"timed out; last state's lock_store: {state['lock_store']}"
        await asyncio.sleep(0.1)


async def take_lock(url: str) -> None:
    from asynccoord.backends.redis import RedisLockStore

    async with RedisLockStore(url, prefix=PREFIX) as locks:
        assert isinstance(await locks.try_acquire_lock("account:7", ttl_s=600.0, holder="node-r"), Lease)


@pytest.mark.parametrize("outage", ["stopped", "paused"])
async def test_the_dashboard_starts_with_the_lock_store_down_and_recovers(
    server: OwnRedis, tmp_path: Path, outage: str
) -> None:
    from asynccoord.cli.dashboard import open_dashboard

    db_path = tmp_path / "coord.db"
    await seed(db_path)
    if outage == "stopped":
        server.stop()
    else:
        server.pause()
    try:
        opening = open_dashboard(db_path, port=0, lock_store=server.url, lock_prefix=PREFIX, interval_s=0.1)
        # Bounded: a paused server is given up on after LOCK_STORE_WAIT_S (redis-py 8 alone waits 5 s).
        dashboard = await asyncio.wait_for(opening.__aenter__(), LOCK_STORE_WAIT_S + 1.5)
    except BaseException:
        if outage == "paused":
            server.resume()
        raise
    try:
        down = await page_state(dashboard.url)
        if outage == "stopped":
            server.start()
        else:
            server.resume()
        await take_lock(server.url)
        up = await wait_for_state(dashboard.url, lambda state: state["lock_store"]["error"] is None)
    finally:
        await opening.__aexit__(None, None, None)
    assert down["tasks"]["pending"] == 1
    assert "cannot connect" in down["lock_store"]["error"]
    assert ("ConnectionError" if outage == "stopped" else "TimeoutError") in down["lock_store"]["error"]
    assert down["locks"] == []
    assert (up["lock_store"]["url"], up["lock_store"]["prefix"]) == (server.url, PREFIX)
    assert [(lock["store"], lock["name"], lock["holder"]) for lock in up["locks"]] == [
        ("lock_store", "account:7", "node-r")
    ]
