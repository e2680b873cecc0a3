"""The Broker gRPC servicer: wire messages to BrokerNode calls and back.

Thin shell: every decision is BrokerNode's; the data-path conversions are broker/requests.py's
(shared with the framed data server); every failure leaves through `rpc_errors` as a typed
status with an ErrorDetail, never as a traceback.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import threading
import time
from collections.abc import Iterable

import grpc

from raftmq.broker import live_settings, requests
from raftmq.broker.convert import stored_to_pb, topic_from_pb, topic_to_pb
from raftmq.broker.node import BrokerNode
from raftmq.broker.pull import INDEX_CATCHUP_MS
from raftmq.broker.time_query import Cursor
from raftmq.common.auth_guard import CALLER
from raftmq.common.errors import InvalidArgumentError, RequestTimeoutError, rpc_errors
from raftmq.common.group_config import GroupConfig, validate_group_config
from raftmq.common.message import validate_group
from raftmq.common.pb import broker_pb2, broker_pb2_grpc, common_pb2
from raftmq.common.quota import Flow
from raftmq.common.quota_gate import THROTTLE_KEY, ThreadHold
from raftmq.common.record_batch import GroupConfigChange, GroupDelete, PurgeQueues
from raftmq.common.settings import redacted
from raftmq.common.types import QueueRef
from raftmq.raftlog.record import Role

ROLE_TO_PB = {
    Role.LEADER: common_pb2.LEADER,
    Role.FOLLOWER: common_pb2.FOLLOWER,
    Role.CANDIDATE: common_pb2.CANDIDATE,
}
DEADLINE_MARGIN_S = 0.2  # answer a long poll this long before the caller's deadline
log = logging.getLogger("broker.service")
MAX_LISTED_PRODUCERS = 10_000  # rows of one ListProducers answer
MAX_STATUS_TOPICS = 1000  # GetBrokerStatus lists at most this many topics


def _deadline(context: grpc.ServicerContext) -> float:
    left = context.time_remaining()
    if left is None:
        return time.monotonic() + 3600.0
    return time.monotonic() + max(0.0, left - DEADLINE_MARGIN_S)


def _remaining_ms(context: grpc.ServicerContext) -> int | None:
    left = context.time_remaining()
    return None if left is None else max(0, int(left * 1000))


def quota_hold(
    node: BrokerNode, flow: Flow, user: str, budget_ms: int, context: grpc.ServicerContext
) -> ThreadHold:
    """Hold this handler thread for `user`'s byte quota (issue 27; the node's one book, the
    framed path's too), ended early when the call ends (cancelled, or the server stops):
    then nothing is served (no send stored that its client saw fail)."""
    quota = node.quota
    if not quota.enabled:
        return ThreadHold(0, 0)
    ended = threading.Event()
    if not context.add_callback(ended.set):
        ended.set()  # over already
    hold = quota.hold(flow, user, budget_ms, ended)
    if ended.is_set():
        raise RequestTimeoutError(
            f"the call ended while held {hold.held_ms} ms for {user!r}'s byte quota: "
            "nothing was served"
        )
    return hold


def produce_hold(node: BrokerNode, user: str, context: grpc.ServicerContext) -> ThreadHold:
    """`quota_hold` for a produce (a send, a transactional half): held at most half its
    deadline (the rest is for storing it), as on the framed path; past the user's share of held
    threads, refused (raised): nothing is stored."""
    left_ms = _remaining_ms(context)
    budget = (node.settings.send_timeout_ms if left_ms is None else left_ms) // 2
    hold = quota_hold(
        node, Flow.PRODUCE, user, min(budget, node.quota.quotas.max_throttle_ms), context
    )
    if hold.refused is not None:
        raise hold.refused
    return hold


def tell_throttle(context: grpc.ServicerContext, throttle_ms: int) -> None:
    """The wait a call was held, or is to honour, for its user's quota: in the trailer as the
    proxy tells it (clients that read no answer field), beside the answer's throttle_ms."""
    if throttle_ms:
        context.set_trailing_metadata(((THROTTLE_KEY, str(throttle_ms)),))


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
    def ConsumerSendBack(
        self, request: broker_pb2.ConsumerSendBackRequest, context: grpc.ServicerContext
    ) -> broker_pb2.ConsumerSendBackResponse:
        back = self.node.send_backs.send_back(
            request.consumer_group,
            request.msg_id,
            request.max_reconsume_times,
            request.delay_level,
            request.reconsume_times,
        )
        return broker_pb2.ConsumerSendBackResponse(
            msg_id=back.outcome.msg_id,
            topic=back.topic,
            dead_letter=back.dead_letter,
            reconsume_times=back.reconsume_times,
            delay_level=back.delay_level,
            delay_ms=back.delay_ms,
        )

    @rpc_errors
    def ResendDeadLetter(
        self, request: broker_pb2.ResendDeadLetterRequest, context: grpc.ServicerContext
    ) -> broker_pb2.ResendDeadLetterResponse:
        topic, outcome = self.node.send_backs.resend_dead_letter(request.msg_id)
        return broker_pb2.ResendDeadLetterResponse(
            msg_id=outcome.msg_id,
            topic=topic,
            queue_id=outcome.queue_id,
            queue_offset=outcome.queue_offset,
        )

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
        node, user = self.node, CALLER.get()
        hold = produce_hold(node, user, context)
        answer = requests.send(node, request)
        node.quota.charge(Flow.PRODUCE, user, request.ByteSize())
        answer.throttle_ms = hold.held_ms
        tell_throttle(context, hold.held_ms)
        node.metrics.on_send(request.topic, len(answer.results), request.ByteSize())
        node.stats.on_send(request.topic, len(answer.results))
        return answer

    @rpc_errors
    def PullMessage(
        self, request: broker_pb2.PullMessageRequest, context: grpc.ServicerContext
    ) -> broker_pb2.PullMessageResponse:
        node, user = self.node, CALLER.get()
        deadline = _deadline(context)
        # Held at most its long poll: the client waits that long for an answer anyway.
        budget = min(
            max(request.max_wait_ms, 0),
            node.settings.long_poll_max_ms,
            int((deadline - time.monotonic()) * 1000),
        )
        hold = quota_hold(node, Flow.CONSUME, user, budget, context)
        if hold.owed_ms:  # held its whole wait, or not at all: nothing read, pull again here
            told = hold.held_ms or hold.owed_ms
            tell_throttle(context, told)
            return requests.held_pull_answer(node, request, told)
        steps = requests.pull_steps(node, request, deadline)
        result = node.pulls.run_blocking(steps)
        answer = requests.pull_answer(node, result)
        size = answer.ByteSize()
        node.quota.charge(Flow.CONSUME, user, size)
        answer.throttle_ms = hold.held_ms
        tell_throttle(context, hold.held_ms)
        node.metrics.on_pull(request.consumer_group, request.topic, result.count, size)
        node.stats.on_pull(request.consumer_group, request.topic, result.count)
        return answer

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
        self._index_catch_up()
        return requests.queue_bounds(self.node, request)

    @rpc_errors
    def SearchOffsetByTimestamp(
        self, request: broker_pb2.SearchOffsetByTimestampRequest, context: grpc.ServicerContext
    ) -> broker_pb2.SearchOffsetByTimestampResponse:
        self._index_catch_up()
        return requests.search_offset(self.node, request)

    def _index_catch_up(self) -> None:
        """Reads by offset, time or key see every acknowledged send: a send is answered at its
        commit, before this node indexes it (issue 29), so they wait (bounded) for the index."""
        index = requests.index_catch_up(self.node)
        if index is not None:  # bounded; a node still behind then answers what it has
            self.node.wait_dispatched(index, INDEX_CATCHUP_MS / 1000)

    @rpc_errors
    def ResetOffsetsToTimestamp(
        self, request: broker_pb2.ResetOffsetsToTimestampRequest, context: grpc.ServicerContext
    ) -> broker_pb2.ResetOffsetsToTimestampResponse:
        self._index_catch_up()
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
    def ResetOffsets(
        self, request: broker_pb2.ResetOffsetsRequest, context: grpc.ServicerContext
    ) -> broker_pb2.ResetOffsetsResponse:
        wanted: dict[int, int] = {}
        for o in request.offsets:
            if o.topic and o.topic != request.topic:
                raise InvalidArgumentError(
                    f"offset of topic {o.topic!r} in a reset of topic {request.topic!r}"
                )
            wanted[o.queue_id] = o.offset
        done = self.node.offsets.reset_offsets(request.consumer_group, request.topic, wanted)
        return broker_pb2.ResetOffsetsResponse(
            offsets=[
                broker_pb2.QueueOffset(topic=request.topic, queue_id=q, offset=o)
                for q, o in sorted(done.items())
            ]
        )

    @rpc_errors
    def ListConsumerGroups(
        self, request: broker_pb2.ListConsumerGroupsRequest, context: grpc.ServicerContext
    ) -> broker_pb2.ListConsumerGroupsResponse:
        return consumer_groups(self.node)

    @rpc_errors
    def QueryStats(
        self, request: broker_pb2.QueryStatsRequest, context: grpc.ServicerContext
    ) -> broker_pb2.QueryStatsResponse:
        return query_stats(self.node, request)

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
        self._index_catch_up()
        found = self.node.queries.messages_by_key(
            request.topic,
            request.key,
            request.max_count or 32,
            request.begin_timestamp_ms,
            request.end_timestamp_ms,
        )
        return broker_pb2.QueryMessagesByKeyResponse(messages=[stored_to_pb(m) for m in found])

    @rpc_errors
    def QueryMessagesByTime(
        self, request: broker_pb2.QueryMessagesByTimeRequest, context: grpc.ServicerContext
    ) -> broker_pb2.QueryMessagesByTimeResponse:
        self._index_catch_up()
        page = self.node.time_queries.messages_by_time(
            request.topic,
            request.begin_timestamp_ms,
            request.end_timestamp_ms,
            request.max_count or 32,
            Cursor(request.queue_id, request.queue_offset),
        )
        nxt = page.next
        return broker_pb2.QueryMessagesByTimeResponse(
            messages=[stored_to_pb(m) for m in page.messages],
            more=nxt is not None,
            next_queue_id=nxt.queue_id if nxt is not None else 0,
            next_queue_offset=nxt.offset if nxt is not None else -1,
        )

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
        return broker_status(self.node, include_lags=request.include_lags)

    @rpc_errors
    def UpdateBrokerConfig(
        self, request: broker_pb2.UpdateBrokerConfigRequest, context: grpc.ServicerContext
    ) -> broker_pb2.UpdateBrokerConfigResponse:
        before = self.node.settings
        p = live_settings.plan(before, dict(request.settings))
        if not request.dry_run and not p.refused:
            self.node.settings = p.settings  # readers of live keys read it at each use
            live_settings.take_effect(before, p.settings)
            log.warning(
                "broker.config_changed node=%s %s: until the node restarts",
                self.node.me.node_id,
                " ".join(f"{k}={v}" for k, v in sorted(p.applied.items())),
            )
        return broker_pb2.UpdateBrokerConfigResponse(applied=p.applied, refused=p.refused)

    @rpc_errors
    def ListProducers(
        self, request: broker_pb2.ListProducersRequest, context: grpc.ServicerContext
    ) -> broker_pb2.ListProducersResponse:
        self.node.require_readable(allow_follower_read=False)
        rows, more = self.node.store.producer_rows(MAX_LISTED_PRODUCERS, request.topic)
        return broker_pb2.ListProducersResponse(
            producers=[
                broker_pb2.ProducerQueue(
                    producer_id=pid,
                    topic=topic,
                    queue_id=queue_id,
                    last_sequence=st.last_sequence,
                    last_store_timestamp_ms=st.last_store_timestamp_ms,
                )
                for pid, topic, queue_id, st in rows
            ],
            truncated=more,
        )

    @rpc_errors
    def DeleteConsumerGroup(
        self, request: broker_pb2.DeleteConsumerGroupRequest, context: grpc.ServicerContext
    ) -> broker_pb2.DeleteConsumerGroupResponse:
        return delete_group(self.node, request.consumer_group, force=request.force)

    @rpc_errors
    def UpdateConsumerGroupConfig(
        self, request: broker_pb2.UpdateConsumerGroupConfigRequest, context: grpc.ServicerContext
    ) -> broker_pb2.ConsumerGroupConfig:
        return update_group_config(self.node, request)

    @rpc_errors
    def PurgeTopic(
        self, request: broker_pb2.PurgeTopicRequest, context: grpc.ServicerContext
    ) -> broker_pb2.PurgeTopicResponse:
        return purge_topic(self.node, request)

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


