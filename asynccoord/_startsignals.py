"""Stop signals that reach ``python -m asynccoord run`` while it is still starting: noted, not fatal.

Python imports the package (a few tenths of a second), the command line and the send's
module before ``run`` installs its signal handlers. Until then SIGTERM and SIGHUP had their
default action, so an operator's ``kill`` right after the start killed the process by
signal instead of stopping it cleanly. The package's ``__init__`` calls
:func:`hold_start_signals` before its other imports: in the ``python -m asynccoord run``
process (and no other) each stop signal still at its default action (SIGTERM, SIGINT,
SIGHUP; an ignored one, as under ``nohup``, stays ignored) is noted instead. ``run`` takes
the noted ones with :func:`take_start_signals` once its own handlers are in place, and ends
as for a signal while it starts: exit status 0, nothing claimed.

What comes before the package's first line (the interpreter's own start-up, some tens of
milliseconds) cannot be covered from Python: a signal then still has its default action.

This module imports nothing but the standard library's ``signal`` and ``sys``: it runs
before the rest of the package is imported.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

__all__ = ("hold_start_signals", "is_run_start", "take_start_signals")

_MODULE_NAMES = ("asynccoord", "asynccoord.__main__")
"""What ``python -m`` may name to start the command line."""

_NOTED: list[int] = []
"""The stop signals noted since :func:`hold_start_signals`, in order of arrival."""


def is_run_start(argv: list[str], orig_argv: list[str]) -> bool:
    """Whether ``python -m`` is locating ``asynccoord`` to run its ``run`` command.

    While ``python -m NAME`` locates its module (importing the packages above it),
    ``sys.argv[0]`` is ``"-m"`` and the rest of ``sys.argv`` holds the arguments after
    ``NAME``; ``sys.orig_argv`` holds the interpreter's own command line, ``NAME`` just
    before those arguments.

    Args:
        argv: ``sys.argv``.
        orig_argv: ``sys.orig_argv``.
    """
    if len(argv) < 2 or argv[0] != "-m" or argv[1] != "run" or len(orig_argv) < len(argv) + 1:
        return False
    if orig_argv[len(orig_argv) - len(argv) + 1 :] != argv[1:]:
        return False
    named = orig_argv[len(orig_argv) - len(argv)]  # "asynccoord", or "-masynccoord" (no space after -m)
    return named in _MODULE_NAMES or any(named == f"-m{name}" for name in _MODULE_NAMES)


def hold_start_signals() -> None:
    """In the ``python -m asynccoord run`` process: note the stop signals still at their default action.

    Elsewhere (an application importing the package, another command) nothing changes.
    """
    if not is_run_start(sys.argv, getattr(sys, "orig_argv", [])):
        return
    defaults = {
        signal.SIGTERM: signal.SIG_DFL,
        signal.SIGHUP: signal.SIG_DFL,
        signal.SIGINT: signal.default_int_handler,
    }
    for signum, default in defaults.items():
        if signal.getsignal(signum) == default:
            signal.signal(signum, _note)


def take_start_signals() -> list[int]:
    """The stop signals noted while the process started, oldest first; forgotten here once taken."""
    noted = list(_NOTED)
    del _NOTED[: len(noted)]
    return noted


def _note(signum: int, frame: FrameType | None) -> None:
    _NOTED.append(signum)
