"""The pure-Python twin of the stored batch codec (versions 2 and 3), and the types both
implementations return (BatchHeader, BatchLimits, BatchMessage): import
`raftmq.common.stored_batch`, which picks this or the compiled `_stored_batch_c` at import. Never
a Python object per message on the server side; decoders raise only MalformedBatchError (never
IndexError or struct.error). Little-endian; strings utf-8. The C extension must give the same
bytes, values and errors (tests run both).

The layout is in stored_batch's docstring (and docs/design.md, "Stored batch format v2" and
"Stored batch v3: compact record heads").
"""

from __future__ import annotations

import functools
import operator
import struct
import sys
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import TYPE_CHECKING, NamedTuple, overload

from crc32c import crc32c

from raftmq.common.filter.tag import tag_hash
from raftmq.common.message import MIB, Message
from raftmq.common.record_batch import (
    MalformedBatchError,
    ProducerSequence,
    UnsupportedBatchError,
)

__all__ = [
    "FIXED_HEADER_BYTES",
    "OLDEST_VERSION",
    "RECORD_HEAD_BYTES",
    "V3_HEADER_BYTES",
    "VERSION",
    "BatchColumns",
    "BatchHeader",
    "BatchLimits",
    "BatchMessage",
    "BodyColumn",
    "MalformedBatchError",
    "UnsupportedBatchError",
    "batch_count",
    "body_sizes",
    "check_batch",
    "columns",
    "encode_batch",
    "encode_bodies",
    "has_keys",
    "index_columns",
    "is_scheduled",
    "is_stored",
    "iter_messages",
    "iter_records",
    "mark_scheduled",
    "message_offsets",
    "place_offset",
    "placed_offset",
    "read_header",
    "slice_from",
    "stamp",
    "tag_hashes",
    "verify_stamped",
]

if TYPE_CHECKING:
    from typing_extensions import Buffer

Bytes = bytes | bytearray | memoryview

KIND_PRODUCE = 1
# The newest version this raftmq reads; it writes it only where its whole group reads it
# (docs/design.md, "Stored batch v3: compact record heads"), else OLDEST_VERSION, which every
# raftmq since the stored batch reads.
VERSION = 3
OLDEST_VERSION = 2
STATE_PRODUCED = 0
STATE_STAMPED = 1
# Stamped, and the base offset slot holds the leader's queue offset (issue 29): every replica's
# dispatcher checks it against its own count. State 1 leaves the offset to the dispatcher
# (stores written before, and what a leader could not place: broker/leader_offsets.py).
STATE_PLACED = 2
HAS_PRODUCER = 0x0001
# The producer's sequence must follow the last stored one (only with HAS_PRODUCER): v1's
# ProducerSequence.strict, which the dispatcher refuses as OUT_OF_ORDER when it does not.
STRICT_SEQUENCE = 0x0002
# Some message carries keys: the dispatcher walks the records for the key index only then.
HAS_KEYS = 0x0004
# A delayed send: the messages enter the schedule at their due time (TIMER_OUT_MS, stamped into
# each record by the leader), not their queue. Only the broker writes it (mark_scheduled).
SCHEDULED = 0x0008
_KNOWN_FLAGS = HAS_PRODUCER | STRICT_SEQUENCE | HAS_KEYS | SCHEDULED
# v3 only: no message of the batch has a tag, and the tag-hash table is left out (every hash is
# 0, what tag_hash's absence gives); the offsets table follows the header.
NO_TAG_HASHES = 0x0010
_KNOWN_FLAGS_V3 = _KNOWN_FLAGS | NO_TAG_HASHES
_FLAGS_AT = 32

# kind, version, state, reserved, total length, stamp CRC, body CRC, base offset, store ms,
# flags, header length, queue id, count, reserved, base sequence, topic/producer/host lengths,
# reserved
_FIXED = struct.Struct("<BBBBIIIQqHHIIIQHHHH")
FIXED_HEADER_BYTES = _FIXED.size  # 64
# v3's fixed header: v2's, then the batch's born base (i64 ms) at 64; the strings follow at 72.
V3_HEADER_BYTES = FIXED_HEADER_BYTES + 8
_BORN_BASE = struct.Struct("<q")
_STAMP_CRC_AT = 8
_BODY_CRC_AT = 12
_BODY_AT = 32  # the body CRC covers [32, total)
_STAMP = struct.Struct("<Qq")  # base offset, store ms at 16
_STAMP_AT = 16
_STATE_AT = 2
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_COUNT_AT = 40

# body length, flag, born ms, tag length, key count, keys length, properties length
_RECORD = struct.Struct("<IiqHHII")
RECORD_HEAD_BYTES = _RECORD.size  # 28
# A v3 record head: attributes (u8), the born time as a zigzag varint delta from the batch's
# born base, the body length as a varint, then only the fields the attributes name, as varints.
_V3_FLAG, _V3_TAG, _V3_KEYS, _V3_PROPS = 0x01, 0x02, 0x04, 0x08
_V3_ATTRS = _V3_FLAG | _V3_TAG | _V3_KEYS | _V3_PROPS
V3_MIN_RECORD = 3  # attributes, a one-byte delta, a one-byte body length
_M64 = (1 << 64) - 1
_U16 = struct.Struct("<H")
_PROP = struct.Struct("<HI")
NO_TAG = 0xFFFF

_U16_MAX = 0xFFFF
_U32_MAX = 0xFFFF_FFFF
_U64_MAX = (1 << 64) - 1
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
_LITTLE = sys.byteorder == "little"
_ZERO_CRC = bytes(4)
_ZERO_SLOTS = bytes(_BODY_AT - _STAMP_AT)
if array("I").itemsize != 4 or array("Q").itemsize != 8:
    raise RuntimeError("this platform's array('I')/array('Q') are not 4/8 bytes")


@dataclass(frozen=True, slots=True)
class BatchLimits:
    """What the leader accepts in one stored batch (checked before the CRC is computed)."""

    max_batch_bytes: int = 8 * MIB
    max_messages: int = 4096


DEFAULT_LIMITS = BatchLimits()


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """A stored batch's header, decoded once per batch: everything but the messages."""

    topic: str
    queue_id: int
    count: int
    producer: ProducerSequence | None
    born_host: str
    stamped: bool
    base_offset: int  # 0 until stamped
    store_timestamp_ms: int  # 0 until stamped
    total_bytes: int
    tables_at: int  # H: where the tables start (tag hashes, absent in a v3 batch of no tag)
    records_at: int  # A: where the message records start; the offsets table ends here
    version: int  # 2 or 3
    born_base_ms: int  # v3: what each record's born time is a delta from; 0 in v2

    @property
    def has_tag_hashes(self) -> bool:
        """Whether the tag-hash table is there (always in v2): else every hash is 0."""
        return self.records_at - self.tables_at == 12 * self.count

    @property
    def next_offset(self) -> int:
        """The queue offset after this batch's last message."""
        return self.base_offset + self.count


# ---- encoding (client side) --------------------------------------------------------------------


