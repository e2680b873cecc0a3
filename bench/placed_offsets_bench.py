"""W2's shape (one synchronous sender, 1 KiB bodies, the SDK's Producer.send) against two local
three-node groups on the native Raft core, side by side in one run: one whose leader places
queue offsets and answers at commit (issue 29, `leader_places_offsets` true), one whose
dispatcher assigns them and answers after indexing (false, the path before). The sender takes
turns in blocks, so a change in the machine's load hits both alike: compare the two, not the
absolute figures. One JSON line per setting; appends to bench/results/placed_offsets.jsonl.

Run: `PYTHONPATH=$PWD .venv/bin/python bench/placed_offsets_bench.py [--sends 2000] [--block 200]`
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

from raftmq.client.admin import Admin
from raftmq.client.producer import Producer
from tests.harness.procs import Cluster, start_cluster

RESULTS = Path(__file__).resolve().parent / "results" / "placed_offsets.jsonl"
BODY = b"x" * 1024
SETTINGS = {"placed": [], "dispatcher": ["--no-leader-places-offsets"]}


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p / 100))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sends", type=int, default=2000, help="sends per setting")
    ap.add_argument("--block", type=int, default=200, help="sends per turn")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="placed-bench-") as tmp:
        clusters: dict[str, Cluster] = {}
        try:
            for name, extra in SETTINGS.items():
                clusters[name] = start_cluster(
                    Path(tmp) / name,
                    groups=("broker-a",),
                    namesrvs=1,
                    broker_args=["--raft-impl", "native", *extra],
                )
            producers = {}
            for name, cluster in clusters.items():
                with Admin(cluster.namesrv) as admin:
                    admin.create_topic("w2", queues=8)
                producers[name] = Producer(cluster.namesrv)
                for _ in range(200):  # routes, connections, the leader gate of its term
                    producers[name].send("w2", BODY)
            lat: dict[str, list[float]] = {name: [] for name in clusters}
            while any(len(v) < args.sends for v in lat.values()):
                for name, p in producers.items():
                    for _ in range(min(args.block, args.sends - len(lat[name]))):
                        t = time.perf_counter()
                        p.send("w2", BODY)
                        lat[name].append((time.perf_counter() - t) * 1000)
            for p in producers.values():
                p.close()
        finally:
            for cluster in clusters.values():
                cluster.close()
    RESULTS.parent.mkdir(exist_ok=True)
    with RESULTS.open("a") as out:
        for name, values in lat.items():
            row = {
                "name": f"w2_sync_send_{name}",
                "sends": len(values),
                "p50_ms": round(pct(values, 50), 3),
                "p90_ms": round(pct(values, 90), 3),
                "p99_ms": round(pct(values, 99), 3),
                "host": platform.node(),
                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            print(json.dumps(row))
            out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
