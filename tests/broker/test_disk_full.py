"""A full disk on one node of a real broker group (three processes, one data directory on a small
tmpfs, filled with a filler file under load): the node says so in one line, with no traceback,
stays up and reports it in its status, the group keeps acknowledging, and the node catches up by
itself once space returns (issue 15)."""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from raftmq.common.errors import RaftMQError, from_rpc_error
from raftmq.common.pb import broker_pb2, broker_pb2_grpc, common_pb2
from tests.harness.disks import fill, tmpfs
from tests.harness.procs import (
    GroupLayout,
    Proc,
    broker_procs,
    free_ports,
    namesrv_proc,
    wait_until,
)

TOPIC = "disk"
FULL_LINE = "storage.disk_full"
BODY = b"x" * 1024
# The small disk must hold all the group writes: a node that was full catches up by storing the
# whole log, so a producer left unbounded fills the 32 MiB disk again for real on a fast machine
# (the flake of issue 25: the follower's storage_error never cleared because its disk was full
# once more). So the producer is paced and stops at a byte budget well below the disk's size.
SENDS_PER_S = 40  # 16 KiB each: ~640 KiB/s, more than enough to keep every node writing
BUDGET_BYTES = 10 << 20  # journal + indexes of this fit the 32 MiB disk with room to spare

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs: needs root")


@dataclass
class Group:
    layout: GroupLayout
    nodes: list[Proc]
    channels: list[grpc.Channel]
    acks: list[float] = field(default_factory=list)  # monotonic time of each acknowledged send
    acked: set[bytes] = field(default_factory=set)  # bodies of acknowledged messages
    failures: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def stub(self, i: int) -> broker_pb2_grpc.BrokerStub:
        return broker_pb2_grpc.BrokerStub(self.channels[i])

    def status(self, i: int) -> broker_pb2.BrokerStatus:
        return self.stub(i).GetBrokerStatus(broker_pb2.GetBrokerStatusRequest(), timeout=5)

    def leader(self) -> int:
        for i in range(3):
            with contextlib.suppress(grpc.RpcError):
                if self.status(i).role == common_pb2.LEADER:
                    return i
        raise AssertionError("no leader")

    def wait_leader(self, timeout_s: float = 20) -> int:
        """The leader, once there is one: an election may be under way (the machine is shared
        and a follower that missed heartbeats for an election timeout starts one)."""
        found: list[int] = []

        def probe() -> bool:
            with contextlib.suppress(AssertionError):
                found.append(self.leader())
                return True
            return False

        wait_until(probe, timeout_s, "a leader")
        return found[-1]

    def produce(self) -> None:
        leader = 0
        seq = 0
        next_send = time.monotonic()
        while not self.stop.is_set() and len(self.acked) * len(BODY) < BUDGET_BYTES:
            next_send += 1 / SENDS_PER_S
            self.stop.wait(max(0.0, next_send - time.monotonic()))
            bodies = [b"%d:" % (seq + i) + BODY for i in range(16)]
            seq += 16
            req = broker_pb2.SendMessageRequest(
                topic=TOPIC,
                queue_id=len(self.acks) % 4,
                messages=[common_pb2.Message(body=b) for b in bodies],
            )
            try:
                self.stub(leader).SendMessage(req, timeout=5)
                self.acks.append(time.monotonic())
                self.acked.update(bodies)
            except grpc.RpcError as exc:
                self.failures += 1
                err = from_rpc_error(exc)
                if isinstance(err, RaftMQError):
                    with contextlib.suppress(AssertionError):
                        leader = self.leader()
                time.sleep(0.05)


def start_group(tmp: Path, data_dirs: dict[int, Path]) -> tuple[Proc, Group]:
    ports = free_ports(7)
    ns = namesrv_proc(tmp, "ns", ports[0])
    layout = GroupLayout("broker-a", ports[1:4], ports[4:7])
    nodes = broker_procs(tmp, layout, [f"127.0.0.1:{ports[0]}"], ["--max-message-bytes", "65536"])
    for i, d in data_dirs.items():
        argv = nodes[i].argv
        argv[argv.index("--data-dir") + 1] = str(d)
    ns.start("namesrv.started")
    for n in nodes:
        n.start("broker.started")
    channels = [grpc.insecure_channel(layout.address(i)) for i in range(3)]
    return ns, Group(layout, nodes, channels)


def close(ns: Proc, group: Group | None) -> None:
    if group is not None:
        group.stop.set()
        for ch in group.channels:
            ch.close()
        for p in group.nodes:
            p.kill()
    ns.kill()


def campaigned_from(proc: Proc, term: int) -> str:
    """The raft.role line a node logged just before it became a candidate of `term`: following
    a named leader when a TimeoutNow started the campaign, `leader=None` after an election
    timeout (a node first stops naming a leader it has not heard)."""
    roles = [ln for ln in proc.log.read_text(errors="replace").splitlines() if "raft.role" in ln]
    for before, line in itertools.pairwise(roles):
        if f"role=candidate term={term} " in line:
            return before
    raise AssertionError(f"{proc.name} never campaigned in term {term}")


def count(proc: Proc, text: str) -> int:
    return proc.log.read_text(errors="replace").count(text)


