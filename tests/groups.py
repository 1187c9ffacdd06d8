"""A check that ``--dist loadgroup`` really keeps each ``xdist_group`` on one worker.

Tests marked ``xdist_group("name")`` share something a second worker would disturb (an
empty Redis database, a heavy framework import): pytest-xdist runs each group's tests on
one worker, one after another. It learns a test's group from a ``@name`` suffix that its
worker appends to the test's node id at collection. pytest 9.2 keeps node ids elsewhere, so
the suffix is silently lost and every group is spread over the workers as if unmarked
(pytest-dev/pytest-xdist#1386); the test extra holds pytest below 9.2 for that reason. This
hook turns such a loss into a failed run instead of tests that clash now and then.
"""

from __future__ import annotations

import pytest

GROUP_MARK = "xdist_group"


def lost_groups(items: list[pytest.Item]) -> list[str]:
    """The node ids of the marked tests whose id does not carry their group's suffix."""
    lost = []
    for item in items:
        names = sorted(
            {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers(GROUP_MARK)}
        )
        if names and not item.nodeid.endswith("@" + "_".join(names)):
            lost.append(item.nodeid)
    return lost


LOST_KEY = pytest.StashKey[set[str]]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """On a worker of a ``--dist loadgroup`` run: note the marked tests whose group's suffix is missing."""
    config = session.config
    if hasattr(config, "workerinput") and getattr(config.option, "loadgroup", False):
        config.stash[LOST_KEY] = set(lost_groups(session.items))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Fail a marked test that lost its group: it may clash with another of its group."""
    if item.nodeid in item.config.stash.get(LOST_KEY, set()):
        pytest.fail(
            f"--dist loadgroup lost this test's xdist_group: pytest {pytest.__version__} and this "
            "pytest-xdist spread a group over the workers (pytest-dev/pytest-xdist#1386); use pytest < 9.2",
            pytrace=False,
        )
