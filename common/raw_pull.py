"""A raw pull answer (PullMessageResponse with `batches`) in protobuf's wire format, written
around the stored batches' bytes: the answer's fields and each batch's small fields are
serialized by protobuf, each chunk is a part of its own, never copied into a message.

Pure bytes in, bytes out; never does I/O. What it writes is exactly what any protobuf parser reads
as the same PullMessageResponse (a message's fields may come in any order; a repeated message
field's entries keep theirs), so readers need not know it was written in parts.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from raftmq.common.frame import Parts
from raftmq.common.pb import broker_pb2

_BATCHES_TAG = bytes([(7 << 3) | 2])  # PullMessageResponse.batches: field 7, length-delimited
_CHUNK_TAG = bytes([(5 << 3) | 2])  # RawBatch.chunk: field 5, length-delimited


class RawBatchPart(Protocol):
    """What one answered batch holds (broker/store.py's RawPart)."""

    @property
    def raft_index(self) -> int: ...
    @property
    def slot(self) -> int: ...
    @property
    def first_offset(self) -> int: ...
    @property
    def store_timestamp_ms(self) -> int: ...
    @property
    def chunk(self) -> bytes: ...
    @property
    def positions(self) -> list[int]: ...
    @property
    def byte_offsets(self) -> list[int]: ...


def varint(n: int) -> bytes:
    """n (>= 0) as a protobuf varint."""
    if n < 0:
        raise ValueError(f"a length is never negative: {n}")
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def answer_parts(head: broker_pb2.PullMessageResponse, batches: Iterable[RawBatchPart]) -> Parts:
    """`head` (an answer without `batches`) with `batches` appended, as the parts of one
    serialized PullMessageResponse: per batch one small part (its tag, length and fields but the
    chunk, then the chunk's tag and length) and the chunk itself."""
    if head.batches:
        raise ValueError("the head of a raw answer carries no batches (they are appended)")
    parts: list[bytes] = [head.SerializeToString()]
    for b in batches:
        fields = broker_pb2.RawBatch(
            raft_index=b.raft_index,
            slot=b.slot,
            first_offset=b.first_offset,
            store_timestamp_ms=b.store_timestamp_ms,
            positions=b.positions,
            byte_offsets=b.byte_offsets,
        ).SerializeToString()
        chunk_head = _CHUNK_TAG + varint(len(b.chunk))
        size = len(fields) + len(chunk_head) + len(b.chunk)
        parts.append(b"".join((_BATCHES_TAG, varint(size), fields, chunk_head)))
        parts.append(b.chunk)
    return Parts(parts)
