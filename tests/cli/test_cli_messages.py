"""``python -m asynccoord``: the command line says what is wrong, in one line, and changes nothing.

Real processes: a database this process may not read, a folder it may not enter or write
(under :func:`~support.bound_by_permissions`, so root is bound by the permission bits too).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import ROOT, bound_by_permissions

from asynccoord import SQLiteStore


def _cli(prefix: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m asynccoord *args`` under ``prefix``, run to its end."""
    return subprocess.run(
        [*prefix, sys.executable, "-m", "asynccoord", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _snapshot(folder: Path) -> dict[str, tuple[int, bytes]]:
    """Each file of ``folder`` (read as this test's user): its mode and its bytes."""
    return {p.name: (p.stat().st_mode, p.read_bytes()) for p in sorted(folder.iterdir())}


@pytest.fixture
def coord_db(tmp_path: Path) -> Iterator[Path]:
    """An asynccoord database with one pending task, alone in ``tmp_path/data``; its folder made usable again after."""
    db = tmp_path / "data" / "coord.db"
    db.parent.mkdir()

    async def prepare() -> None:
        async with SQLiteStore(db, wakeup=False) as store:
            await store.enqueue("q", "kept")

    asyncio.run(prepare())
    try:
        yield db
    finally:
        db.parent.chmod(0o755)


COMMANDS = {
    "run": ("run", "--send", "asyncio:sleep", "--nodes", "1"),
    "status": ("status",),
    "dead": ("dead", "--queue", "q"),
    "dead requeue": ("dead", "requeue", "--queue", "q", "--all"),
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("blocked", ["file", "folder"])
def test_a_database_this_process_may_not_read_is_named_with_the_permissions_at_fault(
    coord_db: Path, command: str, blocked: str
) -> None:
    """Before: ``run`` called the file read-only and advised ``SQLiteStore(path, read_only=True)``,
    which cannot read it either; ``status`` and ``dead`` said only "unable to open database file"
    (and, behind a folder this process may not enter, ``dead requeue`` said there is no database)."""
    prefix = bound_by_permissions()
    folder = coord_db.parent
    if blocked == "file":
        coord_db.chmod(0o000)
    else:
        folder.chmod(0o000)
    try:
        before = (folder.stat().st_mode, coord_db.stat().st_mode, _snapshot(folder))
        proc = _cli(prefix, *COMMANDS[command], "--db", str(coord_db))
        after = (folder.stat().st_mode, coord_db.stat().st_mode, _snapshot(folder))
    finally:
        folder.chmod(0o755)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == ""
    name = command.split()[0]
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"asynccoord {name}: error: cannot open {str(coord_db)!r} for reading"), line
    assert "permission denied" in line
    if blocked == "file":
        assert "may not even read the file (mode 000" in line
        assert "give this user read" in line
    else:
        assert f"on the folder {str(folder)!r} (mode 000" in line
        assert "may not enter" in line
    assert "read_only=True" not in line  # no advice that cannot work
    assert after == before  # nothing created, nothing changed


def test_run_in_a_folder_it_may_not_write_says_the_database_cannot_be_created(tmp_path: Path) -> None:
    """Before: the file, which did not exist yet, was "read-only for this process", with the advice
    to open it with ``SQLiteStore(path, read_only=True)``."""
    prefix = bound_by_permissions()
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o555)
    db = folder / "new.db"
    try:
        proc = _cli(prefix, "run", "--db", str(db), "--send", "asyncio:sleep", "--nodes", "1")
        left = sorted(p.name for p in folder.iterdir())
    finally:
        folder.chmod(0o755)
    assert proc.returncode == 1, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line == (
        f"asynccoord run: error: cannot create {str(db)!r}: its folder {str(folder)!r} is not writable by this "
        f"process (mode 555, owner uid {folder.stat().st_uid}): give this user write access to the folder, or put "
        "the database in a folder it can write"
    )
    assert left == []  # nothing created


_OPEN_READ_WRITE = """
import asyncio, sys
from asynccoord import ReadOnlyStoreError, SQLiteStore
async def main():
    try:
        async with SQLiteStore(sys.argv[1]):
            pass
    except ReadOnlyStoreError as exc:
        print(exc)
asyncio.run(main())
"""


@pytest.mark.parametrize("command", ["run", "dead requeue"])
def test_a_write_command_on_a_read_only_file_names_the_commands_that_read_it(coord_db: Path, command: str) -> None:
    """Before: the command advised ``SQLiteStore(path, read_only=True)``, a library call, to a CLI user."""
    prefix = bound_by_permissions()
    folder = coord_db.parent
    for companion in folder.iterdir():  # the database alone, as a read-only mount holds it
        if companion != coord_db:
            companion.unlink()
    coord_db.chmod(0o444)
    folder.chmod(0o555)
    try:
        before = _snapshot(folder)
        proc = _cli(prefix, *COMMANDS[command], "--db", str(coord_db))
        listed = _cli(prefix, *COMMANDS["dead"], "--db", str(coord_db))  # what the message says works
        library = subprocess.run(  # a library caller keeps the library's wording
            [*prefix, sys.executable, "-c", _OPEN_READ_WRITE, str(coord_db)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        after = _snapshot(folder)
    finally:
        folder.chmod(0o755)
    assert proc.returncode == 1, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line == (
        f"asynccoord {command.split()[0]}: error: {str(coord_db)!r} is read-only for this process (the file is not "
        "writable by this process): 'status' and 'dead' without an action can read it; to "
        f"{command}, give this user write access to the file and its folder (SQLite writes <file>-wal and "
        "<file>-shm beside it)"
    )
    assert (listed.returncode, listed.stderr) == (0, "")
    assert "open it with SQLiteStore(path, read_only=True) to read it" in library.stdout
    assert after == before  # nothing created, nothing changed
