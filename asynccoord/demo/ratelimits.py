"""The demo's rate limits: the simulated provider's limits, scaled in time, and how a run kept them.

The provider is modelled on Telegram's Bot API (about 30 messages/s per bot account with
bursts of 30, and 1 message/s per chat with short bursts of 3). The demo replays hours of
trace in seconds, so it scales time by :data:`RATE_SCALE`: every period is divided by it
(a chat may take 1 message per 1/8 s, with bursts of 3), which keeps the default demo
near a minute: its busiest chat then needs about 55 s. The simulated gateway enforces
these limits as a provider does, answering an HTTP-429-like rejection with a Retry-After;
the demo declares the same limits to the store (``set_rate_limits``) unless
``--no-rate-limits``.

The measures come from the gateway's own record (:func:`window_ratio`,
:func:`busiest_utilisation`): sliding windows of 1, 8 and 64 periods over the calls the
provider accepted, per key, against what a burst-then-sustained (GCRA) sequence allows
in each (``count * k + burst`` per ``k * per_s``, one more than GCRA's bound for the
half-open windows judged, for the time between claim and send, see
:func:`~asynccoord.contract.ratelimits.max_in_window`),
so a key held to its burst but sent over its sustained rate shows in the longer windows;
and the achieved rate of the busiest bucket over its allowed rate while it had messages
waiting.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..contract.ratelimits import RateLimit

__all__ = (
    "NOMINAL_LIMITS",
    "RATE_SCALE",
    "WINDOW_PERIODS",
    "Utilisation",
    "busiest_utilisation",
    "limit_keys",
    "limits_json",
    "provider_limits",
    "window_bound",
    "window_ratio",
)

RATE_SCALE = 8.0
"""How much faster than real time the demo's provider lets messages through (periods divided by this)."""

WINDOW_PERIODS = (1, 8, 64)
"""The window lengths :func:`window_ratio` judges, in periods of each limit."""

NOMINAL_LIMITS = (
    RateLimit(dimension="account", count=30, per_s=1.0, burst=30),
    RateLimit(dimension="chat", count=1, per_s=1.0, burst=3),
)
"""The provider's limits in real time (Telegram's Bot API, roughly): per bot account and per chat."""


def provider_limits(scale: float = RATE_SCALE) -> list[RateLimit]:
    """The provider's limits with every period divided by ``scale`` (the demo's compressed time)."""
    return [
        RateLimit(dimension=limit.dimension, count=limit.count, per_s=limit.per_s / scale, burst=limit.burst)
        for limit in NOMINAL_LIMITS
    ]


def limits_json(limits: Sequence[RateLimit]) -> list[dict[str, object]]:
    """Limits as the report shows them."""
    return [
        {"dimension": x.dimension, "count": x.count, "per_s": x.per_s, "burst": x.burst, "text": str(x)} for x in limits
    ]


def limit_keys(account: str, conversation: str) -> dict[str, str]:
    """A message's key for each limited dimension: its bot account and its chat."""
    return {"account": account, "chat": conversation}


def window_bound(limit: RateLimit, periods: int) -> int:
    """The most calls of one key a conforming sequence may put in a window of ``periods * per_s`` seconds.

    A GCRA sequence (:class:`~asynccoord.contract.ratelimits.RateLimit`) holds at most
    ``count * periods + burst - 1`` calls in any half-open window of that length; one
    more allows for the time between a claim and its send
    (:func:`~asynccoord.contract.ratelimits.max_in_window` is the case ``periods == 1``).
    """
    return limit.count * periods + limit.burst


