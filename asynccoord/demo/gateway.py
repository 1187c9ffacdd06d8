"""A simulated messaging gateway that keeps its own, independent record of deliveries.

:class:`SimulatedGateway` behaves like the HTTP API of a messaging provider as far as the
demo's checks need (log-normal latency, transient errors, idempotency keys, per-account
fencing tokens after M. Kleppmann, "How to do distributed locking", 2016; rate limits per
account and per chat kept as providers keep them, a burst then the sustained rate (GCRA,
ITU-T I.371), answered with a 429 and a Retry-After), and records
every delivery in a SQLite file of its own, so the demo judges duplicates, overlaps and
order independently of asynccoord's bookkeeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Self, TypeVar

from ..contract.ratelimits import RateLimit, conforms, eligible_at, take
from ..sqlitebusy import retry_busy

__all__ = (
    "GatewayAudit",
    "GatewayError",
    "ProviderRateLimitError",
    "RateRecord",
    "SimulatedGateway",
    "StaleTokenError",
    "TransientGatewayError",
    "audit",
    "provider_bucket",
    "rate_record",
)

T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS accounts (account TEXT PRIMARY KEY, high_token INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS calls (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    msg_id TEXT NOT NULL, idempotency_key TEXT, account TEXT NOT NULL, conversation TEXT NOT NULL,
    seq INTEGER NOT NULL, fencing_token INTEGER NOT NULL, node TEXT NOT NULL, pid INTEGER NOT NULL,
    started_at REAL NOT NULL, ended_at REAL,
    outcome TEXT NOT NULL,  -- in_flight | delivered | replay | stale_token | transient_error | rate_limited
    late INTEGER NOT NULL DEFAULT 0,  -- sent by a process that stalled in this send (past its lease)
    limited_on TEXT  -- rate_limited: the dimension whose window was full
);
CREATE TABLE IF NOT EXISTS rate_calls (
    dimension TEXT NOT NULL, key TEXT NOT NULL, at REAL NOT NULL, late INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS rate_calls_key ON rate_calls (dimension, key, at);
CREATE TABLE IF NOT EXISTS rate_buckets (
    dimension TEXT NOT NULL, key TEXT NOT NULL, tat REAL NOT NULL, PRIMARY KEY (dimension, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS deliveries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    msg_id TEXT NOT NULL, idempotency_key TEXT, account TEXT NOT NULL, conversation TEXT NOT NULL,
    seq INTEGER NOT NULL, call_id INTEGER NOT NULL, started_at REAL NOT NULL, ended_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS deliveries_key ON deliveries (idempotency_key);
CREATE TABLE IF NOT EXISTS conversations (conversation TEXT PRIMARY KEY, high_seq INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS order_violations (
    msg_id TEXT NOT NULL, conversation TEXT NOT NULL, seq INTEGER NOT NULL, after_seq INTEGER NOT NULL
);
"""


class GatewayError(Exception):
    """An error answered by the simulated gateway (the provider's own error, not asynccoord's)."""


class TransientGatewayError(GatewayError):
    """The request failed on the provider's side; nothing was delivered; retry later."""


class StaleTokenError(GatewayError):
    """The request carried a fencing token older than one the account has already presented."""


class ProviderRateLimitError(GatewayError):
    """HTTP 429: a key's bucket has no token (burst spent, sustained rate exceeded); nothing was delivered.

    Attributes:
        retry_after_s: When a request of the key would conform again, seconds from now.
        dimension: The limit that refused the request (``"chat"`` or ``"account"``).
        key: That limit's key.
    """

    def __init__(self, retry_after_s: float, dimension: str, key: str) -> None:
        super().__init__(f"429 too many requests on {dimension}={key}: retry after {retry_after_s:.3f} s")
        self.retry_after_s = retry_after_s
        self.dimension = dimension
        self.key = key


