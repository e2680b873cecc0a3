"""W2's shape (one synchronous sender, 1 KiB bodies, the SDK's Producer.send) against two local
three-node groups on the native Raft core, side by side in one run: one whose leader places
queue offsets and answers at commit (issue 29, `leader_places_offsets` true), one whose
dispatcher assigns them and answers after indexing (false, the path before). The sender takes
turns in blocks, so a change in the machine's load hits both alike: compare the two, not the
absolute figures. One JSON line per setting; appends to bench/results/placed_offsets.jsonl.

`--in-process`: the same A/B without sockets or processes, one broker node on a MemoryLog (a
commit is immediate there): what is left is exactly the wait the answer at commit removes (the
dispatcher's hop and its lmdb transaction), per send through SendProcessor.send.

Run: `PYTHONPATH=$PWD .venv/bin/python bench/placed_offsets_bench.py [--sends 2000] [--block 200]
[--in-process]`
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


def in_process(sends: int, block: int) -> dict[str, list[float]]:
    from raftmq.broker.node import BrokerNode
    from raftmq.broker.settings import BrokerSettings
    from raftmq.broker.store import MessageStore
    from raftmq.common.message import Message
    from raftmq.raftlog.memory import MemoryLog

    members = "n0=127.0.0.1:10911/127.0.0.1:20911"
    lat: dict[str, list[float]] = {name: [] for name in SETTINGS}
    with tempfile.TemporaryDirectory(prefix="placed-bench-") as tmp:
        nodes = {}
        for name in SETTINGS:
            d = Path(tmp) / name
            settings = BrokerSettings(
                node_id="n0",
                members=members,
                data_dir=d,
                leader_places_offsets=name == "placed",
            )
            node = BrokerNode(
                settings,
                MemoryLog("127.0.0.1:20911"),
                MessageStore(d / "store", map_size_bytes=1 << 30),
            )
            node.start()
            nodes[name] = node
        message = [Message("w2", BODY, None, (), {}, 0, 1, "127.0.0.1:1")]
        try:
            for node in nodes.values():
                for _ in range(200):
                    node.sends.send("w2", 0, message, "", 0, 0)
            while any(len(v) < sends for v in lat.values()):
                for name, node in nodes.items():
                    for _ in range(min(block, sends - len(lat[name]))):
                        t = time.perf_counter()
                        node.sends.send("w2", 0, message, "", 0, 0)
                        lat[name].append((time.perf_counter() - t) * 1000)
        finally:
            for node in nodes.values():
                node.close()
    return lat


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sends", type=int, default=2000, help="sends per setting")
    ap.add_argument("--block", type=int, default=200, help="sends per turn")
    ap.add_argument("--in-process", action="store_true", help="one node on a MemoryLog")
    args = ap.parse_args()
    if args.in_process:
        report(in_process(args.sends, args.block), "in_process_send")
        return
    with tempfile.TemporaryDirectory(prefix="placed-bench-") as tmp:
        clusters: dict[str, Cluster] = {}
        try:
            for name, extra in SETTINGS.items():
                (Path(tmp) / name).mkdir()
                clusters[name] = start_cluster(
                    Path(tmp) / name,
                    groups=("broker-a",),
                    namesrvs=1,
                    broker_args=list(extra),
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
    report(lat, "w2_sync_send")


def report(lat: dict[str, list[float]], what: str) -> None:
    RESULTS.parent.mkdir(exist_ok=True)
    with RESULTS.open("a") as out:
        for name, values in lat.items():
            row = {
                "name": f"{what}_{name}",
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
