"""Keys a process has warned about, so that a warning about a setting goes out once per key.

A misconfiguration met on a hot path (a task's limit key of an undeclared dimension, a 429
naming a dimension no lock was told of) would otherwise log on every task. A :class:`Once`
remembers the keys it has let through, up to a bound (past it, nothing more is logged: a
process meeting thousands of distinct keys has one problem, already logged).
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

__all__ = ("Once",)

K = TypeVar("K", bound=Hashable)


class Once(Generic[K]):
    """The set of keys already warned about, thread-safe and bounded.

    Args:
        limit: Most keys remembered; past it :meth:`first` lets nothing through.
    """

    __slots__ = ("_limit", "_lock", "_seen")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._seen: set[K] = set()
        self._lock = threading.Lock()

    def first(self, keys: Iterable[K]) -> list[K]:
        """Those of ``keys`` not seen before (now seen), in order; none once the bound is reached."""
        with self._lock:
            if len(self._seen) >= self._limit:
                return []
            new = [k for k in dict.fromkeys(keys) if k not in self._seen]
            self._seen.update(new)
            return new
