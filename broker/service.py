"""The Broker gRPC servicer: wire messages to BrokerNode calls and back.

Thin shell: every decision is BrokerNode's; the data-path conversions are broker/requests.py's
(shared with the framed data server); every failure leaves through `rpc_errors` as a typed
status with an ErrorDetail, never as a traceback.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import grpc

from raftmq.broker import requests
from raftmq.broker.convert import stored_to_pb, topic_from_pb, topic_to_pb
from raftmq.broker.node import BrokerNode
from raftmq.common.errors import rpc_errors
from raftmq.common.pb import broker_pb2, broker_pb2_grpc, common_pb2
from raftmq.common.types import QueueRef
from raftmq.raftlog.record import Role

ROLE_TO_PB = {
    Role.LEADER: common_pb2.LEADER,
    Role.FOLLOWER: common_pb2.FOLLOWER,
    Role.CANDIDATE: common_pb2.CANDIDATE,
}
DEADLINE_MARGIN_S = 0.2  # answer a long poll this long before the caller's deadline
MAX_STATUS_TOPICS = 1000  # GetBrokerStatus lists at most this many topics


def _deadline(context: grpc.ServicerContext) -> float:
    left = context.time_remaining()
    if left is None:
        return time.monotonic() + 3600.0
    return time.monotonic() + max(0.0, left - DEADLINE_MARGIN_S)


class BrokerService(broker_pb2_grpc.BrokerServicer):
    def __init__(self, node: BrokerNode) -> None:
        self.node = node  # its consumer registry is the one the framed data server uses too

    @rpc_errors
    def Heartbeat(
        self, request: broker_pb2.HeartbeatRequest, context: grpc.ServicerContext
    ) -> broker_pb2.HeartbeatResponse:
        return requests.heartbeat(self.node, request)

    @rpc_errors
    def GetConsumerList(
        self, request: broker_pb2.GetConsumerListRequest, context: grpc.ServicerContext
    ) -> broker_pb2.GetConsumerListResponse:
        return requests.consumer_list(self.node, request)

    @rpc_errors
    def LockQueues(
        self, request: broker_pb2.LockQueuesRequest, context: grpc.ServicerContext
    ) -> broker_pb2.LockQueuesResponse:
        result = self.node.locks.lock(
            request.consumer_group, request.client_id, request.topic, list(request.queue_ids)
        )
        return _lock_answer(result.granted, result.refused, self.node.locks.lease_ms)

    @rpc_errors
    def UnlockQueues(
        self, request: broker_pb2.LockQueuesRequest, context: grpc.ServicerContext
    ) -> broker_pb2.LockQueuesResponse:
        result = self.node.locks.unlock(
            request.consumer_group, request.client_id, request.topic, list(request.queue_ids)
        )
        return _lock_answer(result.granted, result.refused, self.node.locks.lease_ms)

    @rpc_errors
    def SendMessage(
        self, request: broker_pb2.SendMessageRequest, context: grpc.ServicerContext
    ) -> broker_pb2.SendMessageResponse:
        return requests.send(self.node, request)

    @rpc_errors
    def PullMessage(
        self, request: broker_pb2.PullMessageRequest, context: grpc.ServicerContext
    ) -> broker_pb2.PullMessageResponse:
        steps = requests.pull_steps(self.node, request, _deadline(context))
        return requests.pull_answer(self.node, self.node.pulls.run_blocking(steps))

    @rpc_errors
    def CommitOffset(
        self, request: broker_pb2.CommitOffsetRequest, context: grpc.ServicerContext
    ) -> broker_pb2.CommitOffsetResponse:
        return requests.commit_offset(self.node, request)

    @rpc_errors
    def QueryOffset(
        self, request: broker_pb2.QueryOffsetRequest, context: grpc.ServicerContext
    ) -> broker_pb2.QueryOffsetResponse:
        return requests.query_offset(self.node, request)

    @rpc_errors
    def GetQueueBounds(
        self, request: broker_pb2.GetQueueBoundsRequest, context: grpc.ServicerContext
    ) -> broker_pb2.GetQueueBoundsResponse:
        return requests.queue_bounds(self.node, request)

    @rpc_errors
    def SearchOffsetByTimestamp(
        self, request: broker_pb2.SearchOffsetByTimestampRequest, context: grpc.ServicerContext
    ) -> broker_pb2.SearchOffsetByTimestampResponse:
        return requests.search_offset(self.node, request)

    @rpc_errors
    def ResetOffsetsToTimestamp(
        self, request: broker_pb2.ResetOffsetsToTimestampRequest, context: grpc.ServicerContext
    ) -> broker_pb2.ResetOffsetsToTimestampResponse:
        offsets = self.node.offsets.reset_offsets_to_timestamp(
            request.consumer_group, request.topic, request.timestamp_ms
        )
        return broker_pb2.ResetOffsetsToTimestampResponse(
            offsets=[
                broker_pb2.QueueOffset(topic=request.topic, queue_id=q, offset=o)
                for q, o in sorted(offsets.items())
            ]
        )

    @rpc_errors
    def QueryMessageById(
        self, request: broker_pb2.QueryMessageByIdRequest, context: grpc.ServicerContext
    ) -> broker_pb2.QueryMessageByIdResponse:
        return broker_pb2.QueryMessageByIdResponse(
            message=stored_to_pb(self.node.queries.message_by_id(request.msg_id))
        )

    @rpc_errors
    def QueryMessagesByKey(
        self, request: broker_pb2.QueryMessagesByKeyRequest, context: grpc.ServicerContext
    ) -> broker_pb2.QueryMessagesByKeyResponse:
        found = self.node.queries.messages_by_key(
            request.topic,
            request.key,
            request.max_count or 32,
            request.begin_timestamp_ms,
            request.end_timestamp_ms,
        )
        return broker_pb2.QueryMessagesByKeyResponse(messages=[stored_to_pb(m) for m in found])

    @rpc_errors
    def CreateTopic(
        self, request: broker_pb2.CreateTopicRequest, context: grpc.ServicerContext
    ) -> broker_pb2.CreateTopicResponse:
        cfg = topic_from_pb(request.config, default_queues=self.node.settings.default_queue_nums)
        return broker_pb2.CreateTopicResponse(
            config=topic_to_pb(self.node.topic_admin.create_topic(cfg))
        )

    @rpc_errors
    def UpdateTopic(
        self, request: broker_pb2.UpdateTopicRequest, context: grpc.ServicerContext
    ) -> broker_pb2.UpdateTopicResponse:
        cfg = topic_from_pb(request.config, default_queues=self.node.settings.default_queue_nums)
        return broker_pb2.UpdateTopicResponse(
            config=topic_to_pb(self.node.topic_admin.update_topic(cfg))
        )

    @rpc_errors
    def DeleteTopic(
        self, request: broker_pb2.DeleteTopicRequest, context: grpc.ServicerContext
    ) -> broker_pb2.DeleteTopicResponse:
        self.node.topic_admin.delete_topic(request.topic)
        return broker_pb2.DeleteTopicResponse()

    @rpc_errors
    def ListTopics(
        self, request: broker_pb2.ListTopicsRequest, context: grpc.ServicerContext
    ) -> broker_pb2.ListTopicsResponse:
        return broker_pb2.ListTopicsResponse(topics=[topic_to_pb(t) for t in self.node.topics()])

    @rpc_errors
    def GetBrokerStatus(
        self, request: broker_pb2.GetBrokerStatusRequest, context: grpc.ServicerContext
    ) -> broker_pb2.BrokerStatus:
        return broker_status(self.node)

    @rpc_errors
    def LeadershipTransfer(
        self, request: broker_pb2.LeadershipTransferRequest, context: grpc.ServicerContext
    ) -> broker_pb2.LeadershipTransferResponse:
        timeout_s = min(max(request.timeout_ms, 0) or 3000, 30_000) / 1000
        ok = self.node.transfer_leadership(request.target_node_id, timeout_s)
        leader = self.node.leader()
        deadline = time.monotonic() + 2.0
        while ok and (leader is None or leader is self.node.me) and time.monotonic() < deadline:
            time.sleep(0.02)  # the old leader learns the new one from its first append
            leader = self.node.leader()
        return broker_pb2.LeadershipTransferResponse(
            ok=ok,
            leader_node_id=leader.node_id if leader is not None else "",
            term=self.node.status().term,
        )


def _lock_answer(
    granted: Iterable[QueueRef], refused: Iterable[QueueRef], lease_ms: int
) -> broker_pb2.LockQueuesResponse:
    return broker_pb2.LockQueuesResponse(
        granted=sorted(q.queue_id for q in granted),
        refused=sorted(q.queue_id for q in refused),
        lease_ms=lease_ms,
    )


def broker_status(node: BrokerNode) -> broker_pb2.BrokerStatus:
    st = node.status()
    storage = node.health.error
    leader = node.leader()
    topics = []
    for cfg in node.topics()[:MAX_STATUS_TOPICS]:
        queues = []
        for q in range(cfg.read_queue_nums):
            low, high = node.store.queue_bounds(cfg.name, q)
            queues.append(broker_pb2.QueueStats(queue_id=q, min_offset=low, max_offset=high))
        topics.append(broker_pb2.TopicStats(topic=cfg.name, queues=queues))
    return broker_pb2.BrokerStatus(
        cluster=node.settings.cluster,
        broker_group=node.group,
        node_id=node.me.node_id,
        address=node.me.address,
        role=ROLE_TO_PB.get(st.role, common_pb2.ROLE_UNSPECIFIED),
        term=st.term,
        leader_node_id=leader.node_id if leader is not None else "",
        leader_address=leader.address if leader is not None else "",
        commit_index=st.commit_index,
        applied_index=st.applied_index,
        dispatch_index=node.dispatcher.dispatched_index,
        topics=topics,
        storage_error=storage.describe() if storage is not None else "",
        disk_full=storage is not None and storage.disk_full,
    )
