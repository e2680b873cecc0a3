"""A pull beyond a queue's end on a node that has not indexed all it committed waits for its
dispatcher instead of answering "out of range" (which makes a consumer reset its position)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from raftmq.broker.pull_plan import past_end_may_be_unindexed

offsets = st.integers(min_value=0, max_value=1 << 40)


@given(offset=offsets, high=offsets, dispatched=offsets, committed=offsets)
def test_waits_only_past_the_end_with_committed_entries_unindexed(
    offset: int, high: int, dispatched: int, committed: int
) -> None:
    wait = past_end_may_be_unindexed(offset, high, dispatched, committed)
    assert wait == (offset > high and dispatched < committed)


def test_the_race_seen_in_chaos() -> None:
    # client-cut, seed 1: a follower served offsets up to 202 of a queue, then the consumer
    # pulled 203 from the leader, whose dispatcher had not indexed the last entries yet.
    assert past_end_may_be_unindexed(203, 200, dispatched=1_040, committed=1_041)
    # Fully indexed: 203 really is past the end (offsets reset, topic recreated).
    assert not past_end_may_be_unindexed(203, 200, dispatched=1_041, committed=1_041)
    # At the end (a long-poll spot) or below it: nothing to wait for here.
    assert not past_end_may_be_unindexed(200, 200, dispatched=1_040, committed=1_041)
    assert not past_end_may_be_unindexed(5, 200, dispatched=1_040, committed=1_041)
