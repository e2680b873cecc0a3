"""The NameServer over gRPC, in process: wire conversions, typed errors, the expiry scan."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from raftmq.common.errors import InvalidNameError, NoRouteError, from_rpc_error
from raftmq.common.pb import common_pb2, namesrv_pb2, namesrv_pb2_grpc
from raftmq.namesrv.server import NameServer
from raftmq.namesrv.settings import NameServerSettings


@pytest.fixture
def stub() -> Iterator[namesrv_pb2_grpc.NameServerStub]:
    server = NameServer(
        NameServerSettings(listen="127.0.0.1:0", broker_expiry_ms=400, scan_interval_ms=50)
    )
    address = server.start()
    channel = grpc.insecure_channel(address)
    try:
        yield namesrv_pb2_grpc.NameServerStub(channel)
    finally:
        channel.close()
        server.stop()


def register(
    stub: namesrv_pb2_grpc.NameServerStub,
    node: str,
    role: common_pb2.Role,
    term: int,
    topics: tuple[str, ...] = ("orders",),
    data_address: str = "",
) -> namesrv_pb2.RegisterBrokerResponse:
    return stub.RegisterBroker(
        namesrv_pb2.RegisterBrokerRequest(
            cluster="c1",
            broker_group="broker-a",
            node_id=node,
            address=f"127.0.0.1:1091{node[-1]}",
            raft_address=f"127.0.0.1:2091{node[-1]}",
            data_address=data_address,
            role=role,
            term=term,
            topics=[
                common_pb2.TopicConfig(
                    topic=t, read_queue_nums=4, write_queue_nums=4, perm=common_pb2.PERM_READ_ONLY
                )
                for t in topics
            ],
        ),
        timeout=5,
    )


def test_register_route_cluster_info_and_topics(stub: namesrv_pb2_grpc.NameServerStub) -> None:
    out = register(stub, "a0", common_pb2.LEADER, 2)
    assert (out.ok, out.leader_node_id, out.leader_address, out.term) == (
        True,
        "a0",
        "127.0.0.1:10910",
        2,
    )
    assert out.broker_expiry_ms == 400
    register(stub, "a1", common_pb2.FOLLOWER, 2, data_address="127.0.0.1:30911")

    route = stub.GetRouteInfoByTopic(namesrv_pb2.GetRouteInfoByTopicRequest(topic="orders"))
    assert route.topic == "orders"
    (queue,) = route.queues
    assert (queue.broker_group, queue.read_queue_nums, queue.perm) == (
        "broker-a",
        4,
        common_pb2.PERM_READ_ONLY,
    )
    (group,) = route.groups
    assert (group.cluster, group.leader_node_id, group.term) == ("c1", "a0", 2)
    assert [(n.node_id, n.is_leader, n.role) for n in group.nodes] == [
        ("a0", True, common_pb2.LEADER),
        ("a1", False, common_pb2.FOLLOWER),
    ]
    assert group.nodes[1].raft_address == "127.0.0.1:20911"
    assert [n.data_address for n in group.nodes] == ["", "127.0.0.1:30911"]

    info = stub.GetClusterInfo(namesrv_pb2.GetClusterInfoRequest())
    assert [c.name for c in info.clusters] == ["c1"]
    assert [len(g.nodes) for g in info.clusters[0].groups] == [2]
    assert [n.data_address for n in info.clusters[0].groups[0].nodes] == ["", "127.0.0.1:30911"]
    assert list(stub.GetAllTopics(namesrv_pb2.GetAllTopicsRequest()).topics) == ["orders"]


def test_push_leader_change_is_idempotent_by_term(stub: namesrv_pb2_grpc.NameServerStub) -> None:
    register(stub, "a0", common_pb2.LEADER, 2)
    register(stub, "a1", common_pb2.FOLLOWER, 2)

    def push(node: str, term: int) -> namesrv_pb2.PushLeaderChangeResponse:
        return stub.PushLeaderChange(
            namesrv_pb2.PushLeaderChangeRequest(
                broker_group="broker-a", leader_node_id=node, term=term
            )
        )

    assert push("a1", 3).result == namesrv_pb2.LEADER_CHANGE_APPLIED
    assert push("a1", 3).result == namesrv_pb2.LEADER_CHANGE_ALREADY_APPLIED
    stale = push("a0", 2)
    assert (stale.result, stale.leader_node_id, stale.term) == (
        namesrv_pb2.LEADER_CHANGE_STALE_TERM,
        "a1",
        3,
    )
    assert push("zz", 9).result == namesrv_pb2.LEADER_CHANGE_UNKNOWN_NODE
    route = stub.GetRouteInfoByTopic(namesrv_pb2.GetRouteInfoByTopicRequest(topic="orders"))
    assert route.groups[0].leader_address == "127.0.0.1:10911"


def test_typed_errors_over_the_wire(stub: namesrv_pb2_grpc.NameServerStub) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.GetRouteInfoByTopic(namesrv_pb2.GetRouteInfoByTopicRequest(topic="nope"))
    exc = from_rpc_error(info.value)
    assert isinstance(exc, NoRouteError)
    assert "raftmq topic list" in exc.message and exc.details["topic"] == "nope"

    with pytest.raises(grpc.RpcError) as info:
        stub.RegisterBroker(
            namesrv_pb2.RegisterBrokerRequest(
                cluster="c1", broker_group="bad group", node_id="a0", address="127.0.0.1:1"
            )
        )
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert isinstance(from_rpc_error(info.value), InvalidNameError)


def test_unregister_and_expiry_scan(stub: namesrv_pb2_grpc.NameServerStub) -> None:
    register(stub, "a0", common_pb2.LEADER, 1)
    register(stub, "a1", common_pb2.FOLLOWER, 1)
    req = namesrv_pb2.UnregisterBrokerRequest(cluster="c1", broker_group="broker-a", node_id="a0")
    assert stub.UnregisterBroker(req).removed is True
    assert stub.UnregisterBroker(req).removed is False

    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # a1 stops heartbeating: gone after ~400 ms
        if not stub.GetClusterInfo(namesrv_pb2.GetClusterInfoRequest()).clusters:
            break
        time.sleep(0.05)
    assert not stub.GetClusterInfo(namesrv_pb2.GetClusterInfoRequest()).clusters
