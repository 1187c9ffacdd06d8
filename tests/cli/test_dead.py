"""``python -m asynccoord dead``: list a queue's dead tasks read-only, requeue or discard them.

End to end on an SQLite file (in this process through ``main``, and once as a real
``python -m asynccoord`` process) and on PostgreSQL: the listing's table and JSON, its
pages, payloads hidden unless asked for, the two actions and what they change, and the
usage errors (exit status 2) that touch no database.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from conftest import PythonRunner
from services import PG_DSN, drop_schemas, new_schema, pg_rows, postgres_problem, unavailable

from asynccoord import SQLiteStore, TaskStatus
from asynccoord.backends.postgres.store import PostgresStore
from asynccoord.cli.main import main
from asynccoord.models import UNREADABLE_TEXT_SHOWN

Q = "outbox"
SECRET = "secret-text-of-a-user"


async def make_dead(store: Any, n: int, *, queue: str = Q) -> list[int]:
    """``n`` dead tasks of ``queue`` (keys chat-0/chat-1 in turn, payloads holding :data:`SECRET`); their ids."""
    ids = [
        (await store.enqueue(queue, {"text": f"{SECRET} {i}"}, partition_key=f"chat-{i % 2}", max_attempts=1)).task.id
        for i in range(n)
    ]
    for task in await store.claim(queue, node_id="n", limit=n):
        await store.fail(task, f"HTTPError: 400 Bad Request: chat not found ({task.id}) " + "x" * 200)
    return ids


def prepare_sqlite(path: Path, n: int, *, hold: bool = False) -> list[int]:
    async def prepare() -> list[int]:
        async with SQLiteStore(path) as store:
            if hold:
                await store.set_dead_letter_policy(Q, "hold")
            ids = await make_dead(store, n)
            await make_dead(store, 2, queue="other")
            await store.enqueue(Q, "alive", partition_key="chat-9")
            return ids

    return asyncio.run(prepare())


async def statuses_in(store: Any, ids: list[int]) -> list[TaskStatus | None]:
    """Each task's status in ``store`` (None: gone)."""
    out: list[TaskStatus | None] = []
    for i in ids:
        try:
            out.append((await store.get(i)).status)
        except KeyError:
            out.append(None)
    return out


