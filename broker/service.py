"""The Broker gRPC servicer: wire messages to BrokerNode calls and back.

Thin shell: every decision is BrokerNode's; every failure leaves through `rpc_errors` as a typed
status with an ErrorDetail, never as a traceback.
"""

from __future__ import annotations

import threading
import time

import grpc

from raftmq.broker.consumer_registry import ConsumerRegistry, RegistryFullError
from raftmq.broker.convert import message_from_pb, stored_to_pb, topic_from_pb, topic_to_pb
from raftmq.broker.node import BrokerNode
from raftmq.broker.pull import PullStatus
from raftmq.common.errors import InvalidArgumentError, QueueFullError, rpc_errors
from raftmq.common.message import validate_group
from raftmq.common.pb import broker_pb2, broker_pb2_grpc, common_pb2
from raftmq.raftlog.record import Role

_PULL_STATUS = {
    PullStatus.FOUND: broker_pb2.FOUND,
    PullStatus.NO_NEW_MSG: broker_pb2.NO_NEW_MSG,
    PullStatus.NO_MATCHED_MSG: broker_pb2.NO_MATCHED_MSG,
}
ROLE_TO_PB = {
    Role.LEADER: common_pb2.LEADER,
    Role.FOLLOWER: common_pb2.FOLLOWER,
    Role.CANDIDATE: common_pb2.CANDIDATE,
}
DEADLINE_MARGIN_S = 0.2  # answer a long poll this long before the caller's deadline
MAX_STATUS_TOPICS = 1000  # GetBrokerStatus lists at most this many topics


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def _deadline(context: grpc.ServicerContext) -> float:
    left = context.time_remaining()
    if left is None:
        return time.monotonic() + 3600.0
    return time.monotonic() + max(0.0, left - DEADLINE_MARGIN_S)


