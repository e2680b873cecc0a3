"""Idle long-polling consumers beside a sync sender (issue 14, bar 2: 1 000 idle long-polling
consumers on one broker group change a sync sender's p99 by less than 20 %).

One NameServer and one broker group of three nodes as real processes. A sync sender (SDK
`Producer.send`, one at a time, 1 KiB, tag "busy") measures its latency for --seconds per round;
rounds alternate between no consumers (baseline) and --consumers idle SDK consumers started in
--procs client processes (so the clients' own threads are not the sender's), so a drift of this
shared machine's load shows as a drift of the baselines, not as a cost:

  B  quiet  B  same  B  quiet  B  same ... B

  quiet  consumers of a topic that gets no traffic: every one holds a long poll on the leader.
  same   consumers of the sender's own topic that subscribe to a tag the sender never sends
         ("idle consumers of a busy topic", the issue's starvation case): every send lands in a
         queue with held polls, which the broker wakes, filters and holds again.

The consumers are PushConsumers as users run them (--kind push, the default): CLUSTERING,
groups of 8 members over the topic's 8 queues (so each member holds one queue's long poll, the
default 2 s, and a group of 8 is how one scales a service), with their default heartbeats (every
node, every 10 s), rebalances (every 20 s) and offset commits (every 1 s). --kind pull uses
PullConsumers assigned one queue each instead (no heartbeats, no commits), --kind raw the same
long polls from bare FrameClients (the broker's share of the cost without the SDK's).
--grpc starts the brokers with `--data-listen off`, so every client uses the gRPC data path.

Per round: the sender's p50/p99/p999 and errors, the leader's CPU (cores) and RSS, its thread
count, and (scraped between the window's ends, never during it) its held-poll gauge; per loaded
round the ratio of its p99 to the mean of the two baselines around it. One JSON line per round
and one summary line per variant, appended to bench/results/idle_polls-<date>.jsonl.

Run: `PYTHONPATH=$PWD .venv/bin/python bench/idle_polls_bench.py [--consumers 1000] [--procs 5]
      [--rounds 3] [--seconds 10] [--variants quiet,same] [--kind push|pull] [--grpc]`
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rich.progress import Progress  # noqa: E402

from raftmq.client.admin import Admin  # noqa: E402
from raftmq.client.consumer_pull import PullConsumer  # noqa: E402
from raftmq.client.consumer_push import PushConsumer  # noqa: E402
from raftmq.client.producer import Producer  # noqa: E402
from raftmq.common.data_api import DataMethod  # noqa: E402
from raftmq.common.errors import RaftMQError  # noqa: E402
from raftmq.common.pb import broker_pb2  # noqa: E402
from raftmq.common.transport import FrameClient, LoopThread  # noqa: E402
from raftmq.common.types import QueueRef  # noqa: E402
from tests.harness.procs import Cluster, Proc, start_cluster, wait_until  # noqa: E402

RESULTS_DIR = ROOT / "bench" / "results"
GROUP = "broker-a"
BUSY = "idle-polls-busy"  # the sender's topic
QUIET = "idle-polls-quiet"  # no traffic at all
QUEUES = 8
MEMBERS = 8  # consumers per consumer group (one queue each)
BODY = b"x" * 1024
SEND_TAG = "busy"
IDLE_TAG = "audit"  # what the "same" consumers want: never sent
READY_TIMEOUT_S = 180.0


# ---- the client processes -----------------------------------------------------------------------


def worker(args: argparse.Namespace) -> int:
    """Start `--count` consumers numbered from `--first`, say "ready", hold them until stdin
    closes, then close them (a few at a time) and exit."""
    topic, tags = (QUIET, "*") if args.variant == "quiet" else (BUSY, IDLE_TAG)
    consumers: list[PushConsumer | PullConsumer] = []
    queues: list[QueueRef] = []

    def start(i: int) -> PushConsumer | PullConsumer:
        # Groups new each round: no committed offsets or members left from an earlier one.
        group = f"idle-{args.variant}-r{args.round}-{i // MEMBERS}"
        poll = {"long_poll_ms": args.long_poll_ms} if args.long_poll_ms else {}
        if args.kind == "push":
            return PushConsumer(
                args.namesrv, group, topic, lambda m: None, tag_expression=tags, **poll
            ).start()
        c = PullConsumer(args.namesrv, group, tag_expression=tags, **poll)
        c.assign([queues[i % len(queues)]])
        return c

    if args.kind == "raw":
        return raw_worker(args, topic, tags)
    if args.kind == "pull":
        with Admin(args.namesrv) as admin:
            queues = admin.route(topic).read_queues()
    with ThreadPoolExecutor(16) as pool:
        consumers = list(pool.map(start, range(args.first, args.first + args.count)))
    print(f"ready {len(consumers)}", flush=True)
    sys.stdin.read()  # the bench closes our stdin when the round is over
    with ThreadPoolExecutor(32) as pool:
        list(pool.map(lambda c: c.close(), consumers))
    os._exit(0)  # no interpreter teardown of a thousand threads


def raw_worker(args: argparse.Namespace, topic: str, tags: str) -> int:
    """--kind raw: the same long polls (one queue each, 2 s, asked again when answered) from
    bare FrameClients on one event loop, 100 polls a connection: the broker's load of idle
    consumers without the SDK's threads, heartbeats, rebalances and route look-ups, to tell
    the broker's share of a slowdown from the clients' on a machine they share."""
    with Admin(args.namesrv) as admin:
        (g,) = [g for g in admin.groups() if g.broker_group == GROUP]
        leader = next(n for n in g.nodes if n.is_leader)
    host, _, port = leader.data_address.rpartition(":")
    io = LoopThread("raw-polls")

    async def poll(client: FrameClient, queue_id: int) -> None:
        bounds = broker_pb2.GetQueueBoundsRequest(topic=topic, queue_id=queue_id)
        raw = await client.call(DataMethod.GET_QUEUE_BOUNDS, bounds.SerializeToString(), 10)
        offset = broker_pb2.GetQueueBoundsResponse.FromString(raw).max_offset
        wait_s = (args.long_poll_ms or 2_000) / 1000 + 5  # the SDK's margin past the hold
        while True:
            req = broker_pb2.PullMessageRequest(
                consumer_group=f"idle-raw-{queue_id}",
                topic=topic,
                queue_id=queue_id,
                offset=offset,
                max_wait_ms=args.long_poll_ms or 2_000,
                filter_type=broker_pb2.TAG,
                filter_expression=tags,
                raw_batches=True,
            )
            try:
                raw = await client.call(DataMethod.PULL_MESSAGE, req.SerializeToString(), wait_s)
            except RaftMQError:  # a leader change, a closing node: poll again shortly
                await asyncio.sleep(0.5)
                continue
            offset = broker_pb2.PullMessageResponse.FromString(raw).next_offset or offset

    tasks: list[asyncio.Task[None]] = []  # kept: the loop holds tasks only weakly

    async def start() -> None:
        clients = [
            FrameClient(host, int(port), loop=asyncio.get_running_loop())
            for _ in range((args.count + 99) // 100)
        ]
        for i in range(args.count):
            tasks.append(asyncio.ensure_future(poll(clients[i // 100], (args.first + i) % QUEUES)))

    io.run(start(), 10)
    print(f"ready {args.count}", flush=True)
    sys.stdin.read()
    os._exit(0)


class Clients:
    """--procs worker processes sharing --consumers consumers of one variant."""

    def __init__(
        self,
        namesrv: str,
        variant: str,
        consumers: int,
        procs: int,
        kind: str,
        nice: int,
        round_no: int,
        long_poll_ms: int,
    ) -> None:
        per = [consumers // procs + (i < consumers % procs) for i in range(procs)]
        self.procs: list[subprocess.Popen[str]] = []
        first = 0
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        for n in per:
            argv = ["nice", "-n", str(nice), sys.executable, __file__, "--worker"]
            argv += ["--namesrv", namesrv, "--round", str(round_no)]
            argv += ["--long-poll-ms", str(long_poll_ms)]
            argv += ["--variant", variant, "--kind", kind, "--first", str(first), "--count", str(n)]
            self.procs.append(
                subprocess.Popen(
                    argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                    env=env,
                )
            )
            first += n

    def wait_ready(self) -> None:
        for p in self.procs:
            assert p.stdout is not None
            line = p.stdout.readline()  # the worker's stdout: its one "ready" line
            if not line.startswith("ready"):
                raise RuntimeError(f"a client process failed to start (exit {p.poll()})")

    def close(self) -> None:
        for p in self.procs:
            if p.stdin is not None:
                p.stdin.close()
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]


# ---- measuring -------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_status(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def scrape(metrics_address: str, name: str) -> float:
    """One gauge of a broker's /metrics (between windows: a scrape costs the broker work)."""
    if not metrics_address:
        return float("nan")
    try:
        with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return float("nan")
    m = re.search(rf"^{name} ([0-9.e+]+)$", text, re.M)
    return float(m.group(1)) if m else float("nan")


