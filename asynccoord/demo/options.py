"""The demo's command line: :class:`DemoOptions` and :func:`parse_args`.

Every option has a default that runs the full demo (20,000 messages, 2 processes x 8
nodes, faults on) on a fresh SQLite file; the timing knobs the tests shorten
(``lease_s``, ``stall_s``...) are fields of :class:`DemoOptions` without a flag.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..backends.open import is_postgres_target, redact_target
from ..errors import InvalidArgumentError

__all__ = (
    "DEMO_SCHEMA",
    "DEMO_SCHEMA_COMMENT",
    "REDIS_SCHEMES",
    "SYSTEM_SCHEMAS",
    "DemoOptions",
    "parse_args",
)

DEMO_SCHEMA = "asynccoord_demo"
"""Default PostgreSQL schema of the demo's tables (``--schema``)."""

REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
"""URL schemes ``--lock-store`` accepts (redis-py's)."""

DEMO_SCHEMA_COMMENT = "created by python -m asynccoord.demo; dropped and recreated by its next run"
"""The comment that marks a schema as the demo's own: the only kind of schema the demo ever drops."""

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")

SYSTEM_SCHEMAS = re.compile(r"public|information_schema|pg_.*")
"""Schema names the demo refuses outright, even before it looks at the database."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoOptions:
    """What the demo runs (see ``--help`` for each option)."""

    nodes: int = 8
    processes: int = 2
    messages: int = 20_000
    speed: float | None = None
    replay_s: float = 8.0
    max_gap_s: float = 120.0
    accounts: int = 24
    db: Path | None = None
    store: str | None = None
    schema: str = DEMO_SCHEMA
    lock_store: str | None = None  # a redis:// URL: the account locks in Redis
    lock_prefix: str | None = None  # the run's Redis key prefix (set by run_demo)
    trace: Path | None = None
    seed: int = 7
    faults: bool = True
    as_json: bool = False
    lease_s: float = 2.0
    lock_ttl_s: float = 2.0
    lock_wait_s: float = 5.0
    max_in_flight: int = 32
    claim_batch: int = 16
    idle_max_s: float = 1.0
    monitor_flush_s: float = 1.0
    heartbeat_ttl_s: float = 3.0
    stall_s: float = 5.0
    latency_median_ms: float = 1.0
    latency_sigma: float = 0.6
    redelivery_rate: float = 0.01
    stuck_s: float = 60.0  # give up when no message was enqueued, done or dead for this long
    timeout_s: float = 1800.0  # and in any case after this long
    dashboard: int | None = None  # serve `python -m asynccoord dashboard` on this port while running
    rate_limits: bool = True  # declare the provider's limits to the store (--no-rate-limits: not)
    rate_scale: float = 8.0  # the provider's limits run this much faster than real time (ratelimits.RATE_SCALE)

    @property
    def target(self) -> str | None:
        """The store target given on the command line (``--store`` or ``--db``), None for a temporary file."""
        if self.store is not None:
            return self.store
        return None if self.db is None else str(self.db)

    @property
    def postgres(self) -> bool:
        """Whether the demo runs on PostgreSQL."""
        return self.store is not None and is_postgres_target(self.store)

    @property
    def declares_limits(self) -> bool:
        """Whether the demo declares the provider's limits to the store (and tasks name their keys)."""
        return self.rate_limits


def _check_lock_store_url(parser: argparse.ArgumentParser, url: str) -> None:
    """Refuse, as bad usage, a Redis URL the workers' lock store would refuse (``redis://host/x``, say).

    redis-py alone accepts such a URL, so the demo's own connection check passed and
    every worker then failed at its start. Without redis-py the run says so when it connects.
    """
    try:
        from ..backends.redis import RedisLockStore
    except ImportError:
        return
    try:
        RedisLockStore(url)  # checks the URL as a worker's will; connects only when opened
    except InvalidArgumentError as exc:
        parser.error(f"--lock-store: {exc}")


