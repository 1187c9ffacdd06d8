"""An SQLite store notices that its file was deleted or replaced under it (real files).

:class:`~asynccoord.backends.sqlite.identity.FileIdentity` compares the path's
``(st_dev, st_ino)`` with the file opened, on a fake clock here; the store tests use
the real one (one look every 2 s).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from asynccoord import NewTask, SQLiteStore, StoreFileReplacedError
from asynccoord.backends.sqlite.identity import CHECK_INTERVAL_S, FileIdentity
from asynccoord.errors import UNRECOVERABLE_STORE_ERRORS

QUEUE = "q"


def remove_database(path: Path) -> None:
    for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        name.unlink(missing_ok=True)


async def read_until_it_fails(store: SQLiteStore) -> None:
    """Read the store every 50 ms, for at most one look at the path and 5 s more."""
    deadline = time.monotonic() + CHECK_INTERVAL_S + 5.0
    while time.monotonic() < deadline:
        await store.stats(QUEUE)
        await asyncio.sleep(0.05)


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def test_a_deleted_file_is_named_as_deleted_at_the_next_look(tmp_path: Path) -> None:
    path = tmp_path / "f.db"
    path.write_bytes(b"")
    clock = FakeClock()
    identity = FileIdentity(str(path), interval_s=2.0, clock=clock)
    path.unlink()
    identity.check()  # not time to look yet: one stat per interval at most
    clock.now_s += 2.0
    with pytest.raises(StoreFileReplacedError) as caught:
        identity.check()
    assert str(caught.value).startswith(
        f"the database file {str(path)!r} was deleted or moved while this process had it open"
    )
    assert "\n" not in str(caught.value)


def test_a_file_moved_over_the_path_is_named_as_a_replacement_and_stays_an_error(tmp_path: Path) -> None:
    path = tmp_path / "f.db"
    path.write_bytes(b"")
    clock = FakeClock()
    identity = FileIdentity(str(path), interval_s=2.0, clock=clock)
    clock.now_s += 2.0
    identity.check()  # the same file: nothing to say
    other = tmp_path / "new.db"
    other.write_bytes(b"")
    os.replace(other, path)
    clock.now_s += 2.0
    with pytest.raises(StoreFileReplacedError, match=r"was replaced by another file"):
        identity.check()
    with pytest.raises(StoreFileReplacedError, match=r"was replaced by another file"):
        identity.check()  # sticky, without waiting for the next look


def test_the_error_ends_nodes_like_a_closed_store() -> None:
    assert StoreFileReplacedError in UNRECOVERABLE_STORE_ERRORS


@pytest.mark.parametrize("how", ["deleted", "replaced"])
async def test_every_call_of_a_store_raises_once_its_file_is_deleted_or_replaced(tmp_path: Path, how: str) -> None:
    path = tmp_path / "f.db"
    async with SQLiteStore(path, wakeup=False) as store:
        await store.enqueue(QUEUE, {"n": 1})
        remove_database(path)
        if how == "replaced":
            async with SQLiteStore(path, wakeup=False) as other:
                await other.enqueue_many([NewTask(queue=QUEUE, payload={"n": i}) for i in range(10)])
        with pytest.raises(StoreFileReplacedError, match=f"was {how}") as caught:
            await read_until_it_fails(store)
        assert repr(str(path)) in str(caught.value)
        with pytest.raises(StoreFileReplacedError):  # a write too, at once
            await store.enqueue(QUEUE, {"n": 2})


async def test_a_read_only_store_notices_a_replaced_file_too(tmp_path: Path) -> None:
    path = tmp_path / "f.db"
    async with SQLiteStore(path, wakeup=False) as writer:
        await writer.enqueue(QUEUE, {"n": 1})
    async with SQLiteStore(path, read_only=True) as store:
        await store.stats(QUEUE)
        remove_database(path)
        async with SQLiteStore(path, wakeup=False):
            pass
        with pytest.raises(StoreFileReplacedError, match="was replaced by another file"):
            await read_until_it_fails(store)


async def test_a_store_whose_file_stays_says_nothing(tmp_path: Path) -> None:
    path = tmp_path / "f.db"
    async with SQLiteStore(path, wakeup=False) as store:
        deadline = time.monotonic() + CHECK_INTERVAL_S + 0.5
        while time.monotonic() < deadline:
            await store.stats(QUEUE)
            await asyncio.sleep(0.1)


async def test_a_store_opened_by_a_relative_path_survives_a_change_of_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite opened the file by its absolute name: a later ``os.chdir`` (a send's, say) is no deletion."""
    (tmp_path / "here").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    async with SQLiteStore("rel.db", wakeup=False) as store:
        await store.enqueue(QUEUE, {"n": 1})
        os.chdir(tmp_path / "elsewhere")
        deadline = time.monotonic() + CHECK_INTERVAL_S + 0.5
        while time.monotonic() < deadline:
            await store.stats(QUEUE)
            await asyncio.sleep(0.1)
        assert (await store.enqueue(QUEUE, {"n": 2})).created
        assert (await store.stats(QUEUE)).total == 2
