"""Message trace records (RocketMQ's msgTrace: send, consume, end-transaction, retry and DLQ
moves), their encoding as the body of a trace-topic message, and a bounded batching buffer.

Sans-I/O: the buffer takes records and now_ms and hands out batches; it never blocks and never
raises on a full buffer (it counts the drop), so tracing can never stall or fail a send. The
format is JSON lines, one record per line, each with a version and a kind, so a person can read a
trace message and a newer reader can skip kinds it does not know.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
FORMAT_VERSION = 1

DEFAULT_MAX_BUFFERED = 2_048  # RocketMQ AsyncTraceDispatcher queueSize
DEFAULT_MAX_BATCH_RECORDS = 32  # = MessageLimits.max_keys: every record's id can be a key
DEFAULT_MAX_BATCH_BYTES = 128 * 1024  # RocketMQ's trace maxMsgSize
DEFAULT_MAX_AGE_MS = 500


class MalformedTraceError(ValueError):
    """Bytes that are not a trace record of a known version (the trace topic's reader's error)."""


@dataclass(frozen=True, slots=True)
class SendTrace:
    msg_id: str
    timestamp_ms: int  # when the send started (client clock)
    topic: str
    producer_group: str
    client_id: str
    keys: tuple[str, ...] = ()
    tags: str | None = None
    broker_group: str = ""
    queue_id: int = -1
    queue_offset: int = -1
    store_ms: int = 0
    cost_ms: int = 0
    success: bool = True
    kind_of_send: str = "normal"  # normal, delay, transaction-half


@dataclass(frozen=True, slots=True)
class ConsumeTrace:
    msg_id: str
    timestamp_ms: int  # when the listener was called
    topic: str
    group: str
    client_id: str
    status: str  # success, reconsume_later, exception, suspend
    reconsume_times: int = 0
    cost_ms: int = 0
    origin_msg_id: str = ""  # for a retried delivery: the first delivery's id
    broker_group: str = ""
    queue_id: int = -1
    queue_offset: int = -1


@dataclass(frozen=True, slots=True)
class EndTransactionTrace:
    msg_id: str
    timestamp_ms: int
    topic: str
    producer_group: str
    transaction_id: str
    resolution: str  # commit, rollback, unknown
    from_check: bool = False


class MoveKind(enum.Enum):
    RETRY = "retry"
    DEAD_LETTER = "dlq"
    RESEND = "resend"  # `raftmq dlq resend`: a dead letter back to its original topic


@dataclass(frozen=True, slots=True)
class MoveTrace:
    msg_id: str  # the message that failed (origin id)
    timestamp_ms: int
    move: MoveKind
    group: str
    from_topic: str
    to_topic: str
    reconsume_times: int
    new_msg_id: str = ""  # the id of the copy in %RETRY% / %DLQ%
    delay_ms: int = 0


TraceRecord = SendTrace | ConsumeTrace | EndTransactionTrace | MoveTrace

_KINDS: dict[str, type[Any]] = {
    "send": SendTrace,
    "consume": ConsumeTrace,
    "end_transaction": EndTransactionTrace,
    "move": MoveTrace,
}
_KIND_OF: dict[type[Any], str] = {cls: kind for kind, cls in _KINDS.items()}
_FIELDS: dict[type[Any], tuple[dataclasses.Field[Any], ...]] = {
    cls: dataclasses.fields(cls) for cls in _KINDS.values()
}


# Per kind: the field names, and those holding an enum (written as its value). Tuples need no
# conversion: the encoder writes them as JSON arrays, exactly as lists.
_NAMES: dict[type[Any], tuple[str, ...]] = {
    cls: tuple(f.name for f in fs) for cls, fs in _FIELDS.items()
}
_ENUM_NAMES: dict[type[Any], tuple[str, ...]] = {
    cls: tuple(f.name for f in fs if str(f.type) == "MoveKind") for cls, fs in _FIELDS.items()
}
# One encoder object (C accelerated): json.dumps with options builds a new one per call.
ENCODER = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"))


def encode_record(record: TraceRecord) -> bytes:
    """One record as one line of JSON (no newline: newlines in strings are escaped). On a traced
    client's path for every message: no per-field conversion beyond the enums."""
    cls = type(record)
    body: dict[str, object] = {"v": FORMAT_VERSION, "k": _KIND_OF[cls]}
    for name in _NAMES[cls]:
        body[name] = getattr(record, name)
    for name in _ENUM_NAMES[cls]:
        value = body[name]
        assert isinstance(value, enum.Enum)
        body[name] = value.value
    return ENCODER.encode(body).encode("ascii")


