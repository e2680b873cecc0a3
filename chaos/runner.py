"""Runs one chaos scenario end to end: a network namespace per cluster process (chaos/netns.py),
the cluster started from its description (client/cluster_runner.py) inside them, the workload in
the client namespace, the nemesis executing the seeded schedule, then heal, drain, check and
report. Everything started is stopped and every fault healed in `finally`, even on Ctrl-C.
The harness talks to the nodes out of band through the bridge's own address (never blocked)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from raftmq.chaos.checkers import (
    CheckReport,
    NodeView,
    check_all,
    check_leadership,
    check_rejoined,
)
from raftmq.chaos.disks import TmpfsDisks
from raftmq.chaos.history import Recorder, fault_windows, load_jsonl, merge, write_jsonl
from raftmq.chaos.lifecycle_checks import check_lifecycle
from raftmq.chaos.netfaults import NetFaults
from raftmq.chaos.netns import Net
from raftmq.chaos.report import plot, write_result
from raftmq.chaos.scenarios import (
    FOLLOWER,
    GROUP,
    LEADER,
    STORAGE_FAULTS,
    FaultSpec,
    Kind,
    Scenario,
    Schedule,
    by_name,
)
from raftmq.chaos.storage_faults import StorageFaultError, StorageFaults
from raftmq.chaos.workload import CONSUMER_GROUP
from raftmq.client.admin import Admin
from raftmq.common import tls
from raftmq.common.acl import parse_entries
from raftmq.common.auth import ENV_ACCESS_KEY, ENV_SECRET_KEY, Credentials, Signer
from raftmq.common.auth_client import signed
from raftmq.common.delay import DelayPolicy
from raftmq.common.errors import RaftMQError
from raftmq.common.pb import broker_pb2, broker_pb2_grpc
from raftmq.common.retry import RetryPolicy
from raftmq.controller.balance import preferred_node
from raftmq.ops import certs
from raftmq.ops.cluster_runner import ClusterRunner, broker_status
from raftmq.ops.cluster_spec import ClusterSpec, Endpoint, TlsSpec, load
from raftmq.ops.procs import child_env

CHAOS_CLUSTER = Path(__file__).resolve().parent / "cluster.toml"
CLIENT = "client"
TOPIC = "chaos"
PROXY_PORT = 8081  # a scenario's raftmq-proxy when the description has none (RocketMQ's port)
FAILOVER_BOUND_S = 3.0  # service must return this soon after a fault that leaves a majority
REJOIN_S = 15.0  # after the drain, every group node follows the leader and reaches its commit


class RunError(RuntimeError):
    """The harness could not run the scenario (setup, cluster start, workload): not a verdict."""


@dataclass(frozen=True, slots=True)
class RunOptions:
    scenario: str
    seed: int = 1
    duration_s: float | None = None
    out_dir: Path = Path("chaos-results")
    cluster: Path = CHAOS_CLUSTER
    rate_per_s: float = 20.0
    ack_before_commit: bool = False  # debug build: acknowledge before commit (checker self-test)


@dataclass(slots=True)
class RunResult:
    schedule: Schedule
    report: CheckReport
    failover: list[dict[str, Any]]
    verdict: str
    passed: bool
    result_path: Path
    png_path: Path
    history_path: Path
    extra: dict[str, Any] = field(default_factory=dict)


class Nemesis:
    """Applies and heals the faults of a schedule. Network faults of overlapping windows are
    combined (the table always holds the union of the active ones); process faults are signals
    to the node's process (ip netns exec replaces itself with python, so the pid is the node)."""

    def __init__(
        self,
        net: Net,
        runner: ClusterRunner,
        group: str,
        recorder: Recorder,
        pick: Callable[[list[str]], str],
        console: Console,
        disks: TmpfsDisks | None = None,
        storage: StorageFaults | None = None,
    ) -> None:
        self.net = net
        self.storage = storage  # the storage fault step (storage fault scenarios only)
        self.disks = disks  # the group nodes' small data disks (full-disk scenarios only)
        self.runner = runner
        self.group = group
        self.rec = recorder
        self.pick = pick
        self.console = console
        self.hosts = [p.name for p in runner.processes()] + [CLIENT]
        self.group_nodes = [p.name for p in runner.processes() if p.group == group]
        self._net_active: dict[int, NetFaults] = {}
        self._targets: dict[int, list[str]] = {}
        self._paused: set[str] = set()
        self._killed: set[str] = set()
        self._delayed: set[str] = set()
        self._filled: set[str] = set()

    # ---- roles --------------------------------------------------------------------------------

    def leader(self, timeout_s: float = 15.0) -> str:
        """The group node that says it leads with the highest term (a deposed leader may still
        believe it leads for a moment: the higher term is the real one)."""
        deadline = time.monotonic() + timeout_s
        while True:
            best = ("", -1)
            for p in self.runner.processes():
                if p.group != self.group or p.name in self._paused or p.name in self._killed:
                    continue
                st = broker_status(p.name, p.group, f"{p.host}:{p.ports[0]}")
                if st.role == "LEADER" and st.term > best[1]:
                    best = (p.name, st.term)
            if best[0]:
                return best[0]
            if time.monotonic() > deadline:
                raise RunError(f"no leader of {self.group} within {timeout_s:g} s")
            time.sleep(0.1)

    def leadership(self, timeout_s: float = 15.0) -> tuple[str, int]:
        """The group's leader and its term, as that leader reports them."""
        name = self.leader(timeout_s)
        p = next(p for p in self.runner.processes() if p.name == name)
        return name, int(broker_status(p.name, p.group, f"{p.host}:{p.ports[0]}").term)

    def resolve(self, target: str) -> list[str]:
        if target == LEADER:
            return [self.leader()]
        if target == FOLLOWER:
            lead = self.leader()
            return [self.pick(sorted(n for n in self.group_nodes if n != lead))]
        if target == GROUP:
            return list(self.group_nodes)
        if target not in self.hosts:
            raise RunError(f"fault target {target!r} is not a host of this cluster")
        return [target]

    # ---- faults -------------------------------------------------------------------------------

    def _apply_net(self) -> None:
        total = NetFaults.none()
        for f in self._net_active.values():
            total = total.union(f)
        self.net.apply(total)

    def _others(self, node: str) -> list[str]:
        return [n for n in self.group_nodes if n != node]

    def _net_fault(self, f: FaultSpec, t: str) -> NetFaults | None:
        if f.kind in (Kind.ISOLATE, Kind.CRASH):
            return NetFaults.isolate(t, self.hosts)
        if f.kind is Kind.SPLIT:
            return NetFaults.partition([[t], self._others(t)], self.hosts)
        if f.kind is Kind.ONE_WAY_OUT:
            out = NetFaults.none()
            for o in self._others(t):
                out = out.union(NetFaults.one_way(t, o))
            return out
        if f.kind is Kind.ONE_WAY_IN:
            out = NetFaults.none()
            for o in self._others(t):
                out = out.union(NetFaults.one_way(o, t))
            return out
        if f.kind is Kind.CLIENT_CUT:
            return NetFaults.partition([[CLIENT], [t]], self.hosts)
        if f.kind is Kind.LOSS:
            return NetFaults.none().with_loss(t, f.loss_pct)
        return None

    def start(self, index: int, f: FaultSpec) -> None:
        targets = [t for target in [f.target] for t in self.resolve(target)]
        self._targets[index] = targets
        self.rec.record(
            "nemesis", "info", "nemesis", {"fault": f.name, "targets": targets, "phase": "start"}
        )
        self.console.log(f"[yellow]fault[/] {f.name} -> {', '.join(targets)}")
        nets = [n for t in targets if (n := self._net_fault(f, t)) is not None]
        if nets:
            combined = NetFaults.none()
            for n in nets:
                combined = combined.union(n)
            self._net_active[index] = combined
            self._apply_net()
        for t in targets:
            if f.kind in (Kind.KILL, Kind.CRASH):
                self.runner.kill(t, signal.SIGKILL)
                self._killed.add(t)
            elif f.kind is Kind.PAUSE:
                self.runner.kill(t, signal.SIGSTOP)
                self._paused.add(t)
            elif f.kind is Kind.DELAY:
                self.net.delay(t, f.delay_ms, f.jitter_ms)
                self._delayed.add(t)
            elif f.kind in STORAGE_FAULTS:
                if self.storage is None:
                    raise RunError(f"{f.name} needs the storage fault step")
                self.storage.inject(f.kind.value, t, self.leader())
            elif f.kind is Kind.DISK_FULL:
                if self.disks is None or t not in self.disks.data_dirs:
                    raise RunError(f"{t} has no small data disk to fill")
                self.disks.fill(t)
                self._filled.add(t)

    def stop(self, index: int, f: FaultSpec) -> None:
        targets = self._targets.pop(index, [])
        if self._net_active.pop(index, None) is not None:
            self._apply_net()
        for t in targets:
            if t in self._paused:
                self.runner.kill(t, signal.SIGCONT)
                self._paused.discard(t)
            if t in self._delayed:
                self.net.clear_delay(t)
                self._delayed.discard(t)
            if t in self._filled and self.disks is not None:
                self.disks.free(t)
                self._filled.discard(t)
        dead = [t for t in targets if t in self._killed]
        for t in dead:
            self.runner.start(t)
            self._killed.discard(t)
        self.rec.record(
            "nemesis", "info", "nemesis", {"fault": f.name, "targets": targets, "phase": "stop"}
        )
        self.console.log(f"[green]healed[/] {f.name}")

    def heal_all(self) -> None:
        """The final generator: resume, clear, rejoin and restart everything, whatever failed."""
        for t in list(self._paused):
            self.runner.kill(t, signal.SIGCONT)
        self._paused.clear()
        for t in list(self._delayed):
            self.net.clear_delay(t)
        self._delayed.clear()
        if self.disks is not None:
            self.disks.free_all()
        self._filled.clear()
        self._net_active.clear()
        self.net.heal()
        for t in list(self._killed):
            self.runner.start(t)
        self._killed.clear()


