"""The stored batch (v2 and v3), run against both implementations (the C extension and the
pure-Python twin): round trips, every corruption and truncation refused with MalformedBatchError
only, stamping, slicing and tag hashes; then the two compared, byte for byte and error for error.
The generated batches are of either version (batch_args draws it)."""

from __future__ import annotations

import os
import struct
import sys
from collections.abc import Callable
from types import ModuleType

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from raftmq.common import produce_chunk, stored_batch
from raftmq.common.filter.tag import tag_hash
from raftmq.common.message import Message
from raftmq.common.record_batch import (
    MalformedBatchError,
    ProducerSequence,
    UnsupportedBatchError,
)
from raftmq.common.stored_batch import (
    FIXED_HEADER_BYTES,
    NO_TAG,
    RECORD_HEAD_BYTES,
    BatchHeader,
    BatchLimits,
    implementations,
)
from tests.harness.procs import python_prints

NO_EXTENSIONS = os.environ.get(stored_batch.NO_EXTENSIONS_ENV, "") not in ("", "0")


@pytest.fixture(scope="module", params=["python", "c"])
def sb(request: pytest.FixtureRequest) -> ModuleType:
    """One implementation of the codec; every test below runs against both."""
    found = implementations()
    if request.param not in found:
        if NO_EXTENSIONS:
            pytest.skip(f"{stored_batch.NO_EXTENSIONS_ENV} is set")
        pytest.fail(
            "the C extension raftmq.common._stored_batch_c is not built: run "
            "`.venv/bin/pip install -e . --no-deps` (needs gcc and the Python headers), or set "
            f"{stored_batch.NO_EXTENSIONS_ENV}=1 to test the pure-Python twin alone"
        )
    return found[request.param]


text = st.text(max_size=12)  # any unicode but lone surrogates (utf-8 cannot carry them)
u32 = st.integers(0, (1 << 32) - 1)
u64 = st.integers(0, (1 << 64) - 1)
i64 = st.integers(-(1 << 63), (1 << 63) - 1)
TOPIC = "Orders"
Args = tuple[str, int, list[Message], ProducerSequence | None, str, int]
versions = st.sampled_from([2, 3])


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
def batch_args(draw: st.DrawFn) -> Args:
    """What encode_batch takes: a topic, a queue, messages, a producer, a born host and the
    stored batch version."""
    topic = draw(text)
    host = draw(text)
    msgs = draw(messages(topic, host))
    producer = draw(st.none() | st.builds(ProducerSequence, text.filter(bool), u64, st.booleans()))
    return topic, draw(u32), msgs, producer, host, draw(versions)


def full(m: Message, host: str) -> Message:
    return Message(m.topic, m.body, m.tags, m.keys, m.properties, m.flag, m.born_timestamp_ms, host)


def decode_all(
    sb: ModuleType, buf: bytes | bytearray | memoryview, first: int = 0
) -> list[tuple[int, Message]]:
    return [(m.queue_offset, m.message()) for m in sb.iter_messages(buf, first)]


def fix_body_crc(buf: bytearray) -> None:
    struct.pack_into("<I", buf, 12, crc32c(memoryview(buf)[32:]))


def small_batch(sb: ModuleType, version: int = 2) -> bytes:
    msgs = [
        Message(TOPIC, b"body-0", "TagA", ("k1",), {"p": "v"}, 1, 10),
        Message(TOPIC, b"", None),
        Message(TOPIC, "ü€𝄞".encode(), "", ("", "ключ"), {"": "", "名": "值"}, -1, -5),
    ]
    producer = ProducerSequence("prod-1", 41)
    raw: bytes = sb.encode_batch(TOPIC, 7, msgs, producer, "10.0.0.7:4011", version)
    return raw


# ---- which implementation runs -----------------------------------------------------------------


def _implementation_in(env: dict[str, str]) -> str:
    code = "from raftmq.common import stored_batch as s; print(s.IMPLEMENTATION)"
    return python_prints(code, env).strip()


def test_the_extension_is_used_unless_the_environment_refuses_it() -> None:
    env = {k: v for k, v in os.environ.items() if k != stored_batch.NO_EXTENSIONS_ENV}
    assert _implementation_in(env | {stored_batch.NO_EXTENSIONS_ENV: "1"}) == "python"
    if "c" in implementations():
        assert _implementation_in(env) == "c"
        assert _implementation_in(env | {stored_batch.NO_EXTENSIONS_ENV: "0"}) == "c"
    want = "python" if NO_EXTENSIONS else "c"
    assert want == stored_batch.IMPLEMENTATION
    chosen = implementations()[stored_batch.IMPLEMENTATION]
    assert stored_batch.encode_batch is chosen.encode_batch
    assert stored_batch.iter_records is chosen.iter_records


def test_the_crc_is_crc32c(sb: ModuleType) -> None:
    raw = small_batch(sb)
    (body_crc,) = struct.unpack_from("<I", raw, 12)
    assert body_crc == crc32c(raw[32:])  # Castagnoli, as the format tables say
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value (RFC 3720)
    buf = bytearray(raw)
    sb.stamp(buf, 9, 10)
    (stamp_crc,) = struct.unpack_from("<I", buf, 8)
    assert stamp_crc == crc32c(bytes(buf[:8]) + bytes(buf[12:32]))


# ---- round trips -------------------------------------------------------------------------------


@given(args=batch_args(), base=u64, store_ms=i64)
@settings(deadline=None)
def test_round_trip_before_and_after_stamping(
    sb: ModuleType, args: Args, base: int, store_ms: int
) -> None:
    topic, queue_id, msgs, producer, host, version = args
    raw = sb.encode_batch(*args)
    h = sb.check_batch(raw)
    assert (h.topic, h.queue_id, h.count, h.producer, h.born_host, h.version) == (
        topic,
        queue_id,
        len(msgs),
        producer,
        host,
        version,
    )
    assert raw[1] == version
    assert not h.stamped and h.base_offset == 0 and h.store_timestamp_ms == 0
    assert h.total_bytes == len(raw) and sb.batch_count(raw) == len(msgs)
    want = [full(m, host) for m in msgs]
    assert decode_all(sb, raw) == list(enumerate(want))
    assert decode_all(sb, memoryview(raw)) == list(enumerate(want))

    buf = bytearray(raw)
    sb.stamp(buf, base, store_ms)
    assert buf[32:] == raw[32:]  # stamping touches the stamp slots only
    s = sb.verify_stamped(buf)
    assert s.stamped and (s.base_offset, s.store_timestamp_ms) == (base, store_ms)
    assert s.next_offset == base + len(msgs)
    got = list(sb.iter_messages(buf))
    assert [m.queue_offset for m in got] == [base + i for i in range(len(msgs))]
    assert [m.message() for m in got] == want
    assert {m.store_timestamp_ms for m in got} == {store_ms}
    assert {(m.topic, m.queue_id, m.born_host) for m in got} == {(topic, queue_id, host)}


