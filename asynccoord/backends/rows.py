"""What the engines share to turn their rows into records: JSON decoding, tasks from rows, tokens.

Only the stores under :mod:`asynccoord.backends` use these: the rows they decode are
the ones they wrote (compact JSON, the ``coord_tasks`` column order), so nothing here
validates; what a caller hands in is checked by :mod:`asynccoord.contract` first. A row
written by another tool may still hold a column that cannot be decoded: the fast paths
try first and only a failure looks at the columns one by one
(:class:`~asynccoord.errors.UnreadableRowError`, :func:`listed_task_from_row`,
:func:`split_unreadable`).
"""

from __future__ import annotations

import dataclasses
import json
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..contract.ratelimits import decode_limit_keys
from ..errors import UnreadableRowError
from ..models import UNREADABLE_TEXT_SHOWN, Task, TaskSlots, TaskStatus, UnreadableValue, make_task

__all__ = (
    "DECODE_ERRORS",
    "UnreadableClaim",
    "copies_to_write",
    "decode_json",
    "lease_lost_reason",
    "limit_keys_of",
    "listed_task_from_row",
    "new_token",
    "repeated_ids",
    "TEXT_COLUMNS",
    "settled_done",
    "shown_text",
    "split_unreadable",
    "task_from_row",
    "text_problem",
    "unreadable_column",
    "with_stored_fields",
)

DECODE_ERRORS: tuple[type[Exception], ...] = (ValueError, TypeError, RecursionError)
"""What decoding a stored text can raise: not JSON (``JSONDecodeError``), an integer over
``sys.get_int_max_str_digits()`` (``ValueError``), bytes (``TypeError``), nesting deeper than
the recursion limit (``RecursionError``)."""

_ROW_ERRORS: tuple[type[Exception], ...] = (*DECODE_ERRORS, KeyError)  # and a status none of the four
_CLAIM_ERRORS: tuple[type[Exception], ...] = (*DECODE_ERRORS, UnreadableRowError)


# The standard library's own C scanner, which json.loads runs after two regex matches for
# surrounding whitespace: the texts a store reads back are the compact JSON it wrote, so
# the scanner alone decodes them in a fifth of the time (anything else goes to json.loads).
_SCAN_JSON: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def decode_json(text: str | None) -> Any:
    """The JSON value of a text the store wrote (None for None).

    The inverse of :func:`~asynccoord.contract.queue.encode_result` and
    :func:`~asynccoord.validation.encode_payload`.

    Raises:
        json.JSONDecodeError: ``text`` is not one JSON value.
    """
    if text is None:
        return None
    try:
        value, end = _SCAN_JSON(text, 0)
    except StopIteration:  # not a value at index 0 (leading whitespace, empty, garbage)
        return json.loads(text)
    if end != len(text):  # trailing whitespace or garbage: json.loads accepts or names it
        return json.loads(text)
    return value


def _reason(exc: BaseException | None, text: Any = None) -> str:
    if isinstance(text, bytes):  # a BLOB, or a text that is not UTF-8 read as its bytes (sqlite/texts.py)
        try:
            text.decode("utf-8")
        except UnicodeDecodeError:
            return f"{len(text)} bytes that are no UTF-8 text"
        return f"a BLOB of {len(text)} bytes, not text"
    if exc is None:
        return f"{type(text).__name__} {text!r:.60}, not text"
    return f"{type(exc).__name__}: {exc}"


TEXT_COLUMNS: tuple[tuple[str, int, bool], ...] = (
    ("queue", 1, False),
    ("partition_key", 2, False),
    ("idempotency_key", 4, True),
    ("last_error", 15, True),
)
"""The text columns of a full row (``task_from_row``'s order) a task carries: name, place,
whether NULL is allowed. SQLite keeps any value in them (a BLOB, a text that is not UTF-8,
read as bytes: sqlite/texts.py); a task must never carry one of those."""


