"""The SDK's message values: what a producer sends, what a send returns, what a consumer gets.

Plain read-only values; conversion from wire and stored forms lives here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from raftmq.common.message import POSITION_HEX, StoredMessage, check_message_types
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


class SendResult:
    """Where a message was stored. `duplicate`: an idempotent retry found it already stored (the
    offset and id are the original's; msg_id is "" if the broker no longer remembers them).

    A read-only value. The sender makes one per message from its batch's fixed-size answer
    record, so it is a slotted class, not a frozen dataclass (whose `__init__` costs several
    times more), and its id is derived on first access: with `id_position` >= 0, `msg_id` is
    the batch's id prefix plus that position in hex (common.message.encode_msg_id's form)."""

    __slots__ = (
        "_broker_group",
        "_duplicate",
        "_full",
        "_id",
        "_offset",
        "_position",
        "_queue_id",
        "_topic",
    )

    def __init__(
        self,
        msg_id: str,
        topic: str,
        broker_group: str,
        queue_id: int,
        queue_offset: int,
        duplicate: bool = False,
        *,
        id_position: int = -1,
    ) -> None:
        self._id = msg_id
        self._position = id_position
        self._full: str | None = None
        self._topic = topic
        self._broker_group = broker_group
        self._queue_id = queue_id
        self._offset = queue_offset
        self._duplicate = duplicate

    @property
    def msg_id(self) -> str:
        if self._position < 0:
            return self._id
        # Derived from fields never written again, so two threads reading at once agree.
        full = self._full
        if full is None:
            full = self._full = self._id + format(self._position, POSITION_HEX)
        return full

    @property
    def topic(self) -> str:
        return self._topic

    @property
    def broker_group(self) -> str:
        return self._broker_group

    @property
    def queue_id(self) -> int:
        return self._queue_id

    @property
    def queue_offset(self) -> int:
        return self._offset

    @property
    def duplicate(self) -> bool:
        return self._duplicate

    def _key(self) -> tuple[str, str, str, int, int, bool]:
        return (
            self.msg_id,
            self._topic,
            self._broker_group,
            self._queue_id,
            self._offset,
            self._duplicate,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SendResult):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (
            f"SendResult(msg_id={self.msg_id!r}, topic={self._topic!r}, "
            f"broker_group={self._broker_group!r}, queue_id={self._queue_id}, "
            f"queue_offset={self._offset}, duplicate={self._duplicate})"
        )


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
