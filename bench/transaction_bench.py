"""Transactional send + commit rate against plain sends, on a real three-node broker group (all on
this machine). `--threads` senders each send synchronously, one 1 KiB message at a time: plain
with Producer.send, transactional with TransactionProducer.send_in_transaction whose local
transaction commits at once (a half message, answered after the majority commit, then the end,
sent without waiting as RocketMQ's oneway end; a round lasts until every end is answered).
The modes take turns in rounds so a change in the machine's load hits both. One JSON line per
mode plus the ratio; appends to bench/results/transactions.jsonl.

Run: `PYTHONPATH=$PWD .venv/bin/python bench/transaction_bench.py [--seconds 5] [--rounds 3]
[--threads 8]`
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from raftmq.client.admin import Admin
from raftmq.client.producer import Producer
from raftmq.client.producer.transaction import LocalTransactionState, TransactionProducer
from tests.harness.procs import Proc, start_cluster, wait_until

RESULTS = Path(__file__).resolve().parent / "results" / "transactions.jsonl"
GROUP = "broker-a"
TOPIC = "bench-txn"
BODY = b"x" * 1024


def _pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))] if s else 0.0


@dataclass
class Totals:
    count: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    cpu_s: float = 0.0


def _cpu_s(procs: list[Proc]) -> float:
    """utime + stime of the broker processes (all three: the leader and its followers)."""
    total = 0.0
    for proc in procs:
        assert proc.popen is not None
        fields = Path(f"/proc/{proc.popen.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _run_for(
    seconds: float, threads: int, send: Callable[[], None], finish: Callable[[], object]
) -> tuple[int, float, list[float]]:
    """Messages sent, the seconds it took (until `finish` returned: the transactional
    producer's ends answered), and each send's latency."""
    t0 = time.monotonic()
    stop = t0 + seconds
    lat: list[float] = []
    lock = threading.Lock()

    def worker() -> None:
        mine = []
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            send()
            mine.append(time.perf_counter() - t0)
        with lock:
            lat.extend(mine)

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    finish()
    return len(lat), time.monotonic() - t0, lat


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5.0, help="per mode per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=8)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="txn-bench-") as tmp:
        cluster = start_cluster(Path(tmp), groups=(GROUP,), namesrvs=1)
        try:
            with Admin(cluster.namesrv) as admin:
                wait_until(lambda: any(g.leader_address for g in admin.groups()), 60, "a leader")
                admin.create_topic(TOPIC, queues=4)
                wait_until(lambda: admin.route(TOPIC).write_queues(), 30, "the route")
            commit = LocalTransactionState.COMMIT
            with (
                Producer(cluster.namesrv) as plain,
                TransactionProducer(cluster.namesrv, "bench-txn", lambda check: commit) as txn,
            ):

                def plain_send() -> None:
                    plain.send(TOPIC, BODY)

                def txn_send_commit() -> None:
                    txn.send_in_transaction(TOPIC, BODY, lambda half: commit)

                modes: dict[str, tuple[Callable[[], None], Callable[[], object]]] = {
                    "plain_send": (plain_send, lambda: None),
                    # send_in_transaction does not wait for the end (RocketMQ's oneway end);
                    # a round ends when every end has been answered
                    "txn_send_commit": (txn_send_commit, txn.flush),
                }
                for send, finish in modes.values():  # warm up: routes, channels, topic
                    _run_for(0.5, 1, send, finish)
                totals = {m: Totals() for m in modes}
                procs = cluster.groups[GROUP][1]
                for _ in range(args.rounds):
                    for mode, (send, finish) in modes.items():
                        cpu0 = _cpu_s(procs)
                        n, took, lat = _run_for(args.seconds, args.threads, send, finish)
                        tot = totals[mode]
                        tot.count += n
                        tot.seconds += took
                        tot.latencies.extend(lat)
                        tot.cpu_s += _cpu_s(procs) - cpu0
                batching = {
                    "halves_per_request": round(
                        txn._halves.items / max(1, txn._halves.requests), 2
                    ),
                    "ends_per_request": round(txn._ends.items / max(1, txn._ends.requests), 2),
                }
        finally:
            cluster.close()
    rates: dict[str, float] = {}
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    lines = []
    for mode, tot in totals.items():
        n, lat = tot.count, tot.latencies
        rate = n / tot.seconds
        rates[mode] = rate
        lines.append(
            {
                "bench": "transactions",
                "mode": mode,
                "threads": args.threads,
                "rate_per_s": round(rate, 1),
                "p50_ms": round(_pct(lat, 50) * 1000, 2),
                "p99_ms": round(_pct(lat, 99) * 1000, 2),
                "messages": n,
                "brokers_cpu_us_per_message": round(tot.cpu_s / n * 1e6, 1),
                "body_bytes": len(BODY),
                "when": stamp,
                "machine": f"{platform.machine()} {platform.node()} cpus=2",
            }
        )
    lines.append(
        {
            "bench": "transactions",
            "mode": "ratio",
            "txn_over_plain": round(rates["txn_send_commit"] / rates["plain_send"], 3),
            "target": ">= 0.5",
            **batching,
            "when": stamp,
        }
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
    for line in lines:
        print(json.dumps(line))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
