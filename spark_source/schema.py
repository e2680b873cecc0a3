"""The row schema of the raftmq Spark source and the conversion of pulled messages to Arrow.

Pure: StoredMessage values in, one pyarrow RecordBatch out, with exactly the Arrow schema Spark
derives from SCHEMA (Spark refuses any other). Never does I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import pyarrow as pa
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

from client.pb import common_pb2

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


@cache
def arrow_schema() -> pa.Schema:
    """What Spark checks a returned RecordBatch against (to_arrow_schema of SCHEMA, UTC)."""
    return to_arrow_schema(SCHEMA, timezone="UTC")


def to_record_batch(messages: Sequence[common_pb2.StoredMessage]) -> pa.RecordBatch:
    """One RecordBatch of SCHEMA's columns, in the order of `messages`."""
    schema = arrow_schema()
    key: list[str | None] = []
    value: list[bytes] = []
    topic: list[str] = []
    broker: list[str] = []
    queue_id: list[int] = []
    queue_offset: list[int] = []
    msg_id: list[str] = []
    tags: list[str | None] = []
    keys: list[list[str]] = []
    born: list[int | None] = []
    store: list[int] = []
    props: list[list[tuple[str, str]]] = []
    for sm in messages:
        m = sm.message
        ks = list(m.keys)
        key.append(ks[0] if ks else None)
        value.append(m.body)
        topic.append(sm.topic)
        broker.append(sm.broker_group)
        queue_id.append(sm.queue_id)
        queue_offset.append(sm.queue_offset)
        msg_id.append(sm.msg_id)
        tags.append(m.tags or None)
        keys.append(ks)
        born.append(m.born_timestamp_ms * MS_TO_US if m.born_timestamp_ms else None)
        store.append(sm.store_timestamp_ms * MS_TO_US)
        props.append(list(m.properties.items()))
    columns = [key, value, topic, broker, queue_id, queue_offset, msg_id, tags, keys, born, store]
    arrays = [pa.array(col, type=schema.field(i).type) for i, col in enumerate(columns)]
    arrays.append(pa.array(props, type=schema.field(len(columns)).type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
