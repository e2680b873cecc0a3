"""The ConsumeQueue's stored rows: one lmdb row per stored batch (issue 14), not per message.

Key: queue prefix + u64 queue offset of the row's first message (big-endian: lmdb's order is
the queue's order). Value: raft index, slot, position of the first message in its chunk, store
time, count n (low 24 bits) and column flags (high 8 bits), then the batch's columns: chunk
offsets (u32), body sizes (u32), tag hashes (u64). A column whose values step evenly (equal-sized
records, equal bodies, one tag or none: what a producer's batch usually is) is stored as its
first value and step instead of n values, so a batch of 100-byte messages costs ~0.05 byte of
index per message instead of 16 (the 10^8 backlog's disk bar, issue 14 bar 3); rows written
before this have flags 0 and read as they did. A produce batch's row has first position 0; a
delivered delayed message's row holds one message at its own position. Rows of one queue never
overlap: every offset is in one row. Values only, no I/O: MessageStore writes and reads them,
retention trims them.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence

# raft index, slot, first position, store timestamp ms, count | flags << 24
HEAD = struct.Struct(">QIIQI")
_COUNT_AT = 24  # where the count sits in HEAD
_U32 = struct.Struct(">I")
_COUNT_MASK = 0xFF_FFFF
_FLAG_SHIFT = 24
MAX_COUNT = _COUNT_MASK  # the broker's max_batch_messages is far below
# Flags: which columns are stored as (first, step).
_EVEN_OFFSETS = 0x01
_EVEN_SIZES = 0x02
_EVEN_TAGS = 0x04  # step 0 only: tag hashes are u64, a step between two may not fit in i64
_EVEN32 = struct.Struct(">Ii")  # first (u32), step (i32)
_EVEN_TAG = struct.Struct(">Q")  # the one tag hash
_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1
# A one-message row (W2's every batch): HEAD, then offsets, sizes and tag as even columns.
_ONE = struct.Struct(">QIIQI" + "Ii" + "Ii" + "Q")
_ONE_COUNT = 1 | (_EVEN_OFFSETS | _EVEN_SIZES | _EVEN_TAGS) << _FLAG_SHIFT


def _even_step(values: Sequence[int]) -> int | None:
    """The step if values[i] == values[0] + i * step for every i (and fits in i32), else None.
    Whole-column comparisons at C speed: one per batch, never a Python loop per message."""
    n = len(values)
    first = values[0]
    if n == 1:
        return 0
    step = values[1] - first
    if not _I32_MIN <= step <= _I32_MAX:
        return None
    col = tuple(values)
    if step == 0:
        return 0 if col == (first,) * n else None
    return step if col == tuple(range(first, first + step * n, step)) else None


@functools.lru_cache(maxsize=512)  # counts repeat (the producers' batch sizes): bounded
def _u32s(n: int) -> struct.Struct:
    return struct.Struct(f">{n}I")


@functools.lru_cache(maxsize=512)
def _u64s(n: int) -> struct.Struct:
    return struct.Struct(f">{n}Q")


def pack(
    raft_index: int,
    slot: int,
    first_position: int,
    store_timestamp_ms: int,
    chunk_offsets: Sequence[int],
    body_sizes: Sequence[int],
    tag_hashes: Sequence[int],
) -> bytes:
    n = len(body_sizes)
    if not 0 < n <= MAX_COUNT or len(chunk_offsets) != n or len(tag_hashes) != n:
        raise ValueError(f"a row holds 1..{MAX_COUNT} messages with one value of each column")
    if n == 1:  # every column even with step 0: the bytes _pack_columns gives, in one pack
        return _ONE.pack(raft_index, slot, first_position, store_timestamp_ms, _ONE_COUNT,
                         chunk_offsets[0], 0, body_sizes[0], 0, tag_hashes[0])  # fmt: skip
    return _pack_columns(
        raft_index, slot, first_position, store_timestamp_ms, chunk_offsets, body_sizes,
        tag_hashes,
    )  # fmt: skip


def _pack_columns(
    raft_index: int,
    slot: int,
    first_position: int,
    store_timestamp_ms: int,
    chunk_offsets: Sequence[int],
    body_sizes: Sequence[int],
    tag_hashes: Sequence[int],
) -> bytes:
    """pack() for any n: each column even (first, step) or in full."""
    n = len(body_sizes)
    flags = 0
    parts: list[bytes] = []
    for col, flag in ((chunk_offsets, _EVEN_OFFSETS), (body_sizes, _EVEN_SIZES)):
        step = _even_step(col)
        if step is None:
            parts.append(_u32s(n).pack(*col))
        else:
            flags |= flag
            parts.append(_EVEN32.pack(col[0], step))
    if _even_step(tag_hashes) == 0:
        flags |= _EVEN_TAGS
        parts.append(_EVEN_TAG.pack(tag_hashes[0]))
    else:
        parts.append(_u64s(n).pack(*tag_hashes))
    head = HEAD.pack(raft_index, slot, first_position, store_timestamp_ms,
                     n | flags << _FLAG_SHIFT)  # fmt: skip
    return head + b"".join(parts)


def count(value: bytes) -> int:
    """How many messages the row holds (what retention needs to know of it)."""
    return int(_U32.unpack_from(value, _COUNT_AT)[0]) & _COUNT_MASK


def head(value: bytes) -> tuple[int, int, int, int, int]:
    """(raft index, slot, first position, store ts, count n) without the columns."""
    index, slot, first_position, ts, n = HEAD.unpack_from(value)
    return index, slot, first_position, ts, n & _COUNT_MASK


def _column32(value: bytes, at: int, even: bool, n: int, start: int, stop: int
              ) -> tuple[tuple[int, ...], int]:  # fmt: skip
    """Values start..stop-1 of a u32 column stored at `at`, and where the next column starts."""
    if even:
        first, step = _EVEN32.unpack_from(value, at)
        if step == 0:
            return (first,) * (stop - start), at + _EVEN32.size
        return tuple(range(first + step * start, first + step * stop, step)), at + _EVEN32.size
    return _u32s(stop - start).unpack_from(value, at + 4 * start), at + 4 * n


def columns(
    value: bytes, n: int, start: int, stop: int
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Messages start..stop-1 of a row of n: their chunk offsets, body sizes and tag hashes,
    unpacking only those (a pull of 32 from a row of 512 reads 32)."""
    flags = _U32.unpack_from(value, _COUNT_AT)[0] >> _FLAG_SHIFT
    ats, at = _column32(value, HEAD.size, bool(flags & _EVEN_OFFSETS), n, start, stop)
    sizes, at = _column32(value, at, bool(flags & _EVEN_SIZES), n, start, stop)
    if flags & _EVEN_TAGS:
        tags = (_EVEN_TAG.unpack_from(value, at)[0],) * (stop - start)
    else:
        tags = _u64s(stop - start).unpack_from(value, at + 8 * start)
    return ats, sizes, tags


def unpack(value: bytes) -> tuple[int, int, int, int, int, tuple[int, ...]]:
    """(raft index, slot, first position, store ts, count n, columns): columns[i] is message
    i's chunk offset, columns[n + i] its body size, columns[2n + i] its tag hash."""
    index, slot, first_position, ts, n = head(value)
    ats, sizes, tags = columns(value, n, 0, n)
    return index, slot, first_position, ts, n, ats + sizes + tags
