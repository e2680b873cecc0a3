"""A backlog of 10^8 messages on one broker group (issue 14, bar 3; the seeds' "10^8 messages
backlog on one machine", which RocketMQ claims and publishes no benchmark for).

Starts one NameServer and one three-node broker group (ASYNC_FLUSH, the default) as real
processes with their data under `--data-dir`, creates a topic of `--queues` queues and writes
`--messages` messages of `--body-bytes` through the SDK's batch API (`send_batch_async` of
`--batch` messages, `--in-flight` batches awaited per producer) from `--producers` producer
processes. Every second it counts acknowledged messages; every `--sample-s` seconds it samples
each node's memory (/proc/<pid>/status: VmRSS, RssAnon, RssFile), the bytes each node's data
directory holds on disk, and the latency of small pulls (`--pull-count` messages, no long poll)
from the leader at the head of a queue (its newest messages), at its tail (a reader going
through the queue from offset 0, as a consumer catching up on the backlog reads it) and at
random offsets within the first `--window` messages (every read cold: the worst case).

When the backlog is written: `--quiet-pulls` rounds of those three pulls with
nothing else running (the p99 the bar compares), the append rate of the first and of the last
`--window` messages, each node's peak RSS (VmHWM), disk per node over the raw bytes; then a
follower is SIGKILLed and restarted, and the leader is SIGTERMed and restarted, each timed until
"ready" as a user sees it: its `broker.started` line, then its status reports it has applied and
dispatched everything the group had committed when it died, and a follower-read pull from the
start of the backlog on that node answers messages.

One JSON line per run, appended to bench/results/backlog.jsonl (samples included); a PNG of rate,
pull latency, RSS and disk over the run beside it (`--plot`, matplotlib from the `plot` extra).
The data directory is deleted at the end unless `--keep`.

Run: `PYTHONPATH=$PWD .venv/bin/python bench/backlog_bench.py --messages 10000000`
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import random
import shutil
import signal
import sys
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from raftmq.client.admin import Admin  # noqa: E402
from raftmq.client.data_pool import DataPool  # noqa: E402
from raftmq.client.messages import SendResult  # noqa: E402
from raftmq.client.producer import Producer  # noqa: E402
from raftmq.common.data_api import DataMethod  # noqa: E402
from raftmq.common.errors import BrokerUnavailableError, NotLeaderError, RaftMQError  # noqa: E402
from raftmq.common.pb import broker_pb2  # noqa: E402
from tests.harness.procs import Cluster, Proc, start_cluster, wait_until  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "backlog.jsonl"
GROUP = "broker-a"
TOPIC = "backlog"
FIELDS = ("VmRSS", "RssAnon", "RssFile", "VmHWM")
MB = 1_000_000  # the "300 MB" and "10 GB raw" are decimal


def now_s() -> float:
    return time.monotonic()


def status_mb(pid: int) -> dict[str, float]:
    """The memory lines of /proc/<pid>/status, in MB (10^6 bytes)."""
    out = dict.fromkeys(FIELDS, 0.0)
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return out  # the node is down (restart phase)
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in out:
            out[name] = round(int(rest.split()[0]) * 1024 / MB, 1)
    return out


def disk_bytes(path: Path) -> int:
    """Bytes the files under `path` occupy on disk (allocated blocks: sparse lmdb maps count as
    what they hold, preallocated segments as what they reserve)."""
    total = 0
    for p in path.rglob("*"):
        try:
            if p.is_file():
                total += p.stat().st_blocks * 512
        except OSError:
            pass  # a file deleted meanwhile (segment trim, lmdb lock)
    return total


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


# ---- producer processes -------------------------------------------------------------------


def producer_main(
    namesrv: str,
    count: int,
    body_bytes: int,
    batch: int,
    in_flight: int,
    acked: Synchronized[int],
    failed: Synchronized[int],
) -> None:
    """Write `count` messages in batches of `batch` (one queue per batch, the SDK picks it),
    `in_flight` batches outstanding; add each batch's acknowledged messages to `acked`."""
    body = os.urandom(body_bytes)  # incompressible; the same bytes each time (nothing compresses)
    msgs = [body] * batch
    window: list[list[Future[SendResult]]] = []

    def settle(futures: list[Future[SendResult]]) -> None:
        ok = bad = 0
        for f in futures:
            try:
                f.result(600)
                ok += 1
            except (RaftMQError, FutureTimeout):  # counted and reported; the run goes on
                bad += 1
        with acked.get_lock():
            acked.value += ok
        if bad:
            with failed.get_lock():
                failed.value += bad

    with Producer(namesrv, send_timeout_ms=120_000, batch_max_messages=min(batch, 4096)) as p:
        sent = 0
        while sent < count:
            n = min(batch, count - sent)
            window.append(p.send_batch_async(TOPIC, msgs[:n] if n < batch else msgs))
            sent += n
            if len(window) >= in_flight:
                settle(window.pop(0))
        for fs in window:
            settle(fs)


