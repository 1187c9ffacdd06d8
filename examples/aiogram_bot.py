"""An aiogram bot whose replies go through an asynccoord outbox, sent by nodes in other processes.

Two kinds of process share one SQLite file. ``bot``: aiogram's Dispatcher receives updates by
long polling and its handler enqueues a reply to each text message (idempotency key from the
update id, so an update Telegram delivers again is not answered twice; partition key the
chat, so a chat's replies keep their order; limit keys the bot account, the chat and, in a
group, the group). ``nodes``: a Runtime of nodes sends the replies with aiogram's own ``Bot``
within Telegram's limits, declared once for every process; a ``TelegramRetryAfter`` becomes
``RateLimited``, so nothing more is claimed for the bot on any node until the Retry-After has
passed (replies claimed just before it may still go out); so does a 429 without a Retry-After,
for ``BARE_429_PAUSE_S``. Other failed sends are tried again for about 14 minutes
(``SEND_RETRY``), so an outage of Telegram dead-letters no reply. SIGTERM drains and stops.

Run with no arguments to check it against a local stand-in of the Bot API
(``examples/telegram_standin.py``): one bot process and two node processes. Against Telegram::

    export TELEGRAM_BOT_TOKEN=123456:ABC...
    python examples/aiogram_bot.py bot --db outbox.db &
    python examples/aiogram_bot.py nodes --db outbox.db &   # as many as you like, on this machine
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

from aiogram import Bot, Dispatcher, F, Router
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiogram.exceptions import TelegramAPIError, TelegramBadRequest, TelegramForbiddenError, TelegramRetryAfter
from aiogram.types import Message, ReplyParameters, Update

from asynccoord import (
    NodeConfig,
    RateLimit,
    RateLimited,
    RetryPolicy,
    Runtime,
    SQLiteStore,
    StoreBusyError,
    StoreConfig,
    StoreConnectionError,
    Task,
    Undeliverable,
)

QUEUE = "telegram-replies"
ENQUEUE_TRIES = 5
TELEGRAM_LIMITS = [
    # Any window of per_s seconds admits up to count + burst claims. A claim takes the token and
    # the send follows it (after a slower node's turn, say), so sends may come a little closer
    # together than claims: each limit leaves a margin below Telegram's published 30 messages
    # per second per bot, about one per second per chat with short bursts, 20 per minute per group.
    RateLimit(dimension="account", count=25, per_s=1.0, burst=5),
    RateLimit(dimension="chat", count=1, per_s=1.0, burst=2),
    RateLimit(dimension="group", count=15, per_s=60.0, burst=2),
]
# A failed send (Telegram down: HTTP 5xx, a refused or timed-out connection) is tried again. The
# default RetryPolicy gives up after 5 attempts, about 15 s: an outage would dead-letter each chat's
# head reply in turn. A bot should ride out minutes: waits double from 1 s to at most 60 s, +-25 %
# so the chats' retries spread out once Telegram is back, and the 20th failed attempt, after about
# 14 minutes (10.5 at the least), dead-letters the reply. A reply Telegram refuses for good must not
# wait that long: send drops one to a user who blocked the bot (403, routine: the task is done) and
# dead-letters one Telegram cannot take (400, a bug to look at: Undeliverable, no retry).
SEND_RETRY = RetryPolicy(base_s=1.0, factor=2.0, cap_s=60.0, jitter=0.25, max_attempts=20)
BARE_429_PAUSE_S = 5.0  # a 429 that gives no Retry-After pauses the reply's buckets this long


def declared_limits(time_scale: float) -> list[RateLimit]:
    """Telegram's limits on a clock ``time_scale`` times faster (1 against Telegram; more against a fast stand-in)."""
    return [
        RateLimit(dimension=x.dimension, count=x.count, per_s=x.per_s / time_scale, burst=x.burst)
        for x in TELEGRAM_LIMITS
    ]


def outbox_config(time_scale: float) -> StoreConfig:
    """The outbox's config: ``SEND_RETRY``, its waits on a clock ``time_scale`` times faster, as above.

    Both processes use it: the bot's gives each reply its ``max_attempts`` at enqueue, the nodes' the waits.
    """
    r = SEND_RETRY
    return StoreConfig(retry=dataclasses.replace(r, base_s=r.base_s / time_scale, cap_s=r.cap_s / time_scale))


router = Router()


def rate_limited(exc: TelegramAPIError, time_scale: float = 1.0) -> RateLimited | None:
    """Telegram's 429 as asynccoord's signal, None for another error.

    Telegram does not say which limit was hit, so pause all the reply's. A 429 without a
    Retry-After is a plain ``TelegramAPIError``, told apart only by Telegram's description.
    """
    if isinstance(exc, TelegramRetryAfter):
        return RateLimited(exc.retry_after / time_scale)
    if str(exc.message).startswith("Too Many Requests"):
        return RateLimited(BARE_429_PAUSE_S / time_scale)
    return None


def limit_keys(bot_id: int, message: Message) -> dict[str, str]:
    keys = {"account": str(bot_id), "chat": str(message.chat.id)}
    if message.chat.type in ("group", "supergroup"):
        keys["group"] = str(message.chat.id)
    return keys


