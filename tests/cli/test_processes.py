"""How ``status`` joins nodes to the processes that report, and judges each process live or gone."""

from __future__ import annotations

from typing import Any

from asynccoord.cli.processes import attach_processes, silence_allowed_s


def process(pid_id: str, pid: int, age_s: float, *, host: str = "box", **info: Any) -> dict[str, Any]:
    return {
        "process_id": pid_id,
        "info": {"host": host, "pid": pid, **info},
        "first_flush_at": 0.0,
        "last_flush_at": 100.0 - age_s,
        "last_flush_age_s": age_s,
    }


def node(node_id: str, **info: Any) -> dict[str, Any]:
    return {"node_id": node_id, "incarnation": "i", "heartbeat_age_s": 0.1, "partitions": 1, "info": info}


def test_a_node_belongs_to_the_process_named_by_its_runtime_else_to_its_host_and_pid() -> None:
    processes = [
        process("box-7-aaaaaa", 7, 1.0, keepalive_s=4.0),  # `run`: the monitor has the runtime's id
        process("box-8-mon", 8, 1.0, keepalive_s=4.0),  # a Monitor of its own id beside a Runtime
        process("box-9-old", 9, 5000.0),  # a process gone long ago whose pid came back...
        process("box-9-new", 9, 2.0),  # ...for this one
        process("other-8-x", 8, 1.0, host="other"),  # the same pid on another machine
    ]
    nodes = [
        node("box-7-aaaaaa-0", runtime="box-7-aaaaaa", host="box", pid=7),
        node("box-8-bbbbbb-0", runtime="box-8-bbbbbb", host="box", pid=8),
        node("box-9-cccccc-0", pid=9),  # an older runtime's node: no host, its id says it
        node("custom", pid=9),  # no host, an id that says nothing: no process claimed
        node("elsewhere-0", runtime="x", host="nowhere", pid=7),
    ]
    joined, joined_nodes = attach_processes(processes, nodes)
    assert [n["process_id"] for n in joined_nodes] == ["box-7-aaaaaa", "box-8-mon", "box-9-new", None, None]
    assert [(p["process_id"], p["nodes"]) for p in joined] == [
        ("box-7-aaaaaa", 1),
        ("box-8-mon", 1),
        ("box-9-old", 0),
        ("box-9-new", 1),
        ("other-8-x", 0),
    ]
    assert processes[0].keys() == {"process_id", "info", "first_flush_at", "last_flush_at", "last_flush_age_s"}


def test_a_process_is_live_by_its_nodes_or_its_monitor_and_gone_when_both_are_silent() -> None:
    run = {"keepalive_s": 4.0, "nodes": 2}  # a `run` process of 2 nodes: gone after 8 s of silence
    processes = [
        process("with-nodes", 1, 30.0, **run),  # silent monitor, live nodes: live
        process("nodes-expired", 2, 3.0, **run),  # writes, but its nodes' heartbeats lapsed
        process("killed", 3, 8.5, **run),
        process("silent-past-its-keepalive", 8, 5.1, **run),  # writes every 4 s at most: not writing
        process("shut-down", 9, 0.5, stopped=True, **run),  # its last flush said it stopped
        process("shut-down-monitor-only", 10, 0.5, stopped=True, keepalive_s=4.0),
        process("monitor-only", 4, 7.9, keepalive_s=4.0),  # hosts no nodes: its writes alone count
        process("monitor-gone", 5, 8.1, keepalive_s=4.0),
        process("no-keepalive", 6, 59.0),  # a monitor that records none: 60 s
        process("no-keepalive-gone", 7, 61.0),
    ]
    joined, _ = attach_processes(processes, [node("with-nodes-0", runtime="with-nodes", host="box", pid=1)])
    assert {p["process_id"]: p["state"] for p in joined} == {
        "with-nodes": "live",
        "nodes-expired": "no_live_node",
        "killed": "gone",
        "silent-past-its-keepalive": "gone",
        "shut-down": "gone",
        "shut-down-monitor-only": "gone",
        "monitor-only": "live",
        "monitor-gone": "gone",
        "no-keepalive": "live",
        "no-keepalive-gone": "gone",
    }
    assert silence_allowed_s({"keepalive_s": 4.0}) == 8.0
    for bad in (0, -1, float("nan"), float("inf"), True, "4"):
        assert silence_allowed_s({"keepalive_s": bad}) == 60.0
