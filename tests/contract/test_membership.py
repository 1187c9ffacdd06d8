"""Node membership: the store primitives on every backend, the Membership heartbeat task,
and real OS processes on one SQLite file (one killed with SIGKILL, one restarted).

The store contract tests use the fake clock (``clock`` fixture), so expiry is exact.
The Membership tests run its real heartbeat task with short intervals on the memory
store; the fake clock still decides who is live.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from support import FAKE_EPOCH, TESTS, FakeClock

from asynccoord import (
    CoordError,
    InvalidArgumentError,
    InvalidTypeError,
    Member,
    MemberBeat,
    Membership,
    MembershipView,
    MemoryStore,
    Node,
    NodeConfig,
    PayloadTooLargeError,
    SQLiteStore,
    StoreBusyError,
    StoreClosedError,
    StoreConfig,
)
from asynccoord import events as ev
from asynccoord.contract.membership import DEAD_MEMBER_RETENTION_S, MembershipStore
from asynccoord.membership import FLAP_TTLS
from asynccoord.partition import assign, owned_partitions


def beat(node_id: str, incarnation: str = "inc-1", **info: Any) -> MemberBeat:
    return MemberBeat(node_id=node_id, incarnation=incarnation, info=info)


def ids(members: list[Member] | tuple[Member, ...]) -> list[str]:
    return [m.node_id for m in members]


# --- the store primitives, on every backend ---------------------------------------------


async def test_stores_implement_the_membership_protocol(store) -> None:
    assert isinstance(store, MembershipStore)


async def test_heartbeat_records_all_beats_and_returns_live_members_sorted(store, clock: FakeClock) -> None:
    members = await store.heartbeat(
        [beat("b", host="h1", pid=7), beat("a", "inc-a"), beat("c", nested={"x": [1, 2.5, None]})], ttl_s=5.0
    )
    assert ids(members) == ["a", "b", "c"]
    b = members[1]
    assert b == Member(
        node_id="b",
        incarnation="inc-1",
        started_at=FAKE_EPOCH,
        heartbeat_at=FAKE_EPOCH,
        expires_at=FAKE_EPOCH + 5.0,
        heartbeat_age_s=0.0,
        info={"host": "h1", "pid": 7},
    )
    assert members[2].info == {"nested": {"x": [1, 2.5, None]}}
    assert members[0].info == {}

    clock.advance(2.0)
    listed = await store.members()
    assert listed == [
        Member(
            node_id=m.node_id,
            incarnation=m.incarnation,
            started_at=m.started_at,
            heartbeat_at=m.heartbeat_at,
            expires_at=m.expires_at,
            heartbeat_age_s=2.0,
            info=m.info,
        )
        for m in members
    ]


async def test_member_expires_by_the_store_clock(store, clock: FakeClock) -> None:
    await store.heartbeat([beat("a")], ttl_s=1.0)
    await store.heartbeat([beat("b")], ttl_s=3.0)
    clock.advance(0.999)
    assert ids(await store.members()) == ["a", "b"]
    clock.advance(0.001)  # exactly at expires_at: dead
    assert ids(await store.members()) == ["b"]
    # Another node's heartbeat lists only the live ones, and does not revive "a".
    assert ids(await store.heartbeat([beat("b")], ttl_s=3.0)) == ["b"]
    # "a" beats again: live again, same incarnation, so started_at is kept.
    clock.advance(5.0)
    members = await store.heartbeat([beat("a")], ttl_s=1.0)
    assert ids(members) == ["a"]
    assert members[0].started_at == FAKE_EPOCH
    assert members[0].heartbeat_at == FAKE_EPOCH + 6.0


async def test_started_at_kept_for_same_incarnation_reset_for_new(store, clock: FakeClock) -> None:
    await store.heartbeat([beat("n", "life-1", v=1)], ttl_s=5.0)
    clock.advance(1.0)
    (same,) = await store.heartbeat([beat("n", "life-1", v=2)], ttl_s=5.0)
    assert (same.started_at, same.heartbeat_at, same.info) == (FAKE_EPOCH, FAKE_EPOCH + 1.0, {"v": 2})
    clock.advance(1.0)
    (restarted,) = await store.heartbeat([beat("n", "life-2")], ttl_s=2.0)
    assert restarted.incarnation == "life-2"
    assert restarted.started_at == restarted.heartbeat_at == FAKE_EPOCH + 2.0
    assert restarted.expires_at == FAKE_EPOCH + 4.0  # the new ttl_s replaces the old expiry


async def test_leave_is_compare_and_set_on_the_incarnation(store, clock: FakeClock) -> None:
    await store.heartbeat([beat("n", "old"), beat("m", "m-1")], ttl_s=5.0)
    await store.heartbeat([beat("n", "new")], ttl_s=5.0)  # a restart reusing the node id
    assert await store.leave("n", "old") is False  # the old life cannot remove the new one
    assert [(m.node_id, m.incarnation) for m in await store.members()] == [("m", "m-1"), ("n", "new")]
    assert await store.leave("n", "new") is True
    assert await store.leave("n", "new") is False  # already gone
    assert await store.leave("nobody", "x") is False
    assert ids(await store.members()) == ["m"]
    clock.advance(5.0)
    assert await store.leave("m", "m-1") is False  # had expired: reported dead, row removed
    await store.heartbeat([beat("m", "m-1")], ttl_s=5.0)
    (m,) = await store.members()
    assert m.started_at == FAKE_EPOCH + 5.0  # the row was deleted, so this is a fresh start


async def test_rows_dead_past_the_retention_are_purged(store, clock: FakeClock) -> None:
    await store.heartbeat([beat("a", "life")], ttl_s=1.0)
    clock.advance(1.0 + DEAD_MEMBER_RETENTION_S)
    await store.heartbeat([beat("b")], ttl_s=1.0)  # anyone's heartbeat purges
    (a,) = [m for m in await store.heartbeat([beat("a", "life")], ttl_s=1.0) if m.node_id == "a"]
    assert a.started_at == clock.now  # same incarnation, but its row was purged: a fresh start


async def test_empty_heartbeat_only_lists(store, clock: FakeClock) -> None:
    assert await store.heartbeat([], ttl_s=1.0) == []
    await store.heartbeat([beat("a")], ttl_s=1.0)
    assert ids(await store.heartbeat((), ttl_s=1.0)) == ["a"]


@pytest.mark.parametrize(
    ("beats", "ttl_s", "error", "match"),
    [
        ("a", 1.0, InvalidTypeError, "beats must be a list or tuple of MemberBeat, got str"),
        ({"a": 1}, 1.0, InvalidTypeError, "beats must be a list or tuple"),
        ([("a", "i")], 1.0, InvalidTypeError, r"beats\[0\] must be a MemberBeat, got tuple"),
        ([beat("a"), beat("a", "other")], 1.0, InvalidArgumentError, r"beats\[1\].node_id 'a' appears twice"),
        ([beat("a")], 0, InvalidArgumentError, "ttl_s must be > 0, got 0"),
        ([beat("a")], 0.001, InvalidArgumentError, r"ttl_s must be >= 0\.01 seconds \(MIN_LEASE_S.*got 0\.001"),
        ([beat("a")], -1.0, InvalidArgumentError, "ttl_s must be > 0"),
        ([beat("a")], math.nan, InvalidArgumentError, "ttl_s must be finite"),
        ([beat("a")], True, InvalidTypeError, "ttl_s must be a number, got bool"),
        ([beat("a")], "1", InvalidTypeError, "ttl_s must be a number, got str"),
        ([beat("a"), beat("b", s={1})], 1.0, InvalidTypeError, r"beats\[1\].info is not JSON-serializable"),
        ([beat("a", t=(1, 2))], 1.0, InvalidArgumentError, r"beats\[0\].info would not round-trip"),
        ([beat("a", x=math.inf)], 1.0, InvalidArgumentError, r"beats\[0\].info is not valid JSON"),
    ],
)
async def test_heartbeat_rejects_bad_input_and_writes_nothing(store, beats, ttl_s, error, match) -> None:
    with pytest.raises(error, match=match):
        await store.heartbeat(beats, ttl_s=ttl_s)
    assert await store.members() == []


async def test_heartbeat_info_size_limit(make_store) -> None:
    store = await make_store(config=StoreConfig(max_payload_bytes=64))
    with pytest.raises(PayloadTooLargeError, match=r"beats\[0\].info encodes to \d+ bytes, over the limit of 64"):
        await store.heartbeat([beat("a", blob="x" * 100)], ttl_s=1.0)
    assert await store.members() == []


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"node_id": "", "incarnation": "i"}, InvalidArgumentError, "node_id must not be empty"),
        ({"node_id": 3, "incarnation": "i"}, InvalidTypeError, "node_id must be a str, got int 3"),
        ({"node_id": "a" * 256, "incarnation": "i"}, InvalidArgumentError, "node_id must be at most 255"),
        ({"node_id": "a\x00", "incarnation": "i"}, InvalidArgumentError, "node_id must not contain NUL"),
        ({"node_id": " ", "incarnation": "i"}, InvalidArgumentError, "node_id must not be only whitespace"),
        ({"node_id": "a", "incarnation": ""}, InvalidArgumentError, "incarnation must not be empty"),
        ({"node_id": "a", "incarnation": None}, InvalidTypeError, "incarnation must be a str, got NoneType"),
        ({"node_id": "a", "incarnation": "i", "info": [1]}, InvalidTypeError, "info must be a dict"),
    ],
)
def test_member_beat_validates_fields(kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        MemberBeat(**kwargs)


async def test_leave_rejects_bad_input(store) -> None:
    with pytest.raises(InvalidTypeError, match="node_id must be a str, got NoneType"):
        await store.leave(None, "i")
    with pytest.raises(InvalidArgumentError, match="incarnation must not be empty"):
        await store.leave("a", "")


async def test_closed_store_refuses_membership_calls(make_store) -> None:
    store = await make_store()
    await store.close()
    for call in (store.heartbeat([beat("a")], ttl_s=1.0), store.leave("a", "i"), store.members()):
        with pytest.raises(StoreClosedError):
            await call


async def test_two_sqlite_stores_on_one_file_share_members(db_path: Path, clock: FakeClock) -> None:
    async with SQLiteStore(db_path, clock=clock) as one, SQLiteStore(db_path, clock=clock) as two:
        await one.heartbeat([beat("a", "ia")], ttl_s=5.0)
        members = await two.heartbeat([beat("b", "ib")], ttl_s=5.0)
        assert [(m.node_id, m.incarnation) for m in members] == [("a", "ia"), ("b", "ib")]
        assert await one.leave("b", "ib") is True
        assert ids(await two.members()) == ["a"]
    async with SQLiteStore(db_path, clock=clock) as reopened:  # members are durable
        assert ids(await reopened.members()) == ["a"]


# --- Membership, on the memory store ----------------------------------------------------


class FlakyStore(MemoryStore):
    """A memory store whose heartbeats fail while ``failing`` is set, and whose leave can be slow."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.failing = False
        self.leave_delay_s = 0.0
        self.left: list[tuple[str, str]] = []
        self.beats = 0

    async def heartbeat(self, beats, *, ttl_s):
        self.beats += 1
        if self.failing:
            raise StoreBusyError("injected: the database stayed locked")
        return await super().heartbeat(beats, ttl_s=ttl_s)

    async def leave(self, node_id, incarnation):
        await asyncio.sleep(self.leave_delay_s)
        self.left.append((node_id, incarnation))
        return await super().leave(node_id, incarnation)


