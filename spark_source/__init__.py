"""PySpark Structured Streaming source and sink for raftmq topics (format "raftmq").

Import-light on purpose: pyspark and pyarrow load only with spark_source.source / .sink.
"""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Register format "raftmq" with `spark` (only needed where auto-registration cannot see the
    top-level `pyspark_raftmq` module, e.g. some editable installs)."""
    from raftmq.spark_source.source import RaftMQDataSource

    spark.dataSource.register(RaftMQDataSource)
