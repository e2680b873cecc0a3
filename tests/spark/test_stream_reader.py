"""The stream reader's driver and executor methods called directly (as Spark's runner and workers
call them) against a real two-group cluster, without a JVM: offsets in one fixed order, new
queues and broker groups picked up while running, backlog-proportional limits, AvailableNow
targets, minOffsetsPerTrigger, readers that pickle without connections, and exact range reads."""

from __future__ import annotations

import json
import pickle
from typing import Any

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from raftmq.spark_source.schema import arrow_schema
from raftmq.spark_source.source import QueueSlice, RaftMQStreamReader, SlicesPartition
from tests.harness.procs import wait_until
from tests.spark.support import Cluster


def _reader(cluster: Cluster, **options: str) -> RaftMQStreamReader:
    return RaftMQStreamReader({"nameServer": cluster.namesrv_address, **options})


def test_offsets_limits_and_new_queues(cluster: Cluster) -> None:
    topic = "spark-sr-grow"
    cluster.create_topic(topic, queues=2, groups=["broker-a"])
    reader = _reader(cluster, subscribe=topic, startingOffsets="earliest")
    start = reader.initialOffset()
    assert json.dumps(start) == json.dumps({topic: {"broker-a": {"0": 0, "1": 0}}})
    cluster.send(topic, "broker-a", 0, [b"x%d" % i for i in range(30)])
    cluster.send(topic, "broker-a", 1, [b"y%d" % i for i in range(10)])
    # 20 rows split by backlog 30:10 -> 15 + 5, keys in a fixed order.
    limited = reader.latestOffset(start, ReadMaxRows(20))
    assert json.dumps(limited) == json.dumps({topic: {"broker-a": {"0": 15, "1": 5}}})
    full = reader.latestOffset(limited, ReadAllAvailable())
    assert full == {topic: {"broker-a": {"0": 30, "1": 10}}}
    assert reader.reportLatestOffset() == full
    # A new broker group and a new queue on the old one appear while the query runs: they
    # enter at their first offset, and read from there on.
    cluster.create_topic(topic, queues=2, groups=["broker-b"], wait=False)
    cluster.update_topic(topic, "broker-a", 3)
    cluster.wait_route(topic, {"broker-a": 3, "broker-b": 2})
    cluster.send(topic, "broker-b", 1, [b"z"])

    def grown() -> dict[str, Any] | None:
        got = reader.latestOffset(full, ReadAllAvailable())
        return got if len(got[topic]) == 2 and len(got[topic]["broker-a"]) == 3 else None

    announced = wait_until(grown, 10, "the reader to see the new queues")
    assert announced == {
        topic: {"broker-a": {"0": 30, "1": 10, "2": 0}, "broker-b": {"0": 0, "1": 0}}
    }
    assert reader.partitions(full, announced) == []  # announcing reads nothing
    after = reader.latestOffset(announced, ReadAllAvailable())
    assert after[topic]["broker-b"] == {"0": 0, "1": 1}
    parts = reader.partitions(announced, after)
    assert all(isinstance(p, SlicesPartition) for p in parts)
    slices = [[(s.broker_group, s.queue_id, s.begin, s.end) for s in p.slices] for p in parts]  # type: ignore[attr-defined]
    assert slices == [[("broker-b", 1, 0, 1)]]
    # The reader Spark pickles for executors holds no connection; its copy reads the range.
    worker = pickle.loads(pickle.dumps(reader))
    batches = list(worker.read(parts[0]))
    assert [b.schema for b in batches] == [arrow_schema()]
    assert [v.as_py() for b in batches for v in b.column("value")] == [b"z"]
    reader.stop()


def test_available_now_target_and_min_offsets(cluster: Cluster) -> None:
    topic = "spark-sr-target"
    cluster.create_topic(topic, queues=1)
    cluster.send(topic, "broker-a", 0, [b"a"] * 10)
    reader = _reader(cluster, subscribe=topic, startingOffsets="earliest")
    start = reader.initialOffset()
    reader.prepareForTriggerAvailableNow()
    cluster.send(topic, "broker-a", 0, [b"late"] * 5)
    cluster.send(topic, "broker-b", 0, [b"late"] * 5)
    first = reader.latestOffset(start, ReadMaxRows(6))
    assert first == {topic: {"broker-a": {"0": 6}, "broker-b": {"0": 0}}}
    second = reader.latestOffset(first, ReadMaxRows(6))
    assert second == {topic: {"broker-a": {"0": 10}, "broker-b": {"0": 0}}}
    assert reader.latestOffset(second, ReadMaxRows(6)) == second  # the target is reached
    # minOffsetsPerTrigger holds a small backlog back until enough arrives.
    held = _reader(
        cluster,
        subscribe=topic,
        startingOffsets="earliest",
        minOffsetsPerTrigger="30",
        maxTriggerDelay="1h",
    )
    begin = held.initialOffset()
    assert held.latestOffset(begin, ReadAllAvailable()) == begin  # 20 rows < 30
    cluster.send(topic, "broker-b", 0, [b"more"] * 10)
    assert held.latestOffset(begin, ReadAllAvailable()) == {
        topic: {"broker-a": {"0": 15}, "broker-b": {"0": 15}}
    }


def test_partition_reads_exact_range_with_filter(cluster: Cluster) -> None:
    topic = "spark-sr-range"
    cluster.create_topic(topic, queues=1, groups=["broker-b"])
    for i in range(20):
        cluster.send(topic, "broker-b", 0, [b"m%d" % i], tags="keep" if i % 3 == 0 else "drop")
    part = SlicesPartition((QueueSlice(topic, "broker-b", 0, 4, 16, ()),))  # no address: by route
    for ahead in ("2", "0"):  # read ahead on a thread, and on the caller's
        reader = _reader(
            cluster,
            subscribe=topic,
            subExpression="keep",
            pullBatchSize="2",
            readAheadBatches=ahead,
        )
        rows = [r for b in reader.read(part) for r in b.to_pylist()]
        assert [r["queueOffset"] for r in rows] == [6, 9, 12, 15]
        assert [r["value"] for r in rows] == [b"m6", b"m9", b"m12", b"m15"]