MAX_STATS_ROWS = 100_000  # rows of one QueryStats answer (a week of one topic is 10 080)


def query_stats(
    node: BrokerNode, request: broker_pb2.QueryStatsRequest
) -> broker_pb2.QueryStatsResponse:
    if request.since_ms < 0 or request.until_ms < request.since_ms:
        raise InvalidArgumentError(
            f"since_ms {request.since_ms} and until_ms {request.until_ms}: need "
            "0 <= since_ms <= until_ms"
        )
    limit = min(request.limit or MAX_STATS_ROWS, MAX_STATS_ROWS)
    rows = node.stats.query(
        topic=request.topic,
        group=request.consumer_group,
        since_ms=request.since_ms,
        until_ms=request.until_ms,
        limit=limit + 1,
    )
    return broker_pb2.QueryStatsResponse(
        rows=[
            broker_pb2.StatsRow(
                minute_ms=r.minute_ms, topic=r.topic, consumer_group=r.group, count=r.count
            )
            for r in rows[:limit]
        ],
        truncated=len(rows) > limit,
        retention_ms=node.stats.retention_ms if node.stats.enabled else 0,
    )


MAX_LISTED_OFFSETS = 100_000  # committed offsets read to list the groups that have some
MAX_GROUP_CONFIGS = 100_000  # consumer groups with a config on one broker group


