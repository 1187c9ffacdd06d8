"""``python -m asynccoord run``: host a Runtime of N nodes until SIGTERM, SIGINT or SIGHUP.

The send function (and optionally the lock-key function) is named as
``package.module:attribute``, the convention of ASGI servers::

    python -m asynccoord run --db bot.db --queue outbox --send mybot.send:deliver \\
        --lock-key mybot.send:account_of --nodes 8 --shutdown-timeout-s 10

On SIGTERM, SIGINT or SIGHUP (its terminal gone) the runtime stops claiming at once, lets sends in flight finish for
up to ``--shutdown-timeout-s``, hands back whatever is left (leases and locks released)
and exits with status 0. Sends that outlive the shutdown (a coroutine ignoring its
cancellation, a blocking call in ``asyncio.to_thread``, in a ``ThreadPoolExecutor`` of its own or
in a ``threading.Thread`` it started) are not waited for: the process logs
``asynccoord.run.left_behind`` with their count and exits at once, still with status 0.
A second signal during the drain hands back at once. One that comes while the run is still
starting ends it the same way, before it claims anything.

``--lifespan mybot.send:client`` names an async context manager function (one made
with :func:`contextlib.asynccontextmanager`, say) entered before the database opens and
left after the nodes have stopped: the place to open and close the send's client (see
:mod:`asynccoord.cli.lifespan`), which the send reaches through its module::

    session: aiohttp.ClientSession  # mybot/send.py; send() posts with it


    @contextlib.asynccontextmanager
    async def client() -> AsyncIterator[None]:
        global session
        async with aiohttp.ClientSession() as session:
            yield

``--db`` takes what :func:`asynccoord.backends.open.open_store` takes: an SQLite file path, an
``sqlite:///PATH`` URL (PATH relative to the current folder, ``sqlite:////PATH`` for an absolute
one, as SQLAlchemy reads them) or a ``postgresql://`` DSN (nodes on many machines).

A signal cuts the ``--lifespan``'s entry short. Its exit gets another ``--shutdown-timeout-s``,
and a signal beyond the one that ended the run cuts it short.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .._leftovers import Leftovers, run_leaving
from .._printable import printable, shown
from .._signals import give_back_signal, take_signal
from .._startsignals import take_start_signals
from ..contract.locks import MAX_PERMITS
from ..contract.ratelimits import RateLimit, describe_limits
from ..errors import CoordError, InvalidArgumentError, InvalidTypeError, StoreError
from ..node.config import MAX_IN_FLIGHT
from ..node.retention import DEFAULT_DONE_RETENTION_S
from ..validation import (
    check_int,
    check_interval_s,
    check_lease_s,
    check_lock_key,
    check_name,
    check_non_negative,
    check_positive,
    check_send,
    is_async_callable,
)
from .lifespan import Lifespan, check_lifespan, open_lifespan
from .loading import load_callable
from .lockstore import add_lock_store_options, check_lock_store_options
from .output import write_stdout
from .runlines import lock_store_line, stopped_line
from .runmonitor import add_monitor_options, alert_sinks, check_monitor_options, export, serve_metrics
from .targethelp import target_help
from .untilsignal import enter_until_signalled

__all__ = ("check_run", "configure_run", "declare_rate_limits", "load_callable", "run_command")

log = logging.getLogger(__name__)

STOP_SIGNALS = (int(signal.SIGTERM), int(signal.SIGINT), int(signal.SIGHUP))
"""The signals that drain and stop ``run``: a supervisor's SIGTERM, Ctrl-C, and SIGHUP (the
terminal or SSH session it was started from went away). SIGHUP only when it is not ignored
already: a run started under ``nohup`` keeps running when its terminal goes away."""

_IGNORED_AT_EXIT = (int(signal.SIGTERM), int(signal.SIGHUP))
"""The stop signals ignored from the end of the teardown: a late one must not turn a clean exit
into death by signal. SIGINT joins them when the process ends with the command
(:func:`_ignored_at_exit`); otherwise it raises KeyboardInterrupt in the caller, as it would
have without ``run``."""


_SWAP_SWITCH_INTERVAL_S = 1.0
"""The switch interval while a stop signal's handler is swapped with other threads alive: the swap
does not let go of the GIL, so no other thread runs between its two calls."""


def _ignored_at_exit(exiting: bool) -> tuple[int, ...]:
    """The stop signals ignored from the end of the teardown on.

    ``exiting`` (``python -m asynccoord``: the process ends with the command): SIGINT too, as a
    KeyboardInterrupt raised while the interpreter exits (joining threads a send started, say)
    prints a traceback and ends the process by SIGINT instead of with the command's status.
    """
    return (*_IGNORED_AT_EXIT, int(signal.SIGINT)) if exiting else _IGNORED_AT_EXIT


def _stop_signals() -> tuple[int, ...]:
    """The :data:`STOP_SIGNALS` this run takes: SIGHUP left out when the process ignores it (``nohup``)."""
    return tuple(s for s in STOP_SIGNALS if not (s == signal.SIGHUP and signal.getsignal(s) == signal.SIG_IGN))


def configure_run(parser: argparse.ArgumentParser) -> None:
    """Add the ``run`` subcommand's options to ``parser``.

    ``--db`` is also spelled ``--store``: an SQLite path, an ``sqlite:///`` URL or a
    ``postgresql://`` DSN (see :func:`~asynccoord.backends.open.open_store`). With a DSN,
    ``--schema NAME`` keeps the tables in a schema of their own
    (``PostgresStore(schema=...)``), created if missing; with an SQLite target it is a
    usage error (exit status 2, see :func:`store_options`).
    """
    parser.add_argument(
        "--db",
        "--store",
        dest="db",
        required=True,
        metavar="TARGET",
        help=target_help(),
    )
    parser.add_argument(
        "--schema",
        metavar="NAME",
        help="with a postgresql:// --db: the schema of asynccoord's tables, created if missing "
        "(default: the connection's search_path)",
    )
    parser.add_argument("--queue", default="default", help="queue to drain (default 'default')")
    parser.add_argument("--send", required=True, metavar="MODULE:ATTR", help="async send(task) function")
    parser.add_argument("--lock-key", metavar="MODULE:ATTR", help="function task -> lock name or None")
    parser.add_argument(
        "--lifespan",
        metavar="MODULE:ATTR",
        help="an async context manager function (made with contextlib.asynccontextmanager, say), called with no "
        "arguments, entered before the database opens and left after the nodes have stopped: open and close "
        "what the send uses (an HTTP session, a bot's client) in it; a signal cuts its entry short, and its exit "
        "gets --shutdown-timeout-s",
    )
    parser.add_argument(
        "--busy-timeout-s",
        type=float,
        metavar="SECONDS",
        help="with an SQLite --db: how long a write waits for another process's write lock before it"
        " fails (default 30; keep it below --lock-ttl-s if a process may hold the file that long)",
    )
    parser.add_argument("--nodes", type=int, default=8, help="nodes in this process (default 8)")
    parser.add_argument("--lease-s", type=float, default=30.0, help="task lease, seconds (default 30)")
    parser.add_argument("--lock-ttl-s", type=float, default=10.0, help="lock lease, seconds (default 10)")
    parser.add_argument("--lock-permits", type=int, default=1, help="permits per lock name (default 1)")
    parser.add_argument("--max-in-flight", type=int, default=32, help="sends at once per node (default 32)")
    parser.add_argument("--send-timeout-s", type=float, default=30.0, help="send timeout, seconds (default 30)")
    parser.add_argument(
        "--send-overrun-s",
        type=float,
        default=None,
        help="how long a send cut at its timeout that ignores the cancellation is still waited for, its lease and "
        "lock kept, seconds (default: the send timeout; 0: not at all)",
    )
    parser.add_argument("--unordered", action="store_true", help="no per-key ordering")
    parser.add_argument(
        "--idle-max-s", type=float, default=1.0, help="longest pause between polls of an idle node, seconds (default 1)"
    )
    parser.add_argument("--heartbeat-ttl-s", type=float, default=5.0, help="membership TTL, seconds (default 5)")
    parser.add_argument(
        "--rate-limit",
        action="append",
        default=[],
        metavar="DIM=COUNT/PERIOD[,burst=N]",
        help="a rate limit of the queue on one dimension of its tasks' limit_keys, e.g. account=30/1s,burst=30; "
        "repeat for several; stored in the database, replacing the queue's stored limits for every process "
        "(a warning names both when they differ; without it, the stored limits stay)",
    )
    parser.add_argument(
        "--clear-rate-limits",
        action="store_true",
        help="remove the queue's stored rate limits before the run (for every process; not with --rate-limit)",
    )
    parser.add_argument(
        "--lock-pace",
        metavar="DIM",
        help="a rate-limit dimension whose sends --lock-key's lock serialises (e.g. account): the lock's holder "
        "also spaces its sends to that limit, so sends that waited for the lock do not leave back to back",
    )
    add_lock_store_options(parser, purpose="to take the nodes' locks in instead of the database")
    parser.add_argument(
        "--done-retention-s",
        type=_retention,
        default=DEFAULT_DONE_RETENTION_S,
        metavar="SECONDS|keep",
        help="delete the queue's done tasks older than this (default 86400, a day); 'keep' keeps them",
    )
    parser.add_argument(
        "--shutdown-timeout-s",
        type=float,
        default=10.0,
        help="drain time at shutdown, seconds (default 10); a --lifespan's exit gets as long again; sends still "
        "running after the shutdown (threads, or sends ignoring cancellation) are not waited for: run exits 0",
    )
    add_monitor_options(parser)


def _retention(text: str) -> float | None:
    """``--done-retention-s``: seconds, or ``keep`` (None: done tasks are kept)."""
    if text.strip().lower() == "keep":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds or 'keep', got {text!r}") from None


def store_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of :func:`~asynccoord.backends.open.open_store` that ``--schema``
    and ``--busy-timeout-s`` give.

    Raises:
        InvalidTypeError: ``--schema`` is not a str.
        InvalidArgumentError: ``--schema`` given with a ``--db`` that is no PostgreSQL DSN
            (an SQLite file has no schemas), ``--busy-timeout-s`` with one that is, or a
            ``--busy-timeout-s`` that is not a positive number of seconds.
    """
    from ..backends.open import is_postgres_target, redact_target, schema_options
    from ..config import StoreConfig

    schema = getattr(args, "schema", None)
    postgres = is_postgres_target(os.fspath(args.db))
    if isinstance(schema, str) and not postgres:  # in the command line's words
        raise InvalidArgumentError(
            f"--schema {schema!r} applies to a postgresql:// --db only, got --db {redact_target(args.db)!r}"
        )
    options = schema_options(args.db, schema)
    busy_timeout_s = getattr(args, "busy_timeout_s", None)
    if busy_timeout_s is not None:
        if postgres:
            raise InvalidArgumentError(
                f"--busy-timeout-s applies to an SQLite --db only, got --db {redact_target(args.db)!r}"
            )
        check_positive("--busy-timeout-s", busy_timeout_s)
        options["config"] = StoreConfig(busy_timeout_s=busy_timeout_s)
    return options


