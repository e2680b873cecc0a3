"""Admin: topics, routes, cluster and broker status, group lag, offset resets by time, message
queries. Every call goes to the right broker group's leader (found through the NameServers)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc

from raftmq.client.messages import ReceivedMessage
from raftmq.client.offsets import BrokerOffsets
from raftmq.client.routes import ChannelPool, RouteCache, TopicRoute
from raftmq.client.trace import MessageTrace, records_of_message
from raftmq.common.arguments import checked
from raftmq.common.errors import (
    BrokerUnavailableError,
    InvalidArgumentError,
    InvalidTopicConfigError,
    MessageNotFoundError,
    NoRouteError,
    NotLeaderError,
    RaftMQError,
    TopicNotFoundError,
    TraceNotFoundError,
    from_rpc_error,
)
from raftmq.common.message import decode_msg_id, validate_group, validate_topic
from raftmq.common.pb import broker_pb2, broker_pb2_grpc, common_pb2, namesrv_pb2
from raftmq.common.topic_config import MAX_QUEUES_PER_TOPIC
from raftmq.common.trace import (
    TRACE_TOPIC,
    MalformedTraceError,
    MoveTrace,
    TraceRecord,
    path_of,
)
from raftmq.common.types import QueueRef, check_offset

log = logging.getLogger("raftmq.admin")

T = TypeVar("T")
RPC_TIMEOUT_S = 10.0


def check_queue_count(topic: str, queues: object) -> int:
    """A topic's queue count per broker group: 1..MAX_QUEUES_PER_TOPIC (0 on the wire would mean
    the broker's default, which is never what a caller who wrote 0 meant)."""
    if not isinstance(queues, int) or isinstance(queues, bool):
        raise InvalidTopicConfigError(
            f"queues must be an int, not {type(queues).__name__}", details={"argument": "queues"}
        )
    if not 1 <= queues <= MAX_QUEUES_PER_TOPIC:
        raise InvalidTopicConfigError(
            f"topic {topic!r}: {queues} queues per broker group; give 1..{MAX_QUEUES_PER_TOPIC} "
            "(RocketMQ's usual is 8)",
            details={"argument": "queues", "topic": topic},
        )
    return queues


@dataclass(frozen=True, slots=True)
class QueueLag:
    queue: QueueRef
    committed: int | None  # None: the group never committed on this queue
    min_offset: int
    max_offset: int

    @property
    def lag(self) -> int:
        """Messages stored and not yet consumed by the group; a queue it never committed on
        counts from the first message still stored."""
        start = self.min_offset if self.committed is None else self.committed
        return max(0, self.max_offset - max(start, self.min_offset))


@dataclass(frozen=True, slots=True)
class GroupInfo:
    cluster: str
    broker_group: str
    leader_node_id: str
    leader_address: str
    term: int
    nodes: tuple[namesrv_pb2.BrokerNode, ...]


