"""The suite's own ``exclusive`` and ``quiet`` markers (tests/exclusive.py), in a pytest run on two xdist workers."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from conftest import TESTS_DIR

pytest_plugins = ["pytester"]

CONFTEST = """
from exclusive import pytest_collection_modifyitems, pytest_configure, pytest_runtest_protocol
"""

TESTS = """
import os
import time

import pytest


def spend(name):
    started = time.time()
    time.sleep(0.15)
    with open(os.environ["SPANS"], "a") as f:
        f.write(f"{name} {started} {time.time()} {os.environ['PYTEST_XDIST_WORKER']}\\n")


@pytest.mark.exclusive
@pytest.mark.parametrize("n", range(3))
def test_alone(n):
    spend(f"alone{n}")


@pytest.mark.quiet
@pytest.mark.parametrize("n", range(6))
def test_quiet(n):
    spend(f"quiet{n}")


@pytest.mark.parametrize("n", range(10))
def test_plain(n):
    spend(f"plain{n}")
"""


def test_an_exclusive_test_overlaps_no_other_and_a_quiet_one_only_quiet_ones(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    spans_file = tmp_path / "spans.txt"
    monkeypatch.setenv("SPANS", str(spans_file))
    monkeypatch.setenv("PYTHONPATH", str(TESTS_DIR))
    pytester.makeini("[pytest]\nmarkers =\n    exclusive: runs alone\n    quiet: runs beside quiet tests only\n")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_spans=TESTS)
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=19)
    rows = (line.split() for line in spans_file.read_text().splitlines())
    spans = [(name, float(a), float(b), worker) for name, a, b, worker in rows]
    assert len(spans) == 19
    overlapping = [(x[0], y[0]) for x, y in itertools.combinations(spans, 2) if x[1] < y[2] and y[1] < x[2]]
    kinds = {frozenset(name.rstrip("0123456789") for name in pair) for pair in overlapping}
    assert frozenset({"plain"}) in kinds, (
        "the plain tests never ran side by side: the run was not spread over two workers"
    )
    assert frozenset({"quiet"}) in kinds, f"the quiet tests never ran side by side: {overlapping}"
    assert kinds <= {frozenset({"plain"}), frozenset({"quiet"})}, overlapping  # no other pair ever met
    ends = {kind: max(b for name, _, b, _ in spans if name.startswith(kind)) for kind in ("plain", "quiet")}
    assert all(a >= max(ends.values()) for name, a, _, _ in spans if name.startswith("alone")), spans  # run last
