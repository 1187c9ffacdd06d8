"""The aiogram and python-telegram-bot examples, end to end against a local stand-in of the Bot API.

Each run is real OS processes: the example's ``bot`` process (the framework's own dispatcher,
long polling the stand-in) and two ``nodes`` processes (a Runtime sending with the framework's
own Bot client), on one SQLite file, with the stand-in (examples/telegram_standin.py) served
from the test's event loop and applying Telegram's limits. The kill test runs the stand-in's
clock (arrivals, limits) ``TIME_SCALE`` times faster than real time, and the processes declare
their limits on the same clock; the 429 test keeps real time, so the pause it checks lasts
whole seconds against the real time a pause takes to reach the store.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from support import ROOT

EXAMPLES_DIR = ROOT / "examples"
sys.path.insert(0, str(EXAMPLES_DIR))

pytest.importorskip("aiohttp")
from telegram_standin import TELEGRAM_LIMITS, BotAPIStandIn, Limit, Run, run_bot_processes  # noqa: E402

TIME_SCALE = 4.0
"""How much faster than real time the stand-in's clock runs in the kill test."""

PAUSE_STORED_S = 0.3
"""Time allowed between a 429 and the moment the pause it asks for holds in the store for every node."""

OUTAGE_S = 200.0
"""How long Telegram refuses every reply in the outage test, seconds of the stand-in's clock: longer than
the whole default RetryPolicy (5 attempts, 1 s doubling: about 15 s) even in real seconds."""

OUTAGE_TIME_SCALE = 10.0
"""The stand-in's clock in the outage test: the outage lasts 20 real seconds."""

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(90)]

BOTH = pytest.mark.parametrize(
    "script",
    [
        pytest.param("aiogram_bot.py", id="aiogram", marks=pytest.mark.xdist_group("aiogram")),  # see test_examples
        pytest.param("ptb_bot.py", id="python-telegram-bot"),
    ],
)


def report(run: Run) -> str:
    o = run.outcome
    logs = "".join(f"\n--- {name}\n{text[-2000:]}" for name, text in run.logs.items())
    return (
        f"{o}; drained={run.drained} in {run.elapsed_s:.1f} s; killed pid {run.killed_pid} holding "
        f"{run.in_flight_at_kill} task leases; exit codes {run.exit_codes}{logs}"
    )


