"""Trace records: encode/decode round trips (property), strict decoding of bad bytes, the path of
a message through retries and the DLQ, and the bounded batching buffer (never blocks, counts
drops, batches by count, bytes and age, loses nothing it accepted)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.common.trace import (
    ConsumeTrace,
    EndTransactionTrace,
    MalformedTraceError,
    MoveKind,
    MoveTrace,
    SendTrace,
    TraceBuffer,
    TraceRecord,
    decode_batch,
    decode_record,
    encode_batch,
    encode_record,
    path_of,
    records_of,
)

text = st.text(max_size=20)
ints = st.integers(-(1 << 62), 1 << 62)
records = st.one_of(
    st.builds(
        SendTrace,
        msg_id=text, timestamp_ms=ints, topic=text, producer_group=text, client_id=text,
        keys=st.lists(text, max_size=4).map(tuple), tags=st.none() | text,
        broker_group=text, queue_id=ints, queue_offset=ints, store_ms=ints, cost_ms=ints,
        success=st.booleans(), kind_of_send=text,
    ),
    st.builds(
        ConsumeTrace,
        msg_id=text, timestamp_ms=ints, topic=text, group=text, client_id=text, status=text,
        reconsume_times=ints, cost_ms=ints, origin_msg_id=text, broker_group=text,
        queue_id=ints, queue_offset=ints,
    ),
    st.builds(
        EndTransactionTrace,
        msg_id=text, timestamp_ms=ints, topic=text, producer_group=text, transaction_id=text,
        resolution=text, from_check=st.booleans(),
    ),
    st.builds(
        MoveTrace,
        msg_id=text, timestamp_ms=ints, move=st.sampled_from(MoveKind), group=text,
        from_topic=text, to_topic=text, reconsume_times=ints, new_msg_id=text, delay_ms=ints,
    ),
)  # fmt: skip


@given(records)
def test_record_round_trip(record: TraceRecord) -> None:
    line = encode_record(record)
    assert b"\n" not in line
    assert decode_record(line) == record


@given(st.lists(records, max_size=10))
def test_batch_round_trip(batch: list[TraceRecord]) -> None:
    assert decode_batch(encode_batch(batch)) == batch


def test_defaults_may_be_left_out_and_text_is_readable() -> None:
    line = b'{"v":1,"k":"send","msg_id":"a","timestamp_ms":5,"topic":"t","producer_group":"p",'
    line += b'"client_id":"c"}'
    assert decode_record(line) == SendTrace("a", 5, "t", "p", "c")
    assert b'"k":"move"' in encode_record(MoveTrace("a", 1, MoveKind.DEAD_LETTER, "g", "t", "d", 3))


@pytest.mark.parametrize(
    ("line", "words"),
    [
        (b"not json", "not JSON"),
        (b"[1]", "not a JSON object"),
        (b'{"v":2,"k":"send"}', "version 2"),
        (b'{"v":1,"k":"gossip"}', "unknown trace record kind"),
        (b'{"v":1,"k":"send","msg_id":"a"}', "timestamp_ms is missing"),
        (b'{"v":1,"k":"end_transaction","msg_id":"a","timestamp_ms":1,"topic":"t",'
         b'"producer_group":"p","transaction_id":"x","resolution":"commit","extra":1}',
         "unknown fields"),
        (b'{"v":1,"k":"send","msg_id":"a","timestamp_ms":"5","topic":"t","producer_group":"p",'
         b'"client_id":"c"}', "not an integer"),
        (b'{"v":1,"k":"send","msg_id":"a","timestamp_ms":true,"topic":"t","producer_group":"p",'
         b'"client_id":"c"}', "not an integer"),
        (b'{"v":1,"k":"send","msg_id":"a","timestamp_ms":1,"topic":"t","producer_group":"p",'
         b'"client_id":"c","keys":[1]}', "list of strings"),
        (b'{"v":1,"k":"move","msg_id":"a","timestamp_ms":1,"move":"x","group":"g",'
         b'"from_topic":"t","to_topic":"u","reconsume_times":1}', "move kind"),
        (b"\xff\xfe", "not JSON"),
    ],
)  # fmt: skip
def test_malformed_records_are_refused(line: bytes, words: str) -> None:
    with pytest.raises(MalformedTraceError, match=words):
        decode_record(line)


def test_path_follows_retries_and_the_dlq() -> None:
    life: list[TraceRecord] = [
        ConsumeTrace("r2", 300, "%RETRY%g", "g", "c", "exception", 1, origin_msg_id="m1"),
        SendTrace("m1", 100, "orders", "pg", "p1", store_ms=101),
        ConsumeTrace("m1", 200, "orders", "g", "c", "exception"),
        MoveTrace("m1", 250, MoveKind.RETRY, "g", "orders", "%RETRY%g", 1, "r2", 10_000),
        MoveTrace("m1", 350, MoveKind.DEAD_LETTER, "g", "%RETRY%g", "%DLQ%g", 2, "d3"),
        SendTrace("other", 150, "orders", "pg", "p1"),
    ]
    path = path_of("m1", life)
    assert [(type(r).__name__, r.timestamp_ms) for r in path] == [
        ("SendTrace", 100),
        ("ConsumeTrace", 200),
        ("MoveTrace", 250),
        ("ConsumeTrace", 300),
        ("MoveTrace", 350),
    ]
    assert path_of("unknown", life) == []


def send(i: int, pad: int = 0) -> SendTrace:
    return SendTrace(f"m{i}", i, "orders", "pg", "p" * pad)


def test_batches_by_count_age_and_bytes() -> None:
    buf = TraceBuffer(max_buffered=10, max_batch_records=3, max_batch_bytes=10_000, max_age_ms=100)
    assert buf.take(0) is None and buf.next_deadline_ms() is None
    buf.add(send(1), now_ms=0)
    assert buf.take(99) is None and buf.next_deadline_ms() == 100
    batch = buf.take(100)
    assert batch is not None and batch.count == 1 and batch.keys == ("m1",)
    for i in range(4):
        buf.add(send(i), now_ms=200)
    batch = buf.take(200)
    assert batch is not None and batch.count == 3, "full by count, before any age"
    assert buf.take(200) is None and len(buf) == 1
    assert buf.take(200, flush=True) is not None and len(buf) == 0

    small = TraceBuffer(max_batch_records=100, max_batch_bytes=400, max_age_ms=10_000)
    for i in range(6):
        small.add(send(i, pad=50), now_ms=0)
    batch = small.take(0)
    assert batch is not None and 0 < len(batch.body) <= 400 and batch.count < 6


def test_full_buffer_drops_and_counts_never_raises() -> None:
    buf = TraceBuffer(max_buffered=2, max_batch_bytes=1_000)
    assert buf.add(send(1), 0) and buf.add(send(2), 0)
    assert not buf.add(send(3), 0)
    assert not buf.add(send(4, pad=2_000), 0)
    assert buf.dropped_full == 2 and buf.dropped == 2
    buf.take(0, flush=True)
    assert not buf.add(send(5, pad=2_000), 0), "larger than a batch"
    assert buf.dropped_oversize == 1 and buf.added == 2
    with pytest.raises(ValueError):
        TraceBuffer(max_buffered=0)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.one_of(st.tuples(st.just("add"), st.integers(0, 60)),
                       st.tuples(st.just("take"), st.integers(0, 300))), max_size=80),
    st.integers(1, 8),
    st.integers(200, 2_000),
)  # fmt: skip
def test_accepted_records_come_out_once_in_order_within_bounds(
    script: list[tuple[str, int]], max_records: int, max_bytes: int
) -> None:
    buf = TraceBuffer(
        max_buffered=16, max_batch_records=max_records, max_batch_bytes=max_bytes, max_age_ms=250
    )
    now = 0
    accepted: list[TraceRecord] = []
    batches = []
    for i, (op, arg) in enumerate(script):
        if op == "add":
            record = send(i, pad=arg)
            if buf.add(record, now):
                accepted.append(record)
        else:
            now += arg
            batch = buf.take(now)
            if batch is not None:
                assert batch.count <= max_records and len(batch.body) <= max_bytes
                batches.append(batch)
        assert len(buf) <= 16
    while (batch := buf.take(now, flush=True)) is not None:
        batches.append(batch)
    assert records_of(batches) == accepted
    assert buf.added == len(accepted) and buf.added + buf.dropped == sum(
        1 for op, _ in script if op == "add"
    )
