"""`columns`, the stored batch's Arrow column buffers (what the Spark source hands Spark), against
both implementations: the buffers hold exactly the chosen messages' fields, and C and the twin
give identical buffers or identical errors, for good batches and damaged ones."""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable
from types import ModuleType

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from raftmq.common.message import Message
from raftmq.common.record_batch import (
    MalformedBatchError,
    ProducerSequence,
    UnsupportedBatchError,
)
from raftmq.common.stored_batch import RECORD_HEAD_BYTES, BatchColumns, implementations
from tests.common.test_stored_batch import (
    TOPIC,
    Args,
    _error,
    _needs_both,
    batch_args,
    damaged,
    i64,
    sb,
    small_batch,
    u64,
)

__all__ = ["sb"]  # the module fixture: every test taking `sb` runs against both


def _i32s(raw: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(raw) // 4}i", raw))


def _i64s(raw: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(raw) // 8}q", raw))


def _strings(offsets: bytes, data: bytes) -> list[bytes]:
    o = _i32s(offsets)
    assert o[0] == 0 and o == sorted(o) and o[-1] == len(data)
    return [data[a:b] for a, b in itertools.pairwise(o)]


def _bit(bitmap: bytes, i: int) -> bool:
    return bool(bitmap[i >> 3] >> (i & 7) & 1)


def rows(c: BatchColumns) -> list[tuple[object, ...]]:
    """The buffers read back as one tuple per message (a reader independent of pyarrow)."""
    positions = _i64s(c.positions)
    n = len(positions)
    for bitmap in (c.key_valid, c.tag_valid):
        assert len(bitmap) == (n + 7) // 8
        assert all(not _bit(bitmap, i) for i in range(n, len(bitmap) * 8))  # padding is 0
    bodies = _strings(c.body_offsets, c.body_data)
    first_keys = _strings(c.key_offsets, c.key_data)
    tags = _strings(c.tag_offsets, c.tag_data)
    key_items = _strings(c.keys_item_offsets, c.keys_data)
    names = _strings(c.prop_name_offsets, c.prop_name_data)
    values = _strings(c.prop_value_offsets, c.prop_value_data)
    keys_at, props_at = _i32s(c.keys_offsets), _i32s(c.props_offsets)
    assert len(keys_at) == len(props_at) == n + 1 and len(names) == len(values)
    born = _i64s(c.born_ms)
    out = []
    for i in range(n):
        out.append(
            (
                positions[i],
                bodies[i],
                first_keys[i].decode() if _bit(c.key_valid, i) else None,
                tags[i].decode() if _bit(c.tag_valid, i) else None,
                tuple(k.decode() for k in key_items[keys_at[i] : keys_at[i + 1]]),
                {
                    names[j].decode(): values[j].decode()
                    for j in range(props_at[i], props_at[i + 1])
                },
                born[i],
            )
        )
        # A row without a first key or tag holds no bytes for it.
        assert _bit(c.key_valid, i) or not first_keys[i]
        assert _bit(c.tag_valid, i) or not tags[i]
    return out


@given(args=batch_args(), stamp=st.none() | st.tuples(u64, i64), data=st.data())
@settings(deadline=None)
def test_columns_hold_the_chosen_messages(
    sb: ModuleType, args: Args, stamp: tuple[int, int] | None, data: st.DataObject
) -> None:
    buf = sb.encode_batch(*args)
    if stamp is not None:
        stamped = bytearray(buf)
        sb.stamp(stamped, *stamp)
        buf = bytes(stamped)
    msgs = args[2]
    chosen = sorted(data.draw(st.sets(st.integers(0, len(msgs) - 1))))
    c = sb.columns(buf, chosen)
    assert c.header == sb.read_header(buf)
    want = [
        (
            p,
            msgs[p].body,
            msgs[p].keys[0] if msgs[p].keys else None,
            msgs[p].tags,
            msgs[p].keys,
            msgs[p].properties,
            msgs[p].born_timestamp_ms,
        )
        for p in chosen
    ]
    assert rows(c) == want


def test_positions_must_be_in_the_batch_and_ascending(sb: ModuleType) -> None:
    buf = small_batch(sb)
    for positions, text in (
        ([3], "position 3 is not in a batch of 3 messages"),
        ([-1], "position -1 is not in a batch of 3 messages"),
        ([1, 1], "positions are not ascending: 1 after 1"),
        ([2, 0], "positions are not ascending: 0 after 2"),
        ([1 << 70], f"position {1 << 70} is not in a batch of 3 messages"),
    ):
        with pytest.raises(MalformedBatchError, match=text):
            sb.columns(buf, positions)
    empty = sb.columns(buf, [])
    assert rows(empty) == [] and _i32s(empty.body_offsets) == [0]


def _record(buf: bytes, sb: ModuleType, k: int) -> int:
    h = sb.read_header(buf)
    return int(h.records_at + sb.message_offsets(buf, h)[k])


def _damaged_record(sb: ModuleType, at_head: int, fmt: str, value: int) -> bytes:
    """small_batch with a field of record 2's head (or its bytes after the head) changed."""
    buf = bytearray(small_batch(sb))
    struct.pack_into(fmt, buf, _record(bytes(buf), sb, 2) + at_head, value)
    return bytes(buf)


def test_bad_records_are_refused_naming_the_message(sb: ModuleType) -> None:
    """Each refusal of a record (with verify=False: the CRCs would catch these first) names the
    message's queue offset; positions before it still pass alone."""
    head, tag_at = RECORD_HEAD_BYTES, RECORD_HEAD_BYTES  # record 2's tag is "" (0 bytes)
    cases = [
        # tag length past the record: the lengths disagree with the offsets table
        (_damaged_record(sb, 16, "<H", 50), "record of message at queue offset 2: its lengths"),
        # first key's length past the keys
        (_damaged_record(sb, tag_at, "<H", 300), "key of 300 bytes overruns the keys"),
        # the key count says 3 keys where 2 are: the third's length overruns
        (_damaged_record(sb, 18, "<H", 3), "key length overruns the keys of the message"),
        # one key fewer: the second key's bytes are left over
        (_damaged_record(sb, 18, "<H", 1), "10 bytes after the keys of the message"),
    ]
    for buf, text in cases:
        with pytest.raises(MalformedBatchError, match=text):
            sb.columns(buf, [0, 2], verify=False)
        sb.columns(buf, [0, 1], verify=False)  # untouched records
    with pytest.raises(MalformedBatchError, match="body CRC mismatch"):
        sb.columns(cases[0][0], [0])
    # invalid utf-8 in the tag: record 0's tag "TagA" gets a 0xFF
    buf = bytearray(small_batch(sb))
    buf[_record(bytes(buf), sb, 0) + head] = 0xFF
    with pytest.raises(MalformedBatchError, match="invalid utf-8 in a message tag: 'utf-8'"):
        sb.columns(bytes(buf), [0], verify=False)
    # a property name twice, then a property value running past the record
    msgs = [Message(TOPIC, b"x", None, (), {"ab": "1", "cd": "2"})]
    raw = bytearray(sb.encode_batch(TOPIC, 1, msgs, ProducerSequence("p", 1)))
    at = bytes(raw).rindex(b"cd")
    raw[at : at + 2] = b"ab"
    with pytest.raises(MalformedBatchError, match="property 'ab' twice in the message at queue"):
        sb.columns(bytes(raw), [0], verify=False)
    raw[at - 4 : at - 2] = struct.pack("<H", 9)  # the low half of the value's u32 length
    with pytest.raises(MalformedBatchError, match="property overruns the properties"):
        sb.columns(bytes(raw), [0], verify=False)


def _outcome(fn: Callable[..., object], *args: object, **kwargs: object) -> tuple[object, ...]:
    try:
        return ("ok", fn(*args, **kwargs))
    except Exception as exc:
        return _error(exc)


@st.composite
def damaged_records(draw: st.DrawFn) -> bytes:
    """A good batch with bytes changed inside its records (heads, tags, keys, properties)."""
    py = implementations()["python"]
    buf = bytearray(py.encode_batch(*draw(batch_args())))
    h = py.read_header(buf)
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(h.records_at, len(buf) - 1))
        buf[i] = (
            draw(st.sampled_from([0, 1, 2, 0xFF, 0x80, 0xC3]))
            if draw(st.booleans())
            else (draw(st.integers(0, 255)))
        )
    return bytes(buf)


@given(buf=damaged() | damaged_records(), data=st.data())
@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=100, deadline=None)
@example(buf=b"", data=None)
def test_the_extension_fills_columns_as_the_twin(buf: bytes, data: st.DataObject | None) -> None:
    """Identical buffers or the identical error, whatever the damage and positions; the C code
    never raises anything but MalformedBatchError for bad bytes."""
    py, c = _needs_both()
    positions: list[int] = [] if data is None else sorted(data.draw(st.sets(st.integers(0, 9))))
    if data is not None and data.draw(st.integers(0, 9)) == 0:
        positions.reverse()
    for verify in (True, False):
        want = _outcome(py.columns, buf, positions, verify=verify)
        assert _outcome(c.columns, buf, positions, verify=verify) == want
        # A damaged version byte or flag reads as a newer format (its subclass, which says to
        # upgrade): Hypothesis found one; anything else is a MalformedBatchError itself.
        assert want[0] == "ok" or want[1] in (MalformedBatchError, UnsupportedBatchError), want


