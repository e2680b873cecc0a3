"""The v2 stored batch as the produced batch (issue 24), against real processes: a NameServer
and a three-node broker group on loopback. A batch sent with SEND_STORED is stored as the bytes
the producer encoded (but the leader's store-time stamp) on all three nodes, pulled unchanged,
decoded by the SDK; corrupted batches from a hostile client get a typed error and store
nothing; a journal holding v1 batches still opens, and a pull spanning both formats reads both.
"""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftmq.broker.delivery import PROPERTY_TIMER_OUT_MS
from raftmq.broker.txn_records import HALF_PRODUCER_ID
from raftmq.client.admin import Admin
from raftmq.client.aio import AsyncProducer
from raftmq.client.consumer_pull import PullConsumer
from raftmq.client.messages import OutgoingMessage, SendResult
from raftmq.client.offsets import StartFrom
from raftmq.client.producer import Producer
from raftmq.client.raw_batch import decode_batches
from raftmq.common import stored_batch, stored_send
from raftmq.common.data_api import DataMethod
from raftmq.common.delay import PROPERTY_DELAY_MS
from raftmq.common.errors import InvalidArgumentError, QueueFullError
from raftmq.common.message import DLQ_TOPIC_PREFIX, Message
from raftmq.common.pb import broker_pb2, common_pb2, namesrv_pb2, transaction_pb2
from raftmq.common.record_batch import Kind, ProducerSequence
from raftmq.common.transport import FrameClient, LoopThread
from raftmq.common.types import QueueRef
from raftmq.raftlog import entry_codec
from raftmq.raftlog.journal.segment_journal import SegmentJournal
from tests.harness.procs import Cluster, start_cluster, wait_until

GROUP = "broker-a"
TOPIC = "stored"


@dataclass
class Env:
    cluster: Cluster
    io: LoopThread
    clients: dict[str, FrameClient]  # node id -> its data port
    leader: str

    def call(self, node: str, method: DataMethod, payload: bytes, timeout_s: float = 10) -> bytes:
        fc = self.clients[node]
        return fc.call_threadsafe(int(method), payload, timeout_s).result(timeout_s + 2)

    def send(self, *batches: bytes) -> stored_send.StoredSendAnswer:
        raw = self.call(self.leader, DataMethod.SEND_STORED, stored_send.encode_request(batches, 0))
        return stored_send.decode_answer(raw)

    def pull(
        self, node: str, queue_id: int, offset: int, *, raw: bool, follower: bool = False
    ) -> broker_pb2.PullMessageResponse:
        req = broker_pb2.PullMessageRequest(
            consumer_group="cg",
            topic=TOPIC,
            queue_id=queue_id,
            offset=offset,
            max_count=64,
            raw_batches=raw,
            allow_follower_read=follower,
        )
        out = self.call(node, DataMethod.PULL_MESSAGE, req.SerializeToString())
        return broker_pb2.PullMessageResponse.FromString(out)

    def max_offset(self, queue_id: int) -> int:
        req = broker_pb2.GetQueueBoundsRequest(topic=TOPIC, queue_id=queue_id)
        raw = self.call(self.leader, DataMethod.GET_QUEUE_BOUNDS, req.SerializeToString())
        return broker_pb2.GetQueueBoundsResponse.FromString(raw).max_offset


def _nodes(namesrv: str) -> list[namesrv_pb2.BrokerNode]:
    with Admin(namesrv) as admin:
        groups = [g for g in admin.groups() if g.broker_group == GROUP]
        nodes = list(groups[0].nodes) if groups else []
    if len(nodes) == 3 and all(n.data_address for n in nodes) and any(n.is_leader for n in nodes):
        return nodes
    return []


def _connect(cluster: Cluster, io: LoopThread) -> Env:
    nodes = wait_until(lambda: _nodes(cluster.namesrv), 60, "3 nodes with data addresses")
    assert isinstance(nodes, list)
    clients = {}
    for n in nodes:
        host, _, port = n.data_address.rpartition(":")
        clients[n.node_id] = FrameClient(host, int(port), loop=io.loop)
    leader = next(n.node_id for n in nodes if n.is_leader)
    return Env(cluster, io, clients, leader)


