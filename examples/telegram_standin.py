"""A local stand-in of the Telegram Bot API, and the self-check that runs a bot example's processes against it.

The stand-in is a small aiohttp server on 127.0.0.1 that answers ``getMe``, ``getUpdates``
(long polling; a scripted stream of incoming messages), ``sendMessage`` and the few calls
the frameworks make on start (``deleteWebhook``, ``getWebhookInfo``), at the same URLs as
``https://api.telegram.org/bot<token>/<method>``. aiogram and python-telegram-bot can both
be pointed at another API server, so their real clients talk to it unchanged. It applies
Telegram's flood limits (FAQ "My bot is hitting limits, how do I avoid this?": about 30
messages per second per bot, one per second per chat with short bursts, 20 per minute per
group), each as the Generic Cell Rate Algorithm (ITU-T I.371) with a small allowance for
network jitter, and refuses with Telegram's real 429 shape
``{"ok": false, "error_code": 429, "description": "Too Many Requests: retry after N",
"parameters": {"retry_after": N}}`` (or, with ``bare_429``, the same without ``parameters``). It
can also play an outage: ``sendMessage`` answering 502 Bad Gateway for a while. It records
every message it accepts (chat, text, the message it replies to, time on CLOCK_MONOTONIC)
and every refusal, so a check can count answers, duplicates and order, and read windows.

The incoming messages are the first lines of the Chit-Chat sample bundled with asynccoord
(``asynccoord/demo/data/chitchat_sample.jsonl.gz``; structure only, MIT License, Copyright
(c) 2019 Perception, Control and Cognition Lab; the notice is
``asynccoord/demo/data/NOTICE.md``): each conversation becomes a chat (every third one a
group), each message arrives at its trace time sped up, with the text ``message <seq>``.

The stand-in's clock may run faster than real time (``time_scale``, for quick checks):
messages then arrive, the limits refill and a Retry-After counts that many times faster,
and a bot run against it divides its own declared limits and a 429's Retry-After by the
same factor (the examples' ``--time-scale``). Network time (the jitter allowed, the
latency of a call) stays real.

Run ``python examples/telegram_standin.py`` to see a burst to one chat meet a 429, or
``python examples/telegram_standin.py --serve --port 8081`` to serve until Ctrl-C, e.g. for
``python examples/aiogram_bot.py bot --api-server http://127.0.0.1:8081``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from aiohttp import ClientSession, web

from asynccoord.demo.trace import bundled_sample, read_trace

__all__ = (
    "TELEGRAM_LIMITS",
    "BotAPIStandIn",
    "Incoming",
    "Limit",
    "Outcome",
    "Refusal",
    "Run",
    "Sent",
    "run_bot_processes",
    "self_check",
)

TOKEN = "123456:stand-in-token"
"""A token of the right form (``<bot id>:<secret>``) for runs against the stand-in."""


def monotonic() -> float:
    """CLOCK_MONOTONIC, seconds: one clock for every process of the machine."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


@dataclass(frozen=True, slots=True)
class Limit:
    """At most ``count`` messages per ``per_s`` seconds per key, with bursts of ``burst`` (GCRA)."""

    count: int
    per_s: float
    burst: int = 1

    @property
    def interval_s(self) -> float:
        return self.per_s / self.count

    @property
    def tolerance_s(self) -> float:
        return (self.burst - 1) * self.interval_s

    def faster(self, time_scale: float) -> Limit:
        """The same limit on a clock ``time_scale`` times faster than real time (``per_s`` divided by it)."""
        return Limit(self.count, self.per_s / time_scale, self.burst)


TELEGRAM_LIMITS: Mapping[str, Limit] = {
    "account": Limit(30, 1.0, burst=5),  # about 30 messages per second per bot
    "chat": Limit(1, 1.0, burst=3),  # one per second per chat, short bursts tolerated
    "group": Limit(20, 60.0, burst=3),  # 20 per minute per group
}
"""Telegram's published flood limits, by dimension, as the stand-in applies them."""


