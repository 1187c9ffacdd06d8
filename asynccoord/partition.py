"""Stable partitioning: keys to fixed partitions, partitions to live nodes.

Two steps, both pure functions of their inputs (no I/O, no per-process state):

1. ``partition_of(key, partitions)``: a key (e.g. a conversation id) is hashed with
   BLAKE2b (RFC 7693, from :mod:`hashlib`) into one of ``partitions`` fixed buckets.
   The result is identical in every process, on every machine and in every release;
   Python's per-process salted ``hash()`` is never used. The store keeps each task's
   partition number so a node can claim "only my partitions" with an index.
2. ``owner_of(partition, nodes)``: rendezvous (highest random weight) hashing,
   D. Thaler and C. Ravishankar, "Using name-based mappings to increase hit rates",
   IEEE/ACM Transactions on Networking, 1998. Every node scores every partition and
   the highest score wins, so when a node joins only the partitions it now wins move
   (all of them to it), and when it leaves only its own partitions move.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterable, Mapping, Sequence

from .errors import InvalidArgumentError, InvalidTypeError
from .validation import _short, check_int, check_key

__all__ = ("MAX_PARTITIONS", "RendezvousTable", "assign", "owner_of", "owned_partitions", "partition_of")

MAX_PARTITIONS = 1 << 16
"""Most fixed partitions a store keeps (``StoreConfig.partitions``), and so these functions take."""


def _hash64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def partition_of(key: str, partitions: int) -> int:
    """The fixed partition of a partition key.

    Args:
        key: The partition key (``str``, may be empty).
        partitions: Number of partitions, >= 1.

    Returns:
        An int in ``[0, partitions)``.

    Raises:
        InvalidTypeError: ``key`` is not a str.
        InvalidArgumentError: ``partitions`` outside 1..:data:`MAX_PARTITIONS`.
    """
    check_key("key", key, allow_empty=True)
    check_int("partitions", partitions, minimum=1, maximum=MAX_PARTITIONS)
    return _hash64(b"k:" + key.encode("utf-8")) % partitions


def _score_prefix(node: str) -> bytes:
    return b"n:" + node.encode("utf-8") + b"\x00"


def _score(node: str, partition: int) -> int:
    """Rendezvous score of ``node`` for ``partition`` (also :class:`RendezvousTable`'s, per node)."""
    return _hash64(_score_prefix(node) + str(partition).encode())


def _check_nodes(nodes: object) -> None:
    # A str is an iterable of str too: each character would be taken for a node id.
    if isinstance(nodes, str | bytes) or not isinstance(nodes, Iterable):
        raise InvalidTypeError(
            f"nodes must be an iterable of node ids (e.g. a list of str), got {type(nodes).__name__} {_short(nodes)}"
        )


def owner_of(partition: int, nodes: Iterable[str]) -> str:
    """The node that owns ``partition`` among ``nodes`` (rendezvous hashing).

    Every node scores the partition and the highest score wins, so a joining node takes
    only the partitions it now wins, and a leaving node gives up only its own. Node ids
    are taken as the store holds them: one of only whitespace, which
    :meth:`~asynccoord.membership.Membership.join` refuses but older code wrote, scores
    like any other, so such a member never stops the assignment.

    Args:
        partition: A partition number, 0 .. :data:`MAX_PARTITIONS` - 1.
        nodes: Node ids of the live nodes (order does not matter, duplicates ignored).

    Returns:
        The winning node id; ties (probability ~2**-64) go to the smaller id.

    Raises:
        InvalidTypeError: ``nodes`` is a str (not a list of them) or not iterable, or a
            node id is not a str.
        InvalidArgumentError: ``nodes`` is empty or ``partition`` outside 0 .. :data:`MAX_PARTITIONS` - 1.
    """
    check_int("partition", partition, minimum=0, maximum=MAX_PARTITIONS - 1)
    _check_nodes(nodes)
    best: tuple[int, str] | None = None
    for node in nodes:
        check_key("node", node, allow_blank=True)
        candidate = (_score(node, partition), node)
        if best is None or candidate[0] > best[0] or (candidate[0] == best[0] and node < best[1]):
            best = candidate
    if best is None:
        raise InvalidArgumentError("nodes must name at least one node, got none")
    return best[1]


class RendezvousTable:
    """Repeated assignments of ``partitions`` partitions to changing sets of nodes.

    The same mapping as :func:`owner_of` for every partition, computed faster: each
    node's scores for all partitions are computed once and kept (``partitions`` 64-bit
    integers per node), so a membership change costs one pass of comparisons plus the
    hashes of the nodes not seen before, instead of hashing every (node, partition)
    pair again (about 0.2 s for 128 nodes x 1,024 partitions). Scores of nodes absent
    from the last assignment are dropped once they outnumber its nodes.

    Args:
        partitions: Number of partitions, 1..:data:`MAX_PARTITIONS`.

    Raises:
        InvalidArgumentError, InvalidTypeError: a bad ``partitions``.
    """

    __slots__ = ("_scores", "_suffixes", "partitions")

    def __init__(self, partitions: int) -> None:
        self.partitions = check_int("partitions", partitions, minimum=1, maximum=MAX_PARTITIONS)
        self._suffixes = [str(p).encode() for p in range(partitions)]
        self._scores: dict[str, array[int]] = {}

    def __repr__(self) -> str:
        return f"<RendezvousTable partitions={self.partitions} nodes_kept={len(self._scores)}>"

    def _node_scores(self, node: str) -> array[int]:
        scores = self._scores.get(node)
        if scores is None:  # _score of every partition, the node's prefix encoded once
            prefix = _score_prefix(node)
            scores = self._scores[node] = array("Q", [_hash64(prefix + s) for s in self._suffixes])
        return scores

    def assign(self, nodes: Iterable[str]) -> Mapping[str, frozenset[int]]:
        """Every partition assigned to its owner among ``nodes`` (as :func:`assign`).

        Raises:
            InvalidTypeError: ``nodes`` is a str (not a list of them) or not iterable, or
                a node id is not a str.
            InvalidArgumentError: ``nodes`` is empty.
        """
        _check_nodes(nodes)
        members = sorted({check_key("node", n, allow_blank=True) for n in nodes})
        if not members:
            raise InvalidArgumentError("nodes must name at least one node, got none")
        vectors = [self._node_scores(n) for n in members]
        owned: list[list[int]] = [[] for _ in members]
        index = range(len(members))
        # max() keeps the first of equal scores: members are sorted, so a tie goes to the
        # smaller id, as in owner_of.
        for p, column in enumerate(zip(*vectors, strict=True)):
            owned[max(index, key=column.__getitem__)].append(p)
        if len(self._scores) > 2 * len(members):
            keep = set(members)
            for node in [n for n in self._scores if n not in keep]:
                del self._scores[node]
        return {n: frozenset(ps) for n, ps in zip(members, owned, strict=True)}


def assign(partitions: int, nodes: Sequence[str]) -> Mapping[str, frozenset[int]]:
    """Every partition in ``range(partitions)`` assigned to its owner (:func:`owner_of`).

    For repeated assignments as membership changes, :class:`RendezvousTable` keeps each
    node's scores between calls.

    Args:
        partitions: Number of partitions, >= 1.
        nodes: Node ids of the live nodes (order does not matter, duplicates ignored).

    Returns:
        Node id -> the partitions it owns (every node present, possibly empty).

    Raises:
        InvalidTypeError: ``nodes`` is a str (not a list of them) or not iterable, or a
            node id is not a str.
        InvalidArgumentError: ``partitions`` outside 1..:data:`MAX_PARTITIONS`, or ``nodes`` is empty.
    """
    return RendezvousTable(partitions).assign(nodes)


def owned_partitions(node: str, partitions: int, nodes: Sequence[str]) -> frozenset[int]:
    """The partitions ``node`` owns when ``nodes`` are live (``node`` counts as live).

    Raises:
        InvalidTypeError: ``node`` is not a str, ``nodes`` is a str (not a list of them)
            or not iterable, or a node id in it is not a str.
        InvalidArgumentError: ``partitions`` outside 1..:data:`MAX_PARTITIONS`.
    """
    check_key("node", node, allow_blank=True)
    check_int("partitions", partitions, minimum=1, maximum=MAX_PARTITIONS)
    _check_nodes(nodes)
    members = {check_key("node", n, allow_blank=True) for n in nodes} | {node}
    return assign(partitions, sorted(members))[node]
