"""A send's :class:`~asynccoord.errors.RateLimited`: the provider's Retry-After, honoured by every node.

When ``send`` raises :class:`~asynccoord.errors.RateLimited`, the node does not record a
failed attempt. It reports the rate limit to the store
(:meth:`~asynccoord.contract.protocols.RateLimitStore.report_rate_limited`), which in one
transaction pauses the bucket(s) the provider named (or all of the task's) until the
Retry-After has passed, for every process of the database, and hands the task back to
pending with its attempt not counted, in its place in its conversation. The claims of
every node then leave the paused keys' tasks alone and go on with the others; the store's
refill wake-up brings the owner back when the pause ends. A store without rate limits
(a custom store) gets the plain failure path instead.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..errors import LeaseLostError, RateLimited

if TYPE_CHECKING:
    from .node import Node, _InFlight

__all__ = ("report_rate_limited",)

log = logging.getLogger(__name__)


async def report_rate_limited(node: Node, flight: _InFlight, limited: RateLimited) -> None:
    """Report ``limited`` for ``flight``'s task: pause its bucket(s), hand the task back without an attempt.

    A busy or unreachable store is tried again while the lease lasts (as a commit is);
    a lost lease is a conflict and leaves the task alone (the store paused the buckets
    anyway).

    Raises:
        StoreError: the store failed (the caller hands the task back, or fails the node).
    """
    store = node.store
    report = getattr(store, "report_rate_limited", None)
    if report is None or not node.config.version_checks:
        await node._fail(flight, limited)
        return
    task = flight.task
    log.info(
        "asynccoord.node.rate_limited node=%s task=%s retry_after_s=%.3f dimension=%s key=%s",
        node.node_id,
        task.id,
        limited.retry_after_s,
        limited.dimension,
        limited.key,
    )

    async def once() -> None:
        await report(task, limited.retry_after_s, dimension=limited.dimension, key=limited.key)

    try:
        await node._retrying(flight, "rate_limited", once)
    except LeaseLostError as exc:
        node._state.conflicts += 1
        log.warning(
            "asynccoord.node.rate_limited_rejected node=%s task=%s reason=%s", node.node_id, task.id, exc.reason
        )
