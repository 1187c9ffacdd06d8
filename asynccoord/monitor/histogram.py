"""Latency histograms with fixed exponential buckets that merge by addition.

Every histogram uses the same bucket bounds (:data:`BUCKET_BOUNDS_MS`), so histograms of
processes, nodes and time buckets merge by adding counts; this is the idea of Prometheus
histograms and of HdrHistogram (G. Tene: buckets of bounded relative width), and
quantiles are estimated as Prometheus' ``histogram_quantile`` does.
"""

from __future__ import annotations

import bisect
import contextlib
import math
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from ..errors import InvalidArgumentError, InvalidTypeError
from ..validation import _short, check_finite, check_int, check_name, check_non_negative

__all__ = (
    "BUCKET_BOUNDS_MS",
    "CLAIM_MS",
    "COMMIT_MS",
    "ENQUEUE_TO_COMMIT_MS",
    "LATENCY_NAMES",
    "SEND_MS",
    "SLOTS",
    "Histogram",
    "LatencyRecorder",
)

CLAIM_MS = "claim_ms"
"""Latency of one ``store.claim`` call, milliseconds."""
SEND_MS = "send_ms"
"""Latency of the user's ``send(task)``, milliseconds."""
COMMIT_MS = "commit_ms"
"""Latency of one ``store.complete`` call, milliseconds."""
ENQUEUE_TO_COMMIT_MS = "enqueue_to_commit_ms"
"""From a task's ``created_at`` to its commit, store clock, milliseconds."""

LATENCY_NAMES: tuple[str, ...] = (CLAIM_MS, SEND_MS, COMMIT_MS, ENQUEUE_TO_COMMIT_MS)

_MIN_BOUND_MS = 0.01
_STEPS_PER_DOUBLING = 4
_DOUBLINGS = 26

BUCKET_BOUNDS_MS: tuple[float, ...] = tuple(
    float(f"{_MIN_BOUND_MS * 2 ** (i / _STEPS_PER_DOUBLING):.6g}") for i in range(_DOUBLINGS * _STEPS_PER_DOUBLING + 1)
)
"""Upper bounds (inclusive) of the finite buckets, milliseconds, ascending.

Bucket ``i`` holds values ``v`` with ``BUCKET_BOUNDS_MS[i-1] < v <= BUCKET_BOUNDS_MS[i]``
(bucket 0 holds ``0 <= v <= 0.01``). Part of the storage format: never change it.
"""

SLOTS = len(BUCKET_BOUNDS_MS) + 1
"""Number of count slots: one per finite bound plus the overflow slot (``+Inf``)."""


def _check_sum(arg: str, value: object) -> float:
    """Check a histogram's sum of values: a number >= 0, not NaN (+inf: a sum that overflowed)."""
    if type(value) is float and value >= 0.0:  # NaN fails the comparison; +inf passes
        return value
    return check_non_negative(arg, value, maximum=None)


def slot_of(value_ms: float) -> int:
    """The slot index counting ``value_ms`` (>= 0): the first bound >= the value, or overflow."""
    return bisect.bisect_left(BUCKET_BOUNDS_MS, value_ms)


