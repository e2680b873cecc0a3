"""The stored batch codec (versions 2 and 3): the bytes a producer encodes once per queue batch,
the leader checks with whole-batch operations and stamps in place, and the journal, the index and
pulls carry unchanged. This module only picks the implementation at import: the compiled
`_stored_batch_c` when it was built, else the pure-Python twin `_stored_batch_py` (the same names,
signatures, bytes, values and errors); `RAFTMQ_NO_EXTENSIONS=1` forces the twin.
`IMPLEMENTATION` says which is used.

Layout (docs/design.md, "Stored batch format v2"):

| offset      | size | field              | notes                                             |
|-------------|------|--------------------|---------------------------------------------------|
| 0           | 1    | kind               | 1 (produce), as v1's Kind.PRODUCE                 |
| 1           | 1    | version            | 2 (v1 chunks carry 1 here)                        |
| 2           | 1    | state              | 0 as produced, 1 once stamped by the leader,      |
|             |      |                    | 2 once its base offset is placed (place_offset)   |
| 3           | 1    | reserved           | 0                                                 |
| 4           | 4    | total length       | u32, bytes of the whole batch                     |
| 8           | 4    | stamp CRC          | CRC-32C of [0, 8) + [12, 32); 0 until stamped     |
| 12          | 4    | body CRC           | CRC-32C of [32, total), written by the producer   |
| 16          | 8    | base queue offset  | u64, the leader's in state 2; 0 before            |
| 24          | 8    | store timestamp ms | i64, stamped by the leader; 0 until then          |
| 32          | 2    | flags              | 0x1: producer id + base sequence present          |
|             |      |                    | 0x2 strict sequence, 0x4 has keys, 0x8 scheduled  |
| 34          | 2    | header length H    | 64 + strings, rounded up to 8: where tables start |
| 36          | 4    | queue id           | u32                                               |
| 40          | 4    | message count n    | u32, >= 1                                         |
| 44          | 4    | reserved           | 0                                                 |
| 48          | 8    | base sequence      | u64 (0 without a producer)                        |
| 56          | 2    | topic length       | u16                                               |
| 58          | 2    | producer id length | u16 (0 without a producer)                        |
| 60          | 2    | born host length   | u16                                               |
| 62          | 2    | reserved           | 0                                                 |
| 64          | ..   | topic, producer id, born host, zero padding to H                       |
| H           | 8n   | tag hashes         | u64 each: common.filter.tag.tag_hash(message tag) |
| H + 8n      | 4n   | message offsets    | u32 each, from the message area's start; [0] = 0  |
| A = H + 12n | ..   | message records    | to the total length                               |

A message record: `<IiqHHII` (28 bytes) body length, flag, born timestamp ms, tag length
(0xFFFF: no tag), key count, keys length, properties length; then the tag, the keys (u16 length
+ utf-8 each), the properties (u16 name length, u32 value length, name, value each), the body.
A record's size is exactly 28 + tag + keys + properties + body, so records are also
self-delimiting (a slice of records decodes without the offsets table).

The body CRC covers everything the producer wrote but the four stamped or stamp-related slots
(bytes 8..32); stamping writes the base offset, the store time and state 1, then the stamp CRC
over bytes 0..32 except itself, so a stamped batch read back from the journal is verified end to
end by two CRC calls. CRC-32C (Castagnoli, as Kafka's record batches) from the `crc32c` package:
hardware instructions where the CPU has them, zero-copy on any buffer, the GIL released on large
buffers.
Version 3 (docs/design.md, "Stored batch v3: compact record heads") is v2 but for three things:
- the fixed header is 72 bytes: at 64 the batch's born base (i64 ms, the first message's born
  time); the strings start at 72 (H = 72 + strings, rounded up to 8);
- flag 0x10 (NO_TAG_HASHES, v3 only): no message has a tag, and the tag-hash table is left out
  (every hash 0); the offsets table starts at H, the records at H + 4n;
- a record head is: attributes (u8: 0x1 flag, 0x2 tag, 0x4 keys, 0x8 properties; other bits
  refused), the born time as a zigzag varint delta from the born base, the body length as a
  varint, then as varints only what the attributes name: the flag (zigzag), the tag length, the
  key count and keys length, the properties length (unsigned LEB128, at most 10 bytes). The tag,
  keys, properties and body follow as in v2. A plain message's head is 3 bytes (v2: 28).
Every reader reads both versions; writers write 3 only where every member of the group reads it
(broker/batch_version.py; `encode_batch`/`encode_bodies` take the version, 2 by default).

Tag hashes are u64, not u32: they are the repository's 64-bit tag_hash, which ConsumeQueue rows
and TagFilter.matches_hash compare. The leader cannot check them against the tags without
walking messages; a wrong hash only misfilters its own producer's messages, and consumers
re-check the real tag (as RocketMQ does).
"""

from __future__ import annotations

import os
from types import ModuleType

from raftmq.common import _stored_batch_py
from raftmq.common._stored_batch_py import (
    DEFAULT_LIMITS,
    FIXED_HEADER_BYTES,
    NO_TAG,
    OLDEST_VERSION,
    RECORD_HEAD_BYTES,
    STATE_STAMPED,
    V3_HEADER_BYTES,
    VERSION,
    BatchColumns,
    BatchHeader,
    BatchLimits,
    BatchMessage,
    BodyColumn,
    MalformedBatchError,
    UnsupportedBatchError,
    has_keys,
    index_columns,
    is_scheduled,
    is_stored,
    mark_scheduled,
    place_offset,
    placed_offset,
)

__all__ = [
    "DEFAULT_LIMITS",
    "FIXED_HEADER_BYTES",
    "IMPLEMENTATION",
    "NO_TAG",
    "OLDEST_VERSION",
    "RECORD_HEAD_BYTES",
    "STATE_STAMPED",
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
    "implementations",
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

NO_EXTENSIONS_ENV = "RAFTMQ_NO_EXTENSIONS"


def _extensions_refused() -> bool:
    return os.environ.get(NO_EXTENSIONS_ENV, "") not in ("", "0")


def implementations() -> dict[str, ModuleType]:
    """Every implementation importable here by name ("python" always, "c" once built), whatever
    RAFTMQ_NO_EXTENSIONS says: what tests and benchmarks run side by side."""
    found = {"python": _stored_batch_py}
    try:
        from raftmq.common import _stored_batch_c
    except ImportError:
        pass
    else:
        found["c"] = _stored_batch_c
    return found


# aiokafka's pattern: the twin stays importable and tested; the extension is optional (a wheel
# built without a compiler has none) and refused by the environment variable.
try:
    if _extensions_refused():
        raise ImportError(f"{NO_EXTENSIONS_ENV} is set")
    from raftmq.common._stored_batch_c import (
        batch_count,
        body_sizes,
        check_batch,
        columns,
        encode_batch,
        encode_bodies,
        iter_messages,
        iter_records,
        message_offsets,
        read_header,
        slice_from,
        stamp,
        tag_hashes,
        verify_stamped,
    )

    IMPLEMENTATION = "c"
except ImportError:
    from raftmq.common._stored_batch_py import (
        batch_count,
        body_sizes,
        check_batch,
        columns,
        encode_batch,
        encode_bodies,
        iter_messages,
        iter_records,
        message_offsets,
        read_header,
        slice_from,
        stamp,
        tag_hashes,
        verify_stamped,
    )

    IMPLEMENTATION = "python"
