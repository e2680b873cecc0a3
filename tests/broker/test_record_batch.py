"""The record batch codec: round trips, one encoding per value, and malformed bytes refused with
MalformedBatchError only."""

from __future__ import annotations

import contextlib
import os
import time

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from raftmq.common.message import Message
from raftmq.common.record_batch import (
    BrokerRecord,
    CommitOffset,
    MalformedBatchError,
    ProduceBatch,
    ProducerSequence,
    ResetOffsets,
    TopicConfigChange,
    TopicOp,
    decode,
    decode_message_at,
    decode_produce_header,
    decode_with_offsets,
    encode,
    is_produce_v1,
    scan_produce,
)
from raftmq.common.topic_config import Permission, TopicConfig

text = st.text(max_size=20)  # any unicode except lone surrogates (which utf-8 cannot carry)
u32 = st.integers(0, (1 << 32) - 1)
u64 = st.integers(0, (1 << 64) - 1)


@st.composite
def produce_batches(draw: st.DrawFn) -> ProduceBatch:
    topic = draw(text)
    messages = draw(
        st.lists(
            st.builds(
                Message,
                topic=st.just(topic),
                body=st.binary(max_size=64),
                tags=st.none() | text,
                keys=st.lists(text, max_size=3).map(tuple),
                properties=st.dictionaries(text, text, max_size=4),
                flag=st.integers(-(1 << 31), (1 << 31) - 1),
                born_timestamp_ms=st.integers(-(1 << 63), (1 << 63) - 1),
                born_host=text,
            ),
            min_size=1,
            max_size=8,
        )
    )
    producer = draw(st.none() | st.builds(ProducerSequence, text, u64))
    return ProduceBatch(topic, draw(u32), draw(u64), tuple(messages), producer)


topic_configs = st.builds(
    TopicConfig,
    name=text,
    read_queue_nums=st.integers(0, 0xFFFF),
    write_queue_nums=st.integers(0, 0xFFFF),
    perm=st.integers(0, 7).map(Permission),
    ordered=st.booleans(),
    auto_created=st.booleans(),
)

records: st.SearchStrategy[BrokerRecord] = st.one_of(
    produce_batches(),
    st.builds(CommitOffset, text, text, u32, u64),
    st.builds(ResetOffsets, text, text, st.dictionaries(u32, u64, max_size=6)),
    st.builds(TopicConfigChange, st.sampled_from(TopicOp), topic_configs),
)


@given(records)
def test_round_trip(record: BrokerRecord) -> None:
    data = encode(record)
    assert data[1] == 1  # version byte
    assert decode(data) == record
    assert decode(memoryview(data)) == record


@given(records, st.data())
def test_truncation_and_trailing_bytes_are_refused(
    record: BrokerRecord, data: st.DataObject
) -> None:
    raw = encode(record)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(MalformedBatchError):
        decode(raw[:cut])
    with pytest.raises(MalformedBatchError):
        decode(raw + data.draw(st.binary(min_size=1, max_size=8)))


def _decode_or_malformed(raw: bytes) -> None:
    try:
        value = decode(raw)
    except MalformedBatchError:
        return
    # whatever decodes has exactly one encoding: the bytes it came from
    assert encode(value) == raw


@given(records, st.data())
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_corruption_never_raises_anything_else(record: BrokerRecord, data: st.DataObject) -> None:
    raw = bytearray(encode(record))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    _decode_or_malformed(bytes(raw))


@given(st.binary(max_size=200))
@example(b"")
@example(b"\x01")
@example(b"\x01\x02")
@example(b"\x01\x01")
@example(b"\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\xff\xff\xff\xff")
@example(b"\x03\x01\x00\x00\x00\x00\xff\xff\xff\x0f")
@example(b"\x04\x01\x09")
def test_random_bytes_never_raise_anything_else(raw: bytes) -> None:
    _decode_or_malformed(raw)


@given(st.binary(max_size=200))
def test_random_produce_bodies(tail: bytes) -> None:
    _decode_or_malformed(b"\x01\x01" + tail)


def test_invalid_utf8_is_malformed() -> None:
    raw = bytearray(encode(CommitOffset("g", "t", 0, 1)))
    raw[4] = 0xFF  # the group's only byte
    with pytest.raises(MalformedBatchError, match="utf-8"):
        decode(bytes(raw))


def test_unknown_kind_and_version() -> None:
    with pytest.raises(MalformedBatchError, match="kind"):
        decode(b"\x09\x01")
    with pytest.raises(MalformedBatchError, match="version"):
        decode(b"\x01\x07" + b"\0" * 30)


def test_encoder_refuses_what_the_format_cannot_carry() -> None:
    m = Message("t", b"x")
    with pytest.raises(ValueError, match="at least one"):
        encode(ProduceBatch("t", 0, 0, ()))
    with pytest.raises(ValueError, match="topic"):
        encode(ProduceBatch("u", 0, 0, (m,)))
    with pytest.raises(ValueError):
        encode(ProduceBatch("t", 1 << 32, 0, (m,)))
    with pytest.raises(ValueError):
        encode(ProduceBatch("t", 0, -1, (m,)))
    with pytest.raises(ValueError):
        encode(CommitOffset("g", "t", 0, -1))
    with pytest.raises(ValueError):
        encode(ProduceBatch("t", 0, 0, (Message("t", b"x", tags="x" * 70_000),)))