def parse_target(args: argparse.Namespace, **options: Any) -> Any:
    """The store ``--db`` (and ``--schema``) name, made but not opened: the target parsed, nothing connected.

    Raises:
        InvalidArgumentError: ``--schema`` is no valid name or comes with an SQLite ``--db``,
            or ``--db`` is a PostgreSQL DSN and asyncpg is not installed.
        InvalidTypeError: ``--schema`` is not a str.
    """
    from ..backends.open import open_store, redact_target

    try:
        return open_store(args.db, **options, **store_options(args))
    except StoreError as exc:  # a PostgreSQL DSN but no asyncpg
        raise InvalidArgumentError(f"--db {redact_target(args.db)!r}: {exc}") from exc


def check_run(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """Validate the ``run`` subcommand's arguments before anything touches the database.

    Returns:
        ``(send, lock_key, config)``: the loaded callables (``lock_key`` None when not
        given) and the :class:`~asynccoord.node.config.NodeConfig` they make.

    Raises:
        InvalidArgumentError, InvalidTypeError: an option is out of range, ``--db`` is no
            target :func:`~asynccoord.backends.open.open_store` takes (or a PostgreSQL DSN without
            asyncpg installed, or an in-memory SQLite database), ``--schema`` is no valid
            schema name or comes with an SQLite ``--db``, or a ``MODULE:ATTR``
            cannot be imported or is not callable, or names a ``--send`` or ``--lock-key``
            the nodes refuse (an async ``--lock-key``, a generator ``--send``): the command
            line reports it as a usage error, exit status 2. A plain (not async) ``--send`` is
            run, with a warning (``run_command``): a decorator's plain wrapper may return the
            coroutine, which cannot be told from a blocking send before it is called.
    """
    from ..backends.open import redact_target
    from ..node import NodeConfig

    # Each option is checked here under its own spelling; NodeConfig would name its field.
    check_int("--nodes", args.nodes, minimum=1, maximum=4096)
    check_name("--queue", args.queue)
    check_lease_s("--lease-s", args.lease_s)
    check_lease_s("--lock-ttl-s", args.lock_ttl_s)
    check_int("--lock-permits", args.lock_permits, minimum=1, maximum=MAX_PERMITS)
    check_int("--max-in-flight", args.max_in_flight, minimum=1, maximum=MAX_IN_FLIGHT)
    check_positive("--send-timeout-s", args.send_timeout_s)
    if args.send_overrun_s is not None:
        check_non_negative("--send-overrun-s", args.send_overrun_s)
    check_lease_s("--heartbeat-ttl-s", args.heartbeat_ttl_s)
    check_positive("--shutdown-timeout-s", args.shutdown_timeout_s)
    check_interval_s("--idle-max-s", args.idle_max_s)
    if args.done_retention_s is not None:
        check_positive("--done-retention-s", args.done_retention_s)
    store = parse_target(args)
    if str(getattr(store, "path", "")) == ":memory:":
        raise InvalidArgumentError(
            f"--db {args.db!r} is an in-memory SQLite database, which no other process can reach: give a file"
        )
    if getattr(args, "clear_rate_limits", False) and rate_limits(args):
        raise InvalidArgumentError("--clear-rate-limits and --rate-limit contradict each other: give one")
    if rate_limits(args) and not hasattr(store, "set_rate_limits"):
        raise InvalidArgumentError(f"--rate-limit: the store of --db {redact_target(args.db)!r} enforces no limits")
    check_lock_store_options(args)  # the URL and prefix; opens nothing
    check_monitor_options(args)
    pace = getattr(args, "lock_pace", None)
    if pace is not None:
        check_name("--lock-pace", pace)
        if not args.lock_key:
            raise InvalidArgumentError(f"--lock-pace {pace!r} paces the sends of a lock: give --lock-key too")
        if args.lock_permits != 1:
            raise InvalidArgumentError(
                f"--lock-pace {pace!r} needs a lock, not a semaphore: --lock-permits is {args.lock_permits}"
            )
    send = _function("--send", args.send, check_send)
    lock_key = _function("--lock-key", args.lock_key, check_lock_key) if args.lock_key else None
    if getattr(args, "lifespan", None):
        check_lifespan(args.lifespan, load_callable(args.lifespan))
    config = NodeConfig(
        queue=args.queue,
        lease_s=args.lease_s,
        lock_ttl_s=args.lock_ttl_s,
        lock_permits=args.lock_permits,
        max_in_flight=args.max_in_flight,
        send_timeout_s=args.send_timeout_s,
        send_overrun_s=args.send_overrun_s,
        ordered=not args.unordered,
        idle_max_s=args.idle_max_s,
        idle_min_s=min(0.05, args.idle_max_s),
        lock_pace_dimension=pace,
    )
    return send, lock_key, config


def _function(option: str, spec: str, check: Callable[[object], None]) -> Any:
    """The function ``spec`` names, refused here when the nodes would refuse it (``check``).

    Raises:
        InvalidArgumentError, InvalidTypeError: as :func:`load_callable`, or what ``check``
            refuses, named by ``option`` (a ``--lock-key`` async function says what it must be).
    """
    fn = load_callable(spec)
    if option == "--lock-key" and is_async_callable(fn):
        raise InvalidTypeError(
            f"--lock-key {spec!r} is an async function: give a plain function taking the task and returning "
            "the lock name (str) or None (the nodes call it without awaiting)"
        )
    try:
        check(fn)
    except InvalidTypeError as exc:
        raise InvalidTypeError(f"{option} {spec!r}: {exc}") from exc
    return fn


def rate_limits(args: argparse.Namespace) -> list[Any]:
    """The queue's limits from ``--rate-limit`` options (empty when none was given).

    Raises:
        InvalidArgumentError: an option not of the form ``DIM=COUNT/PERIOD[,burst=N]``, or
            two on one dimension.
    """
    from ..contract.ratelimits import check_rate_limits, parse_rate_limit

    try:
        return check_rate_limits([parse_rate_limit(text) for text in getattr(args, "rate_limit", None) or []])
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"--rate-limit: {exc}") from exc


