"""Argument checks shared by every public entry point.

Each check raises :class:`~asynccoord.errors.InvalidArgumentError` (a ``ValueError``)
or :class:`~asynccoord.errors.InvalidTypeError` (a ``TypeError``) naming the argument
and the offending value, and is always run before anything touches a store.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import sys
import unicodedata
from collections.abc import Callable, Collection, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, TypeGuard, cast

from ._errtext import error_text
from .errors import InvalidArgumentError, InvalidTypeError, PayloadTooLargeError

__all__ = (
    "MAX_LIMITS",
    "check_limit_keys",
    "MAX_ATTEMPTS",
    "MAX_DURATION_S",
    "MAX_NAME_LENGTH",
    "MAX_PAYLOAD_DEPTH",
    "MAX_PURGE_BATCH",
    "MIN_INTERVAL_S",
    "MIN_LEASE_S",
    "check_bool",
    "check_callback",
    "check_clock",
    "check_finite",
    "check_int",
    "check_interval_s",
    "check_key",
    "check_lease_s",
    "check_lock_store",
    "check_name",
    "check_non_negative",
    "check_optional_key",
    "check_optional_name",
    "check_partitions",
    "check_positive",
    "check_queue_store",
    "check_send",
    "encode_payload",
    "is_partition_collection",
    "partitions_type_error",
    "unfit_character",
)

MAX_NAME_LENGTH = 255
"""Longest queue name, partition key, idempotency key, node id or lock name (characters)."""

MIN_LEASE_S = 0.01
"""Shortest lease or TTL any argument may give (a task's ``lease_s``, a lock's ``ttl_s``, a
membership ``ttl_s``...): 10 ms, in seconds.

A lease is held across store round trips and a send: one shorter than a round trip lapses
before its holder can use it, and a task claimed under it is reclaimed, its attempts spent,
and dead-lettered without ``send`` ever running. A value below this bound is almost surely a
unit mistake (30 s converted to seconds twice: ``lease_s=30 / 1000 / 1000``) and is refused
with :class:`~asynccoord.errors.InvalidArgumentError` naming the argument, the value and this
bound. It stops only the absurd values: a lease of 0.03 s is taken. The shortest leases the
test suite uses are 0.2 s.
"""

MIN_INTERVAL_S = 0.001
"""Shortest interval any loop may be given (a heartbeat's or a watchdog's renewal interval,
a node's idle backoff, a poll, a monitor's flush): 1 ms, in seconds.

An interval below it turns the loop into a busy loop that keeps a core and the store busy
(``interval_s=1e-9``); such a value is refused with
:class:`~asynccoord.errors.InvalidArgumentError` naming the argument, the value and this
bound. The shortest intervals the test suite uses are 10 ms.
"""

MAX_ATTEMPTS = 2**31 - 1
"""Largest ``max_attempts`` (and attempt count) a task or a retry policy may carry:
what a PostgreSQL ``integer`` column holds."""

MAX_PURGE_BATCH = 2**31 - 1
"""Largest ``batch`` of a purge (and ``ProcessedRetention.purge_batch``), rows: one bound on
every backend, the largest ``LIMIT`` PostgreSQL takes as an ``integer`` parameter."""

MAX_DURATION_S = 365 * 24 * 3600.0
"""Longest duration any argument may give (lease, TTL, delay, timeout, interval, retention,
window...): one year (365 days, 31,536,000 s), in seconds.

Far beyond any sane lease or retry delay, and small enough that ``now + duration`` stays
an exact, representable time on every backend (no float overflow, no PostgreSQL
timestamp out of range, no Redis expiry overflow). A longer value is refused with
:class:`~asynccoord.errors.InvalidArgumentError` naming the value and this bound; work
due further out belongs in a scheduler that enqueues it later.
"""


def _short(value: object) -> str:
    """``repr(value)`` cut to 80 characters; a huge int is described, not converted."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        # repr() of an int over 4,300 digits raises ValueError (CPython's conversion limit).
        return f"{'-' if value < 0 else ''}<int of {value.bit_length()} bits>"
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # a huge int nested in a container, a cycle...
        return f"<{type(value).__name__} that cannot be shown>"
    return text if len(text) <= 80 else text[:77] + "..."


