"""A node survives the mistakes a bot author makes, without sending a message twice."""

from __future__ import annotations

import asyncio
import functools
import gc
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from asynccoord import InvalidTypeError, MemoryStore, Node, NodeConfig, RetryPolicy, Runtime, Task, TaskStatus
from asynccoord import events as ev

FAST = NodeConfig(
    queue="q",
    lease_s=5.0,
    idle_min_s=0.01,
    idle_max_s=0.05,
    retry=RetryPolicy(base_s=0.01, factor=1.0, cap_s=0.01, jitter=0.0),
)


async def drain(store: MemoryStore, runtime: Runtime, timeout_s: float = 10.0) -> dict[TaskStatus, int]:
    async with runtime:
        assert await runtime.wait_until_drained(timeout_s=timeout_s, poll_s=0.01)
    return dict((await store.stats("q")).counts)


async def test_a_lock_key_that_raises_fails_only_its_task() -> None:
    async with MemoryStore() as store:
        for i in range(20):
            await store.enqueue("q", {"account": i % 3, "n": i}, partition_key=f"c{i}")
        await store.enqueue("q", {"n": "no account"}, partition_key="bad")
        sent: Counter[Any] = Counter()

        async def send(task: Task) -> None:
            sent[task.payload["n"]] += 1

        runtime = Runtime(store, send=send, nodes=2, config=FAST, lock_key=lambda t: f"account:{t.payload['account']}")
        counts = await drain(store, runtime)
        assert counts[TaskStatus.DONE] == 20
        assert counts[TaskStatus.DEAD] == 1  # retried, then dead-lettered: never a crash
        assert sent == Counter(range(20))  # the bad task was never sent
        dead = [t for t in store._tasks.values() if t.status is TaskStatus.DEAD]
        assert "KeyError" in (dead[0].last_error or "")


async def test_a_lock_key_returning_a_non_str_fails_its_task() -> None:
    async with MemoryStore() as store:
        await store.enqueue("q", {"n": 1}, partition_key="c")
        runtime = Runtime(store, send=lambda t: asyncio.sleep(0), nodes=1, config=FAST, lock_key=lambda t: 42)  # type: ignore[arg-type,return-value]
        counts = await drain(store, runtime)
        assert counts[TaskStatus.DEAD] == 1
        (task,) = store._tasks.values()
        assert "lock_key(task) must be a str" in (task.last_error or "")


class _AsyncKey:
    async def __call__(self, task: Task) -> str:
        return "account:1"


async def _async_key(task: Task) -> str:
    return "account:1"


@pytest.mark.parametrize(
    "lock_key", [_async_key, _AsyncKey(), functools.partial(_async_key)], ids=["def", "call", "partial"]
)
async def test_an_async_lock_key_is_refused_when_the_runtime_is_built(lock_key: Any) -> None:
    """An ``async def`` lock_key returns a coroutine, not a name: every task would fail (and warn) at run time."""
    async with MemoryStore() as store:
        await store.enqueue("q", {"n": 1}, partition_key="c")
        with pytest.raises(InvalidTypeError, match="lock_key must be a plain function"):
            Runtime(store, send=lambda t: asyncio.sleep(0), nodes=2, config=FAST, lock_key=lock_key)
        assert (await store.stats("q")).counts[TaskStatus.PENDING] == 1  # nothing claimed


async def test_a_lock_key_that_is_not_callable_is_refused_with_its_value() -> None:
    async with MemoryStore() as store:
        with pytest.raises(InvalidTypeError, match=r"lock_key must be callable or None, got str 'account'"):
            Runtime(store, send=_plain_send, nodes=1, config=FAST, lock_key="account")


async def test_a_sync_send_sends_each_message_once(pipeline: dict[str, Any]) -> None:
    async with MemoryStore() as store:
        for i in range(10):
            await store.enqueue("q", {"n": i}, partition_key=f"c{i}")
        sent: Counter[int] = Counter()

        def send(task: Task) -> str:  # a plain function: it has sent when it returns
            sent[task.payload["n"]] += 1
            return "ok"

        runtime = Runtime(store, send=send, nodes=2, config=replace(FAST, **pipeline))  # type: ignore[arg-type]
        counts = await drain(store, runtime)
        assert counts[TaskStatus.DONE] == 10
        assert sent == Counter(range(10))
        assert all(t.result == "ok" for t in store._tasks.values())


