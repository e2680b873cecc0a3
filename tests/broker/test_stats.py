"""Resource reports' storage (broker/stats.py) and their merge (client/stats_report.py): counts
added per batch come out per minute exactly; the table stays bounded past a short retention and
past its row cap (a clock we move, a real sqlite file)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.broker.stats import MINUTE_MS, OTHER, MinuteCounts, NodeStats
from raftmq.client.stats_report import merge, parse_duration_ms, report_range
from raftmq.common.errors import InvalidArgumentError

T0 = 1_700_000_000_000 - 1_700_000_000_000 % MINUTE_MS  # a minute's start

batches = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c"]),
        st.sampled_from(["", "g1", "g2"]),
        st.integers(1, 500),
        st.integers(0, 10 * MINUTE_MS - 1),
    ),
    max_size=200,
)


@given(batches)
def test_minute_counts_sum_exactly_per_minute(items: list[tuple[str, str, int, int]]) -> None:
    counts = MinuteCounts()
    expected: dict[tuple[int, str, str], int] = {}
    for topic, group, n, at in items:
        counts.add(topic, group, n, T0 + at)
        key = (T0 + at - at % MINUTE_MS, topic, group)
        expected[key] = expected.get(key, 0) + n
    got = {(r.minute_ms, r.topic, r.group): r.count for r in counts.drain()}
    assert got == expected
    assert counts.drain() == []


def test_minute_counts_bounded_keys_go_to_other() -> None:
    counts = MinuteCounts(max_keys=2)
    counts.add("a", "", 1, T0)
    counts.add("b", "", 2, T0)
    counts.add("c", "", 3, T0)
    counts.add("d", "g", 4, T0)
    rows = {(r.topic, r.group): r.count for r in counts.drain()}
    assert rows == {("a", ""): 1, ("b", ""): 2, (OTHER, ""): 3, (OTHER, OTHER): 4}


@settings(max_examples=30, deadline=None)
@given(batches)
def test_merge_of_split_nodes_equals_the_whole(items: list[tuple[str, str, int, int]]) -> None:
    """Each batch counted on one of three nodes; the merged report equals one node's count."""
    nodes = [MinuteCounts() for _ in range(3)]
    whole = MinuteCounts()
    for i, (topic, group, n, at) in enumerate(items):
        nodes[i % 3].add(topic, group, n, T0 + at)
        whole.add(topic, group, n, T0 + at)
    rows = [(r.minute_ms, r.topic, r.group, r.count) for c in nodes for r in c.drain()]
    one = [(r.minute_ms, r.topic, r.group, r.count) for r in whole.drain()]
    hi = T0 + 10 * MINUTE_MS
    assert merge(rows, T0, hi) == merge(one, T0, hi)
    report = merge(rows, T0, hi)
    assert sum(s.total for s in report.series) == sum(n for _, _, n, _ in items)
    assert all(len(s.counts) == 10 for s in report.series)


def test_store_keeps_counts_queries_by_range_and_stays_bounded(tmp_path: Path) -> None:
    now = [T0 / 1000]
    stats = NodeStats(
        tmp_path / "stats.sqlite3",
        retention_ms=5 * MINUTE_MS,
        flush_interval_ms=1000,
        max_rows=10_000,
        clock=lambda: now[0],
    )
    try:
        for minute in range(60):  # an hour of traffic, 2 topics and one group, flushed each minute
            for _ in range(3):
                stats.on_send("t1", 7)
                stats.on_send("t2", 1)
                stats.on_pull("g", "t1", 5)
            stats.on_pull("", "t1", 99)  # no group: not a consumer's pull, not counted
            stats.on_send("t1", 0)
            stats.flush()
            # Retention 5 minutes: at most the last 6 minutes (the partial one included) of
            # 3 keys each, whatever ran before.
            assert stats.row_count() <= 6 * 3
            if minute < 59:
                now[0] += 60
        rows = stats.query(topic="t1", group="", since_ms=0, until_ms=T0 + 61 * MINUTE_MS, limit=99)
        assert [r.count for r in rows] == [21] * 6
        assert rows[-1].minute_ms == T0 + 59 * MINUTE_MS
        assert rows[0].minute_ms == T0 + 54 * MINUTE_MS
        consumed = stats.query(topic="", group="*", since_ms=0, until_ms=2 * T0, limit=99)
        assert {(r.topic, r.group, r.count) for r in consumed} == {("t1", "g", 15)}
        last = stats.query(
            topic="t2",
            group="",
            since_ms=T0 + 59 * MINUTE_MS,
            until_ms=T0 + 60 * MINUTE_MS,
            limit=9,
        )
        assert [(r.minute_ms, r.count) for r in last] == [(T0 + 59 * MINUTE_MS, 3)]
    finally:
        stats.stop()
    size = (tmp_path / "stats.sqlite3").stat().st_size
    assert size < 256 * 1024, size


def test_store_row_cap_drops_oldest_whole_minutes(tmp_path: Path) -> None:
    now = [T0 / 1000]
    stats = NodeStats(
        tmp_path / "s.sqlite3",
        retention_ms=10_000 * MINUTE_MS,
        flush_interval_ms=1000,
        max_rows=10,
        clock=lambda: now[0],
    )
    try:
        for _ in range(20):
            for t in ("a", "b", "c"):
                stats.on_send(t, 1)
            stats.flush()
            assert stats.row_count() <= 10
            now[0] += 60
        rows = stats.query(topic="", group="", since_ms=0, until_ms=2 * T0, limit=99)
        minutes = {r.minute_ms for r in rows}
        assert all(sum(1 for r in rows if r.minute_ms == m) == 3 for m in minutes)
        assert max(minutes) == T0 + 19 * MINUTE_MS
    finally:
        stats.stop()


def test_reports_off_counts_nothing(tmp_path: Path) -> None:
    stats = NodeStats(tmp_path / "off.sqlite3", retention_ms=0, flush_interval_ms=1000, max_rows=10)
    stats.start()
    stats.on_send("t", 5)
    assert stats.query(topic="t", group="", since_ms=0, until_ms=2 * T0, limit=9) == []
    stats.stop()
    assert not (tmp_path / "off.sqlite3").exists()


def test_durations_and_ranges() -> None:
    assert parse_duration_ms("90s") == 90_000
    assert parse_duration_ms("1h") == 3_600_000
    assert parse_duration_ms("7d") == 7 * 86_400_000
    assert parse_duration_ms("30") == 30_000
    assert parse_duration_ms("-5m") == 300_000  # the README's relative form looks back too
    for bad in ("", "--5m", "-0", "abc", "1x", "0"):
        with pytest.raises(InvalidArgumentError, match="positive number"):
            parse_duration_ms(bad)
    lo, hi = report_range(T0 + 30_000, 3_600_000)
    assert lo == T0 - 60 * MINUTE_MS and hi == T0 + MINUTE_MS
    with pytest.raises(InvalidArgumentError, match="at most"):
        report_range(T0, 365 * 86_400_000)
