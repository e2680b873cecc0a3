"""The `raftmq` Spark data source: batch and micro-batch readers over topics' queues, and the
entry point that hands out the sink's writers.

Shell around planning.py: the driver asks the cluster for routes and queue bounds and lets the
pure planner decide; executors pull the exact ranges. Readers hold only options and plain values,
never a channel (Spark pickles them); offsets live in Spark's checkpoint, never on the broker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

try:
    import pyarrow as pa
except ModuleNotFoundError as _exc:  # a worker started with another Python than the driver's
    from raftmq.spark_source import worker_lacks

    raise worker_lacks(_exc) from _exc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from raftmq.client.routes import ChannelPool, RouteCache, TopicRoute
from raftmq.common.errors import RaftMQError, TopicNotFoundError
from raftmq.common.filter.tag import TagFilter, parse_tag_expression
from raftmq.common.malloc_policy import keep_freed_memory
from raftmq.common.types import QueueRef
from raftmq.spark_source import cluster
from raftmq.spark_source import offsets as offsets_json
from raftmq.spark_source.options import (
    ASSIGN,
    FORMAT,
    OptionError,
    PositionKind,
    SourceOptions,
    SubscriptionKind,
    include_headers,
    parse_source_options,
)
from raftmq.spark_source.planning import (
    QueueBounds,
    QueueRange,
    backlog,
    check_start,
    group_ranges,
    hold_back,
    plan_end,
    plan_ranges,
    resolve_position,
    split_ranges,
    task_rows,
    time_lookups,
)
from raftmq.spark_source.read_ahead import read_ahead
from raftmq.spark_source.schema import (
    SCHEMA,
    SCHEMA_WITH_HEADERS,
    Part,
    combine,
    pull_parts,
    with_headers,
)

_log = logging.getLogger("spark_source")

ROUTE_TTL_MS = 1000
# Queues of a micro-batch share a Spark task while together they hold at most this many rows,
# or the batch's rows over TASKS_PER_BATCH if more (planning.task_rows): a small batch runs as
# one task instead of one per queue (latency), a big one as about TASKS_PER_BATCH (a stream of
# 100 000-row micro-batches over 8 queues: 8 tasks took 1.7-2x as long as 2, per-task costs).
MIN_PARTITION_ROWS = 4096  # an idle 0-second trigger polls constantly; routes change rarely
TASKS_PER_BATCH = 4
# A queue's range longer than this is read by several Spark tasks, so that a backlog in few
# queues still keeps every core busy (minPartitions asks for more).
MAX_PARTITION_ROWS = 131_072
# What one Arrow batch handed to Spark holds at most: pull answers are combined up to this, as
# Spark pays per batch it is handed (bench/spark_bench.py's synthetic source measures the sizes).
TARGET_BATCH_ROWS = 8192
TARGET_BATCH_BYTES = 16 << 20
# A task's read memory: readAheadBatches (default 2) x TARGET_BATCH_BYTES made ahead, plus the
# one being made and one pull answer in flight (cluster.PULL_MAX_BYTES).


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class QueueSlice:
    """One queue's offsets [begin, end) and where its group's nodes were at planning time."""

    topic: str
    broker_group: str
    queue_id: int
    begin: int
    end: int
    addresses: tuple[str, ...]

    @property
    def range(self) -> QueueRange:
        return QueueRange(
            QueueRef(self.topic, self.broker_group, self.queue_id), self.begin, self.end
        )


@dataclass(frozen=True)
class SlicesPartition(InputPartition):
    """What one Spark task reads: one or more queue slices, in queue order (plain values only:
    Spark pickles it to the executor)."""

    slices: tuple[QueueSlice, ...]


class ClusterView:
    """Driver-side metadata: routes of the subscribed topics (the SDK's route cache, refreshed
    every ROUTE_TTL_MS so new queues and groups show up) and queue bounds (always fresh). Lives
    on the driver's reader only; never pickled."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.pool = ChannelPool()
        self.routes = RouteCache(opts.namesrv, self.pool, refresh_interval_ms=ROUTE_TTL_MS)
        self.known: dict[str, TopicRoute] = {}

    def close(self) -> None:
        self.pool.close()

    def refresh_routes(self, *, strict: bool) -> dict[str, TopicRoute]:
        """Routes of the subscribed topics. `strict`: an unknown topic raises (query start);
        otherwise a topic that vanished keeps its last route and its queues keep their offsets."""
        sub = self.opts.subscription
        if sub.kind is SubscriptionKind.PATTERN:
            topics = sub.pick_topics(self.routes.all_topics())
        else:
            topics = list(sub.topics)
        routes: dict[str, TopicRoute] = {}
        for t in topics:
            try:
                routes[t] = cluster.route_or_unknown(self.routes, t)
            except RaftMQError as exc:
                if strict:
                    raise
                _log.warning("spark_source.route_failed topic=%s error=%s", t, exc.message)
                if t in self.known:
                    routes[t] = self.known[t]
        self.known = routes
        return routes

    def queues(self) -> list[QueueRef]:
        sub = self.opts.subscription
        out = [q for r in self.known.values() for q in r.read_queues()]
        if sub.kind is SubscriptionKind.ASSIGN:
            wanted = set(sub.queues)
            out = [q for q in out if q in wanted]
        return sorted(out)

    def check_assignment(self) -> None:
        sub = self.opts.subscription
        if sub.kind is not SubscriptionKind.ASSIGN:
            return
        have = set(self.queues())
        for q in sub.queues:
            if q not in have:
                raise OptionError(
                    f"{ASSIGN} names {q.topic}/{q.broker_group}/{q.queue_id}, which the route of "
                    f"topic {q.topic!r} does not have"
                )

    def bounds(self) -> dict[QueueRef, QueueBounds]:
        return cluster.queue_bounds(self.routes, self.pool, self.queues())

    def resolve(self, which: str, bounds: Mapping[QueueRef, QueueBounds]) -> dict[QueueRef, int]:
        position = self.opts.starting if which == "start" else self.opts.ending
        lookups = time_lookups(position, sorted(bounds))
        found = cluster.offsets_for_times(self.routes, self.pool, lookups) if lookups else {}
        fallback = PositionKind.EARLIEST if which == "start" else PositionKind.LATEST
        return resolve_position(position, bounds, found, fallback=fallback)

    def partitions(self, ranges: Sequence[QueueRange]) -> list[InputPartition]:
        out: list[InputPartition] = []
        pieces = split_ranges(
            ranges, min_partitions=self.opts.min_partitions, max_rows=MAX_PARTITION_ROWS
        )
        # minPartitions asks for tasks: small ranges then keep one each instead of sharing.
        groups = (
            [(r,) for r in pieces]
            if self.opts.min_partitions is not None
            else group_ranges(pieces, task_rows(pieces, MIN_PARTITION_ROWS, TASKS_PER_BATCH))
        )
        for group in groups:
            slices = []
            for r in group:
                route = self.known.get(r.queue.topic)
                q = r.queue
                addrs = cluster.group_addresses(route, q.broker_group) if route else ()
                slices.append(
                    QueueSlice(q.topic, q.broker_group, q.queue_id, r.begin, r.end, addrs)
                )
            out.append(SlicesPartition(tuple(slices)))
        return out


