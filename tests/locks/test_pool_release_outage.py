"""Lock releases that outlive their wait while the lock store (a real Redis of the test's own) is down.

A pool gives a lease back after its last turn and waits for the release a bounded time;
the release goes on past that wait. When it then fails, its error is retrieved and logged in
one line, never left for asyncio to report as "Task exception was never retrieved" (a
traceback of some 40 lines per release, printed when the failed task is collected).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import PythonRunner
from redisserver import OwnRedis, running_redis
from services import need_redis_py

pytestmark = pytest.mark.multiprocess

POOL_RELEASE_IN_AN_OUTAGE = """
import asyncio, logging, os, signal, sys, time

import asynccoord.locks.pool as pool_module
from asynccoord.backends.redis import RedisLockStore
from asynccoord.locks.pool import LockPool

url, server_pid = sys.argv[1], int(sys.argv[2])
pool_module._RELEASE_TIMEOUT_S = 0.3
logging.basicConfig(level=logging.WARNING, format="%(name)s %(message)s")


async def main() -> None:
    # reconnect_timeout_s bounds each wait for a reply too: above the 0.6 s the release must outlive.
    async with RedisLockStore(url, prefix="h_redis:", reconnect_timeout_s=2.0) as locks:
        pool = LockPool(locks, ttl_s=5.0, holder="process-a")
        async with pool.turn("account:1", timeout_s=5.0, on_lost=lambda _error: None):
            os.kill(server_pid, signal.SIGSTOP)  # the release after this turn waits for an answer that never comes
        await asyncio.sleep(0.6)  # past the pool's wait: the release goes on, unwaited
        assert locks.reach.waiting == 1, locks.reach
        os.kill(server_pid, signal.SIGKILL)  # its connection is reset; reconnecting is refused until it gives up
        deadline = time.monotonic() + 10.0
        while locks.reach.waiting and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert locks.reach.waiting == 0, locks.reach
        await pool.aclose()
    print("done")


asyncio.run(main())
"""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[OwnRedis]:
    need_redis_py()
    yield from running_redis(tmp_path)


def test_a_pool_release_failing_after_its_wait_is_logged_once_not_lost(server: OwnRedis, python: PythonRunner) -> None:
    proc = python.run_code(POOL_RELEASE_IN_AN_OUTAGE, server.url, str(server.pid), timeout_s=60.0)
    assert proc.stdout == "done\n"
    assert "never retrieved" not in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    failed = [line for line in proc.stderr.splitlines() if "lock_release_failed" in line]
    assert len(failed) == 1, proc.stderr
    assert "StoreConnectionError" in failed[0] or "connection" in failed[0], failed
