"""A send still running when its node shuts down keeps its lock and task lease until they lapse.

Runtime A's send ignores its cancellations (its timeout's, then the shutdown's) and runs on past
A's shutdown. A does not hand that task back nor give its lock back: both are left to lapse at
their TTLs, unrenewed. Runtime B, beside it on the same store (another lock pool, as another
process would be), sends nothing under that lock until the lock lapsed, and does not send the
task again while A's send runs. The tasks A never began are handed back at once, as always.
Stores come from ``make_store`` with ``clock=None``: leases and locks lapse in real time.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from asynccoord import RetryPolicy, Task, TaskStatus
from asynccoord import events as ev
from asynccoord.node import NodeConfig, Runtime

QUEUE = "q"
ACCOUNT = "account:bot"
FAST = {"idle_min_s": 0.01, "idle_max_s": 0.05, "retry": RetryPolicy(base_s=0.01, factor=1.0, cap_s=0.01, jitter=0.0)}
LOCK_TTL_S = 1.0
LEASE_S = 3.0


def messages(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"asynccoord.node.{name} ")]


async def test_a_send_outliving_its_runtimes_shutdown_keeps_its_lock_and_task_until_they_lapse(
    make_store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    store = await make_store(clock=None)
    ids = {}
    for name in ("slow", "a", "b"):  # three conversations of one account: one lock
        ids[name] = (await store.enqueue(QUEUE, name, partition_key=f"chat-{name}", max_attempts=3)).task.id
    loop = asyncio.get_running_loop()
    log: list[tuple[float, str, str, int, str]] = []  # (loop time, "begin"/"end", payload, attempt, runtime)
    running: set[tuple[str, int]] = set()
    overlaps: list[tuple[tuple[str, int], list[tuple[str, int]]]] = []
    slow_began = asyncio.Event()
    release = asyncio.Event()  # ends A's stubborn send

    def sender(who: str) -> Any:
        async def send(task: Task) -> str:
            key = (task.payload, task.attempts)
            if running:
                overlaps.append((key, sorted(running)))
            running.add(key)
            log.append((loop.time(), "begin", *key, who))
            try:
                if key == ("slow", 1):
                    slow_began.set()
                    while not release.is_set():
                        try:
                            await asyncio.sleep(0.01)
                        except asyncio.CancelledError:  # a client library that swallows cancellation
                            pass
                else:
                    await asyncio.sleep(0.02)
                return "sent"
            finally:
                running.discard(key)
                log.append((loop.time(), "end", *key, who))

        return send

    def config() -> NodeConfig:
        return NodeConfig(
            queue=QUEUE,
            send_timeout_s=0.2,
            send_overrun_s=30.0,
            lease_s=LEASE_S,
            lock_ttl_s=LOCK_TTL_S,
            lock_wait_s=30.0,
            **FAST,
        )

    def lock_key(task: Task) -> str:
        return ACCOUNT

    a = Runtime(store, send=sender("A"), nodes=1, config=config(), lock_key=lock_key, shutdown_timeout_s=0.5)
    b = Runtime(store, send=sender("B"), nodes=1, config=config(), lock_key=lock_key)
    try:
        async with a:  # A claims the three tasks; 'a' and 'b' wait for the lock behind 'slow'
            await asyncio.wait_for(slow_began.wait(), 10.0)
            await b.start()  # B finds every task leased to A
            await asyncio.sleep(0.5)  # past the send's timeout (0.2 s) and cleanup time: A waits for it
        a_left = loop.time()
        try:
            # A stopped: its send runs on, and A keeps what guards it until it lapses.
            assert running == {("slow", 1)}
            [lock] = [lock for lock in await store.list_locks() if lock.name == ACCOUNT]  # (B's place in line aside)
            assert lock.holder == a.instance_id
            slow = await store.get(ids["slow"])
            assert (slow.status, slow.attempts) == (TaskStatus.RUNNING, 1)
            assert [(s.handed_back, s.failed) for s in a.states()] == [(2, 0)]  # 'a', 'b': never begun, back at once
            for name in ("a", "b"):  # (B may have claimed them already)
                assert (await store.get(ids[name])).attempts in (0, 1)
            [outlived] = messages(caplog, "send_outlived_shutdown")
            assert f" task={ids['slow']} lock={ACCOUNT!r}: the send still runs after the node's stop" in outlived
            assert store.events.get(ev.SEND_ABANDONED) == 1
            assert f"within lease_s={LEASE_S:.2f} s and lock_ttl_s={LOCK_TTL_S:.2f} s" in outlived
            # B waits for the lock to lapse; then sends 'a' and 'b'. A's send ends after that, before
            # its task lease lapses: B sends 'slow' again only once its lease lapsed, A's send over.
            while not any(w == "B" for *_, w in log) and loop.time() - a_left < 10.0:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)
            release.set()
            assert await b.wait_until_drained(timeout_s=20.0, poll_s=0.02)
        finally:
            await b.shutdown()
    finally:
        release.set()
    begins = [(t, p, n, w) for t, what, p, n, w in log if what == "begin"]
    b_begins = [(t, p, n) for t, p, n, w in begins if w == "B"]
    assert sorted((p, n) for _, p, n in b_begins) == [("a", 1), ("b", 1), ("slow", 2)]
    # Nothing of B under the lock before A's lease on it lapsed (renewed every TTL/3 until A stopped).
    first_b = min(t for t, _, _ in b_begins)
    assert first_b - a_left >= LOCK_TTL_S - LOCK_TTL_S / 3 - 0.1, (first_b - a_left, log)
    # The task is sent again only once A's send of it is over (and its lease lapsed).
    [slow_ended] = [t for t, what, p, n, _ in log if (what, p, n) == ("end", "slow", 1)]
    [slow_again] = [t for t, p, n in b_begins if (p, n) == ("slow", 2)]
    assert slow_again >= slow_ended
    assert slow_again - a_left >= LEASE_S - LEASE_S / 3 - 0.1
    # B's sends ran beside A's only after A's lock had lapsed (as documented), never beside each other.
    assert all(others == [("slow", 1)] for _, others in overlaps), overlaps
    for name in ("a", "b", "slow"):
        task = await store.get(ids[name])
        assert (task.status, task.result) == (TaskStatus.DONE, "sent")
    assert (await store.get(ids["slow"])).attempts == 2
    assert store.events.get(ev.SEND_INTERRUPTED) == 1
    assert await store.list_locks() == []


async def test_a_shutdown_whose_sends_end_in_their_cleanup_time_hands_everything_back_at_once(
    make_store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Sends that give in to the shutdown's cancellation (one at once, one in its cleanup time, one
    on its second cancellation): every task is handed back and the lock given back, at once."""
    store = await make_store(clock=None)
    ids = [(await store.enqueue(QUEUE, n, partition_key=f"chat-{n}")).task.id for n in ("x", "y", "z")]
    began: list[str] = []

    async def send(task: Task) -> str:
        began.append(task.payload)
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            if task.payload == "y":
                await asyncio.sleep(0.05)  # a cleanup well within its time
            elif task.payload == "z":
                try:  # swallows the first cancellation, gives in to the second
                    await asyncio.sleep(60)
                except asyncio.CancelledError:
                    pass
            raise
        return "sent"

    for locked in (False, True):
        began.clear()
        lock_key = (lambda task: f"account:{task.payload}") if locked else None
        config = NodeConfig(queue=QUEUE, lease_s=30.0, lock_ttl_s=10.0, **FAST)  # nothing lapses meanwhile
        runtime = Runtime(store, send=send, nodes=1, config=config, lock_key=lock_key, shutdown_timeout_s=0.2)
        async with runtime:
            while len(began) < 3:
                await asyncio.sleep(0.01)
        tasks = [await store.get(i) for i in ids]
        assert [(t.status, t.attempts) for t in tasks] == [(TaskStatus.PENDING, 1 + locked)] * 3
        assert runtime.states()[0].handed_back == 3
        assert await store.list_locks() == []
    assert messages(caplog, "send_outlived_shutdown") == []
    assert store.events.get(ev.SEND_INTERRUPTED) == 6
    assert store.events.get(ev.SEND_ABANDONED) == 0
