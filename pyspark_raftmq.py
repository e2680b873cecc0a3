"""Auto-registration of the `raftmq` Spark format: PySpark imports every top-level `pyspark_*`
module on a worker's path and registers its DefaultSource. Holds nothing else."""

from raftmq.spark_source.source import RaftMQDataSource as DefaultSource

__all__ = ["DefaultSource"]
