"""The asyncio producer's client CPU per message, two code versions against one local cluster in
one run (issue 24): W1's shape (AsyncProducer.send_future, `--inflight` sends in flight, 1 KiB
bodies, one topic of 8 queues), each version in its own client process, alternating, so both
see the same cluster and the same machine load. A relative measure: ratios, not absolutes.

    .venv/bin/python bench/aio_send_bench.py --base /tmp/base-checkout [--messages 20000]

`--base` is another checkout of the project (e.g. `git archive <commit> | tar -x -C DIR`, with the
built extension copied in); the current checkout is "new". One JSON line per client run on
stdout and in bench/results/aio_send.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "aio_send.jsonl"
TOPIC = "aio-bench"
GROUP = "broker-a"

# Run in the client process (PYTHONPATH picks the version): the CPU of this process and its
# threads per acknowledged message, after a warm-up that opens the connections.
CLIENT = """
import asyncio, cProfile, json, os, pstats, resource, sys, threading, time
from raftmq.client.aio import AsyncProducer
from raftmq.common.types import QueueRef

namesrv, topic, n, inflight = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
by_queue, profile = sys.argv[5] == "1", sys.argv[6] == "1"
body = os.urandom(1024)
# peerbench's W1 names each send's queue (seq % 8, bench/peer_adapter.py); else sticky
queues = [QueueRef(topic, "broker-a", q) for q in range(8)] if by_queue else [None]

async def burst(p, count):
    sem = asyncio.Semaphore(inflight)
    done = asyncio.Event()
    left = [count]
    def one(f):
        sem.release()
        f.result()
        left[0] -= 1
        if not left[0]:
            done.set()
    for seq in range(count):
        await sem.acquire()
        p.send_future(topic, body, queue=queues[seq % len(queues)]).add_done_callback(one)
    await done.wait()

async def main():
    async with AsyncProducer(namesrv) as p:
        await burst(p, 2000)  # warm-up: routes, connections, the leader gate
        prof = cProfile.Profile() if profile else None
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        if prof is not None:
            prof.enable()
        await burst(p, n)
        if prof is not None:
            prof.disable()
        r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        if prof is not None:
            pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(30)
        threads = sorted({t.name for t in threading.enumerate()})
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    print(json.dumps({"cpu_us_per_msg": round(cpu / n * 1e6, 2),
                      "user_us_per_msg": round((r1.ru_utime - r0.ru_utime) / n * 1e6, 2),
                      "msgs_per_s": round(n / (t1 - t0)), "threads": threads}))

asyncio.run(main())
"""


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from raftmq.client.admin import Admin
    from tests.harness.procs import start_cluster, wait_until

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the other checkout to compare with")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--by-queue", action="store_true", help="name each send's queue (W1's)")
    parser.add_argument("--profile", action="store_true", help="cProfile each client (stderr)")
    args = parser.parse_args()
    versions = {"base": str(Path(args.base).resolve()), "new": str(ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        cluster = start_cluster(Path(tmp), (GROUP,), namesrvs=1)
        try:
            with Admin(cluster.namesrv) as admin:
                admin.create_topic(TOPIC, queues=8)
                wait_until(lambda: admin.route(TOPIC).write_queues(), 30, "the topic's route")
            RESULTS.parent.mkdir(parents=True, exist_ok=True)
            with RESULTS.open("a") as out:
                for rnd in range(args.rounds):
                    for name, path in versions.items():
                        env = {k: v for k, v in os.environ.items() if not k.startswith("RAFTMQ_")}
                        env["PYTHONPATH"] = path
                        run = subprocess.run(
                            [sys.executable, "-c", CLIENT, cluster.namesrv, TOPIC,
                             str(args.messages), str(args.inflight), str(int(args.by_queue)),
                             str(int(args.profile))],
                            env=env, cwd=path, capture_output=True, text=True, check=True,
                            timeout=600,
                        )  # fmt: skip
                        if args.profile:
                            print(f"--- {name} round {rnd}", run.stderr, sep="\n", file=sys.stderr)
                        rec = json.loads(run.stdout.strip().splitlines()[-1])
                        rec |= {
                            "bench": "aio_send",
                            "version": name,
                            "round": rnd,
                            "messages": args.messages,
                            "inflight": args.inflight,
                            "by_queue": args.by_queue,
                            "loadavg_1m": os.getloadavg()[0],
                            "ts": time.strftime("%Y-%m-%dT%H:%M:%S"),
                        }
                        print(json.dumps(rec), flush=True)
                        out.write(json.dumps(rec) + "\n")
        finally:
            cluster.close()


if __name__ == "__main__":
    main()
