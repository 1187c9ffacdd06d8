"""The records of asynccoord.models: the stores' fast Task constructor and JSON decoding match the slow ones."""

from __future__ import annotations

import dataclasses
import inspect
import json

import pytest

from asynccoord import Task, TaskStatus
from asynccoord.backends._common import decode_json
from asynccoord.models import make_task

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
