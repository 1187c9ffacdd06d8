"""Bad input: every public entry point refuses it with a typed error naming the value,
before anything is written; payloads that JSON can keep round-trip exactly.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import sqlite3
import sys
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from support import FakeClock

from asynccoord import (
    CoordError,
    InvalidArgumentError,
    InvalidTypeError,
    MemoryStore,
    NewTask,
    NotADatabaseError,
    PayloadTooLargeError,
    ProcessedRetention,
    RetryPolicy,
    SchemaVersionError,
    SQLiteStore,
    StoreClosedError,
    StoreConfig,
    StoreError,
    Task,
    TaskNotFoundError,
    TaskStatus,
)
from asynccoord.backends.open import open_store
from asynccoord.backends.sqlfiles import load_migrations
from asynccoord.config import MAX_BATCH_OPS, MAX_PAYLOAD_BYTES
from asynccoord.partition import MAX_PARTITIONS
from asynccoord.validation import MAX_DURATION_S, MAX_PAYLOAD_DEPTH, MIN_LEASE_S

Q = "jobs"
SCHEMA_VERSION = len(load_migrations("sqlite"))
ARG = InvalidArgumentError
TYPE = InvalidTypeError
MAX_S = MAX_DURATION_S
YEAR = "31536000 seconds (one year, MAX_DURATION_S)"
FLOOR = "must be >= 0.01 seconds (MIN_LEASE_S"  # how a lease below MIN_LEASE_S is refused
EVERY = "must be >= 0.001 seconds (MIN_INTERVAL_S: a shorter interval is a busy loop), got"  # a loop's floor
SEQ = "partitions must be a collection of ints (a list, tuple, range or set) or None, got"


def test_error_classes_are_builtin_subclasses() -> None:
    assert issubclass(InvalidArgumentError, ValueError)
    assert issubclass(InvalidArgumentError, CoordError)
    assert issubclass(PayloadTooLargeError, InvalidArgumentError)
    assert issubclass(InvalidTypeError, TypeError)
    assert issubclass(InvalidTypeError, CoordError)
    assert issubclass(TaskNotFoundError, KeyError)
    assert issubclass(NotADatabaseError, StoreError)
    assert issubclass(SchemaVersionError, StoreError)


# --- every store method, with a store that already holds data -------------------------


@dataclasses.dataclass
class Seeded:
    store: MemoryStore | SQLiteStore
    running: Task
    pending: Task
    done: Task


@pytest.fixture
async def seeded(make_store) -> Seeded:
    store = await make_store(config=StoreConfig(max_payload_bytes=1000))
    await store.enqueue(Q, {"n": 1}, idempotency_key="m-1")
    await store.enqueue(Q, {"n": 2}, idempotency_key="m-2")
    pending = (await store.enqueue(Q, {"n": 3})).task
    running, finishing = await store.claim(Q, node_id="node-a", limit=2, lease_s=60)
    done = await store.complete(finishing)
    return Seeded(store=store, running=running, pending=pending, done=done)


async def state_of(s: Seeded) -> tuple[Any, ...]:
    store = s.store
    tasks = [await store.get(t.id) for t in (s.running, s.pending, s.done)]
    return (
        await store.stats(),
        dict(store.events.snapshot()),
        tasks,
        await store.is_processed(Q, "m-1"),
        await store.is_processed(Q, "m-2"),
        getattr(store, "transactions", None),
    )


Call = Callable[[Seeded], Coroutine[Any, Any, Any]]


def tampered(s: Seeded, **changes: Any) -> Task:
    """The running task with some fields replaced, as a buggy (or hostile) caller might pass it."""
    return dataclasses.replace(s.running, **changes)


circular: list[Any] = []
circular.append(circular)


BAD_CALLS: list[tuple[str, Call, type[Exception], str]] = [
    # enqueue: names
    ("queue-int", lambda s: s.store.enqueue(123, 1), TYPE, "queue must be a str, got int 123"),
    ("queue-empty", lambda s: s.store.enqueue("", 1), ARG, "queue must not be empty"),
    ("queue-nul", lambda s: s.store.enqueue("a\x00b", 1), ARG, "queue must not contain NUL characters, got 'a\\x00b'"),
    ("queue-surrogate", lambda s: s.store.enqueue("a\ud800", 1), ARG, "queue must be valid Unicode text"),
    ("queue-long", lambda s: s.store.enqueue("x" * 256, 1), ARG, "queue must be at most 255 characters, got 256"),
    ("key-nul", lambda s: s.store.enqueue(Q, 1, partition_key="k\x00"), ARG, "partition_key must not contain NUL"),
    ("key-surrogate", lambda s: s.store.enqueue(Q, 1, partition_key="\udfff"), ARG, "partition_key must be valid"),
    ("key-bytes", lambda s: s.store.enqueue(Q, 1, partition_key=b"k"), TYPE, "partition_key must be a str, got bytes"),
    ("idem-empty", lambda s: s.store.enqueue(Q, 1, idempotency_key=""), ARG, "idempotency_key must not be empty"),
    ("idem-nul", lambda s: s.store.enqueue(Q, 1, idempotency_key="m\x00"), ARG, "idempotency_key must not contain NUL"),
    ("idem-surrogate", lambda s: s.store.enqueue(Q, 1, idempotency_key="\ud83d"), ARG, "idempotency_key must be valid"),
    ("idem-int", lambda s: s.store.enqueue(Q, 1, idempotency_key=7), TYPE, "idempotency_key must be a str, got int 7"),
    # enqueue: numbers
    ("priority-str", lambda s: s.store.enqueue(Q, 1, priority="1"), TYPE, "priority must be an int, got str '1'"),
    ("priority-bool", lambda s: s.store.enqueue(Q, 1, priority=True), TYPE, "priority must be an int, got bool"),
    ("priority-huge", lambda s: s.store.enqueue(Q, 1, priority=2**31), ARG, "priority must be <= 2147483647"),
    ("max-attempts-0", lambda s: s.store.enqueue(Q, 1, max_attempts=0), ARG, "max_attempts must be >= 1, got 0"),
    ("delay-negative", lambda s: s.store.enqueue(Q, 1, delay_s=-0.5), ARG, "delay_s must be >= 0, got -0.5"),
    ("delay-nan", lambda s: s.store.enqueue(Q, 1, delay_s=math.nan), ARG, "delay_s must be finite, got nan"),
    ("delay-inf", lambda s: s.store.enqueue(Q, 1, delay_s=math.inf), ARG, "delay_s must be finite, got inf"),
    ("delay-str", lambda s: s.store.enqueue(Q, 1, delay_s="1"), TYPE, "delay_s must be a number, got str '1'"),
    # enqueue: payloads
    ("payload-set", lambda s: s.store.enqueue(Q, {1, 2}), TYPE, "payload is not JSON-serializable"),
    ("payload-bytes", lambda s: s.store.enqueue(Q, b"raw"), TYPE, "payload is not JSON-serializable"),
    ("payload-object", lambda s: s.store.enqueue(Q, {"o": object()}), TYPE, "payload is not JSON-serializable"),
    ("payload-nan", lambda s: s.store.enqueue(Q, {"x": math.nan}), ARG, "payload is not valid JSON"),
    ("payload-inf", lambda s: s.store.enqueue(Q, [1, -math.inf]), ARG, "payload is not valid JSON"),
    ("payload-tuple", lambda s: s.store.enqueue(Q, (1, 2)), ARG, "would not round-trip through JSON unchanged"),
    ("payload-nested-tuple", lambda s: s.store.enqueue(Q, {"a": [(1,)]}), ARG, "would not round-trip"),
    ("payload-int-key", lambda s: s.store.enqueue(Q, {1: "a"}), ARG, "would not round-trip"),
    ("payload-circular", lambda s: s.store.enqueue(Q, circular), ARG, "payload is not valid JSON"),
    ("payload-large", lambda s: s.store.enqueue(Q, "x" * 999), PayloadTooLargeError, "payload encodes to 1001 bytes"),
    # enqueue_many: the whole batch is refused when one item is bad
    ("many-not-list", lambda s: s.store.enqueue_many(iter([])), TYPE, "tasks must be a list or tuple of NewTask"),
    ("many-dict", lambda s: s.store.enqueue_many([{"queue": Q}]), TYPE, "tasks[0] must be a NewTask, got dict"),
    (
        "many-third-bad",
        lambda s: s.store.enqueue_many(
            [NewTask(queue=Q, payload=1), NewTask(queue=Q, payload=2), NewTask(queue=Q, payload={3})]
        ),
        TYPE,
        "tasks[2].payload is not JSON-serializable",
    ),
    (
        "many-third-large",
        lambda s: s.store.enqueue_many([NewTask(queue=Q), NewTask(queue=Q), NewTask(queue=Q, payload="é" * 600)]),
        PayloadTooLargeError,
        "tasks[2].payload encodes to 1202 bytes, over the limit of 1000 bytes",
    ),
    # claim
    ("claim-queue", lambda s: s.store.claim("", node_id="n"), ARG, "queue must not be empty"),
    ("claim-node-none", lambda s: s.store.claim(Q, node_id=None), TYPE, "node_id must be a str, got NoneType"),
    ("claim-node-nul", lambda s: s.store.claim(Q, node_id="n\x00"), ARG, "node_id must not contain NUL"),
    ("claim-limit-0", lambda s: s.store.claim(Q, node_id="n", limit=0), ARG, "limit must be >= 1, got 0"),
    ("claim-limit-neg", lambda s: s.store.claim(Q, node_id="n", limit=-3), ARG, "limit must be >= 1, got -3"),
    ("claim-limit-big", lambda s: s.store.claim(Q, node_id="n", limit=10_001), ARG, "limit must be <= 10000"),
    ("claim-limit-float", lambda s: s.store.claim(Q, node_id="n", limit=2.0), TYPE, "limit must be an int, got float"),
    ("claim-lease-0", lambda s: s.store.claim(Q, node_id="n", lease_s=0), ARG, "lease_s must be > 0, got 0"),
    ("claim-lease-neg", lambda s: s.store.claim(Q, node_id="n", lease_s=-1.5), ARG, "lease_s must be > 0, got -1.5"),
    ("claim-lease-nan", lambda s: s.store.claim(Q, node_id="n", lease_s=math.nan), ARG, "lease_s must be finite"),
    ("claim-lease-none", lambda s: s.store.claim(Q, node_id="n", lease_s=None), TYPE, "lease_s must be a number"),
    (
        "claim-parts-str",
        lambda s: s.store.claim(Q, node_id="n", partitions="12"),
        TYPE,
        f"{SEQ} str '12'",
    ),
    ("claim-parts-int", lambda s: s.store.claim(Q, node_id="n", partitions=5), TYPE, f"{SEQ} int 5"),
    ("claim-parts-neg", lambda s: s.store.claim(Q, node_id="n", partitions=[-1]), ARG, "partitions[0] must be >= 0"),
    (
        "claim-parts-big",
        lambda s: s.store.claim(Q, node_id="n", partitions=[0, 1024]),
        ARG,
        "partitions[1] must be <= 1023, got 1024",
    ),
    ("claim-ordered", lambda s: s.store.claim(Q, node_id="n", ordered="yes"), TYPE, "ordered must be a bool"),
    # complete
    ("complete-none", lambda s: s.store.complete(None), TYPE, "task must be a Task returned by claim, got NoneType"),
    ("complete-id", lambda s: s.store.complete(s.running.id), TYPE, "task must be a Task returned by claim, got int"),
    ("complete-unclaimed", lambda s: s.store.complete(s.pending), ARG, "carries no lease (status pending)"),
    ("complete-result-set", lambda s: s.store.complete(s.running, {1}), TYPE, "result is not JSON-serializable"),
    ("complete-result-nan", lambda s: s.store.complete(s.running, math.nan), ARG, "result is not valid JSON"),
    ("complete-result-big", lambda s: s.store.complete(s.running, "x" * 2000), PayloadTooLargeError, "result encodes"),
    # fail
    ("fail-error-none", lambda s: s.store.fail(s.running, None), TYPE, "error must be a str, got NoneType"),
    ("fail-error-exc", lambda s: s.store.fail(s.running, ValueError("x")), TYPE, "error must be a str, got ValueError"),
    ("fail-retry", lambda s: s.store.fail(s.running, "e", retry={"base_s": 1}), TYPE, "retry must be a RetryPolicy"),
    ("fail-unclaimed", lambda s: s.store.fail(s.pending, "e"), ARG, "carries no lease"),
    # release
    ("release-none", lambda s: s.store.release(None), TYPE, "task must be a Task"),
    ("release-unclaimed", lambda s: s.store.release(s.done), ARG, "carries no lease (status done)"),
    # extend / extend_many
    ("extend-0", lambda s: s.store.extend(s.running, 0), ARG, "lease_s must be > 0, got 0"),
    ("extend-neg", lambda s: s.store.extend(s.running, -10), ARG, "lease_s must be > 0, got -10"),
    ("extend-inf", lambda s: s.store.extend(s.running, math.inf), ARG, "lease_s must be finite, got inf"),
    ("extend-unclaimed", lambda s: s.store.extend(s.pending, 10), ARG, "carries no lease"),
    ("extend-many-0", lambda s: s.store.extend_many([s.running], 0), ARG, "lease_s must be > 0, got 0"),
    ("extend-many-item", lambda s: s.store.extend_many([s.running, "t"], 5), TYPE, "task must be a Task"),
    ("extend-many-none", lambda s: s.store.extend_many(None, 5), TYPE, "tasks must be a list or tuple"),
    # durations: finite, and at most MAX_DURATION_S (one year)
    ("claim-lease-huge", lambda s: s.store.claim(Q, node_id="n", lease_s=1e308), ARG, f"lease_s must be <= {YEAR}"),
    ("claim-lease-bigint", lambda s: s.store.claim(Q, node_id="n", lease_s=10**400), ARG, "lease_s must be finite"),
    ("claim-lease-year+", lambda s: s.store.claim(Q, node_id="n", lease_s=MAX_S + 1), ARG, f"got {MAX_S + 1!r}"),
    (
        "claim-due-age-huge",
        lambda s: s.store.claim(Q, node_id="n", min_due_age_s=1e12),
        ARG,
        f"min_due_age_s must be <= {YEAR}, got 1000000000000.0",
    ),
    ("claim-due-age-nan", lambda s: s.store.claim(Q, node_id="n", min_due_age_s=math.nan), ARG, "min_due_age_s must"),
    ("delay-huge", lambda s: s.store.enqueue(Q, 1, delay_s=1e308), ARG, f"delay_s must be <= {YEAR}, got 1e+308"),
    ("delay-year+", lambda s: s.store.enqueue(Q, 1, delay_s=MAX_S * 2), ARG, f"delay_s must be <= {YEAR}"),
    ("release-delay-huge", lambda s: s.store.release(s.running, delay_s=1e10), ARG, f"delay_s must be <= {YEAR}"),
    ("extend-huge", lambda s: s.store.extend(s.running, 1e308), ARG, f"lease_s must be <= {YEAR}, got 1e+308"),
    ("extend-many-huge", lambda s: s.store.extend_many([s.running], 1e20), ARG, f"lease_s must be <= {YEAR}"),
    ("purge-age-huge", lambda s: s.store.purge_processed(older_than_s=1e300), ARG, f"older_than_s must be <= {YEAR}"),
    (
        "purge-finished-huge",
        lambda s: s.store.purge_finished(Q, older_than_s=MAX_S * 10),
        ARG,
        f"older_than_s must be <= {YEAR}",
    ),
    # tampered tasks: identity fields are checked before the store is touched
    (
        "tamper-id-huge",
        lambda s: s.store.complete(tampered(s, id=2**70)),
        ARG,
        "task.id must be <= 9223372036854775807",
    ),
    ("tamper-id-neg", lambda s: s.store.fail(tampered(s, id=-1), "e"), ARG, "task.id must be >= 0, got -1"),
    ("tamper-id-float", lambda s: s.store.release(tampered(s, id=1.0)), TYPE, "task.id must be an int, got float"),
    ("tamper-id-bool", lambda s: s.store.extend(tampered(s, id=True), 5), TYPE, "task.id must be an int, got bool"),
    (
        "tamper-token-int",
        lambda s: s.store.extend(tampered(s, lease_token=123), 5),
        TYPE,
        "task.lease_token must be a str, got int 123",
    ),
    (
        "tamper-token-bytes",
        lambda s: s.store.complete_many([tampered(s, lease_token=b"x")]),
        TYPE,
        "task.lease_token must be a str, got bytes",
    ),
    ("tamper-token-empty", lambda s: s.store.release(tampered(s, lease_token="")), ARG, "task.lease_token must not be"),
    (
        "tamper-version-bool",
        lambda s: s.store.complete(tampered(s, version=True)),
        TYPE,
        "task.version must be an int, got bool True",
    ),
    (
        "tamper-version-huge",
        lambda s: s.store.extend_many([s.running, tampered(s, version=2**70)], 5),
        ARG,
        "task.version must be <= 9223372036854775807",
    ),
    ("tamper-version-neg", lambda s: s.store.fail(tampered(s, version=-1), "e"), ARG, "task.version must be >= 0"),
    ("tamper-version-str", lambda s: s.store.release(tampered(s, version="1")), TYPE, "task.version must be an int"),
    ("tamper-queue-int", lambda s: s.store.complete(tampered(s, queue=5)), TYPE, "task.queue must be a str, got int"),
    # blank names in a handed-back task: refused on the fast path of task checks too
    ("tamper-queue-blank", lambda s: s.store.extend(tampered(s, queue=" "), 5), ARG, "task.queue must not be only"),
    ("tamper-token-blank", lambda s: s.store.complete(tampered(s, lease_token="\t")), ARG, "task.lease_token must not"),
    ("tamper-key-none", lambda s: s.store.complete(tampered(s, partition_key=None)), TYPE, "task.partition_key must"),
    ("tamper-idem-int", lambda s: s.store.complete(tampered(s, idempotency_key=3)), TYPE, "task.idempotency_key must"),
    ("tamper-partition", lambda s: s.store.complete(tampered(s, partition=-5)), ARG, "task.partition must be >= 0"),
    ("tamper-attempts", lambda s: s.store.fail(tampered(s, attempts="1"), "e"), TYPE, "task.attempts must be an int"),
    ("tamper-max-attempts", lambda s: s.store.fail(tampered(s, max_attempts=0), "e"), ARG, "task.max_attempts must be"),
    (
        "tamper-status-str",
        lambda s: s.store.complete(tampered(s, status="running")),
        TYPE,
        "task.status must be a TaskStatus, got str 'running'",
    ),
    # get
    ("get-str", lambda s: s.store.get("1"), TYPE, "task_id must be an int, got str '1'"),
    ("get-bool", lambda s: s.store.get(True), TYPE, "task_id must be an int, got bool"),
    ("get-float", lambda s: s.store.get(1.0), TYPE, "task_id must be an int, got float"),
    ("get-negative", lambda s: s.store.get(-1), ARG, "task_id must be >= 0, got -1"),
    # stats, requeue_dead, processed ids, purges
    ("stats-queue", lambda s: s.store.stats(""), ARG, "queue must not be empty"),
    ("stats-queue-int", lambda s: s.store.stats(3), TYPE, "queue must be a str, got int 3"),
    ("requeue-queue", lambda s: s.store.requeue_dead(None), TYPE, "queue must be a str, got NoneType"),
    ("requeue-ids", lambda s: s.store.requeue_dead(Q, ["1"]), TYPE, "task_ids[0] must be an int, got str '1'"),
    ("requeue-ids-neg", lambda s: s.store.requeue_dead(Q, [3, -4]), ARG, "task_ids[1] must be >= 0, got -4"),
    ("requeue-ids-int", lambda s: s.store.requeue_dead(Q, 5), TYPE, "task_ids must be a list or tuple"),
    ("processed-consumer", lambda s: s.store.is_processed("", "m"), ARG, "consumer must not be empty"),
    ("processed-message", lambda s: s.store.is_processed(Q, "m\x00"), ARG, "message_id must not contain NUL"),
    ("purge-age", lambda s: s.store.purge_processed(older_than_s=-1), ARG, "older_than_s must be >= 0, got -1"),
    ("purge-batch", lambda s: s.store.purge_processed(batch=0), ARG, "batch must be >= 1, got 0"),
    ("purge-finished-age", lambda s: s.store.purge_finished(Q, older_than_s=math.nan), ARG, "older_than_s must be"),
    ("purge-finished-batch", lambda s: s.store.purge_finished(Q, older_than_s=0, batch=0), ARG, "batch must be >= 1"),
    ("purge-finished-queue", lambda s: s.store.purge_finished("", older_than_s=0), ARG, "queue must not be empty"),
    # leases below MIN_LEASE_S (a unit mistake): refused before any task is leased or renewed
    ("claim-lease-tiny", lambda s: s.store.claim(Q, node_id="n", lease_s=1e-9), ARG, f"lease_s {FLOOR}"),
    (
        "claim-lease-under",
        lambda s: s.store.claim(Q, node_id="n", lease_s=0.0099),
        ARG,
        "before it is used), got 0.0099",
    ),
    ("claim-lease-tiny-got", lambda s: s.store.claim(Q, node_id="n", lease_s=1e-6), ARG, "got 1e-06"),
    (
        "unchecked-claim-lease-tiny",
        lambda s: s.store.unchecked_claim(Q, node_id="n", lease_s=1e-9),
        ARG,
        f"lease_s {FLOOR}",
    ),
    ("extend-tiny", lambda s: s.store.extend(s.running, 1e-9), ARG, f"lease_s {FLOOR}"),
    ("extend-many-tiny", lambda s: s.store.extend_many([s.running], 0.001), ARG, f"lease_s {FLOOR}"),
    (
        "claim-next-lease-tiny",
        lambda s: s.store.complete_and_claim_next(s.running, lease_s=1e-6),
        ARG,
        f"lease_s {FLOOR}",
    ),
    # names that are only whitespace
    ("queue-blank", lambda s: s.store.enqueue(" ", 1), ARG, "queue must not be only whitespace, got ' '"),
    ("queue-blank-tabs", lambda s: s.store.enqueue("\t\n", 1), ARG, "queue must not be only whitespace"),
    ("queue-blank-unicode", lambda s: s.store.enqueue("\u3000\xa0", 1), ARG, "queue must not be only whitespace"),
    ("many-queue-blank", lambda s: s.store.enqueue_many([NewTask(queue="  ")]), ARG, "queue must not be only"),
    ("claim-queue-blank", lambda s: s.store.claim("  ", node_id="n"), ARG, "queue must not be only whitespace"),
    ("claim-node-blank", lambda s: s.store.claim(Q, node_id=" "), ARG, "node_id must not be only whitespace"),
    ("claimable-queue-blank", lambda s: s.store.claimable_partitions(" "), ARG, "queue must not be only whitespace"),
    ("stats-queue-blank", lambda s: s.store.stats(" "), ARG, "queue must not be only whitespace"),
    ("drained-queue-blank", lambda s: s.store.is_drained(" "), ARG, "queue must not be only whitespace"),
    ("requeue-queue-blank", lambda s: s.store.requeue_dead("\t"), ARG, "queue must not be only whitespace"),
    ("processed-consumer-blank", lambda s: s.store.is_processed(" ", "m-1"), ARG, "consumer must not be only"),
    (
        "purge-finished-queue-blank",
        lambda s: s.store.purge_finished(" ", older_than_s=0),
        ARG,
        "queue must not be only whitespace",
    ),
    # partitions: a collection of ints (a list, tuple, range or set), never a mapping or text
    ("claim-parts-dict", lambda s: s.store.claim(Q, node_id="n", partitions={0: 1}), TYPE, f"{SEQ} dict {{0: 1}}"),
    ("claim-parts-bytes", lambda s: s.store.claim(Q, node_id="n", partitions=b"\x00"), TYPE, f"{SEQ} bytes"),
    ("claim-parts-set-str", lambda s: s.store.claim(Q, node_id="n", partitions={0, "1"}), TYPE, "got str '1'"),
    ("claim-parts-set-range", lambda s: s.store.claim(Q, node_id="n", partitions={0, 10**6}), ARG, "got 1000000"),
    ("claimable-parts-dict", lambda s: s.store.claimable_partitions(Q, {1: 0}), TYPE, f"{SEQ} dict {{1: 0}}"),
    ("claimable-parts-str", lambda s: s.store.claimable_partitions(Q, "01"), TYPE, f"{SEQ} str '01'"),
    (
        "unchecked-claim-parts-str",
        lambda s: s.store.unchecked_claim(Q, node_id="n", partitions="0"),
        TYPE,
        f"{SEQ} str '0'",
    ),
]


@pytest.mark.parametrize(("call", "error", "message"), [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS])
async def test_bad_argument_is_refused_and_nothing_written(
    seeded: Seeded, call: Call, error: type[Exception], message: str
) -> None:
    before = await state_of(seeded)
    with pytest.raises(error, match=re.escape(message)) as info:
        await call(seeded)
    assert type(info.value) is error  # exactly the documented class, not a driver error
    assert await state_of(seeded) == before
    if seeded.store.__class__ is SQLiteStore:
        running = await seeded.store.get(seeded.running.id)
        assert running.status is TaskStatus.RUNNING


async def test_bad_argument_store_is_still_usable(seeded: Seeded) -> None:
    with pytest.raises(InvalidArgumentError):
        await seeded.store.claim(Q, node_id="n", limit=0)
    with pytest.raises(InvalidTypeError):
        await seeded.store.enqueue(Q, {1})
    done = await seeded.store.complete(seeded.running, {"ok": True})
    assert done.status is TaskStatus.DONE


async def test_unknown_task_id(seeded: Seeded) -> None:
    before = await state_of(seeded)
    with pytest.raises(TaskNotFoundError, match="no task with id 987654"):
        await seeded.store.get(987654)
    ghost = dataclasses.replace(seeded.running, id=987654)
    for call in (
        seeded.store.complete(ghost),
        seeded.store.fail(ghost, "e"),
        seeded.store.release(ghost),
        seeded.store.extend(ghost, 5),
    ):
        with pytest.raises(TaskNotFoundError, match="987654"):
            await call
    assert await seeded.store.extend_many([ghost], 5) == [False]
    assert await seeded.store.requeue_dead(Q, [987654]) == 0
    after = await state_of(seeded)
    assert after[:5] == before[:5]


# --- payloads the store keeps exactly -------------------------------------------------


AWKWARD_PAYLOADS: list[Any] = [
    "nul \x00 inside",
    "\x00",
    "lone high \ud800 and lone low \udfff",
    {"k\x00ey": "v\x00", "\ud83d": ["\ude00", "\x00\ud800"]},
    "real emoji 😀 and RTL שלום and combining é",
    {"deep": [[[[[[{"x": [1, 2.5, -0.0, 10**30, -(2**63), 2**64, 1e300, 5e-324]}]]]]]]},
    ["", None, True, False, 0, 1.0, {}, []],
    'control \x01\x1f\x7f chars and backslash \\ and quote "',
    None,
    0,
    "",
]


@pytest.mark.parametrize("payload", AWKWARD_PAYLOADS, ids=range(len(AWKWARD_PAYLOADS)))
async def test_payload_round_trips_exactly(store, payload: Any) -> None:
    enq = await store.enqueue(Q, payload)
    [claimed] = await store.claim(Q, node_id="n")
    for got in (enq.task.payload, (await store.get(enq.task.id)).payload, claimed.payload):
        assert got == payload
        assert repr(got) == repr(payload)  # 1 vs 1.0 vs True, -0.0 vs 0.0 kept apart
    done = await store.complete(claimed, result=payload)
    stored = await store.get(claimed.id)
    assert repr(done.result) == repr(payload)
    assert repr(stored.result) == repr(payload)


def nested(levels: int) -> Any:
    value: Any = 1
    for n in range(levels):
        value = [value] if n % 2 else {"k": value}
    return value


async def test_a_payload_may_nest_100_levels_whatever_the_callers_stack(store) -> None:
    """The depth bound is MAX_PAYLOAD_DEPTH, not what is left of Python's recursion limit: the
    same payloads are accepted and refused from a deep call stack as from a shallow one."""

    async def at_depth(frames: int, payload: Any) -> Any:
        if frames:
            return await at_depth(frames - 1, payload)
        return await store.enqueue(Q, payload)

    for frames in (0, 600):
        done = await at_depth(frames, nested(MAX_PAYLOAD_DEPTH))
        assert (await store.get(done.task.id)).payload == nested(MAX_PAYLOAD_DEPTH)
        with pytest.raises(InvalidArgumentError, match="payload is nested deeper than 100 levels"):
            await at_depth(frames, nested(MAX_PAYLOAD_DEPTH + 1))
    assert (await store.stats(Q)).total == 2


async def test_payload_round_trips_on_a_fresh_sqlite_connection(db_path: Path) -> None:
    payload = {"nul": "\x00", "surrogates": "\ud800-\udfff-\udc00", "emoji": "😀"}
    async with SQLiteStore(db_path) as store:
        task_id = (await store.enqueue(Q, payload)).task.id
    async with SQLiteStore(db_path) as store:
        assert (await store.get(task_id)).payload == payload


async def test_adjacent_lone_surrogates_are_refused_not_merged(store) -> None:
    # "\ud800\udfff" is two lone surrogates; their JSON escapes would decode as ONE
    # astral character, so the store must refuse the payload rather than alter it.
    with pytest.raises(InvalidArgumentError, match="would not round-trip"):
        await store.enqueue(Q, {"s": "\ud800\udfff"})
    assert (await store.stats()).total == 0


async def test_payload_size_limit_is_in_utf8_bytes(make_store) -> None:
    store = await make_store(config=StoreConfig(max_payload_bytes=100))
    assert (await store.enqueue(Q, "x" * 98)).created  # '"' + 98 + '"' = 100 bytes
    assert (await store.enqueue(Q, "é" * 49)).created  # 2 bytes each: 100 bytes
    with pytest.raises(PayloadTooLargeError, match="101 bytes, over the limit of 100 bytes"):
        await store.enqueue(Q, "x" * 99)
    with pytest.raises(PayloadTooLargeError, match="102 bytes"):
        await store.enqueue(Q, "é" * 50)
    with pytest.raises(PayloadTooLargeError):
        await store.enqueue(Q, "\ud800" * 20)  # escaped as \\ud800: 6 bytes each
    assert (await store.stats()).total == 2


async def test_enqueue_names_its_payload_argument_payload(store) -> None:
    """Not ``tasks[0].payload``, the name of ``enqueue_many``'s first task, which it builds."""
    with pytest.raises(InvalidTypeError) as info:
        await store.enqueue(Q, {1, 2})
    assert str(info.value).startswith("payload is not JSON-serializable")
    with pytest.raises(PayloadTooLargeError) as too_large:
        await store.enqueue(Q, "x" * (1 << 20))
    assert str(too_large.value).startswith(f"payload encodes to {(1 << 20) + 2} bytes")
    assert (await store.stats()).total == 0