def encode_batch(
    topic: str,
    queue_id: int,
    messages: Sequence[Message],
    producer: ProducerSequence | None = None,
    born_host: str = "",
    version: int = OLDEST_VERSION,
) -> bytes:
    """The stored bytes of one queue's batch, unstamped, with its body CRC. Every message's topic
    must be `topic` and its born_host "" or `born_host` (the batch carries one). Raises ValueError
    for values the format cannot carry (validate messages first: this only checks ranges).
    `version` 3 only where every reader of the batch reads it (the group's accepted version)."""
    n = len(messages)
    head = _Head.of(topic, n, producer, born_host, version)
    if version == 3:
        return _encode_v3(head, queue_id, messages, born_host)
    hashes = array("Q")
    offsets = array("I")
    parts: list[bytes] = []
    append, add_hash, add_offset = parts.append, hashes.append, offsets.append
    pack_record, pack_u16, pack_prop = _RECORD.pack, _U16.pack, _PROP.pack
    tag_cache: dict[str, tuple[bytes, int]] = {}  # tags repeat: encode and hash each once
    pos = 0
    any_keys = False
    try:
        for m in messages:
            if m.topic != topic:
                raise ValueError(f"message for topic {m.topic!r} in a batch for topic {topic!r}")
            if m.born_host and m.born_host != born_host:
                raise ValueError(f"message born on {m.born_host!r} in a batch from {born_host!r}")
            tags = m.tags
            if tags is None:
                tag_b, tag_len, code = b"", NO_TAG, 0
            else:
                cached = tag_cache.get(tags)
                if cached is None:
                    tb = tags.encode("utf-8")
                    if len(tb) >= NO_TAG:
                        raise ValueError(f"tag of {len(tb)} bytes is too long")
                    cached = tag_cache[tags] = (tb, tag_hash(tags))
                tag_b, code = cached
                tag_len = len(tag_b)
            at = len(parts)
            append(b"")  # the record head, packed once the key and property bytes are known
            append(tag_b)
            keys_len = props_len = 0
            if m.keys:
                any_keys = True
            for key in m.keys:
                kb = key.encode("utf-8")
                append(pack_u16(len(kb)))
                append(kb)
                keys_len += 2 + len(kb)
            for name, value in m.properties.items():
                nb, vb = name.encode("utf-8"), value.encode("utf-8")
                append(pack_prop(len(nb), len(vb)))
                append(nb)
                append(vb)
                props_len += 6 + len(nb) + len(vb)
            body = m.body
            append(body)
            parts[at] = pack_record(
                len(body), m.flag, m.born_timestamp_ms, tag_len, len(m.keys), keys_len, props_len
            )
            add_hash(code)
            add_offset(pos)
            pos += RECORD_HEAD_BYTES + len(tag_b) + keys_len + props_len + len(body)
    except (struct.error, OverflowError) as exc:
        raise ValueError(f"a message field does not fit the stored batch format: {exc}") from exc
    if not _LITTLE:
        hashes.byteswap()
        offsets.byteswap()
    return head.join(queue_id, HAS_KEYS if any_keys else 0, hashes, offsets, b"".join(parts))


_SMALL = [bytes((i,)) for i in range(128)]


def _uvarint(v: int) -> bytes:
    """v (0 <= v < 2**64) as an unsigned LEB128 varint (protobuf's and Kafka's)."""
    if v < 0x80:
        return _SMALL[v]
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _zigzag(d: int) -> int:
    """A signed 64-bit value (wrapped to it) as zigzag: small magnitudes give small varints."""
    d = ((d + (1 << 63)) & _M64) - (1 << 63)
    return ((d << 1) ^ (d >> 63)) & _M64


def _does_not_fit(what: str) -> ValueError:
    return ValueError(f"a message field does not fit the stored batch format: {what}")


def _encode_v3(head: _Head, queue_id: int, messages: Sequence[Message], born_host: str) -> bytes:
    """encode_batch's v3 records: compact heads, the tag-hash table only if a message has a tag.
    The same checks as v2's, in the same order (the C codec follows them)."""
    topic = head.topic_str
    hashes = array("Q")
    offsets = array("I")
    parts: list[bytes] = []
    append, add_hash, add_offset = parts.append, hashes.append, offsets.append
    pack_u16, pack_prop, uvarint = _U16.pack, _PROP.pack, _uvarint
    tag_cache: dict[str, tuple[bytes, int]] = {}
    pos = 0
    any_keys = any_tag = False
    base: int | None = None
    last_born: int | None = None
    born_b = b""
    try:
        for m in messages:
            if m.topic != topic:
                raise ValueError(f"message for topic {m.topic!r} in a batch for topic {topic!r}")
            if m.born_host and m.born_host != born_host:
                raise ValueError(f"message born on {m.born_host!r} in a batch from {born_host!r}")
            tags = m.tags
            if tags is None:
                tag_b, code = b"", 0
            else:
                cached = tag_cache.get(tags)
                if cached is None:
                    tb = tags.encode("utf-8")
                    if len(tb) >= NO_TAG:
                        raise ValueError(f"tag of {len(tb)} bytes is too long")
                    cached = tag_cache[tags] = (tb, tag_hash(tags))
                tag_b, code = cached
                any_tag = True
            at = len(parts)
            append(b"")  # the record head, once the key and property bytes are known
            append(tag_b)
            keys_len = props_len = 0
            if m.keys:
                any_keys = True
            for key in m.keys:
                kb = key.encode("utf-8")
                append(pack_u16(len(kb)))
                append(kb)
                keys_len += 2 + len(kb)
            for name, value in m.properties.items():
                nb, vb = name.encode("utf-8"), value.encode("utf-8")
                append(pack_prop(len(nb), len(vb)))
                append(nb)
                append(vb)
                props_len += 6 + len(nb) + len(vb)
            body = m.body
            append(body)
            n_keys, flag, born = len(m.keys), m.flag, m.born_timestamp_ms
            if len(body) > _U32_MAX:
                raise _does_not_fit("a body exceeds 4 GiB")
            if not isinstance(flag, int) or not -(1 << 31) <= flag < 1 << 31:
                raise _does_not_fit("the flag is not a 32-bit signed int")
            if not isinstance(born, int) or not _I64_MIN <= born <= _I64_MAX:
                raise _does_not_fit("the born timestamp is not a 64-bit signed int")
            if n_keys > _U16_MAX or keys_len > _U32_MAX or props_len > _U32_MAX:
                raise _does_not_fit("more than 65535 keys, or keys or properties over 4 GiB")
            if base is None:
                base = born
            if born != last_born:  # messages of a batch share born times: encode each once
                last_born, born_b = born, uvarint(_zigzag(born - base))
            attrs = 0
            tail = b""
            if flag:
                attrs |= _V3_FLAG
                tail += uvarint(_zigzag(flag))
            if tags is not None:
                attrs |= _V3_TAG
                tail += uvarint(len(tag_b))
            if n_keys:
                attrs |= _V3_KEYS
                tail += uvarint(n_keys) + uvarint(keys_len)
            if props_len:
                attrs |= _V3_PROPS
                tail += uvarint(props_len)
            rec_head = _SMALL[attrs] + born_b + uvarint(len(body)) + tail
            parts[at] = rec_head
            add_hash(code)
            add_offset(pos)
            pos += len(rec_head) + len(tag_b) + keys_len + props_len + len(body)
    except (struct.error, OverflowError) as exc:
        raise ValueError(f"a message field does not fit the stored batch format: {exc}") from exc
    if not _LITTLE:
        hashes.byteswap()
        offsets.byteswap()
    more = (HAS_KEYS if any_keys else 0) | (0 if any_tag else NO_TAG_HASHES)
    return head.join(
        queue_id, more, hashes if any_tag else b"", offsets, b"".join(parts), base or 0
    )


