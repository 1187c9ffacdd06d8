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


def stopped_line(signum: int, states: Iterable[NodeState]) -> str:
    """``asynccoord: 2 nodes stopped on SIGTERM: 5 tasks committed, 1 handed back``, newline-ended.

    Args:
        signum: The signal that stopped the run (a number that names no signal prints as such).
        states: The nodes' counters once they stopped (``Runtime.states()``).
    """
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    nodes = list(states)
    committed = sum(state.committed for state in nodes)
    handed_back = sum(state.handed_back for state in nodes)
    return (
        f"asynccoord: {_plural(len(nodes), 'node')} stopped on {name}:"
        f" {_plural(committed, 'task')} committed, {handed_back} handed back\n"
    )
