"""Whether a store answers: the outcomes of its calls, kept by the store itself.

A lock store in a service of its own (Redis beside a PostgreSQL queue, say) can stop
answering while the queue store still does: the nodes' acquisitions and renewals then
fail or hang, and nothing the monitor reads from the queue store tells of it. The store
records each attempt of its calls here as it ends (no I/O, no lock, a few attribute
writes), and a monitor given the store (``Monitor(lock_store=...)``) reads the record
(:mod:`asynccoord.monitor.lockoutage`). Events flow upward: the store knows nothing of
monitors, and a healthy store costs nobody a call more.

Times are ``time.monotonic()`` seconds of this process.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

__all__ = ("Reach",)


class Reach:
    """One store's record of its calls: when it last answered, the attempts failed since, the calls waiting.

    Attributes:
        answered_at: When an attempt last got the store's answer (any answer, an error
            the store replied with included), or None before the first.
        failed_at: When an attempt last failed to reach the store (a connection lost or
            refused, a store still loading its data), or None before the first.
        failures: Attempts failed since the last answer.
        error: The last failure, as ``"<type>: <text>"``, or None.
    """

    __slots__ = ("_waiting", "answered_at", "error", "failed_at", "failures")

    def __init__(self) -> None:
        self.answered_at: float | None = None
        self.failed_at: float | None = None
        self.failures = 0
        self.error: str | None = None
        self._waiting: dict[object, float] = {}  # calls in flight -> when each began

    def __repr__(self) -> str:
        return (
            f"<Reach answered_at={self.answered_at!r} failed_at={self.failed_at!r} "
            f"failures={self.failures} waiting={len(self._waiting)}>"
        )

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        """Hold one call as waiting for the store while the ``with`` block runs (its attempts report apart)."""
        key = object()
        self._waiting[key] = time.monotonic()
        try:
            yield
        finally:
            del self._waiting[key]

    def answered(self) -> None:
        """An attempt got the store's answer."""
        self.answered_at = time.monotonic()
        self.failures = 0

    def failed(self, error: BaseException) -> None:
        """An attempt could not reach the store (``error`` says why)."""
        self.failed_at = time.monotonic()
        self.failures += 1
        self.error = f"{type(error).__name__}: {error}"

    @property
    def waiting(self) -> int:
        """Calls in flight now."""
        return len(self._waiting)

    def waiting_since(self, after: float) -> list[float]:
        """When each call in flight that began at ``after`` or later began, oldest first.

        With ``after`` the last answer's time: the calls that no answer came for since they began.
        """
        return sorted(at for at in self._waiting.values() if at >= after)