@dataclass(frozen=True, slots=True)
class Incoming:
    """A message a user sends the bot: delivered by ``getUpdates`` from ``due_s`` after the first poll."""

    update_id: int
    chat_id: int
    chat_type: str
    message_id: int
    user_id: int
    text: str
    due_s: float


@dataclass(frozen=True, slots=True)
class Sent:
    """A message the stand-in accepted from the bot."""

    chat_id: int
    message_id: int
    text: str
    reply_to: int | None
    t_mono: float


@dataclass(frozen=True, slots=True)
class Refusal:
    """A ``sendMessage`` refused with 429: which limit, the Retry-After given (whole seconds of the
    stand-in's clock), and ``wait_s``, the real seconds it asks for (``retry_after_s / time_scale``)."""

    chat_id: int
    dimension: str
    retry_after_s: int
    t_mono: float
    wait_s: float


@dataclass(slots=True)
class Outcome:
    """What the bot did with the incoming messages, as the stand-in saw it."""

    incoming: int
    answered: int
    duplicates: int
    out_of_order: list[int]
    refusals: int
    unexpected: int

    @property
    def missing(self) -> int:
        return self.incoming - self.answered


def _incoming_messages(messages: int, group_every: int, speedup: float) -> list[Incoming]:
    """The first ``messages`` messages of the bundled trace, as Telegram messages to the bot."""
    trace = list(read_trace(bundled_sample(), limit=messages))
    chats: dict[str, tuple[int, str]] = {}
    users: dict[str, int] = {}
    next_message_id: defaultdict[int, int] = defaultdict(lambda: 1)
    start = trace[0].ts_unix if trace else 0
    out: list[Incoming] = []
    for update_id, m in enumerate(trace, start=1):
        if m.conversation_id not in chats:
            n = len(chats)
            group = group_every > 0 and n % group_every == group_every - 1
            chats[m.conversation_id] = (-(1_000_000 + n), "group") if group else (10_000 + n, "private")
        chat_id, chat_type = chats[m.conversation_id]
        user_id = users.setdefault(m.sender_id, 500_000 + len(users))
        message_id = next_message_id[chat_id]
        next_message_id[chat_id] += 1
        text = f"message {m.seq}"
        due_s = (m.ts_unix - start) / speedup
        out.append(Incoming(update_id, chat_id, chat_type, message_id, user_id, text, due_s))
    return out


