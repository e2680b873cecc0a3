"""Sans-I/O codec of one raftlog chunk: a produce batch, an offset commit or reset, a topic change.
Decoding checks every length and raises only MalformedBatchError (never IndexError or
struct.error); it never unpickles. Fields are little-endian, strings utf-8."""

from __future__ import annotations

import enum
import struct
from collections.abc import Mapping
from dataclasses import dataclass, fields

from raftmq.common.group_config import VALUE_SIZE, GroupConfig, decode_value, encode_value
from raftmq.common.message import Message
from raftmq.common.topic_config import Permission, TopicConfig


class MalformedBatchError(ValueError):
    """A record batch whose bytes do not decode: a bug or corruption, never served as data."""


class UnsupportedBatchError(MalformedBatchError):
    """A batch of a newer format than this code reads (a version or a header flag it does not
    know): refused, never decoded as if it were a format it knows. The text says to upgrade."""


VERSION = 1


class Kind(enum.IntEnum):
    """The first byte of every chunk; the second is the format version."""

    PRODUCE = 1
    COMMIT_OFFSET = 2
    RESET_OFFSETS = 3
    TOPIC_CONFIG = 4
    GROUP_DELETE = 5  # a consumer group's committed offsets, leases and POP state go (issue 26)
    PURGE = 6  # a topic's queues' min offsets move up: the messages before are gone (issue 26)
    GROUP_CONFIG = 7  # a consumer group's retry limit, consume and broadcast switches (issue 26)
    DELIVER = 10  # scheduled messages fall due: ConsumeQueue rows of their real topic (issue 16)
    # Transactions (broker/txn_records.py encodes them): an end, a check sent, a move.
    TXN_END = 20
    TXN_CHECK = 21
    TXN_MOVED = 22
    RETENTION = 40  # broker/retention.py: a replicated retention cut (its own codec)
    QUEUE_LOCK = 30  # orderly consumption: lock or unlock a consumer's queues (issue 16)
    # POP consumption (RocketMQ 5's SimpleConsumer, issue 17): one receive batch, one ack batch.
    POP_RECEIVE = 60
    POP_ACK = 61


class TopicOp(enum.IntEnum):
    CREATE = 1  # create if absent; an existing topic is left as it is
    UPDATE = 2  # create or replace
    DELETE = 3


@dataclass(frozen=True, slots=True)
class ProducerSequence:
    """Idempotent producer: the batch's messages carry sequences first_sequence.. in order."""

    producer_id: str
    first_sequence: int
    # Several batches of a queue in flight (issue 14): refuse this batch, unstored, if it skips
    # past the next expected sequence; False accepts a gap (the producer gave earlier ones up).
    strict: bool = False


@dataclass(frozen=True, slots=True)
class ProduceBatch:
    """Messages for one queue. Every message's topic equals the batch's. The leader stamps
    store_timestamp_ms; queue offsets are not here: every replica's dispatcher assigns them."""

    topic: str
    queue_id: int
    store_timestamp_ms: int
    messages: tuple[Message, ...]
    producer: ProducerSequence | None = None
    # Delayed delivery: the messages get no ConsumeQueue rows now; each enters the schedule at
    # its TIMER_OUT_MS (set by the leader), and a DELIVER record adds the rows when it is due.
    scheduled: bool = False


@dataclass(frozen=True, slots=True)
class DeliverKey:
    """A scheduled message in a DELIVER record: its due time and where it is stored."""

    due_ms: int
    raft_index: int
    slot: int
    position: int


@dataclass(frozen=True, slots=True)
class Deliver:
    """The leader's "these are due" (broker/delivery.py): `now_ms` is the leader's clock when it
    decided; apply delivers a key only if due_ms <= now_ms and it is still scheduled."""

    now_ms: int
    keys: tuple[DeliverKey, ...]


@dataclass(frozen=True, slots=True)
class CommitOffset:
    group: str
    topic: str
    queue_id: int
    offset: int


@dataclass(frozen=True, slots=True)
class GroupDelete:
    """`raftmq group delete`: every committed offset, queue lease and POP state of the group
    on this broker group goes (mqadmin deleteSubGroup --removeOffset)."""

    group: str


@dataclass(frozen=True, slots=True)
class GroupConfigChange:
    """`raftmq group config` (mqadmin updateSubGroup): the group's whole config on this broker
    group, replacing the one before (the leader merges the fields an admin changed)."""

    config: GroupConfig


@dataclass(frozen=True, slots=True)
class PurgeQueues:
    """`raftmq topic purge`: each named queue's min offset moves up to its offset (never past
    the queue's end, never down), as kafka-delete-records moves a log start offset."""

    topic: str
    offsets: dict[int, int]  # queue id -> new min offset


