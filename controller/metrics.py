"""A controller's Prometheus metrics: its own Raft role, term and indexes, how often the
controllers' leadership moved (seen from this node), and per broker group the leader record it
keeps (term, members, leader changes: the record's epoch, which is replicated state).

Read at scrape time from the node; nothing here decides or writes anything.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from raftmq.common.metrics_http import RpcMetrics
from raftmq.raftlog.record import Role, RoleChange

if TYPE_CHECKING:
    from raftmq.controller.node import ControllerNode

ROLE_NAMES = {Role.LEADER: "leader", Role.FOLLOWER: "follower", Role.CANDIDATE: "candidate"}


class ControllerMetrics:
    """Registers the controller's metrics in `registry` (the NameServer's own when the
    controller is embedded in it). `rpc` is None when the host process already times its
    gRPC calls (the embedded case)."""

    def __init__(
        self, node: ControllerNode, registry: CollectorRegistry, *, with_rpc: bool = True
    ) -> None:
        self.registry = registry
        self.rpc = RpcMetrics(registry) if with_rpc else None
        self._leader_changes = Counter(
            "raftmq_controller_leader_changes",
            "Times this controller saw the controllers' Raft leader change",
            registry=registry,
        )
        self._last_leader: str | None = None
        self._lock = threading.Lock()
        node.rlog.add_role_listener(self._on_role)
        registry.register(_ControllerCollector(node))

    def _on_role(self, change: RoleChange) -> None:
        with self._lock:
            if change.leader and change.leader != self._last_leader:
                self._last_leader = change.leader
                self._leader_changes.inc()


def readiness(node: ControllerNode) -> tuple[bool, str]:
    st = node.rlog.status()
    if st.role is Role.LEADER:
        return True, f"controller leader, term {st.term}"
    if st.leader is None:
        return False, f"controller {ROLE_NAMES.get(st.role, st.role.value)} without a leader"
    return True, f"controller follower, term {st.term}"


class _ControllerCollector(Collector):
    def __init__(self, node: ControllerNode) -> None:
        self._node = node

    def collect(self) -> Iterator[Metric]:
        node = self._node
        st = node.rlog.status()
        role = GaugeMetricFamily(
            "raftmq_controller_raft_role",
            "1 for this controller's current Raft role",
            labels=["role"],
        )
        for r, name in ROLE_NAMES.items():
            role.add_metric([name], 1 if st.role is r else 0)
        yield role
        for name, doc, value in (
            ("raftmq_controller_raft_term", "The controllers' current Raft term", st.term),
            ("raftmq_controller_raft_commit_index", "Highest committed index", st.commit_index),
            ("raftmq_controller_raft_applied_index", "Highest index applied", node.applied),
        ):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], value)
            yield g
        records = node.records()
        changes = CounterMetricFamily(
            "raftmq_controller_group_leader_changes",
            "Leader changes the controllers recorded per broker group (replicated)",
            labels=["broker_group"],
        )
        term = GaugeMetricFamily(
            "raftmq_controller_group_term",
            "Term of the broker group's recorded leader",
            labels=["broker_group"],
        )
        has_leader = GaugeMetricFamily(
            "raftmq_controller_group_has_leader",
            "1 when the controllers know the broker group's leader",
            labels=["broker_group"],
        )
        members = GaugeMetricFamily(
            "raftmq_controller_group_members",
            "Nodes of the broker group that have reported",
            labels=["broker_group"],
        )
        for rec in records:
            changes.add_metric([rec.broker_group], rec.epoch)
            term.add_metric([rec.broker_group], rec.term)
            has_leader.add_metric([rec.broker_group], int(bool(rec.leader_node_id)))
            members.add_metric([rec.broker_group], len(rec.members))
        yield from (changes, term, has_leader, members)