def _close(env: Env) -> None:
    for fc in env.clients.values():
        env.io.run(fc.close())


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp: Path = tmp_path_factory.mktemp("stored-send")
    cluster = start_cluster(tmp, groups=(GROUP,), namesrvs=1)
    io = LoopThread("test-stored")
    try:
        e = _connect(cluster, io)
        with Admin(cluster.namesrv) as admin:
            admin.create_topic(TOPIC, queues=8)
        # the first send waits for the new leader's gate
        wait_until(lambda: e.send(batch(7, b"init")).results[0].error is None, 30, "a first send")
        yield e
        _close(e)
    finally:
        io.stop()
        cluster.close()


def batch(queue_id: int, *bodies: bytes, producer: ProducerSequence | None = None) -> bytes:
    messages = [
        Message(TOPIC, b, "tag-a" if i % 2 else "tag-b", (f"key-{b.decode()}",), {"n": str(i)})
        for i, b in enumerate(bodies)
    ]
    return stored_batch.encode_batch(TOPIC, queue_id, messages, producer, "host-1")


def _same_but_stamp(stored: bytes, sent: bytes) -> None:
    """The leader changed only the stamp: state, stamp CRC, store time (bytes 2, 8..12, 24..32)
    and left the base offset slot 0 (offsets stay the dispatcher's)."""
    assert len(stored) == len(sent)
    assert stored[32:] == sent[32:]
    assert stored[:2] == sent[:2] and stored[3:8] == sent[3:8] and stored[12:24] == sent[12:24]
    header = stored_batch.verify_stamped(stored)
    assert header.stamped and header.base_offset == 0 and header.store_timestamp_ms > 0


def test_a_v2_batch_is_stored_as_sent_on_every_node_and_pulled_unchanged(env: Env) -> None:
    sent = batch(1, b"a", b"b", b"c")
    answer = env.send(sent)
    assert answer.broker_group == GROUP
    [r] = answer.results
    assert r.error is None and (r.first_offset, r.count, r.duplicate) == (0, 3, False)

    for node in env.clients:  # every node's journal chunk, as its pull reads it

        def indexed(n: str = node) -> broker_pb2.PullMessageResponse | None:
            out = env.pull(n, 1, 0, raw=True, follower=True)
            return out if out.status == broker_pb2.FOUND else None

        out = wait_until(indexed, 30, f"{node} has the batch")
        assert isinstance(out, broker_pb2.PullMessageResponse)
        [b] = out.batches
        _same_but_stamp(b.chunk, sent)
        assert (b.raft_index, b.slot, b.first_offset, list(b.positions)) == (
            r.raft_index, r.slot, 0, [0, 1, 2],
        )  # fmt: skip
        got = decode_batches(out.batches, GROUP, 1)
        assert [(m.message.body, m.message.tags, m.message.keys) for m in got] == [
            (b"a", "tag-b", ("key-a",)),
            (b"b", "tag-a", ("key-b",)),
            (b"c", "tag-b", ("key-c",)),
        ]
        assert [m.message.properties for m in got] == [{"n": "0"}, {"n": "1"}, {"n": "2"}]
        assert got[0].store_timestamp_ms == b.store_timestamp_ms > 0

    # From inside the batch: the same stored bytes, the positions asked for.
    inside = env.pull(env.leader, 1, 1, raw=True)
    assert [list(b.positions) for b in inside.batches] == [[1, 2]]
    assert [m.message.body for m in decode_batches(inside.batches, GROUP, 1)] == [b"b", b"c"]
    # A client that asks for messages (gRPC's form) gets them decoded by the broker.
    plain = env.pull(env.leader, 1, 0, raw=False)
    assert [m.message.body for m in plain.messages] == [b"a", b"b", b"c"]
    assert [m.queue_offset for m in plain.messages] == [0, 1, 2]
    # The key index is built from the v2 records.
    with Admin(env.cluster.namesrv) as admin:
        hits = wait_until(lambda: admin.messages_by_key(TOPIC, "key-b"), 30, "the key index")
        assert [m.body for m in hits] == [b"b"]


