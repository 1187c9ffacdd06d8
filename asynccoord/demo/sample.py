"""Derive the bundled trace sample from the full Chit-Chat trace.

The sample keeps the structure of 30,000 consecutive messages (from 2018-05-05T00:00Z,
three busy days) and none of their text: ``msg_id``, ``conversation_id``,
``sender_id``, ``ts_unix``, ``seq``, ``text_len``, ``flood``. It is written with a fixed
gzip header, so re-running gives a byte-identical file::

    python -m asynccoord.demo.sample ../shared/data/chitchat_trace.jsonl.gz \\
        asynccoord/demo/data/chitchat_sample.jsonl.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

from .trace import read_trace

__all__ = ("make_sample",)

START_TS = 1525478400  # 2018-05-05T00:00:00Z


def make_sample(source: Path, target: Path, *, messages: int = 30_000, start_ts: int = START_TS) -> int:
    """Write ``messages`` messages of ``source`` from ``start_ts`` on to ``target``; return the count."""
    written = 0
    with open(target, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as out:
        for m in read_trace(source):
            if m.ts_unix < start_ts:
                continue
            row = {
                "msg_id": m.msg_id,
                "conversation_id": m.conversation_id,
                "sender_id": m.sender_id,
                "ts_unix": m.ts_unix,
                "seq": m.seq,
                "text_len": m.text_len,
                "flood": m.flood,
            }
            out.write((json.dumps(row, separators=(",", ":")) + "\n").encode())
            written += 1
            if written >= messages:
                break
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="the full trace (chitchat_trace.jsonl.gz)")
    parser.add_argument("target", type=Path, help="where to write the sample")
    parser.add_argument("--messages", type=int, default=30_000, help="messages to keep (default 30000)")
    args = parser.parse_args()
    print(f"wrote {make_sample(args.source, args.target, messages=args.messages)} messages to {args.target}")


if __name__ == "__main__":
    main()
