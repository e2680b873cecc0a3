"""The row schema of the raftmq Spark source and the conversion of pulled messages to Arrow.

Pure: the raw record batches of one pull answer in, one pyarrow RecordBatch out, with exactly the
Arrow schema Spark derives from SCHEMA (Spark refuses any other). Never does I/O.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import TypeAlias

try:
    import pyarrow as pa
    import pyarrow.compute as pc
except ModuleNotFoundError as _exc:  # a worker started with another Python than the driver's
    from raftmq.spark_source import worker_lacks

    raise worker_lacks(_exc) from _exc
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from raftmq.client.raw_batch import named_messages
from raftmq.common import stored_batch
from raftmq.common.filter.tag import TagFilter
from raftmq.common.message import POSITION_HEX, msg_id_prefix
from raftmq.common.pb import broker_pb2
from raftmq.common.record_batch import MalformedBatchError

# `key` is the message's first business key: RocketMQ keys are strings, and `keys` holds them all.
SCHEMA = StructType(
    [
        StructField("key", StringType(), True),
        StructField("value", BinaryType(), False),
        StructField("topic", StringType(), False),
        StructField("brokerName", StringType(), False),
        StructField("queueId", IntegerType(), False),
        StructField("queueOffset", LongType(), False),
        StructField("msgId", StringType(), False),
        StructField("tags", StringType(), True),
        StructField("keys", ArrayType(StringType(), False), False),
        StructField("bornTimestamp", TimestampType(), True),
        StructField("storeTimestamp", TimestampType(), False),
        StructField("properties", MapType(StringType(), StringType(), False), False),
    ]
)
COLUMNS = tuple(f.name for f in SCHEMA.fields)
# With includeHeaders=true: the properties again in the shape of Kafka's `headers` column, for
# code written against Spark's Kafka source.
HEADERS = StructField(
    "headers",
    ArrayType(
        StructType([StructField("key", StringType(), False), StructField("value", BinaryType())]),
        False,
    ),
    False,
)
SCHEMA_WITH_HEADERS = StructType([*SCHEMA.fields, HEADERS])
MS_TO_US = 1000
# Spark's timestamps run from 0001-01-01 to 9999-12-31 (UTC). A born time outside them (any
# int64 a non-SDK client sent) becomes null rather than failing the whole query.
BORN_MIN_MS, BORN_MAX_MS = -62_135_596_800_000, 253_402_300_799_999


@cache
def arrow_schema(include_headers: bool = False) -> pa.Schema:
    """What Spark checks a returned RecordBatch against (to_arrow_schema of SCHEMA, or of
    SCHEMA_WITH_HEADERS, UTC)."""
    return to_arrow_schema(SCHEMA_WITH_HEADERS if include_headers else SCHEMA, timezone="UTC")


def with_headers(batch: pa.RecordBatch) -> pa.RecordBatch:
    """`batch` with the `headers` column added: each row's properties as a list of (key, value
    bytes) structs (an Arrow cast of the map column: no object per row)."""
    schema = arrow_schema(include_headers=True)
    headers = batch.column(COLUMNS.index("properties")).cast(schema.field("headers").type)
    return pa.RecordBatch.from_arrays([*batch.columns, headers], schema=schema)


@dataclass(frozen=True, slots=True)
class StoredPart:
    """The chosen messages of one stored batch, their per-message columns read (`raw`: key,
    value, tags, keys, properties, position, born time in ms) but not yet finished: the columns
    every message of the batch shares and the compute kernels wait for `combine`, which does
    them once over all the parts handed to Spark together (a kernel call costs about as much
    as a few hundred rows of copying)."""

    raw: pa.RecordBatch
    topic: str
    broker_group: str
    queue_id: int
    first_offset: int
    msg_id_prefix: str
    store_us: int
    count: int  # the batch's message count (its positions are below it)
    nbytes: int  # the codec's buffers' size (RecordBatch.nbytes walks the arrays: ~30 us)

    @property
    def num_rows(self) -> int:
        return int(self.raw.num_rows)


# A pull answer's rows: v2 stored batches not yet finished, v1 record batches decoded row by row.
Part: TypeAlias = "StoredPart | pa.RecordBatch"


def to_record_batch(
    batches: Sequence[broker_pb2.RawBatch],
    topic: str,
    broker_group: str,
    queue_id: int,
    *,
    end_offset: int,
    tag_filter: TagFilter,
) -> pa.RecordBatch:
    """One RecordBatch of SCHEMA's columns from a raw pull answer of one queue: the messages
    below `end_offset` whose tag passes `tag_filter` (the broker filters by tag hash only), in
    offset order (`pull_parts` then `combine`)."""
    parts = pull_parts(
        batches, topic, broker_group, queue_id, end_offset=end_offset, tag_filter=tag_filter
    )
    return combine(parts, tag_filter)


def pull_parts(
    batches: Sequence[broker_pb2.RawBatch],
    topic: str,
    broker_group: str,
    queue_id: int,
    *,
    end_offset: int,
    tag_filter: TagFilter,
) -> list[Part]:
    """A raw pull answer of one queue as parts for `combine`, in offset order, cut at
    `end_offset`. A stored batch becomes columns in one codec call (stored_batch.columns: no
    Python object per row); consecutive v1 record batches take the row-by-row slow path
    together, `tag_filter` applied there (a stored one is filtered by `combine`)."""
    parts: list[Part] = []
    v1: list[broker_pb2.RawBatch] = []  # consecutive v1 batches, decoded together

    def decode_v1() -> None:
        if v1:
            rows = _decoded_rows(
                v1, topic, broker_group, queue_id, end_offset=end_offset, tag_filter=tag_filter
            )
            parts.append(rows)
            v1.clear()

    for b in batches:
        limit = end_offset - b.first_offset  # positions at or past it are past the end
        positions: Sequence[int] = b.positions
        if not positions:
            continue
        if positions[0] >= limit:
            break  # the answer is in queue-offset order: the rest is past the end too
        chunk = b.chunk  # (a protobuf bytes field is copied at each access)
        if not stored_batch.is_stored(chunk):
            v1.append(b)
            continue
        decode_v1()
        if positions[-1] >= limit:
            positions = positions[: bisect_left(positions, limit)]
        parts.append(_stored_part(b, chunk, positions, topic, broker_group, queue_id))
    decode_v1()
    return parts


@cache
def _empty() -> pa.RecordBatch:
    schema = arrow_schema()
    return pa.RecordBatch.from_arrays([pa.array([], type=f.type) for f in schema], schema=schema)


_hex: list[pa.Array] = []  # _hex[0]: format(i, POSITION_HEX) for i < its length


def _position_hex(count: int) -> pa.Array:
    """The message id's position part of positions 0..count-1 (grown by doubling, kept: a
    batch holds at most the broker's max_messages)."""
    if not _hex or len(_hex[0]) < count:
        size = max(1024, 1 << (count - 1).bit_length())
        _hex[:] = [pa.array([format(i, POSITION_HEX) for i in range(size)], pa.string())]
    return _hex[0]


