"""The scrubber re-reads sealed segments off the disk (not the cache) and finds a byte that rotted
in a record nobody reads; it keeps its rate and counts its passes."""

from __future__ import annotations

from pathlib import Path

import pytest

from raftmq.raftlog.errors import CorruptJournalError
from raftmq.raftlog.journal import SegmentJournal
from raftmq.raftlog.journal.format import HEADER_BYTES
from raftmq.raftlog.scrubber import IDLE_S, Scrubber
from tests.raftlog.test_journal import flip_byte, open_small, seg_files


def test_a_rotten_byte_in_a_cached_sealed_record_is_found_from_the_disk(tmp_path: Path) -> None:
    d = tmp_path / "j"
    with open_small(d) as j:  # the default cache: every record is still in memory
        for i in range(1, 41):
            j.append(i, 1, bytes([i]) * 400)
        j.sync()
        told: list[CorruptJournalError] = []
        j.on_corrupt = told.append
        flip_byte(seg_files(d)[0], 2 * (HEADER_BYTES + 400) + HEADER_BYTES + 200)  # record 3
        assert j.get(3).command == bytes([3]) * 400  # the cache still answers: nobody notices
        rate = 1 << 20
        sc = Scrubber(j, rate)
        pauses = []
        while sc.passes == 0:
            pauses.append(sc.step())
        assert [e.index for e in told] == [3]  # found, once per pass, and skipped
        sealed = sum(s.size_bytes for s in j.segments() if not s.active)
        assert 0 < sc.bytes_total <= sealed
        assert sum(pauses) == pytest.approx(sc.bytes_total / rate)  # the rate, no more
        sc.step()
        assert [e.index for e in told] == [3, 3]  # the next pass sees it again (still bad)


def test_nothing_sealed_idles(tmp_path: Path) -> None:
    with SegmentJournal(tmp_path / "j") as j:
        j.append(1, 1, b"x")
        sc = Scrubber(j, 1 << 20)
        assert sc.step() == 0.0  # from 0 to the first index
        assert sc.step() == IDLE_S and sc.bytes_total == 0 and sc.passes == 0


def test_a_peer_copy_rewrites_the_record_only_if_it_fits(tmp_path: Path) -> None:
    d = tmp_path / "j"
    with open_small(d, cache_bytes=0) as j:
        for i in range(1, 41):
            j.append(i, 1, bytes([i]) * 400)
        flip_byte(seg_files(d)[0], 2 * (HEADER_BYTES + 400) + HEADER_BYTES + 200)  # record 3
        with pytest.raises(CorruptJournalError):
            j.get(3)
        with pytest.raises(CorruptJournalError, match="does not fit"):
            j.rewrite_sealed(3, 2, bytes([3]) * 400)  # another term: not this log's entry
        with pytest.raises(CorruptJournalError, match="does not fit"):
            j.rewrite_sealed(3, 1, bytes([3]) * 399)  # another size: not this record
        with pytest.raises(IndexError):
            j.rewrite_sealed(40, 1, bytes([40]) * 400)  # the active segment is never rewritten
        path, offset = j.rewrite_sealed(3, 1, bytes([3]) * 400)
        assert (Path(path), offset) == (seg_files(d)[0], 2 * (HEADER_BYTES + 400))
        assert j.get(3).command == bytes([3]) * 400
    with open_small(d, cache_bytes=0) as j:  # and durably so
        assert j.get(3).command == bytes([3]) * 400