@dataclass(frozen=True, slots=True)
class BodyColumn(Sequence[bytes]):
    """Message bodies laid out as an Arrow binary column, encoded without a Python object per
    body (the Spark sink, issue 28): `data` holds the bodies back to back and `offsets` is the
    column's int32 offsets buffer (native order, as Arrow's), row i's body being
    data[offsets[i] : offsets[i + 1]]; the messages are the rows of `rows`, in that order. Both
    are taken as buffers (pyarrow's Buffer, bytes, ...), never copied here. A slice is the column
    of the sliced rows; an index gives that body's bytes. The codec checks the offsets where it
    reads them (encode_bodies, body_sizes): a ValueError for a row past the offsets or a body
    outside `data`."""

    offsets: Buffer
    data: Buffer
    rows: range

    def __post_init__(self) -> None:
        _column_rows(self)

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, i: int) -> bytes: ...
    @overload
    def __getitem__(self, i: slice) -> BodyColumn: ...
    def __getitem__(self, i: int | slice) -> bytes | BodyColumn:
        if isinstance(i, slice):
            return BodyColumn(self.offsets, self.data, self.rows[i])
        row = self.rows[i]
        offs, data = _column_buffers(self, range(row, row + 1))
        start, end = _column_body(offs, data, row)
        return bytes(data[start:end])


def _column_rows(col: BodyColumn) -> range:
    rows = col.rows
    if type(rows) is not range or rows.step < 1 or (rows and rows.start < 0):
        raise ValueError(f"a body column's rows must be an ascending range from 0 on, not {rows!r}")
    return rows


def _column_buffers(col: BodyColumn, rows: range) -> tuple[memoryview, memoryview]:
    """The column's offsets as ints and its data as bytes, checked against `rows`' last row."""
    raw = memoryview(col.offsets).cast("B")
    if len(raw) % 4:
        raise ValueError(f"a body column's offsets take {len(raw)} bytes, not a multiple of 4")
    offs = raw.cast("i")
    if rows and rows[-1] + 1 >= len(offs):
        raise ValueError(f"a body column's row {rows[-1]} is past its {len(offs)} offsets")
    return offs, memoryview(col.data).cast("B")


def _column_body(offs: memoryview, data: memoryview, row: int) -> tuple[int, int]:
    start, end = offs[row], offs[row + 1]
    if not 0 <= start <= end <= len(data):
        raise ValueError(
            f"a body column's row {row} spans {start}..{end}, outside its {len(data)} bytes"
        )
    return start, end


def body_sizes(column: BodyColumn) -> tuple[int, int, int]:
    """(total, smallest, biggest) body bytes of the column's rows ((0, 0, 0) for none), with
    encode_bodies' checks of the column: what a caller cuts and checks a call by."""
    rows = _column_rows(column)
    offs, data = _column_buffers(column, rows)
    total, smallest, biggest = 0, -1, 0
    for row in rows:
        start, end = _column_body(offs, data, row)
        n = end - start
        total += n
        if smallest < 0 or n < smallest:
            smallest = n
        biggest = max(biggest, n)
    return total, max(smallest, 0), biggest


def encode_bodies(
    topic: str,
    queue_id: int,
    runs: Sequence[tuple[int, Sequence[bytes]]],
    producer: ProducerSequence | None = None,
    born_host: str = "",
    version: int = OLDEST_VERSION,
) -> bytes:
    """The bytes encode_batch gives for messages without tag, keys or properties: `runs` are
    (born timestamp ms, bodies) in order, every body a message of `topic` born on `born_host`
    (the batch-first call's bare bodies, issue 24). Bodies are a sequence of bytes or a
    BodyColumn (read from its buffers). Per message a record head and the body: no Message
    object. The caller checked the bodies (not empty, within the size limit). In v3 a run's
    record heads share their first bytes (attributes 0, the born delta)."""
    n = 0
    for run in runs:
        if type(run) is not tuple or len(run) != 2:
            raise TypeError("each run must be a (born ms, bodies) tuple")
        bodies = run[1]
        n += len(_column_rows(bodies)) if isinstance(bodies, BodyColumn) else len(bodies)
    head = _Head.of(topic, n, producer, born_host, version)
    v3 = version == 3
    offsets = array("I")
    parts: list[Bytes] = []
    append, add_offset, pack_record, uvarint = parts.append, offsets.append, _RECORD.pack, _uvarint
    pos = 0
    base: int | None = None
    for born_ms, bodies in runs:
        if not isinstance(born_ms, int) or not _I64_MIN <= born_ms <= _I64_MAX:
            raise ValueError(
                "a message field does not fit the stored batch format: a born timestamp is "
                "not a 64-bit integer"
            )
        if base is None and len(bodies):  # the first message's, as encode_batch takes it
            base = born_ms
        prefix = b"\0" + uvarint(_zigzag(born_ms - (base or 0)))
        if isinstance(bodies, BodyColumn):
            offs, data = _column_buffers(bodies, bodies.rows)
            for row in bodies.rows:
                start, end = _column_body(offs, data, row)
                col_head = (
                    prefix + uvarint(end - start)
                    if v3
                    else pack_record(end - start, 0, born_ms, NO_TAG, 0, 0, 0)
                )
                append(col_head)
                append(data[start:end])
                add_offset(pos)
                pos += len(col_head) + end - start
            continue
        for body in bodies:
            if not isinstance(body, bytes):
                raise TypeError(f"a body must be bytes, not {type(body).__name__}")
            if len(body) > _U32_MAX:
                raise ValueError(
                    "a message field does not fit the stored batch format: a body exceeds 4 GiB"
                )
            rec_head = (
                prefix + uvarint(len(body))
                if v3
                else pack_record(len(body), 0, born_ms, NO_TAG, 0, 0, 0)
            )
            append(rec_head)
            append(body)
            add_offset(pos)
            pos += len(rec_head) + len(body)
    if not _LITTLE:
        offsets.byteswap()
    if v3:
        return head.join(queue_id, NO_TAG_HASHES, b"", offsets, b"".join(parts), base or 0)
    return head.join(queue_id, 0, bytes(8 * n), offsets, b"".join(parts))


