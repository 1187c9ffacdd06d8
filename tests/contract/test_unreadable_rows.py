"""A task row the store cannot decode (a poison message) on the stores of a database.

A row written by another tool or edited by hand (JSON cut short, an integer longer than
Python's digit limit) must not escape as a ``json`` error: ``get`` raises
:class:`~asynccoord.errors.UnreadableRowError`, ``dead_letters`` lists the task with its raw
text marked, and a claim that meets it dead-letters that task alone and hands out the others.
SQLite and PostgreSQL both store these columns as text; the memory store keeps Python
values, which nothing outside the process can edit.
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Any

import pytest
from services import corrupt_task_row as corrupt

from asynccoord import DeadLetterPolicy, RateLimit, Task, TaskStatus, UnreadableRowError, UnreadableValue
from asynccoord import events as ev
from asynccoord.contract.ratelimits import decode_limit_keys

SHARED = pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)

Q = "outbox"
CUT_SHORT = '{"n": 1'
HUGE_INT = '{"n": ' + "9" * 5000 + "}"  # over the default 4300 digits of int()


@SHARED
@pytest.mark.parametrize(
    ("column", "text", "why"),
    [("payload", CUT_SHORT, "JSONDecodeError"), ("payload", HUGE_INT, "ValueError"), ("result", "{", "JSON")],
)
async def test_get_raises_a_typed_error_naming_the_task_and_column(
    store: Any, column: str, text: str, why: str
) -> None:
    task = (await store.enqueue(Q, {"n": 1})).task
    await corrupt(store, task.id, column, text)
    with pytest.raises(UnreadableRowError) as caught:
        await store.get(task.id)
    error = caught.value
    assert (error.task_id, error.column) == (task.id, column)
    assert why in error.reason
    assert f"task {task.id}: stored {column} is unreadable" in str(error)


@SHARED
async def test_a_claim_dead_letters_the_unreadable_task_and_hands_out_the_others(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    ids = [(await store.enqueue(Q, {"n": n}, partition_key=f"k{n}")).task.id for n in range(4)]
    poison = ids[1]
    await corrupt(store, poison, "payload", CUT_SHORT)
    before = store.events.snapshot()
    with caplog.at_level(logging.WARNING, logger="asynccoord"):
        claimed = await store.claim(Q, node_id="n", limit=10)
    assert sorted(t.id for t in claimed) == [i for i in ids if i != poison]
    assert all(t.status is TaskStatus.RUNNING for t in claimed)
    warnings = [r.getMessage() for r in caplog.records if "unreadable_task" in r.getMessage()]
    assert len(warnings) == 1
    assert f"task={poison}" in warnings[0]
    after = store.events.snapshot()
    assert after.get(ev.UNREADABLE_TASK, 0) - before.get(ev.UNREADABLE_TASK, 0) == 1
    assert after.get(ev.DEAD_LETTERED, 0) - before.get(ev.DEAD_LETTERED, 0) == 1
    assert after.get(ev.CLAIMS, 0) - before.get(ev.CLAIMS, 0) == 3

    (dead,) = await store.dead_letters(Q)
    assert (dead.id, dead.status, dead.attempts) == (poison, TaskStatus.DEAD, 1)
    assert dead.last_error is not None
    assert dead.last_error.startswith("stored payload is unreadable: JSONDecodeError")
    assert dead.payload == UnreadableValue(
        column="payload", text=CUT_SHORT, reason=dead.payload.reason, length=len(CUT_SHORT)
    )
    assert await store.claim(Q, node_id="n", limit=10) == []  # nothing left to claim, nothing twice
    for t in claimed:
        await store.complete(t)
    assert await store.is_drained(Q)


async def _ordered_pair(store: Any, policy: DeadLetterPolicy) -> tuple[int, int]:
    await store.set_dead_letter_policy(Q, policy)
    first = (await store.enqueue(Q, {"n": 1}, partition_key="chat")).task.id
    second = (await store.enqueue(Q, {"n": 2}, partition_key="chat")).task.id
    await corrupt(store, first, "payload", HUGE_INT)
    return first, second


@SHARED
async def test_in_order_the_conversation_skips_the_dead_poison_task(store: Any) -> None:
    first, second = await _ordered_pair(store, DeadLetterPolicy.SKIP)
    assert await store.claim(Q, node_id="n", limit=10, ordered=True) == []
    assert (await store.dead_letters(Q))[0].id == first
    (nxt,) = await store.claim(Q, node_id="n", limit=10, ordered=True)
    assert nxt.id == second


@SHARED
async def test_in_order_a_held_conversation_waits_behind_the_dead_poison_task(store: Any) -> None:
    first, second = await _ordered_pair(store, DeadLetterPolicy.HOLD)
    assert await store.claim(Q, node_id="n", limit=10, ordered=True) == []
    assert await store.claim(Q, node_id="n", limit=10, ordered=True) == []  # held behind it
    assert (await store.get(second)).status is TaskStatus.PENDING
    assert await store.discard_dead(Q, [first]) == 1
    (nxt,) = await store.claim(Q, node_id="n", limit=10, ordered=True)
    assert nxt.id == second


@SHARED
async def test_complete_and_claim_next_dead_letters_an_unreadable_next_task(store: Any) -> None:
    ids = [(await store.enqueue(Q, {"n": n}, partition_key="chat")).task.id for n in range(3)]
    (head,) = await store.claim(Q, node_id="n", limit=1, ordered=True)
    await corrupt(store, ids[1], "payload", CUT_SHORT)
    follow = await store.complete_and_claim_next(head, lease_s=30.0)
    assert follow.done.status is TaskStatus.DONE
    assert follow.next_task is None
    dead = await store.dead_letters(Q)
    assert [t.id for t in dead] == [ids[1]]
    claimed: list[Task] = await store.claim(Q, node_id="n", limit=10, ordered=True)
    assert [t.id for t in claimed] == [ids[2]]


BAD_LIMIT_KEYS = pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"chat": ', "JSONDecodeError"),  # cut short
        ('["c1"]', "not a JSON object of strings"),
        ("5", "not a JSON object of strings"),
        ('{"chat": 5}', "not a JSON object of strings"),  # another bucket than the one meant, silently
        # Texts PostgreSQL's jsonb refuses with other errors than a syntax error, and keys
        # no enqueue accepts (a NUL, a lone surrogate: neither database keeps them as a key).
        ('{"chat": "\\u0000"}', "not limit keys"),
        ('{"chat": "\\ud800"}', "not limit keys"),
        ('{"chat": 1e1000000}', "not a JSON object of strings"),
    ],
)


async def _limited(store: Any, count: int) -> list[int]:
    """``count`` tasks in a queue limited to 2 claims a minute of chat c1; returns their ids."""
    await store.set_rate_limits(Q, [RateLimit(dimension="chat", count=1, per_s=30.0, burst=2)])
    return [
        (await store.enqueue(Q, {"n": n}, partition_key=f"k{n}", limit_keys={"chat": "c1"})).task.id
        for n in range(count)
    ]


@SHARED
@BAD_LIMIT_KEYS
@pytest.mark.parametrize("ordered", [False, True])
async def test_a_rate_limited_claim_dead_letters_a_task_whose_limit_keys_are_unreadable(
    store: Any, caplog: pytest.LogCaptureFixture, text: str, why: str, ordered: bool
) -> None:
    ids = await _limited(store, 5)
    poison = ids[1]
    await corrupt(store, poison, "limit_keys", text)
    before = store.events.snapshot()
    with caplog.at_level(logging.WARNING, logger="asynccoord"):
        claimed = await store.claim(Q, node_id="n", limit=10, ordered=ordered)
    assert [t.id for t in claimed] == [ids[0], ids[2]]  # the limit still holds for the others: 2 tokens
    warnings = [r.getMessage() for r in caplog.records if "unreadable_task" in r.getMessage()]
    assert len(warnings) == 1
    assert f"task={poison}" in warnings[0]
    assert "column=limit_keys" in warnings[0]
    after = store.events.snapshot()
    assert after.get(ev.UNREADABLE_TASK, 0) - before.get(ev.UNREADABLE_TASK, 0) == 1
    assert after.get(ev.CLAIMS, 0) - before.get(ev.CLAIMS, 0) == 2
    (dead,) = await store.dead_letters(Q)
    assert (dead.id, dead.status, dead.attempts) == (poison, TaskStatus.DEAD, 1)
    assert dead.last_error is not None
    assert dead.last_error.startswith("stored limit_keys is unreadable: ")
    assert why in dead.last_error
    assert await store.claim(Q, node_id="n", limit=10, ordered=ordered) == []  # held: no token left


@SHARED
@BAD_LIMIT_KEYS
async def test_claimable_partitions_counts_a_task_whose_limit_keys_are_unreadable(
    store: Any, text: str, why: str
) -> None:
    ids = await _limited(store, 4)
    claimed = await store.claim(Q, node_id="n", limit=10)  # both tokens taken: c1's bucket is empty
    assert len(claimed) == 2
    poison = (await store.get(ids[3])).partition
    await corrupt(store, ids[3], "limit_keys", text)
    # It counts (PostgreSQL counts every partition with due work then), and the claim it wakes dead-letters it.
    assert poison in await store.claimable_partitions(Q)
    assert await store.claim(Q, node_id="n", limit=10) == []
    assert [t.id for t in await store.dead_letters(Q)] == [ids[3]]
    assert await store.claimable_partitions(Q) == set()


@SHARED
async def test_report_rate_limited_hands_back_a_task_whose_limit_keys_became_unreadable(store: Any) -> None:
    ids = await _limited(store, 1)
    (task,) = await store.claim(Q, node_id="n", limit=1)
    await corrupt(store, ids[0], "limit_keys", "[1, 2]")
    back = await store.report_rate_limited(task, 5.0)
    assert (back.status, back.attempts) == (TaskStatus.PENDING, 0)


@SHARED
@pytest.mark.parametrize("how", ["fail", "release"])
async def test_a_row_corrupted_while_held_ends_dead_when_failed_or_released_with_its_attempt(
    store: Any, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    await store.set_dead_letter_policy(Q, DeadLetterPolicy.SKIP)
    first = (await store.enqueue(Q, {"n": 1}, partition_key="chat", max_attempts=5)).task.id
    second = (await store.enqueue(Q, {"n": 2}, partition_key="chat")).task.id
    (task,) = await store.claim(Q, node_id="n", limit=10, ordered=True)
    await corrupt(store, first, "payload", CUT_SHORT)
    before = store.events.snapshot()
    with caplog.at_level(logging.WARNING, logger="asynccoord"):
        if how == "fail":
            out = await store.fail(task, "RuntimeError: refused")
        else:
            out = await store.release(task, count_attempt=True)
    assert (out.id, out.status, out.attempts) == (first, TaskStatus.DEAD, 1)
    assert out.last_error is not None
    assert out.last_error.startswith("stored payload is unreadable: JSONDecodeError")
    assert isinstance(out.payload, UnreadableValue)
    warnings = [r.getMessage() for r in caplog.records if "unreadable_task" in r.getMessage()]
    assert len(warnings) == 1
    after = store.events.snapshot()
    assert after.get(ev.UNREADABLE_TASK, 0) - before.get(ev.UNREADABLE_TASK, 0) == 1
    assert after.get(ev.DEAD_LETTERED, 0) - before.get(ev.DEAD_LETTERED, 0) == 1
    (nxt,) = await store.claim(Q, node_id="n", limit=10, ordered=True)  # its key goes on (SKIP)
    assert nxt.id == second


NOT_UTF8 = b'{"n": "\x80\xff"}'  # SQLite keeps any bytes as TEXT; sqlite3 fails the fetch of such a row


def _write_not_utf8(path: str, task_id: int) -> None:
    raw = sqlite3.connect(path)
    try:
        with raw:
            raw.execute("UPDATE coord_tasks SET payload = CAST(? AS TEXT) WHERE id = ?", (NOT_UTF8, task_id))
    finally:
        raw.close()


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
@pytest.mark.parametrize("ordered", [False, True])
async def test_a_payload_that_is_not_utf8_text_is_dead_lettered_not_failing_every_claim(
    store: Any, ordered: bool
) -> None:
    await store.set_dead_letter_policy(Q, DeadLetterPolicy.SKIP)  # the conversation goes on past it
    ids = [(await store.enqueue(Q, {"n": n}, partition_key="chat" if ordered else f"k{n}")).task.id for n in range(3)]
    _write_not_utf8(store.path, ids[1])
    claimed: list[Task] = []
    for _ in range(4):  # in order: one claim per task, the poison one's claim empty
        batch = await store.claim(Q, node_id="n", limit=10, ordered=ordered)
        claimed += batch
        for t in batch:
            await store.complete(t)
    assert [t.id for t in claimed] == [ids[0], ids[2]]
    (dead,) = await store.dead_letters(Q)
    assert dead.id == ids[1]
    assert dead.last_error == f"stored payload is unreadable: {len(NOT_UTF8)} bytes that are no UTF-8 text"
    assert isinstance(dead.payload, UnreadableValue)
    with pytest.raises(UnreadableRowError):
        await store.get(ids[1])


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_complete_and_claim_next_dead_letters_a_next_task_that_is_not_utf8_text(store: Any) -> None:
    ids = [(await store.enqueue(Q, {"n": n}, partition_key="chat")).task.id for n in range(3)]
    (head,) = await store.claim(Q, node_id="n", limit=1, ordered=True)
    _write_not_utf8(store.path, ids[1])
    follow = await store.complete_and_claim_next(head, lease_s=30.0)
    assert follow.done.status is TaskStatus.DONE
    assert follow.next_task is None
    assert [t.id for t in await store.dead_letters(Q)] == [ids[1]]
    assert [t.id for t in await store.claim(Q, node_id="n", limit=10, ordered=True)] == [ids[2]]


def _write_raw(path: str, task_id: int, column: str, value: bytes, as_text: bool) -> None:
    """Store ``value`` in ``column`` as a BLOB, or as a TEXT of those bytes (``as_text``: no UTF-8 then)."""
    raw = sqlite3.connect(path)
    try:
        with raw:
            cast = "CAST(? AS TEXT)" if as_text else "?"
            raw.execute(f"UPDATE coord_tasks SET {column} = {cast} WHERE id = ?", (value, task_id))
    finally:
        raw.close()


NO_TEXT = pytest.mark.parametrize(
    ("value", "as_text", "reason"),
    [(b"k1", False, "a BLOB of 2 bytes, not text"), (b"k\x80\xff", True, "3 bytes that are no UTF-8 text")],
)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
@pytest.mark.parametrize("column", ["partition_key", "idempotency_key", "last_error"])
@pytest.mark.parametrize("ordered", [False, True])
@NO_TEXT
async def test_a_text_column_holding_no_text_is_dead_lettered_never_handed_out_as_bytes(
    store: Any, caplog: pytest.LogCaptureFixture, column: str, ordered: bool, value: bytes, as_text: bool, reason: str
) -> None:
    ids = [(await store.enqueue(Q, {"n": n}, partition_key=f"k{n}", idempotency_key=f"i{n}")).task.id for n in range(3)]
    _write_raw(store.path, ids[1], column, value, as_text)
    claimed: list[Task] = []
    with caplog.at_level(logging.WARNING, logger="asynccoord"):
        for _ in range(2):
            claimed += await store.claim(Q, node_id="n", limit=10, ordered=ordered)
    assert sorted(t.id for t in claimed) == [ids[0], ids[2]]
    assert all(type(t.partition_key) is str and type(t.idempotency_key) is str for t in claimed)
    warnings = [r.getMessage() for r in caplog.records if "unreadable_task" in r.getMessage()]
    assert len(warnings) == 1
    assert f"column={column}" in warnings[0]
    (dead,) = await store.dead_letters(Q)
    assert dead.id == ids[1]
    assert dead.last_error == f"stored {column} is unreadable: {reason}"
    assert all(type(v) is str for v in (dead.queue, dead.partition_key, dead.idempotency_key))
    if column == "last_error":  # the dead-lettering wrote a text in its place
        assert (await store.get(ids[1])).last_error == dead.last_error
    else:
        with pytest.raises(UnreadableRowError) as caught:
            await store.get(ids[1])
        assert (caught.value.column, caught.value.reason) == (column, reason)
    # Requeued (the heads of its key recomputed), it is claimed and dead again: no crash, no loop.
    assert await store.requeue_dead(Q, [ids[1]]) == 1
    if column == "last_error":  # it reads again now
        (again,) = await store.claim(Q, node_id="n", limit=10, ordered=ordered)
        assert again.id == ids[1]
        return
    assert await store.claim(Q, node_id="n", limit=10, ordered=ordered) == []
    assert [t.id for t in await store.dead_letters(Q)] == [ids[1]]
    assert await store.discard_dead(Q, [ids[1]]) == 1


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
@NO_TEXT
async def test_a_queue_name_holding_no_text_is_shown_by_its_repr_in_queue_depths(
    store: Any, value: bytes, as_text: bool, reason: str
) -> None:
    ids = [(await store.enqueue(Q, {"n": n})).task.id for n in range(2)]
    _write_raw(store.path, ids[1], "queue", value, as_text)
    depths = {d.queue: d.counts[TaskStatus.PENDING] for d in await store.queue_depths()}
    assert depths == {Q: 1, repr(value): 1}
    with pytest.raises(UnreadableRowError) as caught:
        await store.get(ids[1])
    assert (caught.value.column, caught.value.reason) == ("queue", reason)
    assert [t.id for t in await store.claim(Q, node_id="n", limit=10)] == [ids[0]]  # in no queue of text


def test_limit_keys_keep_any_text_a_store_can_key_a_bucket_by() -> None:
    assert decode_limit_keys('{"chat":"café ☕","user":" 7"}') == {"chat": "café ☕", "user": " 7"}
    for text in ('{"chat":"a\\u0000b"}', '{"\\u0000":"c1"}', '{"chat":"\\udc80"}'):
        with pytest.raises(ValueError, match="a NUL or a lone surrogate"):
            decode_limit_keys(text)
