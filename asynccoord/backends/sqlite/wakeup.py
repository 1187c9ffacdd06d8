"""Cross-process wake-ups for SQLite: a Unix datagram socket per store, registered beside the database.

SQLite has no NOTIFY, so each open store binds a :class:`WakeupChannel` and sends the
wake-ups it gives its own :class:`~asynccoord.notify.WorkNotifier` to the other stores of
the database as small datagrams. This is the shape of PostgreSQL's LISTEN/NOTIFY channel
(:class:`~asynccoord.backends.postgres.conn.PgListener`) with the kernel as the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import secrets
import socket
from collections.abc import Collection

from ...notify import WorkNotifier
from ...pauses import PauseBook
from ...releases import ReleaseSignal
from ...validation import check_int, check_name, check_non_negative, check_partitions

__all__ = (
    "MAX_DATAGRAM_BYTES",
    "MAX_WAKEUP_PARTITIONS",
    "SharedNotifier",
    "WakeupChannel",
    "decode_datagram",
    "decode_pauses",
    "decode_wakeup",
    "encode_pauses",
    "encode_wakeup",
    "wakeup_dir",
)

log = logging.getLogger(__name__)

MAX_WAKEUP_PARTITIONS = 512
"""Most partitions named for one queue in a datagram (more: it names none, waking any owner)."""

MAX_DATAGRAM_BYTES = 60_000
"""Largest datagram sent; a larger one is replaced by one naming no partitions."""

_MAX_SUN_PATH = 100  # sockaddr_un.sun_path is 108 bytes on Linux, 104 on macOS: keep a margin
_DEAD_PEER = (errno.ECONNREFUSED, errno.ENOENT, errno.ENOTSOCK)
_SKIPPED_PEER = (errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS, errno.EACCES, errno.EPERM)


def wakeup_dir(path: str) -> str:
    """The directory of wake-up sockets of the database at ``path`` (``<path>-wakeup``, absolute)."""
    return os.path.abspath(path) + "-wakeup"


class SharedNotifier(WorkNotifier):
    """A :class:`~asynccoord.notify.WorkNotifier` whose notifications also go to the other processes.

    :meth:`notify` wakes this process's nodes as before and hands the same notification
    to :attr:`channel` (when one is attached) to send after the current event-loop
    iteration; :meth:`deliver` is the receiving side (in process only, never sent on).
    """

    __slots__ = ("channel",)

    def __init__(self) -> None:
        super().__init__()
        self.channel: WakeupChannel | None = None

    def notify(self, queue: str, n: int = 1, partitions: Collection[int] | None = None) -> int:
        """As :meth:`WorkNotifier.notify`; also announced to the other processes on the database."""
        woken = super().notify(queue, n, partitions)
        channel = self.channel
        if channel is not None and n > 0:
            channel.announce(queue, n, partitions)
        return woken

    def deliver(self, queue: str, n: int, partitions: Collection[int] | None) -> int:
        """Wake this process's nodes for a notification from another process (not sent on)."""
        return super().notify(queue, n, partitions)

    def wake_all(self) -> None:
        """Wake every waiter and flag every armed node of this process (nothing is sent)."""
        for queue in list(self._waiters.keys() | self._armed.keys()):
            super().notify(queue, 1 << 30)