async def _send_without_the_task() -> None:  # a mistake: the node calls send(task)
    return None


@pytest.mark.parametrize(
    "send",
    [_send_without_the_task, functools.partial(_send_without_the_task)],
    ids=["def", "partial"],
)
async def test_an_async_send_whose_call_raises_fails_its_task_not_the_node(send: Any, pipeline: dict[str, Any]) -> None:
    """Calling the send raises (TypeError: it takes no task): each task is a failed send,
    retried and dead-lettered with the error, and the node keeps running."""
    async with MemoryStore() as store:
        for i in range(3):
            await store.enqueue("q", {"n": i}, partition_key=f"c{i}")
        runtime = Runtime(store, send=send, nodes=1, config=replace(FAST, **pipeline))
        counts = await drain(store, runtime)
        assert (counts.get(TaskStatus.DEAD), counts.get(TaskStatus.DONE, 0)) == (3, 0)
        assert all("TypeError" in (t.last_error or "") for t in store._tasks.values())
        limit = store.config.retry.max_attempts  # fixed at enqueue by the store's policy
        assert [t.attempts for t in store._tasks.values()] == [limit] * 3
        assert [n.status.value for n in runtime.states()] == ["stopped"]


async def test_a_send_replaced_on_the_node_is_the_one_called(pipeline: dict[str, Any]) -> None:
    """``Node.send`` is a public attribute: a send swapped in (async for sync) is the one used."""
    async with MemoryStore() as store:
        first = await store.enqueue("q", {"n": 1}, partition_key="a")
        calls: list[tuple[str, int]] = []

        def plain(task: Task) -> str:
            calls.append(("plain", task.payload["n"]))
            return "plain"

        async def coro(task: Task) -> str:
            calls.append(("async", task.payload["n"]))
            return "async"

        node = Node(store, plain, node_id="n1", config=replace(FAST, **pipeline))  # type: ignore[arg-type]
        async with asyncio.timeout(10):
            runner = asyncio.create_task(node.run())
            while (await store.get(first.task.id)).status is not TaskStatus.DONE:
                await asyncio.sleep(0.01)
            node.send = coro
            await store.enqueue("q", {"n": 2}, partition_key="b")
            while (await store.stats("q")).counts.get(TaskStatus.DONE, 0) < 2:
                await asyncio.sleep(0.01)
            node.stop_claiming()
            await runner
        assert sorted(t.result for t in store._tasks.values()) == ["async", "plain"]
        assert calls == [("plain", 1), ("async", 2)]


@pytest.mark.parametrize("kind", ["object", "oversize"])
async def test_a_result_the_store_cannot_keep_is_committed_without_it(kind: str, pipeline: dict[str, Any]) -> None:
    class Message:  # what an SDK returns
        pass

    async with MemoryStore() as store:
        await store.enqueue("q", {"n": 1}, partition_key="c")
        calls = 0

        async def send(task: Task) -> Any:
            nonlocal calls
            calls += 1
            return Message() if kind == "object" else "x" * (2 << 20)

        counts = await drain(store, Runtime(store, send=send, nodes=1, config=replace(FAST, **pipeline)))
        assert counts[TaskStatus.DONE] == 1
        assert calls == 1  # committed at once, never re-sent
        (task,) = store._tasks.values()
        assert task.result is None


async def test_shutdown_from_another_task_drains_and_leaves_the_membership(pipeline: dict[str, Any]) -> None:
    async with MemoryStore() as store:
        for i in range(5):
            await store.enqueue("q", {"n": i}, partition_key=f"c{i}")
        started = asyncio.Event()

        async def send(task: Task) -> None:
            started.set()
            await asyncio.sleep(0.05)

        runtime = Runtime(store, send=send, nodes=2, config=replace(FAST, **pipeline), shutdown_timeout_s=2.0)
        await runtime.start()
        await started.wait()
        await asyncio.wait_for(runtime.shutdown(), 10)  # wait_for runs it in a task of its own
        assert await store.members() == []
        stats = await store.stats("q")
        assert stats.counts[TaskStatus.RUNNING] == 0
        assert stats.counts[TaskStatus.DONE] + stats.counts[TaskStatus.PENDING] == 5
        await runtime.shutdown()  # idempotent


