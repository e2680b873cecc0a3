"""The lifecycle features through the RocketMQ 5 API, with the official Python client as a black
box (tests/proxy/official_client.py, its own process) against a real cluster behind a real proxy:
delayed messages (not received before due), transactions (commit visible, rollback invisible, an
open one answered through the proxy's check-back by the client's checker), and dead letters (a
SimpleConsumer's message never acknowledged, or a PushConsumer's nacked one, past the max delivery
attempts; a FIFO PushConsumer's ForwardMessageToDeadLetterQueue), all landing in %DLQ%<group>."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from raftmq.client.admin import Admin
from raftmq.client.messages import ReceivedMessage
from raftmq.common.pb.apache.rocketmq.v2 import definition_pb2 as v2
from raftmq.common.pb.apache.rocketmq.v2 import service_pb2 as svc
from raftmq.common.pb.apache.rocketmq.v2 import service_pb2_grpc
from raftmq.common.retry import PROPERTY_DLQ_ORIGIN_TOPIC, PROPERTY_RECONSUME_TIME
from tests.harness.local_cluster import free_ports
from tests.harness.procs import Proc, start_cluster, wait_until

# Skips this module too when the official client is missing.
from tests.proxy.test_official_client import Env

TOPICS = {"dly": False, "txn": False, "dl1": False, "dlf": True, "dlp": False, "dlr": False}
MAX_ATTEMPTS = 2
TXN_TIMEOUT_MS = 2_000
CLIENT_EXPIRY_MS = 3_000  # a topic's transaction producer closes this long after its last client


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("rmq5-life")
    cluster = start_cluster(
        tmp,
        groups=("broker-a",),
        namesrvs=1,
        broker_args=[
            "--transaction-timeout-ms",
            str(TXN_TIMEOUT_MS),
            "--transaction-check-interval-ms",
            "2000",
        ],
    )
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
            "--offset-commit-interval-ms",
            "100",
            "--max-delivery-attempts",
            str(MAX_ATTEMPTS),
            "--client-expiry-ms",
            str(CLIENT_EXPIRY_MS),
        ],
        tmp / "proxy.log",
    )
    try:
        proxy.start("proxy.started")
        cluster.wait_leaders()  # topics are created through the leader
        with Admin(cluster.namesrv) as admin:
            for topic, ordered in TOPICS.items():
                admin.create_topic(topic, queues=2, ordered=ordered)
        with grpc.insecure_channel(endpoint) as ch:
            stub = service_pb2_grpc.MessagingServiceStub(ch)
            for topic in TOPICS:

                def routed(topic: str = topic) -> bool:
                    req = svc.QueryRouteRequest(topic=v2.Resource(name=topic))
                    return stub.QueryRoute(req, timeout=10).status.code == v2.OK

                wait_until(routed, 30, f"a route of {topic}", interval_s=0.2)
        yield Env(cluster, proxy, endpoint)
    finally:
        proxy.kill()
        cluster.close()
    assert "Traceback" not in proxy.tail(400), proxy.tail(400)


def _dead_letters(env: Env, group: str, want: int) -> list[ReceivedMessage]:
    found: list[ReceivedMessage] = []

    def landed() -> bool:
        nonlocal found
        with Admin(env.cluster.namesrv) as admin:
            found = admin.dead_letters(group)
        return len(found) >= want

    wait_until(landed, 30, f"{want} dead letter(s) of {group}", interval_s=0.5)
    return found


def test_delayed_message_is_not_received_before_due(env: Env) -> None:
    res = env.run("delayed", topic="dly", group="g-dly", body="later", delay_s=4)
    assert [m["body"] for m in res["got"]] == ["later"], res
    assert res["got"][0]["id"] == res["id"]
    assert res["early"] == [], res  # nothing came before its delivery timestamp
    # The broker's clock decides; same machine, so a small margin only.
    assert res["received_ms"] >= res["due_ms"] - 200, res
    assert res["due_ms"] - res["sent_ms"] >= 3_000, res  # whole seconds: 3..4 s ahead


def test_transactions_commit_rollback_and_check_back(env: Env) -> None:
    txn, consumed = env.run(
        "steps",
        steps=[
            ["transactions", {"topic": "txn", "check_wait_s": 40}],
            [
                "consume",
                {
                    "topic": "txn",
                    "group": "g-txn",
                    "count": 2,
                    "timeout_s": 30,
                    "check_empty": True,
                },
            ],
        ],
    )["results"]
    sent = txn["sent"]
    assert all(s["txn"] for s in sent.values()), sent
    # The open transaction was checked back through the proxy and the client's checker answered.
    assert [c["body"] for c in txn["checked"]][:1] == ["orphan"], txn
    assert txn["checked"][0]["id"] == sent["orphan"]["id"]
    got = {m["body"]: m["id"] for m in consumed["got"]}
    assert got == {"commit": sent["commit"]["id"], "orphan": sent["orphan"]["id"]}, consumed
    assert consumed["extra"] == [], consumed  # the rolled back one never shows
    assert "proxy.check_forwarded topic=txn" in env.proxy.tail(400)
    # The client is gone: the proxy stops polling the topic's check-backs.
    wait_until(
        lambda: "proxy.transaction_producers_closed topics=txn" in env.proxy.tail(400),
        20,
        "the transaction producer of txn closed",
        interval_s=0.3,
    )


def test_bad_end_transaction_is_refused(env: Env) -> None:
    with grpc.insecure_channel(env.endpoint) as ch:
        stub = service_pb2_grpc.MessagingServiceStub(ch)
        bad = svc.EndTransactionRequest(
            topic=v2.Resource(name="txn"), transaction_id="nonsense", resolution=v2.COMMIT
        )
        assert stub.EndTransaction(bad, timeout=10).status.code == v2.INVALID_TRANSACTION_ID
        unknown = svc.EndTransactionRequest(
            topic=v2.Resource(name="txn"),
            transaction_id="broker-a:0123456789abcdef",
            resolution=v2.ROLLBACK,
        )
        st = stub.EndTransaction(unknown, timeout=10).status
        assert st.code == v2.INVALID_TRANSACTION_ID and st.message, st
        no_resolution = svc.EndTransactionRequest(
            topic=v2.Resource(name="txn"), transaction_id="broker-a:0123"
        )
        assert stub.EndTransaction(no_resolution, timeout=10).status.code == v2.BAD_REQUEST


def test_bad_delayed_send_and_forward_are_refused(env: Env) -> None:
    with grpc.insecure_channel(env.endpoint) as ch:
        stub = service_pb2_grpc.MessagingServiceStub(ch)
        m = v2.Message(
            topic=v2.Resource(name="dly"),
            body=b"x",
            system_properties=v2.SystemProperties(message_id="M1", message_type=v2.DELAY),
        )
        m.system_properties.delivery_timestamp.FromMilliseconds(
            time.time_ns() // 1_000_000 + 30 * 24 * 3600 * 1000  # past the 7-day horizon
        )
        st = stub.SendMessage(svc.SendMessageRequest(messages=[m]), timeout=10).status
        assert st.code == v2.ILLEGAL_DELIVERY_TIME and st.message, st
        m.system_properties.delivery_timestamp.seconds = 10**15  # out of Timestamp's range
        st = stub.SendMessage(svc.SendMessageRequest(messages=[m]), timeout=10).status
        assert st.code == v2.ILLEGAL_DELIVERY_TIME, st
        fwd = svc.ForwardMessageToDeadLetterQueueRequest(
            group=v2.Resource(name="g-x"), topic=v2.Resource(name="dl1"), receipt_handle="junk"
        )
        st = stub.ForwardMessageToDeadLetterQueue(fwd, timeout=10).status
        assert st.code == v2.INVALID_RECEIPT_HANDLE and st.message, st


def test_unacknowledged_message_goes_to_dlq_after_max_attempts(env: Env) -> None:
    sent, res = env.produce_then(
        {"topic": "dl1", "messages": [{"body": "never-acked", "keys": ["K1"]}]},
        "unacked",
        topic="dl1",
        group="g-dl1",
        watch_s=6,
    )
    attempts = [m["attempt"] for m in res["got"] if m["body"] == "never-acked"]
    assert attempts == list(range(1, MAX_ATTEMPTS + 1)), res  # then no more deliveries
    (dead,) = _dead_letters(env, "g-dl1", 1)
    assert dead.body == b"never-acked" and dead.keys == ("K1",)
    assert dead.properties[PROPERTY_DLQ_ORIGIN_TOPIC] == "dl1"
    assert dead.properties["rmq5.message_id"] == sent[0]["id"]
    assert "proxy.dead_lettered group=g-dl1 by=attempts" in env.proxy.tail(400)


def test_fifo_push_consumer_forwards_to_dlq(env: Env, tmp_path: Path) -> None:
    sent, res = env.produce_then(
        {"topic": "dlf", "messages": [{"body": "poison", "group": "mg"}]},
        "push_failing",
        topic="dlf",
        group="g-dlf",
        attempts=MAX_ATTEMPTS,
    )
    seen = [(m["body"], m["attempt"]) for m in res["seen"]]
    assert seen == [("poison", 1)] * MAX_ATTEMPTS, seen
    (dead,) = _dead_letters(env, "g-dlf", 1)
    assert dead.body == b"poison" and dead.properties[PROPERTY_DLQ_ORIGIN_TOPIC] == "dlf"
    assert dead.properties["rmq5.message_id"] == sent[0]["id"]
    # The client's ForwardMessageToDeadLetterQueue did it, not the proxy's attempt count.
    assert "proxy.dead_lettered group=g-dlf by=client" in env.proxy.tail(400)


def test_push_consumer_nacks_go_to_dlq_after_max_attempts(env: Env) -> None:
    sent, res = env.produce_then(
        {"topic": "dlp", "messages": [{"body": "nacked"}]},
        "push_failing",
        topic="dlp",
        group="g-dlp",
        attempts=MAX_ATTEMPTS,
        linger_s=8,  # the 2nd nack makes it invisible for 5 s (the 2nd backoff duration)
    )
    seen = [(m["body"], m["attempt"]) for m in res["seen"]]
    assert seen == [("nacked", a) for a in range(1, MAX_ATTEMPTS + 1)], seen
    (dead,) = _dead_letters(env, "g-dlp", 1)
    assert dead.body == b"nacked" and dead.properties["rmq5.message_id"] == sent[0]["id"]
    assert "proxy.dead_lettered group=g-dlp by=attempts" in env.proxy.tail(400)


def _settings_answer(env: Env, group: str, topic: str) -> v2.Settings:
    """The settings the proxy answers a SimpleConsumer of `group` with (Telemetry), as the
    official clients ask at start."""
    ask = v2.Settings(
        client_type=v2.SIMPLE_CONSUMER,
        subscription=v2.Subscription(
            group=v2.Resource(name=group),
            subscriptions=[
                v2.SubscriptionEntry(
                    topic=v2.Resource(name=topic),
                    expression=v2.FilterExpression(type=v2.TAG, expression="*"),
                )
            ],
        ),
    )
    with grpc.insecure_channel(env.endpoint) as ch:
        stub = service_pb2_grpc.MessagingServiceStub(ch)
        call = stub.Telemetry(iter([svc.TelemetryCommand(settings=ask)]), timeout=10)
        try:
            answer = next(iter(call))
        finally:
            call.cancel()
    assert answer.status.code == v2.OK, answer.status
    return answer.settings


def test_group_retry_limit_decides_pop_dead_letters(env: Env) -> None:
    """Issue 26: the group's config (`raftmq group config G --retry-max N`) decides, not the
    proxy's max_delivery_attempts (2 here): N + 1 deliveries, then %DLQ%<group> (RocketMQ's
    rule), and the settings the client gets say so."""
    retry_max = 2
    with Admin(env.cluster.namesrv) as admin:
        admin.update_group_config("g-dlr", retry_max_times=retry_max)
    assert _settings_answer(env, "g-dlr", "dlr").backoff_policy.max_attempts == retry_max + 1
    assert _settings_answer(env, "g-other", "dlr").backoff_policy.max_attempts == MAX_ATTEMPTS
    sent, res = env.produce_then(
        {"topic": "dlr", "messages": [{"body": "never-acked"}]},
        "unacked",
        topic="dlr",
        group="g-dlr",
        watch_s=6,  # invisible 1 s per receive: three deliveries and the dead letter in ~3 s
    )
    attempts = [m["attempt"] for m in res["got"] if m["body"] == "never-acked"]
    assert attempts == list(range(1, retry_max + 2)), res
    # In the DLQ, not %RETRY%<group>: the broker does not weigh the group's limit again.
    (dead,) = _dead_letters(env, "g-dlr", 1)
    assert dead.properties["rmq5.message_id"] == sent[0]["id"]
    assert dead.properties[PROPERTY_RECONSUME_TIME] == str(retry_max + 1)  # failed deliveries
    assert "proxy.dead_lettered group=g-dlr by=attempts" in env.proxy.tail(400)
