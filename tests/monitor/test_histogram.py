"""Latency histograms: fixed exponential buckets, merge by addition, quantile estimates."""

from __future__ import annotations

import itertools
import math
import random
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asynccoord import Histogram, InvalidArgumentError, InvalidTypeError, LatencyRecorder
from asynccoord.monitor.histogram import BUCKET_BOUNDS_MS, SLOTS, slot_of

values_ms = st.floats(min_value=0.0, max_value=2_000_000.0, allow_nan=False, allow_infinity=False)


def record(values: list[float], name: str = "x_ms") -> Histogram:
    recorder = LatencyRecorder()
    for v in values:
        recorder.observe(name, v)
    return recorder.snapshot().get(name, Histogram.empty())


def test_bounds_are_ascending_exponential_and_cover_10us_to_10min() -> None:
    assert list(BUCKET_BOUNDS_MS) == sorted(set(BUCKET_BOUNDS_MS))
    assert BUCKET_BOUNDS_MS[0] == 0.01
    assert BUCKET_BOUNDS_MS[-1] > 600_000.0
    ratios = [b / a for a, b in itertools.pairwise(BUCKET_BOUNDS_MS)]
    assert all(1.18 < r < 1.19 for r in ratios)
    assert len(BUCKET_BOUNDS_MS) + 1 == SLOTS


def test_slots_include_their_upper_bound() -> None:
    assert slot_of(0.0) == 0
    assert slot_of(0.01) == 0
    assert slot_of(0.010001) == 1
    for i, bound in enumerate(BUCKET_BOUNDS_MS):
        assert slot_of(bound) == i
        assert slot_of(math.nextafter(bound, math.inf)) == i + 1
    assert slot_of(1e12) == SLOTS - 1


@settings(max_examples=60, deadline=None)
@given(st.lists(values_ms, max_size=50), st.lists(values_ms, max_size=50))
def test_histograms_of_two_processes_merge_by_addition(a: list[float], b: list[float]) -> None:
    merged = record(a) + record(b)
    together = record(a + b)
    assert merged.counts == together.counts
    assert merged.sum_ms == pytest.approx(together.sum_ms)
    assert (merged - record(a)).counts == record(b).counts


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(min_value=0.02, max_value=500_000.0), min_size=1, max_size=200),
    st.sampled_from([0.5, 0.9, 0.99]),
)
def test_quantile_estimate_is_within_one_bucket_of_the_truth(values: list[float], q: float) -> None:
    hist = record(values)
    estimate = hist.quantile(q)
    assert estimate is not None
    ranked = sorted(values)
    true = ranked[max(0, math.ceil(q * len(ranked)) - 1)]
    # The estimate lies in the bucket of the value of that rank: within one bucket width (< 19 %).
    slot = slot_of(true)
    lower = BUCKET_BOUNDS_MS[slot - 1] if slot > 0 else 0.0
    assert lower <= estimate <= BUCKET_BOUNDS_MS[slot]
    assert abs(estimate - true) <= 0.19 * true + 1e-9


def test_quantiles_of_a_known_distribution() -> None:
    rng = random.Random(7)
    values = [rng.uniform(1.0, 101.0) for _ in range(20_000)]
    hist = record(values)
    assert hist.count == 20_000
    assert hist.sum_ms == pytest.approx(sum(values))
    assert hist.mean_ms == pytest.approx(sum(values) / 20_000)
    assert hist.p50 == pytest.approx(51.0, rel=0.05)
    assert hist.p90 == pytest.approx(91.0, rel=0.05)
    # 100 ms sits in the bucket (94.1, 111.9]: linear interpolation assumes the bucket is
    # filled evenly up to its bound, so the estimate may be off by up to one bucket width.
    assert hist.p99 == pytest.approx(100.0, rel=0.19)


def test_empty_histogram_and_overflow() -> None:
    empty = Histogram.empty()
    assert empty.count == 0
    assert empty.p50 is None
    assert empty.mean_ms is None
    huge = record([5e9])
    assert huge.counts[-1] == 1
    assert huge.p99 == BUCKET_BOUNDS_MS[-1]  # as Prometheus: the largest finite bound


def test_negative_values_count_as_zero_and_bad_values_are_refused() -> None:
    recorder = LatencyRecorder()
    recorder.observe("x_ms", -3.0)
    assert recorder.snapshot()["x_ms"].counts[0] == 1
    with pytest.raises(InvalidArgumentError, match="finite"):
        recorder.observe("x_ms", math.nan)
    with pytest.raises(InvalidTypeError, match="value_ms"):
        recorder.observe("x_ms", "1")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="name"):
        recorder.observe("", 1.0)
    with pytest.raises(InvalidArgumentError, match="q must"):
        record([1.0]).quantile(1.5)
    with pytest.raises(InvalidArgumentError, match="slots"):
        Histogram((1, 2, 3))


def test_measure_times_a_block_even_when_it_raises() -> None:
    recorder = LatencyRecorder()
    with recorder.measure("block_ms"):
        pass
    with pytest.raises(ValueError, match="boom"), recorder.measure("block_ms"):
        raise ValueError("boom")
    assert recorder.snapshot()["block_ms"].count == 2


def test_recorder_is_thread_safe() -> None:
    recorder = LatencyRecorder()

    def work(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(5_000):
            recorder.observe("claim_ms", rng.uniform(0.0, 50.0))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert recorder.snapshot()["claim_ms"].count == 20_000


def test_from_slots_round_trip() -> None:
    hist = record([0.5, 3.0, 3.0, 70.0])
    assert Histogram.from_slots(dict(hist.nonzero()), hist.sum_ms) == hist
    with pytest.raises(InvalidArgumentError, match="slot"):
        Histogram.from_slots({SLOTS: 1}, 0.0)
