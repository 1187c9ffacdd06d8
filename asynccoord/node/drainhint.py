"""Why a wait for a queue to drain may never end: conversations held behind dead tasks.

With the ``hold`` dead-letter policy (``store.set_dead_letter_policy``) an ordered claim
leaves a conversation whose earliest unfinished task is dead without a head: its later
tasks stay ``pending`` until the dead task is requeued or discarded, so a queue with such
a task never drains. :func:`held_behind_dead` tells, in two reads, whether a queue may be
in that state, for :meth:`~asynccoord.node.runtime.Runtime.wait_until_drained` to say so
when it times out.
"""

from __future__ import annotations

from typing import Any

import anyio

from ..errors import StoreError
from ..models import DeadLetterPolicy, TaskStatus

__all__ = ("HINT_WAIT_S", "held_behind_dead")

HINT_WAIT_S = 1.0
"""Longest wait, seconds, for the store's answers: a slow store gets no hint rather than a late return."""


async def held_behind_dead(store: Any, queue: str) -> tuple[int, int] | None:
    """``(dead, pending)`` task counts of ``queue`` when its ``hold`` policy may hold conversations, else None.

    None also when the store has no dead-letter policy, the policy is ``skip``, the queue
    has no dead or no pending task, or the store failed or took longer than
    :data:`HINT_WAIT_S` to answer (the hint is best-effort; the caller's own polls report
    a store that is down). ``stats`` counts each status in its index (see
    :meth:`~asynccoord.node.runtime.Runtime.wait_until_drained` for its cost).
    """
    policy_of = getattr(store, "dead_letter_policy", None)
    if not callable(policy_of):
        return None
    with anyio.move_on_after(HINT_WAIT_S):
        try:
            if await policy_of(queue) is not DeadLetterPolicy.HOLD:
                return None
            counts = (await store.stats(queue)).counts
        except StoreError:
            return None
        dead, pending = counts.get(TaskStatus.DEAD, 0), counts.get(TaskStatus.PENDING, 0)
        return (dead, pending) if dead and pending else None
    return None
