"""BatchOutcome: one future for a batch of sends, completed once every slot has its outcome
(results in order, or the first error), whatever order the slots complete in."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftmq.client.messages import SendResult
from raftmq.client.producer.outcome import BatchOutcome
from raftmq.common.errors import NotLeaderError


def result(i: int) -> SendResult:
    return SendResult(f"id-{i}", "t", "g", 0, i, False)


@given(st.permutations(list(range(6))))
def test_completes_once_all_slots_are_set_in_any_order(order: list[int]) -> None:
    outcome = BatchOutcome(6)
    slots = outcome.slots()
    for k, i in enumerate(order):
        assert not outcome.future.done(), "not before the last slot"
        slots[i].set_result(result(i))
        slots[i].set_result(result(99))  # a second outcome is ignored, as a done future's
        assert slots[i].done() and slots[i].result() == result(i)
        assert outcome.future.done() == (k == len(order) - 1)
    assert outcome.future.result(0) == [result(i) for i in range(6)]


def test_the_first_error_fails_the_batch_after_every_outcome() -> None:
    outcome = BatchOutcome(3)
    a, b, c = outcome.slots()
    first, later = NotLeaderError("first"), NotLeaderError("later")
    b.set_exception(first)
    a.set_result(result(0))
    assert not outcome.future.done()
    c.set_exception(later)
    assert outcome.future.exception(0) is first
    assert b.exception() is first and not b.cancelled()
    with pytest.raises(NotLeaderError):
        b.result()


def test_an_empty_batch_is_done_at_once() -> None:
    assert BatchOutcome(0).future.result(0) == []
