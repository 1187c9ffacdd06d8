"""Partitioning is a pure, stable function: same answer in every process and release,
minimal movement when nodes join or leave, and a fair spread."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import TESTS

from asynccoord import InvalidArgumentError, InvalidTypeError, assign, owner_of, partition_of
from asynccoord.partition import MAX_PARTITIONS, RendezvousTable, owned_partitions

GOLDEN_PATH = TESTS / "data" / "partition_golden.json"
GOLDEN = json.loads(GOLDEN_PATH.read_text("utf-8"))
NODES = ["node-a", "node-b", "node-c"]
KEYS = [f"conv-{i}" for i in range(10_000)]
PARTITIONS = 1024

GOLDEN_SCRIPT = """
import json, sys
from asynccoord import owner_of, partition_of
golden = json.loads(open(sys.argv[1], encoding="utf-8").read())
out = []
for row in golden["keys"]:
    p = partition_of(row["key"], golden["partitions"])
    out.append({"key": row["key"], "partition": p, "owner": owner_of(p, golden["nodes"])})
print(json.dumps({"hash_of_key": hash("conv-1"), "keys": out}))
"""


def owners(nodes: list[str]) -> dict[str, str]:
    return {k: owner_of(partition_of(k, PARTITIONS), nodes) for k in KEYS}


def test_golden_file_matches_this_process() -> None:
    assert GOLDEN["partitions"] == PARTITIONS
    assert GOLDEN["nodes"] == NODES
    assert len(GOLDEN["keys"]) == 50
    for row in GOLDEN["keys"]:
        partition = partition_of(row["key"], PARTITIONS)
        assert partition == row["partition"], row
        assert owner_of(partition, NODES) == row["owner"], row


@pytest.mark.multiprocess
def test_golden_file_matches_processes_with_other_hash_seeds(python) -> None:
    seen_hashes = set()
    for seed in ("1", "2", "random"):
        proc = python.run_code(GOLDEN_SCRIPT, str(GOLDEN_PATH), env={"PYTHONHASHSEED": seed})
        report = json.loads(proc.stdout)
        assert report["keys"] == GOLDEN["keys"], f"PYTHONHASHSEED={seed}"
        seen_hashes.add(report["hash_of_key"])
    assert len(seen_hashes) == 3  # the builtin hash() did differ; partitioning did not


def test_adding_a_node_moves_few_keys_all_to_it_and_removing_it_restores() -> None:
    before = owners(NODES)
    after = owners([*NODES, "node-d"])
    moved = [k for k in KEYS if before[k] != after[k]]
    assert len(moved) <= 0.30 * len(KEYS), len(moved)
    assert len(moved) >= 0.15 * len(KEYS)  # and the new node does get its share
    assert {after[k] for k in moved} == {"node-d"}
    assert owners(NODES) == before  # removing it again restores the mapping exactly


def test_removing_a_node_moves_only_its_keys() -> None:
    before = owners(NODES)
    after = owners(["node-a", "node-c"])
    for key in KEYS:
        if before[key] != "node-b":
            assert after[key] == before[key]
        else:
            assert after[key] in ("node-a", "node-c")


def test_three_nodes_share_keys_fairly() -> None:
    shares = Counter(owners(NODES).values())
    assert set(shares) == set(NODES)
    for node, n in shares.items():
        assert 0.267 * len(KEYS) <= n <= 0.40 * len(KEYS), (node, n)


def test_owner_ignores_order_and_duplicates() -> None:
    for partition in range(0, PARTITIONS, 7):
        expected = owner_of(partition, NODES)
        assert owner_of(partition, list(reversed(NODES))) == expected
        assert owner_of(partition, [*NODES, *NODES]) == expected
        assert owner_of(partition, iter(NODES)) == expected


def test_assign_covers_every_partition_once() -> None:
    table = assign(PARTITIONS, ["node-c", "node-a", "node-b", "node-a"])
    assert sorted(table) == NODES
    owned = [p for parts in table.values() for p in parts]
    assert sorted(owned) == list(range(PARTITIONS))
    for node, parts in table.items():
        assert all(owner_of(p, NODES) == node for p in parts)
        assert owned_partitions(node, PARTITIONS, NODES) == parts
    assert owned_partitions("node-z", 8, []) == frozenset(range(8))  # alone, a node owns everything


@given(
    st.integers(min_value=1, max_value=64),
    st.lists(st.sets(st.sampled_from([f"n{i}" for i in range(12)]), min_size=1), min_size=1, max_size=6),
)
def test_a_rendezvous_table_gives_owner_of_through_membership_changes(partitions: int, views: list[set[str]]) -> None:
    """The kept scores (one table, nodes joining, leaving, coming back) never change an owner."""
    table = RendezvousTable(partitions)
    for view in views:
        owned = table.assign(view)
        assert sorted(owned) == sorted(view)
        for p in range(partitions):
            assert p in owned[owner_of(p, view)], (p, view)
        assert sum(len(parts) for parts in owned.values()) == partitions


def test_a_rendezvous_table_refuses_bad_input() -> None:
    with pytest.raises(InvalidArgumentError, match="partitions must be >= 1, got 0"):
        RendezvousTable(0)
    with pytest.raises(InvalidTypeError, match="partitions must be an int"):
        RendezvousTable(1.5)  # type: ignore[arg-type]
    table = RendezvousTable(8)
    with pytest.raises(InvalidArgumentError, match="nodes must name at least one node, got none"):
        table.assign([])
    with pytest.raises(InvalidTypeError, match="got str 'node-a'"):
        table.assign("node-a")
    with pytest.raises(InvalidTypeError, match="node must be a str, got int 7"):
        table.assign(["node-a", 7])  # type: ignore[list-item]
    assert table.assign(["node-a"]) == {"node-a": frozenset(range(8))}


def test_a_str_is_not_a_list_of_nodes() -> None:
    """A str is an iterable of str: each character must not be taken for a node id."""
    named = r"nodes must be an iterable of node ids \(e\.g\. a list of str\), got str 'node-a'"
    with pytest.raises(InvalidTypeError, match=named):
        assign(PARTITIONS, "node-a")  # a Sequence[str] to mypy: only the runtime check catches it
    with pytest.raises(InvalidTypeError, match=named):
        owned_partitions("node-a", PARTITIONS, "node-a")
    with pytest.raises(InvalidTypeError, match=named):
        owner_of(3, "node-a")
    with pytest.raises(InvalidTypeError, match="got int 7"):
        assign(PARTITIONS, 7)  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match="node must be a str, got int 7"):
        owned_partitions(7, PARTITIONS, NODES)  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match="node must be a str, got int 7"):
        owned_partitions("node-a", PARTITIONS, ["node-b", 7])  # type: ignore[list-item]
    with pytest.raises(InvalidArgumentError, match="partitions must be >= 1, got 0"):
        owned_partitions("node-a", 0, NODES)
    assert owned_partitions("node-a", PARTITIONS, tuple(NODES)) == assign(PARTITIONS, NODES)["node-a"]


def test_partition_of_edge_cases() -> None:
    assert partition_of("anything", 1) == 0
    assert partition_of("", PARTITIONS) == partition_of("", PARTITIONS)
    hit = Counter(partition_of(k, PARTITIONS) for k in KEYS)
    assert len(hit) >= 1000  # 10,000 keys reach nearly all 1024 partitions
    assert max(hit.values()) <= 30  # and none is crowded (mean about 10)
    with pytest.raises(InvalidTypeError, match="key must be a str, got int"):
        partition_of(5, PARTITIONS)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="partitions must be >= 1, got 0"):
        partition_of("k", 0)
    with pytest.raises(InvalidArgumentError, match="key must not contain NUL"):
        partition_of("k\x00", PARTITIONS)
    with pytest.raises(InvalidArgumentError, match="nodes must name at least one node"):
        owner_of(3, [])
    with pytest.raises(InvalidArgumentError, match="partition must be >= 0, got -1"):
        owner_of(-1, NODES)
    with pytest.raises(InvalidArgumentError, match="partition must be <= 65535, got 1048576"):
        owner_of(2**20, NODES)  # no partition count reaches it (MAX_PARTITIONS), as partition_of refuses
    assert owner_of(MAX_PARTITIONS - 1, NODES) in NODES


@given(
    key=st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=255),
    partitions=st.integers(1, 1 << 16),
)
def test_partition_of_is_in_range_and_deterministic(key: str, partitions: int) -> None:
    p = partition_of(key, partitions)
    assert 0 <= p < partitions
    assert partition_of(key, partitions) == p


@pytest.mark.parametrize("partitions", [(1 << 16) + 1, 10**20])
def test_a_partition_count_past_the_stores_limit_is_refused_at_once(partitions: int) -> None:
    """As many partitions as a store may keep (``StoreConfig.partitions``, 2**16) at most: never a long loop."""
    for call in (
        lambda: assign(partitions, ["a"]),
        lambda: owned_partitions("a", partitions, ["a"]),
        lambda: partition_of("k", partitions),
    ):
        with pytest.raises(InvalidArgumentError, match=f"partitions must be <= 65536, got {partitions}"):
            call()
    assert len(assign(1 << 16, ["a"])["a"]) == 1 << 16