# ---- pulls ------------------------------------------------------------------------------


class Puller:
    """Small pulls through the framed data path (the SDK's fetchers' request), timed from the
    request to the parsed answer, which must hold messages."""

    def __init__(self, pull_count: int) -> None:
        self.pool = DataPool(name="backlog-bench-pulls")
        self.pull_count = pull_count

    def pull(
        self, data_address: str, queue_id: int, offset: int, follower: bool = False
    ) -> tuple[float, broker_pb2.PullMessageResponse]:
        req = broker_pb2.PullMessageRequest(
            consumer_group="backlog-bench",
            topic=TOPIC,
            queue_id=queue_id,
            offset=offset,
            max_count=self.pull_count,
            max_wait_ms=0,
            allow_follower_read=follower,
            raw_batches=True,
        )
        t0 = time.perf_counter()
        resp = self.pool.submit(data_address, DataMethod.PULL_MESSAGE, req, 30).result(31)
        elapsed_ms = (time.perf_counter() - t0) * 1000
        assert isinstance(resp, broker_pb2.PullMessageResponse)
        return elapsed_ms, resp

    def close(self) -> None:
        self.pool.close()


def got_messages(resp: broker_pb2.PullMessageResponse) -> int:
    return len(resp.messages) + sum(len(b.positions) for b in resp.batches)


class Heads:
    """Each queue's max offset as the last pull answered it (the head moves while writing),
    and where the tail reader of each queue goes on."""

    def __init__(self, queues: int) -> None:
        self.max_offset = [0] * queues
        self.tail_next = [0] * queues


class Target:
    """The group's leader and every node's data address, looked up again after a NOT_LEADER
    (on a loaded two-core machine an election can happen during the run)."""

    def __init__(self, namesrv: str) -> None:
        self.namesrv = namesrv
        self.leader, self.data = group_nodes(namesrv)
        self.elections_seen = 0

    def refresh(self) -> None:
        leader, self.data = group_nodes(self.namesrv)
        if leader != self.leader:
            self.elections_seen += 1
        self.leader = leader


def timed_pull(puller: Puller, target: Target, q: int, at: int) -> tuple[float, int, int]:
    """(ms, messages, max offset) of one pull from the leader. A pull refused by a node that is
    no longer the leader is retried on the new one and only that attempt is timed (the wait
    for the election is not a read's latency)."""
    for _ in range(100):
        try:
            ms, resp = puller.pull(target.data[target.leader], q, at)
            return ms, got_messages(resp), resp.max_offset
        except (NotLeaderError, BrokerUnavailableError):
            time.sleep(0.2)
            target.refresh()
    raise RuntimeError("no leader answered a pull in 100 attempts")


