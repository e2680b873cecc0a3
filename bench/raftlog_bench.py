"""Benchmarks of raftlog: 3 node processes on 127.0.0.1, one JSON line per result.

Writes bench/results/raftlog.json. Run: `make bench-raftlog` or
`.venv/bin/python bench/raftlog_bench.py [--only throughput,latency,failover,rss] [--rss-gb 10]`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.harness.local_cluster import ControlError, LocalCluster  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "raftlog.json"
MB = 1_000_000
IDLE_S = 2.0  # each node's idle CPU is measured this long before a CPU-per-commit run


def emit(results: list[dict[str, Any]], rec: dict[str, Any]) -> None:
    rec = {"bench": "raftlog", **rec}
    print(json.dumps(rec), flush=True)
    results.append(rec)


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def cpu_of(c: LocalCluster) -> list[float]:
    return [c.status(i)["cpu_s"] for i in range(c.size)]


def throughput(
    results: list[dict[str, Any]],
    flush: str,
    size: int,
    window: int,
    batch_max: int,
    seconds: float,
) -> None:
    with (
        tempfile.TemporaryDirectory(prefix="rlbench-", dir=ROOT / "bench") as tmp,
        LocalCluster(Path(tmp), flush=flush, extra_args=("--batch-max-bytes", str(batch_max))) as c,
    ):
        c.start_all()
        leader = c.leader(timeout_s=20)
        c.call(
            leader,
            {
                "op": "load",
                "size": size,
                "window": window,
                "seconds": 1.0,
                "return_latencies": False,
            },
            timeout_s=60,
        )  # warm-up
        cpu0 = cpu_of(c)
        r = c.call(
            leader,
            {
                "op": "load",
                "size": size,
                "window": window,
                "seconds": seconds,
                "return_latencies": True,
            },
            timeout_s=seconds + 60,
        )
        cpu1 = cpu_of(c)
        st = c.status(leader)
        lat = r["latencies_s"]
        mbps = r["bytes"] / r["elapsed_s"] / MB
        emit(
            results,
            {
                "name": f"throughput_{flush.lower()}_{size}B_submissions",
                "flush": flush,
                "submission_bytes": size,
                "window": window,
                "batch_max_bytes": batch_max,
                "seconds": round(r["elapsed_s"], 2),
                "MB_per_s": round(mbps, 1),
                "submissions_per_s": round(r["commits"] / r["elapsed_s"]),
                "entries_committed": st["commit_index"],
                "errors": r["errors"],
                "latency_p50_ms": round(pct(lat, 50) * 1000, 2) if lat else None,
                "latency_p99_ms": round(pct(lat, 99) * 1000, 2) if lat else None,
                "cpu_ms_per_MB": [
                    round((b - a) * 1000 / (r["bytes"] / MB), 2)
                    for a, b in zip(cpu0, cpu1, strict=True)
                ],
                "leader": leader,
            },
        )


def latency(results: list[dict[str, Any]], flush: str, count: int) -> None:
    with (
        tempfile.TemporaryDirectory(prefix="rlbench-", dir=ROOT / "bench") as tmp,
        LocalCluster(Path(tmp), flush=flush) as c,
    ):
        c.start_all()
        leader = c.leader(timeout_s=20)
        c.call(
            leader,
            {"op": "load", "size": 1024, "window": 1, "seconds": 1.0, "return_latencies": False},
        )
        # Each node's CPU per commit at W2's shape (one at a time), net of what it spends idle.
        idle0 = cpu_of(c)
        time.sleep(IDLE_S)
        cpu0 = cpu_of(c)
        idle = [(b - a) / IDLE_S for a, b in zip(idle0, cpu0, strict=True)]
        t0 = time.monotonic()
        r = c.call(
            leader,
            {"op": "load", "size": 1024, "window": 1, "seconds": 1e9, "total_bytes": count * 1024},
            timeout_s=300,
        )
        wall = time.monotonic() - t0
        cpu1 = cpu_of(c)
        lat = r["latencies_s"]
        cpu_us = [
            round(((b - a) - i * wall) / len(lat) * 1e6, 1)
            for a, b, i in zip(cpu0, cpu1, idle, strict=True)
        ]
        emit(
            results,
            {
                "name": f"commit_latency_{flush.lower()}_1KiB_one_caller",
                "flush": flush,
                "commits": len(lat),
                "p50_ms": round(pct(lat, 50) * 1000, 3),
                "p90_ms": round(pct(lat, 90) * 1000, 3),
                "p99_ms": round(pct(lat, 99) * 1000, 3),
                "max_ms": round(max(lat) * 1000, 3),
                "leader": leader,
                "cpu_us_per_commit": cpu_us,  # per node, net of idle
                "cpu_us_per_commit_sum": round(sum(cpu_us), 1),
            },
        )


def failover(results: list[dict[str, Any]], rounds: int) -> None:
    gaps: list[float] = []
    with (
        tempfile.TemporaryDirectory(prefix="rlbench-", dir=ROOT / "bench") as tmp,
        LocalCluster(Path(tmp)) as c,
    ):
        c.start_all()
        for _ in range(rounds):
            leader = c.leader(timeout_s=20)
            res = c.call(leader, {"op": "submit", "payloads": [b"before"]})
            assert res[0][0] == "ok", res
            survivors = [i for i in range(c.size) if i != leader]
            t0 = time.monotonic()
            c.kill(leader)
            done = None
            while done is None and time.monotonic() - t0 < 30:
                for i in survivors:
                    try:
                        r = c.call(i, {"op": "submit", "payloads": [b"probe"], "timeout_s": 1.0})
                    except ControlError:
                        continue
                    if r[0][0] == "ok":
                        done = time.monotonic() - t0
                        break
                else:
                    time.sleep(0.002)
            gaps.append(done if done is not None else float("inf"))
            c.start(leader)
            new_leader = c.leader(timeout_s=20)
            target = c.status(new_leader)["commit_index"]
            deadline = time.monotonic() + 30
            while c.status(leader)["committed_index"] < target and time.monotonic() < deadline:
                time.sleep(0.05)
    emit(
        results,
        {
            "name": "failover_sigkill_leader_first_commit",
            "rounds": rounds,
            "median_s": round(statistics.median(gaps), 3),
            "max_s": round(max(gaps), 3),
            "all_s": [round(g, 3) for g in gaps],
        },
    )


def rss(results: list[dict[str, Any]], gigabytes: float) -> None:
    total = int(gigabytes * 1e9)
    with (
        tempfile.TemporaryDirectory(prefix="rlbench-", dir=ROOT / "bench") as tmp,
        LocalCluster(Path(tmp)) as c,
    ):
        c.start_all()
        leader = c.leader(timeout_s=20)
        peak = [0] * c.size
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.5):
                for i in range(c.size):
                    if i == leader:
                        continue  # its control connection is busy with the load; it samples itself
                    with contextlib.suppress(ControlError, OSError, EOFError):
                        peak[i] = max(peak[i], c.status(i)["rss_bytes"])

        t = threading.Thread(target=sample, daemon=True)
        t.start()
        r = c.call(
            leader,
            {
                "op": "load",
                "size": 64 * 1024,
                "window": 64,
                "seconds": 1e9,
                "total_bytes": total,
                "sample_rss": True,
                "return_latencies": False,
            },
            timeout_s=3600,
        )
        stop.set()
        t.join()
        peak[leader] = r["max_rss_bytes"]
        emit(
            results,
            {
                "name": "rss_while_writing",
                "bytes_written": r["bytes"],
                "seconds": round(r["elapsed_s"], 1),
                "MB_per_s": round(r["bytes"] / r["elapsed_s"] / MB, 1),
                "peak_rss_MB": [round(p / 2**20, 1) for p in peak],
            },
        )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="throughput,latency,failover,rss")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--rss-gb", type=float, default=10.0)
    ap.add_argument("--failover-rounds", type=int, default=10)
    args = ap.parse_args()
    only = set(args.only.split(","))
    results: list[dict[str, Any]] = []
    emit(
        results,
        {
            "name": "machine",
            "python": platform.python_version(),
            "cpus": __import__("os").cpu_count(),
            "platform": platform.platform(),
        },
    )
    if "throughput" in only:
        for flush in ("ASYNC_FLUSH", "SYNC_FLUSH"):
            # the broker submits a record batch per produce request: 64 KiB = 64 x 1 KiB messages
            throughput(results, flush, 64 * 1024, 64, 1 << 20, args.seconds)
        # group commit of single 1 KiB submissions into entries of up to 64 KiB
        throughput(results, "ASYNC_FLUSH", 1024, 4096, 64 * 1024, args.seconds)
    if "latency" in only:
        latency(results, "ASYNC_FLUSH", 3000)
        latency(results, "SYNC_FLUSH", 3000)
    if "failover" in only:
        failover(results, args.failover_rounds)
    if "rss" in only:
        rss(results, args.rss_gb)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    previous: list[dict[str, Any]] = []
    if RESULTS.exists() and only != {"throughput", "latency", "failover", "rss"}:
        previous = [
            r
            for r in json.loads(RESULTS.read_text())
            if r["name"] not in {x["name"] for x in results}
        ]
    RESULTS.write_text(json.dumps(previous + results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