class BotAPIStandIn:
    """The Bot API on 127.0.0.1, for one bot (any token of the right form), with Telegram's limits.

    Args:
        messages: How many messages of the bundled trace users send. Default 60.
        speedup: Trace time is divided by this (60 messages over 113 s of trace arrive in
            about 5.7 s at 20, before ``time_scale``). Default 20.
        group_every: Every n-th conversation is a group chat (0: none). Default 3.
        limits: The limits by dimension ``account``, ``chat``, ``group``; a missing one is
            not applied. Default :data:`TELEGRAM_LIMITS`.
        jitter_s: How early a message may come and still conform, seconds: allows for the
            time between a sender's own limiter and the message's arrival. Default 0.2.
        latency_s: How long a ``sendMessage`` takes to answer, seconds; the message is
            accepted (recorded) when it arrives, as a server that processed a request
            whose client then died. Default 0.05.
        port: The TCP port on 127.0.0.1; 0 for a free one. Default 0.
        time_scale: How many times faster than real time the stand-in's clock runs (> 0):
            the messages' arrival times and the limits' periods are divided by it, and a
            Retry-After counts whole seconds of that clock. ``jitter_s`` and ``latency_s``
            stay real time. Default 1 (Telegram's own pace).
        send_outage_s: For this long from the first ``sendMessage``, seconds of the stand-in's
            clock, every ``sendMessage`` is answered ``502 Bad Gateway`` and nothing is sent:
            Telegram down for the bot's replies (``getUpdates`` keeps working, so a check of
            the sending side does not wait on the framework's polling backoff). Default 0.
        bare_429: Refuse for rate with a 429 that has no ``parameters`` (no Retry-After),
            which the frameworks raise as a plain API or network error. Default False.

    Attributes:
        incoming: The scripted messages, in update order.
        sent: Every message accepted, in order of arrival.
        refusals: Every 429 given.
        refused_chats: Chat ids whose ``sendMessage`` is refused for good, by HTTP code: 403 (the
            user blocked the bot) or 400 (a message Telegram cannot take). Empty at first; set
            it before the run.
        refused: Every ``sendMessage`` refused so, as (chat id, message replied to, code).
        outage_errors: ``sendMessage`` calls answered 502 during the outage.
        polls: ``getUpdates`` calls answered.
        in_progress: ``sendMessage`` calls accepted and not yet answered.
    """

    def __init__(
        self,
        *,
        messages: int = 60,
        speedup: float = 20.0,
        group_every: int = 3,
        limits: Mapping[str, Limit] = TELEGRAM_LIMITS,
        jitter_s: float = 0.2,
        latency_s: float = 0.05,
        port: int = 0,
        time_scale: float = 1.0,
        send_outage_s: float = 0.0,
        bare_429: bool = False,
    ) -> None:
        if not time_scale > 0 or math.isinf(time_scale):
            raise ValueError(f"time_scale must be a finite number > 0, got {time_scale!r}")
        if not 0 <= send_outage_s < math.inf:
            raise ValueError(f"send_outage_s must be a finite number >= 0, got {send_outage_s!r}")
        self.port = port
        self.latency_s = latency_s
        self.time_scale = time_scale
        self.in_progress = 0
        self.incoming = _incoming_messages(messages, group_every, speedup * time_scale)
        self.limits = {dimension: limit.faster(time_scale) for dimension, limit in limits.items()}
        self.jitter_s = jitter_s
        self.sent: list[Sent] = []
        self.refusals: list[Refusal] = []
        self.refused_chats: dict[int, int] = {}
        self.refused: list[tuple[int, int | None, int]] = []
        self.send_outage_s = send_outage_s
        self.bare_429 = bare_429
        self.outage_errors = 0
        self._first_send_at: float | None = None
        self.polls = 0
        self.url = ""
        self._chats = {m.chat_id: m.chat_type for m in self.incoming}
        self._tat: dict[tuple[str, int], float] = {}
        self._next_message_id: defaultdict[int, int] = defaultdict(lambda: 10_000)
        self._started_at: float | None = None
        self._closing = asyncio.Event()
        self._arrived = asyncio.Event()
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        """Serve on 127.0.0.1; return the base URL, e.g. ``http://127.0.0.1:8081``."""
        app = web.Application()
        app.router.add_route("*", "/bot{token}/{method}", self._dispatch)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self.url

    async def close(self) -> None:
        """Stop serving; long polls in progress return at once."""
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> BotAPIStandIn:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- what the bot did -------------------------------------------------------------

    def answered(self) -> int:
        """Incoming messages with at least one reply."""
        wanted = {(m.chat_id, m.message_id) for m in self.incoming}
        return len(wanted & {(s.chat_id, s.reply_to) for s in self.sent})

    async def wait_answered(self, timeout_s: float) -> bool:
        """Wait until every incoming message has a reply, or its reply was refused for good; False on timeout."""
        deadline = monotonic() + timeout_s
        while self.answered() + len({(c, r) for c, r, _ in self.refused}) < len(self.incoming):
            if monotonic() >= deadline:
                return False
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), min(0.5, deadline - monotonic()))
        return True

    def outcome(self) -> Outcome:
        """Answers, duplicates (replies beyond the first to one message), chats out of order, 429s."""
        wanted = {(m.chat_id, m.message_id) for m in self.incoming}
        replies: defaultdict[tuple[int, int | None], int] = defaultdict(int)
        order: defaultdict[int, list[int]] = defaultdict(list)
        unexpected = 0
        for s in self.sent:
            if (s.chat_id, s.reply_to) not in wanted or s.reply_to is None:
                unexpected += 1
                continue
            replies[(s.chat_id, s.reply_to)] += 1
            seq = order[s.chat_id]
            if not seq or seq[-1] != s.reply_to:  # a repeat straight after its first copy keeps the order
                seq.append(s.reply_to)
        out_of_order = sorted(chat for chat, seq in order.items() if seq != sorted(set(seq)))
        return Outcome(
            incoming=len(self.incoming),
            answered=len(replies),
            duplicates=sum(n - 1 for n in replies.values()),
            out_of_order=out_of_order,
            refusals=len(self.refusals),
            unexpected=unexpected,
        )

    # -- the API ----------------------------------------------------------------------

    async def _dispatch(self, request: web.Request) -> web.Response:
        token, method = request.match_info["token"], request.match_info["method"]
        bot_id, _, secret = token.partition(":")
        if not bot_id.isdigit() or not secret:
            return _error(401, "Unauthorized")
        params = await _params(request)
        handler = {
            "getMe": self._get_me,
            "getUpdates": self._get_updates,
            "sendMessage": self._send_message,
            "deleteWebhook": self._true,
            "getWebhookInfo": self._webhook_info,
        }.get(method)
        if handler is None:
            return _error(404, "Not Found")
        return await handler(int(bot_id), params)

    async def _get_me(self, bot_id: int, params: dict[str, Any]) -> web.Response:
        me = {"id": bot_id, "is_bot": True, "first_name": "Stand-in", "username": "standin_bot"}
        return _ok({**me, "can_join_groups": True, "can_read_all_group_messages": False})

    async def _true(self, bot_id: int, params: dict[str, Any]) -> web.Response:
        return _ok(True)

    async def _webhook_info(self, bot_id: int, params: dict[str, Any]) -> web.Response:
        return _ok({"url": "", "has_custom_certificate": False, "pending_update_count": 0})

    async def _get_updates(self, bot_id: int, params: dict[str, Any]) -> web.Response:
        self.polls += 1
        if self._started_at is None:
            self._started_at = monotonic()
        offset = int(params.get("offset", 0) or 0)
        limit = min(max(int(params.get("limit", 100) or 100), 1), 100)
        timeout_s = min(float(params.get("timeout", 0) or 0), 50.0)
        deadline = monotonic() + timeout_s
        while True:
            now = monotonic() - self._started_at
            ready = [m for m in self.incoming if m.update_id >= offset and m.due_s <= now][:limit]
            if ready or monotonic() >= deadline or self._closing.is_set():
                return _ok([self._update(m) for m in ready])
            later = [m.due_s for m in self.incoming if m.update_id >= offset and m.due_s > now]
            wait_s = min([deadline - monotonic(), *(d - now for d in later[:1])])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), max(wait_s, 0.001))

    def _update(self, m: Incoming) -> dict[str, Any]:
        chat: dict[str, Any] = {"id": m.chat_id, "type": m.chat_type}
        if m.chat_type == "group":
            chat["title"] = f"group {-m.chat_id}"
        else:
            chat["first_name"] = f"user {m.user_id}"
        user = {"id": m.user_id, "is_bot": False, "first_name": f"user {m.user_id}"}
        date = int(time.time())
        message = {"message_id": m.message_id, "date": date, "chat": chat, "from": user, "text": m.text}
        return {"update_id": m.update_id, "message": message}

    async def _send_message(self, bot_id: int, params: dict[str, Any]) -> web.Response:
        try:
            chat_id = int(params["chat_id"])
            text = str(params["text"])
        except (KeyError, ValueError):
            return _error(400, "Bad Request: chat_id and text are required")
        if chat_id not in self._chats:
            return _error(400, "Bad Request: chat not found")
        now = monotonic()
        if self._first_send_at is None:
            self._first_send_at = now
        if (now - self._first_send_at) * self.time_scale < self.send_outage_s:
            self.outage_errors += 1
            return _error(502, "Bad Gateway")
        code = self.refused_chats.get(chat_id)
        if code is not None:
            self.refused.append((chat_id, _reply_to(params), code))
            self._arrived.set()
            if code == 403:
                return _error(403, "Forbidden: bot was blocked by the user")
            return _error(400, "Bad Request: message is too long")
        buckets = [("account", bot_id), ("chat", chat_id)]
        if self._chats[chat_id] == "group":
            buckets.append(("group", chat_id))
        waits: dict[str, float] = {}
        for dimension, key in buckets:
            limit = self.limits.get(dimension)
            tat = self._tat.get((dimension, key))
            if limit is not None and tat is not None and tat - limit.tolerance_s - self.jitter_s > now:
                waits[dimension] = tat - limit.tolerance_s - now
        if waits:
            dimension = max(waits, key=lambda d: waits[d])
            retry_after_s = max(1, math.ceil(waits[dimension] * self.time_scale))  # in the stand-in's seconds
            self.refusals.append(Refusal(chat_id, dimension, retry_after_s, now, retry_after_s / self.time_scale))
            body: dict[str, Any] = {"ok": False, "error_code": 429, "description": "Too Many Requests"}
            if not self.bare_429:
                body["description"] += f": retry after {retry_after_s}"
                body["parameters"] = {"retry_after": retry_after_s}
            return web.json_response(body, status=429)
        for dimension, key in buckets:
            limit = self.limits.get(dimension)
            if limit is not None:
                self._tat[(dimension, key)] = max(self._tat.get((dimension, key), now), now) + limit.interval_s
        reply_to = _reply_to(params)
        message_id = self._next_message_id[chat_id]
        self._next_message_id[chat_id] += 1
        self.sent.append(Sent(chat_id, message_id, text, reply_to, now))
        self._arrived.set()
        self.in_progress += 1
        try:
            await asyncio.sleep(self.latency_s)
        finally:
            self.in_progress -= 1
        chat = {"id": chat_id, "type": self._chats[chat_id]}
        me = {"id": bot_id, "is_bot": True, "first_name": "Stand-in", "username": "standin_bot"}
        return _ok({"message_id": message_id, "date": int(time.time()), "chat": chat, "from": me, "text": text})


