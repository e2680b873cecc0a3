"""The chaos suite's storage faults change what they say they change (chaos/corruption.py): a
record of a sealed segment then fails its CRC on read, a ConsumeQueue row its checksum, and a
forged row names the previous row's batch. Real journal and lmdb files, no cluster."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from raftmq.broker.dispatch import DispatchOutput
from raftmq.broker.errors import CorruptRowError
from raftmq.broker.rows import CQBatch
from raftmq.broker.store import MessageStore
from raftmq.chaos.corruption import NothingToCorrupt, flip_index_row, flip_sealed_record
from raftmq.raftlog.errors import CorruptJournalError
from raftmq.raftlog.journal import SegmentJournal


def test_a_flipped_sealed_record_fails_its_crc(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    with pytest.raises(NothingToCorrupt):
        flip_sealed_record(journal, random.Random(1))
    with SegmentJournal(journal, segment_bytes=4096) as j:
        for i in range(1, 60):
            j.append(i, 1, bytes([i]) * (50 + i))
        j.sync()
    flip = flip_sealed_record(journal, random.Random(1))
    index = int(flip.what.split("(index ")[1].split(")")[0])
    with SegmentJournal(journal, segment_bytes=4096, cache_bytes=0) as j:
        with pytest.raises(CorruptJournalError):
            j.get(index)
        assert j.get(index + 1).command == bytes([index + 1]) * (51 + index)


def test_a_forged_row_names_another_batch_even_of_the_same_entry(tmp_path: Path) -> None:
    """Two batches of one queue in one entry (slots 0 and 1): the forged row takes the other
    batch's (index, slot), never its own (a first version copied the previous row's index
    only, changed nothing, and its chaos run said "never reported")."""
    with MessageStore(tmp_path, map_size_bytes=32 << 20) as s:
        for i in range(1, 4):
            pair = tuple(CQBatch("T", 1, 4 * i + 2 * k, i, k, 5, (9, 19), (4, 4), (7, 7))
                         for k in range(2))  # fmt: skip
            s.apply(DispatchOutput(i, 1, cq_batches=pair))
    for seed in range(8):
        flip = flip_index_row(tmp_path, "T", random.Random(seed), well_formed=True)
        before, after = (
            flip.what.split(": (raft index, slot) ")[1].split(" (another")[0].split(" -> ")
        )
        assert before != after


@pytest.mark.parametrize("well_formed", [False, True])
def test_a_changed_row_fails_its_check(tmp_path: Path, well_formed: bool) -> None:
    with MessageStore(tmp_path, map_size_bytes=32 << 20) as s:
        batches = [CQBatch("T", 1, 2 * i, i, 0, 5, (9, 19), (4, 4), (7, 7)) for i in range(1, 9)]
        s.apply([DispatchOutput(b.raft_index, 1, cq_batches=(b,)) for b in batches])
    flip = flip_index_row(tmp_path, "T", random.Random(3), well_formed=well_formed)
    offset = int(flip.what.split("offset ")[1].split(":")[0])
    if well_formed:  # the previous row's batch: raft index one less, same slot
        assert f"{(offset // 2, 0)} -> {(offset // 2 - 1, 0)}" in flip.what
    with MessageStore(tmp_path, map_size_bytes=32 << 20) as s:
        with pytest.raises(CorruptRowError, match="consume_queue"):
            s.read_queue("T", 1, offset, 2)
        for i in range(1, 9):  # every other row untouched
            if 2 * i != offset:
                assert s.read_queue("T", 1, 2 * i, 1)[0].raft_index == i