def head_and_tail(
    puller: Puller, target: Target, queues: int, heads: Heads, tail_span: int, rounds: int
) -> tuple[list[float], list[float], list[float]]:
    """Pull latencies (ms) of `rounds` rounds of three pulls, each from a random queue: at the
    head (its newest `pull_count` messages: a consumer keeping up), at the tail (the next
    offsets of a reader going through the queue from offset 0, as a consumer catching up on
    the backlog reads it; it wraps within the first `tail_span` offsets) and at a random offset
    within the first `tail_span` (a cold read every time: the worst case, reported beside)."""
    head_ms: list[float] = []
    tail_ms: list[float] = []
    cold_ms: list[float] = []
    for _ in range(rounds):
        q = random.randrange(queues)
        at = max(0, heads.max_offset[q] - puller.pull_count)
        ms, got, max_offset = timed_pull(puller, target, q, at)
        heads.max_offset[q] = max(heads.max_offset[q], max_offset)
        if got:
            head_ms.append(ms)
        q = random.randrange(queues)
        span = max(1, min(tail_span, heads.max_offset[q] - puller.pull_count))
        at = heads.tail_next[q] if heads.tail_next[q] < span else 0
        heads.tail_next[q] = at + puller.pull_count
        ms, got, _ = timed_pull(puller, target, q, at)
        if got:
            tail_ms.append(ms)
        ms, got, _ = timed_pull(puller, target, q, random.randrange(span))
        if got:
            cold_ms.append(ms)
    return head_ms, tail_ms, cold_ms


# ---- the cluster ------------------------------------------------------------------------


def group_nodes(namesrv: str) -> tuple[str, dict[str, str]]:
    """(leader node id, node id -> data address), once a leader with a data address is routed."""

    def look() -> tuple[str, dict[str, str]] | None:
        with Admin(namesrv) as admin:
            for g in admin.groups():
                if g.broker_group != GROUP:
                    continue
                leaders = [n.node_id for n in g.nodes if n.is_leader and n.data_address]
                if len(g.nodes) == 3 and leaders:
                    return leaders[0], {n.node_id: n.data_address for n in g.nodes}
        return None

    found = wait_until(look, 120, "a routed leader with a data address", interval_s=0.2)
    assert isinstance(found, tuple)
    return found


def proc_of(cluster: Cluster, node_id: str) -> Proc:
    return next(p for p in cluster.groups[GROUP][1] if p.name.endswith("-" + node_id))


def pid_of(cluster: Cluster, node_id: str) -> int:
    popen = proc_of(cluster, node_id).popen
    if popen is None:
        raise RuntimeError(f"node {node_id} is not running")
    return popen.pid


def statuses(namesrv: str) -> dict[str, broker_pb2.BrokerStatus]:
    with Admin(namesrv) as admin:
        return {s.node_id: s.status for s in admin.broker_statuses([GROUP]) if s.status}


def restart_ready(
    cluster: Cluster, node_id: str, sig: int, puller: Puller, layout_address: str
) -> dict[str, Any]:
    """Stop `node_id` with `sig`, start it again, and time it until ready (module docstring)."""
    proc = proc_of(cluster, node_id)
    before = statuses(cluster.namesrv)
    committed = max(s.commit_index for s in before.values())
    t_stop = now_s()
    proc.kill(sig)
    stopped_s = now_s() - t_stop
    t0 = now_s()
    proc.start("broker.started", timeout_s=900)
    started_s = now_s() - t0
    with Admin(cluster.namesrv) as admin:

        def caught_up() -> bool:
            st = admin.broker_status(layout_address)
            return st.applied_index >= committed and st.dispatch_index >= committed

        wait_until(caught_up, 900, f"{node_id} applied and dispatched", interval_s=0.05)
    caught_up_s = now_s() - t0
    _, data = group_nodes(cluster.namesrv)

    def answers() -> bool:
        _, resp = puller.pull(data[node_id], 0, 0, follower=True)
        return got_messages(resp) > 0 and resp.node_id == node_id

    wait_until(answers, 900, f"{node_id} answers a pull from offset 0", interval_s=0.05)
    ready_s = now_s() - t0
    return {
        "node": node_id,
        "signal": signal.Signals(sig).name,
        "stop_s": round(stopped_s, 2),
        "started_line_s": round(started_s, 2),
        "caught_up_s": round(caught_up_s, 2),
        "ready_s": round(ready_s, 2),
        "committed_index": committed,
    }


