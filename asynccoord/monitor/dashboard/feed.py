"""The dashboard's data: status snapshots polled once, turned into a state and a stream of changes.

One :class:`Feed` polls one snapshot source for every browser, keeps the dashboard's state
as one JSON object of sections, and streams each change as the sections that changed, in
the shape of a top-level JSON merge patch (RFC 7396).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import json
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator, Mapping
from typing import Any

from ...errors import CoordError, InvalidArgumentError
from ...validation import check_int, check_interval_s

__all__ = ("ENQUEUE_TO_COMMIT", "Feed", "Message", "busiest", "history_point", "redact_payloads", "trim_report")

log = logging.getLogger(__name__)

ENQUEUE_TO_COMMIT = "enqueue_to_commit_ms"
"""The latency the page charts: from a task's enqueue to its commit (node-recorded)."""

Message = dict[str, Any]
"""One message of the stream: ``{"type": "state" | "change", "seq": int, ...}``."""

Source = Callable[[], Awaitable[Any]]

HIDDEN = "(hidden: start the dashboard with --show-payloads to see payloads)"
"""What stands in for a task payload the page is not allowed to show."""

_SUBSCRIBER_BUFFER = 32
_ENCODED_KEPT = _SUBSCRIBER_BUFFER + 4  # the changes a subscriber may still have to send, and states
_COUNTS = ("pending", "running", "done", "dead")