async def declare_rate_limits(store: Any, queue: str, limits: Sequence[RateLimit]) -> None:
    """Declare ``limits`` for ``queue`` in ``store`` (``--rate-limit``; none: ``--clear-rate-limits``).

    When the queue's stored limits differ, logs ``asynccoord.run.rate_limits_replaced`` at
    WARNING first, naming the stored limits and the new ones: every process draining the
    queue enforces the new ones from its next claim on (and logs
    ``asynccoord.rate_limits.changed``, see :mod:`asynccoord.backends.limitwatch`).
    Limits declared where none were stored log ``asynccoord.run.rate_limits_declared`` at
    INFO (processes starting together may each declare them); identical limits log nothing.

    Raises:
        StoreError: the store failed.
    """
    stored = await store.rate_limits(queue)
    if not stored and limits:  # declared for the first time (or by processes starting together)
        log.info("asynccoord.run.rate_limits_declared queue=%r limits=[%s]", queue, printable(describe_limits(limits)))
    elif sorted(stored, key=_dimension) != sorted(limits, key=_dimension):
        log.warning(
            "asynccoord.run.rate_limits_replaced queue=%r stored=[%s] new=[%s]: the limits stored for the queue "
            "are replaced, and every process draining it enforces the new ones from now on",
            queue,
            printable(describe_limits(stored)),
            printable(describe_limits(limits)),
        )
    await store.set_rate_limits(queue, limits)


