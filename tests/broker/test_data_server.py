"""The broker's framed data path against real processes: a NameServer and a three-node broker
group on loopback (tests/harness/procs.py), the leader found from the route's `data_address`,
driven with common/transport.py's FrameClient: sends (an idempotent retry answered as a
duplicate), pulls (FOUND, a long poll's NO_NEW_MSG, OFFSET_OUT_OF_RANGE), offsets, heartbeats
shared with gRPC, NOT_LEADER with the leader hint, malformed payloads, and 1 000 held long polls
that occupy no broker thread while a sender's latency holds."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from raftmq.client.admin import Admin
from raftmq.common.data_api import DataMethod
from raftmq.common.errors import (
    InvalidArgumentError,
    NotLeaderError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
)
from raftmq.common.message import encode_msg_id
from raftmq.common.pb import broker_pb2, broker_pb2_grpc, common_pb2, namesrv_pb2
from raftmq.common.transport import FrameClient, LoopThread
from tests.harness.procs import Cluster, Proc, start_cluster, wait_until

GROUP = "broker-a"
TOPIC = "frames"
IDLE_TOPIC = "frames-idle"


@dataclass
class Node:
    node: namesrv_pb2.BrokerNode
    proc: Proc
    client: FrameClient


@dataclass
class Env:
    cluster: Cluster
    io: LoopThread
    leader: Node
    followers: list[Node]

    def call(self, node: Node, method: DataMethod, req: object, timeout_s: float = 10) -> bytes:
        payload = req.SerializeToString()  # type: ignore[attr-defined]
        return node.client.call_threadsafe(method, payload, timeout_s).result(timeout_s + 2)


def _nodes(namesrv: str) -> list[namesrv_pb2.BrokerNode]:
    with Admin(namesrv) as admin:
        (group,) = [g for g in admin.groups() if g.broker_group == GROUP]
        nodes = list(group.nodes)
    if len(nodes) == 3 and all(n.data_address for n in nodes) and any(n.is_leader for n in nodes):
        return nodes
    return []


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp: Path = tmp_path_factory.mktemp("data-server")
    cluster = start_cluster(tmp, groups=(GROUP,), namesrvs=1)
    io = LoopThread("test-frames")
    try:
        nodes = wait_until(lambda: _nodes(cluster.namesrv), 60, "3 nodes with data addresses")
        assert isinstance(nodes, list)
        _, procs = cluster.groups[GROUP]
        by_id = {p.name.rsplit("-", 1)[1]: p for p in procs}
        wrapped = []
        for n in nodes:
            host, _, port = n.data_address.rpartition(":")
            assert n.data_address != n.address
            wrapped.append(Node(n, by_id[n.node_id], FrameClient(host, int(port), loop=io.loop)))
        leader = next(w for w in wrapped if w.node.is_leader)
        e = Env(cluster, io, leader, [w for w in wrapped if w is not leader])
        # the first send waits for the new leader's gate; and the topics exist from here on
        for topic in (TOPIC, IDLE_TOPIC):
            wait_until(
                lambda t=topic: e.call(e.leader, DataMethod.SEND_MESSAGE, send_req(t, 7, b"init")),
                30,
                f"a first send to {topic}",
            )
        yield e
        for w in wrapped:
            io.run(w.client.close())
    finally:
        io.stop()
        cluster.close()


def send_req(
    topic: str, queue_id: int, *bodies: bytes, producer: tuple[str, int] = ("", 0)
) -> broker_pb2.SendMessageRequest:
    return broker_pb2.SendMessageRequest(
        topic=topic,
        queue_id=queue_id,
        messages=[common_pb2.Message(body=b, tags="t") for b in bodies],
        producer_id=producer[0],
        first_sequence=producer[1],
    )


def pull_req(topic: str, queue_id: int, offset: int, wait_ms: int) -> broker_pb2.PullMessageRequest:
    return broker_pb2.PullMessageRequest(
        consumer_group="cg", topic=topic, queue_id=queue_id, offset=offset, max_wait_ms=wait_ms
    )


def sent(raw: bytes) -> broker_pb2.SendMessageResponse:
    return broker_pb2.SendMessageResponse.FromString(raw)


def pulled(raw: bytes) -> broker_pb2.PullMessageResponse:
    return broker_pb2.PullMessageResponse.FromString(raw)


def leader_status(env: Env) -> broker_pb2.BrokerStatus:
    with grpc.insecure_channel(env.leader.node.address) as channel:
        return broker_pb2_grpc.BrokerStub(channel).GetBrokerStatus(
            broker_pb2.GetBrokerStatusRequest(), timeout=5
        )


def indexed(env: Env) -> None:
    """Sends are answered at commit and indexed after (issue 29). A pull at the queue's end
    catches up with the index once, and so do queue bounds (requests.index_catch_up), but a
    pull that starts below the end reads what is indexed: one expecting every message of
    several sends waits for the leader's index first, as a consumer's next pull would."""
    target = leader_status(env).commit_index
    wait_until(lambda: leader_status(env).dispatch_index >= target, 10, "the leader's index")


def threads_of(proc: Proc) -> int:
    assert proc.popen is not None
    for line in Path(f"/proc/{proc.popen.pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")


def test_every_node_advertises_its_data_address(env: Env) -> None:
    addresses = {n.node.data_address for n in [env.leader, *env.followers]}
    assert len(addresses) == 3
    assert all(a.startswith("127.0.0.1:") for a in addresses)


def test_send_with_idempotent_retry_then_pull(env: Env) -> None:
    req = send_req(TOPIC, 0, b"a", b"b", b"c", producer=("p-frames", 0))
    first = sent(env.call(env.leader, DataMethod.SEND_MESSAGE, req))
    again = sent(env.call(env.leader, DataMethod.SEND_MESSAGE, req))
    assert first.broker_group == GROUP
    assert [(r.queue_offset, r.duplicate) for r in first.results] == [
        (0, False),
        (1, False),
        (2, False),
    ]
    assert [(r.msg_id, r.queue_offset, r.duplicate) for r in again.results] == [
        (r.msg_id, r.queue_offset, True) for r in first.results
    ]
    found = pulled(env.call(env.leader, DataMethod.PULL_MESSAGE, pull_req(TOPIC, 0, 0, 0)))
    assert found.status == broker_pb2.FOUND
    assert [m.message.body for m in found.messages] == [b"a", b"b", b"c"]
    assert [m.msg_id for m in found.messages] == [r.msg_id for r in first.results]
    assert (found.next_offset, found.max_offset) == (3, 3)

    t0 = time.monotonic()
    empty = pulled(env.call(env.leader, DataMethod.PULL_MESSAGE, pull_req(TOPIC, 0, 3, 1000)))
    held_s = time.monotonic() - t0
    assert empty.status == broker_pb2.NO_NEW_MSG and empty.next_offset == 3
    assert 0.9 <= held_s < 3.0, held_s

    with pytest.raises(OffsetOutOfRangeError) as info:
        env.call(env.leader, DataMethod.PULL_MESSAGE, pull_req(TOPIC, 0, 100, 0))
    assert info.value.code == "OFFSET_OUT_OF_RANGE"


def batches_req(*batches: broker_pb2.SendMessageRequest) -> broker_pb2.SendBatchesRequest:
    return broker_pb2.SendBatchesRequest(batches=batches)


def sent_batches(raw: bytes) -> broker_pb2.SendBatchesResponse:
    return broker_pb2.SendBatchesResponse.FromString(raw)


def bodies(env: Env, queue_id: int) -> list[bytes]:
    indexed(env)
    found = pulled(env.call(env.leader, DataMethod.PULL_MESSAGE, pull_req(TOPIC, queue_id, 0, 0)))
    return [m.message.body for m in found.messages]


def test_send_batches_share_one_entry_and_fail_apart(env: Env) -> None:
    """The fast path's request: the batches of several queues in one frame become one Raft
    entry (one chunk each), each answered with its base offset and count; a refused batch is
    its own answer and does not fail the others."""
    out = sent_batches(
        env.call(
            env.leader,
            DataMethod.SEND_BATCHES,
            batches_req(
                send_req(TOPIC, 4, b"q4-a", b"q4-b"),
                send_req(TOPIC, 99, b"no such queue"),
                send_req(TOPIC, 5, b"q5-a"),
            ),
        )
    )
    assert out.broker_group == GROUP
    ok4, bad, ok5 = out.results
    assert not ok4.HasField("error") and not ok5.HasField("error")
    assert (ok4.queue_id, ok4.first_offset, ok4.count) == (4, 0, 2)
    assert (ok5.queue_id, ok5.first_offset, ok5.count) == (5, 0, 1)
    assert ok4.raft_index == ok5.raft_index and ok4.slot != ok5.slot  # one entry, two chunks
    assert common_pb2.ErrorCode.Name(bad.error.code) == "INVALID_ARGUMENT"
    assert "queue 99 does not exist" in bad.error.message
    found = pulled(env.call(env.leader, DataMethod.PULL_MESSAGE, pull_req(TOPIC, 4, 0, 0)))
    assert [m.message.body for m in found.messages] == [b"q4-a", b"q4-b"]
    assert [m.msg_id for m in found.messages] == [
        encode_msg_id(GROUP, ok4.raft_index, ok4.slot, ok4.first_position + i) for i in range(2)
    ]


def test_a_strict_batch_never_lands_before_an_earlier_one(env: Env) -> None:
    """Several batches of one queue in flight: the third arrives first (the first and second
    are being retried). Stored then, the second's retry would be taken for a duplicate and
    dropped while acknowledged. The broker refuses it unstored (OUT_OF_ORDER_SEQUENCE); the
    queue holds every sequence once, in order; a retried batch gets its original offsets."""
    pid, q = "p-strict", 6

    def batch(seq: int, *names: bytes, strict: bool) -> broker_pb2.SendMessageRequest:
        req = send_req(TOPIC, q, *names, producer=(pid, seq))
        req.strict_sequence = strict
        return req

    first = batch(0, b"s0", b"s1", strict=False)  # the oldest in flight: not strict
    second = batch(2, b"s2", b"s3", strict=True)
    third = batch(4, b"s4", strict=True)
    out = sent_batches(env.call(env.leader, DataMethod.SEND_BATCHES, batches_req(third, first)))
    early, stored = out.results
    assert common_pb2.ErrorCode.Name(early.error.code) == "OUT_OF_ORDER_SEQUENCE"
    assert (stored.first_offset, stored.count, stored.duplicate) == (0, 2, False)
    # the out-of-order batch again, still ahead of the second: refused again
    with pytest.raises(OutOfOrderSequenceError):
        env.call(env.leader, DataMethod.SEND_MESSAGE, third)
    out = sent_batches(env.call(env.leader, DataMethod.SEND_BATCHES, batches_req(second, third)))
    assert [(r.first_offset, r.count, r.duplicate) for r in out.results] == [
        (2, 2, False),
        (4, 1, False),
    ]
    # a retry of the second (its answer was lost): the original offsets, stored once
    dup = sent_batches(env.call(env.leader, DataMethod.SEND_BATCHES, batches_req(second)))
    assert [(r.first_offset, r.count, r.duplicate) for r in dup.results] == [(2, 2, True)]
    assert bodies(env, q) == [b"s0", b"s1", b"s2", b"s3", b"s4"]


def test_long_poll_answers_as_soon_as_a_message_arrives(env: Env) -> None:
    held = env.leader.client.call_threadsafe(
        DataMethod.PULL_MESSAGE, pull_req(TOPIC, 1, 0, 10_000).SerializeToString(), 15
    )
    time.sleep(0.3)
    assert not held.done()
    t0 = time.monotonic()
    env.call(env.leader, DataMethod.SEND_MESSAGE, send_req(TOPIC, 1, b"wake"))
    answer = pulled(held.result(5))
    assert time.monotonic() - t0 < 1.0
    assert [m.message.body for m in answer.messages] == [b"wake"]


def test_offsets_bounds_and_heartbeat(env: Env) -> None:
    env.call(env.leader, DataMethod.SEND_MESSAGE, send_req(TOPIC, 2, b"x", b"y"))
    commit = broker_pb2.CommitOffsetRequest(
        consumer_group="cg", offsets=[broker_pb2.QueueOffset(topic=TOPIC, queue_id=2, offset=2)]
    )
    env.call(env.leader, DataMethod.COMMIT_OFFSET, commit)
    query = broker_pb2.QueryOffsetRequest(consumer_group="cg", topic=TOPIC, queue_id=2)
    got = broker_pb2.QueryOffsetResponse.FromString(
        env.call(env.leader, DataMethod.QUERY_OFFSET, query)
    )
    assert got.offset == 2
    unknown = broker_pb2.QueryOffsetRequest(consumer_group="nobody", topic=TOPIC, queue_id=2)
    none = broker_pb2.QueryOffsetResponse.FromString(
        env.call(env.leader, DataMethod.QUERY_OFFSET, unknown)
    )
    assert none.offset == -1
    bounds = broker_pb2.GetQueueBoundsResponse.FromString(
        env.call(
            env.leader,
            DataMethod.GET_QUEUE_BOUNDS,
            broker_pb2.GetQueueBoundsRequest(topic=TOPIC, queue_id=2),
        )
    )
    assert (bounds.min_offset, bounds.max_offset) == (0, 2)
    assert bounds.max_store_timestamp_ms >= bounds.min_store_timestamp_ms > 0
    found = broker_pb2.SearchOffsetByTimestampResponse.FromString(
        env.call(
            env.leader,
            DataMethod.SEARCH_OFFSET_BY_TIMESTAMP,
            broker_pb2.SearchOffsetByTimestampRequest(topic=TOPIC, queue_id=2, timestamp_ms=0),
        )
    )
    assert found.offset == 0
    beat = broker_pb2.HeartbeatRequest(
        consumer_group="cg", client_id="frames-client", topics=[TOPIC], expiry_ms=30_000
    )
    env.call(env.leader, DataMethod.HEARTBEAT, beat)
    # the gRPC service sees the member the framed heartbeat registered: one registry per node
    with grpc.insecure_channel(env.leader.node.address) as channel:
        listed = broker_pb2_grpc.BrokerStub(channel).GetConsumerList(
            broker_pb2.GetConsumerListRequest(consumer_group="cg"), timeout=5
        )
    assert list(listed.client_ids) == ["frames-client"]


def test_follower_answers_not_leader_with_the_leader_hint(env: Env) -> None:
    follower = env.followers[0]
    with pytest.raises(NotLeaderError) as info:
        env.call(follower, DataMethod.SEND_MESSAGE, send_req(TOPIC, 0, b"no"))
    assert info.value.leader_hint == env.leader.node.address
    assert info.value.retryable
    with pytest.raises(NotLeaderError):
        env.call(follower, DataMethod.PULL_MESSAGE, pull_req(TOPIC, 0, 0, 0))
    # a follower read is allowed when asked for
    req = pull_req(TOPIC, 0, 0, 0)
    req.allow_follower_read = True
    answer = pulled(env.call(follower, DataMethod.PULL_MESSAGE, req))
    assert answer.node_id == follower.node.node_id


def test_malformed_payloads_are_invalid_argument_and_the_connection_survives(env: Env) -> None:
    for method in DataMethod:
        with pytest.raises(InvalidArgumentError):
            env.leader.client.call_threadsafe(method, b"\xff\xff\xff\xff", 5).result(7)
    with pytest.raises(InvalidArgumentError):  # parses, fails validation
        env.call(env.leader, DataMethod.PULL_MESSAGE, pull_req("bad topic!", 0, 0, 0))
    bounds = broker_pb2.GetQueueBoundsRequest(topic=TOPIC, queue_id=0)
    # answered (an empty queue's bounds encode to b"": parse, do not test the bytes' truth)
    got = broker_pb2.GetQueueBoundsResponse.FromString(
        env.call(env.leader, DataMethod.GET_QUEUE_BOUNDS, bounds)
    )
    assert 0 <= got.min_offset <= got.max_offset


def test_a_thousand_held_polls_take_no_threads_and_sends_keep_their_latency(env: Env) -> None:
    leader = env.leader
    threads_before = threads_of(leader.proc)
    clients: list[FrameClient] = []
    host, _, port = leader.node.data_address.rpartition(":")
    for _ in range(100):
        clients.append(FrameClient(host, int(port), loop=env.io.loop))
    polls: list[Future[bytes]] = []
    for i, client in enumerate(clients):
        for j in range(10):
            queue_id = (i * 10 + j) % 7  # queue 7 has the topic's only message
            req = pull_req(IDLE_TOPIC, queue_id, 0, 10_000)
            polls.append(
                client.call_threadsafe(DataMethod.PULL_MESSAGE, req.SerializeToString(), 20)
            )
    try:
        time.sleep(1.0)  # every poll reached the broker and is held
        assert not any(p.done() for p in polls), [p.exception() for p in polls if p.done()][:3]
        latencies = []
        for k in range(30):
            t0 = time.monotonic()
            out = sent(env.call(leader, DataMethod.SEND_MESSAGE, send_req(TOPIC, 3, b"%d" % k)))
            latencies.append(time.monotonic() - t0)
            assert not out.results[0].duplicate
        threads_during = threads_of(leader.proc)
        assert not any(p.done() for p in polls)
        assert max(latencies) < 0.5, latencies
        assert threads_during - threads_before < 20, (threads_before, threads_during)
        # the held polls are live: a send wakes the ones of its queue
        env.call(leader, DataMethod.SEND_MESSAGE, send_req(IDLE_TOPIC, 0, b"wake"))
        woken = [p for i, p in enumerate(polls) if i % 7 == 0]
        for p in woken:
            assert [m.message.body for m in pulled(p.result(5)).messages] == [b"wake"]
        assert not any(p.done() for i, p in enumerate(polls) if i % 7 != 0)
    finally:
        for client in clients:
            env.io.run(client.close())


def commit_index(env: Env) -> int:
    return int(leader_status(env).commit_index)


def test_an_unchanged_offset_commit_adds_no_log_entry(env: Env) -> None:
    """Issue 14: a thousand idle consumers commit unchanged offsets every second; each was a
    Raft entry replicated to every node. A commit that changes nothing is answered at once."""

    def commit(*offsets: tuple[int, int]) -> None:
        req = broker_pb2.CommitOffsetRequest(
            consumer_group="cg-idle",
            offsets=[broker_pb2.QueueOffset(topic=TOPIC, queue_id=q, offset=o) for q, o in offsets],
        )
        env.call(env.leader, DataMethod.COMMIT_OFFSET, req)

    def committed(queue_id: int) -> int:
        query = broker_pb2.QueryOffsetRequest(
            consumer_group="cg-idle", topic=TOPIC, queue_id=queue_id
        )
        return broker_pb2.QueryOffsetResponse.FromString(
            env.call(env.leader, DataMethod.QUERY_OFFSET, query)
        ).offset

    commit((4, 0), (5, 0))
    before = commit_index(env)
    for _ in range(20):
        commit((4, 0), (5, 0))
    assert commit_index(env) - before < 5  # one entry each with the bug: 20 or more
    commit((4, 0), (5, 1))  # one changed, one not: the changed one is stored
    assert (committed(4), committed(5)) == (0, 1)
    assert commit_index(env) - before >= 1