@dataclass(frozen=True, slots=True)
class ResetOffsets:
    """Backtracking (or skipping) a group's offsets, e.g. to a timestamp."""

    group: str
    topic: str
    offsets: Mapping[int, int]  # queue_id -> offset


@dataclass(frozen=True, slots=True)
class TopicConfigChange:
    op: TopicOp
    config: TopicConfig  # for DELETE only the name matters


class QueueLockOp(enum.IntEnum):
    LOCK = 1  # take free or expired queues, renew own ones (RocketMQ lockBatchMQ)
    UNLOCK = 2  # let go of own queues (unlockBatchMQ)


@dataclass(frozen=True, slots=True)
class QueueLockChange:
    """An orderly consumer's lock request for queues of one topic on this broker group. The
    leader stamps the time and the lease, so every replica applies it alike."""

    op: QueueLockOp
    group: str
    client_id: str
    topic: str
    queue_ids: tuple[int, ...]
    timestamp_ms: int
    lease_ms: int


NO_OFFSET = (1 << 64) - 1  # a PopQueuePart field that is not set


@dataclass(frozen=True, slots=True)
class PopQueuePart:
    """What one receive does to one queue of a consumer group (common/pop.py's transitions, in
    this order): forget `drops` (dead-lettered, or gone from the queue); with `reset_to` set,
    move a cursor still at `pulled_from` there (the pull found it outside the queue); hand out
    `redeliver` again where still due; claim the first `take` of `new_offsets`, pulled from
    `pulled_from` up to `next_offset` (none matched: skip to it). `init_offset` is the cursor
    of a queue the group never popped."""

    queue_id: int
    init_offset: int
    fifo: bool
    redeliver: tuple[int, ...] = ()
    drops: tuple[int, ...] = ()
    pulled_from: int = NO_OFFSET  # NO_OFFSET: nothing pulled
    next_offset: int = 0
    take: int = 0
    new_offsets: tuple[int, ...] = ()
    reset_to: int = NO_OFFSET


@dataclass(frozen=True, slots=True)
class PopReceive:
    """One POP receive of a consumer group on this broker group, stamped by the leader with its
    time: every replica applies it at `timestamp_ms` (invisible until that + invisible_ms)."""

    group: str
    topic: str
    timestamp_ms: int
    invisible_ms: int
    max_inflight: int
    parts: tuple[PopQueuePart, ...]


@dataclass(frozen=True, slots=True)
class PopAckEntry:
    queue_id: int
    offset: int
    token: int


@dataclass(frozen=True, slots=True)
class PopAck:
    """Acks (invisible_ms 0) or changes of the invisible duration (invisible_ms > 0, from
    `timestamp_ms`) of received messages, each named by its receipt handle's queue, offset and
    token."""

    group: str
    topic: str
    timestamp_ms: int
    invisible_ms: int
    entries: tuple[PopAckEntry, ...]


BrokerRecord = (
    ProduceBatch
    | CommitOffset
    | ResetOffsets
    | GroupDelete
    | GroupConfigChange
    | PurgeQueues
    | TopicConfigChange
    | Deliver
    | QueueLockChange
    | PopReceive
    | PopAck
)
Bytes = bytes | bytearray | memoryview  # decoders copy anything but bytes once, up front

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_PROP_LENS = struct.Struct("<HI")
_HEAD = struct.Struct("<BB")
# kind, version, flags, topic length, queue id, store timestamp
_PRODUCE_HEAD = struct.Struct("<BBBHIQ")
# body length, flag, born timestamp, tag length (NO_TAG = None), host length, #keys, #properties
_MSG_HEAD = struct.Struct("<IiqHHHH")
_QUEUE_OFFSET = struct.Struct("<IQ")
# read queues, write queues, permission, flags
_TOPIC_BODY = struct.Struct("<HHBB")
_DELIVER_HEAD = struct.Struct("<QI")  # now ms, key count
_DELIVER_KEY = struct.Struct("<QQII")  # due ms, raft index, slot, position
# store timestamp, lease ms, queue count
_LOCK_BODY = struct.Struct("<QII")
_POP_HEAD = struct.Struct("<QIII")  # timestamp, invisible ms, max in flight, #parts / #entries
# queue id, init offset, fifo, pulled from, next offset, take, reset to, #redeliver, #drops, #new
_POP_PART = struct.Struct("<IQBQQIQIII")
_POP_ACK_ENTRY = struct.Struct("<IQQ")  # queue id, offset, token

# A frozen dataclass __init__ costs ~2.5 us (one object.__setattr__ per field); decoding 1000
# messages would spend most of its time there. The decoder fills the slots through their
# descriptors instead (~1 us); the assertion keeps it in step with Message's fields.
_MESSAGE_FIELDS = ("topic", "body", "tags", "keys", "properties", "flag", "born_timestamp_ms",
                   "born_host")  # fmt: skip
