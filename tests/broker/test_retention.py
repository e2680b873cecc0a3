"""Retention on a real broker group (three processes, 1 MiB journal segments, a 4 s retention, a
disk guard at 3.5 MiB): sends are refused at the threshold with DISK_PRESSURE and resume once
retention frees space; old segments are deleted on all three nodes; nothing inside retention is
lost; a lagging group is answered DELETED_BY_RETENTION with the count it lost and named in a log
line; a follower that was down while the others deleted segments catches up through a snapshot
(issue 16, item 5)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc
import pytest

from raftmq.client.consumer_pull import PullConsumer
from raftmq.client.producer import Producer
from raftmq.common.errors import (
    DeletedByRetentionError,
    DiskPressureError,
    OffsetOutOfRangeError,
    from_rpc_error,
)
from raftmq.common.pb import broker_pb2, broker_pb2_grpc, common_pb2
from raftmq.common.types import QueueRef
from tests.harness.procs import Cluster, start_cluster, wait_until

GROUP = "broker-a"
TOPIC = "ret"
LAGGER = "lagging-group"
BODY_BYTES = 8 * 1024
by_offset: dict[int, bytes] = {}  # every acknowledged body by queue offset
RETENTION_MS = 4_000
MAX_STORE_BYTES = 3_500_000
SEGMENT_BYTES = 1 << 20


@dataclass
class Acked:
    queue_offset: int
    body: bytes
    wall_ms: int  # when the answer arrived


@dataclass
class State:
    cluster: Cluster
    channels: list[grpc.Channel]
    acked: list[Acked] = field(default_factory=list)

    def stub(self, i: int) -> broker_pb2_grpc.BrokerStub:
        return broker_pb2_grpc.BrokerStub(self.channels[i])

    def status(self, i: int) -> broker_pb2.BrokerStatus:
        return self.stub(i).GetBrokerStatus(broker_pb2.GetBrokerStatusRequest(), timeout=5)

    def leader(self, among: range = range(3)) -> int:
        def find() -> int | None:
            for i in among:
                try:
                    if self.status(i).role == common_pb2.LEADER:
                        return i
                except grpc.RpcError:
                    continue
            return None

        found = wait_until(lambda: (x := find()) is not None and x + 1, 30, "a leader")
        assert isinstance(found, int)
        return found - 1


def call(fn: object, *args: object, **kw: object) -> object:
    try:
        return fn(*args, **kw)  # type: ignore[operator]
    except grpc.RpcError as exc:
        raise from_rpc_error(exc) from None


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[State]:
    c = start_cluster(
        tmp_path_factory.mktemp("retention"),
        (GROUP,),
        namesrvs=1,
        broker_args=[
            "--segment-bytes",
            str(SEGMENT_BYTES),
            "--retention-ms",
            str(RETENTION_MS),
            "--retention-check-interval-ms",
            "300",
            "--max-store-bytes",
            str(MAX_STORE_BYTES),
        ],
    )
    layout, _ = c.groups[GROUP]
    channels = [grpc.insecure_channel(layout.address(i)) for i in range(3)]
    try:
        yield State(c, channels)
    finally:
        for ch in channels:
            ch.close()
        c.close()


def send(st: State, leader: int, seq: int) -> broker_pb2.SendMessageResponse:
    body = seq.to_bytes(8, "big") + b"x" * (BODY_BYTES - 8)
    resp = call(
        st.stub(leader).SendMessage,
        broker_pb2.SendMessageRequest(
            topic=TOPIC, queue_id=0, messages=[common_pb2.Message(body=body)], timeout_ms=10_000
        ),
        timeout=15,
    )
    assert isinstance(resp, broker_pb2.SendMessageResponse)
    st.acked.append(Acked(resp.results[0].queue_offset, body, time.time_ns() // 1_000_000))
    by_offset[resp.results[0].queue_offset] = body
    return resp


def seg_files(st: State, i: int) -> list[str]:
    return sorted(
        p.name for p in (st.cluster.tmp / f"{GROUP}-n{i}" / "raft" / "journal").glob("*.seg")
    )


def test_retention_end_to_end(state: State, caplog: pytest.LogCaptureFixture) -> None:
    st = state
    leader = st.leader()
    follower = next(i for i in range(3) if i != leader)
    # A follower down from the start: the others delete segments it never saw.
    _, procs = st.cluster.groups[GROUP]
    send(st, leader, 0)
    call(
        st.stub(leader).CommitOffset,
        broker_pb2.CommitOffsetRequest(
            consumer_group=LAGGER,
            offsets=[broker_pb2.QueueOffset(topic=TOPIC, queue_id=0, offset=1)],
        ),
        timeout=10,
    )
    procs[follower].kill()

    # 1. Fill to the disk guard: a send is refused with DISK_PRESSURE before 6 MiB went in.
    refused: DiskPressureError | None = None
    seq = 1
    while seq * BODY_BYTES < 6 * MAX_STORE_BYTES // 3:
        try:
            send(st, leader, seq)
        except DiskPressureError as exc:
            refused = exc
            break
        seq += 1
    assert refused is not None, f"no DISK_PRESSURE after {seq * BODY_BYTES} bytes"
    assert "max_store_bytes" in refused.message and refused.retryable
    assert seq * BODY_BYTES >= MAX_STORE_BYTES * 0.8  # not refused long before the threshold
    stored_before = len(st.acked)
    # The SDK's producer (framed data path) gets the same typed, retryable error.
    with (
        Producer(st.cluster.namesrv, retries=0, send_timeout_ms=5_000) as producer,
        pytest.raises(DiskPressureError, match="nothing was stored"),
    ):
        producer.send(TOPIC, b"refused", queue=QueueRef(TOPIC, GROUP, 0))

    # 2. Retention frees space (segments older than 4 s), sends resume by themselves.
    def resumed() -> bool:
        try:
            send(st, leader, seq)
        except DiskPressureError:
            return False
        return True

    wait_until(resumed, 60, "sends to resume after retention", interval_s=0.3)
    for n in range(seq + 1, seq + 20):
        send(st, leader, n)

    # 3. Old segments are gone on both live nodes, and disk space with them.
    live = [i for i in range(3) if i != follower]
    for i in live:
        wait_until(lambda i=i: st.status(i).retention_cut_index > 1, 30, f"a cut on n{i}")
        wait_until(
            lambda i=i: seg_files(st, i)[0] != f"{1:020d}.seg", 30, f"segment 1 deleted on n{i}"
        )
        s = st.status(i)
        assert s.first_index > 1 and s.journal_bytes < MAX_STORE_BYTES, s
        assert not s.disk_pressure

    # 4. Nothing inside retention is lost: every message acknowledged within the last
    #    RETENTION_MS (before the cut was observed) is at or after the queue's min offset, and
    #    every message from the min offset on reads back with its body.
    now_ms = time.time_ns() // 1_000_000
    low, high = bounds(st, leader)
    assert low > 1 and high == st.acked[-1].queue_offset + 1
    recent = [a for a in st.acked if a.wall_ms > now_ms - RETENTION_MS + 500]
    assert recent and all(a.queue_offset >= low for a in recent)
    assert read_all(st, leader, low, high) == [by_offset[o] for o in range(low, high)]

    # 5. The lagging group: told precisely, typed through the SDK's error table, and logged.
    with pytest.raises(DeletedByRetentionError) as info:
        call(
            st.stub(leader).PullMessage,
            broker_pb2.PullMessageRequest(
                consumer_group=LAGGER, topic=TOPIC, queue_id=0, offset=1, max_count=8
            ),
            timeout=10,
        )
    err = info.value
    assert isinstance(err, OffsetOutOfRangeError) and err.deleted_by_retention
    assert err.lost_messages == low - 1 and err.min_offset == low
    assert "deleted by retention" in err.message
    low_before = bounds(st, live[0])[0]
    logs = "\n".join(procs[i].log.read_text(errors="replace") for i in live)
    low_after = bounds(st, live[0])[0]
    lines = [x for x in logs.splitlines() if "retention_deleted_unconsumed" in x]
    assert lines and all(f"group={LAGGER} " in x and f"topics={TOPIC}:" in x for x in lines)
    # Every cut logs what it took; summed over the cuts (one node's lines), all that was lost.
    one_node = [x for x in lines if f"node=n{live[0]} " in x]
    lost = sum(int(x.split("lost_messages=")[1].split()[0]) for x in one_node)
    assert low_before - 1 <= lost <= low_after - 1, (lost, low_before, low_after, one_node)
    assert stored_before > 0

    # 5b. Through the SDK (framed data path): the lagging group's consumer is told, logs how
    #     many it lost, and goes on with the oldest message still stored, not at the end.
    with (
        caplog.at_level(logging.WARNING, logger="raftmq.consumer"),
        PullConsumer(st.cluster.namesrv, LAGGER, allow_follower_read=False) as consumer,
    ):
        consumer.assign([QueueRef(TOPIC, GROUP, 0)])
        got = wait_until(lambda: consumer.poll(500), 30, "the lagging consumer's messages")
    assert isinstance(got, list)
    first = got[0].queue_offset
    assert low <= first < high - 10, (low, first, high)
    assert "consumer.deleted_by_retention" in caplog.text and "lost_messages=" in caplog.text

    # 6. The follower that was down is behind the leader's first index: it gets a snapshot and
    #    catches up (same bounds, same messages, readable from it).
    assert st.status(leader).first_index > 2
    procs[follower].start("broker.started")
    wait_until(
        lambda: st.status(follower).dispatch_index >= st.status(leader).commit_index - 2,
        60,
        "the restarted follower to catch up",
        interval_s=0.3,
    )
    assert "broker.snapshot_installed" in procs[follower].log.read_text(errors="replace")
    assert st.status(follower).first_index > 1 and seg_files(st, follower)[0] != f"{1:020d}.seg"
    send(st, leader, 10_000)
    wait_until(lambda: bounds(st, follower) == bounds(st, leader), 30, "equal bounds")
    low2, high2 = bounds(st, leader)
    assert read_all(st, follower, low2, high2, follower_read=True) == [
        by_offset[o] for o in range(low2, high2)
    ]

    # 7. The node that installed a snapshot leads: it stores, serves and keeps retention going.
    resp = call(
        st.stub(leader).LeadershipTransfer,
        broker_pb2.LeadershipTransferRequest(target_node_id=f"n{follower}", timeout_ms=10_000),
        timeout=15,
    )
    assert isinstance(resp, broker_pb2.LeadershipTransferResponse) and resp.ok, resp
    new_leader = st.leader()
    assert new_leader == follower
    for n in range(10_001, 10_011):
        wait_until(lambda n=n: send(st, new_leader, n), 30, "a send to the new leader")
    low3, high3 = bounds(st, new_leader)
    assert read_all(st, new_leader, low3, high3) == [by_offset[o] for o in range(low3, high3)]
    for i in range(3):
        wait_until(lambda i=i: bounds(st, i) == bounds(st, new_leader), 30, f"n{i} in step")

    # 8. A node that deleted segments itself restarts (SIGKILL): its journal opens at its first
    #    index with the base's term, and it follows the leader again.
    old = leader
    first_before = st.status(old).first_index
    procs[old].kill()
    procs[old].start("broker.started")
    assert st.status(old).first_index >= first_before > 1
    send(st, new_leader, 20_000)
    wait_until(lambda: bounds(st, old) == bounds(st, new_leader), 30, "the restarted node")
    lo, hi = bounds(st, old)
    assert read_all(st, old, lo, hi, follower_read=True) == [by_offset[o] for o in range(lo, hi)]


def bounds(st: State, i: int) -> tuple[int, int]:
    r = call(
        st.stub(i).GetQueueBounds,
        broker_pb2.GetQueueBoundsRequest(topic=TOPIC, queue_id=0),
        timeout=5,
    )
    assert isinstance(r, broker_pb2.GetQueueBoundsResponse)
    return r.min_offset, r.max_offset


def read_all(st: State, i: int, low: int, high: int, *, follower_read: bool = False) -> list[bytes]:
    out: list[bytes] = []
    offset = low
    while offset < high:
        r = call(
            st.stub(i).PullMessage,
            broker_pb2.PullMessageRequest(
                consumer_group="reader",
                topic=TOPIC,
                queue_id=0,
                offset=offset,
                max_count=64,
                allow_follower_read=follower_read,
            ),
            timeout=10,
        )
        assert isinstance(r, broker_pb2.PullMessageResponse)
        assert r.status == broker_pb2.FOUND, r
        out += [m.message.body for m in r.messages]
        offset = r.next_offset
    return out


QUIET = "quiet"
SLOW = "slowpoke"


def test_a_quiet_topic_is_warned_about_then_trimmed(state: State) -> None:
    """Retention warns before it deletes, and trims a topic that went quiet without any write
    rolling its segment (issue 26): 6 messages, a group that consumed 2 of them, then silence."""
    st = state
    leader = st.leader()
    for i in range(6):
        call(
            st.stub(leader).SendMessage,
            broker_pb2.SendMessageRequest(
                topic=QUIET, queue_id=0, messages=[common_pb2.Message(body=b"q%d" % i)]
            ),
            timeout=15,
        )
    call(
        st.stub(leader).CommitOffset,
        broker_pb2.CommitOffsetRequest(
            consumer_group=SLOW, offsets=[broker_pb2.QueueOffset(topic=QUIET, queue_id=0, offset=2)]
        ),
        timeout=10,
    )
    active = seg_files(st, leader)[-1]

    # The warning: the leader names the group, the topic and the 4 messages the next cut takes.
    def warned() -> broker_pb2.BrokerStatus | None:
        s = st.status(leader)
        risk = [(g.consumer_group, g.lag) for g in s.next_cut_losses if g.topic == QUIET]
        return s if risk == [(SLOW, 4)] else None

    s = wait_until(warned, 30, "the warning before the cut", interval_s=0.1)
    assert isinstance(s, broker_pb2.BrokerStatus) and s.next_cut_index > s.retention_cut_index

    # Then the cut, with no write after the group's commit: every message of the topic goes.
    def quiet_bounds() -> tuple[int, int]:
        r = call(
            st.stub(leader).GetQueueBounds,
            broker_pb2.GetQueueBoundsRequest(topic=QUIET, queue_id=0),
            timeout=5,
        )
        assert isinstance(r, broker_pb2.GetQueueBoundsResponse)
        return r.min_offset, r.max_offset

    wait_until(lambda: quiet_bounds() == (6, 6), 30, "the quiet topic trimmed", interval_s=0.2)
    assert seg_files(st, leader)[-1] == active  # no write rolled the segment
    assert not [g for g in st.status(leader).next_cut_losses if g.topic == QUIET]
    # The warning came first, then the deletion it announced (the leader's own log, in order).
    _, procs = st.cluster.groups[GROUP]
    lines = procs[leader].log.read_text(errors="replace").splitlines()
    warn = [k for k, x in enumerate(lines) if "retention_will_delete_unconsumed" in x and SLOW in x]
    gone = [k for k, x in enumerate(lines) if "retention_deleted_unconsumed" in x and SLOW in x]
    assert warn and gone and warn[0] < gone[0], (warn, gone)
    assert f"topic={QUIET} messages=4" in lines[warn[0]]
    assert f"lost_messages=4 queues=1 topics={QUIET}:4" in lines[gone[0]]