def test_a_damaged_version_byte_reads_as_a_newer_format_in_both() -> None:
    """The case Hypothesis found for the property above: a version past the newest in a good
    batch."""
    py, c = _needs_both()
    buf = bytearray(small_batch(py))
    buf[1] = 4  # the version byte
    for verify in (True, False):
        want = _outcome(py.columns, bytes(buf), [0], verify=verify)
        assert want[1] is UnsupportedBatchError and "upgrade raftmq" in str(want[2]), want
        assert _outcome(c.columns, bytes(buf), [0], verify=verify) == want


def test_the_extension_fills_columns_without_leaking() -> None:
    import gc
    import sys

    _, c = _needs_both()
    msgs = [Message(TOPIC, bytes(100), "TagA", ("k", "é"), {"p": "v"}, 0, 1) for _ in range(64)]
    buf = bytearray(c.encode_batch(TOPIC, 1, msgs))
    c.stamp(buf, 10, 20)
    raw = bytes(buf)
    bad = bytearray(raw)
    bad[_record(raw, c, 5) + RECORD_HEAD_BYTES] = 0xFF

    def once() -> None:
        c.columns(raw, range(0, 64, 2))
        c.columns(memoryview(raw), [1, 2, 63], verify=False)
        for args in ((raw, [5, 3]), (bytes(bad), [4, 5])):
            with pytest.raises(MalformedBatchError):
                c.columns(*args, verify=False)

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
