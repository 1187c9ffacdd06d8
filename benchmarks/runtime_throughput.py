"""Runtime throughput: no-op tasks/s drained by a ``Runtime`` of nodes, beside the store loop of the same run.

What users run is a :class:`~asynccoord.Runtime`, not the store: this measures the whole
node pipeline (claim, flight, lease keeper, send task, commit) on SQLite with a no-op
send. ``--tasks`` tasks (default 50,000) over ``--conversations`` partition keys (default
2,000) are enqueued up front into a fresh database file; one process then drains them
with ``Runtime(store, send=noop, nodes=N, config=NodeConfig(queue=..., ordered=...))``
until :meth:`~asynccoord.Runtime.wait_until_drained` returns (polled every 5 ms). The
rate is tasks divided by the time from the runtime's start to that return.

The ceiling, measured in the same run on the same kind of file: the **store loop**, 16
coroutines each ``claim(limit=32)`` -> no-op -> ``complete_many`` on one shared store (what
``queue_throughput.py`` measures). Beside it, the **store loop by partition**: the same 16
coroutines, each claiming only its sixteenth of the partitions, as 16 nodes each claim only
the partitions they own; the difference between the two is what claiming by partition costs
the store itself (a claim's tasks, one in 16 of the queue's, lie on rows and index pages
spread over the table). Each figure's runs are interleaved with the others'
(A, B, C, A, B, C...) so that a change of load on the machine hits them alike; medians
are reported, with the load average before and after.

Beside each rate, where the CPU time went, in microseconds per task: on the **loop**
thread (the event loop: the nodes' pipeline, or the store loop's coroutines) and on the
**store** threads (aiosqlite's connection thread, which runs every SQL statement, and the
WAL checkpointer's), read from ``time.thread_time`` and ``getrusage`` around each drain,
and how many **cores** were busy on average (CPU time over wall time). In one process
the threads share the GIL, so the two rarely overlap: the rate is bounded by the sum of
the two figures per task, not by the larger one.

``--long-tasks N`` adds a long drain (16 nodes, unordered, N tasks; 1,000,000 for the
goal) reported as its overall rate and its rate per tenth of the run, beside the
50,000-task rate.

Usage::

    python benchmarks/runtime_throughput.py [--tasks 50000] [--nodes 1 16 64]
        [--ordered-nodes 16] [--repeat 3] [--long-tasks 1000000] [--json] [--quick]

``--quick`` is a smoke run for the test suite (2,000 tasks, nodes 1 and 4, one repeat).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from _common import has_uvloop, loadavg, run

from asynccoord import NewTask, NodeConfig, Runtime, SQLiteStore, Task, TaskStatus

T = TypeVar("T")
QUEUE = "bench"


async def fill(path: str, tasks: int, conversations: int) -> None:
    """Enqueue ``tasks`` no-op tasks over ``conversations`` keys (batches of 1,000)."""
    async with SQLiteStore(path) as store:
        for offset in range(0, tasks, 1000):
            count = min(1000, tasks - offset)
            await store.enqueue_many(
                [
                    NewTask(queue=QUEUE, payload=None, partition_key=f"c{(offset + i) % conversations}")
                    for i in range(count)
                ]
            )


async def store_loop(path: str, tasks: int, workers: int = 16, batch: int = 32, *, by_partition: bool = False) -> float:
    """Tasks/s of ``workers`` coroutines doing claim -> no-op -> ``complete_many`` on one store.

    ``by_partition``: each coroutine claims only its share of the partitions (those whose
    number is its index modulo ``workers``), as each of as many nodes claims only its own.
    """
    async with SQLiteStore(path) as store:

        async def worker(index: int) -> int:
            done = 0
            own = [p for p in range(store.partitions) if p % workers == index] if by_partition else None
            while True:
                claimed = await store.claim(
                    QUEUE, node_id=f"loop-{index}", limit=batch, lease_s=60, partitions=own, ordered=False
                )
                if not claimed:
                    return done
                outcomes = await store.complete_many(claimed)
                done += sum(1 for o in outcomes if not isinstance(o, Exception))

        start = time.perf_counter()
        counts = await asyncio.gather(*(worker(i) for i in range(workers)))
        elapsed = time.perf_counter() - start
    assert sum(counts) == tasks, (sum(counts), tasks)
    return tasks / elapsed


async def runtime_drain(path: str, tasks: int, nodes: int, ordered: bool, tenths: list[float] | None = None) -> float:
    """Tasks/s of a Runtime of ``nodes`` nodes draining the queue with a no-op send.

    ``tenths``: when given, filled with the rate (tasks/s) of each tenth of the run.
    """
    sent = 0
    marks: list[float] = []
    step = max(1, tasks // 10)

    async def noop(task: Task) -> None:
        nonlocal sent
        sent += 1
        if sent % step == 0:
            marks.append(time.perf_counter())

    async with SQLiteStore(path) as store:
        start = time.perf_counter()
        async with Runtime(store, send=noop, nodes=nodes, config=NodeConfig(queue=QUEUE, ordered=ordered)) as rt:
            drained = await rt.wait_until_drained(timeout_s=3600.0, poll_s=0.005)
            elapsed = time.perf_counter() - start
        assert drained
        stats = await store.stats(QUEUE)
    assert sent >= tasks, (sent, tasks)
    assert stats.counts[TaskStatus.DONE] == tasks, stats
    if tenths is not None:
        edges = [start, *marks]
        tenths.extend(step / (b - a) for a, b in itertools.pairwise(edges))
    return tasks / elapsed


def timed_run(main: Callable[[], Coroutine[Any, Any, float]], tasks: int) -> tuple[float, dict[str, float]]:
    """Run one drain; return its rate and its CPU split (see the module docstring).

    The split covers the whole ``run`` (opening and closing the store too): microseconds
    per task on this thread (the event loop's) and on every other thread of the process,
    and the cores busy on average.
    """
    wall, loop_cpu, usage = time.perf_counter(), time.thread_time(), resource.getrusage(resource.RUSAGE_SELF)
    rate = run(main)
    after = resource.getrusage(resource.RUSAGE_SELF)
    loop_cpu = time.thread_time() - loop_cpu
    wall = time.perf_counter() - wall
    process_cpu = (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)
    return rate, {
        "loop_us_per_task": loop_cpu / tasks * 1e6,
        "store_us_per_task": max(0.0, process_cpu - loop_cpu) / tasks * 1e6,
        "cores_busy": process_cpu / wall,
    }


def _cleanup(path: str) -> None:
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path + suffix)


def bench(args: argparse.Namespace) -> dict[str, Any]:
    """Every figure of one run (see the module docstring), in a temporary folder removed after."""
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "uvloop": has_uvloop()},
        "tasks": args.tasks,
        "conversations": args.conversations,
        "repeat": args.repeat,
        "loadavg_before": loadavg(),
    }
    cases: list[tuple[str, Callable[[str], Coroutine[Any, Any, float]]]] = [
        ("store_loop", lambda p: store_loop(p, args.tasks)),
        ("store_loop_by_partition", lambda p: store_loop(p, args.tasks, by_partition=True)),
    ]
    for n in args.nodes:
        cases.append((f"runtime_{n}", lambda p, n=n: runtime_drain(p, args.tasks, n, False)))  # type: ignore[misc]
    for n in args.ordered_nodes:
        cases.append((f"runtime_{n}_ordered", lambda p, n=n: runtime_drain(p, args.tasks, n, True)))  # type: ignore[misc]
    runs: dict[str, list[float]] = {name: [] for name, _ in cases}
    cpu: dict[str, list[dict[str, float]]] = {name: [] for name, _ in cases}
    with tempfile.TemporaryDirectory(prefix="asynccoord-bench-") as folder:
        for r in range(args.repeat):
            for name, case in cases:
                path = os.path.join(folder, f"{name}-{r}.db")
                run(lambda p=path: fill(p, args.tasks, args.conversations))  # type: ignore[misc]
                rate, split = timed_run(lambda p=path, c=case: c(p), args.tasks)  # type: ignore[misc]
                runs[name].append(rate)
                cpu[name].append(split)
                _cleanup(path)
        if args.long_tasks:
            path = os.path.join(folder, "long.db")
            run(lambda: fill(path, args.long_tasks, args.conversations))
            tenths: list[float] = []
            rate = run(lambda: runtime_drain(path, args.long_tasks, 16, False, tenths))
            _cleanup(path)
            results["long"] = {"tasks": args.long_tasks, "nodes": 16, "tasks_per_s": rate, "tenths_per_s": tenths}
    results["runs"] = runs
    results["tasks_per_s"] = {name: statistics.median(rates) for name, rates in runs.items()}
    results["cpu"] = {
        name: {key: statistics.median(s[key] for s in splits) for key in splits[0]} for name, splits in cpu.items()
    }
    ceiling = results["tasks_per_s"]["store_loop"]
    results["vs_store_loop"] = {
        name: rate / ceiling for name, rate in results["tasks_per_s"].items() if name != "store_loop"
    }
    by_partition = results["tasks_per_s"]["store_loop_by_partition"]
    results["vs_store_loop_by_partition"] = {
        name: rate / by_partition for name, rate in results["tasks_per_s"].items() if name.startswith("runtime_")
    }
    if "long" in results and "runtime_16" in results["tasks_per_s"]:
        results["long"]["vs_short"] = results["long"]["tasks_per_s"] / results["tasks_per_s"]["runtime_16"]
    results["loadavg_after"] = loadavg()
    return results


def print_table(r: dict[str, Any]) -> None:
    m = r["machine"]
    print(f"machine: {m['cpus']} cpus, Python {m['python']}, uvloop={m['uvloop']}; load {r['loadavg_before']}")
    print(f"{r['tasks']} tasks over {r['conversations']} conversations, {r['repeat']} interleaved repeats (median)")
    head = f"  {'drain':<24} {'tasks/s':>10} {'x store loop':>13} {'x by partition':>15}"
    print(f"{head} {'loop us/task':>13} {'store us/task':>14} {'cores busy':>11}")
    for name, rate in r["tasks_per_s"].items():
        ratio, ratio_p = r["vs_store_loop"].get(name), r["vs_store_loop_by_partition"].get(name)
        cells = ("" if ratio is None else f"{ratio:>13.2f}", "" if ratio_p is None else f"{ratio_p:>15.2f}")
        c = r["cpu"][name]
        split = f"{c['loop_us_per_task']:>13.1f} {c['store_us_per_task']:>14.1f} {c['cores_busy']:>11.2f}"
        print(f"  {name:<24} {rate:>10,.0f} {cells[0]:>13} {cells[1]:>15} {split}")
    if "long" in r:
        long = r["long"]
        print(f"  long: {long['tasks']} tasks at 16 nodes: {long['tasks_per_s']:,.0f} tasks/s", end="")
        print(f" ({long.get('vs_short', 0):.2f} of the short run); per tenth:", end="")
        print(" " + " ".join(f"{x:,.0f}" for x in long["tenths_per_s"]))
    print(f"load after: {r['loadavg_after']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=50_000, help="tasks per drain (default 50000)")
    parser.add_argument("--conversations", type=int, default=2_000, help="partition keys (default 2000)")
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 16, 64], help="unordered node counts")
    parser.add_argument("--ordered-nodes", type=int, nargs="*", default=[16], help="ordered node counts")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved runs per figure (default 3)")
    parser.add_argument("--long-tasks", type=int, default=0, help="tasks of the long drain (default 0: none)")
    parser.add_argument("--quick", action="store_true", help="a smoke run for the test suite")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args()
    if args.quick:
        args.tasks, args.nodes, args.ordered_nodes, args.repeat = 2_000, [1, 4], [4], 1
        args.long_tasks = min(args.long_tasks, 4_000) or 4_000
    results = bench(args)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print_table(results)


if __name__ == "__main__":
    main()
