"""The source's rows from a raw pull answer (pure, no SparkSession): one row per named message
below the end offset whose tag passes the filter, in offset order, every column from the
message it names."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.common.filter.tag import TagFilter
from raftmq.common.message import encode_msg_id
from raftmq.common.pb import broker_pb2
from raftmq.common.record_batch import ProduceBatch
from raftmq.spark_source.schema import (
    BORN_MAX_MS,
    BORN_MIN_MS,
    COLUMNS,
    arrow_schema,
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