@given(args=batch_args())
@settings(deadline=None)
def test_tag_hashes_are_the_per_message_function(sb: ModuleType, args: Args) -> None:
    raw = sb.encode_batch(*args)
    want = [tag_hash(m.tags) for m in args[2]]
    assert sb.tag_hashes(raw).tolist() == want
    assert sb.tag_hashes(raw, sb.check_batch(raw)).tobytes() == struct.pack(f"<{len(want)}Q", *want)
    assert [m.tag_hash for m in sb.iter_messages(raw)] == want


@given(args=batch_args())
@settings(deadline=None)
def test_index_columns_are_the_tables_as_the_index_keeps_them(sb: ModuleType, args: Args) -> None:
    """stored_batch.index_columns (the dispatcher's one call per batch) gives what the offsets
    and tag tables say: each record's position in the batch and its size, each tag hash."""
    raw = sb.encode_batch(*args)
    header = sb.read_header(raw)
    offsets = sb.message_offsets(raw, header).tolist()
    ends = [*offsets[1:], header.total_bytes - header.records_at]
    want = (
        tuple(o + header.records_at for o in offsets),
        tuple(e - o for o, e in zip(offsets, ends, strict=True)),
        tuple(sb.tag_hashes(raw, header).tolist()),
    )
    assert stored_batch.index_columns(raw, header) == want
    assert stored_batch.index_columns(memoryview(raw), header) == want
    positions, sizes, _ = want
    assert positions[0] == header.records_at and sum(sizes) == len(raw) - header.records_at


@given(args=batch_args(), base=u64)
@settings(deadline=None)
def test_slicing_equals_full_decode(sb: ModuleType, args: Args, base: int) -> None:
    buf = bytearray(sb.encode_batch(*args))
    sb.stamp(buf, base, 1)
    h = sb.verify_stamped(buf)
    everything = decode_all(sb, buf)
    offsets = sb.message_offsets(buf).tolist()
    assert offsets[0] == 0 and offsets == sorted(offsets)
    for k in range(h.count):
        records = sb.slice_from(buf, k)
        assert records.nbytes == h.total_bytes - h.records_at - offsets[k]
        sliced = [(m.queue_offset, m.message()) for m in sb.iter_records(records, h, k)]
        assert sliced == everything[k:]
        assert decode_all(sb, buf, k) == everything[k:]
        assert [(m.queue_offset, m.message()) for m in sb.iter_records(bytes(records), h, k)] == (
            everything[k:]
        )
    assert decode_all(sb, buf, h.count) == []


def test_max_sizes(sb: ModuleType) -> None:
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
    raw = sb.encode_batch("t", (1 << 32) - 1, [m], ProducerSequence("p", (1 << 64) - 1), big[:100])
    h = sb.check_batch(raw, BatchLimits(max_batch_bytes=8 << 20))
    assert h.producer == ProducerSequence("p", (1 << 64) - 1)
    assert [x.message() for x in sb.iter_messages(raw)] == [full(m, big[:100])]
    # the three header strings share the header's u16 length
    topic = "t" * (0xFFFF - FIXED_HEADER_BYTES - 7)
    raw = sb.encode_batch(topic, 0, [Message(topic, b"x")])
    assert sb.read_header(raw).topic == topic


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"messages": []}, "at least one message"),
        ({"messages": [Message("other", b"x")]}, "topic"),
        ({"messages": [Message(TOPIC, b"x", born_host="h2")]}, "born on"),
        ({"messages": [Message(TOPIC, b"x", "t" * 0xFFFF)]}, "tag of"),
        ({"messages": [Message(TOPIC, b"x", keys=("k" * 0x10000,))]}, "does not fit"),
        ({"messages": [Message(TOPIC, b"x", properties={"n" * 0x10000: ""})]}, "does not fit"),
        ({"messages": [Message(TOPIC, b"x", keys=("k",) * 0x10000)]}, "does not fit"),
        ({"messages": [Message(TOPIC, b"x", flag=1 << 31)]}, "does not fit"),
        ({"messages": [Message(TOPIC, b"x", flag=-(1 << 31) - 1)]}, "does not fit"),
        ({"messages": [Message(TOPIC, b"x", born_timestamp_ms=1 << 63)]}, "does not fit"),
        ({"queue_id": -1}, "queue id"),
        ({"queue_id": 1 << 32}, "queue id"),
        ({"producer": ProducerSequence("", 0)}, "empty"),
        ({"producer": ProducerSequence("p", -1)}, "base sequence"),
        ({"producer": ProducerSequence("p", 1 << 64)}, "base sequence"),
        ({"born_host": "h" * 0xFFF0, "topic": "t" * 0x10}, "too long"),
        ({"born_host": "h" * 0x10000}, "born host of 65536 bytes exceeds 65535"),
        ({"topic": "t" * 0x10000}, "topic of 65536 bytes exceeds 65535"),
    ],
)
def test_values_the_format_cannot_carry(
    sb: ModuleType, kwargs: dict[str, object], error: str
) -> None:
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
        sb.encode_batch(**args)


Runs = list[tuple[int, list[bytes]]]


@st.composite
def bodies_args(draw: st.DrawFn) -> tuple[str, int, Runs, ProducerSequence | None, str, int]:
    """What encode_bodies takes: (born ms, bodies) runs, some of them empty."""
    runs = draw(
        st.lists(
            st.tuples(i64, st.lists(st.binary(min_size=1, max_size=40), max_size=5)),
            min_size=1,
            max_size=4,
        ).filter(lambda rs: any(bodies for _, bodies in rs))
    )
    producer = draw(st.none() | st.builds(ProducerSequence, text.filter(bool), u64, st.booleans()))
    return draw(text), draw(u32), runs, producer, draw(text), draw(versions)


