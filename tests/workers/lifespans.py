"""Lifespans for ``python -m asynccoord run --lifespan lifespans:NAME`` in tests/cli/test_lifespan.py.

Each logs what it does, one line each, to the file ``SERVE_SEND_LOG`` names (the log of
serve_send.py): ``entering``, ``entered``, ``exiting`` and ``exited``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

from serve_send import _log

__all__ = (
    "SyncExit",
    "factory_raises",
    "failing_enter",
    "failing_exit",
    "hang_enter",
    "hang_exit",
    "needs_args",
    "swallowing",
    "stubborn_enter",
    "sync_manager",
)


def _say(word: str) -> None:
    _log(word, 0)


@contextlib.asynccontextmanager
async def hang_enter() -> AsyncIterator[None]:
    """An entry that never ends (a provider check without a timeout, say)."""
    _say("entering")
    await asyncio.sleep(3600)
    yield


@contextlib.asynccontextmanager
async def hang_exit() -> AsyncIterator[None]:
    """An exit that never ends (a client whose close waits for a dead server, say)."""
    _say("entered")
    yield
    _say("exiting")
    await asyncio.sleep(3600)


@contextlib.asynccontextmanager
async def stubborn_enter() -> AsyncIterator[None]:
    """An entry that ignores its cancellation and ends its entry all the same, then closes cleanly."""
    _say("entering")
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        await asyncio.sleep(0.2)  # finishes opening its client instead of stopping
    _say("entered")
    yield
    _say("exited")


@contextlib.asynccontextmanager
async def failing_enter() -> AsyncIterator[None]:
    raise RuntimeError("cannot reach the provider")
    yield


@contextlib.asynccontextmanager
async def swallowing() -> AsyncIterator[None]:
    """A lifespan that would swallow whatever is thrown into it at its yield."""
    _say("entered")
    try:
        yield
    except Exception:
        _say("swallowed")
    _say("exited")


@contextlib.contextmanager
def sync_manager() -> Iterator[None]:
    yield


@contextlib.asynccontextmanager
async def needs_args(token: str) -> AsyncIterator[None]:
    yield


@contextlib.asynccontextmanager
async def failing_exit() -> AsyncIterator[None]:
    _say("entered")
    yield
    raise RuntimeError("close failed")


class SyncExit:
    """A class whose ``__aexit__`` was written without ``async``."""

    async def __aenter__(self) -> None:
        _say("entered")

    def __aexit__(self, *exc: object) -> bool:
        return False


def factory_raises() -> SyncExit:
    raise KeyError("BOT_TOKEN")
