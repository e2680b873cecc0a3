"""SegmentJournal against a list model: appends, truncations, retention, resets, clean reopens
and crashes that tear the tail, with tiny segments so every step crosses segment boundaries.
Records of both kinds: an upgrade step rewrites the journal's files as the code before CRC-32C
wrote them, so later steps run on old records, new appends behind them, or a mix."""

from __future__ import annotations

import logging
import os
import random
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from raftmq.raftlog.journal import HEADER_BYTES, SegmentJournal
from raftmq.raftlog.record import Record
from tests.raftlog.test_journal import rewrite_as_old_format

SEGMENT_BYTES = 4096
CACHE_BYTES = 6000  # small, so reads go to disk as well as to the cache
MAX_RECORD_BYTES = 9000


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


class JournalMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="journal-model-"))
        self.crashes = 0
        self.dir = self.root / "j0"
        self.logs = _Collect()
        logging.getLogger("raftlog.journal").addHandler(self.logs)
        self.journal = self._open()
        self.first = 1  # model: records[k] has index first + k
        self.records: list[Record] = []
        self.term_floor = 1
        self.base_term: int | None = None  # the term of first - 1, once retention deleted it

    def _open(self) -> SegmentJournal:
        return SegmentJournal(
            self.dir,
            segment_bytes=SEGMENT_BYTES,
            cache_bytes=CACHE_BYTES,
            max_record_bytes=MAX_RECORD_BYTES,
        )

    def teardown(self) -> None:
        logging.getLogger("raftlog.journal").removeHandler(self.logs)
        self.journal.close()
        shutil.rmtree(self.root)

    @property
    def next_index(self) -> int:
        return self.first + len(self.records)

    def _append(self, size: int, seed: int, bump: int) -> None:
        floor = max(self.term_floor, self.base_term or 0)  # never below the base's term
        term = (self.records[-1].term if self.records else floor) + bump
        rec = Record(self.next_index, term, random.Random(seed).randbytes(size))
        self.journal.append(rec.index, rec.term, rec.command)
        self.records.append(rec)

    # ---- writer steps ---------------------------------------------------------------------------

    @rule(
        size=st.integers(0, 80),
        seed=st.integers(0, 2**32 - 1),
        bump=st.sampled_from([0, 0, 0, 1]),
        n=st.integers(1, 12),
    )
    def append_small(self, size: int, seed: int, bump: int, n: int) -> None:
        for k in range(n):
            self._append(size, seed + k, bump if k == 0 else 0)

    @rule(
        size=st.integers(500, MAX_RECORD_BYTES),
        seed=st.integers(0, 2**32 - 1),
        bump=st.sampled_from([0, 1, 3]),
    )
    def append_large(self, size: int, seed: int, bump: int) -> None:
        self._append(size, seed, bump)

    @rule(data=st.data())
    def truncate_suffix(self, data: st.DataObject) -> None:
        from_index = data.draw(st.integers(self.first, self.next_index), label="from_index")
        dropped = self.journal.truncate_suffix(from_index)
        assert dropped == self.next_index - from_index
        del self.records[from_index - self.first :]
        assert not dropped or not self.journal.dirty  # a truncation is durable when it returns

    @rule(data=st.data())
    def delete_prefix(self, data: st.DataObject) -> None:
        before = data.draw(st.integers(self.first, self.next_index + 2), label="before_index")
        new_first = self.journal.delete_prefix(before)
        assert new_first == self.journal.first_index
        assert self.first <= new_first <= self.next_index
        if new_first > self.first:
            assert new_first <= before  # only records below before_index were deleted
            self.base_term = self.records[new_first - self.first - 1].term
        del self.records[: new_first - self.first]
        self.first = new_first

    @rule(data=st.data())
    def reset(self, data: st.DataObject) -> None:
        first = data.draw(st.integers(1, self.next_index + 20), label="reset_to")
        self.journal.reset(first)
        self.first, self.records = first, []
        self.base_term = None

    @rule(data=st.data(), prev_term=st.integers(1, 5))
    def reset_with_base(self, data: st.DataObject, prev_term: int) -> None:
        """A snapshot install: empty, next index `first`, the term of first - 1 known."""
        first = data.draw(st.integers(2, self.next_index + 20), label="install_at")
        self.journal.reset(first, prev_term)
        self.first, self.records = first, []
        self.base_term = prev_term

    @rule()
    def sync(self) -> None:
        self.journal.sync()
        assert not self.journal.dirty

    @rule()
    def reopen(self) -> None:
        self.journal.close()
        self.logs.messages.clear()
        self.journal = self._open()
        assert not [m for m in self.logs.messages if "journal.torn_tail" in m]

    @rule()
    def upgrade_in_place(self) -> None:
        """The journal was written by the code before CRC-32C (zlib's CRC-32), then opened by
        today's: every record on disk becomes an old one, and the journal reopens cleanly."""
        self.journal.close()
        rewrite_as_old_format(self.dir)
        self.reopen()

    @rule(data=st.data(), damage=st.sampled_from(["none", "chop", "flip", "garbage"]))
    def crash(self, data: st.DataObject, damage: str) -> None:
        """The process dies without a sync, maybe mid-append: the last record is partly written,
        or junk follows it. What survives is a copy of the files as they are (the page cache)."""
        self.crashes += 1
        survivor = self.root / f"j{self.crashes}"
        shutil.copytree(self.dir, survivor)
        self.journal.close()
        shutil.rmtree(self.dir)
        self.dir = survivor
        active = sorted(self.dir.glob("*.seg"))[-1]
        size = active.stat().st_size
        holds_last = bool(self.records) and size > 0  # the last record ends the active file
        if damage in ("chop", "flip") and not holds_last:
            damage = "garbage"
        last_start = at = 0
        with open(active, "r+b") as f:
            if damage == "none":
                pass
            elif damage == "garbage":
                junk = data.draw(st.binary(min_size=1, max_size=200), label="junk")
                f.seek(size)
                f.write(junk)
            else:
                last_start = size - HEADER_BYTES - len(self.records[-1].command)
                at = data.draw(st.integers(last_start, size - 1), label="at")
                if damage == "chop":
                    f.truncate(at)
                else:
                    f.seek(at)
                    b = f.read(1)
                    f.seek(at)
                    f.write(bytes([b[0] ^ 0xFF]))
        if damage in ("chop", "flip"):
            self.records.pop()
        self.logs.messages.clear()
        self.journal = self._open()
        torn = [m for m in self.logs.messages if "journal.torn_tail" in m]
        expect_warning = damage in ("flip", "garbage") or (damage == "chop" and at > last_start)
        assert bool(torn) == expect_warning, self.logs.messages
        if torn:
            assert str(active) in torn[0]

    # ---- reader steps ---------------------------------------------------------------------------

    @rule(
        data=st.data(),
        max_bytes=st.integers(0, 20_000),
        max_count=st.integers(1, 40),
    )
    def read_range(self, data: st.DataObject, max_bytes: int, max_count: int) -> None:
        start = data.draw(st.integers(self.first, self.next_index + 1), label="start")
        got = self.journal.read_range(start, max_bytes=max_bytes, max_count=max_count)
        expected = self.records[start - self.first : start - self.first + max_count]
        if not expected:
            assert got == []
            return
        assert got == expected[: len(got)]
        assert 1 <= len(got) <= max_count
        used = sum(len(r.command) for r in got)
        assert len(got) == 1 or used <= max_bytes
        if len(got) < len(expected):  # stopped early: only because the next would not fit
            assert used + len(expected[len(got)].command) > max_bytes

    @rule(data=st.data())
    def get_out_of_range(self, data: st.DataObject) -> None:
        below = data.draw(st.integers(max(0, self.first - 3), self.first - 1), label="below")
        for index in (below, self.next_index):
            with pytest.raises(IndexError):
                self.journal.get(index)
            if index == self.first - 1 and self.base_term is not None:
                # The base's term stays known (the leader's next append checks against it).
                assert self.journal.term_at(index) == self.base_term
                continue
            with pytest.raises(IndexError):
                self.journal.term_at(index)

    @invariant()
    def matches_model(self) -> None:
        j = self.journal
        assert (j.first_index, j.last_index, len(j)) == (
            self.first,
            self.next_index - 1,
            len(self.records),
        )
        for rec in self.records:
            assert j.term_at(rec.index) == rec.term
            assert j.get(rec.index) == rec

    @invariant()
    def no_stray_files(self) -> None:
        names = os.listdir(self.dir)
        assert any(n.endswith(".seg") for n in names)  # even empty, the journal has its segment
        assert all(n.endswith((".seg", ".idx", ".idx.pending")) or n == "terms" for n in names)


JournalMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
test_journal_matches_model = JournalMachine.TestCase