async def test_default_payload_limit_is_one_mib(store) -> None:
    assert store.config.max_payload_bytes == 1 << 20
    task = (await store.enqueue(Q, "x" * ((1 << 20) - 2))).task
    assert len(task.payload) == (1 << 20) - 2
    with pytest.raises(PayloadTooLargeError, match=f"{(1 << 20) + 1} bytes, over the limit of {1 << 20} bytes"):
        await store.enqueue(Q, "x" * ((1 << 20) - 1))
    assert (await store.stats()).total == 1


async def test_names_keep_unicode_that_is_valid(store) -> None:
    key = "conv-😀-שלום-" + "é" * 200
    task = (await store.enqueue("queue-ü", 1, partition_key=key, idempotency_key="id-😀")).task
    got = await store.get(task.id)
    assert (got.queue, got.partition_key, got.idempotency_key) == ("queue-ü", key, "id-😀")
    assert (await store.enqueue("queue-ü", 2, idempotency_key="id-😀")).created is False
    assert (await store.enqueue(Q, 1, partition_key="x" * 255)).created


# --- construction and configuration ------------------------------------------------------


def test_store_constructor_arguments() -> None:
    with pytest.raises(InvalidTypeError, match="path must be a str or PathLike, got int"):
        SQLiteStore(123)  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match="config must be a StoreConfig, got dict"):
        SQLiteStore("x.db", config={})  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match="config must be a StoreConfig, got str"):
        MemoryStore(config="fast")  # type: ignore[arg-type]


