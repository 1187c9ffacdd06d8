"""A send that ignores the cancellation of its timeout: the node waits for it (lease and lock kept), up to a bound.

At ``send_timeout_s`` the node cancels the send; a send that swallows that ``CancelledError``
and runs past its cleanup time (``SEND_CLEANUP_S``) is cancelled once more and then still
waited for, its task lease and lock held and renewed, until it ends or ``send_overrun_s`` after
the cut (``send_timeout_s`` when None). No other send under its lock starts meanwhile, and the
task is not sent again while it runs. Stores come from ``make_store`` with ``clock=None``: leases
and locks lapse in real time, and every node runs real sends concurrently.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
from support import wait_until

from asynccoord import InvalidArgumentError, InvalidTypeError, RetryPolicy, Task, TaskStatus, current_delivery
from asynccoord import events as ev
from asynccoord.node import NodeConfig, Runtime
from asynccoord.node.send import SEND_CLEANUP_S

QUEUE = "q"
FAST = {"idle_min_s": 0.01, "idle_max_s": 0.05, "retry": RetryPolicy(base_s=0.01, factor=1.0, cap_s=0.01, jitter=0.0)}
ACCOUNT = "account:bot-1"


class Sends:
    """The sends of a test: when each began and ended, and which began while another send ran."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.t0 = self.loop.time()
        self.log: list[tuple[float, str, str, int]] = []  # (seconds since t0, "begin"/"end", name, attempt)
        self.running: set[tuple[str, int]] = set()
        self.overlaps: list[tuple[tuple[str, int], list[tuple[str, int]]]] = []
        self.cancels: dict[tuple[str, int], int] = {}
        self.release = asyncio.Event()  # ends a send that ignores its cancellation for ever
        self.ended = asyncio.Event()  # set when such a send has ended

    def begin(self, name: str, attempt: int) -> tuple[str, int]:
        key = (name, attempt)
        if self.running:
            self.overlaps.append((key, sorted(self.running)))
        self.running.add(key)
        self.log.append((self.loop.time() - self.t0, "begin", name, attempt))
        return key

    def end(self, key: tuple[str, int]) -> None:
        self.running.discard(key)
        self.log.append((self.loop.time() - self.t0, "end", *key))

    def at(self, what: str, name: str, attempt: int) -> float:
        [t] = [t for t, w, n, a in self.log if (w, n, a) == (what, name, attempt)]
        return t

    def count(self, name: str) -> int:
        return sum(1 for _, w, n, _ in self.log if (w, n) == ("begin", name))

    async def stubborn(self, key: tuple[str, int], *, run_s: float | None, then: str = "return") -> str:
        """Run ``run_s`` seconds (None: until ``release``), swallowing every cancellation; then return or raise."""
        until = None if run_s is None else self.loop.time() + run_s
        while not (self.release.is_set() if until is None else self.loop.time() >= until):
            try:
                await asyncio.sleep(0.02 if until is None else until - self.loop.time())
            except asyncio.CancelledError:  # a client library that swallows cancellation
                self.cancels[key] = self.cancels.get(key, 0) + 1
        if until is None:
            self.ended.set()
        if then == "raise":
            raise asyncio.CancelledError  # gives in to the cancellation at last
        return "sent"


def messages(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"asynccoord.node.{name} ")]


async def logged(caplog: pytest.LogCaptureFixture, name: str, timeout_s: float = 10.0) -> None:
    async def wait() -> None:
        while not messages(caplog, name):
            await asyncio.sleep(0.01)

    await asyncio.wait_for(wait(), timeout_s)


def test_send_overrun_s_is_checked() -> None:
    assert NodeConfig().send_overrun_s is None
    assert NodeConfig(send_overrun_s=0).send_overrun_s == 0
    with pytest.raises(InvalidArgumentError, match=r"^send_overrun_s must be >= 0, got -1$"):
        NodeConfig(send_overrun_s=-1)
    with pytest.raises(InvalidArgumentError, match=r"^send_overrun_s must be finite, got nan$"):
        NodeConfig(send_overrun_s=float("nan"))
    with pytest.raises(InvalidTypeError, match=r"^send_overrun_s must be"):
        NodeConfig(send_overrun_s="1")  # type: ignore[arg-type]


