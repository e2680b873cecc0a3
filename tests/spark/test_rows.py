"""The source's rows from a raw pull answer (pure, no SparkSession): one row per named message
below the end offset whose tag passes the filter, in offset order, every column from the
message it names."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.client.raw_batch import named_messages
from raftmq.common import stored_batch
from raftmq.common.filter.tag import MATCH_ALL, TagFilter
from raftmq.common.message import Message, encode_msg_id
from raftmq.common.pb import broker_pb2
from raftmq.common.record_batch import MalformedBatchError, ProduceBatch
from raftmq.spark_source.schema import (
    BORN_MAX_MS,
    BORN_MIN_MS,
    COLUMNS,
    _decoded_rows,
    arrow_schema,
    combine,
    pull_parts,
    to_record_batch,
)
from tests.client.test_raw_batch import answers


@settings(max_examples=60, deadline=None)
@given(answers(), st.integers(0, 40), st.booleans())
def test_rows_are_the_named_messages_below_the_end_that_pass_the_tag_filter(
    answer: tuple[list[ProduceBatch], list[broker_pb2.RawBatch]], cut: int, by_tag: bool
) -> None:
    batches, raws = answer
    topic, queue = batches[0].topic, batches[0].queue_id
    end = raws[0].first_offset + cut
    first_tag = batches[0].messages[raws[0].positions[0]].tags
    tag_filter = (
        TagFilter("x", frozenset({first_tag or ""}), None) if by_tag else TagFilter("*", None, None)
    )
    want = [
        (r.first_offset + p, r, p, b.messages[p])
        for b, r in zip(batches, raws, strict=True)
        for p in r.positions
        if r.first_offset + p < end and tag_filter.matches(b.messages[p].tags)
    ]
    rb = to_record_batch(raws, topic, "broker-a", queue, end_offset=end, tag_filter=tag_filter)
    assert rb.schema == arrow_schema() and tuple(rb.schema.names) == COLUMNS
    assert rb.column("bornTimestamp").cast("int64").to_pylist() == [
        m.born_timestamp_ms * 1000
        if m.born_timestamp_ms and BORN_MIN_MS <= m.born_timestamp_ms <= BORN_MAX_MS
        else None
        for _, _, _, m in want
    ]
    rows = rb.drop_columns(["bornTimestamp"]).to_pylist()
    assert [row["queueOffset"] for row in rows] == [o for o, _, _, _ in want]
    for row, (_, r, p, m) in zip(rows, want, strict=True):
        assert row["value"] == m.body
        assert row["msgId"] == encode_msg_id("broker-a", r.raft_index, r.slot, p)
        assert (row["topic"], row["brokerName"], row["queueId"]) == (topic, "broker-a", queue)
        assert row["tags"] == (m.tags or None)
        assert row["keys"] == list(m.keys)
        assert row["key"] == (m.keys[0] if m.keys else None)
        assert dict(row["properties"]) == m.properties


@st.composite
def mixed_answers(draw: st.DrawFn) -> tuple[str, int, list[broker_pb2.RawBatch]]:
    """A pull answer as a store of both formats gives it: each batch of `answers()` kept as a v1
    record batch or re-encoded as a stamped v2 stored batch (one born host per v2 batch)."""
    batches, raws = draw(answers())
    out = []
    for b, raw in zip(batches, raws, strict=True):
        r = raw
        if draw(st.booleans()):
            msgs = [replace(m, born_host="") for m in b.messages]
            chunk = bytearray(stored_batch.encode_batch(b.topic, b.queue_id, msgs))
            stored_batch.stamp(chunk, r.first_offset, r.store_timestamp_ms)
            r = broker_pb2.RawBatch(
                raft_index=r.raft_index,
                slot=r.slot,
                first_offset=r.first_offset,
                store_timestamp_ms=r.store_timestamp_ms,
                chunk=bytes(chunk),
                positions=r.positions,
                byte_offsets=r.byte_offsets,  # unused by v2 readers
            )
        out.append(r)
    return batches[0].topic, batches[0].queue_id, out


@settings(max_examples=50, deadline=None)
@given(mixed_answers(), st.integers(0, 40), st.sampled_from(["*", "first", "none"]))
def test_columns_of_v2_batches_equal_the_row_path(
    answer: tuple[str, int, list[broker_pb2.RawBatch]], cut: int, tags: str
) -> None:
    """The columnar path (v2 batches) gives the very Arrow batch the row-by-row decoder gives
    (the reference for both formats), with the end cut and the tag filter, in one batch."""
    topic, queue, raws = answer
    end = raws[0].first_offset + cut
    first_tag = next(iter(named_messages(raws[:1], "broker-a", queue)))[3].tags
    tag_filter = {
        "*": TagFilter("*", None, None),
        "first": TagFilter("x", frozenset({first_tag or ""}), None),
        "none": TagFilter("x", frozenset({"no-such-tag"}), None),
    }[tags]
    got = to_record_batch(raws, topic, "broker-a", queue, end_offset=end, tag_filter=tag_filter)
    want = _decoded_rows(raws, topic, "broker-a", queue, end_offset=end, tag_filter=tag_filter)
    assert got.schema == arrow_schema()
    got.validate(full=True)
    assert got.equals(want), (got.to_pydict(), want.to_pydict())


@settings(max_examples=40, deadline=None)
@given(st.lists(mixed_answers(), min_size=2, max_size=4), st.sampled_from(["*", "first"]))
def test_parts_of_several_answers_combine_to_their_rows_in_order(
    answers: list[tuple[str, int, list[broker_pb2.RawBatch]]], tags: str
) -> None:
    """What a Spark task hands over: the parts of several pull answers (of several queues and
    topics), finished together, are each answer's rows in order: every per-batch value (topic,
    queue, offsets, ids, store time) stays with its own rows."""
    first_tag = next(iter(named_messages(answers[0][2][:1], "broker-a", answers[0][1])))[3].tags
    tag_filter = (
        TagFilter("x", frozenset({first_tag or ""}), None) if tags == "first" else MATCH_ALL
    )
    parts = []
    want = []
    for i, (topic, queue, raws) in enumerate(answers):
        group = f"broker-{i}"
        end = 1 << 62
        parts += pull_parts(raws, topic, group, queue, end_offset=end, tag_filter=tag_filter)
        want.append(_decoded_rows(raws, topic, group, queue, end_offset=end, tag_filter=tag_filter))
    got = combine(parts, tag_filter)
    got.validate(full=True)
    assert got.to_pylist() == [row for w in want for row in w.to_pylist()]


def test_a_v2_batch_of_another_queue_is_refused() -> None:
    chunk = bytearray(stored_batch.encode_batch("t", 3, [Message("t", b"x")]))
    stored_batch.stamp(chunk, 0, 1)
    raw = broker_pb2.RawBatch(raft_index=1, chunk=bytes(chunk), positions=[0], byte_offsets=[0])
    for topic, queue in (("t", 4), ("u", 3)):
        with pytest.raises(MalformedBatchError, match="batch 1/0 is for t/3"):
            to_record_batch([raw], topic, "g", queue, end_offset=9, tag_filter=MATCH_ALL)
