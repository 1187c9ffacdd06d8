"""The in-process notifier: standing wake-ups that keep a notification sent during a claim, no thundering herd."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from asynccoord import InvalidArgumentError, NewTask, SQLiteStore, WorkNotifier, partition_of

QUEUE = "q"


async def started_waiting(notifier: WorkNotifier, count: int) -> None:
    deadline = time.monotonic() + 2.0
    while notifier.waiting(QUEUE) < count:
        assert time.monotonic() < deadline
        await asyncio.sleep(0)


async def settle() -> None:
    """Let woken waits return (a wake-up takes a few loop turns)."""
    await asyncio.sleep(0.01)


async def test_a_notification_during_a_claim_is_kept_and_the_next_wait_returns_at_once() -> None:
    notifier = WorkNotifier()
    wake = notifier.subscribe(QUEUE)
    wake.arm()  # a claim starts...
    assert notifier.notify(QUEUE, 1) == 1  # ...work arrives while it runs (the claim may miss it)
    assert wake.is_set
    started = time.monotonic()
    assert await wake.wait(5.0)  # not lost: no waiting for the backoff
    assert time.monotonic() - started < 0.5
    assert not wake.is_set
    wake.close()


async def test_arming_forgets_older_notifications() -> None:
    notifier = WorkNotifier()
    wake = notifier.subscribe(QUEUE)
    wake.arm()
    notifier.notify(QUEUE, 1)
    wake.arm()  # the next claim sees that work
    assert not wake.is_set
    assert not await wake.wait(0.01)
    wake.close()


async def test_a_busy_node_is_neither_woken_nor_flagged() -> None:
    notifier = WorkNotifier()
    busy = notifier.subscribe(QUEUE)  # never armed (or disarmed): it claims when a slot frees anyway
    busy.arm()
    busy.disarm()
    assert notifier.notify(QUEUE, 1) == 0
    assert not busy.is_set
    busy.close()


async def test_notify_wakes_waiters_first_then_flags_armed_nodes_and_at_most_n() -> None:
    notifier = WorkNotifier()
    waiting = [notifier.subscribe(QUEUE) for _ in range(3)]
    armed = [notifier.subscribe(QUEUE) for _ in range(3)]
    waits = [asyncio.ensure_future(w.wait(5.0)) for w in waiting]
    await started_waiting(notifier, 3)
    for w in armed:
        w.arm()
    assert notifier.notify(QUEUE, 2) == 2  # two waiters, nobody armed
    await settle()
    assert [w.done() for w in waits] == [True, True, False]  # the longest waiting first
    assert not any(w.is_set for w in armed)
    assert notifier.notify(QUEUE, 3) == 3  # the last waiter, then two armed nodes
    await settle()
    assert all(w.done() for w in waits)
    assert [w.is_set for w in armed] == [True, True, False]
    assert notifier.notify(QUEUE, 1) == 1  # a flagged node is not counted twice
    assert all(w.is_set for w in armed)
    assert notifier.notify(QUEUE, 1) == 0
    for w in waiting + armed:
        w.close()


async def test_only_nodes_owning_a_notified_partition_are_woken_or_flagged() -> None:
    notifier = WorkNotifier()
    a, b, everything = notifier.subscribe(QUEUE), notifier.subscribe(QUEUE), notifier.subscribe(QUEUE)
    a.arm({1, 2})
    b.arm({3})
    assert notifier.notify(QUEUE, 5, {3}) == 1
    assert (a.is_set, b.is_set) == (False, True)
    wait_all = asyncio.ensure_future(everything.wait(5.0))
    await started_waiting(notifier, 1)
    assert notifier.notify(QUEUE, 5, {2}) == 2  # the waiter on every partition, and a
    assert await wait_all
    assert a.is_set
    assert notifier.notify("other", 5) == 0  # another queue: nobody
    for w in (a, b, everything):
        w.close()


async def test_one_shot_wait_still_wakes_at_most_n_oldest_first() -> None:
    notifier = WorkNotifier()
    waits = [asyncio.ensure_future(notifier.wait(QUEUE, 5.0)) for _ in range(4)]
    await started_waiting(notifier, 4)
    assert notifier.notify(QUEUE, 2) == 2
    await settle()
    assert [w.done() for w in waits] == [True, True, False, False]
    assert notifier.waiting(QUEUE) == 2
    assert not await notifier.wait(QUEUE, 0.01)  # times out
    notifier.wake_all()
    assert all(await asyncio.gather(*waits))
    assert notifier.waiting(QUEUE) == 0


async def test_closing_a_wake_up_ends_its_wait_and_unsubscribes() -> None:
    notifier = WorkNotifier()
    wake = notifier.subscribe(QUEUE)
    waiting = asyncio.ensure_future(wake.wait(5.0))
    await started_waiting(notifier, 1)
    wake.close()
    assert await waiting
    assert notifier.waiting(QUEUE) == 0
    assert notifier.notify(QUEUE, 1) == 0
    assert not await wake.wait(5.0)  # closed: returns at once
    wake.arm()  # harmless after close
    wake.close()


async def test_a_cancelled_wait_leaves_no_waiter_behind() -> None:
    notifier = WorkNotifier()
    wake = notifier.subscribe(QUEUE)
    waiting = asyncio.ensure_future(wake.wait(5.0))
    await started_waiting(notifier, 1)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert notifier.waiting(QUEUE) == 0
    assert notifier.notify(QUEUE, 1) == 0
    wake.close()


def test_bad_arguments_are_refused() -> None:
    notifier = WorkNotifier()
    with pytest.raises(InvalidArgumentError):
        notifier.subscribe("")
    with pytest.raises(InvalidArgumentError):
        asyncio.run(notifier.subscribe(QUEUE).wait(-1.0))


async def test_sqlite_commit_wakes_only_the_owner_of_a_newly_claimable_head(tmp_path) -> None:
    """A commit wakes a node only when it made work claimable: the key's next task in an ordered queue.

    In an unordered queue every pending task was claimable already, so a commit wakes nobody
    (a wake-up there would only cost the node an empty claim).
    """
    async with SQLiteStore(tmp_path / "wake.db") as store:
        await store.enqueue_many([NewTask(queue="plain", payload=i, partition_key="k1") for i in range(2)])
        await store.enqueue_many([NewTask(queue="chat", payload=i, partition_key="k1") for i in range(2)])
        await store.enqueue("chat", "last", partition_key="k2")
        owner, other = partition_of("k1", store.partitions), partition_of("k2", store.partitions)
        assert owner != other

        plain_node = store.notifier.subscribe("plain")
        [task] = await store.claim("plain", node_id="n1", limit=1)
        plain_node.arm()
        await store.complete(task)
        assert not plain_node.is_set

        k1_node, k2_node = store.notifier.subscribe("chat", [owner]), store.notifier.subscribe("chat", [other])
        first = await store.claim("chat", node_id="n1", limit=2, ordered=True)
        assert [t.partition_key for t in first] == ["k1", "k2"]  # one head per key
        k1_node.arm([owner])
        k2_node.arm([other])
        await store.complete(first[1])  # k2 has nothing behind it
        assert not k1_node.is_set
        assert not k2_node.is_set
        await store.complete(first[0])  # k1's second task becomes its head
        assert k1_node.is_set
        assert not k2_node.is_set
        [second] = await store.claim("chat", node_id="n1", limit=2, ordered=True)
        assert (second.partition_key, second.payload) == ("k1", 1)


class RecordingNotifier(WorkNotifier):
    """Records what it is asked to notify."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int, object]] = []

    def notify(self, queue: str, n: int = 1, partitions: Any = None) -> int:
        self.calls.append((queue, n, partitions))
        return super().notify(queue, n, partitions)