def tasks_by_status(db: Path) -> Counter[tuple[str, int]]:
    """The outbox's tasks counted by (status, attempts)."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5.0)) as conn:
        return Counter(conn.execute("SELECT status, attempts FROM coord_tasks").fetchall())


def example_constant(script: str, name: str) -> float:
    """A number the example sets at module level (``NAME = 1.5``), read without importing its framework."""
    found = re.search(rf"^{name} = ([0-9.]+)", (EXAMPLES_DIR / script).read_text(), re.MULTILINE)
    assert found is not None, f"examples/{script} sets no {name}"
    return float(found.group(1))


# Exclusive: the limits leave 0.2 s for the time between a node's claim (its token) and the
# stand-in's arrival, and four processes beside another worker's test can exceed that.
@pytest.mark.exclusive
@pytest.mark.parametrize("script", ["aiogram_bot.py", "ptb_bot.py"], ids=["aiogram", "python-telegram-bot"])
async def test_every_message_answered_in_order_within_limits_when_a_node_process_is_killed(
    script: str, tmp_path: Path
) -> None:
    pytest.importorskip("aiogram" if script == "aiogram_bot.py" else "telegram")
    async with BotAPIStandIn(messages=60, time_scale=TIME_SCALE) as api:
        run = await run_bot_processes(EXAMPLES_DIR / script, api=api, workdir=tmp_path, kill_after_sent=20)
    o, why = run.outcome, report(run)
    print(
        f"{script}: duplicates seen by the Bot API {o.duplicates}, sends in flight at the kill {run.in_flight_at_kill}"
    )
    assert run.drained, why
    assert o.answered == o.incoming == 60, why
    assert o.out_of_order == [], why
    assert o.unexpected == 0, why
    assert o.refusals == 0, why  # the declared limits are below the stand-in's: Telegram never had to say 429
    assert o.duplicates <= run.in_flight_at_kill, why  # only a send cut by the crash can reach a user twice
    assert run.exit_codes == {"bot": 0, "nodes-0": -9, "nodes-1": 0}, why


@pytest.mark.parametrize(
    "script",
    [
        pytest.param("aiogram_bot.py", id="aiogram", marks=pytest.mark.xdist_group("aiogram")),  # see test_examples
        pytest.param("ptb_bot.py", id="python-telegram-bot"),
    ],
)
async def test_a_429_pauses_the_bot_on_every_node_and_costs_no_message(script: str, tmp_path: Path) -> None:
    pytest.importorskip("aiogram" if script == "aiogram_bot.py" else "telegram")
    stricter = {**TELEGRAM_LIMITS, "chat": Limit(1, 1.0, burst=1)}  # no burst: the examples' bursts meet 429s
    async with BotAPIStandIn(messages=20, limits=stricter) as api:
        run = await run_bot_processes(EXAMPLES_DIR / script, api=api, workdir=tmp_path)
    o, why = run.outcome, report(run)
    assert run.drained, why
    assert o.answered == o.incoming == 20, why  # a 429 used no attempt and lost nothing
    assert o.out_of_order == [], why
    assert o.duplicates == 0, why
    assert o.unexpected == 0, why
    assert o.refusals > 0, why
    sent_to: defaultdict[int, list[float]] = defaultdict(list)
    for s in api.sent:
        sent_to[s.chat_id].append(s.t_mono)
    for refusal in api.refusals:
        after = [t for t in sent_to[refusal.chat_id] if t > refusal.t_mono]
        # the refused reply went again, first in its chat, once the Retry-After had passed
        assert not after or after[0] >= refusal.t_mono + refusal.wait_s - 0.05, (refusal, after[:3], why)
    assert all(code == 0 for code in run.exit_codes.values()), why
    # RateLimited pauses every bucket of the reply, the bot account's included: once the pause is
    # stored (a send claimed before it may still land), no node of either process sends to anyone
    during = [
        (r, round(s.t_mono - r.t_mono, 3))
        for r in api.refusals
        for s in api.sent
        if r.t_mono + PAUSE_STORED_S < s.t_mono < r.t_mono + r.wait_s - 0.05
    ]
    print(f"{script}: {o.refusals} 429s, messages accepted while the bot was paused {len(during)}")
    assert during == [], why


@BOTH
@pytest.mark.timeout(150)  # the outage takes 20 s of the run's timeout_s
async def test_an_outage_of_minutes_dead_letters_no_reply(script: str, tmp_path: Path) -> None:
    """Telegram answers every sendMessage 502 for 200 s from the first (on the stand-in's clock, 10 times
    real time): the replies wait it out under the examples' retry policy, every one answered once, in order."""
    pytest.importorskip("aiogram" if script == "aiogram_bot.py" else "telegram")
    async with BotAPIStandIn(messages=30, time_scale=OUTAGE_TIME_SCALE, send_outage_s=OUTAGE_S) as api:
        run = await run_bot_processes(EXAMPLES_DIR / script, api=api, workdir=tmp_path, timeout_s=90.0)
    o, why = run.outcome, report(run)
    tasks = tasks_by_status(tmp_path / "outbox.db")
    print(f"{script}: {api.outage_errors} sends refused by the outage; tasks by (status, attempts) {dict(tasks)}")
    assert api.outage_errors >= o.incoming // 2, why  # the outage met the replies, not an idle bot
    assert not [t for t in tasks if t[0] == "dead"], (tasks, why)
    assert max(attempts for _, attempts in tasks) > 2, (tasks, why)  # sends failed, and were tried again
    assert run.drained, (tasks, why)
    assert o.answered == o.incoming == 30, why
    assert o.out_of_order == [], why
    assert o.duplicates == 0, why  # a 502 sent nothing
    assert o.unexpected == 0, why
    assert sum(tasks.values()) == 30, (tasks, why)
    assert {status for status, _ in tasks} == {"done"}, (tasks, why)
    assert all(code == 0 for code in run.exit_codes.values()), why