def test_tag_and_sql92_filters_on_v2_batches(env: Env) -> None:
    env.send(batch(2, b"x0", b"x1", b"x2", b"x3"))
    req = broker_pb2.PullMessageRequest(
        consumer_group="cg",
        topic=TOPIC,
        queue_id=2,
        offset=0,
        max_count=64,
        filter_type=broker_pb2.TAG,
        filter_expression="tag-a",
        raw_batches=True,
    )
    out = broker_pb2.PullMessageResponse.FromString(
        env.call(env.leader, DataMethod.PULL_MESSAGE, req.SerializeToString())
    )
    assert [m.message.body for m in decode_batches(out.batches, GROUP, 2)] == [b"x1", b"x3"]
    # SQL92 on the properties: the broker decodes the rows of a batch together
    req.filter_type, req.filter_expression = broker_pb2.SQL92, "n = '2' OR n = '3'"
    out = broker_pb2.PullMessageResponse.FromString(
        env.call(env.leader, DataMethod.PULL_MESSAGE, req.SerializeToString())
    )
    assert [list(b.positions) for b in out.batches] == [[2, 3]]
    assert [m.message.body for m in decode_batches(out.batches, GROUP, 2)] == [b"x2", b"x3"]


def test_idempotent_v2_batches_keep_the_window_and_strict_order(env: Env) -> None:
    first = batch(3, b"s0", b"s1", producer=ProducerSequence("p-v2", 0))
    [a] = env.send(first).results
    [again] = env.send(first).results  # a retry: answered with the original place
    assert a.error is None and again.error is None and again.duplicate
    assert (again.first_offset, again.raft_index) == (a.first_offset, a.raft_index)
    # Strict and ahead of the next expected sequence (2): refused unstored, typed.
    ahead = batch(3, b"s5", producer=ProducerSequence("p-v2", 5, strict=True))
    [refused] = env.send(ahead).results
    assert refused.error is not None
    assert common_pb2.ErrorCode.Name(refused.error.code) == "OUT_OF_ORDER_SEQUENCE"
    assert refused.error.details["expected_sequence"] == "2"
    nxt = batch(3, b"s2", producer=ProducerSequence("p-v2", 2, strict=True))
    [ok] = env.send(nxt).results
    assert ok.error is None and ok.first_offset == 2
    assert env.max_offset(3) == 3


def _corruptions() -> list[object]:
    good = batch(4, b"c0", b"c1", b"c2")
    h = stored_batch.read_header(good)
    crc_flip = bytearray(good)
    crc_flip[-1] ^= 0x01  # a body byte: the body CRC no longer matches
    length = bytearray(good)
    struct.pack_into("<I", length, 4, len(good) + 8)  # total length says more than was sent
    table = bytearray(good)  # offsets table [0, a, b] -> [0, b, a], CRC recomputed to match
    at = h.tables_at + 8 * h.count
    offs = struct.unpack_from("<3I", table, at)
    struct.pack_into("<3I", table, at, offs[0], offs[2], offs[1])
    struct.pack_into("<I", table, 12, crc32c.crc32c(memoryview(table)[32:]))
    stamped = bytearray(good)  # a client may not stamp: only the leader decides store time
    stored_batch.stamp(stamped, 0, 1)
    scheduled = bytearray(good)  # nor mark a delayed send: its due times are the leader's
    stored_batch.mark_scheduled(scheduled)
    cases = [
        ("body CRC", bytes(crc_flip)),
        ("total length", bytes(length)),
        ("offsets", bytes(table)),
        ("stamped", bytes(stamped)),
        ("scheduled", bytes(scheduled)),
        ("truncated", good[:40]),
    ]
    return [pytest.param(what, bad, id=what) for what, bad in cases]


@pytest.mark.parametrize(("what", "bad"), _corruptions())
def test_a_corrupted_batch_gets_a_typed_error_and_stores_nothing(
    env: Env, what: str, bad: bytes
) -> None:
    before = env.max_offset(4)
    good = batch(4, b"ok")
    refused, ok = env.send(bad, good).results
    assert refused.error is not None, what
    assert common_pb2.ErrorCode.Name(refused.error.code) == "INVALID_ARGUMENT", what
    assert "stored batch was refused" in refused.error.message, refused.error.message
    assert ok.error is None and ok.first_offset == before and ok.count == 1
    assert env.max_offset(4) == before + 1  # only the good batch


