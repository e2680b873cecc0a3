"""Where a synchronous send's wall time goes, hop by hop (W2's shape: one sender, 1 KiB, one message
in flight), on one local group of three native-Raft nodes started as bench/w2_probe.py starts it.

Every process runs with RAFTMQ_TIMELINE set (common/timeline.py): the SDK, the leader's data loop,
its Raft loop and dispatcher and the followers' Raft loops stamp each hop with time.monotonic_ns(),
one clock for every process of the machine, into a bounded ring dumped when the process exits. For
each send the stamps between its call and its caller's resumption are matched (the Raft ones by the
entry's index), and each segment's median, p90 and p99 over the sends is printed as a table, with
one JSON line appended to bench/results/w2_timeline.jsonl.

    PYTHONPATH=$PWD .venv/bin/python bench/w2_timeline.py [--sends 1000] [--face sync|aio]
        [-- BROKER_ARGS...]

`--face sync` is w2_probe's threaded `Producer.send`; `--face aio` is peerbench W2's
`AsyncProducer.send` on the caller's loop (no SDK thread between the caller and the socket).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from raftmq.common import timeline

RESULTS = Path(__file__).resolve().parent / "results" / "w2_timeline.jsonl"
BODY = b"x" * 1024
WARMUP_SENDS = 300  # routes, connections, the leader gate of its term


class Points:
    """One process's stamps by point: each point's (ns, value) pairs in time order."""

    def __init__(self, stamps: Sequence[Sequence[Any]]) -> None:
        by: dict[str, tuple[list[int], list[int]]] = {}
        for ns, point, value in sorted(stamps):
            times, values = by.setdefault(point, ([], []))
            times.append(ns)
            values.append(value)
        self._by = by

    def has(self, point: str) -> bool:
        return point in self._by

    def first(
        self, point: str, after: int, before: int, value: Callable[[int], bool] | None = None
    ) -> tuple[int, int] | None:
        """The first (ns, value) of `point` in [after, before] whose value passes, else None."""
        found = self._by.get(point)
        if found is None:
            return None
        times, values = found
        k = bisect.bisect_left(times, after)
        while k < len(times) and times[k] <= before:
            if value is None or value(values[k]):
                return times[k], values[k]
            k += 1
        return None

    def last(self, point: str, after: int, before: int) -> int | None:
        """The last ns of `point` in [after, before], else None."""
        found = self._by.get(point)
        if found is None:
            return None
        times = found[0]
        k = bisect.bisect_right(times, before) - 1
        return times[k] if k >= 0 and times[k] >= after else None


@dataclass(frozen=True, slots=True)
class Hop:
    name: str  # "where: what"
    start: str  # the moment it starts from (a key of the send's moments)
    end: str


# The chain of one send, in order; each hop is the segment between two moments. The leader's own
# journal write runs beside the followers' hops (its appends leave first), so it is listed apart.
CHAIN = (
    Hop("client: call to the post to its loop (sync face)", "call", "sdk.post"),
    Hop("client: loop woken, batch sealed", "sdk.post", "sdk.flush"),
    Hop("client: encode and frame to the write", "sdk.flush", "client.write"),
    Hop("wire + leader data loop's read", "client.write", "server.read"),
    Hop("leader data loop: parse, check, prepare, submit", "server.read", "node.submit"),
    Hop("hand-off: data loop -> Raft loop", "node.submit", "raft.inbox"),
    Hop("leader Raft loop: a turn, offsets, propose", "raft.inbox", "raft.propose"),
    Hop("leader Raft loop: Ready, appends written", "raft.propose", "raft.appends_out"),
    Hop("wire + follower's read (first ack)", "raft.appends_out", "f.append_in"),
    Hop("follower: step, Ready, journal write", "f.append_in", "f.journal"),
    Hop("follower: ack written", "f.journal", "f.ack_out"),
    Hop("wire + leader's read of the ack", "f.ack_out", "raft.ack_in"),
    Hop("leader Raft loop: ack to commit advance", "raft.ack_in", "raft.commit"),
    Hop("hand-off: Raft loop -> data loop", "raft.commit", "waker.drain"),
    Hop("leader data loop: request resumed", "waker.drain", "node.resumed"),
    Hop("leader data loop: answer written", "node.resumed", "server.write"),
    Hop("wire + client's read of the answer", "server.write", "client.read"),
    Hop("client: answer to the caller resumed", "client.read", "resume"),
)
ASIDE = (
    Hop("leader: appends out to its own journal write", "raft.appends_out", "raft.journal"),
    Hop("second follower: appends out to its ack", "raft.appends_out", "f2.ack_out"),
    Hop("leader: commit to its dispatch round's start", "raft.commit", "dispatch.start"),
    Hop("leader: dispatch round (start to end)", "dispatch.start", "dispatch.end"),
)
TOTAL = Hop("the send, call to resume", "call", "resume")


def moments(
    client: Points, leader: Points, followers: Sequence[Points], call: int, resume: int
) -> dict[str, int]:
    """The moments of the send made between `call` and `resume` (ns), by CHAIN's keys; a moment
    not found (a stamp the ring lost, the other face's point) is left out."""
    at: dict[str, int] = {"call": call, "resume": resume}

    def put(key: str, found: tuple[int, int] | int | None) -> int | None:
        if found is None:
            return None
        ns = found[0] if isinstance(found, tuple) else found
        at[key] = ns
        return ns

    t = call
    for point in ("sdk.post", "sdk.flush", "client.write"):
        t = put(point, client.first(point, t, resume)) or t
    put("client.read", client.last("client.read", call, resume))
    t = put("server.read", leader.first("server.read", at.get("client.write", call), resume)) or t
    t = put("node.submit", leader.first("node.submit", t, resume)) or t
    t = put("raft.inbox", leader.first("raft.inbox", t, resume)) or t
    proposed = leader.first("raft.propose", t, resume)
    if proposed is None:
        return at
    put("raft.propose", proposed)
    index = proposed[1]

    def holds(v: int) -> bool:
        return v >= index

    out = put("raft.appends_out", leader.first("raft.appends_out", proposed[0], resume, holds))
    put("raft.journal", leader.first("raft.journal", proposed[0], resume, holds))
    put("raft.ack_in", leader.first("raft.ack_in", proposed[0], resume, holds))
    commit = put("raft.commit", leader.first("raft.commit", proposed[0], resume, holds))
    if commit is not None:
        t = put("waker.drain", leader.first("waker.drain", commit, resume)) or commit
        t = put("node.resumed", leader.first("node.resumed", t, resume)) or t
        put("server.write", leader.first("server.write", t, resume))
        start = leader.first("dispatch.start", commit, resume + 50_000_000, holds)
        if start is not None:
            put("dispatch.start", start)
            put("dispatch.end", leader.first("dispatch.end", start[0], start[0] + 10**9, holds))
    # The followers, the one whose ack left first as the chain's (its ack committed the entry).
    seen = []
    for f in followers:
        since = out or proposed[0]
        got = f.first("raft.append_in", since, resume + 50_000_000, holds)
        if got is None:
            continue
        journal = f.first("raft.journal", got[0], resume + 50_000_000, holds)
        ack = f.first("raft.ack_out", got[0], resume + 50_000_000, holds)
        if ack is not None:
            seen.append((ack[0], got[0], journal[0] if journal else None))
    seen.sort()
    if seen:
        ack_ns, in_ns, journal_ns = seen[0]
        at["f.append_in"], at["f.ack_out"] = in_ns, ack_ns
        if journal_ns is not None:
            at["f.journal"] = journal_ns
    if len(seen) > 1:
        at["f2.ack_out"] = seen[1][0]
    return at


def summarize(sends: Sequence[dict[str, int]]) -> list[dict[str, Any]]:
    """Per hop of CHAIN, ASIDE and TOTAL: its median, p90 and p99 in us over the sends that
    have both of its moments, and how many do."""
    rows = []
    for group, hops in (("chain", CHAIN), ("aside", ASIDE), ("total", (TOTAL,))):
        for hop in hops:
            us = sorted(
                (s[hop.end] - s[hop.start]) / 1000 for s in sends if hop.start in s and hop.end in s
            )
            if not us:
                continue
            rows.append(
                {
                    "group": group,
                    "hop": hop.name,
                    "from": hop.start,
                    "to": hop.end,
                    "n": len(us),
                    "p50_us": round(statistics.median(us), 1),
                    "p90_us": round(us[min(len(us) - 1, len(us) * 9 // 10)], 1),
                    "p99_us": round(us[min(len(us) - 1, len(us) * 99 // 100)], 1),
                }
            )
    return rows


def run_sends(namesrv: str, sends: int, face: str) -> list[tuple[int, int]]:
    """Warm up, then `sends` sends one at a time; each one's (call, resume) in ns."""
    from raftmq.client.producer import Producer

    windows: list[tuple[int, int]] = []
    if face == "sync":
        producer = Producer(namesrv)
        try:
            for _ in range(WARMUP_SENDS):
                producer.send("w2", BODY)
            for _ in range(sends):
                call = time.monotonic_ns()
                producer.send("w2", BODY)
                resume = time.monotonic_ns()
                windows.append((call, resume))
        finally:
            producer.close()
        return windows

    async def aio() -> None:
        from raftmq.client.aio import AsyncProducer
        from raftmq.common.types import QueueRef

        queues = [QueueRef("w2", "broker-a", q) for q in range(8)]
        async with AsyncProducer(namesrv) as producer:
            for k in range(WARMUP_SENDS):
                await producer.send("w2", BODY, queue=queues[k % 8])
            for k in range(sends):
                call = time.monotonic_ns()
                await producer.send("w2", BODY, queue=queues[k % 8])
                resume = time.monotonic_ns()
                windows.append((call, resume))

    asyncio.run(aio())
    return windows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sends", type=int, default=1000)
    ap.add_argument("--face", choices=("sync", "aio"), default="sync")
    ap.add_argument("broker_args", nargs="*", help="passed to every broker (after --)")
    args = ap.parse_args()
    if timeline.PROCESS is None:
        # Stamp sites bind the timeline when their modules are imported: start again with it
        # on, so that this process (the client) and the brokers it starts all stamp.
        os.environ[timeline.ENV] = tempfile.mkdtemp(prefix="w2-timeline-")
        os.execv(sys.executable, [sys.executable, *sys.argv])
    from raftmq.client.admin import Admin
    from tests.harness.procs import start_cluster

    stamps_dir = timeline.PROCESS.directory
    with tempfile.TemporaryDirectory(prefix="w2-timeline-data-") as tmp:
        cluster = start_cluster(
            Path(tmp), groups=("broker-a",), namesrvs=1, broker_args=args.broker_args
        )
        try:
            cluster.wait_leaders()
            with Admin(cluster.namesrv) as admin:
                admin.create_topic("w2", queues=8)
            node_pids = [p.popen.pid for p in cluster.groups["broker-a"][1] if p.popen]
            windows = run_sends(cluster.namesrv, args.sends, args.face)
            for p in cluster.groups["broker-a"][1]:
                p.stop()  # SIGTERM: a clean exit dumps the node's ring
        finally:
            cluster.close()
    client = Points(timeline.PROCESS.stamps())
    nodes = []
    for pid in node_pids:
        path = stamps_dir / f"{pid}.json"
        if path.exists():
            nodes.append(Points(json.loads(path.read_text())["stamps"]))
    leaders = [n for n in nodes if n.has("raft.propose")]
    if len(leaders) != 1:
        sys.exit(f"expected one node that proposed, found {len(leaders)} (a leader change?)")
    leader = leaders[0]
    followers = [n for n in nodes if n is not leader]
    sends = [moments(client, leader, followers, c, r) for c, r in windows]
    rows = summarize(sends)
    table = Table(title=f"W2 timeline: {args.sends} sync sends of 1 KiB ({args.face} face)")
    for col in ("hop", "from -> to", "p50 us", "p90 us", "p99 us", "n"):
        table.add_column(col, justify="left" if col in ("hop", "from -> to") else "right")
    for r in rows:
        if r["group"] == "aside" and rows[rows.index(r) - 1]["group"] == "chain":
            table.add_section()
        table.add_row(
            r["hop"], f"{r['from']} -> {r['to']}", f"{r['p50_us']:.0f}", f"{r['p90_us']:.0f}",
            f"{r['p99_us']:.0f}", str(r["n"]),
        )  # fmt: skip
    Console(stderr=True).print(table)
    print(f"stamps: {stamps_dir}", file=sys.stderr)
    chain_p50 = sum(r["p50_us"] for r in rows if r["group"] == "chain")
    row = {
        "name": "w2_timeline",
        "face": args.face,
        "sends": args.sends,
        "hops": rows,
        "chain_p50_sum_us": round(chain_p50, 1),
        "broker_args": args.broker_args,
        "commit": subprocess.run(
            ["git", "-C", str(RESULTS.parent.parent), "describe", "--always", "--dirty"],
            check=False,
            capture_output=True,
            text=True,
        ).stdout.strip(),
        "loadavg_1m": os.getloadavg()[0],
        "host": platform.node(),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    RESULTS.parent.mkdir(exist_ok=True)
    with RESULTS.open("a") as out:
        out.write(json.dumps(row) + "\n")
    print(json.dumps(row))


if __name__ == "__main__":
    main()