@dataclass(frozen=True, slots=True)
class _Head:
    """What a batch's header says besides its messages: checked once, packed by join()."""

    topic_str: str
    topic: bytes
    producer_id: bytes
    born_host: bytes
    base_sequence: int
    flags: int
    header_len: int
    count: int
    version: int

    @classmethod
    def of(
        cls, topic: str, n: int, producer: ProducerSequence | None, born_host: str, version: int
    ) -> _Head:
        if type(version) is not int or version not in (2, 3):
            raise ValueError(f"stored batch version {version} is not one this raftmq writes")
        if n == 0:
            raise ValueError("a stored batch carries at least one message")
        if n > _U32_MAX:
            raise ValueError(f"{n} messages do not fit one batch")
        topic_b = _short(topic, "topic")
        host_b = _short(born_host, "born host")
        if producer is not None:
            pid_b = _short(producer.producer_id, "producer id")
            if not pid_b:
                raise ValueError("an idempotent producer's id is empty")
            base_seq, flags = producer.first_sequence, HAS_PRODUCER
            if producer.strict:
                flags |= STRICT_SEQUENCE
        else:
            pid_b, base_seq, flags = b"", 0, 0
        strings = len(topic_b) + len(pid_b) + len(host_b)
        fixed = FIXED_HEADER_BYTES if version == 2 else V3_HEADER_BYTES
        header_len = (fixed + strings + 7) & ~7
        if header_len > _U16_MAX:
            raise ValueError(f"topic, producer id and born host take {strings} bytes; too long")
        return cls(topic, topic_b, pid_b, host_b, base_seq, flags, header_len, n, version)

    def join(
        self,
        queue_id: int,
        more_flags: int,
        hashes: Bytes | array[int],
        offsets: Bytes | array[int],
        records: bytes,
        born_base: int = 0,
    ) -> bytes:
        """The whole batch: this header, then the tables and records, with its body CRC.
        `hashes` empty: a v3 batch without the tag-hash table (NO_TAG_HASHES in more_flags)."""
        n, header_len, base_seq = self.count, self.header_len, self.base_sequence
        tables = (8 * n if len(hashes) else 0) + 4 * n
        total = header_len + tables + len(records)
        if total > _U32_MAX:
            raise ValueError(f"batch of {total} bytes exceeds the format's 4 GiB")
        if not 0 <= queue_id <= _U32_MAX or not 0 <= base_seq <= _U64_MAX:
            raise ValueError(f"queue id {queue_id} or base sequence {base_seq} out of range")
        head = bytearray(header_len)
        _FIXED.pack_into(
            head, 0, KIND_PRODUCE, self.version, STATE_PRODUCED, 0, total, 0, 0, 0, 0,
            self.flags | more_flags, header_len, queue_id, n, 0, base_seq, len(self.topic),
            len(self.producer_id), len(self.born_host), 0,
        )  # fmt: skip
        at = FIXED_HEADER_BYTES
        if self.version == 3:
            _BORN_BASE.pack_into(head, at, born_base)
            at = V3_HEADER_BYTES
        for s in (self.topic, self.producer_id, self.born_host):
            head[at : at + len(s)] = s
            at += len(s)
        crc = crc32c(memoryview(head)[_BODY_AT:])
        crc = crc32c(hashes, crc)
        crc = crc32c(offsets, crc)
        crc = crc32c(records, crc)
        _U32.pack_into(head, _BODY_CRC_AT, crc)
        return b"".join((head, hashes, offsets, records))


def _short(s: str, what: str) -> bytes:
    b = s.encode("utf-8")
    if len(b) > _U16_MAX:
        raise ValueError(f"{what} of {len(b)} bytes exceeds {_U16_MAX}: {s[:40]!r}...")
    return b


# ---- whole-batch checks (leader, replicas, readers of the journal) -----------------------------


def check_batch(buf: Bytes, limits: BatchLimits = DEFAULT_LIMITS) -> BatchHeader:
    """The leader's check of a batch as produced: limits, every length, the body CRC and the
    offsets table, all with whole-batch operations (the table's order is checked by C-level
    map/all over its ints: no Python frame per message, but still O(n) work in C)."""
    size = len(buf)
    if size > limits.max_batch_bytes:
        raise MalformedBatchError(
            f"batch of {size} bytes exceeds max_batch_bytes {limits.max_batch_bytes}"
        )
    header = _parse(buf, stamped=False)
    if header.count > limits.max_messages:
        raise MalformedBatchError(
            f"batch of {header.count} messages exceeds max_messages {limits.max_messages}"
        )
    return header


def verify_stamped(buf: Bytes) -> BatchHeader:
    """A stamped batch read back (journal, pull, replica): both CRCs, every length."""
    return _parse(buf, stamped=True)


def read_header(buf: Bytes) -> BatchHeader:
    """The header of a batch verified once already (journal reads for the index and pulls): no
    CRC and no pass over the offsets table, O(1) but for the three strings; every header length
    still checked."""
    return _parse(buf, stamped=None, table=False)