def purge_topic(
    node: BrokerNode, request: broker_pb2.PurgeTopicRequest
) -> broker_pb2.PurgeTopicResponse:
    """Every queue of the topic here: its min offset moves up to the offset asked for (or the
    first stored at or after the time), one PurgeQueues record for all the queues that move."""
    topic = request.topic
    node.require_leader()
    cfg = node.topic_admin.readable_topic(topic, -1)
    which = request.WhichOneof("before")
    if which is None:
        raise InvalidArgumentError("purge needs an offset or a time (--before-offset, --before)")
    value = request.offset if which == "offset" else request.timestamp_ms
    if value < 0:
        raise InvalidArgumentError(f"purge before {which} {value}: it must be >= 0")
    rows = []
    moves: dict[int, int] = {}
    for q in range(cfg.read_queue_nums):
        low, high = node.store.queue_bounds(topic, q)
        target = value if which == "offset" else node.store.offset_for_timestamp(topic, q, value)
        new = min(max(low, target), high)
        rows.append(
            broker_pb2.QueuePurge(
                queue_id=q, old_min_offset=low, new_min_offset=new, max_offset=high
            )
        )
        if new > low:
            moves[q] = new
    if moves and not request.dry_run:
        node.replicate_record(PurgeQueues(topic, moves), f"purging topic {topic!r}")
        log.warning(
            "broker.topic_purged node=%s topic=%s queues=%d messages=%d",
            node.me.node_id,
            topic,
            len(moves),
            sum(r.new_min_offset - r.old_min_offset for r in rows),
        )
    return broker_pb2.PurgeTopicResponse(queues=rows)


