"""Bad input and failures on a real cluster: each gives a clear typed error and loses nothing.
Also the idempotent producer: a retried sequence is stored once, on the same node and on a new
leader after a leadership change."""

from __future__ import annotations

from concurrent.futures import Future

import grpc
import pytest

from raftmq.client.admin import Admin
from raftmq.client.consumer_pull import PullConsumer
from raftmq.client.consumer_push import PushConsumer
from raftmq.client.messages import SendResult
from raftmq.client.offsets import BrokerOffsets, StartFrom
from raftmq.client.producer import Producer
from raftmq.client.routes import ChannelPool, RouteCache
from raftmq.common.errors import (
    InvalidArgumentError,
    InvalidNameError,
    MessageTooLargeError,
    NoRouteError,
    NotLeaderError,
    OffsetOutOfRangeError,
    QueueFullError,
    RaftMQError,
    TopicNotFoundError,
    from_rpc_error,
)
from raftmq.common.pb import broker_pb2, common_pb2
from raftmq.common.types import QueueRef
from tests.acceptance.cluster import create_topic, drain, wait_for_leaders
from tests.harness.procs import Cluster, wait_until

MIB = 1 << 20


def test_bad_messages_and_names_are_refused_and_the_good_ones_stored(cluster: Cluster) -> None:
    topic = "badinput"
    create_topic(cluster, topic, queues=1)
    good: list[SendResult] = []
    with Producer(cluster.namesrv, max_message_bytes=8 * MIB) as p:
        good.append(p.send(topic, b"good-0"))
        # Larger than the broker's 4 MiB: the broker refuses it (the SDK let it through).
        with pytest.raises(MessageTooLargeError, match="4194304"):
            p.send(topic, b"x" * (4 * MIB + 1))
        good.append(p.send(topic, b"good-1"))
        with pytest.raises(InvalidNameError):
            p.send("bad topic!", b"x")
        with pytest.raises(InvalidArgumentError, match="property name"):
            p.send(topic, b"x", properties={"bad\nname": "v"})
        with pytest.raises(InvalidArgumentError, match="reserved"):
            p.send(topic, b"x", properties={"UNIQ_KEY": "v"})
        with pytest.raises(InvalidArgumentError, match="control characters"):
            p.send(topic, b"x", properties={"ok": "bad\x00value"})
        with pytest.raises(InvalidArgumentError, match="tag"):
            p.send(topic, b"x", tags="   ")
        with pytest.raises(InvalidArgumentError, match="bytes"):
            p.send(topic, "not bytes")  # type: ignore[arg-type]
        # Unknown topic while auto-create is off on every broker.
        with pytest.raises(TopicNotFoundError, match="no-such-topic"):
            p.send("no-such-topic", b"x")
        good.append(p.send(topic, b"good-2"))
    with Producer(cluster.namesrv) as p, pytest.raises(MessageTooLargeError):
        p.send(topic, b"x" * (4 * MIB + 1))  # the SDK's own limit refuses before sending
    with Admin(cluster.namesrv) as admin:
        with pytest.raises(InvalidNameError):
            admin.create_topic("bad topic!")
        with pytest.raises(InvalidArgumentError, match="broker-z"):
            admin.create_topic("fine", broker_groups=["broker-z"])
        with pytest.raises(InvalidArgumentError, match="message id"):
            admin.message_by_id("not-an-id")
    with pytest.raises(InvalidNameError):
        PullConsumer(cluster.namesrv, "bad group!")
    with pytest.raises(InvalidNameError):
        PushConsumer(cluster.namesrv, "g", "bad topic!", print)
    with PullConsumer(cluster.namesrv, "g-unknown") as c, pytest.raises(NoRouteError):
        c.subscribe("no-such-topic")
    with pytest.raises(NoRouteError):
        PushConsumer(cluster.namesrv, "g-unknown", "no-such-topic", print).start()
    got = drain(cluster, topic, "g-bad", 3)
    assert sorted(m.msg_id for m in got) == sorted(r.msg_id for r in good), "lost or extra"


def test_pull_beyond_the_end(cluster: Cluster) -> None:
    topic = "beyond"
    create_topic(cluster, topic, queues=1)
    with Producer(cluster.namesrv) as p:
        first = p.send(topic, b"before")
    q = QueueRef(topic, first.broker_group, first.queue_id)
    with Admin(cluster.namesrv) as admin:
        leader = admin.routes.leader(topic, q.broker_group)
    pool = ChannelPool()
    try:
        req = broker_pb2.PullMessageRequest(
            consumer_group="g-beyond",
            topic=topic,
            queue_id=q.queue_id,
            offset=first.queue_offset + 10,
        )
        with pytest.raises(grpc.RpcError) as info:
            pool.broker(leader).PullMessage(req, timeout=10)
        err = from_rpc_error(info.value)
        assert isinstance(err, OffsetOutOfRangeError)
        assert (err.min_offset, err.max_offset) == (0, first.queue_offset + 1)
    finally:
        pool.close()
    # The SDK resets a fetch beyond the end to the bound its policy names, and loses nothing.
    with PullConsumer(cluster.namesrv, "g-beyond", start_from=StartFrom.LATEST) as c:
        c.assign([q])
        c.seek(q, 1_000)
        wait_until(lambda: c.position(q) == first.queue_offset + 1, 30, "the reset to latest")
        with Producer(cluster.namesrv) as p:
            after = [p.send(topic, f"after-{i}".encode(), queue=q) for i in range(3)]
        got: list[bytes] = []
        wait_until(lambda: len(got.__iadd__([m.body for m in c.poll(200)])) >= 3, 30, "3 new")
        assert got == [b"after-0", b"after-1", b"after-2"]
        assert [r.queue_offset for r in after] == [1, 2, 3]


