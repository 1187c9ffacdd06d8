"""The dashboard's web server (aiohttp): one page, its static files, the state as JSON and as server-sent events.

:func:`create_app` serves a :class:`~asynccoord.monitor.dashboard.feed.Feed` read-only
over ``GET`` routes, streaming changes as server-sent events (the WHATWG HTML standard's
``text/event-stream``), and refuses requests it cannot trust (:func:`check_exposure`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import html
import ipaddress
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any
from urllib.parse import quote

from aiohttp import web

from ...errors import InvalidArgumentError
from .feed import Feed

__all__ = ("MIN_TOKEN_CHARS", "Dashboard", "check_exposure", "create_app", "is_loopback", "serve")

log = logging.getLogger(__name__)

MIN_TOKEN_CHARS = 16
"""The shortest access token accepted (``secrets.token_urlsafe()`` gives 43)."""

STATIC_FILES: Mapping[str, str] = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "uPlot.iife.min.js": "text/javascript; charset=utf-8",
    "uPlot.min.css": "text/css; charset=utf-8",
    "uPlot.LICENSE": "text/plain; charset=utf-8",
}
"""The files the server reads from the package's ``static/`` folder, with their content types."""

_SECURITY_HEADERS: Mapping[str, str] = {
    "Content-Security-Policy": (
        "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
        "frame-ancestors 'none'; form-action 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

_READ_METHODS = frozenset({"GET", "HEAD"})
_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_KEEPALIVE_S = 15.0
_TOKEN = web.AppKey("token", str)
_FEED = web.AppKey("feed", Feed)
_FILES = web.AppKey("files", dict)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is reachable from this machine only."""
    if host.strip("[]").lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, token: str | None) -> str | None:
    """Check that a dashboard bound to ``host`` may start with ``token``; return the token.

    Raises:
        InvalidArgumentError: ``host`` is not a loopback address and no token is given, or
            the token is shorter than :data:`MIN_TOKEN_CHARS` or has whitespace.
    """
    if token is not None:
        if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
            raise InvalidArgumentError(
                f"the dashboard token must be at least {MIN_TOKEN_CHARS} characters without spaces, got "
                f"{len(token)} characters; make one with: python -c 'import secrets; print(secrets.token_urlsafe())'"
            )
        return token
    if not is_loopback(host):
        raise InvalidArgumentError(
            f"--host {host!r} is reachable from other machines: the dashboard refuses to serve it without an "
            "access token (--token TOKEN or the ASYNCCOORD_DASHBOARD_TOKEN environment variable)"
        )
    return None


def _host_name(header: str) -> str:
    """The host name of a ``Host`` header value, without its port."""
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def _refusal(request: web.Request, token: str) -> str | None:
    """Why the request may not be served: ``"missing"`` (no token given), ``"wrong"``; None if it may."""
    given: str | None = None
    auth = request.headers.get("Authorization", "")
    if auth[:7].lower() == "bearer ":
        given = auth[7:].strip()
    elif "token" in request.query:
        given = request.query["token"]
    if not given:
        return "missing"
    # A header's bytes that are not UTF-8 arrive as lone surrogates: encodable this way, never equal.
    return None if hmac.compare_digest(given.encode("utf-8", "surrogatepass"), token.encode()) else "wrong"


_REFUSALS = {
    "missing": "an access token is needed: Authorization: Bearer TOKEN or ?token=TOKEN\n",
    "wrong": "wrong access token: give the one the dashboard was started with (--token or "
    "ASYNCCOORD_DASHBOARD_TOKEN), as Authorization: Bearer TOKEN or ?token=TOKEN\n",
}


@web.middleware
async def _guard(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> Any:
    """Refuse writes (405), requests without the token (401) and foreign Host names on loopback (403)."""
    if request.method not in _READ_METHODS:
        raise web.HTTPMethodNotAllowed(request.method, sorted(_READ_METHODS), headers=dict(_SECURITY_HEADERS))
    token = request.app[_TOKEN]
    if token:
        refusal = _refusal(request, token)
        if refusal is not None:
            raise web.HTTPUnauthorized(
                text=_REFUSALS[refusal],
                headers={"WWW-Authenticate": 'Bearer realm="asynccoord dashboard"', **_SECURITY_HEADERS},
            )
    elif not is_loopback(_host_name(request.host)):
        raise web.HTTPForbidden(
            text="this dashboard answers only to localhost names; start it with --token to serve other names\n",
            headers=dict(_SECURITY_HEADERS),
        )
    response = await handler(request)
    if not response.prepared:
        response.headers.update(_SECURITY_HEADERS)
    return response


async def _page(request: web.Request) -> web.Response:
    token = request.app[_TOKEN]
    suffix = f"?token={quote(token, safe='')}" if token else ""
    text = request.app[_FILES]["index.html"].decode().replace("{{token_query}}", html.escape(suffix))
    return web.Response(text=text, content_type="text/html", charset="utf-8")


async def _static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in STATIC_FILES or name == "index.html":
        raise web.HTTPNotFound()
    return web.Response(body=request.app[_FILES][name], headers={"Content-Type": STATIC_FILES[name]})


async def _state(request: web.Request) -> web.Response:
    feed = request.app[_FEED]
    return web.Response(body=feed.encoded(feed.state()), content_type="application/json", charset="utf-8")


async def _stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "X-Accel-Buffering": "no", **_SECURITY_HEADERS}
    )
    with request.app[_FEED].subscription() as messages:
        try:
            await response.prepare(request)
            if request.method == "HEAD":
                return response
            await response.write(b"retry: 2000\n\n")
            while True:
                try:
                    message = await asyncio.wait_for(messages.get(), _KEEPALIVE_S)
                except TimeoutError:
                    await response.write(b": keep-alive\n\n")
                    continue
                if message is None:  # the feed stopped: the server is shutting down
                    break
                feed = request.app[_FEED]
                await response.write(b"id: %d\ndata: %s\n\n" % (message["seq"], feed.encoded(message)))
        except ConnectionError:
            pass  # the page went away
    return response


def _read_static() -> dict[str, bytes]:
    folder = resources.files(__package__).joinpath("static")
    return {name: folder.joinpath(name).read_bytes() for name in STATIC_FILES}


def create_app(feed: Feed, *, token: str | None = None) -> web.Application:
    """The dashboard's aiohttp application over ``feed`` (started and stopped by the caller).

    Routes, all ``GET`` (``HEAD`` too); any other method is answered 405, so nothing can be
    written through it:

    * ``/`` - the page (``static/index.html``); ``/static/{name}`` - its script, style and the
      vendored chart library (uPlot, MIT, its licence beside it);
    * ``/api/state`` - the whole state of the :class:`~asynccoord.monitor.dashboard.feed.Feed`;
    * ``/api/stream`` - the same as server-sent events (the WHATWG HTML standard's
      ``text/event-stream``): the state first, then one event per change.

    Both send the bytes :meth:`~asynccoord.monitor.dashboard.feed.Feed.encoded` keeps: a
    state or change is serialised once, however many pages ask for it.

    Access (:func:`check_exposure`): on a loopback address the server answers only requests
    whose ``Host`` is a loopback name (a page on another site that rebinds its DNS name to
    127.0.0.1 is refused); on any other address it needs a token, and every request must
    carry it, as ``Authorization: Bearer TOKEN`` or ``?token=TOKEN`` (the page passes it on to
    its files and stream), compared in constant time (:func:`hmac.compare_digest`).

    Args:
        feed: The state to serve.
        token: The access token every request must carry; None: none needed (loopback only,
            see :func:`check_exposure`).
    """
    app = web.Application(middlewares=[_guard])
    app[_TOKEN] = token or ""
    app[_FEED] = feed
    app[_FILES] = _read_static()
    app.router.add_get("/", _page)
    app.router.add_get("/static/{name}", _static)
    app.router.add_get("/api/state", _state)
    app.router.add_get("/api/stream", _stream)
    return app


@dataclass(frozen=True, slots=True, kw_only=True)
class Dashboard:
    """A running dashboard server.

    Attributes:
        url: Where the page is (without the token), e.g. ``http://127.0.0.1:8765/``.
        feed: Its feed (``feed.seq`` counts the changes it published).
    """

    url: str
    feed: Feed


@contextlib.asynccontextmanager
async def serve(
    feed: Feed, *, host: str = "127.0.0.1", port: int = 8765, token: str | None = None
) -> AsyncIterator[Dashboard]:
    """Start ``feed`` and serve it on ``host:port`` until the block ends.

    Args:
        feed: The state to serve (started here, stopped on exit).
        host: Address to bind. Default 127.0.0.1.
        port: TCP port; 0 picks a free one (see :attr:`Dashboard.url`). Default 8765.
        token: Access token (see :func:`check_exposure`). Default None.

    Raises:
        InvalidArgumentError: a non-loopback ``host`` without a token, or a short token.
        OSError: the address cannot be bound.
    """
    token = check_exposure(host, token)
    runner = web.AppRunner(create_app(feed, token=token), access_log=None, handle_signals=False, shutdown_timeout=2.0)
    await feed.start()
    try:
        await runner.setup()
        try:
            site = web.TCPSite(runner, host, port)
            await site.start()
            bound = runner.addresses[0]
            shown = f"[{bound[0]}]" if ":" in str(bound[0]) else str(bound[0])
            yield Dashboard(url=f"http://{shown}:{bound[1]}/", feed=feed)
        finally:
            await feed.stop()  # ends the streams, so the server's shutdown does not wait on them
            await runner.cleanup()
    finally:
        await feed.stop()
