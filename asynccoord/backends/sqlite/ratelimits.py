"""Rate limits on SQLite: declared limits and bucket TATs in two tables, taken in the claim's write transaction.

:class:`SQLiteRateLimitOps` is a mixin of :class:`~asynccoord.backends.sqlite.store.SQLiteStore`
(``set_rate_limits``, ``rate_limits``, ``report_rate_limited``), and :func:`claim_limited`
is the claim of a queue that declares limits. Every write runs in the store's one
``BEGIN IMMEDIATE`` transaction of its group commit, so the claims of every process on
the file take tokens one transaction at a time, on the store clock read at its start:
a bucket's TAT is read and written under the database's write lock, never raced. The
claim's own probe (``claim_probe``) says whether the queue has limits, so a queue without
any claims with the statements it always had. Each claim reports the limits it enforced to
:class:`~asynccoord.backends.limitwatch.LimitWatch`, which warns when another process
changed them. Schema: ``migration_0001.sql``; queries:
``sql/ratelimits.sql``; semantics: :class:`~asynccoord.contract.ratelimits.RateLimitStore`.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ... import events as ev
from ...contract.queue import check_task
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
from ...events import EventCounter
from ...models import Task
from ...notify import WorkNotifier
from ...validation import check_name
from ..limitwatch import LimitWatch
from ..refill import RefillWaker
from ..rows import limit_keys_of, listed_task_from_row
from ..sqlfiles import load_queries

if TYPE_CHECKING:
    from ...contract.queue import PreparedTask
    from .writer import GroupCommitter, Operation

__all__ = ("SQLiteRateLimitOps", "claim_limited")

R = load_queries("sqlite")

_Row = tuple[Any, ...]

_NO_LIMITS: dict[str, RateLimit] = {}  # what a claim of a queue without limits enforced (never changed)


def _limits(db: sqlite3.Connection, queue: str) -> dict[str, RateLimit]:
    return limits_from_rows(db.execute(R["rate_limits"], {"queue": queue}).fetchall())


def _loader(db: sqlite3.Connection, queue: str) -> Callable[[str, str], float | None]:
    sql = R["bucket_tat"]

    def load(dimension: str, key: str) -> float | None:
        row = db.execute(sql, {"queue": queue, "dimension": dimension, "key": key}).fetchone()
        return None if row is None else float(row[0])

    return load


def _store_tats(db: sqlite3.Connection, queue: str, changed: dict[tuple[str, str], float]) -> None:
    sql = R["set_bucket_tat"]
    for (dimension, key), tat in changed.items():
        db.execute(sql, {"queue": queue, "dimension": dimension, "key": key, "tat": tat})


def claim_limited(
    db: sqlite3.Connection, now: float, params: dict[str, Any], ordered: bool, expired: bool = True
) -> tuple[list[_Row], Admission, dict[int, UnreadableRowError]]:
    """The claim of a queue with limits, inside the claim's write transaction.

    Walks the candidates a claim would consider (``limited_candidates``: due pending
    tasks and expired leases, keys' heads only when ``ordered``), best first, and takes
    each whose buckets all have a token (:class:`~asynccoord.contract.ratelimits.Admission`)
    until ``params["limit"]`` are chosen; then stores the TATs and leases the chosen
    (``claim_ids``). A walk reads only as far as it must: a throttled key's backlog costs
    one step per task it walks past (keys' heads only in an ordered queue). With no lease
    of the queue expired (``expired`` false, from the claim's probe) the walk reads the
    pending tasks in index order (``limited_pending``): no sort of every due task before
    the first row, so a claim of a deep backlog costs what it takes, not the backlog. A
    candidate whose stored ``limit_keys`` cannot be read (a row written by another tool)
    is chosen without a token: the claim dead-letters it.

    Returns:
        The leased rows (the claims' columns), the admission (tokens taken, tasks held
        back, when they may go), and the chosen candidates whose limit keys cannot be
        read, by id, with why.
    """
    queue, limit = params["queue"], params["limit"]
    admission = Admission(_limits(db, queue), now, _loader(db, queue))
    if expired:
        sql = R["limited_candidates_ordered"] if ordered else R["limited_candidates"]
    else:
        sql = R["limited_pending_ordered"] if ordered else R["limited_pending"]
    chosen: list[int] = []
    unreadable: dict[int, UnreadableRowError] = {}
    cursor = db.execute(
        sql, {"queue": queue, "now": now, "min_due_age_s": params["min_due_age_s"], "partitions": params["partitions"]}
    )
    try:
        for task_id, partition, text in cursor:
            keys = limit_keys_of(task_id, text)
            if isinstance(keys, UnreadableRowError):
                unreadable[task_id] = keys
            elif not admission.admit(keys, partition):
                continue
            chosen.append(task_id)
            if len(chosen) == limit:
                break
    finally:
        cursor.close()
    _store_tats(db, queue, admission.changed)
    if not chosen:
        return [], admission, unreadable
    rows = db.execute(R["claim_ids"], {**params, "ids": json.dumps(chosen), "now": now}).fetchall()
    return rows, admission, unreadable


def _readable_keys(task_id: int, text: Any) -> dict[str, str]:
    """A held task's limit keys for a pause; none when they cannot be read (its next claim dead-letters it)."""
    keys = limit_keys_of(task_id, text)
    return {} if isinstance(keys, UnreadableRowError) else keys


class SQLiteRateLimitOps:
    """The :class:`~asynccoord.contract.ratelimits.RateLimitStore` verbs of the SQLite store.

    A mixin: it relies on the store's ``_write`` (group-committed operation), ``_read``, ``_w``,
    ``events`` and ``notifier``.
    """

    events: EventCounter
    notifier: WorkNotifier

    if TYPE_CHECKING:

        async def _write(
            self, fn: Operation[Any], undo: Callable[[Any], Operation[Any] | None] | None = None
        ) -> Any: ...

        async def _read(self, fn: Callable[[sqlite3.Connection], Any]) -> Any: ...

        def _w(self) -> GroupCommitter: ...

    @functools.cached_property
    def _refill(self) -> RefillWaker:
        return RefillWaker(self.notifier)

    @functools.cached_property
    def _limit_watch(self) -> LimitWatch:
        return LimitWatch()

    async def set_rate_limits(self, queue: str, limits: Sequence[RateLimit]) -> None:
        """Declare ``queue``'s limits for every process on the file (see ``RateLimitStore``)."""
        check_name("queue", queue)
        checked = check_rate_limits(limits)

        def op(db: sqlite3.Connection, now: float) -> None:
            db.execute(R["delete_rate_limits"], {"queue": queue})
            for limit in checked:
                db.execute(
                    R["insert_rate_limit"],
                    {
                        "queue": queue,
                        "dimension": limit.dimension,
                        "count": limit.count,
                        "per_s": limit.per_s,
                        "burst": limit.burst,
                    },
                )

        await self._write(op)
        self._limit_watch.declared(queue, checked)

    async def rate_limits(self, queue: str) -> list[RateLimit]:
        """``queue``'s declared limits, by dimension name."""
        check_name("queue", queue)
        found: dict[str, RateLimit] = await self._read(lambda db: _limits(db, queue))
        return [found[d] for d in sorted(found)]

    async def limited_queues(self) -> list[str]:
        """The queues that declare limits, by name: one read on the reader connection."""
        rows: list[_Row] = await self._read(lambda db: db.execute(R["limited_queues"]).fetchall())
        return sorted(str(queue) for (queue,) in rows)

    async def held_buckets(self, queue: str | None = None, limit: int = 50) -> list[HeldBucket]:
        """The buckets with no token now, longest wait first: one read on the reader connection.

        See :class:`~asynccoord.contract.ratelimits.RateLimitStore`; query ``held_buckets``.
        """
        name, most = check_held_buckets_args(queue, limit)
        writer = self._w()

        def read(db: sqlite3.Connection) -> list[_Row]:
            now = writer.now(db)
            rows: list[_Row] = db.execute(R["held_buckets"], {"queue": name, "now": now, "limit": most}).fetchall()
            return rows

        rows = await self._read(read)
        return [HeldBucket(queue=q, dimension=d, key=k, wait_s=max(0.0, float(w))) for q, d, k, w in rows]

    async def _check_dimensions(self, prepared: Sequence[PreparedTask]) -> None:
        """Log the limit keys of dimensions their queues do not declare (a read; only when some task names keys)."""
        queues = sorted({p.queue for p in prepared if p.limit_keys})
        if not queues:
            return
        declared: dict[str, dict[str, RateLimit]] = await self._read(lambda db: {q: _limits(db, q) for q in queues})
        for p in prepared:
            if p.limit_keys:
                warn_undeclared_dimensions(p.queue, p.limit_keys, list(declared[p.queue]))

    def _after_claim(self, queue: str, admission: Admission | None, since: int) -> None:
        """Note the limits the claim enforced (none without ``admission``), from the store's generation ``since``
        (:class:`~asynccoord.backends.limitwatch.LimitWatch`); count a claim that held work back, and wake the
        owners of that work when its buckets refill."""
        self._limit_watch.enforced(queue, _NO_LIMITS if admission is None else admission.limits, since)
        if admission is None:
            return
        if admission.held:
            self.events.add(ev.RATE_LIMIT_HELD)
        self._refill.schedule(queue, admission.wake_at, admission.now)

    async def report_rate_limited(
        self, task: Task, retry_after_s: float, *, dimension: str | None = None, key: str | None = None
    ) -> Task:
        """Pause the task's bucket(s) for ``retry_after_s`` and hand it back, its attempt not counted.

        See :class:`~asynccoord.contract.ratelimits.RateLimitStore`. One write transaction:
        the pause, then the compare-and-set hand-back (``release_rate_limited``).

        Raises:
            LeaseLostError: the lease is no longer the caller's (the pause still applies).
            TaskNotFoundError: no such task.
            InvalidTypeError, InvalidArgumentError: bad arguments (nothing written).
        """
        check_task(task)
        retry = check_retry_after_s(retry_after_s)
        dim, chosen = check_pause_target(dimension, key)
        text = f"RateLimited: the provider asked to retry after {retry:g} s"

        def op(db: sqlite3.Connection, now: float) -> tuple[_Row | None, float, str]:
            stored = db.execute(R["task_limit_keys"], {"id": task.id}).fetchone()
            queue = task.queue if stored is None else stored[0]
            limits = _limits(db, queue)
            keys = _readable_keys(task.id, None if stored is None else stored[1])
            targets = pause_targets(limits, keys, dim, chosen)
            load = _loader(db, queue)
            _store_tats(db, queue, {(d, k): paused_tat(load(d, k), now + retry, limits[d]) for d, k in targets})
            params = {
                "id": task.id,
                "lease_token": task.lease_token,
                "version": task.version,
                "delay_s": refused_task_delay_s(targets, keys, retry),
                "error": text,
                "now": now,
            }
            return db.execute(R["release_rate_limited"], params).fetchone(), now, queue

        row, now, queue = await self._write(op)
        self.events.add(ev.PROVIDER_RATE_LIMITED)
        if row is None:
            current = await self._read(lambda db: db.execute(R["select_task"], {"id": task.id}).fetchone())
            if current is None:
                raise TaskNotFoundError(task.id)
            raise LeaseLostError(  # a refused hand-back is no stale commit (its lease_lost is counted)
                task.id, f"task is {current[7]} (version {current[14]}, caller had version {task.version})"
            )
        out = listed_task_from_row(row)
        self._refill.schedule(queue, {out.partition: now + retry}, now)
        return out
