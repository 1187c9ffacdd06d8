"""``python -m asynccoord dead``: list a queue's dead tasks, then requeue or discard them.

::

    python -m asynccoord dead --db bot.db --queue outbox                # the first 50, by id
    python -m asynccoord dead --db bot.db --queue outbox --after 812    # the next page
    python -m asynccoord dead requeue --db bot.db --queue outbox --id 812 --id 815
    python -m asynccoord dead discard --db bot.db --queue outbox --all

The listing opens the database read-only, as ``status`` does
(:func:`~asynccoord.cli.status.open_status_store`): it writes nothing, applies no migration,
and never blocks the nodes. It shows each task's id, conversation (partition key), attempts,
when it died and its last error, shortened; ``--json`` prints every error whole. Payloads
are hidden unless ``--show-payloads``: they hold the users' messages.

``requeue`` and ``discard`` write through the store's
:meth:`~asynccoord.contract.queue.QueueStore.requeue_dead` and
:meth:`~asynccoord.contract.queue.QueueStore.discard_dead`, and print how many tasks changed.
They first open the database read-only too, so a mistyped ``--db`` or ``--schema`` creates
no database and migrates none. A queue the database does not know (no task ever, no
setting: a misspelt ``--queue``) is an error, exit status 1, naming the queues it knows;
nothing is acted on. With ``--id``, standard output names the ids acted on, and an id that
names no dead task of the queue (it was requeued meanwhile, or is another queue's) is left as
it is and named on standard error: the exit status is then 1, the other ids having still been
acted on. A listing that finds no task of the queue at all says so in a note, exit status 0.

``--json`` prints one object: ``db``, ``queue``, ``dead_letter_policy`` (``skip`` or
``hold``), ``after_id``, ``limit``, ``payloads_shown``, ``next_after`` (the ``--after`` of the
next page; null when this page is the last), and ``tasks``, each with ``id``,
``partition_key``, ``partition``, ``idempotency_key``, ``priority``, ``attempts``,
``max_attempts``, ``created_at``, ``updated_at`` (seconds since the epoch, store clock) and
``last_error``, plus ``payload`` with ``--show-payloads``. A payload stored as text that
cannot be decoded (a row written by another tool: see
:class:`~asynccoord.errors.UnreadableRowError`) is listed too: its ``payload_unreadable``
holds ``length`` (the stored text's, in characters) and ``reason``, and with
``--show-payloads`` ``text`` (as stored, its first 4,096 characters at most), its ``payload``
being null; the table shows the text marked ``(unreadable)``, or with payloads hidden names
such tasks' ids in a note.

Exit status as for every command (:mod:`asynccoord.cli.main`): 0 done, 1 the database
failed or is not one of asynccoord, the queue is unknown, or an ``--id`` named no dead task
(the others were acted on), 2 bad usage (neither ``--id`` nor ``--all``, say).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import IO, Any

from ..contract.queue import MAX_DEAD_LETTERS_LIMIT, MAX_ID
from ..errors import (
    InvalidArgumentError,
    NotADatabaseError,
    SchemaVersionError,
    TaskNotFoundError,
    UnreadableRowError,
)
from ..models import Task, TaskStatus, UnreadableValue
from ..validation import check_int, check_name
from .output import table_console, write_stdout
from .printable import printable, printable_report
from .run import parse_target
from .status import open_status_store
from .targethelp import target_help

__all__ = (
    "DEFAULT_LIMIT",
    "ERROR_CHARS",
    "Settled",
    "check_dead",
    "collect_dead_letters",
    "configure_dead",
    "dead_command",
    "older_schema_error",
    "render_dead_letters",
    "settle_dead_letters",
    "shorten",
    "unknown_queue_error",
)

DEFAULT_LIMIT = 50
"""Dead tasks one listing shows unless ``--limit`` says otherwise."""

ERROR_CHARS = 60
"""Characters of a task's last error the table shows (``--json`` shows all)."""

