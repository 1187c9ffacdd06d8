"""The one exception hierarchy of asynccoord.

Every error the package raises on purpose derives from :class:`CoordError`, so a
caller can catch the whole family with one clause. Errors about bad arguments also
derive from the matching built-in (``ValueError`` or ``TypeError``) so code that
already catches those keeps working. Driver errors (``sqlite3``, ``asyncpg``,
``redis``) are mapped to :class:`StoreError` subclasses at one boundary per backend,
with the original exception kept as ``__cause__``.

::

    CoordError
    ├── InvalidArgumentError (ValueError)      a value is out of range or malformed
    │   └── PayloadTooLargeError               a payload over the size limit
    ├── InvalidTypeError (TypeError)           an argument has the wrong type
    ├── TaskNotFoundError (KeyError)           no task with that id
    ├── LeaseLostError                         the task lease is no longer the caller's
    ├── RuntimeStateError (RuntimeError)       a Runtime started again, or waited on before it started
    ├── NoDeliveryError (LookupError)          current_delivery() outside a send called by a node
    ├── RateLimited                            a send's provider refused for rate (HTTP 429), with its Retry-After
    ├── Undeliverable                          a send's provider refused the message for good: dead-letter it now
    ├── LockError
    │   ├── LockNotHeldError                   release/renew of a lock you do not hold
    │   ├── LockTimeoutError (TimeoutError)    acquire gave up after timeout_s
    │   ├── LockLostError                      the watchdog lost the lock mid-work
    │   │   └── MaxHoldExceededError           the hold-time ceiling was reached
    │   └── FencingTokenRejectedError          a write presented an outdated token
    └── StoreError                             the storage engine failed
        ├── StoreBusyError                     the database stayed locked past the timeout
        ├── StoreConnectionError               the connection to the database server was lost
        ├── StoreClosedError                   the store is not open
        ├── StoreAlreadyOpenError              open() of a store that is open already: it stays open
        ├── StoreLoopError                     the store is used from another event loop than open()'s
        ├── ReadOnlyStoreError                 a write on a store opened read-only, or a file we cannot write
        ├── NotADatabaseError                  the file is not a database of ours
        ├── StoreFileReplacedError             the SQLite file was deleted or replaced under the open store
        ├── UnreadableRowError                 a stored task's column cannot be decoded (written by another tool)
        └── SchemaVersionError                 the database was made by a newer or pre-0.1.0 version
"""

from __future__ import annotations

__all__ = (
    "CoordError",
    "FencingTokenRejectedError",
    "InvalidArgumentError",
    "InvalidTypeError",
    "LeaseLostError",
    "LockError",
    "LockLostError",
    "LockNotHeldError",
    "LockTimeoutError",
    "MaxHoldExceededError",
    "NoDeliveryError",
    "NotADatabaseError",
    "PayloadTooLargeError",
    "RateLimited",
    "ReadOnlyStoreError",
    "RuntimeStateError",
    "SchemaVersionError",
    "StoreAlreadyOpenError",
    "StoreBusyError",
    "StoreClosedError",
    "StoreLoopError",
    "UNRECOVERABLE_STORE_ERRORS",
    "StoreConnectionError",
    "StoreError",
    "StoreFileReplacedError",
    "TaskNotFoundError",
    "Undeliverable",
    "UnreadableRowError",
)


class CoordError(Exception):
    """Root of every error raised by asynccoord."""


class InvalidArgumentError(CoordError, ValueError):
    """An argument has an allowed type but a value that is out of range or malformed."""


class PayloadTooLargeError(InvalidArgumentError):
    """A task payload encodes to more bytes than the store's configured limit."""


class InvalidTypeError(CoordError, TypeError):
    """An argument has a type the function does not accept."""


class TaskNotFoundError(CoordError, KeyError):
    """No task with the given id exists in the store."""

    def __init__(self, task_id: int) -> None:
        super().__init__(f"no task with id {task_id!r}")
        self.task_id = task_id

    def __str__(self) -> str:  # KeyError would repr() the message otherwise
        return str(self.args[0])


