"""Claims on PostgreSQL: one ``UPDATE ... FOR UPDATE SKIP LOCKED`` statement, batched across a process's nodes.

Concurrent claims of a process that name their partitions and share queue, order and
minimum due age share one statement (a :class:`~asynccoord.backends.batch.Batcher` per
shape); leases that expired on their last attempt are dead-lettered and the claim topped
up; duplicates of processed message ids are settled in a second transaction; a cancelled
caller's tasks are handed back in the background. A queue that declares rate limits is
claimed by :meth:`~asynccoord.backends.postgres.ratelimits.PgRateLimitOps._claim_limited`
instead, one transaction per claim batch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Sequence
from typing import Any

import asyncpg

from ... import events as ev
from ...errors import CoordError, UnreadableRowError
from ...models import Task
from ..batch import Batcher
from ..rows import listed_task_from_row, new_token, split_unreadable, task_from_row
from ..wakeups import notify_partitions, notify_settled
from .ratelimits import Claimed, PgRateLimitOps
from .statements import Row

__all__ = ("MAX_IDLE_CLAIMERS", "ClaimRequest", "Claimed", "PgClaimOps")

log = logging.getLogger("asynccoord.backends.postgres.store")
_Row = Row

MAX_IDLE_CLAIMERS = 64
"""Claim batchers (one per queue, order and minimum due age) kept before idle ones are dropped."""


class ClaimRequest:
    """One :meth:`PostgresStore.claim` call of a claim batch (its partitions are named)."""

    __slots__ = ("lease_s", "limit", "node_id", "partitions")

    def __init__(self, node_id: str, limit: int, lease_s: float, partitions: list[int]) -> None:
        self.node_id = node_id
        self.limit = limit
        self.lease_s = lease_s
        self.partitions = partitions


class PgClaimOps(PgRateLimitOps):
    """The claim primitives of the PostgreSQL store.

    A claim is one statement, ``UPDATE ... WHERE id = ANY(ARRAY(SELECT ... FOR UPDATE SKIP
    LOCKED LIMIT n)) RETURNING ...``: claimers never wait for each other and never take the
    same task. They scan partial indexes of pending tasks (of pending heads, per
    partition, for ordered claims) and of running tasks for expired leases, so a claim
    visits about what it returns however many tasks are in flight. A queue that declares
    rate limits is claimed one transaction per batch under the queue's advisory lock
    instead (:class:`~.ratelimits.PgRateLimitOps`).
    """

    _claimers: dict[tuple[str, bool, float, bool], Batcher[ClaimRequest, Claimed]]

    async def _claim_checked(
        self, queue: str, node_id: str, limit: int, lease: float, parts: list[int] | None, ordered: bool, due_age: float
    ) -> list[Task]:
        """Lease up to ``limit`` due tasks to ``node_id``.

        One statement (``UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED LIMIT
        n) RETURNING``). Concurrent claims of the process's nodes that name their
        partitions and share ``queue``, ``ordered`` and ``min_due_age_s`` share one
        statement (group commit, as commits and renewals do: ``UPDATE ... FROM`` the rows
        each claim picked, each claim with its own partitions, limit, lease owner and
        TTL): when every node of a process wakes to new work at once, they make one or
        two round trips, not one each. Like any group commit, a batch that fails (the
        server stayed unreachable) fails each of its claims. Leases that expired on their
        last attempt are dead-lettered and the claim is topped up; the claim's rows say
        whether any exist (a statement that leased nothing asks with one more), so a claim
        costs one round trip when there are none. A cancelled caller's tasks are handed
        back in the background. In a queue that declares rate limits, each claim is a
        transaction of its own that takes its tasks' tokens (see :mod:`.ratelimits`).

        Raises:
            StoreConnectionError: the server stayed unreachable.
        """
        if parts is not None and not parts:
            return []
        self._writable()
        with self._runner.call():  # one call, to its end, however many statements (see PostgresStore.close)
            if ordered and queue not in self._kept_queues:
                await self._keep_heads(queue)
            return await self._shielded(
                self._claim(queue, node_id, limit, lease, self._partition_filter(parts), ordered, due_age),
                self._undo_claim,
            )

    async def _claimable_checked(self, queue: str, parts: list[int] | None, ordered: bool, due_age: float) -> set[int]:
        """The partitions where a claim with these arguments would find work now (a read).

        One statement in autocommit, no row locked; allowed on a read-only store.

        Raises:
            StoreConnectionError: the server stayed unreachable.
        """
        if parts is not None and not parts:
            return set()
        filtered = self._partition_filter(parts)

        limited = await self._queue_limited(queue)

        async def op(conn: asyncpg.Connection, _attempt: int) -> set[int]:
            name = "claimable_partitions"
            heads = False
            if ordered:
                if queue not in self._kept_queues and await self._fetch(conn, "kept_queues", queues=[queue]):
                    self._kept_queues.add(queue)
                # Heads are kept only for queues claimed in order at least once; before the
                # first ordered claim every due task counts (as on SQLite: the claim it wakes
                # computes the heads).
                heads = queue in self._kept_queues
                if heads:
                    name = "claimable_partitions_ordered"
            if limited:  # work whose buckets are empty does not count (its refill is scheduled)
                return await self._claimable_limited(conn, queue, filtered, heads, due_age)
            rows = await self._fetch(
                conn, name, queue=queue, partitions=filtered, min_due_age_s=due_age, now=self._now()
            )
            return {int(r[0]) for r in rows}

        return await self._run(op, what="look for claimable partitions", tx=False, ambiguous_ok=True)

    def _partition_filter(self, parts: list[int] | None) -> list[int] | None:
        """The claim's partition filter: None (no filter) when ``parts`` names every partition.

        A sole node owns all of them; matching every scanned row against a 1,024-item array
        made its claims about 4 times as costly for the server as no filter.
        """
        if parts is not None and len(parts) >= self._partitions and len(set(parts)) == self._partitions:
            return None
        return parts

    def _undo_claim(self, tasks: list[Task]) -> Coroutine[Any, Any, Any] | None:
        if not tasks:
            return None
        ordered = sorted(tasks, key=lambda t: t.id)  # rows locked in id order, as commits lock them
        ids = [t.id for t in ordered]
        tokens = [t.lease_token for t in ordered]

        async def op(conn: asyncpg.Connection, _attempt: int) -> None:
            await self._x(conn, "release_many", ids=ids, tokens=tokens, now=self._now())

        async def run() -> None:
            try:
                await self._run(op, what="hand back a cancelled claim", tx=False, ambiguous_ok=True)
            except CoordError as exc:  # the leases will expire instead
                log.warning("asynccoord.postgres.undo_claim_failed error=%s", exc)
            else:
                notify_settled(self.notifier, tasks)

        return run()

    async def _claim(
        self,
        queue: str,
        node_id: str,
        limit: int,
        lease: float,
        parts: list[int] | None,
        ordered: bool,
        due_age: float,
    ) -> list[Task]:
        params = {
            "queue": queue,
            "node_id": node_id,
            "node_ids": [node_id],
            "lease_s": lease,
            "partitions": parts,
            "min_due_age_s": due_age,
        }
        name = "claim_ordered" if ordered else "claim"

        limited = await self._queue_limited(queue)

        unreadable_keys: dict[int, UnreadableRowError] = {}  # leased rows whose limit keys cannot be read

        async def op_for(n: int) -> list[_Row]:
            if limited:
                leased, _, found = (await self._claim_limited(queue, ordered, due_age, [(node_id, n, lease, parts)]))[0]
                unreadable_keys.update(found)
                return leased
            return await self._claim_statement(name, {**params, "limit": n})

        if parts is None:
            rows = await op_for(limit)
            # Column 21 says whether leases that expired on their last attempt exist (the
            # claim's own snapshot); only an empty claim does not know, and asks.
            exhausted = bool(rows[0][21]) if rows else await self._any_exhausted(queue)
        else:
            rows, exhausted, found = await self._claimer(queue, ordered, due_age, limited).submit(
                ClaimRequest(node_id, limit, lease, parts)
            )
            unreadable_keys.update(found)
        dead = 0
        if exhausted:
            dead = await self._dead_letter_exhausted(queue)
            # Whoever dead-lettered them (this call, or a concurrent claim of another node or
            # process, restricted to its own partitions), their keys' next tasks may be heads
            # now, committed: a claim with room takes those of its partitions, as on SQLite.
            if len(rows) < limit:
                rows += await op_for(limit - len(rows))
        duplicates = [r for r in rows if r[20]]
        settled: set[int] = set()
        if duplicates:
            settled = await self._settle_duplicates(duplicates)
            # Their keys' next tasks became heads: wake this process's owners too (other
            # processes hear of them through NOTIFY).
            notify_partitions(self.notifier, [(queue, int(r[3])) for r in duplicates if r[0] in settled])
        kept = sorted((r for r in rows if not r[20]), key=lambda r: (-r[6], r[0]))
        tasks, unreadable = split_unreadable(kept, task_from_row, payload_at=5, result_at=16, known=unreadable_keys)
        if unreadable:
            try:
                await self._dead_letter_unreadable(unreadable)
            except asyncio.CancelledError:  # the claim's caller is gone: hand its tasks back
                coro = self._undo_claim(tasks)
                if coro is not None:
                    self._spawn(coro)
                raise
        self.events.add(ev.CLAIMS, len(tasks))
        self.events.add(ev.LEASE_EXPIRED, sum(1 for r in rows if r[19]) + dead)
        self.events.add(ev.DEAD_LETTERED, dead)
        self.events.add(ev.DUPLICATE_DELIVERY_SUPPRESSED, len(settled))
        return tasks

    def _claimer(self, queue: str, ordered: bool, due_age: float, limited: bool) -> Batcher[ClaimRequest, Claimed]:
        """The batcher of claims on ``queue`` with this order and minimum due age (``limited``: with rate limits)."""
        shape = (queue, ordered, due_age, limited)
        claimer = self._claimers.get(shape)
        if claimer is None:
            if len(self._claimers) >= MAX_IDLE_CLAIMERS:
                for old in [k for k, b in self._claimers.items() if b.idle]:
                    del self._claimers[old]
            claimer = self._claimers[shape] = Batcher(
                (
                    (lambda requests: self._claim_limited_batch(queue, ordered, due_age, requests))
                    if limited
                    else (lambda requests: self._claim_batch(queue, ordered, due_age, requests))
                ),
                self.config.max_batch_ops,
                key=lambda r: r.node_id,  # a batch's rows are told apart by their lease owner
                name="asynccoord-pg-claim",
                orphaned=self._orphaned_claim,
            )
        return claimer

    async def _claim_statement(self, name: str, params: dict[str, Any]) -> list[_Row]:
        """Run claim statement ``name``; a retry after a lost connection returns what it leased.

        ``params`` are the statement's, but for ``token`` (one per statement, which every
        lease it grants carries) and ``now``; they include ``node_ids``, the lease owners
        ``claimed_by_token`` looks for.
        """
        token = new_token()

        async def op(conn: asyncpg.Connection, attempt: int) -> list[_Row]:
            if attempt > 0:  # the connection was lost while the server may have run the claim
                leased = await self._fetch(conn, "claimed_by_token", token=token, now=self._now(), **params)
                if leased:
                    return leased
            return await self._fetch(conn, name, token=token, now=self._now(), **params)

        return await self._run(op, what="claim", tx=False, ambiguous_ok=True)

    async def _claim_batch(
        self, queue: str, ordered: bool, due_age: float, requests: Sequence[ClaimRequest]
    ) -> list[Claimed]:
        """Run ``requests`` (distinct node ids) in one claim statement; each gets its own rows.

        A lone request runs the one-claim statement. Each result carries whether leases
        that expired on their last attempt exist in the queue: from the statement's rows,
        or, when it leased nothing, from one more statement for the whole batch.
        """
        params: dict[str, Any] = {"queue": queue, "min_due_age_s": due_age, "node_ids": [r.node_id for r in requests]}
        if len(requests) == 1:
            only = requests[0]
            name = "claim_ordered" if ordered else "claim"
            params |= {
                "node_id": only.node_id,
                "limit": only.limit,
                "lease_s": only.lease_s,
                "partitions": only.partitions,
            }
        else:
            name = "claim_ordered_batch" if ordered else "claim_batch"
            # A partition named twice in one claim would be read twice by the ordered form,
            # its heads filling the claim's limit twice over.
            unique = [list(dict.fromkeys(r.partitions)) for r in requests]
            params |= {
                "limits": [r.limit for r in requests],
                "lease_s": [r.lease_s for r in requests],
                "partitions": [p for parts in unique for p in parts],
                "partition_slots": [slot for slot, parts in enumerate(unique, 1) for _ in parts],
            }
        rows = await self._claim_statement(name, params)
        exhausted = bool(rows[0][21]) if rows else await self._any_exhausted(queue)
        mine: dict[str, list[_Row]] = {r.node_id: [] for r in requests}
        for row in rows:
            mine[row[11]].append(row)
        return [(mine[r.node_id], exhausted, {}) for r in requests]

    async def _claim_limited_batch(
        self, queue: str, ordered: bool, due_age: float, requests: Sequence[ClaimRequest]
    ) -> list[Claimed]:
        """Run ``requests`` (distinct node ids) in one limited claim transaction (see :meth:`_claim_limited`)."""
        return await self._claim_limited(
            queue, ordered, due_age, [(r.node_id, r.limit, r.lease_s, r.partitions) for r in requests]
        )

    def _orphaned_claim(self, _request: ClaimRequest, outcome: Claimed) -> None:
        """Hand back the tasks a batch leased for a claim whose caller is gone."""
        coro = self._undo_claim([listed_task_from_row(r) for r in outcome[0]])  # only its lease is used
        if coro is not None:
            self._spawn(coro)

    async def _any_exhausted(self, queue: str) -> bool:
        """Whether ``queue`` has leases that expired on their last attempt (one statement, no transaction)."""

        async def op(conn: asyncpg.Connection, _attempt: int) -> bool:
            return await self._row(conn, "exhausted_keys", queue=queue, now=self._now()) is not None

        return await self._run(op, what="look for exhausted leases", tx=False, ambiguous_ok=True)

    async def _dead_letter_exhausted(self, queue: str) -> int:
        """Dead-letter leases of ``queue`` that expired on their last attempt; return how many."""

        async def op(conn: asyncpg.Connection, _attempt: int) -> int:
            now = self._now()
            pairs = [(r[0], r[1]) for r in await self._fetch(conn, "exhausted_keys", queue=queue, now=now)]
            if not pairs:
                return 0
            kept = await self._lockkey_arrays(conn, pairs)
            keys = sorted({k for _, k in pairs})
            dead = await self._fetch(conn, "dead_letter_exhausted", queue=queue, keys=keys, now=now)
            await self._promote(conn, [(r[1], r[2]) for r in dead if (r[1], r[2]) in kept])
            return len(dead)

        return await self._run(op, what="dead-letter exhausted leases", ambiguous_ok=True)

    async def _settle_duplicates(self, rows: Sequence[_Row]) -> set[int]:
        """Mark claimed tasks whose message id was already processed as done (a second transaction).

        If this fails, the tasks stay leased to nobody and are settled when reclaimed.
        """
        ids = [r[0] for r in rows]
        tokens = [r[12] for r in rows]
        pairs = [(r[1], r[2]) for r in rows]

        async def op(conn: asyncpg.Connection, _attempt: int) -> set[int]:
            kept = await self._lockkey_arrays(conn, pairs)
            done = {
                int(r[0]) for r in await self._fetch(conn, "settle_duplicate", ids=ids, tokens=tokens, now=self._now())
            }
            await self._promote(conn, [p for r, p in zip(rows, pairs, strict=True) if r[0] in done and p in kept])
            return done

        try:
            return await self._run(op, what="settle duplicate deliveries", ambiguous_ok=True)
        except CoordError as exc:
            log.warning("asynccoord.postgres.settle_duplicates_failed error=%s", exc)
            return set()

    async def _unchecked_claim_checked(
        self, queue: str, node_id: str, limit: int, lease: float, parts: list[int] | None
    ) -> list[Task]:
        """Claim as a naive queue does: read due tasks, then mark them running, unconditionally.

        The read and the write are separate statements, so two nodes can claim the
        same task (benchmarks only).
        """
        self._writable()

        async def peek(conn: asyncpg.Connection, _attempt: int) -> list[int]:
            rows = await self._fetch(
                conn,
                "unchecked_peek",
                queue=queue,
                limit=limit,
                partitions=self._partition_filter(parts),
                now=self._now(),
            )
            return [int(r[0]) for r in rows]

        ids = await self._run(peek, what="unchecked_peek", tx=False, ambiguous_ok=True)
        if not ids:
            return []
        token = new_token()

        async def op(conn: asyncpg.Connection, _attempt: int) -> list[_Row]:
            return await self._fetch(
                conn, "unchecked_claim", ids=ids, node_id=node_id, lease_s=lease, token=token, now=self._now()
            )

        rows = await self._run(op, what="unchecked_claim", tx=False)
        self.events.add(ev.CLAIMS, len(rows))
        return [task_from_row(r) for r in rows]
