"""What ``status`` and ``dead`` print from the database, and the CLI's log and error lines, cannot drive a terminal."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from pathlib import Path

import pytest

from asynccoord import SQLiteStore
from asynccoord._leftovers import Leftovers
from asynccoord.cli.main import main
from asynccoord.cli.printable import printable, printable_report
from asynccoord.cli.run import log_left_behind

ERROR = "boom \x1b[31mred\x1b[0m \x9b2J \u202eevil"
LOCK = "acct\x1b[2J"
HOLDER = "h\x1b]0;TITLE\x07"


def test_printable_escapes_control_and_bidi_characters_and_keeps_the_rest() -> None:
    assert printable(ERROR) == "boom \\x1b[31mred\\x1b[0m \\x9b2J \\u202eevil"
    assert printable("tab\there\nnew \x7f") == "tab\\x09here\\x0anew \\x7f"
    assert printable("Привет 👋 [/x] é") == "Привет 👋 [/x] é"  # letters, emoji and markup-like text stay
    assert printable("a\u2028b\u200ec\ufeffd\u061ce") == "a\\u2028b\\u200ec\\ufeffd\\u061ce"
    zwnj = "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645"  # Persian: a word with a zero-width non-joiner
    assert printable(f"\U0001f468\u200d\U0001f469 {zwnj}") == f"\U0001f468\u200d\U0001f469 {zwnj}"  # joiners stay
    report = {"a\x1b": ["\x1b", ("x\x07", 3)], "n": None, "f": 1.5}
    assert printable_report(report) == {"a\\x1b": ["\\x1b", ("x\\x07", 3)], "n": None, "f": 1.5}


def _prepare(path: Path) -> None:
    async def go() -> None:
        async with SQLiteStore(path) as store:
            await store.enqueue("q", {}, partition_key="chat\x1b[1m", max_attempts=1)
            [task] = await store.claim("q", node_id="n\u202e[5m")
            await store.fail(task, ERROR)
            assert await store.try_acquire_lock("acct", ttl_s=600, holder=HOLDER) is not None

    asyncio.run(go())
    # A lock name no acquisition takes now (a control character), as an older version wrote it.
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        for table in ("coord_lock_names", "coord_lock_holders"):
            assert db.execute(f"UPDATE {table} SET name = ? WHERE name = 'acct'", (LOCK,)).rowcount == 1


@pytest.mark.parametrize("command", [["dead", "--queue", "q"], ["status"]])
def test_no_control_character_from_the_database_reaches_the_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    db = tmp_path / "bot.db"
    _prepare(db)
    code = main([command[0], "--db", str(db), *command[1:], "--color", "never"])
    out = capsys.readouterr().out
    assert code == 0
    assert not any(c in out for c in "\x1b\x07\x9b\u202e"), repr(out)
    if command[0] == "dead":
        assert "\\x1b[31mred" in out  # shown, escaped
        assert "chat\\x1b[1m" in out
    else:
        assert "acct\\x1b[2J" in out
        assert "h\\x1b]0;TITLE\\x07" in out


def test_a_wide_key_and_payload_leave_the_error_readable_and_payloads_are_escaped_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "wide.db"

    async def go() -> None:
        async with SQLiteStore(db) as store:
            payload = {"text": "E\x1b[2J" + "p" * 120}
            await store.enqueue("q", payload, partition_key="k" * 55, max_attempts=1)
            [task] = await store.claim("q", node_id="n")
            await store.fail(task, "HTTPError: 400 Bad Request: chat not found")

    asyncio.run(go())
    assert main(["dead", "--db", str(db), "--queue", "q", "--show-payloads", "--color", "never"]) == 0
    out = capsys.readouterr().out
    assert "last error" in out
    assert "HTTPError: 400" in out  # the error column keeps a readable width
    assert "k" * 29 + "..." in out  # the key is shortened in the table (--json has it whole)
    assert '"E\\u001b[2J' in out  # the payload's ESC as JSON escapes it, once: no doubled backslash
    assert "\x1b" not in out


def test_printable_escapes_lone_surrogates_which_no_utf8_stream_can_write() -> None:
    assert printable("a\ud800b\udc80") == "a\\ud800b\\udc80"
    assert printable("\U0001f44b") == "\U0001f44b"  # a pair's character stays


def test_the_names_of_threads_left_behind_are_escaped_in_the_log_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="asynccoord.cli.run")
    log_left_behind(Leftovers(tasks=0, threads=0, other_threads=("pool\nx\x1b[2J",)), exiting=False)
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("asynccoord.run.left_behind ")]
    assert not any(c in line for c in "\n\x1b"), line
    assert "(pool\\x0ax\\x1b[2J)" in line


def test_a_users_error_text_in_the_error_line_of_a_command_is_escaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``run``'s one error line may carry a lifespan's exception text: it stays one line, without escapes."""
    (tmp_path / "evil_lifespan.py").write_text(
        'def lifespan():\n    raise RuntimeError("\\u202eevil\\nline2\\x1b[31mred")\n', encoding="utf-8"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    db = tmp_path / "bot.db"
    argv = ["run", "--db", str(db), "--send", "asyncio:sleep", "--lifespan", "evil_lifespan:lifespan"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    [line] = [line for line in err.splitlines() if line.startswith("asynccoord run: error: ")]
    assert "RuntimeError: \\u202eevil\\x0aline2\\x1b[31mred" in line, err
    assert not any(c in err for c in "\x1b\u202e"), repr(err)
    assert not db.exists()
