"""Store calls in flight, and a ``close()`` that lets them end: one :class:`CallGate` per store.

A store's ``close()`` sets :attr:`CallGate.closing`: from then on a new call is refused
with :class:`~asynccoord.errors.StoreClosedError` (nothing written), while the calls in
flight go on to their end, and so do *hand-backs* (a lease released, a task handed back to
pending: :meth:`CallGate.giving_back`). ``close()`` waits for both (:meth:`CallGate.settle`)
before it closes its connections.

Hand-backs matter most at a close: a ``Lock`` acquisition cancelled just before
``close()`` may still be granted by its call in flight, and the lock releases that lease
in a task of its own, started by the call's end. Refused as a new call, the release would
leave the lease held, with nobody to release it, until its TTL (another process waiting
for the name all that time).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import Iterator
from typing import Any

from ..errors import StoreClosedError

__all__ = ("CLOSE_WAIT_S", "CLOSING_RETRY_S", "HAND_BACK_TURNS", "CallGate")

CLOSE_WAIT_S = 10.0
"""Longest a store's ``close()`` waits for the calls in flight and the hand-backs they start, seconds."""

CLOSING_RETRY_S = 1.0
"""Longest a call retries a lost connection once its store closes, seconds (:meth:`CallGate.retry_deadline`).

A store that cannot be reached would otherwise hold ``close()`` for a call's whole
``reconnect_timeout_s``; a hand-back that fails so leaves its lease to its TTL, as a crash would.
"""

HAND_BACK_TURNS = 8
"""Loop turns :meth:`CallGate.settle` gives, once no call is in flight, for hand-backs to start.

A hand-back is started by a callback of the call whose result nobody received (the call's
task ends, its done-callback starts a task, that task's first step calls the store): a few
turns after the call ends, never in the same one.
"""

_CALL: contextvars.ContextVar[CallGate | None] = contextvars.ContextVar("asynccoord_store_call", default=None)
"""The gate whose store call the running code is part of (tasks and callbacks a call starts inherit it)."""
_GIVING_BACK: contextvars.ContextVar[bool] = contextvars.ContextVar("asynccoord_store_giving_back", default=False)
"""The running code hands something back (a lease, a task): let through while the store closes."""


