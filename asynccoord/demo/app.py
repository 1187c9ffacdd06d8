"""The demo's orchestrator: producer, worker processes, faults, live view, final report.

Run ``python -m asynccoord.demo --help`` for the options. With no arguments it replays
the bundled trace sample (20,000 messages) through 2 worker processes x 8 nodes, kills
one process with SIGKILL a third of the way through (a replacement starts a second
later with the same node ids), stalls the other's event loop past its lease and lock
TTL (and its heartbeat TTL) later on, and ends with a report of what the gateway saw.
The exit status is 0 only when no message was delivered twice, none was lost, no
account sent two messages at once and no conversation was sent out of order.

The store is a fresh SQLite file by default; ``--store postgresql://...`` runs the same
demo with the queue, locks, membership and monitor on PostgreSQL, in a schema of the
demo's own (``--schema``, default ``asynccoord_demo``; see :func:`_demo_schema`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import hashlib
import json
import os
import random
import re
import secrets
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .. import events as ev
from .._loop import run as run_loop
from ..backends.open import is_postgres_target, open_store, redact_target
from ..contract.monitor import Alert
from ..errors import CoordError
from ..models import NewTask, TaskStatus
from ..monitor.monitor import Monitor, cluster_snapshot
from .gateway import GatewayAudit, audit
from .trace import TraceMessage, bundled_sample, read_trace
from .worker import DEMO_QUEUE

__all__ = ("DemoOptions", "build_tasks", "main", "parse_args", "run_demo")

REPORT_WINDOW_S = 3600.0

DEMO_SCHEMA = "asynccoord_demo"
"""Default PostgreSQL schema of the demo's tables (``--schema``)."""

REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
"""URL schemes ``--lock-store`` accepts (redis-py's)."""

DEMO_SCHEMA_COMMENT = "created by python -m asynccoord.demo; dropped and recreated by its next run"
"""The comment that marks a schema as the demo's own: the only kind of schema the demo ever drops."""

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")

_SYSTEM_SCHEMAS = re.compile(r"public|information_schema|pg_.*")
"""Schema names the demo refuses outright, even before it looks at the database."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoOptions:
    """What the demo runs (see ``--help`` for each option)."""

    nodes: int = 8
    processes: int = 2
    messages: int = 20_000
    speed: float | None = None
    replay_s: float = 8.0
    max_gap_s: float = 120.0
    accounts: int = 24
    db: Path | None = None
    store: str | None = None
    schema: str = DEMO_SCHEMA
    lock_store: str | None = None  # a redis:// URL: the account locks in Redis
    lock_prefix: str | None = None  # the run's Redis key prefix (set by run_demo)
    trace: Path | None = None
    seed: int = 7
    faults: bool = True
    as_json: bool = False
    lease_s: float = 2.0
    lock_ttl_s: float = 2.0
    lock_wait_s: float = 5.0
    max_in_flight: int = 16
    claim_batch: int = 16
    idle_max_s: float = 1.0
    monitor_flush_s: float = 1.0
    heartbeat_ttl_s: float = 3.0
    stall_s: float = 5.0
    latency_median_ms: float = 1.0
    latency_sigma: float = 0.6
    redelivery_rate: float = 0.01
    stuck_s: float = 60.0  # give up when no message was enqueued, done or dead for this long
    timeout_s: float = 1800.0  # and in any case after this long

    @property
    def target(self) -> str | None:
        """The store target given on the command line (``--store`` or ``--db``), None for a temporary file."""
        if self.store is not None:
            return self.store
        return None if self.db is None else str(self.db)

    @property
    def postgres(self) -> bool:
        """Whether the demo runs on PostgreSQL."""
        return self.store is not None and is_postgres_target(self.store)


@dataclass(slots=True)
class _Worker:
    index: int
    prefix: str
    status_file: Path
    log_file: Path
    process: subprocess.Popen[bytes] | None = None
    incarnations: int = 0

    @property
    def ready_file(self) -> Path:
        """Created by the worker once SIGTERM and SIGUSR1 no longer kill it (removed at each spawn)."""
        return self.status_file.with_suffix(".ready")

    def ready(self) -> bool:
        return self.ready_file.exists()


@dataclass(slots=True)
class _Run:
    faults: list[dict[str, Any]] = field(default_factory=list)
    alerts: list[dict[str, Any]] = field(default_factory=list)
    enqueued: int = 0
    total: int = 0
    started: float = 0.0
    done: int = 0  # done and dead tasks, as of the last progress poll
    polls: int = 0
    poll_s: float = 0.0  # time spent counting
    gave_up: str | None = None  # why the run stopped before every message was done or dead
    lock_store_keys: int | None = None  # with --lock-store: the run's Redis keys found at the end
    lock_sweep_error: str | None = None  # with --lock-store: why they could not be deleted


def account_of(sender_id: str, accounts: int) -> str:
    """The bot account a trace sender's messages go out from (stable hash of the sender)."""
    digest = hashlib.blake2b(sender_id.encode(), digest_size=8).digest()
    return f"acct-{int.from_bytes(digest, 'big') % accounts:02d}"