class Leader:
    def __init__(self, cluster: Cluster) -> None:
        layout, procs = cluster.groups[GROUP]
        with Admin(cluster.namesrv) as admin:
            (g,) = [g for g in admin.groups() if g.broker_group == GROUP]
        i = [layout.address(k) for k in range(3)].index(g.leader_address)
        self.proc: Proc = procs[i]
        assert self.proc.popen is not None
        self.pid = self.proc.popen.pid
        self.address = g.leader_address
        m = re.search(r"metrics=(\S+)", self.proc.started_line)
        self.metrics = m.group(1) if m else ""

    def held(self) -> float:
        return scrape(self.metrics, "raftmq_held_pulls")


def measure(
    producer: Producer, leader: Leader, seconds: float, progress: Progress, label: str
) -> dict[str, Any]:
    lat: list[float] = []
    errors = 0
    last_error = ""
    task = progress.add_task(label, total=seconds)
    cpu0 = proc_cpu_s(leader.pid)
    t_start = time.monotonic()
    end = t_start + seconds
    while (now := time.monotonic()) < end:
        try:
            producer.send(BUSY, BODY, tags=SEND_TAG)
            lat.append(time.monotonic() - now)
        except RaftMQError as exc:  # a failed send is the finding: count it, say what it was
            errors += 1
            last_error = f"{type(exc).__name__}: {exc}"[:300]
        progress.update(task, completed=min(seconds, time.monotonic() - t_start))
    wall = time.monotonic() - t_start
    progress.remove_task(task)
    return {
        "sends": len(lat),
        "errors": errors,
        "last_error": last_error,
        "p50_ms": round(pct(lat, 0.5) * 1000, 2),
        "p99_ms": round(pct(lat, 0.99) * 1000, 2),
        "p999_ms": round(pct(lat, 0.999) * 1000, 2),
        "max_ms": round(max(lat) * 1000, 1) if lat else None,
        "leader_cpu_cores": round((proc_cpu_s(leader.pid) - cpu0) / wall, 3),
        "leader_rss_mib": round(proc_status(leader.pid, "VmRSS") / 1024, 1),
        "leader_threads": proc_status(leader.pid, "Threads"),
    }


