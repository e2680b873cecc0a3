"""Messages between the RocketMQ 5 API (`apache.rocketmq.v2.Message`) and raftmq: what a v2 send
stores, what a receive returns. Pure.

What raftmq's message has no field for travels as properties under `rmq5.` (the client's message
id, message group, message type, born time and host); a receive turns them back into system
properties and never shows them as user properties. A raftmq SDK message (no `rmq5.` properties)
is received with its raftmq message id, tag, keys, born time and host.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from raftmq.common.errors import InvalidNameError
from raftmq.common.message import SYSTEM_PROPERTY_NAMES, SYSTEM_PROPERTY_PREFIX, validate_topic
from raftmq.common.pb.apache.rocketmq.v2 import definition_pb2 as v2
from raftmq.proxy.codes import ApiError

PROPERTY_PREFIX = "rmq5."
P_MESSAGE_ID = "rmq5.message_id"
P_MESSAGE_GROUP = "rmq5.message_group"
P_MESSAGE_TYPE = "rmq5.message_type"
P_BORN_MS = "rmq5.born_timestamp"
P_BORN_HOST = "rmq5.born_host"
MAX_MESSAGE_GROUP_CHARS = 64  # RocketMQ proxy's maxMessageGroupSize

# The message types this proxy stores: DELAY goes to the SDK's delayed send (deliver_at_ms),
# TRANSACTION to a half send of the proxy's transaction producer of the topic.
SUPPORTED_TYPES = frozenset({v2.NORMAL, v2.FIFO, v2.DELAY, v2.TRANSACTION})
_TYPE_NAMES = frozenset(v2.MessageType.keys())


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One v2 message as raftmq stores it."""

    topic: str
    body: bytes
    tag: str | None
    keys: tuple[str, ...]
    properties: dict[str, str]
    message_id: str  # the client's (UNIQ_KEY); "" if it sent none
    message_group: str  # FIFO: the group whose order is kept; "" otherwise
    message_type: int
    deliver_at_ms: int | None = None  # DELAY: the delivery timestamp (ms since the epoch)


def check_topic(resource: v2.Resource) -> str:
    name = resource.name
    try:
        validate_topic(name)
    except InvalidNameError as exc:
        raise ApiError(v2.ILLEGAL_TOPIC, exc.message) from None
    return name


def _body(msg: v2.Message, max_body_bytes: int) -> bytes:
    body = msg.body
    enc = msg.system_properties.body_encoding
    if enc == v2.GZIP:
        # Bounded: never inflate past the body limit (a small bomb stays small).
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            body = d.decompress(body, max_body_bytes + 1)
        except zlib.error as exc:
            raise ApiError(v2.MESSAGE_CORRUPTED, f"the body is not valid gzip: {exc}") from None
        if len(body) > max_body_bytes:
            raise ApiError(
                v2.MESSAGE_BODY_TOO_LARGE,
                f"the message body inflates past {max_body_bytes} bytes, this proxy's "
                "max_message_bytes",
            )
        if not d.eof:
            raise ApiError(v2.MESSAGE_CORRUPTED, "the gzip body is truncated")
    elif enc not in (v2.IDENTITY, v2.ENCODING_UNSPECIFIED):
        raise ApiError(v2.BAD_REQUEST, f"unknown body encoding {enc}; use IDENTITY or GZIP")
    if not body:
        raise ApiError(v2.MESSAGE_BODY_EMPTY, "the message body is empty; send at least one byte")
    if len(body) > max_body_bytes:
        raise ApiError(
            v2.MESSAGE_BODY_TOO_LARGE,
            f"the message body is {len(body)} bytes; this proxy accepts at most {max_body_bytes} "
            "(max_message_bytes)",
        )
    return body


def to_outgoing(msg: v2.Message, max_body_bytes: int) -> Outgoing:
    """Check one v2 message and map it; ApiError with the v2 code of the first problem."""
    topic = check_topic(msg.topic)
    sp = msg.system_properties
    body = _body(msg, max_body_bytes)
    mtype = sp.message_type or v2.NORMAL
    if mtype == v2.NORMAL and sp.HasField("delivery_timestamp"):
        mtype = v2.DELAY  # a client that did not set the type: the timestamp says it
    group = sp.message_group if sp.HasField("message_group") else ""
    deliver_at_ms = _delivery_ms(sp) if sp.HasField("delivery_timestamp") else None
    _refuse_unsupported(mtype, deliver_at_ms)
    if mtype == v2.FIFO and not group:
        raise ApiError(
            v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
            "a FIFO message needs a message group (the order is kept per group)",
        )
    if group and mtype != v2.FIFO:
        raise ApiError(
            v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
            f"only FIFO messages have a message group; this one is {v2.MessageType.Name(mtype)}",
        )
    if group and (len(group) > MAX_MESSAGE_GROUP_CHARS or not group.isprintable()):
        raise ApiError(
            v2.ILLEGAL_MESSAGE_GROUP,
            f"message group {group[:80]!r} must be printable and at most "
            f"{MAX_MESSAGE_GROUP_CHARS} characters",
        )
    props: dict[str, str] = {}
    for name, value in msg.user_properties.items():
        if (
            name.startswith(PROPERTY_PREFIX)
            or name in SYSTEM_PROPERTY_NAMES
            or name.startswith(SYSTEM_PROPERTY_PREFIX)
        ):
            raise ApiError(
                v2.ILLEGAL_MESSAGE_PROPERTY_KEY,
                f"property name {name!r} is reserved for the system; choose another name",
            )
        props[name] = value
    if sp.message_id:
        props[P_MESSAGE_ID] = sp.message_id
    if group:
        props[P_MESSAGE_GROUP] = group
    props[P_MESSAGE_TYPE] = v2.MessageType.Name(mtype)
    if sp.HasField("born_timestamp"):
        props[P_BORN_MS] = str(sp.born_timestamp.ToMilliseconds())
    if sp.born_host:
        props[P_BORN_HOST] = sp.born_host
    tag = sp.tag if sp.HasField("tag") and sp.tag else None
    return Outgoing(
        topic, body, tag, tuple(sp.keys), props, sp.message_id, group, mtype, deliver_at_ms
    )