class BrokerService(broker_pb2_grpc.BrokerServicer):
    def __init__(self, node: BrokerNode) -> None:
        self.node = node
        self._consumers = ConsumerRegistry()
        self._consumers_lock = threading.Lock()

    @rpc_errors
    def Heartbeat(
        self, request: broker_pb2.HeartbeatRequest, context: grpc.ServicerContext
    ) -> broker_pb2.HeartbeatResponse:
        validate_group(request.consumer_group)
        if not request.client_id or len(request.client_id) > 255:
            raise InvalidArgumentError("client_id must be 1..255 characters")
        with self._consumers_lock:
            if request.leaving:
                self._consumers.leave(request.consumer_group, request.client_id)
            else:
                try:
                    self._consumers.heartbeat(
                        request.consumer_group,
                        request.client_id,
                        tuple(request.topics),
                        request.expiry_ms,
                        _monotonic_ms(),
                    )
                except RegistryFullError as exc:
                    raise QueueFullError(str(exc)) from exc
        return broker_pb2.HeartbeatResponse()

    @rpc_errors
    def GetConsumerList(
        self, request: broker_pb2.GetConsumerListRequest, context: grpc.ServicerContext
    ) -> broker_pb2.GetConsumerListResponse:
        validate_group(request.consumer_group)
        with self._consumers_lock:
            ids = self._consumers.members(request.consumer_group, _monotonic_ms())
        return broker_pb2.GetConsumerListResponse(client_ids=ids)

    @rpc_errors
    def SendMessage(
        self, request: broker_pb2.SendMessageRequest, context: grpc.ServicerContext
    ) -> broker_pb2.SendMessageResponse:
        messages = [message_from_pb(request.topic, m) for m in request.messages]
        term = self.node.status().term
        queue_id, outcomes = self.node.sends.send(
            request.topic,
            request.queue_id,
            messages,
            request.producer_id,
            request.first_sequence,
            request.timeout_ms,
        )
        return broker_pb2.SendMessageResponse(
            results=[
                broker_pb2.SendResult(
                    msg_id=o.msg_id,
                    queue_id=queue_id,
                    queue_offset=o.queue_offset,
                    duplicate=o.duplicate,
                )
                for o in outcomes
            ],
            broker_group=self.node.group,
            term=term,
        )

    @rpc_errors
    def PullMessage(
        self, request: broker_pb2.PullMessageRequest, context: grpc.ServicerContext
    ) -> broker_pb2.PullMessageResponse:
        if request.filter_type not in (
            broker_pb2.FILTER_TYPE_UNSPECIFIED,
            broker_pb2.TAG,
            broker_pb2.SQL92,
        ):
            raise InvalidArgumentError(f"unknown filter type {request.filter_type}")
        result = self.node.pulls.pull(
            request.consumer_group,
            request.topic,
            request.queue_id,
            request.offset,
            request.max_count or 32,
            sql=request.filter_type == broker_pb2.SQL92,
            expression=request.filter_expression,
            max_wait_ms=request.max_wait_ms,
            allow_follower_read=request.allow_follower_read,
            max_bytes=request.max_bytes,
            deadline=_deadline(context),
            raw=request.raw_batches,
        )
        return broker_pb2.PullMessageResponse(
            status=_PULL_STATUS[result.status],
            messages=[stored_to_pb(m) for m in result.messages],
            next_offset=result.next_offset,
            min_offset=result.min_offset,
            max_offset=result.max_offset,
            node_id=self.node.me.node_id,
            batches=[
                broker_pb2.RawBatch(
                    raft_index=p.raft_index,
                    slot=p.slot,
                    first_offset=p.first_offset,
                    store_timestamp_ms=p.store_timestamp_ms,
                    chunk=p.chunk,
                    positions=p.positions,
                    byte_offsets=p.byte_offsets,
                )
                for p in result.raw_parts
            ],
        )

    @rpc_errors
    def CommitOffset(
        self, request: broker_pb2.CommitOffsetRequest, context: grpc.ServicerContext
    ) -> broker_pb2.CommitOffsetResponse:
        self.node.offsets.commit_offsets(
            request.consumer_group, [(o.topic, o.queue_id, o.offset) for o in request.offsets]
        )
        return broker_pb2.CommitOffsetResponse()

    @rpc_errors
    def QueryOffset(
        self, request: broker_pb2.QueryOffsetRequest, context: grpc.ServicerContext
    ) -> broker_pb2.QueryOffsetResponse:
        offset = self.node.offsets.query_offset(
            request.consumer_group, request.topic, request.queue_id
        )
        return broker_pb2.QueryOffsetResponse(offset=offset)

    @rpc_errors
    def GetQueueBounds(
        self, request: broker_pb2.GetQueueBoundsRequest, context: grpc.ServicerContext
    ) -> broker_pb2.GetQueueBoundsResponse:
        if request.queue_id < 0:
            raise InvalidArgumentError(f"queue id {request.queue_id} is negative")
        info = self.node.offsets.queue_info(request.topic, request.queue_id)
        return broker_pb2.GetQueueBoundsResponse(
            min_offset=info.min_offset,
            max_offset=info.max_offset,
            min_store_timestamp_ms=info.min_store_timestamp_ms,
            max_store_timestamp_ms=info.max_store_timestamp_ms,
        )

    @rpc_errors
    def SearchOffsetByTimestamp(
        self, request: broker_pb2.SearchOffsetByTimestampRequest, context: grpc.ServicerContext
    ) -> broker_pb2.SearchOffsetByTimestampResponse:
        if request.queue_id < 0:
            raise InvalidArgumentError(f"queue id {request.queue_id} is negative")
        offset = self.node.offsets.offset_for_timestamp(
            request.topic, request.queue_id, request.timestamp_ms
        )
        return broker_pb2.SearchOffsetByTimestampResponse(offset=offset)

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


def broker_status(node: BrokerNode) -> broker_pb2.BrokerStatus:
    st = node.status()
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
    )
