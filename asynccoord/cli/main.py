"""The command line: ``python -m asynccoord COMMAND ...``.

Each subcommand is one :class:`Command` in :data:`COMMANDS`: its name, a one-line help,
a function adding its options to an ``argparse`` parser, and a function running it
that returns the exit status. Adding a command is adding one entry.

Exit status: 0 on success, 1 when the command failed (the error is printed on
standard error, one line), 2 for bad usage: argparse's own errors, and a value the
command's ``check`` refuses (``InvalidArgumentError`` / ``InvalidTypeError``) before
anything touches a database.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import CoordError, InvalidArgumentError, InvalidTypeError
from ..validation import MAX_DURATION_S
from .dashboard import check_dashboard, configure_dashboard, dashboard_command
from .run import check_run, configure_run, run_command, store_options

__all__ = ("COMMANDS", "Command", "build_parser", "main")


@dataclass(frozen=True, slots=True, kw_only=True)
class Command:
    """One subcommand of ``python -m asynccoord``.

    Attributes:
        name: The subcommand's name.
        help: One line shown by ``--help``.
        configure: Adds the subcommand's options to its parser.
        run: Runs it with the parsed arguments; returns the exit status.
        check: Validates the parsed arguments before ``run``, touching nothing; the
            ``InvalidArgumentError`` or ``InvalidTypeError`` it raises is a usage error
            (exit status 2). None: argparse's checks only.
    """

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    check: Callable[[argparse.Namespace], object] | None = None


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value <= MAX_DURATION_S:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0 and <= {MAX_DURATION_S:.0f}, got {text!r}")
    return value


def _configure_status(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        "--store",
        dest="db",
        required=True,
        metavar="TARGET",
        help="the SQLite database file, or a postgresql:// DSN (opened read-only)",
    )
    parser.add_argument(
        "--schema",
        metavar="NAME",
        help="with a postgresql:// --db: the schema of asynccoord's tables (default: the connection's search_path)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object (schema: status.schema.json)")
    parser.add_argument(
        "--window",
        dest="windows_s",
        action="append",
        type=_positive_float,
        metavar="SECONDS",
        help="a window for event rates and latencies (repeatable; default 10 and 60)",
    )
    parser.add_argument(
        "--color", choices=("auto", "always", "never"), default="auto", help="colour in the tables (default auto)"
    )


def _check_status(args: argparse.Namespace) -> None:
    """Refuse a ``--schema`` that is no valid name, or that comes with an SQLite ``--db``, before anything opens."""
    from ..backends.open import open_store

    options = store_options(args)
    if options:
        open_store(args.db, read_only=True, **options)  # validates the name; opens nothing


def _run_status(args: argparse.Namespace) -> int:
    from .status import collect_status, render_status

    windows = tuple(args.windows_s or (10.0, 60.0))
    report = asyncio.run(collect_status(args.db, windows_s=windows, schema=args.schema))
    if args.json:
        sys.stdout.write(json.dumps(report, allow_nan=False, sort_keys=False) + "\n")
    else:
        color = {"auto": None, "always": True, "never": False}[args.color]
        render_status(report, color=color)
    return 0


COMMANDS: list[Command] = [
    Command(
        name="status",
        help="queue depth, live nodes, locks, conflict counters and active alerts of a database",
        configure=_configure_status,
        run=_run_status,
        check=_check_status,
    ),
    Command(
        name="run",
        help="host N nodes draining a queue with your send function until SIGTERM/SIGINT",
        configure=configure_run,
        run=run_command,
        check=check_run,
    ),
    Command(
        name="dashboard",
        help="a live read-only web page of a database's status (extra 'dashboard')",
        configure=configure_dashboard,
        run=dashboard_command,
        check=check_dashboard,
    ),
]
"""The subcommands, in ``--help`` order."""


def build_parser(commands: Sequence[Command] | None = None) -> argparse.ArgumentParser:
    """The ``python -m asynccoord`` parser with one subparser per command."""
    parser = argparse.ArgumentParser(
        prog="python -m asynccoord", description="asyncio-native coordination runtime: tools for a cluster"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS if commands is None else commands:
        child = sub.add_parser(command.name, help=command.help, description=command.help)
        command.configure(child)
        child.set_defaults(_run=command.run, _check=command.check, _parser=child)
    return parser


def main(argv: Sequence[str] | None = None, *, exiting: bool = False) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the command, return the exit status.

    ``exiting``: the process ends when this returns (``python -m asynccoord``): ``run``
    then leaves SIGTERM ignored on its way out instead of putting back the handler it had,
    so a late SIGTERM cannot turn a clean exit into death by signal. Default False.
    """
    args = build_parser().parse_args(argv)
    args._exiting = exiting
    run: Callable[[argparse.Namespace], int] = args._run
    check: Callable[[argparse.Namespace], object] | None = args._check
    if check is not None:
        try:
            check(args)
        except (InvalidArgumentError, InvalidTypeError) as exc:
            parser: argparse.ArgumentParser = args._parser
            parser.error(str(exc))  # usage line, the message, exit status 2
    try:
        return run(args)
    except CoordError as exc:
        sys.stderr.write(f"asynccoord {args.command}: error: {exc}\n")
        return 1
    except KeyboardInterrupt:
        return 130
