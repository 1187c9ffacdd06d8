"""Text for an exception that may come from user code, without ever raising."""

from __future__ import annotations

__all__ = ("error_text",)


def error_text(exc: BaseException) -> str:
    """``"Type: message"`` for ``exc`` (``"Type"`` when its message is empty); never raises.

    A user's exception may have a ``__str__`` that raises (or returns something other
    than a str): its ``repr()`` is used then, and if that fails too, its type name alone.
    asynccoord turns exceptions from ``send``, ``lock_key`` or an alert callback into
    text with it (a task's ``last_error``, log lines), so such an exception goes through
    the retry policy like any other instead of failing the node.

    Args:
        exc: Any exception.

    Returns:
        The text, e.g. ``"ValueError: boom"``, ``"TimeoutError"``, ``"BadStr()"``.
    """
    name = type(exc).__name__
    try:
        message = str(exc)
    except Exception:
        try:
            return repr(exc) or name
        except Exception:
            return name
    return f"{name}: {message}" if message else name
