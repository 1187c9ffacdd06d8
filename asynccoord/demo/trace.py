"""Reading chat traces: JSON Lines (optionally gzipped), one message per line.

The format is that of ``chitchat_trace.jsonl.gz`` (see the bundled ``data/NOTICE.md``):
each line is a JSON object with at least ``msg_id`` (str), ``conversation_id`` (str),
``sender_id`` (str), ``ts_unix`` (int, seconds), ``seq`` (int, position in the
conversation) and ``text_len`` (int); ``flood`` (bool) is optional and other fields
(``text``, ``ts``, ``turn``) are ignored. Lines must be in time order, and a conversation's
``seq`` must not fall from one of its lines to the next (the demo checks its deliveries' order
against it).
"""

from __future__ import annotations

import gzip
import io
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import IO, Any

from ..errors import CoordError, InvalidArgumentError
from ..validation import _short, check_key

__all__ = ("SAMPLE_NAME", "TraceFormatError", "TraceMessage", "bundled_sample", "read_trace")

SAMPLE_NAME = "chitchat_sample.jsonl.gz"


class TraceFormatError(InvalidArgumentError):
    """A trace line is not valid; the message names the file and the line number."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceMessage:
    """One message of a trace."""

    msg_id: str
    conversation_id: str
    sender_id: str
    ts_unix: int
    seq: int
    text_len: int
    flood: bool = False


_REQUIRED: dict[str, type] = {
    "msg_id": str,
    "conversation_id": str,
    "sender_id": str,
    "ts_unix": int,
    "seq": int,
    "text_len": int,
}


def bundled_sample() -> Path:
    """Path of the sample shipped inside the package."""
    return Path(str(resources.files(__package__).joinpath("data", SAMPLE_NAME)))


def _open(path: Path) -> IO[bytes]:
    with open(path, "rb") as probe:
        magic = probe.read(2)
    if magic == b"\x1f\x8b":
        return io.BufferedReader(gzip.open(path, "rb"))
    return open(path, "rb")


_MAX_TS_UNIX = 253_402_300_799  # 9999-12-31T23:59:59Z


def _parse(line: str, where: str) -> TraceMessage:
    try:
        row: Any = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(row, dict):
        raise TraceFormatError(f"{where}: expected a JSON object, got {type(row).__name__}")
    for field, kind in _REQUIRED.items():
        if field not in row:
            raise TraceFormatError(f"{where}: missing field {field!r}")
        value = row[field]
        if isinstance(value, bool) or not isinstance(value, kind):
            raise TraceFormatError(f"{where}: field {field!r} must be {kind.__name__}, got {value!r}")
        if kind is str and not value:
            raise TraceFormatError(f"{where}: field {field!r} must not be empty")
    for field in ("msg_id", "conversation_id", "sender_id"):
        try:
            check_key(field, row[field], allow_blank=True)  # keys from the data, as the store takes them
        except CoordError as exc:
            raise TraceFormatError(f"{where}: {exc}") from None
    if not 0 <= row["ts_unix"] <= _MAX_TS_UNIX:
        raise TraceFormatError(f"{where}: 'ts_unix' must be a time between 1970 and 9999, got {_short(row['ts_unix'])}")
    flood = row.get("flood", False)
    if not isinstance(flood, bool):
        raise TraceFormatError(f"{where}: field 'flood' must be a bool, got {flood!r}")
    if row["seq"] < 0 or row["text_len"] < 0:
        raise TraceFormatError(f"{where}: 'seq' and 'text_len' must be >= 0")
    return TraceMessage(
        msg_id=row["msg_id"],
        conversation_id=row["conversation_id"],
        sender_id=row["sender_id"],
        ts_unix=row["ts_unix"],
        seq=row["seq"],
        text_len=row["text_len"],
        flood=flood,
    )


def read_trace(path: str | os.PathLike[str], *, limit: int | None = None) -> Iterator[TraceMessage]:
    """Yield the messages of a trace file in order.

    Args:
        path: A ``.jsonl`` or gzipped ``.jsonl.gz`` file (detected by content).
        limit: Stop after this many messages; None for all.

    Raises:
        InvalidArgumentError: the file does not exist, is a directory, or is not readable.
        TraceFormatError: a line is not a valid message, time goes backwards, or a
            conversation's ``seq`` falls; the message names the file and the 1-based line
            number.
    """
    file = Path(path)
    if file.is_dir():
        raise InvalidArgumentError(f"trace file {str(file)!r} is a directory, not a trace file")
    if not file.is_file():
        raise InvalidArgumentError(f"trace file {str(file)!r} does not exist")
    last_ts: int | None = None
    count = 0
    first_seen: dict[str, int] = {}  # msg_id -> line number
    last_seq: dict[str, int] = {}  # conversation_id -> its latest seq
    try:
        with _open(file) as handle:
            for number, raw in enumerate(handle, start=1):
                if limit is not None and count >= limit:
                    return
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise TraceFormatError(f"{file}:{number}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
                if not line.strip():
                    continue
                message = _parse(line, f"{file}:{number}")
                if last_ts is not None and message.ts_unix < last_ts:
                    raise TraceFormatError(f"{file}:{number}: ts_unix {message.ts_unix} goes back in time")
                before = last_seq.get(message.conversation_id)
                if before is not None and message.seq < before:
                    raise TraceFormatError(
                        f"{file}:{number}: seq {message.seq} of conversation {message.conversation_id!r}"
                        f" comes after its seq {before}: a conversation's seq must not fall"
                    )
                last_seq[message.conversation_id] = message.seq
                seen_at = first_seen.setdefault(message.msg_id, number)
                if seen_at != number:
                    raise TraceFormatError(f"{file}:{number}: msg_id {message.msg_id!r} repeats line {seen_at}")
                last_ts = message.ts_unix
                count += 1
                yield message
    except (OSError, EOFError) as exc:
        raise TraceFormatError(f"{file}: cannot read the trace ({exc})") from exc
