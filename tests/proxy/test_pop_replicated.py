"""POP state is the broker group's replicated state (docs/design.md, "POP state in the broker
group's Raft log"), through the proxy's gRPC API with real processes: after a proxy SIGKILL and
restart, and after a broker leader SIGKILL, acknowledged messages are not delivered again,
unacknowledged ones come back only after their invisible duration with the attempt count going
on, receipt handles issued before still acknowledge, and the retry limit still sends a message to
the dead-letter queue."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from raftmq.client.admin import Admin
from raftmq.client.producer import Producer
from raftmq.common.pb.apache.rocketmq.v2 import definition_pb2 as v2
from raftmq.common.pb.apache.rocketmq.v2 import service_pb2 as svc
from raftmq.common.pb.apache.rocketmq.v2 import service_pb2_grpc
from raftmq.ops.cluster_runner import broker_status
from tests.harness.local_cluster import free_ports
from tests.harness.procs import Cluster, Proc, start_cluster, wait_until

TOPIC = "prep"
GROUP = "g-prep"
INVISIBLE_MS = 8_000  # wide: a restart or a failover must fit well inside it
MAX_ATTEMPTS = 3


class Env:
    def __init__(self, cluster: Cluster, proxy: Proc, endpoint: str) -> None:
        self.cluster, self.proxy, self.endpoint = cluster, proxy, endpoint
        self._ch = grpc.insecure_channel(endpoint)
        self.stub = service_pb2_grpc.MessagingServiceStub(self._ch)

    def reconnect(self) -> None:
        self._ch.close()
        self._ch = grpc.insecure_channel(self.endpoint)
        self.stub = service_pb2_grpc.MessagingServiceStub(self._ch)

    def close(self) -> None:
        self._ch.close()


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    cluster = start_cluster(tmp_path, groups=("broker-a",), namesrvs=1)
    endpoint = f"127.0.0.1:{free_ports(1)[0]}"
    proxy = Proc(
        "proxy",
        [
            "-m",
            "raftmq.proxy.server",
            "--listen",
            endpoint,
            "--namesrv-addresses",
            cluster.namesrv,
            "--max-delivery-attempts",
            str(MAX_ATTEMPTS),
        ],
        tmp_path / "proxy.log",
    )
    e: Env | None = None
    try:
        proxy.start("proxy.started")
        cluster.wait_leaders()
        with Admin(cluster.namesrv) as admin:
            admin.create_topic(TOPIC, queues=2)
            wait_until(lambda: admin.route(TOPIC), 30, f"the route of {TOPIC}")
        e = Env(cluster, proxy, endpoint)
        yield e
    finally:
        if e is not None:
            e.close()
        proxy.kill()
        cluster.close()
    assert "Traceback" not in proxy.tail(400), proxy.tail(400)


def _receive(env: Env, *, poll_ms: int = 1_000, batch: int = 16) -> list[v2.Message]:
    req = svc.ReceiveMessageRequest(
        group=v2.Resource(name=GROUP),
        message_queue=v2.MessageQueue(topic=v2.Resource(name=TOPIC)),
        filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"),
        batch_size=batch,
    )
    req.invisible_duration.FromMilliseconds(INVISIBLE_MS)
    req.long_polling_timeout.FromMilliseconds(poll_ms)
    out = []
    for r in env.stub.ReceiveMessage(req, timeout=poll_ms / 1000 + 15):
        if r.HasField("status"):
            assert r.status.code in (v2.OK, v2.MESSAGE_NOT_FOUND), r.status
        if r.HasField("message"):
            out.append(r.message)
    return out


def _receive_n(env: Env, n: int, timeout_s: float) -> list[v2.Message]:
    got: list[v2.Message] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        try:
            got += _receive(env)
        except grpc.RpcError:
            time.sleep(0.3)  # the proxy is still coming up
    return got


def _ack(env: Env, msgs: list[v2.Message]) -> svc.AckMessageResponse:
    return env.stub.AckMessage(
        svc.AckMessageRequest(
            group=v2.Resource(name=GROUP),
            topic=v2.Resource(name=TOPIC),
            entries=[
                svc.AckMessageEntry(
                    message_id=m.system_properties.message_id,
                    receipt_handle=m.system_properties.receipt_handle,
                )
                for m in msgs
            ],
        ),
        timeout=15,
    )


def _bodies(msgs: list[v2.Message]) -> list[bytes]:
    return sorted(m.body for m in msgs)


def _leader(env: Env) -> Proc:
    layout, procs = env.cluster.groups["broker-a"]

    def find() -> Proc | None:
        for i, p in enumerate(procs):
            if p.alive and broker_status(p.name, "broker-a", layout.address(i)).role == "LEADER":
                return p
        return None

    found = wait_until(find, 30, "a leader of broker-a")
    assert isinstance(found, Proc)
    return found


def _nothing_until_visible(env: Env, received_at: float) -> None:
    """Receive right away: nothing may come while the messages are invisible (checked only
    within the invisible duration, less a margin for a slow machine)."""
    try:
        early = _receive(env, poll_ms=500)
    except grpc.RpcError:
        early = []
    if time.monotonic() - received_at < INVISIBLE_MS / 1000 - 1.0:
        assert early == [], f"delivered again before the invisible duration: {_bodies(early)}"


def test_pop_state_survives_proxy_and_leader_kills(env: Env) -> None:
    with Producer(env.cluster.namesrv) as p:
        for i in range(6):
            p.send(TOPIC, f"m{i}".encode())
    first = _receive_n(env, 6, 30)
    received_at = time.monotonic()
    assert _bodies(first) == [f"m{i}".encode() for i in range(6)]
    assert all(m.system_properties.delivery_attempt == 1 for m in first)
    first.sort(key=lambda m: m.body)
    acked, kept = first[:3], first[3:]
    assert _ack(env, acked).status.code == v2.OK

    # ---- the proxy: SIGKILL and restart --------------------------------------------------------
    env.proxy.kill()
    env.proxy.start("proxy.started")
    env.reconnect()
    # (d) a handle issued by the killed process still acknowledges.
    a = _ack(env, [kept[0]])
    assert a.status.code == v2.OK, a.status
    # (b) not visible again before the invisible duration.
    _nothing_until_visible(env, received_at)
    # (a), (c): after it, only the two unacknowledged ones, at their second attempt.
    second = _receive_n(env, 2, 30)
    second_at = time.monotonic()
    assert _bodies(second) == _bodies(kept[1:]), "acknowledged messages came back"
    assert [m.system_properties.delivery_attempt for m in second] == [2, 2]
    assert time.monotonic() - received_at >= INVISIBLE_MS / 1000 - 0.5

    # ---- the broker group's leader: SIGKILL -----------------------------------------------------
    _leader(env).kill()
    _leader(env)  # a new one
    _nothing_until_visible(env, second_at)
    third = _receive_n(env, 2, 40)
    assert _bodies(third) == _bodies(second), "an acknowledged message came back"
    assert [m.system_properties.delivery_attempt for m in third] == [3, 3]
    # (d) across the failover too: acknowledge one with its handle.
    third.sort(key=lambda m: m.body)
    done, last = third[0], third[1]
    assert _ack(env, [done]).status.code == v2.OK
    # (c) the other is at the retry limit: when it expires it goes to %DLQ%<group>.
    time.sleep(INVISIBLE_MS / 1000)
    assert _receive(env, poll_ms=2_000) == [], "delivered past the max attempts"
    found: list[bytes] = []

    def landed() -> bool:
        nonlocal found
        with Admin(env.cluster.namesrv) as admin:
            found = [m.body for m in admin.dead_letters(GROUP)]
        return bool(found)

    wait_until(landed, 30, f"a dead letter of {GROUP}", interval_s=0.5)
    assert found == [last.body]
    # Every message is done (acknowledged or dead-lettered): the apply committed the group's
    # progress to the end of each queue (consumer offsets, as RocketMQ commits a pop queue's).
    with Admin(env.cluster.namesrv) as admin:
        lags = admin.group_lag(GROUP, TOPIC)
    assert sum(x.lag for x in lags) == 0, lags