def _dimension(limit: RateLimit) -> str:
    return limit.dimension


def run_command(args: argparse.Namespace) -> int:
    """Run the ``run`` subcommand; return the exit status (0 on a clean shutdown).

    SIGTERM, SIGINT and SIGHUP (unless ignored when the run starts, as under ``nohup``: it
    stays ignored) never end the process midway: one that came while ``python -m asynccoord``
    was still importing (see :mod:`asynccoord._startsignals`) ends the run before anything
    starts; while the store opens and the nodes start they are held (the runtime then stops
    at once), during the run the runtime's
    :meth:`~asynccoord.node.runtime.Runtime.wait_for_signal` takes them (a second one hands
    back at once), and while the nodes, the monitor and the store close down they are held
    again. From the end of the teardown SIGTERM and SIGHUP are ignored; on return their
    handlers from before are put back, unless ``args._exiting`` (set by ``python -m asynccoord``: the
    process is on its way out).

    A ``--lifespan`` is entered before the database opens: a signal while it is being
    entered cuts the entry short and the run ends there (exit status 0). It is left after
    the database has closed, as after a clean run whatever ended the run, within its own
    ``--shutdown-timeout-s``; running longer, or a signal beyond the first, cuts it short.
    An exception it raises, or cutting its exit short, ends the command with exit status 1
    (a run's own error goes first, and the lifespan's failure is logged).

    Once the runtime, the monitor, the store and the lifespan are closed, sends still running
    (asyncio tasks that ignored their cancellation, calls in the loop's default executor such
    as ``asyncio.to_thread``) are not waited for (see :mod:`asynccoord._leftovers`): one
    WARNING line ``asynccoord.run.left_behind asyncio_tasks=N threads=M other_threads=K (names)``
    counts them (and names the other non-daemon threads started during the run and still alive)
    and the command returns its status, 0 for a clean stop (the shutdown did what it promises:
    the rest was handed back, and a send left running keeps its task claimed until its lease
    lapses). ``args._leftovers`` then holds the counts, and ``python -m asynccoord`` ends the
    process at once, without joining those threads. With nothing left there, ``python -m
    asynccoord`` exits as usual, but threads that still hold its exit after a short grace (a
    send's own ``ThreadPoolExecutor`` or ``threading.Thread``; idle pool workers end at once) get
    the same line, and the process ends without joining them (:func:`asynccoord._leftovers.guard_exit`).
    """
    from ..backends.open import describe_target, open_store
    from ..monitor.monitor import Monitor
    from ..node import Runtime

    send, lock_key, config = check_run(args)  # before the database is touched
    if not is_async_callable(send):  # a decorator's plain wrapper that returns the coroutine is fine
        log.warning(
            "asynccoord.run.send_not_async send=%r: a plain function, not async def; the nodes share one "
            "event loop, so a send that blocks (a synchronous HTTP call, say) stalls them all",
            args.send,
        )
    path = getattr(parse_target(args), "path", None)  # an SQLite file: say so when the run creates it (a typo?)
    created = isinstance(path, str) and not os.path.exists(path)
    limits = rate_limits(args)
    clear_limits = bool(getattr(args, "clear_rate_limits", False))

    async def main() -> int:
        # While the store opens and the nodes start, and again while they close down, SIGTERM
        # and SIGINT are held here (noted, not fatal); the runtime takes them for its wait.
        loop = asyncio.get_running_loop()
        held: list[int] = []
        signalled = asyncio.Event()  # set by each signal held here: it cuts the lifespan's entry and exit short
        running: list[Runtime] = []  # the runtime, once made
        handed_back_before: list[int] = []  # the nodes' hand-backs when the stop began, for the stop line

        def note(signum: int) -> None:
            held.append(signum)
            signalled.set()
            if running and not handed_back_before:  # in the signal's callback: before the stop hands anything back
                handed_back_before.append(sum(state.handed_back for state in running[0].states()))

        stops = _stop_signals()
        holding = _hold_signals(loop, note, stops)
        for signum in take_start_signals():  # came while the process was starting: nothing starts
            note(signum)
        try:
            async with contextlib.AsyncExitStack() as stack:
                metrics = stack.enter_context(serve_metrics(args))  # a taken port: stop before the database
                if getattr(args, "lifespan", None):  # left last: after the nodes and the database
                    lifespan = open_lifespan(args.lifespan)
                    if not await lifespan.enter(signalled, exit_timeout_s=args.shutdown_timeout_s):
                        return 0
                    stack.push_async_exit(_leaving(lifespan, signalled, args.shutdown_timeout_s, held))
                if held:  # a signal came already: nothing to start
                    log.info("asynccoord.serve.stopped signal=%s", held[0])
                    return 0
                lock_store = check_lock_store_options(args)
                # A server that never answers keeps each open for its connect timeout: a signal ends it.
                if lock_store is not None and not (await enter_until_signalled(stack, lock_store, signalled))[0]:
                    log.info("asynccoord.serve.stopped signal=%s", held[0])  # before the database is created
                    return 0
                opened, store = await enter_until_signalled(
                    stack, open_store(args.db, **store_options(args)), signalled
                )
                if not opened:
                    log.info("asynccoord.serve.stopped signal=%s", held[0])
                    return 0
                if limits or clear_limits:  # declared for every process of the database, before any node claims
                    await declare_rate_limits(store, args.queue, limits)
                runtime = Runtime(
                    store,
                    send=send,
                    nodes=args.nodes,
                    config=config,
                    lock_key=lock_key,
                    lock_store=lock_store,
                    heartbeat_ttl_s=args.heartbeat_ttl_s,
                    shutdown_timeout_s=args.shutdown_timeout_s,
                    done_retention_s=args.done_retention_s,
                )
                running.append(runtime)
                # The monitor flushes this process's counters (and a separate lock store's) for `status`,
                # under the id its nodes and locks carry; "nodes" tells `status` how many it hosts.
                monitor = Monitor(
                    store,
                    lock_store=lock_store,
                    sinks=alert_sinks(args),
                    process_id=runtime.instance_id,
                    info={"command": "run", "queue": args.queue, "nodes": args.nodes},
                )
                export(metrics, store, monitor, lock_store, args.queue)
                async with monitor, runtime:
                    target = describe_target(args.db, args.schema)
                    nodes = f"{args.nodes} node{'' if args.nodes == 1 else 's'}"
                    fresh = " (a new database, created now)" if created else ""
                    write_stdout(f"asynccoord: {nodes} draining {args.queue!r} of {target}{fresh}\n")
                    if lock_store is not None:
                        write_stdout(lock_store_line(lock_store))
                    if held:  # a signal came while starting: stop at once
                        signum = held[0]
                        await runtime.shutdown()
                    else:  # the wait shares the handlers held here: no moment without one
                        signum = await runtime.wait_for_signal(stops)
                    log.info("asynccoord.serve.stopped signal=%s", signum)
                # the nodes stopped, the monitor closed; no signal noted (a stop some other way): all at the stop
                before = handed_back_before[0] if handed_back_before else 0
                write_stdout(stopped_line(signum, runtime.states(), handed_back_before=before))
        finally:
            # On the way out: a late SIGTERM or SIGHUP must not turn a clean exit into death by signal.
            _stop_holding(loop, holding, note, _ignored_at_exit(bool(getattr(args, "_exiting", False))))
        return 0

    previous = {signum: signal.getsignal(signum) for signum in _IGNORED_AT_EXIT}
    try:
        return _run_loop(main, args)
    finally:
        if not getattr(args, "_exiting", False):
            for signum, before in previous.items():
                if before is not None:
                    with contextlib.suppress(ValueError):  # not the main thread
                        signal.signal(signum, before)