def _events(schedule: Schedule) -> list[tuple[float, int, bool, FaultSpec]]:
    """(seconds after start, fault index, is_start, fault), stops before starts at a tie."""
    ev = [(f.start_s, i, True, f) for i, f in enumerate(schedule.faults)]
    ev += [(f.end_s, i, False, f) for i, f in enumerate(schedule.faults)]
    return sorted(ev, key=lambda e: (e[0], e[2]))


def _chaos_spec(opts: RunOptions, scenario: Scenario, keys: RunKeys | None = None) -> ClusterSpec:
    spec = load(opts.cluster)
    if scenario.proxy and not spec.proxies:
        # Started by the runner like every role (after the brokers), in its own namespace.
        spec = replace(spec, proxies=(Endpoint("127.0.0.1", PROXY_PORT),))
    if opts.ack_before_commit or scenario.settings:
        settings = {k: dict(v) for k, v in spec.settings.items()}
        for section, values in scenario.settings.items():
            settings.setdefault(section, {}).update(values)
        if opts.ack_before_commit:
            settings.setdefault("broker", {})["debug_ack_before_commit"] = True
        spec = replace(spec, settings=settings)
    if scenario.secure:
        spec = secure_spec(spec, RunPaths(opts.out_dir).certs, keys or RunKeys.new())
    return spec.with_data_dir(RunPaths(opts.out_dir).data)


