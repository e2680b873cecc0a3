"""The `raftmq` Spark sink: rows (value, key, topic, tags, properties) sent exactly once.

Each task sends its rows with the SDK's idempotent Producer under an id derived from (query id,
micro-batch id, partition id), with per-queue sequences from 0 in row order (sink_plan.py),
so a replayed micro-batch is answered "duplicate" and stored nothing twice. Writers hold options
and plain values only; channels are opened inside write() on the executor.
"""

from __future__ import annotations

import collections
import logging
import uuid
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import cast

try:
    import pyarrow as pa
    import pyarrow.compute as pc
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

from raftmq.client.messages import OutgoingMessage, SendResult, SendResults
from raftmq.client.producer import Producer
from raftmq.client.queue_selector import PublishQueues
from raftmq.client.routes import ChannelPool, RouteCache
from raftmq.common.malloc_policy import keep_freed_memory
from raftmq.common.stored_batch import BodyColumn
from raftmq.spark_source import cluster
from raftmq.spark_source.options import TOPIC, SinkOptions, parse_sink_options
from raftmq.spark_source.sink_plan import (
    MAX_CHUNK_BYTES,
    MAX_CHUNK_MESSAGES,
    Chunk,
    SequenceChunker,
    job_producer_id,
    pick,
    rows_per_queue,
    stream_producer_id,
)

_log = logging.getLogger("spark_source")

SINK_COLUMNS = ("value", "key", "topic", "tags", "properties")
ROUTE_REFRESH_MS = 30_000
SETTLE_MARGIN_S = 5.0  # the Producer fails a send after send_timeout_ms; wait a little longer
# Chunks of a task handed to the Producer and not answered yet: enough to keep every queue's 5
# requests in flight for a topic of a few queues, and a bound on the task's memory.
MAX_INFLIGHT_CHUNKS = 32
MAX_INFLIGHT_BYTES = 32 << 20


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


def _first(mask: pa.Array) -> int:
    """The index of the first true of a boolean array (the caller knows there is one)."""
    return int(pc.index(mask, True).as_py())


@dataclass(frozen=True, slots=True)
class SinkRows:
    """One Spark batch's rows as the SDK takes them, checked whole before any is sent: the
    bodies (a binary Arrow array), and per row the topic (None: the `topic` option), key, tags
    and properties where the DataFrame has those columns."""

    values: pa.Array
    sizes: memoryview  # each body's size, Arrow's int32 lengths
    bodies: list[bytes] | None  # as bytes, for rows that are not bare
    topics: list[str] | None
    keys: list[str | None] | None
    tags: list[str | None] | None
    properties: list[list[tuple[str, str]] | None] | None

    @classmethod
    def of(cls, batch: pa.RecordBatch, opts: SinkOptions, first_row: int) -> SinkRows:
        """Checks on whole columns (no Python per row here); a null body, a missing topic or a
        key that is not UTF-8 names its row (counted from the task's first row)."""
        names = batch.schema.names
        values = batch.column("value")
        if values.null_count:
            row = first_row + _first(pc.is_null(values))
            raise SinkSchemaError(f"row {row}: `value` is null; the raftmq sink needs a body")
        if not pa.types.is_binary(values.type):
            values = values.cast(pa.binary())  # a string's buffers: UTF-8 text is its bytes
        topics = None
        if opts.topic is None:
            col = batch.column("topic")
            missing = pc.fill_null(pc.equal(col, ""), True)
            if pc.any(missing).as_py():
                row = first_row + _first(missing)
                raise SinkSchemaError(f"row {row}: `topic` is null and no topic option is set")
            topics = col.to_pylist()
        keys = None
        if "key" in names:
            keys = _utf8(batch.column("key"), "key", first_row).to_pylist()
        bare = not {"key", "tags", "properties"} & set(names)
        return cls(
            values,
            _sizes(values),
            None if bare else values.to_pylist(),
            topics,
            keys,
            batch.column("tags").to_pylist() if "tags" in names else None,
            batch.column("properties").to_pylist() if "properties" in names else None,
        )

    def pick(
        self, positions: Sequence[int]
    ) -> tuple[BodyColumn | Sequence[OutgoingMessage], Sequence[int]]:
        """The rows at `positions` as the chunker takes them (a sequence it slices) and their
        body sizes: rows of nothing but a body as one BodyColumn over the batch's buffers (rows
        picked by a range: no copy, no object per row; by a list, as for a `topic` column: one
        `take`), else one OutgoingMessage per row."""
        if self.bodies is not None:
            return self._messages(pick(self.bodies, positions), positions), pick(
                self.sizes, positions
            )
        values, sizes = self.values, self.sizes
        if not isinstance(positions, range):
            values = values.take(pa.array(positions, pa.int64()))
            sizes = _sizes(values)
            positions = range(len(values))
        _, offsets, data = values.buffers()
        at = values.offset
        rows = range(at + positions.start, at + positions.stop, positions.step)
        return BodyColumn(offsets, data, rows), sizes[
            positions.start : positions.stop : positions.step
        ]

    def _messages(self, bodies: Sequence[bytes], positions: Sequence[int]) -> list[OutgoingMessage]:
        """One OutgoingMessage per row (rows with keys, tags or properties)."""
        n = len(self.values)
        keys = pick(self.keys or [None] * n, positions)
        tags = pick(self.tags or [None] * n, positions)
        props = pick(self.properties or [None] * n, positions)
        return [
            OutgoingMessage(
                body, tags=tag or None, keys=(key,) if key else (), properties=dict(prop or ())
            )
            for body, key, tag, prop in zip(bodies, keys, tags, props, strict=True)
        ]


