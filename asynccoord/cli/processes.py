"""Which process each live node runs in, and whether each process that reported is still there.

A process shows in the store twice: its monitor's flushes (the process id, and an info
object with ``host``, ``pid`` and ``keepalive_s``) and its nodes' heartbeats (a
:class:`~asynccoord.node.runtime.Runtime`'s nodes carry ``host``, ``pid`` and ``runtime``,
the runtime's id, in their info). :func:`attach_processes` joins the two for the status
report: a node belongs to the process whose id is its ``runtime`` (``python -m asynccoord
run`` gives its monitor the runtime's id), else to the process of the same host and pid.

A process is judged on the store clock only (heartbeat expiries and flush ages are both
the store's), never by comparing the clocks of two machines:

``live``
    Some of its nodes are live; or it hosts no nodes and its monitor wrote within
    :data:`GONE_AFTER_KEEPALIVES` times its ``keepalive_s``.
``no_live_node``
    Its monitor still writes (it wrote within its ``keepalive_s``, and a little more), but
    none of the nodes it hosts (its info's ``nodes``, as ``run`` records it) is live: their
    heartbeats expired, or they have not joined yet.
``gone``
    No live node, and its monitor stopped (its last flush says so: a clean shutdown) or has
    been silent for longer than that: killed or frozen. Its rows stay in the store a day,
    for its counts in the totals.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = (
    "GONE_AFTER_KEEPALIVES",
    "PROCESS_STATES",
    "RECENT_FLUSH_S",
    "WRITING_AFTER_KEEPALIVES",
    "attach_processes",
    "silence_allowed_s",
)

PROCESS_STATES = ("live", "no_live_node", "gone")
"""The states of a process in the status report, from alive to gone."""

GONE_AFTER_KEEPALIVES = 2.0
"""A monitor silent for this many times its ``keepalive_s`` (the longest it goes without a
write while it runs) is gone: twice, so one slow write does not make a process look dead."""

WRITING_AFTER_KEEPALIVES = 1.25
"""A monitor whose last write is at most this many times its ``keepalive_s`` old still writes
(a flush's own time beyond the keepalive allowed for): its process is ``no_live_node``, not ``gone``."""

RECENT_FLUSH_S = 60.0
"""For a monitor that records no ``keepalive_s``: how long after its last flush it counts as live."""


def silence_allowed_s(info: Mapping[str, Any]) -> float:
    """How long, seconds, a process's monitor may be silent before the process counts as gone."""
    keepalive = info.get("keepalive_s")
    if isinstance(keepalive, int | float) and not isinstance(keepalive, bool) and 0 < keepalive < math.inf:
        return GONE_AFTER_KEEPALIVES * float(keepalive)
    return RECENT_FLUSH_S


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _owner(node: Mapping[str, Any], processes: Sequence[Mapping[str, Any]]) -> str | None:
    """The id of the process ``node`` runs in, among ``processes``; None when none reports it."""
    info = node["info"]
    runtime = info.get("runtime")
    if isinstance(runtime, str) and any(p["process_id"] == runtime for p in processes):
        return runtime
    pid = _count(info.get("pid"))
    if pid is None:
        return None
    host = info.get("host")
    same = []
    for p in processes:
        if _count(p["info"].get("pid")) != pid:
            continue
        their_host = p["info"].get("host")
        if not isinstance(their_host, str):
            continue
        if isinstance(host, str):
            if host == their_host:
                same.append(p)
        elif str(node["node_id"]).startswith(f"{their_host[:200]}-{pid}-"):  # an older runtime's node names no host
            same.append(p)
    if not same:
        return None
    newest = min(same, key=lambda p: (p["last_flush_age_s"], p["process_id"]))  # a reused pid: the one heard last
    return str(newest["process_id"])


def attach_processes(
    processes: Sequence[Mapping[str, Any]], nodes: Sequence[Mapping[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The report's processes and nodes, each joined to the other.

    Args:
        processes: The processes that flushed metrics (``process_id``, ``info``,
            ``last_flush_age_s``...), as the store read them.
        nodes: The live nodes (``node_id``, ``info``...).

    Returns:
        ``(processes, nodes)``, copies: each process with ``state`` (one of
        :data:`PROCESS_STATES`) and ``nodes`` (its live nodes); each node with
        ``process_id`` (the process it runs in, or None when no monitor reports for it).
    """
    owners = [_owner(n, processes) for n in nodes]
    joined_nodes = [{**n, "process_id": owner} for n, owner in zip(nodes, owners, strict=True)]
    joined = []
    for p in processes:
        live = sum(1 for owner in owners if owner == p["process_id"])
        hosts = _count(p["info"].get("nodes"))
        silence_s = silence_allowed_s(p["info"])
        stopped = p["info"].get("stopped") is True
        recent = not stopped and p["last_flush_age_s"] <= silence_s
        writing = recent and p["last_flush_age_s"] <= silence_s * WRITING_AFTER_KEEPALIVES / GONE_AFTER_KEEPALIVES
        if live or (recent and not hosts):
            state = "live"
        elif writing:
            state = "no_live_node"
        else:
            state = "gone"
        joined.append({**p, "state": state, "nodes": live})
    return joined, joined_nodes
