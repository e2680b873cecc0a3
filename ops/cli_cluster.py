"""`raftmq cluster up|down|status|compose`: run the cluster of deploy/cluster.toml as local
processes (with a live status table, or `--detach`ed), stop the one a description started, show a
running cluster's state, or print its docker-compose file."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import shlex
import sys
import threading
import time
from pathlib import Path

from rich.console import Group
from rich.live import Live
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from raftmq.client.admin import Admin
from raftmq.common import tls
from raftmq.common.errors import RaftMQError
from raftmq.common.process import install_stop_handlers
from raftmq.ops import cluster_spec, cluster_state, ports, procs
from raftmq.ops.cli_acl import prepare_cluster_auth
from raftmq.ops.cli_numbers import whole
from raftmq.ops.cluster_runner import (
    ClusterRunner,
    NodeStatus,
    Running,
    StartCancelled,
    StartError,
    broker_status,
    role_available,
    tail,
)
from raftmq.ops.cluster_state import ClusterState, ProcessRecord
from raftmq.ops.compose import DEFAULT_ADVERTISE_HOST, compose_yaml
from raftmq.ops.terminal_text import literal, make_console

# The default cluster description ships inside the package (deploy/cluster.toml links to it).
DEFAULT_SPEC = Path(__file__).resolve().parent / "cluster.toml"
console = make_console()
err_console = make_console(stderr=True)


def _load(args: argparse.Namespace) -> cluster_spec.ClusterSpec:
    spec = cluster_spec.load(Path(args.spec))
    if getattr(args, "data", None):
        spec = spec.with_data_dir(Path(args.data))
    use_spec_tls(spec)
    return spec


def use_spec_tls(spec: cluster_spec.ClusterSpec) -> None:
    """With [security.tls] and no --tls-*/RAFTMQ_TLS_* given, this command connects with the
    description's client certificate (files checked first: a missing one names the fix)."""
    if spec.tls is None or tls.enabled():
        return
    spec.check_tls_files()
    tls.install(
        tls.load(
            {
                "ca": str(spec.tls.ca),
                "cert": str(spec.tls.cert("client")),
                "key": str(spec.tls.key("client")),
            },
            environ={},
        )
    )


def security_warning(spec: cluster_spec.ClusterSpec) -> str | None:
    """The one line `cluster up` prints when the description leaves the cluster open: it names
    which of TLS and auth is off (None when both are on)."""
    off = []
    if spec.tls is None:
        off.append("TLS is off: every port is plaintext (no [security.tls])")
    if not spec.auth.get("auth_enabled"):
        off.append(
            "auth is off: anyone who reaches a port can produce, consume, reset offsets, "
            "delete topics and move leaders (no [security.auth])"
        )
    if not off:
        return None
    return (
        "warning: the cluster is open: "
        + "; ".join(off)
        + "; deploy/secure.toml shows how to turn both on"
    )


def status_table(rows: list[NodeStatus], title: str = "raftmq cluster") -> Table:
    table = Table(title=title)
    columns = ["process", "group", "address", "pid", "raft role", "term", "leader", "commit"]
    storage = any(r.storage_error or r.disk_pressure for r in rows)
    if storage:
        columns.append("disk")  # only when a node cannot write: the usual table stays narrow
    for col in columns:
        table.add_column(col)
    for r in rows:
        role = {"LEADER": "[bold green]LEADER[/]", "FOLLOWER": "FOLLOWER", "-": "[dim]-[/]"}.get(
            r.role, r.role
        )
        if not r.alive:
            role = "[red]down[/]"
        table.add_row(
            literal(r.name),
            literal(r.group),
            literal(r.address),
            str(r.pid or ""),
            role,
            str(r.term or ""),
            literal(r.leader),
            str(r.commit_index or ""),
            *(
                [f"[bold red]{'FULL' if r.disk_full else 'ERROR'}[/] {literal(r.storage_error)}"]
                if storage and r.storage_error
                else [f"[bold yellow]PRESSURE[/] {literal(r.disk_pressure)}"]
                if storage and r.disk_pressure
                else [""] * storage
            ),
        )
    return table


TRY = """[bold]try:[/]
  .venv/bin/raftmq topic create demo
  .venv/bin/raftmq produce demo --count 1000
  .venv/bin/raftmq consume demo --group g1 --from-beginning --max 1000 --quiet
  .venv/bin/raftmq cluster status
[dim]Ctrl-C stops the cluster.[/]"""
HEALTHY_TIMEOUT_S = 60.0