if tuple(f.name for f in fields(Message)) != _MESSAGE_FIELDS:
    raise RuntimeError("Message's fields changed: update the record batch decoder")
_MESSAGE_SETTERS = tuple(Message.__dict__[name].__set__ for name in _MESSAGE_FIELDS)

_HAS_PRODUCER = 0x01
_SCHEDULED = 0x02
# With _HAS_PRODUCER only: ProducerSequence.strict. 0x04, not 0x02: main gives 0x02 to the
# delayed-delivery branch's scheduled batches.
_STRICT_SEQUENCE = 0x04
_NO_TAG = 0xFFFF
_ORDERED = 0x01
_AUTO_CREATED = 0x02
_U16_MAX = 0xFFFF
_U32_MAX = 0xFFFF_FFFF
_U64_MAX = (1 << 64) - 1


# ---- encoding ----------------------------------------------------------------------------------


def _queue_offsets(data: bytes, r: _Reader, what: str) -> dict[int, int]:
    """A count, then (queue id, offset) pairs to the end, queue ids strictly increasing."""
    (count,) = r.unpack(_U32)
    if count * _QUEUE_OFFSET.size != len(data) - r.pos:
        raise MalformedBatchError(f"{what} declares {count} queues that do not fit")
    offsets: dict[int, int] = {}
    last = -1
    for queue_id, offset in _QUEUE_OFFSET.iter_unpack(data[r.pos :]):
        if queue_id <= last:
            raise MalformedBatchError(f"{what} queue ids are not strictly increasing")
        offsets[queue_id] = offset
        last = queue_id
    return offsets


def encode(record: BrokerRecord) -> bytes:
    """Bytes of one chunk. Raises ValueError for values the format cannot carry (the caller's
    fault: validate messages first)."""
    try:
        if isinstance(record, ProduceBatch):
            return _encode_produce(record)
        if isinstance(record, CommitOffset):
            _check_offset(record.queue_id, record.offset)
            return b"".join(
                (
                    _HEAD.pack(Kind.COMMIT_OFFSET, VERSION),
                    _short(record.group),
                    _short(record.topic),
                    _QUEUE_OFFSET.pack(record.queue_id, record.offset),
                )
            )
        if isinstance(record, PurgeQueues):
            parts = [_HEAD.pack(Kind.PURGE, VERSION), _short(record.topic)]
            parts.append(_U32.pack(len(record.offsets)))
            for queue_id in sorted(record.offsets):  # canonical: one encoding per value
                _check_offset(queue_id, record.offsets[queue_id])
                parts.append(_QUEUE_OFFSET.pack(queue_id, record.offsets[queue_id]))
            return b"".join(parts)
        if isinstance(record, GroupDelete):
            return _HEAD.pack(Kind.GROUP_DELETE, VERSION) + _short(record.group)
        if isinstance(record, GroupConfigChange):
            return b"".join(
                (
                    _HEAD.pack(Kind.GROUP_CONFIG, VERSION),
                    _short(record.config.group),
                    encode_value(record.config),
                )
            )
        if isinstance(record, ResetOffsets):
            parts = [
                _HEAD.pack(Kind.RESET_OFFSETS, VERSION),
                _short(record.group),
                _short(record.topic),
                _U32.pack(len(record.offsets)),
            ]
            for queue_id in sorted(record.offsets):  # canonical: one encoding per value
                _check_offset(queue_id, record.offsets[queue_id])
                parts.append(_QUEUE_OFFSET.pack(queue_id, record.offsets[queue_id]))
            return b"".join(parts)
        if isinstance(record, TopicConfigChange):
            cfg = record.config
            flags = (_ORDERED if cfg.ordered else 0) | (_AUTO_CREATED if cfg.auto_created else 0)
            return b"".join(
                (
                    struct.pack("<BBB", Kind.TOPIC_CONFIG, VERSION, record.op),
                    _short(cfg.name),
                    _TOPIC_BODY.pack(cfg.read_queue_nums, cfg.write_queue_nums, cfg.perm, flags),
                )
            )
        if isinstance(record, Deliver):
            return b"".join(
                (
                    _HEAD.pack(Kind.DELIVER, VERSION),
                    _DELIVER_HEAD.pack(record.now_ms, len(record.keys)),
                    *(
                        _DELIVER_KEY.pack(k.due_ms, k.raft_index, k.slot, k.position)
                        for k in record.keys
                    ),
                )
            )
        if isinstance(record, QueueLockChange):
            return b"".join(
                (
                    struct.pack("<BBB", Kind.QUEUE_LOCK, VERSION, record.op),
                    _short(record.group),
                    _short(record.client_id),
                    _short(record.topic),
                    _LOCK_BODY.pack(record.timestamp_ms, record.lease_ms, len(record.queue_ids)),
                    b"".join(_U32.pack(q) for q in record.queue_ids),
                )
            )
        if isinstance(record, PopReceive):
            return _encode_pop_receive(record)
        if isinstance(record, PopAck):
            return b"".join(
                (
                    _HEAD.pack(Kind.POP_ACK, VERSION),
                    _short(record.group),
                    _short(record.topic),
                    _POP_HEAD.pack(
                        record.timestamp_ms, record.invisible_ms, 0, len(record.entries)
                    ),
                    *(_POP_ACK_ENTRY.pack(e.queue_id, e.offset, e.token) for e in record.entries),
                )
            )
    except struct.error as exc:
        raise ValueError(f"a field does not fit the record batch format: {exc}") from exc
    raise TypeError(f"not a broker record: {type(record).__name__}")