@given(args=bodies_args())
@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
def test_bare_bodies_encode_as_plain_messages(
    sb: ModuleType, args: tuple[str, int, Runs, ProducerSequence | None, str, int]
) -> None:
    """encode_bodies (the batch-first call's encoder, no Message per body) gives the bytes of
    encode_batch over the same bodies as messages without tag, keys or properties, and they
    decode back to those bodies and born times."""
    topic, queue_id, runs, producer, host, version = args
    msgs = [
        Message(topic, body, born_timestamp_ms=ms, born_host=host)
        for ms, bodies in runs
        for body in bodies
    ]
    raw = sb.encode_bodies(topic, queue_id, runs, producer, host, version)
    assert raw == sb.encode_batch(topic, queue_id, msgs, producer, host, version)
    got = [(m.body, m.born_timestamp_ms) for m in sb.iter_messages(raw)]
    assert got == [(m.body, m.born_timestamp_ms) for m in msgs]


@pytest.mark.parametrize(
    ("runs", "error"),
    [
        ([], "at least one message"),
        ([(1, [])], "at least one message"),
        ([[1, [b"a"]]], "each run must be a"),
        ([(1 << 63, [b"a"])], "born timestamp is not a 64-bit integer"),
        ([(1, [b"a", bytearray(b"b")])], "a body must be bytes, not bytearray"),
    ],
)
def test_bare_bodies_the_format_cannot_carry(sb: ModuleType, runs: object, error: str) -> None:
    with pytest.raises((ValueError, TypeError), match=error):
        sb.encode_bodies(TOPIC, 0, runs)


# ---- corruption, truncation, garbage -----------------------------------------------------------


@pytest.mark.parametrize("version", [2, 3])
def test_every_single_byte_corruption_is_detected(sb: ModuleType, version: int) -> None:
    raw = small_batch(sb, version)
    stamped = bytearray(raw)
    sb.stamp(stamped, 1000, 1_700_000_000_000)
    for i in range(len(raw)):
        for delta in (0x01, 0x80, 0xFF):
            bad = bytearray(raw)
            bad[i] ^= delta
            with pytest.raises(MalformedBatchError):
                sb.check_batch(bad)
            bad = bytearray(stamped)
            bad[i] ^= delta
            with pytest.raises(MalformedBatchError):
                sb.verify_stamped(bad)


@given(args=batch_args(), data=st.data())
@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
def test_a_random_byte_change_in_the_crc_covered_area_is_detected(
    sb: ModuleType, args: Args, data: st.DataObject
) -> None:
    raw = bytearray(sb.encode_batch(*args))
    i = data.draw(st.integers(32, len(raw) - 1))
    raw[i] ^= data.draw(st.integers(1, 255))
    with pytest.raises(MalformedBatchError, match="CRC"):
        sb.check_batch(raw)


@given(args=batch_args(), stamped=st.booleans())
@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=50, deadline=None)
def test_truncation_at_every_length_is_refused(sb: ModuleType, args: Args, stamped: bool) -> None:
    buf = bytearray(sb.encode_batch(*args))
    if stamped:
        sb.stamp(buf, 5, 6)
    raw = bytes(buf)
    for cut in range(len(raw)):
        part = raw[:cut]
        for fn in (sb.check_batch, sb.verify_stamped, sb.read_header):
            with pytest.raises(MalformedBatchError):
                fn(part)
        with pytest.raises(MalformedBatchError):
            list(sb.iter_messages(part))
        with pytest.raises(MalformedBatchError):
            list(sb.iter_messages(part, verify=False))
    h = sb.read_header(raw)
    records = bytes(sb.slice_from(raw, 0))
    for cut in range(len(records)):
        with pytest.raises(MalformedBatchError):
            list(sb.iter_records(records[:cut], h, 0))
    with pytest.raises(MalformedBatchError):
        list(sb.iter_records(records + b"\0" * RECORD_HEAD_BYTES, h, 0))


def _consume(sb: ModuleType, buf: bytes | bytearray) -> None:
    for m in sb.iter_messages(buf, verify=False):
        m.message()
        assert m.tag_hash >= 0


