"""A Spark driver in its own process for the kill tests: streams a raftmq topic into parquet
(MODE parquet, OUT a directory), through a transformation into another topic with the raftmq
sink (MODE sink, OUT a topic), or as a running count per key in update mode through
foreach_batch_sink (MODE update, OUT a topic), with a checkpoint, until it is killed. Prints
`driver.started` once the query runs.

Usage: python -m tests.spark.stream_driver MODE NAMESRV TOPIC CHECKPOINT OUT MAX_OFFSETS TRIGGER_MS
"""

from __future__ import annotations

import os
import sys
from typing import Any

from tests.spark.support import SPARK_CONF, spark_env


def transform(df: Any) -> Any:
    """The sink pipeline's transformation (also used by the test's restart): out-<value>."""
    from pyspark.sql import functions as F

    return df.select(F.concat(F.lit(b"out-"), F.col("value")).alias("value"), F.col("key"))


def running_count(df: Any) -> Any:
    """The update-mode pipeline: messages per key so far, the count as the value."""
    return df.groupBy("key").count().selectExpr("key", "cast(`count` as string) as value")


def main(argv: list[str]) -> int:
    mode, namesrv, topic, checkpoint, out, max_offsets, trigger_ms = argv
    os.environ.update(spark_env())
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[2]").appName("raftmq-kill-driver")
    for k, v in SPARK_CONF.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    df = (
        spark.readStream.format("raftmq")
        .option("nameServer", namesrv)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", max_offsets)
        .load()
    )
    if mode == "parquet":
        writer = df.writeStream.format("parquet").option("path", out)
    elif mode == "update":
        from raftmq.spark_source.micro_batch_sink import foreach_batch_sink

        writer = (
            running_count(df)
            .writeStream.outputMode("update")
            .foreachBatch(foreach_batch_sink(nameServer=namesrv, topic=out))
        )
    else:
        writer = (
            transform(df)
            .writeStream.format("raftmq")
            .option("nameServer", namesrv)
            .option("topic", out)
        )
    q = (
        writer.option("checkpointLocation", checkpoint)
        .trigger(processingTime=f"{int(trigger_ms)} milliseconds")
        .start()
    )
    print("driver.started", flush=True)
    q.awaitTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