@dataclass(frozen=True, slots=True)
class Histogram:
    """An immutable latency histogram over :data:`BUCKET_BOUNDS_MS`.

    Every histogram in every process uses the same bucket upper bounds
    (:data:`BUCKET_BOUNDS_MS`), so two histograms (of two processes, two time buckets,
    two nodes) merge by adding their counts slot by slot, and a delta between two
    snapshots is a subtraction. That is the idea of Prometheus histograms (cumulative
    ``le`` buckets summed across instances) and of HdrHistogram (G. Tene: buckets of
    bounded *relative* width, so precision is the same at 50 us and at 50 s). Here the
    bounds grow by a factor ``2 ** (1/4)`` (about 19 %) from 0.01 ms to about 671 s,
    105 finite bounds plus an overflow slot: a quantile estimate is off by at most one
    bucket's width, under 19 % of the value.

    Quantiles are estimated as Prometheus' ``histogram_quantile`` does: find the bucket
    holding the rank, interpolate linearly inside it (from 0 for the first bucket); a
    rank in the overflow slot yields the largest finite bound.

    Attributes:
        counts: Observations per slot, a tuple of ``SLOTS`` ints >= 0 (last = overflow);
            a list is accepted and kept as a tuple.
        sum_ms: Sum of the observed values, milliseconds: a number >= 0 (not NaN), kept
            as a float.

    Raises:
        InvalidTypeError: ``counts`` is not a tuple (or list), a count is not an int
            (bool and float are refused), or ``sum_ms`` is not a number.
        InvalidArgumentError: ``counts`` has the wrong length or a negative count, or
            ``sum_ms`` is negative, NaN or an int too large for a float.
    """

    counts: tuple[int, ...]
    sum_ms: float = 0.0

    def __post_init__(self) -> None:
        counts: object = self.counts
        if type(counts) is not tuple:
            if not isinstance(counts, tuple | list):
                raise InvalidTypeError(
                    f"counts must be a tuple of {SLOTS} ints, got {type(counts).__name__} {_short(counts)}"
                )
            counts = tuple(counts)
            object.__setattr__(self, "counts", counts)
        if len(counts) != SLOTS:
            raise InvalidArgumentError(f"counts must have {SLOTS} slots, got {len(counts)}")
        if not all(type(c) is int and c >= 0 for c in counts):  # a type test first: "a" < 0 would raise
            for i, c in enumerate(counts):
                check_int(f"counts[{i}]", c, minimum=0)
        sum_ms = self.sum_ms
        if type(sum_ms) is not float or not sum_ms >= 0.0:
            object.__setattr__(self, "sum_ms", _check_sum("sum_ms", sum_ms))

    @classmethod
    def empty(cls) -> Histogram:
        """A histogram with no observations."""
        return cls((0,) * SLOTS, 0.0)

    @classmethod
    def from_slots(cls, slots: Mapping[int, int], sum_ms: float) -> Histogram:
        """Build from a sparse ``slot index -> count`` mapping (indexes in ``[0, SLOTS)``).

        Args:
            slots: Slot index (an int in ``[0, SLOTS)``) to count (an int >= 0).
            sum_ms: Sum of the observed values, milliseconds (a number >= 0, not NaN).

        Raises:
            InvalidTypeError: ``slots`` is not a mapping, an index or count is not an
                int, or ``sum_ms`` is not a number.
            InvalidArgumentError: a slot index out of range, a negative count, or a
                negative or NaN ``sum_ms``.
        """
        if not isinstance(slots, Mapping):
            raise InvalidTypeError(
                f"slots must be a mapping of slot index to count, got {type(slots).__name__} {_short(slots)}"
            )
        total = _check_sum("sum_ms", sum_ms)
        counts = [0] * SLOTS
        for slot, n in slots.items():
            if type(slot) is not int or not 0 <= slot < SLOTS:
                if isinstance(slot, bool) or not isinstance(slot, int):
                    raise InvalidTypeError(f"slot must be an int, got {type(slot).__name__} {_short(slot)}")
                raise InvalidArgumentError(f"slot must be in [0, {SLOTS}), got {_short(slot)}")
            counts[slot] += check_int(f"slots[{slot}]", n, minimum=0)
        return cls(tuple(counts), total)

    @property
    def count(self) -> int:
        """Number of observations."""
        return sum(self.counts)

    @property
    def mean_ms(self) -> float | None:
        """Mean of the observations, milliseconds; None when empty."""
        n = self.count
        return self.sum_ms / n if n else None

    def nonzero(self) -> list[tuple[int, int]]:
        """``(slot, count)`` of every slot with a count, ascending (the sparse form)."""
        return [(i, c) for i, c in enumerate(self.counts) if c]

    def __add__(self, other: Histogram) -> Histogram:
        if not isinstance(other, Histogram):
            return NotImplemented
        return Histogram(
            tuple(a + b for a, b in zip(self.counts, other.counts, strict=True)), self.sum_ms + other.sum_ms
        )

    def __sub__(self, other: Histogram) -> Histogram:
        """The observations of ``self`` not in ``other`` (``other`` is an earlier snapshot)."""
        if not isinstance(other, Histogram):
            return NotImplemented
        return Histogram(
            tuple(max(0, a - b) for a, b in zip(self.counts, other.counts, strict=True)),
            max(0.0, self.sum_ms - other.sum_ms),
        )

    def quantile(self, q: float) -> float | None:
        """Estimate the ``q``-quantile, milliseconds (Prometheus ``histogram_quantile`` rules).

        Args:
            q: The quantile, in ``[0, 1]`` (0.99 for p99).

        Returns:
            The estimate, or None when the histogram is empty.

        Raises:
            InvalidArgumentError: ``q`` outside ``[0, 1]``.
        """
        if isinstance(q, bool) or not isinstance(q, int | float) or not 0.0 <= q <= 1.0:
            raise InvalidArgumentError(f"q must be a number in [0, 1], got {q!r}")
        total = self.count
        if total == 0:
            return None
        rank = q * total
        seen = 0
        for slot, n in enumerate(self.counts):
            if n == 0:
                continue
            if seen + n >= rank:
                if slot >= len(BUCKET_BOUNDS_MS):
                    return BUCKET_BOUNDS_MS[-1]
                lower = BUCKET_BOUNDS_MS[slot - 1] if slot > 0 else 0.0
                upper = BUCKET_BOUNDS_MS[slot]
                return lower + (upper - lower) * max(0.0, rank - seen) / n
            seen += n
        return BUCKET_BOUNDS_MS[-1]  # pragma: no cover - rank <= total always lands above

    @property
    def p50(self) -> float | None:
        """Median estimate, milliseconds (None when empty)."""
        return self.quantile(0.5)

    @property
    def p90(self) -> float | None:
        """90th percentile estimate, milliseconds (None when empty)."""
        return self.quantile(0.9)

    @property
    def p99(self) -> float | None:
        """99th percentile estimate, milliseconds (None when empty)."""
        return self.quantile(0.99)

    def __repr__(self) -> str:
        def fmt(v: float | None) -> str:
            return "-" if v is None else f"{v:.3g}"

        return f"<Histogram count={self.count} p50={fmt(self.p50)}ms p99={fmt(self.p99)}ms sum_ms={self.sum_ms:.3f}>"


