"""The NameServer's route table, driven directly with values and an explicit clock."""

from __future__ import annotations

import pytest

from raftmq.common.errors import InvalidArgumentError, InvalidNameError
from raftmq.namesrv.route_table import (
    MAX_NODES_PER_GROUP,
    LeaderChange,
    Permission,
    QueueData,
    Registration,
    Role,
    RouteTable,
    TopicQueues,
)

EXPIRY_MS = 120_000
ORDERS = TopicQueues("orders", 4, 4)
AUDIT = TopicQueues("audit", 2, 2, Permission.READ_ONLY, ordered=True)


def reg(
    node: str,
    role: Role = Role.FOLLOWER,
    term: int = 1,
    topics: tuple[TopicQueues, ...] = (ORDERS,),
    group: str = "broker-a",
    cluster: str = "c1",
) -> Registration:
    port = 10911 + int(node[-1])
    return Registration(
        cluster=cluster,
        broker_group=group,
        node_id=node,
        address=f"127.0.0.1:{port}",
        raft_address=f"127.0.0.1:{port + 1000}",
        role=role,
        term=term,
        topics=topics,
    )


def three_nodes(table: RouteTable, now_ms: int = 0, term: int = 1) -> None:
    table.register(reg("a0", Role.LEADER, term), now_ms)
    table.register(reg("a1", Role.FOLLOWER, term), now_ms)
    table.register(reg("a2", Role.FOLLOWER, term), now_ms)


def leader(table: RouteTable, group: str = "broker-a") -> tuple[str | None, int]:
    view = table.group(group, 0)
    assert view is not None
    return view.leader_node_id, view.term


def test_register_makes_a_route_with_the_leader_marked() -> None:
    table = RouteTable(EXPIRY_MS)
    three_nodes(table)
    route = table.route("orders", now_ms=10)
    assert route is not None
    assert route.queues == (QueueData("broker-a", 4, 4, Permission.READ_WRITE, False),)
    (group,) = route.groups
    assert (group.cluster, group.leader_node_id, group.leader_address) == (
        "c1",
        "a0",
        "127.0.0.1:10911",
    )
    assert [(n.node_id, n.is_leader) for n in group.nodes] == [
        ("a0", True),
        ("a1", False),
        ("a2", False),
    ]
    assert all(n.heartbeat_age_ms == 10 for n in group.nodes)
    assert table.route("missing", 10) is None
    assert table.all_topics() == ("orders",)


def test_routes_span_groups_and_clusters() -> None:
    table = RouteTable(EXPIRY_MS)
    table.register(reg("a0", Role.LEADER, topics=(ORDERS, AUDIT)), 0)
    table.register(reg("b0", Role.LEADER, topics=(ORDERS,), group="broker-b"), 0)
    table.register(reg("x0", Role.LEADER, topics=(AUDIT,), group="broker-x", cluster="c2"), 0)
    route = table.route("orders", 0)
    assert route is not None
    assert [q.broker_group for q in route.queues] == ["broker-a", "broker-b"]
    audit = table.route("audit", 0)
    assert audit is not None
    assert audit.queues[0] == QueueData("broker-a", 2, 2, Permission.READ_ONLY, True)
    assert [c.name for c in table.cluster_info(0)] == ["c1", "c2"]
    assert [g.broker_group for g in table.cluster_info(0)[0].groups] == ["broker-a", "broker-b"]
    assert table.all_topics() == ("audit", "orders")


def test_heartbeat_refreshes_and_expiry_after_the_configured_time() -> None:
    table = RouteTable(broker_expiry_ms=1_000)
    three_nodes(table, now_ms=0)
    table.register(reg("a0", Role.LEADER), 900)  # a0 heartbeats; a1 and a2 stay silent

    assert table.expire(1_000) == []  # exactly the expiry age is still alive
    expired = table.expire(1_001)
    assert sorted(e.node_id for e in expired) == ["a1", "a2"]
    assert all(e.heartbeat_age_ms == 1_001 and not e.was_leader for e in expired)

    route = table.route("orders", 1_001)
    assert route is not None
    assert [n.node_id for n in route.groups[0].nodes] == ["a0"]

    (last,) = table.expire(1_901)
    assert (last.node_id, last.was_leader) == ("a0", True)
    assert table.route("orders", 1_901) is None  # the group and its topics are gone
    assert table.cluster_info(1_901) == ()


