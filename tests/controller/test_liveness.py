"""Liveness, pure: last report and the start of the current streak per broker node; a silence
longer than alive_ms starts a fresh streak, so a node that just came back is not yet trusted."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.controller.liveness import Liveness, Seen


def test_streak_survives_short_gaps_and_restarts_after_long_ones() -> None:
    lv = Liveness(alive_ms=3_000)
    assert lv.observe("g", "n0", 1_000) == Seen(1_000, 1_000)
    assert lv.observe("g", "n0", 3_500) == Seen(3_500, 1_000)  # 2.5 s gap: same streak
    assert lv.observe("g", "n0", 7_000) == Seen(7_000, 7_000)  # 3.5 s gap: back after death
    assert lv.view()[("g", "n0")].alive(10_000, 3_000)
    assert not lv.view()[("g", "n0")].alive(10_001, 3_000)
    assert ("g", "n1") not in lv.view()


def test_view_is_a_copy_and_bad_window_refused() -> None:
    lv = Liveness(alive_ms=1)
    view = lv.view()
    lv.observe("g", "n0", 5)
    assert view == {}
    with pytest.raises(ValueError):
        Liveness(0)


@settings(max_examples=200, deadline=None)
@given(gaps=st.lists(st.integers(0, 5_000), min_size=1, max_size=40))
def test_since_is_the_first_report_after_the_last_long_gap(gaps: list[int]) -> None:
    lv = Liveness(alive_ms=2_000)
    now, since = 0, 0
    for i, gap in enumerate(gaps):
        now += gap
        if i == 0 or gap > 2_000:
            since = now
        seen = lv.observe("g", "n", now)
        assert seen == Seen(now, since)
        assert 0 <= seen.up_for_ms(now) <= now