@pytest.mark.parametrize("then", ["return", "raise"])
async def test_a_send_ignoring_its_timeout_keeps_its_account_lock_until_it_ends(
    make_store: Any, then: str, caplog: pytest.LogCaptureFixture
) -> None:
    """One account lock, two nodes. 'slow' ignores the cancellation of its timeout (0.6 s) and ends
    at 1.0 s, past its cleanup time (0.85 s) and within the bound (0.6 s after the cut: 1.2 s).
    'next', another conversation of the account, begins only once 'slow' has ended. A send that
    then returns went out: committed, sent once. One that raises is a failed attempt, sent once
    more (exactly 2 sends), and that retry too begins only once the first send has ended."""
    caplog.set_level(logging.INFO, logger="asynccoord.node.send")
    store = await make_store(clock=None)
    slow_id = (await store.enqueue(QUEUE, "slow", partition_key="chat-1", max_attempts=3)).task.id
    sends = Sends()

    async def send(task: Task) -> str:
        key = sends.begin(task.payload, task.attempts)
        try:
            if task.payload == "slow" and task.attempts == 1:
                return await sends.stubborn(key, run_s=1.0, then=then)
            await asyncio.sleep(0.05)
            return "sent"
        finally:
            sends.end(key)

    config = NodeConfig(queue=QUEUE, send_timeout_s=0.6, lease_s=1.5, lock_ttl_s=1.5, **FAST)
    runtime = Runtime(store, send=send, nodes=2, config=config, lock_key=lambda task: ACCOUNT)
    async with runtime:
        while not sends.log:
            await asyncio.sleep(0.005)
        next_id = (await store.enqueue(QUEUE, "next", partition_key="chat-2", max_attempts=3)).task.id
        assert await runtime.wait_until_drained(timeout_s=20.0, poll_s=0.02)
    assert sends.overlaps == []  # no two sends of the account at once
    assert sends.cancels[("slow", 1)] == 2  # at its timeout, then at the end of its cleanup time
    slow_ended = sends.at("end", "slow", 1)
    assert slow_ended >= 0.6 + SEND_CLEANUP_S  # it did outlive its cleanup time
    assert sends.at("begin", "next", 1) >= slow_ended
    slow, nxt = await store.get(slow_id), await store.get(next_id)
    assert (nxt.status, nxt.attempts, nxt.result) == (TaskStatus.DONE, 1, "sent")
    if then == "return":  # its message went out: committed, never sent again
        assert (slow.status, slow.attempts, slow.result, slow.last_error) == (TaskStatus.DONE, 1, "sent", None)
        assert sends.count("slow") == 1
        assert len(messages(caplog, "send_returned_late")) == 1
    else:  # a failed attempt (its timeout), sent exactly once more, after the first send ended
        assert (slow.status, slow.attempts, slow.result) == (TaskStatus.DONE, 2, "sent")
        assert sum(s.failed for s in runtime.states()) == 1  # the first attempt (TimeoutError)
        assert sends.count("slow") == 2
        assert sends.at("begin", "slow", 2) >= slow_ended
        assert messages(caplog, "send_returned_late") == []
    [overran] = messages(caplog, "send_overran")
    assert f"task={slow_id}: the send outlived its cleanup time" in overran
    assert "its task lease and lock are kept until it ends" in overran
    assert messages(caplog, "send_let_go") == []
    assert store.events.get(ev.SEND_ABANDONED) == 0  # waited for until it ended
    assert (store.events.get(ev.LEASE_LOST), store.events.get(ev.LOCK_LOST)) == (0, 0)
    assert sum(s.committed for s in runtime.states()) == 2
    assert await store.list_locks() == []


