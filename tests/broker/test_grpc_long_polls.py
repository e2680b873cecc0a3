"""Long polls over gRPC (brokers with `--data-listen off`, or any gRPC client) against real
processes: a held gRPC pull holds a handler thread, so at most half of max_workers are held at
once (broker/pull.py HELD_THREADS_SHARE) and sends always find a thread. Issue 14: with 150-200
gRPC long polls held on a leader of 128 threads, every sync send failed with DEADLINE_EXCEEDED
for as long as the polls were held."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from raftmq.client.admin import Admin
from raftmq.common.pb import broker_pb2, broker_pb2_grpc, common_pb2
from tests.harness.procs import Cluster, start_cluster, wait_until

GROUP = "broker-a"
MAX_WORKERS = 16  # the broker's gRPC handler threads: at most 8 held pulls
POLLS = 40


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, str]]:
    tmp: Path = tmp_path_factory.mktemp("grpc-polls")
    c = start_cluster(
        tmp,
        groups=(GROUP,),
        namesrvs=1,
        broker_args=["--data-listen", "off", "--max-workers", str(MAX_WORKERS)],
    )
    try:
        c.wait_leaders()
        with Admin(c.namesrv) as admin:
            leader = wait_until(
                lambda: next(
                    (g.leader_address for g in admin.groups() if g.broker_group == GROUP), ""
                ),
                30,
                "a leader",
            )
        assert isinstance(leader, str)
        yield c, leader
    finally:
        c.close()


def send(stub: broker_pb2_grpc.BrokerStub, topic: str, queue_id: int, body: bytes) -> None:
    stub.SendMessage(
        broker_pb2.SendMessageRequest(
            topic=topic, queue_id=queue_id, messages=[common_pb2.Message(body=body)]
        ),
        timeout=2,
    )


def test_held_grpc_polls_leave_threads_for_sends(cluster: tuple[Cluster, str]) -> None:
    _, leader = cluster
    with grpc.insecure_channel(leader) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)
        wait_until(lambda: send(stub, "busy", 0, b"first") or True, 30, "a first send")
        wait_until(lambda: send(stub, "idle", 0, b"first") or True, 30, "the idle topic")
        polls = [
            stub.PullMessage.future(
                broker_pb2.PullMessageRequest(
                    consumer_group="g", topic="idle", queue_id=0, offset=1, max_wait_ms=10_000
                ),
                timeout=20,
            )
            for _ in range(POLLS)
        ]
        time.sleep(1.0)  # every poll reached the broker: held, or answered at once
        held = [p for p in polls if not p.done()]
        answered = [p for p in polls if p.done()]
        assert len(held) <= MAX_WORKERS // 2, len(held)
        assert len(held) >= 1
        for p in answered:
            assert p.result().status == broker_pb2.NO_NEW_MSG
        # With a thread per held poll the sends queued behind them: DEADLINE_EXCEEDED.
        for k in range(10):
            t0 = time.monotonic()
            send(stub, "busy", 0, b"%d" % k)
            assert time.monotonic() - t0 < 1.5
        assert not any(p.done() for p in held)
        # the held polls are live: a message on their queue answers them
        send(stub, "idle", 0, b"wake")
        for p in held:
            assert [m.message.body for m in p.result(timeout=5).messages] == [b"wake"]
