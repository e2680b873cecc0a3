"""mqadmin's and Kafka tools' daily tasks (issue 26; the table in docs/operations.md), each
run through `raftmq` against the acceptance cluster (one for the package): a queue read by
offset and a range of it, `consume --quiet` with its rate, a group's dead letters resent in
bulk (a dry run, then once each), `--json` on the read commands that lacked it, and a
group's config (retry limit, consume and broadcast switches) replicated and honoured."""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path

import grpc
import pytest

from raftmq.client.admin import Admin
from raftmq.client.consumer_pull import PullConsumer
from raftmq.client.consumer_push import ConsumeResult, MessageModel, PushConsumer
from raftmq.client.group_refusal import FIRST_PROBE_S
from raftmq.client.messages import ReceivedMessage
from raftmq.client.offsets import StartFrom
from raftmq.client.producer import Producer, SendResult
from raftmq.common.errors import (
    ConsumeDisabledError,
    PermissionDeniedError,
    RaftMQError,
    from_rpc_error,
)
from raftmq.common.pb import broker_pb2, broker_pb2_grpc
from raftmq.common.types import QueueRef
from raftmq.ops import cli, cli_data
from tests.acceptance.cluster import create_topic
from tests.harness.procs import Cluster, wait_until

TOPIC, DLQ_GROUP = "daily", "daily-dlq"
SENT = 12  # to broker-a#0, in order: body b"m<offset>"


@pytest.fixture(scope="module")
def sent(cluster: Cluster) -> list[SendResult]:
    create_topic(cluster, TOPIC, queues=1)
    queue = QueueRef(TOPIC, "broker-a", 0)
    with Producer(cluster.namesrv) as producer:
        return [producer.send(TOPIC, b"m%d" % i, queue=queue) for i in range(SENT)]


@pytest.fixture(autouse=True)
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_data.console, "width", 1000)  # no table cell folds


def run(cluster: Cluster, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[str, str]:
    code = cli.main(["--namesrv", cluster.namesrv, *argv])
    out, err = capsys.readouterr()
    assert code == 0, f"{argv}: exit {code}: {err}"
    return out, err


def test_a_queue_read_by_offset_and_by_range(
    cluster: Cluster, sent: list[SendResult], capsys: pytest.CaptureFixture[str]
) -> None:
    assert [s.queue_offset for s in sent] == list(range(SENT))
    out, _ = run(cluster, capsys, "message", "range", "--topic", TOPIC, "--queue", "broker-a#0",
                 "--from-offset", "3")  # fmt: skip
    assert sent[3].msg_id in out and "'m3'" not in out and "m3" in out
    assert "1 messages of daily broker-a#0 at offsets 3..3; the queue holds 0..11" in out, out
    assert sent[4].msg_id not in out
    out, err = run(cluster, capsys, "message", "range", "--topic", TOPIC, "--queue", "broker-a#0",
                   "--from-offset", "2", "--to-offset", "7", "--json")  # fmt: skip
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["queue_offset"], r["body"]) for r in rows] == [(o, f"m{o}") for o in range(2, 7)]
    assert "5 messages" in err
    # Past the end: exit 1, naming what the queue holds.
    code = cli.main(["--namesrv", cluster.namesrv, "message", "range", "--topic", TOPIC,
                     "--queue", "broker-a#0", "--from-offset", "50"])  # fmt: skip
    _, err = capsys.readouterr()
    assert code == 1 and "it holds offsets 0..11" in err, err
    code = cli.main(["--namesrv", cluster.namesrv, "message", "range", "--topic", TOPIC,
                     "--queue", "broker-a", "--from-offset", "0"])  # fmt: skip
    _, err = capsys.readouterr()
    assert code == 1 and "BROKER_GROUP#QUEUE_ID" in err, err


