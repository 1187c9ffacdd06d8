"""Locks and semaphores with fencing tokens on Redis (extra ``redis``, redis-py asyncio).

:class:`RedisLockStore` implements the lock contract only
(:class:`~asynccoord.contract.locks.LockStore`), beside a queue store, with the same
semantics as the other stores. Each operation is one Lua script run atomically by the
server and judged by its ``TIME``, with fencing tokens from ``INCR`` counters, the
fencing-token scheme of M. Kleppmann ("How to do distributed locking", 2016).

This module holds the store, its keys and the lock contract's operations. The Lua scripts
are :mod:`asynccoord.backends.redisscripts`; connecting, closing and retrying a lost
connection are :mod:`asynccoord.backends.redisconn`; the survey of the key prefixes in use
on a server is :mod:`asynccoord.backends.redisprefixes`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import redis.asyncio as aioredis

from .. import events as ev
from ..config import StoreConfig
from ..contract.locks import (
    MAX_FENCING_TOKEN,
    FenceRecord,
    Lease,
    LockBusy,
    LockInfo,
    check_fence_args,
    check_lease,
    check_leases,
    check_lock_request,
    encode_fence_data,
    fence_rejected_error,
)
from ..errors import InvalidTypeError, StoreClosedError, StoreError
from ..events import EventCounter
from ..monitor.histogram import LatencyRecorder
from ..reach import Reach
from ..validation import MAX_DURATION_S, check_clock, check_int, check_lease_s, check_name, check_positive
from .batch import Batcher
from .calls import CallGate
from .redisconn import RedisConnection
from .redisprefixes import SURVEY_MAX_KEYS, PrefixSurvey, survey_prefixes
from .redisurl import check_url
from .rows import decode_json, new_token
from .targets import redact_location

__all__ = ("MAX_KEY_SLACK_MS", "RedisLockStore")

log = logging.getLogger(__name__)


_LIST_CHUNK = 1000
"""Lock names whose list scripts ``list_locks`` sends in one pipeline (one round trip)."""
_RENEW_CHUNK = 256
"""Most leases one renewal script call renews. A script holds the Redis server while it runs
(20 to 40 us per lease on a 2-core machine): one call for 10,000 leases held it for 190 to
280 ms every renewal interval, and every other client waited. Chunks of this many (at most
about 11 ms each in the same run) go in one pipeline, still one round trip, and other
clients' commands run between them."""


@dataclass(frozen=True, slots=True)
class _Request:
    """One queued acquisition."""

    name: str
    ttl_s: float
    permits: int
    holder: str
    owner_token: str


