"""Wake-ups of idle in-process nodes after a store changed what is claimable.

Every engine calls these after a write that made work due: new tasks, settled tasks
whose keys' next task may now be a head, heads promoted by a dead letter or a
duplicate. They only tell the store's :class:`~asynccoord.notify.WorkNotifier` which
``(queue, partitions)`` to wake; the notifier picks the idle nodes that own them.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..contract.queue import PreparedTask
from ..models import EnqueueResult, Task
from ..notify import WorkNotifier

__all__ = ("notify_created", "notify_partitions", "notify_settled")


def notify_created(notifier: WorkNotifier, results: Sequence[EnqueueResult], prepared: Sequence[PreparedTask]) -> None:
    """Wake idle in-process nodes that own the partitions of newly created tasks due now."""
    due: dict[str, set[int]] = {}
    counts: dict[str, int] = {}
    for result, p in zip(results, prepared, strict=True):
        if result.created and p.delay_s == 0:
            due.setdefault(p.queue, set()).add(p.partition)
            counts[p.queue] = counts.get(p.queue, 0) + 1
    for queue, partitions in due.items():
        notifier.notify(queue, counts[queue], partitions)


def notify_settled(notifier: WorkNotifier, tasks: Sequence[Task]) -> None:
    """Wake idle in-process nodes owning the partitions of settled tasks (their keys' next task may be due)."""
    by_queue: dict[str, set[int]] = {}
    for t in tasks:
        by_queue.setdefault(t.queue, set()).add(t.partition)
    for queue, partitions in by_queue.items():
        notifier.notify(queue, len(partitions), partitions)


def notify_partitions(notifier: WorkNotifier, promoted: Sequence[tuple[str, int]]) -> None:
    """Wake idle in-process nodes owning these ``(queue, partition)``: work became claimable there."""
    by_queue: dict[str, set[int]] = {}
    for queue, partition in promoted:
        by_queue.setdefault(queue, set()).add(partition)
    for queue, partitions in by_queue.items():
        notifier.notify(queue, len(partitions), partitions)
