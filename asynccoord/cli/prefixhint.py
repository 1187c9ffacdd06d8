"""The hint of ``status`` and ``dashboard`` when a lock store's prefix holds nothing: which prefixes do.

A ``--lock-prefix`` other than the nodes' shows no lock at all, as a cluster holding none
would. When the lock store lists no lock, :func:`prefix_hint` searches the server once
(:meth:`~asynccoord.backends.redis.RedisLockStore.survey_prefixes`: one bounded ``SCAN``,
read-only) and, if its own prefix has no fencing counter while others have some, names
them with the option that reads them.
"""

from __future__ import annotations

import shlex
from typing import Any

from ..errors import StoreClosedError, StoreConnectionError, StoreError, StoreLoopError

__all__ = ("PREFIXES_NAMED", "hint_message", "prefix_hint")

PREFIXES_NAMED = 5
"""The most prefixes the hint's message names (its ``prefixes`` list holds them all)."""


def hint_message(survey: Any) -> str:
    """The sentence of a hint: the prefix that holds nothing, then those that hold lock keys."""
    named = ", ".join(f"{p!r} (--lock-prefix {shlex.quote(p)})" for p, _ in survey.prefixes[:PREFIXES_NAMED])
    more = len(survey.prefixes) - PREFIXES_NAMED
    if more > 0:
        named += f" and {more} more prefix{'es' if more > 1 else ''}"
    if survey.complete:
        return f"no lock keys under {survey.prefix!r}; this server holds asynccoord lock keys under {named}"
    return (
        f"no lock keys under {survey.prefix!r} among about {survey.max_keys:,} of the server's "
        f"{survey.keys_total:,} keys searched (the search stops there: there may be others); "
        f"those hold asynccoord lock keys under {named}"
    )


async def prefix_hint(lock_store: Any) -> dict[str, Any] | None:
    """The report's ``lock_store.prefix_hint`` for a lock store that lists no lock; None if there is none to give.

    None when the store cannot search its server (no ``survey_prefixes``), when the server
    refuses the search (an ACL user limited to its prefix's keys, or without ``SCAN``,
    ``TYPE`` or ``DBSIZE``: the hint is advice, the report stands without it), when its own
    prefix has a fencing counter (the right prefix, no lock held now), or when no other
    prefix has one.

    Raises:
        StoreConnectionError: the server went away (StoreClosedError, StoreLoopError: the
            store is not usable here).
    """
    survey_prefixes = getattr(lock_store, "survey_prefixes", None)
    if survey_prefixes is None:
        return None
    try:
        survey = await survey_prefixes()
    except (StoreConnectionError, StoreClosedError, StoreLoopError):
        raise
    except StoreError:  # refused by the server: no hint
        return None
    if survey.own_counters or not survey.prefixes:
        return None
    return {
        "message": hint_message(survey),
        "prefixes": [{"prefix": p, "fencing_counters": n} for p, n in survey.prefixes],
        "complete": survey.complete,
        "max_keys": survey.max_keys,
        "keys_total": survey.keys_total,
    }
