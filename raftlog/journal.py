"""The Raft journal of one node: segment files of CRC-framed records, position indexes, term runs.

Storage and crash recovery by Raft index only; which entries to keep is Raft's call. It must never
return a record that failed its checksum or framing, never mmap, never hold every record in memory.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import logging
import os
import re
import struct
import threading
import zlib
from array import array
from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from raftmq.raftlog.errors import CorruptJournalError, LogClosedError
from raftmq.raftlog.meta import write_file_atomically
from raftmq.raftlog.record import Record

log = logging.getLogger("raftlog.journal")

# The directory:
#   <first:020d>.seg          records [first, next segment's first); the last file is the active one
#   <first:020d>.idx          little-endian u64 byte position of each record of a sealed segment;
#                             renamed into place by the first sync() after the segment was sealed,
#                             once its bytes are fsynced: an .idx exists only for durable segments
#   <first:020d>.idx.pending  the same for a segment sealed since the last sync
#   terms                     the term runs, (first index of run, term), crc-protected
# A record is a header '<IIQQ' (crc32, command length, index, term) and the command; the crc covers
# the header after the crc field, then the command. The index in every header lets a reader prove
# that a position led it to the record it asked for.

_HEADER = struct.Struct("<IIQQ")  # crc32, command length, index, term
_TAIL = struct.Struct("<IQQ")  # the header after the crc field: what the crc covers first
_CRC = struct.Struct("<I")
_POS = struct.Struct("<Q")
_POS2 = struct.Struct("<QQ")
HEADER_BYTES = _HEADER.size
_POS_BYTES = _POS.size

_SEG_RE = re.compile(r"^(\d{20})\.seg$")
_IDX_RE = re.compile(r"^(\d{20})\.idx$")
_PENDING_RE = re.compile(r"^(\d{20})\.idx\.pending$")
_TERMS_FILE = "terms"
_TERMS_HEAD = struct.Struct("<4sII")  # magic, version, number of runs
_TERMS_MAGIC = b"RMQT"
_TERMS_VERSION = 1
_RUN = struct.Struct("<QQ")
_MAX_TERMS_FILE_BYTES = 64 << 20

_CACHE_OVERHEAD_BYTES = 128  # per cached record: the Record, its dict slot and key
_SCAN_CHUNK_BYTES = 1 << 20  # recovery reads segments in chunks of this size
_RANGE_BATCH_RECORDS = 1024  # records located per idx read in read_range
_MAX_OPEN_SEALED = 32  # sealed segments whose fds stay open; bounds fds however long the log
# Bounds the active segment's in-memory positions (8 bytes each) when records are tiny.
MAX_SEGMENT_RECORDS = 1 << 20


def segment_name(first_index: int) -> str:
    return f"{first_index:020d}.seg"


def index_name(first_index: int) -> str:
    return f"{first_index:020d}.idx"


def pending_index_name(first_index: int) -> str:
    return f"{first_index:020d}.idx.pending"


@dataclass(slots=True, eq=False)
class _Segment:
    """One segment file. Objects are compared by identity: a segment that goes back from sealed to
    active (truncation) gets a new object, so readers holding the old one keep valid fds."""

    first: int
    path: Path
    count: int = 0  # records
    size: int = 0  # bytes
    fd: int = -1  # -1 while closed (sealed segments are opened on demand)
    idx_fd: int = -1
    committed: bool = False  # its .idx is in place: the segment's bytes were fsynced
    pins: int = 0  # readers/syncers using fd right now; fds close only at 0
    dead: bool = False  # removed from the journal; close fds when the last pin goes

    @property
    def idx_path(self) -> Path:
        name = index_name(self.first) if self.committed else pending_index_name(self.first)
        return self.path.with_name(name)


@dataclass(slots=True)
class _Scan:
    """What a sequential scan of one segment found."""

    positions: array[int] = field(default_factory=lambda: array("Q"))
    runs: list[tuple[int, int]] = field(default_factory=list)  # (first index, term)
    last_term: int = 0
    end: int = 0  # byte offset just past the last good record
    problem: str | None = None  # why the scan stopped before the end of the file

    @property
    def count(self) -> int:
        return len(self.positions)


def _encode_runs(starts: list[int], terms: list[int]) -> bytes:
    body = _TERMS_HEAD.pack(_TERMS_MAGIC, _TERMS_VERSION, len(starts)) + b"".join(
        _RUN.pack(s, t) for s, t in zip(starts, terms, strict=True)
    )
    return body + _CRC.pack(zlib.crc32(body))


def _decode_runs(data: bytes) -> list[tuple[int, int]] | None:
    """The runs stored in a terms file, or None if it is damaged or not ours."""
    if len(data) < _TERMS_HEAD.size + _CRC.size:
        return None
    body = data[: -_CRC.size]
    if zlib.crc32(body) != _CRC.unpack_from(data, len(body))[0]:
        return None
    magic, version, n = _TERMS_HEAD.unpack_from(body)
    if magic != _TERMS_MAGIC or version != _TERMS_VERSION:
        return None
    if len(body) != _TERMS_HEAD.size + n * _RUN.size:
        return None
    runs = [_RUN.unpack_from(body, _TERMS_HEAD.size + i * _RUN.size) for i in range(n)]
    for (s0, t0), (s1, t1) in itertools.pairwise(runs):
        if not (s1 > s0 and t1 > t0):
            return None
    return [(int(s), int(t)) for s, t in runs]


def _write_fully(fd: int, data: bytes, done: int, offset: int) -> None:
    """Write data at offset, its first `done` bytes being written already (a short pwritev:
    regular files only write short near ENOSPC or on a signal)."""
    rest = memoryview(data)[done:]
    offset += done
    while rest:
        n = os.pwrite(fd, rest, offset)
        if n == 0:
            raise OSError(f"pwrite wrote 0 bytes at offset {offset}")
        rest = rest[n:]
        offset += n


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
        self._dir = Path(directory)
        self._segment_bytes = segment_bytes
        self._cache_bytes = cache_bytes
        self._max_record_bytes = max_record_bytes
        # _lock guards every in-memory field below. The only I/O under it: opening a cold sealed
        # segment's files, renaming an .idx into place, closing fds (all short metadata calls).
        self._lock = threading.Lock()
        # _sync_lock serialises sync() with the writer's structural changes (truncate, delete,
        # reset, close), so an fsync never races a file being removed; plain appends skip it.
        self._sync_lock = threading.Lock()
        self._segments: list[_Segment] = []
        self._firsts: list[int] = []  # segments' first indexes, for bisect
        self._active = _Segment(1, self._dir / segment_name(1))
        self._active_pos: array[int] = array("Q")
        self._pending: list[_Segment] = []  # sealed, .idx not yet committed
        self._open_sealed: OrderedDict[_Segment, None] = OrderedDict()  # LRU of open fds
        self._first_index = 1
        self._last_index = 0
        self._last_term = 0
        self._run_starts: list[int] = []
        self._run_terms: list[int] = []
        # The cache, one budget of cache_bytes in two parts. `_recent` holds the newest appended
        # records, (term, command) for indexes [_recent_first, last_index], always at least the
        # last one (pysyncobj reads log[-1] constantly); a deque because appends must stay cheap.
        # `_lru` holds records read back from disk. See _evict for how they share the budget.
        self._recent: deque[tuple[int, bytes]] = deque()
        self._recent_first = 1
        self._recent_bytes = 0
        self._lru: OrderedDict[int, Record] = OrderedDict()
        self._lru_bytes = 0
        self._last_record: Record | None = None  # get(last_index) built once, not per call
        self._write_seq = 0  # bumps on every change of the files' content
        self._synced_seq = 0
        self._dir_dirty = False  # a file was created since the directory was last fsynced
        self._generation = 0  # bumps when indexes are removed: stale reads must not be cached
        self._closed = False
        self._dir.mkdir(parents=True, exist_ok=True)
        self._dir_fd = os.open(self._dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self._recover()
        except BaseException:
            for seg in self._segments:
                self._close_fds(seg)
            os.close(self._dir_fd)
            raise

    # ---- properties ------------------------------------------------------------------------------

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
        new_run = term != self._last_term or not self._run_terms
        if new_run:
            # The terms file must name every run whose records may be on disk: write it first.
            self._write_terms([*self._run_starts, index], [*self._run_terms, term])
        tail = _TAIL.pack(n, index, term)
        header = _CRC.pack(zlib.crc32(command, zlib.crc32(tail))) + tail
        offset = seg.size
        try:
            written = os.pwritev(seg.fd, (header, command), offset)
            if written != size:
                _write_fully(seg.fd, header + command, written, offset)
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
            self._recent.append((term, command))
            self._recent_bytes += n + _CACHE_OVERHEAD_BYTES
            self._last_record = None
            if self._recent_bytes + self._lru_bytes > self._cache_bytes:
                self._evict()

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
                new_active = _Segment(target.first, target.path)
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
                # Runs starting at or after from_index go; all of them if the journal is now empty.
                k = bisect.bisect_left(self._run_starts, from_index)
                if from_index == self._first_index:
                    k = 0
                del self._run_starts[k:], self._run_terms[k:]
                self._last_term = self._run_terms[-1] if self._run_terms else 0
                self._last_record = None
                recent = self._recent
                while recent and self._recent_first + len(recent) > from_index:
                    self._recent_bytes -= len(recent.pop()[1]) + _CACHE_OVERHEAD_BYTES
                if not recent:
                    self._recent_first = from_index
                for i in [i for i in self._lru if i >= from_index]:
                    self._lru_drop(i)
                self._write_seq += 1
            # Remove later files newest first, so a crash at any point leaves a prefix of the log;
            # the target's .idx goes before its bytes shrink, so recovery rescans it as the tail.
            for seg in reversed(later):
                self._unlink_segment_files(seg)
            if new_active is not target:
                self._unlink_index_files(target.first)
            os.fsync(self._dir_fd)
            os.ftruncate(new_active.fd, new_size)
            self._sync_locked()
            self._write_terms(self._run_starts, self._run_terms)
            if from_index > self._first_index and not self._recent:
                last = self._read_uncached(from_index - 1)
                with self._lock:
                    self._recent.append((last.term, last.command))
                    self._recent_first = last.index
                    self._recent_bytes += len(last.command) + _CACHE_OVERHEAD_BYTES
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
                # Keep the run that covers the new first index; older runs describe nothing, and
                # none do if everything went (an empty active segment is all that is left).
                k = bisect.bisect_right(self._run_starts, first) - 1
                if first > self._last_index:
                    k = len(self._run_starts)
                    self._last_term = 0
                    self._last_record = None
                if k > 0:
                    del self._run_starts[:k], self._run_terms[:k]
                while self._recent_first < first and self._recent:
                    self._recent_bytes -= len(self._recent.popleft()[1]) + _CACHE_OVERHEAD_BYTES
                    self._recent_first += 1
                for i in [i for i in self._lru if i < first]:
                    self._lru_drop(i)
                starts, terms = list(self._run_starts), list(self._run_terms)
            for seg in doomed:  # oldest first: every intermediate state is a suffix of the log
                self._unlink_segment_files(seg)
            os.fsync(self._dir_fd)
            if k > 0:
                self._write_terms(starts, terms)
            return first

    def reset(self, first_index: int) -> None:
        """Drop everything; the journal becomes empty and the next append is first_index."""
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
                self._clear_cache(first_index)
                self._write_seq += 1
            for seg in reversed(doomed):
                self._unlink_segment_files(seg)
            os.fsync(self._dir_fd)
            fresh = self._create_segment(first_index)
            os.fsync(self._dir_fd)
            self._write_terms([], [])
            with self._lock:
                self._segments.append(fresh)
                self._firsts.append(first_index)
                self._active = fresh
                self._active_pos = array("Q")
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
                    self._clear_cache(self._last_index + 1)
                os.close(self._dir_fd)

    # ---- readers ---------------------------------------------------------------------------------

    def get(self, index: int) -> Record:
        """The record at index; IndexError outside [first_index, last_index]."""
        with self._lock:
            last = self._last_record
            if last is not None and last.index == index:
                return last
            k = index - self._recent_first
            if 0 <= k < len(self._recent):
                term, command = self._recent[k]
                rec = Record(index, term, command)
                if index == self._last_index:
                    self._last_record = rec
                return rec
            cached = self._lru.get(index)
            if cached is not None:
                self._lru.move_to_end(index)
                return cached
            self._check_open()
            if not self._first_index <= index <= self._last_index:
                raise IndexError(
                    f"index {index} outside the journal [{self._first_index}, {self._last_index}]"
                )
            seg, pos, end = self._locate(index)
            generation = self._generation
        return self._read_pinned(seg, index, pos, end, generation)

    def term_at(self, index: int) -> int:
        """The term of the record at index, from memory; IndexError outside the journal."""
        with self._lock:
            if index == self._last_index and index >= self._first_index:
                return self._last_term
            if not self._first_index <= index <= self._last_index:
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
        out: list[Record] = []
        used = 0
        index = start
        while index <= last_index and len(out) < max_count:
            recent: list[tuple[int, bytes]] = []
            with self._lock:
                k = index - self._recent_first
                if 0 <= k < len(self._recent):
                    n = min(max_count - len(out), last_index - index + 1)
                    recent = list(itertools.islice(self._recent, k, k + n))
                    rec: Record | None = None
                else:
                    rec = self._lru.get(index)
                    if rec is not None:
                        self._lru.move_to_end(index)
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
            got = self._read_run_pinned(seg, index, want, bounds, max_bytes - used, not out)
            out.extend(got)
            used += sum(len(r.command) for r in got)
            index += len(got)
            if len(got) < want:
                break  # the byte budget ran out inside this run
        return out

    # ---- internals: reading --------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError("journal is closed")

    def _locate(self, index: int) -> tuple[_Segment, int, int]:
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

    def _read_pinned(
        self, seg: _Segment, index: int, pos: int, end: int, generation: int
    ) -> Record:
        rec: Record | None = None
        try:
            if pos < 0:
                pos, end = self._span_from_index_file(seg, index)
            rec = self._read_record(seg, index, pos, end)
            return rec
        finally:
            with self._lock:
                self._unpin(seg)
                if rec is not None and generation == self._generation:
                    self._lru_put(rec)

    def _read_uncached(self, index: int) -> Record:
        with self._lock:
            seg, pos, end = self._locate(index)
            generation = self._generation
        return self._read_pinned(seg, index, pos, end, generation)

    def _span_from_index_file(self, seg: _Segment, index: int) -> tuple[int, int]:
        k = index - seg.first
        if k + 1 < seg.count:
            raw = os.pread(seg.idx_fd, 2 * _POS_BYTES, k * _POS_BYTES)
            if len(raw) == 2 * _POS_BYTES:
                pos, end = _POS2.unpack(raw)
                return int(pos), int(end)
        else:
            raw = os.pread(seg.idx_fd, _POS_BYTES, k * _POS_BYTES)
            if len(raw) == _POS_BYTES:
                return int(_POS.unpack(raw)[0]), seg.size
        raise CorruptJournalError(
            str(seg.idx_path), k * _POS_BYTES, "position index is shorter than its segment"
        )

    def _check_span(self, seg: _Segment, pos: int, end: int) -> None:
        size = end - pos
        if not HEADER_BYTES <= size <= HEADER_BYTES + self._max_record_bytes or end > seg.size:
            raise CorruptJournalError(
                str(seg.path), pos, f"position index gives a record span of [{pos}, {end})"
            )

    def _read_record(self, seg: _Segment, index: int, pos: int, end: int) -> Record:
        self._check_span(seg, pos, end)
        data = os.pread(seg.fd, end - pos, pos)
        return self._decode(data, 0, len(data), index, seg.path, pos)

    def _read_run_pinned(
        self,
        seg: _Segment,
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
                raw = os.pread(seg.idx_fd, n * _POS_BYTES, k * _POS_BYTES)
                if len(raw) != n * _POS_BYTES:
                    raise CorruptJournalError(
                        str(seg.idx_path),
                        k * _POS_BYTES,
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
                    self._check_span(seg, bounds[i], bounds[i + 1])  # raises, naming the reason
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
            unpack, crc32 = _HEADER.unpack_from, zlib.crc32
            for i in range(take):
                start, end = bounds[i] - base, bounds[i + 1] - base
                crc, n, found, term = unpack(data, start)
                if (
                    found != index + i
                    or n != end - start - HEADER_BYTES
                    or crc32(view[start + _CRC.size : end]) != crc
                ):
                    # The slow path names what is wrong and raises; it never passes bad bytes.
                    out.append(self._decode(data, start, end, index + i, seg.path, bounds[i]))
                    continue
                out.append(Record(index + i, term, data[start + HEADER_BYTES : end]))
            return out
        finally:
            with self._lock:
                self._unpin(seg)

    def _decode(
        self, data: bytes, start: int, end: int, index: int, path: Path, file_offset: int
    ) -> Record:
        """Check and parse one record occupying data[start:end]; never returns unchecked bytes."""
        if end > len(data) or end - start < HEADER_BYTES:
            raise CorruptJournalError(str(path), file_offset, "record truncated")
        crc, n, found, term = _HEADER.unpack_from(data, start)
        if n > self._max_record_bytes:
            raise CorruptJournalError(
                str(path), file_offset, f"length field {n} exceeds max_record_bytes"
            )
        if n != end - start - HEADER_BYTES:
            raise CorruptJournalError(
                str(path),
                file_offset,
                f"length field {n} disagrees with the record span {end - start - HEADER_BYTES}",
            )
        if zlib.crc32(memoryview(data)[start + _CRC.size : end]) != crc:
            raise CorruptJournalError(str(path), file_offset, "crc mismatch")
        if found != index:
            raise CorruptJournalError(
                str(path), file_offset, f"record holds index {found}, expected {index}"
            )
        return Record(index, term, data[start + HEADER_BYTES : end])

    def _read_positions(self, seg: _Segment) -> array[int]:
        """All positions of a sealed segment, from its .idx."""
        with self._lock:
            self._pin(seg)
        try:
            raw = os.pread(seg.idx_fd, seg.count * _POS_BYTES, 0)
        finally:
            with self._lock:
                self._unpin(seg)
        if len(raw) != seg.count * _POS_BYTES:
            raise CorruptJournalError(str(seg.idx_path), len(raw), "position index too short")
        positions = array("Q")
        positions.frombytes(raw)
        return positions

    # ---- internals: cache, pins ----------------------------------------------------------------

    def _lru_put(self, rec: Record) -> None:
        """Under _lock: remember a record read back from disk."""
        cost = len(rec.command) + _CACHE_OVERHEAD_BYTES
        if cost > self._cache_bytes or rec.index in self._lru:
            return
        if self._recent and rec.index >= self._recent_first:
            return  # already cached as a recent record
        self._lru[rec.index] = rec
        self._lru_bytes += cost
        if self._recent_bytes + self._lru_bytes > self._cache_bytes:
            self._evict()

    def _evict(self) -> None:
        """Under _lock: back within cache_bytes. Either part may use the whole budget while the
        other is empty; when both compete, the one above half its share gives way. The last
        record always stays."""
        half = self._cache_bytes // 2
        while self._recent_bytes + self._lru_bytes > self._cache_bytes:
            if len(self._recent) > 1 and (self._recent_bytes > half or not self._lru):
                self._recent_bytes -= len(self._recent.popleft()[1]) + _CACHE_OVERHEAD_BYTES
                self._recent_first += 1
            elif self._lru:
                _, old = self._lru.popitem(last=False)
                self._lru_bytes -= len(old.command) + _CACHE_OVERHEAD_BYTES
            else:
                return

    def _lru_drop(self, index: int) -> None:
        old = self._lru.pop(index)
        self._lru_bytes -= len(old.command) + _CACHE_OVERHEAD_BYTES

    def _clear_cache(self, next_index: int) -> None:
        self._last_record = None
        self._recent.clear()
        self._recent_first = next_index
        self._recent_bytes = 0
        self._lru.clear()
        self._lru_bytes = 0

    def _pin(self, seg: _Segment) -> None:
        """Under _lock: make seg's fds usable outside the lock until _unpin."""
        if seg.fd < 0:
            try:
                seg.fd = os.open(seg.path, os.O_RDONLY)
                seg.idx_fd = os.open(seg.idx_path, os.O_RDONLY)
            except FileNotFoundError as exc:
                self._close_fds(seg)
                raise CorruptJournalError(str(exc.filename), 0, "journal file missing") from exc
        if seg is not self._active:
            self._open_sealed[seg] = None
            self._open_sealed.move_to_end(seg)
            if len(self._open_sealed) > _MAX_OPEN_SEALED:
                for victim in list(self._open_sealed):
                    if len(self._open_sealed) <= _MAX_OPEN_SEALED:
                        break
                    if victim.pins == 0 and victim is not seg:
                        del self._open_sealed[victim]
                        self._close_fds(victim)
        seg.pins += 1

    def _unpin(self, seg: _Segment) -> None:
        seg.pins -= 1
        if seg.pins == 0 and seg.dead:
            self._close_fds(seg)

    def _retire(self, seg: _Segment) -> None:
        """Under _lock: seg leaves the journal; its fds close now or when its last pin goes."""
        seg.dead = True
        self._open_sealed.pop(seg, None)
        if seg in self._pending:
            self._pending.remove(seg)
        if seg.pins == 0:
            self._close_fds(seg)

    @staticmethod
    def _close_fds(seg: _Segment) -> None:
        for fd in (seg.fd, seg.idx_fd):
            if fd >= 0:
                os.close(fd)
        seg.fd = seg.idx_fd = -1

    # ---- internals: files ----------------------------------------------------------------------

    def _create_segment(self, first: int) -> _Segment:
        path = self._dir / segment_name(first)
        # O_EXCL: an existing file of that name would be someone's records; never clobber it.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        return _Segment(first, path, fd=fd)

    def _roll(self, next_first: int) -> _Segment:
        """Seal the active segment (positions to a pending .idx) and start a new one."""
        old = self._active
        idx_path = self._dir / pending_index_name(old.first)
        data = self._active_pos.tobytes()
        ifd = os.open(idx_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_fully(ifd, data, 0, 0)
            new = self._create_segment(next_first)
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

    def _unlink_segment_files(self, seg: _Segment) -> None:
        self._unlink_index_files(seg.first)
        seg.path.unlink(missing_ok=True)

    def _unlink_index_files(self, first: int) -> None:
        (self._dir / index_name(first)).unlink(missing_ok=True)
        (self._dir / pending_index_name(first)).unlink(missing_ok=True)

    def _write_terms(self, starts: list[int], terms: list[int]) -> None:
        write_file_atomically(self._dir / _TERMS_FILE, _encode_runs(starts, terms))

    # ---- recovery ------------------------------------------------------------------------------

    def _recover(self) -> None:
        """Open the directory: trust durable sealed segments, rescan the tail, cut a torn tail.

        A segment whose .idx is in place was fsynced (sync() renames the .idx into place only after
        the segment's data), so it is trusted and only spot-checked. The trailing segments without
        an .idx (sealed since the last sync, and the active one) may have lost bytes in a crash:
        they are scanned record by record and the log ends at the first bad record. A gap, a
        misnamed file or a bad record inside the trusted part raises CorruptJournalError.
        """
        firsts, idx_firsts, sizes = self._list_files()
        if not firsts:
            fresh = self._create_segment(1)
            os.fsync(self._dir_fd)
            self._write_terms([], [])
            self._install([fresh], array("Q"), [])
            return
        segments = [_Segment(f, self._dir / segment_name(f), size=sizes[f]) for f in firsts]
        scan_from = len(segments) - 1
        while scan_from > 0 and firsts[scan_from - 1] not in idx_firsts:
            scan_from -= 1
        trusted, tail = segments[:scan_from], segments[scan_from:]

        # Names first, so that a misnamed file is reported as such rather than as a gap.
        first_terms: dict[int, int] = {}
        for seg in trusted:
            with self._opened(seg):
                raw = os.pread(seg.fd, HEADER_BYTES, 0)
            if len(raw) < HEADER_BYTES:
                raise CorruptJournalError(str(seg.path), 0, "segment shorter than one header")
            _, _, found, term = _HEADER.unpack(raw)
            if found != seg.first:
                raise CorruptJournalError(
                    str(seg.path), 0, f"segment named {seg.first} starts with record {found}"
                )
            first_terms[seg.first] = term
        for seg in tail:  # the first record may be torn here: only a whole one can misname a file
            with self._opened(seg):
                self._scan(seg, min_term=0, max_count=1)

        last_terms: dict[int, int] = {}  # trusted segment's first index -> its last record's term
        for j, seg in enumerate(trusted):
            seg.count = segments[j + 1].first - seg.first
            with self._opened(seg):
                term = self._spot_check(seg) if seg.first in idx_firsts else None
                if term is None:
                    scan = self._scan(seg, min_term=0, max_count=seg.count)
                    if scan.problem is None and scan.count != seg.count:
                        scan.problem = (
                            f"holds {scan.count} records but the next segment starts at "
                            f"{segments[j + 1].first}: a gap"
                        )
                    if scan.problem is not None:
                        raise CorruptJournalError(str(seg.path), scan.end, scan.problem)
                    self._commit_index(seg, scan.positions, rebuilt=True)
                    term = scan.last_term
            seg.committed = True
            last_terms[seg.first] = term

        scans: dict[_Segment, _Scan] = {}
        kept = list(trusted)
        prev_term = last_terms[trusted[-1].first] if trusted else 0
        for j, seg in enumerate(tail):
            limit = tail[j + 1].first - seg.first if j + 1 < len(tail) else None
            with self._opened(seg, writable=True):
                scan = self._scan(seg, min_term=prev_term, max_count=limit)
                seg.count = scan.count
                short = limit is not None and scan.count < limit
                dropped = tail[j + 1 :] if short else []
                if scan.problem is not None or dropped:
                    for later in reversed(dropped):  # newest first: each step leaves a prefix
                        self._unlink_segment_files(later)
                    self._cut_torn(seg, scan, [s.path.name for s in dropped])
            scans[seg] = scan
            kept.append(seg)
            prev_term = scan.last_term
            if short:
                break

        # A segment left without records goes, unless it is the only one (it names the next index).
        if len(kept) > 1 and kept[-1].count == 0:
            self._unlink_segment_files(kept.pop())
        active = kept[-1]
        for seg in kept[:-1]:
            if seg in scans:  # sealed before the crash but never synced: durable from now on
                with self._opened(seg):
                    self._commit_index(seg, scans[seg].positions, rebuilt=False)
                seg.committed = True
        positions = scans[active].positions if active in scans else self._load_index(active)
        active.committed = False
        self._unlink_index_files(active.first)  # the active segment's positions live in memory

        scanned = [s for s in kept if s in scans]
        trusted_end = scanned[0].first if scanned else active.first + active.count
        runs = self._trusted_runs(
            [s for s in kept if s not in scans], trusted_end, first_terms, last_terms
        )
        for seg in scanned:
            for start, term in scans[seg].runs:
                if not runs or runs[-1][1] != term:
                    runs.append((start, term))

        active.fd = os.open(active.path, os.O_RDWR)
        self._segments = kept
        os.fdatasync(active.fd)
        os.fsync(self._dir_fd)
        k = max(0, bisect.bisect_right([s for s, _ in runs], kept[0].first) - 1)
        runs = runs[k:]  # runs that end before the first index describe deleted records
        encoded = _encode_runs([s for s, _ in runs], [t for _, t in runs])
        if self._load_terms_bytes() != encoded:
            write_file_atomically(self._dir / _TERMS_FILE, encoded)
        self._install(kept, positions, runs)

    def _list_files(self) -> tuple[list[int], set[int], dict[int, int]]:
        """Segment first indexes (sorted, non-empty files only), which have an .idx, and sizes.
        Removes what carries no records: pending indexes, orphan indexes, empty segments."""
        seg_firsts: list[int] = []
        idx_firsts: set[int] = set()
        leftovers: list[Path] = []
        for name in os.listdir(self._dir):
            if m := _SEG_RE.match(name):
                seg_firsts.append(int(m.group(1)))
            elif m := _IDX_RE.match(name):
                idx_firsts.add(int(m.group(1)))
            elif _PENDING_RE.match(name) or name == _TERMS_FILE + ".tmp":
                leftovers.append(self._dir / name)
            elif name != _TERMS_FILE:
                log.warning("journal.unknown_file path=%s", self._dir / name)
        seg_firsts.sort()
        for first in seg_firsts:
            if first < 1:
                raise CorruptJournalError(
                    str(self._dir / segment_name(first)), 0, "a segment named index 0"
                )
        leftovers += [self._dir / index_name(f) for f in idx_firsts - set(seg_firsts)]
        sizes = {f: (self._dir / segment_name(f)).stat().st_size for f in seg_firsts}
        # Empty files are segments that never got a record (or lost all of them); the newest is
        # kept when nothing else is left, because its name is the next index to append.
        firsts = [f for f in seg_firsts if sizes[f] > 0]
        empties = [f for f in seg_firsts if sizes[f] == 0]
        if not firsts and empties:
            firsts = [empties.pop()]
        for f in empties:
            leftovers += [self._dir / segment_name(f), self._dir / index_name(f)]
            idx_firsts.discard(f)
        for path in leftovers:
            path.unlink(missing_ok=True)
        if leftovers:
            os.fsync(self._dir_fd)
        return firsts, idx_firsts, sizes

    @contextlib.contextmanager
    def _opened(self, seg: _Segment, *, writable: bool = False) -> Iterator[_Segment]:
        """Recovery opens one segment at a time, so a journal of many segments needs few fds."""
        seg.fd = os.open(seg.path, os.O_RDWR if writable else os.O_RDONLY)
        try:
            yield seg
        finally:
            os.close(seg.fd)
            seg.fd = -1

    def _install(
        self, segments: list[_Segment], positions: array[int], runs: list[tuple[int, int]]
    ) -> None:
        active = segments[-1]
        self._segments = segments
        self._firsts = [s.first for s in segments]
        self._active = active
        self._active_pos = positions
        active.count = len(positions)
        self._first_index = segments[0].first
        self._last_index = active.first + active.count - 1
        # Runs ending before the first index describe deleted records.
        k = max(0, bisect.bisect_right([s for s, _ in runs], self._first_index) - 1)
        self._run_starts = [s for s, _ in runs[k:]]
        self._run_terms = [t for _, t in runs[k:]]
        self._last_term = 0
        self._clear_cache(self._last_index + 1)
        if self._last_index >= self._first_index:
            self._last_term = self._run_terms[-1]
            last = self._read_uncached(self._last_index)
            if last.term != self._last_term:
                raise CorruptJournalError(
                    str(active.path), 0, "the terms file disagrees with the last record"
                )
            self._recent.append((last.term, last.command))
            self._recent_first = last.index
            self._recent_bytes = len(last.command) + _CACHE_OVERHEAD_BYTES
            self._lru.clear()
            self._lru_bytes = 0
        else:
            self._run_starts, self._run_terms = [], []
        self._write_seq = self._synced_seq = 0

    def _cut_torn(self, seg: _Segment, scan: _Scan, dropped_files: list[str]) -> None:
        log.warning(
            "journal.torn_tail path=%s offset=%d dropped_from=%d bytes_dropped=%d reason=%r "
            "dropped_files=%s",
            seg.path,
            scan.end,
            seg.first + scan.count,
            seg.size - scan.end,
            scan.problem or "records missing before the next segment",
            dropped_files,
        )
        os.ftruncate(seg.fd, scan.end)
        os.fdatasync(seg.fd)
        seg.size = scan.end

    def _spot_check(self, seg: _Segment) -> int | None:
        """Cheap checks of a sealed segment with an .idx: the .idx length, its first and last
        positions, the last record's header and the file size. Returns the last record's term,
        or None if the .idx must be rebuilt."""
        idx_path = self._dir / index_name(seg.first)
        if idx_path.stat().st_size != seg.count * _POS_BYTES:
            return None
        ifd = os.open(idx_path, os.O_RDONLY)
        try:
            first_pos = os.pread(ifd, _POS_BYTES, 0)
            last_pos = os.pread(ifd, _POS_BYTES, (seg.count - 1) * _POS_BYTES)
        finally:
            os.close(ifd)
        if len(first_pos) != _POS_BYTES or len(last_pos) != _POS_BYTES:
            return None
        if _POS.unpack(first_pos)[0] != 0:
            return None
        pos = int(_POS.unpack(last_pos)[0])
        raw = os.pread(seg.fd, HEADER_BYTES, pos)
        if len(raw) != HEADER_BYTES:
            return None
        _, n, index, term = _HEADER.unpack(raw)
        if index != seg.first + seg.count - 1 or pos + HEADER_BYTES + n != seg.size:
            return None
        return int(term)

    def _commit_index(self, seg: _Segment, positions: array[int], *, rebuilt: bool) -> None:
        """Write seg's .idx in place; seg.fd must be open."""
        if rebuilt:
            log.warning("journal.index_rebuilt path=%s records=%d", seg.path, len(positions))
        os.fdatasync(seg.fd)  # an .idx in place asserts that the segment's bytes are durable
        write_file_atomically(self._dir / index_name(seg.first), positions.tobytes())

    def _load_index(self, seg: _Segment) -> array[int]:
        path = self._dir / index_name(seg.first)
        with open(path, "rb") as f:
            raw = f.read(seg.count * _POS_BYTES)
        if len(raw) != seg.count * _POS_BYTES:
            raise CorruptJournalError(str(path), len(raw), "position index too short")
        positions = array("Q")
        positions.frombytes(raw)
        return positions

    def _load_terms_bytes(self) -> bytes | None:
        try:
            with open(self._dir / _TERMS_FILE, "rb") as f:
                return f.read(_MAX_TERMS_FILE_BYTES + 1)
        except FileNotFoundError:
            return None

    def _trusted_runs(
        self,
        trusted: list[_Segment],
        trusted_end: int,
        first_terms: dict[int, int],
        last_terms: dict[int, int],
    ) -> list[tuple[int, int]]:
        """Term runs below trusted_end: from the terms file if it agrees with every trusted
        segment's first and last record, else rebuilt by scanning those segments.

        Why a file and not a scan: a header read per record of every sealed segment would make
        opening a 10 GB journal take minutes. The file is tiny and is fsynced before the first
        record of a new run is written, so it names every run that can be on disk; runs it names
        beyond trusted_end (a crash before a truncation was recorded) are ignored, and the tail is
        rescanned anyway.
        """
        if not trusted:
            return []
        data = self._load_terms_bytes()
        stored = _decode_runs(data) if data is not None else None
        if stored is not None:
            runs = [r for r in stored if r[0] < trusted_end]
            starts = [s for s, _ in runs]

            def term_of(index: int) -> int | None:
                k = bisect.bisect_right(starts, index) - 1
                return runs[k][1] if k >= 0 else None

            if all(
                term_of(seg.first) == first_terms[seg.first]
                and term_of(seg.first + seg.count - 1) == last_terms[seg.first]
                for seg in trusted
            ):
                return runs
        log.warning("journal.terms_rebuilt dir=%s reason=terms file missing or stale", self._dir)
        runs = []
        for seg in trusted:
            with self._opened(seg):
                scan = self._scan(seg, min_term=runs[-1][1] if runs else 0, max_count=seg.count)
            if scan.problem is not None:
                raise CorruptJournalError(str(seg.path), scan.end, scan.problem)
            for start, term in scan.runs:
                if not runs or runs[-1][1] != term:
                    runs.append((start, term))
        return runs

    def _scan(self, seg: _Segment, *, min_term: int, max_count: int | None) -> _Scan:
        """Read seg sequentially, checking every record, until the first bad one or max_count.

        A good first record whose index disagrees with the file name is not a torn write but a
        misplaced file: that raises instead of being cut.
        """
        out = _Scan(last_term=min_term)
        fd, size = seg.fd, seg.size
        buf = b""
        buf_at = 0  # file offset of buf[0]
        off = 0
        expected = seg.first
        while off < size:
            if max_count is not None and out.count >= max_count:
                out.problem = f"bytes after record {expected - 1}, the segment's last"
                break
            if size - off < HEADER_BYTES:
                out.problem = "incomplete header"
                break
            if off + HEADER_BYTES > buf_at + len(buf):
                buf = os.pread(fd, _SCAN_CHUNK_BYTES, off)
                buf_at = off
            crc, n, index, term = _HEADER.unpack_from(buf, off - buf_at)
            if n > self._max_record_bytes:
                if off + HEADER_BYTES + n <= size and self._crc_matches(fd, off, n, crc):
                    # A whole, valid record: the limit was lowered, this is no torn write.
                    raise CorruptJournalError(
                        str(seg.path),
                        off,
                        f"record {index} holds {n} bytes, above max_record_bytes="
                        f"{self._max_record_bytes}; open with the limit it was written with",
                    )
                out.problem = f"length field {n} exceeds max_record_bytes"
                break
            rec_end = off + HEADER_BYTES + n
            if rec_end > size:
                out.problem = "record extends past the end of the file"
                break
            if rec_end > buf_at + len(buf):
                buf = os.pread(fd, max(_SCAN_CHUNK_BYTES, rec_end - off), off)
                buf_at = off
            view = memoryview(buf)
            start = off - buf_at
            body = view[start + _CRC.size : start + HEADER_BYTES + n]
            if zlib.crc32(body) != crc:
                out.problem = "crc mismatch"
                break
            if index != expected:
                if off == 0:
                    raise CorruptJournalError(
                        str(seg.path), 0, f"segment named {seg.first} starts with record {index}"
                    )
                out.problem = f"record holds index {index}, expected {expected}"
                break
            if term < out.last_term:
                raise CorruptJournalError(
                    str(seg.path), off, f"term {term} after term {out.last_term}: terms decrease"
                )
            if not out.runs or out.runs[-1][1] != term:
                out.runs.append((index, term))
            out.last_term = term
            out.positions.append(off)
            off = rec_end
            expected += 1
        out.end = off
        return out

    @staticmethod
    def _crc_matches(fd: int, off: int, n: int, crc: int) -> bool:
        """Check a record's crc in bounded chunks, for a length too large to read in one go."""
        value = zlib.crc32(os.pread(fd, HEADER_BYTES - _CRC.size, off + _CRC.size))
        pos, end = off + HEADER_BYTES, off + HEADER_BYTES + n
        while pos < end:
            chunk = os.pread(fd, min(_SCAN_CHUNK_BYTES, end - pos), pos)
            if not chunk:
                return False
            value = zlib.crc32(chunk, value)
            pos += len(chunk)
        return value == crc
