"""The benchmark scripts run as documented and report what they measured.

Speed is never asserted here (benchmarks/README.md holds the figures): each script runs
as a real process on a tiny workload with ``--json``, and the test checks the keys
benchmarks/README.md documents and the outcomes that must hold whatever the machine:
every task committed, none sent twice where a layer forbids it, rates that are positive
numbers. A script that crashes, hangs or drops a documented key fails here.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from services import (
    PG_DSN,
    REDIS_URL,
    drop_schemas,
    new_schema,
    pg_rows,
    postgres_problem,
    redis_problem,
    unavailable,
)
from support import ROOT

BENCHMARKS = ROOT / "benchmarks"
TIMEOUT_S = 180.0

pytestmark = pytest.mark.multiprocess


def run_json(script: str, *args: str, cwd: Path) -> dict[str, Any]:
    """Run ``benchmarks/<script> --json *args``; return its JSON object (stdout is only that).

    Temporary files go to ``cwd/tmp``, which must be empty again when the script exits.
    """
    scratch = cwd / "tmp"
    scratch.mkdir()
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args, "--json"],
        cwd=cwd,
        env={**os.environ, "TMPDIR": str(scratch)},
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    report = f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, report
    assert "Traceback" not in proc.stderr, report
    result = json.loads(proc.stdout)
    assert isinstance(result, dict), report
    assert list(scratch.iterdir()) == [], f"{script} left temporary files behind"
    scratch.rmdir()
    return result


def import_contention() -> Any:
    """``benchmarks/contention.py`` as a module."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import contention
    finally:
        sys.path.remove(str(BENCHMARKS))
    return contention


