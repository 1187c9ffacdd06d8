"""Shared fixtures: a fake clock, stores on every backend, and real subprocesses.

Fixtures
--------
``clock``
    A :class:`FakeClock` (seconds since the epoch) that moves only when told.
``db_path``
    A fresh SQLite file path under ``tmp_path`` (not created yet).
``backend``
    ``"memory"``, ``"sqlite"`` or ``"postgres"``: tests that use it (directly or through
    ``store`` / ``make_store``) run once per backend. PostgreSQL gets a schema of its own per
    test, empty; without the service it is skipped, with ``CI=true`` failed (``services.py``).
``make_store``
    ``await make_store(config=..., clock=..., path=...)`` opens a store of the current
    backend; every store it opened is closed at teardown. ``clock`` defaults to the
    ``clock`` fixture; pass ``clock=None`` for the real clock (``time.time`` for the
    memory store, SQLite's ``julianday('now')`` for SQLite).
``store``
    ``await make_store()``: an open store on the fake clock.
``python``
    A :class:`PythonRunner` that runs Python code, scripts or modules as real OS
    processes with this interpreter (the one asynccoord is installed in); processes
    it spawned and that are still alive are killed at teardown.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import pytest
from exclusive import pytest_collection_modifyitems, pytest_configure, pytest_runtest_protocol  # noqa: F401
from groups import pytest_collection_finish, pytest_runtest_setup  # noqa: F401
from services import ServiceStores, drop_tracked_schemas
from support import FakeClock

from asynccoord import MemoryStore, SQLiteStore, StoreConfig
from asynccoord.node.batch import LocklessBatch

TESTS_DIR = Path(__file__).resolve().parent
WORKERS_DIR = TESTS_DIR / "workers"
DATA_DIR = TESTS_DIR / "data"
BACKENDS = ("memory", "sqlite", "postgres")

_DEFAULT: Any = object()


class MakeStore(Protocol):
    def __call__(
        self,
        *,
        config: StoreConfig | None = None,
        clock: Callable[[], float] | None = _DEFAULT,
        path: str | os.PathLike[str] | None = None,
        wakeup: bool = True,
    ) -> Awaitable[MemoryStore | SQLiteStore]: ...


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Drop the PostgreSQL schemas this process's tests used (each xdist worker has its own)."""
    drop_tracked_schemas()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "coord.db"


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def make_store(backend: str, db_path: Path, clock: FakeClock) -> AsyncIterator[MakeStore]:
    opened: list[MemoryStore | SQLiteStore] = []
    fake_clock = clock
    services = ServiceStores()  # postgres / redis: a fresh schema or key prefix per test

    async def make(
        *,
        config: StoreConfig | None = None,
        clock: Callable[[], float] | None = _DEFAULT,
        path: str | os.PathLike[str] | None = None,
        wakeup: bool = True,
    ) -> MemoryStore | SQLiteStore:
        chosen = fake_clock if clock is _DEFAULT else clock
        store: MemoryStore | SQLiteStore
        if backend == "memory":
            store = MemoryStore(config=config, clock=chosen)
        elif backend == "sqlite":
            store = SQLiteStore(path if path is not None else db_path, config=config, clock=chosen, wakeup=wakeup)
        else:
            store = await services.open(backend, config=config, clock=chosen, path=path)  # type: ignore[assignment]
        await store.open()
        opened.append(store)
        return store

    yield make
    for store in reversed(opened):
        await store.close()
    await services.cleanup()


@pytest.fixture
async def store(make_store: MakeStore) -> MemoryStore | SQLiteStore:
    return await make_store()


class PythonRunner:
    """Run Python as real OS processes, with this interpreter and a controlled environment.

    ``env`` entries override the inherited environment; a value of None removes the
    variable. Every process runs with the repository root as working directory.
    """

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self._spawned: list[subprocess.Popen[str]] = []

    def _env(self, env: Mapping[str, str | None] | None) -> dict[str, str]:
        merged = dict(os.environ)
        for key, value in (env or {}).items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
        return merged

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str | None] | None = None,
        input: str | None = None,
        timeout_s: float = 60.0,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``python *argv`` to completion; with ``check``, fail the test on a non-zero exit."""
        proc = subprocess.run(
            [sys.executable, *argv],
            cwd=self.cwd,
            env=self._env(env),
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if check and proc.returncode != 0:
            pytest.fail(f"python {' '.join(argv)} exited with {proc.returncode}\n--- stderr ---\n{proc.stderr}")
        return proc

    def run_code(self, code: str, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run a code snippet (``python -c code *args``)."""
        return self.run(["-c", code, *args], **kwargs)

    def run_module(self, module: str, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run a module (``python -m module *args``)."""
        return self.run(["-m", module, *args], **kwargs)

    def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str | None] | None = None,
    ) -> subprocess.Popen[str]:
        """Start ``python *argv`` with piped stdin/stdout/stderr (text, line-buffered); killed at teardown."""
        proc = subprocess.Popen(
            [sys.executable, *argv],
            cwd=self.cwd,
            env=self._env(env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self._spawned.append(proc)
        return proc

    def spawn_worker(self, *args: str, env: Mapping[str, str | None] | None = None) -> subprocess.Popen[str]:
        """Start ``tests/workers/queue_worker.py *args`` (see that file for the modes)."""
        return self.spawn([str(WORKERS_DIR / "queue_worker.py"), *args], env=env)

    def cleanup(self) -> None:
        for proc in self._spawned:
            if proc.poll() is None:
                proc.kill()
            try:
                proc.communicate(timeout=10)
            except (subprocess.TimeoutExpired, ValueError):
                pass
        self._spawned.clear()


@pytest.fixture
def python() -> Iterator[PythonRunner]:
    runner = PythonRunner(TESTS_DIR.parent)
    try:
        yield runner
    finally:
        runner.cleanup()


# --- the node tests' two ways of handling a claim (tests/node) ---------------------------------


@pytest.fixture(params=["slots", "batch"])
def pipeline(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """NodeConfig keywords for each of the two ways a node handles a claim's tasks.

    ``slots``: one asyncio task per task (the default of an ordered queue with ``claim_next``);
    ``batch``: a :class:`~asynccoord.node.batch.LocklessBatch` per claim (no lock, no
    commit-and-continue). A test that takes it runs once per way, and fails if its nodes did
    not take the way it names (a test with a ``lock_key`` always takes ``slots``).
    """
    batches: list[LocklessBatch] = []
    run = LocklessBatch.run

    async def counted(self: LocklessBatch) -> None:
        batches.append(self)
        await run(self)

    monkeypatch.setattr(LocklessBatch, "run", counted)
    yield {"claim_next": False} if request.param == "batch" else {}
    assert bool(batches) == (request.param == "batch"), f"the nodes took the other way than {request.param!r}"