def parse_args(argv: Sequence[str] | None = None) -> DemoOptions:
    """Parse the command line into :class:`DemoOptions` (argparse exits 2 on bad usage)."""
    p = argparse.ArgumentParser(
        prog="python -m asynccoord.demo",
        description="Replay real chat traffic through several nodes in several processes, with faults.",
        epilog="Exit status: 0 every check held; 1 a check failed, or the run failed (its store or lock store "
        "cannot be reached or opened: one line on standard error); 2 bad usage (an option, the trace, a --db "
        "file already used, a schema the demo did not create).",
    )
    p.add_argument("--nodes", type=_bounded_int(256), default=8, help="nodes per process, 1..256 (default 8)")
    p.add_argument("--processes", type=_bounded_int(16), default=2, help="worker processes, 1..16 (default 2)")
    p.add_argument("--messages", type=_positive_int, default=20_000, help="messages to replay (default 20000)")
    p.add_argument(
        "--speed",
        type=_positive_float,
        default=None,
        help="time compression of the trace, e.g. 1000 (default: fit the replay into about 8 s)",
    )
    p.add_argument(
        "--accounts", type=_positive_int, default=24, help="bot accounts senders are hashed onto (default 24)"
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--db",
        type=Path,
        help="SQLite database file, new, kept after the run for python -m asynccoord status "
        "(default: a fresh one in a temporary folder, deleted at the end)",
    )
    where.add_argument(
        "--store",
        help="store target: a postgresql:// DSN (tables in the demo's own --schema) or an SQLite file",
    )
    p.add_argument(
        "--schema",
        type=_schema_name,
        default=None,
        help=f"with a postgresql:// --store: the schema the demo creates for its tables, and drops and "
        f"recreates on its next run; a schema it did not create is refused (default {DEMO_SCHEMA})",
    )
    p.add_argument(
        "--lock-store",
        metavar="URL",
        help="take the account locks in Redis (redis://, rediss:// or unix:// URL; extra 'redis') instead of "
        "the queue store; the demo's keys (under a prefix of its own) are deleted at the end",
    )
    p.add_argument("--trace", type=Path, help="trace file, JSON Lines, optionally gzipped (default: bundled sample)")
    p.add_argument("--seed", type=int, default=7, help="random seed (default 7)")
    p.add_argument("--no-faults", action="store_true", help="do not kill or stall a process")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the live view")
    p.add_argument(
        "--no-rate-limits",
        action="store_true",
        help="declare no rate limits to the store: the simulated provider still enforces its own, so it "
        "answers 429s (default: the store keeps the provider's limits, per account and per chat)",
    )
    p.add_argument(
        "--dashboard",
        nargs="?",
        const=8765,
        type=int,
        metavar="PORT",
        help="serve the live dashboard on 127.0.0.1:PORT (default 8765; 0: any free port) while the demo runs "
        "and print its URL (extra 'dashboard')",
    )
    a = p.parse_args(argv)
    if a.schema is not None and not (a.store is not None and is_postgres_target(a.store)):
        p.error("--schema applies to a PostgreSQL store only: add --store postgresql://...")
    if a.lock_store is not None and not a.lock_store.startswith(REDIS_SCHEMES):
        p.error(f"--lock-store takes a Redis URL ({', '.join(REDIS_SCHEMES)}...), got {redact_target(a.lock_store)!r}")
    if a.lock_store is not None:
        _check_lock_store_url(p, a.lock_store)
    return DemoOptions(
        nodes=a.nodes,
        processes=a.processes,
        messages=a.messages,
        speed=a.speed,
        accounts=a.accounts,
        db=a.db,
        store=a.store,
        schema=a.schema or DEMO_SCHEMA,
        lock_store=a.lock_store,
        trace=a.trace,
        seed=a.seed,
        faults=not a.no_faults,
        as_json=a.json,
        dashboard=a.dashboard,
        rate_limits=not a.no_rate_limits,
    )


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {text!r}")
    return value


def _bounded_int(maximum: int) -> Callable[[str], int]:
    """An argparse type: a whole number in ``1..maximum`` (a demo on 2 cores, not a stress test)."""

    def parse(text: str) -> int:
        value = _positive_int(text)
        if value > maximum:
            raise argparse.ArgumentTypeError(f"expected a number <= {maximum}, got {text!r}")
        return value

    return parse


def _schema_name(text: str) -> str:
    if not _SCHEMA_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"expected a lower-case PostgreSQL identifier (a-z, 0-9, _; at most 63), got {text!r}"
        )
    if SYSTEM_SCHEMAS.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not the demo's to drop: choose a schema of its own")
    return text


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value