def test_a_frame_that_does_not_add_up_fails_whole(env: Env) -> None:
    before = env.max_offset(4)
    good = batch(4, b"never")
    framed = bytearray(stored_send.encode_request([good], 0))
    struct.pack_into("<I", framed, 8, len(good) + 100)  # the batch length overruns the frame
    with pytest.raises(InvalidArgumentError, match="overruns"):
        env.call(env.leader, DataMethod.SEND_STORED, bytes(framed))
    assert env.max_offset(4) == before


def test_the_sdk_producer_sends_v2_and_the_consumer_reads_it(env: Env) -> None:
    with Producer(env.cluster.namesrv, idempotent=True) as producer:
        queue = QueueRef(TOPIC, GROUP, 5)
        results = [
            producer.send(TOPIC, f"sdk-{i}".encode(), tags="t", queue=queue) for i in range(5)
        ]
    assert [r.queue_offset for r in results] == [0, 1, 2, 3, 4]
    out = env.pull(env.leader, 5, 0, raw=True)
    # Every batch is a stored batch; the SDK encodes v3 once its connection's HELLO said the
    # group accepts it (so the last ones at least: the first may have left before the answer).
    assert {b.chunk[1] for b in out.batches} <= {stored_batch.OLDEST_VERSION, stored_batch.VERSION}
    assert out.batches[-1].chunk[1] == stored_batch.VERSION
    with PullConsumer(env.cluster.namesrv, "cg-sdk", start_from=StartFrom.EARLIEST) as consumer:
        consumer.assign([queue])
        got: list[bytes] = []
        wait_until(
            lambda: got.extend(m.body for m in consumer.poll(timeout_ms=1000)) or len(got) >= 5,
            30,
            "five messages",
        )
    assert got == [f"sdk-{i}".encode() for i in range(5)]


def _journal_chunks(node_dir: Path) -> dict[tuple[int, int], bytes]:
    (journal_dir,) = [p for p in node_dir.rglob("journal") if p.is_dir()]
    out: dict[tuple[int, int], bytes] = {}
    with SegmentJournal(journal_dir) as j:
        at = j.first_index
        while at <= j.last_index:
            records = j.read_range(at, max_bytes=1 << 24, max_count=1024)
            for rec in records:
                for slot, chunk in enumerate(entry_codec.decode_data(rec.command)):
                    out[rec.index, slot] = chunk
            at = records[-1].index + 1
    return out


