"""``python -m asynccoord``: usage errors exit 2 and touch no database; ``run --db`` takes any store target."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.server
import json
import logging
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import tomllib
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import PythonRunner
from services import (
    PG_DSN,
    REDIS_URL,
    drop_schemas,
    need_redis_py,
    new_schema,
    pg_rows,
    postgres_problem,
    redis_problem,
    unavailable,
)
from support import ROOT, TESTS

from asynccoord import InvalidArgumentError, NewTask, RedisLockStore, SQLiteStore, TaskStatus
from asynccoord import events as ev
from asynccoord.backends.open import open_store
from asynccoord.backends.postgres.store import PostgresStore
from asynccoord.cli.main import build_parser, main
from asynccoord.cli.run import check_run, configure_run, store_options
from asynccoord.locks.pool import next_in_line
from asynccoord.monitor.snapshot import cluster_snapshot
from asynccoord.node import Runtime


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--send", "no_such_module_here:send"], "'no_such_module_here'"),
        (["--send", "json"], "'json'"),
        (["--send", "os:path"], "'os:path' is not callable"),
        (["--send", "asyncio:sleep", "--lock-key", "json:no_such_attr"], "'no_such_attr'"),
        (["--send", "asyncio:sleep", "--nodes", "0"], "--nodes must be >= 1, got 0"),
        (["--send", "asyncio:sleep", "--lease-s", "-1"], "--lease-s must be > 0, got -1.0"),
        (["--send", "asyncio:sleep", "--lease-s", "0.001"], "--lease-s must be >= 0.01 seconds (MIN_LEASE_S"),
        (["--send", "asyncio:sleep", "--lock-ttl-s", "1e-6"], "--lock-ttl-s must be >= 0.01 seconds"),
        (["--send", "asyncio:sleep", "--heartbeat-ttl-s", "0.005"], "--heartbeat-ttl-s must be >= 0.01 seconds"),
        (["--send", "asyncio:sleep", "--queue", " "], "--queue must not be only whitespace"),
        (["--send", "asyncio:sleep", "--max-in-flight", "0"], "--max-in-flight must be >= 1, got 0"),
        (["--send", "asyncio:sleep", "--lock-permits", "0"], "--lock-permits must be >= 1, got 0"),
        (["--send", "asyncio:sleep", "--send-timeout-s", "0"], "--send-timeout-s must be > 0, got 0.0"),
        (["--send", "asyncio:sleep", "--send-overrun-s", "-1"], "--send-overrun-s must be >= 0, got -1.0"),
        (["--send", "asyncio:sleep", "--send-overrun-s", "nan"], "--send-overrun-s"),
        (["--send", "asyncio:sleep", "--idle-max-s", "1e-9"], "--idle-max-s must be >= 0.001 seconds (MIN_INTERVAL_S"),
        (["--send", "asyncio:sleep", "--shutdown-timeout-s", "nan"], "--shutdown-timeout-s"),
        (["--send", "asyncio:sleep", "--done-retention-s", "0"], "--done-retention-s must be > 0, got 0.0"),
        (["--send", "asyncio:sleep", "--done-retention-s", "a day"], "expected seconds or 'keep', got 'a day'"),
        (["--send", "asyncio:sleep", "--rate-limit", "chat=0/1s"], "--rate-limit: count must be >= 1"),
        (["--send", "asyncio:sleep", "--rate-limit", "chat=1/1s,burst=0"], "--rate-limit: burst must be >= 1"),
        (["--send", "asyncio:sleep", "--rate-limit", "chat"], "--rate-limit: rate limit 'chat' is not of the form"),
        (
            ["--send", "asyncio:sleep", "--rate-limit", "chat=2000000/1s"],
            "--rate-limit: per_s / count must be at least",
        ),
        (
            ["--send", "asyncio:sleep", "--rate-limit", "chat=1/1s", "--rate-limit", "chat=2/1s"],
            "--rate-limit: limits declare dimension 'chat' twice",
        ),
        (
            ["--send", "asyncio:sleep", "--rate-limit", "chat=1/1s", "--clear-rate-limits"],
            "--clear-rate-limits and --rate-limit contradict each other",
        ),
        (["--send", "asyncio:sleep", "--lock-pace", "account"], "--lock-pace 'account' paces the sends of a lock"),
        (["--send", "asyncio:sleep", "--lock-key", "json:dumps", "--lock-pace", " "], "--lock-pace must not be only"),
        (
            ["--send", "asyncio:sleep", "--lock-key", "json:dumps", "--lock-pace", "account", "--lock-permits", "2"],
            "--lock-pace 'account' needs a lock, not a semaphore",
        ),
        (["--send", "asyncio:sleep", "--lock-store", "http://127.0.0.1:6379"], "--lock-store takes a Redis URL"),
        (["--send", "asyncio:sleep", "--lock-prefix", "bot:"], "--lock-prefix applies to a --lock-store only"),
        (["--send", "asyncio:sleep", "--alert-webhook", "ftp://hooks"], "--alert-webhook: url must be an http://"),
        (
            ["--send", "asyncio:sleep", "--alert-webhook", "http://[::1/hook"],
            "--alert-webhook: url must be an http:// or https:// URL with a host and a port in 1..65535",
        ),
        (
            ["--send", "asyncio:sleep", "--alert-webhook", "http://hooks .example.com/h"],
            "--alert-webhook: url's host must not hold whitespace",
        ),
        (["--send", "asyncio:sleep", "--alert-label", "cluster=prod"], "--alert-label applies to --alert-webhook only"),
        (
            ["--send", "asyncio:sleep", "--alert-webhook", "http://hooks/h", "--alert-label", "prod"],
            "--alert-label 'prod': give NAME=VALUE",
        ),
        (
            ["--send", "asyncio:sleep", "--alert-webhook", "http://hooks/h", "--alert-label", "cluster=" + "x" * 1025],
            "--alert-label: labels['cluster'] is 1025 characters long",
        ),
        (
            ["--send", "asyncio:sleep", "--alert-webhook", "http://hooks/h", "--alert-label", "cluster=prod\n"],
            "--alert-label: labels['cluster'] holds the control character '\\n'",
        ),
        (["--send", "asyncio:sleep", "--metrics-port", "0"], "--metrics-port must be >= 1"),
        (["--send", "asyncio:sleep", "--metrics-port", "70000"], "--metrics-port must be <= 65535"),
        (
            ["--send", "asyncio:sleep", "--metrics-host", "0.0.0.0"],
            "--metrics-host '0.0.0.0' applies with --metrics-port",
        ),
        (["--send", "asyncio:sleep", "--lifespan", "asyncio:sleep"], "--lifespan 'asyncio:sleep' is an async function"),
        (["--send", "asyncio:sleep", "--lifespan", "json:no_such"], "'json' has no attribute 'no_such'"),
        (
            ["--send", "asyncio:sleep", "--lock-key", "asyncio:sleep"],
            "error: --lock-key 'asyncio:sleep' is an async function: give a plain function taking the task and "
            "returning the lock name (str) or None (the nodes call it without awaiting)\n",
        ),
        (
            ["--send", "ast:walk"],
            "error: --send 'ast:walk': send must be an async function or a plain one, got the generator function",
        ),
    ],
)
def test_run_usage_errors_exit_2_and_create_no_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], named: str
) -> None:
    db = tmp_path / "never.db"
    with pytest.raises(SystemExit) as exited:
        main(["run", "--db", str(db), *extra])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m asynccoord run"), err
    assert named in err
    assert list(tmp_path.iterdir()) == []  # nothing was opened or created


@pytest.mark.parametrize(
    ("source", "named"),
    [
        ('raise RuntimeError("boom at import")\n', "RuntimeError: boom at import"),
        ("def send(\n", "SyntaxError: '(' was never closed ({path}:1)"),
        ("import no_such_module_here\n", "ModuleNotFoundError: No module named 'no_such_module_here'"),
        ("send = 1 / 0\n", "ZeroDivisionError: division by zero"),
        ("import sys\nsys.exit(5)\n", "the module exited with code 5 (SystemExit) while being imported"),
        (
            'raise SystemExit("no token")\n',
            "the module exited with the message 'no token' (SystemExit) while being imported",
        ),
    ],
    ids=["RuntimeError", "SyntaxError", "ImportError", "ZeroDivisionError", "sys.exit(5)", "SystemExit(message)"],
)
def test_run_names_what_a_send_module_raised_at_import_as_a_usage_error(
    python: PythonRunner, tmp_path: Path, source: str, named: str
) -> None:
    module = tmp_path / "code" / "badbot.py"
    module.parent.mkdir()
    module.write_text(source)
    db = tmp_path / "never.db"
    proc = python.run_module(
        "asynccoord",
        "run",
        "--db",
        str(db),
        "--send",
        "badbot:send",
        env={"PYTHONPATH": str(module.parent)},
        check=False,
    )
    assert proc.returncode == 2
    *usage, last = proc.stderr.splitlines()
    assert usage[0].startswith("usage: python -m asynccoord run")
    assert "Traceback" not in proc.stderr
    expected = named.format(path=module)
    assert last == f"python -m asynccoord run: error: cannot import module 'badbot' of 'badbot:send': {expected}"
    assert not db.exists()


SENDS_MODULE = """
import functools


