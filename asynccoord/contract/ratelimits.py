"""Rate limits per queue: the :class:`RateLimit` record, GCRA arithmetic as pure functions, argument checks.

A queue may declare limits on dimensions of its tasks (an account, a chat), and a claim
leases a task only when every bucket it names has a token. Each bucket is one number,
its theoretical arrival time, updated by the Generic Cell Rate Algorithm (ITU-T
Recommendation I.371, "virtual scheduling"); the functions here are pure, and the stores
read and write the numbers.

A token taken by a node that then crashed is not handed back, so the window bound errs on
the safe side.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from .._once import Once
from ..errors import InvalidArgumentError, InvalidTypeError
from ..validation import (
    MAX_DURATION_S,
    MAX_LIMITS,
    _short,
    check_int,
    check_limit_keys,
    check_name,
    check_optional_key,
    check_optional_name,
)

if TYPE_CHECKING:
    from ..models import Task

__all__ = (
    "Admission",
    "HELD_BUCKETS_MAX",
    "HeldBucket",
    "MAX_LIMITS",
    "MIN_EMISSION_INTERVAL_S",
    "RateLimit",
    "RateLimitStore",
    "check_held_buckets_args",
    "check_limit_keys",
    "check_pause_target",
    "check_rate_limits",
    "check_retry_after_s",
    "conforms",
    "decode_limit_keys",
    "describe_limits",
    "eligible_at",
    "encode_limit_keys",
    "held_wait_s",
    "limits_from_rows",
    "max_in_window",
    "parse_rate_limit",
    "pause_targets",
    "paused_tat",
    "refused_task_delay_s",
    "sort_held",
    "take",
    "warn_undeclared_dimensions",
)

log = logging.getLogger(__name__)

Bucket = tuple[str, str]
"""A bucket of one queue: ``(dimension, key)``."""


MIN_EMISSION_INTERVAL_S = 1e-6
"""The shortest emission interval ``per_s / count`` a :class:`RateLimit` accepts, seconds.

