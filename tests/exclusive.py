"""Tests that run alone while pytest-xdist spreads the suite over several workers.

A test marked ``exclusive`` judges time (a renewal's moment, a lease that must not lapse, a
latency) closely enough that a second worker loading the machine makes it fail. Under
pytest-xdist every test holds a lock on a file that the workers of one run share: a
shared lock for ordinary tests, an exclusive one for marked tests, so a marked test waits
for the tests running on other workers and they wait for it. A second lock, the
turnstile, is taken before either, so a waiting exclusive test is not starved by a
stream of shared ones (the writer-preferring readers-writers lock; Courtois, Heymans and
Parnas, "Concurrent control with readers and writers", CACM 1971). Without pytest-xdist
every test runs alone anyway and nothing is locked.

The controller makes a folder for the lock files before it starts its workers and names
it to them in ``ASYNCCOORD_TEST_LOCKS``; it removes the folder when the run is over. Workers
run the marked tests last. The hooks are imported into ``conftest.py``.
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


def is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    """On the controller of a run with workers: the folder of the lock files, named in ``ENV``."""
    if is_xdist_worker(config) or not getattr(config.option, "numprocesses", None):
        return
    folder = tempfile.mkdtemp(prefix="asynccoord-tests-")
    os.environ[ENV] = folder
    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a worker: the exclusive tests last, in their order (every worker collects the same order).

    The scheduler hands tests out about in this order, so the exclusive tests run at the end,
    beside each other, and wait for a long ordinary test of another worker about once, not
    once each.
    """
    if is_xdist_worker(config):
        items[:] = [i for i in items if i.get_closest_marker(MARK) is None] + [
            i for i in items if i.get_closest_marker(MARK) is not None
        ]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[object]:
    """Run the test (setup, call, teardown) in its turn."""
    with turn(item):
        return (yield)


@contextmanager
def turn(item: pytest.Item) -> Iterator[None]:
    """Hold the run's lock around one test: exclusively if it is marked ``exclusive``."""
    folder = os.environ.get(ENV)
    if folder is None or not is_xdist_worker(item.config):
        yield
        return
    exclusive = item.get_closest_marker(MARK) is not None
    with ExitStack() as stack:
        gate = stack.enter_context(open(Path(folder) / "turnstile", "a"))
        room = stack.enter_context(open(Path(folder) / "room", "a"))
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(room, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        if not exclusive:
            fcntl.flock(gate, fcntl.LOCK_UN)  # others may come in beside this test
        yield  # closing the files releases what is still held