def check_topics_exist(opts: SourceOptions) -> None:
    """Fail before any work when a named topic is unknown (subscribe / assign)."""
    if opts.subscription.kind is SubscriptionKind.PATTERN:
        return
    view = ClusterView(opts)
    try:
        view.refresh_routes(strict=True)
        view.check_assignment()
    finally:
        view.close()


def read_partition(opts: SourceOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """Executor side: the partition's rows as Arrow batches, slice after slice, pull answers
    combined up to TARGET_BATCH_ROWS / TARGET_BATCH_BYTES a batch; the next batches are pulled
    and converted on a thread of their own while Spark consumes this one (readAheadBatches
    ahead at most; 0: on Spark's thread, between the batches it takes)."""
    if not isinstance(partition, SlicesPartition):
        raise TypeError(f"not a raftmq partition: {partition!r}")
    keep_freed_memory()  # Spark's Python worker, on the executor (common/malloc_policy.py)
    if opts.read_ahead_batches == 0:
        return _partition_batches(opts, partition)
    return read_ahead(
        lambda: _partition_batches(opts, partition),
        opts.read_ahead_batches,
        name="raftmq-spark-read-ahead",
    )


def _partition_batches(opts: SourceOptions, partition: SlicesPartition) -> Iterator[pa.RecordBatch]:
    tag_filter = parse_tag_expression(opts.tag_expression)
    pending: list[Part] = []
    rows = size = 0
    for part in partition.slices:
        for got in read_slice(opts, part, tag_filter):
            pending.append(got)
            rows += got.num_rows
            size += got.nbytes
            if rows >= TARGET_BATCH_ROWS or size >= TARGET_BATCH_BYTES:
                yield _handed(opts, pending, tag_filter)
                pending, rows, size = [], 0, 0
    if pending:
        yield _handed(opts, pending, tag_filter)


def _handed(opts: SourceOptions, parts: list[Part], tag_filter: TagFilter) -> pa.RecordBatch:
    """One batch for Spark from pull answers' parts (their rows copied once)."""
    out = combine(parts, tag_filter)
    return with_headers(out) if opts.include_headers else out


def read_slice(opts: SourceOptions, part: QueueSlice, tag_filter: TagFilter) -> Iterator[Part]:
    """One queue slice's rows as parts for `combine` (this process's SDK client)."""
    for raw in cluster.pull_range(
        cluster.executor_client(opts.namesrv),
        part.range,
        part.addresses,
        tag_expression=opts.tag_expression,
        batch_size=opts.pull_batch_size,
        poll_timeout_ms=opts.poll_timeout_ms,
        fail_on_data_loss=opts.fail_on_data_loss,
    ):
        for got in pull_parts(
            raw,
            part.topic,
            part.broker_group,
            part.queue_id,
            end_offset=part.end,
            tag_filter=tag_filter,
        ):
            if got.num_rows:
                yield got


class RaftMQBatchReader(DataSourceReader):
    """spark.read: startingOffsets (default earliest) to endingOffsets (default latest)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.opts = parse_source_options(options, streaming=False)
        for w in self.opts.warnings:
            _log.warning("spark_source.option %s", w)

    def partitions(self) -> Sequence[InputPartition]:
        view = ClusterView(self.opts)
        try:
            return self._plan(view)
        finally:
            view.close()

    def _plan(self, view: ClusterView) -> list[InputPartition]:
        view.refresh_routes(strict=True)
        view.check_assignment()
        bounds = view.bounds()
        missing = sorted(set(view.queues()) - set(bounds))
        if missing:
            q = missing[0]
            raise RuntimeError(
                f"no node of broker group {q.broker_group} answered for {q.topic}/{q.queue_id}; "
                "a batch read needs every queue's bounds (is the group running?)"
            )
        start = view.resolve("start", bounds)
        end = view.resolve("end", bounds)
        for q, offset in start.items():
            # A start before retention's cut or past the end is data loss, as in a stream.
            start[q] = check_start(
                q, offset, bounds[q], fail_on_data_loss=self.opts.fail_on_data_loss
            )
        return view.partitions(plan_ranges(start, end))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from read_partition(self.opts, partition)


class RaftMQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """spark.readStream: offsets {topic: {group: {queue: next offset}}} in Spark's checkpoint."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.opts = parse_source_options(options, streaming=True)
        self._view: ClusterView | None = None
        self._target: dict[QueueRef, int] | None = None
        self._last_batch_ms = _now_ms()
        self._latest: dict[QueueRef, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Executors get the options only; the driver's metadata cache stays on the driver.
        state = dict(self.__dict__)
        state["_view"] = None
        return state

    def _cluster(self) -> ClusterView:
        if self._view is None:
            self._view = ClusterView(self.opts)
        return self._view

    def initialOffset(self) -> dict[str, Any]:
        view = self._cluster()
        view.refresh_routes(strict=True)
        view.check_assignment()
        bounds = view.bounds()
        return offsets_json.to_json_dict(view.resolve("start", bounds))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        view = self._cluster()
        view.refresh_routes(strict=False)
        self._target = {q: b.max_offset for q, b in view.bounds().items()}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = offsets_json.from_json_dict(start, what="checkpointed offsets")
        now = _now_ms()
        view = self._cluster()
        view.refresh_routes(strict=False)
        bounds = view.bounds()
        self._latest = {q: b.max_offset for q, b in bounds.items()}
        moved: dict[QueueRef, int] = {}
        for q, offset in begin.items():
            b = bounds.get(q)
            if b is not None:
                ok = check_start(q, offset, b, fail_on_data_loss=self.opts.fail_on_data_loss)
                if ok < offset:  # the queue shrank: go on from its end, with no rows this batch
                    moved[q] = ok
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = plan_end(begin, bounds, max_rows=max_rows, target=self._target)
        end.update(moved)
        if (
            self._target is None
            and hold_back(
                backlog(begin, end),
                min_rows=self.opts.min_offsets_per_trigger,
                last_batch_ms=self._last_batch_ms,
                now_ms=now,
                max_trigger_delay_ms=self.opts.max_trigger_delay_ms,
            )
            and not (set(end) - set(begin))
        ):
            return offsets_json.to_json_dict(begin)
        if end != begin:
            self._last_batch_ms = now
        return offsets_json.to_json_dict(end)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return None if self._latest is None else offsets_json.to_json_dict(self._latest)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin = offsets_json.from_json_dict(start, what="checkpointed offsets")
        stop = offsets_json.from_json_dict(end, what="checkpointed offsets")
        ranges = plan_ranges(begin, stop)
        if not ranges:
            return []
        view = self._cluster()
        view.refresh_routes(strict=False)
        return view.partitions(ranges)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from read_partition(self.opts, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: offsets live in the checkpoint, not in a consumer group."""

    def stop(self) -> None:
        if self._view is not None:
            self._view.close()
            self._view = None


class RaftMQDataSource(DataSource):
    """Format "raftmq": read topics (batch and streaming) and write to them exactly once."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return SCHEMA_WITH_HEADERS if include_headers(self.options) else SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return RaftMQBatchReader(self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        reader = RaftMQStreamReader(self.options)
        check_topics_exist(reader.opts)
        return reader

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from raftmq.spark_source.sink import RaftMQBatchWriter

        return RaftMQBatchWriter(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from raftmq.spark_source.sink import RaftMQStreamWriter

        return RaftMQStreamWriter(self.options, schema, overwrite)


__all__ = ["RaftMQDataSource", "TopicNotFoundError"]
