"""asynccoord.pauses: the provider's pauses of locks, recorded here and carried to the other processes of a database."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from services import PG_DSN, drop_schemas, new_schema, postgres_problem, unavailable
from support import ROOT

from asynccoord import NodeConfig, RateLimit, RateLimited, Runtime, SQLiteStore, Task
from asynccoord import events as ev
from asynccoord.backends.sqlite.wakeup import MAX_DATAGRAM_BYTES, decode_datagram, decode_pauses, encode_pauses
from asynccoord.pauses import MIN_RATE_LIMIT_PAUSE_S, PauseBook, rate_limited_of


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_pause_lasts_its_seconds_and_the_longer_of_two_stays() -> None:
    clock = Clock()
    book = PauseBook(clock=clock)
    assert book.remaining_s("account:a") == 0.0
    book.pause("account:a", 2.0)
    clock.now += 0.5
    assert book.remaining_s("account:a") == pytest.approx(1.5)
    book.pause("account:a", 0.2)  # shorter than what is left: the longer stays
    assert book.remaining_s("account:a") == pytest.approx(1.5)
    assert book.remaining_s("account:b") == 0.0
    clock.now += 1.5
    assert book.remaining_s("account:a") == 0.0


@pytest.mark.parametrize(
    ("dimension", "pace_dimension", "paused"),
    [
        (None, None, True),
        (None, "account", True),
        ("account", "account", True),
        ("chat", "account", False),
        ("account", None, False),
    ],
)
def test_a_429_pauses_the_lock_only_for_no_dimension_or_the_locks_own(
    dimension: str | None, pace_dimension: str | None, paused: bool
) -> None:
    clock = Clock()
    book = PauseBook(clock=clock)
    assert book.paused_by("account:a", RateLimited(3.0, dimension=dimension), pace_dimension) is paused
    assert book.remaining_s("account:a") == (pytest.approx(3.0) if paused else 0.0)


def test_a_zero_retry_after_still_pauses_for_the_minimum() -> None:
    clock = Clock()
    book = PauseBook(clock=clock)
    book.paused_by("account:a", RateLimited(0.0), None)
    assert book.remaining_s("account:a") == pytest.approx(MIN_RATE_LIMIT_PAUSE_S)


def test_many_names_forget_the_pauses_that_are_over_first() -> None:
    clock = Clock()
    book = PauseBook(clock=clock)
    for i in range(5000):
        book.pause(f"old:{i}", 1.0)
    clock.now += 2.0
    book.pause("new", 10.0)
    assert book.remaining_s("new") == pytest.approx(10.0)
    assert book.remaining_s("old:0") == 0.0
    assert len(book._until) == 1


def test_pause_datagrams_round_trip_and_a_malformed_one_yields_nothing() -> None:
    [data] = encode_pauses({"account:a": 1.5, "account:b": 0.25})
    assert decode_pauses(data) == [("account:a", 1.5), ("account:b", 0.25)]
    nested = b'{"pause": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    for bad in (b'{"pause": [["x"]]}', b'{"pause": [["x", -1]]}', b'{"pause": [["", 1]]}', b"{", b'{"p": 1}', nested):
        assert decode_pauses(bad) == []
    assert decode_datagram(data) == ([], [])  # an earlier revision's reader drops it, and only it


def test_many_pauses_at_once_go_in_as_many_datagrams_as_it_takes_and_none_is_lost() -> None:
    paused = {f"account:{i:05d}:" + "x" * 230: 2.0 for i in range(1000)}
    datagrams = encode_pauses(paused)
    assert len(datagrams) > 1
    assert all(len(d) <= MAX_DATAGRAM_BYTES for d in datagrams)
    assert [name for d in datagrams for name, _ in decode_pauses(d)] == list(paused)


async def _paused_elsewhere(first: Any, second: Any) -> float:
    """Pause ``account:a`` through ``first``; return how long until ``second`` (another store) has it."""
    started = time.monotonic()
    assert first.pauses.paused_by("account:a", RateLimited(30.0), None)
    while second.pauses.remaining_s("account:a") == 0.0:
        assert time.monotonic() - started < 10.0, "the pause never arrived"
        await asyncio.sleep(0.005)
    assert 25.0 < second.pauses.remaining_s("account:a") <= 30.0
    assert second.pauses.remaining_s("account:b") == 0.0
    return time.monotonic() - started


async def test_another_sqlite_store_on_the_file_learns_the_pause(tmp_path: Path) -> None:
    path = str(tmp_path / "p.db")
    async with SQLiteStore(path) as first, SQLiteStore(path) as second:
        await _paused_elsewhere(first, second)
        assert first.pauses.remaining_s("account:a") > 25.0


@pytest.mark.parametrize("listen", [True, False], ids=["listening", "not-listening"])
async def test_another_postgresql_store_learns_the_pause(listen: bool) -> None:
    """The announcing store may not LISTEN itself (``listen=False``): a NOTIFY needs none."""
    from asynccoord.backends.postgres.store import PostgresStore

    problem = postgres_problem()
    if problem is not None:
        unavailable("PostgreSQL", problem)
    schema = new_schema("pause")
    try:
        async with (
            PostgresStore(PG_DSN, schema=schema, listen=listen) as first,
            PostgresStore(PG_DSN, schema=schema) as second,
        ):
            await _paused_elsewhere(first, second)
    finally:
        drop_schemas(schema)


WAITER = """
import asyncio, sys, time
from asynccoord import SQLiteStore