The stores keep a bucket's theoretical arrival time as seconds since the epoch in an IEEE
double, whose step near today's time is 2**-22 s (about 0.24 microseconds, until 2038): a
claim that adds an interval below half a step leaves the time where it was, and the limit
limits nothing (at ``per_s=5e-324`` the interval is 0). At one microsecond, about four
steps, each claim still moves the time on (rounded by at most an eighth of the interval),
and a key may still take a million claims per second, far beyond any provider's limit."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RateLimit:
    """At most ``count`` claims per ``per_s`` seconds per key of ``dimension``, with bursts of ``burst``.

    A queue may declare several limits, each on one *dimension* of its tasks (an account, a
    chat, a group); a task names its key for each dimension at enqueue (``NewTask.limit_keys``)
    and the claim leases it only when every bucket it names, ``(queue, dimension, key)``, has
    a token, taking them in the claim's transaction. Each bucket is one number kept in the
    store, its *theoretical arrival time* (TAT), updated by the Generic Cell Rate Algorithm
    (ITU-T Recommendation I.371, "virtual scheduling"; the form used by e.g. Brandur Leach's
    "Rate limiting, cells, and GCRA", 2015): with emission interval ``T = per_s / count`` and
    tolerance ``tau = (burst - 1) * T``, a cell at time ``now`` conforms when
    ``TAT - tau <= now``, and taking it sets ``TAT = max(TAT, now) + T``. A key idle long
    enough thus takes ``burst`` cells at once, then one every ``T``: any window of ``per_s``
    seconds holds at most ``count + burst`` conforming cells, ``burst`` at its start and
    ``count`` more up to its end inclusive (:func:`max_in_window`; one fewer in a window
    ``[t, t + per_s)`` that leaves its end out). A backlog is served at ``count / per_s``
    when ``burst`` is 2 or more: a claim that comes after its token fell due, by less than
    the tolerance, takes nothing from later tokens. With ``burst=1`` there is no tolerance,
    and each such delay (the node's timer, its loop, the claim's round trip) pushes every
    later token back: one key at 50/s drained by 8 nodes on SQLite under load went at
    35.6-40.3/s with ``burst=1`` and 50.0/s with ``burst=2``. Keeping the schedule for late
    claims instead would let a send follow the one before it sooner than ``T``, which a
    provider enforcing the same limit strictly answers with a 429. A provider's Retry-After
    pauses a bucket by raising its TAT so that the next cell conforms no sooner than the
    pause's end. Every function here is pure: the stores read and write the TATs.

    Args:
        dimension: What the limit is on, e.g. ``"chat"``: the name tasks give their key
            under in ``NewTask.limit_keys``; 1..255 characters, not only whitespace.
        count: Claims per ``per_s`` seconds (sustained rate ``count / per_s``), 1..2**31 - 1.
        per_s: The period, seconds: finite, > 0, at most one year. ``per_s / count`` (the
            emission interval) must be at least :data:`MIN_EMISSION_INTERVAL_S`, one
            microsecond: a million claims per second per key.
        burst: Claims a key that was idle long enough may take at once, 1..2**31 - 1.
            Default 1 (evenly spaced, one every ``per_s / count`` seconds, and a backlog a
            little below that rate: declare the provider's burst, if it allows one, to
            reach it).

    Raises:
        InvalidTypeError, InvalidArgumentError: a bad field, naming it (``per_s`` and
            ``count`` when their emission interval is below one microsecond).
    """

    dimension: str
    count: int
    per_s: float
    burst: int = 1

    def __post_init__(self) -> None:
        check_name("dimension", self.dimension)
        check_int("count", self.count, minimum=1, maximum=2**31 - 1)
        check_int("burst", self.burst, minimum=1, maximum=2**31 - 1)
        per_s = _seconds("per_s", self.per_s)
        if not (math.isfinite(per_s) and 0 < per_s <= MAX_DURATION_S):
            raise InvalidArgumentError(
                f"per_s must be a finite number of seconds > 0 and <= {MAX_DURATION_S:g}, got {_short(self.per_s)}"
            )
        object.__setattr__(self, "per_s", per_s)
        if self.per_s / self.count < MIN_EMISSION_INTERVAL_S:
            raise InvalidArgumentError(
                f"per_s / count must be at least {MIN_EMISSION_INTERVAL_S:g} s (one claim per key per microsecond), "
                f"got per_s={self.per_s!r} / count={self.count} = {self.per_s / self.count:g} s: the stores keep "
                "a bucket's time as seconds since the epoch in a float, whose step is about 0.24 microseconds, "
                "so a shorter interval is lost to rounding and the limit would limit nothing; "
                "raise per_s or lower count"
            )

    @property
    def interval_s(self) -> float:
        """Seconds between two claims of one key at the sustained rate (GCRA's emission interval ``T``)."""
        return self.per_s / self.count

    @property
    def tolerance_s(self) -> float:
        """How far ahead of now a bucket's TAT may be while a claim still conforms (``(burst - 1) * T``)."""
        return (self.burst - 1) * self.interval_s

    def __str__(self) -> str:
        return f"{self.dimension}={self.count}/{self.per_s:g}s,burst={self.burst}"


def describe_limits(limits: Iterable[RateLimit]) -> str:
    """``limits`` as the command line writes them, by dimension: ``"account=2/1s,burst=1 chat=1/1s,burst=3"``.

    ``"none"`` when there are none.
    """
    return " ".join(str(limit) for limit in sorted(limits, key=lambda limit: limit.dimension)) or "none"


def conforms(tat: float | None, now: float, limit: RateLimit) -> bool:
    """Whether a bucket whose TAT is ``tat`` (None: never used) has a token at ``now``."""
    return tat is None or tat - limit.tolerance_s <= now


def eligible_at(tat: float | None, limit: RateLimit) -> float | None:
    """When a bucket whose TAT is ``tat`` next has a token (None: it has one at any time)."""
    return None if tat is None else tat - limit.tolerance_s