class SimulatedGateway:
    """One process's client of the shared gateway record.

    It behaves like the HTTP API of a messaging provider, as far as the demo's checks need:

    * **latency** drawn from a log-normal distribution (median and spread configurable),
      the usual shape of network service times;
    * **transient errors** at a configurable rate (the request fails, nothing is delivered);
    * **idempotency keys**: a request whose key was already delivered is answered from the
      record without a second delivery (as payment and messaging APIs do with client message
      ids), and counted as a *replay*;
    * **fencing tokens per account** (M. Kleppmann, "How to do distributed locking", 2016):
      the gateway remembers the highest token each account presented, refuses a request with
      a lower one when it arrives, and refuses it again when it would complete if a newer
      holder arrived meanwhile. A sender that stalled past its lock's TTL is thus refused;
    * **rate limits** per account and per chat, a burst then the sustained rate, as
      providers keep them: GCRA per key (:func:`provider_bucket`: the declared limit with
      one emission interval of slack), a request without a token refused with a 429 whose
      Retry-After is when the key's next request would conform. The buckets are rows of
      the record, so every process of the demo draws on the same ones.

    A delivery takes effect when its request completes. Everything is recorded in a SQLite
    file of the gateway's own (not asynccoord's database), so duplicates, per-account
    overlaps and per-conversation order are judged independently of the runtime's
    bookkeeping. All processes of the demo share the file, on one machine, so the
    wall-clock times it records are comparable.

    The record is the measuring instrument, not the simulated provider, so it is kept off
    the critical path as far as exactness allows. A record update (a request's arrival or
    its completion) is one ``BEGIN IMMEDIATE`` transaction run at once on the event loop's
    thread when the file's write lock is free (a fraction of a millisecond, and no thread
    hop); when another process holds the lock, the update is queued for the process's
    record thread, which waits for the lock and group-commits everything queued meanwhile
    (each update under its own savepoint). Either way each update reads the clock while it
    holds the write lock, so a request's recorded window (arrival update to completion
    update) contains its whole simulated latency, and the record is one serial history
    across processes. The file is written with ``synchronous = OFF``: it must survive a
    killed process (it does, in WAL mode), not a power loss.

    Args:
        path: The gateway's SQLite file (created if missing; shared by all processes).
        latency_median_ms: Median request latency, milliseconds. Default 2.0.
        latency_sigma: Log-normal shape (spread); 0.6 puts p99 near 4x the median.
        transient_error_rate: Probability that a request fails transiently. Default 0.01.
        seed: Seed of the latency and error draws (None: random).
        limits: The provider's rate limits (dimensions ``"account"`` and ``"chat"``);
            default none.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        latency_median_ms: float = 2.0,
        latency_sigma: float = 0.6,
        transient_error_rate: float = 0.01,
        seed: int | None = None,
        limits: Sequence[RateLimit] = (),
    ) -> None:
        if latency_median_ms <= 0 or latency_sigma < 0 or not 0 <= transient_error_rate < 1:
            raise ValueError(
                f"bad gateway settings: latency_median_ms={latency_median_ms!r}, "
                f"latency_sigma={latency_sigma!r}, transient_error_rate={transient_error_rate!r}"
            )
        self.path = os.fspath(path)
        self.latency_median_ms = latency_median_ms
        self.latency_sigma = latency_sigma
        self.transient_error_rate = transient_error_rate
        self.limits = list(limits)
        self._rng = random.Random(seed)
        self._executor: ThreadPoolExecutor | None = None
        self._db: sqlite3.Connection | None = None  # the record thread's connection: waits for the lock
        self._now: sqlite3.Connection | None = None  # the event loop's: never waits
        self._waiting: list[tuple[Callable[[sqlite3.Connection], Any], asyncio.Future[Any]]] = []
        self._committer: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gateway")
        self._db = await self._call(self._connect)
        self._now = sqlite3.connect(self.path, timeout=0.0, isolation_level=None)
        self._now.execute("PRAGMA synchronous = OFF")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._committer is not None:
            with contextlib.suppress(BaseException):
                await self._committer
        if self._now is not None:
            self._now.close()
            self._now = None
        if self._db is not None:
            db, self._db = self._db, None
            await self._call(db.close)
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=60.0, isolation_level=None, check_same_thread=False)
        _use_wal(db, timeout_s=60.0)
        db.execute("PRAGMA synchronous = OFF")
        db.executescript(SCHEMA)
        return db

    async def _call(self, fn: Any, *args: Any) -> Any:
        assert self._executor is not None, "use 'async with SimulatedGateway(...)'"
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def _transaction(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` in a write transaction of the record: at once if the file is free, else queued."""
        if self._committer is None and self._now is not None:
            try:
                return _run_now(self._now, fn)
            except _Busy:
                pass  # another process writes: queue it for the record thread, which waits
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._waiting.append((fn, future))
        if self._committer is None:
            self._committer = asyncio.get_running_loop().create_task(self._commit_waiting())
        return await future

    async def _commit_waiting(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                try:
                    outcomes = await asyncio.shield(self._call(self._run_batch, [fn for fn, _ in batch]))
                except Exception as exc:  # the transaction failed as a whole: so did every update in it
                    outcomes = [(False, exc)] * len(batch)
                except BaseException:
                    self._waiting[:0] = batch
                    raise
                for (_, future), (ok, value) in zip(batch, outcomes, strict=True):
                    if future.done():  # its caller was cancelled: the update happened all the same
                        continue
                    if ok:
                        future.set_result(value)
                    else:
                        future.set_exception(value)
        finally:
            self._committer = None
            waiting, self._waiting = self._waiting, []
            for _, future in waiting:  # only when this task itself was cancelled (loop shutdown)
                future.cancel()

    def _run_batch(self, fns: list[Callable[[sqlite3.Connection], Any]]) -> list[tuple[bool, Any]]:
        """One transaction; each update under its own savepoint, so one failing update undoes only itself."""
        db = self._db
        assert db is not None
        outcomes: list[tuple[bool, Any]] = []
        db.execute("BEGIN IMMEDIATE")
        try:
            for fn in fns:
                db.execute("SAVEPOINT op")
                try:
                    outcomes.append((True, fn(db)))
                except Exception as exc:
                    db.execute("ROLLBACK TO op")
                    outcomes.append((False, exc))
                db.execute("RELEASE op")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        return outcomes

    async def deliver(
        self,
        *,
        msg_id: str,
        account: str,
        conversation: str,
        seq: int,
        fencing_token: int,
        idempotency_key: str | None,
        node: str,
        late: bool = False,
    ) -> str:
        """Send one message; return ``"delivered"`` or ``"replay"``.

        ``late`` marks the request of a sender that stalled during this send (past its
        lease), so the record can count it apart; the provider treats it like any other.

        Raises:
            StaleTokenError: a newer holder of the account presented a higher token.
            ProviderRateLimitError: the account's or the chat's bucket has no token (HTTP 429).
            TransientGatewayError: the provider failed this request (nothing delivered).
        """
        pid = os.getpid()
        keys = {"account": account, "chat": conversation}
        refused: list[tuple[float, str]] = []

        def arrive(db: sqlite3.Connection) -> tuple[int, int, float]:
            refused.clear()
            row = db.execute("SELECT high_token FROM accounts WHERE account = ?", (account,)).fetchone()
            high = row[0] if row else 0
            now = time.time()
            outcome = "stale_token" if fencing_token < high else "in_flight"
            limited_on = None
            if outcome == "in_flight":
                tats = {x.dimension: _load_tat(db, x.dimension, keys[x.dimension]) for x in self.limits}
                waits = []
                for limit in self.limits:
                    wait = _bucket_wait(tats[limit.dimension], limit, now)
                    if wait is not None:
                        waits.append((wait, limit.dimension))
                if waits:  # every refusing bucket must have a token again: the latest of them
                    outcome = "rate_limited"
                    refused.append(max(waits))
                    limited_on = refused[-1][1]
            if outcome == "in_flight":
                for limit in self.limits:
                    key = keys[limit.dimension]
                    db.execute(
                        "INSERT INTO rate_buckets (dimension, key, tat) VALUES (?, ?, ?) "
                        "ON CONFLICT (dimension, key) DO UPDATE SET tat = excluded.tat",
                        (limit.dimension, key, take(tats[limit.dimension], now, limit)),
                    )
                    db.execute(
                        "INSERT INTO rate_calls (dimension, key, at, late) VALUES (?, ?, ?, ?)",
                        (limit.dimension, key, now, int(late)),
                    )
            if outcome == "in_flight" and fencing_token > high:
                db.execute(
                    "INSERT INTO accounts (account, high_token) VALUES (?, ?) "
                    "ON CONFLICT (account) DO UPDATE SET high_token = excluded.high_token",
                    (account, fencing_token),
                )
            call_id = db.execute(
                "INSERT INTO calls (msg_id, idempotency_key, account, conversation, seq, fencing_token, node, pid,"
                " started_at, ended_at, outcome, late, limited_on) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " RETURNING id",
                (
                    msg_id,
                    idempotency_key,
                    account,
                    conversation,
                    seq,
                    fencing_token,
                    node,
                    pid,
                    now,
                    now if outcome != "in_flight" else None,
                    outcome,
                    int(late),
                    limited_on,
                ),
            ).fetchone()[0]
            return call_id, high, now

        call_id, high, started = await self._transaction(arrive)
        if fencing_token < high:
            raise StaleTokenError(f"account {account}: fencing token {fencing_token} < {high} already presented")
        if refused:
            wait, dimension = refused[-1]
            raise ProviderRateLimitError(wait, dimension, keys[dimension])
        latency_s = self._rng.lognormvariate(0.0, self.latency_sigma) * self.latency_median_ms / 1000.0
        failed = self._rng.random() < self.transient_error_rate
        try:
            await asyncio.sleep(latency_s)
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._transaction(_finish(call_id, "cancelled")))
            raise
        if failed:
            await self._transaction(_finish(call_id, "transient_error"))
            raise TransientGatewayError(f"provider error on {msg_id} (simulated)")

        def complete(db: sqlite3.Connection) -> str:
            now = time.time()
            row = db.execute("SELECT high_token FROM accounts WHERE account = ?", (account,)).fetchone()
            if row is not None and fencing_token < row[0]:
                _finish(call_id, "stale_token")(db)
                return "stale_token"
            if (
                idempotency_key is not None
                and db.execute("SELECT 1 FROM deliveries WHERE idempotency_key = ?", (idempotency_key,)).fetchone()
            ):
                _finish(call_id, "replay")(db)
                return "replay"
            seen = db.execute("SELECT high_seq FROM conversations WHERE conversation = ?", (conversation,)).fetchone()
            if seen is not None and seq < seen[0]:
                db.execute(
                    "INSERT INTO order_violations (msg_id, conversation, seq, after_seq) VALUES (?, ?, ?, ?)",
                    (msg_id, conversation, seq, seen[0]),
                )
            db.execute(
                "INSERT INTO conversations (conversation, high_seq) VALUES (?, ?) ON CONFLICT (conversation) "
                "DO UPDATE SET high_seq = max(high_seq, excluded.high_seq)",
                (conversation, seq),
            )
            db.execute(
                "INSERT INTO deliveries (msg_id, idempotency_key, account, conversation, seq, call_id,"
                " started_at, ended_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (msg_id, idempotency_key, account, conversation, seq, call_id, started, now),
            )
            _finish(call_id, "delivered")(db)
            return "delivered"

        outcome = await self._transaction(complete)
        if outcome == "stale_token":
            raise StaleTokenError(f"account {account}: fencing token {fencing_token} superseded while in flight")
        return str(outcome)


