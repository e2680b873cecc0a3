"""Record framing of the journal: header, CRC, encode and checked decode, on bytes only (sans-I/O).

A record is a header '<IIQQ' (crc32, command length, index, term) and the command; the crc covers
the header after the crc field, then the command. The index in every header lets a reader prove
that a position led it to the record it asked for. Decoding never returns bytes that failed a check.
"""

from __future__ import annotations

import struct
import zlib

from raftmq.raftlog.errors import CorruptJournalError
from raftmq.raftlog.record import Record

HEADER = struct.Struct("<IIQQ")  # crc32, command length, index, term
TAIL = struct.Struct("<IQQ")  # the header after the crc field: what the crc covers first
CRC = struct.Struct("<I")
HEADER_BYTES = HEADER.size
CRC_BYTES = CRC.size


def encode_header(index: int, term: int, command: bytes) -> bytes:
    """The header that precedes `command` on disk (the writer sends both with one pwritev)."""
    tail = TAIL.pack(len(command), index, term)
    return CRC.pack(zlib.crc32(command, zlib.crc32(tail))) + tail


def encode_record(index: int, term: int, command: bytes) -> bytes:
    """Header and command as one value: what decode_record reads back."""
    return encode_header(index, term, command) + command


def body_crc(data: bytes | memoryview, start: int, end: int) -> int:
    """The crc of the record occupying data[start:end] as computed over its bytes (compare it
    with the header's crc field)."""
    return zlib.crc32(memoryview(data)[start + CRC_BYTES : end])


def decode_record(
    data: bytes,
    start: int,
    end: int,
    index: int,
    *,
    max_record_bytes: int,
    path: str,
    file_offset: int,
) -> Record:
    """Check and parse the record at `index` occupying data[start:end].

    `path` and `file_offset` only name the place in the CorruptJournalError raised for any failed
    check: truncation, a length field over the limit or disagreeing with the span, the crc, or a
    record holding another index.
    """
    if end > len(data) or end - start < HEADER_BYTES:
        raise CorruptJournalError(path, file_offset, "record truncated")
    crc, n, found, term = HEADER.unpack_from(data, start)
    if n > max_record_bytes:
        raise CorruptJournalError(path, file_offset, f"length field {n} exceeds max_record_bytes")
    if n != end - start - HEADER_BYTES:
        raise CorruptJournalError(
            path,
            file_offset,
            f"length field {n} disagrees with the record span {end - start - HEADER_BYTES}",
        )
    if body_crc(data, start, end) != crc:
        raise CorruptJournalError(path, file_offset, "crc mismatch")
    if found != index:
        raise CorruptJournalError(
            path, file_offset, f"record holds index {found}, expected {index}"
        )
    return Record(index, term, data[start + HEADER_BYTES : end])
