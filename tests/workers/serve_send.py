"""Send and lock-key functions for ``python -m asynccoord run`` in tests/multiprocess/test_node_serve.py.

Import it with ``tests/workers`` on ``PYTHONPATH``: ``--send serve_send:send
--lock-key serve_send:account_lock``. Configured by environment variables:

``SERVE_SEND_LOG``
    A file the send appends one line to (one ``os.write`` each, O_APPEND):
    ``start <id> <time.time()>`` when it starts, ``end <id> <t>`` when its sleep is
    over, ``cancelled <id> <t>`` when it is cancelled.
``SERVE_SEND_SLEEP_S``
    How long each send sleeps, seconds.

``--send serve_send:thread_send`` sleeps in a thread (``asyncio.to_thread``), which goes on
after the send is cancelled: the process then waits for it after its teardown.

``--send serve_send:stubborn_send`` swallows every cancellation and sleeps on: the runtime
leaves it behind at shutdown.

``--lifespan serve_send:client`` logs ``open 0 <t>`` and ``close 0 <t>``; ``--send
serve_send:client_send`` refuses to send while that client is not open.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator

from asynccoord import Task

__all__ = ("account_lock", "client", "client_send", "fail", "send", "stubborn_send", "thread_send")

_open: list[bool] = []  # [True] while the client of `client` is open


def _log(word: str, task_id: int) -> None:
    fd = os.open(os.environ["SERVE_SEND_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{word} {task_id} {time.time():.6f}\n".encode())
    finally:
        os.close(fd)


async def send(task: Task) -> str:
    _log("start", task.id)
    try:
        await asyncio.sleep(float(os.environ["SERVE_SEND_SLEEP_S"]))
    except asyncio.CancelledError:
        _log("cancelled", task.id)
        raise
    _log("end", task.id)
    return f"sent {task.id}"


async def thread_send(task: Task) -> str:
    _log("start", task.id)
    await asyncio.to_thread(time.sleep, float(os.environ["SERVE_SEND_SLEEP_S"]))
    return f"sent {task.id}"


async def stubborn_send(task: Task) -> str:
    """A send that ignores cancellation: it logs ``cancelled`` and sleeps on to its end."""
    _log("start", task.id)
    loop = asyncio.get_running_loop()
    end = loop.time() + float(os.environ["SERVE_SEND_SLEEP_S"])
    while loop.time() < end:
        try:
            await asyncio.sleep(end - loop.time())
        except asyncio.CancelledError:
            _log("cancelled", task.id)
    _log("end", task.id)
    return f"sent {task.id}"


async def fail(task: Task) -> None:
    """A send the provider refuses every time (a failed attempt)."""
    raise RuntimeError(f"provider down for {task.id}")


def account_lock(task: Task) -> str:
    return f"account:{task.payload['account']}"


@contextlib.asynccontextmanager
async def client() -> AsyncIterator[None]:
    """A client the sends of ``client_send`` need: opened before the nodes, closed after them."""
    _log("open", 0)
    _open.append(True)
    try:
        yield
    finally:
        _open.clear()
        _log("close", 0)


async def client_send(task: Task) -> str:
    if not _open:
        raise RuntimeError(f"task {task.id} sent while the client is closed")
    return await send(task)