def text_problem(task_id: int, columns: Sequence[tuple[str, Any, bool]]) -> UnreadableRowError | None:
    """The error for the first of ``columns`` (``(name, value, nullable)``) that is no text; None if all are."""
    for name, value, nullable in columns:
        if value.__class__ is not str and not (nullable and value is None):
            return UnreadableRowError(task_id, name, _reason(None, value))
    return None


def _texts_of(row: Sequence[Any]) -> UnreadableRowError | None:
    return text_problem(row[0], [(name, row[at], nullable) for name, at, nullable in TEXT_COLUMNS])


def _all_text(row: Sequence[Any]) -> bool:
    """Whether the text columns of a full row are text (the common case: four type checks)."""
    idempotency_key, last_error = row[4], row[15]
    return (
        row[1].__class__ is str
        and row[2].__class__ is str
        and (idempotency_key is None or idempotency_key.__class__ is str)
        and (last_error is None or last_error.__class__ is str)
    )


def shown_text(value: Any) -> str:
    """A text column's value for a listing: itself if text, else its ``repr`` (a BLOB, bytes that are no UTF-8)."""
    return value if value.__class__ is str else repr(value)


def unreadable_column(task_id: int, columns: Sequence[tuple[str, Any]]) -> UnreadableRowError | None:
    """The error for the first of ``columns`` (``(name, stored text)``) that cannot be decoded; None if all can."""
    for name, text in columns:
        try:
            decode_json(text)
        except DECODE_ERRORS as exc:
            return UnreadableRowError(task_id, name, _reason(exc, text))
    return None


def limit_keys_of(task_id: int, text: Any) -> dict[str, str] | UnreadableRowError:
    """A task's stored ``limit_keys`` decoded, or the error saying why they cannot be (see ``decode_limit_keys``)."""
    try:
        return decode_limit_keys(text)
    except DECODE_ERRORS as exc:
        return UnreadableRowError(task_id, "limit_keys", _reason(exc, text))


def _listed(column: str, text: Any) -> Any:
    """The value of ``text``, or an :class:`~asynccoord.models.UnreadableValue` in its place."""
    try:
        return decode_json(text)
    except DECODE_ERRORS as exc:
        shown = text if isinstance(text, str) else repr(text)
        return UnreadableValue(
            column=column, text=shown[:UNREADABLE_TEXT_SHOWN], reason=_reason(exc, text), length=len(shown)
        )


_STATUS = {s.value: s for s in TaskStatus}


def task_from_row(row: Sequence[Any]) -> Task:
    """The task of a full row read back from a store's own ``coord_tasks`` table.

    ``row`` holds the 19 Task fields in declaration order, ``payload`` and ``result`` as
    JSON text and ``status`` as its name (the stores' ``RETURNING``/``SELECT`` column
    order). No validation: the store wrote these values (see ``make_task``).

    Raises:
        UnreadableRowError: ``payload`` or ``result`` cannot be decoded, or ``status`` is
            none of the four (a row written by another tool).
    """
    try:
        task = _task_from_row(row)
    except _ROW_ERRORS:
        error = _row_problem(row)
        if error is None:
            raise
        raise error from None
    if not _all_text(row):
        raise _texts_of(row) or AssertionError(row)
    return task


def listed_task_from_row(row: Sequence[Any]) -> Task:
    """As :func:`task_from_row`, but a ``payload`` or ``result`` that cannot be decoded is listed as an
    :class:`~asynccoord.models.UnreadableValue`, and a text column holding no text (:data:`TEXT_COLUMNS`)
    as its ``repr`` (for reads that list tasks, and settles whose write is done).

    Raises:
        UnreadableRowError: ``status`` is none of the four.
    """
    try:
        task = _task_from_row(row)
        if _all_text(row):
            return task
    except _ROW_ERRORS:
        if row[7] not in _STATUS:
            raise _status_problem(row) from None
    texts = list(row)
    for _name, at, nullable in TEXT_COLUMNS:
        if not (nullable and row[at] is None):
            texts[at] = shown_text(row[at])
    texts[5], texts[16] = "null", None
    return dataclasses.replace(
        _task_from_row(texts),
        payload=_listed("payload", row[5]),
        result=_listed("result", row[16]),
    )


