"""PartsOutcome: one future for a batch of sends, completed once every slot has its outcome
(results in order, or the first error), whatever order the slots complete in."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftmq.client.messages import SendResult
from raftmq.client.producer.outcome import PartsOutcome
from raftmq.common.errors import NotLeaderError
from raftmq.common.message import encode_msg_id, msg_id_prefix


def result(i: int) -> SendResult:
    return SendResult(f"id-{i}", "t", "g", 0, i, False)


@given(st.permutations(list(range(6))))
def test_completes_once_all_slots_are_set_in_any_order(order: list[int]) -> None:
    outcome = PartsOutcome(6)
    slots = outcome.slots()
    for k, i in enumerate(order):
        assert not outcome.future.done(), "not before the last slot"
        slots[i].set_result(result(i))
        slots[i].set_result(result(99))  # a second outcome is ignored, as a done future's
        assert slots[i].done() and slots[i].result() == result(i)
        assert outcome.future.done() == (k == len(order) - 1)
    assert outcome.future.result(0) == [result(i) for i in range(6)]


def test_the_first_error_fails_the_batch_after_every_outcome() -> None:
    outcome = PartsOutcome(3)
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
    assert PartsOutcome(0).future.result(0) == []


@given(
    st.integers(1, 2**62),
    st.integers(0, 4095),
    st.integers(0, 2**32 - 1),
    st.integers(-1, 2**40),
    st.booleans(),
)
def test_a_derived_send_result_is_the_result_with_its_id_written_out(
    raft_index: int, slot: int, position: int, offset: int, duplicate: bool
) -> None:
    """The sender's lazy SendResult (id prefix + position, derived when read) equals, hashes
    and prints as the one made with the broker's full id, and stays read-only."""
    full = encode_msg_id("broker-a", raft_index, slot, position)
    prefix = msg_id_prefix("broker-a", raft_index, slot)
    lazy = SendResult(prefix, "t", "broker-a", 3, offset, duplicate, id_position=position)
    eager = SendResult(full, "t", "broker-a", 3, offset, duplicate)
    assert lazy == eager and hash(lazy) == hash(eager) and repr(lazy) == repr(eager)
    assert lazy.msg_id == full and lazy.msg_id == full  # twice: the cached id is the same
    with pytest.raises(AttributeError):
        lazy.queue_offset = 0  # type: ignore[misc]  # the write being refused is the point