def statuses(path: Path, ids: list[int]) -> list[TaskStatus | None]:
    """Each task's status now (None: gone)."""

    async def read() -> list[TaskStatus | None]:
        async with SQLiteStore(path, read_only=True) as store:
            return await statuses_in(store, ids)

    return asyncio.run(read())


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["dead", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_table_lists_dead_tasks_by_id_with_errors_shortened_and_payloads_hidden(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "bot.db"
    ids = prepare_sqlite(db, 3, hold=True)
    code, out, err = run(capsys, "--db", str(db), "--queue", Q, "--color", "never")
    assert (code, err) == (0, "")
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [r[0] for r in rows] == [str(i) for i in ids]
    assert [r[1] for r in rows] == ["chat-0", "chat-1", "chat-0"]
    assert [r[2] for r in rows] == ["1/1"] * 3
    assert f"HTTPError: 400 Bad Request: chat not found ({ids[0]}) xxxxxxx" in out
    assert "x" * 60 not in out  # shortened to ERROR_CHARS
    assert f"Dead tasks of '{Q}' in {db} (3; policy hold)" in out
    assert "policy hold: each of these keeps its conversation" in out
    assert SECRET not in out
    assert "payloads hidden: add --show-payloads" in out
    assert "more may follow" not in out

    code, out, _ = run(capsys, "--db", str(db), "--queue", Q, "--show-payloads", "--color", "never")
    assert code == 0
    assert f'{{"text": "{SECRET} 0"}}' in out
    assert "payloads hidden" not in out

    code, out, err = run(capsys, "--db", str(db), "--queue", "nothing-here")
    assert (code, out.strip()) == (0, f"No dead tasks of 'nothing-here' in {db}.")
    assert err == "note: no task of 'nothing-here' is in this database (is --queue spelt right?)\n"


def test_the_header_quotes_a_queue_name_unambiguously_with_bidi_overrides_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A queue name may hold a bidirectional override (not a control character): escaped in the header."""
    db = tmp_path / "bot.db"
    odd = 'it\'s "q"\u202e'

    async def prepare() -> None:
        async with SQLiteStore(db) as store:
            await make_dead(store, 1, queue=odd)

    asyncio.run(prepare())
    code, out, err = run(capsys, "--db", str(db), "--queue", odd, "--color", "never")
    assert (code, err) == (0, "")
    assert "Dead tasks of 'it\\'s \"q\"\\u202e' in " in out
    assert "\u202e" not in out
    code, out, _ = run(capsys, "--db", str(db), "--queue", odd + "x", "--color", "never")
    assert out.startswith("No dead tasks of 'it\\'s \"q\"\\u202ex' in ")


def test_a_queue_name_with_a_control_character_is_bad_usage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No queue can be named so (enqueue refuses it too): exit 2, the name escaped, nothing opened."""
    db = tmp_path / "bot.db"
    with pytest.raises(SystemExit) as exited:
        run(capsys, "--db", str(db), "--queue", "q\x1b[31m", "--color", "never")
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--queue must not hold the control character '\\x1b'" in err
    assert "\x1b" not in err
    assert not db.exists()


def test_json_pages_through_every_dead_task_with_whole_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "bot.db"
    ids = prepare_sqlite(db, 5)
    pages: list[dict[str, Any]] = []
    after: list[str] = []
    while True:
        code, out, err = run(capsys, "--db", str(db), "--queue", Q, "--limit", "2", "--json", *after)
        assert (code, err) == (0, "")
        page = json.loads(out)
        pages.append(page)
        if page["next_after"] is None:
            break
        after = ["--after", str(page["next_after"])]
    assert [[t["id"] for t in p["tasks"]] for p in pages] == [ids[0:2], ids[2:4], ids[4:5]]
    assert [p["after_id"] for p in pages] == [None, ids[1], ids[3]]
    first = pages[0]
    assert {k: v for k, v in first.items() if k != "tasks"} == {
        "db": str(db),
        "queue": Q,
        "dead_letter_policy": "skip",
        "after_id": None,
        "limit": 2,
        "payloads_shown": False,
        "next_after": ids[1],
    }
    task = first["tasks"][0]
    assert "payload" not in task
    assert task["last_error"] == f"HTTPError: 400 Bad Request: chat not found ({ids[0]}) " + "x" * 200
    assert (task["partition_key"], task["attempts"], task["max_attempts"]) == ("chat-0", 1, 1)
    assert task["updated_at"] >= task["created_at"] > 0
    assert set(task) == {
        "id",
        "partition_key",
        "partition",
        "idempotency_key",
        "priority",
        "attempts",
        "max_attempts",
        "created_at",
        "updated_at",
        "last_error",
    }
    code, out, _ = run(capsys, "--db", str(db), "--queue", Q, "--json", "--show-payloads", "--limit", "1")
    shown = json.loads(out)
    assert shown["payloads_shown"] is True
    assert [t["payload"] for t in shown["tasks"]] == [{"text": f"{SECRET} 0"}]


def test_requeue_and_discard_change_what_they_name_and_say_how_many(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "bot.db"
    a, b, c, d = prepare_sqlite(db, 4, hold=True)
    code, out, err = run(capsys, "requeue", "--db", str(db), "--queue", Q, "--id", str(a), "--id", str(c))
    assert (code, out, err) == (0, f"requeued 2 dead tasks of '{Q}': ids {a}, {c}\n", "")
    assert statuses(db, [a, b, c, d]) == [TaskStatus.PENDING, TaskStatus.DEAD, TaskStatus.PENDING, TaskStatus.DEAD]
    # The options may also come before the action.
    code, out, err = run(capsys, "--db", str(db), "--queue", Q, "discard", "--id", str(b), "--id", str(a))
    assert code == 1  # a was no dead task: b is discarded all the same, and the status says not all were
    assert out == f"discarded 1 dead task of '{Q}': id {b}\n"
    assert err == (
        f"asynccoord dead: error: not discarded, it names no dead task of '{Q}' (already requeued or discarded, "
        f"not dead, or of another queue): id {a}\n"
    )
    assert statuses(db, [a, b, c, d]) == [TaskStatus.PENDING, None, TaskStatus.PENDING, TaskStatus.DEAD]
    code, out, _ = run(capsys, "discard", "--db", str(db), "--queue", Q, "--all")
    assert (code, out) == (0, f"discarded 1 dead task of '{Q}'\n")
    assert statuses(db, [a, b, c, d]) == [TaskStatus.PENDING, None, TaskStatus.PENDING, None]
    code, out, err = run(capsys, "requeue", "--db", str(db), "--queue", Q, "--all")
    assert (code, out, err) == (0, f"requeued 0 dead tasks of '{Q}'\n", "")  # the queue has tasks: no note
    code, out, err = run(capsys, "--db", str(db), "--queue", Q)
    assert (code, out.strip(), err) == (0, f"No dead tasks of '{Q}' in {db}.", "")  # the queue has tasks: no note

    async def other_queue() -> list[int]:
        async with SQLiteStore(db, read_only=True) as store:
            return [t.id for t in await store.dead_letters("other")]

    assert len(asyncio.run(other_queue())) == 2  # another queue's dead tasks are left alone


@pytest.mark.parametrize("action", ["requeue", "discard"])
@pytest.mark.parametrize("which", [["--all"], ["--id", "1"]])
def test_a_queue_the_database_does_not_know_is_an_error_naming_those_it_knows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], action: str, which: list[str]
) -> None:
    db = tmp_path / "bot.db"
    ids = prepare_sqlite(db, 2)
    code, out, err = run(capsys, action, "--db", str(db), "--queue", "outbx", *which)  # a misspelt queue
    assert (code, out) == (1, "")
    assert err == (
        "asynccoord dead: error: no queue 'outbx' in this database (no task, no setting; "
        f"its queues: 'other', '{Q}'); nothing was changed\n"
    )
    assert statuses(db, ids) == [TaskStatus.DEAD, TaskStatus.DEAD]


def test_a_queue_known_only_by_its_setting_is_no_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "bot.db"
    prepare_sqlite(db, 1)

    async def hold() -> None:
        async with SQLiteStore(db) as store:
            await store.set_dead_letter_policy("quiet", "hold")

    asyncio.run(hold())
    code, out, err = run(capsys, "requeue", "--db", str(db), "--queue", "quiet", "--all")
    assert (code, out, err) == (0, "requeued 0 dead tasks of 'quiet'\n", "")


@pytest.mark.parametrize("action", ["requeue", "discard"])
def test_all_and_many_ids_are_acted_on_a_batch_per_transaction(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, action: str
) -> None:
    db = tmp_path / "bot.db"
    ids = prepare_sqlite(db, 7)
    monkeypatch.setattr("asynccoord.cli.dead.SETTLE_BATCH", 3)
    batches: list[list[int]] = []
    method = f"{action}_dead"
    original = getattr(SQLiteStore, method)

    async def recording(self: SQLiteStore, queue: str, task_ids: Any = None) -> int:
        batches.append(list(task_ids))
        return int(await original(self, queue, task_ids))

    monkeypatch.setattr(SQLiteStore, method, recording)
    done = "requeued" if action == "requeue" else "discarded"
    code, out, _ = run(capsys, action, "--db", str(db), "--queue", Q, "--all")
    assert (code, out) == (0, f"{done} 7 dead tasks of '{Q}'\n")
    assert batches == [ids[:3], ids[3:6], ids[6:]]  # paged through by id, 3 per transaction
    assert statuses(db, ids) == [TaskStatus.PENDING if action == "requeue" else None] * 7

    more = prepare_sqlite(tmp_path / "more.db", 5)
    batches.clear()
    code, out, _ = run(
        capsys, action, "--db", str(tmp_path / "more.db"), "--queue", Q, *[a for i in more for a in ("--id", str(i))]
    )
    assert (code, out) == (0, f"{done} 5 dead tasks of '{Q}': ids {', '.join(map(str, more))}\n")
    assert batches == [more[:3], more[3:]]


@pytest.mark.parametrize(
    ("argv", "usage", "named"),
    [
        (["requeue", "--queue", Q], "dead requeue", "one of the arguments --id --all is required"),
        (
            ["discard", "--queue", Q, "--id", "1", "--all"],
            "dead discard",
            "argument --all: not allowed with argument --id",
        ),
        (["requeue", "--queue", Q, "--id", "one"], "dead requeue", "argument --id: invalid int value: 'one'"),
        (["requeue", "--queue", Q, "--id", "-5"], "dead requeue", "--id must be >= 1, got -5"),
        (["discard", "--queue", Q, "--id", "0"], "dead discard", "--id must be >= 1, got 0"),  # ids start at 1
        (["--queue", Q, "--limit", "0"], "dead", "--limit must be >= 1, got 0"),
        (["--queue", Q, "--limit", "10001"], "dead", "--limit must be <= 10000, got 10001"),
        (["--queue", Q, "--after", "-1"], "dead", "--after must be >= 0, got -1"),
        (["--queue", " "], "dead", "--queue must not be only whitespace"),
        ([], "dead", "the following arguments are required: --queue"),
        (["--queue", Q, "--limit", "5", "requeue", "--all"], "dead requeue", "--limit belongs to the listing"),
        (["--queue", Q, "--json", "discard", "--all"], "dead discard", "--json belongs to the listing"),
        (["discard", "--queue", Q, "--all", "--json"], "dead discard", "--json belongs to the listing"),
        (["requeue", "--queue", Q, "--id", "3", "--limit", "5"], "dead requeue", "--limit belongs to the listing"),
        (["--queue", Q, "--schema", "bots"], "dead", "--schema 'bots' applies to a postgresql:// --db only"),
        (["discard", "--queue", Q, "--all", "--schema", "bots"], "dead discard", "applies to a postgresql:// --db"),
        (
            ["--queue", Q, "--all"],
            "dead --db",
            "error: --all needs an action before it: 'dead requeue --all' or 'dead discard --all' "
            "(actions: requeue, discard; without one, dead lists the dead tasks)\n",
        ),
        (
            ["--queue", Q, "--id", "3"],
            "dead --db",
            "error: --id 3 needs an action before it: 'dead requeue --id 3' or 'dead discard --id 3' "
            "(actions: requeue, discard; without one, dead lists the dead tasks)\n",
        ),
        (["--id", "3", "requeue", "--queue", Q, "--all"], "dead requeue", "--id 3 goes after the action"),
        # Nothing after the action: named the same, not argparse's "one of the arguments ... is required".
        (
            ["--queue", Q, "--id", "3", "requeue"],
            "dead requeue",
            "dead requeue: error: --id 3 goes after the action: 'dead requeue --id 3'\n",
        ),
        (
            ["--id", "3", "--id", "4", "discard", "--queue", Q],
            "dead discard",
            "dead discard: error: --id 3 --id 4 goes after the action: 'dead discard --id 3 --id 4'\n",
        ),
        (
            ["--all", "requeue", "--queue", Q],
            "dead requeue",
            "error: --all goes after the action: 'dead requeue --all'",
        ),
        (["--queue", Q, "--frobnicate"], "dead --db", "unrecognized arguments: --frobnicate"),
        (["requeue", "--queue", Q, "--all", "--frobnicate"], "dead requeue", "unrecognized arguments: --frobnicate"),
    ],
)
def test_usage_errors_exit_2_and_touch_no_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], usage: str, named: str
) -> None:
    db = tmp_path / "never.db"
    with pytest.raises(SystemExit) as exited:
        main(["dead", "--db", str(db), *argv])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: python -m asynccoord {usage}"), err
    assert named in err, err
    assert list(tmp_path.iterdir()) == []


