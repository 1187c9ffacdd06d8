"""Dead letters on PostgreSQL: ``discard_dead``, and the dead-letter policy (``skip`` only, for now).

:class:`PostgresDeadLetterOps` is a mixin of :class:`~asynccoord.backends.postgres.store.PostgresStore`.
Discarding deletes dead tasks; they hold no head (``is_head`` is kept for pending and
running tasks only), so no head upkeep follows. The ``hold`` policy of
:class:`~asynccoord.contract.protocols.DeadLetterStore` is kept by the SQLite and memory
stores; this store refuses it with :class:`~asynccoord.errors.InvalidArgumentError` rather
than let conversations go on past a dead task a caller meant to hold them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ...contract.queue import check_dead_letter_policy, check_task_ids
from ...errors import InvalidArgumentError
from ...models import DeadLetterPolicy
from ...validation import check_name

if TYPE_CHECKING:
    import asyncpg

__all__ = ("PostgresDeadLetterOps",)

T = TypeVar("T")


class PostgresDeadLetterOps:
    """``discard_dead`` and the dead-letter policy of the PostgreSQL store (``skip`` only).

    A mixin: it relies on the store's ``_run``, ``_fetch``, ``_now`` and ``_writable``.
    """

    if TYPE_CHECKING:

        async def _run(self, fn: Callable[[asyncpg.Connection, int], Awaitable[T]], *, what: str, **kw: Any) -> T: ...

        async def _fetch(self, conn: asyncpg.Connection, query_name: str, /, **params: Any) -> list[Any]: ...

        def _writable(self) -> None: ...

    async def set_dead_letter_policy(self, queue: str, policy: DeadLetterPolicy | str) -> None:
        """Accept ``skip`` (the only policy this store keeps); refuse ``hold``.

        Raises:
            InvalidArgumentError: ``hold`` (not kept by the PostgreSQL store yet), or a bad policy.
            InvalidTypeError: a bad queue or policy type.
        """
        check_name("queue", queue)
        if check_dead_letter_policy(policy) is DeadLetterPolicy.HOLD:
            raise InvalidArgumentError(
                f"dead-letter policy 'hold' for queue {queue!r}: the PostgreSQL store does not keep it yet "
                "(SQLite and memory do); its queues skip dead tasks"
            )

    async def dead_letter_policy(self, queue: str) -> DeadLetterPolicy:
        """Always ``skip`` on this store."""
        check_name("queue", queue)
        return DeadLetterPolicy.SKIP

    async def discard_dead(self, queue: str, task_ids: Sequence[int] | None = None) -> int:
        """Delete dead tasks of ``queue`` (all, or those ids); return how many."""
        check_name("queue", queue)
        ids = check_task_ids(task_ids)
        self._writable()

        async def op(conn: asyncpg.Connection, _attempt: int) -> int:
            return len(await self._fetch(conn, "discard_dead", queue=queue, ids=ids))

        return await self._run(op, what="discard_dead")
