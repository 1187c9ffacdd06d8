"""The status report: one read-only look at a live cluster (``python -m asynccoord status``).

:func:`status_report` gathers, from any open store, the queue depth by queue and status
with the oldest due pending age and the queue's dead-letter policy (``hold`` keeps a
conversation waiting behind its dead task; ``python -m asynccoord dead`` lists them), the
live nodes with their heartbeat age, the partitions each owns (rendezvous assignment
over the live node ids, as the nodes compute it) and the process each runs in, the locks
held with holder and TTL left, the cluster-wide event counters with their rates over
sliding windows, latency quantiles, the processes reporting metrics with whether each is
live or gone (:mod:`asynccoord.cli.processes`), the firing alerts every live monitor
stored, and per queue the declared rate limits with the buckets holding keys back.

:func:`collect_status` opens an SQLite file *read-only* (``file:...?mode=ro``): it
applies no migration, writes nothing, and under WAL its reads never block the nodes.

The report is a JSON-ready dict whose shape is the documented JSON Schema shipped as
``asynccoord/schemas/status.schema.json`` (:func:`status_schema`); :func:`render_status`
prints it as tables with rich.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
from collections.abc import AsyncIterator, Sequence
from importlib import resources
from typing import IO, Any

from .. import events as ev
from ..config import StoreConfig
from ..contract.deadletters import DeadLetterStore
from ..contract.monitor import check_windows
from ..contract.ratelimits import RateLimitStore
from ..errors import StoreError
from ..locks.pool import PLACE_PREFIX
from ..monitor.monitor import LEADER_LOCK
from ..monitor.snapshot import cluster_snapshot
from ..partition import assign
from ..validation import MAX_DURATION_S, check_positive
from .lockstore import (
    LOCK_STORE_WAIT_S,
    ReportedLockStore,
    add_lock_store_options,
    check_lock_store_options,
    open_lock_store,
    persistence_told_in_output,
)
from .output import table_console, write_stdout
from .prefixhint import prefix_hint
from .printable import printable_report
from .processes import RECENT_FLUSH_S, attach_processes
from .run import parse_target
from .targethelp import target_help

__all__ = (
    "CONFLICT_EVENTS",
    "GONE_SHOWN",
    "HELD_BUCKETS_SHOWN",
    "RECENT_FLUSH_S",
    "STATUS_SCHEMA_ID",
    "check_status",
    "collect_status",
    "configure_status",
    "open_lock_store",
    "open_status_store",
    "rate_header",
    "render_status",
    "status_command",
    "status_report",
    "status_schema",
)

STATUS_SCHEMA_ID = "urn:asynccoord:schema:status:1"
"""The ``$id`` of the status JSON Schema; the report's ``schema`` field names it."""

GONE_SHOWN = 10
"""The most gone processes the human output lists (the last heard first); the JSON lists them all."""

CONFLICT_EVENTS: tuple[str, ...] = (
    ev.STALE_COMMIT_REJECTED,
    ev.FENCING_REJECTED,
    ev.LEASE_EXPIRED,
    ev.LEASE_LOST,
    ev.LOCK_LOST,
    ev.LOCK_CONTENDED,
    ev.DUPLICATE_DELIVERY_SUPPRESSED,
    ev.DUPLICATE_ENQUEUE_SUPPRESSED,
    ev.RETRIES,
    ev.DEAD_LETTERED,
    ev.PARTITION_HANDOFF,
    ev.MEMBERSHIP_CHANGE,
    ev.MEMBERSHIP_FLAP,
    ev.NODE_LOST,
    ev.PROVIDER_RATE_LIMITED,
    ev.RATE_LIMIT_HELD,
    ev.SEND_PAUSED,
    ev.SEND_ABANDONED,
)
"""Events shown as conflicts in the human output (throughput events come after them)."""

HELD_BUCKETS_SHOWN = 50
"""The most held rate-limit buckets a report lists (the longest waits, all queues together)."""

_STATUSES = ("pending", "running", "done", "dead")


