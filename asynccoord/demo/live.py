"""The demo's live view: a progress bar and a table of the nodes, redrawn until the queue drains.

Each node id's row covers the whole run: a process killed with SIGKILL and started again
keeps its node ids, and its rows add the killed run's last reported counts to the new run's.
Once the workers have stopped (each writes its final counts) the demo prints the table
again with a total row, and a note for what the total misses of the tasks done
(:func:`table_note`).

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
        try:
            while time.monotonic() < deadline:
                progress.update(bar, completed=run.done, enqueued=run.enqueued)
                if live is not None:
                    live.update(Group(progress, caption, node_table(read_states(workers), workers=workers)))
                if run.enqueued >= total and run.done >= total:
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
        finally:
            if live is not None:  # the last frame is the bar alone: the demo prints the table once the workers stop
                progress.update(bar, completed=run.done, enqueued=run.enqueued)
                # Off a terminal the frame ends without its line break (a terminal's Live adds one at its stop).
                live.update(progress if live.console.is_terminal else Group(progress, Text("")))
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


def node_table(
    nodes: list[dict[str, Any]],
    *,
    workers: list[Worker] | None = None,
    done: int | None = None,
    done_at_claim: int = 0,
) -> Table:
    """A table of ``nodes`` (as :func:`~asynccoord.demo.processes.read_states` returns them); stalled rows in yellow.

    A total row follows the nodes, and under it a note (see :func:`table_note`) given the
    worker slots ``workers``, and at the end of the run ``done``, the tasks done, and
    ``done_at_claim``, those of them done at their claim without a send.
    """
    table = Table(title="nodes", expand=False, show_edge=False, caption_justify="left")
    # "sends": the node's send calls that returned, a repeat after a fault included; the report's
    # "sent" counts each message once.
    for column in ("node", "proc", "claimed", "sends", "committed", "in flight", "conflicts", "partitions"):
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
    if nodes:
        summed = ("claimed", "sent", "committed", "in_flight", "conflicts")
        sums = {key: sum(int(n[key]) for n in nodes) for key in summed}
        table.add_section()
        table.add_row("total", "", *(str(sums[key]) for key in summed), "")
        table.caption = table_note(sums["committed"], workers or [], done, done_at_claim) or None
    return table


def table_note(committed: int, workers: list[Worker], done: int | None, done_at_claim: int = 0) -> str:
    """The note under the node table: which rows hold a killed process's counts, and why the total may fall short.

    A killed process's counts are those of its last status report (every 0.25 s), added to
    its slot's rows; what it committed after that report is lost with it. A task done at
    its claim as already processed (its message enqueued twice) counts in no row.

    Args:
        committed: The committed column's total.
        workers: The worker slots (:attr:`~asynccoord.demo.processes.Worker.killed`).
        done: The tasks done at the end of the run; None while it runs (no comparison).
        done_at_claim: Of ``done``, those done at their claim (``duplicate_delivery_suppressed``).

    Returns:
        One line per thing to say, or ``""``.
    """
    killed = [w for w in workers if w.killed]
    lines = [
        f"proc {w.index}: its rows add the counts its killed run (SIGKILL) last reported, up to 0.25 s before it died"
        for w in killed
    ]
    if done is not None and committed != done:
        missing = done - committed
        why = []
        if done_at_claim:
            why.append(f"{min(done_at_claim, missing)} done at their claim as already processed (no send)")
        rest = missing - min(done_at_claim, missing)
        if rest and killed:
            procs = " and ".join(f"proc {w.index}" for w in killed)
            why.append(f"{rest} committed by {procs} after its last report, lost with the kill")
        elif rest:
            why.append(f"{rest} in no row")
        lines.append(f"committed adds to {committed} of the {done} tasks done: " + "; ".join(why))
    return "\n".join(lines)
