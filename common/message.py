"""Message value types, RocketMQ's naming and property rules, tag hashes and message ids.

Pure values and checks: nothing here does I/O, reads a clock or keeps state of its own
(`ValidNames` is a memo its owner keeps). Validation raises typed errors whose text names the
rule and the limit, so a client can fix its request.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from raftmq.common.errors import InvalidMessageError, InvalidMessageIdError, InvalidNameError

MIB = 1 << 20

# RocketMQ's Validators / TopicValidator: the same character set for topics and groups.
_NAME_RE = re.compile(r"[%|a-zA-Z0-9_-]+")
MAX_TOPIC_CHARS = 127
MAX_GROUP_CHARS = 255
MAX_PRODUCER_ID_BYTES = 128  # an lmdb key holds it with a topic: 511 bytes at most in all

RETRY_TOPIC_PREFIX = "%RETRY%"
DLQ_TOPIC_PREFIX = "%DLQ%"
SYSTEM_TOPIC_PREFIXES = (RETRY_TOPIC_PREFIX, DLQ_TOPIC_PREFIX, "rmq_sys_")
# A group named like a retry or dead-letter topic would make its own retry topic %RETRY%%RETRY%g;
# RocketMQ reserves CID_RMQ_SYS_ for the broker's own consumer groups.
SYSTEM_GROUP_PREFIXES = (*SYSTEM_TOPIC_PREFIXES, "CID_RMQ_SYS_")
SYSTEM_TOPICS = frozenset(
    {
        "TBW102",
        "SCHEDULE_TOPIC_XXXX",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
        "TRANS_CHECK_MAX_TIME_TOPIC",
        "SELF_TEST_TOPIC",
        "OFFSET_MOVED_EVENT",
        "RMQ_SYS_TRACE_TOPIC",
    }
)

# RocketMQ's MessageConst.STRING_HASH_SET: names the system sets itself; a client may not.
SYSTEM_PROPERTY_NAMES = frozenset(
    {
        "TRACE_ON", "MSG_REGION", "KEYS", "TAGS", "WAIT", "DELAY", "RETRY_TOPIC", "REAL_TOPIC",
        "REAL_QID", "TRAN_MSG", "PGROUP", "MIN_OFFSET", "MAX_OFFSET", "BUYER_ID",
        "ORIGIN_MESSAGE_ID", "TRANSFER_FLAG", "CORRECTION_FLAG", "MQ2_FLAG", "RECONSUME_TIME",
        "UNIQ_KEY", "MAX_RECONSUME_TIMES", "CONSUME_START_TIME", "POP_CK", "POP_CK_OFFSET",
        "1ST_POP_TIME", "TRAN_PREPARED_QUEUE_OFFSET", "DUP_INFO", "EXTEND_UNIQ_INFO",
        "INSTANCE_ID", "CORRELATION_ID", "REPLY_TO_CLIENT", "TTL", "ARRIVE_TIME",
        "PUSH_REPLY_TIME", "CLUSTER", "MSG_TYPE", "INNER_MULTI_QUEUE_OFFSET", "TIMER_DELAY_MS",
        "TIMER_DELAY_SEC", "TIMER_DELIVER_MS", "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS",
        "TIMER_ROLL_TIMES", "TIMER_OUT_MS", "TIMER_DEL_UNIQKEY", "TIMER_DEL_MS",
        "TIMER_DELAY_LEVEL", "__BORNHOST", "BORN_TIMESTAMP", "DLQ_ORIGIN_TOPIC",
        "DLQ_ORIGIN_MESSAGE_ID", "__CRC32#", "__SHARDINGKEY", "TRACE_CONTEXT",
        "__transactionId__", "TRANSACTION_CHECK_TIMES", "CHECK_IMMUNITY_TIME_IN_SECONDS",
    }
)  # fmt: skip
SYSTEM_PROPERTY_PREFIX = "__RMQ."  # RocketMQ's transient properties ("__RMQ.TRANSIENT.")

# Java's Character.isISOControl, which RocketMQ's proxy refuses in keys, tags and properties.
_CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f]")

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
MAX_STRING_BYTES = 0xFFFE  # the record batch frames short strings with a u16 length


@dataclass(frozen=True, slots=True)
class Message:
    """What a producer sends. `properties` are the user's; the broker itself may add reserved
    system names (retry counts, origin topic) that validate_message refuses from clients."""

    topic: str
    body: bytes
    tags: str | None = None
    keys: tuple[str, ...] = ()
    properties: dict[str, str] = field(default_factory=dict)
    flag: int = 0
    born_timestamp_ms: int = 0
    born_host: str = ""


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A message as a consumer sees it: where it is in its queue and in the replicated log."""

    message: Message
    broker_group: str
    queue_id: int
    queue_offset: int
    msg_id: str
    store_timestamp_ms: int
    raft_index: int
    slot: int  # the chunk (group-commit submission) of the raft entry holding the batch
    position: int  # the message's place in that chunk's batch

    @property
    def topic(self) -> str:
        return self.message.topic