def test_consume_quiet_prints_the_count_and_rate(
    cluster: Cluster, sent: list[SendResult], capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = run(cluster, capsys, "consume", TOPIC, "--group", "daily-quiet", "--from-beginning",
                 "--quiet", "--max", str(SENT), "--timeout", "60")  # fmt: skip
    assert "m0" not in out and sent[0].msg_id not in out  # no message printed
    summary = re.search(
        rf"{SENT} messages consumed by group daily-quiet in [0-9.]+ s \((\d+) msg/s\)", out
    )
    assert summary is not None and int(summary.group(1)) > 0, out


def test_a_groups_dead_letters_resent_in_bulk_once(
    cluster: Cluster, sent: list[SendResult], capsys: pytest.CaptureFixture[str]
) -> None:
    with Admin(cluster.namesrv) as admin:
        with PushConsumer(
            cluster.namesrv, DLQ_GROUP, TOPIC, lambda m: ConsumeResult.RECONSUME_LATER,
            start_from=StartFrom.EARLIEST, max_reconsume_times=0, commit_interval_ms=100,
            rebalance_interval_ms=1_000, heartbeat_interval_ms=1_000,
        ):  # fmt: skip
            wait_until(lambda: len(admin.dead_letters(DLQ_GROUP)) == SENT, 60, "dead letters")
        before = sum(q.max_offset for q in admin.topic_status(TOPIC))
    out, _ = run(cluster, capsys, "dlq", "resend", "--group", DLQ_GROUP, "--dry-run")
    assert f"{SENT} would resend, 0 skipped" in out and "nothing was sent" in out, out
    with Admin(cluster.namesrv) as admin:
        assert sum(q.max_offset for q in admin.topic_status(TOPIC)) == before
    out, _ = run(cluster, capsys, "dlq", "resend", "--group", DLQ_GROUP, "--max", "5")
    assert "5 resent, 0 skipped" in out, out
    out, _ = run(cluster, capsys, "dlq", "resend", "--group", DLQ_GROUP, "--json")
    doc = json.loads(out)
    assert doc["counts"] == {"resent": SENT - 5, "would resend": 0, "skipped": 5}, doc
    with Admin(cluster.namesrv) as admin:
        assert sum(q.max_offset for q in admin.topic_status(TOPIC)) == before + SENT


def test_read_commands_print_json(
    cluster: Cluster, sent: list[SendResult], capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = run(cluster, capsys, "topic", "route", TOPIC, "--json")
    assert sorted(r["broker_group"] for r in json.loads(out)) == ["broker-a", "broker-b"]
    out, _ = run(cluster, capsys, "broker", "status", "--json")
    nodes = json.loads(out)
    assert len(nodes) == 6 and all(n["status"]["broker_group"] == n["broker_group"] for n in nodes)
    assert not any(n["status"].get("config") for n in nodes)  # only with --config
    out, _ = run(cluster, capsys, "cluster", "status", "--json")
    assert sorted({r["group"] for r in json.loads(out)}) == ["broker-a", "broker-b"]
    with Admin(cluster.namesrv) as admin:
        dead = admin.dead_letters(DLQ_GROUP, max_count=1)
    if dead:
        out, _ = run(cluster, capsys, "dlq", "show", "--id", dead[0].msg_id, "--json")
        assert json.loads(out)["msg_id"] == dead[0].msg_id


def test_broker_settings_change_live_on_the_named_groups_or_are_refused_with_why(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    def intervals() -> dict[str, str]:
        out, _ = run(cluster, capsys, "broker", "status", "--config", "--json")
        return {
            f"{n['broker_group']}/{n['node_id']}": n["status"]["config"][
                "retention_check_interval_ms"
            ]
            for n in json.loads(out)
        }

    before = intervals()
    assert set(before.values()) == {"10000"}, before
    out, _ = run(cluster, capsys, "broker", "config", "retention_check_interval_ms=7000",
                 "--groups", "broker-b")  # fmt: skip
    assert "broker-b/n0" in out and "7000" in out and "broker-a" not in out, out
    now = intervals()
    assert {k for k, v in now.items() if v == "7000"} == {f"broker-b/n{i}" for i in range(3)}
    # A key read at start, and a bad value: refused with the reason, nothing changes.
    for item, why in (("data_dir=/x", "restart the node"), ("retention_ms=-1", "must be >= 0")):
        code = cli.main(["--namesrv", cluster.namesrv, "broker", "config",
                         "retention_check_interval_ms=9000", item, "--json"])  # fmt: skip
        out, _ = capsys.readouterr()
        nodes = json.loads(out)
        assert code == 1 and len(nodes) == 6, out
        assert all(not n["applied"] and why in str(n["refused"]) for n in nodes), nodes
    assert intervals() == now
    run(cluster, capsys, "broker", "config", "retention_check_interval_ms=10000")
    assert intervals() == before


def test_a_broker_groups_write_permission_is_wiped_and_given_back(
    cluster: Cluster, sent: list[SendResult], capsys: pytest.CaptureFixture[str]
) -> None:
    """mqadmin's wipeWritePerm: broker-b takes no sends, its routes say so (producers go to
    broker-a), a send naming its queue is refused saying what to do; then it is given back."""

    def writable() -> dict[str, bool]:
        out, _ = run(cluster, capsys, "topic", "route", TOPIC, "--json")
        return {r["broker_group"]: r["writable"] for r in json.loads(out)}

    run(cluster, capsys, "broker", "config", "accept_sends=false", "--groups", "broker-b")
    try:
        wait_until(lambda: writable() == {"broker-a": True, "broker-b": False}, 30, "the route")
        with Producer(cluster.namesrv) as producer:
            assert {producer.send(TOPIC, b"w").broker_group for _ in range(6)} == {"broker-a"}
            with pytest.raises(PermissionDeniedError, match="accept_sends=true --groups broker-b"):
                producer.send(TOPIC, b"w", queue=QueueRef(TOPIC, "broker-b", 0))
    finally:
        run(cluster, capsys, "broker", "config", "accept_sends=true", "--groups", "broker-b")
    wait_until(lambda: all(writable().values()), 30, "broker-b writable again")


def test_producers_are_listed_with_their_queues_and_last_write(
    cluster: Cluster, sent: list[SendResult], capsys: pytest.CaptureFixture[str]
) -> None:
    with Producer(cluster.namesrv, producer_id="daily-p1") as producer:
        for i in range(3):
            producer.send(TOPIC, b"p%d" % i, queue=QueueRef(TOPIC, "broker-b", 0))
    out, _ = run(cluster, capsys, "producer", "list", "--topic", TOPIC, "--json")
    rows = [r for r in json.loads(out) if r["producer_id"] == "daily-p1"]
    assert [(r["broker_group"], r["queue_id"], r["last_sequence"]) for r in rows] == [
        ("broker-b", 0, 2)
    ], rows
    assert {r["topic"] for r in json.loads(out)} == {TOPIC}
    out, _ = run(cluster, capsys, "producer", "list")
    assert "daily-p1" in out and "broker-b" in out, out


def test_a_group_is_deleted_when_no_member_is_online(
    cluster: Cluster, sent: list[SendResult], capsys: pytest.CaptureFixture[str]
) -> None:
    group = "daily-del"

    def listed() -> bool:
        out, _ = run(cluster, capsys, "group", "list", "--json")
        return group in out

    run(cluster, capsys, "consume", TOPIC, "--group", group, "--from-beginning", "--max", "3",
        "--timeout", "60")  # fmt: skip
    assert listed()

    def refused() -> str:
        code = cli.main(["--namesrv", cluster.namesrv, "group", "delete", group])
        _, err = capsys.readouterr()
        return err if code == 1 and "members online" in err else ""

    with PushConsumer(
        cluster.namesrv, group, TOPIC, lambda m: ConsumeResult.SUCCESS,
        heartbeat_interval_ms=500, rebalance_interval_ms=1_000,
    ):  # fmt: skip
        err = wait_until(refused, 30, "a refusal naming the online member")
        assert "--force" in str(err) and listed()
    out, _ = run(cluster, capsys, "group", "delete", group)
    assert f"deleted consumer group {group}: " in out and "committed offsets" in out, out
    assert not listed()
    code = cli.main(["--namesrv", cluster.namesrv, "group", "delete", group])
    _, err = capsys.readouterr()
    assert code == 1 and "no committed offset" in err, err


def test_a_topic_is_purged_before_an_offset_then_before_a_time(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = "daily-purge"
    create_topic(cluster, topic, queues=1)
    queue = QueueRef(topic, "broker-a", 0)
    with Producer(cluster.namesrv) as producer:
        for i in range(10):
            producer.send(topic, b"x%d" % i, queue=queue)

    def bounds() -> tuple[int, int]:
        with Admin(cluster.namesrv) as admin:
            q = next(q for q in admin.topic_status(topic) if q.queue == queue)
            return q.min_offset, q.max_offset

    out, _ = run(cluster, capsys, "topic", "purge", topic, "--before-offset", "4", "--dry-run")
    assert "would purge 4 messages" in out and bounds() == (0, 10), out
    out, _ = run(cluster, capsys, "topic", "purge", topic, "--before-offset", "4", "--json")
    doc = json.loads(out)
    assert doc["messages"] == 4 and bounds() == (4, 10), doc
    out, _ = run(cluster, capsys, "message", "range", "--topic", topic, "--queue", "broker-a#0",
                 "--from-offset", "2", "--to-offset", "6")  # fmt: skip
    assert "offsets 2..3 were deleted" in out and "at offsets 4..5" in out, out
    # Before a time: everything stored so far.
    out, _ = run(cluster, capsys, "topic", "purge", topic, "--before", "-0s")
    assert "purged 6 messages" in out and bounds() == (10, 10), out


def test_a_groups_config_is_replicated_shown_and_honoured(
    cluster: Cluster,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    """`raftmq group config`: the log carries it to every node, `group list` shows it, a pull
    of a group with consume off is refused (PullConsumer.poll raises it), broadcast off
    refuses a broadcasting pull, a push consumer fails at start, and the group's retry limit wins
    over the consumer's."""
    topic = group = "daily-gc"
    create_topic(cluster, topic, queues=1)
    queue = QueueRef(topic, "broker-a", 0)
    with Producer(cluster.namesrv) as producer:
        for i in range(2):
            producer.send(topic, b"c%d" % i, queue=queue)
    out, _ = run(cluster, capsys, "group", "config", group, "--json")
    assert {(r["broker_group"], r["retry_max_times"], r["consume_enable"]) for r in
            json.loads(out)} == {("broker-a", -1, True), ("broker-b", -1, True)}  # fmt: skip
    out, _ = run(cluster, capsys, "group", "config", group, "--retry-max", "0", "--consume",
                 "off", "--broadcast", "off")  # fmt: skip
    assert out.count("off") == 4 and "the consumer's" not in out, out
    out, _ = run(cluster, capsys, "group", "list")
    assert "retries 0, consume off, broadcast off" in out, out
    out, _ = run(cluster, capsys, "group", "list", "--json")
    [row] = [g for g in json.loads(out) if g["group"] == group]
    assert set(row["config"]) == {"broker-a", "broker-b"}
    assert row["config"]["broker-a"] == {
        "retry_max_times": 0, "consume_enable": False, "broadcast_enable": False
    }  # fmt: skip
    with Admin(cluster.namesrv) as admin:
        nodes = [n.address for g in admin.groups() for n in g.nodes]
        broker_a = [n.address for g in admin.groups() if g.broker_group == "broker-a"
                    for n in g.nodes]  # fmt: skip

    def on_every_node() -> bool:  # followers too: the config is in every replica's store
        for address in nodes:
            with grpc.insecure_channel(address) as channel:
                answer = broker_pb2_grpc.BrokerStub(channel).ListConsumerGroups(
                    broker_pb2.ListConsumerGroupsRequest(), timeout=10
                )
            mine = [g for g in answer.groups if g.consumer_group == group]
            if not mine or mine[0].config.consume_enable or mine[0].config.retry_max_times:
                return False
        return True

    assert len(nodes) == 6
    wait_until(on_every_node, 30, "the group config on all six nodes")
    with PullConsumer(cluster.namesrv, group, start_from=StartFrom.EARLIEST) as consumer:
        consumer.assign([queue])
        with pytest.raises(ConsumeDisabledError, match=f"raftmq group config {group} --consume on"):
            consumer.poll(timeout_ms=30_000)
    push = PushConsumer(cluster.namesrv, group, topic, lambda m: ConsumeResult.SUCCESS)
    with pytest.raises(ConsumeDisabledError, match="--consume on"):
        push.start()  # fails at start, typed, as a denied group does
    run(cluster, capsys, "group", "config", group, "--consume", "on")
    pull = broker_pb2.PullMessageRequest(consumer_group=group, topic=topic, queue_id=0,
                                         max_count=1, broadcasting=True,
                                         allow_follower_read=True)  # fmt: skip

    def pull_at(address: str) -> RaftMQError | int:
        with grpc.insecure_channel(address) as channel:
            try:
                return len(
                    broker_pb2_grpc.BrokerStub(channel).PullMessage(pull, timeout=10).messages
                )
            except grpc.RpcError as exc:
                return from_rpc_error(exc)

    def broadcast_refused(address: str) -> bool:  # by any node: the check comes before its role
        err = pull_at(address)
        return isinstance(err, ConsumeDisabledError) and "--broadcast on" in err.message

    wait_until(lambda: all(broadcast_refused(a) for a in broker_a), 30, "broadcast refusals")
    # The SDK says it reads by broadcast: a broadcasting push consumer's pulls are refused.
    with caplog.at_level(logging.WARNING, logger="raftmq.consumer"), PushConsumer(
        cluster.namesrv, group, topic, lambda m: ConsumeResult.SUCCESS,
        message_model=MessageModel.BROADCASTING, offset_file=tmp_path / "offsets.json",
        start_from=StartFrom.EARLIEST,
    ):  # fmt: skip
        wait_until(lambda: "may not consume by broadcast" in caplog.text, 30, "the refusal")
    pull.broadcasting = False
    wait_until(lambda: all(pull_at(a) == 1 for a in broker_a), 30, "pulls once consume is on")
    # The group's limit (0) wins over the consumer's (16): each failure is a dead letter at
    # once; the consumer's limit would have sent it to %RETRY% first, for 10 s at least.
    with Admin(cluster.namesrv) as admin:
        with PushConsumer(
            cluster.namesrv, group, topic, lambda m: ConsumeResult.RECONSUME_LATER,
            start_from=StartFrom.EARLIEST, max_reconsume_times=16, commit_interval_ms=100,
            rebalance_interval_ms=1_000, heartbeat_interval_ms=1_000,
        ):  # fmt: skip
            dead = wait_until(lambda: admin.dead_letters(group), 30, "dead letters")
        assert {m.properties["MAX_RECONSUME_TIMES"] for m in dead} == {"0"}
        assert f"%RETRY%{group}" not in admin.list_topics()
    # A group delete takes the config with the offsets: RocketMQ's defaults again.
    out, _ = run(cluster, capsys, "group", "delete", group)
    assert "its config on broker-a, broker-b" in out, out
    out, _ = run(cluster, capsys, "group", "config", group, "--json")
    assert all(r["retry_max_times"] == -1 and r["broadcast_enable"] for r in json.loads(out))


def test_a_running_push_consumer_is_told_once_backs_off_and_resumes(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Consuming turned off under a running push consumer: the application is told once
    (on_consume_disabled) and the log says it once, all its queues together pull about once
    per back-off period (before: each queue about once a second, a warning each), and it
    consumes again by itself once the group is turned on."""
    topic = group = "daily-gc-run"
    create_topic(cluster, topic, queues=4)  # 8 queues over the two broker groups
    got: list[bytes] = []
    told: list[ConsumeDisabledError] = []

    def listener(m: ReceivedMessage) -> ConsumeResult:
        got.append(m.body)
        return ConsumeResult.SUCCESS

    push = PushConsumer(
        cluster.namesrv, group, topic, listener, start_from=StartFrom.EARLIEST,
        long_poll_ms=500, on_consume_disabled=told.append,
    )  # fmt: skip

    def pulls() -> int:
        return sum(f.pulls for f in list(push._fetchers.values()))

    with (
        Admin(cluster.namesrv) as admin,
        Producer(cluster.namesrv) as producer,
        caplog.at_level(logging.WARNING, logger="raftmq.consumer"),
        push,
    ):
        producer.send(topic, b"before")
        wait_until(lambda: b"before" in got, 30, "the first message")
        admin.update_group_config(group, consume_enable=False)
        wait_until(lambda: told, 30, "the application told")
        assert push.consume_disabled is told[0] and "--consume on" in told[0].message
        # A measurement window, not a wait for an event: the pulls every queue sent in it.
        start, t0 = pulls(), time.monotonic()
        time.sleep(3.0)
        sent, elapsed = pulls() - start, time.monotonic() - t0
        # The probes are FIRST_PROBE_S apart at least (then 1, 2, 4 s): 8 queues at their
        # old 1 s back-off sent about 24 here.
        assert sent <= elapsed / FIRST_PROBE_S + 1, (sent, elapsed)
        admin.update_group_config(group, consume_enable=True)
        producer.send(topic, b"after")
        wait_until(lambda: b"after" in got, 30, "consuming again once turned on")
        assert push.consume_disabled is None
    assert len(told) == 1, told
    assert caplog.text.count(f"consumer.consume_disabled group={group}") == 1, caplog.text
    assert f"consumer.consume_resumed group={group}" in caplog.text
    assert "consumer.pull_failed" not in caplog.text, caplog.text


def test_a_running_pull_consumer_raises_once_backs_off_and_resumes(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """The same for a PullConsumer: poll() raises the ConsumeDisabledError once per episode
    (before: once per refused pull, each queue about once a second, with a warning each), all
    queues together pull about once per back-off period, and poll() returns messages again by
    itself once the group is turned on."""
    topic = group = "daily-gc-poll"
    create_topic(cluster, topic, queues=4)  # 8 queues over the two broker groups
    with (
        Admin(cluster.namesrv) as admin,
        Producer(cluster.namesrv) as producer,
        caplog.at_level(logging.WARNING, logger="raftmq.consumer"),
        PullConsumer(
            cluster.namesrv, group, start_from=StartFrom.EARLIEST, long_poll_ms=500
        ) as consumer,
    ):
        consumer.subscribe(topic)

        def pulls() -> int:
            return sum(f.pulls for f in list(consumer._fetchers.values()))

        def poll_for(body: bytes, timeout_s: float) -> None:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if body in [m.body for m in consumer.poll(200)]:
                    return
            raise AssertionError(f"{body!r} not polled in {timeout_s:g} s")

        producer.send(topic, b"before")
        poll_for(b"before", 30)
        admin.update_group_config(group, consume_enable=False)
        raised: list[ConsumeDisabledError] = []
        deadline = time.monotonic() + 30
        while not raised and time.monotonic() < deadline:
            try:
                consumer.poll(200)
            except ConsumeDisabledError as exc:
                raised.append(exc)
        assert raised and "--consume on" in raised[0].message
        assert consumer.consume_disabled is raised[0]
        # A measurement window, not a wait for an event: polls go on, nothing more is raised,
        # and the pulls every queue sent in it are the gate's probes.
        start, t0 = pulls(), time.monotonic()
        while time.monotonic() - t0 < 3.0:
            try:
                assert consumer.poll(200) == []
            except ConsumeDisabledError as exc:
                raised.append(exc)
        sent, elapsed = pulls() - start, time.monotonic() - t0
        assert len(raised) == 1, raised
        assert sent <= elapsed / FIRST_PROBE_S + 1, (sent, elapsed)
        admin.update_group_config(group, consume_enable=True)
        producer.send(topic, b"after")
        poll_for(b"after", 30)
        assert consumer.consume_disabled is None
    assert caplog.text.count(f"consumer.consume_disabled group={group}") == 1, caplog.text
    assert f"consumer.consume_resumed group={group}" in caplog.text
    assert "consumer.pull_failed" not in caplog.text, caplog.text
