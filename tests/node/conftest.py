"""Fixtures of the node tests.

``pipeline``
    NodeConfig keywords for each of the two ways a node handles a claim's tasks: ``slots``
    (one asyncio task per task, the default of an ordered queue with ``claim_next``) and
    ``batch`` (a :class:`~asynccoord.node.batch.LocklessBatch` per claim: no lock, no
    commit-and-continue). A test that takes it runs once per way, and fails if its nodes
    did not take the way it names (a test with a ``lock_key`` always takes ``slots``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from asynccoord.node.batch import LocklessBatch


@pytest.fixture(params=["slots", "batch"])
def pipeline(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    batches: list[LocklessBatch] = []
    run = LocklessBatch.run

    async def counted(self: LocklessBatch) -> None:
        batches.append(self)
        await run(self)

    monkeypatch.setattr(LocklessBatch, "run", counted)
    yield {"claim_next": False} if request.param == "batch" else {}
    assert bool(batches) == (request.param == "batch"), f"the nodes took the other way than {request.param!r}"