def check_clock(clock: Callable[[], float] | None) -> Callable[[], float] | None:
    """Check a store's ``clock`` test hook: a callable, or None for the default clock.

    Returns:
        The value, unchanged.

    Raises:
        InvalidTypeError: ``clock`` is neither callable nor None.
    """
    if clock is not None and not callable(clock):
        raise InvalidTypeError(f"clock must be callable or None, got {type(clock).__name__} {_short(clock)}")
    return clock


def unfit_character(text: str, why: str = "a name is shown on one line") -> str | None:
    """What unfits ``text`` to be shown on one line: its first control character or lone surrogate, described.

    The control characters are Unicode category ``Cc`` (C0, DEL and C1: a newline, a tab,
    NUL, ESC...): one splits a log line or drives the terminal that shows it. A lone
    surrogate is in no UTF-8 text (a log file, a JSON body, SQLite or PostgreSQL text).

    Args:
        text: The text to look through.
        why: Why a control character unfits it, for the description.

    Returns:
        ``"the control character '\\n' (a name is shown on one line)"``, ``"the lone surrogate
        '\\ud800' (no UTF-8 text holds one)"``, or None when the text has neither.
    """
    if text.isprintable():  # one pass in C for the common case (neither is printable)
        return None
    for ch in text:
        if unicodedata.category(ch) == "Cc":
            return f"the control character {ch!r} ({why})"
        if "\ud800" <= ch <= "\udfff":
            return f"the lone surrogate {ch!r} (no UTF-8 text holds one)"
    return None


def check_name(arg: str, value: object, *, allow_empty: bool = False) -> str:
    """Check an identifier: ``str``, 1..255 characters, not only whitespace, no control character, no lone surrogate.

    Identifiers are the names asynccoord shows on one line (in log lines, ``status``, the
    notices): queue names, node ids, lock names and prefixes, rate-limit dimensions, metric
    and rule names. A control character (Unicode category ``Cc``: a newline, a tab, NUL,
    ESC...) would split such a line or drive the terminal that shows it, so it is refused,
    as in a :class:`~asynccoord.monitor.webhook.WebhookSink` label. Keys taken from the
    caller's data (partition keys, idempotency keys, ``limit_keys`` values) and labels
    (a lock's holder) are checked by :func:`check_key` instead, which keeps them as given.

    Args:
        arg: The argument's name, used in the error message.
        value: The value to check.
        allow_empty: Accept ``""`` and text that is only whitespace (the empty scope of a
            process's counters).

    Returns:
        The value, unchanged.

    Raises:
        InvalidTypeError: ``value`` is not a ``str``.
        InvalidArgumentError: as :func:`check_key`, or holding a control character.
    """
    if (
        type(value) is str
        and value.isascii()
        and value.isprintable()  # ASCII: no C0 control character nor DEL (nor NUL)
        and 0 < len(value) <= MAX_NAME_LENGTH
        and not value.isspace()  # stops at the first other character: one test on a real name
    ):
        return value  # the common case (ASCII has no lone surrogates), on every task of a hot path
    check_key(arg, value, allow_empty=allow_empty)
    unfit = unfit_character(cast(str, value))
    if unfit is not None:
        raise InvalidArgumentError(f"{arg} must not hold {unfit}, got {_short(value)}")
    return cast(str, value)