class CallGate:
    """Counts one store's calls in flight; refuses new ones while the store closes.

    Args:
        what: The store, as the refusal's message names it (``"the SQLite store"``, say).
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self._closing_at: float | None = None  # time.monotonic() when close() began
        self._calls: set[object] = set()  # store calls in flight (see call())
        self._quiet: asyncio.Future[None] | None = None  # set when calls drops to 0, for wait_calls()

    @property
    def closing(self) -> bool:
        """Whether ``close()`` began: new calls are refused, those in flight go on."""
        return self._closing_at is not None

    @closing.setter
    def closing(self, value: bool) -> None:
        self._closing_at = time.monotonic() if value else None

    def retry_deadline(self, deadline: float) -> float:
        """``deadline`` (``time.monotonic()``) for retries of a lost connection, cut short while the store closes.

        Once ``close()`` began, a call retries for at most :data:`CLOSING_RETRY_S` more: a
        store that cannot be reached does not hold the close for the whole reconnect timeout.
        """
        if self._closing_at is None:
            return deadline
        return min(deadline, self._closing_at + CLOSING_RETRY_S)

    def admit(self) -> None:
        """Raise :class:`StoreClosedError` if the store is closing and this is a new call, not a hand-back.

        A step of a call in flight (inside :meth:`call`) and a hand-back (inside
        :meth:`giving_back`) are let through.
        """
        if self.closing and _CALL.get() is not self and not _GIVING_BACK.get():
            raise StoreClosedError(f"{self.what} is closing: it takes no new call")

    def check_usable(self) -> None:
        """Raise if the store cannot take a call at all (not open, another loop): a hook, no check here."""

    def call(self) -> _Call:
        """Hold a store call in flight: refused once the store is closing, waited for by its close.

        A call of several steps holds this around all of them: its later steps, and the
        tasks and callbacks it starts (they inherit the context), are part of it and let
        through while the store closes. (A context manager of its own, not a generator's:
        this is entered on every store call, some once per task.)

        Raises:
            StoreClosedError: the store is closing and this is a new call (or
                :meth:`check_usable` found it closed).
        """
        return _Call(self)

    def hold(self, operation: asyncio.Future[Any]) -> None:
        """Count ``operation`` as a call in flight until it is done, whoever awaits it.

        For work a call started that outlives its caller: a write queued for callers who
        may be cancelled meanwhile, whose outcome then goes to a compensation (a task it
        leased handed back, say). Held, the close waits for that outcome, and for the
        hand-back it starts, before it stops the writer.
        """
        if operation.done():
            return
        calls, marker = self._calls, object()
        calls.add(marker)
        operation.add_done_callback(lambda _: self._ended(calls, marker))

    def _ended(self, calls: set[object], marker: object) -> None:
        """One call in flight ended: wake the close waiting for the last one."""
        calls.discard(marker)
        if not calls and calls is self._calls and self._quiet is not None and not self._quiet.done():
            self._quiet.set_result(None)

    @staticmethod
    @contextlib.contextmanager
    def giving_back() -> Iterator[None]:
        """Mark the calls made inside as hand-backs: let through while the store closes, and waited for.

        A lease or a task handed back by a caller cancelled just before ``close()`` (a
        lock's grant that came too late, say) would otherwise stay held until its TTL.
        """
        token = _GIVING_BACK.set(True)
        try:
            yield
        finally:
            _GIVING_BACK.reset(token)

    @staticmethod
    def in_hand_back() -> bool:
        """Whether the running code hands something back (inside :meth:`giving_back`)."""
        return _GIVING_BACK.get()

    @property
    def calls(self) -> int:
        """Store calls in flight (see :meth:`call`)."""
        return len(self._calls)

    def forget_calls(self) -> None:
        """Forget the calls in flight: those of a loop closed without finishing them never end."""
        self._calls = set()
        self._quiet = None
        self.closing = False

    async def wait_calls(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds until no store call is in flight; True if none is left."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._calls:
            remaining_s = deadline - loop.time()
            if remaining_s <= 0:
                return False
            if self._quiet is None or self._quiet.done():  # one future for every close() waiting
                self._quiet = loop.create_future()
            await asyncio.wait({self._quiet}, timeout=remaining_s)
        return True

    async def settle(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for the calls in flight and the hand-backs their ends start.

        Once no call is in flight, the loop gets :data:`HAND_BACK_TURNS` turns: a hand-back
        started meanwhile is a call in flight again, waited for in turn.

        Returns:
            True if no call is left in flight; False if some still were at the deadline.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            if not await self.wait_calls(deadline - loop.time()):
                return False
            for _ in range(HAND_BACK_TURNS):
                await asyncio.sleep(0)
                if self._calls:
                    break
            else:
                return True


class _Call:
    """One store call in flight (:meth:`CallGate.call`): its own marker in the gate's set while it lasts."""

    __slots__ = ("_calls", "_gate", "_token")

    def __init__(self, gate: CallGate) -> None:
        self._gate = gate

    def __enter__(self) -> None:
        gate = self._gate
        if _CALL.get() is not gate:
            gate.admit()
            gate.check_usable()
        self._token = _CALL.set(gate)
        calls = self._calls = gate._calls
        calls.add(self)

    def __exit__(self, *exc_info: object) -> None:
        # A call of a loop closed mid-call ends (if ever) when its coroutine is collected, in
        # another context; forget_calls() made its set an old one.
        with contextlib.suppress(ValueError):
            _CALL.reset(self._token)
        self._gate._ended(self._calls, self)