def test_every_store_refuses_a_clock_that_is_not_callable(tmp_path: Path) -> None:
    from asynccoord.backends.postgres.store import PostgresStore
    from asynccoord.backends.redis import RedisLockStore

    makers: list[Callable[[Any], object]] = [
        lambda clock: SQLiteStore(tmp_path / "never.db", clock=clock),
        lambda clock: MemoryStore(clock=clock),
        lambda clock: PostgresStore("postgresql://u@127.0.0.1:1/db", clock=clock),
        lambda clock: RedisLockStore("redis://127.0.0.1:1/0", clock=clock),
    ]
    for make in makers:
        with pytest.raises(InvalidTypeError, match="clock must be callable or None, got str 'x'"):
            make("x")
        with pytest.raises(InvalidTypeError, match=r"clock must be callable or None, got float 1\.5"):
            make(1.5)
        assert make(lambda: 1.0) is not None
        assert make(None) is not None
    assert list(tmp_path.iterdir()) == []  # refused before any file was made


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"retention_s": 10, "redelivery_window_s": 20},
            ARG,
            "retention_s (10) is shorter than redelivery_window_s (20)",
        ),
        ({"retention_s": 3600}, ARG, "retention_s (3600) is shorter than redelivery_window_s (86400.0)"),
        ({"retention_s": 0, "redelivery_window_s": 0}, ARG, "retention_s must be > 0, got 0"),
        ({"redelivery_window_s": -1}, ARG, "redelivery_window_s must be >= 0, got -1"),
        ({"purge_batch": 0}, ARG, "purge_batch must be >= 1, got 0"),
        ({"purge_batch": 10.0}, TYPE, "purge_batch must be an int, got float"),
        ({"purge_batch": 2**31}, ARG, "purge_batch must be <= 2147483647, got 2147483648"),
        ({"purge_batch": 2**70}, ARG, "purge_batch must be <= 2147483647, got 1180591620717411303424"),
        ({"retention_s": "1d"}, TYPE, "retention_s must be a number, got str '1d'"),
        ({"retention_s": 2 * 365 * 86400}, ARG, f"retention_s must be <= {YEAR}, got 63072000"),
        ({"redelivery_window_s": math.inf}, ARG, "redelivery_window_s must be finite, got inf"),
    ],
)
def test_processed_retention_validation(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        ProcessedRetention(**kwargs)


def test_processed_retention_accepts_equal_window() -> None:
    r = ProcessedRetention(retention_s=2, redelivery_window_s=2, purge_batch=100)
    assert (r.retention_s, r.redelivery_window_s, r.purge_batch) == (2, 2, 100)
    assert ProcessedRetention(purge_batch=2**31 - 1).purge_batch == 2**31 - 1


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"base_s": 0}, ARG, "base_s must be > 0, got 0"),
        ({"base_s": -1}, ARG, "base_s must be > 0, got -1"),
        ({"base_s": math.nan}, ARG, "base_s must be finite, got nan"),
        ({"factor": 0.5}, ARG, "factor must be >= 1, got 0.5"),
        ({"factor": 0}, ARG, "factor must be > 0, got 0"),
        ({"base_s": 10, "cap_s": 5}, ARG, "cap_s must be >= base_s (10), got 5"),
        ({"jitter": 1.0}, ARG, "jitter must be in [0, 1), got 1.0"),
        ({"jitter": -0.1}, ARG, "jitter must be >= 0, got -0.1"),
        ({"max_attempts": 0}, ARG, "max_attempts must be >= 1, got 0"),
        ({"max_attempts": 2.5}, TYPE, "max_attempts must be an int, got float"),
        ({"max_attempts": 2**31}, ARG, "max_attempts must be <= 2147483647, got 2147483648"),
        ({"max_attempts": 2**40}, ARG, "max_attempts must be <= 2147483647, got 1099511627776"),
        ({"base_s": "1"}, TYPE, "base_s must be a number, got str"),
        ({"base_s": 1e308, "cap_s": 1e308}, ARG, f"base_s must be <= {YEAR}, got 1e+308"),
        ({"cap_s": MAX_DURATION_S + 0.5}, ARG, f"cap_s must be <= {YEAR}, got 31536000.5"),
        ({"cap_s": math.nan}, ARG, "cap_s must be finite, got nan"),
        ({"factor": 10**400}, ARG, "factor must be finite"),
    ],
)
def test_retry_policy_validation(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        RetryPolicy(**kwargs)


def test_retry_policy_delay() -> None:
    import random

    policy = RetryPolicy(base_s=0.2, factor=2, cap_s=1.0, jitter=0.0, max_attempts=10)
    assert [policy.delay_s(n) for n in range(1, 6)] == pytest.approx([0.2, 0.4, 0.8, 1.0, 1.0])
    assert policy.delay_s(10_000) == 1.0  # no overflow far out
    jittered = RetryPolicy(base_s=1.0, jitter=0.25)
    rng = random.Random(7)
    draws = [jittered.delay_s(1, rng) for _ in range(1000)]
    assert min(draws) >= 0.75
    assert max(draws) <= 1.25
    assert min(draws) < 0.8
    assert max(draws) > 1.2
    with pytest.raises(InvalidArgumentError, match="failures must be >= 1, got 0"):
        policy.delay_s(0)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"max_payload_bytes": 1}, ARG, "max_payload_bytes must be >= 2, got 1"),
        ({"busy_timeout_s": 0}, ARG, "busy_timeout_s must be > 0, got 0"),
        ({"synchronous_full": 1}, TYPE, "synchronous_full must be a bool, got int"),
        ({"max_payload_bytes": 10**20}, ARG, "max_payload_bytes must be <= 268435456, got 100000000000000000000"),
        ({"max_batch_ops": 0}, ARG, "max_batch_ops must be >= 1, got 0"),
        ({"max_batch_ops": 10**12}, ARG, "max_batch_ops must be <= 1000000, got 1000000000000"),
        ({"partitions": 0}, ARG, "partitions must be >= 1, got 0"),
        ({"partitions": 70_000}, ARG, "partitions must be <= 65536, got 70000"),
        ({"retry": {"base_s": 1}}, TYPE, "retry must be a RetryPolicy, got dict"),
        ({"processed": 86400}, TYPE, "processed must be a ProcessedRetention, got int"),
        ({"busy_timeout_s": 1e308}, ARG, f"busy_timeout_s must be <= {YEAR}, got 1e+308"),
        ({"busy_timeout_s": math.nan}, ARG, "busy_timeout_s must be finite"),
        ({"checkpoint_interval_s": 0}, ARG, "checkpoint_interval_s must be > 0, got 0"),
        ({"checkpoint_interval_s": 1e-12}, ARG, "checkpoint_interval_s must be >= 0.01 (or None), got 1e-12"),
        ({"checkpoint_interval_s": "1"}, TYPE, "checkpoint_interval_s must be a number, got str"),
    ],
)
def test_store_config_validation(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        StoreConfig(**kwargs)


def test_store_config_takes_its_integer_settings_up_to_their_bounds() -> None:
    config = StoreConfig(max_payload_bytes=MAX_PAYLOAD_BYTES, max_batch_ops=MAX_BATCH_OPS, partitions=MAX_PARTITIONS)
    assert (config.max_payload_bytes, config.max_batch_ops, config.partitions) == (1 << 28, 1_000_000, 1 << 16)


def test_durations_up_to_one_year_are_accepted() -> None:
    assert MAX_DURATION_S == 365 * 24 * 3600
    policy = RetryPolicy(base_s=MAX_DURATION_S, cap_s=MAX_DURATION_S, factor=1e9)  # a factor is not a duration
    assert policy.delay_s(3) <= MAX_DURATION_S * 1.1
    assert NewTask(queue=Q, delay_s=MAX_DURATION_S).delay_s == MAX_DURATION_S
    assert ProcessedRetention(retention_s=MAX_DURATION_S, redelivery_window_s=MAX_DURATION_S).retention_s > 0
    with pytest.raises(InvalidArgumentError, match=re.escape(f"delay_s must be <= {YEAR}, got 1e+100")):
        NewTask(queue=Q, delay_s=1e100)


async def test_a_task_due_in_one_year_is_stored_and_not_claimable(store) -> None:
    task = (await store.enqueue(Q, 1, delay_s=MAX_DURATION_S)).task
    assert task.run_at == pytest.approx(await store.now() + MAX_DURATION_S, abs=5)
    assert await store.claim(Q, node_id="n", lease_s=MAX_DURATION_S) == []
    late = (await store.enqueue(Q, 2)).task
    [claimed] = await store.claim(Q, node_id="n", lease_s=MAX_DURATION_S)
    assert claimed.id == late.id
    assert await store.extend(claimed, MAX_DURATION_S) == pytest.approx(await store.now() + MAX_DURATION_S, abs=5)


async def test_the_bounds_refuse_only_what_is_outside_them(store, clock: FakeClock) -> None:
    """A lease of exactly MIN_LEASE_S, names with spaces inside, blank keys (data, not names)
    and partitions as any sequence or set are all accepted on every backend."""
    assert MIN_LEASE_S == 0.01  # below the shortest lease the tests use (0.2 s)
    task = (await store.enqueue("my queue", 1, partition_key=" ", idempotency_key=" \t")).task
    assert (task.queue, task.partition_key, task.idempotency_key) == ("my queue", " ", " \t")
    owned = frozenset({task.partition, (task.partition + 1) % store.partitions})  # as owned_partitions gives it
    for parts in ((task.partition,), [task.partition], range(store.partitions), {task.partition}, owned, {}.keys()):
        expected = {task.partition} if parts else set()
        assert await store.claimable_partitions("my queue", parts) == expected
    assert await store.claim("my queue", node_id="node a", partitions=set()) == []
    assert await store.claim("my queue", node_id="node a", partitions=owned - {task.partition}) == []
    [claimed] = await store.claim("my queue", node_id="node a", lease_s=MIN_LEASE_S, partitions=owned)
    assert claimed.lease_expires_at == pytest.approx(clock.now + MIN_LEASE_S, abs=1e-3)
    assert await store.extend(claimed, MIN_LEASE_S) == pytest.approx(clock.now + MIN_LEASE_S, abs=1e-3)
    assert await store.extend_many([claimed], 1) == [True]  # an int is a number of seconds too
    await store.complete(claimed)
    assert await store.is_processed("my queue", " \t")
    assert (await store.enqueue("my queue", 2, idempotency_key=" \t")).created is False


def test_configs_are_frozen_and_keyword_only() -> None:
    policy = RetryPolicy()
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.base_s = 2.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        RetryPolicy(1.0)  # type: ignore[misc]
    with pytest.raises(TypeError):
        StoreConfig(1000)  # type: ignore[misc]


# --- files that are not (our) databases ---------------------------------------------------


async def test_file_that_is_not_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    content = b"These are my notes, not a database.\n" * 200
    path.write_bytes(content)
    store = SQLiteStore(path)
    with pytest.raises(NotADatabaseError, match=r"notes\.db") as info:
        await store.open()
    assert isinstance(info.value.__cause__, sqlite3.DatabaseError)
    assert path.read_bytes() == content  # untouched
    assert sorted(os.listdir(tmp_path)) == ["notes.db"]  # no -wal or -shm files either
    with pytest.raises(StoreClosedError):
        await store.enqueue(Q, 1)
    await store.close()  # closing a store that never opened is fine


async def test_directory_is_not_a_database(tmp_path: Path) -> None:
    with pytest.raises(NotADatabaseError, match="is a directory"):
        await SQLiteStore(tmp_path).open()


@pytest.mark.parametrize("read_only", [False, True], ids=["read-write", "read-only"])
@pytest.mark.timeout(10)  # SQLite's open of a FIFO blocks until a writer comes
async def test_a_fifo_or_a_device_is_not_a_database(tmp_path: Path, read_only: bool) -> None:
    fifo = tmp_path / "pipe.db"
    os.mkfifo(fifo)
    with pytest.raises(NotADatabaseError, match=r"'.*pipe\.db' is a named pipe \(FIFO\), not an SQLite database"):
        await SQLiteStore(fifo, read_only=read_only).open()
    with pytest.raises(NotADatabaseError, match="'/dev/null' is a character device"):
        await SQLiteStore("/dev/null", read_only=read_only).open()


async def test_a_path_in_a_missing_folder_names_the_folder(tmp_path: Path) -> None:
    with pytest.raises(NotADatabaseError) as info:  # a StoreError
        await SQLiteStore(tmp_path / "missing-dir" / "x.db").open()
    assert f"its folder {str(tmp_path / 'missing-dir')!r} does not exist" in str(info.value)


async def test_unopenable_path_is_a_store_error(tmp_path: Path) -> None:
    threads_before = set(threading.enumerate())
    with pytest.raises(StoreError) as info:  # the folder exists; the name is too long for the file system
        await SQLiteStore(tmp_path / ("x" * 300 + ".db")).open()
    assert type(info.value) is StoreError
    assert "unable to open database file" in str(info.value)
    assert isinstance(info.value.__cause__, sqlite3.Error)
    # aiosqlite stops its worker thread after a failed connect and reports back to this
    # loop: open() waits for that thread to end, so a caller whose loop closes at once (a
    # CLI exiting on the error) gets no "Event loop is closed" traceback from that thread.
    workers = [t for t in set(threading.enumerate()) - threads_before if "_connection_worker_thread" in t.name]
    assert [t for t in workers if t.is_alive()] == []


async def _store_with_meta(db_path: Path, key: str, value: str) -> int:
    """A store holding one task whose ``coord_meta`` ``key`` is then set to ``value``; the task's id."""
    async with SQLiteStore(db_path) as store:
        task_id = (await store.enqueue(Q, "keep me")).task.id
    with sqlite3.connect(db_path) as raw:
        raw.execute("UPDATE coord_meta SET value = ? WHERE key = ?", (value, key))
    raw.close()
    return task_id


def _assert_untouched(db_path: Path, key: str, value: str, task_id: int) -> None:
    """The refused open left ``coord_meta`` ``key`` at ``value`` and the task as it was."""
    raw = sqlite3.connect(db_path)
    try:
        assert raw.execute("SELECT value FROM coord_meta WHERE key = ?", (key,)).fetchone() == (value,)
        assert raw.execute("SELECT payload FROM coord_tasks WHERE id = ?", (task_id,)).fetchone() == ('"keep me"',)
    finally:
        raw.close()


async def test_newer_schema_version_is_refused(db_path: Path) -> None:
    task_id = await _store_with_meta(db_path, "schema_revision", "99")
    store = SQLiteStore(db_path)
    with pytest.raises(SchemaVersionError, match=f"schema version 99, newer than {SCHEMA_VERSION}") as info:
        await store.open()
    assert "upgrade asynccoord" in str(info.value)
    with pytest.raises(StoreClosedError):
        await store.get(task_id)
    _assert_untouched(db_path, "schema_revision", "99", task_id)


async def test_a_schema_revision_that_is_no_number_is_refused_untouched(db_path: Path) -> None:
    task_id = await _store_with_meta(db_path, "schema_revision", "3x")
    for read_only in (False, True):  # a ValueError of int() escaped both
        store = SQLiteStore(db_path, read_only=read_only)
        with pytest.raises(SchemaVersionError) as info:
            await store.open()
        assert str(info.value) == (
            f"{str(db_path)!r} records schema revision '3x' in its coord_meta table, which is no revision number: "
            f"the database was altered or damaged; restore it from a backup, or delete the file {str(db_path)!r} "
            "(with its -wal and -shm files) to start with an empty store"
        )
        with pytest.raises(StoreClosedError):
            await store.get(task_id)
    _assert_untouched(db_path, "schema_revision", "3x", task_id)


async def test_pre_release_database_is_refused_untouched_with_the_fix(db_path: Path) -> None:
    # A database made before the schema history was squashed: it records schema_version
    # (here the last of that history, 7), never a schema_revision.
    raw = sqlite3.connect(db_path, isolation_level=None)
    try:
        raw.execute("CREATE TABLE coord_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID")
        raw.execute("INSERT INTO coord_meta (key, value) VALUES ('schema_version', '7'), ('partitions', '64')")
    finally:
        raw.close()
    for read_only in (False, True):
        store = SQLiteStore(db_path, read_only=read_only)
        with pytest.raises(SchemaVersionError, match=r"before 0\.1\.0 \(schema version 7 ") as info:
            await store.open()
        assert f"delete the file {str(db_path)!r} (with its -wal and -shm files)" in str(info.value)
        with pytest.raises(StoreClosedError):
            await store.stats()
    raw = sqlite3.connect(db_path)
    try:
        assert raw.execute("SELECT key, value FROM coord_meta ORDER BY key").fetchall() == [
            ("partitions", "64"),
            ("schema_version", "7"),
        ]
        assert raw.execute("SELECT name FROM sqlite_master").fetchall() == [("coord_meta",)]  # nothing created
    finally:
        raw.close()


async def test_schema_is_created_once_and_reopened(db_path: Path) -> None:
    async with SQLiteStore(db_path, config=StoreConfig(partitions=64)) as store:
        assert store.partitions == 64
    # The partition count lives in the database; a different config cannot change it.
    async with SQLiteStore(db_path, config=StoreConfig(partitions=16)) as store:
        assert store.partitions == 64
    raw = sqlite3.connect(db_path)
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        row = raw.execute("SELECT value FROM coord_meta WHERE key = 'schema_revision'").fetchone()
        assert row == (str(SCHEMA_VERSION),)
        assert raw.execute("SELECT value FROM coord_meta WHERE key = 'schema_version'").fetchone() is None
    finally:
        raw.close()


async def test_closed_store_raises_store_closed(make_store) -> None:
    store = await make_store()
    task = (await store.enqueue(Q, 1)).task
    await store.close()
    with pytest.raises(StoreClosedError, match="not open"):
        await store.enqueue(Q, 2)
    with pytest.raises(StoreClosedError):
        await store.claim(Q, node_id="n")
    with pytest.raises(StoreClosedError):
        await store.get(task.id)
    with pytest.raises(StoreClosedError):
        await store.stats()
    await store.close()  # idempotent
    await store.open()
    assert (await store.get(task.id)).payload == 1


# --- values that cannot even be printed -----------------------------------------------


async def test_ints_over_the_repr_limit_are_refused_with_typed_errors(store: Any) -> None:
    huge = 10**5000  # repr() of it raises ValueError in CPython (4,300-digit limit)
    for call in (
        lambda: store.enqueue(Q, huge),
        lambda: store.enqueue(Q, {"n": [huge]}),
        lambda: store.enqueue(Q, 1, priority=huge),
        lambda: store.enqueue(Q, 1, delay_s=huge),
        lambda: store.get(huge),
        lambda: store.get(-huge),
    ):
        with pytest.raises((InvalidArgumentError, InvalidTypeError)) as info:
            await call()
        assert "bits>" in str(info.value) or "cannot be shown" in str(info.value) or "too large" in str(info.value)
    assert (await store.stats(Q)).total == 0


async def test_ints_no_default_process_reads_back_are_refused_under_a_lifted_limit(store: Any) -> None:
    """An int json writes only under a lifted ``sys.set_int_max_str_digits`` is refused: a node or
    ``status`` running with Python's default limit could not decode the stored task."""
    huge = 10**sys.int_info.default_max_str_digits  # one digit over the default limit
    lifted = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)  # no limit in this process
    try:
        for call in (
            lambda: store.enqueue(Q, huge),
            lambda: store.enqueue(Q, {"n": [1, -huge]}),
            lambda: store.fenced_write("r", 1, {"n": huge}),
        ):
            with pytest.raises(InvalidArgumentError, match="too large to read back") as info:
                await call()
            assert "set_int_max_str_digits" not in str(info.value)
        assert (await store.enqueue(Q, huge - 1)).task.payload == huge - 1  # the default limit reads it
    finally:
        sys.set_int_max_str_digits(lifted)
    assert (await store.stats(Q)).total == 1
    assert await store.read_fence("r") is None
    with pytest.raises(InvalidArgumentError, match="too large to read back") as info:
        await store.enqueue(Q, {"n": huge})  # the default limit: the same error, no advice to lift it
    assert "set_int_max_str_digits" not in str(info.value)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("", "path must name a file, got ''"),
        (" ", "path must name a file, got ' '"),
        ("\t\n", "path must name a file, got '\\t\\n'"),
        ("bot\x00.db", "path must not contain NUL characters"),
        ("bot\ud800.db", "path must be UTF-8 text (no lone surrogates), got 'bot\\ud800.db'"),
    ],
)
def test_sqlite_store_path_must_be_a_usable_file_name(path: str, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=re.escape(message)):
        SQLiteStore(path)
    with pytest.raises(InvalidArgumentError, match=re.escape(message)):
        open_store(path)


