"""What the metrics cost the sender: two real three-node broker groups side by side (all on this
machine), one with every broker serving /metrics (scraped once a second, harsher than
Prometheus's usual 15 s) and one without (metrics_listen off: nothing is counted). One Producer
per cluster sends 1 KiB messages asynchronously over the framed data path; the clusters take
turns in blocks, so a change in the machine's load hits both. The median block rate of each
and the cost in percent; one JSON line appended to bench/results/metrics.jsonl.

Run: `PYTHONPATH=$PWD .venv/bin/python bench/metrics_bench.py [--messages 20000] [--rounds 5]`
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from raftmq.client.admin import Admin
from raftmq.client.producer import Producer
from tests.harness.procs import Cluster, start_cluster

RESULTS = Path(__file__).resolve().parent / "results" / "metrics.jsonl"
GROUP = "broker-a"
TOPIC = "bench-metrics"
BODY = b"x" * 1024


def metrics_urls(cluster: Cluster) -> list[str]:
    """The brokers' /metrics, from their started lines (metrics=HOST:PORT)."""
    urls = []
    for p in cluster.groups[GROUP][1]:
        field = next(f for f in p.started_line.split() if f.startswith("metrics="))
        urls.append(f"http://{field.removeprefix('metrics=')}/metrics")
    return urls


def scraper(urls: list[str], stop: threading.Event, scrapes: list[int]) -> None:
    while not stop.wait(1.0):
        for url in urls:
            with urllib.request.urlopen(url, timeout=5) as resp:
                resp.read()
            scrapes[0] += 1


def block_rate(producer: Producer, messages: int) -> float:
    t0 = time.perf_counter()
    futures = [producer.send_async(TOPIC, BODY) for _ in range(messages)]
    for f in futures:
        f.result(60)
    return messages / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=20_000, help="messages per block")
    ap.add_argument("--rounds", type=int, default=5, help="blocks per cluster")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="metrics-bench-") as tmp:
        on = start_cluster(
            Path(tmp) / "on", groups=(GROUP,), namesrvs=1,
            broker_args=("--metrics-listen", "127.0.0.1:0"),
        )  # fmt: skip
        try:
            off = start_cluster(Path(tmp) / "off", groups=(GROUP,), namesrvs=1)
        except BaseException:
            on.close()
            raise
        stop = threading.Event()
        scrapes = [0]
        try:
            urls = metrics_urls(on)
            thread = threading.Thread(target=scraper, args=(urls, stop, scrapes), daemon=True)
            rates: dict[str, list[float]] = {"on": [], "off": []}
            with Producer(on.namesrv) as p_on, Producer(off.namesrv) as p_off:
                for cluster in (on, off):
                    with Admin(cluster.namesrv) as admin:
                        admin.create_topic(TOPIC, queues=8)
                for p in (p_on, p_off):
                    block_rate(p, 2_000)  # warm-up: routes, connections, auto-creation
                thread.start()
                for i in range(args.rounds):
                    order = [("on", p_on), ("off", p_off)]
                    for mode, p in order if i % 2 == 0 else reversed(order):
                        rates[mode].append(block_rate(p, args.messages))
            stop.set()
            thread.join(5)
            with urllib.request.urlopen(urls[0], timeout=5) as resp:
                exposition_bytes = len(resp.read())
        finally:
            stop.set()
            on.close()
            off.close()
    med_on, med_off = statistics.median(rates["on"]), statistics.median(rates["off"])
    cost_pct = 100 * (med_off - med_on) / med_off
    line = {
        "bench": "metrics",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": platform.node(),
        "messages_per_block": args.messages,
        "rounds": args.rounds,
        "body_bytes": len(BODY),
        "rate_on_msgs_per_s": round(med_on),
        "rate_off_msgs_per_s": round(med_off),
        "blocks_on": [round(r) for r in rates["on"]],
        "blocks_off": [round(r) for r in rates["off"]],
        "cost_pct": round(cost_pct, 2),
        "scrapes": scrapes[0],
        "exposition_bytes": exposition_bytes,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as f:
        f.write(json.dumps(line) + "\n")
    print(json.dumps(line))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
