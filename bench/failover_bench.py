"""W4 (issue 4): one producer doing ~500 sync sends/s of 1 KiB to broker-a; SIGKILL the current
leader 5 s into each round (then restart it); report the longest gap between acknowledgements,
the failed sends and the acknowledged-but-lost messages (must be 0). Also graceful hand-offs
(SIGTERM of the leader: it transfers leadership first). One cluster (3 controllers, 2 NameServers,
broker-a of 3 nodes) serves every round. One JSON line per result; bench/results/failover.json.

Run: `.venv/bin/python bench/failover_bench.py [--rounds 10] [--graceful-rounds 5]`
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import signal
import statistics
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
from raftmq.client.offsets import StartFrom  # noqa: E402
from raftmq.client.producer import Producer  # noqa: E402
from raftmq.ops.cluster_runner import ClusterRunner  # noqa: E402
from raftmq.ops.cluster_spec import local_description, parse  # noqa: E402
from tests.harness.local_cluster import free_ports  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "failover.json"
BODY = b"x" * 1024
TOPIC = "w4"


def emit(results: list[dict[str, Any]], rec: dict[str, Any]) -> None:
    rec = {"bench": "failover", **rec}
    print(json.dumps(rec), flush=True)
    results.append(rec)


def leader_node(admin: Admin) -> str:
    for g in admin.groups():
        if g.broker_group == "broker-a" and g.leader_node_id:
            st = admin.broker_status(g.leader_address)
            if st.role == 1:  # LEADER
                return st.node_id
    return ""


def wait_for(pred: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if pred():
                return True
        except Exception:
            pass
        time.sleep(0.05)
    return False


def one_round(
    runner: ClusterRunner, admin: Admin, ns: str, sig: int, rate: float
) -> dict[str, Any]:
    acks: list[tuple[float, int, int]] = []  # (time, queue id, offset)
    failed = 0
    stop = threading.Event()

    def send() -> None:
        nonlocal failed
        with Producer(ns, send_timeout_ms=10_000) as p:
            period = 1.0 / rate
            nxt = time.monotonic()
            while not stop.is_set():
                try:
                    r = p.send(TOPIC, BODY)
                    acks.append((time.monotonic(), r.queue_id, r.queue_offset))
                except Exception:
                    failed += 1
                nxt += period
                time.sleep(max(0.0, nxt - time.monotonic()))

    t = threading.Thread(target=send, daemon=True)
    t.start()
    time.sleep(5.0)
    victim = leader_node(admin)
    killed_at = time.monotonic()
    runner.kill(f"broker-a-{victim}", sig)
    wait_for(lambda: leader_node(admin) not in ("", victim), 30)
    time.sleep(5.0)
    stop.set()
    t.join(timeout=30)
    runner.start(f"broker-a-{victim}")
    times = [a[0] for a in acks]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    around = [b - a for a, b in itertools.pairwise(times) if b >= killed_at]
    return {
        "acked": len(acks),
        "failed": failed,
        "longest_gap_s": round(max(gaps), 3) if gaps else None,
        "gap_after_kill_s": round(max(around), 3) if around else None,
        "acks": acks,
    }


def lost(ns: str, acks: list[tuple[float, int, int]]) -> int:
    want = {(q, o) for _, q, o in acks}
    got: set[tuple[int, int]] = set()
    with PullConsumer(ns, f"w4-check-{time.time_ns()}", start_from=StartFrom.EARLIEST) as c:
        c.subscribe(TOPIC)
        deadline = time.monotonic() + 120
        while not want <= got and time.monotonic() < deadline:
            got.update((m.queue_id, m.queue_offset) for m in c.poll(500))
    return len(want - got)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--graceful-rounds", type=int, default=5)
    ap.add_argument("--rate", type=float, default=500.0)
    ap.add_argument(
        "--election-timeout-ms", default="", help="MIN,MAX for the broker nodes (default: theirs)"
    )
    args = ap.parse_args()
    broker_settings = ""
    if args.election_timeout_ms:
        lo, hi = args.election_timeout_ms.split(",")
        broker_settings = f"election_timeout_min_ms={int(lo)}\nelection_timeout_max_ms={int(hi)}\n"
    results: list[dict[str, Any]] = []
    emit(
        results,
        {
            "name": "machine",
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "election_timeout_ms": args.election_timeout_ms or "200,400 (broker default)",
        },
    )
    with tempfile.TemporaryDirectory(prefix="fobench-", dir=ROOT / "bench") as tmp:
        description = local_description(
            free_ports(14), Path(tmp) / "data", name="W4",
            extra=f"[settings.broker]\n{broker_settings}",
        )  # fmt: skip
        runner = ClusterRunner(parse(description))
        runner.start_all()
        ns = ",".join(f"{p.host}:{p.ports[0]}" for p in runner.processes() if p.role == "namesrv")
        try:
            with Admin(ns) as admin:
                wait_for(lambda: leader_node(admin), 30)
                admin.create_topic(TOPIC, queues=4)
                wait_for(lambda: admin.route(TOPIC).write_queues(), 20)
                all_acks: list[tuple[float, int, int]] = []
                for kind, sig, rounds in (
                    ("sigkill", signal.SIGKILL, args.rounds),
                    ("graceful", signal.SIGTERM, args.graceful_rounds),
                ):
                    rows = []
                    for i in range(rounds):
                        row = one_round(runner, admin, ns, sig, args.rate)
                        all_acks.extend(row.pop("acks"))
                        rows.append(row)
                        emit(results, {"name": f"w4_{kind}_round", "round": i + 1, **row})
                        wait_for(
                            lambda: len([p for p in runner.running.values() if p.alive]) == 8, 30
                        )
                        time.sleep(2.0)  # the restarted node catches up before the next round
                    gaps = [
                        r["gap_after_kill_s"] for r in rows if r["gap_after_kill_s"] is not None
                    ]
                    emit(
                        results,
                        {
                            "name": f"w4_{kind}_summary",
                            "rounds": rounds,
                            "median_gap_s": round(statistics.median(gaps), 3) if gaps else None,
                            "worst_gap_s": max(gaps) if gaps else None,
                            "failed_sends": sum(r["failed"] for r in rows),
                            "acked": sum(r["acked"] for r in rows),
                        },
                    )
                emit(
                    results,
                    {
                        "name": "w4_acked_but_lost",
                        "acked": len(all_acks),
                        "lost": lost(ns, all_acks),
                    },
                )
        finally:
            runner.stop_all()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
