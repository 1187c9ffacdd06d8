"""Whether the SQLite file an open store works on is still the one at its path.

A process keeps the file it opened (its inode) for as long as its connection lives: after
``rm bot.db`` (with its ``-wal`` and ``-shm``) or ``mv other.db bot.db`` it goes on reading
and writing a file nobody else can open, while other processes create and fill a new one
at the path. :class:`FileIdentity` remembers the ``(st_dev, st_ino)`` of the path at open
and compares it with the path's now and then: one ``os.stat`` every ``interval_s`` at most,
on the calls the store makes anyway (a running node's heartbeat and idle poll call the store
every second or so), never a task of its own.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from ...errors import StoreFileReplacedError

__all__ = ("CHECK_INTERVAL_S", "FileIdentity", "replaced_message")

CHECK_INTERVAL_S = 2.0
"""Seconds between two looks at the path, at most one ``os.stat`` each."""


def replaced_message(path: str, now: os.stat_result | None) -> str:
    """One line naming ``path`` and what happened to it: deleted (``now`` None) or replaced by another file."""
    what = "was deleted or moved" if now is None else "was replaced by another file (a new inode at the path)"
    return (
        f"the database file {path!r} {what} while this process had it open: its reads and writes no "
        "longer reach the database at that path; close the store and open the path again"
    )


class FileIdentity:
    """The identity of an SQLite file at open, checked against its path every ``interval_s``.

    Args:
        path: The database file (not ``:memory:`` nor a ``file:`` URI).
        interval_s: Least seconds between two looks at the path. Default :data:`CHECK_INTERVAL_S`.
        clock: Monotonic seconds; a test hook. Default ``time.monotonic``.

    Raises:
        OSError: the path cannot be stat'ed at construction (the store has just opened it).
    """

    def __init__(
        self, path: str, *, interval_s: float = CHECK_INTERVAL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        st = os.stat(path)
        self.path = path
        # Looked at by its absolute name, as SQLite opened it: a later os.chdir of the process
        # (a send's, a daemonising library's) must not make a relative path look deleted.
        self._absolute = os.path.abspath(path)
        self.interval_s = interval_s
        self._identity = (st.st_dev, st.st_ino)
        self._clock = clock
        self._next_at = clock() + interval_s
        self._error: str | None = None

    def __repr__(self) -> str:
        state = "gone" if self._error is not None else "same"
        return f"<FileIdentity {self.path!r} dev={self._identity[0]} ino={self._identity[1]} {state}>"

    def check(self) -> None:
        """Raise if the path no longer holds the file opened; look at the path at most every ``interval_s``.

        Once the change is seen, every later call raises again without looking: the store
        cannot return to the file it lost.

        Raises:
            StoreFileReplacedError: the file was deleted, or another file is at the path.
        """
        if self._error is None:
            now = self._clock()
            if now < self._next_at:
                return
            self._next_at = now + self.interval_s
            self._error = self.look()
            if self._error is None:
                return
        raise StoreFileReplacedError(self._error)

    def look(self) -> str | None:
        """Stat the path now: the message when the file opened is no longer there, else None.

        A path that cannot be stat'ed for another reason (a folder made unreadable, say)
        says nothing: the store's own calls report what they meet.
        """
        try:
            st = os.stat(self._absolute)
        except FileNotFoundError:
            return replaced_message(self.path, None)
        except OSError:
            return None
        if (st.st_dev, st.st_ino) != self._identity:
            return replaced_message(self.path, st)
        return None