class LeaseLostError(CoordError):
    """The caller's lease on a task is gone (expired, reclaimed or already settled).

    Nothing was written. ``reason`` says what the store saw instead.
    """

    def __init__(self, task_id: int, reason: str) -> None:
        super().__init__(f"lease on task {task_id} is lost: {reason}")
        self.task_id = task_id
        self.reason = reason


class RuntimeStateError(CoordError, RuntimeError):
    """A :class:`~asynccoord.node.runtime.Runtime` was asked for something its life stage does not allow.

    A Runtime runs once, as a ``threading.Thread`` does: ``start()`` (or ``async with``)
    after it was shut down, after it ran, or after its start failed raises this, as does
    ``wait_for_signal()`` before it started. Create a new Runtime to run again (pass the
    same ``node_ids`` to keep the nodes' partition affinity).
    """


class NoDeliveryError(CoordError, LookupError):
    """:func:`~asynccoord.node.delivery.current_delivery` was called outside a send called by a node.

    A ``LookupError`` too (what it raised before it had a class of its own): the delivery
    is looked up in a context variable that only a node sets, for the send's task.
    """


class RateLimited(CoordError):
    """Raised by a node's ``send``: the provider refused for rate (HTTP 429) and asked to wait.

    The node hands the task back to pending without using an attempt, in its place in its
    conversation, and the store pauses the bucket(s) cluster-wide until ``retry_after_s``
    from now: the one named by ``dimension`` (and ``key``: by default the task's own key of
    that dimension), or, with no ``dimension``, every bucket the task draws on. A task in no
    paused bucket of its own (its queue declares no such limit, or the provider named another
    key) is itself delayed by ``retry_after_s``.
    A node pauses at least 0.5 s (``asynccoord.node.settle.MIN_RATE_LIMIT_PAUSE_S``), so a
    provider answering ``Retry-After: 0`` is not called again at once, for ever. Counted as
    ``provider_rate_limited``.

    Args:
        retry_after_s: The provider's Retry-After, seconds: finite, 0..one year.
        dimension: Which declared limit the provider enforced, e.g. ``"chat"``; None for
            all of the task's. Default None.
        key: That limit's key (e.g. the account id when the provider pushes back on the
            whole account); None for the task's own. Requires ``dimension``. Default None.

    Raises:
        InvalidTypeError, InvalidArgumentError: a NaN, infinite or negative ``retry_after_s``,
            or a bad ``dimension``/``key`` (raised instead of this error, from the send,
            which then counts as a failed attempt).
    """

    def __init__(self, retry_after_s: float, *, dimension: str | None = None, key: str | None = None) -> None:
        from .contract.ratelimits import check_pause_target, check_retry_after_s

        self.retry_after_s = check_retry_after_s(retry_after_s)
        self.dimension, self.key = check_pause_target(dimension, key)
        where = "" if self.dimension is None else f" on {self.dimension}" + ("" if key is None else f"={key}")
        super().__init__(f"rate limited{where}: retry after {self.retry_after_s:g} s")

    def __reduce__(self) -> tuple[object, ...]:
        return (_rate_limited, (self.retry_after_s, self.dimension, self.key))


def _rate_limited(retry_after_s: float, dimension: str | None, key: str | None) -> RateLimited:
    return RateLimited(retry_after_s, dimension=dimension, key=key)


class Undeliverable(CoordError):
    """Raised by a node's ``send``: the provider refused this message for good, so no retry can help.

    A malformed message, a chat that no longer exists: the node records the attempt as
    failed and the task becomes a dead letter at once, whatever attempts it has left
    (``last_error`` is this error's text; ``dead_lettered`` is counted, so the default
    ``dead_letters`` alert tells of it), where any other exception would be retried by the
    retry policy. Its conversation goes on as after any dead letter (the queue's
    dead-letter policy); ``dead requeue`` sends it again once the cause is fixed. For a
    refusal that is routine (a user who blocked the bot), return from ``send`` instead:
    the task is then done, and what ``send`` returns is kept as its ``result``. Raised inside
    an exception group (a send built on a task group), it counts when every error of the
    group is one; ``last_error`` is then the first's text.

    Args:
        reason: Why, as the provider said it (e.g. ``"400 Bad Request: message is too long"``).
    """

    def __init__(self, reason: str) -> None:
        if not isinstance(reason, str):
            raise InvalidTypeError(f"reason must be a str, got {type(reason).__name__}")
        self.reason = reason
        super().__init__(reason)

    def __reduce__(self) -> tuple[object, ...]:
        return (Undeliverable, (self.reason,))