ADMIN_ACCESS_KEY = "chaos-admin"
WORKLOAD_USER = "chaos-workload"
# What the workload's user may do: send to and consume the topic, in its consumer group.
WORKLOAD_POLICY = (f"Topic:{TOPIC}=Pub,Sub", f"Group:{CONSUMER_GROUP}=Sub")
ACL_REFRESH_MS = 500  # how stale a node's users and policies may get (a run lasts a minute)


@dataclass(frozen=True, slots=True)
class RunKeys:
    """A secure run's credentials, new each run: the admin of the description and the user
    the workload signs as (created with the ACL API `raftmq acl` uses)."""

    admin: Credentials
    user: Credentials

    @classmethod
    def new(cls) -> RunKeys:
        return cls(
            Credentials(ADMIN_ACCESS_KEY, secrets.token_urlsafe(24)),
            Credentials(WORKLOAD_USER, secrets.token_urlsafe(24)),
        )


def secure_spec(spec: ClusterSpec, certs_dir: Path, keys: RunKeys) -> ClusterSpec:
    """The description with security on, whatever its own [security] said: mutual TLS
    ([security.tls] in certs_dir, a client certificate required; the run's certificates) and
    [security.auth] with the run's admin (every request signed, checked against the ACL)."""
    auth = {
        "auth_enabled": True,
        "auth_admin_access_key": keys.admin.access_key,
        "auth_admin_secret_key": keys.admin.secret_key,
        "acl_refresh_ms": ACL_REFRESH_MS,
    }
    return replace(spec, tls=TlsSpec(certs_dir, certs_dir / certs.CA_CERT, True), auth=auth)


