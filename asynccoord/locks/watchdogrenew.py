"""The renewal rounds of a :class:`~asynccoord.locks.watchdog.Watchdog`: every lease due, in one store call.

:class:`WatchdogRenewal` is a mixin of the watchdog. A round renews every lease due now and
those due within half their interval in one ``renew_locks`` call (one ``UPDATE`` on SQLite),
so 10,000 held locks cost a handful of writes per interval, not 10,000 round trips. The
guards of one lease share its renewal, by the longest TTL among them. Each guard's local
deadline comes in while the round flies and is set from the round's send time once it
lands (:meth:`~asynccoord.locks.guard.Guard._landed`, after M. Kleppmann's "How to do
distributed locking", 2016); a lease the store no longer holds is given up. A round that
fails with a store error is retried after a quarter of the interval, at least
:data:`MIN_RETRY_S`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import TYPE_CHECKING

from ..contract.locks import Lease, LockStore
from ..errors import UNRECOVERABLE_STORE_ERRORS, LockLostError
from .guard import Guard

__all__ = ("MIN_RETRY_S", "WatchdogRenewal")

log = logging.getLogger("asynccoord.locks.watchdog")  # the log lines keep the watchdog module's logger name

MIN_RETRY_S = 0.005
"""Shortest pause before retrying a renewal round that failed with a store error, seconds."""


class WatchdogRenewal:
    """The renewal rounds of a :class:`~asynccoord.locks.watchdog.Watchdog`.

    A mixin: it relies on the watchdog's guards (``_guards``, ``_of``), its store, its
    counters, and ``_lose_all`` and ``_poke``.
    """

    _store: LockStore
    _guards: set[Guard]
    _writes: itertools.count[int]
    _renewal: asyncio.Task[None] | None
    _cut_at: float | None
    _renew_rounds: int
    _renewed: int
    _renew_errors: int

    if TYPE_CHECKING:

        def _of(self, owner_token: str) -> list[Guard]: ...

        def _lose_all(self, losses: list[tuple[Guard, LockLostError]]) -> None: ...

        def _poke(self) -> None: ...

    def _start_renewal(self, now: float) -> None:
        """Renew, in one round, every lease due now and those due within half their interval."""
        if not any(g._renew and g._next_renew_at <= now for g in self._guards):
            return
        batch = [g for g in self._guards if g._renew and g._next_renew_at - g._interval_s / 2 <= now]
        self._renewal = asyncio.get_running_loop().create_task(self._renew_round(batch), name="asynccoord-lock-renewal")

    async def _renew_round(self, batch: list[Guard]) -> None:
        sent_at = time.monotonic()
        try:
            # Guards closed between the round's creation and its first step (the holder's
            # block ended) are left out: their leases must not outlive their holders.
            sent = [(g, g._lease) for g in batch if g._active]
            if not sent:
                return
            # A lease guarded twice (through the public API) is renewed for all its guards at
            # once: a round must not move the store's expiry under a guard it leaves out.
            in_round = {g for g, _lease in sent}
            for token in {lease.owner_token for _g, lease in sent}:
                sent += [(g, g._lease) for g in self._of(token) if g not in in_round]
            # One lease per owner token: guards of one lease (guarded twice through the public
            # API, perhaps with another ttl_s) share one renewal, by the longest ttl_s.
            by_token: dict[str, Lease] = {}
            for _g, lease in sent:
                kept = by_token.get(lease.owner_token)
                if kept is None or lease.ttl_s > kept.ttl_s:
                    by_token[lease.owner_token] = lease
            write = next(self._writes)
            for g, _lease in sent:
                g._sent(write, by_token[g._lease.owner_token].ttl_s, sent_at)
            try:
                renewed_by_token = dict(
                    zip(by_token, await self._store.renew_locks(list(by_token.values())), strict=True)
                )
            except BaseException:
                for g, _lease in sent:
                    g._unknown(write)
                raise
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._renew_errors += 1
            log.warning(
                "asynccoord.watchdog.lock_renew_failed leases=%d error=%s: %s", len(batch), type(exc).__name__, exc
            )
            if self._cut_at is not None and isinstance(exc, UNRECOVERABLE_STORE_ERRORS):
                self._cut_at = time.monotonic()  # a deferred cancellation, and the store is gone: end now
            retry_at = time.monotonic()
            for g in batch:
                g._next_renew_at = retry_at + max(MIN_RETRY_S, g._interval_s / 4)
        else:
            self._renew_rounds += 1
            losses: list[tuple[Guard, LockLostError]] = []
            for g, lease in sent:
                if not g._active:
                    continue
                renewed = renewed_by_token[lease.owner_token]
                if renewed is None:
                    g._pending.pop(write, None)
                    error = LockLostError(
                        f"lock {lease.name!r} (fencing token {lease.fencing_token}) had expired or been taken "
                        "over when the watchdog renewed it"
                    )
                    losses.append((g, error))
                    continue
                self._renewed += 1
                if g._lease is lease:  # else an explicit renew replaced it meanwhile: keep that one
                    g._lease = renewed
                g._landed(write, renewed.ttl_s, sent_at)
            self._lose_all(losses)
        finally:
            self._renewal = None
            self._poke()
