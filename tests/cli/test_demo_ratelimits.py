"""The demo's rate-limit measures and its provider's 429s, without running the demo."""

from __future__ import annotations

import time
import types
from pathlib import Path

import pytest

from asynccoord.contract.ratelimits import RateLimit
from asynccoord.demo import gateway as gateway_module
from asynccoord.demo.gateway import ProviderRateLimitError, SimulatedGateway, audit, provider_bucket, rate_record
from asynccoord.demo.ratelimits import (
    NOMINAL_LIMITS,
    busiest_utilisation,
    provider_limits,
    window_bound,
    window_ratio,
)

CHAT = RateLimit(dimension="chat", count=1, per_s=1.0, burst=3)  # at most 4 in any 1 s window


def test_the_provider_limits_are_the_nominal_ones_in_compressed_time() -> None:
    scaled = provider_limits(8.0)
    assert [(x.dimension, x.count, x.burst) for x in scaled] == [
        (x.dimension, x.count, x.burst) for x in NOMINAL_LIMITS
    ]
    assert [x.per_s for x in scaled] == [x.per_s / 8 for x in NOMINAL_LIMITS]


def test_window_ratio_is_the_fullest_window_over_count_plus_burst() -> None:
    calls = {("chat", "a"): [0.0, 0.1, 0.2, 0.3, 1.3], ("chat", "b"): [0.0, 0.5, 1.0, 1.5, 1.99, 2.0]}
    assert window_ratio(calls, [CHAT]) == 1.0  # a: 4 in [0, 1); b: 1.0, 1.5, 1.99 in [1.0, 2.0)
    calls[("chat", "a")].insert(4, 0.99)
    assert window_ratio(calls, [CHAT]) == 5 / 4
    assert window_ratio({("group", "g"): [0.0] * 9}, [CHAT]) == 0.0  # no limit on that dimension
    assert window_ratio({}, [CHAT]) == 0.0


def test_utilisation_counts_only_the_time_a_bucket_had_a_backlog() -> None:
    enqueued = {("chat", "a"): [0.0, 0.0, 0.0, 10.0], ("chat", "b"): [0.0]}
    delivered = {("chat", "a"): [0.0, 1.0, 2.0, 10.5], ("chat", "b"): [0.2]}
    accepted = {("chat", "a"): [0.0, 1.0, 1.5, 2.0, 10.5], ("chat", "b"): [0.2]}
    found = busiest_utilisation(enqueued, delivered, accepted, [CHAT])
    assert found is not None
    assert (found.dimension, found.key, found.messages) == ("chat", "a", 4)
    assert found.backlog_s == pytest.approx(2.5)  # [0, 2] and [10, 10.5]
    assert found.sends == 5  # 1.5 was a call that failed: it used the bucket all the same
    assert found.ratio == pytest.approx(5 / 2.5)
    assert busiest_utilisation({}, {}, {}, [CHAT]) is None


async def test_the_gateway_answers_429_with_a_retry_after_and_counts_late_sends_apart(tmp_path: Path) -> None:
    path = tmp_path / "gateway.db"
    limit = RateLimit(dimension="chat", count=1, per_s=30.0, burst=1)  # 2 per 30 s per chat
    async with SimulatedGateway(path, transient_error_rate=0.0, seed=1, limits=[limit]) as gateway:

        async def send(i: int, *, late: bool = False) -> str:
            return await gateway.deliver(
                msg_id=f"m{i}",
                account="acct",
                conversation="c1",
                seq=i,
                fencing_token=1,
                idempotency_key=f"m{i}",
                node="n",
                late=late,
            )

        assert await send(1) == "delivered"
        assert await send(2) == "delivered"
        with pytest.raises(ProviderRateLimitError) as refused:
            await send(3)
        assert (refused.value.dimension, refused.value.key) == ("chat", "c1")
        assert 29.0 < refused.value.retry_after_s <= 30.0
        with pytest.raises(ProviderRateLimitError):
            await send(3, late=True)
        assert (
            await gateway.deliver(
                msg_id="x", account="acct", conversation="c2", seq=1, fencing_token=1, idempotency_key="x", node="n"
            )
            == "delivered"
        )  # another chat is not held back
    seen = audit(path)
    assert (seen.rate_limited, seen.late_rate_limited, seen.delivered) == (1, 1, 3)
    record = rate_record(path)
    assert len(record.accepted[("chat", "c1")]) == 2
    assert len(record.delivered[("chat", "c1")]) == 2


