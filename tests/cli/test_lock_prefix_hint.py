"""``status`` and ``dashboard`` with a ``--lock-prefix`` that is not the nodes': they name the prefixes in use.

Against the real Redis, in a database of its server that holds no key when the test starts
(the tests' usual database 0 holds other tests' lock keys, whose prefixes would show too).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import jsonschema
import pytest
from conftest import PythonRunner
from services import REDIS_URL, redis_problem, unavailable

from asynccoord import SQLiteStore
from asynccoord.cli.dashboard import open_dashboard
from asynccoord.cli.prefixhint import hint_message
from asynccoord.cli.status import status_report, status_schema
from asynccoord.contract.locks import Lease

LOCKS = 6

# One after another on one worker: each test expects the database to hold its keys alone.
pytestmark = pytest.mark.xdist_group("redis-empty-database")


def validate(report: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator(status_schema()).validate(report)


@pytest.fixture
def empty_db_url() -> str:
    """The URL of a database of the tests' Redis server that holds no key (the highest such)."""
    problem = redis_problem()
    if problem is not None:
        unavailable("Redis", problem)
    import redis

    parts = urlsplit(REDIS_URL)
    if parts.scheme not in ("redis", "rediss"):
        unavailable("a redis:// test server", f"needs one to pick a database, got {parts.scheme}://")
    for db in range(15, 0, -1):
        url = urlunsplit(parts._replace(path=f"/{db}"))
        client = redis.Redis.from_url(url)
        try:
            if client.dbsize() == 0:
                return url
        finally:
            client.close()
    unavailable("an empty database on the tests' Redis server", "databases 1-15 all hold keys")


@contextlib.asynccontextmanager
async def nodes_holding(url: str, prefix: str, names: list[str]) -> AsyncIterator[Any]:
    """A lock store under ``prefix`` holding a lock of each name; every key of the test deleted at the end."""
    from asynccoord.backends.redis import RedisLockStore

    async with RedisLockStore(url, prefix=prefix) as locks:
        try:
            for name in names:
                assert isinstance(await locks.try_acquire_lock(name, ttl_s=120.0, holder="node-1"), Lease)
            yield locks
        finally:
            client = locks._client
            assert client is not None
            keys = [key async for key in client.scan_iter(match=f"{prefix}*")]
            if keys:
                await client.delete(*keys)


def _keys(url: str) -> list[bytes]:
    import redis

    client = redis.Redis.from_url(url)
    try:
        return sorted(set(client.scan_iter(match="*", count=1000)))  # SCAN may repeat a key while the table rehashes
    finally:
        client.close()


def expected_message(used: str, right: str) -> str:
    return (
        f"no lock keys under {used!r}; this server holds asynccoord lock keys under {right!r} (--lock-prefix {right})"
    )


def test_status_names_the_prefix_that_holds_the_locks(python: PythonRunner, tmp_path: Path, empty_db_url: str) -> None:
    """Six locks held under one prefix, status read with another: text and --json name the right one."""
    db = tmp_path / "bot.db"
    right = f"prefixtest-{secrets.token_hex(4)}-fresh:"
    wrong = f"prefixtest-{secrets.token_hex(4)}-other:"

    async def run() -> tuple[Any, Any, Any, list[bytes], list[bytes]]:
        async with SQLiteStore(db), nodes_holding(empty_db_url, right, [f"account:{i}" for i in range(LOCKS)]):
            argv = ["status", "--db", str(db), "--lock-store", empty_db_url, "--lock-prefix", wrong]
            before = _keys(empty_db_url)
            as_json = await asyncio.to_thread(python.run_module, "asynccoord", *argv, "--json")
            as_text = await asyncio.to_thread(python.run_module, "asynccoord", *argv, "--color", "never")
            after = _keys(empty_db_url)
            argv[-1] = right
            as_right = await asyncio.to_thread(python.run_module, "asynccoord", *argv, "--json")
            return as_json, as_text, as_right, before, after

    as_json, as_text, as_right, before, after = asyncio.run(run())
    assert before == after  # read-only
    report = json.loads(as_json.stdout)
    validate(report)
    assert report["locks"] == []
    hint = report["lock_store"]["prefix_hint"]
    assert hint == {
        "message": expected_message(wrong, right),
        "prefixes": [{"prefix": right, "fencing_counters": LOCKS}],
        "complete": True,
        "max_keys": 10_000,
        "keys_total": 3 * LOCKS,
    }
    assert expected_message(wrong, right) in as_text.stdout
    right_report = json.loads(as_right.stdout)
    validate(right_report)
    assert len(right_report["locks"]) == LOCKS
    assert right_report["lock_store"]["prefix_hint"] is None


