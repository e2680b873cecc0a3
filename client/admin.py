"""Admin: topics, routes, cluster and broker status, consumer groups and their members, group
lag, offset resets (planned, then executed), message queries. Every call goes to the right
broker group's leader (found through the NameServers)."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc

from raftmq.client.acl_admin import AclAdmin
from raftmq.client.consumer_pull import PullConsumer
from raftmq.client.messages import ReceivedMessage, SendResult
from raftmq.client.offset_reset import QueueReset, ResetTarget, ResetTo, target_offset
from raftmq.client.offsets import BrokerOffsets, StartFrom
from raftmq.client.producer import Producer
from raftmq.client.queue_shrink import refusal, stranded
from raftmq.client.routes import ChannelPool, RouteCache, TopicRoute
from raftmq.client.stats_report import StatsReport, merge, report_range
from raftmq.client.trace import MessageTrace, records_of_message, trace_message
from raftmq.common import tls
from raftmq.common.arguments import checked
from raftmq.common.auth import Credentials
from raftmq.common.errors import (
    BrokerUnavailableError,
    InvalidArgumentError,
    InvalidTopicConfigError,
    MessageNotFoundError,
    NoRouteError,
    NotLeaderError,
    PermissionDeniedError,
    RaftMQError,
    TopicNotFoundError,
    TraceNotFoundError,
    UnauthenticatedError,
    from_rpc_error,
)
from raftmq.common.group_config import GroupConfig, validate_group_config
from raftmq.common.message import (
    DLQ_TOPIC_PREFIX,
    decode_msg_id,
    dlq_topic,
    validate_group,
    validate_topic,
)
from raftmq.common.pb import broker_pb2, broker_pb2_grpc, common_pb2, namesrv_pb2
from raftmq.common.retry import PROPERTY_DLQ_ORIGIN_MESSAGE_ID
from raftmq.common.topic_config import MAX_QUEUES_PER_TOPIC
from raftmq.common.trace import (
    TRACE_TOPIC,
    MalformedTraceError,
    MoveKind,
    MoveTrace,
    TraceRecord,
    path_of,
)
from raftmq.common.types import QueueRef, check_offset, parse_address_list

log = logging.getLogger("raftmq.admin")

T = TypeVar("T")
RPC_TIMEOUT_S = 10.0
# How long a call waits for the NameServers to know a group's leader (an election takes a
# fraction of a second, brokers report every second; a loaded machine is slower), and how
# often it asks them meanwhile.
LEADER_WAIT_S = 10.0
LEADER_POLL_S = 0.2
MAX_RANGE_MESSAGES = 10_000  # per messages_in_queue call
READER_GROUP = "raftmq-admin-reader"  # the group an admin read pulls as (it commits nothing)


@dataclass(frozen=True, slots=True)
class DeadLetterResend:
    msg_id: str  # the dead letter
    outcome: str  # "resent", "skipped" (resent before), "would resend" (a dry run)
    new_msg_id: str  # the copy sent now (resent) or before (skipped); "" for a dry run


@dataclass(frozen=True, slots=True)
class QueueRange:
    queue: QueueRef
    min_offset: int  # the queue's bounds when read: below min, deleted by retention
    max_offset: int
    messages: list[ReceivedMessage]


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
class MessagePage:
    """One page of a query by time range; next_page_token "" = the last page."""

    messages: list[ReceivedMessage]
    next_page_token: str


def _parse_page_token(token: str, groups: Sequence[str]) -> tuple[int, int, int]:
    """(index of the broker group, queue id, offset) a page token names; "" = the start."""
    if not token:
        return 0, 0, -1
    parts = token.split("/")
    try:
        group, queue_id, offset = parts[0], int(parts[1]), int(parts[2])
    except (IndexError, ValueError):
        raise InvalidArgumentError(
            f"page token {token!r} is not one this query returned; start without one"
        ) from None
    if len(parts) != 3 or group not in groups or queue_id < 0 or offset < -1:
        raise InvalidArgumentError(
            f"page token {token!r} does not fit this topic's broker groups ({', '.join(groups)}); "
            "start without one"
        )
    return list(groups).index(group), queue_id, offset


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


@dataclass(frozen=True, slots=True)
class ConsumerMemberInfo:
    client_id: str  # the SDK's "host@pid@..." id: where the member connects from
    topics: tuple[str, ...]
    broker_groups: tuple[str, ...]  # the broker groups it heartbeats to (its connections)


@dataclass(frozen=True, slots=True)
class ConsumerGroupInfo:
    group: str
    members: tuple[ConsumerMemberInfo, ...]  # online now, sorted by client id
    topics: tuple[str, ...]  # subscribed by a member or with committed offsets
    # (broker group, its config) where `raftmq group config` set one, sorted; the others use
    # RocketMQ's defaults (GroupConfig(group)).
    configs: tuple[tuple[str, GroupConfig], ...] = ()
    configs_everywhere: bool = True  # every broker group answered with a config (or none did)

    def config_text(self) -> str:
        """One line: the config, or each broker group's when they differ."""
        if not self.configs:
            return "default"
        distinct = {cfg for _, cfg in self.configs}
        if len(distinct) == 1:
            only = next(iter(distinct))
            return only.describe() + ("" if self.configs_everywhere else " (some broker groups)")
        return "; ".join(f"{g}: {cfg.describe()}" for g, cfg in self.configs)


