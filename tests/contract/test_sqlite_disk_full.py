"""An SQLite store on a full disk says so, with the folder and its free bytes.

The message builder is tested with SQLite's own error codes and a monkeypatched
``shutil.disk_usage``; where this process may mount a tmpfs (root, as on a developer's
container), a real full disk is tested too, through the store and the ``status`` command.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from services import unavailable

from asynccoord import SQLiteStore, StoreError
from asynccoord.backends.sqlite import diskfull
from asynccoord.backends.sqlite.diskfull import LOW_FREE_BYTES, disk_full_problem
from asynccoord.backends.sqlite.writer import map_sqlite_error

SQLITE_IOERR_SHMSIZE = 4874  # what a read of a WAL database meets when the -shm file cannot grow


def sqlite_error(message: str, code: int) -> sqlite3.OperationalError:
    exc = sqlite3.OperationalError(message)
    exc.sqlite_errorcode = code  # as the driver sets it
    return exc


def free_bytes(monkeypatch: pytest.MonkeyPatch, free: int, total: int = 524_288) -> list[str]:
    asked: list[str] = []

    def disk_usage(path: str) -> Any:
        asked.append(path)
        return shutil._ntuple_diskusage(total, total - free, free)  # type: ignore[attr-defined]

    monkeypatch.setattr(diskfull.shutil, "disk_usage", disk_usage)
    return asked


def test_an_io_error_on_a_full_folder_names_the_folder_and_its_free_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = free_bytes(monkeypatch, 0)
    path = str(tmp_path / "f.db")
    error = map_sqlite_error(sqlite_error("disk I/O error", SQLITE_IOERR_SHMSIZE), f"cannot open {path!r}", path=path)
    assert type(error) is StoreError
    assert str(error) == (
        f"cannot open {path!r}: the disk holding its folder {str(tmp_path)!r} is full (0 bytes free of 524,288): "
        "free some space there (SQLite also writes <file>-wal and <file>-shm beside the database) "
        "(OperationalError: disk I/O error)"
    )
    assert asked == [str(tmp_path)]


def test_sqlite_full_is_a_full_disk_whatever_is_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    free_bytes(monkeypatch, 5 * LOW_FREE_BYTES, total=100 * LOW_FREE_BYTES)
    exc = sqlite_error("database or disk is full", sqlite3.SQLITE_FULL)
    problem = disk_full_problem(str(tmp_path / "f.db"), exc)
    assert problem is not None
    assert problem.startswith(f"the disk holding its folder {str(tmp_path)!r} is full (5,242,880 bytes free of ")


def test_an_io_error_with_room_to_spare_is_not_put_down_to_the_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    free_bytes(monkeypatch, LOW_FREE_BYTES)
    path = str(tmp_path / "f.db")
    exc = sqlite_error("disk I/O error", SQLITE_IOERR_SHMSIZE)
    assert disk_full_problem(path, exc) is None
    assert str(map_sqlite_error(exc, "read", path=path)) == "read: OperationalError: disk I/O error"


def test_other_errors_and_no_path_never_look_at_the_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked = free_bytes(monkeypatch, 0)
    path = str(tmp_path / "f.db")
    assert disk_full_problem(path, sqlite_error("no such table: x", sqlite3.SQLITE_ERROR)) is None
    io = sqlite_error("disk I/O error", SQLITE_IOERR_SHMSIZE)
    assert str(map_sqlite_error(io, "read")) == "read: OperationalError: disk I/O error"
    assert asked == []


@contextlib.contextmanager
def small_disk(folder: Path) -> Iterator[Path]:
    """A 512 KiB tmpfs mounted at ``folder``; skips the test (fails it in CI) where this process may not mount one."""
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(folder)], capture_output=True, text=True, check=False
    )
    if mounted.returncode != 0:
        unavailable("a tmpfs mount (a full disk is tested with a simulated one too)", mounted.stderr.strip())
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def fill(disk: Path) -> None:
    with contextlib.suppress(OSError), open(disk / "fill", "wb", buffering=0) as f:
        while True:
            f.write(b"\0" * 4096)


async def write_until_it_fails(store: SQLiteStore) -> None:
    for _ in range(100):  # 2 MB: more than the disk holds
        await store.enqueue("q", "x" * 20_000)


async def test_a_real_full_disk_is_named_at_a_write_and_at_open(tmp_path: Path, python: Any) -> None:
    with small_disk(tmp_path / "disk") as disk:
        path = disk / "f.db"
        async with SQLiteStore(path, wakeup=False) as store:
            await store.enqueue("q", 1)
            fill(disk)
            with pytest.raises(StoreError, match=rf"^write operation: the disk holding its folder '{disk}' is full "):
                await write_until_it_fails(store)
            os.remove(disk / "fill")  # room for the close's checkpoint
        fill(disk)  # a status then has to size a new -shm file
        status = python.run_module("asynccoord", "status", "--db", str(path), check=False)
        assert status.returncode == 1, status.stderr
        assert status.stderr.startswith(
            f"asynccoord status: error: cannot open {str(path)!r}: the disk holding its folder {str(disk)!r} is full "
            "(0 bytes free of 524,288)"
        ), status.stderr
        os.remove(disk / "fill")
        assert python.run_module("asynccoord", "status", "--db", str(path)).returncode == 0


async def test_a_first_open_stopped_by_a_full_disk_leaves_no_file_behind(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk") as disk:
        fill(disk)
        path = disk / "new.db"
        with pytest.raises(StoreError, match=r"the disk holding its folder .* is full"):
            async with SQLiteStore(path, wakeup=False):
                pass
        assert sorted(p.name for p in disk.iterdir()) == ["fill"]  # before: an empty new.db stayed


async def test_a_full_disk_never_removes_a_file_that_was_there(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk") as disk:
        path = disk / "old.db"
        async with SQLiteStore(path, wakeup=False) as store:
            await store.enqueue("q", 1)
        for companion in (Path(f"{path}-wal"), Path(f"{path}-shm")):
            companion.unlink(missing_ok=True)
        empty = disk / "empty.db"
        empty.write_bytes(b"")  # an empty file of the application's: not this open's to remove
        fill(disk)
        for existing in (path, empty):
            with pytest.raises(StoreError):
                async with SQLiteStore(existing, wakeup=False):
                    pass
        assert path.stat().st_size > 0
        assert empty.exists()
