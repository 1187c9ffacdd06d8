"""The ``--lock-store`` option of the commands: a Redis lock store named by its URL.

``run`` takes its nodes' locks there (``Runtime(lock_store=...)``); ``status`` and
``dashboard`` list the locks held there beside the database's. The URL and the key prefix
are checked before anything opens, so a typo is a usage error, not a connection failure
halfway through a start. ``status`` and ``dashboard`` wait :data:`LOCK_STORE_WAIT_S` for it,
and report a lock store they cannot open or read as unreachable (:class:`ReportedLockStore`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from ..errors import InvalidArgumentError, StoreError

__all__ = (
    "LOCK_STORE_WAIT_S",
    "REDIS_SCHEMES",
    "ReportedLockStore",
    "add_lock_store_options",
    "check_lock_store_options",
    "open_lock_store",
    "persistence_told_in_output",
)

NO_PERSISTENCE_EVENT = "asynccoord.redis.no_persistence"
"""The stable event name of the lock store's warning of a server without an append-only file."""

REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
"""The URL schemes ``--lock-store`` takes."""

LOCK_STORE_WAIT_S = 3.0
"""How long ``status`` and ``dashboard`` wait for the lock store, seconds (its ``reconnect_timeout_s``).

A Redis that refuses connections, or accepts them and never answers (stopped with SIGSTOP,
say), is reported unreachable after this long when it is opened, and after at most about
twice this long when it is read, instead of holding the report back."""


def add_lock_store_options(parser: argparse.ArgumentParser, *, purpose: str) -> None:
    """Add ``--lock-store URL`` and ``--lock-prefix PREFIX``; ``purpose`` ends the first's help text."""
    parser.add_argument(
        "--lock-store",
        metavar="URL",
        help=f"a Redis (redis://, rediss:// or unix:// URL; extra 'redis') {purpose}",
    )
    parser.add_argument(
        "--lock-prefix",
        metavar="PREFIX",
        default=None,
        help="with --lock-store: the key prefix of the lock store (default 'asynccoord:')",
    )


def check_lock_store_options(args: argparse.Namespace) -> Any:
    """The (unopened) lock store that ``--lock-store`` and ``--lock-prefix`` name; None without ``--lock-store``.

    Raises:
        InvalidArgumentError: ``--lock-prefix`` without ``--lock-store``, or what
            :func:`open_lock_store` refuses.
    """
    url = getattr(args, "lock_store", None)
    prefix = getattr(args, "lock_prefix", None)
    if url is None:
        if prefix is not None:
            raise InvalidArgumentError("--lock-prefix applies to a --lock-store only: add --lock-store redis://...")
        return None
    return open_lock_store(url, prefix=prefix)


def open_lock_store(url: str, *, prefix: str | None = None, reconnect_timeout_s: float | None = None) -> Any:
    """A :class:`~asynccoord.backends.redis.RedisLockStore` (not yet opened) for ``--lock-store``.

    Args:
        url: A ``redis://``, ``rediss://`` or ``unix://`` URL.
        prefix: The lock store's key prefix; None for its default (``"asynccoord:"``).
        reconnect_timeout_s: The store's ``reconnect_timeout_s`` (also its longest wait for a
            reply), seconds; None for its default (10).

    Raises:
        InvalidArgumentError: not a Redis URL, a bad prefix, or redis-py is not installed.
    """
    if not isinstance(url, str) or not url.startswith(REDIS_SCHEMES):
        raise InvalidArgumentError(f"--lock-store takes a Redis URL ({', '.join(REDIS_SCHEMES)}...)")
    try:
        from ..backends.redis import RedisLockStore
    except ImportError as exc:
        raise InvalidArgumentError("--lock-store needs redis-py: pip install 'asynccoord[redis]'") from exc
    options: dict[str, Any] = {}
    if prefix is not None:
        options["prefix"] = prefix
    if reconnect_timeout_s is not None:
        options["reconnect_timeout_s"] = reconnect_timeout_s
    return RedisLockStore(url, **options)


class ReportedLockStore:
    """A lock store that reports read (``status``, ``dashboard``), opened by the first report that reaches it.

    A lock store down when the command starts does not stop it: each report tries to open
    it (:meth:`reach`) until it opens, and one that cannot says why in its
    ``lock_store.error``. Once open, the store reconnects by itself after an outage.

    Attributes:
        store: The lock store (a :class:`~asynccoord.backends.redis.RedisLockStore`).
        opened: Whether :meth:`reach` opened it (and :meth:`aclose` has not closed it yet).
    """

    __slots__ = ("opened", "store")

    def __init__(self, store: Any) -> None:
        self.store = store
        self.opened = False

    def __repr__(self) -> str:
        return f"<ReportedLockStore {self.store!r} opened={self.opened}>"

    async def reach(self) -> str | None:
        """Open the store unless it is open: None once it is, else why it could not be (the error's text)."""
        if not self.opened:
            try:
                await self.store.open()
            except StoreError as exc:
                return str(exc)
            self.opened = True
        return None

    async def aclose(self) -> None:
        """Close the store if :meth:`reach` opened it."""
        if self.opened:
            self.opened = False
            await self.store.close()


@contextlib.contextmanager
def persistence_told_in_output() -> Iterator[None]:
    """Within the block, a lock store opened does not log ``asynccoord.redis.no_persistence``.

    For a command whose own output says that the lock store keeps no append-only file
    (``status``'s table does), so that it is said once. Other records of the lock store's
    logger pass; the record is known by its event name, :data:`NO_PERSISTENCE_EVENT`.
    Needs redis-py (as any ``--lock-store`` does).
    """
    from ..backends import redis as redis_backend

    def told_elsewhere(record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(NO_PERSISTENCE_EVENT)

    redis_backend.log.addFilter(told_elsewhere)
    try:
        yield
    finally:
        redis_backend.log.removeFilter(told_elsewhere)
