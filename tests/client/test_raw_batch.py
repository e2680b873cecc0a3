"""Pull answers of raw record batches: every named message, in order, with its id and offset,
and a batch that does not match the answer refused before anything of it is used."""

from __future__ import annotations

import pickle
import struct
from dataclasses import replace

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.client.messages import ReceivedMessage
from raftmq.client.raw_batch import decode_batches, named_messages, received_messages
from raftmq.common import stored_batch
from raftmq.common.message import Message, encode_msg_id
from raftmq.common.pb import broker_pb2
from raftmq.common.record_batch import (
    MalformedBatchError,
    ProduceBatch,
    decode_with_offsets,
    encode,
)
from tests.broker.test_record_batch import produce_batches


@st.composite
def answers(draw: st.DrawFn) -> tuple[list[ProduceBatch], list[broker_pb2.RawBatch]]:
    """Batches of one queue as a pull answers them: each with a subset of its positions."""
    first = draw(produce_batches())
    # A topic has at most 0xFFFF queues (the record format carries a u32).
    first = replace(first, queue_id=draw(st.integers(0, 0xFFFF)))
    more = draw(st.lists(produce_batches(), max_size=3))
    batches = [first] + [
        ProduceBatch(
            first.topic,
            first.queue_id,
            b.store_timestamp_ms,
            tuple(replace(m, topic=first.topic) for m in b.messages),
            b.producer,
        )
        for b in more
    ]
    raws = []
    offset = draw(st.integers(0, 1 << 40))
    for i, b in enumerate(batches):
        data = encode(b)
        _, at = decode_with_offsets(data)
        keep = sorted(draw(st.sets(st.integers(0, len(b.messages) - 1), min_size=1)))
        raws.append(
            broker_pb2.RawBatch(
                raft_index=10 + i,
                slot=i % 3,
                first_offset=offset,
                store_timestamp_ms=b.store_timestamp_ms % 253_402_300_800_000,  # the leader's clock
                chunk=data,
                positions=keep,
                byte_offsets=[at[p] for p in keep],
            )
        )
        offset += len(b.messages)
    return batches, raws


@settings(max_examples=60, deadline=None)
@given(answers())
def test_every_named_message_in_order_with_its_id(
    answer: tuple[list[ProduceBatch], list[broker_pb2.RawBatch]],
) -> None:
    batches, raws = answer
    queue = batches[0].queue_id
    want = [
        (r.first_offset + p, encode_msg_id("broker-a", r.raft_index, r.slot, p), b.messages[p])
        for b, r in zip(batches, raws, strict=True)
        for p in r.positions
    ]
    got = [
        (r.first_offset + p, mid, m)
        for r, p, mid, m in named_messages(raws, "broker-a", queue, batches[0].topic)
    ]
    assert got == want
    stored = decode_batches(raws, "broker-a", queue)
    assert [(s.queue_offset, s.msg_id, s.message) for s in stored] == want


@settings(max_examples=60, deadline=None)
@given(answers())
def test_a_batch_of_another_queue_or_topic_is_refused(
    answer: tuple[list[ProduceBatch], list[broker_pb2.RawBatch]],
) -> None:
    batches, raws = answer
    queue, topic = batches[0].queue_id, batches[0].topic
    with pytest.raises(MalformedBatchError):
        list(named_messages(raws, "broker-a", queue + 1))
    with pytest.raises(MalformedBatchError):
        list(named_messages(raws, "broker-a", queue, topic + "x"))


@settings(max_examples=60, deadline=None)
@given(answers(), st.integers(-3, 3))
def test_a_position_outside_its_batch_is_refused(
    answer: tuple[list[ProduceBatch], list[broker_pb2.RawBatch]], shift: int
) -> None:
    batches, raws = answer
    bad = raws[-1]
    count = len(batches[-1].messages)
    bad.positions[-1] = count + shift if shift >= 0 else shift
    with pytest.raises(MalformedBatchError):
        list(named_messages(raws, "broker-a", batches[0].queue_id))


@settings(max_examples=30, deadline=None)
@given(answers(), st.data())
def test_offsets_outside_the_request_or_out_of_order_are_refused(
    answer: tuple[list[ProduceBatch], list[broker_pb2.RawBatch]], data: st.DataObject
) -> None:
    """Issue 25: what the client asked for (from `offset`) and the answer says (up to
    next_offset) bound every offset, in order; a broker serving another batch's rows there (a
    wrong index row) is caught here too, whatever its own checks did."""
    batches, raws = answer
    queue = batches[0].queue_id
    offsets = [r.first_offset + p for r in raws for p in r.positions]
    asked, after = offsets[0], offsets[-1] + 1
    assert len(decode_batches(raws, "broker-a", queue, offsets=(asked, after))) == len(offsets)
    bad = data.draw(
        st.sampled_from(["above the request", "past next offset", "repeated batch"]), label="bad"
    )
    if bad == "above the request":
        window = (asked + 1, after)
    elif bad == "past next offset":
        window = (asked, after - 1)
    else:
        raws = [*raws, raws[-1]]
        window = (asked, after)
    with pytest.raises(MalformedBatchError):
        decode_batches(raws, "broker-a", queue, offsets=window)
    with pytest.raises(MalformedBatchError):  # the consumer's lazy path checks the same
        received_messages(raws, "broker-a", queue, offsets=window)