def metrics_lines(spec: cluster_spec.ClusterSpec) -> list[str]:
    """Where each process serves Prometheus metrics (and /healthz, /readyz), for `cluster up`;
    the dashboard's too (its metrics_port), served once it is started (the last line)."""
    endpoints = spec.metrics_endpoints()
    if not endpoints:
        return [
            "metrics: none (give processes a metrics_port in the cluster description)",
            *dashboard_lines(spec),
        ]
    width = max(len(name) for name, _ in endpoints)
    return (
        ["metrics (Prometheus; /healthz and /readyz beside each):"]
        + [
            f"  {name:<{width}}  {url.replace('http://', tls.scheme() + '://')}"
            for name, url in endpoints
        ]
        + dashboard_lines(spec)
    )


def dashboard_lines(spec: cluster_spec.ClusterSpec) -> list[str]:
    """How to open the web dashboard of the description's [dashboard] (ops/cli_dashboard.py)."""
    if spec.dashboard is None:
        return []
    metrics = f" --metrics-listen {spec.dashboard_metrics}" if spec.dashboard_metrics else ""
    return [
        f"dashboard: {tls.scheme()}://{spec.dashboard}/ once started with `raftmq --namesrv "
        f"{spec.namesrv_addresses} dashboard --listen {spec.dashboard}{metrics}`"
    ]


def down_command(args: argparse.Namespace) -> str:
    """The command that stops the cluster `args` describe, as the user would type it."""
    cmd = "raftmq cluster down"
    if Path(args.spec).resolve() != DEFAULT_SPEC.resolve():
        cmd += f" --spec {shlex.quote(str(args.spec))}"
    if getattr(args, "data", None):
        cmd += f" --data {shlex.quote(str(args.data))}"
    return cmd


RAFTMQ_ROLE = re.compile(r"raftmq[.-](namesrv|broker|controller|proxy)\b")


def port_problem(
    spec: cluster_spec.ClusterSpec, state: ClusterState | None, down_cmd: str, spec_arg: str
) -> str | None:
    """One line naming the first port the cluster needs that is taken, who holds it and the
    command that frees it; None when every port is free."""
    needed = [
        (p.name, p.host, port)
        for p in spec.processes()
        if role_available(p.module)
        for port in p.ports
    ]
    busy = ports.busy_ports(needed)
    if not busy:
        return None
    b = busy[0]
    more = f", and {len(busy) - 1} more ports" if len(busy) > 1 else ""
    what = f"port {b.port} (for {b.process}{more}) is in use"
    rec = state.holder_of(b.port) if state is not None else None
    if state is not None and rec is not None and procs.is_running(rec.pid, rec.start_ticks):
        return (
            f"{what} by pid {rec.pid}, {rec.name} of cluster {state.cluster} started earlier "
            f"by `raftmq cluster up`; stop it with: {down_cmd}"
        )
    pids = ports.listener_pids(b.port)
    if pids:
        cmdline = ports.command_line(pids[0])
        if RAFTMQ_ROLE.search(ports.command_line(pids[0], max_chars=4096)):
            # Most likely the user's other cluster (`make run` beside deploy/secure.toml): the
            # fix is separate ports, not killing a process of a cluster they mean to keep.
            return (
                f"{what} by pid {pids[0]} ({cmdline}), a process of another raftmq cluster: "
                f"give {spec_arg} ports of its own (two clusters on one machine need disjoint "
                "ports), or stop that cluster with `raftmq cluster down --spec <its description>`"
            )
        return f"{what} by pid {pids[0]} ({cmdline}); free it with: kill {pids[0]}"
    return (
        f"{what} by a process this user cannot see; free it (`ss -ltnp`), or change the "
        f"port in {spec_arg}"
    )


def recorded_state(
    runner: ClusterRunner, spec_arg: str, detached: bool
) -> cluster_state.ClusterState:
    return ClusterState(
        cluster=runner.spec.name,
        spec=spec_arg,
        runner_pid=os.getpid(),
        runner_start_ticks=procs.start_ticks(os.getpid()) or 0,
        detached=detached,
        processes=tuple(
            ProcessRecord(
                name=r.spec.name,
                role=r.spec.role,
                pid=r.popen.pid,
                start_ticks=procs.start_ticks(r.popen.pid) or 0,
                ports=r.spec.ports,
                log=str(r.log),
            )
            for r in runner.running.values()
        ),
    )


