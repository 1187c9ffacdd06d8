"""A redis-server of a test's own, on a port of its own, that the test stops, pauses and starts again.

For lock store outages: :meth:`OwnRedis.stop` kills the server (connections refused),
:meth:`OwnRedis.pause` stops it with SIGSTOP (connections accepted, never answered: a
hang), :meth:`OwnRedis.resume` and :meth:`OwnRedis.start` bring it back on the same port.
No data is kept on disk (``--save "" --appendonly no``).
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from services import unavailable

__all__ = ("OwnRedis", "running_redis")


class OwnRedis:
    """One redis-server process at a time on :attr:`port`; :attr:`url` names it."""

    def __init__(self, directory: Path) -> None:
        server = shutil.which("redis-server")
        if server is None:
            unavailable("redis-server", "not on PATH")
        self._server = server
        self._dir = directory
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port: int = probe.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the server and wait until it answers (10 s at most)."""
        assert self._proc is None
        command = [self._server, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self._dir)]
        command += ["--save", "", "--appendonly", "no"]
        self._proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10.0
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.02)

    def stop(self) -> None:
        """Kill the server (SIGKILL; a paused one too) and wait for it to end."""
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.kill()
            proc.wait(10)

    @property
    def pid(self) -> int:
        """The running server's process id."""
        assert self._proc is not None
        return self._proc.pid

    def pause(self) -> None:
        """SIGSTOP: the server keeps its port and connections but answers nothing."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT: the paused server answers again."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGCONT)


def running_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    """A started :class:`OwnRedis`, killed when the generator ends (the body of a test module's fixture)."""
    server = OwnRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()