@pytest.mark.parametrize("suffix", ["q.db?mode=ro", "q.db#main", "q.db?", "?cache=shared"])
def test_an_sqlite_url_with_a_query_or_fragment_is_refused(tmp_path: Path, suffix: str) -> None:
    url = f"sqlite:///{tmp_path}/{suffix}"
    with pytest.raises(InvalidArgumentError) as info:
        open_store(url)
    assert str(info.value) == (
        f"an SQLite URL is sqlite:///PATH with no query string or fragment, got {url!r}: give options as "
        "keyword arguments of open_store()/SQLiteStore(...) (read_only=True, ...) or in StoreConfig"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("target", ["sqlite:", "sqlite:bot.db", "sqlite:/bot.db", "SQLite:///bot.db", "SQLITE:"])
def test_an_sqlite_url_without_its_three_slashes_is_refused_not_made_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str
) -> None:
    """``open_store("sqlite:")`` made a file literally named ``sqlite:`` in the current folder."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidArgumentError) as info:
        open_store(target)
    assert str(info.value).startswith(f"an SQLite URL is sqlite:///PATH (three slashes, lowercase), got {target!r}: ")
    assert "write ./sqlite:NAME" in str(info.value)
    assert list(tmp_path.iterdir()) == []


async def test_a_file_whose_name_begins_with_sqlite_colon_is_named_with_a_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    async with open_store("./sqlite:bot.db") as store:
        await store.enqueue("q", {"n": 1})
    assert os.listdir(tmp_path) == ["sqlite:bot.db"]


async def test_a_question_mark_in_a_plain_path_or_an_escaped_url_is_a_file_name(tmp_path: Path) -> None:
    async with open_store(str(tmp_path / "a?b#c.db")) as store:
        await store.enqueue("q", {"n": 1})
    async with open_store(f"sqlite:///{tmp_path}/d%3Fe%23f.db") as store:
        await store.enqueue("q", {"n": 1})
    assert sorted(name for name in os.listdir(tmp_path) if name.endswith(".db")) == ["a?b#c.db", "d?e#f.db"]


async def test_an_sqlite_url_read_relative_to_the_current_folder_hints_at_four_slashes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sqlite:///PATH is relative (SQLAlchemy's convention): when PATH misses what /PATH would find, the error
    says so, with the URL of the absolute path."""
    (tmp_path / "data").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    absolute = tmp_path / "data" / "bot.db"
    url = "sqlite:///" + str(absolute).lstrip("/")  # three slashes: read as relative to the current folder
    hint = (
        f"{url} names a path relative to the current folder {str(tmp_path / 'elsewhere')!r}; "
        f"did you mean sqlite:///{absolute} (four slashes: the absolute path {str(absolute)!r})?"
    )
    with pytest.raises(NotADatabaseError) as writing:  # the folder is missing, /PATH's is there
        async with open_store(url):
            pass
    assert str(writing.value).endswith(
        f"does not exist (create it first; a store creates the database file, never its folder); {hint}"
    ), writing.value
    with pytest.raises(NotADatabaseError) as reading:  # the absolute folder exists, but no file to read there yet
        async with open_store(url, read_only=True):
            pass
    assert "did you mean" not in str(reading.value)
    async with open_store(f"sqlite:///{absolute}") as store:  # four slashes: the absolute path
        await store.enqueue("q", {"n": 1})
    with pytest.raises(NotADatabaseError) as reading:  # the file is there at /PATH
        async with open_store(url, read_only=True):
            pass
    assert str(reading.value).endswith(f"(a read-only store never creates one); {hint}"), reading.value
    with pytest.raises(NotADatabaseError) as plain:  # a plain relative path is no URL: no hint
        async with open_store(str(absolute).lstrip("/"), read_only=True):
            pass
    assert "did you mean" not in str(plain.value)
    assert sorted(os.listdir(tmp_path / "elsewhere")) == []


