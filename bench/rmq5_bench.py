"""The RocketMQ 5 API's cost: the official Python client (rocketmq-python-client) through the
proxy against raftmq's SDK directly, in one run on one cluster (one NameServer, broker-a of three
nodes, one proxy). Send rate: N messages of 1 KiB (official client: send_async, 64 in flight; SDK:
send_async then flush). Receive rate: the official SimpleConsumer receiving batches of 32 and
acking each message, against the SDK's PullConsumer polling. One JSON line; also appended to
bench/results/rmq5.json.

Run: `.venv/bin/python bench/rmq5_bench.py [--count 5000]`
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from raftmq.client.admin import Admin  # noqa: E402
from raftmq.client.consumer_pull import PullConsumer  # noqa: E402
from raftmq.client.offsets import StartFrom  # noqa: E402
from raftmq.client.producer import Producer  # noqa: E402
from raftmq.ops.cluster_runner import ClusterRunner  # noqa: E402
from raftmq.ops.cluster_spec import local_description, parse  # noqa: E402
from tests.harness.local_cluster import free_ports  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "rmq5.json"
DRIVER = ROOT / "tests" / "proxy" / "official_client.py"
BODY = b"x" * 1024


def sdk_rates(namesrv: str, topic: str, count: int) -> dict[str, float]:
    with Producer(namesrv) as p:
        t0 = time.perf_counter()
        for _ in range(count):
            p.send_async(topic, BODY)
        p.flush()
        send_s = time.perf_counter() - t0
    got = 0
    with PullConsumer(namesrv, "bench-sdk", start_from=StartFrom.EARLIEST) as c:
        c.subscribe(topic)
        t0 = time.perf_counter()
        deadline = time.monotonic() + 120
        while got < count and time.monotonic() < deadline:
            got += len(c.poll(timeout_ms=1000))
        receive_s = time.perf_counter() - t0
    return {"send_per_s": count / send_s, "receive_per_s": got / receive_s}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=5000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rmq5-bench-") as tmp:
        ports = free_ports(1 + 6 + 1)
        spec = parse(local_description(ports, Path(tmp), namesrvs=1, controllers=0, proxies=1))
        runner = ClusterRunner(spec, start_timeout_s=60)
        runner.start_all()
        try:
            with Admin(spec.namesrv_addresses) as admin:
                admin.create_topic("rmq5", queues=8)
                admin.create_topic("sdk", queues=8)
            time.sleep(3)  # registered with the NameServer
            endpoint = str(spec.proxies[0])
            out = subprocess.run(
                [
                    sys.executable,
                    str(DRIVER),
                    "bench",
                    endpoint,
                    json.dumps({"topic": "rmq5", "group": "bench-rmq5", "count": args.count}),
                ],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=900,
                check=True,
            )
            line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
            official = json.loads(line.removeprefix("RESULT "))
            sdk = sdk_rates(spec.namesrv_addresses, "sdk", args.count)
        finally:
            runner.stop_all()
    result = {
        "bench": "rmq5",
        "count": args.count,
        "body_bytes": len(BODY),
        "official_send_per_s": round(official["sent"] / official["send_s"]),
        "official_receive_ack_per_s": round(official["received"] / official["receive_s"]),
        "official_received": official["received"],
        "sdk_send_per_s": round(sdk["send_per_s"]),
        "sdk_receive_per_s": round(sdk["receive_per_s"]),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(json.dumps(result))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with open(RESULTS, "a") as f:
        f.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
