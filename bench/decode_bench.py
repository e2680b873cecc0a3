"""Micro-benchmark of the Spark source's per-row work without Spark or a cluster: a pull answer
of 32 stored record batches of 64 messages (1 KiB bodies, a tag, a key, a property) turned into
one Arrow RecordBatch by spark_source.schema.to_record_batch. Prints one JSON line (the best of
`--repeat` conversions) and writes bench/results/decode.json.

Run: `.venv/bin/python bench/decode_bench.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from raftmq.common.filter.tag import MATCH_ALL  # noqa: E402
from raftmq.common.message import Message  # noqa: E402
from raftmq.common.pb import broker_pb2  # noqa: E402
from raftmq.common.record_batch import (  # noqa: E402
    ProduceBatch,
    ProducerSequence,
    decode_with_offsets,
    encode,
)
from raftmq.spark_source.schema import to_record_batch  # noqa: E402


def pull_answer(batches: int, per_batch: int, value_bytes: int) -> list[broker_pb2.RawBatch]:
    raws = []
    for i in range(batches):
        msgs = tuple(
            Message("t", bytes(value_bytes), "TagA", (f"k{i}-{j}",), {"a": "b"}, 0,
                    1_700_000_000_000, "10.0.0.1:5000")
            for j in range(per_batch)
        )  # fmt: skip
        data = encode(ProduceBatch("t", 0, 1_700_000_000_001, msgs, ProducerSequence("p", i)))
        _, offsets = decode_with_offsets(data)
        raws.append(
            broker_pb2.RawBatch(
                raft_index=100 + i,
                first_offset=i * per_batch,
                store_timestamp_ms=1_700_000_000_001,
                chunk=data,
                positions=list(range(per_batch)),
                byte_offsets=list(offsets),
            )
        )
    return raws


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--value-bytes", type=int, default=1024)
    args = ap.parse_args()
    raws = pull_answer(32, 64, args.value_bytes)
    best = float("inf")
    rows = 0
    for _ in range(args.repeat):
        t = time.perf_counter()
        rb = to_record_batch(raws, "t", "broker-a", 0, end_offset=1 << 62, tag_filter=MATCH_ALL)
        best = min(best, time.perf_counter() - t)
        rows = rb.num_rows
    result = {
        "bench": "decode",
        "case": "to_record_batch",
        "rows": rows,
        "value_bytes": args.value_bytes,
        "us_per_row": round(best / rows * 1e6, 2),
        "rows_per_s_one_core": int(rows / best),
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }
    line = json.dumps(result)
    print(line)
    out = ROOT / "bench" / "results" / "decode.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(line + "\n")


if __name__ == "__main__":
    main()
