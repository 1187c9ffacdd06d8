"""Peers: asynccoord beside the SQLite-backed queues a user would otherwise pick, in one run.

Two parts, each on fresh files in one temporary folder:

1. **Drain rate.** The same no-op drain of ``--tasks`` tasks with each consumer count of
   ``--consumers``, in one process per drain:

   * ``asynccoord``: ``SQLiteStore``, N nodes (asyncio tasks) sharing one store, each
     claiming ``--batch`` tasks -> no-op -> ``complete_many``; driven by
     ``queue_throughput.drain`` (imported, not copied).
   * ``huey``: ``SqliteHuey`` and huey's own ``Consumer`` with N thread workers (what
     ``huey_consumer -k thread -w N`` runs); the task is a no-op function.
   * ``litequeue``: ``LiteQueue``; N threads, each with its own ``LiteQueue`` (its own
     connection) on the file, looping ``pop()`` -> no-op -> ``done()``.
   * ``persist-queue``: ``SQLiteAckQueue(multithreading=True)``, one queue object shared
     by N threads (its documented multi-thread mode), looping ``get()`` -> ``ack()``.

   The peers have no batch claim: they take one task per transaction, as their APIs do.
   A drain still running after ``--max-drain-s`` is stopped and its rate is the rate over
   the tasks it drained (``complete`` false): litequeue sorts its whole ready backlog on
   every ``pop()`` and persist-queue walks past every acked row on every ``get()``, so
   both slow down with the backlog.

2. **Kill test.** ``--kill-consumers`` consumer OS processes drain ``--kill-tasks``
   tasks; every consumer appends each task it processes to a file of its own, then
   acknowledges it. One consumer (the victim) is killed with SIGKILL after it has
   processed ``--kill-after`` tasks, with its next task taken but not acknowledged:
   ``before-work`` (the task not yet processed) and/or ``after-work`` (processed, not
   acknowledged), per ``--kill-points``; ``none`` adds a control run (nobody killed, no
   restart) that shows what the consumers do alone. The survivors drain what they can get; a
   restarted consumer (what a supervisor would start) comes up ``--visibility-s`` after
   the kill and drains the rest, using each library's recovery: asynccoord's lease
   (``lease_s = --visibility-s``) expires and the task is claimable again; litequeue's
   ``list_locked(threshold_seconds)`` + ``retry()``; persist-queue's ``auto_resume`` (on
   opening, every unacknowledged task is made ready again); huey has no acknowledgement
   (``dequeue()`` deletes the row, as its worker does before executing), so nothing to
   recover. Duplicates (a task processed more than once), losses (never processed and
   not in the queue any more) and stranded tasks (never processed, still in the queue)
   are counted from the files and the queue. "database is locked" and any other error
   of a consumer are caught, counted, and the call retried.

All queues run in WAL mode with ``synchronous=NORMAL`` (asynccoord's and litequeue's
setting; set on huey's and persist-queue's connections, whose default is FULL, an fsync
per commit) unless ``--peer-sync default`` keeps each library's own setting.

Usage::

    python benchmarks/peers.py                        # both parts, tables (2 to 3 min)
    python benchmarks/peers.py --json                 # one JSON object
    python benchmarks/peers.py --tasks 5000 --consumers 1 4 --kill-tasks 0
    python benchmarks/peers.py --tasks 0 --queues asynccoord persist-queue --kill-points none after-work

Peers come with the ``bench`` extra (``pip install -e '.[bench]'``); a peer not installed
is skipped with a note. Keys of the JSON object are documented in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import has_uvloop, run
from queue_throughput import QUEUE, drain, fill

from asynccoord import CoordError, NewTask, SQLiteStore, StoreBusyError, TaskStatus

QUEUES = ("asynccoord", "huey", "litequeue", "persist-queue")
# queue -> (module to import, distribution name for pip and the version)
PEER_PACKAGES = {
    "huey": ("huey", "huey"),
    "litequeue": ("litequeue", "litequeue"),
    "persist-queue": ("persistqueue", "persist-queue"),
}
CONSUMER_KIND = {
    "asynccoord": "asyncio tasks (nodes) sharing one SQLiteStore, claim batch -> complete_many",
    "huey": "huey Consumer thread workers (huey_consumer -k thread)",
    "litequeue": "threads, one LiteQueue (connection) each, pop -> done",
    "persist-queue": "threads sharing one SQLiteAckQueue(multithreading=True), get -> ack",
}
RECOVERY = {
    "asynccoord": "lease of --visibility-s expires; the restarted consumer claims it",
    "huey": "none: dequeue() deletes the task (no acknowledgement)",
    "litequeue": "restarted consumer: list_locked(threshold_seconds=--visibility-s) + retry()",
    "persist-queue": "restarted consumer: SQLiteAckQueue(auto_resume=True) makes every unacked task ready",
}
KILL_POINTS = ("before-work", "after-work", "none")  # none: the control run, nobody killed
MAX_RETRIES = 1000  # consecutive failures of one call before a consumer gives up


# --- queue adapters: one small interface over each library -------------------------


class Adapter:
    """One consumer's (or the filler's) handle on a queue.

    ``get`` returns a list of ``(n, handle)`` (empty when nothing is ready), where ``n``
    is the task's number, 0 .. tasks - 1; ``ack`` acknowledges the handles and returns
    how many the queue refused (asynccoord's lease-checked commit; 0 elsewhere).
    """

    name = ""

    def fill(self, tasks: int) -> dict[int, Any]:
        raise NotImplementedError

    def get(self) -> list[tuple[int, Any]]:
        raise NotImplementedError

    def ack(self, handles: list[Any]) -> int:
        raise NotImplementedError

    def recover(self, visibility_s: float) -> None:
        """What a restarted consumer does first (nothing, unless the library needs it)."""

    def unfinished(self, numbers: Iterable[int], ids: dict[int, Any]) -> set[int]:
        """Of ``numbers``, those still in the queue and not done (retrievable)."""
        raise NotImplementedError

    def synchronous(self) -> int:
        raise NotImplementedError

    def close(self) -> None:
        pass


class AsynccoordAdapter(Adapter):
    """asynccoord's SQLiteStore, driven from synchronous code through one event loop."""

    name = "asynccoord"

    def __init__(self, path: str, *, batch: int = 1, lease_s: float = 2.0, node_id: str = "filler") -> None:
        self.runner = asyncio.Runner()
        self.store = SQLiteStore(path)
        self.runner.run(self.store.open())
        self.batch, self.lease_s, self.node_id = batch, lease_s, node_id

    def fill(self, tasks: int) -> dict[int, Any]:
        ids: dict[int, Any] = {}
        for first in range(0, tasks, 500):
            chunk = [NewTask(queue=QUEUE, payload={"n": n}) for n in range(first, min(tasks, first + 500))]
            for result in self.runner.run(self.store.enqueue_many(chunk)):
                ids[result.task.payload["n"]] = result.task.id
        return ids

    def get(self) -> list[tuple[int, Any]]:
        tasks = self.runner.run(self.store.claim(QUEUE, node_id=self.node_id, limit=self.batch, lease_s=self.lease_s))
        return [(t.payload["n"], t) for t in tasks]

    def ack(self, handles: list[Any]) -> int:
        outcomes = self.runner.run(self.store.complete_many(handles))
        return sum(1 for o in outcomes if isinstance(o, CoordError))

    def unfinished(self, numbers: Iterable[int], ids: dict[int, Any]) -> set[int]:
        left = set()
        for n in numbers:
            task = self.runner.run(self.store.get(ids[n]))
            if task.status in (TaskStatus.PENDING, TaskStatus.RUNNING):
                left.add(n)
        return left

    def synchronous(self) -> int:
        return 2 if self.store.config.synchronous_full else 1

    def close(self) -> None:
        self.runner.run(self.store.close())
        self.runner.close()


def _noop(n: int) -> None:
    return None


class HueyAdapter(Adapter):
    """huey's SqliteHuey; ``get`` is what huey's worker does first: ``huey.dequeue()``."""

    name = "huey"

    def __init__(self, path: str, *, sync: str = "normal", fn: Callable[[int], None] = _noop) -> None:
        import huey

        self.huey = huey.SqliteHuey("bench", filename=path, results=False)
        self.task = self.huey.task(name="noop")(fn)
        if sync == "normal":
            self.huey.storage.conn.execute("PRAGMA synchronous = NORMAL")

    def fill(self, tasks: int) -> dict[int, Any]:
        for n in range(tasks):
            self.task(n)
        return {}

    def get(self) -> list[tuple[int, Any]]:
        task = self.huey.dequeue()
        return [] if task is None else [(task.args[0], task)]

    def ack(self, handles: list[Any]) -> int:
        return 0  # nothing to acknowledge: dequeue() already deleted the task

    def unfinished(self, numbers: Iterable[int], ids: dict[int, Any]) -> set[int]:
        pending = {t.args[0] for t in self.huey.pending()}
        return {n for n in numbers if n in pending}

    def synchronous(self) -> int:
        return int(self.huey.storage.conn.execute("PRAGMA synchronous").fetchone()[0])

    def close(self) -> None:
        self.huey.storage.close()


class LiteQueueAdapter(Adapter):
    """litequeue's LiteQueue (its own connection per adapter): ``pop()`` then ``done()``."""

    name = "litequeue"

    def __init__(self, path: str, *, sync: str = "normal") -> None:
        import litequeue

        self.q = litequeue.LiteQueue(path)  # sets synchronous = NORMAL itself

    def fill(self, tasks: int) -> dict[int, Any]:
        return {n: self.q.put(str(n)).message_id for n in range(tasks)}

    def get(self) -> list[tuple[int, Any]]:
        message = self.q.pop()
        return [] if message is None else [(int(message.data), message.message_id)]

    def ack(self, handles: list[Any]) -> int:
        for message_id in handles:
            self.q.done(message_id)
        return 0

    def recover(self, visibility_s: float) -> None:
        for message in list(self.q.list_locked(threshold_seconds=visibility_s)):
            self.q.retry(message.message_id)

    def unfinished(self, numbers: Iterable[int], ids: dict[int, Any]) -> set[int]:
        import litequeue

        open_states = (litequeue.MessageStatus.READY, litequeue.MessageStatus.LOCKED)
        left = set()
        for n in numbers:
            message = self.q.get(ids[n])
            if message is not None and message.status in open_states:
                left.add(n)
        return left

    def synchronous(self) -> int:
        return int(self.q.conn.execute("PRAGMA synchronous").fetchone()[0])

    def close(self) -> None:
        self.q.close()


class PersistQueueAdapter(Adapter):
    """persist-queue's SQLiteAckQueue (a folder holding ``data.db``): ``get()`` then ``ack()``."""

    name = "persist-queue"

    def __init__(self, path: str, *, sync: str = "normal", auto_resume: bool = True) -> None:
        import persistqueue

        self.empty = persistqueue.Empty
        self.q = persistqueue.SQLiteAckQueue(path, multithreading=True, auto_resume=auto_resume)
        if sync == "normal":  # the library offers no setting: its two connections, as it opened them
            for conn in {id(c): c for c in (self.q._getter, self.q._putter)}.values():
                conn.execute("PRAGMA synchronous = NORMAL")

    def fill(self, tasks: int) -> dict[int, Any]:
        for n in range(tasks):
            self.q.put(n)
        return {}

    def get(self) -> list[tuple[int, Any]]:
        try:
            item = self.q.get(block=False, raw=True)
        except self.empty:
            return []
        return [(item["data"], item["pqid"])]

    def ack(self, handles: list[Any]) -> int:
        for pqid in handles:
            self.q.ack(id=pqid)
        return 0

    def unfinished(self, numbers: Iterable[int], ids: dict[int, Any]) -> set[int]:
        acked = 5  # persistqueue.sqlackqueue.AckStatus.acked
        left = {row["data"] for row in self.q.queue() if int(row["status"]) < acked}
        return {n for n in numbers if n in left}

    def synchronous(self) -> int:
        return int(self.q._getter.execute("PRAGMA synchronous").fetchone()[0])

    def close(self) -> None:
        self.q.close()


def queue_path(folder: str, queue: str) -> str:
    """A fresh file (a fresh folder for persist-queue, which names its file itself)."""
    path = os.path.join(folder, f"{queue}-{secrets.token_hex(4)}")
    return path if queue == "persist-queue" else path + ".db"


def open_adapter(queue: str, path: str, args: argparse.Namespace, **kwargs: Any) -> Adapter:
    if queue == "asynccoord":
        return AsynccoordAdapter(path, batch=args.kill_batch, lease_s=args.visibility_s, **kwargs)
    if queue == "huey":
        return HueyAdapter(path, sync=args.peer_sync)
    if queue == "litequeue":
        return LiteQueueAdapter(path, sync=args.peer_sync)
    return PersistQueueAdapter(path, sync=args.peer_sync, **kwargs)


# --- one consumer loop, shared by the drains and the kill test ---------------------


@dataclass(slots=True)
class Tally:
    """What one consumer did: tasks processed and errors caught (then retried)."""

    processed: int = 0
    locked_errors: int = 0
    other_errors: int = 0
    refused_acks: int = 0
    gave_up: int = 0
    errors: Counter[str] = field(default_factory=Counter)

    def add(self, other: Tally) -> None:
        self.processed += other.processed
        self.locked_errors += other.locked_errors
        self.other_errors += other.other_errors
        self.refused_acks += other.refused_acks
        self.gave_up += other.gave_up
        self.errors.update(other.errors)

    def as_dict(self) -> dict[str, Any]:
        return {
            "processed": self.processed,
            "locked_errors": self.locked_errors,
            "other_errors": self.other_errors,
            "refused_acks": self.refused_acks,
            "gave_up": self.gave_up,
            "errors": dict(self.errors.most_common(5)),
        }


def _retrying(tally: Tally, call: Callable[[], Any]) -> tuple[bool, Any]:
    """Call ``call`` until it returns, counting each error; (False, None) after MAX_RETRIES."""
    for _ in range(MAX_RETRIES):
        try:
            return True, call()
        except (sqlite3.Error, StoreBusyError, CoordError) as exc:
            text = str(exc)
            if isinstance(exc, StoreBusyError) or "locked" in text or "busy" in text:
                tally.locked_errors += 1
            else:
                tally.other_errors += 1
            tally.errors[f"{type(exc).__name__}: {text[:80]}"] += 1
            time.sleep(0.005)
    tally.gave_up += 1
    return False, None


def consume(
    q: Adapter,
    *,
    record: Callable[[int], None] | None = None,
    victim_after: int | None = None,
    kill_point: str = "before-work",
    deadline: float | None = None,
) -> Tally:
    """Get -> process (record) -> acknowledge until the queue has nothing ready (or ``deadline``).

    A victim (``victim_after`` set) announces ``kill-me N`` on stdout when it holds its
    task number ``victim_after`` (0-based) and waits there to be killed: after recording
    it for ``after-work``, before for ``before-work``.
    """
    tally = Tally()
    while deadline is None or time.perf_counter() < deadline:
        ok, items = _retrying(tally, q.get)
        if not ok or not items:
            break
        for n, _ in items:
            if victim_after is not None and tally.processed == victim_after:
                if kill_point == "after-work" and record is not None:
                    record(n)
                print(f"kill-me {n}", flush=True)
                time.sleep(3600)  # SIGKILL lands here
            if record is not None:
                record(n)
            tally.processed += 1
        ok, refused = _retrying(tally, lambda items=items: q.ack([h for _, h in items]))
        tally.refused_acks += refused or 0
    return tally


# --- part 1: drain rates ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Drain:
    tasks_per_s: float
    drained: int
    seconds: float
    complete: bool
    enqueue_per_s: float
    synchronous: int
    tally: Tally

    def as_dict(self) -> dict[str, Any]:
        return {
            "tasks_per_s": self.tasks_per_s,
            "drained": self.drained,
            "seconds": self.seconds,
            "complete": self.complete,
            "enqueue_per_s": self.enqueue_per_s,
            "synchronous": self.synchronous,
            **self.tally.as_dict(),
        }


def drain_asynccoord(path: str, args: argparse.Namespace, consumers: int) -> Drain:
    enqueue_rate = run(lambda: fill(path, args.tasks))
    done, start, end = run(lambda: drain(path, consumers, args.batch))
    return Drain(done / (end - start), done, end - start, done == args.tasks, enqueue_rate, 1, Tally(processed=done))


def _fill_timed(q: Adapter, tasks: int) -> float:
    start = time.perf_counter()
    q.fill(tasks)
    return tasks / (time.perf_counter() - start)


def drain_threads(queue: str, path: str, args: argparse.Namespace, consumers: int) -> Drain:
    """litequeue (an adapter per thread) or persist-queue (one adapter shared by the threads)."""
    filler = open_adapter(queue, path, args)
    enqueue_rate = _fill_timed(filler, args.tasks)
    synchronous = filler.synchronous()
    shared = queue == "persist-queue"
    adapters = [filler] * consumers if shared else [open_adapter(queue, path, args) for _ in range(consumers)]
    tallies: list[Tally] = []
    lock = threading.Lock()
    deadline = time.perf_counter() + args.max_drain_s

    def worker(q: Adapter) -> None:
        t = consume(q, deadline=deadline)
        with lock:
            tallies.append(t)

    threads = [threading.Thread(target=worker, args=(q,)) for q in adapters]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - start
    total = Tally()
    for t in tallies:
        total.add(t)
    for q in {id(a): a for a in [filler, *adapters]}.values():
        q.close()
    return Drain(
        total.processed / seconds,
        total.processed,
        seconds,
        total.processed == args.tasks,
        enqueue_rate,
        synchronous,
        total,
    )


class _ErrorLogCounter(logging.Handler):
    """Counts what huey's consumer logs at ERROR (it catches and logs dequeue errors)."""

    def __init__(self, tally: Tally) -> None:
        super().__init__(logging.ERROR)
        self.tally = tally

    def emit(self, record: logging.LogRecord) -> None:
        text = str(record.exc_info[1]) if record.exc_info and record.exc_info[1] else record.getMessage()
        if "locked" in text or "busy" in text:
            self.tally.locked_errors += 1
        else:
            self.tally.other_errors += 1
        self.tally.errors[text[:80]] += 1


def drain_huey(path: str, args: argparse.Namespace, consumers: int) -> Drain:
    """huey's own Consumer with ``consumers`` thread workers, stopped when the last task ran."""
    from huey.consumer import Consumer

    done = threading.Event()
    lock = threading.Lock()
    count = [0, 0.0]

    def noop(n: int) -> None:
        with lock:
            count[0] += 1
            if count[0] == args.tasks:
                count[1] = time.perf_counter()
                done.set()

    q = HueyAdapter(path, sync=args.peer_sync, fn=noop)
    enqueue_rate = _fill_timed(q, args.tasks)
    synchronous = q.synchronous()
    tally = Tally()
    handler = _ErrorLogCounter(tally)
    log = logging.getLogger("huey")
    log.addHandler(handler)
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    consumer = Consumer(q.huey, workers=consumers, worker_type="thread", periodic=False, check_worker_health=False)
    start = time.perf_counter()
    consumer.start()
    finished = done.wait(args.max_drain_s)
    end = count[1] if finished else time.perf_counter()
    drained = int(count[0])
    consumer.stop(graceful=True)
    for s, h in saved.items():
        signal.signal(s, h)
    log.removeHandler(handler)
    q.close()
    tally.processed = drained
    return Drain(drained / (end - start), drained, end - start, finished, enqueue_rate, synchronous, tally)


def run_drains(args: argparse.Namespace, folder: str, queues: list[str], say: Callable[[str], None]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for queue in queues:
        out[queue] = {}
        for consumers in args.consumers:
            path = queue_path(folder, queue)
            if queue == "asynccoord":
                result = drain_asynccoord(path, args, consumers)
            elif queue == "huey":
                result = drain_huey(path, args, consumers)
            else:
                result = drain_threads(queue, path, args, consumers)
            out[queue][str(consumers)] = result.as_dict()
            note = "" if result.complete else f" (stopped after {args.max_drain_s:g} s: {result.drained} drained)"
            say(f"drain {queue:>13} x{consumers}: {result.tasks_per_s:>9,.0f} tasks/s{note}")
            _remove(path)
    return out


# --- part 2: kill test --------------------------------------------------------------


def spawn(argv: list[str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, __file__, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != "ready":
        proc.kill()
        raise RuntimeError(f"a consumer failed to start: {line!r}")
    return proc


def go(procs: Iterable[subprocess.Popen[str]]) -> None:
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()


def finish(proc: subprocess.Popen[str], timeout_s: float, read: str = "") -> tuple[int | None, Tally]:
    """Wait for a consumer; return its exit code (None if it had to be killed) and tally.

    ``read`` is output the caller already read from the consumer's stdout.
    """
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return None, Tally()
    tally = Tally()
    for line in (read + out).splitlines():
        if line.startswith("{"):
            data = json.loads(line)
            tally = Tally(
                processed=data["processed"],
                locked_errors=data["locked_errors"],
                other_errors=data["other_errors"],
                refused_acks=data["refused_acks"],
                gave_up=data["gave_up"],
                errors=Counter(data["errors"]),
            )
    return proc.returncode, tally


def kill_run(queue: str, kill_point: str, args: argparse.Namespace, folder: str) -> dict[str, Any]:
    """One kill test: fill, start consumers, SIGKILL the victim, restart one, count.

    ``kill_point`` ``none`` is the control: the same consumers, nobody killed, no restart.
    """
    path = queue_path(folder, queue)
    filler = open_adapter(queue, path, args)
    ids = filler.fill(args.kill_tasks)
    filler.close()
    kill_after = args.kill_after if args.kill_after is not None else args.kill_tasks // (4 * args.kill_consumers)
    records = [os.path.join(folder, f"records-{secrets.token_hex(4)}.txt") for _ in range(args.kill_consumers + 1)]
    common = ["--kill-worker", queue, "--db", path, "--visibility-s", str(args.visibility_s)]
    common += ["--kill-batch", str(args.kill_batch), "--peer-sync", args.peer_sync]
    control = kill_point == "none"
    victim_argv = [] if control else ["--kill-after", str(kill_after), "--victim-point", kill_point]
    procs = [spawn([*common, "--record", records[0], *victim_argv])]
    procs += [spawn([*common, "--record", r]) for r in records[1 : args.kill_consumers]]
    started = time.perf_counter()
    go(procs)
    total = Tally()
    codes: list[int | None] = []
    killed_task: int | None = None
    others = procs
    if not control:
        victim, others = procs[0], procs[1:]
        assert victim.stdout is not None
        line = victim.stdout.readline().strip()  # "kill-me N", or its tally if it ran out of tasks first
        if line.startswith("kill-me "):
            killed_task = int(line.split()[1])
            os.kill(victim.pid, signal.SIGKILL)
        killed_at = time.perf_counter()
        code, tally = finish(victim, args.kill_timeout_s, read="" if killed_task is not None else line)
        codes.append(code)
        total.add(tally)
        time.sleep(max(0.0, killed_at + args.visibility_s - time.perf_counter()))
        restart = spawn([*common, "--record", records[-1], "--restart"])
        go([restart])
        others = [*others, restart]
    for proc in others:
        code, tally = finish(proc, args.kill_timeout_s)
        codes.append(code)
        total.add(tally)
    seconds = time.perf_counter() - started
    seen: Counter[int] = Counter()
    holders: dict[int, list[str]] = {}  # task -> who processed it, once per time
    first = "consumer0" if control else "victim"
    roles = [first, *(f"survivor{i}" for i in range(1, args.kill_consumers)), "restarted"]
    for role, r in zip(roles, records, strict=True):
        with contextlib.suppress(FileNotFoundError), open(r) as f:
            for n in map(int, f.read().split()):
                seen[n] += 1
                holders.setdefault(n, []).append(role)
    duplicated_by = Counter("+".join(sorted(holders[n])) for n, c in seen.items() if c > 1)
    never = [n for n in range(args.kill_tasks) if seen[n] == 0]
    inspector = open_adapter(queue, path, args, **({"auto_resume": False} if queue == "persist-queue" else {}))
    stranded = inspector.unfinished(never, ids)
    inspector.close()
    _remove(path)
    for r in records:
        with contextlib.suppress(FileNotFoundError):
            os.remove(r)
    duplicates = sum(c - 1 for c in seen.values() if c > 1)
    return {
        "killed": killed_task is not None,
        "kill_after": kill_after,
        "killed_task": killed_task,
        "killed_task_processed": seen[killed_task] if killed_task is not None else None,
        "processed_distinct": len(seen),
        "records": sum(seen.values()),
        "duplicates": duplicates,
        "duplicate_tasks": sum(1 for c in seen.values() if c > 1),
        "duplicated_by": dict(duplicated_by),
        "duplicates_other_than_killed": duplicates - (max(0, seen[killed_task] - 1) if killed_task is not None else 0),
        "lost": len(never) - len(stranded),
        "stranded": len(stranded),
        "locked_errors": total.locked_errors,
        "other_errors": total.other_errors,
        "refused_acks": total.refused_acks,
        "gave_up": total.gave_up,
        "errors": dict(total.errors.most_common(5)),
        "exit_codes": codes,
        "seconds": seconds,
    }


def run_kills(args: argparse.Namespace, folder: str, queues: list[str], say: Callable[[str], None]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for queue in queues:
        out[queue] = {"recovery": RECOVERY[queue]}
        for point in args.kill_points:
            r = kill_run(queue, point, args, folder)
            out[queue][point] = r
            say(
                f"kill  {queue:>13} {point:>11}: killed={r['killed']} dup={r['duplicates']} lost={r['lost']} "
                f"stranded={r['stranded']} locked={r['locked_errors']} other={r['other_errors']}"
            )
    return out


def kill_worker(args: argparse.Namespace) -> None:
    """A consumer process of the kill test (hidden ``--kill-worker QUEUE``)."""
    queue = args.kill_worker
    node_id = {"node_id": f"consumer-{os.getpid()}"} if queue == "asynccoord" else {}
    q = open_adapter(queue, args.db, args, **node_id)  # persist-queue: auto_resume on open, the default
    fd = os.open(args.record, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def record(n: int) -> None:
        os.write(fd, f"{n}\n".encode())

    print("ready", flush=True)
    sys.stdin.readline()
    if args.restart:
        q.recover(args.visibility_s)
    tally = consume(q, record=record, victim_after=args.kill_after, kill_point=args.victim_point)
    os.close(fd)
    q.close()
    print(json.dumps(tally.as_dict()), flush=True)


# --- driver -------------------------------------------------------------------------


def _remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
        return
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path + suffix)


def available(queues: list[str]) -> tuple[list[str], dict[str, str]]:
    ok, skipped = [], {}
    for queue in queues:
        if queue in PEER_PACKAGES and importlib.util.find_spec(PEER_PACKAGES[queue][0]) is None:
            dist = PEER_PACKAGES[queue][1]
            skipped[queue] = f"not installed: pip install {dist} (or pip install -e '.[bench]')"
        else:
            ok.append(queue)
    return ok, skipped


def versions(queues: list[str]) -> dict[str, str]:
    out = {}
    for queue in queues:
        dist = PEER_PACKAGES[queue][1] if queue in PEER_PACKAGES else "asynccoord"
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[queue] = importlib.metadata.version(dist)
    return out


def bench(args: argparse.Namespace, say: Callable[[str], None]) -> dict[str, Any]:
    queues, skipped = available(args.queues)
    for queue, why in skipped.items():
        say(f"skipped {queue}: {why}")
    folder = tempfile.mkdtemp(prefix="asynccoord-peers-")
    results: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "sqlite": sqlite3.sqlite_version,
            "uvloop": has_uvloop(),
            "load_average": list(os.getloadavg()),
        },
        "versions": versions(queues),
        "skipped": skipped,
        "consumer_kind": {q: CONSUMER_KIND[q] for q in queues},
        "peer_sync": args.peer_sync,
        "tasks": args.tasks,
        "consumers": args.consumers,
        "batch": args.batch,
        "max_drain_s": args.max_drain_s,
    }
    try:
        results["drain"] = run_drains(args, folder, queues, say) if args.tasks > 0 else {}
        results["ratios"] = {
            peer: {
                c: results["drain"]["asynccoord"][c]["tasks_per_s"] / rates[c]["tasks_per_s"]
                for c in rates
                if c in results["drain"].get("asynccoord", {}) and rates[c]["tasks_per_s"] > 0
            }
            for peer, rates in results["drain"].items()
            if peer != "asynccoord"
        }
        results["kill"] = {
            "tasks": args.kill_tasks,
            "consumers": args.kill_consumers,
            "visibility_s": args.visibility_s,
            "asynccoord_claim_batch": args.kill_batch,
            "queues": run_kills(args, folder, queues, say) if args.kill_tasks > 0 else {},
        }
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    results["load_average_after"] = list(os.getloadavg())
    return results


def print_tables(r: dict[str, Any]) -> None:
    m = r["machine"]
    print(
        f"\nmachine: {m['cpus']} cpus, Python {m['python']}, SQLite {m['sqlite']}, uvloop={m['uvloop']}, "
        f"load {m['load_average'][0]:.1f} -> {r['load_average_after'][0]:.1f}"
    )
    print("versions: " + ", ".join(f"{k} {v}" for k, v in r["versions"].items()))
    for queue, why in r["skipped"].items():
        print(f"skipped {queue}: {why}")
    if r["drain"]:
        counts = [str(c) for c in r["consumers"]]
        print(f"\nno-op drain of {r['tasks']:,} tasks, tasks/s (synchronous: {r['peer_sync']}):")
        print(f"  {'queue':<28}" + "".join(f"{c + ' consumer(s)':>18}" for c in counts) + "   consumers are")
        for queue, rows in r["drain"].items():
            cells = "".join(
                f"{rows[c]['tasks_per_s']:>17,.0f}{'*' if not rows[c]['complete'] else ' '}" for c in counts
            )
            print(f"  {queue:<28}{cells}   {r['consumer_kind'][queue]}")
        for queue, ratios in r["ratios"].items():
            label = f"asynccoord / {queue}"
            print(f"  {label:<28}" + "".join(f"{ratios.get(c, 0):>17.1f}x" for c in counts))
        if any(not row["complete"] for rows in r["drain"].values() for row in rows.values()):
            print(f"  * stopped after {r['max_drain_s']:g} s: the rate over the tasks it drained by then")
        errors = {
            f"{q} x{c}": (row["locked_errors"], row["other_errors"])
            for q, rows in r["drain"].items()
            for c, row in rows.items()
            if row["locked_errors"] or row["other_errors"]
        }
        print("  errors caught (locked, other): " + (json.dumps(errors) if errors else "none"))
    k = r["kill"]
    if k["queues"]:
        print(
            f"\nkill test: {k['tasks']:,} tasks, {k['consumers']} consumer processes, one SIGKILLed holding a task; "
            f"restart after {k['visibility_s']:g} s"
        )
        head = ("queue", "kill point", "killed", "dup", "dup of killed", "dup others", "lost", "stranded", "locked")
        print("  " + " ".join(f"{h:>13}" for h in head))
        for queue, runs in k["queues"].items():
            for point in KILL_POINTS:
                if point in runs:
                    x = runs[point]
                    cells = (
                        queue,
                        point,
                        x["killed"],
                        x["duplicates"],
                        (x["killed_task_processed"] or 1) - 1,
                        x["duplicates_other_than_killed"],
                        x["lost"],
                        x["stranded"],
                        x["locked_errors"],
                    )
                    print("  " + " ".join(f"{c!s:>13}" for c in cells))
        print("  duplicates by who processed them (other errors caught):")
        for queue, runs in k["queues"].items():
            for point in KILL_POINTS:
                if point in runs and (runs[point]["duplicated_by"] or runs[point]["other_errors"]):
                    x = runs[point]
                    print(f"    {queue} {point}: {json.dumps(x['duplicated_by'])} ({x['other_errors']})")
        for queue, runs in k["queues"].items():
            print(f"  {queue}: {runs['recovery']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20_000, help="tasks per drain (default 20000; 0 skips)")
    parser.add_argument("--consumers", type=int, nargs="+", default=[1, 4], help="consumer counts (default 1 4)")
    parser.add_argument("--batch", type=int, default=32, help="asynccoord claim batch in the drains (default 32)")
    parser.add_argument("--max-drain-s", type=float, default=10.0, help="stop a drain after this (default 10)")
    parser.add_argument("--queues", nargs="+", choices=QUEUES, default=list(QUEUES), help="queues to run (all)")
    parser.add_argument(
        "--peer-sync",
        choices=("normal", "default"),
        default="normal",
        help="synchronous=NORMAL on every queue (default), or each library's own setting",
    )
    parser.add_argument("--kill-tasks", type=int, default=5000, help="tasks per kill test (default 5000; 0 skips)")
    parser.add_argument("--kill-consumers", type=int, default=2, help="consumer processes in it (default 2)")
    parser.add_argument("--kill-after", type=int, help="tasks the victim processes first (default tasks/4/consumers)")
    parser.add_argument(
        "--kill-points",
        nargs="+",
        choices=KILL_POINTS,
        default=["before-work", "after-work"],
        help="where the victim is killed; none = control run (default before-work after-work)",
    )
    parser.add_argument("--visibility-s", type=float, default=2.0, help="lease / lock threshold, restart delay (2)")
    parser.add_argument("--kill-batch", type=int, default=1, help="asynccoord claim batch in the kill test (1)")
    parser.add_argument("--kill-timeout-s", type=float, default=120.0, help="per consumer process (default 120)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.add_argument("--kill-worker", choices=QUEUES, help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    parser.add_argument("--record", help=argparse.SUPPRESS)
    parser.add_argument("--restart", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--victim-point", choices=KILL_POINTS[:2], default="before-work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.kill_worker:
        kill_worker(args)
        return
    if args.kill_consumers < 2:
        parser.error("--kill-consumers must be at least 2 (a victim and a survivor)")

    def say(line: str) -> None:
        print(line, file=sys.stderr if args.json else sys.stdout, flush=True)

    results = bench(args, say)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print_tables(results)


if __name__ == "__main__":
    main()
