"""Functions named on the command line as ``package.module:attribute``.

The convention of ASGI servers (``uvicorn app:main``): ``run --send``, ``--lock-key`` and
``--lifespan`` name the application's functions so, and a name that imports nothing is a
usage error that says why, before anything is opened.
"""

from __future__ import annotations

import importlib
from typing import Any

from .._errtext import error_text
from ..errors import InvalidArgumentError, InvalidTypeError

__all__ = ("load_callable",)


def load_callable(spec: str) -> Any:
    """Import ``"package.module:attribute"`` and return the attribute.

    Raises:
        InvalidArgumentError: the spec is malformed or names nothing importable: no such
            module, or its import raised (any ``Exception``, named with its type and message,
            a ``SyntaxError`` with its ``file:line``) or exited (``sys.exit()``, with its code:
            it ends no process here).
        InvalidTypeError: the attribute is not callable.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidArgumentError(f"expected 'package.module:attribute', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:  # the module's own code may raise anything, or call sys.exit(), at import
        raise InvalidArgumentError(f"cannot import module {module_name!r} of {spec!r}: {_import_error(exc)}") from exc
    target: Any = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise InvalidArgumentError(f"{module_name!r} has no attribute {attr!r} (from {spec!r})") from None
    if not callable(target):
        raise InvalidTypeError(f"{spec!r} is not callable ({type(target).__name__})")
    return target


def _import_error(exc: BaseException) -> str:
    """``"Type: message"`` of an exception raised importing a module; a ``SyntaxError`` with its ``file:line``,
    a ``SystemExit`` (``sys.exit()``) with its exit code."""
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None or isinstance(code, int):
            return f"the module exited with code {code or 0} (SystemExit) while being imported"
        return f"the module exited with the message {code!r} (SystemExit) while being imported"
    if isinstance(exc, SyntaxError):
        where = f"{exc.filename}:{exc.lineno}" if exc.filename else f"line {exc.lineno}"
        return f"{type(exc).__name__}: {exc.msg} ({where})"
    return error_text(exc)
