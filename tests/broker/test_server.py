"""A real broker group (three `python -m broker.server` processes) and a NameServer on loopback,
driven over gRPC: leader-only writes with a leader hint, send/pull with long polling, follower
reads, idempotent retries, offsets, queries, typed errors, and a SIGKILL of the leader."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from raftmq.client.raw_batch import decode_batches
from raftmq.common.errors import (
    InvalidArgumentError,
    InvalidNameError,
    MessageNotFoundError,
    MessageTooLargeError,
    NotLeaderError,
    OffsetOutOfRangeError,
    RaftMQError,
    TopicNotFoundError,
    from_rpc_error,
)
from raftmq.common.pb import (
    broker_pb2,
    broker_pb2_grpc,
    common_pb2,
    namesrv_pb2,
    namesrv_pb2_grpc,
)
from tests.harness.procs import (
    GroupLayout,
    Proc,
    broker_procs,
    free_ports,
    namesrv_proc,
    wait_until,
)

TOPIC = "orders"


@dataclass
class Group:
    namesrv: Proc
    namesrv_address: str
    layout: GroupLayout
    nodes: list[Proc]
    channels: list[grpc.Channel]

    def stub(self, i: int) -> broker_pb2_grpc.BrokerStub:
        return broker_pb2_grpc.BrokerStub(self.channels[i])

    def status(self, i: int) -> broker_pb2.BrokerStatus:
        return self.stub(i).GetBrokerStatus(broker_pb2.GetBrokerStatusRequest(), timeout=5)

    def leader(self, exclude: frozenset[int] = frozenset(), timeout_s: float = 20.0) -> int:
        def find() -> int | None:
            for i, node in enumerate(self.nodes):
                if i in exclude or not node.alive:
                    continue
                try:
                    if self.status(i).role == common_pb2.LEADER:
                        return i
                except grpc.RpcError:
                    continue
            return None

        found = wait_until(lambda: find() is not None, timeout_s, "a leader")
        assert found
        leader = find()
        assert leader is not None
        return leader


def call(fn: object, request: object, timeout: float = 15.0) -> object:
    try:
        return fn(request, timeout=timeout)  # type: ignore[operator]
    except grpc.RpcError as exc:
        raise from_rpc_error(exc) from None


def send(
    stub: broker_pb2_grpc.BrokerStub,
    bodies: list[bytes],
    *,
    topic: str = TOPIC,
    queue_id: int = 0,
    producer_id: str = "",
    first_sequence: int = 0,
    keys: tuple[str, ...] = (),
    tags: str = "",
) -> broker_pb2.SendMessageResponse:
    req = broker_pb2.SendMessageRequest(
        topic=topic,
        queue_id=queue_id,
        messages=[common_pb2.Message(body=b, keys=keys, tags=tags) for b in bodies],
        producer_id=producer_id,
        first_sequence=first_sequence,
    )
    out = call(stub.SendMessage, req)
    assert isinstance(out, broker_pb2.SendMessageResponse)
    return out


def pull(
    stub: broker_pb2_grpc.BrokerStub,
    offset: int,
    *,
    queue_id: int = 0,
    max_wait_ms: int = 0,
    follower: bool = False,
    expression: str = "",
    sql: bool = False,
    max_count: int = 64,
) -> broker_pb2.PullMessageResponse:
    req = broker_pb2.PullMessageRequest(
        consumer_group="g1",
        topic=TOPIC,
        queue_id=queue_id,
        offset=offset,
        max_count=max_count,
        max_wait_ms=max_wait_ms,
        allow_follower_read=follower,
        filter_type=broker_pb2.SQL92 if sql else broker_pb2.TAG,
        filter_expression=expression,
    )
    out = call(stub.PullMessage, req, timeout=max_wait_ms / 1000 + 15)
    assert isinstance(out, broker_pb2.PullMessageResponse)
    return out


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    tmp: Path = tmp_path_factory.mktemp("broker-server")
    ports = free_ports(7)
    ns = namesrv_proc(
        tmp, "ns", ports[0], ["--broker-expiry-ms", "3000", "--scan-interval-ms", "200"]
    )
    layout = GroupLayout("broker-a", ports[1:4], ports[4:7])
    nodes = broker_procs(
        tmp,
        layout,
        [f"127.0.0.1:{ports[0]}"],
        ["--no-auto-create-topic", "--max-message-bytes", "65536"],
    )
    channels: list[grpc.Channel] = []
    try:
        ns.start("namesrv.started")
        for n in nodes:
            n.start("broker.started")
        channels = [grpc.insecure_channel(layout.address(i)) for i in range(3)]
        g = Group(ns, f"127.0.0.1:{ports[0]}", layout, nodes, channels)
        leader = g.leader()
        call(
            g.stub(leader).CreateTopic,
            broker_pb2.CreateTopicRequest(
                config=common_pb2.TopicConfig(topic=TOPIC, read_queue_nums=4, write_queue_nums=4)
            ),
        )
        yield g
    finally:
        for ch in channels:
            ch.close()
        for p in [*nodes, ns]:
            p.kill()


def test_follower_refuses_writes_and_names_the_leader(group: Group) -> None:
    leader = group.leader()
    follower = (leader + 1) % 3
    wait_until(
        lambda: group.status(follower).leader_address == group.layout.address(leader),
        10,
        "the follower to know the leader",
    )
    with pytest.raises(NotLeaderError) as err:
        send(group.stub(follower), [b"x"])
    assert err.value.leader_hint == group.layout.address(leader)


def test_send_then_pull_on_leader_and_follower(group: Group) -> None:
    leader = group.leader()
    before = pull(group.stub(leader), 0, queue_id=1).max_offset
    bodies = [f"m{i}".encode() for i in range(10)]
    out = send(group.stub(leader), bodies, queue_id=1, keys=("k-send",))
    offsets = [r.queue_offset for r in out.results]
    assert offsets == list(range(before, before + 10))
    assert len({r.msg_id for r in out.results}) == 10
    assert all(r.msg_id.startswith("broker-a-") and not r.duplicate for r in out.results)
    got = pull(group.stub(leader), before, queue_id=1)
    assert got.status == broker_pb2.FOUND
    assert [m.message.body for m in got.messages] == bodies
    assert [m.msg_id for m in got.messages] == [r.msg_id for r in out.results]
    assert got.next_offset == before + 10
    # Every replica applies the same entries: a follower serves the same messages and ids.
    follower = (leader + 1) % 3
    same = wait_until(
        lambda: pull(group.stub(follower), before, queue_id=1, follower=True).messages,
        10,
        "the follower to serve the batch",
    )
    assert [(m.msg_id, m.queue_offset) for m in same] == [  # type: ignore[attr-defined]
        (m.msg_id, m.queue_offset) for m in got.messages
    ]
    # A follower refuses a read that did not allow it.
    with pytest.raises(NotLeaderError):
        pull(group.stub(follower), before, queue_id=1)


def test_long_poll_answers_when_a_message_arrives(group: Group) -> None:
    leader = group.leader()
    stub = group.stub(leader)
    end = pull(stub, 0, queue_id=2).max_offset
    sender = threading.Timer(0.5, lambda: send(stub, [b"late"], queue_id=2))
    started = time.monotonic()
    sender.start()
    try:
        got = pull(stub, end, queue_id=2, max_wait_ms=10_000)
    finally:
        sender.join()
    elapsed = time.monotonic() - started
    assert got.status == broker_pb2.FOUND
    assert [m.message.body for m in got.messages] == [b"late"]
    assert elapsed < 9, "the long poll must answer when the message arrives, not at its timeout"
    # Nothing arrives: the poll is held for max_wait_ms, then answers NO_NEW_MSG.
    started = time.monotonic()
    idle = pull(stub, end + 1, queue_id=2, max_wait_ms=600)
    assert idle.status == broker_pb2.NO_NEW_MSG
    assert time.monotonic() - started >= 0.55


def test_idempotent_retry_is_stored_once(group: Group) -> None:
    stub = group.stub(group.leader())
    first = send(stub, [b"a", b"b", b"c"], queue_id=3, producer_id="p-1", first_sequence=0)
    again = send(stub, [b"a", b"b", b"c"], queue_id=3, producer_id="p-1", first_sequence=0)
    assert all(r.duplicate for r in again.results)
    assert [r.queue_offset for r in again.results] == [r.queue_offset for r in first.results]
    assert [r.msg_id for r in again.results] == [r.msg_id for r in first.results]
    nxt = send(stub, [b"d"], queue_id=3, producer_id="p-1", first_sequence=3)
    assert nxt.results[0].queue_offset == first.results[-1].queue_offset + 1

    # The send was answered at its commit and indexed after (docs/architecture.md, "Dispatch is
    # asynchronous"), so a pull from a may answer a, b and c before d is indexed; the client's next
    # pull, at the queue's end, catches the dispatcher up once and reads d (pull_plan: a client
    # reads its own writes).
    bodies: list[bytes] = []
    offset = first.results[0].queue_offset
    for _ in range(4):  # as a consumer does: from where the last answer left it
        got = pull(stub, offset, queue_id=3)
        bodies += [m.message.body for m in got.messages]
        offset = got.next_offset
        if len(bodies) >= 4 or not got.messages:
            break
    assert bodies == [b"a", b"b", b"c", b"d"]


def test_bad_input_gets_typed_errors(group: Group) -> None:
    stub = group.stub(group.leader())
    with pytest.raises(MessageTooLargeError, match="65536"):
        send(stub, [b"x" * 65_537])
    with pytest.raises(TopicNotFoundError, match="auto-create is off"):
        send(stub, [b"x"], topic="no-such-topic")
    with pytest.raises(InvalidNameError):
        send(stub, [b"x"], topic="bad topic!")
    with pytest.raises(InvalidArgumentError, match="queue 99"):
        send(stub, [b"x"], queue_id=99)
    bad_props = broker_pb2.SendMessageRequest(
        topic=TOPIC,
        queue_id=0,
        messages=[common_pb2.Message(body=b"x", properties={"bad name\n": "v"})],
    )
    with pytest.raises(InvalidArgumentError):
        call(stub.SendMessage, bad_props)
    end = pull(stub, 0, queue_id=0).max_offset
    with pytest.raises(OffsetOutOfRangeError) as err:
        pull(stub, end + 5, queue_id=0)
    assert err.value.max_offset == end
    with pytest.raises(InvalidArgumentError, match="filter"):
        pull(stub, 0, queue_id=0, expression="a = ", sql=True)
    with pytest.raises(MessageNotFoundError):
        call(
            stub.QueryMessageById, broker_pb2.QueryMessageByIdRequest(msg_id="broker-a-" + "F" * 32)
        )
    # Nothing of the refused sends was stored.
    assert pull(stub, 0, queue_id=0).max_offset == end


def test_tag_and_sql_filters(group: Group) -> None:
    stub = group.stub(group.leader())
    start = pull(stub, 0, queue_id=0).max_offset
    send(stub, [b"t1"], queue_id=0, tags="TagA")
    send(stub, [b"t2"], queue_id=0, tags="TagB")
    props = broker_pb2.SendMessageRequest(
        topic=TOPIC,
        queue_id=0,
        messages=[
            common_pb2.Message(body=b"p1", properties={"amount": "5"}),
            common_pb2.Message(body=b"p2", properties={"amount": "50"}),
        ],
    )
    call(stub.SendMessage, props)
    tagged = pull(stub, start, queue_id=0, expression="TagB || TagC")
    assert [m.message.body for m in tagged.messages] == [b"t2"]
    big = pull(stub, start, queue_id=0, expression="amount > 10", sql=True)
    assert [m.message.body for m in big.messages] == [b"p2"]


def test_offsets_timestamps_and_queries(group: Group) -> None:
    stub = group.stub(group.leader())
    call(
        stub.CommitOffset,
        broker_pb2.CommitOffsetRequest(
            consumer_group="g-off",
            offsets=[broker_pb2.QueueOffset(topic=TOPIC, queue_id=1, offset=3)],
        ),
    )
    q = call(
        stub.QueryOffset,
        broker_pb2.QueryOffsetRequest(consumer_group="g-off", topic=TOPIC, queue_id=1),
    )
    assert q.offset == 3  # type: ignore[attr-defined]
    none = call(
        stub.QueryOffset,
        broker_pb2.QueryOffsetRequest(consumer_group="g-new", topic=TOPIC, queue_id=1),
    )
    assert none.offset == -1  # type: ignore[attr-defined]
    send(stub, [b"before"], queue_id=1)
    time.sleep(0.05)
    cut_ms = time.time_ns() // 1_000_000
    time.sleep(0.05)
    after = send(stub, [b"after"], queue_id=1)
    found = call(
        stub.SearchOffsetByTimestamp,
        broker_pb2.SearchOffsetByTimestampRequest(topic=TOPIC, queue_id=1, timestamp_ms=cut_ms),
    )
    assert found.offset == after.results[0].queue_offset  # type: ignore[attr-defined]
    reset = call(
        stub.ResetOffsetsToTimestamp,
        broker_pb2.ResetOffsetsToTimestampRequest(
            consumer_group="g-off", topic=TOPIC, timestamp_ms=cut_ms
        ),
    )
    by_queue = {o.queue_id: o.offset for o in reset.offsets}  # type: ignore[attr-defined]
    assert by_queue[1] == after.results[0].queue_offset
    q = call(
        stub.QueryOffset,
        broker_pb2.QueryOffsetRequest(consumer_group="g-off", topic=TOPIC, queue_id=1),
    )
    assert q.offset == after.results[0].queue_offset  # type: ignore[attr-defined]
    by_id = call(
        stub.QueryMessageById, broker_pb2.QueryMessageByIdRequest(msg_id=after.results[0].msg_id)
    )
    assert by_id.message.message.body == b"after"  # type: ignore[attr-defined]
    keyed = send(stub, [b"k1", b"k2"], queue_id=2, keys=("order-42",))
    hits = call(
        stub.QueryMessagesByKey,
        broker_pb2.QueryMessagesByKeyRequest(topic=TOPIC, key="order-42", max_count=10),
    )
    assert sorted(m.msg_id for m in hits.messages) == sorted(r.msg_id for r in keyed.results)  # type: ignore[attr-defined]


def test_namesrv_routes_to_the_leader(group: Group) -> None:
    leader = group.leader()
    ns = namesrv_pb2_grpc.NameServerStub(grpc.insecure_channel(group.namesrv_address))

    def route_leader() -> str:
        r = ns.GetRouteInfoByTopic(namesrv_pb2.GetRouteInfoByTopicRequest(topic=TOPIC), timeout=5)
        return r.groups[0].leader_address if r.groups else ""

    wait_until(
        lambda: route_leader() == group.layout.address(leader), 10, "the route to the leader"
    )


def test_sigkill_leader_keeps_acknowledged_messages(group: Group) -> None:
    leader = group.leader()
    stub = group.stub(leader)
    acked = send(stub, [f"ack{i}".encode() for i in range(20)], queue_id=3)
    group.nodes[leader].kill(signal.SIGKILL)
    new = group.leader(exclude=frozenset({leader}))
    assert new != leader
    first = acked.results[0].queue_offset
    got = wait_until(
        lambda: pull(group.stub(new), first, queue_id=3, max_count=20).messages,
        20,
        "reads on the new leader",
    )
    assert [m.msg_id for m in got] == [r.msg_id for r in acked.results]  # type: ignore[attr-defined]
    more = send(group.stub(new), [b"after-failover"], queue_id=3)
    assert more.results[0].queue_offset > acked.results[-1].queue_offset
    # The NameServer learns the new leader from its registration on the role change.
    ns = namesrv_pb2_grpc.NameServerStub(grpc.insecure_channel(group.namesrv_address))
    wait_until(
        lambda: (
            ns.GetRouteInfoByTopic(namesrv_pb2.GetRouteInfoByTopicRequest(topic=TOPIC), timeout=5)
            .groups[0]
            .leader_address
            == group.layout.address(new)
        ),
        10,
        "the NameServer to route to the new leader",
    )
    # The killed node restarts and catches up with everything, including what came after.
    group.nodes[leader].start("broker.started")
    group.channels[leader] = grpc.insecure_channel(group.layout.address(leader))
    wait_until(
        lambda: (
            len(pull(group.stub(leader), first, queue_id=3, follower=True, max_count=64).messages)
            == 21
        ),
        30,
        "the restarted node to catch up",
    )


def test_sigterm_hands_leadership_off_and_exits_cleanly(group: Group) -> None:
    leader = group.leader()
    code = group.nodes[leader].stop()
    assert code == 0, group.nodes[leader].tail()
    new = group.leader(exclude=frozenset({leader}))
    send(group.stub(new), [b"after-clean-stop"], queue_id=0)
    group.nodes[leader].start("broker.started")
    group.channels[leader] = grpc.insecure_channel(group.layout.address(leader))


def test_errors_are_raftmq_errors(group: Group) -> None:
    """No failure crosses the wire as a bare status: every one decodes to a typed error."""
    stub = group.stub(group.leader())
    with pytest.raises(RaftMQError) as err:
        call(stub.GetQueueBounds, broker_pb2.GetQueueBoundsRequest(topic="", queue_id=0))
    assert err.value.code in {"INVALID_NAME", "INVALID_ARGUMENT"}


def test_raw_batches_decode_to_the_same_messages(group: Group) -> None:
    """A pull answered with stored record batches gives exactly what a decoded pull gives,
    with filters and with a byte limit that splits the answer."""
    stub = group.stub(group.leader())
    start = pull(stub, 0, queue_id=2).max_offset
    send(stub, [f"r{i}".encode() for i in range(30)], queue_id=2, tags="TagR")
    send(stub, [b"other"], queue_id=2, tags="TagO")
    props = broker_pb2.SendMessageRequest(
        topic=TOPIC,
        queue_id=2,
        messages=[
            common_pb2.Message(body=f"p{i}".encode(), properties={"n": str(i)}) for i in range(10)
        ],
    )
    call(stub.SendMessage, props)

    def both(**kw: object) -> tuple[list[tuple[str, int, bytes]], list[tuple[str, int, bytes]]]:
        base = dict(consumer_group="g1", topic=TOPIC, queue_id=2, offset=start, max_count=100, **kw)
        plain = call(stub.PullMessage, broker_pb2.PullMessageRequest(**base))  # type: ignore[arg-type]
        raw = call(stub.PullMessage, broker_pb2.PullMessageRequest(raw_batches=True, **base))  # type: ignore[arg-type]
        assert not raw.messages  # type: ignore[attr-defined]
        decoded = decode_batches(raw.batches, "broker-a", 2)  # type: ignore[attr-defined]
        a = [(m.msg_id, m.queue_offset, m.message.body) for m in plain.messages]  # type: ignore[attr-defined]
        b = [(m.msg_id, m.queue_offset, m.message.body) for m in decoded]
        assert raw.next_offset == plain.next_offset  # type: ignore[attr-defined]
        return a, b

    a, b = both()
    assert a == b and len(a) == 41
    a, b = both(filter_type=broker_pb2.TAG, filter_expression="TagO")
    assert a == b and [x[2] for x in a] == [b"other"]
    a, b = both(filter_type=broker_pb2.SQL92, filter_expression="n >= 7")
    assert a == b and [x[2] for x in a] == [b"p7", b"p8", b"p9"]
    # A byte limit below one batch still answers that batch, and stops before the next.
    raw = call(
        stub.PullMessage,
        broker_pb2.PullMessageRequest(
            consumer_group="g1",
            topic=TOPIC,
            queue_id=2,
            offset=start,
            max_count=100,
            max_bytes=10,
            raw_batches=True,
        ),
    )
    assert len(raw.batches) == 1 and raw.next_offset == start + 30  # type: ignore[attr-defined]