@given(args=batch_args(), data=st.data())
@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
def test_corruption_behind_a_good_crc_raises_only_malformed(
    sb: ModuleType, args: Args, data: st.DataObject
) -> None:
    """A buggy or hostile producer computes a good CRC over bad bytes: every reader still
    raises MalformedBatchError only (or decodes something)."""
    raw = bytearray(sb.encode_batch(*args))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(32, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    fix_body_crc(raw)
    try:
        h = sb.check_batch(raw)
    except MalformedBatchError:
        return
    try:
        _consume(sb, raw)
        for k in range(h.count):
            for m in sb.iter_records(sb.slice_from(raw, k), h, k):
                m.message()
    except MalformedBatchError:
        pass


@given(raw=st.binary(max_size=300))
@settings(deadline=None)
@example(raw=b"")
@example(raw=bytes(FIXED_HEADER_BYTES))
def test_garbage_raises_only_malformed(sb: ModuleType, raw: bytes) -> None:
    for fn in (sb.check_batch, sb.verify_stamped, sb.read_header):
        with pytest.raises(MalformedBatchError):
            fn(raw)


# ---- targeted refusals, each naming its field --------------------------------------------------


def _with(raw: bytes, fmt: str, at: int, value: int, crc: bool = True) -> bytearray:
    buf = bytearray(raw)
    struct.pack_into(fmt, buf, at, value)
    if crc:
        fix_body_crc(buf)
    return buf


def test_refusals_name_the_field(sb: ModuleType) -> None:
    raw = small_batch(sb)
    h = sb.check_batch(raw)
    cases = [
        (_with(raw, "<B", 0, 2), "kind"),
        (_with(raw, "<B", 1, 1), "version"),
        (_with(raw, "<B", 2, 9), "state"),
        (_with(raw, "<B", 3, 1), "reserved"),
        (_with(raw, "<I", 4, len(raw) + 1), "total length"),
        (_with(raw, "<Q", 16, 1), "stamp slots"),
        (_with(raw, "<H", 32, 0x8001), "flags 0x8001"),
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
        (_with(raw, "<B", 12, raw[12] ^ 1, crc=False), "body CRC mismatch: header says 0x"),
    ]
    for buf, field in cases:
        with pytest.raises(MalformedBatchError, match=field):
            sb.check_batch(buf)
    # a dip in the offsets table that climbs back to the last value: [0, c, b, c] with b < c
    four = sb.encode_batch(TOPIC, 0, [Message(TOPIC, bytes(i)) for i in range(4)])
    at = sb.read_header(four).tables_at + 8 * 4
    last = struct.unpack_from("<I", four, at + 12)[0]
    with pytest.raises(MalformedBatchError, match="not increasing"):
        sb.check_batch(_with(four, "<I", at + 4, last))
    with pytest.raises(MalformedBatchError, match="max_messages"):
        sb.check_batch(raw, BatchLimits(max_messages=2))
    with pytest.raises(MalformedBatchError, match="max_batch_bytes"):
        sb.check_batch(raw, BatchLimits(max_batch_bytes=len(raw) - 1))
    assert sb.check_batch(raw, BatchLimits(max_batch_bytes=len(raw), max_messages=3)) == h
    assert sb.check_batch(raw, limits=BatchLimits()) == h


def test_records_inconsistent_with_the_table_are_refused_lazily(sb: ModuleType) -> None:
    raw = small_batch(sb)
    h = sb.check_batch(raw)
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
        sb.check_batch(buf)  # the leader's whole-batch checks cannot see inside a record
        with pytest.raises(MalformedBatchError, match=field):
            _consume(sb, buf)


def test_stamping_rules(sb: ModuleType) -> None:
    raw = small_batch(sb)
    buf = bytearray(raw)
    with pytest.raises(MalformedBatchError, match="never stamped"):
        sb.verify_stamped(buf)
    sb.stamp(buf, 10, 20)
    with pytest.raises(MalformedBatchError, match="already stamped"):
        sb.check_batch(buf)
    with pytest.raises(ValueError, match="unstamped"):
        sb.stamp(buf, 11, 21)
    with pytest.raises(ValueError, match="unstamped"):
        sb.stamp(bytearray(10), 11, 21)
    for base, ms in ((-1, 0), (1 << 64, 0), (0, 1 << 63), (0, -(1 << 63) - 1)):
        with pytest.raises(ValueError, match="out of range"):
            sb.stamp(bytearray(raw), base, ms)
    # the stamp CRC covers the stamped slots: a changed base offset is caught on read back
    bad = bytearray(buf)
    struct.pack_into("<Q", bad, 16, 11)
    with pytest.raises(MalformedBatchError, match="stamp CRC"):
        sb.verify_stamped(bad)
    assert isinstance(sb.read_header(buf), BatchHeader)
    with pytest.raises(ValueError, match="not in a batch"):
        sb.slice_from(buf, 3)
    with pytest.raises(ValueError, match="not in a batch"):
        sb.slice_from(buf, -1)
    with pytest.raises(ValueError, match="not in a batch"):
        sb.iter_messages(buf, 4)
    with pytest.raises(ValueError, match="not in a batch"):
        sb.iter_messages(buf, -1)


def test_a_batch_marked_scheduled_is_read_by_both_implementations(sb: ModuleType) -> None:
    """The broker's delayed sends (issue 24): stored_batch.mark_scheduled sets flag 0x8 and
    rewrites the body CRC of a batch either codec encoded; both read the flag as known."""
    raw = small_batch(sb)
    assert not stored_batch.is_scheduled(raw)
    buf = bytearray(raw)
    stored_batch.mark_scheduled(buf)
    assert stored_batch.is_scheduled(buf)
    assert buf[32:34] == struct.pack("<H", struct.unpack_from("<H", raw, 32)[0] | 0x8)
    assert buf[:12] == raw[:12] and buf[16:32] == raw[16:32] and buf[34:] == raw[34:]  # flags, CRC
    assert sb.check_batch(buf).count == sb.check_batch(raw).count
    sb.stamp(buf, 0, 5)
    assert sb.verify_stamped(buf).store_timestamp_ms == 5
    assert [m.body for m in sb.iter_messages(buf)] == [m.body for m in sb.iter_messages(raw)]
    with pytest.raises(ValueError, match="unstamped"):
        stored_batch.mark_scheduled(buf)
    unknown = bytearray(raw)  # a flag past 0x8 stays unknown
    struct.pack_into("<H", unknown, 32, struct.unpack_from("<H", raw, 32)[0] | 0x10)
    struct.pack_into("<I", unknown, 12, crc32c(memoryview(unknown)[32:]))
    with pytest.raises(UnsupportedBatchError, match="include 0x10, unknown to this raftmq"):
        sb.check_batch(unknown)


def test_lazy_objects_decode_on_access(sb: ModuleType) -> None:
    raw = small_batch(sb)
    m = next(sb.iter_messages(raw))
    assert m.body == b"body-0" and m.tags == "TagA" and m.keys == ("k1",)
    assert m.properties == {"p": "v"} and (m.flag, m.born_timestamp_ms) == (1, 10)
    assert m.tag_hash == tag_hash("TagA") and "offset 0" in repr(m)
    assert sb.batch_count(raw) == 3
    with pytest.raises(MalformedBatchError):
        sb.batch_count(raw[:10])


# ---- the C extension against the twin: the same bytes, values and errors -----------------------

Outcome = tuple[object, ...]


def _needs_both() -> tuple[ModuleType, ModuleType]:
    found = implementations()
    if "c" not in found:
        if NO_EXTENSIONS:
            pytest.skip(f"{stored_batch.NO_EXTENSIONS_ENV} is set")
        pytest.fail("the C extension is not built: `.venv/bin/pip install -e . --no-deps`")
    return found["python"], found["c"]


def _error(exc: Exception) -> Outcome:
    # A ValueError of encode about a field the format cannot carry quotes struct's own words in
    # the twin and says it plainly in C: the same meaning, compared up to the colon.
    text = str(exc)
    if "does not fit the stored batch format" in text:
        text = text.split(":", 1)[0]
    return ("error", type(exc), text)


def _value(v: object) -> object:
    if isinstance(v, memoryview):
        return ("memoryview", v.format, v.nbytes, v.tobytes())
    if isinstance(v, stored_batch.BatchMessage):
        fields: list[object] = [v.queue_offset, v.tag_hash, v._head, v._pos, v._end, repr(v)]
        for name in ("topic", "queue_id", "store_timestamp_ms", "born_host", "flag",
                     "born_timestamp_ms", "body", "tags", "keys", "properties"):  # fmt: skip
            fields.append(_outcome(lambda name=name: getattr(v, name)))
        fields.append(_outcome(v.message))
        return tuple(fields)
    return v


def _outcome(fn: object, *args: object, **kwargs: object) -> Outcome:
    try:
        v = fn(*args, **kwargs)  # type: ignore[operator]
    except Exception as exc:
        return _error(exc)
    return ("ok", _value(v))


def _iterate(it: object, limit: int) -> list[Outcome]:
    """Every next() of an iterator, going on after an error as a caller may (a map of the twin
    goes on, a generator stops): both implementations must agree on that too."""
    out: list[Outcome] = []
    for _ in range(limit):
        try:
            m = next(it)  # type: ignore[call-overload]
        except StopIteration:
            out.append(("stop",))
            break
        except Exception as exc:
            out.append(_error(exc))
        else:
            out.append(("ok", _value(m)))
    return out


def _reads(sb: ModuleType, buf: bytes | bytearray) -> list[object]:
    """What every reader makes of `buf` (values or errors)."""
    got: list[object] = [
        _outcome(sb.check_batch, buf),
        _outcome(sb.check_batch, buf, BatchLimits(max_batch_bytes=200, max_messages=2)),
        _outcome(sb.verify_stamped, buf),
        _outcome(sb.read_header, buf),
        _outcome(sb.batch_count, buf),
    ]
    for verify in (True, False):
        for first in (0, 1):
            try:
                it = sb.iter_messages(buf, first, verify=verify)
            except Exception as exc:
                got.append(_error(exc))
            else:
                got.append(_iterate(it, 20))
    try:
        h = sb.read_header(buf)
    except MalformedBatchError:
        return got
    got += [_outcome(sb.tag_hashes, buf), _outcome(sb.message_offsets, buf, h)]
    for k in range(min(h.count, 8)):
        records = _outcome(sb.slice_from, buf, k, h)
        got.append(records)
        if records[0] == "ok":
            got.append(_iterate(sb.iter_records(sb.slice_from(buf, k, h), h, k), 20))
            got.append(_iterate(sb.iter_records(bytes(sb.slice_from(buf, k)), h, k + 1), 20))
    return got


loose_text = st.text(max_size=6) | st.sampled_from(["x" * 0xFFFF, "ü" * 0x8000, "\ud800"])


@st.composite
def loose_batch_args(draw: st.DrawFn) -> Args:
    """encode_batch's arguments, often out of the format's range (long strings, lone surrogates,
    ints past their fields, messages of another topic or host)."""
    topic, host = draw(text), draw(text)
    msgs = draw(
        st.lists(
            st.builds(
                Message,
                topic=st.sampled_from([topic, topic + "x"]),
                body=st.binary(max_size=24),
                tags=st.none() | loose_text,
                keys=st.lists(loose_text, max_size=2).map(tuple),
                properties=st.dictionaries(loose_text, loose_text, max_size=2),
                flag=st.integers(-(1 << 32), 1 << 32),
                born_timestamp_ms=st.integers(-(1 << 64), 1 << 64),
                born_host=st.sampled_from(["", host, host + "y"]),
            ),
            max_size=4,
        )
    )
    producer = draw(
        st.none()
        | st.builds(ProducerSequence, text, st.integers(-(1 << 64), 1 << 65), st.booleans())
    )
    version = draw(st.sampled_from([2, 3, 3, 1, 4]))
    return topic, draw(st.integers(-(1 << 33), 1 << 33)), msgs, producer, host, version


@given(args=loose_batch_args() | batch_args())
@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
def test_the_extension_encodes_as_the_twin(args: Args) -> None:
    py, c = _needs_both()
    want = _outcome(py.encode_batch, *args)
    assert _outcome(c.encode_batch, *args) == want
    if want[0] == "ok":
        raw = py.encode_batch(*args)
        assert c.encode_batch(*args) == raw  # bytes, byte for byte
        assert _reads(c, raw) == _reads(py, raw)


@st.composite
def damaged(draw: st.DrawFn) -> bytes | bytearray:
    """A good batch (stamped or not), then bytes changed, cut or added, often with CRCs that
    match the damage (what a buggy or hostile writer makes)."""
    py = implementations()["python"]
    buf = bytearray(py.encode_batch(*draw(batch_args())))
    if draw(st.booleans()):
        py.stamp(buf, draw(u64), draw(i64))
    h = py.read_header(buf)
    regions = {  # where damage says most: the header, the tables, the first record's head
        "anywhere": (0, len(buf)),
        "header": (0, h.tables_at),
        "tables": (h.tables_at, h.records_at),
        "record head": (h.records_at, min(h.records_at + RECORD_HEAD_BYTES, len(buf))),
    }
    for _ in range(draw(st.integers(0, 4))):
        lo, hi = regions[draw(st.sampled_from(sorted(regions)))]
        i = draw(st.integers(lo, hi - 1))
        buf[i] = (
            draw(st.sampled_from([0, 1, 0xFF, 0x80]))
            if draw(st.booleans())
            else (draw(st.integers(0, 255)))
        )
    if h.count > 1 and draw(st.integers(0, 99)) < 30:  # one table entry copied over another
        table = h.records_at - 4 * h.count
        i = draw(st.integers(0, h.count - 1))
        j = h.count - 1 if draw(st.booleans()) else draw(st.integers(0, h.count - 1))
        buf[table + 4 * i : table + 4 * i + 4] = buf[table + 4 * j : table + 4 * j + 4]
    if draw(st.integers(0, 99)) < 10:
        struct.pack_into("<I", buf, 4, draw(st.sampled_from(range(0, 200, 7))))
    if draw(st.integers(0, 99)) < 70:
        fix_body_crc(buf)
    if buf[2] == 1 and draw(st.integers(0, 99)) < 70:
        struct.pack_into("<I", buf, 8, crc32c(bytes(buf[:8]) + bytes(buf[12:32])))
    if draw(st.integers(0, 99)) < 20:  # cut or lengthened, one in five
        cut = draw(st.integers(FIXED_HEADER_BYTES, len(buf) + 16))
        buf = buf[:cut] + bytes(draw(st.integers(0, 16))) if cut > len(buf) else buf[:cut]
    return bytes(buf) if draw(st.booleans()) else buf


@given(buf=damaged())
@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=300, deadline=None)
@example(buf=b"")
@example(buf=bytes(FIXED_HEADER_BYTES))
def test_the_extension_reads_damaged_batches_as_the_twin(buf: bytes | bytearray) -> None:
    """Byte for byte the same results and the same MalformedBatchError texts, and the C code
    never crashes, never raises IndexError or anything but MalformedBatchError for bad bytes."""
    py, c = _needs_both()
    got = _reads(c, buf)
    assert got == _reads(py, buf)
    flat = str(got)
    assert "IndexError" not in flat and "struct.error" not in flat and "SystemError" not in flat


