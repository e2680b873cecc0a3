"""Real processes for tests: start a raftmq role on loopback, wait for its `started` line, stop it.

Tests use these instead of in-process servers so that what is tested is what a user runs.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from raftmq.ops import procs
from raftmq.ops.procs import PASSED_ENV
from tests.harness.local_cluster import free_ports

ROOT = Path(__file__).resolve().parents[2]  # the checkout: tests/harness/procs.py


@dataclass
class Proc:
    name: str
    argv: list[str]
    log: Path
    popen: subprocess.Popen[str] | None = None
    started_line: str = ""
    restarts: int = field(default=0)
    # Set in this process's environment over the test's (RAFTMQ_ ones included): how a test
    # plays one node of an older raftmq (broker/batch_version.py READS_ENV).
    env: dict[str, str] = field(default_factory=dict)

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def start(self, ready_prefix: str, timeout_s: float = 60.0) -> None:
        env = {
            k: v for k, v in os.environ.items() if not k.startswith("RAFTMQ_") or k in PASSED_ENV
        }
        env["PYTHONPATH"] = str(ROOT)
        env.update(self.env)
        with open(self.log, "a") as err:
            self.popen = subprocess.Popen(
                [sys.executable, *self.argv],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        assert self.popen.stdout is not None
        deadline = time.monotonic() + timeout_s
        line = ""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.popen.stdout], [], [], 0.5)
            if ready:
                line = self.popen.stdout.readline()
                break
            if self.popen.poll() is not None:
                break
        if not line.startswith(ready_prefix):
            self.kill()
            raise AssertionError(f"{self.name} did not start: {line!r}\n{self.tail()}")
        self.started_line = line.strip()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.popen is not None:
            procs.signal_child(self.popen, sig, grace_s=30.0)

    def stop(self) -> int | None:
        """SIGTERM and wait; the exit code."""
        self.kill(signal.SIGTERM)
        return self.popen.returncode if self.popen is not None else None

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def wait_until(
    predicate: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.05
) -> object:
    """Poll until `predicate()` is truthy (exceptions count as not yet); its value."""
    deadline = time.monotonic() + timeout_s
    last_exc: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except Exception as exc:
            last_exc = exc
        else:
            if value:
                return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (last: {last_exc!r})")


def namesrv_proc(tmp: Path, name: str, port: int, extra: Sequence[str] = ()) -> Proc:
    return Proc(
        name,
        ["-m", "raftmq.namesrv.server", "--listen", f"127.0.0.1:{port}", *extra],
        tmp / f"{name}.log",
    )


@dataclass
class GroupLayout:
    """Ports of one broker group of three nodes on loopback."""

    group: str
    grpc_ports: list[int]
    raft_ports: list[int]
    # The framed data path's ports. Given, so that every port a test's cluster listens on comes
    # from free_ports (outside the ephemeral range); empty: the broker binds an ephemeral one.
    data_ports: list[int] = field(default_factory=list)

    @property
    def members(self) -> str:
        return ",".join(
            f"n{i}=127.0.0.1:{g}/127.0.0.1:{r}"
            for i, (g, r) in enumerate(zip(self.grpc_ports, self.raft_ports, strict=True))
        )

    def address(self, i: int) -> str:
        return f"127.0.0.1:{self.grpc_ports[i]}"


def broker_procs(
    tmp: Path, layout: GroupLayout, namesrvs: Sequence[str], extra: Sequence[str] = ()
) -> list[Proc]:
    procs = []
    for i in range(len(layout.grpc_ports)):
        name = f"{layout.group}-n{i}"
        argv = [
            "-m",
            "raftmq.broker.server",
            "--broker-group",
            layout.group,
            "--node-id",
            f"n{i}",
            "--members",
            layout.members,
            "--data-dir",
            str(tmp / name),
            "--namesrv-addresses",
            ",".join(namesrvs),
            "--heartbeat-interval-ms",
            "1000",
            *(["--data-listen", f"127.0.0.1:{layout.data_ports[i]}"] if layout.data_ports else []),
            *extra,
        ]
        procs.append(Proc(name, argv, tmp / f"{name}.log"))
    return procs


@dataclass
class Cluster:
    """NameServers and broker groups of three nodes as real processes on loopback."""

    tmp: Path
    namesrvs: list[Proc]
    namesrv_addresses: list[str]
    groups: dict[str, tuple[GroupLayout, list[Proc]]]

    @property
    def namesrv(self) -> str:
        return ",".join(self.namesrv_addresses)

    def procs(self) -> list[Proc]:
        return [*self.namesrvs, *(p for _, ps in self.groups.values() for p in ps)]

    def wait_leaders(self, timeout_s: float = 60) -> None:
        """Until the NameServers route a leader for every broker group: a test that reads a
        route before that finds no writable queue (an admin call waits for the leader itself,
        up to admin.LEADER_WAIT_S)."""
        from raftmq.client.admin import Admin  # the harness stays importable without the SDK

        with Admin(self.namesrv) as admin:
            wait_until(
                lambda: (
                    {g.broker_group for g in admin.groups() if g.leader_address} >= set(self.groups)
                ),
                timeout_s,
                "a routed leader of every broker group",
            )

    def close(self) -> None:
        for p in self.procs():
            p.kill()


def start_cluster(
    tmp: Path,
    groups: Sequence[str] = ("broker-a", "broker-b"),
    namesrvs: int = 2,
    broker_args: Sequence[str] = (),
    broker_env: Mapping[str, Mapping[str, str]] | None = None,
) -> Cluster:
    """`broker_env`: a broker process's own environment by its name ("broker-a-n2")."""
    ports = free_ports(namesrvs + 9 * len(groups))
    ns_ports, rest = ports[:namesrvs], ports[namesrvs:]
    ns_procs = [
        namesrv_proc(tmp, f"ns{i}", p, ["--broker-expiry-ms", "5000", "--scan-interval-ms", "200"])
        for i, p in enumerate(ns_ports)
    ]
    addrs = [f"127.0.0.1:{p}" for p in ns_ports]
    layout: dict[str, tuple[GroupLayout, list[Proc]]] = {}
    for i, g in enumerate(groups):
        chunk = rest[9 * i : 9 * i + 9]
        gl = GroupLayout(g, chunk[:3], chunk[3:6], chunk[6:])
        layout[g] = (gl, broker_procs(tmp, gl, addrs, broker_args))
        for p in layout[g][1]:
            p.env.update((broker_env or {}).get(p.name, {}))
    cluster = Cluster(tmp, ns_procs, addrs, layout)
    try:
        for p in ns_procs:
            p.start("namesrv.started")
        for _, ps in layout.values():
            for p in ps:
                p.start("broker.started")
    except BaseException:
        cluster.close()
        raise
    return cluster


def python_prints(code: str, env: dict[str, str]) -> str:
    """What `python -c code` prints in a fresh interpreter with `env`, from the checkout: how
    the tests ask which implementation (compiled or twin) an environment selects."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout
