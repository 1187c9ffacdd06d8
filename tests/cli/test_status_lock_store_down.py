"""``status --lock-store`` while the lock store is down: the database's report, and the lock store's error.

The lock store is a redis-server of the test's own, stopped (connections refused) or paused
(SIGSTOP: connections accepted, never answered), before ``status`` starts or, for the dashboard's
report, after the report's lock store was opened. A paused one is reported unreachable once
``LOCK_STORE_WAIT_S`` ran out; the guards below (a few seconds above it) fail a report that waits
on: redis-py 5 to 7 wait for ever, redis-py 8 five seconds.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
from conftest import PythonRunner
from redisserver import OwnRedis, running_redis
from services import need_redis_py

from asynccoord import SQLiteStore
from asynccoord.cli.lockstore import LOCK_STORE_WAIT_S
from asynccoord.cli.status import collect_status, status_report, status_schema

pytestmark = pytest.mark.multiprocess


@pytest.fixture
def server(tmp_path: Path) -> Iterator[OwnRedis]:
    need_redis_py()
    yield from running_redis(tmp_path)


def seed(db_path: Path) -> None:
    async def run() -> None:
        async with SQLiteStore(db_path) as store:
            await store.enqueue("outbox", {"to": "a"}, partition_key="a")
            await store.try_acquire_lock("account:in-db", ttl_s=60.0, holder="node-db")

    asyncio.run(run())


def test_status_reports_the_database_and_says_the_lock_store_is_unreachable(
    server: OwnRedis, python: PythonRunner, tmp_path: Path
) -> None:
    db_path = tmp_path / "coord.db"
    seed(db_path)
    server.stop()
    argv = ["status", "--db", str(db_path), "--lock-store", server.url, "--lock-prefix", "h_redis:"]
    as_json = python.run_module("asynccoord", *argv, "--json", check=False)
    as_table = python.run_module("asynccoord", *argv, "--color", "never", check=False)
    assert (as_json.returncode, as_table.returncode) == (0, 0), as_json.stderr + as_table.stderr
    report = json.loads(as_json.stdout)
    jsonschema.Draft202012Validator(status_schema()).validate(report)
    assert report["tasks"]["pending"] == 1
    assert [(lock["store"], lock["name"]) for lock in report["locks"]] == [("db", "account:in-db")]
    entry = report["lock_store"]
    assert (entry["url"], entry["prefix"], entry["persistent"], entry["prefix_hint"]) == (
        server.url,
        "h_redis:",
        None,
        None,
    )
    assert "cannot connect" in entry["error"]
    assert "ConnectionError" in entry["error"]
    text = as_table.stdout
    assert "lock store unreachable: cannot connect" in text
    assert "outbox" in text
    assert "account:in-db" in text


async def test_a_status_report_of_an_open_lock_store_gone_down_carries_its_error(
    server: OwnRedis, tmp_path: Path
) -> None:
    """As the dashboard reads it: the lock store opened while up, then its server stopped."""
    from asynccoord.backends.redis import RedisLockStore

    db_path = tmp_path / "coord.db"
    await asyncio.to_thread(seed, db_path)
    async with (
        SQLiteStore(db_path) as store,
        RedisLockStore(server.url, prefix="h_redis:", reconnect_timeout_s=0.3) as locks,
    ):
        up = await status_report(store, lock_store=locks)
        server.stop()
        down = await status_report(store, lock_store=locks)
    assert up["lock_store"]["error"] is None
    assert down["tasks"]["pending"] == 1
    assert [lock["name"] for lock in down["locks"]] == ["account:in-db"]
    assert "list_locks" in down["lock_store"]["error"]
    jsonschema.Draft202012Validator(status_schema()).validate(down)


def test_status_reports_a_paused_lock_store_unreachable(server: OwnRedis, python: PythonRunner, tmp_path: Path) -> None:
    db_path = tmp_path / "coord.db"
    seed(db_path)
    server.pause()
    try:
        argv = ["status", "--db", str(db_path), "--lock-store", server.url, "--lock-prefix", "h_redis:"]
        as_json = python.run_module("asynccoord", *argv, "--json", check=False, timeout_s=30.0)
        as_table = python.run_module("asynccoord", *argv, "--color", "never", check=False, timeout_s=30.0)
    finally:
        server.resume()
    assert (as_json.returncode, as_table.returncode) == (0, 0), as_json.stderr + as_table.stderr
    report = json.loads(as_json.stdout)
    jsonschema.Draft202012Validator(status_schema()).validate(report)
    assert [(lock["store"], lock["name"]) for lock in report["locks"]] == [("db", "account:in-db")]
    assert "cannot connect" in report["lock_store"]["error"]
    assert "TimeoutError" in report["lock_store"]["error"]
    assert "lock store unreachable: cannot connect" in as_table.stdout
    assert "account:in-db" in as_table.stdout


async def test_collect_status_gives_up_on_a_paused_lock_store_after_its_wait(server: OwnRedis, tmp_path: Path) -> None:
    db_path = tmp_path / "coord.db"
    await asyncio.to_thread(seed, db_path)
    server.pause()
    try:
        report = await asyncio.wait_for(
            collect_status(db_path, lock_store=server.url, lock_prefix="h_redis:"), LOCK_STORE_WAIT_S + 1.5
        )
    finally:
        server.resume()
    assert report["tasks"]["pending"] == 1
    assert "TimeoutError" in report["lock_store"]["error"]


async def test_a_status_report_of_an_open_lock_store_gone_paused_carries_its_error(
    server: OwnRedis, tmp_path: Path
) -> None:
    """As the dashboard reads it: the lock store opened while up, then its server paused."""
    from asynccoord.backends.redis import RedisLockStore

    db_path = tmp_path / "coord.db"
    await asyncio.to_thread(seed, db_path)
    async with (
        SQLiteStore(db_path) as store,
        RedisLockStore(server.url, prefix="h_redis:", reconnect_timeout_s=0.3) as locks,
    ):
        server.pause()
        try:
            down = await asyncio.wait_for(status_report(store, lock_store=locks), 4.0)
        finally:
            server.resume()
        up = await status_report(store, lock_store=locks)
    assert [lock["name"] for lock in down["locks"]] == ["account:in-db"]
    assert "list_locks" in down["lock_store"]["error"]
    assert "TimeoutError" in down["lock_store"]["error"]
    assert up["lock_store"]["error"] is None