async def test_a_send_cut_off_by_shutdown_is_counted_as_interrupted(pipeline: dict[str, Any]) -> None:
    async with MemoryStore() as store:
        await store.enqueue("q", {"n": 1}, partition_key="c")
        started = asyncio.Event()

        async def send(task: Task) -> None:
            started.set()
            await asyncio.sleep(30)

        runtime = Runtime(store, send=send, nodes=1, config=replace(FAST, **pipeline), shutdown_timeout_s=0.1)
        async with runtime:
            await started.wait()
        (task,) = store._tasks.values()
        assert task.status is TaskStatus.PENDING  # handed back...
        assert task.attempts == 1  # ...its attempt counted: the next delivery can tell it may repeat
        assert store.events.get(ev.SEND_INTERRUPTED) == 1  # ...and the possible duplicate is counted


@pytest.mark.parametrize("argument", ["membership", "lock_pool"])
@pytest.mark.parametrize("value", ["x", 42, object()])
async def test_a_node_refuses_a_membership_or_lock_pool_of_the_wrong_type(argument: str, value: Any) -> None:
    async def send(task: Task) -> None:
        return None

    async with MemoryStore() as store:
        with pytest.raises(InvalidTypeError, match=argument):
            Node(store, send, node_id="n1", **{argument: value})


@pytest.mark.parametrize("send", [42, "send", None])
async def test_a_send_that_is_not_callable_is_refused(send: Any) -> None:
    async with MemoryStore() as store:
        with pytest.raises(InvalidTypeError, match="send must be callable"):
            Runtime(store, send=send, nodes=1, config=FAST)
        with pytest.raises(InvalidTypeError, match="send must be callable"):
            Node(store, send, node_id="n1")


async def _plain_send(task: Task) -> None:
    return None


async def _send_generator(task: Task) -> Any:  # a mistake: `yield` makes it an async generator
    yield task.payload


class _GeneratorSend:
    async def __call__(self, task: Task) -> Any:
        yield task.payload


def _sync_send_generator(task: Task) -> Any:  # a mistake: `yield` makes it a generator function
    yield task.payload


class _SyncGeneratorSend:
    def __call__(self, task: Task) -> Any:
        yield task.payload


@pytest.mark.parametrize(
    ("send", "kind"),
    [
        (_send_generator, "async generator"),
        (functools.partial(_send_generator), "async generator"),
        (_GeneratorSend(), "async generator"),
        (_sync_send_generator, "the generator function"),
        (_SyncGeneratorSend(), "the generator function"),
    ],
    ids=["def", "partial", "call", "sync-def", "sync-call"],
)
async def test_a_generator_send_is_refused(send: Any, kind: str) -> None:
    """Calling a generator function (async or plain) runs none of its body: every task would be committed unsent."""
    async with MemoryStore() as store:
        await store.enqueue("q", {"n": 1}, partition_key="c")
        with pytest.raises(InvalidTypeError, match=kind):
            Runtime(store, send=send, nodes=1, config=FAST)
        with pytest.raises(InvalidTypeError, match=kind):
            Node(store, send, node_id="n1")
        assert (await store.stats("q")).counts[TaskStatus.PENDING] == 1  # nothing claimed


async def test_a_plain_send_returning_a_generator_fails_its_task_unsent(pipeline: dict[str, Any]) -> None:
    """A plain function that returns a generator object has run none of the generator's body:
    the task fails (retried, then dead-lettered), never committed as sent."""
    started: list[int] = []

    def lazy(task: Task) -> Any:
        started.append(task.id)
        yield None

    def send(task: Task) -> Any:
        return lazy(task)  # the bug under test: a generator returned, never iterated

    async with MemoryStore() as store:
        await store.enqueue("q", {"n": 1}, partition_key="c")
        counts = await drain(store, Runtime(store, send=send, nodes=1, config=replace(FAST, **pipeline)))
        assert (counts.get(TaskStatus.DEAD), counts.get(TaskStatus.DONE, 0)) == (1, 0)
        (task,) = store._tasks.values()
        assert "returned a generator" in (task.last_error or "")
        assert started == []


