"""A node's log line that carries a user's text (a send's error, a limit's key) stays one line.

A line break in it would split the one-line event in two; an ANSI escape or a bidirectional
override would reach the operator's terminal. Each is escaped as ``status`` and ``dead``
escape what they print; the task's ``last_error`` keeps the text as it was.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from asynccoord import NodeConfig, RateLimited, RetryPolicy, Runtime, Task, TaskStatus, Undeliverable

FAST = NodeConfig(
    queue="q",
    lease_s=5.0,
    idle_min_s=0.01,
    idle_max_s=0.05,
    retry=RetryPolicy(base_s=0.01, factor=1.0, cap_s=0.01, jitter=0.0),
)

EVIL = "\u202eevil\nline2\x1b[31mred"
ESCAPED = "\\u202eevil\\x0aline2\\x1b[31mred"
UNSAFE = "\n\r\x1b\u202e\u2028"


def _lines(caplog: pytest.LogCaptureFixture, prefix: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(prefix)]


def _clean(line: str) -> bool:
    return not any(c in line for c in UNSAFE)


async def test_a_send_error_is_escaped_in_its_log_lines_and_kept_in_last_error(
    make_store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    store = await make_store(clock=None)
    caplog.set_level(logging.INFO, logger="asynccoord.node.settle")
    refused = (await store.enqueue("q", {"n": 1}, partition_key="a")).task
    failing = (await store.enqueue("q", {"n": 2}, partition_key="b", max_attempts=2)).task

    async def send(task: Task) -> None:
        if task.payload["n"] == 1:
            raise Undeliverable(EVIL)
        raise ValueError(EVIL)

    async with Runtime(store, send=send, config=FAST, nodes=1) as runtime:
        await runtime.wait_until_drained(timeout_s=20)
    for task in (refused, failing):
        dead = await store.get(task.id)
        assert dead.status is TaskStatus.DEAD
        assert dead.last_error.endswith(f": {EVIL}")  # stored as the store keeps it
    lines = {
        event: _lines(caplog, f"asynccoord.node.{event} ")
        for event in ("send_undeliverable", "send_failed", "send_failed_dead")
    }
    assert {event: len(found) for event, found in lines.items()} == {
        "send_undeliverable": 1,
        "send_failed": 1,
        "send_failed_dead": 1,
    }
    for event, (line,) in lines.items():
        assert _clean(line), (event, line)
        assert f"Error: {ESCAPED}" in line or f"Undeliverable: {ESCAPED}" in line, line


async def test_a_rate_limited_key_is_escaped_in_its_log_line(make_store: Any, caplog: pytest.LogCaptureFixture) -> None:
    """The key a provider's pushback names is a user's value (a chat id): it may hold anything."""
    store = await make_store(clock=None)
    caplog.set_level(logging.INFO, logger="asynccoord.node.settle")
    await store.enqueue("q", {}, partition_key="a")
    sent: list[int] = []

    async def send(task: Task) -> None:
        sent.append(task.id)
        if len(sent) == 1:
            raise RateLimited(0.01, dimension="chat", key="c\n\x1b[2J")

    async with Runtime(store, send=send, config=FAST, nodes=1) as runtime:
        await runtime.wait_until_drained(timeout_s=20)
    (line,) = _lines(caplog, "asynccoord.node.rate_limited ")
    assert _clean(line), line
    assert "dimension=chat key=c\\x0a\\x1b[2J" in line
