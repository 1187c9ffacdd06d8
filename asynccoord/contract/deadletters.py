"""The dead-letter policy of a queue: the :class:`DeadLetterStore` Protocol and the check of its argument.

What an ordered claim does with a conversation (partition key) whose task went dead is
a setting of the queue, kept in the database so that every process follows it: ``skip``
(the default) lets the conversation go on, ``hold`` keeps it until the dead task is
requeued or discarded. The policy itself is :class:`~asynccoord.models.DeadLetterPolicy`.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ..errors import InvalidArgumentError, InvalidTypeError
from ..models import DeadLetterPolicy

__all__ = ("DeadLetterStore", "check_dead_letter_policy")


def check_dead_letter_policy(policy: object) -> DeadLetterPolicy:
    """Check a dead-letter policy: a :class:`DeadLetterPolicy` or its value, ``"skip"`` or ``"hold"``.

    Raises:
        InvalidTypeError: not a str.
        InvalidArgumentError: another string (the message names the allowed ones).
    """
    if not isinstance(policy, str):
        raise InvalidTypeError(f"policy must be a DeadLetterPolicy or 'skip' or 'hold', got {type(policy).__name__}")
    try:
        return DeadLetterPolicy(policy)
    except ValueError:
        raise InvalidArgumentError(f"policy must be 'skip' or 'hold', got {policy!r}") from None


@runtime_checkable
class DeadLetterStore(Protocol):
    """What an ordered claim does with a conversation whose task went dead: a setting per queue.

    The policy is stored in the database, so every process of it follows the same one.
    ``skip`` (the default) lets the key's next task become its head: the conversation goes
    on without the dead task. ``hold`` leaves a key whose earliest unfinished task is dead
    (a dead task with a smaller id than every pending or running task of the key) without
    a head: no ordered claim, and no ``complete_and_claim_next``, leases a later task of
    it until the dead task is requeued (``requeue_dead``: it runs first) or discarded
    (``discard_dead``). Unordered claims ignore the policy. A change applies at once to
    every key, dead tasks of the past included.
    """

    async def set_dead_letter_policy(self, queue: str, policy: DeadLetterPolicy | str) -> None:
        """Set ``queue``'s dead-letter policy for every process of the database.

        Raises:
            InvalidTypeError, InvalidArgumentError: a bad queue or policy (nothing written).
        """
        ...

    async def dead_letter_policy(self, queue: str) -> DeadLetterPolicy:
        """``queue``'s dead-letter policy (``skip`` unless set)."""
        ...

    async def dead_letter_policies(self) -> dict[str, DeadLetterPolicy]:
        """Every queue whose dead-letter policy is not the default ``skip``, with it: one read.

        A queue missing from it has ``skip``. A read: it works on a store opened read-only.
        """
        ...
