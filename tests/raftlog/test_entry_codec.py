"""The data-entry layout: round trips, and malformed commands are refused, never misread."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftmq.raftlog import entry_codec
from raftmq.raftlog.entry_codec import MalformedEntryError, decode_data, encode_data, encoded_size


@given(st.lists(st.binary(max_size=300), min_size=1, max_size=40))
def test_round_trip(chunks: list[bytes]) -> None:
    command = encode_data(chunks)
    assert len(command) == encoded_size([len(c) for c in chunks])
    assert entry_codec.is_data(command)
    assert decode_data(command) == tuple(chunks)


def test_pysyncobj_commands_carry_no_chunks() -> None:
    for kind in range(4):  # REGULAR, NO_OP, MEMBERSHIP, VERSION
        assert decode_data(bytes([kind]) + b"payload") == ()
    assert decode_data(b"") == ()


def test_empty_entry_refused() -> None:
    with pytest.raises(ValueError):
        encode_data([])


@given(st.lists(st.binary(max_size=50), min_size=1, max_size=8), st.data())
def test_any_corruption_of_lengths_is_detected(chunks: list[bytes], data: st.DataObject) -> None:
    command = bytearray(encode_data(chunks))
    cut = data.draw(st.integers(min_value=1, max_value=len(command) - 1))
    # a truncated command or one with extra bytes never decodes into different chunks
    for bad in (bytes(command[:cut]), bytes(command) + b"x"):
        with pytest.raises(MalformedEntryError):
            decode_data(bad)


@given(st.binary(max_size=300), st.data())
def test_a_one_chunk_entry_decodes_alike_from_any_buffer(chunk: bytes, data: st.DataObject) -> None:
    """decode_data's one-chunk path (a synchronous sender's every entry) checks the length as
    the general one does and returns bytes whatever buffer it was given."""
    command = encode_data([chunk])
    for buf in (command, bytearray(command), memoryview(command)):
        got = decode_data(buf)  # type: ignore[arg-type]  # other buffers, as callers pass
        assert got == (chunk,) and type(got[0]) is bytes
    cut = data.draw(st.integers(min_value=1, max_value=len(command) - 1))
    for bad in (command[:cut], command + b"x"):
        with pytest.raises(MalformedEntryError):
            decode_data(bad)