async def main():
    async with SQLiteStore(sys.argv[1]) as store:
        print("open", flush=True)
        deadline = time.monotonic() + 20
        while store.pauses.remaining_s("account:a") == 0.0 and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        print(round(store.pauses.remaining_s("account:a"), 1), flush=True)

asyncio.run(main())
"""


@pytest.mark.multiprocess
async def test_a_pause_reaches_another_os_process_on_the_file(tmp_path: Path) -> None:
    path = str(tmp_path / "p.db")
    async with SQLiteStore(path) as store:
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", WAITER, path, stdout=asyncio.subprocess.PIPE, cwd=str(ROOT)
        )
        assert child.stdout is not None
        assert await asyncio.wait_for(child.stdout.readline(), 30.0) == b"open\n"
        store.pauses.paused_by("account:a", RateLimited(30.0, dimension="account"), "account")
        line = await asyncio.wait_for(child.stdout.readline(), 30.0)
        assert await child.wait() == 0
    assert 25.0 < float(line) <= 30.0


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_429_stops_the_accounts_claimed_sends_in_another_store_too(kind: str, tmp_path: Path) -> None:
    """Two stores on one database, as two processes have, each hosting a Runtime under the account's lock."""
    schema = None
    if kind == "sqlite":
        path = str(tmp_path / "p.db")
        stores = [SQLiteStore(path), SQLiteStore(path)]
    else:
        from asynccoord.backends.postgres.store import PostgresStore

        problem = postgres_problem()
        if problem is not None:
            unavailable("PostgreSQL", problem)
        schema = new_schema("pause")
        stores = [PostgresStore(PG_DSN, schema=schema), PostgresStore(PG_DSN, schema=schema)]
    sends: list[tuple[float, int]] = []
    refused_at: list[float] = []

    async def send(task: Task) -> None:
        if task.payload["n"] == 10 and not refused_at:
            refused_at.append(time.monotonic())
            raise RateLimited(1.5, dimension="account")
        sends.append((time.monotonic(), task.payload["n"]))
        await asyncio.sleep(0.002)

    n = 60
    try:
        async with stores[0] as first, stores[1] as second:
            await first.set_rate_limits("outbox", [RateLimit(dimension="account", count=100, per_s=1.0, burst=40)])
            for i in range(n):
                keys = {"account": "bot-1"}
                await first.enqueue("outbox", {"n": i}, partition_key=f"c{i % 20}", limit_keys=keys, max_attempts=1)
            config = NodeConfig(queue="outbox", lock_pace_dimension="account", idle_max_s=0.2)
            runtimes = [
                Runtime(s, send=send, nodes=2, config=config, lock_key=lambda t: "account:bot-1")
                for s in (first, second)
            ]
            async with runtimes[0], runtimes[1]:
                await runtimes[0].wait_until_drained(timeout_s=60)
                await runtimes[1].wait_until_drained(timeout_s=60)
            paused = first.events.get(ev.SEND_PAUSED) + second.events.get(ev.SEND_PAUSED)
    finally:
        if schema is not None:
            drop_schemas(schema)
    [at] = refused_at
    during = [(round(t - at, 3), i) for t, i in sends if at < t < at + 1.5 - 0.05]
    assert during == []  # neither store's runtime sent for the account during the Retry-After
    assert sorted(i for _, i in sends) == list(range(n))
    assert paused >= 1


def test_a_group_of_429s_is_the_longest_and_a_group_with_another_error_is_none() -> None:
    one = RateLimited(1.0, dimension="account", key="a")
    assert rate_limited_of(one) is one
    assert rate_limited_of(None) is None
    assert rate_limited_of(ValueError("x")) is None
    longer = RateLimited(3.0, dimension="account", key="a")
    nested = ExceptionGroup("outer", [one, ExceptionGroup("inner", [longer])])
    assert rate_limited_of(nested) is longer
    mixed_dimensions = rate_limited_of(ExceptionGroup("g", [one, RateLimited(2.0, dimension="chat")]))
    assert mixed_dimensions is not None
    assert (mixed_dimensions.retry_after_s, mixed_dimensions.dimension, mixed_dimensions.key) == (2.0, None, None)
    assert rate_limited_of(ExceptionGroup("g", [one, ValueError("other")])) is None


def test_a_429_naming_a_dimension_under_a_lock_of_no_given_dimension_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The lock is not paused (its dimension is unknown), and the log says so and how to change it."""
    caplog.set_level(logging.WARNING, logger="asynccoord.pauses")
    dimension = f"account-{uuid.uuid4().hex[:8]}"  # logged once per process: a dimension of this test's own
    book = PauseBook(clock=Clock())
    for _ in range(3):
        assert book.paused_by("account:a", RateLimited(3.0, dimension=dimension), None) is False
    assert book.remaining_s("account:a") == 0.0
    [warned] = [r.getMessage() for r in caplog.records if "lock_not_paused" in r.getMessage()]
    assert warned.startswith(f"asynccoord.pauses.lock_not_paused lock='account:a' dimension='{dimension}':")
    assert book.paused_by("account:a", RateLimited(3.0, dimension="chat"), "account") is False  # told: no log
    assert len([r for r in caplog.records if "lock_not_paused" in r.getMessage()]) == 1