# ---- the run ------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    base = Path(args.data_dir)
    base.mkdir(parents=True, exist_ok=True)
    tmp = base / time.strftime("run-%Y%m%d-%H%M%S")
    tmp.mkdir()
    broker_args = ["--flush-policy", "ASYNC_FLUSH", *args.broker_arg]
    cluster = start_cluster(tmp, (GROUP,), namesrvs=1, broker_args=broker_args)
    procs: list[mp.process.BaseProcess] = []
    puller = Puller(args.pull_count)
    try:
        return measure(args, tmp, cluster, puller, procs)
    finally:
        for pr in procs:
            if pr.is_alive():
                pr.terminate()
            pr.join(10)
        puller.close()
        cluster.close()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


def measure(
    args: argparse.Namespace,
    tmp: Path,
    cluster: Cluster,
    puller: Puller,
    procs: list[mp.process.BaseProcess],
) -> dict[str, Any]:
    target = Target(cluster.namesrv)
    layout, nodes = cluster.groups[GROUP]
    node_ids = [f"n{i}" for i in range(len(nodes))]
    pids = {nid: pid_of(cluster, nid) for nid in node_ids}
    with Admin(cluster.namesrv) as admin:
        admin.create_topic(TOPIC, queues=args.queues)
        wait_until(lambda: len(admin.route(TOPIC).write_queues()) == args.queues, 30, "route")
    ctx = mp.get_context("spawn")
    acked = ctx.Value("q", 0)
    failed = ctx.Value("q", 0)
    share = [args.messages // args.producers] * args.producers
    share[0] += args.messages - sum(share)
    for n in share:
        procs.append(
            ctx.Process(
                target=producer_main,
                args=(
                    cluster.namesrv,
                    n,
                    args.body_bytes,
                    args.batch,
                    args.in_flight,
                    acked,
                    failed,
                ),
                daemon=True,
            )
        )
    heads = Heads(args.queues)
    tail_span = max(args.pull_count + 1, args.window // args.queues)
    # (seconds since start, acknowledged, CPU seconds of the three nodes together)
    ticks: list[tuple[float, int, float]] = []
    samples: list[dict[str, Any]] = []
    head_all: list[float] = []
    tail_all: list[float] = []
    cold_all: list[float] = []
    load: list[float] = []
    t_start = now_s()
    for pr in procs:
        pr.start()
    progress = make_progress(args.messages)
    next_sample = t_start
    last_acked, last_t = 0, t_start
    while True:
        time.sleep(1.0)
        t = now_s()
        n = acked.value
        ticks.append((round(t - t_start, 2), n, round(sum(map(cpu_s, pids.values())), 2)))
        if progress is not None:
            progress(n, failed.value)
        done = all(not pr.is_alive() for pr in procs)
        if t >= next_sample or done:
            next_sample = t + args.sample_s
            h, tl, cold = head_and_tail(
                puller, target, args.queues, heads, tail_span, args.sample_pulls
            )
            head_all += h
            tail_all += tl
            cold_all += cold
            mem = {nid: status_mb(pid) for nid, pid in pids.items()}
            la = os.getloadavg()[0]
            load.append(la)
            samples.append(
                {
                    "t_s": round(t - t_start, 1),
                    "acked": n,
                    "rate": round((n - last_acked) / max(t - last_t, 1e-6)),
                    "rss_mb": {nid: m["VmRSS"] for nid, m in mem.items()},
                    "anon_mb": {nid: m["RssAnon"] for nid, m in mem.items()},
                    "file_mb": {nid: m["RssFile"] for nid, m in mem.items()},
                    "disk_mb": {
                        nid: round(disk_bytes(tmp / f"{GROUP}-{nid}") / MB, 1) for nid in node_ids
                    },
                    "head_p50_ms": round(pct(h, 50), 2),
                    "head_p99_ms": round(pct(h, 99), 2),
                    "tail_p50_ms": round(pct(tl, 50), 2),
                    "tail_p99_ms": round(pct(tl, 99), 2),
                    "cold_p99_ms": round(pct(cold, 99), 2),
                    "load_1m": round(la, 2),
                }
            )
            last_acked, last_t = n, t
            if args.verbose:
                print(json.dumps(samples[-1]), file=sys.stderr, flush=True)
        if done:
            break
    write_s = now_s() - t_start
    total = acked.value
    time.sleep(3)  # followers apply and dispatch the tail
    # The bar's pulls: head and tail alternately, nothing else running.
    quiet_head, quiet_tail, quiet_cold = head_and_tail(
        puller, target, args.queues, heads, tail_span, args.quiet_pulls
    )
    mem_end = {nid: status_mb(pid) for nid, pid in pids.items()}
    disk_end = {nid: disk_bytes(tmp / f"{GROUP}-{nid}") for nid in node_ids}
    raw = total * args.body_bytes
    first_rate, last_rate = window_rates(ticks, args.window, total)
    first_cpu, last_cpu = window_cpu_us(ticks, args.window, total)
    restarts: list[dict[str, Any]] = []
    target.refresh()
    leader = target.leader
    if not args.no_restart:
        follower = next(nid for nid in node_ids if nid != leader)
        restarts.append(
            restart_ready(
                cluster, follower, signal.SIGKILL, puller, layout.address(node_ids.index(follower))
            )
        )
        restarts.append(
            restart_ready(
                cluster, leader, signal.SIGTERM, puller, layout.address(node_ids.index(leader))
            )
        )
    peak = {nid: max(mem_end[nid]["VmHWM"], *(s["rss_mb"][nid] for s in samples)) for nid in pids}
    head_p99, tail_p99 = pct(quiet_head, 99), pct(quiet_tail, 99)
    disk_ratio = {nid: round(b / max(raw, 1), 3) for nid, b in disk_end.items()}
    return {
        "bench": "backlog",
        "messages": args.messages,
        "acked": total,
        "failed": failed.value,
        "body_bytes": args.body_bytes,
        "queues": args.queues,
        "producers": args.producers,
        "batch": args.batch,
        "in_flight": args.in_flight,
        "window": args.window,
        "write_s": round(write_s, 1),
        "rate_mean": round(total / write_s),
        "rate_first_window": first_rate,
        "rate_last_window": last_rate,
        "rate_last_over_first": round(last_rate / first_rate, 3) if first_rate else None,
        # The servers' CPU per message over the same windows: what the rate would be on a
        # machine of its own (the rates move with other processes' load, this does not).
        "servers_cpu_us_per_msg_first_window": first_cpu,
        "servers_cpu_us_per_msg_last_window": last_cpu,
        "quiet_pulls": len(quiet_head) + len(quiet_tail) + len(quiet_cold),
        "pull_count": args.pull_count,
        "head_p50_ms": round(pct(quiet_head, 50), 3),
        "head_p99_ms": round(head_p99, 3),
        "tail_p50_ms": round(pct(quiet_tail, 50), 3),
        "tail_p99_ms": round(tail_p99, 3),
        "tail_over_head_p99": round(tail_p99 / head_p99, 3) if head_p99 else None,
        "cold_tail_p50_ms": round(pct(quiet_cold, 50), 3),
        "cold_tail_p99_ms": round(pct(quiet_cold, 99), 3),
        "loaded_head_p99_ms": round(pct(head_all, 99), 3),
        "loaded_tail_p99_ms": round(pct(tail_all, 99), 3),
        "loaded_cold_tail_p99_ms": round(pct(cold_all, 99), 3),
        "leader": leader,
        "leader_changes_seen": target.elections_seen,
        "rss_peak_mb": peak,
        "rss_end": mem_end,
        "raw_bytes": raw,
        "disk_bytes": disk_end,
        "disk_over_raw": disk_ratio,
        "restarts": restarts,
        "bars": bars(first_rate, last_rate, head_p99, tail_p99, peak, disk_ratio, restarts),
        # The rate bar read as "appends do not slow down as the backlog grows" (a last window
        # faster than the first fails the literal bar above): by rate, and by the servers' CPU
        # per message, which the shared machine's load moves much less than it moves rates.
        "no_slowdown": {
            "rate_last_at_least_80pct_of_first": bool(first_rate) and last_rate >= 0.8 * first_rate,
            "servers_cpu_last_at_most_120pct_of_first": bool(first_cpu)
            and last_cpu <= 1.2 * first_cpu,
        },
        "load_1m_mean": round(sum(load) / max(len(load), 1), 2),
        "load_1m_max": round(max(load, default=0.0), 2),
        "host": platform.node()[:16],
        "cpus": os.cpu_count(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "samples": samples,
        "ticks": ticks,
    }


def _at(ticks: list[tuple[float, int, float]], count: int, column: int) -> float:
    """Column `column` of the ticks (0: seconds, 2: CPU seconds) when `count` messages were
    acknowledged, interpolated between the per-second ticks."""
    prev = (0.0, 0, 0.0)
    for tick in ticks:
        if tick[1] >= count:
            if tick[1] == prev[1]:
                return tick[column]
            share = (count - prev[1]) / (tick[1] - prev[1])
            return prev[column] + (tick[column] - prev[column]) * share
        prev = tick
    return ticks[-1][column] if ticks else 0.0


def window_rates(ticks: list[tuple[float, int, float]], window: int, total: int) -> tuple[int, int]:
    """Append rate (msg/s) over the first and over the last `window` acknowledged messages."""
    window = min(window, total)
    if window <= 0:
        return 0, 0
    first = window / max(_at(ticks, window, 0), 1e-6)
    last = window / max(_at(ticks, total, 0) - _at(ticks, total - window, 0), 1e-6)
    return round(first), round(last)


def window_cpu_us(
    ticks: list[tuple[float, int, float]], window: int, total: int
) -> tuple[float, float]:
    """The three nodes' CPU microseconds per message over the first and the last window."""
    window = min(window, total)
    if window <= 0:
        return 0.0, 0.0
    first = (_at(ticks, window, 2) - ticks[0][2]) / window * 1e6 if ticks else 0.0
    last = (_at(ticks, total, 2) - _at(ticks, total - window, 2)) / window * 1e6
    return round(first, 1), round(last, 1)


def cpu_s(pid: int) -> float:
    """utime + stime of a process, seconds (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bars(
    first_rate: int,
    last_rate: int,
    head_p99: float,
    tail_p99: float,
    peak: dict[str, float],
    disk_ratio: dict[str, float],
    restarts: list[dict[str, Any]],
) -> dict[str, bool]:
    out = {
        "rate_last_within_20pct_of_first": bool(first_rate)
        and abs(last_rate - first_rate) <= 0.2 * first_rate,
        "tail_p99_within_20pct_of_head": bool(head_p99) and tail_p99 <= 1.2 * head_p99,
        "rss_under_300_mb": max(peak.values()) < 300,
        "disk_under_1_3x_raw": max(disk_ratio.values()) < 1.3,
    }
    if restarts:
        out["restart_ready_under_30_s"] = max(r["ready_s"] for r in restarts) < 30
    return out


def make_progress(total: int) -> Any:
    """A rich progress bar on a terminal (the cli extra), else None."""
    if not sys.stderr.isatty():
        return None
    try:
        from rich.progress import Progress  # the cli extra
    except ImportError:
        return None
    bar = Progress(transient=True)
    bar.start()
    task = bar.add_task("messages", total=total)

    def update(n: int, failed: int) -> None:
        bar.update(task, completed=n, description=f"messages ({failed} failed)")
        if n >= total:
            bar.stop()

    return update


def plot(rec: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = rec["samples"]
    x = [s["acked"] / 1e6 for s in samples]
    fig, axes = plt.subplots(4, 1, figsize=(9, 11), sharex=True)
    ticks = rec["ticks"]
    # Rate over 10 s windows of the per-second counts (one second is too noisy to read).
    rx, ry = [], []
    for i in range(10, len(ticks), 5):
        (t0, n0, _), (t1, n1, _) = ticks[i - 10], ticks[i]
        rx.append(n1 / 1e6)
        ry.append((n1 - n0) / max(t1 - t0, 1e-6))
    axes[0].plot(rx, ry, lw=1)
    axes[0].axhline(rec["rate_first_window"], ls="--", c="grey", lw=0.8, label="first window")
    axes[0].axhline(rec["rate_last_window"], ls=":", c="k", lw=0.8, label="last window")
    axes[0].set_ylabel("append rate, msg/s")
    axes[0].legend(loc="lower left", fontsize=8)
    load = axes[0].twinx()  # the machine is shared: the rate follows its load
    load.plot(x, [s["load_1m"] for s in samples], c="tab:red", lw=0.6, alpha=0.6)
    load.set_ylabel("load average (1 min)", color="tab:red", fontsize=8)
    for key, label in (
        ("head_p99_ms", "head p99"),
        ("tail_p99_ms", "tail p99"),
        ("cold_p99_ms", "cold tail p99"),
        ("head_p50_ms", "head p50"),
        ("tail_p50_ms", "tail p50"),
    ):
        axes[1].plot(
            x, [s[key] for s in samples], lw=1, label=label, ls="-" if "p99" in key else "--"
        )
    axes[1].set_ylabel("pull latency, ms\n(while writing)")
    axes[1].set_yscale("log")
    axes[1].legend(loc="upper left", fontsize=8)
    for nid in sorted(samples[0]["rss_mb"]):
        axes[2].plot(x, [s["rss_mb"][nid] for s in samples], lw=1, label=f"{nid} RSS")
        axes[2].plot(x, [s["anon_mb"][nid] for s in samples], lw=0.8, ls="--", label=f"{nid} anon")
    axes[2].axhline(300, c="r", lw=0.8, label="300 MB")
    axes[2].set_ylabel("memory, MB")
    axes[2].legend(loc="upper left", fontsize=7, ncol=2)
    for nid in sorted(samples[0]["disk_mb"]):
        axes[3].plot(x, [s["disk_mb"][nid] / 1000 for s in samples], lw=1, label=nid)
    axes[3].plot(
        x,
        [s["acked"] * rec["body_bytes"] * 1.3 / 1e9 for s in samples],
        c="r",
        lw=0.8,
        label="1.3 x raw",
    )
    axes[3].set_ylabel("disk per node, GB")
    axes[3].set_xlabel("messages acknowledged (millions)")
    axes[3].legend(loc="upper left", fontsize=8)
    fig.suptitle(
        f"backlog of {rec['acked']:,} x {rec['body_bytes']} B, one group of 3 nodes "
        f"(ASYNC_FLUSH), {rec['when']}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=100_000_000)
    ap.add_argument("--window", type=int, default=10_000_000, help="rate-comparison window")
    ap.add_argument("--body-bytes", type=int, default=100)
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--producers", type=int, default=2, help="producer processes")
    ap.add_argument("--batch", type=int, default=1024, help="messages per send_batch_async")
    ap.add_argument("--in-flight", type=int, default=8, help="batches outstanding per producer")
    ap.add_argument("--sample-s", type=float, default=10.0, help="seconds between samples")
    ap.add_argument("--sample-pulls", type=int, default=10, help="head+tail pulls per sample")
    ap.add_argument("--quiet-pulls", type=int, default=1000, help="head+tail pulls at the end")
    ap.add_argument("--pull-count", type=int, default=32, help="messages per pull")
    ap.add_argument("--data-dir", default="/work/backlog-data")
    ap.add_argument("--keep", action="store_true", help="keep the data directory")
    ap.add_argument("--no-restart", action="store_true")
    ap.add_argument("--broker-arg", action="append", default=[], help="extra broker flag")
    ap.add_argument("--plot", default="", help="PNG path; default beside the results")
    ap.add_argument("--verbose", action="store_true", help="print each sample to stderr")
    args = ap.parse_args()
    args.broker_arg = [a for arg in args.broker_arg for a in arg.split()]
    # SIGTERM (and SIGINT, which a background job ignores) end the run through its `finally`:
    # the cluster and producers stopped, the data directory deleted.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rec = run(args)
    rec["command"] = "bench/backlog_bench.py " + " ".join(sys.argv[1:])
    stamp = time.strftime("%Y%m%d-%H%M", time.gmtime())
    png = Path(args.plot) if args.plot else RESULTS.parent / f"backlog-{stamp}.png"
    try:
        plot(rec, png)
        rec["plot"] = str(png.relative_to(ROOT) if png.is_relative_to(ROOT) else png)
    except ImportError:
        rec["plot"] = "(matplotlib missing: install the plot extra)"
    print(json.dumps({k: v for k, v in rec.items() if k not in ("samples", "ticks")}), flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as f:
        f.write(json.dumps(rec) + "\n")
    return 0 if all(rec["bars"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