def _status_problem(row: Sequence[Any]) -> UnreadableRowError:
    return UnreadableRowError(row[0], "status", f"{row[7]!r} is none of {', '.join(_STATUS)}")


def _row_problem(row: Sequence[Any]) -> UnreadableRowError | None:
    if row[7] not in _STATUS:
        return _status_problem(row)
    return unreadable_column(row[0], (("payload", row[5]), ("result", row[16])))


def _task_from_row(row: Sequence[Any]) -> Task:
    return make_task(
        row[0],
        row[1],
        row[2],
        row[3],
        row[4],
        decode_json(row[5]),
        row[6],
        _STATUS[row[7]],
        row[8],
        row[9],
        row[10],
        row[11],
        row[12],
        row[13],
        row[14],
        row[15],
        decode_json(row[16]),
        row[17],
        row[18],
    )


class UnreadableClaim:
    """A task a claim leased whose row cannot be decoded: its lease (``task``, payload and result
    None) for the dead-lettering, and why (``error``). See :func:`split_unreadable`."""

    __slots__ = ("error", "task")

    def __init__(self, task: Task, error: UnreadableRowError) -> None:
        self.task = task
        self.error = error


def split_unreadable(
    rows: Sequence[Sequence[Any]],
    convert: Callable[[Any], Task],
    *,
    payload_at: int,
    result_at: int,
    known: Mapping[int, UnreadableRowError] | None = None,
    texts: Sequence[tuple[str, int, bool]] = (),
) -> tuple[list[Task], list[UnreadableClaim]]:
    """The tasks of a claim's ``rows`` (``convert`` each), and the rows that cannot be decoded.

    ``payload_at`` and ``result_at`` are the columns' places in a row; ``known`` maps the
    ids of rows already found unreadable (their ``limit_keys``, read by a rate-limited
    claim) to their errors; ``texts`` names the text columns ``convert`` refuses (a
    ``TypeError``) when they hold no text: ``(name, place, nullable)``. The common case
    costs one ``try``: only when a row fails (or ``known`` names some) are the rows
    converted one by one, and a row whose ``payload`` or ``result`` cannot be decoded, or
    whose text columns hold no text, is converted again with the JSON columns blank and
    the texts shown (:func:`shown_text`; its lease, for a compare-and-set) and returned
    with its error.
    """
    if not known:
        try:
            return [convert(r) for r in rows], []
        except _CLAIM_ERRORS:
            pass
    tasks: list[Task] = []
    unreadable: list[UnreadableClaim] = []
    for r in rows:
        error = None if known is None else known.get(r[0])
        if error is None:
            try:
                tasks.append(convert(r))
                continue
            except _CLAIM_ERRORS:
                error = unreadable_column(r[0], (("payload", r[payload_at]), ("result", r[result_at])))
                if error is None:
                    error = text_problem(r[0], [(name, r[at], nullable) for name, at, nullable in texts])
                if error is None:
                    raise
        blank = list(r)
        blank[payload_at], blank[result_at] = "null", None
        for _name, at, nullable in texts:
            if not (nullable and r[at] is None):
                blank[at] = shown_text(r[at])
        unreadable.append(UnreadableClaim(convert(tuple(blank)), error))
    return tasks, unreadable


