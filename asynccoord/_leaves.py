"""The leaves of an exception group, when every one is of a kind.

A send built on task groups (anyio, ``asyncio.TaskGroup``) raises its errors wrapped in an
exception group, nested as its groups were. A signal the node acts on (a provider's 429,
:class:`~asynccoord.errors.RateLimited`; a refusal for good,
:class:`~asynccoord.errors.Undeliverable`) stands only if every error of the group is one:
a group holding any other error is an ordinary failure, for the retry policy.
"""

from __future__ import annotations

from typing import TypeVar

__all__ = ("uniform_leaves",)

E = TypeVar("E", bound=BaseException)


def uniform_leaves(failure: BaseException | None, kind: type[E]) -> list[E] | None:
    """``failure`` as the errors of ``kind`` it is made of, or None when it holds any other.

    Returns:
        ``[failure]`` when it is a ``kind`` itself; the leaves of an exception group, depth
        first in the group's order, when every leaf is one; else None (so for None too).
    """
    if isinstance(failure, kind):
        return [failure]
    if not isinstance(failure, BaseExceptionGroup):
        return None
    leaves: list[E] = []
    pending: list[BaseException] = [failure]
    while pending:
        exc = pending.pop(0)
        if isinstance(exc, BaseExceptionGroup):
            pending[:0] = exc.exceptions
        elif isinstance(exc, kind):
            leaves.append(exc)
        else:
            return None
    return leaves
