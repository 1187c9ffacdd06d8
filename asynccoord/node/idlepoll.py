"""The runtime's idle poll: one read per process, whatever its node count, instead of a claim per idle node.

Some work nobody in the process announces (tasks enqueued by another process, expired
leases of crashed nodes, retries and delayed tasks falling due), and finding it by
claiming from every idle node costs a write per node. An :class:`IdlePoller` finds it for
all the idle nodes of a :class:`~asynccoord.node.runtime.Runtime` with one read per poll,
on the backoff a standalone node would have, and wakes only the owners of the partitions
that read names.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import anyio

from .._printable import shown
from ..errors import UNRECOVERABLE_STORE_ERRORS, StoreError
from .ablation import FULL, Ablation
from .config import NodeConfig

if TYPE_CHECKING:
    from ..membership import Membership
    from .node import Node

__all__ = ("IdlePoller",)

log = logging.getLogger(__name__)


class IdlePoller:
    """Finds work for the idle nodes of one process with one store read per poll.

    A node whose claim came back short or empty waits for a wake-up: an in-process
    enqueue or a commit that frees one of its keys (the store's
    :class:`~asynccoord.notify.WorkNotifier`), or a task it put back falling due. The
    poller finds the rest: it asks the store with one read
    (:meth:`~asynccoord.contract.queue.QueueStore.claimable_partitions`) which partitions
    of the idle nodes hold claimable work, and wakes only the idle nodes owning one of them
    (a node claiming from every partition is woken for any, one per partition named).
    With work stealing on, nodes left idle are also woken, one per partition named, when a
    second read finds work due for ``steal_after_s`` anywhere. So idle nodes cost no
    writes, and on SQLite the single writer is left to the commits.

    Cadence: a poll every ``idle_min_s`` .. ``idle_s`` seconds (full jitter). ``idle_s``
    goes back to ``idle_min_s`` while no node is idle or once nodes a poll woke have claimed
    something, stays as it is after a poll that woke nodes, and doubles up to
    ``idle_max_s`` otherwise (a poll that woke nobody, or whose woken nodes all came back
    empty-handed, so a read that names work a claim cannot take never makes a busy loop).
    No idle node, no read. So work from elsewhere is found within about ``idle_max_s``,
    and the process's idle cost is at most one read (two with work stealing) per poll. The
    nodes still claim by themselves every ``NodeConfig.idle_fallback_s`` (a safety net).

    Args:
        store: The nodes' store; it must have ``claimable_partitions``.
        nodes: The nodes to wake (read at every poll: a list changed later is seen).
        config: The nodes' :class:`~asynccoord.node.config.NodeConfig` (queue, order, backoff,
            work stealing).
        membership: The process's membership; while it is unhealthy the nodes claim
            nothing, so nothing is polled. Default None.
        _ablation: The nodes' layers, for benchmarks only (see :mod:`asynccoord.node.ablation`):
            nodes without version checks claim any pending task, heads of conversations or
            not, and so does the poll. Default: every layer on.

    Attributes:
        polls: Reads issued so far (``claimable_partitions`` calls).
        woken: Nodes woken so far.
    """

    def __init__(
        self,
        store: Any,
        nodes: Sequence[Node],
        config: NodeConfig,
        *,
        membership: Membership | None = None,
        _ablation: Ablation = FULL,
    ) -> None:
        self.store = store
        self.nodes = nodes
        self.config = config
        self.membership = membership
        # An unchecked claim (no version checks) takes any pending task, heads or not.
        self._ordered = config.ordered and _ablation.version_checks
        self.polls = 0
        self.woken = 0
        self._rng = random.Random()
        self._last_woken: list[tuple[Node, int]] = []  # nodes the last poll woke, and their claimed count then

    def __repr__(self) -> str:
        return f"<IdlePoller {self.config.queue!r} nodes={len(self.nodes)} polls={self.polls} woken={self.woken}>"

    async def run(self) -> None:
        """Poll until cancelled; returns once the store is closed (after waking every idle node to find out).

        Store errors other than closing are logged and the poll goes on.
        """
        cfg = self.config
        idle_s = cfg.idle_min_s
        while True:
            await anyio.sleep(self._rng.uniform(cfg.idle_min_s, idle_s))
            earlier = self._last_woken
            productive = any(node.state().claimed > claimed for node, claimed in earlier)
            idle = any(node.idle for node in self.nodes)
            try:
                woken = await self.poll()
            except UNRECOVERABLE_STORE_ERRORS:
                for node in self.nodes:  # they fail on their next claim, as they would have
                    node.wake()
                return
            except StoreError as exc:
                log.warning("asynccoord.idlepoll.failed queue=%s error=%s", cfg.queue, shown(exc))
                woken = 0
            if productive or not idle:
                idle_s = cfg.idle_min_s
            elif not woken or earlier:  # woke nobody, or the last wake-ups found nothing: back off
                idle_s = min(cfg.idle_max_s, idle_s * 2)

    async def poll(self) -> int:
        """One poll: read where the idle nodes' partitions hold claimable work and wake their owners.

        Returns:
            How many nodes were woken.

        Raises:
            StoreClosedError: the store was closed (the read or the membership's heartbeat
                found out).
            StoreError: the read failed.
        """
        cfg = self.config
        self._last_woken = []
        membership = self.membership
        if membership is not None and not membership.healthy:
            error = membership.last_error
            if isinstance(error, UNRECOVERABLE_STORE_ERRORS):  # heartbeats will never resume: let the nodes find out
                raise type(error)(f"the idle poll of queue {cfg.queue!r} stops: {error}") from error
            return 0  # the nodes claim nothing until heartbeats resume
        scopes = [(node, node.claim_partitions()) for node in self.nodes if node.idle]
        if not scopes:
            return 0
        wanted: list[int] | None = []
        union: set[int] = set()
        for _node, parts in scopes:
            if parts is None:
                wanted = None
                break
            union.update(parts)
        if wanted is not None:
            wanted = sorted(union)
        ordered = self._ordered
        found: set[int] = set()
        if wanted is None or wanted:
            self.polls += 1
            found = await self.store.claimable_partitions(cfg.queue, wanted, ordered=ordered)
        woken = 0
        for_any = len(found)  # nodes claiming from every partition: one per partition named
        left: list[Node] = []
        for node, parts in scopes:
            if parts is None:
                hit = for_any > 0
                for_any -= hit
            else:
                hit = not found.isdisjoint(parts)
            if hit:
                woken += self._wake(node)
            elif parts is not None:
                left.append(node)
        if cfg.work_stealing and left:
            self.polls += 1
            stale = await self.store.claimable_partitions(
                cfg.queue, None, ordered=ordered, min_due_age_s=cfg.steal_after_s
            )
            for node in left[: len(stale - found)]:  # partitions found above have their owners woken
                woken += self._wake(node)
        self.woken += woken
        return woken

    def _wake(self, node: Node) -> bool:
        claimed = node.state().claimed
        if not node.wake():
            return False
        self._last_woken.append((node, claimed))
        return True
