"""The stored batch version a broker group writes (broker/batch_version.py, issue 24 bar 4): the
decisions alone, then a real group of three whose node n2 plays a raftmq of before (it says it
reads only v2): the leader refuses v3 whole and tells the SDK to send v2; once n2 reads v3 the
group writes v3 beside the v2 already stored and every batch reads back; and a producer told 3
re-encodes its batch in 2 when the group goes back to 2."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftmq.broker.batch_version import READS_ENV, accepted_version, reads_version
from raftmq.broker.produce import check_batch_version
from raftmq.client.admin import Admin
from raftmq.client.consumer_pull import PullConsumer
from raftmq.client.offsets import StartFrom
from raftmq.client.producer import Producer
from raftmq.client.raw_batch import decode_batches
from raftmq.common import frame, stored_batch, stored_send
from raftmq.common.data_api import DataMethod
from raftmq.common.errors import UnsupportedError
from raftmq.common.frame import error_from_detail
from raftmq.common.message import Message
from raftmq.common.pb import broker_pb2
from raftmq.common.transport import FrameClient, LoopThread
from raftmq.common.types import QueueRef
from raftmq.raftlog.raft_node import features_of, hello_nonce
from tests.harness.procs import Cluster, Proc, start_cluster, wait_until

GROUP = "broker-a"
TOPIC = "versions"
OLD = f"{GROUP}-n2"  # the node that says it reads only v2


# ---- the decisions -----------------------------------------------------------------------------


def test_the_group_writes_the_oldest_version_a_member_reads() -> None:
    peers = ("a:1", "b:1")
    assert accepted_version(3, {"a:1": 3, "b:1": 3}, peers) == 3
    assert accepted_version(3, {"a:1": 3}, peers) == 2  # b said nothing since this node started
    assert accepted_version(3, {"a:1": 3, "b:1": 0}, peers) == 2  # b is a node of before
    assert accepted_version(2, {"a:1": 3, "b:1": 3}, peers) == 2  # this node says 2
    assert accepted_version(3, {"a:1": 9, "b:1": 3}, peers) == 3  # a newer peer: still 3
    assert accepted_version(3, {"c:1": 2}, peers) == 2  # not a member: it does not count
    assert accepted_version(3, {}, ()) == 3  # a group of one


def test_what_a_node_says_it_reads() -> None:
    assert reads_version({}) == stored_batch.VERSION == 3
    assert reads_version({READS_ENV: "2"}) == 2
    for bad in ("1", "4", "v3"):
        with pytest.raises(ValueError, match=READS_ENV):
            reads_version({READS_ENV: bad})


def test_the_raft_hello_nonce_carries_the_byte_and_stays_random() -> None:
    a, b = hello_nonce(3), hello_nonce(3)
    assert len(a) == len(b) == 16 and a != b
    assert features_of(a) == 3 and features_of(hello_nonce(200)) == 200
    assert features_of(hello_nonce(0)) == 0  # says nothing: a plain random nonce
    # a node of before sends 16 random bytes: read as saying nothing
    assert sum(features_of(os.urandom(16)) != 0 for _ in range(1000)) == 0


def test_the_data_ports_hello_answer_carries_the_version_to_old_and_new_clients() -> None:
    raw = frame.encode_hello(frame.server_hello(1 << 20, 3))
    (hello_frame,) = frame.FrameDecoder(1 << 20, expect_hello=True).feed(raw)
    hello = frame.decode_hello(hello_frame.payload)  # the decoder every client has had
    assert hello.auth_method == frame.AUTH_NONE and hello.max_frame_bytes == 1 << 20
    assert frame.batch_version_of(hello) == 3
    assert frame.batch_version_of(frame.server_hello(1 << 20, 0)) == 0  # a server of before


def test_a_newer_batch_is_refused_with_the_version_to_send() -> None:
    check_batch_version(3, 3, GROUP)  # accepted: nothing raised
    with pytest.raises(UnsupportedError) as refused:
        check_batch_version(3, 2, GROUP)
    assert refused.value.details == {stored_send.BATCH_VERSION_DETAIL: "2"}
    assert "does not accept stored batch version 3 yet" in refused.value.message
    assert "upgrade every member" in refused.value.message


# ---- a real group ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp: Path = tmp_path_factory.mktemp("batch-version")
    c = start_cluster(tmp, groups=(GROUP,), namesrvs=1, broker_env={OLD: {READS_ENV: "2"}})
    try:
        with Admin(c.namesrv) as admin:
            admin.create_topic(TOPIC, queues=4)
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def io() -> Iterator[LoopThread]:
    loop = LoopThread("test-batch-version")
    yield loop
    loop.stop()


def _leader_data_address(cluster: Cluster) -> str:
    def find() -> str:
        with Admin(cluster.namesrv) as admin:
            for g in admin.groups():
                for n in g.nodes if g.broker_group == GROUP else ():
                    if n.is_leader and n.data_address:
                        return str(n.data_address)
        return ""

    address = wait_until(find, 60, "the leader's data address")
    assert isinstance(address, str)
    return address


def _call(io: LoopThread, address: str, method: DataMethod, payload: bytes) -> tuple[bytes, int]:
    """One call on a fresh connection: the answer, and the version its HELLO answer said."""
    host, _, port = address.rpartition(":")
    fc = FrameClient(host, int(port), loop=io.loop)
    try:
        out = fc.call_threadsafe(int(method), payload, 10).result(12)
        return out, fc.batch_version
    finally:
        io.run(fc.close())


def _said(cluster: Cluster, io: LoopThread) -> int:
    req = broker_pb2.GetQueueBoundsRequest(topic=TOPIC, queue_id=0).SerializeToString()
    try:
        return _call(io, _leader_data_address(cluster), DataMethod.GET_QUEUE_BOUNDS, req)[1]
    except Exception:  # a leader change meanwhile: asked again
        return 0


def _v3_batch(queue_id: int, body: bytes) -> bytes:
    return stored_batch.encode_batch(TOPIC, queue_id, [Message(TOPIC, body)], None, "h", 3)


def _send(cluster: Cluster, io: LoopThread, batch: bytes) -> stored_send.BatchAnswer:
    payload = stored_send.encode_request([batch], 0)
    raw, _ = _call(io, _leader_data_address(cluster), DataMethod.SEND_STORED, payload)
    (result,) = stored_send.decode_answer(raw).results
    return result


def _chunks(cluster: Cluster, io: LoopThread, queue_id: int) -> list[broker_pb2.RawBatch]:
    req = broker_pb2.PullMessageRequest(
        consumer_group="cg", topic=TOPIC, queue_id=queue_id, offset=0, max_count=64,
        raw_batches=True,
    )  # fmt: skip
    address = _leader_data_address(cluster)
    raw, _ = _call(io, address, DataMethod.PULL_MESSAGE, req.SerializeToString())
    return list(broker_pb2.PullMessageResponse.FromString(raw).batches)


def _restart(proc: Proc, reads: str | None) -> None:
    proc.stop()
    proc.env.pop(READS_ENV, None)
    if reads is not None:
        proc.env[READS_ENV] = reads
    proc.start("broker.started")


def _node(cluster: Cluster, name: str) -> Proc:
    return next(p for p in cluster.groups[GROUP][1] if p.name == name)


def test_a_member_of_before_keeps_the_group_on_v2(cluster: Cluster, io: LoopThread) -> None:
    wait_until(lambda: _said(cluster, io) == 2, 60, "the leader's HELLO saying 2")
    refused = _send(cluster, io, _v3_batch(0, b"v3-early"))
    assert refused.error is not None
    assert isinstance(error_from_detail(refused.error), UnsupportedError)
    assert "does not accept stored batch version 3 yet" in refused.error.message
    assert dict(refused.error.details) == {stored_send.BATCH_VERSION_DETAIL: "2"}
    assert _chunks(cluster, io, 0) == []  # refused whole: nothing stored
    with Producer(cluster.namesrv) as producer:
        for i in range(3):
            producer.send(TOPIC, b"old-%d" % i, queue=QueueRef(TOPIC, GROUP, 0))
    assert [b.chunk[1] for b in _chunks(cluster, io, 0)] == [2, 2, 2]


def test_once_every_member_reads_v3_it_is_written_beside_v2(
    cluster: Cluster, io: LoopThread
) -> None:
    _restart(_node(cluster, OLD), None)  # upgraded: it says it reads 3
    wait_until(lambda: _said(cluster, io) == 3, 60, "the leader's HELLO saying 3")
    accepted = _send(cluster, io, _v3_batch(0, b"v3-hand"))
    assert accepted.error is None and accepted.count == 1
    with Producer(cluster.namesrv) as producer:
        for i in range(3):
            producer.send(TOPIC, b"new-%d" % i, queue=QueueRef(TOPIC, GROUP, 0))
    batches = _chunks(cluster, io, 0)
    versions = [b.chunk[1] for b in batches]
    assert versions[:4] == [2, 2, 2, 3] and versions[-1] == 3
    # a v3 batch of the SDK is smaller than the v2 one of the same message (the bar's point)
    assert len(batches[-1].chunk) < len(batches[0].chunk)
    want = [b"old-0", b"old-1", b"old-2", b"v3-hand", b"new-0", b"new-1", b"new-2"]
    assert [m.message.body for m in decode_batches(batches, GROUP, 0)] == want
    with PullConsumer(cluster.namesrv, "cg-mixed", start_from=StartFrom.EARLIEST) as consumer:
        consumer.assign([QueueRef(TOPIC, GROUP, 0)])
        got: list[bytes] = []
        wait_until(
            lambda: got.extend(m.body for m in consumer.poll(timeout_ms=1000)) or len(got) >= 7,
            30,
            "every message of both versions",
        )
    assert got == want


def test_a_producer_told_v3_re_encodes_in_v2_when_the_group_goes_back(
    cluster: Cluster, io: LoopThread
) -> None:
    queue = QueueRef(TOPIC, GROUP, 1)
    wait_until(lambda: _said(cluster, io) == 3, 60, "the leader's HELLO saying 3")
    with Producer(cluster.namesrv) as producer:
        producer.send(TOPIC, b"before", queue=queue)  # connects: its HELLO answer says 3
        producer.send(TOPIC, b"told-3", queue=queue)
        _restart(_node(cluster, OLD), "2")  # the member says 2 again
        wait_until(lambda: _said(cluster, io) == 2, 60, "the leader's HELLO saying 2")
        # This producer's connection was told 3 (unless the leader changed): its v3 batch is
        # refused whole, and sent again in v2.
        producer.send(TOPIC, b"after", queue=queue)
    batches = _chunks(cluster, io, 1)
    assert [b.chunk[1] for b in batches][1:] == [3, 2]
    assert [m.message.body for m in decode_batches(batches, GROUP, 1)] == [
        b"before", b"told-3", b"after",
    ]  # fmt: skip
