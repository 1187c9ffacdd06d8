"""The demo's orchestrator: producer, worker processes, faults, live view, final report.

:func:`run_demo` replays a chat trace through worker processes on one store while it
kills and stalls them, then checks what the simulated gateway saw against the queue;
run ``python -m asynccoord.demo --help`` for the options.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import random
import secrets
import signal
import sys
import tempfile
import time
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from .. import events as ev
from .._loop import run as run_loop
from ..backends.open import open_store
from ..contract.monitor import Alert
from ..contract.ratelimits import RateLimitStore
from ..errors import CoordError
from ..models import NewTask, TaskStatus
from ..monitor.monitor import Monitor
from ..monitor.snapshot import cluster_snapshot
from .faults import inject_faults
from .live import demo_dashboard, node_table, watch
from .options import DemoOptions, parse_args
from .processes import Worker, read_states, spawn, stop_workers
from .ratelimits import limit_keys, provider_limits
from .record import RunRecord
from .report import (
    LATENCY_MEASURES,
    REPORT_WINDOW_S,
    build_report,
    busiest_account,
    enqueue_times,
    rate_note,
    render,
    task_statuses,
)
from .stores import demo_lock_keys, demo_schema, refuse_used_file
from .trace import TraceMessage, bundled_sample, read_trace
from .worker import DEMO_QUEUE

__all__ = (
    "DemoOptions",
    "build_tasks",
    "main",
    "parse_args",
    "run_demo",
)


def account_of(sender_id: str, accounts: int) -> str:
    """The bot account a trace sender's messages go out from (stable hash of the sender)."""
    digest = hashlib.blake2b(sender_id.encode(), digest_size=8).digest()
    return f"acct-{int.from_bytes(digest, 'big') % accounts:02d}"


def build_tasks(messages: Sequence[TraceMessage], accounts: int, *, limited: bool = False) -> list[NewTask]:
    """One task per message: keyed by conversation, idempotency key = message id.

    With ``limited``, each task names its keys of the rate limits (its account and its
    chat, see :func:`~asynccoord.demo.ratelimits.limit_keys`).
    """
    return [
        NewTask(
            queue=DEMO_QUEUE,
            payload={
                "msg": m.msg_id,
                "account": account_of(m.sender_id, accounts),
                "seq": m.seq,
                "len": m.text_len,
            },
            partition_key=m.conversation_id,
            idempotency_key=m.msg_id,
            limit_keys=limit_keys(account_of(m.sender_id, accounts), m.conversation_id) if limited else {},
        )
        for m in messages
    ]


def schedule(
    messages: Sequence[TraceMessage], *, speed: float | None, replay_s: float, max_gap_s: float
) -> list[float]:
    """Replay offsets (seconds from the start) following the trace's relative timing.

    Gaps longer than ``max_gap_s`` of trace time (nights, idle hours) are cut to
    ``max_gap_s``; the result is divided by ``speed``, or scaled to last ``replay_s``
    when ``speed`` is None.
    """
    offsets: list[float] = []
    t = 0.0
    for i, m in enumerate(messages):
        if i:
            t += min(max_gap_s, float(m.ts_unix - messages[i - 1].ts_unix))
        offsets.append(t)
    span = offsets[-1] if offsets else 0.0
    factor = (span / replay_s if span > 0 else 1.0) if speed is None else speed
    return [o / factor for o in offsets]