def test_a_reset_is_confirmed_with_the_leader(cluster: Cluster) -> None:
    """An "out of range" answer may come from a node behind the leader (a follower named by a
    stale route): the SDK asks the leader before it resets, and keeps a position the leader
    holds, the end of the queue included (where a pull waits for the next message)."""
    topic = "confirm"
    create_topic(cluster, topic, queues=1)
    with Producer(cluster.namesrv) as p:
        sent = [p.send(topic, f"m{i}".encode()) for i in range(3)]
    q = QueueRef(topic, sent[0].broker_group, sent[0].queue_id)
    pool = ChannelPool()
    try:
        offsets = BrokerOffsets("g-confirm", RouteCache(cluster.namesrv_addresses, pool), pool)
        for held in (0, 1, 3):
            assert offsets.reset_for(q, held, StartFrom.EARLIEST) is None, held
            assert offsets.reset_for(q, held, StartFrom.LATEST) is None, held
        assert offsets.reset_for(q, 4, StartFrom.EARLIEST) == 0
        assert offsets.reset_for(q, 1_000, StartFrom.LATEST) == 3
    finally:
        pool.close()


def test_a_dead_namesrv_while_the_other_serves(cluster: Cluster) -> None:
    topic = "nsdead"
    create_topic(cluster, topic, queues=1)
    dead = cluster.namesrvs[0]
    dead.kill()
    try:
        with Producer(cluster.namesrv) as p:
            sent = [p.send(topic, f"n{i}".encode()) for i in range(20)]
        with Admin(cluster.namesrv) as admin:
            assert [g.broker_group for g in admin.groups()] == ["broker-a", "broker-b"]
        got = drain(cluster, topic, "g-nsdead", 20)
        assert sorted(m.msg_id for m in got) == sorted(r.msg_id for r in sent)
        # With no NameServer at all, the error names every address tried.
        with Producer(cluster.namesrv_addresses[0]) as p, pytest.raises(RaftMQError) as info:
            p.send(topic, b"x")
        assert cluster.namesrv_addresses[0] in info.value.message
    finally:
        dead.start("namesrv.started")
        wait_for_leaders(cluster)


def test_a_retried_producer_sequence_is_stored_once(cluster: Cluster) -> None:
    """What the SDK does after a lost answer or a leader change: resend the same request (same
    producer id, same first sequence, same queue). The broker answers with the original."""
    topic = "idempotent"
    create_topic(cluster, topic, queues=1)
    pool = ChannelPool()
    try:
        with Admin(cluster.namesrv) as admin:
            group = next(g for g in admin.groups() if g.broker_group == "broker-a")
        req = broker_pb2.SendMessageRequest(
            topic=topic,
            queue_id=0,
            messages=[common_pb2.Message(body=b"idem-0"), common_pb2.Message(body=b"idem-1")],
            producer_id="acceptance-idempotent",
            first_sequence=0,
        )
        first = pool.broker(group.leader_address).SendMessage(req, timeout=10)
        assert [r.duplicate for r in first.results] == [False, False]
        again = pool.broker(group.leader_address).SendMessage(req, timeout=10)
        assert [r.duplicate for r in again.results] == [True, True]
        assert [(r.msg_id, r.queue_offset) for r in again.results] == [
            (r.msg_id, r.queue_offset) for r in first.results
        ]
        # A new leader knows the producer's sequences too (replicated state).
        other = next(n.node_id for n in group.nodes if n.node_id != group.leader_node_id)
        with Admin(cluster.namesrv) as admin:
            assert admin.elect("broker-a", other) == other
        with pytest.raises(grpc.RpcError) as info:
            pool.broker(group.leader_address).SendMessage(req, timeout=10)
        hint = from_rpc_error(info.value)
        assert isinstance(hint, NotLeaderError) and hint.leader_hint
        on_new = pool.broker(hint.leader_hint).SendMessage(req, timeout=10)
        assert [r.duplicate for r in on_new.results] == [True, True]
        assert [r.msg_id for r in on_new.results] == [r.msg_id for r in first.results]
        nxt = req.__class__()
        nxt.CopyFrom(req)
        nxt.first_sequence = 2
        del nxt.messages[:]
        nxt.messages.append(common_pb2.Message(body=b"idem-2"))
        fresh = pool.broker(hint.leader_hint).SendMessage(nxt, timeout=10)
        assert not fresh.results[0].duplicate
        assert fresh.results[0].queue_offset == first.results[1].queue_offset + 1
    finally:
        pool.close()
    wait_for_leaders(cluster)
    got = drain(cluster, topic, "g-idempotent", 3)
    assert sorted(m.body for m in got) == [b"idem-0", b"idem-1", b"idem-2"], "stored once each"


