"""The node's book of recent offset resets told to heartbeating consumers (pure core)."""

from __future__ import annotations

import pytest

from raftmq.broker.offset_resets import ResetBook
from raftmq.broker.rows import OffsetRow


def test_resets_by_group_and_topic_kept_for_a_while_and_bounded() -> None:
    book = ResetBook(keep_ms=1_000, max_resets=2)
    book.record(
        10,
        [
            OffsetRow("g", "t", 1, 5, reset=True),
            OffsetRow("g", "t", 0, 3, reset=True),
            OffsetRow("g", "t", 2, 9),  # a commit in the same entry: not a reset
            OffsetRow("h", "t", 0, 1, reset=True),
        ],
        now_ms=0,
    )
    [order] = book.pending("g", ["t", "other"], now_ms=500)
    assert (order.reset_id, order.offsets) == (10, ((0, 3), (1, 5)))
    assert book.pending("g", ["other"], now_ms=500) == []
    assert [o.group for o in book.pending("h", ["t"], now_ms=500)] == ["h"]
    book.record(11, [OffsetRow("g", "u", 0, 0, reset=True)], now_ms=600)
    assert len(book) == 2  # the oldest went first
    assert book.pending("g", ["t"], now_ms=600) == []
    assert [o.reset_id for o in book.pending("g", ["u"], now_ms=1_599)] == [11]
    assert book.pending("g", ["u"], now_ms=1_600) == []  # expired
    with pytest.raises(ValueError, match="> 0"):
        ResetBook(keep_ms=0)
