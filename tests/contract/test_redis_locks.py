"""What only the Redis lock store has: server-side expiry, counters kept forever, typed errors.

The lock contract itself runs on Redis through the ``backend`` fixture of the lock test
modules (``test_lock_store.py``, ``test_lock_api.py``, ``test_lock_watchdog.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from services import REDIS_URL, need_redis_py, redis_problem, unavailable

from asynccoord import InvalidArgumentError, InvalidTypeError, Lease, LockBusy, StoreConnectionError
from asynccoord.contract.locks import LockStore
from asynccoord.validation import MAX_DURATION_S


@pytest.fixture
async def locks() -> AsyncIterator[Any]:
    problem = redis_problem()
    if problem is not None:
        unavailable("Redis", problem)
    from asynccoord.backends.redis import RedisLockStore

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
    need_redis_py()  # no server needed, only redis-py
    from asynccoord.backends.redis import RedisLockStore

    store = RedisLockStore("redis://127.0.0.1:1/0", reconnect_timeout_s=0.3)
    with pytest.raises(StoreConnectionError) as info:
        await store.open()
    assert info.value.__cause__ is not None


async def test_credentials_the_server_refuses_are_named_as_such(locks: Any) -> None:
    """A wrong password is no lost connection: the message says the server refused the URL's credentials."""
    import urllib.parse

    from asynccoord.backends.redis import RedisLockStore

    parts = urllib.parse.urlsplit(REDIS_URL)
    wrong = parts._replace(netloc=f"nobody:wrong-password@{parts.hostname}:{parts.port or 6379}").geturl()
    store = RedisLockStore(wrong, reconnect_timeout_s=0.2)
    with pytest.raises(StoreConnectionError) as info:
        await store.open()
    assert "Redis refused the URL's credentials" in str(info.value)
    assert "lost or refused" not in str(info.value)
    assert "wrong-password" not in str(info.value)


async def test_the_server_expires_abandoned_locks_but_keeps_the_fencing_counter(locks: Any) -> None:
    lease = await locks.try_acquire_lock("acct:1", ttl_s=0.2)
    assert isinstance(lease, Lease)
    zset = f"{locks.prefix}lock:acct:1"
    ttl_ms = await redis_call(lambda c: c.pttl(zset))
    # The longest lease (0.2 s) plus key_slack_ms (0.2 s), rounded up to a whole millisecond:
    # the script takes the ceiling of (expiry - now) * 1000 in floats, which can be 200.00000001.
    assert 0 < ttl_ms <= 401
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