@pytest.mark.parametrize("way", ["slots", "batch"])
@pytest.mark.parametrize("then", ["return", "raise"])
async def test_without_a_lock_a_send_ignoring_its_timeout_is_not_sent_again_while_it_runs(
    make_store: Any, way: str, then: str
) -> None:
    """No lock: the task lease alone is held while the node waits, so its retry (0.01 s backoff)
    cannot begin beside the first send. Exactly 1 send when it returns, 2 when it raises."""
    store = await make_store(clock=None)
    task_id = (await store.enqueue(QUEUE, "slow", partition_key="chat-1", max_attempts=3)).task.id
    sends = Sends()

    async def send(task: Task) -> str:
        key = sends.begin(task.payload, task.attempts)
        try:
            if task.attempts == 1:
                return await sends.stubborn(key, run_s=1.0, then=then)
            return "sent"
        finally:
            sends.end(key)

    config = NodeConfig(queue=QUEUE, send_timeout_s=0.6, lease_s=1.5, claim_next=way == "slots", **FAST)
    async with Runtime(store, send=send, nodes=2, config=config) as runtime:
        while not sends.log:
            await asyncio.sleep(0.005)
        assert await runtime.wait_until_drained(timeout_s=20.0, poll_s=0.02)
    assert sends.overlaps == []
    task = await store.get(task_id)
    if then == "return":
        assert (task.status, task.attempts, task.result) == (TaskStatus.DONE, 1, "sent")
        assert sends.count("slow") == 1
    else:
        assert (task.status, task.attempts, task.result) == (TaskStatus.DONE, 2, "sent")
        assert sum(s.failed for s in runtime.states()) == 1  # the first attempt (TimeoutError)
        assert sends.count("slow") == 2
        assert sends.at("begin", "slow", 2) >= sends.at("end", "slow", 1)
    assert store.events.get(ev.LEASE_LOST) == 0