def build_tasks(messages: Sequence[TraceMessage], accounts: int) -> list[NewTask]:
    """One task per message: keyed by conversation, idempotency key = message id."""
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


def parse_args(argv: Sequence[str] | None = None) -> DemoOptions:
    """Parse the command line into :class:`DemoOptions` (argparse exits 2 on bad usage)."""
    p = argparse.ArgumentParser(
        prog="python -m asynccoord.demo",
        description="Replay real chat traffic through several nodes in several processes, with faults.",
    )
    p.add_argument("--nodes", type=_bounded_int(256), default=8, help="nodes per process, 1..256 (default 8)")
    p.add_argument("--processes", type=_bounded_int(16), default=2, help="worker processes, 1..16 (default 2)")
    p.add_argument("--messages", type=_positive_int, default=20_000, help="messages to replay (default 20000)")
    p.add_argument(
        "--speed",
        type=_positive_float,
        default=None,
        help="time compression of the trace, e.g. 1000 (default: fit the replay into about 8 s)",
    )
    p.add_argument(
        "--accounts", type=_positive_int, default=24, help="bot accounts senders are hashed onto (default 24)"
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("--db", type=Path, help="SQLite database file (default: a fresh one in a temporary folder)")
    where.add_argument(
        "--store",
        help="store target: a postgresql:// DSN (tables in --schema, see README) or an SQLite file",
    )
    p.add_argument(
        "--schema",
        type=_schema_name,
        default=None,
        help=f"with a postgresql:// --store: the schema the demo creates for its tables, and drops and "
        f"recreates on its next run; a schema it did not create is refused (default {DEMO_SCHEMA})",
    )
    p.add_argument(
        "--lock-store",
        metavar="URL",
        help="take the account locks in Redis (redis://, rediss:// or unix:// URL; extra 'redis') instead of "
        "the queue store; the demo's keys (under a prefix of its own) are deleted at the end",
    )
    p.add_argument("--trace", type=Path, help="trace file, JSON Lines, optionally gzipped (default: bundled sample)")
    p.add_argument("--seed", type=int, default=7, help="random seed (default 7)")
    p.add_argument("--no-faults", action="store_true", help="do not kill or stall a process")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the live view")
    a = p.parse_args(argv)
    if a.schema is not None and not (a.store is not None and is_postgres_target(a.store)):
        p.error("--schema applies to a PostgreSQL store only: add --store postgresql://...")
    if a.lock_store is not None and not a.lock_store.startswith(REDIS_SCHEMES):
        p.error(f"--lock-store takes a Redis URL ({', '.join(REDIS_SCHEMES)}...), got {redact_target(a.lock_store)!r}")
    return DemoOptions(
        nodes=a.nodes,
        processes=a.processes,
        messages=a.messages,
        speed=a.speed,
        accounts=a.accounts,
        db=a.db,
        store=a.store,
        schema=a.schema or DEMO_SCHEMA,
        lock_store=a.lock_store,
        trace=a.trace,
        seed=a.seed,
        faults=not a.no_faults,
        as_json=a.json,
    )


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {text!r}")
    return value


def _bounded_int(maximum: int) -> Callable[[str], int]:
    """An argparse type: a whole number in ``1..maximum`` (a demo on 2 cores, not a stress test)."""

    def parse(text: str) -> int:
        value = _positive_int(text)
        if value > maximum:
            raise argparse.ArgumentTypeError(f"expected a number <= {maximum}, got {text!r}")
        return value

    return parse


def _schema_name(text: str) -> str:
    if not _SCHEMA_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"expected a lower-case PostgreSQL identifier (a-z, 0-9, _; at most 63), got {text!r}"
        )
    if _SYSTEM_SCHEMAS.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not the demo's to drop: choose a schema of its own")
    return text


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