def send_not_async(task):
    return "sent"


async def send(task, prefix=""):
    return prefix + "sent"


class Client:
    async def __call__(self, task):
        return "sent"

    async def deliver(self, task):
        return "sent"


partial_send = functools.partial(send, prefix="p:")
client = Client()
method_send = client.deliver
partial_client = functools.partial(client)
"""


@pytest.fixture
def sends_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The name of a module of sends, importable for this test."""
    name = f"climsg_sends_{tmp_path.name}".replace("-", "_")
    (tmp_path / f"{name}.py").write_text(SENDS_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_run_runs_a_plain_send_function_with_a_warning(sends_module: str, tmp_path: Path) -> None:
    """A plain ``def`` may be a decorator's wrapper returning the coroutine: it runs, with a warning."""
    db = tmp_path / "bot.db"
    sqlite3.connect(db).close()
    spec = f"{sends_module}:send_not_async"
    send, _, _ = check_run(build_parser().parse_args(["run", "--db", str(db), "--send", spec]))
    assert send is sys.modules[sends_module].send_not_async
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    enqueue = (
        "import asyncio, asynccoord as a\n"
        "async def m():\n async with a.SQLiteStore(%r) as s: await s.enqueue('q', 1)\n"
        "asyncio.run(m())"
    )
    subprocess.run([sys.executable, "-c", enqueue % str(db)], check=True, env=env, timeout=60)
    child = subprocess.Popen(
        [sys.executable, "-m", "asynccoord", "run", "--db", str(db), "--queue", "q", "--send", spec, "--nodes", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 60
        done = 0
        while time.monotonic() < deadline and not done:
            time.sleep(0.2)
            with contextlib.closing(sqlite3.connect(db)) as conn:
                done = conn.execute("SELECT count(*) FROM coord_tasks WHERE status = 'done'").fetchone()[0]
        child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert done == 1  # the plain send ran and its task was committed
    assert child.returncode == 0, err
    warnings = [line for line in err.splitlines() if "asynccoord.run.send_not_async" in line]
    assert len(warnings) == 1, err
    assert repr(spec) in warnings[0]


@pytest.mark.parametrize("attr", ["send", "partial_send", "client", "method_send", "partial_client"])
def test_run_accepts_a_send_whose_calls_make_coroutines(sends_module: str, attr: str) -> None:
    args = build_parser().parse_args(["run", "--db", "bot.db", "--send", f"{sends_module}:{attr}"])
    send, _, _ = check_run(args)
    assert send is getattr(sys.modules[sends_module], attr)


def test_run_refuses_a_lock_store_url_with_an_unknown_query_parameter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    need_redis_py()  # no server needed, only redis-py
    db = tmp_path / "never.db"
    url = "redis://:s3cret@127.0.0.1:6379/0?foo=bar"
    with pytest.raises(SystemExit) as exited:
        main(["run", "--db", str(db), "--send", "asyncio:sleep", "--lock-store", url])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m asynccoord run"), err
    last = err.splitlines()[-1]
    assert last == (
        "python -m asynccoord run: error: url must be a Redis URL (redis://host:port/db): redis-py takes no "
        "query parameter 'foo' in a redis:// URL (remove the parameter), got 'redis://:***@127.0.0.1:6379/0?foo=bar'"
    )
    assert "Traceback" not in err
    assert "s3cret" not in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "rule"),
    [
        (["status"], "Exit status: 0 printed (a --lock-store that cannot be reached is said in it); 1 the database"),
        (["dead"], "Exit status: 0 done; 1 the database failed or, with an action, --queue names no queue"),
        (["dead", "requeue"], "Exit status: 0 every task named was acted on; 1 the database failed, --queue"),
        (["dead", "discard"], "or an --id named no dead task of the queue (the other ids were acted on"),
        (["run"], "Exit status: 0 stopped by SIGTERM, SIGINT or SIGHUP (after the shutdown, even if sends outlived"),
        (["dashboard"], "Exit status: 0 stopped by SIGTERM, SIGINT or SIGHUP; 1 the database failed"),
    ],
    ids=["status", "dead", "dead requeue", "dead discard", "run", "dashboard"],
)
def test_each_command_help_ends_with_its_exit_statuses(
    capsys: pytest.CaptureFixture[str], argv: list[str], rule: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse's wrapping undone
    assert rule in text
    assert text.endswith("2 bad usage." if argv[0] == "dead" else ".")
    assert text.count("Exit status:") == 1


@pytest.mark.parametrize("argv", [["status"], ["dead"], ["dead", "requeue"], ["run"], ["dashboard"]])
def test_each_command_help_says_how_an_sqlite_url_reads_its_path(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse's wrapping undone
    assert "sqlite:///PATH (PATH relative to the current folder; sqlite:////PATH for an absolute one)" in text


@pytest.mark.parametrize(
    "argv", [["status"], ["dead", "--queue", "q"], ["dead", "requeue", "--queue", "q", "--all"]], ids=" ".join
)
def test_a_three_slash_url_of_an_absolute_path_is_named_with_four(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """The commands that read an existing file say, when sqlite:///PATH (relative) misses the file /PATH."""
    db = tmp_path / "bot.db"
    asyncio.run(_create(db))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    url = "sqlite:///" + str(db).lstrip("/")
    assert main([*argv, "--db", url]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert err.rstrip().endswith(f"did you mean sqlite:///{db} (four slashes: the absolute path {str(db)!r})?"), err
    assert main([*argv, "--db", f"sqlite:///{db}"]) == 0  # the four-slash URL reads it


async def _create(path: Path) -> None:
    async with SQLiteStore(path) as store:
        await store.enqueue("q", {"n": 1})  # the queue the dead commands name


def test_version_prints_the_version_of_the_package(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    version = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]["version"]
    assert capsys.readouterr().out == f"asynccoord {version}\n"


def test_a_file_named_file_colon_is_a_path_once_written_with_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["run", "--db", "./file:x.db", "--send", "asyncio:sleep"])
    check_run(args)  # no usage error
    store = open_store("./file:x.db")
    assert (store.path, store._on_file()) == ("./file:x.db", True)  # a path, not a URI: wake-ups on
    assert list(tmp_path.iterdir()) == []


def test_run_missing_required_options_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["run", "--db", str(tmp_path / "x.db")])
    assert exited.value.code == 2
    assert "--send" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("db", "named"),
    [
        ("mysql://bot:s3cret@h/db", "unknown store target 'mysql://bot:***@h/db'"),
        ("sqlite://x.db", "an SQLite URL is sqlite:///PATH (three slashes), got 'sqlite://x.db'"),
        ("sqlite:///q.db?mode=ro", "an SQLite URL is sqlite:///PATH with no query string or fragment, got 'sqlite"),
        ("postgresql://bot:s3cret@[::1/db", "malformed PostgreSQL DSN 'postgresql://***@[::1/db': Invalid IPv6 URL"),
        (
            "postgresql://bot:s3cret@db:port/db",
            "expected host, host:PORT or [IPv6]:PORT (PORT 1..65535), got 'db:port'",
        ),
        ("postgresql://bot:s3cret@db:99999/db", "got 'db:99999'"),
        ("file:x.db", "unknown store target 'file:x.db': use a file path, sqlite:///PATH or postgresql://"),
        ("sqlite:", "an SQLite URL is sqlite:///PATH (three slashes, lowercase), got 'sqlite:'"),
        ("sqlite:bot.db", "an SQLite URL is sqlite:///PATH (three slashes, lowercase), got 'sqlite:bot.db'"),
        ("sqlite:///file:x.db", "SQLite's file: URIs are not taken; for a file whose name begins with 'file:'"),
        ("sqlite:///", "is an in-memory SQLite database, which no other process can reach"),
        (":memory:", "is an in-memory SQLite database, which no other process can reach"),
    ],
)
def test_run_refuses_a_bad_db_target_as_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, db: str, named: str
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        main(["run", "--db", db, "--send", "asyncio:sleep"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m asynccoord run"), err
    assert named in err
    assert "s3cret" not in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("command", "db", "schema", "named"),
    [
        ("run", "bot.db", "bots", "--schema 'bots' applies to a postgresql:// --db only, got --db 'bot.db'"),
        ("status", "sqlite:///bot.db", "bots", "--schema 'bots' applies to a postgresql:// --db only"),
        ("run", "postgresql://bot:s3cret@h/db", "", "schema must not be empty"),
        ("status", "postgresql://bot:s3cret@h/db", "x" * 64, "schema must be at most 63 bytes"),
        ("run", "postgresql://bot:s3cret@h/db", "information_schema", "is PostgreSQL's own"),
        ("status", "postgresql://bot:s3cret@h/db", "pg_bots", "is PostgreSQL's own"),
    ],
)
def test_a_bad_schema_option_is_a_usage_error_and_touches_nothing(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    db: str,
    schema: str,
    named: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    extra = ["--send", "asyncio:sleep"] if command == "run" else []
    with pytest.raises(SystemExit) as exited:
        main([command, "--db", db, "--schema", schema, *extra])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: python -m asynccoord {command}"), err
    assert named in err
    assert "s3cret" not in err
    assert list(tmp_path.iterdir()) == []  # no SQLite file created (and no server reached: host h does not resolve)


@pytest.mark.parametrize("command", ["run", "status", "dashboard", "dead"])
@pytest.mark.parametrize("schema", [None, "bots"])
def test_a_postgresql_dsn_without_asyncpg_is_a_usage_error(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    schema: str | None,
) -> None:
    monkeypatch.chdir(tmp_path)
    # As on an install without the extra `postgres`: the PostgreSQL store's module fails to import.
    monkeypatch.setitem(sys.modules, "asyncpg", None)
    monkeypatch.setitem(sys.modules, "asynccoord.backends.postgres.store", None)
    extra = {"run": ["--send", "asyncio:sleep"], "dead": ["--queue", "outbox"]}.get(command, [])
    schema_option = [] if schema is None else ["--schema", schema]
    with pytest.raises(SystemExit) as exited:
        main([command, "--db", "postgresql://bot:s3cret@h/db", *schema_option, *extra])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: python -m asynccoord {command}"), err
    assert "a PostgreSQL store needs asyncpg: pip install 'asynccoord[postgres]'" in err
    assert "s3cret" not in err
    assert list(tmp_path.iterdir()) == []


def test_run_accepts_what_status_accepts() -> None:
    for db in ("bot.db", "sqlite:///bot.db", "postgresql://bot:s3cret@db.internal/coord?sslmode=require"):
        for option in ("--db", "--store"):  # status takes both spellings: so does run
            args = build_parser().parse_args(["run", option, db, "--send", "asyncio:sleep"])
            assert args.db == db
            send, lock_key, config = check_run(args)
            assert (send, lock_key, config.queue) == (asyncio.sleep, None, "default")


def test_run_lock_pace_reaches_the_nodes_config() -> None:
    argv = ["run", "--db", "bot.db", "--send", "asyncio:sleep", "--lock-key", "json:dumps", "--lock-pace", "account"]
    _, lock_key, config = check_run(build_parser().parse_args(argv))
    assert (lock_key, config.lock_pace_dimension) == (json.dumps, "account")
    _, _, config = check_run(build_parser().parse_args(argv[:-2]))
    assert config.lock_pace_dimension is None


def drain_then_stop(drained: list[bool]) -> Callable[..., Awaitable[int]]:
    """A stand-in for Runtime.wait_for_signal: wait until the queue is drained, then shut down."""

    async def wait(self: Runtime, signals: object = ()) -> int:
        drained.append(await self.wait_until_drained(timeout_s=20.0))
        await self.shutdown()
        return int(signal.SIGTERM)  # as the signal that stopped a real run

    return wait


async def enqueue_three(store: SQLiteStore | PostgresStore) -> None:
    async with store:
        await store.enqueue_many([NewTask(queue="outbox", payload={"account": i}) for i in range(3)])


async def done_results(store: SQLiteStore | PostgresStore) -> list[object]:
    async with store:
        stats = await store.stats("outbox")
        assert stats.counts[TaskStatus.DONE] == 3, stats
        return sorted([str((await store.get(i)).result) for i in range(1, 4)])


def serve_three(
    db: str,
    make_store: Callable[[], SQLiteStore | PostgresStore],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    extra: Sequence[str] = (),
) -> str:
    """Run ``python -m asynccoord run --db DB`` in this process until it has sent three tasks."""
    monkeypatch.syspath_prepend(str(TESTS / "workers"))
    monkeypatch.setenv("SERVE_SEND_LOG", str(tmp_path / "send.log"))
    monkeypatch.setenv("SERVE_SEND_SLEEP_S", "0")
    drained: list[bool] = []
    monkeypatch.setattr(Runtime, "wait_for_signal", drain_then_stop(drained))
    asyncio.run(enqueue_three(make_store()))
    argv = ["run", "--db", db, "--queue", "outbox", "--send", "serve_send:send", "--nodes", "2", *extra]
    sigterm_before = signal.getsignal(signal.SIGTERM)
    # The caller's signal mask is its own: a SIGTERM it blocks (to sigwait for it) stays blocked.
    mask_before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        assert main([*argv, "--idle-max-s", "0.1"]) == 0
        assert signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, set())
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask_before)
    # In a process that goes on (this one), run puts SIGTERM's handler back: an ignored SIGTERM
    # would be inherited by every later child process.
    assert signal.getsignal(signal.SIGTERM) == sigterm_before
    assert drained == [True]
    assert asyncio.run(done_results(make_store())) == ["sent 1", "sent 2", "sent 3"]
    return (tmp_path / "send.log").read_text()


def test_run_drains_an_sqlite_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bot.db"
    log = serve_three(f"sqlite:///{path}", lambda: SQLiteStore(path), tmp_path, monkeypatch)
    assert sorted(line.split()[:2] for line in log.splitlines() if line.startswith("end")) == [
        ["end", "1"],
        ["end", "2"],
        ["end", "3"],
    ]
    assert capsys.readouterr().out == (
        f"asynccoord: 2 nodes draining 'outbox' of sqlite:///{path}\n"
        "asynccoord: 2 nodes stopped on SIGTERM: 3 tasks committed, 0 handed back at the stop\n"
    )


def test_runs_lines_name_the_lock_store_without_its_password_and_the_stop() -> None:
    from asynccoord.cli.runlines import lock_store_line, stopped_line
    from asynccoord.node.status import NodeState

    need_redis_py()  # no server needed: the store is not opened
    locks = RedisLockStore("redis://:s3cret@cache.internal:6379/0", prefix="bot:")
    assert lock_store_line(locks) == "asynccoord: locks in redis://:***@cache.internal:6379/0 under prefix 'bot:'\n"
    states = [NodeState(node_id="a", committed=5, handed_back=1), NodeState(node_id="b", committed=1)]
    assert stopped_line(int(signal.SIGHUP), states) == (
        "asynccoord: 2 nodes stopped on SIGHUP: 6 tasks committed, 1 handed back at the stop\n"
    )
    assert stopped_line(0, states[:1]) == (
        "asynccoord: 1 node stopped on signal 0: 5 tasks committed, 1 handed back at the stop\n"
    )
    many = [NodeState(node_id="a", committed=1283, handed_back=12)]
    assert stopped_line(int(signal.SIGTERM), many, handed_back_before=10) == (
        "asynccoord: 1 node stopped on SIGTERM: 1283 tasks committed, 2 handed back at the stop"
        " (10 put back earlier, while running)\n"
    )


def test_run_says_when_it_creates_the_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(TESTS / "workers"))
    drained: list[bool] = []
    monkeypatch.setattr(Runtime, "wait_for_signal", drain_then_stop(drained))
    typo = tmp_path / "bot.dbx"
    argv = ["run", "--db", str(typo), "--queue", "outbox", "--send", "serve_send:send", "--nodes", "1"]
    assert main(argv) == 0
    assert drained == [True]
    stopped = "asynccoord: 1 node stopped on SIGTERM: 0 tasks committed, 0 handed back at the stop\n"
    assert capsys.readouterr().out == (
        f"asynccoord: 1 node draining 'outbox' of {typo} (a new database, created now)\n{stopped}"
    )
    assert typo.exists()
    assert main(argv) == 0  # the second run finds it
    assert capsys.readouterr().out == f"asynccoord: 1 node draining 'outbox' of {typo}\n{stopped}"


def test_run_opens_its_lifespan_before_the_nodes_and_closes_it_after_their_drain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--lifespan``: the client the sends use is open for every send and closed once, after the last."""
    path = tmp_path / "bot.db"
    extra = ["--send", "serve_send:client_send", "--lifespan", "serve_send:client"]
    log = serve_three(str(path), lambda: SQLiteStore(path), tmp_path, monkeypatch, extra)
    words = [line.split()[0] for line in log.splitlines()]
    assert words[0] == "open"
    assert words[-1] == "close"
    assert sorted(words[1:-1]) == ["end"] * 3 + ["start"] * 3


def test_run_refuses_a_lifespan_that_gives_no_async_context_manager_before_the_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", "--db", str(tmp_path / "bot.db"), "--send", "asyncio:sleep", "--lifespan", "builtins:dict"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "--lifespan 'builtins:dict' returned dict, not an async context manager" in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("how", ["search_path in the DSN", "--schema"])
def test_run_drains_a_postgresql_dsn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    problem = postgres_problem()
    if problem is not None:
        unavailable("PostgreSQL", problem)
    schema = new_schema("cli")
    try:
        # The enqueueing store creates the schema; the command's store finds it on its search
        # path, or is given it with --schema.
        if how == "--schema":
            dsn, extra = PG_DSN, ["--schema", schema]
        else:
            dsn, extra = f"{PG_DSN}{'&' if '?' in PG_DSN else '?'}search_path={schema}", []
        serve_three(dsn, lambda: PostgresStore(PG_DSN, schema=schema), tmp_path, monkeypatch, extra)
    finally:
        drop_schemas(schema)
    started, stopped = capsys.readouterr().out.splitlines()
    assert started.startswith("asynccoord: 2 nodes draining 'outbox' of ")
    assert started.endswith(f" (schema {schema})" if how == "--schema" else f"search_path={schema}")
    assert stopped == "asynccoord: 2 nodes stopped on SIGTERM: 3 tasks committed, 0 handed back at the stop"


def test_run_declares_rate_limits_on_a_postgresql_dsn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--rate-limit on a postgresql:// target: the limits are declared for every process, and the run drains."""
    from asynccoord import RateLimit

    problem = postgres_problem()
    if problem is not None:
        unavailable("PostgreSQL", problem)
    schema = new_schema("cli")
    extra = ["--schema", schema, "--rate-limit", "chat=30/1s,burst=30", "--rate-limit", "account=2/1m"]

    async def declared() -> list[RateLimit]:
        async with PostgresStore(PG_DSN, schema=schema, listen=False) as store:
            return await store.rate_limits("outbox")

    try:
        serve_three(PG_DSN, lambda: PostgresStore(PG_DSN, schema=schema), tmp_path, monkeypatch, extra)
        assert asyncio.run(declared()) == [
            RateLimit(dimension="account", count=2, per_s=60.0),
            RateLimit(dimension="chat", count=30, per_s=1.0, burst=30),
        ]
    finally:
        drop_schemas(schema)
    assert capsys.readouterr().out.startswith("asynccoord: 2 nodes draining 'outbox' of ")


def test_run_clear_rate_limits_removes_the_stored_limits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from asynccoord import RateLimit

    path = tmp_path / "bot.db"

    async def declare() -> None:
        async with SQLiteStore(path) as store:
            await store.set_rate_limits("outbox", [RateLimit(dimension="chat", count=1, per_s=60.0)])

    async def declared() -> list[RateLimit]:
        async with SQLiteStore(path, read_only=True) as store:
            return await store.rate_limits("outbox")

    asyncio.run(declare())
    serve_three(str(path), lambda: SQLiteStore(path), tmp_path, monkeypatch, ["--clear-rate-limits"])
    assert asyncio.run(declared()) == []
    assert capsys.readouterr().out.startswith("asynccoord: 2 nodes draining 'outbox' of ")


@pytest.mark.parametrize(
    ("given", "warned"),
    [
        (
            ["--rate-limit", "account=50/1s", "--rate-limit", "chat=50/1s"],
            "stored=[account=2/1s,burst=1 chat=1/1s,burst=3] new=[account=50/1s,burst=1 chat=50/1s,burst=1]",
        ),
        (
            ["--rate-limit", "chat=1/1s,burst=3"],
            "stored=[account=2/1s,burst=1 chat=1/1s,burst=3] new=[chat=1/1s,burst=3]",
        ),
        (["--clear-rate-limits"], "stored=[account=2/1s,burst=1 chat=1/1s,burst=3] new=[none]"),
        (["--rate-limit", "chat=1/1s,burst=3", "--rate-limit", "account=2/1s"], None),  # the same, in another order
    ],
    ids=["other limits", "fewer limits", "cleared", "the same limits"],
)
def test_run_warns_when_its_rate_limits_replace_other_stored_ones(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    given: list[str],
    warned: str | None,
) -> None:
    from asynccoord import RateLimit

    path = tmp_path / "bot.db"
    stored = [
        RateLimit(dimension="account", count=2, per_s=1.0),
        RateLimit(dimension="chat", count=1, per_s=1.0, burst=3),
    ]

    async def declare() -> None:
        async with SQLiteStore(path) as store:
            await store.set_rate_limits("outbox", stored)

    async def declared() -> list[RateLimit]:
        async with SQLiteStore(path, read_only=True) as store:
            return await store.rate_limits("outbox")

    asyncio.run(declare())
    caplog.set_level(logging.WARNING)
    serve_three(str(path), lambda: SQLiteStore(path), tmp_path, monkeypatch, given)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    if warned is None:
        assert warnings == []
        assert asyncio.run(declared()) == stored
        return
    [warning] = warnings  # the run's own store enforces what it declared: no second warning
    assert warning.levelno == logging.WARNING
    assert warning.getMessage() == (
        f"asynccoord.run.rate_limits_replaced queue='outbox' {warned}: the limits stored for the queue are "
        "replaced, and every process draining it enforces the new ones from now on"
    )
    assert capsys.readouterr().out.startswith("asynccoord: 2 nodes draining 'outbox' of ")


def test_run_declaring_limits_where_none_were_stored_warns_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Processes starting together each declare the queue's first limits: no warning of a replacement."""
    from asynccoord import RateLimit

    path = tmp_path / "bot.db"
    caplog.set_level(logging.INFO, logger="asynccoord.cli.run")
    serve_three(str(path), lambda: SQLiteStore(path), tmp_path, monkeypatch, ["--rate-limit", "chat=1/1s,burst=3"])
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert "asynccoord.run.rate_limits_declared queue='outbox' limits=[chat=1/1s,burst=3]" in caplog.messages

    async def declared() -> list[RateLimit]:
        async with SQLiteStore(path, read_only=True) as store:
            return await store.rate_limits("outbox")

    assert asyncio.run(declared()) == [RateLimit(dimension="chat", count=1, per_s=1.0, burst=3)]


def test_run_takes_its_locks_in_the_lock_store_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--lock-store redis://...: the account locks are taken in Redis, and the database holds none."""
    import uuid

    import redis

    problem = redis_problem()
    if problem is not None:
        unavailable("Redis", problem)
    prefix = f"asynccoord-cli-{uuid.uuid4().hex[:8]}:"
    path = tmp_path / "bot.db"
    extra = ["--lock-key", "serve_send:account_lock", "--lock-store", REDIS_URL, "--lock-prefix", prefix]
    client = redis.Redis.from_url(REDIS_URL)

    async def hold_account_0() -> None:  # another holder has it for a moment: the run's acquisition waits
        async with RedisLockStore(REDIS_URL, prefix=prefix) as other:
            assert await other.try_acquire_lock("account:0", ttl_s=2.0, holder="elsewhere") is not None

    try:
        asyncio.run(hold_account_0())
        serve_three(str(path), lambda: SQLiteStore(path), tmp_path, monkeypatch, extra)
        fencing = sorted(k.decode() for k in client.scan_iter(match=f"{prefix}fencing:*"))
        # The start names where the locks are, password hidden, after the database's line.
        lines = capsys.readouterr().out.splitlines()
        assert lines[0].startswith("asynccoord: 2 nodes draining 'outbox' of "), lines
        assert lines[1] == f"asynccoord: locks in {REDIS_URL} under prefix {prefix!r}", lines
        stopped = "asynccoord: 2 nodes stopped on SIGTERM: 3 tasks committed, 0 handed back at the stop"
        assert lines[2:] == [stopped], lines
    finally:
        for key in client.scan_iter(match=f"{prefix}*"):
            client.delete(key)
        client.close()
    # The three account locks, and the place in line the wait for account:0 took.
    assert [k for k in fencing if "fencing:account:" in k] == [f"{prefix}fencing:account:{i}" for i in range(3)]
    assert [k for k in fencing if "fencing:account:" not in k] == [f"{prefix}fencing:{next_in_line('account:0')}"]

    async def contended() -> float:
        async with SQLiteStore(path, read_only=True) as store:
            return (await cluster_snapshot(store, (60.0,))).totals.get(ev.LOCK_CONTENDED, 0)

    # The lock store's own events reach the database's counters (the monitor flushes them too).
    assert asyncio.run(contended()) >= 1

    with contextlib.closing(sqlite3.connect(path)) as db:  # the names the database ever gave a fencing token
        named = db.execute("SELECT name FROM coord_lock_names WHERE name LIKE 'account:%'").fetchall()
    assert named == []


def test_run_without_faults_raises_no_alert_with_the_default_rules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """200 messages on 3 accounts through 4 nodes of one process: the nodes take turns on the
    process's pooled account leases, which is not contention between holders, so the default
    ``lock_contention`` rule (and every other default rule) stays quiet."""
    monkeypatch.syspath_prepend(str(TESTS / "workers"))
    monkeypatch.setenv("SERVE_SEND_LOG", str(tmp_path / "send.log"))
    monkeypatch.setenv("SERVE_SEND_SLEEP_S", "0.002")
    evaluated: list[bool] = []

    async def drain_then_evaluate(self: Runtime, signals: object = ()) -> int:
        evaluated.append(await self.wait_until_drained(timeout_s=60.0))
        await asyncio.sleep(1.5)  # the monitor (evaluate_interval_s 1) judges the full window
        await self.shutdown()
        return 0

    monkeypatch.setattr(Runtime, "wait_for_signal", drain_then_evaluate)
    path = tmp_path / "bot.db"

    async def enqueue() -> None:
        async with SQLiteStore(path) as store:
            await store.enqueue_many(
                [
                    NewTask(queue="outbox", partition_key=f"chat-{i % 40}", payload={"account": i % 3})
                    for i in range(200)
                ]
            )

    asyncio.run(enqueue())
    caplog.set_level(logging.INFO)
    argv = ["run", "--db", str(path), "--queue", "outbox", "--send", "serve_send:send"]
    argv += ["--lock-key", "serve_send:account_lock", "--nodes", "4", "--idle-max-s", "0.1"]
    assert main(argv) == 0
    assert evaluated == [True]

    async def claimed() -> tuple[int, int, int]:
        async with SQLiteStore(path, read_only=True) as store:
            stats = await store.stats("outbox")
            totals = (await cluster_snapshot(store, (60.0,))).totals
            return stats.counts[TaskStatus.DONE], int(totals.get(ev.CLAIMS, 0)), int(totals.get(ev.LOCK_CONTENDED, 0))

    done, claims, contended = asyncio.run(claimed())
    assert done == 200
    assert contended == 0  # one process, one pool: its nodes only ever took turns
    assert claims >= 200  # enough claims for the relative rules to be judged (min_events 50)
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("asynccoord.serve.stopped") for m in messages)
    assert [m for m in messages if "alert_firing" in m] == []