async def test_a_send_ignoring_cancellation_for_ever_is_let_go_at_the_bound(
    make_store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Cut at 0.3 s, waited for up to send_overrun_s (1.5 s) after the cut, longer than the task
    lease (1 s) and the lock's TTL (1 s), both renewed meanwhile; then let go: the attempt fails,
    the lock passes on (the next send of the account begins no sooner), the task is retried. The
    lease goes back to the store: the sends beside the one let go carry a higher fencing token,
    so a provider checking it refuses the stale sender (on the same lease they shared its token)."""
    store = await make_store(clock=None)
    slow_id = (await store.enqueue(QUEUE, "slow", partition_key="chat-1", max_attempts=3)).task.id
    next_id = (await store.enqueue(QUEUE, "next", partition_key="chat-2", max_attempts=3)).task.id
    sends = Sends()
    tokens: dict[tuple[str, int], int] = {}

    async def send(task: Task) -> str:
        lock = current_delivery().lock
        assert lock is not None
        tokens[(task.payload, task.attempts)] = lock.fencing_token
        key = sends.begin(task.payload, task.attempts)
        try:
            if task.payload == "slow" and task.attempts == 1:
                return await sends.stubborn(key, run_s=None)
            return "sent"
        finally:
            sends.end(key)

    config = NodeConfig(
        queue=QUEUE, send_timeout_s=0.3, send_overrun_s=1.5, lease_s=1.0, lock_ttl_s=1.0, lock_wait_s=10.0, **FAST
    )
    # One node: both tasks are claimed at once, 'next' waits for the lock from the start.
    runtime = Runtime(store, send=send, nodes=1, config=config, lock_key=lambda task: ACCOUNT)
    try:
        async with runtime:
            assert await runtime.wait_until_drained(timeout_s=20.0, poll_s=0.02)
            assert sends.running == {("slow", 1)}  # still running, unwatched now
    finally:
        sends.release.set()
    await asyncio.wait_for(sends.ended.wait(), 5.0)
    slow_began = sends.at("begin", "slow", 1)
    others = [(n, a) for _, w, n, a in sends.log if w == "begin" and (n, a) != ("slow", 1)]
    assert sorted(others) == [("next", 1), ("slow", 2)]
    for name, attempt in others:  # no send of the account before the bound (cut at 0.3 s + 1.5 s)
        assert sends.at("begin", name, attempt) - slow_began >= 0.3 + 1.5 - 0.02
    assert [w for w, k in sends.overlaps] == others  # then they ran beside the send let go, as documented
    assert min(tokens[other] for other in others) > tokens[("slow", 1)]
    slow, nxt = await store.get(slow_id), await store.get(next_id)
    assert (slow.status, slow.attempts, slow.result) == (TaskStatus.DONE, 2, "sent")
    assert runtime.states()[0].failed == 1  # the first attempt (TimeoutError)
    assert (nxt.status, nxt.attempts) == (TaskStatus.DONE, 1)
    assert len(messages(caplog, "send_overran")) == 1
    [let_go] = messages(caplog, "send_let_go")
    assert let_go.startswith(
        f"asynccoord.node.send_let_go task={slow_id}: the send still runs 1.50 s after its timeout"
    )
    assert (store.events.get(ev.LEASE_LOST), store.events.get(ev.LOCK_LOST)) == (0, 0)  # renewed while waited for
    assert store.events.get(ev.SEND_ABANDONED) == 1  # let go while it ran: counted
    assert await store.list_locks() == []


@pytest.mark.parametrize("way", ["slots", "batch", "lock"])
async def test_a_shutdown_while_a_send_that_overran_its_timeout_is_waited_for_keeps_its_drain_deadline(
    make_store: Any, way: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The node waits for the send (send_overrun_s 30 s) when the shutdown (drain 0.5 s) comes: the
    drain waits for it as for any send under way, then the node's cancellation ends the wait at
    once. The send still runs: its task is not handed back, and its lease and lock are not given
    back either but left to lapse, unrenewed, at their TTLs (1 s)."""
    store = await make_store(clock=None)
    task_id = (await store.enqueue(QUEUE, "slow", partition_key="chat-1")).task.id
    sends = Sends()

    async def send(task: Task) -> str:
        key = sends.begin(task.payload, task.attempts)
        try:
            return await sends.stubborn(key, run_s=None)
        finally:
            sends.end(key)

    config = NodeConfig(
        queue=QUEUE,
        send_timeout_s=0.2,
        send_overrun_s=30.0,
        lease_s=1.0,
        lock_ttl_s=1.0,
        claim_next=way != "batch",
        **FAST,
    )
    lock_key = (lambda task: ACCOUNT) if way == "lock" else None
    runtime = Runtime(store, send=send, nodes=1, config=config, lock_key=lock_key, shutdown_timeout_s=0.5)
    try:
        async with runtime:
            await logged(caplog, "send_overran")  # the node waits for it now
            leaving = time.monotonic()
        left = time.monotonic()
        assert 0.5 <= left - leaving < 0.5 + SEND_CLEANUP_S + 0.5  # the drain's deadline, kept
        task = await store.get(task_id)
        assert (task.status, task.attempts, task.last_error) == (TaskStatus.RUNNING, 1, None)  # still leased
        assert [lock.name for lock in await store.list_locks()] == ([ACCOUNT] if way == "lock" else [])
        assert runtime.states()[0].handed_back == 0
        [outlived] = messages(caplog, "send_outlived_shutdown")
        shown = repr(ACCOUNT) if way == "lock" else "-"
        assert f" task={task_id} lock={shown}: the send still runs after the node's stop cut it" in outlived
        # Unrenewed, the lock lapses within its TTL and the task lease within lease_s: the task is claimable.
        claimed: list[Task] = []
        while not claimed and time.monotonic() - left < 3.0:
            await asyncio.sleep(0.05)
            claimed = await store.claim(QUEUE, node_id="next-node", limit=1, lease_s=5.0)
        assert [t.id for t in claimed] == [task_id]
        assert time.monotonic() - left >= 1.0 - 1.0 / 3 - 0.05  # not before the lease (renewed every 1/3 s) lapsed

        async def no_locks() -> bool:
            return await store.list_locks() == []

        # The lock, renewed apart from the task lease, may lapse a moment after it: within its TTL.
        await wait_until(no_locks, 1.0 + 0.2 - (time.monotonic() - left), "the unrenewed lock to lapse")
        assert sends.running == {("slow", 1)}  # all that while, the send ran on
    finally:
        sends.release.set()
    await asyncio.wait_for(sends.ended.wait(), 5.0)
    assert store.events.get("send_interrupted") == 1
    assert messages(caplog, "send_let_go") == []
    assert sends.count("slow") == 1


@pytest.mark.parametrize("lost", ["lock", "lease"])
async def test_a_lock_or_lease_lost_while_the_node_waits_for_the_send_ends_the_wait_at_once(
    make_store: Any, lost: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Exclusivity is gone anyway: the node stops waiting (send_overrun_s 30 s) as the loss is seen.
    A lost lock: the attempt fails (LockLostError), retried. A lost lease: nothing is written."""
    store = await make_store(clock=None)
    task_id = (await store.enqueue(QUEUE, "slow", partition_key="chat-1", max_attempts=3)).task.id
    sends = Sends()
    gone = asyncio.Event()
    extend_many = store.extend_many

    async def renew(tasks: list[Task], lease_s: float) -> list[bool]:
        renewed: list[bool] = await extend_many(tasks, lease_s)
        taken = lost == "lease" and gone.is_set()  # the store took the task back
        return [ok and not (taken and t.id == task_id) for t, ok in zip(tasks, renewed, strict=True)]

    store.extend_many = renew

    async def send(task: Task) -> str:
        key = sends.begin(task.payload, task.attempts)
        try:
            if task.attempts > 1:
                return "sent"
            lease = current_delivery().lock
            assert lease is not None
            while sends.cancels.get(key, 0) < 2:  # until the node waits for it past its cleanup time
                try:
                    await asyncio.sleep(0.01)
                except asyncio.CancelledError:
                    sends.cancels[key] = sends.cancels.get(key, 0) + 1
            if lost == "lock":
                await store.release_lock(lease)  # as if it had lapsed: its next renewal fails
            gone.set()
            return await sends.stubborn(key, run_s=None)
        finally:
            sends.end(key)

    config = NodeConfig(
        queue=QUEUE, send_timeout_s=0.2, send_overrun_s=30.0, lease_s=0.9, lock_ttl_s=0.6, lock_wait_s=10.0, **FAST
    )
    runtime = Runtime(store, send=send, nodes=1, config=config, lock_key=lambda task: ACCOUNT)
    try:
        async with runtime:
            await asyncio.wait_for(gone.wait(), 10.0)
            while runtime.states()[0].in_flight:  # the slot lets go while the send still runs
                await asyncio.sleep(0.01)
            assert sends.running == {("slow", 1)}
            if lost == "lock":
                assert await runtime.wait_until_drained(timeout_s=20.0, poll_s=0.02)
    finally:
        sends.release.set()
    await asyncio.wait_for(sends.ended.wait(), 5.0)
    assert messages(caplog, "send_let_go") == []
    task = await store.get(task_id)
    if lost == "lock":
        assert (task.status, task.attempts, task.result) == (TaskStatus.DONE, 2, "sent")
        assert (runtime.states()[0].failed, runtime.states()[0].conflicts) == (0, 1)  # a lost lock: a conflict
        assert store.events.get(ev.LOCK_LOST) >= 1
    else:
        assert (task.status, task.attempts, task.last_error) == (TaskStatus.RUNNING, 1, None)  # lapses by itself
        assert store.events.get(ev.LEASE_LOST) == 1
        assert runtime.states()[0].conflicts == 1
    assert await store.list_locks() == []
