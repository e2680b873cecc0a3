"""What the v2 stored batch costs per batch and per message (common/stored_batch.py, issue 14):
encode on the client, the leader's whole-batch check and stamp, read-back verification, the
per-batch reads of the dispatcher and pulls, and the client's lazy decoding. One JSON line per
result; appends to bench/results/batch.jsonl. Best of several runs, one process, no I/O.

Run: `.venv/bin/python bench/batch_bench.py [--repeats 30]`
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raftmq.common.message import Message
from raftmq.common.record_batch import ProduceBatch, ProducerSequence, decode, encode
from raftmq.common.stored_batch import (
    check_batch,
    encode_batch,
    iter_messages,
    read_header,
    slice_from,
    stamp,
    tag_hashes,
    verify_stamped,
)

RESULTS = Path(__file__).resolve().parent / "results" / "batch.jsonl"
TOPIC = "Orders"
HOST = "10.0.0.7:40112"


def best_us(fn: Callable[[], object], repeats: int, inner: int = 1) -> float:
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
        Message(
            TOPIC,
            os.urandom(body_bytes),
            "TagA",
            (f"order-{i}",),
            {"region": "eu"},
            0,
            1_700_000_000_000,
            HOST,
        )
        for i in range(n)
    ]


def run(n: int, body_bytes: int, shape: str, repeats: int) -> dict[str, Any]:
    msgs = make(n, body_bytes, shape)
    producer = ProducerSequence("producer-1", 0)
    inner = max(1, 2048 // n)
    raw = encode_batch(TOPIC, 3, msgs, producer, HOST)
    encode_us = best_us(lambda: encode_batch(TOPIC, 3, msgs, producer, HOST), repeats, inner)
    check_us = best_us(lambda: check_batch(raw), repeats, inner)
    buf = bytearray(raw)

    def restamp() -> None:
        buf[2] = 0  # back to "as produced" (the state byte), so stamp() accepts it again
        stamp(buf, 1000, 1)

    stamp_us = best_us(restamp, repeats, 2000)
    buf[2] = 0
    stamp(buf, 1000, 1_700_000_000_000)
    verify_us = best_us(lambda: verify_stamped(buf), repeats, inner)
    header = read_header(buf)
    header_us = best_us(lambda: read_header(buf), repeats, inner)
    slice_us = best_us(lambda: slice_from(buf, n // 2, header), repeats, 2000)
    hashes_us = best_us(lambda: tag_hashes(buf, header).tobytes(), repeats, 2000)
    stored = bytes(buf)
    objects_us = best_us(lambda: list(iter_messages(stored, verify=False)), repeats, inner)
    objects_verified_us = best_us(lambda: list(iter_messages(stored)), repeats, inner)
    bodies_us = best_us(lambda: [m.body for m in iter_messages(stored)], repeats, inner)
    full_us = best_us(lambda: [m.message() for m in iter_messages(stored)], repeats, inner)
    v1 = ProduceBatch(TOPIC, 3, 1, tuple(msgs), producer)
    v1_raw = encode(v1)
    v1_encode_us = best_us(lambda: encode(v1), repeats, inner)
    v1_decode_us = best_us(lambda: decode(v1_raw), repeats, inner)
    return {
        "bench": "stored_batch",
        "messages": n,
        "body_bytes": body_bytes,
        "shape": shape,
        "batch_bytes": len(raw),
        "encode_us_per_msg": round(encode_us / n, 3),
        "check_us_per_batch": round(check_us, 2),
        "check_us_per_msg": round(check_us / n, 3),
        "stamp_us": round(stamp_us, 3),
        "verify_stamped_us_per_batch": round(verify_us, 2),
        "read_header_us": round(header_us, 2),
        "slice_from_us": round(slice_us, 3),
        "tag_hashes_us": round(hashes_us, 3),
        "lazy_objects_us_per_msg": round(objects_us / n, 3),
        "lazy_objects_verified_us_per_msg": round(objects_verified_us / n, 3),
        "lazy_bodies_us_per_msg": round(bodies_us / n, 3),
        "full_message_us_per_msg": round(full_us / n, 3),
        "v1_encode_us_per_msg": round(v1_encode_us / n, 3),
        "v1_decode_us_per_msg": round(v1_decode_us / n, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    common = {
        "python": platform.python_version(),
        "cores": os.cpu_count(),
        "loadavg_1m": os.getloadavg()[0],
        "ts": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    cases = [(n, size, shape) for size in (1024, 100) for n in (1, 64, 512) for shape in
             ("plain", "tag+key+prop")]  # fmt: skip
    cases.append((1000, 1024, "tag+key+prop"))  # the pull of 1000 x 1 KiB
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as out:
        for n, size, shape in cases:
            rec = run(n, size, shape, args.repeats) | common
            print(json.dumps(rec), flush=True)
            out.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
