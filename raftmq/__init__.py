"""raftmq: Apache RocketMQ's architecture with a Raft group per broker group, in Python.

The SDK's public names, loaded on first use (PEP 562) so that `import raftmq` stays light:

    from raftmq import Producer, PushConsumer, PullConsumer, Admin, ConsumeResult, StartFrom

Every failure the SDK raises is a `RaftMQError` (see `raftmq.common.errors` for the table).
Subpackages: `raftmq.common` (the floor: wire types, errors, settings, message model),
`raftmq.client` (the SDK), `raftmq.raftlog`, `raftmq.broker`, `raftmq.namesrv`,
`raftmq.controller` (servers, extra `raftmq[server]`), `raftmq.ops` (cluster tooling and the
`raftmq` command, extra `raftmq[cli]`), `raftmq.spark_source` (`raftmq[spark]`) and
`raftmq.chaos` (`raftmq[chaos]`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "Producer": "raftmq.client.producer",
    "SendResult": "raftmq.client.messages",
    "ReceivedMessage": "raftmq.client.messages",
    "PushConsumer": "raftmq.client.consumer_push",
    "ConsumeResult": "raftmq.client.consumer_push",
    "MessageModel": "raftmq.client.consumer_push",
    "PullConsumer": "raftmq.client.consumer_pull",
    "Admin": "raftmq.client.admin",
    "StartFrom": "raftmq.client.offsets",
    "QueueRef": "raftmq.common.types",
    "RaftMQError": "raftmq.common.errors",
    "Fault": "raftmq.common.errors",
    "InvalidArgumentError": "raftmq.common.errors",
    "InvalidNameError": "raftmq.common.errors",
    "InvalidMessageError": "raftmq.common.errors",
    "MessageTooLargeError": "raftmq.common.errors",
    "TopicNotFoundError": "raftmq.common.errors",
    "TopicAlreadyExistsError": "raftmq.common.errors",
    "PermissionDeniedError": "raftmq.common.errors",
    "OffsetOutOfRangeError": "raftmq.common.errors",
    "MessageNotFoundError": "raftmq.common.errors",
    "UnsupportedError": "raftmq.common.errors",
    "NotLeaderError": "raftmq.common.errors",
    "NoRouteError": "raftmq.common.errors",
    "BrokerUnavailableError": "raftmq.common.errors",
    "RequestTimeoutError": "raftmq.common.errors",
    "QueueFullError": "raftmq.common.errors",
    "ThrottledError": "raftmq.common.errors",
    "OutcomeUnknownError": "raftmq.common.errors",
    "InternalError": "raftmq.common.errors",
    "TransactionProducer": "raftmq.client.producer.transaction",
    "LocalTransactionState": "raftmq.client.producer.transaction",
    "TransactionCheck": "raftmq.client.producer.transaction",
    "TransactionNotFoundError": "raftmq.common.errors",
    "TransactionConflictError": "raftmq.common.errors",
    # security (issue 19)
    "Credentials": "raftmq.common.auth",
    "AccessDeniedError": "raftmq.common.errors",
    "UnauthenticatedError": "raftmq.common.errors",
}

__all__ = [
    "AccessDeniedError",
    "Admin",
    "BrokerUnavailableError",
    "ConsumeResult",
    "Credentials",
    "Fault",
    "InternalError",
    "InvalidArgumentError",
    "InvalidMessageError",
    "InvalidNameError",
    "LocalTransactionState",
    "MessageModel",
    "MessageNotFoundError",
    "MessageTooLargeError",
    "NoRouteError",
    "NotLeaderError",
    "OffsetOutOfRangeError",
    "OutcomeUnknownError",
    "PermissionDeniedError",
    "Producer",
    "PullConsumer",
    "PushConsumer",
    "QueueFullError",
    "QueueRef",
    "RaftMQError",
    "ReceivedMessage",
    "RequestTimeoutError",
    "SendResult",
    "StartFrom",
    "ThrottledError",
    "TopicAlreadyExistsError",
    "TopicNotFoundError",
    "TransactionCheck",
    "TransactionConflictError",
    "TransactionNotFoundError",
    "TransactionProducer",
    "UnauthenticatedError",
    "UnsupportedError",
]

if TYPE_CHECKING:  # what the lazy names are, for type checkers and IDEs
    from raftmq.client.admin import Admin
    from raftmq.client.consumer_pull import PullConsumer
    from raftmq.client.consumer_push import ConsumeResult, MessageModel, PushConsumer
    from raftmq.client.messages import ReceivedMessage, SendResult
    from raftmq.client.offsets import StartFrom
    from raftmq.client.producer import Producer
    from raftmq.client.producer.transaction import (
        LocalTransactionState,
        TransactionCheck,
        TransactionProducer,
    )
    from raftmq.common.auth import Credentials
    from raftmq.common.errors import (
        AccessDeniedError,
        BrokerUnavailableError,
        Fault,
        InternalError,
        InvalidArgumentError,
        InvalidMessageError,
        InvalidNameError,
        MessageNotFoundError,
        MessageTooLargeError,
        NoRouteError,
        NotLeaderError,
        OffsetOutOfRangeError,
        OutcomeUnknownError,
        PermissionDeniedError,
        QueueFullError,
        RaftMQError,
        RequestTimeoutError,
        ThrottledError,
        TopicAlreadyExistsError,
        TopicNotFoundError,
        TransactionConflictError,
        TransactionNotFoundError,
        UnauthenticatedError,
        UnsupportedError,
    )
    from raftmq.common.types import QueueRef


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'raftmq' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
