"""Controllers embedded in the NameServer processes (cluster.controller_in_namesrv, RocketMQ's
enableControllerInNamesrv): three NameServers carry the three controllers on their own gRPC
ports; broker leader kills reach every NameServer with the new leader and every controller's record,
also after the NameServer carrying the controller leader is killed, and `raftmq controller status`
answers from the NameServer addresses."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from raftmq.common.pb import (
    common_pb2,
    controller_pb2,
    controller_pb2_grpc,
    namesrv_pb2,
    namesrv_pb2_grpc,
)
from raftmq.ops.cli import main as cli_main
from raftmq.ops.cluster_runner import ClusterRunner
from raftmq.ops.cluster_spec import parse
from tests.controller.test_controller_cluster import broker_leader
from tests.controller.test_failover import led_by_other
from tests.harness.local_cluster import free_ports
from tests.harness.procs import wait_until


def embedded_spec(ports: list[int], data: Path) -> str:
    it = iter(ports)
    ns = "".join(
        f"[[namesrv]]\nhost='127.0.0.1'\nport={next(it)}\nraft_port={next(it)}\n" for _ in range(3)
    )
    nodes = ",".join(
        f"{{id='n{i}',host='127.0.0.1',port={next(it)},raft_port={next(it)}}}" for i in range(3)
    )
    return (
        f"[cluster]\nname='E'\ndata_dir='{data}'\ncontroller_in_namesrv=true\n{ns}"
        f"[[group]]\nname='broker-a'\nnodes=[{nodes}]\n[settings.broker]\nheartbeat_interval_ms=1000\n"
        "[settings.controller]\nbalance_leaders=false\n"
    )


def live_namesrvs(r: ClusterRunner) -> list[str]:
    return [
        f"{p.host}:{p.ports[0]}"
        for p in r.processes()
        if p.role == "namesrv" and r.running[p.name].alive
    ]


def agreed(r: ClusterRunner, want: tuple[str, int]) -> Callable[[], bool]:
    """Every live NameServer routes to `want` and its controller's record says the same."""

    def check() -> bool:
        for address in live_namesrvs(r):
            with grpc.insecure_channel(address) as ch:
                info = namesrv_pb2_grpc.NameServerStub(ch).GetClusterInfo(
                    namesrv_pb2.GetClusterInfoRequest(), timeout=3
                )
                ctl = controller_pb2_grpc.ControllerStub(ch).GetControllerStatus(
                    controller_pb2.GetControllerStatusRequest(), timeout=3
                )
            routes = [(g.leader_node_id, g.term) for c in info.clusters for g in c.groups]
            records = [(g.leader_node_id, g.term) for g in ctl.groups]
            if routes != [want] or records != [want]:
                return False
        return True

    return check


def controller_leader_namesrv(r: ClusterRunner) -> str:
    for p in r.processes():
        if p.role == "namesrv" and r.running[p.name].alive:
            with grpc.insecure_channel(f"{p.host}:{p.ports[0]}") as ch:
                st = controller_pb2_grpc.ControllerStub(ch).GetControllerStatus(
                    controller_pb2.GetControllerStatusRequest(), timeout=3
                )
            if st.role == common_pb2.LEADER:
                return p.name
    return ""


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[ClusterRunner]:
    r = ClusterRunner(parse(embedded_spec(free_ports(12), tmp_path / "data")))
    try:
        r.start_all()
        yield r
    finally:
        r.stop_all()


def test_spec_runs_no_separate_controllers(tmp_path: Path) -> None:
    spec = parse(embedded_spec(list(range(31000, 31012)), tmp_path))
    roles = [p.role for p in spec.processes()]
    assert roles.count("controller") == 0 and roles.count("namesrv") == 3
    ns0 = spec.processes()[0]
    assert "--enable-controller" in ns0.argv and "--controller-raft-address" in ns0.argv
    assert "--no-controller-balance-leaders" in ns0.argv
    broker = next(p for p in spec.processes() if p.role == "broker")
    i = broker.argv.index("--controller-addresses")
    assert broker.argv[i + 1] == spec.namesrv_addresses


def test_leader_kill_reaches_every_namesrv(
    runner: ClusterRunner, capsys: pytest.CaptureFixture[str]
) -> None:
    r = runner
    wait_until(lambda: broker_leader(r)[0] != "", 40, "a broker leader")
    for kill_namesrv in (False, False, True):
        if kill_namesrv:
            # The NameServer carrying the controller leader dies: the other two elect one.
            wait_until(lambda: controller_leader_namesrv(r), 20, "a controller leader")
            r.kill(controller_leader_namesrv(r), signal.SIGKILL)
            wait_until(lambda: controller_leader_namesrv(r), 30, "a new controller leader")
        node, _ = broker_leader(r)
        r.kill(f"broker-a-{node}", signal.SIGKILL)
        wait_until(led_by_other(r, node), 30, "a new leader")
        want = broker_leader(r)
        wait_until(agreed(r, want), 15, "every NameServer and controller to know the new leader")
        r.start(f"broker-a-{node}")
    addresses = ",".join(f"{p.host}:{p.ports[0]}" for p in r.processes() if p.role == "namesrv")
    assert cli_main(["controller", "status", "--controllers", addresses]) == 0
    out = capsys.readouterr().out
    assert "LEADER" in out and "broker-a" in out