MAX_KEY_SLACK_MS = int(MAX_DURATION_S * 1000)
"""Largest ``key_slack_ms``: one year (:data:`~asynccoord.validation.MAX_DURATION_S`) in
milliseconds, 31,536,000,000. With the longest lease (also a year) a key's ``PEXPIRE`` stays
below 2**36 ms: an exact integer in the scripts' Lua numbers, far inside Redis' limit."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisLockStore(RedisConnection):
    """The lock contract (:class:`~asynccoord.contract.locks.LockStore`) on one Redis server.

    Use it beside a queue store, e.g. the queue in PostgreSQL and the account locks in
    Redis::

        queue = PostgresStore("postgresql://bot@db/coord")
        locks = RedisLockStore("redis://cache:6379/0")
        async with queue, locks:
            runtime = Runtime(queue, send, lock_key=..., lock_store=locks)

    (or ``Lock(locks, "account:42")`` directly). A task commit fenced by a Redis lock's
    token is checked and recorded by the queue store (``complete(fence=...)``), in the
    commit's transaction: fence each resource with the tokens of one lock store.

    Keys per lock name (``prefix`` default ``"asynccoord:"``):

    * ``{prefix}lock:{name}``: sorted set, owner token -> expiry (store clock, seconds).
      A member is live while its score is after the clock; acquisitions drop lapsed ones.
    * ``{prefix}lockmeta:{name}``: hash, owner token ->
      ``fencing_token|permits|acquired_at|holder``.
    * ``{prefix}fencing:{name}``: the name's fencing counter (``INCR``), never deleted, so
      tokens rise strictly across releases, expiries and restarts of a Redis that logs
      every write (AOF, ``appendonly yes``; with ``appendfsync everysec``, the default, a
      crash of the machine may still lose the last second). RDB snapshots alone are not
      enough: a restart from a snapshot sets the counters back to it, and one without
      data starts them over.
    * ``{prefix}fence:{resource}``: hash, the highest fencing token a resource accepted,
      its last fenced data and when.

    A lock that processes contend for also gets the counter of its place in line
    (``asynccoord.next:<hash>``, see :class:`~asynccoord.locks.pool.LockPool`): one more
    never-deleted key per contended lock name, as on every store.

    Every operation is one Lua script: acquire (drop lapsed leases, count, grant with the
    next token; a process's concurrent acquisitions go as one pipeline), owner-checked
    renew and release, the watchdog's batched renewal (script calls of at most 256 leases,
    pipelined in one round trip, since a script holds the server while it runs), and
    fencing. Time is the Redis server's ``TIME`` (or a test clock), never a caller's
    clock. The lock keys carry a ``PEXPIRE`` of their longest lease plus ``key_slack_ms``,
    so the server deletes the locks of crashed holders by itself.

    A counter set back this way is repaired at the first refused commit. The queue store
    keeps each resource's highest accepted token, so it refuses the lower token of a new
    acquisition (:class:`~asynccoord.errors.FencingTokenRejectedError`, which names that
    token). The :class:`~asynccoord.locks.pool.LockPool` then moves the counter past it
    (:meth:`advance_fencing_token`, logged once as ``asynccoord.redis.fencing_counter_behind``)
    and gives the lease back, so the next acquisition's token is accepted. That one commit
    is lost: its message went out, the task stays leased until its lease lapses, and it is
    then claimed and sent again (one more attempt, a duplicate send), as after any refused
    commit. Turns already under way on the refused lease end the same way.

    A script touches keys of several names in one call, so use a single Redis server (or
    a primary with replicas), not Redis Cluster. Connection loss is retried with backoff
    and then raised as :class:`~asynccoord.errors.StoreConnectionError`; a retried
    acquisition recognizes its own earlier grant (by owner token), so a lost reply never
    leaks a lease. The store belongs to the event loop that opened it: a call or
    ``open()`` from another loop raises :class:`~asynccoord.errors.StoreLoopError` at
    once (see :meth:`close` for a close from another loop).

    Args:
        url: A redis-py URL (``redis://[:password@]host:port/db``, ``rediss://`` for TLS,
            ``unix://path``); another scheme, or a port or query value redis-py cannot
            read, is refused here (the message hides the password).
        config: Store settings (``max_payload_bytes`` bounds fenced data); default
            :class:`~asynccoord.config.StoreConfig`.
        clock: Test hook: a function returning the store clock (seconds) used instead
            of the server's ``TIME``. Default None (the server clock).
        prefix: Prefix of every key (several independent lock spaces in one Redis).
            Default ``"asynccoord:"``. Spaces are independent only when no prefix is
            the start of another's: keys are ``{prefix}{kind}:{name}`` and names may hold
            ``:``, so ``"app:"`` and ``"app:lock:"`` share keys (``"app:"``'s lock
            ``"lock:x"`` is ``"app:lock:"``'s lock ``"x"``, with two fencing counters).
            Use prefixes such as ``"app1:"`` and ``"app2:"``.
        key_slack_ms: How long past its longest lease a lock's keys stay before the
            server deletes them, milliseconds, 0..31,536,000,000 (one year,
            ``MAX_KEY_SLACK_MS``). Default 60000.
        reconnect_timeout_s: How long a call retries a lost connection with backoff
            before raising, seconds (> 0); also the longest wait for each reply, so a
            server that accepts connections but never answers (paused) fails a call
            after at most about twice this long, and :meth:`open` after this long. Default 10.
        max_connections: Most connections of the pool (>= 1); callers beyond wait for one.
            Default 16 (concurrent acquisitions share one pipelined round trip anyway).

    Attributes:
        persistent: Whether the server logs every write to disk (AOF on, ``appendonly yes``),
            so that a restart keeps the fencing counters, as read by :meth:`open`. False
            with RDB snapshots only (a restart loses the increments since the last one) or
            nothing on disk; None before :meth:`open`, or when the server does not say (a
            managed Redis may refuse ``INFO``).
        reach: Each call's attempts as they end (answered, or the server not reached:
            each such attempt also counts a ``store_retries`` event when it is retried),
            read by a ``Monitor(lock_store=...)`` to raise ``lock_store_unreachable``
            (:class:`~asynccoord.reach.Reach`).

    Raises:
        InvalidTypeError, InvalidArgumentError: a bad argument.
    """

    def __init__(
        self,
        url: str,
        *,
        config: StoreConfig | None = None,
        clock: Callable[[], float] | None = None,
        prefix: str = "asynccoord:",
        key_slack_ms: int = 60_000,
        reconnect_timeout_s: float = 10.0,
        max_connections: int = 16,
    ) -> None:
        if not isinstance(url, str):
            raise InvalidTypeError(f"url must be a str (redis://...), got {type(url).__name__}")
        check_url(url)
        if config is not None and not isinstance(config, StoreConfig):
            raise InvalidTypeError(f"config must be a StoreConfig, got {type(config).__name__}")
        check_clock(clock)
        self.url = url
        self.config = config or StoreConfig()
        self.events = EventCounter()
        self.latencies = LatencyRecorder()
        self.reach = Reach()
        self.prefix = check_name("prefix", prefix)
        self.key_slack_ms = check_int("key_slack_ms", key_slack_ms, minimum=0, maximum=MAX_KEY_SLACK_MS)
        self.reconnect_timeout_s = check_positive("reconnect_timeout_s", reconnect_timeout_s)
        self.max_connections = check_int("max_connections", max_connections, minimum=1)
        self._clock = clock
        self.persistent: bool | None = None
        self._client: aioredis.Redis | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop of open()
        self._scripts: dict[str, Any] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._gate = CallGate("the Redis lock store")  # calls in flight, waited for by close()
        self._acquirer: Batcher[_Request, Lease | LockBusy] = Batcher(
            self._acquire_batch, self.config.max_batch_ops, name="asynccoord-redis-acquire"
        )

    def __repr__(self) -> str:
        where = redact_location(self.url)
        return f"<RedisLockStore {where!r} prefix={self.prefix!r} {'open' if self._client else 'closed'}>"

    # --- plumbing -----------------------------------------------------------------------

    def _now_arg(self) -> str:
        return "" if self._clock is None else repr(float(self._clock()))

    def _key(self, kind: str, name: str) -> str:
        return f"{self.prefix}{kind}:{name}"

    async def now(self) -> float:
        """The store clock: seconds since the Unix epoch (the Redis server's ``TIME``)."""
        if self._clock is not None:
            if self._client is None:
                raise StoreClosedError(f"{self!r} is not open: use 'async with' or await open()")
            self._gate.admit()
            return float(self._clock())

        async def run(client: aioredis.Redis) -> float:
            seconds, micros = await client.time()
            return float(seconds) + float(micros) / 1_000_000

        return await self._call(run, "now")

    # --- the lock contract --------------------------------------------------------------

    async def try_acquire_lock(
        self, name: str, *, ttl_s: float, permits: int = 1, holder: str = ""
    ) -> Lease | LockBusy:
        """One non-blocking attempt to take ``name`` (or one of its ``permits``), in one script.

        If the caller is cancelled meanwhile, a granted lease is released in the background.

        Args:
            name: Lock name, 1..255 characters, not only whitespace.
            ttl_s: Lease length, seconds (0.01, ``validation.MIN_LEASE_S``, to one year), from the
                server clock at the grant.
            permits: Leases the name may have at once (>= 1). Default 1: a lock.
            holder: Who acquires, for inspection (0..255 characters).

        Returns:
            The new :class:`Lease`, or :class:`LockBusy` when every permit is taken.

        Raises:
            InvalidArgumentError, InvalidTypeError: a bad argument; nothing written.
            StoreConnectionError: the server stayed unreachable.
        """
        name, ttl, count, who = check_lock_request(name, ttl_s, permits, holder)
        if self._client is None:
            raise StoreClosedError(f"{self!r} is not open: use 'async with' or await open()")
        self._check_loop()  # before the request is queued for a batch of the owning loop
        request = _Request(name=name, ttl_s=ttl, permits=count, holder=who, owner_token=new_token())
        with self._gate.call():  # a call in flight while its batch waits (see close)
            future = self._acquirer.submit(request)
            try:
                return await asyncio.shield(future)
            except asyncio.CancelledError:

                def compensate(done: asyncio.Future[Lease | LockBusy]) -> None:
                    if not done.cancelled() and done.exception() is None:
                        outcome = done.result()
                        if isinstance(outcome, Lease):
                            self._spawn(self._release_quietly(outcome))

                future.add_done_callback(compensate)
                raise

    async def _acquire_batch(self, requests: Sequence[_Request]) -> list[Lease | LockBusy]:
        """Run the acquisitions waiting now as one pipeline of scripts (one round trip)."""
        script = self._scripts["acquire"]
        now_arg = self._now_arg()

        async def run(client: aioredis.Redis) -> list[Any]:
            async with client.pipeline(transaction=False) as pipe:
                for r in requests:
                    keys = [self._key("lock", r.name), self._key("lockmeta", r.name), self._key("fencing", r.name)]
                    args = [r.owner_token, r.holder, r.permits, repr(r.ttl_s), now_arg, self.key_slack_ms]
                    await script(keys=keys, args=args, client=pipe)
                return list(await pipe.execute())

        replies = await self._call(run, "try_acquire_lock")
        out: list[Lease | LockBusy] = []
        for r, reply in zip(requests, replies, strict=True):
            if int(reply[0]) == 1:
                out.append(self._lease_from(r.name, r.owner_token, r.holder, r.permits, r.ttl_s, reply))
            else:
                live, earliest, now = int(reply[1]), float(_text(reply[2])), float(_text(reply[3]))
                wait = max(0.0, earliest - now)
                out.append(LockBusy(name=r.name, holders=live, permits=r.permits, retry_after_s=wait))
        return out

    @staticmethod
    def _lease_from(name: str, owner: str, holder: str, permits: int, ttl: float, reply: Any) -> Lease:
        return Lease(
            name=name,
            owner_token=owner,
            fencing_token=int(_text(reply[1])),
            holder=holder,
            permits=permits,
            ttl_s=ttl,
            acquired_at=float(_text(reply[2])),
            expires_at=float(_text(reply[3])),
        )

    async def _release_quietly(self, lease: Lease) -> None:
        with contextlib.suppress(StoreError):
            await self.release_lock(lease)

    async def release_lock(self, lease: Lease) -> bool:
        """Delete ``lease`` if it is still live (owner-checked); False if it had lapsed or was released.

        Raises:
            InvalidTypeError: ``lease`` is not a Lease.
        """
        check_lease(lease)
        keys = [self._key("lock", lease.name), self._key("lockmeta", lease.name), self._key("fencing", lease.name)]
        script = self._scripts["release"]
        attempts = 0

        async def run(client: aioredis.Redis) -> bool:
            nonlocal attempts
            attempts += 1
            reply = await script(keys=keys, args=[lease.owner_token, self._now_arg()], client=client)
            if isinstance(reply, int):
                return reply == 1  # 1: it was live and is released; 0: it had lapsed
            # Not there (the reply is the server time and the name's fencing counter). After a
            # lost connection, an earlier attempt of this call released it if it was live then
            # and nobody has acquired the name since: it is still live by the server clock, and
            # the counter is still the lease's token. Any doubt says False (the lock reads as
            # lost): keys a restart, a flush or an eviction removed may look the same.
            now, counter = (reply.decode() if isinstance(reply, bytes) else str(reply)).split()
            return attempts > 1 and float(now) < lease.expires_at and int(counter) == lease.fencing_token

        with CallGate.giving_back():  # let through while the store closes (see close)
            return await self._call(run, "release_lock")

    async def renew_lock(self, lease: Lease, ttl_s: float | None = None) -> Lease | None:
        """Extend a live lease to ``ttl_s`` (default ``lease.ttl_s``) from now; None if it lapsed.

        Raises:
            InvalidArgumentError, InvalidTypeError: a bad argument.
        """
        check_lease(lease)
        ttl = lease.ttl_s if ttl_s is None else check_lease_s("ttl_s", ttl_s)
        (renewed,) = await self._renew([(lease, ttl)])
        return renewed

    async def renew_locks(self, leases: Sequence[Lease]) -> list[Lease | None]:
        """Renew many leases in one round trip, each by its own ``ttl_s``; None where lapsed.

        The leases go in script calls of at most 256 each (a script holds the Redis server
        while it runs), sent together in one pipeline.

        Raises:
            InvalidTypeError: not a list or tuple of Lease.
        """
        checked = check_leases(leases)
        if not checked:
            return []
        return await self._renew([(lease, lease.ttl_s) for lease in checked])

    async def _renew(self, items: Sequence[tuple[Lease, float]]) -> list[Lease | None]:
        """Renew ``(lease, ttl_s)`` pairs: script calls of at most ``_RENEW_CHUNK`` leases, in one pipeline."""
        script, now_arg = self._scripts["renew_many"], self._now_arg()
        calls: list[tuple[list[str], list[str | int | float]]] = []
        for first in range(0, len(items), _RENEW_CHUNK):
            keys: list[str] = []
            args: list[str | int | float] = [now_arg, self.key_slack_ms]
            for lease, ttl in items[first : first + _RENEW_CHUNK]:
                keys += [self._key("lock", lease.name), self._key("lockmeta", lease.name)]
                args += [lease.owner_token, repr(ttl)]
            calls.append((keys, args))

        async def run(client: aioredis.Redis) -> list[Any]:
            if len(calls) == 1:
                return list(await script(keys=calls[0][0], args=calls[0][1], client=client))
            async with client.pipeline(transaction=False) as pipe:  # one round trip; renewals are idempotent
                for keys, args in calls:
                    await script(keys=keys, args=args, client=pipe)
                return [expires for reply in await pipe.execute() for expires in reply]

        reply = await self._call(run, "renew_locks")
        out: list[Lease | None] = []
        for (lease, ttl), expires in zip(items, reply, strict=True):
            text = _text(expires)
            out.append(None if text == "" else replace(lease, ttl_s=ttl, expires_at=float(text)))
        return out

    async def list_locks(self, name: str | None = None) -> list[LockInfo]:
        """Live leases of ``name`` (or of every name under the prefix), by name then fencing token.

        Raises:
            InvalidArgumentError, InvalidTypeError: a bad ``name``.
        """
        if name is not None:
            check_name("name", name)
            names = [name]
        else:
            pattern = "".join("\\" + c if c in "*?[]\\" else c for c in self._key("lock", "")) + "*"  # a glob

            async def scan(client: aioredis.Redis) -> list[str]:
                return [_text(k) async for k in client.scan_iter(match=pattern, count=1000)]

            start = len(self._key("lock", ""))
            names = sorted({key[start:] for key in await self._call(scan, "list_locks")})
        script, now_arg = self._scripts["list"], self._now_arg()

        async def read(client: aioredis.Redis, chunk: Sequence[str]) -> list[Any]:
            async with client.pipeline(transaction=False) as pipe:  # one round trip per chunk
                for n in chunk:
                    await script(keys=[self._key("lock", n), self._key("lockmeta", n)], args=[now_arg], client=pipe)
                return list(await pipe.execute())

        replies: list[Any] = []
        for first in range(0, len(names), _LIST_CHUNK):
            chunk = names[first : first + _LIST_CHUNK]
            replies += await self._call(functools.partial(read, chunk=chunk), "list_locks")
        found: list[LockInfo] = []
        for n, reply in zip(names, replies, strict=True):
            now = float(_text(reply[0]))
            for i in range(1, len(reply), 3):
                owner, expires, meta = _text(reply[i]), float(_text(reply[i + 1])), _text(reply[i + 2])
                token, permits, acquired, holder = meta.split("|", 3) if meta else ("0", "1", "0", "")
                found.append(
                    LockInfo(
                        name=n,
                        owner_token=owner,
                        holder=holder,
                        fencing_token=int(token),
                        permits=int(permits),
                        acquired_at=float(acquired),
                        expires_at=expires,
                        remaining_ttl_s=expires - now,
                    )
                )
        found.sort(key=lambda info: (info.name, info.fencing_token))
        return found

    async def survey_prefixes(self, *, max_keys: int = SURVEY_MAX_KEYS) -> PrefixSurvey:
        """The key prefixes holding lock fencing counters on this server: one bounded ``SCAN``, read-only.

        For a prefix that shows nothing (see :mod:`asynccoord.backends.redisprefixes`): it
        examines about ``max_keys`` keys at most, however large the server.

        Raises:
            InvalidArgumentError, InvalidTypeError: ``max_keys`` is not an int >= 1.
        """
        cap = check_int("max_keys", max_keys, minimum=1)
        return await self._call(functools.partial(survey_prefixes, prefix=self.prefix, max_keys=cap), "survey")

    async def fence(self, resource: str, fencing_token: int) -> None:
        """Record ``fencing_token`` as seen by ``resource``, refusing a lower one (equal accepted).

        Raises:
            FencingTokenRejectedError: the resource accepted a higher token; nothing written.
            InvalidArgumentError, InvalidTypeError: a bad argument.
        """
        resource, token = check_fence_args(resource, fencing_token)
        await self._fence(resource, token, None)

    async def fenced_write(self, resource: str, fencing_token: int, data: Any) -> FenceRecord:
        """Check the token as :meth:`fence` does and store ``data`` (JSON) with it, atomically.

        Raises:
            FencingTokenRejectedError: the resource accepted a higher token; nothing written.
            InvalidArgumentError, InvalidTypeError, PayloadTooLargeError: a bad argument.
        """
        resource, token = check_fence_args(resource, fencing_token)
        text = encode_fence_data(data, self.config.max_payload_bytes)
        updated_at = await self._fence(resource, token, text)
        return FenceRecord(resource=resource, fencing_token=token, data=decode_json(text), updated_at=updated_at)

    async def _fence(self, resource: str, token: int, data: str | None) -> float:
        args = (str(token), self._now_arg(), "0" if data is None else "1", data or "")
        reply = await self._script("fence", (self._key("fence", resource),), args, "fence")
        if int(reply[0]) != 1:
            self.events.add(ev.FENCING_REJECTED)
            raise fence_rejected_error(resource, token, int(_text(reply[1])))
        return float(_text(reply[2]))

    async def advance_fencing_token(self, name: str, at_least: int) -> bool:
        """Move ``name``'s fencing counter up to ``at_least`` if it is lower; never down. One script.

        The next acquisition of ``name`` then gets a token above ``at_least``: for a counter set
        back by a restart that lost writes, found when a resource refused a token as lower than
        ``at_least``. A move is logged at WARNING (``asynccoord.redis.fencing_counter_behind``),
        once per set-back counter: later calls find it at ``at_least`` or above.

        Args:
            name: Lock name, 1..255 characters.
            at_least: The lowest value the counter may have after the call, 1..2**63-1.

        Returns:
            True if the counter was lower and was moved, False if it was at ``at_least`` or above.

        Raises:
            InvalidArgumentError, InvalidTypeError: a bad argument; nothing written.
            StoreConnectionError: the server stayed unreachable.
        """
        check_name("name", name)
        token = check_int("at_least", at_least, minimum=1, maximum=MAX_FENCING_TOKEN)
        before = int(_text(await self._script("advance", (self._key("fencing", name),), (str(token),), "advance")))
        if before >= token:
            return False
        log.warning(
            "asynccoord.redis.fencing_counter_behind name=%r counter=%d accepted=%d: the lock's fencing counter "
            "was behind a token a fenced resource had accepted (likely a Redis restart that lost writes: enable "
            "appendonly yes); moved to it, so the next acquisition's token is above it",
            name,
            before,
            token,
        )
        return True

    async def read_fence(self, resource: str) -> FenceRecord | None:
        """The resource's highest accepted token and last fenced data; None if never fenced.

        Raises:
            InvalidArgumentError, InvalidTypeError: a bad ``resource``.
        """
        check_name("resource", resource)
        key = self._key("fence", resource)

        async def run(client: aioredis.Redis) -> Any:
            return await client.hgetall(key)

        fields = {_text(k): _text(v) for k, v in (await self._call(run, "read_fence")).items()}
        if not fields:
            return None
        data = fields.get("data")
        return FenceRecord(
            resource=resource,
            fencing_token=int(fields["token"]),
            data=None if data is None else decode_json(data),
            updated_at=float(fields["updated_at"]),
        )
