"""The help text of the commands' ``--db`` option: what a target is, and how an SQLite URL reads its path."""

from __future__ import annotations

__all__ = ("target_help",)


def target_help(note: str = "") -> str:
    """``--db``'s help: an SQLite file, an ``sqlite:///`` URL (read as SQLAlchemy does) or a DSN; ``note`` ends it."""
    text = (
        "the SQLite database file, sqlite:///PATH (PATH relative to the current folder; sqlite:////PATH for an "
        "absolute one), or a postgresql:// DSN"
    )
    return f"{text} ({note})" if note else text
