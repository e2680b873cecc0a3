"""Exactly once across a SIGKILL of the Spark driver: a stream from a topic on both broker groups
into parquet runs in its own process, is killed in the middle of a micro-batch (offsets written,
commit not), messages keep arriving, and the query restarts from its checkpoint (in the shared
session): every message is in the output exactly once."""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.harness.procs import ROOT, wait_until
from tests.spark.support import GROUPS, Cluster, spark_env

QUEUES = 4


def _batch_ids(d: Path) -> set[int]:
    return {int(p.name) for p in d.iterdir() if p.name.isdigit()} if d.is_dir() else set()


def _descendants(pid: int) -> list[int]:
    """pid and every process below it (the JVM and its Python workers), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _kill_tree(pids: list[int]) -> None:
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)

    def gone() -> bool:
        return not any(Path(f"/proc/{p}").exists() and _alive(p) for p in pids)

    wait_until(gone, 30, "the killed driver's processes to exit")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _send_round(cluster: Cluster, topic: str, start: int, per_queue: int) -> set[bytes]:
    bodies: set[bytes] = set()
    for g in GROUPS:
        for qid in range(QUEUES):
            batch = [f"{g}-{qid}-{start + i}".encode() for i in range(per_queue)]
            cluster.send(topic, g, qid, batch)
            bodies.update(batch)
    return bodies


def _kill_mid_batch(
    mode: str, cluster: Cluster, topic: str, ck: Path, out: str, log: Path, live: list[int]
) -> tuple[int, set[bytes]]:
    """Run a driver process until a micro-batch (id >= 2 past where the checkpoint was) is in
    flight, sending live traffic meanwhile, then SIGKILL it and every process below it. The id
    of the batch in flight and the bodies sent meanwhile."""
    env = {**os.environ, **spark_env(), "PYTHONPATH": str(ROOT)}
    first = max(_batch_ids(ck / "commits"), default=-1) + 3
    sent: set[bytes] = set()
    with open(log, "a") as err:
        driver = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.spark.stream_driver",
                mode,
                cluster.namesrv_address,
                topic,
                str(ck),
                out,
                "200",
                "200",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    try:

        def mid_batch() -> bool:
            if driver.poll() is not None:
                raise AssertionError(f"driver exited: {log.read_text()[-3000:]}")
            offsets, commits = _batch_ids(ck / "offsets"), _batch_ids(ck / "commits")
            if commits and live[0] < live[1]:  # live traffic while the query runs
                sent.update(_send_round(cluster, topic, live[0], 25))
                live[0] += 25
            return bool(offsets) and max(offsets) >= first and max(offsets) not in commits

        wait_until(mid_batch, 240, "a micro-batch in flight", interval_s=0.01)
        _kill_tree(_descendants(driver.pid))
        in_flight = max(_batch_ids(ck / "offsets"))
        assert in_flight not in _batch_ids(ck / "commits"), "the kill must land mid-batch"
    finally:
        if driver.poll() is None:
            _kill_tree(_descendants(driver.pid))
        driver.wait(timeout=30)
    return in_flight, sent


def test_sigkill_mid_batch_then_restart_is_exactly_once(
    spark: Any, cluster: Cluster, tmp_path: Path
) -> None:
    topic = "spark-kill"
    cluster.create_topic(topic, queues=QUEUES)
    expected = _send_round(cluster, topic, 0, 250)  # 2000 messages over 8 queues
    ck, out = tmp_path / "ck", tmp_path / "out"
    live = [250, 400]
    in_flight, sent = _kill_mid_batch(
        "parquet", cluster, topic, ck, str(out), tmp_path / "driver.log", live
    )
    expected |= sent
    expected |= _send_round(cluster, topic, live[0], 25)
    # Restart from the checkpoint: the batch in flight is replayed, then everything else.
    q = (
        spark.readStream.format("raftmq")
        .option("nameServer", cluster.namesrv_address)
        .option("subscribe", topic)
        .load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(ck))
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(240), "the restarted query did not finish"
    assert q.exception() is None
    assert any(p["batchId"] == in_flight for p in q.recentProgress)
    rows = spark.read.parquet(str(out)).select("value", "brokerName", "queueId", "queueOffset")
    got = rows.collect()
    assert len(got) == len(expected), f"{len(got)} rows for {len(expected)} messages"
    assert {bytes(r.value) for r in got} == expected
    assert len({(r.brokerName, r.queueId, r.queueOffset) for r in got}) == len(expected)


@pytest.mark.slow
def test_sink_pipeline_killed_twice_stores_each_result_once(
    spark: Any, cluster: Cluster, tmp_path: Path
) -> None:
    """Topic A -> out-<value> -> topic B with the raftmq sink; the driver is SIGKILLed in the
    middle of a micro-batch twice (the sink may have stored part or all of it), under live
    traffic; after a restart B holds every result exactly once."""
    from tests.spark.stream_driver import transform

    src, dst = "spark-kill-a", "spark-kill-b"
    cluster.create_topic(src, queues=QUEUES)
    cluster.create_topic(dst, queues=2)
    expected = _send_round(cluster, src, 0, 250)
    ck = tmp_path / "ck"
    live = [250, 500]
    replayed = []
    for run in range(2):
        in_flight, sent = _kill_mid_batch(
            "sink", cluster, src, ck, dst, tmp_path / f"driver{run}.log", live
        )
        replayed.append(in_flight)
        expected |= sent
    expected |= _send_round(cluster, src, live[0], 25)
    q = (
        transform(
            spark.readStream.format("raftmq")
            .option("nameServer", cluster.namesrv_address)
            .option("subscribe", src)
            .load()
        )
        .writeStream.format("raftmq")
        .option("nameServer", cluster.namesrv_address)
        .option("topic", dst)
        .option("checkpointLocation", str(ck))
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(240), "the restarted query did not finish"
    assert q.exception() is None
    bodies = collections.Counter(m.message.body for m in cluster.read_topic(dst))
    assert set(bodies) == {b"out-" + b for b in expected}
    dupes = {b: n for b, n in bodies.items() if n > 1}
    assert not dupes, f"{len(dupes)} results stored more than once (replayed {replayed})"


@pytest.mark.slow
@pytest.mark.timeout(1200)  # two driver JVMs started and killed, then a restart
def test_update_mode_count_killed_twice_ends_with_the_true_count_per_key(
    spark: Any, cluster: Cluster, tmp_path: Path
) -> None:
    """A running `groupBy(key).count()` in update mode written with foreach_batch_sink; the
    driver is SIGKILLed mid-batch twice under live traffic and restarted: the last value per key
    in the output topic is the true count of the key's messages (issue 28, bar 4)."""
    from raftmq.spark_source.micro_batch_sink import foreach_batch_sink
    from tests.spark.stream_driver import running_count

    src, dst = "spark-kill-count-a", "spark-kill-count-b"
    cluster.create_topic(src, queues=QUEUES)
    cluster.create_topic(dst, queues=2)
    for r in range(5):  # keyed traffic; the live traffic of the runs is unkeyed (key null)
        for i, g in enumerate(GROUPS):
            for qid in range(QUEUES):
                key = f"k{(r + qid + i) % 6}"
                cluster.send(
                    src, g, qid, [f"{key}-{r}-{j}".encode() for j in range(20)], keys=[key]
                )
    ck = tmp_path / "ck"
    live = [0, 250]
    for run in range(2):
        _kill_mid_batch("update", cluster, src, ck, dst, tmp_path / f"driver{run}.log", live)
    q = (
        running_count(
            spark.readStream.format("raftmq")
            .option("nameServer", cluster.namesrv_address)
            .option("subscribe", src)
            .load()
        )
        .writeStream.outputMode("update")
        .foreachBatch(foreach_batch_sink(nameServer=cluster.namesrv_address, topic=dst))
        .option("checkpointLocation", str(ck))
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(240), "the restarted query did not finish"
    assert q.exception() is None

    def key_of(m: Any) -> str | None:
        return m.message.keys[0] if m.message.keys else None

    truth = collections.Counter(key_of(m) for m in cluster.read_topic(src))
    last = {key_of(m): int(m.message.body) for m in cluster.read_topic(dst)}
    assert last == dict(truth)