def check_key(arg: str, value: object, *, allow_empty: bool = False, allow_blank: bool = False) -> str:
    """Check a key from the caller's data: ``str``, 1..255 characters, not only whitespace, no NUL, no lone surrogate.

    For partition keys, idempotency keys, message ids, ``limit_keys`` values and labels such
    as a lock's holder: data that is compared and stored, so any other character is kept
    (log lines and the command line escape it where they show it). Names asynccoord shows as
    such are checked by :func:`check_name`.

    Args:
        arg: The argument's name, used in the error message.
        value: The value to check.
        allow_empty: Accept ``""`` and text that is only whitespace (used for the default
            partition key, and for a lock's optional ``holder`` label).
        allow_blank: Accept text that is only whitespace (``" "``, ``"\\t"``), but not ``""``:
            for opaque keys taken from the caller's data (an idempotency key, a message id),
            which are compared, never shown as names.

    Returns:
        The value, unchanged.

    Raises:
        InvalidTypeError: ``value`` is not a ``str``.
        InvalidArgumentError: empty, only whitespace (a name such as ``" "`` is a mistake
            no one can see in a log line), longer than 255 characters, or holding a NUL
            character or a lone surrogate (neither SQLite text comparison nor PostgreSQL
            can keep those faithfully).
    """
    if (
        type(value) is str
        and value.isascii()
        and 0 < len(value) <= MAX_NAME_LENGTH
        and "\x00" not in value
        and not value.isspace()  # stops at the first other character: one test on a real key
    ):
        return value  # the common case (ASCII has no lone surrogates), on every task of a hot path
    if not isinstance(value, str):
        raise InvalidTypeError(f"{arg} must be a str, got {type(value).__name__} {_short(value)}")
    if not value and not allow_empty:
        raise InvalidArgumentError(f"{arg} must not be empty, got {_short(value)}")
    if value.isspace() and not (allow_empty or allow_blank):
        raise InvalidArgumentError(f"{arg} must not be only whitespace, got {_short(value)}")
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidArgumentError(
            f"{arg} must be at most {MAX_NAME_LENGTH} characters, got {len(value)}: {_short(value)}"
        )
    if "\x00" in value:
        raise InvalidArgumentError(f"{arg} must not contain NUL characters, got {_short(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgumentError(
            f"{arg} must be valid Unicode text (no lone surrogates), got {_short(value)}"
        ) from None
    return value


def check_optional_name(arg: str, value: object) -> str | None:
    """Like :func:`check_name`, but ``None`` is accepted and returned as is."""
    if value is None:
        return None
    return check_name(arg, value)


def check_optional_key(arg: str, value: object, *, allow_blank: bool = False) -> str | None:
    """Like :func:`check_key`, but ``None`` is accepted and returned as is."""
    if value is None:
        return None
    return check_key(arg, value, allow_blank=allow_blank)