def _thousand_messages() -> ProduceBatch:
    messages = tuple(
        Message(
            "Orders",
            os.urandom(1024),
            "TagA",
            (f"order-{i}",),
            {"region": "eu"},
            0,
            1_700_000_000_000,
            "10.0.0.7:40112",
        )
        for i in range(1000)
    )
    return ProduceBatch("Orders", 3, 1_700_000_000_001, messages, ProducerSequence("p-1", 0))


def test_speed_smoke() -> None:
    """A loose regression guard; tests/broker/bench_record_batch.py measures."""
    batch = _thousand_messages()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        assert decode(encode(batch)) == batch
        best = min(best, time.perf_counter() - t0)
    assert best < 0.1, f"1000 x 1 KiB encode+decode took {best * 1e3:.1f} ms"


@given(produce_batches())
def test_each_message_decodes_alone_from_its_offset(batch: ProduceBatch) -> None:
    raw = encode(batch)
    record, offsets = decode_with_offsets(raw)
    assert record == batch and len(offsets) == len(batch.messages)
    header = decode_produce_header(raw)
    assert (header.topic, header.queue_id, header.count) == (
        batch.topic,
        batch.queue_id,
        len(batch.messages),
    )
    for at, m in zip(offsets, batch.messages, strict=True):
        assert decode_message_at(raw, header, at) == m


@given(produce_batches(), st.integers(-5, 5_000))
def test_any_offset_gives_a_message_or_malformed(batch: ProduceBatch, at: int) -> None:
    raw = encode(batch)
    header = decode_produce_header(raw)
    with contextlib.suppress(MalformedBatchError):  # anything else fails the test
        decode_message_at(raw, header, at)


def test_non_produce_records_have_no_offsets() -> None:
    assert decode_with_offsets(encode(CommitOffset("g", "t", 1, 2))) == (
        CommitOffset("g", "t", 1, 2),
        (),
    )
    with pytest.raises(MalformedBatchError):
        decode_produce_header(encode(CommitOffset("g", "t", 1, 2)))


def test_a_strict_sequence_survives_the_round_trip_and_needs_a_producer() -> None:
    msg = Message("T", b"x", None, (), {}, 0, 1, "h:1")
    for strict in (False, True):
        data = encode(ProduceBatch("T", 0, 5, (msg,), ProducerSequence("p", 7, strict)))
        record = decode(data)
        assert isinstance(record, ProduceBatch) and record.producer == ProducerSequence(
            "p", 7, strict
        )
    plain = bytearray(encode(ProduceBatch("T", 0, 5, (msg,))))
    plain[2] |= 0x04  # the strict flag on a batch without a producer
    with pytest.raises(MalformedBatchError, match="unknown flags"):
        decode(bytes(plain))


def _scan_or_error(raw: bytes) -> object:
    try:
        scan = scan_produce(raw)
    except MalformedBatchError:
        return MalformedBatchError
    return scan


def _full_or_error(raw: bytes) -> object:
    try:
        return decode_with_offsets(raw)
    except MalformedBatchError:
        return MalformedBatchError


@given(produce_batches())
def test_the_dispatchers_scan_gives_the_decoders_columns(batch: ProduceBatch) -> None:
    # The dispatcher indexes from scan_produce (no Message objects); readers decode in full.
    raw = encode(batch)
    assert is_produce_v1(raw)
    scan = scan_produce(raw)
    record, offsets = decode_with_offsets(raw)
    assert isinstance(record, ProduceBatch)
    assert scan.header == decode_produce_header(raw)
    assert scan.offsets == offsets
    assert scan.body_sizes == tuple(len(m.body) for m in record.messages)
    assert scan.tags == tuple(m.tags for m in record.messages)
    if any(m.keys for m in record.messages):
        assert scan.keys == tuple(m.keys for m in record.messages)
    else:
        assert scan.keys == ()


@given(produce_batches(), st.data())
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_the_scan_refuses_exactly_what_the_decoder_refuses(
    batch: ProduceBatch, data: st.DataObject
) -> None:
    # Every replica must store or skip a chunk alike, whichever reader looked at it: a chunk
    # the scan accepts and a consumer cannot decode would be served as poison.
    raw = bytearray(encode(batch))
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(2, len(raw) - 1))  # kind and version stay a v1 produce
        raw[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(2, len(raw)))
    chunk = bytes(raw[:cut]) + data.draw(st.binary(max_size=3))
    scanned, full = _scan_or_error(chunk), _full_or_error(chunk)
    assert (scanned is MalformedBatchError) == (full is MalformedBatchError)


def test_the_scan_refuses_a_property_given_twice_and_bad_utf8_in_a_value() -> None:
    good = encode(ProduceBatch("t", 0, 1, (Message("t", b"b", properties={"a": "x"}),)))
    m = Message("t", b"body", properties={"ab": "cd", "ef": "gh"})
    raw = encode(ProduceBatch("t", 0, 1, (m,)))
    dup = raw.replace(b"ef", b"ab")
    assert _full_or_error(dup) is MalformedBatchError
    assert _scan_or_error(dup) is MalformedBatchError
    bad_value = raw.replace(b"gh", b"\xff\xfe")
    assert _full_or_error(bad_value) is MalformedBatchError
    assert _scan_or_error(bad_value) is MalformedBatchError
    assert _scan_or_error(good) is not MalformedBatchError