@BOTH
async def test_refusals_a_bare_429_pauses_a_403_drops_a_400_dead_letters_each_at_once(
    script: str, tmp_path: Path
) -> None:
    """Telegram's refusals, each handled without waiting out the retry policy (one run of each framework):
    - a 429 that has no parameters (aiogram: a plain TelegramAPIError; python-telegram-bot: a NetworkError)
      becomes RateLimited with the example's default pause: the reply goes back without an attempt counted,
      and its chat gets nothing before the pause has passed;
    - a 403 (a user who blocked the bot) drops the reply: its task is done, sent once;
    - a 400 (a message Telegram cannot take) dead-letters it with Undeliverable, sent once.
    The other chats are answered as usual."""
    pytest.importorskip("aiogram" if script == "aiogram_bot.py" else "telegram")
    time_scale = 4.0
    stricter = {**TELEGRAM_LIMITS, "chat": Limit(1, 1.0, burst=1)}  # no burst: the examples' bursts meet 429s
    async with BotAPIStandIn(messages=30, limits=stricter, bare_429=True, time_scale=time_scale) as api:
        private = list(dict.fromkeys(m.chat_id for m in api.incoming if m.chat_type == "private"))
        blocked, broken = private[0], private[1]
        api.refused_chats = {blocked: 403, broken: 400}
        run = await run_bot_processes(EXAMPLES_DIR / script, api=api, workdir=tmp_path)
    o, why = run.outcome, report(run)
    to = Counter(m.chat_id for m in api.incoming)
    with contextlib.closing(sqlite3.connect(f"file:{tmp_path / 'outbox.db'}?mode=ro", uri=True)) as conn:
        rows = conn.execute("SELECT partition_key, status, attempts, last_error FROM coord_tasks").fetchall()
    by_chat: defaultdict[str, list[tuple[str, int, str | None]]] = defaultdict(list)
    for key, status, attempts, error in rows:
        by_chat[key].append((status, attempts, error))
    print(f"{script}: {o.refusals} bare 429s, {len(api.refused)} replies refused for good")
    assert run.drained, why
    assert o.refusals > 0, why
    others = {key: tasks for key, tasks in by_chat.items() if key not in (str(blocked), str(broken))}
    assert {t for tasks in others.values() for t in tasks} == {("done", 1, None)}, (others, why)  # a 429 used none
    assert sorted(c for c, _, _ in api.refused) == sorted([blocked] * to[blocked] + [broken] * to[broken]), why
    assert len(set(api.refused)) == len(api.refused), why  # each refused once: no retry
    assert by_chat[str(blocked)] == [("done", 1, None)] * to[blocked], why
    assert [(status, attempts) for status, attempts, _ in by_chat[str(broken)]] == [("dead", 1)] * to[broken], why
    for _, _, error in by_chat[str(broken)]:  # the framework words Telegram's description its own way
        assert re.fullmatch(r"Undeliverable: 400 (Bad Request: )?[Mm]essage is too long", error or ""), (error, why)
    assert o.answered == o.incoming - to[blocked] - to[broken], why
    assert o.out_of_order == [], why
    assert o.duplicates == 0, why
    assert o.unexpected == 0, why
    pause_s = example_constant(script, "BARE_429_PAUSE_S") / time_scale  # real seconds
    sent_to: defaultdict[int, list[float]] = defaultdict(list)
    for s in api.sent:
        sent_to[s.chat_id].append(s.t_mono)
    for refusal in api.refusals:
        after = [t for t in sent_to[refusal.chat_id] if t > refusal.t_mono]
        # the refused reply went again, first in its chat, once the default pause had passed
        assert after, (refusal, why)
        assert after[0] >= refusal.t_mono + pause_s - 0.05, (refusal, after[:3], why)
    assert all(code == 0 for code in run.exit_codes.values()), why
