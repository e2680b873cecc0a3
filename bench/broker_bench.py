"""Benchmarks W1-W3 of issue 3 through the SDK against a real local cluster (two NameServers,
broker-a and broker-b of three nodes each, or broker-a alone with `--groups 1`, all on this
machine), 1 KiB bodies, acks after a majority commit. One JSON line per result; writes
bench/results/broker.json.

  W1  one producer, 64 sends in flight (send_async)        -> msg/s
  W1b one producer, send_batch_future of --batch bodies, 8 in flight  -> msg/s
  W2  one sync sender                                       -> p50 / p99 latency
  W3  drain a backlog with one PullConsumer                 -> msg/s
  idle the servers' CPU with no client at all (--only idle)  -> cores

Each result carries the CPU microseconds per message of the client process and of all server
processes together, which compare across noisy runs better than rates do.

Run: `.venv/bin/python bench/broker_bench.py [--only w1,w1b,w2,w3,idle] [--seconds 10]`
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from raftmq.client.admin import Admin  # noqa: E402
from raftmq.client.consumer_pull import PullConsumer  # noqa: E402
from raftmq.client.messages import OutgoingMessage  # noqa: E402
from raftmq.client.offsets import StartFrom  # noqa: E402
from raftmq.client.producer import Producer  # noqa: E402
from tests.harness.procs import Cluster, start_cluster, wait_until  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "broker.json"
BODY = b"x" * 1024


def emit(results: list[dict[str, Any]], rec: dict[str, Any]) -> None:
    rec = {"bench": "broker", **rec}
    print(json.dumps(rec), flush=True)
    results.append(rec)


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds of this process and of every server process between start and stop."""

    def __init__(self, cluster: Cluster) -> None:
        self.pids = [p.popen.pid for p in cluster.procs() if p.popen is not None]

    def sample(self) -> tuple[float, float]:
        t = os.times()
        return t.user + t.system, sum(proc_cpu_s(pid) for pid in self.pids)

    def per_message_us(self, before: tuple[float, float], messages: int) -> dict[str, float]:
        after = self.sample()
        n = max(messages, 1)
        return {
            "client_cpu_us_per_msg": round((after[0] - before[0]) / n * 1e6, 1),
            "servers_cpu_us_per_msg": round((after[1] - before[1]) / n * 1e6, 1),
        }


def create_topic(cluster: Cluster, topic: str, queues: int) -> None:
    with Admin(cluster.namesrv) as admin:
        admin.create_topic(topic, queues=queues)
        groups = len(cluster.groups)
        wait_until(
            lambda: len(admin.route(topic).write_queues()) == groups * queues,
            20,
            f"route of {topic}",
        )


def w1(results: list[dict[str, Any]], cluster: Cluster, seconds: float, inflight: int) -> None:
    topic = "w1"
    create_topic(cluster, topic, 8)
    meter = CpuMeter(cluster)
    sem = threading.Semaphore(inflight)
    done = [0, 0]
    lock = threading.Lock()

    def on_done(fut: Any) -> None:
        with lock:
            done[0 if fut.exception() is None else 1] += 1
        sem.release()

    with Producer(cluster.namesrv) as p:
        for _ in range(200):  # warm up routes and connections
            p.send(topic, BODY)
        before = meter.sample()
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            sem.acquire()
            p.send_async(topic, BODY).add_done_callback(on_done)
        for _ in range(inflight):
            sem.acquire()
        elapsed = time.monotonic() - t0
    emit(
        results,
        {
            "name": "w1_one_producer_64_in_flight",
            "inflight": inflight,
            "seconds": round(elapsed, 2),
            "acked": done[0],
            "failed": done[1],
            "msg_per_s": round(done[0] / elapsed),
            **meter.per_message_us(before, done[0]),
        },
    )


def w1b(
    results: list[dict[str, Any]], cluster: Cluster, seconds: float, batch: int, groups: int
) -> None:
    topic = "w1b"
    create_topic(cluster, topic, 8)
    meter = CpuMeter(cluster)
    bodies = [BODY] * batch  # bare bodies: the batch-first call's cheapest form
    acked = 0
    with Producer(cluster.namesrv) as p:
        p.send_batch_future(topic, bodies).result()
        before = meter.sample()
        t0 = time.monotonic()
        window: list[Any] = []
        while time.monotonic() - t0 < seconds:
            window.append(p.send_batch_future(topic, bodies))  # one future per batch
            if len(window) >= 8:
                acked += len(window.pop(0).result())
        for fut in window:
            acked += len(fut.result())
        elapsed = time.monotonic() - t0
    emit(
        results,
        {
            "name": "w1b_batch_api",
            "groups": groups,
            "batch": batch,
            "batches_in_flight": 8,
            "seconds": round(elapsed, 2),
            "acked": acked,
            "msg_per_s": round(acked / elapsed),
            **meter.per_message_us(before, acked),
        },
    )


