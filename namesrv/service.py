"""The NameServer gRPC servicer: converts wire messages to route-table values and back.

Thin shell around namesrv.route_table: it owns the lock and the clock, nothing else. Errors are
raised as client.errors types and put on the wire by `rpc_errors` in one place.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import grpc

from raftmq.common.errors import NoRouteError, rpc_errors
from raftmq.common.pb import common_pb2, namesrv_pb2, namesrv_pb2_grpc
from raftmq.namesrv.route_table import (
    ClusterView,
    ExpiredNode,
    GroupView,
    LeaderChange,
    Permission,
    Registration,
    Role,
    RouteTable,
    TopicQueues,
    check_name,
    check_topic_name,
)

_log = logging.getLogger(__name__)

_ROLE_FROM_PB = {
    common_pb2.ROLE_UNSPECIFIED: Role.UNKNOWN,
    common_pb2.LEADER: Role.LEADER,
    common_pb2.FOLLOWER: Role.FOLLOWER,
    common_pb2.CANDIDATE: Role.CANDIDATE,
}
_ROLE_TO_PB = {role: pb for pb, role in _ROLE_FROM_PB.items()}
_PERM_FROM_PB = {
    common_pb2.PERM_UNSPECIFIED: Permission.READ_WRITE,
    common_pb2.PERM_READ_WRITE: Permission.READ_WRITE,
    common_pb2.PERM_READ_ONLY: Permission.READ_ONLY,
    common_pb2.PERM_WRITE_ONLY: Permission.WRITE_ONLY,
    common_pb2.PERM_NONE: Permission.NONE,
}
_PERM_TO_PB = {
    Permission.READ_WRITE: common_pb2.PERM_READ_WRITE,
    Permission.READ_ONLY: common_pb2.PERM_READ_ONLY,
    Permission.WRITE_ONLY: common_pb2.PERM_WRITE_ONLY,
    Permission.NONE: common_pb2.PERM_NONE,
}
_CHANGE_TO_PB = {
    LeaderChange.APPLIED: namesrv_pb2.LEADER_CHANGE_APPLIED,
    LeaderChange.ALREADY_APPLIED: namesrv_pb2.LEADER_CHANGE_ALREADY_APPLIED,
    LeaderChange.STALE_TERM: namesrv_pb2.LEADER_CHANGE_STALE_TERM,
    LeaderChange.UNKNOWN_NODE: namesrv_pb2.LEADER_CHANGE_UNKNOWN_NODE,
    LeaderChange.CONFLICT: namesrv_pb2.LEADER_CHANGE_CONFLICT,
}


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def _group_to_pb(g: GroupView) -> namesrv_pb2.BrokerGroup:
    return namesrv_pb2.BrokerGroup(
        cluster=g.cluster,
        broker_group=g.broker_group,
        leader_node_id=g.leader_node_id or "",
        leader_address=g.leader_address or "",
        term=g.term,
        nodes=[
            namesrv_pb2.BrokerNode(
                node_id=n.node_id,
                address=n.address,
                raft_address=n.raft_address,
                role=_ROLE_TO_PB[n.role],
                term=n.term,
                is_leader=n.is_leader,
                last_heartbeat_age_ms=n.heartbeat_age_ms,
                data_address=n.data_address,
            )
            for n in g.nodes
        ],
    )


def registration_from_pb(req: namesrv_pb2.RegisterBrokerRequest) -> Registration:
    return Registration(
        cluster=req.cluster,
        broker_group=req.broker_group,
        node_id=req.node_id,
        address=req.address,
        raft_address=req.raft_address,
        data_address=req.data_address,
        role=_ROLE_FROM_PB.get(req.role, Role.UNKNOWN),
        term=req.term,
        topics=tuple(
            TopicQueues(
                topic=t.topic,
                read_queue_nums=t.read_queue_nums,
                write_queue_nums=t.write_queue_nums,
                perm=_PERM_FROM_PB.get(t.perm, Permission.READ_WRITE),
                ordered=t.ordered,
            )
            for t in req.topics
        ),
    )


class NameServerService(namesrv_pb2_grpc.NameServerServicer):
    """Serves one RouteTable; every call holds the lock for the few microseconds it needs."""

    def __init__(self, table: RouteTable, clock_ms: Callable[[], int] = monotonic_ms) -> None:
        self._table = table
        self._clock_ms = clock_ms
        self._lock = threading.Lock()

    def snapshot(self) -> tuple[tuple[ClusterView, ...], tuple[str, ...]]:
        """Every cluster's groups and every topic with a route, now (metrics)."""
        with self._lock:
            return self._table.cluster_info(self._clock_ms()), self._table.all_topics()

    def expire(self) -> list[ExpiredNode]:
        """Drop nodes past the expiry time (called by the server's scan thread)."""
        with self._lock:
            expired = self._table.expire(self._clock_ms())
        for e in expired:
            _log.warning(
                "namesrv.node_expired cluster=%s group=%s node=%s address=%s age_ms=%d leader=%s",
                e.cluster,
                e.broker_group,
                e.node_id,
                e.address,
                e.heartbeat_age_ms,
                e.was_leader,
            )
        return expired

    @rpc_errors
    def RegisterBroker(
        self, request: namesrv_pb2.RegisterBrokerRequest, context: grpc.ServicerContext
    ) -> namesrv_pb2.RegisterBrokerResponse:
        reg = registration_from_pb(request)
        with self._lock:
            out = self._table.register(reg, self._clock_ms())
        if out.new_node:
            _log.info(
                "namesrv.node_registered cluster=%s group=%s node=%s address=%s role=%s term=%d",
                reg.cluster,
                reg.broker_group,
                reg.node_id,
                reg.address,
                reg.role.value,
                reg.term,
            )
        if reg.role is Role.LEADER and out.leader_node_id != reg.node_id:
            _log.warning(
                "namesrv.leader_claim_ignored group=%s node=%s term=%d leader=%s leader_term=%d",
                reg.broker_group,
                reg.node_id,
                reg.term,
                out.leader_node_id,
                out.term,
            )
        return namesrv_pb2.RegisterBrokerResponse(
            ok=True,
            leader_node_id=out.leader_node_id or "",
            leader_address=out.leader_address or "",
            term=out.term,
            broker_expiry_ms=self._table.broker_expiry_ms,
        )

    @rpc_errors
    def UnregisterBroker(
        self, request: namesrv_pb2.UnregisterBrokerRequest, context: grpc.ServicerContext
    ) -> namesrv_pb2.UnregisterBrokerResponse:
        with self._lock:
            removed = self._table.unregister(request.cluster, request.broker_group, request.node_id)
        if removed:
            _log.info(
                "namesrv.node_unregistered cluster=%s group=%s node=%s",
                request.cluster,
                request.broker_group,
                request.node_id,
            )
        return namesrv_pb2.UnregisterBrokerResponse(removed=removed)

    @rpc_errors
    def GetRouteInfoByTopic(
        self, request: namesrv_pb2.GetRouteInfoByTopicRequest, context: grpc.ServicerContext
    ) -> namesrv_pb2.TopicRouteData:
        check_topic_name(request.topic)
        with self._lock:
            route = self._table.route(request.topic, self._clock_ms())
        if route is None:
            raise NoRouteError.for_topic(request.topic)
        return namesrv_pb2.TopicRouteData(
            topic=route.topic,
            queues=[
                namesrv_pb2.QueueData(
                    broker_group=q.broker_group,
                    read_queue_nums=q.read_queue_nums,
                    write_queue_nums=q.write_queue_nums,
                    perm=_PERM_TO_PB[q.perm],
                    ordered=q.ordered,
                )
                for q in route.queues
            ],
            groups=[_group_to_pb(g) for g in route.groups],
        )

    @rpc_errors
    def GetClusterInfo(
        self, request: namesrv_pb2.GetClusterInfoRequest, context: grpc.ServicerContext
    ) -> namesrv_pb2.ClusterInfo:
        with self._lock:
            clusters = self._table.cluster_info(self._clock_ms())
        return namesrv_pb2.ClusterInfo(
            clusters=[
                namesrv_pb2.Cluster(name=c.name, groups=[_group_to_pb(g) for g in c.groups])
                for c in clusters
            ]
        )

    @rpc_errors
    def GetAllTopics(
        self, request: namesrv_pb2.GetAllTopicsRequest, context: grpc.ServicerContext
    ) -> namesrv_pb2.GetAllTopicsResponse:
        with self._lock:
            topics = self._table.all_topics()
        return namesrv_pb2.GetAllTopicsResponse(topics=topics)

    @rpc_errors
    def PushLeaderChange(
        self, request: namesrv_pb2.PushLeaderChangeRequest, context: grpc.ServicerContext
    ) -> namesrv_pb2.PushLeaderChangeResponse:
        check_name("broker group", request.broker_group)
        with self._lock:
            out = self._table.apply_leader_change(
                request.broker_group, request.leader_node_id, request.term
            )
        _log.info(
            "namesrv.leader_push group=%s node=%s term=%d result=%s",
            request.broker_group,
            request.leader_node_id,
            request.term,
            out.result.value,
        )
        return namesrv_pb2.PushLeaderChangeResponse(
            result=_CHANGE_TO_PB[out.result],
            leader_node_id=out.leader_node_id or "",
            term=out.term,
        )
