"""A flipped byte in the middle of a sealed journal segment (three real processes, issue 25).

On the leader, found when a follower rebuilt from scratch needs that record: the leader's Raft
loop goes on (only that peer's replication waits), the read is logged once with peer, index, file
and offset, the record is fetched again from a peer and rewritten, and everyone serves every
message. On a follower, where nobody reads it: the scrubber finds it, the status says so, and the
repair clears it."""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from pathlib import Path

import grpc

from raftmq.common.pb import broker_pb2, broker_pb2_grpc, common_pb2
from raftmq.raftlog.journal import SegmentJournal
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
        # No scrubber here: the read that finds the bad record is the leader's, for a peer.
        [
            "--segment-bytes",
            str(1 << 20),
            "--max-message-bytes",
            "65536",
            "--scrub-bytes-per-s",
            "0",
        ],
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
        log_of = nodes[0].log.read_text
        wait_until(lambda: "raft.record_repaired" in log_of(), 20, "n0 to repair its record")
        wait_until(lambda: not status(channels[0]).storage_error, 10, "n0's status to clear")
        wait_until(lambda: status(channels[2]).dispatch_index >= commit, 60, "n2 to catch up")
        time.sleep(1)
        watching.clear()
        watcher.join(5)

        after = sorted({(i, role, term) for i, role, term in seen if term > lead_term})
        assert len({term for _, _, term in after}) <= 1, after  # at most one hand-off
        assert acked <= consume_all(channels[2]), "the rebuilt follower serves every message"
        assert acked <= consume_all(channels[0]), "the repaired node serves every message"
        log = log_of(errors="replace")
        assert "Traceback" not in log and "failed _onTick" not in log, nodes[0].tail(60)
        lines = [ln for ln in log.splitlines() if "raft.replication_read_failed" in ln]
        assert len(lines) == 1, lines
        assert f"index={index}" in lines[0] and f"offset={offset}" in lines[0], lines[0]
        assert "peer=127.0.0.1:" in lines[0] and str(segment) in lines[0], lines[0]
        assert log.count("storage.corrupt_record") == 1, nodes[0].tail(60)
        fixed = [ln for ln in log.splitlines() if "raft.record_repaired" in ln]
        assert len(fixed) == 1 and f"index={index}" in fixed[0] and f"offset={offset}" in fixed[0]
        assert "storage.record_repaired" in log
    finally:
        watching.clear()
        for ch in channels:
            ch.close()
        for n in nodes:
            n.kill()
        ns.kill()


def test_the_scrubber_finds_a_rotten_record_nobody_reads(tmp_path: Path) -> None:
    """A follower's sealed record rots while it is down; start-up's spot checks pass it and no
    read needs it, but the scrubber finds it within a pass and the node says so."""
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
        send_all(channels[leader], SENDS)
        commit = status(channels[leader]).commit_index
        victim = next(i for i in range(3) if i != leader)
        ch = channels[victim]
        wait_until(lambda: status(ch).dispatch_index >= commit, 30, "the follower indexed")
        nodes[victim].kill()
        journal = tmp_path / f"broker-a-n{victim}" / "raft" / "journal"
        index, offset, segment = flip_mid_record(journal)
        nodes[victim].start("broker.started")  # start-up's spot checks let it through
        # 4 MiB/s (the default) over ~2 MiB of sealed segments: within a second or two.
        err = wait_until(lambda: status(ch).storage_error, 20, "the scrubber to find it")
        assert "corrupt" in str(err) and f"offset {offset} (index {index})" in str(err), err
        # ...and repaired from a peer's copy: the status clears, the record reads back intact.
        wait_until(lambda: not status(ch).storage_error, 20, "the repair")
        log = nodes[victim].log.read_text(errors="replace")
        assert log.count("storage.corrupt_record") == 1 and str(segment) in log
        assert "raft.record_repaired node=127.0.0.1:" in log and f"index={index}" in log
        nodes[victim].kill()
        with SegmentJournal(journal, segment_bytes=1 << 20, cache_bytes=0) as j:
            assert j.get(index).index == index  # checked off the disk: no CorruptJournalError
    finally:
        for ch in channels:
            ch.close()
        for n in nodes:
            n.kill()
        ns.kill()