def _field_value(cls: type[Any], name: str, kind: str, value: object) -> object:
    where = f"{cls.__name__}.{name}"
    if kind in ("int",):
        if type(value) is not int:
            raise MalformedTraceError(f"{where} is not an integer: {value!r}")
        return value
    if kind == "bool":
        if type(value) is not bool:
            raise MalformedTraceError(f"{where} is not a boolean: {value!r}")
        return value
    if kind == "str":
        if not isinstance(value, str):
            raise MalformedTraceError(f"{where} is not a string: {value!r}")
        return value
    if kind == "str | None":
        if value is not None and not isinstance(value, str):
            raise MalformedTraceError(f"{where} is not a string or null: {value!r}")
        return value
    if kind == "tuple[str, ...]":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise MalformedTraceError(f"{where} is not a list of strings: {value!r}")
        return tuple(value)
    if kind == "MoveKind":
        try:
            return MoveKind(value)
        except ValueError:
            raise MalformedTraceError(f"{where} is not a move kind: {value!r}") from None
    raise AssertionError(f"no decoder for {where}: {kind}")


def decode_record(line: bytes) -> TraceRecord:
    try:
        body = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedTraceError(f"trace record is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise MalformedTraceError("trace record is not a JSON object")
    if body.get("v") != FORMAT_VERSION:
        raise MalformedTraceError(f"trace record version {body.get('v')!r} is not {FORMAT_VERSION}")
    cls = _KINDS.get(str(body.get("k")))
    if cls is None:
        raise MalformedTraceError(f"unknown trace record kind {body.get('k')!r}")
    fields = _FIELDS[cls]
    names = {f.name for f in fields}
    extra = set(body) - names - {"v", "k"}
    if extra:
        raise MalformedTraceError(f"unknown fields in a {cls.__name__}: {sorted(extra)}")
    values: dict[str, object] = {}
    for f in fields:
        if f.name not in body:
            if f.default is dataclasses.MISSING:
                raise MalformedTraceError(f"{cls.__name__}.{f.name} is missing")
            continue
        values[f.name] = _field_value(cls, f.name, str(f.type), body[f.name])
    record: TraceRecord = cls(**values)
    return record


# One line for the sends of one stored batch (the messages of one request for one queue):
# the fields they share once, then [msg_id, born_ms, keys, tags] per message. Read back as a
# SendTrace per message (decode_batch), so nothing downstream knows the difference; written this
# way because a traced sender pays its trace per batch instead of a JSON object per message.
SENDS_KIND = "sends"
_SENDS_SHARED = (
    "topic",
    "producer_group",
    "client_id",
    "broker_group",
    "queue_id",
    "first_offset",
    "done_ms",
    "success",
)
_SENDS_TYPES: dict[str, type] = {
    "topic": str,
    "producer_group": str,
    "client_id": str,
    "broker_group": str,
    "queue_id": int,
    "first_offset": int,
    "done_ms": int,
    "success": bool,
}
SendsMessage = tuple[str, int, Sequence[str], "str | None"]  # msg_id, born ms, keys, tags


def encode_sends(
    topic: str,
    producer_group: str,
    client_id: str,
    broker_group: str,
    queue_id: int,
    first_offset: int,
    done_ms: int,
    success: bool,
    messages: Sequence[SendsMessage],
) -> bytes:
    """The sends of one stored batch as one line: `messages` in queue order (offsets follow
    first_offset; -1: not known). Each becomes a SendTrace with cost done_ms - born ms."""
    return ENCODER.encode(
        {
            "v": FORMAT_VERSION,
            "k": SENDS_KIND,
            "topic": topic,
            "producer_group": producer_group,
            "client_id": client_id,
            "broker_group": broker_group,
            "queue_id": queue_id,
            "first_offset": first_offset,
            "done_ms": done_ms,
            "success": success,
            "m": messages,
        }
    ).encode("ascii")


def _sends_of(body: dict[str, Any]) -> list[TraceRecord]:
    if set(body) != {"v", "k", "m", *_SENDS_SHARED}:
        raise MalformedTraceError(f"a sends line has fields {sorted(body)}")
    for name, kind in _SENDS_TYPES.items():
        if type(body[name]) is not kind:
            raise MalformedTraceError(f"sends.{name} is not a {kind.__name__}: {body[name]!r}")
    items = body["m"]
    if not isinstance(items, list):
        raise MalformedTraceError("sends.m is not a list")
    first = body["first_offset"]
    out: list[TraceRecord] = []
    for i, item in enumerate(items):
        if not (
            isinstance(item, list)
            and len(item) == 4
            and isinstance(item[0], str)
            and type(item[1]) is int
            and isinstance(item[2], list)
            and all(isinstance(k, str) for k in item[2])
            and (item[3] is None or isinstance(item[3], str))
        ):
            raise MalformedTraceError(f"sends.m[{i}] is not [msg_id, born_ms, keys, tags]")
        msg_id, born_ms, keys, tags = item
        out.append(
            SendTrace(
                msg_id=msg_id,
                timestamp_ms=born_ms,
                topic=body["topic"],
                producer_group=body["producer_group"],
                client_id=body["client_id"],
                keys=tuple(keys),
                tags=tags,
                broker_group=body["broker_group"],
                queue_id=body["queue_id"],
                queue_offset=first + i if first >= 0 else -1,
                cost_ms=max(0, body["done_ms"] - born_ms),
                success=body["success"],
            )
        )
    return out


def _decode_line(line: bytes) -> list[TraceRecord]:
    """The records of one line: one, or a SendTrace per message of a sends line."""
    if b'"k":"sends"' in line:  # the encoder writes no spaces; decode_record checks the rest
        try:
            body = json.loads(line)
        except (ValueError, UnicodeDecodeError) as exc:
            raise MalformedTraceError(f"trace record is not JSON: {exc}") from None
        if isinstance(body, dict) and body.get("k") == SENDS_KIND:
            if body.get("v") != FORMAT_VERSION:
                raise MalformedTraceError(
                    f"trace record version {body.get('v')!r} is not {FORMAT_VERSION}"
                )
            return _sends_of(body)
    return [decode_record(line)]


def encode_batch(records: Iterable[TraceRecord]) -> bytes:
    return b"\n".join(encode_record(r) for r in records)


def decode_batch(body: bytes) -> list[TraceRecord]:
    return [r for line in body.split(b"\n") if line for r in _decode_line(line)]


def path_of(msg_id: str, records: Iterable[TraceRecord]) -> list[TraceRecord]:
    """Every record of a message's life, time ordered: its own, and those of its retry and
    dead-letter copies (followed through the moves' new ids and origin ids)."""
    pool = list(records)
    ids = {msg_id}
    while True:
        more = {r.new_msg_id for r in pool if isinstance(r, MoveTrace) and r.msg_id in ids} | {
            r.msg_id for r in pool if isinstance(r, ConsumeTrace) and r.origin_msg_id in ids
        }
        more.discard("")
        if more <= ids:
            break
        ids |= more
    mine = [r for r in pool if r.msg_id in ids]
    order = {SendTrace: 0, EndTransactionTrace: 1, ConsumeTrace: 2, MoveTrace: 3}
    return sorted(mine, key=lambda r: (r.timestamp_ms, order[type(r)]))


@dataclass(frozen=True, slots=True)
class TraceBatch:
    """One trace-topic message: the body and the keys (the traced message ids, unique, in order)
    that let `raftmq message trace --id` find it through the key index."""

    body: bytes
    keys: tuple[str, ...]
    count: int


class TraceBuffer:
    """Records waiting to be sent to the trace topic, bounded in count; a batch is ready when it
    is full (records or bytes) or its oldest record is `max_age_ms` old."""

    def __init__(
        self,
        *,
        max_buffered: int = DEFAULT_MAX_BUFFERED,
        max_batch_records: int = DEFAULT_MAX_BATCH_RECORDS,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        max_age_ms: int = DEFAULT_MAX_AGE_MS,
    ) -> None:
        if min(max_buffered, max_batch_records, max_batch_bytes) < 1 or max_age_ms < 0:
            raise ValueError("trace buffer bounds must be positive (max_age_ms >= 0)")
        self.max_buffered = max_buffered
        self.max_batch_records = max_batch_records
        self.max_batch_bytes = max_batch_bytes
        self.max_age_ms = max_age_ms
        # (added_ms, the traced message ids, line): a sends line traces several messages
        self._pending: deque[tuple[int, tuple[str, ...], bytes]] = deque()
        self._records = 0  # messages traced by the pending lines (a line counts at least 1)
        self._bytes = 0
        self.dropped_full = 0
        self.dropped_oversize = 0
        self.added = 0

    @property
    def dropped(self) -> int:
        return self.dropped_full + self.dropped_oversize

    def __len__(self) -> int:
        """Records waiting (a sends line counts one per message)."""
        return self._records

    def add(self, record: TraceRecord, now_ms: int) -> bool:
        """Keep `record` for the next batch; False (and counted) if the buffer is full or the
        record alone is larger than a batch. Never blocks, never raises for a full buffer."""
        if self._records >= self.max_buffered:
            self.dropped_full += 1
            return False
        return self.add_encoded((record.msg_id,), encode_record(record), now_ms)

    def add_encoded(self, msg_ids: tuple[str, ...], line: bytes, now_ms: int) -> bool:
        """`add` for a line its caller encoded itself: encode_record's, or encode_sends' for
        the messages `msg_ids` (at most max_batch_records of them)."""
        n = max(1, len(msg_ids))
        if self._records + n > self.max_buffered:
            self.dropped_full += n
            return False
        if len(line) > self.max_batch_bytes or n > self.max_batch_records:
            self.dropped_oversize += n
            return False
        self._pending.append((now_ms, msg_ids, line))
        self._records += n
        self._bytes += len(line) + 1
        self.added += n
        return True

    def ready(self, now_ms: int) -> bool:
        if not self._pending:
            return False
        return (
            self._records >= self.max_batch_records
            or self._bytes >= self.max_batch_bytes
            or now_ms - self._pending[0][0] >= self.max_age_ms
        )

    def next_deadline_ms(self) -> int | None:
        """When the oldest record's batch is due by age (None: empty)."""
        return self._pending[0][0] + self.max_age_ms if self._pending else None

    def take(self, now_ms: int, *, flush: bool = False) -> TraceBatch | None:
        """The next batch if one is ready (or anything at all with `flush`, e.g. on close)."""
        if not self._pending or not (flush or self.ready(now_ms)):
            return None
        lines: list[bytes] = []
        keys: dict[str, None] = {}
        size = 0
        count = 0
        while self._pending:
            _, msg_ids, line = self._pending[0]
            n = max(1, len(msg_ids))
            if lines and (
                size + len(line) + 1 > self.max_batch_bytes or count + n > self.max_batch_records
            ):
                break
            self._pending.popleft()
            self._records -= n
            self._bytes -= len(line) + 1
            size += len(line) + 1
            count += n
            lines.append(line)
            for msg_id in msg_ids:
                if msg_id:
                    keys[msg_id] = None
        return TraceBatch(b"\n".join(lines), tuple(keys), count)


def records_of(batches: Sequence[TraceBatch]) -> list[TraceRecord]:
    return [r for b in batches for r in decode_batch(b.body)]