class LockError(CoordError):
    """Base class of distributed lock and semaphore errors."""


class LockNotHeldError(LockError):
    """Release or renew of a lock (or permit) that the caller does not hold."""


class LockTimeoutError(LockError, TimeoutError):
    """``acquire`` could not get the lock within ``timeout_s``.

    It is a ``TimeoutError``, which is also what ``asyncio.timeout()`` and
    ``asyncio.wait_for()`` raise at their own deadline: a plain ``except TimeoutError``
    around a lock taken under such a deadline cannot tell a busy lock from the deadline.
    Catch ``LockTimeoutError`` first (or test ``isinstance(exc, LockTimeoutError)``);
    whatever ``TimeoutError`` is left is the caller's own deadline::

        try:
            async with asyncio.timeout(10.0), Lock(store, "account:42", timeout_s=2.0):
                await send(message)
        except LockTimeoutError:
            ...  # the lock stayed busy for 2 s
        except TimeoutError:
            ...  # the 10 s deadline passed
    """


class LockLostError(LockError):
    """A lock guarding running work was lost; the guarded work was cancelled."""


class MaxHoldExceededError(LockLostError):
    """The watchdog stopped renewing because the hold-time ceiling ``max_hold_s`` passed."""


class FencingTokenRejectedError(LockError):
    """A write presented a fencing token lower than one the resource has already seen.

    Args:
        message: What was refused (see :func:`~asynccoord.contract.locks.fence_rejected_error`).
        resource: The fenced resource's name. Default None (not known).
        fencing_token: The token the write presented. Default None (not known).
        highest: The highest token the resource had accepted, above ``fencing_token``.
            Default None (not known). A lock store whose counter is behind it (a Redis
            restart that lost writes) is moved past it with ``advance_fencing_token``.

    Attributes:
        resource, fencing_token, highest: As given.
    """

    def __init__(
        self,
        message: str = "",
        *,
        resource: str | None = None,
        fencing_token: int | None = None,
        highest: int | None = None,
    ) -> None:
        super().__init__(message)
        self.resource = resource
        self.fencing_token = fencing_token
        self.highest = highest

    def __reduce__(self) -> tuple[object, ...]:
        return (_fencing_token_rejected, (str(self), self.resource, self.fencing_token, self.highest))


def _fencing_token_rejected(
    message: str, resource: str | None, fencing_token: int | None, highest: int | None
) -> FencingTokenRejectedError:
    return FencingTokenRejectedError(message, resource=resource, fencing_token=fencing_token, highest=highest)


class StoreError(CoordError):
    """The storage engine failed; the driver's exception is kept as ``__cause__``."""


class StoreBusyError(StoreError):
    """The database stayed write-locked by someone else for longer than the busy timeout."""


class StoreConnectionError(StoreError):
    """The connection to the database server was lost (or could not be made) and retries gave up.

    Raised by client-server stores (PostgreSQL, Redis) after their own retries with
    backoff. When the loss came while a write was committing, its outcome is unknown:
    every write of the queue and lock contracts is a compare-and-set, so repeating it
    never commits twice.
    """


class StoreClosedError(StoreError):
    """An operation was attempted on a store that is not open (or already closed)."""


class StoreAlreadyOpenError(StoreError):
    """``open()`` (or ``async with``) of a store that is already open; nothing changed, it stays open.

    A store is opened once and closed once: a nested ``async with store`` would close it
    under the outer block at its own exit. Hand the open store on instead. A store
    closed again may be opened again.
    """

    @classmethod
    def of(cls, store: object) -> StoreAlreadyOpenError:
        """The error for a second ``open()`` of ``store``, saying what to do instead."""
        return cls(
            f"{store!r} is already open (or being opened): open a store once and hand it on"
            " (an inner 'async with' would close it under the outer one)"
        )


