"""Exactly-once writes of a streaming query's micro-batches in any output mode, through
`foreachBatch`: update and complete as well as append.

PySpark's Python data source API cannot take Update mode (PySpark 4.3's PythonWriteBuilder lacks
Spark's SupportsStreamingUpdateAsAppend, so `format("raftmq").outputMode("update")` fails in
Spark's planner), so this is the way to write a running aggregate to a topic. Never sends itself:
each micro-batch goes through the batch sink (sink.py) under a write id fixed by (query, batch).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from raftmq.spark_source.options import WRITE_ID, OptionError, parse_sink_options

# Columns a partition's rows are sorted by before they are sent: a replay then gives every row
# the same sequence as the first attempt (`properties` is a map, which Spark cannot sort by).
ORDER_COLUMNS = ("key", "value", "topic", "tags")
QUERY_ID_PROPERTY = "sql.streaming.queryId"


def batch_write_id(query_id: str, batch_id: int) -> str:
    """The write id of one micro-batch: a replay of batch `batch_id` of the query (whose id lives
    in its checkpoint) gets the same one, every other batch another."""
    if batch_id < 0:
        raise ValueError("micro-batch ids are >= 0")
    return f"{query_id}-b{batch_id}"


def foreach_batch_sink(
    options: Mapping[str, str] | None = None, **kwargs: str
) -> Callable[[Any, int], None]:
    """A `foreachBatch` function that writes each micro-batch to raftmq exactly once.

    `options` (or keyword arguments) are the sink's: `nameServer`, `topic`, `sendTimeoutMs`.
    Usage: `counts.writeStream.outputMode("update").foreachBatch(foreach_batch_sink(
    nameServer="127.0.0.1:9876", topic="counts")).option("checkpointLocation", ck).start()`.

    A micro-batch that Spark runs again after a failure (same query id and batch id, same rows
    per partition: true for aggregations and for map pipelines from the raftmq source) is
    answered "duplicate" row by row and stores nothing twice, because each partition's rows are
    sorted before they get their sequences. Options are checked here, on the driver, before the
    query starts."""
    opts = {**(options or {}), **kwargs}
    parsed = parse_sink_options(opts)
    if parsed.write_id is not None:
        raise OptionError(
            f"{WRITE_ID} is chosen per micro-batch by foreach_batch_sink (from the query id and "
            "the batch id); leave it out"
        )

    def write(df: Any, batch_id: int) -> None:
        query_id = df.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
        if not query_id:
            raise RuntimeError(
                "foreach_batch_sink found no streaming query id: pass it to "
                ".writeStream.foreachBatch(...) of a streaming query, not call it directly"
            )
        order = [c for c in ORDER_COLUMNS if c in df.columns]
        (
            df.sortWithinPartitions(*order)
            .write.format("raftmq")
            .options(**opts)
            .option(WRITE_ID, batch_write_id(query_id, batch_id))
            .mode("append")
            .save()
        )

    return write