@given(raw=st.binary(max_size=400))
@settings(max_examples=300, deadline=None)
def test_the_extension_reads_garbage_as_the_twin(raw: bytes) -> None:
    py, c = _needs_both()
    assert _reads(c, raw) == _reads(py, raw)


def test_the_extension_stamps_as_the_twin() -> None:
    py, c = _needs_both()
    raw = small_batch(py)
    for base, ms in ((0, 0), ((1 << 64) - 1, -(1 << 63)), (5, (1 << 63) - 1)):
        a, b = bytearray(raw), bytearray(raw)
        py.stamp(a, base, ms)
        c.stamp(b, base, ms)
        assert a == b
    for base, ms in ((-1, 0), (1 << 64, 0), (0, 1 << 63)):
        assert _outcome(c.stamp, bytearray(raw), base, ms) == _outcome(
            py.stamp, bytearray(raw), base, ms
        )
    for sb in (py, c):  # bytes are immutable: stamp() writes in place
        with pytest.raises(TypeError, match="read-write bytes-like object, not bytes"):
            sb.stamp(raw, 1, 2)


def test_queue_offsets_past_int64() -> None:
    """Offsets are u64 and a batch near the top has offsets past int64 (and past u64 for the
    last message): Python ints in both."""
    py, c = _needs_both()
    raw = small_batch(py)
    for base in ((1 << 63) - 2, (1 << 64) - 1):
        buf = bytearray(raw)
        py.stamp(buf, base, 1)
        want = [m.queue_offset for m in py.iter_messages(buf)]
        assert [m.queue_offset for m in c.iter_messages(buf)] == want == [base, base + 1, base + 2]
        h = c.read_header(buf)
        assert [m.queue_offset for m in c.iter_records(c.slice_from(buf, 1), h, 1)] == want[1:]


