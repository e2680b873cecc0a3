"""Three real node processes on loopback, one cut off (every raft message to and from it dropped,
connections up, timers running): PreVote keeps the returning follower from disturbing the
leader; a leadership transfer passes over a follower that cannot take over (issue 15)."""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.disks import fill, tmpfs
from tests.harness.local_cluster import ControlError, LocalCluster

ISOLATION_S = 4.0  # 10-20 election timeouts (200-400 ms)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path)
    c.start_all()
    try:
        yield c
    finally:
        c.close()


class Writer(threading.Thread):
    """Submits small batches to one node as fast as they commit; records when each was acked."""

    def __init__(self, c: LocalCluster, node: int) -> None:
        super().__init__(daemon=True)
        self.c, self.node = c, node
        self.acks: list[float] = []
        self.errors: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        seq = 0
        while not self.stop.is_set():
            seq += 1
            try:
                res = self.c.call(
                    self.node,
                    {"op": "submit", "payloads": [seq.to_bytes(8, "big")], "timeout_s": 5.0},
                )
            except ControlError as exc:
                self.errors.append(str(exc))
                continue
            if res[0][0] == "ok":
                self.acks.append(time.monotonic())
            else:
                self.errors.append(f"{res[0][1]}: {res[0][2]}")
                time.sleep(0.01)

    def longest_gap(self, since: float, until: float) -> float:
        times = [since, *(t for t in self.acks if since <= t <= until), until]
        return max(b - a for a, b in itertools.pairwise(times))

    def finish(self) -> None:
        self.stop.set()
        self.join(timeout=30)


def block(c: LocalCluster, i: int, others: list[int]) -> None:
    """Cut node i off from `others`, both ways ([] heals)."""
    c.call(i, {"op": "block", "peers": [c.nodes[o].raft_addr for o in others]})
    for o in others:
        c.call(o, {"op": "block", "peers": [c.nodes[i].raft_addr]})


def heal(c: LocalCluster) -> None:
    for i in range(c.size):
        c.call(i, {"op": "block", "peers": []})


def terms(c: LocalCluster) -> list[int]:
    return [c.status(i)["term"] for i in range(c.size)]


def test_a_returning_follower_does_not_disturb_the_leader(cluster: LocalCluster) -> None:
    leader = cluster.leader()
    follower = (leader + 1) % 3
    other = (leader + 2) % 3
    writer = Writer(cluster, leader)
    writer.start()
    try:
        time.sleep(0.5)
        term = cluster.status(leader)["term"]
        start = time.monotonic()
        block(cluster, follower, [leader, other])
        time.sleep(ISOLATION_S)  # its election timer expires again and again meanwhile
        isolated_term = cluster.status(follower)["term"]
        heal(cluster)
        healed = time.monotonic()
        target = cluster.status(leader)["committed_index"]
        deadline = time.monotonic() + 15
        while cluster.status(follower)["committed_index"] < target:
            assert time.monotonic() < deadline, "the follower did not catch up after the heal"
            time.sleep(0.05)
        time.sleep(2.0)  # a disturbing follower forces its election within this
        end = time.monotonic()
        writer.finish()

        print(
            f"isolated {ISOLATION_S} s: follower term {term} -> {isolated_term}, "
            f"terms after heal {terms(cluster)}, longest ack gap "
            f"{writer.longest_gap(start, end):.3f} s"
        )
        assert isolated_term == term, "the cut-off follower raised its own term"
        assert cluster.status(leader)["role"] == "leader", "the leader was deposed"
        assert terms(cluster) == [term] * 3
        assert cluster.status(follower)["leader"] == cluster.nodes[leader].raft_addr
        # writes went on during the isolation and the heal without a stall (a forced election
        # costs at least an election timeout with nothing acknowledged)
        assert writer.longest_gap(start, end) < 1.0, writer.errors[-5:]
        assert len([t for t in writer.acks if t > healed]) > 20
    finally:
        writer.finish()