def _sizes(values: pa.Array) -> memoryview:
    """A binary array's body sizes as ints, without an object per row (Arrow's lengths)."""
    lengths = pc.binary_length(values)  # a new array: no offset, no nulls (bodies are checked)
    return memoryview(lengths.buffers()[1]).cast("B").cast("i")[: len(values)]


def _utf8(column: pa.Array, name: str, first_row: int) -> pa.Array:
    """A string or binary column as strings; binary that is not UTF-8 names its first row."""
    if not pa.types.is_binary(column.type) and not pa.types.is_large_binary(column.type):
        return column
    try:
        return column.cast(pa.string())
    except pa.ArrowInvalid:
        for i, raw in enumerate(column.to_pylist()):  # only on the error path: find the row
            if raw is not None:
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError:
                    raise SinkSchemaError(
                        f"row {first_row + i}: column `{name}` is not UTF-8"
                    ) from None
        raise


class _Window:
    """The chunks a task has handed to the Producer and not settled, oldest first: at most
    MAX_INFLIGHT_CHUNKS and MAX_INFLIGHT_BYTES (the task's memory bound), one future each."""

    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s
        self.futures: collections.deque[tuple[Future[Sequence[SendResult]], int]] = (
            collections.deque()
        )
        self.size_bytes = 0
        self.stored = 0
        self.duplicates = 0

    def add(self, fut: Future[Sequence[SendResult]], size_bytes: int) -> None:
        self.futures.append((fut, size_bytes))
        self.size_bytes += size_bytes
        while len(self.futures) > MAX_INFLIGHT_CHUNKS or (
            self.size_bytes > MAX_INFLIGHT_BYTES and len(self.futures) > 1
        ):
            self.settle_oldest()

    def settle_oldest(self) -> None:
        fut, size = self.futures.popleft()
        self.size_bytes -= size
        results = fut.result(timeout=self.wait_s)
        if isinstance(results, SendResults):  # bare bodies: counted per request, no result made
            dups = results.duplicates
        else:
            dups = sum(1 for r in results if r.duplicate)
        self.duplicates += dups
        self.stored += len(results) - dups

    def drain(self) -> None:
        while self.futures:
            self.settle_oldest()


def write_partition(
    opts: SinkOptions, batches: Iterator[pa.RecordBatch], producer_id: str, partition_id: int
) -> SinkCommit:
    """Send one task's rows with the SDK's idempotent Producer under `producer_id`; returns once
    every chunk is acknowledged (stored, or duplicate of an earlier attempt).

    Per Spark batch and topic, rows are grouped per queue and cut into chunks (sink_plan.py),
    each handed over with the SDK's batch call (one future per chunk). The Producer packs with
    the same limits and rule as SequenceChunker, so each chunk is exactly one request and a
    replay sends the same sequences in the same requests, while several chunks of a queue are
    in flight at once (the broker keeps their order by strict sequences)."""
    keep_freed_memory()  # Spark's Python worker, on the executor (common/malloc_policy.py)
    producer = Producer(
        opts.namesrv,
        producer_id=producer_id,
        send_timeout_ms=opts.send_timeout_ms,
        batch_max_messages=MAX_CHUNK_MESSAGES,
        batch_max_bytes=MAX_CHUNK_BYTES,
        linger_ms=0,
        route_refresh_ms=ROUTE_REFRESH_MS,
    )
    chunker: SequenceChunker[bytes | OutgoingMessage] = SequenceChunker(
        max_messages=MAX_CHUNK_MESSAGES, max_bytes=MAX_CHUNK_BYTES
    )
    window = _Window(opts.send_timeout_ms / 1000 + SETTLE_MARGIN_S)
    publish: dict[str, PublishQueues] = {}

    def queues_of(topic: str) -> PublishQueues:
        found = publish.get(topic)
        if found is None:
            found = publish[topic] = cluster.route_or_unknown(
                producer.routes, topic
            ).publish_queues()
        return found

    row = 0
    try:
        for batch in batches:
            if not batch.num_rows:
                continue
            rows = SinkRows.of(batch, opts, row)
            for topic, positions in _by_topic(rows, opts.topic):
                queues = queues_of(topic)
                for qi, mine in rows_per_queue(
                    len(queues.queues), rows.keys, partition_id, row, positions
                ):
                    items, sizes = rows.pick(mine)
                    for chunk in chunker.extend(queues.queues[qi], items, sizes):
                        _hand(producer, window, chunk)
            row += batch.num_rows
        for chunk in chunker.flush():
            _hand(producer, window, chunk)
        window.drain()
    finally:
        producer.close(timeout_s=window.wait_s)
    return SinkCommit(producer_id, partition_id, window.stored, window.duplicates)


def _by_topic(rows: SinkRows, topic_option: str | None) -> list[tuple[str, Sequence[int]]]:
    """The batch's row positions per topic, in row order (the option wins over the column)."""
    if topic_option is not None or rows.topics is None:
        assert topic_option is not None  # SinkRows.of checked the topic column otherwise
        return [(topic_option, range(len(rows.values)))]
    groups: dict[str, list[int]] = {}
    for p, topic in enumerate(rows.topics):
        groups.setdefault(topic, []).append(p)
    return list(groups.items())


def _hand(producer: Producer, window: _Window, chunk: Chunk[bytes | OutgoingMessage]) -> None:
    """One chunk, one call, one future (a chunk of bare bodies as its BodyColumn pieces)."""
    columns = [p for p in chunk.pieces if isinstance(p, BodyColumn)]
    messages = columns if columns else cast(tuple[OutgoingMessage, ...], chunk.items)
    fut = producer.send_batch_future(chunk.queue.topic, messages, queue=chunk.queue)
    window.add(fut, chunk.size_bytes)


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