@pytest.fixture
async def flaky(clock: FakeClock):
    async with FlakyStore(clock=clock) as store:
        yield store


async def wait_for_view(membership: Membership, predicate, timeout_s: float = 2.0) -> MembershipView:
    deadline = time.monotonic() + timeout_s
    view = membership.view
    while not predicate(view):
        left = deadline - time.monotonic()
        assert left > 0, f"view never matched: {view!r}"
        view = await membership.wait_changed(view.version, timeout_s=left)
    return view


def membership_tasks() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("asynccoord-membership") and not t.done()]


async def test_first_heartbeat_runs_in_aenter(flaky: FlakyStore) -> None:
    membership = Membership(flaky, ttl_s=3.0)
    assert membership.interval_s == 1.0
    assert membership.view.version == 0
    assert membership.healthy is False
    a = membership.join("a", info={"role": "bot"})
    b = membership.join("b")
    assert a != b
    assert len(a) == 32
    async with membership:
        view = membership.view
        assert view.version == 1
        assert view.node_ids == ("a", "b")
        assert "a" in view
        assert "z" not in view
        assert [m.incarnation for m in view.members] == [a, b]
        assert view.members[0].info == {"role": "bot"}
        assert membership.healthy is True
        assert membership.local_nodes == {"a": a, "b": b}
        assert flaky.beats == 1  # one call for both nodes
    assert await flaky.members() == []  # everyone left on exit
    assert sorted(flaky.left) == [("a", a), ("b", b)]
    assert membership.healthy is False
    assert flaky.events.get(ev.MEMBERSHIP_CHANGE) == 0  # the first view is not a change
    assert membership_tasks() == []