async def _params(request: web.Request) -> dict[str, Any]:
    """The call's parameters, from the query string, a form (url-encoded or multipart) or a JSON body."""
    params: dict[str, Any] = dict(request.query)
    if request.content_type == "application/json":
        body = await request.json()
        if isinstance(body, dict):
            params.update(body)
    elif request.can_read_body:
        form = await request.post()
        params.update({k: v for k, v in form.items() if isinstance(v, str)})
    return params


def _reply_to(params: dict[str, Any]) -> int | None:
    """The message a ``sendMessage`` replies to: ``reply_parameters.message_id`` or ``reply_to_message_id``."""
    reply = params.get("reply_parameters")
    if isinstance(reply, str):
        with contextlib.suppress(ValueError):
            reply = json.loads(reply)
    if isinstance(reply, dict) and "message_id" in reply:
        return int(reply["message_id"])
    if params.get("reply_to_message_id") not in (None, ""):
        return int(params["reply_to_message_id"])
    return None


def _ok(result: Any) -> web.Response:
    return web.json_response({"ok": True, "result": result})


def _error(code: int, description: str) -> web.Response:
    return web.json_response({"ok": False, "error_code": code, "description": description}, status=code)


# -- running a bot example's processes against the stand-in ----------------------------


@dataclass(slots=True)
class Run:
    """One run of a bot example: what the stand-in saw, and what happened to the processes."""

    outcome: Outcome
    drained: bool
    elapsed_s: float
    killed_pid: int | None = None
    in_flight_at_kill: int = 0
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    logs: dict[str, str] = field(default_factory=dict)


