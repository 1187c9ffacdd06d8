"""The records of asynccoord.models: the stores' fast Task constructor matches Task(...)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from asynccoord import Task, TaskStatus
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