_PAYLOAD_CHARS = 40
_KEY_CHARS = 32  # a partition key's characters in the table (--json shows all)
_ERROR_MIN_CHARS = 24  # the last error column's least width, however wide the others
_ACTIONS = ("requeue", "discard")
_ACTION_EPILOG = (
    "Exit status: 0 every task named was acted on; 1 the database failed, --queue names no queue of it "
    "(nothing changed), or an --id named no dead task of the queue (the other ids were acted on: standard "
    "output names them, standard error the others); 2 bad usage."
)
_IDS_SHOWN = 20  # ids named in a line before "and N more"
_QUEUES_SHOWN = 10  # known queues named when --queue names none
_LIST_ONLY = (("limit", "--limit"), ("after", "--after"), ("json", "--json"), ("show_payloads", "--show-payloads"))


# --- the work -----------------------------------------------------------------------------


async def collect_dead_letters(
    path: str | os.PathLike[str],
    *,
    queue: str,
    limit: int = DEFAULT_LIMIT,
    after_id: int | None = None,
    schema: str | None = None,
    show_payloads: bool = False,
    busy_timeout_s: float = 5.0,
) -> dict[str, Any]:
    """Open ``path`` read-only and return a page of ``queue``'s dead tasks as a JSON-ready dict.

    Args:
        path: The SQLite database file, or a PostgreSQL DSN.
        queue: The queue.
        limit: Most tasks, 1..10000. Default :data:`DEFAULT_LIMIT`.
        after_id: Only tasks with a greater id (the ``next_after`` of the page before); None from the first.
        schema: With a PostgreSQL DSN, the schema of the tables; None: the search path.
        show_payloads: Put each task's payload in. Default False.
        busy_timeout_s: How long a read may wait for a busy database (WAL recovery), seconds.

    Returns:
        The object ``--json`` prints (see the module's docstring).

    Raises:
        InvalidTypeError, InvalidArgumentError: a bad ``queue``, ``limit``, ``after_id`` or ``schema``.
        NotADatabaseError, SchemaVersionError, StoreError: as :func:`~asynccoord.cli.status.collect_status`.
    """
    async with open_status_store(path, busy_timeout_s=busy_timeout_s, schema=schema) as (store, label):
        tasks: list[Task] = await store.dead_letters(queue, limit=limit, after_id=after_id)
        policy = await store.dead_letter_policy(queue)
    return {
        "db": label,
        "queue": queue,
        "dead_letter_policy": str(policy),
        "after_id": after_id,
        "limit": limit,
        "payloads_shown": bool(show_payloads),
        "next_after": tasks[-1].id if len(tasks) == limit else None,
        "tasks": [_task_entry(t, show_payloads) for t in tasks],
    }


def _task_entry(task: Task, show_payload: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "id": task.id,
        "partition_key": task.partition_key,
        "partition": task.partition,
        "idempotency_key": task.idempotency_key,
        "priority": task.priority,
        "attempts": task.attempts,
        "max_attempts": task.max_attempts,
        "created_at": task.created_at,
        "updated_at": task.updated_at,
        "last_error": task.last_error,
    }
    unreadable = task.payload if isinstance(task.payload, UnreadableValue) else None
    if show_payload:
        entry["payload"] = None if unreadable is not None else task.payload
    if unreadable is not None:  # said even with payloads hidden: a requeue would only dead-letter it again
        entry["payload_unreadable"] = {"length": unreadable.length, "reason": unreadable.reason}
        if show_payload:
            entry["payload_unreadable"] = {"text": unreadable.text, **entry["payload_unreadable"]}
    return entry


def _payload_text(entry: dict[str, Any]) -> str:
    """A listed task's payload for the table: its JSON, or its stored text marked unreadable."""
    unreadable = entry.get("payload_unreadable")
    if unreadable is not None:
        return f"(unreadable) {unreadable['text']}"
    return json.dumps(entry["payload"], ensure_ascii=False)


