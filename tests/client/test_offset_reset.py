"""The offset-reset planner and the consumer's record of followed resets (pure cores)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftmq.client.offset_reset import ResetTarget, ResetTo, SeenResets, target_offset
from raftmq.common.errors import InvalidArgumentError
from raftmq.common.pb import broker_pb2
from raftmq.common.types import QueueRef

bounds = st.tuples(st.integers(0, 10**9), st.integers(0, 10**6)).map(lambda t: (t[0], t[0] + t[1]))


@given(
    bounds,
    st.sampled_from(list(ResetTo)),
    st.integers(-(10**9), 10**9),
    st.none() | st.integers(0, 2 * 10**9),
)
def test_every_target_lands_within_the_queue(
    lh: tuple[int, int], kind: ResetTo, value: int, committed: int | None
) -> None:
    low, high = lh
    if kind in (ResetTo.OFFSET, ResetTo.TIME):
        value = abs(value)
    target = ResetTarget(kind, value)
    at_time = min(max(value, low), high) if kind is ResetTo.TIME else None
    new = target_offset(target, committed, low, high, at_time)
    assert low <= new <= high
    if kind is ResetTo.EARLIEST:
        assert new == low
    if kind is ResetTo.LATEST:
        assert new == high
    if kind is ResetTo.OFFSET and low <= value <= high:
        assert new == value
    if kind is ResetTo.SHIFT:
        start = low if committed is None else committed
        assert new == min(max(start + value, low), high)


def test_examples_and_refusals() -> None:
    assert target_offset(ResetTarget(ResetTo.SHIFT, -10), 50, 0, 100) == 40
    assert target_offset(ResetTarget(ResetTo.SHIFT, -10), 5, 0, 100) == 0
    assert target_offset(ResetTarget(ResetTo.SHIFT, 3), None, 7, 100) == 10
    assert target_offset(ResetTarget(ResetTo.OFFSET, 999), 0, 0, 100) == 100
    assert target_offset(ResetTarget(ResetTo.TIME, 5), 0, 0, 100, 42) == 42
    with pytest.raises(ValueError, match="TIME target"):
        target_offset(ResetTarget(ResetTo.TIME, 5), 0, 0, 100)
    with pytest.raises(InvalidArgumentError, match=">= 0"):
        ResetTarget(ResetTo.OFFSET, -1)
    assert ResetTarget(ResetTo.SHIFT, -3).describe() == "shift by -3"
    assert ResetTarget(ResetTo.EARLIEST).describe() == "earliest"


def reset(group: str, rid: int, queue: int, offset: int) -> broker_pb2.OffsetReset:
    return broker_pb2.OffsetReset(
        broker_group=group, reset_id=rid, topic="t", queue_id=queue, offset=offset
    )


def test_seen_resets_follow_each_once_and_skip_the_ones_before_start() -> None:
    seen = SeenResets(max_seen=3)
    # The first answer: resets from before this consumer: marked, not followed.
    assert seen.take([reset("a", 5, 0, 1)]) == {}
    seen.prime()
    assert seen.take([reset("a", 5, 0, 1)]) == {}
    # A new reset, repeated by every node of the group and in later answers: once.
    moves = seen.take([reset("a", 9, 0, 10), reset("a", 9, 1, 11), reset("a", 9, 0, 10)])
    assert moves == {QueueRef("t", "a", 0): 10, QueueRef("t", "a", 1): 11}
    assert seen.take([reset("a", 9, 0, 10)]) == {}
    # Ids are per broker group; a later reset of the same queue wins.
    moves = seen.take([reset("b", 12, 0, 7), reset("b", 9, 0, 3)])
    assert moves == {QueueRef("t", "b", 0): 7}
    # Bounded: the oldest ids are forgotten first.
    assert len(seen._seen) == 3
