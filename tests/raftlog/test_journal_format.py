"""Record framing on bytes: what is written reads back, and every damaged byte is refused."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable

import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

from raftmq.raftlog.errors import CorruptJournalError
from raftmq.raftlog.journal.format import (
    CRC32C_FLAG,
    HEADER,
    HEADER_BYTES,
    body_crc,
    decode_record,
    encode_header,
    encode_record,
    unpack_header,
)
from raftmq.raftlog.journal.term_runs import decode_runs, encode_runs, runs_from
from raftmq.raftlog.record import Record

MAX = 1 << 20


def encode_old_record(index: int, term: int, command: bytes) -> bytes:
    """A record as the journal wrote it before CRC-32C: zlib's CRC-32, no flag in the length."""
    tail = struct.pack("<IQQ", len(command), index, term)
    return struct.pack("<I", zlib.crc32(command, zlib.crc32(tail))) + tail + command


def encode_mislabelled(index: int, term: int, command: bytes, *, flag: bool) -> bytes:
    """A record whose length field names one CRC while its crc field holds the other's."""
    tail = struct.pack("<IQQ", len(command) | (CRC32C_FLAG if flag else 0), index, term)
    crc = zlib.crc32(command, zlib.crc32(tail)) if flag else crc32c(command, crc32c(tail))
    return struct.pack("<I", crc) + tail + command


# Both kinds of record a journal may hold: the one written today and the one written before.
ENCODERS: dict[str, Callable[[int, int, bytes], bytes]] = {
    "crc32c": encode_record,
    "zlib": encode_old_record,
}
kinds = pytest.mark.parametrize("encode", list(ENCODERS.values()), ids=list(ENCODERS))


def decode(data: bytes, index: int, start: int = 0, end: int | None = None) -> Record:
    end = len(data) if end is None else end
    return decode_record(
        data, start, end, index, max_record_bytes=MAX, path="seg", file_offset=start
    )


def test_layout_is_crc_length_index_term_then_command() -> None:
    data = encode_record(7, 3, b"hello")
    assert len(data) == HEADER_BYTES + 5 == 29
    crc, field, index, term = HEADER.unpack_from(data)
    # The length field is the command's length with bit 31 set: the crc is CRC-32C.
    assert (field, index, term) == (5 | 1 << 31, 7, 3)
    assert unpack_header(data, 0) == (crc, 5, 7, 3, crc32c)
    assert data[HEADER_BYTES:] == b"hello"
    # The crc covers the header after the crc field, then the command.
    assert crc == crc32c(data[4:]) == crc32c(b"hello", crc32c(data[4:HEADER_BYTES]))
    assert body_crc(data, 0, len(data), crc32c) == crc
    assert encode_header(7, 3, b"hello") == data[:HEADER_BYTES]
    # Little-endian, fixed: a known record's bytes never change across versions.
    assert data[4:HEADER_BYTES] == struct.pack("<IQQ", 5 | 1 << 31, 7, 3)
    assert crc32c(b"123456789") == 0xE3069283  # the Castagnoli check value
    # crc, length 5 | bit 31, index 7, term 3, b"hello"
    assert data.hex() == "b2ab67a2" + "05000080" + "07" + "00" * 7 + "03" + "00" * 7 + "68656c6c6f"


def test_a_record_written_before_crc32c_reads_back() -> None:
    """Records written before carry zlib's CRC-32 and a bare length: still read, still checked."""
    data = encode_old_record(7, 3, b"hello")
    crc, field, index, term = HEADER.unpack_from(data)
    assert (field, index, term) == (5, 7, 3)
    assert crc == zlib.crc32(data[4:])
    assert unpack_header(data, 0) == (crc, 5, 7, 3, zlib.crc32)
    assert body_crc(data, 0, len(data), zlib.crc32) == crc
    assert decode(data, 7) == Record(7, 3, b"hello")


@kinds
@given(index=st.integers(1, 2**63), term=st.integers(0, 2**63), command=st.binary(max_size=2000))
def test_write_then_read_back(
    encode: Callable[[int, int, bytes], bytes], index: int, term: int, command: bytes
) -> None:
    assert decode(encode(index, term, command), index) == Record(index, term, command)


def test_read_back_from_the_middle_of_a_buffer() -> None:
    a, b = encode_record(1, 1, b"a" * 10), encode_record(2, 1, b"bb")
    c = encode_old_record(3, 1, b"ccc")  # a journal upgraded in place mixes both kinds
    data = c + a + b
    assert decode(data, 2, len(c + a), len(data)) == Record(2, 1, b"bb")
    assert decode(data, 1, len(c), len(c + a)) == Record(1, 1, b"a" * 10)
    assert decode(data, 3, 0, len(c)) == Record(3, 1, b"ccc")


@kinds
@given(data=st.data())
def test_every_flipped_byte_is_refused(
    encode: Callable[[int, int, bytes], bytes], data: st.DataObject
) -> None:
    rec = bytearray(encode(5, 2, b"payload bytes"))
    pos = data.draw(st.integers(0, len(rec) - 1))
    rec[pos] ^= data.draw(st.integers(1, 255))
    with pytest.raises(CorruptJournalError):
        decode(bytes(rec), 5)


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda r: r[:-1], "disagrees with the record span"),
        (lambda r: r[: HEADER_BYTES - 1], "record truncated"),
        (lambda r: r + b"x", "disagrees with the record span"),
        (lambda r: r[:8] + struct.pack("<Q", 6) + r[16:], "crc mismatch"),
    ],
    ids=["short", "no header", "long", "index changed"],
)
def test_damage_is_named(mutate: object, reason: str) -> None:
    rec = encode_record(5, 2, b"payload")
    with pytest.raises(CorruptJournalError, match=reason):
        decode(mutate(rec), 5)  # type: ignore[operator]


@pytest.mark.parametrize("flag", [True, False], ids=["crc32c flag, zlib crc", "no flag, crc32c"])
def test_a_crc_of_the_other_kind_is_refused(flag: bool) -> None:
    """The flag names the CRC to check: a record whose crc is the other kind's is corrupt."""
    data = encode_mislabelled(5, 2, b"payload", flag=flag)
    assert HEADER.unpack_from(data)[1] == 7 | (CRC32C_FLAG if flag else 0)
    with pytest.raises(CorruptJournalError, match="crc mismatch"):
        decode(data, 5)


def test_a_whole_record_at_the_wrong_index_is_refused() -> None:
    with pytest.raises(CorruptJournalError, match="record holds index 5, expected 6"):
        decode(encode_record(5, 2, b"x"), 6)


def test_length_over_the_limit_is_refused() -> None:
    data = encode_record(1, 1, b"z" * 100)
    with pytest.raises(CorruptJournalError, match="exceeds max_record_bytes"):
        decode_record(data, 0, len(data), 1, max_record_bytes=99, path="p", file_offset=0)


def test_term_runs_round_trip_and_damage() -> None:
    data = encode_runs([1, 5, 9], [1, 2, 7])
    assert decode_runs(data) == [(1, 1), (5, 2), (9, 7)]
    assert decode_runs(encode_runs([], [])) == []
    for pos in range(len(data)):
        bad = bytearray(data)
        bad[pos] ^= 0x40
        assert decode_runs(bytes(bad)) is None
    assert decode_runs(data[:-1]) is None
    assert decode_runs(encode_runs([1, 5], [2, 2])) is None  # terms must increase
    assert runs_from([(1, 1), (5, 2), (9, 7)], 6) == [(5, 2), (9, 7)]
    assert runs_from([(1, 1), (5, 2)], 1) == [(1, 1), (5, 2)]