def _delivery_ms(sp: v2.SystemProperties) -> int:
    try:
        return int(sp.delivery_timestamp.ToMilliseconds())
    except ValueError as exc:  # seconds out of Timestamp's range (e.g. ms given as seconds)
        raise ApiError(
            v2.ILLEGAL_DELIVERY_TIME, f"the delivery timestamp is not a valid time: {exc}"
        ) from None


def _refuse_unsupported(mtype: int, deliver_at_ms: int | None) -> None:
    if mtype not in SUPPORTED_TYPES:
        what = v2.MessageType.Name(mtype) if mtype in v2.MessageType.values() else str(mtype)
        raise ApiError(
            v2.UNSUPPORTED,
            f"{what} messages are not served by this proxy (NORMAL, FIFO, DELAY and "
            "TRANSACTION are)",
        )
    if mtype == v2.DELAY and deliver_at_ms is None:
        raise ApiError(
            v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
            "a DELAY message needs a delivery timestamp (when it becomes visible)",
        )
    if deliver_at_ms is not None and mtype != v2.DELAY:
        raise ApiError(
            v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
            f"only DELAY messages have a delivery timestamp; this one is "
            f"{v2.MessageType.Name(mtype)}",
        )


@dataclass(frozen=True, slots=True)
class Stored:
    """What a receive knows of one stored message (from the SDK's ReceivedMessage)."""

    topic: str
    body: bytes
    tag: str | None
    keys: tuple[str, ...]
    properties: Mapping[str, str]
    broker_group: str
    queue_id: int
    queue_offset: int
    msg_id: str  # raftmq's
    store_timestamp_ms: int
    born_timestamp_ms: int
    born_host: str


def _ts(ms: int) -> Timestamp:
    t = Timestamp()
    t.FromMilliseconds(ms)
    return t


def _int(value: str | None, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def message_id_of(m: Stored) -> str:
    """The id a v2 client sees: the one its producer gave, else raftmq's."""
    return m.properties.get(P_MESSAGE_ID) or m.msg_id


def to_v2(
    m: Stored,
    *,
    receipt_handle: str,
    delivery_attempt: int,
    invisible_ms: int,
    store_host: str,
) -> v2.Message:
    props = m.properties
    group = props.get(P_MESSAGE_GROUP, "")
    type_name = props.get(P_MESSAGE_TYPE, "")
    mtype = (
        v2.MessageType.Value(type_name)
        if type_name in _TYPE_NAMES
        else (v2.FIFO if group else v2.NORMAL)
    )
    sp = v2.SystemProperties(
        keys=list(m.keys),
        message_id=message_id_of(m),
        # MD5 as RocketMQ's proxy sends it: every official client checks MD5 the same way
        # (uppercase hex), while their CRC32 texts differ (Node.js: decimal, Python: hex) and
        # a client that finds a mismatch drops the message as corrupted.
        body_digest=v2.Digest(type=v2.MD5, checksum=hashlib.md5(m.body).hexdigest().upper()),
        body_encoding=v2.IDENTITY,
        message_type=mtype,  # type: ignore[arg-type]
        born_timestamp=_ts(_int(props.get(P_BORN_MS), m.born_timestamp_ms)),
        born_host=props.get(P_BORN_HOST, m.born_host),
        store_timestamp=_ts(m.store_timestamp_ms),
        store_host=store_host,
        receipt_handle=receipt_handle,
        queue_id=m.queue_id,
        queue_offset=m.queue_offset,
        invisible_duration=Duration(
            seconds=invisible_ms // 1000, nanos=(invisible_ms % 1000) * 1_000_000
        ),
        delivery_attempt=delivery_attempt,
    )
    if m.tag is not None:
        sp.tag = m.tag
    if group:
        sp.message_group = group
    return v2.Message(
        topic=v2.Resource(name=m.topic),
        user_properties={k: v for k, v in props.items() if _is_user_property(k)},
        system_properties=sp,
        body=m.body,
    )


def _is_user_property(name: str) -> bool:
    """Not ours (`rmq5.`) nor the broker's (timer, transaction, retry properties): RocketMQ's
    proxy also leaves its system properties out of a received message's user properties."""
    return not (
        name.startswith(PROPERTY_PREFIX)
        or name in SYSTEM_PROPERTY_NAMES
        or name.startswith(SYSTEM_PROPERTY_PREFIX)
    )


def duration_ms(d: Duration) -> int:
    return d.seconds * 1000 + d.nanos // 1_000_000