def wait_healthy(spec: cluster_spec.ClusterSpec, stop: threading.Event) -> list[str]:
    """Wait until every broker group has a leader; the groups still without one."""
    missing = sorted(spec.groups)
    with Admin(spec.namesrv_addresses) as admin:
        deadline = time.monotonic() + HEALTHY_TIMEOUT_S
        while time.monotonic() < deadline and not stop.is_set():
            try:
                led = {g.broker_group for g in admin.groups() if g.leader_address}
            except RaftMQError:
                led = set()  # the NameServers have no route yet
            missing = sorted(set(spec.groups) - led)
            if not missing:
                break
            time.sleep(0.2)
    return missing


def up(args: argparse.Namespace) -> int:
    spec = _load(args)
    state_file = cluster_state.state_path(spec.data_dir)
    problem = port_problem(spec, cluster_state.read(state_file), down_command(args), args.spec)
    if problem is not None:
        err_console.print(f"[red]error:[/] {literal(problem)}", highlight=False, soft_wrap=True)
        return 2
    prepare_cluster_auth(spec)  # issue 19: with auth on, this process's calls sign as the admin
    warning = security_warning(spec)
    if warning is not None:
        err_console.print(f"[yellow]{literal(warning)}[/]", highlight=False, soft_wrap=True)
    stop = threading.Event()
    install_stop_handlers(stop, logging.getLogger("raftmq.cli"), "cluster")
    runner: ClusterRunner

    def record(_run: Running) -> None:
        cluster_state.write(state_file, recorded_state(runner, args.spec, args.detach))

    runner = ClusterRunner(spec, detached=args.detach, cancelled=stop.is_set, on_spawn=record)
    procs_ = runner.processes()
    try:
        with Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), console=console
        ) as progress:
            task = progress.add_task("starting processes", total=len(procs_))
            runner.start_all(
                on_started=lambda p: progress.update(
                    task, advance=1, description=f"started {literal(p.name)}"
                )
            )
            progress.update(task, completed=len(procs_))
    except StartCancelled:
        cluster_state.remove(state_file)
        console.print("stopped before every process was up")
        return 130
    except StartError as exc:
        cluster_state.remove(state_file)
        where = ""
        if exc.log is not None:
            last = next((ln for ln in reversed(tail(exc.log).splitlines()) if ln.strip()), "")
            where = f"; its log: {exc.log} (last line: {last})"
        err_console.print(
            f"[red]error:[/] {literal(f'{exc.name} did not start{where}')}",
            highlight=False,
            soft_wrap=True,
        )
        return 1
    if runner.skipped:
        console.print(
            f"[yellow]skipped (role not in this build yet):[/] {literal(', '.join(runner.skipped))}"
        )
    if args.detach:
        return _detached(args, spec, runner, state_file, stop)
    try:
        wait_healthy(spec, stop)
        console.print(f"[green]cluster {literal(spec.name)} is up[/]: {literal(_endpoints(spec))}")
        for line in metrics_lines(spec):
            console.print(literal(line), soft_wrap=True, highlight=False)
        console.print(TRY)
        with Live(status_table(runner.status()), console=console, refresh_per_second=1) as live:
            while not stop.wait(1.0):
                live.update(Group(status_table(runner.status()), Panel(TRY)))
    except KeyboardInterrupt:
        pass
    finally:
        console.print("stopping the cluster ...")
        runner.stop_all()
        cluster_state.remove(state_file)
        console.print("[green]stopped[/]")
    return 0


def _endpoints(spec: cluster_spec.ClusterSpec) -> str:
    """Where clients connect: the NameServers (raftmq SDK) and the proxies (RocketMQ 5 clients)."""
    out = f"NameServers {spec.namesrv_addresses}"
    if spec.proxies:
        out += f"; RocketMQ 5 API (proxies) {','.join(str(e) for e in spec.proxies)}"
    return out


