"""The native Raft core (raft_impl="native") in three real processes with a Raft password, so
CI runs it whatever RAFTMQ_BROKER_RAFT_IMPL says: acknowledged entries survive a leader kill and
its restart, and every node holds the same history (the rest of test_cluster.py and the broker
suites run on it with RAFTMQ_BROKER_RAFT_IMPL=native)."""

from __future__ import annotations

from pathlib import Path

from tests.harness.local_cluster import LocalCluster
from tests.raftlog.test_cluster import check_logs, submit_all


def test_a_sealed_native_group_keeps_every_ack_across_a_leader_kill(tmp_path: Path) -> None:
    args = ("--raft-impl", "native", "--password", "s3cret", "--segment-bytes", str(1 << 20))
    with LocalCluster(tmp_path, extra_args=args) as c:
        c.start_all()
        leader = c.leader(timeout_s=15)
        acked, failed = submit_all(c, leader, [f"a{i}".encode() * 40 for i in range(200)])
        assert failed == 0
        c.kill(leader)
        survivor = c.leader(timeout_s=15, exclude=frozenset({leader}))
        more, failed = submit_all(c, survivor, [f"b{i}".encode() * 40 for i in range(100)])
        assert failed == 0
        acked.update(more)
        c.start(leader)
        check_logs(c, [0, 1, 2], acked)
        assert "native_log raft.role" in c.nodes[leader].log_path.read_text()
