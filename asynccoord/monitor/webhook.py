"""A webhook sink: each alert notice POSTed as JSON to a URL, retried with backoff, never blocking.

A :class:`WebhookSink` queues the monitor's notices in a bounded buffer and POSTs them in
order from a task of its own, retrying with exponential backoff and jitter (M. Brooker,
"Exponential Backoff and Jitter", AWS Architecture Blog, 2015), so a slow endpoint costs
the monitor nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import urllib.parse
from collections import deque
from collections.abc import Mapping
from typing import Any

from .._errtext import error_text
from .._printable import printable
from ..config import RetryPolicy
from ..contract.monitor import Alert
from ..errors import InvalidArgumentError, InvalidTypeError
from ..validation import check_int, check_name, check_positive, unfit_character
from .alerts import SinkStats

__all__ = ("DEFAULT_WEBHOOK_RETRY", "WebhookSink", "alert_body", "check_labels", "retry_after_s")

log = logging.getLogger(__name__)

DEFAULT_WEBHOOK_RETRY = RetryPolicy(base_s=0.5, factor=2.0, cap_s=30.0, jitter=0.5, max_attempts=5)
"""Five attempts in all, 0.5, 1, 2 and 4 s apart (each +-50 %)."""

_RETRY_STATUSES = frozenset({408, 429})
"""Answers below 500 that are worth trying again (timeout, rate limit)."""
_RETRY_AFTER_MAX_S = 300.0
"""Longest wait a receiver's ``Retry-After`` gets before the next attempt, seconds."""


