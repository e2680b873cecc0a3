"""Streaming reads through a real SparkSession: Trigger.AvailableNow with maxOffsetsPerTrigger into
parquet (exact rows, batch sizes), and a running query that starts at latest and picks up a
broker group that starts serving the topic while it runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.harness.procs import wait_until
from tests.spark.support import Cluster


def test_available_now_in_limited_batches(spark: Any, cluster: Cluster, tmp_path: Path) -> None:
    topic = "spark-st-avail"
    cluster.create_topic(topic, queues=2)
    sent = {}
    for g, qid, n in (("broker-a", 0, 150), ("broker-a", 1, 50), ("broker-b", 0, 100)):
        bodies = [f"{g}-{qid}-{i}".encode() for i in range(n)]
        cluster.send(topic, g, qid, bodies)
        sent.update({b: (g, qid, i) for i, b in enumerate(bodies)})
    out, ck = tmp_path / "out", tmp_path / "ck"
    q = (
        spark.readStream.format("raftmq")
        .option("nameServer", cluster.namesrv_address)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "120")
        .load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(ck))
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(180)
    assert q.exception() is None
    sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    assert sizes == [120, 120, 60]
    rows = spark.read.parquet(str(out)).collect()
    assert len(rows) == 300
    assert {r.value: (r.brokerName, r.queueId, r.queueOffset) for r in rows} == sent
    # The checkpointed offsets are the canonical JSON, queue ids in numeric order.
    last = max(
        (p for p in (ck / "offsets").iterdir() if p.name.isdigit()), key=lambda p: int(p.name)
    )
    assert last.read_text().splitlines()[-1] == (
        '{"spark-st-avail": {"broker-a": {"0": 150, "1": 50}, "broker-b": {"0": 100, "1": 0}}}'
    )


def test_running_query_from_latest_picks_up_a_new_group(
    spark: Any, cluster: Cluster, tmp_path: Path
) -> None:
    topic = "spark-st-live"
    cluster.create_topic(topic, queues=2, groups=["broker-a"])
    cluster.send(topic, "broker-a", 0, [b"before-start"])
    name = "raftmq_live"
    q = (
        spark.readStream.format("raftmq")
        .option("nameServer", cluster.namesrv_address)
        .option("subscribe", topic)
        .load()
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        wait_until(lambda: q.lastProgress is not None, 120, "the first micro-batch")

        def seen() -> set[bytes]:
            return {bytes(r.value) for r in spark.sql(f"select value from {name}").collect()}

        cluster.send(topic, "broker-a", 1, [b"a1-live"])
        wait_until(lambda: b"a1-live" in seen(), 60, "a live message")
        cluster.create_topic(topic, queues=2, groups=["broker-b"], wait=False)
        cluster.wait_route(topic, {"broker-a": 2, "broker-b": 2})
        # broker-b enters at its first offset, so what it stores from now on is read.
        wait_until(
            lambda: "broker-b" in json_offsets(q),
            60,
            "the query to pick up broker-b",
        )
        cluster.send(topic, "broker-b", 1, [b"b1-new"])
        cluster.send(topic, "broker-a", 0, [b"a0-new"])
        wait_until(lambda: {b"b1-new", b"a0-new"} <= seen(), 60, "messages on the new group")
        got = spark.sql(f"select value, brokerName from {name}").collect()
        assert sorted(bytes(r.value) for r in got) == [b"a0-new", b"a1-live", b"b1-new"]
    finally:
        q.stop()


def json_offsets(q: Any) -> str:
    p = q.lastProgress
    return "" if p is None else str(p["sources"][0]["endOffset"])