@dataclass(frozen=True, slots=True)
class GroupDeleted:
    """What `delete_group` removed on one broker group."""

    offsets: int  # committed offsets it had
    config: bool  # it had a config (`update_group_config`)


def group_config_from_pb(pb: broker_pb2.ConsumerGroupConfig) -> GroupConfig:
    return GroupConfig(
        pb.consumer_group, pb.retry_max_times, pb.consume_enable, pb.broadcast_enable
    )


@dataclass(frozen=True, slots=True)
class QueueStatus:
    queue: QueueRef
    min_offset: int
    max_offset: int  # the next message's offset
    last_store_timestamp_ms: int  # 0: empty


@dataclass(frozen=True, slots=True)
class NodeStatus:
    broker_group: str
    node_id: str
    address: str
    status: broker_pb2.BrokerStatus | None  # None: the node did not answer (see error)
    error: str = ""


@dataclass(frozen=True, slots=True)
class QueuePurge:
    queue: QueueRef
    old_min_offset: int
    new_min_offset: int  # equal to old: nothing before the point was still stored
    max_offset: int


@dataclass(frozen=True, slots=True)
class ProducerQueue:
    broker_group: str
    producer_id: str
    topic: str
    queue_id: int
    last_sequence: int
    last_store_timestamp_ms: int


@dataclass(frozen=True, slots=True)
class NodeConfigChange:
    broker_group: str
    node_id: str
    applied: dict[str, str]  # key -> value in force now (empty when anything was refused)
    refused: dict[str, str]  # key -> why
    error: str = ""  # the node did not answer