@dataclass(frozen=True, slots=True)
class MessageLimits:
    """Message limits with RocketMQ's defaults (maxMessageSize, the proxy's property limits)."""

    max_message_bytes: int = 4 * MIB  # body
    max_user_property_bytes: int = 16 * 1024  # names + values + tag + keys, utf-8
    max_user_properties: int = 128
    max_property_name_bytes: int = 255
    max_keys: int = 32
    max_born_host_bytes: int = 255
    allow_empty_body: bool = False  # RocketMQ refuses empty bodies by default


def _utf8_len(s: str) -> int:
    return len(s.encode("utf-8"))


def _has_control(s: str) -> bool:
    return _CONTROL_RE.search(s) is not None


def _bad_name(kind: str, name: str, text: str) -> InvalidNameError:
    return InvalidNameError(text, details={"kind": kind, "name": name})


def validate_topic(name: str, *, allow_system: bool = False) -> None:
    """RocketMQ's topic rules; system topics are refused unless `allow_system` (broker-internal)."""
    if not isinstance(name, str):
        raise _bad_name("topic", repr(name), f"a topic name is a str, not {type(name).__name__}")
    if not name:
        raise _bad_name("topic", name, "topic name is empty")
    if len(name) > MAX_TOPIC_CHARS:
        raise _bad_name(
            "topic", name, f"topic name is {len(name)} characters; the limit is {MAX_TOPIC_CHARS}"
        )
    if _NAME_RE.fullmatch(name) is None:
        raise _bad_name(
            "topic",
            name,
            f"topic name {name!r} may only contain letters, digits, '%', '|', '_' and '-'",
        )
    if not allow_system and is_system_topic(name):
        raise _bad_name(
            "topic", name, f"topic {name!r} is a system topic; clients cannot use it directly"
        )


class ValidNames:
    """Names that passed one check (a topic or producer id rule), remembered so that a per-batch
    path checks each name once: the same name always gets the same verdict, and only passes
    are kept. Bounded: cleared whole when `max_names` are held (names are few and repeat)."""

    __slots__ = ("_check", "_max", "_ok")

    def __init__(self, check: Callable[[str], None], max_names: int = 4096) -> None:
        self._check = check
        self._max = max_names
        self._ok: set[str] = set()

    def check(self, name: str) -> None:
        """The check's error for a bad name, every time; nothing for a good one."""
        if name in self._ok:
            return
        self._check(name)
        if len(self._ok) >= self._max:
            self._ok.clear()
        self._ok.add(name)


def validate_system_topic(name: str) -> None:
    """validate_topic with system topics allowed: what the broker applies to its log."""
    validate_topic(name, allow_system=True)


def is_system_topic(name: str) -> bool:
    return name in SYSTEM_TOPICS or name.startswith(SYSTEM_TOPIC_PREFIXES)


def retry_topic(group: str) -> str:
    return RETRY_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_TOPIC_PREFIX + group


def validate_group(name: str, *, allow_system: bool = False) -> None:
    """RocketMQ's consumer/producer group rules (Validators.checkGroup). Names with a system
    prefix (%RETRY%, %DLQ%, rmq_sys_, CID_RMQ_SYS_) are refused unless `allow_system` (applying
    records already committed, which an older version may have accepted)."""
    if not isinstance(name, str):
        raise _bad_name(
            "group", repr(name), f"group name must be a string, not {type(name).__name__}"
        )
    if not name:
        raise _bad_name("group", name, "group name is empty")
    if len(name) > MAX_GROUP_CHARS:
        raise _bad_name(
            "group", name, f"group name is {len(name)} characters; the limit is {MAX_GROUP_CHARS}"
        )
    if _NAME_RE.fullmatch(name) is None:
        raise _bad_name(
            "group",
            name,
            f"group name {name!r} may only contain letters, digits, '%', '|', '_' and '-'",
        )
    if not allow_system and name.startswith(SYSTEM_GROUP_PREFIXES):
        prefix = next(p for p in SYSTEM_GROUP_PREFIXES if name.startswith(p))
        raise _bad_name(
            "group",
            name,
            f"group name {name!r} starts with the reserved prefix {prefix!r} (the system's retry, "
            f"dead-letter and internal names); choose a name without it, e.g. "
            f"{name[len(prefix) :] or 'my-group'!r}",
        )


