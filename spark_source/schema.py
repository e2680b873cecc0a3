"""The row schema of the raftmq Spark source and the conversion of pulled messages to Arrow.

Pure: the raw record batches of one pull answer in, one pyarrow RecordBatch out, with exactly the
Arrow schema Spark derives from SCHEMA (Spark refuses any other). Never does I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

try:
    import pyarrow as pa
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
from raftmq.common.filter.tag import TagFilter
from raftmq.common.pb import broker_pb2

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
MS_TO_US = 1000
# Spark's timestamps run from 0001-01-01 to 9999-12-31 (UTC). A born time outside them (any
# int64 a non-SDK client sent) becomes null rather than failing the whole query.
BORN_MIN_MS, BORN_MAX_MS = -62_135_596_800_000, 253_402_300_799_999


@cache
def arrow_schema() -> pa.Schema:
    """What Spark checks a returned RecordBatch against (to_arrow_schema of SCHEMA, UTC)."""
    return to_arrow_schema(SCHEMA, timezone="UTC")


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
    offset order. Columns are filled straight from each decoded message (no per-message value
    objects beyond the decoder's), which is most of the source's CPU per row."""
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