async def run_demo(opts: DemoOptions, console: Console | None = None) -> dict[str, Any]:
    """Run the demo and return its report (the ``--json`` object, see :func:`~.report.build_report`).

    With the defaults it replays the bundled trace sample (20,000 messages) through 2
    worker processes x 8 nodes, kills one process with SIGKILL a third of the way through
    (a replacement starts a second later with the same node ids), stalls the other's event
    loop past its lease, lock and heartbeat TTLs later on, and reports what the gateway
    saw. Each message goes out from the bot account its sender hashes to
    (:func:`account_of`), and an account sends one message at a time. The report's ``ok``
    holds only when no message was delivered twice, none was lost, no account sent two
    messages at once and no conversation was sent out of order. A run that makes no
    progress for ``opts.stuck_s`` (60 s) stops and fails.

    The store is a fresh SQLite file by default; ``--store postgresql://...`` puts the
    queue, locks, membership and monitor on PostgreSQL in a schema of the demo's own
    (``--schema``, default ``asynccoord_demo``; see
    :func:`~asynccoord.demo.stores.demo_schema`), while the gateway's record stays a local
    SQLite file. ``--lock-store`` takes the account locks in Redis under a key prefix of
    the run's own, deleted at the end (:func:`~asynccoord.demo.stores.demo_lock_keys`).
    """
    began = time.monotonic()
    trace_path = opts.trace or bundled_sample()
    messages = list(read_trace(trace_path, limit=opts.messages))
    if not messages:
        raise ValueError(f"the trace {str(trace_path)!r} has no messages")
    if len({m.msg_id for m in messages}) != len(messages):
        raise ValueError(f"the trace {str(trace_path)!r} repeats a msg_id: message ids must be unique")
    target = opts.target
    refuse_used_file(opts)
    if opts.lock_store is not None:
        opts = dataclasses.replace(opts, lock_prefix=f"asynccoord-demo:{secrets.token_hex(4)}:")
    tasks = build_tasks(messages, opts.accounts, limited=opts.declares_limits)
    offsets = schedule(messages, speed=opts.speed, replay_s=opts.replay_s, max_gap_s=opts.max_gap_s)
    rng = random.Random(opts.seed)
    loaded = time.monotonic()
    timing: dict[str, float] = {"load_trace": loaded - began}
    with contextlib.ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="asynccoord-demo-")))
        store_target = target or str(folder / "demo.db")
        gateway_path = folder / "gateway.db"
        workers = [
            Worker(
                index=i, prefix=f"p{i}", status_file=folder / f"worker-{i}.json", log_file=folder / f"worker-{i}.log"
            )
            for i in range(opts.processes)
        ]
        run = RunRecord(total=len(tasks))
        async with contextlib.AsyncExitStack() as astack:
            options: dict[str, Any] = {}
            if opts.postgres:
                await astack.enter_async_context(demo_schema(store_target, opts.schema))
                options["schema"] = opts.schema
            store = await astack.enter_async_context(open_store(store_target, **options))
            if opts.declares_limits:  # for every process on the database, before any worker claims
                assert isinstance(store, RateLimitStore)
                await store.set_rate_limits(DEMO_QUEUE, provider_limits(opts.rate_scale))
            sweep_lock_keys = None
            if opts.lock_store is not None:
                sweep_lock_keys = await astack.enter_async_context(demo_lock_keys(opts, run))
            if opts.dashboard is not None:
                await astack.enter_async_context(demo_dashboard(store_target, opts))
            for w in workers:
                spawn(w, opts, store_target, gateway_path)
            try:
                async with Monitor(
                    store, flush_interval_s=opts.monitor_flush_s, info={"role": "demo-producer"}
                ) as monitor:

                    async def keep_alert(alert: Alert) -> None:
                        run.alerts.append(
                            {
                                "rule": alert.rule,
                                "event": alert.event,
                                "state": str(alert.state),
                                "value": alert.value,
                                "threshold": alert.threshold,
                                "window_s": alert.window_s,
                                "scope": str(alert.scope),
                            }
                        )

                    monitor.subscribe(keep_alert)
                    run.started = time.monotonic()
                    timing["prepare"] = run.started - loaded
                    background = [
                        asyncio.create_task(_produce(store, tasks, offsets, rng, opts, run)),
                        asyncio.create_task(_poll_progress(store, run)),
                        asyncio.create_task(inject_faults(workers, opts, store_target, gateway_path, run)),
                    ]
                    try:
                        account, count = busiest_account(tasks)
                        note = (
                            f"latency = {LATENCY_MEASURES}; the hottest account, {account}, "
                            f"has {count} of the {len(tasks)} messages and sends one at a time\n"
                            f"{rate_note(opts)}"
                        )
                        finished = await watch(store, workers, len(tasks), opts, run, console, note)
                    finally:  # also when interrupted: the producer stops before the store closes under it
                        for t in background:
                            t.cancel()
                        ended = await asyncio.gather(*background, return_exceptions=True)
                    elapsed = time.monotonic() - run.started
                    for outcome in ended:  # a background task's own failure still ends the run
                        if isinstance(outcome, Exception):  # (CancelledError is not an Exception)
                            raise outcome
                    problems = await asyncio.to_thread(stop_workers, workers, 10.0)
                    if run.gave_up is not None:
                        problems.insert(0, f"gave up: {run.gave_up}")
                    await monitor.flush(force=True)
                    await monitor.evaluate()
                    snapshot = await cluster_snapshot(store, windows_s=(REPORT_WINDOW_S,))
                    stopped = time.monotonic()
                    timing["drain"] = elapsed
                    timing["stop"] = stopped - run.started - elapsed
                    statuses = await task_statuses(store_target, opts)
                    if console is not None:  # the workers wrote their last counts as they stopped
                        done = sum(1 for status in statuses.values() if status == TaskStatus.DONE.value)
                        at_claim = int(snapshot.totals.get(ev.DUPLICATE_DELIVERY_SUPPRESSED, 0))
                        nodes = node_table(read_states(workers), workers=workers, done=done, done_at_claim=at_claim)
                        console.print(nodes)
                    enqueued_at = await enqueue_times(store_target, opts)
            finally:
                await asyncio.to_thread(stop_workers, workers, 5.0)
            if sweep_lock_keys is not None:
                await sweep_lock_keys()
                if run.lock_sweep_error is not None:
                    problems.append(
                        f"the run's Redis keys ({opts.lock_prefix}*) could not be deleted: {run.lock_sweep_error}"
                    )
            report = build_report(
                gateway_path, tasks, statuses, snapshot, run, elapsed, finished, problems, opts, enqueued_at
            )
            timing["verify"] = time.monotonic() - stopped
            timing["total"] = time.monotonic() - began
            report["timing_s"] = {k: round(v, 2) for k, v in timing.items()}
    return report


