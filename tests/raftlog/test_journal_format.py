"""Record framing on bytes: what is written reads back, and every damaged byte is refused."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftmq.raftlog.errors import CorruptJournalError
from raftmq.raftlog.journal.format import (
    HEADER,
    HEADER_BYTES,
    body_crc,
    decode_record,
    encode_header,
    encode_record,
)
from raftmq.raftlog.journal.term_runs import decode_runs, encode_runs, runs_from
from raftmq.raftlog.record import Record

MAX = 1 << 20


def decode(data: bytes, index: int, start: int = 0, end: int | None = None) -> Record:
    end = len(data) if end is None else end
    return decode_record(
        data, start, end, index, max_record_bytes=MAX, path="seg", file_offset=start
    )


def test_layout_is_crc_length_index_term_then_command() -> None:
    data = encode_record(7, 3, b"hello")
    assert len(data) == HEADER_BYTES + 5 == 29
    crc, n, index, term = HEADER.unpack_from(data)
    assert (n, index, term) == (5, 7, 3)
    assert data[HEADER_BYTES:] == b"hello"
    # The crc covers the header after the crc field, then the command.
    assert crc == zlib.crc32(data[4:]) == zlib.crc32(b"hello", zlib.crc32(data[4:HEADER_BYTES]))
    assert body_crc(data, 0, len(data)) == crc
    assert encode_header(7, 3, b"hello") == data[:HEADER_BYTES]
    # Little-endian, fixed: a known record's bytes never change across versions.
    assert data[4:HEADER_BYTES] == struct.pack("<IQQ", 5, 7, 3)


@given(index=st.integers(1, 2**63), term=st.integers(0, 2**63), command=st.binary(max_size=2000))
def test_write_then_read_back(index: int, term: int, command: bytes) -> None:
    assert decode(encode_record(index, term, command), index) == Record(index, term, command)


def test_read_back_from_the_middle_of_a_buffer() -> None:
    a, b = encode_record(1, 1, b"a" * 10), encode_record(2, 1, b"bb")
    data = a + b
    assert decode(data, 2, len(a), len(data)) == Record(2, 1, b"bb")
    assert decode(data, 1, 0, len(a)) == Record(1, 1, b"a" * 10)


@given(data=st.data())
def test_every_flipped_byte_is_refused(data: st.DataObject) -> None:
    rec = bytearray(encode_record(5, 2, b"payload bytes"))
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
