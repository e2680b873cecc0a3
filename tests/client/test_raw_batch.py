"""Pull answers of raw record batches: every named message, in order, with its id and offset,
and a batch that does not match the answer refused before anything of it is used."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.client.raw_batch import decode_batches, named_messages
from raftmq.common.message import encode_msg_id
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