def redis_keys(pattern: str) -> list[bytes]:
    """The Redis keys matching ``pattern``."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        return list(client.scan_iter(match=pattern, count=1000))
    finally:
        client.close()


def positive(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def test_queue_throughput_reports_every_documented_figure(tmp_path: Path) -> None:
    r = run_json(
        "queue_throughput.py",
        *("--tasks", "300", "--nodes", "1", "4", "--ordered-nodes", "2", "--naive-nodes", "1", "2"),
        *("--naive-tasks", "100", "--raw-seconds", "0.1", "--processes", "2", "--process-nodes", "2"),
        cwd=tmp_path,
    )
    assert r["tasks"] == 300
    assert r["repeat"] == 1
    for key in ("raw_commits_per_s", "raw_batch_claim_tasks_per_s", "enqueue_per_s"):
        assert positive(r[key]), (key, r[key])
    assert set(r["naive"]) == {"1", "2"}
    assert all(positive(v) for v in r["naive"].values())
    assert set(r["asynccoord"]) == {"1", "4"}
    assert all(positive(v) for v in r["asynccoord"].values())
    assert set(r["asynccoord_ordered"]) == {"2"}
    assert positive(r["asynccoord_ordered"]["2"])
    assert r["processes"]["processes"] == 2
    assert r["processes"]["nodes_per_process"] == 2
    assert positive(r["processes"]["tasks_per_s"])
    # Every run's figure, whose median is the figure reported.
    assert r["runs"]["processes"] == [r["processes"]["tasks_per_s"]]
    for kind in ("naive", "asynccoord", "asynccoord_ordered"):
        assert set(r["runs"][kind]) == set(r[kind])
        assert all(rates == [r[kind][n]] for n, rates in r["runs"][kind].items()), kind
    for nodes in ("1", "4"):
        ratios = r["ratios"][f"nodes_{nodes}"]
        assert ratios["vs_naive_1"] == pytest.approx(r["asynccoord"][nodes] / r["naive"]["1"])
        assert ratios["vs_raw_commits"] == pytest.approx(r["asynccoord"][nodes] / r["raw_commits_per_s"])


def test_runtime_throughput_reports_the_runtime_beside_the_store_loop(tmp_path: Path) -> None:
    r = run_json("runtime_throughput.py", "--quick", cwd=tmp_path)  # asserts every task done itself
    assert r["tasks"] == 2000
    names = {"store_loop", "store_loop_by_partition", "runtime_1", "runtime_4", "runtime_4_ordered"}
    assert set(r["tasks_per_s"]) == names
    assert all(positive(v) for v in r["tasks_per_s"].values())
    assert all(rates == [r["tasks_per_s"][name]] for name, rates in r["runs"].items())
    for name, ratio in r["vs_store_loop"].items():
        assert ratio == pytest.approx(r["tasks_per_s"][name] / r["tasks_per_s"]["store_loop"])
    assert set(r["vs_store_loop_by_partition"]) == {"runtime_1", "runtime_4", "runtime_4_ordered"}
    for name, ratio in r["vs_store_loop_by_partition"].items():
        assert ratio == pytest.approx(r["tasks_per_s"][name] / r["tasks_per_s"]["store_loop_by_partition"])
    assert set(r["cpu"]) == names
    for name, split in r["cpu"].items():  # the event loop works in every drain, and so does SQLite's thread
        assert positive(split["loop_us_per_task"]), name
        assert positive(split["store_us_per_task"]), name
        assert 0 < split["cores_busy"] <= (os.cpu_count() or 1) + 0.5, name
    assert r["long"]["tasks"] == 4000
    assert positive(r["long"]["tasks_per_s"])
    assert len(r["long"]["tenths_per_s"]) == 10
    assert all(positive(v) for v in r["long"]["tenths_per_s"])


def test_hot_account_reports_efficiency_beside_the_bare_loop(tmp_path: Path) -> None:
    r = run_json("hot_account.py", "--quick", cwd=tmp_path)
    assert r["tasks"] == 200
    assert set(r["efficiency"]) == {"bare_loop", "sqlite_1p", "sqlite_2p"}
    for name, runs in r["runs"].items():
        assert len(runs) == 1, name
        row = runs[0]
        assert row["sends"] >= 200, name  # every task was sent (the worker also waits until drained)
        # One account's sends never overlap (its lock, or one loop): their sum fits in the drain.
        assert 0 < row["send_s"] <= row["drain_s"] + 1e-6, (name, row)
        assert 0 < row["efficiency"] <= 1.0 + 1e-6, (name, row)
        assert r["efficiency"][name] == row["efficiency"]


def check_contention_rows(result: dict[str, Any], tasks: int, cells: set[tuple[str, int, int]]) -> None:
    rows, w = result["rows"], result["workload"]
    assert {(row["strategy"], row["nodes"], row["processes"]) for row in rows} == cells
    contention = import_contention()
    for row in rows:
        cell = (row["strategy"], row["nodes"], row["processes"])
        assert row["complete"] is True, cell
        assert row["committed"] == tasks, cell
        assert positive(row["tasks_per_s"]), cell
        assert positive(row["raw_commits_per_s"]), cell
        assert row["latency_p50_ms"] <= row["latency_p99_ms"], cell
        if row["strategy"] == "none":
            assert row["send_calls"] >= tasks, cell  # no compare-and-set: duplicates may happen
        else:
            assert row["send_calls"] == tasks, cell
            assert row["duplicate_sends"] == 0, cell
        if row["strategy"] == "all":
            assert row["claim_calls"] >= 1, cell
            assert row["stolen"] is not None, cell
        assert len(row["process_shares"]) == row["processes"], cell
        assert sum(row["process_shares"]) == pytest.approx(1.0, abs=0.002), cell
        if row["strategy"] in ("locks", "versions", "unordered", "none", "lock-table"):
            assert row["split"] is None, cell  # no partitioning: no split by the hash
        else:  # the split the row's layout gives at its node count, from the hash
            keys = Counter(
                t.partition_key
                for t in contention.workload(tasks, w["conversations"], w["accounts"], w["seed"], row["layout"])
            )
            assert row["split"] == contention.process_split(keys, row["processes"], row["nodes"]), cell
        if row["strategy"] in ("all", "all+slow"):  # partitioned, nothing stolen: each process sends its share
            assert row["process_shares"] == pytest.approx(row["split"], abs=0.0015), cell
        if row["strategy"] in ("all", "locks", "all+slow", "all+stealing"):
            # every commit presents its account lock's fencing token, one more per lease taken
            assert 1 <= row["hot_lock_leases"] <= row["lock_leases"] <= tasks, cell
        else:
            assert row["lock_leases"] is None, cell
            assert row["hot_lock_leases"] is None, cell
        if row["strategy"] == "lock-table":
            assert row["cpu_s"] is None, cell  # not a runtime's drain: not measured
        else:
            assert positive(row["cpu_s"]), cell  # the drain's processes, from the clock to the end


def test_contention_on_sqlite_commits_every_task_once_in_one_and_two_processes(tmp_path: Path) -> None:
    r = run_json(
        "contention.py",
        *("--tasks", "200", "--nodes", "2", "--processes", "1", "2", "--raw-seconds", "0.05"),
        *("--strategies", "all", "unordered", "none", "lock-table"),
        cwd=tmp_path,
    )
    assert r["workload"]["tasks"] == 200
    cells = {(s, 2, p) for s in ("all", "unordered", "none", "lock-table") for p in (1, 2)}
    check_contention_rows(r, 200, cells)
    # every account that sent took at least one lease of its lock: the sum is at least their number
    contention = import_contention()
    w = r["workload"]
    used = {t.payload["account"] for t in contention.workload(200, w["conversations"], w["accounts"], seed=1)}
    for row in r["rows"]:
        if row["strategy"] == "all":
            assert row["lock_leases"] >= len(used) > 1, row


def test_contention_reports_what_adding_nodes_did_per_run(tmp_path: Path) -> None:
    r = run_json(
        "contention.py",
        *("--tasks", "60", "--nodes", "1", "2", "--processes", "2", "--raw-seconds", "0.02"),
        *("--strategies", "all", "--repeat", "2"),
        cwd=tmp_path,
    )
    check_contention_rows(r, 60, {("all", n, 2) for n in (1, 2)})
    rate = {(row["nodes"], row["run"]): row["tasks_per_s"] for row in r["rows"]}
    assert sorted(rate) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    # each repeat on its own layout (its conversations renamed), the node counts of one alike
    layouts = {(row["run"], row["layout"]) for row in r["rows"]}
    assert sorted(run for run, _ in layouts) == [0, 1]
    assert len({layout for _, layout in layouts}) == 2
    assert min(layout for _, layout in layouts) >= 1
    for run in (0, 1):  # matched: both node counts split the load between the processes alike
        (one,) = [row["split"] for row in r["rows"] if (row["run"], row["nodes"]) == (run, 1)]
        (two,) = [row["split"] for row in r["rows"] if (row["run"], row["nodes"]) == (run, 2)]
        assert max(abs(a - b) for a, b in zip(one, two, strict=True)) <= 0.01
    ((group,),) = [r["scaling"]]
    assert (group["processes"], group["strategy"], group["nodes"]) == (2, "all", [1, 2])
    expected = [round(rate[(2, run)] / rate[(1, run)], 3) for run in (0, 1)]
    assert group["ratios"] == expected
    assert group["median"] == round((expected[0] + expected[1]) / 2, 3)
    assert group["larger_faster"] == sum(1 for x in expected if x > 1.0)
    logs = [math.log(rate[(2, run)] / rate[(1, run)]) for run in (0, 1)]
    assert group["geometric_mean"] == round(math.exp((logs[0] + logs[1]) / 2), 4)
    assert group["log_se"] == round(abs(logs[0] - logs[1]) / 2, 4)  # stdev of two / sqrt(2)
    assert group["at_equal_hot_leases"] is None  # fewer than 3 pairs: no line to fit
    assert group["runs"] == 2


def test_contention_scaling_leaves_out_runs_that_committed_nothing() -> None:
    contention = import_contention()
    rates = [(100.0, 0.0), (100.0, 110.0), (0.0, 100.0), (100.0, 90.0)]
    rows = [
        {"processes": 1, "strategy": "all", "nodes": n, "run": run, "tasks_per_s": rate, "hot_lock_leases": 0}
        for run, pair in enumerate(rates)
        for n, rate in zip((1, 2), pair, strict=True)
    ]
    ((group,),) = [contention.scaling(rows)]
    assert group["ratios"] == [None, 1.1, None, 0.9]
    assert (group["runs"], group["larger_faster"], group["median"]) == (2, 1, 1.0)
    assert group["geometric_mean"] == round(math.sqrt(1.1 * 0.9), 4)


async def test_contention_claim_counts_skip_claims_that_started_before_a_reset() -> None:
    """A node's start-up claim may still be at the store when the counts are reset for the drain."""
    contention = import_contention()
    import asyncio

    release = asyncio.Event()

    class Store:
        async def claim(self, *args: Any, **kwargs: Any) -> list[int]:
            await release.wait()
            return []

        async def claimable_partitions(self, *args: Any, **kwargs: Any) -> set[int]:
            return set()

    store = Store()
    counts = contention.count_claims(store)
    early = asyncio.ensure_future(store.claim("q"))
    await asyncio.sleep(0)
    counts.reset()
    release.set()
    assert await early == []
    assert await store.claim("q") == []
    await store.claimable_partitions("q")
    assert dict(counts) == {"calls": 1, "empty": 1, "polls": 1}


