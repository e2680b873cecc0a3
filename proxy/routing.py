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


def send_queue(route: TopicRoute, message_group: str) -> QueueRef | None:
    """FIFO: the queue of `message_group` (the SDK's sharding-key rule, so an SDK producer with
    sharding_key=group and a v2 producer with the same message group share a queue). None for
    other messages: the SDK picks."""
    if not message_group:
        return None
    return select_by_key(route.publish_queues(), message_group)


def is_ordered(route: TopicRoute) -> bool:
    return any(q.ordered for q in route.queues)


def read_queues(
    route: TopicRoute, broker_group: str, me: str, proxies: Sequence[str]
) -> list[QueueRef]:
    """The readable queues a receive pops: those of `broker_group` ("" or unknown: of every
    group this proxy serves)."""
    mine = [q for q in route.read_queues() if owner_of(q.broker_group, proxies) == me]
    named = [q for q in mine if q.broker_group == broker_group]
    return named or mine