def test_sqlite_store_refuses_a_bytes_path() -> None:
    class BytesPath:
        def __fspath__(self) -> bytes:
            return b"bot.db"

    with pytest.raises(InvalidTypeError, match=re.escape("path must be a str path, got bytes b'bot.db'")):
        SQLiteStore(BytesPath())  # type: ignore[arg-type]


def test_event_counter_add_checks_its_arguments() -> None:
    from asynccoord.events import EventCounter

    counter = EventCounter()
    for name, n, error in (
        ("lock_lost", 2**80, InvalidArgumentError),
        ("lock_lost", -1, InvalidArgumentError),
        ("lock_lost", True, InvalidTypeError),
        ("bad\x00name", 1, InvalidArgumentError),
        ("", 1, InvalidArgumentError),
        (7, 1, InvalidTypeError),
    ):
        with pytest.raises(error):
            counter.add(name, n)  # type: ignore[arg-type]
    assert counter.snapshot() == {}
    counter.add("lock_lost", 2)
    counter.add("my_counter")
    assert counter.snapshot() == {"lock_lost": 2, "my_counter": 1}


# --- helpers outside the stores: counters, histograms, notifier, watchdog, pool, monitor ----

HUGE = "<int of 1329 bits> (too large for a float)"  # how 10**400 is named