@pytest.mark.parametrize("store", ["bot.db", None, object()])
def test_a_node_refuses_a_store_without_the_queue_contract(store: Any) -> None:
    """At construction, as ``Runtime`` refuses it, not as an AttributeError once the node runs."""
    with pytest.raises(InvalidTypeError, match=r"store must implement the queue contract \(a queue store: claim\)"):
        Node(store, _plain_send, node_id="n1", config=FAST)


async def test_a_node_refuses_a_lock_store_without_the_lock_contract() -> None:
    """As ``Runtime`` does: refused at construction, before the node has claimed anything."""
    async with MemoryStore() as store:
        await store.enqueue("q", {"n": 1}, partition_key="c")
        with pytest.raises(InvalidTypeError, match=r"lock_store must implement the lock contract .*, got int"):
            Node(store, _plain_send, node_id="n1", config=FAST, lock_key=lambda t: "x", lock_store=5)
        with pytest.raises(InvalidTypeError, match=r"lock_store must implement the lock contract .*, got int"):
            Runtime(store, send=_plain_send, nodes=1, config=FAST, lock_key=lambda t: "x", lock_store=5)
        (task,) = store._tasks.values()
        assert (task.status, task.version) == (TaskStatus.PENDING, 0)  # nothing claimed


async def test_an_async_generator_send_swapped_in_fails_its_task_unsent(pipeline: dict[str, Any]) -> None:
    """``Node.send`` replaced by an async generator function after the check: its tasks fail
    (retried, then dead-lettered), none is committed as sent."""
    async with MemoryStore() as store:
        await store.enqueue("q", {"n": 1}, partition_key="c")

        async def send(task: Task) -> None:
            return None

        node = Node(store, send, node_id="n1", config=replace(FAST, **pipeline))
        node.send = _send_generator
        runner = asyncio.create_task(node.run())
        async with asyncio.timeout(10):
            while (await store.stats("q")).counts.get(TaskStatus.DEAD, 0) < 1:
                await asyncio.sleep(0.01)
        node.stop_claiming()
        await runner
        (task,) = store._tasks.values()
        assert (task.status, task.result) == (TaskStatus.DEAD, None)
        assert "async generator" in (task.last_error or "")


async def test_a_send_returning_an_unawaited_coroutine_fails_its_task_unsent(
    recwarn: pytest.WarningsRecorder, pipeline: dict[str, Any]
) -> None:
    """``async def send(task): return client_send(task)`` (a missing ``await``): nothing was
    sent, so the task fails (retried, then dead-lettered), never committed as sent."""
    sent: list[int] = []

    async def client_send(task: Task) -> None:
        sent.append(task.payload["n"])

    async def send(task: Task) -> Any:
        return client_send(task)  # the bug under test: no await

    async with MemoryStore() as store:
        await store.enqueue("q", {"n": 1}, partition_key="c")
        counts = await drain(store, Runtime(store, send=send, nodes=1, config=replace(FAST, **pipeline)))
        assert (counts.get(TaskStatus.DEAD), counts.get(TaskStatus.DONE, 0)) == (1, 0)
        (task,) = store._tasks.values()
        assert "unawaited coroutine" in (task.last_error or "")
        assert sent == []
    gc.collect()
    assert not [w for w in recwarn if "never awaited" in str(w.message)]  # closed by the node


async def test_a_release_error_during_a_cancellation_is_logged_not_left_unread(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The node is cancelled while its sends run and the store's release raises an error that
    is no CoordError: the node's run() raises CancelledError, and the release error is
    logged (before, it ended each slot task unread: "Task exception was never retrieved")."""
    unread: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: unread.append(context))
    try:
        async with MemoryStore() as store:
            for i in range(2):
                await store.enqueue("q", {"n": i}, partition_key=f"k{i}")

            async def bad_release(task: Task, **kwargs: Any) -> Task:
                raise RuntimeError("boom in release")

            store.release = bad_release  # type: ignore[method-assign]
            started = asyncio.Event()

            async def send(task: Task) -> None:
                started.set()
                await asyncio.sleep(3600)

            node = Node(store, send, node_id="n1", config=FAST)
            run = asyncio.create_task(node.run())
            await asyncio.wait_for(started.wait(), 5)
            await asyncio.sleep(0.05)
            run.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(run, 10)
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
    assert unread == []
    logged = [r for r in caplog.records if "hand_back_failed" in r.getMessage()]
    assert len(logged) == 2
    assert all("boom in release" in r.getMessage() for r in logged)
