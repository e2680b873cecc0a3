"""The official RocketMQ 5 Python client through a proxy in front of two broker groups (issue
26): a send to a topic nobody created creates it, as the raftmq SDK's send does while the brokers'
auto_create_topic is on, and one receive() answers from every broker group of the topic, not only
from the group of the client's current assignment."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftmq.client.admin import Admin
from raftmq.client.producer import Producer
from raftmq.common.types import QueueRef
from tests.harness.local_cluster import free_ports
from tests.harness.procs import ROOT, Cluster, Proc, start_cluster, wait_until

DRIVER = Path(__file__).with_name("official_client.py")
GROUPS = ("broker-a", "broker-b")


class Env:
    def __init__(self, cluster: Cluster, endpoint: str) -> None:
        self.cluster = cluster
        self.endpoint = endpoint

    def run(self, scenario: str, **args: Any) -> dict[str, Any]:
        out = subprocess.run(
            [sys.executable, str(DRIVER), scenario, self.endpoint, json.dumps(args)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        for line in out.stdout.splitlines():
            if line.startswith("RESULT "):
                got: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
                return got
        raise AssertionError(
            f"{scenario} gave no result (exit {out.returncode}):\n{out.stdout[-3000:]}\n"
            f"{out.stderr[-3000:]}"
        )


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("two-groups")
    cluster = start_cluster(tmp, groups=GROUPS, namesrvs=1)
    endpoint = f"127.0.0.1:{free_ports(1)[0]}"
    proxy = Proc(
        "proxy",
        ["-m", "raftmq.proxy.server", "--listen", endpoint, "--namesrv-addresses",
         cluster.namesrv],
        tmp / "proxy.log",
    )  # fmt: skip
    try:
        proxy.start("proxy.started")
        cluster.wait_leaders()
        yield Env(cluster, endpoint)
    finally:
        proxy.kill()
        cluster.close()
    assert "Traceback" not in proxy.tail(400), proxy.tail(400)


def test_a_send_to_a_new_topic_creates_it(env: Env) -> None:
    """It failed with "failed to fetch topic route" where the raftmq SDK creates the topic."""
    sent = env.run("produce", topic="fresh-rmq5", messages=[{"body": "first"}])["sent"]
    assert len(sent) == 1 and sent[0]["id"], sent
    with Admin(env.cluster.namesrv) as admin:
        assert "fresh-rmq5" in admin.list_topics()
    got = env.run("consume", topic="fresh-rmq5", group="g-fresh", count=1, timeout_s=30)["got"]
    assert [m["body"] for m in got] == ["first"]


def test_one_receive_answers_from_every_broker_group(env: Env) -> None:
    """With one message in each group, the first receive returns both (it returned the one of
    its assignment's group: with two groups, half the receives found nothing)."""
    with Admin(env.cluster.namesrv) as admin:
        admin.create_topic("spread", queues=1)
        wait_until(lambda: len(admin.route("spread").read_queues()) == 2, 30, "the route")
    with Producer(env.cluster.namesrv) as p:
        for g in GROUPS:
            p.send("spread", f"on {g}".encode(), queue=QueueRef("spread", g, 0))
    with Admin(env.cluster.namesrv) as admin:  # readable on both leaders before the receive
        wait_until(
            lambda: [q.max_offset for q in admin.topic_status("spread")] == [1, 1], 30, "both"
        )
    for group in ("g-spread-1", "g-spread-2"):  # two consumers: either assignment comes first
        (first,) = env.run("receive_once", topic="spread", group=group)["rounds"]
        assert sorted(m["body"] for m in first) == ["on broker-a", "on broker-b"], first