def provider_bucket(limit: RateLimit) -> RateLimit:
    """The bucket the provider keeps for a declared ``limit``: one more cell of burst.

    The provider runs GCRA (see :mod:`asynccoord.contract.ratelimits`) with the declared
    ``count`` and ``per_s``, and a tolerance of ``burst * T`` instead of ``(burst - 1) * T``
    (``T = per_s / count``): the one emission interval of slack covers the time between the
    store's claim and the send, which differs from one send to the next. A key may thus
    send ``burst + 1`` requests at once after an idle spell, then one every ``T`` seconds.
    """
    return RateLimit(dimension=limit.dimension, count=limit.count, per_s=limit.per_s, burst=limit.burst + 1)


def _load_tat(db: sqlite3.Connection, dimension: str, key: str) -> float | None:
    row = db.execute("SELECT tat FROM rate_buckets WHERE dimension = ? AND key = ?", (dimension, key)).fetchone()
    return None if row is None else float(row[0])


def _bucket_wait(tat: float | None, limit: RateLimit, now: float) -> float | None:
    """None when a request of a key whose bucket's TAT is ``tat`` conforms at ``now``; else the Retry-After, seconds.

    The bucket is :func:`provider_bucket` of ``limit``; the Retry-After is when the key's
    next request would conform (the TAT less the tolerance), seconds from ``now``.
    """
    bucket = provider_bucket(limit)
    if conforms(tat, now, bucket):
        return None
    at = eligible_at(tat, bucket)
    assert at is not None
    return max(0.0, at - now)


