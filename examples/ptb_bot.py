"""A python-telegram-bot bot whose replies go through an asynccoord outbox, sent by nodes in other processes.

Two kinds of process share one SQLite file. ``bot``: python-telegram-bot's Application receives
updates by long polling and its handler enqueues a reply to each text message (idempotency key
from the update id, so an update Telegram delivers again is not answered twice; partition key
the chat, so a chat's replies keep their order; limit keys the bot account, the chat and, in a
group, the group). ``nodes``: a Runtime of nodes sends the replies with python-telegram-bot's
own ``Bot`` within Telegram's limits, declared once for every process (in place of the
process-local ``AIORateLimiter``); a ``RetryAfter`` becomes ``RateLimited``, so nothing more
is claimed for the bot on any node until the Retry-After has passed (replies claimed just
before it may still go out); so does a 429 without a Retry-After, for ``BARE_429_PAUSE_S``.
Other failed sends are tried again for about 14 minutes (``SEND_RETRY``), so an outage of
Telegram dead-letters no reply. SIGTERM drains and stops.

Run with no arguments to check it against a local stand-in of the Bot API
(``examples/telegram_standin.py``): one bot process and two node processes. Against Telegram::

    export TELEGRAM_BOT_TOKEN=123456:ABC...
    python examples/ptb_bot.py bot --db outbox.db &
    python examples/ptb_bot.py nodes --db outbox.db &   # as many as you like, on this machine
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import logging
import os
import warnings
from pathlib import Path
from typing import Any

from telegram import Bot, Message, ReplyParameters, Update
from telegram.error import BadRequest, Forbidden, NetworkError, RetryAfter, TelegramError
from telegram.ext import Application, ApplicationBuilder, ContextTypes, MessageHandler, filters
from telegram.warnings import PTBDeprecationWarning

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


def rate_limited(exc: TelegramError, time_scale: float = 1.0) -> RateLimited | None:
    """Telegram's 429 as asynccoord's signal, None for another error.

    Telegram does not say which limit was hit, so pause all the reply's. A 429 without a
    Retry-After is a ``NetworkError``, told apart only by its message: Telegram's description,
    or "Too Many Requests (429)" without one.
    """
    if isinstance(exc, RetryAfter):
        with warnings.catch_warnings():  # an int before python-telegram-bot 22.2, a timedelta from then on
            warnings.simplefilter("ignore", PTBDeprecationWarning)
            after = exc.retry_after
        after_s = after.total_seconds() if isinstance(after, datetime.timedelta) else float(after)
        return RateLimited(after_s / time_scale)
    if isinstance(exc, NetworkError) and exc.message.startswith("Too Many Requests"):
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


async def on_text(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """The bot's handler: a reply is written to the outbox, not sent from here."""
    message = update.effective_message
    assert message is not None
    outbox: SQLiteStore = context.bot_data["outbox"]
    reply = {"chat_id": message.chat.id, "text": f"re: {message.text}", "reply_to": message.message_id}
    await enqueue_reply(
        outbox,
        reply,
        update_id=update.update_id,
        partition_key=str(message.chat.id),
        limit_keys=limit_keys(context.bot.id, message),
    )


def token_and_base_url(args: argparse.Namespace) -> tuple[str, str]:
    token = os.environ.get("TELEGRAM_BOT_TOKEN") or ("123456:stand-in-token" if args.api_server else "")
    if not token:
        raise SystemExit("set TELEGRAM_BOT_TOKEN, or give --api-server for a stand-in of the Bot API")
    base = "https://api.telegram.org" if args.api_server is None else args.api_server.rstrip("/")
    return token, f"{base}/bot"


def run_bot(args: argparse.Namespace) -> None:
    """Receive updates with the Application until SIGINT/SIGTERM; its handler fills the outbox."""
    outbox = SQLiteStore(args.db, config=outbox_config(args.time_scale))

    async def open_outbox(application: Application) -> None:  # type: ignore[type-arg]
        await outbox.open()
        await outbox.set_rate_limits(QUEUE, declared_limits(args.time_scale))  # for every node of every process
        application.bot_data["outbox"] = outbox

    async def close_outbox(application: Application) -> None:  # type: ignore[type-arg]
        await outbox.close()

    token, base_url = token_and_base_url(args)
    builder = ApplicationBuilder().token(token).base_url(base_url)
    application = builder.post_init(open_outbox).post_shutdown(close_outbox).build()
    # Updates are handled one by one (the default), so a chat's replies are enqueued in order.
    application.add_handler(MessageHandler(filters.TEXT & ~filters.COMMAND, on_text))
    application.run_polling(allowed_updates=Update.ALL_TYPES)


async def run_nodes(args: argparse.Namespace) -> None:
    """Send the outbox's replies with the Bot until SIGINT/SIGTERM, then drain to a deadline."""
    token, base_url = token_and_base_url(args)

    async with Bot(token, base_url=base_url) as bot:

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
            except Forbidden as exc:  # the user blocked the bot, or it left the group: drop the reply
                logging.getLogger("outbox").info("reply %s dropped: %s", task.id, exc.message)
                return None
            except BadRequest as exc:  # Telegram will never take this message: a dead letter, no retry
                raise Undeliverable(f"400 {exc.message}") from exc
            except TelegramError as exc:
                limited = rate_limited(exc, args.time_scale)
                if limited is None:
                    raise  # a failed attempt: tried again after SEND_RETRY's wait
                raise limited from exc
            return message.message_id

        config = NodeConfig(queue=QUEUE, ordered=True, lease_s=args.lease_s, send_timeout_s=10)
        async with SQLiteStore(args.db, config=outbox_config(args.time_scale)) as outbox:
            runtime = Runtime(outbox, send=send, nodes=args.nodes, config=config, shutdown_timeout_s=10)
            async with runtime:
                await runtime.wait_for_signal()


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
        run_bot(args)
    elif args.role == "nodes":
        asyncio.run(run_nodes(args))
    else:
        from telegram_standin import self_check

        return self_check(Path(__file__).resolve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