def test_the_ratio_at_equal_hot_leases_is_the_intercept_of_a_least_squares_line() -> None:
    contention = import_contention()
    extra = [-10, -5, 0, 5, 10, 20]
    noise = [0.01, -0.01, 0.0, 0.01, -0.01, 0.0]  # sums to 0 and is uncorrelated with extra
    logs = [0.02 - 0.003 * x + e for x, e in zip(extra, noise, strict=True)]
    fit = contention.at_equal_hot_leases(logs, extra)
    assert fit is not None
    mean_x = sum(extra) / len(extra)
    sxx = sum((x - mean_x) ** 2 for x in extra)
    slope = sum((x - mean_x) * e for x, e in zip(extra, noise, strict=True)) / sxx - 0.003
    intercept = sum(logs) / len(logs) - slope * mean_x
    assert fit["slope_per_lease"] == round(slope, 5)
    assert fit["ratio"] == round(math.exp(intercept), 4)
    residuals = [y - intercept - slope * x for x, y in zip(extra, logs, strict=True)]
    se = math.sqrt(sum(r * r for r in residuals) / 4 * (1 / 6 + mean_x**2 / sxx))
    assert fit["log_se"] == round(se, 4) > 0
    # the same leases at both sizes in every pair: nothing to correct by
    assert contention.at_equal_hot_leases(logs, [3] * 6) is None
    assert contention.at_equal_hot_leases(logs[:2], extra[:2]) is None


