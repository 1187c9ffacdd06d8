"""WAL checkpoints for SQLite on a connection of their own, ahead of the writer's.

In WAL mode every commit appends pages to the ``-wal`` file, and SQLite copies them back
into the database inside the commit that takes the log past ``wal_autocheckpoint`` pages,
so that commit waits for the whole copy. A :class:`WalCheckpointer` runs passive
checkpoints on a connection of its own ahead of it, as SQLite's documentation suggests
for application-initiated checkpoints (https://www.sqlite.org/wal.html).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import Callable

import aiosqlite

from .writer import daemon_connection

__all__ = ("WalCheckpointer",)

log = logging.getLogger(__name__)


class WalCheckpointer:
    """Checkpoints one SQLite file's WAL in the background.

    In WAL mode every commit appends pages to the ``-wal`` file; a *checkpoint* copies them
    back into the database file (and, with ``synchronous=NORMAL``, syncs both files to disk).
    SQLite runs one inside the commit that takes the log past ``wal_autocheckpoint`` pages
    (1,000), so that commit waits for every page copied since the last one.

    A :class:`WalCheckpointer` runs ``PRAGMA wal_checkpoint(PASSIVE)`` on its own connection
    (so its own thread) every ``interval_s`` seconds after the writer committed something. A
    passive checkpoint neither waits for nor blocks the writer: the writer keeps appending
    while pages already committed are copied back. The writer keeps SQLite's automatic
    checkpoint: under a steady stream of writes a passive checkpoint never catches up with
    the end of the log, and only a checkpoint between two of the writer's transactions lets
    SQLite start the log over (a larger automatic threshold let the log grow to 40 MB and
    the commit that finally checkpointed take 40 ms). The one in the commit then finds most
    pages copied already, which shortens the time spent in ``COMMIT`` and the slowest
    commits (see benchmarks/README.md). A commit that passes the threshold while a
    background checkpoint still runs skips its own, so the log can grow a few commits past
    it (a slow disk sync makes that likelier) before it starts over. See
    https://www.sqlite.org/wal.html#application_initiated_checkpoints and
    https://www.sqlite.org/c3ref/wal_checkpoint_v2.html.

    Args:
        path: The database file (not ``:memory:``).
        interval_s: Seconds between checkpoints, taken only if ``committed()`` moved.
        committed: Returns a counter of the writer's commits (checkpoint only after new ones).

    Attributes:
        checkpoints: Checkpoints run so far.
        pages_checkpointed: Log pages copied back by the last checkpoint (``-1`` before any).
    """

    def __init__(self, path: str, *, interval_s: float, committed: Callable[[], int]) -> None:
        self.path = path
        self.interval_s = interval_s
        self._committed = committed
        self._conn: aiosqlite.Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self.checkpoints = 0
        self.pages_checkpointed = -1

    def __repr__(self) -> str:
        return f"<WalCheckpointer {self.path!r} every {self.interval_s}s checkpoints={self.checkpoints}>"

    async def start(self) -> None:
        """Open the checkpoint connection and start checkpointing on the running loop.

        Raises:
            sqlite3.Error: the connection could not be opened.
        """
        conn = daemon_connection(self.path)
        try:
            await conn
            await conn.execute("PRAGMA busy_timeout = 0")  # a passive checkpoint never waits anyway
        except BaseException:
            await asyncio.shield(asyncio.ensure_future(conn.close()))
            raise
        self._conn = conn
        self._task = asyncio.get_running_loop().create_task(self._run(), name="asynccoord-sqlite-checkpoint")

    async def _run(self) -> None:
        seen = self._committed()
        while True:
            await asyncio.sleep(self.interval_s)
            now = self._committed()
            if now != seen:
                seen = now
                await self.checkpoint()

    async def checkpoint(self) -> None:
        """Run one passive checkpoint now (errors are logged, not raised: the next one retries)."""
        conn = self._conn
        if conn is None:
            return
        try:
            cursor = await conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
            row = await cursor.fetchone()
        except sqlite3.Error as exc:
            log.warning("asynccoord.checkpoint.failed path=%s error=%s", self.path, exc)
            return
        self.checkpoints += 1
        if row is not None:
            self.pages_checkpointed = int(row[2])

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The checkpoint task (None before ``start`` and after ``stop``)."""
        return self._task

    @property
    def connection(self) -> aiosqlite.Connection | None:
        """The checkpoint connection (None before ``start`` and after ``stop``)."""
        return self._conn

    async def stop(self) -> None:
        """Stop checkpointing and close the connection. Idempotent."""
        task, conn = self._task, self._conn
        self._task = None
        self._conn = None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])  # (a cancelled caller still sees its own cancellation)
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                await conn.close()