def _check_real(arg: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidTypeError(f"{arg} must be a number, got {type(value).__name__} {_short(value)}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond the float range
        raise InvalidArgumentError(f"{arg} must be finite, got {_short(value)} (too large for a float)") from None
    if math.isnan(number) or math.isinf(number):
        raise InvalidArgumentError(f"{arg} must be finite, got {_short(value)}")
    return number


def check_finite(arg: str, value: object) -> float:
    """Check a finite number (a ``time.monotonic()`` reading, say); return it as float.

    Raises:
        InvalidTypeError: not an int or float (bool is refused).
        InvalidArgumentError: NaN or infinite.
    """
    return _check_real(arg, value)


def _check_maximum(arg: str, value: object, number: float, maximum: float | None) -> float:
    if maximum is not None and number > maximum:
        bound = f"{maximum:.0f} seconds (one year, MAX_DURATION_S)" if maximum == MAX_DURATION_S else f"{maximum:g}"
        raise InvalidArgumentError(f"{arg} must be <= {bound}, got {_short(value)}")
    return number


def check_positive(arg: str, value: object, *, maximum: float | None = MAX_DURATION_S) -> float:
    """Check a finite number > 0 (durations such as ``lease_s``); return it as float.

    Args:
        arg: The argument's name, used in the error message.
        value: The value to check.
        maximum: Largest value accepted; default :data:`MAX_DURATION_S` (one year),
            which every duration shares. None for numbers that are not durations
            (a growth factor, a threshold).

    Raises:
        InvalidTypeError: not an int or float (bool is refused).
        InvalidArgumentError: NaN, infinite, zero, negative or above ``maximum``.
    """
    if type(value) is float and value > 0.0 and (value < math.inf if maximum is None else value <= maximum):
        return value  # the common case, checked once per lease or task on hot paths
    number = _check_real(arg, value)
    if number <= 0:
        raise InvalidArgumentError(f"{arg} must be > 0, got {_short(value)}")
    return _check_maximum(arg, value, number, maximum)


def check_lease_s(arg: str, value: object) -> float:
    """Check a lease length or TTL, seconds: a finite number in [``MIN_LEASE_S``, ``MAX_DURATION_S``].

    Every lease and TTL argument shares it (a task's ``lease_s``, a lock's ``ttl_s``, a
    membership ``ttl_s``), so a unit mistake is refused the same way on every backend.

    Args:
        arg: The argument's name, used in the error message.
        value: The value to check.

    Returns:
        The value as a float.

    Raises:
        InvalidTypeError: not an int or float (bool is refused).
        InvalidArgumentError: NaN, infinite, zero or negative, below :data:`MIN_LEASE_S`
            (0.01 s) or above :data:`MAX_DURATION_S` (one year).
    """
    if type(value) is float and MIN_LEASE_S <= value <= MAX_DURATION_S:
        return value  # the common case, checked once per claim, renewal or lock on hot paths
    return _check_at_least(arg, value, MIN_LEASE_S, "MIN_LEASE_S: a shorter lease lapses before it is used")


def check_interval_s(arg: str, value: object) -> float:
    """Check a loop's interval, seconds: as :func:`check_lease_s`, with the floor
    :data:`MIN_INTERVAL_S` (0.001 s) instead of ``MIN_LEASE_S``; return it as a float."""
    return _check_at_least(arg, value, MIN_INTERVAL_S, "MIN_INTERVAL_S: a shorter interval is a busy loop")


def _check_at_least(arg: str, value: object, floor: float, why: str) -> float:
    """:func:`check_positive`, then refuse a number below ``floor`` seconds, saying ``why``."""
    number = check_positive(arg, value)
    if number < floor:
        raise InvalidArgumentError(f"{arg} must be >= {floor} seconds ({why}), got {_short(value)}")
    return number


def check_non_negative(arg: str, value: object, *, maximum: float | None = MAX_DURATION_S) -> float:
    """Check a finite number >= 0 (delays such as ``delay_s``); return it as float.

    Args:
        arg: The argument's name, used in the error message.
        value: The value to check.
        maximum: Largest value accepted; default :data:`MAX_DURATION_S` (one year).
            None for numbers that are not durations (a ratio, a threshold).

    Raises:
        InvalidTypeError: not an int or float (bool is refused).
        InvalidArgumentError: NaN, infinite, negative or above ``maximum``.
    """
    number = _check_real(arg, value)
    if number < 0:
        raise InvalidArgumentError(f"{arg} must be >= 0, got {_short(value)}")
    return _check_maximum(arg, value, number, maximum)


def check_int(arg: str, value: object, *, minimum: int, maximum: int | None = None) -> int:
    """Check an ``int`` within ``[minimum, maximum]``; return it.

    Raises:
        InvalidTypeError: not an int (bool is refused).
        InvalidArgumentError: out of range.
    """
    if type(value) is int and minimum <= value and (maximum is None or value <= maximum):
        return value  # the common case, checked for every field of a task or lease on hot paths
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidTypeError(f"{arg} must be an int, got {type(value).__name__} {_short(value)}")
    if value < minimum:
        raise InvalidArgumentError(f"{arg} must be >= {minimum}, got {_short(value)}")
    if maximum is not None and value > maximum:
        raise InvalidArgumentError(f"{arg} must be <= {maximum}, got {_short(value)}")
    return value


def check_bool(arg: str, value: object) -> bool:
    """Check a real ``bool``; return it.

    Raises:
        InvalidTypeError: anything but ``True`` or ``False``.
    """
    if not isinstance(value, bool):
        raise InvalidTypeError(f"{arg} must be a bool, got {type(value).__name__} {_short(value)}")
    return value


def check_callback(arg: str, value: object) -> None:
    """Check a callback that is called synchronously: a plain callable, not an ``async def``.

    Raises:
        InvalidTypeError: ``value`` is not callable (None included), or calling it makes a
            coroutine (which nobody would await: the callback would never run).
    """
    if not callable(value) or is_async_callable(value):
        raise InvalidTypeError(f"{arg} must be a plain function, got {type(value).__name__} {_short(value)}")


_PLAIN_COLLECTIONS = frozenset({frozenset, set, tuple, list, range})


def is_partition_collection(value: object) -> TypeGuard[Collection[object]]:
    """True if ``value`` has a kind a ``partitions`` argument may take: a sequence (list,
    tuple, range...) or a set (``set``, ``frozenset``, a dict's keys), but not a str, bytes,
    a bytearray, a memoryview, a mapping or a one-pass view such as ``dict.values()``.

    One rule for every ``partitions`` argument: a claim's, a notifier's and a wake-up's.
    """
    if type(value) in _PLAIN_COLLECTIONS:
        return True  # the common case, on hot paths; the ABC checks below are slower
    if isinstance(value, str | bytes | bytearray | memoryview):
        return False
    return isinstance(value, Sequence | AbstractSet)


def partitions_type_error(arg: str, value: object) -> InvalidTypeError:
    """The error for a ``partitions`` argument of the wrong kind (see :func:`is_partition_collection`)."""
    return InvalidTypeError(
        f"{arg} must be a collection of ints (a list, tuple, range or set) or None, "
        f"got {type(value).__name__} {_short(value)}"
    )


def check_lock_store(arg: str, value: object) -> None:
    """Check an object meant to serve the lock contract (``try_acquire_lock`` and the rest).

    Raises:
        InvalidTypeError: ``value`` has no ``try_acquire_lock`` (not a lock store).
    """
    if not hasattr(value, "try_acquire_lock"):
        raise InvalidTypeError(f"{arg} must implement the lock contract (a lock store), got {type(value).__name__}")


def check_queue_store(arg: str, value: object) -> None:
    """Check an object meant to serve the queue contract (``claim``, ``complete`` and the rest).

    Raises:
        InvalidTypeError: ``value`` has no callable ``claim`` or ``complete`` (not a queue store).
    """
    for method in ("claim", "complete"):
        if not callable(getattr(value, method, None)):
            raise InvalidTypeError(
                f"{arg} must implement the queue contract (a queue store: {method}), got {type(value).__name__} "
                f"{_short(value)}"
            )


def check_partitions(arg: str, value: object) -> Collection[int] | None:
    """Check an optional collection of partition numbers (ints >= 0); return it unchanged.

    Args:
        arg: The argument's name, used in the error message.
        value: None (every partition), or a list, tuple, range, set or frozenset of ints
            (the kinds :func:`is_partition_collection` takes).

    Raises:
        InvalidTypeError: neither None nor such a collection (a str, bytes, a dict, a
            ``dict.values()`` view, a number...), or an item that is not an int (bool is
            refused).
        InvalidArgumentError: a negative item.
    """
    if value is None:
        return None
    if not is_partition_collection(value):
        raise partitions_type_error(arg, value)
    for item in value:
        if type(item) is not int or item < 0:  # the common case costs one test per item, on hot paths
            check_int(f"{arg} item", item, minimum=0)
    return cast("Collection[int]", value)


def check_lock_key(lock_key: object) -> None:
    """Check a node's ``lock_key``: None, or a plain function (a task to a lock name or None).

    Raises:
        InvalidTypeError: it is not callable, or is an async callable (the node calls it
            without awaiting).
    """
    if lock_key is None:
        return
    if not callable(lock_key):
        raise InvalidTypeError(f"lock_key must be callable or None, got {type(lock_key).__name__} {_short(lock_key)}")
    if is_async_callable(lock_key):
        raise InvalidTypeError(
            f"lock_key must be a plain function returning a lock name (str) or None, got the async {lock_key!r}"
        )


def check_send(send: object) -> None:
    """Check a node's ``send``: a callable, not a generator function (async or plain).

    Raises:
        InvalidTypeError: ``send`` is not callable, or is a function with ``yield`` (an
            ``async def`` or a plain ``def``): calling it runs nothing of its body, so every
            task would be committed unsent.
    """
    if not callable(send):
        raise InvalidTypeError(f"send must be callable (an async function, or a plain one), got {send!r}")
    for kind, test in (("async generator", inspect.isasyncgenfunction), ("generator", inspect.isgeneratorfunction)):
        if test(send) or test(type(send).__call__):
            raise InvalidTypeError(
                f"send must be an async function or a plain one, got the {kind} function {send!r} "
                "(calling it sends nothing)"
            )


def is_async_callable(fn: object) -> bool:
    """Whether calling ``fn`` makes a coroutine: an ``async def``, an object with an async ``__call__``,
    or a ``functools.partial`` of either."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or (callable(fn) and inspect.iscoroutinefunction(type(fn).__call__))


def encode_payload(payload: Any, *, max_bytes: int, arg: str = "payload") -> str:
    """Encode a task payload as JSON text that decodes back to an equal value.

    Non-ASCII text is stored as is; a payload holding lone surrogates is written
    with ``\\uXXXX`` escapes instead so it still round-trips exactly. NUL characters
    are always escaped by JSON, so they round-trip too.

    Args:
        payload: Any JSON value: ``dict`` with ``str`` keys, ``list``, ``str``,
            ``int``, finite ``float``, ``bool`` or ``None``, nested up to
            :data:`MAX_PAYLOAD_DEPTH` (100) levels.
        max_bytes: Size limit of the encoded UTF-8 text, in bytes.
        arg: The argument's name, used in error messages.

    Returns:
        The JSON text.

    Raises:
        InvalidTypeError: a value JSON cannot encode (a set, bytes, an object...), or
            one whose own methods raise while it is encoded.
        InvalidArgumentError: NaN or infinity, a value that would not decode back to an
            equal value (a tuple, a dict key that is not a str), one nested too deeply, or an
            int of more digits than Python's default int/str conversion limit (4,300) lets a
            process read back, whatever this process's own limit
            (``sys.set_int_max_str_digits``).
        PayloadTooLargeError: the encoding is over ``max_bytes`` bytes.
    """
    try:
        text = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except TypeError as exc:
        raise InvalidTypeError(f"{arg} is not JSON-serializable: {exc}") from None
    except ValueError as exc:
        if _holds_unreadable_int(payload):  # this process's limit refused it: say why, not how to lift it
            raise InvalidArgumentError(_unreadable_int(arg)) from None
        raise InvalidArgumentError(f"{arg} is not valid JSON: {exc} in {_short(payload)}") from None
    except RecursionError:  # deeper than the stack left allows: json's encoder recurses
        raise InvalidArgumentError(_too_deep(arg)) from None
    except Exception as exc:  # a container whose own methods fail (a dict subclass's items(), say)
        raise InvalidTypeError(f"{arg} could not be encoded as JSON: {error_text(exc)}") from None
    if not 0 < sys.get_int_max_str_digits() <= _DEFAULT_INT_DIGITS and _holds_unreadable_int(payload):
        # This process lifted the limit, so json wrote the int; a process with the default limit
        # (another node, `status`) could not read the task back.
        raise InvalidArgumentError(_unreadable_int(arg))
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        text = json.dumps(payload, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
        size = len(text)
    if size > max_bytes:
        raise PayloadTooLargeError(f"{arg} encodes to {size} bytes, over the limit of {max_bytes} bytes")
    try:
        same = _json_equal(json.loads(text), payload)
    except RecursionError:  # json's decoder recurses too
        raise InvalidArgumentError(_too_deep(arg)) from None
    if same is None:
        raise InvalidArgumentError(f"{arg} is nested deeper than {MAX_PAYLOAD_DEPTH} levels")
    if not same:
        raise InvalidArgumentError(
            f"{arg} would not round-trip through JSON unchanged (tuples become lists, non-str dict keys "
            f"become str, adjacent lone surrogates merge into one character): {_short(payload)}"
        )
    return text


MAX_PAYLOAD_DEPTH = 100
"""Deepest nesting of lists and dicts a payload (or a stored result) may have."""


_DEFAULT_INT_DIGITS: int = sys.int_info.default_max_str_digits
_UNREADABLE_INT = 10**_DEFAULT_INT_DIGITS  # the least int with more digits than that


def _holds_unreadable_int(payload: object) -> bool:
    """Whether ``payload`` holds an int that ``json.loads`` refuses under the default digit limit.

    A walk with a stack of its own (the payload may nest as deep as json's encoder allowed)
    that enters each container once, so a circular payload ends it too.
    """
    pending: list[object] = [payload]
    entered: set[int] = set()
    while pending:
        value = pending.pop()
        if isinstance(value, dict | list | tuple):
            if id(value) in entered:
                continue
            entered.add(id(value))
            try:
                pending.extend(value.values() if isinstance(value, dict) else value)
            except Exception:  # a container whose own methods fail: json says what is wrong with it
                return False
        elif isinstance(value, int) and not -_UNREADABLE_INT < value < _UNREADABLE_INT:
            return True
    return False


def _unreadable_int(arg: str) -> str:
    return (
        f"{arg} holds an int too large to read back: over {_DEFAULT_INT_DIGITS} digits, more than a "
        "Python process decodes from JSON by default (send it as a str)"
    )


def _too_deep(arg: str) -> str:
    return (
        f"{arg} is nested too deeply for the call stack left (json recurses per level; at most "
        f"{MAX_PAYLOAD_DEPTH} levels are accepted, with about that many frames to spare below the recursion limit)"
    )


def _json_equal(decoded: object, original: object) -> bool | None:
    """Equality that also tells ``1`` from ``1.0``/``True`` and lists from tuples; None if nested
    deeper than :data:`MAX_PAYLOAD_DEPTH`. A walk with a stack of its own, so the answer does not
    depend on how deep the caller's stack already is."""
    pending: list[tuple[object, object, int]] = [(decoded, original, 0)]
    while pending:
        new, old, depth = pending.pop()
        if type(new) is not type(old):  # JSON has no tuple and bool is an int subclass: compare types strictly
            return False
        if isinstance(old, dict):
            assert isinstance(new, dict)
            if depth >= MAX_PAYLOAD_DEPTH:
                return None
            if new.keys() != old.keys():
                return False
            pending.extend((new[key], value, depth + 1) for key, value in old.items())
        elif isinstance(old, list):
            assert isinstance(new, list)
            if depth >= MAX_PAYLOAD_DEPTH:
                return None
            if len(new) != len(old):
                return False
            pending.extend((a, b, depth + 1) for a, b in zip(new, old, strict=True))
        elif new != old:
            return False
    return True


MAX_LIMITS = 16
"""Most limits one queue may declare (and so most keys one task may name)."""


def check_limit_keys(limit_keys: object) -> dict[str, str]:
    """Check ``NewTask.limit_keys``: a mapping of dimension name to key, both names; return a copy.

    Raises:
        InvalidTypeError: not a mapping, or a dimension or key that is not a str.
        InvalidArgumentError: a blank dimension or key, or more than :data:`MAX_LIMITS` items.
    """
    if not isinstance(limit_keys, Mapping):
        raise InvalidTypeError(
            f"limit_keys must be a mapping of dimension to key, e.g. {{'chat': '42'}}, got {type(limit_keys).__name__}"
        )
    if len(limit_keys) > MAX_LIMITS:
        raise InvalidArgumentError(f"limit_keys names at most {MAX_LIMITS} dimensions, got {len(limit_keys)}")
    out: dict[str, str] = {}
    for dimension, key in limit_keys.items():
        check_name("limit_keys dimension", dimension)
        out[dimension] = check_key(f"limit_keys[{dimension!r}]", key)
    return out