@pytest.mark.parametrize(
    ("given", "parsed"),
    [([], 86400.0), (["--done-retention-s", "keep"], None), (["--done-retention-s", "3600"], 3600.0)],
)
def test_run_takes_a_done_retention_or_keep(given: list[str], parsed: float | None) -> None:
    args = build_parser().parse_args(["run", "--db", "x.db", "--send", "asyncio:sleep", *given])
    assert args.done_retention_s == parsed


@pytest.fixture(scope="module")
def wide_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database whose ``status`` and ``dead`` outputs are each far larger than a pipe's buffer (64 KiB)."""
    path = tmp_path_factory.mktemp("wide") / "wide.db"

    async def fill() -> None:
        async with SQLiteStore(path) as store:
            await store.enqueue_many([NewTask(queue=f"queue-{i:05d}", payload=i) for i in range(4000)])
            await store.enqueue_many(
                [NewTask(queue="outbox", payload=i, partition_key=f"chat-{i}", max_attempts=1) for i in range(2000)]
            )
            claimed = await store.claim("outbox", node_id="n", limit=2000)
            await asyncio.gather(*(store.fail(t, "HTTPError: 400 Bad Request " + "x" * 100) for t in claimed))
            assert (await store.stats("outbox")).counts[TaskStatus.DEAD] == 2000

    asyncio.run(fill())
    return path