def test_encode_takes_duck_typed_messages_and_any_sequence() -> None:
    """The C encoder reads fields straight from a Message's slots and by name from anything
    else (a subclass, another class with the same fields), and takes any sequence."""
    py, c = _needs_both()

    class Sub(Message):
        __slots__ = ()

    class Plain:
        def __init__(self, m: Message) -> None:
            for name in Message.__dataclass_fields__:
                setattr(self, name, getattr(m, name))

    base = [Message(TOPIC, b"a", "t", ("k",), {"p": "v"}, 3, 4), Message(TOPIC, b"b")]
    want = py.encode_batch(TOPIC, 1, base)
    mixed = [Sub(TOPIC, b"a", "t", ("k",), {"p": "v"}, 3, 4), Plain(base[1])]
    assert c.encode_batch(TOPIC, 1, tuple(mixed)) == want
    assert c.encode_batch(TOPIC, 1, [base[0], Message(TOPIC, bytearray(b"b"))]) == want
    assert c.encode_batch(TOPIC, 1, [base[0], Message(TOPIC, memoryview(b"b"))]) == want


def test_the_extension_survives_many_batches_without_leaking() -> None:
    """Reference counts: encode, check, stamp and decode many batches; the process's count of
    live objects stays flat (a missed Py_DECREF per message shows here)."""
    import gc

    _, c = _needs_both()
    msgs = [Message(TOPIC, bytes(100), "TagA", ("k",), {"p": "v"}, 0, 1) for _ in range(64)]

    def once() -> None:
        buf = bytearray(c.encode_batch(TOPIC, 1, msgs, ProducerSequence("p", 1), "h"))
        h = c.check_batch(buf)
        c.stamp(buf, 10, 20)
        c.verify_stamped(buf)
        for m in c.iter_messages(buf):
            m.message()
        for m in c.iter_records(c.slice_from(buf, 3, h), h, 3):
            assert m.body
        c.tag_hashes(buf).tolist()
        c.message_offsets(buf, h).tolist()
        for bad in (buf[:-1], bytes(buf[:70])):
            with pytest.raises(MalformedBatchError):
                c.check_batch(bad)
        with pytest.raises(ValueError):
            c.encode_batch(TOPIC, 1, [*msgs, Message("other", b"")])

    for _ in range(50):
        once()
    gc.collect()
    before = len(gc.get_objects()), sys.getallocatedblocks()
    for _ in range(300):
        once()
    gc.collect()
    after = len(gc.get_objects()), sys.getallocatedblocks()
    assert after[0] - before[0] < 50, (before, after)
    assert after[1] - before[1] < 2000, (before, after)


def test_the_extension_takes_the_twins_keywords() -> None:
    """Callers may name any argument as the twin's signatures do."""
    py, c = _needs_both()
    raw = small_batch(py)
    h = py.read_header(raw)
    msgs = [Message(TOPIC, b"x")]
    calls: list[tuple[str, Callable[[], dict[str, object]]]] = [
        (
            "encode_batch",
            lambda: {"topic": TOPIC, "queue_id": 1, "messages": msgs, "producer": None},
        ),
        ("check_batch", lambda: {"buf": raw, "limits": BatchLimits()}),
        ("verify_stamped", lambda: {"buf": raw}),
        ("read_header", lambda: {"buf": raw}),
        ("batch_count", lambda: {"buf": raw}),
        ("stamp", lambda: {"buf": bytearray(raw), "base_offset": 1, "store_ms": 2}),
        ("tag_hashes", lambda: {"buf": raw, "header": h}),
        ("message_offsets", lambda: {"buf": raw, "header": h}),
        ("slice_from", lambda: {"buf": raw, "k": 1, "header": h}),
        ("iter_messages", lambda: {"buf": raw, "first": 1, "verify": False}),
        ("iter_records", lambda: {"records": py.slice_from(raw, 1), "header": h, "first": 1}),
    ]
    for name, kwargs in calls:
        want, got = getattr(py, name), getattr(c, name)
        assert _outcome(_iterate_if, got, **kwargs()) == _outcome(_iterate_if, want, **kwargs())
        with pytest.raises(TypeError):
            got(**kwargs(), nonsense=1)


