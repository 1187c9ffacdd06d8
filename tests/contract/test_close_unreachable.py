"""A store whose server cannot be reached closes without waiting out the calls' reconnect timeout.

Once ``close()`` began, a call in flight that lost its connection retries for at most
``CLOSING_RETRY_S`` (1 s) more; without that, it kept the close waiting for the whole
``reconnect_timeout_s`` (30 s here).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from services import PG_DSN, drop_schemas, new_schema, postgres_problem, unavailable
from test_redis_locks import _open_when_up, _own_redis

from asynccoord import StoreClosedError, StoreConnectionError
from asynccoord.backends.calls import CLOSING_RETRY_S

RECONNECT_S = 30.0  # far beyond the bound checked: a close that waited it out fails the test
CLOSE_BOUND_S = 3 * CLOSING_RETRY_S + 2.0  # the retries' last backoff (up to 1.5 s) beyond it, and a busy machine


class Proxy:
    """A TCP proxy to ``host:port`` that can be cut: its connections dropped, new ones refused."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.server: asyncio.Server | None = None
        self.streams: set[asyncio.StreamWriter] = set()
        self.silent = False  # forward nothing more, close nothing: a server that stopped answering

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self.streams |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                while data := await src.read(65536):
                    if self.silent:
                        continue
                    dst.write(data)
                    await dst.drain()
            if not self.silent:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def cut(self) -> None:
        assert self.server is not None
        self.server.close()
        for stream in self.streams:
            stream.transport.abort()
        await self.server.wait_closed()


@pytest.fixture
def own_redis_url(tmp_path: Path) -> Iterator[str]:
    yield from _own_redis(tmp_path, "--save", "", "--appendonly", "no")


async def close_while_a_call_retries(store: Any, call: asyncio.Task[Any]) -> float:
    """Seconds ``close()`` of ``store`` took while ``call`` retried a lost connection; ``call`` must fail."""
    await asyncio.sleep(0.3)  # the call has failed once and retries
    assert not call.done()
    started = time.monotonic()
    await store.close()
    took = time.monotonic() - started
    with pytest.raises(StoreConnectionError):
        await call
    return took


@pytest.mark.multiprocess
async def test_a_redis_lock_store_closes_without_waiting_out_a_lost_server(own_redis_url: str, tmp_path: Path) -> None:
    store = await _open_when_up(own_redis_url)
    store.reconnect_timeout_s = RECONNECT_S
    lease = await store.try_acquire_lock("account:1", ttl_s=30)
    assert lease.fencing_token == 1
    port = urlsplit(own_redis_url).port
    assert port is not None
    with socket.create_connection(("127.0.0.1", port)) as conn:  # SHUTDOWN NOSAVE: the server goes away
        conn.sendall(b"SHUTDOWN NOSAVE\r\n")
        conn.recv(16)
    call = asyncio.ensure_future(store.list_locks("account:1"))
    took = await close_while_a_call_retries(store, call)
    assert took < CLOSE_BOUND_S, took


@contextlib.asynccontextmanager
async def proxied_postgres() -> AsyncIterator[tuple[str, Proxy]]:
    problem = postgres_problem()
    if problem is not None:
        unavailable("PostgreSQL", problem)
    parts = urlsplit(PG_DSN)
    proxy = Proxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    port = await proxy.start()
    user = parts.netloc.rpartition("@")[0]
    netloc = f"{user}@127.0.0.1:{port}" if user else f"127.0.0.1:{port}"
    yield urlunsplit(parts._replace(netloc=netloc)), proxy


async def test_a_postgresql_store_closes_without_waiting_out_a_lost_server() -> None:
    from asynccoord.backends.postgres.store import PostgresStore

    schema = new_schema("closeunreach")
    try:
        async with proxied_postgres() as (dsn, proxy):
            store = PostgresStore(dsn, schema=schema, reconnect_timeout_s=RECONNECT_S, listen=False)
            await store.open()
            assert (await store.stats("outbox")).total == 0
            await proxy.cut()
            call = asyncio.ensure_future(store.stats("outbox"))
            took = await close_while_a_call_retries(store, call)
            assert took < CLOSE_BOUND_S, took
    finally:
        drop_schemas(schema)


async def test_a_postgresql_store_closes_soon_after_its_wait_when_the_server_stops_answering(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No error, no answer: the calls in flight hang (no retry), and the close ends after its wait."""
    from asynccoord.backends.postgres import store as pg_store
    from asynccoord.backends.postgres.store import PostgresStore

    monkeypatch.setattr(pg_store, "CLOSE_WAIT_S", 1.0)  # the wait for calls in flight (10 s) made short
    schema = new_schema("closesilent")
    try:
        async with proxied_postgres() as (dsn, proxy):
            store = PostgresStore(dsn, schema=schema, reconnect_timeout_s=RECONNECT_S, listen=False)
            await store.open()
            assert (await store.stats("outbox")).total == 0
            proxy.silent = True
            call = asyncio.ensure_future(store.stats("outbox"))
            await asyncio.sleep(0.3)
            assert not call.done()  # no answer, no error: it waits
            started = time.monotonic()
            await store.close()
            took = time.monotonic() - started
            # The 1 s wait, then 0.25 s, then the pool is dropped (it took 2 waits and a 10 s pool close).
            assert took < 1.0 + CLOSE_BOUND_S, took
            with pytest.raises(StoreClosedError):  # its connection dropped with the pool
                await call
            await proxy.cut()
    finally:
        drop_schemas(schema)
