"""Which key prefixes of a Redis server hold asynccoord lock keys: one bounded, read-only search.

A :class:`~asynccoord.backends.redis.RedisLockStore` keeps every lock name's fencing counter
at ``{prefix}fencing:{name}`` for ever, so the prefixes in use on a server are what
precedes ``fencing:`` in such keys. ``status`` and ``dashboard`` run this search only when
their lock store shows no lock and no fencing counter under its own prefix (a
``--lock-prefix`` that is not the nodes'), to name the prefixes that do hold lock keys.

A lock name may itself hold ``fencing:`` (``a:fencing:b:fencing:c`` is prefix ``a:``'s lock
``b:fencing:c``, or prefix ``a:fencing:b:``'s lock ``c``). The rule: the shortest prefix
that also has the name's ``{prefix}lock:{name}`` or ``{prefix}lockmeta:{name}`` key (a lock
held now), else the shortest one. A key is taken as a fencing counter by its shape and
type alone (a string whose name holds ``fencing:`` after a prefix of 1 to 255 characters).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis

__all__ = ("FENCING", "SCAN_COUNT", "SURVEY_MAX_KEYS", "PrefixSurvey", "candidates", "survey_prefixes")

FENCING = "fencing:"
"""The key kind of a lock name's fencing counter: ``{prefix}fencing:{name}``."""

SURVEY_MAX_KEYS = 10_000
"""About how many of the server's keys one search examines at most (``SCAN`` calls of
:data:`SCAN_COUNT`): the search stops there and says so."""

SCAN_COUNT = 1000
"""The ``COUNT`` of each ``SCAN`` call of the search."""


@dataclass(frozen=True, slots=True)
class PrefixSurvey:
    """What one search found.

    Attributes:
        prefix: The prefix the search was made for (a lock store's own).
        own_counters: Fencing counters seen under ``prefix`` (keys ``{prefix}fencing:*``).
        prefixes: The other prefixes: ``(prefix, fencing counters seen)`` pairs, most
            counters first, then by prefix.
        complete: Whether the search went through every key (False: it stopped at its cap).
        max_keys: The cap of the search, keys (about).
        keys_total: How many keys the server's database holds (``DBSIZE``).
    """

    prefix: str
    own_counters: int
    prefixes: tuple[tuple[str, int], ...]
    complete: bool
    max_keys: int
    keys_total: int


def _is_prefix(text: str) -> bool:
    return 0 < len(text) <= 255 and not text.isspace() and "\x00" not in text


def candidates(key: str) -> list[tuple[str, str]]:
    """The ``(prefix, name)`` readings of a fencing counter's key, shortest prefix first.

    >>> candidates("a:fencing:b:fencing:c")
    [('a:', 'b:fencing:c'), ('a:fencing:b:', 'c')]
    """
    out = []
    at = key.find(FENCING)
    while at >= 0:
        prefix, name = key[:at], key[at + len(FENCING) :]
        if _is_prefix(prefix) and name:
            out.append((prefix, name))
        at = key.find(FENCING, at + 1)
    return out


def _decoded(keys: Iterable[bytes | str]) -> set[str]:
    """The keys as text; one that is not UTF-8 is no key of a lock store (its prefix and names are text)."""
    out = set()
    for key in keys:
        try:
            out.add(key.decode() if isinstance(key, bytes) else key)
        except UnicodeDecodeError:
            continue
    return out


async def _types(client: aioredis.Redis, keys: Sequence[str]) -> list[str]:
    """Each key's ``TYPE`` (one round trip): a fencing counter is a ``string``."""
    async with client.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.type(key)
        return [t.decode() if isinstance(t, bytes) else str(t) for t in await pipe.execute()]


async def _held(client: aioredis.Redis, readings: Sequence[tuple[str, str]]) -> list[bool]:
    """Whether each ``(prefix, name)`` reading has a lock key or lock metadata key now (one round trip)."""
    async with client.pipeline(transaction=False) as pipe:
        for prefix, name in readings:
            pipe.exists(f"{prefix}lock:{name}", f"{prefix}lockmeta:{name}")
        return [int(n) > 0 for n in await pipe.execute()]


async def survey_prefixes(client: aioredis.Redis, prefix: str, *, max_keys: int = SURVEY_MAX_KEYS) -> PrefixSurvey:
    """Search the server for ``*fencing:*`` keys (read-only, ``SCAN`` bounded) and name their prefixes.

    Only string keys count: a name holding ``fencing:`` also matches in its lock's sorted
    set, its metadata hash and a resource's fence hash.

    Args:
        client: An open redis-py client.
        prefix: The lock store's own prefix: its counters are counted apart.
        max_keys: About how many keys to examine at most (>= 1). Default :data:`SURVEY_MAX_KEYS`.

    Returns:
        The prefixes found (see the module's rule for a name holding ``fencing:``).
    """
    calls = max(1, math.ceil(max_keys / SCAN_COUNT))
    found: set[bytes | str] = set()
    cursor: int = 0
    for _ in range(calls):
        cursor, keys = await client.scan(cursor, match=f"*{FENCING}*", count=SCAN_COUNT)
        found.update(keys)
        if int(cursor) == 0:
            break
    keys_total = int(await client.dbsize())
    texts = sorted(_decoded(found))
    counters = [key for key, kind in zip(texts, await _types(client, texts), strict=True) if kind == "string"]
    own = sum(1 for key in counters if key.startswith(prefix + FENCING))
    readings = [candidates(key) for key in counters if not key.startswith(prefix + FENCING)]
    ambiguous = [r for options in readings if len(options) > 1 for r in options]
    held = dict(zip(ambiguous, await _held(client, ambiguous), strict=True)) if ambiguous else {}
    counts: Counter[str] = Counter()
    for options in readings:
        if options:
            chosen, _ = next((r for r in options if held.get(r)), options[0])
            counts[chosen] += 1
    return PrefixSurvey(
        prefix=prefix,
        own_counters=own,
        prefixes=tuple(sorted(counts.items(), key=lambda item: (-item[1], item[0]))),
        complete=int(cursor) == 0,
        max_keys=max_keys,
        keys_total=keys_total,
    )