def _encode_pop_receive(rec: PopReceive) -> bytes:
    parts = [
        _HEAD.pack(Kind.POP_RECEIVE, VERSION),
        _short(rec.group),
        _short(rec.topic),
        _POP_HEAD.pack(rec.timestamp_ms, rec.invisible_ms, rec.max_inflight, len(rec.parts)),
    ]
    for p in rec.parts:
        parts.append(
            _POP_PART.pack(
                p.queue_id,
                p.init_offset,
                int(p.fifo),
                p.pulled_from,
                p.next_offset,
                p.take,
                p.reset_to,
                len(p.redeliver),
                len(p.drops),
                len(p.new_offsets),
            )
        )
        parts.extend(_U64.pack(o) for o in (*p.redeliver, *p.drops, *p.new_offsets))
    return b"".join(parts)


def _decode_pop_receive(data: bytes) -> PopReceive:
    r = _Reader(data, _HEAD.size)
    group, topic = r.short(), r.short()
    ts, invisible, max_inflight, n = r.unpack(_POP_HEAD)
    if n * _POP_PART.size > len(data) - r.pos:
        raise MalformedBatchError(f"pop receive declares {n} queues that do not fit")
    parts = []
    for _ in range(n):
        qid, init, fifo, pulled, nxt, take, reset, n_re, n_drop, n_new = r.unpack(_POP_PART)
        total = n_re + n_drop + n_new
        if total * _U64.size > len(data) - r.pos:
            raise MalformedBatchError(f"pop receive declares {total} offsets that do not fit")
        offsets = tuple(o for (o,) in _U64.iter_unpack(r.take(total * _U64.size)))
        parts.append(
            PopQueuePart(
                qid,
                init,
                bool(fifo),
                offsets[:n_re],
                offsets[n_re : n_re + n_drop],
                pulled,
                nxt,
                take,
                offsets[n_re + n_drop :],
                reset,
            )
        )
    if r.pos != len(data):
        raise MalformedBatchError(f"pop receive has {len(data) - r.pos} stray bytes")
    return PopReceive(group, topic, ts, invisible, max_inflight, tuple(parts))


def _check_offset(queue_id: int, offset: int) -> None:
    if not (0 <= queue_id <= _U32_MAX and 0 <= offset <= _U64_MAX):
        raise ValueError(f"queue id {queue_id} / offset {offset} out of range")


def _short(s: str) -> bytes:
    b = s.encode("utf-8")
    if len(b) > _U16_MAX:
        raise ValueError(f"string of {len(b)} bytes exceeds {_U16_MAX}: {s[:40]!r}...")
    return _U16.pack(len(b)) + b


def _encode_produce(batch: ProduceBatch) -> bytes:
    # Layout: _PRODUCE_HEAD, topic, [u16 producer id length, producer id, u64 first sequence],
    # u32 message count, then per message: _MSG_HEAD, tag, born host, keys (u16 length + bytes
    # each), properties (_PROP_LENS + name + value each), body.
    if not batch.messages:
        raise ValueError("a produce batch carries at least one message")
    topic = batch.topic
    topic_b = topic.encode("utf-8")
    flags = _SCHEDULED if batch.scheduled else 0
    if batch.producer is not None:
        flags |= _HAS_PRODUCER | (_STRICT_SEQUENCE if batch.producer.strict else 0)
    parts: list[bytes] = [
        _PRODUCE_HEAD.pack(
            Kind.PRODUCE, VERSION, flags, len(topic_b), batch.queue_id, batch.store_timestamp_ms
        ),
        topic_b,
    ]
    if batch.producer is not None:
        parts.append(_short(batch.producer.producer_id))
        parts.append(_U64.pack(batch.producer.first_sequence))
    parts.append(_U32.pack(len(batch.messages)))
    append = parts.append
    pack_head, pack_u16, pack_prop = _MSG_HEAD.pack, _U16.pack, _PROP_LENS.pack
    # Born hosts and tags repeat across a batch; encode each distinct string once.
    seen: dict[str, bytes] = {}
    for m in batch.messages:
        if m.topic != topic:
            raise ValueError(f"message for topic {m.topic!r} in a batch for topic {topic!r}")
        tags = m.tags
        if tags is None:
            tag_b, tag_len = b"", _NO_TAG
        else:
            tag_b = seen.get(tags) or seen.setdefault(tags, tags.encode("utf-8"))
            tag_len = len(tag_b)
            if tag_len >= _NO_TAG:
                raise ValueError(f"tag of {tag_len} bytes is too long")
        host = m.born_host
        host_b = seen.get(host) or seen.setdefault(host, host.encode("utf-8"))
        body = m.body
        append(
            pack_head(
                len(body),
                m.flag,
                m.born_timestamp_ms,
                tag_len,
                len(host_b),
                len(m.keys),
                len(m.properties),
            )
        )
        append(tag_b)
        append(host_b)
        for key in m.keys:
            kb = key.encode("utf-8")
            append(pack_u16(len(kb)))
            append(kb)
        for name, value in m.properties.items():
            nb, vb = name.encode("utf-8"), value.encode("utf-8")
            append(pack_prop(len(nb), len(vb)))
            append(nb)
            append(vb)
        append(body)
    return b"".join(parts)


