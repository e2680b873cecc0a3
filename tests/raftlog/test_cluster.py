"""Three real node processes on loopback: acknowledged entries survive kills, restarts, wipes."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.local_cluster import ControlError, LocalCluster

Acked = dict[bytes, tuple[int, int]]  # payload -> (index, slot)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path, extra_args=("--segment-bytes", str(1 << 20)))
    c.start_all()
    try:
        yield c
    finally:
        c.close()


def submit_all(c: LocalCluster, i: int, payloads: list[bytes]) -> tuple[Acked, int]:
    acked: Acked = {}
    failed = 0
    results = c.call(i, {"op": "submit", "payloads": payloads, "timeout_s": 5.0}, timeout_s=30)
    for p, res in zip(payloads, results, strict=True):
        if res[0] == "ok":
            acked[p] = (res[2], res[3])
        else:
            failed += 1
    return acked, failed


def wait_converged(c: LocalCluster, nodes: list[int], upto: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(c.status(i)["committed_index"] >= upto for i in nodes):
            return
        time.sleep(0.05)
    states = {i: c.status(i)["committed_index"] for i in nodes}
    raise AssertionError(f"nodes did not reach committed index {upto}: {states}")


def check_logs(c: LocalCluster, nodes: list[int], acked: Acked) -> None:
    """Every node holds the same entries, and every acknowledged payload sits where it was acked."""
    upto = max(idx for idx, _ in acked.values())
    wait_converged(c, nodes, upto)
    logs = {i: c.read_all(i, upto) for i in nodes}
    reference = logs[nodes[0]]
    assert [e[0] for e in reference] == list(range(reference[0][0], upto + 1))
    for i in nodes[1:]:
        assert logs[i] == reference, f"node {i} differs from node {nodes[0]}"
    at = {
        (index, slot): chunk
        for index, _term, chunks in reference
        for slot, chunk in enumerate(chunks)
    }
    for payload, pos in acked.items():
        assert at.get(pos) == payload, f"acknowledged payload missing at {pos}"
    seen = [chunk for _i, _t, chunks in reference for chunk in chunks]
    assert len(seen) == len(set(seen)), "a payload was stored twice"


def test_replicates_same_history_to_every_node(cluster: LocalCluster) -> None:
    leader = cluster.leader()
    payloads = [f"m{i}".encode() * 50 for i in range(300)]
    acked, failed = submit_all(cluster, leader, payloads)
    assert failed == 0
    check_logs(cluster, [0, 1, 2], acked)
    # group commit packs concurrent submissions: fewer entries than submissions
    indexes = {idx for idx, _slot in acked.values()}
    assert len(indexes) < len(payloads)


def test_follower_refuses_writes_with_leader_hint(cluster: LocalCluster) -> None:
    leader = cluster.leader()
    follower = (leader + 1) % 3
    leader_addr = cluster.nodes[leader].raft_addr
    deadline = time.monotonic() + 10  # a follower learns the leader from its first append
    while cluster.status(follower)["leader"] != leader_addr and time.monotonic() < deadline:
        time.sleep(0.02)
    res = cluster.call(follower, {"op": "submit", "payloads": [b"x"]})
    assert res[0][0] == "err" and res[0][1] == "NotLeaderError"
    assert cluster.nodes[leader].raft_addr in res[0][2]


def test_oversized_entry_refused_before_replication(cluster: LocalCluster) -> None:
    leader = cluster.leader()
    before = cluster.status(leader)["last_index"]
    res = cluster.call(leader, {"op": "submit", "payloads": [b"x" * ((8 << 20) + 1)]})
    assert res[0][1] == "EntryTooLargeError" and "exceeds the limit" in res[0][2]
    time.sleep(0.2)
    assert cluster.status(leader)["last_index"] == before


class Writer(threading.Thread):
    """Keeps submitting unique payloads to whichever node is leader; records acknowledgements."""

    def __init__(self, c: LocalCluster, size: int = 512) -> None:
        super().__init__(daemon=True)
        self.c, self.size = c, size
        self.acked: Acked = {}
        self.failed = 0
        self.stop = threading.Event()
        self.seq = 0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                leader = self.c.leader(timeout_s=10)
            except ControlError:
                continue
            batch = []
            for _ in range(20):
                self.seq += 1
                batch.append(self.seq.to_bytes(8, "big") * (self.size // 8))
            try:
                acked, failed = submit_all(self.c, leader, batch)
            except (ControlError, OSError, EOFError):
                self.failed += len(batch)
                continue
            self.acked.update(acked)
            self.failed += failed


def test_kill_leader_under_load_keeps_every_acknowledged_entry(cluster: LocalCluster) -> None:
    w = Writer(cluster)
    w.start()
    for _round in range(2):
        time.sleep(1.0)
        victim = cluster.leader()
        cluster.kill(victim)
        before = len(w.acked)
        deadline = time.monotonic() + 10
        while len(w.acked) < before + 100 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(w.acked) >= before + 100, "no progress after the leader was killed"
        cluster.start(victim)
    time.sleep(0.5)
    w.stop.set()
    w.join(timeout=30)
    assert len(w.acked) > 500
    check_logs(cluster, [0, 1, 2], w.acked)


def test_kill_all_three_and_restart(cluster: LocalCluster) -> None:
    w = Writer(cluster)
    w.start()
    time.sleep(1.5)
    for i in range(3):
        cluster.kill(i)
    w.stop.set()
    w.join(timeout=30)
    for i in range(3):
        cluster.start(i)
    cluster.leader(timeout_s=15)
    assert len(w.acked) > 100
    check_logs(cluster, [0, 1, 2], w.acked)


def test_wiped_follower_catches_up_from_leader_journal(cluster: LocalCluster) -> None:
    leader = cluster.leader()
    acked: Acked = {}
    for k in range(20):  # ~5 MB over several 1 MiB segments
        a, failed = submit_all(cluster, leader, [bytes([k, j]) * 128 * 1024 for j in range(2)])
        assert failed == 0
        acked.update(a)
    follower = (leader + 1) % 3
    cluster.kill(follower)
    cluster.wipe(follower)
    cluster.start(follower)
    check_logs(cluster, [leader, follower], acked)


def _segments(c: LocalCluster, i: int) -> list[Path]:
    return sorted((c.nodes[i].data_dir / "journal").glob("*.seg"))


def test_corrupted_record_is_detected_not_served(cluster: LocalCluster) -> None:
    leader = cluster.leader()
    for k in range(12):
        _, failed = submit_all(cluster, leader, [bytes([k]) * 200_000])
        assert failed == 0
    follower = (leader + 1) % 3
    upto = cluster.status(leader)["committed_index"]
    wait_converged(cluster, [follower], upto)
    cluster.stop(follower)
    sealed = _segments(cluster, follower)[0]
    data = bytearray(sealed.read_bytes())
    data[len(data) // 2] ^= 0xFF
    sealed.write_bytes(bytes(data))
    cluster.start(follower)
    wait_converged(cluster, [follower], upto)
    with pytest.raises(ControlError, match="CorruptJournalError"):
        cluster.read_all(follower, upto)


def test_torn_tail_is_truncated_and_refilled(cluster: LocalCluster) -> None:
    leader = cluster.leader()
    acked: Acked = {}
    for k in range(8):
        a, _ = submit_all(cluster, leader, [bytes([k + 1]) * 50_000])
        acked.update(a)
    follower = (leader + 1) % 3
    wait_converged(cluster, [follower], max(i for i, _ in acked.values()))
    cluster.kill(follower)
    active = _segments(cluster, follower)[-1]
    with open(active, "r+b") as f:  # a crash in the middle of the last write
        f.truncate(active.stat().st_size - 1000)
    cluster.start(follower)
    check_logs(cluster, [leader, follower], acked)
    assert "torn_tail" in cluster.nodes[follower].log_path.read_text()


def test_sync_flush_cluster_commits(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, flush="SYNC_FLUSH") as c:
        c.start_all()
        leader = c.leader()
        acked, failed = submit_all(c, leader, [f"s{i}".encode() for i in range(100)])
        assert failed == 0
        check_logs(c, [0, 1, 2], acked)


def test_leadership_transfer_moves_the_leader_and_loses_nothing(cluster: LocalCluster) -> None:
    leader = cluster.leader()
    acked, failed = submit_all(cluster, leader, [f"t{i}".encode() for i in range(50)])
    assert failed == 0
    target = (leader + 1) % 3
    assert cluster.call(leader, {"op": "transfer", "target": cluster.nodes[target].raft_addr})
    # The old leader still says it leads until it hears the new term: ask the others.
    new_leader = cluster.leader(timeout_s=10, exclude=frozenset({leader}))
    assert new_leader == target
    more, failed = submit_all(cluster, new_leader, [f"u{i}".encode() for i in range(50)])
    assert failed == 0
    acked.update(more)
    check_logs(cluster, [0, 1, 2], acked)