class WakeupChannel:
    """One store's datagram socket: receives other processes' notifications and sends its own.

    Without it, work another process enqueued is found only by the runtime's idle poll
    (:mod:`asynccoord.node.idlepoll`), up to ``idle_max_s`` later. Each open
    :class:`~asynccoord.backends.sqlite.store.SQLiteStore` binds a Unix datagram socket in
    a directory beside the database (``<database>-wakeup/``, one socket file per store,
    named ``<pid>-<random>``). After a write transaction commits, what the store tells its
    own :class:`~asynccoord.notify.WorkNotifier` (queue, count, partitions with new claimable
    work) is also sent, coalesced per event-loop iteration, as one small JSON datagram to
    every other socket of the directory; each receiving store hands it to its own notifier,
    which wakes at most ``count`` of its idle nodes owning one of the partitions (none in a
    process that owns none of them: no thundering herd). Lock releases travel the same way
    (the names of the locks :meth:`~asynccoord.backends.sqlite.store.SQLiteStore.release_lock`
    gave back), so a process waiting in line for a lock tries it at once instead of at its
    next poll (:mod:`asynccoord.releases`).

    Why not a file watcher (inotify on the ``-wal`` file, e.g. watchfiles, plus
    ``PRAGMA data_version``) or a ``data_version`` probe on a tight interval: every write of
    any process (heartbeats, commits, lock renewals) would wake every process, which would
    then have to read the database to learn whether any of its nodes has work, and nothing
    names the partitions; a probe also costs CPU while idle. A datagram names the
    partitions, costs nothing while idle (the socket sits in the event loop's selector: no
    timer, no thread, no write), and arrives in tens of microseconds. The standard library's
    ``socket`` and the event loop's ``add_reader`` do the job; no library is needed.

    Failure rules: a wake-up is a hint, never the only way work is found; a lost one leaves
    the work to the idle poll. Sends never block (a full receiver is skipped); a
    send that finds nobody bound to a socket file (``ECONNREFUSED``: its process died,
    ``kill -9`` included) or the file gone (``ENOENT``) unlinks it, so a dead process costs
    the others one failed send. A directory that cannot be made, or a socket that cannot be
    bound, leaves the store without the channel (logged); the store works without it. Unix
    only (``AF_UNIX``); a socket path longer than the kernel's limit goes through
    ``/proc/self/fd`` on Linux.

    Use :meth:`open` (a classmethod) in the event loop that will serve it; :meth:`close`
    when the store closes. Not thread-safe (one event loop).

    Args:
        directory: The directory of the database's wake-up sockets (see :func:`wakeup_dir`).
        notifier: Where received notifications go.
        releases: Where received lock releases go, and whose own releases are sent
            (None: none are carried).
        pauses: Where received provider pauses of locks go, and whose own are sent
            (:mod:`asynccoord.pauses`; None: none are carried).

    Attributes:
        name: This store's socket file name in ``directory``.
        sent: Datagrams sent so far.
        received: Notifications received and delivered so far.
        removed: Dead sockets unlinked so far.
    """

    def __init__(
        self,
        directory: str,
        notifier: SharedNotifier,
        releases: ReleaseSignal | None = None,
        pauses: PauseBook | None = None,
    ) -> None:
        self.directory = directory
        self.notifier = notifier
        self.releases = releases
        self.pauses = pauses
        self.name = f"{os.getpid()}-{secrets.token_hex(6)}"
        self.sent = 0
        self.received = 0
        self.removed = 0
        self._sock: socket.socket | None = None
        self._dir_fd: int | None = None
        self._prefix = directory  # how socket paths of the directory are reached (see _reach)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: dict[str, tuple[int, set[int] | None]] = {}
        self._released: dict[str, None] = {}  # lock names given back this iteration, in order
        self._paused: dict[str, float] = {}  # lock names paused by the provider this iteration: seconds
        self._flush_scheduled = False

    def __repr__(self) -> str:
        state = "open" if self._sock is not None else "closed"
        return f"<WakeupChannel {self.directory!r} {self.name} {state} sent={self.sent} received={self.received}>"

    @classmethod
    def open(
        cls,
        directory: str,
        notifier: SharedNotifier,
        releases: ReleaseSignal | None = None,
        pauses: PauseBook | None = None,
    ) -> WakeupChannel | None:
        """Bind this store's socket in ``directory`` (made if missing) and start receiving.

        Returns:
            The channel, attached to ``notifier`` (and to ``releases``' announcements);
            None when the platform has no Unix sockets or the directory or socket cannot
            be made (logged; the store goes on without cross-process wake-ups).
        """
        if not hasattr(socket, "AF_UNIX"):
            return None
        channel = cls(directory, notifier, releases, pauses)
        try:
            channel._bind()
        except OSError as exc:
            channel.close()
            log.warning("asynccoord.sqlite.wakeup_unavailable directory=%s error=%s", directory, exc)
            return None
        loop = asyncio.get_running_loop()
        assert channel._sock is not None
        loop.add_reader(channel._sock.fileno(), channel._on_readable)
        channel._loop = loop
        notifier.channel = channel
        if releases is not None:
            releases.announce = channel.announce_release
        if pauses is not None:
            pauses.announce = channel.announce_pause
        return channel

    def _bind(self) -> None:
        for attempt in range(3):  # another store may remove the empty directory between mkdir and bind
            os.makedirs(self.directory, exist_ok=True)
            self._prefix = self._reach()
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                sock.setblocking(False)
                sock.bind(os.path.join(self._prefix, self.name))
            except FileNotFoundError:
                sock.close()
                self._close_dir_fd()
                if attempt == 2:
                    raise
                continue
            except BaseException:
                sock.close()
                raise
            self._sock = sock
            return

    def _reach(self) -> str:
        """The prefix of socket paths: the directory itself, or ``/proc/self/fd/N`` when its path is too long."""
        if len(os.fsencode(self.directory)) + 1 + len(self.name) + 8 <= _MAX_SUN_PATH:
            return self.directory
        if not os.path.isdir("/proc/self/fd"):
            raise OSError(errno.ENAMETOOLONG, f"socket paths in {self.directory!r} exceed the Unix socket limit")
        self._dir_fd = os.open(self.directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        return f"/proc/self/fd/{self._dir_fd}"

    def _close_dir_fd(self) -> None:
        fd, self._dir_fd = self._dir_fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def close(self) -> None:
        """Stop receiving, drop what was not sent yet, unlink the socket and (if empty) the directory. Idempotent."""
        if self.notifier.channel is self:
            self.notifier.channel = None
        if self.releases is not None and self.releases.announce == self.announce_release:
            self.releases.announce = None
        if self.pauses is not None and self.pauses.announce == self.announce_pause:
            self.pauses.announce = None
        self._pending.clear()
        self._released.clear()
        self._paused.clear()
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self._prefix, self.name))
            with contextlib.suppress(OSError):  # not empty: other stores still use it
                os.rmdir(self.directory)
            loop, self._loop = self._loop, None
            if loop is None or loop.is_closed():
                sock.close()
            else:
                try:
                    running = asyncio.get_running_loop()
                except RuntimeError:
                    running = None
                if running is loop:
                    _release(loop, sock)
                else:  # the socket is the loop's to release (its selector is not thread-safe)
                    with contextlib.suppress(RuntimeError):  # closed meanwhile: its selector went with it
                        loop.call_soon_threadsafe(_release, loop, sock)
        self._close_dir_fd()

    # --- sending ------------------------------------------------------------------------

    def announce(self, queue: str, n: int, partitions: Collection[int] | None) -> None:
        """Queue a notification for the other processes; sent once the running callback returns.

        Notifications of one event-loop iteration are merged per queue (counts added,
        partitions joined) into one datagram per peer.
        """
        if self._sock is None:
            return
        earlier = self._pending.get(queue)
        parts = None if partitions is None else set(partitions)
        if earlier is not None:
            count, known = earlier
            n += count
            parts = None if known is None or parts is None else known | parts
        self._pending[queue] = (n, parts)
        self._schedule_flush()

    def announce_release(self, name: str) -> None:
        """Queue the release of lock ``name`` for the other processes (sent as :meth:`announce` sends)."""
        if self._sock is None:
            return
        self._released[name] = None
        self._schedule_flush()

    def announce_pause(self, name: str, pause_s: float) -> None:
        """Queue the provider's pause of lock ``name`` (seconds) for the other processes (a datagram of its own)."""
        if self._sock is None:
            return
        self._paused[name] = max(pause_s, self._paused.get(name, 0.0))
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled and self._loop is not None:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        pending, self._pending = self._pending, {}
        released, self._released = self._released, {}
        paused, self._paused = self._paused, {}
        sock = self._sock
        if not (pending or released or paused) or sock is None:
            return
        try:
            peers = [name for name in os.listdir(self._prefix) if name != self.name]
        except OSError:  # the directory is gone: nobody to wake (the idle polls find the work)
            return
        if not peers:
            return
        payloads = [encode_wakeup(pending, released)] if pending or released else []
        if paused:  # apart: a receiver of an earlier revision drops what it cannot read, not the work with it
            payloads.extend(encode_pauses(paused))
        for peer in peers:
            path = os.path.join(self._prefix, peer)
            try:
                for payload in payloads:
                    sock.sendto(payload, path)
                    self.sent += 1
            except OSError as exc:
                if exc.errno in _DEAD_PEER:
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                        self.removed += 1
                        log.info("asynccoord.sqlite.wakeup_removed socket=%s", peer)
                elif exc.errno not in _SKIPPED_PEER:
                    log.warning("asynccoord.sqlite.wakeup_send_failed socket=%s error=%s", peer, exc)

    # --- receiving ----------------------------------------------------------------------

    def _on_readable(self) -> None:
        sock = self._sock
        while sock is not None:
            try:
                data = sock.recv(MAX_DATAGRAM_BYTES + 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("asynccoord.sqlite.wakeup_receive_failed error=%s", exc)
                return
            if data[:1] == b"{":  # the provider's pauses of locks (encode_pauses)
                for name, pause_s in decode_pauses(data):
                    self.received += 1
                    if self.pauses is not None:
                        self.pauses.deliver(name, pause_s)
                sock = self._sock
                continue
            work, released = decode_datagram(data)
            for queue, n, partitions in work:
                self.received += 1
                self.notifier.deliver(queue, n, partitions)
            if self.releases is not None:
                for name in released:
                    self.received += 1
                    self.releases.deliver(name)
            sock = self._sock  # a delivery may have closed the store


def encode_wakeup(pending: dict[str, tuple[int, set[int] | None]], released: Collection[str] = ()) -> bytes:
    """The datagram for ``{queue: (count, partitions or None)}`` and the lock names in ``released``.

    A JSON list: ``[queue, count, partitions]`` per queue with new work, ``[name]`` per
    lock given back. A datagram over :data:`MAX_DATAGRAM_BYTES` names no partitions; one
    still over it is cut, and its receiver drops it (the polls find the work and the locks).
    """
    entries: list[list[object]] = [
        [queue, n, None if parts is None or len(parts) > MAX_WAKEUP_PARTITIONS else sorted(parts)]
        for queue, (n, parts) in pending.items()
    ]
    locks: list[list[object]] = [[name] for name in released]
    data = json.dumps(entries + locks, separators=(",", ":")).encode()
    if len(data) > MAX_DATAGRAM_BYTES:  # many queues: wake any owner of each
        entries = [[queue, n, None] for queue, (n, _parts) in pending.items()]
        data = json.dumps(entries + locks, separators=(",", ":")).encode()
        data = data[: MAX_DATAGRAM_BYTES + 1]
    return data


def decode_datagram(data: bytes) -> tuple[list[tuple[str, int, Collection[int] | None]], list[str]]:
    """The notifications and the released lock names of a datagram; a malformed one is logged and yields none."""
    try:
        entries: object = json.loads(data)
        if type(entries) is not list:
            raise TypeError("not a JSON array")
        work: list[tuple[str, int, Collection[int] | None]] = []
        released: list[str] = []
        for entry in entries:
            if type(entry) is list and len(entry) == 1:
                released.append(check_name("lock name", entry[0]))
                continue
            if type(entry) is not list or len(entry) != 3:
                raise TypeError(f"not a [queue, count, partitions] or [lock name] entry: {entry!r}")
            queue, n, parts = entry
            if parts is not None and type(parts) is not list:
                raise TypeError(f"partitions must be a JSON array, got {parts!r}")
            work.append(
                (check_name("queue", queue), check_int("n", n, minimum=0), check_partitions("partitions", parts))
            )
        return work, released
    except (ValueError, TypeError, RecursionError):  # InvalidArgumentError and InvalidTypeError included
        log.warning("asynccoord.sqlite.bad_wakeup datagram=%r", data[:200])
        return [], []


def encode_pauses(paused: dict[str, float]) -> list[bytes]:
    """The datagrams of the provider's pauses of locks ``{name: seconds}``: JSON ``{"pause": [[name, s], ...]}``.

    As many as it takes to keep each within :data:`MAX_DATAGRAM_BYTES` (a lock name is at
    most 255 characters, so one entry always fits).
    """
    datagrams: list[bytes] = []
    entries: list[list[object]] = []
    size = 0
    for name, pause_s in paused.items():
        entry: list[object] = [name, round(pause_s, 3)]
        entry_size = len(json.dumps(entry, separators=(",", ":")).encode()) + 1
        if entries and size + entry_size > MAX_DATAGRAM_BYTES - 16:
            datagrams.append(json.dumps({"pause": entries}, separators=(",", ":")).encode())
            entries, size = [], 0
        entries.append(entry)
        size += entry_size
    if entries:
        datagrams.append(json.dumps({"pause": entries}, separators=(",", ":")).encode())
    return datagrams


def decode_pauses(data: bytes) -> list[tuple[str, float]]:
    """The pauses of a datagram from :func:`encode_pauses`; a malformed one is logged and yields none."""
    try:
        message: object = json.loads(data)
        if type(message) is not dict or type(message.get("pause")) is not list:
            raise TypeError('not a {"pause": [...]} object')
        pauses: list[tuple[str, float]] = []
        for entry in message["pause"]:
            if type(entry) is not list or len(entry) != 2 or type(entry[1]) not in (int, float):
                raise TypeError(f"not a [lock name, seconds] entry: {entry!r}")
            pauses.append((check_name("lock name", entry[0]), check_non_negative("pause_s", entry[1])))
        return pauses
    except (ValueError, TypeError, RecursionError):  # InvalidArgumentError and InvalidTypeError included
        log.warning("asynccoord.sqlite.bad_pause datagram=%r", data[:200])
        return []


def decode_wakeup(data: bytes) -> list[tuple[str, int, Collection[int] | None]]:
    """The work notifications of a datagram (see :func:`decode_datagram`)."""
    return decode_datagram(data)[0]


def _release(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    """Take ``sock`` out of ``loop``'s selector and close it (in ``loop``'s thread)."""
    with contextlib.suppress(ValueError, OSError):
        loop.remove_reader(sock.fileno())
    sock.close()