async def test_view_follows_joins_expiry_and_leaves(flaky: FlakyStore, clock: FakeClock) -> None:
    async with Membership(flaky, ttl_s=1.0, interval_s=0.02) as membership:
        assert membership.view.node_ids == ()
        assert membership.view.version == 1
        membership.join("local")
        view = await wait_for_view(membership, lambda v: v.node_ids == ("local",))
        assert view.version == 2

        await flaky.heartbeat([beat("remote", "r1")], ttl_s=1.0)  # another process's node
        view = await wait_for_view(membership, lambda v: "remote" in v)
        assert view.node_ids == ("local", "remote")
        assert view.version == 3

        clock.advance(1.0)  # remote never beats again: dead by the store clock
        view = await wait_for_view(membership, lambda v: "remote" not in v)
        assert view.node_ids == ("local",)  # our own beats keep us live
        assert view.version == 4

        # A beat that changes nothing keeps the version.
        beats = flaky.beats
        while flaky.beats < beats + 3:
            await asyncio.sleep(0.01)
        assert membership.view.version == 4
        assert membership.view.taken_at > view.taken_at

        waiter = asyncio.create_task(membership.wait_changed(4, timeout_s=2.0))
        await asyncio.sleep(0)
        assert await membership.leave("local") is True
        assert (await waiter).version == 5  # leave updates the view at once
        assert membership.view.node_ids == ()
        assert await membership.leave("local") is False
        assert membership.local_nodes == {}
        assert flaky.events.get(ev.MEMBERSHIP_CHANGE) == 4


async def beat_after(flaky: FlakyStore, clock: FakeClock, seconds: float) -> None:
    """Move the store clock on, then let the membership read the members twice."""
    clock.advance(seconds)
    beats = flaky.beats
    while flaky.beats < beats + 2:
        await asyncio.sleep(0.005)


async def test_a_node_that_expires_is_counted_lost_and_one_that_leaves_is_not(
    flaky: FlakyStore, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="asynccoord.membership")
    async with Membership(flaky, ttl_s=1.0, interval_s=0.02) as membership:
        membership.join("a-local")  # the smallest id: this process counts the cluster's changes
        await flaky.heartbeat([beat("b-crashed", "b1"), beat("c-leaver", "c1")], ttl_s=1.0)
        await wait_for_view(membership, lambda v: v.node_ids == ("a-local", "b-crashed", "c-leaver"))
        await beat_after(flaky, clock, 0.3)
        assert await flaky.leave("c-leaver", "c1") is True  # its process shut down: deleted, not expired
        await wait_for_view(membership, lambda v: "c-leaver" not in v)
        assert flaky.events.get(ev.NODE_LOST) == 0
        for _ in range(4):  # b-crashed never beats again: expired by the store clock, read 0.2 s apart
            await beat_after(flaky, clock, 0.2)
        await wait_for_view(membership, lambda v: "b-crashed" not in v)
        assert flaky.events.get(ev.NODE_LOST) == 1
        assert await membership.leave("a-local") is True
    assert flaky.events.get(ev.NODE_LOST) == 1
    [warned] = [r.getMessage() for r in caplog.records if "node_lost" in r.getMessage()]
    assert warned.startswith("asynccoord.membership.node_lost node=b-crashed last_heartbeat_age_s=1.1 ttl_s=1:")


