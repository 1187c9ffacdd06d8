"""Why this process may not open an SQLite database file, said before SQLite tries.

SQLite answers a file it may not read, or one behind a folder it may not enter, with
"unable to open database file", and a file it may not create with a read-only database.
:func:`access_problem` checks the permission bits first and names the file, the folder
and the fix instead. ``os.access`` answers for the real user id, as the rest of the
store's checks do (root passes every check unless it runs without its capabilities).
"""

from __future__ import annotations

import os

__all__ = ("access_problem", "blocked_folder")


def blocked_folder(path: str) -> str | None:
    """The first folder on the way to ``path`` that this process may not enter, or None.

    Without search permission (``x``) on a folder, nothing inside it can be opened, nor
    even seen to exist: ``os.path.exists`` answers False for a file that is there.
    """
    folder = os.path.dirname(os.path.abspath(path))
    parts = folder.split(os.sep)
    for end in range(2, len(parts) + 1):
        step = os.sep.join(parts[:end]) or os.sep
        if os.path.isdir(step) and not os.access(step, os.X_OK):
            return step
    return None


def access_problem(path: str, *, write: bool) -> str | None:
    """One line saying why this process may not open the database at ``path``, or None.

    Args:
        path: The database file (a path, not ``":memory:"`` nor a ``file:`` URI).
        write: Whether the store writes (and may create) the file; False for a read-only open.

    Returns:
        The message when a folder on the way may not be entered, the file exists but may
        not be read, or (``write``) the file does not exist and its folder may not be
        written; None otherwise (what is left, a file readable but not writable, is for the
        caller to say: it can still be opened read-only).
    """
    how = "for reading and writing" if write else "for reading"
    blocked = blocked_folder(path)
    if blocked is not None:
        return (
            f"cannot open {path!r} {how}: permission denied on the folder {blocked!r} ({_mode(blocked)}), which this "
            "process may not enter: give this user search (x) permission on it, or check the path"
        )
    if os.path.exists(path) and not os.access(path, os.R_OK):
        grant = "read and write" if write else "read"
        return (
            f"cannot open {path!r} {how}: permission denied, this process may not even read the file "
            f"({_mode(path)}): give this user {grant} access to it"
        )
    folder = os.path.dirname(os.path.abspath(path))
    if write and not os.path.exists(path) and os.path.isdir(folder) and not os.access(folder, os.W_OK | os.X_OK):
        return (
            f"cannot create {path!r}: its folder {folder!r} is not writable by this process ({_mode(folder)}): "
            "give this user write access to the folder, or put the database in a folder it can write"
        )
    return None


def _mode(path: str) -> str:
    """``"mode 750, owner uid 0"`` of ``path``; ``"mode unknown"`` when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return "mode unknown"
    return f"mode {st.st_mode & 0o777:03o}, owner uid {st.st_uid}"