# ---- decoding ----------------------------------------------------------------------------------


def decode(data: Bytes) -> BrokerRecord:
    """The record in `data`; MalformedBatchError if any length, kind, version or string is bad."""
    if not isinstance(data, bytes):
        data = bytes(data)  # memoryview / bytearray: slices must be hashable, immutable bytes
    if len(data) < _HEAD.size:
        raise MalformedBatchError(f"chunk of {len(data)} bytes is shorter than its header")
    kind, version = data[0], data[1]
    if version != VERSION:
        raise MalformedBatchError(f"record batch version {version} is not supported ({VERSION})")
    try:
        if kind == Kind.PRODUCE:
            return _decode_produce(data)[0]
        if kind == Kind.COMMIT_OFFSET:
            r = _Reader(data, _HEAD.size)
            group, topic = r.short(), r.short()
            queue_id, offset = r.unpack(_QUEUE_OFFSET)
            r.end()
            return CommitOffset(group, topic, queue_id, offset)
        if kind == Kind.PURGE:
            r = _Reader(data, _HEAD.size)
            topic = r.short()
            return PurgeQueues(topic, _queue_offsets(data, r, "purge"))
        if kind == Kind.GROUP_DELETE:
            r = _Reader(data, _HEAD.size)
            group = r.short()
            r.end()
            return GroupDelete(group)
        if kind == Kind.GROUP_CONFIG:
            r = _Reader(data, _HEAD.size)
            group = r.short()
            value = r.take(VALUE_SIZE)
            r.end()
            try:
                return GroupConfigChange(decode_value(group, value))
            except ValueError as exc:
                raise MalformedBatchError(f"group config record: {exc}") from exc
        if kind == Kind.RESET_OFFSETS:
            r = _Reader(data, _HEAD.size)
            group, topic = r.short(), r.short()
            return ResetOffsets(group, topic, _queue_offsets(data, r, "offset reset"))
        if kind == Kind.TOPIC_CONFIG:
            r = _Reader(data, 3)
            if len(data) < 3 or data[2] not in TopicOp._value2member_map_:
                raise MalformedBatchError("topic change with a missing or unknown operation")
            op = TopicOp(data[2])
            name = r.short()
            read_n, write_n, perm, flags = r.unpack(_TOPIC_BODY)
            r.end()
            if flags & ~(_ORDERED | _AUTO_CREATED):
                raise MalformedBatchError(f"topic change with unknown flags {flags:#x}")
            cfg = TopicConfig(
                name,
                read_n,
                write_n,
                Permission(perm),
                bool(flags & _ORDERED),
                bool(flags & _AUTO_CREATED),
            )
            return TopicConfigChange(op, cfg)
        if kind == Kind.DELIVER:
            r = _Reader(data, _HEAD.size)
            now_ms, count = r.unpack(_DELIVER_HEAD)
            if count * _DELIVER_KEY.size != len(data) - r.pos:
                raise MalformedBatchError(f"deliver record declares {count} keys that do not fit")
            keys = tuple(DeliverKey(*k) for k in _DELIVER_KEY.iter_unpack(data[r.pos :]))
            return Deliver(now_ms, keys)
        if kind == Kind.QUEUE_LOCK:
            if len(data) < 3 or data[2] not in QueueLockOp._value2member_map_:
                raise MalformedBatchError("queue lock with a missing or unknown operation")
            r = _Reader(data, 3)
            group, client_id, topic = r.short(), r.short(), r.short()
            ts, lease, count = r.unpack(_LOCK_BODY)
            if count * _U32.size != len(data) - r.pos:
                raise MalformedBatchError(f"queue lock declares {count} queues that do not fit")
            queue_ids = tuple(q for (q,) in _U32.iter_unpack(data[r.pos :]))
            return QueueLockChange(QueueLockOp(data[2]), group, client_id, topic, queue_ids, ts,
                                   lease)  # fmt: skip
        if kind == Kind.POP_RECEIVE:
            return _decode_pop_receive(data)
        if kind == Kind.POP_ACK:
            r = _Reader(data, _HEAD.size)
            group, topic = r.short(), r.short()
            ts, invisible, _, count = r.unpack(_POP_HEAD)
            if count * _POP_ACK_ENTRY.size != len(data) - r.pos:
                raise MalformedBatchError(f"pop ack declares {count} entries that do not fit")
            entries = tuple(PopAckEntry(*e) for e in _POP_ACK_ENTRY.iter_unpack(data[r.pos :]))
            return PopAck(group, topic, ts, invisible, entries)
    except UnicodeDecodeError as exc:
        raise MalformedBatchError(f"invalid utf-8 in a {_kind_name(kind)} record: {exc}") from exc
    except struct.error as exc:  # a safety net: lengths are checked before every unpack
        raise MalformedBatchError(f"truncated {_kind_name(kind)} record: {exc}") from exc
    raise MalformedBatchError(f"unknown record kind {kind}")