def test_journals_hold_the_same_bytes_and_every_broker_write_is_v2(env: Env) -> None:
    """The broker's own writes (issue 24: a delayed send, an older producer's SEND_BATCHES, a
    half message, a dead letter) are v2 stored batches like the producer's; every node's
    journal holds identical chunks, none of them v1; the group restarted on its journals pulls
    a delayed message delivered from its v2 batch. (v1 chunks, which stores written before
    issue 24 hold, are read by the same readers: tests/broker/test_store.py and
    test_dispatch_v2.py on real lmdb stores.)"""
    delayed = broker_pb2.SendBatchesRequest(
        batches=[
            broker_pb2.SendMessageRequest(
                topic=TOPIC,
                queue_id=6,
                messages=[
                    common_pb2.Message(
                        body=b"delayed-0",
                        tags="t",
                        keys=["k1"],
                        properties={PROPERTY_DELAY_MS: "1"},
                    )
                ],
            )
        ]
    )
    out = broker_pb2.SendBatchesResponse.FromString(
        env.call(env.leader, DataMethod.SEND_BATCHES, delayed.SerializeToString())
    )
    assert not out.results[0].HasField("error")
    for node in env.clients:  # delivered from the schedule at once, on every node
        wait_until(
            lambda n=node: env.pull(n, 6, 0, raw=False, follower=True).next_offset == 1,
            30,
            f"{node} delivered the delayed message",
        )
    [r] = env.send(batch(6, b"v2-1", b"v2-2")).results
    assert r.error is None and r.first_offset == 1
    for node in env.clients:  # every node indexed both
        wait_until(
            lambda n=node: env.pull(n, 6, 0, raw=False, follower=True).next_offset == 3,
            30,
            f"{node} indexed queue 6",
        )
    dead_letter_of = _broker_writes(env)

    cluster = env.cluster
    _close(env)
    _, procs = cluster.groups[GROUP]
    for p in procs:
        p.stop()
    chunks = [_journal_chunks(cluster.tmp / p.name) for p in procs]
    v2_chunks = [{k: c for k, c in node.items() if stored_batch.is_stored(c)} for node in chunks]
    assert len(v2_chunks[0]) >= 8  # every v2 batch of this module
    assert v2_chunks[0] == v2_chunks[1] == v2_chunks[2]
    assert chunks[0] == chunks[1] == chunks[2]  # and every other chunk alike
    _every_produce_chunk_is_v2(chunks[0], dead_letter_of)
    # Offsets by the leader (issue 29): a producer's batch is stored with the base offset it
    # was answered with (placed before replication); a delayed one gets its offsets when due.
    placed = stored_batch.placed_offset(chunks[0][r.raft_index, r.slot])
    assert placed == r.first_offset
    assert all(
        stored_batch.placed_offset(c) is None
        for c in v2_chunks[0].values()
        if stored_batch.is_scheduled(c)
    )

    for p in procs:
        p.start("broker.started")
    fresh = _connect(cluster, env.io)
    env.clients, env.leader = fresh.clients, fresh.leader

    def both() -> broker_pb2.PullMessageResponse | None:
        try:
            out = env.pull(env.leader, 6, 0, raw=True)
        except Exception:
            return None
        return out if out.status == broker_pb2.FOUND else None

    out_raw = wait_until(both, 60, "a pull after the restart")
    assert isinstance(out_raw, broker_pb2.PullMessageResponse)
    assert all(stored_batch.is_stored(b.chunk) for b in out_raw.batches)
    assert len(out_raw.batches) == 2
    assert stored_batch.is_scheduled(out_raw.batches[0].chunk)
    got = decode_batches(out_raw.batches, GROUP, 6)
    assert [(m.message.body, m.queue_offset) for m in got] == [
        (b"delayed-0", 0),
        (b"v2-1", 1),
        (b"v2-2", 2),
    ]
    assert got[0].message.keys == ("k1",) and PROPERTY_TIMER_OUT_MS in got[0].message.properties
    plain = env.pull(env.leader, 6, 0, raw=False)
    assert [m.message.body for m in plain.messages] == [b"delayed-0", b"v2-1", b"v2-2"]


def _broker_writes(env: Env) -> str:
    """The writes the broker encodes itself, none delayed: an older producer's SEND_BATCHES
    (queue 5), a transactional half message and its commit (queue 4), and a consumer's
    send-back of the first as a dead letter. Returns the dead letter's topic."""
    at4, at5 = env.max_offset(4), env.max_offset(5)  # earlier tests of the module wrote there
    old_sdk = broker_pb2.SendBatchesRequest(
        batches=[
            broker_pb2.SendMessageRequest(
                topic=TOPIC, queue_id=5, messages=[common_pb2.Message(body=b"old-sdk", tags="t")]
            )
        ]
    )
    out = broker_pb2.SendBatchesResponse.FromString(
        env.call(env.leader, DataMethod.SEND_BATCHES, old_sdk.SerializeToString())
    )
    assert not out.results[0].HasField("error")
    half = transaction_pb2.SendHalfMessageRequest(
        topic=TOPIC,
        queue_id=4,
        message=common_pb2.Message(body=b"half", keys=["hk"]),
        producer_group="pg",
        client_id="c1",
        transaction_id="txn-v2",
    )
    env.call(env.leader, DataMethod.SEND_HALF_MESSAGE, half.SerializeToString())
    end = transaction_pb2.EndTransactionRequest(
        transaction_id="txn-v2", producer_group="pg", resolution=transaction_pb2.COMMIT
    )
    env.call(env.leader, DataMethod.END_TRANSACTION, end.SerializeToString())
    committed = env.pull(env.leader, 4, at4, raw=True)
    assert [m.message.body for m in decode_batches(committed.batches, GROUP, 4)] == [b"half"]
    [stored] = env.pull(env.leader, 5, at5, raw=False).messages
    group = "cg-v2"
    with Admin(env.cluster.namesrv) as admin:
        leader = next(g.leader_address for g in admin.groups() if g.broker_group == GROUP)
        stub = admin._stub(leader)
        req = broker_pb2.ConsumerSendBackRequest(
            consumer_group=group, msg_id=stored.msg_id, max_reconsume_times=0
        )
        back = admin._rpc(lambda: stub.ConsumerSendBack(req, timeout=10))
    assert back.dead_letter
    return DLQ_TOPIC_PREFIX + group