async def test_no_hint_under_the_right_prefix_with_no_lock_held_now(tmp_path: Path, empty_db_url: str) -> None:
    """Released locks leave their fencing counters: the prefix is the nodes', nothing to hint."""
    from asynccoord.backends.redis import RedisLockStore

    prefix = f"prefixtest-{secrets.token_hex(4)}:"
    async with SQLiteStore(tmp_path / "bot.db") as store, nodes_holding(empty_db_url, prefix, []) as locks:
        lease = await locks.try_acquire_lock("account:1", ttl_s=60.0)
        assert isinstance(lease, Lease)
        assert await locks.release_lock(lease)
        async with RedisLockStore(empty_db_url, prefix=prefix) as reader:
            report = await status_report(store, lock_store=reader)
        validate(report)
        assert (report["locks"], report["lock_store"]["prefix_hint"]) == ([], None)


async def test_no_hint_when_the_server_holds_no_lock_keys(tmp_path: Path, empty_db_url: str) -> None:
    """Nothing under any prefix, then keys that only look like counters: a hash named ``...fencing:...``."""
    from asynccoord.backends.redis import RedisLockStore

    async with (
        SQLiteStore(tmp_path / "bot.db") as store,
        nodes_holding(empty_db_url, "prefixtest-app:", []) as locks,
        RedisLockStore(empty_db_url) as reader,
    ):
        assert (await status_report(store, lock_store=reader))["lock_store"]["prefix_hint"] is None
        await locks._client.hset("prefixtest-app:fencing:x", "token", "1")
        await locks._client.set("prefixtest-app:plain", "1")
        report = await status_report(store, lock_store=reader)
    validate(report)
    assert report["lock_store"]["prefix_hint"] is None


async def test_a_lock_name_holding_fencing_counts_under_its_own_prefix(tmp_path: Path, empty_db_url: str) -> None:
    """``P:fencing:b:fencing:c``: prefix ``P:`` of lock ``b:fencing:c``, or ``P:fencing:b:`` of lock ``c``.

    Read as the shortest prefix whose lock keys exist; the lock and metadata keys of a name
    holding ``fencing:`` (a sorted set, a hash) are no counters.
    """
    from asynccoord.backends.redis import RedisLockStore

    base = f"prefixtest-{secrets.token_hex(4)}:"
    nested = f"{base}fencing:b:"
    async with (
        nodes_holding(empty_db_url, base, ["b:fencing:d", "x"]),
        nodes_holding(empty_db_url, nested, ["c"]),
        RedisLockStore(empty_db_url, prefix="prefixtest-wrong:") as reader,
    ):
        survey = await reader.survey_prefixes()
        mine = tuple(p for p in survey.prefixes if p[0].startswith(base))  # a lock another test left may show
        assert (survey.own_counters, mine, survey.complete) == (0, ((base, 2), (nested, 1)), True)
        async with SQLiteStore(tmp_path / "bot.db") as store:
            report = await status_report(store, lock_store=reader)
        validate(report)
        hinted = [p["prefix"] for p in report["lock_store"]["prefix_hint"]["prefixes"]]
        assert [p for p in hinted if p.startswith(base)] == [base, nested]


async def test_the_search_stops_at_its_cap_and_says_so(tmp_path: Path, empty_db_url: str) -> None:
    from asynccoord.backends.redis import RedisLockStore

    prefix = f"prefixtest-{secrets.token_hex(4)}:"
    async with nodes_holding(empty_db_url, prefix, ["account:1"]) as locks:
        client = locks._client
        await client.mset({f"{prefix}filler:{i}": "0" for i in range(5000)})
        async with RedisLockStore(empty_db_url, prefix="prefixtest-wrong:") as reader:
            capped = await reader.survey_prefixes(max_keys=1)
            whole = await reader.survey_prefixes()
            assert (whole.complete, whole.prefixes, whole.keys_total) == (True, ((prefix, 1),), 5003)
            assert (capped.complete, capped.max_keys) == (False, 1)
            text = hint_message(dataclasses.replace(whole, complete=False, max_keys=1000))
            assert text == (
                "no lock keys under 'prefixtest-wrong:' among about 1,000 of the server's 5,003 keys searched "
                "(the search stops there: there may be others); those hold asynccoord lock keys under "
                f"{prefix!r} (--lock-prefix {prefix})"
            )


