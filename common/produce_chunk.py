"""A stored produce chunk of either format, for readers that name messages by position: the
broker's MessageReader (pulls, queries) and the SDK's raw pull answers. v1 chunks are the record
batches of common/record_batch.py, v2 and v3 the stored batches of common/stored_batch.py;
journals hold both. Decodes only the messages asked for; raises only MalformedBatchError.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice

from raftmq.common import stored_batch
from raftmq.common.message import Message
from raftmq.common.record_batch import (
    Kind,
    MalformedBatchError,
    ProduceHeader,
    decode_message_at,
    decode_produce_header,
)
from raftmq.common.stored_batch import BatchHeader

__all__ = ["ChunkHeader", "messages_at", "read_header", "records_at"]

ChunkHeader = ProduceHeader | BatchHeader
_PRODUCE = bytes((Kind.PRODUCE,))
_NEWEST = bytes((stored_batch.VERSION,))


def read_header(chunk: bytes) -> ChunkHeader:
    """The chunk's header (topic, queue id, count): O(1) but for its strings. A produce chunk
    of a version past the newest read goes to the stored batch reader, which names it a newer
    format."""
    if stored_batch.is_stored(chunk) or (chunk[:1] == _PRODUCE and chunk[1:2] > _NEWEST):
        return stored_batch.read_header(chunk)
    return decode_produce_header(chunk)


def messages_at(
    chunk: bytes,
    header: ChunkHeader,
    positions: Sequence[int],
    byte_offsets: Sequence[int],
    strings: dict[bytes, str] | None = None,
    *,
    verify: bool = False,
) -> list[Message]:
    """The messages at `positions` (ascending) of the chunk, whose records start at
    `byte_offsets` (what a ConsumeQueue row keeps): v1 decodes from there, v2 through its
    offsets table from the first position asked for (the records are self-describing).
    `verify`: check a v2 batch's CRCs first (bytes from the wire)."""
    if not positions:
        return []
    if isinstance(header, ProduceHeader):
        return [decode_message_at(chunk, header, at, strings) for at in byte_offsets]
    return [r.message() for r in records_at(chunk, header, positions, verify=verify)]


def records_at(
    chunk: bytes, header: BatchHeader, positions: Sequence[int], *, verify: bool = False
) -> list[stored_batch.BatchMessage]:
    """The records at `positions` (ascending) of a stored batch, as BatchMessage objects whose
    fields decode when read (the record heads are checked here); `verify`: the CRCs first."""
    if not positions:
        return []
    lo, hi = positions[0], positions[-1]
    if not 0 <= lo <= hi < header.count:
        raise MalformedBatchError(f"positions {lo}..{hi} are not in a batch of {header.count}")
    walked = list(islice(stored_batch.iter_messages(chunk, lo, verify=verify), hi - lo + 1))
    return [walked[position - lo] for position in positions]
