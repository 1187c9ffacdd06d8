"""Rate limits on PostgreSQL: declared limits and bucket TATs in two tables, taken in the claim's transaction.

:class:`PgRateLimitOps` gives :class:`~asynccoord.backends.postgres.store.PostgresStore`
the verbs of :class:`~asynccoord.contract.ratelimits.RateLimitStore` (``set_rate_limits``,
``rate_limits``, ``report_rate_limited``) and the claim of a queue that declares limits.
That claim is one transaction under the queue's exclusive advisory lock
(``coord_lock_rate_limits``, ``sql/migration_0002.sql``), so the claims of every process and
machine on the database take tokens one transaction at a time, each on the server clock
read once the lock is held: it walks the candidates a claim would consider, best first,
through a cursor, lets :class:`~asynccoord.contract.ratelimits.Admission` decide which
go, leases those (``SKIP LOCKED``: a row another transaction holds is passed over, and
its token not taken) and stores the TATs. The statements a queue without limits claims
with are unchanged but for one condition that leaves a task naming limit keys to this
claim whenever its queue declares limits (``sql/queries.sql``); which claim a queue needs
is cached for :data:`LIMITED_CACHE_S` per store (a stale answer only delays limited
tasks: the condition is checked by the server). That read returns the limits, and
:class:`~asynccoord.backends.limitwatch.LimitWatch` warns when another process changed
them. Queries: ``sql/ratelimits.sql``.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import asyncpg

from ... import events as ev
from ...contract.queue import PreparedTask, check_task
from ...contract.ratelimits import (
    Admission,
    HeldBucket,
    RateLimit,
    check_held_buckets_args,
    check_pause_target,
    check_rate_limits,
    check_retry_after_s,
    limits_from_rows,
    pause_targets,
    paused_tat,
    refused_task_delay_s,
    warn_undeclared_dimensions,
)
from ...errors import LeaseLostError, TaskNotFoundError, UnreadableRowError
from ...models import Task, TaskStatus
from ...validation import check_name
from ..limitwatch import LimitWatch
from ..refill import RefillWaker
from ..rows import limit_keys_of, listed_task_from_row, new_token
from .heads import PgHeads
from .statements import Row, lost_reason, settled_by_us

__all__ = ("LIMITED_CACHE_S", "LIMITS_LOCK_IDLE_S", "Claimed", "LimitedClaim", "PgRateLimitOps")

LIMITED_CACHE_S = 1.0
"""Seconds a store trusts its answer to "does this queue declare limits" (local monotonic time)."""

LIMITS_LOCK_IDLE_S = 2.0
"""Longest a transaction holding a queue's rate-limit lock may sit idle waiting for its client
before the server ends the session (``SET LOCAL idle_in_transaction_session_timeout``; the
store's ``idle_in_transaction_timeout_s`` when lower), seconds. Every claim of the queue, in
every process, waits for that lock: a client frozen while holding it (SIGSTOP, a stalled host)
would otherwise stop the queue for the session's whole timeout (30 s by default). The
transaction waits for nothing but the client's own statements, milliseconds apart."""

_FIRST_CHUNK = 64
_MAX_CHUNK = 2048
_Bucket = tuple[str, str]
_Candidate = tuple[int, int, dict[str, str], int]  # id, partition, limit keys, request

LimitedClaim = tuple[str, int, float, "list[int] | None"]
"""One claim of a limited claim batch: node id, limit, lease (s), partitions (None: all)."""

Claimed = tuple[list[Row], bool, dict[int, UnreadableRowError]]
"""One claim's answer: its leased rows, whether the queue has exhausted leases, and those of its
rows whose stored ``limit_keys`` cannot be read (by id, with why: the claim dead-letters them)."""

_UNREADABLE_JSON = (asyncpg.DataError,)
"""What the server raises for a ``limit_keys`` text, written by another tool, that its ``::jsonb``
cast or ``jsonb_each_text`` refuses: not JSON (22P02), not an object (22023), a ``\\u0000``
escape (22P05), a number over ``numeric``'s range (22003): the data exceptions, class 22."""


class _UnreadableKeys(Exception):
    """A limited claim's candidate read met ``limit_keys`` the server cannot read (see ``_claim_limited``)."""


def _readable_keys(task_id: int, text: Any) -> dict[str, str]:
    """A held task's limit keys for a pause; none when they cannot be read (its next claim dead-letters it)."""
    keys = limit_keys_of(task_id, text)
    return {} if isinstance(keys, UnreadableRowError) else keys


def _buckets_of(rows: Sequence[Row]) -> set[_Bucket]:
    """The buckets the candidate ``rows`` name (their readable ``limit_keys``, column 3)."""
    out: set[_Bucket] = set()
    for row in rows:
        keys = limit_keys_of(int(row[0]), row[3])
        if isinstance(keys, dict):
            out.update(keys.items())
    return out


def _named(rows: Sequence[Row], unreadable: Mapping[int, UnreadableRowError]) -> dict[int, UnreadableRowError]:
    """The entries of ``unreadable`` for ``rows`` (one request's leased rows)."""
    return {int(r[0]): unreadable[int(r[0])] for r in rows if int(r[0]) in unreadable}


class PgRateLimitOps(PgHeads):
    """The rate-limit verbs and the limited claim of the PostgreSQL store (see the module docstring)."""

    if TYPE_CHECKING:
        idle_in_transaction_timeout_s: float

        async def _any_exhausted(self, queue: str) -> bool: ...

    @functools.cached_property
    def _refill(self) -> RefillWaker:
        return RefillWaker(self.notifier)

    @functools.cached_property
    def _limit_watch(self) -> LimitWatch:
        return LimitWatch()

    @functools.cached_property
    def _limited_queues(self) -> dict[str, tuple[bool, float]]:
        return {}  # queue -> (declares limits, monotonic time the answer expires)

    async def _lock_limits(self, conn: asyncpg.Connection, queue: str) -> Row:
        """Take ``queue``'s rate-limit lock in ``conn``'s transaction (until it ends), bounding how
        long the transaction may then wait for this client (:data:`LIMITS_LOCK_IDLE_S`).

        Returns:
            The row of ``lock_rate_limits``: the store clock read once the lock is held, then the
            queue's declared limits as four arrays (dimension, count, per_s, burst).
        """
        idle_s = min(self.idle_in_transaction_timeout_s, LIMITS_LOCK_IDLE_S)
        rows = await self._fetch(
            conn, "lock_rate_limits", queue=queue, now=self._now(), idle_ms=str(max(1, round(idle_s * 1000)))
        )
        return rows[0]

    async def set_rate_limits(self, queue: str, limits: Sequence[RateLimit]) -> None:
        """Declare ``queue``'s limits for every process of the database (see ``RateLimitStore``).

        One transaction under the queue's advisory lock: a claim sees the old limits or the
        new ones, never a mix. Other stores see the change within :data:`LIMITED_CACHE_S`.

        Raises:
            InvalidTypeError, InvalidArgumentError: bad arguments (nothing written).
            StoreConnectionError: the server stayed unreachable.
        """
        check_name("queue", queue)
        checked = check_rate_limits(limits)
        self._writable()

        async def op(conn: asyncpg.Connection, _attempt: int) -> None:
            await self._lock_limits(conn, queue)
            await self._x(conn, "delete_rate_limits", queue=queue)
            for limit in checked:
                await self._x(
                    conn,
                    "insert_rate_limit",
                    queue=queue,
                    dimension=limit.dimension,
                    count=limit.count,
                    per_s=limit.per_s,
                    burst=limit.burst,
                )

        await self._run(op, what="set rate limits", ambiguous_ok=True)  # the same rows whichever attempt wrote them
        self._limit_watch.declared(queue, checked)
        self._limited_queues[queue] = (bool(checked), time.monotonic() + LIMITED_CACHE_S)

    async def rate_limits(self, queue: str) -> list[RateLimit]:
        """``queue``'s declared limits, by dimension name (one statement)."""
        check_name("queue", queue)
        found = await self._declared(queue)
        return [found[d] for d in sorted(found)]

    async def limited_queues(self) -> list[str]:
        """The queues that declare limits, by name (one statement)."""

        async def op(conn: asyncpg.Connection, _attempt: int) -> list[Row]:
            return await self._fetch(conn, "limited_queues")

        rows = await self._run(op, what="read the queues with rate limits", tx=False, ambiguous_ok=True)
        return sorted(str(row[0]) for row in rows)

    async def held_buckets(self, queue: str | None = None, limit: int = 50) -> list[HeldBucket]:
        """The buckets with no token now on the server clock, longest wait first (one statement, a read).

        See :class:`~asynccoord.contract.ratelimits.RateLimitStore`; query ``held_buckets``.
        """
        name, most = check_held_buckets_args(queue, limit)

        async def op(conn: asyncpg.Connection, _attempt: int) -> list[Row]:
            return await self._fetch(conn, "held_buckets", queue=name, now=self._now(), limit=most)

        rows = await self._run(op, what="read held rate-limit buckets", tx=False, ambiguous_ok=True)
        return [HeldBucket(queue=q, dimension=d, key=k, wait_s=max(0.0, float(w))) for q, d, k, w in rows]

    async def _declared(self, queue: str) -> dict[str, RateLimit]:
        async def op(conn: asyncpg.Connection, _attempt: int) -> list[Row]:
            return await self._fetch(conn, "rate_limits", queue=queue)

        return limits_from_rows(await self._run(op, what="read rate limits", tx=False, ambiguous_ok=True))

    async def _check_dimensions(self, prepared: Sequence[PreparedTask]) -> None:
        """Log the limit keys of dimensions their queues do not declare (a read; only when some task names keys)."""
        queues = sorted({p.queue for p in prepared if p.limit_keys})
        declared = {q: await self._declared(q) for q in queues}
        for p in prepared:
            if p.limit_keys:
                warn_undeclared_dimensions(p.queue, p.limit_keys, list(declared[p.queue]))

    @functools.cached_property
    def _limited_probes(self) -> dict[str, asyncio.Task[bool]]:
        return {}  # queue -> the read of its limits in flight

    async def _queue_limited(self, queue: str) -> bool:
        """Whether ``queue`` declares limits: the cached answer, or one statement when it is older than 1 s.

        Concurrent callers share one statement (the process's nodes claim together, and
        their claims must reach the claim batcher together). A caller cancelled meanwhile
        leaves it running for the others. An answer in the second half of its life is
        still returned, and the statement started in the background: the claims of a queue
        claimed at least every half second never wait for it (it was one more round trip
        on a claim each second, after the wake-up that claim answered).
        """
        known = self._limited_queues.get(queue)
        if known is not None:
            left_s = known[1] - time.monotonic()
            if left_s > 0:
                if left_s < LIMITED_CACHE_S / 2 and queue not in self._limited_probes:
                    self._probe_limited_soon(queue)
                return known[0]
        probe = self._limited_probes.get(queue) or self._probe_limited_soon(queue)
        return await asyncio.shield(probe)

    def _probe_limited_soon(self, queue: str) -> asyncio.Task[bool]:
        """Start the read of ``queue``'s limits (``rate_limits``; close() waits for it)."""
        probe = asyncio.ensure_future(self._probe_limited(queue))
        self._limited_probes[queue] = probe
        self._background.add(probe)
        probe.add_done_callback(functools.partial(self._probed, queue))
        return probe

    async def _probe_limited(self, queue: str) -> bool:
        """Read ``queue``'s declared limits: whether it has any, and (to :class:`LimitWatch`) which."""

        async def op(conn: asyncpg.Connection, _attempt: int) -> list[Row]:
            return await self._fetch(conn, "rate_limits", queue=queue)

        since = self._limit_watch.generation
        limits = limits_from_rows(await self._run(op, what="look for rate limits", tx=False, ambiguous_ok=True))
        self._limit_watch.enforced(queue, limits, since)  # one probe of a queue at a time: in order
        limited = bool(limits)
        if len(self._limited_queues) > 4096:  # queues named on the fly: forget the old answers
            self._limited_queues.clear()
        self._limited_queues[queue] = (limited, time.monotonic() + LIMITED_CACHE_S)
        return limited

    def _probed(self, queue: str, done: asyncio.Future[bool]) -> None:
        self._background.discard(done)
        if self._limited_probes.get(queue) is done:
            del self._limited_probes[queue]
        if not done.cancelled():
            done.exception()  # retrieved: every caller cancelled meanwhile leaves no warning

    async def _claim_limited(
        self, queue: str, ordered: bool, due_age: float, requests: Sequence[LimitedClaim]
    ) -> list[Claimed]:
        """Claims of a queue with limits: one transaction under the queue's advisory lock for all of ``requests``.

        ``lock_rate_limits`` takes the lock and reads the clock and the limits; then
        ``limited_candidates`` (``_ordered``: keys' heads only) reads the candidates of the
        requests' partitions in the claims' order, a chunk at a time with the stored TATs of
        their buckets. Each candidate goes to the first request that names its partition
        and has room (none: passed over, no token taken), if
        :class:`~asynccoord.contract.ratelimits.Admission` admits it, until every request
        is full or no candidate is left; ``claim_ids`` leases the chosen to their requests'
        owners (passing over a row another transaction holds or that changed since the
        read) and stores the TATs of the tokens they took. Four round trips (BEGIN, lock,
        one chunk, lease) and COMMIT in the common case, for the whole batch: a process's
        nodes woken together wait for the queue's lock once, not once each. After a lost
        connection the retry returns what an earlier attempt leased (by the claim's
        token), as the plain claim does. Then counts the held-back work and schedules the
        refill wake-ups of its partitions.

        A candidate whose stored ``limit_keys`` cannot be read (a row written by another
        tool) is given to a request with room without a token, and its request's answer
        names it: the claim dead-letters it. When such a text makes the server's read of
        the chunk's TATs fail (not JSON, or not an object), the transaction is run again
        without that read (``plain``), the TATs loaded by ``bucket_tats`` instead.

        Args:
            queue: The queue.
            ordered: Keys' heads only.
            due_age: The claims' ``min_due_age_s``.
            requests: ``(node_id, limit, lease_s, partitions or None)`` per claim, with
                distinct node ids.

        Returns:
            Per request: its leased rows (the claim statements' columns), whether the
            queue has leases that expired on their last attempt, and its leased rows whose
            limit keys cannot be read.

        Raises:
            StoreConnectionError: the server stayed unreachable.
        """
        owners = [r[0] for r in requests]
        scopes = [None if r[3] is None else set(r[3]) for r in requests]
        union = None if any(sc is None for sc in scopes) else sorted({p for r in requests for p in r[3] or ()})
        params: dict[str, Any] = {
            "queue": queue,
            "node_ids": owners,
            "partitions": union,
            "min_due_age_s": due_age,
            "ordered": ordered,
            "token": new_token(),
        }
        walk = "limited_candidates_ordered" if ordered else "limited_candidates"
        wanted = sum(r[1] for r in requests)
        plain = False
        unreadable: dict[int, UnreadableRowError] = {}

        async def op(conn: asyncpg.Connection, attempt: int) -> tuple[list[Row], Admission | None]:
            locked = await self._lock_limits(conn, queue)
            now = float(locked[0])
            unreadable.clear()
            if attempt > 0:  # the connection was lost while the server may have committed the claim
                leased = await self._fetch(conn, "claimed_by_token", **params, now=now)
                if leased:
                    return leased, None
            limits = limits_from_rows(list(zip(locked[1], locked[2], locked[3], locked[4], strict=True)))
            tats: dict[_Bucket, float] = {}
            admission = Admission(limits, now, lambda d, k: tats.get((d, k)))
            room = [r[1] for r in requests]
            chosen: list[_Candidate] = []
            chunk = max(_FIRST_CHUNK, 4 * wanted)
            after: tuple[int | None, int | None] = (None, None)
            while len(chosen) < wanted:
                try:
                    rows = await self._fetch(
                        conn,
                        walk,
                        **params,
                        now=now,
                        chunk=chunk,
                        after_priority=after[0],
                        after_id=after[1],
                        plain=plain,
                    )
                except _UNREADABLE_JSON as exc:
                    if plain:
                        raise
                    raise _UnreadableKeys from exc
                if plain:
                    await self._load_tats(conn, queue, _buckets_of(rows) - tats.keys(), tats)
                for row in rows:
                    partition = int(row[1])
                    slot = next((i for i, sc in enumerate(scopes) if room[i] and (sc is None or partition in sc)), None)
                    if slot is None:
                        continue
                    if row[4] is not None:
                        tats.update(zip(zip(row[4], row[5], strict=True), row[6], strict=True))
                    keys = limit_keys_of(int(row[0]), row[3])
                    if isinstance(keys, UnreadableRowError):  # leased without a token, then dead-lettered
                        unreadable[keys.task_id] = keys
                        keys = {}
                    if admission.admit(keys, partition):
                        chosen.append((int(row[0]), partition, keys, slot))
                        room[slot] -= 1
                        if len(chosen) == wanted:
                            break
                if len(rows) < chunk:
                    break
                after = (int(rows[-1][2]), int(rows[-1][0]))
                chunk = min(2 * chunk, _MAX_CHUNK)
            if not chosen:
                return [], admission
            changed = sorted(admission.changed.items())
            leased_rows = await self._fetch(
                conn,
                "claim_ids",
                **params,
                ids=[c[0] for c in chosen],
                owners=[requests[c[3]][0] for c in chosen],
                lease_s=[requests[c[3]][2] for c in chosen],
                dimensions=[d for (d, _), _ in changed],
                keys=[k for (_, k), _ in changed],
                tats=[tat for _, tat in changed],
                now=now,
            )
            if len(leased_rows) < len(chosen):  # passed over: store only the leased tasks' tokens
                leased_ids = {int(r[0]) for r in leased_rows}
                replay = Admission(limits, now, lambda d, k: tats.get((d, k)))
                for task_id, partition, keys, _slot in chosen:
                    if task_id in leased_ids:
                        replay.admit(keys, partition)
                await self._store_tats(conn, queue, replay.changed)
            return leased_rows, admission

        try:
            rows, admission = await self._run(op, what="claim", ambiguous_ok=True)
        except _UnreadableKeys:  # rolled back: again, the TATs read apart from the candidates
            plain = True
            rows, admission = await self._run(op, what="claim", ambiguous_ok=True)
        if admission is not None:
            if admission.held:
                self.events.add(ev.RATE_LIMIT_HELD)
            self._refill.schedule(queue, admission.wake_at, admission.now)
        exhausted = bool(rows[0][21]) if rows else await self._any_exhausted(queue)
        mine: dict[str, list[Row]] = {owner: [] for owner in owners}
        for row in rows:
            mine[row[11]].append(row)
        return [(mine[owner], exhausted, _named(mine[owner], unreadable)) for owner in owners]

    async def _load_tats(
        self, conn: asyncpg.Connection, queue: str, buckets: set[_Bucket], into: dict[_Bucket, float]
    ) -> None:
        """Read the stored TATs of ``buckets`` into ``into`` (one statement; a bucket never used has none)."""
        if not buckets:
            return
        ordered = sorted(buckets)
        rows = await self._fetch(
            conn, "bucket_tats", queue=queue, dimensions=[d for d, _ in ordered], keys=[k for _, k in ordered]
        )
        for dimension, key, tat in rows:
            into[(dimension, key)] = float(tat)

    async def _store_tats(self, conn: asyncpg.Connection, queue: str, changed: dict[_Bucket, float]) -> None:
        if not changed:
            return
        ordered = sorted(changed.items())
        await self._x(
            conn,
            "set_bucket_tat",
            queue=queue,
            dimensions=[d for (d, _), _ in ordered],
            keys=[k for (_, k), _ in ordered],
            tats=[tat for _, tat in ordered],
        )

    async def _claimable_limited(
        self, conn: asyncpg.Connection, queue: str, parts: list[int] | None, ordered: bool, due_age: float
    ) -> set[int]:
        """claimable_partitions of a queue with limits: partitions with work that has its tokens now.

        Schedules the refill wake-up of each partition whose due work is all held back. A due
        task whose ``limit_keys`` text the server cannot read (not JSON, or not an object:
        written by another tool) makes every partition with due work count, until a claim
        dead-letters it.
        """
        name = "claimable_partitions_limited_ordered" if ordered else "claimable_partitions_limited"
        try:
            rows = await self._fetch(conn, name, queue=queue, partitions=parts, min_due_age_s=due_age, now=self._now())
        except _UNREADABLE_JSON:  # a limit_keys text written by another tool: all due work counts (the claim
            # dead-letters that task); an autocommit statement, so the session goes on
            name = "claimable_partitions_ordered" if ordered else "claimable_partitions"
            rows = await self._fetch(conn, name, queue=queue, partitions=parts, min_due_age_s=due_age, now=self._now())
            return {int(r[0]) for r in rows}
        found = {int(r[0]) for r in rows if r[1] is None}
        wake = {int(r[0]): float(r[1]) for r in rows if r[1] is not None}
        if wake:
            self._refill.schedule(queue, wake, float(rows[0][2]))
        return found

    async def report_rate_limited(
        self, task: Task, retry_after_s: float, *, dimension: str | None = None, key: str | None = None
    ) -> Task:
        """Pause the task's bucket(s) for ``retry_after_s`` and hand it back, its attempt not counted.

        See :class:`~asynccoord.contract.ratelimits.RateLimitStore`. One transaction under the
        queue's advisory lock: the pause, then the compare-and-set hand-back
        (``release_rate_limited``). A retry after a lost connection recognizes its own
        earlier hand-back; the pause is idempotent (a TAT only rises).

        Raises:
            LeaseLostError: the lease is no longer the caller's (the pause still applies).
            TaskNotFoundError: no such task.
            InvalidTypeError, InvalidArgumentError: bad arguments (nothing written).
            StoreConnectionError: the server stayed unreachable.
        """
        check_task(task)
        retry = check_retry_after_s(retry_after_s)
        dim, chosen = check_pause_target(dimension, key)
        self._writable()
        text = f"RateLimited: the provider asked to retry after {retry:g} s"

        async def op(conn: asyncpg.Connection, attempt: int) -> tuple[Row | None, str | None, float, str]:
            stored = await self._row(conn, "task_limit_keys", id=task.id)
            queue = task.queue if stored is None else str(stored[0])
            locked = await self._lock_limits(conn, queue)
            now = float(locked[0])
            limits = limits_from_rows(list(zip(locked[1], locked[2], locked[3], locked[4], strict=True)))
            keys = _readable_keys(task.id, None if stored is None else stored[1])
            targets = pause_targets(limits, keys, dim, chosen)
            tats: dict[_Bucket, float] = {}
            await self._load_tats(conn, queue, set(targets), tats)
            paused = {(d, k): paused_tat(tats.get((d, k)), now + retry, limits[d]) for d, k in targets}
            await self._store_tats(conn, queue, paused)
            row = await self._row(
                conn,
                "release_rate_limited",
                id=task.id,
                lease_token=task.lease_token,
                version=task.version,
                delay_s=refused_task_delay_s(targets, keys, retry),
                error=text,
                now=now,
            )
            if row is not None:
                return row, None, now, queue
            current = await self._row(conn, "select_task", id=task.id)
            if attempt > 0 and settled_by_us(current, task, TaskStatus.PENDING):
                return current, None, now, queue  # our earlier attempt committed
            return None, lost_reason(current, task), now, queue

        row, reason, now, queue = await self._run(op, what="report a rate limit", ambiguous_ok=True)
        self.events.add(ev.PROVIDER_RATE_LIMITED)
        if row is None:
            if reason is None:
                raise TaskNotFoundError(task.id)
            raise LeaseLostError(task.id, reason)  # a refused hand-back is no stale commit (lease_lost is counted)
        out = listed_task_from_row(row)
        self._refill.schedule(queue, {out.partition: now + retry}, now)
        return out