def _notifier_with_a_waiter() -> Any:
    from asynccoord.notify import WorkNotifier

    notifier = WorkNotifier()
    notifier.subscribe(Q).arm()  # an armed node: a notify that went through would flag it
    return notifier


def _send(_task: Task) -> None:
    pass


def _monitor(**intervals_s: float) -> object:
    from asynccoord.monitor.monitor import Monitor

    return Monitor(MemoryStore(), rules=[], **intervals_s)


def _metrics_flush(alert_ttl_s: float) -> object:
    from asynccoord.contract.monitor import MetricsFlush

    return MetricsFlush(process_id="p", alert_ttl_s=alert_ttl_s)


def _sync_bad_calls() -> list[tuple[str, Callable[[], object], type[Exception], str]]:
    from asynccoord.events import EventCounter
    from asynccoord.locks.pool import LockPool
    from asynccoord.locks.watchdog import Watchdog
    from asynccoord.membership import Membership
    from asynccoord.monitor.histogram import SLOTS, Histogram, LatencyRecorder
    from asynccoord.node import NodeConfig, Runtime
    from asynccoord.notify import WorkNotifier

    wd = Watchdog(MemoryStore())
    zeros = (0,) * SLOTS
    return [
        # Watchdog.check_interval: ttl_s was never checked
        ("interval-ttl-none", lambda: wd.check_interval(None, 1.0), TYPE, "ttl_s must be a number, got NoneType None"),
        ("interval-ttl-huge", lambda: wd.check_interval(10**400, 1.0), ARG, f"ttl_s must be finite, got {HUGE}"),
        ("interval-ttl-nan", lambda: wd.check_interval(math.nan, 1.0), ARG, "ttl_s must be finite, got nan"),
        ("interval-ttl-bool", lambda: wd.check_interval(True, 0.5), TYPE, "ttl_s must be a number, got bool True"),
        ("interval-ttl-zero", lambda: wd.check_interval(0, 0.5), ARG, "ttl_s must be > 0, got 0"),
        ("interval-ttl-str", lambda: wd.check_interval("9", 1.0), TYPE, "ttl_s must be a number, got str '9'"),
        ("interval-renew-bool", lambda: wd.check_interval(9.0, True), TYPE, "renew_interval_s must be a number"),
        ("interval-too-long", lambda: wd.check_interval(3.0, 3.0), ARG, "renew_interval_s must be shorter than"),
        # EventCounter
        ("counter-add-list", lambda: EventCounter().add([]), TYPE, "name must be a str, got list []"),
        ("counter-add-int", lambda: EventCounter().add(7), TYPE, "name must be a str, got int 7"),
        ("counter-get-list", lambda: EventCounter().get([]), TYPE, "name must be a str, got list []"),
        ("counter-get-none", lambda: EventCounter().get(None), TYPE, "name must be a str, got NoneType None"),
        ("counter-get-empty", lambda: EventCounter().get(""), ARG, "name must not be empty"),
        # LatencyRecorder.observe
        ("observe-name-list", lambda: LatencyRecorder().observe([], 1.0), TYPE, "name must be a str, got list []"),
        ("observe-name-int", lambda: LatencyRecorder().observe(3, 1.0), TYPE, "name must be a str, got int 3"),
        ("observe-huge", lambda: LatencyRecorder().observe("x", 10**400), ARG, f"value_ms must be finite, got {HUGE}"),
        ("observe-inf", lambda: LatencyRecorder().observe("x", math.inf), ARG, "value_ms must be finite, got inf"),
        ("observe-bool", lambda: LatencyRecorder().observe("x", True), TYPE, "value_ms must be a number, got bool"),
        ("observe-none", lambda: LatencyRecorder().observe("x", None), TYPE, "value_ms must be a number, got NoneType"),
        # Histogram
        ("hist-none", lambda: Histogram(None), TYPE, f"counts must be a tuple of {SLOTS} ints, got NoneType None"),
        ("hist-str", lambda: Histogram("0" * SLOTS), TYPE, f"counts must be a tuple of {SLOTS} ints, got str"),
        ("hist-strs", lambda: Histogram(("a",) * SLOTS), TYPE, "counts[0] must be an int, got str 'a'"),
        ("hist-floats", lambda: Histogram((1.5,) * SLOTS), TYPE, "counts[0] must be an int, got float 1.5"),
        ("hist-bools", lambda: Histogram((True,) * SLOTS), TYPE, "counts[0] must be an int, got bool True"),
        ("hist-negative", lambda: Histogram((*zeros[1:], -1)), ARG, f"counts[{SLOTS - 1}] must be >= 0, got -1"),
        ("hist-length", lambda: Histogram((1, 2, 3)), ARG, f"counts must have {SLOTS} slots, got 3"),
        ("hist-sum-nan", lambda: Histogram(zeros, math.nan), ARG, "sum_ms must be finite, got nan"),
        ("hist-sum-negative", lambda: Histogram(zeros, -1.0), ARG, "sum_ms must be >= 0, got -1.0"),
        ("hist-sum-str", lambda: Histogram(zeros, "1"), TYPE, "sum_ms must be a number, got str '1'"),
        ("hist-sum-huge", lambda: Histogram(zeros, 10**400), ARG, f"sum_ms must be finite, got {HUGE}"),
        ("slots-none", lambda: Histogram.from_slots(None, 0.0), TYPE, "slots must be a mapping"),
        ("slots-float", lambda: Histogram.from_slots({1.5: 1}, 0.0), TYPE, "slot must be an int, got float 1.5"),
        ("slots-range", lambda: Histogram.from_slots({SLOTS: 1}, 0.0), ARG, f"slot must be in [0, {SLOTS}), got"),
        ("slots-count", lambda: Histogram.from_slots({1: -1}, 0.0), ARG, "slots[1] must be >= 0, got -1"),
        ("slots-count-float", lambda: Histogram.from_slots({1: 0.5}, 0.0), TYPE, "slots[1] must be an int"),
        ("slots-sum", lambda: Histogram.from_slots({1: 1}, "2"), TYPE, "sum_ms must be a number, got str '2'"),
        # RetryPolicy.delay_s
        (
            "delay-rng-int",
            lambda: RetryPolicy().delay_s(1, rng=5),
            TYPE,
            "rng must be a random.Random (or have a uniform method) or None, got int 5",
        ),
        ("delay-failures-bool", lambda: RetryPolicy().delay_s(True), TYPE, "failures must be an int, got bool"),
        # WorkNotifier
        ("notify-n-none", lambda: WorkNotifier().notify(Q, None), TYPE, "n must be an int, got NoneType None"),
        ("notify-queue-list", lambda: WorkNotifier().notify([]), TYPE, "queue must be a str, got list []"),
        ("notify-queue-int", lambda: WorkNotifier().notify(5), TYPE, "queue must be a str, got int 5"),
        ("notify-queue-empty", lambda: WorkNotifier().notify(""), ARG, "queue must not be empty"),
        ("notify-n-negative", lambda: WorkNotifier().notify(Q, -5), ARG, "n must be >= 0, got -5"),
        ("notify-n-bool", lambda: WorkNotifier().notify(Q, True), TYPE, "n must be an int, got bool True"),
        ("notify-n-float", lambda: WorkNotifier().notify(Q, 1.0), TYPE, "n must be an int, got float 1.0"),
        (
            "notify-partitions-int",
            lambda: WorkNotifier().notify(Q, 1, 5),
            TYPE,
            f"{SEQ} int 5",
        ),
        ("notify-partitions-str", lambda: WorkNotifier().notify(Q, 1, "12"), TYPE, f"{SEQ} str '12'"),
        # one rule for every partitions argument: a dict or a one-pass view is refused as claim refuses it
        ("notify-partitions-dict", lambda: WorkNotifier().notify(Q, 1, {0: 1}), TYPE, f"{SEQ} dict {{0: 1}}"),
        (
            "notify-partitions-values",
            lambda: WorkNotifier().notify(Q, 1, {"a": 0}.values()),
            TYPE,
            f"{SEQ} dict_values",
        ),
        ("subscribe-partitions-dict", lambda: WorkNotifier().subscribe(Q, {1: 0}), TYPE, f"{SEQ} dict {{1: 0}}"),
        ("arm-partitions-bytes", lambda: WorkNotifier().subscribe(Q).arm(b"\x01"), TYPE, f"{SEQ} bytes"),
        ("notify-partition-str", lambda: WorkNotifier().notify(Q, 1, {"a"}), TYPE, "partitions item must be an int"),
        (
            "notify-partition-neg",
            lambda: WorkNotifier().notify(Q, 1, [-1]),
            ARG,
            "partitions item must be >= 0, got -1",
        ),
        (
            "subscribe-partitions-int",
            lambda: WorkNotifier().subscribe(Q, partitions=5),
            TYPE,
            f"{SEQ} int 5",
        ),
        (
            "subscribe-partition-bool",
            lambda: WorkNotifier().subscribe(Q, [True]),
            TYPE,
            "partitions item must be an int",
        ),
        ("subscribe-queue-int", lambda: WorkNotifier().subscribe(5), TYPE, "queue must be a str, got int 5"),
        ("arm-partitions-int", lambda: WorkNotifier().subscribe(Q).arm(5), TYPE, "partitions must be a collection"),
        ("notify-queue-blank", lambda: WorkNotifier().notify(" "), ARG, "queue must not be only whitespace, got ' '"),
        # leases and TTLs below MIN_LEASE_S, wherever they are configured
        ("node-lease-tiny", lambda: NodeConfig(lease_s=1e-6), ARG, f"lease_s {FLOOR}: a shorter lease"),
        ("node-lock-ttl-tiny", lambda: NodeConfig(lock_ttl_s=0.001), ARG, f"lock_ttl_s {FLOOR}"),
        ("node-queue-blank", lambda: NodeConfig(queue="  "), ARG, "queue must not be only whitespace"),
        ("interval-ttl-tiny", lambda: wd.check_interval(0.003, 0.001), ARG, f"ttl_s {FLOOR}"),
        ("pool-ttl-tiny", lambda: LockPool(MemoryStore(), ttl_s=1e-3, holder="p"), ARG, f"ttl_s {FLOOR}"),
        ("pool-holder-blank", lambda: LockPool(MemoryStore(), ttl_s=5, holder=" "), ARG, "holder must not be only"),
        (
            "pool-hold-over-max",
            lambda: LockPool(MemoryStore(), ttl_s=5, holder="p", min_hold_s=2, max_hold_s=1),
            ARG,
            "min_hold_s=2 is above max_hold_s=1",
        ),
        (
            "pool-hold-neg",
            lambda: LockPool(MemoryStore(), ttl_s=5, holder="p", min_hold_s=-1),
            ARG,
            "min_hold_s must be >= 0",
        ),
        (
            "pool-hold-str",
            lambda: LockPool(MemoryStore(), ttl_s=5, holder="p", min_hold_s="1"),
            TYPE,
            "min_hold_s must be a number",
        ),
        (
            "pool-hold-nan",
            lambda: LockPool(MemoryStore(), ttl_s=5, holder="p", min_hold_s=math.nan),
            ARG,
            "min_hold_s must be finite",
        ),
        ("membership-ttl-tiny", lambda: Membership(MemoryStore(), ttl_s=0.005), ARG, f"ttl_s {FLOOR}"),
        ("membership-queue-blank", lambda: Membership(MemoryStore(), queue=" "), ARG, "queue must not be only"),
        (
            "runtime-heartbeat-ttl-tiny",
            lambda: Runtime(MemoryStore(), send=_send, heartbeat_ttl_s=0.005),
            ARG,
            f"heartbeat_ttl_s {FLOOR}",
        ),
        (
            "runtime-heartbeat-interval-long",
            lambda: Runtime(MemoryStore(), send=_send, heartbeat_ttl_s=1.0, heartbeat_interval_s=2.0),
            ARG,
            "heartbeat_interval_s must be < heartbeat_ttl_s (1.0) so nodes beat before they expire, got 2.0",
        ),
        (
            "runtime-heartbeat-interval-default-ttl",
            lambda: Runtime(MemoryStore(), send=_send, heartbeat_interval_s=5),
            ARG,
            "heartbeat_interval_s must be < heartbeat_ttl_s (5.0)",
        ),
        (
            "runtime-node-id-blank",
            lambda: Runtime(MemoryStore(), send=_send, node_ids=["a", "\t"]),
            ARG,
            "node_ids[1] must not be only whitespace, got '\\t'",
        ),
        # intervals below MIN_INTERVAL_S (a busy loop), wherever a loop is configured
        (
            "runtime-heartbeat-interval-tiny",
            lambda: Runtime(MemoryStore(), send=_send, heartbeat_interval_s=1e-9),
            ARG,
            f"heartbeat_interval_s {EVERY} 1e-09",
        ),
        ("membership-interval-tiny", lambda: Membership(MemoryStore(), interval_s=1e-4), ARG, f"interval_s {EVERY}"),
        ("node-idle-min-tiny", lambda: NodeConfig(idle_min_s=1e-6), ARG, f"idle_min_s {EVERY} 1e-06"),
        ("node-idle-max-tiny", lambda: NodeConfig(idle_min_s=1e-3, idle_max_s=5e-4), ARG, f"idle_max_s {EVERY}"),
        ("node-idle-fallback-tiny", lambda: NodeConfig(idle_fallback_s=1e-5), ARG, f"idle_fallback_s {EVERY}"),
        ("watchdog-interval-tiny", lambda: wd.check_interval(1.0, 1e-7), ARG, f"renew_interval_s {EVERY}"),
        ("monitor-flush-tiny", lambda: _monitor(flush_interval_s=1e-4), ARG, f"flush_interval_s {EVERY}"),
        ("monitor-evaluate-tiny", lambda: _monitor(evaluate_interval_s=1e-4), ARG, f"evaluate_interval_s {EVERY}"),
        ("node-busy-requeue-tiny", lambda: NodeConfig(busy_requeue_s=1e-7), ARG, f"busy_requeue_s {EVERY}"),
        ("node-pace-blank", lambda: NodeConfig(lock_pace_dimension=" "), ARG, "lock_pace_dimension must not be only"),
        ("node-pace-int", lambda: NodeConfig(lock_pace_dimension=5), TYPE, "lock_pace_dimension must be a str"),  # type: ignore[arg-type]
        (
            "node-pace-semaphore",
            lambda: NodeConfig(lock_pace_dimension="account", lock_permits=2),
            ARG,
            "lock_pace_dimension='account' needs a lock (lock_permits=1), got lock_permits=2",
        ),
        (
            "node-pace-no-lock",
            lambda: Runtime(MemoryStore(), send=_send, config=NodeConfig(lock_pace_dimension="account")),
            ARG,
            "config.lock_pace_dimension='account' paces the sends a lock serialises, but this node has no lock_key",
        ),
        ("retry-base-tiny", lambda: RetryPolicy(base_s=1e-9, cap_s=1e-9), ARG, f"base_s {EVERY} 1e-09"),
        ("retry-cap-tiny", lambda: RetryPolicy(base_s=1e-3, cap_s=5e-4), ARG, f"cap_s {EVERY}"),
        ("flush-alert-ttl-tiny", lambda: _metrics_flush(1e-3), ARG, f"alert_ttl_s {FLOOR}"),
    ]