@pytest.mark.parametrize(
    "command",
    [
        ["status", "--color", "never"],
        ["status", "--json"],
        ["dead", "--queue", "outbox", "--limit", "2000", "--color", "never"],
        ["dead", "--queue", "outbox", "--limit", "2000", "--json"],
    ],
    ids=" ".join,
)
def test_a_reader_that_leaves_early_ends_the_command_quietly_with_status_0(wide_db: Path, command: list[str]) -> None:
    """``status | head -1``: the command's output fills the pipe, the reader takes a little and closes it."""
    argv = [sys.executable, "-m", "asynccoord", *command, "--db", str(wide_db)]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        first = proc.stdout.read(200)  # the writer is blocked on a full pipe by then, or soon
        proc.stdout.close()
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert len(first) == 200
    assert (proc.returncode, err.decode()) == (0, "")


@pytest.mark.parametrize(
    ("given", "overrun_s"), [([], None), (["--send-overrun-s", "0"], 0.0), (["--send-overrun-s", "2.5"], 2.5)]
)
def test_run_passes_send_overrun_s_to_the_nodes(tmp_path: Path, given: list[str], overrun_s: float | None) -> None:
    """``--send-overrun-s`` reaches ``NodeConfig.send_overrun_s`` (unset: None, one more send timeout)."""
    parser = argparse.ArgumentParser()
    configure_run(parser)
    args = parser.parse_args(["--db", str(tmp_path / "o.db"), "--send", "asyncio:sleep", *given])
    _send, _lock_key, config = check_run(args)
    assert config.send_overrun_s == overrun_s
    assert not (tmp_path / "o.db").exists()


