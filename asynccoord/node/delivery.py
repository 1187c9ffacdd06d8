"""What a running send can know about its delivery: :func:`current_delivery`, and the conversation's context.

During ``send``, :func:`current_delivery` gives the node id, the task, the lock lease (with
its fencing token) and the conversation's affinity context: a dict a node keeps per
partition key in a bounded LRU (:class:`Affinity`) while it owns the key's partition, so a
bot can keep per-conversation state in memory between its tasks. The delivery travels in a
:mod:`contextvars` variable, set for the send's own asyncio task only.
"""

from __future__ import annotations

import contextvars
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from ..contract.locks import Lease
from ..errors import NoDeliveryError
from ..models import Task
from ..partition import partition_of

__all__ = ("Affinity", "Delivery", "current_delivery")


@dataclass(frozen=True, slots=True)
class Delivery:
    """What a running send can know about its delivery (see :func:`current_delivery`).

    Attributes:
        node_id: The node sending.
        task: The task being sent.
        lock: The lock lease held for it (``lock.fencing_token`` for fenced writes), or None.
        context: The conversation's affinity context: a dict this node keeps for the
            task's partition key while it owns the key's partition.
    """

    node_id: str
    task: Task
    lock: Lease | None
    context: dict[str, Any]


_DELIVERY: contextvars.ContextVar[Delivery] = contextvars.ContextVar("asynccoord_delivery")


def current_delivery() -> Delivery:
    """The delivery of the send running in this task.

    Raises:
        NoDeliveryError: called outside a send called by a node (a ``LookupError``).
    """
    try:
        return _DELIVERY.get()
    except LookupError:
        raise NoDeliveryError("current_delivery() is only available inside a send called by a node") from None


class Affinity:
    """The conversations' context dicts of one node: a bounded LRU keyed by partition key.

    Args:
        size: Most conversations kept (``NodeConfig.affinity_cache_size``, checked there);
            0 keeps none (every send gets a fresh dict).
    """

    __slots__ = ("_contexts", "_size")

    def __init__(self, size: int) -> None:
        self._size = size
        self._contexts: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def context(self, task: Task) -> dict[str, Any]:
        """The context dict of ``task``'s conversation (a new one if none is kept), now the most recent."""
        size = self._size
        if size == 0:
            return {}
        contexts = self._contexts
        key = task.partition_key
        context = contexts.get(key)
        if context is None:
            context = contexts[key] = {}
            while len(contexts) > size:
                contexts.popitem(last=False)
        else:
            contexts.move_to_end(key)
        return context

    def keep_only(self, owned: frozenset[int], partitions: int) -> None:
        """Drop the contexts of conversations whose partition (of ``partitions``) is not in ``owned``."""
        contexts = self._contexts
        for key in [k for k in contexts if partition_of(k, partitions) not in owned]:
            del contexts[key]
