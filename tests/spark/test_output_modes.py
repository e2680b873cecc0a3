"""Every output mode of Spark's Kafka sink, exactly once, through a real SparkSession and cluster:
a running `groupBy(key).count()` in update mode (foreach_batch_sink) and complete mode (the
format itself and foreach_batch_sink), a replayed micro-batch that stores nothing twice even when
its first attempt stored part of it and the replay sees the rows in another order, and a batch job
re-run under the same `writeId`."""

from __future__ import annotations

import collections
import time
import uuid
from pathlib import Path
from typing import Any

from raftmq.spark_source.micro_batch_sink import batch_write_id, foreach_batch_sink
from raftmq.spark_source.sink_plan import MAX_CHUNK_MESSAGES
from tests.harness.readme import readme_blocks, substitute
from tests.spark.support import GROUPS, Cluster

KEYS = [f"k{i}" for i in range(7)]


def _fill(cluster: Cluster, topic: str, rounds: int) -> collections.Counter[str]:
    """Messages keyed by KEYS, k<i> appearing i+1 times per round; the true count per key."""
    cluster.create_topic(topic, queues=2)
    truth: collections.Counter[str] = collections.Counter()
    for r in range(rounds):
        for i, key in enumerate(KEYS):
            group = GROUPS[i % len(GROUPS)]
            bodies = [f"{key}-{r}-{j}".encode() for j in range(i + 1)]
            cluster.send(topic, group, (r + i) % 2, bodies, keys=[key])
            truth[key] += len(bodies)
    return truth


def _counts(spark: Any, cluster: Cluster, topic: str) -> Any:
    return (
        spark.readStream.format("raftmq")
        .option("nameServer", cluster.namesrv_address)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "15")  # several micro-batches: a key is updated often
        .load()
        .groupBy("key")
        .count()
        .selectExpr("key", "cast(`count` as string) as value")
    )


def _last_per_key(cluster: Cluster, topic: str) -> tuple[dict[str, int], int]:
    """The last value written per key (a key's rows go to one queue, in order) and the number of
    rows in the topic."""
    rows = cluster.read_topic(topic)
    last: dict[str, int] = {}
    for r in rows:  # by group, queue and offset
        last[r.message.keys[0]] = int(r.message.body)
    return last, len(rows)