@pytest.mark.parametrize(
    "payload",
    [
        "{",  # not JSON
        '"12"',  # JSON, not an object
        "[1, 2]",
        '{"s": "other", "n": 1}',  # no queue
        '{"s": "other", "q": 5, "n": 1}',  # a queue that is no str
        '{"s": "other", "q": " ", "n": 1}',
        '{"s": "other", "q": "q", "n": "1"}',  # a count that is no int
        '{"s": "other", "q": "q", "n": true}',
        '{"s": "other", "q": "q", "n": 1.5}',
        '{"s": "other", "q": "q", "n": -1}',
        '{"s": "other", "q": "q", "n": 1, "p": "12"}',  # partitions that are no array of ints >= 0
        '{"s": "other", "q": "q", "n": 1, "p": {"3": 1}}',
        '{"s": "other", "q": "q", "n": 1, "p": [true]}',
        '{"s": "other", "q": "q", "n": 1, "p": [1.9]}',
        '{"s": "other", "q": "q", "n": 1, "p": ["7"]}',
        '{"s": "other", "q": "q", "n": 1, "p": [-1]}',
        '{"s": "other", "l": ""}',  # a lock release naming no lock
        '{"s": "other", "l": 7}',
    ],
)
def test_a_postgres_listener_drops_a_notification_it_would_have_to_convert(
    payload: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A notification is taken only as encode_notification writes it (a str queue, an int count,
    an array of ints or null), never converted: "12" is not partitions [1, 2], nor 1.9 partition 1."""
    from asynccoord.backends.postgres.conn import PgListener

    notifier = RecordingNotifier()
    listener = PgListener(_never_connects, channel="c", sender="me", notifier=notifier)
    with caplog.at_level("WARNING", logger="asynccoord"):
        listener._on_notify(None, 0, "c", payload)
    assert notifier.calls == []
    assert listener.received == 0
    assert "asynccoord.postgres.bad_notification" in caplog.text


def test_a_postgres_listener_passes_on_what_other_stores_notify() -> None:
    from asynccoord.backends.postgres.conn import PgListener, encode_notification

    notifier = RecordingNotifier()
    listener = PgListener(_never_connects, channel="c", sender="me", notifier=notifier)
    listener._on_notify(None, 0, "c", encode_notification("other", "q", 3, {7, 2}))
    listener._on_notify(None, 0, "c", encode_notification("other", "q", 1, None))
    listener._on_notify(None, 0, "c", encode_notification("me", "q", 1, None))  # its own: ignored
    assert notifier.calls == [("q", 3, [2, 7]), ("q", 1, None)]
    assert listener.received == 2


async def test_a_postgres_listener_hands_lock_releases_to_the_release_signal() -> None:
    from asynccoord.backends.postgres.conn import PgListener, encode_release
    from asynccoord.releases import ReleaseSignal

    notifier = RecordingNotifier()
    releases = ReleaseSignal()
    watch = releases.watch("account:a")
    other = releases.watch("account:b")
    listener = PgListener(_never_connects, channel="c", sender="me", notifier=notifier, releases=releases)
    listener._on_notify(None, 0, "c", encode_release("other", "account:a"))
    listener._on_notify(None, 0, "c", encode_release("me", "account:b"))  # its own: ignored
    assert await watch.wait(0.0) is True
    assert await other.wait(0.0) is False
    assert notifier.calls == []  # no work was announced
    assert listener.received == 1
    watch.close()
    other.close()


async def _never_connects() -> Any:
    raise AssertionError("the listener was not started: it must not connect")
