"""The SDK's message values: what a producer sends, what a send returns, what a consumer gets.

Plain frozen values; conversion from wire and stored forms lives here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from raftmq.common.message import StoredMessage, check_message_types
from raftmq.common.pb import common_pb2


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """One message of a batch send (RocketMQ: a Message without its topic)."""

    body: bytes
    tags: str | None = None
    keys: tuple[str, ...] = ()
    properties: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_message_types(self.tags, self.keys, self.properties)


@dataclass(frozen=True, slots=True)
class SendResult:
    """Where a message was stored. `duplicate`: an idempotent retry found it already stored (the
    offset and id are the original's; msg_id is "" if the broker no longer remembers them)."""

    msg_id: str
    topic: str
    broker_group: str
    queue_id: int
    queue_offset: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class ReceivedMessage:
    """A message as a consumer receives it."""

    topic: str
    body: bytes
    tags: str | None
    keys: tuple[str, ...]
    properties: Mapping[str, str]
    broker_group: str
    queue_id: int
    queue_offset: int
    msg_id: str
    store_timestamp_ms: int
    born_timestamp_ms: int
    born_host: str
    reconsume_times: int = 0

    @classmethod
    def from_stored(cls, sm: StoredMessage) -> ReceivedMessage:
        m = sm.message
        return cls(
            m.topic,
            m.body,
            m.tags,
            m.keys,
            m.properties,
            sm.broker_group,
            sm.queue_id,
            sm.queue_offset,
            sm.msg_id,
            sm.store_timestamp_ms,
            m.born_timestamp_ms,
            m.born_host,
        )

    @classmethod
    def from_pb(cls, sm: common_pb2.StoredMessage) -> ReceivedMessage:
        m = sm.message
        return cls(
            sm.topic,
            m.body,
            m.tags or None,
            tuple(m.keys),
            dict(m.properties),
            sm.broker_group,
            sm.queue_id,
            sm.queue_offset,
            sm.msg_id,
            sm.store_timestamp_ms,
            m.born_timestamp_ms,
            m.born_host,
            sm.reconsume_times,
        )


def to_pb(
    body: bytes,
    tags: str | None,
    keys: tuple[str, ...],
    properties: Mapping[str, str] | None,
    born_ms: int,
    born_host: str,
) -> common_pb2.Message:
    """The wire message; InvalidMessageError (naming the field) for a tag, key, property name or
    value that is not a string, before protobuf's own TypeError could say less."""
    check_message_types(tags, keys, properties)
    return common_pb2.Message(
        body=body,
        tags=tags or "",
        keys=keys,
        properties=properties or {},
        born_timestamp_ms=born_ms,
        born_host=born_host,
    )
