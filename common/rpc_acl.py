"""Every RPC of every role mapped to the action and resources it needs (issue 19): one table,
keyed by the gRPC method path, used by the gRPC interceptor and by the framed data path (whose
methods carry the same requests as the Broker methods of the same name).

Pure: a rule takes the parsed request and returns what to check; tests hold the table to the
proto descriptors (every method has a rule). `SUPER` marks what only a super user (the nodes
themselves, operators) may do: inter-node calls, leadership and the ACL itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from raftmq.common.acl import CLUSTER, Action, Resource, group, topic
from raftmq.common.data_api import DataMethod

# (action, resource); a frozenset of actions means any one of them suffices (a route lookup
# is allowed to whoever may publish to, subscribe to or read the topic)
Need = tuple[Action | frozenset[Action], Resource]
LOOKUP = frozenset({Action.PUB, Action.SUB, Action.GET})
READ = frozenset({Action.SUB, Action.GET})
SUPER: tuple[Need, ...] = ((Action.ALL, Resource(CLUSTER.type, "%SUPER%")),)  # super user only
Rule = Callable[[Any], Iterable[Need]]

MAX_NEEDS = 64  # distinct (action, resource) pairs checked per request; more is refused


def _v1(service: str, method: str) -> str:
    return f"/raftmq.v1.{service}/{method}"


def _v2(method: str, service: str = "MessagingService") -> str:
    return f"/apache.rocketmq.v2.{service}/{method}"


def _super(_req: Any) -> Iterable[Need]:
    return SUPER


def _cluster(action: Action) -> Rule:
    return lambda _req: ((action, CLUSTER),)


def _topic(action: Action | frozenset[Action], field: str = "topic") -> Rule:
    return lambda req: ((action, topic(getattr(req, field))),)


def _sub(req: Any) -> Iterable[Need]:
    """Consuming: Sub on the topic and on the consumer group (RocketMQ checks both)."""
    return ((Action.SUB, topic(req.topic)), (Action.SUB, group(req.consumer_group)))


def _group(action: Action, field: str = "consumer_group") -> Rule:
    return lambda req: ((action, group(getattr(req, field))),)


def _commit(req: Any) -> Iterable[Need]:
    needs = {(Action.SUB, group(req.consumer_group))}
    needs.update((Action.SUB, topic(o.topic)) for o in req.offsets)
    return needs


def _reset(req: Any) -> Iterable[Need]:
    return ((Action.UPDATE, group(req.consumer_group)), (Action.UPDATE, topic(req.topic)))


def _heartbeat(req: Any) -> Iterable[Need]:
    needs = {(Action.SUB, group(req.consumer_group))}
    needs.update((Action.SUB, topic(t)) for t in req.topics)
    return needs


def _topic_config(action: Action) -> Rule:
    return lambda req: ((action, topic(req.config.topic)),)


def _txn_group(req: Any) -> Iterable[Need]:
    # An end or a check-back poll names no topic, only the producer group: checked as Pub on
    # `Group:<producer group>` (a transactional producer's policy names its group and topics).
    return ((Action.PUB, group(req.producer_group)),)


def _stats(req: Any) -> Iterable[Need]:
    needs: list[Need] = []
    if req.topic:
        needs.append((Action.GET, topic(req.topic)))
    if req.consumer_group:
        needs.append((Action.GET, group(req.consumer_group)))
    return needs or ((Action.GET, CLUSTER),)


# ---- RocketMQ 5 (apache.rocketmq.v2), served by the proxy ---------------------------------------


def _v2_topic(action: Action, field: str = "topic") -> Rule:
    return lambda req: ((action, topic(getattr(req, field).name)),)


def _v2_group(action: Action) -> Rule:
    return lambda req: ((action, group(req.group.name)),) if req.group.name else ()


def _v2_sub_queue(req: Any) -> Iterable[Need]:
    return (
        (Action.SUB, topic(req.message_queue.topic.name)),
        (Action.SUB, group(req.group.name)),
    )


def _v2_sub_topic(req: Any) -> Iterable[Need]:
    return ((Action.SUB, topic(req.topic.name)), (Action.SUB, group(req.group.name)))


def _v2_send(req: Any) -> Iterable[Need]:
    return {(Action.PUB, topic(m.topic.name)) for m in req.messages}


def _v2_route(req: Any) -> Iterable[Need]:
    # Producers and consumers both ask; either right on the topic lets them see its route.
    return ((LOOKUP, topic(req.topic.name)),)


def _none(_req: Any) -> Iterable[Need]:
    """Authenticated only: the call carries nothing to check (the client's own session)."""
    return ()


RULES: dict[str, Rule] = {
    # Broker: data path
    _v1("Broker", "SendMessage"): _topic(Action.PUB),
    _v1("Broker", "PullMessage"): _sub,
    _v1("Broker", "CommitOffset"): _commit,
    _v1("Broker", "QueryOffset"): _sub,
    _v1("Broker", "GetQueueBounds"): _topic(READ),
    _v1("Broker", "SearchOffsetByTimestamp"): _topic(READ),
    _v1("Broker", "Heartbeat"): _heartbeat,
    _v1("Broker", "GetConsumerList"): _group(Action.SUB),
    _v1("Broker", "ConsumerSendBack"): _group(Action.SUB),
    _v1("Broker", "LockQueues"): _sub,
    _v1("Broker", "UnlockQueues"): _sub,
    # framed only (no gRPC method): the ready batches of many queues
    _v1("Broker", "SendBatches"): lambda req: {(Action.PUB, topic(b.topic)) for b in req.batches},
    # framed only: the replicated POP state (the proxy's receive and ack); consuming
    _v1("Broker", "PopState"): _sub,
    _v1("Broker", "PopReceive"): _sub,
    _v1("Broker", "PopAck"): _sub,
    # Broker: queries and admin
    _v1("Broker", "ResetOffsetsToTimestamp"): _reset,
    _v1("Broker", "ResetOffsets"): _reset,
    _v1("Broker", "QueryMessageById"): _cluster(Action.GET),  # the id does not name its topic
    _v1("Broker", "QueryMessagesByKey"): _topic(Action.GET),
    _v1("Broker", "QueryMessagesByTime"): _topic(Action.GET),
    _v1("Broker", "CreateTopic"): _topic_config(Action.CREATE),
    _v1("Broker", "UpdateTopic"): _topic_config(Action.UPDATE),
    _v1("Broker", "DeleteTopic"): _topic(Action.DELETE),
    _v1("Broker", "ListTopics"): _cluster(Action.LIST),
    _v1("Broker", "ListConsumerGroups"): _cluster(Action.LIST),
    _v1("Broker", "GetBrokerStatus"): _cluster(Action.GET),
    _v1("Broker", "QueryStats"): _stats,
    _v1("Broker", "ResendDeadLetter"): _cluster(Action.UPDATE),  # the id does not name a group
    _v1("Broker", "LeadershipTransfer"): _super,
    _v1("Broker", "UpdateBrokerConfig"): _super,
    _v1("Broker", "ListProducers"): _cluster(Action.LIST),
    _v1("Broker", "DeleteConsumerGroup"): _group(Action.DELETE),
    _v1("Broker", "UpdateConsumerGroupConfig"): _group(Action.UPDATE),
    _v1("Broker", "PurgeTopic"): _topic(Action.DELETE),
    # Transactions
    _v1("BrokerTransaction", "SendHalfMessage"): _topic(Action.PUB),
    _v1("BrokerTransaction", "EndTransaction"): _txn_group,
    _v1("BrokerTransaction", "PollTransactionChecks"): _txn_group,
    # NameServer
    _v1("NameServer", "RegisterBroker"): _super,
    _v1("NameServer", "UnregisterBroker"): _super,
    _v1("NameServer", "PushLeaderChange"): _super,
    _v1("NameServer", "GetRouteInfoByTopic"): _topic(LOOKUP),
    # groups and their nodes' addresses, which routes show anyway: every SDK client asks (a
    # transactional producer polls each group for check-backs)
    _v1("NameServer", "GetClusterInfo"): _none,
    _v1("NameServer", "GetAllTopics"): _cluster(Action.LIST),
    # Controller
    _v1("Controller", "ReportRole"): _super,
    _v1("Controller", "GetControllerStatus"): _cluster(Action.GET),
    _v1("Controller", "GetAlerts"): _cluster(Action.GET),
    _v1("Controller", "PutUser"): _super,
    _v1("Controller", "DeleteUser"): _super,
    _v1("Controller", "SetPolicy"): _super,
    _v1("Controller", "DeletePolicy"): _super,
    _v1("Controller", "GetAcl"): _super,
    # RocketMQ 5 MessagingService (the proxy)
    _v2("QueryRoute"): _v2_route,
    _v2("Heartbeat"): _v2_group(Action.SUB),
    _v2("SendMessage"): _v2_send,
    _v2("QueryAssignment"): _v2_sub_topic,
    _v2("ReceiveMessage"): _v2_sub_queue,
    _v2("AckMessage"): _v2_sub_topic,
    _v2("ForwardMessageToDeadLetterQueue"): _v2_sub_topic,
    _v2("PullMessage"): _v2_sub_queue,
    _v2("UpdateOffset"): _v2_sub_queue,
    _v2("GetOffset"): _v2_sub_queue,
    _v2("QueryOffset"): lambda req: ((READ, topic(req.message_queue.topic.name)),),
    _v2("EndTransaction"): _v2_topic(Action.PUB),
    _v2("Telemetry"): _none,  # the client's settings stream; its sends and receives are checked
    _v2("NotifyClientTermination"): _none,
    _v2("ChangeInvisibleDuration"): _v2_sub_topic,
    _v2("RecallMessage"): _v2_topic(Action.PUB),
    _v2("SyncLiteSubscription"): _v2_sub_topic,
}

# The framed data path's methods are the Broker methods of the same name.
_FRAME_NAMES = {
    DataMethod.SEND_MESSAGE: _v1("Broker", "SendMessage"),
    DataMethod.PULL_MESSAGE: _v1("Broker", "PullMessage"),
    DataMethod.COMMIT_OFFSET: _v1("Broker", "CommitOffset"),
    DataMethod.QUERY_OFFSET: _v1("Broker", "QueryOffset"),
    DataMethod.GET_QUEUE_BOUNDS: _v1("Broker", "GetQueueBounds"),
    DataMethod.SEARCH_OFFSET_BY_TIMESTAMP: _v1("Broker", "SearchOffsetByTimestamp"),
    DataMethod.HEARTBEAT: _v1("Broker", "Heartbeat"),
    DataMethod.SEND_HALF_MESSAGE: _v1("BrokerTransaction", "SendHalfMessage"),
    DataMethod.END_TRANSACTION: _v1("BrokerTransaction", "EndTransaction"),
    # The batched forms are checked item by item with the single form's rule.
    DataMethod.SEND_HALF_MESSAGES: _v1("BrokerTransaction", "SendHalfMessage"),
    DataMethod.END_TRANSACTIONS: _v1("BrokerTransaction", "EndTransaction"),
    DataMethod.SEND_BATCHES: _v1("Broker", "SendBatches"),
    DataMethod.POP_STATE: _v1("Broker", "PopState"),
    DataMethod.POP_RECEIVE: _v1("Broker", "PopReceive"),
    DataMethod.POP_ACK: _v1("Broker", "PopAck"),
}
FRAME_RULES: dict[int, Rule] = {int(m): RULES[path] for m, path in _FRAME_NAMES.items()}


def needs_of(path: str, request: Any) -> tuple[Need, ...] | None:
    """What `request` on method `path` needs; None when the method has no rule (refuse it)."""
    rule = RULES.get(path)
    return None if rule is None else tuple(rule(request))
