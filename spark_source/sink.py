"""The `raftmq` Spark sink: rows (value, key, topic, tags, properties) sent exactly once.

Each task sends its rows with the SDK's idempotent Producer under an id derived from (query id,
micro-batch id, partition id), with per-queue sequences from 0 in row order (sink_plan.py),
so a replayed micro-batch is answered "duplicate" and stored nothing twice. Writers hold options
and plain values only; channels are opened inside write() on the executor.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass

try:
    import pyarrow as pa
except ModuleNotFoundError as _exc:  # a worker started with another Python than the driver's
    from raftmq.spark_source import worker_lacks

    raise worker_lacks(_exc) from _exc
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, MapType, StringType, StructType

from raftmq.client.messages import OutgoingMessage, SendResult
from raftmq.client.producer import Producer
from raftmq.client.queue_selector import PublishQueues
from raftmq.client.routes import ChannelPool, RouteCache
from raftmq.common.types import QueueRef
from raftmq.spark_source import cluster
from raftmq.spark_source.options import TOPIC, SinkOptions, parse_sink_options
from raftmq.spark_source.sink_plan import (
    MAX_CHUNK_BYTES,
    MAX_CHUNK_MESSAGES,
    Chunk,
    SequenceChunker,
    choose_queue,
    job_producer_id,
    stream_producer_id,
)

_log = logging.getLogger("spark_source")

SINK_COLUMNS = ("value", "key", "topic", "tags", "properties")
ROUTE_REFRESH_MS = 30_000
SETTLE_MARGIN_S = 5.0  # the Producer fails a send after send_timeout_ms; wait a little longer


class SinkSchemaError(ValueError):
    """The DataFrame written to raftmq lacks `value`, has a column of the wrong type, or an extra
    column."""


@dataclass(frozen=True)
class SinkCommit(WriterCommitMessage):
    producer_id: str
    partition_id: int
    stored: int
    duplicates: int


def check_sink_schema(schema: StructType, opts: SinkOptions) -> None:
    """Refuse a DataFrame the sink cannot write, before any task runs."""
    fields = {f.name: f.dataType for f in schema.fields}
    extra = sorted(set(fields) - set(SINK_COLUMNS))
    if extra:
        raise SinkSchemaError(
            f"column(s) {', '.join(extra)} are not written by the raftmq sink; select only "
            f"{', '.join(SINK_COLUMNS)} (value is required)"
        )
    if "value" not in fields:
        raise SinkSchemaError("the raftmq sink needs a `value` column (binary or string)")
    text_or_bytes = (StringType(), BinaryType())
    for name in ("value", "key"):
        if name in fields and fields[name] not in text_or_bytes:
            raise SinkSchemaError(f"column `{name}` must be binary or string, not {fields[name]}")
    for name in ("topic", "tags"):
        if name in fields and fields[name] != StringType():
            raise SinkSchemaError(f"column `{name}` must be a string, not {fields[name]}")
    if "properties" in fields and not (
        isinstance(fields["properties"], MapType)
        and fields["properties"].keyType == StringType()
        and fields["properties"].valueType == StringType()
    ):
        raise SinkSchemaError(
            f"column `properties` must be map<string,string>, not {fields['properties']}"
        )
    if opts.topic is None and "topic" not in fields:
        raise SinkSchemaError(
            f"say where to write: a `topic` column or the {TOPIC!r} option (which wins)"
        )


def check_sink_topic(opts: SinkOptions) -> None:
    """Driver side, at query or job start: the `topic` option names a topic some broker group
    serves; TopicNotFoundError naming it and `raftmq topic create` otherwise (instead of the
    first micro-batch's tasks failing). Topics from a `topic` column are checked per row."""
    if opts.topic is None:
        return
    pool = ChannelPool()
    try:
        cluster.route_or_unknown(RouteCache(opts.namesrv, pool), opts.topic)
    finally:
        pool.close()


def _text(value: object, column: str, row: int) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise SinkSchemaError(f"row {row}: column `{column}` is not UTF-8") from None
    raise SinkSchemaError(f"row {row}: column `{column}` holds {type(value).__name__}")


def write_partition(
    opts: SinkOptions, batches: Iterator[pa.RecordBatch], producer_id: str, partition_id: int
) -> SinkCommit:
    """Send one task's rows with the SDK's idempotent Producer under `producer_id`; returns once
    every chunk is acknowledged (stored, or duplicate of an earlier attempt).

    Each chunk is exactly one request (the Producer packs with the same limits and rule as
    SequenceChunker, and a queue's next chunk is handed over only after the previous one was
    answered), so a replay sends the same sequences in the same requests."""
    producer = Producer(
        opts.namesrv,
        producer_id=producer_id,
        send_timeout_ms=opts.send_timeout_ms,
        batch_max_messages=MAX_CHUNK_MESSAGES,
        batch_max_bytes=MAX_CHUNK_BYTES,
        linger_ms=0,
        route_refresh_ms=ROUTE_REFRESH_MS,
    )
    chunker: SequenceChunker[OutgoingMessage] = SequenceChunker(
        max_messages=MAX_CHUNK_MESSAGES, max_bytes=MAX_CHUNK_BYTES
    )
    inflight: dict[QueueRef, Future[list[SendResult]]] = {}  # one future per chunk
    publish: dict[str, PublishQueues] = {}
    totals = [0, 0]  # stored, duplicates
    wait_s = opts.send_timeout_ms / 1000 + SETTLE_MARGIN_S

    def settle(queue: QueueRef) -> None:
        fut = inflight.pop(queue, None)
        if fut is not None:
            for result in fut.result(timeout=wait_s):
                totals[1 if result.duplicate else 0] += 1

    def submit(chunk: Chunk[OutgoingMessage]) -> None:
        settle(chunk.queue)  # a queue's later sequences must never overtake earlier ones
        inflight[chunk.queue] = producer.send_batch_future(
            chunk.queue.topic, chunk.items, queue=chunk.queue
        )

    row = 0
    try:
        for batch in batches:
            cols = {name: batch.column(name).to_pylist() for name in batch.schema.names}
            values = cols["value"]
            keys = cols.get("key")
            topics = cols.get("topic")
            tags = cols.get("tags")
            props = cols.get("properties")
            for i in range(batch.num_rows):
                raw = values[i]
                if raw is None:
                    raise SinkSchemaError(
                        f"row {row}: `value` is null; the raftmq sink needs a body"
                    )
                body = raw.encode("utf-8") if isinstance(raw, str) else raw
                topic = opts.topic or (topics[i] if topics is not None else None)
                if not topic:
                    raise SinkSchemaError(f"row {row}: `topic` is null and no topic option is set")
                key = _text(keys[i], "key", row) if keys is not None else None
                queues = publish.get(topic)
                if queues is None:
                    route = cluster.route_or_unknown(producer.routes, topic)
                    queues = publish[topic] = route.publish_queues()
                msg = OutgoingMessage(
                    body,
                    tags=(tags[i] or None) if tags is not None else None,
                    keys=(key,) if key else (),
                    properties=dict(props[i] or ()) if props is not None else {},
                )
                target = choose_queue(queues, key, partition_id, row)
                for chunk in chunker.add(target, msg, len(body)):
                    submit(chunk)
                row += 1
        for chunk in chunker.flush():
            submit(chunk)
        for queue in list(inflight):
            settle(queue)
    finally:
        producer.close(timeout_s=wait_s)
    return SinkCommit(producer_id, partition_id, totals[0], totals[1])


def _task() -> TaskContext:
    ctx = TaskContext.get()
    if ctx is None:
        raise RuntimeError("the raftmq sink's write() must run inside a Spark task")
    return ctx


class RaftMQBatchWriter(DataSourceArrowWriter):
    """df.write: one producer id per (job, partition); task retries of the job deduplicate, and
    so does a re-run of the job under the same `writeId` (same rows per partition, same order)."""

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        self.opts = parse_sink_options(options)
        if overwrite:
            raise ValueError("the raftmq sink only appends; use mode('append')")
        check_sink_schema(schema, self.opts)
        check_sink_topic(self.opts)
        # Made once on the driver, shared by every task.
        self.job_id = self.opts.write_id or uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        pid = _task().partitionId()
        return write_partition(self.opts, iterator, job_producer_id(self.job_id, pid), pid)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _log_totals("batch", self.job_id, messages)


class RaftMQStreamWriter(DataSourceStreamArrowWriter):
    """writeStream: one producer id per (query, micro-batch, partition)."""

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        self.opts = parse_sink_options(options)
        check_sink_schema(schema, self.opts)
        check_sink_topic(self.opts)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        ctx = _task()
        query_id = ctx.getLocalProperty("sql.streaming.queryId")
        batch_id = ctx.getLocalProperty("streaming.sql.batchId")
        if not query_id or batch_id is None:
            raise RuntimeError(
                "the raftmq stream writer found no streaming query id / batch id in the task; "
                "exactly-once needs them"
            )
        pid = ctx.partitionId()
        producer = stream_producer_id(query_id, int(batch_id), pid)
        return write_partition(self.opts, iterator, producer, pid)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _log_totals("stream", str(batchId), messages)
        if self.opts.failpoint_after_write_batch == batchId:
            raise RuntimeError(
                f"failpoint.afterWriteBatch: failing micro-batch {batchId} after its rows were "
                "stored (test hook)"
            )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Rows already stored stay; the replay of this batch finds them as duplicates.
        _log.warning("spark_source.sink_abort batch=%s", batchId)


def _log_totals(kind: str, ident: str, messages: list[WriterCommitMessage | None]) -> None:
    done = [m for m in messages if isinstance(m, SinkCommit)]
    _log.info(
        "spark_source.sink_commit kind=%s id=%s tasks=%d stored=%d duplicates=%d",
        kind,
        ident,
        len(done),
        sum(m.stored for m in done),
        sum(m.duplicates for m in done),
    )
