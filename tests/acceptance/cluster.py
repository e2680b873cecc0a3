"""The acceptance tests' cluster: two NameServers and broker-a, broker-b of three Raft nodes each
as real processes on free loopback ports, with short heartbeat and expiry times, auto-create of
topics off; one per test package, torn down (every process killed) at the end.

Built on tests/procs.py (the one way tests start raftmq processes); adds the waiting and the small
helpers every acceptance test needs."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from raftmq.client.admin import Admin
from raftmq.client.consumer_pull import PullConsumer
from raftmq.client.messages import ReceivedMessage
from raftmq.client.offsets import StartFrom
from tests.harness.procs import Cluster, start_cluster, wait_until

GROUPS = ("broker-a", "broker-b")


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(
        tmp_path_factory.mktemp("acceptance"), GROUPS, broker_args=["--no-auto-create-topic"]
    )
    try:
        wait_for_leaders(c)
        yield c
    finally:
        c.close()


def wait_for_leaders(c: Cluster, timeout_s: float = 60) -> None:
    """Every group has a leader that every NameServer knows."""
    for ns in c.namesrv_addresses:
        with Admin(ns) as admin:
            wait_until(
                lambda: len([g for g in admin.groups() if g.leader_address]) == len(GROUPS),
                timeout_s,
                f"both groups to have a leader known to {ns}",
            )


def create_topic(c: Cluster, topic: str, queues: int = 4) -> None:
    """`topic` on both groups with `queues` queues each, routed by every NameServer."""
    with Admin(c.namesrv) as admin:
        assert admin.create_topic(topic, queues=queues) == list(GROUPS)
    for ns in c.namesrv_addresses:
        with Admin(ns) as admin:
            wait_until(
                lambda: len(admin.route(topic).write_queues()) == len(GROUPS) * queues,
                30,
                f"the route of {topic} on both groups at {ns}",
            )


def drain(
    c: Cluster, topic: str, group: str, expect: int, timeout_s: float = 60
) -> list[ReceivedMessage]:
    """Everything a new group reads of `topic` from the start: `expect` messages, then whatever
    else arrives within a short grace (anything beyond `expect` is a bug the caller sees)."""
    got: list[ReceivedMessage] = []
    with PullConsumer(c.namesrv, group, start_from=StartFrom.EARLIEST) as consumer:
        consumer.subscribe(topic)
        deadline = time.monotonic() + timeout_s
        while len(got) < expect and time.monotonic() < deadline:
            got.extend(consumer.poll(500))
        got.extend(consumer.poll(300))
    return got


def now_ms() -> int:
    return time.time_ns() // 1_000_000