def test_a_contention_layout_renames_the_conversations_and_keeps_the_load() -> None:
    """Layout r hashes the same load to other partitions: only the conversation names change."""
    contention = import_contention()
    from asynccoord.partition import partition_of

    first = contention.workload(300, 20, 4, seed=1)
    other = contention.workload(300, 20, 4, seed=1, layout=3)
    assert {task.partition_key for task in first} == {f"c{i}" for i in range(20)}
    assert [task.partition_key for task in other] == [f"l3-{task.partition_key}" for task in first]
    assert [(t.payload, t.idempotency_key) for t in other] == [(t.payload, t.idempotency_key) for t in first]
    partitions = {partition_of(t.partition_key, 1024) for t in first}
    assert partitions != {partition_of(t.partition_key, 1024) for t in other}


def test_the_split_of_a_layout_counts_each_task_at_the_process_of_its_partitions_owner() -> None:
    contention = import_contention()

    from asynccoord.partition import owner_of, partition_of

    tasks = contention.workload(400, 40, 4, seed=5, layout=17)
    for processes, nodes in ((1, 3), (2, 1), (2, 5), (3, 4)):
        ids = [f"p{p}-n{i}" for p in range(processes) for i in range(nodes)]
        sent = Counter(int(owner_of(partition_of(t.partition_key, 1024), ids)[1:].split("-")[0]) for t in tasks)
        expected = [round(sent[p] / len(tasks), 4) for p in range(processes)]
        keys = Counter(t.partition_key for t in tasks)
        assert contention.process_split(keys, processes, nodes) == expected
    assert contention.process_split(Counter({"a": 3}), 1, 2) == [1.0]


