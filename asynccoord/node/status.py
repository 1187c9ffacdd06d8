"""Where a node is in its life (:class:`NodeStatus`) and what it has done (:class:`NodeState`, its counters)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ("NodeState", "NodeStatus")


class NodeStatus(enum.StrEnum):
    """Where a node is in its life."""

    STARTING = "starting"
    RUNNING = "running"
    DRAINING = "draining"
    STOPPED = "stopped"
    FAILED = "failed"
    """:meth:`Node.run` ended with an error (e.g. the store was closed under it)."""


@dataclass(slots=True)
class NodeState:
    """Live counters of one node (a snapshot is taken by :meth:`Node.state`)."""

    node_id: str
    status: NodeStatus = NodeStatus.STARTING
    claimed: int = 0
    """Tasks leased to the node: by its claims, and by its commits (see ``continued``)."""
    continued: int = 0
    """Of ``claimed``: tasks leased by the node's commits (``NodeConfig.claim_next``)."""
    sent: int = 0
    committed: int = 0
    failed: int = 0
    handed_back: int = 0
    in_flight: int = 0
    conflicts: int = 0
    owned_partitions: int = 0