def redact_payloads(value: Any) -> Any:
    """A copy of ``value`` (JSON-like) with every ``"payload"`` and ``"result"`` member hidden.

    The status report holds no task payloads today; this is the boundary every section goes
    through before it leaves the server, so a section that one day carries tasks (dead
    letters, say) shows their payloads only when the dashboard was started to show them.
    """
    if isinstance(value, dict):
        return {k: HIDDEN if k in ("payload", "result") else redact_payloads(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_payloads(v) for v in value]
    return value


def history_point(
    report: Mapping[str, Any], previous: Mapping[str, Any] | None, *, charted: Collection[str] | None = None
) -> dict[str, Any]:
    """One point of the history charts from a status report (and the report before it).

    Args:
        report: The status report (shaped as ``status --json``), with every queue.
        previous: The report before it, or None.
        charted: The queues that get counts of their own in the point. Default None: all.

    Returns:
        ``{"at": store clock s, "total": counts, "queues": {queue: counts}, "latency":
        {"p50_ms", "p90_ms", "p99_ms", "count", "window_s"} | None}``, where counts are
        ``{"pending", "running", "done", "dead", "finished_per_s"}``: ``total`` sums every
        queue of the report, ``queues`` holds the ``charted`` ones only. ``finished_per_s`` is
        the tasks that became done or dead per second since ``previous`` (None for the first
        point, or when the clock did not move), purged and discarded ones included, so a
        purge does not show as a drop.
    """
    at = float(report["now_s"])
    before: dict[str, int] = {}
    elapsed_s = 0.0
    if previous is not None:
        before = {q["queue"]: _finished(q) for q in previous["queues"]}
        elapsed_s = at - float(previous["now_s"])
    measured = previous is not None and elapsed_s > 0
    wanted = None if charted is None else set(charted)
    total = dict.fromkeys(_COUNTS, 0)
    queues: dict[str, Any] = {}
    for q in report["queues"]:
        for k in _COUNTS:
            total[k] += q[k]
        if wanted is None or q["queue"] in wanted:
            finished = _finished(q) - before.get(q["queue"], 0)
            queues[q["queue"]] = {
                **{k: q[k] for k in _COUNTS},
                "finished_per_s": max(0.0, finished / elapsed_s) if measured else None,
            }
    total_rate: float | None = None
    if measured:
        finished_now = sum(_finished(q) for q in report["queues"])
        total_rate = max(0.0, (finished_now - sum(before.values())) / elapsed_s)
    latency = None
    windows = [lat for lat in report["latencies"] if lat["name"] == ENQUEUE_TO_COMMIT]
    if windows:
        shortest = min(windows, key=lambda lat: lat["window_s"])
        latency = {k: shortest[k] for k in ("p50_ms", "p90_ms", "p99_ms", "count", "window_s")}
    return {"at": at, "total": {**total, "finished_per_s": total_rate}, "queues": queues, "latency": latency}


def _finished(queue: Mapping[str, Any]) -> int:
    """A queue's finished tasks: done and dead now, and those purged or discarded since."""
    return int(queue["done"]) + int(queue["dead"]) + int(queue.get("removed", 0))


def busiest(
    queues: Iterable[Mapping[str, Any]],
    n: int,
    *,
    score: Callable[[Mapping[str, Any]], int],
    prefer: Collection[str] = (),
) -> list[str]:
    """The names of the ``n`` queues of highest ``score``, busiest first.

    Ties go to the queues in ``prefer`` (so a chart does not move to another queue of equal
    score at every poll), then by name.
    """
    preferred = set(prefer)
    ranked = heapq.nsmallest(n, queues, key=lambda q: (-score(q), q["queue"] not in preferred, q["queue"]))
    return [q["queue"] for q in ranked]


def _load(queue: Mapping[str, Any]) -> int:
    """What ranks a queue for a chart of its own: the tasks waiting or running in it."""
    return int(queue["pending"]) + int(queue["running"])


def _attention(queue: Mapping[str, Any]) -> int:
    """What ranks a queue for a row of the page's tables: tasks waiting, running or dead."""
    return int(queue["pending"]) + int(queue["running"]) + int(queue["dead"])


def trim_report(report: Mapping[str, Any], listed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """A copy of a status report whose queue lists hold at most ``listed`` queues; and what it left out.

    The queues kept are the ``listed`` with the most tasks pending, running or dead (ties:
    by name), in the report's order. Of ``rate_limits.queues`` it keeps those queues and any
    queue with a held bucket (the report lists at most ``held_shown_max`` of those).

    Returns:
        The trimmed report and ``{"queues": kept, "queues_total": all, "rate_limit_queues":
        kept, "rate_limit_queues_total": all}``.
    """
    queues = report["queues"]
    trimmed = dict(report)
    if len(queues) > listed:
        keep = set(busiest(queues, listed, score=_attention))
        trimmed["queues"] = [q for q in queues if q["queue"] in keep]
    else:
        keep = {q["queue"] for q in queues}
    limited = (report.get("rate_limits") or {}).get("queues")
    kept_limited = limited
    if isinstance(limited, list):
        kept_limited = [e for e in limited if e["queue"] in keep or e["held"]]
        trimmed["rate_limits"] = {**report["rate_limits"], "queues": kept_limited}
    shown = {
        "queues": len(trimmed["queues"]),
        "queues_total": len(queues),
        "rate_limit_queues": len(kept_limited) if isinstance(kept_limited, list) else 0,
        "rate_limit_queues_total": len(limited) if isinstance(limited, list) else 0,
    }
    return trimmed, shown


def _incident(alert: Mapping[str, Any]) -> tuple[str, str]:
    return (str(alert["rule"]), str(alert["scope_key"]))


class Feed:
    """Polls a snapshot source and fans the dashboard's state and changes out to subscribers.

    :class:`Feed` calls one snapshot source (in ``python -m asynccoord dashboard``: the
    :func:`~asynccoord.cli.status.status_report` of a read-only store, the very report
    ``status --json`` prints) every ``interval_s``, and keeps the dashboard's state from it: the
    latest report, a bounded history of points (the depth by status of all queues together and
    of the ``charted_queues`` busiest, the tasks finished per second since the previous point,
    the enqueue-to-commit latency quantiles), the alerts seen firing that are firing no more
    (resolved, newest first), and any number of extra sections named by the caller (rate-limit
    buckets, say), each from a source of its own. The state is one JSON object of sections; a
    change is the sections whose value changed since the previous poll plus the new history
    point, so a page applies it with one shallow merge (the shape of a JSON merge patch, RFC
    7396, at the top level only).

    The state's size does not grow with the number of queues: the ``status`` section lists
    the ``listed_queues`` queues with the most tasks pending, running or dead (section
    ``shown`` counts what it left out; the report's ``tasks`` totals count every queue), and a
    history point holds the totals and ``charted_queues`` queues, those with the most tasks
    pending or running when it was taken. So the state holds at most about
    ``history * (charted_queues + 1)`` queue counts and ``listed_queues`` queue rows.

    One poller serves every subscriber: readers of the database do not multiply with the
    browsers open, and each message is serialised once (:meth:`encoded`) for all of them. A
    subscriber that falls behind (its buffer full) is sent the whole state again instead of
    the changes it missed.

    Args:
        status: Returns the status report (a dict shaped as ``status --json``).
        sections: More sections of the state by name, each a source returning a JSON-ready
            value (or None for "nothing yet"); the names ``status``, ``history``, ``resolved``,
            ``error``, ``settings`` and ``shown`` are the feed's own. Default none.
        interval_s: Time between polls, seconds (monotonic). Default 1.0.
        history: Most history points kept. Default 600 (10 minutes at 1 s).
        resolved: Most resolved alerts kept. Default 50.
        charted_queues: Most queues with a history of their own in each point. Default 8.
        listed_queues: Most queues listed in the ``status`` section. Default 200.
        show_payloads: Let ``payload`` and ``result`` members through. Default False:
            they are replaced by a notice (:func:`redact_payloads`).

    Raises:
        InvalidArgumentError, InvalidTypeError: a bad argument, naming it.
    """

    _OWN = ("status", "history", "resolved", "error", "settings", "shown")

    def __init__(
        self,
        status: Source,
        *,
        sections: Mapping[str, Source] | None = None,
        interval_s: float = 1.0,
        history: int = 600,
        resolved: int = 50,
        charted_queues: int = 8,
        listed_queues: int = 200,
        show_payloads: bool = False,
    ) -> None:
        self._status = status
        self._sections = dict(sections or {})
        for name in self._sections:
            if name in self._OWN:
                raise InvalidArgumentError(f"sections may not be named {name!r}: the feed's own are {self._OWN!r}")
        self.interval_s = check_interval_s("interval_s", interval_s)
        self.show_payloads = bool(show_payloads)
        self.charted_queues = check_int("charted_queues", charted_queues, minimum=0)
        self.listed_queues = check_int("listed_queues", listed_queues, minimum=1)
        self._history: deque[dict[str, Any]] = deque(maxlen=check_int("history", history, minimum=2))
        self._resolved: deque[dict[str, Any]] = deque(maxlen=check_int("resolved", resolved, minimum=1))
        self._firing: dict[tuple[str, str], dict[str, Any]] = {}
        self._previous: Mapping[str, Any] | None = None  # the last report, every queue in it
        self._charted: list[str] = []
        self._state: dict[str, Any] = {
            "status": None,
            "history": [],
            "resolved": [],
            "error": None,
            "settings": {
                "interval_s": self.interval_s,
                "show_payloads": self.show_payloads,
                "history": history,
                "charted_queues": self.charted_queues,
                "listed_queues": self.listed_queues,
            },
            "shown": None,
            **dict.fromkeys(self._sections),
        }
        self._seq = 0
        self._encoded: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._subscribers: set[asyncio.Queue[Message | None]] = set()
        self._polled = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def seq(self) -> int:
        """How many polls changed the state so far."""
        return self._seq

    def state(self) -> Message:
        """The whole current state as a ``state`` message."""
        return {"type": "state", "seq": self._seq, "sections": dict(self._state)}

    def encoded(self, message: Message) -> bytes:
        """``message`` (a ``state`` or ``change`` of this feed) as compact JSON, UTF-8.

        A message is serialised once: the state at a given ``seq`` and the change that made it
        are the same for every reader, so the bytes are kept for the last few ``seq`` and
        shared by every request and stream that sends them.

        Raises:
            ValueError: a value JSON cannot carry (NaN, infinity).
        """
        key = (str(message["type"]), int(message["seq"]))
        data = self._encoded.get(key)
        if data is None:
            data = json.dumps(message, allow_nan=False, separators=(",", ":")).encode()
            self._encoded[key] = data
            while len(self._encoded) > _ENCODED_KEPT:
                self._encoded.popitem(last=False)
        return data

    async def poll(self) -> Message | None:
        """Read every source once, update the state and publish what changed.

        A source that fails does not end the feed: the error's text goes to the ``error``
        section (the page shows it) and the other sections keep their last values.

        Returns:
            The ``change`` message published, or None when nothing changed.
        """
        changed: dict[str, Any] = {}
        error: str | None = None
        try:
            report = await self._status()
        except (CoordError, OSError) as exc:
            error = f"status: {exc}"
            log.warning("asynccoord.dashboard.poll_failed source=status error=%s", exc)
        else:
            self._charted = busiest(report["queues"], self.charted_queues, score=_load, prefer=self._charted)
            point = history_point(report, self._previous, charted=self._charted)
            self._previous = report
            self._history.append(point)
            self._track_alerts(report)
            listed, shown = trim_report(report, self.listed_queues)
            changed["status"] = self._redact(listed)
            changed["history"] = [point]  # the page appends it; the state holds all of them
            if shown != self._state["shown"]:
                changed["shown"] = shown
            resolved = list(self._resolved)
            if resolved != self._state["resolved"]:
                changed["resolved"] = resolved
        for name, source in self._sections.items():
            try:
                value = self._redact(await source())
            except (CoordError, OSError) as exc:
                error = f"{name}: {exc}"
                log.warning("asynccoord.dashboard.poll_failed source=%s error=%s", name, exc)
                continue
            if value != self._state[name]:
                changed[name] = value
        if error != self._state["error"]:
            changed["error"] = error
        self._polled.set()
        if not changed:
            return None
        self._seq += 1
        for name, value in changed.items():
            self._state[name] = list(self._history) if name == "history" else value
        message: Message = {"type": "change", "seq": self._seq, "sections": changed}
        self._publish(message)
        return message

    def _redact(self, value: Any) -> Any:
        return value if self.show_payloads else redact_payloads(value)

    def _track_alerts(self, report: Mapping[str, Any]) -> None:
        """Move the incidents that were firing at the previous poll and are gone now to ``resolved``
        (a muted incident, never sent, is left out)."""
        now = {_incident(a): a for a in report["alerts"] if a.get("inhibited_by") is None}
        for key, alert in self._firing.items():
            if key not in now:
                self._resolved.appendleft({**alert, "state": "resolved", "resolved_at": report["now_s"]})
        self._firing = now

    def _publish(self, message: Message) -> None:
        for queue in list(self._subscribers):
            try:
                queue.put_nowait(message)
            except asyncio.QueueFull:  # behind: drop what it has and send the whole state next
                while not queue.empty():
                    queue.get_nowait()
                queue.put_nowait(self.state())

    async def run(self) -> None:
        """Poll every ``interval_s`` until cancelled."""
        while True:
            started = time.monotonic()
            await self.poll()
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))

    async def start(self) -> None:
        """Poll once (so the first page has data) and go on polling in a background task."""
        if self._task is None:
            await self.poll()
            self._task = asyncio.create_task(self._run_later(), name="asynccoord-dashboard-feed")

    async def _run_later(self) -> None:
        await asyncio.sleep(self.interval_s)  # start() has just polled
        await self.run()

    async def stop(self) -> None:
        """Stop polling and end every subscription. Idempotent."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for queue in list(self._subscribers):
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(None)

    @contextlib.contextmanager
    def subscription(self) -> Iterator[asyncio.Queue[Message | None]]:
        """Subscribe for the block: a queue holding the whole state, then every change.

        ``None`` from the queue means the feed stopped. A subscriber that lets its queue
        fill up finds in it the whole state instead of the changes it missed. Cancelling a
        ``get()`` of it loses nothing (``asyncio.wait_for(queue.get(), ...)`` is safe).
        """
        queue: asyncio.Queue[Message | None] = asyncio.Queue(maxsize=_SUBSCRIBER_BUFFER)
        queue.put_nowait(self.state())
        self._subscribers.add(queue)
        try:
            yield queue
        finally:
            self._subscribers.discard(queue)
