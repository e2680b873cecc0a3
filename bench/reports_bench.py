"""Resource reports against known traffic (issue 18 item 2): `--minutes` of sends at a rate that
changes every minute (cycling through `--rates`), consumed as they come by a PullConsumer, on a
real NameServer + three-node broker group; then `Admin.topic_stats` / `Admin.group_stats` per
minute against what the client counted per minute. Reports each minute's relative error and the
worst one (the acceptance asks for 1%). The client counts a send in the minute its answer came
back and a pull in the minute it returned: a batch that straddles a boundary can fall on either
side, which is the whole of the expected error. One JSON line to bench/results/reports.jsonl.

Run: `PYTHONPATH=$PWD .venv/bin/python bench/reports_bench.py [--minutes 10] [--rates 50,200,100]`
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
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from raftmq.client.admin import Admin  # noqa: E402
from raftmq.client.consumer_pull import PullConsumer  # noqa: E402
from raftmq.client.offsets import StartFrom  # noqa: E402
from raftmq.client.producer import Producer  # noqa: E402
from tests.harness.procs import start_cluster, wait_until  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "reports.jsonl"
TOPIC, GROUP = "reports-bench", "reports-bench-g"
BATCH = 10  # messages per send: a rate of R is R/10 sends a second


def minute_of(t: float) -> int:
    return int(t // 60) * 60_000


def errors(counted: Counter[int], reported: dict[int, int]) -> dict[int, float]:
    """Relative error per full minute the client counted (the first and last are partial)."""
    minutes = sorted(counted)[1:-1]
    return {m: abs(reported.get(m, 0) - counted[m]) / counted[m] for m in minutes if counted[m]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--rates", default="50,200,100", help="messages/s, one per minute, cycled")
    args = ap.parse_args()
    rates = [int(r) for r in args.rates.split(",")]
    sent: Counter[int] = Counter()
    consumed: Counter[int] = Counter()
    stop = threading.Event()
    with tempfile.TemporaryDirectory(prefix="reports-bench-") as tmp:
        c = start_cluster(Path(tmp), ("broker-a",), namesrvs=1)
        try:
            c.wait_leaders()
            with Admin(c.namesrv) as admin:
                admin.create_topic(TOPIC, queues=4)
                wait_until(lambda: admin.route(TOPIC), 30, "the route")

            def consume() -> None:
                with PullConsumer(c.namesrv, GROUP, start_from=StartFrom.EARLIEST) as pc:
                    pc.subscribe(TOPIC)
                    idle_since = time.monotonic()
                    while not (stop.is_set() and time.monotonic() - idle_since > 5):
                        got = pc.poll(timeout_ms=500)
                        if got:
                            consumed[minute_of(time.time())] += len(got)
                            idle_since = time.monotonic()

            reader = threading.Thread(target=consume, name="reports-consumer")
            reader.start()
            t0 = time.time()
            end = t0 + args.minutes * 60
            with Producer(c.namesrv) as producer:
                while (now := time.time()) < end:
                    rate = rates[int((now - t0) // 60) % len(rates)]
                    producer.send_batch(TOPIC, [b"x" * 100] * BATCH)
                    sent[minute_of(time.time())] += BATCH
                    time.sleep(max(0.0, BATCH / rate - (time.time() - now)))
            stop.set()
            reader.join(120)
            time.sleep(6)  # the brokers flush their counts every 5 s
            span = int((time.time() - t0) * 1000) + 120_000
            with Admin(c.namesrv) as admin:
                produced = admin.topic_stats(TOPIC, since_ms=span)
                pulled = admin.group_stats(GROUP, since_ms=span, topic=TOPIC)
        finally:
            c.close()
    [p] = produced.series
    [q] = pulled.series
    rep_p = dict(zip(produced.minute_starts(), p.counts, strict=True))
    rep_c = dict(zip(pulled.minute_starts(), q.counts, strict=True))
    err_p, err_c = errors(sent, rep_p), errors(consumed, rep_c)
    row = {
        "bench": "reports",
        "minutes": args.minutes,
        "rates": rates,
        "sent": sum(sent.values()),
        "reported_produced": sum(rep_p.values()),
        "consumed": sum(consumed.values()),
        "reported_consumed": sum(rep_c.values()),
        "full_minutes": len(err_p),
        "max_error_produced": round(max(err_p.values(), default=0.0), 5),
        "max_error_consumed": round(max(err_c.values(), default=0.0), 5),
        "per_minute": [
            [m, sent[m], rep_p.get(m, 0), consumed[m], rep_c.get(m, 0)]
            for m in sorted(set(sent) | set(consumed))
        ],
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps({k: v for k, v in row.items() if k != "per_minute"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
