"""What the metrics cost the sender: two real three-node broker groups side by side (all on
this machine), one with every broker serving /metrics (scraped every --scrape-interval seconds:
Prometheus's default 15, or 1 for a harsh case) and one without (metrics_listen off: nothing is
counted). One Producer per cluster sends 1 KiB messages asynchronously over the framed data
path; the clusters take turns in blocks, so a change in the machine's load hits both. The
median block rate of each, the brokers' CPU per message (steadier than the rate on a shared
machine) and the costs in percent; one JSON line appended to bench/results/metrics.jsonl.

Run: `PYTHONPATH=$PWD .venv/bin/python bench/metrics_bench.py [--rounds 9] [--scrape-interval 1]`
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from raftmq.client.admin import Admin
from raftmq.client.producer import Producer
from tests.harness.procs import Cluster, start_cluster, wait_until

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


def scraper(
    urls: list[str], stop: threading.Event, scrape_ms: list[float], interval_s: float
) -> None:
    while not stop.wait(interval_s):
        for url in urls:
            t0 = time.perf_counter()
            with urllib.request.urlopen(url, timeout=5) as resp:
                resp.read()
            scrape_ms.append((time.perf_counter() - t0) * 1000)


def led(admin: Admin) -> bool:
    return all(g.leader_address for g in admin.groups())


def brokers_cpu_s(cluster: Cluster) -> float:
    """utime + stime of the cluster's broker processes (the leader does most of the work)."""
    total = 0.0
    for p in cluster.groups[GROUP][1]:
        assert p.popen is not None
        fields = Path(f"/proc/{p.popen.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def block(producer: Producer, cluster: Cluster, messages: int) -> tuple[float, float]:
    """(messages per second, broker CPU microseconds per message) of one block."""
    cpu0, t0 = brokers_cpu_s(cluster), time.perf_counter()
    futures = [producer.send_async(TOPIC, BODY) for _ in range(messages)]
    for f in futures:
        f.result(60)
    elapsed = time.perf_counter() - t0
    return messages / elapsed, (brokers_cpu_s(cluster) - cpu0) * 1e6 / messages


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=20_000, help="messages per block")
    ap.add_argument("--rounds", type=int, default=5, help="blocks per cluster")
    ap.add_argument(
        "--scrape-interval", type=float, default=15.0, help="seconds (Prometheus's default: 15)"
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="metrics-bench-") as tmp:
        for sub in ("on", "off"):
            (Path(tmp) / sub).mkdir()
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
        scrape_ms: list[float] = []
        try:
            urls = metrics_urls(on)
            thread = threading.Thread(
                target=scraper, args=(urls, stop, scrape_ms, args.scrape_interval), daemon=True
            )
            rates: dict[str, list[float]] = {"on": [], "off": []}
            cpus: dict[str, list[float]] = {"on": [], "off": []}
            with Producer(on.namesrv) as p_on, Producer(off.namesrv) as p_off:
                for cluster in (on, off):
                    with Admin(cluster.namesrv) as admin:
                        wait_until(lambda: led(admin), 60, "a leader")
                        admin.create_topic(TOPIC, queues=8)
                block(p_on, on, 2_000)  # warm-up: routes, connections
                block(p_off, off, 2_000)
                thread.start()
                for i in range(args.rounds):
                    order = [("on", p_on, on), ("off", p_off, off)]
                    for mode, p, c in order if i % 2 == 0 else reversed(order):
                        rate, cpu = block(p, c, args.messages)
                        rates[mode].append(rate)
                        cpus[mode].append(cpu)
            stop.set()
            thread.join(5)
            texts = []
            for url in urls:
                with urllib.request.urlopen(url, timeout=5) as resp:
                    texts.append(resp.read().decode())
            exposition_bytes = len(texts[0])
            sent = requests = 0.0
            for text in texts:
                for family in text_string_to_metric_families(text):
                    for smp in family.samples:
                        if smp.name == "rocketmq_messages_in_total":
                            sent += smp.value
                        if (
                            smp.name == "rocketmq_rpc_latency_seconds_count"
                            and smp.labels.get("method") == "SEND_MESSAGE"
                        ):
                            requests += smp.value
        finally:
            stop.set()
            on.close()
            off.close()
    med_on, med_off = statistics.median(rates["on"]), statistics.median(rates["off"])
    cost_pct = 100 * (med_off - med_on) / med_off
    cpu_on, cpu_off = statistics.median(cpus["on"]), statistics.median(cpus["off"])
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
        "broker_cpu_us_per_msg_on": round(cpu_on, 1),
        "broker_cpu_us_per_msg_off": round(cpu_off, 1),
        "cpu_cost_pct": round(100 * (cpu_on - cpu_off) / cpu_off, 2),
        "load_avg_1m": os.getloadavg()[0],
        "scrape_interval_s": args.scrape_interval,
        "scrapes": len(scrape_ms),
        "scrape_ms_p50": round(statistics.median(scrape_ms), 2) if scrape_ms else None,
        "exposition_bytes": exposition_bytes,
        "messages_per_send_request": round(sent / requests, 1) if requests else None,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as f:
        f.write(json.dumps(line) + "\n")
    print(json.dumps(line))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
