"""The command line: ``python -m asynccoord COMMAND ...``.

Each subcommand is one :class:`Command` in :data:`COMMANDS`: its name, a one-line help,
a function adding its options to an ``argparse`` parser, and a function running it
that returns the exit status. Adding a command is adding one entry.

Exit status: 0 on success, 1 when the command failed (the error is printed on
standard error, one line), 2 for bad usage: argparse's own errors, and a value the
command's ``check`` refuses (``InvalidArgumentError`` / ``InvalidTypeError``) before
anything touches a database. A command whose output's reader went away (``status | head -1``)
stops printing and exits 0; one whose output cannot be written otherwise (``status >
/dev/full``) says so on standard error, one line, and exits 1 (:mod:`asynccoord.cli.output`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .. import __version__
from .._leftovers import Leftovers, exit_now, guard_exit
from .._printable import printable, shown
from ..errors import CoordError, InvalidArgumentError, InvalidTypeError, ReadOnlyStoreError
from .dashboard import check_dashboard, configure_dashboard, dashboard_command
from .dead import check_dead, configure_dead, dead_command
from .output import OutputClosed, OutputFailed, drop_stdout, write_stdout
from .run import check_run, configure_run, log_left_behind, run_command
from .status import check_status, configure_status, status_command

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
        exits: The exit statuses, one short sentence ending ``--help`` (after the epilog
            ``configure`` set, if any).
    """

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    check: Callable[[argparse.Namespace], object] | None = None
    exits: str = "Exit status: 0 done; 1 failed (one line on standard error); 2 bad usage."


COMMANDS: list[Command] = [
    Command(
        name="status",
        help="queue depth, live nodes, locks, conflict counters and active alerts of a database",
        configure=configure_status,
        run=status_command,
        check=check_status,
        exits="Exit status: 0 printed (a --lock-store that cannot be reached is said in it); 1 the database "
        "failed or is not one of asynccoord, or the output "
        "could not be written; 2 bad usage.",
    ),
    Command(
        name="dead",
        help="list a queue's dead tasks (read-only); 'dead requeue' / 'dead discard' act on them",
        configure=configure_dead,
        run=dead_command,
        check=check_dead,
        exits="Exit status: 0 done; 1 the database failed or, with an action, --queue names no queue of it or "
        "an --id named no dead task (the others were acted on and are named; see 'dead requeue --help'); "
        "2 bad usage.",
    ),
    Command(
        name="run",
        help="host N nodes draining a queue with your send function until SIGTERM, SIGINT or SIGHUP",
        configure=configure_run,
        run=run_command,
        check=check_run,
        exits="Exit status: 0 stopped by SIGTERM, SIGINT or SIGHUP (after the shutdown, even if sends outlived "
        "it); 1 the database, the lock store, the send or the --lifespan failed; 2 bad usage (checked before "
        "anything opens).",
    ),
    Command(
        name="dashboard",
        help="a live read-only web page of a database's status (extra 'dashboard')",
        configure=configure_dashboard,
        run=dashboard_command,
        check=check_dashboard,
        exits="Exit status: 0 stopped by SIGTERM, SIGINT or SIGHUP; 1 the database failed or the address "
        "cannot be served; 2 bad usage (the extra 'dashboard' missing, say).",
    ),
]
"""The subcommands, in ``--help`` order."""


def build_parser(commands: Sequence[Command] | None = None) -> argparse.ArgumentParser:
    """The ``python -m asynccoord`` parser with one subparser per command."""
    parser = argparse.ArgumentParser(
        prog="python -m asynccoord", description="asyncio-native coordination runtime: tools for a cluster"
    )
    parser.add_argument("--version", action="version", version=f"asynccoord {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS if commands is None else commands:
        child = sub.add_parser(command.name, help=command.help, description=command.help)
        command.configure(child)
        child.epilog = f"{child.epilog} {command.exits}" if child.epilog else command.exits
        child.set_defaults(_run=command.run, _check=command.check, _parser=child)
    return parser


def read_only_text(exc: ReadOnlyStoreError, args: argparse.Namespace) -> str:
    """The line for a database a write command cannot write, in the command line's terms.

    The store's own message advises ``SQLiteStore(path, read_only=True)``, a library call;
    here the commands that read without writing are named instead.
    """
    if exc.path is None:
        return str(exc)
    action = getattr(args, "action", None)
    command = args.command if action is None else f"{args.command} {action}"
    return (
        f"{exc.path!r} is read-only for this process ({exc.reason}): 'status' and 'dead' without an action "
        f"can read it; to {command}, give this user write access to the file and its folder (SQLite writes "
        "<file>-wal and <file>-shm beside it)"
    )


def _flush_printed() -> None:
    """Flush what ``--help`` or ``--version`` printed; a refused write is one line and exit status 1.

    Raises:
        SystemExit: 1 when standard output refused the write (a full disk).
    """
    try:
        write_stdout("")
    except OutputClosed:  # `--help | head -1`: the reader took what it wanted
        drop_stdout()
    except OutputFailed as exc:
        drop_stdout()
        sys.stderr.write(f"python -m asynccoord: error: {exc}\n")
        raise SystemExit(1) from None


def main(argv: Sequence[str] | None = None, *, exiting: bool = False) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the command, return the exit status.

    ``exiting``: the process ends when this returns (``python -m asynccoord``): ``run``
    then leaves SIGTERM ignored on its way out instead of putting back the handler it had,
    so a late SIGTERM cannot turn a clean exit into death by signal; and when sends outlived
    ``run``'s shutdown (``asynccoord.run.left_behind``), the process ends here at once with
    the exit status, without waiting for their threads; otherwise threads that still hold the
    process's exit after a short grace are reported the same way and not joined
    (:func:`asynccoord._leftovers.guard_exit`). Default False.
    """
    try:
        args, unknown = build_parser().parse_known_args(argv)
    except SystemExit as exc:
        if exc.code in (0, None):  # --help or --version printed: a failed write shows here, not at exit
            _flush_printed()
        raise
    if unknown:  # said by the command's own parser, with its usage (argparse's top level shows its own)
        args._parser.error(f"unrecognized arguments: {' '.join(unknown)}")
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
        code = run(args)
        write_stdout("")  # what is still buffered: a reader gone shows here, not at the interpreter's exit
    except OutputClosed:  # `status | head -1`: the reader took what it wanted
        drop_stdout()
        code = 0
    except OutputFailed as exc:  # `status > /dev/full`: what is still buffered would fail again at exit
        drop_stdout()
        sys.stderr.write(f"asynccoord {args.command}: error: {shown(exc)}\n")
        code = 1
    except ReadOnlyStoreError as exc:
        sys.stderr.write(f"asynccoord {args.command}: error: {printable(read_only_text(exc, args))}\n")
        code = 1
    except CoordError as exc:
        sys.stderr.write(f"asynccoord {args.command}: error: {shown(exc)}\n")
        code = 1
    except KeyboardInterrupt:
        code = 130
    leftovers: Leftovers | None = getattr(args, "_leftovers", None)
    if exiting and leftovers is not None:
        if leftovers:  # sends outlived `run`'s shutdown: their threads not joined
            exit_now(code)
        guard_exit(
            code, lambda names: log_left_behind(Leftovers(tasks=0, threads=0, other_threads=names), exiting=True)
        )
    return code
