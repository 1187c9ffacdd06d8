"""The demo's rate-limit measures and its provider's 429s, without running the demo."""

from __future__ import annotations

from pathlib import Path

import pytest

from asynccoord.contract.ratelimits import RateLimit
from asynccoord.demo.gateway import ProviderRateLimitError, SimulatedGateway, audit, rate_record
from asynccoord.demo.ratelimits import NOMINAL_LIMITS, busiest_utilisation, provider_limits, window_ratio

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