def test_run_posts_its_alerts_to_webhooks_and_serves_its_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--alert-webhook`` and ``--metrics-port``: the monitor of a process hosted by ``run`` posts
    the alerts it raises (3 tasks dead after one failed attempt each: ``dead_letters``) and serves
    the process's counters, and its queue's gauges, for Prometheus while it runs."""
    monkeypatch.syspath_prepend(str(TESTS / "workers"))
    posted: list[dict[str, Any]] = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            posted.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    hooks = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=hooks.serve_forever, daemon=True).start()
    with socket.socket() as probe:  # a free port for the metrics
        probe.bind(("127.0.0.1", 0))
        metrics_port = probe.getsockname()[1]
    scraped: list[str] = []

    async def drain_then_scrape(self: Runtime, signals: object = ()) -> int:
        assert await self.wait_until_drained(timeout_s=30.0)
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        scraped.append(await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read().decode()))
        deadline = time.monotonic() + 20.0
        while not any(p["rule"] == "dead_letters" for p in posted) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await self.shutdown()
        return 0

    monkeypatch.setattr(Runtime, "wait_for_signal", drain_then_scrape)
    path = tmp_path / "bot.db"

    async def enqueue() -> None:
        async with SQLiteStore(path) as store:
            await store.enqueue_many([NewTask(queue="outbox", payload=i, max_attempts=1) for i in range(3)])

    asyncio.run(enqueue())
    argv = ["run", "--db", str(path), "--queue", "outbox", "--send", "serve_send:fail", "--idle-max-s", "0.1"]
    argv += ["--alert-webhook", f"http://127.0.0.1:{hooks.server_port}/hook", "--metrics-port", str(metrics_port)]
    argv += ["--alert-label", "cluster=prod", "--alert-label", "region=eu-1"]
    try:
        assert main(argv) == 0
    finally:
        hooks.shutdown()
        hooks.server_close()
    [firing] = [p for p in posted if p["rule"] == "dead_letters" and p["state"] == "firing"]
    assert firing["value"] == 3
    assert firing["labels"] == {"cluster": "prod", "region": "eu-1"}  # which cluster, in every notice
    assert firing["text"].startswith("[cluster=prod region=eu-1] "), firing["text"]
    [page] = scraped
    dead = [
        line for line in page.splitlines() if line.startswith("asynccoord_events_total{") and "dead_lettered" in line
    ]
    assert len(dead) == 1, dead
    assert float(dead[0].split()[-1]) == 3.0, dead
    # The queue's state, read from the database: the 3 dead tasks, and the 8 nodes draining it.
    for line in (
        'asynccoord_queue_tasks{queue="outbox",status="dead"} 3.0',
        'asynccoord_queue_tasks{queue="outbox",status="pending"} 0.0',
        'asynccoord_queue_tasks{queue="outbox",status="running"} 0.0',
        'asynccoord_queue_oldest_pending_age_seconds{queue="outbox"} 0.0',
        'asynccoord_live_nodes{queue="outbox"} 8.0',
        "asynccoord_queue_stats_up 1.0",
    ):
        assert line in page.splitlines(), line
    with socket.socket() as again:  # the endpoint closed with the command: nothing listens there
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (the scrape's connection may linger)
        again.bind(("127.0.0.1", metrics_port))


def test_run_names_a_taken_metrics_port(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["run", "--db", str(tmp_path / "bot.db"), "--send", "asyncio:sleep", "--metrics-port", str(port)]
        assert main([*argv, "--rate-limit", "chat=1/1s"]) == 1
    assert f"--metrics-port {port}: cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # stopped before the database (and its limits) were touched


def _refused_redis_url() -> str:
    """A redis:// URL of a local port nothing listens on: every connection is refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"redis://127.0.0.1:{probe.getsockname()[1]}/0"