class StoreLoopError(StoreError):
    """The store was used from another event loop than the one that opened it.

    A store's connections, writer task and pool belong to the event loop of its
    ``open()`` (one ``asyncio.run(...)``, one test's loop). Open a store in each loop
    that uses it; ``close()`` from another loop only releases the connections.
    """


class ReadOnlyStoreError(StoreError):
    """A write was attempted on a store opened with ``read_only=True``, or on a database this
    process cannot write (an SQLite file, or its folder, without write access: refused at
    ``open``); nothing was written.

    Attributes:
        path: When ``open`` refused an SQLite file that a read-only store could still read
            (a file without write access, a read-only mount): the file; else None.
        reason: Then, why it cannot be written (``the file is not writable by this process``).
    """

    def __init__(self, message: str, *, path: str | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.reason = reason


class NotADatabaseError(StoreError):
    """The path does not hold an SQLite database (or not one asynccoord can use)."""


class StoreFileReplacedError(StoreError):
    """The SQLite database file an open store works on was deleted, or replaced by another file.

    The store keeps the file it opened (its inode), so after ``rm`` or ``mv other.db
    bot.db`` its writes go to a file nobody else can open, and what other processes write
    to the new file at the path is never seen. The store checks the path every few seconds
    (see :mod:`asynccoord.backends.sqlite.identity`); from the check that finds the change
    on, every call raises this error. It cannot be cured by a retry: close the store and
    open the path again. The message names the path and what happened to it.
    """


class UnreadableRowError(StoreError):
    """A stored task's column holds a value this process cannot decode; nothing was changed.

    The stores write ``payload``, ``result`` and ``limit_keys`` as compact JSON that they
    read back. A row written by another tool or edited by hand (JSON cut short, a
    bytes value, an integer longer than this process's ``sys.get_int_max_str_digits()``,
    nesting deeper than Python's recursion limit) cannot be: :meth:`get` raises this error,
    ``dead_letters`` lists such a task with an :class:`~asynccoord.models.UnreadableValue`
    in place of the value, and a claim that meets one (its ``limit_keys`` too, in a
    rate-limited queue) dead-letters it (the ``unreadable_task`` event) and hands out the
    others, as ``fail`` and ``release(count_attempt=True)`` of a task held meanwhile do.
    Fix or discard the row.

    Args:
        task_id: The task whose row it is.
        column: The column that cannot be decoded, e.g. ``"payload"``.
        reason: Why, as the decoder said it.

    Attributes:
        task_id, column, reason: As given.
    """

    def __init__(self, task_id: int, column: str, reason: str) -> None:
        super().__init__(f"task {task_id}: stored {column} is unreadable: {reason}")
        self.task_id = task_id
        self.column = column
        self.reason = reason

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.task_id, self.column, self.reason))


class SchemaVersionError(StoreError):
    """The database's schema is not one this version of asynccoord can open; nothing was changed.

    Raised at ``open`` when the database was made by a newer asynccoord (upgrade
    asynccoord), when a read-only store finds an older schema (open it read-write once to
    migrate it), or when the database was made by a development version from before
    0.1.0, whose unreleased schema history was squashed and cannot be upgraded: delete the
    SQLite file (with its ``-wal`` and ``-shm`` files), or drop the PostgreSQL schema
    (``DROP SCHEMA name CASCADE``), and open the store again to start with an empty one.
    Also raised when the schema revision the database records is no number (its
    ``coord_meta`` table was altered or damaged). The message names the database and the fix.

    Attributes:
        found: For an older schema a read-only store refused, its version; else None.
        supported: For an older schema a read-only store refused, this asynccoord's version; else None.
    """

    def __init__(self, message: str, *, found: int | None = None, supported: int | None = None) -> None:
        super().__init__(message)
        self.found = found
        self.supported = supported


UNRECOVERABLE_STORE_ERRORS: tuple[type[StoreError], ...] = (StoreClosedError, StoreLoopError, StoreFileReplacedError)
"""Store errors no retry cures: the store is closed, serves another event loop, or its file is gone.

Nodes, the idle poll and membership stop on these (and fail) instead of retrying.
"""
