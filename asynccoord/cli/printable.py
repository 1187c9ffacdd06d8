"""Terminal-safe text: what the CLI prints from the database, with control characters escaped.

Task errors, lock names and holders come from the database, and a send's error text can
carry what a provider answered. Printed as they are, an ANSI escape sequence among them
would move the cursor, clear the screen or retitle the window of the operator's terminal
(CWE-150). Rich's markup is already off for such values; this escapes the characters
themselves: the C0 and C1 control characters and DEL (Unicode category ``Cc``), the line
and paragraph separators (which break a table's row), the zero-width space and byte-order
mark (the joiners that scripts and emoji need stay), and the bidirectional marks, overrides
and isolates that can make text read differently from what it is (CVE-2021-42574, "Trojan
Source"), each as its Python escape (``\\x1b``, ``\\u202e``).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ("printable", "printable_report")

_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b\u200e\u200f\u2028-\u202e\u2066-\u2069\ufeff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with each control or bidirectional-override character replaced by its escape."""
    return _UNSAFE.sub(_escape, text)


def printable_report(value: Any) -> Any:
    """A copy of a report (dicts, lists and tuples of values) with every string made :func:`printable`."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable_report(k): printable_report(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(printable_report(v) for v in value)
    return value