def test_run_with_an_unreachable_lock_store_creates_no_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    need_redis_py()  # no server needed, only redis-py
    argv = ["run", "--db", str(tmp_path / "bot.db"), "--send", "asyncio:sleep", "--lock-store", _refused_redis_url()]
    assert main([*argv, "--rate-limit", "chat=1/1s"]) == 1
    err = capsys.readouterr().err
    assert "asynccoord run: error: cannot connect to <RedisLockStore" in err, err
    assert list(tmp_path.iterdir()) == []  # the lock store is opened before the database is created


def test_run_with_an_unreachable_lock_store_creates_no_postgresql_schema(capsys: pytest.CaptureFixture[str]) -> None:
    problem = postgres_problem()
    if problem is not None:
        unavailable("PostgreSQL", problem)
    need_redis_py()  # no server needed, only redis-py
    schema = new_schema("cli")
    argv = ["run", "--db", PG_DSN, "--schema", schema, "--send", "asyncio:sleep", "--lock-store", _refused_redis_url()]
    try:
        assert main(argv) == 1
        assert pg_rows("SELECT 1 FROM pg_namespace WHERE nspname = $1", schema) == []
    finally:
        drop_schemas(schema)
    assert "asynccoord run: error: cannot connect to <RedisLockStore" in capsys.readouterr().err


