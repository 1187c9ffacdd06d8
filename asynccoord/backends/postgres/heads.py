"""Per-key heads on PostgreSQL: key row locks, head upkeep of the queues claimed in order, promotion.

Only queues claimed in order keep heads (``coord_ordered_queues``): the first ordered
claim or continuation of a queue computes them (``coord_keep_heads``, under the queue's
exclusive advisory lock); every transition that changes a key's active set share-locks
its queue and, if the queue keeps heads, locks the key's row in ``coord_task_keys``
(sorted) before it writes, and promotes the key's next head after. See
:class:`PgHeads` for the whole protocol.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Collection, Sequence

import asyncpg

from .statements import PgStatements

__all__ = ("PgHeads", "key_arrays")

log = logging.getLogger("asynccoord.backends.postgres.store")


def key_arrays(pairs: Collection[tuple[str, str]]) -> dict[str, list[str]]:
    """Sorted distinct ``(queue, partition_key)`` pairs as the two arrays lock_keys takes."""
    ordered = sorted(set(pairs))
    return {"queues": [q for q, _ in ordered], "keys": [k for _, k in ordered]}


class PgHeads(PgStatements):
    """Key locks and head upkeep, shared by the claim, commit and settle statements.

    Per-key order is kept by the ``is_head`` column (the earliest active task of a
    ``(queue, partition_key)``; ordered claims scan only heads). Only queues claimed in
    order keep heads (``coord_ordered_queues``; the first ordered claim or continuation
    of a queue computes them, ``coord_keep_heads``), so a queue claimed without order
    pays no key lock and no promotion (its ``is_head`` is NULL). The database enforces at
    most one head per key (unique partial index ``coord_tasks_one_head``). Every
    transition that changes a key's active set (enqueue, complete, dead-letter, requeue)
    first takes a shared advisory lock on its queue (which that first ordered claim takes
    exclusively) and, if the queue keeps heads, the key's row lock in ``coord_task_keys``
    (sorted), so head upkeep always sees the committed state of the key. Promotion gives
    a key without a head its earliest active task (``coord_tasks_key_order`` holds the
    non-head ones); a head stays until it leaves the active set. Ids are drawn before an
    enqueue takes its keys' locks, so a task may commit after a later-drawn task of its
    key: it then follows that one, in the order the enqueues committed
    (``migration_0007.sql``).
    """

    _kept_queues: set[str]
    _keeping: dict[str, asyncio.Future[None]]

    async def _lockkey_arrays(self, conn: asyncpg.Connection, pairs: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        """Take the row locks of the keys whose queues keep per-key heads; return those keys.

        Call it in a transaction, before the transition writes anything. Only queues that
        nodes have claimed in order keep heads (``coord_ordered_queues``).
        A queue not yet seen keeping them is share-locked first (``coord_share_queues``,
        held to the commit) and its flag read in the next statement, so a queue starting to
        keep heads meanwhile (:meth:`_keep_heads`) waits for this transaction. The keys of
        the other queues need neither a lock nor a promotion.
        """
        unknown = sorted({q for q, _ in pairs} - self._kept_queues)
        if unknown:
            await self._x(conn, "share_queues", queues=unknown)
            self._kept_queues.update(r[0] for r in await self._fetch(conn, "kept_queues", queues=unknown))
        kept = {p for p in pairs if p[0] in self._kept_queues}
        if kept:
            await self._x(conn, "lock_keys", **key_arrays(kept))
        return kept

    async def _keep_heads(self, queue: str) -> None:
        """Make ``queue`` keep per-key heads from now on (before its first ordered claim or continuation).

        ``coord_keep_heads``: under the queue's exclusive advisory lock
        (it waits for the transitions in flight that decided not to keep heads), records
        the queue and marks each key's earliest active task as its head. Nobody is woken:
        the tasks were announced at enqueue, and every ordered claim comes after this. Once
        per queue and store: concurrent first claims (every node of a process waking to the
        queue's first tasks) share one call, rather than each holding a connection of the
        pool while it waits for the first one's advisory lock. A caller cancelled meanwhile
        leaves the call running for the others (:meth:`close` waits for it); an error
        reaches every caller, and the next call tries again.
        """
        if queue in self._kept_queues:
            return
        running = self._keeping.get(queue)
        if running is None:
            running = asyncio.ensure_future(self._keep_heads_once(queue))
            self._keeping[queue] = running
            self._background.add(running)
            running.add_done_callback(functools.partial(self._kept_heads, queue))
        await asyncio.shield(running)

    async def _keep_heads_once(self, queue: str) -> None:
        async def op(conn: asyncpg.Connection, _attempt: int) -> int:
            return int(await self._val(conn, "keep_heads", queue=queue))

        heads = await self._run(op, what="keep per-key heads", ambiguous_ok=True)
        self._kept_queues.add(queue)
        if heads:
            log.debug("asynccoord.postgres.keep_heads queue=%s heads=%d", queue, heads)

    def _kept_heads(self, queue: str, done: asyncio.Future[None]) -> None:
        """Forget a finished :meth:`_keep_heads_once` (its error, if any, reached its callers)."""
        self._background.discard(done)
        if self._keeping.get(queue) is done:
            del self._keeping[queue]
        if not done.cancelled():
            done.exception()  # retrieved: every caller cancelled meanwhile leaves no warning

    async def _promote(self, conn: asyncpg.Connection, pairs: Collection[tuple[str, str]]) -> None:
        """Mark the new heads of these keys (under their row locks) and notify other processes of them."""
        if not pairs:
            return
        promoted = await self._fetch(conn, "promote_heads", **key_arrays(pairs))
        by_queue: dict[str, set[int]] = {}
        for queue, partition, _run_at in promoted:
            by_queue.setdefault(queue, set()).add(partition)
        for queue, partitions in by_queue.items():
            await self._notify(conn, queue, len(partitions), partitions)
