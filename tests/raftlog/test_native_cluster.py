"""The native Raft core in three real processes with a Raft password: a group pysyncobj wrote
(broker groups ran on it before the native core; the harness still starts the controllers'
ReplicatedLog) reopens on it (the upgrade), acknowledged entries survive a leader kill and its
restart, and every node holds the same history (test_cluster.py and the broker suites run on it
too)."""

from __future__ import annotations

from pathlib import Path

from tests.harness.local_cluster import LocalCluster
from tests.raftlog.test_cluster import check_logs, submit_all


def test_a_sealed_group_written_by_pysyncobj_reopens_native_and_keeps_every_ack(
    tmp_path: Path,
) -> None:
    """One cluster, two stories (each cluster start costs CI seconds). The upgrade: a whole
    group pysyncobj wrote, stopped by SIGKILL (nothing tidied on the way out) with one node
    behind, starts again on the native core with every acknowledged entry where it was
    acknowledged, and the node behind catches up from the native leader. Then the native
    group keeps every acknowledgement across a leader kill and the leader's restart."""
    sealed = ("--password", "s3cret", "--segment-bytes", str(1 << 20))
    c = LocalCluster(tmp_path, extra_args=("--raft-impl", "pysyncobj", *sealed))
    with c:
        c.start_all()
        leader = c.leader(timeout_s=15)
        acked, failed = submit_all(c, leader, [f"old{i}".encode() * 40 for i in range(150)])
        assert failed == 0
        behind = (leader + 1) % 3
        c.kill(behind)  # misses the next writes: the native leader must send them
        more, failed = submit_all(c, leader, [f"late{i}".encode() * 40 for i in range(50)])
        assert failed == 0
        acked.update(more)
        for i in range(3):
            c.kill(i)

        c.extra_args = ("--raft-impl", "native", *sealed)
        c.start_all()
        leader = c.leader(timeout_s=15)
        new, failed = submit_all(c, leader, [f"a{i}".encode() * 40 for i in range(200)])
        assert failed == 0
        assert min(i for i, _ in new.values()) > max(i for i, _ in acked.values())
        acked.update(new)
        check_logs(c, [0, 1, 2], acked)  # the node that was behind too

        c.kill(leader)
        survivor = c.leader(timeout_s=15, exclude=frozenset({leader}))
        more, failed = submit_all(c, survivor, [f"b{i}".encode() * 40 for i in range(100)])
        assert failed == 0
        acked.update(more)
        c.start(leader)
        check_logs(c, [0, 1, 2], acked)
        assert "native_log raft.role" in c.nodes[leader].log_path.read_text()