def test_a_full_producer_buffer_raises_queue_full_and_loses_nothing_accepted(
    cluster: Cluster,
) -> None:
    topic = "fullbuffer"
    create_topic(cluster, topic, queues=1)
    accepted: list[Future[SendResult]] = []
    with (
        Producer(cluster.namesrv, max_buffered_messages=20, max_block_ms=0) as p,
        pytest.raises(QueueFullError, match="max_buffered_messages=20"),
    ):
        for i in range(10_000):
            accepted.append(p.send_async(topic, f"q{i}".encode()))
    results = [f.result(timeout=60) for f in accepted]
    assert 20 <= len(results) < 10_000
    got = drain(cluster, topic, "g-full", len(results))
    assert sorted(m.msg_id for m in got) == sorted(r.msg_id for r in results)
    with Producer(cluster.namesrv, max_buffered_messages=20, max_block_ms=30_000) as p:
        waited = [p.send_async(topic, f"w{i}".encode()) for i in range(500)]
        assert all(f.result(timeout=60).msg_id for f in waited), "blocking mode: all sent"


def test_a_pull_with_a_bad_filter_gets_a_typed_error_with_the_position(cluster: Cluster) -> None:
    """Issue 15: a filter the consumer would refuse is refused by the broker too (an old or
    foreign client), as INVALID_ARGUMENT with the position, never INTERNAL or an empty answer."""
    topic = "badfilter"
    create_topic(cluster, topic, queues=1)
    with Admin(cluster.namesrv) as admin:
        leader = admin.routes.leader(topic, "broker-a")
    pool = ChannelPool()
    try:
        cases = [
            (broker_pb2.SQL92, "region = = 'eu'", "position 9"),
            (broker_pb2.SQL92, "a IN ()", "position 6"),
            (broker_pb2.TAG, "TagA && TagB", "only have '||'"),
            (broker_pb2.TAG, "||", "position 0"),
        ]
        for filter_type, expression, text in cases:
            req = broker_pb2.PullMessageRequest(
                consumer_group="g-badfilter",
                topic=topic,
                queue_id=0,
                offset=0,
                filter_type=filter_type,
                filter_expression=expression,
            )
            with pytest.raises(grpc.RpcError) as info:
                pool.broker(leader).PullMessage(req, timeout=10)
            err = from_rpc_error(info.value)
            assert isinstance(err, InvalidArgumentError), (expression, err)
            assert text in err.message and expression in err.message, err.message
    finally:
        pool.close()


def test_a_broker_given_as_the_namesrv_is_named(cluster: Cluster) -> None:
    """`UNIMPLEMENTED: Method not found!` becomes a word on which role answered and what to pass."""
    layout, _ = cluster.groups["broker-a"]
    broker = f"127.0.0.1:{layout.grpc_ports[0]}"
    with Admin(broker) as admin, pytest.raises(InvalidArgumentError) as info:
        admin.list_topics()
    assert f"{broker} is a broker (node n0 of broker-a), not a NameServer" in info.value.message
    assert "pass the NameServer's address" in info.value.message
    # With a real NameServer beside it, the right one serves and the wrong one is skipped.
    with Admin(f"{broker};{cluster.namesrv_addresses[0]}") as admin:
        assert admin.groups()


def test_a_system_group_is_refused_by_the_broker(cluster: Cluster) -> None:
    topic = "sysgroup"
    create_topic(cluster, topic, queues=1)
    with Admin(cluster.namesrv) as admin:
        leader = admin.routes.leader(topic, "broker-a")
    pool = ChannelPool()
    try:
        req = broker_pb2.QueryOffsetRequest(consumer_group="%RETRY%g", topic=topic, queue_id=0)
        with pytest.raises(grpc.RpcError) as info:
            pool.broker(leader).QueryOffset(req, timeout=10)
        err = from_rpc_error(info.value)
        assert isinstance(err, InvalidNameError) and "reserved prefix" in err.message
    finally:
        pool.close()


def test_a_negative_queue_id_on_the_wire_is_invalid_argument(cluster: Cluster) -> None:
    topic = "negqueue"
    create_topic(cluster, topic, queues=1)
    with Admin(cluster.namesrv) as admin:
        leader = admin.routes.leader(topic, "broker-a")
    pool = ChannelPool()
    try:
        req = broker_pb2.QueryOffsetRequest(consumer_group="g-neg", topic=topic, queue_id=-1)
        with pytest.raises(grpc.RpcError) as info:
            pool.broker(leader).QueryOffset(req, timeout=10)
        assert isinstance(from_rpc_error(info.value), InvalidArgumentError)
    finally:
        pool.close()
