"""A process frozen past its TTLs while it holds a lock raises one alert: ``lost_nodes``.

A real OS process (``tests/workers/freeze_worker.py``) holds a task's lease and its lock in a
send; the test freezes it with SIGSTOP. This process watches the membership (its node
counts the frozen one's as lost) and runs the leading monitor with the default rules (their
windows shortened to keep the test short). The frozen process's node is lost, then, woken
with SIGCONT, it finds its lock and lease lapsed (``lock_lost``, ``lease_lost``): consequences
of one incident, which raises one firing notice and one resolved notice in the whole cluster.

Waits are for events (a notice, a counter in the store), never fixed sleeps, with generous
deadlines for a loaded machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import queue
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import WORKERS_DIR, PythonRunner

from asynccoord import Alert, Membership, Monitor, SQLiteStore
from asynccoord import events as ev
from asynccoord.contract.monitor import open_alerts
from asynccoord.monitor.rules import DEFAULT_RULES

pytestmark = pytest.mark.multiprocess

WORKER = str(WORKERS_DIR / "freeze_worker.py")
TTL_S = 1.0
"""The frozen process's heartbeat and lock TTL (its task lease is twice that)."""
WINDOW_S = 8.0
"""The rules' windows, at most: an incident resolves this long after its last event."""
DEADLINE_S = 60.0
RULES = tuple(dataclasses.replace(rule, window_s=min(rule.window_s, WINDOW_S)) for rule in DEFAULT_RULES)


class Lines:
    """A worker's stdout lines, read by a thread."""

    def __init__(self, proc: Any) -> None:
        self.proc = proc
        self._lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        self.stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: self.stderr.extend(proc.stderr), daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(json.loads(line))

    def events(self, name: str) -> list[dict[str, Any]]:
        while not self._lines.empty():
            self.seen.append(self._lines.get_nowait())
        return [m for m in self.seen if m["event"] == name]


async def until(predicate: Callable[[], Awaitable[bool]], what: str, lines: Lines) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not await predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}; worker stderr:\n{''.join(lines.stderr)}"
        await asyncio.sleep(0.05)


async def test_a_process_frozen_past_its_ttls_raises_one_alert(python: PythonRunner, tmp_path: Path) -> None:
    path = tmp_path / "coord.db"
    notices: list[Alert] = []
    async with (
        SQLiteStore(path) as store,
        Monitor(store, rules=RULES, flush_interval_s=0.2, process_id="watcher") as monitor,
        Membership(store, ttl_s=TTL_S) as membership,
    ):
        monitor.subscribe(notices.append)
        membership.join("watcher-node")
        worker = Lines(python.spawn([WORKER, str(path), "--queue", "outbox", "--ttl-s", str(TTL_S)]))
        try:

            async def fired(rule: str, state: str) -> bool:
                return any((a.rule, a.state.value) == (rule, state) for a in notices)

            async def counted(name: str) -> bool:
                view = await store.read_metrics()
                return sum(n for (_, scope, event), n in view.totals.items() if event == name and scope == "") > 0

            async def sending() -> bool:
                return bool(worker.events("sending"))

            async def lock_lapsed() -> bool:
                return await store.list_locks("account:a1") == []

            async def all_closed() -> bool:
                return open_alerts((await store.read_metrics()).alerts) == ()

            await until(lambda: _true(worker.events("ready")), "the worker's runtime", worker)
            await store.enqueue("outbox", {"account": "a1"})
            await until(sending, "the send holding the lock", worker)
            worker.proc.send_signal(signal.SIGSTOP)  # frozen in its send, past every TTL
            try:
                await until(lambda: fired("lost_nodes", "firing"), "lost_nodes", worker)
                await until(lock_lapsed, "the frozen holder's lock to lapse", worker)
            finally:
                worker.proc.send_signal(signal.SIGCONT)
            await until(lambda: counted(ev.LOCK_LOST), "the woken process's lost lock, flushed", worker)
            await until(lambda: fired("lost_nodes", "resolved"), "lost_nodes resolved", worker)
            await until(all_closed, "every incident closed, muted ones too", worker)
            assert [(a.rule, a.state.value) for a in notices] == [("lost_nodes", "firing"), ("lost_nodes", "resolved")]
        finally:
            with contextlib.suppress(BrokenPipeError, OSError):
                assert worker.proc.stdin is not None
                worker.proc.stdin.write("stop\n")
                worker.proc.stdin.flush()
        assert await asyncio.to_thread(worker.proc.wait, DEADLINE_S) == 0, "".join(worker.stderr)
    (done,) = worker.events("done")
    assert done["events"].get(ev.LOCK_LOST, 0) >= 1  # the consequence was counted, and muted
    assert worker.events("alert") == []  # the frozen process's monitor published nothing either


async def _true(value: object) -> bool:
    return bool(value)