def test_group_without_known_leader_still_lists_its_nodes() -> None:
    table = RouteTable(broker_expiry_ms=1_000)
    three_nodes(table, now_ms=0)
    table.register(reg("a1"), 600)
    table.register(reg("a2"), 600)
    (gone,) = table.expire(1_200)
    assert gone.was_leader
    route = table.route("orders", 1_200)
    assert route is not None
    group = route.groups[0]
    assert (group.leader_node_id, group.leader_address, group.term) == (None, None, 1)
    assert [n.node_id for n in group.nodes] == ["a1", "a2"]
    assert not any(n.is_leader for n in group.nodes)


def test_leader_change_by_term_and_stale_term_ignored() -> None:
    table = RouteTable(EXPIRY_MS)
    three_nodes(table, term=3)
    assert leader(table) == ("a0", 3)

    out = table.apply_leader_change("broker-a", "a1", 4)
    assert (out.result, out.leader_node_id, out.term) == (LeaderChange.APPLIED, "a1", 4)
    # the same push again (two controllers, a retry): idempotent
    assert table.apply_leader_change("broker-a", "a1", 4).result is LeaderChange.ALREADY_APPLIED
    # an older term arriving late is ignored
    stale = table.apply_leader_change("broker-a", "a0", 3)
    assert (stale.result, stale.leader_node_id, stale.term) == (LeaderChange.STALE_TERM, "a1", 4)
    # a second leader for the same term cannot be: keep the first
    assert table.apply_leader_change("broker-a", "a2", 4).result is LeaderChange.CONFLICT
    assert leader(table) == ("a1", 4)

    # the deposed leader's next heartbeat still claims term 3: ignored, a1 stays leader
    out_reg = table.register(reg("a0", Role.LEADER, term=3), 5)
    assert (out_reg.leader_node_id, out_reg.term, out_reg.topics_accepted) == ("a1", 4, False)
    route = table.route("orders", 5)
    assert route is not None
    by_id = {n.node_id: n for n in route.groups[0].nodes}
    assert by_id["a0"].role is Role.LEADER and not by_id["a0"].is_leader  # as reported
    assert by_id["a1"].is_leader


def test_leader_change_for_unknown_group_or_node() -> None:
    table = RouteTable(EXPIRY_MS)
    assert table.apply_leader_change("broker-z", "z0", 1).result is LeaderChange.UNKNOWN_NODE
    three_nodes(table, term=5)
    assert table.apply_leader_change("broker-a", "a9", 6).result is LeaderChange.UNKNOWN_NODE
    assert table.apply_leader_change("broker-a", "a9", 4).result is LeaderChange.STALE_TERM
    assert leader(table) == ("a0", 5)
    with pytest.raises(InvalidArgumentError):
        table.apply_leader_change("broker-a", "a1", -1)


def test_leader_registration_with_a_newer_term_wins() -> None:
    table = RouteTable(EXPIRY_MS)
    three_nodes(table, term=1)
    out = table.register(reg("a2", Role.LEADER, term=2), 1)
    assert (out.leader_node_id, out.leader_address, out.term) == ("a2", "127.0.0.1:10913", 2)
    # the old leader steps down in the same term (leader fallback): no leader until a new claim
    three_more = RouteTable(EXPIRY_MS)
    three_nodes(three_more, term=7)
    three_more.register(reg("a0", Role.FOLLOWER, term=7), 1)
    assert leader(three_more) == (None, 7)
    three_more.register(reg("a1", Role.LEADER, term=7), 2)  # same term, nobody leads it: take it
    assert leader(three_more) == ("a1", 7)


def test_topics_come_from_the_leader() -> None:
    table = RouteTable(EXPIRY_MS)
    table.register(reg("a0", Role.LEADER, term=2, topics=(ORDERS, AUDIT)), 0)
    # a lagging follower's older table does not replace the leader's
    out = table.register(reg("a1", Role.FOLLOWER, term=2, topics=(ORDERS,)), 0)
    assert not out.topics_accepted
    assert table.all_topics() == ("audit", "orders")
    # the leader deletes a topic: its next registration removes it
    table.register(reg("a0", Role.LEADER, term=2, topics=(ORDERS,)), 1)
    assert table.all_topics() == ("orders",)
    # while no leader is known, the table with the highest term is kept
    table.unregister("c1", "broker-a", "a0")
    assert table.register(reg("a1", term=1, topics=()), 2).topics_accepted is False
    assert table.register(reg("a1", term=3, topics=(AUDIT,)), 2).topics_accepted is True
    assert table.all_topics() == ("audit",)


