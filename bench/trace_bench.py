"""Trace overhead on a sender (issue 16 item 4: tracing on costs a sender no more than 10% of its
rate). A real three-node broker group on this machine; two Producers, one with trace=True (its
records go to RMQ_SYS_TRACE_TOPIC on the same group), one without, taking turns in blocks so a
change in the machine's load hits both. Two senders: `sync` (one send() at a time: the rate is
1 / latency) and `async` (send_async with up to --window sends in flight). Per mode and sender:
the rate, and this process's CPU per message (the trace thread's work included). One JSON line per
sender; appends to bench/results/trace.jsonl. `rate_cost_median_pair_pct` compares each traced
block with the untraced block next to it, and is the figure to read on a shared machine.

Run: `PYTHONPATH=$PWD .venv/bin/python bench/trace_bench.py [--messages 4000] [--block 500]`
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from raftmq.client.admin import Admin
from raftmq.client.messages import SendResult
from raftmq.client.producer import Producer
from tests.harness.procs import start_cluster, wait_until

RESULTS = Path(__file__).resolve().parent / "results" / "trace.jsonl"
GROUP = "broker-a"
TOPIC = "bench-trace"
BODY = b"x" * 256


def _sync_block(p: Producer, n: int) -> None:
    for i in range(n):
        p.send(TOPIC, BODY, keys=(f"k{i}",))


def _async_block(p: Producer, n: int, window: int) -> None:
    inflight: list[Future[SendResult]] = []
    for i in range(n):
        inflight.append(p.send_async(TOPIC, BODY, keys=(f"k{i}",)))
        if len(inflight) >= window:
            inflight.pop(0).result(timeout=60)
    for f in inflight:
        f.result(timeout=60)


def _measure(
    producers: dict[str, Producer], block: Callable[[Producer, int], None], total: int, size: int
) -> dict[str, tuple[float, float, list[float]]]:
    """name -> (messages per second, client CPU us per message, rate of each block), over
    alternating blocks (the order within a round alternates too)."""
    wall = dict.fromkeys(producers, 0.0)
    cpu = dict.fromkeys(producers, 0.0)
    done = dict.fromkeys(producers, 0)
    rates: dict[str, list[float]] = {n: [] for n in producers}
    names = list(producers)
    while min(done.values()) < total:
        for name in names:
            p = producers[name]
            c0, t0 = time.process_time(), time.perf_counter()
            block(p, size)
            p.flush(30)
            took = time.perf_counter() - t0
            wall[name] += took
            cpu[name] += time.process_time() - c0
            done[name] += size
            rates[name].append(size / took)
        names.reverse()
    return {n: (done[n] / wall[n], cpu[n] / done[n] * 1e6, rates[n]) for n in producers}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=4000, help="messages per sender and mode")
    ap.add_argument("--block", type=int, default=500, help="messages per turn")
    ap.add_argument("--window", type=int, default=64, help="async sends in flight")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="trace-bench-") as tmp:
        cluster = start_cluster(Path(tmp), groups=(GROUP,), namesrvs=1)
        try:
            with Admin(cluster.namesrv) as admin:
                wait_until(lambda: any(g.leader_address for g in admin.groups()), 60, "a leader")
                admin.create_topic(TOPIC, queues=4)
            off = Producer(cluster.namesrv)
            on = Producer(cluster.namesrv, trace=True)
            try:
                _sync_block(off, 200)  # warm both: routes, channels, the trace topic
                _sync_block(on, 200)
                on.flush(10)
                modes: dict[str, Callable[[Producer, int], None]] = {
                    "sync": _sync_block,
                    "async": lambda p, n: _async_block(p, n, args.window),
                }
                for mode, fn in modes.items():
                    got = _measure({"off": off, "on": on}, fn, args.messages, args.block)
                    rate_off, cpu_off, blocks_off = got["off"]
                    rate_on, cpu_on, blocks_on = got["on"]
                    # Each "on" block against the "off" block next to it: robust to the load
                    # of a shared machine moving between blocks.
                    pairs = sorted(
                        1 - on / off for on, off in zip(blocks_on, blocks_off, strict=True)
                    )
                    tracer = on._tracer
                    line = {
                        "bench": "trace_overhead",
                        "sender": mode,
                        "messages": args.messages,
                        "body_bytes": len(BODY),
                        "window": args.window if mode == "async" else 1,
                        "rate_off_msg_s": round(rate_off),
                        "rate_on_msg_s": round(rate_on),
                        "rate_cost_pct": round(100 * (1 - rate_on / rate_off), 1),
                        "rate_cost_median_pair_pct": round(100 * pairs[len(pairs) // 2], 1),
                        "client_cpu_us_off": round(cpu_off, 1),
                        "client_cpu_us_on": round(cpu_on, 1),
                        "trace_dropped": tracer.dropped if tracer is not None else 0,
                        "host": platform.node(),
                        "cpus": os.cpu_count(),
                        "load_avg_1m": round(os.getloadavg()[0], 1),
                        "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    }
                    print(json.dumps(line))
                    with RESULTS.open("a") as f:
                        f.write(json.dumps(line) + "\n")
            finally:
                off.close()
                on.close()
        finally:
            cluster.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