def _buffers(*raw: bytes | None) -> list[pa.Buffer | None]:
    return [None if r is None else pa.py_buffer(r) for r in raw]


@cache
def _raw_schema() -> pa.Schema:
    """StoredPart.raw's columns: SCHEMA's per-message ones, then position and born ms."""
    f = arrow_schema().field
    return pa.schema(
        [f(0), f(1), f(7), f(8), f(11), ("position", pa.int64()), ("born_ms", pa.int64())]
    )


def _stored_part(
    b: broker_pb2.RawBatch,
    chunk: bytes,
    positions: Sequence[int],
    topic: str,
    broker_group: str,
    queue_id: int,
) -> StoredPart:
    """The chosen messages of one stored batch (v2 or v3), read into Arrow arrays from the codec's
    buffers (no copy, no kernel)."""
    c = stored_batch.columns(chunk, positions)
    h = c.header
    if h.queue_id != queue_id or h.topic != topic:
        raise MalformedBatchError(
            f"batch {b.raft_index}/{b.slot} is for {h.topic}/{h.queue_id}, not {topic}/{queue_id}"
        )
    n = len(positions)
    schema = _raw_schema()
    f = schema.field
    string, int64 = pa.string(), pa.int64()
    props_type = f(4).type
    key_items = pa.Array.from_buffers(
        string, len(c.keys_item_offsets) // 4 - 1, _buffers(None, c.keys_item_offsets, c.keys_data)
    )
    pairs = len(c.prop_name_offsets) // 4 - 1
    entries = pa.StructArray.from_arrays(
        [
            pa.Array.from_buffers(
                string, pairs, _buffers(None, c.prop_name_offsets, c.prop_name_data)
            ),
            pa.Array.from_buffers(
                string, pairs, _buffers(None, c.prop_value_offsets, c.prop_value_data)
            ),
        ],
        fields=[props_type.key_field, props_type.item_field],
    )
    raw = pa.RecordBatch.from_arrays(
        [
            pa.Array.from_buffers(string, n, _buffers(c.key_valid, c.key_offsets, c.key_data)),
            pa.Array.from_buffers(pa.binary(), n, _buffers(None, c.body_offsets, c.body_data)),
            pa.Array.from_buffers(string, n, _buffers(c.tag_valid, c.tag_offsets, c.tag_data)),
            pa.Array.from_buffers(
                f(3).type, n, _buffers(None, c.keys_offsets), children=[key_items]
            ),
            pa.Array.from_buffers(
                props_type, n, _buffers(None, c.props_offsets), children=[entries]
            ),
            pa.Array.from_buffers(int64, n, _buffers(None, c.positions)),
            pa.Array.from_buffers(int64, n, _buffers(None, c.born_ms)),
        ],
        schema=schema,
    )
    return StoredPart(
        raw,
        topic,
        broker_group,
        queue_id,
        b.first_offset,
        msg_id_prefix(broker_group, b.raft_index, b.slot),
        b.store_timestamp_ms * MS_TO_US,
        h.count,
        sum(map(len, c[1:])),
    )