def _detached(
    args: argparse.Namespace,
    spec: cluster_spec.ClusterSpec,
    runner: ClusterRunner,
    state_file: Path,
    stop: threading.Event,
) -> int:
    """After a detached start: wait for a leader in every group, then leave the children be."""
    missing = wait_healthy(spec, stop)
    if missing or stop.is_set():
        why = "stopped" if stop.is_set() else f"no leader in {', '.join(missing)}"
        err_console.print(
            f"[red]error:[/] {literal(f'cluster {spec.name} did not become healthy ({why})')}; "
            "stopping it",
            highlight=False,
            soft_wrap=True,
        )
        runner.stop_all()
        cluster_state.remove(state_file)
        return 1
    console.print(
        f"[green]cluster {literal(spec.name)} is up[/] (detached): {literal(_endpoints(spec))}",
        soft_wrap=True,
    )
    for line in metrics_lines(spec):
        console.print(literal(line), soft_wrap=True, highlight=False)
    console.print(
        f"logs: {literal(str(spec.data_dir.resolve()))}/<process>/process.log", soft_wrap=True
    )
    console.print(f"stop it with: {literal(down_command(args))}", soft_wrap=True, highlight=False)
    return 0


def down(args: argparse.Namespace) -> int:
    """Stop the processes `cluster up` recorded for this description: SIGTERM, wait, SIGKILL.
    A pid whose start time no longer matches is someone else's and is left alone."""
    spec = _load(args)
    state_file = cluster_state.state_path(spec.data_dir)
    state = cluster_state.read(state_file)
    if state is None and (elsewhere := recorded_elsewhere(spec)) is not None:
        state_file, state = elsewhere
        console.print(
            f"cluster {literal(state.cluster)} was started in another directory: stopping what "
            f"{literal(str(state_file))} records",
            soft_wrap=True,
        )
    if state is None:
        busy = port_problem(spec, None, down_command(args), args.spec)
        if busy is not None:  # not ours to stop, yet the description's ports are taken
            why = f"no running cluster is recorded in {state_file}, but {busy}"
            err_console.print(
                f"[red]error:[/] {literal(why)}",
                highlight=False,
                soft_wrap=True,
            )
            return 1
        console.print(
            f"nothing to stop: no running cluster is recorded in {literal(str(state_file))}",
            soft_wrap=True,
        )
        return 0
    brokers_first = sorted(state.processes, key=lambda r: r.role != "broker")
    found = [(r, procs.RecordedProcess(r.pid, r.start_ticks)) for r in brokers_first]
    if not state.detached:  # `cluster up` in a terminal: it stops its children itself too
        runner = ProcessRecord("cluster up", "runner", state.runner_pid, 0, (), "")
        found.append((runner, procs.RecordedProcess(state.runner_pid, state.runner_start_ticks)))
    live = [(r, p) for r, p in found if p.poll() is None]
    killed = procs.stop([p for _, p in live], grace_s=procs.STOP_GRACE_S)
    for _, p in found:
        p.close()
    cluster_state.remove(state_file)
    if not live:
        console.print(
            f"nothing was running: the recorded processes of {literal(state.cluster)} had ended"
        )
        return 0
    table = Table(title=f"raftmq cluster {literal(state.cluster)}: stopped")
    for col in ("process", "pid", "result"):
        table.add_column(col)
    for r, p in live:
        result = "[red]killed (SIGKILL)[/]" if p in killed else "stopped"
        table.add_row(literal(r.name), str(r.pid), result)
    console.print(table)
    return 0


def recorded_elsewhere(
    spec: cluster_spec.ClusterSpec,
) -> tuple[Path, cluster_state.ClusterState] | None:
    """The state file (and state) of a cluster `cluster up` started with this description from
    another directory: a relative data_dir lies under the directory it was started in, which its
    processes inherit, so the process holding one of the description's ports leads to it. Only a
    state that records that very process counts."""
    if spec.data_dir.is_absolute():
        return None  # the same file from every directory: nothing recorded anywhere
    for p in spec.processes():
        for port in p.ports:
            for pid in ports.listener_pids(port):
                try:
                    cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
                except OSError:
                    continue
                path = cluster_state.state_path(cwd / spec.data_dir)
                state = cluster_state.read(path)
                if state is not None and any(r.pid == pid for r in state.processes):
                    return path, state
    return None


def status(args: argparse.Namespace) -> int:
    with Admin(args.namesrv) as admin:
        groups = admin.groups()
    rows = []
    for g in groups:
        for n in g.nodes:
            rows.append(broker_status(f"{g.broker_group}-{n.node_id}", g.broker_group, n.address))
    if not rows:
        console.print("[yellow]no broker node is registered with the NameServers[/]")
        return 1
    if args.json:
        sys.stdout.write(json.dumps([dataclasses.asdict(r) for r in rows]) + "\n")
        return 0
    console.print(status_table(rows, title=f"raftmq cluster (NameServers {literal(args.namesrv)})"))
    return 0