def delete_group(
    node: BrokerNode, group: str, *, force: bool
) -> broker_pb2.DeleteConsumerGroupResponse:
    """The group's offsets, leases and POP state go on every replica (a GroupDelete record),
    refused while members heartbeat here unless forced: they would commit again at once."""
    validate_group(group)
    node.require_leader()
    with node.consumers_lock:
        members = sorted(node.consumers.snapshot(requests.monotonic_ms()).get(group, {}))
    if members and not force:
        raise InvalidArgumentError(
            f"consumer group {group!r} has {len(members)} members online on {node.group} "
            f"({', '.join(members[:3])}{', ...' if len(members) > 3 else ''}): stop them first, "
            "or delete with --force (they commit again and bring the group back)",
            details={"members_online": str(len(members))},
        )
    n = node.store.group_offset_count(group)
    configured = not node.store.group_config(group).is_default  # the config goes with it
    if n or configured:
        node.replicate_record(GroupDelete(group), f"deleting group {group!r}")
    return broker_pb2.DeleteConsumerGroupResponse(
        deleted_offsets=n, members_online=members, deleted_config=configured
    )


def update_group_config(
    node: BrokerNode, request: broker_pb2.UpdateConsumerGroupConfigRequest
) -> broker_pb2.ConsumerGroupConfig:
    """The fields the request sets over the config in force here, checked, then replicated as
    one GroupConfigChange (nothing is written when nothing changes)."""
    group = request.consumer_group
    validate_group(group)
    node.require_leader()
    old = node.store.group_config(group)
    new = dataclasses.replace(
        old,
        **{
            f: getattr(request, f)
            for f in ("retry_max_times", "consume_enable", "broadcast_enable")
            if request.HasField(f)
        },
    )
    validate_group_config(new)
    if (
        old.is_default
        and not new.is_default
        and node.store.group_config_count() >= MAX_GROUP_CONFIGS
    ):
        # Every config is a row on every replica and in each one's memory: bounded, per table.
        raise InvalidArgumentError(
            f"{node.group} holds the configs of {MAX_GROUP_CONFIGS} consumer groups already: "
            "delete the groups no longer used (`raftmq group delete G`) first"
        )
    if new != old:
        node.replicate_record(GroupConfigChange(new), f"configuring group {group!r}")
        log.warning(
            "broker.group_configured node=%s group=%s config=%s",
            node.me.node_id,
            group,
            new.describe(),
        )
    return group_config_pb(node.store.group_config(group))


