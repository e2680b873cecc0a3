"""A proxy in front of brokers that do not create topics on first send (the acceptance cluster
runs --no-auto-create-topic): a v2 client asking the route of an unknown topic gets
TOPIC_NOT_FOUND, not the provisional write-only route of proxy/routing.py (issue 26)."""

from __future__ import annotations

from pathlib import Path

import grpc

from raftmq.common.pb.apache.rocketmq.v2 import definition_pb2 as v2
from raftmq.common.pb.apache.rocketmq.v2 import service_pb2 as svc
from raftmq.common.pb.apache.rocketmq.v2 import service_pb2_grpc
from tests.harness.local_cluster import free_ports
from tests.harness.procs import Cluster, Proc


def test_an_unknown_topic_is_not_found_when_brokers_do_not_auto_create(
    cluster: Cluster, tmp_path: Path
) -> None:
    endpoint = f"127.0.0.1:{free_ports(1)[0]}"
    proxy = Proc(
        "proxy",
        ["-m", "raftmq.proxy.server", "--listen", endpoint, "--namesrv-addresses",
         cluster.namesrv],
        tmp_path / "proxy.log",
    )  # fmt: skip
    try:
        proxy.start("proxy.started")
        with grpc.insecure_channel(endpoint) as ch:
            r = service_pb2_grpc.MessagingServiceStub(ch).QueryRoute(
                svc.QueryRouteRequest(topic=v2.Resource(name="never-created")), timeout=10
            )
        assert r.status.code == v2.TOPIC_NOT_FOUND, r.status
    finally:
        proxy.kill()
