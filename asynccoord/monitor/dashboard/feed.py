"""The dashboard's data: status snapshots polled once, turned into a state and a stream of changes.

One :class:`Feed` polls one snapshot source for every browser, keeps the dashboard's state
as one JSON object of sections, and streams each change as the sections that changed, in
the shape of a top-level JSON merge patch (RFC 7396).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

from ...errors import CoordError, InvalidArgumentError
from ...validation import check_int, check_interval_s

__all__ = ("ENQUEUE_TO_COMMIT", "Feed", "Message", "redact_payloads")

log = logging.getLogger(__name__)

ENQUEUE_TO_COMMIT = "enqueue_to_commit_ms"
"""The latency the page charts: from a task's enqueue to its commit (node-recorded)."""

Message = dict[str, Any]
"""One message of the stream: ``{"type": "state" | "change", "seq": int, ...}``."""

Source = Callable[[], Awaitable[Any]]

HIDDEN = "(hidden: start the dashboard with --show-payloads to see payloads)"
"""What stands in for a task payload the page is not allowed to show."""

_SUBSCRIBER_BUFFER = 32


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


def history_point(report: Mapping[str, Any], previous: Mapping[str, Any] | None) -> dict[str, Any]:
    """One point of the history charts from a status report (and the report before it).

    Returns:
        ``{"at": store clock s, "queues": {queue: {"pending", "running", "done", "dead",
        "finished_per_s"}}, "latency": {"p50_ms", "p90_ms", "p99_ms", "count"} | None}``;
        ``finished_per_s`` is the tasks that became done or dead per second since
        ``previous`` (None for the first point, or when the clock did not move).
    """
    at = float(report["now_s"])
    before: dict[str, Any] = {}
    elapsed_s = 0.0
    if previous is not None:
        before = {q["queue"]: q for q in previous["queues"]}
        elapsed_s = at - float(previous["now_s"])
    queues: dict[str, Any] = {}
    for q in report["queues"]:
        rate: float | None = None
        old = before.get(q["queue"])
        if previous is not None and elapsed_s > 0:
            finished = q["done"] + q["dead"] - (old["done"] + old["dead"] if old else 0)
            rate = max(0.0, finished / elapsed_s)
        queues[q["queue"]] = {
            "pending": q["pending"],
            "running": q["running"],
            "done": q["done"],
            "dead": q["dead"],
            "finished_per_s": rate,
        }
    latency = None
    windows = [lat for lat in report["latencies"] if lat["name"] == ENQUEUE_TO_COMMIT]
    if windows:
        shortest = min(windows, key=lambda lat: lat["window_s"])
        latency = {k: shortest[k] for k in ("p50_ms", "p90_ms", "p99_ms", "count", "window_s")}
    return {"at": at, "queues": queues, "latency": latency}


def _incident(alert: Mapping[str, Any]) -> tuple[str, str]:
    return (str(alert["rule"]), str(alert["scope_key"]))


class Feed:
    """Polls a snapshot source and fans the dashboard's state and changes out to subscribers.

    :class:`Feed` calls one snapshot source (in ``python -m asynccoord dashboard``: the
    :func:`~asynccoord.cli.status.status_report` of a read-only store, the very report
    ``status --json`` prints) every ``interval_s``, and keeps the dashboard's state from it: the
    latest report, a bounded history of points (per queue the depth by status and the tasks
    finished per second since the previous point; the enqueue-to-commit latency quantiles),
    the alerts seen firing that are firing no more (resolved, newest first), and any number of
    extra sections named by the caller (rate-limit buckets, say), each from a source of its
    own. The state is one JSON object of sections; a change is the sections whose value
    changed since the previous poll plus the new history point, so a page applies it with one
    shallow merge (the shape of a JSON merge patch, RFC 7396, at the top level only).

    One poller serves every subscriber: readers of the database do not multiply with the
    browsers open. A subscriber that falls behind (its buffer full) is sent the whole state
    again instead of the changes it missed.

    Args:
        status: Returns the status report (a dict shaped as ``status --json``).
        sections: More sections of the state by name, each a source returning a JSON-ready
            value (or None for "nothing yet"); the names ``status``, ``history``, ``resolved``,
            ``error`` and ``settings`` are the feed's own. Default none.
        interval_s: Time between polls, seconds (monotonic). Default 1.0.
        history: Most history points kept. Default 600 (10 minutes at 1 s).
        resolved: Most resolved alerts kept. Default 50.
        show_payloads: Let ``payload`` and ``result`` members through. Default False:
            they are replaced by a notice (:func:`redact_payloads`).

    Raises:
        InvalidArgumentError, InvalidTypeError: a bad argument, naming it.
    """

    _OWN = ("status", "history", "resolved", "error", "settings")

    def __init__(
        self,
        status: Source,
        *,
        sections: Mapping[str, Source] | None = None,
        interval_s: float = 1.0,
        history: int = 600,
        resolved: int = 50,
        show_payloads: bool = False,
    ) -> None:
        self._status = status
        self._sections = dict(sections or {})
        for name in self._sections:
            if name in self._OWN:
                raise InvalidArgumentError(f"sections may not be named {name!r}: the feed's own are {self._OWN!r}")
        self.interval_s = check_interval_s("interval_s", interval_s)
        self.show_payloads = bool(show_payloads)
        self._history: deque[dict[str, Any]] = deque(maxlen=check_int("history", history, minimum=2))
        self._resolved: deque[dict[str, Any]] = deque(maxlen=check_int("resolved", resolved, minimum=1))
        self._firing: dict[tuple[str, str], dict[str, Any]] = {}
        self._state: dict[str, Any] = {
            "status": None,
            "history": [],
            "resolved": [],
            "error": None,
            "settings": {"interval_s": self.interval_s, "show_payloads": self.show_payloads},
            **dict.fromkeys(self._sections),
        }
        self._seq = 0
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
            log.warning("dashboard_poll_failed source=status error=%s", exc)
        else:
            report = self._redact(report)
            previous = self._state["status"]
            point = history_point(report, previous)
            self._history.append(point)
            self._track_alerts(report)
            changed["status"] = report
            changed["history"] = [point]  # the page appends it; the state holds all of them
            resolved = list(self._resolved)
            if resolved != self._state["resolved"]:
                changed["resolved"] = resolved
        for name, source in self._sections.items():
            try:
                value = self._redact(await source())
            except (CoordError, OSError) as exc:
                error = f"{name}: {exc}"
                log.warning("dashboard_poll_failed source=%s error=%s", name, exc)
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
        """Move the incidents that were firing at the previous poll and are gone now to ``resolved``."""
        now = {_incident(a): a for a in report["alerts"]}
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
            self._task = asyncio.create_task(self.run(), name="asynccoord-dashboard-feed")

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
