"""``python -m asynccoord dashboard``: a live, read-only web page of a cluster's status.

It opens the database read-only as ``status`` does (:func:`~asynccoord.cli.status.open_status_store`),
takes :func:`~asynccoord.cli.status.status_report` of it every ``--interval-s`` (the report
``status --json`` prints, so the page and ``status`` agree) and serves the page of
:mod:`asynccoord.monitor.dashboard` until SIGINT, SIGTERM or SIGHUP (its terminal gone; unless
ignored when it starts, as under ``nohup``), each a clean stop with exit status 0, as ``run``::

    python -m asynccoord dashboard --db bot.db            # http://127.0.0.1:8765/

The web server is the optional extra ``dashboard`` (aiohttp): without it the command says
which package to install, a usage error (exit status 2). On an address other than loopback it needs an access token
(``--token`` or ``ASYNCCOORD_DASHBOARD_TOKEN``) that every request must then carry.
With many queues the page lists the 200 with the most tasks pending, running or dead (the
totals count them all), and charts all queues together and the 8 busiest
(:class:`~asynccoord.monitor.dashboard.feed.Feed`). Text from the database reaches the page
escaped as ``status`` prints it (:mod:`asynccoord.cli.printable`): control characters and
bidirectional overrides as ``\\x1b`` and ``\\u202e``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from .._loop import run as run_loop
from ..errors import InvalidArgumentError, StoreError
from ..validation import check_int, check_interval_s
from .lockstore import LOCK_STORE_WAIT_S, REDIS_SCHEMES, ReportedLockStore, open_lock_store
from .output import write_stdout
from .run import STOP_SIGNALS, parse_target
from .targethelp import target_help
from .untilsignal import enter_until_signalled

if TYPE_CHECKING:
    from ..monitor.dashboard.app import Dashboard

__all__ = (
    "MIN_INTERVAL_S",
    "TOKEN_ENV",
    "check_dashboard",
    "configure_dashboard",
    "dashboard_command",
    "open_dashboard",
)

TOKEN_ENV = "ASYNCCOORD_DASHBOARD_TOKEN"
"""The environment variable read for the access token when ``--token`` is not given."""

MIN_INTERVAL_S = 0.1
"""The shortest ``--interval-s``: each snapshot reads the whole status, so a shorter interval keeps a core busy."""

INSTALL_HINT = "the dashboard needs its web server: pip install 'asynccoord[dashboard]'"


def configure_dashboard(parser: argparse.ArgumentParser) -> None:
    """Add the ``dashboard`` options to ``parser``."""
    parser.add_argument(
        "--db",
        "--store",
        dest="db",
        required=True,
        metavar="TARGET",
        help=target_help("opened read-only"),
    )
    parser.add_argument(
        "--schema",
        metavar="NAME",
        help="with a postgresql:// --db: the schema of asynccoord's tables (default: the connection's search_path)",
    )
    parser.add_argument(
        "--lock-store", metavar="URL", help="a redis:// URL: also show the locks held in Redis, after the database's"
    )
    parser.add_argument(
        "--lock-prefix",
        default="asynccoord:",
        metavar="PREFIX",
        help="key prefix of --lock-store (default asynccoord:)",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to serve on (default 127.0.0.1: this machine only)"
    )
    parser.add_argument("--port", type=int, default=8765, help="TCP port (default 8765; 0: any free port)")
    parser.add_argument(
        "--token",
        default=None,
        help=f"access token every request must carry (Authorization: Bearer TOKEN or ?token=TOKEN), "
        f"at least 16 characters; required on a non-loopback --host (default: ${TOKEN_ENV})",  # MIN_TOKEN_CHARS
    )
    parser.add_argument("--show-payloads", action="store_true", help="show task payloads and results (default: hidden)")
    parser.add_argument(
        "--interval-s",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help=f"time between snapshots, at least {MIN_INTERVAL_S} (default 1)",
    )


def _token(args: argparse.Namespace) -> str | None:
    token: str | None = args.token if args.token is not None else os.environ.get(TOKEN_ENV) or None
    return token


def check_dashboard(args: argparse.Namespace) -> None:
    """Refuse bad options before anything opens: a non-loopback host without a token, a bad port...

    Raises:
        InvalidArgumentError: the option at fault, named; or the extra ``dashboard`` is not
            installed (a usage error, exit status 2, as ``run``'s options of other extras).
    """
    check_int("--port", args.port, minimum=0, maximum=65535)
    interval_s = check_interval_s("--interval-s", args.interval_s)
    if interval_s < MIN_INTERVAL_S:
        raise InvalidArgumentError(
            f"--interval-s must be >= {MIN_INTERVAL_S} seconds (MIN_INTERVAL_S: each snapshot reads the whole "
            f"status, a shorter interval keeps a core busy), got {args.interval_s!r}"
        )
    if args.lock_store is not None and not args.lock_store.startswith(REDIS_SCHEMES):
        raise InvalidArgumentError("--lock-store takes a redis://, rediss:// or unix:// URL")
    parse_target(args, read_only=True)  # parses the target and schema; opens nothing
    try:
        from ..monitor.dashboard.app import check_exposure
    except ImportError:
        raise InvalidArgumentError(INSTALL_HINT) from None
    check_exposure(args.host, _token(args))


@contextlib.asynccontextmanager
async def open_dashboard(
    target: str | os.PathLike[str],
    *,
    schema: str | None = None,
    lock_store: str | None = None,
    lock_prefix: str = "asynccoord:",
    host: str = "127.0.0.1",
    port: int = 8765,
    token: str | None = None,
    show_payloads: bool = False,
    interval_s: float = 1.0,
    windows_s: Sequence[float] = (10.0, 60.0),
) -> AsyncIterator[Dashboard]:
    """Serve the dashboard of the database at ``target`` until the block ends.

    Args:
        target: SQLite file or PostgreSQL DSN, opened read-only.
        schema: With a PostgreSQL DSN, the schema of the tables. Default None.
        lock_store: A ``redis://`` URL whose locks are shown too, after the database's. One that
            cannot be opened or read (down, or not answering within
            :data:`~asynccoord.cli.lockstore.LOCK_STORE_WAIT_S`) is the page's banner until it
            can: the dashboard starts all the same, and opens it once it answers. Default None.
        lock_prefix: The key prefix of ``lock_store``. Default ``"asynccoord:"``.
        host: Address to bind. Default 127.0.0.1.
        port: TCP port, 0 for any free one. Default 8765.
        token: Access token (required on a non-loopback ``host``). Default None.
        show_payloads: Show task payloads and results. Default False.
        interval_s: Time between snapshots, seconds. Default 1.
        windows_s: Windows of the report's rates and latencies, seconds. Default (10, 60).

    Raises:
        StoreError: the extra ``dashboard`` (or ``redis`` for ``lock_store``) is not installed,
            or the database cannot be read.
        InvalidArgumentError: as :func:`~asynccoord.monitor.dashboard.app.check_exposure`.
        OSError: the address cannot be bound.
    """
    try:
        from ..monitor.dashboard.app import check_exposure, serve
        from ..monitor.dashboard.feed import Feed
    except ImportError as exc:
        raise StoreError(INSTALL_HINT) from exc
    from .printable import printable_report
    from .status import open_status_store, status_report

    check_exposure(host, token)
    async with contextlib.AsyncExitStack() as stack:
        store, label = await stack.enter_async_context(open_status_store(target, schema=schema))
        reported: ReportedLockStore | None = None
        if lock_store is not None:
            try:
                from ..backends import redis as _redis  # noqa: F401
            except ImportError as exc:
                raise StoreError("--lock-store redis://... needs redis-py: pip install 'asynccoord[redis]'") from exc
            locks = open_lock_store(lock_store, prefix=lock_prefix, reconnect_timeout_s=LOCK_STORE_WAIT_S)
            # Opened by the first snapshot that reaches it: a lock store down at launch is the page's banner.
            reported = ReportedLockStore(locks)
            stack.push_async_callback(reported.aclose)

        async def snapshot() -> dict[str, Any]:
            error = None if reported is None else await reported.reach()
            report = await status_report(
                store,
                windows_s=windows_s,
                db=label,
                lock_store=None if reported is None else reported.store,
                lock_store_error=error,
            )
            # Escaped as status and dead print them: a queue name's bidirectional override or
            # ESC shows as \u202e or \x1b on the page too, never as the text it would disguise.
            printable: dict[str, Any] = printable_report(report)
            return printable

        feed = Feed(snapshot, interval_s=interval_s, show_payloads=show_payloads)
        yield await stack.enter_async_context(serve(feed, host=host, port=port, token=token))


def dashboard_command(args: argparse.Namespace) -> int:
    """Run ``python -m asynccoord dashboard`` until SIGINT, SIGTERM or SIGHUP; return the exit status (0 then)."""
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        sys.stderr.write(f"asynccoord dashboard: error: {INSTALL_HINT}\n")
        return 1
    token = _token(args)

    async def serve_until_signal() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        # Those that stop run: SIGHUP too (the terminal went away), unless ignored when starting (nohup).
        signals = [s for s in STOP_SIGNALS if not (s == signal.SIGHUP and signal.getsignal(s) == signal.SIG_IGN)]
        for sig in signals:
            loop.add_signal_handler(sig, stop.set)
        try:
            async with contextlib.AsyncExitStack() as stack:
                opening = open_dashboard(
                    args.db,
                    schema=args.schema,
                    lock_store=args.lock_store,
                    lock_prefix=args.lock_prefix,
                    host=args.host,
                    port=args.port,
                    token=token,
                    show_payloads=args.show_payloads,
                    interval_s=args.interval_s,
                )
                # A server that never answers keeps the open for its connect timeout: a signal ends it.
                opened, dashboard = await enter_until_signalled(stack, opening, stop)
                if not opened:
                    return
                hint = " (add ?token=TOKEN, or send Authorization: Bearer TOKEN)" if token else ""
                write_stdout(f"asynccoord dashboard: serving {dashboard.url}{hint}; Ctrl+C to stop\n")
                await stop.wait()
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)

    try:
        run_loop(serve_until_signal())
    except OSError as exc:
        sys.stderr.write(f"asynccoord dashboard: error: cannot serve on {args.host}:{args.port}: {exc}\n")
        return 1
    return 0
