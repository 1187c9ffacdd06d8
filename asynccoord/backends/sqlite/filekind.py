"""What kind of file a database path names, when it is no file SQLite can use.

SQLite opens whatever path it is given: a named pipe (FIFO) blocks the open until a
writer comes, for ever when none does, and a device or a socket fails with a bare
"disk I/O error". :func:`not_a_file` names such a path before SQLite sees it.
"""

from __future__ import annotations

import os
import stat

__all__ = ("not_a_file",)

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def not_a_file(path: str) -> str | None:
    """The kind of file ``path`` is when it exists and is no regular file (``"a directory"``, say), else None.

    A symbolic link is followed; a path that does not exist (or cannot be looked at) is None.
    """
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    for test, kind in _KINDS:
        if test(mode):
            return kind
    return None
