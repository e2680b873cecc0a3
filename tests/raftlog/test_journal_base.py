"""The journal's base after retention or a snapshot install (issue 16, item 5): the term of the
entry before first_index stays known (in memory and across a restart), so the leader's next
append from there passes the follower's consistency check; pysyncobj sees the base as the last
entry of an empty journal."""

from __future__ import annotations

from pathlib import Path

import pytest

from raftmq.raftlog.journal import SegmentJournal
from raftmq.raftlog.meta import MetaStore
from raftmq.raftlog.pysyncobj_compat import JournalAdapter
from raftmq.raftlog.record import Record
from raftmq.raftlog.replication import AppendRequest, follower_append

SMALL = 4096


def journal(d: Path) -> SegmentJournal:
    return SegmentJournal(d, segment_bytes=SMALL)


def test_delete_prefix_keeps_the_term_before_the_first_index(tmp_path: Path) -> None:
    d = tmp_path / "j"
    with journal(d) as j:
        for i in range(1, 301):
            j.append(i, 1 + i // 50, b"x" * 100)
        first = j.delete_prefix(120)
        assert 1 < first <= 120 and j.first_index == first
        assert j.has_base and j.term_at(first - 1) == 1 + (first - 1) // 50
        with pytest.raises(IndexError):
            j.term_at(first - 2)
        j.sync()
    with journal(d) as j:  # and after a restart
        assert j.first_index == first and j.term_at(first - 1) == 1 + (first - 1) // 50


def test_reset_with_a_base_then_append_and_restart(tmp_path: Path) -> None:
    d = tmp_path / "j"
    with journal(d) as j:
        for i in range(1, 11):
            j.append(i, 1, b"old")
        j.reset(501, prev_term=4)
        assert (j.first_index, j.last_index, len(j)) == (501, 500, 0)
        assert j.has_base and j.term_at(500) == 4
    with journal(d) as j:  # a crash right after the install: the base survives an empty journal
        assert (j.first_index, j.last_index) == (501, 500) and j.term_at(500) == 4
        j.append(501, 4, b"a")  # same term as the base: one run, a valid terms file
        j.append(502, 5, b"b")
        j.sync()
    with journal(d) as j:
        assert j.term_at(500) == 4 and j.get(502) == Record(502, 5, b"b")
        assert [j.term_at(i) for i in (501, 502)] == [4, 5]


def test_follower_append_checks_against_the_base(tmp_path: Path) -> None:
    with journal(tmp_path / "j") as j:
        j.reset(101, prev_term=3)
        ok = follower_append(j, 100, AppendRequest(100, 3, 101, [(b"c", 101, 3)]))
        assert ok.reply.success and [e[1] for e in ok.append] == [101]
        stale = follower_append(j, 100, AppendRequest(99, 3, 101, [(b"c", 100, 3)]))
        assert not stale.reply.success and stale.reply.next_index == 101
    with journal(tmp_path / "k") as k:  # no base known: the leader is told where the log ends
        k.reset(101)
        assert not follower_append(k, 0, AppendRequest(100, 3, 101, [])).reply.success


def test_pysyncobj_sees_the_base_as_the_last_entry(tmp_path: Path) -> None:
    j = journal(tmp_path / "j")
    adapter = JournalAdapter(j, MetaStore(tmp_path / "raft.meta"))
    j.reset(41, prev_term=7)
    assert len(adapter) == 1
    assert adapter[-1][1:] == (40, 7) and adapter[0][1:] == (40, 7)
    adapter.add(b"\x01", 41, 7)
    assert len(adapter) == 1 and adapter[-1][1:] == (41, 7)
    adapter._destroy()