def combine(parts: Sequence[Part], tag_filter: TagFilter) -> pa.RecordBatch:
    """One RecordBatch of SCHEMA's columns from parts (of any queues), in their order: each run
    of consecutive StoredParts finished together (`tag_filter` applied to them), v1 batches as
    they are; one copy of the rows in all."""
    out: list[pa.RecordBatch] = []
    run: list[StoredPart] = []
    for p in parts:
        if isinstance(p, StoredPart):
            run.append(p)
            continue
        if run:
            out.append(_finished(run, tag_filter))
            run = []
        out.append(p)
    if run:
        out.append(_finished(run, tag_filter))
    if not out:
        return _empty()
    if len(out) == 1:
        return out[0]
    # One batch per Spark hand-over: Spark pays per batch it is handed.
    combined = pa.Table.from_batches(out, arrow_schema()).combine_chunks().to_batches()
    return combined[0] if combined else _empty()


def _finished(run: Sequence[StoredPart], tag_filter: TagFilter) -> pa.RecordBatch:
    """The StoredParts' rows in SCHEMA's columns: the raw columns concatenated (one copy), the
    per-batch values repeated by numpy, and each kernel called once for the whole run."""
    if len(run) == 1:
        raw = run[0].raw
    else:
        raw = (
            pa.Table.from_batches([p.raw for p in run], _raw_schema())
            .combine_chunks()
            .to_batches()[0]
        )
    schema = arrow_schema()
    f = schema.field
    string, int64 = pa.string(), pa.int64()
    ends: list[int] = []
    for p in run:
        ends.append(p.num_rows + (ends[-1] if ends else 0))
    run_ends = pa.array(ends, pa.int32())

    def each(values: list[object], type_: pa.DataType) -> pa.Array:
        # each row's value of its part: one run per part, decoded by one kernel
        encoded = pa.RunEndEncodedArray.from_arrays(run_ends, pa.array(values, type_))
        return pc.run_end_decode(encoded)

    position = raw.column(5)
    born_ms = raw.column(6)
    # Spark's timestamps: a born time of 0 or outside 0001..9999 is null (see BORN_MIN_MS).
    born_ok = pc.and_(
        pc.not_equal(born_ms, 0),
        pc.and_(pc.greater_equal(born_ms, BORN_MIN_MS), pc.less_equal(born_ms, BORN_MAX_MS)),
    )
    born = pc.if_else(born_ok, pc.multiply(born_ms, MS_TO_US), pa.scalar(None, int64))
    tags = raw.column(2)
    msg_id = pc.binary_join_element_wise(
        each([p.msg_id_prefix for p in run], string),
        _position_hex(max(p.count for p in run)).take(position),
        "",
    )
    batch = pa.RecordBatch.from_arrays(
        [
            raw.column(0),
            raw.column(1),
            each([p.topic for p in run], string),
            each([p.broker_group for p in run], string),
            each([p.queue_id for p in run], f(4).type),
            pc.add(position, each([p.first_offset for p in run], int64)),
            msg_id,
            tags,
            raw.column(3),
            born.cast(f(9).type),
            each([p.store_us for p in run], f(10).type),
            raw.column(4),
        ],
        schema=schema,
    )
    if not tag_filter.is_all:
        assert tag_filter.tags is not None
        batch = batch.filter(pc.is_in(tags, pa.array(sorted(tag_filter.tags), string)))
        tags = batch.column(7)
    # The row path's `m.tags or None`: an empty tag is no tag in the rows.
    empty = pc.equal(pc.binary_length(tags), 0)
    if pc.any(empty).as_py():
        batch = batch.set_column(7, f(7), pc.if_else(empty, pa.scalar(None, string), tags))
    return batch


