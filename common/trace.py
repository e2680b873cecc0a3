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


def encode_batch(records: Iterable[TraceRecord]) -> bytes:
    return b"\n".join(encode_record(r) for r in records)


def decode_batch(body: bytes) -> list[TraceRecord]:
    return [decode_record(line) for line in body.split(b"\n") if line]


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
        self._pending: deque[tuple[int, str, bytes]] = deque()  # (added_ms, msg id, line)
        self._bytes = 0
        self.dropped_full = 0
        self.dropped_oversize = 0
        self.added = 0

    @property
    def dropped(self) -> int:
        return self.dropped_full + self.dropped_oversize

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, record: TraceRecord, now_ms: int) -> bool:
        """Keep `record` for the next batch; False (and counted) if the buffer is full or the
        record alone is larger than a batch. Never blocks, never raises for a full buffer."""
        if len(self._pending) >= self.max_buffered:
            self.dropped_full += 1
            return False
        return self.add_encoded(record.msg_id, encode_record(record), now_ms)

    def add_encoded(self, msg_id: str, line: bytes, now_ms: int) -> bool:
        """`add` for a record its caller encoded itself (a hot path may skip building the
        record object); `line` must be what encode_record gives for it."""
        if len(self._pending) >= self.max_buffered:
            self.dropped_full += 1
            return False
        if len(line) > self.max_batch_bytes:
            self.dropped_oversize += 1
            return False
        self._pending.append((now_ms, msg_id, line))
        self._bytes += len(line) + 1
        self.added += 1
        return True

    def ready(self, now_ms: int) -> bool:
        if not self._pending:
            return False
        return (
            len(self._pending) >= self.max_batch_records
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
        while self._pending and len(lines) < self.max_batch_records:
            _, msg_id, line = self._pending[0]
            if lines and size + len(line) + 1 > self.max_batch_bytes:
                break
            self._pending.popleft()
            self._bytes -= len(line) + 1
            size += len(line) + 1
            lines.append(line)
            if msg_id:
                keys[msg_id] = None
        return TraceBatch(b"\n".join(lines), tuple(keys), len(lines))


def records_of(batches: Sequence[TraceBatch]) -> list[TraceRecord]:
    return [r for b in batches for r in decode_batch(b.body)]
