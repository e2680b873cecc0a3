"""One synchronous sender against a real three-node broker group (all on this machine), over the
framed data path (broker/data_server.py, FrameClient.call_threadsafe from a plain thread: the
threaded SDK's path) and over gRPC (BrokerStub.SendMessage): latency per send, p50 and p99, and
the leader process's CPU per send. One message of 1 KiB per send, each answered after the
majority commit and the dispatch. The transports take turns in blocks, so a change in the
machine's load hits both. One JSON line per transport; appends to bench/results/data_path.jsonl.

Run: `PYTHONPATH=$PWD .venv/bin/python bench/data_path_bench.py [--sends 3000] [--block 250]`
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from raftmq.client.admin import Admin
from raftmq.common.data_api import DataMethod
from raftmq.common.pb import broker_pb2, broker_pb2_grpc, common_pb2, namesrv_pb2
from raftmq.common.transport import FrameClient, LoopThread
from tests.harness.procs import Proc, start_cluster, wait_until

RESULTS = Path(__file__).resolve().parent / "results" / "data_path.jsonl"
GROUP = "broker-a"
TOPIC = "bench-data-path"
BODY = b"x" * 1024


def _pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def _proc_cpu_s(proc: Proc) -> float:
    assert proc.popen is not None
    fields = Path(f"/proc/{proc.popen.pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime + stime


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sends", type=int, default=3000, help="sends per transport")
    ap.add_argument("--block", type=int, default=250, help="sends per turn")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="data-path-bench-") as tmp:
        cluster = start_cluster(Path(tmp), groups=(GROUP,), namesrvs=1)
        io = LoopThread("bench-frames")
        try:
            return _run(cluster.namesrv, cluster.groups[GROUP][1], io, args.sends, args.block)
        finally:
            io.stop()
            cluster.close()


def _run(namesrv: str, procs: list[Proc], io: LoopThread, sends: int, block: int) -> int:
    def leader_node() -> namesrv_pb2.BrokerNode | None:
        with Admin(namesrv) as admin:
            (g,) = [g for g in admin.groups() if g.broker_group == GROUP]
            found = [n for n in g.nodes if n.is_leader and n.data_address]
            return found[0] if len(g.nodes) == 3 and found else None

    leader = wait_until(leader_node, 60, "a leader with a data address")
    assert isinstance(leader, namesrv_pb2.BrokerNode)
    proc = next(p for p in procs if p.name.endswith("-" + leader.node_id))
    host, _, port = leader.data_address.rpartition(":")
    frames = FrameClient(host, int(port), loop=io.loop)
    channel = grpc.insecure_channel(leader.address)
    stub = broker_pb2_grpc.BrokerStub(channel)
    req = broker_pb2.SendMessageRequest(
        topic=TOPIC, queue_id=0, messages=[common_pb2.Message(body=BODY, tags="t")]
    )
    payload = req.SerializeToString()

    def by_frames() -> None:
        frames.call_threadsafe(DataMethod.SEND_MESSAGE, payload, 10).result(11)

    def by_grpc() -> None:
        stub.SendMessage(req, timeout=10)

    senders: dict[str, Callable[[], None]] = {"frames": by_frames, "grpc": by_grpc}
    wait_until(lambda: by_frames() or True, 30, "a first send (the leader's gate)")
    for send in senders.values():  # warm both paths (connections, lmdb pages, the JIT-less
        for _ in range(200):  # interpreter's caches) before measuring
            send()
    latencies: dict[str, list[float]] = {name: [] for name in senders}
    cpu_s = dict.fromkeys(senders, 0.0)
    load_start = os.getloadavg()[0]
    done = 0
    while done < sends:
        n = min(block, sends - done)
        for name, send in senders.items():
            cpu0 = _proc_cpu_s(proc)
            out = latencies[name]
            for _ in range(n):
                t0 = time.perf_counter()
                send()
                out.append(time.perf_counter() - t0)
            cpu_s[name] += _proc_cpu_s(proc) - cpu0
        done += n
    channel.close()
    io.run(frames.close())
    RESULTS.parent.mkdir(exist_ok=True)
    with RESULTS.open("a") as f:
        for name, values in latencies.items():
            line = {
                "bench": "data_path_send",
                "transport": name,
                "sends": len(values),
                "body_bytes": len(BODY),
                "p50_us": round(_pct(values, 50) * 1e6, 1),
                "p99_us": round(_pct(values, 99) * 1e6, 1),
                "mean_us": round(sum(values) / len(values) * 1e6, 1),
                "leader_cpu_us_per_send": round(cpu_s[name] / len(values) * 1e6, 1),
                "host": platform.node()[:16],
                "cores": os.cpu_count(),
                "loadavg_1m_start": round(load_start, 2),
                "loadavg_1m_end": round(os.getloadavg()[0], 2),
                "ts": time.strftime("%Y-%m-%dT%H:%M:%S"),
            }
            print(json.dumps(line))
            f.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
