"""PySpark Structured Streaming source and sink for raftmq topics (format "raftmq").

Import-light on purpose: pyspark and pyarrow load only with spark_source.source / .sink.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

DEFAULT_WORKER_PYTHON = "python3"  # PySpark's default when PYSPARK_PYTHON is unset


class WorkerImportError(ModuleNotFoundError):
    """The format's modules were imported (on a Spark worker) by a Python that lacks pyarrow or
    grpc: Spark started its workers with another interpreter than the driver's. An ImportError,
    not a RaftMQError: raftmq's error types need grpc, which may be what is missing."""


def worker_lacks(exc: ModuleNotFoundError) -> WorkerImportError:
    """Raised where the format's modules import pyarrow, in place of Spark's bare "No module
    named 'pyarrow'" from a worker started with the wrong Python."""
    missing = [m for m in ("pyarrow", "grpc") if importlib.util.find_spec(m) is None]
    return WorkerImportError(
        f"this Python ({sys.executable}) lacks {', '.join(missing) or exc.name}, which the "
        "raftmq Spark format needs. Spark starts its Python workers with PYSPARK_PYTHON (or "
        f"the spark.pyspark.python setting), default {DEFAULT_WORKER_PYTHON!r} on PATH: set "
        "PYSPARK_PYTHON to the Python where raftmq[spark] is installed (the driver's "
        "sys.executable, e.g. .venv/bin/python) before the SparkSession starts",
        name=exc.name,
    )


def register(spark: Any) -> None:
    """Register format "raftmq" with `spark` (only needed where auto-registration cannot see the
    top-level `pyspark_raftmq` module: an editable install run outside the repository root).
    First checks that Spark's Python workers can run the format: WorkerPythonError naming
    PYSPARK_PYTHON and the interpreter to use otherwise."""
    from raftmq.spark_source.worker_python import check_worker_python

    check_worker_python(spark)
    from raftmq.spark_source.source import RaftMQDataSource

    spark.dataSource.register(RaftMQDataSource)
