"""Batch reads (spark.read.format("raftmq")) against a real two-group cluster: exact rows for
offset and timestamp ranges, tag filters, the row schema, auto-registration, and bad options that
fail with a clear message before any Spark job runs."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.spark.support import Cluster

TOPIC = "spark-batch"


@pytest.fixture(scope="module")
def loaded(cluster: Cluster) -> dict[str, Any]:
    """4 queues on each group; queue q of group g holds 10 messages g-q-0..9, sent in two halves
    with a store-time cut between them."""
    cluster.create_topic(TOPIC, queues=4)
    for g in ("broker-a", "broker-b"):
        for q in range(4):
            cluster.send(
                TOPIC,
                g,
                q,
                [f"{g}-{q}-{i}".encode() for i in range(5)],
                tags="even" if q % 2 == 0 else "odd",
                keys=[f"k-{g}-{q}", "second"],
                properties={"n": str(q)},
            )
    time.sleep(0.05)
    cut_ms = time.time_ns() // 1_000_000
    time.sleep(0.05)
    for g in ("broker-a", "broker-b"):
        for q in range(4):
            cluster.send(TOPIC, g, q, [f"{g}-{q}-{i}".encode() for i in range(5, 10)])
    return {"cut_ms": cut_ms}


def _read(spark: Any, cluster: Cluster, **options: str) -> Any:
    reader = spark.read.format("raftmq").option("nameServer", cluster.namesrv_address)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def _bodies(df: Any) -> list[str]:
    return sorted(r.value.decode() for r in df.select("value").collect())


def test_whole_topic_with_schema_and_columns(spark: Any, cluster: Cluster, loaded: Any) -> None:
    df = _read(spark, cluster, subscribe=TOPIC)
    assert df.columns == [
        "key",
        "value",
        "topic",
        "brokerName",
        "queueId",
        "queueOffset",
        "msgId",
        "tags",
        "keys",
        "bornTimestamp",
        "storeTimestamp",
        "properties",
    ]
    rows = df.collect()
    assert len(rows) == 80
    assert sorted(r.value.decode() for r in rows) == sorted(
        f"{g}-{q}-{i}" for g in ("broker-a", "broker-b") for q in range(4) for i in range(10)
    )
    first = next(r for r in rows if r.value == b"broker-b-2-0")
    assert (first.topic, first.brokerName, first.queueId, first.queueOffset) == (
        TOPIC,
        "broker-b",
        2,
        0,
    )
    assert first.key == "k-broker-b-2" and first.keys == ["k-broker-b-2", "second"]
    assert first.tags == "even" and first.properties == {"n": "2"}
    assert first.msgId.startswith("broker-b-") and first.storeTimestamp is not None
    later = next(r for r in rows if r.value == b"broker-a-1-7")
    assert later.key is None and later.keys == [] and later.tags is None
    assert later.queueOffset == 7
    assert len({r.msgId for r in rows}) == 80


def test_offsets_json_range(spark: Any, cluster: Cluster, loaded: Any) -> None:
    starting = {TOPIC: {"broker-a": {"0": 3, "1": -2}, "broker-b": {"3": 9}}}
    ending = {
        TOPIC: {"broker-a": {"0": 6, "1": 2, "2": 0, "3": 0}, "broker-b": {"0": 0, "1": 0, "2": 1}}
    }
    df = _read(
        spark,
        cluster,
        subscribe=TOPIC,
        startingOffsets=json.dumps(starting),
        endingOffsets=json.dumps(ending),
    )
    # a0: 3..5, a1: 0..1, a2/a3: nothing (end 0), b0/b1: nothing, b2: 0, b3: 9 (end latest).
    assert _bodies(df) == sorted(
        [
            *("broker-a-0-3", "broker-a-0-4", "broker-a-0-5", "broker-a-1-0", "broker-a-1-1"),
            *("broker-b-2-0", "broker-b-3-9"),
        ]
    )


def test_assign_and_tag_filter(spark: Any, cluster: Cluster, loaded: Any) -> None:
    assign = json.dumps({TOPIC: {"broker-b": [0, 1]}})
    df = _read(spark, cluster, assign=assign)
    assert _bodies(df) == sorted(f"broker-b-{q}-{i}" for q in (0, 1) for i in range(10))
    tagged = _read(spark, cluster, subscribe=TOPIC, subExpression="odd")
    assert _bodies(tagged) == sorted(
        f"{g}-{q}-{i}" for g in ("broker-a", "broker-b") for q in (1, 3) for i in range(5)
    )


def test_timestamps(spark: Any, cluster: Cluster, loaded: Any) -> None:
    cut = loaded["cut_ms"]
    after = _read(spark, cluster, subscribe=TOPIC, startingTimestamp=str(cut))
    assert _bodies(after) == sorted(
        f"{g}-{q}-{i}" for g in ("broker-a", "broker-b") for q in range(4) for i in range(5, 10)
    )
    before = _read(spark, cluster, subscribe=TOPIC, endingTimestamp=str(cut))
    assert len(_bodies(before)) == 40 and all(int(b[-1]) < 5 for b in _bodies(before))
    per_queue = json.dumps({TOPIC: {"broker-a": {"2": cut}}})
    mixed = _read(
        spark,
        cluster,
        subscribe=TOPIC,
        startingOffsetsByTimestamp=per_queue,
        endingOffsets=json.dumps({TOPIC: {"broker-a": {"2": -1}, "broker-b": {"0": 2}}}),
    )
    # a2 from the cut on; every other queue of broker-a from earliest (fallback) to latest;
    # b0 to offset 2; b1..b3 to latest.
    expected = [f"broker-a-2-{i}" for i in range(5, 10)]
    expected += [f"broker-a-{q}-{i}" for q in (0, 1, 3) for i in range(10)]
    expected += ["broker-b-0-0", "broker-b-0-1"]
    expected += [f"broker-b-{q}-{i}" for q in (1, 2, 3) for i in range(10)]
    assert _bodies(mixed) == sorted(expected)


def test_pattern_ending_by_timestamp_and_data_loss(
    spark: Any, cluster: Cluster, loaded: Any
) -> None:
    """subscribePattern with endingOffsetsByTimestamp; a start past a queue's end (a recreated
    topic) fails with failOnDataLoss=true and goes on from the end with false."""
    cut = loaded["cut_ms"]
    df = _read(
        spark,
        cluster,
        subscribePattern="spark-bat[c]h",
        endingOffsetsByTimestamp=json.dumps({TOPIC: {"broker-b": {"1": cut}}}),
    )
    expected = [
        f"{g}-{q}-{i}" for g in ("broker-a", "broker-b") for q in range(4) for i in range(10)
    ]
    # b1 ends at the cut (its rows 5..9 were stored after it); other queues end at latest
    assert _bodies(df) == sorted(
        b for b in expected if not b.startswith("broker-b-1-") or int(b[-1]) < 5
    )
    past = json.dumps({TOPIC: {"broker-a": {"3": 1000}}})
    with pytest.raises(Exception, match="the query is at offset 1000 but the queue ends at 10"):
        _read(spark, cluster, subscribe=TOPIC, startingOffsets=past).collect()
    kept = _read(spark, cluster, subscribe=TOPIC, startingOffsets=past, failOnDataLoss="false")
    assert _bodies(kept) == sorted(b for b in expected if not b.startswith("broker-a-3-"))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "no-such-topic"}, "topic 'no-such-topic' is unknown"),
        ({"subscribe": TOPIC, "assign": '{"x": {"broker-a": [0]}}'}, "exactly one of"),
        (
            {"subscribe": TOPIC, "startingOffsets": '{"spark-batch": {"broker-a": {"0": 1}'},
            "not valid JSON",
        ),
        (
            {"subscribe": TOPIC, "startingOffsets": '{"spark-batch": {"broker-a": {"x": 1}}}'},
            "queue id 'x'",
        ),
        ({"subscribe": TOPIC, "startingOffsets": "latest"}, "would read nothing"),
        (
            {"subscribe": TOPIC, "endingOffsets": '{"spark-batch": {"broker-z": {"0": 1}}}'},
            "does not have",
        ),
        ({"subscribe": TOPIC, "startingOffst": "earliest"}, "did you mean 'startingOffsets'"),
        ({"subscribe": TOPIC, "subExpression": "||"}, "not a tag expression"),
        ({"assign": json.dumps({TOPIC: {"broker-a": [9]}})}, "does not have"),
    ],
)
def test_bad_options_fail_before_any_job(
    spark: Any, cluster: Cluster, loaded: Any, options: dict[str, str], message: str
) -> None:
    tracker = spark.sparkContext.statusTracker()
    before = len(tracker.getJobIdsForGroup())
    with pytest.raises(Exception, match=message):
        _read(spark, cluster, **options).collect()
    assert len(tracker.getJobIdsForGroup()) == before, "a Spark job ran before the error"


def test_missing_nameserver_is_a_clear_error(spark: Any, loaded: Any) -> None:
    with pytest.raises(Exception, match="'nameServer' is required"):
        spark.read.format("raftmq").option("subscribe", TOPIC).load().collect()
