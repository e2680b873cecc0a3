"""A flipped byte in the middle of a sealed journal segment of a broker group's leader (three real
processes), found when a follower rebuilt from scratch needs that record (issue 25): the leader's
Raft loop goes on (only that peer's replication waits), the read is logged once with peer, index,
file and offset, the node reports `storage_error`, hands leadership off and never takes it back
while the record stays bad, and the rebuilt follower catches up from the new leader intact."""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from pathlib import Path

import grpc

from raftmq.common.pb import broker_pb2, broker_pb2_grpc, common_pb2
from raftmq.raftlog.journal.format import HEADER_BYTES
from raftmq.raftlog.journal.segments import POS, POS_BYTES, index_name, segment_name
from tests.harness.procs import (
    GroupLayout,
    broker_procs,
    free_ports,
    namesrv_proc,
    wait_until,
)

TOPIC = "rot"
BODY = b"r" * 1024
SENDS = 150  # x 16 KiB: ~2.4 MiB, more than two 1 MiB segments


def status(ch: grpc.Channel) -> broker_pb2.BrokerStatus:
    return broker_pb2_grpc.BrokerStub(ch).GetBrokerStatus(
        broker_pb2.GetBrokerStatusRequest(), timeout=5
    )


def leader_of(channels: list[grpc.Channel]) -> int:
    for i, ch in enumerate(channels):
        with contextlib.suppress(grpc.RpcError):
            if status(ch).role == common_pb2.LEADER:
                return i
    raise AssertionError("no leader")


def wait_leader(channels: list[grpc.Channel], timeout_s: float = 20) -> int:
    found: list[int] = []

    def probe() -> bool:
        found.append(leader_of(channels))
        return True

    wait_until(probe, timeout_s, "a leader")
    return found[-1]


def flip_mid_record(journal: Path) -> tuple[int, int, Path]:
    """Flip one body byte of the middle record of the first (sealed) segment. Returns its
    Raft index, the record's byte offset and the segment file."""
    seg, idx = journal / segment_name(1), journal / index_name(1)
    assert idx.exists(), sorted(p.name for p in journal.iterdir())  # sealed: has its index
    count = idx.stat().st_size // POS_BYTES
    k = count // 2
    with open(idx, "rb") as f:
        f.seek(k * POS_BYTES)
        (pos,) = POS.unpack(f.read(POS_BYTES))
    with open(seg, "r+b") as f:
        f.seek(pos + HEADER_BYTES + 100)
        b = f.read(1)
        f.seek(pos + HEADER_BYTES + 100)
        f.write(bytes([b[0] ^ 0xFF]))
    return 1 + k, pos, seg


def send_all(ch: grpc.Channel, n: int) -> set[bytes]:
    acked: set[bytes] = set()
    stub = broker_pb2_grpc.BrokerStub(ch)
    for s in range(n):
        bodies = [b"%d:%d:" % (s, i) + BODY for i in range(16)]
        stub.SendMessage(
            broker_pb2.SendMessageRequest(
                topic=TOPIC,
                queue_id=s % 2,
                messages=[common_pb2.Message(body=b) for b in bodies],
            ),
            timeout=10,
        )
        acked.update(bodies)
    return acked


def consume_all(ch: grpc.Channel) -> set[bytes]:
    got: set[bytes] = set()
    stub = broker_pb2_grpc.BrokerStub(ch)
    for queue_id in range(2):
        offset = 0
        while True:
            out = stub.PullMessage(
                broker_pb2.PullMessageRequest(
                    consumer_group="check",
                    topic=TOPIC,
                    queue_id=queue_id,
                    offset=offset,
                    max_count=256,
                    allow_follower_read=True,
                ),
                timeout=15,
            )
            got.update(m.message.body for m in out.messages)
            if out.next_offset >= out.max_offset or not out.messages:
                break
            offset = out.next_offset
    return got


