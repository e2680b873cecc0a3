"""The SDK's message values: what a producer sends, what a send returns, what a consumer gets.

Plain read-only values; conversion from wire and stored forms lives here and nowhere else.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import overload

from raftmq.common import stored_batch
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


class _DerivedId:
    """A message id derived on first read: with `_position` >= 0 it is the batch's id prefix
    `_id` plus that position in hex (common.message.encode_msg_id's form), else `_id` itself.
    Shared by SendResult and ReceivedMessage, which both get the prefix per batch."""

    __slots__ = ("_full", "_id", "_position")

    _id: str
    _position: int
    _full: str | None

    @property
    def msg_id(self) -> str:
        if self._position < 0:
            return self._id
        # Derived from fields never written again, so two threads reading at once agree.
        full = self._full
        if full is None:
            full = self._full = self._id + format(self._position, POSITION_HEX)
        return full


class SendResult(_DerivedId):
    """Where a message was stored. `duplicate`: an idempotent retry found it already stored (the
    offset and id are the original's; msg_id is "" if the broker no longer remembers them).

    A read-only value. The sender makes one per message from its batch's fixed-size answer
    record, so it is a slotted class, not a frozen dataclass (whose `__init__` costs several
    times more), and its id is derived on first access: with `id_position` >= 0, `msg_id` is
    the batch's id prefix plus that position in hex (common.message.encode_msg_id's form)."""

    __slots__ = (
        "_broker_group",
        "_duplicate",
        "_offset",
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


class SendResults(Sequence[SendResult]):
    """The results of a batch-first call's messages, in order: a read-only sequence over the
    results of each part the call was stored in (one per request; a `StoredRun` makes each
    SendResult only when it is read: issue 24, an answer costs per batch, not per message)."""

    __slots__ = ("_ends", "_runs")

    def __init__(self, runs: Sequence[Sequence[SendResult]]) -> None:
        self._runs = tuple(runs)
        ends, total = [], 0
        for run in self._runs:
            total += len(run)
            ends.append(total)
        self._ends = ends

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    @overload
    def __getitem__(self, i: int) -> SendResult: ...
    @overload
    def __getitem__(self, i: slice) -> list[SendResult]: ...
    def __getitem__(self, i: int | slice) -> SendResult | list[SendResult]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("send result index out of range")
        r = bisect.bisect_right(self._ends, i)
        run = self._runs[r]
        return run[i - (self._ends[r] - len(run))]

    def __iter__(self) -> Iterator[SendResult]:
        for run in self._runs:
            yield from run

    @property
    def duplicates(self) -> int:
        """How many of the messages an idempotent retry found stored already."""
        return sum(
            (len(run) if run.duplicate else 0)
            if isinstance(run, StoredRun)
            else sum(1 for r in run if r.duplicate)
            for run in self._runs
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # compares by value, like the list it stands for

    def __repr__(self) -> str:
        return f"SendResults({list(self)!r})"


class StoredRun(Sequence[SendResult]):
    """The results of `count` consecutive messages stored by one request, from the broker's
    fixed-size answer record: the k-th has queue offset `first_offset + k` (-1 throughout when
    the offsets are not known yet) and id position `first_position + k`; an empty `prefix` is a
    duplicate whose original the broker no longer remembers (no id, no offset)."""

    __slots__ = (
        "_broker_group",
        "_count",
        "_first_offset",
        "_first_position",
        "_prefix",
        "_queue_id",
        "_topic",
        "duplicate",
    )

    def __init__(
        self,
        prefix: str,
        topic: str,
        broker_group: str,
        queue_id: int,
        first_offset: int,
        first_position: int,
        count: int,
        duplicate: bool,
    ) -> None:
        self._prefix, self._topic, self._broker_group = prefix, topic, broker_group
        self._queue_id, self._first_offset, self._first_position = (
            queue_id,
            first_offset,
            first_position,
        )
        self._count, self.duplicate = count, duplicate

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, k: int) -> SendResult: ...
    @overload
    def __getitem__(self, k: slice) -> list[SendResult]: ...
    def __getitem__(self, k: int | slice) -> SendResult | list[SendResult]:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(self._count))]
        if k < 0:
            k += self._count
        if not 0 <= k < self._count:
            raise IndexError("send result index out of range")
        if not self._prefix:
            group, queue_id = self._broker_group, self._queue_id
            return SendResult("", self._topic, group, queue_id, -1, self.duplicate)
        offset = self._first_offset
        return SendResult(
            self._prefix,
            self._topic,
            self._broker_group,
            self._queue_id,
            offset + k if offset >= 0 else -1,
            self.duplicate,
            id_position=self._first_position + k,
        )

    def __iter__(self) -> Iterator[SendResult]:
        for k in range(self._count):
            yield self[k]


# ReceivedMessage's fields of a pulled v2 record not decoded yet (bits of `_unread`)
_BODY, _TAGS, _KEYS, _PROPS = 1, 2, 4, 8
_FIELD_NAMES = (
    "topic",
    "body",
    "tags",
    "keys",
    "properties",
    "broker_group",
    "queue_id",
    "queue_offset",
    "msg_id",
    "store_timestamp_ms",
    "born_timestamp_ms",
    "born_host",
    "reconsume_times",
)


class ReceivedMessage(_DerivedId):
    """A message as a consumer receives it. A read-only value.

    A message pulled in a v2 stored batch is made from its record (`lazy`): the batch's CRCs
    and the record's head were checked when it was pulled, and its body, tags, keys and
    properties are decoded the first time each is read (issue 24), so a consumer that reads
    only bodies never decodes the rest. A field a hostile producer wrote badly (text that is
    not UTF-8) raises MalformedBatchError when read, for that message alone."""

    __slots__ = (
        "_body",
        "_born_host",
        "_born_ms",
        "_group",
        "_keys",
        "_offset",
        "_props",
        "_queue_id",
        "_reconsume",
        "_src",
        "_store_ms",
        "_tags",
        "_topic",
        "_unread",
    )

    def __init__(
        self,
        topic: str,
        body: bytes,
        tags: str | None,
        keys: tuple[str, ...],
        properties: Mapping[str, str],
        broker_group: str,
        queue_id: int,
        queue_offset: int,
        msg_id: str,
        store_timestamp_ms: int,
        born_timestamp_ms: int,
        born_host: str,
        reconsume_times: int = 0,
    ) -> None:
        self._topic = topic
        self._body = body
        self._tags = tags
        self._keys = keys
        self._props = properties
        self._group = broker_group
        self._queue_id = queue_id
        self._offset = queue_offset
        self._id = msg_id
        self._position = -1
        self._full: str | None = None
        self._store_ms = store_timestamp_ms
        self._born_ms = born_timestamp_ms
        self._born_host = born_host
        self._reconsume = reconsume_times
        self._src: stored_batch.BatchMessage | None = None
        self._unread = 0

    @classmethod
    def lazy(
        cls,
        record: stored_batch.BatchMessage,
        broker_group: str,
        queue_offset: int,
        store_timestamp_ms: int,
        id_prefix: str,
        position: int,
    ) -> ReceivedMessage:
        """The message of a checked v2 record: its fields decoded when read, its id (`id_prefix`
        + `position` in hex) made when read."""
        m = cls.__new__(cls)
        m._src = record
        m._unread = _BODY | _TAGS | _KEYS | _PROPS
        m._body, m._tags, m._keys, m._props = b"", None, (), {}
        m._topic = record.topic
        m._group = broker_group
        m._queue_id = record.queue_id
        m._offset = queue_offset
        m._id, m._position, m._full = id_prefix, position, None
        m._store_ms = store_timestamp_ms
        m._born_ms = record.born_timestamp_ms
        m._born_host = record.born_host
        m._reconsume = 0
        return m

    # Each lazy field is decoded once and kept; two threads reading it at once both decode the
    # same bytes and store equal values (a bit set again only costs a second decode).

    @property
    def body(self) -> bytes:
        if self._unread & _BODY:
            assert self._src is not None
            self._body = self._src.body
            self._unread &= ~_BODY
        return self._body

    @property
    def tags(self) -> str | None:
        if self._unread & _TAGS:
            assert self._src is not None
            self._tags = self._src.tags
            self._unread &= ~_TAGS
        return self._tags

    @property
    def keys(self) -> tuple[str, ...]:
        if self._unread & _KEYS:
            assert self._src is not None
            self._keys = self._src.keys
            self._unread &= ~_KEYS
        return self._keys

    @property
    def properties(self) -> Mapping[str, str]:
        if self._unread & _PROPS:
            assert self._src is not None
            self._props = self._src.properties
            self._unread &= ~_PROPS
        return self._props

    @property
    def topic(self) -> str:
        return self._topic

    @property
    def broker_group(self) -> str:
        return self._group

    @property
    def queue_id(self) -> int:
        return self._queue_id

    @property
    def queue_offset(self) -> int:
        return self._offset

    @property
    def store_timestamp_ms(self) -> int:
        return self._store_ms

    @property
    def born_timestamp_ms(self) -> int:
        return self._born_ms

    @property
    def born_host(self) -> str:
        return self._born_host

    @property
    def reconsume_times(self) -> int:
        return self._reconsume

    def replace(
        self, *, topic: str | None = None, reconsume_times: int | None = None
    ) -> ReceivedMessage:
        """A copy with another topic or count of earlier deliveries (what a listener of a
        retried message sees); still lazy where this one is."""
        m = ReceivedMessage.__new__(ReceivedMessage)
        for name in _DerivedId.__slots__ + ReceivedMessage.__slots__:
            setattr(m, name, getattr(self, name))
        if topic is not None:
            m._topic = topic
        if reconsume_times is not None:
            m._reconsume = reconsume_times
        return m

    def _fields(self) -> tuple[object, ...]:
        return (
            self._topic,
            self.body,
            self.tags,
            self.keys,
            self.properties,
            self._group,
            self._queue_id,
            self._offset,
            self.msg_id,
            self._store_ms,
            self._born_ms,
            self._born_host,
            self._reconsume,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ReceivedMessage):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # a value with a dict in it, as before

    def __reduce__(self) -> tuple[type[ReceivedMessage], tuple[object, ...]]:
        # pickled decoded (a record view holds the whole pulled batch and may not pickle)
        return (ReceivedMessage, self._fields())

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={v!r}" for n, v in zip(_FIELD_NAMES, self._fields(), strict=True))
        return f"ReceivedMessage({inner})"

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
