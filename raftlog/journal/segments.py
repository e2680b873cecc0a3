"""Segment files and their position indexes: names, the per-file object, and single-record reads.

The directory:
  <first:020d>.seg          records [first, next segment's first); the last file is the active one
  <first:020d>.idx          little-endian u64 byte position of each record of a sealed segment;
                            renamed into place by the first sync() after the segment was sealed,
                            once its bytes are fsynced: an .idx exists only for durable segments
  <first:020d>.idx.pending  the same for a segment sealed since the last sync
  terms                     the term runs (term_runs.py)
Never clobbers an existing segment file; never mmaps.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from raftmq.raftlog.errors import CorruptJournalError
from raftmq.raftlog.journal.format import HEADER_BYTES, decode_record
from raftmq.raftlog.record import Record

POS = struct.Struct("<Q")
POS2 = struct.Struct("<QQ")
POS_BYTES = POS.size

SEG_RE = re.compile(r"^(\d{20})\.seg$")
IDX_RE = re.compile(r"^(\d{20})\.idx$")
PENDING_RE = re.compile(r"^(\d{20})\.idx\.pending$")
# Bounds the active segment's in-memory positions (8 bytes each) when records are tiny.
MAX_SEGMENT_RECORDS = 1 << 20


def segment_name(first_index: int) -> str:
    return f"{first_index:020d}.seg"


def index_name(first_index: int) -> str:
    return f"{first_index:020d}.idx"


def pending_index_name(first_index: int) -> str:
    return f"{first_index:020d}.idx.pending"


@dataclass(slots=True, eq=False)
class Segment:
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


def create_segment(directory: Path, first: int) -> Segment:
    path = directory / segment_name(first)
    # O_EXCL: an existing file of that name would be someone's records; never clobber it.
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    return Segment(first, path, fd=fd)


def close_fds(seg: Segment) -> None:
    for fd in (seg.fd, seg.idx_fd):
        if fd >= 0:
            os.close(fd)
    seg.fd = seg.idx_fd = -1


def unlink_index_files(directory: Path, first: int) -> None:
    (directory / index_name(first)).unlink(missing_ok=True)
    (directory / pending_index_name(first)).unlink(missing_ok=True)


def unlink_segment_files(directory: Path, seg: Segment) -> None:
    unlink_index_files(directory, seg.first)
    seg.path.unlink(missing_ok=True)


def write_fully(fd: int, data: bytes, done: int, offset: int) -> None:
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


def span_from_index_file(seg: Segment, index: int) -> tuple[int, int]:
    """The byte span [pos, end) of the record at index, from a sealed segment's open .idx."""
    k = index - seg.first
    if k + 1 < seg.count:
        raw = os.pread(seg.idx_fd, 2 * POS_BYTES, k * POS_BYTES)
        if len(raw) == 2 * POS_BYTES:
            pos, end = POS2.unpack(raw)
            return int(pos), int(end)
    else:
        raw = os.pread(seg.idx_fd, POS_BYTES, k * POS_BYTES)
        if len(raw) == POS_BYTES:
            return int(POS.unpack(raw)[0]), seg.size
    raise CorruptJournalError(
        str(seg.idx_path), k * POS_BYTES, "position index is shorter than its segment"
    )


def check_span(seg: Segment, pos: int, end: int, max_record_bytes: int) -> None:
    size = end - pos
    if not HEADER_BYTES <= size <= HEADER_BYTES + max_record_bytes or end > seg.size:
        raise CorruptJournalError(
            str(seg.path), pos, f"position index gives a record span of [{pos}, {end})"
        )


def read_record(seg: Segment, index: int, pos: int, end: int, max_record_bytes: int) -> Record:
    """One checked record from seg's open fd."""
    check_span(seg, pos, end, max_record_bytes)
    data = os.pread(seg.fd, end - pos, pos)
    return decode_record(
        data,
        0,
        len(data),
        index,
        max_record_bytes=max_record_bytes,
        path=str(seg.path),
        file_offset=pos,
    )
