"""Record framing of the journal: header, CRC, encode and checked decode, on bytes only (sans-I/O).

A record is a header '<IIQQ' (crc, length field, index, term) and the command; the crc covers
the header after the crc field, then the command. The length field is the command's length, its
bit 31 the CRC's kind: set, the crc is CRC-32C (Castagnoli, the CPU's CRC instruction through the
crc32c package), what every record is written with; clear, zlib's CRC-32, what records written
before carry (the command length was always far below 2**31, so the bit was always clear). Each
record says which CRC it carries, so a journal of old records, or one mixing old segments with
new appends, reads and recovers like any other. `unpack_header` is the one reader of the length
field and the one place that picks the CRC. The index in every header lets a reader prove that a
position led it to the record it asked for. Decoding never returns bytes that failed a check.
"""

from __future__ import annotations

import struct
import zlib
from typing import Protocol

from crc32c import crc32c

from raftmq.raftlog.errors import CorruptJournalError
from raftmq.raftlog.record import Record

HEADER = struct.Struct("<IIQQ")  # crc, length field, index, term
TAIL = struct.Struct("<IQQ")  # the header after the crc field: what the crc covers first
CRC = struct.Struct("<I")
HEADER_BYTES = HEADER.size
CRC_BYTES = CRC.size
CRC32C_FLAG = 1 << 31  # in the length field: the record's crc is CRC-32C, not zlib's CRC-32
MAX_COMMAND_BYTES = CRC32C_FLAG - 1  # the largest command a length field can hold


class CrcFunction(Protocol):
    """zlib.crc32 or crc32c.crc32c: the crc of `data`, continuing from `value`."""

    def __call__(self, data: bytes | memoryview, value: int = 0, /) -> int: ...


def unpack_header(data: bytes | memoryview, offset: int) -> tuple[int, int, int, int, CrcFunction]:
    """(crc, command length, index, term, the CRC function the record was written with) of the
    header at data[offset:]. Every reader of a header goes through here."""
    crc, field, index, term = HEADER.unpack_from(data, offset)
    if field & CRC32C_FLAG:
        return crc, field ^ CRC32C_FLAG, index, term, crc32c
    return crc, field, index, term, zlib.crc32


def encode_header(index: int, term: int, command: bytes) -> bytes:
    """The header that precedes `command` on disk (the writer sends both with one pwritev)."""
    n = len(command)
    if n > MAX_COMMAND_BYTES:
        raise ValueError(f"a command of {n} bytes does not fit a record's length field")
    tail = TAIL.pack(n | CRC32C_FLAG, index, term)
    return CRC.pack(crc32c(command, crc32c(tail))) + tail


def encode_record(index: int, term: int, command: bytes) -> bytes:
    """Header and command as one value: what decode_record reads back."""
    return encode_header(index, term, command) + command


def body_crc(data: bytes | memoryview, start: int, end: int, crc_of: CrcFunction) -> int:
    """The crc of the record occupying data[start:end] as computed over its bytes with `crc_of`,
    the function its header names (compare it with the header's crc field)."""
    return crc_of(memoryview(data)[start + CRC_BYTES : end])


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
    crc, n, found, term, crc_of = unpack_header(data, start)
    if n > max_record_bytes:
        raise CorruptJournalError(path, file_offset, f"length field {n} exceeds max_record_bytes")
    if n != end - start - HEADER_BYTES:
        raise CorruptJournalError(
            path,
            file_offset,
            f"length field {n} disagrees with the record span {end - start - HEADER_BYTES}",
        )
    if body_crc(data, start, end, crc_of) != crc:
        raise CorruptJournalError(path, file_offset, "crc mismatch")
    if found != index:
        raise CorruptJournalError(
            path, file_offset, f"record holds index {found}, expected {index}"
        )
    return Record(index, term, data[start + HEADER_BYTES : end])
