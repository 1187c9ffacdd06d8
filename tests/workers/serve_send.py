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

``--send serve_send:pool_send`` sleeps in a worker of the module's own ``ThreadPoolExecutor``
(``POOL``), and ``--send serve_send:raw_thread_send`` in a non-daemon ``threading.Thread`` it starts
and awaits through a future: neither goes away when the send is cancelled, and the interpreter
joins both at its exit. ``--send serve_send:quick_pool_send`` makes a short call in ``POOL`` and then
sleeps as ``send`` does: the pool's workers stay alive, idle.

``--send serve_send:stubborn_send`` swallows every cancellation and sleeps on: the runtime
leaves it behind at shutdown.

``--lifespan serve_send:client`` logs ``open 0 <t>`` and ``close 0 <t>``; ``--send
serve_send:client_send`` refuses to send while that client is not open.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from asynccoord import Task

__all__ = (
    "POOL",
    "account_lock",
    "client",
    "client_send",
    "fail",
    "pool_send",
    "quick_pool_send",
    "raw_thread_send",
    "send",
    "stubborn_send",
    "thread_send",
)

POOL = ThreadPoolExecutor(2, thread_name_prefix="serve-pool")
"""The send's own pool, as a sync client's wrapper keeps one."""

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


async def pool_send(task: Task) -> str:
    _log("start", task.id)
    await asyncio.get_running_loop().run_in_executor(POOL, time.sleep, float(os.environ["SERVE_SEND_SLEEP_S"]))
    return f"sent {task.id}"


async def quick_pool_send(task: Task) -> str:
    await asyncio.get_running_loop().run_in_executor(POOL, time.sleep, 0.01)
    return await send(task)


async def raw_thread_send(task: Task) -> str:
    _log("start", task.id)
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def sleep() -> None:
        time.sleep(float(os.environ["SERVE_SEND_SLEEP_S"]))
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(done.set_result, None)

    threading.Thread(target=sleep, name=f"serve-thread-{task.id}").start()
    await done
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
