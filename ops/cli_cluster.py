"""`raftmq cluster up|status|compose`: run the cluster of deploy/cluster.toml as local processes
with a live status table, show a running cluster's state, or print its docker-compose file."""

from __future__ import annotations

import argparse
import signal
import threading
import time
from pathlib import Path
from types import FrameType

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from raftmq.client.admin import Admin
from raftmq.ops import cluster_spec
from raftmq.ops.cluster_runner import ClusterRunner, NodeStatus, broker_status
from raftmq.ops.compose import compose_yaml

# The default cluster description ships inside the package (deploy/cluster.toml links to it).
DEFAULT_SPEC = Path(__file__).resolve().parent / "cluster.toml"
console = Console()


def _load(args: argparse.Namespace) -> cluster_spec.ClusterSpec:
    spec = cluster_spec.load(Path(args.spec))
    if getattr(args, "data", None):
        spec = spec.with_data_dir(Path(args.data))
    return spec


def status_table(rows: list[NodeStatus], title: str = "raftmq cluster") -> Table:
    table = Table(title=title)
    for col in ("process", "group", "address", "pid", "raft role", "term", "leader", "commit"):
        table.add_column(col)
    for r in rows:
        role = {"LEADER": "[bold green]LEADER[/]", "FOLLOWER": "FOLLOWER", "-": "[dim]-[/]"}.get(
            r.role, r.role
        )
        if not r.alive:
            role = "[red]down[/]"
        table.add_row(
            r.name,
            r.group,
            r.address,
            str(r.pid or ""),
            role,
            str(r.term or ""),
            r.leader,
            str(r.commit_index or ""),
        )
    return table


TRY = """[bold]try:[/]
  .venv/bin/raftmq topic create demo
  .venv/bin/raftmq produce demo --count 1000
  .venv/bin/raftmq consume demo --group g1 --from-beginning --max 1000 --quiet
  .venv/bin/raftmq cluster status
[dim]Ctrl-C stops the cluster.[/]"""


def up(args: argparse.Namespace) -> int:
    spec = _load(args)
    runner = ClusterRunner(spec)
    stop = threading.Event()

    def on_signal(_sig: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    procs = runner.processes()
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), console=console
    ) as progress:
        task = progress.add_task("starting processes", total=len(procs))
        runner.start_all(
            on_started=lambda p: progress.update(task, advance=1, description=f"started {p.name}")
        )
        progress.update(task, completed=len(procs))
    if runner.skipped:
        console.print(
            f"[yellow]skipped (role not in this build yet):[/] {', '.join(runner.skipped)}"
        )
    try:
        with Admin(spec.namesrv_addresses) as admin:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not stop.is_set():
                try:
                    if sum(1 for g in admin.groups() if g.leader_address) == len(spec.groups):
                        break
                except Exception:
                    pass
                time.sleep(0.2)
        console.print(f"[green]cluster {spec.name} is up[/]: NameServers {spec.namesrv_addresses}")
        console.print(TRY)
        with Live(status_table(runner.status()), console=console, refresh_per_second=1) as live:
            while not stop.wait(1.0):
                live.update(Group(status_table(runner.status()), Panel(TRY)))
    except KeyboardInterrupt:
        pass
    finally:
        console.print("stopping the cluster ...")
        runner.stop_all()
        console.print("[green]stopped[/]")
    return 0


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
    console.print(status_table(rows, title=f"raftmq cluster (NameServers {args.namesrv})"))
    return 0


def compose(args: argparse.Namespace) -> int:
    print(compose_yaml(cluster_spec.load(Path(args.spec))), end="")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cluster = subparsers.add_parser("cluster", help="run and watch a cluster")
    sub = cluster.add_subparsers(dest="cluster_command", required=True)
    p = sub.add_parser("up", help="start the cluster of a description here; Ctrl-C stops it")
    p.add_argument("--spec", default=str(DEFAULT_SPEC), help="cluster description (TOML)")
    p.add_argument("--data", default=None, help="data directory (default: the description's)")
    p.set_defaults(func=up)
    p = sub.add_parser(
        "status", help="roles, terms, leaders and commit indexes of a running cluster"
    )
    p.set_defaults(func=status)
    p = sub.add_parser("compose", help="print the docker-compose file of a description")
    p.add_argument("--spec", default=str(DEFAULT_SPEC))
    p.set_defaults(func=compose)