SYNC_BAD_CALLS = _sync_bad_calls()


@pytest.mark.parametrize(
    ("call", "error", "message"), [c[1:] for c in SYNC_BAD_CALLS], ids=[c[0] for c in SYNC_BAD_CALLS]
)
def test_helper_refuses_a_bad_argument_with_a_typed_error(
    call: Callable[[], object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=re.escape(message)) as info:
        call()
    assert type(info.value) is error  # the documented class, not a builtin error leaking through


def test_bad_counts_observations_and_notifications_change_nothing() -> None:
    from asynccoord.events import EventCounter
    from asynccoord.monitor.histogram import LatencyRecorder

    counter = EventCounter()
    for name, n in (([], 1), ({}, 1), ("lock_lost", None), ("lock_lost", 1.0)):
        with pytest.raises((InvalidTypeError, InvalidArgumentError)):
            counter.add(name, n)  # type: ignore[arg-type]
    assert counter.snapshot() == {}
    recorder = LatencyRecorder()
    for name, value in (([], 1.0), ("x_ms", 10**400), ("x_ms", "1"), ("", 1.0)):
        with pytest.raises((InvalidTypeError, InvalidArgumentError)):
            recorder.observe(name, value)  # type: ignore[arg-type]
    assert recorder.snapshot() == {}
    notifier = _notifier_with_a_waiter()
    (wake,) = notifier._armed[Q]
    for args in ((Q, None), (Q, -5), (Q, True), (Q, 1, 5), (Q, 1, {"a"}), (Q, 1, [0, -1])):
        with pytest.raises((InvalidTypeError, InvalidArgumentError)):
            notifier.notify(*args)
    assert not wake.is_set  # nobody was flagged
    with pytest.raises(InvalidTypeError):
        wake.arm(5)  # type: ignore[arg-type]
    assert wake.partitions is None  # unchanged
    assert notifier.notify(Q, 1, [0]) == 1  # still usable


def test_helpers_still_accept_valid_arguments() -> None:
    import random

    from asynccoord.events import EventCounter
    from asynccoord.locks.watchdog import Watchdog
    from asynccoord.monitor.histogram import SLOTS, Histogram, LatencyRecorder
    from asynccoord.notify import WorkNotifier

    wd = Watchdog(MemoryStore())
    assert wd.check_interval(9.0, 3.0) == 3.0
    assert wd.check_interval(9, 3) == 3.0  # ints are numbers
    assert wd.check_interval(MAX_S, 1.0) == 1.0
    counter = EventCounter()
    counter.add("lock_lost")
    counter.add("mine", 0)
    assert (counter.get("lock_lost"), counter.get("mine"), counter.get("claims")) == (1, 0, 0)
    recorder = LatencyRecorder()
    recorder.observe("claim_ms", 2)  # an int
    recorder.observe("claim_ms", 2.5)
    recorder.observe("claim_ms", -1.0)  # a clock step: counts as 0
    assert recorder.snapshot()["claim_ms"].count == 3
    assert recorder.snapshot()["claim_ms"].sum_ms == 4.5
    listed = Histogram([0] * SLOTS, 0)  # a list and an int sum: kept as a tuple and a float
    assert listed.counts == (0,) * SLOTS
    assert type(listed.sum_ms) is float
    assert listed == Histogram.empty()
    assert hash(listed) == hash(Histogram.empty())
    assert Histogram((0,) * SLOTS, math.inf).sum_ms == math.inf  # a sum that overflowed stays readable
    assert Histogram.from_slots({0: 2, SLOTS - 1: 1}, 3).count == 3

    class Fixed:  # any object with random.Random's uniform()
        def uniform(self, a: float, b: float) -> float:
            return b

    policy = RetryPolicy(base_s=1.0, jitter=0.5)
    assert policy.delay_s(1, rng=Fixed()) == 1.5  # type: ignore[arg-type]
    assert 0.5 <= policy.delay_s(1, rng=random.Random(3)) <= 1.5
    assert 0.5 <= policy.delay_s(1) <= 1.5
    notifier = WorkNotifier()
    assert notifier.notify(Q) == 0
    for partitions in (None, {1}, frozenset({1}), (1, 2), [3], range(4), {1: "a"}.keys()):
        wake = notifier.subscribe(Q, partitions)
        wake.arm(partitions)
        assert wake.partitions == (None if partitions is None else frozenset(partitions))
        assert notifier.notify(Q, 1, partitions) == 1
        wake.close()
    assert notifier.notify(Q, 0, set()) == 0


async def test_work_notifier_wait_checks_before_waiting() -> None:
    from asynccoord.notify import WorkNotifier

    notifier = WorkNotifier()
    with pytest.raises(InvalidTypeError, match=re.escape(SEQ)):
        await notifier.wait(Q, 0.01, partitions=5)  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match=re.escape("partitions item must be an int, got str 'x'")):
        await notifier.wait(Q, 0.01, partitions=["x"])  # type: ignore[list-item]
    with pytest.raises(InvalidTypeError, match=re.escape("queue must be a str, got list []")):
        await notifier.wait([], 0.01)  # type: ignore[arg-type]
    assert notifier.waiting(Q) == 0
    assert await notifier.wait(Q, 0.01, partitions={1, 2}) is False