def _leased_by(db: Path, pid: int) -> int:
    """Tasks that a process's nodes hold a lease on: the sends in flight (or about to be) in it.

    A Runtime names its nodes ``<host>-<pid>-<random>-<n>``; the store keeps the holder of
    each running task's lease.
    """
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5.0)) as conn:
        rows = conn.execute("SELECT lease_owner FROM coord_tasks WHERE status = 'running'").fetchall()
    return sum(1 for (owner,) in rows if owner is not None and f"-{pid}-" in owner)


def _members_of(db: Path, pid: int) -> int:
    """Nodes of a process that have joined the membership (named as in :func:`_leased_by`)."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5.0)) as conn:
        try:
            rows = conn.execute("SELECT node_id FROM coord_members").fetchall()
        except sqlite3.OperationalError:  # no such table yet: no process has opened the store
            return 0
    return sum(1 for (node_id,) in rows if f"-{pid}-" in node_id)


async def _wait_for(condition: Callable[[], Awaitable[bool]], *, until: float, interval_s: float) -> bool:
    """Check ``condition`` every ``interval_s`` until it holds (True) or ``until`` (monotonic) passes (False)."""
    while True:
        if await condition():
            return True
        if monotonic() >= until:
            return False
        await asyncio.sleep(interval_s)


async def run_bot_processes(
    script: Path,
    *,
    api: BotAPIStandIn,
    workdir: Path,
    node_processes: int = 2,
    kill_after_sent: int | None = None,
    extra_args: tuple[str, ...] = (),
    timeout_s: float = 45.0,
) -> Run:
    """Run ``script``'s ``bot`` process and ``node_processes`` ``nodes`` processes against ``api``.

    The processes are told the stand-in's ``time_scale`` (``--time-scale``).

    Waits until every incoming message has a reply (or ``timeout_s``), optionally kills the
    first node process with SIGKILL once the stand-in has accepted ``kill_after_sent``
    messages, at a moment when a ``sendMessage`` is in progress and that process holds a
    task lease if one comes within 3 s (counting the tasks its nodes then held leases on:
    the sends that can reach the user twice), then stops the others with SIGTERM and waits
    for them to exit.
    """
    db = workdir / "outbox.db"
    common = ["--api-server", api.url, "--db", str(db), "--time-scale", repr(api.time_scale), *extra_args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    files: dict[str, IO[bytes]] = {}
    started = monotonic()
    run = Run(outcome=api.outcome(), drained=False, elapsed_s=0.0)

    def spawn(name: str, args: list[str]) -> None:
        files[name] = open(workdir / f"{name}.log", "wb")  # noqa: SIM115 - closed below
        procs[name] = subprocess.Popen(
            [sys.executable, str(script), *args], stdout=files[name], stderr=files[name], env=env
        )

    try:
        spawn("bot", ["bot", *common])

        async def polled() -> bool:  # the bot process has opened the outbox and declared its limits
            return api.polls > 0 or procs["bot"].poll() is not None

        await _wait_for(polled, until=started + timeout_s, interval_s=0.05)
        for n in range(node_processes):
            spawn(f"nodes-{n}", ["nodes", *common])

        async def joined() -> bool:  # each nodes process runs its Runtime (and handles SIGTERM)
            for name, proc in procs.items():
                waiting = name.startswith("nodes-") and proc.poll() is None
                if waiting and await asyncio.to_thread(_members_of, db, proc.pid) == 0:
                    return False
            return True

        await _wait_for(joined, until=started + timeout_s, interval_s=0.05)
        if kill_after_sent is not None:
            victim = procs["nodes-0"]

            async def enough_sent() -> bool:
                return len(api.sent) >= kill_after_sent

            async def send_in_flight() -> bool:
                return api.in_progress > 0 and await asyncio.to_thread(_leased_by, db, victim.pid) > 0

            await _wait_for(enough_sent, until=started + timeout_s, interval_s=0.01)
            await _wait_for(send_in_flight, until=monotonic() + 3.0, interval_s=0.002)
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait()
            run.killed_pid = victim.pid
            run.in_flight_at_kill = await asyncio.to_thread(_leased_by, db, victim.pid)
        run.drained = await api.wait_answered(max(timeout_s - (monotonic() - started), 0.0))
        await asyncio.sleep(0.5)  # a repeat sent late would show now
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc in procs.items():
            try:
                await asyncio.to_thread(proc.wait, 15.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            run.exit_codes[name] = proc.returncode
            files[name].close()
            run.logs[name] = (workdir / f"{name}.log").read_text(errors="replace")
    run.outcome = api.outcome()
    run.elapsed_s = monotonic() - started
    return run


SELF_CHECK_TIME_SCALE = 4.0
"""How much faster than real time the stand-in's clock runs in :func:`self_check`."""


