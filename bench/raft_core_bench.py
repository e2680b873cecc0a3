"""The Raft core's own CPU per entry, in one process: three RaftCores (raftlog/raft_core.py) on a
perfect in-process network, every message through the wire codec (raftlog/raft_codec.py: encode,
join, decode) as the node shell sends it, the leader proposing `--per-round` entries of `--size`
bytes a round and every node draining its Readies (persist is a no-op: the journal's cost is
raftlog_bench's). What it isolates is the per-entry Python of the pure core and the codec, which
issue 29's bar 2 (<= 250 us of CPU per 64 KiB entry over the three nodes) must fit beside the
journal and the sockets. CPU time, so two checkouts compare on a shared machine (PYTHONPATH
selects the code):

    PYTHONPATH=$PWD .venv/bin/python bench/raft_core_bench.py [--size 65536] [--profile]

Prints one JSON line per size (best and median of `--rounds` runs, us of CPU per entry, all
three nodes together).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import time
from collections import deque

from raftmq.raftlog import raft_codec
from raftmq.raftlog.raft_core import RaftConfig, RaftCore, Role
from raftmq.raftlog.raft_messages import Message

NODES = ("n0", "n1", "n2")


class Group:
    """Three cores and a FIFO network; `settle` delivers and drains until nothing moves."""

    def __init__(self) -> None:
        cfg = RaftConfig()
        self.cores = {
            n: RaftCore(n, NODES, cfg, seed=i, apply_payloads=False) for i, n in enumerate(NODES)
        }
        self.wire: deque[tuple[str, str, bytes]] = deque()
        self.committed = 0
        for _ in range(10_000):
            for c in self.cores.values():
                c.tick()
            self.settle()
            if self.leader() is not None:
                return
        raise RuntimeError("no leader elected")

    def leader(self) -> RaftCore | None:
        return next((c for c in self.cores.values() if c.role is Role.LEADER), None)

    def _send(self, sender: str, msgs: tuple[Message, ...]) -> None:
        for m in msgs:
            self.wire.append((sender, m.to, b"".join(raft_codec.encode(m))))

    def settle(self) -> None:
        moved = True
        while moved:
            moved = False
            for n, c in self.cores.items():
                while c.has_ready():
                    rd = c.ready()
                    self._send(n, rd.leader_messages)
                    self._send(n, rd.messages)
                    if c.role is Role.LEADER:
                        self.committed += len(rd.committed)
                    c.advance(rd)
                    moved = True
            while self.wire:
                sender, to, body = self.wire.popleft()
                self.cores[to].step(raft_codec.decode(body, sender, to))
                moved = True


def run(size: int, entries: int, per_round: int) -> float:
    """us of CPU per committed entry, all three cores and the codec together."""
    g = Group()
    lead = g.leader()
    assert lead is not None
    data = b"x" * size
    batch = [data] * per_round
    start_committed = g.committed
    t0 = time.process_time()
    for _ in range(entries // per_round):
        lead.propose(batch)
        g.settle()
    spent = time.process_time() - t0
    done = g.committed - start_committed
    assert done >= entries // per_round * per_round, (done, entries)
    return spent / done * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size", type=int, action="append", help="entry bytes (repeatable)")
    ap.add_argument("--entries", type=int, default=4000)
    ap.add_argument("--per-round", type=int, default=1, help="entries proposed at once")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--profile", action="store_true", help="cProfile one run, top 25")
    args = ap.parse_args()
    for size in args.size or [1024, 65536]:
        if args.profile:
            prof = cProfile.Profile()
            prof.runcall(run, size, args.entries, args.per_round)
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        us = [run(size, args.entries, args.per_round) for _ in range(args.rounds)]
        print(
            json.dumps(
                {
                    "bench": "raft_core",
                    "entry_bytes": size,
                    "per_round": args.per_round,
                    "us_per_entry_best": round(min(us), 2),
                    "us_per_entry_median": round(statistics.median(us), 2),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
