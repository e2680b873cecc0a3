"""Pure planning of the Spark source and sink: offset JSON round trips in one fixed order, option
validation messages, backlog-proportional limits, new and vanished queues, AvailableNow caps,
minOffsetsPerTrigger, data-loss decisions, and the sink's deterministic chunks and ids."""

from __future__ import annotations

import itertools
import json
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.client.accumulator import Accumulator, Batch
from raftmq.client.queue_selector import PublishQueues, select_by_key
from raftmq.common.stored_batch import BodyColumn
from raftmq.common.types import QueueRef
from raftmq.spark_source import offsets as oj
from raftmq.spark_source.options import (
    OptionError,
    PositionKind,
    SubscriptionKind,
    parse_sink_options,
    parse_source_options,
)
from raftmq.spark_source.planning import (
    DataLossError,
    QueueBounds,
    QueueRange,
    backlog,
    check_start,
    group_ranges,
    hold_back,
    plan_end,
    plan_ranges,
    proportional,
    resolve_position,
    split_ranges,
    task_rows,
    time_lookups,
)
from raftmq.spark_source.sink_plan import (
    Chunk,
    SequenceChunker,
    job_producer_id,
    queue_indices,
    rows_per_queue,
    stream_producer_id,
)

NS = {"nameServer": "127.0.0.1:9876"}

queue_refs = st.builds(
    QueueRef,
    st.sampled_from(["orders", "b", "a-1", "z"]),
    st.sampled_from(["broker-a", "broker-b", "broker-c"]),
    st.integers(min_value=0, max_value=40),
)


def q(topic: str, group: str, qid: int) -> QueueRef:
    return QueueRef(topic, group, qid)


# ---- offsets JSON -------------------------------------------------------------------------------


@given(st.dictionaries(queue_refs, st.integers(min_value=0, max_value=2**62)))
def test_offsets_round_trip_and_canonical_text(values: dict[QueueRef, int]) -> None:
    text = oj.serialize(values)
    assert oj.parse(text) == values
    # Insertion order of the input never shows in the text; Spark compares the strings.
    shuffled = dict(sorted(values.items(), key=lambda kv: (kv[1], kv[0].queue_id), reverse=True))
    assert oj.serialize(shuffled) == text
    # What the Spark runner does with our dict (json.dumps without sort_keys) is stable too.
    assert json.dumps(oj.to_json_dict(shuffled)) == json.dumps(oj.to_json_dict(values))


def test_queue_ids_sort_numerically() -> None:
    values = {q("t", "broker-a", 10): 1, q("t", "broker-a", 2): 2, q("t", "broker-a", 1): 3}
    assert oj.serialize(values) == '{"t":{"broker-a":{"1":3,"2":2,"10":1}}}'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not valid JSON"),
        ("[1]", "JSON object"),
        ('{"t": 1}', "must map broker group names"),
        ('{"t": {"g": {"01": 1}}}', "queue id '01'"),
        ('{"t": {"g": {"-1": 1}}}', "queue id '-1'"),
        ('{"t": {"g": {"1": "5"}}}', "must be an integer"),
        ('{"t": {"g": {"1": true}}}', "must be an integer"),
        ('{"t": {"g": {"1": 1.5}}}', "must be an integer"),
    ],
)
def test_malformed_offsets_say_where(text: str, message: str) -> None:
    with pytest.raises(oj.OffsetsFormatError, match=message):
        oj.parse(text)


def test_assignment_parses_sorted_and_rejects_garbage() -> None:
    got = oj.parse_assignment('{"t": {"broker-b": [1, 0], "broker-a": [3]}}')
    assert got == (q("t", "broker-a", 3), q("t", "broker-b", 0), q("t", "broker-b", 1))
    for bad in ("{}", '{"t": []}', '{"t": {"g": []}}', '{"t": {"g": ["x"]}}', "nope"):
        with pytest.raises(oj.OffsetsFormatError):
            oj.parse_assignment(bad)


# ---- options ------------------------------------------------------------------------------------