def _kind_name(kind: int) -> str:
    return Kind(kind).name if kind in Kind._value2member_map_ else f"kind-{kind}"


class _Reader:
    """Bounds-checked cursor for the small records; the produce path inlines the same checks."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes, pos: int) -> None:
        self.data = data
        self.pos = pos

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            raise MalformedBatchError(
                f"field of {n} bytes at offset {self.pos} overruns the {len(self.data)}-byte chunk"
            )
        b = self.data[self.pos : end]
        self.pos = end
        return b

    def unpack(self, s: struct.Struct) -> tuple[int, ...]:
        return tuple(s.unpack(self.take(s.size)))

    def short(self) -> str:
        (n,) = self.unpack(_U16)
        return self.take(n).decode("utf-8")

    def end(self) -> None:
        if self.pos != len(self.data):
            raise MalformedBatchError(f"{len(self.data) - self.pos} trailing bytes after record")


def _overrun(what: str, pos: int, n: int, size: int) -> MalformedBatchError:
    return MalformedBatchError(
        f"{what} of {n} bytes at offset {pos} overruns the {size}-byte chunk"
    )


@dataclass(frozen=True, slots=True)
class ProduceHeader:
    """A produce batch without its messages: enough to decode one message by its byte offset."""

    topic: str
    queue_id: int
    store_timestamp_ms: int
    producer: ProducerSequence | None
    count: int
    messages_at: int  # byte offset of the first message
    scheduled: bool = False


def decode_produce_header(data: Bytes) -> ProduceHeader:
    if not isinstance(data, bytes):
        data = bytes(data)
    if len(data) < _PRODUCE_HEAD.size or data[0] != Kind.PRODUCE:
        raise MalformedBatchError("not a produce batch")
    if data[1] != VERSION:
        raise MalformedBatchError(f"record batch version {data[1]} is not supported ({VERSION})")
    try:
        return _produce_header(data)
    except UnicodeDecodeError as exc:
        raise MalformedBatchError(f"invalid utf-8 in a produce batch header: {exc}") from exc


def decode_message_at(
    data: Bytes, header: ProduceHeader, offset_bytes: int, strings: dict[bytes, str] | None = None
) -> Message:
    """The message whose record starts at `offset_bytes` (a ConsumeQueue row says where),
    without decoding the rest of the batch. `strings`: a cache of decoded tags and hosts that
    the caller keeps across the messages it decodes (they repeat)."""
    if not isinstance(data, bytes):
        data = bytes(data)
    if not header.messages_at <= offset_bytes < len(data):
        raise MalformedBatchError(f"no message can start at byte {offset_bytes}")
    try:
        msg, _ = _read_message(
            data, offset_bytes, len(data), header.topic, {} if strings is None else strings
        )
    except UnicodeDecodeError as exc:
        raise MalformedBatchError(f"invalid utf-8 in a message: {exc}") from exc
    return msg


def decode_with_offsets(data: Bytes) -> tuple[BrokerRecord, tuple[int, ...]]:
    """decode(), plus for a produce batch the byte offset where each message's record starts
    (what ConsumeQueue rows keep); () for other records."""
    if not isinstance(data, bytes):
        data = bytes(data)
    if len(data) >= _HEAD.size and data[0] == Kind.PRODUCE and data[1] == VERSION:
        try:
            return _decode_produce(data)
        except UnicodeDecodeError as exc:
            raise MalformedBatchError(f"invalid utf-8 in a produce batch: {exc}") from exc
    return decode(data), ()


def _produce_header(data: bytes) -> ProduceHeader:
    # Inline bounds checks rather than a _Reader: the dispatcher parses one header per batch.
    size = len(data)
    _, _, flags, topic_len, queue_id, store_ts = _PRODUCE_HEAD.unpack_from(data, 0)
    if flags & ~(_HAS_PRODUCER | _SCHEDULED | _STRICT_SEQUENCE) or (
        flags & _STRICT_SEQUENCE and not flags & _HAS_PRODUCER
    ):
        raise MalformedBatchError(f"produce batch with unknown flags {flags:#x}")
    pos = _PRODUCE_HEAD.size
    end = pos + topic_len
    if end > size:
        raise _overrun("topic", pos, topic_len, size)
    topic = data[pos:end].decode("utf-8")
    pos = end
    producer = None
    if flags & _HAS_PRODUCER:
        if pos + 2 > size:
            raise _overrun("producer id length", pos, 2, size)
        (n,) = _U16.unpack_from(data, pos)
        pos += 2
        end = pos + n
        if end + 8 > size:
            raise _overrun("producer id and sequence", pos, n + 8, size)
        producer_id = data[pos:end].decode("utf-8")
        (first_seq,) = _U64.unpack_from(data, end)
        pos = end + 8
        producer = ProducerSequence(producer_id, first_seq, bool(flags & _STRICT_SEQUENCE))
    if pos + 4 > size:
        raise _overrun("message count", pos, 4, size)
    (count,) = _U32.unpack_from(data, pos)
    pos += 4
    if count == 0 or count * _MSG_HEAD.size > size - pos:
        raise MalformedBatchError(f"produce batch declares {count} messages that do not fit")
    return ProduceHeader(topic, queue_id, store_ts, producer, count, pos, bool(flags & _SCHEDULED))


def _decode_produce(data: bytes) -> tuple[ProduceBatch, tuple[int, ...]]:
    size = len(data)
    if size < _PRODUCE_HEAD.size:
        raise MalformedBatchError("produce batch shorter than its header")
    header = _produce_header(data)
    topic = header.topic
    pos = header.messages_at
    messages: list[Message] = []
    offsets: list[int] = []
    strings: dict[bytes, str] = {}  # tags and hosts repeat across a batch: decode each once
    read = _read_message
    for _ in range(header.count):
        offsets.append(pos)
        m, pos = read(data, pos, size, topic, strings)
        messages.append(m)
    if pos != size:
        raise MalformedBatchError(f"{size - pos} trailing bytes after {header.count} messages")
    batch = ProduceBatch(
        topic,
        header.queue_id,
        header.store_timestamp_ms,
        tuple(messages),
        header.producer,
        header.scheduled,
    )
    return batch, tuple(offsets)


@dataclass(frozen=True, slots=True)
class ProduceScan:
    """What the dispatcher indexes of a produce batch, by column, without a Message per
    message (issue 14: per batch, not per message, on the servers' hot path)."""

    header: ProduceHeader
    offsets: tuple[int, ...]  # byte offset of each message's record in the chunk
    body_sizes: tuple[int, ...]
    tags: tuple[str | None, ...]
    keys: tuple[tuple[str, ...], ...]  # per message as stored; () when no message has keys


def scan_produce(data: bytes) -> ProduceScan:
    """A produce chunk's index columns. Checks exactly what decode_with_offsets checks (every
    length, utf-8 of every string, no property twice in a message, no trailing bytes), so a
    chunk one refuses the other refuses too; it makes no Message objects. `data` is a v1
    produce chunk (the caller checked kind and version)."""
    size = len(data)
    if size < _PRODUCE_HEAD.size:
        raise MalformedBatchError("produce batch shorter than its header")
    try:
        header = _produce_header(data)
        pos = header.messages_at
        offsets: list[int] = []
        sizes: list[int] = []
        tags: list[str | None] = []
        keys: list[tuple[str, ...]] = []
        any_keys = False
        strings: dict[bytes, str] = {}  # tags and hosts repeat across a batch
        unpack_head, unpack_u16, unpack_prop = _unpack_head, _unpack_u16, _unpack_prop
        no_tag = _NO_TAG
        for _ in range(header.count):
            offsets.append(pos)
            if pos + 24 > size:  # _MSG_HEAD.size
                raise _overrun("message header", pos, 24, size)
            body_len, _, _, tag_len, host_len, n_keys, n_props = unpack_head(data, pos)
            pos += 24
            tag: str | None = None
            if tag_len != no_tag:
                end = pos + tag_len
                if end > size:
                    raise _overrun("tag", pos, tag_len, size)
                raw = data[pos:end]
                tag = strings.get(raw)
                if tag is None:
                    tag = strings[raw] = raw.decode("utf-8")
                pos = end
            tags.append(tag)
            end = pos + host_len
            if end > size:
                raise _overrun("born host", pos, host_len, size)
            raw = data[pos:end]
            if raw not in strings:
                strings[raw] = raw.decode("utf-8")
            pos = end
            if n_keys:
                any_keys = True
                key_list = []
                for _ in range(n_keys):
                    if pos + 2 > size:
                        raise _overrun("key length", pos, 2, size)
                    (n,) = unpack_u16(data, pos)
                    pos += 2
                    end = pos + n
                    if end > size:
                        raise _overrun("key", pos, n, size)
                    key_list.append(data[pos:end].decode("utf-8"))
                    pos = end
                keys.append(tuple(key_list))
            else:
                keys.append(())
            if n_props:
                names: set[str] = set()
                for _ in range(n_props):
                    if pos + 6 > size:
                        raise _overrun("property lengths", pos, 6, size)
                    name_len, value_len = unpack_prop(data, pos)
                    pos += 6
                    end = pos + name_len + value_len
                    if end > size:
                        raise _overrun("property", pos, name_len + value_len, size)
                    name = data[pos : pos + name_len].decode("utf-8")
                    if name in names:
                        raise MalformedBatchError(f"property {name!r} appears twice in one message")
                    names.add(name)
                    data[pos + name_len : end].decode("utf-8")  # checked, as the decoder does
                    pos = end
            end = pos + body_len
            if end > size:
                raise _overrun("body", pos, body_len, size)
            sizes.append(body_len)
            pos = end
    except UnicodeDecodeError as exc:
        raise MalformedBatchError(f"invalid utf-8 in a produce batch: {exc}") from exc
    if pos != size:
        raise MalformedBatchError(f"{size - pos} trailing bytes after {header.count} messages")
    return ProduceScan(
        header, tuple(offsets), tuple(sizes), tuple(tags), tuple(keys) if any_keys else ()
    )


def is_produce_v1(data: Bytes) -> bool:
    """A produce chunk of this module's format (scan_produce reads it)."""
    return len(data) >= _HEAD.size and data[0] == Kind.PRODUCE and data[1] == VERSION


_unpack_head, _unpack_u16, _unpack_prop = (
    _MSG_HEAD.unpack_from,
    _U16.unpack_from,
    _PROP_LENS.unpack_from,
)
_new = object.__new__
_set_topic, _set_body, _set_tags, _set_keys, _set_props, _set_flag, _set_born, _set_host = (
    _MESSAGE_SETTERS
)


def _read_message(
    data: bytes, pos: int, size: int, topic: str, strings: dict[bytes, str]
) -> tuple[Message, int]:
    """One message record at `pos`, every length checked; returns it and the next position."""
    if pos + 24 > size:  # _MSG_HEAD.size
        raise _overrun("message header", pos, 24, size)
    body_len, flag, born_ts, tag_len, host_len, n_keys, n_props = _unpack_head(data, pos)
    pos += 24
    tags: str | None = None
    if tag_len != _NO_TAG:
        end = pos + tag_len
        if end > size:
            raise _overrun("tag", pos, tag_len, size)
        raw = data[pos:end]
        tags = strings.get(raw)
        if tags is None:
            tags = strings[raw] = raw.decode("utf-8")
        pos = end
    end = pos + host_len
    if end > size:
        raise _overrun("born host", pos, host_len, size)
    raw = data[pos:end]
    host = strings.get(raw)
    if host is None:
        host = strings[raw] = raw.decode("utf-8")
    pos = end
    keys: tuple[str, ...] = ()
    if n_keys:
        key_list = []
        for _ in range(n_keys):
            if pos + 2 > size:
                raise _overrun("key length", pos, 2, size)
            (n,) = _unpack_u16(data, pos)
            pos += 2
            end = pos + n
            if end > size:
                raise _overrun("key", pos, n, size)
            key_list.append(data[pos:end].decode("utf-8"))
            pos = end
        keys = tuple(key_list)
    props: dict[str, str] = {}
    for _ in range(n_props):
        if pos + 6 > size:
            raise _overrun("property lengths", pos, 6, size)
        name_len, value_len = _unpack_prop(data, pos)
        pos += 6
        end = pos + name_len + value_len
        if end > size:
            raise _overrun("property", pos, name_len + value_len, size)
        name = data[pos : pos + name_len].decode("utf-8")
        if name in props:
            raise MalformedBatchError(f"property {name!r} appears twice in one message")
        props[name] = data[pos + name_len : end].decode("utf-8")
        pos = end
    end = pos + body_len
    if end > size:
        raise _overrun("body", pos, body_len, size)
    m = _new(Message)
    _set_topic(m, topic)
    _set_body(m, data[pos:end])
    _set_tags(m, tags)
    _set_keys(m, keys)
    _set_props(m, props)
    _set_flag(m, flag)
    _set_born(m, born_ts)
    _set_host(m, host)
    return m, end