def status_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of :func:`status_report`'s result."""
    text = resources.files("asynccoord").joinpath("schemas/status.schema.json").read_text("utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


async def status_report(
    store: Any,
    *,
    windows_s: Sequence[float] = (10.0, 60.0),
    db: str | None = None,
    lock_store: Any = None,
    lock_store_error: str | None = None,
) -> dict[str, Any]:
    """Gather the status of the cluster behind an open ``store``.

    Args:
        store: An open store implementing the queue, lock, membership and monitor contracts.
        windows_s: Windows for event rates and latency quantiles, seconds. Default (10, 60).
        db: The database path, echoed in the report. Default None.
        lock_store: An open lock store the nodes take their locks in (``Runtime(lock_store=...)``,
            e.g. a :class:`~asynccoord.backends.redis.RedisLockStore`): its locks are listed
            after ``store``'s, each with ``"store": "lock_store"``. When it lists none, one bounded
            search of its server names the other prefixes holding lock keys
            (``lock_store.prefix_hint``, :mod:`asynccoord.cli.prefixhint`). One that cannot be
            read (a :class:`~asynccoord.errors.StoreError`) lists no lock: its error is the
            report's ``lock_store.error``, and the rest is read from ``store`` all the same. Default None.
        lock_store_error: Why ``lock_store`` could not be opened: it is not read, and this is
            the report's ``lock_store.error``. Default None.

    Returns:
        A JSON-ready dict valid under :func:`status_schema`.

    Raises:
        StoreError: a read failed.
    """
    windows = check_windows(windows_s)
    depths = await store.queue_depths()
    members = await store.members()
    # The lease of the monitor that judges the cluster rules is no lock of the nodes: shown apart.
    held = await store.list_locks()
    locks = [("db", lock) for lock in held if lock.name != LEADER_LOCK]
    leader = next((lock for lock in held if lock.name == LEADER_LOCK), None)
    hint = None
    if lock_store is not None and lock_store_error is None:
        try:  # a lock store outage hides nothing the database can tell
            in_store = await lock_store.list_locks()
            locks += [("lock_store", lock) for lock in in_store]
            if not in_store:  # maybe not the nodes' --lock-prefix: a bounded search, only then
                hint = await prefix_hint(lock_store)
        except StoreError as exc:
            lock_store_error = str(exc)
    snapshot = await cluster_snapshot(store, windows)
    partitions = int(store.partitions)
    # As the nodes compute it: over the live members draining the same queue (their heartbeat's
    # "queue"; members that name none share among themselves), see Membership(queue=...).
    by_queue: dict[Any, list[str]] = {}
    for m in members:
        queue = m.info.get("queue")
        by_queue.setdefault(queue if isinstance(queue, str) else None, []).append(m.node_id)
    owned: dict[str, frozenset[int]] = {}
    for node_ids in by_queue.values():
        owned.update(assign(partitions, node_ids))

    # One read for every queue: the policies that are not the default (a store without the setting: None).
    policies = await store.dead_letter_policies() if isinstance(store, DeadLetterStore) else None
    queues = []
    totals = dict.fromkeys(_STATUSES, 0)
    oldest: float | None = None
    expired = 0
    for depth in depths:
        counts = {s: int(depth.counts.get(s, 0)) for s in _STATUSES}
        for s in _STATUSES:
            totals[s] += counts[s]
        age = depth.oldest_pending_age_s
        if age is not None:
            oldest = age if oldest is None else max(oldest, age)
        expired += depth.expired_leases
        queues.append(
            {
                "queue": depth.queue,
                **counts,
                "total": sum(counts.values()),
                "expired_leases": depth.expired_leases,
                "oldest_pending_age_s": age,
                "removed": depth.removed,
                "dead_letter_policy": None if policies is None else str(policies.get(depth.queue, "skip")),
            }
        )

    alerts: dict[tuple[str, str], dict[str, Any]] = {}
    for alert in snapshot.alerts:  # one row per monitor reporting it: merge by incident
        key = (alert.rule, alert.scope_key)
        entry = alerts.get(key)
        if entry is None:
            alerts[key] = {**alert.to_dict(), "reported_by": [alert.monitor_id]}
        else:
            entry["reported_by"].append(alert.monitor_id)
            entry["fired_at"] = min(entry["fired_at"], alert.fired_at)
            if alert.at >= entry["at"]:
                entry.update({k: v for k, v in alert.to_dict().items() if k not in ("fired_at", "monitor_id")})
    for entry in alerts.values():  # "state" stays "firing" for a muted incident: this says it was never sent
        entry["muted"] = entry["inhibited_by"] is not None
    snap = snapshot.to_dict()
    processes, nodes = attach_processes(
        snap["processes"],
        [
            {
                "node_id": m.node_id,
                "incarnation": m.incarnation,
                "heartbeat_age_s": m.heartbeat_age_s,
                "started_at": m.started_at,
                "expires_at": m.expires_at,
                "partitions": len(owned.get(m.node_id, ())),
                "info": m.info,
            }
            for m in members
        ],
    )
    return {
        "schema": STATUS_SCHEMA_ID,
        "db": db,
        "now_s": snapshot.now_s,
        "tasks": {**totals, "total": sum(totals.values()), "expired_leases": expired, "oldest_pending_age_s": oldest},
        "queues": queues,
        "partitions": partitions,
        "nodes": nodes,
        "lock_store": None
        if lock_store is None
        else {**_lock_store_entry(lock_store), "prefix_hint": hint, "error": lock_store_error},
        "locks": [
            {
                "store": where,
                "name": lock.name,
                "holder": lock.holder,
                "fencing_token": lock.fencing_token,
                "permits": lock.permits,
                "acquired_at": lock.acquired_at,
                "ttl_left_s": max(0.0, lock.remaining_ttl_s),
            }
            for where, lock in locks
        ],
        "events": {"totals": snap["totals"], "process_totals": snap["process_totals"], "windows": snap["windows"]},
        "latencies": snap["latencies"],
        "processes": processes,
        "alerts": sorted(alerts.values(), key=lambda a: (a["fired_at"], a["rule"], a["scope_key"])),
        "monitor_leader": None
        if leader is None
        else {
            "process_id": leader.holder,
            "fencing_token": leader.fencing_token,
            "ttl_left_s": max(0.0, leader.remaining_ttl_s),
        },
        "rate_limits": await _rate_limits(store),
    }


async def _rate_limits(store: Any) -> dict[str, Any]:
    """Per queue with declared limits or held buckets: its limits, and its buckets holding keys back.

    The queues are those that declare limits, with tasks or not yet (``limited_queues``). The held
    buckets are the :data:`HELD_BUCKETS_SHOWN` longest waits of all queues (``held_buckets``,
    store clock). A store without rate limits reports none.
    """
    if not isinstance(store, RateLimitStore):
        return {"held_shown_max": HELD_BUCKETS_SHOWN, "queues": []}
    held = await store.held_buckets(limit=HELD_BUCKETS_SHOWN)
    entries = []
    for queue in sorted({*await store.limited_queues(), *(b.queue for b in held)}):
        limits = await store.rate_limits(queue)
        mine = [b for b in held if b.queue == queue]
        if not limits and not mine:
            continue
        entries.append(
            {
                "queue": queue,
                "limits": [
                    {"dimension": lim.dimension, "count": lim.count, "per_s": lim.per_s, "burst": lim.burst}
                    for lim in limits
                ],
                "held": [{"dimension": b.dimension, "key": b.key, "wait_s": b.wait_s} for b in mine],
            }
        )
    return {"held_shown_max": HELD_BUCKETS_SHOWN, "queues": entries}


@contextlib.asynccontextmanager
async def open_status_store(
    path: str | os.PathLike[str], *, busy_timeout_s: float = 5.0, schema: str | None = None
) -> AsyncIterator[tuple[Any, str]]:
    """Open ``path`` read-only as :func:`collect_status` reads it; yield the store and its label.

    The label is what a report's ``db`` field shows (a PostgreSQL DSN without its password).
    ``python -m asynccoord dashboard`` keeps this store open and calls :func:`status_report`
    on it for every snapshot, so the page and ``status`` read the same way.

    Args:
        path: The SQLite database file of the cluster, or a PostgreSQL DSN.
        busy_timeout_s: How long a read may wait for a busy database (WAL recovery), seconds.
        schema: With a PostgreSQL DSN, the schema of the tables; None: the search path.

    Raises:
        As :func:`collect_status`.
    """
    config = StoreConfig(busy_timeout_s=check_positive("busy_timeout_s", busy_timeout_s))
    from ..backends.open import describe_target, is_postgres_target, open_store, schema_options

    options = schema_options(path, schema)
    if isinstance(path, str) and is_postgres_target(path):  # a PostgreSQL DSN
        async with open_store(path, config=config, read_only=True, listen=False, **options) as pg_store:
            yield pg_store, describe_target(path, schema)
    else:
        async with open_store(path, config=config, read_only=True) as store:  # a path or sqlite:///PATH
            yield store, os.fspath(path)


async def collect_status(
    path: str | os.PathLike[str],
    *,
    windows_s: Sequence[float] = (10.0, 60.0),
    busy_timeout_s: float = 5.0,
    schema: str | None = None,
    lock_store: str | None = None,
    lock_prefix: str | None = None,
) -> dict[str, Any]:
    """Open ``path`` read-only and return :func:`status_report` of it.

    Args:
        path: The SQLite database file of the cluster, or a PostgreSQL DSN
            (``postgresql://...``, see :func:`asynccoord.backends.open.open_store`).
        windows_s: Windows for rates and latencies, seconds. Default (10, 60).
        busy_timeout_s: How long a read may wait for a busy database (WAL recovery), seconds.
        schema: With a PostgreSQL DSN, the schema of the tables (``PostgresStore(schema=)``);
            None: the connection's search path. Default None.
        lock_store: A Redis URL whose locks are listed too (see :func:`open_lock_store`);
            only read. One that cannot be opened or read within
            :data:`~asynccoord.cli.lockstore.LOCK_STORE_WAIT_S` (about twice that for a read)
            is the report's ``lock_store.error``. Default None.
        lock_prefix: The lock store's key prefix; None for its default. Default None.

    Raises:
        InvalidArgumentError: ``schema`` with an SQLite ``path``, or no valid schema name.
        NotADatabaseError: no database at ``path`` (or in ``schema``), or not one of asynccoord.
        SchemaVersionError: the schema is another version than this asynccoord's.
        StoreError: a read of the database failed (a lock store that cannot be reached is the
            report's ``lock_store.error``).
    """
    locks = None
    if lock_store is not None:
        locks = open_lock_store(lock_store, prefix=lock_prefix, reconnect_timeout_s=LOCK_STORE_WAIT_S)
    async with contextlib.AsyncExitStack() as stack:
        error = None
        if locks is not None:
            reported = ReportedLockStore(locks)
            stack.push_async_callback(reported.aclose)
            error = await reported.reach()
        store, label = await stack.enter_async_context(
            open_status_store(path, busy_timeout_s=busy_timeout_s, schema=schema)
        )
        return await status_report(store, windows_s=windows_s, db=label, lock_store=locks, lock_store_error=error)
    raise AssertionError("unreachable")  # pragma: no cover


# --- the command ------------------------------------------------------------------------


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value <= MAX_DURATION_S:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0 and <= {MAX_DURATION_S:.0f}, got {text!r}")
    return value


def configure_status(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``python -m asynccoord status`` to ``parser``.

    ``--db`` is also spelled ``--store``. With a ``postgresql://`` DSN, ``--schema NAME``
    reads the tables of that schema (it is never created here); with an SQLite target it
    is a usage error (exit status 2).
    """
    parser.add_argument(
        "--db",
        "--store",
        dest="db",
        required=True,
        metavar="TARGET",
        help=target_help("opened read-only"),
    )
    parser.add_argument(
        "--schema",
        metavar="NAME",
        help="with a postgresql:// --db: the schema of asynccoord's tables (default: the connection's search_path)",
    )
    add_lock_store_options(parser, purpose="whose locks are listed too, as given to Runtime(lock_store=...)")
    parser.add_argument("--json", action="store_true", help="print one JSON object (schema: status.schema.json)")
    parser.add_argument(
        "--window",
        dest="windows_s",
        action="append",
        type=_positive_float,
        metavar="SECONDS",
        help="a window for event rates and latencies (repeatable; default 10 and 60)",
    )
    parser.add_argument(
        "--color", choices=("auto", "always", "never"), default="auto", help="colour in the tables (default auto)"
    )


def check_status(args: argparse.Namespace) -> None:
    """Refuse, before anything opens, a ``--schema`` that is no valid name or that comes with an
    SQLite ``--db``, and a ``--lock-store`` that is no Redis URL (or ``--lock-prefix`` without one)."""
    parse_target(args, read_only=True)  # parses the target and schema; opens nothing
    check_lock_store_options(args)  # validates the URL and prefix; opens nothing


def status_command(args: argparse.Namespace) -> int:
    """Run ``python -m asynccoord status`` with the parsed ``args``: print the report; exit status 0."""
    windows = tuple(args.windows_s or (10.0, 60.0))
    # The table warns of a lock store without an append-only file itself: its log line would say it twice.
    # With --json the log line stays, as the JSON holds the answer ("persistent": false) but no warning.
    told = args.lock_store is not None and not args.json
    with persistence_told_in_output() if told else contextlib.nullcontext():
        report = asyncio.run(
            collect_status(
                args.db, windows_s=windows, schema=args.schema, lock_store=args.lock_store, lock_prefix=args.lock_prefix
            )
        )
    if args.json:
        write_stdout(json.dumps(report, allow_nan=False, sort_keys=False) + "\n")
    else:
        color = {"auto": None, "always": True, "never": False}[args.color]
        render_status(report, color=color)
    return 0


def _lock_store_entry(lock_store: Any) -> dict[str, Any]:
    """The report's ``lock_store`` object: where it is (no password), its prefix, whether it persists."""
    from ..backends.open import redact_target

    url = getattr(lock_store, "url", None)
    return {
        "url": None if url is None else redact_target(url),
        "prefix": getattr(lock_store, "prefix", None),
        "persistent": getattr(lock_store, "persistent", None),
    }


def _lapsed(counts: dict[str, Any]) -> str:
    """`` of which N lease expired`` when some claimed tasks' leases expired, else ``""``."""
    n = counts["expired_leases"]
    return f" of which {n} lease expired" if n else ""


def _fmt_s(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.1f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


def _fmt_ms(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 10:
        return f"{value:.2f}"
    if value < 1000:
        return f"{value:.1f}"
    return f"{value:,.0f}"


def rate_header(window_s: float, span_s: float) -> str:
    """The events table's column header for a window: ``/s last 60s``, ``/s last 60s (30s of data)``.

    The span is said only while it reads shorter than the window once rounded to whole
    seconds: 59.6 s of data in a 60 s window would read "(60s of data)".
    """
    shown = f"{span_s:.0f}"
    return f"/s last {window_s:g}s" + (f" ({shown}s of data)" if span_s < window_s and float(shown) < window_s else "")


def render_status(report: dict[str, Any], file: IO[str] | None = None, *, color: bool | None = None) -> None:
    """Print a status report as tables (rich).

    Args:
        report: What :func:`status_report` returned.
        file: Where to print. Default standard output.
        color: Force colour on or off. Default: colour on a terminal only.
    """
    from rich import box
    from rich.table import Table
    from rich.text import Text

    report = printable_report(report)  # no control character of the database reaches the terminal
    # Markup off: names come from the database (queues, nodes, locks, a schema), and one like
    # "[/x]" must print as it is, not be read as a console markup tag (or crash the rendering).
    console = table_console(file, color=color, pipe_width=120)
    tasks = report["tasks"]
    console.print(
        Text.assemble(
            ("asynccoord status", "bold"),
            f"  db={report['db'] or '-'}  partitions={report['partitions']}  "
            f"tasks={tasks['total']} (pending {tasks['pending']}, claimed {tasks['running']}{_lapsed(tasks)}, "
            f"done {tasks['done']}, dead {tasks['dead']})  oldest pending={_fmt_s(tasks['oldest_pending_age_s'])}",
        )
    )
    if (report.get("lock_store") or {}).get("error") is not None:  # as the dashboard's banner
        console.print(f"lock store unreachable: {report['lock_store']['error']}", style="bold red", soft_wrap=True)

    table = Table(title="Queues", box=box.SIMPLE_HEAVY)
    # "claimed" (the JSON's "running"): leased to a node, sending or still waiting for its lock.
    for col in ("queue", "pending", "claimed", "lease expired", "done", "dead", "on dead", "total", "oldest pending"):
        table.add_column(col, justify="left" if col in ("queue", "on dead") else "right")
    held = [q for q in report["queues"] if q["dead_letter_policy"] == "hold" and q["dead"]]
    for q in report["queues"]:
        table.add_row(
            q["queue"],
            str(q["pending"]),
            str(q["running"]),
            str(q["expired_leases"]),
            str(q["done"]),
            str(q["dead"]),
            q["dead_letter_policy"] or "-",
            str(q["total"]),
            _fmt_s(q["oldest_pending_age_s"]),
            style="yellow" if q in held else None,
        )
    console.print(table)
    for q in held:  # what leaves a conversation stuck
        console.print(
            f"'{q['queue']}' holds conversations behind {q['dead']} dead task(s) until requeued or discarded: "
            f"python -m asynccoord dead --db ... --queue {shlex.quote(q['queue'])}",
            style="yellow",
            soft_wrap=True,  # one line to copy: the terminal wraps it
        )

    _render_processes(console, report)

    places = sum(1 for lock in report["locks"] if lock["name"].startswith(PLACE_PREFIX))
    title = f"Locks held ({len(report['locks']) - places})"
    if places:  # leases that mark a process waiting for a taken lock (asynccoord.locks.pool.next_in_line)
        title += f" and places in line ({places})"
    lock_store = report.get("lock_store")
    if lock_store is not None:
        title += f"; lock store {lock_store['url']} prefix {lock_store['prefix']!r}"
    table = Table(title=title, box=box.SIMPLE_HEAVY)
    columns: tuple[str, ...] = ("lock", "holder", "fencing token", "permits", "TTL left")
    if lock_store is not None:
        columns = ("in", *columns)
    for col in columns:
        table.add_column(col, justify="left" if col in ("in", "lock", "holder") else "right")
    for lock in report["locks"]:
        where = () if lock_store is None else ("lock store" if lock["store"] == "lock_store" else "db",)
        table.add_row(
            *where,
            "(place in line) " + lock["name"] if lock["name"].startswith(PLACE_PREFIX) else lock["name"],
            lock["holder"] or "-",
            str(lock["fencing_token"]),
            str(lock["permits"]),
            _fmt_s(lock["ttl_left_s"]),
        )
    console.print(table)
    if lock_store is not None and lock_store["prefix_hint"] is not None:
        console.print(lock_store["prefix_hint"]["message"], style="yellow", soft_wrap=True)
    if lock_store is not None and lock_store["persistent"] is False:
        console.print(
            "warning: the lock store has no append-only file (appendonly no): a restart sets its "
            "fencing counters back (to the last RDB snapshot, if any)",
            style="yellow",
        )

    events = report["events"]
    windows = events["windows"]
    table = Table(title="Events (all processes)", box=box.SIMPLE_HEAVY)
    table.add_column("event")
    table.add_column("total", justify="right")
    for w in windows:  # over the part of the window that has data: a young cluster's first seconds
        table.add_column(rate_header(w["window_s"], w.get("span_s", w["window_s"])), justify="right")
    names = [n for n in CONFLICT_EVENTS if n in events["totals"]]
    names += [n for n in (ev.CLAIMS, ev.COMMITS) if n in events["totals"]]
    names += sorted(n for n in events["totals"] if n not in names)
    for name in names:
        style = "red" if name in CONFLICT_EVENTS[:5] and events["totals"][name] else None
        table.add_row(
            name,
            str(events["totals"][name]),
            *(f"{w['rates_per_s'].get(name, 0.0):.2f}" for w in windows),
            style=style,
        )
    console.print(table)

    if report["latencies"]:
        table = Table(title="Latencies (ms, all processes)", box=box.SIMPLE_HEAVY)
        for col in ("window", "name", "count", "p50", "p90", "p99", "mean"):
            table.add_column(col, justify="left" if col == "name" else "right")
        for lat in report["latencies"]:
            table.add_row(
                f"{lat['window_s']:g}s",
                lat["name"],
                str(lat["count"]),
                *(_fmt_ms(lat[k]) for k in ("p50_ms", "p90_ms", "p99_ms", "mean_ms")),
            )
        console.print(table)

    _render_rate_limits(console, report["rate_limits"])

    firing = [a for a in report["alerts"] if a.get("inhibited_by") is None]
    muted = [a for a in report["alerts"] if a.get("inhibited_by") is not None]
    if firing:
        table = Table(title=f"Active alerts ({len(firing)})", box=box.SIMPLE_HEAVY, style="red")
        for col in ("rule", "event", "value", "threshold", "window", "scope", "firing for"):
            table.add_column(col)
        for a in firing:
            table.add_row(*_alert_cells(a, report["now_s"]), style="bold red")
        console.print(table)
    else:
        console.print("No active alerts.", style="green")
    if muted:  # consequences of a firing incident: shown, never counted as firing nor sent
        table = Table(title=f"Muted alerts ({len(muted)}, never sent)", box=box.SIMPLE_HEAVY, style="dim")
        for col in ("rule", "event", "value", "threshold", "window", "scope", "open for", "muted by"):
            table.add_column(col)
        for a in muted:
            table.add_row(*_alert_cells(a, report["now_s"]), f"muted by {a['inhibited_by']}")
        console.print(table)
    leader = report.get("monitor_leader")
    if leader is None:
        console.print("No monitor judges the cluster alert rules now (no leader).", style="dim")
    else:
        console.print(
            f"Cluster alert rules judged by {leader['process_id']} (lease {_fmt_s(leader['ttl_left_s'])} left).",
            style="dim",
        )


def _alert_cells(a: dict[str, Any], now_s: float) -> list[str]:
    """The cells of one alert row: rule, event, value, threshold, window, scope and how long it is open."""
    relative = a["relative_to"] is not None
    return [
        a["rule"],
        a["event"],
        f"{a['value']:.1%}" if relative else f"{a['value']:g}",
        f"{a['threshold']:.1%}" if relative else f"{a['threshold']:g}",
        f"{a['window_s']:g}s",
        a["scope"] + (f" {a['scope_key']}" if a["scope_key"] else ""),
        _fmt_s(max(0.0, now_s - a["fired_at"])),
    ]


_STATE_TEXT = {"live": "live", "no_live_node": "no live node", "gone": "gone"}
_STATE_STYLE = {"live": None, "no_live_node": "yellow", "gone": "dim"}
_SHOWN_ELSEWHERE = ("host", "pid", "runtime", "keepalive_s", "nodes")
"""Info keys the processes table shows in columns of their own (or that only serve ``status``)."""


def _info_text(info: dict[str, Any], *, skip: tuple[str, ...] = ()) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(info.items()) if k not in skip)


def _render_processes(console: Any, report: dict[str, Any]) -> None:
    """The processes that report (live first, then the gone ones heard last), then the live nodes under each."""
    from rich import box
    from rich.table import Table

    processes = report["processes"]
    by_state = {state: [p for p in processes if p["state"] == state] for state in _STATE_TEXT}
    if processes:
        counts = [f"{len(by_state['live'])} live"]
        if by_state["no_live_node"]:
            counts.append(f"{len(by_state['no_live_node'])} without a live node")
        if by_state["gone"]:
            counts.append(f"{len(by_state['gone'])} gone")
        table = Table(title=f"Processes ({', '.join(counts)})", box=box.SIMPLE_HEAVY)
        for col in ("process", "state", "nodes", "last flush", "host", "pid", "info"):
            table.add_column(col, justify="right" if col in ("nodes", "last flush", "pid") else "left")
        gone = sorted(by_state["gone"], key=lambda p: p["last_flush_age_s"])
        for p in [*by_state["live"], *by_state["no_live_node"], *gone[:GONE_SHOWN]]:
            info = p["info"]
            hosts = info.get("nodes")
            of_hosted = f"/{hosts}" if isinstance(hosts, int) and not isinstance(hosts, bool) else ""
            table.add_row(
                p["process_id"],
                _STATE_TEXT[p["state"]],
                f"{p['nodes']}{of_hosted}",
                f"{_fmt_s(p['last_flush_age_s'])} ago",
                str(info.get("host", "-")),
                str(info.get("pid", "-")),
                _info_text(info, skip=_SHOWN_ELSEWHERE),
                style=_STATE_STYLE[p["state"]],
            )
        console.print(table)
        if len(gone) > GONE_SHOWN:
            console.print(f"... and {len(gone) - GONE_SHOWN} more gone processes (status --json lists them all).")
        if gone:
            console.print(
                "gone: no live node, and shut down or silent past its keepalive (store clock); "
                "its counts stay in the totals for a day.",
                style="dim",
            )
    else:
        console.print(
            "No process reports its counters: the event counts come from a Monitor(store) in each process "
            "(python -m asynccoord run has one)."
        )

    def group(node: dict[str, Any]) -> str:  # the process, else the runtime its heartbeat names
        runtime = node["info"].get("runtime")
        return node["process_id"] or (runtime if isinstance(runtime, str) else "-")

    nodes = sorted(report["nodes"], key=lambda n: (group(n), n["node_id"]))
    groups = len({group(n) for n in nodes})
    title = f"Live nodes ({len(nodes)}" + (f" in {groups} processes)" if groups > 1 else ")")
    table = Table(title=title, box=box.SIMPLE_HEAVY)
    for col in ("process", "node", "heartbeat age", "partitions", "info"):
        table.add_column(col, justify="right" if col in ("heartbeat age", "partitions") else "left")
    previous = None
    for n in nodes:
        process = group(n)
        if previous is not None and process != previous:
            table.add_section()
        skip = _SHOWN_ELSEWHERE if n["process_id"] is not None else ()
        table.add_row(
            process if process != previous else "",
            n["node_id"],
            _fmt_s(n["heartbeat_age_s"]),
            str(n["partitions"]),
            _info_text(n["info"], skip=skip),
        )
        previous = process
    console.print(table)


def _render_rate_limits(console: Any, rate_limits: dict[str, Any]) -> None:
    """The declared limits and the held buckets of a report, as two tables (nothing when no queue has limits)."""
    from rich import box
    from rich.table import Table

    queues = rate_limits["queues"]
    if not queues:
        return
    table = Table(title="Rate limits", box=box.SIMPLE_HEAVY)
    for col in ("queue", "dimension", "rate", "burst"):
        table.add_column(col, justify="right" if col == "burst" else "left")
    for q in queues:
        for lim in q["limits"]:
            table.add_row(q["queue"], lim["dimension"], f"{lim['count']}/{lim['per_s']:g}s", str(lim["burst"]))
    console.print(table)
    held = [(q["queue"], b) for q in queues for b in q["held"]]
    if not held:
        console.print("No rate-limit bucket is holding keys back.", style="green")
        return
    held.sort(key=lambda qb: (-qb[1]["wait_s"], qb[0], qb[1]["dimension"], qb[1]["key"]))
    table = Table(title=f"Buckets holding keys back ({len(held)})", box=box.SIMPLE_HEAVY, style="yellow")
    for col in ("queue", "dimension", "key", "next token in"):
        table.add_column(col, justify="right" if col == "next token in" else "left")
    for queue, b in held:
        table.add_row(queue, b["dimension"], b["key"], _fmt_s(b["wait_s"]))
    console.print(table)
