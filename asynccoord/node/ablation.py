"""Switches that turn one layer of the pipeline off, to measure what it buys: for benchmarks only.

A node has three layers that keep a task from being sent twice or out of order:
partitioning (a conversation's tasks go to the node owning its partition), locks (a
task takes the lock ``lock_key`` names) and version checks (claims and commits are
compare-and-sets). The benchmarks (``benchmarks/contention.py``) and the tests that prove
each layer matters switch them off one by one. They are not part of the public
:class:`~asynccoord.node.config.NodeConfig`: a node without them loses the guarantees the
package is for. They reach a node as the keyword-only private argument
``Node(..., _ablation=Ablation(...))`` or ``Runtime(..., _ablation=Ablation(...))``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..validation import check_bool

__all__ = ("FULL", "Ablation")


@dataclass(frozen=True, slots=True, kw_only=True)
class Ablation:
    """Which layers of the pipeline run (all of them by default).

    Args:
        partitioning: Claim only from the partitions the node owns (with a membership).
            Off: every node claims from every partition. Default True.
        locks: Take the lock ``lock_key(task)`` names around the send. Off: no lock is
            taken, whatever ``lock_key`` says. Default True.
        version_checks: Claim and commit with compare-and-set on ``(id, lease_token,
            version)``. Off: the node claims and commits without it (a read, then
            unconditional writes, ``unchecked_claim`` / ``unchecked_complete``), as a naive
            queue does, and takes any pending task, heads of conversations or not.
            Default True.

    Raises:
        InvalidTypeError: a switch is not a bool.
    """

    partitioning: bool = True
    locks: bool = True
    version_checks: bool = True

    def __post_init__(self) -> None:
        for name in ("partitioning", "locks", "version_checks"):
            check_bool(name, getattr(self, name))


FULL = Ablation()
"""Every layer on: what every node runs unless a benchmark says otherwise."""