def test_matched_layouts_split_the_load_alike_at_every_node_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ratio between node counts compares like with like: one layout, one split of the load."""
    import argparse
    import random

    contention = import_contention()
    args = argparse.Namespace(seed=3, tasks=300, conversations=30, accounts=4, nodes=[2, 8, 5], processes=[1, 2])

    def spread(layout: int) -> float:
        splits = contention.layout_splits(args, layout, 2)
        return max(max(shares) - min(shares) for shares in zip(*splits.values(), strict=True))

    matched = [contention.choose_layout(args, run, matched=True) for run in range(6)]
    unmatched = [contention.choose_layout(args, run, matched=False) for run in range(6)]
    assert len({layout for layout, _ in matched}) == 6  # each repeat its own
    for layout, reported in matched + unmatched:
        assert reported == round(spread(layout), 4)
    assert all(round(spread(layout), 4) <= 0.01 for layout, _ in matched)  # shares have 4 places
    assert max(spread(layout) for layout, _ in unmatched) > 0.1  # drawn blind, node counts split it apart
    assert matched == [contention.choose_layout(args, run, matched=True) for run in range(6)]  # deterministic
    other_seed = argparse.Namespace(**{**vars(args), "seed": 4})
    assert [contention.choose_layout(other_seed, run, matched=False) for run in range(6)] != unmatched
    # no draw within the tolerance: the closest of LAYOUT_DRAWS is taken, and says how far off it is
    monkeypatch.setattr(contention, "SPLIT_TOLERANCE", -1.0)
    monkeypatch.setattr(contention, "LAYOUT_DRAWS", 4)
    rng = random.Random(f"layout:{args.seed}:0")
    drawn = [rng.randrange(1, 2**31) for _ in range(4)]
    closest = min(drawn, key=spread)
    assert contention.choose_layout(args, 0, matched=True) == (closest, round(spread(closest), 4))


def test_contention_on_postgres_commits_every_task_once(tmp_path: Path) -> None:
    problem = postgres_problem()
    if problem is not None:
        unavailable("PostgreSQL", problem)
    schema = new_schema("bench")
    try:
        r = run_json(
            "contention.py",
            # libpq's connect_timeout: taken by the store and by the harness's own connections
            *("--store", PG_DSN + ("&" if "?" in PG_DSN else "?") + "connect_timeout=5"),
            *("--pg-schema", schema, "--no-procrastinate"),
            *("--tasks", "150", "--nodes", "3", "--processes", "1", "2", "--raw-seconds", "0.05"),
            *("--strategies", "all", "lock-table"),
            cwd=tmp_path,
        )
    finally:
        drop_schemas(schema)
    assert r["machine"]["store"] == "postgres"
    check_contention_rows(r, 150, {(s, 3, p) for s in ("all", "lock-table") for p in (1, 2)})


@pytest.mark.parametrize("store", ["sqlite", "postgres", "redis"])
def test_lock_contention_reports_each_case(tmp_path: Path, store: str) -> None:
    target: tuple[str, ...] = ()
    schema = new_schema("bench")
    if store == "postgres":
        problem = postgres_problem()
        if problem is not None:
            unavailable("PostgreSQL", problem)
        target = ("--store", PG_DSN, "--pg-schema", schema)
    elif store == "redis":
        problem = redis_problem()
        if problem is not None:
            unavailable("Redis", problem)
        target = ("--store", REDIS_URL)
    try:
        r = run_json(
            "lock_contention.py",
            *("--seconds", "0.2", "--nodes", "2", "4", "--names", "1", "2", "--locks", "200", "--dir", str(tmp_path)),
            *("--renew-interval-s", "0.3", *target),
            cwd=tmp_path,
        )
    finally:
        if store == "postgres":
            drop_schemas(schema)
    assert r["machine"]["store"] == store
    if store == "postgres":  # the benchmark dropped its schema after the run
        assert not pg_rows("SELECT 1 FROM pg_namespace WHERE nspname = $1", schema)
    if store == "redis":  # and deleted its keys
        assert r["machine"]["key_prefix"].startswith("asynccoord-bench:")
        assert redis_keys(r["machine"]["key_prefix"] + "*") == []
    assert positive(r["raw_commits_per_s"])
    assert positive(r["uncontended"]["pairs_per_s"])
    cases = {(c["nodes"], c["names"]) for c in r["contended"]}
    assert cases == {(2, 1), (2, 2), (4, 1), (4, 2)}
    for case in r["contended"]:
        assert case["pairs"] > 0, case
        assert positive(case["pairs_per_s"]), case
    renewal = r["renewal"]
    assert renewal["locks"] == 200
    assert renewal["lost"] == 0
    assert renewal["still_held"] == 200
    assert renewal["leases_per_statement"] == 200  # one statement renews every held lease
    if store == "sqlite":
        assert all(positive(c["tx_per_pair"]) for c in [r["uncontended"], *r["contended"]])
    else:  # the store's count would leave its single-statement lock operations out: not reported
        assert all(c["tx_per_pair"] is None for c in [r["uncontended"], *r["contended"]])


def test_cost_growth_reports_every_case_against_its_baseline(tmp_path: Path) -> None:
    r = run_json(
        "cost_growth.py",
        *("--sizes", "100", "1000", "--processed", "500", "--done", "500", "--delayed", "200"),
        *("--claims", "5", "--vm-claims", "2", "--tasks", "200", "--keys", "100", "--batch", "8"),
        *("--db-dir", str(tmp_path)),
        cwd=tmp_path,
    )
    assert r["fill_checked"] is True
    assert r["baseline"] == "pending_100"
    assert set(r["cases"]) == {"pending_100", "pending_1000", "processed_500", "done_500", "delayed_200"}
    assert set(r["ratios"]) == set(r["cases"])
    assert all(value == 1.0 for value in r["ratios"]["pending_100"].values())


def test_cost_growth_refuses_too_few_keys_for_the_batch_before_filling_anything(tmp_path: Path) -> None:
    argv = ["--keys", "40", "--batch", "32", "--db-dir", str(tmp_path)]
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "cost_growth.py"), *argv],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "--keys (40): the measured node owns" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


async def test_the_postgres_drain_probe_ends_with_a_failed_runtimes_error_not_at_max_s() -> None:
    """contention.py on PostgreSQL waited out --max-cell-s (120 s) on a cell whose nodes had failed."""
    problem = postgres_problem()
    if problem is not None:
        unavailable("PostgreSQL", problem)
    import anyio

    from asynccoord import NodeConfig, Runtime, StoreClosedError, Task
    from asynccoord.backends.postgres.store import PostgresStore

    contention = import_contention()

    async def send(task: Task) -> None:
        return None

    schema = new_schema("probe")
    try:
        store = PostgresStore(PG_DSN, schema=schema)
        await store.open()
        await store.enqueue(contention.QUEUE, 1, partition_key="k", delay_s=600.0)  # not drained, nothing to send
        config = NodeConfig(queue=contention.QUEUE, idle_min_s=0.01, idle_max_s=0.05)
        runtime = Runtime(store, send=send, nodes=2, config=config)
        async with contention.PostgresDb(PG_DSN, schema).drain_probe(runtime, PG_DSN) as wait_drained:
            await runtime.start()
            await store.close()  # under the running nodes: they fail with StoreClosedError
            with anyio.fail_after(20.0), pytest.raises(StoreClosedError):
                await wait_drained(600.0)
    finally:
        drop_schemas(schema)


def test_rate_limits_keeps_the_window_bound_and_reports_every_documented_figure(tmp_path: Path) -> None:
    pg = postgres_problem() is None
    r = run_json("rate_limits.py", "--quick", *(["--dsn", PG_DSN] if pg else []), cwd=tmp_path)
    assert set(r) == {"config", "asynccoord", "claim_cost", "pyrate_sqlite", "dbos_sqlite", "postgres"}
    ours = r["asynccoord"]
    assert ours["sends"] == r["config"]["keys"] * r["config"]["per_key"]  # every task sent once
    assert 0 < ours["max_window_ratio"] <= 1.0  # no key over count + burst in any window, 2 processes
    assert positive(ours["utilisation"])
    cost = r["claim_cost"]
    assert positive(cost["no_limits_tasks_per_s"])
    assert positive(cost["limits_tasks_per_s"])
    assert positive(cost["ratio"])
    for peer in ("pyrate_sqlite", "dbos_sqlite"):  # side by side when installed, else said why
        assert "skipped" in r[peer] or {"sends", "max_window_ratio", "utilisation", "drain_s"} <= set(r[peer])
    if not pg:
        assert "skipped" in r["postgres"]
        return
    theirs = r["postgres"]  # the same drains on PostgreSQL
    assert theirs["sends"] == ours["sends"]
    assert 0 < theirs["max_window_ratio"] <= 1.0
    assert positive(theirs["utilisation"])
    assert positive(theirs["claim_cost"]["ratio"])


def test_latency_reports_pickup_with_and_without_the_wake_up(tmp_path: Path) -> None:
    result = run_json("latency.py", "--quick", "--stores", "sqlite", cwd=tmp_path)
    assert result["tasks"] == 20
    for mode in ("wakeup", "poll_only"):
        figures = result["sqlite"][mode]
        assert figures["tasks"] == 20  # the consumer saw as many sends as tasks enqueued
        for key in ("p50_ms", "p90_ms", "p99_ms", "max_ms", "mean_ms", "enqueue_p50_ms", "pickup_p50_ms"):
            assert math.isfinite(figures[key]), (mode, key, figures[key])
            assert figures[key] > 0, (mode, key, figures[key])
        assert figures["p50_ms"] <= figures["p90_ms"] <= figures["p99_ms"] <= figures["max_ms"]
        assert figures["enqueue_p50_ms"] <= figures["enqueue_p99_ms"]
        assert figures["pickup_p50_ms"] <= figures["pickup_p99_ms"] <= figures["max_ms"]
        for key in ("idle_consumer_cpu_pct", "idle_producer_cpu_pct"):
            assert figures[key] >= 0
        assert figures["idle_producer_writes"] == 0  # an idle store with no nodes writes nothing
