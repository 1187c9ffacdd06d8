"""Hypothesis stateful test: the queue against a plain-Python model of its semantics.

Random sequences of enqueue (with and without idempotency keys), claim (ordered or
not), complete, fail, release, extend, requeue, purge and clock advances run against
a real store on a fake clock; after every step the store must agree with the model
task by task (status, attempts, version, run_at, lease, timestamps), and no task may
be held under two live leases. Old leases stay in play, so stale commits are tried
all the time. The SQLite machine is the point; the same machine also runs against
the in-memory reference store.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, multiple, precondition, rule
from support import FakeClock

from asynccoord import (
    LeaseLostError,
    MemoryStore,
    RetryPolicy,
    SQLiteStore,
    StoreConfig,
    Task,
    TaskNotFoundError,
    TaskStatus,
)

Q = "q"
POLICY = RetryPolicy(base_s=1.0, factor=2.0, cap_s=4.0, jitter=0.0, max_attempts=3)
PENDING, RUNNING, DONE, DEAD = TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.DONE, TaskStatus.DEAD


@dataclass(slots=True)
class Model:
    """What the store should hold for one task."""

    id: int
    key: str
    idem: str | None
    priority: int
    max_attempts: int
    status: TaskStatus = PENDING
    attempts: int = 0
    version: int = 0
    run_at: float = 0.0
    token: str | None = None
    expires: float | None = None
    updated_at: float = 0.0
    last_error: str | None = None


class QueueMachine(RuleBasedStateMachine):
    """Subclasses set ``backend``."""

    backend = "sqlite"
    leases = Bundle("leases")

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock()
        self.tmp = Path(tempfile.mkdtemp(prefix="asynccoord-stateful-"))
        config = StoreConfig(retry=POLICY)
        if self.backend == "sqlite":
            self.store: SQLiteStore | MemoryStore = SQLiteStore(self.tmp / "q.db", config=config, clock=self.clock)
        else:
            self.store = MemoryStore(config=config, clock=self.clock)
        self.run(self.store.open())
        self.model: dict[int, Model] = {}
        self.by_idem: dict[str, int] = {}
        self.processed: set[str] = set()
        self.last_id = 0
        self.ids: list[int] = []
        self.tokens_issued: list[str] = []
        self.issued: list[Task] = []

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        try:
            self.run(self.store.close())
        finally:
            self.loop.close()
            shutil.rmtree(self.tmp, ignore_errors=True)

    @property
    def now(self) -> float:
        return self.clock.now

    # --- model helpers -------------------------------------------------------------

    def _change(self, m: Model, **changes: Any) -> None:
        for name, value in changes.items():
            setattr(m, name, value)
        m.version += 1
        m.updated_at = self.now
        if m.status is not RUNNING:
            m.token = m.expires = None

    def _lease_error(self, lease: Task) -> type[Exception] | None:
        """The error the store must raise for ``lease`` now, or None if it still holds."""
        m = self.model.get(lease.id)
        if m is None:
            return TaskNotFoundError
        if m.status is not RUNNING or m.token != lease.lease_token or m.version != lease.version:
            return LeaseLostError
        assert m.expires is not None
        if m.expires <= self.now:
            return LeaseLostError
        return None

    # --- rules ---------------------------------------------------------------------

    @initialize()
    def start(self) -> None:
        self.clock.advance(0)

    @rule(
        idem=st.none() | st.sampled_from(["a", "b", "c"]),
        key=st.sampled_from(["k1", "k2", "k3"]),
        priority=st.sampled_from([0, 0, 1, 5]),
        max_attempts=st.integers(1, 3),
        delay=st.sampled_from([0.0, 0.0, 0.5, 2.0]),
    )
    def enqueue(self, idem: str | None, key: str, priority: int, max_attempts: int, delay: float) -> None:
        result = self.run(
            self.store.enqueue(
                Q,
                {"key": key},
                partition_key=key,
                idempotency_key=idem,
                priority=priority,
                max_attempts=max_attempts,
                delay_s=delay,
            )
        )
        if idem is not None and idem in self.by_idem:
            assert result.created is False
            assert result.task.id == self.by_idem[idem]
            return
        assert result.created is True
        # Ids only ever grow (SQLite's AUTOINCREMENT may skip some; they are opaque).
        assert result.task.id > self.last_id
        self.last_id = result.task.id
        self.ids.append(result.task.id)
        m = Model(
            id=result.task.id,
            key=key,
            idem=idem,
            priority=priority,
            max_attempts=max_attempts,
            run_at=self.now + delay,
            updated_at=self.now,
        )
        self.model[m.id] = m
        if idem is not None:
            self.by_idem[idem] = m.id

    @rule(target=leases, limit=st.integers(1, 4), lease_s=st.sampled_from([1.0, 2.5]), ordered=st.booleans())
    def claim(self, limit: int, lease_s: float, ordered: bool) -> Any:
        now = self.now
        for m in self.model.values():
            if m.status is RUNNING and m.expires is not None and m.expires <= now and m.attempts >= m.max_attempts:
                self._change(m, status=DEAD, last_error="lease expired on the last attempt")
                event("claim dead-lettered an exhausted lease")
        heads: dict[str, int] = {}
        for m in sorted(self.model.values(), key=lambda m: m.id):
            if m.status in (PENDING, RUNNING):
                heads.setdefault(m.key, m.id)
        due = [
            m
            for m in self.model.values()
            if ((m.status is PENDING and m.run_at <= now) or (m.status is RUNNING and m.expires <= now))  # type: ignore[operator]
            and (not ordered or heads[m.key] == m.id)
        ]
        due.sort(key=lambda m: (-m.priority, m.id))
        chosen = due[:limit]
        expected_ids = [m.id for m in chosen if m.idem not in self.processed]

        got = self.run(self.store.claim(Q, node_id="n", limit=limit, lease_s=lease_s, ordered=ordered))
        assert [t.id for t in got] == expected_ids
        by_id = {t.id: t for t in got}
        for m in chosen:
            self._change(m, status=RUNNING, attempts=m.attempts + 1, expires=now + lease_s)
            if m.idem in self.processed:  # a redelivery of a processed message: settled at claim
                self._change(m, status=DONE, last_error=None)
                event("duplicate delivery suppressed at claim")
                continue
            t = by_id[m.id]
            assert t.lease_token is not None
            m.token = t.lease_token
            self.tokens_issued.append(t.lease_token)
        self.issued.extend(got)
        return multiple(*got)

    @rule(lease=leases)
    def complete(self, lease: Task) -> None:
        error = self._lease_error(lease)
        if error is not None:
            event(f"complete refused: {error.__name__}")
            with pytest.raises(error):
                self.run(self.store.complete(lease, {"ok": lease.id}))
            return
        done = self.run(self.store.complete(lease, {"ok": lease.id}))
        m = self.model[lease.id]
        self._change(m, status=DONE, last_error=None)
        if m.idem is not None:
            self.processed.add(m.idem)
        assert done.status is DONE
        assert done.version == m.version

    @rule(lease=leases)
    def fail(self, lease: Task) -> None:
        error = self._lease_error(lease)
        if error is not None:
            with pytest.raises(error):
                self.run(self.store.fail(lease, "boom"))
            return
        failed = self.run(self.store.fail(lease, "boom"))
        m = self.model[lease.id]
        if m.attempts >= m.max_attempts:
            self._change(m, status=DEAD, last_error="boom")
        else:
            self._change(m, status=PENDING, run_at=self.now + POLICY.delay_s(m.attempts), last_error="boom")
        assert failed.status is m.status

    @rule(lease=leases)
    def release(self, lease: Task) -> None:
        error = self._lease_error(lease)
        if error is not None:
            with pytest.raises(error):
                self.run(self.store.release(lease))
            return
        self.run(self.store.release(lease))
        m = self.model[lease.id]
        self._change(m, status=PENDING, run_at=self.now, attempts=max(m.attempts - 1, 0))

    @rule(lease=leases, lease_s=st.sampled_from([0.5, 3.0]))
    def extend(self, lease: Task, lease_s: float) -> None:
        error = self._lease_error(lease)
        if error is not None:
            with pytest.raises(error):
                self.run(self.store.extend(lease, lease_s))
            return
        expiry = self.run(self.store.extend(lease, lease_s))
        m = self.model[lease.id]
        m.expires = self.now + lease_s  # a heartbeat: no version change
        assert expiry == m.expires

    @precondition(lambda self: self.issued)
    @rule(leases_=st.lists(leases, min_size=1, max_size=4), lease_s=st.sampled_from([0.5, 3.0]))
    def extend_many(self, leases_: list[Task], lease_s: float) -> None:
        expected = []
        for lease in leases_:
            expected.append(self._lease_error(lease) is None)
        got = self.run(self.store.extend_many(leases_, lease_s))
        assert got == expected
        if len(set(expected)) == 2:
            event("extend_many with live and lost leases")
        for lease, ok in zip(leases_, expected, strict=True):
            if ok:
                self.model[lease.id].expires = self.now + lease_s

    @rule()
    def requeue_dead(self) -> None:
        dead = [m for m in self.model.values() if m.status is DEAD]
        assert self.run(self.store.requeue_dead(Q)) == len(dead)
        for m in dead:
            self._change(m, status=PENDING, attempts=0, run_at=self.now)

    @rule(older_than_s=st.sampled_from([0.0, 1.0]))
    def purge_finished(self, older_than_s: float) -> None:
        cutoff = self.now - older_than_s
        gone = [m for m in self.model.values() if m.status is DONE and m.updated_at < cutoff]
        result = self.run(self.store.purge_finished(Q, older_than_s=older_than_s))
        assert result.deleted == len(gone)
        for m in gone:
            del self.model[m.id]
            if m.idem is not None and self.by_idem.get(m.idem) == m.id:
                del self.by_idem[m.idem]

    @precondition(lambda self: any(m.status is DONE and m.idem is not None for m in self.model.values()))
    @rule(target=leases, data=st.data())
    def redeliver(self, data: st.DataObject) -> Any:
        """The upstream sends a processed message again after its task row was purged."""
        idem = data.draw(st.sampled_from(sorted(m.idem for m in self.model.values() if m.status is DONE and m.idem)))
        self.clock.advance(0.25)
        self.purge_finished(0.0)
        self.enqueue(idem, "k1", 9, 1, 0.0)  # top priority: the next claim reaches it
        task_id = self.by_idem[idem]
        claimed = self.claim(1, 1.0, False)
        assert task_id not in [t.id for t in claimed.values]
        assert self.model[task_id].status is DONE
        return claimed

    @rule(dt=st.sampled_from([0.25, 0.5, 1.0, 2.0, 3.0]))
    def advance(self, dt: float) -> None:
        self.clock.advance(dt)

    # --- invariants ------------------------------------------------------------------

    async def _read_store(self) -> tuple[dict[int, Task | None], Any]:
        async def get(task_id: int) -> Task | None:
            try:
                return await self.store.get(task_id)
            except TaskNotFoundError:
                return None

        tasks = await asyncio.gather(*(get(i) for i in self.ids))
        return dict(zip(self.ids, tasks, strict=True)), await self.store.stats(Q)

    @invariant()
    def agrees_with_model(self) -> None:
        """The store holds what the model says, and no task is under two live leases."""
        current, stats = self.run(self._read_store())
        for task_id, got in current.items():
            m = self.model.get(task_id)
            if m is None:
                assert got is None, f"task {task_id} should have been purged"
                continue
            assert got is not None, f"task {task_id} is missing"
            actual = (got.status, got.attempts, got.version, got.run_at, got.lease_token, got.lease_expires_at)
            wanted = (m.status, m.attempts, m.version, m.run_at, m.token, m.expires)
            assert actual == wanted, f"task {task_id}: store {actual} != model {wanted}"
            assert (got.priority, got.partition_key, got.idempotency_key, got.max_attempts) == (
                m.priority,
                m.key,
                m.idem,
                m.max_attempts,
            )
            assert got.updated_at == m.updated_at
            if m.last_error is not None and m.status is not DONE:
                assert got.last_error is not None
            assert (got.lease_owner is None) == (m.status is not RUNNING)
        wanted_counts = Counter(m.status for m in self.model.values())
        assert {s: stats.counts[s] for s in TaskStatus} == {s: wanted_counts[s] for s in TaskStatus}

        assert len(set(self.tokens_issued)) == len(self.tokens_issued), "a lease token was issued twice"
        # Judged by the store itself: a lease is live when the stored task still carries
        # its token and version and has not expired. At most one per task, and exactly
        # the ones the model expects.
        live: Counter[int] = Counter()
        for lease in self.issued:
            stored = current.get(lease.id)
            if (
                stored is not None
                and stored.status is RUNNING
                and stored.lease_token == lease.lease_token
                and stored.version == lease.version
                and stored.lease_expires_at is not None
                and stored.lease_expires_at > self.now
            ):
                live[lease.id] += 1
        assert all(n == 1 for n in live.values()), f"tasks held under two live leases: {live}"
        assert live == Counter(t.id for t in self.issued if self._lease_error(t) is None)


SETTINGS = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    report_multiple_bugs=False,  # shrink one failure, not every distinct one
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


class SQLiteQueueMachine(QueueMachine):
    backend = "sqlite"


class MemoryQueueMachine(QueueMachine):
    backend = "memory"


TestSQLiteQueueAgainstModel = SQLiteQueueMachine.TestCase
TestSQLiteQueueAgainstModel.settings = SETTINGS
TestMemoryQueueAgainstModel = MemoryQueueMachine.TestCase
TestMemoryQueueAgainstModel.settings = settings(SETTINGS, max_examples=150)