def self_check(script: Path, *, messages: int = 40, time_scale: float = SELF_CHECK_TIME_SCALE) -> int:
    """Run ``script``'s processes against a stand-in; print what happened and a verdict line; exit status."""

    async def main() -> int:
        with tempfile.TemporaryDirectory() as folder:
            async with BotAPIStandIn(messages=messages, time_scale=time_scale) as api:
                run = await run_bot_processes(script, api=api, workdir=Path(folder))
        o = run.outcome
        chats = len({m.chat_id for m in api.incoming})
        print(f"stand-in Bot API: {o.incoming} incoming messages in {chats} chats, its clock {time_scale:g}x real time")
        print(f"answered {o.answered}, missing {o.missing}, duplicates {o.duplicates}, 429s {o.refusals}")
        print(f"chats out of order: {o.out_of_order or 'none'}; processes exited {run.exit_codes}")
        ok = run.drained and o.missing == 0 and o.duplicates == 0 and not o.out_of_order and o.refusals == 0
        ok = ok and o.unexpected == 0 and all(code == 0 for code in run.exit_codes.values())
        if not ok:
            for name, text in run.logs.items():
                print(f"--- {name}\n{text[-3000:]}", file=sys.stderr)
        print(f"every message answered once, in per-chat order, no 429: {'OK' if ok else 'FAILED'}")
        return 0 if ok else 1

    return asyncio.run(main())