def _every_produce_chunk_is_v2(chunks: dict[tuple[int, int], bytes], dead_letter: str) -> None:
    """Every produce chunk in a journal is a v2 stored batch (issue 24): the delayed send's
    flagged scheduled, the half message marked with the broker's producer id."""
    produce = [c for c in chunks.values() if c[0] == Kind.PRODUCE]
    assert [c for c in produce if not stored_batch.is_stored(c)] == []
    v2 = [stored_batch.verify_stamped(c) for c in produce]
    scheduled = [h for c, h in zip(produce, v2, strict=True) if stored_batch.is_scheduled(c)]
    assert [(h.topic, h.queue_id, h.count) for h in scheduled] == [(TOPIC, 6, 1)]
    assert {(h.topic, h.queue_id) for h in v2} >= {(TOPIC, 5), (TOPIC, 4)}
    assert any(h.topic == dead_letter for h in v2)
    [half] = [h for h in v2 if h.producer and h.producer.producer_id == HALF_PRODUCER_ID]
    assert (half.topic, half.queue_id, half.count) == (TOPIC, 4, 1)


def test_the_batch_first_call_has_one_future_per_batch(env: Env) -> None:
    """Producer.send_batch_future / AsyncProducer.send_batch_future: one future for many
    messages, the results in order on contiguous offsets of one queue, stored as encoded, in
    v3 once the connection's HELLO answer said the group accepts it."""
    queue = QueueRef(TOPIC, GROUP, 0)
    before = env.max_offset(0)
    bodies = [f"bulk-{i}".encode() for i in range(300)]
    with Producer(env.cluster.namesrv, idempotent=True, batch_max_messages=128) as producer:
        sent = list(bodies)
        fut = producer.send_batch_future(TOPIC, sent, queue=queue)
        sent.clear()  # the caller reuses its list at once: the call keeps what it was given
        results = fut.result(30)
        assert [r.queue_offset for r in results] == list(range(before, before + 300))
        assert len({r.msg_id for r in results}) == 300

        async def aio() -> list[SendResult]:
            async with AsyncProducer(env.cluster.namesrv) as p:
                return await p.send_batch_future(
                    TOPIC, [OutgoingMessage(b"a-0", tags="t"), b"a-1"], queue=queue
                )

        more = asyncio.run(aio())
        assert [r.queue_offset for r in more] == [before + 300, before + 301]
        empty = producer.send_batch_future(TOPIC, [], queue=queue)
        assert empty.result(1) == []
        few = [b"few-%d" % i for i in range(5)]  # one request: the call holds the bodies
        again = producer.send_batch_future(TOPIC, few, queue=queue)
        few.clear()  # the caller reuses its list at once: the call keeps what it was given
        assert [r.queue_offset for r in again.result(30)] == list(range(before + 302, before + 307))
    tail = env.pull(env.leader, 0, before + 302, raw=True)
    assert [m.message.body for m in decode_batches(tail.batches, GROUP, 0)][:5] == [
        b"few-%d" % i for i in range(5)
    ]
    # sent on a connection whose HELLO answer said the group accepts v3
    assert tail.batches[0].chunk[1] == stored_batch.VERSION
    out = env.pull(env.leader, 0, before, raw=True)
    assert {b.chunk[1] for b in out.batches} <= {stored_batch.OLDEST_VERSION, stored_batch.VERSION}
    assert [m.message.body for m in decode_batches(out.batches, GROUP, 0)] == bodies[:64]