def test_unregister() -> None:
    table = RouteTable(EXPIRY_MS)
    three_nodes(table)
    assert table.unregister("c1", "broker-a", "a0") is True
    assert table.unregister("c1", "broker-a", "a0") is False  # already gone
    assert table.unregister("other", "broker-a", "a1") is False  # wrong cluster
    assert leader(table) == (None, 1)
    # a late push for the old term cannot resurrect a0, which is gone anyway
    assert table.apply_leader_change("broker-a", "a0", 1).result is LeaderChange.UNKNOWN_NODE
    table.unregister("c1", "broker-a", "a1")
    table.unregister("c1", "broker-a", "a2")
    assert table.route("orders", 0) is None
    assert table.group("broker-a", 0) is None


def test_heartbeat_updates_address_and_role() -> None:
    table = RouteTable(EXPIRY_MS)
    table.register(reg("a0", Role.LEADER), 0)
    moved = Registration("c1", "broker-a", "a0", "10.1.1.1:20911", "", Role.LEADER, 1, (ORDERS,))
    table.register(moved, 100)
    view = table.group("broker-a", 150)
    assert view is not None
    (node,) = view.nodes
    assert (node.address, node.raft_address, node.heartbeat_age_ms) == ("10.1.1.1:20911", "", 50)
    assert view.leader_address == "10.1.1.1:20911"


def test_data_address_is_kept_per_node_and_follows_reregistration() -> None:
    table = RouteTable(EXPIRY_MS)
    table.register(
        Registration(
            "c1", "broker-a", "a0", "127.0.0.1:10911", "", Role.LEADER, 1, (ORDERS,), "h:7001"
        ),
        0,
    )
    table.register(reg("a1"), 0)  # a node serving gRPC only
    route = table.route("orders", 0)
    assert route is not None
    assert [(n.node_id, n.data_address) for n in route.groups[0].nodes] == [
        ("a0", "h:7001"),
        ("a1", ""),
    ]
    table.register(
        Registration(
            "c1", "broker-a", "a0", "127.0.0.1:10911", "", Role.LEADER, 1, (ORDERS,), "h:7002"
        ),
        10,
    )
    (cluster,) = table.cluster_info(10)
    assert cluster.groups[0].nodes[0].data_address == "h:7002"  # a restart's new port


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"cluster": ""}, InvalidNameError),
        ({"broker_group": "bad group"}, InvalidNameError),
        ({"node_id": "n/0"}, InvalidNameError),
        ({"address": "no-port"}, InvalidArgumentError),
        ({"raft_address": "host:99999"}, InvalidArgumentError),
        ({"data_address": "host"}, InvalidArgumentError),
        ({"data_address": "host:0"}, InvalidArgumentError),
        ({"term": -1}, InvalidArgumentError),
        ({"topics": (TopicQueues("bad topic!", 1, 1),)}, InvalidNameError),
        ({"topics": (TopicQueues("t" * 128, 1, 1),)}, InvalidNameError),
        ({"topics": (ORDERS, ORDERS)}, InvalidArgumentError),
        ({"topics": (TopicQueues("big", 1, 5000),)}, InvalidArgumentError),
    ],
)
def test_bad_registrations_are_the_callers_fault(
    change: dict[str, object], error: type[Exception]
) -> None:
    base = reg("a0", Role.LEADER)
    fields = {**{f: getattr(base, f) for f in base.__dataclass_fields__}, **change}
    table = RouteTable(EXPIRY_MS)
    with pytest.raises(error):
        table.register(Registration(**fields), 0)
    assert table.cluster_info(0) == ()  # nothing half-registered


def test_system_topics_and_cluster_mismatch() -> None:
    table = RouteTable(EXPIRY_MS)
    table.register(reg("a0", Role.LEADER, topics=(TopicQueues("%RETRY%group-1", 1, 1),)), 0)
    assert table.all_topics() == ("%RETRY%group-1",)
    with pytest.raises(InvalidArgumentError, match="unique across clusters"):
        table.register(reg("a1", cluster="c2"), 0)


def test_nodes_per_group_are_bounded() -> None:
    table = RouteTable(EXPIRY_MS)
    for i in range(MAX_NODES_PER_GROUP):
        table.register(
            Registration("c1", "broker-a", f"n{i}", f"127.0.0.1:{2000 + i}", "", Role.FOLLOWER, 1),
            0,
        )
    with pytest.raises(InvalidArgumentError, match="limit"):
        table.register(Registration("c1", "broker-a", "extra", "h:1", "", Role.FOLLOWER, 1), 0)
