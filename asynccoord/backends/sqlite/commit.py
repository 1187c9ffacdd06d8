"""Commits on SQLite: many compare-and-sets in one statement, and commit-and-continue.

:class:`SQLiteCommitOps` is a mixin of the queue (:class:`~asynccoord.backends.sqlite.queue.SQLiteQueueOps`).
A commit of many tasks is one operation of the store's group committer (:mod:`.writer`): the
fencing tokens are checked first (a read), then one ``complete_batch`` statement
compare-and-sets every task (of copies of one task, only the first that holds its lease is
sent), the processed message ids are recorded and each key's next head is promoted
(:mod:`.heads`). The ``complete_and_claim_next`` calls of one event loop turn share one such
operation (:class:`~asynccoord.backends.sqlite.turnbatch.TurnBatch`), each also leasing its
key's next head to its caller (``claim_key_head``); the task leased for a caller cancelled
meanwhile is handed back. The naive commit of the benchmarks is here too.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ... import events as ev
from ...contract.locks import fence_rejected_error
from ...errors import CoordError, LeaseLostError, TaskNotFoundError
from ...models import Continuation, Task
from ..base import StoreBase
from ..calls import CallGate
from ..rows import (
    UnreadableClaim,
    copies_to_write,
    decode_json,
    new_token,
    repeated_ids,
    settled_done,
    split_unreadable,
)
from ..sqlfiles import load_queries
from ..wakeups import notify_partitions
from .heads import keep_heads as _keep_heads
from .heads import promote_heads as _promote_heads
from .locks import check_fence
from .taskrows import CLAIM_TEXTS as _CLAIM_TEXTS
from .taskrows import Row as _Row
from .taskrows import claimed_task as _claimed_task
from .taskrows import lost_reason as _lost_reason
from .texts import leniently
from .turnbatch import TurnBatch

if TYPE_CHECKING:
    from .writer import GroupCommitter, Operation

__all__ = ("SQLiteCommitOps",)

Q = load_queries("sqlite")

# now, per-task outcome, refused fences, promoted heads, per task the next task's row and queue, duplicates settled
_Completed = tuple[
    float, list[int | str | None], dict[int, int], list[tuple[str, int]], "list[tuple[_Row, str] | None]", int
]


_Next = Task | UnreadableClaim | None  # the task a commit-and-continue leased next


class _CommitItem:
    """One task of a commit: its result (JSON), its fence, and ``(owner, lease_s)`` for commit-and-continue."""

    __slots__ = ("continuation", "fence", "result_json", "task")

    def __init__(
        self, task: Task, result_json: str | None, fence: tuple[str, int] | None, continuation: tuple[str, float] | None
    ) -> None:
        self.task = task
        self.result_json = result_json
        self.fence = fence
        self.continuation = continuation


def _next_claimed(row: _Row, queue: str, node_id: str, expires: float, now: float) -> Task | UnreadableClaim:
    """The task a commit-and-continue leased (see _claimed_task); an UnreadableClaim if its row cannot be decoded."""
    leased, unreadable = split_unreadable(
        [row],
        lambda r: _claimed_task(r, queue, node_id, expires, now),
        payload_at=4,
        result_at=12,
        texts=_CLAIM_TEXTS,
    )
    return leased[0] if leased else unreadable[0]


class SQLiteCommitOps(StoreBase):
    """The commits of the SQLite store's queue.

    A mixin: it relies on the store's ``_write`` (group-committed operation), ``_writable``
    (the group committer, checked open and of this loop), ``_gate`` (its calls in flight) and
    on the claims' hand-back of a task (``_release_tasks_op``).
    """

    _continuations: TurnBatch[_CommitItem, _Completed, tuple[Task | CoordError, _Next]] | None = None
    _writer: GroupCommitter | None
    _gate: CallGate

    if TYPE_CHECKING:

        async def _write(
            self, fn: Operation[Any], undo: Callable[[Any], Operation[Any] | None] | None = None
        ) -> Any: ...

        def _writable(self) -> GroupCommitter: ...

        def _release_tasks_op(self, tasks: Sequence[Task]) -> Operation[None]: ...

    async def _complete_many_checked(
        self, checked: list[Task], encoded: list[str | None], fenced: list[tuple[str, int] | None] | None
    ) -> list[Task | CoordError]:
        """Complete many tasks in one transaction of the group commit, each with its own compare-and-set."""
        if not checked:
            return []
        items = [
            _CommitItem(t, r, None if fenced is None else fenced[i], None)
            for i, (t, r) in enumerate(zip(checked, encoded, strict=True))
        ]
        result = await self._write(self._complete_op(items))
        return [outcome for outcome, _ in self._completed(result, items)]  # no continuations here

    async def _complete_and_claim_next_checked(
        self, task: Task, result_json: str | None, fence: tuple[str, int] | None, lease: float, owner: str
    ) -> Continuation:
        """Complete ``task`` and lease its key's next task.

        The calls of one loop turn (a process's nodes finish their sends together) share one
        operation of the group commit (:class:`~asynccoord.backends.sqlite.turnbatch.TurnBatch`):
        one compare-and-set statement for all, then each key's head leased in turn.
        """
        self._writable()  # writable, open and in this loop: raised here, not in the turn's operation
        batch = self._continuations
        if batch is None:
            batch = self._continuations = TurnBatch(self._start_continuations, self._completed, self._orphaned)
        with self._gate.call():  # in flight, with the turn's operation it starts (see SQLiteStore.close)
            outcome, next_task = await batch.call(_CommitItem(task, result_json, fence, (owner, lease)))
        if isinstance(next_task, UnreadableClaim):
            await self._dead_letter_unreadable([next_task])
            next_task = None
        if not isinstance(outcome, Task):
            raise outcome
        return Continuation(done=outcome, next_task=next_task)

    def _start_continuations(self, items: list[_CommitItem]) -> asyncio.Future[_Completed]:
        running = self._writable().enqueue(self._complete_op(items))
        # In flight until its outcomes are delivered, even once its callers are cancelled: the
        # next task leased for a cancelled caller is handed back (_orphaned) before close() stops
        # the writer, not left leased until its lease lapses.
        self._gate.hold(running)
        return running

    def _orphaned(self, _item: _CommitItem, outcome: tuple[Task | CoordError, _Next]) -> None:
        """Hand back the task a commit leased for a caller cancelled meanwhile (pending again, attempt refunded)."""
        next_task = outcome[1]
        if isinstance(next_task, UnreadableClaim):  # the next claim of it dead-letters it
            next_task = next_task.task
        if next_task is not None and self._writer is not None:
            self._writer.compensate(self._release_tasks_op([next_task]))

    def _complete_op(self, items: list[_CommitItem]) -> Operation[_Completed]:
        """complete_many's transaction; each item with a continuation ``(owner, lease_s)`` also
        leases its key's next head to ``owner`` (after every compare-and-set of the operation)."""
        rows = [[i.task.id, i.task.lease_token, i.task.version, i.result_json] for i in items]
        repeats = repeated_ids([i.task for i in items])
        fenced = any(i.fence is not None for i in items)
        continuing = any(i.continuation is not None for i in items)

        def op(db: sqlite3.Connection, now: float) -> _Completed:
            refused: dict[int, int] = {}  # item index -> the fencing token that refused its own
            if fenced:  # refuse outdated tokens first (read only)...
                for n, i in enumerate(items):
                    f = i.fence
                    if f is not None:
                        row = db.execute(Q["fence_get"], {"resource": f[0]}).fetchone()
                        if row is not None and f[1] < row[1]:
                            refused[n] = int(row[1])
            sent = [n not in refused for n in range(len(items))]
            if repeats:  # copies of one task: only the first unrefused one holding its lease is sent (copies_to_write)
                leases: dict[int, tuple[str | None, int] | None] = {}
                for task_id in repeats:
                    row = db.execute(Q["select_task"], {"id": task_id}).fetchone()
                    leases[task_id] = None if row is None else (row[12], row[14])
                candidates = [n for n in range(len(items)) if n not in refused]
                chosen = copies_to_write([items[n].task for n in candidates], leases)
                sent = [False] * len(items)
                for n, s in zip(candidates, chosen, strict=True):
                    sent[n] = s
            batch = json.dumps([r for r, s in zip(rows, sent, strict=True) if s], separators=(",", ":"))
            done = db.execute(Q["complete_batch"], {"batch": batch, "now": now}).fetchall()
            matched = {(r[0], r[1]) for r in done}
            # per copy: its compare-and-set matched (at most one copy of a task is sent)
            won = [s and (i.task.id, i.task.version + 1) in matched for i, s in zip(items, sent, strict=True)]
            keys = [(r[2], r[3]) for r in done]  # the stored keys, not the caller's
            if fenced:  # ...and record the tokens of the commits that went through
                for i, w in zip(items, won, strict=True):
                    if i.fence is not None and w:
                        check_fence(db, now, i.fence[0], i.fence[1])
            records = [[r[2], r[4]] for r in done if r[4] is not None]  # the stored keys, not the caller's
            if records:
                db.execute(Q["record_processed_batch"], {"records": json.dumps(records), "now": now})
            out: list[int | str | None] = [
                i.task.version + 1 if w else (None if n in refused else _lost_reason(db, i.task, now))
                for n, (i, w) in enumerate(zip(items, won, strict=True))
            ]
            following: list[tuple[_Row, str] | None] = [None] * len(items)
            duplicates = 0
            promoted: list[tuple[str, int]] = []
            if continuing:
                stored = {r[0]: (r[2], r[3]) for r in done}  # the stored key (as the promotion uses)
                continued: set[tuple[str, str]] = set()
                for n, (i, w) in enumerate(zip(items, won, strict=True)):
                    if i.continuation is None or not w:
                        continue
                    queue, key = stored[i.task.id]
                    params = {
                        "queue": queue,
                        "partition_key": key,
                        "node_id": i.continuation[0],
                        "lease_s": i.continuation[1],
                        "token": new_token(),
                    }
                    # Read leniently: a next row holding a text that is not UTF-8 must not fail the
                    # commit (it is dead-lettered by the caller, see .texts)
                    row, settled, heads = _lenient_head(db, now, params)
                    duplicates += settled
                    promoted += heads
                    if row is not None:
                        following[n] = (row, queue)
                    if row is not None or settled:  # the key's new head is leased (or settled and
                        continued.add((queue, key))  # its successor promoted): nothing left to promote
                if continued:
                    keys = [k for k in keys if k not in continued]
            promoted = _promote_heads(db, keys) + promoted
            return now, out, refused, promoted, following, duplicates

        return op

    def _completed(self, result: _Completed, items: list[_CommitItem]) -> list[tuple[Task | CoordError, _Next]]:
        """Per item, on the loop: its outcome (the done task or the error) and the next task leased for it
        (an :class:`~asynccoord.backends.rows.UnreadableClaim` if its row cannot be decoded)."""
        now, outcomes, refused, promoted, following, duplicates = result
        out: list[tuple[Task | CoordError, _Next]] = []
        committed = lost = leased = 0
        for n, (item, outcome, step) in enumerate(zip(items, outcomes, following, strict=True)):
            task = item.task
            done: Task | CoordError
            if n in refused and item.fence is not None:
                done = fence_rejected_error(item.fence[0], item.fence[1], refused[n])
            elif isinstance(outcome, int):
                committed += 1
                done = settled_done(task, version=outcome, now=now, result=decode_json(item.result_json))
            elif outcome is None:
                done = TaskNotFoundError(task.id)
            else:
                lost += 1
                done = LeaseLostError(task.id, outcome)
            next_task: _Next = None
            if step is not None:
                assert item.continuation is not None
                owner, lease_s = item.continuation
                next_task = _next_claimed(step[0], step[1], owner, now + lease_s, now)
                leased += 1
            out.append((done, next_task))
        self.events.add(ev.COMMITS, committed)
        notify_partitions(self.notifier, promoted)  # the keys' next tasks, claimable now
        self.events.add(ev.STALE_COMMIT_REJECTED, lost)
        self.events.add(ev.FENCING_REJECTED, len(refused))
        self.events.add(ev.CLAIMS, leased)
        self.events.add(ev.DUPLICATE_DELIVERY_SUPPRESSED, duplicates)
        return out

    async def _unchecked_complete_checked(self, checked: list[Task], encoded: list[str | None]) -> int:
        """Mark tasks done without any compare-and-set (benchmarks only); return rows written."""
        items = [{"id": t.id, "result": r} for t, r in zip(checked, encoded, strict=True)]

        def op(db: sqlite3.Connection, now: float) -> int:
            done = [db.execute(Q["unchecked_complete"], {**item, "now": now}).fetchone() for item in items]
            _promote_heads(db, [(r[0], r[1]) for r in done if r is not None])
            return sum(1 for r in done if r is not None)

        written = int(await self._write(op))
        self.events.add(ev.COMMITS, written)
        return written


def _claim_key_head(
    db: sqlite3.Connection, now: float, params: dict[str, Any]
) -> tuple[_Row | None, int, list[tuple[str, int]]]:
    """Lease the head of one key (commit-and-continue); return its row, duplicates settled, promotions.

    The leased task is marked the key's head in the same statement, so the commit that
    continues needs no promotion of that key. The queue keeps heads from now on (as after an
    ordered claim). A head whose message id is already processed is settled as a duplicate,
    and the key's following head is not leased (it is promoted and announced instead, as a
    claim does).
    """
    _keep_heads(db, params["queue"])
    row: _Row | None = db.execute(Q["claim_key_head"], {**params, "now": now}).fetchone()
    if row is None or row[3] is None:
        return row, 0, []
    settled = db.execute(Q["settle_duplicate"], {"ids": json.dumps([row[0]]), "now": now}).fetchall()
    if not settled:
        return row, 0, []
    return None, 1, _promote_heads(db, [(r[1], r[2]) for r in settled])


_lenient_head = leniently(_claim_key_head)
"""_claim_key_head with a text that is not UTF-8 read as bytes (see .texts)."""