def _column(bodies: list[bytes], rows: range) -> stored_batch.BodyColumn:
    """`bodies` in an Arrow binary column's layout (int32 offsets, the data)."""
    ends = [0]
    for b in bodies:
        ends.append(ends[-1] + len(b))
    return stored_batch.BodyColumn(struct.pack(f"={len(ends)}i", *ends), b"".join(bodies), rows)


def test_the_batch_call_takes_body_columns(env: Env) -> None:
    """BodyColumns (the Spark sink's bodies, read from Arrow's buffers): a call of two columns,
    one of strided rows, past batch_max_messages (parts that span the columns) is stored in
    order on contiguous offsets of its queue; an empty body is refused naming its message, and a
    column among other messages is refused."""
    queue = QueueRef(TOPIC, GROUP, 1)
    before = env.max_offset(1)
    first = [f"col-{i}".encode() for i in range(100)]
    second = [f"odd-{i}".encode() for i in range(200)]
    cols = [_column(first, range(100)), _column(second, range(1, 200, 2))]
    want = first + second[1::2]
    with Producer(env.cluster.namesrv, idempotent=True, batch_max_messages=64) as producer:
        results = producer.send_batch_future(TOPIC, cols, queue=queue).result(30)
        assert [r.queue_offset for r in results] == list(range(before, before + 200))
        with pytest.raises(InvalidArgumentError, match=r"body is empty \(message 2\)"):
            producer.send_batch_future(TOPIC, [_column([b"a", b"b", b"c", b"", b"d"], range(1, 5))])
        with pytest.raises(InvalidArgumentError, match="BodyColumns alone"):
            # a mix the signature forbids, sent anyway: the check an untyped caller meets
            producer.send_batch_future(TOPIC, [b"x", cols[0]])  # type: ignore[list-item]
    got: list[bytes] = []
    while len(got) < 200:
        out = env.pull(env.leader, 1, before + len(got), raw=True)
        got += [m.message.body for m in decode_batches(out.batches, GROUP, 1)]
    assert got[:200] == want


def test_the_asyncio_producer_runs_on_the_callers_loop(env: Env) -> None:
    """AsyncProducer on the caller's own loop (issue 24): SEND_STORED frames written and
    answered there, no I/O thread of the producer's, every future completed on the loop without
    a wake-up from a thread; a full buffer is QueueFullError at once for send_future (waiting
    would block the loop that empties it) and awaited by send(); one loop per producer."""
    queue = QueueRef(TOPIC, GROUP, 6)
    before = env.max_offset(6)

    async def run() -> tuple[list[SendResult], AsyncProducer]:
        kw = {"max_buffered_messages": 8, "max_block_ms": 4000}
        async with AsyncProducer(env.cluster.namesrv, **kw) as p:
            # The threaded API of a producer made in this loop, used first (a preload from a
            # worker thread), runs on this loop too.
            pre = await asyncio.to_thread(p.producer.send, TOPIC, b"pre", queue=queue)
            # A blocking call on this loop could only wait out its timeout: refused at once,
            # nothing buffered (the offsets below count 49).
            for blocking in (
                lambda: p.producer.send(TOPIC, b"blocks", queue=queue),
                lambda: p.producer.send_batch(TOPIC, [b"blocks"], queue=queue),
                p.producer.flush,
            ):
                with pytest.raises(InvalidArgumentError, match="would block the event loop"):
                    blocking()
            first = [p.send_future(TOPIC, b"f%d" % i, queue=queue) for i in range(8)]
            # Nothing can be answered before this loop runs again: the buffer is full now,
            # and waiting max_block_ms on this thread could not make room.
            t0 = time.monotonic()
            with pytest.raises(QueueFullError):
                p.send_future(TOPIC, b"over", queue=queue)
            assert time.monotonic() - t0 < 2.0
            sends = (p.send(TOPIC, b"s%d" % i, queue=queue) for i in range(40))
            rest = await asyncio.gather(*sends)
            waker = p._waker
            assert waker is not None and waker.direct == 48 and waker.wakeups == 0
            assert p.producer._sender.frames_sent >= 7  # 49 messages in buffers of 8 at most
            assert p.producer._data._loop_thread is None
            return [pre, *(await asyncio.gather(*first)), *rest], p

    results, producer = asyncio.run(run())
    assert sorted(r.queue_offset for r in results) == list(range(before, before + 49))
    out = env.pull(env.leader, 6, before, raw=True)
    assert {b.chunk[1] for b in out.batches} <= {stored_batch.OLDEST_VERSION, stored_batch.VERSION}
    assert not [t for t in threading.enumerate() if t.name == "raftmq-producer-data"]

    async def on(p: AsyncProducer) -> SendResult:
        return await p.send(TOPIC, b"other loop", queue=queue)

    p2 = AsyncProducer(env.cluster.namesrv)
    try:
        asyncio.run(on(p2))
        with pytest.raises(InvalidArgumentError, match="another event loop"):
            asyncio.run(on(p2))
    finally:
        p2.producer.close()
    assert producer.producer._sender.closed


