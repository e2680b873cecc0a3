"""The NameServer's route table: clusters, broker groups, their nodes and topics, in memory only.

Pure: values in, values out. Time comes in as `now_ms`; nothing here reads a clock, locks, sleeps
or does I/O (the gRPC shell serializes calls). Soft state (invariant 7): an empty table refills
from broker registrations and controller pushes. Leadership is decided by Raft term alone.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from raftmq.common.errors import InvalidArgumentError, InvalidNameError

MAX_NAME_CHARS = 127  # RocketMQ's topic name limit, applied to every name
MAX_QUEUES_PER_TOPIC = 1024
MAX_NODES_PER_GROUP = 16  # a Raft group has 3 or 5; the rest is room for replaced nodes

_TOPIC_RE = re.compile(r"[%|A-Za-z0-9_-]+")  # RocketMQ's rule; % and | for system topics
_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")
_NODE_RE = re.compile(r"[A-Za-z0-9_.:-]+")  # node ids may be raft addresses ("10.0.0.1:7001")


class Role(enum.Enum):
    """The Raft role a node reports for itself."""

    UNKNOWN = "UNKNOWN"
    LEADER = "LEADER"
    FOLLOWER = "FOLLOWER"
    CANDIDATE = "CANDIDATE"


class Permission(enum.Enum):
    """What clients may do with a topic on a broker group (RocketMQ's perm)."""

    READ_WRITE = "READ_WRITE"
    READ_ONLY = "READ_ONLY"
    WRITE_ONLY = "WRITE_ONLY"
    NONE = "NONE"


class LeaderChange(enum.Enum):
    """What a leader claim (controller push) did to the table."""

    APPLIED = "APPLIED"
    ALREADY_APPLIED = "ALREADY_APPLIED"  # same leader, same term: idempotent no-op
    STALE_TERM = "STALE_TERM"  # older than the group's known term: ignored
    UNKNOWN_NODE = "UNKNOWN_NODE"  # group or node not registered: ignored
    CONFLICT = "CONFLICT"  # another node already leads this term: ignored


@dataclass(frozen=True, slots=True)
class TopicQueues:
    """One topic's queue configuration on one broker group."""

    topic: str
    read_queue_nums: int
    write_queue_nums: int
    perm: Permission = Permission.READ_WRITE
    ordered: bool = False


@dataclass(frozen=True, slots=True)
class Registration:
    """One broker node's registration (or heartbeat: the same thing, every 30 s)."""

    cluster: str
    broker_group: str
    node_id: str
    address: str  # gRPC host:port
    raft_address: str  # Raft host:port, "" if not reported
    role: Role
    term: int
    topics: tuple[TopicQueues, ...] = ()
    data_address: str = ""  # framed data path host:port, "" = gRPC only


@dataclass(frozen=True, slots=True)
class RegisterOutcome:
    leader_node_id: str | None
    leader_address: str | None
    term: int
    topics_accepted: bool  # this registration's topic table became the group's
    new_node: bool  # the node was not registered before this call


@dataclass(frozen=True, slots=True)
class LeaderChangeOutcome:
    result: LeaderChange
    leader_node_id: str | None  # the table's view after the claim
    term: int


@dataclass(frozen=True, slots=True)
class NodeView:
    node_id: str
    address: str
    raft_address: str
    role: Role  # as reported by the node
    term: int  # as reported by the node
    is_leader: bool  # the table's verdict
    last_heartbeat_ms: int
    heartbeat_age_ms: int
    data_address: str = ""  # framed data path host:port, "" = gRPC only


@dataclass(frozen=True, slots=True)
class GroupView:
    cluster: str
    broker_group: str
    leader_node_id: str | None
    leader_address: str | None
    term: int  # highest term of any leader claim accepted for the group
    nodes: tuple[NodeView, ...]  # sorted by node id; listed even when no leader is known


@dataclass(frozen=True, slots=True)
class QueueData:
    broker_group: str
    read_queue_nums: int
    write_queue_nums: int
    perm: Permission
    ordered: bool


@dataclass(frozen=True, slots=True)
class TopicRoute:
    topic: str
    queues: tuple[QueueData, ...]  # sorted by broker group
    groups: tuple[GroupView, ...]  # the groups named in `queues`, same order


@dataclass(frozen=True, slots=True)
class ClusterView:
    name: str
    groups: tuple[GroupView, ...]


@dataclass(frozen=True, slots=True)
class ExpiredNode:
    cluster: str
    broker_group: str
    node_id: str
    address: str
    heartbeat_age_ms: int
    was_leader: bool


@dataclass(slots=True)
class _Node:
    node_id: str
    address: str
    raft_address: str
    role: Role
    term: int
    last_heartbeat_ms: int
    data_address: str


@dataclass(slots=True)
class _Group:
    cluster: str
    name: str
    nodes: dict[str, _Node] = field(default_factory=dict)
    leader: str | None = None
    term: int = 0
    topics: dict[str, TopicQueues] = field(default_factory=dict)
    topics_term: int = -1  # term of the registration whose topic table we keep; -1: none yet


class RouteTable:
    """All routes one NameServer knows. Not thread-safe: the caller serializes access."""

    def __init__(self, broker_expiry_ms: int) -> None:
        if broker_expiry_ms <= 0:
            raise ValueError("broker_expiry_ms must be > 0")
        self.broker_expiry_ms = broker_expiry_ms
        self._groups: dict[str, _Group] = {}

    # ---- writes ---------------------------------------------------------------------------------

    def register(self, reg: Registration, now_ms: int) -> RegisterOutcome:
        """Add or refresh a node; apply its leader claim by term; maybe take its topic table."""
        _validate_registration(reg)
        group = self._groups.get(reg.broker_group)
        if group is not None and group.cluster != reg.cluster:
            raise InvalidArgumentError(
                f"broker group {reg.broker_group!r} is registered under cluster "
                f"{group.cluster!r}, but node {reg.node_id!r} reports cluster {reg.cluster!r}; "
                "broker group names must be unique across clusters: fix the node's cluster "
                "setting, or wait for the old registrations to expire"
            )
        if group is None:
            group = self._groups[reg.broker_group] = _Group(reg.cluster, reg.broker_group)
        node = group.nodes.get(reg.node_id)
        new_node = node is None
        if node is None:
            if len(group.nodes) >= MAX_NODES_PER_GROUP:
                raise InvalidArgumentError(
                    f"broker group {reg.broker_group!r} already has {len(group.nodes)} nodes "
                    f"(limit {MAX_NODES_PER_GROUP}); unregister retired nodes or wait for them "
                    "to expire"
                )
            node = group.nodes[reg.node_id] = _Node(
                reg.node_id,
                reg.address,
                reg.raft_address,
                reg.role,
                reg.term,
                now_ms,
                reg.data_address,
            )
        else:
            node.address, node.raft_address = reg.address, reg.raft_address
            node.data_address = reg.data_address
            node.role, node.term = reg.role, reg.term
            node.last_heartbeat_ms = max(node.last_heartbeat_ms, now_ms)

        if group.leader == reg.node_id and not (reg.role is Role.LEADER and reg.term == group.term):
            group.leader = None  # the leader itself says it no longer leads this term
        if reg.role is Role.LEADER:
            _claim(group, reg.node_id, reg.term)

        accept = group.leader == reg.node_id or (
            group.leader is None and reg.term >= group.topics_term
        )
        if accept:
            group.topics = {t.topic: t for t in reg.topics}
            group.topics_term = reg.term
        self._check(group)
        return RegisterOutcome(
            leader_node_id=group.leader,
            leader_address=group.nodes[group.leader].address if group.leader else None,
            term=group.term,
            topics_accepted=accept,
            new_node=new_node,
        )

    def unregister(self, cluster: str, broker_group: str, node_id: str) -> bool:
        """Remove a node that leaves cleanly; False if it was not registered here."""
        group = self._groups.get(broker_group)
        if group is None or group.cluster != cluster or node_id not in group.nodes:
            return False
        self._remove(group, node_id)
        return True

    def apply_leader_change(
        self, broker_group: str, node_id: str, term: int
    ) -> LeaderChangeOutcome:
        """A leader claim from the controller: applied idempotently by term, older terms ignored."""
        if term < 0:
            raise InvalidArgumentError(f"term must be >= 0, got {term}")
        group = self._groups.get(broker_group)
        if group is None or node_id not in group.nodes:
            result = LeaderChange.UNKNOWN_NODE
            if group is not None and term < group.term:
                result = LeaderChange.STALE_TERM
            return LeaderChangeOutcome(
                result, group.leader if group else None, group.term if group else 0
            )
        result = _claim(group, node_id, term)
        self._check(group)
        return LeaderChangeOutcome(result, group.leader, group.term)

    def expire(self, now_ms: int) -> list[ExpiredNode]:
        """Drop every node silent for more than broker_expiry_ms; return what was dropped."""
        expired: list[ExpiredNode] = []
        for group in list(self._groups.values()):
            for node in list(group.nodes.values()):
                age_ms = now_ms - node.last_heartbeat_ms
                if age_ms > self.broker_expiry_ms:
                    expired.append(
                        ExpiredNode(
                            group.cluster,
                            group.name,
                            node.node_id,
                            node.address,
                            age_ms,
                            group.leader == node.node_id,
                        )
                    )
                    self._remove(group, node.node_id)
        return expired

    # ---- reads ----------------------------------------------------------------------------------

    def route(self, topic: str, now_ms: int) -> TopicRoute | None:
        """Queues of `topic` per broker group, and those groups' nodes; None if no group has it."""
        queues: list[QueueData] = []
        groups: list[GroupView] = []
        for name in sorted(self._groups):
            group = self._groups[name]
            tq = group.topics.get(topic)
            if tq is None:
                continue
            queues.append(
                QueueData(name, tq.read_queue_nums, tq.write_queue_nums, tq.perm, tq.ordered)
            )
            groups.append(_group_view(group, now_ms))
        if not queues:
            return None
        return TopicRoute(topic, tuple(queues), tuple(groups))

    def cluster_info(self, now_ms: int) -> tuple[ClusterView, ...]:
        by_cluster: dict[str, list[GroupView]] = {}
        for name in sorted(self._groups):
            group = self._groups[name]
            by_cluster.setdefault(group.cluster, []).append(_group_view(group, now_ms))
        return tuple(ClusterView(c, tuple(by_cluster[c])) for c in sorted(by_cluster))

    def all_topics(self) -> tuple[str, ...]:
        return tuple(sorted({t for g in self._groups.values() for t in g.topics}))

    def group(self, broker_group: str, now_ms: int) -> GroupView | None:
        group = self._groups.get(broker_group)
        return _group_view(group, now_ms) if group else None

    # ---- internals ------------------------------------------------------------------------------

    def _remove(self, group: _Group, node_id: str) -> None:
        del group.nodes[node_id]
        if group.leader == node_id:
            group.leader = None  # the term stays: a late, older claim must still lose
        if not group.nodes:
            del self._groups[group.name]  # its topics go with it, as in RocketMQ

    @staticmethod
    def _check(group: _Group) -> None:
        assert group.leader is None or group.leader in group.nodes, "leader must be a member"
        assert group.nodes, "a group without nodes must not be kept"
        assert group.term >= 0


def _claim(group: _Group, node_id: str, term: int) -> LeaderChange:
    """`node_id` says it leads `group` in `term`. Raft allows one leader per term."""
    if term < group.term:
        return LeaderChange.STALE_TERM
    if term > group.term or group.leader is None:
        group.term, group.leader = term, node_id
        return LeaderChange.APPLIED
    if group.leader == node_id:
        return LeaderChange.ALREADY_APPLIED
    return LeaderChange.CONFLICT


def _group_view(group: _Group, now_ms: int) -> GroupView:
    nodes = tuple(
        NodeView(
            n.node_id,
            n.address,
            n.raft_address,
            n.role,
            n.term,
            group.leader == n.node_id,
            n.last_heartbeat_ms,
            max(0, now_ms - n.last_heartbeat_ms),
            n.data_address,
        )
        for n in sorted(group.nodes.values(), key=lambda n: n.node_id)
    )
    leader_address = group.nodes[group.leader].address if group.leader else None
    return GroupView(group.cluster, group.name, group.leader, leader_address, group.term, nodes)


# ---- validation (the caller's fault) ------------------------------------------------------------


def check_name(kind: str, name: str, pattern: re.Pattern[str] = _NAME_RE) -> None:
    if not name:
        raise InvalidNameError.for_name(kind, name, "it must not be empty")
    if len(name) > MAX_NAME_CHARS:
        raise InvalidNameError.for_name(kind, name, f"it is longer than {MAX_NAME_CHARS} chars")
    if not pattern.fullmatch(name):
        allowed = pattern.pattern.strip("[]+")
        raise InvalidNameError.for_name(kind, name, f"use only the characters {allowed}")


def check_topic_name(topic: str) -> None:
    check_name("topic", topic, _TOPIC_RE)


def check_address(kind: str, address: str) -> None:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgumentError(f"{kind} {address!r} is not host:port (e.g. 10.0.0.5:10911)")


def check_topics(topics: Iterable[TopicQueues]) -> None:
    seen: set[str] = set()
    for t in topics:
        check_topic_name(t.topic)
        if t.topic in seen:
            raise InvalidArgumentError(f"topic {t.topic!r} is listed twice in one registration")
        seen.add(t.topic)
        for kind, n in (("read", t.read_queue_nums), ("write", t.write_queue_nums)):
            if not 0 <= n <= MAX_QUEUES_PER_TOPIC:
                raise InvalidArgumentError(
                    f"topic {t.topic!r}: {kind}_queue_nums {n} is outside 0..{MAX_QUEUES_PER_TOPIC}"
                )


def _validate_registration(reg: Registration) -> None:
    check_name("cluster", reg.cluster)
    check_name("broker group", reg.broker_group)
    check_name("node id", reg.node_id, _NODE_RE)
    check_address("node address", reg.address)
    if reg.raft_address:
        check_address("raft address", reg.raft_address)
    if reg.data_address:
        check_address("data address", reg.data_address)
    if reg.term < 0:
        raise InvalidArgumentError(f"term must be >= 0, got {reg.term}")
    check_topics(reg.topics)
