"""Where W1's CPU goes: peerbench's own W1 (one producer, 64 sends in flight, 1 KiB, 8 queues)
against bench/peer_adapter.py's cluster, with the CPU of every process and of every thread per
acknowledged message, and the producer's batching (frames, batches per frame, messages per
batch). Thread names come from `py-spy dump` when py-spy is installed (`pip install py-spy`).

Run from the project root, with ../shared/peerbench beside it:

    PYTHONPATH=$PWD .venv/bin/python bench/w1_probe.py --scale 0.3

One JSON line per run on stdout, the per-thread table on stderr. Compare code versions by
running two checkouts back to back (PYTHONPATH selects the code): rates on a shared machine
are noisy, CPU per message much less.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

PEERBENCH = Path(__file__).resolve().parent.parent.parent / "shared" / "peerbench"
sys.path.insert(0, str(PEERBENCH))

from peerbench.workloads import Params, w1_throughput  # noqa: E402

from bench.peer_adapter import RaftMQ  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
COUNTERS = ("frames_sent", "batches_sent", "messages_sent")  # the sender's; absent before them


def cpu_s(path: str) -> float:
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def threads(pid: int) -> dict[str, float]:
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[tid] = cpu_s(f"/proc/{pid}/task/{tid}/stat")
        except OSError:
            continue
    return out


def thread_names(pid: int) -> dict[str, str]:
    """tid -> thread name, from py-spy dump (empty without py-spy)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        return {}
    dump = subprocess.run(
        [spy, "dump", "--nonblocking", "-p", str(pid)], check=False, capture_output=True, text=True
    ).stdout
    names = {}
    for line in dump.splitlines():
        if line.startswith("Thread "):
            tid = line.split()[1]
            tid = str(int(tid, 0)) if tid.startswith("0x") else tid
            names[tid] = line.split('"')[1] if '"' in line else ""
    return names


async def probe(scale: float, api: str, tls: str = "0") -> dict[str, Any]:
    opts = {"api": api} if api else {}
    adapter = RaftMQ(**opts, tls=tls)
    with tempfile.TemporaryDirectory() as workdir:
        await adapter.start_cluster(workdir)
        try:
            assert adapter.producer is not None
            params = Params().scaled(scale)
            pids = {n: p.pid for n, p in adapter.procs.items() if p.pid is not None}
            pids["client"] = os.getpid()
            before = {n: threads(pid) for n, pid in pids.items()}
            sender = adapter.producer._sender
            counts0 = [getattr(sender, k, 0) for k in COUNTERS]
            run = asyncio.ensure_future(w1_throughput(adapter, params))
            await asyncio.sleep(2)
            names = {n: await asyncio.to_thread(thread_names, pid) for n, pid in pids.items()}
            result = await run
            after = {n: threads(pid) for n, pid in pids.items()}
        finally:
            await adapter.stop_cluster()
    acked = result["acked"]
    per_msg = {
        n: round((sum(after[n].values()) - sum(before[n].values())) / acked * 1e6, 1) for n in pids
    }
    for n in pids:
        rows = sorted(((after[n][t] - before[n].get(t, 0.0), t) for t in after[n]), reverse=True)
        for spent, tid in rows[:6]:
            if spent > 0:
                us = spent / acked * 1e6
                print(f"{n:7} {names[n].get(tid, tid):32} {us:6.1f} us/msg", file=sys.stderr)
    frames, batches, msgs = (
        getattr(sender, k, 0) - c for k, c in zip(COUNTERS, counts0, strict=True)
    )
    return {
        "msgs_per_s": result["msgs_per_s"],
        "acked": acked,
        "cpu_us_per_msg": per_msg,
        "leader": max((n for n in pids if n.startswith("n")), key=lambda n: per_msg[n]),
        "frames": frames,
        "batches_per_frame": round(batches / frames, 2) if frames else None,
        "msgs_per_batch": round(msgs / batches, 2) if batches else None,
        "loadavg_1m": round(os.getloadavg()[0], 1),
        "tls": tls,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--scale", type=float, default=0.3, help="peerbench's count scale")
    ap.add_argument("--api", default="", help="the adapter's --opt api (aio, threaded)")
    ap.add_argument(
        "--tls", default="0", choices=("0", "1", "mutual"), help="the adapter's --opt tls"
    )
    args = ap.parse_args()
    print(json.dumps(asyncio.run(probe(args.scale, args.api, args.tls))), flush=True)


if __name__ == "__main__":
    main()