SETTLE_BATCH = 1000
"""Dead tasks requeued or discarded per transaction by ``dead requeue`` / ``dead discard``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Settled:
    """What :func:`settle_dead_letters` did.

    Attributes:
        changed: How many dead tasks were requeued or discarded.
        done: With ids given: those acted on, ascending; empty for all.
        not_dead: With ids given: those that named no dead task of the queue (left as they
            are), ascending; empty for all.
    """

    changed: int
    done: tuple[int, ...] = ()
    not_dead: tuple[int, ...] = ()


async def known_queues(store: Any) -> set[str]:
    """The queues ``store`` knows: those with tasks or counters, a dead-letter policy, or rate limits."""
    names = {depth.queue for depth in await store.queue_depths()}
    if hasattr(store, "dead_letter_policies"):
        names.update(await store.dead_letter_policies())
    if hasattr(store, "limited_queues"):
        names.update(await store.limited_queues())
    return names


def unknown_queue_error(queue: str, known: set[str]) -> InvalidArgumentError:
    """The error for a ``--queue`` the database does not know, naming (the first of) those it does."""
    names = sorted(known)
    shown = ", ".join(repr(name) for name in names[:_QUEUES_SHOWN])
    more = f" and {len(names) - _QUEUES_SHOWN} more" if len(names) > _QUEUES_SHOWN else ""
    listed = f"its queues: {shown}{more}" if names else "it has no queue yet"
    return InvalidArgumentError(
        f"no queue {printable(repr(queue))} in this database (no task, no setting; {listed}); nothing was changed"
    )


async def _dead_of(store: Any, queue: str, ids: Iterable[int]) -> set[int]:
    """Which of ``ids`` are dead tasks of ``queue`` now."""
    dead: set[int] = set()
    for task_id in ids:
        try:
            task = await store.get(task_id)
        except TaskNotFoundError:
            continue
        except UnreadableRowError:  # a row written by another tool: the listing shows it all the same
            page = await store.dead_letters(queue, limit=1, after_id=task_id - 1)
            if page and page[0].id == task_id:
                dead.add(task_id)
            continue
        if task.queue == queue and task.status == TaskStatus.DEAD:
            dead.add(task_id)
    return dead


async def settle_dead_letters(
    path: str | os.PathLike[str],
    *,
    queue: str,
    action: str,
    task_ids: Sequence[int] | None,
    schema: str | None = None,
    busy_timeout_s: float = 5.0,
) -> Settled:
    """Requeue or discard dead tasks of ``queue`` (those ids, or all for None); say which changed.

    The database is opened read-only first (it must exist, be one of asynccoord and have
    this asynccoord's schema: nothing is created or migrated), then read-write. The tasks
    are acted on :data:`SETTLE_BATCH` at a time, each batch its own transaction, so a
    million dead letters never hold SQLite's write lock past the nodes' leases; ``all``
    pages through the dead letters by id (those that die meanwhile are included).

    Args:
        path: The SQLite database file, or a PostgreSQL DSN.
        queue: The queue.
        action: ``"requeue"`` (back to pending, attempts reset) or ``"discard"`` (deleted).
        task_ids: The dead tasks to act on; None for every dead task of the queue.
        schema: With a PostgreSQL DSN, the schema of the tables; None: the search path.
        busy_timeout_s: How long the read-only check may wait for a busy database, seconds.

    Returns:
        How many changed and, with ids given, which ids were acted on and which named no dead task.

    Raises:
        InvalidArgumentError: an unknown ``action``, or a ``queue`` the database does not know
            (:func:`unknown_queue_error`; nothing is changed); and as :func:`collect_dead_letters`.
        SchemaVersionError: as :func:`collect_dead_letters`; for an older schema, one saying
            which command migrates it (:func:`older_schema_error`): an action migrates nothing.
        NotADatabaseError: no SQLite file at ``path`` (none is created).
    """
    from ..backends.open import is_postgres_target, open_store, relative_url_hint, schema_options, sqlite_path

    if action not in _ACTIONS:
        raise InvalidArgumentError(f"action must be 'requeue' or 'discard', got {action!r}")
    if not is_postgres_target(os.fspath(path)):  # said here: the read-only check's answer speaks of reading
        file = sqlite_path(os.fspath(path))
        if file != ":memory:" and _missing(file):
            hint = relative_url_hint(os.fspath(path), file_needed=True)
            raise NotADatabaseError(f"no database at {file!r} (dead {action} never creates one){hint and '; ' + hint}")
    try:
        async with open_status_store(path, busy_timeout_s=busy_timeout_s, schema=schema) as (reader, _):
            # There is a current database of asynccoord: the read-write open below changes nothing else.
            known = await known_queues(reader)
    except SchemaVersionError as exc:
        if exc.found is None or exc.supported is None:
            raise
        raise older_schema_error(action, path, schema, found=exc.found, supported=exc.supported) from exc
    if queue not in known:
        raise unknown_queue_error(queue, known)
    options = schema_options(path, schema)
    if is_postgres_target(os.fspath(path)):
        options["listen"] = False  # one statement: no wake-ups to hear
    async with open_store(path, **options) as store:
        act = store.requeue_dead if action == "requeue" else store.discard_dead
        changed = 0
        if task_ids is not None:
            ids = sorted(set(task_ids))
            done: set[int] = set()
            for start in range(0, len(ids), SETTLE_BATCH):
                batch = ids[start : start + SETTLE_BATCH]
                before = await _dead_of(store, queue, batch)
                changed += await act(queue, batch)
                done |= before - await _dead_of(store, queue, before)  # dead before, no longer: acted on
            return Settled(changed=changed, done=tuple(sorted(done)), not_dead=tuple(i for i in ids if i not in done))
        after: int | None = None
        while page := await store.dead_letters(queue, limit=SETTLE_BATCH, after_id=after):
            changed += await act(queue, [t.id for t in page])
            after = page[-1].id
        return Settled(changed=changed)


def older_schema_error(
    action: str, path: str | os.PathLike[str], schema: str | None, *, found: int, supported: int
) -> SchemaVersionError:
    """The error for ``dead ACTION`` on a database at an older schema version, in the CLI's terms.

    An action migrates nothing (nodes of the older asynccoord may still be using the
    database); ``run`` of this asynccoord does, as any node start.
    """
    from ..backends.open import describe_target

    return SchemaVersionError(
        f"{describe_target(path, schema)!r} has schema version {found}, older than {supported}: dead {action} "
        "migrates no database; 'python -m asynccoord run' of this asynccoord does (as any node start), "
        f"once no node of the older version uses it; then dead {action} again",
        found=found,
        supported=supported,
    )


def _missing(file: str) -> bool:
    """Whether no file is at ``file``; False when a folder on its way may not be entered (the open says so)."""
    try:
        os.stat(file)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return False


# --- the command ----------------------------------------------------------------------------


def _target_options(parser: argparse.ArgumentParser, *, default: Any) -> None:
    """``--db``, ``--queue`` and ``--schema``: on ``dead`` and on each action, so they go before or after it."""
    parser.add_argument(
        "--db",
        "--store",
        dest="db",
        default=default,
        metavar="TARGET",
        help=target_help("required"),
    )
    parser.add_argument("--queue", default=default, metavar="NAME", help="the queue of the dead tasks (required)")
    parser.add_argument(
        "--schema",
        default=default,
        metavar="NAME",
        help="with a postgresql:// --db: the schema of asynccoord's tables (default: the connection's search_path)",
    )


def configure_dead(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``python -m asynccoord dead`` and its actions ``requeue`` and ``discard`` to ``parser``."""
    _target_options(parser, default=None)
    parser.add_argument(
        "--limit",
        type=int,
        metavar="N",
        help=f"most tasks to list, 1..{MAX_DEAD_LETTERS_LIMIT} (default {DEFAULT_LIMIT})",
    )
    parser.add_argument("--after", type=int, metavar="ID", help="list the tasks with ids above ID (the next page)")
    parser.add_argument("--json", action="store_true", help="print one JSON object, every error whole")
    parser.add_argument("--show-payloads", action="store_true", help="show the tasks' payloads (default: hidden)")
    parser.add_argument(
        "--color", choices=("auto", "always", "never"), default="auto", help="colour in the table (default auto)"
    )
    # An action's --id and --all, hidden here: given without the action they reach check_dead, which
    # names the actions, instead of argparse taking the id for an action ("invalid choice: '3'").
    parser.add_argument("--id", dest="ids_before_action", type=int, action="append", help=argparse.SUPPRESS)
    parser.add_argument("--all", dest="all_before_action", action="store_true", help=argparse.SUPPRESS)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", title="actions (without one: list)")
    for name, help_text in (
        ("requeue", "put dead tasks back to pending, attempts reset; they run again first in their conversation"),
        ("discard", "delete dead tasks for good; a conversation a dead task held goes on"),
    ):
        child = actions.add_parser(name, help=help_text, description=help_text, epilog=_ACTION_EPILOG)
        _target_options(child, default=argparse.SUPPRESS)  # given before the action, they stay
        # Required, but checked by check_dead: an --id or --all given before the action is then
        # named there, instead of argparse's "one of the arguments --id --all is required".
        which = child.add_mutually_exclusive_group()
        which.add_argument("--id", dest="ids", type=int, action="append", metavar="ID", help="a dead task (repeatable)")
        which.add_argument("--all", action="store_true", help="every dead task of the queue")
        # The listing's options, hidden: given after the action they reach check_dead, which says
        # whose they are, instead of argparse's "unrecognized arguments" of the whole command.
        child.add_argument("--limit", type=int, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        child.add_argument("--after", type=int, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        child.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        child.add_argument("--show-payloads", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        child.set_defaults(_parser=child)
        child.usage = "%(prog)s --db TARGET --queue NAME (--id ID [--id ID ...] | --all) [--schema NAME]"
    # Two forms, each whole on its lines: a form's second line is indented under its options,
    # as argparse wraps a usage, so it never reads as a form of its own.
    indent = " " * (len("usage: ") + len(parser.prog) + 1)
    parser.usage = (  # after add_subparsers, which names the actions' parsers after the usage
        "%(prog)s --db TARGET --queue NAME [--limit N] [--after ID] [--json] [--show-payloads]\n"
        f"{indent}[--color {{auto,always,never}}] [--schema NAME]\n"
        "       %(prog)s {requeue,discard} --db TARGET --queue NAME (--id ID [--id ID ...] | --all)\n"
        f"{indent}[--schema NAME]"
    )
    parser.epilog = (
        "Listing needs --db and --queue; the other options are optional. "
        "requeue and discard need --db, --queue, and --id (repeatable) or --all."
    )


def check_dead(args: argparse.Namespace) -> None:
    """Refuse, before anything opens, what ``dead`` cannot use: ``--id`` or ``--all`` without an
    action (or before it), an action without ``--id`` or ``--all``, a missing ``--db`` or ``--queue``,
    a bad ``--queue``, ``--limit``, ``--after`` or ``--id``, a listing option with an action,
    and a ``--db`` or ``--schema`` that ``status`` refuses too.

    Raises:
        InvalidArgumentError, InvalidTypeError: naming the option (a usage error, exit status 2).
    """

    _check_action_options(args)
    missing = [flag for flag, value in (("--db", args.db), ("--queue", args.queue)) if value is None]
    if missing:
        raise InvalidArgumentError(f"the following arguments are required: {', '.join(missing)}")
    check_name("--queue", args.queue)
    parse_target(args, read_only=True)  # parses the target and schema; opens nothing
    action = getattr(args, "action", None)
    if action is None:
        if args.limit is not None:
            check_int("--limit", args.limit, minimum=1, maximum=MAX_DEAD_LETTERS_LIMIT)
        if args.after is not None:
            check_int("--after", args.after, minimum=0, maximum=MAX_ID)  # a cursor: 0 starts before every id
        return
    for attr, flag in _LIST_ONLY:
        if getattr(args, attr) not in (None, False):
            raise InvalidArgumentError(f"{flag} belongs to the listing (dead --db ... --queue ...), not to {action}")
    if not args.ids and not args.all:
        raise InvalidArgumentError("one of the arguments --id --all is required")
    for task_id in args.ids or ():
        check_int("--id", task_id, minimum=1, maximum=MAX_ID)  # task ids start at 1 on every store


def _check_action_options(args: argparse.Namespace) -> None:
    """Refuse ``--id`` or ``--all`` given before any action, naming the actions they belong to.

    Raises:
        InvalidArgumentError: ``dead --id 3`` (no action), ``dead --id 3 requeue`` or ``dead --id 3 requeue --all``.
    """
    given = [f"--id {task_id}" for task_id in getattr(args, "ids_before_action", None) or ()]
    if getattr(args, "all_before_action", False):
        given.append("--all")
    if not given:
        return
    which = " ".join(given)
    action = getattr(args, "action", None)
    if action is None:
        raise InvalidArgumentError(
            f"{which} needs an action before it: 'dead requeue {which}' or 'dead discard {which}' "
            f"(actions: {', '.join(_ACTIONS)}; without one, dead lists the dead tasks)"
        )
    raise InvalidArgumentError(f"{which} goes after the action: 'dead {action} {which}'")


def dead_command(args: argparse.Namespace) -> int:
    """Run ``python -m asynccoord dead`` with the parsed ``args``; return the exit status.

    0, or 1 when some ``--id`` given named no dead task of the queue (the others were still
    requeued or discarded, and standard output names them): a script can tell a mistyped id
    from success. A queue the database does not know raises (exit status 1, nothing changed).
    """
    action = getattr(args, "action", None)
    if action is None:
        report = asyncio.run(
            collect_dead_letters(
                args.db,
                queue=args.queue,
                limit=DEFAULT_LIMIT if args.limit is None else args.limit,
                after_id=args.after,
                schema=args.schema,
                show_payloads=args.show_payloads,
            )
        )
        if args.json:
            write_stdout(json.dumps(report, allow_nan=False) + "\n")
        else:
            render_dead_letters(report, color={"auto": None, "always": True, "never": False}[args.color])
        if not report["tasks"] and args.after is None and not asyncio.run(_has_tasks(args.db, args.queue, args.schema)):
            sys.stderr.write(f"note: no task of {args.queue!r} is in this database (is --queue spelt right?)\n")
        return 0
    ids = None if args.all else sorted(set(args.ids))
    settled = asyncio.run(
        settle_dead_letters(args.db, queue=args.queue, action=action, task_ids=ids, schema=args.schema)
    )
    done = "requeued" if action == "requeue" else "discarded"
    changed = settled.changed
    named = f": {_id_list(settled.done)}" if settled.done else ""
    write_stdout(f"{done} {changed} dead task{'' if changed == 1 else 's'} of {args.queue!r}{named}\n")
    if settled.not_dead:
        left = len(settled.not_dead)
        sys.stderr.write(
            f"asynccoord dead: error: not {done}, {'it names' if left == 1 else 'they name'} no dead task of "
            f"{args.queue!r} (already requeued or discarded, not dead, or of another queue): "
            f"{_id_list(settled.not_dead)}\n"
        )
        return 1
    return 0


def _id_list(ids: Sequence[int]) -> str:
    """``ids`` for a line: ``"id 3"``, ``"ids 3, 5"``, the first :data:`_IDS_SHOWN` then ``"and N more"``."""
    shown = ", ".join(str(i) for i in ids[:_IDS_SHOWN])
    more = f" and {len(ids) - _IDS_SHOWN} more" if len(ids) > _IDS_SHOWN else ""
    return f"id{'' if len(ids) == 1 else 's'} {shown}{more}"


async def _has_tasks(path: str | os.PathLike[str], queue: str, schema: str | None) -> bool:
    """Whether ``queue`` has any task in the database (read-only): a queue exists only through its tasks."""
    async with open_status_store(path, schema=schema) as (store, _):
        stats = await store.stats(queue)
        return bool(stats.total)


# --- the table ------------------------------------------------------------------------------


def shorten(text: str, width: int) -> str:
    """``text`` on one line (runs of whitespace made one space), cut to ``width`` characters with ``...``."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."


def _utc(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def render_dead_letters(report: dict[str, Any], file: IO[str] | None = None, *, color: bool | None = None) -> None:
    """Print what :func:`collect_dead_letters` returned as a table (rich).

    Args:
        report: The listing.
        file: Where to print. Default standard output.
        color: Force colour on or off. Default: colour on a terminal only.
    """
    from rich import box
    from rich.table import Table

    payloads = [_payload_text(t) for t in report["tasks"]] if report["payloads_shown"] else []
    named = repr(report["queue"])  # quoted unambiguously, control characters escaped
    report = printable_report(report)  # no control character of the users' data reaches the terminal
    # Markup off: keys, errors and payloads come from the users' data and print as they are.
    console = table_console(file, color=color, pipe_width=140)
    tasks, after = report["tasks"], report["after_id"]
    where = f"{named} in {report['db']}" + ("" if after is None else f" after id {after}")
    if not tasks:
        console.print(f"No dead tasks of {where}.", style="green")
        return
    policy = report["dead_letter_policy"]
    # The title on a line of its own: a table title wraps at the table's width, cutting long paths.
    console.print(f"Dead tasks of {where} ({len(tasks)}; policy {policy})", soft_wrap=True)
    table = Table(box=box.SIMPLE_HEAVY)
    for col in ("id", "partition key", "attempts", "died (UTC)", "last error"):
        wraps = col == "last error"  # the one column that wraps: never squeezed out by the others
        table.add_column(col, justify="right" if col in ("id", "attempts") else "left", no_wrap=not wraps)
        if wraps:
            table.columns[-1].min_width = _ERROR_MIN_CHARS
    if report["payloads_shown"]:
        table.add_column("payload", no_wrap=True)
    for i, t in enumerate(tasks):
        payload: tuple[str, ...] = ()
        if report["payloads_shown"]:  # from the stored payload, escaped once
            payload = (printable(shorten(payloads[i], _PAYLOAD_CHARS)),)
        table.add_row(
            str(t["id"]),
            shorten(t["partition_key"], _KEY_CHARS) if t["partition_key"] else "-",
            f"{t['attempts']}/{t['max_attempts']}",
            _utc(t["updated_at"]),
            "-" if t["last_error"] is None else shorten(t["last_error"], ERROR_CHARS),
            *payload,
        )
    console.print(table)
    if policy == "hold":
        console.print(
            "policy hold: each of these keeps its conversation (partition key) waiting until it is requeued "
            "or discarded",
            style="yellow",
        )
    if report["next_after"] is not None:
        console.print(f"more may follow: add --after {report['next_after']}")
    if not report["payloads_shown"]:
        console.print("payloads hidden: add --show-payloads to see them")
        unreadable = [str(t["id"]) for t in tasks if "payload_unreadable" in t]
        if unreadable:
            console.print(
                f"unreadable payload: {'id' if len(unreadable) == 1 else 'ids'} {', '.join(unreadable)} "
                "(requeued, such a task goes dead again at its claim: fix its row, or discard it)",
                style="yellow",
            )
