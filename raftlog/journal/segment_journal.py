"""SegmentJournal: the Raft journal of one node, over segment files of CRC-framed records.

Storage and crash recovery by Raft index only; which entries to keep is Raft's call. It must never
return a record that failed its checksum or framing, never mmap, never hold every record in memory.
The parts live beside it: format (framing), segments (files), cache (memory), term_runs, recovery.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from raftmq.raftlog.errors import CorruptJournalError, LogClosedError
from raftmq.raftlog.journal.cache import OpenSegments, RecordCache
from raftmq.raftlog.journal.format import (
    CRC_BYTES,
    HEADER_BYTES,
    MAX_COMMAND_BYTES,
    decode_record,
    encode_header,
    unpack_header,
)
from raftmq.raftlog.journal.recovery import recover
from raftmq.raftlog.journal.segments import (
    MAX_SEGMENT_RECORDS,
    POS_BYTES,
    Segment,
    check_span,
    close_fds,
    create_segment,
    index_name,
    pending_index_name,
    read_record,
    segment_name,
    span_from_index_file,
    unlink_index_files,
    unlink_segment_files,
    write_fully,
)
from raftmq.raftlog.journal.term_runs import runs_from, write_terms
from raftmq.raftlog.record import Record

log = logging.getLogger("raftlog.journal")


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """One segment as retention sees it."""

    first_index: int
    last_index: int  # first_index - 1 when empty
    size_bytes: int
    mtime_ms: int  # wall clock of the last write (RocketMQ ages CommitLog files the same way)
    active: bool


_RANGE_BATCH_RECORDS = 1024  # records located per idx read in read_range


class SegmentJournal:
    """The journal of one node. Threads: one writer (append, truncate_suffix, delete_prefix,
    reset, close), any number of readers (get, read_range, term_at on indexes not being removed)
    and one flusher (sync)."""

    def __init__(
        self,
        directory: Path,
        *,
        segment_bytes: int = 256 << 20,
        cache_bytes: int = 32 << 20,
        max_record_bytes: int = 64 << 20,
    ) -> None:
        if segment_bytes < HEADER_BYTES or cache_bytes < 0 or max_record_bytes < 0:
            raise ValueError("segment_bytes must hold a header; cache and record limits >= 0")
        if max_record_bytes > MAX_COMMAND_BYTES:
            raise ValueError(f"max_record_bytes must be <= {MAX_COMMAND_BYTES} (the length field)")
        self._dir = Path(directory)
        self._segment_bytes = segment_bytes
        self._max_record_bytes = max_record_bytes
        # _lock guards every in-memory field below. The only I/O under it: opening a cold sealed
        # segment's files, renaming an .idx into place, closing fds (all short metadata calls).
        self._lock = threading.Lock()
        # _sync_lock serialises sync() with the writer's structural changes (truncate, delete,
        # reset, close), so an fsync never races a file being removed; plain appends skip it.
        self._sync_lock = threading.Lock()
        self._segments: list[Segment] = []
        self._firsts: list[int] = []  # segments' first indexes, for bisect
        self._active = Segment(1, self._dir / segment_name(1))
        self._active_pos: array[int] = array("Q")
        self._pending: list[Segment] = []  # sealed, .idx not yet committed
        self._open = OpenSegments()  # pins, and an LRU of open sealed segments' fds
        self._first_index = 1
        self._last_index = 0
        self._last_term = 0
        self._run_starts: list[int] = []
        self._run_terms: list[int] = []
        self._cache = RecordCache(cache_bytes)  # recent records and records read back
        self._write_seq = 0  # bumps on every change of the files' content
        self._synced_seq = 0
        self._dir_dirty = False  # a file was created since the directory was last fsynced
        self._generation = 0  # bumps when indexes are removed: stale reads must not be cached
        self._closed = False
        # Told of every record a read found failing its checks (the node's StorageHealth), from
        # the reader's thread; the read still raises. Must not raise or block.
        self.on_corrupt: Callable[[CorruptJournalError], None] | None = None
        self._dir.mkdir(parents=True, exist_ok=True)
        self._dir_fd = os.open(self._dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self._recover()
        except BaseException:
            for seg in self._segments:
                close_fds(seg)
            os.close(self._dir_fd)
            raise

    # ---- properties ------------------------------------------------------------------------------

    @property
    def directory(self) -> Path:
        return self._dir

    @property
    def first_index(self) -> int:
        """First stored index; when empty, the index the next append must use."""
        return self._first_index

    @property
    def last_index(self) -> int:
        """Last stored index; first_index - 1 when empty."""
        return self._last_index

    @property
    def dirty(self) -> bool:
        """Something was appended or changed since the last sync()."""
        return self._write_seq != self._synced_seq

    def __len__(self) -> int:
        with self._lock:
            return self._last_index - self._first_index + 1

    @property
    def has_base(self) -> bool:
        """The term of first_index - 1 is known (term_at answers for it)."""
        with self._lock:
            return bool(self._run_starts) and self._run_starts[0] < self._first_index

    def segments(self) -> list[SegmentInfo]:
        """The segments, oldest first (the last is the active one): what retention decides on.
        The modification time is the file's (a stat per segment: call it from a timer)."""
        with self._lock:
            segs = [(s.first, s.path, s.count, s.size) for s in self._segments]
            active = self._active
        out: list[SegmentInfo] = []
        for first, path, count, size in segs:
            try:
                mtime_ns = os.stat(path).st_mtime_ns
            except FileNotFoundError:
                continue  # deleted meanwhile
            out.append(
                SegmentInfo(
                    first, first + count - 1, size, mtime_ns // 1_000_000, path == active.path
                )
            )
        return out

    def __enter__(self) -> SegmentJournal:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ---- writer ----------------------------------------------------------------------------------

    def append(self, index: int, term: int, command: bytes) -> None:
        """Write one record after the last one. Not durable until sync()."""
        # This is the hot path (pysyncobj appends one entry at a time): one combined check,
        # one pwritev, one lock round; diagnostics only on the slow path.
        n = len(command)
        if (
            index != self._last_index + 1
            or term < self._last_term
            or n > self._max_record_bytes
            or self._closed
        ):
            self._refuse_append(index, term, n)
        size = HEADER_BYTES + n
        seg = self._active
        if seg.size and (seg.size + size > self._segment_bytes or seg.count >= MAX_SEGMENT_RECORDS):
            seg = self._roll(index)
        # Compared with the last run, not _last_term: an empty journal may keep the run of its
        # base (the entry before first_index, after retention or a snapshot install).
        new_run = not self._run_terms or term != self._run_terms[-1]
        if new_run:
            # The terms file must name every run whose records may be on disk: write it first.
            write_terms(self._dir, [*self._run_starts, index], [*self._run_terms, term])
        header = encode_header(index, term, command)
        offset = seg.size
        try:
            written = os.pwritev(seg.fd, (header, command), offset)
            if written != size:
                write_fully(seg.fd, header + command, written, offset)
        except OSError:
            # Leave no partial record for the next append to sit behind.
            try:
                os.ftruncate(seg.fd, offset)
            except OSError:
                log.exception("journal.append_cleanup_failed path=%s offset=%d", seg.path, offset)
            raise
        with self._lock:
            # Readers see the record only from here on, when all of its bytes are written.
            self._active_pos.append(offset)
            seg.size = offset + size
            seg.count += 1
            self._last_index = index
            self._last_term = term
            if new_run:
                self._run_starts.append(index)
                self._run_terms.append(term)
            self._write_seq += 1
            self._cache.push(term, command)

    def _refuse_append(self, index: int, term: int, n: int) -> None:
        self._check_open()
        if index != self._last_index + 1:
            raise ValueError(f"append of index {index}: the next index is {self._last_index + 1}")
        if term < self._last_term:
            raise ValueError(f"append of term {term} after term {self._last_term}: terms decrease")
        raise ValueError(f"record of {n} bytes exceeds max_record_bytes={self._max_record_bytes}")

    def truncate_suffix(self, from_index: int) -> int:
        """Drop records [from_index, last_index]; durable before returning. Returns how many."""
        with self._sync_lock:
            self._check_open()
            if from_index < self._first_index:
                raise ValueError(
                    f"truncate_suffix({from_index}) below first_index {self._first_index}"
                )
            if from_index > self._last_index:
                return 0
            dropped = self._last_index - from_index + 1
            j = bisect.bisect_right(self._firsts, from_index) - 1
            target = self._segments[j]
            keep = from_index - target.first
            if target is self._active:
                positions = self._active_pos[:keep]
                new_size = self._active_pos[keep]
                new_active = target
            else:
                positions = self._read_positions(target)
                new_size = positions[keep]
                del positions[keep:]
                new_active = Segment(target.first, target.path)
                new_active.fd = os.open(target.path, os.O_RDWR)
            later = self._segments[j + 1 :]
            with self._lock:
                self._generation += 1
                for seg in later:
                    self._retire(seg)
                if new_active is not target:
                    self._retire(target)
                del self._segments[j:], self._firsts[j:]
                self._segments.append(new_active)
                self._firsts.append(new_active.first)
                new_active.count = keep
                new_active.size = new_size
                self._active = new_active
                self._active_pos = positions
                self._last_index = from_index - 1
                # Runs starting at or after from_index go; if the journal is now empty, all of
                # them but its base's (the run covering first_index - 1, if one is known).
                k = bisect.bisect_left(self._run_starts, from_index)
                if from_index == self._first_index:
                    k = bisect.bisect_left(self._run_starts, self._first_index)
                del self._run_starts[k:], self._run_terms[k:]
                # The last record's term, or (now empty) the base's: terms never go below it.
                self._last_term = self._run_terms[-1] if self._run_terms else 0
                self._cache.drop_from(from_index)
                self._write_seq += 1
            # Remove later files newest first, so a crash at any point leaves a prefix of the log;
            # the target's .idx goes before its bytes shrink, so recovery rescans it as the tail.
            for seg in reversed(later):
                unlink_segment_files(self._dir, seg)
            if new_active is not target:
                unlink_index_files(self._dir, target.first)
            os.fsync(self._dir_fd)
            os.ftruncate(new_active.fd, new_size)
            self._sync_locked()
            write_terms(self._dir, self._run_starts, self._run_terms)
            if from_index > self._first_index and not self._cache.recent:
                last = self._read_uncached(from_index - 1)
                with self._lock:
                    self._cache.seed(last)
            return dropped

    def delete_prefix(self, before_index: int) -> int:
        """Retention: delete whole sealed segments whose records are all < before_index (never a
        partial segment, never the active one). Returns the new first_index."""
        with self._sync_lock:
            self._check_open()
            with self._lock:
                n = 0
                while n + 1 < len(self._segments) and self._firsts[n + 1] <= before_index:
                    n += 1
                if n == 0:
                    return self._first_index
                doomed = self._segments[:n]
                del self._segments[:n], self._firsts[:n]
                self._generation += 1
                for seg in doomed:
                    self._retire(seg)
                first = self._firsts[0]
                self._first_index = first
                # Keep the run that covers the entry before the new first index (its term is the
                # prevLogTerm of the next append the leader sends from there); older runs describe
                # nothing, and none do if everything went (an empty active segment is all left).
                k = max(0, bisect.bisect_right(self._run_starts, first - 1) - 1)
                if first > self._last_index:  # everything went: only the base's run stays
                    self._cache.last_record = None
                if k > 0:
                    del self._run_starts[:k], self._run_terms[:k]
                if first > self._last_index:
                    self._last_term = self._run_terms[0] if self._run_terms else 0
                self._cache.drop_before(first)
                starts, terms = list(self._run_starts), list(self._run_terms)
            for seg in doomed:  # oldest first: every intermediate state is a suffix of the log
                unlink_segment_files(self._dir, seg)
            os.fsync(self._dir_fd)
            if k > 0:
                write_terms(self._dir, starts, terms)
            return first

    def reset(self, first_index: int, prev_term: int = 0) -> None:
        """Drop everything; the journal becomes empty and the next append is first_index.
        `prev_term` (> 0) is the term of entry first_index - 1 (a snapshot's last entry): kept,
        so term_at(first_index - 1) answers the leader's consistency check of its next append."""
        if first_index < 1:
            raise ValueError(f"reset to first_index {first_index}: indexes start at 1")
        with self._sync_lock:
            self._check_open()
            with self._lock:
                doomed = list(self._segments)
                self._generation += 1
                for seg in doomed:
                    self._retire(seg)
                self._segments.clear()
                self._firsts.clear()
                self._first_index = first_index
                self._last_index = first_index - 1
                self._last_term = 0
                self._run_starts.clear()
                self._run_terms.clear()
                self._cache.clear(first_index)
                self._write_seq += 1
            for seg in reversed(doomed):
                unlink_segment_files(self._dir, seg)
            os.fsync(self._dir_fd)
            fresh = create_segment(self._dir, first_index)
            os.fsync(self._dir_fd)
            base = (
                ([first_index - 1], [prev_term]) if prev_term > 0 and first_index > 1 else ([], [])
            )
            write_terms(self._dir, *base)
            with self._lock:
                self._segments.append(fresh)
                self._firsts.append(first_index)
                self._active = fresh
                self._active_pos = array("Q")
                self._run_starts, self._run_terms = list(base[0]), list(base[1])
                self._last_term = base[1][0] if base[1] else 0  # appends never go below it
                self._synced_seq = self._write_seq

    def sync(self) -> None:
        """fdatasync everything appended so far. Safe to call from another thread while the writer
        appends; a no-op once closed."""
        with self._sync_lock:
            if self._closed:
                return
            self._sync_locked()

    def close(self) -> None:
        """Sync and release every file. Later calls other than sync() raise LogClosedError."""
        with self._sync_lock:
            if self._closed:
                return
            try:
                self._sync_locked()
            finally:
                with self._lock:
                    self._closed = True
                    for seg in self._segments:
                        self._retire(seg)
                    self._cache.clear(self._last_index + 1)
                os.close(self._dir_fd)

    # ---- readers ---------------------------------------------------------------------------------

    def get(self, index: int) -> Record:
        """The record at index; IndexError outside [first_index, last_index]."""
        cache = self._cache
        with self._lock:
            last = cache.last_record
            if last is not None and last.index == index:
                return last
            k = index - cache.recent_first
            if 0 <= k < len(cache.recent):
                term, command = cache.recent[k]
                rec = Record(index, term, command)
                if index == self._last_index:
                    cache.last_record = rec
                return rec
            cached = cache.lru.get(index)
            if cached is not None:
                cache.lru.move_to_end(index)
                return cached
            self._check_open()
            if not self._first_index <= index <= self._last_index:
                raise IndexError(
                    f"index {index} outside the journal [{self._first_index}, {self._last_index}]"
                )
            seg, pos, end = self._locate(index)
            generation = self._generation
        try:
            return self._read_pinned(seg, index, pos, end, generation)
        except CorruptJournalError as exc:
            self._report_corrupt(exc, index)
            raise

    def term_at(self, index: int) -> int:
        """The term of the record at index, from memory; IndexError outside the journal."""
        with self._lock:
            if index == self._last_index and index >= self._first_index:
                return self._last_term
            base = (
                index == self._first_index - 1
                and bool(self._run_starts)
                and self._run_starts[0] <= index
            )
            if not (self._first_index <= index <= self._last_index or base):
                raise IndexError(
                    f"index {index} outside the journal [{self._first_index}, {self._last_index}]"
                )
            return self._run_terms[bisect.bisect_right(self._run_starts, index) - 1]

    def read_range(self, start: int, *, max_bytes: int, max_count: int) -> list[Record]:
        """Consecutive records from start: at least one if start <= last_index, then more while
        their command bytes stay within max_bytes and their number within max_count."""
        if max_count < 1:
            raise ValueError(f"max_count must be >= 1, got {max_count}")
        with self._lock:
            self._check_open()
            if start < self._first_index:
                raise IndexError(f"index {start} is below first_index {self._first_index}")
            last_index = self._last_index
        cache = self._cache
        out: list[Record] = []
        used = 0
        index = start
        while index <= last_index and len(out) < max_count:
            recent: list[tuple[int, bytes]] = []
            with self._lock:
                k = index - cache.recent_first
                size = len(cache.recent)
                if 0 <= k < size:
                    n = min(max_count - len(out), last_index - index + 1, size - k)
                    recent = cache.recent_range(k, n)
                    rec: Record | None = None
                else:
                    rec = cache.lru.get(index)
                    if rec is not None:
                        cache.lru.move_to_end(index)
                if not recent and rec is None:
                    self._check_open()
                    if not self._first_index <= index <= self._last_index:
                        raise IndexError(f"index {index} was removed while being read")
                    seg, _, _ = self._locate(index)
                    want = min(
                        max_count - len(out),
                        last_index - index + 1,
                        seg.first + seg.count - index,
                        _RANGE_BATCH_RECORDS,
                    )
                    bounds: array[int] | None = None
                    if seg is self._active:
                        k = index - seg.first
                        bounds = self._active_pos[k : k + want + 1]
                        if len(bounds) == want:
                            bounds.append(seg.size)
            if recent:
                for term, command in recent:
                    if out and used + len(command) > max_bytes:
                        return out
                    out.append(Record(index, term, command))
                    used += len(command)
                    index += 1
                continue
            if rec is not None:
                if out and used + len(rec.command) > max_bytes:
                    break
                out.append(rec)
                used += len(rec.command)
                index += 1
                continue
            try:
                got = self._read_run_pinned(seg, index, want, bounds, max_bytes - used, not out)
            except CorruptJournalError as exc:
                self._report_corrupt(exc, index)
                raise
            out.extend(got)
            used += sum(len(r.command) for r in got)
            index += len(got)
            if len(got) < want:
                break  # the byte budget ran out inside this run
        return out

    def verify_sealed(self, start: int, max_bytes: int) -> tuple[int, int]:
        """Re-read records of a sealed segment from `start` off the disk (never from a cache),
        checking each, as the scrubber does. Returns (the next index to verify, bytes read);
        the next index is the first of the next segment at a segment's end, and first_index
        when `start` is below it or past the sealed segments (a new pass). A record failing its
        check is reported to on_corrupt and skipped, never returned."""
        with self._lock:
            self._check_open()
            if start < self._first_index or start >= self._active.first:
                return self._first_index, 0
            seg, _, _ = self._locate(start)
            want = min(seg.first + seg.count - start, _RANGE_BATCH_RECORDS)
        try:
            got = self._read_run_pinned(seg, start, want, None, max_bytes, True)
        except CorruptJournalError as exc:
            self._report_corrupt(exc, start)
            bad = exc.index if exc.index is not None else start
            return bad + 1, 0
        return start + len(got), sum(HEADER_BYTES + len(r.command) for r in got)

    def rewrite_sealed(self, index: int, term: int, command: bytes) -> tuple[str, int]:
        """Repair: write the record at `index` of a sealed segment again, in place, from a
        peer's intact copy, then read it back off the disk. Only if `term` is the term this
        journal holds for the index (kept in memory) and the copy fills the record's span in
        the position index exactly. Returns (segment path, byte offset). Raises
        CorruptJournalError (the copy does not fit, or it still reads back bad), IndexError (not
        in a sealed segment) or OSError. Call it from the writer's thread."""
        with self._lock:
            self._check_open()
            if not self._first_index <= index < self._active.first:
                raise IndexError(f"index {index} is not in a sealed segment")
            seg, _, _ = self._locate(index)
        try:
            pos, end = span_from_index_file(seg, index)
            ours = self.term_at(index)
            if ours != term or end - pos != HEADER_BYTES + len(command):
                raise CorruptJournalError(
                    str(seg.path),
                    pos,
                    f"a peer's copy (term {term}, {len(command)} bytes) does not fit the record "
                    f"(term {ours}, {end - pos - HEADER_BYTES} bytes)",
                )
            fd = os.open(seg.path, os.O_WRONLY)
            try:
                write_fully(fd, encode_header(index, term, command) + command, 0, pos)
                os.fdatasync(fd)
            finally:
                os.close(fd)
            read_record(seg, index, pos, end, self._max_record_bytes)  # raises if still bad
            return str(seg.path), pos
        finally:
            with self._lock:
                self._unpin(seg)

    # ---- internals: reading --------------------------------------------------------------------

    def _report_corrupt(self, exc: CorruptJournalError, index: int) -> None:
        if exc.index is None:
            exc.index = index
        hook = self.on_corrupt
        if hook is not None:
            hook(exc)

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError("journal is closed")

    def _locate(self, index: int) -> tuple[Segment, int, int]:
        """Pin the segment holding index (under _lock). Returns it with the record's byte span if
        known from memory (active segment), else (-1, -1): the caller reads the .idx unlocked."""
        seg = self._segments[bisect.bisect_right(self._firsts, index) - 1]
        self._pin(seg)
        if seg is self._active:
            k = index - seg.first
            pos = self._active_pos[k]
            end = self._active_pos[k + 1] if k + 1 < len(self._active_pos) else seg.size
            return seg, pos, end
        return seg, -1, -1

    def _read_pinned(self, seg: Segment, index: int, pos: int, end: int, generation: int) -> Record:
        rec: Record | None = None
        try:
            if pos < 0:
                pos, end = span_from_index_file(seg, index)
            rec = read_record(seg, index, pos, end, self._max_record_bytes)
            return rec
        finally:
            with self._lock:
                self._unpin(seg)
                if rec is not None and generation == self._generation:
                    self._cache.put(rec)

    def _read_uncached(self, index: int) -> Record:
        with self._lock:
            seg, pos, end = self._locate(index)
            generation = self._generation
        return self._read_pinned(seg, index, pos, end, generation)

    def _read_run_pinned(
        self,
        seg: Segment,
        index: int,
        want: int,
        bounds: array[int] | None,
        budget: int,
        must_take_one: bool,
    ) -> list[Record]:
        """Up to `want` records of one pinned segment from index, read with one pread. Unpins.

        Range reads do not fill the LRU: they are streams (followers catching up, consumers
        scanning), which would only push out what get() callers come back for.
        """
        out: list[Record] = []
        try:
            if bounds is None:
                k = index - seg.first
                tail = k + want == seg.count  # the last record ends at the segment's size
                n = want if tail else want + 1
                raw = os.pread(seg.idx_fd, n * POS_BYTES, k * POS_BYTES)
                if len(raw) != n * POS_BYTES:
                    raise CorruptJournalError(
                        str(seg.idx_path),
                        k * POS_BYTES,
                        "position index is shorter than its segment",
                    )
                bounds = array("Q")
                bounds.frombytes(raw)
                if tail:
                    bounds.append(seg.size)
            take = 0
            used = 0
            max_span = HEADER_BYTES + self._max_record_bytes
            for i in range(want):
                span = bounds[i + 1] - bounds[i]
                if not HEADER_BYTES <= span <= max_span or bounds[i + 1] > seg.size:
                    try:  # raises, naming the reason
                        check_span(seg, bounds[i], bounds[i + 1], self._max_record_bytes)
                    except CorruptJournalError as exc:
                        exc.index = index + i
                        raise
                if (take or not must_take_one) and used + span - HEADER_BYTES > budget:
                    break
                used += span - HEADER_BYTES
                take += 1
            if take == 0:
                return out
            base = bounds[0]
            data = os.pread(seg.fd, bounds[take] - base, base)
            if len(data) != bounds[take] - base:
                raise CorruptJournalError(str(seg.path), base + len(data), "segment truncated")
            view = memoryview(data)
            # unpack_header names each record's CRC; the check is format.body_crc, inlined.
            for i in range(take):
                start, end = bounds[i] - base, bounds[i + 1] - base
                crc, n, found, term, crc_of = unpack_header(data, start)
                if (
                    found != index + i
                    or n != end - start - HEADER_BYTES
                    or crc_of(view[start + CRC_BYTES : end]) != crc
                ):
                    # The slow path names what is wrong and raises; it never passes bad bytes.
                    try:
                        rec = decode_record(
                            data,
                            start,
                            end,
                            index + i,
                            max_record_bytes=self._max_record_bytes,
                            path=str(seg.path),
                            file_offset=bounds[i],
                        )
                    except CorruptJournalError as exc:
                        exc.index = index + i
                        raise
                    out.append(rec)
                    continue
                out.append(Record(index + i, term, data[start + HEADER_BYTES : end]))
            return out
        finally:
            with self._lock:
                self._unpin(seg)

    def _read_positions(self, seg: Segment) -> array[int]:
        """All positions of a sealed segment, from its .idx."""
        with self._lock:
            self._pin(seg)
        try:
            raw = os.pread(seg.idx_fd, seg.count * POS_BYTES, 0)
        finally:
            with self._lock:
                self._unpin(seg)
        if len(raw) != seg.count * POS_BYTES:
            raise CorruptJournalError(str(seg.idx_path), len(raw), "position index too short")
        positions = array("Q")
        positions.frombytes(raw)
        return positions

    # ---- internals: pins (cache.py holds the mechanism) ----------------------------------------

    def _pin(self, seg: Segment) -> None:
        """Under _lock: make seg's fds usable outside the lock until _unpin."""
        self._open.pin(seg, self._active)

    def _unpin(self, seg: Segment) -> None:
        self._open.unpin(seg)

    def _retire(self, seg: Segment) -> None:
        """Under _lock: seg leaves the journal; its fds close now or when its last pin goes."""
        if seg in self._pending:
            self._pending.remove(seg)
        self._open.retire(seg)

    # ---- internals: files ----------------------------------------------------------------------

    def _roll(self, next_first: int) -> Segment:
        """Seal the active segment (positions to a pending .idx) and start a new one."""
        old = self._active
        idx_path = self._dir / pending_index_name(old.first)
        data = self._active_pos.tobytes()
        ifd = os.open(idx_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_fully(ifd, data, 0, 0)
            new = create_segment(self._dir, next_first)
        except BaseException:
            os.close(ifd)
            os.unlink(idx_path)
            raise
        with self._lock:
            old.idx_fd = ifd
            old.committed = False
            self._pending.append(old)
            self._segments.append(new)
            self._firsts.append(next_first)
            self._active = new
            self._active_pos = array("Q")
            self._dir_dirty = True
            # Sealed segments live in the fd LRU; this may close the oldest unpinned ones.
            self._pin(old)
            self._unpin(old)
        return new

    def _sync_locked(self) -> None:
        """sync() with _sync_lock held: data first, then the pending indexes are committed."""
        with self._lock:
            seq = self._write_seq
            active = self._active
            pending = list(self._pending)
            dir_dirty = self._dir_dirty
            self._dir_dirty = False
            for seg in (*pending, active):
                self._pin(seg)
        try:
            for seg in pending:
                os.fdatasync(seg.fd)
                os.fsync(seg.idx_fd)
            os.fdatasync(active.fd)
            if dir_dirty or pending:
                os.fsync(self._dir_fd)  # the segment files' names, before their .idx commits
            if pending:
                with self._lock:  # _pin opens an .idx by name: rename and flag change together
                    for seg in pending:
                        if seg.dead or seg not in self._pending:
                            continue
                        os.rename(seg.idx_path, self._dir / index_name(seg.first))
                        seg.committed = True
                        self._pending.remove(seg)
                os.fsync(self._dir_fd)
        except BaseException:
            with self._lock:
                self._dir_dirty = True
            raise
        finally:
            with self._lock:
                for seg in (*pending, active):
                    self._unpin(seg)
        with self._lock:
            self._synced_seq = max(self._synced_seq, seq)

    # ---- recovery ------------------------------------------------------------------------------

    def _recover(self) -> None:
        """Open the directory (recovery.py: trust durable segments, cut a torn tail), then install
        what it found."""
        found = recover(self._dir, self._dir_fd, self._max_record_bytes)
        self._install(found.segments, found.positions, found.runs)

    def _install(
        self, segments: list[Segment], positions: array[int], runs: list[tuple[int, int]]
    ) -> None:
        active = segments[-1]
        self._segments = segments
        self._firsts = [s.first for s in segments]
        self._active = active
        self._active_pos = positions
        active.count = len(positions)
        self._first_index = segments[0].first
        self._last_index = active.first + active.count - 1
        runs = runs_from(runs, self._first_index - 1)  # earlier runs describe deleted records
        self._run_starts = [s for s, _ in runs]
        self._run_terms = [t for _, t in runs]
        self._last_term = 0
        self._cache.clear(self._last_index + 1)
        if self._last_index >= self._first_index:
            self._last_term = self._run_terms[-1]
            last = self._read_uncached(self._last_index)
            if last.term != self._last_term:
                raise CorruptJournalError(
                    str(active.path), 0, "the terms file disagrees with the last record"
                )
            self._cache.clear(last.index)  # the read above may have filled the LRU
            self._cache.seed(last)
        else:  # empty: only the base run (the term of first_index - 1), if one is known
            base = [(st, t) for st, t in runs if st <= self._first_index - 1][-1:]
            self._run_starts = [st for st, _ in base]
            self._run_terms = [t for _, t in base]
            self._last_term = base[0][1] if base else 0
        self._write_seq = self._synced_seq = 0