def settle(leader: Leader, clients: Clients, want: int, grpc: bool) -> dict[str, Any]:
    """Until the consumers' polls are held on the leader (framed path: its gauge near `want`
    twice in a row; gRPC: a few seconds, it has no gauge), then 3 s more."""
    t0 = time.monotonic()
    clients.wait_ready()
    started_s = time.monotonic() - t0
    if grpc:
        time.sleep(5)
    else:
        streak = 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and streak < 2:
            # Two looks in a row with (nearly) every poll held: a poll is answered and sent
            # again every long_poll_ms, so the gauge never sits exactly still.
            streak = streak + 1 if leader.held() >= 0.9 * want else 0
            time.sleep(2)
    time.sleep(3)
    return {"clients_start_s": round(started_s, 1), "settle_s": round(time.monotonic() - t0, 1)}


def emit(path: Path, rec: dict[str, Any]) -> None:
    print(json.dumps(rec), flush=True)
    with path.open("a") as f:
        f.write(json.dumps(rec) + "\n")


def run(args: argparse.Namespace) -> int:
    variants = [v for v in args.variants.split(",") if v]
    path = RESULTS_DIR / f"idle_polls-{time.strftime('%Y%m%d-%H%M', time.gmtime())}.jsonl"
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    common = {
        "bench": "idle_polls",
        "consumers": args.consumers,
        "client_procs": args.procs,
        "kind": args.kind,
        "path": "grpc" if args.grpc else "frames",
        "client_nice": args.nice,
        "long_poll_ms": args.long_poll_ms or "sdk default",
        "seconds": args.seconds,
        "host": platform.node(),
        "cpus": os.cpu_count(),
    }
    broker_args = ["--metrics-listen", "127.0.0.1:0"]
    if args.grpc:
        broker_args += ["--data-listen", "off"]
    loads: list[float] = []
    sampling = threading.Event()

    def sample_load() -> None:
        while not sampling.wait(5):
            loads.append(os.getloadavg()[0])

    threading.Thread(target=sample_load, daemon=True).start()
    with tempfile.TemporaryDirectory(prefix="idle-polls-") as tmp:
        cluster = start_cluster(Path(tmp), (GROUP,), namesrvs=1, broker_args=broker_args)
        clients: Clients | None = None
        try:
            cluster.wait_leaders()
            with Admin(cluster.namesrv) as admin:

                def routed(topic: str) -> bool:
                    return len(admin.route(topic).write_queues()) == QUEUES

                for topic in (BUSY, QUIET):
                    admin.create_topic(topic, queues=QUEUES)
                    wait_until(functools.partial(routed, topic), 30, topic)
            leader = Leader(cluster)
            rounds: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
            baselines: list[dict[str, Any]] = []
            with Producer(cluster.namesrv) as producer, Progress() as progress:
                for _ in range(300):  # routes, connections, the leader's caches
                    producer.send(BUSY, BODY, tags=SEND_TAG)
                order = [v for _ in range(args.rounds) for v in variants]

                def baseline(k: int) -> dict[str, Any]:
                    rec = {**common, "round": k, "variant": "baseline"}
                    rec.update(measure(producer, leader, args.seconds, progress, f"{k} baseline"))
                    rec["load_avg_1m"] = round(os.getloadavg()[0], 2)
                    emit(path, rec)
                    baselines.append(rec)
                    return rec

                before = baseline(0)
                for k, variant in enumerate(order, start=1):
                    want = args.consumers  # one queue each (push: once rebalanced)
                    clients = Clients(
                        cluster.namesrv,
                        variant,
                        args.consumers,
                        args.procs,
                        args.kind,
                        args.nice,
                        k,
                        args.long_poll_ms,
                    )
                    ready = settle(leader, clients, want, args.grpc)
                    held_before = leader.held()
                    cpu0 = [proc_cpu_s(p) for p in clients.pids()]
                    t0 = time.monotonic()
                    rec = {**common, "round": k, "variant": variant, **ready}
                    rec.update(measure(producer, leader, args.seconds, progress, f"{k} {variant}"))
                    used = sum(proc_cpu_s(p) for p in clients.pids()) - sum(cpu0)
                    rec["clients_cpu_cores"] = round(used / (time.monotonic() - t0), 2)
                    rec["held_pulls"] = [held_before, leader.held()]
                    rec["load_avg_1m"] = round(os.getloadavg()[0], 2)
                    clients.close()
                    clients = None
                    time.sleep(2)
                    after = baseline(k)
                    base_p99 = (before["p99_ms"] + after["p99_ms"]) / 2
                    rec["baseline_p99_ms"] = round(base_p99, 2)
                    rec["p99_ratio"] = round(rec["p99_ms"] / base_p99, 3)
                    rec["p50_ratio"] = round(
                        rec["p50_ms"] / ((before["p50_ms"] + after["p50_ms"]) / 2), 3
                    )
                    emit(path, rec)
                    rounds[variant].append(rec)
                    before = after
            sampling.set()
            for variant, recs in rounds.items():
                ratios = [r["p99_ratio"] for r in recs]
                emit(
                    path,
                    {
                        **common,
                        "variant": variant,
                        "summary": True,
                        "rounds": len(recs),
                        "p99_ratio_each": ratios,
                        "p99_ratio_median": round(statistics.median(ratios), 3),
                        "p50_ratio_median": round(
                            statistics.median(r["p50_ratio"] for r in recs), 3
                        ),
                        "loaded_p99_ms": [r["p99_ms"] for r in recs],
                        "baseline_p99_ms": [b["p99_ms"] for b in baselines],
                        "errors": sum(r["errors"] for r in recs),
                        "held_pulls": [r["held_pulls"] for r in recs],
                        "leader_cpu_cores_loaded": [r["leader_cpu_cores"] for r in recs],
                        "leader_cpu_cores_baseline": [b["leader_cpu_cores"] for b in baselines],
                        "load_avg_1m_during": [round(x, 2) for x in loads],
                        "bar_met": statistics.median(ratios) < 1.2
                        and not any(r["errors"] for r in recs),
                        "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    },
                )
        finally:
            sampling.set()
            if clients is not None:
                clients.close()
            cluster.close()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--consumers", type=int, default=1000)
    ap.add_argument("--procs", type=int, default=5, help="client processes for the consumers")
    ap.add_argument("--rounds", type=int, default=3, help="loaded rounds per variant")
    ap.add_argument("--seconds", type=float, default=10.0, help="sender window per round")
    ap.add_argument("--variants", default="quiet,same")
    ap.add_argument("--kind", choices=("push", "pull", "raw"), default="push")
    ap.add_argument("--grpc", action="store_true", help="brokers with --data-listen off")
    ap.add_argument(
        "--long-poll-ms", type=int, default=0, help="the consumers' long poll (0: the SDK's)"
    )
    ap.add_argument(
        "--nice",
        type=int,
        default=19,
        help="niceness of the consumers' processes (they stand in for other machines)",
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--namesrv", help=argparse.SUPPRESS)
    ap.add_argument("--variant", help=argparse.SUPPRESS)
    ap.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the bench ends us through stdin
        return worker(args)
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
