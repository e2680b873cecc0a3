"""Start, kill, restart and query standalone replicated-log processes on 127.0.0.1.

The harness of the raftlog tests and benchmarks: real processes, real ports, real files. It only
talks to 127.0.0.1 and every wait in it is bounded.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any

from raftmq.ops import procs
from tests.harness.standalone import AUTHKEY

# Ports handed to servers come from below the kernel's ephemeral range (32768-60999 on Linux):
# a port picked from that range and closed again can be taken by any process's outgoing
# connection before our server binds it ("address already in use" at start, seen in CI runs).
# Each pytest-xdist worker has its own slice, so two workers never hand out the same port; a
# port something listens on now is skipped. Below 24576 are the fixed ports of our own cluster
# files (ops/, deploy/, chaos/: 8080-13023 and 20911-21023).
_PORT_BASE = 24576
_PORT_SLICE = 4096  # ports per worker: 24576-28671 for gw0, 28672-32767 for gw1
_cursor: list[int] = []


def _slice_start() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) if worker.isdigit() else 0
    return _PORT_BASE + (index % 2) * _PORT_SLICE


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_ports(n: int) -> list[int]:
    """n distinct ports free a moment ago, none of them ever given out before by this process
    (until its slice wraps) and none in the ephemeral range."""
    start = _slice_start()
    if not _cursor:
        # Another pytest on this machine (another checkout) starts elsewhere in the slice.
        _cursor.append(os.getpid() % _PORT_SLICE)
    ports: list[int] = []
    for _ in range(_PORT_SLICE):
        port = start + _cursor[0]
        _cursor[0] = (_cursor[0] + 1) % _PORT_SLICE
        if _bindable(port):
            ports.append(port)
            if len(ports) == n:
                return ports
    raise RuntimeError(f"no {n} free ports in {start}-{start + _PORT_SLICE - 1}")


class ControlError(RuntimeError):
    pass


@dataclass
class NodeProc:
    raft_addr: str
    control_port: int
    data_dir: Path
    log_path: Path
    listen: str = ""  # where the node binds when a relay holds raft_addr
    proc: subprocess.Popen[bytes] | None = None
    conn: Connection | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class LocalCluster:
    """n nodes under `root`; node i keeps its data in root/node<i>."""

    root: Path
    size: int = 3
    flush: str = "ASYNC_FLUSH"
    extra_args: tuple[str, ...] = ()
    # Each node binds a port of its own and its Raft address is left to the test (a relay that
    # records the bytes between the nodes: tests/raftlog/test_native_tls.py).
    relayed: bool = False
    nodes: list[NodeProc] = field(default_factory=list)

    def __post_init__(self) -> None:
        per = 3 if self.relayed else 2
        ports = free_ports(per * self.size)
        for i in range(self.size):
            d = self.root / f"node{i}"
            mine = ports[per * i : per * (i + 1)]
            self.nodes.append(
                NodeProc(
                    f"127.0.0.1:{mine[0]}",
                    mine[1],
                    d,
                    self.root / f"node{i}.log",
                    listen=f"127.0.0.1:{mine[2]}" if self.relayed else "",
                )
            )

    def start(self, i: int) -> None:
        self._spawn(i)
        self._connect(i)

    def start_all(self) -> None:
        """Every node's process at once, then each one's control port: the starts (mostly
        imports) overlap instead of adding up."""
        for i in range(self.size):
            self._spawn(i)
        for i in range(self.size):
            self._connect(i)

    def _spawn(self, i: int) -> None:
        n = self.nodes[i]
        assert not n.alive, f"node {i} already runs"
        peers = ",".join(m.raft_addr for m in self.nodes if m is not n)
        cmd = [
            sys.executable,
            "-m",
            "tests.harness.standalone",
            "--id",
            n.raft_addr,
            "--peers",
            peers,
            "--data",
            str(n.data_dir),
            "--control-port",
            str(n.control_port),
            "--flush",
            self.flush,
            *(("--listen", n.listen) if n.listen else ()),
            *self.extra_args,
        ]
        self.root.mkdir(parents=True, exist_ok=True)
        logf = open(n.log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
        try:
            n.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=_child_env())
        finally:
            logf.close()
        n.conn = None

    def _connect(self, i: int) -> None:
        n = self.nodes[i]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if not n.alive:
                raise ControlError(f"node {i} exited at start; see {n.log_path}:\n{self.tail(i)}")
            try:
                n.conn = Client(("127.0.0.1", n.control_port), authkey=AUTHKEY)
                return
            except OSError:
                time.sleep(0.05)
        raise ControlError(f"node {i} did not open its control port; see {n.log_path}")

    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        n = self.nodes[i]
        if n.conn is not None:
            n.conn.close()
            n.conn = None
        if n.proc is not None:
            procs.signal_child(n.proc, sig, grace_s=15.0)

    def stop(self, i: int) -> None:
        self.kill(i, signal.SIGTERM)

    def wipe(self, i: int) -> None:
        assert not self.nodes[i].alive
        shutil.rmtree(self.nodes[i].data_dir, ignore_errors=True)

    def close(self) -> None:
        for i in range(self.size):
            self.kill(i)

    def call(self, i: int, req: dict[str, Any], timeout_s: float = 60.0) -> Any:
        n = self.nodes[i]
        if n.conn is None:
            raise ControlError(f"node {i} is not running")
        with n.lock:  # one request/answer at a time per pipe, whichever thread asks
            conn = n.conn
            if conn is None:
                raise ControlError(f"node {i} is not running")
            conn.send(req)
            if not conn.poll(timeout_s):
                n.conn = None  # an unanswered pipe is out of step; the next call reconnects
                conn.close()
                raise ControlError(f"node {i} did not answer {req['op']} within {timeout_s}s")
            status, value = conn.recv()
        if status != "ok":
            raise ControlError(f"node {i}: {value}")
        return value

    def status(self, i: int) -> dict[str, Any]:
        return dict(self.call(i, {"op": "status"}, timeout_s=10))

    def leader(self, timeout_s: float = 10.0, exclude: frozenset[int] = frozenset()) -> int:
        """Index of a node that is leader with its no-op applied (ready to take writes)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for i, n in enumerate(self.nodes):
                if i in exclude or not n.alive:
                    continue
                try:
                    if self.status(i)["leader_ready"]:
                        return i
                except (ControlError, OSError, EOFError):
                    continue
            time.sleep(0.02)
        raise ControlError(f"no ready leader within {timeout_s}s")

    def read_all(self, i: int, upto: int) -> list[tuple[int, int, tuple[bytes, ...]]]:
        """Every committed entry of node i from its first index through `upto`."""
        out: list[tuple[int, int, tuple[bytes, ...]]] = []
        start = self.status(i)["first_index"]
        while start <= upto:
            batch = self.call(i, {"op": "read_from", "start": start, "max_entries": 2000})
            if not batch:
                break
            out.extend(e for e in batch if e[0] <= upto)
            start = batch[-1][0] + 1
        return out

    def tail(self, i: int, lines: int = 30) -> str:
        try:
            return "\n".join(
                self.nodes[i].log_path.read_text(errors="replace").splitlines()[-lines:]
            )
        except OSError:
            return ""

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env