def make_certs(spec: ClusterSpec) -> list[Path]:
    """The CA and every certificate of the description as `raftmq cluster certs` makes them,
    for the hosts the spec has now (the namespace IPs after with_hosts): the shipped
    description's certificates name 127.0.0.1, which no process of the chaos cluster is on."""
    if spec.tls is None:
        raise RunError("make_certs needs a description with [security.tls] (secure_spec)")
    written = certs.write_certs(spec.tls.dir, certs.cert_requests(spec), days=2)
    spec.check_tls_files()
    return written


def client_env(spec: ClusterSpec, creds: Credentials | None = None) -> dict[str, str]:
    """RAFTMQ_TLS_* (the `client` certificate) and RAFTMQ_ACCESS_KEY / RAFTMQ_SECRET_KEY of a
    client: the SDK reads them when given no tls_* or credentials argument."""
    env: dict[str, str] = {}
    if spec.tls is not None:
        env |= {
            tls.ENV_PREFIX + "CA": str(spec.tls.ca),
            tls.ENV_PREFIX + "CERT": str(spec.tls.cert(CLIENT)),
            tls.ENV_PREFIX + "KEY": str(spec.tls.key(CLIENT)),
        }
    if creds is not None:
        env |= {ENV_ACCESS_KEY: creds.access_key, ENV_SECRET_KEY: creds.secret_key}
    return env


def client_material(spec: ClusterSpec) -> tls.Tls | None:
    """The `client` certificate's material (the harness's Admin and status calls); None
    without [security.tls]."""
    return tls.load(environ=client_env(spec)) if spec.tls is not None else None


@contextlib.contextmanager
def _harness_env(env: Mapping[str, str]) -> Iterator[None]:
    """This process's RAFTMQ_* for the run (the harness's Admin and status calls sign with
    them, as `raftmq cluster up` does), restored afterwards."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


PROBE_TIMEOUT_S = 3.0


def _status_call(address: str, material: tls.Tls | None, creds: Credentials | None) -> str:
    """A broker status call from a client with this TLS material (None: plaintext) signed with
    creds (None: unsigned): "OK" or the gRPC status code's name."""
    try:
        signer = Signer(creds) if creds is not None else None  # None: unsigned, not env's
        with signed(tls.channel(address, tls=material), signer) as ch:
            broker_pb2_grpc.BrokerStub(ch).GetBrokerStatus(
                broker_pb2.GetBrokerStatusRequest(), timeout=PROBE_TIMEOUT_S
            )
    except grpc.RpcError as exc:
        code = exc.code() if hasattr(exc, "code") else None
        return code.name if code is not None else "ERROR"
    return "OK"


def security_probes(spec: ClusterSpec, address: str, keys: RunKeys) -> dict[str, bool]:
    """Calls to a broker that security must refuse, and one it must serve: plaintext, TLS
    without a client certificate, a client certificate but unsigned, signed by the workload's
    user (no Get on the cluster: PERMISSION_DENIED), signed by the admin (served)."""
    assert spec.tls is not None
    no_cert = tls.load({"ca": str(spec.tls.ca)}, environ={})
    cert = client_material(spec)
    return {
        "plaintext_refused": _status_call(address, None, keys.admin) != "OK",
        "no_client_cert_refused": _status_call(address, no_cert, keys.admin) != "OK",
        "unsigned_refused": _status_call(address, cert, None) == "UNAUTHENTICATED",
        "user_denied_admin_call": _status_call(address, cert, keys.user) == "PERMISSION_DENIED",
        "admin_served": _status_call(address, cert, keys.admin) == "OK",
    }


