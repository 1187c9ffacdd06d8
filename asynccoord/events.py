"""Stable names of coordination events, and the in-process counter stores and nodes bump.

The conflict monitor reads these counters; the names are part of the public API
(they appear in metrics and in the demo's report) and never change meaning:

* ``claims``, ``commits``, ``retries``, ``dead_lettered``: the pipeline's work;
  ``store_retries``: PostgreSQL calls retried after a lost connection or a conflict.
* ``lock_contended``: a wait for a lock held elsewhere; ``lock_lost``, ``lease_lost``: a lock
  or task lease lost during a send; ``lease_expired``: a lease that lapsed and was reclaimed
  by a claim; ``send_interrupted``: a send cut short by its node's stop, its task handed back.
* ``stale_commit_rejected``, ``fencing_rejected``: writes the versions and fences refused;
  ``duplicate_enqueue_suppressed``, ``duplicate_delivery_suppressed``: repeats the idempotency
  keys and processed records absorbed.
* ``unreadable_task``: a claimed task whose stored row could not be decoded, dead-lettered.
* ``send_abandoned``: a send left running unwatched (let go at ``send_overrun_s``, past its
  cleanup time after a lost lease or lock, or outliving its node's stop).
* ``rate_limit_held``: claims that left work behind for a rate limit;
  ``provider_rate_limited``: 429s from the provider; ``send_paused``: sends held back by
  another send's 429.
* ``partition_handoff``: partitions moving between nodes; ``membership_change``: a change of
  the live nodes (joins, leaves), counted once in the cluster; ``membership_flap``: a process
  whose nodes were live only briefly (a restart loop); ``node_lost``: a node that
  dropped out because its heartbeats stopped (a crash, a kill, a freeze past the TTL).

Log lines start with their event's name (``asynccoord.node.send_let_go task=...``); the loggers
are named under ``asynccoord``, after the modules.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping

from .validation import check_int, check_name

__all__ = (
    "CLAIMS",
    "COMMITS",
    "DEAD_LETTERED",
    "DUPLICATE_DELIVERY_SUPPRESSED",
    "DUPLICATE_ENQUEUE_SUPPRESSED",
    "EVENT_NAMES",
    "FENCING_REJECTED",
    "LEASE_EXPIRED",
    "LEASE_LOST",
    "SEND_ABANDONED",
    "SEND_INTERRUPTED",
    "SEND_PAUSED",
    "LOCK_CONTENDED",
    "LOCK_LOST",
    "MEMBERSHIP_CHANGE",
    "MEMBERSHIP_FLAP",
    "NODE_LOST",
    "PARTITION_HANDOFF",
    "PROVIDER_RATE_LIMITED",
    "RATE_LIMIT_HELD",
    "RETRIES",
    "STALE_COMMIT_REJECTED",
    "STORE_RETRIES",
    "UNREADABLE_TASK",
    "EventCounter",
)

LOCK_CONTENDED = "lock_contended"
LOCK_LOST = "lock_lost"
LEASE_LOST = "lease_lost"
SEND_INTERRUPTED = "send_interrupted"
LEASE_EXPIRED = "lease_expired"
STALE_COMMIT_REJECTED = "stale_commit_rejected"
"""A send's outcome (a commit, or a failure for the retry policy) refused because its task lease
was lost: another node may have the task. A refused hand-back of a task is not counted here."""
FENCING_REJECTED = "fencing_rejected"
DUPLICATE_ENQUEUE_SUPPRESSED = "duplicate_enqueue_suppressed"
DUPLICATE_DELIVERY_SUPPRESSED = "duplicate_delivery_suppressed"
RETRIES = "retries"
DEAD_LETTERED = "dead_lettered"
PARTITION_HANDOFF = "partition_handoff"
MEMBERSHIP_CHANGE = "membership_change"
"""A change of the live nodes (nodes joining or leaving), counted once in the cluster: by the process
holding the smallest live node id before or after it (see :class:`~asynccoord.membership.Membership`)."""
MEMBERSHIP_FLAP = "membership_flap"
"""A short life: a process's nodes left the live view (a leave, an expiry, or a restart reusing
their node ids) less than
:data:`~asynccoord.membership.FLAP_TTLS` heartbeat TTLs (30 s at the default 5 s) after they
joined. Counted once per process life (its nodes sharing the ``"runtime"`` of their heartbeat
info; else once per node), by the process that counts ``membership_change``. A process
restarting again and again counts one per restart; a restart of a process that had run longer
counts none, so a rolling restart counts none unless it restarts a process within that time of
its start or of its last restart."""
NODE_LOST = "node_lost"
"""A node left the live view because its heartbeats stopped, not by leaving: its process
crashed, was killed, or froze past the heartbeat TTL. Counted once in the cluster, as
``membership_change`` is: a node gone from the view whose expiry had passed by the store
clock (one that leaves with its process's shutdown is deleted before it expires). The
counting process judges only between two of its reads less than half the TTL apart, so a
loss during a stall of that process or of the store may go uncounted, never a clean leave
counted."""
CLAIMS = "claims"
COMMITS = "commits"
STORE_RETRIES = "store_retries"
"""A store operation retried after a transient failure (a lost PostgreSQL or Redis connection)."""
RATE_LIMIT_HELD = "rate_limit_held"
"""A claim left due work behind because a rate limit's bucket had no token (one per such claim)."""
PROVIDER_RATE_LIMITED = "provider_rate_limited"
"""A send reported the provider's rate limit (HTTP 429): the declared limits are above the provider's."""
SEND_PAUSED = "send_paused"
"""A claimed task was handed back unsent because a provider's 429 to another send under its
lock, in any process, paused the lock since the claim (see :mod:`asynccoord.pauses`)."""
SEND_ABANDONED = "send_abandoned"
"""A send that ignored its cancellation still ran when the node stopped watching it: let go
``send_overrun_s`` after its timeout or its cleanup time after a lost lease or lock (the lock's
next sends then take a new lease, with a higher fencing token), or still running when its node
stopped (its lease and lock then lapse at their TTLs). If its message goes out, a later send of
its task repeats it."""
UNREADABLE_TASK = "unreadable_task"
"""A claim leased a task whose stored ``payload``, ``result`` or (in a rate-limited queue)
``limit_keys`` cannot be decoded (written by another tool, or an integer over this process's
digit limit), or ``fail`` / ``release(count_attempt=True)`` met such a row: the task was
dead-lettered with ``last_error`` naming the column and why (``dead_lettered`` is counted
too), and the claim handed out the others. Logged as ``asynccoord.store.unreadable_task``."""

EVENT_NAMES: tuple[str, ...] = (
    LOCK_CONTENDED,
    LOCK_LOST,
    LEASE_LOST,
    SEND_INTERRUPTED,
    LEASE_EXPIRED,
    STALE_COMMIT_REJECTED,
    FENCING_REJECTED,
    DUPLICATE_ENQUEUE_SUPPRESSED,
    DUPLICATE_DELIVERY_SUPPRESSED,
    RETRIES,
    DEAD_LETTERED,
    PARTITION_HANDOFF,
    MEMBERSHIP_CHANGE,
    MEMBERSHIP_FLAP,
    NODE_LOST,
    CLAIMS,
    COMMITS,
    STORE_RETRIES,
    RATE_LIMIT_HELD,
    PROVIDER_RATE_LIMITED,
    SEND_PAUSED,
    SEND_ABANDONED,
    UNREADABLE_TASK,
)


_KNOWN = frozenset(EVENT_NAMES)


class EventCounter:
    """Thread-safe monotonic counters keyed by event name.

    Stores bump it from their driver thread and nodes from the event loop, so a
    plain ``Counter`` behind a lock is enough; reading takes a snapshot.
    """

    __slots__ = ("_counts", "_lock")

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(self, name: str, n: int = 1) -> None:
        """Add ``n`` to the counter ``name``.

        Args:
            name: An event name: one of :data:`EVENT_NAMES`, or another text identifier
                (1..255 characters, no NUL) for a counter of the caller's own.
            n: How much to add: an int in ``0..2**31 - 1`` (default 1).

        Raises:
            InvalidTypeError, InvalidArgumentError: a bad name or ``n`` (nothing added).
        """
        if type(n) is not int or not 0 <= n < 2**31:
            check_int("n", n, minimum=0, maximum=2**31 - 1)
        if type(name) is not str or name not in _KNOWN:  # the type first: a list is not even hashable
            check_name("name", name)
        if n:
            with self._lock:
                self._counts[name] += n

    def get(self, name: str) -> int:
        """Current value of ``name`` (0 if never bumped).

        Raises:
            InvalidTypeError, InvalidArgumentError: ``name`` is not a text identifier
                (a str of 1..255 characters, no NUL).
        """
        if type(name) is not str or name not in _KNOWN:
            check_name("name", name)
        with self._lock:
            return self._counts[name]

    def snapshot(self) -> Mapping[str, int]:
        """A copy of every counter that is non-zero."""
        with self._lock:
            return dict(self._counts)

    def __repr__(self) -> str:
        return f"<EventCounter {self.snapshot()}>"
