"""The records of asynccoord.models: the stores' fast Task constructor and JSON decoding match the slow ones."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import pickle

import pytest

from asynccoord import Task, TaskStatus
from asynccoord.backends.rows import decode_json, settled_done
from asynccoord.backends.sqlite.queue import _claimed_task
from asynccoord.models import TaskSlots, make_task

VALUES = {
    "id": 7,
    "queue": "jobs",
    "partition_key": "conv-1",
    "partition": 12,
    "idempotency_key": "m-1",
    "payload": {"text": "hi"},
    "priority": -3,
    "status": TaskStatus.RUNNING,
    "attempts": 2,
    "max_attempts": 5,
    "run_at": 100.5,
    "lease_owner": "node-a",
    "lease_token": "tok.7",
    "lease_expires_at": 130.5,
    "version": 4,
    "last_error": "boom",
    "result": None,
    "created_at": 99.0,
    "updated_at": 100.5,
}


def test_make_task_takes_the_fields_in_declaration_order() -> None:
    assert list(inspect.signature(make_task).parameters) == [f.name for f in dataclasses.fields(Task)]
    assert list(VALUES) == [f.name for f in dataclasses.fields(Task)]


def test_make_task_builds_the_same_task_as_the_constructor() -> None:
    fast = make_task(*VALUES.values())
    slow = Task(**VALUES)
    assert type(fast) is Task
    assert fast == slow
    assert repr(fast) == repr(slow)
    assert dataclasses.asdict(fast) == VALUES
    assert dataclasses.replace(fast, version=5) == Task(**{**VALUES, "version": 5})


def test_make_task_hashes_like_the_constructor() -> None:
    hashable = {**VALUES, "payload": "text"}  # a dict payload makes a Task unhashable either way
    assert hash(make_task(*hashable.values())) == hash(Task(**hashable))


def test_a_task_from_make_task_is_still_frozen() -> None:
    task = make_task(*VALUES.values())
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.version = 9  # type: ignore[misc]


def test_task_slots_has_the_layout_of_task() -> None:
    # make_task fills a TaskSlots and assigns __class__ = Task: same slot names, same layout.
    assert TaskSlots.__slots__ == tuple(f.name for f in dataclasses.fields(Task))
    assert Task.__basicsize__ == TaskSlots.__basicsize__
    assert not hasattr(make_task(*VALUES.values()), "__dict__")


def test_a_task_from_make_task_copies_and_pickles_like_the_constructor() -> None:
    fast = make_task(*VALUES.values())
    assert copy.copy(fast) == fast == copy.deepcopy(fast)
    assert pickle.loads(pickle.dumps(fast)) == Task(**VALUES)
    assert type(pickle.loads(pickle.dumps(fast))) is Task


def test_settled_done_is_the_task_with_the_done_fields_replaced() -> None:
    task = Task(**VALUES)
    done = settled_done(task, version=5, now=200.0, result={"ok": True})
    assert type(done) is Task
    assert done == dataclasses.replace(
        task,
        status=TaskStatus.DONE,
        lease_owner=None,
        lease_token=None,
        lease_expires_at=None,
        version=5,
        last_error=None,
        result={"ok": True},
        updated_at=200.0,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        done.version = 6  # type: ignore[misc]


def test_claimed_task_maps_a_claim_row_to_the_fields() -> None:
    # Columns of the claim queries: id, partition_key, partition, idempotency_key, payload,
    # priority, attempts, max_attempts, run_at, lease_token, version, last_error, result,
    # created_at, reclaimed.
    row = (7, "conv-1", 12, "m-1", '{"text":"hi"}', -3, 2, 5, 100.5, "tok.7", 4, "boom", '{"r":1}', 99.0, 0)
    task = _claimed_task(row, "jobs", "node-a", 130.5, 100.5)
    assert type(task) is Task
    assert task == Task(**{**VALUES, "result": {"r": 1}})
    assert _claimed_task((*row[:12], None, *row[13:]), "jobs", "node-a", 130.5, 100.5) == Task(**VALUES)


JSON_TEXTS = [
    "null",
    '{"n":1}',
    '[1,2,{"a":"\\u00e9"}]',
    '"x"',
    "123456789012345678901234567890",
    "1.5e300",
    "-0.0",
    "true",
    ' {"a":1} ',
    '{"a":1}\n',
    '{"a":1,"a":2}',
    "-Infinity",
]


@pytest.mark.parametrize("text", JSON_TEXTS)
def test_decode_json_reads_what_json_loads_reads(text: str) -> None:
    assert decode_json(text) == json.loads(text)
    assert type(decode_json(text)) is type(json.loads(text))


@pytest.mark.parametrize("text", ["", "{", '{"a":1} x', "nul", "1 2"])
def test_decode_json_refuses_what_json_loads_refuses(text: str) -> None:
    with pytest.raises(json.JSONDecodeError):
        decode_json(text)
