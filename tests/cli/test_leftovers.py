"""``run``'s event loop does not wait for work that outlives its coroutine (asynccoord._leftovers)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

from asynccoord._leftovers import Leftovers, run_leaving


def test_a_task_ignoring_cancellation_and_a_thread_are_reported_not_waited_for() -> None:
    release = threading.Event()
    reported: list[Leftovers] = []
    stubborn_cancelled: list[int] = []

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                stubborn_cancelled.append(1)

    async def main() -> str:
        asyncio.get_running_loop().create_task(stubborn())
        thread = asyncio.ensure_future(asyncio.to_thread(release.wait, 60))
        await asyncio.sleep(0.05)  # both started
        thread.cancel()  # the coroutine is cancelled; its thread is not
        return "done"

    started = time.monotonic()
    try:
        assert run_leaving(main(), reported.append) == "done"
        took = time.monotonic() - started
    finally:
        release.set()  # the thread ends: the test process is not held at its exit
    assert reported == [Leftovers(tasks=1, threads=1)]
    assert stubborn_cancelled == [1]  # cancelled once more, not awaited
    assert took < 5, took


def test_tasks_that_end_when_cancelled_are_waited_for_and_nothing_is_reported() -> None:
    reported: list[Leftovers] = []
    finished: list[str] = []

    async def quick() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            finished.append("cancelled")
            raise

    async def main() -> int:
        asyncio.get_running_loop().create_task(quick())
        await asyncio.to_thread(time.sleep, 0.01)
        await asyncio.sleep(0)
        return 7

    assert run_leaving(main(), reported.append) == 7
    assert reported == []
    assert finished == ["cancelled"]


def test_other_threads_started_during_the_run_are_named_not_those_from_before() -> None:
    release = threading.Event()
    earlier = threading.Thread(target=release.wait, args=(60,), name="from-before")
    earlier.start()
    reported: list[Leftovers] = []

    async def stubborn() -> None:
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(60)

    async def main() -> None:
        asyncio.get_running_loop().create_task(stubborn())
        threading.Thread(target=release.wait, args=(60,), name="send-own").start()
        threading.Thread(target=release.wait, args=(60,), name="send-daemon", daemon=True).start()
        await asyncio.sleep(0.05)

    try:
        run_leaving(main(), reported.append)
    finally:
        release.set()
        earlier.join()
    assert reported == [Leftovers(tasks=1, threads=0, other_threads=("send-own",))]
