"""SegmentJournal and MetaStore on real files: damage is detected or cut, never served.

Each test builds a journal in tmp_path, sometimes damages its files the way a crash or a bad disk
would, and checks what reopening and reading do. No mocks.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import struct
import threading
import time
from pathlib import Path

import pytest

from raftmq.raftlog.errors import CorruptJournalError, LogClosedError
from raftmq.raftlog.journal import HEADER_BYTES, SegmentJournal, index_name, segment_name
from raftmq.raftlog.journal.cache import RecordCache
from raftmq.raftlog.journal.format import CRC32C_FLAG
from raftmq.raftlog.meta import MetaStore, RaftMeta
from raftmq.raftlog.record import Record
from tests.raftlog.test_journal_format import encode_mislabelled, encode_old_record

SMALL_SEGMENT = 4096


def command(index: int, size: int | None = None) -> bytes:
    """A deterministic command per index, so any reader can check what it got."""
    rng = random.Random(index)
    return rng.randbytes(rng.randrange(0, 700) if size is None else size)


def fill(j: SegmentJournal, last: int, term: int = 1) -> None:
    for i in range(j.last_index + 1, last + 1):
        j.append(i, term, command(i))


def seg_files(d: Path) -> list[Path]:
    return sorted(d.glob("*.seg"))


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x5A]))


def open_small(d: Path, **kw: int) -> SegmentJournal:
    return SegmentJournal(d, segment_bytes=SMALL_SEGMENT, **kw)


def records_on_disk(path: Path) -> list[tuple[int, Record, bool]]:
    """(offset, record, carries CRC-32C) of every whole record of a segment file, unchecked."""
    data = path.read_bytes()
    out, off = [], 0
    while off + HEADER_BYTES <= len(data):
        _, field, index, term = struct.unpack_from("<IIQQ", data, off)
        n = field & ~CRC32C_FLAG
        end = off + HEADER_BYTES + n
        out.append((off, Record(index, term, data[off + HEADER_BYTES : end]), bool(field >> 31)))
        off = end
    return out


def rewrite_as_old_format(d: Path) -> int:
    """Rewrite every record of a closed journal in place as the code before CRC-32C wrote it
    (zlib's CRC-32, no flag: the same size, so the .idx and terms files stay right). Returns how
    many records it rewrote."""
    count = 0
    for path in seg_files(d):
        records = [r for _, r, _ in records_on_disk(path)]
        path.write_bytes(b"".join(encode_old_record(r.index, r.term, r.command) for r in records))
        count += len(records)
    return count


def crc32c_kinds(d: Path) -> list[bool]:
    """Per record of the journal's files, in order: whether it carries CRC-32C."""
    return [new for path in seg_files(d) for _, _, new in records_on_disk(path)]


# The damage tests run on journals of both kinds of record: written today (CRC-32C) and written
# before (zlib's CRC-32, rewritten in place by rewrite_as_old_format).
record_kinds = pytest.mark.parametrize("old", [False, True], ids=["crc32c", "zlib"])


# ---- basic API ---------------------------------------------------------------------------------


def test_fresh_journal_is_empty_and_starts_at_1(tmp_path: Path) -> None:
    with SegmentJournal(tmp_path / "j") as j:
        assert (j.first_index, j.last_index, len(j)) == (1, 0, 0)
        assert j.read_range(1, max_bytes=100, max_count=10) == []
        with pytest.raises(IndexError):
            j.get(1)
        with pytest.raises(IndexError):
            j.term_at(0)


def test_round_trip_across_segments_and_reopen(tmp_path: Path) -> None:
    d = tmp_path / "j"
    with open_small(d) as j:
        for i in range(1, 301):
            j.append(i, 1 + i // 100, command(i))
        assert len(seg_files(d)) > 10
        assert (j.first_index, j.last_index, len(j)) == (1, 300, 300)
    with open_small(d, cache_bytes=0) as j:  # no cache: every read goes to disk
        assert j.last_index == 300
        for i in range(1, 301):
            assert j.get(i) == Record(i, 1 + i // 100, command(i))
            assert j.term_at(i) == 1 + i // 100
        j.append(301, 7, b"after reopen")
        assert j.get(301).command == b"after reopen"


def test_append_refuses_wrong_index_decreasing_term_and_oversize(tmp_path: Path) -> None:
    with SegmentJournal(tmp_path / "j", max_record_bytes=1000) as j:
        j.append(1, 5, b"a")
        with pytest.raises(ValueError, match="next index is 2"):
            j.append(3, 5, b"b")
        with pytest.raises(ValueError, match="terms decrease"):
            j.append(2, 4, b"b")
        with pytest.raises(ValueError, match="max_record_bytes"):
            j.append(2, 5, b"x" * 1001)
        j.append(2, 5, b"x" * 1000)  # exactly the limit is fine
        assert j.last_index == 2


def test_record_above_max_record_bytes_is_corruption_at_read(tmp_path: Path) -> None:
    d = tmp_path / "j"
    with open_small(d) as j:
        j.append(1, 1, b"x" * 3000)
        j.append(2, 1, b"y" * 5000)  # seals segment 1, alone in segment 2
        j.append(3, 1, b"z")  # seals segment 2
    with open_small(d, max_record_bytes=100) as j:
        # Segment 1 is sealed and trusted at open; its length field is checked at read.
        with pytest.raises(CorruptJournalError, match="record span"):
            j.get(1)
        with pytest.raises(CorruptJournalError):
            j.read_range(1, max_bytes=10, max_count=1)
        assert j.get(3).command == b"z"


@record_kinds
def test_valid_oversize_record_in_active_segment_refuses_to_open(tmp_path: Path, old: bool) -> None:
    d = tmp_path / "j"
    with SegmentJournal(d) as j:
        j.append(1, 1, b"x" * 3000)
    if old:
        rewrite_as_old_format(d)
    with pytest.raises(CorruptJournalError, match="max_record_bytes") as info:
        SegmentJournal(d, max_record_bytes=100)
    assert segment_name(1) in str(info.value)
    with SegmentJournal(d) as j:  # the record was not cut
        assert j.get(1).command == b"x" * 3000


def test_recent_range_is_the_slice_from_either_end() -> None:
    """RecordCache.recent_range walks from the nearer end (a tail read of a full cache cost the
    cache's length); every slice of every size is the same as the list's."""
    for size in range(10):
        cache = RecordCache(1 << 20)
        for i in range(size):
            cache.push(1, b"%d" % i)
        want = list(cache.recent)
        for k in range(size):
            for n in range(1, size - k + 2):
                assert cache.recent_range(k, n) == want[k : k + n], (size, k, n)


def test_read_range_limits(tmp_path: Path) -> None:
    with open_small(tmp_path / "j", cache_bytes=0) as j:
        for i in range(1, 101):
            j.append(i, 1, bytes(100))
        got = j.read_range(10, max_bytes=350, max_count=50)
        assert [r.index for r in got] == [10, 11, 12]
        got = j.read_range(10, max_bytes=10**6, max_count=7)
        assert [r.index for r in got] == list(range(10, 17))
        assert [r.index for r in j.read_range(10, max_bytes=0, max_count=9)] == [10]
        assert [r.index for r in j.read_range(95, max_bytes=10**6, max_count=99)] == list(
            range(95, 101)
        )
        assert j.read_range(101, max_bytes=10**6, max_count=5) == []
        with pytest.raises(IndexError):
            j.read_range(0, max_bytes=10, max_count=1)
        with pytest.raises(ValueError):
            j.read_range(1, max_bytes=10, max_count=0)


def test_one_record_larger_than_segment_bytes_gets_its_own_segment(tmp_path: Path) -> None:
    d = tmp_path / "j"
    with open_small(d) as j:
        j.append(1, 1, b"a")
        j.append(2, 1, b"b" * 10_000)
        j.append(3, 1, b"c")
        assert [p.name for p in seg_files(d)] == [segment_name(i) for i in (1, 2, 3)]
        assert j.read_range(1, max_bytes=1, max_count=10)[0].command == b"a"
        assert j.read_range(2, max_bytes=1, max_count=10)[0].command == b"b" * 10_000


def test_truncate_suffix(tmp_path: Path) -> None:
    d = tmp_path / "j"
    with open_small(d) as j:
        for i in range(1, 101):
            j.append(i, 1 if i < 50 else 2, command(i))
        j.sync()
        assert j.truncate_suffix(101) == 0
        assert j.truncate_suffix(40) == 61  # into a sealed, synced segment
        assert (j.last_index, j.term_at(39)) == (39, 1)
        assert not j.dirty
        with pytest.raises(IndexError):
            j.get(40)
        with pytest.raises(ValueError):
            j.truncate_suffix(0)
        j.append(40, 3, b"new 40")
        assert j.term_at(40) == 3
    with open_small(d) as j:
        assert j.last_index == 40
        assert j.get(40) == Record(40, 3, b"new 40")
        assert j.get(39) == Record(39, 1, command(39))
        assert j.truncate_suffix(1) == 40
        assert (j.first_index, j.last_index, len(j)) == (1, 0, 0)
        j.append(1, 1, b"again")
    with open_small(d) as j:
        assert j.get(1).command == b"again"


def test_delete_prefix_removes_only_whole_sealed_segments(tmp_path: Path) -> None:
    d = tmp_path / "j"
    with open_small(d) as j:
        for i in range(1, 201):
            j.append(i, 1 + i // 60, command(i))
        firsts = [int(p.name[:20]) for p in seg_files(d)]
        assert j.delete_prefix(firsts[2] - 1) == firsts[1]  # segment 2 holds firsts[2] - 1
        assert j.first_index == firsts[1]
        assert j.delete_prefix(firsts[3]) == firsts[3]
        with pytest.raises(IndexError):
            j.get(firsts[3] - 1)
        with pytest.raises(IndexError):
            j.read_range(firsts[3] - 1, max_bytes=1, max_count=1)
        assert j.get(firsts[3]) == Record(firsts[3], 1 + firsts[3] // 60, command(firsts[3]))
        assert j.delete_prefix(10**9) == firsts[-1]  # never the active segment
        assert j.last_index == 200
    with open_small(d) as j:
        assert (j.first_index, j.last_index) == (firsts[-1], 200)
        assert j.term_at(200) == 1 + 200 // 60
        assert j.get(200).command == command(200)


def test_reset_survives_reopen(tmp_path: Path) -> None:
    d = tmp_path / "j"
    with open_small(d) as j:
        fill(j, 50)
        j.reset(1000)
        assert (j.first_index, j.last_index, len(j)) == (1000, 999, 0)
        with pytest.raises(ValueError):
            j.append(51, 1, b"")
    with open_small(d) as j:
        assert (j.first_index, j.last_index) == (1000, 999)
        j.append(1000, 4, b"first")
        j.append(1001, 4, b"second")
    with open_small(d) as j:
        assert j.read_range(1000, max_bytes=100, max_count=5) == [
            Record(1000, 4, b"first"),
            Record(1001, 4, b"second"),
        ]
    assert sorted(p.name for p in d.iterdir()) == [segment_name(1000), "terms"]


def test_dirty_sync_and_close(tmp_path: Path) -> None:
    j = SegmentJournal(tmp_path / "j")
    assert not j.dirty
    j.append(1, 1, b"a")
    assert j.dirty
    j.sync()
    assert not j.dirty
    j.close()
    j.sync()  # a flusher racing shutdown must not fail
    j.close()
    with pytest.raises(LogClosedError):
        j.append(2, 1, b"b")
    with pytest.raises(LogClosedError):
        j.get(1)


# ---- damage ------------------------------------------------------------------------------------


@record_kinds
def test_flipped_byte_in_sealed_segment_is_never_served(tmp_path: Path, old: bool) -> None:
    d = tmp_path / "j"
    with open_small(d) as j:
        for i in range(1, 41):
            j.append(i, 1, bytes([i]) * 400)
    if old:
        rewrite_as_old_format(d)
    first_seg = seg_files(d)[0]
    # Record 3 of segment 1 starts at 2 * (24 + 400); hit the middle of its command.
    flip_byte(first_seg, 2 * (HEADER_BYTES + 400) + HEADER_BYTES + 200)
    with open_small(d, cache_bytes=0) as j:  # sealed segments are trusted: open succeeds
        told: list[CorruptJournalError] = []
        j.on_corrupt = told.append  # every failed read reaches the node's StorageHealth
        with pytest.raises(CorruptJournalError, match="crc") as info:
            j.get(3)
        assert first_seg.name in str(info.value) and info.value.index == 3
        with pytest.raises(CorruptJournalError) as info:
            j.read_range(1, max_bytes=10**6, max_count=10)
        assert info.value.index == 3  # the bad record's own index, not the range's start
        assert [(e.index, e.offset) for e in told] == [(3, 2 * (HEADER_BYTES + 400))] * 2
        assert j.get(2).command == bytes([2]) * 400
        assert j.get(4).command == bytes([4]) * 400
        assert [r.index for r in j.read_range(1, max_bytes=800, max_count=10)] == [1, 2]


@record_kinds
def test_flipped_byte_in_last_record_is_cut_at_reopen(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, old: bool
) -> None:
    d = tmp_path / "j"
    with open_small(d) as j:
        fill(j, 30)
    if old:
        rewrite_as_old_format(d)
    active = seg_files(d)[-1]
    flip_byte(active, active.stat().st_size - 1)
    with caplog.at_level(logging.WARNING, logger="raftlog.journal"), open_small(d) as j:
        assert j.last_index == 29
        assert j.get(29).command == command(29)
        j.append(30, 1, b"rewritten")
    torn = [r.getMessage() for r in caplog.records if "journal.torn_tail" in r.getMessage()]
    assert len(torn) == 1
    assert str(active) in torn[0] and "dropped_from=30" in torn[0]
    with open_small(d) as j:
        assert j.get(30).command == b"rewritten"
    assert crc32c_kinds(d) == [not old] * 29 + [True]  # the new append after old records


@record_kinds
@pytest.mark.parametrize("damage", ["chop", "garbage", "half_header"])
def test_torn_tail_is_cut(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture, old: bool
) -> None:
    d = tmp_path / "j"
    with open_small(d) as j:
        fill(j, 25)
        last_size = HEADER_BYTES + len(command(25))
    if old:
        rewrite_as_old_format(d)
    active = seg_files(d)[-1]
    size = active.stat().st_size
    with open(active, "r+b") as f:
        if damage == "chop":
            f.truncate(size - last_size // 2)
        elif damage == "garbage":
            f.seek(size)
            f.write(os.urandom(100))
        else:
            f.seek(size)
            f.write(b"\x01" * (HEADER_BYTES // 2))
    with caplog.at_level(logging.WARNING, logger="raftlog.journal"), open_small(d) as j:
        assert j.last_index == (24 if damage == "chop" else 25)
        for i in range(1, j.last_index + 1):
            assert j.get(i).command == command(i)
    assert any("journal.torn_tail" in r.getMessage() for r in caplog.records)
    assert active.stat().st_size == size - (last_size if damage == "chop" else 0)


def test_a_journal_written_before_crc32c_opens_reads_and_takes_appends(tmp_path: Path) -> None:
    """An upgrade in place: segments of zlib-CRC records open, recover, read and scrub, and the
    appends after the restart are CRC-32C records behind them, in the same active segment and
    in new ones."""
    d = tmp_path / "j"

    def term(i: int) -> int:
        return 1 + i // 40

    with open_small(d) as j:
        for i in range(1, 101):
            j.append(i, term(i), command(i))
    assert rewrite_as_old_format(d) == 100
    assert crc32c_kinds(d) == [False] * 100

    def check(j: SegmentJournal, last: int) -> None:
        assert (j.first_index, j.last_index) == (1, last)
        for i in range(1, last + 1):
            assert j.get(i) == Record(i, term(i), command(i))
        got = j.read_range(1, max_bytes=10**7, max_count=10**4)
        assert got == [Record(i, term(i), command(i)) for i in range(1, last + 1)]
        told: list[CorruptJournalError] = []
        j.on_corrupt = told.append
        at, scrubbed = j.verify_sealed(1, 10**7), 0
        while at[0] != 1:  # one scrub pass over every sealed segment
            scrubbed += at[1]
            at = j.verify_sealed(at[0], 10**7)
        assert scrubbed and not told

    with open_small(d, cache_bytes=0) as j:
        check(j, 100)
        for i in range(101, 201):
            j.append(i, term(i), command(i))
        check(j, 200)
    with open_small(d, cache_bytes=0) as j:
        check(j, 200)
    assert crc32c_kinds(d) == [False] * 100 + [True] * 100
    # Recovery that rebuilds the .idx and terms files scans old and new records alike.
    for f in [*d.glob("*.idx"), d / "terms"]:
        f.unlink()
    with open_small(d, cache_bytes=0) as j:
        check(j, 200)
        assert [j.term_at(i) for i in range(1, 201)] == [term(i) for i in range(1, 201)]


@pytest.mark.parametrize("flag", [True, False], ids=["crc32c flag, zlib crc", "no flag, crc32c"])
def test_a_crc_of_the_other_kind_is_corrupt_on_disk(
    tmp_path: Path, flag: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A record whose length field names the other CRC than its crc field holds is corrupt: in
    a sealed segment it is never served, at the end of the active one it is cut as torn."""
    d = tmp_path / "j"
    with open_small(d) as j:
        for i in range(1, 41):
            j.append(i, 1, bytes([i]) * 400)
    first, active = seg_files(d)[0], seg_files(d)[-1]
    for path, at in ((first, 2), (active, -1)):  # record 3, and the last record
        recs = records_on_disk(path)
        off, rec, _ = recs[at]
        with open(path, "r+b") as f:
            f.seek(off)
            f.write(encode_mislabelled(rec.index, rec.term, rec.command, flag=flag))
    with caplog.at_level(logging.WARNING, logger="raftlog.journal"), open_small(d) as j:
        assert j.last_index == 39
        with pytest.raises(CorruptJournalError, match="crc mismatch") as info:
            j.get(3)
        assert info.value.index == 3
        with pytest.raises(CorruptJournalError, match="crc mismatch"):
            j.read_range(1, max_bytes=10**6, max_count=10)
        assert j.get(4).command == bytes([4]) * 400
    assert any("dropped_from=40" in r.getMessage() for r in caplog.records)


def test_max_record_bytes_must_fit_the_length_field(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="length field"):
        SegmentJournal(tmp_path / "j", max_record_bytes=CRC32C_FLAG)


def test_wrongly_named_segment_refuses_to_open(tmp_path: Path) -> None:
    d = tmp_path / "j"
    with open_small(d) as j:
        fill(j, 100)
    segs = seg_files(d)
    victim = segs[2]
    renamed = d / segment_name(int(victim.name[:20]) + 1)
    victim.rename(renamed)
    with pytest.raises(CorruptJournalError) as info:
        open_small(d)
    assert renamed.name in str(info.value) and "starts with record" in str(info.value)


def test_wrongly_named_active_segment_refuses_to_open(tmp_path: Path) -> None:
    d = tmp_path / "j"
    with open_small(d) as j:
        fill(j, 100)
    active = seg_files(d)[-1]
    renamed = d / segment_name(int(active.name[:20]) + 5)
    active.rename(renamed)
    with pytest.raises(CorruptJournalError) as info:
        open_small(d)
    assert renamed.name in str(info.value)


def test_gap_between_segments_refuses_to_open(tmp_path: Path) -> None:
    d = tmp_path / "j"
    with open_small(d) as j:
        fill(j, 100)
    segs = seg_files(d)
    segs[3].unlink()
    (d / index_name(int(segs[3].name[:20]))).unlink()
    with pytest.raises(CorruptJournalError) as info:
        open_small(d)
    assert segs[2].name in str(info.value) and "gap" in str(info.value)


def test_missing_index_is_rebuilt(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    d = tmp_path / "j"
    with open_small(d) as j:
        fill(j, 100)
    idx = d / index_name(int(seg_files(d)[1].name[:20]))
    good = idx.read_bytes()
    idx.unlink()
    with caplog.at_level(logging.WARNING, logger="raftlog.journal"), open_small(d) as j:
        assert idx.read_bytes() == good
        for i in range(1, 101):
            assert j.get(i).command == command(i)
    assert any("journal.index_rebuilt" in r.getMessage() for r in caplog.records)


def test_index_of_wrong_length_is_rebuilt(tmp_path: Path) -> None:
    d = tmp_path / "j"
    with open_small(d) as j:
        fill(j, 100)
    idx = d / index_name(int(seg_files(d)[0].name[:20]))
    good = idx.read_bytes()
    idx.write_bytes(good[:-8])
    with open_small(d, cache_bytes=0) as j:
        assert idx.read_bytes() == good
        assert [r.command for r in j.read_range(1, max_bytes=10**6, max_count=100)] == [
            command(i) for i in range(1, 101)
        ]


def test_missing_terms_file_is_rebuilt(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    d = tmp_path / "j"
    with open_small(d) as j:
        for i in range(1, 201):
            j.append(i, 1 + i // 37, command(i))
    (d / "terms").unlink()
    with caplog.at_level(logging.WARNING, logger="raftlog.journal"), open_small(d) as j:
        assert [j.term_at(i) for i in range(1, 201)] == [1 + i // 37 for i in range(1, 201)]
    assert any("journal.terms_rebuilt" in r.getMessage() for r in caplog.records)
    assert (d / "terms").exists()


def test_segments_sealed_but_never_synced_are_rescanned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A crash can lose bytes of segments sealed after the last sync: they have no .idx yet, so
    recovery scans them like the active one and ends the log at the first bad record."""
    d = tmp_path / "j"
    j = open_small(d)
    fill(j, 60)
    j.sync()
    synced = len(seg_files(d))
    fill(j, 160)  # several more segments, sealed but not synced
    pending = sorted(d.glob("*.idx.pending"))
    assert len(pending) >= 3
    intact, torn = tmp_path / "intact", tmp_path / "torn"
    shutil.copytree(d, intact)  # what a process crash leaves: the page cache survives
    shutil.copytree(d, torn)
    j.close()

    with open_small(intact) as k:
        assert k.last_index == 160
        assert not list(intact.glob("*.pending"))
        assert len(list(intact.glob("*.idx"))) == len(seg_files(intact)) - 1

    victim = seg_files(torn)[synced + 1]  # a sealed, unsynced segment in the middle of the tail
    victim_first = int(victim.name[:20])
    with open(victim, "r+b") as f:
        f.truncate(victim.stat().st_size - 10)
    with caplog.at_level(logging.WARNING, logger="raftlog.journal"), open_small(torn) as k:
        assert seg_files(torn)[-1] == victim
        assert victim_first <= k.last_index < 160
        for i in range(1, k.last_index + 1):
            assert k.get(i).command == command(i)
    torn_msgs = [r.getMessage() for r in caplog.records if "journal.torn_tail" in r.getMessage()]
    assert len(torn_msgs) == 1 and str(victim) in torn_msgs[0]


def test_sealed_fds_stay_bounded(tmp_path: Path) -> None:
    d = tmp_path / "j"
    with open_small(d, cache_bytes=0) as j:
        fill(j, 1500)
        j.sync()
    before = len(os.listdir("/proc/self/fd"))
    with open_small(d, cache_bytes=0) as j:
        assert len(seg_files(d)) > 100
        rng = random.Random(1)
        for _ in range(2000):
            i = rng.randint(1, 1500)
            assert j.get(i).command == command(i)
        assert len(os.listdir("/proc/self/fd")) - before <= 2 * 32 + 4
    assert len(os.listdir("/proc/self/fd")) == before


# ---- threads -----------------------------------------------------------------------------------


def test_writer_readers_and_flusher_together(tmp_path: Path) -> None:
    n = 3000
    j = SegmentJournal(tmp_path / "j", segment_bytes=64 << 10, cache_bytes=16 << 10)
    committed = 0  # highest index the writer has finished appending
    done = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        nonlocal committed
        try:
            for i in range(1, n + 1):
                j.append(i, 1 + i // 500, command(i))
                committed = i
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        try:
            while not done.is_set() or rng.random() < 0.5:
                top = committed
                if top == 0:
                    continue
                i = rng.randint(1, top)
                assert j.get(i) == Record(i, 1 + i // 500, command(i))
                assert j.term_at(i) == 1 + i // 500
                got = j.read_range(i, max_bytes=rng.randint(0, 5000), max_count=20)
                assert got and [r.index for r in got] == list(range(i, i + len(got)))
                assert all(r.command == command(r.index) for r in got)
        except BaseException as exc:
            errors.append(exc)

    def flusher() -> None:
        try:
            while not done.is_set():
                if j.dirty:
                    j.sync()
                time.sleep(0.001)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer), threading.Thread(target=flusher)]
    threads += [threading.Thread(target=reader, args=(s,)) for s in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    j.sync()
    assert not j.dirty and j.last_index == n
    j.close()
    with SegmentJournal(tmp_path / "j", segment_bytes=64 << 10) as k:
        assert k.last_index == n
        assert not list((tmp_path / "j").glob("*.pending"))


# ---- meta --------------------------------------------------------------------------------------


def test_meta_round_trip_and_defaults(tmp_path: Path) -> None:
    store = MetaStore(tmp_path / "node" / "raft.meta")
    assert store.load() == RaftMeta()
    store.store(RaftMeta(current_term=7, voted_for="10.0.0.2:7000", commit_index=42))
    assert store.load() == RaftMeta(7, "10.0.0.2:7000", 42)
    store.store(RaftMeta(current_term=8))
    assert MetaStore(tmp_path / "node" / "raft.meta").load() == RaftMeta(8, None, 0)
    assert sorted(p.name for p in (tmp_path / "node").iterdir()) == ["raft.meta"]


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty"])
def test_corrupt_meta_is_detected(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "raft.meta"
    MetaStore(path).store(RaftMeta(3, "a:1", 9))
    data = path.read_bytes()
    if damage == "flip":
        path.write_bytes(data[:10] + bytes([data[10] ^ 1]) + data[11:])
    elif damage == "truncate":
        path.write_bytes(data[:-3])
    else:
        path.write_bytes(b"")
    with pytest.raises(CorruptJournalError) as info:
        MetaStore(path).load()
    assert str(path) in str(info.value)
