"""The lines ``python -m asynccoord run`` prints on standard output, besides its start line.

Each is one line in the start line's style (``asynccoord: 2 nodes draining 'outbox' of
bot.db``): where the locks live when they are not in the database, and how the nodes
stopped at a graceful stop. What went wrong goes to standard error and the log instead.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable
from typing import Any

from ..backends.open import redact_target
from ..node.status import NodeState

__all__ = ("lock_store_line", "stopped_line")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def lock_store_line(lock_store: Any) -> str:
    """``asynccoord: locks in redis://host:6379/0 under prefix 'asynccoord:'`` (the password hidden), newline-ended."""
    url = getattr(lock_store, "url", None)
    where = type(lock_store).__name__ if url is None else redact_target(str(url))
    prefix = getattr(lock_store, "prefix", None)
    return f"asynccoord: locks in {where}" + ("" if prefix is None else f" under prefix {prefix!r}") + "\n"


def stopped_line(signum: int, states: Iterable[NodeState], *, handed_back_before: int = 0) -> str:
    """``asynccoord: 2 nodes stopped on SIGTERM: 5 tasks committed, 1 handed back at the stop``, newline-ended.

    The tasks handed back at the stop are those the nodes gave back once the stop began
    (sends cut at the shutdown, tasks claimed but not sent): they are pending, for another
    process or the next run. Tasks put back before it, while the nodes ran (a lock that
    stayed busy, ``busy_requeue_s``; a rate-limit pause) were due again soon after and
    say nothing about what is left: when there were any, their count follows in
    parentheses, ``(10 put back earlier, while running)``.

    Args:
        signum: The signal that stopped the run (a number that names no signal prints as such).
        states: The nodes' counters once they stopped (``Runtime.states()``).
        handed_back_before: The nodes' ``handed_back`` summed when the stop began. Default 0.
    """
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    nodes = list(states)
    committed = sum(state.committed for state in nodes)
    at_stop = max(0, sum(state.handed_back for state in nodes) - handed_back_before)
    earlier = f" ({handed_back_before} put back earlier, while running)" if handed_back_before else ""
    return (
        f"asynccoord: {_plural(len(nodes), 'node')} stopped on {name}:"
        f" {_plural(committed, 'task')} committed, {at_stop} handed back at the stop{earlier}\n"
    )