def held_wait_s(tat: float, now: float, limit: RateLimit) -> float:
    """Seconds from ``now`` until a bucket whose TAT is ``tat`` next has a token: ``max(0, TAT - tau - now)``."""
    return max(0.0, tat - limit.tolerance_s - now)


HELD_BUCKETS_MAX = 1000
"""The most buckets one :meth:`RateLimitStore.held_buckets` call returns."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HeldBucket:
    """A bucket holding its key's tasks back now: it has no token until ``wait_s`` from now.

    Attributes:
        queue: The queue that declares the limit.
        dimension: The limit's dimension (e.g. ``"chat"``).
        key: The key of that dimension the bucket counts (e.g. a chat id).
        wait_s: Seconds from the read, store clock, until its next token (> 0).
    """

    queue: str
    dimension: str
    key: str
    wait_s: float

    def to_dict(self) -> dict[str, str | float]:
        """The bucket as a JSON-ready dict of its fields."""
        return {"queue": self.queue, "dimension": self.dimension, "key": self.key, "wait_s": self.wait_s}


def check_held_buckets_args(queue: object, limit: object) -> tuple[str | None, int]:
    """Check the arguments of :meth:`RateLimitStore.held_buckets`: a queue name or None, 1..1000.

    Raises:
        InvalidTypeError, InvalidArgumentError: a bad queue name, or ``limit`` not an int
            in ``1..HELD_BUCKETS_MAX``.
    """
    return check_optional_name("queue", queue), check_int("limit", limit, minimum=1, maximum=HELD_BUCKETS_MAX)


def sort_held(held: Sequence[HeldBucket], limit: int) -> list[HeldBucket]:
    """The ``limit`` longest waits first (then by queue, dimension, key), as every store orders them."""
    return sorted(held, key=lambda b: (-b.wait_s, b.queue, b.dimension, b.key))[:limit]


def take(tat: float | None, now: float, limit: RateLimit) -> float:
    """The TAT after a token is taken at ``now`` (the caller checked :func:`conforms`)."""
    return (now if tat is None else max(tat, now)) + limit.interval_s


def paused_tat(tat: float | None, until: float, limit: RateLimit) -> float:
    """The TAT of a bucket paused until ``until``: its next token comes no sooner than that.

    A pause never shortens what the bucket already owes (the TAT only rises), and the
    bucket comes back at its sustained rate: its burst refills from ``until`` on.
    """
    floor = until + limit.tolerance_s
    return floor if tat is None else max(tat, floor)


def max_in_window(limit: RateLimit) -> int:
    """The most claims any window of ``per_s`` seconds may hold per key: ``count + burst``.

    The bound is reached: a key idle long enough takes ``burst`` claims at a window's start,
    then one every emission interval ``T = per_s / count``, the last at the window's end. A
    half-open window ``[t, t + per_s)`` holds at most ``count + burst - 1`` claims, but the
    sends a receiver sees may still put ``count + burst`` in one: the time between a claim
    and its send may differ from one send to the next by up to ``T`` without more than this.
    """
    return limit.count + limit.burst


def check_rate_limits(limits: object) -> list[RateLimit]:
    """Check a queue's declared limits: a list or tuple of :class:`RateLimit`, one per dimension.

    Raises:
        InvalidTypeError: not a list or tuple, or an item that is not a RateLimit.
        InvalidArgumentError: two limits on one dimension, or more than :data:`MAX_LIMITS`.
    """
    if not isinstance(limits, list | tuple):
        raise InvalidTypeError(
            f"limits must be a list or tuple of RateLimit, got {type(limits).__name__} {_short(limits)}"
        )
    if len(limits) > MAX_LIMITS:
        raise InvalidArgumentError(f"a queue may declare at most {MAX_LIMITS} limits, got {len(limits)}")
    seen: set[str] = set()
    for i, limit in enumerate(limits):
        if not isinstance(limit, RateLimit):
            raise InvalidTypeError(f"limits[{i}] must be a RateLimit, got {type(limit).__name__} {_short(limit)}")
        if limit.dimension in seen:
            raise InvalidArgumentError(
                f"limits declare dimension {limit.dimension!r} twice: one limit per dimension "
                "(declare another dimension, e.g. 'chat_minute', for a second window)"
            )
        seen.add(limit.dimension)
    return list(limits)


def encode_limit_keys(limit_keys: Mapping[str, str]) -> str | None:
    """The stored form of a task's limit keys: compact JSON with sorted keys, or None when there are none."""
    if not limit_keys:
        return None
    return json.dumps(dict(limit_keys), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def decode_limit_keys(text: str | None) -> dict[str, str]:
    """Inverse of :func:`encode_limit_keys`.

    Raises:
        ValueError: ``text`` is not JSON (``json.JSONDecodeError``), not the object of
            strings that :func:`encode_limit_keys` writes, or names a dimension or key
            holding a NUL or a lone surrogate (no enqueue writes one, and neither store can
            keep it as a bucket's key): a row written by another tool.
    """
    if not text:
        return {}
    value = json.loads(text)
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ValueError(f"not a JSON object of strings: {_short(value)}")
    for dimension, key in value.items():
        if not _storable(dimension) or not _storable(key):
            raise ValueError(f"not limit keys an enqueue accepts (a NUL or a lone surrogate): {_short(value)}")
    return value


def _storable(text: str) -> bool:
    """Whether ``text`` holds no NUL and no lone surrogate (what both stores can keep as a bucket's key)."""
    if "\x00" in text:
        return False
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_undeclared: Once[tuple[str, str]] = Once(limit=1024)  # (queue, dimension) logged by warn_undeclared_dimensions


def warn_undeclared_dimensions(queue: str, limit_keys: Mapping[str, str], declared: Sequence[str]) -> None:
    """Log a task's limit keys of dimensions its queue does not limit, once per process and (queue, dimension).

    The task is enqueued with them all the same: such a key limits nothing until its dimension
    is declared (the claims read the declarations as they come), so a producer started before
    the limits are declared, or one whose queue's limits another process replaced
    (``run --rate-limit``), goes on enqueueing instead of losing the messages it was handed. A
    misspelt dimension shows in the log line ``asynccoord.rate_limits.undeclared_dimension``.
    """
    unknown = sorted(set(limit_keys) - set(declared))
    if not unknown:
        return
    new = [d for _, d in _undeclared.first((queue, d) for d in unknown)]
    if not new:
        return
    log.warning(
        "asynccoord.rate_limits.undeclared_dimension queue=%r dimensions=[%s] declared=[%s]: keys of these "
        "dimensions limit nothing until set_rate_limits() declares them",
        queue,
        ", ".join(new),
        ", ".join(sorted(declared)),
        extra={"event": "asynccoord.rate_limits.undeclared_dimension"},
    )


def check_retry_after_s(value: object) -> float:
    """Check a provider's Retry-After: a finite number of seconds, 0..one year.

    Raises:
        InvalidTypeError: not an int or float (bool is refused).
        InvalidArgumentError: NaN, infinite, negative or over one year.
    """
    seconds = _seconds("retry_after_s", value)
    if not (math.isfinite(seconds) and 0 <= seconds <= MAX_DURATION_S):
        raise InvalidArgumentError(
            f"retry_after_s must be a finite number of seconds in 0..{MAX_DURATION_S:g}, got {_short(value)}"
        )
    return seconds + 0.0  # -0.0 reads as 0.0


def _seconds(arg: str, value: object) -> float:
    """``value`` as a float of seconds, for the range checks of :class:`RateLimit` and :func:`check_retry_after_s`.

    An int beyond the float range becomes ``inf`` (refused by the range check, never an
    ``OverflowError``).

    Raises:
        InvalidTypeError: not an int or float (bool is refused).
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidTypeError(f"{arg} must be a number of seconds, got {type(value).__name__} {_short(value)}")
    try:
        return float(value)
    except OverflowError:  # an int too large for a float
        return math.inf if value > 0 else -math.inf


def check_pause_target(dimension: object, key: object) -> tuple[str | None, str | None]:
    """Check which bucket a reported rate limit names: ``dimension`` and ``key``, each a name or None.

    Raises:
        InvalidTypeError, InvalidArgumentError: a bad name; a ``key`` without a ``dimension``.
    """
    dim = check_optional_name("dimension", dimension)
    k = check_optional_key("key", key)
    if k is not None and dim is None:
        raise InvalidArgumentError(f"key {k!r} was given without a dimension: name the dimension it belongs to")
    return dim, k


def pause_targets(
    limits: Mapping[str, RateLimit], limit_keys: Mapping[str, str], dimension: str | None, key: str | None
) -> list[Bucket]:
    """The buckets a provider's rate limit pauses: the one it names, or all of the task's.

    Args:
        limits: The queue's declared limits, by dimension.
        limit_keys: The task's keys, by dimension.
        dimension: The dimension the provider named; None for every bucket of the task.
        key: The key it named; None for the task's own key of ``dimension``.

    Returns:
        ``(dimension, key)`` of each bucket to pause, declared dimensions only (a
        dimension the queue does not limit, or one the task has no key for, pauses
        nothing: the caller then delays the task itself, as it does when every bucket paused
        is another key's: see :func:`refused_task_delay_s`).
    """
    if dimension is None:
        return [(d, k) for d, k in sorted(limit_keys.items()) if d in limits]
    if dimension not in limits:
        return []
    chosen = key if key is not None else limit_keys.get(dimension)
    return [] if chosen is None else [(dimension, chosen)]


def refused_task_delay_s(targets: Sequence[Bucket], limit_keys: Mapping[str, str], retry_after_s: float) -> float:
    """How long a task the provider refused waits by its own ``run_at``, given the paused ``targets``.

    Zero when a paused bucket is one the task draws on: that bucket holds it back, in its
    place. Otherwise (the provider named no declared limit, or another key's, such as the
    whole account's when the task's own account key differs) nothing would, and the task
    itself waits the whole ``retry_after_s``: the provider refused this very request.
    """
    own = set(limit_keys.items())
    return 0.0 if any(bucket in own for bucket in targets) else retry_after_s


def limits_from_rows(rows: Sequence[Sequence[object]]) -> dict[str, RateLimit]:
    """Declared limits from stored rows of ``(dimension, count, per_s, burst)``, by dimension."""
    out: dict[str, RateLimit] = {}
    for row in rows:
        dimension, count, per_s, burst = str(row[0]), row[1], row[2], row[3]
        assert isinstance(count, int)
        assert isinstance(per_s, int | float)
        assert isinstance(burst, int)
        if float(per_s) / count < MIN_EMISSION_INTERVAL_S:  # declared before the floor existed
            out[dimension] = _stored_limit(dimension, count, float(per_s), burst)
        else:
            out[dimension] = RateLimit(dimension=dimension, count=count, per_s=float(per_s), burst=burst)
    return out


def _stored_limit(dimension: str, count: int, per_s: float, burst: int) -> RateLimit:
    """A stored limit whose emission interval is below :data:`MIN_EMISSION_INTERVAL_S`, as it was stored.

    A database may hold one that an earlier version accepted: its claims go on as they
    did (the limit holds nothing back) instead of failing on every read of the limits;
    ``set_rate_limits`` refuses to store another.
    """
    limit = object.__new__(RateLimit)
    for name, value in (("dimension", dimension), ("count", count), ("per_s", per_s), ("burst", burst)):
        object.__setattr__(limit, name, value)
    return limit


class Admission:
    """One claim's pass over its candidates: which it may take, the tokens taken, when the others may go.

    The claim offers its candidates in its order (priority, then FIFO); :meth:`admit`
    says yes when every bucket the candidate names (of the queue's declared dimensions;
    keys of undeclared ones are ignored) has a token at ``now``, and takes them, so a
    later candidate of the same bucket sees it emptier. A candidate refused leaves every
    bucket as it was, so it never holds back another key's tasks. Buckets are read once
    each, through ``load``, within the claim's transaction.

    Args:
        limits: The queue's declared limits, by dimension.
        now: The claim's instant, store clock.
        load: ``load(dimension, key)``: the stored TAT of a bucket, None when it has none.

    Attributes:
        changed: The TATs to store: ``{(dimension, key): tat}`` of every token taken.
        held: Candidates refused.
        wake_at: Per partition, the earliest store-clock time a refused candidate of it
            may be taken (when all of its buckets have a token again, as far as this claim
            knows: a later claim may take them first).
    """

    __slots__ = ("_cache", "_load", "changed", "held", "limits", "now", "wake_at")

    def __init__(self, limits: Mapping[str, RateLimit], now: float, load: Callable[[str, str], float | None]) -> None:
        self.limits = limits
        self.now = now
        self._load = load
        self._cache: dict[Bucket, float | None] = {}
        self.changed: dict[Bucket, float] = {}
        self.held = 0
        self.wake_at: dict[int, float] = {}

    def _tat(self, bucket: Bucket) -> float | None:
        if bucket in self._cache:
            return self._cache[bucket]
        tat = self._cache[bucket] = self._load(*bucket)
        return tat

    def buckets(self, limit_keys: Mapping[str, str]) -> list[tuple[Bucket, RateLimit]]:
        """The buckets a task with these keys draws on (declared dimensions only)."""
        return [((d, k), self.limits[d]) for d, k in limit_keys.items() if d in self.limits]

    def earliest(self, limit_keys: Mapping[str, str]) -> float | None:
        """When a task with these keys may be taken: None if now, else the store-clock time."""
        at: float | None = None
        for bucket, limit in self.buckets(limit_keys):
            tat = self._tat(bucket)
            if not conforms(tat, self.now, limit):
                e = eligible_at(tat, limit)
                assert e is not None
                at = e if at is None else max(at, e)
        return at

    def admit(self, limit_keys: Mapping[str, str], partition: int) -> bool:
        """Take a token from every bucket of a task with these keys, or none; True when taken."""
        if not limit_keys:
            return True
        at = self.earliest(limit_keys)
        if at is not None:
            self.held += 1
            known = self.wake_at.get(partition)
            if known is None or at < known:
                self.wake_at[partition] = at
            return False
        for bucket, limit in self.buckets(limit_keys):
            tat = take(self._tat(bucket), self.now, limit)
            self._cache[bucket] = self.changed[bucket] = tat
        return True


def parse_rate_limit(text: str) -> RateLimit:
    """A limit from its command-line form ``DIMENSION=COUNT/PERIOD[,burst=N]``.

    ``PERIOD`` is a number of seconds with an optional unit: ``s`` (default), ``ms``,
    ``m`` or ``h``; e.g. ``account=30/1s,burst=30``, ``chat=1/1s,burst=3``, ``group=20/60s``.

    Raises:
        InvalidArgumentError: the text does not have that form (the message shows it).
    """
    if not isinstance(text, str):
        raise InvalidTypeError(f"a rate limit must be a str, got {type(text).__name__} {_short(text)}")
    form = "DIMENSION=COUNT/PERIOD[,burst=N], e.g. account=30/1s,burst=30"
    head, _, rest = text.partition(",")
    dimension, eq, rate = head.partition("=")
    count_text, slash, period = rate.partition("/")
    if not eq or not slash:
        raise InvalidArgumentError(f"rate limit {text!r} is not of the form {form}")
    burst = 1
    if rest:
        name, eq2, value = rest.partition("=")
        if name.strip() != "burst" or not eq2:
            raise InvalidArgumentError(f"rate limit {text!r}: only burst=N may follow the rate ({form})")
        if "," in value:
            raise InvalidArgumentError(f"rate limit {text!r}: only one burst=N may follow the rate ({form})")
        burst = _parse_int(text, "burst", value)
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    period = period.strip()
    scale = 1.0
    for suffix in ("ms", "s", "m", "h"):
        if period.endswith(suffix):
            period, scale = period[: -len(suffix)], units[suffix]
            break
    try:
        per_s = float(period) * scale
    except ValueError:
        raise InvalidArgumentError(f"rate limit {text!r}: period {period!r} is not a number ({form})") from None
    return RateLimit(dimension=dimension.strip(), count=_parse_int(text, "count", count_text), per_s=per_s, burst=burst)


def _parse_int(text: str, what: str, value: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise InvalidArgumentError(f"rate limit {text!r}: {what} {value.strip()!r} is not a whole number") from None


@runtime_checkable
class RateLimitStore(Protocol):
    """Rate limits per queue, enforced by the claim, across every process of the database.

    A queue declares limits, each on one dimension of its tasks (see
    :class:`~asynccoord.contract.ratelimits.RateLimit`); a task names its key for each
    dimension at enqueue (``NewTask.limit_keys``: a key of a dimension the queue does not
    declare limits nothing until it is declared, see :func:`warn_undeclared_dimensions`). The
    claim, in its transaction and on the store clock, leases a task only when each bucket
    ``(queue, dimension, key)`` it names has a token (GCRA, see
    :mod:`asynccoord.contract.ratelimits`), and takes them; a task without one stays pending
    in its place, holds no lease and uses no attempt, and the claim goes on past it to
    other keys' tasks. A token is never handed back (a lease that expires, a task released or
    reported rate limited keeps its token spent): the bound holds across crashes. The
    store announces through its notifier, to its idle nodes, when held-back work may go
    (``claimable_partitions`` counts only work whose buckets have tokens).
    ``complete_and_claim_next`` never leases a task held by a declared limit (a claim does).
    A queue with no limits pays nothing: its claims run the statements they ran before.
    """

    async def set_rate_limits(self, queue: str, limits: Sequence[RateLimit]) -> None:
        """Declare ``queue``'s limits for every process of the database, replacing what it had.

        Buckets keep their state across a change (a new rate applies from the next claim);
        an empty list removes the queue's limits (its tasks' keys are then ignored).

        Raises:
            InvalidTypeError, InvalidArgumentError: a bad queue, or limits that are not a list
                of RateLimit with one per dimension (nothing written).
        """
        ...

    async def rate_limits(self, queue: str) -> list[RateLimit]:
        """``queue``'s declared limits, by dimension name (empty when none)."""
        ...

    async def limited_queues(self) -> list[str]:
        """The queues that declare limits, by name, whether or not they hold tasks (a read)."""
        ...

    async def held_buckets(self, queue: str | None = None, limit: int = 50) -> list[HeldBucket]:
        """The buckets holding keys back now: those with no token at the store clock's now.

        A read that writes nothing (on SQLite, on the reader connection): for each bucket of
        ``queue`` (None: every queue) whose dimension the queue still declares and whose next
        token is later than now, its wait ``max(0, TAT - tau - now)`` in seconds. A bucket
        with a token, or one never used, is not listed.

        Args:
            queue: The queue, or None for every queue. Default None.
            limit: The most buckets returned, 1..:data:`HELD_BUCKETS_MAX`. Default 50.

        Returns:
            The held buckets, longest wait first (ties by queue, dimension, key).

        Raises:
            InvalidTypeError, InvalidArgumentError: a bad queue name or limit.
        """
        ...

    async def report_rate_limited(
        self, task: Task, retry_after_s: float, *, dimension: str | None = None, key: str | None = None
    ) -> Task:
        """A provider refused ``task`` for rate: pause its bucket(s), hand it back without using an attempt.

        In one transaction: the bucket ``(task's queue, dimension, key)`` (``key`` None: the
        task's own key of ``dimension``), or with ``dimension`` None every bucket the task
        draws on, gets no token before ``retry_after_s`` from now (store clock), and then
        refills from empty; and the task goes back to pending, its attempt not counted, its
        place (its id) kept, due at once when a paused bucket holds it back and after
        ``retry_after_s`` otherwise (no declared bucket named). Counts ``provider_rate_limited``.

        Returns:
            The task as now stored (pending).

        Raises:
            LeaseLostError: the lease is no longer the caller's: the task is left alone
                (the pause still applies).
            InvalidTypeError, InvalidArgumentError: a bad task, a NaN, infinite or negative
                ``retry_after_s``, a ``key`` without ``dimension`` (nothing written).
        """
        ...
