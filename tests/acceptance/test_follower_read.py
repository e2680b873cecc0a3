"""Follower reads: when broker-a loses its leader and a majority (so no new leader can be elected),
a PullConsumer that allows follower reads goes on reading the committed messages from the one
node left, in order and once each."""

from __future__ import annotations

from raftmq.client.admin import Admin
from raftmq.client.consumer_pull import PullConsumer
from raftmq.client.offsets import StartFrom
from raftmq.client.producer import Producer
from raftmq.client.routes import ChannelPool
from raftmq.common.pb import broker_pb2
from raftmq.common.types import QueueRef
from tests.acceptance.cluster import wait_for_leaders
from tests.harness.procs import Cluster, wait_until


def test_reads_go_on_from_a_follower_while_the_group_has_no_leader(cluster: Cluster) -> None:
    topic = "follower-read"
    with Admin(cluster.namesrv) as admin:
        assert admin.create_topic(topic, queues=1, broker_groups=["broker-a"]) == ["broker-a"]
        wait_until(lambda: admin.route(topic).write_queues(), 30, "the route")
        group = next(g for g in admin.groups() if g.broker_group == "broker-a")
    q = QueueRef(topic, "broker-a", 0)
    with Producer(cluster.namesrv) as p:
        for i in range(200):
            p.send(topic, f"f{i}".encode(), queue=q)
    layout, procs = cluster.groups["broker-a"]
    leader = group.leader_node_id
    keep = next(f"n{i}" for i in range(3) if f"n{i}" != leader)
    keep_address = layout.address(int(keep[1:]))
    pool = ChannelPool()
    try:
        status = broker_pb2.GetBrokerStatusRequest()
        leader_commit = pool.broker(group.leader_address).GetBrokerStatus(status).commit_index
        wait_until(
            lambda: (
                pool.broker(keep_address).GetBrokerStatus(status).dispatch_index >= leader_commit
            ),
            30,
            f"{keep} to have every committed message indexed",
        )
    finally:
        pool.close()
    got: list[bytes] = []
    killed = [p for p in procs if p.name != f"broker-a-{keep}"]
    try:
        with PullConsumer(
            cluster.namesrv,
            "g-follower",
            start_from=StartFrom.EARLIEST,
            max_prefetch_messages=20,
            max_messages_per_pull=20,
            long_poll_ms=500,
        ) as c:
            c.assign([q])
            wait_until(lambda: len(got.__iadd__([m.body for m in c.poll(200)])) >= 20, 30, "20")
            for proc in killed:
                proc.kill()  # the leader and one follower: no majority, no new leader
            wait_until(
                lambda: len(got.__iadd__([m.body for m in c.poll(200)])) >= 200,
                60,
                f"the rest from {keep} alone",
            )
            got.extend(m.body for m in c.poll(300))
    finally:
        for proc in killed:
            proc.start("broker.started")
        wait_for_leaders(cluster)
    assert got == [f"f{i}".encode() for i in range(200)], "in order, once each"