def test_a_missing_db_or_queue_option_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["dead"], ["dead", "requeue", "--all"]):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2
        assert "the following arguments are required: --db, --queue" in capsys.readouterr().err


@pytest.mark.parametrize("action", [[], ["requeue", "--all"], ["discard", "--id", "1"]])
def test_a_missing_database_is_an_error_and_none_is_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], action: list[str]
) -> None:
    db = tmp_path / "typo.db"
    code, out, err = run(capsys, *action[:1], "--db", str(db), "--queue", Q, *action[1:])
    assert (code, out) == (1, "")
    # A write action creates none either, but it is not read-only: its own name says so.
    never = f"dead {action[0]} never creates one" if action else "a read-only store never creates one"
    assert err == f"asynccoord dead: error: no database at '{db}' ({never})\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("action", [[], ["requeue", "--all"]])
def test_neither_listing_nor_an_action_migrates_an_older_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], action: list[str]
) -> None:
    """Both open read-only first, as ``status`` does: a file the nodes have not migrated yet is left as it is."""
    from asynccoord.backends.sqlfiles import load_migrations
    from asynccoord.backends.sqlite.store import SCHEMA_VERSION, _split_script

    db = tmp_path / "old.db"
    record = "INSERT OR REPLACE INTO coord_meta (key, value) VALUES (?, ?)"
    with contextlib.closing(sqlite3.connect(db)) as raw, raw:
        for number, script in load_migrations("sqlite")[:3]:
            for statement in _split_script(script):
                raw.execute(statement)
            raw.execute(record, ("schema_revision", str(number)))
        raw.execute(record, ("partitions", "1024"))
    code, out, err = run(capsys, *action[:1], "--db", str(db), "--queue", Q, *action[1:])
    assert (code, out) == (1, "")
    assert f"{str(db)!r} has schema version 3, older than {SCHEMA_VERSION}: " in err
    if action:  # a write command: no advice to read it read-only, but which command migrates it
        assert err == (
            f"asynccoord dead: error: {str(db)!r} has schema version 3, older than {SCHEMA_VERSION}: dead requeue "
            "migrates no database; 'python -m asynccoord run' of this asynccoord does (as any node start), "
            "once no node of the older version uses it; then dead requeue again\n"
        )
    else:
        assert "then inspect it read-only" in err
    with contextlib.closing(sqlite3.connect(db)) as raw:
        assert raw.execute("SELECT value FROM coord_meta WHERE key = 'schema_revision'").fetchone() == ("3",)


