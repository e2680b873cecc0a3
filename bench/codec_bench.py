"""The stored batch codec, compiled against its pure-Python twin (common/stored_batch.py, issue
24): per message, encode on the client, the leader's check + stamp, a replica's verify, and the
client's decode (message objects, then bodies read). W1's shape (8 x 1 KiB per queue batch) and
the batch call's (512 x 1 KiB, 512 x 100 B), in each stored batch version asked for (v3's
compact record heads against v2's, issue 24 bar 4); the bare bodies' encoder (encode_bodies,
the batch call's) for the plain shapes. One JSON line per result, appended to
bench/results/codec.jsonl; best of several runs in one process, no I/O: compare the two
implementations and the versions within one run (ratios), not figures across runs.

Run: `.venv/bin/python bench/codec_bench.py [--repeats 20] [--versions 2,3]`
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from raftmq.common.message import Message
from raftmq.common.record_batch import ProducerSequence
from raftmq.common.stored_batch import implementations

RESULTS = Path(__file__).resolve().parent / "results" / "codec.jsonl"
TOPIC = "Orders"
HOST = "10.0.0.7:40112"
SHAPES = [  # (messages per batch, body bytes, what the messages carry)
    (8, 1024, "plain"),  # W1: 64 in flight over 8 queues
    (512, 1024, "plain"),  # the batch call
    (512, 100, "plain"),
    (512, 1024, "tag+key+prop"),
]


def best_us(fn: Callable[[], object], repeats: int, inner: int) -> float:
    """The best wall time of `inner` calls, over `repeats` runs, per call, in microseconds."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - t0) / inner)
    return best * 1e6


def make(n: int, body_bytes: int, shape: str) -> list[Message]:
    if shape == "plain":
        return [Message(TOPIC, os.urandom(body_bytes), born_timestamp_ms=1) for _ in range(n)]
    return [
        Message(TOPIC, os.urandom(body_bytes), "TagA", (f"order-{i}",), {"region": "eu"}, 0, 1)
        for i in range(n)
    ]


def run(
    sb: ModuleType, n: int, body_bytes: int, shape: str, repeats: int, version: int
) -> dict[str, Any]:
    msgs = make(n, body_bytes, shape)
    producer = ProducerSequence("producer-1", 0)
    inner = max(1, 4096 // n)
    raw = sb.encode_batch(TOPIC, 3, msgs, producer, HOST, version)
    encode_us = best_us(
        lambda: sb.encode_batch(TOPIC, 3, msgs, producer, HOST, version), repeats, inner
    )
    bodies_rec: dict[str, Any] = {}
    if shape == "plain":
        runs = [(1, [m.body for m in msgs])]
        bodies_us = best_us(
            lambda: sb.encode_bodies(TOPIC, 3, runs, producer, HOST, version), repeats, inner
        )
        bodies_rec = {"encode_bodies_us_per_msg": round(bodies_us / n, 4)}
    buf = bytearray(raw)

    def check_and_stamp() -> None:
        buf[2] = 0  # back to "as produced" (the state byte and stamp slots), then the leader's work
        buf[8:32] = raw[8:32]
        sb.check_batch(buf)
        sb.stamp(buf, 1000, 1_700_000_000_000)

    check_stamp_us = best_us(check_and_stamp, repeats, inner)
    stored = bytes(buf)
    verify_us = best_us(lambda: sb.verify_stamped(stored), repeats, inner)
    objects_us = best_us(lambda: list(sb.iter_messages(stored)), repeats, inner)
    bodies_us = best_us(lambda: [m.body for m in sb.iter_messages(stored)], repeats, inner)
    return {
        "bench": "codec",
        "implementation": sb.__name__.rsplit("_", 1)[-1],
        "version": version,
        "messages": n,
        "body_bytes": body_bytes,
        "shape": shape,
        "batch_bytes": len(raw),
        "encode_us_per_msg": round(encode_us / n, 4),
        **bodies_rec,
        "check_stamp_us_per_msg": round(check_stamp_us / n, 4),
        "verify_stamped_us_per_msg": round(verify_us / n, 4),
        "decode_objects_us_per_msg": round(objects_us / n, 4),
        "decode_bodies_us_per_msg": round(bodies_us / n, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--versions", default="2,3", help="stored batch versions, in turn")
    args = parser.parse_args()
    versions = [int(v) for v in args.versions.split(",")]
    common = {
        "python": platform.python_version(),
        "cores": os.cpu_count(),
        "loadavg_1m": os.getloadavg()[0],
        "ts": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    found = implementations()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as out:
        for (n, size, shape), version in ((s, v) for s in SHAPES for v in versions):
            recs = {
                name: run(sb, n, size, shape, args.repeats, version) for name, sb in found.items()
            }
            if "c" in recs:  # the twin's time over C's, per operation
                py, c = recs["python"], recs["c"]
                recs["c"]["speedup_vs_python"] = {
                    k.removesuffix("_us_per_msg"): round(py[k] / c[k], 1)
                    for k in py
                    if k.endswith("_us_per_msg") and c[k] > 0
                }
            for rec in recs.values():
                line = json.dumps(rec | common)
                print(line, flush=True)
                out.write(line + "\n")


if __name__ == "__main__":
    main()