def settled_done(task: Task, *, version: int, now: float, result: Any) -> Task:
    """The stored state of ``task`` after a successful complete."""
    # Filled slot by slot as make_task does (not dataclasses.replace or Task(...)): this runs
    # once per committed task, and inlined it also saves make_task's 19-argument call.
    done: Any = _NEW(TaskSlots)
    done.id = task.id
    done.queue = task.queue
    done.partition_key = task.partition_key
    done.partition = task.partition
    done.idempotency_key = task.idempotency_key
    done.payload = task.payload
    done.priority = task.priority
    done.status = _DONE
    done.attempts = task.attempts
    done.max_attempts = task.max_attempts
    done.run_at = task.run_at
    done.lease_owner = None
    done.lease_token = None
    done.lease_expires_at = None
    done.version = version
    done.last_error = None
    done.result = result
    done.created_at = task.created_at
    done.updated_at = now
    done.__class__ = Task
    return done  # type: ignore[no-any-return]


_NEW = object.__new__
_DONE = TaskStatus.DONE


def with_stored_fields(task: Task, stored: Task) -> Task:
    """``task`` with the queue, key, partition and attempt counts of ``stored``, its row now.

    ``fail`` decides between retry and dead letter from the attempt counts and promotes
    the next task of the queue and key: it must act on the store's values, never on a
    caller's copy that may have been modified. When ``stored`` no longer carries the
    caller's lease (token and version), ``task`` is returned as it is: the
    compare-and-set that follows refuses it.
    """
    if stored.lease_token != task.lease_token or stored.version != task.version:
        return task
    return dataclasses.replace(
        task,
        queue=stored.queue,
        partition_key=stored.partition_key,
        partition=stored.partition,
        attempts=stored.attempts,
        max_attempts=stored.max_attempts,
    )


def repeated_ids(tasks: Sequence[Task]) -> list[int]:
    """The ids named more than once in ``tasks`` (copies of one task in one commit batch), ascending."""
    seen: set[int] = set()
    repeated: set[int] = set()
    for t in tasks:
        (repeated if t.id in seen else seen).add(t.id)
    return sorted(repeated)


def copies_to_write(tasks: Sequence[Task], stored: Mapping[int, tuple[str | None, int] | None]) -> list[bool]:
    """Per task of a commit batch: whether its compare-and-set is sent to the database.

    A batch may name one task more than once (a stale or altered copy beside the live one).
    A statement writes a row once, from any one of the copies that match it, and the caller
    must learn which copy that was, the one whose result is stored: so, as if the copies were
    committed one after the other, only the first copy holding the stored lease (token and
    version) is sent, and the others lose. ``stored`` holds, for each id named more than once
    (:func:`repeated_ids`), the stored ``(lease_token, version)``, or None if the task is
    gone; a task named once is always sent.
    """
    chosen: set[int] = set()
    sent = []
    for t in tasks:
        if t.id not in stored:
            sent.append(True)
            continue
        lease = stored[t.id]
        hit = t.id not in chosen and lease is not None and lease == (t.lease_token, t.version)
        if hit:
            chosen.add(t.id)
        sent.append(hit)
    return sent


def new_token() -> str:
    """A random token (128 bits, hex) for leases and lock ownership."""
    return secrets.token_hex(16)


def lease_lost_reason(
    task: Task,
    status: str,
    owner: str | None,
    token: str | None,
    expires: float | None,
    version: int,
    now: float | None = None,
) -> str:
    """Why a compare-and-set on ``task`` failed, given the stored task's fields (``now``: the store clock, if read).

    The first that holds of: the task is no longer running, another lease holds it, its
    version moved on, its lease expired.
    """
    if status != TaskStatus.RUNNING:
        return f"task is {TaskStatus(status).value} (version {version}, caller had version {task.version})"
    if token != task.lease_token:
        return f"task was reclaimed by {owner!r} under another lease (version {version})"
    if version != task.version:
        return f"version is {version}, caller had {task.version}"
    clock = "store clock" if now is None else f"store clock now {now:.3f}"
    return f"lease expired at {expires if expires is None else format(expires, '.3f')} ({clock})"
