"""The push consumer's ProcessQueue: the committable offset is the lowest message not done, so a
crash redelivers and never skips; fetches only move forward except through reset()."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftmq.client.process_queue import ProcessQueue


def test_commit_waits_for_the_slowest_listener() -> None:
    pq = ProcessQueue(start_offset=10, max_inflight=100)
    assert pq.consumed_offset() == 10
    pq.add([10, 11, 12, 13], next_offset=14)
    assert pq.done(11) and pq.done(12)
    assert pq.consumed_offset() == 10, "10 is still in a listener"
    assert pq.done(10)
    assert pq.consumed_offset() == 13
    assert pq.done(13)
    assert pq.consumed_offset() == 14, "all done: the fetch position"
    assert not pq.done(13), "done twice"


def test_filtered_offsets_are_skipped_by_next_offset() -> None:
    pq = ProcessQueue(0, 10)
    pq.add([3, 7], next_offset=20)  # 0-2, 4-6 and 8-19 did not match the filter
    pq.done(3)
    assert pq.consumed_offset() == 7
    pq.done(7)
    assert pq.consumed_offset() == 20


def test_fetches_must_move_forward_and_the_bound_holds() -> None:
    pq = ProcessQueue(0, max_inflight=2)
    pq.add([0, 1], next_offset=2)
    assert not pq.has_room()
    with pytest.raises(ValueError, match="forward"):
        pq.add([1], next_offset=3)  # a stale fetch delivered twice would be a bug
    with pytest.raises(ValueError, match="above"):
        pq.add([5], next_offset=5)
    pq.done(0)
    assert pq.has_room() and pq.inflight_count == 1


def test_reset_moves_the_fetch_but_not_past_messages_in_flight() -> None:
    pq = ProcessQueue(0, 10)
    pq.add([0, 1], next_offset=50)
    pq.reset(30)  # e.g. the fetch offset fell beyond the end and went back to the latest
    assert pq.consumed_offset() == 0, "0 and 1 are not done"
    pq.add([30], next_offset=31)
    pq.done(0)
    pq.done(1)
    pq.done(30)
    assert pq.consumed_offset() == 31
    pq.reset(5)
    assert pq.consumed_offset() == 5


@given(st.lists(st.integers(1, 5), min_size=1, max_size=30), st.randoms())
def test_never_commits_past_an_unfinished_message(sizes: list[int], rnd: random.Random) -> None:
    pq = ProcessQueue(0, 10_000)
    nxt = 0
    handed: list[int] = []
    for n in sizes:
        offs = list(range(nxt, nxt + n))
        nxt += n
        pq.add(offs, nxt)
        handed.extend(offs)
    rnd.shuffle(handed)
    finished: set[int] = set()
    for off in handed:
        pq.done(off)
        finished.add(off)
        committed = pq.consumed_offset()
        assert all(o in finished for o in range(committed)), "an unfinished message was skipped"
        assert committed == nxt or committed not in finished
    assert pq.consumed_offset() == nxt
