"""Commits on PostgreSQL: group-committed batches of compare-and-sets, one statement per batch.

Concurrent ``complete`` and ``complete_and_claim_next`` calls of a process join one
batch (a :class:`~asynccoord.backends.batch.Batcher`); the batch is one call of the
server-side function ``coord_complete_batch`` (see ``sql/schema.sql``), which locks, fences,
compare-and-sets, records processed ids, promotes and notifies, and leases the next head
of each continuing task's key: one round trip per batch. A retry after a lost
connection recognizes its own earlier success.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

import asyncpg

from ... import events as ev
from ...contract.locks import fence_rejected_error
from ...errors import CoordError, FencingTokenRejectedError, LeaseLostError, TaskNotFoundError
from ...models import Continuation, Task, TaskStatus
from ..batch import Batcher
from ..rows import (
    UnreadableClaim,
    copies_to_write,
    decode_json,
    listed_task_from_row,
    new_token,
    repeated_ids,
    settled_done,
    split_unreadable,
    task_from_row,
)
from ..wakeups import notify_settled
from .heads import PgHeads
from .statements import Row, lost_reason, settled_by_us

__all__ = ("CommitItem", "PgCommitOps")

_Row = Row


def _is_fence_error(outcome: object) -> bool:
    return isinstance(outcome, FencingTokenRejectedError)


class CommitItem:
    """One task of a commit batch.

    ``next_lease_s`` (seconds) asks for a continuation (``complete_and_claim_next``): the
    batch then sets ``next_task`` to the key's next task it leased, if any (an
    :class:`~asynccoord.backends.rows.UnreadableClaim` if its row cannot be decoded).
    """

    __slots__ = ("fence", "next_lease_s", "next_task", "result_json", "task")

    def __init__(
        self,
        task: Task,
        result_json: str | None,
        fence: tuple[str, int] | None,
        next_lease_s: float | None = None,
    ) -> None:
        self.task = task
        self.result_json = result_json
        self.fence = fence
        self.next_lease_s = next_lease_s
        self.next_task: Task | UnreadableClaim | None = None


class PgCommitOps(PgHeads):
    """The commit primitives of the PostgreSQL store.

    A commit is a compare-and-set on ``(id, lease_token, version)`` plus a live lease,
    fenced (``fences=``) in the same transaction: the queues' shared locks are taken
    first, then the row locks of the keys of queues that keep heads, then the fence rows.
    Concurrent ``complete`` calls of a process are group-committed: one transaction and
    one statement (the server-side function ``coord_complete_batch``) per batch, so a
    batch costs one round trip. ``complete_and_claim_next`` rides the same batch: the
    function also leases each continuing task's next head to the task's owner, in the
    commit's transaction, and notifies nobody of it.
    """

    _committer: Batcher[CommitItem, Task | CoordError]

    if TYPE_CHECKING:

        def _undo_claim(self, tasks: list[Task]) -> Coroutine[Any, Any, Any] | None: ...

    def _orphaned_commit(self, item: CommitItem, _outcome: Task | CoordError) -> None:
        """Hand back the task a commit leased for a caller cancelled meanwhile (commit-and-continue)."""
        next_task = item.next_task
        if isinstance(next_task, UnreadableClaim):  # the next claim of it dead-letters it
            next_task = next_task.task
        if next_task is not None:
            coro = self._undo_claim([next_task])
            if coro is not None:
                self._spawn(coro)

    async def _complete_one_checked(
        self, checked: Task, result_json: str | None, fence: tuple[str, int] | None
    ) -> Task | CoordError:
        """One commit, group-committed with the process's concurrent ones.

        One transaction per batch of whatever is waiting, not one (of five round trips
        and a WAL flush) per task.

        Raises:
            StoreConnectionError: the server stayed unreachable.
        """
        self._writable()
        with self._runner.call():  # a call in flight while its batch waits (see PostgresStore.close)
            # A cancellation of the caller cancels the future, not the commit (see Batcher).
            outcome = await self._committer.submit(CommitItem(checked, result_json, fence))
        self._count_settled([checked], [outcome])
        return outcome

    async def _complete_and_claim_next_checked(
        self, checked: Task, result_json: str | None, fence: tuple[str, int] | None, lease: float, _owner: str
    ) -> Continuation:
        """Complete ``task`` and lease its key's next task, in the same statement and transaction.

        The call joins the group commit of :meth:`complete`: the batch's one statement,
        ``coord_complete_batch``, commits the task exactly as
        :meth:`complete` does and then leases the key's head (the earliest unfinished task
        of ``task``'s queue and partition key) to ``task.lease_owner`` if it is pending and
        due by the server clock, as ``claim(ordered=True)`` would lease it. No round trip
        of its own, and no NOTIFY nor wake-up for that key when its head is leased or when
        the key has no next task (there is one, as after :meth:`complete`, when a next head
        was promoted and not leased). A head whose row another
        transaction holds at that moment is not waited for: the commit goes through without
        a continuation. Should the caller be cancelled once the batch is at the server, the
        leased task is handed back in the background (pending again, the attempt not
        counted), as a cancelled claim's tasks are.

        Raises:
            StoreConnectionError: the server stayed unreachable.
        """
        self._writable()
        with self._runner.call():  # a call in flight while its batch waits (see PostgresStore.close)
            if checked.queue not in self._kept_queues:  # once per queue (no coroutine per call after that)
                # The stored task's queue, and only once the task is known to exist: a call with a
                # task id the store never had raises TaskNotFoundError before anything is written.
                await self._keep_heads((await self.get(checked.id)).queue)
            item = CommitItem(checked, result_json, fence, lease)
            # Not asyncio.shield (a future, two closures and three cells per call): a cancellation
            # cancels the future, and the batcher hands the item's outcome to _orphaned_commit.
            future = self._committer.submit(item)
            try:
                outcome = await future
            except asyncio.CancelledError:
                if future.done() and not future.cancelled() and future.exception() is None:
                    self._orphaned_commit(item, future.result())  # the outcome came just as the caller was cancelled
                raise
        if not isinstance(outcome, Task):
            self._count_settled([checked], [outcome])
            raise outcome
        self.events.add(ev.COMMITS)
        next_task = item.next_task
        if isinstance(next_task, UnreadableClaim):
            await self._dead_letter_unreadable([next_task])
            next_task = None
        if next_task is None and self._listener is None:  # whoever claims the key's next task may be woken
            notify_settled(self.notifier, [outcome])
        return Continuation(done=outcome, next_task=next_task)

    async def _complete_many_checked(
        self, checked: list[Task], encoded: list[str | None], fenced: list[tuple[str, int] | None] | None
    ) -> list[Task | CoordError]:
        """Complete many tasks in one transaction (one statement), each with its own compare-and-set.

        Raises:
            StoreConnectionError: the server stayed unreachable.
        """
        if not checked:
            return []
        self._writable()
        items = [
            CommitItem(t, r, None if fenced is None else fenced[i])
            for i, (t, r) in enumerate(zip(checked, encoded, strict=True))
        ]
        outcomes = await self._complete_batch(items)
        self._count_settled(checked, outcomes)
        return outcomes

    def _count_settled(self, tasks: Sequence[Task], outcomes: Sequence[Task | CoordError]) -> None:
        done = [t for t, o in zip(tasks, outcomes, strict=True) if isinstance(o, Task)]
        self.events.add(ev.COMMITS, len(done))
        self.events.add(ev.STALE_COMMIT_REJECTED, sum(1 for o in outcomes if isinstance(o, LeaseLostError)))
        self.events.add(ev.FENCING_REJECTED, sum(1 for o in outcomes if _is_fence_error(o)))
        # A queue that keeps heads (claimed in order here) may have its keys' next tasks claimable
        # now; in any other queue a commit makes nothing claimable: no wake-up (an idle node
        # woken for it would claim for nothing). With a listener, the batch's own notification
        # wakes this process's nodes too, for exactly the heads it promoted and did not lease
        # (see _complete_batch): nothing to guess here.
        if self._listener is not None:
            return
        kept = self._kept_queues
        heads = [t for t in done if t.queue in kept]
        if heads:
            notify_settled(self.notifier, heads)

    async def _complete_batch(self, items: Sequence[CommitItem]) -> list[Task | CoordError]:
        """Complete ``items`` in one statement, ``coord_complete_batch`` (its own transaction).

        The function share-locks the batch's queues and takes the row locks of the keys of
        those that keep heads (sorted), then the fence rows (sorted),
        refuses outdated fencing tokens, compare-and-sets each remaining task (a task whose
        stored queue or key differs from the item's, an altered copy, has its own key's row
        locked then), records the
        fencing tokens and processed ids, promotes the keys' next heads and notifies other
        processes (see ``coord_complete_batch`` in ``sql/migration_0001.sql``): one round
        trip per batch. Items with ``next_lease_s``
        (``complete_and_claim_next``) also get their key's next task leased by the same
        statement (``coord_lease_key_heads``; the first such item of a key in the batch only),
        set as their ``next_task``. A task named more than once (copies of it in one
        ``complete_many`` call; a group-committed batch never holds two) is sent once: its first
        copy holding the stored lease, read by one more statement first (see
        :func:`~asynccoord.backends.rows.copies_to_write`). As on every store, an outdated
        fencing token is refused before the lease is looked at: a copy whose token is below the
        one its resource has recorded (read then too) is refused with
        :class:`~asynccoord.errors.FencingTokenRejectedError`, never sent, and never the copy
        chosen.
        """
        continuing = any(i.next_lease_s is not None for i in items)
        next_token = new_token() if continuing else None
        repeats = repeated_ids([i.task for i in items])
        # Per item: its copy is sent; and, by item index, the recorded token that refused a copy of a
        # task named more than once before anything was sent. Fixed by the first attempt, as a retry reads.
        chosen: list[tuple[list[bool], dict[int, int]]] = []

        def params_for(sent_items: list[CommitItem]) -> dict[str, Any]:
            # The statement locks the tasks' rows in the order of its arrays: ascending ids, as
            # extend_many takes them, so the two never deadlock (see _extend_batch).
            ordered = sorted(sent_items, key=lambda i: i.task.id)
            params: dict[str, Any] = {
                "ids": [i.task.id for i in ordered],
                "tokens": [i.task.lease_token for i in ordered],
                "versions": [i.task.version for i in ordered],
                "results": [i.result_json for i in ordered],
                "queues": [i.task.queue for i in ordered],
                "keys": [i.task.partition_key for i in ordered],
                "fence_resources": None,
                "fence_tokens": None,
                "next_owners": [i.task.lease_owner or "" for i in ordered] if continuing else None,
                "next_lease_s": [i.next_lease_s for i in ordered] if continuing else None,
                "next_token": next_token,
                "channel": self.channel,
                # No sender when listening: the notification (the keys' promoted heads that no
                # continuation leased) is then also this process's wake-up, which the listener
                # delivers; a sender's own notifications are ignored as woken already.
                "sender": None if self._listener is not None else self._sender,
            }
            if any(i.fence is not None for i in ordered):
                params["fence_resources"] = [None if i.fence is None else i.fence[0] for i in ordered]
                params["fence_tokens"] = [None if i.fence is None else i.fence[1] for i in ordered]
            return params

        async def op(conn: asyncpg.Connection, attempt: int) -> tuple[list[Task | CoordError], dict[int, _Row], int]:
            if not chosen:  # copies of one task: only the first holding its lease is sent (see copies_to_write)
                stored: dict[int, tuple[str | None, int] | None] = dict.fromkeys(repeats)
                prefenced: dict[int, int] = {}
                if repeats:
                    for r in await self._fetch(conn, "select_tasks", ids=repeats):
                        stored[int(r[0])] = (r[12], r[14])
                    prefenced = await self._outdated_copies(conn, items, stored)
                candidates = [n for n in range(len(items)) if n not in prefenced]
                picked = copies_to_write([items[n].task for n in candidates], stored)
                sent = [False] * len(items)
                for n, pick in zip(candidates, picked, strict=True):
                    sent[n] = pick
                chosen.append((sent, prefenced))
            sent, prefenced = chosen[0]
            done: dict[int, tuple[int, float]] = {}
            refused: dict[int, int] = {}
            following: dict[int, _Row] = {}  # completed task id -> the row of its key's next task, leased
            duplicates = 0
            sent_items = [i for i, s in zip(items, sent, strict=True) if s]
            rows = (
                await self._fetch(conn, "complete_batch", now=self._now(), **params_for(sent_items))
                if sent_items
                else []
            )
            for r in rows:
                kind = r[1]
                if kind == "d":
                    done[r[0]] = (r[2], r[3])
                elif kind == "f":
                    refused[r[0]] = r[4]
                elif kind == "n":
                    following[r[0]] = r[5:]
                else:  # "x": the next task was settled as a duplicate
                    duplicates += 1
            # A copy committed if it was sent (at most one copy of a task is) and the version
            # written is its own + 1.
            won = [
                s and i.task.id in done and done[i.task.id][0] == i.task.version + 1
                for i, s in zip(items, sent, strict=True)
            ]
            fenced = [
                n in prefenced or (s and i.task.id in refused) for n, (i, s) in enumerate(zip(items, sent, strict=True))
            ]
            missing = sorted({i.task.id for i, w, f in zip(items, won, fenced, strict=True) if not w and not f})
            current: dict[int, _Row] = {}
            if missing:
                current = {int(r[0]): r for r in await self._fetch(conn, "select_tasks", ids=missing)}
            out: list[Task | CoordError] = []
            for n, (i, s, w, f) in enumerate(zip(items, sent, won, fenced, strict=True)):
                t = i.task
                if f:
                    assert i.fence is not None
                    top = prefenced[n] if n in prefenced else refused[t.id]
                    out.append(fence_rejected_error(i.fence[0], i.fence[1], top))
                elif w:
                    version, at = done[t.id]
                    out.append(settled_done(t, version=version, now=at, result=decode_json(i.result_json)))
                else:
                    row = current.get(t.id)
                    if s and attempt > 0 and row is not None and settled_by_us(row, t, TaskStatus.DONE):
                        out.append(listed_task_from_row(row))  # our earlier attempt committed it
                        if i.next_lease_s is not None and next_token is not None:
                            head = await self._earlier_continuation(conn, t, next_token)
                            if head is not None:
                                following[t.id] = head
                        continue
                    reason = lost_reason(row, t)
                    out.append(TaskNotFoundError(t.id) if reason is None else LeaseLostError(t.id, reason))
            return out, following, duplicates

        out, following, duplicates = await self._run(op, what="complete", tx=False, ambiguous_ok=True, counted=True)
        if continuing:
            for i, o in zip(items, out, strict=True):
                row = following.get(i.task.id) if isinstance(o, Task) else None
                if row is not None:
                    leased, unreadable = split_unreadable([row], task_from_row, payload_at=5, result_at=16)
                    i.next_task = leased[0] if leased else unreadable[0]
            self.events.add(ev.CLAIMS, len(following))
            self.events.add(ev.DUPLICATE_DELIVERY_SUPPRESSED, duplicates)
        return out

    async def _outdated_copies(
        self, conn: asyncpg.Connection, items: Sequence[CommitItem], repeated: Collection[int]
    ) -> dict[int, int]:
        """The copies of tasks named more than once whose fencing token is outdated: index -> the recorded token.

        Read before the batch's statement, so the tokens are those recorded before the call,
        against which the statement checks the copies it is sent (as SQLite and the memory
        store check a batch).
        """
        fenced = [(n, i.fence) for n, i in enumerate(items) if i.fence is not None and i.task.id in repeated]
        tops: dict[str, int] = {}
        for resource in sorted({fence[0] for _, fence in fenced}):
            row = await self._row(conn, "fence_get", resource=resource)
            if row is not None:
                tops[resource] = int(row[1])
        return {n: tops[r] for n, (r, token) in fenced if r in tops and token < tops[r]}

    async def _earlier_continuation(self, conn: asyncpg.Connection, task: Task, token: str) -> _Row | None:
        """After a lost connection: the head of ``task``'s key if our earlier attempt leased it (by its token)."""
        row = await self._row(conn, "select_key_head", queue=task.queue, partition_key=task.partition_key)
        if row is None or row[7] != TaskStatus.RUNNING or row[12] != f"{token}.{row[0]}":
            return None
        return row

    async def _unchecked_complete_checked(self, checked: list[Task], encoded: list[str | None]) -> int:
        """Mark tasks done without any compare-and-set (benchmarks only); return rows written."""
        if not checked:
            return 0
        self._writable()

        async def op(conn: asyncpg.Connection, _attempt: int) -> int:
            kept = await self._lockkey_arrays(conn, [(t.queue, t.partition_key) for t in checked])
            rows = await self._fetch(
                conn, "unchecked_complete", ids=[t.id for t in checked], results=encoded, now=self._now()
            )
            await self._promote(conn, [(r[0], r[1]) for r in rows if (r[0], r[1]) in kept])
            return len(rows)

        written = await self._run(op, what="unchecked_complete")
        self.events.add(ev.COMMITS, written)
        return written