def _decoded_rows(
    batches: Sequence[broker_pb2.RawBatch],
    topic: str,
    broker_group: str,
    queue_id: int,
    *,
    end_offset: int,
    tag_filter: TagFilter,
) -> pa.RecordBatch:
    """to_record_batch's slow path, for v1 record batches (stores written before the v2 stored
    batch): each message decoded to an object, then the columns filled row by row."""
    schema = arrow_schema()
    key: list[str | None] = []
    value: list[bytes] = []
    queue_offset: list[int] = []
    msg_id: list[str] = []
    tags: list[str | None] = []
    keys: list[tuple[str, ...]] = []
    born: list[int | None] = []
    store: list[int] = []
    props: list[list[tuple[str, str]]] = []
    for b, position, mid, m in named_messages(batches, broker_group, queue_id, topic):
        offset = b.first_offset + position
        if offset >= end_offset:
            break  # the answer is in queue-offset order: the rest is past the end too
        if not tag_filter.matches(m.tags):
            continue
        ks = m.keys
        key.append(ks[0] if ks else None)
        value.append(m.body)
        queue_offset.append(offset)
        msg_id.append(mid)
        tags.append(m.tags or None)
        keys.append(ks)
        bt = m.born_timestamp_ms
        born.append(bt * MS_TO_US if bt and BORN_MIN_MS <= bt <= BORN_MAX_MS else None)
        store.append(b.store_timestamp_ms * MS_TO_US)
        props.append(list(m.properties.items()) if m.properties else [])
    n = len(value)
    f = schema.field
    arrays = [
        pa.array(key, type=f(0).type),
        pa.array(value, type=f(1).type),
        pa.array([topic] * n, type=f(2).type),
        pa.array([broker_group] * n, type=f(3).type),
        pa.array([queue_id] * n, type=f(4).type),
        pa.array(queue_offset, type=f(5).type),
        pa.array(msg_id, type=f(6).type),
        pa.array(tags, type=f(7).type),
        pa.array(keys, type=f(8).type),
        pa.array(born, type=f(9).type),
        pa.array(store, type=f(10).type),
        pa.array(props, type=f(11).type),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
