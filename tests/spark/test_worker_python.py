"""The Spark set-up steps of the README, as a new user meets them, each in a fresh driver process
(a subprocess, ~10 s for its SparkSession):

- outside the repository root, an editable install's `pyspark_raftmq` is not on the workers' path
  (setuptools' editable finder is invisible to `pkgutil.iter_modules`, which PySpark's lookup
  uses), so the README's one-line `register` is what makes the format work there;
- with PYSPARK_PYTHON pointing at a Python without pyarrow, `register` refuses at once naming
  PYSPARK_PYTHON and the driver's interpreter, and a worker says the same instead of Spark's bare
  "No module named 'pyarrow'".

The subprocess finds this checkout's raftmq through a directory holding only a `raftmq` link, as
an editable install resolves it (the checkout root itself would put pyspark_raftmq.py on the path).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.harness.readme import readme_blocks
from tests.spark.support import SPARK_CONF, Cluster, spark_env

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = "/usr/bin/python3"
DRIVER_TIMEOUT_S = 240

DRIVER = """
import json, sys
from pyspark.sql import SparkSession

conf, namesrv, topic, register_code, mode = json.loads(sys.argv[1])
builder = SparkSession.builder.master("local[1]").appName("raftmq-worker-python")
for k, v in conf.items():
    builder = builder.config(k, v)
spark = builder.getOrCreate()
out = {}

def read():
    return (spark.read.format("raftmq").option("nameServer", namesrv)
            .option("subscribe", topic).load().count())

def attempt(key, fn):
    try:
        out[key] = ["ok", fn()]
    except Exception as exc:
        out[key] = [type(exc).__name__, str(exc)[:3000]]

if mode == "cwd":
    attempt("auto", read)
    exec(register_code, {"spark": spark})
    attempt("registered", read)
else:
    attempt("register", lambda: exec(register_code, {"spark": spark}))
    from raftmq.spark_source.source import RaftMQDataSource
    spark.dataSource.register(RaftMQDataSource)  # past the check: what a worker says
    attempt("read", read)
spark.stop()
print("RESULT " + json.dumps(out))
"""


def _needs_spark() -> None:
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")


def _run_driver(
    tmp_path: Path, cluster: Cluster, topic: str, mode: str, env_extra: dict[str, str]
) -> dict[str, Any]:
    (block,) = readme_blocks("python", "sparkregister")
    path_dir = tmp_path / "path"
    path_dir.mkdir()
    (path_dir / "raftmq").symlink_to(ROOT / "raftmq")
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    env = {**os.environ, **spark_env(), "PYTHONPATH": str(path_dir), **env_extra}
    args = json.dumps([SPARK_CONF, cluster.namesrv_address, topic, block.code, mode])
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(DRIVER), args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=DRIVER_TIMEOUT_S,
        check=False,
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"the driver failed ({done.returncode}):\n{done.stderr[-4000:]}"
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    return result


def test_readme_register_line_works_outside_the_repository_root(
    cluster: Cluster, tmp_path: Path
) -> None:
    _needs_spark()
    topic = "spark-elsewhere"
    cluster.create_topic(topic, queues=1)
    cluster.send(topic, "broker-a", 0, [b"a", b"b", b"c"])
    out = _run_driver(tmp_path, cluster, topic, "cwd", {"PYSPARK_PYTHON": sys.executable})
    # What the README explains: without the line, an editable install is not found here (a
    # wheel install would be).
    status, detail = out["auto"]
    assert status == "ok" or "DATA_SOURCE_NOT_FOUND" in detail, out["auto"]
    assert out["registered"] == ["ok", 3], out["registered"]


def test_a_worker_python_without_pyarrow_is_named_with_the_fix(
    cluster: Cluster, tmp_path: Path
) -> None:
    _needs_spark()
    if not Path(SYSTEM_PYTHON).exists():
        pytest.skip(f"{SYSTEM_PYTHON} is missing")
    has_pyarrow = subprocess.run(
        [SYSTEM_PYTHON, "-c", "import pyarrow"], capture_output=True, check=False
    )
    if has_pyarrow.returncode == 0:
        pytest.skip(f"{SYSTEM_PYTHON} has pyarrow")
    topic = "spark-wrong-python"
    cluster.create_topic(topic, queues=1)
    out = _run_driver(tmp_path, cluster, topic, "python", {"PYSPARK_PYTHON": SYSTEM_PYTHON})
    status, detail = out["register"]
    assert status == "WorkerPythonError", out["register"]
    assert "PYSPARK_PYTHON" in detail and SYSTEM_PYTHON in detail and "pyarrow" in detail
    assert f"PYSPARK_PYTHON={sys.executable}" in detail, detail
    status, detail = out["read"]
    assert status != "ok"
    assert "PYSPARK_PYTHON" in detail and "lacks" in detail, detail
