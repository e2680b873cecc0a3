"""One journal's reads by position in its record cache: `read_range` of one record at the tail,
the middle and near the head of a full cache, and `get` of the last records. The dispatcher reads
at the tail every round, a follower catching up and a pull at the queue's end too, so a read must
cost what it returns, not the cache's length (a deque walked from its left end did: ~185 us per
tail read with the default 32 MiB of 1 KiB records).

    PYTHONPATH=$PWD .venv/bin/python bench/journal_read_bench.py [--records 25000 --size 1024]

One JSON line per position on stdout, appended to bench/results/journal_read.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from raftmq.raftlog.journal.segment_journal import SegmentJournal

RESULTS = Path(__file__).resolve().parent / "results" / "journal_read.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=25_000, help="records appended (1 KiB each)")
    ap.add_argument("--size", type=int, default=1024, help="bytes per record")
    ap.add_argument("--reads", type=int, default=500, help="reads per position")
    args = ap.parse_args()
    n, command = args.records, b"x" * args.size
    rows = []
    with tempfile.TemporaryDirectory(prefix="journal-read-") as tmp:
        journal = SegmentJournal(Path(tmp))  # the default cache: 32 MiB
        try:
            for i in range(1, n + 1):
                journal.append(i, 1, command)
            for where, start in (("tail", n), ("middle", n // 2), ("head", 1)):
                t0 = time.perf_counter()
                for _ in range(args.reads):
                    journal.read_range(start, max_bytes=1 << 20, max_count=1)
                us = (time.perf_counter() - t0) / args.reads * 1e6
                rows.append({"op": "read_range", "at": where, "us": round(us, 2)})
            for where, index in (("last", n), ("last-1", n - 1)):
                t0 = time.perf_counter()
                for _ in range(args.reads):
                    journal.get(index)
                us = (time.perf_counter() - t0) / args.reads * 1e6
                rows.append({"op": "get", "at": where, "us": round(us, 2)})
        finally:
            journal.close()
    RESULTS.parent.mkdir(exist_ok=True)
    with RESULTS.open("a") as out:
        for row in rows:
            row.update(
                bench="journal_read",
                records=n,
                size=args.size,
                loadavg_1m=os.getloadavg()[0],
                at_time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            )
            line = json.dumps(row)
            out.write(line + "\n")
            print(line)


if __name__ == "__main__":
    main()
