"""A replicated-log node as its own process, driven over a local control socket.

Used by the multi-process tests and bench/raftlog_bench.py: a real node with real files and real
raft ports, plus a control endpoint on 127.0.0.1 (pickled requests, authkey) that never carries
raft traffic. `python -m raftlog.standalone --help`.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import random
import resource
import signal
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import asdict
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import Any

from raftmq.common import tls
from raftmq.raftlog.config import FlushPolicy, PeerTls, RaftLogConfig
from raftmq.raftlog.errors import RaftLogError
from raftmq.raftlog.log import ReplicatedLog
from raftmq.raftlog.native_log import NativeLog
from raftmq.raftlog.record import Committed

AUTHKEY = b"raftmq-standalone"


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Controller:
    """Executes control requests against one ReplicatedLog."""

    def __init__(self, rlog: ReplicatedLog | NativeLog) -> None:
        self.rlog = rlog

    def handle(self, req: dict[str, Any]) -> Any:
        op = req["op"]
        if op == "status":
            st = asdict(self.rlog.status())
            st["role"] = st["role"].value
            st["committed_index"] = self.rlog.committed_index
            st["leader_ready"] = self.rlog.is_leader_ready()
            st["rss_bytes"] = _rss_bytes()
            st["cpu_s"] = _cpu_seconds()
            st["pid"] = os.getpid()
            return st
        if op == "submit":
            return self._submit(req["payloads"], req.get("timeout_s", 10.0))
        if op == "read_from":
            entries = self.rlog.read_from(
                req["start"],
                max_bytes=req.get("max_bytes", 4 << 20),
                max_entries=req.get("max_entries", 1000),
            )
            return [(e.index, e.term, e.chunks) for e in entries]
        if op == "load":
            return self._load(req)
        if op == "transfer":
            return self.rlog.transfer_leadership(req.get("target"), req.get("timeout_s", 3.0))
        if op == "block":  # cut this node off from these peers (both ways); [] heals
            self.rlog.block_peers(frozenset(req["peers"]))
            return True
        if op == "wait_committed":
            return self.rlog.wait_committed(req["index"], req.get("timeout_s", 5.0))
        raise ValueError(f"unknown control op {op!r}")

    def _submit(self, payloads: list[bytes], timeout_s: float) -> list[Any]:
        """Submit and wait; each result is ("ok", term, index, slot) or ("err", class, text)."""
        futs: list[Future[Committed] | RaftLogError] = []
        for p in payloads:
            try:
                futs.append(self.rlog.submit(p))
            except RaftLogError as exc:
                futs.append(exc)
        out: list[Any] = []
        for f in futs:
            if isinstance(f, RaftLogError):
                out.append(("err", type(f).__name__, str(f)))
                continue
            try:
                c = f.result(timeout=timeout_s)
                out.append(("ok", c.term, c.index, c.slot))
            except RaftLogError as exc:
                out.append(("err", type(exc).__name__, str(exc)))
            except TimeoutError:
                out.append(("err", "TimeoutError", "no answer in time"))
        return out

    def _load(self, req: dict[str, Any]) -> dict[str, Any]:
        """Closed-loop load generated inside the leader: `window` submissions in flight,
        `size` bytes each, for `seconds` (or `total_bytes`); latencies of every commit."""
        size, window = int(req["size"]), int(req["window"])
        seconds = float(req.get("seconds", 5.0))
        total_bytes = int(req.get("total_bytes", 0))
        sample_rss = bool(req.get("sample_rss", False))
        payload_pool = [random.randbytes(size) for _ in range(64)]  # incompressible
        lock = threading.Condition()
        inflight = 0
        done = 0
        errors = 0
        latencies: list[float] = []
        max_rss = _rss_bytes()
        cpu0, t0 = _cpu_seconds(), time.monotonic()
        deadline = t0 + seconds

        def on_done(started: float, fut: Future[Committed]) -> None:
            nonlocal inflight, done, errors
            ok = fut.exception() is None
            with lock:
                inflight -= 1
                if ok:
                    done += 1
                    if len(latencies) < 2_000_000:
                        latencies.append(time.monotonic() - started)
                else:
                    errors += 1
                lock.notify()

        n = 0
        last_rss = t0
        while True:
            now = time.monotonic()
            if (total_bytes and n * size >= total_bytes) or (not total_bytes and now >= deadline):
                break
            with lock:
                while inflight >= window:
                    lock.wait(1.0)
                inflight += 1
            started = time.monotonic()
            try:
                fut = self.rlog.submit(payload_pool[n % 64])
            except RaftLogError:
                with lock:
                    inflight -= 1
                    errors += 1
                time.sleep(0.01)
                continue
            fut.add_done_callback(functools.partial(on_done, started))
            n += 1
            if sample_rss and now - last_rss > 0.5:
                max_rss = max(max_rss, _rss_bytes())
                last_rss = now
        with lock:
            while inflight > 0:
                lock.wait(1.0)
        elapsed = time.monotonic() - t0
        return {
            "commits": done,
            "errors": errors,
            "elapsed_s": elapsed,
            "bytes": done * size,
            "latencies_s": latencies if req.get("return_latencies", True) else [],
            "cpu_s": _cpu_seconds() - cpu0,
            "max_rss_bytes": max(max_rss, _rss_bytes()),
        }


def _serve(listener: Listener, controller: Controller, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            conn = listener.accept()
        except OSError:
            return
        threading.Thread(target=_serve_conn, args=(conn, controller), daemon=True).start()


def _serve_conn(conn: Connection, controller: Controller) -> None:
    with conn:
        while True:
            try:
                req = conn.recv()
            except (EOFError, OSError):
                return
            try:
                conn.send(("ok", controller.handle(req)))
            except Exception as exc:  # answered to the caller as a typed failure, never dropped
                conn.send(("err", f"{type(exc).__name__}: {exc}"))


def _peer_tls(ca: str, cert: str, key: str) -> PeerTls | None:
    """The node's Raft TLS as the broker builds it (common/tls.py), from explicit files."""
    contexts = tls.peer_ssl(tls.load({"ca": ca, "cert": cert, "key": key}, environ={}))
    return None if contexts is None else PeerTls(*contexts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m raftlog.standalone")
    ap.add_argument("--id", required=True, help="this node's raft address host:port")
    ap.add_argument("--peers", required=True, help="comma-separated raft addresses of the others")
    ap.add_argument("--data", required=True, type=Path)
    ap.add_argument("--control-port", required=True, type=int)
    ap.add_argument("--flush", choices=[p.value for p in FlushPolicy], default="ASYNC_FLUSH")
    ap.add_argument("--batch-max-bytes", type=int, default=1 << 20)
    ap.add_argument("--segment-bytes", type=int, default=256 << 20)
    ap.add_argument(
        "--raft-impl",
        choices=["pysyncobj", "native"],
        default="native",
        help="which Raft runs the node: native (a broker group's), or pysyncobj (the controllers' "
        "ReplicatedLog; a broker group's before, for the upgrade test)",
    )
    ap.add_argument("--password", default=None, help="the Raft password (seals raft traffic)")
    ap.add_argument("--listen", default="", help="bind here instead of --id (native; a relay)")
    ap.add_argument("--tls-ca", default="", help="native: mutual TLS between the nodes (PEM)")
    ap.add_argument("--tls-cert", default="")
    ap.add_argument("--tls-key", default="")
    ap.add_argument("--log-level", default="INFO")
    args = ap.parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    cfg = RaftLogConfig(
        node_id=args.id,
        peers=tuple(p for p in args.peers.split(",") if p),
        data_dir=args.data,
        flush_policy=FlushPolicy(args.flush),
        batch_max_bytes=args.batch_max_bytes,
        segment_bytes=args.segment_bytes,
        password=args.password,
        listen=args.listen,
        tls=_peer_tls(args.tls_ca, args.tls_cert, args.tls_key),
    )
    rlog: ReplicatedLog | NativeLog = (
        NativeLog(cfg) if args.raft_impl == "native" else ReplicatedLog(cfg)
    )
    stop = threading.Event()
    listener = Listener(("127.0.0.1", args.control_port), authkey=AUTHKEY)
    threading.Thread(target=_serve, args=(listener, Controller(rlog), stop), daemon=True).start()

    def on_term(_sig: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    print(f"ready {args.id} control=127.0.0.1:{args.control_port}", flush=True)
    while not stop.wait(0.2):
        pass
    listener.close()
    rlog.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