# -- running the stand-in itself ---------------------------------------------------------


async def _burst_demo() -> int:
    """Send 6 messages to one chat at once, as a bot without a limiter would: the 4th meets a 429."""
    async with BotAPIStandIn(messages=1) as api, ClientSession() as http:
        chat_id = api.incoming[0].chat_id
        statuses, body = [], {}
        for n in range(6):
            url = f"{api.url}/bot{TOKEN}/sendMessage"
            async with http.post(url, data={"chat_id": str(chat_id), "text": f"burst {n}"}) as response:
                statuses.append(response.status)
                if response.status == 429:
                    body = await response.json()
    print(f"6 messages to chat {chat_id} at once: HTTP {statuses}")
    print(f"the 429 reads: {json.dumps(body)}")
    burst = TELEGRAM_LIMITS["chat"].burst
    shape = body.get("error_code") == 429 and isinstance(body.get("parameters", {}).get("retry_after"), int)
    ok = statuses[:burst] == [200] * burst and statuses[burst] == 429 and shape
    print(f"a burst to one chat met Telegram's 429 after {burst} messages: {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


async def _serve(port: int, messages: int) -> int:
    async with BotAPIStandIn(messages=messages, port=port) as api:
        print(f"stand-in Bot API at {api.url} (token e.g. {TOKEN}); Ctrl-C to stop", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
        o = api.outcome()
    print(f"answered {o.answered}/{o.incoming}, duplicates {o.duplicates}, 429s {o.refusals}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--serve", action="store_true", help="serve until Ctrl-C instead of the burst demo")
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--messages", type=int, default=60, help="incoming messages taken from the trace")
    args = parser.parse_args()
    if args.serve:
        return asyncio.run(_serve(args.port, args.messages))
    return asyncio.run(_burst_demo())


if __name__ == "__main__":
    raise SystemExit(main())
