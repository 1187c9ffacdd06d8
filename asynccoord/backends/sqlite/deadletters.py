"""Dead-letter policy on SQLite: one row per queue in ``coord_queue_settings``, read by head upkeep.

:class:`SQLiteDeadLetterOps` is a mixin of :class:`~asynccoord.backends.sqlite.store.SQLiteStore`
(``set_dead_letter_policy``, ``dead_letter_policy``, ``dead_letter_policies``; semantics in
:class:`~asynccoord.contract.deadletters.DeadLetterStore`). The policy acts through the
per-key heads an ordered claim reads (``is_head``): every statement of ``queries.sql`` that
marks a head refuses one that a dead task precedes in a ``hold`` queue, in the same write
transaction as the change that would have promoted it, so every process on the file
follows the policy without reading it in its claims. A change of policy, a discard
(``discard_dead``, in :mod:`.queue`) and a requeue recompute the heads of the keys they
touch. Schema: ``migration_0002.sql``; queries: ``sql/deadletters.sql``.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ...contract.deadletters import check_dead_letter_policy
from ...models import DeadLetterPolicy
from ...notify import WorkNotifier
from ...validation import check_name
from ..sqlfiles import load_queries

if TYPE_CHECKING:
    from .writer import Operation

__all__ = ("SQLiteDeadLetterOps", "recompute_heads", "text_keys")

Q = load_queries("sqlite")


def text_keys(keys: Sequence[tuple[Any, Any]]) -> list[tuple[str, str]]:
    """The ``(queue, partition_key)`` of ``keys`` that are both text.

    A key another tool stored as a BLOB, or as bytes that are no UTF-8 (read as bytes, see
    :mod:`.texts`), is no conversation any task of the store belongs to: it has no head to keep.
    """
    return [k for k in keys if k[0].__class__ is str and k[1].__class__ is str]


def recompute_heads(db: sqlite3.Connection, keys: Sequence[tuple[str, str]], ids: Sequence[int] = ()) -> None:
    """Heads of these ``(queue, partition_key)`` from scratch (ordered queues only; held keys get none).

    ``ids``: the task of each key, in the same order, if known: a key that is no text
    (:func:`text_keys`) is then named by its task (``recompute_heads_of_tasks``); else it is left.
    """
    texts = text_keys(keys)
    if texts:
        db.execute(Q["recompute_heads"], {"keys": json.dumps(sorted(set(texts)))})
    if ids and len(texts) < len(keys):
        others = [i for i, k in zip(ids, keys, strict=True) if k[0].__class__ is str and k[1].__class__ is not str]
        if others:
            db.execute(Q["recompute_heads_of_tasks"], {"ids": json.dumps(others)})


class SQLiteDeadLetterOps:
    """The :class:`~asynccoord.contract.deadletters.DeadLetterStore` verbs of the SQLite store.

    A mixin: it relies on the store's ``_write`` (group-committed operation), ``_read`` and ``notifier``.
    """

    notifier: WorkNotifier

    if TYPE_CHECKING:

        async def _write(
            self, fn: Operation[Any], undo: Callable[[Any], Operation[Any] | None] | None = None
        ) -> Any: ...

        async def _read(self, fn: Callable[[sqlite3.Connection], Any]) -> Any: ...

    async def set_dead_letter_policy(self, queue: str, policy: DeadLetterPolicy | str) -> None:
        """Set ``queue``'s dead-letter policy for every process on the file; recompute the heads it moves."""
        check_name("queue", queue)
        checked = check_dead_letter_policy(policy)

        def op(db: sqlite3.Connection, now: float) -> None:
            db.execute(Q["set_dead_letter_policy"], {"queue": queue, "policy": checked.value})
            recompute_heads(db, [(r[0], r[1]) for r in db.execute(Q["dead_letter_keys"], {"queue": queue})])

        await self._write(op)
        self.notifier.notify(queue, 1, None)  # held keys may go on (skip): let an idle node look

    async def dead_letter_policy(self, queue: str) -> DeadLetterPolicy:
        """``queue``'s dead-letter policy (``skip`` unless set)."""
        check_name("queue", queue)
        row = await self._read(lambda db: db.execute(Q["dead_letter_policy"], {"queue": queue}).fetchone())
        return DeadLetterPolicy.SKIP if row is None else DeadLetterPolicy(row[0])

    async def dead_letter_policies(self) -> dict[str, DeadLetterPolicy]:
        """Every queue whose policy is not ``skip``, with it: one read of ``coord_queue_settings``."""
        rows = await self._read(lambda db: db.execute(Q["dead_letter_policies"]).fetchall())
        return {str(r[0]): DeadLetterPolicy(r[1]) for r in rows}