class Admin:
    """A context manager; thread-safe."""

    @checked
    def __init__(
        self,
        namesrv_addresses: str | Sequence[str],
        *,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        credentials: Credentials | None = None,
        controllers: str | Sequence[str] = "",
    ) -> None:
        self._pool = ChannelPool(
            tls_config=tls.client_tls(tls_ca, tls_cert, tls_key), credentials=credentials
        )
        # a resend's trace record is sent by a Producer connected the same way
        self._tls_files = (tls_ca, tls_cert, tls_key)
        self._credentials = credentials
        # the users and policies (issue 19) are the controllers' (acl_* methods)
        self.controllers = parse_address_list(controllers, "controllers") if controllers else ()
        self.acl = AclAdmin(self._pool, self.controllers)
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

    def broker_statuses(self, broker_groups: Sequence[str] | None = None) -> list[NodeStatus]:
        """Every node of every (or the named) broker group, each asked directly (status, term,
        indexes, storage and its settings in `config`); a node that does not answer is listed
        with its error. A denial is the caller's (its credentials or rights), not a node's: it is
        raised, never listed as if the node were down."""
        out = []
        for g in self._select(broker_groups):
            for n in g.nodes:
                try:
                    st = self.broker_status(n.address)
                except (PermissionDeniedError, UnauthenticatedError):
                    raise
                except RaftMQError as exc:
                    out.append(NodeStatus(g.broker_group, n.node_id, n.address, None, exc.message))
                    continue
                out.append(NodeStatus(g.broker_group, n.node_id, n.address, st))
        return out

    @checked
    def update_broker_config(
        self,
        settings: dict[str, str],
        broker_groups: Sequence[str] | None = None,
        *,
        dry_run: bool = False,
    ) -> list[NodeConfigChange]:
        """mqadmin's updateBrokerConfig: change settings that take effect without a restart on
        every node of every (or the named) broker group, all or nothing per node (a refused key
        names why; nothing changes on that node). Until the node restarts: the cluster
        description keeps the value for good. A node that does not answer is listed with its
        error; a denial is raised."""
        if not settings:
            raise InvalidArgumentError("no setting to change: give KEY=VALUE")
        req = broker_pb2.UpdateBrokerConfigRequest(settings=settings, dry_run=dry_run)
        out = []
        for g in self._select(broker_groups):
            for n in g.nodes:
                call = functools.partial(
                    self._stub(n.address).UpdateBrokerConfig, req, timeout=RPC_TIMEOUT_S
                )
                try:
                    resp = self._rpc(call)
                except (PermissionDeniedError, UnauthenticatedError):
                    raise
                except RaftMQError as exc:
                    out.append(NodeConfigChange(g.broker_group, n.node_id, {}, {}, exc.message))
                    continue
                out.append(
                    NodeConfigChange(
                        g.broker_group, n.node_id, dict(resp.applied), dict(resp.refused)
                    )
                )
        return out

    @checked
    def purge_topic(
        self,
        topic: str,
        *,
        before_offset: int | None = None,
        before_ms: int | None = None,
        dry_run: bool = False,
    ) -> list[QueuePurge]:
        """kafka-delete-records: every queue of `topic` on every broker group loses its messages
        before `before_offset` (each queue) or stored before `before_ms`; its min offset moves
        up through the group's Raft log, so every reader and every replica agrees. A consumer
        behind the new min offset goes on from it. The journal's bytes go with retention."""
        validate_topic(topic)
        if (before_offset is None) == (before_ms is None):
            raise InvalidArgumentError("give before_offset or before_ms, one of them")
        req = broker_pb2.PurgeTopicRequest(topic=topic, dry_run=dry_run)
        if before_offset is not None:
            req.offset = before_offset
        else:
            assert before_ms is not None
            req.timestamp_ms = before_ms
        out = []
        for g in self._select(None):
            if not any(q.broker_group == g.broker_group for q in self.route(topic).queues):
                continue
            resp = self._on_leader(g, lambda s: s.PurgeTopic(req, timeout=RPC_TIMEOUT_S))
            out += [
                QueuePurge(
                    QueueRef(topic, g.broker_group, q.queue_id),
                    q.old_min_offset,
                    q.new_min_offset,
                    q.max_offset,
                )
                for q in resp.queues
            ]
        return out

    @checked
    def delete_group(self, group: str, *, force: bool = False) -> dict[str, GroupDeleted]:
        """mqadmin's deleteSubGroup --removeOffset, kafka-consumer-groups --delete: the group's
        committed offsets (and orderly leases, POP state, config) go on every broker group; per
        broker group, how many offsets it had and whether it had a config. Refused
        (InvalidArgumentError naming the members) where members are online, unless `force`:
        they would commit again and bring it back. Broker groups before a refusal keep the
        deletion (each answer is its own log entry)."""
        validate_group(group)
        out: dict[str, GroupDeleted] = {}
        for g in self._select(None):
            resp = self._on_leader(
                g,
                lambda s: s.DeleteConsumerGroup(
                    broker_pb2.DeleteConsumerGroupRequest(consumer_group=group, force=force),
                    timeout=RPC_TIMEOUT_S,
                ),
            )
            out[g.broker_group] = GroupDeleted(resp.deleted_offsets, resp.deleted_config)
        return out

    @checked
    def update_group_config(
        self,
        group: str,
        *,
        retry_max_times: int | None = None,
        consume_enable: bool | None = None,
        broadcast_enable: bool | None = None,
        broker_groups: Sequence[str] | None = None,
    ) -> dict[str, GroupConfig]:
        """mqadmin's updateSubGroup: set the group's retry limit (-1: the consumer's own),
        whether it may consume, whether it may consume by broadcast, on every broker group (or
        those named), replicated through each group's log. Fields left None keep their value;
        with none given this only reads. Returns each broker group's config in force."""
        validate_group(group)
        req = broker_pb2.UpdateConsumerGroupConfigRequest(consumer_group=group)
        if retry_max_times is not None:
            validate_group_config(GroupConfig(group, retry_max_times))  # before any is written
            req.retry_max_times = retry_max_times
        if consume_enable is not None:
            req.consume_enable = consume_enable
        if broadcast_enable is not None:
            req.broadcast_enable = broadcast_enable
        out: dict[str, GroupConfig] = {}
        for g in self._select(broker_groups):
            resp = self._on_leader(
                g, lambda s: s.UpdateConsumerGroupConfig(req, timeout=RPC_TIMEOUT_S)
            )
            out[g.broker_group] = group_config_from_pb(resp)
        return out

    @checked
    def producers(self, topic: str = "") -> list[ProducerQueue]:
        """mqadmin's producerConnection: the idempotent producers that wrote to each broker
        group (of `topic`, or of every topic), from the replicated producer table its leader
        holds: which queues, their last sequence, when their last batch was stored. A producer
        made with idempotent=False keeps no row. Raises if a group's answer was cut short."""
        if topic:
            validate_topic(topic, allow_system=True)
        out = []
        for g in self._select(None):
            resp = self._on_leader(
                g,
                lambda s: s.ListProducers(
                    broker_pb2.ListProducersRequest(topic=topic), timeout=RPC_TIMEOUT_S
                ),
            )
            out += [
                ProducerQueue(
                    g.broker_group,
                    p.producer_id,
                    p.topic,
                    p.queue_id,
                    p.last_sequence,
                    p.last_store_timestamp_ms,
                )
                for p in resp.producers
            ]
            if resp.truncated:
                raise InvalidArgumentError(
                    f"broker group {g.broker_group} holds more producer rows than one answer; "
                    "name a topic (--topic) to list fewer"
                )
        return out

    def _stub(self, address: str) -> broker_pb2_grpc.BrokerStub:
        return self._pool.broker(address)

    @staticmethod
    def _rpc(fn: Callable[[], T]) -> T:
        try:
            return fn()
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None

    def _on_leader(self, group: GroupInfo, fn: Callable[[broker_pb2_grpc.BrokerStub], T]) -> T:
        """`fn` on the group's leader, following one NOT_LEADER hint. A group whose leader the
        NameServers do not know yet (an election, or a cluster just started: the controller can
        know the leader a heartbeat before they do) is asked again for up to LEADER_WAIT_S
        before NotLeaderError: nothing was sent, so waiting is safe for every call."""
        address = group.leader_address
        deadline = time.monotonic() + LEADER_WAIT_S  # read at each call (a test shortens it)
        while not address and time.monotonic() < deadline:
            time.sleep(LEADER_POLL_S)
            fresh = [g for g in self.groups() if g.broker_group == group.broker_group]
            address = fresh[0].leader_address if fresh else ""
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
        drop_unconsumed: bool = False,
    ) -> list[str]:
        """Change the topic on every group that has it (or the named ones); what is not given
        keeps its current value. The groups it was changed on. Fewer queues than now is refused
        (InvalidTopicConfigError naming them) while the queues to drop hold messages a consumer
        group has not consumed, unless `drop_unconsumed`: those become unreachable."""
        validate_topic(topic)
        if queues is not None:
            check_queue_count(topic, queues)
        current = dict(self.list_topics().get(topic, []))
        groups = self._select(broker_groups)
        if broker_groups is None:
            groups = [g for g in groups if g.broker_group in current]
        if not groups or any(g.broker_group not in current for g in groups):
            raise TopicNotFoundError.for_topic(topic, auto_create=True)
        shrinking = [
            g.broker_group
            for g in groups
            if queues is not None and current[g.broker_group].read_queue_nums > queues
        ]
        if shrinking and queues is not None and not drop_unconsumed:
            self._refuse_stranding(topic, queues, shrinking)
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

    def _refuse_stranding(self, topic: str, queues: int, broker_groups: list[str]) -> None:
        """InvalidTopicConfigError when queues `queues`.. of `broker_groups` hold messages a
        consumer group of the topic (or, with none, any group yet to come) has not consumed."""
        bounds = {
            s.queue: (s.min_offset, s.max_offset)
            for s in self.topic_status(topic)
            if s.queue.broker_group in broker_groups and s.queue.queue_id >= queues
        }
        readers = [c.group for c in self.consumer_groups() if topic in c.topics]
        committed = {
            name: {lag.queue: lag.committed for lag in self.group_lag(name, topic)}
            for name in readers
        }
        found = stranded(bounds, committed)
        if found:
            raise InvalidTopicConfigError(
                refusal(topic, queues, found),
                details={"topic": topic, "unconsumed": str(sum(s.unconsumed for s in found))},
            )

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

    @checked
    def topic_status(self, topic: str) -> list[QueueStatus]:
        """mqadmin topicStatus: min and max offset and last store time of every queue, from
        each broker group's leader."""
        validate_topic(topic)
        out = []
        for q in self.route(topic).read_queues():
            g = self._select([q.broker_group])[0]
            b = self._on_leader(
                g,
                lambda s, q=q: s.GetQueueBounds(  # type: ignore[misc]
                    broker_pb2.GetQueueBoundsRequest(topic=topic, queue_id=q.queue_id),
                    timeout=RPC_TIMEOUT_S,
                ),
            )
            out.append(QueueStatus(q, b.min_offset, b.max_offset, b.max_store_timestamp_ms))
        return out

    # ---- groups and offsets -------------------------------------------------------------------

    def consumer_groups(self) -> list[ConsumerGroupInfo]:
        """Every consumer group a broker group knows: with members heartbeating now (and the
        broker groups each reaches: its connections) or with committed offsets."""
        members: dict[str, dict[str, tuple[set[str], set[str]]]] = {}
        topics: dict[str, set[str]] = {}
        configs: dict[str, dict[str, GroupConfig]] = {}
        selected = self._select(None)
        for g in selected:
            resp = self._on_leader(
                g,
                lambda s: s.ListConsumerGroups(
                    broker_pb2.ListConsumerGroupsRequest(), timeout=RPC_TIMEOUT_S
                ),
            )
            for info in resp.groups:
                group_topics = topics.setdefault(info.consumer_group, set())
                group_topics.update(info.committed_topics)
                if info.HasField("config"):
                    configs.setdefault(info.consumer_group, {})[g.broker_group] = (
                        group_config_from_pb(info.config)
                    )
                by_client = members.setdefault(info.consumer_group, {})
                for m in info.members:
                    subscribed, reached = by_client.setdefault(m.client_id, (set(), set()))
                    subscribed.update(m.topics)
                    reached.add(g.broker_group)
                    group_topics.update(m.topics)
        return [
            ConsumerGroupInfo(
                name,
                tuple(
                    ConsumerMemberInfo(cid, tuple(sorted(t)), tuple(sorted(b)))
                    for cid, (t, b) in sorted(members.get(name, {}).items())
                ),
                tuple(sorted(topics[name])),
                tuple(sorted(configs.get(name, {}).items())),
                len(configs.get(name, {})) in (0, len(selected)),
            )
            for name in sorted(topics)
        ]

    # ---- resource reports (issue 18) -----------------------------------------------------------

    @checked
    def topic_stats(
        self, topic: str, since_ms: int = 3_600_000, until_ms: int | None = None
    ) -> StatsReport:
        """Messages produced to `topic` per minute over the last `since_ms` (to `until_ms`,
        epoch ms, default now): every node of every broker group asked, counts summed."""
        validate_topic(topic)
        return self._stats(topic, "", since_ms, until_ms)

    @checked
    def group_stats(
        self,
        group: str,
        since_ms: int = 3_600_000,
        until_ms: int | None = None,
        topic: str = "",
    ) -> StatsReport:
        """Messages consumed by `group` per minute and topic (only `topic` if given)."""
        validate_group(group)
        if topic:
            validate_topic(topic)
        return self._stats(topic, group, since_ms, until_ms)

    def _stats(self, topic: str, group: str, since_ms: int, until_ms: int | None) -> StatsReport:
        lo, hi = report_range(int(time.time() * 1000), since_ms, until_ms)
        request = broker_pb2.QueryStatsRequest(
            topic=topic, consumer_group=group, since_ms=lo, until_ms=hi
        )
        rows: list[tuple[int, str, str, int]] = []
        unanswered: list[str] = []
        truncated = False
        for g in self._select(None):
            for n in g.nodes:
                try:
                    resp = self._query_stats(n.address, request)
                except RaftMQError as exc:
                    unanswered.append(f"{g.broker_group}/{n.node_id}: {exc.message}")
                    continue
                truncated = truncated or resp.truncated
                rows.extend((r.minute_ms, r.topic, r.consumer_group, r.count) for r in resp.rows)
        return merge(rows, lo, hi, unanswered=unanswered, truncated=truncated)

    def _query_stats(
        self, address: str, request: broker_pb2.QueryStatsRequest
    ) -> broker_pb2.QueryStatsResponse:
        return self._rpc(lambda: self._stub(address).QueryStats(request, timeout=RPC_TIMEOUT_S))

    @checked
    def plan_offset_reset(self, group: str, topic: str, target: ResetTarget) -> list[QueueReset]:
        """Where `target` puts each queue of `topic` for `group`, changing nothing (--dry-run)."""
        validate_group(group)
        offsets = BrokerOffsets(group, self.routes, self._pool)
        plan = []
        for q in self.route(topic).read_queues():
            committed = offsets.committed(q)
            low, high = offsets.bounds(q)
            at_time = (
                offsets.for_timestamp(q, target.value) if target.kind is ResetTo.TIME else None
            )
            plan.append(
                QueueReset(
                    q, committed, low, high, target_offset(target, committed, low, high, at_time)
                )
            )
        return plan

    @checked
    def reset_offsets(
        self,
        group: str,
        topic: str,
        target: ResetTarget,
        *,
        allow_new_group: bool = False,
    ) -> list[QueueReset]:
        """Plan the reset and execute it on each broker group's leader (replicated). Running
        PushConsumers of the group move to the new offsets at their next heartbeat. A group
        that never used the topic is refused unless `allow_new_group`."""
        validate_group(group)
        if not allow_new_group and not self.group_exists(group, topic):
            raise InvalidArgumentError(
                f"consumer group {group!r} has no committed offset on topic {topic!r} and no "
                "consumer online: check the name, or allow a new group (--create) to start it "
                "at these offsets"
            )
        plan = self.plan_offset_reset(group, topic, target)
        by_group: dict[str, list[QueueReset]] = {}
        for row in plan:
            by_group.setdefault(row.queue.broker_group, []).append(row)
        done: dict[QueueRef, int] = {}
        for name, rows in sorted(by_group.items()):
            g = self._select([name])[0]
            req = broker_pb2.ResetOffsetsRequest(
                consumer_group=group,
                topic=topic,
                offsets=[
                    broker_pb2.QueueOffset(topic=topic, queue_id=r.queue.queue_id, offset=r.new)
                    for r in rows
                ],
            )
            resp = self._on_leader(g, lambda s, req=req: s.ResetOffsets(req, timeout=RPC_TIMEOUT_S))  # type: ignore[misc]
            for o in resp.offsets:
                done[QueueRef(topic, name, o.queue_id)] = o.offset
        # The stored offsets (bounds may have moved since the plan was made).
        return [
            QueueReset(r.queue, r.current, r.min_offset, r.max_offset, done.get(r.queue, r.new))
            for r in plan
        ]

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

    # ---- dead letters (issue 16) -------------------------------------------------------------

    @checked
    def dead_letters(
        self, group: str, max_count: int = 100, timeout_ms: int = 10_000
    ) -> list[ReceivedMessage]:
        """The messages in the group's dead-letter topic (%DLQ%<group>), oldest first per queue,
        at most max_count. Read without a consumer group's offsets: nothing is committed. Each
        names its original topic and id (properties DLQ_ORIGIN_TOPIC, DLQ_ORIGIN_MESSAGE_ID)."""
        validate_group(group)
        if max_count < 1:
            raise InvalidArgumentError("max_count must be at least 1")
        topic = dlq_topic(group)
        try:
            queues = self.route(topic).read_queues()
        except (TopicNotFoundError, NoRouteError):
            return []  # no message of the group was ever dead-lettered
        offsets = BrokerOffsets(group, self.routes, self._pool)
        expect = 0
        for q in queues:
            low, high = offsets.bounds(q)
            expect += max(0, high - low)
        expect = min(expect, max_count)
        out: list[ReceivedMessage] = []
        if expect == 0:
            return out
        with PullConsumer(
            self.routes.namesrv_addresses, group, start_from=StartFrom.EARLIEST
        ) as reader:
            reader.assign(queues)
            for q in queues:
                reader.seek_to_beginning(q)
            deadline = time.monotonic() + timeout_ms / 1000
            while len(out) < expect and time.monotonic() < deadline:
                out.extend(reader.poll(200, max_messages=expect - len(out)))
        return out

    @checked
    def resend_dead_letters(
        self, group: str, *, max_count: int = 100, dry_run: bool = False, force: bool = False
    ) -> list[DeadLetterResend]:
        """`raftmq dlq resend --group`: each of the group's dead letters (at most max_count,
        oldest first per queue) back to its original topic, once: one resent before is skipped
        (named with its first resend) unless `force`. `dry_run` decides the same and sends
        nothing. A failure stops the run; its message says how many went before it (a second run
        skips those, as resent before)."""
        out: list[DeadLetterResend] = []
        for m in self.dead_letters(group, max_count=max_count):
            earlier = [] if force else self._resends_of(m.msg_id)
            if earlier:
                out.append(DeadLetterResend(m.msg_id, "skipped", earlier[0].new_msg_id))
            elif dry_run:
                out.append(DeadLetterResend(m.msg_id, "would resend", ""))
            else:
                try:
                    sent = self.resend_dead_letter(m.msg_id, force=True)  # checked just above
                except RaftMQError as exc:
                    done = sum(1 for x in out if x.outcome == "resent")
                    exc.details["resent_before_the_failure"] = str(done)
                    exc.message += (
                        f" (dead letter {m.msg_id}; {done} resent before it, each once: run "
                        "the same command again to go on)"
                    )
                    raise
                out.append(DeadLetterResend(m.msg_id, "resent", sent.msg_id))
        return out

    @checked
    def messages_in_queue(
        self, queue: QueueRef, begin: int, end: int | None = None, *, timeout_ms: int = 10_000
    ) -> QueueRange:
        """The messages of one queue at offsets begin..end-1 (mqadmin's queryMsgByOffset and
        printMsgByQueue, kafka-console-consumer's --partition --offset): `end` None = one
        message. Read without committing anything; at most MAX_RANGE_MESSAGES. Offsets below
        the queue's min offset are gone (retention): the range starts at it and says so."""
        check_offset(begin, "begin")
        end = begin + 1 if end is None else end
        if end <= begin:
            raise InvalidArgumentError(f"the range {begin}..{end} is empty: end must exceed begin")
        if end - begin > MAX_RANGE_MESSAGES:
            raise InvalidArgumentError(
                f"at most {MAX_RANGE_MESSAGES} messages per range; ask for {begin}.."
                f"{begin + MAX_RANGE_MESSAGES} and go on from there"
            )
        low, high = BrokerOffsets(READER_GROUP, self.routes, self._pool).bounds(queue)
        first, stop = max(begin, low), min(end, high)
        found: dict[int, ReceivedMessage] = {}
        if first < stop:
            with PullConsumer(self.routes.namesrv_addresses, READER_GROUP) as reader:
                reader.assign([queue])
                reader.seek(queue, first)
                deadline = time.monotonic() + timeout_ms / 1000
                while len(found) < stop - first and time.monotonic() < deadline:
                    for m in reader.poll(200, max_messages=stop - first - len(found)):
                        if first <= m.queue_offset < stop:
                            found[m.queue_offset] = m
        return QueueRange(queue, low, high, [found[o] for o in sorted(found)])

    @checked
    def resend_dead_letter(self, msg_id: str, *, force: bool = False) -> SendResult:
        """`raftmq dlq resend`: the dead letter `msg_id` back to its original topic, as a fresh
        message (count 0); the dead letter itself stays where it is. A resend is recorded in
        the trace topic, keyed by the dead letter's, its original's and the new id, so the
        original's trace leads to it and a second resend of the same dead letter is refused
        (InvalidArgumentError naming the first) unless `force`. Two resends at the same moment
        may both pass the check: it reads the trace, it takes no lock."""
        decode_msg_id(msg_id)
        if not force:
            earlier = self._resends_of(msg_id)
            if earlier:
                first = earlier[0]
                raise InvalidArgumentError(
                    f"dead letter {msg_id} was already resent to {first.to_topic} as "
                    f"{first.new_msg_id}; resend it again with --force (force=True in the SDK)",
                    details={"msg_id": msg_id, "resent_as": first.new_msg_id},
                )
        dead = self.message_by_id(msg_id)
        sent = self._resend(msg_id)
        origin = dead.properties.get(PROPERTY_DLQ_ORIGIN_MESSAGE_ID, "") or msg_id
        record = MoveTrace(
            msg_id=origin,
            timestamp_ms=time.time_ns() // 1_000_000,
            move=MoveKind.RESEND,
            group=dead.topic.removeprefix(DLQ_TOPIC_PREFIX),
            from_topic=dead.topic,
            to_topic=sent.topic,
            reconsume_times=0,
            new_msg_id=sent.msg_id,
        )
        try:
            with Producer(
                self.routes.namesrv_addresses,
                allow_system_topics=True,
                credentials=self._credentials,
                tls_ca=self._tls_files[0],
                tls_cert=self._tls_files[1],
                tls_key=self._tls_files[2],
            ) as p:
                m = trace_message([record], (msg_id, origin, sent.msg_id))
                p.send(TRACE_TOPIC, m.body, keys=m.keys, properties=m.properties)
        except RaftMQError as exc:  # resent all the same: say the record is missing
            log.warning("admin.resend_trace_failed msg_id=%s error=%s", msg_id, exc.message)
        return sent

    def _resends_of(self, msg_id: str) -> list[MoveTrace]:
        """The recorded resends of dead letter `msg_id`, oldest first: the trace messages whose
        first key is it (a resend record is keyed dead letter first, then the original and the
        new id, so an original's own id never matches)."""
        try:
            found = self.messages_by_key(TRACE_TOPIC, msg_id, max_count=64)
        except (NoRouteError, TopicNotFoundError):
            return []  # nothing was ever traced
        out = []
        for m in found:
            if not m.keys or m.keys[0] != msg_id:
                continue
            try:
                out += [
                    r
                    for r in records_of_message(m)
                    if isinstance(r, MoveTrace) and r.move is MoveKind.RESEND
                ]
            except MalformedTraceError:
                continue
        return sorted(out, key=lambda r: r.timestamp_ms)

    def _resend(self, msg_id: str) -> SendResult:
        group_name = decode_msg_id(msg_id).broker_group
        for g in self._select(None):
            if g.broker_group != group_name:
                continue
            resp = self._on_leader(
                g,
                lambda s: s.ResendDeadLetter(
                    broker_pb2.ResendDeadLetterRequest(msg_id=msg_id), timeout=RPC_TIMEOUT_S
                ),
            )
            return SendResult(resp.msg_id, resp.topic, group_name, resp.queue_id, resp.queue_offset)
        raise MessageNotFoundError.for_id(msg_id)

    @checked
    def messages_by_time(
        self,
        topic: str,
        begin_ms: int,
        end_ms: int,
        *,
        page_size: int = 32,
        page_token: str = "",
    ) -> MessagePage:
        """One page of the topic's messages stored within [begin_ms, end_ms] (ms since the
        epoch, both inclusive), through each broker group's time index: broker group by group,
        queue by queue, in offset order. Pass the page's next_page_token for the next page;
        "" means the range is exhausted."""
        validate_topic(topic)
        if end_ms < begin_ms:
            raise InvalidArgumentError(
                f"the range ends ({end_ms}) before it begins ({begin_ms}): swap --from and --to"
            )
        if not 1 <= page_size <= 1024:
            raise InvalidArgumentError(f"page size {page_size} must be within 1..1024")
        groups = self._topic_groups(topic)
        names = [n for n, _ in groups]
        start, queue_id, offset = _parse_page_token(page_token, names)
        for k in range(start, len(groups)):
            name, g = groups[k]
            request = broker_pb2.QueryMessagesByTimeRequest(
                topic=topic,
                begin_timestamp_ms=begin_ms,
                end_timestamp_ms=end_ms,
                max_count=page_size,
                queue_id=queue_id,
                queue_offset=offset,
            )

            def query(
                s: broker_pb2_grpc.BrokerStub,
                r: broker_pb2.QueryMessagesByTimeRequest = request,
            ) -> broker_pb2.QueryMessagesByTimeResponse:
                return s.QueryMessagesByTime(r, timeout=RPC_TIMEOUT_S)

            resp = self._on_leader(g, query)
            messages = [ReceivedMessage.from_pb(m) for m in resp.messages]
            if resp.more:
                token = f"{name}/{resp.next_queue_id}/{resp.next_queue_offset}"
                return MessagePage(messages, token)
            if messages or k + 1 == len(groups):
                token = f"{names[k + 1]}/0/-1" if k + 1 < len(groups) else ""
                return MessagePage(messages, token)
            queue_id, offset = 0, -1  # nothing in this group: on to the next one
        return MessagePage([], "")

    def iter_messages_by_time(
        self, topic: str, begin_ms: int, end_ms: int, page_size: int = 256
    ) -> Iterator[ReceivedMessage]:
        """Every message of messages_by_time's range, page after page."""
        token = ""
        while True:
            page = self.messages_by_time(
                topic, begin_ms, end_ms, page_size=page_size, page_token=token
            )
            yield from page.messages
            token = page.next_page_token
            if not token:
                return

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