async def test_a_listed_lock_means_no_search(
    tmp_path: Path, empty_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from asynccoord.backends.redis import RedisLockStore

    async def refuse(self: Any, **_: Any) -> Any:
        raise AssertionError("searched on the normal path")

    prefix = f"prefixtest-{secrets.token_hex(4)}:"
    async with (
        SQLiteStore(tmp_path / "bot.db") as store,
        nodes_holding(empty_db_url, prefix, ["account:1"]) as locks,
    ):
        monkeypatch.setattr(RedisLockStore, "survey_prefixes", refuse)
        report = await status_report(store, lock_store=locks)
    assert report["lock_store"]["prefix_hint"] is None
    assert [lock["name"] for lock in report["locks"]] == ["account:1"]


async def test_the_dashboard_names_the_prefix_that_holds_the_locks(tmp_path: Path, empty_db_url: str) -> None:
    """In ``/api/state`` and on the page (under the locks table); nothing with the right prefix."""
    from browser import chromium_page

    right = f"prefixtest-{secrets.token_hex(4)}-fresh:"
    async with (
        SQLiteStore(tmp_path / "bot.db"),
        nodes_holding(empty_db_url, right, [f"account:{i}" for i in range(LOCKS)]),
        chromium_page(tmp_path / "profile") as page,
    ):
        for used, hint in (("asynccoord:", expected_message("asynccoord:", right)), (right, None)):
            async with (
                open_dashboard(tmp_path / "bot.db", port=0, lock_store=empty_db_url, lock_prefix=used) as dashboard,
                aiohttp.ClientSession() as session,
                session.get(dashboard.url + "api/state") as reply,
            ):
                assert reply.status == 200
                state = json.loads(await reply.text())["sections"]["status"]
                found = state["lock_store"]["prefix_hint"]
                assert (found and found["message"]) == hint
                await page.goto(dashboard.url)
                await page.wait_for("document.body.dataset.ready === '1'")
                shown = await page.evaluate(
                    "(() => { const p = document.getElementById('lock-prefix-hint');"
                    " return p.hidden ? null : p.textContent; })()"
                )
                assert shown == hint


@pytest.mark.parametrize(
    "rules",
    [["~{own}*", "+@all"], ["~*", "+@all", "-type"], ["~*", "+@all", "-dbsize"]],
    ids=["keys-of-its-prefix-only", "no-type", "no-dbsize"],
)
async def test_a_user_the_server_refuses_the_search_gets_status_without_hint(
    tmp_path: Path, empty_db_url: str, rules: list[str]
) -> None:
    """An ACL user limited to its prefix's keys, or without TYPE or DBSIZE: the search is refused, status is not."""
    from asynccoord.backends.redis import RedisLockStore

    other = f"prefixtest-{secrets.token_hex(4)}-other:"
    own = f"prefixtest-{secrets.token_hex(4)}-own:"
    user = f"prefixtest-{secrets.token_hex(4)}"
    parts = urlsplit(empty_db_url)
    url = urlunsplit(parts._replace(netloc=f"{user}@{parts.hostname}:{parts.port or 6379}"))
    async with (
        SQLiteStore(tmp_path / "bot.db") as store,
        nodes_holding(empty_db_url, other, ["account:1"]) as locks,
    ):
        await locks._client.acl_setuser(user, enabled=True, nopass=True, reset=True)
        await locks._client.execute_command("ACL", "SETUSER", user, *(r.format(own=own) for r in rules))
        try:
            async with RedisLockStore(url, prefix=own) as reader:
                report = await status_report(store, lock_store=reader)
        finally:
            await locks._client.acl_deluser(user)
    validate(report)
    assert (report["locks"], report["lock_store"]["prefix_hint"]) == ([], None)
