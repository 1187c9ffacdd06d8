"""The demo's worker processes: start one, stop them all, read their status files.

Each worker is ``python -m asynccoord.demo.worker`` in an OS process of its own, its
stderr in a log file (never a pipe nobody drains). Stopping is SIGTERM, a wait, then
SIGKILL for stragglers; a worker still starting is signalled only once its ready file
says SIGTERM no longer kills it outright.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .options import DemoOptions
from .ratelimits import provider_limits

__all__ = (
    "SUMMED",
    "Worker",
    "read_states",
    "spawn",
    "stop_workers",
)


SUMMED = ("claimed", "sent", "committed", "conflicts")
"""The node counters that add up over a slot's incarnations (in flight and partitions are the live one's)."""


@dataclass(slots=True)
class Worker:
    """One worker process slot: its files, and the process now running in it (None before the first start)."""

    index: int
    prefix: str
    status_file: Path
    log_file: Path
    process: subprocess.Popen[bytes] | None = None
    incarnations: int = 0
    earlier: dict[str, dict[str, int]] = field(default_factory=dict)
    """Node id -> the counters (:data:`SUMMED`) of this slot's killed incarnations, as each last reported them."""
    killed: int = 0
    """Incarnations of this slot killed (their counters in :attr:`earlier`)."""

    def keep_counts(self) -> None:
        """Add the counters of the incarnation just killed to :attr:`earlier`, and remove its status file.

        Call it once the process has ended and before the next incarnation starts: its status
        file is then its last report (written every 0.25 s, so counts of its last moments may be
        missing), and removing it keeps those counts from being read twice as the next one's.
        """
        for node in read_states([self], with_earlier=False):
            kept = self.earlier.setdefault(node["node_id"], dict.fromkeys(SUMMED, 0))
            for key in SUMMED:
                kept[key] += int(node.get(key, 0))
        self.killed += 1
        self.status_file.unlink(missing_ok=True)

    @property
    def ready_file(self) -> Path:
        """Created by the worker once SIGTERM and SIGUSR1 no longer kill it (removed at each spawn)."""
        return self.status_file.with_suffix(".ready")

    def ready(self) -> bool:
        return self.ready_file.exists()


def spawn(worker: Worker, opts: DemoOptions, store: str, gateway: Path) -> None:
    """Start a new incarnation of ``worker`` on ``store``, sending through the gateway file ``gateway``."""
    worker.incarnations += 1
    command = [
        sys.executable,
        "-m",
        "asynccoord.demo.worker",
        "--store",
        store,
        "--gateway",
        str(gateway),
        "--status-file",
        str(worker.status_file),
        "--status-interval-s",
        "0" if opts.as_json else "0.25",  # only the live view reads the status files
        "--ready-file",
        str(worker.ready_file),
        "--prefix",
        worker.prefix,
        "--parent-pid",
        str(os.getpid()),
        "--nodes",
        str(opts.nodes),
        "--seed",
        str(opts.seed * 1000 + worker.index * 10 + worker.incarnations),
        "--lease-s",
        str(opts.lease_s),
        "--lock-ttl-s",
        str(opts.lock_ttl_s),
        "--lock-wait-s",
        str(opts.lock_wait_s),
        "--max-in-flight",
        str(opts.max_in_flight),
        "--claim-batch",
        str(opts.claim_batch),
        "--idle-max-s",
        str(opts.idle_max_s),
        "--monitor-flush-s",
        str(opts.monitor_flush_s),
        "--heartbeat-ttl-s",
        str(opts.heartbeat_ttl_s),
        "--stall-s",
        str(opts.stall_s),
        "--latency-median-ms",
        str(opts.latency_median_ms),
        "--latency-sigma",
        str(opts.latency_sigma),
    ]
    limits = [[x.dimension, x.count, x.per_s, x.burst] for x in provider_limits(opts.rate_scale)]
    command += ["--provider-limits", json.dumps(limits)]
    if opts.postgres:
        command += ["--schema", opts.schema]
    if opts.lock_store is not None and opts.lock_prefix is not None:
        command += ["--lock-store", opts.lock_store, "--lock-prefix", opts.lock_prefix]
    # stderr goes to a file (never a pipe nobody drains while the worker runs: a full pipe
    # would block the worker's event loop on its next log line).
    worker.ready_file.unlink(missing_ok=True)
    with open(worker.log_file, "ab") as log_file:
        worker.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log_file)


def stop_workers(workers: Sequence[Worker], timeout_s: float) -> list[str]:
    """SIGTERM every worker, wait, SIGKILL stragglers; return their stderr tails on failure.

    A worker still starting (no ready file yet: a replacement spawned late, say) is
    signalled once it is ready, within the deadline: before that, SIGTERM would kill it.
    """
    problems: list[str] = []
    deadline = time.monotonic() + timeout_s
    starting = [(w, w.process) for w in workers if w.process is not None and w.process.poll() is None]
    while starting and time.monotonic() < deadline:
        for w, process in [(w, p) for w, p in starting if w.ready() or p.poll() is not None]:
            starting.remove((w, process))
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        if starting:
            time.sleep(0.02)
    for w in workers:
        if w.process is None:
            continue
        try:
            w.process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            w.process.kill()
            w.process.wait()
            problems.append(f"worker {w.index} did not stop in time")
        if w.process.returncode not in (0, -signal.SIGKILL):
            problems.append(f"worker {w.index} exited {w.process.returncode}: {_tail(w.log_file)}")
    return problems


def _tail(path: Path, size: int = 2000) -> str:
    try:
        return path.read_bytes()[-size:].decode(errors="replace")
    except OSError:
        return ""


def read_states(workers: Sequence[Worker], *, with_earlier: bool = True) -> list[dict[str, Any]]:
    """The nodes of every worker, as its status file last showed them (unreadable files are skipped).

    ``with_earlier``: the :data:`SUMMED` counters of a slot's killed incarnations are added to
    its nodes' (a node of theirs not reporting yet is a row of its own, with nothing in flight),
    so that the rows cover the whole run.
    """
    nodes: list[dict[str, Any]] = []
    for w in workers:
        rows: dict[str, dict[str, Any]] = {}
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(w.status_file.read_text())
            for n in data.get("nodes", []):
                n["process"] = w.index
                n["stalled"] = data.get("stalled", False)
                rows[n["node_id"]] = n
        if with_earlier:
            for node_id, kept in w.earlier.items():
                row = rows.setdefault(
                    node_id,
                    {"node_id": node_id, "process": w.index, "stalled": False, "in_flight": 0, "owned_partitions": 0}
                    | dict.fromkeys(SUMMED, 0),
                )
                for key in SUMMED:
                    row[key] = int(row.get(key, 0)) + kept[key]
        nodes.extend(rows.values())
    return nodes