def _iterate_if(fn: object, **kwargs: object) -> object:
    v = fn(**kwargs)  # type: ignore[operator]
    return _iterate(v, 10) if hasattr(v, "__next__") else v


# ---- a newer writer's batch: refused with a typed error that says to upgrade -------------------


def _with_flags(raw: bytes, extra: int) -> bytearray:
    buf = bytearray(raw)
    struct.pack_into("<H", buf, 32, struct.unpack_from("<H", raw, 32)[0] | extra)
    struct.pack_into("<I", buf, 12, crc32c(memoryview(buf)[32:]))
    return buf


@pytest.mark.parametrize(("version", "known"), [(2, 0xF), (3, 0x1F)])
def test_a_flag_this_version_does_not_know_is_refused_as_a_newer_format(
    sb: ModuleType, version: int, known: int
) -> None:
    """The mixed-version guard (issue 24): a header flag unknown here changes what the bytes mean
    (as 0x8, scheduled, did for readers before it), so every reader, the client's too, refuses
    the batch with UnsupportedBatchError naming the flag and saying to upgrade, never reads it
    as a batch it knows; unknown versions the same. Every bit past the known ones (v3 knows
    one more, NO_TAG_HASHES; in a v2 batch it is unknown)."""
    raw = small_batch(sb, version)
    for bit in range(known.bit_length(), 16):
        unstamped = _with_flags(raw, 1 << bit)
        stamped_buf = bytearray(unstamped)
        sb.stamp(stamped_buf, 9, 5)  # the stamp reads no flags; every reader below does
        stamped = bytes(stamped_buf)
        readers: list[Callable[[bytes], object]] = [
            sb.verify_stamped,
            sb.read_header,
            lambda b: list(sb.iter_messages(b)),
            produce_chunk.read_header,
        ]
        with pytest.raises(UnsupportedBatchError, match="unknown to this raftmq"):
            sb.check_batch(unstamped)
        for read in readers:
            with pytest.raises(UnsupportedBatchError) as caught:
                read(stamped)
            assert f"include {1 << bit:#x}, unknown to this raftmq (it reads {known:#x})" in str(
                caught
            )
            assert "upgrade raftmq where the batch is read" in str(caught)
    newer = bytearray(raw)
    newer[1] = 4
    for read_newer in (
        lambda: sb.check_batch(newer),
        lambda: sb.read_header(newer),
        lambda: produce_chunk.read_header(bytes(newer)),
    ):
        with pytest.raises(UnsupportedBatchError, match=r"version 4 is newer .*upgrade raftmq"):
            read_newer()
    older = bytearray(raw)
    older[1] = 1  # not a newer format: a plain refusal
    with pytest.raises(MalformedBatchError) as not_newer:
        sb.check_batch(older)
    assert not isinstance(not_newer.value, UnsupportedBatchError)


# ---- v3's compact record heads -----------------------------------------------------------------


def test_v3_is_v2_without_the_tag_hashes_and_with_compact_heads(sb: ModuleType) -> None:
    """Bare 100-byte bodies of one run: per message the offsets table's 4 bytes and a 3-byte
    head (attributes, born delta, body length), against v2's 8 + 4 + 28; no tag-hash table
    (flag 0x10) while no message has a tag, the table back as soon as one has."""
    bodies = [bytes([i]) * 100 for i in range(50)]
    v2 = sb.encode_bodies(TOPIC, 1, [(1_700_000_000_000, bodies)], None, "h")
    v3 = sb.encode_bodies(TOPIC, 1, [(1_700_000_000_000, bodies)], None, "h", 3)
    h2, h3 = sb.check_batch(v2), sb.check_batch(v3)
    assert (h2.version, h3.version) == (2, 3)
    assert len(v2) - h2.tables_at == 50 * (8 + 4 + 28 + 100)
    assert len(v3) - h3.tables_at == 50 * (4 + 3 + 100)
    assert struct.unpack_from("<H", v3, 32)[0] & 0x10 and not h3.has_tag_hashes
    assert h3.born_base_ms == 1_700_000_000_000 and sb.tag_hashes(v3).tolist() == [0] * 50
    assert [m.body for m in sb.iter_messages(v3)] == bodies
    tagged = [Message(TOPIC, b"x"), Message(TOPIC, b"y", "TagA")]
    t3 = sb.encode_batch(TOPIC, 1, tagged, None, "", 3)
    assert sb.read_header(t3).has_tag_hashes
    assert sb.tag_hashes(t3).tolist() == [0, tag_hash("TagA")]


@pytest.mark.parametrize(
    ("head", "error"),
    [
        (b"\x10\x00\x01", "its head is malformed"),  # an attribute bit no writer sets
        (b"\x00" + b"\x80" * 9 + b"\x02" + b"\x01", "its head is malformed"),  # past 64 bits
        (b"\x00\x00\x80\x80\x80\x80\x10", "its head is malformed"),  # a body over 4 GiB
        (b"\x02\x00\x01\xff\xff\x03", "its head is malformed"),  # a tag of 65535 bytes
        (b"\x00\x00\x80", "is too short"),  # the body length runs past the record
    ],
)
def test_a_bad_v3_record_head_is_refused_alike_in_both(head: bytes, error: str) -> None:
    py, c = _needs_both()
    raw = bytearray(py.encode_batch(TOPIC, 1, [Message(TOPIC, b"z")], None, "", 3))
    h = py.read_header(raw)
    buf = raw[: h.records_at] + head + b"z" * (head[-1] != 0x80)
    struct.pack_into("<I", buf, 4, len(buf))
    fix_body_crc(buf)
    with pytest.raises(MalformedBatchError, match=error):
        list(py.iter_messages(buf))
    assert _reads(c, bytes(buf)) == _reads(py, bytes(buf))


def test_damaged_v3_heads_read_alike_in_both() -> None:
    """Every byte of the first records' heads set to values that matter to a varint."""
    py, c = _needs_both()
    raw = small_batch(py, 3)
    at = py.read_header(raw).records_at
    for i in range(at, min(at + 16, len(raw))):
        for value in (0x00, 0x01, 0x0F, 0x7F, 0x80, 0xFF):
            buf = bytearray(raw)
            buf[i] = value
            fix_body_crc(buf)
            assert _reads(c, buf) == _reads(py, buf), (i, value)


