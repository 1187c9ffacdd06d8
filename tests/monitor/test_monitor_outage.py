"""``store_unreachable`` when the monitor's calls to the store hang rather than fail.

A store call waits for the store up to its own timeout (``busy_timeout_s``, 30 s by default
on SQLite), longer than ``store_outage_s``: the notice must not wait for that call to fail.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest

from asynccoord import Alert, AlertScope, AlertState, MemoryStore, Monitor, SQLiteStore
from asynccoord.contract.monitor import MetricsFlush

OUTAGE_S = 1.5


async def test_every_process_raises_store_unreachable_while_sqlite_writes_hang_on_a_held_lock(tmp_path: Path) -> None:
    """Another connection holds the SQLite file's write lock for ``store_outage_s`` + 3 s.

    Two monitors, each on a store of its own (as two processes of one cluster), with the
    default ``busy_timeout_s`` of 30 s: their writes (the flushes, the leader lease's
    renewals) wait on the lock without failing. Each raises ``store_unreachable`` about
    ``store_outage_s`` after its call began, while the lock is still held; once it is
    released the waiting calls go through (none was cancelled nor failed) and each
    notice resolves.
    """
    path = tmp_path / "frozen.db"
    received: dict[str, list[tuple[float, Alert]]] = {"proc-a": [], "proc-b": []}
    async with SQLiteStore(path) as store_a, SQLiteStore(path) as store_b:
        monitors = [
            Monitor(
                store,
                process_id=pid,
                flush_interval_s=0.05,
                evaluate_interval_s=0.05,
                store_outage_s=OUTAGE_S,
            )
            for store, pid in ((store_a, "proc-a"), (store_b, "proc-b"))
        ]
        for monitor in monitors:
            monitor.subscribe(lambda alert, pid=monitor.process_id: received[pid].append((time.monotonic(), alert)))
        async with monitors[0], monitors[1]:
            await asyncio.sleep(0.5)  # both write and lead or follow
            assert all(m.statistics().evaluations > 0 for m in monitors)
            holder = sqlite3.connect(path, isolation_level=None)
            holder.execute("BEGIN IMMEDIATE")  # the write lock, as a process stopped mid-write holds it
            locked_at = time.monotonic()
            await asyncio.sleep(OUTAGE_S + 3.0)
            fired = {pid: [(at, a) for at, a in notices if a.firing] for pid, notices in received.items()}
            holder.execute("ROLLBACK")
            holder.close()
            released_at = time.monotonic()
            deadline = released_at + 10.0
            while time.monotonic() < deadline and not all(len(n) == 2 for n in received.values()):
                await asyncio.sleep(0.05)
            stats = [m.statistics() for m in monitors]
    for pid, notices in fired.items():
        ((at, alert),) = notices  # one firing notice, raised while the lock was held
        assert (alert.rule, alert.scope, alert.scope_key) == ("store_unreachable", AlertScope.PROCESS, pid)
        assert OUTAGE_S - 0.2 <= at - locked_at <= OUTAGE_S + 2.0, (pid, at - locked_at)
        assert alert.value >= OUTAGE_S
        assert alert.count >= 1  # the call still unanswered
    for pid, notices in received.items():
        assert [a.state for _, a in notices] == [AlertState.FIRING, AlertState.RESOLVED], pid
        assert notices[1][0] >= released_at
        assert notices[1][1].fired_at == notices[0][1].fired_at
    for stat in stats:
        assert (stat.flush_failures, stat.evaluate_failures) == (0, 0)  # the stuck calls went through
        assert (stat.alerts_fired, stat.alerts_resolved) == (1, 1)


async def test_a_hanging_flush_raises_store_unreachable_and_is_left_to_finish() -> None:
    """A flush whose write never answers: the notice comes from the timer, the write runs on.

    The monitor is driven by hand, so nothing but the watch's timer can raise the notice
    while the one flush hangs; the write finishes once let through, the flush returns its
    store clock, and the notice resolves.
    """
    await hanging_flush()


def test_a_hanging_flush_raises_store_unreachable_on_uvloop() -> None:
    """The same on uvloop, whose millisecond timers may go off a little early: the hung call still counts."""
    uvloop = pytest.importorskip("uvloop")
    uvloop.run(hanging_flush())


async def hanging_flush() -> None:

    class Stuck(MemoryStore):
        def __init__(self) -> None:
            super().__init__()
            self.gate = asyncio.Event()
            self.writes_done = 0

        async def flush_metrics(self, flush: MetricsFlush) -> float:
            await self.gate.wait()
            at = await super().flush_metrics(flush)
            self.writes_done += 1
            return at

    async with (
        Stuck() as store,
        Monitor(store, rules=[], background=False, process_id="proc-h", store_outage_s=0.3) as monitor,
    ):
        stream = monitor.alerts()
        started = time.monotonic()
        flush = asyncio.ensure_future(monitor.flush(force=True))
        while not monitor.active_alerts() and time.monotonic() - started < 5.0:
            await asyncio.sleep(0.01)
        fired_after_s = time.monotonic() - started
        (alert,) = monitor.active_alerts()
        assert (alert.rule, alert.state, alert.scope_key, alert.count) == (
            "store_unreachable",
            AlertState.FIRING,
            "proc-h",
            1,
        )
        assert 0.3 <= fired_after_s < 3.0
        assert not flush.done()  # not cancelled: still waiting for the store
        store.gate.set()
        assert isinstance(await flush, float)
        assert store.writes_done == 1
        assert monitor.active_alerts() == []
        stats = monitor.statistics()
    notices = [a async for a in stream]
    assert [(a.rule, a.state) for a in notices] == [
        ("store_unreachable", AlertState.FIRING),
        ("store_unreachable", AlertState.RESOLVED),
    ]
    assert (stats.flushes, stats.flush_failures, stats.alerts_fired, stats.alerts_resolved) == (1, 0, 1, 1)


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_a_call_answered_while_the_loop_was_blocked_raises_no_store_unreachable(
    backend: str, tmp_path: Path
) -> None:
    """The event loop is blocked past ``store_outage_s`` (a CPU-bound step of another task)
    while a flush is in flight, at several points of the flush: the store answers in
    milliseconds once it has the write, but the answer (or the write itself) cannot go on
    until the loop runs again, when the watch's timer is long due. The timer must not take
    that call for a hung one (no firing and resolved notice pair)."""
    store: MemoryStore | SQLiteStore = MemoryStore() if backend == "memory" else SQLiteStore(tmp_path / "s.db")
    received: list[Alert] = []
    async with (
        store,
        Monitor(store, rules=[], background=False, process_id="proc-s", store_outage_s=0.3) as monitor,
    ):
        monitor.subscribe(received.append)
        await monitor.flush(force=True)
        for turns in range(1, 5):
            flush = asyncio.ensure_future(monitor.flush(force=True))
            for _ in range(turns):  # the flush's write on its way to the store, or answered
                await asyncio.sleep(0)
            time.sleep(0.45)  # the loop is blocked for 1.5 store_outage_s; the store is not
            assert isinstance(await flush, float)
        await asyncio.sleep(0.05)
        stats = monitor.statistics()
    assert received == []
    assert (stats.flushes, stats.flush_failures, stats.alerts_fired, stats.alerts_resolved) == (5, 0, 0, 0)


async def test_a_long_write_of_this_process_raises_no_store_unreachable(tmp_path: Path) -> None:
    """This process's own write transaction holds SQLite's write lock for 4 ``store_outage_s``
    (a large ``enqueue_many`` takes as long: 700,000 tasks, 20 s): the monitor's flush and
    reads queue behind it on the store's one connection, unanswered all that time, yet the
    store is reachable and at work. No notice; a lock held by another connection still
    raises one (the test above)."""
    received: list[Alert] = []
    async with (
        SQLiteStore(tmp_path / "busy.db") as store,
        Monitor(store, process_id="proc-w", flush_interval_s=0.05, evaluate_interval_s=0.05, store_outage_s=0.5) as m,
    ):
        m.subscribe(received.append)
        await asyncio.sleep(0.3)  # flushes and evaluations succeed

        def long_write(db: sqlite3.Connection, now: float) -> None:
            db.execute("CREATE TABLE IF NOT EXISTS busy (x)")
            time.sleep(2.0)  # the statements of a large batch, on the connection's thread

        writer = store._writer
        assert writer is not None
        await writer.submit(long_write)
        evaluations = m.statistics().evaluations
        await asyncio.sleep(0.3)
        stats = m.statistics()
    assert received == []
    assert stats.evaluations > evaluations  # the monitor's calls went on once the write committed
    assert (stats.flush_failures, stats.evaluate_failures, stats.alerts_fired) == (0, 0, 0)
