"""Terminal-safe reports: what the CLI prints from the database, with control characters escaped.

Task errors, lock names and holders come from the database: ``status``, ``dashboard`` and
``dead`` pass each string they show through :func:`~asynccoord._printable.printable`
(re-exported here), which escapes the control, bidirectional-override and lone surrogate
characters that would otherwise drive the operator's terminal. Rich's markup is already
off for such values; this escapes the characters themselves.
"""

from __future__ import annotations

from typing import Any

from .._printable import printable

__all__ = ("printable", "printable_report")


def printable_report(value: Any) -> Any:
    """A copy of a report (dicts, lists and tuples of values) with every string made :func:`printable`."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable_report(k): printable_report(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(printable_report(v) for v in value)
    return value