async def test_monitor_flush_force_must_be_a_bool() -> None:
    from asynccoord.monitor.monitor import Monitor

    async with MemoryStore() as store:
        monitor = Monitor(store, background=False)
        for force, shown in (("yes", "str 'yes'"), (1, "int 1"), (None, "NoneType None")):
            with pytest.raises(InvalidTypeError, match=re.escape(f"force must be a bool, got {shown}")):
                await monitor.flush(force=force)  # type: ignore[arg-type]
        assert await monitor.flush(force=True) is not None


async def test_lock_pool_released_and_turn_check_their_arguments() -> None:
    from asynccoord.errors import LockLostError
    from asynccoord.locks.pool import LockPool

    async def async_on_lost(_error: LockLostError) -> None:
        pass

    async with MemoryStore() as store:
        pool = LockPool(store, ttl_s=5.0, holder="proc-a")
        for name, timeout_s, error, message in (
            (5, 1.0, TYPE, "name must be a str, got int 5"),
            (None, 1.0, TYPE, "name must be a str, got NoneType None"),
            ("", 1.0, ARG, "name must not be empty"),
            ("account:1", -1, ARG, "timeout_s must be >= 0, got -1"),
            ("account:1", "1", TYPE, "timeout_s must be a number, got str '1'"),
        ):
            with pytest.raises(error, match=re.escape(message)):
                await pool.released(name, timeout_s=timeout_s)
        for on_lost, message in (
            (None, "on_lost must be a plain function, got NoneType None"),
            (5, "on_lost must be a plain function, got int 5"),
            (async_on_lost, "on_lost must be a plain function, got function"),
        ):
            with pytest.raises(InvalidTypeError, match=re.escape(message)):
                async with pool.turn("account:1", timeout_s=1, on_lost=on_lost):  # type: ignore[arg-type]
                    pytest.fail("a turn with a bad on_lost ran")
        assert pool.held == 0
        assert await store.list_locks() == []  # nothing acquired
        lost: list[LockLostError] = []
        async with pool.turn("account:1", timeout_s=1, on_lost=lost.append) as turn:
            assert turn.lease.name == "account:1"
        await pool.released("account:1")
        await pool.released("never-used", timeout_s=0)
        await pool.aclose()
        assert lost == []


@pytest.mark.parametrize("damaged", ["3x", "0", ""])
async def test_a_partition_count_that_is_no_number_is_refused_untouched(db_path: Path, damaged: str) -> None:
    task_id = await _store_with_meta(db_path, "partitions", damaged)
    for read_only in (False, True):  # a ValueError of int() escaped both
        store = SQLiteStore(db_path, read_only=read_only)
        with pytest.raises(SchemaVersionError) as info:
            await store.open()
        assert str(info.value) == (
            f"{str(db_path)!r} records {damaged!r} as its partition count in its coord_meta table, which is no "
            "partition count: the database was altered or damaged; restore it from a backup"
        )
    _assert_untouched(db_path, "partitions", damaged, task_id)