def test_a_corrupt_record_a_rebuilt_follower_needs_does_not_break_the_leader(
    tmp_path: Path,
) -> None:
    ports = free_ports(7)
    ns = namesrv_proc(tmp_path, "ns", ports[0])
    layout = GroupLayout("broker-a", ports[1:4], ports[4:7])
    nodes = broker_procs(
        tmp_path,
        layout,
        [f"127.0.0.1:{ports[0]}"],
        ["--segment-bytes", str(1 << 20), "--max-message-bytes", "65536"],
    )
    channels = [grpc.insecure_channel(layout.address(i)) for i in range(3)]
    seen: list[tuple[int, int, int]] = []  # (node, role, term) while the fault is on
    watching = threading.Event()

    def watch() -> None:
        while watching.is_set():
            for i, ch in enumerate(channels):
                with contextlib.suppress(grpc.RpcError):
                    st = status(ch)
                    seen.append((i, st.role, st.term))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    try:
        ns.start("namesrv.started")
        for n in nodes:
            n.start("broker.started")
        leader = wait_leader(channels)
        broker_pb2_grpc.BrokerStub(channels[leader]).CreateTopic(
            broker_pb2.CreateTopicRequest(
                config=common_pb2.TopicConfig(topic=TOPIC, read_queue_nums=2, write_queue_nums=2)
            ),
            timeout=10,
        )
        acked = send_all(channels[leader], SENDS)
        commit = status(channels[leader]).commit_index
        for ch in channels:
            wait_until(lambda ch=ch: status(ch).dispatch_index >= commit, 30, "every node indexed")

        # n0's record rots while it is down (no cache holds it then); n0 comes back and leads.
        nodes[0].kill()
        index, offset, segment = flip_mid_record(tmp_path / "broker-a-n0" / "raft" / "journal")
        nodes[0].start("broker.started")
        leader = wait_leader(channels)
        wait_until(lambda: status(channels[0]).dispatch_index >= commit, 30, "n0 to catch up")
        if leader != 0:
            broker_pb2_grpc.BrokerStub(channels[leader]).LeadershipTransfer(
                broker_pb2.LeadershipTransferRequest(target_node_id="n0"), timeout=10
            )
            wait_until(lambda: leader_of(channels) == 0, 15, "n0 to lead")
        lead_term = status(channels[0]).term
        assert not status(channels[0]).storage_error  # nothing has read the bad record yet

        # n2 is rebuilt from nothing: the leader must read every record for it, the bad one too.
        nodes[2].kill()
        shutil.rmtree(tmp_path / "broker-a-n2")
        watching.set()
        watcher.start()
        nodes[2].start("broker.started")
        err = wait_until(lambda: status(channels[0]).storage_error, 20, "n0's storage_error")
        assert "corrupt" in str(err) and str(segment) in str(err), err
        wait_until(lambda: leader_of(channels) != 0, 15, "n0 to hand off")
        new_leader = wait_leader(channels)
        wait_until(lambda: status(channels[2]).dispatch_index >= commit, 60, "n2 to catch up")
        # What the controller's balancer would do for a preferred n0: refused, n0 does not lead.
        with contextlib.suppress(grpc.RpcError):
            out = broker_pb2_grpc.BrokerStub(channels[new_leader]).LeadershipTransfer(
                broker_pb2.LeadershipTransferRequest(target_node_id="n0"), timeout=10
            )
            assert not out.ok and out.leader_node_id != "n0", out
        time.sleep(3)  # n0 keeps its bad record: it must not lead again meanwhile
        watching.clear()
        watcher.join(5)

        after = [(i, role, term) for i, role, term in seen if term > lead_term]
        assert not [s for s in after if s[0] == 0 and s[1] == common_pb2.LEADER], after
        assert len({term for _, _, term in after}) <= 2, sorted(set(after))  # one hand-off
        assert status(channels[0]).storage_error  # still bad: nothing repaired it
        assert acked <= consume_all(channels[2]), "the rebuilt follower serves every message"
        log = nodes[0].log.read_text(errors="replace")
        assert "Traceback" not in log and "failed _onTick" not in log, nodes[0].tail(60)
        lines = [ln for ln in log.splitlines() if "raft.replication_read_failed" in ln]
        assert len(lines) == 1, lines
        assert f"index={index}" in lines[0] and f"offset={offset}" in lines[0], lines[0]
        assert "peer=127.0.0.1:" in lines[0] and str(segment) in lines[0], lines[0]
        assert log.count("storage.corrupt_record") == 1, nodes[0].tail(60)
    finally:
        watching.clear()
        for ch in channels:
            ch.close()
        for n in nodes:
            n.kill()
        ns.kill()