class Admin:
    """A context manager; thread-safe."""

    @checked
    def __init__(self, namesrv_addresses: str | Sequence[str]) -> None:
        self._pool = ChannelPool()
        self.routes = RouteCache(namesrv_addresses, self._pool)

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- cluster ------------------------------------------------------------------------------

    def groups(self) -> list[GroupInfo]:
        info = self.routes.cluster_info()
        return sorted(
            (
                GroupInfo(
                    c.name,
                    g.broker_group,
                    g.leader_node_id,
                    g.leader_address,
                    g.term,
                    tuple(g.nodes),
                )
                for c in info.clusters
                for g in c.groups
            ),
            key=lambda g: g.broker_group,
        )

    def broker_status(self, address: str) -> broker_pb2.BrokerStatus:
        return self._rpc(
            lambda: self._stub(address).GetBrokerStatus(
                broker_pb2.GetBrokerStatusRequest(), timeout=RPC_TIMEOUT_S
            )
        )

    def _stub(self, address: str) -> broker_pb2_grpc.BrokerStub:
        return self._pool.broker(address)

    @staticmethod
    def _rpc(fn: Callable[[], T]) -> T:
        try:
            return fn()
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None

    def _on_leader(self, group: GroupInfo, fn: Callable[[broker_pb2_grpc.BrokerStub], T]) -> T:
        """`fn` on the group's leader, following one NOT_LEADER hint."""
        address = group.leader_address
        if not address:
            raise NotLeaderError.for_node("-", group.broker_group, "")
        try:
            return self._rpc(lambda: fn(self._stub(address)))
        except NotLeaderError as exc:
            if not exc.leader_hint:
                raise
            hint = exc.leader_hint
        return self._rpc(lambda: fn(self._stub(hint)))

    def _select(self, broker_groups: Sequence[str] | None) -> list[GroupInfo]:
        groups = self.groups()
        if broker_groups:
            known = {g.broker_group for g in groups}
            missing = sorted(set(broker_groups) - known)
            if missing:
                raise InvalidArgumentError(
                    f"unknown broker group(s) {', '.join(missing)}; "
                    f"known: {', '.join(sorted(known))}"
                )
            groups = [g for g in groups if g.broker_group in broker_groups]
        if not groups:
            raise BrokerUnavailableError(
                "no broker group is registered with the NameServers yet; start the brokers "
                "or check their namesrv_addresses"
            )
        return groups

    @checked
    def elect(self, broker_group: str, node_id: str, timeout_ms: int = 5_000) -> str:
        """Hand the group's leadership to `node_id` (Raft leadership transfer on its leader);
        the leader's node id afterwards."""
        g = self._select([broker_group])[0]
        resp = self._on_leader(
            g,
            lambda s: s.LeadershipTransfer(
                broker_pb2.LeadershipTransferRequest(target_node_id=node_id, timeout_ms=timeout_ms),
                timeout=timeout_ms / 1000 + 5,
            ),
        )
        return resp.leader_node_id

    # ---- topics -------------------------------------------------------------------------------

    @checked
    def create_topic(
        self,
        topic: str,
        *,
        queues: int = 8,
        ordered: bool = False,
        perm: common_pb2.Permission = common_pb2.PERM_READ_WRITE,
        broker_groups: Sequence[str] | None = None,
    ) -> list[str]:
        """Create the topic on every (or the named) broker group; the groups it is on."""
        validate_topic(topic)
        check_queue_count(topic, queues)
        cfg = common_pb2.TopicConfig(
            topic=topic, read_queue_nums=queues, write_queue_nums=queues, perm=perm, ordered=ordered
        )
        done = []
        for g in self._select(broker_groups):
            self._on_leader(
                g,
                lambda s: s.CreateTopic(
                    broker_pb2.CreateTopicRequest(config=cfg), timeout=RPC_TIMEOUT_S
                ),
            )
            done.append(g.broker_group)
        self.routes.invalidate(topic)
        return done

    @checked
    def update_topic(
        self,
        topic: str,
        *,
        queues: int | None = None,
        ordered: bool | None = None,
        perm: common_pb2.Permission | None = None,
        broker_groups: Sequence[str] | None = None,
    ) -> list[str]:
        """Change the topic on every group that has it (or the named ones); what is not given
        keeps its current value. The groups it was changed on."""
        validate_topic(topic)
        if queues is not None:
            check_queue_count(topic, queues)
        current = dict(self.list_topics().get(topic, []))
        groups = self._select(broker_groups)
        if broker_groups is None:
            groups = [g for g in groups if g.broker_group in current]
        if not groups or any(g.broker_group not in current for g in groups):
            raise TopicNotFoundError.for_topic(topic, auto_create=True)
        done = []
        for g in groups:
            now = current[g.broker_group]
            cfg = common_pb2.TopicConfig(
                topic=topic,
                read_queue_nums=now.read_queue_nums if queues is None else queues,
                write_queue_nums=now.write_queue_nums if queues is None else queues,
                perm=now.perm if perm is None else perm,
                ordered=now.ordered if ordered is None else ordered,
            )
            self._on_leader(
                g,
                lambda s, cfg=cfg: s.UpdateTopic(  # type: ignore[misc]
                    broker_pb2.UpdateTopicRequest(config=cfg), timeout=RPC_TIMEOUT_S
                ),
            )
            done.append(g.broker_group)
        self.routes.invalidate(topic)
        return done

    @checked
    def delete_topic(self, topic: str) -> list[str]:
        """Delete the topic from every group that has it; the groups it was deleted from."""
        done = []
        for g in self._select(None):
            try:
                self._on_leader(
                    g,
                    lambda s: s.DeleteTopic(
                        broker_pb2.DeleteTopicRequest(topic=topic), timeout=RPC_TIMEOUT_S
                    ),
                )
                done.append(g.broker_group)
            except TopicNotFoundError:
                continue
        if not done:
            raise TopicNotFoundError.for_topic(topic, auto_create=True)
        self.routes.invalidate(topic)
        return done

    def list_topics(self) -> dict[str, list[tuple[str, common_pb2.TopicConfig]]]:
        """topic -> [(broker group, config)] as each group's leader reports it."""
        out: dict[str, list[tuple[str, common_pb2.TopicConfig]]] = {}
        for g in self._select(None):
            resp = self._on_leader(
                g, lambda s: s.ListTopics(broker_pb2.ListTopicsRequest(), timeout=RPC_TIMEOUT_S)
            )
            for cfg in resp.topics:
                out.setdefault(cfg.topic, []).append((g.broker_group, cfg))
        return dict(sorted(out.items()))

    @checked
    def route(self, topic: str) -> TopicRoute:
        return self.routes.route(topic, refresh=True)

    # ---- groups and offsets -------------------------------------------------------------------

    @checked
    def group_lag(self, group: str, topic: str) -> list[QueueLag]:
        validate_group(group)
        offsets = BrokerOffsets(group, self.routes, self._pool)
        out = []
        for q in self.route(topic).read_queues():
            committed = offsets.committed(q)
            low, high = offsets.bounds(q)
            out.append(QueueLag(q, committed, low, high))
        return out

    def group_exists(self, group: str, topic: str) -> bool:
        """Whether the consumer group has used the topic: an offset committed on any of its
        queues, or a consumer of the group online (the brokers keep no list of groups)."""
        validate_group(group)
        offsets = BrokerOffsets(group, self.routes, self._pool)
        route = self.route(topic)
        if any(offsets.committed(q) is not None for q in route.read_queues()):
            return True
        req = broker_pb2.GetConsumerListRequest(consumer_group=group)
        for _name, g in self._topic_groups(topic):
            resp = self._on_leader(g, lambda s: s.GetConsumerList(req, timeout=RPC_TIMEOUT_S))
            if resp.client_ids:
                return True
        return False

    @checked
    def reset_offsets_to_time(
        self, group: str, topic: str, timestamp_ms: int
    ) -> dict[QueueRef, int]:
        """RocketMQ's message backtracking on every group that has the topic. Consumers of the
        group pick the new offsets up when their queues are next assigned or restarted. A group
        that does not exist yet is created with these offsets (check group_exists first)."""
        validate_group(group)
        check_offset(timestamp_ms, "timestamp_ms")
        out: dict[QueueRef, int] = {}
        for name, g in self._topic_groups(topic):
            resp = self._on_leader(
                g,
                lambda s: s.ResetOffsetsToTimestamp(
                    broker_pb2.ResetOffsetsToTimestampRequest(
                        consumer_group=group, topic=topic, timestamp_ms=timestamp_ms
                    ),
                    timeout=RPC_TIMEOUT_S,
                ),
            )
            for o in resp.offsets:
                out[QueueRef(topic, name, o.queue_id)] = o.offset
        return out

    def _topic_groups(self, topic: str) -> list[tuple[str, GroupInfo]]:
        """The registered groups that the topic's route names, by name."""
        route = self.route(topic)
        by_name = {g.broker_group: g for g in self._select(None)}
        return [(n, by_name[n]) for n in sorted(route.groups) if n in by_name]

    # ---- messages -----------------------------------------------------------------------------

    @checked
    def message_by_id(self, msg_id: str) -> ReceivedMessage:
        """The id names its broker group (broker/message.py encode_msg_id): one call, to it."""
        group_name = decode_msg_id(msg_id).broker_group
        for g in self._select(None):
            if g.broker_group != group_name:
                continue
            resp = self._on_leader(
                g,
                lambda s: s.QueryMessageById(
                    broker_pb2.QueryMessageByIdRequest(msg_id=msg_id), timeout=RPC_TIMEOUT_S
                ),
            )
            return ReceivedMessage.from_pb(resp.message)
        raise MessageNotFoundError.for_id(msg_id)

    @checked
    def message_trace(self, msg_id: str, *, max_lookups: int = 16) -> MessageTrace:
        """The trace of a message sent or consumed with trace=True: every record naming it or its
        retry and dead-letter copies, found through the key index of the trace topic (each
        trace batch carries the ids it traces as keys: one key lookup per id on the path, at
        most `max_lookups`), plus the stored copies (for the broker's store time).
        TraceNotFoundError when no record names the message."""
        decode_msg_id(msg_id)  # InvalidMessageIdError for something that is not an id
        try:
            self.route(TRACE_TOPIC)
        except NoRouteError:
            raise TraceNotFoundError.for_id(msg_id) from None  # nothing was ever traced
        found: dict[TraceRecord, None] = {}
        looked: set[str] = set()
        todo = [msg_id]
        while todo and len(looked) < max_lookups:
            key = todo.pop(0)
            looked.add(key)
            for m in self.messages_by_key(TRACE_TOPIC, key, max_count=64):
                try:
                    found.update(dict.fromkeys(records_of_message(m)))
                except MalformedTraceError as exc:  # another writer's bytes: skip, say so
                    log.warning("admin.trace_record_skipped msg_id=%s error=%s", m.msg_id, exc)
            path = path_of(msg_id, found)
            ids = {r.msg_id for r in path} | {
                r.new_msg_id for r in path if isinstance(r, MoveTrace) and r.new_msg_id
            }
            todo.extend(sorted(i for i in ids - looked if i and i not in todo))
        path = path_of(msg_id, found)
        if not path:
            raise TraceNotFoundError.for_id(msg_id)
        stored: list[ReceivedMessage] = []
        copies = [r.new_msg_id for r in path if isinstance(r, MoveTrace)]
        for i in dict.fromkeys(i for i in [*(r.msg_id for r in path), *copies] if i):
            try:
                stored.append(self.message_by_id(i))
            except RaftMQError as exc:  # deleted by retention, or its group is away
                log.info("admin.trace_store_unknown msg_id=%s error=%s", i, exc.message)
        return MessageTrace(msg_id, tuple(path), tuple(stored))

    @checked
    def messages_by_key(self, topic: str, key: str, max_count: int = 64) -> list[ReceivedMessage]:
        out: list[ReceivedMessage] = []
        for _name, g in self._topic_groups(topic):
            resp = self._on_leader(
                g,
                lambda s: s.QueryMessagesByKey(
                    broker_pb2.QueryMessagesByKeyRequest(topic=topic, key=key, max_count=max_count),
                    timeout=RPC_TIMEOUT_S,
                ),
            )
            out.extend(ReceivedMessage.from_pb(m) for m in resp.messages)
        return out