def w2(results: list[dict[str, Any]], cluster: Cluster, count: int) -> None:
    topic = "w2"
    create_topic(cluster, topic, 8)
    meter = CpuMeter(cluster)
    lat: list[float] = []
    with Producer(cluster.namesrv) as p:
        for _ in range(200):
            p.send(topic, BODY)
        before = meter.sample()
        for _ in range(count):
            t = time.perf_counter()
            p.send(topic, BODY)
            lat.append((time.perf_counter() - t) * 1000)
    emit(
        results,
        {
            "name": "w2_one_sync_sender",
            "sends": count,
            "p50_ms": round(pct(lat, 50), 3),
            "p90_ms": round(pct(lat, 90), 3),
            "p99_ms": round(pct(lat, 99), 3),
            "max_ms": round(max(lat), 3),
            **meter.per_message_us(before, count),
        },
    )


def idle(results: list[dict[str, Any]], cluster: Cluster, seconds: float) -> None:
    """What the servers burn with no client: their share of every per-message CPU figure at
    low rates (heartbeats, pysyncobj's tick loop)."""
    time.sleep(3)  # past the elections and first registrations
    procs = [p for p in cluster.procs() if p.popen is not None]
    before = {p.name: proc_cpu_s(p.popen.pid) for p in procs if p.popen is not None}
    t0 = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - t0
    per = {
        p.name: round((proc_cpu_s(p.popen.pid) - before[p.name]) / elapsed, 3)
        for p in procs
        if p.popen is not None
    }
    emit(
        results,
        {
            "name": "idle_servers",
            "seconds": round(elapsed, 2),
            "servers_cores": round(sum(per.values()), 3),
            "per_process_cores": per,
        },
    )


def w3(results: list[dict[str, Any]], cluster: Cluster, backlog: int) -> None:
    topic = "w3"
    create_topic(cluster, topic, 8)
    msgs = [OutgoingMessage(BODY)] * 1000
    t0 = time.monotonic()
    with Producer(cluster.namesrv) as p:
        window: list[Any] = []
        for _ in range(backlog // 1000):
            window.append(p.send_batch_async(topic, msgs))
            if len(window) >= 8:
                for f in window.pop(0):
                    f.result()
        for fs in window:
            for f in fs:
                f.result()
    fill_s = time.monotonic() - t0
    meter = CpuMeter(cluster)
    got = 0
    with PullConsumer(cluster.namesrv, "w3-drain", start_from=StartFrom.EARLIEST) as c:
        before = meter.sample()
        t0 = time.monotonic()
        c.subscribe(topic)
        while got < backlog and time.monotonic() - t0 < 600:
            got += len(c.poll(1000))
        elapsed = time.monotonic() - t0
    emit(
        results,
        {
            "name": "w3_drain_backlog_one_pull_consumer",
            "backlog": backlog,
            "fill_s": round(fill_s, 1),
            "consumed": got,
            "seconds": round(elapsed, 2),
            "msg_per_s": round(got / elapsed),
            **meter.per_message_us(before, got),
        },
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="w1,w1b,w2,w3")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--inflight", type=int, default=64)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--sync-sends", type=int, default=3000)
    ap.add_argument("--backlog", type=int, default=500_000)
    # The batch-call bars (issues 24, 29) name one group of three; two share the same two cores.
    ap.add_argument("--groups", type=int, default=2, choices=(1, 2))
    args = ap.parse_args()
    only = set(args.only.split(","))
    results: list[dict[str, Any]] = []
    emit(
        results,
        {
            "name": "machine",
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
    )
    with tempfile.TemporaryDirectory(prefix="brbench-", dir=ROOT / "bench") as tmp:
        groups = ("broker-a", "broker-b")[: args.groups]
        cluster = start_cluster(Path(tmp), groups=groups)
        try:
            with Admin(cluster.namesrv) as admin:
                wait_until(
                    lambda: len([g for g in admin.groups() if g.leader_address]) == len(groups),
                    30,
                    "leaders",
                )
            if "w1" in only:
                w1(results, cluster, args.seconds, args.inflight)
            if "w1b" in only:
                w1b(results, cluster, args.seconds, args.batch, args.groups)
            if "w2" in only:
                w2(results, cluster, args.sync_sends)
            if "w3" in only:
                w3(results, cluster, args.backlog)
            if "idle" in only:
                idle(results, cluster, args.seconds)
        finally:
            cluster.close()
    old: list[dict[str, Any]] = []
    if RESULTS.exists():
        old = json.loads(RESULTS.read_text())
    names = {r["name"] for r in results}
    merged = [r for r in old if r.get("name") not in names] + results
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(merged, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