def test_the_asyncio_producer_gathers_a_turns_plain_sends_and_keeps_the_calls_order(
    env: Env,
) -> None:
    """AsyncProducer's plain sends of one loop turn to one queue leave as one buffered item
    (issue 24: per message a future and two appends, per batch one codec call); a send that
    is not plain (tags) in the same turn hands them over first, so the queue's offsets follow
    the calls' order, and each future gets its own message's result."""
    queue = QueueRef(TOPIC, GROUP, 7)
    before = env.max_offset(7)

    async def run() -> tuple[list[SendResult], int]:
        async with AsyncProducer(env.cluster.namesrv) as p:
            await p.send(TOPIC, b"warm", queue=queue)  # route and connection known
            sent0 = p.producer._sender.messages_sent
            futs = [p.send_future(TOPIC, b"a%d" % i, queue=queue) for i in range(20)]
            futs.append(p.send_future(TOPIC, b"tagged", tags="t", queue=queue))
            futs += [p.send_future(TOPIC, b"b%d" % i, queue=queue) for i in range(20)]
            # nothing has left yet: the turn's plain sends wait for its end, in the producer
            assert p.producer._sender.messages_sent == sent0
            results = list(await asyncio.gather(*futs))
            return results, p.producer._sender.batches_sent

    results, _ = asyncio.run(run())
    offsets = [r.queue_offset for r in results]
    assert offsets == list(range(before + 1, before + 42)), offsets
    out = env.pull(env.leader, 7, before + 1, raw=True)
    bodies = [m.message.body for m in decode_batches(out.batches, GROUP, 7)]
    want = [b"a%d" % i for i in range(20)] + [b"tagged"] + [b"b%d" % i for i in range(20)]
    assert bodies[:41] == want
    assert len({r.msg_id for r in results}) == 41


@given(st.data())
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_hostile_frames_get_typed_errors_never_a_traceback(env: Env, data: st.DataObject) -> None:
    """Random damage to a SEND_STORED frame (bytes flipped, cut or added anywhere, header and
    batch alike): a typed INVALID_ARGUMENT for the frame or for the batch, never an internal
    error; whatever the leader accepts is a batch it could check whole."""
    frame = bytearray(stored_send.encode_request([batch(7, b"h0", b"h1")], 0))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(frame) - 1))
        op = data.draw(st.sampled_from(["flip", "cut", "add"]))
        if op == "flip":
            frame[at] ^= data.draw(st.integers(1, 255))
        elif op == "cut":
            del frame[at:]
            if not frame:
                frame.append(0)
        else:
            frame[at:at] = data.draw(st.binary(min_size=1, max_size=8))
    try:
        raw = env.call(env.leader, DataMethod.SEND_STORED, bytes(frame))
    except InvalidArgumentError:
        return
    for r in stored_send.decode_answer(raw).results:
        if r.error is not None:
            assert common_pb2.ErrorCode.Name(r.error.code) == "INVALID_ARGUMENT", r.error