def test_the_command_as_a_process(python: PythonRunner, tmp_path: Path) -> None:
    db = tmp_path / "bot.db"
    ids = prepare_sqlite(db, 2)
    listed = python.run_module("asynccoord", "dead", "--db", str(db), "--queue", Q, "--json")
    assert [t["id"] for t in json.loads(listed.stdout)["tasks"]] == ids
    done = python.run_module("asynccoord", "dead", "requeue", "--db", str(db), "--queue", Q, "--all")
    assert done.stdout == f"requeued 2 dead tasks of '{Q}'\n"
    bad = python.run_module("asynccoord", "dead", "discard", "--db", str(db), "--queue", Q, check=False)
    assert bad.returncode == 2
    assert "one of the arguments --id --all is required" in bad.stderr
    assert statuses(db, ids) == [TaskStatus.PENDING, TaskStatus.PENDING]
    # --id before the action, nothing after it: a one-line error naming the right form, nothing changed.
    dead = tmp_path / "dead.db"
    first, second = prepare_sqlite(dead, 2)
    early = python.run_module(
        "asynccoord", "dead", "--db", str(dead), "--queue", Q, "--id", str(first), "requeue", check=False
    )
    assert (early.returncode, early.stdout) == (2, "")
    assert early.stderr.splitlines()[1:] == [
        f"python -m asynccoord dead requeue: error: --id {first} goes after the action: 'dead requeue --id {first}'"
    ]
    assert statuses(dead, [first, second]) == [TaskStatus.DEAD, TaskStatus.DEAD]