async def enqueue_reply(outbox: SQLiteStore, reply: dict[str, object], *, update_id: int, **task: Any) -> None:
    """Write the reply to the outbox, trying again while the database is busy or unreachable.

    The polling loop has taken the update already: a reply not written here is never sent.
    The idempotency key (the update's id) makes a retry after an unclear failure safe.
    """
    for attempt in range(ENQUEUE_TRIES):
        try:
            await outbox.enqueue(QUEUE, reply, idempotency_key=f"update-{update_id}", **task)
            return
        except (StoreBusyError, StoreConnectionError):
            if attempt == ENQUEUE_TRIES - 1:
                raise
            await asyncio.sleep(0.1 * 2**attempt)


@router.message(F.text)
async def on_text(message: Message, event_update: Update, bot: Bot, outbox: SQLiteStore) -> None:
    """The bot's handler: a reply is written to the outbox, not sent from here."""
    reply = {"chat_id": message.chat.id, "text": f"re: {message.text}", "reply_to": message.message_id}
    await enqueue_reply(
        outbox,
        reply,
        update_id=event_update.update_id,
        partition_key=str(message.chat.id),
        limit_keys=limit_keys(bot.id, message),
    )


def make_bot(args: argparse.Namespace) -> Bot:
    token = os.environ.get("TELEGRAM_BOT_TOKEN") or ("123456:stand-in-token" if args.api_server else "")
    if not token:
        raise SystemExit("set TELEGRAM_BOT_TOKEN, or give --api-server for a stand-in of the Bot API")
    if args.api_server is None:
        return Bot(token)
    return Bot(token, session=AiohttpSession(api=TelegramAPIServer.from_base(args.api_server)))


async def run_bot(args: argparse.Namespace) -> None:
    """Receive updates with aiogram's Dispatcher until SIGINT/SIGTERM; its handler fills the outbox."""
    dispatcher = Dispatcher()
    dispatcher.include_router(router)
    async with SQLiteStore(args.db, config=outbox_config(args.time_scale)) as outbox:
        await outbox.set_rate_limits(QUEUE, declared_limits(args.time_scale))  # for every node of every process
        # handle_as_tasks=False: updates are handled one by one, so a chat's replies are enqueued in order
        await dispatcher.start_polling(make_bot(args), handle_as_tasks=False, outbox=outbox)


async def run_nodes(args: argparse.Namespace) -> None:
    """Send the outbox's replies with aiogram's Bot until SIGINT/SIGTERM, then drain to a deadline."""
    bot = make_bot(args)

    async def send(task: Task) -> int | None:
        reply = task.payload
        if task.attempts > 1:  # an earlier delivery may have reached the chat, and the Bot API cannot say
            logging.getLogger("outbox").warning("reply %s sent again (attempt %d)", task.id, task.attempts)
        try:
            message = await bot.send_message(
                chat_id=reply["chat_id"],
                text=reply["text"],
                reply_parameters=ReplyParameters(message_id=reply["reply_to"], allow_sending_without_reply=True),
            )
        except TelegramForbiddenError as exc:  # the user blocked the bot, or it left the group: drop the reply
            logging.getLogger("outbox").info("reply %s dropped: %s", task.id, exc.message)
            return None
        except TelegramBadRequest as exc:  # Telegram will never take this message: a dead letter, no retry
            raise Undeliverable(f"400 {exc.message}") from exc
        except TelegramAPIError as exc:
            limited = rate_limited(exc, args.time_scale)
            if limited is None:
                raise  # a failed attempt: tried again after SEND_RETRY's wait
            raise limited from exc
        return message.message_id

    config = NodeConfig(queue=QUEUE, ordered=True, lease_s=args.lease_s, send_timeout_s=10)
    try:
        async with SQLiteStore(args.db, config=outbox_config(args.time_scale)) as outbox:
            runtime = Runtime(outbox, send=send, nodes=args.nodes, config=config, shutdown_timeout_s=10)
            async with runtime:
                await runtime.wait_for_signal()
    finally:
        await bot.session.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("role", nargs="?", choices=("check", "bot", "nodes"), default="check")
    parser.add_argument("--db", default="outbox.db", help="the outbox's SQLite file, shared by the processes")
    parser.add_argument("--api-server", help="base URL of another Bot API server, e.g. http://127.0.0.1:8081")
    parser.add_argument("--nodes", type=int, default=2, help="nodes in this process (role nodes)")
    parser.add_argument("--lease-s", type=float, default=3.0, help="task lease: how soon a crashed node's work moves")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="with --api-server: the server's clock runs this many times faster than real time, so the declared "
        "limits, a 429's pause and the retries' waits are divided by it (the stand-in's quick checks; default 1)",
    )
    args = parser.parse_args()
    if not 0 < args.time_scale < float("inf"):
        parser.error(f"--time-scale must be a number > 0, got {args.time_scale!r}")
    logging.basicConfig(level=logging.WARNING)
    if args.role == "bot":
        asyncio.run(run_bot(args))
    elif args.role == "nodes":
        asyncio.run(run_nodes(args))
    else:
        from telegram_standin import self_check

        return self_check(Path(__file__).resolve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
