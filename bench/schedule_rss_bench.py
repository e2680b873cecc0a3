"""Memory of a broker group holding many scheduled messages (issue 16: "10^6 scheduled messages:
RSS under 300 MB per node"; memory must not grow with the number scheduled).

Starts a real three-node broker group and a NameServer, schedules `--count` messages (default
10^6) of `--body-bytes` far in the future (`--ahead-h` hours, spread over `--spread-s` seconds
so that nothing falls due during the run), sending asynchronously with the producer's batching
(`--in-flight` messages awaited at a time), and samples each broker node's memory from
/proc/<pid>/status before, every `--sample-every` messages and after: VmRSS (what the issue
bounds), RssAnon (the Python heap) and RssFile (mapped lmdb and journal pages, which the kernel
may drop). Each node's peak RSS (VmHWM, the kernel's high-water mark) is the figure checked.
One JSON line per run, appended to bench/results/schedule_rss.jsonl.

Run: `PYTHONPATH=$PWD .venv/bin/python bench/schedule_rss_bench.py [--count 1000000]`
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from raftmq.client.admin import Admin  # noqa: E402
from raftmq.client.producer import Producer, SendResult  # noqa: E402
from tests.harness.procs import start_cluster, wait_until  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "schedule_rss.jsonl"
FIELDS = ("VmRSS", "RssAnon", "RssFile", "VmHWM")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def status_mib(pid: int) -> dict[str, float]:
    """The memory lines of /proc/<pid>/status, in MiB."""
    out = dict.fromkeys(FIELDS, 0.0)
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in out:
            out[name] = round(int(rest.split()[0]) / 1024, 1)
    return out


def sample(pids: list[int]) -> dict[str, list[float]]:
    per_node = [status_mib(pid) for pid in pids]
    return {f: [node[f] for node in per_node] for f in FIELDS}


def dir_mib(path: Path) -> float:
    total = 0
    for p in path.rglob("*"):
        try:
            if p.is_file():
                total += p.stat().st_blocks * 512
        except OSError:
            pass  # a segment deleted meanwhile
    return round(total / (1 << 20), 1)


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run(count: int, body_bytes: int, ahead_h: float, spread_s: int, in_flight: int,
        sample_every: int, segment_mib: int) -> dict[str, Any]:  # fmt: skip
    broker_args = ["--segment-bytes", str(segment_mib << 20)] if segment_mib else []
    with tempfile.TemporaryDirectory(prefix="schedule-rss-") as tmp:
        cluster = start_cluster(Path(tmp), ("broker-a",), namesrvs=1, broker_args=broker_args)
        try:
            with Admin(cluster.namesrv) as admin:
                wait_until(lambda: any(g.leader_address for g in admin.groups()), 60, "a leader")
                leader = next(g.leader_address for g in admin.groups())
            layout, procs = cluster.groups["broker-a"]
            pids = [p.popen.pid for p in procs if p.popen is not None]
            roles = ["leader" if layout.address(i) == leader else "follower" for i in range(3)]
            topic = "schedule-rss"
            body = b"x" * body_bytes
            samples: list[dict[str, Any]] = []
            with Producer(cluster.namesrv, linger_ms=5, send_timeout_ms=120_000) as producer:
                producer.send(topic, b"warm-up", delay_ms=3_600_000)  # topic and schedule exist
                time.sleep(2)
                before = sample(pids)
                samples.append({"scheduled": 0, **before})
                start = time.monotonic()
                at = now_ms() + int(ahead_h * 3_600_000)
                pending: list[Future[SendResult]] = []
                for i in range(count):
                    due = at + (i * spread_s * 1000) // count
                    pending.append(producer.send_async(topic, body, deliver_at_ms=due))
                    if len(pending) >= in_flight:
                        for f in pending:
                            f.result(300)
                        pending.clear()
                    if (i + 1) % sample_every == 0:
                        samples.append({"scheduled": i + 1, **sample(pids)})
                        print(json.dumps(samples[-1]), file=sys.stderr, flush=True)
                for f in pending:
                    f.result(300)
                elapsed = time.monotonic() - start
            time.sleep(5)  # followers apply and dispatch the tail
            after = sample(pids)
            samples.append({"scheduled": count, "settled": True, **after})
            disk = [dir_mib(Path(tmp) / f"broker-a-n{i}") for i in range(len(pids))]
        finally:
            cluster.close()
    return {
        "bench": "schedule_rss",
        "scheduled": count,
        "body_bytes": body_bytes,
        "ahead_h": ahead_h,
        "segment_mib": segment_mib or 256,
        "schedule_rate_per_s": round(count / elapsed),
        "schedule_s": round(elapsed, 1),
        "roles": roles,
        "mib_before": before,
        "mib_after": after,
        # The kernel's high-water mark of each node's RSS over its whole life (VmHWM).
        "vmrss_peak_mib": after["VmHWM"],
        "under_300_mb": all(v * 1.048576 < 300 for v in after["VmHWM"]),
        "disk_mib": disk,
        "samples": samples,
        "load_average": load_average(),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=1_000_000, help="messages to schedule")
    ap.add_argument("--body-bytes", type=int, default=100)
    ap.add_argument("--ahead-h", type=float, default=24.0, help="first due time, hours ahead")
    ap.add_argument("--spread-s", type=int, default=3_600, help="due times spread over this")
    ap.add_argument("--in-flight", type=int, default=5_000, help="sends awaited at a time")
    ap.add_argument("--sample-every", type=int, default=100_000)
    ap.add_argument(
        "--segment-mib",
        type=int,
        default=0,
        help="journal segment size (0: the broker's 256 MiB); smaller rolls segments, and each "
        "roll makes a retention base, during the run",
    )
    args = ap.parse_args()
    rec = run(args.count, args.body_bytes, args.ahead_h, args.spread_s, args.in_flight,
              args.sample_every, args.segment_mib)  # fmt: skip
    rec["command"] = "bench/schedule_rss_bench.py " + " ".join(sys.argv[1:])
    print(json.dumps({k: v for k, v in rec.items() if k != "samples"}), flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as f:
        f.write(json.dumps(rec) + "\n")
    return 0 if rec["under_300_mb"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