def test_window_ratio_judges_the_sustained_rate_over_several_periods() -> None:
    """4 per 1 s window fits ``count + burst`` of one period, but is 4x the sustained rate."""
    four_per_second = {("chat", "a"): [float(s) for s in range(100) for _ in range(4)]}
    assert window_ratio(four_per_second, [CHAT], periods=(1,)) == 1.0  # what one period alone shows
    assert window_ratio(four_per_second, [CHAT]) == pytest.approx(256 / window_bound(CHAT, 64))
    # The burst, then twice the sustained rate: over 1 once it is spent.
    doubled = {("chat", "a"): [0.0] * 4 + [0.5 * i for i in range(1, 200)]}
    assert window_ratio(doubled, [CHAT]) > 1.5
    # The burst, then the sustained rate, each send up to one interval after its claim.
    conforming = {("chat", "a"): sorted([0.0] * 3 + [i + (0.99 if i % 2 else 0.0) for i in range(1, 200)])}
    assert 0.9 < window_ratio(conforming, [CHAT]) <= 1.0
    assert [window_bound(CHAT, k) for k in (1, 8, 64)] == [4, 11, 67]


def test_window_ratio_does_not_judge_windows_longer_than_the_record() -> None:
    calls = {("chat", "a"): [0.0, 0.0, 0.0, 0.0, 3.0, 3.0]}  # 6 in 8 s would be under 11
    assert window_ratio(calls, [CHAT]) == 1.0  # the 1 s window [0, 1) holds 4 of 4
    assert window_ratio({("chat", "a"): [0.0] * 5}, [CHAT]) == 5 / 4


class _Clock:
    """A wall clock the test sets, for the gateway's rate decisions."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def time(self) -> float:
        return self.now


async def _send_at(
    monkeypatch: pytest.MonkeyPatch, path: Path, limit: RateLimit, times: list[float]
) -> list[float | None]:
    """Send one request of chat ``c1`` at each of ``times`` (seconds, on a set clock): None if
    accepted, else the 429's Retry-After."""
    clock = _Clock()
    monkeypatch.setattr(gateway_module, "time", types.SimpleNamespace(time=clock.time, monotonic=time.monotonic))
    start = clock.now
    out: list[float | None] = []
    async with SimulatedGateway(path, transient_error_rate=0.0, seed=1, limits=[limit]) as gateway:
        for i, at in enumerate(times):
            clock.now = start + at
            try:
                await gateway.deliver(
                    msg_id=f"m{i}",
                    account="acct",
                    conversation="c1",
                    seq=i,
                    fencing_token=1,
                    idempotency_key=f"m{i}",
                    node="n",
                )
                out.append(None)
            except ProviderRateLimitError as exc:
                out.append(exc.retry_after_s)
    return out


async def test_the_gateway_refuses_twice_the_sustained_rate_after_the_burst(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """chat=1/1s,burst=3: 4 at once (the burst and one interval of slack), then one per second."""
    times = [0.0] * 4 + [0.5 * i for i in range(1, 41)]  # then 2 per second for 20 s
    answers = await _send_at(monkeypatch, tmp_path / "gateway.db", CHAT, times)
    assert answers[:4] == [None] * 4
    assert answers[4] == pytest.approx(0.5)  # at 0.5 s: the next conforms at 1.0 s
    assert answers[4::2] == [pytest.approx(0.5)] * 20  # every other one refused
    assert answers[5::2] == [None] * 20
    assert audit(tmp_path / "gateway.db").rate_limited == 20
    accepted = rate_record(tmp_path / "gateway.db").accepted
    assert len(accepted[("chat", "c1")]) == 24
    assert window_ratio(accepted, [CHAT]) <= 1.0  # what the provider let through conforms
    requested = rate_record(tmp_path / "gateway.db").requested
    assert len(requested[("chat", "c1")]) == 44
    assert window_ratio(requested, [CHAT]) > 1.0  # what the sender tried does not


async def test_the_gateway_accepts_a_burst_then_the_sustained_rate_with_one_interval_of_slack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Claims: the declared burst of 3 at 0, then one per second; each sent up to 0.99 s late.
    claims = [0.0] * 3 + [float(i) for i in range(1, 30)]
    times = sorted(c + (0.99 if i % 2 else 0.0) for i, c in enumerate(claims))
    answers = await _send_at(monkeypatch, tmp_path / "gateway.db", CHAT, times)
    assert answers == [None] * len(times)
    # Five at once is one more than the burst and its slack.
    answers = await _send_at(monkeypatch, tmp_path / "burst.db", CHAT, [0.0] * 5)
    assert answers[:4] == [None] * 4
    assert answers[4] == pytest.approx(1.0)


def test_the_provider_bucket_is_the_declared_limit_with_one_interval_of_slack() -> None:
    bucket = provider_bucket(CHAT)
    assert (bucket.count, bucket.per_s, bucket.burst) == (1, 1.0, 4)
    assert bucket.tolerance_s == CHAT.burst * CHAT.interval_s
