"""The dead-letter policy on PostgreSQL: one row per queue, mirrored where head upkeep reads it.

:class:`PostgresDeadLetterOps` is a mixin of :class:`~asynccoord.backends.postgres.store.PostgresStore`
(``set_dead_letter_policy``, ``dead_letter_policy``, ``dead_letter_policies``; semantics in
:class:`~asynccoord.contract.deadletters.DeadLetterStore`). As on SQLite, the policy acts
through the per-key heads an ordered claim reads: head upkeep (``promote_heads``,
``coord_compute_heads``, ``coord_complete_batch``) refuses a head that a dead task precedes
in a ``hold`` queue, under the key's row lock, so the claims of every process follow the
policy without reading it. A change runs ``coord_set_dead_letters`` (under the queue's
exclusive advisory lock and every key lock of the queue, so no transition in flight
promotes a head by the old policy after it); a discard (``discard_dead``, in :mod:`.queue`)
and a requeue promote the keys they touch. Schema and functions: ``migration_0003.sql``;
queries: ``sql/deadletters.sql``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import asyncpg

from ...contract.deadletters import check_dead_letter_policy
from ...models import DeadLetterPolicy
from ...notify import WorkNotifier
from ...validation import check_name

__all__ = ("PostgresDeadLetterOps",)

T = TypeVar("T")


class PostgresDeadLetterOps:
    """The :class:`~asynccoord.contract.deadletters.DeadLetterStore` verbs of the PostgreSQL store.

    A mixin: it relies on the store's ``_run`` (retrying runner), ``_val``, ``_fetch``, ``_notify``,
    ``_writable`` and ``notifier``.
    """

    notifier: WorkNotifier

    if TYPE_CHECKING:

        async def _run(self, fn: Callable[[asyncpg.Connection, int], Awaitable[T]], *, what: str, **kw: Any) -> T: ...

        async def _val(self, conn: asyncpg.Connection, query_name: str, /, **params: Any) -> Any: ...

        async def _fetch(self, conn: asyncpg.Connection, query_name: str, /, **params: Any) -> list[Any]: ...

        def _writable(self) -> None: ...

        async def _notify(
            self, conn: asyncpg.Connection, queue: str, count: int, partitions: set[int] | None
        ) -> None: ...

    async def set_dead_letter_policy(self, queue: str, policy: DeadLetterPolicy | str) -> None:
        """Set ``queue``'s dead-letter policy for every process of the database; recompute the heads it moves.

        One transaction (``coord_set_dead_letters``): when the queue keeps heads and the
        policy changes, it waits for the transitions in flight on the queue's keys and
        recomputes the queue's heads, a cost in the queue's active tasks.

        Raises:
            InvalidTypeError, InvalidArgumentError: a bad queue or policy (nothing written).
            StoreConnectionError: the server stayed unreachable.
        """
        check_name("queue", queue)
        checked = check_dead_letter_policy(policy)
        self._writable()

        async def op(conn: asyncpg.Connection, _attempt: int) -> int:
            heads = int(await self._val(conn, "set_dead_letter_policy", queue=queue, policy=checked.value))
            if heads:  # keys a hold kept go on (skip): wake the idle nodes of other processes
                await self._notify(conn, queue, heads, None)
            return heads

        await self._run(op, what="set_dead_letter_policy", ambiguous_ok=True)  # setting it twice is the same
        self.notifier.notify(queue, 1, None)  # held keys may go on (skip): let an idle node look

    async def dead_letter_policy(self, queue: str) -> DeadLetterPolicy:
        """``queue``'s dead-letter policy (``skip`` unless set); one statement."""
        check_name("queue", queue)

        async def op(conn: asyncpg.Connection, _attempt: int) -> str | None:
            value = await self._val(conn, "dead_letter_policy", queue=queue)
            return None if value is None else str(value)

        value = await self._run(op, what="dead_letter_policy", tx=False, ambiguous_ok=True)
        return DeadLetterPolicy.SKIP if value is None else DeadLetterPolicy(value)

    async def dead_letter_policies(self) -> dict[str, DeadLetterPolicy]:
        """Every queue whose policy is not ``skip``, with it; one statement."""

        async def op(conn: asyncpg.Connection, _attempt: int) -> list[Any]:
            return list(await self._fetch(conn, "dead_letter_policies"))

        rows = await self._run(op, what="dead_letter_policies", tx=False, ambiguous_ok=True)
        return {str(r[0]): DeadLetterPolicy(r[1]) for r in rows}
