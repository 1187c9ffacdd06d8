"""Identifiers refuse control characters; keys from the caller's data keep them.

A queue name, a node id, a lock name or prefix and a rate-limit dimension are shown on one
line (log lines, ``status``, notices): a newline in one splits the line, an ESC drives the
terminal. Each is refused with an ``InvalidArgumentError`` naming the value, as a
``WebhookSink`` label is, before anything is written. Partition keys, idempotency keys and
``limit_keys`` values are the caller's data: stored and read back as given.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from asynccoord import (
    InvalidArgumentError,
    Lock,
    MemoryStore,
    NewTask,
    NodeConfig,
    RateLimit,
    RateLimited,
    RedisLockStore,
    Runtime,
)
from asynccoord.cli.main import main
from asynccoord.node import Node
from asynccoord.validation import check_key, check_name

CONTROL = ["a\nb", "a\rb", "a\tb", "a\x1b[2Jb", "a\x7fb", "a\x85b", "a\x9bb"]


async def _send(task: Any) -> None:
    return None


MADE: dict[str, Callable[[str], object]] = {
    "RateLimit.dimension": lambda name: RateLimit(dimension=name, count=1, per_s=1.0),
    "NodeConfig.queue": lambda name: NodeConfig(queue=name),
    "NodeConfig.lock_pace_dimension": lambda name: NodeConfig(lock_pace_dimension=name),
    "Node.node_id": lambda name: Node(MemoryStore(), send=_send, node_id=name),
    "Runtime.node_ids": lambda name: Runtime(MemoryStore(), send=_send, node_ids=[name]),
    "Lock.name": lambda name: Lock(MemoryStore(), name),
    "RedisLockStore.prefix": lambda name: RedisLockStore("redis://127.0.0.1:6379/0", prefix=name),
    "RateLimited.dimension": lambda name: RateLimited(1.0, dimension=name),
    "NewTask.limit_keys dimension": lambda name: NewTask(queue="q", payload={}, limit_keys={name: "k"}),
    "NewTask.queue": lambda name: NewTask(queue=name, payload={}),
}


@pytest.mark.parametrize("name", CONTROL, ids=repr)
@pytest.mark.parametrize("where", sorted(MADE))
def test_an_identifier_with_a_control_character_is_refused_naming_it(where: str, name: str) -> None:
    if where == "RedisLockStore.prefix":
        pytest.importorskip("redis")
    with pytest.raises(InvalidArgumentError, match="must not hold the control character") as caught:
        MADE[where](name)
    assert repr(name) in str(caught.value)


def test_an_identifier_with_a_lone_surrogate_is_refused() -> None:
    for name in ("q\ud800", "q\udfff"):
        with pytest.raises(InvalidArgumentError, match="lone surrogate"):
            NodeConfig(queue=name)


def test_names_keep_printable_unicode_and_keys_keep_control_characters() -> None:
    for name in ("outbox", "очередь", "chat:\u202e42", "a b", "😀"):
        assert check_name("queue", name) == name
    for key in CONTROL:
        assert check_key("partition_key", key) == key
    assert check_name("scope", "", allow_empty=True) == ""


async def test_the_store_refuses_such_a_queue_or_lock_name_and_writes_nothing(store: Any) -> None:
    with pytest.raises(InvalidArgumentError, match=r"queue must not hold the control character '\\n'"):
        await store.enqueue("q\n", {}, partition_key="c")
    with pytest.raises(InvalidArgumentError, match=r"name must not hold the control character '\\x1b'"):
        await store.try_acquire_lock("acct\x1b[2J", ttl_s=10.0, holder="h")
    with pytest.raises(InvalidArgumentError, match="node_id must not hold"):
        await store.claim("q", node_id="n\n1")
    assert await store.list_locks() == []
    assert (await store.stats("q")).counts == (await store.stats("empty")).counts  # nothing enqueued


async def test_keys_from_the_callers_data_keep_their_control_characters(store: Any) -> None:
    """Partition keys, idempotency keys and holders round-trip as given; a limit_keys value is taken as given."""
    key, idem, chat = "chat\n1", "id\x1b[0m", "k\r\n42"
    done = await store.enqueue("q", {"t": "a\nb"}, partition_key=key, idempotency_key=idem, limit_keys={"chat": chat})
    again = await store.enqueue("q", {"t": "a\nb"}, partition_key=key, idempotency_key=idem, limit_keys={"chat": chat})
    assert again.task.id == done.task.id  # the idempotency key matched
    [task] = await store.claim("q", node_id="n")
    assert (task.partition_key, task.idempotency_key, task.payload) == (key, idem, {"t": "a\nb"})
    assert RateLimited(1.0, dimension="chat", key=chat).key == chat  # the provider's key for that bucket
    await store.complete(task, None)
    lease = await store.try_acquire_lock("acct", ttl_s=10.0, holder="host\tpid 1")
    assert lease is not None
    assert [info.holder for info in await store.list_locks()] == ["host\tpid 1"]


def test_run_refuses_a_rate_limit_dimension_with_a_newline_before_the_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "bot.db"
    with pytest.raises(SystemExit) as exited:
        main(["run", "--db", str(db), "--send", "asyncio:sleep", "--rate-limit", "ch\nat=1/1s"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--rate-limit: dimension must not hold the control character '\\n'" in err
    assert "got 'ch\\nat'" in err
    assert not db.exists()
