"""A Spark driver in its own process for the kill tests: streams a raftmq topic into parquet with
a checkpoint until it is killed. Prints `driver.started` once the query runs.

Usage: python -m tests.spark.stream_driver NAMESRV TOPIC CHECKPOINT OUT MAX_OFFSETS TRIGGER_MS
"""

from __future__ import annotations

import os
import sys

from tests.spark.support import SPARK_CONF, spark_env


def main(argv: list[str]) -> int:
    namesrv, topic, checkpoint, out, max_offsets, trigger_ms = argv
    os.environ.update(spark_env())
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[2]").appName("raftmq-kill-driver")
    for k, v in SPARK_CONF.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    q = (
        spark.readStream.format("raftmq")
        .option("nameServer", namesrv)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", max_offsets)
        .load()
        .writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=f"{int(trigger_ms)} milliseconds")
        .start()
    )
    print("driver.started", flush=True)
    q.awaitTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
