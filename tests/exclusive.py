"""Tests that run apart from the others while pytest-xdist spreads the suite over several workers.

A test marked ``exclusive`` judges time (a renewal's moment, a lease that must not lapse, a
latency) closely enough that a second worker loading the machine makes it fail, or acts on
the services as a whole (it kills every asynccoord connection to PostgreSQL): it runs while
no other test runs. A test marked ``quiet`` judges time as closely but spends its time
waiting, not computing, and touches only what it made: it runs while no ordinary test
runs, beside other quiet tests, whose load is a few sleeping event loops. The quiet tests
of a module of renewal timings then take a quarter of the time on four workers.

Under pytest-xdist every test takes locks on files that the workers of one run share, one
file per kind it must not meet: an ordinary test holds a shared lock on ``plain`` while it
runs, a quiet one a shared lock on ``quiet``; to come in, a test first takes the other
kind's file exclusively (waiting until every test of that kind has left), and an exclusive
test takes both. A third lock, the turnstile, is held while coming in (by an exclusive test,
until it is over), so a waiting test of one kind is not starved by a stream of the other
(the writer-preferring readers-writers lock of Courtois, Heymans and Parnas, "Concurrent
control with readers and writers", CACM 1971, with two kinds of readers). Without
pytest-xdist every test runs alone anyway and nothing is locked.

The controller makes a folder for the lock files before it starts its workers and names
it to them in ``ASYNCCOORD_TEST_LOCKS``; it removes the folder when the run is over. Workers
run the quiet tests after the ordinary ones, and the exclusive tests last.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

ENV = "ASYNCCOORD_TEST_LOCKS"
MARK = "exclusive"
QUIET = "quiet"


def is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    """On the controller of a run with workers: the folder of the lock files, named in ``ENV``."""
    if is_xdist_worker(config) or not getattr(config.option, "numprocesses", None):
        return
    folder = tempfile.mkdtemp(prefix="asynccoord-tests-")
    os.environ[ENV] = folder
    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


def kind(item: pytest.Item) -> int:
    """0 for an ordinary test, 1 for a quiet one, 2 for an exclusive one (an exclusive mark wins)."""
    if item.get_closest_marker(MARK) is not None:
        return 2
    return 1 if item.get_closest_marker(QUIET) is not None else 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a worker: the quiet tests after the ordinary ones, the exclusive tests last, each in their order.

    Every worker collects the same order, and the scheduler hands tests out about in it, so
    the quiet tests run at the end beside each other, and the exclusive ones after them wait
    for a long test of another worker about once, not once each.
    """
    if is_xdist_worker(config):
        items.sort(key=kind)  # stable: each kind keeps its order


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[object]:
    """Run the test (setup, call, teardown) in its turn."""
    with turn(item):
        return (yield)


@contextmanager
def turn(item: pytest.Item) -> Iterator[None]:
    """Hold the run's locks around one test, as its kind asks (see the module's docstring)."""
    folder = os.environ.get(ENV)
    if folder is None or not is_xdist_worker(item.config):
        yield
        return
    own, other = {0: ("plain", "quiet"), 1: ("quiet", "plain"), 2: (None, None)}[kind(item)]
    with ExitStack() as stack:
        files = {name: stack.enter_context(open(Path(folder) / name, "a")) for name in ("turnstile", "plain", "quiet")}
        fcntl.flock(files["turnstile"], fcntl.LOCK_EX)
        if own is None or other is None:  # exclusive: every test of either kind gone, none let in until it ends
            fcntl.flock(files["plain"], fcntl.LOCK_EX)
            fcntl.flock(files["quiet"], fcntl.LOCK_EX)
        else:
            fcntl.flock(files[other], fcntl.LOCK_EX)  # every test of the other kind gone
            fcntl.flock(files[own], fcntl.LOCK_SH)
            fcntl.flock(files[other], fcntl.LOCK_UN)
            fcntl.flock(files["turnstile"], fcntl.LOCK_UN)  # tests of its kind may come in beside it
        yield  # closing the files releases what is still held
