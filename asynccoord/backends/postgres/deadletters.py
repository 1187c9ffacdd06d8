"""The dead-letter policy on PostgreSQL: ``skip`` only, for now.

:class:`PostgresDeadLetterOps` is a mixin of :class:`~asynccoord.backends.postgres.store.PostgresStore`.
The ``hold`` policy of :class:`~asynccoord.contract.deadletters.DeadLetterStore` is kept
by the SQLite and memory stores; this store refuses it with :class:`~asynccoord.errors.InvalidArgumentError` rather
than let conversations go on past a dead task a caller meant to hold them.
"""

from __future__ import annotations

from ...contract.deadletters import check_dead_letter_policy
from ...errors import InvalidArgumentError
from ...models import DeadLetterPolicy
from ...validation import check_name

__all__ = ("PostgresDeadLetterOps",)


class PostgresDeadLetterOps:
    """The dead-letter policy of the PostgreSQL store (``skip`` only).

    A mixin that needs nothing of the store: neither verb touches the database.
    """

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
