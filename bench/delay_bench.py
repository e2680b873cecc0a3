"""Delay precision (issue 16): a producer schedules messages at `--rate` per second with
deliver_at_ms spread evenly over `--seconds` (so that many fall due per second), to a real
three-node broker group; a PullConsumer receives them. Reports the lateness of each delivery past
its due time: at the broker (the delivered row's store time, the DELIVER entry's time) and at the
consumer (receive time, same host clock), p50/p99/max, and checks none came early or twice.
One JSON line per run, appended to bench/results/delay.jsonl.

With `--hold N` it instead schedules N messages an hour ahead and reports each node's RSS
before and after (the schedule lives in lmdb, so RSS must not grow with N).

Run: `.venv/bin/python bench/delay_bench.py [--rate 500] [--seconds 10] [--hold 200000]`
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

from raftmq.client.admin import Admin  # noqa: E402
from raftmq.client.consumer_pull import PullConsumer  # noqa: E402
from raftmq.client.offsets import StartFrom  # noqa: E402
from raftmq.client.producer import Producer  # noqa: E402
from tests.harness.procs import start_cluster, wait_until  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "delay.jsonl"
LEAD_MS = 3_000  # the first message falls due this long after the schedule starts


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def pct(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(rate: int, seconds: int) -> dict[str, Any]:
    n = rate * seconds
    with tempfile.TemporaryDirectory(prefix="delay-bench-") as tmp:
        cluster = start_cluster(Path(tmp), ("broker-a",), namesrvs=1)
        try:
            with Admin(cluster.namesrv) as admin:
                wait_until(lambda: any(g.leader_address for g in admin.groups()), 60, "a leader")
            topic = "delay-bench"
            with Producer(cluster.namesrv, linger_ms=2) as producer:
                producer.send(topic, b"warm-up")
                t0 = now_ms() + LEAD_MS
                futures = [
                    producer.send_async(
                        topic, f"{i}".encode(), deliver_at_ms=t0 + i * 1_000 // rate
                    )
                    for i in range(n)
                ]
                for f in futures:
                    f.result(60)
                scheduled_ms = now_ms()
            broker_late: list[int] = []
            client_late: list[int] = []
            seen: set[bytes] = set()
            duplicates = early = 0
            with PullConsumer(cluster.namesrv, "g-bench", start_from=StartFrom.EARLIEST) as c:
                c.subscribe(topic)
                deadline = time.monotonic() + seconds + 60
                while len(seen) < n and time.monotonic() < deadline:
                    for m in c.poll(100):
                        got = now_ms()
                        if m.body == b"warm-up":
                            continue
                        if m.body in seen:
                            duplicates += 1
                        seen.add(m.body)
                        due = int(m.properties["TIMER_OUT_MS"])
                        early += m.store_timestamp_ms < due or got < due
                        broker_late.append(m.store_timestamp_ms - due)
                        client_late.append(got - due)
        finally:
            cluster.close()
    return {
        "bench": "delay_precision",
        "rate_due_per_s": rate,
        "messages": n,
        "received": len(seen),
        "duplicates": duplicates,
        "early": early,
        "schedule_send_s": round((scheduled_ms - (t0 - LEAD_MS)) / 1000, 2),
        "broker_late_ms_p50": pct(broker_late, 0.5),
        "broker_late_ms_p99": pct(broker_late, 0.99),
        "broker_late_ms_max": max(broker_late),
        "consumer_late_ms_p50": pct(client_late, 0.5),
        "consumer_late_ms_p99": pct(client_late, 0.99),
        "consumer_late_ms_mean": round(statistics.fmean(client_late), 1),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    """A memory line of /proc/<pid>/status in MiB: VmRSS, RssAnon (the heap) or RssFile (mapped
    files: lmdb's pages and the journal, which the kernel can drop)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def memory(pids: list[int]) -> dict[str, list[float]]:
    return {f: [round(rss_mib(pid, f), 1) for pid in pids] for f in ("VmRSS", "RssAnon", "RssFile")}


def hold(n: int) -> dict[str, Any]:
    """Schedule n messages an hour ahead; the broker nodes' RSS before and after."""
    with tempfile.TemporaryDirectory(prefix="delay-hold-") as tmp:
        cluster = start_cluster(Path(tmp), ("broker-a",), namesrvs=1)
        try:
            with Admin(cluster.namesrv) as admin:
                wait_until(lambda: any(g.leader_address for g in admin.groups()), 60, "a leader")
            _, procs = cluster.groups["broker-a"]
            pids = [p.popen.pid for p in procs if p.popen is not None]
            topic = "delay-hold"
            with Producer(cluster.namesrv, linger_ms=5, send_timeout_ms=60_000) as producer:
                producer.send(topic, b"warm-up", delay_ms=3_600_000)
                before = memory(pids)
                start = time.monotonic()
                at = now_ms() + 3_600_000
                pending = []
                for i in range(n):
                    pending.append(producer.send_async(topic, b"x" * 100, deliver_at_ms=at + i))
                    if len(pending) >= 5_000:
                        for f in pending:
                            f.result(120)
                        pending.clear()
                for f in pending:
                    f.result(120)
                elapsed = time.monotonic() - start
            time.sleep(3)  # followers apply the tail
            after = memory(pids)
        finally:
            cluster.close()
    return {
        "bench": "delay_hold_memory",
        "scheduled": n,
        "schedule_rate_per_s": round(n / elapsed),
        "mib_before": before,
        "mib_after": after,
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=int, default=500, help="messages falling due per second")
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--hold", type=int, default=0, help="schedule this many, report RSS")
    args = ap.parse_args()
    rec = hold(args.hold) if args.hold else run(args.rate, args.seconds)
    print(json.dumps(rec), flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as f:
        f.write(json.dumps(rec) + "\n")
    if args.hold:
        return 0
    return 0 if rec["received"] == rec["messages"] and not rec["early"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
