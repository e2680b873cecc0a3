"""Benchmarks of the raftmq Spark source and sink on a local cluster (a NameServer and broker
groups broker-a and broker-b of 3 nodes each, all on 127.0.0.1) and a local[2] SparkSession.

Results (one JSON line each, also written to bench/results/spark.json):
- bar 1: source rows/s into Spark's no-op sink, 1 KiB values, batch read of --rows (default
  1 000 000) over 8 queues, preloaded by the SDK producer (v2 stored batches: the columnar
  path), beside a synthetic source of ready Arrow batches of the same schema in the same
  session, at several batch sizes (the ceiling of Spark's Python data source path here);
- bar 2: the same rows as an AvailableNow stream, and micro-batch latency (triggerExecution
  p50/p90) with a 500 ms trigger under steady traffic;
- bar 3: sink rows/s, a cached DataFrame of 1 KiB values written with the exactly-once sink
  (each run under its own writeId, then a re-run under a used one that must store nothing),
  interleaved with the same writes into a Python data source that discards its batches (the
  ceiling of Spark's Python write path here); `preload`'s rate is the SDK producer's alone.

Run: `make bench-spark` or `.venv/bin/python bench/spark_bench.py [--rows 200000]`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from raftmq.client.producer import Producer  # noqa: E402
from raftmq.common.types import QueueRef  # noqa: E402
from tests.spark.support import (  # noqa: E402
    GROUPS,
    SPARK_CONF,
    Cluster,
    running_cluster,
    spark_env,
)

RESULTS = ROOT / "bench" / "results" / "spark.json"
QUEUES = 4  # per group: 8 queues, so 8 Spark partitions over both groups
CHUNK = 512


def emit(results: list[dict[str, Any]], rec: dict[str, Any]) -> None:
    # Others share this machine: the 1-minute load average tells how quiet it was.
    rec = {"bench": "spark", **rec, "loadavg_1m": round(os.getloadavg()[0], 2)}
    print(json.dumps(rec), flush=True)
    results.append(rec)


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def preload(cluster: Cluster, topic: str, rows: int, value_bytes: int) -> float:
    """Send `rows` messages spread over every queue with the SDK's producer (v2 stored batches,
    as applications store them); seconds taken."""
    body = os.urandom(value_bytes)
    queues = [QueueRef(topic, g, q) for g in GROUPS for q in range(QUEUES)]
    per_queue = rows // len(queues)
    started = time.monotonic()
    producer = Producer(cluster.namesrv_address, batch_max_messages=CHUNK, send_timeout_ms=120_000)
    try:
        pending = []
        for start in range(0, per_queue, CHUNK):
            n = min(CHUNK, per_queue - start)
            for q in queues:
                pending.append(producer.send_batch_future(topic, [body] * n, queue=q))
            if len(pending) >= 64:  # bounded: at most 64 chunks waiting
                for fut in pending:
                    fut.result(timeout=180)
                pending = []
        for fut in pending:
            fut.result(timeout=180)
    finally:
        producer.close()
    return time.monotonic() - started


# ---- the synthetic source: ready Arrow batches, nothing read -------------------------------------


def synthetic_source() -> Any:
    """Format "raftmq_synthetic": `rows` rows of SCHEMA in `partitions` tasks, each yielding one
    prepared RecordBatch of `batchRows` rows (1 KiB values) again and again: what Spark's Python
    data source path costs with no source work at all."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from raftmq.spark_source.schema import SCHEMA, arrow_schema

    class Part(InputPartition):  # type: ignore[misc]  # pyspark has no type stubs
        def __init__(self, rows: int) -> None:
            self.rows = rows

    class Reader(DataSourceReader):  # type: ignore[misc]  # pyspark has no type stubs
        def __init__(self, options: dict[str, str]) -> None:
            self.rows = int(options["rows"])
            self.parts = int(options.get("partitions", "8"))
            self.batch_rows = int(options.get("batchrows", "8192"))
            self.value_bytes = int(options.get("valuebytes", "1024"))

        def partitions(self) -> list[Any]:
            return [Part(self.rows // self.parts) for _ in range(self.parts)]

        def read(self, partition: Any) -> Any:
            import pyarrow as pa

            n = self.batch_rows
            schema = arrow_schema()
            f = schema.field
            ts = 1_700_000_000_000_000
            batch = pa.RecordBatch.from_arrays(
                [
                    pa.array([None] * n, f(0).type),
                    pa.array([os.urandom(self.value_bytes)] * n, f(1).type),
                    pa.array(["bench-src"] * n, f(2).type),
                    pa.array(["broker-a"] * n, f(3).type),
                    pa.array([0] * n, f(4).type),
                    pa.array(range(n), f(5).type),
                    pa.array([f"broker-a-{i:032X}" for i in range(n)], f(6).type),
                    pa.array([None] * n, f(7).type),
                    pa.array([[]] * n, f(8).type),
                    pa.array([ts] * n, f(9).type),
                    pa.array([ts] * n, f(10).type),
                    pa.array([[]] * n, f(11).type),
                ],
                schema=schema,
            )
            left = partition.rows
            while left > 0:
                yield batch if left >= n else batch.slice(0, left)
                left -= n

    class Synthetic(DataSource):  # type: ignore[misc]  # pyspark has no type stubs
        @classmethod
        def name(cls) -> str:
            return "raftmq_synthetic"

        def schema(self) -> Any:
            return SCHEMA

        def reader(self, schema: Any) -> Any:
            return Reader(self.options)

    return Synthetic


def synthetic_sink() -> Any:
    """Format "raftmq_discard": a Python data source whose Arrow writer drops every batch: what
    Spark's Python data source write path costs with no sink work at all (the sink's ceiling)."""
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    class Writer(DataSourceArrowWriter):
        def write(self, iterator: Any) -> Any:
            rows = 0
            for batch in iterator:
                rows += batch.num_rows
            return WriterCommitMessage()

    class Discard(DataSource):
        @classmethod
        def name(cls) -> str:
            return "raftmq_discard"

        def writer(self, schema: Any, overwrite: bool) -> Any:
            return Writer()

    return Discard


def synthetic_batch(spark: Any, rows: int, batch_rows: int) -> float:
    started = time.monotonic()
    (
        spark.read.format("raftmq_synthetic")
        .option("rows", str(rows))
        .option("batchRows", str(batch_rows))
        .load()
        .write.format("noop")
        .mode("overwrite")
        .save()
    )
    return rows / (time.monotonic() - started)


def _proc_table() -> dict[int, tuple[int, float, str]]:
    """Every process's (parent pid, its own CPU seconds, command line), from /proc (Linux)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, tuple[int, float, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after the command's name: state, ppid..
        out[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick, cmd)
    return out


def _kind(pid: int, cmd: str) -> str | None:
    if pid == os.getpid():
        return "driver"
    if "raftmq.broker" in cmd:
        return "brokers"
    if "raftmq.namesrv" in cmd:
        return "namesrv"
    if "java" in cmd.split(" ", 1)[0]:
        return "jvm"
    if "pyspark" in cmd:
        return "python_workers"
    return None


def _descendants(table: dict[int, tuple[int, float, str]]) -> dict[int, tuple[str, float]]:
    """This process and its descendants: (kind, own CPU seconds) of those of a known kind."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out: dict[int, tuple[str, float]] = {}
    todo = [os.getpid()]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        _, cpu, cmd = table.get(pid, (0, 0.0, ""))
        kind = _kind(pid, cmd)
        if kind is not None:
            out[pid] = (kind, cpu)
    return out


def cpu_during(fn: Any, *args: Any) -> tuple[Any, dict[str, float]]:
    """fn(*args)'s result and the CPU seconds each kind of process (the brokers, the
    NameServer, Spark's JVM, Spark's Python workers, this driver) used while it ran. Sampled
    every 0.2 s (a worker that exits between samples loses at most its last 0.2 s; one born
    during the run counts from 0), each process's own time only (no double count through a
    parent's reaped children)."""
    import threading

    first = _descendants(_proc_table())
    last = dict(first)
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            last.update(_descendants(_proc_table()))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = fn(*args)
    finally:
        done.set()
        sampler.join()
    last.update(_descendants(_proc_table()))
    used = {"brokers": 0.0, "namesrv": 0.0, "jvm": 0.0, "python_workers": 0.0, "driver": 0.0}
    for pid, (kind, cpu) in last.items():
        used[kind] += cpu - first.get(pid, (kind, 0.0))[1]
    return result, {k: round(v, 2) for k, v in used.items()}


def session() -> Any:
    os.environ.update(spark_env())
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[2]").appName("raftmq-spark-bench")
    for k, v in SPARK_CONF.items():
        builder = builder.config(k, v)
    return builder.getOrCreate()


def source_batch(spark: Any, ns: str, topic: str, rows: int, read_ahead: int = 2) -> float:
    started = time.monotonic()
    (
        spark.read.format("raftmq")
        .option("nameServer", ns)
        .option("subscribe", topic)
        .option("readAheadBatches", str(read_ahead))
        .load()
        .write.format("noop")
        .mode("overwrite")
        .save()
    )
    return rows / (time.monotonic() - started)


def source_stream(spark: Any, ns: str, topic: str, rows: int, tmp: Path) -> dict[str, Any]:
    q = (
        spark.readStream.format("raftmq")
        .option("nameServer", ns)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(max(1, rows // 4)))
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp / "ck-stream"))
        .trigger(availableNow=True)
        .start()
    )
    started = time.monotonic()
    q.awaitTermination()
    wall = time.monotonic() - started
    done = [p for p in q.recentProgress if p["numInputRows"]]
    total = sum(p["numInputRows"] for p in done)
    # The first micro-batch of a query starts its Python workers; the rest is the steady state.
    steady = done[1:]
    steady_s = sum(p["durationMs"]["triggerExecution"] for p in steady) / 1000
    return {
        "rows": total,
        "batches": len(done),
        "rows_per_s_wall": round(total / wall),
        "rows_per_s_steady": round(sum(p["numInputRows"] for p in steady) / steady_s)
        if steady_s
        else None,
        "first_batch_s": round(done[0]["durationMs"]["triggerExecution"] / 1000, 2)
        if done
        else None,
    }


def latency(
    spark: Any, cluster: Cluster, topic: str, seconds: float, rate: int, value_bytes: int, tmp: Path
) -> dict[str, Any]:
    """Steady traffic of `rate` messages/s; triggerExecution of each micro-batch with rows."""
    q = (
        spark.readStream.format("raftmq")
        .option("nameServer", cluster.namesrv_address)
        .option("subscribe", topic)
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp / "ck-latency"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    deadline = time.monotonic() + 180
    while q.lastProgress is None and time.monotonic() < deadline:
        time.sleep(0.2)
    body = os.urandom(value_bytes)
    per_tick = max(1, rate // 10)
    sent = 0
    started = time.monotonic()
    tick = 0
    producer = Producer(cluster.namesrv_address)  # v2 stored batches, as applications send
    try:
        while time.monotonic() - started < seconds:
            q_ref = QueueRef(topic, GROUPS[tick % len(GROUPS)], tick % QUEUES)
            producer.send_batch(topic, [body] * per_tick, queue=q_ref)
            sent += per_tick
            tick += 1
            time.sleep(max(0.0, started + tick / 10 - time.monotonic()))
    finally:
        producer.close()
    time.sleep(2)
    q.stop()
    batches = [p for p in q.recentProgress if p["numInputRows"]]
    trig = [float(p["durationMs"]["triggerExecution"]) for p in batches[1:]]  # skip warm-up
    parts = {}
    for name in ("latestOffset", "queryPlanning", "walCommit", "addBatch", "commitOffsets"):
        got = [float(p["durationMs"].get(name, 0)) for p in batches[1:]]
        parts[f"{name}_p50_ms"] = round(statistics.median(got), 1) if got else None
    return {
        **parts,
        "trigger_ms": 500,
        "rate_msgs_per_s": rate,
        "batches": len(trig),
        "trigger_execution_p50_ms": round(statistics.median(trig), 1) if trig else None,
        "trigger_execution_p90_ms": round(pct(trig, 90), 1) if trig else None,
        "rows_per_batch_p50": statistics.median(p["numInputRows"] for p in batches)
        if batches
        else 0,
        "sent": sent,
    }


def sink(
    spark: Any, cluster: Cluster, topic: str, rows: int, value_bytes: int, runs: int
) -> dict[str, Any]:
    """`runs` writes of `rows` rows of `value_bytes` to `topic` (one writeId each, so each is
    stored, exactly once), interleaved with the same DataFrame into the discarding sink."""
    from pyspark.sql import functions as F

    spark.dataSource.register(synthetic_sink())
    df = (
        spark.range(rows, numPartitions=4)
        .select(F.expr(f"unhex(repeat('ab', {value_bytes}))").alias("value"))
        .cache()
    )
    df.count()  # materialise the input outside the timed write
    ns = cluster.namesrv_address
    # The first Python write of a session starts its workers: warm up on another topic.
    df.limit(8_000).write.format("raftmq").option("nameServer", ns).option(
        "topic", "bench-warm"
    ).mode("append").save()
    df.limit(8_000).write.format("raftmq_discard").mode("append").save()
    sink_runs: list[float] = []
    ceiling: list[float] = []
    cpu: dict[str, list[dict[str, float]]] = {"sink": [], "discard": []}

    def write(run: int) -> float:
        started = time.monotonic()
        df.write.format("raftmq").option("nameServer", ns).option("topic", topic).option(
            "writeId", f"bench-{run}"
        ).mode("append").save()
        return rows / (time.monotonic() - started)

    def discard() -> float:
        started = time.monotonic()
        df.write.format("raftmq_discard").mode("append").save()
        return rows / (time.monotonic() - started)

    for run in range(runs):
        rate, used = cpu_during(write, run)
        sink_runs.append(rate)
        cpu["sink"].append(used)
        rate, used = cpu_during(discard)
        ceiling.append(rate)
        cpu["discard"].append(used)
    stored = sum(cluster.bounds(topic, g, q)[1] for g in GROUPS for q in range(QUEUES))
    assert stored == rows * runs, f"the sink stored {stored} of {rows * runs} rows"
    # A re-run under a used writeId stores nothing (the exactly-once protocol at full size).
    df.write.format("raftmq").option("nameServer", ns).option("topic", topic).option(
        "writeId", "bench-0"
    ).mode("append").save()
    again = sum(cluster.bounds(topic, g, q)[1] for g in GROUPS for q in range(QUEUES))
    assert again == stored, f"a re-run under its writeId stored {again - stored} rows again"
    return {
        "rows": rows,
        "rows_per_s": round(max(sink_runs)),
        "rows_per_s_runs": [round(r) for r in sink_runs],
        "discard_rows_per_s_runs": [round(r) for r in ceiling],
        "ratio_to_discard": round(max(sink_runs) / max(ceiling), 2),
        # CPU seconds by process kind during each write: the steadier figure on a busy machine.
        "cpu_s_by_process": cpu,
        "rerun_stored": again - stored,
        "target_rows_per_s": 100_000,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows preloaded for the source")
    ap.add_argument(
        "--synthetic-batch-rows",
        type=lambda t: [int(x) for x in t.split(",")],
        default=[1024, 8192, 32768],
        help="batch sizes of the synthetic source (comma-separated)",
    )
    ap.add_argument("--value-bytes", type=int, default=1024)
    ap.add_argument("--latency-seconds", type=float, default=30.0)
    ap.add_argument("--latency-rate", type=int, default=2000, help="messages/s during latency")
    ap.add_argument("--sink-rows", type=int, default=100_000)
    ap.add_argument("--sink-runs", type=int, default=3, help="sink writes, each beside a discard")
    ap.add_argument("--only", default="source,latency,sink", help="comma-separated cases")
    args = ap.parse_args()
    only = set(args.only.split(","))
    results: list[dict[str, Any]] = []
    machine = {"cpus": os.cpu_count(), "python": platform.python_version()}
    with (
        tempfile.TemporaryDirectory(prefix="sparkbench-", dir=ROOT / "bench") as tmp_s,
        running_cluster(Path(tmp_s)) as cluster,
    ):
        tmp = Path(tmp_s)
        for t in ("bench-src", "bench-lat", "bench-sink", "bench-warm"):
            cluster.create_topic(t, queues=QUEUES)
        load_s = preload(cluster, "bench-src", args.rows, args.value_bytes)
        emit(
            results,
            {
                "case": "preload",
                "rows": args.rows,
                "value_bytes": args.value_bytes,
                "rows_per_s": round(args.rows / load_s),
                **machine,
            },
        )
        preload(cluster, "bench-warm", 8_000, args.value_bytes)
        spark = session()
        try:
            source_batch(spark, cluster.namesrv_address, "bench-warm", 8_000)  # worker warm-up
        except BaseException:
            spark.stop()
            raise
        try:
            if "source" in only:
                source_cases(spark, cluster, args, results, tmp)
            if "latency" in only:
                emit(
                    results,
                    {
                        "case": "microbatch_latency",
                        "value_bytes": args.value_bytes,
                        **latency(
                            spark,
                            cluster,
                            "bench-lat",
                            args.latency_seconds,
                            args.latency_rate,
                            args.value_bytes,
                            tmp,
                        ),
                    },
                )
            if "sink" in only:
                emit(
                    results,
                    {
                        "case": "sink_batch_write",
                        "value_bytes": args.value_bytes,
                        **sink(
                            spark,
                            cluster,
                            "bench-sink",
                            args.sink_rows,
                            args.value_bytes,
                            args.sink_runs,
                        ),
                    },
                )
        finally:
            spark.stop()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("".join(json.dumps(r) + "\n" for r in results))
    return 0


def profile_partition(cluster: Cluster, topic: str) -> dict[str, Any]:
    """One Spark task's work without Spark: the first partition of a batch read of `topic` read
    in this process under cProfile; its rows/s and where the time went (what limits bar 1 apart
    from Spark's own path, which the synthetic source measures). Without the read-ahead thread,
    whose work cProfile (one thread) would not see."""
    import cProfile
    import pstats

    from raftmq.spark_source.source import RaftMQBatchReader, SlicesPartition, _partition_batches

    reader = RaftMQBatchReader({"nameServer": cluster.namesrv_address, "subscribe": topic})
    part = reader.partitions()[0]
    assert isinstance(part, SlicesPartition)
    prof = cProfile.Profile()
    started = time.monotonic()
    prof.enable()
    rows = sum(b.num_rows for b in _partition_batches(reader.opts, part))
    prof.disable()
    wall = time.monotonic() - started
    stats = pstats.Stats(prof)
    top = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:8]  # type: ignore[attr-defined]  # pstats.Stats.stats: not in typeshed
    return {
        "rows": rows,
        "rows_per_s": round(rows / wall),
        "top_tottime_s": {f"{k[2]} ({Path(k[0]).name}:{k[1]})": round(v[2], 3) for k, v in top},
    }


def read_ahead_ab(cluster: Cluster, topic: str, runs: int = 4) -> dict[str, Any]:
    """The first partition of a batch read of `topic`, read in this process with and without
    the read-ahead thread, interleaved; each batch is written to an Arrow IPC stream as
    Spark's Python worker hands it to the JVM (the consumer's work the read-ahead overlaps)."""
    import pyarrow as pa

    from raftmq.spark_source import source

    reader = source.RaftMQBatchReader({"nameServer": cluster.namesrv_address, "subscribe": topic})
    part = reader.partitions()[0]
    assert isinstance(part, source.SlicesPartition)

    def consume(batches: Any) -> float:
        started = time.monotonic()
        rows = 0
        for b in batches:
            with pa.ipc.new_stream(pa.BufferOutputStream(), b.schema) as writer:
                writer.write_batch(b)  # a copy of every buffer, as onto Spark's socket
            rows += b.num_rows
        return rows / (time.monotonic() - started)

    ahead: list[float] = []
    inline: list[float] = []
    for run in range(runs):  # which goes first alternates: the first of a pair ran slower
        for first in (run % 2 == 0, run % 2 == 1):
            if first:
                ahead.append(consume(source.read_partition(reader.opts, part)))
            else:
                inline.append(consume(source._partition_batches(reader.opts, part)))
    return {
        "rows": sum(s.end - s.begin for s in part.slices),
        "read_ahead_rows_per_s_runs": [round(r) for r in ahead],
        "inline_rows_per_s_runs": [round(r) for r in inline],
        "ratio_best": round(max(ahead) / max(inline), 2),
    }


def source_cases(
    spark: Any, cluster: Cluster, args: argparse.Namespace, results: list[dict[str, Any]], tmp: Path
) -> None:
    spark.dataSource.register(synthetic_source())
    synthetic_batch(spark, 16_384, 1024)  # worker warm-up of the synthetic format
    # Interleaved, three of each: the machine's load changes during the run.
    runs: list[float] = []
    inline: list[float] = []  # readAheadBatches 0: what the read-ahead thread buys
    ceiling: dict[int, list[float]] = {b: [] for b in args.synthetic_batch_rows}
    cpu: dict[str, list[dict[str, float]]] = {"source": [], "synthetic": []}
    cpu_batch = 8192 if 8192 in args.synthetic_batch_rows else args.synthetic_batch_rows[0]
    for _ in range(3):
        rate, used = cpu_during(
            source_batch, spark, cluster.namesrv_address, "bench-src", args.rows
        )
        runs.append(rate)
        cpu["source"].append(used)
        inline.append(source_batch(spark, cluster.namesrv_address, "bench-src", args.rows, 0))
        for b in args.synthetic_batch_rows:
            rate, used = cpu_during(synthetic_batch, spark, args.rows, b)
            ceiling[b].append(rate)
            if b == cpu_batch:
                cpu["synthetic"].append(used)
    best_ceiling = max(max(v) for v in ceiling.values())
    emit(
        results,
        {
            "case": "source_batch_noop",
            "rows": args.rows,
            "value_bytes": args.value_bytes,
            "rows_per_s": round(max(runs)),
            "rows_per_s_runs": [round(r) for r in runs],
            "no_read_ahead_rows_per_s_runs": [round(r) for r in inline],
            "synthetic_rows_per_s_by_batch_rows": {
                str(b): [round(r) for r in v] for b, v in ceiling.items()
            },
            "ratio_to_synthetic": round(max(runs) / best_ceiling, 2),
            # CPU seconds by process kind during each read (read-ahead 2; the synthetic at
            # 8 192-row batches, if run): where a read's two cores went.
            "cpu_s_by_process": cpu,
            "target_rows_per_s": 150_000,
            "target_ratio": 0.8,
        },
    )
    emit(results, {"case": "source_partition_profile", **profile_partition(cluster, "bench-src")})
    emit(results, {"case": "source_read_ahead_ab", **read_ahead_ab(cluster, "bench-src")})
    emit(
        results,
        {
            "case": "source_stream_available_now_noop",
            "value_bytes": args.value_bytes,
            "target_rows_per_s": 100_000,
            **source_stream(spark, cluster.namesrv_address, "bench-src", args.rows, tmp),
        },
    )


if __name__ == "__main__":
    sys.exit(main())