def retry_after_s(value: str | None) -> float | None:
    """The seconds a ``Retry-After`` header's value asks for (RFC 9110, 10.2.3), at most
    :data:`_RETRY_AFTER_MAX_S`; None without one, or for an HTTP date (which would compare
    the receiver's wall clock with this machine's) or a malformed value."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    if not 0.0 <= seconds < float("inf"):
        return None
    return min(seconds, _RETRY_AFTER_MAX_S)


_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
"""An HTTP header name: one or more token characters (RFC 9110, section 5.1)."""
_HEADER_VALUE = re.compile(r"[^\x00-\x08\x0a-\x1f\x7f]*")
"""An HTTP header value: no control character but the horizontal tab (RFC 9110, section 5.5)."""
_FRAMING = "the sink frames the body itself"
_CONNECTION = "the HTTP client manages the connection"
_RESERVED_HEADERS = {
    "content-length": _FRAMING,
    "transfer-encoding": _FRAMING,
    "te": _FRAMING,
    "trailer": _FRAMING,
    "expect": "the HTTP client manages the exchange",
    "connection": _CONNECTION,
    "keep-alive": _CONNECTION,
    "proxy-connection": _CONNECTION,
    "upgrade": _CONNECTION,
    "host": "the url names the host",
}
"""Headers the sink (or its HTTP client) sets, by lowercase name, with the reason: given by
hand they cut the body short, stall every POST or send it elsewhere (RFC 9110, section 7.6.1;
RFC 9112, section 6)."""


def _check_headers(headers: object) -> dict[str, str]:
    """The extra headers of a :class:`WebhookSink`, checked so that no POST can refuse them.

    Raises:
        InvalidTypeError: not a mapping, or a name or value that is not a str.
        InvalidArgumentError: a name that is not an HTTP token, one the sink sets itself
            (``Content-Length``, ``Transfer-Encoding``, ``Host``, ...; any case), or a value with
            a control character (a CR or LF, as a token read from a file with its newline has).
    """
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise InvalidTypeError(f"headers must be a mapping of str to str or None, got {type(headers).__name__}")
    checked: dict[str, str] = {}
    for name, value in headers.items():
        if not isinstance(name, str):
            raise InvalidTypeError(f"headers names must be str, got {type(name).__name__} {name!r:.50}")
        if not isinstance(value, str):
            raise InvalidTypeError(f"headers[{name!r:.50}] must be a str, got {type(value).__name__}")
        if not _HEADER_NAME.fullmatch(name):
            raise InvalidArgumentError(
                f"headers name {name!r:.50} is not an HTTP header name: use letters, digits and !#$%&'*+-.^_`|~"
            )
        reason = _RESERVED_HEADERS.get(name.lower())
        if reason is not None:
            raise InvalidArgumentError(f"headers[{name!r}] is set by the sink ({reason}): leave it out")
        if not _HEADER_VALUE.fullmatch(value):
            # The value is often a secret: name the header and the character, not the value.
            bad = next(ch for ch in value if not _HEADER_VALUE.fullmatch(ch))
            raise InvalidArgumentError(
                f"headers[{name!r}] holds the control character {bad!r}: strip it (a token read from a file"
                " keeps its newline)"
            )
        checked[name] = value
    return checked


_LABEL_VALUE_MAX = 1024
"""Longest label value, characters."""


def check_labels(labels: object) -> dict[str, str]:
    """The labels of a :class:`WebhookSink`: str names (1..255 characters) to str values.

    A label is shown on the one line of the notice's ``text`` and sent in its JSON body, so
    neither its name nor its value may hold a control character (a newline, a tab, NUL,
    ESC) or a lone surrogate (no UTF-8 encodes it, and a strict JSON reader refuses its
    escape). Letters of any script, spaces and an empty value are fine.

    Returns:
        The labels, in their order, in a new dict.

    Raises:
        InvalidTypeError: not a mapping, or a name or value that is not a str.
        InvalidArgumentError: an empty or blank name, a value over 1,024 characters, or a
            control character or lone surrogate in either.
    """
    if labels is None:
        return {}
    if not isinstance(labels, Mapping):
        raise InvalidTypeError(f"labels must be a mapping of str to str or None, got {type(labels).__name__}")
    checked: dict[str, str] = {}
    for name, value in labels.items():
        if not isinstance(name, str):
            raise InvalidTypeError(f"labels names must be str, got {type(name).__name__} {name!r:.50}")
        unfit = unfit_character(name, "a label is shown on one line")
        if unfit is not None:
            raise InvalidArgumentError(f"labels name {name!r:.50} holds {unfit}")
        check_name(f"labels name {name!r:.50}", name)
        if not isinstance(value, str):
            raise InvalidTypeError(f"labels[{name!r:.50}] must be a str, got {type(value).__name__}")
        if len(value) > _LABEL_VALUE_MAX:
            raise InvalidArgumentError(
                f"labels[{name!r:.50}] is {len(value)} characters long: at most {_LABEL_VALUE_MAX}"
            )
        unfit = unfit_character(value, "a label is shown on one line")
        if unfit is not None:
            raise InvalidArgumentError(f"labels[{name!r:.50}] holds {unfit}")
        checked[name] = value
    return checked


def alert_body(alert: Alert, labels: Mapping[str, str]) -> dict[str, Any]:
    """The JSON body a :class:`WebhookSink` POSTs for ``alert``.

    ``alert.to_dict()``, plus ``labels`` (the sink's, ``{}`` when none) and ``text``, the
    line chat tools show: :meth:`~asynccoord.contract.monitor.Alert.describe`, after the
    labels as ``[name=value ...]`` when there are any, so the message says which cluster
    it comes from.
    """
    text = alert.describe()
    if labels:
        text = "[" + " ".join(f"{name}={value}" for name, value in labels.items()) + "] " + text
    return {**alert.to_dict(), "labels": dict(labels), "text": text}


def _where(url: str) -> str:
    """``scheme://host[:port]`` of ``url``: its path and query often carry a secret token."""
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")


def _authority(url: str) -> str:
    """``scheme://host[:port]`` of ``url`` as written, without credentials, path or query: for a
    URL that :mod:`urllib.parse` cannot read (its host or port is malformed)."""
    scheme, _, rest = url.partition("://")
    netloc = re.split(r"[/?#]", rest, maxsplit=1)[0].rpartition("@")[2]
    return f"{scheme}://{netloc}"[:120]


def _check_url(url: str) -> None:
    """Refuse ``url`` unless it is an ``http(s)://`` URL with a host and, if it names one, a port
    in 1..65535 (checked here, or the first notice would fail on it, and the log line with it).

    A control character anywhere in it (a URL read from a file with its newline) is refused:
    :mod:`urllib.parse` drops a tab, CR or LF without a word, so the URL checked would not be
    the one given. So is whitespace in its host (``http://exa mple.com``): no DNS name holds
    any, and every notice would be tried as a failed lookup until given up.

    Raises:
        InvalidArgumentError: the URL is malformed, names no host, is not http(s), or holds a
            control character or a host with whitespace, naming it without its credentials,
            path and query.
    """
    unfit = unfit_character(url, "urllib drops a tab, CR or LF unseen")
    if unfit is not None:
        raise InvalidArgumentError(f"url must not hold {unfit}, got {_authority(url)!r}")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port  # a port out of range or not a number raises here
    except ValueError as exc:  # an unclosed IPv6 bracket, a bad port
        raise InvalidArgumentError(
            f"url must be an http:// or https:// URL with a host and a port in 1..65535: {exc}, got {_authority(url)!r}"
        ) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        shown = _where(url) if parts.hostname else url[:80]  # no host: no credentials or token to hide
        raise InvalidArgumentError(f"url must be an http:// or https:// URL with a host, got {shown!r}")
    if port == 0:
        raise InvalidArgumentError(f"url must name a port in 1..65535, got 0 in {_where(url)!r}")
    if any(ch.isspace() for ch in parts.hostname):
        raise InvalidArgumentError(f"url's host must not hold whitespace (no DNS name does), got {_where(url)!r}")


class WebhookSink:
    """POST every alert notice as JSON to ``url``, in a task of its own.

    ::

        sink = WebhookSink("https://hooks.example.com/T0/B0/secret")
        async with Monitor(store, sinks=[sink]) as monitor:
            ...
        sink.statistics().given_up   # notices that never got a 2xx answer

    Handing a notice over (:meth:`WebhookSink.offer`) only appends it to a bounded queue; one
    task of the sink's own POSTs the queue in order, so a slow or unreachable endpoint costs
    the monitor nothing and the nodes even less. When the queue is full the oldest notice is
    dropped and counted. A POST that fails (a connection error, a timeout, HTTP 408, 429 or
    5xx) is tried again after exponential backoff with jitter (M. Brooker, "Exponential
    Backoff and Jitter", AWS Architecture Blog, 2015; :class:`~asynccoord.config.RetryPolicy`),
    or after the answer's ``Retry-After`` (in seconds, up to 300) when that is longer (the
    notices behind it wait: they go out in order), up to ``retry.max_attempts`` attempts in
    all; any other answer than 2xx is not tried again, nor is an error other than a network
    failure (a request the HTTP client refused to send): it costs that notice, never the sink.
    Every failed attempt, and every notice given up, is counted and logged at WARNING as
    ``asynccoord.monitor.webhook_failed``; the URL is logged without its path and query,
    which often hold a secret.

    The body is the notice's :meth:`~asynccoord.contract.monitor.Alert.to_dict` with a
    ``labels`` object (the sink's ``labels``, ``{}`` without) and a ``text`` field holding
    :meth:`~asynccoord.contract.monitor.Alert.describe` after the labels (which chat tools'
    incoming webhooks show as the message): :func:`alert_body`. Labels name the cluster
    (``labels={"cluster": "prod", "db": "orders"}``): the notice itself names no database,
    and a cluster rule's count (``dead_letters``, say) spans every queue of the store, since
    events are counted without their queue (``status`` and ``dead`` list dead tasks by
    queue). HTTP is aiohttp's client: the ``webhook`` extra (``pip install
    'asynccoord[webhook]'``).

    Give it to a :class:`~asynccoord.monitor.monitor.Monitor` (``sinks=[...]``): the
    monitor starts it, offers it each notice and closes it. On its own: ``await
    sink.start()``, :meth:`offer`, ``await sink.aclose()``.

    Args:
        url: An ``http://`` or ``https://`` URL with a host (and a port, if it names one, in
            1..65535).
        timeout_s: Longest one POST may take, connection included, seconds (> 0). Default 5.
        retry: Backoff between attempts and ``max_attempts`` (attempts in all, the first
            included). Default :data:`DEFAULT_WEBHOOK_RETRY`.
        queue_size: Notices kept waiting before the oldest is dropped (>= 1). Default 100.
        headers: Extra HTTP headers (an ``Authorization`` header, say): str names that are
            HTTP tokens, str values without control characters. Not the headers that frame
            the request or manage the connection (``Content-Length``, ``Transfer-Encoding``,
            ``TE``, ``Trailer``, ``Expect``, ``Connection``, ``Keep-Alive``,
            ``Proxy-Connection``, ``Upgrade``), nor ``Host`` (the URL names it), in any case.
            ``Content-Type`` may replace the default ``application/json`` (with a charset,
            say); the body stays JSON. Default none.
        labels: Names (str, 1..255 characters) to values (str, at most 1,024 characters)
            sent with every notice, in the body's ``labels`` and at the start of its
            ``text``; no control character or lone surrogate in either
            (:func:`check_labels`). Default none.

    Raises:
        InvalidArgumentError, InvalidTypeError: a bad argument (a header value with a
            newline, say).
        ImportError: aiohttp is not installed (``pip install 'asynccoord[webhook]'``).
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 5.0,
        retry: RetryPolicy = DEFAULT_WEBHOOK_RETRY,
        queue_size: int = 100,
        headers: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        if not isinstance(url, str):
            raise InvalidTypeError(f"url must be a str, got {type(url).__name__}")
        _check_url(url)
        if not isinstance(retry, RetryPolicy):
            raise InvalidTypeError(f"retry must be a RetryPolicy, got {type(retry).__name__}")
        checked_headers = _check_headers(headers)
        checked_labels = check_labels(labels)
        try:
            import aiohttp
        except ImportError as exc:
            raise ImportError("the webhook sink needs aiohttp: pip install 'asynccoord[webhook]'") from exc
        self._aiohttp = aiohttp
        self.url = url
        self.timeout_s = check_positive("timeout_s", timeout_s)
        self.retry = retry
        self.queue_size = check_int("queue_size", queue_size, minimum=1)
        self.headers = checked_headers
        self.labels = checked_labels
        self._queue: deque[Alert] = deque()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._sending = False
        self._session: Any = None
        self._closed = False
        self._delivered = self._failed_attempts = self._given_up = self._dropped = 0

    def __repr__(self) -> str:
        s = self.statistics()
        return f"<WebhookSink {_where(self.url)} queued={s.queued} delivered={s.delivered} failures={s.failures}>"

    async def start(self) -> None:
        """Open the HTTP session and start the sending task (idempotent)."""
        if self._task is not None or self._closed:
            return
        self._session = self._aiohttp.ClientSession(timeout=self._aiohttp.ClientTimeout(total=self.timeout_s))
        self._task = asyncio.get_running_loop().create_task(self._run(), name="asynccoord-monitor-webhook")

    def offer(self, alert: Alert) -> None:
        """Queue ``alert`` for sending; returns at once (a full queue drops its oldest notice)."""
        if self._closed:
            self._dropped += 1
            return
        if len(self._queue) >= self.queue_size:
            self._queue.popleft()
            self._dropped += 1
        self._queue.append(alert)
        self._idle.clear()
        self._wake.set()

    async def aclose(self, timeout_s: float = 5.0) -> None:
        """Send what is queued for at most ``timeout_s`` seconds, then stop; what is left is dropped.

        Idempotent. Cancellation of the caller cancels the wait, and the sink still stops.
        """
        self._closed = True
        task, self._task = self._task, None
        try:
            if task is not None:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(check_positive("timeout_s", timeout_s)):
                        await self._idle.wait()
        finally:
            if task is not None:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
                except Exception:  # the task is gone either way; what it held is counted below
                    log.exception("asynccoord.monitor.webhook_failed url=%s error=sending task died", _where(self.url))
            self._dropped += len(self._queue)
            self._queue.clear()
            self._idle.set()
            session, self._session = self._session, None
            if session is not None:
                await session.close()

    def statistics(self) -> SinkStats:
        """A snapshot of the sink's counters."""
        return SinkStats(
            delivered=self._delivered,
            failed_attempts=self._failed_attempts,
            given_up=self._given_up,
            dropped=self._dropped,
            queued=len(self._queue) + self._sending,
        )

    async def _run(self) -> None:
        while True:
            while not self._queue:
                self._idle.set()
                self._wake.clear()
                await self._wake.wait()
            alert = self._queue.popleft()
            self._sending = True
            try:
                await self._send(alert)
            except asyncio.CancelledError:
                self._dropped += 1  # closed while sending it
                raise
            except Exception as exc:  # a bug here must cost this notice only, never the sink's task
                self._failed_attempts += 1
                self._given_up += 1
                log.exception(
                    "asynccoord.monitor.webhook_failed url=%s rule=%s error=%s gave_up=1",
                    _where(self.url),
                    alert.rule,
                    printable(error_text(exc)),
                )
            finally:
                self._sending = False

    async def _send(self, alert: Alert) -> None:
        """POST ``alert`` until a 2xx answer, a final refusal, or ``retry.max_attempts`` attempts."""
        body = alert_body(alert, self.labels)
        aiohttp = self._aiohttp
        for attempt in range(1, self.retry.max_attempts + 1):
            try:
                async with self._session.post(self.url, json=body, headers=self.headers) as response:
                    status = int(response.status)
                    asked_s = retry_after_s(response.headers.get("Retry-After"))
                    await response.read()
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                error, again, asked_s = error_text(exc), True, None
            except Exception as exc:  # not a network failure: the request itself is refused, again would be too
                error, again, asked_s = error_text(exc), False, None
            else:
                if 200 <= status < 300:
                    self._delivered += 1
                    return
                error, again = f"HTTP {status}", status >= 500 or status in _RETRY_STATUSES
            self._failed_attempts += 1
            last = attempt == self.retry.max_attempts or not again
            log.warning(
                "asynccoord.monitor.webhook_failed url=%s rule=%s state=%s attempt=%d error=%s%s",
                _where(self.url),
                alert.rule,
                alert.state.value,
                attempt,
                printable(error),
                " gave_up=1" if last else "",
            )
            if last:
                self._given_up += 1
                return
            # The backoff, or longer when the receiver said when to come back (a 429's or 503's Retry-After).
            await asyncio.sleep(max(self.retry.delay_s(attempt), asked_s or 0.0))