def certs(args: argparse.Namespace) -> int:
    """Make a development CA (kept if present) and one certificate per process of the
    description, plus `client` (SDK, CLI) and `dashboard`, into its [security.tls] dir."""
    from raftmq.ops import certs as certs_mod

    spec = cluster_spec.load(Path(args.spec))
    out = Path(args.out) if args.out else (spec.tls.dir if spec.tls else Path("certs"))
    written = certs_mod.write_certs(
        out, certs_mod.cert_requests(spec), days=args.days, force=args.force, new_ca=args.new_ca
    )
    console.print(
        literal(
            f"wrote {len(written)} files to {out} (CA {out / certs_mod.CA_CERT}, valid "
            f"{args.days} days); clients: RAFTMQ_TLS_CA={out / certs_mod.CA_CERT} "
            f"RAFTMQ_TLS_CERT={out / 'client.crt'} RAFTMQ_TLS_KEY={out / 'client.key'}"
        ),
        soft_wrap=True,
        highlight=False,
    )
    if spec.tls is None:
        console.print(
            "[yellow]note:[/] "
            + literal(
                "the description has no [security.tls] with enabled = true; "
                "add one (see deploy/secure.toml) to use these"
            ),
            soft_wrap=True,
            highlight=False,
        )
    return 0


def compose(args: argparse.Namespace) -> int:
    spec = cluster_spec.load(Path(args.spec))
    if args.advertise_host is not None and not args.host_reachable:
        raise cluster_spec.SpecError("--advertise-host needs --host-reachable")
    print(
        compose_yaml(
            spec,
            host_reachable=args.host_reachable,
            advertise_host=args.advertise_host or DEFAULT_ADVERTISE_HOST,
            source="deploy/cluster.toml"
            if Path(args.spec).resolve() == DEFAULT_SPEC.resolve()
            else str(args.spec),
        ),
        end="",
    )
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cluster = subparsers.add_parser("cluster", help="run and watch a cluster")
    sub = cluster.add_subparsers(dest="cluster_command", required=True)
    p = sub.add_parser("up", help="start the cluster of a description here; Ctrl-C stops it")
    p.add_argument("--spec", default=str(DEFAULT_SPEC), help="cluster description (TOML)")
    p.add_argument("--data", default=None, help="data directory (default: the description's)")
    p.add_argument(
        "--detach",
        action="store_true",
        help="return once every group has a leader, leaving the processes running "
        "(stop them with `raftmq cluster down`)",
    )
    p.set_defaults(func=up)
    p = sub.add_parser("down", help="stop the cluster `cluster up` started from a description")
    p.add_argument("--spec", default=str(DEFAULT_SPEC), help="cluster description (TOML)")
    p.add_argument("--data", default=None, help="data directory (default: the description's)")
    p.set_defaults(func=down)
    p = sub.add_parser(
        "status", help="roles, terms, leaders and commit indexes of a running cluster"
    )
    p.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    p.set_defaults(func=status)
    p = sub.add_parser(
        "certs", help="make a development CA and TLS certificates for a description's processes"
    )
    p.add_argument("--spec", default=str(DEFAULT_SPEC), help="cluster description (TOML)")
    p.add_argument("--out", default=None, help="directory (default: its [security.tls] dir)")
    p.add_argument("--days", type=whole(1), default=365, help="validity of the certificates")
    p.add_argument(
        "--force", action="store_true", help="replace existing certificates (keeps the CA)"
    )
    p.add_argument(
        "--new-ca", action="store_true", help="with --force: make a new CA too (restart all)"
    )
    p.set_defaults(func=certs)
    p = sub.add_parser("compose", help="print the docker-compose file of a description")
    p.add_argument("--spec", default=str(DEFAULT_SPEC), help="cluster description (TOML)")
    p.add_argument(
        "--host-reachable",
        action="store_true",
        help="publish every client-facing port on the host and make the brokers advertise "
        "host addresses (default: clients run inside the compose network)",
    )
    p.add_argument(
        "--advertise-host",
        default=None,
        help=f"with --host-reachable: the host name or IP clients use for the Docker host "
        f"(default {DEFAULT_ADVERTISE_HOST}; give the host's LAN name for remote clients and "
        "for the controllers' leader balancing)",
    )
    p.set_defaults(func=compose)