def _parse(buf: Bytes, stamped: bool | None, table: bool = True) -> BatchHeader:
    """stamped: True/False checks the CRCs of a stamped/unstamped batch, None neither; table:
    whether to check the offsets table (O(n) in C)."""
    mv = memoryview(buf)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    size = mv.nbytes
    if size < FIXED_HEADER_BYTES:
        raise MalformedBatchError(
            f"batch of {size} bytes is shorter than its {FIXED_HEADER_BYTES}-byte header"
        )
    (kind, version, state, reserved0, total, stamp_crc, body_crc, base, store_ms, flags,
     header_len, queue_id, count, reserved1, base_seq, topic_len, pid_len, host_len,
     reserved2) = _FIXED.unpack_from(mv, 0)  # fmt: skip
    if kind != KIND_PRODUCE:
        raise MalformedBatchError(f"kind {kind} is not a produce batch ({KIND_PRODUCE})")
    if version > VERSION:
        raise UnsupportedBatchError(
            f"stored batch version {version} is newer than this raftmq reads ({VERSION}); "
            "upgrade raftmq where the batch is read"
        )
    if version < OLDEST_VERSION:
        raise MalformedBatchError(
            f"stored batch version {version} is not supported ({OLDEST_VERSION}..{VERSION})"
        )
    strings_at, known, min_record = FIXED_HEADER_BYTES, _KNOWN_FLAGS, RECORD_HEAD_BYTES
    if version == 3:
        strings_at, known, min_record = V3_HEADER_BYTES, _KNOWN_FLAGS_V3, V3_MIN_RECORD
        if size < V3_HEADER_BYTES:
            raise MalformedBatchError(
                f"batch of {size} bytes is shorter than its {V3_HEADER_BYTES}-byte header"
            )
    if total != size:
        raise MalformedBatchError(f"total length {total} but the batch has {size} bytes")
    if state == STATE_PRODUCED:
        if stamped:
            raise MalformedBatchError("state: the batch was never stamped")
        if mv[_STAMP_CRC_AT:_BODY_CRC_AT] != _ZERO_CRC or mv[_STAMP_AT:_BODY_AT] != _ZERO_SLOTS:
            raise MalformedBatchError("stamp slots of an unstamped batch are not zero")
    elif state in (STATE_STAMPED, STATE_PLACED):
        if stamped is False:
            raise MalformedBatchError("state: the batch is already stamped")
        if stamped:
            crc = crc32c(mv[_BODY_CRC_AT:_BODY_AT], crc32c(mv[:_STAMP_CRC_AT]))
            if crc != stamp_crc:
                raise MalformedBatchError(
                    f"stamp CRC mismatch: header says {stamp_crc:#010x}, bytes give {crc:#010x}"
                )
    else:
        raise MalformedBatchError(f"unknown state {state}")
    if stamped is not None:
        crc = crc32c(mv[_BODY_AT:])
        if crc != body_crc:
            raise MalformedBatchError(
                f"body CRC mismatch: header says {body_crc:#010x}, bytes give {crc:#010x}"
            )
    if reserved0 or reserved1 or reserved2:
        raise MalformedBatchError("reserved header fields are not zero")
    if flags & ~known:
        # a newer writer's flag changes what the bytes mean: refuse rather than misread
        raise UnsupportedBatchError(
            f"stored batch flags {flags:#x} include {flags & ~known:#x}, unknown to this "
            f"raftmq (it reads {known:#x}); upgrade raftmq where the batch is read"
        )
    has_producer = bool(flags & HAS_PRODUCER)
    if has_producer != (pid_len > 0) or (
        not has_producer and (base_seq or flags & STRICT_SEQUENCE)
    ):
        raise MalformedBatchError("producer flag, producer id length and base sequence disagree")
    strings_end = strings_at + topic_len + pid_len + host_len
    if header_len != (strings_end + 7) & ~7:
        raise MalformedBatchError(
            f"header length {header_len} does not match its strings ({strings_end} bytes)"
        )
    if count == 0:
        raise MalformedBatchError("message count is 0")
    records_at = header_len + (4 if flags & NO_TAG_HASHES else 12) * count
    area = size - records_at
    if area < count * min_record:
        raise MalformedBatchError(
            f"message count {count} does not fit a {size}-byte batch with header length "
            f"{header_len}"
        )
    if header_len > strings_end and any(mv[strings_end:header_len]):
        raise MalformedBatchError("header padding is not zero")
    try:
        at = strings_at
        topic = str(mv[at : at + topic_len], "utf-8")
        at += topic_len
        producer = None
        if has_producer:
            producer = ProducerSequence(
                str(mv[at : at + pid_len], "utf-8"), base_seq, bool(flags & STRICT_SEQUENCE)
            )
        at += pid_len
        born_host = str(mv[at : at + host_len], "utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedBatchError(f"invalid utf-8 in the batch header: {exc}") from exc
    if table:
        _check_offsets(_u32s(mv[records_at - 4 * count : records_at]).tolist(), area, min_record)
    born_base = _BORN_BASE.unpack_from(mv, FIXED_HEADER_BYTES)[0] if version == 3 else 0
    return BatchHeader(
        topic, queue_id, count, producer, born_host, state != STATE_PRODUCED, base, store_ms,
        size, header_len, records_at, version, born_base,
    )  # fmt: skip


def _check_offsets(offs: list[int], area: int, min_record: int) -> None:
    # Non-decreasing, from 0, the last record's head inside the area: sorted() of a sorted list
    # is n - 1 C comparisons (~5 ns a message). That each record spans at least its head and
    # exactly its own lengths is checked by readers when they make a message object.
    if offs[0] != 0:
        raise MalformedBatchError(f"message offsets: the first is {offs[0]}, not 0")
    if offs[-1] > area - min_record or sorted(offs) != offs:
        raise MalformedBatchError(
            "message offsets are not increasing or overrun the batch's message area"
        )


def _u32s(mv: memoryview) -> memoryview:
    if _LITTLE:
        return mv.cast("I")
    a = array("I", mv)
    a.byteswap()
    return memoryview(a)


def _u64s(mv: memoryview) -> memoryview:
    if _LITTLE:
        return mv.cast("Q")
    a = array("Q", mv)
    a.byteswap()
    return memoryview(a)


def stamp(buf: bytearray | memoryview, base_offset: int, store_ms: int) -> None:
    """Writes the base queue offset and the store time into a checked batch, then the stamp
    CRC: O(1), in place. The caller checked `buf` with check_batch."""
    if len(buf) < FIXED_HEADER_BYTES or buf[_STATE_AT] != STATE_PRODUCED:
        raise ValueError("stamp() takes an unstamped batch that check_batch accepted")
    if not (0 <= base_offset <= _U64_MAX and _I64_MIN <= store_ms <= _I64_MAX):
        raise ValueError(f"base offset {base_offset} or store time {store_ms} out of range")
    _STAMP.pack_into(buf, _STAMP_AT, base_offset, store_ms)
    buf[_STATE_AT] = STATE_STAMPED
    mv = memoryview(buf)
    crc = crc32c(mv[_BODY_CRC_AT:_BODY_AT], crc32c(mv[:_STAMP_CRC_AT]))
    _U32.pack_into(buf, _STAMP_CRC_AT, crc)


# ---- per-batch reads for the index and pulls (O(1) each) ---------------------------------------


_STORED_PREFIXES = (bytes((KIND_PRODUCE, OLDEST_VERSION)), bytes((KIND_PRODUCE, VERSION)))


def is_stored(chunk: Bytes) -> bool:
    """A stored batch of a version this raftmq reads (2 or 3), by its kind and version bytes:
    how the journal's readers tell it from v1's record batches."""
    return chunk[:2] in _STORED_PREFIXES


def batch_count(buf: Bytes) -> int:
    """The message count of a batch already checked or verified."""
    if len(buf) < FIXED_HEADER_BYTES:
        raise MalformedBatchError(f"batch of {len(buf)} bytes is shorter than its header")
    count: int = _U32.unpack_from(buf, _COUNT_AT)[0]
    return count


def has_keys(buf: Bytes) -> bool:
    """Whether the producer flagged a message with keys (the key index walks only such
    batches). O(1); a batch already checked or verified."""
    if len(buf) < FIXED_HEADER_BYTES:
        raise MalformedBatchError(f"batch of {len(buf)} bytes is shorter than its header")
    return bool(_U16.unpack_from(buf, _FLAGS_AT)[0] & HAS_KEYS)


def is_scheduled(buf: Bytes) -> bool:
    """Whether the batch is a delayed send's (the schedule, not the queue, takes its messages).
    O(1); a batch already checked or verified."""
    if len(buf) < FIXED_HEADER_BYTES:
        raise MalformedBatchError(f"batch of {len(buf)} bytes is shorter than its header")
    return bool(_U16.unpack_from(buf, _FLAGS_AT)[0] & SCHEDULED)


def mark_scheduled(buf: bytearray) -> None:
    """Flags an unstamped batch as a delayed send's and rewrites its body CRC: the broker's
    own write (its leader stamped the due times into the records); O(bytes), delayed sends
    only. The same bytes whichever codec encoded the batch."""
    if len(buf) < FIXED_HEADER_BYTES or buf[_STATE_AT] != STATE_PRODUCED:
        raise ValueError("mark_scheduled() takes an unstamped batch")
    flags = _U16.unpack_from(buf, _FLAGS_AT)[0] | SCHEDULED
    _U16.pack_into(buf, _FLAGS_AT, flags)
    _U32.pack_into(buf, _BODY_CRC_AT, crc32c(memoryview(buf)[_BODY_AT:]))


def place_offset(buf: bytearray | memoryview, base_offset: int) -> None:
    """Writes the leader's base queue offset into a stamped batch (state 1 -> 2) and rewrites
    the stamp CRC: O(1), in place, the same bytes whichever codec stamped it. The leader calls
    it just before the batch's entry is proposed, in log order (broker/leader_offsets.py)."""
    if len(buf) < FIXED_HEADER_BYTES or buf[_STATE_AT] != STATE_STAMPED:
        raise ValueError("place_offset() takes a stamped batch whose offset is not placed")
    if not 0 <= base_offset <= _U64_MAX:
        raise ValueError(f"base offset {base_offset} out of range")
    _U64.pack_into(buf, _STAMP_AT, base_offset)
    buf[_STATE_AT] = STATE_PLACED
    mv = memoryview(buf)
    _U32.pack_into(
        buf, _STAMP_CRC_AT, crc32c(mv[_BODY_CRC_AT:_BODY_AT], crc32c(mv[:_STAMP_CRC_AT]))
    )


def placed_offset(buf: Bytes) -> int | None:
    """The leader's base queue offset of a batch in state 2, which every replica's dispatcher
    checks against its own count; None in any other state (the dispatcher assigns). O(1)."""
    if len(buf) < FIXED_HEADER_BYTES:
        raise MalformedBatchError(f"batch of {len(buf)} bytes is shorter than its header")
    if buf[_STATE_AT] != STATE_PLACED:
        return None
    base: int = _U64.unpack_from(buf, _STAMP_AT)[0]
    return base


def tag_hashes(buf: Bytes, header: BatchHeader | None = None) -> memoryview:
    """The batch's packed tag hashes (u64 each, common.filter.tag.tag_hash): the dispatcher's
    index row keeps them as they are (`.tobytes()`), a filter reads them as ints."""
    h = read_header(buf) if header is None else header
    if not h.has_tag_hashes:
        return memoryview(bytes(8 * h.count)).cast("Q")
    mv = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf.cast("B")
    return _u64s(mv[h.tables_at : h.tables_at + 8 * h.count])


@functools.lru_cache(maxsize=256)  # batch sizes repeat (the producers' batch limits): bounded
def _tables(count: int) -> tuple[struct.Struct, struct.Struct, tuple[int, ...]]:
    """The two tables' unpackers, and the hashes of a batch without its tag-hash table."""
    return struct.Struct(f"<{count}Q"), struct.Struct(f"<{count}I"), (0,) * count


def index_columns(
    buf: Bytes, header: BatchHeader
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Each message's record position in the batch, its record size and its tag hash, as
    tuples: the columns of the batch's ConsumeQueue row. `header` is read_header(buf) of a
    batch checked or verified already. Two struct unpacks, no memoryview per column (the
    dispatcher's per-batch call: tag_hashes and message_offsets cost ~4 us more each)."""
    n, tables_at, records_at = header.count, header.tables_at, header.records_at
    tags_of, offsets_of, no_tags = _tables(n)
    offsets_at = records_at - 4 * n
    tags: tuple[int, ...] = (
        tags_of.unpack_from(buf, tables_at) if offsets_at != tables_at else no_tags
    )
    offsets: tuple[int, ...] = offsets_of.unpack_from(buf, offsets_at)
    area = header.total_bytes - records_at
    if n == 1:  # the common batch (W2's): no map
        return (records_at + offsets[0],), (area - offsets[0],), tags
    ends = (*offsets[1:], area)
    positions = tuple(map(operator.add, offsets, repeat(records_at)))
    return positions, tuple(map(operator.sub, ends, offsets)), tags


def message_offsets(buf: Bytes, header: BatchHeader | None = None) -> memoryview:
    """Each message's record offset from the start of the message area (u32 each)."""
    h = read_header(buf) if header is None else header
    mv = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf.cast("B")
    return _u32s(mv[h.records_at - 4 * h.count : h.records_at])


def slice_from(buf: Bytes, k: int, header: BatchHeader | None = None) -> memoryview:
    """The records of messages k.. (queue offsets base + k ..), without copying: what a pull
    returns after the batch's header when it starts inside a batch. Records are self-delimiting;
    iter_records decodes them."""
    h = read_header(buf) if header is None else header
    if not 0 <= k < h.count:
        raise ValueError(f"message {k} is not in a batch of {h.count}")
    at = h.records_at - 4 * (h.count - k)
    start = h.records_at + _U32.unpack_from(buf, at)[0]
    mv = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf.cast("B")
    return mv[start : h.total_bytes]


# ---- lazy client decoding ----------------------------------------------------------------------


class BatchMessage:
    """One message of a stored batch, as a consumer sees it. The record head is checked when the
    object is made; the tag, keys, properties and body are decoded on access (each access decodes
    again: keep the value if you need it twice)."""

    __slots__ = ("_batch", "_data", "_end", "_head", "_pos", "queue_offset", "tag_hash")

    _batch: BatchHeader
    _data: bytes
    _end: int
    # body length, flag, born ms, tag length (NO_TAG: none), key count, keys and properties
    # lengths: either version's record head, decoded
    _head: tuple[int, int, int, int, int, int, int]
    _pos: int  # where the record's tag (its fields after the head) starts
    queue_offset: int
    tag_hash: int  # what the index row holds; 0 when unknown (records decoded from a slice)

    @property
    def topic(self) -> str:
        return self._batch.topic

    @property
    def queue_id(self) -> int:
        return self._batch.queue_id

    @property
    def store_timestamp_ms(self) -> int:
        return self._batch.store_timestamp_ms

    @property
    def born_host(self) -> str:
        return self._batch.born_host

    @property
    def flag(self) -> int:
        return self._head[1]

    @property
    def born_timestamp_ms(self) -> int:
        return self._head[2]

    @property
    def body(self) -> bytes:
        return self._data[self._end - self._head[0] : self._end]

    @property
    def body_size(self) -> int:
        """The body's length in bytes, without copying it."""
        return self._head[0]

    @property
    def tags(self) -> str | None:
        tag_len = self._head[3]
        if tag_len == NO_TAG:
            return None
        at = self._pos
        return _utf8(self._data[at : at + tag_len], "tag")

    @property
    def keys(self) -> tuple[str, ...]:
        _, _, _, tag_len, n_keys, keys_len, _ = self._head
        if not n_keys:
            return ()
        data = self._data
        at = self._pos + (0 if tag_len == NO_TAG else tag_len)
        end = at + keys_len
        keys = []
        for _ in range(n_keys):
            if at + 2 > end:
                raise MalformedBatchError(f"key length overruns the keys of message {self}")
            (n,) = _U16.unpack_from(data, at)
            at += 2
            if at + n > end:
                raise MalformedBatchError(f"key of {n} bytes overruns the keys of message {self}")
            keys.append(_utf8(data[at : at + n], "key"))
            at += n
        if at != end:
            raise MalformedBatchError(f"{end - at} bytes after the keys of message {self}")
        return tuple(keys)

    @property
    def properties(self) -> dict[str, str]:
        _, _, _, tag_len, _, keys_len, props_len = self._head
        props: dict[str, str] = {}
        if not props_len:
            return props
        data = self._data
        at = self._pos + (0 if tag_len == NO_TAG else tag_len) + keys_len
        end = at + props_len
        while at < end:
            if at + 6 > end:
                raise MalformedBatchError(f"property lengths overrun message {self}")
            name_len, value_len = _PROP.unpack_from(data, at)
            at += 6
            stop = at + name_len + value_len
            if stop > end:
                raise MalformedBatchError(f"property overruns the properties of message {self}")
            name = _utf8(data[at : at + name_len], "property name")
            if name in props:
                raise MalformedBatchError(f"property {name!r} twice in message {self}")
            props[name] = _utf8(data[at + name_len : stop], "property value")
            at = stop
        return props

    def message(self) -> Message:
        """The message as the producer passed it (born_host from the batch)."""
        return Message(
            self.topic, self.body, self.tags, self.keys, self.properties, self.flag,
            self.born_timestamp_ms, self.born_host,
        )  # fmt: skip

    def __repr__(self) -> str:
        b = self._batch
        return f"BatchMessage({b.topic!r}, queue {b.queue_id}, offset {self.queue_offset})"


def _utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedBatchError(f"invalid utf-8 in a message {what}: {exc}") from exc


_new = object.__new__
_unpack_record = _RECORD.unpack_from

Head = tuple[int, int, int, int, int, int, int]


class _HeadOverrun(Exception):
    """A v3 record head runs past the bytes it must fit in."""


class _HeadBad(Exception):
    """A v3 record head's attributes or a varint are not what a writer makes."""


# How many varints a v3 record head holds after its attributes, by the attributes: the born
# delta and the body length, then the flag, the tag length, key count and keys length, and the
# properties length, each when its bit is set.
_V3_VARINTS = [2 + (a & 1) + (a >> 1 & 1) + 2 * (a >> 2 & 1) + (a >> 3 & 1) for a in range(16)]


def _v3_head(data: bytes, pos: int, end: int, base: int) -> tuple[Head, int]:
    """A v3 record head at data[pos:end] as v2's seven fields (the born time absolute), and
    where the record's fields start. Raises _HeadOverrun or _HeadBad. Every varint is read
    first (unsigned LEB128, at most 10 bytes, < 2**64), then the fields' ranges are checked,
    in the C codec's order."""
    if pos + 4 <= end and not data[pos] and data[pos + 1] < 0x80:
        # A plain message (no flag, tag, keys or properties) born within 63 ms of the batch's
        # first, its body under 16 KiB: what the general loop below gives, without it.
        zz, b = data[pos + 1], data[pos + 2]
        if b < 0x80 or data[pos + 3] < 0x80:
            body_len, at = (b, pos + 3) if b < 0x80 else ((b & 0x7F) | data[pos + 3] << 7, pos + 4)
            born = ((base + ((zz >> 1) ^ -(zz & 1)) + (1 << 63)) & _M64) - (1 << 63)
            return (body_len, 0, born, NO_TAG, 0, 0, 0), at
    if pos >= end:
        raise _HeadOverrun
    attrs = data[pos]
    if attrs & ~_V3_ATTRS:
        raise _HeadBad
    pos += 1
    values: list[int] = []
    add = values.append
    for _ in range(_V3_VARINTS[attrs]):
        if pos >= end:
            raise _HeadOverrun
        b = data[pos]
        pos += 1
        if b < 0x80:  # nearly every field of a small message: one byte
            add(b)
            continue
        value, shift = b & 0x7F, 7
        while True:
            if pos >= end:
                raise _HeadOverrun
            b = data[pos]
            pos += 1
            if shift == 63 and b > 1:
                raise _HeadBad
            value |= (b & 0x7F) << shift
            if b < 0x80:
                break
            shift += 7
        add(value)
    zz, body_len = values[0], values[1]
    bad = body_len > _U32_MAX
    flag, tag_len, n_keys, keys_len, props_len = 0, NO_TAG, 0, 0, 0
    if attrs:
        at = 2
        if attrs & _V3_FLAG:
            z = values[at]
            flag = (z >> 1) ^ -(z & 1)
            bad = bad or not -(1 << 31) <= flag < 1 << 31
            at += 1
        if attrs & _V3_TAG:
            tag_len = values[at]
            bad = bad or tag_len >= NO_TAG
            at += 1
        if attrs & _V3_KEYS:
            n_keys, keys_len = values[at], values[at + 1]
            bad = bad or n_keys > _U16_MAX or keys_len > _U32_MAX
            at += 2
        if attrs & _V3_PROPS:
            props_len = values[at]
            bad = bad or props_len > _U32_MAX
    if bad:
        raise _HeadBad
    born = ((base + ((zz >> 1) ^ -(zz & 1)) + (1 << 63)) & _M64) - (1 << 63)
    return (body_len, flag, born, tag_len, n_keys, keys_len, props_len), pos


def _record_head(
    header: BatchHeader, data: bytes, pos: int, end: int, offset: int
) -> tuple[Head, int]:
    """The head of the record at data[pos:end] (end: the offsets table's), checked against the
    span: its seven fields and where its fields start."""
    if header.version == 2:
        if pos + RECORD_HEAD_BYTES > end:
            raise MalformedBatchError(f"record of message at queue offset {offset} is too short")
        head = _unpack_record(data, pos)
        at = pos + RECORD_HEAD_BYTES
    else:
        try:
            head, at = _v3_head(data, pos, end, header.born_base_ms)
        except _HeadOverrun:
            raise MalformedBatchError(
                f"record of message at queue offset {offset} is too short"
            ) from None
        except _HeadBad:
            raise MalformedBatchError(
                f"record of message at queue offset {offset}: its head is malformed"
            ) from None
    tag_len = head[3]
    size = at - pos + head[0] + head[5] + head[6] + (0 if tag_len == NO_TAG else tag_len)
    if pos + size != end:
        raise MalformedBatchError(
            f"record of message at queue offset {offset}: its lengths give {size} bytes, "
            f"the offsets table {end - pos}"
        )
    return head, at


def _make(
    header: BatchHeader, data: bytes, pos: int, end: int, offset: int, code: int
) -> BatchMessage:
    if header.version != 2:
        head, at = _record_head(header, data, pos, end, offset)
        m3: BatchMessage = _new(BatchMessage)
        m3._batch = header
        m3._data = data
        m3._pos = at
        m3._end = end
        m3._head = head
        m3.queue_offset = offset
        m3.tag_hash = code
        return m3
    if pos + RECORD_HEAD_BYTES > end:
        raise MalformedBatchError(f"record of message at queue offset {offset} is too short")
    head = _unpack_record(data, pos)
    tag_len = head[3]
    size = RECORD_HEAD_BYTES + head[0] + head[5] + head[6] + (0 if tag_len == NO_TAG else tag_len)
    if pos + size != end:
        raise MalformedBatchError(
            f"record of message at queue offset {offset}: its lengths give {size} bytes, "
            f"the offsets table {end - pos}"
        )
    m: BatchMessage = _new(BatchMessage)
    m._batch = header
    m._data = data
    m._pos = pos + RECORD_HEAD_BYTES
    m._end = end
    m._head = head
    m.queue_offset = offset
    m.tag_hash = code
    return m


def iter_messages(buf: Bytes, first: int = 0, *, verify: bool = True) -> Iterator[BatchMessage]:
    """The messages first.. of a whole stored batch (stamped or not), found through its offsets
    table. `verify` checks the CRCs first (what a reader of bytes from the wire should do)."""
    data = buf if isinstance(buf, bytes) else bytes(buf)  # one copy; slices must be bytes
    if not verify:
        header = _parse(data, stamped=None)
    elif len(data) > _STATE_AT and data[_STATE_AT] == STATE_PRODUCED:
        header = _parse(data, stamped=False)
    else:
        header = verify_stamped(data)
    count = header.count
    if not 0 <= first <= count:
        raise ValueError(f"message {first} is not in a batch of {count}")
    mv = memoryview(data)
    at, records_at = header.tables_at, header.records_at
    codes = _u64s(mv[at : at + 8 * count]).tolist() if header.has_tag_hashes else [0] * count
    ends = _u32s(mv[records_at - 4 * count : records_at]).tolist()
    starts = list(map(operator.add, ends[first:], repeat(header.records_at)))
    stops = starts[1:]
    stops.append(header.total_bytes)
    offset = header.base_offset + first
    return map(
        _make, repeat(header), repeat(data), starts, stops, range(offset, offset + len(starts)),
        codes[first:],
    )  # fmt: skip


def iter_records(records: Bytes, header: BatchHeader, first: int) -> Iterator[BatchMessage]:
    """The messages in a slice of records (slice_from(buf, first)) of the batch whose header is
    `header`: walks the self-delimiting records. Tag hashes are not in a slice (tag_hash 0)."""
    data = records if isinstance(records, bytes) else bytes(records)
    size = len(data)
    pos = 0
    offset = header.base_offset + first
    remaining = header.count - first
    v3 = header.version != 2
    while pos < size:
        if remaining <= 0:
            raise MalformedBatchError(f"{size - pos} bytes after the batch's last record")
        if v3:
            try:
                (body_len, _, _, tag_len, _, keys_len, props_len), end = _v3_head(
                    data, pos, size, header.born_base_ms
                )
            except _HeadOverrun:
                raise MalformedBatchError(f"record head at byte {pos} overruns the slice") from None
            except _HeadBad:
                raise MalformedBatchError(f"record head at byte {pos} is malformed") from None
        else:
            if pos + RECORD_HEAD_BYTES > size:
                raise MalformedBatchError(f"record head at byte {pos} overruns the slice")
            body_len, _, _, tag_len, _, keys_len, props_len = _unpack_record(data, pos)
            end = pos + RECORD_HEAD_BYTES
        end += body_len + keys_len + props_len + (0 if tag_len == NO_TAG else tag_len)
        if end > size:
            raise MalformedBatchError(f"record at byte {pos} overruns the slice")
        yield _make(header, data, pos, end, offset, 0)
        pos = end
        offset += 1
        remaining -= 1
    if remaining:
        raise MalformedBatchError(f"the slice ends {remaining} records early")


# ---- columns for Arrow (the Spark source) ------------------------------------------------------


class BatchColumns(NamedTuple):
    """Chosen messages of one stored batch as Arrow column buffers, no object per message: what
    `columns` returns. Offsets are little-endian int32 from 0 (one more than their items), the
    validity bitmaps Arrow's (bit i of byte i // 8, least significant first, 1 = present),
    positions and born times int64. Strings are checked utf-8."""

    header: BatchHeader
    positions: bytes  # each chosen message's position in the batch
    body_offsets: bytes
    body_data: bytes
    key_valid: bytes  # the first key (absent when a message has none)
    key_offsets: bytes
    key_data: bytes
    tag_valid: bytes  # absent: no tag
    tag_offsets: bytes
    tag_data: bytes
    keys_offsets: bytes  # message i's keys are key strings keys_offsets[i] .. [i + 1]
    keys_item_offsets: bytes
    keys_data: bytes
    props_offsets: bytes  # message i's properties are pairs props_offsets[i] .. [i + 1]
    prop_name_offsets: bytes
    prop_name_data: bytes
    prop_value_offsets: bytes
    prop_value_data: bytes
    born_ms: bytes


_I32_MAX = (1 << 31) - 1


class _Column:
    """One string or binary column being filled: int32 offsets and the bytes."""

    __slots__ = ("data", "offsets")

    def __init__(self) -> None:
        self.offsets = array("i", [0])
        self.data = bytearray()

    def add(self, raw: Bytes) -> None:
        self.data += raw
        # An overflow here is caught after the walk, where both implementations check sizes.
        self.offsets.append(len(self.data) & _I32_MAX)

    def done(self) -> tuple[bytes, bytes]:
        if not _LITTLE:
            self.offsets.byteswap()
        return self.offsets.tobytes(), bytes(self.data)


def _bitmap(bits: list[bool]) -> bytes:
    out = bytearray((len(bits) + 7) // 8)
    for i, bit in enumerate(bits):
        if bit:
            out[i >> 3] |= 1 << (i & 7)
    return bytes(out)


def columns(buf: Bytes, positions: Sequence[int], *, verify: bool = True) -> BatchColumns:
    """The messages at `positions` (strictly ascending) of a whole stored batch as column
    buffers (BatchColumns). Checks what iter_messages and the message fields check, message by
    message in position order: the position, the record's lengths against the offsets table,
    the tag, each key and each property (structure, utf-8, no name twice); and that no column
    outgrows Arrow's 32-bit offsets. `verify` checks the CRCs first."""
    data = buf if isinstance(buf, bytes) else bytes(buf)
    if not verify:
        header = _parse(data, stamped=None)
    elif len(data) > _STATE_AT and data[_STATE_AT] == STATE_PRODUCED:
        header = _parse(data, stamped=False)
    else:
        header = verify_stamped(data)
    count, records_at, base = header.count, header.records_at, header.base_offset
    mv = memoryview(data)
    ends = _u32s(mv[records_at - 4 * count : records_at]).tolist()
    ends.append(header.total_bytes - records_at)
    chosen = array("q")
    born = array("q")
    body, key, tag = _Column(), _Column(), _Column()
    keys_items, names, values = _Column(), _Column(), _Column()
    key_bits: list[bool] = []
    tag_bits: list[bool] = []
    keys_offsets = array("i", [0])
    props_offsets = array("i", [0])
    prev = -1
    for p in positions:
        if not 0 <= p < count:
            raise MalformedBatchError(f"position {p} is not in a batch of {count} messages")
        if p <= prev:
            raise MalformedBatchError(f"positions are not ascending: {p} after {prev}")
        prev = p
        pos, end, offset = records_at + ends[p], records_at + ends[p + 1], base + p
        head, at = _record_head(header, data, pos, end, offset)
        body_len, _, born_ms, tag_len, n_keys, keys_len, props_len = head
        if tag_len == NO_TAG:
            tag_bits.append(False)
            tag.add(b"")
        else:
            raw = data[at : at + tag_len]
            _utf8(raw, "tag")
            tag_bits.append(True)
            tag.add(raw)
            at += tag_len
        at = _column_keys(data, at, at + keys_len, n_keys, offset, keys_items)
        first_key = n_keys > 0
        key_bits.append(first_key)
        if first_key:
            first = keys_items.offsets[-n_keys - 1]
            key.add(keys_items.data[first : keys_items.offsets[-n_keys]])
        else:
            key.add(b"")
        keys_offsets.append(len(keys_items.offsets) - 1)
        _column_props(data, at, at + props_len, offset, names, values)
        props_offsets.append(len(names.offsets) - 1)
        body.add(data[end - body_len : end])
        born.append(born_ms)
        chosen.append(p)
    biggest = max(len(c.data) for c in (body, key, tag, keys_items, names, values))
    if biggest > _I32_MAX:
        raise MalformedBatchError(
            f"column data of {biggest} bytes do not fit Arrow's 32-bit offsets"
        )
    if not _LITTLE:
        for a in (chosen, born, keys_offsets, props_offsets):
            a.byteswap()
    return BatchColumns(
        header, chosen.tobytes(), *body.done(), _bitmap(key_bits), *key.done(),
        _bitmap(tag_bits), *tag.done(), keys_offsets.tobytes(), *keys_items.done(),
        props_offsets.tobytes(), *names.done(), *values.done(), born.tobytes(),
    )  # fmt: skip


def _column_keys(data: bytes, at: int, end: int, n_keys: int, offset: int, out: _Column) -> int:
    """Adds a record's keys to `out`; where its properties start."""
    for _ in range(n_keys):
        if at + 2 > end:
            raise MalformedBatchError(
                f"key length overruns the keys of the message at queue offset {offset}"
            )
        (n,) = _U16.unpack_from(data, at)
        at += 2
        if at + n > end:
            raise MalformedBatchError(
                f"key of {n} bytes overruns the keys of the message at queue offset {offset}"
            )
        raw = data[at : at + n]
        _utf8(raw, "key")
        out.add(raw)
        at += n
    if at != end:
        raise MalformedBatchError(
            f"{end - at} bytes after the keys of the message at queue offset {offset}"
        )
    return at


def _column_props(
    data: bytes, at: int, end: int, offset: int, names: _Column, values: _Column
) -> None:
    seen: set[bytes] = set()
    while at < end:
        if at + 6 > end:
            raise MalformedBatchError(
                f"property lengths overrun the message at queue offset {offset}"
            )
        name_len, value_len = _PROP.unpack_from(data, at)
        at += 6
        stop = at + name_len + value_len
        if stop > end:
            raise MalformedBatchError(
                f"property overruns the properties of the message at queue offset {offset}"
            )
        name = data[at : at + name_len]
        text = _utf8(name, "property name")
        if name in seen:
            raise MalformedBatchError(
                f"property {text!r} twice in the message at queue offset {offset}"
            )
        seen.add(name)
        value = data[at + name_len : stop]
        _utf8(value, "property value")
        names.add(name)
        values.add(value)
        at = stop
