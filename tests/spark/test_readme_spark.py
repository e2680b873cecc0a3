"""The README's Spark example (the block marked `<!-- readme-test: spark -->`) runs with the shared
SparkSession against the Spark tests' cluster: its stream upper-cases topic `orders` into
`orders-upper`, and the upper-cased messages arrive.

Replacements (tests/harness/readme.py): the README's NameServer address becomes the cluster's,
and its checkpoint `/tmp/ck` a fresh directory (a stale checkpoint would resume elsewhere). The
README assumes the two topics exist (auto-created on a default cluster; this one creates none),
so the test creates them and sends the input first.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.harness.readme import readme_blocks, substitute
from tests.spark.support import Cluster

SOURCE, SINK = "orders", "orders-upper"
BODIES = [f"order-{i}".encode() for i in range(20)]
TIMEOUT_S = 120.0


def test_the_readme_spark_example_runs(spark: Any, cluster: Cluster, tmp_path: Path) -> None:
    (block,) = readme_blocks("python", "spark")
    cluster.create_topic(SOURCE)
    cluster.create_topic(SINK)
    cluster.send(SOURCE, "broker-a", 0, BODIES[:10], keys=["k"])
    cluster.send(SOURCE, "broker-b", 1, BODIES[10:], keys=["k"])
    code = substitute(block.code, cluster.namesrv_address, {"/tmp/ck": str(tmp_path / "ck")})
    before = {q.id for q in spark.streams.active}
    # Line numbers kept: a traceback says `File "README.md", line N`.
    exec(compile("\n" * block.line + code, "README.md", "exec"), {"spark": spark})
    (query,) = [q for q in spark.streams.active if q.id not in before]
    try:
        want = sorted(b.upper() for b in BODIES)
        deadline = time.monotonic() + TIMEOUT_S
        got: list[bytes] = []
        while time.monotonic() < deadline and got != want:
            assert query.exception() is None, query.exception()
            got = sorted(m.message.body for m in cluster.read_topic(SINK))
            time.sleep(0.5)
        assert got == want, f"{SINK} holds {len(got)} of {len(want)} upper-cased messages"
    finally:
        query.stop()