def _leaving(lifespan: Lifespan, signalled: asyncio.Event, timeout_s: float, held: list[int]) -> Any:
    """The exit callback of ``lifespan`` in the run's exit stack.

    The lifespan is left as after a clean run. When an error of the run is on its way
    out, a failure of the exit is logged and the run's error goes on; otherwise it is
    raised.
    """

    async def leave(exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        try:
            await lifespan.exit(signalled, timeout_s, hurry=len(held) > 1)
        except CoordError as failed:
            if exc is None:
                raise
            log.error("asynccoord.run.lifespan_exit_failed %s (after the run's own error)", shown(failed))
        return False

    return leave


def _hold_signals(
    loop: asyncio.AbstractEventLoop, note: Callable[[int], None], signals: Sequence[int] = STOP_SIGNALS
) -> list[int]:
    """Have ``signals`` (the stop signals) call ``note`` instead of ending the process; return those taken.

    Taken through :func:`~asynccoord._signals.take_signal`, as the runtime's wait takes
    them, so the wait shares these handlers (both are called) rather than replacing them.
    """
    return [signum for signum in signals if take_signal(loop, signum, note)]


def _stop_holding(
    loop: asyncio.AbstractEventLoop,
    taken: list[int],
    note: Callable[[int], None],
    ignored: Sequence[int] = _IGNORED_AT_EXIT,
) -> None:
    """Give the held signals back and leave ``ignored`` ignored, with no moment of their default action.

    Giving a loop's handler back resets the signal to its default action before the
    handler from before (and then ``SIG_IGN``) can be set: a supervisor's repeated SIGTERM
    landing in that moment killed the process at the very end of a clean shutdown. So
    the signals left handled (SIGINT, unless the process is exiting) go back first, and the
    ``ignored`` ones (SIGTERM and SIGHUP, see :func:`_ignored_at_exit`) last, each straight
    followed by ``SIG_IGN``, while it is blocked if the main thread is the process's only OS
    thread (as it is when nothing started threads): a signal that comes meanwhile stays
    pending and is discarded by ``SIG_IGN``, and the thread's signal mask is then put back
    as it was.
    With other threads alive (a send's ``asyncio.to_thread``, uvloop's resolver threads)
    the block would only send the signal to one of them, so it is not used; the switch
    interval is then raised for the swap, so no other thread takes the GIL between the two
    calls, and the moment lasts the few microseconds between two ``sigaction`` calls.
    Ignored, they cannot kill the process between the teardown and its exit.
    """
    for signum in sorted(taken, key=lambda s: s in ignored):  # the ignored ones last
        if signum in ignored:
            with _blocked_if_alone(signum):
                give_back_signal(loop, signum, note)
                signal.signal(signum, signal.SIG_IGN)
        else:
            give_back_signal(loop, signum, note)
    taken.clear()
    for signum in ignored:
        with contextlib.suppress(ValueError):  # not the main thread
            signal.signal(signum, signal.SIG_IGN)


def _os_threads() -> int:
    """Threads of this process as the OS counts them (uvloop's libuv workers included), where it says."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


@contextlib.contextmanager
def _blocked_if_alone(signum: int) -> Iterator[None]:
    """Block ``signum`` in this thread for the block if it is the main and only thread; then restore the mask.

    Otherwise the switch interval is raised to :data:`_SWAP_SWITCH_INTERVAL_S` for the block, and put back.
    """
    block = (
        hasattr(signal, "pthread_sigmask")
        and threading.current_thread() is threading.main_thread()
        and _os_threads() == 1
    )
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signum}) if block else None
    interval = sys.getswitchinterval()
    if not block:
        sys.setswitchinterval(_SWAP_SWITCH_INTERVAL_S)  # the GIL stays with this thread for the swap
    try:
        yield
    finally:
        if before is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)
        sys.setswitchinterval(interval)


def _run_loop(main: Any, args: argparse.Namespace) -> int:
    """Run ``main()`` to completion; what outlives it is logged and put on ``args._leftovers``, not waited for.

    ``args._leftovers`` is set in any case (empty when nothing was left): the process's exit may
    then still find threads alive, for :func:`log_left_behind` under ``python -m asynccoord``.
    """
    args._leftovers = Leftovers(tasks=0, threads=0)

    def left(leftovers: Leftovers) -> None:
        args._leftovers = leftovers
        log_left_behind(leftovers, exiting=bool(getattr(args, "_exiting", False)))

    return int(run_leaving(main(), left))


_NAMES_SHOWN = 4
"""How many names of threads still alive the ``left_behind`` line shows."""


def log_left_behind(leftovers: Leftovers, *, exiting: bool) -> None:
    """Log the one WARNING line ``asynccoord.run.left_behind`` for ``leftovers``.

    It counts asyncio tasks and default-executor calls still running (sends that ignored their
    cancellation, calls in ``asyncio.to_thread``) and names the other non-daemon threads still
    alive (``other_threads=N (name, ...)``: a send's own pool or thread, say), and says
    whether the process exits now (``exiting``) or the command returns.
    """
    others = leftovers.other_threads
    names = ", ".join(others[:_NAMES_SHOWN]) + (
        f", +{len(others) - _NAMES_SHOWN} more" if len(others) > _NAMES_SHOWN else ""
    )
    what = []
    if leftovers.tasks or leftovers.threads:
        what.append("work still running after the shutdown (sends that ignored their cancellation, calls in threads)")
    if others:
        what.append("threads still alive that the interpreter would join at its exit (not daemon threads)")
    log.warning(
        "asynccoord.run.left_behind asyncio_tasks=%d threads=%d other_threads=%d%s: %s %s not waited for; %s",
        leftovers.tasks,
        leftovers.threads,
        len(others),
        f" ({printable(names)})" if others else "",
        " and ".join(what),
        "are" if others else "is",  # "work ... is", "threads ... are", "work and threads ... are"
        "the process exits now" if exiting else "the command returns now",
    )
