"""Terminal-safe text: a user's or a database's text with its control characters escaped.

Task errors, lock names and holders come from the database, and a send's error text can
carry what a provider answered. Printed as they are, an ANSI escape sequence among them
would move the cursor, clear the screen or retitle the window of the operator's terminal
(CWE-150), and a line break would split one log line into two (CWE-117). :func:`printable`
escapes the characters themselves: the C0 and C1 control characters and DEL (Unicode
category ``Cc``), the line and paragraph separators (which break a table's row), the
zero-width space and byte-order mark (the joiners that scripts and emoji need stay), the
bidirectional marks, overrides and isolates that can make text read differently from what
it is (CVE-2021-42574, "Trojan Source"), and lone surrogates (which no UTF-8 stream can
write), each as its Python escape (``\\x1b``, ``\\u202e``, ``\\udc80``).

The command line prints what it reads from the database through it
(:mod:`asynccoord.cli.printable`), and the log lines of the nodes, the monitor and the
command line pass an error text or a user's value through it.
"""

from __future__ import annotations

import re

__all__ = ("printable", "shown")

_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff\ufeff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with each control, bidirectional-override or lone surrogate character replaced by its escape.

    Args:
        text: Any text.

    Returns:
        The text, e.g. ``"a\\\\x0ab"`` for ``"a\\nb"``; ``text`` itself when nothing needed escaping.
    """
    return _UNSAFE.sub(_escape, text)


def shown(value: object) -> str:
    """``str(value)`` made :func:`printable`: a log line's ``%s`` of an exception, a user's value or None."""
    return printable(value if isinstance(value, str) else str(value))