class _Acc:
    __slots__ = ("counts", "sum_ms")

    def __init__(self) -> None:
        self.counts = [0] * SLOTS
        self.sum_ms = 0.0


class LatencyRecorder:
    """Thread-safe latency histograms keyed by name (``store.latencies``).

    Its names are ``claim_ms``, ``send_ms``, ``commit_ms`` and ``enqueue_to_commit_ms``
    (:data:`LATENCY_NAMES`).

    ``observe`` costs one bisect over 105 bounds and a lock; nodes call it from the
    event loop, stores from their driver thread.
    """

    __slots__ = ("_data", "_lock")

    def __init__(self) -> None:
        self._data: dict[str, _Acc] = {}
        self._lock = threading.Lock()

    def observe(self, name: str, value_ms: float) -> None:
        """Count one observation of ``value_ms`` milliseconds under ``name``.

        A negative value (a clock step between two readings) counts as 0.

        Args:
            name: Latency name, e.g. ``"claim_ms"`` (1..255 characters).
            value_ms: The latency, milliseconds (finite).

        Raises:
            InvalidTypeError: ``name`` is not a str or ``value_ms`` not a number (bool is
                refused).
            InvalidArgumentError: ``value_ms`` is NaN, infinite or an int too large for a
                float, or ``name`` is empty, too long or holds a NUL (nothing is counted).
        """
        if type(value_ms) is not float or not math.isfinite(value_ms):  # the common case: one finite float
            value_ms = float(check_finite("value_ms", value_ms))
        if type(name) is not str:  # a name already seen is valid; a new one is checked below
            check_name("name", name)
        value = value_ms if value_ms > 0.0 else 0.0
        slot = bisect.bisect_left(BUCKET_BOUNDS_MS, value)  # (slot_of, inlined: this runs on every task)
        with self._lock:
            acc = self._data.get(name)
            if acc is None:
                check_name("name", name)
                acc = self._data[name] = _Acc()
            acc.counts[slot] += 1
            acc.sum_ms += value

    def observe_many(self, name: str, values_ms: list[float]) -> None:
        """Count each of ``values_ms`` (milliseconds) under ``name``, as :meth:`observe` would, under one lock.

        Raises:
            InvalidTypeError, InvalidArgumentError: as :meth:`observe`, for the first bad
                value or name (nothing is counted).
        """
        if type(name) is not str:
            check_name("name", name)
        slots: list[int] = []
        total = 0.0
        bounds = BUCKET_BOUNDS_MS
        bisect_left = bisect.bisect_left
        for value_ms in values_ms:
            if type(value_ms) is not float or not math.isfinite(value_ms):
                value_ms = float(check_finite("value_ms", value_ms))
            value = value_ms if value_ms > 0.0 else 0.0
            slots.append(bisect_left(bounds, value))
            total += value
        with self._lock:
            acc = self._data.get(name)
            if acc is None:
                check_name("name", name)
                acc = self._data[name] = _Acc()
            counts = acc.counts
            for slot in slots:
                counts[slot] += 1
            acc.sum_ms += total

    @contextlib.contextmanager
    def measure(self, name: str) -> Iterator[None]:
        """Observe the wall time of the ``with`` block under ``name`` (also when it raises)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.observe(name, (time.perf_counter() - started) * 1000.0)

    def snapshot(self) -> dict[str, Histogram]:
        """An immutable copy of every histogram observed so far, by name."""
        with self._lock:
            return {name: Histogram(tuple(acc.counts), acc.sum_ms) for name, acc in self._data.items()}

    def __repr__(self) -> str:
        return f"<LatencyRecorder {sorted(self.snapshot())}>"
