"""Failures keep every error: the first leaf of a group is raised, the others ride as notes."""

import pytest

from asyncloader._base.failure import Failure, failure_note, unwrap_group


def test_unwrap_keeps_the_other_members_as_notes():
    """A TaskGroup's second failure is not dropped when the first is raised."""
    first, second, third = KeyError("a"), ValueError("b"), OSError("c")
    group = ExceptionGroup("tg", [first, ExceptionGroup("inner", [second, third])])
    assert unwrap_group(group) is first
    assert first.__notes__ == [
        "asyncloader: also raised: ValueError: b",
        "asyncloader: also raised: OSError: c",
    ]


def test_unwrap_returns_a_plain_exception_unchanged():
    """Nothing is added to an exception that is not a group."""
    exc = RuntimeError("x")
    assert unwrap_group(exc) is exc
    assert not hasattr(exc, "__notes__")


def test_failure_note_names_stage_batch_and_sample():
    """The note on a user exception says where it failed."""
    note = failure_note("transform", 3, list(range(20)), index=7)
    assert (
        note
        == "asyncloader: stage=transform batch=3 index=7 indices="
        + str(list(range(16)))
        + " +4 more"
    )


def test_failure_reraises_the_users_exception_with_its_note():
    """A captured Failure raises the original exception, annotated."""
    failure = Failure.capture(ZeroDivisionError("z"), "fetch", 0, [5], 5)
    with pytest.raises(ZeroDivisionError, match="z") as info:
        failure.reraise()
    assert info.value.__notes__ == ["asyncloader: stage=fetch batch=0 index=5 indices=[5]"]