def _workload_user(admin: Admin, spec: ClusterSpec, keys: RunKeys, timeout_s: float = 30.0) -> None:
    """Create the workload's user with WORKLOAD_POLICY (the ACL API `raftmq acl` uses), then
    wait until the NameServer knows it (a route lookup signed as the user); the brokers refresh
    on the same interval, well before the first fault."""
    admin.acl.create_user(keys.user.access_key, keys.user.secret_key)
    admin.acl.set_policy(keys.user.access_key, parse_entries(WORKLOAD_POLICY))
    deadline = time.monotonic() + timeout_s
    with Admin(spec.namesrv_addresses, credentials=keys.user) as as_user:
        while True:
            try:
                as_user.route(TOPIC)
                break
            except RaftMQError as exc:
                if time.monotonic() > deadline:
                    raise RunError(f"the workload's user is not known: {exc.message}") from exc
            time.sleep(0.2)
    time.sleep(3 * ACL_REFRESH_MS / 1000)  # every broker's copy refreshed too


def retry_delays_s(scenario: Scenario) -> list[float]:
    """The back-off of retry n (n = earlier failures) under the scenario's delay levels."""
    text = scenario.settings.get("broker", {}).get("delay_levels")
    policy = RetryPolicy(delay=DelayPolicy.from_text(str(text)) if text else DelayPolicy())
    out = []
    for n in range(policy.delay.max_level):
        level = policy.delay_level(n)
        out.append(policy.delay.level_delay_ms(level) / 1000)
        if level >= policy.delay.max_level:
            break
    return out