# --- processes -------------------------------------------------------------------------


def _spawn(worker: _Worker, opts: DemoOptions, store: str, gateway: Path) -> None:
    worker.incarnations += 1
    command = [
        sys.executable,
        "-m",
        "asynccoord.demo.worker",
        "--store",
        store,
        "--gateway",
        str(gateway),
        "--status-file",
        str(worker.status_file),
        "--status-interval-s",
        "0" if opts.as_json else "0.25",  # only the live view reads the status files
        "--ready-file",
        str(worker.ready_file),
        "--prefix",
        worker.prefix,
        "--parent-pid",
        str(os.getpid()),
        "--nodes",
        str(opts.nodes),
        "--seed",
        str(opts.seed * 1000 + worker.index * 10 + worker.incarnations),
        "--lease-s",
        str(opts.lease_s),
        "--lock-ttl-s",
        str(opts.lock_ttl_s),
        "--lock-wait-s",
        str(opts.lock_wait_s),
        "--max-in-flight",
        str(opts.max_in_flight),
        "--claim-batch",
        str(opts.claim_batch),
        "--idle-max-s",
        str(opts.idle_max_s),
        "--monitor-flush-s",
        str(opts.monitor_flush_s),
        "--heartbeat-ttl-s",
        str(opts.heartbeat_ttl_s),
        "--stall-s",
        str(opts.stall_s),
        "--latency-median-ms",
        str(opts.latency_median_ms),
        "--latency-sigma",
        str(opts.latency_sigma),
    ]
    if opts.postgres:
        command += ["--schema", opts.schema]
    if opts.lock_store is not None and opts.lock_prefix is not None:
        command += ["--lock-store", opts.lock_store, "--lock-prefix", opts.lock_prefix]
    # stderr goes to a file (never a pipe nobody drains while the worker runs: a full pipe
    # would block the worker's event loop on its next log line).
    worker.ready_file.unlink(missing_ok=True)
    with open(worker.log_file, "ab") as log_file:
        worker.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log_file)


def _stop(workers: Sequence[_Worker], timeout_s: float) -> list[str]:
    """SIGTERM every worker, wait, SIGKILL stragglers; return their stderr tails on failure.

    A worker still starting (no ready file yet: a replacement spawned late, say) is
    signalled once it is ready, within the deadline: before that, SIGTERM would kill it.
    """
    problems: list[str] = []
    deadline = time.monotonic() + timeout_s
    starting = [(w, w.process) for w in workers if w.process is not None and w.process.poll() is None]
    while starting and time.monotonic() < deadline:
        for w, process in [(w, p) for w, p in starting if w.ready() or p.poll() is not None]:
            starting.remove((w, process))
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        if starting:
            time.sleep(0.02)
    for w in workers:
        if w.process is None:
            continue
        try:
            w.process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            w.process.kill()
            w.process.wait()
            problems.append(f"worker {w.index} did not stop in time")
        if w.process.returncode not in (0, -signal.SIGKILL):
            problems.append(f"worker {w.index} exited {w.process.returncode}: {_tail(w.log_file)}")
    return problems


def _tail(path: Path, size: int = 2000) -> str:
    try:
        return path.read_bytes()[-size:].decode(errors="replace")
    except OSError:
        return ""


def _read_states(workers: Sequence[_Worker]) -> list[dict[str, Any]]:
    nodes: list[dict[str, Any]] = []
    for w in workers:
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(w.status_file.read_text())
            for n in data.get("nodes", []):
                n["process"] = w.index
                n["stalled"] = data.get("stalled", False)
                nodes.append(n)
    return nodes


# --- the run -----------------------------------------------------------------------------


async def run_demo(opts: DemoOptions, console: Console | None = None) -> dict[str, Any]:
    """Run the demo and return its report (the ``--json`` object)."""
    began = time.monotonic()
    trace_path = opts.trace or bundled_sample()
    messages = list(read_trace(trace_path, limit=opts.messages))
    if not messages:
        raise ValueError(f"the trace {str(trace_path)!r} has no messages")
    if len({m.msg_id for m in messages}) != len(messages):
        raise ValueError(f"the trace {str(trace_path)!r} repeats a msg_id: message ids must be unique")
    target = opts.target
    _refuse_used_file(opts)
    if opts.lock_store is not None:
        opts = dataclasses.replace(opts, lock_prefix=f"asynccoord-demo:{secrets.token_hex(4)}:")
    tasks = build_tasks(messages, opts.accounts)
    offsets = schedule(messages, speed=opts.speed, replay_s=opts.replay_s, max_gap_s=opts.max_gap_s)
    rng = random.Random(opts.seed)
    loaded = time.monotonic()
    timing: dict[str, float] = {"load_trace": loaded - began}
    with contextlib.ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="asynccoord-demo-")))
        store_target = target or str(folder / "demo.db")
        gateway_path = folder / "gateway.db"
        workers = [
            _Worker(
                index=i, prefix=f"p{i}", status_file=folder / f"worker-{i}.json", log_file=folder / f"worker-{i}.log"
            )
            for i in range(opts.processes)
        ]
        run = _Run(total=len(tasks))
        async with contextlib.AsyncExitStack() as astack:
            options: dict[str, Any] = {}
            if opts.postgres:
                await astack.enter_async_context(_demo_schema(store_target, opts.schema))
                options["schema"] = opts.schema
            store = await astack.enter_async_context(open_store(store_target, **options))
            sweep_lock_keys = None
            if opts.lock_store is not None:
                sweep_lock_keys = await astack.enter_async_context(_demo_lock_keys(opts, run))
            for w in workers:
                _spawn(w, opts, store_target, gateway_path)
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
                        asyncio.create_task(_inject_faults(workers, opts, store_target, gateway_path, run)),
                    ]
                    try:
                        finished = await _watch(store, workers, len(tasks), opts, run, console)
                    finally:  # also when interrupted: the producer stops before the store closes under it
                        for t in background:
                            t.cancel()
                        ended = await asyncio.gather(*background, return_exceptions=True)
                    elapsed = time.monotonic() - run.started
                    for outcome in ended:  # a background task's own failure still ends the run
                        if isinstance(outcome, Exception):  # (CancelledError is not an Exception)
                            raise outcome
                    problems = await asyncio.to_thread(_stop, workers, 10.0)
                    if run.gave_up is not None:
                        problems.insert(0, f"gave up: {run.gave_up}")
                    await monitor.flush(force=True)
                    await monitor.evaluate()
                    snapshot = await cluster_snapshot(store, windows_s=(REPORT_WINDOW_S,))
                    stopped = time.monotonic()
                    timing["drain"] = elapsed
                    timing["stop"] = stopped - run.started - elapsed
                    statuses = await _task_statuses(store_target, opts)
            finally:
                await asyncio.to_thread(_stop, workers, 5.0)
            if sweep_lock_keys is not None:
                await sweep_lock_keys()
                if run.lock_sweep_error is not None:
                    problems.append(
                        f"the run's Redis keys ({opts.lock_prefix}*) could not be deleted: {run.lock_sweep_error}"
                    )
            report = _report(gateway_path, tasks, statuses, snapshot, run, elapsed, finished, problems, opts)
            timing["verify"] = time.monotonic() - stopped
            timing["total"] = time.monotonic() - began
            report["timing_s"] = {k: round(v, 2) for k, v in timing.items()}
    return report


def _refuse_used_file(opts: DemoOptions) -> None:
    target = opts.target
    if target is None or opts.postgres:
        return
    path = Path(_sqlite_file(target))
    if path.exists() and path.stat().st_size > 0:
        flag = "--db" if opts.db is not None else "--store"
        raise ValueError(f"{flag} {target!r} already exists: the demo needs a fresh database file")


def _sqlite_file(target: str) -> str:
    return target[len("sqlite:///") :] if target.startswith("sqlite:///") else target


