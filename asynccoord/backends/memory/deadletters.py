"""Dead-letter policy of the in-memory store: one setting per queue in a dict, the reference semantics.

:class:`MemoryDeadLetterOps` is a mixin of :class:`~asynccoord.backends.memory.store.MemoryStore`
(``set_dead_letter_policy``, ``dead_letter_policy``, ``dead_letter_policies``; semantics in
:class:`~asynccoord.contract.deadletters.DeadLetterStore`). The store finds a key's head
among the statuses :meth:`MemoryDeadLetterOps._blocking` names: with ``hold``, a dead
task is one of them, so a key whose earliest such task is dead has no claimable head.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from ...contract.deadletters import check_dead_letter_policy
from ...models import DeadLetterPolicy, TaskStatus
from ...notify import WorkNotifier
from ...validation import check_name

__all__ = ("MemoryDeadLetterOps",)

_ACTIVE = frozenset((TaskStatus.PENDING, TaskStatus.RUNNING))
_ACTIVE_OR_DEAD = _ACTIVE | {TaskStatus.DEAD}


class MemoryDeadLetterOps:
    """The dead-letter policy per queue, kept in a dict. A mixin: it relies on ``_enter`` and ``notifier``."""

    notifier: WorkNotifier

    if TYPE_CHECKING:

        async def _enter(self) -> None: ...

    @functools.cached_property
    def _dead_letter_policies(self) -> dict[str, DeadLetterPolicy]:
        return {}

    async def set_dead_letter_policy(self, queue: str, policy: DeadLetterPolicy | str) -> None:
        """Set ``queue``'s dead-letter policy (see ``DeadLetterStore``)."""
        check_name("queue", queue)
        checked = check_dead_letter_policy(policy)
        await self._enter()
        if checked is DeadLetterPolicy.SKIP:
            self._dead_letter_policies.pop(queue, None)
        else:
            self._dead_letter_policies[queue] = checked
        self.notifier.notify(queue, 1, None)  # held keys may go on (skip): let idle nodes look

    async def dead_letter_policy(self, queue: str) -> DeadLetterPolicy:
        """``queue``'s dead-letter policy (``skip`` unless set)."""
        check_name("queue", queue)
        await self._enter()
        return self._dead_letter_policies.get(queue, DeadLetterPolicy.SKIP)

    async def dead_letter_policies(self) -> dict[str, DeadLetterPolicy]:
        """Every queue whose policy is not ``skip``, with it (a ``skip`` is never kept)."""
        await self._enter()
        return dict(sorted(self._dead_letter_policies.items()))

    def _blocking(self, queue: str) -> frozenset[TaskStatus]:
        """The statuses of the tasks that stand in a key's order in ``queue``: a key's head is its earliest one."""
        held = self._dead_letter_policies.get(queue) is DeadLetterPolicy.HOLD
        return _ACTIVE_OR_DEAD if held else _ACTIVE