def group_config_pb(cfg: GroupConfig) -> broker_pb2.ConsumerGroupConfig:
    return broker_pb2.ConsumerGroupConfig(
        consumer_group=cfg.group,
        retry_max_times=cfg.retry_max_times,
        consume_enable=cfg.consume_enable,
        broadcast_enable=cfg.broadcast_enable,
    )


def consumer_groups(node: BrokerNode) -> broker_pb2.ListConsumerGroupsResponse:
    """Groups with members heartbeating here (soft state), committed offsets or a config
    (replicated)."""
    with node.consumers_lock:
        live = node.consumers.snapshot(requests.monotonic_ms())
    committed: dict[str, set[str]] = {}
    for group, topic, _queue, _offset in node.store.all_committed_offsets(MAX_LISTED_OFFSETS):
        committed.setdefault(group, set()).add(topic)
    configs = {c.group: c for c in node.store.group_configs()}
    return broker_pb2.ListConsumerGroupsResponse(
        groups=[
            broker_pb2.ConsumerGroupInfo(
                consumer_group=g,
                members=[
                    broker_pb2.ConsumerMember(client_id=c, topics=list(topics))
                    for c, topics in sorted(live.get(g, {}).items())
                ],
                committed_topics=sorted(committed.get(g, ())),
                config=group_config_pb(configs[g]) if g in configs else None,
            )
            for g in sorted(set(live) | set(committed) | set(configs))
        ]
    )


def _lock_answer(
    granted: Iterable[QueueRef], refused: Iterable[QueueRef], lease_ms: int
) -> broker_pb2.LockQueuesResponse:
    return broker_pb2.LockQueuesResponse(
        granted=sorted(q.queue_id for q in granted),
        refused=sorted(q.queue_id for q in refused),
        lease_ms=lease_ms,
    )


def group_lags(node: BrokerNode) -> list[broker_pb2.GroupLag]:
    """Each (group, topic)'s lag summed over its queues, from the replicated committed offsets
    (the leader's are current); at most MAX_LISTED_OFFSETS offsets read."""
    bounds: dict[tuple[str, int], int] = {}
    lags: dict[tuple[str, str], int] = {}
    for group, topic, queue_id, offset in node.store.all_committed_offsets(MAX_LISTED_OFFSETS):
        high = bounds.get((topic, queue_id))
        if high is None:
            high = bounds[(topic, queue_id)] = node.store.queue_bounds(topic, queue_id)[1]
        lags[(group, topic)] = lags.get((group, topic), 0) + max(0, high - offset)
    return [
        broker_pb2.GroupLag(consumer_group=g, topic=t, lag=n) for (g, t), n in sorted(lags.items())
    ]


def disk_used_ratio(node: BrokerNode) -> float:
    try:
        usage = shutil.disk_usage(node.settings.data_dir)
    except OSError:
        return 0.0
    return usage.used / usage.total if usage.total else 0.0


def broker_status(node: BrokerNode, *, include_lags: bool = False) -> broker_pb2.BrokerStatus:
    st = node.status()
    storage = node.health.error
    leader = node.leader()
    ret = node.retention
    nxt = ret.next_cut if ret is not None and st.role is Role.LEADER else None
    at_risk = ret.at_risk if ret is not None and nxt is not None else ()
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
        config=redacted(node.settings),
        first_index=st.first_index,
        retention_cut_index=node.store.cut_index,
        disk_pressure=node.disk_pressure or "",
        journal_bytes=ret.journal_bytes() if ret is not None else 0,
        next_cut_index=nxt.cut_index if nxt is not None else 0,
        next_cut_due_ms=nxt.due_ms if nxt is not None else 0,
        next_cut_losses=[
            broker_pb2.GroupLag(consumer_group=x.group, topic=x.topic, lag=x.messages)
            for x in at_risk
        ],
        disk_used_ratio=disk_used_ratio(node),
        group_lags=group_lags(node) if include_lags and st.role is Role.LEADER else [],
    )