async def test_a_process_whose_nodes_leave_soon_after_joining_counts_one_flap(
    flaky: FlakyStore, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """``membership_flap``: a life shorter than FLAP_TTLS TTLs (6 s here), ended by a leave, an expiry
    or a new incarnation of its node id, counted once per process (its nodes' ``runtime``)."""
    assert FLAP_TTLS == 6
    caplog.set_level(logging.INFO, logger="asynccoord.membership")
    short = [beat("b1", "b1", runtime="rt-b"), beat("b2", "b2", runtime="rt-b")]
    async with Membership(flaky, ttl_s=1.0, interval_s=0.02) as membership:
        membership.join("a-local")  # the smallest id: this process counts the cluster's changes
        await flaky.heartbeat([*short, beat("c", "c1")], ttl_s=1.0)
        await wait_for_view(membership, lambda v: v.node_ids == ("a-local", "b1", "b2", "c"))
        for _ in range(10):  # 5 s on the store clock, b's process and c beating
            await beat_after(flaky, clock, 0.5)
            await flaky.heartbeat([*short, beat("c", "c1")], ttl_s=1.0)
        for node_id in ("b1", "b2"):  # its process shuts down: two leaves, seen in two changes
            assert await flaky.leave(node_id, node_id) is True
            await wait_for_view(membership, lambda v, node_id=node_id: node_id not in v)
            assert flaky.events.get(ev.MEMBERSHIP_FLAP) == 1  # one process life
        for _ in range(2):  # c has lived 6 s: no flap
            await beat_after(flaky, clock, 0.5)
            await flaky.heartbeat([beat("c", "c1")], ttl_s=1.0)
        assert await flaky.leave("c", "c1") is True
        await wait_for_view(membership, lambda v: "c" not in v)
        assert flaky.events.get(ev.MEMBERSHIP_FLAP) == 1

        await flaky.heartbeat([beat("d", "d1")], ttl_s=1.0)  # d crashes after one beat: lost, and a flap
        await wait_for_view(membership, lambda v: "d" in v)
        for _ in range(3):  # reads 0.4 s apart: its expiry seen
            await beat_after(flaky, clock, 0.4)
        await wait_for_view(membership, lambda v: "d" not in v)
        assert (flaky.events.get(ev.NODE_LOST), flaky.events.get(ev.MEMBERSHIP_FLAP)) == (1, 2)

        await flaky.heartbeat([beat("e", "e1")], ttl_s=1.0)  # e restarts under its node id between two reads
        await wait_for_view(membership, lambda v: "e" in v)
        await beat_after(flaky, clock, 0.5)
        await flaky.heartbeat([beat("e", "e2")], ttl_s=1.0)
        await beat_after(flaky, clock, 0.0)
        assert [m.incarnation for m in membership.view.members] == [membership.local_nodes["a-local"], "e2"]
        assert flaky.events.get(ev.MEMBERSHIP_FLAP) == 3
        for _ in range(12):  # e2 lives 6 s, then restarts: no flap
            await beat_after(flaky, clock, 0.5)
            await flaky.heartbeat([beat("e", "e2")], ttl_s=1.0)
        await flaky.heartbeat([beat("e", "e3")], ttl_s=1.0)
        await beat_after(flaky, clock, 0.0)
        assert membership.view.members[1].incarnation == "e3"
        assert flaky.events.get(ev.MEMBERSHIP_FLAP) == 3
    flapped = [r.getMessage() for r in caplog.records if "membership.flap" in r.getMessage()]
    assert [line.split(":")[0] for line in flapped] == [
        "asynccoord.membership.flap node=b1 runtime=rt-b lived_s=5.0",
        "asynccoord.membership.flap node=d runtime=None lived_s=1.2",
        "asynccoord.membership.flap node=e runtime=None lived_s=0.5",
    ]


def member(node_id: str, heartbeat_at: float, read_at: float, ttl_s: float = 1.0) -> Member:
    return Member(
        node_id=node_id,
        incarnation="i",
        started_at=0.0,
        heartbeat_at=heartbeat_at,
        expires_at=heartbeat_at + ttl_s,
        heartbeat_age_s=read_at - heartbeat_at,
        info={},
    )


def view(*members: Member) -> MembershipView:
    return MembershipView(members=members, node_ids=tuple(m.node_id for m in members), version=1, taken_at=0.0)


@pytest.mark.parametrize(
    ("old_read", "b_beat", "new_read", "lost"),
    [
        (10.0, 10.0, 10.3, []),  # gone before its expiry: it left (its row was deleted)
        (10.8, 10.0, 11.1, [("b", 1.1)]),  # gone past its expiry, the reads 0.3 s apart: lost
        (10.0, 10.0, 11.2, []),  # reads 1.2 s apart (a stall, a clock step): it may have beaten and left
        (10.6, 10.0, 11.1, []),  # half the TTL apart: the same
    ],
)
async def test_a_node_is_lost_only_past_its_expiry_between_reads_less_than_half_the_ttl_apart(
    flaky: FlakyStore, old_read: float, b_beat: float, new_read: float, lost: list[tuple[str, float]]
) -> None:
    membership = Membership(flaky, ttl_s=1.0)
    old = view(member("a", old_read, old_read), member("b", b_beat, old_read))
    new = view(member("a", new_read, new_read))
    assert [(n, round(age, 3)) for n, age in membership._lost(old, new, None)] == lost


async def test_wait_changed_returns_current_view_on_timeout(flaky: FlakyStore) -> None:
    async with Membership(flaky, ttl_s=1.0, interval_s=0.05) as membership:
        membership.join("a")
        view = await wait_for_view(membership, lambda v: "a" in v)
        started = time.monotonic()
        same = await membership.wait_changed(view.version, timeout_s=0.1)
        assert 0.09 <= time.monotonic() - started < 1.0
        assert same.version == view.version
        assert (await membership.wait_changed(0)).version == view.version  # already newer: at once
        with pytest.raises(InvalidArgumentError, match="since_version must be >= 0"):
            await membership.wait_changed(-1)
        with pytest.raises(InvalidArgumentError, match="timeout_s must be >= 0"):
            await membership.wait_changed(0, timeout_s=-1)
    assert (await membership.wait_changed(view.version)).version == view.version  # closed: no wait


async def test_owned_partitions_over_live_and_local_nodes(flaky: FlakyStore) -> None:
    partitions = flaky.partitions
    async with Membership(flaky, ttl_s=1.0, interval_s=0.05) as membership:
        for name in ("n1", "n2", "n3"):
            membership.join(name)
        await flaky.heartbeat([beat("remote")], ttl_s=1.0)
        await wait_for_view(membership, lambda v: len(v.node_ids) == 4)
        live = ["n1", "n2", "n3", "remote"]
        expected = assign(partitions, live)
        owned = {n: membership.owned_partitions(n) for n in ("n1", "n2", "n3")}
        assert owned == {n: expected[n] for n in owned}
        union = frozenset().union(*owned.values(), expected["remote"])
        assert union == frozenset(range(partitions))
        assert sum(len(p) for p in owned.values()) + len(expected["remote"]) == partitions
        # A node not live anywhere counts itself as live.
        assert membership.owned_partitions("newcomer") == owned_partitions("newcomer", partitions, live)
        # A node joined here counts as live before its first heartbeat lands.
        membership.join("n4")
        assert membership.owned_partitions("n1") == assign(partitions, [*live, "n4"])["n1"]
        # Asked again and again (the live nodes are kept between changes), then after a leave: at once.
        assert membership.owned_partitions("n1") == assign(partitions, [*live, "n4"])["n1"]
        await membership.leave("n4")
        assert membership.owned_partitions("n1") == expected["n1"]
        with pytest.raises(InvalidTypeError, match="node_id must be a str"):
            membership.owned_partitions(1)


async def test_a_membership_of_one_queue_sees_only_that_queues_members_and_its_own(flaky: FlakyStore) -> None:
    async with Membership(flaky, ttl_s=1.0, interval_s=0.05, queue="outbox") as membership:
        membership.join("mine", info={"queue": "inbox"})  # joined here: counted whatever its info says
        membership.join("n1", info={"queue": "outbox"})
        await flaky.heartbeat(
            [beat("peer", queue="outbox"), beat("other-queue", queue="inbox"), beat("no-queue")], ttl_s=1.0
        )
        view = await wait_for_view(membership, lambda v: "peer" in v.node_ids)
        assert sorted(view.node_ids) == ["mine", "n1", "peer"]
        expected = assign(flaky.partitions, ["mine", "n1", "peer"])
        assert membership.owned_partitions("n1") == expected["n1"]
    with pytest.raises(InvalidTypeError, match="queue must be a str"):
        Membership(flaky, queue=3)  # type: ignore[arg-type]
    other_queue = Membership(flaky, queue="inbox")
    with pytest.raises(InvalidArgumentError, match="'inbox', but this node drains 'outbox'"):
        Node(flaky, lambda task: None, node_id="n", config=NodeConfig(queue="outbox"), membership=other_queue)


async def test_failed_heartbeats_turn_unhealthy_then_recover(
    flaky: FlakyStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="asynccoord.membership")
    async with Membership(flaky, ttl_s=0.3, interval_s=0.05) as membership:
        membership.join("a")
        await wait_for_view(membership, lambda v: "a" in v)
        flaky.failing = True
        failed_at = time.monotonic()
        while membership.healthy:
            await asyncio.sleep(0.01)
        unhealthy_after = time.monotonic() - failed_at
        assert 0.2 <= unhealthy_after <= 0.45, unhealthy_after  # the last good beat + ttl_s
        stats = membership.statistics()
        assert stats.failures >= 3
        assert stats.consecutive_failures >= 3
        assert stats.last_heartbeat_age_s is not None
        assert stats.last_heartbeat_age_s >= 0.3
        while not any(r.getMessage().startswith("asynccoord.membership.unhealthy") for r in caplog.records):
            await asyncio.sleep(0.01)
        flaky.failing = False
        while not membership.healthy:
            await asyncio.sleep(0.01)
        assert membership.statistics().consecutive_failures == 0
    failures = [r for r in caplog.records if r.getMessage().startswith("asynccoord.membership.heartbeat_failed")]
    assert failures
    assert all(r.levelno == logging.WARNING for r in failures)
    assert all(getattr(r, "event", None) == "asynccoord.membership.heartbeat_failed" for r in failures)
    assert "StoreBusyError" in failures[0].getMessage()
    assert any(r.getMessage() == "asynccoord.membership.recovered" for r in caplog.records)


async def test_failed_first_heartbeat_fails_aenter(flaky: FlakyStore) -> None:
    flaky.failing = True
    membership = Membership(flaky, ttl_s=1.0)
    membership.join("a")
    with pytest.raises(StoreBusyError, match="injected"):
        async with membership:
            pytest.fail("entered")
    assert membership_tasks() == []
    assert membership.healthy is False
    with pytest.raises(CoordError, match="is closed"):
        membership.join("b")


async def test_closed_store_fails_aenter(clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    """Its nodes never joined: no leave is tried, so none fails on the closed store and is logged."""
    store = MemoryStore(clock=clock)
    membership = Membership(store)
    membership.join("a")
    with pytest.raises(StoreClosedError):
        async with membership:
            pytest.fail("entered")
    assert [r.getMessage() for r in caplog.records if "membership" in r.getMessage()] == []


async def test_a_failed_first_heartbeat_that_may_have_written_still_leaves(flaky: FlakyStore) -> None:
    flaky.failing = True  # a StoreBusyError, as a lost connection would be: the nodes are told to leave
    membership = Membership(flaky, ttl_s=1.0)
    membership.join("a")
    with pytest.raises(StoreBusyError):
        await membership.start()
    assert [node for node, _ in flaky.left] == ["a"]


async def test_two_processes_sharing_a_node_id_are_reported(
    flaky: FlakyStore, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    async with (
        Membership(flaky, ttl_s=1.0, interval_s=0.02) as one,
        Membership(flaky, ttl_s=1.0, interval_s=0.02) as two,
    ):
        one.join("same")
        two.join("same")
        while not any("node_id_conflict" in r.getMessage() for r in caplog.records):
            clock.advance(0.01)  # each takeover restamps started_at
            await asyncio.sleep(0.01)
    (record, *_) = [r for r in caplog.records if "node_id_conflict" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "node=same" in record.getMessage()


async def test_membership_rejects_bad_arguments(flaky: FlakyStore) -> None:
    with pytest.raises(InvalidTypeError, match=r"membership primitives \(heartbeat, leave, members\), got dict"):
        Membership({})  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="ttl_s must be > 0, got 0"):
        Membership(flaky, ttl_s=0)
    with pytest.raises(InvalidArgumentError, match=r"ttl_s must be >= 0\.01 seconds \(MIN_LEASE_S.*got 0\.005"):
        Membership(flaky, ttl_s=0.005)
    with pytest.raises(InvalidArgumentError, match=r"ttl_s must be <= 31536000 seconds \(one year.*got 1e\+308"):
        Membership(flaky, ttl_s=1e308)
    with pytest.raises(InvalidArgumentError, match=r"interval_s must be < ttl_s \(1.0\).*got 1.0"):
        Membership(flaky, ttl_s=1.0, interval_s=1.0)
    with pytest.raises(InvalidTypeError, match="interval_s must be a number"):
        Membership(flaky, interval_s="1")  # type: ignore[arg-type]
    membership = Membership(flaky, ttl_s=1.0)
    membership.join("a")
    with pytest.raises(InvalidArgumentError, match="node_id 'a' has already joined"):
        membership.join("a")
    with pytest.raises(InvalidArgumentError, match="node_id must not be empty"):
        membership.join("")
    with pytest.raises(InvalidArgumentError, match="node_id must not be only whitespace"):
        membership.join(" \t")
    with pytest.raises(InvalidTypeError, match="info must be a mapping"):
        membership.join("b", info=["x"])  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match="info is not JSON-serializable"):
        membership.join("b", info={"x": {1, 2}})
    with pytest.raises(PayloadTooLargeError, match="info encodes to"):
        membership.join("b", info={"x": "y" * (flaky.config.max_payload_bytes + 1)})
    assert membership.local_nodes.keys() == {"a"}  # nothing half-joined
    async with membership:
        with pytest.raises(CoordError, match="can be started once"):
            await membership.start()
    await membership.close()  # idempotent
    await Membership(flaky).close()  # never started: nothing to do


# --- cancellation -----------------------------------------------------------------------


async def test_cancelling_the_task_inside_membership_leaves_and_propagates(flaky: FlakyStore) -> None:
    entered = asyncio.Event()

    async def node() -> None:
        async with Membership(flaky, ttl_s=1.0, interval_s=0.02) as membership:
            membership.join("a")
            membership.join("b")
            entered.set()
            await asyncio.sleep(60)

    task = asyncio.create_task(node())
    await entered.wait()
    await asyncio.sleep(0.05)  # a few heartbeats
    assert ids(await flaky.members()) == ["a", "b"]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await flaky.members() == []
    assert membership_tasks() == []


async def test_cancellation_during_exit_does_not_interrupt_the_leave(flaky: FlakyStore) -> None:
    flaky.leave_delay_s = 0.2
    exiting = asyncio.Event()

    async def node() -> None:
        async with Membership(flaky, ttl_s=1.0, interval_s=0.05) as membership:
            membership.join("a")
            exiting.set()

    task = asyncio.create_task(node())
    await exiting.wait()
    await asyncio.sleep(0.05)  # now inside the (slow) leave
    started = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - started >= 0.1  # the shield held until the leave was done
    assert [node for node, _ in flaky.left] == ["a"]
    assert await flaky.members() == []
    assert membership_tasks() == []


async def test_anyio_cancel_scope_does_not_interrupt_the_leave(flaky: FlakyStore) -> None:
    flaky.leave_delay_s = 0.2
    with anyio.move_on_after(0.1) as scope:
        async with Membership(flaky, ttl_s=1.0, interval_s=0.05) as membership:
            membership.join("a")
            await anyio.sleep(60)
    assert scope.cancelled_caught
    assert [node for node, _ in flaky.left] == ["a"]
    assert await flaky.members() == []
    assert membership_tasks() == []


async def test_exit_leave_is_bounded(flaky: FlakyStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("asynccoord.membership.LEAVE_TIMEOUT_S", 0.1)
    flaky.leave_delay_s = 30.0
    started = time.monotonic()
    async with Membership(flaky, ttl_s=1.0) as membership:
        membership.join("a")
    assert time.monotonic() - started < 1.0
    assert membership_tasks() == []


async def test_cancelled_leave_still_stops_the_heartbeats(flaky: FlakyStore, clock: FakeClock) -> None:
    flaky.leave_delay_s = 10.0
    async with Membership(flaky, ttl_s=1.0, interval_s=0.02) as membership:
        membership.join("a")
        await wait_for_view(membership, lambda v: "a" in v)
        leaving = asyncio.create_task(membership.leave("a"))
        await asyncio.sleep(0.05)
        leaving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await leaving
        assert membership.local_nodes == {}
        beats = flaky.beats
        while flaky.beats < beats + 3:  # heartbeats go on, without "a"
            await asyncio.sleep(0.01)
        assert ids(await flaky.members()) == ["a"]  # its row is still live in the store...
        clock.advance(1.0)  # ...until its TTL passes by the store clock
        assert await flaky.members() == []
        await wait_for_view(membership, lambda v: "a" not in v)


# --- SQLite, real clock and real processes --------------------------------------------


async def test_memberships_of_two_stores_on_one_file_see_each_other(db_path: Path) -> None:
    async with (
        SQLiteStore(db_path) as store_a,
        SQLiteStore(db_path) as store_b,
        Membership(store_a, ttl_s=1.0, interval_s=0.05) as a,
    ):
        a.join("a")
        await wait_for_view(a, lambda v: v.node_ids == ("a",))  # +a seen before b exists
        async with Membership(store_b, ttl_s=1.0, interval_s=0.05) as b:
            b.join("b")
            await wait_for_view(a, lambda v: v.node_ids == ("a", "b"))
            await wait_for_view(b, lambda v: v.node_ids == ("a", "b"))
            assert a.owned_partitions("a") == b.owned_partitions("a")
            assert a.owned_partitions("a") | b.owned_partitions("b") == frozenset(range(store_a.partitions))
        # b left on exit: a sees it at its next heartbeat, without waiting for the TTL.
        started = time.monotonic()
        await wait_for_view(a, lambda v: v.node_ids == ("a",))
        assert time.monotonic() - started < 0.5
        assert store_a.events.get(ev.MEMBERSHIP_CHANGE) == 3  # +a, +b, -b


async def test_a_change_of_the_live_nodes_is_counted_once_in_the_cluster(db_path: Path) -> None:
    """Three processes (three stores on one file); the third's node joins, leaves, joins again and
    leaves (a restart): every process sees the four changes, and the cluster counts each once
    (by the process holding the smallest live node id), not once per process that saw it, and so
    are the third's two short lives (``membership_flap``). (A
    long TTL: a beat late by half of it, under load, would pass its node over as the reporter.)"""
    async with (
        SQLiteStore(db_path) as store_1,
        SQLiteStore(db_path) as store_2,
        SQLiteStore(db_path) as store_3,
        Membership(store_1, ttl_s=5.0, interval_s=0.05) as m1,
        Membership(store_2, ttl_s=5.0, interval_s=0.05) as m2,
    ):
        m1.join("n1")
        m2.join("n2")
        for m in (m1, m2):
            await wait_for_view(m, lambda v: v.node_ids == ("n1", "n2"))
        # How the first two found each other depends on which beat first (each may have seen
        # itself alone): counted from here on.
        before = [s.events.get(ev.MEMBERSHIP_CHANGE) for s in (store_1, store_2, store_3)]
        for _ in range(2):
            async with Membership(store_3, ttl_s=5.0, interval_s=0.05) as m3:
                m3.join("n3")
                for m in (m1, m2, m3):
                    await wait_for_view(m, lambda v: v.node_ids == ("n1", "n2", "n3"))
            for m in (m1, m2):
                await wait_for_view(m, lambda v: v.node_ids == ("n1", "n2"))
        stores = (store_1, store_2, store_3)
        counts = [s.events.get(ev.MEMBERSHIP_CHANGE) - b for s, b in zip(stores, before, strict=True)]
        flaps = [s.events.get(ev.MEMBERSHIP_FLAP) for s in stores]
    assert counts == [4, 0, 0]  # +n3, -n3, +n3, -n3, by n1's process alone
    assert flaps == [2, 0, 0]  # n3's two short lives, by n1's process alone


async def read_event(proc: subprocess.Popen[str], timeout_s: float = 20.0) -> dict[str, Any]:
    """The next JSON line a worker printed (fails the test on EOF or timeout)."""
    assert proc.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout_s)
    if not line:
        proc.kill()
        _, err = await asyncio.to_thread(proc.communicate)
        pytest.fail(f"worker {proc.pid} exited with {proc.returncode} before reporting\n{err}")
    return json.loads(line)


async def next_view(proc: subprocess.Popen[str], predicate, timeout_s: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        event = await read_event(proc, max(0.01, deadline - time.monotonic()))
        if event["event"] == "view" and predicate(event["members"]):
            return event


@pytest.mark.multiprocess
async def test_processes_see_each_other_and_a_killed_one_drops_out(db_path: Path, python) -> None:
    ttl_s, interval_s = 1.0, 0.2
    args = ("--ttl-s", str(ttl_s), "--interval-s", str(interval_s))
    worker = str(TESTS / "workers" / "member_worker.py")
    survivor = python.spawn([worker, str(db_path), "p1", *args])
    victim = python.spawn([worker, str(db_path), "p2", *args])
    ready = {proc.pid: await read_event(proc) for proc in (survivor, victim)}
    assert all(event["event"] == "ready" for event in ready.values())
    old_incarnation = ready[victim.pid]["incarnation"]

    # Both see both.
    for proc in (survivor, victim):
        await next_view(proc, lambda members: members.keys() == {"p1", "p2"})

    # SIGKILL: no leave. The survivor's view drops p2 once its TTL passes by the store clock.
    killed_at = time.monotonic()
    os.kill(victim.pid, signal.SIGKILL)
    await asyncio.to_thread(victim.wait)
    assert victim.returncode == -signal.SIGKILL
    dropped = await next_view(survivor, lambda members: "p2" not in members)
    assert dropped["lost"] == 1  # p1, the smallest live id, counts the lost node (node_lost)
    lag_s = dropped["t"] - killed_at
    assert lag_s <= ttl_s + interval_s + 0.15, lag_s  # slack: the heartbeat's own round trip
    assert lag_s >= ttl_s - interval_s - 0.05, lag_s  # and not before it could have expired

    # A restart reusing the node id is a new incarnation; the old one's leave cannot remove it.
    restarted = python.spawn([worker, str(db_path), "p2", *args])
    new_incarnation = (await read_event(restarted))["incarnation"]
    assert new_incarnation != old_incarnation
    seen = await next_view(survivor, lambda members: members.get("p2") == new_incarnation)
    assert seen["members"] == {"p1": ready[survivor.pid]["incarnation"], "p2": new_incarnation}
    async with SQLiteStore(db_path) as store:
        assert await store.leave("p2", old_incarnation) is False
        assert {m.node_id: m.incarnation for m in await store.members()}["p2"] == new_incarnation

        # A graceful exit leaves at once: the survivor sees it at its next beat, well before the TTL.
        assert restarted.stdin is not None
        restarted.stdin.write("exit\n")
        restarted.stdin.flush()
        while (await read_event(restarted))["event"] != "left":
            pass
        left_at = time.monotonic()
        gone = await next_view(survivor, lambda members: "p2" not in members)
        assert gone["t"] - left_at <= interval_s + 0.15
        assert gone["lost"] == 1  # a graceful leave is no lost node
        assert ids(await store.members()) == ["p1"]
    await asyncio.to_thread(restarted.wait)
    assert restarted.returncode == 0


@contextlib.asynccontextmanager
async def beside_a_raw_member(db_path: Path, node_id: str, *, ttl_s: float) -> AsyncIterator[tuple[Any, Membership]]:
    """A running membership of "good-node" on a SQLite file, beside a member row whose id is
    ``node_id``, written by raw SQL as no client of this version could write it."""
    async with SQLiteStore(db_path) as store:
        membership = Membership(store, ttl_s=ttl_s, interval_s=0.1)
        membership.join("good-node")
        async with membership:
            await store.heartbeat([MemberBeat(node_id="placeholder", incarnation="i1", info={})], ttl_s=60.0)
            with sqlite3.connect(db_path) as raw:
                raw.execute("UPDATE coord_members SET node_id = ? WHERE node_id = 'placeholder'", (node_id,))
            yield store, membership


async def test_a_malformed_member_row_does_not_stop_the_heartbeats(db_path: Path) -> None:
    """A member row no client of ours could write (a 300-character node id, by raw SQL): the
    assignment made when the view changes refuses it, as owned_partitions() does, but the
    heartbeat task goes on, so this process's own nodes stay live past their TTL."""
    async with beside_a_raw_member(db_path, "x" * 300, ttl_s=1.0) as (store, membership):
        beats = membership.statistics().heartbeats
        await asyncio.sleep(1.5)  # past the TTL: only heartbeats keep good-node live
        assert membership.statistics().heartbeats >= beats + 5
        assert membership.healthy
        assert "good-node" in {m.node_id for m in await store.members()}
        with pytest.raises(InvalidArgumentError, match="node must be at most 255 characters"):
            membership.owned_partitions("good-node")


async def test_a_blank_member_id_from_an_older_version_does_not_break_the_assignment(db_path: Path) -> None:
    """Code from before the blank-name rule took a node id of only whitespace; one such member
    still heartbeating (an older process in a rolling upgrade) is a member like any other here:
    the assignment takes the id as the store holds it, and this process's nodes keep their
    partitions."""
    async with beside_a_raw_member(db_path, " ", ttl_s=5.0) as (store, membership):
        view = membership.view
        while set(view.node_ids) != {" ", "good-node"}:
            view = await membership.wait_changed(view.version, timeout_s=2.0)
        mine = membership.owned_partitions("good-node")
        assert mine == assign(store.partitions, [" ", "good-node"])["good-node"]
        assert 0 < len(mine) < store.partitions  # the blank member owns the rest


async def test_a_listener_sees_every_change_of_the_view_even_one_undone_at_once(
    store, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[tuple[int, tuple[str, ...]]] = []

    def broken(view: Any) -> None:
        raise RuntimeError("listener bug")

    async with Membership(store, ttl_s=0.6, interval_s=0.1) as membership:
        with pytest.raises(InvalidTypeError, match="listener"):
            membership.add_listener("not callable")  # type: ignore[arg-type]
        remove_broken = membership.add_listener(broken)
        remove = membership.add_listener(lambda view: seen.append((view.version, view.node_ids)))
        membership.join("a")
        while membership.view.node_ids != ("a",):
            await membership.wait_changed(membership.view.version, timeout_s=2.0)
        membership.join("b")
        while membership.view.node_ids != ("a", "b"):
            await membership.wait_changed(membership.view.version, timeout_s=2.0)
        await membership.leave("b")  # undone before anyone waits for the view again
        remove()
        remove()  # a second call does nothing
        remove_broken()
        membership.join("c")
        while "c" not in membership.view.node_ids:
            await membership.wait_changed(membership.view.version, timeout_s=2.0)
    assert [ids for _, ids in seen] == [("a",), ("a", "b"), ("a",)]
    assert [v for v, _ in seen] == sorted({v for v, _ in seen})  # each version once, in order
    assert "asynccoord.membership.listener_failed" in caplog.text  # logged, not raised