def test_on_postgresql(capsys: pytest.CaptureFixture[str]) -> None:
    problem = postgres_problem()
    if problem is not None:
        unavailable("PostgreSQL", problem)
    schema = new_schema("cli")

    async def prepare() -> list[int]:
        async with PostgresStore(PG_DSN, schema=schema, listen=False) as store:
            await store.set_dead_letter_policy(Q, "hold")
            return await make_dead(store, 3)

    async def state(ids: list[int]) -> list[TaskStatus | None]:
        async with PostgresStore(PG_DSN, schema=schema, listen=False) as store:
            return await statuses_in(store, ids)

    try:
        a, b, c = asyncio.run(prepare())
        code, out, err = run(capsys, "--db", PG_DSN, "--schema", schema, "--queue", Q, "--json", "--limit", "2")
        assert (code, err) == (0, "")
        page = json.loads(out)
        assert [t["id"] for t in page["tasks"]] == [a, b]
        assert (page["dead_letter_policy"], page["next_after"]) == ("hold", b)
        assert page["db"].endswith(f" (schema {schema})")
        assert "payload" not in page["tasks"][0]
        code, out, _ = run(capsys, "--db", PG_DSN, "--schema", schema, "--queue", Q, "--color", "never")
        assert code == 0
        assert SECRET not in out
        assert f"({a}) xxx" in out
        code, out, _ = run(capsys, "requeue", "--db", PG_DSN, "--schema", schema, "--queue", Q, "--id", str(b))
        assert (code, out) == (0, f"requeued 1 dead task of '{Q}': id {b}\n")
        code, out, _ = run(capsys, "discard", "--db", PG_DSN, "--schema", schema, "--queue", Q, "--all")
        assert (code, out) == (0, f"discarded 2 dead tasks of '{Q}'\n")
        assert asyncio.run(state([a, b, c])) == [None, TaskStatus.PENDING, None]
        # At an older schema version: the action says which command migrates it, and migrates nothing.
        pg_rows(f"UPDATE {schema}.coord_meta SET value = '1' WHERE key = 'schema_revision'")
        code, out, err = run(capsys, "requeue", "--db", PG_DSN, "--schema", schema, "--queue", Q, "--all")
        assert (code, out) == (1, "")
        assert "has schema version 1, older than " in err
        assert "dead requeue migrates no database; 'python -m asynccoord run' of this asynccoord does" in err
        assert pg_rows(f"SELECT value FROM {schema}.coord_meta WHERE key = 'schema_revision'") == [("1",)]
    finally:
        drop_schemas(schema)

    # A mistyped schema: an error, and no schema created by the write command.
    typo = new_schema("typo")
    code, out, err = run(capsys, "discard", "--db", PG_DSN, "--schema", typo, "--queue", Q, "--all")
    assert (code, out) == (1, "")
    assert f"no asynccoord tables in schema '{typo}'" in err
    assert pg_rows("SELECT 1 FROM information_schema.schemata WHERE schema_name = $1", typo) == []