async def test_renewal_of_many_leases_goes_in_short_scripts_in_one_round_trip(locks: Any) -> None:
    """A script holds the Redis server while it runs: 600 leases go in 3 script calls (at most 256
    each), pipelined in one round trip, and each lease's outcome comes back in its place."""
    leases = list(await asyncio.gather(*(locks.try_acquire_lock(f"held:{i}", ttl_s=5.0) for i in range(600))))
    assert all(isinstance(lease, Lease) for lease in leases)
    released = set(range(0, 600, 7))  # lapsed by the time of the renewal, in every chunk
    for i in sorted(released):
        await locks.release_lock(leases[i])
    script, call = locks._scripts["renew_many"], locks._call
    sizes: list[int] = []
    round_trips = 0

    async def counting(*args: Any, **kwargs: Any) -> Any:
        sizes.append(len(kwargs["keys"]) // 2)
        return await script(*args, **kwargs)

    async def counting_calls(*args: Any, **kwargs: Any) -> Any:
        nonlocal round_trips
        round_trips += 1
        return await call(*args, **kwargs)

    locks._scripts["renew_many"] = counting
    locks._call = counting_calls
    renewed = await locks.renew_locks([dataclasses.replace(lease, ttl_s=9.0) for lease in leases])
    assert sizes == [256, 256, 88]
    assert round_trips == 1
    for i, (lease, outcome) in enumerate(zip(leases, renewed, strict=True)):
        if i in released:
            assert outcome is None, i
        else:
            assert outcome is not None, i
            assert (outcome.name, outcome.ttl_s) == (lease.name, 9.0), i
            assert outcome.expires_at > lease.expires_at + 3.0, i  # now about 9 s out, not 5
    infos = await locks.list_locks()
    assert sorted(i.name for i in infos) == sorted(f"held:{i}" for i in range(600) if i not in released)


async def test_semaphore_permits_from_many_concurrent_callers(locks: Any) -> None:
    outcomes = await asyncio.gather(*(locks.try_acquire_lock("pool", ttl_s=5.0, permits=4) for _ in range(40)))
    granted = [o for o in outcomes if isinstance(o, Lease)]
    assert len(granted) == 4
    assert sorted(g.fencing_token for g in granted) == [1, 2, 3, 4]
    assert all(isinstance(o, LockBusy) for o in outcomes if not isinstance(o, Lease))


@pytest.mark.parametrize(
    ("url", "problem", "shown"),
    [
        ("http://x", "must specify one of the following schemes (redis://, rediss://, unix://)", "'http://x'"),
        ("", "must specify one of the following schemes", "''"),
        ("127.0.0.1:6379", "must specify one of the following schemes", "'127.0.0.1:6379'"),
        ("http://user:s3cret@x/0", "must specify one of the following schemes", "'http://user:***@x/0'"),
        ("redis://:s3cret@x:port/0", "Port could not be cast to integer value as 'port'", "'redis://:***@x:port/0'"),
        ("redis://x/0?socket_timeout=soon", "Invalid value for 'socket_timeout'", "'redis://x/0?socket_timeout=soon'"),
        ("redis://:Ab/cds3cret@127.0.0.1:6379/0", "a '/', '?' or '#' before the '@'", "'redis://***@127.0.0.1:6379/0'"),
        # redis-py itself would connect to database 0: a typo must not reach another database
        (
            "redis://:s3cret@x/abc",
            "the database number must be an integer (redis://host:port/0), not 'abc'",
            "'redis://:***@x/abc'",
        ),
        ("rediss://x:6380/1x", "the database number must be an integer", "'rediss://x:6380/1x'"),
        # a password in path parameters is hidden in the message too
        ("redis://x/0;password=s3cret", "not '0;...'", "'redis://x/0;password=***'"),
        # redis-py hands an unknown parameter to its connections: a TypeError at open()
        (
            "redis://:s3cret@127.0.0.1:6379/0?foo=bar",
            "redis-py takes no query parameter 'foo' in a redis:// URL (remove the parameter)",
            "'redis://:***@127.0.0.1:6379/0?foo=bar'",
        ),
        (
            "unix:///tmp/r.sock?db=2&Foo=1&password=s3cret&bar=2",
            "redis-py takes no query parameters 'Foo', 'bar' in a unix:// URL (remove the parameters)",
            "'unix:///tmp/r.sock?db=2&Foo=1&password=***&bar=2'",
        ),
        (
            "redis://x/0?ssl_check_hostname=false",
            "no query parameter 'ssl_check_hostname' in a redis:// URL (the ssl_* options need rediss://)",
            "'redis://x/0?ssl_check_hostname=false'",
        ),
    ],
)
def test_a_url_redis_py_cannot_use_is_refused_at_construction(url: str, problem: str, shown: str) -> None:
    need_redis_py()
    from asynccoord.backends.redis import RedisLockStore

    with pytest.raises(InvalidArgumentError) as info:
        RedisLockStore(url)
    message = str(info.value)
    assert message.startswith("url must be a Redis URL (redis://host:port/db): ")
    assert problem in message
    assert message.endswith(f", got {shown}")
    assert "s3cret" not in message
    assert "'Ab'" not in message  # no piece of a password (redis-py quotes the "port" it read)


@pytest.mark.parametrize(
    "url",
    ["redis://127.0.0.1:6379/0", "rediss://h", "unix:///tmp/redis.sock", "REDIS://h", "redis://h/", "redis://h:1/15"],
)
def test_every_scheme_redis_py_connects_with_is_accepted(url: str) -> None:
    need_redis_py()
    from asynccoord.backends.redis import RedisLockStore

    assert RedisLockStore(url).url == url


# A value redis-py's parse_url reads for each query parameter it knows.
KNOWN_QUERY_VALUES = {
    "db": "1",
    "socket_timeout": "1.5",
    "socket_connect_timeout": "1.5",
    "socket_read_size": "65536",
    "socket_keepalive": "true",
    "retry_on_timeout": "true",
    "retry_on_error": "TimeoutError",
    "max_connections": "4",
    "health_check_interval": "2",
    "ssl_check_hostname": "false",
    "ssl_include_verify_flags": "VERIFY_X509_STRICT",
    "ssl_exclude_verify_flags": "VERIFY_X509_PARTIAL_CHAIN",
    "ssl_min_version": "771",
    "timeout": "3",
    "protocol": "3",
    "legacy_responses": "false",
}


def test_every_query_parameter_redis_py_parses_is_accepted() -> None:
    need_redis_py()
    from redis.asyncio.connection import URL_QUERY_ARGUMENT_PARSERS

    from asynccoord.backends.redis import RedisLockStore

    names = sorted(URL_QUERY_ARGUMENT_PARSERS)
    assert names, "redis-py parses no query parameter any more"
    for name in names:  # rediss://: the ssl_* options apply to TLS connections only
        url = f"rediss://h:6380/0?{name}={KNOWN_QUERY_VALUES.get(name, '1')}"
        assert RedisLockStore(url).url == url
    # and those it passes through as text, which its connections take
    for url in ("redis://h/0?client_name=bot&socket_timeout=2", "rediss://h/0?ssl_cert_reqs=none", "unix:///s?db=3"):
        assert RedisLockStore(url).url == url


async def test_a_url_with_query_parameters_opens() -> None:
    problem = redis_problem()
    if problem is not None:
        unavailable("Redis", problem)
    from asynccoord.backends.redis import RedisLockStore

    joint = "&" if "?" in REDIS_URL else "?"
    url = f"{REDIS_URL}{joint}client_name=asynccoord-test&socket_timeout=5&health_check_interval=2"
    async with RedisLockStore(url, prefix=f"test:{secrets.token_hex(6)}:") as store:
        assert await store.list_locks() == []


@pytest.mark.parametrize("slack_ms", [2**70, 365 * 86_400_000 + 1, -1])
def test_key_slack_ms_out_of_range_is_refused(slack_ms: int) -> None:
    need_redis_py()
    from asynccoord.backends.redis import MAX_KEY_SLACK_MS, RedisLockStore

    assert MAX_KEY_SLACK_MS == 365 * 86_400_000  # one year, as MAX_DURATION_S
    bound = "<= 31536000000" if slack_ms > 0 else ">= 0"
    with pytest.raises(InvalidArgumentError, match=rf"^key_slack_ms must be {bound}, got {slack_ms}$"):
        RedisLockStore(REDIS_URL, key_slack_ms=slack_ms)


async def test_the_longest_slack_and_lease_set_an_exact_expiry() -> None:
    problem = redis_problem()
    if problem is not None:
        unavailable("Redis", problem)
    from asynccoord.backends.redis import MAX_KEY_SLACK_MS, RedisLockStore

    prefix = f"test:{secrets.token_hex(6)}:"
    store = RedisLockStore(REDIS_URL, prefix=prefix, key_slack_ms=MAX_KEY_SLACK_MS)
    await store.open()
    try:
        lease = await store.try_acquire_lock("acct", ttl_s=MAX_DURATION_S)
        assert isinstance(lease, Lease)
        year_ms = int(MAX_DURATION_S * 1000)
        for key in (f"{prefix}lock:acct", f"{prefix}lockmeta:acct"):
            ttl_ms = await redis_call(lambda c, key=key: c.pttl(key))
            assert 2 * year_ms - 60_000 < ttl_ms <= 2 * year_ms, key  # the lease plus the slack
        renewed = await store.renew_lock(lease, ttl_s=MAX_DURATION_S)
        assert renewed is not None
        assert await store.release_lock(renewed) is True
    finally:
        await store.close()
        keys = await redis_call(lambda c: c.keys(f"{prefix}*"))
        if keys:
            await redis_call(lambda c: c.delete(*keys))


async def test_a_release_whose_answer_was_lost_reports_the_lease_released(locks: Any) -> None:
    """The release script ran but its answer was lost: the retry finds no lease, and since the
    lease was live by the server clock, it says released (True), not lapsed; the lock is free.
    A second release of the same lease still says False (released already)."""
    import redis.exceptions

    from asynccoord import Lock

    script = locks._scripts["release"]
    cut: list[Any] = []

    async def lossy(*, keys: Any, args: Any, client: Any) -> Any:
        reply = await script(keys=keys, args=args, client=client)
        if not cut:
            cut.append(reply)
            raise redis.exceptions.ConnectionError("connection lost after the release (test)")
        return reply

    lease = await locks.try_acquire_lock("job", ttl_s=30)
    assert isinstance(lease, Lease)
    locks._scripts["release"] = lossy
    try:
        assert await locks.release_lock(lease) is True
        assert cut == [1]  # the lost attempt released it
        assert await locks.list_locks("job") == []
        assert await locks.release_lock(lease) is False
        cut.clear()
        async with Lock(locks, "job", ttl_s=30):  # no LockLostError at the end of the block
            pass
        assert cut == [1]
        # A release retried after a connection lost before the server saw it, of a lease the
        # caller released already and another holder has taken since: False, not released.
        taken = await locks.try_acquire_lock("job", ttl_s=30)
        assert isinstance(taken, Lease)
        dropped: list[bool] = []

        async def dropping(*, keys: Any, args: Any, client: Any) -> Any:
            if not dropped:
                dropped.append(True)
                raise redis.exceptions.ConnectionError("connection lost before the release (test)")
            return await script(keys=keys, args=args, client=client)

        locks._scripts["release"] = dropping
        assert await locks.release_lock(lease) is False
        assert dropped == [True]
        assert [i.owner_token for i in await locks.list_locks("job")] == [taken.owner_token]
    finally:
        locks._scripts["release"] = script


async def test_a_server_without_persistence_is_warned_about_at_open(
    locks: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The test server's own configuration decides: no AOF gives the warning, RDB save points
    or not (the local Redis runs with --save "" --appendonly no); AOF on, none."""
    from asynccoord.backends.redis import RedisLockStore

    async def appendonly(client: Any) -> str:
        value = (await client.config_get("appendonly"))["appendonly"]
        return value.decode() if isinstance(value, bytes) else value

    persists = await redis_call(appendonly) == "yes"  # RDB snapshots alone lose the increments since the last one
    caplog.set_level(logging.WARNING, logger="asynccoord.backends.redis")
    async with RedisLockStore(REDIS_URL, prefix=locks.prefix) as other:
        assert other.persistent is persists
    warned = [r for r in caplog.records if r.getMessage().startswith("asynccoord.redis.no_persistence")]
    assert len(warned) == (0 if persists else 1)
    if warned:
        assert warned[0].levelno == logging.WARNING
        assert "appendonly" in warned[0].getMessage()


def _own_redis(tmp_path: Path, *options: str) -> Iterator[str]:
    """A redis-server of the test's own, started with ``options``; its URL."""
    server = shutil.which("redis-server")
    if server is None:
        unavailable("redis-server", "not on PATH")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [server, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path)]
    proc = subprocess.Popen([*command, *options], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def aof_redis_url(tmp_path: Path) -> Iterator[str]:
    """A redis-server of the test's own, started with --appendonly yes; its URL."""
    yield from _own_redis(tmp_path, "--save", "", "--appendonly", "yes")


@pytest.fixture
def rdb_redis_url(tmp_path: Path) -> Iterator[str]:
    """A redis-server of the test's own with RDB snapshot points and no append-only file; its URL."""
    yield from _own_redis(tmp_path, "--save", "3600 1 300 100", "--appendonly", "no")


async def _open_when_up(url: str) -> Any:
    """A RedisLockStore on ``url``, opened once the server started there accepts connections."""
    from asynccoord.backends.redis import RedisLockStore

    deadline = time.monotonic() + 10.0
    while True:
        store = RedisLockStore(url, reconnect_timeout_s=1.0)
        try:
            await store.open()
            return store
        except StoreConnectionError:
            assert time.monotonic() < deadline, "redis-server did not start"
            await asyncio.sleep(0.05)


@pytest.mark.multiprocess
async def test_a_server_with_append_only_files_is_not_warned_about(
    aof_redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="asynccoord.backends.redis")
    store = await _open_when_up(aof_redis_url)
    try:
        assert store.persistent is True
    finally:
        await store.close()
    assert not [r for r in caplog.records if "no_persistence" in r.getMessage()]


@pytest.mark.multiprocess
async def test_a_server_with_rdb_snapshots_only_is_warned_about(
    rdb_redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A restart from a snapshot sets the fencing counters back to it: not persistent enough."""
    caplog.set_level(logging.WARNING, logger="asynccoord.backends.redis")
    store = await _open_when_up(rdb_redis_url)
    try:
        assert store.persistent is False
    finally:
        await store.close()
    (warned,) = [r for r in caplog.records if r.getMessage().startswith("asynccoord.redis.no_persistence")]
    assert warned.levelno == logging.WARNING
    assert "save=3600 1 300 100" in warned.getMessage()
    assert "RDB snapshots alone lose the fencing counter increments" in warned.getMessage()
    assert "appendonly yes" in warned.getMessage()


@pytest.mark.parametrize(
    ("aof_enabled", "save", "expected"),
    [
        (1, "", (True, "aof")),
        ("1", "3600 1 300 100", (True, "aof")),
        (0, "3600 1 300 100", (False, "rdb")),  # snapshots alone: increments since the last one are lost
        (b"0", b"900 1", (False, "rdb")),
        (0, "", (False, "none")),
        (0, "   ", (False, "none")),
        (0, None, (False, "no-aof")),  # CONFIG refused: AOF off is known, the save points are not
    ],
)
def test_only_an_append_only_file_counts_as_persistent(aof_enabled: Any, save: Any, expected: Any) -> None:
    from asynccoord.backends.redisdurability import durability

    assert durability(aof_enabled, save) == expected


async def test_a_server_that_refuses_info_is_of_unknown_persistence() -> None:
    import redis.exceptions as rerr

    from asynccoord.backends.redisdurability import persistence

    class Refusing:
        async def info(self, section: str) -> dict[str, Any]:
            raise rerr.ResponseError("unknown command 'INFO'")

    assert await persistence(Refusing()) == (None, "unknown", "?")  # type: ignore[arg-type]


async def test_advancing_a_fencing_counter_never_lowers_it(locks: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="asynccoord.backends.redis")
    counter = f"{locks.prefix}fencing:acct:1"
    lease = await locks.try_acquire_lock("acct:1", ttl_s=5.0)
    assert isinstance(lease, Lease)
    assert lease.fencing_token == 1
    await locks.release_lock(lease)
    assert await locks.advance_fencing_token("acct:1", 40) is True
    assert await redis_call(lambda c: c.get(counter)) == b"40"
    assert await locks.advance_fencing_token("acct:1", 40) is False  # at it already
    assert await locks.advance_fencing_token("acct:1", 7) is False  # never lowered
    assert await locks.advance_fencing_token("acct:1", 9) is False
    assert await redis_call(lambda c: c.get(counter)) == b"40"
    lease = await locks.try_acquire_lock("acct:1", ttl_s=5.0)
    assert isinstance(lease, Lease)
    assert lease.fencing_token == 41  # above the token the resource accepted
    await locks.release_lock(lease)
    # Decimal text compared as numbers, past a double's exact range: "100" above "99", 2**63 - 2 above 2**53 + 1.
    assert await locks.advance_fencing_token("acct:1", 99) is True
    assert await locks.advance_fencing_token("acct:1", 100) is True
    assert await redis_call(lambda c: c.get(counter)) == b"100"
    assert await locks.advance_fencing_token("acct:1", 2**53 + 1) is True
    assert await locks.advance_fencing_token("acct:1", 2**63 - 2) is True
    assert await locks.advance_fencing_token("acct:1", 2**53 + 3) is False
    assert await redis_call(lambda c: c.get(counter)) == str(2**63 - 2).encode()
    # A counter a restart emptied (no key at all) starts at the accepted token.
    assert await locks.advance_fencing_token("acct:2", 15) is True
    assert await redis_call(lambda c: c.get(f"{locks.prefix}fencing:acct:2")) == b"15"
    behind = [r for r in caplog.records if r.getMessage().startswith("asynccoord.redis.fencing_counter_behind")]
    assert len(behind) == 6  # once per move, none when the counter was ahead
    assert all(r.levelno == logging.WARNING for r in behind)
    assert "name='acct:1' counter=1 accepted=40" in behind[0].getMessage()
    assert "name='acct:2' counter=0 accepted=15" in behind[-1].getMessage()
    for bad, error in [(0, InvalidArgumentError), (2**63, InvalidArgumentError), ("7", InvalidTypeError)]:
        with pytest.raises(error, match="at_least"):
            await locks.advance_fencing_token("acct:1", bad)
    with pytest.raises(InvalidArgumentError, match="name"):
        await locks.advance_fencing_token("", 5)


@pytest.mark.parametrize("swallow", ["as_connection_error", "returning"])
async def test_a_cancellation_redis_py_turns_into_an_error_or_swallows_still_ends_the_caller(
    locks: Any, swallow: str
) -> None:
    """redis-py may drop an interrupted command's connection and raise ConnectionError, or go
    on: either way the caller that was cancelled must end cancelled, not retry or go on."""
    import redis.exceptions as rerr

    started = asyncio.Event()
    calls = 0

    async def interrupted(client: Any) -> str:
        nonlocal calls
        calls += 1
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            if swallow == "as_connection_error":
                raise rerr.ConnectionError("Connection closed by server.") from None
            return "went on"
        return "slept"

    async def caller() -> str:
        result: str = await locks._call(interrupted, "list_locks")
        await asyncio.sleep(30)  # a poll loop's next sleep: only a cancellation ends it
        return result

    task = asyncio.ensure_future(caller())
    await started.wait()
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=5.0)
    assert done == {task}
    assert task.cancelled()
    assert calls == 1  # not retried


@pytest.mark.parametrize("mark", ["[1]", "*", "?", "\\"])
async def test_list_locks_finds_every_lock_under_a_prefix_holding_glob_characters(mark: str) -> None:
    """The prefix is matched literally: SCAN's glob characters in it are escaped."""
    problem = redis_problem()
    if problem is not None:
        unavailable("Redis", problem)
    from asynccoord.backends.redis import RedisLockStore

    prefix = f"test:{secrets.token_hex(6)}{mark}:"
    sibling = prefix.replace(mark, "x")  # what an unescaped pattern could also match
    async with RedisLockStore(REDIS_URL, prefix=prefix) as store, RedisLockStore(REDIS_URL, prefix=sibling) as other:
        try:
            mine = await store.try_acquire_lock("mine", ttl_s=30.0)
            theirs = await other.try_acquire_lock("theirs", ttl_s=30.0)
            assert isinstance(mine, Lease)
            assert isinstance(theirs, Lease)
            assert [info.name for info in await store.list_locks()] == ["mine"]
        finally:
            await store.release_lock(mine)
            await other.release_lock(theirs)