def validate_producer_id(producer_id: str) -> None:
    if not producer_id or not producer_id.isprintable() or producer_id.strip() != producer_id:
        raise InvalidNameError(
            f"producer id {producer_id!r} must be non-empty printable text without edge spaces"
        )
    size = _utf8_len(producer_id)
    if size > MAX_PRODUCER_ID_BYTES:
        raise InvalidNameError(f"producer id is {size} bytes; the limit is {MAX_PRODUCER_ID_BYTES}")


def validate_property_name(name: str, limits: MessageLimits) -> None:
    if not name or not name.strip():
        raise InvalidMessageError("a property name is empty or blank")
    if name in SYSTEM_PROPERTY_NAMES or name.startswith(SYSTEM_PROPERTY_PREFIX):
        raise InvalidMessageError(f"property name {name!r} is reserved for the system")
    if not name.isprintable():
        raise InvalidMessageError(f"property name {name!r} contains unprintable characters")
    size = _utf8_len(name)
    if size > limits.max_property_name_bytes:
        raise InvalidMessageError(
            f"property name is {size} bytes; the limit is {limits.max_property_name_bytes} "
            "(max_property_name_bytes)"
        )


def _type_name(value: object) -> str:
    return "None" if value is None else type(value).__name__


def check_message_types(tags: object, keys: object, properties: object) -> None:
    """Tags, keys and properties are strings (properties a mapping of str to str): a message's
    user fields cross the wire as protobuf strings. InvalidMessageError names the field."""
    if tags is not None and not isinstance(tags, str):
        raise InvalidMessageError(
            f"tags must be a string or None, not {_type_name(tags)} ({tags!r})",
            details={"field": "tags"},
        )
    if isinstance(keys, (str, bytes)) or not isinstance(keys, (tuple, list)):
        raise InvalidMessageError(
            f"keys must be a sequence of strings, not {_type_name(keys)}; write keys=[{keys!r}]"
            if isinstance(keys, str)
            else f"keys must be a sequence of strings, not {_type_name(keys)}",
            details={"field": "keys"},
        )
    for key in keys:
        if not isinstance(key, str):
            raise InvalidMessageError(
                f"message key {key!r} is of type {_type_name(key)}; keys must be strings "
                f"(write str({key!r}) to send its text)",
                details={"field": "keys"},
            )
    if properties is None:
        return
    if not isinstance(properties, Mapping):
        raise InvalidMessageError(
            f"properties must be a mapping of str to str, not {_type_name(properties)}",
            details={"field": "properties"},
        )
    for name, value in properties.items():
        if not isinstance(name, str):
            raise InvalidMessageError(
                f"property name {name!r} is of type {_type_name(name)}; property names must be "
                "strings",
                details={"field": "properties", "property": repr(name)},
            )
        if not isinstance(value, str):
            fix = (
                "leave the property out to send no value"
                if value is None
                else f"send str({value!r}) and convert it back when consuming"
            )
            raise InvalidMessageError(
                f"the value of property {name!r} is {_type_name(value)} ({value!r}); property "
                f"values must be strings: {fix}",
                details={"field": "properties", "property": name},
            )


def validate_message(
    msg: Message, limits: MessageLimits, *, allow_system_topic: bool = False
) -> None:
    """Refuse a message a RocketMQ broker would refuse; the error text names the rule."""
    validate_topic(msg.topic, allow_system=allow_system_topic)
    check_message_types(msg.tags, msg.keys, msg.properties)
    size = len(msg.body)
    if size == 0 and not limits.allow_empty_body:
        raise InvalidMessageError("message body is empty")
    if size > limits.max_message_bytes:
        raise InvalidMessageError(
            f"message body is {size} bytes; the limit is {limits.max_message_bytes} "
            "(max_message_bytes)"
        )
    if not INT32_MIN <= msg.flag <= INT32_MAX:
        raise InvalidMessageError(f"message flag {msg.flag} does not fit a signed 32-bit int")
    if not INT64_MIN <= msg.born_timestamp_ms <= INT64_MAX:
        raise InvalidMessageError(f"born_timestamp_ms {msg.born_timestamp_ms} is out of range")
    host_bytes = _utf8_len(msg.born_host)
    if host_bytes > limits.max_born_host_bytes or _has_control(msg.born_host):
        raise InvalidMessageError(
            f"born_host must be printable and at most {limits.max_born_host_bytes} bytes"
        )
    user_bytes = 0
    if msg.tags is not None:
        if not msg.tags.strip():
            raise InvalidMessageError("tag is blank; send None for no tag")
        if "|" in msg.tags:
            raise InvalidMessageError(f"tag {msg.tags!r} contains '|' (the subscription separator)")
        if _has_control(msg.tags):
            raise InvalidMessageError(f"tag {msg.tags!r} contains control characters")
        user_bytes += _utf8_len(msg.tags)
    if len(msg.keys) > limits.max_keys:
        raise InvalidMessageError(
            f"message has {len(msg.keys)} keys; the limit is {limits.max_keys} (max_keys)"
        )
    for key in msg.keys:
        if not key.strip():
            raise InvalidMessageError("a message key is empty or blank")
        if _has_control(key):
            raise InvalidMessageError(f"message key {key!r} contains control characters")
        user_bytes += _utf8_len(key)
    if len(msg.properties) > limits.max_user_properties:
        raise InvalidMessageError(
            f"message has {len(msg.properties)} properties; the limit is "
            f"{limits.max_user_properties} (max_user_properties)"
        )
    # Reserved names are refused from every client, also in %RETRY% and %DLQ% topics: the
    # properties saying where a retry or dead-letter copy came from are set only by the
    # broker's send-back (broker/send_back.py, which stores without this check).
    for name, value in msg.properties.items():
        validate_property_name(name, limits)
        if _has_control(value):
            raise InvalidMessageError(f"the value of property {name!r} contains control characters")
        user_bytes += _utf8_len(name) + _utf8_len(value)
    if user_bytes > limits.max_user_property_bytes:
        raise InvalidMessageError(
            f"tag, keys and properties take {user_bytes} bytes; the limit is "
            f"{limits.max_user_property_bytes} (max_user_property_bytes)"
        )