def _v2_raw(
    messages: list[Message], raft_index: int, first_offset: int, keep: list[int]
) -> broker_pb2.RawBatch:
    """A stamped v2 batch as a pull answers it (stored chunks are sent unchanged)."""
    buf = bytearray(stored_batch.encode_batch(messages[0].topic, 7, messages, None, "h:1"))
    stamped_ms = 1_700_000_000_123
    stored_batch.stamp(buf, 0, stamped_ms)
    return broker_pb2.RawBatch(
        raft_index=raft_index,
        slot=1,
        first_offset=first_offset,
        store_timestamp_ms=stamped_ms,
        chunk=bytes(buf),
        positions=keep,
        byte_offsets=[0] * len(keep),  # v2 finds records through its offsets table
    )


_texts = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=8)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.binary(min_size=1, max_size=40),
            st.none() | _texts,
            st.lists(_texts, max_size=2),
            st.dictionaries(_texts, _texts, max_size=2),
        ),
        min_size=1,
        max_size=12,
    ),
    st.data(),
)
def test_a_pulled_v2_batch_gives_lazy_messages_equal_to_decoded_ones(
    fields: list[tuple[bytes, str | None, list[str], dict[str, str]]], data: st.DataObject
) -> None:
    """received_messages (lazy: fields decoded when read) gives what the eager decode gives,
    field for field, for v2 batches and a v1 batch in one answer; read in any order."""
    messages = [
        Message("Orders", body, tag, tuple(keys), props, 0, 1_700_000_000_000 + i, "h:1")
        for i, (body, tag, keys, props) in enumerate(fields)
    ]
    keep = sorted(data.draw(st.sets(st.integers(0, len(messages) - 1), min_size=1)))
    v1 = ProduceBatch("Orders", 7, 5, tuple(messages), None)
    v1_data = encode(v1)
    _, at = decode_with_offsets(v1_data)
    raws = [
        _v2_raw(messages, 10, 100, keep),
        broker_pb2.RawBatch(
            raft_index=11,
            slot=0,
            first_offset=100 + len(messages),
            store_timestamp_ms=5,
            chunk=v1_data,
            positions=keep,
            byte_offsets=[at[p] for p in keep],
        ),
    ]
    eager = [
        ReceivedMessage(
            m.topic,
            m.body,
            m.tags,
            m.keys,
            m.properties,
            "broker-a",
            7,
            r.first_offset + p,
            mid,
            r.store_timestamp_ms,
            m.born_timestamp_ms,
            m.born_host,
        )
        for r, p, mid, m in named_messages(raws, "broker-a", 7, "Orders")
    ]
    lazy = received_messages(raws, "broker-a", 7)
    order = data.draw(st.permutations(["properties", "keys", "tags", "body", "msg_id"]))
    for got in lazy:  # each field read first in a drawn order, then all compared
        for name in order:
            getattr(got, name)
    assert lazy == eager
    assert [pickle.loads(pickle.dumps(m)) for m in lazy] == eager
    assert [m.queue_offset for m in lazy[: len(keep)]] == [100 + p for p in keep]
    retried = lazy[0].replace(topic="Other", reconsume_times=2)
    assert (retried.topic, retried.reconsume_times, retried.body) == ("Other", 2, lazy[0].body)


def test_a_field_that_does_not_decode_fails_when_read_not_the_pull() -> None:
    """A record whose tag is not UTF-8 (a hostile producer's, CRCs made to match): the pull
    answer still gives its message; reading the tag raises MalformedBatchError, the body
    reads. The eager decode refused the whole answer, so the queue could not move past it."""
    good = Message("Orders", b"body-0", "ab", (), {}, 0, 1, "h:1")
    raw = _v2_raw([good, replace(good, body=b"body-1", tags=None)], 10, 0, [0, 1])
    chunk = bytearray(raw.chunk)
    at = bytes(chunk).index(b"ab")
    chunk[at : at + 2] = b"\xff\xfe"
    struct.pack_into("<I", chunk, 12, crc32c.crc32c(memoryview(chunk)[32:]))  # body CRC
    struct.pack_into(  # stamp CRC over [0, 8) and [12, 32)
        "<I", chunk, 8, crc32c.crc32c(memoryview(chunk)[12:32], crc32c.crc32c(chunk[:8]))
    )
    raw.chunk = bytes(chunk)
    with pytest.raises(MalformedBatchError):
        decode_batches([raw], "broker-a", 7)  # eager: the whole answer fails
    first, second = received_messages([raw], "broker-a", 7)
    assert first.body == b"body-0" and second.tags is None and second.body == b"body-1"
    with pytest.raises(MalformedBatchError):
        _ = first.tags