def _use_wal(db: sqlite3.Connection, *, timeout_s: float) -> None:
    """``PRAGMA journal_mode = WAL``, tried again while another connection holds the file.

    When the processes of a demo open a fresh record at the same moment, SQLite answers the
    journal-mode switch of all but one with SQLITE_BUSY at once, without its busy handler
    (a worker died at start with "database is locked", 1 run in about 60 with 4 processes).
    The store's own retry (:func:`~asynccoord.sqlitebusy.retry_busy`) waits.
    """
    retry_busy(lambda: db.execute("PRAGMA journal_mode = WAL"), time.monotonic() + timeout_s)


class _Busy(Exception):
    """The record's write lock is held by another process."""


def _run_now(db: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    """``fn`` in one write transaction on ``db`` (busy timeout 0); :class:`_Busy` if the file is locked."""
    try:
        db.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:
        if exc.sqlite_errorcode in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            raise _Busy from exc
        raise
    try:
        result = fn(db)
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return result


def _finish(call_id: int, outcome: str) -> Any:
    def fn(db: sqlite3.Connection) -> None:
        db.execute("UPDATE calls SET outcome = ?, ended_at = ? WHERE id = ?", (outcome, time.time(), call_id))

    return fn


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayAudit:
    """What the gateway's own record says about a run.

    Attributes:
        send_calls: Requests received.
        delivered: Distinct messages delivered.
        duplicates: Messages delivered more than once.
        replays: Requests answered by idempotency key (a second send of a delivered message).
        stale_token_rejections: Requests refused for an outdated fencing token.
        transient_errors: Requests failed by the simulated provider.
        cut_off: Requests whose sender vanished mid-request (killed process).
        account_overlaps: Pairs of deliveries of one account whose request times overlap.
        order_violations: Deliveries of a conversation's message after a later one of it.
        delivered_ids: The message ids delivered.
        account_calls: Account -> requests that ended (delivered, replayed, refused or failed).
        account_busy_s: Account -> summed duration of those requests, seconds: the time the
            account spent sending, one request at a time.
        rate_limited: Requests refused for rate (HTTP 429), late ones apart.
        late_rate_limited: Requests refused for rate that a sender stalled in (past its lease) made late.
    """

    send_calls: int
    delivered: int
    duplicates: int
    replays: int
    stale_token_rejections: int
    transient_errors: int
    cut_off: int
    account_overlaps: int
    order_violations: int
    delivered_ids: frozenset[str]
    account_calls: dict[str, int]
    account_busy_s: dict[str, float]
    rate_limited: int
    late_rate_limited: int


def audit(path: str | os.PathLike[str]) -> GatewayAudit:
    """Read the gateway record of a finished run (plain sqlite3, read-only).

    A run whose workers all died before the gateway started has no record: an empty audit
    (nothing sent), so the report says what went wrong instead of failing on the file.
    """
    if not os.path.exists(path):
        return GatewayAudit(
            send_calls=0,
            delivered=0,
            duplicates=0,
            replays=0,
            stale_token_rejections=0,
            transient_errors=0,
            cut_off=0,
            account_overlaps=0,
            order_violations=0,
            delivered_ids=frozenset(),
            account_calls={},
            account_busy_s={},
            rate_limited=0,
            late_rate_limited=0,
        )
    db = sqlite3.connect(f"file:{os.fspath(path)}?mode=ro", uri=True)
    try:
        outcomes = dict(db.execute("SELECT outcome, count(*) FROM calls GROUP BY outcome").fetchall())
        per_msg = db.execute("SELECT msg_id, count(*) FROM deliveries GROUP BY msg_id").fetchall()
        overlaps = 0
        last_end: dict[str, float] = {}
        for account, started, ended in db.execute(
            "SELECT account, started_at, ended_at FROM deliveries ORDER BY account, started_at"
        ):
            if account in last_end and started < last_end[account]:
                overlaps += 1
            last_end[account] = max(ended, last_end.get(account, ended))
        violations = db.execute("SELECT count(*) FROM order_violations").fetchone()[0]
        busy = db.execute(
            "SELECT account, count(*), total(ended_at - started_at) FROM calls"
            " WHERE ended_at IS NOT NULL GROUP BY account"
        ).fetchall()
        limited = dict(db.execute("SELECT late, count(*) FROM calls WHERE outcome = 'rate_limited' GROUP BY late"))
    finally:
        db.close()
    return GatewayAudit(
        send_calls=sum(outcomes.values()),
        delivered=len(per_msg),
        duplicates=sum(1 for _, n in per_msg if n > 1),
        replays=outcomes.get("replay", 0),
        stale_token_rejections=outcomes.get("stale_token", 0),
        transient_errors=outcomes.get("transient_error", 0),
        cut_off=outcomes.get("in_flight", 0) + outcomes.get("cancelled", 0),
        account_overlaps=overlaps,
        order_violations=violations,
        delivered_ids=frozenset(m for m, _ in per_msg),
        account_calls={a: n for a, n, _ in busy},
        account_busy_s={a: t for a, _, t in busy},
        rate_limited=limited.get(0, 0),
        late_rate_limited=limited.get(1, 0),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class RateRecord:
    """What the gateway's record says about rate: per ``(dimension, key)``, ascending arrival times.

    Attributes:
        accepted: Requests the provider let through (none of a sender stalled past its lease).
        delivered: Deliveries (a message's first successful request).
        requested: Requests that reached the rate check, let through or refused with a 429
            (none of a sender stalled past its lease): the rate the sender tried.
    """

    accepted: dict[tuple[str, str], list[float]]
    delivered: dict[tuple[str, str], list[float]]
    requested: dict[tuple[str, str], list[float]]


def rate_record(path: str | os.PathLike[str]) -> RateRecord:
    """Read the arrival times of accepted requests, of deliveries and of every request, per account and per chat."""
    db = sqlite3.connect(f"file:{os.fspath(path)}?mode=ro", uri=True)
    try:
        accepted: dict[tuple[str, str], list[float]] = {}
        for dimension, key, at in db.execute(
            "SELECT dimension, key, at FROM rate_calls WHERE late = 0 ORDER BY dimension, key, at"
        ):
            accepted.setdefault((dimension, key), []).append(at)
        delivered: dict[tuple[str, str], list[float]] = {}
        for account, conversation, at in db.execute(
            "SELECT account, conversation, started_at FROM deliveries ORDER BY started_at"
        ):
            delivered.setdefault(("account", account), []).append(at)
            delivered.setdefault(("chat", conversation), []).append(at)
        requested: dict[tuple[str, str], list[float]] = {}
        for account, conversation, at in db.execute(
            "SELECT account, conversation, started_at FROM calls WHERE late = 0 AND outcome != 'stale_token'"
            " ORDER BY started_at"
        ):
            requested.setdefault(("account", account), []).append(at)
            requested.setdefault(("chat", conversation), []).append(at)
    finally:
        db.close()
    return RateRecord(accepted=accepted, delivered=delivered, requested=requested)