@pytest.mark.parametrize(("given", "busy_timeout_s"), [([], 30.0), (["--busy-timeout-s", "4"], 4.0)])
def test_run_passes_busy_timeout_s_to_the_sqlite_store(tmp_path: Path, given: list[str], busy_timeout_s: float) -> None:
    """``--busy-timeout-s`` reaches the SQLite store's ``StoreConfig.busy_timeout_s`` (unset: the default)."""
    parser = argparse.ArgumentParser()
    configure_run(parser)
    args = parser.parse_args(["--db", str(tmp_path / "b.db"), "--send", "asyncio:sleep", *given])
    check_run(args)
    store = open_store(args.db, **store_options(args))
    assert store.config.busy_timeout_s == busy_timeout_s
    assert not (tmp_path / "b.db").exists()


@pytest.mark.parametrize(
    ("db", "value", "message"),
    [
        ("postgresql://u@h/d", "4", "--busy-timeout-s applies to an SQLite --db only, got --db 'postgresql://u@h/d'"),
        ("b.db", "0", "--busy-timeout-s"),
        ("b.db", "nan", "--busy-timeout-s"),
    ],
)
def test_run_refuses_a_busy_timeout_it_cannot_apply(tmp_path: Path, db: str, value: str, message: str) -> None:
    parser = argparse.ArgumentParser()
    configure_run(parser)
    args = parser.parse_args(["--db", db, "--send", "asyncio:sleep", "--busy-timeout-s", value])
    with pytest.raises(InvalidArgumentError, match=re.escape(message)):
        check_run(args)
