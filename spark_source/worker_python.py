"""Driver side: which Python Spark starts its workers with, and whether that Python can run the
raftmq format (pyarrow, grpc and raftmq importable). Spark's own error for a wrong interpreter is
a bare "No module named 'pyarrow'" from a worker; this says which setting to change and to what
(the worker side of the same message is spark_source.worker_lacks).

Never imports pyspark or pyarrow itself: it runs before either is needed.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from typing import Any

from raftmq.common.errors import InvalidArgumentError
from raftmq.spark_source import DEFAULT_WORKER_PYTHON

# The modules a worker imports to run the format (pyspark comes with Spark's own path).
WORKER_MODULES = ("pyarrow", "grpc", "raftmq.spark_source")
CHECK_TIMEOUT_S = 30.0


class WorkerPythonError(InvalidArgumentError):
    """Spark's Python workers would run an interpreter that lacks pyarrow, grpc or raftmq."""


def worker_python(spark: Any) -> str:
    """The interpreter Spark starts Python workers with: spark.pyspark.python, else the
    SparkContext's (PYSPARK_PYTHON when the session started), else PySpark's default."""
    try:
        conf = spark.conf.get("spark.pyspark.python", None)
    except Exception:  # Spark Connect or a stopped session: fall back to the environment
        conf = None
    if conf:
        return str(conf)
    sc = getattr(spark, "sparkContext", None)
    exe = getattr(sc, "pythonExec", None) if sc is not None else None
    return str(exe or os.environ.get("PYSPARK_PYTHON") or DEFAULT_WORKER_PYTHON)


def missing_modules(python: str, timeout_s: float = CHECK_TIMEOUT_S) -> list[str] | None:
    """WORKER_MODULES that `python` cannot import (run from this working directory and
    environment, as a local worker would); None when `python` cannot be started at all."""
    code = (
        "import importlib.util, sys\n"
        f"mods = {list(WORKER_MODULES)!r}\n"
        "def ok(m):\n"
        "    try:\n"
        "        return importlib.util.find_spec(m) is not None\n"
        "    except ImportError:\n"
        "        return False\n"
        "print(','.join(m for m in mods if not ok(m)))\n"
    )
    try:
        out = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return [m for m in out.stdout.strip().split(",") if m]


def advice(python: str, missing: list[str] | None, driver_python: str = sys.executable) -> str:
    what = (
        f"{python}, which cannot be started"
        if missing is None
        else f"{python}, which lacks {', '.join(missing)}"
    )
    return (
        f"Spark's Python workers would run {what}. Spark starts them with "
        f"PYSPARK_PYTHON (or the spark.pyspark.python setting), default {DEFAULT_WORKER_PYTHON!r} "
        f"on PATH; set PYSPARK_PYTHON={shlex.quote(driver_python)} (the Python running this "
        "driver, where raftmq[spark] is installed) before the SparkSession starts"
    )


def check_worker_python(spark: Any) -> None:
    """WorkerPythonError, saying what to set, when the workers' Python cannot run the format."""
    python = worker_python(spark)
    missing = missing_modules(python)
    if missing is None or missing:
        raise WorkerPythonError(advice(python, missing), details={"python": python})
