"""The raftmq sink through a real SparkSession: a stream from topic A through a transformation into
topic B that fails after a micro-batch's rows were stored (before Spark's checkpoint commit) and is
restarted: B holds every result exactly once. Also batch writes (keys, tags, properties, queue
choice) and schemas the sink refuses before any job runs."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest

from tests.spark.support import Cluster


def _pipeline(spark: Any, cluster: Cluster, source: str, sink: str, ck: Path, **extra: str) -> Any:
    from pyspark.sql import functions as F

    df = (
        spark.readStream.format("raftmq")
        .option("nameServer", cluster.namesrv_address)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "200")
        .load()
        .select(
            F.concat(F.lit(b"out-"), F.col("value")).alias("value"),
            F.col("key"),
            F.col("tags"),
            F.map_from_arrays(F.array(F.lit("src")), F.array(F.col("msgId"))).alias("properties"),
        )
    )
    writer = (
        df.writeStream.format("raftmq")
        .option("nameServer", cluster.namesrv_address)
        .option("topic", sink)
        .option("checkpointLocation", str(ck))
        .trigger(availableNow=True)
    )
    for k, v in extra.items():
        writer = writer.option(k, v)
    return writer.start()


def test_failure_after_write_then_restart_stores_each_result_once(
    spark: Any, cluster: Cluster, tmp_path: Path
) -> None:
    src, dst = "spark-sink-a", "spark-sink-b"
    cluster.create_topic(src, queues=2)
    cluster.create_topic(dst, queues=2)
    expected = set()
    for g in ("broker-a", "broker-b"):
        for qid in range(2):
            bodies = [f"{g}-{qid}-{i}".encode() for i in range(150)]
            cluster.send(src, g, qid, bodies, keys=[f"k{qid}"] if qid else [])
            expected |= {b"out-" + b for b in bodies}
    ck = tmp_path / "ck"
    # Micro-batches 0 and 1 are written; batch 1 fails in commit(), after the broker stored its
    # rows and before Spark records the batch as committed.
    first = _pipeline(spark, cluster, src, dst, ck, **{"failpoint.afterWriteBatch": "1"})
    with pytest.raises(Exception, match=r"failpoint\.afterWriteBatch"):
        first.awaitTermination(180)
    stored = cluster.read_topic(dst)
    assert len(stored) == 400  # two batches of 200 stored before the failure
    assert sorted(p.name for p in (ck / "commits").iterdir() if p.name.isdigit()) == ["0"]
    # The restart replays batch 1 (same query id, batch id and partitions): the broker answers
    # its sequences as duplicates, then batch 2 goes on.
    second = _pipeline(spark, cluster, src, dst, ck)
    assert second.awaitTermination(180)
    assert second.exception() is None
    replayed = [p for p in second.recentProgress if p["batchId"] == 1]
    assert replayed and replayed[0]["numInputRows"] == 200
    out = cluster.read_topic(dst)
    counts = collections.Counter(m.message.body for m in out)
    assert len(out) == 600 and set(counts) == expected
    assert max(counts.values()) == 1
    # Provenance, tags and keys travel; keyed rows of one key share a queue.
    assert all(m.message.properties["src"].startswith(("broker-a-", "broker-b-")) for m in out)
    by_key = collections.defaultdict(set)
    for m in out:
        if m.message.keys:
            by_key[m.message.keys[0]].add((m.broker_group, m.queue_id))
    assert set(by_key) == {"k1"} and len(by_key["k1"]) == 1


def test_batch_write_and_schema_checks(spark: Any, cluster: Cluster) -> None:
    from pyspark.sql.types import MapType, StringType, StructField, StructType

    topic = "spark-sink-batch"
    cluster.create_topic(topic, queues=2)
    schema = StructType(
        [
            StructField("value", StringType()),
            StructField("key", StringType()),
            StructField("topic", StringType()),
            StructField("tags", StringType()),
            StructField("properties", MapType(StringType(), StringType())),
        ]
    )
    rows = [
        (f"v{i}", f"key{i % 3}", topic, "TagA" if i % 2 else None, {"i": str(i)}) for i in range(60)
    ]
    (
        spark.createDataFrame(rows, schema)
        .repartition(3)
        .write.format("raftmq")
        .option("nameServer", cluster.namesrv_address)
        .mode("append")
        .save()
    )
    out = cluster.read_topic(topic)
    assert sorted(m.message.body for m in out) == sorted(f"v{i}".encode() for i in range(60))
    for m in out:
        i = int(m.message.properties["i"])
        assert m.message.keys == [f"key{i % 3}"]
        assert m.message.tags == ("TagA" if i % 2 else "")
    queues = collections.defaultdict(set)
    for m in out:
        queues[m.message.keys[0]].add((m.broker_group, m.queue_id))
    assert all(len(v) == 1 for v in queues.values())

    tracker = spark.sparkContext.statusTracker()
    jobs = len(tracker.getJobIdsForGroup())
    bad = spark.createDataFrame([("x", 1)], "value string, partition int")
    with pytest.raises(Exception, match="partition are not written by the raftmq sink"):
        bad.write.format("raftmq").option("nameServer", cluster.namesrv_address).option(
            "topic", topic
        ).mode("append").save()
    no_topic = spark.createDataFrame([("x",)], "value string")
    with pytest.raises(Exception, match="a `topic` column or the 'topic' option"):
        no_topic.write.format("raftmq").option("nameServer", cluster.namesrv_address).mode(
            "append"
        ).save()
    assert len(tracker.getJobIdsForGroup()) == jobs


def test_missing_output_topic_fails_at_start_naming_the_fix(
    spark: Any, cluster: Cluster, tmp_path: Path
) -> None:
    """The README's sink to a topic that does not exist: the query fails before its first
    micro-batch runs, with the topic and the command that creates it (as does a batch write)."""
    src, missing = "spark-sink-present", "spark-sink-missing"
    cluster.create_topic(src, queues=1)
    cluster.send(src, "broker-a", 0, [b"x"])
    tracker = spark.sparkContext.statusTracker()
    jobs = len(tracker.getJobIdsForGroup())
    fix = f"raftmq topic create {missing}"
    with pytest.raises(Exception, match=fix) as failed:
        query = _pipeline(spark, cluster, src, missing, tmp_path / "ck")
        try:
            query.awaitTermination(60)
            assert query.exception() is None
        finally:
            query.stop()
    assert "TopicNotFoundError" in str(failed.value) or "unknown" in str(failed.value)
    df = spark.createDataFrame([("x",)], "value string")
    with pytest.raises(Exception, match=fix):
        df.write.format("raftmq").option("nameServer", cluster.namesrv_address).option(
            "topic", missing
        ).mode("append").save()
    assert len(tracker.getJobIdsForGroup()) == jobs, "a Spark job ran before the topic check"
