"""Routes as RocketMQ 5 clients see them: every queue of a topic, each named by its broker group
and queue id, reached through the proxy that serves its broker group. Pure.

Each broker group is served by one proxy of the cluster (a stable hash over the sorted proxy
list), so one consumer group's POP state for a queue lives in one process (docs/design.md).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from raftmq.client.queue_selector import select_by_key
from raftmq.client.routes import TopicRoute
from raftmq.common.pb.apache.rocketmq.v2 import definition_pb2 as v2
from raftmq.common.types import QueueRef

MASTER_BROKER_ID = 0  # v2 clients read and write only queues of "master" brokers (id 0)


def owner_of(broker_group: str, proxies: Sequence[str]) -> str:
    """The proxy (an address of `proxies`, sorted) that serves `broker_group`."""
    assert proxies, "at least this proxy"
    return proxies[zlib.crc32(broker_group.encode()) % len(proxies)]


def endpoints(address: str) -> v2.Endpoints:
    host, _, port = address.rpartition(":")
    is_ipv4 = host.replace(".", "").isdigit() and host.count(".") == 3
    return v2.Endpoints(
        scheme=v2.IPv4 if is_ipv4 else v2.DOMAIN_NAME,
        addresses=[v2.Address(host=host, port=int(port))],
    )


def accepted_types(ordered: bool) -> list[int]:
    """What a queue takes: FIFO on an ordered topic; NORMAL, DELAY and TRANSACTION otherwise."""
    return [v2.FIFO] if ordered else [v2.NORMAL, v2.DELAY, v2.TRANSACTION]


def message_queues(route: TopicRoute, proxies: Sequence[str]) -> list[v2.MessageQueue]:
    out = []
    for q in sorted(route.queues, key=lambda q: q.broker_group):
        perm = (
            v2.READ_WRITE
            if q.readable and q.writable
            else v2.READ
            if q.readable
            else v2.WRITE
            if q.writable
            else v2.NONE
        )
        broker = v2.Broker(
            name=q.broker_group,
            id=MASTER_BROKER_ID,
            endpoints=endpoints(owner_of(q.broker_group, proxies)),
        )
        for i in range(max(q.read_queue_nums, q.write_queue_nums)):
            readable = q.readable and i < q.read_queue_nums
            writable = q.writable and i < q.write_queue_nums
            out.append(
                v2.MessageQueue(
                    topic=v2.Resource(name=route.topic),
                    id=i,
                    permission=perm
                    if readable and writable
                    else (v2.READ if readable else v2.WRITE if writable else v2.NONE),
                    broker=broker,
                    accept_message_types=accepted_types(q.ordered),  # type: ignore[arg-type]
                )
            )
    return out


def provisional_queues(
    topic: str, broker_groups: Sequence[str], proxies: Sequence[str]
) -> list[v2.MessageQueue]:
    """The route a v2 producer gets for a topic that does not exist yet while the brokers create
    topics on first send (auto_create_topic): one write-only queue per broker group, taking
    every message type. The send itself goes through the SDK, which creates the topic."""
    return [
        v2.MessageQueue(
            topic=v2.Resource(name=topic),
            id=0,
            permission=v2.WRITE,
            broker=v2.Broker(
                name=g, id=MASTER_BROKER_ID, endpoints=endpoints(owner_of(g, proxies))
            ),
            accept_message_types=[v2.NORMAL, v2.FIFO, v2.DELAY, v2.TRANSACTION],
        )
        for g in sorted(broker_groups)
    ]


def send_queue(route: TopicRoute, message_group: str) -> QueueRef | None:
    """FIFO: the queue of `message_group` (the SDK's sharding-key rule, so an SDK producer with
    sharding_key=group and a v2 producer with the same message group share a queue). None for
    other messages: the SDK picks."""
    if not message_group:
        return None
    return select_by_key(route.publish_queues(), message_group)


def is_ordered(route: TopicRoute) -> bool:
    return any(q.ordered for q in route.queues)


def read_queues(route: TopicRoute, me: str, proxies: Sequence[str]) -> list[QueueRef]:
    """The readable queues a receive pops: those of every broker group this proxy serves,
    whichever assignment the client named. The official clients receive from one assignment
    (one broker group) at a time; popping only its group answered "nothing" while another group
    of the topic held messages (issue 26)."""
    return [q for q in route.read_queues() if owner_of(q.broker_group, proxies) == me]
