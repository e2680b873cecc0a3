"""The columnar source through Spark: messages the SDK producer stored as v2 batches read back by
spark.read with every column right, Kafka's headers column (includeHeaders), more tasks than
queues (minPartitions) and the tag filter on the columnar path; one topic, the package's cluster
and SparkSession."""

from __future__ import annotations

from typing import Any

import pytest

from raftmq.client.messages import OutgoingMessage
from raftmq.client.producer import Producer
from raftmq.common.types import QueueRef
from tests.spark.support import Cluster

TOPIC = "spark-columnar"
PER_QUEUE = 300


@pytest.fixture(scope="module")
def stored(cluster: Cluster) -> dict[tuple[str, int, int], OutgoingMessage]:
    """Queues 0 and 1 of broker-a: PER_QUEUE messages each, sent as v2 stored batches by the
    SDK's producer; message i has tag a or b, keys or none, properties or none."""
    cluster.create_topic(TOPIC, queues=2)
    producer = Producer(cluster.namesrv_address, batch_max_messages=128)
    sent: dict[tuple[str, int, int], OutgoingMessage] = {}
    try:
        for qid in (0, 1):
            msgs = [
                OutgoingMessage(
                    f"q{qid}-{i}".encode(),
                    tags=("a" if i % 2 else "b") if i % 5 else None,
                    keys=(f"k{i}", "é") if i % 3 else (),
                    properties={"n": str(i), "ü": "v"} if i % 4 else {},
                )
                for i in range(PER_QUEUE)
            ]
            results = producer.send_batch(TOPIC, msgs, queue=QueueRef(TOPIC, "broker-a", qid))
            for m, r in zip(msgs, results, strict=True):
                sent[("broker-a", qid, r.queue_offset)] = m
    finally:
        producer.close()
    return sent


def test_v2_batches_read_as_columns_with_headers_and_more_tasks(
    spark: Any, cluster: Cluster, stored: dict[tuple[str, int, int], OutgoingMessage]
) -> None:
    df = (
        spark.read.format("raftmq")
        .option("nameServer", cluster.namesrv_address)
        .option("subscribe", TOPIC)
        .option("includeHeaders", "true")
        .option("minPartitions", "5")
        .load()
    )
    assert df.columns[-1] == "headers"
    # 2 queues of 300 rows, 5 tasks wanted: Kafka's rounding gives round(2.5) = 3 pieces each.
    assert df.rdd.getNumPartitions() == 6
    rows = df.collect()
    assert len(rows) == len(stored)
    for r in rows:
        m = stored[(r.brokerName, r.queueId, r.queueOffset)]
        assert r.value == m.body and r.topic == TOPIC
        assert r.tags == m.tags and r.keys == list(m.keys)
        assert r.key == (m.keys[0] if m.keys else None)
        assert r.properties == dict(m.properties)
        assert [(h.key, h.value) for h in r.headers] == [
            (k, v.encode()) for k, v in m.properties.items()
        ]
        assert r.bornTimestamp is not None and r.storeTimestamp is not None
    assert len({r.msgId for r in rows}) == len(rows)
    tagged = (
        spark.read.format("raftmq")
        .option("nameServer", cluster.namesrv_address)
        .option("subscribe", TOPIC)
        .option("subExpression", "a")
        .load()
        .select("value")
        .collect()
    )
    assert sorted(r.value for r in tagged) == sorted(
        m.body for m in stored.values() if m.tags == "a"
    )
