"""A Runtime's life: it runs once, a shutdown before its start is final, and its signal handlers are temporary.

Real runtimes on a real SQLite file; the signal handling runs in a process of its own
(tests/workers/signal_worker.py), since it sends itself signals.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import pytest

from asynccoord import (
    CoordError,
    NodeConfig,
    Runtime,
    RuntimeStateError,
    SQLiteStore,
    StoreClosedError,
    Task,
    TaskStatus,
)

QUEUE = "q"
CONFIG = NodeConfig(queue=QUEUE, idle_min_s=0.01, idle_max_s=0.05)
WORKERS = Path(__file__).resolve().parent / "workers"


def recorder() -> tuple[list[int], Any]:
    sent: list[int] = []

    async def send(task: Task) -> None:
        sent.append(task.id)

    return sent, send


async def test_a_shutdown_before_start_makes_the_start_raise_instead_of_hanging(db_path: Path) -> None:
    sent, send = recorder()
    async with SQLiteStore(db_path) as store:
        runtime = Runtime(store, send=send, nodes=1, config=CONFIG)
        await runtime.shutdown()  # a signal handler that ran before the start, say
        entered = False

        async def run() -> None:
            nonlocal entered
            async with runtime:
                entered = True
                await store.enqueue(QUEUE, 1)
                await runtime.wait_until_drained(timeout_s=0.5)

        async with asyncio.timeout(3.0):  # it used to run without nodes, then hang on leaving
            with pytest.raises(RuntimeStateError, match=r"shutdown\(\) was called before it ever started") as caught:
                await run()
            with pytest.raises(RuntimeStateError, match="runs once"):
                await runtime.start()
            with pytest.raises(RuntimeStateError, match=r"shutdown\(\) was called before it started"):
                await runtime.wait_for_signal()
            await runtime.shutdown()  # still idempotent
        assert not entered
        assert isinstance(caught.value, CoordError)
        assert isinstance(caught.value, RuntimeError)
        assert repr(runtime).startswith("<Runtime stopped ")
        assert await store.members() == []
    assert sent == []


async def test_a_runtime_that_ran_refuses_to_start_again(db_path: Path) -> None:
    sent, send = recorder()
    async with SQLiteStore(db_path) as store:
        runtime = Runtime(store, send=send, nodes=2, config=CONFIG)
        stages = [repr(runtime)]
        first = (await store.enqueue(QUEUE, 1)).task.id
        async with runtime:
            await runtime.start()  # while it runs: starts nothing more
            stages.append(repr(runtime))
            assert await runtime.wait_until_drained(timeout_s=5.0, poll_s=0.01)
        stages.append(repr(runtime))
        second = (await store.enqueue(QUEUE, 2)).task.id
        entered = False

        async def run_again() -> None:
            nonlocal entered
            async with runtime:  # it used to return at once, with no node running
                entered = True

        with pytest.raises(RuntimeStateError, match="already ran and was shut down"):
            await run_again()
        assert not entered
        with pytest.raises(RuntimeStateError, match="create a new Runtime"):
            await runtime.start()
        assert await runtime.wait_for_signal() == 0  # stopped already: nothing to wait for
        assert sent == [first]
        assert (await store.get(second)).status is TaskStatus.PENDING
        assert await store.members() == []
        # a new Runtime with the same node ids takes over
        again = Runtime(store, send=send, node_ids=[node.node_id for node in runtime.nodes], config=CONFIG)
        async with again:
            assert await again.wait_until_drained(timeout_s=5.0, poll_s=0.01)
    assert sent == [first, second]
    assert [stage.split()[1] for stage in stages] == ["new", "running", "stopped"]


async def test_two_starts_at_once_start_one_runner_and_both_return_once_it_runs(db_path: Path) -> None:
    _sent, send = recorder()
    async with SQLiteStore(db_path) as store:
        runtime = Runtime(store, send=send, nodes=2, config=CONFIG)
        before = asyncio.all_tasks()
        first = asyncio.create_task(runtime.start())
        await asyncio.sleep(0)  # the first start is under way
        await runtime.start()
        stage = repr(runtime)  # the second start returned once the first had
        await first
        runners = [t for t in asyncio.all_tasks() - before if t.get_name() == "asynccoord-runtime"]
        assert len(runners) == 1
        assert len(await store.members()) == 2
        assert stage.startswith("<Runtime running "), stage
        await runtime.shutdown()
        assert await store.members() == []


async def test_a_failed_start_is_final_and_says_why(db_path: Path) -> None:
    _sent, send = recorder()
    store = SQLiteStore(db_path)
    await store.open()
    await store.close()
    runtime = Runtime(store, send=send, nodes=1, config=CONFIG)
    with pytest.raises(StoreClosedError):
        await runtime.start()
    with pytest.raises(RuntimeStateError, match=r"its start failed \(StoreClosedError") as caught:
        await runtime.start()  # it used to return at once, with no node running
    assert isinstance(caught.value.__cause__, StoreClosedError)
    await runtime.shutdown()  # returns: nothing runs


async def test_wait_for_signal_before_start_raises_a_state_error(db_path: Path) -> None:
    _sent, send = recorder()
    async with SQLiteStore(db_path) as store:
        runtime = Runtime(store, send=send, nodes=1, config=CONFIG)
        with pytest.raises(RuntimeStateError, match="it is not started"):
            await runtime.wait_for_signal()


@pytest.mark.multiprocess
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_wait_for_signal_puts_back_the_applications_signal_handlers(python: Any, db_path: Path, loop: str) -> None:
    if loop == "uvloop":
        pytest.importorskip("uvloop")
    proc = python.run([str(WORKERS / "signal_worker.py"), str(db_path), loop], timeout_s=30.0, check=False)
    # it used to die of the SIGTERM sent after the wait (the app's handler was gone)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["loop"] == ("Loop" if loop == "uvloop" else "_UnixSelectorEventLoop")
    # SIGTERM has a handler of the event loop: it stays the application's, during the wait too
    assert "signal_left signal=SIGTERM" in proc.stderr
    assert result["returned"] == signal.SIGUSR1  # a signal.signal handler: taken for the wait
    assert result["during"] == {"SIGTERM": 1}
    assert result["restored"] == {"SIGUSR1": True, "SIGINT": True}  # SIGINT: asyncio.run's handler
    assert result["after"] == {"SIGTERM": 2, "SIGUSR1": 1}
