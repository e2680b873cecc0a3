"""The v2 stored batch: round trips, every corruption and truncation refused with
MalformedBatchError only, stamping, slicing and tag hashes."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from raftmq.common.filter.tag import tag_hash
from raftmq.common.message import Message
from raftmq.common.record_batch import MalformedBatchError, ProducerSequence
from raftmq.common.stored_batch import (
    FIXED_HEADER_BYTES,
    NO_TAG,
    RECORD_HEAD_BYTES,
    BatchHeader,
    BatchLimits,
    batch_count,
    check_batch,
    encode_batch,
    iter_messages,
    iter_records,
    message_offsets,
    read_header,
    slice_from,
    stamp,
    tag_hashes,
    verify_stamped,
)

text = st.text(max_size=12)  # any unicode but lone surrogates (utf-8 cannot carry them)
u32 = st.integers(0, (1 << 32) - 1)
u64 = st.integers(0, (1 << 64) - 1)
i64 = st.integers(-(1 << 63), (1 << 63) - 1)
TOPIC = "Orders"


def messages(topic: str, host: str) -> st.SearchStrategy[list[Message]]:
    return st.lists(
        st.builds(
            Message,
            topic=st.just(topic),
            body=st.binary(max_size=48),
            tags=st.none() | text,
            keys=st.lists(text, max_size=3).map(tuple),
            properties=st.dictionaries(text, text, max_size=3),
            flag=st.integers(-(1 << 31), (1 << 31) - 1),
            born_timestamp_ms=i64,
            born_host=st.sampled_from(["", host]),
        ),
        min_size=1,
        max_size=6,
    )


@st.composite
def batches(draw: st.DrawFn) -> tuple[bytes, str, int, list[Message], ProducerSequence | None, str]:
    topic = draw(text)
    host = draw(text)
    msgs = draw(messages(topic, host))
    producer = draw(st.none() | st.builds(ProducerSequence, text.filter(bool), u64))
    queue_id = draw(u32)
    return (
        encode_batch(topic, queue_id, msgs, producer, host),
        topic,
        queue_id,
        msgs,
        producer,
        host,
    )


def full(m: Message, host: str) -> Message:
    return Message(m.topic, m.body, m.tags, m.keys, m.properties, m.flag, m.born_timestamp_ms, host)


def decode_all(buf: bytes | bytearray | memoryview, first: int = 0) -> list[tuple[int, Message]]:
    return [(m.queue_offset, m.message()) for m in iter_messages(buf, first)]


def fix_body_crc(buf: bytearray) -> None:
    struct.pack_into("<I", buf, 12, zlib.crc32(buf[32:]))


def small_batch() -> bytes:
    msgs = [
        Message(TOPIC, b"body-0", "TagA", ("k1",), {"p": "v"}, 1, 10),
        Message(TOPIC, b"", None),
        Message(TOPIC, "ü€𝄞".encode(), "", ("", "ключ"), {"": "", "名": "值"}, -1, -5),
    ]
    return encode_batch(TOPIC, 7, msgs, ProducerSequence("prod-1", 41), "10.0.0.7:4011")


# ---- round trips -------------------------------------------------------------------------------


@given(batches(), u64, i64)
def test_round_trip_before_and_after_stamping(
    b: tuple[bytes, str, int, list[Message], ProducerSequence | None, str],
    base: int,
    store_ms: int,
) -> None:
    raw, topic, queue_id, msgs, producer, host = b
    h = check_batch(raw)
    assert (h.topic, h.queue_id, h.count, h.producer, h.born_host) == (
        topic,
        queue_id,
        len(msgs),
        producer,
        host,
    )
    assert not h.stamped and h.base_offset == 0 and h.store_timestamp_ms == 0
    assert h.total_bytes == len(raw) and batch_count(raw) == len(msgs)
    want = [full(m, host) for m in msgs]
    assert decode_all(raw) == list(enumerate(want))
    assert decode_all(memoryview(raw)) == list(enumerate(want))

    buf = bytearray(raw)
    stamp(buf, base, store_ms)
    assert buf[32:] == raw[32:]  # stamping touches the stamp slots only
    s = verify_stamped(buf)
    assert s.stamped and (s.base_offset, s.store_timestamp_ms) == (base, store_ms)
    assert s.next_offset == base + len(msgs)
    got = list(iter_messages(buf))
    assert [m.queue_offset for m in got] == [base + i for i in range(len(msgs))]
    assert [m.message() for m in got] == want
    assert {m.store_timestamp_ms for m in got} == {store_ms}
    assert {(m.topic, m.queue_id, m.born_host) for m in got} == {(topic, queue_id, host)}


@given(batches())
def test_tag_hashes_are_the_per_message_function(
    b: tuple[bytes, str, int, list[Message], ProducerSequence | None, str],
) -> None:
    raw, *_, msgs, _producer, _host = b
    want = [tag_hash(m.tags) for m in msgs]
    assert tag_hashes(raw).tolist() == want
    assert tag_hashes(raw, check_batch(raw)).tobytes() == struct.pack(f"<{len(want)}Q", *want)
    assert [m.tag_hash for m in iter_messages(raw)] == want


@given(batches(), u64)
def test_slicing_equals_full_decode(
    b: tuple[bytes, str, int, list[Message], ProducerSequence | None, str], base: int
) -> None:
    buf = bytearray(b[0])
    stamp(buf, base, 1)
    h = verify_stamped(buf)
    everything = decode_all(buf)
    offsets = message_offsets(buf).tolist()
    assert offsets[0] == 0 and offsets == sorted(offsets)
    for k in range(h.count):
        records = slice_from(buf, k)
        assert records.nbytes == h.total_bytes - h.records_at - offsets[k]
        sliced = [(m.queue_offset, m.message()) for m in iter_records(records, h, k)]
        assert sliced == everything[k:]
        assert decode_all(buf, k) == everything[k:]
        assert [(m.queue_offset, m.message()) for m in iter_records(bytes(records), h, k)] == (
            everything[k:]
        )
    assert decode_all(buf, h.count) == []


def test_max_sizes() -> None:
    big = "€" * (0xFFFE // 3)  # 65 532 bytes
    m = Message(
        "t",
        b"\xff" * (4 << 20),
        "x" * 0xFFFE,
        ("k" * 0xFFFF, ""),
        {"n" * 0xFFFF: "v" * 100_000},
        (1 << 31) - 1,
        -(1 << 63),
    )
    raw = encode_batch("t", (1 << 32) - 1, [m], ProducerSequence("p", (1 << 64) - 1), big[:100])
    h = check_batch(raw, BatchLimits(max_batch_bytes=8 << 20))
    assert h.producer == ProducerSequence("p", (1 << 64) - 1)
    assert [x.message() for x in iter_messages(raw)] == [full(m, big[:100])]
    # the three header strings share the header's u16 length
    topic = "t" * (0xFFFF - FIXED_HEADER_BYTES - 7)
    raw = encode_batch(topic, 0, [Message(topic, b"x")])
    assert read_header(raw).topic == topic


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"messages": []}, "at least one message"),
        ({"messages": [Message("other", b"x")]}, "topic"),
        ({"messages": [Message(TOPIC, b"x", born_host="h2")]}, "born on"),
        ({"messages": [Message(TOPIC, b"x", "t" * 0xFFFF)]}, "tag of"),
        ({"messages": [Message(TOPIC, b"x", keys=("k" * 0x10000,))]}, "does not fit"),
        ({"messages": [Message(TOPIC, b"x", flag=1 << 31)]}, "does not fit"),
        ({"messages": [Message(TOPIC, b"x", born_timestamp_ms=1 << 63)]}, "does not fit"),
        ({"queue_id": -1}, "queue id"),
        ({"producer": ProducerSequence("", 0)}, "empty"),
        ({"producer": ProducerSequence("p", -1)}, "base sequence"),
        ({"born_host": "h" * 0xFFF0, "topic": "t" * 0x10}, "too long"),
    ],
)
def test_values_the_format_cannot_carry(kwargs: dict[str, object], error: str) -> None:
    args: dict[str, object] = {
        "topic": TOPIC,
        "queue_id": 0,
        "messages": [Message(TOPIC, b"x")],
        "born_host": "h",
    }
    args.update(kwargs)
    if "topic" in kwargs:
        args["messages"] = [Message(str(kwargs["topic"]), b"x")]
    with pytest.raises(ValueError, match=error):
        encode_batch(**args)  # type: ignore[arg-type]


# ---- corruption, truncation, garbage -----------------------------------------------------------


def test_every_single_byte_corruption_is_detected() -> None:
    raw = small_batch()
    stamped = bytearray(raw)
    stamp(stamped, 1000, 1_700_000_000_000)
    for i in range(len(raw)):
        for delta in (0x01, 0x80, 0xFF):
            bad = bytearray(raw)
            bad[i] ^= delta
            with pytest.raises(MalformedBatchError):
                check_batch(bad)
            bad = bytearray(stamped)
            bad[i] ^= delta
            with pytest.raises(MalformedBatchError):
                verify_stamped(bad)


@given(batches(), st.data())
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_a_random_byte_change_in_the_crc_covered_area_is_detected(
    b: tuple[bytes, str, int, list[Message], ProducerSequence | None, str], data: st.DataObject
) -> None:
    raw = bytearray(b[0])
    i = data.draw(st.integers(32, len(raw) - 1))
    raw[i] ^= data.draw(st.integers(1, 255))
    with pytest.raises(MalformedBatchError, match="CRC"):
        check_batch(raw)


@given(batches(), st.booleans())
@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=50)
def test_truncation_at_every_length_is_refused(
    b: tuple[bytes, str, int, list[Message], ProducerSequence | None, str], stamped: bool
) -> None:
    buf = bytearray(b[0])
    if stamped:
        stamp(buf, 5, 6)
    raw = bytes(buf)
    for cut in range(len(raw)):
        part = raw[:cut]
        for fn in (check_batch, verify_stamped, read_header):
            with pytest.raises(MalformedBatchError):
                fn(part)
        with pytest.raises(MalformedBatchError):
            list(iter_messages(part))
        with pytest.raises(MalformedBatchError):
            list(iter_messages(part, verify=False))
    h = read_header(raw)
    records = bytes(slice_from(raw, 0))
    for cut in range(len(records)):
        with pytest.raises(MalformedBatchError):
            list(iter_records(records[:cut], h, 0))
    with pytest.raises(MalformedBatchError):
        list(iter_records(records + b"\0" * RECORD_HEAD_BYTES, h, 0))


def _consume(buf: bytes | bytearray) -> None:
    for m in iter_messages(buf, verify=False):
        m.message()
        assert m.tag_hash >= 0


@given(batches(), st.data())
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_corruption_behind_a_good_crc_raises_only_malformed(
    b: tuple[bytes, str, int, list[Message], ProducerSequence | None, str], data: st.DataObject
) -> None:
    """A buggy or hostile producer computes a good CRC over bad bytes: every reader still
    raises MalformedBatchError only (or decodes something)."""
    raw = bytearray(b[0])
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(32, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    fix_body_crc(raw)
    try:
        h = check_batch(raw)
    except MalformedBatchError:
        return
    try:
        _consume(raw)
        for k in range(h.count):
            for m in iter_records(slice_from(raw, k), h, k):
                m.message()
    except MalformedBatchError:
        pass


@given(st.binary(max_size=300))
@example(b"")
@example(bytes(FIXED_HEADER_BYTES))
def test_garbage_raises_only_malformed(raw: bytes) -> None:
    for fn in (check_batch, verify_stamped, read_header):
        with pytest.raises(MalformedBatchError):
            fn(raw)


# ---- targeted refusals, each naming its field --------------------------------------------------


def _with(raw: bytes, fmt: str, at: int, value: int, crc: bool = True) -> bytearray:
    buf = bytearray(raw)
    struct.pack_into(fmt, buf, at, value)
    if crc:
        fix_body_crc(buf)
    return buf


def test_refusals_name_the_field() -> None:
    raw = small_batch()
    h = check_batch(raw)
    cases = [
        (_with(raw, "<B", 0, 2), "kind"),
        (_with(raw, "<B", 1, 1), "version"),
        (_with(raw, "<B", 2, 9), "state"),
        (_with(raw, "<B", 3, 1), "reserved"),
        (_with(raw, "<I", 4, len(raw) + 1), "total length"),
        (_with(raw, "<Q", 16, 1), "stamp slots"),
        (_with(raw, "<H", 32, 0x8001), "flags"),
        (_with(raw, "<H", 32, 0), "producer"),
        (_with(raw, "<H", 34, h.tables_at + 8), "header length"),
        (_with(raw, "<I", 40, 0), "count is 0"),
        (_with(raw, "<I", 40, 1000), "message count"),
        (_with(raw, "<I", 44, 1), "reserved"),
        (_with(raw, "<H", 58, 0), "producer"),
        (_with(raw, "<I", h.tables_at + 8 * h.count, 4), "first is 4"),
        (_with(raw, "<I", h.tables_at + 8 * h.count + 4, 1000), "offsets"),  # > offsets[2]
        (_with(raw, "<I", h.tables_at + 8 * h.count + 8, 1 << 20), "offsets"),
        (_with(raw, "<B", FIXED_HEADER_BYTES, 0xFF), "utf-8"),
    ]
    for buf, field in cases:
        with pytest.raises(MalformedBatchError, match=field):
            check_batch(buf)
    with pytest.raises(MalformedBatchError, match="max_messages"):
        check_batch(raw, BatchLimits(max_messages=2))
    with pytest.raises(MalformedBatchError, match="max_batch_bytes"):
        check_batch(raw, BatchLimits(max_batch_bytes=len(raw) - 1))
    assert check_batch(raw, BatchLimits(max_batch_bytes=len(raw), max_messages=3)) == h


def test_records_inconsistent_with_the_table_are_refused_lazily() -> None:
    raw = small_batch()
    h = check_batch(raw)
    first = h.records_at
    cases = [
        (_with(raw, "<I", first, 7), "lengths give"),  # body length
        (_with(raw, "<H", first + 16, NO_TAG), "lengths give"),  # tag length
        (_with(raw, "<H", first + 18, 2), "keys"),  # key count
        (_with(raw, "<B", first + RECORD_HEAD_BYTES, 0xFF), "utf-8 in a message tag"),
        (_with(raw, "<I", h.tables_at + 8 * h.count + 4, 10), "too short"),  # 10 < a record head
        (_with(raw, "<I", h.tables_at + 8 * h.count + 4, 0), "too short"),  # offsets 0, 0, x
    ]
    for buf, field in cases:
        check_batch(buf)  # the leader's whole-batch checks cannot see inside a record
        with pytest.raises(MalformedBatchError, match=field):
            _consume(buf)


def test_stamping_rules() -> None:
    raw = small_batch()
    buf = bytearray(raw)
    with pytest.raises(MalformedBatchError, match="never stamped"):
        verify_stamped(buf)
    stamp(buf, 10, 20)
    with pytest.raises(MalformedBatchError, match="already stamped"):
        check_batch(buf)
    with pytest.raises(ValueError, match="unstamped"):
        stamp(buf, 11, 21)
    for base, ms in ((-1, 0), (1 << 64, 0), (0, 1 << 63)):
        with pytest.raises(ValueError, match="out of range"):
            stamp(bytearray(raw), base, ms)
    # the stamp CRC covers the stamped slots: a changed base offset is caught on read back
    bad = bytearray(buf)
    struct.pack_into("<Q", bad, 16, 11)
    with pytest.raises(MalformedBatchError, match="stamp CRC"):
        verify_stamped(bad)
    assert isinstance(read_header(buf), BatchHeader)
    with pytest.raises(ValueError, match="not in a batch"):
        slice_from(buf, 3)
    with pytest.raises(ValueError, match="not in a batch"):
        iter_messages(buf, 4)


def test_lazy_objects_decode_on_access() -> None:
    raw = small_batch()
    m = next(iter_messages(raw))
    assert m.body == b"body-0" and m.tags == "TagA" and m.keys == ("k1",)
    assert m.properties == {"p": "v"} and (m.flag, m.born_timestamp_ms) == (1, 10)
    assert m.tag_hash == tag_hash("TagA") and "offset 0" in repr(m)
    assert batch_count(raw) == 3
    with pytest.raises(MalformedBatchError):
        batch_count(raw[:10])
