"""The ConsumeQueue's stored rows: one lmdb row per stored batch (issue 14), not per message.

Key: queue prefix + u64 queue offset of the row's first message (big-endian: lmdb's order is
the queue's order). Value: raft index, slot, position of the first message in its chunk, store
time, count n, then the batch's columns: n chunk offsets (u32), n body sizes (u32), n tag hashes
(u64). A produce batch's row has first position 0; a delivered delayed message's row holds one
message at its own position. Rows of one queue never overlap: every offset is in one row.
Values only, no I/O: MessageStore writes and reads them, retention trims them.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence

# raft index, slot, first position, store timestamp ms, count
HEAD = struct.Struct(">QIIQI")
_COUNT_AT = 24  # where the count sits in HEAD
_U32 = struct.Struct(">I")


@functools.lru_cache(maxsize=512)  # counts repeat (the producers' batch sizes): bounded
def _columns(n: int) -> struct.Struct:
    return struct.Struct(f">{n}I{n}I{n}Q")


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
    return HEAD.pack(raft_index, slot, first_position, store_timestamp_ms, n) + _columns(n).pack(
        *chunk_offsets, *body_sizes, *tag_hashes
    )


def count(value: bytes) -> int:
    """How many messages the row holds (what retention needs to know of it)."""
    return int(_U32.unpack_from(value, _COUNT_AT)[0])


def head(value: bytes) -> tuple[int, int, int, int, int]:
    """(raft index, slot, first position, store ts, count n) without the columns."""
    index, slot, first_position, ts, n = HEAD.unpack_from(value)
    return index, slot, first_position, ts, n


@functools.lru_cache(maxsize=512)
def _slice(k: int) -> tuple[struct.Struct, struct.Struct]:
    return struct.Struct(f">{k}I"), struct.Struct(f">{k}Q")


def columns(
    value: bytes, n: int, start: int, stop: int
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Messages start..stop-1 of a row of n: their chunk offsets, body sizes and tag hashes,
    unpacking only those (a pull of 32 from a row of 512 reads 32)."""
    k = stop - start
    u32s, u64s = _slice(k)
    base = HEAD.size
    return (
        u32s.unpack_from(value, base + 4 * start),
        u32s.unpack_from(value, base + 4 * (n + start)),
        u64s.unpack_from(value, base + 8 * n + 8 * start),
    )


def unpack(value: bytes) -> tuple[int, int, int, int, int, tuple[int, ...]]:
    """(raft index, slot, first position, store ts, count n, columns): columns[i] is message
    i's chunk offset, columns[n + i] its body size, columns[2n + i] its tag hash."""
    index, slot, first_position, ts, n = HEAD.unpack_from(value)
    return index, slot, first_position, ts, n, _columns(n).unpack_from(value, HEAD.size)
