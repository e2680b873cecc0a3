"""Start, stop and watch the processes of a ClusterSpec on this machine (`raftmq cluster up`).

Each process writes stdout and stderr to <data_dir>/<name>/process.log; start waits for its ready
line and, if it never comes, fails naming the process and quoting its log. A `wrap` prefix runs
each process through another command (the chaos suite: `ip netns exec <ns>`; PDEATHSIG set before
the exec of `ip` carries over to the python it execs).

Children end with the runner (PR_SET_PDEATHSIG, SIGKILL of the runner included) unless the runner
is `detached`: then they live on in their own session until `raftmq cluster down`.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from raftmq.common import tls
from raftmq.common.auth_client import client_signer, signed
from raftmq.common.pb import broker_pb2, broker_pb2_grpc, common_pb2
from raftmq.ops import procs
from raftmq.ops.cluster_spec import ClusterSpec, ProcessSpec

STATUS_TIMEOUT_S = 2.0


class StartError(RuntimeError):
    """A process did not come up; the message names it and quotes its log."""

    def __init__(self, message: str, name: str = "", log: Path | None = None) -> None:
        super().__init__(message)
        self.name = name
        self.log = log


class StartCancelled(StartError):
    """Starting was called off (a stop signal) before every process was up."""


@dataclass
class Running:
    spec: ProcessSpec
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None


@dataclass(frozen=True, slots=True)
class NodeStatus:
    name: str
    group: str
    address: str
    pid: int
    alive: bool
    role: str  # LEADER / FOLLOWER / CANDIDATE / "-" (unreachable)
    term: int
    leader: str
    commit_index: int
    storage_error: str = ""  # "" = the node's disk takes writes
    disk_full: bool = False
    disk_pressure: str = ""  # why sends are refused (the disk guard); "" = accepted


def role_available(module: str) -> bool:
    """A role whose module is not in this build (e.g. the controller before it lands) is skipped."""
    return importlib.util.find_spec(module) is not None


class ClusterRunner:
    def __init__(
        self,
        spec: ClusterSpec,
        *,
        python: str = sys.executable,
        wrap: Callable[[ProcessSpec], Sequence[str]] | None = None,
        start_timeout_s: float = 60.0,
        detached: bool = False,
        cancelled: Callable[[], bool] = lambda: False,
        on_spawn: Callable[[Running], None] | None = None,
    ) -> None:
        self.spec = spec
        self._python = python
        self._wrap = wrap
        self._timeout = start_timeout_s
        self._detached = detached
        self._cancelled = cancelled
        self._on_spawn = on_spawn
        self.running: dict[str, Running] = {}
        self.skipped: list[str] = []

    def processes(self) -> list[ProcessSpec]:
        return self.spec.processes()

    def start_all(self, on_started: Callable[[ProcessSpec], None] | None = None) -> None:
        """Start every process in order (NameServers, controllers, brokers); on a failure stop
        what was started and raise StartError."""
        try:
            for p in self.processes():
                if not role_available(p.module):
                    self.skipped.append(p.name)
                    continue
                self.start(p.name)
                if on_started is not None:
                    on_started(p)
        except BaseException:
            self.stop_all()
            raise

    def _spec(self, name: str) -> ProcessSpec:
        for p in self.processes():
            if p.name == name:
                return p
        raise KeyError(f"no process named {name!r} in the cluster description")

    def start(self, name: str) -> Running:
        p = self._spec(name)
        p.data_dir.mkdir(parents=True, exist_ok=True)
        log = p.data_dir / "process.log"
        env = {**procs.child_env(), **dict(p.env)}  # secrets by environment, never in argv
        prefix = list(self._wrap(p)) if self._wrap is not None else []
        tie = not self._detached and procs.can_tie_to_parent()
        offset = log.stat().st_size if log.exists() else 0
        # PDEATHSIG through setpriv(1) where it exists: a preexec_fn makes Python fork() instead of
        # vfork(), which runs grpc's fork handlers in this (threaded, grpc-using) process and was
        # seen to abort it (epoll_wait: Bad file descriptor) once in five full runs.
        setpriv = shutil.which("setpriv") if tie else None
        tie_prefix = [setpriv, "--pdeathsig", "TERM", "--"] if setpriv else []
        with open(log, "ab") as out:
            popen = subprocess.Popen(
                [*tie_prefix, *prefix, self._python, *p.argv],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C in the terminal reaches only `cluster up`
                # Safe here despite threads: it only calls prctl, getppid and kill (no imports,
                # no locks); libc was looked up in the parent.
                preexec_fn=(  # noqa: PLW1509
                    procs.die_with_parent(os.getpid()) if tie and not setpriv else None
                ),
            )
        run = Running(p, popen, log)
        self.running[name] = run
        if self._on_spawn is not None:
            self._on_spawn(run)
        deadline = time.monotonic() + self._timeout
        while time.monotonic() < deadline and not self._cancelled():
            if _log_has(log, p.ready_prefix, offset):
                return run
            if popen.poll() is not None:
                break
            time.sleep(0.05)
        self.kill(name)
        if self._cancelled():
            raise StartCancelled(f"start of {name} called off", name, log)
        raise StartError(
            f"{name} did not start ({' '.join(p.argv)}); last lines of {log}:\n{tail(log)}",
            name,
            log,
        )

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """`sig` to one process; SIGTERM and SIGKILL also wait for it to end (escalating)."""
        run = self.running.get(name)
        if run is not None:
            procs.signal_child(run.popen, sig, grace_s=30.0)

    def restart(self, name: str) -> Running:
        self.kill(name)
        return self.start(name)

    def stop_all(self, timeout_s: float = 20.0) -> None:
        """SIGTERM everything (brokers first: they hand leadership off), then SIGKILL stragglers."""
        order = sorted(self.running.values(), key=lambda r: r.spec.role != "broker")
        procs.stop([run.popen for run in order], grace_s=timeout_s)

    def status(self) -> list[NodeStatus]:
        out = []
        for p in self.processes():
            run = self.running.get(p.name)
            pid = run.popen.pid if run is not None else 0
            alive = run is not None and run.alive
            if p.role != "broker" or not alive:
                out.append(
                    NodeStatus(p.name, p.group, f"{p.host}:{p.ports[0]}", pid, alive, "-", 0, "", 0)
                )
                continue
            out.append(broker_status(p.name, p.group, f"{p.host}:{p.ports[0]}", pid))
        return out


def broker_status(name: str, group: str, address: str, pid: int = 0) -> NodeStatus:
    try:
        with signed(tls.channel(address), client_signer()) as ch:
            st = broker_pb2_grpc.BrokerStub(ch).GetBrokerStatus(
                broker_pb2.GetBrokerStatusRequest(), timeout=STATUS_TIMEOUT_S
            )
    except grpc.RpcError:
        return NodeStatus(name, group, address, pid, pid != 0, "-", 0, "", 0)
    return NodeStatus(
        name,
        group,
        address,
        pid,
        True,
        common_pb2.Role.Name(st.role) if st.role else "-",
        st.term,
        st.leader_node_id,
        st.commit_index,
        st.storage_error,
        st.disk_full,
        st.disk_pressure,
    )


def _log_has(log: Path, prefix: str, offset: int) -> bool:
    try:
        with open(log, "rb") as f:
            f.seek(offset)
            return any(line.startswith(prefix.encode()) for line in f)
    except OSError:
        return False


def tail(log: Path, lines: int = 20) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