def _start_workload(
    net: Net,
    spec: ClusterSpec,
    history: Path,
    rate: float,
    mode: str = "queue",
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[str]:
    argv = [
        *net.wrap(CLIENT),
        sys.executable,
        "-m",
        "raftmq.chaos.workload",
        "--namesrv",
        spec.namesrv_addresses,
        "--topic",
        TOPIC,
        "--out",
        str(history),
        "--rate",
        str(rate),
        "--mode",
        mode,
    ]
    if mode == "proxy":  # the official client reaches the cluster through the first proxy
        if not spec.proxies:
            raise RunError("the proxy workload needs a [[proxy]] in the cluster description")
        argv += ["--proxy", str(spec.proxies[0])]
    log = open(history.with_suffix(".log"), "w")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        argv,
        env={**child_env(), **(env or {})},  # child_env drops RAFTMQ_*: these come after it
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    line = _readline(proc, 60.0)
    if line.strip() != "ready":
        proc.kill()
        raise RunError(
            f"the workload did not start (said {line.strip()!r}); see {history.with_suffix('.log')}"
        )
    return proc


def _readline(proc: subprocess.Popen[str], timeout_s: float) -> str:
    """One stdout line, or "" after timeout_s (a reader thread keeps the wait bounded)."""
    out: list[str] = []
    assert proc.stdout is not None
    stream = proc.stdout
    th = threading.Thread(target=lambda: out.append(stream.readline()), daemon=True)
    th.start()
    th.join(timeout_s)
    return out[0] if out else ""


def within_bound(report: CheckReport, schedule: Schedule) -> list[dict[str, Any]]:
    """Each fault window's figures, with whether its service gap respected the bound (only
    windows that leave the client a majority are bound: others wait for the heal by design)."""
    out = []
    for w, f in zip(report.windows, schedule.faults, strict=False):
        out.append(
            {
                **w.to_json(),
                "majority_remains": f.majority_remains,
                "within_bound": (not f.majority_remains) or w.longest_gap_s <= FAILOVER_BOUND_S,
            }
        )
    return out


@dataclass(frozen=True, slots=True)
class RunPaths:
    """Everything a run writes, all inside its directory."""

    out_dir: Path

    @property
    def data(self) -> Path:
        return self.out_dir / "data"

    @property
    def history(self) -> Path:
        return self.out_dir / "history.jsonl"

    @property
    def client_history(self) -> Path:
        return self.out_dir / "history-client.jsonl"

    @property
    def client_log(self) -> Path:
        return self.client_history.with_suffix(".log")

    @property
    def result(self) -> Path:
        return self.out_dir / "result.json"

    @property
    def picture(self) -> Path:
        return self.out_dir / "acks.png"

    @property
    def certs(self) -> Path:
        """A secure scenario's CA and certificates (made for this run's namespace IPs)."""
        return self.out_dir / "certs"

    def outputs(self) -> tuple[Path, ...]:
        return (
            self.data,
            self.history,
            self.client_history,
            self.client_log,
            self.result,
            self.picture,
            self.certs,
        )

    def fresh(self) -> None:
        """Leave nothing of an earlier run of the same scenario and seed: reusing its `data`
        would hand the new cluster the old topic, whose messages carry the same ids (the
        checker then sees every old one as a duplicate or an out-of-order delivery)."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for path in self.outputs():
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)


def run(opts: RunOptions, console: Console | None = None) -> RunResult:
    console = console or Console(stderr=True)
    scenario = by_name(opts.scenario)
    schedule = scenario.schedule(opts.seed, opts.duration_s)
    paths = RunPaths(opts.out_dir)
    paths.fresh()
    keys = RunKeys.new() if scenario.secure else None
    spec = _chaos_spec(opts, scenario, keys)
    groups = list(spec.groups)
    if not groups:
        raise RunError(f"{opts.cluster} describes no broker group")
    group = groups[0]
    names = [p.name for p in spec.processes()]
    client_history = paths.client_history
    security: dict[str, bool] | None = None  # the probes of a secure scenario
    storage_problems: list[str] = []  # storage faults unreported, unrepaired, replicas differing
    rejoin_problem: str | None = None  # a node not back in its group after the heal
    rec = Recorder()
    rng_pick = random.Random(opts.seed ^ 0x5EED)
    t_setup = time.monotonic()
    disks = (
        TmpfsDisks({p.name: p.data_dir for p in spec.processes() if p.group == group})
        if any(f.kind is Kind.DISK_FULL for f in schedule.faults)
        else None
    )
    with Net([*names, CLIENT]) as net, disks or contextlib.nullcontext():
        spec = spec.with_hosts({n: net.ip(n) for n in names})
        if scenario.secure:  # after with_hosts: the certificates name the namespace IPs
            make_certs(spec)
        runner = ClusterRunner(spec, wrap=lambda p: net.wrap(p.name))
        storage = (
            StorageFaults(runner, group, TOPIC, spec.namesrv_addresses, console, opts.seed)
            if any(f.kind in STORAGE_FAULTS for f in schedule.faults)
            else None
        )
        nemesis = Nemesis(net, runner, group, rec, rng_pick.choice, console, disks, storage)
        workload: subprocess.Popen[str] | None = None
        stack = contextlib.ExitStack()  # the harness's signing environment of a secure run
        try:
            if keys is not None:
                tls.install(client_material(spec))  # the harness's Admin and status calls
                stack.enter_context(_harness_env(client_env(spec, keys.admin)))
            console.log(f"starting {len(names)} processes in namespaces ({net.control_ip}/24)")
            runner.start_all()
            with Admin(spec.namesrv_addresses, controllers=spec.controller_addresses) as admin:
                lead = nemesis.leader(30.0)
                _create_topic(admin, group)
                _wait_route(admin)
                if keys is not None:
                    _workload_user(admin, spec, keys)
            if keys is not None:
                lp = next(p for p in runner.processes() if p.name == lead)
                security = security_probes(spec, f"{lp.host}:{lp.ports[0]}", keys)
                console.log(f"security probes of {lead}: {security}")
            workload = _start_workload(
                net, spec, client_history, opts.rate_per_s, scenario.workload,
                client_env(spec, keys.user if keys is not None else None),
            )  # fmt: skip
            if scenario.leader_stays:  # the controller's hand-back is not the fault's doing
                _wait_preferred_leader(nemesis, spec, group, console)
            before = nemesis.leadership() if scenario.leader_stays else None
            t0 = time.monotonic()
            console.log(
                f"[bold]{schedule.scenario}[/] seed={schedule.seed}: producing for "
                f"{schedule.produce_s:g} s, {len(schedule.faults)} fault(s)"
            )
            with Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TimeRemainingColumn(),
                console=console,
                transient=True,
            ) as bar:
                task = bar.add_task(schedule.scenario, total=schedule.produce_s)
                for at, idx, is_start, f in _events(schedule):
                    _sleep_until(t0 + at, lambda: bar.update(task, completed=time.monotonic() - t0))
                    if workload.poll() is not None:
                        raise RunError("the workload exited during the run; see its log")
                    (nemesis.start if is_start else nemesis.stop)(idx, f)
                _sleep_until(
                    t0 + schedule.produce_s,
                    lambda: bar.update(task, completed=time.monotonic() - t0),
                )
            # every fault ended RECOVERY_S ago: a returning node has had its chance to disturb
            after = nemesis.leadership() if before is not None else None
            nemesis.heal_all()
            console.log("draining")
            assert workload.stdin is not None
            workload.stdin.write("drain\n")
            workload.stdin.flush()
            line = _readline(workload, 90.0)
            if not line.startswith("drained"):
                raise RunError(f"the workload did not drain (said {line.strip()!r})")
            workload.wait(timeout=30)
            rejoin_problem = wait_rejoined(runner, group)
            if storage is not None:  # every replica serves the same message at every offset
                storage.close()
                storage_problems = storage.problems() + storage.compare_replicas(queues=4)
        except StorageFaultError as exc:
            raise RunError(f"the storage fault could not be made: {exc}") from exc
        finally:
            if storage is not None:
                storage.close()
            if workload is not None and workload.poll() is None:
                workload.kill()
                workload.wait(timeout=10)
            try:
                nemesis.heal_all()
            finally:
                runner.stop_all()
                if keys is not None:
                    tls.uninstall()
                stack.close()
    ops = merge(load_jsonl(client_history), rec.ops)
    history_path = paths.history
    write_jsonl(history_path, ops)
    windows = fault_windows(ops)
    report = check_all(ops, windows, scenario=schedule.scenario, seed=schedule.seed)
    failover = within_bound(report, schedule)
    lifecycle = check_lifecycle(ops, scenario.workload, retry_delays_s=retry_delays_s(scenario))
    passed = report.valid and all(w["within_bound"] for w in failover)
    worst = max((w["longest_gap_s"] for w in failover if w["majority_remains"]), default=None)
    verdict = report.verdict()
    if lifecycle is not None:
        passed = passed and lifecycle.valid
        if not lifecycle.valid:
            verdict = verdict.replace("PASS", "FAIL", 1)
        verdict += f"; {lifecycle.summary()}"
    if not all(w["within_bound"] for w in failover):
        verdict = verdict.replace("PASS", "FAIL", 1)
        verdict += f"; service gap {worst} s > {FAILOVER_BOUND_S:g} s bound"
    if security is not None and not all(security.values()):
        passed = False
        bad = ", ".join(k for k, ok in security.items() if not ok)
        verdict = verdict.replace("PASS", "FAIL", 1) + f"; security probe failed: not {bad}"
    if storage_problems:
        passed = False
        verdict = verdict.replace("PASS", "FAIL", 1) + "; " + "; ".join(storage_problems[:5])
    leadership_problem = (
        check_leadership(before, after) if before is not None and after is not None else None
    )
    if leadership_problem is not None:
        passed = False
        verdict = verdict.replace("PASS", "FAIL", 1) + f"; {leadership_problem}"
    if rejoin_problem is not None:
        passed = False
        verdict = verdict.replace("PASS", "FAIL", 1) + f"; not rejoined: {rejoin_problem}"
    result_path = paths.result
    png_path = paths.picture
    extra = {
        "failover": failover,
        "failover_bound_s": FAILOVER_BOUND_S,
        "worst_failover_gap_s": worst,
        "passed": passed,
        "ack_before_commit": opts.ack_before_commit,
        "wall_s": round(time.monotonic() - t_setup, 1),
        "rejoined": rejoin_problem is None,
        **({"rejoin_problem": rejoin_problem} if rejoin_problem is not None else {}),
        **({"leadership": {"before": before, "after": after}} if before is not None else {}),
        **({"lifecycle": lifecycle.to_json()} if lifecycle is not None else {}),
        **(
            {
                "storage_faults": {
                    "faults": [w.to_json() for w in storage.watches],
                    "replica_slots": storage.compared,
                    "problems": storage_problems,
                }
            }
            if storage is not None
            else {}
        ),
        **(
            {"security": {"mutual_tls": True, "auth": True, **security}}
            if security is not None
            else {}
        ),
    }
    write_result(result_path, _schedule_json(schedule), report, extra)
    plot(ops, windows, png_path, f"{schedule.scenario} seed={schedule.seed}")
    return RunResult(schedule, report, failover, verdict, passed, result_path, png_path,
                     history_path, extra)  # fmt: skip


def wait_rejoined(runner: ClusterRunner, group: str, timeout_s: float = REJOIN_S) -> str | None:
    """Polls the group's nodes until check_rejoined holds (the target is the leader's commit
    index when first seen); its last complaint if it still fails after timeout_s."""
    deadline = time.monotonic() + timeout_s
    target: int | None = None
    while True:
        views = []
        for p in runner.processes():
            if p.group == group:
                st = broker_status(p.name, p.group, f"{p.host}:{p.ports[0]}")
                views.append(
                    NodeView(p.name, st.role != "-", st.role, st.term, st.leader, st.commit_index)
                )
        if target is None:
            target = max((v.commit_index for v in views if v.role == "LEADER"), default=None)
        problem = "no node leads" if target is None else check_rejoined(views, target)
        if problem is None or time.monotonic() > deadline:
            return problem
        time.sleep(0.2)


def _wait_preferred_leader(
    nemesis: Nemesis, spec: ClusterSpec, group: str, console: Console
) -> None:
    """Wait until the group's preferred node leads (controller/balance.py's choice), so that the
    controller's balancer does not move the leadership during a scenario that checks the leader
    stays. It hands a group back hold_ms after an election, once per interval_ms: 30 s covers a
    refused first attempt. A cluster whose balancer is off keeps its leader: not waited for."""
    if not spec.controllers or not spec.settings.get("controller", {}).get("balance_leaders", True):
        return
    ids = [n.node_id for n in spec.groups[group]]
    want = f"{group}-{preferred_node(group, ids, list(spec.groups), spec.preferred_leaders)}"
    deadline = time.monotonic() + 30.0
    while (lead := nemesis.leader()) != want:
        if time.monotonic() > deadline:
            raise RunError(f"the controller did not hand {group} to {want} in 30 s ({lead} leads)")
        time.sleep(0.2)
    console.log(f"{want} leads {group} (the balancer's choice)")


def _create_topic(admin: Admin, group: str, timeout_s: float = 30.0) -> None:
    """Once the group's leader has registered with the NameServer (it does so on election)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if any(g.broker_group == group and g.leader_address for g in admin.groups()):
                admin.create_topic(TOPIC, queues=4)
                return
        except RaftMQError as exc:
            if time.monotonic() > deadline:
                raise RunError(f"cannot create topic {TOPIC}: {exc.message}") from exc
        if time.monotonic() > deadline:
            raise RunError(f"{group} did not register with the NameServer in {timeout_s:g} s")
        time.sleep(0.2)


