"""The demo's live view: a progress bar and a table of the nodes, redrawn until the queue drains.

With ``--dashboard`` the demo also serves ``python -m asynccoord dashboard`` of its store
(:func:`demo_dashboard`), the same live page an operator opens on a running cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from .options import DemoOptions
from .processes import Worker, read_states
from .record import RunRecord

__all__ = (
    "demo_dashboard",
    "node_table",
    "watch",
)


async def watch(
    store: Any,
    workers: list[Worker],
    total: int,
    opts: DemoOptions,
    run: RunRecord,
    console: Console | None,
    note: str = "",
) -> bool:
    """Wait until every message is done or dead, showing the live view.

    Gives up (returns False, with the reason in ``run.gave_up``) when a worker crashed,
    when nothing moved for ``opts.stuck_s``, or after ``opts.timeout_s``. ``note`` is
    shown dimmed under the progress bar (what the latency figure measures) while the run goes on.
    """
    deadline = time.monotonic() + opts.timeout_s
    seen = (run.done, run.enqueued)
    moved_at = time.monotonic()
    progress = Progress(
        TextColumn("[bold]messages"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("enqueued {task.fields[enqueued]}"),
        TimeElapsedColumn(),
    )
    bar = progress.add_task("drain", total=total, enqueued=0)
    caption = Text(note, style="dim")
    live = (
        Live(Group(progress, caption, node_table([])), console=console, refresh_per_second=4, transient=False)
        if console is not None
        else None
    )
    with live if live is not None else contextlib.nullcontext():
        while time.monotonic() < deadline:
            progress.update(bar, completed=run.done, enqueued=run.enqueued)
            if live is not None:
                live.update(Group(progress, caption, node_table(read_states(workers))))
            if run.enqueued >= total and run.done >= total:
                if live is not None:  # the last frame without the caption: the report says it again
                    live.update(Group(progress, node_table(read_states(workers))))
                return True
            for w in workers:
                if w.process is not None and w.process.poll() not in (None, -signal.SIGKILL):
                    run.gave_up = f"worker {w.index} exited {w.process.returncode}"
                    return False  # a worker crashed: stop and report
            now = time.monotonic()
            if (run.done, run.enqueued) != seen:
                seen, moved_at = (run.done, run.enqueued), now
            elif now - moved_at > opts.stuck_s:
                run.gave_up = f"no progress for {opts.stuck_s:g} s ({run.done} of {total} done or dead)"
                return False
            await asyncio.sleep(0.1)
    run.gave_up = f"not finished after {opts.timeout_s:g} s ({run.done} of {total} done or dead)"
    return False


@contextlib.asynccontextmanager
async def demo_dashboard(store_target: str, opts: DemoOptions) -> AsyncIterator[None]:
    """Serve ``python -m asynccoord dashboard`` of the demo's store on ``opts.dashboard``; print its URL.

    Args:
        store_target: The store the demo runs on (SQLite file or PostgreSQL DSN).
        opts: The run's options: ``dashboard`` is the port (0 for any free one), and the
            schema and Redis lock store are shown as the run uses them.

    Raises:
        StoreError: the extra ``dashboard`` is not installed (see
            :func:`~asynccoord.cli.dashboard.open_dashboard`).
        OSError: the port cannot be bound.
    """
    from ..cli.dashboard import open_dashboard

    assert opts.dashboard is not None
    async with open_dashboard(
        store_target,
        schema=opts.schema if opts.postgres else None,
        lock_store=opts.lock_store,
        lock_prefix=opts.lock_prefix or "asynccoord:",
        port=opts.dashboard,
        interval_s=0.5,
    ) as dashboard:
        print(f"asynccoord.demo: dashboard at {dashboard.url}", file=sys.stderr, flush=True)
        yield


def node_table(nodes: list[dict[str, Any]]) -> Table:
    """A table of ``nodes`` (as :func:`~asynccoord.demo.processes.read_states` returns them); stalled rows in yellow."""
    table = Table(title="nodes", expand=False, show_edge=False)
    for column in ("node", "proc", "claimed", "sent", "committed", "in flight", "conflicts", "partitions"):
        table.add_column(column, justify="right" if column not in ("node",) else "left")
    for n in sorted(nodes, key=lambda n: n["node_id"]):
        style = "yellow" if n.get("stalled") else None
        table.add_row(
            n["node_id"],
            str(n["process"]),
            str(n["claimed"]),
            str(n["sent"]),
            str(n["committed"]),
            str(n["in_flight"]),
            str(n["conflicts"]),
            str(n["owned_partitions"]),
            style=style,
        )
    return table
