"""A topic purged through the log (issue 26, kafka-delete-records): each queue's min offset
moves up to the offset asked for on every replica alike, never down and never past the end;
the record round-trips."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.broker.rows import Applied
from raftmq.common.record_batch import PurgeQueues, decode, encode

from .support import produce
from .test_store import Node


@settings(deadline=None)
@given(st.dictionaries(st.integers(0, 1023), st.integers(0, 2**40), max_size=8))
def test_the_record_round_trips(offsets: dict[int, int]) -> None:
    assert decode(encode(PurgeQueues("t", offsets))) == PurgeQueues("t", offsets)


def test_min_offsets_move_up_only_and_alike(tmp_path: Path) -> None:
    a, b = Node(tmp_path / "a"), Node(tmp_path / "b")
    try:
        for n in (a, b):
            n.entry(produce("t", 0, 10), produce("t", 1, 3))
            out = n.entry(encode(PurgeQueues("t", {0: 4, 1: 50, 2: 9})))
            assert isinstance(out.outcomes[0], Applied), out.outcomes
            n.entry(encode(PurgeQueues("t", {0: 2})))  # never down
        for n in (a, b):
            assert n.store.queue_bounds("t", 0) == (4, 10)
            assert n.store.queue_bounds("t", 1) == (3, 3)  # never past the end
            assert n.store.queue_bounds("t", 2) == (0, 0)  # never had a message: untouched
            assert n.store.read_queue("t", 0, 4, 100)[0].queue_offset == 4
        # Later messages go on from the end.
        a.entry(produce("t", 1, 2))
        assert a.store.queue_bounds("t", 1) == (3, 5)
    finally:
        a.store.close()
        b.store.close()