def test_the_usage_lines_show_every_option_and_the_actions_required_ones(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["dead", "--help"])
    usage = capsys.readouterr().out.split("\n\n")[0]
    assert "[--color {auto,always,never}]" in usage
    for action in ("requeue", "discard"):
        with pytest.raises(SystemExit):
            main(["dead", action, "--help"])
        usage = capsys.readouterr().out.split("\n\n")[0]
        assert usage.endswith(f"dead {action} --db TARGET --queue NAME (--id ID [--id ID ...] | --all) [--schema NAME]")


def test_each_usage_form_names_the_arguments_it_needs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["dead", "--help"])
    out = capsys.readouterr().out
    lines = out.split("\n\n")[0].removeprefix("usage: ").splitlines()
    prog = "python -m asynccoord dead"
    # A line that begins with the command begins a form; the others continue the form above them.
    forms: list[str] = []
    for line in lines:
        if line.strip().startswith(prog):
            forms.append(line.strip())
        else:
            assert line.startswith(" " * len(f"usage: {prog} ")), line  # indented under the form's options
            forms[-1] += " " + line.strip()
    assert forms == [
        f"{prog} --db TARGET --queue NAME [--limit N] [--after ID] [--json] [--show-payloads]"
        " [--color {auto,always,never}] [--schema NAME]",
        f"{prog} {{requeue,discard}} --db TARGET --queue NAME (--id ID [--id ID ...] | --all) [--schema NAME]",
    ]
    assert "Listing needs --db and --queue" in " ".join(out.split())