def validate_messages(
    messages: Iterable[Message], limits: MessageLimits, *, allow_system_topic: bool = False
) -> None:
    """validate_message for each message of a batch, with what repeats checked once: the
    leader's per-message cost on the hot path (issue 14). A message without tag, keys and
    properties whose topic and born host an earlier message of the batch passed needs only its
    numbers checked; any other is checked in full (and names its own error)."""
    topics: set[str] = set()
    hosts: set[str] = set()
    allow_empty, max_bytes = limits.allow_empty_body, limits.max_message_bytes
    for m in messages:
        keys, props = m.keys, m.properties
        if (
            m.tags is None
            and type(keys) is tuple
            and not keys
            and type(props) is dict
            and not props
            and m.topic in topics
            and m.born_host in hosts
        ):
            size = len(m.body)
            if (
                (size or allow_empty)
                and size <= max_bytes
                and INT32_MIN <= m.flag <= INT32_MAX
                and INT64_MIN <= m.born_timestamp_ms <= INT64_MAX
            ):
                continue
        validate_message(m, limits, allow_system_topic=allow_system_topic)
        topics.add(m.topic)
        hosts.add(m.born_host)


# ---- message ids -------------------------------------------------------------------------------

_ID_HEX_CHARS = 32  # raft index (16) + slot (8) + position (8)
_ID_RE = re.compile(r"[0-9A-F]{32}")


@dataclass(frozen=True, slots=True)
class MessageId:
    """Where a message lives on every replica of its broker group."""

    broker_group: str
    raft_index: int
    slot: int
    position: int


def encode_msg_id(broker_group: str, raft_index: int, slot: int, position: int) -> str:
    """`<broker group>-<index:016X><slot:08X><position:08X>`: fixed-width hex, so the ids of one
    group sort in log order and the group name may itself contain '-'."""
    if not 0 <= position < 1 << 32:
        raise ValueError(f"message id position out of range: {position}")
    return msg_id_prefix(broker_group, raft_index, slot) + format(position, POSITION_HEX)


POSITION_HEX = "08X"  # the id's last part: msg_id_prefix(...) + format(position, POSITION_HEX)


def msg_id_prefix(broker_group: str, raft_index: int, slot: int) -> str:
    """The id of every message of one record batch but for its position: a reader of many
    messages checks and formats this once per batch."""
    if not broker_group or not broker_group.isprintable() or " " in broker_group:
        raise InvalidNameError(f"broker group {broker_group!r} must be printable, without spaces")
    if not (0 <= raft_index < 1 << 64 and 0 <= slot < 1 << 32):
        raise ValueError(f"message id fields out of range: {raft_index}, {slot}")
    return f"{broker_group}-{raft_index:016X}{slot:08X}"


def decode_msg_id(msg_id: str) -> MessageId:
    cut = len(msg_id) - _ID_HEX_CHARS
    group, sep, tail = msg_id[: cut - 1], msg_id[cut - 1 : cut], msg_id[cut:]
    if cut < 2 or sep != "-" or _ID_RE.fullmatch(tail) is None:
        raise InvalidMessageIdError(
            f"{msg_id!r} is not a message id (<broker group>-<32 upper-case hex digits>)"
        )
    if not group.isprintable() or " " in group:
        raise InvalidMessageIdError(f"{msg_id!r} names an invalid broker group")
    return MessageId(group, int(tail[:16], 16), int(tail[16:24], 16), int(tail[24:], 16))
