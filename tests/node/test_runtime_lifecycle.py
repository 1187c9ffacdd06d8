"""A Runtime's life: it runs once, a shutdown before its start is final, and its signal handlers are temporary.

Real runtimes on a real SQLite file; the signal handling runs in a process of its own
(tests/workers/signal_worker.py), since it sends itself signals.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
from pathlib import Path
from typing import Any

import pytest
from support import TESTS

from asynccoord import (
    CoordError,
    InvalidArgumentError,
    InvalidTypeError,
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
WORKERS = TESTS / "workers"


def recorder() -> tuple[list[int], Any]:
    sent: list[int] = []

    async def send(task: Task) -> None:
        sent.append(task.id)

    return sent, send


async def runtime_on_a_closed_store(db_path: Path) -> Runtime:
    """A runtime whose start fails: its store was opened and closed again."""
    _sent, send = recorder()
    store = SQLiteStore(db_path)
    await store.open()
    await store.close()
    return Runtime(store, send=send, nodes=1, config=CONFIG)


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


async def test_a_shutdown_in_a_finally_before_the_start_ends_only_that_runtime(db_path: Path) -> None:
    """Cleanup code may shut a runtime down whatever happened: the store and the node ids stay usable."""
    sent, send = recorder()
    async with SQLiteStore(db_path) as store:
        task = (await store.enqueue(QUEUE, 1)).task.id
        runtime = Runtime(store, send=send, node_ids=["bot-a", "bot-b"], config=CONFIG)

        async def serve() -> None:
            try:
                raise ConnectionError("set-up failed")  # before `async with runtime`
            finally:
                await runtime.shutdown()

        with pytest.raises(ConnectionError, match="set-up failed"):
            await serve()
        assert await store.members() == []
        assert (await store.stats(QUEUE)).counts[TaskStatus.PENDING] == 1
        with pytest.raises(RuntimeStateError, match="create a new Runtime"):
            await runtime.start()
        again = Runtime(store, send=send, node_ids=["bot-a", "bot-b"], config=CONFIG)
        async with again:
            assert sorted(m.node_id for m in await store.members()) == ["bot-a", "bot-b"]
            assert await again.wait_until_drained(timeout_s=5.0, poll_s=0.01)
        assert await store.members() == []
    assert sent == [task]


async def test_waiting_until_drained_before_the_start_is_refused_not_timed_out(db_path: Path) -> None:
    """A forgotten ``async with``: nothing would drain the queue, so the wait says so at once."""
    sent, send = recorder()
    async with SQLiteStore(db_path) as store:
        await store.enqueue(QUEUE, 1)
        runtime = Runtime(store, send=send, nodes=1, config=CONFIG)
        async with asyncio.timeout(1.0):  # it used to wait out its whole timeout, then return False
            with pytest.raises(RuntimeStateError, match="cannot wait until drained: it is not started"):
                await runtime.wait_until_drained(timeout_s=30.0)
        await runtime.shutdown()
        with pytest.raises(RuntimeStateError, match=r"shutdown\(\) was called before it started"):
            await runtime.wait_until_drained(timeout_s=30.0)
        assert (await store.stats(QUEUE)).counts[TaskStatus.PENDING] == 1
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


async def test_a_failed_start_is_final_and_says_why(db_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    runtime = await runtime_on_a_closed_store(db_path)
    with pytest.raises(StoreClosedError):
        await runtime.start()
    assert [r.getMessage() for r in caplog.records] == []  # the error alone: no leave of nodes that never joined
    with pytest.raises(RuntimeStateError, match=r"its start failed \(StoreClosedError") as caught:
        await runtime.start()  # it used to return at once, with no node running
    assert isinstance(caught.value.__cause__, StoreClosedError)
    with pytest.raises(RuntimeStateError, match=r"its start failed"):
        await runtime.wait_for_signal()  # it returned 0, as if it had run and stopped
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


@pytest.mark.multiprocess
@pytest.mark.parametrize("mode", ["later", "same-turn"])
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_second_signal_ends_the_drain_and_hands_back_without_killing_the_process(
    python: Any, db_path: Path, loop: str, mode: str
) -> None:
    worker = [str(WORKERS / "signal_twice_worker.py"), str(db_path), loop, mode]
    proc = python.run(worker, timeout_s=60.0, check=False)
    # The second SIGTERM used to find SIGTERM's default back (killed mid-drain, tasks left
    # running); with uvloop, an earlier loop's dead stub made the wait ignore SIGTERM at all.
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["returned"] == signal.SIGTERM
    assert "signal_again signal=" in proc.stderr
    assert "signal_left" not in proc.stderr
    # The 30 s sends were cut and handed back at once, not drained for the 30 s shutdown_timeout_s.
    assert result["after_second_s"] < 5.0
    assert result["statuses"] == {"pending": 2}
    assert (result["members"], result["locks"]) == (0, 0)
    assert result["sigterm_default"] is True
    assert result["sigint_handled"] is True  # a dead stub of SIGINT left SIG_DFL: Ctrl-C killed, no cleanup


async def test_a_start_cancelled_midway_leaves_nothing_running(db_path: Path) -> None:
    sent, send = recorder()
    async with SQLiteStore(db_path) as store:
        for i in range(3):
            await store.enqueue(QUEUE, i, partition_key=f"k{i}")
        runtime = Runtime(store, send=send, nodes=2, config=CONFIG)

        async def host() -> None:
            async with runtime:
                await asyncio.sleep(3600)

        hosting = asyncio.create_task(host())
        await asyncio.sleep(0)  # the host is inside start(), awaiting the first heartbeat
        hosting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await hosting
        # It used to go on running with no owner (sending, and claiming later work).
        assert repr(runtime).startswith("<Runtime stopped "), repr(runtime)
        assert await store.members() == []
        late = (await store.enqueue(QUEUE, "late")).task.id
        await asyncio.sleep(0.3)
        assert late not in sent
        assert (await store.get(late)).status is TaskStatus.PENDING
        assert (await store.stats(QUEUE)).counts[TaskStatus.RUNNING] == 0
        with pytest.raises(RuntimeStateError, match="already ran and was shut down"):
            await runtime.start()


async def test_a_shutdown_cancelled_midway_hands_back_before_the_store_closes(db_path: Path) -> None:
    started = asyncio.Event()

    async def send(task: Task) -> None:
        started.set()
        await asyncio.sleep(30.0)

    async def host() -> None:
        async with SQLiteStore(db_path) as store:
            for i in range(4):
                await store.enqueue(QUEUE, i, partition_key=f"k{i}")
            async with Runtime(store, send=send, nodes=2, config=CONFIG, shutdown_timeout_s=30.0) as runtime:
                while sum(state.in_flight for state in runtime.states()) < 4:
                    await asyncio.sleep(0.01)
            # leaving: a graceful drain of up to 30 s, cancelled below

    hosting = asyncio.create_task(host())
    await started.wait()
    await asyncio.sleep(0.3)  # inside the drain
    hosting.cancel()
    async with asyncio.timeout(5.0):
        with pytest.raises(asyncio.CancelledError):
            await hosting
    # It used to return at once and close the store under the draining nodes: the tasks
    # stayed running (sent, never committed) until their leases ran out.
    async with SQLiteStore(db_path) as store:
        counts = (await store.stats(QUEUE)).counts
        assert counts[TaskStatus.PENDING] == 4
        assert counts[TaskStatus.RUNNING] == 0
        assert await store.members() == []
        assert await store.list_locks() == []


@pytest.mark.parametrize(
    ("signals", "error", "message"),
    [
        ((signal.SIGTERM, 12345), InvalidArgumentError, "signals holds 12345, not a signal number"),
        ((signal.SIGTERM, signal.SIGKILL), InvalidArgumentError, "signals holds SIGKILL, which cannot be handled"),
        ((signal.SIGTERM, True), InvalidTypeError, "signals must hold signal numbers"),
        ("SIGTERM", InvalidTypeError, "signals must be a sequence of signal numbers, got str"),
    ],
)
async def test_wait_for_signal_refuses_bad_signals_and_touches_no_handler(
    db_path: Path, signals: Any, error: type[Exception], message: str
) -> None:
    _sent, send = recorder()
    before = signal.getsignal(signal.SIGTERM)
    async with SQLiteStore(db_path) as store, Runtime(store, send=send, nodes=1, config=CONFIG) as runtime:
        with pytest.raises(error, match=message):
            await runtime.wait_for_signal(signals)
        assert signal.getsignal(signal.SIGTERM) is before  # SIGTERM was not taken and left behind
        assert repr(runtime).startswith("<Runtime running ")


async def _counts_drained(counts: dict[TaskStatus, int]) -> bool:
    return True


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"predicate": 5}, "predicate must be a plain function, got int 5"),
        ({"predicate": _counts_drained}, "predicate must be a plain function, got function"),
        ({"poll_s": True}, "poll_s must be a number, got bool True"),
        ({"timeout_s": "1"}, "timeout_s must be a number, got str '1'"),
    ],
)
async def test_wait_until_drained_checks_its_arguments_before_the_first_poll(
    db_path: Path, arguments: dict[str, Any], message: str
) -> None:
    """A predicate that is no plain function raised a bare TypeError at the first poll (an
    ``async def`` one would have returned True at once, its coroutine never awaited)."""
    _sent, send = recorder()
    async with SQLiteStore(db_path) as store, Runtime(store, send=send, nodes=1, config=CONFIG) as runtime:
        await store.enqueue(QUEUE, 1, delay_s=600.0)  # pending: never drained within the test
        with pytest.raises(InvalidTypeError, match=re.escape(message)):
            await runtime.wait_until_drained(**{"timeout_s": 1.0, **arguments})


async def test_wait_until_drained_calls_the_predicate_with_every_status_counted(db_path: Path) -> None:
    """The predicate sees the queue's counts per status, done tasks included (``stats``), and the
    wait ends at the first poll where it holds; tasks of another queue are not counted."""
    sent, send = recorder()
    seen: list[dict[TaskStatus, int]] = []

    def five_done(counts: dict[TaskStatus, int]) -> bool:
        seen.append(dict(counts))
        return counts[TaskStatus.DONE] >= 5

    async with SQLiteStore(db_path) as store:
        await store.enqueue("elsewhere", "not counted")
        async with Runtime(store, send=send, nodes=2, config=CONFIG) as runtime:
            for i in range(5):
                await store.enqueue(QUEUE, i)
            assert await runtime.wait_until_drained(timeout_s=10.0, poll_s=0.01, predicate=five_done)
            assert not await runtime.wait_until_drained(timeout_s=0.05, poll_s=0.01, predicate=lambda _c: False)
    assert len(sent) == 5
    assert all(list(counts) == list(TaskStatus) for counts in seen)
    assert all(sum(counts.values()) == 5 for counts in seen)  # the five tasks of QUEUE, whatever their status
    assert seen[-1] == {TaskStatus.PENDING: 0, TaskStatus.RUNNING: 0, TaskStatus.DONE: 5, TaskStatus.DEAD: 0}


@pytest.mark.multiprocess
def test_one_signal_stops_every_runtime_waiting_in_the_process(python: Any, db_path: Path) -> None:
    proc = python.run([str(WORKERS / "two_runtimes_signal_worker.py"), str(db_path)], timeout_s=30.0, check=False)
    # The second runtime used to leave SIGTERM to the first one's handler and wait on.
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["returned"] == [signal.SIGTERM, signal.SIGTERM]
    assert result["stages"] == ["stopped", "stopped"]
    assert result["sigterm_default"] is True
    assert "signal_left" not in proc.stderr


async def test_a_start_joined_by_a_second_caller_and_then_cancelled_fails_both(db_path: Path) -> None:
    _sent, send = recorder()
    async with SQLiteStore(db_path) as store:
        runtime = Runtime(store, send=send, nodes=1, config=CONFIG)
        first = asyncio.create_task(runtime.start())
        await asyncio.sleep(0)
        second = asyncio.create_task(runtime.start())  # joins the first start
        await asyncio.sleep(0)
        first.cancel()
        results = await asyncio.gather(first, second, return_exceptions=True)
        assert isinstance(results[0], asyncio.CancelledError)
        # It used to return as if started, on a runtime that was stopping.
        assert isinstance(results[1], RuntimeStateError), results[1]
        assert repr(runtime).startswith("<Runtime stopped ")
        assert await store.members() == []


async def test_wait_for_signal_called_while_the_start_fails_raises_a_state_error(db_path: Path) -> None:
    runtime = await runtime_on_a_closed_store(db_path)
    starting = asyncio.create_task(runtime.start())
    await asyncio.sleep(0)
    waiting = asyncio.create_task(runtime.wait_for_signal())
    with pytest.raises(StoreClosedError):
        await starting
    with pytest.raises(RuntimeStateError, match="its start failed"):  # it returned 0: shut down cleanly
        await waiting
