"""Three controller processes, two NameServers and a broker group of three, started from one
cluster description: brokers report their role, stale terms are fenced off, leader changes are
pushed to both NameServers, and losing the controller leader loses nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from raftmq.common.pb import (
    broker_pb2,
    broker_pb2_grpc,
    common_pb2,
    controller_pb2,
    controller_pb2_grpc,
    namesrv_pb2,
    namesrv_pb2_grpc,
)
from raftmq.ops.cluster_runner import ClusterRunner
from raftmq.ops.cluster_spec import local_description, parse
from tests.harness.local_cluster import free_ports
from tests.harness.procs import ROOT, wait_until


def spec_text(ports: list[int], data: Path) -> str:
    """2 NameServers, broker-a of 3 nodes, 3 controllers (14 ports)."""
    return local_description(
        ports, data, name="C", extra="[settings.broker]\nheartbeat_interval_ms=1000\n"
    )


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[ClusterRunner]:
    spec = parse(spec_text(free_ports(14), tmp_path / "data"))
    r = ClusterRunner(spec)
    try:
        r.start_all()
        yield r
    finally:
        r.stop_all()


def controller_status(r: ClusterRunner, name: str) -> controller_pb2.ControllerStatus:
    p = next(p for p in r.processes() if p.name == name)
    with grpc.insecure_channel(f"{p.host}:{p.ports[0]}") as ch:
        return controller_pb2_grpc.ControllerStub(ch).GetControllerStatus(
            controller_pb2.GetControllerStatusRequest(), timeout=3
        )


def controller_leader(r: ClusterRunner) -> str:
    for p in r.processes():
        if p.role == "controller" and r.running[p.name].alive:
            try:
                st = controller_status(r, p.name)
            except grpc.RpcError:
                continue
            if st.role == common_pb2.LEADER:
                return p.name
    return ""


def broker_leader(r: ClusterRunner) -> tuple[str, int]:
    for p in r.processes():
        if p.role == "broker" and r.running[p.name].alive:
            try:
                with grpc.insecure_channel(f"{p.host}:{p.ports[0]}") as ch:
                    st = broker_pb2_grpc.BrokerStub(ch).GetBrokerStatus(
                        broker_pb2.GetBrokerStatusRequest(), timeout=3
                    )
            except grpc.RpcError:
                continue
            if st.role == common_pb2.LEADER:
                return st.node_id, st.term
    return "", 0


def namesrv_leaders(r: ClusterRunner) -> list[tuple[str, int]]:
    out = []
    for p in r.processes():
        if p.role != "namesrv":
            continue
        with grpc.insecure_channel(f"{p.host}:{p.ports[0]}") as ch:
            info = namesrv_pb2_grpc.NameServerStub(ch).GetClusterInfo(
                namesrv_pb2.GetClusterInfoRequest(), timeout=3
            )
        groups = [g for c in info.clusters for g in c.groups]
        out.append((groups[0].leader_node_id, groups[0].term) if groups else ("", 0))
    return out


def record(r: ClusterRunner) -> controller_pb2.GroupRecord | None:
    leader = controller_leader(r)
    if not leader:
        return None
    groups = controller_status(r, leader).groups
    return groups[0] if groups else None


def test_reports_fencing_pushes_and_controller_failover(runner: ClusterRunner) -> None:
    r = runner
    wait_until(lambda: broker_leader(r)[0], 30, "a broker leader")
    node, term = broker_leader(r)
    wait_until(
        lambda: (rec := record(r)) is not None and (rec.leader_node_id, rec.term) == (node, term),
        20,
        "the controller to record the broker leader",
    )
    first_epoch = record(r).epoch  # type: ignore[union-attr]
    # A report from an older term is refused and changes nothing (fencing).
    leader_ctl = next(p for p in r.processes() if p.name == controller_leader(r))
    with grpc.insecure_channel(f"{leader_ctl.host}:{leader_ctl.ports[0]}") as ch:
        out = controller_pb2_grpc.ControllerStub(ch).ReportRole(
            controller_pb2.ReportRoleRequest(
                broker_group="broker-a", node_id="n9", address="x:1", term=0, role=common_pb2.LEADER
            ),
            timeout=5,
        )
    assert not out.accepted and "stale term" in out.reason
    assert out.leader_node_id == node
    # SIGKILL the broker leader: the new leader's report reaches the controller, which pushes it.
    r.kill(f"broker-a-{node}", signal.SIGKILL)
    wait_until(lambda: broker_leader(r)[0] not in ("", node), 30, "a new broker leader")
    new, new_term = broker_leader(r)
    elected = time.monotonic()
    wait_until(
        lambda: all(x == (new, new_term) for x in namesrv_leaders(r)),
        10,
        "both NameServers to route to the new leader",
    )
    print(f"NameServers showed the new leader {time.monotonic() - elected:.3f} s after it was seen")
    wait_until(
        lambda: (
            (rec := record(r)) is not None and rec.leader_node_id == new and rec.epoch > first_epoch
        ),
        10,
        "the controller record to move",
    )
    r.start(f"broker-a-{node}")
    # Kill a controller follower, then the controller leader: changes still get through.
    follower = next(
        p.name for p in r.processes() if p.role == "controller" and p.name != controller_leader(r)
    )
    r.kill(follower)
    r.start(follower)
    kept = record(r)
    assert kept is not None
    old_ctl = controller_leader(r)
    r.kill(old_ctl)
    wait_until(lambda: controller_leader(r) not in ("", old_ctl), 30, "a new controller leader")
    wait_until(lambda: record(r) is not None, 10, "the new controller leader's record")
    before = record(r)
    # Survived: the same record, or a later one (a loaded machine may elect again meanwhile),
    # never an older epoch or another leader under the same epoch.
    assert before is not None and (
        before.epoch > kept.epoch
        or (before.epoch, before.leader_node_id) == (kept.epoch, kept.leader_node_id)
    ), f"the record survived the failover: {kept} then {before}"
    new = before.leader_node_id
    r.kill(f"broker-a-{new}", signal.SIGKILL)
    wait_until(lambda: broker_leader(r)[0] not in ("", new), 30, "another broker leader")
    third, third_term = broker_leader(r)
    wait_until(
        lambda: (
            (rec := record(r)) is not None and (rec.leader_node_id, rec.term) == (third, third_term)
        ),
        15,
        "the new controller leader to record it",
    )
    wait_until(
        lambda: all(x == (third, third_term) for x in namesrv_leaders(r)), 10, "NameServers again"
    )
    logs = "".join(
        (p.data_dir / "process.log").read_text() for p in r.processes() if p.role == "namesrv"
    )
    assert "namesrv.leader_push" in logs, "the controller pushed to the NameServers"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raftmq.ops.cli", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_controller_status_and_planned_election_from_the_cli(runner: ClusterRunner) -> None:
    r = runner
    wait_until(lambda: broker_leader(r)[0], 30, "a broker leader")
    node, _ = broker_leader(r)
    wait_until(lambda: (rec := record(r)) is not None and rec.leader_node_id == node, 20, "record")
    ctls = ",".join(f"{p.host}:{p.ports[0]}" for p in r.processes() if p.role == "controller")
    nss = ",".join(f"{p.host}:{p.ports[0]}" for p in r.processes() if p.role == "namesrv")
    out = cli("controller", "status", "--controllers", ctls)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("LEADER") == 1 and "broker-a" in out.stdout
    # --json: one document a script can read, naming the controllers' leader and the group's.
    out = cli("controller", "status", "--controllers", ctls, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    roles = sorted(c["role"] for c in doc["controllers"])
    assert roles == ["FOLLOWER", "FOLLOWER", "LEADER"], doc
    assert {c["address"] for c in doc["controllers"]} == set(ctls.split(","))
    [group] = [g for g in doc["groups"] if g["broker_group"] == "broker-a"]
    assert group["leader_node_id"] == node and int(group["term"]) >= 1, group
    assert set(group["members"]) == {"n0", "n1", "n2"}, group
    target = next(n for n in ("n0", "n1", "n2") if n != node)
    out = cli("--namesrv", nss, "group", "elect", "--group", "broker-a", "--node", target)
    assert out.returncode == 0, out.stdout + out.stderr
    wait_until(lambda: broker_leader(r)[0] == target, 10, "the elected node to lead")
    wait_until(
        lambda: (rec := record(r)) is not None and rec.leader_node_id == target, 10, "the record"
    )