def window_ratio(
    calls: Mapping[tuple[str, str], Sequence[float]],
    limits: Sequence[RateLimit],
    periods: Sequence[int] = WINDOW_PERIODS,
) -> float:
    """The fullest window of any key over what a conforming sequence allows in it, across window lengths.

    For each key and each ``k`` of ``periods``, the most calls in any half-open window of
    ``k * per_s`` seconds over :func:`window_bound` ``(limit, k)``. A window longer than
    the record (the first call to the last, all keys) is not judged, except ``k == 1``.
    A key kept to its burst but sent at twice its sustained rate gives near 2 in the
    longest window judged; one that keeps burst-then-sustained, at most 1.

    Args:
        calls: ``(dimension, key)`` -> arrival times of the calls the provider accepted,
            seconds, ascending.
        limits: The limits, by dimension (a dimension without one is not judged).
        periods: The window lengths, in periods of each limit (positive integers).

    Returns:
        The ratio (0.0 with no call): at most 1.0 when no key ever went over its bound.
    """
    by_dimension = {x.dimension: x for x in limits}
    every = [t for times in calls.values() for t in times]
    span_s = max(every) - min(every) if every else 0.0
    worst = 0.0
    for (dimension, _), times in calls.items():
        limit = by_dimension.get(dimension)
        if limit is None or not times:
            continue
        for k in periods:
            window_s = k * limit.per_s
            if k != 1 and window_s > span_s:
                continue
            most = 0
            start = 0
            for end, t in enumerate(times):  # windows [times[start], times[start] + window_s)
                while times[start] <= t - window_s:
                    start += 1
                most = max(most, end - start + 1)
            worst = max(worst, most / window_bound(limit, k))
    return worst


@dataclass(frozen=True, slots=True, kw_only=True)
class Utilisation:
    """The busiest bucket's achieved rate while it had messages waiting, over its allowed rate.

    Attributes:
        dimension: The bucket's dimension (``"chat"`` or ``"account"``).
        key: Its key.
        messages: Messages of the bucket.
        backlog_s: Seconds during which some of them were enqueued and not yet delivered.
        sends: Calls the provider accepted in those seconds.
        allowed_per_s: The limit's sustained rate, ``count / per_s``.
        ratio: ``sends / (backlog_s * allowed_per_s)``.
    """

    dimension: str
    key: str
    messages: int
    backlog_s: float
    sends: int
    allowed_per_s: float
    ratio: float


def busiest_utilisation(
    enqueued: Mapping[tuple[str, str], Sequence[float]],
    delivered: Mapping[tuple[str, str], Sequence[float]],
    accepted: Mapping[tuple[str, str], Sequence[float]],
    limits: Sequence[RateLimit],
) -> Utilisation | None:
    """How close to its limit the busiest bucket was sent while it had a backlog.

    The busiest bucket is the one whose messages need the longest at its allowed rate
    (messages over ``count / per_s``). Its backlog at ``t`` is the messages enqueued by
    ``t`` less those delivered by ``t``; its achieved rate is the calls the provider
    accepted while the backlog was positive, over the time it was.

    Args:
        enqueued: ``(dimension, key)`` -> enqueue times of its messages (store clock, seconds).
        delivered: ``(dimension, key)`` -> arrival times of its messages' deliveries.
        accepted: ``(dimension, key)`` -> arrival times of every call the provider accepted.
        limits: The provider's limits, by dimension.

    Returns:
        The measure, or None when no bucket has messages.
    """
    by_dimension = {x.dimension: x for x in limits}
    candidates = [
        (len(times) / (by_dimension[d].count / by_dimension[d].per_s), d, k)
        for (d, k), times in enqueued.items()
        if d in by_dimension and times
    ]
    if not candidates:
        return None
    _, dimension, key = max(candidates)
    limit = by_dimension[dimension]
    events = sorted(
        [(t, 1) for t in enqueued[(dimension, key)]] + [(t, -1) for t in delivered.get((dimension, key), ())]
    )
    periods: list[tuple[float, float]] = []
    backlog = 0
    opened = 0.0
    for t, step in events:
        before, backlog = backlog, backlog + step
        if before <= 0 < backlog:
            opened = t
        elif backlog <= 0 < before:
            periods.append((opened, t))
    calls = list(accepted.get((dimension, key), ()))
    backlog_s = sum(b - a for a, b in periods)
    sends = sum(bisect.bisect_right(calls, b) - bisect.bisect_left(calls, a) for a, b in periods)
    allowed = limit.count / limit.per_s
    return Utilisation(
        dimension=dimension,
        key=key,
        messages=len(enqueued[(dimension, key)]),
        backlog_s=backlog_s,
        sends=sends,
        allowed_per_s=allowed,
        ratio=sends / (backlog_s * allowed) if backlog_s > 0 else 0.0,
    )
