"""Standard output of the CLI's commands: the console their tables print on, and a reader that left.

``python -m asynccoord status --db bot.db | head -1``: ``head`` closes the pipe after one
line, and the next write raises ``BrokenPipeError``. Rich's console answers that by
raising ``SystemExit(1)``; the console made here raises :class:`OutputClosed` instead, as
:func:`write_stdout` does for the commands' JSON, and :func:`asynccoord.cli.main.main`
answers it the same way for every command: standard output is pointed at ``os.devnull``
(so the interpreter's last flush does not fail again, as the Python documentation's note
on SIGPIPE advises) and the exit status is 0, the reader having taken what it wanted.
Only a write to standard output becomes :class:`OutputClosed`: a ``BrokenPipeError`` of
any other connection (a database's socket) stays an error.

Any other failure to write standard output (``status > /dev/full``: no space left on the
device, an I/O error) raises :class:`OutputFailed`, which ``main`` prints as one line on
standard error with exit status 1: the output the caller asked for is not all there.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ("OutputClosed", "OutputFailed", "drop_stdout", "table_console", "write_stdout")


class OutputClosed(Exception):
    """The reader of a command's output went away (a closed pipe): nothing more can be printed."""


class OutputFailed(Exception):
    """Standard output refused a write for another reason than a closed pipe (a full disk, an I/O error).

    Its message is the one line the command prints on standard error, e.g.
    ``cannot write the output: No space left on device``.
    """


@contextlib.contextmanager
def _writing() -> Iterator[None]:
    """Raise a failed write to standard output as :class:`OutputClosed` or :class:`OutputFailed`."""
    try:
        yield
    except BrokenPipeError as exc:
        raise OutputClosed("the reader of the output went away") from exc
    except OSError as exc:
        raise OutputFailed(f"cannot write the output: {exc.strerror or exc}") from exc


class _Stdout:
    """Standard output as found at each call, its write failures raised as the two exceptions above.

    Rich's console writes to this: a full disk then ends the command in one line, not a traceback.
    """

    def write(self, text: str) -> int:
        with _writing():
            return sys.stdout.write(text)

    def flush(self) -> None:
        with _writing():
            sys.stdout.flush()

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding: those of standard output
        return getattr(sys.stdout, name)


def table_console(file: IO[str] | None, *, color: bool | None, pipe_width: int) -> Console:
    """A rich console for a command's tables, raising :class:`OutputClosed` when its reader went away.

    Markup and emoji codes are off: the values printed come from the database (queue names,
    lock names, errors), and one like ``[/x]`` or ``account:lock:7`` must print as it is, not
    be read as a console markup tag or as the emoji code ``:lock:``.

    Args:
        file: Where to print; None for standard output.
        color: Force colour on or off; None: colour on a terminal only.
        pipe_width: The width used when ``file`` is no terminal (a pipe or a file has no
            width to detect): one that fits the command's widest table.
    """
    make = _console_class()
    if file is None:
        file = cast("IO[str]", _Stdout())
    console = make(file=file, no_color=color is False, force_terminal=color, markup=False, emoji=False)
    if not console.is_terminal:
        console = make(
            file=file, no_color=color is False, force_terminal=color, width=pipe_width, markup=False, emoji=False
        )
    return console


@functools.cache
def _console_class() -> type[Console]:
    """Rich's ``Console`` raising :class:`OutputClosed` on a broken pipe (rich imported on first use)."""
    from rich.console import Console

    class ClosingConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True  # nothing more is written, whatever the caller does
            raise OutputClosed("the reader of the output went away")

    return ClosingConsole


def write_stdout(text: str) -> None:
    """Write ``text`` to standard output and flush it.

    Raises:
        OutputClosed: standard output is a pipe whose reader went away.
        OutputFailed: standard output refused the write otherwise (no space left on the device).
    """
    out = _Stdout()
    out.write(text)
    out.flush()


def drop_stdout() -> None:
    """Point standard output's file descriptor at ``os.devnull``: what is still buffered goes nowhere.

    Does nothing when standard output has no file descriptor (a test's capture, say).
    """
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        with contextlib.suppress(OSError):
            os.dup2(devnull, fd)
    finally:
        os.close(devnull)
