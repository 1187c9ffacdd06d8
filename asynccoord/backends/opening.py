"""One ``open()`` of a store object at a time.

A store's ``open()`` awaits its connection (a thread, a pool, a client) before it records
itself open, so two ``open()`` calls overlapping on one object would each pass the
already-open check and each make a connection, one of which no ``close()`` ever closes.
:func:`single_open` marks the object as being opened for the length of the call and
refuses an overlapping call as it refuses one on an open store.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ..errors import StoreAlreadyOpenError

__all__ = ("single_open",)

S = TypeVar("S")


def single_open(method: Callable[[S], Coroutine[Any, Any, None]]) -> Callable[[S], Coroutine[Any, Any, None]]:
    """Wrap a store's ``open()`` so that a call overlapping another raises :class:`StoreAlreadyOpenError`.

    The flag is the instance attribute ``_opening`` (set for the length of the call).
    """

    @functools.wraps(method)
    async def open(self: S) -> None:
        holder: Any = self
        if getattr(holder, "_opening", False):
            raise StoreAlreadyOpenError.of(self)
        holder._opening = True
        try:
            await method(self)
        finally:
            holder._opening = False

    return open