def test_only_versions_2_and_3_are_written_alike_in_both() -> None:
    py, c = _needs_both()
    args = (TOPIC, 0, [Message(TOPIC, b"x")], None, "")
    for version in (1, 4, 3.0, True, "3", None):
        want = _outcome(py.encode_batch, *args, version)
        assert want[0] == "error" and "is not one this raftmq writes" in str(want[2])
        assert _outcome(c.encode_batch, *args, version) == want
        assert _outcome(c.encode_bodies, TOPIC, 0, [(1, [b"x"])], None, "", version) == want


# ---- bodies as an Arrow column (the Spark sink, issue 28) --------------------------------------


def _column_of(bodies: list[bytes], rows: range) -> stored_batch.BodyColumn:
    """`bodies` laid out as Arrow lays out a binary column: int32 offsets and the data."""
    ends = [0]
    for b in bodies:
        ends.append(ends[-1] + len(b))
    offsets = struct.pack(f"={len(ends)}i", *ends)
    return stored_batch.BodyColumn(offsets, b"".join(bodies), rows)


@st.composite
def column_runs(draw: st.DrawFn) -> tuple[list[tuple[int, object]], Runs]:
    """encode_bodies' runs, some as body columns (any ascending rows of a column, step > 1
    too), with the same runs as lists of bytes."""
    runs: list[tuple[int, object]] = []
    plain: Runs = []
    for _ in range(draw(st.integers(1, 4))):
        ms = draw(i64)
        bodies = draw(st.lists(st.binary(min_size=1, max_size=40), max_size=8))
        if draw(st.booleans()):
            start = draw(st.integers(0, len(bodies)))
            rows = range(start, draw(st.integers(start, len(bodies))), draw(st.integers(1, 3)))
            runs.append((ms, _column_of(bodies, rows)))
            plain.append((ms, [bodies[r] for r in rows]))
        else:
            runs.append((ms, bodies))
            plain.append((ms, bodies))
    return runs, plain


@given(runs=column_runs(), producer=st.none() | st.builds(ProducerSequence, st.just("p"), u64))
@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
def test_a_body_column_encodes_as_its_bodies(
    sb: ModuleType, runs: tuple[list[tuple[int, object]], Runs], producer: ProducerSequence | None
) -> None:
    """A BodyColumn run gives the bytes of the same bodies as a list, strided rows included, in
    both versions, and body_sizes their total, smallest and biggest."""
    columns, plain = runs
    for version in (2, 3):
        want = _outcome(sb.encode_bodies, TOPIC, 3, plain, producer, "h", version)
        assert _outcome(sb.encode_bodies, TOPIC, 3, columns, producer, "h", version) == want
    for (_, col), (_, bodies) in zip(columns, plain, strict=True):
        if isinstance(col, stored_batch.BodyColumn):
            sizes = [len(b) for b in bodies] or [0]
            assert sb.body_sizes(col) == (sum(sizes), min(sizes), max(sizes))
            assert list(col) == bodies


@st.composite
def loose_columns(draw: st.DrawFn) -> stored_batch.BodyColumn:
    """Body columns whose offsets lie: any int32s (negative, descending, past the data), a byte
    length not a multiple of 4, rows past the offsets."""
    ends = draw(st.lists(st.integers(-(1 << 31), (1 << 31) - 1) | st.integers(0, 20), max_size=8))
    offsets = struct.pack(f"={len(ends)}i", *ends) + bytes(draw(st.sampled_from([0, 0, 0, 1, 3])))
    start = draw(st.integers(0, 10))
    rows = range(start, draw(st.integers(start, 12)), draw(st.integers(1, 3)))
    return stored_batch.BodyColumn(offsets, draw(st.binary(max_size=20)), rows)


@given(col=loose_columns())
@settings(max_examples=300, deadline=None)
def test_the_extension_reads_body_columns_as_the_twin(col: stored_batch.BodyColumn) -> None:
    """The same bytes or the same errors, naming the same row; the C code never reads outside
    the buffers (a lying offset is a ValueError, not a crash)."""
    py, c = _needs_both()
    assert _outcome(c.body_sizes, col) == _outcome(py.body_sizes, col)
    runs = [(1, [b"x"]), (2, col)]
    for v in (2, 3):
        want = _outcome(py.encode_bodies, TOPIC, 0, runs, None, "", v)
        assert _outcome(c.encode_bodies, TOPIC, 0, runs, None, "", v) == want
    assert _outcome(c.body_sizes, column=col) == _outcome(py.body_sizes, column=col)


def test_a_body_column_refuses_rows_it_cannot_read(sb: ModuleType) -> None:
    col = _column_of([b"ab", b"c"], range(2))
    with pytest.raises(ValueError, match="rows must be an ascending range"):
        stored_batch.BodyColumn(col.offsets, col.data, range(2, 0, -1))
    with pytest.raises(ValueError, match="row 2 is past its 3 offsets"):
        sb.body_sizes(stored_batch.BodyColumn(col.offsets, col.data, range(3)))
    short = stored_batch.BodyColumn(col.offsets, b"ab", range(2))
    with pytest.raises(ValueError, match=r"row 1 spans 2\.\.3, outside its 2 bytes"):
        sb.encode_bodies(TOPIC, 0, [(1, short)])
    assert col[1:] == stored_batch.BodyColumn(col.offsets, col.data, range(1, 2))
    assert col[-1] == b"c"


def test_body_columns_encode_without_leaking() -> None:
    import gc

    _, c = _needs_both()
    col = _column_of([bytes(100)] * 64, range(64))
    bad = stored_batch.BodyColumn(col.offsets, b"", range(64))

    def once() -> None:
        c.encode_bodies(TOPIC, 1, [(1, col), (2, col[::3])], ProducerSequence("p", 1), "h")
        c.body_sizes(col)
        for fn in (lambda: c.encode_bodies(TOPIC, 1, [(1, bad)]), lambda: c.body_sizes(bad)):
            with pytest.raises(ValueError):
                fn()

    for _ in range(50):
        once()
    gc.collect()
    before = len(gc.get_objects()), sys.getallocatedblocks()
    for _ in range(500):
        once()
    gc.collect()
    after = len(gc.get_objects()), sys.getallocatedblocks()
    assert after[0] - before[0] < 50, (before, after)
    assert after[1] - before[1] < 2000, (before, after)