@contextlib.asynccontextmanager
async def _demo_lock_keys(opts: DemoOptions, run: _Run) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """Check the Redis lock store is reachable; yield ``sweep``, which counts and deletes the run's keys.

    The workers take their account locks in Redis under ``opts.lock_prefix`` (one per
    run). ``sweep()``, called once the workers stopped, counts the keys left
    (fencing-token counters are never deleted by the lock store) into
    ``run.lock_store_keys`` and deletes them; it runs on exit as well if it was not called.
    Commands are retried on a lost connection (redis-py's ``Retry``, exponential backoff,
    3 times); a sweep that still fails is kept in ``run.lock_sweep_error``, never raised.
    """
    assert opts.lock_store is not None
    assert opts.lock_prefix is not None
    try:
        from redis import asyncio as aioredis
        from redis import exceptions as rerr
        from redis.asyncio.retry import Retry
        from redis.backoff import ExponentialBackoff
    except ImportError as exc:
        raise ValueError("--lock-store redis://... needs redis-py: pip install 'asynccoord[redis]'") from exc
    client = aioredis.Redis.from_url(
        opts.lock_store,
        socket_connect_timeout=5.0,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.1), 3),
        retry_on_error=[rerr.ConnectionError, rerr.TimeoutError],
    )
    try:
        try:
            await client.ping()
        except (OSError, rerr.RedisError) as exc:
            raise ValueError(f"cannot connect to {redact_target(opts.lock_store)}: {exc}") from exc
        swept = False

        async def sweep() -> None:
            nonlocal swept
            try:
                keys = [key async for key in client.scan_iter(match=f"{opts.lock_prefix}*", count=1000)]
                if not swept:
                    run.lock_store_keys = len(keys)
                for first in range(0, len(keys), 500):
                    await client.delete(*keys[first : first + 500])
            except (OSError, rerr.RedisError) as exc:
                run.lock_sweep_error = f"{type(exc).__name__}: {exc}"
            swept = True

        try:
            yield sweep
        finally:
            await sweep()  # keys made after the first sweep (a worker still stopping) go too
    finally:
        await client.aclose()


@contextlib.asynccontextmanager
async def _demo_schema(dsn: str, schema: str) -> AsyncIterator[None]:
    """Give the demo a fresh PostgreSQL schema of its own for the run.

    The schema is created and marked with :data:`DEMO_SCHEMA_COMMENT`; a schema left by
    an earlier run (it has the mark) is dropped and created anew; a schema that exists
    without the mark is refused, even an empty one (its grants, comment and any object
    the demo does not know of are someone's), and so are ``public``, ``information_schema``
    and ``pg_*`` whether they exist or not, so the demo never drops anything it did not
    create. A session advisory lock on the schema's name, held for the whole
    run, refuses a second demo on the same schema at the same time. The schema is left
    in place after the run, for ``python -m asynccoord status``.
    """
    if _SYSTEM_SCHEMAS.fullmatch(schema):
        raise ValueError(f"schema {schema!r} is not the demo's to drop: choose a schema of its own")
    try:
        import asyncpg
    except ImportError as exc:
        raise ValueError("--store postgresql://... needs asyncpg: pip install 'asynccoord[postgres]'") from exc
    from ..backends.open import split_connect_timeout

    connect_dsn, timeout_s = split_connect_timeout(dsn)  # InvalidArgumentError is a ValueError
    try:
        conn = await asyncpg.connect(connect_dsn, timeout=timeout_s)
    except (OSError, asyncpg.PostgresError) as exc:
        raise ValueError(f"cannot connect to {redact_target(dsn)}: {exc}") from exc
    try:
        key = int.from_bytes(hashlib.blake2b(f"asynccoord.demo:{schema}".encode(), digest_size=8).digest(), "big")
        key -= 1 << 63  # a signed 64-bit advisory lock id
        if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", key):
            raise ValueError(f"another demo is running on schema {schema!r}: wait for it or choose another --schema")
        row = await conn.fetchrow(
            "SELECT obj_description(oid, 'pg_namespace') AS mark FROM pg_namespace WHERE nspname = $1", schema
        )
        ours = row is not None and row["mark"] == DEMO_SCHEMA_COMMENT
        if row is not None and not ours:
            raise ValueError(
                f"schema {schema!r} already exists and was not created by the demo: "
                "the demo drops only its own schemas; choose another --schema"
            )
        quoted = f'"{schema}"'  # a checked identifier: [a-z_][a-z0-9_]*
        async with conn.transaction():  # marked in the transaction that creates it
            if ours:
                await conn.execute(f"DROP SCHEMA {quoted} CASCADE")
            await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quoted}")
            await conn.execute(f"COMMENT ON SCHEMA {quoted} IS '{DEMO_SCHEMA_COMMENT}'")
        yield
    finally:
        await conn.close()  # also ends the advisory lock


