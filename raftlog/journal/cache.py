"""What the journal keeps in memory besides positions: recent records, records read back (one byte
budget for both), and the pins and LRU that bound the open file descriptors of sealed segments.

Neither class locks: the journal calls every method under its own lock. Neither holds the whole log.
"""

from __future__ import annotations

import itertools
import os
from collections import OrderedDict, deque

from raftmq.raftlog.errors import CorruptJournalError
from raftmq.raftlog.journal.segments import Segment, close_fds
from raftmq.raftlog.record import Record

CACHE_OVERHEAD_BYTES = 128  # per cached record: the Record, its dict slot and key
MAX_OPEN_SEALED = 32  # sealed segments whose fds stay open; bounds fds however long the log


class RecordCache:
    """One budget of `budget_bytes` in two parts. `recent` holds the newest appended records,
    (term, command) for indexes [recent_first, last index], always at least the last one (pysyncobj
    reads log[-1] constantly); a deque because appends must stay cheap. `lru` holds records read
    back from disk. See evict() for how they share the budget."""

    __slots__ = ("budget_bytes", "last_record", "lru", "lru_bytes", "recent", "recent_bytes",
                 "recent_first")  # fmt: skip

    def __init__(self, budget_bytes: int, next_index: int = 1) -> None:
        self.budget_bytes = budget_bytes
        self.recent: deque[tuple[int, bytes]] = deque()
        self.recent_first = next_index
        self.recent_bytes = 0
        self.lru: OrderedDict[int, Record] = OrderedDict()
        self.lru_bytes = 0
        self.last_record: Record | None = None  # get(last_index) built once, not per call

    def push(self, term: int, command: bytes) -> None:
        """The record just appended after the last one."""
        self.recent.append((term, command))
        self.recent_bytes += len(command) + CACHE_OVERHEAD_BYTES
        self.last_record = None
        if self.recent_bytes + self.lru_bytes > self.budget_bytes:
            self.evict()

    def seed(self, rec: Record) -> None:
        """With `recent` empty: remember rec, the journal's last record (after a truncation or on
        opening), so recent again holds at least the last one."""
        self.recent.append((rec.term, rec.command))
        self.recent_first = rec.index
        self.recent_bytes += len(rec.command) + CACHE_OVERHEAD_BYTES

    def recent_range(self, k: int, n: int) -> list[tuple[int, bytes]]:
        """recent[k : k + n] (k within it), walked from the nearer end. islice walks a deque
        from its left end, so a read at the tail of a full cache (the dispatcher's every round,
        a follower's catch-up, a pull at the end) cost the cache's length: ~185 us per read with
        32 MiB of 1 KiB records (bench/journal_read_bench.py)."""
        recent = self.recent
        size = len(recent)
        if k <= size // 2:
            return list(itertools.islice(recent, k, k + n))
        tail = size - k  # reversed(recent)[j] is recent[size - 1 - j]
        out = list(itertools.islice(reversed(recent), max(0, tail - n), tail))
        out.reverse()
        return out

    def put(self, rec: Record) -> None:
        """Remember a record read back from disk."""
        cost = len(rec.command) + CACHE_OVERHEAD_BYTES
        if cost > self.budget_bytes or rec.index in self.lru:
            return
        if self.recent and rec.index >= self.recent_first:
            return  # already cached as a recent record
        self.lru[rec.index] = rec
        self.lru_bytes += cost
        if self.recent_bytes + self.lru_bytes > self.budget_bytes:
            self.evict()

    def evict(self) -> None:
        """Back within the budget. Either part may use the whole budget while the other is empty;
        when both compete, the one above half its share gives way. The last record always stays."""
        half = self.budget_bytes // 2
        while self.recent_bytes + self.lru_bytes > self.budget_bytes:
            if len(self.recent) > 1 and (self.recent_bytes > half or not self.lru):
                self.recent_bytes -= len(self.recent.popleft()[1]) + CACHE_OVERHEAD_BYTES
                self.recent_first += 1
            elif self.lru:
                _, old = self.lru.popitem(last=False)
                self.lru_bytes -= len(old.command) + CACHE_OVERHEAD_BYTES
            else:
                return

    def drop(self, index: int) -> None:
        old = self.lru.pop(index)
        self.lru_bytes -= len(old.command) + CACHE_OVERHEAD_BYTES

    def drop_from(self, from_index: int) -> None:
        """Forget records [from_index, ...] (a suffix truncation)."""
        self.last_record = None
        recent = self.recent
        while recent and self.recent_first + len(recent) > from_index:
            self.recent_bytes -= len(recent.pop()[1]) + CACHE_OVERHEAD_BYTES
        if not recent:
            self.recent_first = from_index
        for i in [i for i in self.lru if i >= from_index]:
            self.drop(i)

    def drop_before(self, first: int) -> None:
        """Forget records below first (retention)."""
        while self.recent_first < first and self.recent:
            self.recent_bytes -= len(self.recent.popleft()[1]) + CACHE_OVERHEAD_BYTES
            self.recent_first += 1
        for i in [i for i in self.lru if i < first]:
            self.drop(i)

    def clear(self, next_index: int) -> None:
        self.last_record = None
        self.recent.clear()
        self.recent_first = next_index
        self.recent_bytes = 0
        self.lru.clear()
        self.lru_bytes = 0


class OpenSegments:
    """Pins and an LRU of open sealed segments: a pinned segment's fds stay usable outside the
    journal's lock until unpinned; at most MAX_OPEN_SEALED unpinned sealed segments stay open."""

    __slots__ = ("open_sealed",)

    def __init__(self) -> None:
        self.open_sealed: OrderedDict[Segment, None] = OrderedDict()

    def pin(self, seg: Segment, active: Segment) -> None:
        """Make seg's fds usable until unpin (opening a cold sealed segment's files)."""
        if seg.fd < 0:
            try:
                seg.fd = os.open(seg.path, os.O_RDONLY)
                seg.idx_fd = os.open(seg.idx_path, os.O_RDONLY)
            except FileNotFoundError as exc:
                close_fds(seg)
                raise CorruptJournalError(str(exc.filename), 0, "journal file missing") from exc
        if seg is not active:
            self.open_sealed[seg] = None
            self.open_sealed.move_to_end(seg)
            if len(self.open_sealed) > MAX_OPEN_SEALED:
                for victim in list(self.open_sealed):
                    if len(self.open_sealed) <= MAX_OPEN_SEALED:
                        break
                    if victim.pins == 0 and victim is not seg:
                        del self.open_sealed[victim]
                        close_fds(victim)
        seg.pins += 1

    @staticmethod
    def unpin(seg: Segment) -> None:
        seg.pins -= 1
        if seg.pins == 0 and seg.dead:
            close_fds(seg)

    def retire(self, seg: Segment) -> None:
        """seg leaves the journal; its fds close now or when its last pin goes."""
        seg.dead = True
        self.open_sealed.pop(seg, None)
        if seg.pins == 0:
            close_fds(seg)
