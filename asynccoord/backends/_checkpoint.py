"""WAL checkpoints for SQLite on a connection of their own, off the writer's commit path.

In WAL mode every commit appends pages to the ``-wal`` file; a *checkpoint* copies them
back into the database file (and, with ``synchronous=NORMAL``, syncs both files to disk).
By default SQLite runs that checkpoint inside the commit that takes the log past
``wal_autocheckpoint`` pages (1,000), so one caller in every few dozen batches waits for
the page copies and two ``fsync`` calls: measured on a 20,000-task drain, commits took
8 to 10 ms at worst with the automatic checkpoint against 1 to 1.5 ms without it, and the
writer spent about 40 % of its commit time checkpointing.

A :class:`WalCheckpointer` runs ``PRAGMA wal_checkpoint(PASSIVE)`` on its own connection
(so its own thread) every ``interval_s`` seconds after the writer committed something.
A passive checkpoint neither waits for nor blocks the writer: the writer keeps appending
to the log while pages already committed are copied back, and SQLite starts the log over
from its beginning at the next write once everything was copied. The writer's own
automatic checkpoint stays on, at a much larger threshold (:data:`SAFETY_NET_PAGES`), only
for the case the background checkpoint cannot keep up (a reader pinning an old snapshot,
say). See https://www.sqlite.org/wal.html#application_initiated_checkpoints and
https://www.sqlite.org/c3ref/wal_checkpoint_v2.html.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import Callable

import aiosqlite

__all__ = ("SAFETY_NET_PAGES", "WalCheckpointer")

log = logging.getLogger(__name__)

SAFETY_NET_PAGES = 10_000
"""``wal_autocheckpoint`` of the writer while a background checkpointer runs (pages; ~40 MB at 4 KiB)."""


class WalCheckpointer:
    """Checkpoints one SQLite file's WAL in the background.

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
        conn = aiosqlite.connect(self.path, isolation_level=None, check_same_thread=False)
        worker = getattr(conn, "_thread", None)
        if worker is not None and not worker.is_alive():
            worker.daemon = True  # as the store's own connection: never keeps the interpreter alive
        await conn
        await conn.execute("PRAGMA busy_timeout = 0")  # a passive checkpoint never waits anyway
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
