"""The public surface is explicit, and the private hooks we borrow still exist."""

from __future__ import annotations
import __future__

import inspect
import sqlite3
import subprocess
import sys
import types

import aiosqlite

import asynccoord
from asynccoord.backends.sqlite.writer import raw_connection, run_on_thread


def public_attributes(module: types.ModuleType) -> set[str]:
    """Names a user would see: not underscored, not a submodule, not a __future__ feature."""
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and not isinstance(value, __future__._Feature)
    }


def test_all_names_exist_and_are_unique() -> None:
    assert isinstance(asynccoord.__all__, tuple)
    assert len(set(asynccoord.__all__)) == len(asynccoord.__all__)
    missing = [name for name in asynccoord.__all__ if not hasattr(asynccoord, name)]
    assert missing == []


def test_every_public_attribute_is_in_all() -> None:
    for name in asynccoord.__all__:  # the stores of extras are imported on first access
        getattr(asynccoord, name)
    exported = set(asynccoord.__all__)
    assert public_attributes(asynccoord) - exported == set()
    assert exported - public_attributes(asynccoord) == {"__version__"}


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from asynccoord import *", namespace)
    namespace.pop("__builtins__")
    assert set(namespace) == set(asynccoord.__all__)


def test_exported_objects_claim_the_package() -> None:
    """Classes and functions re-exported at the top level come from asynccoord itself."""
    for name in asynccoord.__all__:
        value = getattr(asynccoord, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert value.__module__.startswith("asynccoord."), (name, value.__module__)


def test_submodule_all_names_exist() -> None:
    for module in (
        asynccoord.errors,
        asynccoord.config,
        asynccoord.models,
        asynccoord.partition,
        asynccoord.events,
        asynccoord.validation,
    ):
        assert [n for n in module.__all__ if not hasattr(module, n)] == [], module.__name__


def test_version_is_a_string() -> None:
    assert isinstance(asynccoord.__version__, str)
    assert asynccoord.__version__.count(".") >= 2


def test_aiosqlite_still_has_the_private_hooks_we_use() -> None:
    assert inspect.iscoroutinefunction(aiosqlite.Connection._execute)
    assert isinstance(inspect.getattr_static(aiosqlite.Connection, "_conn"), property)


async def test_aiosqlite_hooks_work_on_a_real_connection() -> None:
    async with aiosqlite.connect(":memory:", isolation_level=None) as conn:
        assert isinstance(conn._conn, sqlite3.Connection)
        assert raw_connection(conn) is conn._conn

        def transaction(db: sqlite3.Connection) -> tuple[int, ...]:
            db.execute("BEGIN IMMEDIATE")
            db.execute("CREATE TABLE t (x)")
            db.executemany("INSERT INTO t VALUES (?)", [(1,), (2,), (3,)])
            db.execute("COMMIT")
            return tuple(r[0] for r in db.execute("SELECT x FROM t ORDER BY x"))

        assert await run_on_thread(conn, transaction, raw_connection(conn)) == (1, 2, 3)


def test_stores_of_extras_are_exported_and_imported_lazily() -> None:
    """``import asynccoord`` imports neither asyncpg nor redis; the first access to their stores does."""
    code = (
        "import sys, asynccoord\n"
        "assert 'asyncpg' not in sys.modules and 'redis' not in sys.modules, 'a driver was imported'\n"
        "assert 'PostgresStore' in dir(asynccoord) and 'RedisLockStore' in dir(asynccoord)\n"
        "from asynccoord.backends.postgres.store import PostgresStore\n"
        "assert asynccoord.PostgresStore is PostgresStore and 'asyncpg' in sys.modules\n"
        "from asynccoord.backends.redis import RedisLockStore\n"
        "assert asynccoord.RedisLockStore is RedisLockStore\n"
        "from asynccoord.backends.open import open_store\n"
        "assert asynccoord.open_store is open_store\n"
        "try:\n"
        "    asynccoord.NoSuchName\n"
        "except AttributeError as exc:\n"
        "    assert 'NoSuchName' in str(exc)\n"
        "else:\n"
        "    raise AssertionError('no AttributeError')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr


def test_stale_version_error_is_gone() -> None:
    """Nothing raises it, so nothing exports it: a stale commit is a LeaseLostError."""
    assert not hasattr(asynccoord, "StaleVersionError")
    assert not hasattr(asynccoord.errors, "StaleVersionError")


def test_without_the_drivers_star_import_works_and_the_stores_name_their_extra() -> None:
    """On the base install (no asyncpg, no redis) ``from asynccoord import *`` and ``hasattr`` work,
    and a store of an extra says which extra to install."""
    code = (
        "import sys\n"
        "sys.modules['asyncpg'] = None\n"  # as if not installed: importing it raises ModuleNotFoundError
        "sys.modules['redis'] = None\n"
        "import asynccoord, inspect\n"
        "from asynccoord import *\n"
        "assert 'PostgresStore' not in asynccoord.__all__ and 'RedisLockStore' not in asynccoord.__all__\n"
        "assert not hasattr(asynccoord, 'PostgresStore') and 'PostgresStore' not in dir(asynccoord)\n"
        "inspect.getmembers(asynccoord)\n"
        "try:\n"
        "    asynccoord.RedisLockStore\n"
        "except AttributeError as exc:\n"
        "    assert \"pip install 'asynccoord[redis]'\" in str(exc), exc\n"
        "else:\n"
        "    raise AssertionError('no AttributeError')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
