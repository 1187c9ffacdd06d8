"""The runtime's retention: done tasks and processed-message records are purged as they age.

Every commit leaves a ``done`` row and a processed-message record behind, so a store that
nobody purges grows without bound, and the reads over it (``stats``, ``status``) slow
with it. A :class:`Retention` runs in each :class:`~asynccoord.node.runtime.Runtime`: every
``interval_s`` (with jitter, so processes started together do not purge together) it
deletes its queue's done tasks older than ``done_retention_s`` and the store's processed
records older than their retention (``StoreConfig.processed``), each in the store's
bounded batches, so a purge never holds the write lock for long. Dead tasks are never
purged: they wait for a person. Purging done tasks does not weaken deduplication: a
redelivered message is still recognised by its processed record, which outlives the task.
Several processes purging the same rows is harmless (a delete finds them gone).
"""

from __future__ import annotations

import logging
import random
from typing import Any

import anyio

from .._errtext import error_text
from .._printable import printable
from ..errors import UNRECOVERABLE_STORE_ERRORS, StoreError
from ..validation import check_interval_s, check_positive

__all__ = ("DEFAULT_DONE_RETENTION_S", "DEFAULT_PURGE_INTERVAL_S", "Retention")

log = logging.getLogger(__name__)

DEFAULT_DONE_RETENTION_S = 24 * 3600.0
"""How long a done task is kept by default: a day, for ``status`` and for looking a send up."""

DEFAULT_PURGE_INTERVAL_S = 60.0
"""Mean seconds between two purges of one runtime."""


def check_done_retention_s(value: object) -> float | None:
    """Check ``done_retention_s``: None (keep done tasks) or a duration in (0, one year]."""
    return None if value is None else check_positive("done_retention_s", value)


class Retention:
    """Purges one queue's aged done tasks and the store's aged processed records, periodically.

    Args:
        store: The queue store (``purge_finished`` and ``purge_processed``).
        queue: The queue whose done tasks are purged.
        done_retention_s: Age past which a done task is deleted, by the store clock, seconds;
            None keeps done tasks (the processed records are still purged).
        interval_s: Mean seconds between purges (each wait is drawn from 0.5x to 1.5x of it;
            the first from 0 to 1x).

    Attributes:
        purges: Purge rounds completed.
        tasks_deleted / records_deleted: Done tasks and processed records deleted so far.
    """

    def __init__(self, store: Any, queue: str, *, done_retention_s: float | None, interval_s: float) -> None:
        self.store = store
        self.queue = queue
        self.done_retention_s = check_done_retention_s(done_retention_s)
        self.interval_s = check_interval_s("purge_interval_s", interval_s)
        self.purges = 0
        self.tasks_deleted = 0
        self.records_deleted = 0
        self._rng = random.Random()

    async def purge_once(self) -> None:
        """One round: the queue's done tasks past the retention, then the processed records past theirs."""
        tasks = 0
        if self.done_retention_s is not None:
            tasks = (await self.store.purge_finished(self.queue, older_than_s=self.done_retention_s)).deleted
        records = (await self.store.purge_processed()).deleted
        self.tasks_deleted += tasks
        self.records_deleted += records
        self.purges += 1
        if tasks or records:
            log.info("asynccoord.retention.purged queue=%s done=%d processed=%d", self.queue, tasks, records)

    async def run(self) -> None:
        """Purge every ``interval_s`` (jittered) until cancelled.

        A failed round (a busy or unreachable store) is logged and tried again at the next
        interval; a store that will never accept writes again ends the loop quietly (the
        nodes report it).
        """
        delay = self._rng.uniform(0.0, 1.0) * self.interval_s
        while True:
            await anyio.sleep(delay)
            delay = self._rng.uniform(0.5, 1.5) * self.interval_s
            try:
                await self.purge_once()
            except UNRECOVERABLE_STORE_ERRORS as exc:
                log.info("asynccoord.retention.stopped queue=%s error=%s", self.queue, printable(error_text(exc)))
                return
            except StoreError as exc:
                log.warning(
                    "asynccoord.retention.purge_failed queue=%s error=%s", self.queue, printable(error_text(exc))
                )