def test_options_defaults_and_kafka_names() -> None:
    stream = parse_source_options({**NS, "subscribe": "b, a,a"}, streaming=True)
    assert stream.subscription.kind is SubscriptionKind.SUBSCRIBE
    assert stream.subscription.topics == ("a", "b")
    assert stream.starting.kind is PositionKind.LATEST and stream.fail_on_data_loss
    batch = parse_source_options({**NS, "subscribe": "a"}, streaming=False)
    assert batch.starting.kind is PositionKind.EARLIEST and batch.ending.kind is PositionKind.LATEST
    # Spark lower-cases keys; we accept either.
    lowered = parse_source_options(
        {"nameserver": "h:1;h:2", "subscribepattern": "ord.*", "maxoffsetspertrigger": "10"},
        streaming=True,
    )
    assert lowered.namesrv == ("h:1", "h:2") and lowered.max_offsets_per_trigger == 10
    assert lowered.subscription.pick_topics(["orders", "x", "ordx", "orders"]) == ["orders", "ordx"]
    assert batch.read_ahead_batches == 2
    off = parse_source_options({**NS, "subscribe": "a", "readAheadBatches": "0"}, streaming=False)
    assert off.read_ahead_batches == 0  # read on Spark's thread


@pytest.mark.parametrize(
    ("options", "streaming", "message"),
    [
        ({"subscribe": "a"}, True, "'nameServer' is required"),
        ({**NS}, True, "exactly one of"),
        ({**NS, "subscribe": "a", "assign": '{"a": {"g": [0]}}'}, True, "subscribe and assign"),
        ({**NS, "subscribe": "a", "subscribePattern": "a.*"}, True, "exactly one of"),
        ({**NS, "subscribePattern": "("}, True, "not a regular expression"),
        ({**NS, "subscribe": "bad topic!"}, True, "may only contain"),
        ({**NS, "subscribe": "a", "startingOffsets": "{"}, True, "not valid JSON"),
        ({**NS, "subscribe": "a", "startingOffsets": "newest"}, True, "earliest, latest"),
        (
            {**NS, "subscribe": "a", "startingOffsets": '{"b": {"g": {"0": 1}}}'},
            True,
            "does not read",
        ),
        ({**NS, "subscribe": "a", "startingOffsets": '{"a": {"g": {"0": -3}}}'}, True, "-3"),
        ({**NS, "subscribe": "a", "endingOffsets": "latest"}, True, "for batch queries"),
        ({**NS, "subscribe": "a", "endingOffsets": '{"a": {"g": {"0": -2}}}'}, False, "-2"),
        ({**NS, "subscribe": "a", "startingOffsets": "latest"}, False, "would read nothing"),
        (
            {**NS, "subscribe": "a", "startingOffsets": "earliest", "startingTimestamp": "5"},
            True,
            "at most one",
        ),
        ({**NS, "subscribe": "a", "startingTimestamp": "soon"}, True, "must be an integer"),
        ({**NS, "subscribe": "a", "maxOffsetsPerTrigger": "0"}, True, "within 1"),
        (
            {**NS, "subscribe": "a", "maxOffsetsPerTrigger": "5", "minOffsetsPerTrigger": "9"},
            True,
            "above",
        ),
        ({**NS, "subscribe": "a", "maxTriggerDelay": "5m"}, True, "only applies with"),
        (
            {**NS, "subscribe": "a", "minOffsetsPerTrigger": "5", "maxTriggerDelay": "soon"},
            True,
            "duration",
        ),
        ({**NS, "subscribe": "a", "failOnDataLoss": "yes"}, True, "true or false"),
        ({**NS, "subscribe": "a", "readAheadBatches": "9"}, True, "within 0..8"),
        ({**NS, "subscribe": "a", "subExpression": "||"}, True, "not a tag expression"),
        (
            {**NS, "subscribe": "a", "maxOffsetPerTrigger": "5"},
            True,
            "did you mean 'maxOffsetsPerTrigger'",
        ),
        ({"nameServer": "localhost", "subscribe": "a"}, True, "not host:port"),
        (
            {**NS, "assign": '{"a": {"g": [0]}}', "startingOffsets": '{"a": {"g": {"1": 0}}}'},
            True,
            "leaves out",
        ),
    ],
)
def test_bad_source_options(options: dict[str, str], streaming: bool, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        parse_source_options(options, streaming=streaming)


def test_batch_ignores_trigger_limits_with_a_warning() -> None:
    opts = parse_source_options(
        {**NS, "subscribe": "a", "maxOffsetsPerTrigger": "5"}, streaming=False
    )
    assert opts.max_offsets_per_trigger is None
    assert any("maxOffsetsPerTrigger" in w for w in opts.warnings)


def test_sink_options() -> None:
    got = parse_sink_options({**NS, "topic": "out", "checkpointLocation": "/x", "__x": "y"})
    assert got.topic == "out" and got.namesrv == ("127.0.0.1:9876",)
    with pytest.raises(OptionError, match="unknown option 'subscribe'"):
        parse_sink_options({**NS, "subscribe": "a"})
    with pytest.raises(OptionError, match=r"system topic|may only contain"):
        parse_sink_options({**NS, "topic": "bad topic"})
    assert parse_sink_options({**NS, "writeId": " nightly-2026.11_27 "}).write_id == (
        "nightly-2026.11_27"
    )
    for bad in ("", "a b", "x" * 81, "ümlaut"):
        with pytest.raises(OptionError, match="writeId: give 1 to 80"):
            parse_sink_options({**NS, "writeId": bad})


# ---- positions and ranges -----------------------------------------------------------------------


A0, A1, B0 = q("t", "broker-a", 0), q("t", "broker-a", 1), q("t", "broker-b", 0)
BOUNDS = {A0: QueueBounds(5, 50), A1: QueueBounds(0, 10), B0: QueueBounds(0, 0)}


def test_resolve_positions() -> None:
    opts = parse_source_options(
        {**NS, "subscribe": "t", "startingOffsets": '{"t": {"broker-a": {"0": -1, "1": 3}}}'},
        streaming=True,
    )
    assert resolve_position(opts.starting, BOUNDS, {}, fallback=PositionKind.EARLIEST) == {
        A0: 50,
        A1: 3,
        B0: 0,
    }
    ts = parse_source_options(
        {**NS, "subscribe": "t", "startingOffsetsByTimestamp": '{"t": {"broker-b": {"0": 77}}}'},
        streaming=True,
    )
    assert time_lookups(ts.starting, sorted(BOUNDS)) == {B0: 77}
    got = resolve_position(ts.starting, BOUNDS, {B0: 0}, fallback=PositionKind.LATEST)
    assert got == {A0: 50, A1: 10, B0: 0}
    unknown = parse_source_options(
        {**NS, "subscribe": "t", "startingOffsets": '{"t": {"broker-z": {"0": 1}}}'},
        streaming=True,
    )
    with pytest.raises(OptionError, match="broker-z/0, which the route"):
        resolve_position(unknown.starting, BOUNDS, {}, fallback=PositionKind.EARLIEST)


@given(
    st.dictionaries(queue_refs, st.integers(min_value=0, max_value=10**6)), st.integers(0, 10**6)
)
def test_proportional_split_properties(available: dict[QueueRef, int], limit: int) -> None:
    shares = proportional(available, limit)
    total = sum(available.values())
    assert set(shares) == set(available)
    assert sum(shares.values()) == min(limit, total)
    for queue, share in shares.items():
        assert 0 <= share <= available[queue]
        if total > limit:
            exact = limit * available[queue] / total
            assert abs(share - exact) < 1.0 + 1e-9
    assert proportional(available, limit) == shares  # deterministic


def test_plan_end_limits_new_and_vanished_queues() -> None:
    start = {A0: 10, A1: 0, q("t", "broker-c", 0): 7}  # broker-c is down: not in the bounds
    end = plan_end(start, BOUNDS, max_rows=20)
    # Backlogs 40 and 10 share 20 as 16 + 4; B0 is new and enters at its first offset.
    assert end == {A0: 26, A1: 4, B0: 0, q("t", "broker-c", 0): 7}
    assert backlog(start, end) == 20
    assert plan_ranges(start, end) == [QueueRange(A0, 10, 26), QueueRange(A1, 0, 4)]
    # Without a limit everything; with an AvailableNow target nothing past it, nothing new.
    assert plan_end(start, BOUNDS, max_rows=None)[A0] == 50
    capped = plan_end(start, BOUNDS, max_rows=None, target={A0: 30})
    assert capped == {A0: 30, A1: 0, q("t", "broker-c", 0): 7}
    assert plan_ranges(start, plan_end(start, {}, max_rows=5)) == []


@given(
    st.dictionaries(queue_refs, st.tuples(st.integers(0, 1000), st.integers(0, 1000))),
    st.one_of(st.none(), st.integers(1, 3000)),
)
def test_plan_end_never_goes_back_or_past_the_end(
    spans: dict[QueueRef, tuple[int, int]], limit: int | None
) -> None:
    bounds = {k: QueueBounds(0, a + b) for k, (a, b) in spans.items()}
    start = {k: a for k, (a, _) in spans.items() if a % 3}  # some queues are new
    end = plan_end(start, bounds, max_rows=limit)
    for k, offset in start.items():
        assert offset <= end[k] <= bounds[k].max_offset
    rows = backlog(start, end)
    assert limit is None or rows <= limit
    assert all(r.count > 0 for r in plan_ranges(start, end))
    assert sum(r.count for r in plan_ranges(start, end)) == rows


@given(st.lists(st.integers(1, 5000), max_size=30), st.integers(1, 8000))
def test_small_ranges_share_tasks_in_queue_order(counts: list[int], min_rows: int) -> None:
    ranges = [QueueRange(q("t", "broker-a", i), 0, n) for i, n in enumerate(counts)]
    groups = group_ranges(ranges, min_rows)
    assert [r for g in groups for r in g] == ranges  # every range once, order kept
    for g in groups:
        assert len(g) == 1 or sum(r.count for r in g) <= min_rows
    assert group_ranges(ranges, min_rows) == groups  # a replay plans the same tasks


@given(
    st.lists(st.integers(1, 5000), max_size=12),  # plan_ranges gives no empty range
    st.none() | st.integers(1, 40),
    st.integers(100, 3000),
)
@settings(deadline=None)
def test_split_ranges_cover_each_range_in_order(
    counts: list[int], min_partitions: int | None, max_rows: int
) -> None:
    ranges = [QueueRange(q("t", "broker-a", i), 10 * i, 10 * i + n) for i, n in enumerate(counts)]
    pieces = split_ranges(ranges, min_partitions=min_partitions, max_rows=max_rows)
    for r in ranges:  # each range exactly covered by consecutive non-empty pieces
        mine = [p for p in pieces if p.queue == r.queue]
        assert [p.begin for p in mine] == [r.begin] + [p.end for p in mine[:-1]]
        assert mine[-1].end == r.end and all(p.count > 0 for p in mine)
        assert all(p.count <= max_rows for p in mine)
    assert pieces == sorted(pieces, key=lambda p: (p.queue, p.begin))
    mp = min_partitions
    if mp is not None and sum(counts) >= mp and len(ranges) < mp:
        # each range gets round(its share x mp) pieces: at most half a piece short per range
        assert 2 * len(pieces) >= 2 * mp - len(ranges)
    assert split_ranges(ranges, min_partitions=min_partitions, max_rows=max_rows) == pieces


@given(st.lists(st.integers(1, 200_000), min_size=1, max_size=30), st.integers(1, 8))
def test_a_big_batch_runs_as_about_tasks_per_batch(counts: list[int], tasks: int) -> None:
    ranges = [QueueRange(q("t", "broker-a", i), 0, n) for i, n in enumerate(counts)]
    groups = group_ranges(ranges, task_rows(ranges, 4096, tasks))
    # Greedy: two neighbouring tasks together hold more than a task may, which is at least the
    # batch's rows over `tasks`.
    assert len(groups) <= 2 * tasks - 1
    if sum(counts) <= 4096:
        assert len(groups) == 1  # a small batch: one task
    # 8 queues of 12 500 rows (a 100 000-row micro-batch): 4 tasks of 2 queues, not 8.
    eight = [QueueRange(q("t", "broker-a", i), 0, 12_500) for i in range(8)]
    assert [len(g) for g in group_ranges(eight, task_rows(eight, 4096, 4))] == [2, 2, 2, 2]


def test_split_ranges_as_kafka_min_partitions() -> None:
    a, b = QueueRange(q("t", "g", 0), 0, 300), QueueRange(q("t", "g", 1), 0, 100)
    # 4 partitions over 300 + 100 rows: 3 pieces of queue 0, 1 of queue 1 (Kafka's rounding)
    got = split_ranges([a, b], min_partitions=4, max_rows=10_000)
    assert [(p.queue.queue_id, p.begin, p.end) for p in got] == [
        (0, 0, 100), (0, 100, 200), (0, 200, 300), (1, 0, 100),
    ]  # fmt: skip
    assert split_ranges([a, b], min_partitions=2, max_rows=10_000) == [a, b]  # enough already
    assert len(split_ranges([a], min_partitions=None, max_rows=64)) == 5  # 300 rows, 64 a task


def test_min_offsets_per_trigger_waits_until_the_delay() -> None:
    kw = {"min_rows": 100, "last_batch_ms": 1_000, "max_trigger_delay_ms": 5_000}
    assert hold_back(99, now_ms=2_000, **kw)
    assert not hold_back(100, now_ms=2_000, **kw)
    assert not hold_back(1, now_ms=6_000, **kw)
    assert not hold_back(0, min_rows=None, last_batch_ms=0, now_ms=0, max_trigger_delay_ms=1)


def test_data_loss_decisions() -> None:
    b = QueueBounds(100, 200)
    assert check_start(A0, 150, b, fail_on_data_loss=True) == 150
    with pytest.raises(DataLossError, match="failOnDataLoss=false"):
        check_start(A0, 50, b, fail_on_data_loss=True)
    assert check_start(A0, 50, b, fail_on_data_loss=False) == 100
    with pytest.raises(DataLossError, match="ends at 200"):
        check_start(A0, 300, b, fail_on_data_loss=True)
    assert check_start(A0, 300, b, fail_on_data_loss=False) == 200


# ---- sink plan ----------------------------------------------------------------------------------


def test_producer_ids_are_deterministic_and_distinct() -> None:
    qid = "5f2c8a7e-3a63-4d5e-9a4e-1f0c2b3d4e5f"
    assert stream_producer_id(qid, 7, 1) == stream_producer_id(qid, 7, 1)
    ids = {stream_producer_id(qid, b, p) for b in range(3) for p in range(3)}
    assert len(ids) == 9 and all(len(i) <= 128 for i in ids)
    assert job_producer_id("abc", 0) != job_producer_id("abc", 1)
    assert stream_producer_id("a b/c", 0, 0) == "spark-a_b_c-b0-p0"


PUB = PublishQueues.of("out", [q("out", g, i) for g in ("broker-a", "broker-b") for i in range(2)])


def test_queue_choice() -> None:
    n = len(PUB.queues)
    keyed = {queue_indices(n, ["order-1"] * 5, p, range(5))[i] for p in range(3) for i in range(5)}
    assert len(keyed) == 1  # one key, one queue, whatever the task or row
    assert PUB.queues[keyed.pop()] == select_by_key(PUB, "order-1")  # the SDK's sharding key
    assert queue_indices(n, None, 1, range(4)) == [1, 2, 3, 0]
    # Unkeyed rows (None or "") go round robin by their row number in the task.
    assert queue_indices(n, [None, "", "order-1", None], 2, [10, 11, 12, 13]) == [
        0,
        1,
        PUB.queues.index(select_by_key(PUB, "order-1")),
        3,
    ]


@given(
    st.integers(1, 9),
    st.integers(0, 20),
    st.integers(0, 10**6),
    st.integers(0, 40),
    st.integers(0, 40),
    st.one_of(st.none(), st.lists(st.sampled_from([None, "", "k1", "k2", "k3"]), min_size=80)),
)
def test_rows_per_queue_follows_the_queue_choice(
    queues: int, partition: int, first_row: int, lo: int, n: int, keys: list[str | None] | None
) -> None:
    """The positions per queue are queue_indices' choice, each queue's in order (the ranges of
    the unkeyed case included)."""
    positions = range(lo, lo + n)
    want: dict[int, list[int]] = {}
    chosen = queue_indices(
        queues,
        None if keys is None else [keys[p] for p in positions],
        partition,
        [first_row + p for p in positions],
    )
    for p, qi in zip(positions, chosen, strict=True):
        want.setdefault(qi, []).append(p)
    got = rows_per_queue(queues, keys, partition, first_row, positions)
    assert [(qi, list(mine)) for qi, mine in got] == sorted(want.items())


# Row sizes at and around the chunk limits (7 messages, 1000 bytes): chunks close by count, by
# size, exactly at the limit, and a row larger than the limit goes alone. Each example mixes two
# neighbouring sizes, so that long runs of one size (full chunks by count) are common.
SIZES = (1, 10, 100, 143, 333, 500, 999, 1000, 1500)
sized_rows = st.integers(0, len(SIZES) - 2).flatmap(
    lambda i: st.lists(st.tuples(st.integers(0, 3), st.sampled_from(SIZES[i : i + 2])), max_size=80)
)


def _chunks_of(rows: list[tuple[int, int]], cuts: list[int]) -> list[Chunk[int]]:
    """The chunker fed row by row's queues in Spark batches cut at `cuts` (row numbers)."""
    chunker: SequenceChunker[int] = SequenceChunker(max_messages=7, max_bytes=1000)
    out: list[Chunk[int]] = []
    edges = sorted({0, len(rows), *(c for c in cuts if 0 < c < len(rows))})
    for lo, hi in itertools.pairwise(edges):
        for qi, queue in enumerate(PUB.queues):
            mine = [n for n in range(lo, hi) if rows[n][0] == qi]
            out.extend(chunker.extend(queue, mine, [rows[n][1] for n in mine]))
    out.extend(chunker.flush())
    return out


def _same(c: Chunk[Any]) -> tuple[object, ...]:
    assert c.count == len(c.items)
    return (c.queue, c.first_sequence, c.items, c.size_bytes)


@given(sized_rows, st.lists(st.integers(0, 200), max_size=6))
def test_a_body_column_is_cut_into_body_columns(
    rows: list[tuple[int, int]], cuts: list[int]
) -> None:
    """Bodies given as BodyColumns (the sink's bare rows, sizes a memoryview as Arrow's
    lengths) are cut as the same bodies in lists, into pieces that are BodyColumns over the
    same buffers: no body is copied or made an object."""
    bodies = [bytes([n % 251]) * size for n, (_, size) in enumerate(rows)]
    ends = [0, *itertools.accumulate(len(b) for b in bodies)]
    offsets, data = struct.pack(f"={len(ends)}i", *ends), b"".join(bodies)
    lengths = memoryview(struct.pack(f"={len(bodies)}i", *map(len, bodies))).cast("i")
    queue = PUB.queues[0]
    as_lists: SequenceChunker[bytes] = SequenceChunker(max_messages=7, max_bytes=1000)
    as_columns: SequenceChunker[bytes] = SequenceChunker(max_messages=7, max_bytes=1000)
    got: list[Chunk[bytes]] = []
    want: list[Chunk[bytes]] = []
    edges = sorted({0, len(rows), *(c for c in cuts if 0 < c < len(rows))})
    for lo, hi in itertools.pairwise(edges):
        want += as_lists.extend(queue, bodies[lo:hi], [len(b) for b in bodies[lo:hi]])
        col = BodyColumn(offsets, data, range(lo, hi))
        got += as_columns.extend(queue, col, lengths[lo:hi])
    want += as_lists.flush()
    got += as_columns.flush()
    assert [_same(c) for c in got] == [_same(c) for c in want]
    for c in got:
        assert all(isinstance(p, BodyColumn) and p.data is data for p in c.pieces)


def test_chunks_close_by_bytes_just_past_the_count_rule() -> None:
    """At 7 x 142 = 994 bytes a chunk closes by count; at 7 x 143 = 1001 the 7th row would pass
    1000 bytes, so it starts the next chunk (the fast path by count must not take it)."""
    for size, want in ((142, [7, 7, 1]), (143, [6, 6, 3])):
        chunker: SequenceChunker[int] = SequenceChunker(max_messages=7, max_bytes=1000)
        chunks = chunker.extend(PUB.queues[0], list(range(15)), [size] * 15)
        chunks += list(chunker.flush())
        assert [len(c.items) for c in chunks] == want, size


@given(sized_rows, st.lists(st.integers(0, 200), max_size=6))
def test_chunks_have_consecutive_sequences_and_replay_identically(
    rows: list[tuple[int, int]], cuts: list[int]
) -> None:
    chunks = _chunks_of(rows, cuts)
    # A replay may see the task's rows in other Spark batches: the chunks are the same (their
    # pieces are the slices of the batches they came from).
    by_queue = sorted(chunks, key=lambda c: (c.queue, c.first_sequence))
    replay = sorted(_chunks_of(rows, []), key=lambda c: (c.queue, c.first_sequence))
    assert [_same(c) for c in by_queue] == [_same(c) for c in replay]
    per_queue: dict[QueueRef, list[int]] = {}
    for c in chunks:
        assert 1 <= len(c.items) <= 7
        assert c.first_sequence == len(per_queue.get(c.queue, []))  # sequences 0.. with no gap
        per_queue.setdefault(c.queue, []).extend(c.items)
        assert len(c.items) == 1 or sum(rows[i][1] for i in c.items) <= 1000
    # Every row lands once, in its queue, in row order.
    for qi, queue in enumerate(PUB.queues):
        assert per_queue.get(queue, []) == [n for n, (r, _) in enumerate(rows) if r == qi]
    # The greedy rule row by row: a chunk closes before a row that would pass 1000 bytes and
    # at 7 rows (the chunker's fast path, by count, must cut the same).
    for qi, queue in enumerate(PUB.queues):
        want: list[tuple[int, ...]] = []
        open_: list[int] = []
        for n in (n for n, (r, _) in enumerate(rows) if r == qi):
            if open_ and sum(rows[i][1] for i in open_) + rows[n][1] > 1000:
                want.append(tuple(open_))
                open_ = []
            open_.append(n)
            if len(open_) >= 7:
                want.append(tuple(open_))
                open_ = []
        if open_:
            want.append(tuple(open_))
        assert [c.items for c in by_queue if c.queue == queue] == want


@settings(max_examples=150, deadline=None)
@given(sized_rows, st.integers(1, 5), st.data())
def test_the_producer_sends_each_chunk_as_one_request_whatever_the_timing(
    rows: list[tuple[int, int]], inflight: int, data: st.DataObject
) -> None:
    """The sink hands the SDK every chunk at once, several per queue in flight: the SDK's
    accumulator (the same limits, seal on send) must cut exactly the chunks, however its
    answers and seals interleave with the hand-overs, or a replay would overlap a stored batch.
    """
    chunks = _chunks_of(rows, [])
    sizes = dict(enumerate(size for _, size in rows))
    acc: Accumulator[int] = Accumulator(
        linger_ms=0,
        batch_max_messages=7,
        batch_max_bytes=1000,
        max_buffered_messages=10**6,
        max_buffered_bytes=10**9,
        max_inflight_per_queue=inflight,
        seal_on_send=True,
    )
    cut: list[Batch[int]] = []  # issued, not on the wire yet
    on_wire: list[Batch[int]] = []
    sent: list[Batch[int]] = []
    waiting = list(chunks)
    while waiting or cut or on_wire:
        moves = [m for m, todo in (("hand", waiting), ("seal", cut), ("answer", on_wire)) if todo]
        move = data.draw(st.sampled_from(moves))
        nxt: Batch[int] | None
        if move == "hand":
            c = waiting.pop(0)
            nxt = acc.append(c.queue, [(i, sizes[i]) for i in c.items], 0).batch
        elif move == "seal":
            batch = cut.pop(data.draw(st.integers(0, len(cut) - 1)))
            sealed, nxt = acc.seal(batch, 0)
            on_wire.append(sealed)
            sent.append(sealed)
        else:
            nxt = acc.complete(on_wire.pop(data.draw(st.integers(0, len(on_wire) - 1))), 0)
        if nxt is not None:
            cut.append(nxt)
    got = sorted((b.queue, b.first_sequence, b.items) for b in sent)
    assert got == sorted((c.queue, c.first_sequence, c.items) for c in chunks)
