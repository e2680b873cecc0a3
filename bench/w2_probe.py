"""Where a synchronous send's time and CPU go (W2's shape: one sender, 1 KiB, one message per
send, each waiting for its answer) on one local group of three native-Raft nodes: the send's
p50/p90, and the CPU per send of the client and of every broker process and busy thread (net of
what each process spends idle, measured for 2 s first). The threaded `Producer.send`, the call
most users make; peerbench's W2 drives the asyncio face instead.

    PYTHONPATH=$PWD .venv/bin/python bench/w2_probe.py [--sends 2000] [-- BROKER_ARGS...]

One JSON line on stdout (appended to bench/results/w2_probe.jsonl), the per-thread table on
stderr. CPU per send is much less sensitive to the machine's load than the latencies are.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.w1_probe import cpu_s, thread_names, threads
from raftmq.client.admin import Admin
from raftmq.client.producer import Producer
from tests.harness.procs import start_cluster

RESULTS = Path(__file__).resolve().parent / "results" / "w2_probe.jsonl"
BODY = b"x" * 1024
IDLE_S = 2.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sends", type=int, default=2000)
    ap.add_argument("broker_args", nargs="*", help="passed to every broker (after --)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="w2-probe-") as tmp:
        cluster = start_cluster(
            Path(tmp), groups=("broker-a",), namesrvs=1, broker_args=args.broker_args
        )
        try:
            cluster.wait_leaders()
            with Admin(cluster.namesrv) as admin:
                admin.create_topic("w2", queues=8)
            producer = Producer(cluster.namesrv)
            for _ in range(300):  # routes, connections, the leader gate of its term
                producer.send("w2", BODY)
            nodes = {p.name.rsplit("-", 1)[1]: p.popen.pid for p in cluster.groups["broker-a"][1]}
            stat = {n: f"/proc/{pid}/stat" for n, pid in nodes.items()}
            before = {n: cpu_s(path) for n, path in stat.items()}
            time.sleep(IDLE_S)
            idle = {n: (cpu_s(path) - before[n]) / IDLE_S for n, path in stat.items()}
            t0 = {n: threads(pid) for n, pid in nodes.items()}
            c0 = {n: cpu_s(path) for n, path in stat.items()}
            me0, w0 = time.process_time(), time.perf_counter()
            lat = []
            for _ in range(args.sends):
                t = time.perf_counter()
                producer.send("w2", BODY)
                lat.append((time.perf_counter() - t) * 1000)
            wall = time.perf_counter() - w0
            me1 = time.process_time()
            c1 = {n: cpu_s(path) for n, path in stat.items()}
            t1 = {n: threads(pid) for n, pid in nodes.items()}
            names = {n: thread_names(pid) for n, pid in nodes.items()}
            producer.close()
        finally:
            cluster.close()
    n = args.sends
    lat.sort()
    per_node = {k: round(((c1[k] - c0[k]) - idle[k] * wall) / n * 1e6, 1) for k in nodes}
    row = {
        "name": "w2_sync_send_cpu",
        "sends": n,
        "p50_ms": round(lat[n // 2], 3),
        "p90_ms": round(lat[n * 9 // 10], 3),
        "client_us_per_send": round((me1 - me0) / n * 1e6, 1),
        "nodes_us_per_send": per_node,
        "broker_args": args.broker_args,
        "commit": subprocess.run(
            ["git", "-C", str(RESULTS.parent.parent), "describe", "--always", "--dirty"],
            check=False,
            capture_output=True,
            text=True,
        ).stdout.strip(),
        "loadavg_1m": os.getloadavg()[0],
        "host": platform.node(),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(f"{'node':6s} {'thread':28s} {'us/send':>8s}", file=sys.stderr)
    for k in sorted(nodes):
        busy = sorted(((t1[k][t] - t0[k].get(t, 0.0)) / n * 1e6, t) for t in t1[k])
        for us, tid in reversed(busy):
            if us >= 10:
                print(f"{k:6s} {names[k].get(tid, tid):28s} {us:8.1f}", file=sys.stderr)
    RESULTS.parent.mkdir(exist_ok=True)
    with RESULTS.open("a") as out:
        out.write(json.dumps(row) + "\n")
    print(json.dumps(row))


if __name__ == "__main__":
    main()