def _wait_route(admin: Admin, timeout_s: float = 30.0) -> None:
    """The NameServer learns of a new topic from the leader's next registration."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if len(admin.route(TOPIC).write_queues()) >= 4:
                return
        except RaftMQError:
            pass  # not registered yet
        if time.monotonic() > deadline:
            raise RunError(f"topic {TOPIC} has no route after {timeout_s:g} s")
        time.sleep(0.2)


def _schedule_json(schedule: Schedule) -> dict[str, Any]:
    return {
        "produce_s": schedule.produce_s,
        "faults": [
            {
                "kind": f.kind.value,
                "target": f.target,
                "start_s": round(f.start_s, 3),
                "length_s": round(f.length_s, 3),
                "majority_remains": f.majority_remains,
                **({"delay_ms": f.delay_ms, "jitter_ms": f.jitter_ms} if f.delay_ms else {}),
                **({"loss_pct": f.loss_pct} if f.loss_pct else {}),
            }
            for f in schedule.faults
        ],
    }


def _sleep_until(when: float, tick: Callable[[], None]) -> None:
    while (left := when - time.monotonic()) > 0:
        tick()
        time.sleep(min(0.25, left))


def summary_json(result: RunResult) -> str:
    return json.dumps({"verdict": result.verdict, "passed": result.passed, **result.extra})
