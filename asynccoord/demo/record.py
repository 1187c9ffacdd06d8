"""What the demo's orchestrator records while it runs (faults, alerts, progress), for the report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ("RunRecord",)


@dataclass(slots=True)
class RunRecord:
    """The orchestrator's record of one run, filled in as it goes and read by the report."""

    faults: list[dict[str, Any]] = field(default_factory=list)
    alerts: list[dict[str, Any]] = field(default_factory=list)
    enqueued: int = 0
    total: int = 0
    started: float = 0.0
    done: int = 0  # done and dead tasks, as of the last progress poll
    polls: int = 0
    poll_s: float = 0.0  # time spent counting
    gave_up: str | None = None  # why the run stopped before every message was done or dead
    lock_store_keys: int | None = None  # with --lock-store: the run's Redis keys found at the end
    lock_sweep_error: str | None = None  # with --lock-store: why they could not be deleted
