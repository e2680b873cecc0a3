"""Two real NameServer processes on loopback: a broker registers with both, either one answers,
and losing one leaves the other serving (NameServers never talk to each other)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from raftmq.common.errors import NoRouteError, from_rpc_error
from raftmq.common.pb import common_pb2, namesrv_pb2, namesrv_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
EXPIRY_MS = 1_500


@dataclass
class Proc:
    popen: subprocess.Popen[str]
    address: str
    log: Path


def start_namesrv(tmp_path: Path, name: str) -> Proc:
    log = tmp_path / f"{name}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAFTMQ_")}
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, "-m", "raftmq.namesrv.server", "--listen", "127.0.0.1:0"]
    cmd += ["--broker-expiry-ms", str(EXPIRY_MS), "--scan-interval-ms", "100"]
    with open(log, "w") as err:
        popen = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, text=True
        )
    assert popen.stdout is not None
    ready, _, _ = select.select([popen.stdout], [], [], 20)
    line = popen.stdout.readline() if ready else ""
    if not line.startswith("namesrv.started listen="):
        popen.kill()
        popen.wait()
        raise AssertionError(f"{name} did not start: {line!r}\n{log.read_text()}")
    return Proc(popen, line.strip().split("listen=", 1)[1], log)


@pytest.fixture
def two_namesrvs(tmp_path: Path) -> Iterator[tuple[Proc, Proc]]:
    procs = [start_namesrv(tmp_path, "ns1"), start_namesrv(tmp_path, "ns2")]
    try:
        yield procs[0], procs[1]
    finally:
        for p in procs:
            if p.popen.poll() is None:
                p.popen.kill()
            p.popen.wait(timeout=10)


def heartbeat(stub: namesrv_pb2_grpc.NameServerStub) -> None:
    """What a fake broker node sends every heartbeat period."""
    out = stub.RegisterBroker(
        namesrv_pb2.RegisterBrokerRequest(
            cluster="DefaultCluster",
            broker_group="broker-a",
            node_id="broker-a-0",
            address="127.0.0.1:10911",
            raft_address="127.0.0.1:20911",
            role=common_pb2.LEADER,
            term=1,
            topics=[common_pb2.TopicConfig(topic="orders", read_queue_nums=8, write_queue_nums=8)],
        ),
        timeout=5,
    )
    assert out.ok and out.leader_node_id == "broker-a-0"


def route(stub: namesrv_pb2_grpc.NameServerStub) -> namesrv_pb2.TopicRouteData:
    return stub.GetRouteInfoByTopic(
        namesrv_pb2.GetRouteInfoByTopicRequest(topic="orders"), timeout=5
    )


def test_routes_from_both_then_survive_losing_one(two_namesrvs: tuple[Proc, Proc]) -> None:
    ns1, ns2 = two_namesrvs
    assert ns1.address != ns2.address
    with grpc.insecure_channel(ns1.address) as ch1, grpc.insecure_channel(ns2.address) as ch2:
        stubs = [namesrv_pb2_grpc.NameServerStub(ch1), namesrv_pb2_grpc.NameServerStub(ch2)]
        for stub in stubs:  # a broker registers with every NameServer
            heartbeat(stub)
        for stub in stubs:
            r = route(stub)
            assert [q.write_queue_nums for q in r.queues] == [8]
            (group,) = r.groups
            assert (group.leader_node_id, group.leader_address) == ("broker-a-0", "127.0.0.1:10911")

        ns1.popen.send_signal(signal.SIGKILL)
        ns1.popen.wait(timeout=10)

        with pytest.raises(grpc.RpcError) as info:
            route(stubs[0])
        assert info.value.code() is grpc.StatusCode.UNAVAILABLE

        heartbeat(stubs[1])
        assert route(stubs[1]).groups[0].leader_node_id == "broker-a-0"

        # soft state: without heartbeats the survivor drops the node after the expiry time
        deadline = time.monotonic() + EXPIRY_MS / 1000 + 5
        err: Exception | None = None
        while time.monotonic() < deadline:
            try:
                route(stubs[1])
            except grpc.RpcError as exc:
                err = from_rpc_error(exc)
                break
            time.sleep(0.1)
        assert isinstance(err, NoRouteError)

    ns2.popen.send_signal(signal.SIGTERM)  # clean shutdown
    assert ns2.popen.wait(timeout=10) == 0
    log = ns2.log.read_text()
    assert "namesrv.node_expired" in log and "namesrv.stopped" in log