def test_a_dead_task_whose_payload_cannot_be_decoded_is_listed_and_can_be_discarded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "bot.db"
    ids = prepare_sqlite(db, 2)
    with contextlib.closing(sqlite3.connect(db)) as raw, raw:  # a hand edit cut it short
        raw.execute("UPDATE coord_tasks SET payload = ? WHERE id = ?", ('{"text": "cut', ids[0]))

    code, out, err = run(capsys, "--db", str(db), "--queue", Q, "--json", "--show-payloads")
    assert (code, err) == (0, "")
    first, second = json.loads(out)["tasks"]
    assert (first["id"], first["payload"]) == (ids[0], None)
    assert first["payload_unreadable"]["text"] == '{"text": "cut'
    assert first["payload_unreadable"]["length"] == len('{"text": "cut')
    assert first["payload_unreadable"]["reason"].startswith("JSONDecodeError: ")
    assert "payload_unreadable" not in second

    code, out, err = run(capsys, "--db", str(db), "--queue", Q, "--show-payloads", "--color", "never")
    assert (code, err) == (0, "")
    assert '(unreadable) {"text": "cut' in out

    assert main(["status", "--db", str(db)]) == 0
    capsys.readouterr()

    code, out, err = run(capsys, "discard", "--db", str(db), "--queue", Q, "--id", str(ids[0]))
    assert (code, err) == (0, "")
    assert statuses(db, ids) == [None, TaskStatus.DEAD]


def test_an_unreadable_payload_is_named_with_payloads_hidden(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "bot.db"
    ids = prepare_sqlite(db, 2)
    with contextlib.closing(sqlite3.connect(db)) as raw, raw:  # dead of its send's error, then cut short
        raw.execute("UPDATE coord_tasks SET payload = ? WHERE id = ?", (f'{{"text": "{SECRET}', ids[1]))

    code, out, err = run(capsys, "--db", str(db), "--queue", Q, "--json")
    assert (code, err) == (0, "")
    first, second = json.loads(out)["tasks"]
    assert "payload_unreadable" not in first
    assert second["payload_unreadable"]["length"] == len(f'{{"text": "{SECRET}')
    assert second["payload_unreadable"]["reason"].startswith("JSONDecodeError: ")
    assert "text" not in second["payload_unreadable"]
    assert SECRET not in out

    code, out, err = run(capsys, "--db", str(db), "--queue", Q, "--color", "never")
    assert (code, err) == (0, "")
    assert f"unreadable payload: id {ids[1]} (requeued, such a task goes dead again" in " ".join(out.split())
    assert SECRET not in out


def test_an_unreadable_payload_is_listed_cut_to_its_first_characters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "bot.db"
    ids = prepare_sqlite(db, 1)
    garbage = "\x01" + "x\x02" * 2_500_000  # 5,000,001 characters another tool wrote, held to no size limit
    with contextlib.closing(sqlite3.connect(db)) as raw, raw:
        raw.execute("UPDATE coord_tasks SET payload = ? WHERE id = ?", (garbage, ids[0]))

    code, out, err = run(capsys, "--db", str(db), "--queue", Q, "--json", "--show-payloads")
    assert (code, err) == (0, "")
    (task,) = json.loads(out)["tasks"]
    assert task["payload_unreadable"]["text"] == garbage[:UNREADABLE_TEXT_SHOWN]
    assert task["payload_unreadable"]["length"] == 5_000_001
    assert len(out) < 40_000  # the whole text JSON-escaped was 17 MB

    code, out, err = run(capsys, "--db", str(db), "--queue", Q, "--show-payloads", "--color", "never")
    assert (code, err) == (0, "")
    assert "(unreadable)" in out
    assert len(out) < 40_000
