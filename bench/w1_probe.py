"""Where W1's CPU goes: peerbench's own W1 (one producer, 64 sends in flight, 1 KiB, 8 queues)
against bench/peer_adapter.py's cluster, with the CPU of every process and of every thread per
acknowledged message, and the producer's batching (frames, batches per frame, messages per
batch). Thread names come from `py-spy dump` when py-spy is installed (`pip install py-spy`).

Run from the project root, with ../shared/peerbench beside it:

    PYTHONPATH=$PWD .venv/bin/python bench/w1_probe.py --scale 0.3 [--spy DIR]

`--spy DIR` samples every process with `py-spy record -r 200 -f raw -t --nonblocking` during
the measured run (one file per process in DIR) and prints each busy
thread's top frames, by own samples and by samples under a function, on stderr. Each thread's
CPU is also given net of what it spends idle (measured for 3 s before the run).

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
import time
from pathlib import Path
from typing import Any

# ../shared/peerbench beside the checkout (or beside its parent, for a worktree in a subfolder)
PEERBENCH = next(
    (
        p / "shared" / "peerbench"
        for p in Path(__file__).resolve().parents[1:4]
        if (p / "shared" / "peerbench").is_dir()
    ),
    Path(__file__).resolve().parent.parent.parent / "shared" / "peerbench",
)
sys.path.insert(0, str(PEERBENCH))

from peerbench.workloads import Params, w1_throughput  # noqa: E402

from bench.peer_adapter import RaftMQ  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
IDLE_S = 3.0  # seconds of no traffic measured before the run
# leaves py-spy samples while the thread waits (its idle detection misses these)
IDLE_LEAVES = frozenset(
    ("Condition.wait", "Event.wait", "_run_loop", "LoopThread._main", "_worker", "select")
)
SPY_S = 6  # seconds sampled, inside the measured run at --scale >= 0.3
COUNTERS = ("frames_sent", "batches_sent", "messages_sent")  # the sender's; absent before them


def cpu_s(path: str) -> float:
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def sys_s(path: str) -> float:
    """The kernel's share (stime) of a thread's CPU seconds."""
    return int(Path(path).read_text().rsplit(")", 1)[1].split()[12]) / TICK


def sys_threads(pid: int) -> dict[str, float]:
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[tid] = sys_s(f"/proc/{pid}/task/{tid}/stat")
        except OSError:
            continue
    return out


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


def spy_path() -> str | None:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return spy if Path(spy).exists() else None


def start_spies(pids: dict[str, int], out: Path, seconds: float) -> list[subprocess.Popen[bytes]]:
    spy = spy_path()
    if spy is None:
        raise SystemExit("--spy needs py-spy (pip install py-spy)")
    out.mkdir(parents=True, exist_ok=True)
    procs = []
    for name, pid in pids.items():
        args = ["record", "-r", "200", "-f", "raw", "-t", "--nonblocking", "-d", str(int(seconds))]
        args += ["-p", str(pid), "-o", str(out / f"{name}.raw")]
        procs.append(
            subprocess.Popen([spy, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        )
    return procs


def top_frames(raw: Path, names: dict[str, str], top: int = 8) -> list[str]:
    """Each thread's share of the samples, its top frames by own samples ("self") and the
    functions with most samples under them ("total"), from one py-spy raw file."""
    own: dict[str, dict[str, int]] = {}
    under: dict[str, dict[str, int]] = {}
    total: dict[str, int] = {}
    for line in raw.read_text().splitlines():
        stack, _, count_s = line.rpartition(" ")
        frames = stack.split(";")
        if frames[-1].split(" (")[0] in IDLE_LEAVES:
            continue  # a thread waiting (or in its event loop's C code): not CPU we can cut
        tid = frames[0].removeprefix("thread (").rstrip(")")
        n = int(count_s)
        total[tid] = total.get(tid, 0) + n
        leaf = frames[-1]
        own.setdefault(tid, {})[leaf] = own.setdefault(tid, {}).get(leaf, 0) + n
        seen = set()
        for f in frames[1:]:
            fn = f.split(" (")[0] + " (" + f.split(" (")[-1].rsplit(":", 1)[0] + ")"
            if fn not in seen:
                seen.add(fn)
                under.setdefault(tid, {})[fn] = under.setdefault(tid, {}).get(fn, 0) + n
    lines = []
    all_n = sum(total.values()) or 1
    for tid, n in sorted(total.items(), key=lambda kv: -kv[1])[:4]:
        lines.append(f"  thread {names.get(tid, tid)}: {n} samples ({100 * n / all_n:.0f} %)")
        for kind, table in (("self", own[tid]), ("total", under[tid])):
            for f, c in sorted(table.items(), key=lambda kv: -kv[1])[:top]:
                lines.append(f"    {kind:5} {100 * c / n:5.1f} %  {f}")
    return lines


async def probe(scale: float, api: str, tls: str = "0", spy: Path | None = None) -> dict[str, Any]:
    opts = {"api": api} if api else {}
    adapter = RaftMQ(**opts, tls=tls)
    with tempfile.TemporaryDirectory() as workdir:
        await adapter.start_cluster(workdir)
        try:
            assert adapter.producer is not None
            params = Params().scaled(scale)
            pids = {n: p.pid for n, p in adapter.procs.items() if p.pid is not None}
            pids["client"] = os.getpid()
            # each thread's CPU per second with the cluster up and no traffic (ticks, scrubbers,
            # heartbeats): at a loaded machine's low rates these would pass for per-message cost
            idle0 = {n: threads(pid) for n, pid in pids.items()}
            await asyncio.sleep(IDLE_S)
            before = {n: threads(pid) for n, pid in pids.items()}
            sys_before = {n: sys_threads(pid) for n, pid in pids.items()}
            idle_per_s = {
                n: {t: (before[n][t] - idle0[n].get(t, before[n][t])) / IDLE_S for t in before[n]}
                for n in pids
            }
            t0 = time.monotonic()
            sender = adapter.producer._sender
            counts0 = [getattr(sender, k, 0) for k in COUNTERS]
            run = asyncio.ensure_future(w1_throughput(adapter, params))
            await asyncio.sleep(2)
            names = {n: await asyncio.to_thread(thread_names, pid) for n, pid in pids.items()}
            spies = start_spies(pids, spy, SPY_S) if spy is not None else []
            result = await run
            wall_s = time.monotonic() - t0
            for p in spies:
                await asyncio.to_thread(p.wait)
            after = {n: threads(pid) for n, pid in pids.items()}
            sys_after = {n: sys_threads(pid) for n, pid in pids.items()}
        finally:
            await adapter.stop_cluster()
    acked = result["acked"]
    per_msg = {
        n: round((sum(after[n].values()) - sum(before[n].values())) / acked * 1e6, 1) for n in pids
    }
    net_per_msg = {
        n: round(
            sum(
                after[n][t] - before[n].get(t, 0.0) - idle_per_s[n].get(t, 0.0) * wall_s
                for t in after[n]
            )
            / acked
            * 1e6,
            1,
        )
        for n in pids
    }
    print(
        f"{'process':7} {'thread':32} {'us/msg':>8} {'net of idle':>12} {'kernel':>7}",
        file=sys.stderr,
    )
    for n in pids:
        rows = sorted(((after[n][t] - before[n].get(t, 0.0), t) for t in after[n]), reverse=True)
        for spent, tid in rows[:7]:
            if spent > 0:
                us = spent / acked * 1e6
                net = (spent - idle_per_s[n].get(tid, 0.0) * wall_s) / acked * 1e6
                name = names[n].get(tid, tid)
                kernel = (sys_after[n].get(tid, 0.0) - sys_before[n].get(tid, 0.0)) / acked * 1e6
                print(f"{n:7} {name:32} {us:8.1f} {net:12.1f} {kernel:7.1f}", file=sys.stderr)
    if spy is not None:
        for n in pids:
            raw = spy / f"{n}.raw"
            if raw.exists():
                print(f"{n} ({raw}):", file=sys.stderr)
                print("\n".join(top_frames(raw, names[n])), file=sys.stderr)
    frames, batches, msgs = (
        getattr(sender, k, 0) - c for k, c in zip(COUNTERS, counts0, strict=True)
    )
    return {
        "msgs_per_s": result["msgs_per_s"],
        "acked": acked,
        "cpu_us_per_msg": per_msg,
        "cpu_us_per_msg_net_of_idle": net_per_msg,
        "wall_s": round(wall_s, 2),
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
    ap.add_argument("--spy", type=Path, default=None, help="py-spy every process into this dir")
    args = ap.parse_args()
    result = asyncio.run(probe(args.scale, args.api, args.tls, args.spy))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