def test_a_full_follower_says_so_once_stays_up_and_catches_up(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", 32) as small:
        ns, group = start_group(tmp_path, {2: small / "data"})
        producer: threading.Thread | None = None
        try:
            leader = group.wait_leader()
            if leader == 2:  # the small disk must be a follower's
                group.stub(2).LeadershipTransfer(
                    broker_pb2.LeadershipTransferRequest(target_node_id="n0"), timeout=10
                )
                wait_until(lambda: group.leader() != 2, 10, "n2 to hand off")
            group.stub(group.wait_leader()).CreateTopic(
                broker_pb2.CreateTopicRequest(
                    config=common_pb2.TopicConfig(
                        topic=TOPIC, read_queue_nums=4, write_queue_nums=4
                    )
                ),
                timeout=10,
            )
            producer = threading.Thread(target=group.produce, daemon=True)
            producer.start()
            wait_until(lambda: len(group.acks) > 20, 20, "acknowledged sends")
            filler = fill(small)

            wait_until(lambda: count(group.nodes[2], FULL_LINE) >= 1, 20, "the disk-full line")
            assert wait_until(lambda: group.status(2).disk_full, 10, "disk_full in the status")
            assert "No space left" in group.status(2).storage_error or group.status(2).disk_full
            acked = len(group.acks)
            time.sleep(5)  # the follower stays full while the group goes on
            assert len(group.acks) > acked + 20, "the group kept acknowledging"
            assert group.nodes[2].alive
            assert count(group.nodes[2], FULL_LINE) == 1, group.nodes[2].tail()
            assert group.status(2).disk_full

            filler.unlink()
            target = group.status(group.wait_leader()).commit_index
            wait_until(
                lambda: group.status(2).dispatch_index >= target, 60, "the follower to catch up"
            )
            wait_until(lambda: not group.status(2).storage_error, 20, "the status to clear")
            assert group.nodes[2].alive
            log = group.nodes[2].log.read_text(errors="replace")
            assert log.count(FULL_LINE) == 1 and "storage.recovered" in log
            assert "Traceback" not in log, group.nodes[2].tail(80)
        finally:
            group.stop.set()
            if producer is not None:
                producer.join(10)
            close(ns, group)


def consume_all(group: Group, node: int) -> set[bytes]:
    got: set[bytes] = set()
    for queue_id in range(4):
        offset = 0
        while True:
            out = group.stub(node).PullMessage(
                broker_pb2.PullMessageRequest(
                    consumer_group="check",
                    topic=TOPIC,
                    queue_id=queue_id,
                    offset=offset,
                    max_count=256,
                ),
                timeout=15,
            )
            got.update(m.message.body for m in out.messages)
            if out.next_offset >= out.max_offset or not out.messages:
                break
            offset = out.next_offset
    return got


def test_a_full_leader_hands_off_and_never_leads_while_full(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", 32) as small:
        ns, group = start_group(tmp_path, {0: small / "data"})
        producer: threading.Thread | None = None
        led_while_full: list[int] = []
        watching = threading.Event()
        try:
            leader = group.wait_leader()
            if leader != 0:  # the small disk must be the leader's
                group.stub(leader).LeadershipTransfer(
                    broker_pb2.LeadershipTransferRequest(target_node_id="n0"), timeout=10
                )
                wait_until(lambda: group.leader() == 0, 10, "n0 to lead")
            group.stub(0).CreateTopic(
                broker_pb2.CreateTopicRequest(
                    config=common_pb2.TopicConfig(
                        topic=TOPIC, read_queue_nums=4, write_queue_nums=4
                    )
                ),
                timeout=10,
            )
            producer = threading.Thread(target=group.produce, daemon=True)
            producer.start()
            wait_until(lambda: len(group.acks) > 20, 20, "acknowledged sends")

            def watch() -> None:  # n0's role while its disk is full
                while watching.is_set():
                    with contextlib.suppress(grpc.RpcError):
                        st = group.status(0)
                        if st.disk_full and st.role == common_pb2.LEADER and st.term != term:
                            led_while_full.append(int(st.term))  # won an election while full
                    time.sleep(0.02)

            term = group.status(0).term  # the term n0 leads when its disk fills
            filled_at = time.monotonic()
            filler = fill(small)
            watching.set()
            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            new_leader = wait_until(lambda: group.leader() != 0, 15, "a new leader")
            handoff_s = time.monotonic() - filled_at
            assert wait_until(lambda: group.status(0).disk_full, 10, "disk_full on n0")
            time.sleep(5)  # n0 stays full: it must not take leadership back
            acks = [t for t in group.acks if t >= filled_at]
            gaps = [b - a for a, b in zip([filled_at, *acks], acks, strict=False)]
            gap_s = max(gaps)
            print(f"leader disk full: new leader after {handoff_s:.2f} s, ack gap {gap_s:.2f} s")
            assert len(acks) > 20, "the group acknowledges again"
            assert gap_s < 2.0, gap_s  # the bar; measured 0.2-0.4 s
            assert group.wait_leader() != 0 and not led_while_full, led_while_full
            # Handed off, not lost: the follower took over on the full leader's TimeoutNow
            # (before, its stuck Ready held that and its heartbeats until an election).
            before = campaigned_from(group.nodes[group.wait_leader()], term + 1)
            assert f"leader=127.0.0.1:{group.layout.raft_ports[0]}" in before, before
            assert group.nodes[0].alive
            assert count(group.nodes[0], FULL_LINE) == 1, group.nodes[0].tail()

            filler.unlink()
            watching.clear()
            watcher.join(5)
            target = group.status(group.wait_leader()).commit_index
            wait_until(lambda: group.status(0).dispatch_index >= target, 60, "n0 to catch up")
            group.stop.set()
            producer.join(10)
            leader = group.wait_leader()
            lost = group.acked - consume_all(group, leader)
            assert not lost, f"{len(lost)} acknowledged messages lost"
            log = group.nodes[0].log.read_text(errors="replace")
            assert "Traceback" not in log, group.nodes[0].tail(80)
            assert new_leader
        finally:
            watching.clear()
            group.stop.set()
            if producer is not None:
                producer.join(10)
            close(ns, group)
