"""A real raftmq cluster for the Spark tests: one NameServer and broker groups broker-a and
broker-b of three `python -m broker.server` nodes each, with helpers to create topics, send to a
given queue and read a whole topic back over gRPC (independently of the Spark source)."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from raftmq.common.errors import from_rpc_error
from raftmq.common.pb import broker_pb2, broker_pb2_grpc, common_pb2, namesrv_pb2, namesrv_pb2_grpc
from tests.harness.procs import GroupLayout, Proc, start_cluster, wait_until

GROUPS = ("broker-a", "broker-b")


def call(fn: object, request: object, timeout: float = 20.0) -> object:
    try:
        return fn(request, timeout=timeout)  # type: ignore[operator]
    except grpc.RpcError as exc:
        raise from_rpc_error(exc) from None


@dataclass
class Cluster:
    tmp: Path
    namesrv: Proc
    namesrv_address: str
    layouts: dict[str, GroupLayout]
    nodes: dict[str, list[Proc]]
    channels: dict[str, grpc.Channel] = field(default_factory=dict)

    def stub(self, address: str) -> broker_pb2_grpc.BrokerStub:
        ch = self.channels.get(address)
        if ch is None:
            ch = self.channels[address] = grpc.insecure_channel(
                address, options=[("grpc.max_receive_message_length", 64 << 20)]
            )
        return broker_pb2_grpc.BrokerStub(ch)

    def ns(self) -> namesrv_pb2_grpc.NameServerStub:
        ch = self.channels.get(self.namesrv_address)
        if ch is None:
            ch = self.channels[self.namesrv_address] = grpc.insecure_channel(self.namesrv_address)
        return namesrv_pb2_grpc.NameServerStub(ch)

    def leader(self, group: str, timeout_s: float = 30.0) -> str:
        layout = self.layouts[group]

        def find() -> str | None:
            for i, node in enumerate(self.nodes[group]):
                if not node.alive:
                    continue
                try:
                    st = self.stub(layout.address(i)).GetBrokerStatus(
                        broker_pb2.GetBrokerStatusRequest(), timeout=5
                    )
                except grpc.RpcError:
                    continue
                if st.role == common_pb2.LEADER:
                    return layout.address(i)
            return None

        found = wait_until(find, timeout_s, f"a leader of {group}")
        assert isinstance(found, str)
        return found

    def create_topic(
        self, topic: str, queues: int = 4, groups: Sequence[str] = GROUPS, *, wait: bool = True
    ) -> None:
        for g in groups:
            cfg = common_pb2.TopicConfig(
                topic=topic, read_queue_nums=queues, write_queue_nums=queues
            )
            call(self.stub(self.leader(g)).CreateTopic, broker_pb2.CreateTopicRequest(config=cfg))
        if wait:
            self.wait_route(topic, {g: queues for g in groups})

    def update_topic(self, topic: str, group: str, queues: int) -> None:
        cfg = common_pb2.TopicConfig(topic=topic, read_queue_nums=queues, write_queue_nums=queues)
        call(self.stub(self.leader(group)).UpdateTopic, broker_pb2.UpdateTopicRequest(config=cfg))

    def route(self, topic: str) -> namesrv_pb2.TopicRouteData:
        out = call(
            self.ns().GetRouteInfoByTopic, namesrv_pb2.GetRouteInfoByTopicRequest(topic=topic)
        )
        assert isinstance(out, namesrv_pb2.TopicRouteData)
        return out

    def wait_route(self, topic: str, queues_per_group: dict[str, int]) -> None:
        def ok() -> bool:
            r = self.route(topic)
            have = {q.broker_group: q.read_queue_nums for q in r.queues}
            leaders = all(g.leader_address for g in r.groups)
            return have == queues_per_group and leaders

        wait_until(ok, 30, f"the route of {topic} to list {queues_per_group}")

    def send(
        self,
        topic: str,
        group: str,
        queue_id: int,
        bodies: Sequence[bytes],
        *,
        tags: str = "",
        keys: Sequence[str] = (),
        properties: dict[str, str] | None = None,
    ) -> broker_pb2.SendMessageResponse:
        req = broker_pb2.SendMessageRequest(
            topic=topic,
            queue_id=queue_id,
            messages=[
                common_pb2.Message(body=b, tags=tags, keys=list(keys), properties=properties or {})
                for b in bodies
            ],
        )
        out = call(self.stub(self.leader(group)).SendMessage, req)
        assert isinstance(out, broker_pb2.SendMessageResponse)
        return out

    def bounds(self, topic: str, group: str, queue_id: int) -> tuple[int, int]:
        out = call(
            self.stub(self.leader(group)).GetQueueBounds,
            broker_pb2.GetQueueBoundsRequest(topic=topic, queue_id=queue_id),
        )
        assert isinstance(out, broker_pb2.GetQueueBoundsResponse)
        return out.min_offset, out.max_offset

    def read_topic(self, topic: str) -> list[common_pb2.StoredMessage]:
        """Every stored message of `topic` on every group, by (group, queue, offset)."""
        out: list[common_pb2.StoredMessage] = []
        for qd in self.route(topic).queues:
            stub = self.stub(self.leader(qd.broker_group))
            for qid in range(qd.read_queue_nums):
                low, high = self.bounds(topic, qd.broker_group, qid)
                offset = low
                while offset < high:
                    resp = call(
                        stub.PullMessage,
                        broker_pb2.PullMessageRequest(
                            consumer_group="spark-test-check",
                            topic=topic,
                            queue_id=qid,
                            offset=offset,
                            max_count=1024,
                        ),
                    )
                    assert isinstance(resp, broker_pb2.PullMessageResponse)
                    out.extend(resp.messages)
                    offset = resp.next_offset
        return out

    def close(self) -> None:
        for ch in self.channels.values():
            ch.close()
        for procs in self.nodes.values():
            for p in procs:
                p.kill()
        self.namesrv.kill()


@contextmanager
def running_cluster(tmp: Path) -> Iterator[Cluster]:
    """tests.procs.start_cluster with one NameServer, no auto-created topics, leaders elected."""
    base = start_cluster(tmp, GROUPS, namesrvs=1, broker_args=["--no-auto-create-topic"])
    c = Cluster(
        tmp,
        base.namesrvs[0],
        base.namesrv_addresses[0],
        {g: layout for g, (layout, _) in base.groups.items()},
        {g: procs for g, (_, procs) in base.groups.items()},
    )
    try:
        for g in GROUPS:
            c.leader(g)
        yield c
    finally:
        c.close()


def spark_env() -> dict[str, str]:
    """What a Spark driver here needs: the venv's Python for workers, loopback only."""
    env = {
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    if "JAVA_HOME" not in os.environ:
        java = shutil.which("java")
        if java:
            env["JAVA_HOME"] = str(Path(os.path.realpath(java)).parents[1])
    return env


SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.session.timeZone": "UTC",
}