def test_update_mode_running_count_through_foreach_batch(
    spark: Any, cluster: Cluster, tmp_path: Any
) -> None:
    truth = _fill(cluster, "modes-update-in", rounds=3)
    cluster.create_topic("modes-update-out", queues=2)
    q = (
        _counts(spark, cluster, "modes-update-in")
        .writeStream.outputMode("update")
        .foreachBatch(
            foreach_batch_sink(nameServer=cluster.namesrv_address, topic="modes-update-out")
        )
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(240), "the update-mode query did not finish"
    assert q.exception() is None
    last, rows = _last_per_key(cluster, "modes-update-out")
    assert last == dict(truth)
    assert rows > len(KEYS), "update mode should have written some keys more than once"


def test_complete_mode_through_the_format(spark: Any, cluster: Cluster, tmp_path: Any) -> None:
    truth = _fill(cluster, "modes-complete-in", rounds=2)
    cluster.create_topic("modes-complete-out", queues=2)
    q = (
        _counts(spark, cluster, "modes-complete-in")
        .writeStream.outputMode("complete")
        .format("raftmq")
        .option("nameServer", cluster.namesrv_address)
        .option("topic", "modes-complete-out")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(240), "the complete-mode query did not finish"
    assert q.exception() is None
    last, rows = _last_per_key(cluster, "modes-complete-out")
    assert last == dict(truth)
    assert rows >= 2 * len(KEYS), "complete mode rewrites the whole table each micro-batch"


def _rows_df(spark: Any, rows: list[tuple[str, str]]) -> Any:
    return spark.createDataFrame(rows, "key string, value string").coalesce(1)


def test_a_replayed_micro_batch_stores_each_row_once_whatever_its_order(
    spark: Any, cluster: Cluster
) -> None:
    """The first attempt of micro-batch 3 stored its first chunk only (as a driver killed
    mid-write leaves it); Spark's replay hands the rows over in another order. The sink sorts a
    partition before giving sequences, so the replay stores exactly the rows that were missing.
    Without the sort the replay stores rows of the first chunk twice and loses the last 512
    (seen failing with `sortWithinPartitions` removed)."""
    topic = "modes-replay"
    cluster.create_topic(topic, queues=1, groups=[GROUPS[0]])  # one queue: chunks of 512 rows
    rows = [(f"key{i % 5}", f"v{i:04d}") for i in range(1200)]
    ns = cluster.namesrv_address
    query_id = str(uuid.uuid4())
    sc = spark.sparkContext
    sc.setLocalProperty("sql.streaming.queryId", query_id)
    try:
        write = foreach_batch_sink(nameServer=ns, topic=topic)
        (
            _rows_df(spark, sorted(rows)[:MAX_CHUNK_MESSAGES])  # the first attempt's first chunk
            .write.format("raftmq")
            .option("nameServer", ns)
            .option("topic", topic)
            .option("writeId", batch_write_id(query_id, 3))
            .mode("append")
            .save()
        )
        write(_rows_df(spark, list(reversed(rows))), 3)  # the replay, in another order
        got = collections.Counter(
            (m.message.keys[0], m.message.body.decode()) for m in cluster.read_topic(topic)
        )
        assert got == collections.Counter(rows), "each row of the batch stored exactly once"
        write(_rows_df(spark, rows), 3)  # once more: nothing new
        assert len(cluster.read_topic(topic)) == len(rows)
        write(_rows_df(spark, rows[:4]), 4)  # another micro-batch is stored
        assert len(cluster.read_topic(topic)) == len(rows) + 4
    finally:
        sc.setLocalProperty("sql.streaming.queryId", None)


def test_a_batch_job_rerun_under_its_write_id_stores_nothing_twice(
    spark: Any, cluster: Cluster
) -> None:
    topic = "modes-write-id"
    cluster.create_topic(topic, queues=2)
    df = _rows_df(spark, [(f"key{i % 3}", f"v{i}") for i in range(40)])
    for _ in range(2):
        (
            df.write.format("raftmq")
            .option("nameServer", cluster.namesrv_address)
            .option("topic", topic)
            .option("writeId", "nightly-1")
            .mode("append")
            .save()
        )
    assert len(cluster.read_topic(topic)) == 40
    df.write.format("raftmq").option("nameServer", cluster.namesrv_address).option(
        "topic", topic
    ).mode("append").save()  # no writeId: a new job, stored again
    assert len(cluster.read_topic(topic)) == 80


def test_foreach_batch_sink_checks_options_on_the_driver(cluster: Cluster) -> None:
    import pytest

    from raftmq.spark_source.options import OptionError

    with pytest.raises(OptionError, match="nameServer"):
        foreach_batch_sink(topic="x")
    with pytest.raises(OptionError, match="chosen per micro-batch"):
        foreach_batch_sink(nameServer=cluster.namesrv_address, topic="x", writeId="w")


def test_the_readme_update_mode_example_runs(spark: Any, cluster: Cluster, tmp_path: Path) -> None:
    (block,) = readme_blocks("python", "sparkupdate")
    truth = _fill(cluster, "payments", rounds=2)
    cluster.create_topic("payment-counts", queues=2)
    code = substitute(block.code, cluster.namesrv_address, {"/tmp/ck-counts": str(tmp_path)})
    before = {q.id for q in spark.streams.active}
    exec(compile("\n" * block.line + code, "README.md", "exec"), {"spark": spark})
    (query,) = [q for q in spark.streams.active if q.id not in before]
    try:
        deadline = time.monotonic() + 120
        last: dict[str, int] = {}
        while time.monotonic() < deadline and last != dict(truth):
            assert query.exception() is None
            time.sleep(0.5)
            last = _last_per_key(cluster, "payment-counts")[0]
        assert last == dict(truth)
    finally:
        query.stop()