def test_transfer_passes_over_an_unreachable_follower(cluster: LocalCluster) -> None:
    """Both followers caught up, the one pysyncobj's own choice would take (the larger id) cut
    off: the transfer goes to the other one within well under a second (before: writes held
    for the whole 3 s timeout and the transfer failed)."""
    leader = cluster.leader()
    followers = sorted(
        ((i for i in range(3) if i != leader)), key=lambda i: cluster.nodes[i].raft_addr
    )
    reachable, cut = followers
    block(cluster, cut, [leader, reachable])
    time.sleep(0.6)  # the leader has not heard from it for longer than an election timeout
    writer = Writer(cluster, leader)
    start = time.monotonic()
    ok = cluster.call(leader, {"op": "transfer", "timeout_s": 3.0})
    took = time.monotonic() - start
    print(f"transfer with an unreachable follower: {took:.3f} s, ok={ok}")
    new_leader = cluster.leader(timeout_s=5, exclude=frozenset({leader}))
    writer.node = new_leader
    writer.start()
    try:
        deadline = time.monotonic() + 10
        while not writer.acks and time.monotonic() < deadline:
            time.sleep(0.01)
        stall = (writer.acks[0] if writer.acks else deadline) - start
        print(f"writes stalled {stall:.3f} s")
    finally:
        writer.finish()
        heal(cluster)
    assert ok and new_leader == reachable
    assert took < 1.5, took  # measured ~0.05-0.1 s here; 3 s (the timeout) before
    assert stall < 2.0, stall


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs: needs root")
def test_a_transfer_to_a_follower_with_a_full_disk_is_refused_at_once(tmp_path: Path) -> None:
    """The controller's balancer asking the leader to hand off to a node whose disk is full
    (chaos leader-disk-full): refused at once, writes go on (before: held ~3 s, then False)."""
    root = tmp_path / "c"
    with tmpfs(root / "node2", 16) as small, LocalCluster(root) as c:
        c.start_all()
        leader = c.leader(timeout_s=15)
        if leader == 2:
            assert c.call(2, {"op": "transfer", "target": c.nodes[0].raft_addr})
            leader = c.leader(timeout_s=10, exclude=frozenset({2}))
        fill(small)
        deadline = time.monotonic() + 20
        while "storage.disk_full" not in c.nodes[2].log_path.read_text(errors="replace"):
            assert time.monotonic() < deadline, "node 2 never found its disk full"
            c.call(leader, {"op": "submit", "payloads": [b"x" * 65536] * 4})
        time.sleep(0.2)  # its next acks say it cannot write
        start = time.monotonic()
        ok = c.call(leader, {"op": "transfer", "target": c.nodes[2].raft_addr, "timeout_s": 3.0})
        took = time.monotonic() - start
        res = c.call(leader, {"op": "submit", "payloads": [b"after"]})
        stall = time.monotonic() - start
        print(
            f"transfer to a full follower: refused after {took:.3f} s, writes after {stall:.3f} s"
        )
        assert not ok and res[0][0] == "ok", (ok, res)
        assert stall < 1.0, stall  # measured ~0.01 s; 3 s (the timeout) before
        assert "raft.transfer_refused" in c.nodes[leader].log_path.read_text()


def test_a_follower_left_alone_stops_naming_a_leader(cluster: LocalCluster) -> None:
    """Both other nodes killed: the survivor follower is connected to no one (pysyncobj never
    starts an election then) and must not keep naming the dead leader."""
    leader = cluster.leader()
    survivor = next(i for i in range(cluster.size) if i != leader)
    deadline = time.monotonic() + 10.0
    while cluster.status(survivor)["leader"] is None:  # it hears the new leader first
        assert time.monotonic() < deadline, cluster.status(survivor)
        time.sleep(0.02)
    for i in range(cluster.size):
        if i != survivor:
            cluster.kill(i)
    deadline = time.monotonic() + 5.0  # 12-25 election timeouts
    while cluster.status(survivor)["leader"] is not None:
        assert time.monotonic() < deadline, cluster.status(survivor)
        time.sleep(0.05)