async def _produce(
    store: Any, tasks: list[NewTask], offsets: list[float], rng: random.Random, opts: DemoOptions, run: _Run
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


async def _poll_progress(store: Any, run: _Run) -> None:
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


async def _inject_faults(workers: list[_Worker], opts: DemoOptions, store: str, gateway: Path, run: _Run) -> None:
    if not opts.faults:
        return
    total = run.total
    victim = workers[-1]
    staller = workers[0]
    killed = stalled = False
    while not (killed and stalled):
        progress = run.done / max(1, total)
        if not killed and progress >= 0.3 and victim.process is not None:
            victim.process.kill()  # SIGKILL: no cleanup, leases and locks left behind
            await asyncio.to_thread(victim.process.wait)
            run.faults.append(
                {"kind": "sigkill", "process": victim.index, "at_s": round(time.monotonic() - run.started, 2)}
            )
            killed = True
            await asyncio.sleep(1.0)
            _spawn(victim, opts, store, gateway)  # a replacement with the same node ids (new incarnation)
            run.faults.append(
                {"kind": "restart", "process": victim.index, "at_s": round(time.monotonic() - run.started, 2)}
            )
        if (
            not stalled
            and progress >= 0.55
            and staller.process is not None
            and staller.process.poll() is None
            and staller.ready()  # before, SIGUSR1 would kill it
        ):
            staller.process.send_signal(signal.SIGUSR1)
            run.faults.append(
                {
                    "kind": "stall",
                    "process": staller.index,
                    "stall_s": opts.stall_s,
                    "lease_s": opts.lease_s,
                    "lock_ttl_s": opts.lock_ttl_s,
                    "at_s": round(time.monotonic() - run.started, 2),
                }
            )
            stalled = True
        await asyncio.sleep(0.1)


async def _watch(
    store: Any, workers: list[_Worker], total: int, opts: DemoOptions, run: _Run, console: Console | None
) -> bool:
    """Wait until every message is done or dead, showing the live view.

    Gives up (returns False, with the reason in ``run.gave_up``) when a worker crashed,
    when nothing moved for ``opts.stuck_s``, or after ``opts.timeout_s``.
    """
    deadline = time.monotonic() + opts.timeout_s
    seen = (run.done, run.enqueued)
    moved_at = time.monotonic()
    progress = Progress(
        TextColumn("[bold]messages"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("enqueued {task.fields[enqueued]}"),
        TimeElapsedColumn(),
    )
    bar = progress.add_task("drain", total=total, enqueued=0)
    live = (
        Live(Group(progress, _node_table([])), console=console, refresh_per_second=4, transient=False)
        if console is not None
        else None
    )
    with live if live is not None else contextlib.nullcontext():
        while time.monotonic() < deadline:
            progress.update(bar, completed=run.done, enqueued=run.enqueued)
            if live is not None:
                live.update(Group(progress, _node_table(_read_states(workers))))
            if run.enqueued >= total and run.done >= total:
                return True
            for w in workers:
                if w.process is not None and w.process.poll() not in (None, -signal.SIGKILL):
                    run.gave_up = f"worker {w.index} exited {w.process.returncode}"
                    return False  # a worker crashed: stop and report
            now = time.monotonic()
            if (run.done, run.enqueued) != seen:
                seen, moved_at = (run.done, run.enqueued), now
            elif now - moved_at > opts.stuck_s:
                run.gave_up = f"no progress for {opts.stuck_s:g} s ({run.done} of {total} done or dead)"
                return False
            await asyncio.sleep(0.1)
    run.gave_up = f"not finished after {opts.timeout_s:g} s ({run.done} of {total} done or dead)"
    return False


def _node_table(nodes: list[dict[str, Any]]) -> Table:
    table = Table(title="nodes", expand=False, show_edge=False)
    for column in ("node", "proc", "claimed", "sent", "committed", "in flight", "conflicts", "partitions"):
        table.add_column(column, justify="right" if column not in ("node",) else "left")
    for n in sorted(nodes, key=lambda n: n["node_id"]):
        style = "yellow" if n.get("stalled") else None
        table.add_row(
            n["node_id"],
            str(n["process"]),
            str(n["claimed"]),
            str(n["sent"]),
            str(n["committed"]),
            str(n["in_flight"]),
            str(n["conflicts"]),
            str(n["owned_partitions"]),
            style=style,
        )
    return table


async def _task_statuses(target: str, opts: DemoOptions) -> dict[str, str]:
    """Idempotency key -> status of every demo task, read straight from the database."""
    if opts.postgres:
        import asyncpg

        from ..backends.open import split_connect_timeout

        dsn, timeout_s = split_connect_timeout(target)
        conn = await asyncpg.connect(dsn, timeout=timeout_s, server_settings={"search_path": f'"{opts.schema}"'})
        try:
            rows = await conn.fetch("SELECT idempotency_key, status FROM coord_tasks WHERE queue = $1", DEMO_QUEUE)
        finally:
            await conn.close()
        return {r[0]: r[1] for r in rows}

    def read() -> dict[str, str]:
        con = sqlite3.connect(f"file:{_sqlite_file(target)}?mode=ro", uri=True)
        try:
            sql = "SELECT idempotency_key, status FROM coord_tasks WHERE queue = ?"
            return dict(con.execute(sql, (DEMO_QUEUE,)).fetchall())
        finally:
            con.close()

    return await asyncio.to_thread(read)


def _report(
    gateway: Path,
    tasks: list[NewTask],
    status_of: dict[str, str],
    snapshot: Any,
    run: _Run,
    elapsed_s: float,
    finished: bool,
    problems: list[str],
    opts: DemoOptions,
) -> dict[str, Any]:
    seen = audit(gateway)
    keys = [str(t.idempotency_key) for t in tasks]  # every demo task has one: its message id
    done_keys = {k for k in keys if status_of.get(k) == TaskStatus.DONE.value}
    dead = sum(1 for k in keys if status_of.get(k) == TaskStatus.DEAD.value)
    lost = len(keys) - len(done_keys) - dead
    totals = dict(snapshot.totals)
    conflicts = {name: int(totals.get(name, 0)) for name in ev.EVENT_NAMES if name not in (ev.CLAIMS, ev.COMMITS)}
    latency = snapshot.latencies.get(REPORT_WINDOW_S, {}).get("enqueue_to_commit_ms")
    lease_losses = conflicts[ev.LEASE_EXPIRED] + conflicts[ev.LEASE_LOST] + conflicts[ev.SEND_INTERRUPTED]
    report: dict[str, Any] = {
        "messages": len(keys),
        "sent": len(done_keys & seen.delivered_ids),
        "send_calls": seen.send_calls,
        "duplicates": seen.duplicates,
        "duplicate_sends": seen.replays,
        "lost": lost,
        "dead": dead,
        "delivered_not_committed": len(seen.delivered_ids - done_keys),
        "account_overlaps": seen.account_overlaps,
        "order_violations": seen.order_violations,
        "gateway": {
            "stale_token_rejections": seen.stale_token_rejections,
            "transient_errors": seen.transient_errors,
            "cut_off": seen.cut_off,
            "replays": seen.replays,
        },
        "hottest_account": _hottest(tasks, seen),
        "conflicts": conflicts,
        "alerts": run.alerts,
        "throughput_per_s": round(len(done_keys) / elapsed_s, 1) if elapsed_s > 0 else 0.0,
        "latency_ms": {
            "p50": None if latency is None or latency.p50_ms is None else round(latency.p50_ms, 1),
            "p99": None if latency is None or latency.p99_ms is None else round(latency.p99_ms, 1),
        },
        "stage_latency_ms": {
            name: {"p50": _round(summary.p50_ms), "p99": _round(summary.p99_ms), "count": summary.count}
            for name, summary in snapshot.latencies.get(REPORT_WINDOW_S, {}).items()
        },
        "elapsed_s": round(elapsed_s, 2),
        "progress_polls": {"count": run.polls, "busy_s": round(run.poll_s, 2)},
        "faults": run.faults,
        "config": {
            "messages_requested": opts.messages,
            "nodes": opts.nodes,
            "processes": opts.processes,
            "accounts": opts.accounts,
            "lease_s": opts.lease_s,
            "lock_ttl_s": opts.lock_ttl_s,
            "lock_wait_s": opts.lock_wait_s,
            "max_in_flight": opts.max_in_flight,
            "gateway_latency_ms": {"median": opts.latency_median_ms, "sigma": opts.latency_sigma},
            "store": "sqlite" if not opts.postgres else "postgres",
            "schema": opts.schema if opts.postgres else None,
            "lock_store": None if opts.lock_store is None else redact_target(opts.lock_store),
            "lock_store_keys": run.lock_store_keys,
            "lock_prefix": opts.lock_prefix,
            "trace": str(opts.trace or "bundled sample"),
            "seed": opts.seed,
        },
        "finished": finished,
        "problems": problems,
    }
    # A second send of one message can only follow a lost lease or an interrupted send
    # (and each of those is counted).
    report["duplicate_sends_explained"] = seen.replays <= lease_losses
    report["ok"] = bool(
        finished
        and not problems
        and report["duplicates"] == 0
        and report["lost"] == 0
        and report["account_overlaps"] == 0
        and report["order_violations"] == 0
        and report["duplicate_sends_explained"]
    )
    return report


def _hottest(tasks: list[NewTask], seen: GatewayAudit) -> dict[str, Any]:
    """The account with the most messages: one account sends one message at a time, so the
    sum of its requests' durations (``busy_s``) is a lower bound of the drain time."""
    per_account: dict[str, int] = {}
    for t in tasks:
        account = t.payload["account"]
        per_account[account] = per_account.get(account, 0) + 1
    account, messages = max(per_account.items(), key=lambda kv: (kv[1], kv[0]))
    busy = seen.account_busy_s.get(account, 0.0)
    calls = seen.account_calls.get(account, 0)
    return {
        "account": account,
        "messages": messages,
        "share": round(messages / max(1, len(tasks)), 3),
        "calls": calls,
        "busy_s": round(busy, 2),
        "mean_call_ms": round(1000 * busy / calls, 2) if calls else None,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def render(report: dict[str, Any], console: Console) -> None:
    """Print the final report as tables."""
    verdict = "[bold green]OK" if report["ok"] else "[bold red]FAILED"
    table = Table(title=f"asynccoord demo: {verdict}", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    for key in (
        "messages",
        "sent",
        "send_calls",
        "duplicates",
        "duplicate_sends",
        "lost",
        "dead",
        "account_overlaps",
        "order_violations",
        "throughput_per_s",
        "elapsed_s",
    ):
        table.add_row(key, str(report[key]))
    table.add_row("latency p50 / p99 (ms)", f"{report['latency_ms']['p50']} / {report['latency_ms']['p99']}")
    hot = report["hottest_account"]
    table.add_row("hottest account", f"{hot['account']}: {hot['messages']} messages, sending {hot['busy_s']} s")
    for key, value in report["gateway"].items():
        table.add_row(f"gateway {key}", str(value))
    console.line()  # off a terminal the live view's last frame ends without a line break
    console.print(table)
    conflicts = Table(title="coordination events (all processes)")
    conflicts.add_column("event")
    conflicts.add_column("count", justify="right")
    for name, n in report["conflicts"].items():
        conflicts.add_row(name, str(n))
    console.print(conflicts)
    requested = report["config"]["messages_requested"]
    if requested > report["messages"]:
        console.print(
            f"note: --messages {requested} asked for more than the trace holds: replayed all {report['messages']}"
        )
    for fault in report["faults"]:
        console.print(f"fault: {fault}")
    for alert in report["alerts"]:
        console.print(f"alert: {alert['state']} {alert['rule']} value={alert['value']:.3g} > {alert['threshold']}")
    if not report["finished"]:
        console.print("[red]the run stopped before every message was done or dead")
    for problem in report["problems"]:
        console.print(f"[red]problem: {problem}")
    console.print(
        "Trace: BYU PCC Chit-Chat dataset (MIT, (c) 2019 Perception, Control and Cognition Lab), "
        "via chitchat-dataset 0.9.0."
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: run the demo; exit 0 only when the report is ok."""
    opts = parse_args(argv)
    console = None if opts.as_json else Console(stderr=False)
    try:
        report = _run_loop(_sigterm_cancels(run_demo(opts, console)))
    except KeyboardInterrupt:
        print("asynccoord.demo: interrupted; worker processes stopped", file=sys.stderr)
        return 130
    except ValueError as exc:  # bad trace or options
        print(f"asynccoord.demo: {exc}", file=sys.stderr)
        return 2
    except CoordError as exc:  # e.g. --db is not a database
        print(f"asynccoord.demo: {exc}", file=sys.stderr)
        return 2
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
