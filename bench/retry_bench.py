"""Retry throughput: messages per second through the send-back path, on a real three-node broker
group (all on this machine). A producer sends 1 KiB messages at a steady `--rate` for `--seconds`;
a PushConsumer's listener returns RECONSUME_LATER for the first `--failures` deliveries of every
message and SUCCESS after, so each message goes to the broker `--failures` times as a send-back
(stored in %RETRY%<group> with its back-off, then delivered again when due). Back-off levels are
scaled down (`--levels`; retry n waits level 3 + n) so the figure is the path's throughput, not
the back-off's.

Measured: send-backs per second (failed deliveries over the window they span), messages that
completed through retries per second, the time from a message's last failure to its successful
redelivery (p50/p99; the back-off is included and reported), the brokers' CPU per message (all
three nodes; a message costs a send, `--failures` send-backs, as many schedule entries and
`--failures` + 1 deliveries), and
lost (sent, never consumed successfully within the drain). One JSON line; appends to
bench/results/retry.jsonl.

Run: `PYTHONPATH=$PWD .venv/bin/python bench/retry_bench.py [--rate 200] [--seconds 20]
[--failures 1]`
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import threading
import time
from pathlib import Path

from raftmq.client.admin import Admin
from raftmq.client.consumer_push import ConsumeResult, PushConsumer
from raftmq.client.messages import ReceivedMessage
from raftmq.client.offsets import StartFrom
from raftmq.client.producer import Producer
from raftmq.common.delay import DelayPolicy
from raftmq.common.retry import RetryPolicy
from tests.harness.procs import Proc, start_cluster, wait_until

RESULTS = Path(__file__).resolve().parent / "results" / "retry.jsonl"
GROUP = "broker-a"
TOPIC = "bench-retry"
CONSUMER_GROUP = "bench-retry-consumer"
LEVELS = "10ms 20ms 50ms 100ms 150ms 200ms 300ms 400ms 500ms 1s 2s 3s 4s 5s 6s 7s 8s 9s"
PAD = 1024


def _pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))] if s else 0.0


def _cpu_s(procs: list[Proc]) -> float:
    """utime + stime of the broker processes (all three: the leader and its followers)."""
    total = 0.0
    for proc in procs:
        assert proc.popen is not None
        fields = Path(f"/proc/{proc.popen.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


class Tally:
    """What the listener saw, per message id (the id is the body's first 16 bytes)."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.lock = threading.Lock()
        self.fail_times: list[float] = []
        self.last_fail: dict[str, float] = {}
        self.done: dict[str, float] = {}
        self.retry_latency: list[float] = []
        self.bad_count = 0  # a redelivery whose reconsume count is not one more than before

    def listener(self, m: ReceivedMessage) -> ConsumeResult:
        now = time.monotonic()
        msg_id = m.body[:16].decode()
        with self.lock:
            if m.reconsume_times < self.failures:
                self.fail_times.append(now)
                self.last_fail[msg_id] = now
                return ConsumeResult.RECONSUME_LATER
            if msg_id not in self.done:
                self.done[msg_id] = now
                if msg_id in self.last_fail:
                    self.retry_latency.append(now - self.last_fail[msg_id])
                else:
                    self.bad_count += 1  # came back at the final count without failing first
            return ConsumeResult.SUCCESS


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rate", type=float, default=200.0, help="messages sent per second")
    ap.add_argument("--seconds", type=float, default=20.0, help="of sending")
    ap.add_argument("--failures", type=int, default=1, help="failed deliveries per message")
    ap.add_argument("--levels", default=LEVELS, help="the brokers' delay levels")
    ap.add_argument("--drain-s", type=float, default=60.0, help="wait this long for the rest")
    args = ap.parse_args()
    if args.rate <= 0 or args.seconds <= 0 or args.failures < 1:
        ap.error("--rate and --seconds must be > 0, --failures >= 1")
    policy = RetryPolicy(delay=DelayPolicy.from_text(args.levels))
    backoff_ms = [policy.delay.level_delay_ms(policy.delay_level(n)) for n in range(args.failures)]
    tally = Tally(args.failures)
    sent: list[str] = []
    with tempfile.TemporaryDirectory(prefix="retry-bench-") as tmp:
        cluster = start_cluster(
            Path(tmp), groups=(GROUP,), namesrvs=1, broker_args=["--delay-levels", args.levels]
        )
        try:
            with Admin(cluster.namesrv) as admin:
                wait_until(lambda: any(g.leader_address for g in admin.groups()), 60, "a leader")
                admin.create_topic(TOPIC, queues=4)
                wait_until(lambda: admin.route(TOPIC).write_queues(), 30, "the route")
            procs = cluster.groups[GROUP][1]
            with (
                Producer(cluster.namesrv) as producer,
                PushConsumer(
                    cluster.namesrv,
                    CONSUMER_GROUP,
                    TOPIC,
                    tally.listener,
                    start_from=StartFrom.EARLIEST,
                    rebalance_interval_ms=2_000,
                    heartbeat_interval_ms=1_000,
                ),
            ):
                producer.send(TOPIC, b"warm-up".ljust(16, b"-"))  # routes and channels
                wait_until(lambda: len(tally.done) == 1, 60, "the warm-up message's retries")
                cpu0 = _cpu_s(procs)
                period = 1.0 / args.rate
                t0 = time.monotonic()
                next_at = t0
                futures = []
                i = 0
                while time.monotonic() - t0 < args.seconds:
                    msg_id = f"{i:016d}"
                    i += 1
                    futures.append(producer.send_async(TOPIC, msg_id.encode().ljust(PAD, b".")))
                    sent.append(msg_id)
                    next_at += period
                    time.sleep(max(0.0, next_at - time.monotonic()))
                for fut in futures:
                    fut.result(timeout=30)
                deadline = time.monotonic() + args.drain_s
                while time.monotonic() < deadline:
                    with tally.lock:
                        if all(m in tally.done for m in sent):
                            break
                    time.sleep(0.2)
                cpu = _cpu_s(procs) - cpu0
        finally:
            cluster.close()
    with tally.lock:
        fails = [t for t in tally.fail_times if t >= t0]
        done_times = sorted(tally.done[m] for m in sent if m in tally.done)
        lost = sum(1 for m in sent if m not in tally.done)
        lat = tally.retry_latency[1:]  # without the warm-up message
    fail_span = (max(fails) - min(fails)) if len(fails) > 1 else 0.0
    done_span = (done_times[-1] - done_times[0]) if len(done_times) > 1 else 0.0
    line = {
        "bench": "retry",
        "offered_rate_per_s": args.rate,
        "seconds": args.seconds,
        "failures_per_message": args.failures,
        "messages": len(sent),
        "send_backs": len(fails),
        "send_backs_per_s": round(len(fails) / fail_span, 1) if fail_span else None,
        "completed_through_retry_per_s": round(len(done_times) / done_span, 1)
        if done_span
        else None,
        "last_fail_to_success_p50_ms": round(_pct(lat, 50) * 1000, 1),
        "last_fail_to_success_p99_ms": round(_pct(lat, 99) * 1000, 1),
        "backoff_ms": backoff_ms,
        "lost": lost,
        "bad_reconsume_count": tally.bad_count,
        "brokers_cpu_us_per_message": round(cpu / len(sent) * 1e6, 1) if sent else None,
        "body_bytes": PAD,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.machine()} {platform.node()} cpus=2",
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as out:
        out.write(json.dumps(line) + "\n")
    print(json.dumps(line))
    return 0 if lost == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