async def _produce(
    store: Any, tasks: list[NewTask], offsets: list[float], rng: random.Random, opts: DemoOptions, run: RunRecord
) -> None:
    start = time.monotonic()
    i = 0
    redeliver: list[NewTask] = []
    while i < len(tasks):
        now = time.monotonic() - start
        j = i
        while j < len(tasks) and offsets[j] <= now:
            j += 1
        batch = tasks[i:j][:2000]
        if batch:
            # The upstream delivers some messages twice: the idempotency key suppresses them.
            again = [t for t in redeliver if rng.random() < 0.5]
            redeliver = [t for t in redeliver if t not in again]
            await store.enqueue_many(batch + again)
            redeliver.extend(t for t in batch if rng.random() < opts.redelivery_rate)
            i += len(batch)
            run.enqueued = i
        else:
            await asyncio.sleep(min(0.02, max(0.0, offsets[i] - now)))
    if redeliver:
        await store.enqueue_many(redeliver)


async def _poll_progress(store: Any, run: RunRecord) -> None:
    """Keep ``run.done`` (tasks done or dead) current without loading the machine.

    The estimate is the cluster's flushed ``commits`` and ``dead_lettered`` counters (a
    read of a few rows). They can only fall short (a killed process takes its unflushed
    counts with it), and an exact count scans the task table (tens of milliseconds at
    100,000 tasks), so the exact count runs once they come within 3 % of the end or stop
    moving for 3 s, then at most every 4 times its own duration (at most 1 s apart), and
    otherwise only every 30 s. The run is judged finished only by an exact count.
    """
    last_exact = 0.0
    exact_cost = 0.0
    estimate = moved = 0
    moved_at = time.monotonic()
    while True:
        now = time.monotonic()
        near_end = estimate >= 0.97 * run.total or now - moved_at >= 3.0
        interval = min(1.0, 4 * exact_cost) if near_end else 30.0
        try:
            if now - last_exact >= interval:
                stats = await store.stats(DEMO_QUEUE)
                exact_cost = time.monotonic() - now
                last_exact = now
                run.done = stats.counts[TaskStatus.DONE] + stats.counts[TaskStatus.DEAD]
                run.polls += 1
                run.poll_s += exact_cost
            else:
                totals = (await cluster_snapshot(store, windows_s=(REPORT_WINDOW_S,))).totals
                estimate = int(totals.get(ev.COMMITS, 0)) + int(totals.get(ev.DEAD_LETTERED, 0))
                if estimate != moved:
                    moved, moved_at = estimate, time.monotonic()
                run.done = max(run.done, min(estimate, run.total - 1))  # only an exact count says "all"
        except CoordError:
            pass  # e.g. a lost PostgreSQL connection: count again next time (the watcher gives up if stuck)
        await asyncio.sleep(0.25)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: run the demo; exit 0 only when the report is ok.

    Exit status, as for ``python -m asynccoord``: 0 the report is ok; 1 it is not, or the run
    failed (its store or lock store cannot be reached or opened), one line on standard error;
    2 bad usage (an option, a bad trace, a ``--db`` file already used, a schema the demo did
    not create).
    """
    opts = parse_args(argv)
    console = None if opts.as_json else Console(stderr=False)
    try:
        report = _run_loop(_sigterm_cancels(run_demo(opts, console)))
    except KeyboardInterrupt:
        print("asynccoord.demo: interrupted; worker processes stopped", file=sys.stderr)
        return 130
    except ValueError as exc:  # bad usage: a bad trace, a used --db file, a schema not the demo's
        print(f"asynccoord.demo: {exc}", file=sys.stderr)
        return 2
    except CoordError as exc:  # a failure, as for the CLI: a store unreachable, a --db folder missing
        print(f"asynccoord.demo: {exc}", file=sys.stderr)
        return 1
    if opts.as_json:
        print(json.dumps(report, indent=2, default=str))
    else:
        assert console is not None
        render(report, console)
    return 0 if report["ok"] else 1


async def _sigterm_cancels(run: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
    """Await ``run``; SIGTERM stops it as Ctrl-C does (``asyncio.run``'s way with SIGINT).

    The signal cancels the task running ``run``, so the run's cleanup stops the worker
    processes (rather than leaving them running without a parent) at its own await
    points, then :class:`KeyboardInterrupt` is raised. (A ``KeyboardInterrupt`` raised
    by a plain signal handler lands anywhere, even inside the event loop's machinery,
    which then leaves the cleanup to the loop's shutdown: about 10 s.)
    """
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    signalled = False

    def on_sigterm() -> None:
        nonlocal signalled
        if not signalled:  # once: a second SIGTERM must not cut the cleanup it started
            signalled = True
            task.cancel()

    try:
        loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    except (NotImplementedError, RuntimeError):  # no signals here (Windows, or not the main thread)
        return await run
    try:
        return await run
    except asyncio.CancelledError:
        if signalled and task.uncancel() == 0:
            raise KeyboardInterrupt("signal SIGTERM") from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def _run_loop(coro: Any) -> Any:
    return run_loop(coro)


if __name__ == "__main__":
    raise SystemExit(main())
